#!/usr/bin/env python3
"""compare.py : flashc's CUDA backend against PyTorch SDPA (flash = FA2, cuDNN) in one run.

Run on a machine with a GPU after the normal build (`cmake -S . -B build && cmake
--build build`), with a python3 that has torch:

    python3 bench/compare.py --mode fwd --csv bench/results/fwd.csv
    python3 bench/compare.py --mode bwd --csv bench/results/bwd.csv      (or --mode fwdbwd)
    python3 bench/compare.py --mode decode --csv bench/results/decode.csv

Shapes follow the FlashAttention papers: hidden 2048 (heads = 2048 / headdim) and
16k tokens per batch (batch = 16384 / seqlen). For each shape it checks flashc's
output against SDPA's (max abs error, reported in the CSV), then times every
backend with CUDA events (median of --reps runs after warm-up; the L2 is flushed
before each run). FLOPs are flash-attention's: 4*B*H*Sq*Sk*D forward, halved for
causal. GB/s counts q, k, v read and out written once.

flashc is called through ctypes on libflashc.so (--lib) with the tensors' device
pointers, using the Python package's binding module (python/flashc/_lib.py).
CSV columns are those of `flashc bench --csv`; backends: flashc (the kernel family
src/cuda/fwd.cu picks: sm90ws on an H100/H200), flashc-sm90 (FLASHC_CUDA_FAMILY=sm90:
the cp.async wgmma kernels), flashc-sm80 (FLASHC_CUDA_FAMILY=sm80: the
FA2-algorithm kernels), sdpa-flash, sdpa-cudnn (--backends times a subset, e.g.
flashc alone for a tuning variant with --lib; max_err is always against an
untimed sdpa-flash call).

--mode bwd times the backward alone (flashc_bwd after one forward; SDPA's
autograd backward of one forward graph, retain_graph), --mode fwdbwd the
forward and the backward together; FLOPs are 2.5x and 3.5x the forward's
(flash-attention's convention). Backends: flashc, flashc-det (deterministic =
1, to show its cost), flashc-sm90 and flashc-sm90-det (the same with
FLASHC_CUDA_BWD_WS=0: the sm90 backward without warp specialisation, set around
their own calls only), sdpa-flash, sdpa-cudnn; max_err is the largest of dq, dk,
dv against sdpa-flash's gradients (SDPA's math kernel's where GQA keeps the flash
kernel out); the table line's err, over every flashc backend timed. --heads H/Hk gives GQA shapes in every mode (SDPA through enable_gqa).

--mode decode: one query token per sequence (flashc_fwd_kvcache, no append)
over a full cache, head dim 128, for (batch, heads, kv heads, keys) in
--decode-shapes (default (32,32,32,4k), (8,32,32,32k), (1,32,32,128k),
(64,32,8,8k)). The figure is bandwidth: bytes of K and V read / time. flashc runs
on the contiguous cache and on paged copies of it (--pages, default 16 and 256;
pages in a random order), SDPA flash and cuDNN on the contiguous one (GQA through
enable_gqa). The same run measures a device-to-device copy (a 1 GiB torch copy,
bytes read + written / time) as the bandwidth ceiling; each row's "of copy" is
its GB/s over the copy's. CSV rows as above, mode decode / decode-page16 / ...,
plus one row for the copy (backend torch-copy, mode copy). --q-len N > 1 makes
each sequence's query a chunk of N tokens attending the whole cache (chunked
prefill, no mask; flashc takes its forward kernel there, a paged cache
included): rows then also give TFLOP/s.
"""
import argparse
import ctypes
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# ---- the C API: the Python package's ctypes binding (python/flashc/_lib.py) ----
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Flashc:
    def __init__(self, path):
        # _lib loads the library named by FLASHC_LIBRARY when first imported
        os.environ["FLASHC_LIBRARY"] = os.path.abspath(path)
        sys.path.insert(0, os.path.join(ROOT, "python"))
        from flashc import _lib
        self.b = _lib
        self.lib = _lib.lib

    def fwd(self, q, k, v, out, lse, causal, family="auto"):
        os.environ["FLASHC_CUDA_FAMILY"] = family  # read by plan.cu:fc_cuda_family at every call
        a = self.b.FwdArgs()
        a.q, a.k, a.v, a.out, a.softmax_lse = (self.b.describe(t, "t") for t in (q, k, v, out, lse))
        p = self.lib.flashc_params_default()
        p.causal = int(causal)
        p.stream = torch.cuda.current_stream().cuda_stream
        s = self.lib.flashc_fwd(ctypes.byref(a), ctypes.byref(p), None, 0)
        if s != 0:
            raise RuntimeError("flashc_fwd: status %d: %s" % (s, self.lib.flashc_last_error().decode()))

    def bwd_call(self, dout, q, k, v, out, lse, dq, dk, dv, causal, deterministic):
        """The args, params and workspace of flashc_bwd(), built once per shape."""
        a = self.b.BwdArgs()
        a.dout, a.q, a.k, a.v, a.out, a.softmax_lse, a.dq, a.dk, a.dv = (
            self.b.describe(t, "t") for t in (dout, q, k, v, out, lse, dq, dk, dv))
        p = self.lib.flashc_params_default()
        p.causal = int(causal)
        p.deterministic = int(deterministic)
        p.stream = torch.cuda.current_stream().cuda_stream
        size = ctypes.c_size_t(0)
        s = self.lib.flashc_bwd_workspace_size(ctypes.byref(a), ctypes.byref(p), ctypes.byref(size))
        if s != 0:
            raise RuntimeError("flashc_bwd_workspace_size: status %d: %s" %
                               (s, self.lib.flashc_last_error().decode()))
        ws = torch.empty(max(size.value, 1), dtype=torch.uint8, device="cuda")
        return a, p, ws, size.value

    def bwd(self, call):
        a, p, ws, size = call
        s = self.lib.flashc_bwd(ctypes.byref(a), ctypes.byref(p), ctypes.c_void_p(ws.data_ptr()), size)
        if s != 0:
            raise RuntimeError("flashc_bwd: status %d: %s" % (s, self.lib.flashc_last_error().decode()))

    def kvcache_call(self, q, k_cache, v_cache, seqlens, block_table, out, lse, num_splits):
        """The args, params and a workspace of the size the library asks for, for
        fwd_kvcache(); built once per shape so that the timed call is the call alone."""
        a = self.b.KvcacheArgs()
        a.q, a.k_cache, a.v_cache, a.cache_seqlens, a.out, a.softmax_lse = (
            self.b.describe(t, "t") for t in (q, k_cache, v_cache, seqlens, out, lse))
        if block_table is not None:
            a.block_table = self.b.describe(block_table, "block_table")
        p = self.lib.flashc_params_default()
        p.num_splits = num_splits
        p.stream = torch.cuda.current_stream().cuda_stream
        size = ctypes.c_size_t(0)
        s = self.lib.flashc_fwd_kvcache_workspace_size(ctypes.byref(a), ctypes.byref(p), ctypes.byref(size))
        if s != 0:
            raise RuntimeError("flashc_fwd_kvcache_workspace_size: status %d: %s" %
                               (s, self.lib.flashc_last_error().decode()))
        ws = torch.empty(max(size.value, 1), dtype=torch.uint8, device="cuda")  # 512-byte aligned
        return a, p, ws, size.value

    def fwd_kvcache(self, call):
        a, p, ws, size = call
        s = self.lib.flashc_fwd_kvcache(ctypes.byref(a), ctypes.byref(p),
                                        ctypes.c_void_p(ws.data_ptr()), size)
        if s != 0:
            raise RuntimeError("flashc_fwd_kvcache: status %d: %s" % (s, self.lib.flashc_last_error().decode()))


