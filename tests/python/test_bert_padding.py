"""test_bert_padding.py : flashc.bert_padding's first-axis helpers (index_first_axis,
index_put_first_axis, index_first_axis_residual and their autograd Functions) and
unpad_input_for_concatenated_sequences, against plain torch indexing, gradients included;
unpad_input and pad_input are tested in test_flashc.py.

Run:  FLASHC_LIBRARY=build/libflashc.so PYTHONPATH=python python3 -m pytest tests/python -q
"""
import pytest
import torch

import flashc
from flashc import bert_padding as bp
from test_flashc import DEVICES, check, rand, ref_attention

SHAPES = [(9,), (9, 5), (9, 3, 4)]


def rows(device, dtype=torch.int64):
    """Distinct rows of a first axis of 9, out of order."""
    return torch.tensor([7, 0, 3, 8, 4], dtype=dtype, device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32], ids=["i64", "i32"])
def test_index_first_axis(device, shape, index_dtype):
    idx = rows(device, index_dtype)
    x = rand(*shape, device=device, seed=1).requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    out = bp.index_first_axis(x, idx)
    ref = x_ref[idx.long()]
    assert torch.equal(out, ref)
    dout = rand(*out.shape, device=device, seed=2)
    out.backward(dout)
    ref.backward(dout)
    assert torch.equal(x.grad, x_ref.grad)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32], ids=["i64", "i32"])
def test_index_put_first_axis(device, shape, index_dtype):
    idx = rows(device, index_dtype)
    values = rand(len(idx), *shape[1:], device=device, seed=3).requires_grad_()
    out = bp.index_put_first_axis(values, idx, shape[0])
    ref = torch.zeros(shape, device=device)
    ref[idx.long()] = values.detach()
    assert torch.equal(out, ref)
    dout = rand(*shape, device=device, seed=4)
    out.backward(dout)
    assert torch.equal(values.grad, dout[idx.long()])


def test_index_first_axis_repeated_rows():
    """A row named twice gets both gradients, as with torch's indexing."""
    x = rand(6, 4, seed=5).requires_grad_()
    idx = torch.tensor([2, 5, 2])
    bp.index_first_axis(x, idx).backward(torch.ones(3, 4))
    assert x.grad[:, 0].tolist() == [0, 0, 2, 0, 0, 1]


@pytest.mark.parametrize("device", DEVICES)
def test_index_first_axis_residual(device):
    """(input[indices], input) with the gradients of both outputs reaching input."""
    idx = rows(device)
    x = rand(9, 3, device=device, seed=6).requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    out, residual = bp.index_first_axis_residual(x, idx)
    assert torch.equal(out, x_ref[idx].detach()) and torch.equal(residual, x.detach())
    a, b = rand(5, 3, device=device, seed=7), rand(9, 3, device=device, seed=8)
    ((out * a).sum() + (residual * b).sum()).backward()
    ((x_ref[idx] * a).sum() + (x_ref * b).sum()).backward()
    assert torch.allclose(x.grad, x_ref.grad, rtol=0, atol=1e-6)


def test_functions_are_flash_attns():
    """The callables are the autograd Functions' apply, as flash_attn binds them."""
    for fn, cls in ((bp.index_first_axis, bp.IndexFirstAxis),
                    (bp.index_put_first_axis, bp.IndexPutFirstAxis),
                    (bp.index_first_axis_residual, bp.IndexFirstAxisResidual)):
        assert fn == cls.apply and issubclass(cls, torch.autograd.Function)


# ---- unpad_input_for_concatenated_sequences ----
LENGTHS = [[2, 3, 0, 0, 0, 0], [3, 2, 0, 0, 0, 0], [6, 0, 0, 0, 0, 0], [0, 1, 0, 0, 2, 0]]


@pytest.mark.parametrize("device", DEVICES)
def test_concatenated_sequences(device):
    b, s, h, d = len(LENGTHS), 6, 2, 8
    dt = torch.float32 if device == "cpu" else torch.bfloat16  # the CUDA backend's dtypes
    lengths = torch.tensor(LENGTHS, device=device)
    x = rand(b, s, h, d, device=device, dtype=dt, seed=9).requires_grad_()
    packed, idx, cu, max_seqlen = bp.unpad_input_for_concatenated_sequences(x, lengths)
    want_idx = [r * s + j for r, row in enumerate(LENGTHS) for j in range(sum(row))]
    assert idx.tolist() == want_idx
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 2, 5, 8, 10, 16, 17, 19]
    assert max_seqlen == 6 and isinstance(max_seqlen, int)
    x_ref = x.detach().clone().requires_grad_()
    ref = x_ref.reshape(b * s, h, d)[torch.tensor(want_idx, device=device)]
    assert torch.equal(packed, ref)
    dout = rand(*packed.shape, device=device, dtype=dt, seed=10)
    packed.backward(dout)
    ref.backward(dout)
    assert torch.equal(x.grad, x_ref.grad)
    # causal varlen attention over the packed samples is attention within each sample
    out = flashc.flash_attn_varlen_func(packed, packed, packed, cu, cu, max_seqlen,
                                        max_seqlen, causal=True)
    for start, end in zip(cu.tolist(), cu.tolist()[1:]):
        sample = packed[start:end].detach()[None]
        r64, _ = ref_attention(*(sample.double(),) * 3, causal=True)
        rlp, _ = ref_attention(*(sample,) * 3, causal=True, lowp=True)
        check("sample %d:%d" % (start, end), out[start:end][None], r64, rlp, dt)


def test_concatenated_sequences_empty():
    """No sample at all: nothing packed, cu_seqlens [0], max_seqlen 0 (flash_attn's
    .max() of nothing raises)."""
    x = rand(2, 3, 4, seed=11)
    packed, idx, cu, max_seqlen = bp.unpad_input_for_concatenated_sequences(
        x, torch.zeros(2, 3, dtype=torch.int64))
    assert packed.shape == (0, 4) and idx.numel() == 0 and cu.tolist() == [0]
    assert max_seqlen == 0
