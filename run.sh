#!/usr/bin/env bash
# run.sh : build flashc and run the main job: `flashc info`, then one attention
# forward and backward checked against the float64 reference and timed. Uses the
# CUDA backend when a usable GPU is there, the CPU backend otherwise.
set -euo pipefail
cd "$(dirname "$0")"

source scripts/deps.sh

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$jobs"

./build/flashc info
shape=(--batch 1 --seqlen 2048 --heads 8 --headdim 128 --dtype bf16 --causal --check)
./build/flashc bench "${shape[@]}" --mode fwd "$@"
./build/flashc bench "${shape[@]}" --mode bwd "$@"
