"""flashc.parallel : context parallelism (ring attention) on torch.distributed.

A sequence too long for one device is sharded along its token axis over the ranks of a
process group; each rank keeps its queries and passes its keys and values around the
ring, so that after world_size hops every query has met every key (Liu et al., "Ring
Attention with Blockwise Transformers", 2023). Each hop is one or a few ordinary flashc
calls on local tensors; their partial outputs are merged with the log-sum-exp rule

    lse = logaddexp(lse_a, lse_b),  out = out_a e^(lse_a - lse) + out_b e^(lse_b - lse)

into an fp32 accumulator, rounded to the input dtype once at the end. The transport is
torch.distributed (NCCL for CUDA tensors, gloo for CPU tensors): batch_isend_irecv puts
the next hop's K and V in flight before the current hop computes. kv_comm="allgather"
gathers every rank's K, V in one collective instead (short sequences).

    import flashc.parallel as cp
    q, k, v = (cp.shard(t, group) for t in (q_full, k_full, v_full))   # this rank's rows
    out = cp.ring_flash_attn_func(q, k, v, causal=True, group=group)   # this rank's out
    out_full = cp.unshard(out, group)

Layouts. A rank's rows are contiguous chunks of the global sequence. zigzag=True (the
default; ring-flash-attn's zigzag, and PyTorch's context_parallel "load balance") cuts
the sequence into 2 W chunks and gives rank r chunks r and 2W - 1 - r, so that with a
causal mask every rank does the same work; zigzag=False gives rank r chunk r of W.
shard/unshard (dim 1 of (batch, seqlen, ...)) and shard_varlen/unshard_varlen (dim 0 of
(total, ...), every sequence sharded the same way) convert between the two.

The mask of each hop. Every chunk pair (queries at global positions a0.., keys at
b0..) is given to flashc as a window in the chunk's own coordinates, trimmed to the
rows and keys that see something, so causal, window_size and their combination are the
single-process masks of the whole sequence; a pair entirely outside the mask costs no
call (with a sliding window most hops are skipped). Pairs that are fully visible are
merged into one call (a non-causal hop is one call; a causal zigzag hop is one call:
the diagonal hop is one causal call on the local rows).

Backward: the same hops again with the merged out and lse (flashc's backward takes
them); dq accumulates locally in fp32, and dK, dV accumulate in fp32 buffers that
travel around the ring behind K and V and reach their owner after the last hop.

What it supports: causal, window_size, softcap, softmax_scale, MQA/GQA (K and V travel
with their nheads_k heads), v's head dim differing from q's, deterministic, batched
and varlen (cu_seqlens of this rank's rows, the same on every rank), forward and
autograd. It refuses, with FlashcError (FLASHC_ERR_UNSUPPORTED): alibi_slopes (the
bias is the distance |i - j| in global positions, which a trimmed chunk pair does not
give the kernel's bottom-right alignment), dropout (the mask would not be the
single-process one) and learnable_sink (it joins every row's denominator once, not once
per hop). Queries and keys are the same sequence (self-attention): q and k have the
same rows.

Costs, stated: flashc's forward writes its partial out in the input dtype (the C API's
out is q's dtype), so in bf16 each partial out is rounded once before the fp32 merge:
one bf16 rounding per hop of a partial whose weight is e^(lse_hop - lse), no rounding
of the accumulator per hop; the tests hold the result to the same rule as a
single-process call. dK, dV travel in fp32 (twice the bytes of bf16). A row that sees
one key of a piece runs the backward's one-key rule in bf16 and fp16 (src/common/window.h:
with the merged lse it drops a term at most 2^-10 of the row's scale, below their
rounding) and the formula in fp32. The varlen forms
make one call per sequence and chunk pair (a local rows' sequence is not contiguous in
the zigzag layout); the batched forms make one to three calls per hop.
"""
import math
from typing import List, NamedTuple, Optional

