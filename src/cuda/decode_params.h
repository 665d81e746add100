// decode_params.h : the argument structs of the CUDA decode path
// (flashc_fwd_kvcache): the prep kernel (append + rotary), the split-KV decode
// kernel and the combine kernel (common/kvcache_kernels.cuh, sm80/decode_kernel.cuh).
//
// kvcache.cu fills them from prepare.c's fc_kvcache (src/internal.h) and passes them
// by value as `const __grid_constant__` kernel arguments, as params.h does for
// the forward. The decode struct embeds the forward's fc_cuda_fwd_params: the
// operands, strides, cache layout, masks, softcap, ALiBi and the host-derived
// score constants mean the same in both, so one function fills them. Every
// pointer is a device pointer; integer tensors are read on the device only.
#ifndef FLASHC_CUDA_DECODE_PARAMS_H
#define FLASHC_CUDA_DECODE_PARAMS_H

#include <stdint.h>

#include "params.h"

// ---- key lengths (src/internal.h fc_kvcache, flashc.h) ----
// Rows of cache b in use before the append (leftpad rows included):
//   used(b) = cache_seqlens ? cache_seqlens[b * cs_stride] : capacity
// and its keys: seqlen_k(b) = used(b) - leftpad(b) + seqlen_new. The arrays
// are the caller's device memory, read only through fc_kv_span, which clamps
// them (common/seqlens.cuh).
typedef struct fc_cuda_kv_lens {
    const int32_t *cache_seqlens;  // the caller's [B] or rank-0 scalar, or NULL
    int64_t cs_stride;             // elements between entries, 0 for the scalar
    int32_t capacity;              // rows per cache: S_c, or max_blocks * page_size
    int32_t seqlen_new;            // S_new, 0 without an append
    const int32_t *leftpad;        // cache_leftpad [B], or NULL
} fc_cuda_kv_lens;

#ifdef __CUDACC__
#include "common/seqlens.cuh"

// Cache b's rows, clamped: used in [0, capacity], pad in [0, used], and keys
// = min(used + seqlen_new, capacity) - pad (new rows at or past the capacity
// are neither written nor attended).
struct fc_kv_span {
    int used, pad, keys;
};
__device__ __forceinline__ fc_kv_span fc_kv_span_of(const fc_cuda_kv_lens &l, int b) {
    const int used = l.cache_seqlens
                         ? fc_clampi(l.cache_seqlens[(int64_t)b * l.cs_stride], 0, l.capacity)
                         : l.capacity;
    const int pad = l.leftpad ? fc_clampi(l.leftpad[b], 0, used) : 0;
    return {used, pad, min(used + l.seqlen_new, l.capacity) - pad};
}
#endif

// ---- the prep kernel: append, rotary q, key lengths ----
// One warp per row job, in this order:
//   n_append jobs (b, t, hk): row t of k_new (rotated at position used(b) + t)
//     and of v_new into cache row used(b) + t of sequence b, if that row is
//     below the capacity;
//   n_q jobs (b, i, h): q row rotated at position used(b) + (q_per_row ? i : 0)
//     into q_rot;
//   n_lens jobs: seqlen_k and leftpad of 32 sequences each into seqlens_k
//     (fc_kv_span_of: the forward kernel of step 2b reads these clamped copies).
// Rotary positions past the table's last row read that row.
// Rotary (RoFormer): pair i < rotary_dim / 2 is (x[2i], x[2i+1]) when
// interleaved, else (x[i], x[i + rotary_dim / 2]); (x, y) becomes
// (x c - y s, x s + y c), each product and sum rounded to fp32 as the CPU does
// (no FMA contraction), then rounded once to the dtype: bit-identical to
// src/cpu/kvcache.c.
typedef struct fc_cuda_kvprep_params {
    fc_cuda_kv_lens lens;
    int32_t batch, seqlen_q, heads, kv_heads, head_dim;
    int32_t head_dim_v;  // Dv: of v_new and v_cache

    // the append (n_append = B * S_new * Hk, 0 without k_new)
    const void *k_new, *v_new;  // [B, S_new, Hk, D], [B, S_new, Hk, Dv]
    int64_t kn_s_batch, kn_s_seq, kn_s_head;
    int64_t vn_s_batch, vn_s_seq, vn_s_head;
    void *k_cache, *v_cache;  // contiguous [B_c, S_c, Hk, D] or paged [pages, page_size, Hk, D]
                              // (v_cache: Dv)
    int64_t kc_s_batch, kc_s_seq, kc_s_head;  // s_batch: between cache batches or pages
    int64_t vc_s_batch, vc_s_seq, vc_s_head;
    const int32_t *block_table;  // [B, bt_stride], or NULL (contiguous)
    int64_t bt_stride;
    int32_t page_size;
    const int32_t *k_batch_idx;  // [B] or NULL: contiguous cache row of sequence b
    int32_t caches;              // k_cache.shape[0]: pages, or cache batches

    // the rotary q (n_q = B * Sq * H, 0 without rotary)
    const void *q;  // [B, Sq, H, D]
    int64_t q_s_batch, q_s_seq, q_s_head;
    void *q_rot;  // dense [B, Sq, H, D]

    // rotary tables [S_ro, rotary_dim / 2], fp32 or the dtype
    const void *rotary_cos, *rotary_sin;
    int64_t cos_s_row, sin_s_row;
    int32_t rotary_rows;  // S_ro
    int32_t rotary_dim;   // even, <= D; 0 = none
    int32_t interleaved;  // 1: pairs (2i, 2i+1); 0: halves
    int32_t rotary_fp32;  // 1: the tables are fp32; 0: the dtype
    int32_t q_per_row;    // 1 (causal or windowed): q row i at used(b) + i

    int32_t *seqlens_k;  // [2 B] out: seqlen_k [B] then leftpad [B], or NULL (n_lens = 0)
    int64_t n_append, n_q, n_lens;
} fc_cuda_kvprep_params;

// ---- the decode and combine kernels ----
// The query rows of one (sequence b, kv head hk) are packed (GQA packing):
// packed row R = i * kv_group + gq is query row i of head hk * kv_group + gq,
// so each K/V byte is read once for all kv_group heads. A CTA owns 16 packed
// rows (m_block) and one of `splits` ranges of the key tiles.
typedef struct fc_cuda_decode_params {
    // q (the rotated copy when rotary), the caches as k / v, out, lse, the shape
    // (seqlen_q, kv_group, head_dim and head_dim_v: multiples of 8), the cache layout
    // (block_table, page_size, k_batch_idx, k_leftpad) and the score constants.
    // seqlens_k is NULL: lengths come from `lens`; seqlen_k is the capacity.
    fc_cuda_fwd_params f;
    fc_cuda_kv_lens lens;
    int32_t kv_heads;  // Hk
    int32_t rows;      // packed rows per (b, hk): seqlen_q * kv_group
    int32_t m_blocks;  // ceil(rows / 16)
    int32_t splits;    // key splits, 1..128; 1 writes out and lse directly
    // splits > 1: each split's O (normalised by its own sum) and natural-log lse,
    // combined by the combine kernel into out and lse
    float *o_accum;    // fp32 [splits, B * Hk, rows, head_dim_v]
    float *lse_accum;  // fp32 [splits, B * Hk, rows]
} fc_cuda_decode_params;

#endif  // FLASHC_CUDA_DECODE_PARAMS_H
