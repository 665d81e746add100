#!/usr/bin/env bash
# bench/cpu.sh : the CPU benchmark. flashc's CPU backend against unfused
# attention on OpenBLAS (bench/blas_baseline.c: GEMM, softmax, GEMM with the
# S x S matrix in memory) and against OpenBLAS's plain sgemm rate as the FLOP
# ceiling, on all cores.
#
#   bench/cpu.sh [out.csv]        default bench/results/cpu-<date>.csv
#
# Sweep: B=1, H=8, D=128, S in $CPU_BENCH_SEQLENS, fp32 and bf16, fwd and bwd,
# non-causal, plus causal at S=$CPU_BENCH_CAUSAL_S. FLOPs follow flash-attention's
# convention in both programs (forward 4*B*H*S*S*D, halved when causal, backward
# 2.5x), so the rates compare. Each row is its own process; peak RSS is that
# process's maximum resident set (GNU time %M), so the baseline's O(S^2) shows.
# A row that fails (flashc's backend missing, a crash, a time-out) prints n/a and
# the sweep goes on.
#
# Environment:
#   CPU_BENCH_SEQLENS   sequence lengths        [512 1024 2048 4096 8192]
#   CPU_BENCH_CAUSAL_S  the causal size         [2048]
#   CPU_BENCH_ITERS     timed runs per row      [3] (after 1 warm-up)
#   CPU_BENCH_BASELINE_BWD_MAX_S  skip the baseline backward above this S [8192]
#                       (it keeps P of all 8 heads: 2 GiB at S=8192, ~20 s a row)
#   CPU_BENCH_TIMEOUT   seconds per row         [900]
set -uo pipefail

cd "$(dirname "$0")/.."
seqlens=${CPU_BENCH_SEQLENS:-512 1024 2048 4096 8192}
causal_s=${CPU_BENCH_CAUSAL_S:-2048}
iters=${CPU_BENCH_ITERS:-3}
bwd_max=${CPU_BENCH_BASELINE_BWD_MAX_S:-8192}
row_timeout=${CPU_BENCH_TIMEOUT:-900}
cores=$(nproc)
out=${1:-bench/results/cpu-$(date +%Y%m%d-%H%M%S).csv}
mkdir -p "$(dirname "$out")"
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT

# ---- build ----
echo "== build (Release, CPU) =="
if ! { cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >"$log/cmake.txt" 2>&1 &&
       cmake --build build -j"$cores" >>"$log/cmake.txt" 2>&1; }; then
    tail -30 "$log/cmake.txt"
    echo "cpu.sh: the flashc build failed" >&2
    exit 1
fi

have_root() { [ "$(id -u)" = 0 ]; }
apt_install() { # package: install it when root, else say how
    if have_root; then
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$1"; } \
            >"$log/apt-$1.txt" 2>&1 || { tail -5 "$log/apt-$1.txt"; return 1; }
    else
        echo "cpu.sh: $1 is missing: run 'sudo apt-get install $1'" >&2
        return 1
    fi
}

baseline=build/blas_baseline
if ! [ -e /usr/include/x86_64-linux-gnu/cblas.h ] && ! [ -e /usr/include/cblas.h ]; then
    echo "cpu.sh: installing libopenblas-dev" >&2
    apt_install libopenblas-dev
fi
if ! cc -O3 -march=native -pthread bench/blas_baseline.c -lopenblas -lm -o "$baseline" \
        >"$log/cc.txt" 2>&1; then
    cat "$log/cc.txt" >&2
    echo "cpu.sh: the OpenBLAS baseline did not build: its rows will read n/a" >&2
    baseline=
fi

gnu_time=/usr/bin/time
if ! [ -x "$gnu_time" ]; then
    apt_install time || echo "cpu.sh: no GNU time: peak RSS will read n/a" >&2
fi

