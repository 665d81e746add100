/* prepare.c : the first half of every public entry point of include/flashc.h
 * that runs attention: check every argument, apply the defaults, pick the
 * backend, and normalise the call into an fc_call (call.h) holding one
 * fc_attn / fc_kvcache. The counterpart of the checks in flash-attention's
 * flash_api.cpp (mha_fwd, mha_varlen_fwd, mha_bwd, mha_varlen_bwd,
 * mha_fwd_kvcache); api.c is the other half (workspace, dispatch).
 *
 * Every entry point is checked in the same order: the params, then each tensor
 * by its role (data, device, rank, dtype, strides, shape against the tensors
 * checked before it), then for host tensors the values of the integer tensors.
 * Nothing is written, so a call that fails leaves the caller's memory as it was.
 *
 * The kvcache lengths on the CPU: fc_kvcache points at two int32 [B] arrays
 * (cache_seqlens materialised, since the caller may pass a scalar or nothing,
 * and the total key lengths seqlens_k) that fc_call_kv_lengths fills in api.c's
 * part of the workspace just before the run. The backend's *_workspace
 * functions are asked for their size before those arrays exist
 * (kc.cache_seqlens and kc.attn.seqlens_k are NULL then), so they must read
 * only shapes and max lengths (fc_seqlen_k falls back to max_seqlen_k). On
 * CUDA the values live in device memory: the backend reads the caller's
 * cache_seqlens (kc.cache_seqlens_in) on the device.
 *
 * Messages start with the argument's name as spelled in the args struct or in
 * flashc_params, then its value and the reason: "k.shape[3]=128 but
 * q.shape[3]=96", "params.dropout_p=1.5 is outside [0, 1)".
 *
 * Not here: any attention arithmetic (src/cpu, src/cuda). The values of integer
 * tensors on a CUDA device are not checked: that would need a synchronising copy
 * (the kernels clamp them instead: flashc.h, "Metadata on the GPU").
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "call.h"

/* Head dims D and Dv the library takes: the CPU backend any in 1..1024 (Gemma-style
 * 512, MLA's 576/512); the CUDA backend refuses those past its instances (256) in
 * its own plan. */
#define FC_MAX_HEAD_DIM 1024


static const char *fc_device_name(flashc_device d) {
    switch (d) {
    case FLASHC_DEVICE_CPU: return "cpu";
    case FLASHC_DEVICE_CUDA: return "cuda";
    default: return "invalid";
    }
}

static bool fc_is_float(flashc_dtype dt) {
    return dt == FLASHC_DTYPE_FP32 || dt == FLASHC_DTYPE_FP16 || dt == FLASHC_DTYPE_BF16;
}

// ---- one tensor ----
/* The size one dimension must have and where it comes from, for the message:
 * another tensor's dimension (src_dim >= 0: "q.shape[3]=96") or a named value
 * (src_dim < 0: "max_seqlen_q=4"). src == NULL accepts any size, so a
 * zero-initialised fc_dim is "any". */
typedef struct fc_dim {
    int64_t n;
    const char *src;
    int src_dim;
} fc_dim;

#define FC_AS(t, name, d) ((fc_dim){(t)->shape[d], (name), (d)})
#define FC_VAL(v, name) ((fc_dim){(v), (name), -1})

typedef enum {
    FC_DT_FLOAT,        /* fp32, fp16 or bf16 (q itself, a sink) */
    FC_DT_LIKE,         /* the dtype of role.like */
    FC_DT_FP32,
    FC_DT_INT32,
    FC_DT_FP32_OR_LIKE, /* fp32 or the dtype of role.like (rotary cos / sin) */
} fc_dtype_rule;

/* What a tensor in one role must look like. */
typedef struct fc_role {
    const char *name;   /* as in the args struct: "k", "softmax_lse" */
    const char *layout; /* for the rank message: "[B, Sk, Hk, D]" */
    int ndim;
    fc_dtype_rule dtype;
    const flashc_tensor *like; /* FC_DT_LIKE, FC_DT_FP32_OR_LIKE */
    const char *like_name;
    fc_dim dim[FLASHC_MAX_DIMS];
} fc_role;

/* What the checks of one call have learnt so far. */
typedef struct fc_ctx {
    bool have_device;
    flashc_device device;     /* of the first tensor checked */
    const char *device_of;    /* its name */
    const flashc_tensor *q;   /* defines H, D (and B when batched) */
    const char *q_layout, *k_layout;
    bool varlen;
    fc_dim B;                 /* batch size and its source */
    int64_t H, Hk, D;
} fc_ctx;

static flashc_status fc_check_dtype(const flashc_tensor *t, const fc_role *r) {
    const char *n = r->name, *got = flashc_dtype_name(t->dtype);
    switch (r->dtype) {
    case FC_DT_FLOAT:
        FC_CHECK_ARG(fc_is_float(t->dtype), "%s.dtype=%s but must be fp32, fp16 or bf16", n, got);
        break;
    case FC_DT_LIKE:
        FC_CHECK_ARG(t->dtype == r->like->dtype, "%s.dtype=%s but %s.dtype=%s", n, got,
                     r->like_name, flashc_dtype_name(r->like->dtype));
        break;
    case FC_DT_FP32:
        FC_CHECK_ARG(t->dtype == FLASHC_DTYPE_FP32, "%s.dtype=%s but must be fp32", n, got);
        break;
    case FC_DT_INT32:
        FC_CHECK_ARG(t->dtype == FLASHC_DTYPE_INT32, "%s.dtype=%s but must be int32", n, got);
        break;
    case FC_DT_FP32_OR_LIKE:
        FC_CHECK_ARG(t->dtype == FLASHC_DTYPE_FP32 || t->dtype == r->like->dtype,
                     "%s.dtype=%s but must be fp32 or %s.dtype=%s", n, got, r->like_name,
                     flashc_dtype_name(r->like->dtype));
        break;
    }
    return FLASHC_OK;
}

/* Shapes and strides in range, the last dimension contiguous (any stride when
 * it holds one element or none: torch leaves such a stride as it was, and it
 * is never used), and every element's byte offset representable in int64 (so
 * no backend index overflows). */
