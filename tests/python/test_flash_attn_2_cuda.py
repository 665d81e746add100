"""test_flash_attn_2_cuda.py : flashc.flash_attn_2_cuda, flash_attn 2.8.3's compiled module
(fwd, varlen_fwd, bwd, varlen_bwd, fwd_kvcache with flash_api.cpp's positional lists), and
the shim's flash_attn_2_cuda that re-exports it.

Each entry point against the flashc.flash_attn_interface private op (or
flash_attn_with_kvcache) it runs, bitwise: the caller's out_ written and returned, the
backwards' dq_, dk_, dv_ written in place or allocated and returned either way, dropout's
rng_state carried from a forward to a backward; the lists against flash_api.cpp's; gen_
and leftpad_k_ refused. In a new interpreter with the shim on sys.path: Transformer
Engine's import of varlen_bwd as flash_attn_cuda_bwd (backends.py, releases whose
flash-attn range reaches 2.8.3) and a call of it, and importlib.metadata's
packages_distributions() naming flash-attn for flash_attn_2_cuda. CPU tensors.

Run:  FLASHC_LIBRARY=build/libflashc.so PYTHONPATH=python python3 -m pytest tests/python -q
"""
import inspect
import os

import pytest
import torch

import flashc
from flashc import flash_attn_2_cuda as fa2_cuda
from flashc import flash_attn_interface as fai
from test_flash_attn_interface import FLASHC_DIR, SHIM, run_python
from test_flashc import UNSUPPORTED, cu, rand

# flash_attn 2.8.3, csrc/flash_attn/flash_api.cpp: mha_fwd, mha_varlen_fwd, mha_bwd,
# mha_varlen_bwd, mha_fwd_kvcache, the parameters in order (bound as fwd, varlen_fwd, bwd,
# varlen_bwd, fwd_kvcache)
FLASH_API = {
    "fwd": "q k v out_ alibi_slopes_ p_dropout softmax_scale is_causal window_size_left "
           "window_size_right softcap return_softmax gen_",
    "varlen_fwd": "q k v out_ cu_seqlens_q cu_seqlens_k seqused_k leftpad_k_ block_table_ "
                  "alibi_slopes_ max_seqlen_q max_seqlen_k p_dropout softmax_scale zero_tensors "
                  "is_causal window_size_left window_size_right softcap return_softmax gen_",
    "bwd": "dout q k v out softmax_lse dq_ dk_ dv_ alibi_slopes_ p_dropout softmax_scale "
           "is_causal window_size_left window_size_right softcap deterministic gen_ rng_state",
    "varlen_bwd": "dout q k v out softmax_lse dq_ dk_ dv_ cu_seqlens_q cu_seqlens_k "
                  "alibi_slopes_ max_seqlen_q max_seqlen_k p_dropout softmax_scale zero_tensors "
                  "is_causal window_size_left window_size_right softcap deterministic gen_ "
                  "rng_state",
    "fwd_kvcache": "q kcache vcache k_ v_ seqlens_k_ rotary_cos_ rotary_sin_ cache_batch_idx_ "
                   "leftpad_k_ block_table_ alibi_slopes_ out_ softmax_scale is_causal "
                   "window_size_left window_size_right softcap is_rotary_interleaved num_splits",
}


@pytest.mark.parametrize("name", sorted(FLASH_API))
def test_signature(name):
    params = inspect.signature(getattr(fa2_cuda, name)).parameters.values()
    assert [p.name for p in params] == FLASH_API[name].split()
    assert all(p.default is inspect.Parameter.empty for p in params)
    assert sorted(fa2_cuda.__all__) == sorted(FLASH_API)


LENS = ([3, 0, 5], [5, 2, 4])
# dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap
MASKS = {"causal": (0.0, 0.5, True, -1, -1, 0.0), "window-softcap": (0.0, 0.3, False, 2, 1, 3.0),
         "dropout": (0.2, 0.4, False, -1, -1, 0.0)}


def batched():
    return rand(2, 5, 4, 16, seed=1), rand(2, 7, 2, 16, seed=2), rand(2, 7, 2, 16, seed=3)


