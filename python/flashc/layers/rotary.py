"""flashc.layers.rotary : flash_attn.layers.rotary.apply_rotary_emb, in plain torch.

Rotary position embedding (RoFormer, Su et al. 2021) of the first rotary_dim
features of each head, computed in fp32 and rounded back to x's dtype;
differentiable through torch's ops. It is the helper for code written against
flash_attn; flash_attn_with_kvcache applies rotary inside the C call and does not
use this. No Triton kernel and no fused in-place path: inplace=True writes the
result into x after computing it.
"""
import torch

__all__ = ["apply_rotary_emb"]


def _positions(x, seqlen_offsets, cu_seqlens, max_seqlen):
    """Position of every token: (batch, seqlen) for batched x, (total,) for varlen x."""
    dev = x.device
    if cu_seqlens is None:
        pos = torch.arange(x.shape[1], device=dev)
        off = torch.as_tensor(seqlen_offsets, device=dev).reshape(-1, 1)
        return pos.unsqueeze(0) + off
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    seq = torch.repeat_interleave(torch.arange(lens.numel(), device=dev), lens)
    pos = torch.arange(x.shape[0], device=dev) - cu_seqlens.long()[seq]
    off = torch.as_tensor(seqlen_offsets, device=dev)
    return pos + (off[seq] if off.dim() else off)


def apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0,
                     cu_seqlens=None, max_seqlen=None):
    """x: (batch, seqlen, nheads, headdim), or (total, nheads, headdim) with cu_seqlens
    int32 (batch + 1,) and max_seqlen. cos, sin: (seqlen_ro, rotary_dim / 2), rotary_dim
    <= headdim. interleaved: rotate pairs (x[2i], x[2i+1]) (GPT-J), else halves
    (x[i], x[i + rotary_dim / 2]) (GPT-NeoX). seqlen_offsets: int or (batch,) tensor,
    added to each token's position (decode). Returns x rotated (x itself if inplace)."""
    half = cos.shape[-1]
    rd = 2 * half
    pos = _positions(x, seqlen_offsets, cu_seqlens, max_seqlen)
    c = cos.float()[pos].unsqueeze(-2)   # (..., 1, rd / 2), broadcast over heads
    s = sin.float()[pos].unsqueeze(-2)
    xr = x[..., :rd].float()
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        rot = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    else:
        x1, x2 = xr[..., :half], xr[..., half:]
        rot = torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)
    rot = rot.to(x.dtype)
    if inplace:
        x[..., :rd] = rot
        return x
    return torch.cat((rot, x[..., rd:]), dim=-1)
