"""flashc.v3 : FlashAttention-3's Python interface on flashc.

    from flashc.v3 import flash_attn_func, flash_attn_varlen_func
    out = flash_attn_func(q, k, v, causal=True)            # FA3 returns out alone
    out, lse = flash_attn_func(q, k, v, return_attn_probs=True)

The public functions of FA3's hopper/flash_attn_interface.py (Dao-AILab/flash-attention,
commit 01afd16d248c4c7d0f9aed1914084f16c490eaed), with its parameter names, order,
defaults and returns, run by the same ops as flashc's flash_attn 2.x functions
(interface.py): the batched, packed and varlen functions are differentiable as those
are, the KV-cache function is forward only (as FA3's).

    flash_attn_func(q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None,
                    k_descale=None, v_descale=None, window_size=(-1, -1),
                    attention_chunk=0, softcap=0.0, num_splits=1, pack_gqa=None,
                    deterministic=False, sm_margin=0, return_attn_probs=False)
        -> out, or (out, softmax_lse) with return_attn_probs; lse fp32 (b, h, seqlen_q)
    flash_attn_qkvpacked_func(qkv, softmax_scale=None, causal=False, q_descale=None,
                              k_descale=None, v_descale=None, window_size=(-1, -1),
                              attention_chunk=0, softcap=0.0, deterministic=False,
                              num_heads_q=None, sm_margin=0, return_attn_probs=False)
        qkv (b, s, 3, h, d), or (b, s, h + 2 h_k, d) with num_heads_q = h; returns as above
    flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           seqused_q=None, seqused_k=None, softmax_scale=None, causal=False,
                           qv=None, q_descale=None, k_descale=None, v_descale=None,
                           window_size=(-1, -1), attention_chunk=0, softcap=0.0,
                           num_splits=1, pack_gqa=None, deterministic=False, sm_margin=0,
                           return_attn_probs=False)
        -> out, or (out, softmax_lse) with return_attn_probs; lse fp32 (h, total_q)
    flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, page_table=None, cu_seqlens_q=None,
                            cu_seqlens_k_new=None, max_seqlen_q=None, rotary_seqlens=None,
                            q_descale=None, k_descale=None, v_descale=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1),
                            attention_chunk=0, softcap=0.0, rotary_interleaved=True,
                            scheduler_metadata=None, num_splits=0, pack_gqa=None,
                            sm_margin=0, return_softmax_lse=False)
        -> out, or (out, softmax_lse, out_accum, softmax_lse_accum) with return_softmax_lse
    flash_attn_combine(out_partial, lse_partial, out=None, out_dtype=None)
        -> out, softmax_lse
    get_scheduler_metadata(batch_size, max_seqlen_q, max_seqlen_k, num_heads_q,
                           num_heads_kv, headdim, cache_seqlens, ...) -> None

Beyond FA3: the four attention functions take learnable_sink= (keyword only), learnable
attention sinks as flashc's 2.x functions take them ((nheads,), any floating dtype, differentiable; the
name FA4's interface uses), or the same tensor as s_aux= (the name of vLLM's FA3 build,
vllm_flash_attn, which transformers passes where a flash function's signature has it);
both at once raise FlashcArgumentError.

and FA3's private ops flash_attn_3::_flash_attn_forward and ::_flash_attn_backward, one
forward or one backward as Transformer Engine's context-parallel attention calls them
(transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py: q, k,
v and the arguments below positionally, causal, softmax_scale, window_size and
deterministic by keyword):

    _flash_attn_forward(q, k, v, k_new=None, v_new=None, qv=None, out_=None,
                        cu_seqlens_q=None, cu_seqlens_k=None, cu_seqlens_k_new=None,
                        seqused_q=None, seqused_k=None, max_seqlen_q=None,
                        max_seqlen_k=None, page_table=None, kv_batch_idx=None,
                        leftpad_k=None, rotary_cos=None, rotary_sin=None,
                        seqlens_rotary=None, q_descale=None, k_descale=None,
                        v_descale=None, softmax_scale=None, causal=False,
                        window_size_left=-1, window_size_right=-1, attention_chunk=0,
                        softcap=0.0, rotary_interleaved=True, scheduler_metadata=None,
                        num_splits=1, pack_gqa=None, sm_margin=0, *, window_size=None)
        -> out, softmax_lse, out_accum, softmax_lse_accum (the last two empty)
    _flash_attn_backward(dout, q, k, v, out, softmax_lse, cu_seqlens_q=None,
                         cu_seqlens_k=None, sequed_q=None, sequed_k=None,
                         max_seqlen_q=None, max_seqlen_k=None, dq=None, dk=None, dv=None,
                         softmax_scale=None, is_causal=False, window_size_left=-1,
                         window_size_right=-1, softcap=0.0, deterministic=False,
                         sm_margin=0, *, causal=None, window_size=None, returns=None)
        -> softmax_d, or (dq, dk, dv, softmax_d) with returns="grads"

Both run torch.library custom ops (torch >= 2.4), as FA3's flash_attn_3:: ops are:
flashc::v3_fwd (the batched and varlen forwards, their backward registered, so out is
differentiable) and flashc::v3_bwd (01afd16's backward list, dq, dk, dv declared mutated),
with fake implementations, so torch.compile(fullgraph=True) and torch.export trace a call
as one op even where flashc gathers rows by seqused; the KV-cache forward is
flashc::fwd_kvcache (the caches declared mutated), and out_ is written by out_.copy_(out)
after the op, which torch traces (FA3's fake raises for out_ under tracing).

What flashc does with FA3's arguments:
- window_size: a pair whose sides are ints (negative: unbounded) or None (unbounded, the
  encoding of FA3's later interfaces).
- seqused_q, seqused_k (int32 (b,)): only the first seqused[i] query rows / keys of
  sequence i are used, and the causal and window masks are aligned to those lengths, as
  in FA3. Done here by gathering the rows in use into packed tensors (cu_seqlens made
  from seqused, clamped to [0, the cu_seqlens length]) for one varlen call, then
  scattering the result back: query rows past seqused_q get out = 0 and lse = -inf (FA3
  leaves them unwritten) and zero gradients, keys past seqused_k zero gradients. The
  gather reads seqused on the host (a synchronisation on CUDA tensors).
- num_splits, pack_gqa, sm_margin, deterministic: accepted. The first three tune FA3's
  kernels and do not change its results; flashc schedules itself, except that
  flash_attn_with_kvcache passes num_splits to flashc_fwd_kvcache (0 = heuristic).
  deterministic selects flashc's deterministic backward.
- flash_attn_with_kvcache's return_softmax_lse returns FA3's four-tuple; flashc combines
  its splits inside the call, so out_accum and softmax_lse_accum are empty tensors, as
  FA3's are when it does not split.
- scheduler_metadata: get_scheduler_metadata returns None (flashc has no scheduler
  state to precompute) and None is accepted wherever FA3 takes it.
- flash_attn_combine: torch code, fp32 arithmetic (below).
- the private ops: the positional lists are 01afd16's; the keyword-only window_size (both
  ops) and causal (the backward; is_causal at 01afd16) are the names of FA3's releases
  before it, which Transformer Engine passes (window_size, a pair with None sides
  allowed, in place of window_size_left, window_size_right, not with them). The forward
  runs flash_attn_func's call for batched q, k, v, flash_attn_with_kvcache's with a KV-cache
  argument (k_new, v_new, page_table, kv_batch_idx = cache_batch_idx, leftpad_k =
  cache_leftpad, rotary_cos/sin, or seqused_k = cache_seqlens), flash_attn_varlen_func's
  with cu_seqlens_q and cu_seqlens_k (seqused_q, seqused_k as there); out_ receives out
  (a copy). Its out is differentiable where the call it runs is (not the KV-cache one);
  max_seqlen_q, max_seqlen_k are read only with cu_seqlens. The backward writes the
  caller's dq, dk, dv (any strides with a contiguous last dim; None: allocated, as FA3)
  from the caller's out and softmax_lse, e.g. a ring attention's merged ones, varlen
  with sequed_q/sequed_k as seqused (rows not in use get zero gradients). Its softmax_d
  is fp32 rowsum(dout * out) in FA3's padded layout, with flashc's block of 128 rows
  (FA3's depends on its kernel): (batch, nheads, round_up(seqlen_q, 128)), varlen
  (nheads, round_up(total_q + 128 batch, 128)) with sequence b from column
  round_down(cu_seqlens_q[b] + 128 b, 128), 0 in the padding; flashc computes it in torch.
  The backward's return: FA3 from 01afd16 returns softmax_d alone, its releases before
  returned (dq, dk, dv, softmax_d) (the same positional list but for causal in is_causal's
  place and a pair window_size in place of window_size_left, window_size_right, which
  flashc takes by keyword only). returns="grads" (a call) or BACKWARD_RETURNS = "grads"
  (the module, for code that unpacks four values) gives the four-tuple, dq, dk, dv being
  the caller's tensors or, for None, the allocated ones; Transformer Engine passes its own
  dq, dk, dv and reads no return, so either form serves it.
These raise FlashcArgumentError (a FlashcError and a ValueError) with status
FLASHC_ERR_UNSUPPORTED when not at their default, never ignored: qv, q_descale, k_descale,
v_descale (FP8), attention_chunk, a scheduler_metadata tensor, and in
flash_attn_with_kvcache cu_seqlens_q, cu_seqlens_k_new, max_seqlen_q and rotary_seqlens
(varlen queries and new keys: flashc's KV-cache entry is batched). flash_attn_varlen_func
takes cu_seqlens_q and cu_seqlens_k as tensors (FA3 also allows None with batched q). The
private ops raise likewise for those and their own: cu_seqlens_k_new, seqlens_rotary, one
of cu_seqlens_q, cu_seqlens_k without the other, the KV-cache arguments with cu_seqlens,
seqused_q (forward) and sequed_q, sequed_k (backward) with batched q.
"""
import math
from typing import Optional, Tuple

