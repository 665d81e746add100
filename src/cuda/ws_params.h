// ws_params.h : the argument structs of the warp-specialised sm90 kernels
// (sm90ws/fwd_kernel.cuh, sm90ws/bwd_kernel.cuh): the kernel arguments of
// the forward (params.h) or the backward (bwd_params.h) and one TMA
// descriptor per operand the producer loads, built on the host per call
// (plan.cu fc_cuda_tma_map) and passed with the rest as a __grid_constant__.
//
// Each descriptor views its operand as the 4-d tensor (d, heads, rows, n0)
// with the d axis contiguous: batched q [B, Sq, H, D] is (D, H, Sq, B),
// varlen q [total_q, H, D] is (D, H, total_q, 1); k and v likewise. A box is
// (64 columns, 1 head, tile rows, 1): 128 bytes a row, stored 128B-swizzled,
// which is wgmma.cuh's layout of one 64-column block (fc_sw128_offset).
#ifndef FLASHC_CUDA_WS_PARAMS_H
#define FLASHC_CUDA_WS_PARAMS_H

#include <cuda.h>

#include "bwd_params.h"
#include "params.h"

// GQA packing (pack = G = heads / kv_heads, else 1): the G query heads of one
// KV head share a query tile: packed row R of (batch b, KV head hk) is query
// position R / G of head hk * G + R % G; tma_q's box is then (64, G heads,
// Br / G positions, 1), which lands the rows in that order.
//
// A persistent instance (traits.h) walks a schedule of `items` (the kernel's
// fc_ws_schedule says which query tiles an item is: with causal, pairs of
// tiles, or, packed and pair = 0, single tiles) over a grid of at most one
// CTA per SM; m_blocks = ceil(seqlen_q * pack / Br) query tiles per (batch,
// head / pack).
typedef struct fc_cuda_fwd_ws_params {
    fc_cuda_fwd_params f;
    CUtensorMap tma_q, tma_k, tma_v;
    int32_t m_blocks;
    int64_t items;
    int32_t pack;  // after the others: the unpacked kernels read them at 246e0f6's offsets
    int32_t pair;
    int32_t pack_shift;  // log2(pack): Br % pack == 0 with Br a power of two
    int32_t short_row;   // 1: the head dim's short-work row runs (traits.h), else its row
} fc_cuda_fwd_ws_params;

// The backward (bwd.cu): q and dout, boxes of (64, 1 head, Br rows, 1).
typedef struct fc_cuda_bwd_ws_params {
    fc_cuda_bwd_params b;
    CUtensorMap tma_q, tma_do;
} fc_cuda_bwd_ws_params;

#endif  // FLASHC_CUDA_WS_PARAMS_H
