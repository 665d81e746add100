#!/usr/bin/env bash
# tune.sh : time variants of a tile table (src/cuda/traits.h) in one call of
# the GPU machine, after `bench/gpu.sh build` has built the tree.
#
#   bench/tune.sh 'name|dims|rows[|table]' ...
#
# Each variant is a name, the head dims to build (e.g. "64" or "64;128") and
# table rows in the X(D, warpgroups, Bc, stages, ctas) form of
# FC_SM90_FWD_TILES, e.g. 'd64wg3|64|X(64, 3, 128, 2, 1)'. It is built into
# build-tune/<name> (the library only, those head dims only) with the rows
# pre-included as the table (FC_SM90_FWD_TILES, or the table named by the
# fourth field, e.g. FC_SM80_BWD_TILES with X(D, Br, Bc, warps, q_stages)
# rows), then timed alone by compare.py (--backends flashc; add --mode bwd to
# BENCH_ARGS for the backward); BENCH_ARGS sets the shapes (default: bf16, S 1k and 8k, causal and
# not, the variant's head dims). Every Bc used must be among the widths
# tools/gen_wgmma.py generates (TUNING_BC). Logs and CSVs go to $OUT (or
# bench/results); a table of all variants is printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench/results}
mkdir -p "$out" build-tune
summary=()
for spec in "$@"; do
  IFS='|' read -r name dims rows table <<< "$spec"
  dir="build-tune/$name"
  mkdir -p "$dir"
  printf '#define %s(X) %s\n' "${table:-FC_SM90_FWD_TILES}" "$rows" > "$dir/tiles.h"
  if ! { cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHC_CUDA=ON \
           -DFLASHC_BUILD_TESTS=OFF -DFLASHC_BUILD_TOOLS=OFF -DFLASHC_CUDA_HEADDIMS="$dims" \
           -DCMAKE_CUDA_FLAGS="--pre-include=$PWD/$dir/tiles.h" &&
         cmake --build "$dir" --target flashc; } > "$out/tune_$name.build.log" 2>&1; then
    echo "$name: build failed"; tail -5 "$out/tune_$name.build.log"; continue
  fi
  hd=${dims//;/,}
  PYTHONUNBUFFERED=1 python3 bench/compare.py --lib "$dir/libflashc.so" --backends flashc \
    ${BENCH_ARGS:---dtypes bf16 --headdims $hd --seqlens 1024,8192} \
    --csv "$out/tune_$name.csv" > "$out/tune_$name.log" 2>&1 || echo "$name: bench failed"
  while read -r line; do
    summary+=("$(printf '%-12s %s' "$name" "$line")")
  done < <(sed -n '/^== flashc vs SDPA/,$p' "$out/tune_$name.log" | grep -v '^==' |
           sed -E "s/ +flashc-(sm80|det).*//")
done
echo "== variants (flashc TFLOP/s) =="
printf '%s\n' "${summary[@]}"
