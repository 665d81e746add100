"""test_sdpa.py : flashc.sdpa, torch.nn.functional.scaled_dot_product_attention calls routed
to flashc.

Calls flashc supports, under route(), against torch's own SDPA on float64 inputs (outputs
and gradients, DEVICES and dtypes of test_flashc.py, DEVELOPERS.md's tolerance rule with
a same-precision naive SDPA as the baseline): causal and not, Sq < = > Sk (SDPA's top-left
causal), GQA/MQA with enable_gqa, scale; each asserts that flashc ran the call. Calls it
does not support fall back to torch's SDPA bitwise, with their reason counted; the reading
of a mask answers as the definition of the forms does on every form and on masks one or
two elements away (test_mask_forms_exact); nesting and leaving the route restore torch's
behaviour; a small attention module runs unedited under it, eagerly and through
torch.compile; `python -m flashc.sdpa script.py` runs a script under it; and where HF transformers is installed (it is not in .venv: the test
skips), a small Llama with attn_implementation="sdpa" trains and decodes under it.

Run:  FLASHC_LIBRARY=build/libflashc.so PYTHONPATH=python python3 -m pytest tests/python -q
"""
import logging
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import flashc
from flashc import _lib, interface, sdpa
from test_flashc import DEVICE_DTYPES, DEVICES, DT, backward_or_skip, check, rand

FLASHC_DIR = os.path.dirname(os.path.dirname(os.path.abspath(flashc.__file__)))


def naive_sdpa(q, k, v, is_causal=False, scale=None, lowp=False, mask=None):
    """SDPA's definition on (B, H, S, D), key heads repeated for GQA, the causal mask
    top-left, a bool mask (True: seen; a row with no key gives 0): fp32 math rounded to q's
    dtype at the scores, probabilities and output (the same-precision baseline of the
    tolerance rule), or with lowp=False float64."""
    dt, wt = q.dtype, torch.float32 if lowp else torch.float64

    def rnd(x):
        return x.to(dt).to(wt) if lowp else x
    rep = q.shape[1] // k.shape[1]
    k, v = (t.to(wt).repeat_interleave(rep, dim=1) for t in (k, v))
    s = rnd(q.to(wt) @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale))
    if is_causal:
        above = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1)
        s = s.masked_fill(above, -math.inf)
    if mask is None:
        return rnd(rnd(torch.softmax(s, dim=-1)) @ v)
    seen = mask.expand(s.shape)
    any_key = seen.any(-1, keepdim=True)
    p = torch.softmax(torch.where(any_key, s.masked_fill(~seen, -math.inf), 0.0), dim=-1)
    return rnd(rnd(torch.where(any_key, p, 0.0)) @ v)


# ---- calls flashc runs ----
SHAPES = [  # B, Hq, Hk, Sq, Sk, D
    (2, 4, 4, 7, 7, 16),
    (1, 4, 2, 5, 13, 5),
    (2, 6, 1, 13, 6, 33),
    (1, 2, 2, 1, 9, 64),
]


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("scale", [None, 0.37])
def test_routed(device, dtype, shape, is_causal, scale):
    dt = DT[dtype]
    b, hq, hk, sq, sk, d = shape
    kw = dict(is_causal=is_causal, scale=scale, enable_gqa=hq != hk)
    inputs = [rand(b, h, s, d, device=device, dtype=dt, seed=i + 1)
              for i, (h, s) in enumerate(((hq, sq), (hk, sk), (hk, sk)))]
    leaves = [t.clone().requires_grad_() for t in inputs]
    assert sdpa.fallback_reason(*leaves, **kw) is None
    with sdpa.route() as r:
        out = F.scaled_dot_product_attention(*leaves, **kw)
    assert (r.routed, r.fallbacks) == (1, {})
    check_sdpa(out, leaves, inputs, lambda *t: F.scaled_dot_product_attention(*t, **kw),
               lambda *t: naive_sdpa(*t, is_causal=is_causal, scale=scale, lowp=True))


