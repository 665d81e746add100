#!/usr/bin/env bash
# bench/ggml_decode.sh : CPU decode, flashc against llama.cpp's attention op
# (ggml_flash_attn_ext), both on one fp16 KV cache (bench/ggml_decode.c).
#
#   bench/ggml_decode.sh [out.csv]      default bench/results/ggml-decode-<date>.csv
#
# ggml comes from PyPI: the llama-cpp-python sdist (pinned version and sha256
# below) holds llama.cpp's source; its ggml and ggml-cpu libraries are built
# once (-march=native, Release) under build/ggml (~5 min on 2 cores) and
# reused. flashc is built Release, CPU only, under build/ggml/flashc.
#
# Environment:
#   GGML_BENCH_SHAPES   B:H:Hk:D:N list   [1:32:32:128:1024 1:32:32:128:4096 1:32:8:128:4096
#                                          1:32:8:128:16384 4:32:8:128:4096]
#   GGML_BENCH_THREADS  thread counts      [1 and all cores]
#   GGML_BENCH_ITERS    calls per figure   [200]
set -euo pipefail
cd "$(dirname "$0")/.."
ver=0.3.36
sha=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
out=${1:-bench/results/ggml-decode-$(date +%Y%m%d-%H%M%S).csv}
shapes=${GGML_BENCH_SHAPES:-1:32:32:128:1024 1:32:32:128:4096 1:32:8:128:4096 1:32:8:128:16384 4:32:8:128:4096}
cores=$(nproc)
threads=${GGML_BENCH_THREADS:-1 $cores}
iters=${GGML_BENCH_ITERS:-200}
top=build/ggml
mkdir -p $top "$(dirname "$out")"

# ---- ggml from the sdist ----
src=$top/llama_cpp_python-$ver/vendor/llama.cpp
if [ ! -d "$src" ]; then
    python3 - "$ver" "$top" "$sha" <<'EOF'
import hashlib, json, sys, tarfile, urllib.parse, urllib.request
ver, top, sha = sys.argv[1], sys.argv[2], sys.argv[3]
index = "https://pypi.org/pypi/llama-cpp-python/json"
meta = json.load(urllib.request.urlopen(index))
sdist = next(u for u in meta["releases"][ver] if u["packagetype"] == "sdist")
# a mirror may give the file's address relative to the index's
data = urllib.request.urlopen(urllib.parse.urljoin(index, sdist["url"])).read()
if hashlib.sha256(data).hexdigest() != sha:
    sys.exit("ggml_decode.sh: the sdist's sha256 is not the pinned one")
path = f"{top}/llama-cpp-python-{ver}.tar.gz"
open(path, "wb").write(data)
tarfile.open(path).extractall(top)
print(f"ggml_decode.sh: llama-cpp-python {ver} sdist, sha256 {sha}")
EOF
fi
if [ ! -f $top/build/bin/libggml-cpu.so ] && [ ! -f $top/build/ggml/src/libggml-cpu.so ]; then
    cmake -S "$src" -B $top/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
        -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF > $top/cmake.log
    cmake --build $top/build -j"$cores" --target ggml ggml-cpu > $top/build.log
fi
libdir=$(dirname "$(find $top/build -name 'libggml-cpu.so' | head -1)")

# ---- flashc and the program ----
cmake -S . -B $top/flashc -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHC_CUDA=OFF \
    -DFLASHC_BUILD_TOOLS=OFF > $top/flashc-cmake.log
cmake --build $top/flashc -j"$cores" --target flashc > $top/flashc-build.log
cc -O2 -std=c11 -I include -I "$src/ggml/include" bench/ggml_decode.c -o $top/ggml_decode \
    -L $top/flashc -lflashc -L "$libdir" -lggml -lggml-base -lggml-cpu -lm \
    -Wl,-rpath,"$(realpath $top/flashc)" -Wl,-rpath,"$(realpath "$libdir")"

echo "backend,batch,heads,kv_heads,headdim,seqlen_k,threads,us,gbps" | tee "$out"
for s in $shapes; do
    IFS=: read -r b h hk d n <<<"$s"
    for t in $threads; do
        $top/ggml_decode --batch "$b" --heads "$h" --kv-heads "$hk" --headdim "$d" \
            --seqlen-k "$n" --threads "$t" --iters "$iters" | tee -a "$out"
    done
done
