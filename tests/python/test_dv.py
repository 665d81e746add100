"""test_dv.py : a value head dim Dv other than the query/key head dim D (DeepSeek MLA:
D = 192, Dv = 128; and Dv > D) through the Python package, on every device torch has
(cpu always; cuda when available, fp16 and bf16), and head dims past 256 (512, and
absorbed MLA's 576 / 512: CPU only, the CUDA backend refuses them).

- flash_attn_func: out has Dv, out and the gradients of q, k, v against the float64
  reference (test_flashc.ref_attention) by the tolerance rule, masks, softcap, ALiBi,
  GQA, Sq < = > Sk, every dtype; the default scale is 1 / sqrt(D).
- flash_attn_varlen_func (forward and backward), and a paged forward.
- flash_attn_with_kvcache with an append into contiguous and paged caches.
- torch.library.opcheck of flashc::fwd, ::bwd, ::varlen_fwd, ::varlen_bwd and
  ::fwd_kvcache with Dv != D (the fake implementations give out its Dv).
- deterministic=True twice: bitwise equal gradients; out with the wrong last dim
  refused with a message naming it; on CUDA, a value head dim past 256 refused with
  FLASHC_ERR_UNSUPPORTED.

Run:  FLASHC_LIBRARY=build/libflashc.so PYTHONPATH=python python3 -m pytest tests/python -q
"""
import pytest
import torch

import flashc
from flashc import interface
from test_flashc import (DEVICE_DTYPES, DEVICES, DT, UNSUPPORTED, check, check_fwd_bwd, cu,
                         rand, ref_attention)

# D, Dv: MLA's 192/128, both orders, odd dims; head dims past 256 on the CPU (Gemma's 512,
# absorbed MLA's 576/512)
PAIRS = [(192, 128), (128, 192), (64, 32), (72, 40), (7, 33), (512, 512), (576, 512)]
OPTIONS = [
    {},
    {"causal": True},
    {"window_size": (3, 2)},
    {"softcap": 2.0, "softmax_scale": 1.3},
    {"alibi": True, "causal": True},
]
LENS = [(7, 13), (13, 6), (9, 9)]  # Sq, Sk
# a float dtype each device takes: fp32 on the CPU, bf16 on CUDA
DEVICE_DT = {"cpu": torch.float32, "cuda": torch.bfloat16}


def skip_past_cuda(device, *dims):
    """The CUDA backend's head dims end at 256 (test_cuda_past_256_refused)."""
    if device == "cuda" and max(dims) > 256:
        pytest.skip("head dims past 256 are CPU only")


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("dims", PAIRS, ids=lambda p: "d%d-dv%d" % p)
@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: "-".join(sorted(o)) or "plain")
def test_func(device, dtype, dims, opts):
    dt, (d, dv) = DT[dtype], dims
    skip_past_cuda(device, d, dv)
    i = PAIRS.index(dims) + OPTIONS.index(opts)
    sq, sk = LENS[i % 3]
    b, h, hk = 2, 4, (4, 2, 1)[i % 3]
    opts = dict(opts)
    alibi = (rand(h, seed=7).abs() * 0.5).to(device) if opts.pop("alibi", False) else None
    q = rand(b, sq, h, d, device=device, dtype=dt, seed=1)
    k = rand(b, sk, hk, d, device=device, dtype=dt, seed=2)
    v = rand(b, sk, hk, dv, device=device, dtype=dt, seed=3)
    out = check_fwd_bwd(
        lambda q, k, v: flashc.flash_attn_func(q, k, v, alibi_slopes=alibi, **opts),
        lambda q, k, v, lowp: ref_attention(q, k, v, alibi_slopes=alibi, lowp=lowp, **opts),
        [q, k, v], dt, names="qkv")
    assert out.shape == (b, sq, h, dv)


