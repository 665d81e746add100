# deps.sh : sourced by run.sh and test.sh. Installs cmake, a C compiler, python3 (with
# its headers) and pkg-config when missing (as root, from the distribution), and puts
# nvcc on PATH when the CUDA toolkit sits in /usr/local/cuda, so that CMake builds the
# CUDA backend.
need=()
command -v cmake >/dev/null || need+=(cmake)
command -v cc >/dev/null || need+=(build-essential)
command -v python3 >/dev/null || need+=(python3)  # tools/check_docs.py
# Python's headers, for the Python package's _fastcall module (CMakeLists.txt)
python3 -c 'import os, sys, sysconfig
sys.exit(not os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
  2>/dev/null || need+=(python3-dev)
command -v pkg-config >/dev/null || need+=(pkg-config)  # tests/install/run.sh
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq "${need[@]}"
  else
    echo "please install: ${need[*]}" >&2
    exit 1
  fi
fi
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
jobs=$(nproc 2>/dev/null || echo 2)
