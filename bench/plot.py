#!/usr/bin/env python3
"""plot.py : PNG charts of the CSVs that bench/compare.py writes.

    bench/plot.sh bench/results/h200-fwd-sm90ws-run25.csv bench/results/h200-decode.csv
    python3 bench/plot.py --out docs/img --dtypes bf16 CSV...   (a python3 with matplotlib)

Every CSV has compare.py's columns (backend, mode, dtype, batch, seqlen_q,
seqlen_k, heads, kv_heads, headdim, causal, ms, tflops, gbps, max_err). What a
file holds is read from its mode column:

  fwd, bwd, fwdbwd   TFLOP/s against seqlen, one panel per head dim, the
                     non-causal row above the causal one, one line per backend
                     (flashc, flashc-sm90, flashc-sm80, sdpa-flash, sdpa-cudnn: whichever are
                     in the file). One PNG per (mode, dtype):
                     OUT/<stem>-<mode>-<dtype>.png (-<mode> left out when the
                     file's stem already names it: h200-fwd.csv -> h200-fwd-bf16.png).
  decode, decode-*   GB/s of K and V read, one group of bars per shape
                     (batch x heads:kv_heads x keys), one bar per backend and
                     cache layout (contiguous, page16, ...), the device copy's
                     GB/s (mode copy) as a dashed line. One PNG per dtype:
                     OUT/<stem>-decode-<dtype>.png, named as above.

A failed run (ms nan) leaves a gap. Nothing but the stdlib and matplotlib; the
charts are small (~100 KB) so they can live in docs/.
"""
import argparse
import csv
import math
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

TFLOP_MODES = ("fwd", "bwd", "fwdbwd")
# fixed colours, so a backend looks the same on every chart
COLOURS = {"flashc": "#d62728", "flashc-sm90": "#ff7f0e", "flashc-sm80": "#ff9896",
           "flashc-det": "#9467bd", "sdpa-flash": "#1f77b4", "sdpa-cudnn": "#2ca02c"}
ORDER = ["flashc", "flashc-sm90", "flashc-sm80", "flashc-det", "sdpa-flash", "sdpa-cudnn"]
HATCHES = ["//", "..", "xx", "\\\\"]  # paged cache layouts, one per series


def read_rows(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k in ("batch", "seqlen_q", "seqlen_k", "heads", "kv_heads", "headdim", "causal"):
            r[k] = int(r[k])
        for k in ("ms", "tflops", "gbps"):
            r[k] = float(r[k]) if r[k] not in ("", "nan") else math.nan
    return rows


def backends_of(rows):
    names = {r["backend"] for r in rows}
    return [b for b in ORDER if b in names] + sorted(names - set(ORDER))


def plot_tflops(rows, mode, dtype, title, out):
    rows = [r for r in rows if r["mode"] == mode and r["dtype"] == dtype]
    dims = sorted({r["headdim"] for r in rows})
    causals = sorted({r["causal"] for r in rows})
    fig, axes = plt.subplots(len(causals), len(dims), figsize=(3.6 * len(dims), 2.9 * len(causals)),
                             squeeze=False, sharex=True, sharey=True)
    for i, causal in enumerate(causals):
        for j, d in enumerate(dims):
            ax = axes[i][j]
            for b in backends_of(rows):
                pts = sorted((r["seqlen_q"], r["tflops"]) for r in rows
                             if r["backend"] == b and r["headdim"] == d and r["causal"] == causal)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3,
                            label=b, color=COLOURS.get(b))
            ax.set_xscale("log", base=2)
            ax.set_title("D=%d, %s" % (d, "causal" if causal else "not causal"), fontsize=9)
            ax.grid(True, alpha=0.3)
            if i == len(causals) - 1:
                ax.set_xlabel("seqlen")
            if j == 0:
                ax.set_ylabel("TFLOP/s")
    axes[0][0].legend(fontsize=7, loc="lower right")
    fig.suptitle("%s %s %s (16k tokens, hidden 2048)" % (title, mode, dtype), fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    plt.close(fig)


def plot_decode(rows, dtype, title, out):
    copy = [r["gbps"] for r in rows if r["mode"] == "copy"]
    rows = [r for r in rows if r["mode"].startswith("decode") and r["dtype"] == dtype]
    shapes = sorted({(r["batch"], r["heads"], r["kv_heads"], r["seqlen_k"]) for r in rows},
                    key=lambda s: (s[3], s[0]))
    series = sorted({(r["backend"], r["mode"]) for r in rows},
                    key=lambda s: (ORDER.index(s[0]) if s[0] in ORDER else len(ORDER), s[1]))
    fig, ax = plt.subplots(figsize=(2.2 * len(shapes) + 3.5, 3.6))
    width = 0.8 / max(1, len(series))
    for k, (b, mode) in enumerate(series):
        ys = []
        for s in shapes:
            v = [r["gbps"] for r in rows if r["backend"] == b and r["mode"] == mode and
                 (r["batch"], r["heads"], r["kv_heads"], r["seqlen_k"]) == s]
            ys.append(v[0] if v else math.nan)
        layout = mode[len("decode-"):] if mode.startswith("decode-") else "contiguous"
        paged = layout != "contiguous"
        ax.bar([i + (k - (len(series) - 1) / 2) * width for i in range(len(shapes))], ys, width,
               label="%s (%s)" % (b, layout), color=COLOURS.get(b), alpha=0.6 if paged else 1.0,
               hatch=HATCHES[k % len(HATCHES)] if paged else None, edgecolor="black",
               linewidth=0.3)
    if copy:
        ax.axhline(copy[0], color="black", linestyle="--", linewidth=1,
                   label="device copy %.0f GB/s" % copy[0])
    ax.set_xticks(range(len(shapes)))
    ax.set_xticklabels(["B%d H%d:%d\n%dk keys" % (s[0], s[1], s[2], s[3] // 1024) for s in shapes],
                       fontsize=8)
    ax.set_ylabel("GB/s of K and V read")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("%s decode %s, one query token, head dim 128" % (title, dtype), fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    plt.close(fig)


def png_name(out, stem, mode, dtype):
    """OUT/<stem>-<mode>-<dtype>.png, the mode left out when the stem names it."""
    return out / ("%s-%s.png" % (stem, dtype) if mode in stem.split("-") else
                  "%s-%s-%s.png" % (stem, mode, dtype))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv", nargs="+", help="CSV files written by bench/compare.py")
    ap.add_argument("--out", default="docs/img", help="folder for the PNGs")
    ap.add_argument("--dtypes", default="", help="only these dtypes, e.g. bf16 (default: all)")
    ap.add_argument("--title", default="", help="chart title prefix (default: the file's stem)")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    want = set(args.dtypes.split(",")) if args.dtypes else None
    for path in map(pathlib.Path, args.csv):
        rows = read_rows(path)
        title = args.title or path.stem
        dtypes = sorted({r["dtype"] for r in rows if r["mode"] != "copy"})
        for dt in (d for d in dtypes if want is None or d in want):
            modes = sorted({r["mode"] for r in rows if r["dtype"] == dt})
            for mode in (m for m in TFLOP_MODES if m in modes):
                png = png_name(out, path.stem, mode, dt)
                plot_tflops(rows, mode, dt, title, png)
                print("%s: %s %s -> %s" % (path, mode, dt, png))
            if any(m.startswith("decode") for m in modes):
                png = png_name(out, path.stem, "decode", dt)
                plot_decode(rows, dt, title, png)
                print("%s: decode %s -> %s" % (path, dt, png))
        if not dtypes:
            print("%s: no rows to plot" % path, file=sys.stderr)


if __name__ == "__main__":
    main()
