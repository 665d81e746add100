"""flashc.flash_attn_2_cuda : flash_attn 2.x's compiled module, flash_attn_2_cuda, made of
flashc, for code that imports it directly.

Transformer Engine releases whose flash-attn range reaches 2.8.3 import
`from flash_attn_2_cuda import varlen_bwd as flash_attn_cuda_bwd` next to flash_attn's
private ops (transformer_engine/pytorch/attention/dot_product_attention/backends.py);
other integrators call fwd and varlen_fwd too. The shim folder's flash_attn_2_cuda
(python/flash_attn_shim) re-exports this module.

The five entry points of flash_attn 2.8.3's csrc/flash_attn/flash_api.cpp, with their
positional lists (the names are the C++ parameters'; a pybind function takes them by
position) and returns:

    fwd(q, k, v, out_, alibi_slopes_, p_dropout, softmax_scale, is_causal,
        window_size_left, window_size_right, softcap, return_softmax, gen_)
        -> [out, softmax_lse, S_dmask, rng_state]
    varlen_fwd(q, k, v, out_, cu_seqlens_q, cu_seqlens_k, seqused_k, leftpad_k_,
               block_table_, alibi_slopes_, max_seqlen_q, max_seqlen_k, p_dropout,
               softmax_scale, zero_tensors, is_causal, window_size_left, window_size_right,
               softcap, return_softmax, gen_)
        -> [out, softmax_lse, S_dmask, rng_state]
    bwd(dout, q, k, v, out, softmax_lse, dq_, dk_, dv_, alibi_slopes_, p_dropout,
        softmax_scale, is_causal, window_size_left, window_size_right, softcap,
        deterministic, gen_, rng_state)
        -> [dq, dk, dv, softmax_d]
    varlen_bwd(dout, q, k, v, out, softmax_lse, dq_, dk_, dv_, cu_seqlens_q, cu_seqlens_k,
               alibi_slopes_, max_seqlen_q, max_seqlen_k, p_dropout, softmax_scale,
               zero_tensors, is_causal, window_size_left, window_size_right, softcap,
               deterministic, gen_, rng_state)
        -> [dq, dk, dv, softmax_d]
    fwd_kvcache(q, kcache, vcache, k_, v_, seqlens_k_, rotary_cos_, rotary_sin_,
                cache_batch_idx_, leftpad_k_, block_table_, alibi_slopes_, out_,
                softmax_scale, is_causal, window_size_left, window_size_right, softcap,
                is_rotary_interleaved, num_splits)
        -> [out, softmax_lse]

Each is one call of flashc.flash_attn_interface's private op of the same kind (fwd and
bwd its _flash_attn_forward and _flash_attn_backward, ...; fwd_kvcache
flashc.flash_attn_with_kvcache), so the module docstring there says what S_dmask,
rng_state (flashc's (seed, offset), int64 on the CPU) and softmax_d hold. Here:
- out_ (the forwards): when given, out is written into it and it is returned.
- dq_, dk_, dv_ (the backwards): written in place when given, else allocated; either way
  returned, as flash_attn's C++ returns them.
- gen_ must be None: flashc draws its dropout seed from torch's default generator
  (interface._draw_rng); a generator raises FlashcArgumentError (FLASHC_ERR_UNSUPPORTED).
- leftpad_k_ in varlen_fwd raises FLASHC_ERR_UNSUPPORTED, as
  _flash_attn_varlen_forward's leftpad_k does.
The returns are tuples (pybind returns lists; both unpack alike).
"""
from . import _lib
from . import flash_attn_interface as _ops
from . import interface as _fa2

__all__ = ["bwd", "fwd", "fwd_kvcache", "varlen_bwd", "varlen_fwd"]


def _no_generator(fn, gen_):
    if gen_ is not None:
        raise _lib.FlashcArgumentError(
            _lib.ERR_UNSUPPORTED, "%s: gen_ is a generator but flashc draws its dropout seed "
            "from torch's default generator (only None)" % fn)


def _into(fn, out_, out):
    """out, or out written into the caller's out_ (its shape and dtype checked)."""
    if out_ is None:
        return out
    if out_.shape != out.shape or out_.dtype != out.dtype:
        _fa2._arg_error("%s: out_ is %s %s but must be %s %s" % (
            fn, out_.dtype, tuple(out_.shape), out.dtype, tuple(out.shape)))
    return out_.copy_(out)


