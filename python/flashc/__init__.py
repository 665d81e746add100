"""flashc : FlashAttention in C, with flash_attn 2.x's Python API on torch tensors.

    import flashc as flash_attn
    out = flash_attn.flash_attn_func(q, k, v, causal=True)

The functions run libflashc.so through ctypes (flashc._lib), so one build works with
any torch from 1.13 on: nothing is compiled against torch. CPU tensors run on
flashc's CPU backend, CUDA tensors on its CUDA backend. Also here, as in flash_attn:
flashc.bert_padding (unpad_input, pad_input, index_first_axis, ...) and flashc.layers.rotary
(apply_rotary_emb), and flashc.flash_attn_interface, flash_attn.flash_attn_interface's
names with its private ops (_flash_attn_forward, _flash_attn_backward and their varlen
twins), and flashc.v3, FlashAttention-3's interface (hopper/flash_attn_interface.py:
flash_attn_func, flash_attn_varlen_func with seqused_q/seqused_k, flash_attn_with_kvcache,
flash_attn_combine, ..., and the private _flash_attn_forward, _flash_attn_backward that
Transformer Engine calls), and flashc.flash_attn_2_cuda, flash_attn 2.x's compiled entry
points (fwd, varlen_fwd, bwd, varlen_bwd, fwd_kvcache; imported on use). Errors from the
library raise FlashcError (FlashcArgumentError, also a ValueError, for a bad argument) with
the library's message.

flashc.sdpa routes torch.nn.functional.scaled_dot_product_attention calls to flashc without
editing the code that makes them (`with flashc.sdpa.route():`, or `python -m flashc.sdpa
script.py`). It is imported on first use of flashc.sdpa, so that `python -m flashc.sdpa`
runs it once.

flashc.parallel (imported as a submodule: `import flashc.parallel`) runs ring attention over a
sequence sharded across the ranks of a torch.distributed group (context parallelism).

python/flash_attn_shim holds a package named flash_attn made of these modules, and
flash_attn_3 and flash_attn_interface made of flashc.v3, and flash_attn_2_cuda made of
flashc.flash_attn_2_cuda, for code that imports flash_attn
or FA3 and is not to be edited (README.md, "Using flashc as flash_attn"); it is on no path
unless put there.
"""
from ._lib import FlashcArgumentError, FlashcError, version
from . import flash_attn_interface  # noqa: F401  as flash_attn's __init__ loads it
from . import v3  # noqa: F401  FA3's interface, flashc.v3
from .interface import (flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                        flash_attn_varlen_func, flash_attn_varlen_kvpacked_func,
                        flash_attn_varlen_qkvpacked_func, flash_attn_with_kvcache)
from .layers.rotary import apply_rotary_emb

__version__ = version()


def __getattr__(name):
    """flashc.sdpa, imported when first named (PEP 562)."""
    if name == "sdpa":
        import importlib
        return importlib.import_module(".sdpa", __name__)
    raise AttributeError("module %r has no attribute %r" % (__name__, name))

__all__ = ["FlashcArgumentError", "FlashcError", "apply_rotary_emb", "flash_attn_func",
           "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func", "flash_attn_varlen_func",
           "flash_attn_varlen_kvpacked_func", "flash_attn_varlen_qkvpacked_func",
           "flash_attn_with_kvcache", "version"]
