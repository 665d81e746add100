"""flashc.flash_attn_interface : the names of flash_attn.flash_attn_interface, the module
most code imports flash_attn from.

    from flashc.flash_attn_interface import flash_attn_func, _flash_attn_forward

It holds the seven public functions (interface.py's) and the four private ops of
flash_attn 2.7/2.8 that integrators call directly (ring-flash-attn and the other
context-parallel wrappers built on it): one forward or one backward, with flash_attn's
parameter names, order, defaults and returns (Dao-AILab/flash-attention,
flash_attn/flash_attn_interface.py as of 2.8.3; earlier 2.7 releases have the same
lists without the varlen ops' zero_tensors):

    _flash_attn_forward(q, k, v, dropout_p, softmax_scale, causal, window_size_left,
                        window_size_right, softcap, alibi_slopes, return_softmax)
        -> out, softmax_lse, S_dmask, rng_state
    _flash_attn_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                               max_seqlen_k, dropout_p, softmax_scale, causal,
                               window_size_left=-1, window_size_right=-1, softcap=0.0,
                               alibi_slopes=None, return_softmax=False, block_table=None,
                               leftpad_k=None, seqused_k=None, zero_tensors=False)
        -> out, softmax_lse, S_dmask, rng_state
    _flash_attn_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p,
                         softmax_scale, causal, window_size_left, window_size_right,
                         softcap, alibi_slopes, deterministic, rng_state=None)
        -> softmax_d
    _flash_attn_varlen_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q,
                                cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                softmax_scale, causal, window_size_left, window_size_right,
                                softcap, alibi_slopes, deterministic, rng_state=None,
                                zero_tensors=False)
        -> softmax_d

_wrapped_flash_attn_forward and the three other _wrapped_ names are the same functions
(flash_attn's names for its ops as torch.ops.flashattn.*). They are plain Python
functions, so that inspect.signature and inspect.getfullargspec, which ring-flash-attn
reads to build its keyword arguments, see the parameter list. Each makes one C call
through interface.py's ops (flashc_fwd, flashc_varlen_fwd, flashc_bwd, flashc_varlen_bwd).

The returns, against flash_attn's:
- out of a forward called in grad mode is differentiable (interface.py's ops carry their
  backward; flash_attn's have none); context-parallel wrappers call the forward inside
  their own autograd.Function, where grad mode is off.
- out, softmax_lse: as flash_attn (lse fp32 [B, H, Sq], varlen [H, total_q]); out keeps
  the head dim as given (flash_attn pads it to a multiple of 8: flashc needs no padding).
- S_dmask: with return_softmax, the probabilities as flash_attn_func's
  return_attn_probs returns them (interface.py: fp32, not padded to multiples of 128,
  written on CPU tensors, and on CUDA tensors with dropout); without it an empty tensor
  of q's dtype, as flash_attn.
- rng_state: int64 [2] = (seed, offset) of flashc's dropout mask (include/flashc.h,
  "Dropout"), drawn as flash_attn_func draws them (interface._draw_rng), (0, 0) without
  dropout. It lives on the CPU: the library takes seed and offset as host values, so a
  backward handed it reads them without synchronising the device (flash_attn keeps it on
  the GPU). Given to a backward it regenerates the forward's mask; a backward with
  dropout and rng_state=None draws a new state, as flash_attn does (a mask that is not
  the forward's).
- the backward writes dq, dk, dv in place (any strides with a contiguous last dim, so
  views into a packed dqkv work; None allocates one, as flash_attn, that the caller then
  never sees) and accepts any out and softmax_lse, e.g. the merged ones of a ring
  attention: it recomputes the probabilities from softmax_lse and D = rowsum(dout * out).
  It returns softmax_d in flash_attn's layout, fp32 [B, H, round_up(Sq, 128)] (varlen
  [H, total_q + 128 B], sequence b from column cu_seqlens_q[b] + 128 b), holding
  (1 - dropout_p) * rowsum(dout * out), 0 in the padding; flashc computes it in torch
  (one more pass over dout and out), as the library keeps its own copy in its workspace.
- a row that sees exactly one key of the call gets dS = 0 only in bf16 and fp16, and only
  where its P, recomputed from softmax_lse, is at least 1 - 2^-10 (the forward's own lse
  gives 1: a softmax over one element); with a merged lse (the first query row of a
  causal ring attention's diagonal block) that drops a term at most 2^-10 of the row's
  scale, below those dtypes' rounding; fp32 applies the formula on every row
  (src/common/window.h, FC_ONE_KEY_P).
- zero_tensors: as flash_attn, the varlen forward's out rows past cu_seqlens_q[-1] are 0
  and their lse -inf (else they are left unwritten), and the varlen backward zeroes dq,
  dk, dv before it writes them.
- leftpad_k is not supported: the C varlen forward has no left padding (a non-None
  leftpad_k raises FlashcError, FLASHC_ERR_UNSUPPORTED; flash_attn_with_kvcache's
  cache_leftpad is the flashc way).
"""
import math
from typing import Optional, Tuple

