"""test_flash_attn_interface.py : flashc.flash_attn_interface (flash_attn 2.7/2.8's private
ops _flash_attn_forward, _flash_attn_backward and their varlen twins, next to the seven
public functions) and the flash_attn shim of python/flash_attn_shim.

Each op against the same call through the public API (bitwise: one C call, the backward
deterministic) and the forward against the float64 reference (check(), DEVICES and
dtypes of test_flashc.py); the signatures against flash_attn's parameter lists, written
here as data; the arity, shapes and dtypes of the returns; the backward's writes into
caller-given, strided dq, dk, dv; dropout through rng_state; and a ring attention run
the way ring-flash-attn runs it: keyword arguments built from getfullargspec, a forward
per key block merged by lse, then a backward per block given the merged out and lse.

Run:  FLASHC_LIBRARY=build/libflashc.so PYTHONPATH=python python3 -m pytest tests/python -q
"""
import inspect
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import flashc
from flashc import flash_attn_interface as fi
from flashc import interface
from test_flashc import (DEVICE_DTYPES, DEVICES, DT, LENS_K, LENS_Q, UNSUPPORTED, alibi_for,
                         backward_or_skip, call_or_skip, check, cu, paged, rand, ref_attention,
                         ref_varlen)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHIM = os.path.join(ROOT, "python", "flash_attn_shim")
PRIVATE_OPS = ("_flash_attn_forward", "_flash_attn_varlen_forward", "_flash_attn_backward",
               "_flash_attn_varlen_backward")
PUBLIC = ("flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func",
          "flash_attn_varlen_func", "flash_attn_varlen_kvpacked_func",
          "flash_attn_varlen_qkvpacked_func", "flash_attn_with_kvcache")

# ---- flash_attn's parameter lists (flash_attn/flash_attn_interface.py of 2.8.3),
# names, order and defaults, written as stubs; annotations left out ----
FA2_SIGNATURES = '''
def _flash_attn_forward(q, k, v, dropout_p, softmax_scale, causal, window_size_left,
                        window_size_right, softcap, alibi_slopes, return_softmax): ...
def _flash_attn_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               dropout_p, softmax_scale, causal, window_size_left=-1,
                               window_size_right=-1, softcap=0.0, alibi_slopes=None,
                               return_softmax=False, block_table=None, leftpad_k=None,
                               seqused_k=None, zero_tensors=False): ...
def _flash_attn_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p, softmax_scale,
                         causal, window_size_left, window_size_right, softcap, alibi_slopes,
                         deterministic, rng_state=None): ...
def _flash_attn_varlen_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q,
                                cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                softmax_scale, causal, window_size_left, window_size_right,
                                softcap, alibi_slopes, deterministic, rng_state=None,
                                zero_tensors=False): ...
def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False): ...
def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False): ...
def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False): ...
def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None): ...
def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=(-1, -1),
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False): ...
def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, dropout_p=0.0, softmax_scale=None,
                                    causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False,
                                    return_attn_probs=False): ...
def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False): ...
'''


def fa2_stubs():
    stubs = {}
    exec(FA2_SIGNATURES, stubs)
    return {name: stubs[name] for name in PRIVATE_OPS + PUBLIC}


def parameters(fn):
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("name", PRIVATE_OPS + PUBLIC)
def test_signature(name):
    """flashc.flash_attn_interface's function has flash_attn's parameters: names, order,
    kinds and defaults, through inspect.signature and through inspect.getfullargspec
    (what ring-flash-attn reads)."""
    want, got = fa2_stubs()[name], getattr(fi, name)
    # flashc's extension, keyword only, after flash_attn's parameters (issue 20)
    extra = [("learnable_sink", inspect.Parameter.KEYWORD_ONLY, None)] if name in PUBLIC else []
    assert parameters(got) == parameters(want) + extra
    spec, want_spec = inspect.getfullargspec(got), inspect.getfullargspec(want)
    assert (spec.args, spec.defaults, spec.varargs, spec.varkw) == \
        (want_spec.args, want_spec.defaults, want_spec.varargs, want_spec.varkw)


def test_import_paths():
    """flashc.flash_attn_interface holds flash_attn.flash_attn_interface's names: the
    public functions are interface.py's, the _wrapped_ names the private ops."""
    assert flashc.flash_attn_interface is fi
    for name in PUBLIC:
        assert getattr(fi, name) is getattr(interface, name) is getattr(flashc, name), name
    for name in PRIVATE_OPS:
        assert getattr(fi, "_wrapped" + name) is getattr(fi, name), name
        assert name in fi.__all__ and "_wrapped" + name in fi.__all__
    from flashc.flash_attn_interface import _flash_attn_backward, flash_attn_varlen_func
    assert _flash_attn_backward is fi._flash_attn_backward
    assert flash_attn_varlen_func is flashc.flash_attn_varlen_func