import torch
import torch.distributed as dist

from . import _lib, interface

__all__ = ["ring_flash_attn_func", "ring_flash_attn_varlen_func", "shard", "unshard",
           "shard_varlen", "unshard_varlen"]


# ---- layouts: the global chunks a rank holds ----
def _world(group):
    """(world size, rank) of `group`; a process without torch.distributed initialised is
    a world of one (the default group only), where the ring is one hop and no message."""
    if group is None and not (dist.is_available() and dist.is_initialized()):
        return 1, 0
    return dist.get_world_size(group), dist.get_rank(group)


def _chunks(world, rank, zigzag):
    """(chunk indices of `rank`, chunks in the sequence): zigzag (r, 2W - 1 - r) of 2W,
    else (r,) of W."""
    return ((rank, 2 * world - 1 - rank), 2 * world) if zigzag else ((rank,), world)


def _split_error(what, n, parts):
    raise _lib.FlashcArgumentError(_lib.ERR_INVALID_ARG, "%s=%d but must be a multiple of %d "
                                   "(the ring's chunks: 2 a rank with zigzag)" % (what, n, parts))


def shard(x, group=None, zigzag=True, dim=1):
    """This rank's rows of a whole sequence x along `dim` (seqlen of (batch, seqlen,
    ...)): chunks (r, 2W - 1 - r) of 2W with zigzag, else chunk r of W. A view when
    one chunk, a new tensor when two."""
    world, rank = _world(group)
    idx, parts = _chunks(world, rank, zigzag)
    if x.shape[dim] % parts:
        _split_error("x.shape[%d]" % dim, x.shape[dim], parts)
    pieces = x.chunk(parts, dim)
    return torch.cat([pieces[i] for i in idx], dim) if len(idx) > 1 else pieces[idx[0]]


def _gather(x, group):
    """(world size, every rank's x in rank order)."""
    world, _ = _world(group)
    if world == 1:
        return 1, [x]
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return world, parts


def unshard(x, group=None, zigzag=True, dim=1):
    """The whole sequence from every rank's rows x (shard's inverse; a collective)."""
    world, parts = _gather(x, group)
    chunks = [None] * (2 * world if zigzag else world)
    for r, part in enumerate(parts):
        idx, _ = _chunks(world, r, zigzag)
        for i, piece in zip(idx, part.chunk(len(idx), dim)):
            chunks[i] = piece
    return torch.cat(chunks, dim)


def _lengths(cu_seqlens):
    cu = [int(c) for c in cu_seqlens.tolist()]
    return cu, [b - a for a, b in zip(cu[:-1], cu[1:])]


def shard_varlen(x, cu_seqlens, group=None, zigzag=True):
    """(this rank's rows of x (total, ...) packed by cu_seqlens (int32, batch + 1), their
    cu_seqlens): each sequence sharded as shard does, its length a multiple of 2W
    (zigzag) or W. The local cu_seqlens is the global one divided by W, the same on
    every rank."""
    world, rank = _world(group)
    idx, parts = _chunks(world, rank, zigzag)
    cu, lens = _lengths(cu_seqlens)
    rows = []
    for b, n in enumerate(lens):
        if n % parts:
            _split_error("the length of sequence %d" % b, n, parts)
        c = n // parts
        rows += [torch.arange(cu[b] + i * c, cu[b] + (i + 1) * c) for i in idx]
    index = torch.cat(rows) if rows else torch.zeros(0, dtype=torch.int64)
    return x.index_select(0, index.to(x.device)), torch.div(cu_seqlens, world,
                                                            rounding_mode="floor")


