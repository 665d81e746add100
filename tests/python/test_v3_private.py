"""test_v3_private.py : flashc.v3's _flash_attn_forward and _flash_attn_backward, FA3's
private ops, called as Transformer Engine calls them.

Transformer Engine's context-parallel attention (transformer_engine/pytorch/attention/
dot_product_attention/context_parallel.py) builds the positional arguments of these ops
with get_fa_args(use_flash_attn_3=True) and passes causal, softmax_scale, window_size (and
deterministic) by keyword; te_args below writes that list again from its documented
layout. Against flashc.v3's public functions: the forward bitwise (the same C call), the
backward into the caller's dq, dk, dv against the public functions' autograd gradients
(bitwise with deterministic), softmax_d against rowsum(dout * out) in FA3's layout;
batched and varlen, causal and window, GQA, seqused; the KV-cache arguments against
flash_attn_with_kvcache; a ring of two key blocks merged by flash_attn_combine, whose
merged out and lse the backward takes from outside; FA3's own positional backward call;
the signatures against FA3's lists; every argument flashc cannot honour raising. CPU and,
where torch sees one, CUDA tensors.

Run:  FLASHC_LIBRARY=build/libflashc.so PYTHONPATH=python python3 -m pytest tests/python -q
"""
import inspect

import pytest
import torch

import flashc
from flashc import v3
from test_flashc import (DEVICES, LENS_K, LENS_Q, UNSUPPORTED, call_or_skip, cu, paged,
                         rand)
from test_v3 import USED_K, USED_Q, parameters

# ---- FA3's parameter lists (Dao-AILab/flash-attention hopper/flash_attn_interface.py,
# commit 01afd16d248c4c7d0f9aed1914084f16c490eaed: flash_attn_3::_flash_attn_forward and
# ::_flash_attn_backward), names, order and defaults ----
FA3_PRIVATE = '''
def _flash_attn_forward(q, k, v, k_new=None, v_new=None, qv=None, out_=None,
                        cu_seqlens_q=None, cu_seqlens_k=None, cu_seqlens_k_new=None,
                        seqused_q=None, seqused_k=None, max_seqlen_q=None, max_seqlen_k=None,
                        page_table=None, kv_batch_idx=None, leftpad_k=None, rotary_cos=None,
                        rotary_sin=None, seqlens_rotary=None, q_descale=None, k_descale=None,
                        v_descale=None, softmax_scale=None, causal=False, window_size_left=-1,
                        window_size_right=-1, attention_chunk=0, softcap=0.0,
                        rotary_interleaved=True, scheduler_metadata=None, num_splits=1,
                        pack_gqa=None, sm_margin=0): ...
def _flash_attn_backward(dout, q, k, v, out, softmax_lse, cu_seqlens_q=None,
                         cu_seqlens_k=None, sequed_q=None, sequed_k=None, max_seqlen_q=None,
                         max_seqlen_k=None, dq=None, dk=None, dv=None, softmax_scale=None,
                         is_causal=False, window_size_left=-1, window_size_right=-1,
                         softcap=0.0, deterministic=False, sm_margin=0): ...
'''
# the keyword-only names flashc adds: those of FA3's releases before 01afd16, which
# Transformer Engine passes, and the backward's choice of return form
EXTRA = {"_flash_attn_forward": ["window_size"],
         "_flash_attn_backward": ["causal", "window_size", "returns"]}


@pytest.mark.parametrize("name", sorted(EXTRA))
def test_signature(name):
    stubs = {}
    exec(FA3_PRIVATE, stubs)
    params = parameters(getattr(v3, name))
    assert [p for p in params if p[1] != inspect.Parameter.KEYWORD_ONLY] == \
        parameters(stubs[name])
    assert [p[0] for p in params if p[1] == inspect.Parameter.KEYWORD_ONLY] == EXTRA[name]
    assert all(p[2] is None for p in params if p[1] == inspect.Parameter.KEYWORD_ONLY)