import torch

from . import _lib
from . import flash_attn_interface as _fa2_ops
from . import interface as _fa2

Tensor = torch.Tensor

__all__ = ["flash_attn_combine", "flash_attn_func", "flash_attn_qkvpacked_func",
           "flash_attn_varlen_func", "flash_attn_with_kvcache", "get_scheduler_metadata",
           "_flash_attn_forward", "_flash_attn_backward"]


# ---- arguments ----
def _unsupported(fn, when="", **given):
    """Raise for the first of `given` (name=value) that is not at FA3's default (None, or
    0 for attention_chunk); `when` says in which calls flashc does not support it."""
    for name, value in given.items():
        default = 0 if name == "attention_chunk" else None
        if value is None or (default == 0 and not isinstance(value, bool) and value == 0):
            continue
        raise _lib.FlashcArgumentError(
            _lib.ERR_UNSUPPORTED, "%s: %s=%s but flashc does not support it%s (only %r)" % (
                fn, name, "a tensor" if isinstance(value, torch.Tensor) else repr(value),
                when, default))


def _sink(fn, learnable_sink, s_aux):
    """The learnable sink under either keyword: learnable_sink (FA4's) or s_aux (vLLM's
    FA3 build's)."""
    if s_aux is None:
        return learnable_sink
    if learnable_sink is not None:
        _fa2._arg_error("%s: learnable_sink and s_aux are both given but name the same "
                        "tensor (the sink logits): pass one" % fn)
    return s_aux


