"""test_v3.py : flashc.v3, FlashAttention-3's interface (hopper/flash_attn_interface.py).

The signatures against FA3's parameter lists, written here as data; flash_attn_func,
flash_attn_qkvpacked_func and flash_attn_varlen_func (outputs, lse, gradients) against the
float64 reference with check() of test_flashc.py (DEVICES and dtypes as there), window_size
with None sides, seqused_q and seqused_k against the reference over the used rows;
flash_attn_with_kvcache against flashc's 2.x call (bitwise: the same C call);
flash_attn_combine against a float64 direct computation and against one attention call
over all keys; get_scheduler_metadata; each unsupported argument raising.

Run:  FLASHC_LIBRARY=build/libflashc.so PYTHONPATH=python python3 -m pytest tests/python -q
"""
import inspect
import math

import pytest
import torch

import flashc
from flashc import v3
from test_flashc import (DEVICE_DTYPES, DEVICES, DT, LENS_K, LENS_Q, UNSUPPORTED,
                         check, check_fwd_bwd, cu, paged, rand, ref_attention, ref_varlen)

# ---- FA3's parameter lists (Dao-AILab/flash-attention hopper/flash_attn_interface.py,
# commit 01afd16d248c4c7d0f9aed1914084f16c490eaed), names, order and defaults ----
FA3_SIGNATURES = '''
import torch
def flash_attn_qkvpacked_func(qkv, softmax_scale=None, causal=False, q_descale=None,
                              k_descale=None, v_descale=None, window_size=(-1, -1),
                              attention_chunk=0, softcap=0.0, deterministic=False,
                              num_heads_q=None, sm_margin=0, return_attn_probs=False): ...
def flash_attn_func(q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None,
                    k_descale=None, v_descale=None, window_size=(-1, -1), attention_chunk=0,
                    softcap=0.0, num_splits=1, pack_gqa=None, deterministic=False, sm_margin=0,
                    return_attn_probs=False): ...
def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           seqused_q=None, seqused_k=None, softmax_scale=None, causal=False,
                           qv=None, q_descale=None, k_descale=None, v_descale=None,
                           window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1,
                           pack_gqa=None, deterministic=False, sm_margin=0,
                           return_attn_probs=False): ...
def flash_attn_combine(out_partial, lse_partial, out=None, out_dtype=None): ...
def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, page_table=None, cu_seqlens_q=None,
                            cu_seqlens_k_new=None, max_seqlen_q=None, rotary_seqlens=None,
                            q_descale=None, k_descale=None, v_descale=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), attention_chunk=0, softcap=0.0,
                            rotary_interleaved=True, scheduler_metadata=None, num_splits=0,
                            pack_gqa=None, sm_margin=0, return_softmax_lse=False): ...
def get_scheduler_metadata(batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv,
                           headdim, cache_seqlens, qkv_dtype=torch.bfloat16, headdim_v=None,
                           cu_seqlens_q=None, cu_seqlens_k_new=None, cache_leftpad=None,
                           page_size=None, max_seqlen_k_new=0, causal=False,
                           window_size=(-1, -1), attention_chunk=0, has_softcap=False,
                           num_splits=0, pack_gqa=None, sm_margin=0): ...
'''
FA3_PUBLIC = ("flash_attn_qkvpacked_func", "flash_attn_func", "flash_attn_varlen_func",
              "flash_attn_combine", "flash_attn_with_kvcache", "get_scheduler_metadata")


def parameters(fn):
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("name", FA3_PUBLIC)
def test_signature(name):
    """flashc.v3's function has FA3's parameters: names, order, kinds and defaults, and
    after them only the keyword-only learnable_sink and s_aux (flashc's addition under
    FA4's name and vLLM's FA3 build's)."""
    stubs = {}
    exec(FA3_SIGNATURES, stubs)
    ours = parameters(getattr(v3, name))
    sink = [("learnable_sink", inspect.Parameter.KEYWORD_ONLY, None),
            ("s_aux", inspect.Parameter.KEYWORD_ONLY, None)]
    if name in SINK_FUNCTIONS:
        assert ours[-2:] == sink
        ours = ours[:-2]
    assert ours == parameters(stubs[name])
    assert name in v3.__all__


