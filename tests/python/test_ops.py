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
- the prepared calls of flash_attn_func and flash_attn_with_kvcache (interface._prepared,
  CPU and CUDA tensors): a repeated signature skips the op's function and gives its results
  bit for bit; what a signature tells apart; the calls never prepared; a CUDA graph
  capturing a prepared call.
- torch.export.export (strict and not) of a small module that calls flash_attn_func,
  flash_attn_qkvpacked_func, flashc.v3.flash_attn_func or FA3's private
  _flash_attn_forward, with a dynamic batch and sequence length: the graph calls flashc::fwd
  (flashc::v3_fwd for the private op), the exported program's output on other shapes and
  its parameters' gradients against eager.

Run:  FLASHC_LIBRARY=build/libflashc.so PYTHONPATH=python python3 -m pytest tests/python -q
"""
import ctypes

import pytest
import torch

import flashc
from flashc import interface, v3
from test_flashc import DEVICES, call_or_skip, cu, rand

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
    # a bf16 sink (the library reads it as it is; its gradient comes back in bf16)
    "func-bf16-sink": (lambda q, k, v, s: weighted(flashc.flash_attn_func(
        q, k, v, causal=True, learnable_sink=s)),
        lambda: batched(BATCHED[0]) + (rand(BATCHED[0][3], seed=23).bfloat16(),)),
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
@pytest.fixture(params=["fastcall", "python"])
def prepared_path(request, monkeypatch):
    """Where the prepared calls' keys and calls run: _fastcall.c (the package's module,
    interface._fast) or interface's Python (_fast None). ./test.sh requires the module
    (FLASHC_FASTCALL=1), so its cases run there."""
    if request.param == "python":
        monkeypatch.setattr(interface, "_fast", None)
    elif interface._fast is None:
        pytest.skip("the package has no _fastcall module here (./test.sh requires one)")
    else:
        monkeypatch.setattr(interface, "_fast", Replays(interface._fast))
    return request.param


class Replays:
    """_fastcall as it is, but its call must replay: None (the Python replay instead) is
    for a CUDA q whose device is not the current one only."""

    def __init__(self, fast):
        self.fast, self.key = fast, fast.key

    def call(self, entry, tensors):
        made = self.fast.call(entry, tensors)
        assert made is not None or tensors[0].is_cuda, "_fastcall.call did not replay"
        return made


def whole_way(patch):
    """Every call through the registered op: no direct call (interface._direct), so no
    prepared one either, neither in Python nor in _fastcall (which asks torch the same
    questions itself)."""
    patch.setattr(interface, "_direct", lambda args: False)
    patch.setattr(interface, "_fast", None)


@pytest.fixture
def direct_calls(prepared_path, monkeypatch):
    """Counts, per op, the calls interface._call ran directly (not through the op); no
    call prepared yet (each signature's first call runs the op's function). Each test
    that takes it runs with the prepared calls in C and in Python (prepared_path)."""
    monkeypatch.setattr(interface, "_prepared", {})
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
            whole_way(patch)
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


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lse", [False, True])
def test_kvcache_prepared(device, lse, direct_calls, monkeypatch):
    """flash_attn_with_kvcache's prepared calls (interface._prepared): the first call
    of a signature runs the op's function and is recorded; later calls with new data (q,
    caches, cache_seqlens' values) run prepared, bit for bit what the op gives, caches
    updated and their versions moved; on the CPU, a bad cache_seqlens value fails
    prepared as it fails the whole way (CUDA clamps it). Another option is another
    signature, and so is a bf16 sink (each call casts its values, new ones each call
    here); a last stride of 2 and an int cache_seqlens are never prepared."""
    dt = torch.bfloat16 if device == "cuda" else torch.float32  # (CUDA: 16-bit only)
    angle = rand(10, 4, seed=43).to(device, dt)
    kw = dict(rotary_cos=angle.cos(), rotary_sin=angle.sin(), causal=True,
              return_softmax_lse=lse)

    def args_on(*a, **over):
        return {n: t.to(device, dt if t.is_floating_point() else t.dtype)
                if isinstance(t, torch.Tensor) else t for n, t in kv_args(*a, **over).items()}

    def rand_on(*a, **k):
        return rand(*a, **k).to(device, dt)

    def run(args, **more):
        a = dict(args, k_cache=args["k_cache"].clone(), v_cache=args["v_cache"].clone())
        versions = [a[n]._version for n in ("k_cache", "v_cache")]
        got = flashc.flash_attn_with_kvcache(**a, **kw, **more)
        assert all(a[n]._version > v for n, v in zip(("k_cache", "v_cache"), versions))
        return (got if lse else (got,)) + (a["k_cache"], a["v_cache"])

    def via_op(args, **more):
        with monkeypatch.context() as patch:
            whole_way(patch)
            return run(args, **more)

    op = interface._fwd_kvcache
    for seed, seqlens in [(60, [3, 6]), (70, [5, 0]), (80, [8, 1])]:
        args = args_on(seed, seqlens)
        want = via_op(args)
        got = run(args)
        assert direct_calls[op] == 1 and len(interface._prepared) == 1
        assert len(got) == len(want) and all(torch.equal(g, w) for g, w in zip(got, want))
    args = args_on(85, [1, 4])  # return_softmax_lse is part of the signature
    other = flashc.flash_attn_with_kvcache(**args, **dict(kw, return_softmax_lse=not lse))
    assert isinstance(other, tuple) != lse and direct_calls[op] == 2
    want = flashc.flash_attn_with_kvcache(**args_on(85, [1, 4]), **kw)
    assert torch.equal(want[0] if lse else want, other if lse else other[0])
    interface._prepared.clear()
    direct_calls[op] = 0
    run(args_on(60, [3, 6]))
    bad = args_on(90, [9, 0])  # 9 + 2 appended rows > the cache's 10
    for calls in (1, 2) if device == "cpu" else ():  # the whole way, then prepared
        with pytest.raises(flashc.FlashcArgumentError) as whole:
            via_op(bad)
        with pytest.raises(flashc.FlashcArgumentError) as prepared:
            run(bad)
        assert str(whole.value) == str(prepared.value) and "k_new" not in str(whole.value)
        kept = dict(bad, k_cache=bad["k_cache"].clone(), v_cache=bad["v_cache"].clone())
        with pytest.raises(flashc.FlashcArgumentError):
            flashc.flash_attn_with_kvcache(**kept, **kw)  # a failed call writes nothing
        assert torch.equal(kept["k_cache"], bad["k_cache"])
        assert torch.equal(kept["v_cache"], bad["v_cache"])
    assert direct_calls[op] == 1
    for seed in (100, 110):  # another option: its own signature, prepared from its second
        args = args_on(seed, [2, 2])
        assert all(torch.equal(g, w) for g, w in zip(run(args, softcap=3.0),
                                                     via_op(args, softcap=3.0)))
    assert direct_calls[op] == 2 and len(interface._prepared) == 2
    for seed in (120, 122, 124):
        args, sink = args_on(seed, [3, 6]), rand_on(4, seed=seed + 1).bfloat16()
        got, want = run(args, learnable_sink=sink), via_op(args, learnable_sink=sink)
        assert all(torch.equal(g, w) for g, w in zip(got, want)), seed
    assert direct_calls[op] == 3 and len(interface._prepared) == 3
    never = [dict(q=rand_on(2, 2, 4, 32, seed=121)[..., ::2]), dict(cache_seqlens=3)]
    for over in never:
        args = args_on(130, [3, 6], **over)
        for _ in range(2):
            calls = direct_calls[op]
            got, want = run(args), via_op(args)
            assert direct_calls[op] == calls + 1
            assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert len(interface._prepared) == 3


def test_kvcache_prepared_keys(direct_calls):
    """What a prepared signature tells apart: an option's type (window_size (True, -1),
    (1.0, -1) fail as they fail the whole way after (1, -1) ran), an option that is a
    tensor (never prepared: its value can change in place), and a 0-dim cache_seqlens
    (prepared: a tensor like any other)."""
    call = flashc.flash_attn_with_kvcache
    call(**kv_args(150, [3, 6]), window_size=(1, -1))
    assert len(interface._prepared) == 1
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

    def outcome(**kw):  # the result, or the error's type and message
        try:
            return call(**kv_args(153, [3, 6]), **kw)
        except Exception as e:
            return type(e), str(e)

    def same_outcome(a, b):
        return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b

    # an int past 64 bits after its low bits' value ran, -0.0 after 0.0: what the op gives
    for first, then in (((1, -1), (2 ** 64 + 1, -1)), ((1, -1), (1, 2 ** 64 - 1))):
        for _ in range(2):
            outcome(window_size=first)
        with pytest.MonkeyPatch.context() as patch:
            whole_way(patch)
            want = outcome(window_size=then)
        assert same_outcome(outcome(window_size=then), want), then
    for _ in range(2):
        outcome(softmax_scale=0.0)
    with pytest.MonkeyPatch.context() as patch:
        whole_way(patch)
        want = outcome(softmax_scale=-0.0)
    assert same_outcome(outcome(softmax_scale=-0.0), want)


# ---- flash_attn_func's prepared calls ----
def func_inputs(seed, device, dtype, b=2, sq=3, sk=5, h=4, hk=2, d=40, dv=None, alibi=None,
                sink=None):
    """Fresh flash_attn_func inputs of seed on device: (q, k, v) of dtype (v's head dim dv,
    default d) and {alibi_slopes: fp32 (nheads,) for alibi "h", (batch, nheads) for "bh",
    else None; learnable_sink: (nheads,) of dtype sink (True: fp32) where given, else
    None}."""
    q = rand(b, sq, h, d, device=device, dtype=dtype, seed=seed)
    k = rand(b, sk, hk, d, device=device, dtype=dtype, seed=seed + 1)
    v = rand(b, sk, hk, dv or d, device=device, dtype=dtype, seed=seed + 2)
    slopes = None if alibi is None else \
        rand(*((h,) if alibi == "h" else (b, h)), device=device, seed=seed + 3).abs()
    return (q, k, v), dict(alibi_slopes=slopes,
                           learnable_sink=None if sink is None else
                           rand(h, device=device, seed=seed + 4).to(
                               torch.float32 if sink is True else sink))


def func_dtype(name, device):
    """bf16 for "bf16"; for "other" fp32 on the CPU and fp16 on CUDA."""
    return torch.bfloat16 if name == "bf16" else \
        torch.float32 if device == "cpu" else torch.float16


def func_via_op(monkeypatch, *args, **kw):
    """flashc.flash_attn_func(*args, **kw) through the registered op (interface._direct off):
    no signature, nothing prepared or recorded; the reference of the prepared calls."""
    with monkeypatch.context() as patch:
        whole_way(patch)
        return flashc.flash_attn_func(*args, **kw)


def as_tuple(result):
    return result if isinstance(result, tuple) else (result,)


def same(got, want):
    """got and want (an output or a tuple of them) are equal bit for bit, tensor for tensor."""
    got, want = as_tuple(got), as_tuple(want)
    return len(got) == len(want) and all(torch.equal(g, w) for g, w in zip(got, want))


# name -> (func_inputs' shape arguments, flash_attn_func's options, func_dtype's name):
# GQA and MQA, seqlen_q <, = and > seqlen_k (decode), head dims 40, 72 and 16 (v's 24),
# ALiBi (nheads,) and (batch, nheads), a learnable sink in fp32, bf16 and fp16 (the
# library reads each as it is), causal, windows, softcap, a given softmax_scale
FUNC_PREPARED = {
    "causal-gqa-d40": (dict(sq=3, sk=5, d=40), dict(causal=True), "bf16"),
    "window-softcap-alibi-mqa-d72": (dict(sq=6, sk=4, hk=1, d=72, alibi="h"),
                                     dict(window_size=(3, 1), softcap=3.0), "other"),
    "alibi-bh-sink-scale-dv": (dict(sq=4, sk=4, hk=4, d=16, dv=24, alibi="bh", sink=True),
                               dict(softmax_scale=0.3, causal=True, window_size=(1, -1)),
                               "other"),
    "decode-sink-softcap": (dict(b=1, sq=1, sk=9, h=2, hk=2, sink=True), dict(softcap=2.0),
                            "bf16"),
    "decode-bf16-sink": (dict(b=1, sq=1, sk=9, h=8, hk=2, sink=torch.bfloat16), {}, "bf16"),
    "causal-fp16-sink": (dict(sq=3, sk=5, sink=torch.float16), dict(causal=True), "other"),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("probs", [False, True], ids=["out", "probs"])
@pytest.mark.parametrize("case", FUNC_PREPARED)
def test_func_prepared(device, probs, case, direct_calls, monkeypatch):
    """flash_attn_func's prepared calls (interface._prepared): the first call of a
    signature runs the op's function and is recorded; later calls with fresh tensors of
    the same shapes (q, k, v, alibi_slopes and the sink all new) do not, and give the
    op's results bit for bit: out, and with return_attn_probs softmax_lse and probs (fp32
    [B, H, Sq, Sk] on the CPU, empty on CUDA without dropout). Each call's outputs are new
    tensors that follow its inputs (none stale from an earlier call) and that no later
    call overwrites."""
    shapes, options, dtype = FUNC_PREPARED[case]
    dtype = func_dtype(dtype, device)
    kw = dict(options, return_attn_probs=probs)
    op = interface._fwd
    results = []  # (inputs, got, want) of each call, all kept alive
    for n, seed in enumerate((500, 510, 520)):
        (q, k, v), tensors = func_inputs(seed, device, dtype, **shapes)
        got = flashc.flash_attn_func(q, k, v, **kw, **tensors)
        assert direct_calls[op] == 1 and len(interface._prepared) == 1, n
        want = func_via_op(monkeypatch, q, k, v, **kw, **tensors)
        assert same(got, want), n
        got = as_tuple(got)
        b, sq, h, _ = q.shape
        shapes_want = [((b, sq, h, v.shape[-1]), dtype), ((b, h, sq), torch.float32),
                       ((b, h, sq, k.shape[1]) if device == "cpu" else (0,), torch.float32)]
        assert [(tuple(t.shape), t.dtype) for t in got] == shapes_want[:len(got)]
        assert all(t.device == q.device for t in got) and not got[0].isnan().any()
        for _, earlier, _ in results:  # new data, new results
            assert all(not torch.equal(g, e) for g, e in zip(got, earlier) if g.numel())
        results.append(((q, k, v, tensors), got, want))
    for _, got, want in results:  # no later call wrote into an earlier call's outputs
        assert same(got, want)


def test_prepared_sink_dtypes(direct_calls, monkeypatch):
    """A bf16 or fp16 sink reaches the library as it is, on the whole way and prepared (no
    cast: Tensor.float is never called); an fp64 sink, which the whole way casts to fp32,
    is never prepared, and gives the op's results."""
    made, cast = [], torch.Tensor.float

    def spy(self, *args, **kw):
        made.append(self.dtype)
        return cast(self, *args, **kw)
    for n, dtype in enumerate((torch.bfloat16, torch.float16, torch.float64)):
        (q, k, v), tensors = func_inputs(700 + 10 * n, "cpu", torch.bfloat16, sink=dtype)
        with monkeypatch.context() as patch:
            patch.setattr(torch.Tensor, "float", spy)
            got = [flashc.flash_attn_func(q, k, v, **tensors) for _ in range(3)]
        want = func_via_op(monkeypatch, q, k, v, **tensors)
        assert all(torch.equal(g, want) for g in got), dtype
        assert direct_calls[interface._fwd] == (1, 2, 5)[n], dtype  # fp64: every call
        assert len(interface._prepared) == (1, 2, 2)[n], dtype
    assert made == [torch.float64] * 3  # the fp64 sink's casts on the whole way