static flashc_status fc_check_strides(const flashc_tensor *t, const char *n) {
    for (int d = 0; d < t->ndim; d++) {
        long long s = (long long)t->shape[d], st = (long long)t->stride[d];
        FC_CHECK_ARG(s >= 0, "%s.shape[%d]=%lld but must be >= 0", n, d, s);
        FC_CHECK_ARG(s <= INT32_MAX, "%s.shape[%d]=%lld exceeds INT32_MAX", n, d, s);
        FC_CHECK_ARG(st >= 0, "%s.stride[%d]=%lld but must be >= 0", n, d, st);
    }
    if (t->ndim > 0 && t->shape[t->ndim - 1] > 1)
        FC_CHECK_ARG(t->stride[t->ndim - 1] == 1, "%s.stride[%d]=%lld but must be 1", n,
                     t->ndim - 1, (long long)t->stride[t->ndim - 1]);
    int64_t esz = (int64_t)flashc_dtype_size(t->dtype); /* > 0: fc_check_dtype ran first */
    int64_t extent = 0, count = 1; /* largest element offset, number of elements */
    for (int d = 0; d < t->ndim; d++) {
        int64_t s = t->shape[d], st = t->stride[d];
        if (s == 0) {
            count = 0;
            continue;
        }
        FC_CHECK_ARG(st == 0 || s - 1 <= (INT64_MAX - extent) / st,
                     "%s: the largest element offset (sum of (shape-1)*stride) overflows int64", n);
        extent += (s - 1) * st;
        FC_CHECK_ARG(count <= INT64_MAX / s, "%s: the element count overflows int64", n);
        count *= s;
    }
    FC_CHECK_ARG(extent < INT64_MAX / esz && count <= INT64_MAX / esz,
                 "%s: the byte size of the view overflows int64", n);
    return FLASHC_OK;
}

/* The one check of a present tensor: data, device, rank, dtype, strides, shape. */
static flashc_status fc_check_tensor(fc_ctx *c, const flashc_tensor *t, const fc_role *r) {
    const char *n = r->name;
    FC_CHECK_ARG(t->data, "%s.data is NULL", n);
    FC_CHECK_ARG(t->device == FLASHC_DEVICE_CPU || t->device == FLASHC_DEVICE_CUDA,
                 "%s.device=%d is not a flashc_device", n, (int)t->device);
    if (!c->have_device) {
        c->have_device = true;
        c->device = t->device;
        c->device_of = n;
    }
    FC_CHECK_ARG(t->device == c->device, "%s.device=%s but %s.device=%s: one call uses one device",
                 n, fc_device_name(t->device), c->device_of, fc_device_name(c->device));
    FC_CHECK_ARG(t->ndim == r->ndim, "%s.ndim=%d but must be %d: %s %s", n, (int)t->ndim, r->ndim, n,
                 r->layout);
    FC_TRY(fc_check_dtype(t, r));
    FC_TRY(fc_check_strides(t, n));
    for (int d = 0; d < r->ndim; d++) {
        const fc_dim *w = &r->dim[d];
        if (!w->src || t->shape[d] == w->n) continue;
        if (w->src_dim >= 0)
            return fc_set_error(FLASHC_ERR_INVALID_ARG, "%s.shape[%d]=%lld but %s.shape[%d]=%lld", n,
                                d, (long long)t->shape[d], w->src, w->src_dim, (long long)w->n);
        return fc_set_error(FLASHC_ERR_INVALID_ARG, "%s.shape[%d]=%lld but %s=%lld", n, d,
                            (long long)t->shape[d], w->src, (long long)w->n);
    }
    return FLASHC_OK;
}

// ---- tensor roles ----
/* q: [B, Sq, H, D] batched, [total_q, H, D] varlen. Defines H, D, and B when batched. */
static flashc_status fc_check_q(fc_ctx *c, const flashc_tensor *q, bool varlen) {
    c->varlen = varlen;
    c->q_layout = varlen ? "[total_q, H, D]" : "[B, Sq, H, D]";
    fc_role r = {"q", c->q_layout, varlen ? 3 : 4, FC_DT_FLOAT, NULL, NULL, {{0}}};
    FC_TRY(fc_check_tensor(c, q, &r));
    c->q = q;
    c->H = q->shape[r.ndim - 2];
    c->D = q->shape[r.ndim - 1];
    if (!varlen) c->B = FC_AS(q, "q", 0);
    FC_CHECK_ARG(c->D >= 1 && c->D <= FC_MAX_HEAD_DIM, "q.shape[%d]=%lld but head_dim must be in 1..%d",
                 r.ndim - 1, (long long)c->D, FC_MAX_HEAD_DIM);
    return FLASHC_OK;
}

/* Same rank, shape and dtype as ref (out like q, v like k, ...). */
static flashc_status fc_check_same(fc_ctx *c, const flashc_tensor *t, const char *name,
                                   const flashc_tensor *ref, const char *ref_name,
                                   const char *layout) {
    fc_role r = {name, layout, ref->ndim, FC_DT_LIKE, ref, ref_name, {{0}}};
    for (int d = 0; d < ref->ndim; d++) r.dim[d] = FC_AS(ref, ref_name, d);
    return fc_check_tensor(c, t, &r);
}

/* Rank, dtype and every dimension of ref but the last, which is last (the
 * value head dim Dv: out like q, dv like k, but of v's head dim). */
static flashc_status fc_check_same_but_dv(fc_ctx *c, const flashc_tensor *t, const char *name,
                                          const flashc_tensor *ref, const char *ref_name,
                                          const char *layout, fc_dim last) {
    fc_role r = {name, layout, ref->ndim, FC_DT_LIKE, ref, ref_name, {{0}}};
    for (int d = 0; d < ref->ndim - 1; d++) r.dim[d] = FC_AS(ref, ref_name, d);
    r.dim[ref->ndim - 1] = last;
    return fc_check_tensor(c, t, &r);
}

/* v (or v_cache, v_new) like k but of its own head dim Dv in 1..FC_MAX_HEAD_DIM. */
static flashc_status fc_check_v(fc_ctx *c, const flashc_tensor *v, const char *name,
                                const flashc_tensor *k, const char *k_name, const char *layout) {
    FC_TRY(fc_check_same_but_dv(c, v, name, k, k_name, layout, (fc_dim){0, NULL, 0}));
    int64_t dv = v->shape[v->ndim - 1];
    FC_CHECK_ARG(dv >= 1 && dv <= FC_MAX_HEAD_DIM,
                 "%s.shape[%d]=%lld but the value head_dim must be in 1..%d", name, v->ndim - 1,
                 (long long)dv, FC_MAX_HEAD_DIM);
    return FLASHC_OK;
}

typedef enum {
    FC_KV_BATCHED, /* [B, Sk, Hk, D] */
    FC_KV_VARLEN,  /* [total_k, Hk, D] */
    FC_KV_PAGED,   /* [num_blocks, page_size, Hk, D] */
    FC_KV_CACHE,   /* [B_c, S_c, Hk, D], the contiguous kvcache */
} fc_kv_layout;

