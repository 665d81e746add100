"""flashc.interface : flash_attn 2.x's attention functions on torch tensors, run by libflashc.

The seven functions of flash_attn.flash_attn_interface, with its names, positional
order, defaults and returns. CPU tensors go to flashc's CPU backend, CUDA tensors to
its CUDA backend on torch.cuda.current_stream(); outputs and workspaces are
allocated by torch. The six differentiable functions save q, k, v, out, softmax_lse
and the dropout (seed, offset) of their forward, and the backward regenerates the
same dropout mask from them. On torch >= 2.4 each C entry point is a
torch.library.custom_op (flashc::fwd, ::varlen_fwd, ::bwd, ::varlen_bwd,
::fwd_kvcache) with a fake implementation, and the two forward ops carry their backward
(register_autograd), so that torch.compile and torch.export trace through them, the
backward included (tests/python/test_ops.py runs torch.library.opcheck on each). The
packed functions go through one torch.autograd.Function (_FlashAttnFunc) instead, to
return one gradient for qkv (kv), except while torch.export traces them, as do all
six on torch < 2.4. A forward call that none of that machinery would see (no input
requires grad under grad mode, no compiling or tracing, no torch function or dispatch
mode, no functorch transform, plain CPU or CUDA tensors: _direct) runs the op's Python
function itself (_call), without torch's custom-op dispatch, which took about half of the
time of a small decode call (bench/NOTES.md); the results are the op's, bit for bit. Such
a flash_attn_func or flash_attn_with_kvcache call that repeats an earlier call's signature
(shapes, strides, dtypes, device, options) reuses that call's args struct and params, only
its data pointers set anew (_Recipe: 51 -> 14 us a one-head KV-cache call on a 2-core VM).

Where flashc differs from flash_attn on purpose:
- head dims that are not a multiple of 8 are passed as they are: the library takes
  any head dim in 1..1024 on the CPU and 1..256 on CUDA (the CUDA backend zero-pads
  inside its workspace), so the
  copy flash_attn makes to pad q, k, v is not needed; results are the same.
- return_attn_probs returns (out, softmax_lse, probs). probs is fp32 [B, H, Sq, Sk]
  (varlen: [B, H, max_seqlen_q, max_seqlen_k]) without flash_attn's padding to
  multiples of 128: the softmax probabilities, 0 where masked or past a sequence,
  negative where dropout dropped the element, as flash_attn's S_dmask. On CUDA
  tensors they are written with dropout only, as flash_attn returns S_dmask only
  then, and without dropout probs is an empty tensor: code that passes
  return_attn_probs=True just to get softmax_lse, common with flash_attn, then
  allocates and computes no B H Sq Sk floats. CPU tensors get them with or without
  dropout. The negative entries are exactly the elements the call's forward
  dropped (every backend draws the same mask from the same seed and offset).
- a backward through flash_attn_varlen_func with block_table raises FlashcError
  (the C varlen backward has no paged layout; flash_attn has no such backward either).
- learnable_sink= (keyword only, after flash_attn 2's parameters, on every function):
  learnable attention sinks as gpt-oss uses them, (nheads,) of any floating dtype (the
  library reads fp32, fp16 and bf16 as they are; another, fp64, is cast to fp32), its
  gradient in its dtype, differentiable; the ops take it as their last argument (and the
  backward ops an fp32 dsink output after it).

As flash_attn and PyTorch do: window_size takes any pair of ints (negative or past
every sequence: unbounded; _window), softmax_scale=0.0 is a scale of 0 (every score 0,
uniform attention) and only None means 1/sqrt(headdim) (the library's default,
params.scale_given), and a NaN input propagates. The ranks of the tensors, a head dim
of 0 and integer tensors that are not int32 are rejected here, as FlashcArgumentError.

Tensors with no elements (batch 0, seqlen 0, total 0) have a NULL data pointer in
torch, which the library reads as an absent argument, so this module answers those
calls itself, as flash_attn does: without keys out = 0 and softmax_lse = +inf, the
backward's gradients are 0, and outputs with no elements are returned as they are
(_no_work). A KV-cache call with queries but an empty cache, or with no query but
new keys to append, still goes to the library, which raises FlashcArgumentError
(e.g. "k_cache.data is NULL").
"""
import ctypes
import inspect
import math
import numbers
import threading
from typing import Optional, Tuple

import torch

from . import _lib

Tensor = torch.Tensor
_CUSTOM_OP = hasattr(torch, "library") and hasattr(torch.library, "custom_op")
_C = torch._C
# what _direct asks torch; torch._C's functions are private: should one be missing from
# some torch, every call runs through the op
_DIRECT_CHECKS = _CUSTOM_OP and all(hasattr(m, f) for m, f in (
    (torch.compiler, "is_compiling"), (_C, "_len_torch_dispatch_stack"),
    (_C, "_is_torch_function_mode_enabled"), (_C, "_get_tracing_state"),
    (getattr(_C, "_functorch", None), "peek_interpreter_stack"),
    (torch.autograd.graph, "increment_version")))
# the tensor types a call may run directly with (_direct): torch.Tensor, and nn.Parameter
# (a model's learnable_sink or alibi_slopes, frozen weights), whose __torch_function__ is
# disabled, so that torch's dispatch treats it as a plain tensor. Not a subclass of either.
_PLAIN = (Tensor, torch.nn.Parameter)


# ---- registration as torch.library custom ops (torch >= 2.4) ----
# op -> (its Python function, the positions of the arguments it mutates), for _call
_IMPLS = {}


def _op(name, mutates_args=()):
    """fn as the custom op flashc::name when torch has custom_op, else fn itself."""
    def wrap(fn):
        if not _CUSTOM_OP:
            return fn
        op = torch.library.custom_op("flashc::" + name, fn, mutates_args=mutates_args)
        if _DIRECT_CHECKS:
            names = list(inspect.signature(fn).parameters)
            _IMPLS[op] = (fn, tuple(names.index(a) for a in mutates_args))
        return op
    return wrap


def _direct(args):
    """Whether a call of a forward op with `args` may run the op's Python function itself,
    without torch's dispatcher: nothing would see the difference. It may when torch is
    not compiling or tracing (torch.compile, torch.export's strict mode, torch.jit.trace),
    no torch function or dispatch mode is active (FakeTensorMode, make_fx's proxy mode,
    functionalization, FlopCounterMode, ...), no functorch transform (vmap, grad) is,
    every tensor argument is a plain torch.Tensor or nn.Parameter (_PLAIN; no subclass:
    FakeTensor, FunctionalTensor, DTensor) on the CPU or a CUDA device (the op answers
    meta tensors with its fake) and without a lazy negation (torch._neg_view: the
    dispatcher makes it real, its memory holds -x), and autograd records nothing (grad
    mode off, or no input requires grad). Otherwise the registered op runs, which all of
    those need."""
    if (torch.compiler.is_compiling() or _C._len_torch_dispatch_stack() or
            _C._is_torch_function_mode_enabled() or _C._get_tracing_state() is not None or
            _C._functorch.peek_interpreter_stack() is not None):
        return False
    grad = torch.is_grad_enabled()
    for a in args:
        if type(a) in _PLAIN:
            if not (a.is_cpu or a.is_cuda) or (grad and a.requires_grad) or a.is_neg():
                return False
        elif a is not None and isinstance(a, Tensor):
            return False
    return True