# ---- Transformer Engine's calls ----
def te_args(forward, qkv_format, cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q=None,
            max_seqlen_kv=None, dq=None, dk=None, dv=None):
    """The positional arguments Transformer Engine's get_fa_args gives FA3's private ops
    after q, k, v (forward) or after dout, q, k, v, out, softmax_lse (backward), for
    qkv_format "thd" (packed) or "bshd": forward k_new, v_new, qv, out, cu_seqlens_q,
    cu_seqlens_kv, cu_seqlens_k_new, seqused_q, seqused_k, max_seqlen_q, max_seqlen_kv,
    then page_table, kv_batch_idx, leftpad_k, rotary_cos, rotary_sin, seqlens_rotary and
    the three descales as None; backward cu_seqlens_q, cu_seqlens_kv, sequed_q, sequed_k,
    max_seqlen_q, max_seqlen_kv, dq, dk, dv. The cu_seqlens are None for "bshd"."""
    cus = [cu_seqlens_q, cu_seqlens_kv] if qkv_format == "thd" else [None, None]
    if forward:
        return [None] * 4 + cus + [None] * 3 + [max_seqlen_q, max_seqlen_kv] + [None] * 9
    return cus + [None, None, max_seqlen_q, max_seqlen_kv, dq, dk, dv]


def te_window(opts):
    """Transformer Engine's window_size keyword: (-1, 0) with causal, else the window."""
    return (-1, 0) if opts.get("causal") else opts.get("window_size", (-1, -1))


# B, Sq, Sk, H, Hk, D for "bshd"; "thd" runs LENS_Q, LENS_K with H, Hk, D
SHAPE = (2, 7, 9, 4, 2, 16)
OPTIONS = [{}, {"causal": True}, {"window_size": (3, 1)}, {"window_size": (2, 0), "softcap": 3.0},
           {"causal": True, "softmax_scale": 0.5}]


def inputs(fmt, device, dt=torch.float32, seed=50):
    """q, k, v, dout of format fmt, and the cu_seqlens and max_seqlens of "thd" (batched:
    None, None, Sq, Sk, as Transformer Engine passes them)."""
    b, sq, sk, h, hk, d = SHAPE
    if fmt == "thd":
        rows_q, rows_k = (sum(LENS_Q),), (sum(LENS_K),)
        lens = (cu(LENS_Q, device), cu(LENS_K, device), max(LENS_Q), max(LENS_K))
    else:
        rows_q, rows_k, lens = (b, sq), (b, sk), (None, None, sq, sk)
    q = rand(*rows_q, h, d, device=device, dtype=dt, seed=seed)
    k, v = (rand(*rows_k, hk, d, device=device, dtype=dt, seed=seed + i) for i in (1, 2))
    return (q, k, v, rand(*q.shape, device=device, dtype=dt, seed=seed + 3)) + lens


def public(fmt, q, k, v, cu_q, cu_k, max_q, max_k, **opts):
    """out, softmax_lse of v3's public function."""
    if fmt == "thd":
        return v3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k,
                                         return_attn_probs=True, **opts)
    return v3.flash_attn_func(q, k, v, return_attn_probs=True, **opts)