def _window(window_size):
    """interface._window's (left, right) from FA3's window_size, whose sides may be None."""
    try:
        left, right = window_size
    except (TypeError, ValueError):
        _fa2._arg_error("window_size=%r but must be a pair (left, right) of ints or None"
                        % (window_size,))
    return _fa2._window((-1 if left is None else left, -1 if right is None else right))


def _returns(out, lse, return_attn_probs):
    return (out, lse) if return_attn_probs else out


# ---- the differentiable functions ----
def flash_attn_qkvpacked_func(qkv, softmax_scale=None, causal=False, q_descale=None,
                              k_descale=None, v_descale=None, window_size=(-1, -1),
                              attention_chunk=0, softcap=0.0, deterministic=False,
                              num_heads_q=None, sm_margin=0, return_attn_probs=False, *,
                              learnable_sink=None, s_aux=None):
    """flash_attn_func on qkv (batch, seqlen, 3, nheads, headdim), or with num_heads_q on
    qkv (batch, seqlen, num_heads_q + 2 * nheads_k, headdim) (q heads, then k, then v).
    Returns out, or (out, softmax_lse (batch, nheads, seqlen)) with return_attn_probs."""
    fn = "flash_attn_qkvpacked_func"
    learnable_sink = _sink(fn, learnable_sink, s_aux)
    _unsupported(fn, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
                 attention_chunk=attention_chunk)
    if num_heads_q is None:
        _fa2._rank(fn, "qkv", qkv, {5: "(batch, seqlen, 3, nheads, headdim)"})
        a, b, c, packing = qkv, None, None, "qkv"
    else:
        _fa2._rank(fn, "qkv", qkv, {4: "(batch, seqlen, nheads + 2 * nheads_k, headdim)"})
        hk, odd = divmod(qkv.shape[2] - num_heads_q, 2)
        if num_heads_q <= 0 or hk <= 0 or odd:
            _fa2._arg_error("%s: qkv.shape[2]=%d but must be num_heads_q=%d + 2 * nheads_k"
                            % (fn, qkv.shape[2], num_heads_q))
        (a, b, c), packing = qkv.split([num_heads_q, hk, hk], dim=2), ""
    out, lse, _ = _fa2._attention(packing, a, b, c, None, 0.0, _fa2._scale(softmax_scale),
                                  causal, _window(window_size), softcap, None, deterministic,
                                  False, learnable_sink)
    return _returns(out, lse, return_attn_probs)


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None,
                    k_descale=None, v_descale=None, window_size=(-1, -1), attention_chunk=0,
                    softcap=0.0, num_splits=1, pack_gqa=None, deterministic=False, sm_margin=0,
                    return_attn_probs=False, *, learnable_sink=None, s_aux=None):
    """Attention of q (batch, seqlen_q, nheads, headdim) over k, v (batch, seqlen_k,
    nheads_k, headdim), nheads % nheads_k == 0 (MQA/GQA). causal and window_size are
    aligned to the bottom-right corner: query i sees keys [i + seqlen_k - seqlen_q - left,
    i + seqlen_k - seqlen_q + right]; softcap > 0 replaces each score s by
    softcap * tanh(s / softcap). Returns out, or (out, softmax_lse (batch, nheads,
    seqlen_q) fp32) with return_attn_probs."""
    fn = "flash_attn_func"
    learnable_sink = _sink(fn, learnable_sink, s_aux)
    _unsupported(fn, qv=qv, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
                 attention_chunk=attention_chunk)
    for name, t in (("q", q), ("k", k), ("v", v)):
        _fa2._rank(fn, name, t, {4: _fa2._BSHD})
    out, lse, _ = _fa2._attention("", q, k, v, None, 0.0, _fa2._scale(softmax_scale), causal,
                                  _window(window_size), softcap, None, deterministic, False,
                                  learnable_sink)
    return _returns(out, lse, return_attn_probs)