def _call(op, args):
    """op(*args) for a forward op (flashc::fwd, ::varlen_fwd, ::fwd_kvcache): its Python
    function itself where _direct allows, which skips torch's custom-op dispatch (about
    half of a decode call of one head over 16 keys, bench/NOTES.md), else the op.
    The direct call bumps the version counters of the arguments the op mutates, as the
    op's ADInplaceOrView kernel does, so that autograd still notices a tensor it saved
    being changed."""
    impl = _IMPLS.get(op)
    if impl is None or not _direct(args):
        return op(*args)
    fn, mutated = impl
    for i in mutated:
        torch.autograd.graph.increment_version(args[i])
    _built.last = None
    return fn(*args)


def _fake(op):
    """Register fn as op's fake (shape-only) implementation, used when tracing."""
    def wrap(fn):
        if _CUSTOM_OP:
            op.register_fake(fn)
        return fn
    return wrap


def _maybe_contiguous(x):
    # (a last dim of size 1 may keep any stride: torch's .contiguous() leaves it, and
    # the library takes it)
    return x.contiguous() if x is not None and x.stride(-1) != 1 and x.shape[-1] > 1 else x


def _fill(struct, **fields):
    """An args struct: tensors described, ints set as they are; None leaves the field
    absent as struct() made it (all zeros), which is what describe(None) gives."""
    a = struct()
    for name, value in fields.items():
        if value is None:
            continue
        if isinstance(value, int):
            setattr(a, name, value)
        else:
            _lib.describe_into(getattr(a, name), value, name)
    return a


def _run(entry, args, device, rename=None, **fields):
    """Call `entry` with flashc_params_default() + fields, on device's CUDA device (made
    current for the call where another one is). The args struct and params are left in
    _built.last for _Recipe.record (this thread's latest call)."""
    params = _lib.params(device, **fields)
    _built.last = (entry, args, params)
    _on_device(device, _lib.call, entry, args, params, device, rename)


# The args struct and params of this thread's latest library call through _run (a direct
# call empties it first): a prepared call's recording takes them as they are instead of
# filling another struct and params (~5 us of a call whose signature is new).
_built = threading.local()


def _on_device(device, fn, *args):
    """fn(*args) with device's CUDA device current (switched only where another is)."""
    if device.type == "cuda" and device.index is not None and \
            device.index != torch.cuda.current_device():
        with torch.cuda.device(device):
            return fn(*args)
    return fn(*args)


def _mask_params(dropout_p, softmax_scale, causal, window_left, window_right, softcap):
    """params fields; softmax_scale None is the library's default 1/sqrt(headdim), any
    number (0.0 included: uniform attention) is used as given; a window side of -1 is
    unbounded (flash_attn's encoding), and the library's windowed flag is set unless
    both are."""
    return dict(dropout_p=dropout_p, softmax_scale=0.0 if softmax_scale is None else softmax_scale,
                scale_given=int(softmax_scale is not None), causal=int(bool(causal)),
                windowed=int(window_left >= 0 or window_right >= 0),
                window_left=window_left, window_right=window_right, softcap=softcap)


# ---- arguments the Python layer checks (the library checks the rest) ----
_INT32_MAX = 2 ** 31 - 1


def _arg_error(message):
    raise _lib.FlashcArgumentError(_lib.ERR_INVALID_ARG, message)


def _window(window_size):
    """(left, right) for the library from flash_attn's window_size: any pair of ints;
    a negative side is unbounded (-1), and a side past every sequence (>= 2^31) is
    clamped to 2^31 - 1, which the library treats as unbounded too."""
    try:
        left, right = window_size
    except (TypeError, ValueError):
        _arg_error("window_size=%r but must be a pair (left, right) of ints" % (window_size,))
    sides = []
    for i, w in enumerate((left, right)):
        if isinstance(w, bool) or not isinstance(w, numbers.Integral):
            _arg_error("window_size[%d]=%r but must be an int (-1 = unbounded)" % (i, w))
        sides.append(-1 if w < 0 else min(int(w), _INT32_MAX))
    return tuple(sides)


def _scale(softmax_scale):
    """softmax_scale as a float, or None (the default)."""
    if softmax_scale is None:
        return None
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real):
        _arg_error("softmax_scale=%r but must be a number or None" % (softmax_scale,))
    return float(softmax_scale)


def _rank(fn, name, t, shapes):
    """t (possibly None) has the rank of one of `shapes` (e.g. {4: "(batch, seqlen,
    nheads, headdim)"}); its last dim, the head dim, is at least 1."""
    if t is None:
        return
    if not isinstance(t, torch.Tensor):
        _arg_error("%s: %s is a %s but must be a torch.Tensor" % (fn, name, type(t).__name__))
    if t.dim() not in shapes:
        _arg_error("%s: %s.dim()=%d but %s must be %s" % (
            fn, name, t.dim(), name, " or ".join(shapes[r] for r in sorted(shapes))))
    if t.shape[-1] == 0:
        _arg_error("%s: %s.shape[-1]=0 but the head dim must be >= 1" % (fn, name))


def _empty(shape, like, dtype=None):
    return like.new_empty(shape, dtype=dtype or like.dtype)


def _no_work(q, k, v, batched):
    """True if q and k agree in head dim, q, k, v in KV heads (and batch), but some of
    them hold no elements: nothing for the library to compute. v's head dim (Dv) may
    differ from q's and k's. A mismatch goes on to the library, which names it."""
    if q.numel() and k.numel() and v.numel():
        return False
    d, hk = q.shape[-1], k.shape[-2]
    return (d > 0 and hk > 0 and k.shape[-1] == d and v.shape[-1] > 0 and
            v.shape[:-1] == k.shape[:-1] and
            q.shape[-2] % hk == 0 and (not batched or q.shape[0] == k.shape[0]))


def _no_keys(out, lse, probs, sink=None, sink_view=None):
    """flash_attn's answer when no key exists: out = 0, softmax_lse = +inf; with a
    learnable sink lse is the sink's logit (the library's rule for a row without keys),
    sink viewed as sink_view to broadcast over lse."""
    if sink is not None and lse.numel():
        lse.copy_(sink.view(sink_view).expand_as(lse))
    else:
        lse.fill_(math.inf)
    return out.zero_(), lse, probs.zero_()


