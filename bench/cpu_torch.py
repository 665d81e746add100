#!/usr/bin/env python3
"""cpu_torch.py : flashc's CPU backend against PyTorch's CPU SDPA, in one process.

    FLASHC_LIBRARY=build/libflashc.so PYTHONPATH=python .venv/bin/python \\
        bench/cpu_torch.py --csv bench/results/cpu-torch.csv
    .venv-plot/bin/python bench/cpu_torch.py --plot bench/results/cpu-torch.csv \\
        --png docs/img/cpu-torch.png          (only matplotlib needed; bench/plot.sh makes .venv-plot)

Both sides get the same inputs in their own layout (flashc (B, S, H, D), torch
(B, H, S, D), each contiguous), the same thread count (flashc_set_num_threads and
torch.set_num_threads), and torch is held to its flash-attention CPU kernel
(sdpa_kernel(FLASH_ATTENTION); GQA through enable_gqa). Each timed row is the
median of --reps runs after one warm-up (torch's of twice that in decode); flashc
and torch alternate run by run, so a load that comes and goes hits both.

torch's OpenMP threads spin for a while after each parallel region (libgomp's default
wait policy), on the cores flashc's pool needs next: alternating at 2 threads on 2 cores
that made flashc's next call up to 1.7x slower (bench/NOTES.md). The script sets
OMP_WAIT_POLICY=PASSIVE before torch loads (torch's own times moved by under 5%);
--omp-active keeps the default, to see the interference.

Modes:
  fwd      forward; TFLOP/s with flash-attention's FLOPs (4*B*H*Sq*Sk*D, halved
           when causal)
  fwdbwd   forward and backward of one autograd graph (out.backward(dout)), 3.5x
           the forward's FLOPs
  decode   one query token per sequence over a full cache of --decode-keys keys
           (flash_attn_with_kvcache, no append, against SDPA on the same K/V); the
           figure is the call's time, median of blocks of calls. A third timing,
           flashc_lib_ms, is the library's own call on the same tensors
           (flashc_fwd_kvcache through ctypes, its args struct filled once, no
           softmax_lse, the library's own workspace): what a caller in C or C++ pays
           (plus ctypes' ~1 us), without the Python package's per-call work. It must
           write the package's out (else the run stops). Each flashc-side timing runs
           right after a torch sample (package, torch, library, torch), so torch's
           figure is the median of twice --reps samples

Every timed shape is checked first: the largest |flashc - torch| over out (and
dq, dk, dv for fwdbwd) goes to the CSV's max_diff column. CSV columns: mode,
dtype, threads, batch, heads, kv_heads, headdim, seqlen_q, seqlen_k, causal,
flashc_ms, torch_ms, speedup (torch_ms / flashc_ms), flashc_tflops,
torch_tflops, max_diff, flashc_lib_ms (decode only).
"""
import argparse
import csv
import ctypes
import os
import statistics
import sys
import time

COLUMNS = ["mode", "dtype", "threads", "batch", "heads", "kv_heads", "headdim", "seqlen_q",
           "seqlen_k", "causal", "flashc_ms", "torch_ms", "speedup", "flashc_tflops",
           "torch_tflops", "max_diff", "flashc_lib_ms"]


def parse_list(text, kind=int):
    return [kind(x) for x in text.split(",") if x]


def all_threads():
    return len(os.sched_getaffinity(0))


def flops(mode, b, h, sq, sk, d, causal):
    f = 4.0 * b * h * sq * sk * d * (0.5 if causal else 1.0)
    return f * 3.5 if mode == "fwdbwd" else f