/* k or k_cache in one of the layouts above. Defines Hk. */
static flashc_status fc_check_k(fc_ctx *c, const flashc_tensor *k, const char *name,
                                fc_kv_layout layout) {
    static const char *const layouts[] = {"[B, Sk, Hk, D]", "[total_k, Hk, D]",
                                          "[num_blocks, page_size, Hk, D]", "[B_c, S_c, Hk, D]"};
    c->k_layout = layouts[layout];
    fc_role r = {name, c->k_layout, layout == FC_KV_VARLEN ? 3 : 4, FC_DT_LIKE, c->q, "q", {{0}}};
    if (layout == FC_KV_BATCHED) r.dim[0] = c->B;
    r.dim[r.ndim - 1] = FC_AS(c->q, "q", c->q->ndim - 1);
    FC_TRY(fc_check_tensor(c, k, &r));
    c->Hk = k->shape[r.ndim - 2];
    FC_CHECK_ARG(c->Hk >= 1, "%s.shape[%d]=0 but the number of KV heads must be >= 1", name,
                 r.ndim - 2);
    FC_CHECK_ARG(c->H % c->Hk == 0, "q.shape[%d]=%lld (heads) is not a multiple of %s.shape[%d]=%lld",
                 c->q->ndim - 2, (long long)c->H, name, r.ndim - 2, (long long)c->Hk);
    if (layout == FC_KV_PAGED)
        FC_CHECK_ARG(k->shape[1] >= 1, "%s.shape[1]=0 but page_size must be >= 1", name);
    return FLASHC_OK;
}

/* softmax_lse: fp32 [B, H, Sq] batched, [H, total_q] varlen. */
static flashc_status fc_check_lse(fc_ctx *c, const flashc_tensor *t, bool required) {
    if (!required && !t->data) return FLASHC_OK;
    const flashc_tensor *q = c->q;
    fc_role r = {"softmax_lse", c->varlen ? "[H, total_q]" : "[B, H, Sq]", c->varlen ? 2 : 3,
                 FC_DT_FP32, NULL, NULL, {{0}}};
    if (c->varlen) {
        r.dim[0] = FC_AS(q, "q", 1);
        r.dim[1] = FC_AS(q, "q", 0);
    } else {
        r.dim[0] = FC_AS(q, "q", 0);
        r.dim[1] = FC_AS(q, "q", 2);
        r.dim[2] = FC_AS(q, "q", 1);
    }
    return fc_check_tensor(c, t, &r);
}

/* alibi_slopes: fp32 [H] or [B, H]. */
static flashc_status fc_check_alibi(fc_ctx *c, const flashc_tensor *t) {
    if (!t->data) return FLASHC_OK;
    FC_CHECK_ARG(t->ndim == 1 || t->ndim == 2, "alibi_slopes.ndim=%d but must be 1 ([H]) or 2 ([B, H])",
                 (int)t->ndim);
    fc_role r = {"alibi_slopes", t->ndim == 1 ? "[H]" : "[B, H]", t->ndim, FC_DT_FP32, NULL, NULL,
                 {{0}}};
    fc_dim h = FC_AS(c->q, "q", c->q->ndim - 2);
    if (t->ndim == 1) {
        r.dim[0] = h;
    } else {
        r.dim[0] = c->B;
        r.dim[1] = h;
    }
    return fc_check_tensor(c, t, &r);
}

/* sink (name "sink": fp32, fp16 or bf16 [H]) or dsink (fp32 [H], only with a sink). */
static flashc_status fc_check_sink(fc_ctx *c, const flashc_tensor *t, const char *name,
                                   const flashc_tensor *sink) {
    if (!t || !t->data) return FLASHC_OK;
    if (sink) FC_CHECK_ARG(sink->data, "%s is given but sink is absent: dsink is the sink's gradient", name);
    fc_role r = {name, "[H]", 1, sink ? FC_DT_FP32 : FC_DT_FLOAT, NULL, NULL, {{0}}};
    r.dim[0] = FC_AS(c->q, "q", c->q->ndim - 2);
    return fc_check_tensor(c, t, &r);
}

/* attn_probs: fp32 [B, H, sq, sk]. */
static flashc_status fc_check_probs(fc_ctx *c, const flashc_tensor *t, fc_dim sq, fc_dim sk) {
    if (!t->data) return FLASHC_OK;
    fc_role r = {"attn_probs", "[B, H, Sq, Sk]", 4, FC_DT_FP32, NULL, NULL,
                 {c->B, FC_AS(c->q, "q", c->q->ndim - 2), sq, sk}};
    return fc_check_tensor(c, t, &r);
}

/* An int32 [B] vector (seqused_k, cache_batch_idx, cache_leftpad, cache_seqlens). */
static flashc_status fc_check_vec_b(fc_ctx *c, const flashc_tensor *t, const char *name) {
    if (!t->data) return FLASHC_OK;
    fc_role r = {name, "[B]", 1, FC_DT_INT32, NULL, NULL, {c->B}};
    return fc_check_tensor(c, t, &r);
}

/* cu_seqlens_q, cu_seqlens_k: int32 [B + 1]. Defines B. */
static flashc_status fc_check_cu_seqlens(fc_ctx *c, const flashc_tensor *cu_q,
                                         const flashc_tensor *cu_k) {
    fc_role r = {"cu_seqlens_q", "[B + 1]", 1, FC_DT_INT32, NULL, NULL, {{0}}};
    FC_TRY(fc_check_tensor(c, cu_q, &r));
    FC_CHECK_ARG(cu_q->shape[0] >= 1, "cu_seqlens_q.shape[0]=0 but must be >= 1 (B + 1)");
    c->B = FC_VAL(cu_q->shape[0] - 1, "B");
    r.name = "cu_seqlens_k";
    r.dim[0] = FC_AS(cu_q, "cu_seqlens_q", 0);
    return fc_check_tensor(c, cu_k, &r);
}

/* block_table: int32 [B, max_blocks]. */
static flashc_status fc_check_block_table(fc_ctx *c, const flashc_tensor *t) {
    if (!t->data) return FLASHC_OK;
    fc_role r = {"block_table", "[B, max_blocks]", 2, FC_DT_INT32, NULL, NULL, {c->B}};
    return fc_check_tensor(c, t, &r);
}

static flashc_status fc_check_max_seqlen(int64_t v, const char *name) {
    FC_CHECK_ARG(v >= 0 && v <= INT32_MAX, "%s=%lld is outside [0, INT32_MAX]", name, (long long)v);
    return FLASHC_OK;
}

// ---- integer tensor values (host tensors only) ----
/* Element i of an int32 tensor of rank 0 (every i reads the scalar) or 1. */
static int64_t fc_i32(const flashc_tensor *t, int64_t i) {
    const int32_t *p = (const int32_t *)t->data;
    return t->ndim == 0 ? p[0] : p[i * t->stride[0]];
}

/* cu[0] == 0, non-decreasing, every length <= max (named max_name), cu[B] <= total
 * (total < 0: no bound, as for paged keys). */
