#!/usr/bin/env bash
# build_times.sh : measure the three builds docs/BUILD.md quotes, each from a
# clean build directory with `cmake --build -j$JOBS` (default 2), with Ninja
# when it is installed (else CMake's default generator, without step times):
#   cpu       -DFLASHC_CUDA=OFF
#   cuda-all  -DFLASHC_CUDA=ON  -DFLASHC_CUDA_ARCHS="80;90a" (every head dim,
#             forward, backward and decode)
#   cuda-d128 the same with -DFLASHC_CUDA_HEADDIMS=128
# Prints the `uptime` load before each build (other work on the machine slows
# it down: report the load with the number), then a table of wall seconds, and
# the slowest translation units of each CUDA build (from .ninja_log).
#
#   tools/build_times.sh [SOURCE_DIR]      # default: this checkout
#   JOBS=2 BUILDS="cpu cuda-d128" tools/build_times.sh
#   COMMIT=abc1234 tools/build_times.sh /tmp/flashc-src   # names a snapshot's commit
#
# The build directories go under ${WORK:-/tmp/flashc-build-times} and are
# removed first. Measuring a snapshot keeps edits made meanwhile out of it:
#   git archive HEAD | tar -x -C /tmp/flashc-src && tools/build_times.sh /tmp/flashc-src
set -euo pipefail

src=$(cd "${1:-$(dirname "$0")/..}" && pwd)
jobs=${JOBS:-2}
builds=${BUILDS:-cpu cuda-all cuda-d128}
work=${WORK:-/tmp/flashc-build-times}
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi

flags_of() {
  case $1 in
  cpu) echo "-DFLASHC_CUDA=OFF" ;;
  cuda-all) echo "-DFLASHC_CUDA=ON -DFLASHC_CUDA_ARCHS=80;90a -DFLASHC_CUDA_HEADDIMS=all" ;;
  cuda-d128) echo "-DFLASHC_CUDA=ON -DFLASHC_CUDA_ARCHS=80;90a -DFLASHC_CUDA_HEADDIMS=128" ;;
  *) echo "unknown build $1 (cpu, cuda-all, cuda-d128)" >&2; exit 1 ;;
  esac
}

gen=()  # Ninja when there is one: its .ninja_log times every step
command -v ninja >/dev/null && gen=(-G Ninja)
commit=${COMMIT:-$(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo "not a git checkout")}
mkdir -p "$work"
echo "flashc build times: $(date -u '+%Y-%m-%d %H:%M UTC'), source $src ($commit), -j$jobs, $(nproc) cores"
table=()
for b in $builds; do
  dir=$work/$b
  rm -rf "$dir"
  load=$(uptime | sed 's/.*load average: //')
  echo "== $b: load before: $load"
  # shellcheck disable=SC2046 # the flags are words
  cmake -S "$src" -B "$dir" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release $(flags_of "$b") >"$dir.configure.log"
  t0=$(date +%s.%N)
  cmake --build "$dir" -j"$jobs" >"$dir.build.log" 2>&1 || { tail -20 "$dir.build.log"; exit 1; }
  t1=$(date +%s.%N)
  secs=$(awk "BEGIN { print $t1 - $t0 }")
  units=$(grep -c . "$dir/.ninja_log" 2>/dev/null || echo 0)
  table+=("$(printf '%-10s %8.1f s  %4d steps  load before: %s' "$b" "$secs" "$((units - 1))" "$load")")
  if [ "$b" != cpu ] && [ -f "$dir/.ninja_log" ]; then
    echo "   slowest steps (seconds, output):"
    # .ninja_log v5: start_ms end_ms mtime output hash
    awk 'NR > 1 { printf "%8.1f  %s\n", ($2 - $1) / 1000, $4 }' "$dir/.ninja_log" | sort -rn | head -8
    awk 'NR > 1 && $4 ~ /\.cu\.o$/ { s += ($2 - $1) / 1000; n++ }
         END { printf "   %d CUDA objects, %.0f s of compile in all (/%d jobs = %.0f s)\n", n, s, '"$jobs"', s / '"$jobs"' }' \
      "$dir/.ninja_log"
  fi
done
echo
echo "build      wall          steps  load (1, 5, 15 min)"
printf '%s\n' "${table[@]}"