# ---- what is measured ----
commit=$(git rev-parse --short HEAD 2>/dev/null || echo uncommitted)
if [ "$commit" != uncommitted ] && ! git diff --quiet HEAD 2>/dev/null; then commit="$commit-dirty"; fi
blas_env=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS="$cores")
echo "== machine =="
echo "commit $commit; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $cores cores;" \
     "load average before: $(cut -d' ' -f1-3 /proc/loadavg) (other work on the machine skews every row)"
./build/flashc info | sed -n '/cpu features/,/threads/p'
if [ -n "$baseline" ]; then
    core_set=$("$baseline" sgemm --m 8 --n 8 --k 8 --iters 1 2>&1 | sed -n 's/.*OpenBLAS core \([^,]*\),.*/\1/p')
    core_bench=$("${blas_env[@]}" "$baseline" sgemm --m 8 --n 8 --k 8 --iters 1 2>&1 |
                 sed -n 's/.*OpenBLAS core \([^,]*\),.*/\1/p')
    echo "OpenBLAS core: $core_bench for the baseline (OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset);" \
         "$core_set with the environment as set (CORETYPE=${OPENBLAS_CORETYPE:-unset}," \
         "L2_SIZE=${OPENBLAS_L2_SIZE:-unset})"
fi

header=impl,mode,dtype,batch,seqlen_q,seqlen_k,heads,kv_heads,headdim,causal,ms,tflops,gbps,max_err,peak_rss_mib,commit
echo "$header" >"$out"

nrow=0
# run_row IMPL MODE DTYPE S CAUSAL -- COMMAND...: run, append a CSV row, or n/a on failure
run_row() {
    local impl=$1 mode=$2 dtype=$3 s=$4 causal=$5; shift 6
    nrow=$((nrow + 1))
    local rss=n/a row="" rc=0
    if [ -x "$gnu_time" ]; then
        timeout "$row_timeout" "$gnu_time" -f %M -o "$log/rss" "$@" >"$log/out" 2>"$log/err" || rc=$?
        [ "$rc" = 0 ] && [ -s "$log/rss" ] && rss=$(awk 'END { printf "%.1f", $1 / 1024 }' "$log/rss")
    else
        timeout "$row_timeout" "$@" >"$log/out" 2>"$log/err" || rc=$?
    fi
    row=$(grep -E '^[a-z0-9-]+,(fwd|bwd|gemm),' "$log/out" | tail -1)
    if [ "$rc" = 0 ] && [ -n "$row" ]; then
        # replace the program's backend column by the implementation's name
        echo "$impl,${row#*,},$rss,$commit" >>"$out"
        printf '  [%2d] %-17s %-4s %-4s S=%-5s causal=%s  %10.3f ms\n' "$nrow" "$impl" "$mode" \
            "$dtype" "$s" "$causal" "$(echo "$row" | cut -d, -f11)" >&2
    else
        echo "$impl,$mode,$dtype,1,$s,$s,8,8,128,$causal,n/a,n/a,n/a,,$rss,$commit" >>"$out"
        local why
        why=$( (grep -v '^blas_baseline: OpenBLAS core' "$log/err"; [ "$rc" = 124 ] && echo "timed out") |
               tail -1)
        printf '  [%2d] %-17s %-4s %-4s S=%-5s causal=%s  n/a (%s)\n' "$nrow" "$impl" "$mode" \
            "$dtype" "$s" "$causal" "${why:-exit $rc}" >&2
    fi
}

# ---- the sweep ----
echo "== sweep: B=1 H=8 D=128, $iters timed runs after 1 warm-up, $cores threads; CSV: $out =="
if [ -n "$baseline" ]; then
    run_row openblas-sgemm gemm fp32 4096 0 -- "${blas_env[@]}" "$baseline" sgemm \
        --m 4096 --n 4096 --k 128 --iters 5
    run_row openblas-sgemm gemm fp32 2048 0 -- "${blas_env[@]}" "$baseline" sgemm \
        --m 2048 --n 2048 --k 2048 --iters 5