SINK_FUNCTIONS = ("flash_attn_qkvpacked_func", "flash_attn_func", "flash_attn_varlen_func",
                  "flash_attn_with_kvcache")


@pytest.mark.parametrize("kw", ["learnable_sink", "s_aux"])
@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_sink(device, dtype, kw):
    """learnable_sink= (or s_aux=) on the four attention functions: out, lse and the
    gradients (the sink's too) bitwise those of flashc's 2.x functions, which test_sink.py
    checks against the float64 reference."""
    dt = DT[dtype]
    b, sq, sk, h, hk, d = 2, 9, 13, 4, 2, 32
    q = rand(b, sq, h, d, device=device, dtype=dt, seed=1)
    k = rand(b, sk, hk, d, device=device, dtype=dt, seed=2)
    v = rand(b, sk, hk, d, device=device, dtype=dt, seed=3)
    sink = rand(h, device=device, seed=4) * 2

    def run(fn, *tensors):
        x = [t.detach().clone().requires_grad_() for t in tensors]
        out, lse = fn(*x)[:2]
        out.backward(rand(*out.shape, device=device, dtype=dt, seed=5))
        return [out, lse] + [t.grad for t in x]

    def same(a, b):
        assert all(torch.equal(x, y) for x, y in zip(a, b))

    same(run(lambda q, k, v, s: v3.flash_attn_func(q, k, v, causal=True, **{kw: s},
                                                   return_attn_probs=True), q, k, v, sink),
         run(lambda q, k, v, s: flashc.flash_attn_func(q, k, v, causal=True, learnable_sink=s,
                                                       return_attn_probs=True), q, k, v, sink))
    qkv = torch.stack([q, q.flip(1), q.roll(1, 1)], 2)
    same(run(lambda x, s: v3.flash_attn_qkvpacked_func(x, **{kw: s},
                                                       return_attn_probs=True), qkv, sink),
         run(lambda x, s: flashc.flash_attn_qkvpacked_func(x, learnable_sink=s,
                                                           return_attn_probs=True), qkv, sink))
    cq = torch.tensor([0, 4, 9], dtype=torch.int32, device=device)
    ck = torch.tensor([0, 6, 13], dtype=torch.int32, device=device)
    q1, k1, v1 = q[0], k[0], v[0]
    same(run(lambda q, k, v, s: v3.flash_attn_varlen_func(q, k, v, cq, ck, 5, 7, causal=True,
                                                          **{kw: s},
                                                          return_attn_probs=True),
             q1, k1, v1, sink),
         run(lambda q, k, v, s: flashc.flash_attn_varlen_func(q, k, v, cq, ck, 5, 7, causal=True,
                                                              learnable_sink=s,
                                                              return_attn_probs=True),
             q1, k1, v1, sink))
    with torch.no_grad():
        got = v3.flash_attn_with_kvcache(q, k, v, causal=True, **{kw: sink},
                                         return_softmax_lse=True)
        want = flashc.flash_attn_with_kvcache(q, k, v, causal=True, learnable_sink=sink,
                                              return_softmax_lse=True)
    same(got[:2], want)


def test_sink_both_names_refused():
    q = rand(1, 3, 2, 8, seed=1)
    sink = rand(2, seed=2)
    for fn, args in ((v3.flash_attn_func, (q, q, q)), (v3.flash_attn_qkvpacked_func,
                                                       (torch.stack([q, q, q], 2),)),
                     (v3.flash_attn_with_kvcache, (q, q, q))):
        with pytest.raises(flashc.FlashcArgumentError, match="learnable_sink and s_aux"):
            fn(*args, learnable_sink=sink, s_aux=sink)
    cu = torch.tensor([0, 3], dtype=torch.int32)
    with pytest.raises(flashc.FlashcArgumentError, match="learnable_sink and s_aux"):
        v3.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 3, 3, learnable_sink=sink, s_aux=sink)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("dims", [(576, 512), (512, 512)], ids=lambda p: "d%d-dv%d" % p)