# ---- the shim: python/flash_attn_shim/flash_attn ----
def run_python(code, path):
    """code in a new interpreter whose sys.path starts with `path` (the library found
    as in this process: FLASHC_LIBRARY is inherited); returns its stdout."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


FLASHC_DIR = os.path.dirname(os.path.dirname(os.path.abspath(flashc.__file__)))

SHIM_CHECK = '''
import os, sys
import flash_attn
import flash_attn.flash_attn_interface as fai
from flash_attn.flash_attn_interface import (_flash_attn_backward, _flash_attn_forward,
    _flash_attn_varlen_backward, _flash_attn_varlen_forward, flash_attn_func)
from flash_attn.bert_padding import pad_input, unpad_input
from flash_attn.layers.rotary import apply_rotary_emb
import flashc, flashc.bert_padding, flashc.layers.rotary
from flashc import flash_attn_interface as fi
assert os.path.dirname(flash_attn.__file__) == os.path.join(sys.argv[1], "flash_attn")
for name in fi.__all__:
    assert getattr(fai, name) is getattr(fi, name), name
for name in flashc.__all__:
    assert getattr(flash_attn, name) is getattr(flashc, name), name
assert flash_attn.flash_attn_interface is fai and flash_attn_func is flashc.flash_attn_func
assert _flash_attn_forward is fi._flash_attn_forward
assert (pad_input, unpad_input) == (flashc.bert_padding.pad_input, flashc.bert_padding.unpad_input)
import flash_attn.bert_padding as fbp
from flash_attn.bert_padding import (IndexFirstAxis, index_first_axis, index_put_first_axis,
    unpad_input_for_concatenated_sequences)
for name in flashc.bert_padding.__all__:
    assert getattr(fbp, name) is getattr(flashc.bert_padding, name), name
assert apply_rotary_emb is flashc.layers.rotary.apply_rotary_emb
print(flash_attn.__version__)
'''


def test_shim_import_paths():
    """With python/flash_attn_shim on the path, flash_attn and its three submodules are
    flashc's functions under flash_attn's names, and __version__ says 2.8.3."""
    out = run_python("import sys; sys.argv[1:] = [%r]\n" % SHIM + SHIM_CHECK, [SHIM, FLASHC_DIR])
    assert out.split() == ["2.8.3"]


# what HF transformers asks (utils/import_utils.py: _is_package_available and
# is_flash_attn_2_available): find_spec, the distribution's version, and that
# packages_distributions() names flash-attn as the distribution of the flash_attn package
SHIM_METADATA = '''
import importlib.metadata as md, importlib.util, os, sys
spec = importlib.util.find_spec("flash_attn")
print(spec.origin if spec else None)
try:
    dist = md.distribution("flash_attn")
except md.PackageNotFoundError:
    print(None)
else:
    print(os.path.realpath(str(dist.locate_file(""))), md.version("flash_attn"),
          md.version("flash-attn"),
          [n.replace("_", "-") for n in md.packages_distributions().get("flash_attn", [])])
if spec:
    import flash_attn
    print(flash_attn.__version__)
'''


def test_shim_metadata():
    """With the shim on the path, importlib answers as for an installed flash-attn 2.8.3:
    find_spec finds the shim, importlib.metadata.version("flash_attn") is
    flash_attn.__version__, at least transformers' floor 2.3.3, and the distribution is
    the dist-info next to the shim, which packages_distributions() maps flash_attn to."""
    origin, dist, version = run_python(SHIM_METADATA, [SHIM, FLASHC_DIR]).splitlines()
    assert origin == os.path.join(SHIM, "flash_attn", "__init__.py")
    path, v1, v2, names = dist.split(" ", 3)
    assert path == os.path.realpath(SHIM) and v1 == v2 == version == "2.8.3"
    assert names == "['flash-attn']"
    assert tuple(int(x) for x in version.split(".")) >= (2, 3, 3)
    assert os.path.isdir(os.path.join(SHIM, "flash_attn-%s.dist-info" % version))


def test_shim_is_opt_in():
    """Without it on the path, neither `import flash_attn` nor importlib.metadata reaches
    the shim (they find a real flash_attn, or nothing); `pip install .` ships only the
    flashc packages."""
    out = run_python(SHIM_METADATA, [FLASHC_DIR])
    assert SHIM not in out and os.path.realpath(SHIM) not in out, out
    with open(os.path.join(ROOT, "setup.py")) as f:
        assert "flash_attn_shim" not in f.read()


# ---- the batched ops against flash_attn_func ----
def public_grads(fn, inputs, dout, dropout_p=0.0, **kw):
    """(out, lse, probs, [grads of inputs]) of a public function, deterministic."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out, lse, probs = fn(*leaves, dropout_p=dropout_p, deterministic=True,
                         return_attn_probs=True, **kw)
    backward_or_skip(out, dout)
    return out.detach(), lse, probs, [t.grad for t in leaves]


