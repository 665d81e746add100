"""flashc.sdpa : torch.nn.functional.scaled_dot_product_attention calls run by flashc,
without editing the code that makes them.

    with flashc.sdpa.route() as r:
        loss = model(x).sum()     # a model that calls F.scaled_dot_product_attention
        loss.backward()
    print(r.routed, r.fallbacks)  # calls flashc ran; Counter of reasons torch's SDPA ran

    python -m flashc.sdpa train.py --its --args     # the whole script under route()
    python -m flashc.sdpa -m package.module --args

route() is a torch.overrides.TorchFunctionMode: while it is on the mode stack, every call
of torch.nn.functional.scaled_dot_product_attention, however the caller imported it (HF
transformers' sdpa_attention_forward, nanoGPT's CausalSelfAttention), comes here first. A
call flashc can run (fallback_reason() is None) goes to flashc.flash_attn_func, with
autograd; any other call goes on to torch's SDPA unchanged, and its reason is counted in
r.fallbacks and logged once per route at INFO on the logger "flashc.sdpa". On leaving the
`with`, the mode stack is as it was. Like torch's own modes it is per thread: threads
started inside the `with` are not routed.

Why a mode: it catches the call however it was imported (a patched module attribute misses
`from torch.nn.functional import scaled_dot_product_attention` done earlier), undoes itself
exactly on exit, nests, and torch.compile traces through it (tests/python/test_sdpa.py,
torch 2.15: the compiled graph holds flashc's custom ops, and a graph compiled inside the
route is recompiled outside it; torch before 2.6 is not tested). torch.nn.attention's
flash-implementation registry (activate_flash_attention_impl) swaps the CUDA kernels
behind torch's own flash backend process-wide, a private-op contract; it has no CPU entry
and is not used. The cost: while
the route is on, every torch function call made from Python passes through one Python
method (about 1.5 us per call, measured on 2 CPU cores); compiled graphs do not pay it.

What runs on flashc (anything else falls back; fallback_reason says why):
- attn_mask None (HF transformers passes None with is_causal=True for batches without
  padding), or a mask that is, for each batch and the same for every head, a key-padding
  mask (right or left padding), a causal mask (top-left, or bottom-right as HF's over a
  KV cache), or both: bool, or additive of 0 and -inf or the dtype's minimum (HF's fill),
  broadcastable to (batch, 1, seqlen_q, seqlen_k), with is_causal False (torch refuses
  both). _mask_plan tells the form exactly, reading the mask once on its device (two
  passes over a float mask, then counts of the seen elements, of those past the diagonal
  and in the padded keys' columns; two small copies to the host, the first and last rows
  and the counts, are its device syncs; no copy of the mask; bench/sdpa_mask.py, one CPU
  thread: 4-6 ms for a bool (1, 1, 4096, 4096) padding mask, 16-23 ms causal, 82-85 ms
  with HF's bf16 fill, 1.8-6x faster than the reading it replaced): the same mask passed
  again, unchanged (its object and _version), is not read again, as HF passes one mask to
  every layer. The unpadded rows run as one or two flashc calls (below, "attention
  masks"): flash_attn_func on slices of query, key and value where every batch has the
  same keys (one batch, or a mask shared by the batch), else flash_attn_varlen_func on
  the gathered rows; rows that see no key get out 0 and zero gradients, what
  torch's SDPA gives (torch 2.5+ on the CPU); with a dtype-minimum fill such rows get a
  softmax over every key from torch, so those masks fall back. Anything else falls back:
  a bias, a per-head mask, a mask one element away from those forms, and any mask under
  torch.compile (reading it would break the graph).
- query, key, value plain 4-D tensors (batch, heads, seqlen, headdim), same batch, dtype
  float32, float16 or bfloat16 (on CUDA float16 and bfloat16, where the library's CUDA
  backend is usable), one device, head dim 1..256 for query, key and value alike, seqlens
  >= 1, key and value with the same heads: as many as query, or with enable_gqa=True a
  divisor of them (query head h reads key head h // (Hq / Hk), as SDPA's repeat_interleave).
- 0 <= dropout_p < 1. flashc draws its own mask (interface._draw_rng: torch.manual_seed
  makes it reproducible), not the one torch's kernels would.
- scale None (1/sqrt(headdim)) or any number, as SDPA.
In eager mode a forward the library refuses with FLASHC_ERR_UNSUPPORTED (a CUDA device
below compute capability 8.0, a head dim the CUDA build lacks) falls back too.

Translation. SDPA's is_causal aligns the mask to the top-left corner: query i sees keys
j <= i. flash_attn's causal aligns it to the bottom-right (j <= i + Sk - Sq). With
Sq == Sk they agree; with Sq < Sk no query ever sees a key past Sq - 1, so key and value
are cut to their first Sq rows (views; those keys get zero gradient, as in SDPA) and
flashc runs causal on a square; with Sq > Sk, flashc runs non-causal with window_size
(-1, Sq - Sk), whose right edge i + Sk - Sq + (Sq - Sk) = i is SDPA's. The backward is
deterministic where torch.are_deterministic_algorithms_enabled().

The output is (batch, heads, seqlen_q, headdim) as a transposed view of a contiguous
(batch, seqlen_q, heads, headdim) tensor, the layout torch's own flash kernels return on
CUDA: `.transpose(1, 2).contiguous()` after it copies nothing. Code that calls `.view()`
on the output without `.contiguous()` needs `.reshape()`, as it does on CUDA already.
"""
import collections
import itertools
import logging
import numbers
import os
import runpy
import sys
import weakref

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from . import _lib, interface