def check_sdpa(out, leaves, inputs, ref_fn, base_fn):
    """out (of leaves, copies of inputs) and the leaves' gradients for one random dout
    against ref_fn on float64 copies of inputs, with base_fn on same-precision copies as
    the tolerance rule's baseline."""
    dt = out.dtype
    r64 = [t.double().requires_grad_() for t in inputs]
    rlp = [t.clone().requires_grad_() for t in inputs]
    ref, base = ref_fn(*r64), base_fn(*rlp)
    assert out.shape == ref.shape and out.dtype == inputs[0].dtype
    check("out", out, ref, base, dt)
    dout = rand(*out.shape, device=out.device, dtype=dt, seed=99)
    backward_or_skip(out, dout)
    ref.backward(dout.double())
    base.backward(dout.float())
    for name, a, g64, glp in zip("qkv", leaves, r64, rlp):
        check("d" + name, a.grad, g64.grad, glp.grad, dt)


def test_dropout():
    """dropout_p reaches flashc: the output is flash_attn_func's with the same seed, and
    the mask changes with the seed."""
    q, k, v = (rand(2, 3, 9, 16, seed=s) for s in (20, 21, 22))
    with sdpa.route() as r:
        torch.manual_seed(5)
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.3, is_causal=True)
        torch.manual_seed(6)
        other = F.scaled_dot_product_attention(q, k, v, dropout_p=0.3, is_causal=True)
    assert r.routed == 2
    torch.manual_seed(5)
    want = flashc.flash_attn_func(*(t.transpose(1, 2) for t in (q, k, v)), dropout_p=0.3,
                                  causal=True).transpose(1, 2)
    assert torch.equal(out, want) and not torch.equal(out, other)


def test_positional_and_layout():
    """SDPA's parameters positionally; any strides of (B, H, S, D) views; the output's
    layout is (B, S, H, D) contiguous, transposed, as torch's flash kernels return it."""
    q, k, v = (rand(2, 7, 3, 8, seed=s).transpose(1, 2) for s in (30, 31, 32))
    with sdpa.route() as r:
        out = F.scaled_dot_product_attention(q, k, v, None, 0.0, True, scale=0.5)
    assert r.routed == 1
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v, None, 0.0, True, scale=0.5),
                          atol=1e-5)
    assert out.transpose(1, 2).is_contiguous()


# ---- calls with an attention mask ----
MASK_SHAPES = [  # B, Hq, Hk, Sq, Sk, D
    (3, 4, 2, 7, 7, 16),
    (3, 2, 2, 5, 11, 8),
    (3, 2, 1, 9, 4, 8),
]