static flashc_status fc_check_cu_values(const flashc_tensor *cu, const char *name, int64_t B,
                                        int64_t max, const char *max_name, int64_t total,
                                        const char *total_src) {
    FC_CHECK_ARG(fc_i32(cu, 0) == 0, "%s[0]=%lld but must be 0", name, (long long)fc_i32(cu, 0));
    for (int64_t b = 0; b < B; b++) {
        long long lo = fc_i32(cu, b), hi = fc_i32(cu, b + 1), bb = (long long)b;
        FC_CHECK_ARG(hi >= lo, "%s[%lld]=%lld but %s[%lld]=%lld: must be non-decreasing", name, bb + 1,
                     hi, name, bb, lo);
        FC_CHECK_ARG(hi - lo <= max, "%s=%lld but sequence %lld has %lld rows (%s[%lld] - %s[%lld])",
                     max_name, (long long)max, bb, hi - lo, name, bb + 1, name, bb);
    }
    if (total >= 0)
        FC_CHECK_ARG(fc_i32(cu, B) <= total, "%s[%lld]=%lld but %s=%lld rows", name, (long long)B,
                     (long long)fc_i32(cu, B), total_src, (long long)total);
    return FLASHC_OK;
}

/* The pages of sequence b that hold rows [first, end) exist: the table is long
 * enough and each entry is in [0, num_blocks). */
static flashc_status fc_check_pages(const flashc_tensor *bt, int64_t b, int64_t first, int64_t end,
                                    int64_t num_blocks, int64_t page_size) {
    if (end <= first) return FLASHC_OK;
    int64_t max_blocks = bt->shape[1];
    FC_CHECK_ARG(end <= max_blocks * page_size,
                 "block_table.shape[1]=%lld pages of page_size=%lld rows hold %lld rows but "
                 "sequence %lld uses %lld",
                 (long long)max_blocks, (long long)page_size, (long long)(max_blocks * page_size),
                 (long long)b, (long long)end);
    const int32_t *row = (const int32_t *)bt->data + b * bt->stride[0];
    for (int64_t p = first / page_size; p <= (end - 1) / page_size; p++)
        FC_CHECK_ARG(row[p] >= 0 && row[p] < num_blocks, "block_table[%lld][%lld]=%d is outside [0, %lld)",
                     (long long)b, (long long)p, row[p], (long long)num_blocks);
    return FLASHC_OK;
}

// ---- params ----
static flashc_status fc_check_params(const flashc_params *p) {
    FC_CHECK_ARG(isfinite(p->softmax_scale) && p->softmax_scale >= 0.0f,
                 "params.softmax_scale=%g but must be finite and >= 0 (0 = 1/sqrt(head_dim) "
                 "unless params.scale_given = 1)",
                 (double)p->softmax_scale);
    FC_CHECK_ARG(p->scale_given == 0 || p->scale_given == 1,
                 "params.scale_given=%d but must be 0 or 1", (int)p->scale_given);
    FC_CHECK_ARG(p->causal == 0 || p->causal == 1, "params.causal=%d but must be 0 or 1",
                 (int)p->causal);
    FC_CHECK_ARG(p->windowed == 0 || p->windowed == 1, "params.windowed=%d but must be 0 or 1",
                 (int)p->windowed);
    FC_CHECK_ARG(p->window_left >= -1, "params.window_left=%d but must be >= -1 (-1 = unbounded)",
                 (int)p->window_left);
    FC_CHECK_ARG(p->window_right >= -1, "params.window_right=%d but must be >= -1 (-1 = unbounded)",
                 (int)p->window_right);
    /* without the flag, only the two "no window" spellings: (0, 0) of a zeroed
     * struct and flash_attn's (-1, -1); anything else (even (-1, 0), causal's
     * window) is a window the caller forgot to switch on */
    FC_CHECK_ARG(p->windowed || (p->window_left == 0 && p->window_right == 0) ||
                     (p->window_left == -1 && p->window_right == -1),
                 "params.window_left=%d, params.window_right=%d but params.windowed=0: set "
                 "windowed = 1 for a window",
                 (int)p->window_left, (int)p->window_right);
    FC_CHECK_ARG(isfinite(p->softcap) && p->softcap >= 0.0f,
                 "params.softcap=%g but must be finite and >= 0 (0 = off)", (double)p->softcap);
    FC_CHECK_ARG(p->dropout_p >= 0.0f && p->dropout_p < 1.0f, "params.dropout_p=%g is outside [0, 1)",
                 (double)p->dropout_p);
    FC_CHECK_ARG(p->deterministic == 0 || p->deterministic == 1,
                 "params.deterministic=%d but must be 0 or 1", (int)p->deterministic);
    FC_CHECK_ARG(p->rotary_halves == 0 || p->rotary_halves == 1,
                 "params.rotary_halves=%d but must be 0 or 1", (int)p->rotary_halves);
    FC_CHECK_ARG(p->num_splits >= 0, "params.num_splits=%d but must be >= 0 (0 = heuristic)",
                 (int)p->num_splits);
    FC_CHECK_ARG(p->backend >= FLASHC_BACKEND_AUTO && p->backend < FLASHC_BACKEND_COUNT,
                 "params.backend=%d is not a flashc_backend", (int)p->backend);
    return FLASHC_OK;
}

/* flash_attn 2.x's resolution into fc_attn's form: scale 0 -> 1/sqrt(D)
 * (unless given as 0: every score 0); no window (windowed = 0) -> both edges
 * -1 (unbounded); causal -> window_right = 0 (window_left is kept: causal with
 * a left window is a sliding causal window). Windows are kept as given
 * otherwise: fc_key_range clamps them to the keys. */
static void fc_resolve_options(fc_attn *a, const flashc_params *p, int64_t head_dim) {
    a->scale = p->softmax_scale > 0.0f || p->scale_given ? p->softmax_scale
                                                         : (float)(1.0 / sqrt((double)head_dim));
    a->softcap = p->softcap;
    a->causal = p->causal != 0;
    a->window_left = p->windowed ? p->window_left : -1;
    a->window_right = p->causal ? 0 : p->windowed ? p->window_right : -1;
    a->dropout_p = p->dropout_p;
    a->seed = p->dropout_seed;
    a->offset = p->dropout_offset;
    a->deterministic = p->deterministic != 0;
    a->num_splits = p->num_splits;
    a->stream = p->stream;
}

// ---- the backend ----
/* The backend that runs a call whose tensors live on c->device (every entry
 * point runs on both backends). */
