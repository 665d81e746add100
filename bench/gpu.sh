#!/usr/bin/env bash
# gpu.sh : everything a lent GPU machine runs, in one call.
#   1. build (Release, all cores) with the CUDA backend
#   2. the GPU tests (ctest -L gpu), then compute-sanitizer memcheck and racecheck
#      on a reduced set
#   3. `flashc bench --check` on a few option mixes (both kernel families), and
#      compute-sanitizer memcheck of one
#   4. bench/compare.py against PyTorch SDPA (flash and cuDNN) in the same run
#   5. bench/compare.py --mode decode: decode bandwidth, contiguous and paged
#      caches, against SDPA and a device copy
#   6. bench/compare.py --mode bwd (and fwdbwd): the backward against SDPA's
#   7. (step "kernel", not in the default set) bench/kernel_ab.py: forward kernel
#      times under ncu's locked clocks, this build (and the builds in AB_LIBS,
#      comma-separated) against cuDNN; KERNEL_SHAPES overrides the shapes
# Full logs go to $OUT (or bench/results when OUT is unset); the short table is
# printed last. Steps can be chosen: bench/gpu.sh build test sanitize cli bench
# decode bwd kernel (default: all but kernel). FAMILIES picks the kernel families tested (default
# "auto auto-short0 auto-short1 auto-ws0 sm90 sm80"); the test step runs them all at once,
# SHARDS processes each (default 4, FLASHC_TEST_SHARD), every case's "ok NAME (s)" in the
# logs (FLASHC_TEST_VERBOSE), so that a run cut off by TEST_TIMEOUT shows where it was
# (on an H100, 4 families x 4 shards took about 400 s: within one 10-minute device call
# give FAMILIES 4 families at most),
# SANITIZE_FILTER and SANITIZE_TOOLS the sanitizer's cases (default "d64") and
# tools. BWD_ARGS passes flags to the backward runs, BWD_MODES picks them
# (default "bwd fwdbwd"). BENCH_ARGS passes flags to compare.py (DECODE_ARGS
# to the decode run); FLASHC_CUDA_HEADDIMS
# (e.g. "64;128;256") trims the kernels built, for quicker tuning builds.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench/results}
mkdir -p "$out"
steps=${*:-build test sanitize cli bench decode bwd}
has() { [[ " $steps " == *" $1 "* ]]; }
status=0

if has build; then
  echo "== build =="
  t0=$(date +%s)
  { cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DFLASHC_CUDA=ON -G Ninja \
      -DFLASHC_CUDA_HEADDIMS="${FLASHC_CUDA_HEADDIMS:-all}" &&
    cmake --build build -j"$(nproc)"; } > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
  echo "built in $(( $(date +%s) - t0 )) s"
  ./build/flashc info | tee "$out/info.txt"
fi

# Kernel families: "auto" is what src/cuda/plan.cu:fc_cuda_family and src/cuda/fwd.cu pick (on
# an H100/H200 for D > 32: the sm90ws forward and backward), "sm90" keeps the cp.async
# sm90 forward, "sm80" forces the FA2 kernels (FLASHC_CUDA_FAMILY); "auto-short0" and
# "auto-short1" are auto with FLASHC_CUDA_SHORT_ROW=0 / =1 (D64's sm90ws rows, src/cuda/traits.h:
# its three-consumer row on every call / its short-work row on every call); "auto-ws0" is
# auto with FLASHC_CUDA_BWD_WS=0 (the sm90 backward without warp specialisation).
families=${FAMILIES:-auto auto-short0 auto-short1 auto-ws0 sm90 sm80}
# fam_env FAMILY CMD...: CMD with that family's environment
fam_env() {
  local f=$1 s= w=
  shift
  case $f in *-short0) s=0 ;; *-short1) s=1 ;; *-ws0) w=0 ;; esac
  f=${f%-short?}
  FLASHC_CUDA_FAMILY=${f%-ws0} FLASHC_CUDA_SHORT_ROW=$s FLASHC_CUDA_BWD_WS=$w "$@"
}

if has test; then
  echo "== GPU tests =="
  shards=${SHARDS:-4}
  pids=()
  for fam in $families; do
    for ((k = 0; k < shards; k++)); do
      FLASHC_TEST_SHARD=$k/$shards FLASHC_TEST_VERBOSE=1 fam_env "$fam" \
        timeout "${TEST_TIMEOUT:-450}" ./build/flashc_gpu_tests ${TEST_FILTER:-} \
        > "$out/gpu_tests_${fam}_$k.log" 2>&1 &
      pids+=($!)
    done
  done
  for p in "${pids[@]}"; do wait "$p" || status=1; done
  for fam in $families; do
    for ((k = 0; k < shards; k++)); do
      log=$out/gpu_tests_${fam}_$k.log
      grep -E "^not ok|FAIL" "$log" | head -10
      last=$(tail -1 "$log")
      [[ $last == *passed,* || $last == skipped* ]] || last="cut off after $(grep -c '^ok ' "$log") cases, in the one after: $(grep '^ok ' "$log" | tail -1)"
      echo "family $fam shard $k/$shards: $last"
    done
  done