def key_lens(sk, b):
    """The keys of each of b <= 3 batches: all, half, one."""
    return [sk, max(sk // 2, 1), 1][:b]


def make_mask(form, b, sq, sk, device="cpu"):
    """A bool mask (True: the query sees the key) of one form, "pad-right" or "pad-left"
    (key padding of key_lens, (B, 1, Sq, Sk) as HF transformers gives it), "causal-tl",
    "causal-br" (top-left (Sq, Sk) and bottom-right (1, 1, Sq, Sk) causal), or padding and
    causal together ("pad-left-causal-br": HF's mask for left-padded prompts and decoding,
    "pad-right-causal-br", "pad-right-causal-tl")."""
    i, j = torch.arange(sq)[:, None], torch.arange(sk)
    causal = {"tl": j <= i, "br": j <= i + sk - sq}
    side, _, corner = form.partition("-causal-")
    if side.startswith("causal"):
        m = causal[side[-2:]]
        return (m if side.endswith("tl") else m[None, None]).to(device)
    keys = torch.stack([j < n if side == "pad-right" else j >= sk - n for n in key_lens(sk, b)])
    m = keys[:, None, None, :].expand(b, 1, sq, sk)
    return (m & causal[corner] if corner else m).to(device)


def as_kind(mask, kind, dtype):
    """The bool mask as SDPA takes it: "bool", or additive in dtype with -inf ("inf") or
    the dtype's minimum ("min", HF transformers' fill) where masked."""
    if kind == "bool":
        return mask
    fill = -math.inf if kind == "inf" else torch.finfo(dtype).min
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, fill)


MASK_FORMS = ["pad-right", "pad-left", "causal-tl", "causal-br", "pad-left-causal-br",
              "pad-right-causal-br", "pad-right-causal-tl"]


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("shape", MASK_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("form", MASK_FORMS)
@pytest.mark.parametrize("kind", ["bool", "inf", "min"])
@pytest.mark.parametrize("batches", ["each", "shared"])
def test_masked(device, dtype, shape, form, kind, batches):
    """Each mask form, bool or additive, runs on flashc, out and gradients against torch's
    SDPA in float64 with the same mask (fully masked rows: 0, as torch gives); a mask
    filled with the dtype's minimum that has a fully masked row falls back (torch's SDPA
    gives it a softmax over every key). Each batch its own keys ("each": the calls gather
    rows) or one (1, 1, Sq, Sk) padding mask for all ("shared": the calls run on slices)."""
    dt = DT[dtype]
    b, hq, hk, sq, sk, d = shape
    if batches == "shared" and not form.startswith("pad"):
        pytest.skip("a causal mask alone is shared by every batch already")
    bool_mask = make_mask(form, b, sq, sk, device) if batches == "each" else \
        make_mask(form, 2, sq, sk, device)[1:]  # (key_lens' second: half the keys)
    mask = as_kind(bool_mask, kind, dt)
    kw = dict(attn_mask=mask, enable_gqa=hq != hk)
    inputs = [rand(b, h, s, d, device=device, dtype=dt, seed=i + 60)
              for i, (h, s) in enumerate(((hq, sq), (hk, sk), (hk, sk)))]
    leaves = [t.clone().requires_grad_() for t in inputs]
    with sdpa.route() as r:
        out = F.scaled_dot_product_attention(*leaves, **kw)
    if kind == "min" and not bool(bool_mask.expand(b, 1, sq, sk).any(-1).all()):
        assert r.routed == 0 and "fully masked rows" in next(iter(r.fallbacks))
        return
    assert (r.routed, r.fallbacks) == (1, {})
    mask64 = bool_mask if kind == "bool" else mask.double()
    check_sdpa(out, leaves, inputs, lambda *t: F.scaled_dot_product_attention(
        *t, attn_mask=mask64, enable_gqa=hq != hk), lambda *t: naive_sdpa(
        *t, mask=bool_mask, lowp=True))


@pytest.mark.parametrize("masked", [1, 2], ids=["one_batch", "every_batch"])
def test_masked_all_keys_masked(masked):
    """A batch whose every key is masked gets out 0 and zero gradients (torch's answer);
    the other batches run as usual; with every batch masked (a (1, 1, Sq, Sk) mask of
    False) no flashc call runs and the whole output is 0."""
    q, k, v = (rand(2, 2, 5, 8, seed=s).requires_grad_() for s in (70, 71, 72))
    mask = torch.ones(2, 1, 5, 5, dtype=torch.bool)
    mask[1] = False
    if masked == 2:
        mask = mask[1:]
    with sdpa.route() as r:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert r.routed == 1
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    want_grads = torch.autograd.grad(want.sum(), (q, k, v), allow_unused=True)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    torch.testing.assert_close(out, want)
    for g, w in zip(grads, want_grads):
        assert torch.equal(g[1], torch.zeros_like(g[1]))
        torch.testing.assert_close(g, w)


def test_mask_read_once(monkeypatch):
    """The mask is read once however many layers pass it (HF transformers passes one mask
    object to each), again when it is written in place or another mask comes."""
    reads = []
    plan_of = sdpa._plan_of
    monkeypatch.setattr(sdpa, "_plan_of", lambda *a: reads.append(1) or plan_of(*a))
    q = rand(3, 2, 6, 8, seed=73)
    mask = make_mask("pad-left-causal-br", 3, 6, 6)
    with sdpa.route() as r:
        for _ in range(4):
            F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
        assert len(reads) == 1
        mask[0, 0, 5, 0] = False  # a hole: no longer a padding mask
        F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
        F.scaled_dot_product_attention(q, q, q, attn_mask=make_mask("pad-right", 3, 6, 6))
    assert len(reads) == 3 and r.routed == 5 and sum(r.fallbacks.values()) == 1


def mask_answer(mask, b, sq, sk):
    """What sdpa._plan_of must answer for mask ([B or 1, 1,] Sq or 1, Sk or 1), by its
    definition, element by element: ("values",) for a float mask with an element neither 0
    nor <= its dtype's minimum; ("run",) when the keys some query of a batch sees are not
    one run [lo, hi); ("form",) when no off of None, Sk - Sq, 0 (that order) makes every
    row i of every batch exactly keys [lo, hi) with j <= i + off; ("fill",) for a float
    mask with the dtype's minimum in it and a row that sees no key; else ("calls",
    sdpa._calls of that form)."""
    mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    m = mask.expand(mask.shape[0], 1, sq, sk)[:, 0]
    if m.dtype != torch.bool:
        if not bool(((m == 0) | (m <= torch.finfo(m.dtype).min)).all()):
            return ("values",)
        m = m == 0
    starts, ends = [], []
    for rows in m:
        keys = [j for j in range(sk) if rows[:, j].any()]
        if keys != list(range(keys[0], keys[-1] + 1) if keys else []):
            return ("run",)
        starts.append(keys[0] if keys else sk)
        ends.append(keys[-1] + 1 if keys else 0)
    i, j = torch.arange(sq)[:, None], torch.arange(sk)
    for off in [None] + sorted({sk - sq, 0}, reverse=True):
        diag = torch.ones(sq, sk, dtype=torch.bool) if off is None else j <= i + off
        if all(torch.equal(rows, (j >= lo) & (j < hi) & diag)
               for rows, lo, hi in zip(m, starts, ends)):
            break
    else:
        return ("form",)
    starts, ends = starts * (b // len(starts)), ends * (b // len(ends))
    empty = any(not rows.any(dim=1).all() for rows in m)
    if mask.dtype != torch.bool and empty and bool((mask == torch.finfo(mask.dtype).min).any()):
        return ("fill",)
    return ("calls", sdpa._calls(starts, ends, off, sq))


def same_answer(got, want):
    """sdpa._plan_of's answer got against mask_answer's want."""
    reasons = {"values": "(a bias)", "run": "not one run", "form": "a causal mask (top-left",
               "fill": "fully masked rows"}
    if want[0] != "calls":
        return isinstance(got, str) and reasons[want[0]] in got
    return not isinstance(got, str) and len(got) == len(want[1]) and all(
        all(torch.equal(x.cpu(), y) if isinstance(y, torch.Tensor) else x == y
            for x, y in zip(g, w)) for g, w in zip(got, want[1]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("sq,sk", [(5, 7), (7, 5), (6, 6)], ids=["5x7", "7x5", "6x6"])
@pytest.mark.parametrize("form", MASK_FORMS)
def test_mask_forms_exact(form, sq, sk, device):
    """sdpa._plan_of against the definition of the masks flashc runs (mask_answer) on every
    form, bool and additive (-inf, the minimum, both), broadcast or not, and on masks one
    or two elements away: each element flipped, 100 random moves of a seen element to an
    unseen place of its batch (as many elements seen: counts alone cannot tell), and in the
    additive ones every third element set to -0.0 (a 0), NaN, +inf, -1 (a bias)."""
    b = 2
    base = make_mask(form, b, sq, sk)
    masks = [base, base.expand(b, 1, sq, sk).clone()]
    full = masks[1]
    for e in range(full.numel()):
        flipped = full.clone()
        flipped.view(-1)[e] ^= True
        masks.append(flipped)
    g = torch.Generator().manual_seed(sq * 100 + sk)
    for _ in range(100):
        bi = int(torch.randint(b, (1,), generator=g))
        seen, unseen = full[bi, 0].flatten().nonzero(), (~full[bi, 0]).flatten().nonzero()
        if len(seen) and len(unseen):
            moved = full.clone()
            for place, value in ((seen, False), (unseen, True)):
                moved[bi, 0].view(-1)[place[int(torch.randint(len(place), (1,), generator=g))]] = value
            masks.append(moved)
    dt = torch.bfloat16
    low = torch.finfo(dt).min
    for kind in ("inf", "min"):
        masks.append(as_kind(base, kind, dt))
    both = as_kind(full, "inf", dt)
    both[0, 0, :, ::2] = both[0, 0, :, ::2].clamp(min=low)  # -inf and the minimum mixed
    masks.append(both)
    additive = as_kind(full, "min", dt)
    for e in range(0, additive.numel(), 3):
        for x in (-0.0, math.nan, math.inf, -1.0):
            m = additive.clone()
            m.view(-1)[e] = x
            masks.append(m)
    for mask in masks:
        got = sdpa._plan_of(mask.to(device), b, sq, sk)
        want = mask_answer(mask, b, sq, sk)
        assert same_answer(got, want), (mask, got, want)


@pytest.mark.skipif(not interface._CUSTOM_OP or
                    tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 6),
                    reason="torch.compile traces TorchFunctionModes from torch 2.6 on")
def test_mask_compiled_falls_back():
    """Under torch.compile a call with a mask goes to torch's SDPA (telling the mask's form
    reads it): the graph holds no flashc op and the output is torch's."""
    q = rand(3, 2, 6, 8, seed=74)
    mask = make_mask("pad-right-causal-br", 3, 6, 6)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm.code)
        return gm.forward
    fn = torch.compile(lambda q, m: F.scaled_dot_product_attention(q, q, q, attn_mask=m),
                       backend=backend, fullgraph=True)
    with sdpa.route():
        out = fn(q, mask)
    assert len(graphs) == 1 and "flashc" not in graphs[0]
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, q, q, attn_mask=mask))


# ---- calls torch runs ----
def fallback_cases():
    """(id, q, k, v, SDPA keyword arguments, part of the reason)."""
    q, k = rand(2, 4, 6, 8, seed=40), rand(2, 4, 9, 8, seed=41)
    mask = rand(6, 9, seed=42) > 0
    # masks one element away from a form flashc runs: detection is exact
    almost_pad = make_mask("pad-right", 2, 6, 9).clone()
    almost_pad[1, 0, 3, 7] = True  # one query sees one padded key
    pad_hole = make_mask("pad-left", 2, 6, 9).clone()
    pad_hole[0, 0, 2, 4] = False
    causal_hole = make_mask("causal-br", 2, 6, 9).clone()
    causal_hole[0, 0, 4, 7] = False  # the diagonal
    causal_extra = make_mask("pad-left-causal-br", 2, 6, 9).clone()
    causal_extra[1, 0, 0, 8] = True  # a key past the diagonal
    keys_gap = torch.ones(2, 1, 6, 9, dtype=torch.bool)
    keys_gap[:, :, :, 2] = False
    per_head = make_mask("pad-right", 2, 6, 9).expand(2, 4, 6, 9)
    return [
        ("almost_pad", q, k, k, dict(attn_mask=almost_pad), "not a key-padding mask"),
        ("pad_hole", q, k, k, dict(attn_mask=pad_hole), "not a key-padding mask, a causal"),
        ("causal_hole", q, k, k, dict(attn_mask=causal_hole), "not a key-padding mask, a causal"),
        ("causal_extra", q, k, k, dict(attn_mask=causal_extra), "a causal mask"),
        ("keys_gap", q, k, k, dict(attn_mask=keys_gap), "not one run"),
        ("per_head_mask", q, k, k, dict(attn_mask=per_head), "varies per head"),
        ("bool_mask", q, k, k, dict(attn_mask=mask), "attn_mask is not"),
        ("float_mask", q, k, k, dict(attn_mask=rand(2, 1, 6, 9, seed=43)), "(a bias)"),
        ("3d", q[0], k[0], k[0], {}, "dim()=3"),
        ("float64", q.double(), k.double(), k.double(), {}, "torch.float64"),
        ("headdim_300", rand(1, 2, 3, 300, seed=44), rand(1, 2, 3, 300, seed=45),
         rand(1, 2, 3, 300, seed=46), {}, "head dims"),
        ("value_headdim", q, k, rand(2, 4, 9, 4, seed=47), {}, "value shaped"),
        ("mqa_broadcast", q, k[:, :1], k[:, :1], {}, "enable_gqa=False"),
        ("empty_keys", q, k[:, :, :0], k[:, :, :0], {}, "empty"),
        ("dropout_1", q, k, k, dict(dropout_p=1.0), "dropout_p"),
    ]


@pytest.mark.parametrize("case", fallback_cases(), ids=lambda c: c[0])
def test_fallback(case, caplog):
    """Outputs and gradients bitwise torch's, the reason counted and logged once."""
    _, q, k, v, kw, reason = case
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with caplog.at_level(logging.INFO, logger="flashc.sdpa"):
        with sdpa.route() as r:
            out = F.scaled_dot_product_attention(*leaves, **kw)
            F.scaled_dot_product_attention(*leaves, **kw)
    assert r.routed == 0 and sum(r.fallbacks.values()) == 2
    (why,) = r.fallbacks
    assert reason in why and why == sdpa.fallback_reason(*leaves, **kw)
    assert [rec.getMessage().count(why) for rec in caplog.records
            if rec.name == "flashc.sdpa"] == [1]
    if out.numel() == 0:
        return
    torch.manual_seed(0)
    out.backward(torch.ones_like(out))
    ref_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*ref_leaves, **kw)
    ref.backward(torch.ones_like(ref))
    assert torch.equal(out, ref)
    for a, b in zip(leaves, ref_leaves):
        assert torch.equal(a.grad, b.grad)