def _no_grads(dq, dk, dv, dsink=None):
    """The backward of a problem with nothing to compute: zero gradients."""
    for g in (dq, dk, dv, dsink):
        if g is not None:
            g.zero_()


# ---- the C entry points as ops ----
# q: [B, Sq, H, D]  k: [B, Sk, Hk, D]  v: [B, Sk, Hk, Dv]  out: [B, Sq, H, Dv]
# lse: [B, H, Sq] fp32 (Dv, v's head dim, may differ from D)
# probs: fp32 [B, H, Sq, Sk] when return_probs, else [0]
# deterministic (both forward ops): read only by their registered backward (_op_backward)
@_op("fwd")
def _fwd(q: Tensor, k: Tensor, v: Tensor, alibi_slopes: Optional[Tensor], dropout_p: float,
         softmax_scale: Optional[float], causal: bool, window_left: int, window_right: int,
         softcap: float, return_probs: bool, seed: int, offset: int, deterministic: bool = False,
         learnable_sink: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
    out, lse, probs = _fwd_fake(q, k, v, alibi_slopes, dropout_p, softmax_scale, causal,
                                window_left, window_right, softcap, return_probs, seed, offset)
    if _no_work(q, k, v, True):
        return _no_keys(out, lse, probs, learnable_sink, (1, -1, 1))
    args = _fill(_lib.FwdArgs, q=q, k=k, v=v, out=out, softmax_lse=lse,
                 alibi_slopes=alibi_slopes, attn_probs=probs if return_probs else None,
                 sink=learnable_sink)
    _run("flashc_fwd", args, q.device, dropout_seed=seed, dropout_offset=offset,
         **_mask_params(dropout_p, softmax_scale, causal, window_left, window_right, softcap))
    return out, lse, probs


@_fake(_fwd)
def _fwd_fake(q, k, v, alibi_slopes, dropout_p, softmax_scale, causal, window_left,
              window_right, softcap, return_probs, seed, offset, deterministic=False,
              learnable_sink=None):
    b, sq, h, _ = q.shape
    probs = (b, h, sq, k.shape[1]) if return_probs else (0,)
    return _empty((b, sq, h, v.shape[-1]), q), _empty((b, h, sq), q, torch.float32), \
        _empty(probs, q, torch.float32)


# q: [total_q, H, D]  k, v: [total_k, Hk, D or Dv] or paged [blocks, page, Hk, D or Dv]
# seqused_k: int32 [B] or None  out: [total_q, H, Dv]  lse: [H, total_q]
# probs: [B, H, max_seqlen_q, max_seqlen_k] or [0]
@_op("varlen_fwd")
def _varlen_fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                max_seqlen_q: int, max_seqlen_k: int, block_table: Optional[Tensor],
                seqused_k: Optional[Tensor], alibi_slopes: Optional[Tensor], dropout_p: float,
                softmax_scale: Optional[float], causal: bool, window_left: int,
                window_right: int, softcap: float, return_probs: bool, seed: int, offset: int,
                deterministic: bool = False, learnable_sink: Optional[Tensor] = None
                ) -> Tuple[Tensor, Tensor, Tensor]:
    out, lse, probs = _varlen_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                       max_seqlen_k, block_table, seqused_k, alibi_slopes,
                                       dropout_p, softmax_scale, causal, window_left,
                                       window_right, softcap, return_probs, seed, offset)
    if _no_work(q, k, v, False):
        return _no_keys(out, lse, probs, learnable_sink, (-1, 1))
    args = _fill(_lib.VarlenFwdArgs, q=q, k=k, v=v, out=out, cu_seqlens_q=cu_seqlens_q,
                 cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                 max_seqlen_k=max_seqlen_k, seqused_k=seqused_k, block_table=block_table,
                 softmax_lse=lse, alibi_slopes=alibi_slopes,
                 attn_probs=probs if return_probs else None, sink=learnable_sink)
    _run("flashc_varlen_fwd", args, q.device, dropout_seed=seed, dropout_offset=offset,
         **_mask_params(dropout_p, softmax_scale, causal, window_left, window_right, softcap))
    return out, lse, probs


@_fake(_varlen_fwd)
def _varlen_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                     block_table, seqused_k, alibi_slopes, dropout_p, softmax_scale, causal,
                     window_left, window_right, softcap, return_probs, seed, offset,
                     deterministic=False, learnable_sink=None):
    total, h, _ = q.shape
    probs = (cu_seqlens_q.shape[0] - 1, h, max_seqlen_q, max_seqlen_k) if return_probs else (0,)
    return _empty((total, h, v.shape[-1]), q), _empty((h, total), q, torch.float32), \
        _empty(probs, q, torch.float32)


# shapes as _fwd (dout like out); dq, dk, dv (like q, k, v) are written in place, and dsink (fp32 [H],
# only with learnable_sink) when given
# (learnable_sink and dsink have no defaults: torch 2.11 drops arguments equal to their defaults
# before it bumps the versions of mutated ones, and a dropped dsink raised IndexError there)
@_op("bwd", mutates_args=("dq", "dk", "dv", "dsink"))
def _bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, softmax_lse: Tensor,
         dq: Tensor, dk: Tensor, dv: Tensor, alibi_slopes: Optional[Tensor], dropout_p: float,
         softmax_scale: Optional[float], causal: bool, window_left: int, window_right: int,
         softcap: float, deterministic: bool, seed: int, offset: int,
         learnable_sink: Optional[Tensor], dsink: Optional[Tensor]) -> None:
    if _no_work(q, k, v, True):
        return _no_grads(dq, dk, dv, dsink)
    args = _fill(_lib.BwdArgs, dout=dout, q=q, k=k, v=v, out=out, softmax_lse=softmax_lse,
                 dq=dq, dk=dk, dv=dv, alibi_slopes=alibi_slopes, sink=learnable_sink,
                 dsink=dsink)
    _run("flashc_bwd", args, q.device, dropout_seed=seed, dropout_offset=offset,
         deterministic=int(bool(deterministic)),
         **_mask_params(dropout_p, softmax_scale, causal, window_left, window_right, softcap))


