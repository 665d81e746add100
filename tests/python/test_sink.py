"""test_sink.py : learnable attention sinks (learnable_sink=, issue 20) in the Python package,
on CPU tensors (and CUDA ones where named below), against a float64 torch reference by
DEVELOPERS.md's rule (check() of test_flashc.py), gradients included (the sink's through
autograd).

- flash_attn_func with causal (Sq > Sk: rows without keys), window, softcap, ALiBi and GQA;
  the qkv- and kv-packed functions; flash_attn_varlen_func with an empty sequence;
  flash_attn_with_kvcache with an append; dropout (the sink's mass is never dropped).
- the sink's gradient against central differences of the float64 reference, and
  requires_grad honoured (a sink that does not require it gets none, the others still do).
- torch.library.opcheck of every op with a sink (and the backward ops' dsink).
- CUDA tensors (where torch has a GPU): flash_attn_func as above in bf16 and fp16, and a
  decode step over a contiguous and a paged cache, with one key split and several.
- a bf16 or fp16 sink (read by the library as it is) and a strided one, on every device:
  bitwise the fp32 sink's results.

Run:  FLASHC_LIBRARY=build/libflashc.so PYTHONPATH=python python3 -m pytest tests/python -q
"""
import pytest
import torch

import flashc
from flashc import interface
from test_flashc import DEVICES, check, cu, rand, ref_attention

DT = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


# ---- the reference ----
def ref_sink(q, k, v, sink, **opts):
    """test_flashc.py's reference with the sink [H]: out [B, Sq, H, D], lse [B, H, Sq];
    differentiable in every input."""
    return ref_attention(q, k, v, sink=sink, **opts)


def leaves(*ts):
    return [t.detach().clone().requires_grad_() for t in ts]


def check_all(names, got, ref, base, dtype):
    for name, g, r, b in zip(names, got, ref, base):
        check(name, g, r, b, dtype)


def ref_and_grads(inputs, dout, lowp, **opts):
    """out, lse of ref_sink and the gradients of its inputs (q, k, v, sink) for dout."""
    x = leaves(*inputs)
    out, lse = ref_sink(*x, lowp=lowp, **opts)
    out.backward(dout.to(out.dtype))
    return [out.detach(), lse.detach()] + [t.grad for t in x]


def sink_for(h, seed=5):
    """Sinks in [-2, 3) with head 0 at 8: from a sink that takes nearly all the mass to
    one that takes little."""
    s = rand(h, seed=seed) * 2.5 + 0.5
    s[0] = 8.0
    return s


# ---- flash_attn_func ----
OPTS = {
    "plain": {},
    "causal": {"causal": True},
    "window-softcap": {"window_size": (5, 2), "softcap": 1.5},
    "alibi": {"alibi_slopes": "alibi"},
}


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("opts", OPTS)
@pytest.mark.parametrize("shape", [(2, 19, 13, 4, 2, 32), (1, 8, 30, 6, 3, 24),
                                   (2, 130, 130, 4, 4, 128)], ids=["sq>sk", "sq<sk", "d128"])
def test_func(device, dtype, opts, shape):
    """On CPU tensors, or CUDA ones (bf16 and fp16) with the reference on the CPU."""
    if device == "cuda" and (not torch.cuda.is_available() or dtype == "fp32"):
        pytest.skip("no CUDA device" if dtype != "fp32" else "CUDA runs bf16 and fp16")
    b, sq, sk, h, hk, d = shape
    dt = DT[dtype]
    q, k, v = (rand(b, n, m, d, dtype=dt, seed=s) * 2 for (n, m, s) in
               ((sq, h, 1), (sk, hk, 2), (sk, hk, 3)))
    sink = sink_for(h)
    o = dict(OPTS[opts])
    if o.get("alibi_slopes") == "alibi":
        o["alibi_slopes"] = rand(h, seed=4).abs()
    dout = rand(b, sq, h, d, dtype=dt, seed=6)
    x = [t.to(device).requires_grad_() for t in (q, k, v, sink)]
    od = {n: (t.to(device) if torch.is_tensor(t) else t) for n, t in o.items()}
    out, lse, _ = flashc.flash_attn_func(*x[:3], learnable_sink=x[3], return_attn_probs=True,
                                         **od)
    out.backward(dout.to(device))
    ref = ref_and_grads((q, k, v, sink), dout, False, **o)
    base = ref_and_grads((q, k, v, sink), dout, True, **o)
    check_all(["out", "lse", "dq", "dk", "dv", "dsink"],
              [t.cpu() for t in [out, lse] + [t.grad for t in x]], ref, base, dt)
    if opts == "causal" and sq > sk:  # rows without keys: out 0, lse the sink exactly
        assert (out[:, :sq - sk] == 0).all()
        assert torch.equal(lse[:, :, :sq - sk].cpu(), sink.view(1, h, 1).expand(b, h, sq - sk))


