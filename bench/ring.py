#!/usr/bin/env python3
"""ring.py : scaling of flashc.parallel's ring attention against one device, under torchrun.

    torchrun --nproc_per_node=8 bench/ring.py --seqlen-per-rank 4096,16384 --causal 0,1 \\
        --csv bench/results/ring-8.csv                               (GPUs: NCCL)
    FLASHC_LIBRARY=/tmp/b/libflashc.so PYTHONPATH=python FLASHC_NUM_THREADS=1 \\
        .venv/bin/torchrun --nproc_per_node=2 bench/ring.py --seqlen-per-rank 256 --reps 3
                                                                     (CPU: gloo)

Each rank holds --seqlen-per-rank rows of a sequence W times as long (W = the world
size) in the zigzag layout and runs ring_flash_attn_func (forward, or forward and
backward with --mode fwdbwd), K, V passed round the ring or all-gathered (--kv-comm). The baseline is the same call on one device at the same
per-device sequence length: flash_attn_func on (batch, seqlen_per_rank, ...), which
does 1/W of a rank's ring work (a rank meets W key blocks). So

    efficiency = W * t_one / t_ring

is 1 when the ring costs only its compute (communication hidden under compute, no
overhead per hop); targets: >= 0.90 at W = 2, >= 0.85 at W = 8 (bench/NOTES.md). t_ring is
the slowest rank's time of a call (all-reduce MAX), t_one the slowest rank's time of
its own single-device call, both medians of --reps after one warm-up, run alternately
(ring, one, ring, ...) so that a passing load hits both. A barrier precedes each timed
call. CUDA: torch.cuda.synchronize around each call (host time; the ring's own
waits are inside it). Before timing, each shape is checked once: the ring's out
(gathered) against flash_attn_func on the whole sequence on rank 0, max |diff| in the
CSV. CSV columns: COLUMNS below; tflops_per_rank counts the whole sequence's FLOPs
(bench/compare.py's flops) divided by W and by t_ring.
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare import flops  # noqa: E402  flash-attention's FLOP count, once

import flashc  # noqa: E402
from flashc import parallel  # noqa: E402

COLUMNS = ["backend", "world", "kv_comm", "mode", "dtype", "batch", "heads", "kv_heads", "headdim",
           "seqlen_per_rank", "seqlen", "causal", "ring_ms", "one_ms", "efficiency",
           "tflops_per_rank", "max_diff"]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def parse_list(text):
    return [int(x) for x in text.split(",") if x]


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device):
    """Seconds of fn() on this rank, after a barrier; the slowest rank's."""
    dist.barrier()
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def _call(attn, inputs, dout, mode, **opts):
    """One call (forward, or forward and backward of one graph) of attn."""
    def run():
        leaves = [t.detach().requires_grad_(mode == "fwdbwd") for t in inputs]
        out = attn(*leaves, **opts)
        if mode == "fwdbwd":
            out.backward(dout)
    return run


def bench_shape(args, device, s_rank, causal, kv_comm):
    world = dist.get_world_size()
    dt = DTYPES[args.dtype]
    s = s_rank * world
    g = torch.Generator().manual_seed(s + causal)

    def rand(*shape):
        return (torch.rand(*shape, generator=g) * 2 - 1).to(device=device, dtype=dt)
    whole = [rand(args.batch, s, h, args.headdim)
             for h in (args.heads, args.kv_heads, args.kv_heads, args.heads)]
    local = [parallel.shard(t) for t in whole]
    opts = dict(causal=bool(causal))
    out = parallel.ring_flash_attn_func(*local[:3], kv_comm=kv_comm, **opts)
    gathered = parallel.unshard(out)
    diff = torch.zeros(1, dtype=torch.float64)
    if dist.get_rank() == 0:
        ref = flashc.flash_attn_func(*whole[:3], **opts)
        diff[0] = (gathered.double() - ref.double()).abs().max().item()
    dist.broadcast(diff, 0)
    del whole
    ring = _call(parallel.ring_flash_attn_func, local[:3], local[3], args.mode, kv_comm=kv_comm,
                 **opts)
    one = _call(flashc.flash_attn_func, local[:3], local[3], args.mode, **opts)
    ring()
    one()  # warm-up
    t_ring, t_one = [], []
    for _ in range(args.reps):
        t_ring.append(_timed(ring, device))
        t_one.append(_timed(one, device))
    ms_ring, ms_one = 1e3 * statistics.median(t_ring), 1e3 * statistics.median(t_one)
    f = flops(args.batch, args.heads, s, s, args.headdim, causal, args.mode)
    return [dist.get_backend(), world, kv_comm, args.mode, args.dtype, args.batch, args.heads,
            args.kv_heads, args.headdim, s_rank, s, causal, "%.3f" % ms_ring, "%.3f" % ms_one,
            "%.3f" % (world * ms_one / ms_ring), "%.3f" % (f / world / (ms_ring * 1e-3) / 1e12),
            "%.3g" % diff.item()]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seqlen-per-rank", type=parse_list, default=[4096, 16384])
    p.add_argument("--causal", type=parse_list, default=[0, 1])
    p.add_argument("--kv-comm", type=lambda t: t.split(","), default=["ring"],
                   help="ring, allgather or both (ring_flash_attn_func's kv_comm)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=16)
    p.add_argument("--headdim", type=int, default=128)
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                   help="default bf16 on CUDA, fp32 on CPU")
    p.add_argument("--mode", choices=["fwd", "fwdbwd"], default="fwdbwd")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--csv", help="append the rows to this file (rank 0)")
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    args.dtype = args.dtype or ("bf16" if cuda else "fp32")
    dist.init_process_group("nccl" if cuda else "gloo")
    rows = [bench_shape(args, device, s, c, m) for s in args.seqlen_per_rank for c in args.causal
            for m in args.kv_comm]
    if dist.get_rank() == 0:
        lines = [",".join(map(str, r)) for r in rows]
        print(",".join(COLUMNS))
        print("\n".join(lines))
        if args.csv:
            new = not os.path.exists(args.csv)
            with open(args.csv, "a") as f:
                f.write((",".join(COLUMNS) + "\n" if new else "") + "\n".join(lines) + "\n")
    dist.barrier()  # no rank tears the group down while another still works (gloo aborts)
    dist.destroy_process_group()
    # Leave without the interpreter's teardown: with torch 2.15's gloo a rank sometimes
    # aborts there ("terminate called without an active exception", a C++ thread still
    # joinable at exit; 2 runs in 25 on 2 CPU cores), after every result is written.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