def unshard_varlen(x, cu_seqlens, group=None, zigzag=True):
    """The whole packed sequences from every rank's rows x (total_local, ...) and their
    local cu_seqlens (shard_varlen's inverse; a collective)."""
    world, parts = _gather(x, group)
    cu, lens = _lengths(cu_seqlens)
    out = []
    for b, n in enumerate(lens):
        chunks = [None] * (2 * world if zigzag else world)
        for r, part in enumerate(parts):
            idx, _ = _chunks(world, r, zigzag)
            seq = part[cu[b]:cu[b + 1]]
            for i, piece in zip(idx, seq.chunk(len(idx), 0)):
                chunks[i] = piece
        out += chunks
    return torch.cat(out, 0) if out else x[:0]


# ---- the plan of one hop: which rows meet which keys, under which window ----
class _Seg(NamedTuple):
    """Local rows [row, row + n) of sequence `seq`, at global positions pos .. pos + n - 1."""
    seq: int
    row: int
    n: int
    pos: int


class _Piece(NamedTuple):
    """One flashc call: local query rows [q0, q0 + nq) over the hop's keys [k0, k0 + nk),
    window (left, right) in flashc's bottom-right convention (-1: unbounded)."""
    q0: int
    nq: int
    k0: int
    nk: int
    left: int
    right: int


def _segments(lens, world, rank, zigzag):
    """The segments of `rank`'s rows, for local sequence lengths `lens` (a rank holds
    lens[b] rows of sequence b, packed in order)."""
    idx, _ = _chunks(world, rank, zigzag)
    segs, row = [], 0
    for b, n in enumerate(lens):
        c = n // len(idx)
        for i in idx:
            segs.append(_Seg(b, row, c, i * c))
            row += c
    return segs


def _pair(qs, ks, left, right):
    """The piece of segment pair (qs, ks) under the global mask "key t visible to query p
    iff p - left <= t <= p + right" (a side < 0 unbounded), trimmed to the query rows that
    see a key and the keys some row sees; None when no row sees any key.
    Row i (position qs.pos + i) sees keys j in [i + d - left, i + d + right], d = qs.pos -
    ks.pos. After trimming, row i' = i - i0 sees j' = j - j0 in [i' + e - left, i' + e +
    right], e = d + i0 - j0, which flashc writes as [i' + nk - nq - L, i' + nk - nq + R].
    L >= 0 because the last row sees a key (nq - 1 + e - left <= nk - 1), R >= 0 because
    the last key is one the last row sees (nq - 1 + e + right >= nk - 1)."""
    d = qs.pos - ks.pos
    i0 = 0 if right < 0 else max(0, -(d + right))
    i1 = qs.n - 1 if left < 0 else min(qs.n - 1, ks.n - 1 - (d - left))
    if i0 > i1 or qs.n == 0 or ks.n == 0:
        return None
    j0 = 0 if left < 0 else max(0, i0 + d - left)
    j1 = ks.n - 1 if right < 0 else min(ks.n - 1, i1 + d + right)
    nq, nk, e = i1 - i0 + 1, j1 - j0 + 1, d + i0 - j0
    lw = -1 if left < 0 else nk - nq - e + left
    rw = -1 if right < 0 else e + right - nk + nq
    assert (left < 0 or lw >= 0) and (right < 0 or rw >= 0), (qs, ks, left, right)
    if (lw < 0 or lw >= nk - 1) and (rw < 0 or rw >= nq - 1):
        lw = rw = -1  # every row sees every key
    return _Piece(qs.row + i0, nq, ks.row + j0, nk, lw, rw)


def _merge_full(pieces):
    """Fully visible pieces that share their keys and have adjacent rows (or share their
    rows and have adjacent keys) as one piece."""
    merged = True
    while merged:
        merged = False
        for a in pieces:
            for b in pieces:
                if a is b or (a.left, a.right, b.left, b.right) != (-1, -1, -1, -1):
                    continue
                if (a.k0, a.nk) == (b.k0, b.nk) and a.q0 + a.nq == b.q0:
                    m = _Piece(a.q0, a.nq + b.nq, a.k0, a.nk, -1, -1)
                elif (a.q0, a.nq) == (b.q0, b.nq) and a.k0 + a.nk == b.k0:
                    m = _Piece(a.q0, a.nq, a.k0, a.nk + b.nk, -1, -1)
                else:
                    continue
                pieces = [p for p in pieces if p is not a and p is not b] + [m]
                merged = True
                break
            if merged:
                break
    return sorted(pieces)