# shapes as _varlen_fwd (contiguous k, v only); dq, dk, dv (and dsink) written in place
@_op("varlen_bwd", mutates_args=("dq", "dk", "dv", "dsink"))
def _varlen_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                softmax_lse: Tensor, dq: Tensor, dk: Tensor, dv: Tensor,
                cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int,
                max_seqlen_k: int, alibi_slopes: Optional[Tensor], dropout_p: float,
                softmax_scale: Optional[float], causal: bool, window_left: int, window_right: int,
                softcap: float, deterministic: bool, seed: int, offset: int,
                learnable_sink: Optional[Tensor], dsink: Optional[Tensor]) -> None:
    if _no_work(q, k, v, False):
        return _no_grads(dq, dk, dv, dsink)
    args = _fill(_lib.VarlenBwdArgs, dout=dout, q=q, k=k, v=v, out=out,
                 softmax_lse=softmax_lse, dq=dq, dk=dk, dv=dv, cu_seqlens_q=cu_seqlens_q,
                 cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                 max_seqlen_k=max_seqlen_k, alibi_slopes=alibi_slopes, sink=learnable_sink,
                 dsink=dsink)
    _run("flashc_varlen_bwd", args, q.device, dropout_seed=seed, dropout_offset=offset,
         deterministic=int(bool(deterministic)),
         **_mask_params(dropout_p, softmax_scale, causal, window_left, window_right, softcap))


# q: [B, Sq, H, D]  k_cache, v_cache: [B_c, S_c, Hk, D or Dv] or paged, updated in place
# (k, v: [B, S_new, Hk, D or Dv])  out: [B, Sq, H, Dv]  lse: [B, H, Sq] fp32
@_op("fwd_kvcache", mutates_args=("k_cache", "v_cache"))
def _fwd_kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Optional[Tensor],
                 v: Optional[Tensor], rotary_cos: Optional[Tensor],
                 rotary_sin: Optional[Tensor], cache_seqlens: Optional[Tensor],
                 cache_batch_idx: Optional[Tensor], cache_leftpad: Optional[Tensor],
                 block_table: Optional[Tensor], alibi_slopes: Optional[Tensor],
                 softmax_scale: Optional[float], causal: bool, window_left: int, window_right: int,
                 softcap: float, rotary_interleaved: bool, num_splits: int,
                 learnable_sink: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    out, lse = _fwd_kvcache_fake(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
                                 cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                                 alibi_slopes, softmax_scale, causal, window_left,
                                 window_right, softcap, rotary_interleaved, num_splits)
    if q.numel() == 0 and (k is None or k.numel() == 0):
        return out, lse  # no query and nothing to append: out and lse hold no elements
    args = _fill(_lib.KvcacheArgs, q=q, k_cache=k_cache, v_cache=v_cache, k_new=k, v_new=v,
                 rotary_cos=rotary_cos, rotary_sin=rotary_sin, cache_seqlens=cache_seqlens,
                 cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad,
                 block_table=block_table, alibi_slopes=alibi_slopes, out=out,
                 softmax_lse=lse, sink=learnable_sink)
    _run("flashc_fwd_kvcache", args, q.device, rename=_KV_RENAME,
         **_kv_fields(softmax_scale, causal, window_left, window_right, softcap,
                      rotary_interleaved, num_splits))
    return out, lse


# the C names of the KV-cache call's appended rows, as its Python caller names them
_KV_RENAME = {"k_new": "k", "v_new": "v"}


def _kv_fields(softmax_scale, causal, window_left, window_right, softcap, rotary_interleaved,
               num_splits):
    """The params fields of a KV-cache call."""
    return dict(rotary_halves=int(not rotary_interleaved), num_splits=num_splits,
                **_mask_params(0.0, softmax_scale, causal, window_left, window_right, softcap))


@_fake(_fwd_kvcache)
def _fwd_kvcache_fake(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                      cache_batch_idx, cache_leftpad, block_table, alibi_slopes,
                      softmax_scale, causal, window_left, window_right, softcap,
                      rotary_interleaved, num_splits, learnable_sink=None):
    b, sq, h, _ = q.shape
    return _empty((b, sq, h, v_cache.shape[-1]), q), _empty((b, h, sq), q, torch.float32)