def test_packed():
    b, s, h, d = 2, 11, 4, 16
    qkv = rand(b, s, 3, h, d, seed=1)
    sink = sink_for(h)
    dout = rand(b, s, h, d, seed=6)
    x = leaves(qkv, sink)
    out = flashc.flash_attn_qkvpacked_func(x[0], causal=True, learnable_sink=x[1])
    out.backward(dout)
    ref = ref_and_grads((qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], sink), dout, False,
                        causal=True)
    base = ref_and_grads((qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], sink), dout, True,
                         causal=True)
    check("out", out, ref[0], base[0], torch.float32)
    check("dqkv", x[0].grad, torch.stack(ref[2:5], 2), torch.stack(base[2:5], 2), torch.float32)
    check("dsink", x[1].grad, ref[5], base[5], torch.float32)
    # kv-packed, GQA
    q, kv = rand(b, s, h, d, seed=2), rand(b, s + 3, 2, 2, d, seed=3)
    x = leaves(q, kv, sink)
    out = flashc.flash_attn_kvpacked_func(x[0], x[1], learnable_sink=x[2])
    out.backward(dout)
    ref = ref_and_grads((q, kv[:, :, 0], kv[:, :, 1], sink), dout, False)
    base = ref_and_grads((q, kv[:, :, 0], kv[:, :, 1], sink), dout, True)
    check("out", out, ref[0], base[0], torch.float32)
    check("dkv", x[1].grad, torch.stack(ref[3:5], 2), torch.stack(base[3:5], 2), torch.float32)
    check("dsink", x[2].grad, ref[5], base[5], torch.float32)


# ---- varlen ----
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_varlen(dtype):
    dt = DT[dtype]
    lens_q, lens_k, h, hk, d = [9, 0, 4, 12], [6, 5, 0, 20], 4, 2, 16
    q = rand(sum(lens_q), h, d, dtype=dt, seed=1) * 2
    k, v = (rand(sum(lens_k), hk, d, dtype=dt, seed=s) for s in (2, 3))
    sink = sink_for(h)
    dout = rand(*q.shape, dtype=dt, seed=6)
    x = leaves(q, k, v, sink)
    out, lse, _ = flashc.flash_attn_varlen_func(
        x[0], x[1], x[2], cu(lens_q, "cpu"), cu(lens_k, "cpu"), max(lens_q), max(lens_k),
        causal=True, learnable_sink=x[3], return_attn_probs=True)
    out.backward(dout)
    # the reference per sequence; dsink sums over them
    refs, bases = [], []
    for lowp, acc in ((False, refs), (True, bases)):
        outs, lses, dqs, dks, dvs, dsink = [], [], [], [], [], 0
        q0 = k0 = 0
        for nq, nk in zip(lens_q, lens_k):
            r = ref_and_grads((q[q0:q0 + nq][None], k[k0:k0 + nk][None], v[k0:k0 + nk][None],
                               sink), dout[q0:q0 + nq][None], lowp, causal=True)
            outs.append(r[0][0])
            lses.append(r[1][0])
            dqs.append(r[2][0])
            dks.append(r[3][0])
            dvs.append(r[4][0])
            dsink = dsink + r[5]
            q0, k0 = q0 + nq, k0 + nk
        acc += [torch.cat(outs), torch.cat(lses, 1), torch.cat(dqs), torch.cat(dks),
                torch.cat(dvs), dsink]
    check_all(["out", "lse", "dq", "dk", "dv", "dsink"], [out, lse] + [t.grad for t in x],
              refs, bases, dt)