def public_grads(fmt, q, k, v, dout, lens, deterministic, **opts):
    """dq, dk, dv of the public function's autograd."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out, _ = public(fmt, *leaves, *lens, deterministic=deterministic, **opts)
    call_or_skip(lambda: out.backward(dout), q.device)
    return [t.grad for t in leaves]


def row_dot(dout, out):
    """rowsum(dout * out) over the head dim, fp32: (..., nheads)."""
    return (dout.float() * out.float()).sum(-1)


def check_softmax_d(fmt, softmax_d, dout, out, cu_q):
    """softmax_d in FA3's layout with blocks of 128 rows, 0 in the padding."""
    dot, h = row_dot(dout, out), dout.shape[-2]
    want = torch.zeros_like(softmax_d)
    if fmt == "thd":
        total, batch = dout.shape[0], len(LENS_Q)
        assert softmax_d.shape == (h, (total + 128 * batch + 127) // 128 * 128)
        starts = cu_q.tolist()
        for i, n in enumerate(LENS_Q):
            col = (starts[i] + 128 * i) // 128 * 128
            want[:, col:col + n] = dot[starts[i]:starts[i] + n].t()
    else:
        b, sq = dout.shape[:2]
        assert softmax_d.shape == (b, h, (sq + 127) // 128 * 128)
        want[:, :, :sq] = dot.transpose(1, 2)
    assert softmax_d.dtype == torch.float32
    torch.testing.assert_close(softmax_d, want.to(softmax_d.device), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["bshd", "thd"])
@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: "-".join(
    "%s=%s" % kv for kv in sorted(o.items())) or "plain")
@pytest.mark.parametrize("deterministic", [True, False], ids=["det", "nondet"])
def test_transformer_engine(device, fmt, opts, deterministic):
    """Forward and backward as Transformer Engine calls them: the forward's out and lse are
    the public function's, bitwise; the backward writes the public function's gradients
    into the caller's dq and into dk, dv views of one (2, ...) buffer; softmax_d."""
    dt = torch.float32 if device == "cpu" else torch.float16
    q, k, v, dout, cu_q, cu_k, max_q, max_k = inputs(fmt, device, dt)
    lens = (cu_q, cu_k, max_q, max_k)
    kw = dict(causal=opts.get("causal", False), softmax_scale=opts.get("softmax_scale"),
              window_size=te_window(opts))
    softcap = {"softcap": opts["softcap"]} if "softcap" in opts else {}
    outputs = v3._flash_attn_forward(q, k, v, *te_args(True, fmt, *lens), **kw, **softcap)
    assert len(outputs) == 4 and outputs[2].numel() == 0 and outputs[3].numel() == 0
    out, lse = outputs[:2]
    want_out, want_lse = public(fmt, q, k, v, *lens, **opts)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)

    dq = torch.full_like(q, float("nan"))
    dkv = torch.full((2,) + tuple(k.shape), float("nan"), dtype=dt, device=device)
    dk, dv = dkv.unbind(0)
    softmax_d = call_or_skip(lambda: v3._flash_attn_backward(
        dout, q, k, v, out, lse, *te_args(False, fmt, *lens, dq=dq, dk=dk, dv=dv), **kw,
        deterministic=deterministic, **softcap), device)
    grads = public_grads(fmt, q, k, v, dout, lens, deterministic, **opts)
    for name, got, want in zip("qkv", (dq, dk, dv), grads):
        if deterministic:
            assert torch.equal(got, want), "d" + name
        else:
            torch.testing.assert_close(got, want, msg="d" + name)  # tolerance of the dtype
    check_softmax_d(fmt, softmax_d, dout.cpu(), out.cpu(), None if cu_q is None else cu_q.cpu())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal,window", [(True, (-1, -1)), (False, (4, 1))],
                         ids=["causal", "window"])
def test_fa3_positional(device, causal, window):
    """FA3's own calls (01afd16): the forward with window_size_left, window_size_right, the
    backward positionally (is_causal, the window's two sides, softcap, deterministic,
    sm_margin); and the backward by Transformer Engine's keywords causal, window_size.
    Both write the public function's gradients; dq, dk, dv left None are allocated (as
    FA3) and the softmax_d is the same."""
    dt = torch.float32 if device == "cpu" else torch.bfloat16
    q, k, v, dout, _, _, sq, sk = inputs("bshd", device, dt)
    out, lse, _, _ = v3._flash_attn_forward(q, k, v, causal=causal, window_size_left=window[0],
                                            window_size_right=window[1])
    grads = [torch.empty_like(t) for t in (q, k, v)]
    softmax_d = call_or_skip(lambda: v3._flash_attn_backward(
        dout, q, k, v, out, lse, None, None, None, None, None, None, *grads, None, causal,
        *window, 0.0, True, 0), device)
    want = public_grads("bshd", q, k, v, dout, (None, None, sq, sk), True, causal=causal,
                        window_size=window)
    assert all(torch.equal(g, w) for g, w in zip(grads, want))
    dq, dk, dv = grads_kw = [torch.empty_like(t) for t in (q, k, v)]
    again = v3._flash_attn_backward(dout, q, k, v, out, lse,
                                    *te_args(False, "bshd", None, None, sq, sk, dq, dk, dv),
                                    causal=causal, window_size=window, deterministic=True)
    assert torch.equal(again, softmax_d)
    assert all(torch.equal(g, w) for g, w in zip(grads_kw, want))
    assert v3._flash_attn_backward(dout, q, k, v, out, lse, is_causal=causal,
                                   window_size_left=window[0],
                                   window_size_right=window[1]).shape == softmax_d.shape