__all__ = ["fallback_reason", "route", "SdpaRoute"]

logger = logging.getLogger(__name__)

_TORCH_SDPA = F.scaled_dot_product_attention
_DTYPES = {"cpu": (torch.float32, torch.float16, torch.bfloat16),
           "cuda": (torch.float16, torch.bfloat16)}
_MAX_HEADDIM = 256
_cuda_backend = []  # [usable]: flashc_backend_available(CUDA), asked once, on first use


def _cuda_usable():
    if not _cuda_backend:
        _cuda_backend.append(bool(_lib.lib.flashc_backend_available(_lib.BACKEND_CUDA)))
    return _cuda_backend[0]


def _compiling():
    compiler = getattr(torch, "compiler", None)
    return bool(compiler is not None and hasattr(compiler, "is_compiling") and
                compiler.is_compiling())


# ---- which calls flashc runs ----
def _tensor_reason(query, key, value):
    """Why q, k, v are not tensors flashc takes, or None."""
    named = (("query", query), ("key", key), ("value", value))
    for name, t in named:
        if not isinstance(t, torch.Tensor) or t.is_nested or t.layout != torch.strided:
            return "%s is not a strided torch.Tensor" % name
        if t.dim() != 4:
            return "%s.dim()=%d, not 4 (batch, heads, seqlen, headdim)" % (name, t.dim())
    device, dtype = query.device, query.dtype
    for name, t in named[1:]:
        if t.device != device or t.dtype != dtype:
            return "%s is %s on %s but query is %s on %s" % (name, t.dtype, t.device, dtype,
                                                             device)
    if dtype not in _DTYPES.get(device.type, ()):
        return "query is %s on %s: flashc takes %s there" % (
            dtype, device, ", ".join(str(d) for d in _DTYPES.get(device.type, ())) or "nothing")
    if device.type == "cuda" and not _cuda_usable():
        return "flashc's CUDA backend is not usable (not built, or no device of sm80+)"
    return None


def _shape_reason(query, key, value, enable_gqa):
    """Why the shapes are not a flashc problem, or None."""
    (b, hq, sq, d), (bk, hk, sk, dk) = query.shape, key.shape
    if (bk, hk, sk, dk) != tuple(value.shape) or bk != b:
        return "shapes query %s, key %s, value %s: flashc needs one batch and value shaped " \
               "as key" % (tuple(query.shape), tuple(key.shape), tuple(value.shape))
    if dk != d or not 1 <= d <= _MAX_HEADDIM:
        return "head dims query %d, key %d: flashc needs them equal, in 1..%d" % (
            d, dk, _MAX_HEADDIM)
    if min(sq, sk) == 0 or b == 0 or hk == 0:
        return "an empty tensor"
    if hq != hk and not (enable_gqa and hq % hk == 0):
        return "query has %d heads, key %d%s" % (
            hq, hk, "" if enable_gqa else " and enable_gqa=False")
    return None