# ---- dropout RNG ----
def _draw_rng(device, max_seqlen_k):
    """(seed, offset) for one call with dropout, from torch's default generator of
    `device`. On CUDA it is the Philox state (initial seed, offset) of the device's
    generator, whose offset is advanced past the counters this call uses, so that
    torch.cuda.manual_seed makes the masks reproducible without a host sync. On the
    CPU (and CUDA generators without get_offset) a seed is drawn from the CPU
    generator, so torch.manual_seed makes them reproducible."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        gen = torch.cuda.default_generators[index]
        if hasattr(gen, "get_offset"):
            offset = gen.get_offset()
            # flashc uses counters offset .. offset + ceil(Sk / 8); torch's offsets step by 4
            gen.set_offset(offset + ((max_seqlen_k + 7) // 8 + 3) // 4 * 4)
            return gen.initial_seed() & (2 ** 63 - 1), offset
    return int(torch.randint(0, 2 ** 62, (1,)).item()), 0


def _probs_written(device, dropout_p, return_probs):
    """Whether the library is asked for the probabilities: where return_probs asks for
    them, on the CPU always, on CUDA only with dropout; without dropout a CUDA call
    returns them empty, as flash_attn does (its callers that want only softmax_lse pass
    return_attn_probs=True too: no O(Sq Sk) tensor for them)."""
    return return_probs and (device.type == "cpu" or dropout_p > 0)


# ---- autograd ----
def _split(packing, a, b, c, axis):
    """q, k, v from (q, k, v), (qkv) or (q, kv); the packed axis is `axis`."""
    a, b, c = (_maybe_contiguous(t) for t in (a, b, c))
    if packing == "qkv":
        return a.select(axis, 0), a.select(axis, 1), a.select(axis, 2)
    if packing == "kv":
        return a, b.select(axis, 0), b.select(axis, 1)
    return a, b, c


def _grad_buffers(packing, q, k, v, axis):
    """(gradients to return for a, b, c), (dq, dk, dv views into them)."""
    def empty(t, n=0):
        shape = t.shape[:axis] + (n,) + t.shape[axis:] if n else t.shape
        return _empty(shape, t)
    if packing == "qkv":
        g = empty(q, 3)
        return (g, None, None), (g.select(axis, 0), g.select(axis, 1), g.select(axis, 2))
    dq = empty(q)
    if packing == "kv":
        g = empty(k, 2)
        return (dq, g, None), (dq, g.select(axis, 0), g.select(axis, 1))
    dk, dv = empty(k), empty(v)
    return (dq, dk, dv), (dq, dk, dv)


# The forward ops carry their backward (register_autograd), so that flashc::fwd and
# ::varlen_fwd are differentiable wherever they are called: eagerly, in a torch.compile
# graph, in a program from torch.export, whose strict mode runs an autograd.Function's
# forward under no_grad (its output would have no gradient). _FlashAttnFunc serves the
# packed functions outside torch.export, to return one gradient tensor for qkv (or kv) with
# dq, dk, dv written into views of it, as flash_attn does, and every function on torch
# < 2.4 (no custom ops). Both save and run the backward with _save and _backward_into.
def _save(ctx, inputs, output, varlen):
    """Save what the backward of one forward op call needs, from the op's inputs and
    outputs (the op's whole argument list); varlen: the op was flashc::varlen_fwd."""
    q, k, v = inputs[:3]
    (alibi_slopes, dropout_p, softmax_scale, causal, window_left, window_right, softcap, _,
     seed, offset, deterministic, learnable_sink) = inputs[-12:]
    cu_q, cu_k = inputs[3:5] if varlen else (None, None)
    out, lse, probs = output
    ctx.save_for_backward(q, k, v, out, lse, alibi_slopes, cu_q, cu_k, learnable_sink)
    # varlen: max_seqlen_q, max_seqlen_k, and whether block_table or seqused_k was given
    ctx.varlen = (inputs[5], inputs[6], inputs[7] is not None or inputs[8] is not None) \
        if varlen else None
    ctx.rest = (dropout_p, softmax_scale, causal, window_left, window_right, softcap,
                deterministic, seed, offset)
    ctx.n_inputs = len(inputs)
    ctx.mark_non_differentiable(lse, probs)


def _backward_into(ctx, dout, dq, dk, dv):
    """The backward of the forward call _save saved, written into dq, dk, dv; returns
    the gradient of the learnable sink (fp32 [H]), or None without one."""
    q, k, v, out, lse, alibi_slopes, cu_q, cu_k, sink = ctx.saved_tensors
    dout = _maybe_contiguous(dout)
    dsink = None if sink is None else _empty(sink.shape, sink, torch.float32)
    if ctx.varlen is None:
        _bwd(dout, q, k, v, out, lse, dq, dk, dv, alibi_slopes, *ctx.rest, sink, dsink)
    else:
        max_q, max_k, paged = ctx.varlen
        if paged:
            raise _lib.FlashcError(_lib.ERR_UNSUPPORTED, "flash_attn_varlen_func: no "
                                   "backward through a paged KV cache (block_table) or "
                                   "seqused_k")
        _varlen_bwd(dout, q, k, v, out, lse, dq, dk, dv, cu_q, cu_k, max_q, max_k,
                    alibi_slopes, *ctx.rest, sink, dsink)
    return dsink  # (fp32: autograd casts a gradient to its input's dtype, a 16-bit sink's)


def _op_backward(ctx, dout, _dlse, _dprobs):
    """The registered backward of flashc::fwd and ::varlen_fwd: the gradients of q, k, v
    and of learnable_sink, the ops' last argument."""
    dq, dk, dv = (torch.empty_like(t) for t in ctx.saved_tensors[:3])
    dsink = _backward_into(ctx, dout, dq, dk, dv)
    return (dq, dk, dv) + (None,) * (ctx.n_inputs - 4) + (dsink,)


if _CUSTOM_OP:
    _fwd.register_autograd(_op_backward, setup_context=lambda ctx, inputs, output:
                           _save(ctx, inputs, output, False))
    _varlen_fwd.register_autograd(_op_backward, setup_context=lambda ctx, inputs, output:
                                  _save(ctx, inputs, output, True))


def _forward_call(q, k, v, varlen, rng, dropout_p, softmax_scale, causal, window_size,
                  softcap, alibi_slopes, deterministic, return_probs, learnable_sink):
    """(op, its arguments) of one forward: flashc::fwd (varlen None) or ::varlen_fwd (varlen
    = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table)); rng: the
    dropout's (seed, offset)."""
    mask = (dropout_p, softmax_scale, causal, window_size[0], window_size[1], softcap)
    return_probs = _probs_written(q.device, dropout_p, return_probs)
    tail = (return_probs,) + rng + (deterministic, learnable_sink)
    if varlen is None:
        return _fwd, (q, k, v, alibi_slopes) + mask + tail
    return _varlen_fwd, (q, k, v) + tuple(varlen) + (None, alibi_slopes) + mask + tail


class _FlashAttnFunc(torch.autograd.Function):
    """flash attention forward and backward. packing: "" (q, k, v), "qkv" (qkv, None, None)
    or "kv" (q, kv, None); the other arguments as _forward_call's. Returns out, softmax_lse,
    probs (lse and probs not differentiable); the backward returns one gradient for a packed
    tensor."""

    @staticmethod
    def forward(ctx, packing, a, b, c, varlen, *rest):
        axis = 2 if varlen is None else 1
        op, inputs = _forward_call(*_split(packing, a, b, c, axis), varlen, *rest)
        output = op(*inputs)
        _save(ctx, inputs, output, varlen is not None)
        ctx.packing, ctx.axis = packing, axis
        return output

    @staticmethod
    def backward(ctx, dout, _dlse, _dprobs):
        grads, (dq, dk, dv) = _grad_buffers(ctx.packing, *ctx.saved_tensors[:3], ctx.axis)
        dsink = _backward_into(ctx, dout, dq, dk, dv)
        return (None,) + grads + (None,) * 10 + (dsink,)


def _exporting():
    """Whether torch.export is tracing the call (torch.compiler.is_exporting, torch >= 2.5)."""
    is_exporting = getattr(getattr(torch, "compiler", None), "is_exporting", None)
    return bool(is_exporting and is_exporting())


_SINK_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # the library's


def _sink_arg(sink):
    """The learnable sink as the library takes it: fp32, fp16 or bf16 as it is (the
    parameter of a bf16 model read in place, exactly); a sink of another floating dtype
    (fp64) through a differentiable cast to fp32, so its gradient comes back in its own
    dtype; a strided one (a column of a sinks-by-layer parameter) through a copy;
    anything else reaches the library, which says what is wrong with it."""
    if sink is None or not sink.is_floating_point():
        return sink
    sink = sink if sink.dtype in _SINK_DTYPES else sink.float()
    return _maybe_contiguous(sink) if sink.dim() else sink  # (0-dim: the library refuses)


def _attention(packing, a, b, c, varlen, dropout_p, softmax_scale, causal, window_size, softcap,
               alibi_slopes, deterministic, return_probs, learnable_sink=None):
    """out, softmax_lse, probs of q, k, v ("" packing) or of a packed qkv or kv (_split);
    the other arguments as _forward_call's. Differentiable (learnable_sink too, of any
    floating dtype: _sink_arg). The dropout's (seed, offset) is drawn here, outside
    _FlashAttnFunc, where torch.compile can trace it."""
    learnable_sink = _sink_arg(learnable_sink)
    rest = (softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
            return_probs, learnable_sink)
    max_k = (a if packing == "qkv" else b).shape[1] if varlen is None else varlen[3]
    rng = _draw_rng(a.device, max_k) if dropout_p > 0 else (0, 0)
    if not _CUSTOM_OP or (packing and not _exporting() and not _direct((a, b, c))):
        return _FlashAttnFunc.apply(packing, a, b, c, varlen, rng, dropout_p, *rest)
    op, inputs = _forward_call(*_split(packing, a, b, c, 2 if varlen is None else 1), varlen,
                               rng, dropout_p, *rest)
    return _call(op, inputs)


_BSHD = "(batch, seqlen, nheads, headdim)"
_THD = "(total, nheads, headdim)"


def _row_sequences(cu_seqlens, total, device):
    """(rows 0 .. total - 1, the sequence of each) of a packed tensor, on `device`, without
    reading cu_seqlens on the host: row r is in sequence b when cu_seqlens[b] <= r <
    cu_seqlens[b + 1], and rows past cu_seqlens[-1] get b = batch."""
    rows = torch.arange(total, device=device)
    return rows, torch.searchsorted(cu_seqlens[1:].to(device=device, dtype=torch.int64), rows,
                                    right=True)


def _attn(fn, packing, a, b, c, varlen, dropout_p, softmax_scale, causal, window_size, softcap,
          alibi_slopes, deterministic, return_attn_probs, learnable_sink):
    key = None
    if not packing and varlen is None and type(dropout_p) in (int, float) and not dropout_p:
        tensors = (a, b, c, alibi_slopes, learnable_sink)
        key = _FWD_PREPARED.signature(tensors, (dropout_p, softmax_scale, causal, window_size,
                                                softcap, deterministic, return_attn_probs))
        entry = _prepared.get(key) if key is not None else None
        if entry is not None:
            made = _FWD_PREPARED.call(entry, tensors)
            return tuple(made) if return_attn_probs else made[0]
    if packing == "qkv":
        _rank(fn, "qkv", a, {5: "(batch, seqlen, 3, nheads, headdim)"} if varlen is None else
              {4: "(total, 3, nheads, headdim)"})
    else:
        _rank(fn, "q", a, {4: _BSHD} if varlen is None else {3: _THD})
        if packing == "kv":
            _rank(fn, "kv", b, {5: "(batch, seqlen, 2, nheads, headdim)"} if varlen is None else
                  {4: "(total, 2, nheads, headdim)"})
        else:
            shapes = ({4: _BSHD} if varlen is None else
                      {3: _THD} if varlen[4] is None else
                      {3: _THD, 4: "(num_blocks, page_size, nheads, headdim)"})
            _rank(fn, "k", b, shapes)
            _rank(fn, "v", c, shapes)
    softmax_scale, window_size = _scale(softmax_scale), _window(window_size)
    out, lse, probs = _attention(packing, a, b, c, varlen, dropout_p, softmax_scale, causal,
                                 window_size, softcap, alibi_slopes, deterministic,
                                 return_attn_probs, learnable_sink)
    if key is not None and not _no_work(a, b, c, True):
        outputs = (("out", out),)
        if return_attn_probs:
            written = _probs_written(a.device, dropout_p, True)
            outputs += (("softmax_lse", lse), ("attn_probs" if written else None, probs))
        _FWD_PREPARED.record(key, tensors, outputs)
    return (out, lse, probs) if return_attn_probs else out


# ---- flash_attn's functions ----
_COMMON_DOC = """
    dropout_p: probability of dropping an attention probability (0.0 in evaluation).
    softmax_scale: scale of QK^T before the softmax; default 1 / sqrt(headdim).
    causal: causal mask aligned to the bottom-right corner (key j visible to query i
        iff j <= i + seqlen_k - seqlen_q).
    window_size: (left, right), -1 = unbounded: query i sees keys
        [i + seqlen_k - seqlen_q - left, i + seqlen_k - seqlen_q + right].
    softcap: > 0 replaces each score s by softcap * tanh(s / softcap).
    alibi_slopes: fp32 (nheads,) or (batch, nheads); adds -slope * |i + seqlen_k - seqlen_q - j|.
    deterministic: bitwise-reproducible backward.
    learnable_sink: keyword only (a flashc extension: flash_attn 2's positional
        parameters stay as they are); (nheads,) of a floating dtype (fp32, fp16 and bf16
        read as they are; a bf16 sink, a bf16 model's parameter, gets its gradient in
        bf16), learnable attention
        sinks (gpt-oss): head h gets one more logit s_h in the softmax's denominator
        that takes no value, so out_i = sum_j e^{x_ij} v_j / (e^{s_h} + sum_j e^{x_ij})
        and softmax_lse includes it; a row without keys gets out 0 and lse s_h. Dropout drops the keys' probabilities only.
        Differentiable (its gradient is -sum_i e^{s_h - lse_i} dout_i . out_i).
    return_attn_probs: also return softmax_lse (fp32) and the probabilities (fp32,
        negative where dropped; written on CPU tensors, and on CUDA tensors with dropout,
        else empty, as flash_attn's). For tests.
    Returns out, or (out, softmax_lse, probs) with return_attn_probs."""


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False, *, learnable_sink=None):
    return _attn("flash_attn_func", "", q, k, v, None, dropout_p, softmax_scale, causal, window_size, softcap,
                 alibi_slopes, deterministic, return_attn_probs, learnable_sink)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False, *, learnable_sink=None):
    return _attn("flash_attn_qkvpacked_func", "qkv", qkv, None, None, None, dropout_p, softmax_scale, causal, window_size,
                 softcap, alibi_slopes, deterministic, return_attn_probs, learnable_sink)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False, *, learnable_sink=None):
    return _attn("flash_attn_kvpacked_func", "kv", q, kv, None, None, dropout_p, softmax_scale, causal, window_size,
                 softcap, alibi_slopes, deterministic, return_attn_probs, learnable_sink)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False,
                           window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None, *,
                           learnable_sink=None):
    varlen = (cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), block_table)
    return _attn("flash_attn_varlen_func", "", q, k, v, varlen, dropout_p, softmax_scale, causal, window_size, softcap,
                 alibi_slopes, deterministic, return_attn_probs, learnable_sink)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=(-1, -1),
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False, *, learnable_sink=None):
    varlen = (cu_seqlens, cu_seqlens, int(max_seqlen), int(max_seqlen), None)
    return _attn("flash_attn_varlen_qkvpacked_func", "qkv", qkv, None, None, varlen, dropout_p, softmax_scale, causal, window_size,
                 softcap, alibi_slopes, deterministic, return_attn_probs, learnable_sink)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, dropout_p=0.0, softmax_scale=None,
                                    causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False,
                                    return_attn_probs=False, *, learnable_sink=None):
    varlen = (cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), None)
    return _attn("flash_attn_varlen_kvpacked_func", "kv", q, kv, None, varlen, dropout_p, softmax_scale, causal, window_size,
                 softcap, alibi_slopes, deterministic, return_attn_probs, learnable_sink)


