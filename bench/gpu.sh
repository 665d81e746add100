#!/usr/bin/env bash
# gpu.sh : everything a lent GPU machine runs, in one call.
#   1. build (Release, all cores) with the CUDA backend
#   2. the GPU tests (ctest -L gpu), then compute-sanitizer memcheck and racecheck
#      on a reduced set
#   3. bench/compare.py against PyTorch SDPA (flash and cuDNN) in the same run
# Full logs go to $OUT (or bench/results when OUT is unset); the short table is
# printed last. Steps can be chosen: bench/gpu.sh build test sanitize bench
# (default: all). BENCH_ARGS passes flags to compare.py; FLASHC_CUDA_HEADDIMS
# (e.g. "64;128;256") trims the kernels built, for quicker tuning builds.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench/results}
mkdir -p "$out"
steps=${*:-build test sanitize bench}
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

# Kernel families: "auto" is what launch.cu picks (sm90 on an H100/H200 for
# D > 32), "sm80" forces the FA2 kernels (FLASHC_CUDA_FAMILY).
families=${FAMILIES:-auto sm80}

if has test; then
  echo "== GPU tests =="
  for fam in $families; do
    FLASHC_CUDA_FAMILY=$fam ./build/flashc_gpu_tests ${TEST_FILTER:-} > "$out/gpu_tests_$fam.log" 2>&1 || status=1
    grep -E "^not ok|FAIL" "$out/gpu_tests_$fam.log" | head -20
    echo "family $fam: $(tail -1 "$out/gpu_tests_$fam.log")"
  done
fi

if has sanitize; then
  echo "== compute-sanitizer (reduced set) =="
  for fam in $families; do
    for tool in memcheck racecheck; do
      FLASHC_CUDA_FAMILY=$fam compute-sanitizer --tool "$tool" --error-exitcode 3 \
        ./build/flashc_gpu_tests "${SANITIZE_FILTER:-d64}" > "$out/sanitize_${tool}_$fam.log" 2>&1
      echo "$fam $tool: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitize_${tool}_$fam.log" | tail -1)"
      tail -1 "$out/sanitize_${tool}_$fam.log"
    done
  done
fi

if has bench; then
  echo "== benchmark =="
  PYTHONUNBUFFERED=1 python3 bench/compare.py --csv "$out/compare_fwd.csv" ${BENCH_ARGS:-} \
    > "$out/compare_fwd.log" 2>&1 || status=1
  sed -n '/^== flashc vs SDPA/,$p' "$out/compare_fwd.log"
  grep -v "^bf16\|^fp16\|^==" "$out/compare_fwd.log" | tail -5
fi
exit $status