@pytest.mark.parametrize("device", DEVICES)
def test_default_scale_is_of_d(device):
    """softmax_scale None is 1 / sqrt(D), q's and k's head dim, not Dv's."""
    dt = DEVICE_DT[device]
    q, k, v = (rand(*s, device=device, dtype=dt, seed=i + 1)
               for i, s in enumerate([(1, 5, 2, 64), (1, 6, 2, 64), (1, 6, 2, 16)]))
    got = flashc.flash_attn_func(q, k, v)
    want = flashc.flash_attn_func(q, k, v, softmax_scale=64 ** -0.5)
    assert torch.equal(got, want)
    other = flashc.flash_attn_func(q, k, v, softmax_scale=16 ** -0.5)
    assert not torch.equal(got, other)


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic_twice(device):
    dt = DEVICE_DT[device]
    q, k, v = (rand(*s, device=device, dtype=dt, seed=i + 1)
               for i, s in enumerate([(2, 40, 4, 72), (2, 33, 2, 72), (2, 33, 2, 40)]))
    grads = []
    for _ in range(2):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = flashc.flash_attn_func(*leaves, causal=True, deterministic=True)
        out.backward(rand(*out.shape, device=device, dtype=dt, seed=9))
        grads.append([t.grad for t in leaves])
    for a, b in zip(*grads):
        assert torch.equal(a, b)
    assert grads[0][2].shape == v.shape