# ---- attention masks: key padding, causal, both ----
# A mask flashc runs is, for each batch b (the same for every head), "query i sees key j"
# exactly when kstart[b] <= j < kend[b] (a key-padding mask: right padding, left padding or
# none) and, for a causal mask, j <= i + off, with off = Sk - Sq (bottom-right: HF
# transformers' causal mask over a KV cache) or 0 (top-left: SDPA's is_causal). _plan_of
# reads the form off the mask's first and last rows and checks the whole mask against it by
# counts on its device (_is_form), and sorts each batch's query rows into three kinds:
#   rows [0, i0): no key at all (left padding's padded queries under a causal mask): out 0
#       and no gradient, what torch's SDPA gives a fully masked row (torch 2.5+);
#   rows [i0, i1): row i sees keys kstart <= j <= i + off: one flashc causal call over
#       keys [kstart, i1 + off), whose bottom-right corner is that diagonal;
#   rows [i1, Sq): every key of [kstart, kend): one flashc call without causal (right
#       padding's padded queries under a causal mask; every row of a padding-only mask).
# Where every batch has the same rows and keys (one batch; a mask broadcast over the batch),
# a call is one flash_attn_func on slices of q, k and v (span: rows [r0, r1), keys [k0, k1);
# its inputs are not copied, and the parts of two calls or zero rows are joined by one
# torch.cat); else it gathers its rows and keys of every batch into one
# flash_attn_varlen_func call (the index and cu fields), so no padded key reaches the
# kernels, and its output is scattered back.
_Call = collections.namedtuple("_Call", "causal span q_batch q_row k_batch k_row cu_q cu_k "
                                        "max_q max_k")
_mask_cache = []  # [(weakref to the mask, its _version, the call's key, plan or reason)]


def _allowed(mask):
    """(bool "query sees key", the count of its masked elements) of an attn_mask: a bool
    mask as it is (count None), a float one as mask == 0 with the count of its elements
    <= its dtype's minimum (-inf or the minimum, HF transformers' fill; not NaN) as a
    0-dim tensor on its device. Two passes over a float mask, no sync."""
    if mask.dtype == torch.bool:
        return mask, None
    return mask == 0, torch.count_nonzero(mask <= torch.finfo(mask.dtype).min)


def _values_reason(allowed, masked):
    """Why a mask of _allowed's (allowed, masked) is not one flashc reads by its values (a
    float mask with an element that is neither 0 nor masked), or None."""
    if masked is None or int(torch.count_nonzero(allowed) + masked) == allowed.numel():
        return None
    return "attn_mask holds values other than 0, -inf and its dtype's minimum (a bias)"


def _index(spans):
    """(batch, row) int64 indices of rows [a, z) of batch i, for spans[i] = (a, z)."""
    batch = torch.cat([torch.full((z - a,), i, dtype=torch.long)
                       for i, (a, z) in enumerate(spans)])
    return batch, torch.cat([torch.arange(a, z) for a, z in spans])


def _calls(starts, ends, off, sq):
    """The flashc calls (_Call) of a mask under which batch b sees keys [starts[b],
    ends[b]) and, with off not None, keys j <= i + off."""
    bounds = []  # per batch: kstart, kend, i0, i1
    for lo, hi in zip(starts, ends):
        if hi <= lo or off is None:
            i0 = i1 = sq if hi <= lo else 0
        else:
            i0 = min(max(lo - off, 0), sq)
            i1 = min(max(hi - off, i0), sq)
        bounds.append((lo, hi, i0, i1))
    uniform = len(set(bounds)) == 1  # every batch the same rows and keys: spans
    calls = []
    for causal in (True, False):
        # per batch: query rows [r0, r1), keys [k0, k1)
        spans = [(i0, i1, lo, i1 + (off or 0)) if causal else (i1, sq, lo, hi)
                 for lo, hi, i0, i1 in bounds]
        spans = [s if s[1] > s[0] else (0, 0, 0, 0) for s in spans]
        lens_q, lens_k = [s[1] - s[0] for s in spans], [s[3] - s[2] for s in spans]
        if not sum(lens_q):
            continue
        if uniform:
            calls.append(_Call(causal, spans[0], *(None,) * 6, lens_q[0], lens_k[0]))
            continue
        cu_q, cu_k = (torch.tensor([0] + list(itertools.accumulate(n)), dtype=torch.int32)
                      for n in (lens_q, lens_k))
        calls.append(_Call(causal, None, *_index([s[:2] for s in spans]),
                           *_index([s[2:] for s in spans]), cu_q, cu_k, max(lens_q),
                           max(lens_k)))
    return calls