def test_sink_head_dims_past_256(dtype, dims):
    """v3 with a sink at absorbed MLA's 576/512 and at 512 on the CPU: out, lse and every
    gradient, dsink included, against the float64 reference (test_sink.py's rule), for
    flash_attn_func and the varlen function; the KV-cache function's out and lse."""
    from test_sink import check_all, leaves, ref_and_grads, sink_for
    dt = DT[dtype]
    (d, dv), b, sq, sk, h, hk = dims, 2, 9, 13, 4, 2
    q = rand(b, sq, h, d, dtype=dt, seed=1) * 2
    k = rand(b, sk, hk, d, dtype=dt, seed=2) * 2
    v = rand(b, sk, hk, dv, dtype=dt, seed=3)
    sink = sink_for(h)
    dout = rand(b, sq, h, dv, dtype=dt, seed=6)
    ref = ref_and_grads((q, k, v, sink), dout, False, causal=True)
    base = ref_and_grads((q, k, v, sink), dout, True, causal=True)
    names = ["out", "lse", "dq", "dk", "dv", "dsink"]
    x = leaves(q, k, v, sink)
    out, lse = v3.flash_attn_func(*x[:3], causal=True, s_aux=x[3], return_attn_probs=True)
    out.backward(dout)
    check_all(names, [out, lse] + [t.grad for t in x], ref, base, dt)
    # the same problem as two sequences of one varlen batch
    x = leaves(*(t.flatten(0, 1) for t in (q, k, v)), sink)
    cq = torch.tensor([0, sq, 2 * sq], dtype=torch.int32)
    ck = torch.tensor([0, sk, 2 * sk], dtype=torch.int32)
    out, lse = v3.flash_attn_varlen_func(*x[:3], cq, ck, sq, sk, causal=True,
                                         learnable_sink=x[3], return_attn_probs=True)
    out.backward(dout.flatten(0, 1))
    got = [out.unflatten(0, (b, sq)), lse.unflatten(1, (b, sq)).transpose(0, 1)]
    got += [t.grad.unflatten(0, (b, -1)) for t in x[:3]] + [x[3].grad]
    check_all(names, got, ref, base, dt)
    with torch.no_grad():
        out, lse = v3.flash_attn_with_kvcache(q, k, v, causal=True, learnable_sink=sink,
                                              return_softmax_lse=True)[:2]
    check_all(names[:2], [out, lse], ref[:2], base[:2], dt)


def test_import_paths():
    import flashc.v3 as m
    assert flashc.v3 is m and m.flash_attn_func is v3.flash_attn_func


# ---- flash_attn_func, flash_attn_qkvpacked_func ----
SHAPES = [(2, 7, 7, 4, 4, 16), (1, 5, 13, 4, 2, 5)]  # B, Sq, Sk, H, Hk, D
OPTIONS = [{}, {"causal": True}, {"window_size": (3, None)}, {"window_size": (None, 1)},
           {"window_size": (None, None), "causal": True}, {"softcap": 2.0, "softmax_scale": 1.3}]


def ref_opts(opts):
    """The reference's options: window sides None as -1."""
    opts = dict(opts)
    if "window_size" in opts:
        opts["window_size"] = tuple(-1 if w is None else w for w in opts["window_size"])
    return opts


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: "-".join(
    "%s=%s" % kv for kv in sorted(o.items())) or "plain")
def test_func(device, dtype, shape, opts):
    """out and gradients against the float64 reference; lse (b, h, sq) against it too;
    bitwise the 2.x call's result."""
    dt = DT[dtype]
    b, sq, sk, h, hk, d = shape
    q = rand(b, sq, h, d, device=device, dtype=dt, seed=1)
    k = rand(b, sk, hk, d, device=device, dtype=dt, seed=2)
    v = rand(b, sk, hk, d, device=device, dtype=dt, seed=3)
    check_fwd_bwd(lambda q, k, v: v3.flash_attn_func(q, k, v, num_splits=3, pack_gqa=True,
                                                     **opts),
                  lambda q, k, v, lowp: ref_attention(q, k, v, lowp=lowp, **ref_opts(opts)),
                  (q, k, v), dt, names="qkv")
    out, lse = v3.flash_attn_func(q, k, v, return_attn_probs=True, **opts)
    assert lse.shape == (b, h, sq) and lse.dtype == torch.float32
    _, lse64 = ref_attention(q.double(), k.double(), v.double(), **ref_opts(opts))
    check("lse", lse, lse64, None, torch.float32 if dt == torch.float32 else dt)
    out2, lse2, _ = flashc.flash_attn_func(q, k, v, return_attn_probs=True, **ref_opts(opts))
    assert torch.equal(out, out2) and torch.equal(lse, lse2)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("layout", ["3", "heads"])
