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
- attn_mask None. Any mask falls back: flashc takes no arbitrary mask, and recognising a
  causal or padding mask would mean reading it (a device sync). HF transformers passes
  None with is_causal=True for batches without padding.
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
import logging
import numbers
import os
import runpy
import sys

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


def fallback_reason(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *,
                    scale=None, enable_gqa=False):
    """None if route() runs this call of scaled_dot_product_attention (SDPA's parameters)
    on flashc, else why it goes to torch's SDPA, as a short sentence."""
    if attn_mask is not None:
        return "attn_mask given"
    reason = _tensor_reason(query, key, value) or _shape_reason(query, key, value, enable_gqa)
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
    sq, sk = query.shape[2], key.shape[2]
    causal, window = False, (-1, -1)
    if is_causal and sq <= sk:
        # top-left: keys past sq - 1 are seen by no query; on the square the corners meet
        key, value, causal = key[:, :, :sq], value[:, :, :sq], True
    elif is_causal:
        # query i sees j <= i = (i + sk - sq) + (sq - sk): a right window edge of sq - sk
        window = (-1, sq - sk)
    out = interface.flash_attn_func(query.transpose(1, 2), key.transpose(1, 2),
                                    value.transpose(1, 2), float(dropout_p), scale, causal,
                                    window,
                                    deterministic=torch.are_deterministic_algorithms_enabled())
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