def _used_rows(cu_seqlens, seqused, total):
    """(rows in use of a packed tensor of `total` rows, int32 cu_seqlens of those rows
    packed): the first seqused[i] rows of sequence i, seqused clamped to [0, its length]."""
    cu = cu_seqlens.long()
    lens = cu[1:] - cu[:-1]
    used = torch.minimum(seqused.to(cu.device).long().clamp(min=0), lens)
    rows, seq = _fa2._row_sequences(cu, total, cu.device)
    inside = seq < lens.numel()  # rows past cu_seqlens[-1] belong to no sequence
    seq = seq.clamp(max=max(lens.numel() - 1, 0))
    keep = inside & (rows - cu[seq] < used[seq]) if lens.numel() else inside
    idx = keep.nonzero().squeeze(1)
    new_cu = torch.cat([used.new_zeros(1), used.cumsum(0)]).to(torch.int32)
    return idx, new_cu


def _gather_used(cu_seqlens, seqused, *packed):
    """(rows in use or None, cu_seqlens of the rows in use, each of the `packed` tensors at
    those rows): with seqused None every row, the tensors and cu_seqlens as they are."""
    if seqused is None:
        return None, cu_seqlens, packed
    rows, new_cu = _used_rows(cu_seqlens, seqused, packed[0].shape[0])
    return rows, new_cu, tuple(t.index_select(0, rows) for t in packed)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           seqused_q=None, seqused_k=None, softmax_scale=None, causal=False,
                           qv=None, q_descale=None, k_descale=None, v_descale=None,
                           window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1,
                           pack_gqa=None, deterministic=False, sm_margin=0,
                           return_attn_probs=False, *, learnable_sink=None, s_aux=None):
    """Attention over sequences packed along the token axis: q (total_q, nheads, headdim),
    k, v (total_k, nheads_k, headdim), cu_seqlens_q, cu_seqlens_k int32 (batch + 1).
    seqused_q, seqused_k: optional int32 (batch,), the rows of each sequence in use (the
    module docstring says how). Masks as flash_attn_func's, per sequence. Returns out, or
    (out, softmax_lse (nheads, total_q) fp32) with return_attn_probs."""
    fn = "flash_attn_varlen_func"
    learnable_sink = _sink(fn, learnable_sink, s_aux)
    _unsupported(fn, qv=qv, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
                 attention_chunk=attention_chunk)
    for name, t in (("q", q), ("k", k), ("v", v)):
        _fa2._rank(fn, name, t, {3: _fa2._THD})
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(t, torch.Tensor):
            raise _lib.FlashcArgumentError(_lib.ERR_UNSUPPORTED, "%s: %s=%r but flashc takes "
                                           "it as an int32 tensor (batch + 1) (FA3's batched "
                                           "q without cu_seqlens: use flash_attn_func)"
                                           % (fn, name, t))
    window = _window(window_size)
    total_q = q.shape[0]
    rows_q, new_cu_q, (q,) = _gather_used(cu_seqlens_q, seqused_q, q)
    _, new_cu_k, (k, v) = _gather_used(cu_seqlens_k, seqused_k, k, v)
    varlen = (new_cu_q, new_cu_k, int(max_seqlen_q), int(max_seqlen_k), None)
    out, lse, _ = _fa2._attention("", q, k, v, varlen, 0.0, _fa2._scale(softmax_scale), causal,
                                  window, softcap, None, deterministic, False, learnable_sink)
    if rows_q is not None:  # scatter back: unused rows out = 0, lse = -inf
        out = out.new_zeros((total_q,) + tuple(out.shape[1:])).index_copy(0, rows_q, out)
        lse = lse.new_full((lse.shape[0], total_q), -math.inf).index_copy(1, rows_q, lse)
    return _returns(out, lse, return_attn_probs)


# ---- KV cache ----
def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, page_table=None, cu_seqlens_q=None,
                            cu_seqlens_k_new=None, max_seqlen_q=None, rotary_seqlens=None,
                            q_descale=None, k_descale=None, v_descale=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), attention_chunk=0, softcap=0.0,
                            rotary_interleaved=True, scheduler_metadata=None, num_splits=0,
                            pack_gqa=None, sm_margin=0, return_softmax_lse=False, *,
                            learnable_sink=None, s_aux=None):
    """flashc.flash_attn_with_kvcache with FA3's parameters: q (batch, seqlen, nheads,
    headdim) over k_cache, v_cache (batch_cache, seqlen_cache, nheads_k, headdim), or with
    page_table (batch, max_blocks) int32 paged (num_blocks, page_size, nheads_k,
    headdim); k, v (batch, seqlen_new, nheads_k, headdim) are first written into the cache
    in place at rows cache_seqlens[b] .., rotated by rotary_cos/sin when given.
    num_splits: 0 = flashc's heuristic, else the number of key splits. No backward.
    Returns out, or (out, softmax_lse (batch, nheads, seqlen) fp32, out_accum,
    softmax_lse_accum) with return_softmax_lse, the last two empty."""
    fn = "flash_attn_with_kvcache"
    learnable_sink = _sink(fn, learnable_sink, s_aux)
    _unsupported(fn, qv=qv, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k_new=cu_seqlens_k_new,
                 max_seqlen_q=max_seqlen_q, rotary_seqlens=rotary_seqlens, q_descale=q_descale,
                 k_descale=k_descale, v_descale=v_descale, attention_chunk=attention_chunk,
                 scheduler_metadata=scheduler_metadata)
    out, lse = _fa2.flash_attn_with_kvcache(
        q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
        cache_leftpad, page_table, softmax_scale, causal, _window(window_size), softcap,
        rotary_interleaved, None, num_splits, return_softmax_lse=True,
        learnable_sink=learnable_sink)
    return (out, lse) + _no_accum(out) if return_softmax_lse else out