@pytest.mark.parametrize("kv", ["gqa_off", "mixed_dtype", "mask_and_causal",
                                "mask_dtype"])
def test_fallback_errors_are_torchs(kv):
    """A call torch rejects (heads that differ without enable_gqa, dtypes that differ, a
    mask with is_causal, a float mask of another dtype) raises torch's error under the
    route too."""
    q, k = rand(1, 4, 5, 8, seed=50), rand(1, 2 if kv == "gqa_off" else 4, 5, 8, seed=51)
    k = k.half() if kv == "mixed_dtype" else k
    kw = {"mask_and_causal": dict(attn_mask=torch.ones(5, 5, dtype=torch.bool),
                                  is_causal=True),
          "mask_dtype": dict(attn_mask=torch.zeros(5, 5, dtype=torch.float64))}.get(kv, {})
    with pytest.raises(RuntimeError) as plain:
        F.scaled_dot_product_attention(q, k, k, **kw)
    with sdpa.route() as r, pytest.raises(RuntimeError) as routed:
        F.scaled_dot_product_attention(q, k, k, **kw)
    assert str(routed.value) == str(plain.value) and r.routed == 0
    with sdpa.route(), pytest.raises(TypeError):
        F.scaled_dot_product_attention(q, k, k, bad_argument=1)