fi

if has sanitize; then
  echo "== compute-sanitizer (reduced set) =="
  for fam in $families; do
    for tool in ${SANITIZE_TOOLS:-memcheck racecheck synccheck}; do
      fam_env "$fam" compute-sanitizer --tool "$tool" --error-exitcode 3 \
        ./build/flashc_gpu_tests "${SANITIZE_FILTER:-d64}" > "$out/sanitize_${tool}_$fam.log" 2>&1
      echo "$fam $tool: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitize_${tool}_$fam.log" | tail -1)"
      tail -1 "$out/sanitize_${tool}_$fam.log"
    done
  done
fi

if has cli; then
  echo "== flashc bench --check =="
  mixes=("--seqlen 1024 --heads 16 --headdim 128"
         "--seqlen 2048 --heads 8 --headdim 64 --dtype fp16 --causal"
         "--seqlen 1000 --seqlen-k 1500 --heads 8 --kv-heads 2 --headdim 256 --window 256,0"
         "--seqlen 777 --heads 4 --headdim 192 --softcap 30 --dropout 0.1"
         "--seqlen 513 --heads 4 --headdim 96 --dtype fp16 --causal")
  for fam in $families; do
    for m in "${mixes[@]}"; do
      fam_env "$fam" ./build/flashc bench --backend cuda --check --iters 3 $m \
        > "$out/cli.log" 2>&1 || status=1
      echo "$fam $m: $(grep -E '^  check' "$out/cli.log" | awk '{print $2, $4, $NF}' | tr '\n' ' ')"
    done
  done
  compute-sanitizer --tool memcheck --error-exitcode 3 ./build/flashc bench --backend cuda --check \
    --iters 1 --seqlen 300 --heads 4 --kv-heads 2 --headdim 128 --causal > "$out/cli_memcheck.log" 2>&1
  echo "memcheck of the CLI: rc=$? $(grep 'ERROR SUMMARY' "$out/cli_memcheck.log")"
fi

if has bench; then
  echo "== benchmark =="
  PYTHONUNBUFFERED=1 python3 bench/compare.py --csv "$out/compare_fwd.csv" ${BENCH_ARGS:-} \
    > "$out/compare_fwd.log" 2>&1 || status=1
  sed -n '/^== flashc vs SDPA/,$p' "$out/compare_fwd.log"
  grep -v "^bf16\|^fp16\|^==" "$out/compare_fwd.log" | tail -5
fi

if has decode; then
  echo "== decode benchmark =="
  PYTHONUNBUFFERED=1 python3 bench/compare.py --mode decode --csv "$out/compare_decode.csv" \
    ${DECODE_ARGS:-} > "$out/compare_decode.log" 2>&1 || status=1
  sed -n '/^== flashc vs SDPA, decode/,$p' "$out/compare_decode.log"
  grep -v "^bf16\|^fp16\|^==\|^device copy" "$out/compare_decode.log" | tail -5
fi
if has bwd; then
  echo "== backward benchmark =="
  for mode in ${BWD_MODES:-bwd fwdbwd}; do
    PYTHONUNBUFFERED=1 python3 bench/compare.py --mode $mode --csv "$out/compare_$mode.csv" \
      ${BWD_ARGS:-} > "$out/compare_$mode.log" 2>&1 || status=1
    sed -n "/^== flashc vs SDPA/,\$p" "$out/compare_$mode.log"
    grep -v "^bf16\|^fp16\|^==" "$out/compare_$mode.log" | tail -5
  done
fi
if has kernel; then
  echo "== forward kernel times under ncu (locked clocks) =="
  shapes=${KERNEL_SHAPES:-"64,1024,1,32/32,16 64,8192,0,32/32,2 128,1024,0,16/16,16 128,1024,1,16/16,16 128,8192,1,16/16,2 128,8192,0,64/8,2 256,8192,1,8/8,2"}
  args=()
  for s in $shapes; do args+=(--shapes "$s"); done
  libs=build/libflashc.so${AB_LIBS:+,$AB_LIBS}
  PYTHONUNBUFFERED=1 python3 bench/kernel_ab.py --libs "$libs" --cudnn "${args[@]}" \
    > "$out/kernel_ab.log" 2>&1 || status=1
  cat "$out/kernel_ab.log"
fi
exit $status
