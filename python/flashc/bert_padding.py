"""flashc.bert_padding : flash_attn.bert_padding's unpad_input and pad_input, in plain torch.

They turn a padded batch (batch, seqlen, ...) plus a mask into the packed token layout
of the varlen functions and back. Both are differentiable through torch's own
indexing ops; nothing here calls the C library.

unpad_input has flash_attn >= 2.7's signature and five returns (the 2.6 version
took no unused_mask and returned the first four).
"""
import torch
import torch.nn.functional as F

__all__ = ["pad_input", "unpad_input"]


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """hidden_states (batch, seqlen, ...), attention_mask (batch, seqlen) bool/int, 1 =
    a real token; unused_mask (batch, seqlen), 1 = a slot that is allocated but unused
    (kept in the packed tensor, counted in cu_seqlens, not in seqused).
    Returns (hidden (total, ...), indices (total,) into the flattened batch * seqlen,
    cu_seqlens int32 (batch + 1,), max_seqlen_in_batch int, seqused int32 (batch,))."""
    all_masks = attention_mask + unused_mask if unused_mask is not None else attention_mask
    seqlens = all_masks.sum(dim=-1, dtype=torch.int32)
    seqused = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(all_masks.flatten(), as_tuple=False).flatten()
    max_seqlen = int(seqlens.max().item()) if seqlens.numel() else 0
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return flat.index_select(0, indices), indices, cu_seqlens, max_seqlen, seqused


def pad_input(hidden_states, indices, batch, seqlen):
    """hidden_states (total, ...) at `indices` of the flattened batch * seqlen ->
    (batch, seqlen, ...), zeros elsewhere."""
    out = hidden_states.new_zeros((batch * seqlen, *hidden_states.shape[1:]))
    return out.index_copy(0, indices, hidden_states).reshape(batch, seqlen,
                                                             *hidden_states.shape[1:])
