"""test_flashc.py : the flashc Python package against a pure-torch reference.

Every function and option of the flash_attn API (causal, window, softcap, ALiBi,
dropout, MQA/GQA, varlen, paged block_table, the KV cache with append, rotary,
cache_batch_idx and cache_leftpad, deterministic, return_attn_probs, packed
variants, odd head dims, non-contiguous inputs, bad input) on every device torch
has: cpu always (fp32, fp16, bf16), cuda when available (fp16, bf16). Outputs and
gradients follow DEVELOPERS.md's rule: the error against a float64 reference is at
most twice the error of a same-precision naive implementation plus one unit of
rounding. A CUDA backward that the library reports as FLASHC_ERR_UNSUPPORTED (a build with
FLASHC_CUDA_BWD=OFF) skips; any other failure fails.

Run:  FLASHC_LIBRARY=build/libflashc.so PYTHONPATH=python python3 -m pytest tests/python -q
"""
import math
import os

import pytest
import torch

import flashc
from flashc import bert_padding, interface
from flashc.layers.rotary import apply_rotary_emb

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
DT = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
DEVICE_DTYPES = [(d, t) for d in DEVICES for t in DT if not (d == "cuda" and t == "fp32")]
# the tolerance rule's slack, one unit of rounding: fc_atol (tests/support/check.c)
ATOL = {torch.float32: 1e-5, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}
UNSUPPORTED = 2  # FLASHC_ERR_UNSUPPORTED


# ---- the reference ----
def ref_attention(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1),
                  softcap=0.0, alibi_slopes=None, keep=None, dropout_p=0.0, lowp=False,
                  sink=None):
    """Naive attention. q [B, Sq, H, D], k, v [B, Sk, Hk, D] -> out [B, Sq, H, D] (float64,
    or with lowp fp32 math rounded to q's dtype at the scores, probabilities and
    output), lse [B, H, Sq]. keep: bool [B, H, Sq, Sk] dropout mask. sink: [H] learnable
    sink logits, one more term of each row's denominator that takes no value."""
    dt = q.dtype
    wt = torch.float32 if lowp else torch.float64

    def rnd(x):
        return x.to(dt).to(wt) if lowp else x
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    scale = softmax_scale if softmax_scale is not None else d ** -0.5
    kf = k.to(wt).repeat_interleave(h // hk, dim=2)
    vf = v.to(wt).repeat_interleave(h // hk, dim=2)
    s = rnd(torch.einsum("bqhd,bkhd->bhqk", q.to(wt), kf) * scale)
    if softcap > 0:
        s = rnd(softcap * torch.tanh(s / softcap))
    i = torch.arange(sq, device=q.device).view(-1, 1) + sk - sq
    j = torch.arange(sk, device=q.device).view(1, -1)
    if alibi_slopes is not None:
        slopes = alibi_slopes.to(wt).view(-1 if alibi_slopes.dim() == 2 else 1, h, 1, 1)
        s = s - slopes * (i - j).abs().to(wt)
    left, right = window_size[0], 0 if causal else window_size[1]
    visible = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if left >= 0:
        visible &= j >= i - left
    if right >= 0:
        visible &= j <= i + right
    s = s.masked_fill(~visible, -math.inf)
    if sink is not None:
        s_all = torch.cat([s, sink.to(wt).view(1, h, 1, 1).expand(b, h, sq, 1)], dim=-1)
        lse = torch.logsumexp(s_all, dim=-1)
    else:
        lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - torch.where(torch.isinf(lse), 0, lse).unsqueeze(-1))
    p = rnd(p)
    if keep is not None:
        p = rnd(p * keep / (1 - dropout_p))
    out = rnd(torch.einsum("bhqk,bkhd->bqhd", p, vf))
    return out, lse


def max_abs_err(x, ref):
    """max |x - ref| as fc_max_abs_err (tests/support/check.c): 0 where both are NaN or
    the same infinity, inf where only one is NaN or an infinity differs; 0 when empty."""
    e = (x - ref).abs()
    e = torch.where(torch.isinf(x) | torch.isinf(ref), torch.where(x == ref, 0.0, math.inf), e)
    nan_x, nan_ref = torch.isnan(x), torch.isnan(ref)
    e = torch.where(nan_x | nan_ref, torch.where(nan_x & nan_ref, 0.0, math.inf), e)
    return e.max().item() if e.numel() else 0.0


def check(name, got, ref, base, dtype):
    """DEVELOPERS.md's tolerance rule, the Python twin of fc_tol_check (tests/support/check.c):
    max |got - ref| <= 2 max |base - ref| + atol(dtype) max(1, max |ref|), with max |ref|
    over its finite elements and a baseline error that is not finite counted as 0 (as is
    a missing baseline, base None). test_tolerance_cases proves the twins agree."""
    got, ref = got.double().cpu(), ref.double().cpu()
    err = max_abs_err(got, ref)
    base_err = 0.0 if base is None else max_abs_err(base.double().cpu(), ref)
    if not math.isfinite(base_err):
        base_err = 0.0  # a baseline overflow must not loosen the bound
    finite = ref[torch.isfinite(ref)]
    scale = max(1.0, finite.abs().max().item()) if finite.numel() else 1.0
    bound = 2 * base_err + ATOL[dtype] * scale
    assert err <= bound, "%s: max error %.3g > bound %.3g (baseline %.3g)%s" % (
        name, err, bound, base_err, "" if math.isfinite(err) else ": a NaN or infinity differs")


TOLERANCE_CASES = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "support",
                               "tolerance_cases.txt")


def test_tolerance_cases():
    """check() gives the verdict of every case of tests/support/tolerance_cases.txt, the
    file tests/test_tolerance.c runs fc_tol_check on: the two rules cannot drift apart."""
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

    def values(s):
        return None if s == "-" else torch.tensor([float(x) for x in s.split(",")],
                                                  dtype=torch.float64)
    cases = 0
    with open(TOLERANCE_CASES) as f:
        for lineno, line in enumerate(f, 1):
            if line.startswith("#") or not line.split():
                continue
            dt, got, ref, base, want = line.split()
            try:
                check("case", values(got), values(ref), values(base), dtypes[dt])
                passed = True
            except AssertionError:
                passed = False
            assert passed == (want == "1"), "tolerance_cases.txt:%d: check() says %s" % (
                lineno, "pass" if passed else "fail")
            cases += 1
    assert cases >= 20


def test_flops_twins():
    """bench/compare.py's flops() (the Python benchmarks) and cli/flops.h's fc_flops (the
    `flashc` program, next to the library under test) count the same FLOPs."""
    import importlib.util
    import re
    import subprocess
    cli = os.path.join(os.path.dirname(os.path.abspath(flashc._lib.lib._name)), "flashc")
    if not os.access(cli, os.X_OK):
        pytest.skip("no flashc program next to %s" % flashc._lib.lib._name)
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir)
    spec = importlib.util.spec_from_file_location("compare", os.path.join(root, "bench",
                                                                          "compare.py"))
    compare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare)
    for mode in ("fwd", "bwd", "fwdbwd"):
        for causal in (0, 1):
            b, h, sq, sk, d = 2, 3, 40, 56, 16
            out = subprocess.run([cli, "bench", "--backend", "cpu", "--batch", str(b), "--heads",
                                  str(h), "--seqlen", str(sq), "--seqlen-k", str(sk),
                                  "--headdim", str(d), "--mode", mode, "--iters", "1",
                                  "--dtype", "fp32"] + (["--causal"] if causal else []),
                                 capture_output=True, text=True, check=True).stdout
            gflop = float(re.search(r"\(([0-9.eE+-]+) GFLOP per call\)", out).group(1))
            want = compare.flops(b, h, sq, sk, d, causal, mode) / 1e9
            assert abs(gflop - want) <= 1e-3 * want, (mode, causal, gflop, want)