def check_softmax_d(softmax_d, dout, out, rows):
    """softmax_d fp32 holds rowsum(dout * out) at `rows` (index tensors into it, one per
    query row, in dout's row order) and 0 elsewhere."""
    assert softmax_d.dtype == torch.float32
    want = torch.zeros(softmax_d.shape, dtype=torch.float64)
    want[rows] = (dout.double() * out.double()).sum(-1).cpu()
    check("softmax_d", softmax_d, want, None, torch.float32)


BATCHED_OPTIONS = [
    {},
    {"causal": True},
    {"window_size": (3, 1), "softcap": 2.0, "softmax_scale": 0.7},
    {"causal": True, "alibi": "bh"},
]


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("opts", BATCHED_OPTIONS, ids=lambda o: "-".join(sorted(o)) or "plain")
def test_forward_backward(device, dtype, opts):
    """_flash_attn_forward and _flash_attn_backward against flash_attn_func: the same
    out, lse and gradients; the returns' arity, shapes and dtypes; the backward writes
    into caller-given (poisoned, strided) dq, dk, dv and returns softmax_d."""
    dt = DT[dtype]
    b, sq, sk, h, hk, d = 2, 7, 11, 4, 2, 16
    opts = dict(opts)
    alibi = alibi_for(opts.pop("alibi", None), b, h, device)
    scale, causal = opts.get("softmax_scale"), opts.get("causal", False)
    (left, right), softcap = opts.get("window_size", (-1, -1)), opts.get("softcap", 0.0)
    q = rand(b, sq, h, d, device=device, dtype=dt, seed=1)
    k = rand(b, sk, hk, d, device=device, dtype=dt, seed=2)
    v = rand(b, sk, hk, d, device=device, dtype=dt, seed=3)

    ret = fi._flash_attn_forward(q, k, v, 0.0, scale, causal, left, right, softcap, alibi, False)
    assert isinstance(ret, tuple) and len(ret) == 4
    out, lse, s_dmask, rng_state = ret
    assert out.shape == q.shape and out.dtype == dt
    assert lse.shape == (b, h, sq) and lse.dtype == torch.float32
    assert s_dmask.shape == (0,) and s_dmask.dtype == dt
    assert rng_state.shape == (2,) and rng_state.dtype == torch.int64
    ref, ref_lse = ref_attention(q.double(), k.double(), v.double(), alibi_slopes=alibi, **opts)
    base, base_lse = ref_attention(q, k, v, alibi_slopes=alibi, lowp=True, **opts)
    check("out", out, ref, base, dt)
    check("lse", lse, ref_lse, base_lse, dt)

    dout = rand(*q.shape, device=device, dtype=dt, seed=4)
    pub_out, pub_lse, _, (gq, gk, gv) = public_grads(flashc.flash_attn_func, (q, k, v), dout,
                                                     alibi_slopes=alibi, **opts)
    assert torch.equal(out, pub_out) and torch.equal(lse, pub_lse)
    dq = torch.full_like(q, float("nan"))
    dkv = torch.full((b, sk, 2, hk, d), float("nan"), device=device, dtype=dt)
    dk, dv = dkv[:, :, 0], dkv[:, :, 1]  # strided views, as a kvpacked backward passes them
    # (the public backward ran first: a build without a CUDA backward has skipped)
    softmax_d = fi._flash_attn_backward(
        dout=dout, q=q, k=k, v=v, out=out, softmax_lse=lse, dq=dq, dk=dk, dv=dv, dropout_p=0.0,
        softmax_scale=scale, causal=causal, window_size_left=left, window_size_right=right,
        softcap=softcap, alibi_slopes=alibi, deterministic=True)
    assert torch.equal(dq, gq) and torch.equal(dkv[:, :, 0], gk) and torch.equal(dkv[:, :, 1], gv)
    assert softmax_d.shape == (b, h, 128)
    bi, hi, si = torch.meshgrid(torch.arange(b), torch.arange(h), torch.arange(sq), indexing="ij")
    check_softmax_d(softmax_d, dout.transpose(1, 2), out.transpose(1, 2), (bi, hi, si))