@pytest.mark.parametrize("device", DEVICES)
def test_func_not_prepared(device, direct_calls, monkeypatch):
    """Calls that go the whole way every time (the op's function runs, nothing is
    recorded) though a plain call of the same shapes is prepared, with the results of the
    op: dropout (reproducible with torch.manual_seed), q with a last stride of 2 (copied
    on the way), softcap given as a tensor (its value can change in place), a call
    without keys (answered without the library), and the packed functions. Their results are the op's bit for bit."""
    dtype = func_dtype("other", device)
    shapes = dict(sq=5, sk=5, h=4, hk=4, d=16)
    (q, k, v), _ = func_inputs(600, device, dtype, **shapes)
    flashc.flash_attn_func(q, k, v)
    plain = flashc.flash_attn_func(q, k, v)
    assert direct_calls[interface._fwd] == 1 and len(interface._prepared) == 1
    wide = rand(2, 5, 4, 32, device=device, dtype=dtype, seed=601)[..., ::2]
    cap = torch.tensor(1.0, device="cpu")
    no_keys = (q, k[:, :0], v[:, :0])
    func = flashc.flash_attn_func
    cases = {
        "dropout": (func, (q, k, v), dict(dropout_p=0.25, return_attn_probs=True)),
        "dropout-0.5": (func, (q, k, v), dict(dropout_p=0.5)),
        "q-last-stride-2": (func, (wide, k, v), {}),
        "softcap-tensor": (func, (q, k, v), dict(softcap=cap)),
        "no-keys": (func, no_keys, dict(return_attn_probs=True)),
        "qkvpacked": (flashc.flash_attn_qkvpacked_func, (torch.stack((q, k, v), 2),), {}),
        "kvpacked": (flashc.flash_attn_kvpacked_func, (q, torch.stack((k, v), 2)), {}),
    }
    for name, (fn, args, kw) in list(cases.items()):
        outs = []
        for _ in range(2):
            calls = direct_calls[interface._fwd]
            torch.manual_seed(7)
            try:
                got = fn(*args, **kw)
            except (TypeError, RuntimeError) as e:  # an option the API does not take
                assert name == "softcap-tensor", (name, e)
                del cases[name]
                break
            assert direct_calls[interface._fwd] == calls + 1, name
            assert len(interface._prepared) == 1, name
            with monkeypatch.context() as patch:
                whole_way(patch)
                torch.manual_seed(7)
                assert same(got, fn(*args, **kw)), name
            outs.append(got)
        assert not outs or same(outs[0], outs[1]), name  # dropout: torch.manual_seed's mask
    assert not same(func(q, k, v, dropout_p=0.25), plain)
    assert torch.equal(func(wide, k, v), func(wide.contiguous(), k, v))
    assert torch.equal(func(*no_keys), torch.zeros_like(q))
    if "softcap-tensor" in cases:  # taken: the tensor's value when called is used
        cap.fill_(50.0)
        assert torch.equal(func(q, k, v, softcap=cap), func(q, k, v, softcap=50.0))
        assert not torch.equal(func(q, k, v, softcap=cap), func(q, k, v, softcap=1.0))