def _no_accum(out):
    """FA3's out_accum and softmax_lse_accum of a call that did not split: empty tensors
    (flashc combines its splits inside the call)."""
    return torch.empty(0, device=out.device), torch.empty(0, device=out.device)


def get_scheduler_metadata(batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv,
                           headdim, cache_seqlens, qkv_dtype=torch.bfloat16, headdim_v=None,
                           cu_seqlens_q=None, cu_seqlens_k_new=None, cache_leftpad=None,
                           page_size=None, max_seqlen_k_new=0, causal=False,
                           window_size=(-1, -1), attention_chunk=0, has_softcap=False,
                           num_splits=0, pack_gqa=None, sm_margin=0):
    """FA3's precomputed tile schedule for flash_attn_with_kvcache. flashc schedules inside
    each call, so there is nothing to precompute: returns None, which
    flash_attn_with_kvcache(scheduler_metadata=...) accepts."""
    return None


# ---- the private ops' registered cores (torch.library custom ops) ----
# flashc::v3_fwd runs the differentiable forwards of _flash_attn_forward (batched q, k, v,
# or varlen with seqused_q, seqused_k) and carries its backward (register_autograd);
# flashc::v3_bwd is FA3's backward with 01afd16's argument list, writing dq, dk, dv in
# place (declared mutated). Being ops, torch.compile and torch.export see one call where
# the Python code gathers rows by data (seqused) or reads max_seqlen on the host; their
# fake implementations give the shapes. The KV-cache calls of _flash_attn_forward go
# through flashc::fwd_kvcache, which declares the caches mutated; out_ is written with
# out_.copy_(out) outside the op, a mutation torch traces as aten.copy_.
#
# q, k, v: (batch, seqlen, nheads(_k), headdim) or, with cu_seqlens_q and cu_seqlens_k,
# (total, nheads(_k), headdim). out: like q (v's head dim); lse: fp32 (batch, nheads,
# seqlen_q) or (nheads, total_q).
@_fa2._op("v3_fwd")
def _v3_fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Optional[Tensor],
            cu_seqlens_k: Optional[Tensor], seqused_q: Optional[Tensor],
            seqused_k: Optional[Tensor], max_seqlen_q: Optional[int],
            max_seqlen_k: Optional[int], softmax_scale: Optional[float], causal: bool,
            window_size_left: int, window_size_right: int, softcap: float,
            deterministic: bool = False) -> Tuple[Tensor, Tensor]:
    window = (window_size_left, window_size_right)
    if cu_seqlens_q is None:
        _unsupported("flashc::v3_fwd", " with batched q", seqused_q=seqused_q,
                     seqused_k=seqused_k)
        return flash_attn_func(q, k, v, softmax_scale, causal, window_size=window,
                               softcap=softcap, deterministic=deterministic,
                               return_attn_probs=True)
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                  max_seqlen_k, seqused_q, seqused_k, softmax_scale, causal,
                                  window_size=window, softcap=softcap,
                                  deterministic=deterministic, return_attn_probs=True)


@_fa2._fake(_v3_fwd)
def _v3_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q,
                 max_seqlen_k, softmax_scale, causal, window_size_left, window_size_right,
                 softcap, deterministic=False):
    lse = (q.shape[0], q.shape[2], q.shape[1]) if cu_seqlens_q is None else q.shape[1::-1]
    return _fa2._empty(tuple(q.shape[:-1]) + (v.shape[-1],), q), \
        _fa2._empty(lse, q, torch.float32)


def _v3_fwd_save(ctx, inputs, output):
    q, k, v, cu_q, cu_k, used_q, used_k = inputs[:7]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, used_q, used_k)
    ctx.rest = inputs[7:]  # max_seqlen_q, max_seqlen_k, scale, causal, left, right, softcap, det
    ctx.mark_non_differentiable(lse)


def _v3_fwd_backward(ctx, dout, _dlse):
    """The registered backward of flashc::v3_fwd: flashc::v3_bwd into new dq, dk, dv."""
    q, k, v, out, lse, cu_q, cu_k, used_q, used_k = ctx.saved_tensors
    max_q, max_k, scale, causal, left, right, softcap, deterministic = ctx.rest
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    _v3_bwd(dout, q, k, v, out, lse, cu_q, cu_k, used_q, used_k, max_q, max_k, dq, dk, dv,
            scale, causal, left, right, softcap, deterministic, 0)
    return (dq, dk, dv) + (None,) * 12