def fwd(q, k, v, out_, alibi_slopes_, p_dropout, softmax_scale, is_causal, window_size_left,
        window_size_right, softcap, return_softmax, gen_):
    """One batched forward (module docstring): q (batch, seqlen_q, nheads, headdim), k, v
    (batch, seqlen_k, nheads_k, headdim)."""
    _no_generator("fwd", gen_)
    out, lse, s_dmask, rng_state = _ops._flash_attn_forward(
        q, k, v, p_dropout, softmax_scale, is_causal, window_size_left, window_size_right,
        softcap, alibi_slopes_, return_softmax)
    return _into("fwd", out_, out), lse, s_dmask, rng_state


def varlen_fwd(q, k, v, out_, cu_seqlens_q, cu_seqlens_k, seqused_k, leftpad_k_, block_table_,
               alibi_slopes_, max_seqlen_q, max_seqlen_k, p_dropout, softmax_scale,
               zero_tensors, is_causal, window_size_left, window_size_right, softcap,
               return_softmax, gen_):
    """One forward over packed sequences (module docstring): q (total_q, nheads, headdim),
    k, v (total_k, nheads_k, headdim) or paged with block_table_."""
    _no_generator("varlen_fwd", gen_)
    out, lse, s_dmask, rng_state = _ops._flash_attn_varlen_forward(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, p_dropout,
        softmax_scale, is_causal, window_size_left, window_size_right, softcap, alibi_slopes_,
        return_softmax, block_table_, leftpad_k_, seqused_k, zero_tensors)
    return _into("varlen_fwd", out_, out), lse, s_dmask, rng_state


def bwd(dout, q, k, v, out, softmax_lse, dq_, dk_, dv_, alibi_slopes_, p_dropout, softmax_scale,
        is_causal, window_size_left, window_size_right, softcap, deterministic, gen_,
        rng_state):
    """The batched backward into dq_, dk_, dv_ (None: allocated); returns them and
    softmax_d."""
    _no_generator("bwd", gen_)
    dq, dk, dv = _ops._gradients(dq_, dk_, dv_, q, k, v)
    softmax_d = _ops._flash_attn_backward(
        dout, q, k, v, out, softmax_lse, dq, dk, dv, p_dropout, softmax_scale, is_causal,
        window_size_left, window_size_right, softcap, alibi_slopes_, deterministic, rng_state)
    return dq, dk, dv, softmax_d


def varlen_bwd(dout, q, k, v, out, softmax_lse, dq_, dk_, dv_, cu_seqlens_q, cu_seqlens_k,
               alibi_slopes_, max_seqlen_q, max_seqlen_k, p_dropout, softmax_scale,
               zero_tensors, is_causal, window_size_left, window_size_right, softcap,
               deterministic, gen_, rng_state):
    """The backward over packed sequences into dq_, dk_, dv_ (None: allocated); returns
    them and softmax_d."""
    _no_generator("varlen_bwd", gen_)
    dq, dk, dv = _ops._gradients(dq_, dk_, dv_, q, k, v)
    softmax_d = _ops._flash_attn_varlen_backward(
        dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
        max_seqlen_k, p_dropout, softmax_scale, is_causal, window_size_left, window_size_right,
        softcap, alibi_slopes_, deterministic, rng_state, zero_tensors)
    return dq, dk, dv, softmax_d


def fwd_kvcache(q, kcache, vcache, k_, v_, seqlens_k_, rotary_cos_, rotary_sin_,
                cache_batch_idx_, leftpad_k_, block_table_, alibi_slopes_, out_, softmax_scale,
                is_causal, window_size_left, window_size_right, softcap, is_rotary_interleaved,
                num_splits):
    """flash_attn_with_kvcache's call (k_, v_ appended to the caches in place); returns
    out and softmax_lse fp32 (batch, nheads, seqlen_q)."""
    out, lse = _fa2.flash_attn_with_kvcache(
        q, kcache, vcache, k_, v_, rotary_cos_, rotary_sin_, seqlens_k_, cache_batch_idx_,
        leftpad_k_, block_table_, softmax_scale, is_causal,
        (window_size_left, window_size_right), softcap, is_rotary_interleaved, alibi_slopes_,
        num_splits, return_softmax_lse=True)
    return _into("fwd_kvcache", out_, out), lse