# ---- the KV cache ----
def test_kvcache():
    b, h, hk, d, sc = 2, 4, 2, 16, 12
    q = rand(b, 2, h, d, seed=1) * 2
    k_cache, v_cache = rand(b, sc, hk, d, seed=2), rand(b, sc, hk, d, seed=3)
    k_new, v_new = rand(b, 2, hk, d, seed=4), rand(b, 2, hk, d, seed=5)
    seqlens = torch.tensor([0, 7], dtype=torch.int32)
    sink = sink_for(h)
    ref = [], []
    for bi in range(b):
        n = int(seqlens[bi])
        kk = torch.cat([k_cache[bi, :n], k_new[bi]])[None]
        vv = torch.cat([v_cache[bi, :n], v_new[bi]])[None]
        for lowp, acc in ((False, ref[0]), (True, ref[1])):
            acc.append(ref_sink(q[bi:bi + 1], kk, vv, sink, causal=True, lowp=lowp))
    out, lse = flashc.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new,
                                              cache_seqlens=seqlens, causal=True,
                                              learnable_sink=sink, return_softmax_lse=True)
    for i, name in enumerate(("out", "lse")):
        check(name, out if i == 0 else lse, torch.cat([r[i] for r in ref[0]]),
              torch.cat([r[i] for r in ref[1]]), torch.float32)


# ---- dropout ----
def test_dropout():
    """Dropout drops the keys' probabilities, never the sink's mass: the mask read from
    return_attn_probs (negative = dropped) gives the reference's out and gradients."""
    b, s, h, d, p = 2, 16, 4, 16, 0.3
    q, k, v = (rand(b, s, h, d, seed=i) * 2 for i in (1, 2, 3))
    sink = sink_for(h)
    dout = rand(b, s, h, d, seed=6)
    x = leaves(q, k, v, sink)
    torch.manual_seed(3)
    out, _, probs = flashc.flash_attn_func(*x[:3], dropout_p=p, causal=True,
                                           learnable_sink=x[3], return_attn_probs=True)
    out.backward(dout)
    keep = probs >= 0
    ref = ref_and_grads((q, k, v, sink), dout, False, causal=True, keep=keep, dropout_p=p)
    base = ref_and_grads((q, k, v, sink), dout, True, causal=True, keep=keep, dropout_p=p)
    check_all(["out", "dq", "dk", "dv", "dsink"], [out] + [t.grad for t in x],
              ref[:1] + ref[2:], base[:1] + base[2:], torch.float32)
    # the kept probabilities and the sink's share sum to 1 before dropout
    _, lse = ref_sink(q, k, v, sink, causal=True)
    total = probs.abs().sum(-1) + torch.exp(sink.double().view(1, h, 1) - lse)
    assert torch.allclose(total, torch.ones_like(total), atol=1e-5)


# ---- gradients ----
def test_dsink_finite_differences():
    """The sink's gradient through autograd against central differences of the float64
    reference's loss sum(out * dout)."""
    b, s, h, d = 2, 9, 3, 8
    q, k, v = (rand(b, s, h, d, seed=i) * 2 for i in (1, 2, 3))
    sink = torch.tensor([0.5, -1.0, 2.0])
    dout = rand(b, s, h, d, seed=6)
    x = leaves(sink)
    flashc.flash_attn_func(q, k, v, causal=True, softcap=2.0, learnable_sink=x[0]).backward(dout)
    eps = 1e-4
    for i in range(h):
        loss = []
        for sign in (1, -1):
            sd = sink.double().clone()
            sd[i] += sign * eps
            out, _ = ref_sink(q.double(), k.double(), v.double(), sd, causal=True, softcap=2.0)
            loss.append((out * dout.double()).sum().item())
        fd = (loss[0] - loss[1]) / (2 * eps)
        assert abs(x[0].grad[i].item() - fd) <= 1e-4 * max(1.0, abs(fd)), (i, x[0].grad[i], fd)


def test_requires_grad_honoured():
    b, s, h, d = 1, 6, 2, 8
    q, k, v = leaves(*(rand(b, s, h, d, seed=i) for i in (1, 2, 3)))
    sink = sink_for(h)
    out = flashc.flash_attn_func(q, k, v, learnable_sink=sink)
    out.sum().backward()
    assert sink.grad is None and q.grad is not None
    assert not out.requires_grad or out.grad_fn is not None
    with torch.no_grad():
        flashc.flash_attn_func(q, k, v, learnable_sink=sink.requires_grad_())
    # a sink alone requires grad: the output does, and only the sink gets a gradient
    x = [t.detach() for t in (q, k, v)]
    s2 = sink_for(h).requires_grad_()
    out = flashc.flash_attn_func(*x, learnable_sink=s2)
    assert out.requires_grad
    out.sum().backward()
    assert s2.grad is not None and s2.grad.shape == (h,)


