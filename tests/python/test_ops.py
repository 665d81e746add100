"""test_ops.py : flashc's torch.library custom ops (python/flashc/interface.py) under torch's
own checks, on CPU tensors.

- torch.library.opcheck on each op, flashc::fwd, ::varlen_fwd, ::bwd, ::varlen_bwd,
  ::fwd_kvcache, and flashc.v3's ::v3_fwd and ::v3_bwd (FA3's private ops), for a few
  argument sets each (GQA, causal, window, softcap, ALiBi, dropout, varlen, seqused, paged,
  the KV-cache append with rotary): the schema and its mutation annotations,
  the fake implementation against the real one, the registered autograd of the two forward
  ops (inputs that require grad), and AOTAutograd with dynamic shapes, gradients included.
- torch.compile(fullgraph=True) of a loss through flash_attn_func, the packed functions,
  flash_attn_varlen_func and flashc.v3.flash_attn_func, and with dropout: the loss and
  every gradient against eager; the same through _FlashAttnFunc alone (torch < 2.4).
- the direct call (interface._call runs a forward op's Python function without torch's
  dispatcher): bit for bit the op's results (flash_attn_func, the packed and varlen
  functions, flash_attn_with_kvcache appending to its caches), the caches' versions bumped,
  and the op taken instead under autograd, torch.compile (no grad), dispatch and torch
  function modes, a tensor subclass, fake and meta tensors.
- torch.export.export (strict and not) of a small module that calls flash_attn_func,
  flash_attn_qkvpacked_func, flashc.v3.flash_attn_func or FA3's private
  _flash_attn_forward, with a dynamic batch and sequence length: the graph calls flashc::fwd
  (flashc::v3_fwd for the private op), the exported program's output on other shapes and
  its parameters' gradients against eager.

Run:  FLASHC_LIBRARY=build/libflashc.so PYTHONPATH=python python3 -m pytest tests/python -q
"""
import pytest
import torch

import flashc
from flashc import interface, v3
from test_flashc import cu, rand

pytestmark = pytest.mark.skipif(not interface._CUSTOM_OP,
                                reason="torch < 2.4 has no torch.library.custom_op")

OPS = ("fwd", "varlen_fwd", "bwd", "varlen_bwd", "fwd_kvcache", "v3_fwd", "v3_bwd")


def opcheck(name, args):
    """torch.library.opcheck of flashc::name with args; every check must pass."""
    results = torch.library.opcheck(getattr(torch.ops.flashc, name).default, args)
    assert set(results.values()) == {"SUCCESS"}, results


def leaf(t, grad):
    return t.detach().clone().requires_grad_(grad)


def test_every_op_checked():
    """The ops opcheck covers here are the ones interface.py registers."""
    registered = {name for name in dir(torch.ops.flashc) if not name.startswith("_")} - {
        "name"}
    assert registered >= set(OPS), registered
    assert set(OPS) >= {n for n in registered if hasattr(getattr(torch.ops.flashc, n),
                                                         "default")}, registered


# ---- forward and backward, batched ----
# mask arguments in the ops' order: dropout_p, softmax_scale, causal, window_left,
# window_right, softcap
MASKS = {
    "plain": (0.0, None, False, -1, -1, 0.0),
    "causal": (0.0, None, True, -1, -1, 0.0),
    "window": (0.0, 0.7, False, 2, 1, 0.0),
    "causal-window-softcap": (0.0, None, True, 3, 0, 2.0),
    "dropout": (0.25, None, False, -1, -1, 0.0),
}
BATCHED = [(2, 5, 7, 4, 2, 16), (1, 6, 6, 3, 3, 8)]  # B, Sq, Sk, H, Hk, D