def packed():
    q = rand(sum(LENS[0]), 4, 16, seed=4)
    k, v = rand(sum(LENS[1]), 2, 16, seed=5), rand(sum(LENS[1]), 2, 16, seed=6)
    return q, k, v, cu(LENS[0], "cpu"), cu(LENS[1], "cpu"), max(LENS[0]), max(LENS[1])


def nan_like(t):
    return torch.full_like(t, float("nan"))


def same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def forward_and_backward(q, k, v, given, fwd, fwd_ref, bwd, bwd_ref):
    """fwd(out_) then bwd(dout, out, lse, dq_, dk_, dv_, rng_state) against fwd_ref(),
    bwd_ref(dout, out, lse, dq, dk, dv, rng_state) (the private ops), each pair from the
    same seed: every return bitwise; out_ and dq_, dk_, dv_ are the tensors returned when
    given (given), else None."""
    out_ = nan_like(q) if given else None
    torch.manual_seed(7)
    got = fwd(out_)
    torch.manual_seed(7)
    same(got, fwd_ref())
    assert not given or got[0] is out_
    out, lse, _, rng_state = got
    dout = rand(*out.shape, seed=8)
    grads = [nan_like(t) for t in (q, k, v)] if given else [None] * 3
    got = bwd(dout, out, lse, *grads, rng_state)
    want = [torch.empty_like(t) for t in (q, k, v)]
    same(got, want + [bwd_ref(dout, out, lse, *want, rng_state)])
    assert not given or all(a is b for a, b in zip(got, grads))


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("given", [True, False], ids=["buffers", "none"])
def test_batched(mask, given):
    """fwd then bwd (rng_state passed on) against the private ops."""
    p, scale, causal, left, right, softcap = MASKS[mask]
    q, k, v = batched()
    forward_and_backward(
        q, k, v, given,
        lambda out_: fa2_cuda.fwd(q, k, v, out_, None, p, scale, causal, left, right, softcap,
                                  True, None),
        lambda: fai._flash_attn_forward(q, k, v, p, scale, causal, left, right, softcap, None,
                                        True),
        lambda dout, out, lse, dq, dk, dv, rng: fa2_cuda.bwd(
            dout, q, k, v, out, lse, dq, dk, dv, None, p, scale, causal, left, right, softcap,
            True, None, rng),
        lambda dout, out, lse, dq, dk, dv, rng: fai._flash_attn_backward(
            dout, q, k, v, out, lse, dq, dk, dv, p, scale, causal, left, right, softcap, None,
            True, rng))


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("given", [True, False], ids=["buffers", "none"])
def test_varlen(mask, given):
    """varlen_fwd then varlen_bwd (zero_tensors on) against the private ops."""
    p, scale, causal, left, right, softcap = MASKS[mask]
    q, k, v, cu_q, cu_k, max_q, max_k = packed()
    forward_and_backward(
        q, k, v, given,
        lambda out_: fa2_cuda.varlen_fwd(q, k, v, out_, cu_q, cu_k, None, None, None, None,
                                         max_q, max_k, p, scale, True, causal, left, right,
                                         softcap, False, None),
        lambda: fai._flash_attn_varlen_forward(q, k, v, cu_q, cu_k, max_q, max_k, p, scale,
                                               causal, left, right, softcap, None, False, None,
                                               None, None, True),
        lambda dout, out, lse, dq, dk, dv, rng: fa2_cuda.varlen_bwd(
            dout, q, k, v, out, lse, dq, dk, dv, cu_q, cu_k, None, max_q, max_k, p, scale, True,
            causal, left, right, softcap, True, None, rng),
        lambda dout, out, lse, dq, dk, dv, rng: fai._flash_attn_varlen_backward(
            dout, q, k, v, out, lse, dq, dk, dv, cu_q, cu_k, max_q, max_k, p, scale, causal,
            left, right, softcap, None, True, rng, True))


