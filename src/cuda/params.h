// params.h : the one argument struct of the CUDA forward kernels.
//
// plan.cu (fc_cuda_fwd_make_params) fills it from prepare.c's fc_attn
// (src/internal.h); each operation's file passes it by value as a
// `const __grid_constant__` kernel argument (it lives in the constant bank;
// no copy to device memory, no allocation). Everything that does not change the
// shape of the kernel code is a field here: strides, sequence layout, masks,
// softcap, ALiBi, dropout. Only the head dim, the dtype and causal are template
// parameters (sm80/fwd_kernel.cuh).
//
// Host-derived constants (log2 e folded into the score scale, 1/softcap, the
// dropout threshold) are computed once in plan.cu, never written as literals
// in a kernel. Every pointer is a device pointer.
#ifndef FLASHC_CUDA_PARAMS_H
#define FLASHC_CUDA_PARAMS_H

#include <stdint.h>

typedef struct fc_cuda_fwd_params {
    // ---- operands (element strides; the d axis is contiguous) ----
    const void *q;  // row i of sequence b, head h: q + fc_q_row(b, i) + h*q_s_head
    const void *k;  // key row j of sequence b, kv head hk: k + fc_kv_row(b, j) + hk*k_s_head
    const void *v;  // as k, with the v strides (head_dim_v columns)
    void *o;        // like q, of head_dim_v columns
    int64_t q_s_batch, q_s_seq, q_s_head;  // s_batch is 0 for varlen (rows are global tokens)
    int64_t k_s_batch, k_s_seq, k_s_head;  // s_batch: between batches, or pages when paged
    int64_t v_s_batch, v_s_seq, v_s_head;
    int64_t o_s_batch, o_s_seq, o_s_head;
    float *lse;  // fp32 (b, h, i) at b*lse_s_batch + h*lse_s_head + row*lse_s_seq, or NULL
    int64_t lse_s_batch, lse_s_head, lse_s_seq;

    // ---- shape ----
    int32_t batch;     // B (grid z)
    int32_t heads;     // H (grid y)
    int32_t kv_group;  // H / Hk: query head h reads kv head h / kv_group
    int32_t head_dim;  // D of q and k, <= the kernel's D (the rest is zero-padded)
    int32_t head_dim_v;  // Dv of v and o (the backward's dout, dv), <= the kernel's D:
                         // the kernel's D is the larger of the two, rounded up to an instance
    int32_t seqlen_q;  // batched Sq, or max_seqlen_q (grid x = ceil(seqlen_q / Br))
    int32_t seqlen_k;  // batched Sk, or max_seqlen_k

    // ---- sequence layout (src/internal.h fc_seqlen_q/k, fc_q_row, fc_kv_row) ----
    // The integer arrays are the caller's device memory, read only through
    // common/seqlens.cuh, which clamps them to the bounds below.
    const int32_t *cu_seqlens_q;  // [B+1] or NULL (batched)
    const int32_t *cu_seqlens_k;  // [B+1] or NULL
    const int32_t *seqlens_k;     // [B] or NULL: key length of b (seqused_k / kvcache)
    const int32_t *block_table;   // [B, bt_stride] or NULL: paged K/V
    int64_t bt_stride;            // elements between block_table rows
    int32_t bt_cols;              // pages per block_table row (block_table.shape[1])
    int32_t page_size;            // rows per page (>= 1) when paged
    const int32_t *k_batch_idx;   // [B] or NULL: batch b reads K/V batch k_batch_idx[b]
    const int32_t *k_leftpad;     // [B] or NULL: keys of b start at row k_leftpad[b]; only
                                  // the kvcache path sets it, to the prep kernel's clamped copy
    int32_t total_q;              // varlen: rows of q (cu_seqlens_q's bound)
    int32_t total_k;              // varlen: rows of k; paged: pages; k_batch_idx: cache batches

    // ---- scores ----
    // The kernel keeps a score x per element: x = q.k (no softcap) or
    // x = tanh(q.k * scale / softcap) (softcap). The natural-log logit is
    // x * score_scale (+ ALiBi), so exp(logit - max) = exp2(x*score_scale_log2 - ...).
    float score_scale;       // scale, or softcap when softcap is on
    float score_scale_log2;  // score_scale * log2(e)
    float softcap_pre;       // 2 * log2(e) * scale / softcap (mask.cuh fc_softcap), 0 = off
    int32_t window_left;     // -1 = unbounded; key j visible iff j >= i + Sk - Sq - left
    int32_t window_right;    // -1 = unbounded; ... and j <= i + Sk - Sq + right (causal: 0)
    const float *alibi;      // slope of (b, h) = alibi[b*alibi_s_batch + h], or NULL
    int64_t alibi_s_batch;   // 0 for slopes [H]
    float alibi_scale;       // 1 / score_scale: the slope in units of x

    // ---- dropout (flashc.h "Dropout") ----
    int32_t dropout;             // 0 = off
    uint32_t dropout_threshold;  // drop iff u16 < threshold (fc_dropout_threshold(p))
    float dropout_rescale;       // 1 / (1 - p), or 1 when off
    uint64_t dropout_seed, dropout_offset;

    // ---- learnable sink (flashc.h flashc_fwd_args.sink) ----
    // Query head h's sink logit sink[h*sink_s] (natural log) joins the softmax
    // denominator of each of its rows (common/softmax.cuh fc_sink_normalise).
    const void *sink;    // [H], or NULL: no sink
    int64_t sink_s;
    int32_t sink_dtype;  // its flashc_dtype: fp32, fp16 or bf16 (fc_sink_value)
    float log2e;  // log2(e): the sink in log2 units
    float ln2;    // ln(2): lse back from log2 units
} fc_cuda_fwd_params;

#endif  // FLASHC_CUDA_PARAMS_H