# ---- the varlen ops against flash_attn_varlen_func ----
VARLEN_OPTIONS = [{}, {"causal": True}, {"window_size": (2, 1), "softcap": 4.0}]


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("opts", VARLEN_OPTIONS, ids=lambda o: "-".join(sorted(o)) or "plain")
def test_varlen_forward_backward(device, dtype, opts):
    """_flash_attn_varlen_forward and _flash_attn_varlen_backward against
    flash_attn_varlen_func, and softmax_d in flash_attn's layout: sequence b from
    column cu_seqlens_q[b] + 128 b."""
    dt = DT[dtype]
    h, hk, d = 4, 2, 16
    cq, ck, mq, mk = cu(LENS_Q, device), cu(LENS_K, device), max(LENS_Q), max(LENS_K)
    causal, softcap = opts.get("causal", False), opts.get("softcap", 0.0)
    left, right = opts.get("window_size", (-1, -1))
    q = rand(sum(LENS_Q), h, d, device=device, dtype=dt, seed=5)
    k = rand(sum(LENS_K), hk, d, device=device, dtype=dt, seed=6)
    v = rand(sum(LENS_K), hk, d, device=device, dtype=dt, seed=7)

    ret = fi._flash_attn_varlen_forward(q, k, v, cq, ck, mq, mk, 0.0, None, causal, left, right,
                                        softcap)
    assert isinstance(ret, tuple) and len(ret) == 4
    out, lse, s_dmask, rng_state = ret
    assert out.shape == q.shape and lse.shape == (h, sum(LENS_Q)) and lse.dtype == torch.float32
    assert s_dmask.shape == (0,) and rng_state.shape == (2,) and rng_state.dtype == torch.int64
    ref, _ = ref_varlen(q.double(), k.double(), v.double(), LENS_Q, LENS_K, False, **opts)
    base, _ = ref_varlen(q, k, v, LENS_Q, LENS_K, True, **opts)
    check("out", out, ref, base, dt)

    dout = rand(*q.shape, device=device, dtype=dt, seed=8)
    pub_out, pub_lse, _, (gq, gk, gv) = public_grads(
        lambda q, k, v, **kw: flashc.flash_attn_varlen_func(q, k, v, cq, ck, mq, mk, **kw),
        (q, k, v), dout, **opts)
    assert torch.equal(out, pub_out) and torch.equal(lse, pub_lse)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    softmax_d = fi._flash_attn_varlen_backward(
        dout=dout, q=q, k=k, v=v, out=out, softmax_lse=lse, dq=dq, dk=dk, dv=dv, cu_seqlens_q=cq,
        cu_seqlens_k=ck, max_seqlen_q=mq, max_seqlen_k=mk, dropout_p=0.0, softmax_scale=None,
        causal=causal, window_size_left=left, window_size_right=right, softcap=softcap,
        alibi_slopes=None, deterministic=True)
    assert torch.equal(dq, gq) and torch.equal(dk, gk) and torch.equal(dv, gv)
    assert softmax_d.shape == (h, sum(LENS_Q) + 128 * len(LENS_Q))
    cols = torch.cat([torch.arange(n) + start + 128 * b
                      for b, (n, start) in enumerate(zip(LENS_Q, cu(LENS_Q, "cpu")[:-1].tolist()))])
    check_softmax_d(softmax_d, dout.transpose(0, 1), out.transpose(0, 1),
                    (torch.arange(h)[:, None], cols[None, :]))


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_varlen_forward_seqused_block_table(device, dtype):
    """seqused_k (the first seqused_k[b] keys of sequence b) and block_table (a paged
    cache) reach the library: seqused_k against the reference over the shortened
    sequences, block_table against flash_attn_varlen_func."""
    dt = DT[dtype]
    h, hk, d = 4, 2, 16
    cq, ck, mq, mk = cu(LENS_Q, device), cu(LENS_K, device), max(LENS_Q), max(LENS_K)
    q = rand(sum(LENS_Q), h, d, device=device, dtype=dt, seed=9)
    k = rand(sum(LENS_K), hk, d, device=device, dtype=dt, seed=10)
    v = rand(sum(LENS_K), hk, d, device=device, dtype=dt, seed=11)
    used = [3, 1, 7, 2]
    out, lse, _, _ = fi._flash_attn_varlen_forward(
        q, k, v, cq, ck, mq, mk, 0.0, None, True,
        seqused_k=torch.tensor(used, dtype=torch.int32, device=device))
    starts = cu(LENS_K, "cpu")[:-1].tolist()
    rows = torch.cat([torch.arange(n) + s for n, s in zip(used, starts)]).to(device)
    ref, ref_lse = ref_varlen(q.double(), k[rows].double(), v[rows].double(), LENS_Q, used,
                              False, causal=True)
    base, base_lse = ref_varlen(q, k[rows], v[rows], LENS_Q, used, True, causal=True)
    check("out", out, ref, base, dt)
    check("lse", lse, ref_lse, base_lse, dt)

    kp, table = paged(k, LENS_K, 3, device, 1)
    vp, _ = paged(v, LENS_K, 3, device, 1)
    out, lse, _, _ = fi._flash_attn_varlen_forward(q, kp, vp, cq, ck, mq, mk, 0.0, None, True,
                                                   block_table=table)
    pub_out, pub_lse, _ = flashc.flash_attn_varlen_func(q, kp, vp, cq, ck, mq, mk, causal=True,
                                                        block_table=table,
                                                        return_attn_probs=True)
    assert torch.equal(out, pub_out) and torch.equal(lse, pub_lse)


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_zero_tensors(device):
    """zero_tensors, as flash_attn: rows past cu_seqlens[-1] (which the library leaves
    unwritten) get out 0 and lse -inf in the forward, and the backward zeroes dq, dk, dv
    first; the rows of the sequences are those of the call without zero_tensors."""
    dt = torch.float16 if device == "cuda" else torch.float32
    h, d, extra = 2, 16, 3
    cq, ck, mq, mk = cu(LENS_Q, device), cu(LENS_K, device), max(LENS_Q), max(LENS_K)
    tq, tk = sum(LENS_Q), sum(LENS_K)
    q = rand(tq + extra, h, d, device=device, dtype=dt, seed=28)
    k = rand(tk + extra, h, d, device=device, dtype=dt, seed=29)
    v = rand(tk + extra, h, d, device=device, dtype=dt, seed=30)
    dout = rand(tq + extra, h, d, device=device, dtype=dt, seed=31)
    results = []
    for zero in (False, True):
        out, lse, _, _ = fi._flash_attn_varlen_forward(q, k, v, cq, ck, mq, mk, 0.0, None, True,
                                                       zero_tensors=zero)
        grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
        call_or_skip(lambda: fi._flash_attn_varlen_backward(
            dout, q, k, v, out, lse, *grads, cq, ck, mq, mk, 0.0, None, True, -1, -1, 0.0, None,
            True, zero_tensors=zero), device)
        results.append((out, lse, grads))
    (out, lse, grads), (zout, zlse, zgrads) = results
    assert torch.equal(zout[:tq], out[:tq]) and torch.equal(zlse[:, :tq], lse[:, :tq])
    assert not bool(zout[tq:].any()) and bool((zlse[:, tq:] == -float("inf")).all())
    for g, zg, n in zip(grads, zgrads, (tq, tk, tk)):
        assert torch.equal(zg[:n], g[:n]) and not bool(zg[n:].any())