def test_bad_sink():
    q = rand(1, 4, 2, 8)
    with pytest.raises(flashc.FlashcArgumentError, match="sink.shape"):
        flashc.flash_attn_func(q, q, q, learnable_sink=torch.zeros(3))
    with pytest.raises(flashc.FlashcArgumentError, match="sink.dtype"):
        flashc.flash_attn_func(q, q, q, learnable_sink=torch.zeros(2, dtype=torch.int32))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("sink_dtype", ["bf16", "fp16"])
def test_low_precision_sink(sink_dtype, device):
    """A bf16 or fp16 sink (the parameter of a model in that dtype), which the library
    reads as it is, runs as its fp32 value: forward and backward bitwise as an fp32 sink
    of the same values, through flash_attn_func, flash_attn_varlen_func (an empty
    sequence) and the kvcache function (one key split and several); its gradient comes
    back in its dtype, the fp32 sink's gradient rounded."""
    b, s, h, hk, d = 2, 9, 4, 2, 16
    q, k, v = (rand(b, s, n, d, dtype=torch.bfloat16, seed=i).to(device)
               for i, n in ((1, h), (2, hk), (3, hk)))
    dout = rand(b, s, h, d, dtype=torch.bfloat16, seed=6).to(device)
    low = sink_for(h).to(device, DT[sink_dtype]).requires_grad_()
    f32 = low.detach().float().requires_grad_()
    got, want = (flashc.flash_attn_func(q, k, v, causal=True, learnable_sink=t, return_attn_probs=True)
                 for t in (low, f32))
    for g, w in zip(got[:2], want[:2]):
        assert torch.equal(g, w)
    column = torch.stack([low.detach(), -low.detach()], 1)[:, 0]  # a sinks-by-layer column
    assert column.stride(0) == 2 and torch.equal(
        flashc.flash_attn_func(q, k, v, causal=True, learnable_sink=column), want[0])
    got[0].backward(dout)
    want[0].backward(dout)
    assert low.grad.dtype == low.dtype and torch.equal(low.grad, f32.grad.to(low.dtype))
    lens = cu([5, 0, 4], device)  # (an empty sequence: its rows get out 0 and lse the sink)
    flat = [t.reshape(b * s, -1, d)[:9] for t in (q, k, v)]
    outs = [flashc.flash_attn_varlen_func(*flat, lens, lens, 5, 5, learnable_sink=t,
                                          return_attn_probs=True)[:2]
            for t in (low.detach(), f32.detach())]
    assert all(torch.equal(g, w) for g, w in zip(*outs))
    for splits in (1, 3):
        cache = [t.clone() for t in (k, v)]
        outs = [flashc.flash_attn_with_kvcache(q[:, :1], *cache, cache_seqlens=5,
                                               learnable_sink=t, num_splits=splits,
                                               return_softmax_lse=True)
                for t in (low.detach(), f32.detach())]
        assert all(torch.equal(g, w) for g, w in zip(*outs)), splits


