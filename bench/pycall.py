#!/usr/bin/env python3
"""pycall.py : the time of one small attention call through flashc's Python API against
torch SDPA, on CPU tensors, in one process (issue 22: "single-query decode call <= torch
SDPA's time").

    FLASHC_LIBRARY=build/libflashc.so PYTHONPATH=python .venv/bin/python bench/pycall.py

Three callers on the same inputs, one query token, no autograd (no input requires grad):
  kvcache  flashc.flash_attn_with_kvcache(q, k_cache, v_cache) (B, S, H, D), no append
  func     flashc.flash_attn_func(q, k, v) with seqlen_q 1
  sdpa     torch.nn.functional.scaled_dot_product_attention on (B, H, S, D) copies
           (enable_gqa when H != KV heads), as a caller writes it (no sdpa_kernel
           context: torch picks its kernel)
Each figure is the median over --blocks blocks of --calls calls (auto: a block lasts
about 10 ms), the three callers taking turns block by block, so that a load that comes
and goes hits each. Threads: torch.set_num_threads and flashc_set_num_threads, both
set to the same count; OMP_WAIT_POLICY=PASSIVE as bench/cpu_torch.py sets it.
Prints one row per (dtype, threads, shape): microseconds a call, and sdpa / flashc.
With --device cuda the tensors are on the GPU and a block ends with a device
synchronisation: a call's figure is the larger of its host time (Python, the launches) and
its GPU time, as an eager decode loop sees it (--threads sets only the host's threads).
"""
import argparse
import os
import statistics
import time


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--shapes", default="1/1/16,32/8/4096",
                   help="heads/kv_heads/keys, comma list")
    p.add_argument("--headdim", type=int, default=128)
    p.add_argument("--blocks", type=int, default=9)
    p.add_argument("--calls", type=int, default=0, help="calls a block; 0: about 10 ms")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    args = p.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # read when torch loads
    import torch
    import torch.nn.functional as F

    import flashc
    from flashc import _lib

    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    print("%5s %3s %10s %10s %10s %10s %9s %9s" % ("dtype", "thr", "H/KV/Sk", "kvcache_us",
                                                  "func_us", "sdpa_us", "sdpa/kvc", "sdpa/func"))
    for dtype in args.dtypes.split(","):
        for threads in (int(t) for t in args.threads.split(",")):
            torch.set_num_threads(threads)
            _lib.lib.flashc_set_num_threads(threads)
            for shape in args.shapes.split(","):
                h, hk, sk = (int(x) for x in shape.split("/"))
                g = torch.Generator().manual_seed(h * 10007 + hk * 101 + sk)
                q, k, v = (torch.randn(1, s, n, args.headdim, generator=g).to(
                    device=args.device, dtype=dtypes[dtype])
                    for s, n in ((1, h), (sk, hk), (sk, hk)))
                qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
                callers = (lambda: flashc.flash_attn_with_kvcache(q, k, v),
                           lambda: flashc.flash_attn_func(q, k, v),
                           lambda: F.scaled_dot_product_attention(qt, kt, vt,
                                                                  enable_gqa=h != hk))
                want = callers[2]().transpose(1, 2).float()
                for fn in callers[:2]:  # the same attention, to the dtype's rounding
                    torch.testing.assert_close(fn().float(), want, rtol=2e-2, atol=2e-2)
                sync = torch.cuda.synchronize if q.is_cuda else (lambda: None)
                calls = args.calls
                if not calls:
                    sync()
                    t0 = time.perf_counter()
                    for fn in callers:
                        fn()
                    sync()
                    calls = max(1, min(5000, int(0.01 * 3 / (time.perf_counter() - t0))))
                samples = [[], [], []]
                for block in range(args.blocks + 1):
                    for i, fn in enumerate(callers):
                        sync()
                        t0 = time.perf_counter()
                        for _ in range(calls):
                            fn()
                        sync()
                        if block:  # the first round warms up
                            samples[i].append((time.perf_counter() - t0) / calls * 1e6)
                kv, fa, sd = (statistics.median(s) for s in samples)
                print("%5s %3d %10s %10.2f %10.2f %10.2f %9.2f %9.2f" % (
                    dtype, threads, shape, kv, fa, sd, sd / kv, sd / fa), flush=True)


if __name__ == "__main__":
    main()