# ---- timing ----
_flush = None


def time_ms(fn, reps, warmup=3):
    """Median milliseconds of fn() over reps runs, L2 flushed before each."""
    global _flush
    if _flush is None:
        _flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        _flush.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def flops(b, h, sq, sk, d, causal, mode="fwd"):
    """flash-attention's FLOP count, the formula of cli/flops.h (fc_flops, as `flashc bench`
    counts): 4*B*H*pairs*D for the forward, pairs = Sq*Sk halved when causal; the backward
    2.5x, forward + backward 3.5x. (No windows here: compare.py runs none.) The twins
    agree by tests/python/test_flashc.py test_flops_twins."""
    pairs = sq * sk / 2 if causal else sq * sk
    return 4.0 * b * h * pairs * d * {"fwd": 1.0, "bwd": 2.5, "fwdbwd": 3.5}[mode]


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# the columns of `flashc bench --csv`
CSV_HEADER = "backend,mode,dtype,batch,seqlen_q,seqlen_k,heads,kv_heads,headdim,causal,ms,tflops,gbps,max_err"


def sweep(args):
    """The fwd / bwd shapes: (dtype name, dtype, head dim, seqlen, causal, heads, batch)
    over --dtypes x --headdims x --seqlens x --causal: hidden 2048 and 16k tokens, or
    --heads H/Hk and --batch (default 16k tokens)."""
    for dn in args.dtypes.split(","):
        for d in map(int, args.headdims.split(",")):
            for s in map(int, args.seqlens.split(",")):
                for causal in map(int, args.causal.split(",")):
                    h = int(args.heads.split("/")[0]) if args.heads else 2048 // d
                    b = args.batch or max(1, 16384 // s)
                    yield dn, DTYPES[dn], d, s, causal, h, b


def fwd_operands(b, s, h, hk, d, dt, sk=None):
    """Random q [b, s, h, d] and k, v [b, sk, hk, d] (sk defaults to s; drawn in that
    order), out like q, lse [b, h, s] fp32, the [b, heads, rows, d] views SDPA takes and
    its GQA keyword."""
    q = torch.randn(b, s, h, d, device="cuda", dtype=dt)
    k, v = (torch.randn(b, s if sk is None else sk, hk, d, device="cuda", dtype=dt) for _ in range(2))
    out = torch.empty_like(q)
    lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
    views = tuple(x.transpose(1, 2) for x in (q, k, v))
    return q, k, v, out, lse, views, {"enable_gqa": True} if h != hk else {}


def kv_heads(args, h):
    """The K/V heads of a shape with h query heads: --heads H/Hk, else h (MHA)."""
    return int(args.heads.split("/")[1]) if args.heads and "/" in args.heads else h


def write_csv(path, rows):
    if path:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as f:
            f.write(CSV_HEADER + "\n" + "\n".join(rows) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", default="fwd", choices=["fwd", "bwd", "fwdbwd", "decode"])
    ap.add_argument("--lib", default=os.environ.get("FLASHC_LIBRARY", "build/libflashc.so"))
    ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--headdims", default="64,128,256")
    ap.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--heads", default="", help="fwd, bwd: H/Hk query and K/V heads (GQA), e.g. 64/8; "
                    "default hidden 2048, MHA")
    ap.add_argument("--batch", type=int, default=0, help="fwd, bwd: batch (default 16k tokens)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--backends", default="",
                    help="subset to time (flashc alone: a quick look at a tuning variant); default "
                         "sdpa-flash,sdpa-cudnn,flashc-sm80,flashc (fwd, decode) or "
                         "sdpa-flash,sdpa-cudnn,flashc-det,flashc (bwd, fwdbwd; flashc-sm90 and "
                         "flashc-sm90-det there on request)")
    ap.add_argument("--csv", default="")
    ap.add_argument("--decode-shapes", default="32x32x32x4096,8x32x32x32768,1x32x32x131072,64x32x8x8192",
                    help="decode: batch x heads x kv_heads x keys, comma-separated")
    ap.add_argument("--pages", default="16,256", help="decode: page sizes of the paged runs")
    ap.add_argument("--num-splits", type=int, default=0, help="decode: params.num_splits (0 = heuristic)")
    ap.add_argument("--q-len", type=int, default=1, help="decode: query tokens per sequence")
    args = ap.parse_args()

    fc = Flashc(args.lib)
    if not args.backends:
        args.backends = ("sdpa-flash,sdpa-cudnn,flashc-det,flashc" if "bwd" in args.mode
                         else "sdpa-flash,sdpa-cudnn,flashc-sm80,flashc-sm90,flashc")
    if args.mode == "decode":
        return bench_decode(args, fc)
    if args.mode != "fwd":
        return bench_bwd(args, fc)
    rows, table = [], []
    torch.manual_seed(0)
    for dn, dt, d, s, causal, h, b in sweep(args):
        hk = kv_heads(args, h)
        q, k, v, out, lse, (qt, kt, vt), gqa = fwd_operands(b, s, h, hk, d, dt)
        nbytes = 2 * (q.numel() + k.numel()) * q.element_size()
        fl = flops(b, h, s, s, d, causal)

        def flashc(family):
            def run():
                fc.fwd(q, k, v, out, lse, causal, family)
            return run

        def sdpa(backend):
            def run():
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal), **gqa)
            return run

        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):  # the reference of max_err
            ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal), **gqa)
        ref = ref.transpose(1, 2).float()
        results = []
        backends = (("sdpa-flash", sdpa(SDPBackend.FLASH_ATTENTION)),
                    ("sdpa-cudnn", sdpa(SDPBackend.CUDNN_ATTENTION)),
                    ("flashc-sm80", flashc("sm80")),
                    ("flashc-sm90", flashc("sm90")),
                    ("flashc", flashc("auto")))
        for name, fn in (b for b in backends if b[0] in args.backends.split(",")):
            try:
                fn()
                torch.cuda.synchronize()
                err = ""
                if name.startswith("flashc"):
                    err = "%.3g" % (out.float() - ref).abs().max().item()
                ms = time_ms(fn, args.reps)
                results.append((name, ms, err))
            except Exception as e:  # a backend that cannot run this shape
                print("  %s d%d s%d causal%d: %s" % (name, d, s, causal, str(e)[:200]),
                      file=sys.stderr)
                results.append((name, float("nan"), ""))
        for name, ms, err in results:
            tf = fl / (ms * 1e-3) / 1e12
            gb = nbytes / (ms * 1e-3) / 1e9
            rows.append("%s,%s,%s,%d,%d,%d,%d,%d,%d,%d,%.4f,%.1f,%.1f,%s" %
                        (name, args.mode, dn, b, s, s, h, hk, d, causal, ms, tf, gb, err))
        base = {n: float("nan") for n, _ in backends}
        base.update({n: m for n, m, _ in results})
        line = ("%s d%-3d s%-5d b%-2d h%d/%-3d %-6s flashc %6.1f  flashc-sm80 %6.1f  flashc-sm90 %6.1f  "
                "sdpa-flash %6.1f  sdpa-cudnn %6.1f TFLOP/s  (flashc/FA2 %.2fx, /cuDNN %.2fx) err %s" %
                (dn, d, s, b, h, hk, "causal" if causal else "", fl / base["flashc"] / 1e9,
                 fl / base["flashc-sm80"] / 1e9, fl / base["flashc-sm90"] / 1e9,
                 fl / base["sdpa-flash"] / 1e9,
                 fl / base["sdpa-cudnn"] / 1e9, base["sdpa-flash"] / base["flashc"],
                 base["sdpa-cudnn"] / base["flashc"], results[-1][2]))
        print(line, flush=True)
        table.append(line)
        del q, k, v, out, lse, qt, kt, vt, ref
    write_csv(args.csv, rows)
    print("\n== flashc vs SDPA, %s (TFLOP/s) ==" % args.mode)
    print("\n".join(table))