def test_qkvpacked(device, dtype, layout):
    """qkv (b, s, 3, h, d), or (b, s, h + 2 hk, d) with num_heads_q: out and the gradient
    of qkv against the reference."""
    dt = DT[dtype]
    b, s, h, hk, d = 2, 6, 4, (4 if layout == "3" else 2), 8
    if layout == "3":
        qkv = rand(b, s, 3, h, d, device=device, dtype=dt, seed=4)
        parts = lambda t: (t[:, :, 0], t[:, :, 1], t[:, :, 2])  # noqa: E731
        kw = {}
    else:
        qkv = rand(b, s, h + 2 * hk, d, device=device, dtype=dt, seed=4)
        parts = lambda t: t.split([h, hk, hk], dim=2)  # noqa: E731
        kw = {"num_heads_q": h}
    out, lse = v3.flash_attn_qkvpacked_func(qkv, causal=True, return_attn_probs=True, **kw)
    assert lse.shape == (b, h, s)
    check_fwd_bwd(lambda t: v3.flash_attn_qkvpacked_func(t, causal=True, **kw),
                  lambda t, lowp: ref_attention(*parts(t), causal=True, lowp=lowp),
                  (qkv,), dt, names=["qkv"])


# ---- flash_attn_varlen_func, seqused_q, seqused_k ----
def varlen_inputs(device, dt, seed):
    """q (total_q, 4, 8), k, v (total_k, 2, 8) over LENS_Q, LENS_K, and their cu_seqlens."""
    q = rand(sum(LENS_Q), 4, 8, device=device, dtype=dt, seed=seed)
    k = rand(sum(LENS_K), 2, 8, device=device, dtype=dt, seed=seed + 1)
    v = rand(sum(LENS_K), 2, 8, device=device, dtype=dt, seed=seed + 2)
    return q, k, v, cu(LENS_Q, device), cu(LENS_K, device)


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("opts", [{}, {"causal": True}, {"window_size": (2, None), "softcap": 4.0}],
                         ids=["plain", "causal", "window-softcap"])
def test_varlen(device, dtype, opts):
    dt, h = DT[dtype], 4
    q, k, v, cq, ck = varlen_inputs(device, dt, seed=5)
    fn = lambda q, k, v: v3.flash_attn_varlen_func(  # noqa: E731
        q, k, v, cq, ck, max(LENS_Q), max(LENS_K), **opts)
    check_fwd_bwd(fn, lambda q, k, v, lowp: ref_varlen(q, k, v, LENS_Q, LENS_K, lowp,
                                                       **ref_opts(opts)),
                  (q, k, v), dt, names="qkv")
    out, lse = v3.flash_attn_varlen_func(q, k, v, cq, ck, max(LENS_Q), max(LENS_K),
                                         return_attn_probs=True, **opts)
    assert lse.shape == (h, sum(LENS_Q)) and lse.dtype == torch.float32


def ref_seqused(q, k, v, lens_q, lens_k, used_q, used_k, lowp, **opts):
    """The reference of seqused: sequence i attends with its first used_q[i] queries over
    its first used_k[i] keys; the other query rows are 0 (lse -inf)."""
    outs, lses, oq, ok = [], [], 0, 0
    for lq, lk, uq, uk in zip(lens_q, lens_k, used_q, used_k):
        uq, uk = min(uq, lq), min(uk, lk)
        o, lse = ref_attention(q[oq:oq + uq][None], k[ok:ok + uk][None], v[ok:ok + uk][None],
                               lowp=lowp, **opts)
        if uk == 0:  # no key: flashc's out = 0, lse = -inf (the C library's rows)
            o, lse = o.nan_to_num(0.0) * 0, torch.full_like(lse, -math.inf)
        outs += [o[0], q.new_zeros((lq - uq,) + tuple(q.shape[1:-1]) + (v.shape[-1],))]
        lses += [lse[0], lse.new_full((lse.shape[1], lq - uq), -math.inf)]
        oq, ok = oq + lq, ok + lk
    return torch.cat(outs), torch.cat(lses, dim=-1)


