"""test_parallel.py : flashc.parallel (ring attention) with 2 and 4 gloo processes on CPU.

Each world size is one spawn of W processes (torch.multiprocessing, a rendezvous file, a
deadline after which the processes are killed and the test fails instead of hanging).
In them, every case shards a whole sequence (zigzag or contiguous), runs the ring
forward and backward, gathers out, lse, dq, dk, dv, and rank 0 checks each with
DEVELOPERS.md's rule twice: against the float64 reference with the same-precision naive
baseline, and against the float64 reference with single-process flashc on the whole
sequence as the baseline (the ring's error at most twice flashc's plus one rounding).
The sweep: causal or not x zigzag or not x MHA/GQA x window or not x softcap or not x
batched/varlen x fp32/bf16 at W = 2 (K, V round the ring), 16 cases at W = 4 with each
option both ways (half of them kv_comm="allgather"), and v's head dim differing from q's. The plan (which calls a hop makes) and the refusals are checked in
this process; bench/ring.py runs once under torchrun with 2 gloo processes.
"""
import json
import os
import time

import pytest
import torch

import flashc
from flashc import parallel
from test_flashc import check, rand, ref_attention

DEADLINE_S = 120  # per spawn; a hang fails here instead of blocking CI


def _cases(world):
    """(name, options) of the sweep at `world` ranks."""
    cases = []
    for dtype in ("fp32", "bf16"):
        for varlen in (False, True):
            for causal in (False, True):
                for zigzag in (False, True):
                    for gqa in (False, True):
                        for window in (False, True):
                            for softcap in (False, True):
                                if world > 2 and (gqa != softcap or window == varlen or
                                                  zigzag == (causal != gqa)):
                                    continue  # W = 4: each option both ways, 16 cases
                                # kv_comm None: the ring; at W = 4 half the cases all-gather
                                comm = "allgather" if world > 2 and varlen == causal else None
                                cases.append(dict(dtype=dtype, varlen=varlen, causal=causal,
                                                  zigzag=zigzag, gqa=gqa, window=window,
                                                  softcap=softcap, dv=None, kv_comm=comm))
    cases.append(dict(dtype="fp32", varlen=False, causal=True, zigzag=True, gqa=True,
                      window=True, softcap=False, dv=24, kv_comm=None))
    cases.append(dict(dtype="bf16", varlen=True, causal=False, zigzag=True, gqa=False,
                      window=False, softcap=True, dv=8, kv_comm=None))
    return [("-".join(k if v is True else "%s%s" % (k, v) for k, v in c.items()
                      if v not in (False, None)), c) for c in cases]


DT = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _run_case(c, world, seed):
    """The case on this rank: (gathered ring results, whole-sequence inputs and options)."""
    dt = DT[c["dtype"]]
    h, hk, d = 4, 2 if c["gqa"] else 4, 16
    dv = c["dv"] or d
    zz = c["zigzag"]
    parts = 2 * world if zz else world
    # window sides that cut through chunks: some pairs partly visible, some hops skipped
    chunk = 3
    opts = dict(causal=c["causal"], softcap=6.0 if c["softcap"] else 0.0, softmax_scale=0.4,
                window_size=(2 * chunk + 1, chunk - 1) if c["window"] else (-1, -1))
    ring_opts = dict(zigzag=zz, kv_comm=c["kv_comm"] or "ring", return_attn_probs=True, **opts)
    if c["varlen"]:
        lens = [parts * n for n in (3, 1, 2)]  # three sequences, a multiple of the chunks
        total = sum(lens)
        q, k, v, dout = (rand(total, hh, dd, dtype=dt, seed=seed + i) * 3
                         for i, (hh, dd) in enumerate(((h, d), (hk, d), (hk, dv), (h, dv))))
        cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
        local = [parallel.shard_varlen(t, cu, zigzag=zz)[0] for t in (q, k, v, dout)]
        cu_local = parallel.shard_varlen(q, cu, zigzag=zz)[1]
        leaves = [t.clone().requires_grad_() for t in local[:3]]
        out, lse, _ = parallel.ring_flash_attn_varlen_func(*leaves, cu_local, **ring_opts)
        out.backward(local[3])

        def gather(t, dim=0):
            if dim:  # lse (H, total): rows along dim 1
                return parallel.unshard_varlen(t.t().contiguous(), cu_local, zigzag=zz).t()
            return parallel.unshard_varlen(t, cu_local, zigzag=zz)
        got = dict(out=gather(out), lse=gather(lse, 1), dq=gather(leaves[0].grad),
                   dk=gather(leaves[1].grad), dv=gather(leaves[2].grad))
        return got, (q, k, v, dout), opts, lens
    s = parts * chunk * 2
    q, k, v, dout = (rand(2, s, hh, dd, dtype=dt, seed=seed + i) * 3
                     for i, (hh, dd) in enumerate(((h, d), (hk, d), (hk, dv), (h, dv))))
    local = [parallel.shard(t, zigzag=zz) for t in (q, k, v, dout)]
    leaves = [t.clone().requires_grad_() for t in local[:3]]
    out, lse, _ = parallel.ring_flash_attn_func(*leaves, **ring_opts)
    out.backward(local[3])
    got = dict(out=parallel.unshard(out, zigzag=zz), lse=parallel.unshard(lse, zigzag=zz, dim=2),
               dq=parallel.unshard(leaves[0].grad, zigzag=zz),
               dk=parallel.unshard(leaves[1].grad, zigzag=zz),
               dv=parallel.unshard(leaves[2].grad, zigzag=zz))
    return got, (q, k, v, dout), opts, None