def rand(*shape, device="cpu", dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(*shape, generator=g) * 2 - 1).to(device=device, dtype=dtype)


def backward_or_skip(out, dout):
    """out.backward(dout); skips where the build has no CUDA backward (FLASHC_CUDA_BWD=OFF)."""
    return call_or_skip(lambda: out.backward(dout), out.device)


def call_or_skip(fn, device):
    """fn(), a backward on `device`; skips where the build has no CUDA backward."""
    try:
        return fn()
    except flashc.FlashcError as e:
        if e.status == UNSUPPORTED and torch.device(device).type == "cuda":
            pytest.skip("CUDA backward unsupported by this build: %s" % e)
        raise


def check_fwd_bwd(fn, ref_fn, inputs, dtype, grads=True, names=None):
    """Run fn(*inputs) and ref_fn(*inputs, lowp=...) and compare the outputs, then the
    gradients of every input for one random dout."""
    leaves = [t.detach().clone().requires_grad_(grads) for t in inputs]
    out = fn(*leaves)
    r64 = [t.detach().double().requires_grad_(grads) for t in inputs]
    rlp = [t.detach().clone().requires_grad_(grads) for t in inputs]
    ref, _ = ref_fn(*r64, lowp=False)
    base, _ = ref_fn(*rlp, lowp=True)
    check("out", out, ref, base, dtype)
    if not grads:
        return out
    dout = rand(*out.shape, device=out.device, dtype=out.dtype, seed=99)
    backward_or_skip(out, dout)
    ref.backward(dout.double())
    base.backward(dout.float() if dtype == torch.float32 else dout.to(torch.float32))
    for i, (a, b64, blp) in enumerate(zip(leaves, r64, rlp)):
        check("d" + (names[i] if names else str(i)), a.grad, b64.grad, blp.grad, dtype)
    return out


# ---- flash_attn_func: every mask option x shapes (GQA, MQA, odd D, Sq != Sk) ----
SHAPES = [  # B, Sq, Sk, H, Hk, D
    (2, 7, 7, 4, 4, 16),
    (1, 5, 13, 4, 2, 5),
    (2, 13, 6, 6, 1, 33),
]
OPTIONS = [
    {},
    {"causal": True},
    {"window_size": (3, 2)},
    {"window_size": (4, 0)},
    {"softcap": 2.0, "softmax_scale": 1.3},
    {"alibi": "h"},
    {"causal": True, "softcap": 3.0, "alibi": "bh"},
]


def alibi_for(kind, b, h, device):
    if kind is None:
        return None
    shape = (h,) if kind == "h" else (b, h)
    return (rand(*shape, seed=7).abs() * 0.5).to(device)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: "-".join(sorted(o)) or "plain")
def test_func(device, dtype, shape, opts):
    dt = DT[dtype]
    b, sq, sk, h, hk, d = shape
    opts = dict(opts)
    alibi = alibi_for(opts.pop("alibi", None), b, h, device)
    q = rand(b, sq, h, d, device=device, dtype=dt, seed=1)
    k = rand(b, sk, hk, d, device=device, dtype=dt, seed=2)
    v = rand(b, sk, hk, d, device=device, dtype=dt, seed=3)
    check_fwd_bwd(lambda q, k, v: flashc.flash_attn_func(q, k, v, alibi_slopes=alibi, **opts),
                  lambda q, k, v, lowp: ref_attention(q, k, v, alibi_slopes=alibi, lowp=lowp,
                                                      **opts),
                  (q, k, v), dt, names="qkv")


def test_defaults_and_signatures():
    import inspect
    sig = inspect.signature(flashc.flash_attn_func)
    assert list(sig.parameters) == ["q", "k", "v", "dropout_p", "softmax_scale", "causal",
                                    "window_size", "softcap", "alibi_slopes", "deterministic",
                                    "return_attn_probs", "learnable_sink"]
    assert sig.parameters["learnable_sink"].kind == inspect.Parameter.KEYWORD_ONLY
    assert sig.parameters["window_size"].default == (-1, -1)
    vsig = inspect.signature(flashc.flash_attn_varlen_func)
    assert list(vsig.parameters)[-2:] == ["block_table", "learnable_sink"]
    ksig = inspect.signature(flashc.flash_attn_with_kvcache)
    assert list(ksig.parameters)[3:11] == ["k", "v", "rotary_cos", "rotary_sin", "cache_seqlens",
                                           "cache_batch_idx", "cache_leftpad", "block_table"]
    assert ksig.parameters["rotary_interleaved"].default is True


def test_versions():
    """The package is the release of flashc.h (CMakeLists.txt checks project()'s against
    it; setup.py gives the wheel that version with a build label, test_wheel.py), the
    library it loaded is that release, and it refuses a library of another ABI version
    always, of another release unless FLASHC_ALLOW_VERSION_MISMATCH=1."""
    import re
    lib = flashc._lib
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir)
    with open(os.path.join(root, "include", "flashc.h")) as f:
        header = dict(re.findall(r"#define FLASHC_VERSION_(MAJOR|MINOR|PATCH) (\d+)", f.read()))
    assert "%s.%s.%s" % (header["MAJOR"], header["MINOR"], header["PATCH"]) == lib.VERSION
    assert flashc.__version__ == lib.VERSION

    assert lib._refusal("x.so", lib.VERSION, lib.ABI_VERSION, False) is None
    other = lib._refusal("x.so", "0.2.9", lib.ABI_VERSION, False)
    assert "libflashc 0.2.9" in other and "flashc " + lib.VERSION in other
    assert "FLASHC_ALLOW_VERSION_MISMATCH=1" in other
    assert lib._refusal("x.so", "0.2.9", lib.ABI_VERSION, True) is None
    assert "ABI version 2" in lib._refusal("x.so", lib.VERSION, 2, True)
    assert "unknown (before 0.3)" in lib._refusal("x.so", "0.2.0", None, True)