# ---- the decode path on CUDA tensors ----
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("num_splits", [1, 4])
@pytest.mark.parametrize("paged", [False, True])
def test_cuda_kvcache(num_splits, paged):
    """One decode step over a cache (the decode kernel, its splits merged by the combine
    kernel), GQA 8:2, contiguous and paged (pages of 16 in a shuffled order)."""
    b, h, hk, d, sc, ps = 2, 8, 2, 64, 256, 16
    dt = torch.bfloat16
    q = rand(b, 1, h, d, dtype=dt, seed=1) * 2
    k_cache, v_cache = rand(b, sc, hk, d, dtype=dt, seed=2), rand(b, sc, hk, d, dtype=dt, seed=3)
    sink = sink_for(h)
    kw = {}
    kc, vc = k_cache.cuda(), v_cache.cuda()
    if paged:
        perm = torch.randperm(b * sc // ps, generator=torch.Generator().manual_seed(0))
        table = perm.view(b, sc // ps).to(torch.int32)
        kc = torch.empty(b * sc // ps, ps, hk, d, dtype=dt)
        vc = torch.empty_like(kc)
        kc[perm] = k_cache.reshape(-1, ps, hk, d)
        vc[perm] = v_cache.reshape(-1, ps, hk, d)
        kc, vc, kw["block_table"] = kc.cuda(), vc.cuda(), table.cuda()
    out, lse = flashc.flash_attn_with_kvcache(q.cuda(), kc, vc, learnable_sink=sink.cuda(),
                                              num_splits=num_splits, return_softmax_lse=True,
                                              **kw)
    ref = ref_sink(q, k_cache, v_cache, sink, lowp=False)
    base = ref_sink(q, k_cache, v_cache, sink, lowp=True)
    check("out", out.cpu(), ref[0], base[0], dt)
    check("lse", lse.cpu(), ref[1], base[1], dt)


# ---- the custom ops ----
@pytest.mark.skipif(not interface._CUSTOM_OP, reason="torch < 2.4 has no custom_op")
def test_opcheck():
    from test_ops import opcheck
    b, sq, sk, h, hk, d = 2, 5, 7, 4, 2, 16
    masks = (0.0, None, True, -1, -1, 0.0)
    for grad in (False, True):
        q, k, v = leaves(rand(b, sq, h, d, seed=1), rand(b, sk, hk, d, seed=2),
                         rand(b, sk, hk, d, seed=3))
        sink = sink_for(h).requires_grad_(grad)
        if not grad:
            q, k, v = (t.detach() for t in (q, k, v))
        opcheck("fwd", (q, k, v, None) + masks + (False, 11, 0, False, sink))
        lq, lk = [3, 0, 5], [5, 2, 4]
        qv, kv_, vv = rand(8, h, d, seed=6), rand(11, hk, d, seed=7), rand(11, hk, d, seed=8)
        if grad:
            qv, kv_, vv = leaves(qv, kv_, vv)
        opcheck("varlen_fwd", (qv, kv_, vv, cu(lq, "cpu"), cu(lk, "cpu"), 5, 5, None, None,
                               None) + masks + (False, 11, 0, False, sink))
    q, k, v = rand(b, sq, h, d, seed=1), rand(b, sk, hk, d, seed=2), rand(b, sk, hk, d, seed=3)
    sink = sink_for(h)
    out, lse, _ = torch.ops.flashc.fwd(q, k, v, None, *masks, False, 11, 0, False, sink)
    grads = tuple(torch.empty_like(t) for t in (q, k, v))
    opcheck("bwd", (rand(*out.shape, seed=5), q, k, v, out, lse) + grads + (None,) + masks +
            (False, 11, 0, sink, torch.empty(h)))
    lq, lk = [3, 0, 5], [5, 2, 4]
    qv, kv_, vv = rand(8, h, d, seed=6), rand(11, hk, d, seed=7), rand(11, hk, d, seed=8)
    out, lse, _ = torch.ops.flashc.varlen_fwd(qv, kv_, vv, cu(lq, "cpu"), cu(lk, "cpu"), 5, 5,
                                              None, None, None, *masks, False, 11, 0, False,
                                              sink)
    grads = tuple(torch.empty_like(t) for t in (qv, kv_, vv))
    opcheck("varlen_bwd", (rand(*out.shape, seed=5), qv, kv_, vv, out, lse) + grads +
            (cu(lq, "cpu"), cu(lk, "cpu"), 5, 5, None) + masks + (False, 11, 0, sink,
                                                                 torch.empty(h)))
    k_cache, v_cache = rand(3, 10, hk, d, seed=14), rand(3, 10, hk, d, seed=15)
    opcheck("fwd_kvcache", (rand(b, 2, h, d, seed=11), k_cache, v_cache,
                            rand(b, 2, hk, d, seed=12), rand(b, 2, hk, d, seed=13), None, None,
                            torch.tensor([3, 6], dtype=torch.int32), None, None, None, None,
                            None, True, -1, -1, 0.0, True, 0, sink))


def test_no_keys():
    """Without any key (seqlen_k 0, answered in Python): out 0, lse the sink, zero
    gradients (out = 0 gives Delta = 0, so dsink = 0 too)."""
    q = rand(1, 3, 2, 8).requires_grad_()
    k = torch.zeros(1, 0, 2, 8, requires_grad=True)
    sink = torch.tensor([0.25, -3.0], requires_grad=True)
    out, lse, _ = flashc.flash_attn_func(q, k, k, learnable_sink=sink, return_attn_probs=True)
    assert (out == 0).all() and torch.equal(lse, sink.detach().view(1, 2, 1).expand(1, 2, 3))
    out.sum().backward()
    assert (q.grad == 0).all() and (sink.grad == 0).all()