def test_unsupported_falls_back(monkeypatch):
    """A forward the library refuses as FLASHC_ERR_UNSUPPORTED runs on torch; any other
    library error is raised."""
    q = rand(1, 2, 5, 8, seed=52)

    def refuse(status):
        def fn(*args, **kwargs):
            _lib.raise_for(status, "refused for the test")
        return fn
    monkeypatch.setattr(interface, "flash_attn_func", refuse(_lib.ERR_UNSUPPORTED))
    with sdpa.route() as r:
        out = F.scaled_dot_product_attention(q, q, q)
    assert r.routed == 0 and list(r.fallbacks) == ["FLASHC_ERR_UNSUPPORTED: refused for the test"]
    assert torch.equal(out, F.scaled_dot_product_attention(q, q, q))
    monkeypatch.setattr(interface, "flash_attn_func", refuse(_lib.ERR_INVALID_ARG))
    with sdpa.route(), pytest.raises(flashc.FlashcArgumentError):
        F.scaled_dot_product_attention(q, q, q)


# ---- entering and leaving ----
def mode_stack():
    return list(torch.overrides._get_current_function_mode_stack())


def test_nesting_and_exit():
    q, k = rand(1, 2, 5, 8, seed=60), rand(1, 2, 7, 8, seed=61)
    mask = rand(5, 7, seed=62)  # a bias: torch runs it
    before = mode_stack()
    plain = F.scaled_dot_product_attention(q, k, k, is_causal=True)
    with sdpa.route() as outer:
        with sdpa.route() as inner:
            F.scaled_dot_product_attention(q, k, k, is_causal=True)
            F.scaled_dot_product_attention(q, k, k, attn_mask=mask)
        # the inner route ran the first call; the second went through both to torch
        assert (inner.routed, sum(inner.fallbacks.values())) == (1, 1)
        assert (outer.routed, sum(outer.fallbacks.values())) == (0, 1)
        F.scaled_dot_product_attention(q, k, k)
        assert outer.routed == 1
    assert mode_stack() == before
    with pytest.raises(ZeroDivisionError):
        with sdpa.route():
            1 / 0
    assert mode_stack() == before
    # after the routes: torch's SDPA, bitwise, and nothing counted
    assert torch.equal(F.scaled_dot_product_attention(q, k, k, is_causal=True), plain)
    assert (outer.routed, inner.routed) == (1, 1)