USED_Q, USED_K = [2, 0, 5, 1], [5, 1, 3, 9]  # against LENS_Q [3, 0, 7, 1], LENS_K [5, 2, 7, 4]


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("which", ["q", "k", "qk"])
@pytest.mark.parametrize("opts", [{}, {"causal": True}, {"window_size": (1, 0)}],
                         ids=["plain", "causal", "window"])
def test_seqused(device, dtype, which, opts):
    """seqused_q and seqused_k (used counts past a sequence's length clamp to it): the
    masks align to the used lengths; unused query rows out 0, lse -inf, zero gradients."""
    dt, h = DT[dtype], 4
    q, k, v, cq, ck = varlen_inputs(device, dt, seed=8)
    used_q = USED_Q if "q" in which else LENS_Q
    used_k = USED_K if "k" in which else LENS_K
    kw = dict(opts)
    if "q" in which:
        kw["seqused_q"] = torch.tensor(USED_Q, dtype=torch.int32, device=device)
    if "k" in which:
        kw["seqused_k"] = torch.tensor(USED_K, dtype=torch.int32, device=device)
    fn = lambda q, k, v: v3.flash_attn_varlen_func(  # noqa: E731
        q, k, v, cq, ck, max(LENS_Q), max(LENS_K), **kw)
    ref = lambda q, k, v, lowp: ref_seqused(  # noqa: E731
        q, k, v, LENS_Q, LENS_K, used_q, used_k, lowp, **opts)
    check_fwd_bwd(fn, ref, (q, k, v), dt, names="qkv")
    out, lse = v3.flash_attn_varlen_func(q, k, v, cq, ck, max(LENS_Q), max(LENS_K),
                                         return_attn_probs=True, **kw)
    _, lse64 = ref(q.double(), k.double(), v.double(), False)
    assert lse.shape == (h, sum(LENS_Q))
    check("lse", lse, lse64, None, torch.float32 if dt == torch.float32 else dt)


# ---- flash_attn_with_kvcache ----
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", [{}, {"append": True, "causal": True}, {"paged": True},
                                  {"window_size": (None, 0), "num_splits": 3},
                                  {"append": True, "num_splits": 1, "cache_seqlens_int": True}],
                         ids=["plain", "append-causal", "paged", "window-splits", "int-seqlens"])
def test_kvcache(device, case):
    """FA3's flash_attn_with_kvcache equals flashc's 2.x call (the same C call), cache
    updates included; return_softmax_lse gives FA3's four-tuple."""
    dt = torch.float16
    b, sq, h, hk, d, sc = 3, 2, 4, 2, 16, 12
    q = rand(b, sq, h, d, device=device, dtype=dt, seed=20)
    kc = rand(b, sc, hk, d, device=device, dtype=dt, seed=21)
    vc = rand(b, sc, hk, d, device=device, dtype=dt, seed=22)
    seqlens = 6 if case.get("cache_seqlens_int") else torch.tensor([3, 7, 5], dtype=torch.int32,
                                                                   device=device)
    knew = rand(b, 2, hk, d, device=device, dtype=dt, seed=23) if case.get("append") else None
    vnew = rand(b, 2, hk, d, device=device, dtype=dt, seed=24) if case.get("append") else None
    table = None
    if case.get("paged"):
        lens = [sc] * b
        kc, table = paged(kc.reshape(b * sc, hk, d), lens, 4, device, seed=3)
        vc, _ = paged(vc.reshape(b * sc, hk, d), lens, 4, device, seed=3)
    window = case.get("window_size", (-1, -1))
    causal, splits = case.get("causal", False), case.get("num_splits", 0)
    kc2, vc2 = kc.clone(), vc.clone()
    got = v3.flash_attn_with_kvcache(q, kc, vc, knew, knew if vnew is None else vnew,
                                     cache_seqlens=seqlens, page_table=table, causal=causal,
                                     window_size=window, num_splits=splits,
                                     scheduler_metadata=v3.get_scheduler_metadata(
                                         b, sq, sc, h, hk, d, seqlens),
                                     return_softmax_lse=True)
    want = flashc.flash_attn_with_kvcache(q, kc2, vc2, knew, knew if vnew is None else vnew,
                                          cache_seqlens=seqlens, block_table=table,
                                          causal=causal, window_size=ref_opts(
                                              {"window_size": window})["window_size"],
                                          num_splits=splits, return_softmax_lse=True)
    assert len(got) == 4 and got[2].numel() == 0 and got[3].numel() == 0
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert got[1].shape == (b, h, sq)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)
    out = v3.flash_attn_with_kvcache(q, kc.clone(), vc.clone(), cache_seqlens=seqlens,
                                     page_table=table)
    assert isinstance(out, torch.Tensor) and out.shape == q.shape