import torch

from . import _lib
from .interface import (_BSHD, _THD, _bwd, _draw_rng, _fwd, _maybe_contiguous, _probs_written,
                        _rank, _row_sequences, _scale, _varlen_bwd, _varlen_fwd, _window,
                        flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                        flash_attn_varlen_func, flash_attn_varlen_kvpacked_func,
                        flash_attn_varlen_qkvpacked_func, flash_attn_with_kvcache)

__all__ = ["flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func",
           "flash_attn_varlen_func", "flash_attn_varlen_kvpacked_func",
           "flash_attn_varlen_qkvpacked_func", "flash_attn_with_kvcache",
           "_flash_attn_forward", "_flash_attn_varlen_forward", "_flash_attn_backward",
           "_flash_attn_varlen_backward", "_wrapped_flash_attn_forward",
           "_wrapped_flash_attn_varlen_forward", "_wrapped_flash_attn_backward",
           "_wrapped_flash_attn_varlen_backward"]

Tensor = torch.Tensor
# flash_attn pads softmax_d per sequence to whole blocks of this many query rows
_SOFTMAX_D_PAD = 128


# ---- the pieces the four ops share ----
def _check_ranks(fn, tensors, shapes):
    """interface._rank of each named tensor: a FlashcArgumentError naming op and tensor."""
    for name, t in tensors.items():
        _rank(fn, name, t, shapes)


def _mask(dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap):
    """The mask arguments of interface.py's ops, in their order, from flash_attn's."""
    left, right = _window((window_size_left, window_size_right))
    return (float(dropout_p), _scale(softmax_scale), bool(causal), left, right, float(softcap))


def _forward_returns(q, probs, return_softmax, seed, offset):
    """(S_dmask, rng_state) as flash_attn returns them."""
    s_dmask = probs if return_softmax else torch.empty((0,), dtype=q.dtype, device=q.device)
    return s_dmask, torch.tensor([seed, offset], dtype=torch.int64)


def _rng(rng_state, dropout_p, device, max_seqlen_k):
    """(seed, offset) for a backward: rng_state's, or without it a new draw (as
    flash_attn); (0, 0) without dropout."""
    if dropout_p <= 0:
        return 0, 0
    if rng_state is None:
        return _draw_rng(device, max_seqlen_k)
    return tuple(int(x) for x in rng_state.reshape(-1)[:2].tolist())


def _gradients(dq, dk, dv, q, k, v):
    """The caller's dq, dk, dv; a new tensor for each one that is None."""
    return tuple(torch.empty_like(t) if g is None else g for g, t in ((dq, q), (dk, k), (dv, v)))


def _row_dot(dout, out, dropout_p):
    """(1 - dropout_p) * rowsum(dout * out) in fp32, over the head dim: [..., H]. flash_attn's
    softmax_d keeps it scaled by the keep probability (csrc/flash_attn/src/
    flash_bwd_preprocess_kernel.h, dot_do_o with params.p_dropout = 1 - dropout_p)."""
    return torch.einsum("...hd,...hd->...h", dout.float(), out.float()) * (1.0 - dropout_p)