# ---- a model, unedited ----
class Attention(nn.Module):
    """A decoder self-attention block as HF-style models write it: (B, H, S, D) heads,
    GQA through enable_gqa, scale and dropout passed, causal unless decoding one token
    against a cache."""

    def __init__(self, dim=32, heads=4, kv_heads=2, dropout=0.0):
        super().__init__()
        self.heads, self.kv_heads, self.hd, self.dropout = heads, kv_heads, dim // heads, dropout
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * kv_heads * self.hd)
        self.o = nn.Linear(dim, dim)

    def forward(self, x, past=None):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.hd).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, self.kv_heads, self.hd).permute(2, 0, 3, 1, 4)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0,
            is_causal=past is None and s > 1, scale=self.hd ** -0.5, enable_gqa=True)
        return self.o(y.transpose(1, 2).contiguous().view(b, s, -1)), (k, v)


class Model(nn.Module):
    def __init__(self, layers=2):
        super().__init__()
        self.blocks = nn.ModuleList(Attention() for _ in range(layers))

    def forward(self, x):
        for blk in self.blocks:
            x = x + blk(x)[0]
        return x


def model_grads(model, x):
    model.zero_grad()
    out = model(x)
    out.square().sum().backward()
    return out.detach(), [p.grad.clone() for p in model.parameters()]