# ---- the backward's return form ----
@pytest.mark.parametrize("fmt", ["bshd", "thd"])
@pytest.mark.parametrize("given", [True, False], ids=["dqdkdv", "none"])
def test_backward_returns(fmt, given, monkeypatch):
    """returns="grads" (or BACKWARD_RETURNS = "grads") gives (dq, dk, dv, softmax_d): the
    caller's tensors when given, else the allocated ones, holding the public function's
    gradients; the default and returns="softmax_d" give softmax_d alone. The module switch
    serves code written for FA3's releases before 01afd16, which returned the four-tuple
    (their causal and window_size by keyword, as here)."""
    q, k, v, dout, cu_q, cu_k, max_q, max_k = inputs(fmt, "cpu")
    lens = (cu_q, cu_k, max_q, max_k)
    window = (3, 0)
    out, lse, _, _ = v3._flash_attn_forward(q, k, v, *te_args(True, fmt, *lens),
                                            window_size=window)
    want = public_grads(fmt, q, k, v, dout, lens, True, window_size=window)

    def grads():
        return [torch.full_like(t, float("nan")) if given else None for t in (q, k, v)]

    softmax_d = v3._flash_attn_backward(dout, q, k, v, out, lse, *te_args(
        False, fmt, *lens, *grads()), window_size=window, deterministic=True)
    assert isinstance(softmax_d, torch.Tensor)
    check_softmax_d(fmt, softmax_d, dout, out, cu_q)
    bufs = grads()
    by_keyword = v3._flash_attn_backward(dout, q, k, v, out, lse, *te_args(
        False, fmt, *lens, *bufs), window_size=window, deterministic=True, returns="grads")
    monkeypatch.setattr(v3, "BACKWARD_RETURNS", "grads")
    old_bufs = grads()
    old = v3._flash_attn_backward(dout, q, k, v, out, lse, cu_q, cu_k, None, None, max_q,
                                  max_k, *old_bufs, None, causal=False, window_size=window,
                                  deterministic=True)
    for result, given_bufs in ((by_keyword, bufs), (old, old_bufs)):
        assert isinstance(result, tuple) and len(result) == 4
        if given:
            assert all(a is b for a, b in zip(result[:3], given_bufs))
        assert all(torch.equal(g, w) for g, w in zip(result[:3], want))
        assert torch.equal(result[3], softmax_d)
    assert torch.equal(v3._flash_attn_backward(dout, q, k, v, out, lse, *te_args(
        False, fmt, *lens), window_size=window, returns="softmax_d"), softmax_d)


def test_backward_returns_bad():
    q = rand(1, 3, 2, 8)
    with pytest.raises(flashc.FlashcArgumentError, match=r"_flash_attn_backward: "
                       r"returns='dq' but must be one of 'softmax_d', 'grads'"):
        v3._flash_attn_backward(q, q, q, q, q, torch.zeros(1, 2, 3), returns="dq")