def _round_up(n, m):
    return (n + m - 1) // m * m


# ---- the ops ----
def _flash_attn_forward(q: Tensor, k: Tensor, v: Tensor, dropout_p: float, softmax_scale: float,
                        causal: bool, window_size_left: int, window_size_right: int,
                        softcap: float, alibi_slopes: Optional[Tensor], return_softmax: bool
                        ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """One batched forward: q (batch, seqlen_q, nheads, headdim), k, v (batch, seqlen_k,
    nheads_k, headdim). Returns out (like q), softmax_lse fp32 (batch, nheads, seqlen_q),
    S_dmask, rng_state (module docstring). softmax_scale None is 1/sqrt(headdim)."""
    _check_ranks("_flash_attn_forward", {"q": q, "k": k, "v": v}, {4: _BSHD})
    q, k, v = (_maybe_contiguous(t) for t in (q, k, v))
    seed, offset = _draw_rng(q.device, k.shape[1]) if dropout_p > 0 else (0, 0)
    out, lse, probs = _fwd(q, k, v, alibi_slopes,
                           *_mask(dropout_p, softmax_scale, causal, window_size_left,
                                  window_size_right, softcap),
                           _probs_written(q.device, dropout_p, return_softmax), seed, offset)
    return (out, lse) + _forward_returns(q, probs, return_softmax, seed, offset)


def _flash_attn_varlen_forward(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                               cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
                               dropout_p: float, softmax_scale: float, causal: bool,
                               window_size_left: int = -1, window_size_right: int = -1,
                               softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None,
                               return_softmax: bool = False,
                               block_table: Optional[Tensor] = None,
                               leftpad_k: Optional[Tensor] = None,
                               seqused_k: Optional[Tensor] = None, zero_tensors: bool = False
                               ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """One forward over packed sequences: q (total_q, nheads, headdim), k, v (total_k,
    nheads_k, headdim) or, with block_table (batch, max_blocks) int32, a paged cache
    (num_blocks, page_size, nheads_k, headdim); seqused_k int32 (batch,): keys used of
    each sequence. Returns out, softmax_lse fp32 (nheads, total_q), S_dmask, rng_state."""
    fn = "_flash_attn_varlen_forward"
    _check_ranks(fn, {"q": q}, {3: _THD})
    _check_ranks(fn, {"k": k, "v": v}, {3: _THD} if block_table is None else
                 {3: _THD, 4: "(num_blocks, page_size, nheads, headdim)"})
    if leftpad_k is not None:
        raise _lib.FlashcError(_lib.ERR_UNSUPPORTED, "%s: leftpad_k is not supported (the "
                               "varlen forward has no left padding; flash_attn_with_kvcache "
                               "has cache_leftpad)" % fn)
    q, k, v = (_maybe_contiguous(t) for t in (q, k, v))
    max_seqlen_q, max_seqlen_k = int(max_seqlen_q), int(max_seqlen_k)
    seed, offset = _draw_rng(q.device, max_seqlen_k) if dropout_p > 0 else (0, 0)
    out, lse, probs = _varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                  max_seqlen_k, block_table, seqused_k, alibi_slopes,
                                  *_mask(dropout_p, softmax_scale, causal, window_size_left,
                                         window_size_right, softcap),
                                  _probs_written(q.device, dropout_p, return_softmax), seed,
                                  offset)
    if zero_tensors:
        # rows past the last sequence, which the library leaves unwritten (judged on the
        # device: cu_seqlens_q is not read on the host)
        past = torch.arange(q.shape[0], device=q.device) >= cu_seqlens_q[-1].to(q.device)
        out.masked_fill_(past[:, None, None], 0.0)
        lse.masked_fill_(past[None, :], -math.inf)
    return (out, lse) + _forward_returns(q, probs, return_softmax, seed, offset)


def _flash_attn_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                         softmax_lse: Tensor, dq: Optional[Tensor], dk: Optional[Tensor],
                         dv: Optional[Tensor], dropout_p: float, softmax_scale: float,
                         causal: bool, window_size_left: int, window_size_right: int,
                         softcap: float, alibi_slopes: Optional[Tensor], deterministic: bool,
                         rng_state: Optional[Tensor] = None) -> Tensor:
    """The batched backward, into dq (like q), dk, dv (like k): dout, out like q,
    softmax_lse fp32 (batch, nheads, seqlen_q), any strides. Returns softmax_d fp32
    (batch, nheads, round_up(seqlen_q, 128))."""
    _check_ranks("_flash_attn_backward", {"dout": dout, "q": q, "k": k, "v": v, "out": out},
                 {4: _BSHD})
    dout, q, k, v, out, softmax_lse = (_maybe_contiguous(t)
                                       for t in (dout, q, k, v, out, softmax_lse))
    dq, dk, dv = _gradients(dq, dk, dv, q, k, v)
    seed, offset = _rng(rng_state, dropout_p, q.device, k.shape[1])
    _bwd(dout, q, k, v, out, softmax_lse, dq, dk, dv, alibi_slopes,
         *_mask(dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap),
         bool(deterministic), seed, offset, None, None)
    b, sq, h, _ = q.shape
    softmax_d = torch.zeros((b, h, _round_up(sq, _SOFTMAX_D_PAD)), dtype=torch.float32,
                            device=q.device)
    softmax_d[:, :, :sq] = _row_dot(dout, out, dropout_p).transpose(1, 2)
    return softmax_d