def _whole(fn, inputs, lens, **opts):
    """out, lse, dq, dk, dv of fn (flashc or the reference) on the whole sequences."""
    q, k, v, dout = inputs
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    if lens is None:
        out, lse = fn(*leaves, **opts)
    else:
        outs, lses, o = [], [], 0
        for n in lens:
            ob, lb = fn(*(t[o:o + n][None] for t in leaves), **opts)
            outs.append(ob[0])
            lses.append(lb[0])
            o += n
        out, lse = torch.cat(outs), torch.cat(lses, dim=-1)
    out.backward(dout.to(out.dtype))
    return dict(out=out.detach(), lse=lse.detach(), dq=leaves[0].grad, dk=leaves[1].grad,
                dv=leaves[2].grad)


def _flashc(q, k, v, **opts):
    out, lse, _ = flashc.flash_attn_func(q, k, v, return_attn_probs=True, **opts)
    return out, lse


def _check_case(c, got, inputs, opts, lens):
    dt = DT[c["dtype"]]
    q, k, v, dout = inputs
    r64 = _whole(lambda *a, **o: ref_attention(*a, **o), [t.double() for t in inputs], lens,
                 **opts)
    low = _whole(lambda *a, **o: ref_attention(*a, lowp=True, **o), inputs, lens, **opts)
    one = _whole(_flashc, inputs, lens, **opts)
    for name in ("out", "lse", "dq", "dk", "dv"):
        # lse is fp32 in every dtype: its slack is fp32's, as in test_flashc
        tol_dt = torch.float32 if name == "lse" else dt
        check(name + " vs naive", got[name], r64[name], low[name], tol_dt)
        check(name + " vs flashc", got[name], r64[name], one[name], tol_dt)


def _worker(rank, world, result_dir):
    import torch.distributed as dist
    torch.set_num_threads(1)
    # rendezvous through a file: no port to pick (and lose to another process meanwhile);
    # gloo's own connections take ports the system assigns
    dist.init_process_group("gloo", init_method="file://" + os.path.join(result_dir, "rdzv"),
                            rank=rank, world_size=world)
    failures, count = {}, 0
    for i, (name, c) in enumerate(_cases(world)):
        try:
            got, inputs, opts, lens = _run_case(c, world, seed=1000 * world + 10 * i)
            if rank == 0:
                _check_case(c, got, inputs, opts, lens)
            count += 1
        except Exception as e:  # reported by the test, which names the case
            failures[name] = "%s: %s" % (type(e).__name__, e)
            if not isinstance(e, AssertionError):
                break  # a collective may be out of step now: stop here
    with open(os.path.join(result_dir, "rank%d.json" % rank), "w") as f:
        json.dump(dict(count=count, failures=failures), f)
    # every rank past its last message before any closes its connections: a process group
    # torn down while a peer still works on its own can abort that peer in gloo
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)  # no interpreter teardown, where gloo sometimes aborts (bench/ring.py)