static flashc_status fc_select_backend(const fc_ctx *c, flashc_backend want,
                                       const fc_backend_impl **got) {
    const char *dev = fc_device_name(c->device);
    flashc_backend b = want == FLASHC_BACKEND_AUTO ? fc_backend_of_device(c->device) : want;
    if (b == FLASHC_BACKEND_CPU)
        FC_CHECK_ARG(c->device == FLASHC_DEVICE_CPU,
                     "params.backend=cpu but %s.device=%s: the CPU backend reads host memory only",
                     c->device_of, dev);
    else
        FC_CHECK_ARG(c->device == FLASHC_DEVICE_CUDA,
                     "params.backend=cuda but %s.device=%s: the CUDA backend reads device memory only",
                     c->device_of, dev);
    const fc_backend_impl *impl = fc_backend_impl_of(b);
    if (!impl)
        return fc_set_error(FLASHC_ERR_UNSUPPORTED,
                            "%s.device=%s but this build has no %s backend (flashc_cuda_compiled() = 0)",
                            c->device_of, dev, flashc_backend_name(b));
    if (!impl->usable())
        return fc_set_error(FLASHC_ERR_UNSUPPORTED,
                            "%s.device=%s but no CUDA device of compute capability >= 8.0 is usable",
                            c->device_of, dev);
    *got = impl;
    return FLASHC_OK;
}

// ---- the normalised call ----
/* The fc_view of a [batch-or-page, seq, head, d] (rank 4) or [token, head, d]
 * (rank 3) tensor; all zero when absent. */
static fc_view fc_view_of(const flashc_tensor *t) {
    fc_view v;
    memset(&v, 0, sizeof v);
    if (!t->data) return v;
    v.ptr = t->data;
    if (t->ndim == 4) {
        v.s_batch = t->stride[0];
        v.s_seq = t->stride[1];
        v.s_head = t->stride[2];
    } else {
        v.s_seq = t->stride[0];
        v.s_head = t->stride[1];
    }
    return v;
}

/* lse, alibi and probs of a, from validated tensors (each may be absent). */
static void fc_set_extras(fc_attn *a, const flashc_tensor *lse, const flashc_tensor *alibi,
                          const flashc_tensor *probs) {
    if (lse->data) {
        a->lse = (float *)lse->data;
        bool varlen = lse->ndim == 2; /* [H, total_q] */
        a->lse_s_batch = varlen ? 0 : lse->stride[0];
        a->lse_s_head = lse->stride[varlen ? 0 : 1];
        a->lse_s_seq = lse->stride[varlen ? 1 : 2];
    }
    if (alibi->data) {
        a->alibi = (const float *)alibi->data;
        a->alibi_s_batch = alibi->ndim == 2 ? alibi->stride[0] : 0;
    }
    if (probs && probs->data) {
        a->probs = (float *)probs->data;
        a->probs_s_batch = probs->stride[0];
        a->probs_s_head = probs->stride[1];
        a->probs_s_row = probs->stride[2];
    }
}

/* sink and dsink of a, from validated tensors (each may be absent or NULL). */
static void fc_set_sink(fc_attn *a, const flashc_tensor *sink, const flashc_tensor *dsink) {
    if (sink && sink->data) {
        a->sink = sink->data;
        a->sink_s = sink->stride[0];
        a->sink_dtype = sink->dtype;
    }
    if (dsink && dsink->data) {
        a->dsink = (float *)dsink->data;
        a->dsink_s = dsink->stride[0];
    }
}

static const flashc_params *fc_params_or_default(const flashc_params *p, flashc_params *def) {
    if (p) return p;
    *def = flashc_params_default();
    return def;
}

// ---- forward and backward, batched and varlen ----
/* The tensors of flashc_fwd, flashc_varlen_fwd, flashc_bwd, flashc_varlen_bwd,
 * as pointers into their args; what an entry point lacks is NULL. */
typedef struct fc_operands {
    const flashc_tensor *q, *k, *v, *out, *lse, *alibi, *probs;
    const flashc_tensor *sink, *dsink;                          /* dsink: backward */
    const flashc_tensor *dout, *dq, *dk, *dv;                   /* backward */
    const flashc_tensor *cu_q, *cu_k, *seqused_k, *block_table; /* varlen */
    int64_t max_seqlen_q, max_seqlen_k;                         /* varlen */
} fc_operands;

/* Values of cu_seqlens, seqused_k and block_table (host tensors). */
static flashc_status fc_check_varlen_values(const fc_ctx *c, const fc_operands *o) {
    int64_t B = c->B.n;
    bool paged = o->block_table && o->block_table->data;
    FC_TRY(fc_check_cu_values(o->cu_q, "cu_seqlens_q", B, o->max_seqlen_q, "max_seqlen_q",
                              o->q->shape[0], "q.shape[0]"));
    FC_TRY(fc_check_cu_values(o->cu_k, "cu_seqlens_k", B, o->max_seqlen_k, "max_seqlen_k",
                              paged ? -1 : o->k->shape[0], "k.shape[0]"));
    for (int64_t b = 0; b < B; b++) {
        int64_t len = fc_i32(o->cu_k, b + 1) - fc_i32(o->cu_k, b);
        if (o->seqused_k && o->seqused_k->data) {
            int64_t used = fc_i32(o->seqused_k, b);
            FC_CHECK_ARG(used >= 0 && used <= len,
                         "seqused_k[%lld]=%lld is outside [0, %lld] (cu_seqlens_k[%lld] - cu_seqlens_k[%lld])",
                         (long long)b, (long long)used, (long long)len, (long long)b + 1, (long long)b);
            len = used;
        }
        if (paged)
            FC_TRY(fc_check_pages(o->block_table, b, 0, len, o->k->shape[0], o->k->shape[1]));
    }
    return FLASHC_OK;
}

