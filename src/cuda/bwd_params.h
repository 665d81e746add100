// bwd_params.h : the one argument struct of the CUDA backward kernels
// (common/bwd_prep.cuh: the preprocess, dQ and dsink kernels; sm80/bwd_kernel.cuh
// and sm90/bwd_kernel.cuh: the main kernels).
//
// It embeds the forward's fc_cuda_fwd_params (params.h): q, k, v, out, their
// strides, the sequence layout, masks, softcap, ALiBi, dropout and the
// host-derived score constants mean exactly what they mean in the forward, and
// bwd.cu fills them with the same function (plan.cu). The backward adds dout
// and the three gradients, and the fp32 scratch it keeps in the caller's workspace.
//
// Scratch rows. The per-row scratch (lse2, delta, dq_accum) is indexed by a
// padded row R = dq_row0(b) + i for query row i of sequence b:
//   batched: dq_row0(b) = b * sq_pad, sq_pad = Sq rounded up to kFcBwdPadRows
//   varlen:  dq_row0(b) = cu_seqlens_q[b] + b * kFcBwdPadRows
// so every query tile of a sequence (Br <= kFcBwdPadRows rows from a multiple
// of Br) lies inside its own sequence's rows: the rows past sq are pad rows
// (lse2 = +inf, delta = 0: P = 0 there) and no tile reads another sequence's.
// Arrays: lse2 and delta [H][rows], dq_accum [H][rows][dq_pitch] fp32, and
// with deterministic = 1 one int32 semaphore per (head, R / Br). The key side
// has its own scratch only with the GQA split (kv_split, below).
#ifndef FLASHC_CUDA_BWD_PARAMS_H
#define FLASHC_CUDA_BWD_PARAMS_H

#include <stdint.h>

#include "params.h"
#ifdef __CUDACC__
#include "common/seqlens.cuh"
#endif

// Pad rows per sequence of the scratch arrays: the largest Br of any backward tile.
#define kFcBwdPadRows 128

typedef struct fc_cuda_bwd_params {
    fc_cuda_fwd_params f;  // q, k, v, o (the forward's output), lse (natural log, the caller's)

    // ---- dout and the gradients (element strides, the d axis contiguous) ----
    const void *dout;  // like q, of f.head_dim_v columns
    int64_t do_s_batch, do_s_seq, do_s_head;
    void *dq;          // like q, written by the dQ kernel (any stride, any head_dim)
    int64_t dq_s_batch, dq_s_seq, dq_s_head;
    void *dk, *dv;     // like k / v, of D / Dv columns (rows of sequence b at cu_seqlens_k[b]
                       // when varlen)
    int64_t dk_s_batch, dk_s_seq, dk_s_head;
    int64_t dv_s_batch, dv_s_seq, dv_s_head;
    int32_t dq_head_dim;  // D of dq as the caller sees it (<= f.head_dim when the main
                          // kernel reads zero-padded copies)

    // ---- scratch in the workspace ----
    float *lse2;      // [H][rows]: lse * log2(e), +inf for rows that see no key and pad rows
    float *delta;     // [H][rows]: rowsum(dout * out) over Dv, 0 for pad rows
    float *dq_accum;  // [H][rows][dq_pitch]: sum over key blocks of dS K (unscaled)
    int32_t *sem;     // [H][rows / Br]: deterministic mode's turn counters, or NULL
    int64_t rows;     // rows of each head's scratch
    int32_t sq_pad;   // batched: Sq rounded up to kFcBwdPadRows
    int32_t dq_pitch; // floats per dq_accum row (f.head_dim; sm90: the instance's D)
    int32_t dq_swizzle; // 1: the sm90 kernel's layout, 16-byte chunk c of the row of
                        // query i (in its sequence) at fc_dq_chunk(c, i)
    int32_t sem_br;   // Br of the main kernel (the semaphore granularity)

    // ---- the GQA split (sm90): kv_split CTAs per (key block, KV head) ----
    // CTA (n, y = hk * kv_split + s, b) walks query heads y split_heads ..
    // (split_heads = G / kv_split of them) and, with kv_split > 1, writes its
    // dK (unscaled) and dV in fp32 to part row y of dkv_accum: dK [Hk *
    // kv_split][kv_rows][dkv_pitch] then dV alike, key row b Sk + j, or the
    // token (varlen); the dKV kernel (common/bwd_prep.cuh) sums the parts
    // s = 0 .. kv_split - 1 of each KV head in order into the caller's dk, dv.
    int32_t kv_split;     // >= 1, divides G
    // 1 (sm90, causal): the grid is (y, n, b), key blocks the slowest of the
    // first two, so that the longest CTAs (the first key blocks, which meet
    // the most query rows) are dispatched first (bwd.cu fc_bwd_kv_split)
    int32_t key_major;
    int32_t split_heads;  // G / kv_split: query heads per CTA
    float *dkv_accum;   // kv_split > 1 only
    int64_t kv_rows;    // B * Sk, or total_k (varlen)
    int32_t dkv_pitch;  // floats per partial row: the instance's D

    float *dsink;     // [H] at h * dsink_s: the learnable sink's gradient (f.sink), or NULL
    int64_t dsink_s;

    float ds_scale;   // d(logit)/d(q.k) without softcap: the softmax scale
    float log2e;      // log2(e): lse2 = lse * log2e
    int32_t deterministic;
} fc_cuda_bwd_params;

#ifdef __CUDACC__
// Where 16-byte chunk c of the dq_accum row of query i sits with dq_swizzle:
// c ^ 2 (i % 4). The sm90 kernel stores its dQ tile with 8-byte stores of a
// wgmma accumulator (lane: row g = lane / 4, columns 2 (lane % 4), +1); in each
// half warp (the 16 lanes one 8-byte store phase serves) rows g % 4 = 0..3 and
// the two chunks of the 8 columns then land on 8 distinct chunk positions of
// a 128-byte line, so no two lanes share a bank.
__device__ __forceinline__ int fc_dq_chunk(int c, int i) { return c ^ ((i & 3) << 1); }

// Sequence b's query length and its first row in q-like operands (varlen),
// clamped to the operands (common/seqlens.cuh).
__device__ __forceinline__ void fc_bwd_q_seq(const fc_cuda_bwd_params &p, int b, int *sq,
                                             int *tok0) {
    *tok0 = 0;
    *sq = p.f.seqlen_q;
    if (p.f.cu_seqlens_q) {
        const fc_span s = fc_cu_span(p.f.cu_seqlens_q, b, p.f.total_q, p.f.seqlen_q);
        *tok0 = s.start;
        *sq = s.len;
    }
}

// First scratch row of sequence b, whose first token is tok0 (fc_bwd_q_seq).
// A sequence's rows and pad rows stay below p.rows for any metadata: tok0 +
// sq <= total_q.
__device__ __forceinline__ int64_t fc_bwd_row0(const fc_cuda_bwd_params &p, int b, int tok0) {
    return p.f.cu_seqlens_q ? (int64_t)tok0 + (int64_t)b * kFcBwdPadRows : (int64_t)b * p.sq_pad;
}
#endif

#endif  // FLASHC_CUDA_BWD_PARAMS_H