def _flash_attn_varlen_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                                softmax_lse: Tensor, dq: Optional[Tensor],
                                dk: Optional[Tensor], dv: Optional[Tensor],
                                cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int,
                                max_seqlen_k: int, dropout_p: float, softmax_scale: float,
                                causal: bool, window_size_left: int, window_size_right: int,
                                softcap: float, alibi_slopes: Optional[Tensor],
                                deterministic: bool, rng_state: Optional[Tensor] = None,
                                zero_tensors: bool = False) -> Tensor:
    """The backward over packed sequences (contiguous k, v), into dq (total_q, nheads,
    headdim), dk, dv (total_k, nheads_k, headdim); softmax_lse fp32 (nheads, total_q).
    Returns softmax_d fp32 (nheads, total_q + 128 * batch)."""
    _check_ranks("_flash_attn_varlen_backward",
                 {"dout": dout, "q": q, "k": k, "v": v, "out": out}, {3: _THD})
    dout, q, k, v, out, softmax_lse = (_maybe_contiguous(t)
                                       for t in (dout, q, k, v, out, softmax_lse))
    dq, dk, dv = _gradients(dq, dk, dv, q, k, v)
    if zero_tensors:
        for g in (dq, dk, dv):
            g.zero_()
    max_seqlen_q, max_seqlen_k = int(max_seqlen_q), int(max_seqlen_k)
    seed, offset = _rng(rng_state, dropout_p, q.device, max_seqlen_k)
    _varlen_bwd(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
                max_seqlen_q, max_seqlen_k, alibi_slopes,
                *_mask(dropout_p, softmax_scale, causal, window_size_left, window_size_right,
                       softcap),
                bool(deterministic), seed, offset, None, None)
    total, h, _ = q.shape
    batch = cu_seqlens_q.numel() - 1
    softmax_d = torch.zeros((h, total + _SOFTMAX_D_PAD * batch), dtype=torch.float32,
                            device=q.device)
    # row r of sequence b (cu_seqlens_q[b] <= r < cu_seqlens_q[b + 1]) goes to column
    # r + 128 b
    rows, seq = _row_sequences(cu_seqlens_q, total, q.device)
    softmax_d[:, rows + _SOFTMAX_D_PAD * seq] = _row_dot(dout, out, dropout_p).t()
    return softmax_d


_wrapped_flash_attn_forward = _flash_attn_forward
_wrapped_flash_attn_varlen_forward = _flash_attn_varlen_forward
_wrapped_flash_attn_backward = _flash_attn_backward
_wrapped_flash_attn_varlen_backward = _flash_attn_varlen_backward
