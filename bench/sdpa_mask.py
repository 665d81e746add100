#!/usr/bin/env python3
"""sdpa_mask.py : what flashc.sdpa's reading of an attn_mask costs (sdpa._plan_of, run once per
mask object: HF transformers passes one mask to every layer, a new one every step).

    FLASHC_LIBRARY=/tmp/b/libflashc.so PYTHONPATH=python .venv/bin/python bench/sdpa_mask.py \\
        --seqlen 4096 --device cpu --threads 1

Masks of shape (batch, 1, S, S), as HF transformers passes them: bool causal with left-padded
keys, bool key padding only, and bf16 causal with right-padded keys filled with the dtype's
minimum (HF's additive mask); batch b has 100 * (b + 1) padded keys (with --batch 1, the
calls run on slices of q, k and v; with more, on gathered rows). Prints one CSV row per
mask: the best of --reps calls in milliseconds (on CUDA with a device synchronisation
around each call) and the calls of the plan (or the fallback reason). Heads do not
matter: the mask has one.

With --heads H (and --headdim D), also the whole forward call, bf16 (B, H, S, D) query, key and
value under each mask: torch's own scaled_dot_product_attention with the mask ("torch_ms"),
the same call under flashc.sdpa.route() with the mask seen for the first time ("route_ms":
the reading above plus flashc's calls; a new mask each time) and with the mask seen before
("route_cached_ms": what the other layers of an HF step pay), and the routed call with no
mask and is_causal=True ("route_causal_ms": what the route costs without a mask to read).
"""
import argparse
import time

import torch

from flashc import sdpa


def masks(batch, s, device):
    i, j = torch.arange(s)[:, None], torch.arange(s)
    causal = j <= i
    left = torch.ones(batch, s, dtype=torch.bool)
    right = torch.ones(batch, s, dtype=torch.bool)
    for b in range(batch):
        left[b, :100 * (b + 1)] = False
        right[b, s - 100 * (b + 1):] = False
    fill = torch.finfo(torch.bfloat16).min
    hf = torch.zeros(batch, 1, s, s, dtype=torch.bfloat16).masked_fill(
        ~(causal & right[:, None, :])[:, None], fill)
    return {"bool_causal_leftpad": (causal & left[:, None, :])[:, None].to(device),
            "bool_padding": left[:, None, None, :].expand(batch, 1, s, s).contiguous().to(device),
            "bf16_causal_rightpad_hf": hf.to(device)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch threads, 0: torch's default")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--heads", type=int, default=0, help="also time the whole call, H heads")
    ap.add_argument("--headdim", type=int, default=128)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
    def best_ms(fn, fresh=None):
        """The best of a.reps calls of fn(arg) in ms, arg = fresh() made before each call."""
        best = float("inf")
        for _ in range(a.reps):
            arg = fresh() if fresh else None
            sync()
            t = time.perf_counter()
            fn(arg)
            sync()
            best = min(best, time.perf_counter() - t)
        return 1e3 * best

    print("mask,batch,seqlen,ms,plan" + (",heads,headdim,torch_ms,route_ms,route_cached_ms,"
                                         "route_causal_ms"
                                         if a.heads else ""))
    for name, m in masks(a.batch, a.seqlen, a.device).items():
        plan = sdpa._plan_of(m, a.batch, a.seqlen, a.seqlen)
        ms = best_ms(lambda _: sdpa._plan_of(m, a.batch, a.seqlen, a.seqlen))
        what = plan if isinstance(plan, str) else " ".join(
            "causal=%d:max_q=%d:max_k=%d" % (c.causal, c.max_q, c.max_k) for c in plan)
        row = "%s,%d,%d,%.1f,%s" % (name, a.batch, a.seqlen, ms, what)
        if a.heads:
            q, k, v = torch.randn(3, a.batch, a.heads, a.seqlen, a.headdim, dtype=torch.bfloat16,
                                  device=a.device).unbind(0)
            sdpa_fn = torch.nn.functional.scaled_dot_product_attention

            def routed(mask):
                with sdpa.route() as r:
                    sdpa_fn(q, k, v, attn_mask=mask, is_causal=mask is None)
                assert r.routed == 1, r.fallbacks

            routed(m)  # warm-up: flashc's first call on this device
            times = [best_ms(lambda _: sdpa_fn(q, k, v, attn_mask=m)),
                     best_ms(routed, m.clone), best_ms(lambda _: routed(m)),
                     best_ms(routed)]
            row += ",%d,%d,%s" % (a.heads, a.headdim, ",".join("%.2f" % x for x in times))
        print(row)


if __name__ == "__main__":
    main()