def _hop_pieces(q_segs, k_segs, left, right, same_rank):
    """Per sequence, the pieces of one hop. On the diagonal hop (own keys) with the
    causal mask unbounded on the left, one causal call over the sequence's local rows
    is exact: local order is global order within a sequence, so j <= i iff pos_j <= pos_i."""
    out = []
    for seq in sorted({s.seq for s in q_segs}):
        qs = [s for s in q_segs if s.seq == seq]
        ks = [s for s in k_segs if s.seq == seq]
        n = sum(s.n for s in qs)
        if same_rank and left < 0 and right == 0 and n:
            out.append([_Piece(qs[0].row, n, ks[0].row, n, -1, 0)])
            continue
        pieces = [p for a in qs for b in ks for p in [_pair(a, b, left, right)] if p]
        out.append(_merge_full(pieces))
    return out


# ---- the exchanges of K, V and of their gradients ----
class _Ring:
    """Point-to-point hops to the next rank of `group`, from the previous one: hop h holds
    the K, V of rank - h, and dK, dV buffers follow them round the ring."""

    def __init__(self, group):
        self.group = group
        self.world, self.rank = _world(group)
        self.next, self.prev = ((dist.get_global_rank(group, r % self.world) if group is not None
                                 else r % self.world) for r in (self.rank + 1, self.rank - 1))
        self.dkv = None  # the backward's (dK, dV) buffers in flight

    def start(self, tensors):
        """Send `tensors` to the next rank and receive their likes from the previous one,
        asynchronously: (received buffers, requests to wait on)."""
        bufs = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
        ops = [dist.P2POp(dist.isend, t.contiguous(), self.next, self.group, tag)
               for tag, t in enumerate(tensors)]
        ops += [dist.P2POp(dist.irecv, b, self.prev, self.group, tag)
                for tag, b in enumerate(bufs)]
        return bufs, dist.batch_isend_irecv(ops)

    def blocks(self, kv):
        """(source rank, its K, V) for each hop; the next hop's K, V are in flight while the
        caller computes on these."""
        for hop in range(self.world):
            pending = self.start(kv) if hop + 1 < self.world else None
            yield (self.rank - hop) % self.world, kv
            if pending is not None:
                kv, requests = pending
                _wait(requests)

    def add_grads(self, src, kv, parts):
        """Add a hop's (piece, dk, dv) parts to the dK, dV of rank src's block, which arrive
        from the previous rank (zeros at the first hop), and send them on to the next, whose
        block this is at its next hop (the owner's after the last)."""
        if self.dkv is None:
            dkv = tuple(torch.zeros(t.shape, dtype=torch.float32, device=t.device) for t in kv)
        else:
            dkv, requests = self.dkv
            _wait(requests)
        _add_parts(dkv, parts)
        self.dkv = self.start(dkv) if self.world > 1 else (dkv, [])

    def grads(self):
        """This rank's dK, dV (fp32), once every hop's were added."""
        dkv, requests = self.dkv
        _wait(requests)
        self.dkv = None
        return dkv