static flashc_status fc_prepare_attention(const fc_operands *o, const flashc_params *p, fc_op op,
                                          fc_call *call) {
    fc_ctx c;
    memset(&c, 0, sizeof c);
    memset(call, 0, sizeof *call);
    bool varlen = o->cu_q != NULL;
    bool paged = o->block_table && o->block_table->data;

    FC_TRY(fc_check_params(p));
    FC_TRY(fc_check_q(&c, o->q, varlen));
    if (varlen) {
        FC_TRY(fc_check_cu_seqlens(&c, o->cu_q, o->cu_k));
        FC_TRY(fc_check_max_seqlen(o->max_seqlen_q, "max_seqlen_q"));
        FC_TRY(fc_check_max_seqlen(o->max_seqlen_k, "max_seqlen_k"));
    }
    FC_TRY(fc_check_k(&c, o->k, "k", !varlen ? FC_KV_BATCHED : paged ? FC_KV_PAGED : FC_KV_VARLEN));
    FC_TRY(fc_check_v(&c, o->v, "v", o->k, "k", c.k_layout));
    fc_dim dv = FC_AS(o->v, "v", o->v->ndim - 1);
    FC_TRY(fc_check_same_but_dv(&c, o->out, "out", o->q, "q", c.q_layout, dv));
    if (op == FC_OP_BWD) {
        FC_TRY(fc_check_same(&c, o->dout, "dout", o->out, "out", c.q_layout));
        FC_TRY(fc_check_same(&c, o->dq, "dq", o->q, "q", c.q_layout));
        FC_TRY(fc_check_same(&c, o->dk, "dk", o->k, "k", c.k_layout));
        FC_TRY(fc_check_same(&c, o->dv, "dv", o->v, "v", c.k_layout));
    }
    FC_TRY(fc_check_lse(&c, o->lse, op == FC_OP_BWD));
    FC_TRY(fc_check_alibi(&c, o->alibi));
    FC_TRY(fc_check_sink(&c, o->sink, "sink", NULL));
    FC_TRY(fc_check_sink(&c, o->dsink, "dsink", o->sink));
    if (o->probs) {
        fc_dim sq = varlen ? FC_VAL(o->max_seqlen_q, "max_seqlen_q") : FC_AS(o->q, "q", 1);
        fc_dim sk = varlen ? FC_VAL(o->max_seqlen_k, "max_seqlen_k") : FC_AS(o->k, "k", 1);
        FC_TRY(fc_check_probs(&c, o->probs, sq, sk));
    }
    if (varlen) {
        if (o->seqused_k) FC_TRY(fc_check_vec_b(&c, o->seqused_k, "seqused_k"));
        if (o->block_table) FC_TRY(fc_check_block_table(&c, o->block_table));
        if (c.device == FLASHC_DEVICE_CPU) FC_TRY(fc_check_varlen_values(&c, o));
    }
    FC_TRY(fc_select_backend(&c, p->backend, &call->impl));

    fc_attn *a = &call->attn;
    call->op = op;
    call->device = c.device;
    a->batch = c.B.n;
    a->heads = c.H;
    a->kv_heads = c.Hk;
    a->head_dim = c.D;
    a->head_dim_v = dv.n;
    a->dtype = o->q->dtype;
    if (varlen) {
        a->max_seqlen_q = o->max_seqlen_q;
        a->max_seqlen_k = o->max_seqlen_k;
        a->cu_seqlens_q = (const int32_t *)o->cu_q->data;
        a->cu_seqlens_k = (const int32_t *)o->cu_k->data;
        a->total_q = o->q->shape[0];
        a->total_k = o->k->shape[0];
        if (o->seqused_k && o->seqused_k->data) a->seqlens_k = (const int32_t *)o->seqused_k->data;
        if (paged) {
            a->block_table = (const int32_t *)o->block_table->data;
            a->bt_stride = o->block_table->stride[0];
            a->bt_cols = o->block_table->shape[1];
            a->page_size = o->k->shape[1];
        }
    } else {
        a->max_seqlen_q = o->q->shape[1];
        a->max_seqlen_k = o->k->shape[1];
    }
    a->q = fc_view_of(o->q);
    a->k = fc_view_of(o->k);
    a->v = fc_view_of(o->v);
    a->out = fc_view_of(o->out);
    if (op == FC_OP_BWD) {
        a->dout = fc_view_of(o->dout);
        a->dq = fc_view_of(o->dq);
        a->dk = fc_view_of(o->dk);
        a->dv = fc_view_of(o->dv);
    }
    fc_set_extras(a, o->lse, o->alibi, o->probs);
    fc_set_sink(a, o->sink, o->dsink);
    fc_resolve_options(a, p, c.D);
    return FLASHC_OK;
}

static fc_operands fc_operands_fwd(const flashc_fwd_args *x) {
    return (fc_operands){.q = &x->q, .k = &x->k, .v = &x->v, .out = &x->out,
                         .lse = &x->softmax_lse, .alibi = &x->alibi_slopes, .probs = &x->attn_probs,
                         .sink = &x->sink};
}

static fc_operands fc_operands_varlen_fwd(const flashc_varlen_fwd_args *x) {
    return (fc_operands){.q = &x->q, .k = &x->k, .v = &x->v, .out = &x->out,
                         .lse = &x->softmax_lse, .alibi = &x->alibi_slopes, .probs = &x->attn_probs,
                         .sink = &x->sink, .cu_q = &x->cu_seqlens_q, .cu_k = &x->cu_seqlens_k,
                         .seqused_k = &x->seqused_k, .block_table = &x->block_table,
                         .max_seqlen_q = x->max_seqlen_q, .max_seqlen_k = x->max_seqlen_k};
}

static fc_operands fc_operands_bwd(const flashc_bwd_args *x) {
    return (fc_operands){.q = &x->q, .k = &x->k, .v = &x->v, .out = &x->out,
                         .lse = &x->softmax_lse, .alibi = &x->alibi_slopes,
                         .sink = &x->sink, .dsink = &x->dsink,
                         .dout = &x->dout, .dq = &x->dq, .dk = &x->dk, .dv = &x->dv};
}

static fc_operands fc_operands_varlen_bwd(const flashc_varlen_bwd_args *x) {
    return (fc_operands){.q = &x->q, .k = &x->k, .v = &x->v, .out = &x->out,
                         .lse = &x->softmax_lse, .alibi = &x->alibi_slopes,
                         .sink = &x->sink, .dsink = &x->dsink,
                         .dout = &x->dout, .dq = &x->dq, .dk = &x->dk, .dv = &x->dv,
                         .cu_q = &x->cu_seqlens_q, .cu_k = &x->cu_seqlens_k,
                         .max_seqlen_q = x->max_seqlen_q, .max_seqlen_k = x->max_seqlen_k};
}

// ---- forward over a KV cache ----
/* Rows of cache b in use before the append (leftpad included; the whole cache
 * when cache_seqlens is absent) and its left padding. */
static void fc_kv_lengths(const flashc_kvcache_args *x, int64_t capacity, int64_t b, int64_t *used,
                          int64_t *pad) {
    *used = x->cache_seqlens.data ? fc_i32(&x->cache_seqlens, b) : capacity;
    *pad = x->cache_leftpad.data ? fc_i32(&x->cache_leftpad, b) : 0;
}

/* Values of cache_seqlens, cache_leftpad, cache_batch_idx, block_table and the
 * rotary table's length (host tensors). Sets the longest key length. */