def assert_close(a, b):
    assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), (a - b).abs().max().item()


def test_model_unedited():
    torch.manual_seed(0)
    model, x = Model(), torch.randn(2, 9, 32)
    want, want_grads = model_grads(model, x)
    with sdpa.route() as r:
        out, grads = model_grads(model, x)
        # a decode step with a cache: one query, is_causal False, Sq < Sk
        blk = model.blocks[0]
        _, cache = blk(x)
        step, _ = blk(x[:, -1:], past=tuple(t[:, :, :-1] for t in cache))
    assert (r.routed, r.fallbacks) == (4, {})
    assert_close(out, want)
    for a, b in zip(grads, want_grads):
        assert_close(a, b)
    assert_close(step, blk(x)[0][:, -1:])


@pytest.mark.skipif(not interface._CUSTOM_OP or
                    tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 6),
                    reason="torch.compile traces TorchFunctionModes from torch 2.6 on")
def test_model_compiled():
    """torch.compile(fullgraph=True) inside the route: the graph holds flashc's forward op
    (its backward is the op's registered autograd formula, outside the traced graph), and
    outputs and gradients are torch's; outside the route the same compiled model is
    recompiled back to torch's SDPA."""
    torch.manual_seed(0)
    model, x = Model(), torch.randn(2, 9, 32)
    want, want_grads = model_grads(model, x)
    graphs = []

    def backend(gm, example_inputs):
        # the graph and its subgraphs
        graphs.append("".join(m.code for m in gm.modules() if hasattr(m, "code")))
        return gm.forward
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    with sdpa.route():
        out, grads = model_grads(compiled, x)
    assert len(graphs) == 1
    assert graphs[0].count("torch.ops.flashc.fwd") == 2
    assert_close(out, want)
    for a, b in zip(grads, want_grads):
        assert_close(a, b)
    out, _ = model_grads(compiled, x)
    assert len(graphs) == 2 and "flashc" not in graphs[1]
    assert torch.equal(out, want)