# dout, out like q; softmax_lse as v3_fwd's; dq, dk, dv like q, k, v, written in place
# (None: allocated here, and then not seen by the caller, as FA3's op). Returns softmax_d
# (_flash_attn_backward says its layout).
@_fa2._op("v3_bwd", mutates_args=("dq", "dk", "dv"))
def _v3_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, softmax_lse: Tensor,
            cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
            sequed_q: Optional[Tensor], sequed_k: Optional[Tensor],
            max_seqlen_q: Optional[int], max_seqlen_k: Optional[int], dq: Optional[Tensor],
            dk: Optional[Tensor], dv: Optional[Tensor], softmax_scale: Optional[float],
            is_causal: bool, window_size_left: int, window_size_right: int, softcap: float,
            deterministic: bool, sm_margin: int) -> Tensor:
    fn = "flashc::v3_bwd"
    mask = _fa2_ops._mask(0.0, softmax_scale, is_causal, window_size_left, window_size_right,
                          softcap)
    if not _is_varlen(fn, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
        _unsupported(fn, " with batched q", sequed_q=sequed_q, sequed_k=sequed_k)
        return _fa2_ops._flash_attn_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv,
                                             *mask, None, deterministic)
    _fa2_ops._check_ranks(fn, {"dout": dout, "q": q, "k": k, "v": v, "out": out},
                          {3: _fa2._THD})
    dout, q, k, v, out, softmax_lse = (_fa2._maybe_contiguous(t)
                                       for t in (dout, q, k, v, out, softmax_lse))
    dq, dk, dv = _fa2_ops._gradients(dq, dk, dv, q, k, v)
    rows_q, cu_q, (dout_u, q_u, out_u) = _gather_used(cu_seqlens_q, sequed_q, dout, q, out)
    rows_k, cu_k, (k_u, v_u) = _gather_used(cu_seqlens_k, sequed_k, k, v)
    lse_u = softmax_lse if rows_q is None else softmax_lse.index_select(1, rows_q)
    dq_u = dq if rows_q is None else torch.empty_like(q_u)
    dk_u, dv_u = (dk, dv) if rows_k is None else (torch.empty_like(k_u), torch.empty_like(v_u))
    _fa2._varlen_bwd(dout_u, q_u, k_u, v_u, out_u, lse_u, dq_u, dk_u, dv_u, cu_q, cu_k,
                     int(max_seqlen_q), int(max_seqlen_k), None, *mask, bool(deterministic),
                     0, 0, None, None)
    if rows_q is not None:  # the gradients of rows not in use are 0
        dq.zero_().index_copy_(0, rows_q, dq_u)
    if rows_k is not None:
        dk.zero_().index_copy_(0, rows_k, dk_u)
        dv.zero_().index_copy_(0, rows_k, dv_u)
    return _varlen_softmax_d(dout, out, cu_seqlens_q, rows_q)


@_fa2._fake(_v3_bwd)
def _v3_bwd_fake(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, sequed_q,
                 sequed_k, max_seqlen_q, max_seqlen_k, dq, dk, dv, softmax_scale, is_causal,
                 window_size_left, window_size_right, softcap, deterministic, sm_margin):
    block, round_up = _fa2_ops._SOFTMAX_D_PAD, _fa2_ops._round_up
    if cu_seqlens_q is None:
        b, sq, h, _ = q.shape
        return _fa2._empty((b, h, round_up(sq, block)), q, torch.float32)
    batch = cu_seqlens_q.shape[0] - 1
    return _fa2._empty((q.shape[1], round_up(q.shape[0] + block * batch, block)), q,
                       torch.float32)


if _fa2._CUSTOM_OP:
    _v3_fwd.register_autograd(_v3_fwd_backward, setup_context=_v3_fwd_save)


# ---- the private ops, as Transformer Engine calls them ----
def _sides(fn, window_size_left, window_size_right, window_size):
    """(left, right) from the private ops' window_size_left, window_size_right, or from
    window_size, the pair FA3's releases before 01afd16 took (and Transformer Engine
    passes); not both."""
    if window_size is None:
        return _window((window_size_left, window_size_right))
    if (window_size_left, window_size_right) != (-1, -1):
        _fa2._arg_error("%s: window_size=%r and window_size_left, window_size_right=%r, %r "
                        "are both given" % (fn, window_size, window_size_left,
                                            window_size_right))
    return _window(window_size)