class _AllGather:
    """K, V of every rank gathered at once (all_gather), dK, dV summed to their owners at
    the end (reduce_scatter): two collectives in place of W - 1 hops, for sequences short
    enough that a hop's transfer would not hide under its compute; W blocks in memory."""

    def __init__(self, group):
        self.group = group
        self.world, self.rank = _world(group)
        self.dkv = None  # (dK, dV) of every rank's block, fp32 (W, ...)

    def blocks(self, kv):
        """(source rank, its K, V) for each hop, in the ring's order."""
        parts = [_gather(t.contiguous(), self.group)[1] for t in kv]
        for hop in range(self.world):
            src = (self.rank - hop) % self.world
            yield src, tuple(p[src] for p in parts)

    def add_grads(self, src, kv, parts):
        if self.dkv is None:
            self.dkv = tuple(torch.zeros((self.world,) + t.shape, dtype=torch.float32,
                                         device=t.device) for t in kv)
        _add_parts(tuple(d[src] for d in self.dkv), parts)

    def grads(self):
        dkv, self.dkv = self.dkv, None
        if self.world == 1:
            return tuple(d[0] for d in dkv)
        mine = tuple(torch.empty_like(d[0]) for d in dkv)
        for m, d in zip(mine, dkv):
            dist.reduce_scatter(m, list(d.unbind(0)), group=self.group)
        return mine


_EXCHANGES = {"ring": _Ring, "allgather": _AllGather}


def _wait(requests):
    for r in requests:
        r.wait()


def _add_parts(dkv, parts):
    """dK, dV (fp32 views of one block) += a hop's (piece, dk, dv) parts."""
    for p, dkp, dvp in parts:
        dkv[0][:, p.k0:p.k0 + p.nk] += dkp.float()
        dkv[1][:, p.k0:p.k0 + p.nk] += dvp.float()


# ---- forward and backward ----
def _lse_rows(lse, q0, nq):
    return lse[:, :, q0:q0 + nq]


def _ring_forward(q, k, v, seg_lens, opts, comm):
    """out (q's dtype), lse fp32 of q (B, S, H, D) over every rank's K and V (B, S, Hk, D
    or Dv), received through comm (_Ring or _AllGather); seg_lens: the local length of
    each sequence (batched: [S])."""
    scale, softcap, left, right, zigzag = opts
    b, s, h = q.shape[:3]
    acc = torch.zeros(b, s, h, v.shape[-1], dtype=torch.float32, device=q.device)
    lse = torch.full((b, h, s), -math.inf, dtype=torch.float32, device=q.device)
    q_segs = _segments(seg_lens, comm.world, comm.rank, zigzag)
    for src, (kb, vb) in comm.blocks((k, v)):
        k_segs = _segments(seg_lens, comm.world, src, zigzag)
        for pieces in _hop_pieces(q_segs, k_segs, left, right, src == comm.rank):
            for p in pieces:
                o, l, _ = interface._fwd(q[:, p.q0:p.q0 + p.nq], kb[:, p.k0:p.k0 + p.nk],
                                         vb[:, p.k0:p.k0 + p.nk], None, 0.0, scale, False,
                                         p.left, p.right, softcap, False, 0, 0)
                _merge(acc[:, p.q0:p.q0 + p.nq], _lse_rows(lse, p.q0, p.nq), o, l)
    return acc.to(q.dtype), lse


def _merge(acc, lse, out, out_lse):
    """acc (B, n, H, Dv) fp32 and lse (B, H, n) (views, updated in place) merged with a
    partial out (B, n, H, Dv) and its out_lse, finite: a piece holds rows that see keys."""
    new = torch.logaddexp(lse, out_lse)
    acc.mul_(torch.exp(lse - new).transpose(1, 2).unsqueeze(-1))
    acc.add_(out.float() * torch.exp(out_lse - new).transpose(1, 2).unsqueeze(-1))
    lse.copy_(new)