def test_kvcache_reference():
    """One plain call against the float64 reference over each sequence's cache rows."""
    b, sq, h, hk, d, sc = 2, 3, 4, 2, 8, 9
    q = rand(b, sq, h, d, seed=30)
    kc, vc = rand(b, sc, hk, d, seed=31), rand(b, sc, hk, d, seed=32)
    seqlens = torch.tensor([4, 9], dtype=torch.int32)
    out, lse, *_ = v3.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, causal=True,
                                              num_splits=2, return_softmax_lse=True)
    for i in range(b):
        n = int(seqlens[i])
        o64, l64 = ref_attention(q[i:i + 1].double(), kc[i:i + 1, :n].double(),
                                 vc[i:i + 1, :n].double(), causal=True)
        olp, _ = ref_attention(q[i:i + 1], kc[i:i + 1, :n], vc[i:i + 1, :n], causal=True,
                               lowp=True)
        check("out", out[i:i + 1], o64, olp, torch.float32)
        check("lse", lse[i:i + 1], l64, None, torch.float32)


# ---- flash_attn_combine ----
def combine64(out_partial, lse_partial):
    """The direct computation in float64: lse = log sum exp lse_i, out = sum exp(lse_i -
    lse) out_i (0 where every lse_i is -inf)."""
    o, l = out_partial.double(), lse_partial.double()
    lse = torch.logsumexp(l, dim=0)
    w = torch.exp(l - torch.where(torch.isinf(lse), 0, lse))
    return (w.unsqueeze(-1) * o).sum(0), lse


@pytest.mark.parametrize("out_dtype", [None, torch.float16, torch.bfloat16])
def test_combine(out_dtype):
    splits, b, s, h, d = 4, 2, 5, 3, 7
    op = rand(splits, b, s, h, d, seed=40)
    lp = rand(splits, b, s, h, seed=41) * 6
    lp[:, 0, 1, 2] = -math.inf          # a row no split saw: out 0, lse -inf
    lp[1:, 1, 3] = -math.inf            # rows only split 0 saw
    out, lse = v3.flash_attn_combine(op, lp, out_dtype=out_dtype)
    o64, l64 = combine64(op, lp)
    dt = out_dtype or torch.float32
    assert out.dtype == dt and out.shape == (b, s, h, d)
    assert lse.dtype == torch.float32 and lse.shape == (b, s, h)
    assert lse.transpose(1, 2).is_contiguous()  # FA3's (b, h, s) storage
    check("lse", lse, l64, None, torch.float32)
    check("out", out.float(), o64.to(dt).double() if dt != torch.float32 else o64, None,
          torch.float32)
    assert torch.equal(out[0, 1, 2], torch.zeros(d, dtype=dt)) and lse[0, 1, 2] == -math.inf
    given = torch.full((b, s, h, d), math.nan, dtype=dt)
    out2, _ = v3.flash_attn_combine(op, lp, out=given)
    assert out2 is given and torch.equal(given, out)


def test_combine_splits_attention():
    """Attention over key splits, merged by flash_attn_combine, is attention over all keys."""
    b, sq, sk, h, d, splits = 2, 4, 12, 3, 8, 3
    q, k, v = rand(b, sq, h, d, seed=42), rand(b, sk, h, d, seed=43), rand(b, sk, h, d, seed=44)
    parts = [v3.flash_attn_func(q, k[:, j::splits], v[:, j::splits], return_attn_probs=True)
             for j in range(splits)]
    op = torch.stack([o for o, _ in parts])                      # (splits, b, sq, h, d)
    lp = torch.stack([lse.transpose(1, 2) for _, lse in parts])  # (splits, b, sq, h)
    out, lse = v3.flash_attn_combine(op, lp)
    o64, l64 = ref_attention(q.double(), k.double(), v.double())
    olp, _ = ref_attention(q, k, v, lowp=True)
    check("out", out, o64, olp, torch.float32)
    check("lse", lse, l64.transpose(1, 2), None, torch.float32)