def _runs(rows):
    """(kstart, kend) int64 (Bm,) of bool rows (Bm, Sk): each row's first key and one past
    its last, (Sk, 0) for a row without keys."""
    j = torch.arange(rows.shape[-1], device=rows.device)
    return torch.where(rows, j, rows.shape[-1]).amin(dim=-1), \
        torch.where(rows, j + 1, 0).amax(dim=-1)


def _form_counts(kstart, kend, off, sq):
    """The elements each batch of a mask of the form (keys [kstart, kend), and j <= i +
    off unless off is None) holds: int64 (Bm,), on the host."""
    width = (kend - kstart).clamp(min=0)
    if off is None:
        return width * sq
    i = torch.arange(sq)
    seen = torch.minimum(kend[:, None], i + off + 1) - kstart[:, None]
    return seen.clamp(min=0).sum(dim=1) * (width > 0)


def _is_form(allowed, masked, kstart, kend, off):
    """Whether the mask of _allowed's (allowed (Bm, Sq, Sk), masked) is exactly the form of
    batch b's keys [kstart[b], kend[b]) (host tensors), and with off not None j <= i +
    off: allowed holds as many elements as the form (_form_counts), none outside the
    keys, none past the diagonal, and a float mask's other elements are all masked. A
    pass to count, one to cut the part past the diagonal and count it, the padded keys'
    columns; then one small copy to the host (the device sync)."""
    # (count_nonzero over all of a tensor: a reduction by dims widens to int64 first)
    counts = [torch.count_nonzero(allowed[b]) for b in range(allowed.shape[0])]
    if masked is not None:
        counts.append(masked)
    if off is not None:
        counts.append(torch.count_nonzero(torch.triu(allowed, diagonal=off + 1)))
    for b, (lo, hi) in enumerate(zip(kstart.tolist(), kend.tolist())):
        if hi > lo:  # (no key: the count says none is seen)
            counts += [torch.count_nonzero(allowed[b, :, :lo]),
                       torch.count_nonzero(allowed[b, :, hi:])]
    got = torch.stack(counts).cpu()
    want = _form_counts(kstart, kend, off, allowed.shape[1])
    if masked is not None:
        want = torch.cat([want, (allowed.numel() - want.sum()).view(1)])
    return torch.equal(got[:len(want)], want) and not bool(got[len(want):].any())


def _plan_of(mask, batch, sq, sk):
    """The flashc calls (a list of _Call, on mask's device) that compute SDPA under mask
    for (batch, *, sq, *) queries and (batch, *, sk, *) keys, or why flashc cannot (a
    string). The mask is read on its device: a few passes over it (_allowed, _is_form),
    a copy of its first and last rows to the host, counts back; no full copy."""
    if mask.dim() > 4 or mask.dim() < 2 or mask.shape[-2] not in (1, sq) or \
            mask.shape[-1] not in (1, sk):
        return "attn_mask of shape %s for %d queries, %d keys" % (tuple(mask.shape), sq, sk)
    m = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    if m.shape[1] != 1:
        return "attn_mask varies per head (shape %s)" % (tuple(mask.shape),)
    if m.shape[0] not in (1, batch):
        return "attn_mask of batch %d for queries of batch %d" % (m.shape[0], batch)
    allowed, masked = _allowed(m[:, 0].expand(m.shape[0], sq, sk))
    # Every form's rows are nested (row i sees what row i - 1 sees, and more), so the
    # last row holds the keys some query sees, one run [kstart, kend) per batch; a form
    # that also gives the first row is checked on the whole mask.
    edge_rows = allowed[:, [0, sq - 1]].cpu()  # (Bm, 2, Sk)
    kstart, kend = _runs(edge_rows[:, 1])
    j, i = torch.arange(sk), torch.tensor([0, sq - 1])[:, None]
    keys = (j >= kstart[:, None]) & (j < kend[:, None])
    found = False
    if torch.equal(edge_rows[:, 1], keys):
        for off in [None] + sorted({sk - sq, 0}, reverse=True):
            form = keys[:, None, :] if off is None else keys[:, None, :] & (j <= i + off)
            if torch.equal(edge_rows, form.expand_as(edge_rows)) and \
                    _is_form(allowed, masked, kstart, kend, off):
                found = True
                break
    if not found:  # why not, in the order of the checks' reasons
        reason = _values_reason(allowed, masked)
        if reason:
            return reason
        cols = allowed.any(dim=1)  # (Bm, Sk): the keys some query sees
        ks, ke = _runs(cols)
        j = torch.arange(sk, device=mask.device)
        if not bool((cols == ((j >= ks[:, None]) & (j < ke[:, None]))).all()):
            return "attn_mask is not a key-padding mask (the keys of a batch are not one run)"
        return "attn_mask is not a key-padding mask, a causal mask (top-left or " \
               "bottom-right), or both"
    starts, ends = kstart.tolist(), kend.tolist()
    if m.shape[0] == 1:
        starts, ends = starts * batch, ends * batch
    if masked is not None and any(hi <= lo or (off is not None and lo - off > 0)
                                  for lo, hi in zip(starts, ends)) and \
            bool((mask == torch.finfo(mask.dtype).min).any()):
        return "attn_mask fills with its dtype's minimum and has fully masked rows (torch's " \
               "SDPA gives them a softmax over every key)"
    return [_Call(*(t.to(mask.device) if isinstance(t, torch.Tensor) else t for t in call))
            for call in _calls(starts, ends, off, sq)]