class Bench:
    """The callers of one shape (flashc, torch, and for decode the library's own call),
    built once, timed alternately."""

    def __init__(self, args):
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        import flashc
        from flashc import _lib
        self.torch, self.F, self.flashc, self.lib = torch, F, flashc, _lib.lib
        self.sdpa_kernel, self.flash_backend = sdpa_kernel, SDPBackend.FLASH_ATTENTION
        self.args = args
        self.dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

    def set_threads(self, n):
        self.torch.set_num_threads(n)
        self.lib.flashc_set_num_threads(n)

    def sdpa(self, q, k, v, causal):
        with self.sdpa_kernel(self.flash_backend):
            return self.F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                       enable_gqa=k.shape[1] != q.shape[1])

    def inputs(self, dt, b, h, hk, sq, sk, d, grad):
        torch = self.torch
        g = torch.Generator().manual_seed(b * 1000003 + h * 10007 + sq * 101 + sk + d)
        q = torch.randn(b, sq, h, d, generator=g).to(dt)
        k = torch.randn(b, sk, hk, d, generator=g).to(dt)
        v = torch.randn(b, sk, hk, d, generator=g).to(dt)
        # torch's own layout (B, H, S, D), contiguous: what it is fastest on
        qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
        tensors = [q, k, v, qt, kt, vt]
        if grad:
            for x in tensors:
                x.requires_grad_(True)
        return tensors

    def lib_caller(self, q, k, v, causal):
        """A zero-argument function that calls flashc_fwd_kvcache itself on q, k, v (the
        args struct and params filled once, as a C caller would keep them) and returns
        the out it writes."""
        torch, _lib = self.torch, self.flashc._lib
        out = torch.full_like(q, float("nan"))  # a call that writes nothing fails the check
        args = _lib.KvcacheArgs()
        for name, t in (("q", q), ("k_cache", k), ("v_cache", v), ("out", out)):
            _lib.describe_into(getattr(args, name), t, name)
        params = _lib.params(q.device, causal=int(causal))
        fn, ra, rp = self.lib.flashc_fwd_kvcache, ctypes.byref(args), ctypes.byref(params)

        def run_c(_keep=(q, k, v)):  # the struct points into q, k, v: kept alive here
            status = fn(ra, rp, None, 0)
            if status != _lib.OK:
                raise RuntimeError(self.lib.flashc_last_error().decode())
            return out
        return run_c

    def callers(self, mode, dt, b, h, hk, sq, sk, d, causal):
        """The zero-argument functions to time (flashc, torch, and for decode the
        library's own call) and the largest difference of their results (out, and the
        gradients for fwdbwd)."""
        torch, flashc = self.torch, self.flashc
        grad = mode == "fwdbwd"
        q, k, v, qt, kt, vt = self.inputs(dt, b, h, hk, sq, sk, d, grad)
        fns = ()
        if mode == "decode":
            def run_f():
                return flashc.flash_attn_with_kvcache(q, k, v, causal=causal)
            fns = (self.lib_caller(q, k, v, causal),)

            def run_t():
                return self.sdpa(qt, kt, vt, causal)
        elif mode == "fwd":
            def run_f():
                return flashc.flash_attn_func(q, k, v, causal=causal)

            def run_t():
                return self.sdpa(qt, kt, vt, causal)
        else:
            dout = torch.randn(b, sq, h, d, generator=torch.Generator().manual_seed(7)).to(dt)
            doutt = dout.transpose(1, 2).contiguous()

            def run_f():
                for x in (q, k, v):
                    x.grad = None
                flashc.flash_attn_func(q, k, v, causal=causal).backward(dout)
                return q.grad, k.grad, v.grad

            def run_t():
                for x in (qt, kt, vt):
                    x.grad = None
                self.sdpa(qt, kt, vt, causal).backward(doutt)
                return qt.grad, kt.grad, vt.grad
        with torch.no_grad() if not grad else torch.enable_grad():
            rf, rt = run_f(), run_t()
            # the library's own call must write what the package's call returns
            for fn in fns:
                if not torch.equal(fn(), rf):
                    raise RuntimeError("the library's own call gave another out")
        if mode != "fwdbwd":
            rf, rt = (rf,), (rt.transpose(1, 2),)
        else:
            rt = tuple(x.transpose(1, 2) for x in rt)
        diff = max((a.float() - c.float()).abs().max().item() for a, c in zip(rf, rt))
        return (run_f, run_t) + fns, diff

    def time_all(self, fns, reps, calls):
        """Median seconds per call of each function (fns[1] is torch's), alternating with
        torch's: each of the others runs right after a torch sample, so that each starts
        from the same caches (the library's own call reads what the package's does, and
        would find it warm right after it); `calls` calls per sample."""
        samples = tuple([] for _ in fns)
        for rep in range(reps + 1):
            for i in [0] + list(range(2, len(fns))):
                for j in (i, 1):
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        fns[j]()
                    if rep:  # the first round is the warm-up
                        samples[j].append((time.perf_counter() - t0) / calls)
        return [statistics.median(x) for x in samples]

    def row(self, mode, dtype, threads, b, h, hk, sq, sk, d, causal):
        torch = self.torch
        self.set_threads(threads)
        dt = self.dtypes[dtype]
        fns, diff = self.callers(mode, dt, b, h, hk, sq, sk, d, causal)
        run_t = fns[1]
        # enough calls per sample that a sample lasts ~20 ms (decode calls take µs)
        calls = 1
        if mode == "decode":
            with torch.no_grad():
                t0 = time.perf_counter()
                run_t()
                one = max(time.perf_counter() - t0, 1e-6)
            calls = max(1, min(2000, int(0.02 / one)))
        with torch.no_grad() if mode != "fwdbwd" else torch.enable_grad():
            times = self.time_all(fns, self.args.reps, calls)
        tf, tt = times[0], times[1]
        fl = flops(mode, b, h, sq, sk, d, causal)
        return {"mode": mode, "dtype": dtype, "threads": threads, "batch": b, "heads": h,
                "kv_heads": hk, "headdim": d, "seqlen_q": sq, "seqlen_k": sk,
                "causal": int(causal), "flashc_ms": f"{tf * 1e3:.4f}",
                "torch_ms": f"{tt * 1e3:.4f}", "speedup": f"{tt / tf:.3f}",
                "flashc_tflops": f"{fl / tf / 1e12:.4f}", "torch_tflops": f"{fl / tt / 1e12:.4f}",
                "max_diff": f"{diff:.3g}",
                "flashc_lib_ms": f"{times[2] * 1e3:.4f}" if len(times) > 2 else ""}


