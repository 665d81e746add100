#!/usr/bin/env python3
"""kernel_ab.py : forward kernel times of several builds (and cuDNN) under ncu, one table.

    python3 bench/kernel_ab.py --libs /tmp/a/libflashc.so,build/libflashc.so --cudnn \\
        --shapes 128,1024,1,16/16,16 --shapes 64,8192,0,32/32,2 [--rounds 2] [--dtype fp16]

For each round and each library (then cuDNN, with --cudnn) it runs
`ncu --profile-from-start off --metrics gpu__time_duration.sum --csv` over
bench/kernel_time.py, which times one forward per shape (--shapes as there:
D,S,causal,H/Hk,B). The rows are the shapes and the columns are each run's
microseconds. The last columns give the ratio of each library's best round to
the first library's, and cuDNN's to each library's (the speed of that library
relative to cuDNN). ncu locks the clocks, so builds compare within a percent
(bench/NOTES.md, issue 18 run 33).

`--parse FILE...` reads saved ncu CSVs instead of running anything (used to
test the parser).
"""
import argparse
import csv
import io
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def kernel_times(text):
    """Kernel durations in µs, in launch order, from ncu's --csv output."""
    rows = [r for r in csv.reader(io.StringIO(text)) if r and not r[0].startswith("==")]
    if not rows:
        return []
    hdr = rows[0]
    iid, name, value = hdr.index("ID"), hdr.index("Metric Name"), hdr.index("Metric Value")
    unit = hdr.index("Metric Unit")
    scale = {"ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
    out = {}
    for r in rows[1:]:
        if r[name] == "gpu__time_duration.sum":
            out[int(r[iid])] = float(r[value].replace(",", "")) * scale.get(r[unit], 1.0)
    return [out[k] for k in sorted(out)]


def run(lib, backend, args):
    cmd = ["ncu", "--profile-from-start", "off", "--metrics", "gpu__time_duration.sum", "--csv",
           sys.executable, os.path.join(HERE, "kernel_time.py"), "--lib", lib, "--backend", backend,
           "--dtype", args.dtype]
    for s in args.shapes:
        cmd += ["--shapes", s]
    p = subprocess.run(cmd, capture_output=True, text=True)
    t = kernel_times(p.stdout)
    if len(t) != len(args.shapes):
        sys.stderr.write("%s %s: %d kernel times for %d shapes\n%s\n" %
                         (backend, lib, len(t), len(args.shapes), p.stderr[-2000:]))
        t = (t + [float("nan")] * len(args.shapes))[:len(args.shapes)]
    return t


def table(shapes, cols, names):
    """cols[name] = list of rounds, each a list of µs per shape."""
    libs = [n for n in names if n != "cudnn"]
    best = {n: [min(r[i] for r in cols[n]) for i in range(len(shapes))] for n in names}
    head = ["shape"] + ["%s r%d" % (n, k + 1) for n in names for k in range(len(cols[n]))]
    head += ["%s/%s" % (n, libs[0]) for n in libs[1:]]
    if "cudnn" in names:
        head += ["%s vs cuDNN" % n for n in libs]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for i, s in enumerate(shapes):
        row = [s] + ["%.1f" % r[i] for n in names for r in cols[n]]
        row += ["%.3f" % (best[n][i] / best[libs[0]][i]) for n in libs[1:]]
        if "cudnn" in names:
            row += ["%.3f" % (best["cudnn"][i] / best[n][i]) for n in libs]
        lines.append(" | ".join(row))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--libs", default="build/libflashc.so", help="comma-separated libflashc.so paths")
    ap.add_argument("--cudnn", action="store_true", help="also time SDPA's cuDNN backend")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--shapes", action="append", default=[], help="D,S,causal,H/Hk,B")
    ap.add_argument("--parse", nargs="*", help="saved ncu CSVs: print their kernel times")
    args = ap.parse_args()
    if args.parse:
        for f in args.parse:
            print(f, " ".join("%.1f" % t for t in kernel_times(open(f).read())))
        return
    if not args.shapes:
        ap.error("--shapes is required")
    libs = [x for x in args.libs.split(",") if x]
    names = ["lib%d" % k for k in range(len(libs))] + (["cudnn"] if args.cudnn else [])
    cols = {n: [] for n in names}
    for _ in range(args.rounds):
        for n, lib in zip(names, libs):
            cols[n].append(run(lib, "flashc", args))
        if args.cudnn:
            cols["cudnn"].append(run(libs[0], "cudnn", args))
    for n, lib in zip(names, libs):
        print("%s = %s" % (n, lib))
    print(table(args.shapes, cols, names))


if __name__ == "__main__":
    main()