def _mask_plan(mask, batch, sq, sk):
    """_plan_of, computed once per mask (its object and contents) and call shape: HF
    transformers passes one mask to every layer."""
    key = (tuple(mask.shape), mask.stride(), mask.dtype, mask.device, batch, sq, sk)
    if _mask_cache:
        ref, version, cached_key, plan = _mask_cache[0]
        if ref() is mask and version == mask._version and cached_key == key:
            return plan
    plan = _plan_of(mask, batch, sq, sk)
    _mask_cache[:] = [(weakref.ref(mask), mask._version, key, plan)]
    return plan


def _mask_reason(query, attn_mask, is_causal):
    """Why attn_mask is not one _mask_plan reads, or None."""
    if is_causal:
        return "attn_mask and is_causal=True both given"
    if not isinstance(attn_mask, torch.Tensor) or attn_mask.layout != torch.strided:
        return "attn_mask is not a strided torch.Tensor"
    if attn_mask.device != query.device:
        return "attn_mask is on %s but query on %s" % (attn_mask.device, query.device)
    if attn_mask.dtype != torch.bool and attn_mask.dtype != query.dtype:
        return "attn_mask is %s: SDPA takes bool or query's dtype %s" % (attn_mask.dtype,
                                                                         query.dtype)
    if _compiling():
        return "attn_mask under torch.compile (telling its form means reading it)"
    return None


def fallback_reason(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *,
                    scale=None, enable_gqa=False):
    """None if route() runs this call of scaled_dot_product_attention (SDPA's parameters)
    on flashc, else why it goes to torch's SDPA, as a short sentence. An attn_mask is read
    here (the first time this mask is seen)."""
    reason = _tensor_reason(query, key, value) or _shape_reason(query, key, value, enable_gqa)
    if reason:
        return reason
    if attn_mask is not None:
        reason = _mask_reason(query, attn_mask, is_causal)
        if reason is None:
            plan = _mask_plan(attn_mask, query.shape[0], query.shape[2], key.shape[2])
            reason = plan if isinstance(plan, str) else None
        if reason:
            return reason
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real) or \
            not 0.0 <= dropout_p < 1.0:
        return "dropout_p=%r, not in [0, 1)" % (dropout_p,)
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, numbers.Real)):
        return "scale=%r, not a number" % (scale,)
    return None


# ---- the call on flashc ----
def _flashc_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *,
                 scale=None, enable_gqa=False):
    """SDPA on flashc for a call fallback_reason accepts: (B, H, Sq, D) in and out."""
    deterministic = torch.are_deterministic_algorithms_enabled()
    sq, sk = query.shape[2], key.shape[2]
    if attn_mask is not None:
        return _masked_sdpa(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                            _mask_plan(attn_mask, query.shape[0], sq, sk), float(dropout_p),
                            scale, deterministic)
    causal, window = False, (-1, -1)
    if is_causal and sq <= sk:
        # top-left: keys past sq - 1 are seen by no query; on the square the corners meet
        key, value, causal = key[:, :, :sq], value[:, :, :sq], True
    elif is_causal:
        # query i sees j <= i = (i + sk - sq) + (sq - sk): a right window edge of sq - sk
        window = (-1, sq - sk)
    out = interface.flash_attn_func(query.transpose(1, 2), key.transpose(1, 2),
                                    value.transpose(1, 2), float(dropout_p), scale, causal,
                                    window, deterministic=deterministic)
    return out.transpose(1, 2)