def test_fastcall_loading(tmp_path, monkeypatch):
    """_lib._load_fastcall takes the _fastcall module beside the library when it loads and
    speaks this package's protocol; else (none there, a file that does not load, another
    protocol) None, or under FLASHC_FASTCALL=1 an ImportError that says which; under
    FLASHC_FASTCALL=0 None whatever is there. A module not set up refuses its calls."""
    import shutil
    lib = flashc._lib
    built = lib.fastcall.__file__ if lib.fastcall is not None else None
    monkeypatch.setattr(lib, "lib", type("Lib", (), {"_name": str(tmp_path / "libflashc.so")}))
    module = tmp_path / lib.FASTCALL_FILE

    def load(want):
        monkeypatch.setenv("FLASHC_FASTCALL", want)
        return lib._load_fastcall()

    def refused(match):
        assert load("") is None and load("0") is None
        with pytest.raises(ImportError, match=match):
            load("1")

    refused("is missing")
    module.write_bytes(b"not a shared object")
    refused("does not load")
    if built is None:
        pytest.skip("no _fastcall module here to load (./test.sh requires one)")
    shutil.copyfile(built, module)
    for want in ("", "1"):
        assert load(want).PROTOCOL == lib.FASTCALL_PROTOCOL
    fresh = load("1")  # (a copy: its own state, setup never called)
    for call in (lambda: fresh.key(0, (torch.zeros(1),), ()), lambda: fresh.call((), ())):
        with pytest.raises(RuntimeError, match="before _fastcall.setup"):
            call()
    assert load("0") is None
    monkeypatch.setattr(lib, "FASTCALL_PROTOCOL", lib.FASTCALL_PROTOCOL + 1)
    refused("speaks protocol %d" % (lib.FASTCALL_PROTOCOL - 1))



def test_params_default():
    """_lib.params builds flashc_params from zeros, which flashc.h promises
    flashc_params_default() is: the library's defaults byte for byte."""
    lib = flashc._lib
    assert bytes(lib.lib.flashc_params_default()) == bytes(lib.Params())
    p = lib.params(torch.device("cpu"), causal=1, window_left=3)
    assert (p.causal, p.window_left, p.window_right, p.softmax_scale) == (1, 3, 0, 0.0)

# ---- packed variants ----
@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("packing", ["qkv", "kv"])
def test_packed(device, dtype, packing):
    dt = DT[dtype]
    b, s, h, d = 2, 9, 4, 24
    hk = h if packing == "qkv" else 2
    if packing == "qkv":
        qkv = rand(b, s, 3, h, d, device=device, dtype=dt, seed=4)
        check_fwd_bwd(lambda x: flashc.flash_attn_qkvpacked_func(x, causal=True),
                      lambda x, lowp: ref_attention(x[:, :, 0], x[:, :, 1], x[:, :, 2],
                                                    causal=True, lowp=lowp),
                      (qkv,), dt, names=["qkv"])
    else:
        q = rand(b, s, h, d, device=device, dtype=dt, seed=5)
        kv = rand(b, s + 3, 2, hk, d, device=device, dtype=dt, seed=6)
        check_fwd_bwd(lambda q, kv: flashc.flash_attn_kvpacked_func(q, kv, causal=True),
                      lambda q, kv, lowp: ref_attention(q, kv[:, :, 0], kv[:, :, 1],
                                                        causal=True, lowp=lowp),
                      (q, kv), dt, names=["q", "kv"])


# ---- varlen ----
LENS_Q, LENS_K = [3, 0, 7, 1], [5, 2, 7, 4]


def cu(lens, device):
    return torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32,
                        device=device)


def ref_varlen(q, k, v, lens_q, lens_k, lowp, **opts):
    """Per-sequence ref_attention over packed q [total_q, H, D], k, v [total_k, Hk, D]."""
    outs, lses, oq, ok = [], [], 0, 0
    for b, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        o, lse = ref_attention(q[oq:oq + lq][None], k[ok:ok + lk][None], v[ok:ok + lk][None],
                               lowp=lowp, **opts)
        outs.append(o[0])
        lses.append(lse[0])
        oq, ok = oq + lq, ok + lk
    return torch.cat(outs), torch.cat(lses, dim=-1)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("packing", ["", "qkv", "kv"])
@pytest.mark.parametrize("opts", [{}, {"causal": True}, {"window_size": (2, 1), "softcap": 4.0}],
                         ids=["plain", "causal", "window-softcap"])
def test_varlen(device, dtype, packing, opts):
    dt = DT[dtype]
    h, hk, d = 4, (4 if packing == "qkv" else 2), 16
    lq, lk = (LENS_K, LENS_K) if packing == "qkv" else (LENS_Q, LENS_K)
    cq, ck = cu(lq, device), cu(lk, device)
    tq, tk = sum(lq), sum(lk)
    mq, mk = max(lq), max(lk)
    if packing == "qkv":
        qkv = rand(tk, 3, h, d, device=device, dtype=dt, seed=8)
        check_fwd_bwd(
            lambda x: flashc.flash_attn_varlen_qkvpacked_func(x, ck, mk, **opts),
            lambda x, lowp: ref_varlen(x[:, 0], x[:, 1], x[:, 2], lk, lk, lowp, **opts),
            (qkv,), dt, names=["qkv"])
    elif packing == "kv":
        q = rand(tq, h, d, device=device, dtype=dt, seed=9)
        kv = rand(tk, 2, hk, d, device=device, dtype=dt, seed=10)
        check_fwd_bwd(
            lambda q, kv: flashc.flash_attn_varlen_kvpacked_func(q, kv, cq, ck, mq, mk, **opts),
            lambda q, kv, lowp: ref_varlen(q, kv[:, 0], kv[:, 1], lq, lk, lowp, **opts),
            (q, kv), dt, names=["q", "kv"])
    else:
        q = rand(tq, h, d, device=device, dtype=dt, seed=11)
        k = rand(tk, hk, d, device=device, dtype=dt, seed=12)
        v = rand(tk, hk, d, device=device, dtype=dt, seed=13)
        alibi = alibi_for("bh", len(lq), h, device)
        check_fwd_bwd(
            lambda q, k, v: flashc.flash_attn_varlen_func(q, k, v, cq, ck, mq, mk,
                                                          alibi_slopes=alibi, **opts),
            lambda q, k, v, lowp: ref_varlen_alibi(q, k, v, lq, lk, lowp, alibi, **opts),
            (q, k, v), dt, names="qkv")


def ref_varlen_alibi(q, k, v, lens_q, lens_k, lowp, alibi, **opts):
    """ref_varlen with per-sequence ALiBi slopes alibi [B, H]."""
    outs, oq, ok = [], 0, 0
    for b, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        o, _ = ref_attention(q[oq:oq + lq][None], k[ok:ok + lk][None], v[ok:ok + lk][None],
                             alibi_slopes=alibi[b], lowp=lowp, **opts)
        outs.append(o[0])
        oq, ok = oq + lq, ok + lk
    return torch.cat(outs), None