# ---- dropout: rng_state ----
@pytest.mark.parametrize("device", DEVICES)
def test_dropout_rng_state(device):
    """With dropout the forward returns rng_state (seed, offset) as flash_attn_func
    draws them (torch.manual_seed repeats them); the backward given it regenerates the
    forward's mask (the gradients of flash_attn_func), given another one it does not.
    return_softmax returns the probabilities with the dropped ones negative, those of
    flash_attn_func with return_attn_probs."""
    dt = torch.float16 if device == "cuda" else torch.float32
    p = 0.3
    q, k, v = (rand(2, 9, 4, 16, device=device, dtype=dt, seed=s) for s in (12, 13, 14))
    torch.manual_seed(7)
    out, lse, s_dmask, rng_state = fi._flash_attn_forward(q, k, v, p, None, True, -1, -1, 0.0,
                                                          None, True)
    assert rng_state.shape == (2,) and rng_state.dtype == torch.int64
    assert rng_state[0].item() != 0
    dout = rand(*q.shape, device=device, dtype=dt, seed=15)
    torch.manual_seed(7)
    pub_out, pub_lse, probs, pub_grads = public_grads(flashc.flash_attn_func, (q, k, v), dout,
                                                      dropout_p=p, causal=True)
    assert torch.equal(out, pub_out)
    assert torch.equal(lse, pub_lse) and torch.equal(s_dmask, probs)
    assert bool((s_dmask < 0).any())

    def grads(state):
        dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
        softmax_d = fi._flash_attn_backward(dout, q, k, v, out, lse, dq, dk, dv, p, None, True,
                                            -1, -1, 0.0, None, True, rng_state=state)
        return dq, dk, dv, softmax_d
    *got, softmax_d = grads(rng_state)
    for g, want in zip(got, pub_grads):
        assert torch.equal(g, want)
    # flash_attn keeps softmax_d scaled by the keep probability 1 - p
    bi, hi, si = torch.meshgrid(torch.arange(2), torch.arange(4), torch.arange(9), indexing="ij")
    check_softmax_d(softmax_d, (1 - p) * dout.double().transpose(1, 2), out.transpose(1, 2),
                    (bi, hi, si))
    other = rng_state.clone()
    other[0] += 1
    assert not torch.equal(grads(other)[0], pub_grads[0])


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_dropout_rng_state(device):
    """The varlen ops pass rng_state the same way."""
    dt = torch.float16 if device == "cuda" else torch.float32
    p, h, d = 0.2, 2, 16
    cq, ck, mq, mk = cu(LENS_Q, device), cu(LENS_K, device), max(LENS_Q), max(LENS_K)
    q = rand(sum(LENS_Q), h, d, device=device, dtype=dt, seed=16)
    k = rand(sum(LENS_K), h, d, device=device, dtype=dt, seed=17)
    v = rand(sum(LENS_K), h, d, device=device, dtype=dt, seed=18)
    dout = rand(*q.shape, device=device, dtype=dt, seed=19)
    torch.manual_seed(8)
    out, lse, _, rng_state = fi._flash_attn_varlen_forward(q, k, v, cq, ck, mq, mk, p, None,
                                                           False)
    torch.manual_seed(8)
    pub_out, _, _, (gq, gk, gv) = public_grads(
        lambda q, k, v, **kw: flashc.flash_attn_varlen_func(q, k, v, cq, ck, mq, mk, **kw),
        (q, k, v), dout, dropout_p=p)
    assert torch.equal(out, pub_out)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    fi._flash_attn_varlen_backward(dout, q, k, v, out, lse, dq, dk, dv, cq, ck, mq, mk, p, None,
                                   False, -1, -1, 0.0, None, True, rng_state)
    assert torch.equal(dq, gq) and torch.equal(dk, gk) and torch.equal(dv, gv)