def _masked_sdpa(q, k, v, calls, dropout_p, scale, deterministic):
    """SDPA under a mask of _mask_plan's calls on q (B, Sq, H, D), k, v (B, Sk, Hk, D):
    a call with a span runs flash_attn_func on slices; any other call's rows and keys are
    gathered into one flash_attn_varlen_func call and its output scattered back; rows no
    call has (no key) are 0. Returns (B, H, Sq, D)."""
    shape = q.shape[:3] + v.shape[3:]
    if not calls:  # no key at all: flashc's call without keys, out 0 and zero gradients
        calls = [_Call(False, (0, shape[1], 0, 0), *(None,) * 6, shape[1], 0)]
    if all(c.span for c in calls):  # (_calls gives every call a span or none)
        parts, row = [], 0  # the parts in row order, the rows between them 0
        for c in sorted(calls, key=lambda c: c.span[0]):
            r0, r1, k0, k1 = c.span
            if r0 > row:
                parts.append(q.new_zeros(shape[:1] + (r0 - row,) + shape[2:]))
            parts.append(interface.flash_attn_func(
                q[:, r0:r1], k[:, k0:k1], v[:, k0:k1], dropout_p, scale, c.causal,
                deterministic=deterministic))
            row = r1
        if row < shape[1]:
            parts.append(q.new_zeros(shape[:1] + (shape[1] - row,) + shape[2:]))
        return (parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)).transpose(1, 2)
    out = q.new_zeros(shape)
    for c in calls:
        part = interface.flash_attn_varlen_func(
            q[c.q_batch, c.q_row], k[c.k_batch, c.k_row], v[c.k_batch, c.k_row], c.cu_q, c.cu_k,
            c.max_q, c.max_k, dropout_p, scale, c.causal, deterministic=deterministic)
        out = out.index_put((c.q_batch, c.q_row), part)
    return out.transpose(1, 2)


class SdpaRoute(TorchFunctionMode):
    """The mode route() returns. routed: how many calls flashc ran; fallbacks: a Counter
    of the reasons of those torch's SDPA ran. Under torch.compile the calls are decided
    once, when a graph is traced, and only eager calls are counted."""

    def __init__(self):
        super().__init__()
        self.routed = 0
        self.fallbacks = collections.Counter()

    def _fallback(self, func, args, kwargs, reason):
        if not _compiling():
            if reason not in self.fallbacks:
                logger.info("torch's scaled_dot_product_attention runs a call: %s", reason)
            self.fallbacks[reason] += 1
        return func(*args, **kwargs)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not _TORCH_SDPA:
            return func(*args, **kwargs)
        try:
            reason = fallback_reason(*args, **kwargs)
        except TypeError:  # arguments SDPA does not take: torch's message says which
            return func(*args, **kwargs)
        if reason is not None:
            return self._fallback(func, args, kwargs, reason)
        if _compiling():
            return _flashc_sdpa(*args, **kwargs)
        try:
            out = _flashc_sdpa(*args, **kwargs)
        except _lib.FlashcError as e:
            if e.status != _lib.ERR_UNSUPPORTED:
                raise
            return self._fallback(func, args, kwargs, str(e))
        self.routed += 1
        return out


def route():
    """A context manager under which scaled_dot_product_attention calls that flashc
    supports run on flashc (module docstring). `with route() as r:` gives the SdpaRoute,
    whose routed and fallbacks count what happened."""
    return SdpaRoute()


# ---- python -m flashc.sdpa ----
_USAGE = "usage: python -m flashc.sdpa (script.py | -m module) [args ...]"


def main(argv=None):
    """Run a script (or -m module) as __main__ under route(), then print to stderr how
    many calls flashc ran and why the others fell back."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or (argv[0] == "-m" and len(argv) < 2):
        print(_USAGE, file=sys.stderr)
        return 2
    module = argv[1] if argv[0] == "-m" else None
    sys.argv = argv[1:] if module else argv
    if not module:
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
    with route() as r:
        try:
            if module:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(argv[0], run_name="__main__")
        finally:
            print("flashc.sdpa: %d scaled_dot_product_attention calls ran on flashc, %d on "
                  "torch%s" % (r.routed, sum(r.fallbacks.values()),
                               "".join("\n  %d: %s" % (n, why)
                                       for why, n in r.fallbacks.most_common())),
                  file=sys.stderr)
    return 0


if __name__ == "__main__":
    # the module imported as flashc.sdpa runs the script, so that the one the script
    # gets from `import flashc.sdpa` is the one whose route is on
    from flashc.sdpa import main as _main
    sys.exit(_main())
