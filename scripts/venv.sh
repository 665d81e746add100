#!/usr/bin/env bash
# venv.sh : create the Python environment of the Python tests and the example, once,
# in .venv (ignored by git): numpy, pytest and torch from PyPI. PyPI's torch for
# Linux x86_64 is the CUDA build (about 5 GB with its nvidia-* wheels, about two
# minutes here); it runs CPU tensors on a machine without a GPU, and it is the only
# torch the registries this project reaches offer. A second run finds the stamp
# file and returns at once. Prints the path of the venv's python on stdout.
# It does not install flashc itself: the tests load build/libflashc.so through
# FLASHC_LIBRARY and PYTHONPATH=python.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv
want="numpy pytest torch"
if [ "$(cat "$venv/.flashc-deps" 2>/dev/null)" != "$want" ]; then
  rm -rf "$venv"
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install -q $want >&2
  echo "$want" >"$venv/.flashc-deps"
fi
echo "$PWD/$venv/bin/python"