# ---- a ring attention, as ring-flash-attn calls the ops ----
def default_args(op):
    """The keyword arguments ring-flash-attn starts from (its get_default_args): every
    parameter of op by inspect.getfullargspec, its default or None, softcap 0.0."""
    spec = inspect.getfullargspec(op)
    defaults = tuple(spec.defaults or ())
    args = dict(zip(spec.args, (None,) * (len(spec.args) - len(defaults)) + defaults))
    if "softcap" in args:
        args["softcap"] = 0.0
    return args


def window_args(args, window_size):
    """flash_attn < 2.7 took window_size, 2.7 on takes its two sides."""
    assert "window_size" not in args
    args.update(window_size_left=window_size[0], window_size_right=window_size[1])
    return args


def merge(out, lse, block_out, block_lse):
    """Fold one block's (out, lse) into the running ones, in fp32, by lse (the stable
    sigmoid form of lse = log(e^lse + e^block_lse)); lse [..., H, 1] beside out."""
    block_out = block_out.float()
    if out is None:
        return block_out, block_lse
    out = out - torch.sigmoid(block_lse - lse) * (out - block_out)
    return out, lse - F.logsigmoid(lse - block_lse)


def ring_blocks(rank, world, causal):
    """The key blocks rank's queries meet, step by step: (block, causal of that step)."""
    steps = [((rank - step) % world, causal and step == 0) for step in range(world)]
    return [s for step, s in enumerate(steps) if not causal or step <= rank]