def _spawn(world, tmp_path):
    import torch.multiprocessing as mp
    ctx = mp.start_processes(_worker, args=(world, str(tmp_path)), nprocs=world, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + DEADLINE_S
    try:
        while not ctx.join(timeout=max(1.0, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                pytest.fail("ring attention with %d gloo processes did not finish in %d s"
                            % (world, DEADLINE_S))
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    results = [json.load(open(tmp_path / ("rank%d.json" % r))) for r in range(world)]
    failures = {k: v for r in results for k, v in r["failures"].items()}
    assert not failures, "\n".join("%s: %s" % kv for kv in failures.items())
    assert results[0]["count"] == len(_cases(world))


@pytest.mark.parametrize("world", [2, 4])
def test_ring_gloo(world, tmp_path):
    """Forward and gradients of every case, gathered, against the whole sequence."""
    _spawn(world, tmp_path)


# ---- in this process ----
# Single-process flashc itself (one call on each whole sequence: W = 1 without zigzag is
# that call) misses the rule's naive bound for dk on these inputs (bf16, sequences of
# 3, 1 and 2 rows, scores up to ~60): error 0.0645 > bound 0.0631 (naive 0.0236). strict:
# when flashc's backward meets the bound, these pass and the marks must go.
_FLASHC_OWN_MISS = {"dtypebf16-varlen", "dtypebf16-varlen-window"}


@pytest.mark.parametrize("case", [
    pytest.param(c, marks=pytest.mark.xfail(strict=True, reason="flashc's own dk, not the ring's"))
    if c[0] in _FLASHC_OWN_MISS else c for c in _cases(2)], ids=[name for name, _ in _cases(2)])
def test_world_of_one(case):
    """Without torch.distributed initialised the ring is one rank (one hop, no message):
    every case of the sweep, zigzag's two chunks included, on the whole sequence."""
    name, c = case
    got, inputs, opts, lens = _run_case(c, 1, seed=7)
    _check_case(c, got, inputs, opts, lens)



def _calls(world, rank, lens, left, right, zigzag):
    """The pieces of each hop of `rank`."""
    q_segs = parallel._segments(lens, world, rank, zigzag)
    return [[p for seq in parallel._hop_pieces(
        q_segs, parallel._segments(lens, world, (rank - hop) % world, zigzag), left, right,
        hop == 0) for p in seq] for hop in range(world)]


def _mask_of(world, lens, left, right, zigzag):
    """Which (global query, global key) pairs the plans of all ranks compute, per sequence."""
    masks = [torch.zeros(n * world, n * world, dtype=torch.int64) for n in lens]
    for rank in range(world):
        pos_q = _positions(world, rank, lens, zigzag)
        for hop, pieces in enumerate(_calls(world, rank, lens, left, right, zigzag)):
            pos_k = _positions(world, (rank - hop) % world, lens, zigzag)
            for p in pieces:
                for i in range(p.nq):
                    for j in range(p.nk):
                        off = p.nk - p.nq
                        if (p.left < 0 or j >= i + off - p.left) and \
                                (p.right < 0 or j <= i + off + p.right):
                            (sq, a), (sk, b) = pos_q[p.q0 + i], pos_k[p.k0 + j]
                            assert sq == sk
                            masks[sq][a, b] += 1
    return masks


def _positions(world, rank, lens, zigzag):
    """(sequence, global position) of each local row of `rank`."""
    return [(s.seq, s.pos + i) for s in parallel._segments(lens, world, rank, zigzag)
            for i in range(s.n)]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("zigzag", [False, True])
@pytest.mark.parametrize("left,right", [(-1, -1), (-1, 0), (5, 0), (0, 0), (3, 7), (-1, 2),
                                        (9, -1), (1, 1)])
def test_plan_covers_the_mask(world, zigzag, left, right):
    """Over all ranks and hops the pieces compute each visible (query, key) pair of the
    whole sequence exactly once and no other: the trimmed windows are the global mask."""
    lens = [6, 2, 4]
    for seq, m in enumerate(_mask_of(world, lens, left, right, zigzag)):
        i = torch.arange(m.shape[0]).view(-1, 1)
        j = torch.arange(m.shape[1]).view(1, -1)
        want = torch.ones_like(m, dtype=torch.bool)
        if left >= 0:
            want &= j >= i - left
        if right >= 0:
            want &= j <= i + right
        assert torch.equal(m, want.long()), (seq, m)


def test_plan_calls():
    """A causal zigzag hop is one call (the diagonal one causal, the others full); a
    non-causal hop is one call; a sliding window skips the hops it does not reach."""
    for rank in range(4):
        causal = _calls(4, rank, [8], -1, 0, True)
        assert [len(h) for h in causal] == [1, 1, 1, 1]
        assert causal[0][0].right == 0 and all(h[0].left == h[0].right == -1 for h in causal[1:])
        assert [len(h) for h in _calls(4, rank, [8], -1, -1, True)] == [1, 1, 1, 1]
    # window 3 on chunks of 4 (W = 4, zigzag, 8 rows a rank): rank 0 holds chunks 0 and 7,
    # which reach only ranks 0 (itself) and 1 (chunks 1 and 6)
    window = _calls(4, 0, [8], 3, 0, True)
    assert [len(h) for h in window] == [2, 0, 0, 1]
    assert sum(len(h) for r in range(4) for h in _calls(4, r, [8], 3, 0, False)) == 4 + 3


@pytest.mark.parametrize("kwargs,status,message", [
    (dict(dropout_p=0.1), 2, "dropout_p=0.1"),
    (dict(alibi_slopes=torch.ones(4)), 2, "alibi_slopes"),
    (dict(learnable_sink=torch.ones(4)), 2, "learnable_sink"),
])
def test_refused(kwargs, status, message):
    """What ring attention does not do is refused before any communication."""
    q = rand(1, 8, 4, 16)
    for fn, args in ((parallel.ring_flash_attn_func, (q, q, q)),
                     (parallel.ring_flash_attn_varlen_func,
                      (q[0], q[0], q[0], torch.tensor([0, 8], dtype=torch.int32)))):
        with pytest.raises(flashc.FlashcError) as e:
            fn(*args, **kwargs)
        assert e.value.status == status and message in str(e.value)


def test_bad_input():
    q = rand(1, 8, 4, 16)
    cases = [
        (lambda: parallel.ring_flash_attn_func(q, q[:, :6], q[:, :6]), "self-attention"),
        (lambda: parallel.ring_flash_attn_func(q[:, :7], q[:, :7], q[:, :7]),
         "q.shape[1]=7 but must be a multiple of 2"),
        (lambda: parallel.ring_flash_attn_func(q[0], q[0], q[0]), "q.dim()=3"),
        (lambda: parallel.ring_flash_attn_func(q, q, q, kv_comm="alltoall"),
         "kv_comm='alltoall' but must be one of ring, allgather"),
        (lambda: parallel.ring_flash_attn_varlen_func(q[0], q[0], q[0],
                                                      torch.tensor([0, 8])), "int32"),
        (lambda: parallel.ring_flash_attn_varlen_func(
            q[0], q[0], q[0], torch.tensor([0, 5, 7], dtype=torch.int32)), "rise from 0"),
        (lambda: parallel.ring_flash_attn_varlen_func(
            q[0], q[0], q[0], torch.tensor([0, 3, 8], dtype=torch.int32)),
         "sequence 0=3 but must be a multiple of 2"),
    ]
    for fn, message in cases:
        with pytest.raises(flashc.FlashcArgumentError) as e:
            fn()
        assert message in str(e.value), str(e.value)


def test_bench_ring_torchrun():
    """bench/ring.py runs under torchrun with 2 gloo processes: a CSV row per shape whose
    ring out matches the whole-sequence call."""
    import subprocess
    import sys
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir)
    env = dict(os.environ, FLASHC_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in (os.path.join(root, "python"),
                                                      os.environ.get("PYTHONPATH")) if p))
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc_per_node=2", os.path.join(root, "bench", "ring.py"),
                          "--seqlen-per-rank", "32", "--causal", "0,1", "--heads", "2",
                          "--kv-heads", "1", "--headdim", "16", "--reps", "1",
                          "--kv-comm", "ring,allgather"],
                         capture_output=True, text=True, env=env, timeout=DEADLINE_S)
    assert run.returncode == 0, run.stderr[:3000]  # the ranks' own messages come first
    lines = [l for l in run.stdout.splitlines() if l.startswith(("backend,", "gloo,"))]
    header, rows = lines[0].split(","), [dict(zip(lines[0].split(","), l.split(",")))
                                         for l in lines[1:]]
    assert header[-1] == "max_diff"
    assert [(r["causal"], r["kv_comm"]) for r in rows] == [("0", "ring"), ("0", "allgather"),
                                                           ("1", "ring"), ("1", "allgather")]
    for r in rows:
        assert r["world"] == "2" and r["seqlen"] == "64" and float(r["max_diff"]) < 1e-5
        assert float(r["efficiency"]) > 0