fi
shapes=()
for s in $seqlens; do shapes+=("$s 0"); done
shapes+=("$causal_s 1")
for mode in fwd bwd; do
    for dtype in fp32 bf16; do
        for shape in "${shapes[@]}"; do
            read -r s causal <<<"$shape"
            cflag=()
            [ "$causal" = 1 ] && cflag=(--causal)
            if [ -z "$baseline" ]; then
                :
            elif [ "$mode" = bwd ] && [ "$s" -gt "$bwd_max" ]; then
                echo "openblas-unfused,$mode,$dtype,1,$s,$s,8,8,128,$causal,n/a,n/a,n/a,,n/a,$commit" >>"$out"
                echo "       openblas-unfused  $mode $dtype S=$s skipped (CPU_BENCH_BASELINE_BWD_MAX_S=$bwd_max)" >&2
            else
                run_row openblas-unfused "$mode" "$dtype" "$s" "$causal" -- "${blas_env[@]}" \
                    "$baseline" attn --mode "$mode" --dtype "$dtype" --batch 1 --seqlen "$s" \
                    --heads 8 --headdim 128 "${cflag[@]}" --iters "$iters" --warmup 1
            fi
            run_row flashc "$mode" "$dtype" "$s" "$causal" -- ./build/flashc bench --backend cpu \
                --mode "$mode" --dtype "$dtype" --batch 1 --seqlen "$s" --heads 8 --headdim 128 \
                "${cflag[@]}" --threads "$cores" --iters "$iters" --warmup 1 --csv
        done
    done
done

# ---- the table ----
echo
echo "== results (GFLOP/s by flash-attention's FLOP count; speedup = unfused ms / flashc ms;"
echo "   of peak = flashc GFLOP/s / the best openblas-sgemm GFLOP/s) =="
awk -F, '
    function num(x) { return x != "n/a" && x != "" }
    function fmt(x, f) { return num(x) ? sprintf(f, x) : "n/a" }
    NR == 1 { next }
    $1 == "openblas-sgemm" {
        printf "openblas-sgemm %sx%sx%s: %.1f GFLOP/s, peak RSS %s MiB\n", $5, $6, $9, $12 * 1000, $15
        if (num($12) && $12 * 1000 > peak) peak = $12 * 1000
        next
    }
    {
        key = $2 SUBSEP $3 SUBSEP $5 SUBSEP $10
        if (!(key in seen)) { seen[key] = 1; order[++n] = key }
        ms[$1, key] = $11; gf[$1, key] = num($12) ? $12 * 1000 : "n/a"; rss[$1, key] = $15
    }
    END {
        printf "\n%-4s %-4s %6s %-6s | %11s %9s %9s | %11s %9s %9s | %7s %7s\n", "mode", "type", \
            "S", "causal", "flashc ms", "GFLOP/s", "RSS MiB", "unfused ms", "GFLOP/s", "RSS MiB", \
            "speedup", "of peak"
        for (i = 1; i <= n; i++) {
            k = order[i]; split(k, f, SUBSEP)
            a = ms["flashc", k]; b = ms["openblas-unfused", k]
            sp = num(a) && num(b) && a > 0 ? sprintf("%.2fx", b / a) : "n/a"
            pk = num(gf["flashc", k]) && peak > 0 ? sprintf("%.0f%%", 100 * gf["flashc", k] / peak) : "n/a"
            printf "%-4s %-4s %6s %-6s | %11s %9s %9s | %11s %9s %9s | %7s %7s\n", f[1], f[2], f[3], \
                f[4] ? "yes" : "no", fmt(a, "%.2f"), fmt(gf["flashc", k], "%.1f"), rss["flashc", k], \
                fmt(b, "%.2f"), fmt(gf["openblas-unfused", k], "%.1f"), rss["openblas-unfused", k], sp, pk
        }
    }' "$out"
echo
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg); CSV written to $out"