static flashc_status fc_check_kvcache_values(const fc_ctx *c, const flashc_kvcache_args *x,
                                             const fc_call *call, int64_t *max_seqlen_k) {
    int64_t B = c->B.n, cap = call->kc.kv_capacity, s_new = x->k_new.data ? x->k_new.shape[1] : 0;
    int64_t sq = x->q.shape[1];
    bool paged = x->block_table.data != NULL;
    const char *cap_src = paged ? "block_table.shape[1] * page_size" : "k_cache.shape[1]";
    bool per_row = fc_kv_rotary_per_row(&call->kc);
    *max_seqlen_k = 0;
    for (int64_t b = 0; b < B; b++) {
        int64_t used, pad;
        long long bb = (long long)b;
        fc_kv_lengths(x, cap, b, &used, &pad);
        char name[48]; /* how the message names the rows in use */
        if (!x->cache_seqlens.data) snprintf(name, sizeof name, "the cache length");
        else if (x->cache_seqlens.ndim == 0) snprintf(name, sizeof name, "cache_seqlens");
        else snprintf(name, sizeof name, "cache_seqlens[%lld]", bb);
        if (x->cache_seqlens.data) {
            FC_CHECK_ARG(used >= 0, "%s=%lld but must be >= 0", name, (long long)used);
            FC_CHECK_ARG(used + s_new <= cap,
                         "%s=%lld plus k_new.shape[1]=%lld new rows exceeds the cache: %s=%lld rows",
                         name, (long long)used, (long long)s_new, cap_src, (long long)cap);
        }
        FC_CHECK_ARG(pad >= 0 && pad <= used, "cache_leftpad[%lld]=%lld is outside [0, %s=%lld]", bb,
                     (long long)pad, name, (long long)used);
        if (x->cache_batch_idx.data) {
            int64_t kb = fc_i32(&x->cache_batch_idx, b);
            FC_CHECK_ARG(kb >= 0 && kb < x->k_cache.shape[0],
                         "cache_batch_idx[%lld]=%lld is outside [0, %lld) (k_cache.shape[0])", bb,
                         (long long)kb, (long long)x->k_cache.shape[0]);
        }
        if (paged)
            FC_TRY(fc_check_pages(&x->block_table, b, pad, used + s_new, x->k_cache.shape[0],
                                  x->k_cache.shape[1]));
        if (x->rotary_cos.data) {
            int64_t need = s_new > 0 ? used + s_new : 0; /* k_new row t at position used + t */
            int64_t q_need = sq > 0 ? used + (per_row ? sq : 1) : 0;
            need = q_need > need ? q_need : need;
            FC_CHECK_ARG(need <= x->rotary_cos.shape[0],
                         "rotary_cos.shape[0]=%lld but batch %lld uses rotary positions up to %lld (%s=%lld)",
                         (long long)x->rotary_cos.shape[0], bb, (long long)need - 1, name,
                         (long long)used);
        }
        int64_t total = used - pad + s_new;
        *max_seqlen_k = total > *max_seqlen_k ? total : *max_seqlen_k;
    }
    return FLASHC_OK;
}

/* rotary_cos, rotary_sin: [S_ro, rotary_dim / 2], fp32 or q's dtype, both or neither. */
static flashc_status fc_check_rotary(fc_ctx *c, const flashc_tensor *cos_t,
                                     const flashc_tensor *sin_t) {
    FC_CHECK_ARG(cos_t->data || !sin_t->data, "rotary_cos.data is NULL but rotary_sin is given");
    FC_CHECK_ARG(sin_t->data || !cos_t->data, "rotary_sin.data is NULL but rotary_cos is given");
    if (!cos_t->data) return FLASHC_OK;
    fc_role r = {"rotary_cos", "[S_ro, rotary_dim / 2]", 2, FC_DT_FP32_OR_LIKE, c->q, "q", {{0}}};
    FC_TRY(fc_check_tensor(c, cos_t, &r));
    FC_TRY(fc_check_same(c, sin_t, "rotary_sin", cos_t, "rotary_cos", r.layout));
    int64_t half = cos_t->shape[1];
    FC_CHECK_ARG(half >= 1, "rotary_cos.shape[1]=0 but rotary_dim / 2 must be >= 1");
    FC_CHECK_ARG(2 * half <= c->D, "rotary_cos.shape[1]=%lld gives rotary_dim=%lld but q.shape[3]=%lld",
                 (long long)half, (long long)(2 * half), (long long)c->D);
    return FLASHC_OK;
}