flash_attn_func.__doc__ = """Attention of q (batch, seqlen_q, nheads, headdim) over k, v
    (batch, seqlen_k, nheads_k, headdim), nheads % nheads_k == 0 (MQA/GQA). v's head dim
    may differ from q's and k's (DeepSeek MLA: 192 and 128; here and in the varlen and
    kvcache functions, CPU and CUDA tensors): out then has v's.""" + _COMMON_DOC
flash_attn_qkvpacked_func.__doc__ = """flash_attn_func on qkv (batch, seqlen, 3, nheads,
    headdim); the gradient is one (batch, seqlen, 3, nheads, headdim) tensor.""" + _COMMON_DOC
flash_attn_kvpacked_func.__doc__ = """flash_attn_func on q and kv (batch, seqlen_k, 2,
    nheads_k, headdim).""" + _COMMON_DOC
flash_attn_varlen_func.__doc__ = """Attention over sequences packed along the token axis:
    q (total_q, nheads, headdim), k, v (total_k, nheads_k, headdim), or with block_table
    (batch, max_blocks) int32 a paged cache (num_blocks, page_size, nheads_k, headdim);
    cu_seqlens_q, cu_seqlens_k int32 (batch + 1); softmax_lse (nheads, total_q).""" + _COMMON_DOC
