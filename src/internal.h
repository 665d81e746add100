/* internal.h : what the layers under include/flashc.h share.
 *
 * prepare.c validates every public argument and turns each entry point's args
 * into one normalised problem, fc_attn: resolved options, raw pointers and
 * element strides, and per-sequence lengths. The backends (src/cpu, src/cuda)
 * read only fc_attn, never the public args structs, so batched, varlen, paged
 * and kvcache calls share one code path; api.c reaches them through the
 * backend table below (src/backend.c).
 *
 * Not here: anything a caller sees (that is flashc.h), anything C++.
 */
#ifndef FLASHC_INTERNAL_H
#define FLASHC_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "flashc.h"
#include "common/window.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors ---- */
/* fc_set_error() : record a printf-style message in the thread-local last error
 * and return s. fc_clear_error() empties it (every entry point does on entry). */
flashc_status fc_set_error(flashc_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void fc_clear_error(void);

#define FC_CHECK_ARG(cond, ...)                                   \
    do {                                                          \
        if (!(cond)) return fc_set_error(FLASHC_ERR_INVALID_ARG, __VA_ARGS__); \
    } while (0)

/* ---- the launch log: FLASHC_LOG=1 ---- */
/* fc_log_on() : whether FLASHC_LOG is set to anything but "" or "0"; the
 * environment is read once, then the answer is one relaxed atomic load.
 * fc_log() : write one line, "flashc: " + the printf-style text + "\n", to
 * stderr in one write. FC_LOG(...) does both, so a call site costs one branch
 * when the log is off. One line per dispatch (api.c) and per kernel launch
 * (src/cpu; src/cuda: fwd.cu, bwd.cu, kvcache.cu, plan.cu's repack); the
 * library prints nothing else.
 * fc_log_reload() forgets the cached answer (tests that set FLASHC_LOG). */
bool fc_log_on(void);
void fc_log(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
void fc_log_reload(void);
#define FC_LOG(...)                         \
    do {                                    \
        if (fc_log_on()) fc_log(__VA_ARGS__); \
    } while (0)

/* fc_check_abi() : FLASHC_OK if a struct's abi field (named name, e.g. "args.abi")
 * is this library's FLASHC_ABI_VERSION, else FLASHC_ERR_INVALID_ARG naming both. */
flashc_status fc_check_abi(const char *name, uint32_t abi);

#define FC_TRY(expr)                         \
    do {                                     \
        flashc_status fc_try_s_ = (expr);    \
        if (fc_try_s_ != FLASHC_OK) return fc_try_s_; \
    } while (0)

/* ---- one strided operand ---- */
/* A [batch-or-block, seq, head, d] operand with element strides. For varlen
 * operands without paging, s_batch is 0 and rows are addressed by the global
 * token index (cu_seqlens[b] + i). */
typedef struct fc_view {
    void *ptr;
    int64_t s_batch; /* stride between batches (or pages when paged) */
    int64_t s_seq;   /* stride between tokens */
    int64_t s_head;  /* stride between heads; the d axis has stride 1 */
} fc_view;

/* ---- the normalised problem ---- */
typedef struct fc_attn {
    /* shape */
    int64_t batch;        /* B: batch size, or number of varlen sequences */
    int64_t heads;        /* H: query heads */
    int64_t kv_heads;     /* Hk: key/value heads, H % Hk == 0 */
    int64_t head_dim;     /* D: of q and k (Q K^T), the default scale's 1/sqrt(D) */
    int64_t head_dim_v;   /* Dv: of v, out (and dout, dv); may differ from D (MLA) */
    int64_t max_seqlen_q; /* batched: Sq; varlen: max_seqlen_q */
    int64_t max_seqlen_k; /* batched: Sk; varlen: max_seqlen_k; kvcache: max over b of seqlen_k(b)
                             on the CPU, the cache capacity (a bound) on CUDA */
    flashc_dtype dtype;   /* of q, k, v, out, dout, dq, dk, dv */

    /* sequence layout. Query rows of sequence b: i in [0, seqlen_q(b)).
     * cu_seqlens_q == NULL: batched, row i of b at q.ptr + b*s_batch + i*s_seq.
     * else: varlen, row i of b at q.ptr + (cu_seqlens_q[b] + i)*s_seq. */
    const int32_t *cu_seqlens_q; /* [B+1] or NULL */
    const int32_t *cu_seqlens_k; /* [B+1] or NULL */
    /* key lengths: seqlen_k(b) = seqlens_k ? seqlens_k[b]
     *   : cu_seqlens_k ? cu_seqlens_k[b+1]-cu_seqlens_k[b] : max_seqlen_k. */
    const int32_t *seqlens_k; /* [B] or NULL (varlen seqused_k; kvcache total key lengths) */

    /* key rows. Key row j of sequence b (0 <= j < seqlen_k(b)) is at
     *   paged:      k.ptr + block_table[b*bt_stride + r/page_size]*s_batch + (r%page_size)*s_seq
     *   varlen:     k.ptr + (cu_seqlens_k[b] + j)*s_seq
     *   batched:    k.ptr + kb*s_batch + r*s_seq
     * with r = j + (k_leftpad ? k_leftpad[b] : 0) and kb = k_batch_idx ? k_batch_idx[b] : b.
     * fc_kv_row() computes this; v uses the same (page, row) with its own strides. */
    const int32_t *block_table; /* [B, bt_stride...] or NULL */
    int64_t bt_stride;          /* elements between block_table rows */
    int64_t bt_cols;            /* pages per block_table row (block_table.shape[1]) */
    int64_t page_size;          /* rows per page when paged */
    const int32_t *k_batch_idx; /* kvcache cache_batch_idx, or NULL */
    const int32_t *k_leftpad;   /* kvcache cache_leftpad, or NULL */
    int64_t total_q, total_k;   /* varlen: q.shape[0], k.shape[0] (pages when paged);
                                   kvcache: 0, k_cache.shape[0] (cache batches or pages);
                                   batched: 0 */

    /* operands (ptr NULL when absent) */
    fc_view q, k, v, out;
    fc_view dout, dq, dk, dv; /* backward only */

    /* softmax_lse, fp32. Element (b, h, i) is at
     *   lse + b*lse_s_batch + h*lse_s_head + row*lse_s_seq,
     * row = i (batched) or cu_seqlens_q[b] + i (varlen, lse_s_batch == 0). */
    float *lse;
    int64_t lse_s_batch, lse_s_head, lse_s_seq;

    /* attn_probs, fp32 [B, H, max_seqlen_q, max_seqlen_k], or NULL */
    float *probs;
    int64_t probs_s_batch, probs_s_head, probs_s_row; /* column stride is 1 */

    /* options, resolved */
    float scale;          /* softmax_scale, > 0 */
    float softcap;        /* 0 = off */
    int32_t window_left;  /* -1 = unbounded; >= 0 otherwise */
    int32_t window_right; /* -1 = unbounded; causal is folded in as 0 */
    bool causal;          /* informational: window_right == 0 came from causal */
    const float *alibi;   /* slope of (b, h) = alibi[b*alibi_s_batch + h], or NULL */
    int64_t alibi_s_batch;/* 0 for slopes [H] */
    const void *sink;     /* learnable sink logit of head h = sink[h*sink_s], or NULL */
    int64_t sink_s;
    flashc_dtype sink_dtype; /* fp32, fp16 or bf16 */
    float *dsink;         /* backward: dsink[h*dsink_s] written, or NULL (only with sink) */
    int64_t dsink_s;
    float dropout_p;      /* 0 = off */
    uint64_t seed, offset;
    bool deterministic;
    int32_t num_splits;   /* kvcache; 0 = heuristic */
    void *stream;         /* CUDA stream */
} fc_attn;

/* ---- per-sequence helpers ---- */
static inline int64_t fc_seqlen_q(const fc_attn *a, int64_t b) {
    return a->cu_seqlens_q ? (int64_t)a->cu_seqlens_q[b + 1] - a->cu_seqlens_q[b] : a->max_seqlen_q;
}

static inline int64_t fc_seqlen_k(const fc_attn *a, int64_t b) {
    if (a->seqlens_k) return a->seqlens_k[b];
    return a->cu_seqlens_k ? (int64_t)a->cu_seqlens_k[b + 1] - a->cu_seqlens_k[b] : a->max_seqlen_k;
}

/* Element offset of row i of sequence b for a q-like operand (q, out, dout, dq). */
static inline int64_t fc_q_row(const fc_attn *a, const fc_view *v, int64_t b, int64_t i) {
    return a->cu_seqlens_q ? ((int64_t)a->cu_seqlens_q[b] + i) * v->s_seq
                           : b * v->s_batch + i * v->s_seq;
}

/* Element offset of key row j of sequence b for a k-like operand (k, v, dk, dv):
 * the rule stated at fc_attn's key rows. Cache row r = j + leftpad of a paged
 * sequence is row r % page_size of page block_table[b*bt_stride + r/page_size];
 * the GPU kernels' statement of the same rule is src/cuda/common/seqlens.cuh
 * fc_paged (which also clamps the metadata the host never reads there). */
static inline int64_t fc_kv_row(const fc_attn *a, const fc_view *v, int64_t b, int64_t j) {
    int64_t r = j + (a->k_leftpad ? a->k_leftpad[b] : 0);
    if (a->block_table) {
        int64_t page = a->block_table[b * a->bt_stride + r / a->page_size];
        return page * v->s_batch + (r % a->page_size) * v->s_seq;
    }
    if (a->cu_seqlens_k) return ((int64_t)a->cu_seqlens_k[b] + r) * v->s_seq;
    int64_t kb = a->k_batch_idx ? a->k_batch_idx[b] : b;
    return kb * v->s_batch + r * v->s_seq;
}

/* Element index of lse (b, h, i). */
static inline int64_t fc_lse_index(const fc_attn *a, int64_t b, int64_t h, int64_t i) {
    int64_t row = a->cu_seqlens_q ? (int64_t)a->cu_seqlens_q[b] + i : i;
    return b * a->lse_s_batch + h * a->lse_s_head + row * a->lse_s_seq;
}

/* ALiBi slope of (b, h), 0 when off. */
static inline float fc_alibi_slope(const fc_attn *a, int64_t b, int64_t h) {
    return a->alibi ? a->alibi[b * a->alibi_s_batch + h] : 0.0f;
}


/* Visible key range of query row i in a sequence of lengths (sq, sk): keys
 * j in [*lo, *hi) (empty when *lo >= *hi), common/window.h's rule (bottom-right
 * aligned) with *lo clamped at 0. */
static inline void fc_key_range(const fc_attn *a, int64_t sq, int64_t sk, int64_t i,
                                int64_t *lo, int64_t *hi) {
    int64_t diag = FC_WINDOW_DIAG(i, sq, sk);
    int64_t l = FC_WINDOW_LO(diag, (int64_t)a->window_left);
    *lo = l < 0 ? 0 : l;
    *hi = FC_WINDOW_HI(diag, (int64_t)a->window_right, sk);
}

/* Threshold for the dropout test (see flashc.h): drop iff u16 < threshold. */
static inline uint32_t fc_dropout_threshold(float p) {
    return (uint32_t)((double)p * 65536.0 + 0.5);
}

/* ---- dtype conversion (scalar, exact round-to-nearest-even) ---- */
float fc_half_to_float(uint16_t h);
uint16_t fc_float_to_half(float f);
static inline float fc_bf16_to_float(uint16_t h) {
    union { uint32_t u; float f; } x;
    x.u = (uint32_t)h << 16;
    return x.f;
}
static inline uint16_t fc_float_to_bf16(float f) {
    union { uint32_t u; float f; } x;
    x.f = f;
    if ((x.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x.u >> 16) | 0x40); /* NaN stays NaN */
    x.u += 0x7fffu + ((x.u >> 16) & 1u);
    return (uint16_t)(x.u >> 16);
}
/* Load / store one element of dtype dt (fp32, fp16, bf16) as float. */
static inline float fc_load(flashc_dtype dt, const void *p, int64_t i) {
    switch (dt) {
    case FLASHC_DTYPE_FP32: return ((const float *)p)[i];
    case FLASHC_DTYPE_FP16: return fc_half_to_float(((const uint16_t *)p)[i]);
    default: return fc_bf16_to_float(((const uint16_t *)p)[i]);
    }
}
static inline void fc_store(flashc_dtype dt, void *p, int64_t i, float v) {
    switch (dt) {
    case FLASHC_DTYPE_FP32: ((float *)p)[i] = v; break;
    case FLASHC_DTYPE_FP16: ((uint16_t *)p)[i] = fc_float_to_half(v); break;
    default: ((uint16_t *)p)[i] = fc_float_to_bf16(v); break;
    }
}
/* Sink logit of head h (flashc.h, flashc_fwd_args.sink) as fp32 (exact from fp16 or
 * bf16); only with a->sink. */
static inline float fc_sink_logit(const fc_attn *a, int64_t h) {
    return fc_load(a->sink_dtype, a->sink, h * a->sink_s);
}
/* Round a float to dtype dt and back (the value a store then load would give). */
static inline float fc_round_to(flashc_dtype dt, float v) {
    switch (dt) {
    case FLASHC_DTYPE_FP16: return fc_half_to_float(fc_float_to_half(v));
    case FLASHC_DTYPE_BF16: return fc_bf16_to_float(fc_float_to_bf16(v));
    default: return v;
    }
}

/* ---- workspace and allocation ---- */
/* Carving of a workspace from a table of (bytes) regions, each aligned to
 * FLASHC_WORKSPACE_ALIGN: size and carve come from one function so they cannot
 * drift. fc_ws_layout(n, sizes, offsets) fills offsets and returns the total. */
size_t fc_ws_layout(int n, const size_t *sizes, size_t *offsets);
void *fc_alloc(size_t bytes, flashc_device dev);
void fc_free(void *p, flashc_device dev);

/* ---- kvcache problem ---- */
/* What the kvcache entry point hands a backend: the attention problem over the
 * cache (k/v views are the caches, seqlens_k the total key lengths after the
 * append, k_batch_idx/k_leftpad/block_table set) plus what must happen first. */
typedef struct fc_kvcache {
    fc_attn attn;            /* q is the caller's q (not yet rotated) */
    fc_view k_new, v_new;    /* [B, S_new, Hk, D], ptr NULL when no append */
    int64_t seqlen_new;      /* S_new, 0 when no append */
    const int32_t *cache_seqlens; /* [B] rows in use before the append (leftpad included);
                                     NULL on the CUDA backend, which reads the three below */
    /* The caller's cache_seqlens as given, for a backend whose integer tensors
     * live in device memory (prepare.c neither reads them nor fills the arrays
     * above there): rows in use of b = cache_seqlens_in ?
     * cache_seqlens_in[b * cache_seqlens_in_stride] : kv_capacity. */
    const int32_t *cache_seqlens_in; /* NULL when the caller gave none */
    int64_t cache_seqlens_in_stride; /* 0 for a rank-0 scalar */
    int64_t kv_capacity;     /* rows per cache: S_c, or max_blocks * page_size */
    const void *rotary_cos, *rotary_sin; /* [S_ro, rotary_dim/2] or NULL */
    flashc_dtype rotary_dtype;
    int64_t rotary_dim;      /* even, <= D; 0 = no rotary */
    int64_t rotary_s_row;    /* stride between rotary_cos rows, in elements */
    int64_t rotary_sin_s_row;/* stride between rotary_sin rows, in elements */
    int64_t rotary_seqlen;   /* S_ro */
    bool rotary_interleaved;
} fc_kvcache;

/* flash_attn's rule for the rotary position of the query rows: row i of
 * sequence b at cache_seqlens[b] + i when a window edge can clip a key of the
 * cache (causal: right = 0), else every row at cache_seqlens[b]. An edge at or
 * past the cache's rows (kv_capacity) is no edge, as mha_fwd_kvcache sets such
 * an edge to -1. The CUDA backend's prep kernel takes the answer as
 * q_per_row; tests/support/reference.c states the rule for the oracle. */
static inline bool fc_kv_rotary_per_row(const fc_kvcache *kc) {
    const fc_attn *a = &kc->attn;
    return (a->window_left >= 0 && a->window_left < kc->kv_capacity) ||
           (a->window_right >= 0 && a->window_right < kc->kv_capacity);
}

/* Rotary position of query row i of sequence b. */
static inline int64_t fc_rotary_q_pos(const fc_kvcache *kc, int64_t b, int64_t i) {
    return kc->cache_seqlens[b] + (fc_kv_rotary_per_row(kc) ? i : 0);
}

/* ---- backends ---- */
/* Each returns FLASHC_OK or a status with the message set. The workspace is at
 * least the size its *_workspace function reported for the same problem and is
 * aligned to FLASHC_WORKSPACE_ALIGN. */
size_t fc_cpu_fwd_workspace(const fc_attn *a);
flashc_status fc_cpu_fwd(const fc_attn *a, void *ws, size_t ws_bytes);
size_t fc_cpu_bwd_workspace(const fc_attn *a);
flashc_status fc_cpu_bwd(const fc_attn *a, void *ws, size_t ws_bytes);
size_t fc_cpu_kvcache_workspace(const fc_kvcache *kc);
flashc_status fc_cpu_kvcache(const fc_kvcache *kc, void *ws, size_t ws_bytes);

/* ---- the backend table (src/backend.c) ---- */
/* One operation of one backend, on a problem prepare.c has validated:
 *   supported  the backend's own checks (dtype, head dim, device, ...), nothing
 *              run; NULL when the backend runs every validated problem;
 *   workspace  the bytes `run` needs, asked only after `supported` said OK;
 *   run        the operation, with at least that much workspace. */
typedef struct fc_attn_op {
    flashc_status (*supported)(const fc_attn *a);
    size_t (*workspace)(const fc_attn *a);
    flashc_status (*run)(const fc_attn *a, void *ws, size_t ws_bytes);
} fc_attn_op;
typedef struct fc_kvcache_op {
    flashc_status (*supported)(const fc_kvcache *kc);
    size_t (*workspace)(const fc_kvcache *kc);
    flashc_status (*run)(const fc_kvcache *kc, void *ws, size_t ws_bytes);
} fc_kvcache_op;

/* A backend: where its tensors live, whether it can run in this process, its
 * operations, and the memory of its device for the default allocator. */
typedef struct fc_backend_impl {
    flashc_backend id;
    flashc_device device;
    int (*usable)(void);
    fc_attn_op fwd, bwd;
    fc_kvcache_op kvcache;
    void *(*malloc)(size_t bytes); /* aligned to FLASHC_WORKSPACE_ALIGN, or NULL */
    void (*free)(void *p);
} fc_backend_impl;

/* The backend CPU or CUDA, or NULL when this build has none of that id (the
 * one place that knows which backends are compiled in). */
const fc_backend_impl *fc_backend_impl_of(flashc_backend id);
/* The backend whose tensors live on dev (params.backend = auto picks it). */
flashc_backend fc_backend_of_device(flashc_device dev);

/* CPU backend settings (src/cpu/pool.c, src/cpu/simd.c). */
int fc_cpu_num_threads(void);

#ifdef __cplusplus
}
#endif

#endif /* FLASHC_INTERNAL_H */