@pytest.mark.parametrize("fmt", ["bshd", "thd"])
@pytest.mark.parametrize("causal", [False, True])
def test_ring_merged_out_lse(fmt, causal):
    """The keys of each sequence in two blocks (the ring attention Transformer Engine runs
    over ranks): one _flash_attn_forward per block, merged by flash_attn_combine; then one
    _flash_attn_backward per block given the merged out and lse, the gradients summed.
    Against the public function over all keys. The second block holds the last seqlen_q
    keys, so that causal attention over all keys is the first block full and the second
    one causal (its diagonal). The merged out and lse are the backward's only view of the
    whole attention."""
    q, k, v, dout, cu_q, cu_k, max_q, max_k = inputs(fmt, "cpu", seed=60)
    if fmt == "thd":
        starts = cu_k[:-1].tolist()
        firsts = [nk - nq for nq, nk in zip(LENS_Q, LENS_K)]
        seconds = LENS_Q
        blocks = [(torch.cat([torch.arange(s, s + f) for s, f in zip(starts, firsts)]),
                   cu(firsts, "cpu"), max(firsts)),
                  (torch.cat([torch.arange(s + f, s + f + n) for s, f, n in
                              zip(starts, firsts, seconds)]), cu(seconds, "cpu"), max(seconds))]
        pick = (lambda t, rows: t[rows])  # noqa: E731
        lse_rows = (lambda lse: lse.t())  # noqa: E731  (h, total) -> (total, h)
    else:
        first = k.shape[1] - q.shape[1]
        blocks = [(slice(0, first), None, first), (slice(first, None), None, q.shape[1])]
        pick = (lambda t, rows: t[:, rows])  # noqa: E731
        lse_rows = (lambda lse: lse.transpose(1, 2))  # noqa: E731  (b, h, s) -> (b, s, h)
    partial = []
    for i, (rows, cu_b, max_b) in enumerate(blocks):
        diagonal = causal and i == 1
        out_b, lse_b, _, _ = v3._flash_attn_forward(
            q, pick(k, rows), pick(v, rows), *te_args(True, fmt, cu_q, cu_b, max_q, max_b),
            causal=diagonal, window_size=(-1, 0) if diagonal else (-1, -1))
        partial.append((out_b.float(), lse_rows(lse_b)))
    out, lse = v3.flash_attn_combine(torch.stack([o for o, _ in partial]),
                                     torch.stack([lse for _, lse in partial]))
    lse = lse_rows(lse).contiguous()  # back to FA3's (b, h, s) / (h, total)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for i, (rows, cu_b, max_b) in enumerate(blocks):
        kb, vb = pick(k, rows), pick(v, rows)
        g = [torch.empty_like(t) for t in (q, kb, vb)]
        diagonal = causal and i == 1
        v3._flash_attn_backward(dout, q, kb, vb, out, lse,
                                *te_args(False, fmt, cu_q, cu_b, max_q, max_b, *g),
                                causal=diagonal, window_size=(-1, 0) if diagonal else (-1, -1))
        dq += g[0]
        if fmt == "thd":
            dk[rows], dv[rows] = g[1], g[2]
        else:
            dk[:, rows], dv[:, rows] = g[1], g[2]
    opts = {"causal": True} if causal else {}
    want_out, want_lse = public(fmt, q, k, v, cu_q, cu_k, max_q, max_k, **opts)
    torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, want_lse, rtol=1e-5, atol=1e-5)
    want = public_grads(fmt, q, k, v, dout, (cu_q, cu_k, max_q, max_k), True, **opts)
    for name, got, w in zip("qkv", (dq, dk, dv), want):
        torch.testing.assert_close(got, w, rtol=1e-5, atol=1e-5, msg="d" + name)


@pytest.mark.parametrize("which", ["q", "k", "qk"])
@pytest.mark.parametrize("causal", [False, True])
def test_seqused(which, causal):
    """seqused_q, seqused_k (varlen): the forward is flash_attn_varlen_func's with them, the
    backward (sequed_q, sequed_k) its gradients, zero for rows not in use, and softmax_d 0
    in those rows' columns."""
    q, k, v, dout, cu_q, cu_k, max_q, max_k = inputs("thd", "cpu", seed=70)
    used_q = torch.tensor(USED_Q, dtype=torch.int32) if "q" in which else None
    used_k = torch.tensor(USED_K, dtype=torch.int32) if "k" in which else None
    out, lse, _, _ = v3._flash_attn_forward(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                            seqused_q=used_q, seqused_k=used_k,
                                            max_seqlen_q=max_q, max_seqlen_k=max_k,
                                            causal=causal)
    opts = dict(seqused_q=used_q, seqused_k=used_k, causal=causal)
    want_out, want_lse = public("thd", q, k, v, cu_q, cu_k, max_q, max_k, **opts)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    softmax_d = v3._flash_attn_backward(dout, q, k, v, out, lse, cu_q, cu_k, used_q, used_k,
                                        max_q, max_k, *grads, is_causal=causal,
                                        deterministic=True)
    want = public_grads("thd", q, k, v, dout, (cu_q, cu_k, max_q, max_k), True, **opts)
    for name, got, w in zip("qkv", grads, want):
        assert torch.equal(got, w), "d" + name
    used_dout = dout.clone()
    if used_q is not None:  # softmax_d only over the rows in use
        for start, n, u in zip(cu_q[:-1].tolist(), LENS_Q, USED_Q):
            used_dout[start + min(u, n):start + n] = 0
    check_softmax_d("thd", softmax_d, used_dout, out, cu_q)


