"""test_fa3_shim.py : the FlashAttention-3 half of python/flash_attn_shim (flash_attn_3/,
flash_attn_interface.py, flash_attn_3-3.0.0.dist-info), found and called as Transformer
Engine and HF transformers find and call FA3.

Each test runs a new interpreter with the shim on sys.path (the library found as in this
process). Transformer Engine's detection and import sequence is written out below from
its source (transformer_engine/pytorch/attention/dot_product_attention/backends.py and
utils.py), not imported; its calls then run: FlashAttention.forward's public calls, and
the context-parallel forward and backward through the imported _flash_attn_forward,
_flash_attn_backward with get_fa_args' positional lists (te_args of test_v3_private.py),
against flashc.v3's public functions, bitwise (one C call; the backward deterministic).
HF transformers' is_flash_attn_3_available is written out in its three shapes. Without
the shim on the path none of it answers.

Run:  FLASHC_LIBRARY=build/libflashc.so PYTHONPATH=python python3 -m pytest tests/python -q
"""
import os

from test_flash_attn_interface import FLASHC_DIR, SHIM, run_python

TESTS = os.path.dirname(os.path.abspath(__file__))
FA3_VERSION = "3.0.0"

# ---- Transformer Engine ----
# backends.py at import: FA3 is there when the flash-attn-3 distribution is; then five
# names from flash_attn_3.flash_attn_interface. utils.py set_flash_attention_3_params
# marks a 3.0.0 beta (it only changes TypeError messages); get_attention_backend makes
# fa3_version the flash_attention_backend, and FlashAttention.forward runs FA3 when that
# is above 3.0.0b. Then the calls, on CPU tensors, each against flashc.v3.
TE_FA3 = '''
import sys
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as get_pkg_version
from packaging.version import Version as PkgVersion

try:
    fa3_version = PkgVersion(get_pkg_version("flash-attn-3"))
except PackageNotFoundError:
    print("flash-attn-3 not found")
    sys.exit(0)
from flash_attn_3.flash_attn_interface import flash_attn_func as flash_attn_func_v3
from flash_attn_3.flash_attn_interface import (
    flash_attn_varlen_func as flash_attn_varlen_func_v3,
)
from flash_attn_3.flash_attn_interface import (
    flash_attn_with_kvcache as flash_attn_with_kvcache_v3,
)
from flash_attn_3.flash_attn_interface import _flash_attn_forward as _flash_attn_fwd_v3
from flash_attn_3.flash_attn_interface import _flash_attn_backward as _flash_attn_bwd_v3

v3_0_0_beta = PkgVersion("3.0.0b") < fa3_version < PkgVersion("3.0.0")
flash_attention_backend = fa3_version
use_flash_attn_3 = flash_attention_backend > PkgVersion("3.0.0b")
print(fa3_version, v3_0_0_beta, use_flash_attn_3)

import torch
from flashc import v3
from test_v3_private import (OPTIONS, check_softmax_d, inputs, public, public_grads, rand,
                             te_args, te_window)

calls = 0
for fmt in ("bshd", "thd"):
    for opts in OPTIONS:
        q, k, v, dout, cu_q, cu_k, max_q, max_k = inputs(fmt, "cpu")
        lens = (cu_q, cu_k, max_q, max_k)
        want_out, want_lse = public(fmt, q, k, v, *lens, **opts)
        kw = dict(softmax_scale=opts.get("softmax_scale"), causal=opts.get("causal", False),
                  window_size=te_window(opts), **({"softcap": opts["softcap"]}
                                                 if "softcap" in opts else {}))
        # FlashAttention.forward without context parallelism
        if fmt == "bshd":
            output = flash_attn_func_v3(q, k, v, num_splits=1, deterministic=True, **kw)
        else:
            output = flash_attn_varlen_func_v3(q, k, v, *lens, num_splits=1,
                                               deterministic=True, **kw)
        if isinstance(output, (list, tuple)):
            output = output[0]
        assert torch.equal(output, want_out), (fmt, opts)
        # context parallelism: one forward and one backward per step
        out, lse, *_ = _flash_attn_fwd_v3(q, k, v, *te_args(True, fmt, *lens), **kw)
        assert torch.equal(out, want_out) and torch.equal(lse, want_lse), (fmt, opts)
        dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
        softmax_d = _flash_attn_bwd_v3(dout, q, k, v, out, lse,
                                       *te_args(False, fmt, *lens, dq=dq, dk=dk, dv=dv),
                                       deterministic=True, **kw)
        for name, got, want in zip("qkv", (dq, dk, dv),
                                   public_grads(fmt, q, k, v, dout, lens, True, **opts)):
            assert torch.equal(got, want), (fmt, opts, "d" + name)
        check_softmax_d(fmt, softmax_d, dout, out, cu_q)
        calls += 1
# the KV-cache call (inference_params) with batched q
q, kc, vc = rand(2, 1, 4, 16, seed=1), rand(2, 9, 2, 16, seed=2), rand(2, 9, 2, 16, seed=3)
lens = torch.tensor([4, 9], dtype=torch.int32)
got = flash_attn_with_kvcache_v3(q, kc, vc, cache_seqlens=lens, causal=True, num_splits=1)
assert torch.equal(got, v3.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens,
                                                   causal=True, num_splits=1))
print(calls)
'''