def paged(k, lens, page, device, seed):
    """Scatter packed k [total, Hk, D] into pages [num_blocks, page, Hk, D] in a random
    order; returns (pages, block_table int32 [B, max_blocks])."""
    nb = [(n + page - 1) // page for n in lens]
    maxb = max(nb)
    perm = torch.randperm(sum(nb) + 2, generator=torch.Generator().manual_seed(seed))
    pages = torch.zeros(sum(nb) + 2, page, *k.shape[1:], dtype=k.dtype, device=device)
    table = torch.zeros(len(lens), maxb, dtype=torch.int32)
    used, off = 0, 0
    for b, n in enumerate(lens):
        for j in range(nb[b]):
            blk = int(perm[used])
            used += 1
            table[b, j] = blk
            rows = k[off + j * page: off + min(n, (j + 1) * page)]
            pages[blk, :rows.shape[0]] = rows
        off += n
    return pages, table.to(device)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_varlen_block_table(device, dtype):
    dt = DT[dtype]
    h, hk, d, page = 4, 2, 16, 3
    q = rand(sum(LENS_Q), h, d, device=device, dtype=dt, seed=14)
    k = rand(sum(LENS_K), hk, d, device=device, dtype=dt, seed=15)
    v = rand(sum(LENS_K), hk, d, device=device, dtype=dt, seed=16)
    kp, table = paged(k, LENS_K, page, device, 1)
    vp, _ = paged(v, LENS_K, page, device, 1)
    out = flashc.flash_attn_varlen_func(q, kp, vp, cu(LENS_Q, device), cu(LENS_K, device),
                                        max(LENS_Q), max(LENS_K), causal=True,
                                        block_table=table)
    ref, _ = ref_varlen(q.double(), k.double(), v.double(), LENS_Q, LENS_K, False, causal=True)
    base, _ = ref_varlen(q, k, v, LENS_Q, LENS_K, True, causal=True)
    check("out", out, ref, base, dt)


# ---- the KV cache ----
KV_CASES = [
    {},
    {"append": True, "causal": True},
    {"append": True, "rotary": "interleaved", "causal": True},
    {"append": True, "rotary": "neox"},
    {"append": True, "batch_idx": True, "leftpad": True, "causal": True},
    {"append": True, "paged": True, "rotary": "interleaved", "causal": True},
    {"paged": True, "window_size": (3, 0), "softcap": 2.0, "num_splits": 3},
    {"alibi": True, "cache_seqlens_int": True},
]


def rope_ref(x, cos, sin, pos, interleaved):
    """Rotate x [S, H, D] at positions pos [S] by complex multiplication (the definition)."""
    rd = cos.shape[1] * 2
    xr = x[..., :rd].double()
    if interleaved:
        z = torch.complex(xr[..., 0::2], xr[..., 1::2])
    else:
        z = torch.complex(xr[..., :rd // 2], xr[..., rd // 2:])
    rot = z * torch.polar(torch.ones_like(cos.double()[pos]),
                          torch.atan2(sin.double()[pos], cos.double()[pos])).unsqueeze(1)
    if interleaved:
        out = torch.stack((rot.real, rot.imag), dim=-1).flatten(-2)
    else:
        out = torch.cat((rot.real, rot.imag), dim=-1)
    return torch.cat((out.to(x.dtype), x[..., rd:]), dim=-1)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("case", KV_CASES, ids=lambda c: "-".join(sorted(c)) or "plain")
def test_kvcache(device, dtype, case):
    dt = DT[dtype]
    b, sq, h, hk, d, sc, snew, page = 3, (2 if case.get("append") else 1), 4, 2, 16, 12, 2, 4
    causal = case.get("causal", False)
    window = case.get("window_size", (-1, -1))
    softcap = case.get("softcap", 0.0)
    q = rand(b, sq, h, d, device=device, dtype=dt, seed=20)
    bc = b + 1 if case.get("batch_idx") else b
    kc = rand(bc, sc, hk, d, device=device, dtype=dt, seed=21)
    vc = rand(bc, sc, hk, d, device=device, dtype=dt, seed=22)
    seqlens = torch.tensor([3, 7, 5], dtype=torch.int32)
    if case.get("cache_seqlens_int"):
        seqlens = torch.tensor([6, 6, 6], dtype=torch.int32)
    append = case.get("append", False)
    knew = rand(b, snew, hk, d, device=device, dtype=dt, seed=23) if append else None
    vnew = rand(b, snew, hk, d, device=device, dtype=dt, seed=24) if append else None
    idx = torch.tensor([2, 0, 3], dtype=torch.int32) if case.get("batch_idx") else None
    leftpad = torch.tensor([1, 0, 2], dtype=torch.int32) if case.get("leftpad") else None
    alibi = alibi_for("h", b, h, device) if case.get("alibi") else None
    rot = case.get("rotary")
    cos = sin = None
    if rot:
        ang = rand(sc, 6, seed=25) * 3
        cos, sin = ang.cos().to(device, dt), ang.sin().to(device, dt)
    rows = [int(i) for i in idx] if idx is not None else list(range(b))
    # the reference: append (rotated) rows into a logical cache copy, then attend
    # in float64 (kref64, ...) and rounded to the dtype once (kref, ...: the baseline)
    kref64, vref64, qref64 = kc.double(), vc.double(), q.double()
    for i in range(b):
        s0 = int(seqlens[i])
        if append:
            pos = torch.arange(s0, s0 + snew)
            kn = knew[i].double()
            if rot:
                kn = rope_ref(kn.cpu(), cos.cpu(), sin.cpu(), pos, rot == "interleaved")
            kref64[rows[i], s0:s0 + snew] = kn.to(device)
            vref64[rows[i], s0:s0 + snew] = vnew[i].double()
        if rot:
            pos = torch.arange(s0, s0 + sq) if (causal or window != (-1, -1)) else \
                torch.full((sq,), s0)
            qref64[i] = rope_ref(q[i].double().cpu(), cos.cpu(), sin.cpu(), pos,
                                 rot == "interleaved").to(device)
    kref, vref, qref = kref64.to(dt), vref64.to(dt), qref64.to(dt)
    kcall, vcall, table = kc, vc, None
    if case.get("paged"):
        per = sc // page
        perm = torch.randperm(b * per, generator=torch.Generator().manual_seed(3))
        table = perm.view(b, per).to(torch.int32).to(device)
        kcall = torch.empty(b * per, page, hk, d, dtype=dt, device=device)
        vcall = torch.empty_like(kcall)
        kcall[table.long().flatten()] = kc.reshape(b * per, page, hk, d)
        vcall[table.long().flatten()] = vc.reshape(b * per, page, hk, d)
    sl = 6 if case.get("cache_seqlens_int") else seqlens.to(device)
    out, lse = flashc.flash_attn_with_kvcache(
        q, kcall, vcall, knew, vnew, rotary_cos=cos, rotary_sin=sin, cache_seqlens=sl,
        cache_batch_idx=None if idx is None else idx.to(device),
        cache_leftpad=None if leftpad is None else leftpad.to(device), block_table=table,
        causal=causal, window_size=window, softcap=softcap,
        rotary_interleaved=rot != "neox", alibi_slopes=alibi,
        num_splits=case.get("num_splits", 0), return_softmax_lse=True)
    if table is not None:  # the logical cache, back from the pages
        kcall = kcall[table.long()].reshape(b, sc, hk, d)
        vcall = vcall[table.long()].reshape(b, sc, hk, d)
    check("k_cache", kcall, kref64, kref, dt)
    check("v_cache", vcall, vref64, vref, dt)
    for i in range(b):
        lo = int(leftpad[i]) if leftpad is not None else 0
        hi = int(seqlens[i]) + (snew if append else 0)
        r = rows[i]
        kw = dict(causal=causal, window_size=window, softcap=softcap, alibi_slopes=alibi)
        r64, l64 = ref_attention(qref64[i:i + 1], kref64[r:r + 1, lo:hi],
                                 vref64[r:r + 1, lo:hi], **kw)
        rlp, llp = ref_attention(qref[i:i + 1], kref[r:r + 1, lo:hi], vref[r:r + 1, lo:hi],
                                 lowp=True, **kw)
        check("out[%d]" % i, out[i:i + 1], r64, rlp, dt)
        check("lse[%d]" % i, lse[i:i + 1], l64, llp, dt)


# ---- dropout ----
def cpu_mask(q, k, v, dropout_p, **opts):
    """The keep mask of a call with the patched seed, read from a CPU call with
    return_attn_probs (every backend draws the same mask from the same seed)."""
    _, _, probs = flashc.flash_attn_func(q.cpu(), k.cpu(), v.cpu(), dropout_p,
                                         return_attn_probs=True, **opts)
    return ~torch.signbit(probs)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("opts", [{}, {"causal": True, "window_size": (5, 0)}],
                         ids=["plain", "causal-window"])
def test_dropout(device, dtype, opts, monkeypatch):
    monkeypatch.setattr(interface, "_draw_rng", lambda device, sk: (0x1234_5678_9abc, 24))
    dt = DT[dtype]
    p = 0.3
    q = rand(2, 9, 4, 16, device=device, dtype=dt, seed=30)
    k = rand(2, 11, 2, 16, device=device, dtype=dt, seed=31)
    v = rand(2, 11, 2, 16, device=device, dtype=dt, seed=32)
    keep = cpu_mask(q, k, v, p, **opts).to(device)
    check_fwd_bwd(lambda q, k, v: flashc.flash_attn_func(q, k, v, p, **opts),
                  lambda q, k, v, lowp: ref_attention(q, k, v, keep=keep, dropout_p=p,
                                                      lowp=lowp, **opts),
                  (q, k, v), dt, names="qkv")


def test_dropout_statistics():
    p = 0.25
    q, k, v = (rand(2, 64, 4, 8, seed=s) for s in (40, 41, 42))
    _, _, probs = flashc.flash_attn_func(q, k, v, p, return_attn_probs=True)
    frac = torch.signbit(probs).float().mean().item()
    assert abs(frac - p) < 0.02, frac  # 32768 Bernoulli(0.25) draws: sigma 0.0024


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_rng(device):
    """Seeds come from torch's generator of the device: manual_seed repeats a mask,
    and the next call draws another one."""
    dt = torch.float16
    q, k, v = (rand(2, 16, 4, 8, device=device, dtype=dt, seed=s) for s in (40, 41, 42))
    p = 0.25
    torch.manual_seed(5)
    a = flashc.flash_attn_func(q, k, v, p)
    b = flashc.flash_attn_func(q, k, v, p)
    torch.manual_seed(5)
    c = flashc.flash_attn_func(q, k, v, p)
    assert torch.equal(a, c) and not torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_dropout(device, monkeypatch):
    """The varlen backward regenerates the forward's mask: read it from probs on CPU."""
    monkeypatch.setattr(interface, "_draw_rng", lambda device, sk: (77, 0))
    dt = torch.float16
    h, d, p = 2, 16, 0.2
    q = rand(sum(LENS_Q), h, d, device=device, dtype=dt, seed=43)
    k = rand(sum(LENS_K), h, d, device=device, dtype=dt, seed=44)
    v = rand(sum(LENS_K), h, d, device=device, dtype=dt, seed=45)
    _, _, probs = flashc.flash_attn_varlen_func(q.cpu(), k.cpu(), v.cpu(), cu(LENS_Q, "cpu"),
                                                cu(LENS_K, "cpu"), max(LENS_Q), max(LENS_K),
                                                p, return_attn_probs=True)
    keep = (~torch.signbit(probs)).to(device)

    def ref(q, k, v, lowp):
        outs, oq, ok = [], 0, 0
        for b, (lq, lk) in enumerate(zip(LENS_Q, LENS_K)):
            o, _ = ref_attention(q[oq:oq + lq][None], k[ok:ok + lk][None], v[ok:ok + lk][None],
                                 keep=keep[b:b + 1, :, :lq, :lk], dropout_p=p, lowp=lowp)
            outs.append(o[0])
            oq, ok = oq + lq, ok + lk
        return torch.cat(outs), None
    check_fwd_bwd(lambda q, k, v: flashc.flash_attn_varlen_func(
        q, k, v, cu(LENS_Q, device), cu(LENS_K, device), max(LENS_Q), max(LENS_K), p),
        ref, (q, k, v), dt, names="qkv")


# ---- return_attn_probs, deterministic, strides ----
@pytest.mark.parametrize("device", DEVICES)
def test_return_attn_probs(device):
    dt = torch.float16
    q, k, v = (rand(2, 6, 4, 8, device=device, dtype=dt, seed=s) for s in (50, 51, 52))
    out, lse, probs = flashc.flash_attn_func(q, k, v, causal=True, window_size=(2, 0),
                                             return_attn_probs=True)
    r64, l64 = ref_attention(q.double(), k.double(), v.double(), causal=True, window_size=(2, 0))
    rlp, llp = ref_attention(q, k, v, causal=True, window_size=(2, 0), lowp=True)
    check("out", out, r64, rlp, dt)
    check("lse", lse, l64, llp, dt)
    assert lse.shape == (2, 4, 6) and lse.dtype == torch.float32
    if device == "cpu":
        assert probs.shape == (2, 4, 6, 6)
        ref_p = torch.exp(ref_attention_scores(q, k, causal=True, window_size=(2, 0)) -
                          l64.unsqueeze(-1))
        check("probs", probs, ref_p, ref_p, dt)
    else:  # as flash_attn: CUDA writes them with dropout only (test_return_attn_probs_dropout)
        assert probs.numel() == 0


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("varlen", [False, True], ids=["batched", "varlen"])
def test_return_attn_probs_dropout(device, dtype, varlen, monkeypatch):
    """With dropout every backend returns the probabilities, negative exactly where the
    call dropped: |probs| against the float64 softmax, the signs against the CPU's (the
    same seed draws the same mask), and out recomputed from the kept probabilities,
    sum_j max(P_ij, 0) v_j / (1 - p), against the float64 out of that mask. Varlen
    rows and keys past a sequence are 0."""
    monkeypatch.setattr(interface, "_draw_rng", lambda device, sk: (0x5eed_cafe, 40))
    dt, p, opts = DT[dtype], 0.3, dict(causal=True, window_size=(5, 0))
    lq, lk = [6, 0, 9], [8, 5, 7]
    q, k, v = (rand(sum(n), 4, 16, device=device, dtype=dt, seed=s)
               for n, s in ((lq, 53), (lk, 54), (lk, 55)))

    def call(q, k, v):
        if varlen:
            return flashc.flash_attn_varlen_func(q, k, v, cu(lq, q.device), cu(lk, q.device),
                                                 max(lq), max(lk), p, return_attn_probs=True,
                                                 **opts)
        return flashc.flash_attn_func(q.view(1, -1, 4, 16)[:, :6], k.view(1, -1, 4, 16)[:, :8],
                                      v.view(1, -1, 4, 16)[:, :8], p, return_attn_probs=True,
                                      **opts)
    out, lse, probs = call(q, k, v)
    _, _, cpu_probs = call(q.cpu(), k.cpu(), v.cpu())
    assert probs.shape == cpu_probs.shape and probs.dtype == torch.float32
    assert torch.equal(torch.signbit(probs).cpu(), torch.signbit(cpu_probs))
    assert bool((probs < 0).any())
    seqs = list(zip(lq, lk)) if varlen else [(6, 8)]
    oq = ok = 0
    for b, (nq, nk) in enumerate(seqs):
        qb, kb, vb = (t[o:o + n][None] for t, o, n in ((q, oq, nq), (k, ok, nk), (v, ok, nk)))
        pb = probs[b, :, :nq, :nk].cpu()
        assert not probs[b, :, nq:].any() and not probs[b, :, :, nk:].any()
        keep = ~torch.signbit(pb)[None]
        _, l64 = ref_attention(qb.double(), kb.double(), vb.double(), **opts)
        scores = ref_attention_scores(qb.cpu(), kb.cpu(), **opts)
        ref_p = torch.exp(scores - l64.cpu().unsqueeze(-1)).masked_fill(scores == -math.inf, 0)
        check("probs[%d]" % b, pb.abs()[None], ref_p, ref_p, dt)
        r64, _ = ref_attention(qb.double(), kb.double(), vb.double(), keep=keep.to(device),
                               dropout_p=p, **opts)
        rlp, _ = ref_attention(qb, kb, vb, keep=keep.to(device), dropout_p=p, lowp=True, **opts)
        o = out[oq:oq + nq] if varlen else out[0]
        check("out[%d]" % b, o[None], r64, rlp, dt)
        from_probs = torch.einsum("hqk,khd->qhd", pb.clamp(min=0).double(),
                                  vb[0].cpu().double()) / (1 - p)
        check("out from probs[%d]" % b, from_probs[None], r64, rlp, dt)
        oq, ok = oq + nq, ok + nk


def ref_attention_scores(q, k, causal, window_size):
    """Masked scaled scores [B, H, Sq, Sk] in float64 (-inf where masked)."""
    d = q.shape[-1]
    s = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double()) * d ** -0.5
    i = torch.arange(q.shape[1], device=q.device).view(-1, 1) + k.shape[1] - q.shape[1]
    j = torch.arange(k.shape[1], device=q.device).view(1, -1)
    left, right = window_size[0], 0 if causal else window_size[1]
    vis = torch.ones_like(s, dtype=torch.bool)
    if left >= 0:
        vis &= j >= i - left
    if right >= 0:
        vis &= j <= i + right
    return s.masked_fill(~vis, -math.inf)


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic(device):
    dt = torch.bfloat16
    q, k, v = (rand(2, 33, 4, 32, device=device, dtype=dt, seed=s) for s in (60, 61, 62))
    dout = rand(2, 33, 4, 32, device=device, dtype=dt, seed=63)
    grads = []
    for _ in range(2):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = flashc.flash_attn_func(*leaves, causal=True, deterministic=True)
        backward_or_skip(out, dout)
        grads.append([t.grad for t in leaves])
    for a, b in zip(*grads):
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_noncontiguous(device):
    """A last stride of 2 (copied, as flash_attn does) and permuted views (passed as they are)."""
    dt = torch.float16
    q = rand(2, 7, 4, 32, device=device, dtype=dt, seed=70)[..., ::2]
    k = rand(2, 4, 9, 16, device=device, dtype=dt, seed=71).transpose(1, 2)
    v = rand(9, 2, 4, 16, device=device, dtype=dt, seed=72).permute(1, 0, 2, 3)
    assert q.stride(-1) == 2 and not k.is_contiguous() and not v.is_contiguous()
    check_fwd_bwd(lambda q, k, v: flashc.flash_attn_func(q, k, v, causal=True),
                  lambda q, k, v, lowp: ref_attention(q, k, v, causal=True, lowp=lowp),
                  (q, k, v), dt, names="qkv")


@pytest.mark.parametrize("device", DEVICES)
def test_head_dim_1_any_stride(device):
    """A head dim of 1 whose stride is not 1 (a permuted view: torch calls it contiguous
    and keeps the stride): the library takes it as it is, forward, backward and the
    KV-cache call."""
    dt = torch.float16
    q, k, v = (rand(2, 1, s, 3, device=device, dtype=dt, seed=73 + i).permute(0, 2, 3, 1)
               for i, s in enumerate((5, 7, 7)))
    assert q.shape[-1] == 1 and q.stride(-1) == 15 and q.is_contiguous()
    check_fwd_bwd(lambda q, k, v: flashc.flash_attn_func(q, k, v, causal=True),
                  lambda q, k, v, lowp: ref_attention(q, k, v, causal=True, lowp=lowp),
                  (q, k, v), dt, names="qkv")
    out = flashc.flash_attn_with_kvcache(q, k, v, causal=True)
    torch.testing.assert_close(out, flashc.flash_attn_func(q, k, v, causal=True), rtol=0,
                               atol=0)


# ---- tensors with no elements: answered as flash_attn answers them ----
@pytest.mark.parametrize("device", DEVICES)
def test_empty(device):
    dt = torch.float16
    # no keys: out = 0, softmax_lse = +inf, dq = 0 (dk, dv hold no elements)
    q = rand(2, 5, 4, 16, device=device, dtype=dt, seed=90).requires_grad_()
    k = torch.empty(2, 0, 2, 16, device=device, dtype=dt, requires_grad=True)
    v = torch.empty(2, 0, 2, 16, device=device, dtype=dt, requires_grad=True)
    out, lse, _ = flashc.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert out.shape == q.shape and torch.equal(out, torch.zeros_like(out))
    assert lse.shape == (2, 4, 5) and bool(torch.isinf(lse).all()) and bool((lse > 0).all())
    out.sum().backward()
    assert torch.equal(q.grad, torch.zeros_like(q))
    # no query: empty out; dk, dv = 0
    q = torch.empty(2, 0, 4, 16, device=device, dtype=dt, requires_grad=True)
    k = rand(2, 7, 2, 16, device=device, dtype=dt, seed=91).requires_grad_()
    v = rand(2, 7, 2, 16, device=device, dtype=dt, seed=92).requires_grad_()
    out = flashc.flash_attn_func(q, k, v)
    assert out.shape == (2, 0, 4, 16)
    out.sum().backward()
    assert torch.equal(k.grad, torch.zeros_like(k)) and torch.equal(v.grad, torch.zeros_like(v))
    # batch 0, packed
    qkv = torch.empty(0, 5, 3, 4, 16, device=device, dtype=dt)
    assert flashc.flash_attn_qkvpacked_func(qkv).shape == (0, 5, 4, 16)
    # varlen without any key: out = 0, lse = +inf
    q = rand(5, 4, 16, device=device, dtype=dt, seed=93).requires_grad_()
    k = torch.empty(0, 2, 16, device=device, dtype=dt, requires_grad=True)
    cu_q = torch.tensor([0, 2, 5], dtype=torch.int32, device=device)
    cu_k = torch.zeros(3, dtype=torch.int32, device=device)
    out, lse, _ = flashc.flash_attn_varlen_func(q, k, k, cu_q, cu_k, 3, 0,
                                                return_attn_probs=True)
    assert torch.equal(out, torch.zeros_like(out)) and lse.shape == (4, 5)
    assert bool(torch.isinf(lse).all())
    out.sum().backward()
    assert torch.equal(q.grad, torch.zeros_like(q))
    # decode with an empty batch
    kc = torch.empty(0, 8, 2, 16, device=device, dtype=dt)
    q = torch.empty(0, 1, 4, 16, device=device, dtype=dt)
    out = flashc.flash_attn_with_kvcache(q, kc, kc,
                                         cache_seqlens=torch.empty(0, dtype=torch.int32,
                                                                   device=device))
    assert out.shape == (0, 1, 4, 16)
    # a mismatch still reaches the library, which names it
    with pytest.raises(flashc.FlashcArgumentError, match=r"\.data is NULL|shape"):
        flashc.flash_attn_func(torch.empty(2, 0, 4, 16, device=device, dtype=dt),
                               rand(3, 7, 2, 16, device=device, dtype=dt),
                               rand(3, 7, 2, 16, device=device, dtype=dt))


# ---- bad input: the exception names the argument ----
@pytest.mark.parametrize("device", DEVICES)
def test_bad_input(device):
    dt = torch.float16
    q = rand(1, 4, 6, 16, device=device, dtype=dt)
    k = rand(1, 4, 4, 16, device=device, dtype=dt)
    with pytest.raises(ValueError, match=r"q\.shape\[2\]=6 \(heads\) is not a multiple of k"):
        flashc.flash_attn_func(q, k, k)
    with pytest.raises(flashc.FlashcArgumentError, match=r"k\.dtype=bf16"):
        flashc.flash_attn_func(q, k.bfloat16(), k)
    # v's head dim may differ from q's and k's (test_dv.py), its length may not
    with pytest.raises(flashc.FlashcArgumentError, match=r"v\.shape\[1\]=2 but k\.shape\[1\]=4"):
        flashc.flash_attn_func(q, q, q[:, :2])
    cq = torch.tensor([0, 4], dtype=torch.int64, device=device)
    with pytest.raises(flashc.FlashcArgumentError, match=r"cu_seqlens_q\.dtype=torch\.int64"):
        flashc.flash_attn_varlen_func(q[0], q[0], q[0], cq, cq.int(), 4, 4)
    kc = rand(1, 8, 6, 32, device=device, dtype=dt)[..., ::2]
    with pytest.raises(flashc.FlashcArgumentError, match=r"k_cache\.stride\(-1\)=2"):
        flashc.flash_attn_with_kvcache(q, kc, kc)
    kc = kc.contiguous()
    with pytest.raises(flashc.FlashcArgumentError, match=r"\bk\.shape\[3\]=8"):
        flashc.flash_attn_with_kvcache(q, kc, kc, k=kc[:, :1, :, :8].contiguous(),
                                       v=kc[:, :1, :, :8].contiguous(), cache_seqlens=2)


# ---- bert_padding and rotary ----
@pytest.mark.parametrize("device", DEVICES)
def test_bert_padding(device):
    b, s, h, d = 3, 6, 2, 8
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0]],
                        dtype=torch.bool, device=device)
    x = rand(b, s, h, d, device=device, dtype=torch.float16, seed=90)
    xu, idx, cus, maxs, used = bert_padding.unpad_input(x, mask)
    assert cus.tolist() == [0, 3, 9, 10] and maxs == 6 and used.tolist() == [3, 6, 1]
    assert cus.dtype == torch.int32 and xu.shape == (10, h, d)
    back = bert_padding.pad_input(xu, idx, b, s)
    assert torch.equal(back, x * mask[..., None, None])
    unused = torch.zeros_like(mask)
    unused[0, 3] = True
    _, _, cus2, _, used2 = bert_padding.unpad_input(x, mask, unused)
    assert cus2.tolist() == [0, 4, 10, 11] and used2.tolist() == [3, 6, 1]
    # varlen attention over the unpadded batch is padded attention with a key mask
    out = bert_padding.pad_input(
        flashc.flash_attn_varlen_func(xu, xu, xu, cus, cus, maxs, maxs), idx, b, s)
    for i in range(b):
        n = int(mask[i].sum())
        r64, _ = ref_attention(*(x[i:i + 1, :n].double(),) * 3)
        rlp, _ = ref_attention(*(x[i:i + 1, :n],) * 3, lowp=True)
        check("out[%d]" % i, out[i:i + 1, :n], r64, rlp, torch.float16)
    xg = x.float().requires_grad_()
    bert_padding.pad_input(bert_padding.unpad_input(xg, mask)[0], idx, b, s).sum().backward()
    assert torch.equal(xg.grad, mask[..., None, None].float().expand_as(xg))