def bench_bwd(args, fc):
    """--mode bwd / fwdbwd: the loop of main() with gradients."""
    rows, table = [], []
    torch.manual_seed(0)
    names = ["sdpa-flash", "sdpa-cudnn", "flashc-det", "flashc", "flashc-sm90-det", "flashc-sm90"]
    env_ws = os.environ.get("FLASHC_CUDA_BWD_WS")

    def set_ws(name):
        """FLASHC_CUDA_BWD_WS (read by bwd.cu at every call): 0 for the flashc-sm90
        backends, the caller's value for the others."""
        if name.startswith("flashc-sm90"):
            os.environ["FLASHC_CUDA_BWD_WS"] = "0"
        elif env_ws is None:
            os.environ.pop("FLASHC_CUDA_BWD_WS", None)
        else:
            os.environ["FLASHC_CUDA_BWD_WS"] = env_ws
    for dn, dt, d, s, causal, h, b in sweep(args):
        hk = kv_heads(args, h)
        q, k, v, out, lse, _, gqa = fwd_operands(b, s, h, hk, d, dt)
        dout = torch.randn_like(q)
        dq, dk, dv = (torch.empty_like(x) for x in (q, k, v))
        fl = flops(b, h, s, s, d, causal, args.mode)
        # q o do read, dq written, k v read, dk dv written
        nbytes = 4 * (q.numel() + k.numel()) * q.element_size()
        qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
        dot = dout.transpose(1, 2)

        def sdpa(backend):
            def graph():
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal),
                                                          **gqa)
            if args.mode == "fwdbwd":
                return lambda: torch.autograd.grad(graph(), (qt, kt, vt), dot)
            o = graph()
            return lambda: torch.autograd.grad(o, (qt, kt, vt), dot, retain_graph=True)

        def flashc(det):
            call = fc.bwd_call(dout, q, k, v, out, lse, dq, dk, dv, causal, det)
            fc.fwd(q, k, v, out, lse, causal)
            if args.mode == "fwdbwd":
                return lambda: (fc.fwd(q, k, v, out, lse, causal), fc.bwd(call))
            return lambda: fc.bwd(call)

        # the reference of max_err: SDPA's flash kernel, or its math one where GQA
        # keeps the flash kernel out
        try:
            ref = sdpa(SDPBackend.FLASH_ATTENTION)()
        except RuntimeError:
            ref = sdpa(SDPBackend.MATH)()
        ref = [g.transpose(1, 2).float() for g in ref]
        results = []
        for name in (n for n in names if n in args.backends.split(",")):
            try:
                set_ws(name)
                if name.startswith("flashc"):
                    fn = flashc(name.endswith("-det"))
                else:
                    fn = sdpa(SDPBackend.FLASH_ATTENTION if name == "sdpa-flash"
                              else SDPBackend.CUDNN_ATTENTION)
                for t in (dq, dk, dv):
                    t.fill_(float("nan"))
                fn()
                torch.cuda.synchronize()
                err = ""
                if name.startswith("flashc"):
                    err = "%.3g" % max((g.float() - r).abs().max().item()
                                       for g, r in zip((dq, dk, dv), ref))
                results.append((name, time_ms(fn, args.reps), err))
            except Exception as e:  # a backend that cannot run this shape
                print("  %s d%d s%d causal%d: %s" % (name, d, s, causal, str(e)[:200]),
                      file=sys.stderr)
                results.append((name, float("nan"), ""))
        for name, ms, err in results:
            rows.append("%s,%s,%s,%d,%d,%d,%d,%d,%d,%d,%.4f,%.1f,%.1f,%s" %
                        (name, args.mode, dn, b, s, s, h, hk, d, causal, ms,
                         fl / (ms * 1e-3) / 1e12, nbytes / (ms * 1e-3) / 1e9, err))
        base = {n: float("nan") for n in names}
        base.update({n: m for n, m, _ in results})
        line = ("%s d%-3d s%-5d %s %-6s flashc %6.1f  flashc-det %6.1f  flashc-sm90 %6.1f  "
                "flashc-sm90-det %6.1f  sdpa-flash %6.1f  sdpa-cudnn %6.1f TFLOP/s  "
                "(flashc/FA2 %.2fx) err %s" %
                (dn, d, s, "h%d/%d b%d" % (h, hk, b), "causal" if causal else "",
                 fl / base["flashc"] / 1e9, fl / base["flashc-det"] / 1e9,
                 fl / base["flashc-sm90"] / 1e9, fl / base["flashc-sm90-det"] / 1e9,
                 fl / base["sdpa-flash"] / 1e9, fl / base["sdpa-cudnn"] / 1e9,
                 base["sdpa-flash"] / base["flashc"],
                 max((e for _, _, e in results if e), key=float, default="")))
        print(line, flush=True)
        table.append(line)
        del q, k, v, dout, out, lse, dq, dk, dv, qt, kt, vt, ref
        torch.cuda.empty_cache()
    write_csv(args.csv, rows)
    print("\n== flashc vs SDPA, %s (TFLOP/s) ==" % args.mode)
    print("\n".join(table))