def ring(device, dtype, causal):
    """A ring attention of `world` ranks in one process. Rank r holds the r-th chunk of
    q, k, v. Forward: for each key block it meets, _flash_attn_forward(**kwargs) (4
    returns), merged by lse. Backward: for each block, _flash_attn_backward(**kwargs)
    given the merged out and lse (a strided (B, H, S) view, as ring-flash-attn passes
    it) into reused buffers, summed in fp32. Returns the inputs, dout and, assembled
    over the ranks, out, lse, dq, dk, dv, on the CPU."""
    dt = DT[dtype]
    world, b, c, h, hk, d = 3, 2, 5, 4, 2, 16
    q = rand(b, world * c, h, d, device=device, dtype=dt, seed=20)
    k = rand(b, world * c, hk, d, device=device, dtype=dt, seed=21)
    v = rand(b, world * c, hk, d, device=device, dtype=dt, seed=22)
    dout = rand(b, world * c, h, d, device=device, dtype=dt, seed=23)
    scale = d ** -0.5

    def chunk(t, r):
        return t[:, r * c:(r + 1) * c]
    outs, lses, dqs = [], [], []
    dks = [torch.zeros(b, c, hk, d, device=device) for _ in range(world)]
    dvs = [torch.zeros(b, c, hk, d, device=device) for _ in range(world)]
    for rank in range(world):
        out = lse = None
        for src, step_causal in ring_blocks(rank, world, causal):
            kw = window_args(default_args(fi._flash_attn_forward), (-1, -1))
            kw.update(q=chunk(q, rank), k=chunk(k, src), v=chunk(v, src), dropout_p=0.0,
                      softmax_scale=scale, causal=step_causal, alibi_slopes=None,
                      return_softmax=False)
            outputs = fi._flash_attn_forward(**kw)
            assert len(outputs) == 4
            block_out, block_lse, _, _ = outputs
            out, lse = merge(out, lse, block_out, block_lse.transpose(-2, -1).unsqueeze(-1))
        out, lse = out.to(dt), lse.squeeze(-1).transpose(1, 2)
        outs.append(out)
        lses.append(lse)
        dq = torch.zeros(b, c, h, d, device=device)
        bufs = [torch.empty(b, c, n, d, device=device, dtype=dt) for n in (h, hk, hk)]
        for src, step_causal in ring_blocks(rank, world, causal):
            kw = window_args(default_args(fi._flash_attn_backward), (-1, -1))
            kw.update(dout=chunk(dout, rank), q=chunk(q, rank), k=chunk(k, src),
                      v=chunk(v, src), out=out, softmax_lse=lse, dq=bufs[0], dk=bufs[1],
                      dv=bufs[2], dropout_p=0.0, softmax_scale=scale, causal=step_causal,
                      alibi_slopes=None, deterministic=False)
            fi._flash_attn_backward(**kw)
            dq += bufs[0].float()
            dks[src] += bufs[1].float()
            dvs[src] += bufs[2].float()
        dqs.append(dq)
    grads = [torch.cat(g, 1).to(dt).cpu() for g in (dqs, dks, dvs)]
    return ((q.cpu(), k.cpu(), v.cpu()), dout.cpu(), torch.cat(outs, 1).cpu(),
            torch.cat(lses, 2).cpu(), grads)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_ring_attention_forward(device, dtype, causal):
    """ring()'s out and lse against the reference of the whole sequence."""
    (q, k, v), _, out, lse, _ = ring(device, dtype, causal)
    ref, ref_lse = ref_attention(q.double(), k.double(), v.double(), causal=causal)
    base, base_lse = ref_attention(q, k, v, causal=causal, lowp=True)
    check("out", out, ref, base, DT[dtype])
    check("lse", lse, ref_lse, base_lse, DT[dtype])


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_ring_attention_backward(device, dtype, causal):
    """ring()'s gradients against the reference of the whole sequence (the first query
    row of each causal diagonal block sees one key of its call, with an lse merged
    over the calls: the one-key rule of common/window.h must not fire there)."""
    inputs, dout, _, _, grads = ring(device, dtype, causal)
    r64 = [t.double().requires_grad_() for t in inputs]
    rlp = [t.clone().requires_grad_() for t in inputs]
    ref_attention(*r64, causal=causal)[0].backward(dout.double())
    ref_attention(*rlp, causal=causal, lowp=True)[0].backward(dout.float())
    for name, got, r, bl in zip("qkv", grads, r64, rlp):
        check("d" + name, got, r.grad, bl.grad, DT[dtype])