def batched(shape, grad=False):
    b, sq, sk, h, hk, d = shape
    return (leaf(rand(b, sq, h, d, seed=1), grad), leaf(rand(b, sk, hk, d, seed=2), grad),
            leaf(rand(b, sk, hk, d, seed=3), grad))


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("shape", BATCHED, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("grad", [False, True], ids=["nograd", "grad"])
def test_opcheck_fwd(mask, shape, grad):
    q, k, v = batched(shape, grad)
    alibi = rand(q.shape[2], seed=4).abs() if mask == "plain" else None
    for return_probs, deterministic in ((False, False), (True, True)):
        opcheck("fwd", (q, k, v, alibi) + MASKS[mask] + (return_probs, 11, 0, deterministic))


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("shape", BATCHED, ids=lambda s: "x".join(map(str, s)))
def test_opcheck_bwd(mask, shape):
    q, k, v = batched(shape)
    out, lse, _ = torch.ops.flashc.fwd(q, k, v, None, *MASKS[mask], False, 11, 0)
    dout = rand(*out.shape, seed=5)
    for deterministic in (False, True):
        grads = tuple(torch.empty_like(t) for t in (q, k, v))
        opcheck("bwd", (dout, q, k, v, out, lse) + grads + (None,) + MASKS[mask] +
                (deterministic, 11, 0, None, None))


# ---- forward and backward, varlen ----
LENS = ([3, 0, 5], [5, 2, 4])  # per sequence: queries, keys


def varlen(h=4, hk=2, d=16, grad=False):
    (lq, lk) = LENS
    q = leaf(rand(sum(lq), h, d, seed=6), grad)
    k, v = (leaf(rand(sum(lk), hk, d, seed=s), grad) for s in (7, 8))
    return q, k, v, cu(lq, "cpu"), cu(lk, "cpu"), max(lq), max(lk)


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("grad", [False, True], ids=["nograd", "grad"])
def test_opcheck_varlen_fwd(mask, grad):
    q, k, v, cu_q, cu_k, max_q, max_k = varlen(grad=grad)
    for return_probs, deterministic in ((False, False), (True, True)):
        opcheck("varlen_fwd", (q, k, v, cu_q, cu_k, max_q, max_k, None, None, None) +
                MASKS[mask] + (return_probs, 11, 0, deterministic))


def test_opcheck_varlen_fwd_paged_seqused():
    """A paged cache (block_table) and seqused_k: forward only."""
    q, _, _, cu_q, cu_k, max_q, _ = varlen()
    k_pages, v_pages = rand(6, 4, 2, 16, seed=9), rand(6, 4, 2, 16, seed=10)
    block_table = torch.tensor([[5, 0], [1, 2], [3, 4]], dtype=torch.int32)
    seqused_k = torch.tensor([5, 2, 3], dtype=torch.int32)
    for used in (None, seqused_k):
        opcheck("varlen_fwd", (q, k_pages, v_pages, cu_q, cu_k, max_q, 8, block_table, used,
                               None) + MASKS["causal"] + (False, 0, 0))


@pytest.mark.parametrize("mask", MASKS)
def test_opcheck_varlen_bwd(mask):
    q, k, v, cu_q, cu_k, max_q, max_k = varlen()
    out, lse, _ = torch.ops.flashc.varlen_fwd(q, k, v, cu_q, cu_k, max_q, max_k, None, None,
                                              None, *MASKS[mask], False, 11, 0)
    grads = tuple(torch.empty_like(t) for t in (q, k, v))
    opcheck("varlen_bwd", (rand(*out.shape, seed=5), q, k, v, out, lse) + grads +
            (cu_q, cu_k, max_q, max_k, None) + MASKS[mask] + (False, 11, 0, None, None))


# ---- the KV cache ----
@pytest.mark.parametrize("case", ["append-rotary", "paged", "batch_idx-leftpad", "no-append"])
def test_opcheck_fwd_kvcache(case):
    b, h, hk, d = 2, 4, 2, 16
    q = rand(b, 2, h, d, seed=11)
    k_new, v_new = rand(b, 2, hk, d, seed=12), rand(b, 2, hk, d, seed=13)
    cache_seqlens = torch.tensor([3, 6], dtype=torch.int32)
    cos = sin = batch_idx = leftpad = block_table = None
    k_cache, v_cache = rand(3, 10, hk, d, seed=14), rand(3, 10, hk, d, seed=15)
    if case == "append-rotary":
        angle = rand(10, 4, seed=16)
        cos, sin = angle.cos(), angle.sin()
    elif case == "paged":
        k_cache, v_cache = rand(5, 4, hk, d, seed=14), rand(5, 4, hk, d, seed=15)
        block_table = torch.tensor([[4, 1], [0, 3]], dtype=torch.int32)
    elif case == "batch_idx-leftpad":
        batch_idx = torch.tensor([2, 0], dtype=torch.int32)
        leftpad = torch.tensor([1, 0], dtype=torch.int32)
    else:
        k_new = v_new = None
    opcheck("fwd_kvcache", (q, k_cache, v_cache, k_new, v_new, cos, sin, cache_seqlens,
                            batch_idx, leftpad, block_table, None, None, True, -1, -1, 0.0,
                            True, 0))


# ---- FA3's private ops (flashc.v3) ----
# mask arguments of v3_fwd and v3_bwd: softmax_scale, causal, window_left, window_right,
# softcap
V3_MASKS = {
    "plain": (None, False, -1, -1, 0.0),
    "causal": (None, True, -1, -1, 0.0),
    "window-softcap": (0.7, False, 2, 1, 2.0),
}
V3_USED = (torch.tensor([2, 0, 5], dtype=torch.int32), torch.tensor([5, 1, 3], dtype=torch.int32))


def v3_call(layout, grad=False):
    """q, k, v and v3_fwd's cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q,
    max_seqlen_k: layout "bshd" (batched), "thd" (varlen) or "thd-seqused"."""
    if layout == "bshd":
        b, sq, sk, h, hk, d = BATCHED[0]
        return batched(BATCHED[0], grad) + (None, None, None, None, sq, sk)
    q, k, v, cu_q, cu_k, max_q, max_k = varlen(grad=grad)
    used = V3_USED if layout == "thd-seqused" else (None, None)
    return (q, k, v, cu_q, cu_k) + used + (max_q, max_k)


V3_LAYOUTS = ["bshd", "thd", "thd-seqused"]


@pytest.mark.parametrize("layout", V3_LAYOUTS)
@pytest.mark.parametrize("mask", V3_MASKS)
@pytest.mark.parametrize("grad", [False, True], ids=["nograd", "grad"])
def test_opcheck_v3_fwd(layout, mask, grad):
    for deterministic in (False, True):
        opcheck("v3_fwd", v3_call(layout, grad) + V3_MASKS[mask] + (deterministic,))


@pytest.mark.parametrize("layout", V3_LAYOUTS)
@pytest.mark.parametrize("mask", V3_MASKS)
@pytest.mark.parametrize("given", [True, False], ids=["dqdkdv", "none"])
def test_opcheck_v3_bwd(layout, mask, given):
    """Into the caller's dq, dk, dv (declared mutated), or None (allocated inside)."""
    q, k, v, cu_q, cu_k, used_q, used_k, max_q, max_k = v3_call(layout)
    out, lse = torch.ops.flashc.v3_fwd(q, k, v, cu_q, cu_k, used_q, used_k, max_q, max_k,
                                       *V3_MASKS[mask])
    grads = tuple(torch.empty_like(t) for t in (q, k, v)) if given else (None,) * 3
    opcheck("v3_bwd", (rand(*out.shape, seed=5), q, k, v, out, lse, cu_q, cu_k, used_q,
                       used_k, max_q, max_k) + grads + V3_MASKS[mask] + (True, 0))


# ---- torch.compile ----
def loss_and_grads(fn, inputs):
    """fn(*inputs) (a scalar loss) and the gradients of inputs."""
    leaves = [leaf(t, t.is_floating_point()) for t in inputs]
    loss = fn(*leaves)
    loss.backward()
    return loss.detach(), [t.grad for t in leaves if t.is_floating_point()]


def weighted(out):
    """A loss whose gradient differs per element (out.sum() would give dout = 1)."""
    return (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum()


COMPILED = {
    "func": (lambda q, k, v: weighted(flashc.flash_attn_func(q, k, v, causal=True,
                                                             window_size=(3, 0))),
             lambda: batched(BATCHED[0])),
    "qkvpacked": (lambda qkv: weighted(flashc.flash_attn_qkvpacked_func(qkv, causal=True)),
                  lambda: (rand(2, 6, 3, 4, 16, seed=20),)),
    "kvpacked": (lambda q, kv: weighted(flashc.flash_attn_kvpacked_func(q, kv, softcap=2.0)),
                 lambda: (rand(2, 5, 4, 16, seed=21), rand(2, 7, 2, 2, 16, seed=22))),
    "varlen": (lambda q, k, v, cu_q, cu_k: weighted(flashc.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max(LENS[0]), max(LENS[1]), causal=True)),
        lambda: varlen()[:5]),
    "v3": (lambda q, k, v: weighted(v3.flash_attn_func(q, k, v, window_size=(2, None))),
           lambda: batched(BATCHED[1])),
    # FA3's private forward: flashc::v3_fwd and its registered backward; seqused gathers
    # rows by data inside the op
    "v3-private-seqused": (lambda q, k, v, cu_q, cu_k: weighted(v3._flash_attn_forward(
        q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, seqused_q=V3_USED[0],
        seqused_k=V3_USED[1], max_seqlen_q=max(LENS[0]), max_seqlen_k=max(LENS[1]),
        causal=True)[0]), lambda: varlen()[:5]),
    "v3-private-bshd": (lambda q, k, v: weighted(v3._flash_attn_forward(
        q, k, v, softcap=2.0, window_size=(3, None))[0]), lambda: batched(BATCHED[0])),
}


@pytest.mark.parametrize("case", COMPILED)
def test_compile_fullgraph(case):
    """No graph break (fullgraph), and the compiled loss and gradients are eager's."""
    fn, make = COMPILED[case]
    inputs = make()
    torch._dynamo.reset()
    loss, grads = loss_and_grads(torch.compile(fn, fullgraph=True), inputs)
    loss_eager, grads_eager = loss_and_grads(fn, inputs)
    torch.testing.assert_close(loss, loss_eager, rtol=1e-5, atol=1e-6)
    assert len(grads) == len(grads_eager) > 0
    for g, ge in zip(grads, grads_eager):
        torch.testing.assert_close(g, ge, rtol=1e-5, atol=1e-6)


DROPOUT = {
    "func": (lambda q, k, v: weighted(flashc.flash_attn_func(q, k, v, dropout_p=0.3,
                                                             causal=True)),
             lambda: batched(BATCHED[0])),
    "qkvpacked": (lambda qkv: weighted(flashc.flash_attn_qkvpacked_func(qkv, dropout_p=0.3)),
                  lambda: (rand(2, 6, 3, 4, 16, seed=20),)),
}


@pytest.mark.parametrize("case", DROPOUT)
def test_compile_dropout(case):
    """Dropout in a compiled graph: the seed is drawn inside the graph (a SymInt argument of
    flashc::fwd), and with inductor's fallback_random (torch's generator, as eager) the
    compiled loss and gradients are eager's for the same torch.manual_seed: the backward
    regenerates the forward's mask. Each call draws a new mask."""
    import torch._inductor.config
    fn, make = DROPOUT[case]
    inputs = make()
    torch._dynamo.reset()
    with torch._inductor.config.patch(fallback_random=True):
        compiled = torch.compile(fn, fullgraph=True)
        torch.manual_seed(5)
        loss, grads = loss_and_grads(compiled, inputs)
        assert not torch.equal(loss, loss_and_grads(compiled, inputs)[0])
    torch.manual_seed(5)
    loss_eager, grads_eager = loss_and_grads(fn, inputs)
    torch.testing.assert_close(loss, loss_eager, rtol=1e-5, atol=1e-6)
    for g, ge in zip(grads, grads_eager):
        torch.testing.assert_close(g, ge, rtol=1e-5, atol=1e-6)


def te_step(q, k, v, dout, out_, dq, dk, dv, lens, returns):
    """A context-parallel step as Transformer Engine runs one (no grad mode): the forward
    into the caller's out_, the backward into the caller's dq, dk, dv (dk, dv views of one
    buffer); returns what the backward returned."""
    cu_q, cu_k, used_q, used_k, max_q, max_k = lens
    kw = dict(causal=True, window_size=(-1, 0))
    _, lse, _, _ = v3._flash_attn_forward(q, k, v, None, None, None, out_, cu_q, cu_k, None,
                                          used_q, used_k, max_q, max_k, **kw)
    return v3._flash_attn_backward(dout, q, k, v, out_, lse, cu_q, cu_k, used_q, used_k,
                                   max_q, max_k, dq, dk, dv, deterministic=True,
                                   returns=returns, **kw)


@pytest.mark.parametrize("layout", V3_LAYOUTS)
@pytest.mark.parametrize("returns", ["softmax_d", "grads"])
def test_compile_v3_private_mutation(layout, returns):
    """te_step under torch.compile(fullgraph=True): the caller's out_, dq, dk, dv are
    written (the mutations flashc::v3_bwd declares and out_.copy_) and equal eager's, as
    does the return (softmax_d, or dq, dk, dv, softmax_d, the caller's tensors)."""
    q, k, v, *lens = v3_call(layout)
    dout = rand(*q.shape, seed=31)

    def buffers():
        dkv = torch.full((2,) + tuple(k.shape), float("nan"))
        return (torch.full_like(q, float("nan")), torch.full_like(q, float("nan"))) + \
            tuple(dkv.unbind(0))

    torch._dynamo.reset()
    compiled = torch.compile(te_step, fullgraph=True)
    with torch.no_grad():
        got_bufs, want_bufs = buffers(), buffers()
        got = compiled(q, k, v, dout, *got_bufs, lens, returns)
        want = te_step(q, k, v, dout, *want_bufs, lens, returns)
    for name, g, w in zip(("out_", "dq", "dk", "dv"), got_bufs, want_bufs):
        assert not g.isnan().any() and torch.equal(g, w), name
    if returns == "grads":
        assert all(a is b for a, b in zip(got[:3], got_bufs[1:]))
        got, want = got[3], want[3]
    assert torch.equal(got, want)


@pytest.mark.parametrize("case", COMPILED)
def test_autograd_function_path(case, monkeypatch):
    """Without custom ops (torch < 2.4) every function runs through interface._FlashAttnFunc:
    the same loss and gradients, bitwise, as through the ops' registered autograd."""
    fn, make = COMPILED[case]
    inputs = make()
    loss, grads = loss_and_grads(fn, inputs)
    monkeypatch.setattr(interface, "_CUSTOM_OP", False)
    loss_function, grads_function = loss_and_grads(fn, inputs)
    assert torch.equal(loss, loss_function)
    for g, gf in zip(grads, grads_function):
        assert torch.equal(g, gf)


# ---- the direct call: a forward op's Python function without torch's dispatcher ----
@pytest.fixture
def direct_calls(monkeypatch):
    """Counts, per op, the calls interface._call ran directly (not through the op); no
    KV-cache call prepared yet (each signature's first call runs the op's function)."""
    monkeypatch.setattr(interface, "_kv_prepared", {})
    assert interface._DIRECT_CHECKS and {interface._fwd, interface._varlen_fwd,
                                         interface._fwd_kvcache} <= set(interface._IMPLS), \
        "no direct call on this torch"
    counts = {op: 0 for op in interface._IMPLS}
    for op, (fn, mutated) in list(interface._IMPLS.items()):
        def counted(*args, op=op, fn=fn):
            counts[op] += 1
            return fn(*args)
        monkeypatch.setitem(interface._IMPLS, op, (counted, mutated))
    return counts


def kvcache_case(paged=False, sink=None):
    """A KV-cache call that appends 2 rotated rows to each of 2 sequences and attends
    causally: (a function of fresh caches returning out, lse and both caches, the caches)."""
    b, h, hk, d = 2, 4, 2, 16
    q, k_new, v_new = rand(b, 2, h, d, seed=40), rand(b, 2, hk, d, seed=41), \
        rand(b, 2, hk, d, seed=42)
    angle = rand(10, 4, seed=43)
    cache_seqlens = torch.tensor([3, 6], dtype=torch.int32)
    shape, table = ((5, 4, hk, d), torch.tensor([[4, 1], [0, 3]], dtype=torch.int32)) \
        if paged else ((2, 10, hk, d), None)

    def call(k_cache, v_cache):
        out, lse = flashc.flash_attn_with_kvcache(
            q, k_cache, v_cache, k_new, v_new, angle.cos(), angle.sin(), cache_seqlens,
            block_table=table, causal=True, return_softmax_lse=True, learnable_sink=sink)
        return out, lse, k_cache, v_cache
    return call, lambda: (rand(*shape, seed=44), rand(*shape, seed=45))


def func_case(fn, *inputs, **kw):
    return lambda: fn(*inputs, return_attn_probs=True, **kw), lambda: ()


# name -> (the op the call runs, (call, make): call(*make()) returns the tensors to compare)
DIRECT = {
    "func-decode": ("_fwd", func_case(flashc.flash_attn_func, rand(2, 1, 4, 16, seed=46),
                                      rand(2, 9, 2, 16, seed=47), rand(2, 9, 2, 16, seed=48),
                                      softcap=2.0)),
    "func-causal-window-dropout": ("_fwd", func_case(flashc.flash_attn_func,
                                                     *batched(BATCHED[0]), dropout_p=0.3,
                                                     causal=True, window_size=(3, 0))),
    "qkvpacked-alibi": ("_fwd", func_case(flashc.flash_attn_qkvpacked_func,
                                          rand(2, 6, 3, 4, 16, seed=20),
                                          alibi_slopes=rand(4, seed=49).abs())),
    "varlen-causal": ("_varlen_fwd", func_case(flashc.flash_attn_varlen_func, *varlen()[:7],
                                               causal=True)),
    "varlen-sink": ("_varlen_fwd", func_case(flashc.flash_attn_varlen_func, *varlen()[:7],
                                             learnable_sink=rand(4, seed=50))),
    "kvcache-append-rotary": ("_fwd_kvcache", kvcache_case()),
    "kvcache-paged-sink": ("_fwd_kvcache", kvcache_case(paged=True, sink=rand(4, seed=51))),
}


def run_direct(case, counts, monkeypatch, direct):
    """DIRECT[case] called with interface._direct as it is (direct) or forced off; asserts
    which path ran and that the caches' versions moved; returns the results."""
    name, (call, make) = DIRECT[case]
    op = getattr(interface, name)
    before = counts[op]
    inputs = make()
    versions = [t._version for t in inputs]
    with monkeypatch.context() as patch:
        if not direct:
            patch.setattr(interface, "_direct", lambda args: False)
        torch.manual_seed(3)
        got = call(*inputs)
    assert counts[op] - before == int(direct)
    assert all(t._version > v for t, v in zip(inputs, versions))  # the caches were updated
    return got


@pytest.mark.parametrize("case", DIRECT)
def test_direct_bitwise(case, direct_calls, monkeypatch):
    """Without autograd, tracing or modes the functions run the op's Python function
    directly; its results (out, softmax_lse, probs; the caches updated in place) are the
    op's, bit for bit."""
    direct = run_direct(case, direct_calls, monkeypatch, True)
    through_op = run_direct(case, direct_calls, monkeypatch, False)
    assert len(direct) == len(through_op) >= 3
    for d, o in zip(direct, through_op):
        assert d.numel() and not d.isnan().any() and torch.equal(d, o)


def test_direct_bumps_versions(direct_calls):
    """A cache that autograd saved and the direct call then changes in place fails the
    backward, as it does through the op (whose ADInplaceOrView kernel bumps the version)."""
    call, make = DIRECT["kvcache-append-rotary"][1]
    k_cache, v_cache = make()
    w = torch.ones_like(k_cache, requires_grad=True)
    loss = (w * k_cache).sum()  # saves k_cache for its backward
    call(k_cache, v_cache)
    assert direct_calls[interface._fwd_kvcache] == 1
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def kv_args(seed, seqlens, **over):
    """flash_attn_with_kvcache's tensors for 2 sequences appending 2 rows each to a
    (2, 10, 2, 16) cache, 4 query heads; over replaces any of them."""
    b, h, hk, d = 2, 4, 2, 16
    args = dict(q=rand(b, 2, h, d, seed=seed), k_cache=rand(2, 10, hk, d, seed=seed + 1),
                v_cache=rand(2, 10, hk, d, seed=seed + 2), k=rand(b, 2, hk, d, seed=seed + 3),
                v=rand(b, 2, hk, d, seed=seed + 4),
                cache_seqlens=torch.tensor(seqlens, dtype=torch.int32))
    args.update(over)
    return args


@pytest.mark.parametrize("lse", [False, True])
def test_kvcache_prepared(lse, direct_calls, monkeypatch):
    """flash_attn_with_kvcache's prepared calls (interface._kv_prepared): the first call
    of a signature runs the op's function and is recorded; later calls with new data (q,
    caches, cache_seqlens' values) run prepared, bit for bit what the op gives, caches
    updated and their versions moved; a bad cache_seqlens value fails prepared as it
    fails the whole way. Another option is another signature; a bf16 sink, a last stride
    of 2 and an int cache_seqlens are never prepared."""
    angle = rand(10, 4, seed=43)
    kw = dict(rotary_cos=angle.cos(), rotary_sin=angle.sin(), causal=True,
              return_softmax_lse=lse)

    def run(args, **more):
        a = dict(args, k_cache=args["k_cache"].clone(), v_cache=args["v_cache"].clone())
        versions = [a[n]._version for n in ("k_cache", "v_cache")]
        got = flashc.flash_attn_with_kvcache(**a, **kw, **more)
        assert all(a[n]._version > v for n, v in zip(("k_cache", "v_cache"), versions))
        return (got if lse else (got,)) + (a["k_cache"], a["v_cache"])

    def via_op(args, **more):
        with monkeypatch.context() as patch:
            patch.setattr(interface, "_direct", lambda args: False)
            return run(args, **more)

    op = interface._fwd_kvcache
    for seed, seqlens in [(60, [3, 6]), (70, [5, 0]), (80, [8, 1])]:
        args = kv_args(seed, seqlens)
        want = via_op(args)
        got = run(args)
        assert direct_calls[op] == 1 and len(interface._kv_prepared) == 1
        assert len(got) == len(want) and all(torch.equal(g, w) for g, w in zip(got, want))
    args = kv_args(85, [1, 4])  # return_softmax_lse is part of the signature
    other = flashc.flash_attn_with_kvcache(**args, **dict(kw, return_softmax_lse=not lse))
    assert isinstance(other, tuple) != lse and direct_calls[op] == 2
    want = flashc.flash_attn_with_kvcache(**kv_args(85, [1, 4]), **kw)
    assert torch.equal(want[0] if lse else want, other if lse else other[0])
    interface._kv_prepared.clear()
    direct_calls[op] = 0
    run(kv_args(60, [3, 6]))
    bad = kv_args(90, [9, 0])  # 9 + 2 appended rows > the cache's 10
    for calls in (1, 2):  # the whole way (no call of the op's function), then prepared
        with pytest.raises(flashc.FlashcArgumentError) as whole:
            via_op(bad)
        with pytest.raises(flashc.FlashcArgumentError) as prepared:
            run(bad)
        assert str(whole.value) == str(prepared.value) and "k_new" not in str(whole.value)
    assert direct_calls[op] == 1
    for seed in (100, 110):  # another option: its own signature, prepared from its second
        args = kv_args(seed, [2, 2])
        assert all(torch.equal(g, w) for g, w in zip(run(args, softcap=3.0),
                                                     via_op(args, softcap=3.0)))
    assert direct_calls[op] == 2 and len(interface._kv_prepared) == 2
    never = [dict(learnable_sink=rand(4, seed=120).bfloat16()),
             dict(q=rand(2, 2, 4, 32, seed=121)[..., ::2]), dict(cache_seqlens=3)]
    for over in never:
        args = kv_args(130, [3, 6], **{k: t for k, t in over.items() if k != "learnable_sink"})
        sink = over.get("learnable_sink")
        for _ in range(2):
            calls = direct_calls[op]
            got, want = run(args, learnable_sink=sink), via_op(args, learnable_sink=sink)
            assert direct_calls[op] == calls + 1
            assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert len(interface._kv_prepared) == 2


def test_kvcache_prepared_keys(direct_calls):
    """What a prepared signature tells apart: an option's type (window_size (True, -1),
    (1.0, -1) fail as they fail the whole way after (1, -1) ran), an option that is a
    tensor (never prepared: its value can change in place), and a 0-dim cache_seqlens
    (prepared: a tensor like any other)."""
    call = flashc.flash_attn_with_kvcache
    call(**kv_args(150, [3, 6]), window_size=(1, -1))
    assert len(interface._kv_prepared) == 1
    for window in ((True, -1), (1.0, -1), (1, -1.0)):
        with pytest.raises(flashc.FlashcArgumentError, match="must be an int"):
            call(**kv_args(150, [3, 6]), window_size=window)
    cap = torch.tensor(1.0)
    first = call(**kv_args(151, [3, 6]), softcap=cap)
    cap.fill_(50.0)
    again = call(**kv_args(151, [3, 6]), softcap=cap)
    assert torch.equal(again, call(**kv_args(151, [3, 6]), softcap=50.0))
    assert not torch.equal(first, again)
    seqlens = torch.tensor(4, dtype=torch.int32)
    outs = [call(**kv_args(152, [4, 4], cache_seqlens=seqlens)) for _ in range(2)]
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(outs[0], call(**kv_args(152, [4, 4])))
    calls = direct_calls[interface._fwd_kvcache]
    call(**kv_args(152, [4, 4], cache_seqlens=seqlens))
    assert direct_calls[interface._fwd_kvcache] == calls  # prepared


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_kvcache_not_prepared_on_cuda(direct_calls):
    """CUDA tensors go the whole way every call (the stream, the workspace, the device)."""
    args = {n: t.cuda() for n, t in kv_args(140, [3, 6]).items()}
    for calls in (1, 2):
        flashc.flash_attn_with_kvcache(**args, causal=True)
        assert direct_calls[interface._fwd_kvcache] == calls
    assert not interface._kv_prepared


def test_direct_not_with_autograd(direct_calls):
    """Inputs that require grad under grad mode go through the op and its registered
    autograd (the gradients are checked against the reference in test_flashc.py); under
    no_grad the same inputs run directly and the output requires no grad."""
    q, k, v = batched(BATCHED[0], grad=True)
    out = flashc.flash_attn_func(q, k, v, causal=True)
    assert direct_calls[interface._fwd] == 0 and out.grad_fn is not None
    out.sum().backward()
    assert all(t.grad is not None and t.grad.abs().sum() > 0 for t in (q, k, v))
    with torch.no_grad():
        again = flashc.flash_attn_func(q, k, v, causal=True)
    assert direct_calls[interface._fwd] == 1 and not again.requires_grad
    assert torch.equal(again, out.detach())


def test_direct_not_under_modes(direct_calls):
    """A dispatch mode, a torch function mode and a tensor subclass see flashc's ops; fake
    and meta tensors get the ops' fake implementation (shapes only): none of them runs
    directly."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode
    seen = []

    class DispatchRecord(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    class FunctionRecord(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    class Recorded(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return super().__torch_function__(func, types, args, kwargs or {})

    q, k, v = batched(BATCHED[0])
    call, make = DIRECT["kvcache-append-rotary"][1]
    for mode in (DispatchRecord, FunctionRecord):
        with mode():
            flashc.flash_attn_func(q, k, v)
            call(*make())
        assert seen.count("flashc.fwd.default") == seen.count("flashc.fwd_kvcache.default") \
            == 1, (mode, seen)
        seen.clear()
    assert type(flashc.flash_attn_func(q.as_subclass(Recorded), k, v)) is Recorded
    assert seen.count("flashc.fwd.default") == 1, seen
    with FakeTensorMode():
        fake = flashc.flash_attn_func(*(torch.empty(t.shape) for t in (q, k, v)))
    meta = flashc.flash_attn_func(*(t.to("meta") for t in (q, k, v)))
    assert fake.shape == meta.shape == q.shape and meta.is_meta
    assert type(fake).__name__ == "FakeTensor"
    assert not any(direct_calls.values())


NO_GRAD = {
    "func": lambda q, k, v: flashc.flash_attn_func(q, k, v, causal=True, window_size=(3, 0)),
    "kvcache": lambda q, k, v: flashc.flash_attn_with_kvcache(q, k, v, causal=True),
}


@pytest.mark.parametrize("case", NO_GRAD)
def test_compile_no_grad(case, direct_calls):
    """torch.compile(fullgraph=True) of a call without autograd: the graph holds the
    registered op (the direct call's ctypes would break the graph), nothing runs
    directly, and the result is eager's bit for bit."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm.code)
        return gm.forward

    q, k, v = batched(BATCHED[0])
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(NO_GRAD[case], fullgraph=True, backend=backend)(q, k, v)
        assert not any(direct_calls.values())
        want = NO_GRAD[case](q, k, v)
    assert len(graphs) == 1 and "torch.ops.flashc." in graphs[0], graphs
    assert torch.equal(got, want)


# ---- torch.export ----
class Attention(torch.nn.Module):
    """Self-attention of x (batch, seqlen, 32), head dim 8: flash_attn_func (4 query heads,
    2 KV heads), flash_attn_qkvpacked_func (4 heads), or FA3's flashc.v3.flash_attn_func or
    private _flash_attn_forward (4 query heads, 2 KV heads)."""

    def __init__(self, impl):
        super().__init__()
        torch.manual_seed(0)
        self.impl = impl
        self.qkv = torch.nn.Linear(32, 8 * (12 if impl == "qkvpacked" else 8))
        self.proj = torch.nn.Linear(32, 32)

    def forward(self, x):
        b, s, _ = x.shape
        if self.impl == "qkvpacked":
            qkv = self.qkv(x).view(b, s, 3, 4, 8)
            out = flashc.flash_attn_qkvpacked_func(qkv, causal=True, window_size=(5, 0))
        else:
            q, k, v = self.qkv(x).view(b, s, 8, 8).split([4, 2, 2], dim=2)
            if self.impl == "v3_private":  # FA3's private op, as Transformer Engine calls it
                out = v3._flash_attn_forward(q, k, v, causal=True, window_size_left=5,
                                             window_size_right=0)[0]
            else:
                fn = v3.flash_attn_func if self.impl == "v3" else flashc.flash_attn_func
                out = fn(q, k, v, causal=True, window_size=(5, 0))
        return self.proj(out.reshape(b, s, 32))


@pytest.mark.parametrize("strict", [False, True], ids=["nonstrict", "strict"])
@pytest.mark.parametrize("impl", ["func", "qkvpacked", "v3", "v3_private"])
def test_export(strict, impl):
    model = Attention(impl)
    dims = {0: torch.export.Dim("batch", max=64), 1: torch.export.Dim("seqlen", max=1024)}
    program = torch.export.export(model, (rand(2, 9, 32, seed=30),), dynamic_shapes=(dims,),
                                  strict=strict)
    op = "v3_fwd" if impl == "v3_private" else "fwd"
    assert "torch.ops.flashc.%s.default" % op in program.graph_module.code
    exported = program.module()
    x = rand(3, 14, 32, seed=31)
    out = exported(x)
    torch.testing.assert_close(out, model(x), rtol=0, atol=0)
    # the exported program is differentiable through flashc::fwd's registered autograd
    out.square().sum().backward()
    model(x).square().sum().backward()
    grads = dict(exported.named_parameters())
    for name, p in model.named_parameters():
        assert grads[name].grad is not None, name
        torch.testing.assert_close(grads[name].grad, p.grad, rtol=1e-5, atol=1e-6)