def test_combine_bad_input():
    with pytest.raises(flashc.FlashcArgumentError):
        v3.flash_attn_combine(rand(2, 1, 3, 2, 4).half(), rand(2, 1, 3, 2))
    with pytest.raises(flashc.FlashcArgumentError):
        v3.flash_attn_combine(rand(2, 1, 3, 2, 4), rand(2, 1, 2, 3))
    with pytest.raises(flashc.FlashcArgumentError):
        v3.flash_attn_combine(rand(2, 1, 3, 2, 4), rand(2, 1, 3, 2), out_dtype=torch.int32)


def test_get_scheduler_metadata():
    assert v3.get_scheduler_metadata(2, 1, 64, 8, 2, 128,
                                     torch.tensor([3, 5], dtype=torch.int32)) is None


# ---- unsupported arguments raise ----
def unsupported_calls():
    q, k = rand(1, 3, 2, 8), rand(1, 4, 2, 8)
    t = torch.ones(1)
    cq = torch.tensor([0, 3], dtype=torch.int32)
    qv, kc = rand(1, 4, 2, 8), rand(1, 6, 2, 8)
    return {
        "func:qv": lambda: v3.flash_attn_func(q, k, k, qv=qv),
        "func:q_descale": lambda: v3.flash_attn_func(q, k, k, q_descale=t),
        "func:k_descale": lambda: v3.flash_attn_func(q, k, k, k_descale=t),
        "func:v_descale": lambda: v3.flash_attn_func(q, k, k, v_descale=t),
        "func:attention_chunk": lambda: v3.flash_attn_func(q, k, k, attention_chunk=2),
        "qkvpacked:q_descale": lambda: v3.flash_attn_qkvpacked_func(
            torch.stack([q, q, q], 2), q_descale=t),
        "varlen:qv": lambda: v3.flash_attn_varlen_func(q[0], q[0], q[0], cq, cq, 3, 3, qv=q[0]),
        "varlen:attention_chunk": lambda: v3.flash_attn_varlen_func(q[0], q[0], q[0], cq, cq, 3, 3,
                                                          attention_chunk=1),
        "varlen:cu_seqlens_q": lambda: v3.flash_attn_varlen_func(q[0], q[0], q[0], None, None,
                                                                 3, 3),
        "kvcache:qv": lambda: v3.flash_attn_with_kvcache(q, kc, kc, qv=q),
        "kvcache:cu_seqlens_q": lambda: v3.flash_attn_with_kvcache(q, kc, kc, cu_seqlens_q=cq),
        "kvcache:cu_seqlens_k_new": lambda: v3.flash_attn_with_kvcache(
            q, kc, kc, cu_seqlens_k_new=cq),
        "kvcache:max_seqlen_q": lambda: v3.flash_attn_with_kvcache(q, kc, kc, max_seqlen_q=3),
        "kvcache:rotary_seqlens": lambda: v3.flash_attn_with_kvcache(
            q, kc, kc, rotary_seqlens=cq),
        "kvcache:v_descale": lambda: v3.flash_attn_with_kvcache(q, kc, kc, v_descale=t),
        "kvcache:attention_chunk": lambda: v3.flash_attn_with_kvcache(q, kc, kc, attention_chunk=4),
        "kvcache:scheduler_metadata": lambda: v3.flash_attn_with_kvcache(
            q, kc, kc, scheduler_metadata=torch.zeros(4, dtype=torch.int32)),
    }


@pytest.mark.parametrize("name", sorted(unsupported_calls()))
def test_unsupported(name):
    """Each argument flashc cannot honour (function:argument) raises FlashcArgumentError (a
    ValueError) with status FLASHC_ERR_UNSUPPORTED naming the argument; none is ignored."""
    with pytest.raises(ValueError) as e:
        unsupported_calls()[name]()
    assert isinstance(e.value, flashc.FlashcError) and e.value.status == UNSUPPORTED
    assert name.split(":")[1] + "=" in str(e.value)


def test_window_size_bad():
    q = rand(1, 3, 2, 8)
    with pytest.raises(flashc.FlashcArgumentError):
        v3.flash_attn_func(q, q, q, window_size=(None,))
    with pytest.raises(flashc.FlashcArgumentError):
        v3.flash_attn_func(q, q, q, window_size=(1.5, None))