def paged_copy(x, page, perm):
    """x [B, S, Hk, D] scattered into pages [num_pages, page, Hk, D] in the order of
    perm (a permutation of the pages); returns the pages and block_table [B, S / page]."""
    b, s, hk, d = x.shape
    per = (s + page - 1) // page
    bt = perm[: b * per].view(b, per).to(torch.int32).contiguous()
    pages = torch.empty(perm.numel(), page, hk, d, device=x.device, dtype=x.dtype)
    j = torch.arange(s, device=x.device)
    rows = (bt.long()[:, j // page] * page + j % page).reshape(-1)  # [B * S] rows of the pool
    pages.view(-1, hk, d)[rows] = x.reshape(-1, hk, d)
    return pages, bt


def bench_decode(args, fc):
    dn = args.dtypes.split(",")[0]
    dt, d = DTYPES[dn], 128
    rows, table = [], []
    torch.manual_seed(0)

    # the ceiling: a device-to-device copy, bytes read + written
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_ms = time_ms(lambda: dst.copy_(src), args.reps)
    copy_gbps = 2 * src.numel() / (copy_ms * 1e-3) / 1e9
    rows.append("torch-copy,copy,u8,0,0,0,0,0,0,0,%.4f,0.0,%.1f," % (copy_ms, copy_gbps))
    table.append("device copy (1 GiB read + 1 GiB written): %.3f ms, %.1f GB/s" % (copy_ms, copy_gbps))
    del src, dst

    for shape in args.decode_shapes.split(","):
        b, h, hk, s = map(int, shape.lower().split("x"))
        ql = args.q_len
        q = torch.randn(b, ql, h, d, device="cuda", dtype=dt)
        k, v = (torch.randn(b, s, hk, d, device="cuda", dtype=dt) for _ in range(2))
        out = torch.empty_like(q)
        lse = torch.empty(b, h, ql, device="cuda", dtype=torch.float32)
        seqlens = torch.full((b,), s, device="cuda", dtype=torch.int32)
        kv_bytes = 2 * k.numel() * k.element_size()
        fl = flops(b, h, ql, s, d, False)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        gqa = {"enable_gqa": True} if h != hk else {}

        def sdpa(backend):
            def run():
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(qt, kt, vt, **gqa)
            return run

        ref = None
        for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.MATH):  # max_err's reference
            try:
                ref = sdpa(backend)().transpose(1, 2).float()
                break
            except Exception as e:
                print("  reference %s %s: %s" % (backend, shape, str(e)[:200]), file=sys.stderr)
        results = []  # (backend, mode, ms, err)
        for name, backend in (("sdpa-flash", SDPBackend.FLASH_ATTENTION),
                              ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION)):
            if name not in args.backends.split(","):
                continue
            try:
                fn = sdpa(backend)
                fn()
                torch.cuda.synchronize()
                results.append((name, "decode", time_ms(fn, args.reps), ""))
            except Exception as e:  # a backend that cannot run this shape
                print("  %s %s: %s" % (name, shape, str(e)[:200]), file=sys.stderr)
                results.append((name, "decode", float("nan"), ""))
        if "flashc" in args.backends.split(","):
            layouts = [(0, k, v, None)]
            for page in (int(x) for x in args.pages.split(",") if x):
                per = (s + page - 1) // page
                perm = torch.randperm(b * per + 3, device="cuda")
                kp, bt = paged_copy(k, page, perm)
                vp, _ = paged_copy(v, page, perm)
                layouts.append((page, kp, vp, bt))
            for page, kc, vc, bt in layouts:
                mode = "decode-page%d" % page if page else "decode"
                try:
                    call = fc.kvcache_call(q, kc, vc, seqlens, bt, out, lse, args.num_splits)
                    out.fill_(float("nan"))
                    fc.fwd_kvcache(call)
                    torch.cuda.synchronize()
                    err = "%.3g" % (out.float() - ref).abs().max().item() if ref is not None else ""
                    results.append(("flashc", mode, time_ms(lambda: fc.fwd_kvcache(call), args.reps), err))
                except Exception as e:
                    print("  flashc %s %s: %s" % (mode, shape, str(e)[:200]), file=sys.stderr)
                    results.append(("flashc", mode, float("nan"), ""))
            del layouts
        for name, mode, ms, err in results:
            rows.append("%s,%s,%s,%d,%d,%d,%d,%d,%d,0,%.4f,%.2f,%.1f,%s" %
                        (name, mode, dn, b, ql, s, h, hk, d, ms, fl / (ms * 1e-3) / 1e12,
                         kv_bytes / (ms * 1e-3) / 1e9, err))
            gbps = kv_bytes / (ms * 1e-3) / 1e9
            line = ("%s b%-3d h%d:%-3d s%-7d %-10s %-14s %8.3f ms %7.1f GB/s  %5.1f%% of copy  err %s" %
                    (dn, b, h, hk, s, name, mode, ms, gbps, 100.0 * gbps / copy_gbps, err))
            if ql > 1:
                line += "  q%d %.1f TFLOP/s" % (ql, fl / (ms * 1e-3) / 1e12)
            print(line, flush=True)
            table.append(line)
        del q, k, v, out, lse, qt, kt, vt, ref
        torch.cuda.empty_cache()
    write_csv(args.csv, rows)
    print("\n== flashc vs SDPA, decode (GB/s of K and V read) ==")
    print("\n".join(table))


if __name__ == "__main__":
    main()