@pytest.mark.parametrize("device", DEVICES)
def test_prepared_passes_what_is_returned(device, direct_calls, monkeypatch):
    """A prepared call gives the library the tensors it passes and the outputs it returns,
    nothing else: the recording takes the struct the op's own call filled (_built), where
    softmax_lse was set though the caller did not ask for it, and drops it. So a prepared
    flash_attn_func (or KV-cache call) without lse hands the library no lse at all (a
    stale one would be the first call's tensor, freed since), one with lse the tensor it
    returns."""
    seen = []
    real = interface._lib.call

    def look(args):
        seen.append((args.out.data, args.softmax_lse.data or 0, args.softmax_lse.ndim))

    def spy(entry, args, params, device, rename=None):
        look(args)
        return real(entry, args, params, device, rename)

    monkeypatch.setattr(interface._lib, "call", spy)
    # _fastcall calls the entry point at the address a recording gives it: a recording
    # gives it a ctypes function that looks, then calls the library's
    real_address, hooks = interface._lib.address, []

    def address(entry):
        fn, size_fn = real_address(entry)
        proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(interface._lib.ENTRY_POINTS[entry]),
                                 ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
        target = proto(fn)

        def hook(args, params, workspace, size):
            look(args.contents)
            return target(args, params, workspace, size)
        hooks.append(proto(hook))  # alive as long as the test
        return ctypes.cast(hooks[-1], ctypes.c_void_p).value, size_fn

    monkeypatch.setattr(interface._lib, "address", address)
    dtype = func_dtype("other", device)
    for lse in (False, True):
        seen.clear()
        for seed in (900, 901, 902):
            (q, k, v), _ = func_inputs(seed, device, dtype, d=16)
            got = as_tuple(flashc.flash_attn_func(q, k, v, return_attn_probs=lse))
            out, lse_data, lse_ndim = seen[-1]
            assert out == got[0].data_ptr()
            if seed == 900:  # the whole way: the op fills lse, returned or not
                assert lse_data != 0 and lse_ndim == 3
            else:
                assert (lse_data, lse_ndim) == ((got[1].data_ptr(), 3) if lse else (0, 0)), seed
        args = kv_args(903, [3, 6])
        for n in range(3):
            got = as_tuple(flashc.flash_attn_with_kvcache(**dict(
                args, k_cache=args["k_cache"].clone(), v_cache=args["v_cache"].clone()),
                return_softmax_lse=lse))
            out, lse_data, lse_ndim = seen[-1]
            assert out == got[0].data_ptr()
            if n:  # prepared (lse (2, 4, 2) when returned)
                assert (lse_data, lse_ndim) == ((got[1].data_ptr(), 3) if lse else (0, 0)), n
    assert direct_calls[interface._fwd] == 2 and direct_calls[interface._fwd_kvcache] == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fastcall_device_not_current(direct_calls, prepared_path, monkeypatch):
    """_fastcall's call answers None where q's CUDA device is not the current one, before
    it does anything, and the Python replay (which switches to the device) runs instead:
    one library call through _lib.call, the op's result bit for bit."""
    if prepared_path != "fastcall":
        pytest.skip("_fastcall's case")
    fast, setup = interface._fast.fast, list(interface._FAST_SETUP)
    (q, k, v), _ = func_inputs(1100, "cuda", torch.float16, d=16)
    for _ in range(2):
        want = flashc.flash_attn_func(q, k, v)
    calls, real = [], interface._lib.call
    monkeypatch.setattr(interface._lib, "call", lambda *a: calls.append(a[0]) or real(*a))
    setup[6] = lambda: q.get_device() + 1  # another device is current
    fast.setup(*setup)
    try:
        got = flashc.flash_attn_func(q, k, v)
    finally:
        fast.setup(*interface._FAST_SETUP)
    assert calls == ["flashc_fwd"] and torch.equal(got, want)
    assert direct_calls[interface._fwd] == 1  # prepared, not the whole way