@pytest.mark.parametrize("interleaved", [False, True])
def test_apply_rotary_emb(interleaved):
    b, s, h, d, rd = 2, 5, 3, 16, 12
    x = rand(b, s, h, d, seed=91)
    ang = rand(20, rd // 2, seed=92) * 3
    cos, sin = ang.cos(), ang.sin()
    offsets = torch.tensor([0, 4])
    got = apply_rotary_emb(x, cos, sin, interleaved, seqlen_offsets=offsets)
    for i in range(b):
        want = rope_ref(x[i], cos, sin, torch.arange(s) + offsets[i], interleaved)
        assert torch.allclose(got[i], want, atol=1e-6)
    lens = [2, 5, 3]
    xv = rand(sum(lens), h, d, seed=93)
    gotv = apply_rotary_emb(xv, cos, sin, interleaved, seqlen_offsets=3,
                            cu_seqlens=cu(lens, "cpu"), max_seqlen=5)
    pos = torch.cat([torch.arange(n) + 3 for n in lens])
    assert torch.allclose(gotv, rope_ref(xv, cos, sin, pos, interleaved), atol=1e-6)
    xi = x.clone()
    assert apply_rotary_emb(xi, cos, sin, interleaved, inplace=True, seqlen_offsets=offsets) is xi
    assert torch.equal(xi, got)
    xg = x.clone().requires_grad_()
    apply_rotary_emb(xg, cos, sin, interleaved).square().sum().backward()
    assert torch.allclose(xg.grad, 2 * x, atol=1e-5)  # a rotation keeps the norm


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_current_stream():
    """The call is ordered on torch.cuda.current_stream(), not on the default stream."""
    q, k, v = (rand(2, 64, 4, 64, device="cuda", dtype=torch.float16, seed=s)
               for s in (100, 101, 102))
    want = flashc.flash_attn_func(q, k, v, causal=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = flashc.flash_attn_func(q, k, v, causal=True)
        got_cache = flashc.flash_attn_with_kvcache(q, k, v, causal=True)
    side.synchronize()
    assert torch.equal(got, want)
    assert torch.allclose(got_cache, want, atol=2e-3)


# ---- edge semantics: windows, softmax_scale=0, NaN, one-key rows, Python-side errors ----
@pytest.mark.parametrize("device", DEVICES)
def test_window_any_int(device):
    """window_size takes any Python int: a side >= the sequence (2^31, 2^64, ...) or
    negative is unbounded, as flash_attn; a non-int is an argument error."""
    dt = torch.float16 if device == "cuda" else torch.float32
    q, k, v = (rand(2, 9, 2, 16, device=device, dtype=dt, seed=s) for s in (1, 2, 3))
    full = flashc.flash_attn_func(q, k, v)
    for w in ((2 ** 31, 2 ** 32), (2 ** 40, -5), (-7, 2 ** 64), (10 ** 30, 9)):
        assert torch.equal(flashc.flash_attn_func(q, k, v, window_size=w), full), w
    left = flashc.flash_attn_func(q, k, v, window_size=(2, 2 ** 33))
    assert torch.equal(left, flashc.flash_attn_func(q, k, v, window_size=(2, -1)))
    for bad in ((1.5, 2), (1, "2"), (1,), 3, (True, 1)):
        with pytest.raises(flashc.FlashcArgumentError, match="window_size"):
            flashc.flash_attn_func(q, k, v, window_size=bad)


@pytest.mark.parametrize("device", DEVICES)
def test_softmax_scale_zero(device):
    """softmax_scale=0.0 is a scale of 0 (uniform attention), only None the default."""
    dt = torch.float16 if device == "cuda" else torch.float32
    q, k, v = (rand(2, 7, 3, 32, device=device, dtype=dt, seed=s).requires_grad_()
               for s in (4, 5, 6))
    out = flashc.flash_attn_func(q, k, v, softmax_scale=0.0)
    mean = v.detach().double().mean(dim=1, keepdim=True).expand(-1, 7, -1, -1)
    assert (out.double() - mean).abs().max().item() <= ATOL[dt]
    out.backward(rand(*out.shape, device=device, dtype=dt, seed=7))
    assert q.grad.abs().max().item() == 0.0 and k.grad.abs().max().item() == 0.0
    default = flashc.flash_attn_func(q, k, v, softmax_scale=None)
    assert torch.equal(default, flashc.flash_attn_func(q, k, v, softmax_scale=32 ** -0.5))
    with pytest.raises(flashc.FlashcArgumentError, match="softmax_scale"):
        flashc.flash_attn_func(q, k, v, softmax_scale="1")


@pytest.mark.parametrize("device", DEVICES)
def test_nan_propagates(device):
    """A NaN in q makes its row's out and lse NaN and reaches dq of the row and dk, dv
    of the keys it sees (as PyTorch and flash_attn); the other rows stay finite."""
    dt = torch.float16 if device == "cuda" else torch.float32
    q, k, v = (rand(1, 6, 2, 16, device=device, dtype=dt, seed=s) for s in (8, 9, 10))
    q[0, 2, 1, 0] = float("nan")
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, lse, _ = flashc.flash_attn_func(q, k, v, return_attn_probs=True)
    assert torch.isnan(out[0, 2, 1]).all() and torch.isnan(lse[0, 1, 2])
    mask = torch.ones_like(out, dtype=torch.bool)
    mask[0, 2, 1] = False
    assert torch.isfinite(out[mask]).all()
    out.backward(rand(*out.shape, device=device, dtype=dt, seed=11))
    assert torch.isnan(q.grad[0, 2, 1]).all() and torch.isfinite(q.grad[mask]).all()
    assert torch.isnan(k.grad[0, :, 1]).all() and torch.isnan(v.grad[0, :, 1]).all()
    assert torch.isfinite(k.grad[0, :, 0]).all() and torch.isfinite(v.grad[0, :, 0]).all()


@pytest.mark.parametrize("device,dtype", [(d, t) for d, t in DEVICE_DTYPES if t != "fp32"])
def test_one_key_rows_dropout(device, dtype):
    """flash_attn's case: 339 queries on one key, ALiBi (batch, heads), dropout,
    deterministic: a softmax over one element has zero gradient, so dq and dk are 0."""
    dt = DT[dtype]
    d = 59 if dtype == "fp16" else 192
    q = rand(1, 339, 12, d, device=device, dtype=dt, seed=12).requires_grad_()
    k, v = (rand(1, 1, 12, d, device=device, dtype=dt, seed=s).requires_grad_() for s in (13, 14))
    alibi = torch.rand(1, 12, device=device, generator=None) * 0.3
    # return_attn_probs as flash_attn's test asks (CPU only: the CUDA backend has no probs)
    out = flashc.flash_attn_func(q, k, v, dropout_p=0.17, alibi_slopes=alibi,
                                 deterministic=True, return_attn_probs=device == "cpu")
    out = out[0] if device == "cpu" else out
    backward_or_skip(out, rand(*out.shape, device=device, dtype=dt, seed=15))
    assert q.grad.abs().max().item() == 0.0
    assert k.grad.abs().max().item() == 0.0


@pytest.mark.parametrize("device", DEVICES)
def test_bad_input_python_layer(device):
    """What the Python layer rejects itself, as FlashcArgumentError naming the argument."""
    dt = torch.float16
    q = rand(1, 4, 2, 16, device=device, dtype=dt)
    with pytest.raises(flashc.FlashcArgumentError, match=r"q\.shape\[-1\]=0"):
        flashc.flash_attn_func(q[..., :0], q[..., :0], q[..., :0])
    with pytest.raises(flashc.FlashcArgumentError, match=r"q\.dim\(\)=3 but q must be"):
        flashc.flash_attn_func(q[0], q, q)
    with pytest.raises(flashc.FlashcArgumentError, match=r"k\.dim\(\)=5"):
        flashc.flash_attn_func(q, q[None], q)
    with pytest.raises(flashc.FlashcArgumentError, match=r"qkv\.dim\(\)=4"):
        flashc.flash_attn_qkvpacked_func(q)
    with pytest.raises(flashc.FlashcArgumentError, match=r"q\.dim\(\)=4 but q must be \(total"):
        cu = torch.tensor([0, 4], dtype=torch.int32, device=device)
        flashc.flash_attn_varlen_func(q, q[0], q[0], cu, cu, 4, 4)
    for name in ("cu_seqlens_q", "cu_seqlens_k"):
        cu = torch.tensor([0, 4], dtype=torch.int32, device=device)
        bad = dict(cu_seqlens_q=cu, cu_seqlens_k=cu)
        bad[name] = cu.long()
        with pytest.raises(flashc.FlashcArgumentError, match=name + r".*must be torch\.int32"):
            flashc.flash_attn_varlen_func(q[0], q[0], q[0], max_seqlen_q=4, max_seqlen_k=4, **bad)
    kc = rand(1, 8, 2, 16, device=device, dtype=dt)
    for name in ("cache_seqlens", "cache_batch_idx", "cache_leftpad"):
        with pytest.raises(flashc.FlashcArgumentError, match=name + r".*must be torch\.int32"):
            flashc.flash_attn_with_kvcache(q[:, :1], kc, kc,
                                           **{name: torch.zeros(1, dtype=torch.int64,
                                                                device=device)})
    with pytest.raises(flashc.FlashcArgumentError, match=r"block_table.*must be torch\.int32"):
        flashc.flash_attn_with_kvcache(q[:, :1], kc, kc, cache_seqlens=2,
                                       block_table=torch.zeros(1, 1, dtype=torch.int64,
                                                               device=device))