@pytest.mark.parametrize("given", [True, False], ids=["out_", "none"])
def test_fwd_kvcache(given):
    """The append, rotary and causal call against flash_attn_with_kvcache on copies of the
    caches: out, lse and both caches bitwise."""
    q, k_new, v_new = rand(2, 2, 4, 16, seed=11), rand(2, 2, 2, 16, seed=12), \
        rand(2, 2, 2, 16, seed=13)
    caches = [rand(2, 9, 2, 16, seed=s) for s in (14, 15)]
    angle = rand(9, 4, seed=16)
    seqlens = torch.tensor([3, 6], dtype=torch.int32)
    copies = [c.clone() for c in caches]
    out_ = nan_like(q) if given else None
    got = fa2_cuda.fwd_kvcache(q, *caches, k_new, v_new, seqlens, angle.cos(), angle.sin(), None,
                               None, None, None, out_, 0.3, True, -1, -1, 0.0, False, 0)
    want = flashc.flash_attn_with_kvcache(q, *copies, k_new, v_new, angle.cos(), angle.sin(),
                                          seqlens, softmax_scale=0.3, causal=True,
                                          rotary_interleaved=False, return_softmax_lse=True)
    same(got, want)
    same(caches, copies)
    if given:
        assert got[0] is out_


def test_refused():
    """A generator (flashc draws from torch's default one), leftpad_k_ in varlen_fwd and an
    out_ of the wrong shape raise, naming the entry point."""
    q, k, v = batched()
    with pytest.raises(flashc.FlashcArgumentError, match="fwd: gen_") as e:
        fa2_cuda.fwd(q, k, v, None, None, 0.1, 0.5, False, -1, -1, 0.0, False,
                     torch.Generator())
    assert e.value.status == UNSUPPORTED
    qp, kp, vp, cu_q, cu_k, max_q, max_k = packed()
    with pytest.raises(flashc.FlashcError, match="leftpad_k"):
        fa2_cuda.varlen_fwd(qp, kp, vp, None, cu_q, cu_k, None, torch.zeros(3, dtype=torch.int32),
                            None, None, max_q, max_k, 0.0, 0.5, False, False, -1, -1, 0.0, False,
                            None)
    with pytest.raises(flashc.FlashcArgumentError, match="fwd: out_ is"):
        fa2_cuda.fwd(q, k, v, q[:, :2], None, 0.0, 0.5, False, -1, -1, 0.0, False, None)


# ---- through the shim, as Transformer Engine imports it ----
TE_IMPORT = '''
import importlib.metadata as md
from importlib.metadata import version as get_pkg_version
from packaging.version import Version as PkgVersion
import torch
fa_version = PkgVersion(get_pkg_version("flash-attn"))
# backends.py: flash_attn_cuda_bwd and the private ops once flash-attn's version is in range
from flash_attn_2_cuda import varlen_bwd as flash_attn_cuda_bwd
from flash_attn.flash_attn_interface import _flash_attn_varlen_forward as _flash_attn_varlen_fwd
import flash_attn_2_cuda, flashc.flash_attn_2_cuda
assert all(getattr(flash_attn_2_cuda, n) is getattr(flashc.flash_attn_2_cuda, n)
           for n in flashc.flash_attn_2_cuda.__all__)
from test_flash_attn_2_cuda import packed
q, k, v, cu_q, cu_k, max_q, max_k = packed()
out, lse, _, rng = _flash_attn_varlen_fwd(q, k, v, cu_q, cu_k, max_q, max_k, 0.0, 0.5, True)
dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
res = flash_attn_cuda_bwd(out, q, k, v, out, lse, dq, dk, dv, cu_q, cu_k, None, max_q, max_k,
                          0.0, 0.5, False, True, -1, 0, 0.0, True, None, rng)
print(fa_version, res[0] is dq and res[1] is dk and res[2] is dv,
      bool(torch.isfinite(dq).all()),
      [n.replace("_", "-") for n in md.packages_distributions().get("flash_attn_2_cuda", [])])
'''


def test_transformer_engine_import():
    """With the shim on sys.path, Transformer Engine's import and a positional call of
    varlen_bwd work; packages_distributions() ties flash_attn_2_cuda to flash-attn.
    Without it, there is no flash_attn_2_cuda."""
    tests = os.path.dirname(os.path.abspath(__file__))
    out = run_python(TE_IMPORT, [SHIM, FLASHC_DIR, tests]).strip().split(None, 3)
    assert out == ["2.8.3", "True", "True", "['flash-attn']"], out
    missing = run_python("import importlib.util; print(importlib.util.find_spec("
                         "'flash_attn_2_cuda'))", [FLASHC_DIR])
    assert missing.strip() == "None"
