#!/usr/bin/env python3
"""kernel_time.py : one forward call per shape, for timing kernels under ncu.

    ncu --profile-from-start off --metrics gpu__time_duration.sum --csv \\
        python3 bench/kernel_time.py --lib build/libflashc.so [--backend cudnn] \\
        --shapes 128,1024,1,16/16,16 --shapes 128,8192,0,64/8,2

Each --shapes is D,S,causal,H/Hk,B (bf16 unless --dtype fp16); S may be Sq:Sk
(a short query over long keys: GQA packing; SDPA's is_causal aligns such a
mask top-left where flashc aligns it bottom-right, so compare cuDNN there
without causal). For each shape
three warm-up calls run, then one call between cudaProfilerStart and
cudaProfilerStop, so ncu with --profile-from-start off sees exactly one kernel
launch per shape (flashc's forward, or SDPA's cuDNN backend with --backend
cudnn), in the order of the shapes.

Why: ncu locks the clocks, so two libraries compare within a percent. The same
comparison through compare.py moves by up to 10% from one call to the next
(bench/NOTES.md, issue 18 runs 32 and 33). compare.py stays the measure of
speed as users see it.
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402  (the Flashc binding, fwd_operands)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=os.environ.get("FLASHC_LIBRARY", "build/libflashc.so"))
    ap.add_argument("--backend", default="flashc", choices=["flashc", "cudnn"])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--shapes", action="append", required=True, help="D,S,causal,H/Hk,B (S: Sq:Sk too)")
    args = ap.parse_args()
    fc = compare.Flashc(args.lib) if args.backend == "flashc" else None
    dt = torch.float16 if args.dtype == "fp16" else torch.bfloat16
    for sh in args.shapes:
        d, s, causal, heads, b = sh.split(",")
        sq, sk = (int(x) for x in s.split(":")) if ":" in s else (int(s), int(s))
        d, causal, b = int(d), int(causal), int(b)
        h, hk = map(int, heads.split("/"))
        q, k, v, out, lse, (qt, kt, vt), gqa = compare.fwd_operands(b, sq, h, hk, d, dt, sk)

        def run():
            if fc:
                fc.fwd(q, k, v, out, lse, causal)
            else:
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal), **gqa)

        for _ in range(3):
            run()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        run()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