def shapes(args):
    """(mode, dtype, threads, b, h, hk, sq, sk, d, causal) of every row, in order."""
    threads = sorted({all_threads() if t == "all" else int(t) for t in args.threads.split(",")})
    heads = [tuple(int(x) for x in hh.split("/")) for hh in args.heads.split(",")]
    rows = []
    for mode in args.modes.split(","):
        for dtype in args.dtypes.split(","):
            for t in threads:
                for h, hk in heads:
                    for d in parse_list(args.headdims):
                        if mode == "decode":
                            for sk in parse_list(args.decode_keys):
                                rows.append((mode, dtype, t, 1, h, hk, 1, sk, d, False))
                            continue
                        for causal in (False, True):
                            for s in parse_list(args.seqlens):
                                if mode == "fwdbwd" and s > args.max_bwd_seqlen:
                                    continue
                                rows.append((mode, dtype, t, 1, h, hk, s, s, d, causal))
    return rows


def run(args):
    bench = Bench(args)
    out = open(args.csv, "w", newline="") if args.csv else None
    writer = csv.DictWriter(out, COLUMNS) if out else None
    if writer:
        writer.writeheader()
    print(" ".join(f"{c:>9}" for c in ["mode", "dtype", "thr", "H/KV", "D", "S", "causal",
                                       "flashc_ms", "torch_ms", "speedup", "max_diff",
                                       "lib_ms"]))
    for shape in shapes(args):
        r = bench.row(*shape)
        if writer:
            writer.writerow(r)
            out.flush()
        print(" ".join(f"{x:>9}" for x in [r["mode"], r["dtype"], r["threads"],
                                           f"{r['heads']}/{r['kv_heads']}", r["headdim"],
                                           r["seqlen_k"], r["causal"], r["flashc_ms"],
                                           r["torch_ms"], r["speedup"], r["max_diff"],
                                           r["flashc_lib_ms"] or "-"]),
              flush=True)
    if out:
        out.close()


def plot(csv_path, png):
    """One panel per (mode, dtype): flashc's speedup over torch per row, the 1.0 and
    1.5 lines drawn."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    panels = sorted({(r["mode"], r["dtype"]) for r in rows})
    fig, axes = plt.subplots(len(panels), 1, figsize=(12, 3.2 * len(panels)), squeeze=False)
    for ax, (mode, dtype) in zip(axes[:, 0], panels):
        sel = [r for r in rows if r["mode"] == mode and r["dtype"] == dtype]
        labels = [(f"{r['threads']}t {r['heads']}/{r['kv_heads']} D{r['headdim']} "
                   f"{r['seqlen_k'] if mode == 'decode' else r['seqlen_q']}"
                   f"{' c' if r['causal'] == '1' else ''}") for r in sel]
        vals = [float(r["speedup"]) for r in sel]
        ax.bar(range(len(vals)), vals, color=["#d62728" if x >= 1.5 else "#ff9896" if x >= 1.0
                                              else "#1f77b4" for x in vals])
        for y in (1.0, 1.5):
            ax.axhline(y, color="k", lw=0.8, ls="--" if y == 1.5 else "-")
        ax.set_xticks(range(len(vals)))
        ax.set_xticklabels(labels, rotation=70, fontsize=6)
        ax.set_ylabel("torch ms / flashc ms")
        ax.set_title(f"{mode} {dtype}: flashc CPU against torch SDPA CPU (threads, H/KV, D, S)")
    fig.tight_layout()
    fig.savefig(png, dpi=72)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--modes", default="fwd,fwdbwd,decode")
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--threads", default="1,all", help="comma list; 'all' = the CPUs we may use")
    p.add_argument("--heads", default="8/8,8/2", help="query/kv heads, comma list")
    p.add_argument("--headdims", default="64,128")
    p.add_argument("--seqlens", default="512,1024,2048,4096,8192")
    p.add_argument("--max-bwd-seqlen", type=int, default=4096,
                   help="fwdbwd rows only up to this S (8k costs minutes a row on 2 cores)")
    p.add_argument("--decode-keys", default="1024,4096,8192")
    p.add_argument("--reps", type=int, default=5, help="timed runs per side (median; torch's twice that "
                   "in decode), >= 5")
    p.add_argument("--omp-active", action="store_true",
                   help="leave OMP_WAIT_POLICY as it is (torch's threads spin between calls)")
    p.add_argument("--csv")
    p.add_argument("--plot", metavar="CSV", help="draw a CSV instead of running")
    p.add_argument("--png", default="cpu-torch.png")
    args = p.parse_args()
    if args.plot:
        plot(args.plot, args.png)
        return
    if args.reps < 5:
        sys.exit("cpu_torch.py: --reps must be >= 5 (the median of at least five runs)")
    if not args.omp_active:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # read when torch loads
    run(args)


if __name__ == "__main__":
    main()
