#!/usr/bin/env bash
# gpu.sh : everything a lent GPU machine runs, in one call.
#   1. build (Release, all cores) with the CUDA backend
#   2. the GPU tests (ctest -L gpu), then compute-sanitizer memcheck and racecheck
#      on a reduced set
#   3. bench/compare.py against PyTorch SDPA (flash and cuDNN) in the same run
#   4. bench/compare.py --mode decode: decode bandwidth, contiguous and paged
#      caches, against SDPA and a device copy
# Full logs go to $OUT (or bench/results when OUT is unset); the short table is
# printed last. Steps can be chosen: bench/gpu.sh build test sanitize bench decode
# (default: all). BENCH_ARGS passes flags to compare.py (DECODE_ARGS to the
# decode run); FLASHC_CUDA_HEADDIMS
# (e.g. "64;128;256") trims the kernels built, for quicker tuning builds.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench/results}
mkdir -p "$out"
steps=${*:-build test sanitize bench decode}
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

if has test; then
  echo "== GPU tests =="
  ./build/flashc_gpu_tests > "$out/gpu_tests.log" 2>&1 || status=1
  grep -E "^not ok|FAIL" "$out/gpu_tests.log" | head -20
  tail -1 "$out/gpu_tests.log"
fi

if has sanitize; then
  echo "== compute-sanitizer (reduced set) =="
  for tool in memcheck racecheck; do
    compute-sanitizer --tool "$tool" --error-exitcode 3 ./build/flashc_gpu_tests "${SANITIZE_FILTER:-d64}" \
      > "$out/sanitize_$tool.log" 2>&1
    echo "$tool: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitize_$tool.log" | tail -1)"
    tail -1 "$out/sanitize_$tool.log"
  done
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
exit $status