@pytest.mark.parametrize("dtype", list(DT))
def test_varlen_two_key_blocks(dtype):
    """The varlen ops the ring way: the keys of every sequence split in two blocks
    (two cu_seqlens_k), one _flash_attn_varlen_forward each merged by lse
    (nheads, total_q), then _flash_attn_varlen_backward per block given the merged out
    and lse; against the reference over the whole sequences."""
    dt = DT[dtype]
    h, hk, d = 4, 2, 16
    q = rand(sum(LENS_Q), h, d, dtype=dt, seed=24)
    k = rand(sum(LENS_K), hk, d, dtype=dt, seed=25)
    v = rand(sum(LENS_K), hk, d, dtype=dt, seed=26)
    dout = rand(*q.shape, dtype=dt, seed=27)
    cq, mq = cu(LENS_Q, "cpu"), max(LENS_Q)
    starts = cu(LENS_K, "cpu")[:-1].tolist()
    firsts = [n // 2 for n in LENS_K]
    blocks = [[torch.arange(f) + s for f, s in zip(firsts, starts)],
              [torch.arange(f, n) + s for f, n, s in zip(firsts, LENS_K, starts)]]
    blocks = [(torch.cat(rows), [len(r) for r in rows]) for rows in blocks]
    out = lse = None
    for rows, lens in blocks:
        kw = window_args(default_args(fi._flash_attn_varlen_forward), (-1, -1))
        kw.update(q=q, k=k[rows], v=v[rows], cu_seqlens_q=cq, cu_seqlens_k=cu(lens, "cpu"),
                  max_seqlen_q=mq, max_seqlen_k=max(lens), dropout_p=0.0, softmax_scale=None,
                  causal=False)
        block_out, block_lse, _, _ = fi._flash_attn_varlen_forward(**kw)
        out, lse = merge(out, lse, block_out, block_lse.t().unsqueeze(-1))
    out, lse = out.to(dt), lse.squeeze(-1).t()
    dq, dk, dv = torch.zeros(q.shape), torch.zeros(k.shape), torch.zeros(v.shape)
    for rows, lens in blocks:
        bq, bk, bv = torch.empty_like(q), torch.empty_like(k[rows]), torch.empty_like(v[rows])
        kw = window_args(default_args(fi._flash_attn_varlen_backward), (-1, -1))
        kw.update(dout=dout, q=q, k=k[rows], v=v[rows], out=out, softmax_lse=lse, dq=bq, dk=bk,
                  dv=bv, cu_seqlens_q=cq, cu_seqlens_k=cu(lens, "cpu"), max_seqlen_q=mq,
                  max_seqlen_k=max(lens), dropout_p=0.0, softmax_scale=None, causal=False,
                  alibi_slopes=None, deterministic=False)
        fi._flash_attn_varlen_backward(**kw)
        dq += bq.float()
        dk[rows] += bk.float()
        dv[rows] += bv.float()

    r64 = [t.double().requires_grad_() for t in (q, k, v)]
    rlp = [t.clone().requires_grad_() for t in (q, k, v)]
    ref, ref_lse = ref_varlen(*r64, LENS_Q, LENS_K, False)
    base, base_lse = ref_varlen(*rlp, LENS_Q, LENS_K, True)
    check("out", out, ref, base, dt)
    check("lse", lse, ref_lse, base_lse, dt)
    ref.backward(dout.double())
    base.backward(dout.float())
    for name, got, r, bl in zip("qkv", (dq, dk, dv), r64, rlp):
        check("d" + name, got.to(dt), r.grad, bl.grad, dt)


# ---- what the ops refuse ----
def test_bad_input():
    """A rank error names the op; leftpad_k is unsupported (FLASHC_ERR_UNSUPPORTED)."""
    q = rand(1, 4, 2, 16)
    with pytest.raises(flashc.FlashcArgumentError, match=r"_flash_attn_forward: q\.dim\(\)=3"):
        fi._flash_attn_forward(q[0], q, q, 0.0, None, False, -1, -1, 0.0, None, False)
    with pytest.raises(flashc.FlashcArgumentError, match=r"_flash_attn_backward: dout\.dim"):
        fi._flash_attn_backward(q[0], q, q, q, q, torch.zeros(1, 2, 4), None, None, None, 0.0,
                                None, False, -1, -1, 0.0, None, False)
    cu4 = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(flashc.FlashcError, match="leftpad_k") as e:
        fi._flash_attn_varlen_forward(q[0], q[0], q[0], cu4, cu4, 4, 4, 0.0, None, False,
                                      leftpad_k=torch.zeros(1, dtype=torch.int32))
    assert e.value.status == UNSUPPORTED
    with pytest.raises(flashc.FlashcArgumentError, match="window_size"):
        fi._flash_attn_forward(q, q, q, 0.0, None, False, 1.5, -1, 0.0, None, False)


# ---- the one-key rule with a merged lse ----
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_key_merged_lse(dtype):
    """A query sees key A (one key of its call, P = 0.99954 under the merged lse) and
    keys B in a second call, as in a ring attention: the two backwards with the merged
    out and lse sum to the whole call's gradients, by the tolerance rule against the
    naive same-precision attention. fp32 has no one-key rule (dS = 0): its dq was 100%
    off while the rule dropped the A call's dS; bf16 keeps the rule, which drops a term
    at most 2^-10 of the row's scale (src/common/window.h), below bf16's rounding."""
    g = torch.Generator().manual_seed(0)
    d = 16
    q = torch.randn(1, 1, 1, d, dtype=torch.float64, generator=g)
    ka, kb = q * 0.9, torch.randn(1, 4, 1, d, dtype=torch.float64, generator=g) * 0.1
    va, vb = (torch.randn(1, n, 1, d, dtype=torch.float64, generator=g) for n in (1, 4))
    k, v = torch.cat([ka, kb], 1), torch.cat([va, vb], 1)
    scale = 9.0 / (0.9 * (q * q).sum().item())
    dout = torch.randn(1, 1, 1, d, dtype=torch.float64, generator=g)
    grads = []
    for lowp in (False, True):
        x = [(t if not lowp else t.to(dtype)).clone().requires_grad_() for t in (q, k, v)]
        out, _ = ref_attention(*x, softmax_scale=scale, lowp=lowp)
        out.backward(dout.to(out.dtype))
        grads.append(x[0].grad)
    p = (torch.einsum("bqhd,bkhd->bhqk", q, k) * scale).softmax(-1)
    assert 1 - 2 ** -10 < p[0, 0, 0, 0].item() < 1  # inside the rule's range
    c = lambda t: t.to(dtype)
    out, lse, _, _ = fi._flash_attn_forward(c(q), c(k), c(v), 0.0, scale, False, -1, -1, 0.0,
                                            None, False)
    dq = torch.zeros(1, 1, 1, d)
    for kk, vv in ((ka, va), (kb, vb)):
        part = torch.empty(1, 1, 1, d, dtype=dtype)
        dk, dv = torch.empty_like(c(kk)), torch.empty_like(c(vv))
        fi._flash_attn_backward(c(dout), c(q), c(kk), c(vv), out, lse, part, dk, dv, 0.0, scale,
                                False, -1, -1, 0.0, None, False)
        dq += part.float()
    check("dq", dq, grads[0], grads[1], dtype)