flash_attn_varlen_qkvpacked_func.__doc__ = """flash_attn_varlen_func on qkv (total, 3,
    nheads, headdim) with one cu_seqlens and max_seqlen.""" + _COMMON_DOC
flash_attn_varlen_kvpacked_func.__doc__ = """flash_attn_varlen_func on q and kv (total_k,
    2, nheads_k, headdim).""" + _COMMON_DOC


# ---- prepared calls: flash_attn_func and flash_attn_with_kvcache ----
# An inference loop makes the same call every step but for the tensors' data. The first
# call of a signature (every tensor's shape, strides, dtype and device, and every option)
# goes the whole way: the checks here, the op's function, _fill, params. A call of a
# signature seen before copies the args struct and params that call recorded, sets the
# tensors' data pointers (on CUDA also torch's current stream) and calls the library,
# which validates every argument again as always (on CUDA with a workspace of the size it
# asks for, as every call). Only for calls _direct would run directly (autograd records
# nothing), with every tensor on q's device and plain scalar options, that no step
# changes on the way (no copy by _maybe_contiguous or _sink_arg, no dropout, cache_seqlens
# not an int); others go the whole way every time. The signature's key and the call are
# _fastcall.c's where the package has it (_lib.fastcall: the same steps in C, about half
# the time of a small call: bench/NOTES.md, session 41), else the Python below.
_PREPARED_MAX = 64  # signatures kept; the table is emptied when it is full
# signature's key -> the call it recorded, _Recipe.record's entry
_prepared = {}
_SCALARS = (int, float, bool, type(None))
_fast = _lib.fastcall if _DIRECT_CHECKS else None
if _fast is not None:
    # _fastcall.setup's arguments: torch's objects and functions the module calls (those
    # _DIRECT_CHECKS found)
    _FAST_SETUP = (_PLAIN, tuple(sorted(_lib.DTYPES, key=_lib.DTYPES.get)),
                   (_C._len_torch_dispatch_stack, _C._is_torch_function_mode_enabled,
                    _C._get_tracing_state, _C._functorch.peek_interpreter_stack),
                   torch.is_grad_enabled, torch.empty, torch.autograd.graph.increment_version,
                   getattr(_C, "_cuda_getDevice", None), _lib._RAW_STREAM, _lib.fail)
    _fast.setup(*_FAST_SETUP)


class _Recipe:
    """One public function's prepared calls: its op, the C entry point and its args
    struct, the struct's names of the tensors the function passes (in that order) and of
    the outputs the op describes, the map of C names in an error message to the
    function's, and the positions of the tensors the op mutates (whose version counters
    a call moves, as _call does). `tag` tells its keys from another recipe's."""

    def __init__(self, tag, op, entry, struct, fields, outputs, rename=None):
        self.tag, self.op, self.entry, self.struct, self.fields = tag, op, entry, struct, fields
        self.outputs = tuple((name, getattr(struct, name).offset, getattr(struct, name).size)
                             for name in outputs)
        self.rename = rename
        self.ready = op in _IMPLS
        mutated = ()
        if self.ready:
            fn, indices = _IMPLS[op]
            names = list(inspect.signature(fn).parameters)
            renamed = {v: k for k, v in (rename or {}).items()}
            mutated = tuple(fields.index(renamed.get(names[i], names[i])) for i in indices)
        self.mutated = mutated

    def signature(self, tensors, options):
        """The key of a call (_prepared's), or None when the call must go the whole way:
        one _direct would not run directly, an option that is not a plain scalar, a
        tensor that is not on q's device (an int cache_seqlens included) or needs a copy
        on the way (a last stride other than 1, a sink _sink_arg casts: fp64)."""
        if not self.ready:
            return None
        if _fast is not None:  # (torch.compile must not trace into C: it asks first)
            return None if torch.compiler.is_compiling() else \
                _fast.key(self.tag, tensors, options)
        q = tensors[0]
        if type(q) not in _PLAIN or not _direct(tensors):
            return None
        options = _options_key(options)
        if options is None:
            return None
        device = q.get_device()  # -1: the CPU
        key = [self.tag, device, options]
        for t in tensors:
            if t is None:
                key.append(None)
                continue
            if not isinstance(t, Tensor) or t.get_device() != device:
                return None
            stride = t.stride()
            if stride and stride[-1] != 1 and t.shape[-1] > 1:  # (a 0-dim tensor has none)
                return None
            key.append((t.shape, stride, t.dtype))
        sink = tensors[-1]  # every recipe's last field
        if sink is not None and sink.dtype not in _SINK_DTYPES:
            return None
        return tuple(key)

    def call(self, entry, tensors):
        """A call of a prepared signature (_prepared's entry) on these tensors: the
        outputs it made, in the order they were recorded."""
        if _fast is not None:
            made = _fast.call(entry, tensors)
            if made is not None:  # (None: q's CUDA device is not the current one)
                return made
        _, _, template, params, _, fields, outputs, mutated, _, rename = entry
        args = self.struct.from_buffer_copy(template)
        base = ctypes.addressof(args)
        for offset, i in fields:
            ctypes.c_void_p.from_address(base + offset).value = tensors[i].data_ptr()
        device = tensors[0].device
        made = []
        for offset, shape, dtype in outputs:
            t = torch.empty(shape, dtype=dtype, device=device)
            if offset >= 0:
                ctypes.c_void_p.from_address(base + offset).value = t.data_ptr()
            made.append(t)
        params = _lib.Params.from_buffer_copy(params)
        if device.type == "cuda":  # the stream is the current one of this call
            params.stream = _lib.stream(device)
        for i in mutated:
            torch.autograd.graph.increment_version(tensors[i])
        _on_device(device, _lib.call, self.entry, args, params, device, rename)
        return made

    def record(self, key, tensors, outputs):
        """Record the call that just went the whole way under `key`: its tensors,
        outputs ((field or None, tensor): those the library writes, and those it does
        not, which a prepared call makes all the same), and the args struct and params
        its library call was given (_built.last; a signature's call passes the tensors
        themselves, with no copy on the way). Nothing is recorded when that call made no
        library call of this entry point. The entry: (the entry point's and its size
        query's addresses, the args struct and params as bytes, params.stream's offset,
        ((offset of a tensor's data pointer in the struct, its index in tensors), ...),
        ((offset or -1, shape, dtype) of each output made), the indices of the tensors
        mutated, the entry point's name, rename): _fastcall.c's call reads it too."""
        built = getattr(_built, "last", None)
        _built.last = None
        if built is None or built[0] != self.entry:
            return
        # the tensors a prepared call sets: its inputs, and the outputs it makes that the
        # library writes; any other the op described (softmax_lse when it is not
        # returned) is left absent, so the library does not write it
        template = self.struct.from_buffer_copy(built[1])
        kept = [name for name, _ in outputs]
        for name, offset, size in self.outputs:
            if name not in kept:
                ctypes.memset(ctypes.addressof(template) + offset, 0, size)
        offset = {name: getattr(self.struct, name).offset
                  for name in self.fields + tuple(kept) if name}
        fields = tuple((offset[name], i) for i, (name, t) in enumerate(zip(self.fields, tensors))
                       if t is not None)
        made = tuple((offset[name] if name else -1, tuple(t.shape), t.dtype)
                     for name, t in outputs)
        if len(_prepared) >= _PREPARED_MAX:
            _prepared.clear()
        _prepared[key] = (_lib.address(self.entry) + (bytes(template), bytes(built[2]),
                          _lib.Params.stream.offset, fields, made, self.mutated, self.entry,
                          self.rename))