def _is_varlen(fn, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    """Whether a private op's call is varlen (both cu_seqlens given, and then both
    max_seqlen) or batched (neither); one without the other raises (FA3 also pairs packed
    queries with batched keys)."""
    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        given, missing = ("q", "k") if cu_seqlens_k is None else ("k", "q")
        raise _lib.FlashcArgumentError(
            _lib.ERR_UNSUPPORTED, "%s: cu_seqlens_%s is given but cu_seqlens_%s=None: flashc "
            "takes q, k, v all packed (both given) or all batched (neither)"
            % (fn, given, missing))
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if cu_seqlens_q is not None and value is None:
            _fa2._arg_error("%s: %s=None but cu_seqlens_q, cu_seqlens_k need it" % (fn, name))
    return cu_seqlens_q is not None


def _flash_attn_forward(q, k, v, k_new=None, v_new=None, qv=None, out_=None, cu_seqlens_q=None,
                        cu_seqlens_k=None, cu_seqlens_k_new=None, seqused_q=None,
                        seqused_k=None, max_seqlen_q=None, max_seqlen_k=None, page_table=None,
                        kv_batch_idx=None, leftpad_k=None, rotary_cos=None, rotary_sin=None,
                        seqlens_rotary=None, q_descale=None, k_descale=None, v_descale=None,
                        softmax_scale=None, causal=False, window_size_left=-1,
                        window_size_right=-1, attention_chunk=0, softcap=0.0,
                        rotary_interleaved=True, scheduler_metadata=None, num_splits=1,
                        pack_gqa=None, sm_margin=0, *, window_size=None):
    """One forward, FA3's flash_attn_3::_flash_attn_forward (the module docstring has the
    list). Batched q, k, v (batch, seqlen, nheads, headdim) run flash_attn_func's call, or
    with a KV-cache argument (k_new, v_new, page_table, kv_batch_idx, leftpad_k, rotary,
    seqused_k as the cache lengths) flash_attn_with_kvcache's; with cu_seqlens_q and
    cu_seqlens_k, q (total_q, nheads, headdim), k, v (total_k, nheads_k, headdim) run
    flash_attn_varlen_func's (seqused_q, seqused_k as there). out_ (like q) receives out.
    Returns (out, softmax_lse fp32 (batch, nheads, seqlen_q) or (nheads, total_q),
    out_accum, softmax_lse_accum), the last two empty."""
    fn = "_flash_attn_forward"
    _unsupported(fn, qv=qv, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
                 attention_chunk=attention_chunk, scheduler_metadata=scheduler_metadata,
                 cu_seqlens_k_new=cu_seqlens_k_new, seqlens_rotary=seqlens_rotary)
    window = _sides(fn, window_size_left, window_size_right, window_size)
    cache = dict(k_new=k_new, v_new=v_new, page_table=page_table, kv_batch_idx=kv_batch_idx,
                 leftpad_k=leftpad_k, rotary_cos=rotary_cos, rotary_sin=rotary_sin)
    varlen = _is_varlen(fn, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    if varlen:
        _unsupported(fn, " with cu_seqlens_q, cu_seqlens_k", **cache)
        _fa2_ops._check_ranks(fn, {"q": q, "k": k, "v": v}, {3: _fa2._THD})
    else:
        _unsupported(fn, " with batched q", seqused_q=seqused_q)
        _fa2_ops._check_ranks(fn, {"q": q, "k": k, "v": v}, {4: _fa2._BSHD})
    if varlen or (seqused_k is None and all(t is None for t in cache.values())):
        out, lse = _v3_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k,
                           max_seqlen_q, max_seqlen_k, softmax_scale, causal, *window, softcap)
    else:
        out, lse, _, _ = flash_attn_with_kvcache(
            q, k, v, k_new, v_new, rotary_cos=rotary_cos, rotary_sin=rotary_sin,
            cache_seqlens=seqused_k, cache_batch_idx=kv_batch_idx, cache_leftpad=leftpad_k,
            page_table=page_table, softmax_scale=softmax_scale, causal=causal,
            window_size=window, softcap=softcap, rotary_interleaved=rotary_interleaved,
            num_splits=num_splits, return_softmax_lse=True)
    if out_ is not None:
        if out_.shape != out.shape or out_.dtype != out.dtype:
            _fa2._arg_error("%s: out_ is %s %s but must be %s %s" % (
                fn, out_.dtype, tuple(out_.shape), out.dtype, tuple(out.shape)))
        out = out_.copy_(out)
    return (out, lse) + _no_accum(out)


def _varlen_softmax_d(dout, out, cu_seqlens_q, rows):
    """FA3's softmax_d of a varlen backward, with blocks of 128 query rows: fp32 (nheads,
    round_up(total_q + 128 batch, 128)), rowsum(dout * out) of row i of sequence b at column
    round_down(cu_seqlens_q[b] + 128 b, 128) + i, for the rows `rows` (None: every row of a
    sequence), 0 elsewhere."""
    total, h = dout.shape[0], dout.shape[1]
    batch, block = cu_seqlens_q.numel() - 1, _fa2_ops._SOFTMAX_D_PAD
    every, seq = _fa2._row_sequences(cu_seqlens_q, total, dout.device)
    rows = every[seq < batch] if rows is None else rows
    seq = seq[rows]
    cu = cu_seqlens_q.to(device=dout.device, dtype=torch.int64)
    start = (cu[:-1] + block * torch.arange(batch, device=dout.device)) // block * block
    softmax_d = torch.zeros((h, _fa2_ops._round_up(total + block * batch, block)),
                            dtype=torch.float32, device=dout.device)
    dot = _fa2_ops._row_dot(dout[rows], out[rows], 0.0)  # (rows, nheads)
    softmax_d[:, start[seq] + rows - cu[seq]] = dot.t()
    return softmax_d


# What _flash_attn_backward returns when its call does not say (returns=None):
# "softmax_d", as FA3 from commit 01afd16 (hopper/flash_attn_interface.py registers the op
# flash_attn_3::_flash_attn_backward returning softmax_d alone), or "grads", the tuple
# (dq, dk, dv, softmax_d) of FA3's releases before it, for code that unpacks four values.
# Transformer Engine writes into its own dq, dk, dv and reads neither.
BACKWARD_RETURNS = "softmax_d"
_RETURNS = ("softmax_d", "grads")


def _flash_attn_backward(dout, q, k, v, out, softmax_lse, cu_seqlens_q=None, cu_seqlens_k=None,
                         sequed_q=None, sequed_k=None, max_seqlen_q=None, max_seqlen_k=None,
                         dq=None, dk=None, dv=None, softmax_scale=None, is_causal=False,
                         window_size_left=-1, window_size_right=-1, softcap=0.0,
                         deterministic=False, sm_margin=0, *, causal=None, window_size=None,
                         returns=None):
    """One backward, FA3's flash_attn_3::_flash_attn_backward (the module docstring has
    the list), into the caller's dq (like q), dk, dv (like k; None: allocated, as FA3),
    from any out and softmax_lse (those of the forward, or merged ones). Batched: tensors
    (batch, seqlen, nheads, headdim), lse (batch, nheads, seqlen_q); with cu_seqlens_q and
    cu_seqlens_k: (total, nheads, headdim), lse (nheads, total_q), and sequed_q, sequed_k
    the rows in use as flash_attn_varlen_func's seqused (the other rows get zero
    gradients). Runs flashc::v3_bwd. softmax_d is fp32, rowsum(dout * out) in FA3's padded
    layout with blocks of 128 rows: (batch, nheads, round_up(seqlen_q, 128)), varlen as
    _varlen_softmax_d says. Returns softmax_d, or with returns="grads" (dq, dk, dv,
    softmax_d) as FA3's releases before 01afd16; returns=None follows BACKWARD_RETURNS."""
    fn = "_flash_attn_backward"
    returns = BACKWARD_RETURNS if returns is None else returns
    if returns not in _RETURNS:
        _fa2._arg_error("%s: returns=%r but must be one of %s (or None: BACKWARD_RETURNS=%r)"
                        % (fn, returns, ", ".join(map(repr, _RETURNS)), BACKWARD_RETURNS))
    left, right = _sides(fn, window_size_left, window_size_right, window_size)
    if not _is_varlen(fn, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
        _unsupported(fn, " with batched q", sequed_q=sequed_q, sequed_k=sequed_k)
    dq, dk, dv = _fa2_ops._gradients(dq, dk, dv, q, k, v)
    softmax_d = _v3_bwd(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, sequed_q,
                        sequed_k, max_seqlen_q, max_seqlen_k, dq, dk, dv, softmax_scale,
                        bool(is_causal or causal), left, right, softcap, bool(deterministic),
                        sm_margin)
    return (dq, dk, dv, softmax_d) if returns == "grads" else softmax_d


# ---- combining split partials ----
def flash_attn_combine(out_partial, lse_partial, out=None, out_dtype=None):
    """Merge attention computed over disjoint key splits, by their lse.

    out_partial: fp32 (num_splits, batch, seqlen, nheads, headdim) (FA3's layout; any
        (num_splits, ..., headdim) is taken, e.g. varlen (num_splits, total, nheads,
        headdim))
    lse_partial: fp32 (num_splits, batch, seqlen, nheads), out_partial.shape[:-1]; a split
        that saw no key has lse -inf
    out: optional (batch, seqlen, nheads, headdim) tensor written and returned
    out_dtype: dtype of the new out (fp32, fp16 or bf16); default out_partial's

    lse = log sum_i exp(lse_i), out = sum_i exp(lse_i - lse) out_i, computed in fp32 with
    the largest lse_i subtracted first; rows where every split is -inf get out = 0 and
    lse = -inf. Returns (out, lse): lse fp32 of shape (batch, seqlen, nheads), as FA3's a
    transposed view of a contiguous (batch, nheads, seqlen) tensor."""
    fn = "flash_attn_combine"
    for name, t in (("out_partial", out_partial), ("lse_partial", lse_partial)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
            _fa2._arg_error("%s: %s must be a float32 torch.Tensor, got %s" % (
                fn, name, getattr(t, "dtype", type(t).__name__)))
    if out_partial.dim() < 3 or tuple(lse_partial.shape) != tuple(out_partial.shape[:-1]):
        _fa2._arg_error("%s: lse_partial.shape=%s but must be out_partial.shape[:-1]=%s "
                        "(num_splits, batch, seqlen, nheads)" % (
                            fn, tuple(lse_partial.shape), tuple(out_partial.shape[:-1])))
    dtype = out.dtype if out is not None and out_dtype is None else (out_dtype or torch.float32)
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        _fa2._arg_error("%s: out_dtype=%s but must be float32, float16 or bfloat16" % (fn, dtype))
    if out is not None and (out.dtype != dtype or tuple(out.shape) != tuple(out_partial.shape[1:])):
        _fa2._arg_error("%s: out is %s %s but must be %s %s" % (
            fn, out.dtype, tuple(out.shape), dtype, tuple(out_partial.shape[1:])))
    top = lse_partial.amax(dim=0)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))  # all -inf: 0
    w = torch.exp(lse_partial - top)  # (num_splits, ...) in [0, 1], 1 at the largest
    total = w.sum(dim=0)
    lse = torch.log(total) + top  # -inf where every split is -inf
    scale = torch.where(total > 0, w / total, torch.zeros_like(w))
    merged = (scale.unsqueeze(-1) * out_partial).sum(dim=0)
    if out_partial.dim() == 5:  # FA3's lse: (b, s, h) view of a (b, h, s) tensor
        lse = lse.transpose(1, 2).contiguous().transpose(1, 2)
    if out is None:
        return merged.to(dtype), lse
    out.copy_(merged)
    return out, lse