@pytest.mark.parametrize("case", ["append", "paged-rotary", "batch_idx-leftpad", "seqused_k"])
def test_kvcache_arguments(case):
    """With a KV-cache argument the batched forward is flash_attn_with_kvcache's call
    (seqused_k the cache lengths, kv_batch_idx cache_batch_idx, leftpad_k cache_leftpad),
    the cache updated the same."""
    b, sq, h, hk, d, sc = 2, 2, 4, 2, 16, 12
    q = rand(b, sq, h, d, seed=80)
    kc, vc = rand(b + 1, sc, hk, d, seed=81), rand(b + 1, sc, hk, d, seed=82)
    k_new, v_new = rand(b, 2, hk, d, seed=83), rand(b, 2, hk, d, seed=84)
    lens = torch.tensor([3, 7], dtype=torch.int32)
    fa3 = dict(seqused_k=lens, k_new=k_new, v_new=v_new)
    public_kw = dict(cache_seqlens=lens, k=k_new, v=v_new)
    if case == "paged-rotary":
        kc, table = paged(kc[:b].reshape(b * sc, hk, d), [sc] * b, 4, "cpu", seed=5)
        vc, _ = paged(vc[:b].reshape(b * sc, hk, d), [sc] * b, 4, "cpu", seed=5)
        angle = rand(sc, d // 2, seed=85)
        fa3.update(page_table=table, rotary_cos=angle.cos(), rotary_sin=angle.sin(),
                   rotary_interleaved=False)
        public_kw.update(page_table=table, rotary_cos=angle.cos(), rotary_sin=angle.sin(),
                         rotary_interleaved=False)
    elif case == "batch_idx-leftpad":
        idx, pad = torch.tensor([2, 0], dtype=torch.int32), torch.tensor([1, 2], dtype=torch.int32)
        fa3.update(kv_batch_idx=idx, leftpad_k=pad)
        public_kw.update(cache_batch_idx=idx, cache_leftpad=pad)
    elif case == "seqused_k":
        del fa3["k_new"], fa3["v_new"], public_kw["k"], public_kw["v"]
        kc, vc = kc[:b], vc[:b]
    kc2, vc2 = kc.clone(), vc.clone()
    out, lse, _, _ = v3._flash_attn_forward(q, kc, vc, causal=True, num_splits=2, **fa3)
    want_out, want_lse, _, _ = v3.flash_attn_with_kvcache(q, kc2, vc2, causal=True,
                                                          num_splits=2,
                                                          return_softmax_lse=True, **public_kw)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)


def test_out_and_noop_arguments():
    """out_ receives out and is returned; num_splits, pack_gqa, sm_margin, a None
    scheduler_metadata and rotary_interleaved without rotary change nothing."""
    q, k, v, _, _, _, sq, sk = inputs("bshd", "cpu")
    out, lse, _, _ = v3._flash_attn_forward(q, k, v, causal=True)
    out_ = torch.full_like(out, float("nan"))
    got = v3._flash_attn_forward(q, k, v, None, None, None, out_, causal=True, num_splits=4,
                                 pack_gqa=True, sm_margin=8, scheduler_metadata=None,
                                 rotary_interleaved=False, max_seqlen_q=sq, max_seqlen_k=sk)
    assert got[0] is out_ and torch.equal(out_, out) and torch.equal(got[1], lse)