def _varlen_ref(q, k, v, lq, lk, lowp, **opts):
    """Per-sequence ref_attention of packed q, k, v."""
    outs, cq, ck = [], 0, 0
    for a, b in zip(lq, lk):
        o, _ = ref_attention(q[None, cq:cq + a], k[None, ck:ck + b], v[None, ck:ck + b],
                             lowp=lowp, **opts)
        outs.append(o[0])
        cq, ck = cq + a, ck + b
    return torch.cat(outs), None


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("dims", PAIRS[:3], ids=lambda p: "d%d-dv%d" % p)
@pytest.mark.parametrize("causal", [False, True])
def test_varlen(device, dtype, dims, causal):
    dt, (d, dv) = DT[dtype], dims
    lq, lk = [3, 0, 9], [5, 2, 7]
    q = rand(sum(lq), 4, d, device=device, dtype=dt, seed=1)
    k = rand(sum(lk), 2, d, device=device, dtype=dt, seed=2)
    v = rand(sum(lk), 2, dv, device=device, dtype=dt, seed=3)
    cq, ck = cu(lq, device), cu(lk, device)
    out = check_fwd_bwd(
        lambda q, k, v: flashc.flash_attn_varlen_func(q, k, v, cq, ck, max(lq), max(lk),
                                                      causal=causal),
        lambda q, k, v, lowp: _varlen_ref(q, k, v, lq, lk, lowp, causal=causal),
        [q, k, v], dt, names="qkv")
    assert out.shape == (sum(lq), 4, dv)


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_paged(device):
    dt = DEVICE_DT[device]
    lq, lk, page = [3, 4], [5, 7], 3
    q, k, v = (rand(*s, device=device, dtype=dt, seed=i + 1)
               for i, s in enumerate([(7, 4, 192), (12, 2, 192), (12, 2, 128)]))
    blocks = torch.tensor([[4, 1, 2], [0, 3, 5]], dtype=torch.int32)
    kp = torch.zeros(6, page, 2, 192, device=device, dtype=dt)
    vp = torch.zeros(6, page, 2, 128, device=device, dtype=dt)
    starts = [0, 5]
    for bi, n in enumerate(lk):
        for j in range(n):
            kp[blocks[bi, j // page], j % page] = k[starts[bi] + j]
            vp[blocks[bi, j // page], j % page] = v[starts[bi] + j]
    got = flashc.flash_attn_varlen_func(q, kp, vp, cu(lq, device), cu(lk, device), 4, 7,
                                        causal=True, block_table=blocks.to(device))
    ref, _ = _varlen_ref(q.double(), k.double(), v.double(), lq, lk, False, causal=True)
    base, _ = _varlen_ref(q, k, v, lq, lk, True, causal=True)
    assert got.shape == (7, 4, 128)
    check("out", got, ref, base, dt)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("dims", [(192, 128), (40, 72), (576, 512)], ids=lambda p: "d%d-dv%d" % p)
def test_kvcache(device, paged, dims):
    d, dv = dims
    skip_past_cuda(device, d, dv)
    dt = DEVICE_DT[device]
    b, h, hk, sq, sn = 2, 4, 2, 2, 2
    used = [3, 6]
    q = rand(b, sq, h, d, device=device, dtype=dt, seed=1)
    k_new = rand(b, sn, hk, d, device=device, dtype=dt, seed=2)
    v_new = rand(b, sn, hk, dv, device=device, dtype=dt, seed=3)
    kc = rand(b, 10, hk, d, device=device, dtype=dt, seed=4)
    vc = rand(b, 10, hk, dv, device=device, dtype=dt, seed=5)
    ks = [torch.cat([kc[i, :used[i]], k_new[i]]) for i in range(b)]
    vs = [torch.cat([vc[i, :used[i]], v_new[i]]) for i in range(b)]
    table = None
    if paged:
        table = torch.tensor([[4, 1, 2], [0, 3, 5]], dtype=torch.int32, device=device)
        pk = torch.zeros(6, 4, hk, d, device=device, dtype=dt)
        pv = torch.zeros(6, 4, hk, dv, device=device, dtype=dt)
        for i in range(b):
            for j in range(10):
                pk[table[i, j // 4], j % 4] = kc[i, j]
                pv[table[i, j // 4], j % 4] = vc[i, j]
        kc, vc = pk, pv
    seqlens = torch.tensor(used, dtype=torch.int32, device=device)
    out = flashc.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=seqlens,
                                         block_table=table, causal=True)
    assert out.shape == (b, sq, h, dv)
    for i in range(b):
        ref, _ = ref_attention(q[i:i + 1].double(), ks[i][None].double(),
                               vs[i][None].double(), causal=True)
        base, _ = ref_attention(q[i:i + 1], ks[i][None], vs[i][None], causal=True, lowp=True)
        check("out[%d]" % i, out[i:i + 1], ref, base, dt)
    # the appended rows, as they were given (no rotary)
    for i in range(b):
        for j in range(sn):
            r = used[i] + j
            krow = kc[table[i, r // 4], r % 4] if paged else kc[i, r]
            vrow = vc[table[i, r // 4], r % 4] if paged else vc[i, r]
            assert torch.equal(krow, k_new[i, j]) and torch.equal(vrow, v_new[i, j])


def test_wrong_out_last_dim_refused():
    """The ops' out comes from the fake: a call with an out of q's last dim goes through
    the C API, which names it."""
    q, k, v = rand(1, 5, 2, 16, seed=1), rand(1, 6, 2, 16, seed=2), rand(1, 6, 2, 8, seed=3)
    out = torch.empty(1, 5, 2, 16)
    lse = torch.empty(1, 2, 5)
    args = interface._fill(interface._lib.FwdArgs, q=q, k=k, v=v, out=out, softmax_lse=lse)
    with pytest.raises(flashc.FlashcError, match=r"out\.shape\[3\]=16 but v\.shape\[3\]=8"):
        interface._run("flashc_fwd", args, q.device)
    with pytest.raises(flashc.FlashcError, match=r"v\.shape\[3\]=1025 but the value head_dim"):
        flashc.flash_attn_func(q, k, rand(1, 6, 2, 1025, seed=3))


@pytest.mark.skipif("cuda" not in DEVICES, reason="no CUDA device")
@pytest.mark.parametrize("dims", [(128, 320), (576, 512)], ids=lambda p: "d%d-dv%d" % p)
def test_cuda_past_256_refused(dims):
    """On CUDA a head dim past 256, D or Dv, is FLASHC_ERR_UNSUPPORTED, naming it."""
    d, dv = dims
    q, k = rand(1, 5, 2, d, device="cuda", dtype=torch.bfloat16, seed=1), \
        rand(1, 6, 2, d, device="cuda", dtype=torch.bfloat16, seed=2)
    v = rand(1, 6, 2, dv, device="cuda", dtype=torch.bfloat16, seed=3)
    what = "the value head_dim" if dv > d else "head_dim"
    with pytest.raises(flashc.FlashcError, match=r"%s.*=%d but the CUDA backend" %
                       (what, max(d, dv))) as e:
        flashc.flash_attn_func(q, k, v)
    assert e.value.status == UNSUPPORTED


# ---- opcheck ----
pytestmark_ops = pytest.mark.skipif(not interface._CUSTOM_OP,
                                    reason="torch < 2.4 has no torch.library.custom_op")
MASK = (0.0, None, True, -1, -1, 0.0)


def opcheck(name, args):
    results = torch.library.opcheck(getattr(torch.ops.flashc, name).default, args)
    assert all(r == "SUCCESS" for r in results.values()), results


@pytestmark_ops
@pytest.mark.parametrize("dims", [(16, 8), (8, 24)], ids=lambda p: "d%d-dv%d" % p)
@pytest.mark.parametrize("grad", [False, True], ids=["nograd", "grad"])
def test_opcheck_fwd_bwd(dims, grad):
    d, dv = dims
    q = rand(2, 5, 4, d, seed=1).requires_grad_(grad)
    k = rand(2, 7, 2, d, seed=2).requires_grad_(grad)
    v = rand(2, 7, 2, dv, seed=3).requires_grad_(grad)
    opcheck("fwd", (q, k, v, None) + MASK + (False, 11, 0, False))
    q, k, v = (t.detach() for t in (q, k, v))
    out, lse, _ = torch.ops.flashc.fwd(q, k, v, None, *MASK, False, 11, 0)
    assert out.shape == (2, 5, 4, dv)
    grads = tuple(torch.empty_like(t) for t in (q, k, v))
    opcheck("bwd", (rand(*out.shape, seed=5), q, k, v, out, lse) + grads + (None,) + MASK +
            (True, 11, 0, None, None))


@pytestmark_ops
@pytest.mark.parametrize("dims", [(16, 8), (8, 24)], ids=lambda p: "d%d-dv%d" % p)
def test_opcheck_varlen(dims):
    d, dv = dims
    lq, lk = [3, 0, 5], [5, 2, 4]
    q, k, v = rand(8, 4, d, seed=6), rand(11, 2, d, seed=7), rand(11, 2, dv, seed=8)
    cq, ck = cu(lq, "cpu"), cu(lk, "cpu")
    opcheck("varlen_fwd", (q, k, v, cq, ck, 5, 5, None, None, None) + MASK + (False, 11, 0))
    out, lse, _ = torch.ops.flashc.varlen_fwd(q, k, v, cq, ck, 5, 5, None, None, None, *MASK,
                                              False, 11, 0)
    assert out.shape == (8, 4, dv)
    grads = tuple(torch.empty_like(t) for t in (q, k, v))
    opcheck("varlen_bwd", (rand(*out.shape, seed=5), q, k, v, out, lse) + grads +
            (cq, ck, 5, 5, None) + MASK + (False, 11, 0, None, None))
    kp, vp = rand(6, 4, 2, d, seed=9), rand(6, 4, 2, dv, seed=10)
    table = torch.tensor([[5, 0], [1, 2], [3, 4]], dtype=torch.int32)
    opcheck("varlen_fwd", (q, kp, vp, cq, ck, 5, 8, table, None, None) + MASK + (False, 0, 0))


@pytestmark_ops
@pytest.mark.parametrize("paged", [False, True])
def test_opcheck_fwd_kvcache(paged):
    b, h, hk, d, dv = 2, 4, 2, 16, 8
    q = rand(b, 2, h, d, seed=11)
    k_new, v_new = rand(b, 2, hk, d, seed=12), rand(b, 2, hk, dv, seed=13)
    seqlens = torch.tensor([3, 6], dtype=torch.int32)
    table = None
    if paged:
        kc, vc = rand(5, 4, hk, d, seed=14), rand(5, 4, hk, dv, seed=15)
        table = torch.tensor([[4, 1], [0, 3]], dtype=torch.int32)
    else:
        kc, vc = rand(3, 10, hk, d, seed=14), rand(3, 10, hk, dv, seed=15)
    opcheck("fwd_kvcache", (q, kc, vc, k_new, v_new, None, None, seqlens, None, None, table,
                            None, None, True, -1, -1, 0.0, True, 0))


@pytest.mark.parametrize("dims", [(24, 8), (8, 24)], ids=lambda p: "d%d-dv%d" % p)
def test_learnable_sink(dims):
    """A learnable sink with Dv != D: out and the gradients of q, k, v."""
    d, dv = dims
    sink = rand(4, seed=8)
    q, k, v = rand(2, 9, 4, d, seed=1), rand(2, 7, 2, d, seed=2), rand(2, 7, 2, dv, seed=3)
    check_fwd_bwd(
        lambda q, k, v: flashc.flash_attn_func(q, k, v, causal=True, learnable_sink=sink),
        lambda q, k, v, lowp: ref_attention(q, k, v, causal=True, lowp=lowp,
                                            sink=sink.double() if not lowp else sink),
        [q, k, v], torch.float32, names="qkv")