def test_prepared_in_threads(direct_calls, monkeypatch):
    """Two threads whose first calls (of two signatures) are inside the library at the
    same time, each having filled its struct before the other records: each records its
    own call (_built is per thread), and every later, prepared, call gives the op's
    result bit for bit."""
    import threading
    together = threading.Barrier(2, timeout=30)
    first = threading.local()
    real = interface._lib.call

    def meet(entry, args, params, device, rename=None):
        if not getattr(first, "met", False):
            first.met = True
            together.wait()
        return real(entry, args, params, device, rename)

    monkeypatch.setattr(interface._lib, "call", meet)
    errors = []

    def worker(d):
        try:
            for seed in range(6):
                (q, k, v), _ = func_inputs(1000 + seed, "cpu", torch.float32, d=d)
                got = flashc.flash_attn_func(q, k, v)
                want = interface._fwd(q, k, v, None, 0.0, None, False, -1, -1, 0.0, False,
                                      0, 0)[0]  # the op, through torch's dispatcher
                assert torch.equal(got, want), (d, seed)
        except Exception as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(d,)) for d in (16, 24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(interface._prepared) == 2 and direct_calls[interface._fwd] == 2


@pytest.mark.parametrize("device", DEVICES)
def test_func_prepared_not_with_autograd(device, direct_calls, monkeypatch):
    """Once plain tensors of these shapes are prepared, q (or an fp32 learnable sink)
    that requires grad under grad mode still goes through the op and its autograd: the
    output has a grad_fn and the gradients are those of a call with no table; under
    no_grad the same tensors run prepared."""
    dtype = func_dtype("other", device)
    shapes = dict(sq=4, sk=6, d=16, sink=True)
    (q, k, v), tensors = func_inputs(700, device, dtype, **shapes)
    flashc.flash_attn_func(q, k, v, causal=True, **tensors)
    assert direct_calls[interface._fwd] == 1 and len(interface._prepared) == 1
    (q, k, v), tensors = func_inputs(710, device, dtype, **shapes)
    sink = tensors["learnable_sink"]
    dout = rand(*q.shape, device=device, dtype=dtype, seed=720)

    def grads(which):
        leaves = [t.detach().clone().requires_grad_(i == which) for i, t in
                  enumerate((q, k, v, sink))]
        out = flashc.flash_attn_func(*leaves[:3], causal=True, learnable_sink=leaves[3])
        assert out.grad_fn is not None
        return out.detach(), torch.autograd.grad(out, leaves[which], dout)[0]

    for which in (0, 3):  # q, the sink
        got = call_or_skip(lambda: grads(which), device)
        assert len(interface._prepared) == 1 and direct_calls[interface._fwd] == 1
        with monkeypatch.context() as patch:
            patch.setattr(interface, "_prepared", {})
            want = grads(which)
        assert same(got, want) and got[1].abs().sum() > 0
        with torch.no_grad():  # the same tensors requiring grad: prepared
            leaf = (q if which == 0 else sink).detach().clone().requires_grad_()
            args = (leaf, k, v, sink) if which == 0 else (q, k, v, leaf)
            again = flashc.flash_attn_func(*args[:3], causal=True, learnable_sink=args[3])
        assert direct_calls[interface._fwd] == 1 and not again.requires_grad
        assert torch.equal(again, got[0])


@pytest.mark.parametrize("device", DEVICES)
def test_func_prepared_keys(device, direct_calls, monkeypatch):
    """What a prepared signature of flash_attn_func tells apart: each option (causal,
    window_size, softmax_scale None, 0.125, 1, softcap, return_attn_probs), an option's type
    (window_size (True, -1) and (1.0, -1), softmax_scale True fail as they fail with no
    table after (1, -1) and 1 ran), q's seqlen, strides (q, k, v made (B, H, S, D) and
    transposed: the same shapes), the dtype; a call of another signature runs the op's
    function once, is correct, and is prepared from its second call. A q at another
    offset in its storage (another alignment, the same shape and strides) runs prepared."""
    op = interface._fwd
    dtype = func_dtype("other", device)

    def check(new, q, k, v, **kw):
        """flash_attn_func(q, k, v, **kw) against the op; new: whether it is a new
        signature (None: either)."""
        calls, size = direct_calls[op], len(interface._prepared)
        got = flashc.flash_attn_func(q, k, v, **kw)
        assert new is None or (direct_calls[op] - calls, len(interface._prepared) - size) == \
            (int(new), int(new)), kw
        assert same(got, func_via_op(monkeypatch, q, k, v, **kw)), kw
        return got

    def fresh(seed, dtype=dtype, **over):
        return func_inputs(seed, device, dtype, d=16, **over)[0]

    base = check(True, *fresh(800))
    assert torch.equal(check(False, *fresh(800)), base)
    for kw in (dict(causal=True), dict(window_size=(1, -1)), dict(softmax_scale=0.125),
               dict(softmax_scale=1), dict(softcap=2.0), dict(return_attn_probs=True)):
        first = check(True, *fresh(800), **kw)
        assert not same(first, base), kw
        assert torch.equal(as_tuple(check(False, *fresh(800), **kw))[0], as_tuple(first)[0])
        assert not torch.equal(as_tuple(check(False, *fresh(801), **kw))[0], as_tuple(first)[0])
    check(None, *fresh(800), softmax_scale=1.0)
    check(None, *fresh(800), dropout_p=0)
    check(None, *fresh(800), deterministic=True)
    for kw in (dict(window_size=(True, -1)), dict(window_size=(1.0, -1)),
               dict(window_size=(1, -1.0)), dict(softmax_scale=True)):
        with monkeypatch.context() as patch:
            patch.setattr(interface, "_prepared", {})
            with pytest.raises(flashc.FlashcArgumentError) as whole:
                flashc.flash_attn_func(*fresh(800), **kw)
        calls, size = direct_calls[op], len(interface._prepared)
        with pytest.raises(flashc.FlashcArgumentError) as prepared:
            flashc.flash_attn_func(*fresh(800), **kw)
        assert str(prepared.value) == str(whole.value), kw
        assert (direct_calls[op], len(interface._prepared)) == (calls, size), kw
    check(True, *fresh(810, sq=4))  # another seqlen_q
    check(False, *fresh(811, sq=4))

    def transposed(seed):  # (B, H, S, D) made, seen as (B, S, H, D)
        return [t.transpose(1, 2).contiguous().transpose(1, 2) for t in fresh(seed)]

    t = transposed(820)
    assert t[0].shape == fresh(800)[0].shape and t[0].stride() != fresh(800)[0].stride()
    check(True, *t)
    check(False, *transposed(821))
    check(True, *fresh(830, dtype=torch.bfloat16))
    check(False, *fresh(831, dtype=torch.bfloat16))
    q, k, v = fresh(840)
    buffer = torch.empty(q.numel() + 1, device=device, dtype=dtype)
    shifted = buffer[1:].view(q.shape)  # one element past the storage's start
    shifted.copy_(q)
    assert shifted.stride() == q.stride() and shifted.storage_offset() == 1
    check(False, shifted, k, v)


def test_func_prepared_table_full(direct_calls, monkeypatch):
    """The table of prepared calls is emptied when full (interface._PREPARED_MAX): the
    calls after stay correct, and a signature dropped goes the whole way again."""
    monkeypatch.setattr(interface, "_PREPARED_MAX", 2)
    op = interface._fwd
    for n, sq in enumerate((1, 2, 3, 1)):
        for seed in (900, 901):
            q, k, v = func_inputs(seed + sq, "cpu", torch.float32, sq=sq, d=8)[0]
            assert torch.equal(flashc.flash_attn_func(q, k, v),
                               func_via_op(monkeypatch, q, k, v))
        assert direct_calls[op] == n + 1 and len(interface._prepared) == (1, 2, 1, 2)[n]


@pytest.mark.parametrize("device", DEVICES)
def test_func_prepared_rejected(device, direct_calls, monkeypatch):
    """A call the library rejects is never recorded, and raises the same error every time:
    alibi_slopes of the wrong length, KV heads that do not divide q's. (Every check the
    library makes on a flash_attn_func call is on what its signature holds, the tensors'
    shapes, strides, dtypes and devices and the options, none on the tensors' values: no
    input of a prepared signature can fail at call time, so none is tested here.)"""
    (q, k, v), _ = func_inputs(950, device, func_dtype("other", device), d=16)
    flashc.flash_attn_func(q, k, v)
    calls = direct_calls[interface._fwd]
    heads3 = [t[:, :, :1].repeat(1, 1, 3, 1) for t in (k, v)]
    for over in (dict(alibi_slopes=rand(5, device=device, seed=951)),
                 dict(k=heads3[0], v=heads3[1])):
        args = dict(dict(q=q, k=k, v=v), **over)
        errors = []
        for _ in range(2):
            with pytest.raises(flashc.FlashcArgumentError) as e:
                flashc.flash_attn_func(**args)
            errors.append(str(e.value))
            calls += 1
            assert direct_calls[interface._fwd] == calls and len(interface._prepared) == 1
        assert errors[0] == errors[1]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_func_prepared_devices(direct_calls, monkeypatch):
    """A signature is a device's: the same shapes on the CPU and CUDA are two, each
    correct; once every tensor on CUDA is prepared, k, v, alibi_slopes or the sink on
    the CPU (q on CUDA) is never prepared and fails as it fails with no table."""
    op = interface._fwd
    for device in ("cpu", "cuda", "cpu", "cuda"):
        (q, k, v), tensors = func_inputs(960, device, torch.bfloat16, d=16, alibi="h",
                                         sink=True)
        got = flashc.flash_attn_func(q, k, v, **tensors)
        assert torch.equal(got, func_via_op(monkeypatch, q, k, v, **tensors))
    assert direct_calls[op] == 2 and len(interface._prepared) == 2
    for name in ("k", "v", "alibi_slopes", "learnable_sink"):
        (q, k, v), tensors = func_inputs(970, "cuda", torch.bfloat16, d=16, alibi="h",
                                         sink=True)
        args = dict(tensors, q=q, k=k, v=v)
        args[name] = args[name].cpu()
        with monkeypatch.context() as patch:
            patch.setattr(interface, "_prepared", {})
            with pytest.raises(flashc.FlashcError) as whole:
                flashc.flash_attn_func(**args)
        with pytest.raises(flashc.FlashcError) as prepared:
            flashc.flash_attn_func(**args)
        assert str(prepared.value) == str(whole.value), name
        assert len(interface._prepared) == 2, name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_func_prepared_cuda_graph(direct_calls, monkeypatch):
    """A prepared call runs on torch's current stream, not on the stream of the call that
    recorded it: recorded on the default stream, then captured in a CUDA graph (whose
    capture a launch on another stream breaks), it replays with new inputs written in
    place and gives the op's results."""
    def inputs(seed):
        (q, k, v), tensors = func_inputs(seed, "cuda", torch.bfloat16, sq=5, sk=7, d=64,
                                         alibi="h", sink=True)
        return [q, k, v, tensors["alibi_slopes"], tensors["learnable_sink"]]

    static = inputs(980)

    def call(q, k, v, alibi, sink):
        return flashc.flash_attn_func(q, k, v, causal=True, alibi_slopes=alibi,
                                      return_attn_probs=True, learnable_sink=sink)

    call(*static)  # recorded, on the default stream
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = call(*static)  # prepared
    assert direct_calls[interface._fwd] == 1 and len(interface._prepared) == 1
    for seed in (981, 982):
        for t, new in zip(static, inputs(seed)):
            t.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        with monkeypatch.context() as patch:
            whole_way(patch)
            assert same(captured, call(*static)), seed


@pytest.mark.parametrize("device", DEVICES)
def test_direct_not_with_neg_view(device, direct_calls):
    """A tensor with torch's lazy negation bit (torch._neg_view: memory holds x, the
    tensor is -x) goes through the op, whose dispatch makes it real: the result is that
    of -x, on the first call and on a repeated one (never prepared)."""
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    q, k, v = (rand(1, 5, 2, 16, seed=s).to(device, dt) for s in (170, 171, 172))
    want = flashc.flash_attn_func(-q, k, v)
    calls = direct_calls[interface._fwd]
    for _ in range(2):
        assert torch.equal(flashc.flash_attn_func(torch._neg_view(q), k, v), want)
    assert direct_calls[interface._fwd] == calls


def test_direct_truthy_causal(direct_calls):
    """causal is taken by its truth value, as the op's schema (bool) and flash_attn take it:
    0.5, 2 and -1 are causal, None and 0.0 are not, directly and prepared (the direct call
    had passed int(causal): 0.5 ran without the mask, 2 was refused)."""
    q, k, v = (rand(1, 7, 2, 16, seed=s) for s in (180, 181, 182))
    for value in (0.5, 2, -1, None, 0.0):
        want = flashc.flash_attn_func(q, k, v, causal=bool(value))
        for _ in range(2):  # the whole way, then prepared
            assert torch.equal(flashc.flash_attn_func(q, k, v, causal=value), want), value


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


def test_direct_parameter(direct_calls, monkeypatch):
    """nn.Parameter arguments (a model's fp32 learnable_sink or alibi_slopes, a frozen
    cache) are plain tensors to the direct call: where autograd records nothing (no_grad,
    or requires_grad False) they run directly and, repeated, prepared, with the results of
    plain tensors through the op bit for bit. A sink that requires grad under grad mode
    goes through the op and gets its gradient; a subclass of nn.Parameter goes through
    the op, neither direct nor prepared."""
    Parameter = torch.nn.Parameter
    q, k, v = batched(BATCHED[0])
    h = q.shape[2]
    sink, slopes = rand(h, seed=190), rand(h, seed=191).abs()
    kv_plain, make = kvcache_case(paged=True, sink=sink)
    kv_param = kvcache_case(paged=True, sink=Parameter(sink))[0]
    cases = {  # name -> (the call with Parameters, the same with plain tensors, op, grad mode)
        "sink-no-grad": (lambda: flashc.flash_attn_func(q, k, v, causal=True,
                                                        learnable_sink=Parameter(sink)),
                         lambda: flashc.flash_attn_func(q, k, v, causal=True,
                                                        learnable_sink=sink),
                         interface._fwd, False),
        "alibi-frozen": (lambda: flashc.flash_attn_func(
                             q, k, v, alibi_slopes=Parameter(slopes, requires_grad=False)),
                         lambda: flashc.flash_attn_func(q, k, v, alibi_slopes=slopes),
                         interface._fwd, True),
        "kvcache-sink-no-grad": (
            lambda: kv_param(*(Parameter(c, requires_grad=False) for c in make())),
            lambda: kv_plain(*make()), interface._fwd_kvcache, False),
        "q-frozen": (lambda: flashc.flash_attn_func(Parameter(q, requires_grad=False), k, v),
                     lambda: flashc.flash_attn_func(q, k, v), interface._fwd, True),
    }
    for name, (with_params, plain, op, grad) in cases.items():
        with monkeypatch.context() as patch:
            whole_way(patch)
            want = plain()
        prepared = len(interface._prepared)
        for n in range(2):  # the whole way, then prepared
            calls = direct_calls[op]
            with torch.set_grad_enabled(grad):
                got = with_params()
            assert direct_calls[op] == calls + 1 - n, (name, n)
            assert len(interface._prepared) == prepared + 1, name
            assert same(got, want), (name, n)
    plain_out = flashc.flash_attn_func(q, k, v, learnable_sink=sink)
    calls = direct_calls[interface._fwd]
    trained = Parameter(sink.clone())
    out = flashc.flash_attn_func(q, k, v, learnable_sink=trained)
    assert direct_calls[interface._fwd] == calls and out.grad_fn is not None
    out.sum().backward()
    assert trained.grad.abs().sum() > 0 and torch.equal(out.detach(), plain_out)

    class Sub(Parameter):
        pass
    prepared = len(interface._prepared)
    with torch.no_grad():  # (options of their own: no signature prepared by a plain call)
        got = [flashc.flash_attn_func(q, k, v, window_size=(2, 0), learnable_sink=Sub(sink))
               for _ in range(2)]
    assert direct_calls[interface._fwd] == calls and len(interface._prepared) == prepared
    want = func_via_op(monkeypatch, q, k, v, window_size=(2, 0), learnable_sink=sink)
    assert all(torch.equal(g, want) for g in got)


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
    for _ in range(2):  # each signature prepared: a mode, a subclass, meta must still not
        flashc.flash_attn_func(q, k, v)  # take the prepared call
        call(*make())
    assert len(interface._prepared) == 2
    before = dict(direct_calls)
    traced = torch.jit.trace(lambda x: flashc.flash_attn_func(x, k, v), (q,), check_trace=False)
    assert "flashc::fwd" in str(traced.graph)  # (a prepared call would leave it out)
    qs = torch.stack([q, -q])
    mapped = torch.func.vmap(lambda x: flashc.flash_attn_func(x, k, v))(qs)
    assert torch.equal(mapped, torch.stack([flashc.flash_attn_func(x, k, v) for x in qs]))
    for mode in (DispatchRecord, FunctionRecord):
        with mode():
            flashc.flash_attn_func(q, k, v)
            call(*make())
        assert seen.count("flashc.fwd.default") == seen.count("flashc.fwd_kvcache.default") \
            == 1, (mode, seen)
        seen.clear()
    assert type(flashc.flash_attn_func(q.as_subclass(Recorded), k, v)) is Recorded
    assert type(flashc.flash_attn_func(q, k.as_subclass(Recorded), v)) is Recorded
    assert seen.count("flashc.fwd.default") == 2, seen
    with FakeTensorMode():
        fake = flashc.flash_attn_func(*(torch.empty(t.shape) for t in (q, k, v)))
    meta = flashc.flash_attn_func(*(t.to("meta") for t in (q, k, v)))
    assert fake.shape == meta.shape == q.shape and meta.is_meta
    assert type(fake).__name__ == "FakeTensor"
    assert direct_calls == before


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
