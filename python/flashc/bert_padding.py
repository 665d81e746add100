"""flashc.bert_padding : flash_attn.bert_padding's public names, in plain torch.

unpad_input and pad_input turn a padded batch (batch, seqlen, ...) plus a mask into the
packed token layout of the varlen functions and back; unpad_input_for_concatenated_sequences
does it for rows that each hold several samples back to back. Under them, the first-axis
gathers and scatters flash_attn exports as autograd Functions and as their .apply:

    index_first_axis(input, indices)                 input (n, ...) -> input[indices]
    index_put_first_axis(values, indices, n)         zeros (n, ...) with [indices] = values
    index_first_axis_residual(input, indices)        (input[indices], input detached)
    IndexFirstAxis, IndexPutFirstAxis, IndexFirstAxisResidual   their classes

indices is an integer tensor (int64 from unpad_input; int32 works too) of distinct rows,
as unpad_input makes them. Nothing here calls the C library.

Against flash_attn's (flash_attn/bert_padding.py of 2.8.3):
- unpad_input has flash_attn >= 2.7's signature and five returns (the 2.6 version took
  no unused_mask and returned the first four); unpad_input_for_concatenated_sequences
  returns four, as in every 2.x.
- the backward of index_first_axis adds the gradient of a row named twice in indices
  (torch's own indexing does; flash_attn's scatter keeps one of them), and inputs of one
  dimension are taken (flash_attn asserts two or more).
"""
import torch
import torch.nn.functional as F

__all__ = ["IndexFirstAxis", "IndexFirstAxisResidual", "IndexPutFirstAxis", "index_first_axis",
           "index_first_axis_residual", "index_put_first_axis", "pad_input", "unpad_input",
           "unpad_input_for_concatenated_sequences"]


# ---- first-axis gathers and scatters ----
def _scatter_rows(rows, indices, n, into=None):
    """`into` (or zeros (n, ...)) with rows[i] added at row indices[i]."""
    if into is None:
        into = rows.new_zeros((n, *rows.shape[1:]))
    return into.index_add_(0, indices, rows)


class IndexFirstAxis(torch.autograd.Function):
    """input (first_axis_dim, ...), indices (k,) -> input[indices] (k, ...)."""

    @staticmethod
    def forward(ctx, input, indices):
        ctx.save_for_backward(indices)
        ctx.first_axis_dim = input.shape[0]
        return input.index_select(0, indices)

    @staticmethod
    def backward(ctx, grad_output):
        (indices,) = ctx.saved_tensors
        return _scatter_rows(grad_output, indices, ctx.first_axis_dim), None


class IndexPutFirstAxis(torch.autograd.Function):
    """values (k, ...), indices (k,), first_axis_dim n -> (n, ...) zeros with row
    indices[i] = values[i]."""

    @staticmethod
    def forward(ctx, values, indices, first_axis_dim):
        ctx.save_for_backward(indices)
        out = values.new_zeros((first_axis_dim, *values.shape[1:]))
        return out.index_put_((indices,), values)

    @staticmethod
    def backward(ctx, grad_output):
        (indices,) = ctx.saved_tensors
        return grad_output.index_select(0, indices), None, None


class IndexFirstAxisResidual(torch.autograd.Function):
    """input (first_axis_dim, ...), indices (k,) -> (input[indices], input detached): the
    second output carries input on (a residual branch) and its gradient flows back to
    input with the gathered rows' gradients added at indices."""

    @staticmethod
    def forward(ctx, input, indices):
        ctx.save_for_backward(indices)
        ctx.first_axis_dim = input.shape[0]
        return input.index_select(0, indices), input.detach()

    @staticmethod
    def backward(ctx, grad_output, grad_residual):
        (indices,) = ctx.saved_tensors
        return _scatter_rows(grad_output, indices, ctx.first_axis_dim,
                             into=grad_residual.clone()), None


index_first_axis = IndexFirstAxis.apply
index_put_first_axis = IndexPutFirstAxis.apply
index_first_axis_residual = IndexFirstAxisResidual.apply


# ---- padded batch <-> packed tokens ----
def _pack(hidden_states, kept, seqlens):
    """(hidden (total, ...), indices, cu_seqlens int32, max_seqlen int): the rows of
    hidden_states (batch, seqlen, ...) flattened to batch * seqlen where `kept` (batch,
    seqlen) is nonzero, and the lengths `seqlens` of the packed sequences, in order."""
    indices = torch.nonzero(kept.flatten(), as_tuple=False).flatten()
    max_seqlen = int(seqlens.max().item()) if seqlens.numel() else 0
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return index_first_axis(flat, indices), indices, cu_seqlens, max_seqlen


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """hidden_states (batch, seqlen, ...), attention_mask (batch, seqlen) bool/int, 1 =
    a real token; unused_mask (batch, seqlen), 1 = a slot that is allocated but unused
    (kept in the packed tensor, counted in cu_seqlens, not in seqused).
    Returns (hidden (total, ...), indices (total,) into the flattened batch * seqlen,
    cu_seqlens int32 (batch + 1,), max_seqlen_in_batch int, seqused int32 (batch,))."""
    all_masks = attention_mask + unused_mask if unused_mask is not None else attention_mask
    seqused = attention_mask.sum(dim=-1, dtype=torch.int32)
    return _pack(hidden_states, all_masks, all_masks.sum(dim=-1, dtype=torch.int32)) + (seqused,)


def unpad_input_for_concatenated_sequences(hidden_states, attention_mask_in_length):
    """Rows that each hold several samples back to back (supervised fine-tuning packing):
    hidden_states (batch, seqlen, ...), attention_mask_in_length (batch, seqlen) int, row
    b listing the lengths of its samples, 0 elsewhere: [[2, 3, 0, 0, 0, 0], ...] holds a
    sample at positions 0..1 and one at 2..4, position 5 unused. Each sample becomes one
    sequence of the packed layout (the varlen functions then keep samples apart).
    Returns (hidden (total, ...), indices (total,), cu_seqlens int32 (samples + 1,),
    max_seqlen_in_batch int): the samples in row order, then in their order in the row."""
    lengths = attention_mask_in_length
    used = lengths.sum(dim=-1, keepdim=True)
    positions = torch.arange(lengths.shape[-1], device=lengths.device)
    flat = lengths.flatten()
    seqlens = flat.index_select(0, torch.nonzero(flat, as_tuple=False).flatten())
    return _pack(hidden_states, positions < used, seqlens)


def pad_input(hidden_states, indices, batch, seqlen):
    """hidden_states (total, ...) at `indices` of the flattened batch * seqlen ->
    (batch, seqlen, ...), zeros elsewhere."""
    out = index_put_first_axis(hidden_states, indices, batch * seqlen)
    return out.reshape(batch, seqlen, *hidden_states.shape[1:])
