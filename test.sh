#!/usr/bin/env bash
# test.sh : build flashc and run its tests (the command README.md names and CI runs).
# Installs what it needs on a fresh Debian/Ubuntu machine, builds the library with
# the CUDA backend compiled when nvcc is present (compile only: the GPU tests need a
# GPU), installs that build into a temporary prefix and builds and runs a small
# program against it (tests/install/run.sh: CMake's find_package and pkg-config,
# shared and static), rebuilds with ASan + UBSan and runs the CPU test suite
# there, runs the Python package's tests (pytest, in a venv with PyPI's torch that
# scripts/venv.sh makes once in .venv) against the Release library and the package's
# _fastcall module built beside it (FLASHC_FASTCALL=1: required), and ends with the C
# suite in Release.
# First it checks that the files and functions docs/ names exist (tools/check_docs.py)
# and that the generated CUDA sources are what the generators make from the tuning
# tables now (tools/gen_instances.py --check, tools/gen_wgmma.py --check).
set -euo pipefail
cd "$(dirname "$0")"

source scripts/deps.sh

echo "== docs: every file and function docs/ names exists =="
python3 tools/check_docs.py

echo "== generated files: src/cuda/*/inst and wgmma_ops.cuh are current =="
python3 tools/gen_instances.py --check
python3 tools/gen_wgmma.py --check

echo "== build (Release) =="
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE="$(command -v python3)"
cmake --build build -j"$jobs"

echo "== install: cmake --install build, a program built against it (find_package, pkg-config) =="
bash tests/install/run.sh build

echo "== build (ASan + UBSan, CPU only) =="
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLASHC_SANITIZE=ON -DFLASHC_CUDA=OFF
cmake --build build-asan -j"$jobs" --target flashc_tests

echo "== tests under ASan + UBSan =="
ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
  ./build-asan/flashc_tests

echo "== Python tests (pytest on tests/python, CPU tensors; the venv takes ~2 min the first time) =="
py=$(bash scripts/venv.sh)
FLASHC_FASTCALL=1 FLASHC_LIBRARY=build/libflashc.so PYTHONPATH=python "$py" -m pytest tests/python -q \
  -p no:cacheprovider

echo "== tests (Release) =="
./build/flashc_tests