def _options_key(options):
    """The options' part of a signature: each option (window_size's sides each) with its
    type, so that True, 1 and 1.0 differ as _window and _scale tell them apart; None for
    an option that is not a plain Python scalar (a tensor's value could change in place)."""
    key = []
    for o in options:
        if type(o) in (tuple, list):
            if not all(type(w) in _SCALARS for w in o):
                return None
            key.append((type(o), tuple((type(w), w) for w in o)))
        elif type(o) in _SCALARS:
            key.append((type(o), o))
        else:
            return None
    return tuple(key)


_FWD_PREPARED = _Recipe(0, _fwd, "flashc_fwd", _lib.FwdArgs,
                        ("q", "k", "v", "alibi_slopes", "sink"),
                        ("out", "softmax_lse", "attn_probs"))
_KV_PREPARED = _Recipe(1, _fwd_kvcache, "flashc_fwd_kvcache", _lib.KvcacheArgs,
                       ("q", "k_cache", "v_cache", "k_new", "v_new", "rotary_cos",
                        "rotary_sin", "cache_seqlens", "cache_batch_idx", "cache_leftpad",
                        "block_table", "alibi_slopes", "sink"), ("out", "softmax_lse"),
                        _KV_RENAME)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False, *, learnable_sink=None):
    """Attention of q (batch, seqlen, nheads, headdim) over a KV cache, k_cache, v_cache
    (batch_cache, seqlen_cache, nheads_k, headdim), or with block_table (batch,
    max_blocks) int32 paged (num_blocks, page_size, nheads_k, headdim). k, v (batch,
    seqlen_new, nheads_k, headdim) are first written into the cache in place at rows
    cache_seqlens[b] .., rotated by rotary_cos/sin (seqlen_ro, rotary_dim / 2) when
    given (q too: at cache_seqlens[b] + i when causal or windowed, else at
    cache_seqlens[b]). cache_seqlens: int or int32 (batch,), rows in use;
    cache_batch_idx: int32 (batch,), cache row of each batch entry; cache_leftpad: int32
    (batch,), first key row of each. learnable_sink: (nheads,), as flash_attn_func's.
    v_cache and v may have a head dim other than q's (out has it). No backward. Returns out, or (out, softmax_lse) with return_softmax_lse."""
    tensors = (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
               cache_batch_idx, cache_leftpad, block_table, alibi_slopes, learnable_sink)
    options = (softmax_scale, causal, window_size, softcap, rotary_interleaved, num_splits,
               return_softmax_lse)
    key = _KV_PREPARED.signature(tensors, options)
    entry = _prepared.get(key) if key is not None else None
    if entry is not None:
        made = _KV_PREPARED.call(entry, tensors)
        return tuple(made) if return_softmax_lse else made[0]
    fn = "flash_attn_with_kvcache"
    _rank(fn, "q", q, {4: _BSHD})
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        _rank(fn, name, t, {4: "(batch_cache, seqlen_cache, nheads_k, headdim) or paged "
                               "(num_blocks, page_size, nheads_k, headdim)"})
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            raise _lib.FlashcArgumentError(_lib.ERR_INVALID_ARG, "%s.stride(-1)=%d but the "
                                           "cache is updated in place and must have a "
                                           "contiguous last dimension" % (name, t.stride(-1)))
    for name, t in (("k", k), ("v", v)):
        _rank(fn, name, t, {4: "(batch, seqlen_new, nheads_k, headdim)"})
    window_left, window_right = _window(window_size)
    softmax_scale = _scale(softmax_scale)
    q, k, v, rotary_cos, rotary_sin = (_maybe_contiguous(t)
                                       for t in (q, k, v, rotary_cos, rotary_sin))
    if isinstance(cache_seqlens, int):
        cache_seqlens = torch.tensor(cache_seqlens, dtype=torch.int32, device=k_cache.device)
    out, lse = _call(_fwd_kvcache, (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
                                    cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                                    alibi_slopes, softmax_scale, causal, window_left,
                                    window_right, softcap, rotary_interleaved, num_splits,
                                    _sink_arg(learnable_sink)))
    if key is not None and q.numel() and k_cache.numel() and v_cache.numel():
        outputs = (("out", out), ("softmax_lse", lse)) if return_softmax_lse else \
            (("out", out),)
        _KV_PREPARED.record(key, tensors, outputs)
    return (out, lse) if return_softmax_lse else out