def _ring_backward(dout, q, k, v, out, lse, seg_lens, opts, deterministic, comm):
    """dq, dk, dv (fp32) of the ring forward: the hops again with the merged out and lse,
    dq accumulated here, dK and dV handed to comm (the ring: buffers that follow K and V
    and reach their owner at the end; all-gather: summed to their owners at the end)."""
    scale, softcap, left, right, zigzag = opts
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    q_segs = _segments(seg_lens, comm.world, comm.rank, zigzag)
    for src, (kb, vb) in comm.blocks((k, v)):
        k_segs = _segments(seg_lens, comm.world, src, zigzag)
        parts = []  # (piece, dk, dv) of this hop
        for pieces in _hop_pieces(q_segs, k_segs, left, right, src == comm.rank):
            for p in pieces:
                qv, kp, vp = (q[:, p.q0:p.q0 + p.nq], kb[:, p.k0:p.k0 + p.nk],
                              vb[:, p.k0:p.k0 + p.nk])
                dqp, dkp, dvp = torch.empty_like(qv), torch.empty_like(kp), torch.empty_like(vp)
                interface._bwd(dout[:, p.q0:p.q0 + p.nq], qv, kp, vp, out[:, p.q0:p.q0 + p.nq],
                               _lse_rows(lse, p.q0, p.nq), dqp, dkp, dvp, None, 0.0, scale,
                               False, p.left, p.right, softcap, deterministic, 0, 0, None, None)
                dq[:, p.q0:p.q0 + p.nq] += dqp.float()
                parts.append((p, dkp, dvp))
        comm.add_grads(src, (kb, vb), parts)
    dk, dv = comm.grads()
    return dq, dk, dv


class _RingAttnFunc(torch.autograd.Function):
    """Ring attention of (B, S, H, D) tensors; seg_lens as _ring_forward's, kv_comm a key
    of _EXCHANGES."""

    @staticmethod
    def forward(ctx, q, k, v, seg_lens, opts, deterministic, group, kv_comm):
        k, v = k.contiguous(), v.contiguous()  # sent as they are
        out, lse = _ring_forward(q, k, v, seg_lens, opts, _EXCHANGES[kv_comm](group))
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = seg_lens, opts, deterministic, group, kv_comm
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        seg_lens, opts, deterministic, group, kv_comm = ctx.args
        dq, dk, dv = _ring_backward(dout.contiguous(), q, k, v, out, lse, seg_lens, opts,
                                    deterministic, _EXCHANGES[kv_comm](group))
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None


# ---- the public functions ----
def _refuse(fn, what):
    raise _lib.FlashcError(_lib.ERR_UNSUPPORTED, "%s: %s is not supported by ring attention "
                           "(flashc.parallel)" % (fn, what))


def _checked(fn, qkv, shapes, dropout_p, softmax_scale, causal, window_size, softcap,
             alibi_slopes, learnable_sink, zigzag, kv_comm):
    """The options of a ring call, (scale, softcap, left, right, zigzag) with causal as
    right = 0, after the checks that need no communication: ranks (`shapes` as
    interface._rank's), kv_comm, what ring attention refuses, and q, k, v of the same rows."""
    for name, t in zip("qkv", qkv):
        interface._rank(fn, name, t, shapes)
    if kv_comm not in _EXCHANGES:
        interface._arg_error("%s: kv_comm=%r but must be one of %s" % (fn, kv_comm,
                                                                      ", ".join(_EXCHANGES)))
    if dropout_p:
        _refuse(fn, "dropout_p=%r (the mask would differ from a single-process call's)"
                % (dropout_p,))
    if alibi_slopes is not None:
        _refuse(fn, "alibi_slopes (the bias needs global positions)")
    if learnable_sink is not None:
        _refuse(fn, "learnable_sink (it joins each row's softmax once, not once per hop)")
    q, k, v = qkv
    rows = q.dim() - 3  # the token axis: 1 of (batch, seqlen, ...), 0 of (total, ...)
    if k.shape[rows] != q.shape[rows] or v.shape[rows] != q.shape[rows]:
        interface._arg_error("%s: q has %d rows, k %d and v %d, but ring attention is "
                             "self-attention: q, k and v shard the same sequence" %
                             (fn, q.shape[rows], k.shape[rows], v.shape[rows]))
    left, right = interface._window(window_size)
    return interface._scale(softmax_scale), float(softcap), left, 0 if causal else right, \
        bool(zigzag)