static flashc_status fc_prepare_cache(const flashc_kvcache_args *x, const flashc_params *p,
                                      fc_call *call) {
    fc_ctx c;
    memset(&c, 0, sizeof c);
    memset(call, 0, sizeof *call);
    bool paged = x->block_table.data != NULL;

    FC_TRY(fc_check_params(p));
    FC_CHECK_ARG(p->dropout_p == 0.0f, "params.dropout_p=%g but must be 0 for flashc_fwd_kvcache",
                 (double)p->dropout_p);
    FC_TRY(fc_check_q(&c, &x->q, false));
    FC_TRY(fc_check_k(&c, &x->k_cache, "k_cache", paged ? FC_KV_PAGED : FC_KV_CACHE));
    FC_TRY(fc_check_v(&c, &x->v_cache, "v_cache", &x->k_cache, "k_cache", c.k_layout));
    fc_dim dv = FC_AS(&x->v_cache, "v_cache", 3);
    FC_CHECK_ARG(!paged || !x->cache_batch_idx.data,
                 "cache_batch_idx is given with block_table: a paged cache has no batch index");
    if (!paged && !x->cache_batch_idx.data)
        FC_CHECK_ARG(x->k_cache.shape[0] >= c.B.n,
                     "k_cache.shape[0]=%lld but q.shape[0]=%lld: without cache_batch_idx batch b "
                     "uses cache row b",
                     (long long)x->k_cache.shape[0], (long long)c.B.n);
    FC_CHECK_ARG(x->k_new.data || !x->v_new.data, "k_new.data is NULL but v_new is given");
    FC_CHECK_ARG(x->v_new.data || !x->k_new.data, "v_new.data is NULL but k_new is given");
    if (x->k_new.data) {
        fc_role r = {"k_new", "[B, S_new, Hk, D]", 4, FC_DT_LIKE, &x->q, "q",
                     {c.B, {0}, FC_AS(&x->k_cache, "k_cache", 2), FC_AS(&x->q, "q", 3)}};
        FC_TRY(fc_check_tensor(&c, &x->k_new, &r));
        FC_TRY(fc_check_same_but_dv(&c, &x->v_new, "v_new", &x->k_new, "k_new", r.layout, dv));
    }
    FC_TRY(fc_check_same_but_dv(&c, &x->out, "out", &x->q, "q", c.q_layout, dv));
    FC_TRY(fc_check_lse(&c, &x->softmax_lse, false));
    FC_TRY(fc_check_alibi(&c, &x->alibi_slopes));
    FC_TRY(fc_check_sink(&c, &x->sink, "sink", NULL));
    if (x->cache_seqlens.data && x->cache_seqlens.ndim == 0) {
        fc_role r = {"cache_seqlens", "[] or [B]", 0, FC_DT_INT32, NULL, NULL, {{0}}};
        FC_TRY(fc_check_tensor(&c, &x->cache_seqlens, &r));
    } else {
        FC_TRY(fc_check_vec_b(&c, &x->cache_seqlens, "cache_seqlens"));
    }
    FC_TRY(fc_check_vec_b(&c, &x->cache_batch_idx, "cache_batch_idx"));
    FC_TRY(fc_check_vec_b(&c, &x->cache_leftpad, "cache_leftpad"));
    FC_TRY(fc_check_block_table(&c, &x->block_table));
    FC_TRY(fc_check_rotary(&c, &x->rotary_cos, &x->rotary_sin));

    fc_kvcache *kc = &call->kc;
    fc_attn *a = &kc->attn;
    fc_resolve_options(a, p, c.D);
    /* set first: the value checks (fc_kv_rotary_per_row) read it */
    kc->kv_capacity = paged ? x->block_table.shape[1] * x->k_cache.shape[1] : x->k_cache.shape[1];
    /* shapes only, so on every device: without cache_seqlens every row is in use */
    if (!x->cache_seqlens.data && x->k_new.data && c.B.n > 0)
        FC_CHECK_ARG(x->k_new.shape[1] == 0,
                     "k_new.shape[1]=%lld but cache_seqlens is absent, so the cache of %lld rows "
                     "(%s) is full",
                     (long long)x->k_new.shape[1], (long long)kc->kv_capacity,
                     paged ? "block_table.shape[1] * page_size" : "k_cache.shape[1]");
    /* device values are not read: the capacity bounds every key length */
    a->max_seqlen_k = kc->kv_capacity;
    if (c.device == FLASHC_DEVICE_CPU) FC_TRY(fc_check_kvcache_values(&c, x, call, &a->max_seqlen_k));
    FC_TRY(fc_select_backend(&c, p->backend, &call->impl));

    call->op = FC_OP_KVCACHE;
    call->device = c.device;
    call->kv = x;
    a->batch = c.B.n;
    a->heads = c.H;
    a->kv_heads = c.Hk;
    a->head_dim = c.D;
    a->head_dim_v = dv.n;
    a->dtype = x->q.dtype;
    a->max_seqlen_q = x->q.shape[1];
    a->total_k = x->k_cache.shape[0];
    if (paged) {
        a->block_table = (const int32_t *)x->block_table.data;
        a->bt_stride = x->block_table.stride[0];
        a->bt_cols = x->block_table.shape[1];
        a->page_size = x->k_cache.shape[1];
    }
    a->k_batch_idx = (const int32_t *)x->cache_batch_idx.data;
    a->k_leftpad = (const int32_t *)x->cache_leftpad.data;
    a->q = fc_view_of(&x->q);
    a->k = fc_view_of(&x->k_cache);
    a->v = fc_view_of(&x->v_cache);
    a->out = fc_view_of(&x->out);
    fc_set_extras(a, &x->softmax_lse, &x->alibi_slopes, NULL);
    fc_set_sink(a, &x->sink, NULL);
    kc->k_new = fc_view_of(&x->k_new);
    kc->v_new = fc_view_of(&x->v_new);
    kc->seqlen_new = x->k_new.data ? x->k_new.shape[1] : 0;
    kc->cache_seqlens_in = (const int32_t *)x->cache_seqlens.data;
    kc->cache_seqlens_in_stride = x->cache_seqlens.ndim == 0 ? 0 : x->cache_seqlens.stride[0];
    if (x->rotary_cos.data) {
        kc->rotary_cos = x->rotary_cos.data;
        kc->rotary_sin = x->rotary_sin.data;
        kc->rotary_dtype = x->rotary_cos.dtype;
        kc->rotary_dim = 2 * x->rotary_cos.shape[1];
        kc->rotary_s_row = x->rotary_cos.stride[0];
        kc->rotary_sin_s_row = x->rotary_sin.stride[0];
        kc->rotary_seqlen = x->rotary_cos.shape[0];
        kc->rotary_interleaved = p->rotary_halves == 0;
    }
    /* kc->cache_seqlens and a->seqlens_k point into api.c's workspace region,
     * filled by fc_call_kv_lengths just before the backend runs. */
    return FLASHC_OK;
}

void fc_call_kv_lengths(fc_call *call, int32_t *region) {
    fc_kvcache *kc = &call->kc;
    int64_t B = kc->attn.batch;
    int32_t *used_b = region, *total_b = region + B;
    for (int64_t b = 0; b < B; b++) {
        int64_t used, pad;
        fc_kv_lengths(call->kv, kc->kv_capacity, b, &used, &pad);
        used_b[b] = (int32_t)used;
        total_b[b] = (int32_t)(used - pad + kc->seqlen_new);
    }
    kc->cache_seqlens = used_b;
    kc->attn.seqlens_k = total_b;
}


// ---- one function per entry point ----
flashc_status fc_prepare_fwd(const flashc_fwd_args *x, const flashc_params *p, fc_call *call) {
    FC_CHECK_ARG(x, "args is NULL");
    FC_TRY(fc_check_abi("args.abi", x->abi));
    flashc_params def;
    fc_operands o = fc_operands_fwd(x);
    return fc_prepare_attention(&o, fc_params_or_default(p, &def), FC_OP_FWD, call);
}

flashc_status fc_prepare_varlen_fwd(const flashc_varlen_fwd_args *x, const flashc_params *p,
                                    fc_call *call) {
    FC_CHECK_ARG(x, "args is NULL");
    FC_TRY(fc_check_abi("args.abi", x->abi));
    flashc_params def;
    fc_operands o = fc_operands_varlen_fwd(x);
    return fc_prepare_attention(&o, fc_params_or_default(p, &def), FC_OP_FWD, call);
}

flashc_status fc_prepare_bwd(const flashc_bwd_args *x, const flashc_params *p, fc_call *call) {
    FC_CHECK_ARG(x, "args is NULL");
    FC_TRY(fc_check_abi("args.abi", x->abi));
    flashc_params def;
    fc_operands o = fc_operands_bwd(x);
    return fc_prepare_attention(&o, fc_params_or_default(p, &def), FC_OP_BWD, call);
}

flashc_status fc_prepare_varlen_bwd(const flashc_varlen_bwd_args *x, const flashc_params *p,
                                    fc_call *call) {
    FC_CHECK_ARG(x, "args is NULL");
    FC_TRY(fc_check_abi("args.abi", x->abi));
    flashc_params def;
    fc_operands o = fc_operands_varlen_bwd(x);
    return fc_prepare_attention(&o, fc_params_or_default(p, &def), FC_OP_BWD, call);
}

flashc_status fc_prepare_kvcache(const flashc_kvcache_args *x, const flashc_params *p,
                                 fc_call *call) {
    FC_CHECK_ARG(x, "args is NULL");
    FC_TRY(fc_check_abi("args.abi", x->abi));
    flashc_params def;
    return fc_prepare_cache(x, fc_params_or_default(p, &def), call);
}