# ---- python -m flashc.sdpa ----
SCRIPT = '''
import sys
import torch, torch.nn.functional as F
q = torch.rand(1, 2, 4, 8)
F.scaled_dot_product_attention(q, q, q, is_causal=True)
F.scaled_dot_product_attention(q, q, q, attn_mask=torch.rand(4, 4))
print(__name__, sys.argv[1:])
'''


@pytest.mark.parametrize("how", ["script", "module"])
def test_run_script(tmp_path, how):
    (tmp_path / "attn_script.py").write_text(SCRIPT)
    target = [str(tmp_path / "attn_script.py")] if how == "script" else ["-m", "attn_script"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([FLASHC_DIR, str(tmp_path)]))
    run = subprocess.run([sys.executable, "-m", "flashc.sdpa"] + target + ["--flag", "x"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[0] == "__main__ ['--flag', 'x']"
    assert "RuntimeWarning" not in run.stderr
    assert "1 scaled_dot_product_attention calls ran on flashc, 1 on torch\n" \
        "  1: attn_mask holds values other than 0, -inf and its dtype's minimum (a bias)" \
        in run.stderr


def test_hf_transformers_llama():
    """An HF transformers Llama (attn_implementation="sdpa", random weights from a config,
    nothing downloaded) under the route: batches without padding and greedy decoding with
    the KV cache run on flashc and match torch, and so do a left-padded batch and its
    greedy decoding, whose causal and padding masks flashc runs (transformers 5.25 passes
    them as bool (batch, 1, Sq, Sk) masks). Skips where transformers is not installed."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(cfg).eval()
    assert model.config._attn_implementation == "sdpa"
    ids = torch.randint(0, 100, (2, 12))
    padded = torch.ones(2, 12, dtype=torch.long)
    padded[0, :3] = 0

    def run(**kw):
        model.zero_grad()
        out = model(input_ids=ids, labels=ids, **kw)
        out.loss.backward()
        return [out.logits.detach()] + [p.grad.clone() for p in model.parameters()]
    want, want_padded = run(), run(attention_mask=padded)
    with torch.no_grad():
        want_tokens = model.generate(ids[:1], max_new_tokens=5, do_sample=False)
        want_padded_tokens = model.generate(ids, attention_mask=padded, max_new_tokens=4,
                                            do_sample=False)
    with sdpa.route() as r:
        got = run()
        assert (r.routed, r.fallbacks) == (2, {})
        got_padded = run(attention_mask=padded)
        assert (r.routed, r.fallbacks) == (4, {})
        with torch.no_grad():
            tokens = model.generate(ids[:1], max_new_tokens=5, do_sample=False)
            padded_tokens = model.generate(ids, attention_mask=padded, max_new_tokens=4,
                                           do_sample=False)
    assert (r.routed, r.fallbacks) == (22, {})
    assert torch.equal(tokens, want_tokens) and torch.equal(padded_tokens, want_padded_tokens)
    for a, b in zip(got + got_padded, want + want_padded):
        assert_close(a, b)