def ring_flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                         window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                         deterministic=False, return_attn_probs=False, *, learnable_sink=None,
                         group=None, zigzag=True, kv_comm="ring"):
    """flash_attn_func over a sequence sharded across the ranks of `group` (None: the
    default group). q (batch, seqlen_local, nheads, headdim), k, v (batch, seqlen_local,
    nheads_k, headdim): this rank's rows (shard(x, group, zigzag)); seqlen_local even
    with zigzag. causal, window_size, softcap, softmax_scale as flash_attn_func's, in
    positions of the whole sequence. Differentiable in q, k, v. Every rank calls it
    with the same shapes and options. kv_comm="ring" passes K, V round the ring (the next
    hop's in flight while one computes); "allgather" gathers every rank's K, V in one
    collective and sums dK, dV to their owners in one (reduce_scatter): fewer, larger
    messages for short sequences, W blocks in memory. Returns this rank's out (batch, seqlen_local,
    nheads, headdim_v), or (out, softmax_lse (batch, nheads, seqlen_local) fp32, None)
    with return_attn_probs. dropout, alibi_slopes, learnable_sink: FlashcError
    FLASHC_ERR_UNSUPPORTED."""
    fn = "ring_flash_attn_func"
    opts = _checked(fn, (q, k, v), {4: interface._BSHD}, dropout_p, softmax_scale, causal,
                    window_size, softcap, alibi_slopes, learnable_sink, zigzag, kv_comm)
    if zigzag and q.shape[1] % 2:
        _split_error("%s: q.shape[1]" % fn, q.shape[1], 2)
    out, lse = _RingAttnFunc.apply(q, k, v, [q.shape[1]], opts, bool(deterministic), group,
                                   kv_comm)
    return (out, lse, None) if return_attn_probs else out


def ring_flash_attn_varlen_func(q, k, v, cu_seqlens, dropout_p=0.0, softmax_scale=None,
                                causal=False, window_size=(-1, -1), softcap=0.0,
                                alibi_slopes=None, deterministic=False, return_attn_probs=False,
                                *, learnable_sink=None, group=None, zigzag=True,
                                kv_comm="ring"):
    """flash_attn_varlen_func over packed sequences sharded across the ranks of `group`:
    q (total_local, nheads, headdim), k, v (total_local, nheads_k, headdim), this rank's
    rows of every sequence (shard_varlen); cu_seqlens int32 (batch + 1) of those rows,
    the same on every rank (read on the host), each local length even with zigzag.
    Returns out (total_local, nheads, headdim_v), or (out, softmax_lse (nheads,
    total_local) fp32, None) with return_attn_probs. Otherwise as ring_flash_attn_func."""
    fn = "ring_flash_attn_varlen_func"
    opts = _checked(fn, (q, k, v), {3: interface._THD}, dropout_p, softmax_scale, causal,
                    window_size, softcap, alibi_slopes, learnable_sink, zigzag, kv_comm)
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or \
            cu_seqlens.dtype != torch.int32:
        interface._arg_error("%s: cu_seqlens must be an int32 (batch + 1) tensor" % fn)
    cu, lens = _lengths(cu_seqlens)
    if not cu or cu[0] != 0 or cu[-1] != q.shape[0] or min(lens, default=0) < 0:
        interface._arg_error("%s: cu_seqlens=%s but must rise from 0 to q.shape[0]=%d" %
                             (fn, cu, q.shape[0]))
    for b, n in enumerate(lens):
        if zigzag and n % 2:
            _split_error("%s: the local length of sequence %d" % (fn, b), n, 2)
    out, lse = _RingAttnFunc.apply(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), lens, opts,
                                   bool(deterministic), group, kv_comm)
    out, lse = out.squeeze(0), lse.squeeze(0)
    return (out, lse, None) if return_attn_probs else out