# ---- what the ops refuse ----
def unsupported_calls():
    q, k = rand(1, 3, 2, 8), rand(1, 4, 2, 8)
    t, cq = torch.ones(1), torch.tensor([0, 3], dtype=torch.int32)
    fwd, bwd = v3._flash_attn_forward, v3._flash_attn_backward
    return {
        "fwd:qv": lambda: fwd(q, k, k, qv=q),
        "fwd:q_descale": lambda: fwd(q, k, k, q_descale=t),
        "fwd:k_descale": lambda: fwd(q, k, k, k_descale=t),
        "fwd:v_descale": lambda: fwd(q, k, k, v_descale=t),
        "fwd:attention_chunk": lambda: fwd(q, k, k, attention_chunk=2),
        "fwd:scheduler_metadata": lambda: fwd(q, k, k,
                                              scheduler_metadata=torch.zeros(4, dtype=torch.int32)),
        "fwd:cu_seqlens_k_new": lambda: fwd(q, k, k, k_new=k, v_new=k, cu_seqlens_k_new=cq),
        "fwd:seqlens_rotary": lambda: fwd(q, k, k, seqlens_rotary=cq),
        "fwd:seqused_q": lambda: fwd(q, k, k, seqused_q=cq[1:]),
        "fwd:cu_seqlens_k": lambda: fwd(q[0], k[0], k[0], cu_seqlens_q=cq, max_seqlen_q=3),
        "fwd:page_table": lambda: fwd(q[0], q[0], q[0], cu_seqlens_q=cq, cu_seqlens_k=cq,
                                      max_seqlen_q=3, max_seqlen_k=3,
                                      page_table=torch.zeros(1, 1, dtype=torch.int32)),
        "fwd:k_new": lambda: fwd(q[0], q[0], q[0], q[0], q[0], cu_seqlens_q=cq, cu_seqlens_k=cq,
                                 max_seqlen_q=3, max_seqlen_k=3),
        "bwd:sequed_k": lambda: bwd(q, q, q, q, q, torch.zeros(1, 2, 3), sequed_k=cq[1:]),
        "bwd:cu_seqlens_q": lambda: bwd(q[0], q[0], q[0], q[0], q[0], torch.zeros(2, 3),
                                        cu_seqlens_k=cq, max_seqlen_k=3),
    }


@pytest.mark.parametrize("name", sorted(unsupported_calls()))
def test_unsupported(name):
    """Each argument flashc cannot honour (op:argument) raises FlashcArgumentError with
    status FLASHC_ERR_UNSUPPORTED, naming the op and the argument; none is ignored."""
    with pytest.raises(ValueError) as e:
        unsupported_calls()[name]()
    assert isinstance(e.value, flashc.FlashcError) and e.value.status == UNSUPPORTED
    assert "_flash_attn_%s: " % ("forward" if name.startswith("fwd") else "backward") in \
        str(e.value)
    assert name.split(":")[1] + "=" in str(e.value)


def test_bad_input():
    """Rank errors and a window given twice name the op (FLASHC_ERR_INVALID_ARG)."""
    q = rand(1, 3, 2, 8)
    with pytest.raises(flashc.FlashcArgumentError, match=r"_flash_attn_forward: q\.dim\(\)=3"):
        v3._flash_attn_forward(q[0], q, q)
    with pytest.raises(flashc.FlashcArgumentError, match=r"_flash_attn_backward: dout\.dim"):
        v3._flash_attn_backward(q[0], q, q, q, q, torch.zeros(1, 2, 3))
    with pytest.raises(flashc.FlashcArgumentError, match=r"_flash_attn_forward: window_size="):
        v3._flash_attn_forward(q, q, q, window_size_left=2, window_size=(2, 0))
    cq = torch.tensor([0, 3], dtype=torch.int32)
    with pytest.raises(flashc.FlashcArgumentError, match=r"_backward: max_seqlen_k=None"):
        v3._flash_attn_backward(q[0], q[0], q[0], q[0], q[0], torch.zeros(2, 3), cq, cq,
                                max_seqlen_q=3)
    with pytest.raises(flashc.FlashcArgumentError, match=r"_flash_attn_forward: out_ is"):
        v3._flash_attn_forward(q, q, q, out_=torch.empty(1, 3, 2, 4))