def test_transformer_engine_finds_fa3():
    """Transformer Engine's sequence finds flash-attn-3 3.0.0 (not a beta, so it runs FA3),
    imports its five names, and each call gives flashc.v3's out, lse, gradients and
    softmax_d: FlashAttention.forward's flash_attn_func and flash_attn_varlen_func, the
    context-parallel _flash_attn_forward, _flash_attn_backward (bshd and thd, each of
    test_v3_private's OPTIONS), and flash_attn_with_kvcache."""
    out = run_python(TE_FA3, [SHIM, FLASHC_DIR, TESTS]).split("\n")
    assert out[0] == "%s False True" % FA3_VERSION
    assert out[1] == "10"  # 2 formats x 5 options


# ---- the names and importlib's answers ----
SHIM_NAMES = '''
import importlib.metadata as md, importlib.util, os
import flash_attn_3, flash_attn_interface
import flash_attn_3.flash_attn_interface as fai3
from flashc import v3
for module in (flash_attn_interface, fai3):
    assert module.__all__ == v3.__all__
    for name in v3.__all__:
        assert getattr(module, name) is getattr(v3, name), (module, name)
dist = md.distribution("flash-attn-3")
print(os.path.realpath(str(dist.locate_file(""))), flash_attn_3.__version__,
      md.version("flash_attn_3"), md.version("flash-attn-3"),
      sorted(md.packages_distributions()["flash_attn_3"]),
      sorted(md.packages_distributions()["flash_attn_interface"]),
      sorted(md.packages_distributions()["flash_attn"]))
'''


def test_names_and_metadata():
    """flash_attn_interface and flash_attn_3.flash_attn_interface hold flashc.v3's names
    (the private ops included); flash_attn_3.__version__ is the distribution's version,
    read from the dist-info next to the shim, which packages_distributions() maps both
    FA3 modules to, leaving flash_attn to the flash_attn 2 dist-info."""
    path, version, v1, v2, rest = run_python(SHIM_NAMES, [SHIM, FLASHC_DIR]).split(" ", 4)
    assert path == os.path.realpath(SHIM)
    assert version == v1 == v2 == FA3_VERSION
    assert rest.split() == ["['flash_attn_3']", "['flash_attn_3']", "['flash_attn']"]
    assert os.path.isdir(os.path.join(SHIM, "flash_attn_3-%s.dist-info" % version))


# ---- HF transformers (src/transformers/utils/import_utils.py) ----
# is_flash_attn_3_available over its releases, CUDA left out (is_torch_cuda_available):
# 4.5x: find_spec("flash_attn_3") and importlib.metadata.version("flash_attn_3");
# early 5.x: find_spec("flash_attn_3");
# later: find_spec("flash_attn_interface") and "flash-attn-3" among the normalised
#        distributions packages_distributions() gives for flash_attn_interface.
# Then modeling_flash_attention_utils.py imports three names from flash_attn_interface.
HF_FA3 = '''
import importlib.metadata, importlib.util

def v4():
    if importlib.util.find_spec("flash_attn_3") is None:
        return False
    try:
        importlib.metadata.version("flash_attn_3")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True

def v5_early():
    return importlib.util.find_spec("flash_attn_3") is not None

def v5_later():
    mapping = importlib.metadata.packages_distributions()
    return importlib.util.find_spec("flash_attn_interface") is not None and "flash-attn-3" in [
        pkg.replace("_", "-") for pkg in mapping.get("flash_attn_interface", [])]

print(v4(), v5_early(), v5_later())
if v5_later():
    from flash_attn_interface import (flash_attn_func, flash_attn_varlen_func,
                                      flash_attn_with_kvcache)
    from flashc import v3
    assert (flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache) == (
        v3.flash_attn_func, v3.flash_attn_varlen_func, v3.flash_attn_with_kvcache)
'''


def test_hf_transformers_finds_fa3():
    """Each shape of HF's check answers True with the shim on the path (torch's CUDA
    check aside, so on a CPU-only machine HF still says False), and the three names HF
    imports are flashc.v3's."""
    assert run_python(HF_FA3, [SHIM, FLASHC_DIR]).split() == ["True"] * 3


OPT_IN = '''
import importlib.metadata as md, importlib.util
for name in ("flash_attn_3", "flash_attn_interface"):
    spec = importlib.util.find_spec(name)
    print(spec.origin if spec else None)
try:
    print(md.distribution("flash-attn-3").locate_file(""))
except md.PackageNotFoundError:
    print(None)
print(md.packages_distributions().get("flash_attn_interface"))
'''


def test_fa3_shim_is_opt_in():
    """Without the shim on the path neither find_spec nor importlib.metadata, which
    Transformer Engine's and HF's checks ask, reaches it (they find a real FA3, or
    nothing)."""
    out = run_python(OPT_IN, [FLASHC_DIR])
    assert SHIM not in out and os.path.realpath(SHIM) not in out, out
