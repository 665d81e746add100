/* test_bad_input.c : one case per rejected argument of every entry point.
 *
 * Each case builds a small valid problem (B=2, Sq=5, Sk=6, H=4, Hk=2, D=8, bf16,
 * CPU, contiguous, most optional tensors present), breaks exactly one thing and
 * checks what STYLE.md §6 asks of bad input:
 *   1. the status (FLASHC_ERR_INVALID_ARG unless flashc.h says otherwise),
 *   2. flashc_last_error() names the argument: a whole-token match ("k" does not
 *      match inside "k_new" or "cu_seqlens_k"), following the message convention
 *      "name=value reason" of .notes/COMMON.md,
 *   3. nothing was written: every buffer (outputs poisoned with 0xff bytes, inputs,
 *      and the KV caches) is bitwise what it was before the call.
 * The unbroken call is a case too (".../valid_ok"), so a broken base problem shows.
 * FLASHC_TEST_VERBOSE=1 prints every case's status and message.
 *
 * Cases are data: a case names the base problems (kinds) it applies to, whether it
 * runs the entry point, its *_workspace_size query or both, and up to four edits.
 * Case names are "bad/<kind>/<what>" for runs and "bad/<kind>_ws/<what>" for
 * queries. Checks that need the contents of integer tensors (cu_seqlens values,
 * block_table entries, cache_seqlens values) and NULL data pointers run on the
 * entry point only: a size query may legitimately not read them.
 *
 * Not here: numerical correctness (the sweep tests), CUDA tensors when a CUDA
 * backend is available (the all-CUDA case is skipped then, since host pointers
 * marked as device memory would reach a kernel).
 */
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fc_test.h"

// ---- the base problems ----

enum { BI_B = 2, BI_SQ = 5, BI_SK = 6, BI_H = 4, BI_HK = 2, BI_D = 8 };
/* kvcache: q rows, appended rows, cache batch rows, cache rows, page size */
enum { BI_KV_SQ = 2, BI_KV_SNEW = 2, BI_KV_BC = 3, BI_KV_SC = 8, BI_KV_PS = 4 };
/* varlen paged: rows per page */
enum { BI_VP_PS = 2 };
/* The larger problem for workspace cases whose small problem needs no workspace:
 * every sequence length times BI_BIG. */
enum { BI_BIG = 64 };

typedef enum {
    K_FWD,      /* flashc_fwd */
    K_VFWD,     /* flashc_varlen_fwd, packed k/v, with seqused_k */
    K_VPAGED,   /* flashc_varlen_fwd, paged k/v through block_table */
    K_BWD,      /* flashc_bwd */
    K_VBWD,     /* flashc_varlen_bwd */
    K_KV,       /* flashc_fwd_kvcache, contiguous cache, append + rotary + batch idx + leftpad */
    K_KVPAGED,  /* flashc_fwd_kvcache, paged cache, append + rotary */
    K_COUNT
} bi_kind;

static const char *const bi_kind_name[K_COUNT] = {
    "fwd", "varlen_fwd", "varlen_paged", "bwd", "varlen_bwd", "kvcache", "kvcache_paged"};

#define KM(k) (1u << (k))
#define M_ALL (KM(K_COUNT) - 1u)
#define M_KVS (KM(K_KV) | KM(K_KVPAGED))
#define M_NOKV (M_ALL & ~M_KVS)
#define M_FWDL (KM(K_FWD) | KM(K_VFWD) | KM(K_VPAGED))
#define M_BWDL (KM(K_BWD) | KM(K_VBWD))
#define M_VAR (KM(K_VFWD) | KM(K_VPAGED) | KM(K_VBWD))
#define M_VARU (KM(K_VFWD) | KM(K_VBWD))
#define M_BATCHED (KM(K_FWD) | KM(K_BWD) | KM(K_KV) | KM(K_KVPAGED)) /* 4-d q, 3-d lse */

typedef enum { BI_RUN = 1, BI_QUERY = 2 } bi_call_kind;
#define RQ (BI_RUN | BI_QUERY)

typedef enum { R_IN, R_OUT, R_INT } bi_role;

typedef struct {
    const char *name;
    flashc_tensor *field; /* where the tensor sits in the args struct */
    flashc_tensor spare;  /* the prepared view of a tensor the base leaves absent */
    void *mem;
    size_t bytes;
} bi_buf;

typedef struct {
    bi_kind kind;
    union {
        flashc_fwd_args fwd;
        flashc_varlen_fwd_args vfwd;
        flashc_bwd_args bwd;
        flashc_varlen_bwd_args vbwd;
        flashc_kvcache_args kv;
    } a;
    flashc_params p;
    int64_t *max_q, *max_k; /* varlen max_seqlen fields, NULL otherwise */
    bi_buf buf[24];
    int nbuf;
} bi_problem;

/* Recompute row-major strides from the shape. */
static void bi_recontig(flashc_tensor *t) {
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        t->stride[i] = s;
        s *= t->shape[i] > 0 ? t->shape[i] : 1;
    }
}

/* Add a tensor of shape `shape` (nd dims) at `field`. The buffer holds `factor`
 * times its fp32 size, so edits that grow a dimension or widen the dtype still
 * describe memory that exists. spare = 1 prepares the tensor but leaves it absent. */
static void bi_add(bi_problem *pr, const char *name, flashc_tensor *field, flashc_dtype dt, int nd,
                   const int64_t *shape, bi_role role, int factor, int spare) {
    bi_buf *b = &pr->buf[pr->nbuf++];
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= shape[i];
    size_t elems = (size_t)n * (size_t)factor + 64;
    b->name = name;
    b->field = field;
    b->bytes = elems * 4;
    b->mem = malloc(b->bytes);
    if (role == R_OUT) memset(b->mem, 0xff, b->bytes); /* NaN in every float dtype */
    else if (role == R_INT) memset(b->mem, 0, b->bytes);
    else fc_fill_random(b->mem, dt, (int64_t)(b->bytes / flashc_dtype_size(dt)), -1.0, 1.0);
    flashc_tensor t = flashc_tensor_contiguous(b->mem, dt, nd, shape, FLASHC_DEVICE_CPU);
    if (spare) b->spare = t;
    else *field = t;
}

static bi_buf *bi_find(bi_problem *pr, const char *name) {
    for (int i = 0; i < pr->nbuf; i++)
        if (strcmp(pr->buf[i].name, name) == 0) return &pr->buf[i];
    return NULL;
}

static int32_t *bi_ints(bi_problem *pr, const char *name) {
    return (int32_t *)bi_find(pr, name)->mem;
}

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})

/* The base problem of `kind`, every sequence length times m. */
static void bi_build(bi_problem *pr, bi_kind kind, int64_t m) {
    memset(pr, 0, sizeof *pr);
    pr->a.fwd.abi = FLASHC_ABI_VERSION; /* every args struct starts with abi */
    pr->kind = kind;
    pr->p = flashc_params_default();
    const int f = m == 1 ? 129 : 1; /* room for D = 1025 in the small problem */
    const flashc_dtype BF = FLASHC_DTYPE_BF16, F32 = FLASHC_DTYPE_FP32, I32 = FLASHC_DTYPE_INT32;
    const int64_t B = BI_B, H = BI_H, HK = BI_HK, D = BI_D;
    switch (kind) {
    case K_FWD: {
        // q, out: (B, Sq, H, D)  k, v: (B, Sk, Hk, D)  lse: (B, H, Sq)  alibi: (H)
        // attn_probs: (B, H, Sq, Sk)
        flashc_fwd_args *a = &pr->a.fwd;
        int64_t sq = BI_SQ * m, sk = BI_SK * m;
        bi_add(pr, "q", &a->q, BF, 4, SHAPE(B, sq, H, D), R_IN, f, 0);
        bi_add(pr, "k", &a->k, BF, 4, SHAPE(B, sk, HK, D), R_IN, f, 0);
        bi_add(pr, "v", &a->v, BF, 4, SHAPE(B, sk, HK, D), R_IN, f, 0);
        bi_add(pr, "out", &a->out, BF, 4, SHAPE(B, sq, H, D), R_OUT, f, 0);
        bi_add(pr, "softmax_lse", &a->softmax_lse, F32, 3, SHAPE(B, H, sq), R_OUT, f, 0);
        bi_add(pr, "alibi_slopes", &a->alibi_slopes, F32, 1, SHAPE(H), R_IN, f, 0);
        if (m == 1)
            bi_add(pr, "attn_probs", &a->attn_probs, F32, 4, SHAPE(B, H, sq, sk), R_OUT, f, 0);
        break;
    }
    case K_BWD: {
        // dout, q, out, dq: (B, Sq, H, D)  k, v, dk, dv: (B, Sk, Hk, D)  lse: (B, H, Sq)
        flashc_bwd_args *a = &pr->a.bwd;
        int64_t sq = BI_SQ * m, sk = BI_SK * m;
        bi_add(pr, "dout", &a->dout, BF, 4, SHAPE(B, sq, H, D), R_IN, f, 0);
        bi_add(pr, "q", &a->q, BF, 4, SHAPE(B, sq, H, D), R_IN, f, 0);
        bi_add(pr, "k", &a->k, BF, 4, SHAPE(B, sk, HK, D), R_IN, f, 0);
        bi_add(pr, "v", &a->v, BF, 4, SHAPE(B, sk, HK, D), R_IN, f, 0);
        bi_add(pr, "out", &a->out, BF, 4, SHAPE(B, sq, H, D), R_IN, f, 0);
        bi_add(pr, "softmax_lse", &a->softmax_lse, F32, 3, SHAPE(B, H, sq), R_IN, f, 0);
        bi_add(pr, "dq", &a->dq, BF, 4, SHAPE(B, sq, H, D), R_OUT, f, 0);
        bi_add(pr, "dk", &a->dk, BF, 4, SHAPE(B, sk, HK, D), R_OUT, f, 0);
        bi_add(pr, "dv", &a->dv, BF, 4, SHAPE(B, sk, HK, D), R_OUT, f, 0);
        bi_add(pr, "alibi_slopes", &a->alibi_slopes, F32, 1, SHAPE(H), R_IN, f, 0);
        break;
    }
    case K_VFWD:
    case K_VPAGED: {
        // sequence lengths q {2m, 3m}, k {3m, 4m}; max_seqlen one above the longest
        // q, out: (total_q, H, D)  k, v: (total_k, Hk, D) or paged (num_blocks, 2, Hk, D)
        // lse: (H, total_q)  alibi: (B, H)  attn_probs: (B, H, max_q, max_k)
        flashc_varlen_fwd_args *a = &pr->a.vfwd;
        int64_t tq = 5 * m, tk = 7 * m;
        a->max_seqlen_q = 3 * m + 1;
        a->max_seqlen_k = 4 * m + 1;
        pr->max_q = &a->max_seqlen_q;
        pr->max_k = &a->max_seqlen_k;
        bi_add(pr, "q", &a->q, BF, 3, SHAPE(tq, H, D), R_IN, f, 0);
        if (kind == K_VFWD) {
            bi_add(pr, "k", &a->k, BF, 3, SHAPE(tk, HK, D), R_IN, f, 0);
            bi_add(pr, "v", &a->v, BF, 3, SHAPE(tk, HK, D), R_IN, f, 0);
            bi_add(pr, "seqused_k", &a->seqused_k, I32, 1, SHAPE(B), R_INT, f, 0);
            int32_t *su = bi_ints(pr, "seqused_k");
            su[0] = (int32_t)(3 * m);
            su[1] = (int32_t)(4 * m);
        } else {
            int64_t mb = 2 * m + 1, nb = B * mb; /* blocks per sequence, blocks in all */
            bi_add(pr, "k", &a->k, BF, 4, SHAPE(nb, BI_VP_PS, HK, D), R_IN, f, 0);
            bi_add(pr, "v", &a->v, BF, 4, SHAPE(nb, BI_VP_PS, HK, D), R_IN, f, 0);
            bi_add(pr, "block_table", &a->block_table, I32, 2, SHAPE(B, mb), R_INT, f, 0);
            int32_t *bt = bi_ints(pr, "block_table");
            for (int64_t i = 0; i < nb; i++) bt[i] = (int32_t)(nb - 1 - i); /* small: {5,4,3},{2,1,0} */
        }
        bi_add(pr, "out", &a->out, BF, 3, SHAPE(tq, H, D), R_OUT, f, 0);
        bi_add(pr, "cu_seqlens_q", &a->cu_seqlens_q, I32, 1, SHAPE(B + 1), R_INT, f, 0);
        bi_add(pr, "cu_seqlens_k", &a->cu_seqlens_k, I32, 1, SHAPE(B + 1), R_INT, f, 0);
        int32_t *cq = bi_ints(pr, "cu_seqlens_q"), *ck = bi_ints(pr, "cu_seqlens_k");
        cq[1] = (int32_t)(2 * m);
        cq[2] = (int32_t)tq;
        ck[1] = (int32_t)(3 * m);
        ck[2] = (int32_t)tk;
        bi_add(pr, "softmax_lse", &a->softmax_lse, F32, 2, SHAPE(H, tq), R_OUT, f, 0);
        bi_add(pr, "alibi_slopes", &a->alibi_slopes, F32, 2, SHAPE(B, H), R_IN, f, 0);
        if (m == 1)
            bi_add(pr, "attn_probs", &a->attn_probs, F32, 4,
                   SHAPE(B, H, a->max_seqlen_q, a->max_seqlen_k), R_OUT, f, 0);
        break;
    }
    case K_VBWD: {
        // as K_VFWD; dout, q, out, dq: (total_q, H, D)  k, v, dk, dv: (total_k, Hk, D)
        flashc_varlen_bwd_args *a = &pr->a.vbwd;
        int64_t tq = 5 * m, tk = 7 * m;
        a->max_seqlen_q = 3 * m + 1;
        a->max_seqlen_k = 4 * m + 1;
        pr->max_q = &a->max_seqlen_q;
        pr->max_k = &a->max_seqlen_k;
        bi_add(pr, "dout", &a->dout, BF, 3, SHAPE(tq, H, D), R_IN, f, 0);
        bi_add(pr, "q", &a->q, BF, 3, SHAPE(tq, H, D), R_IN, f, 0);
        bi_add(pr, "k", &a->k, BF, 3, SHAPE(tk, HK, D), R_IN, f, 0);
        bi_add(pr, "v", &a->v, BF, 3, SHAPE(tk, HK, D), R_IN, f, 0);
        bi_add(pr, "out", &a->out, BF, 3, SHAPE(tq, H, D), R_IN, f, 0);
        bi_add(pr, "softmax_lse", &a->softmax_lse, F32, 2, SHAPE(H, tq), R_IN, f, 0);
        bi_add(pr, "dq", &a->dq, BF, 3, SHAPE(tq, H, D), R_OUT, f, 0);
        bi_add(pr, "dk", &a->dk, BF, 3, SHAPE(tk, HK, D), R_OUT, f, 0);
        bi_add(pr, "dv", &a->dv, BF, 3, SHAPE(tk, HK, D), R_OUT, f, 0);
        bi_add(pr, "cu_seqlens_q", &a->cu_seqlens_q, I32, 1, SHAPE(B + 1), R_INT, f, 0);
        bi_add(pr, "cu_seqlens_k", &a->cu_seqlens_k, I32, 1, SHAPE(B + 1), R_INT, f, 0);
        int32_t *cq = bi_ints(pr, "cu_seqlens_q"), *ck = bi_ints(pr, "cu_seqlens_k");
        cq[1] = (int32_t)(2 * m);
        cq[2] = (int32_t)tq;
        ck[1] = (int32_t)(3 * m);
        ck[2] = (int32_t)tk;
        bi_add(pr, "alibi_slopes", &a->alibi_slopes, F32, 1, SHAPE(H), R_IN, f, 0);
        break;
    }
    case K_KV:
    case K_KVPAGED: {
        // q, out: (B, 2, H, D)  k_new, v_new: (B, 2, Hk, D)  cache_seqlens {3m, 5m}
        // contiguous caches (3, 8m, Hk, D) with cache_batch_idx {2, 0}, cache_leftpad {1, 0};
        // paged caches (num_blocks, 4, Hk, D) with block_table (B, 2m)
        // rotary_cos, rotary_sin: (8m, 2) fp32, rotary_dim 4  lse: (B, H, 2)  alibi: (H)
        flashc_kvcache_args *a = &pr->a.kv;
        int64_t rows = BI_KV_SC * m; /* cache rows per sequence */
        bi_add(pr, "q", &a->q, BF, 4, SHAPE(B, BI_KV_SQ, H, D), R_IN, f, 0);
        if (kind == K_KV) {
            bi_add(pr, "k_cache", &a->k_cache, BF, 4, SHAPE(BI_KV_BC, rows, HK, D), R_IN, f, 0);
            bi_add(pr, "v_cache", &a->v_cache, BF, 4, SHAPE(BI_KV_BC, rows, HK, D), R_IN, f, 0);
            bi_add(pr, "cache_batch_idx", &a->cache_batch_idx, I32, 1, SHAPE(B), R_INT, f, 0);
            bi_add(pr, "cache_leftpad", &a->cache_leftpad, I32, 1, SHAPE(B), R_INT, f, 0);
            int32_t *bidx = bi_ints(pr, "cache_batch_idx"), *lp = bi_ints(pr, "cache_leftpad");
            bidx[0] = 2;
            bidx[1] = 0;
            lp[0] = 1;
            lp[1] = 0;
        } else {
            int64_t mb = rows / BI_KV_PS, nb = B * mb + 1;
            bi_add(pr, "k_cache", &a->k_cache, BF, 4, SHAPE(nb, BI_KV_PS, HK, D), R_IN, f, 0);
            bi_add(pr, "v_cache", &a->v_cache, BF, 4, SHAPE(nb, BI_KV_PS, HK, D), R_IN, f, 0);
            bi_add(pr, "block_table", &a->block_table, I32, 2, SHAPE(B, mb), R_INT, f, 0);
            int32_t *bt = bi_ints(pr, "block_table");
            for (int64_t i = 0; i < B * mb; i++) bt[i] = (int32_t)(nb - 1 - i); /* small: {4,3},{2,1} */
            bi_add(pr, "cache_batch_idx", &a->cache_batch_idx, I32, 1, SHAPE(B), R_INT, f, 1);
            int32_t *bidx = (int32_t *)bi_find(pr, "cache_batch_idx")->mem;
            bidx[0] = 0;
            bidx[1] = 1;
        }
        bi_add(pr, "k_new", &a->k_new, BF, 4, SHAPE(B, BI_KV_SNEW, HK, D), R_IN, f, 0);
        bi_add(pr, "v_new", &a->v_new, BF, 4, SHAPE(B, BI_KV_SNEW, HK, D), R_IN, f, 0);
        bi_add(pr, "cache_seqlens", &a->cache_seqlens, I32, 1, SHAPE(B), R_INT, f, 0);
        int32_t *cs = bi_ints(pr, "cache_seqlens");
        cs[0] = (int32_t)(3 * m);
        cs[1] = (int32_t)(5 * m);
        bi_add(pr, "rotary_cos", &a->rotary_cos, F32, 2, SHAPE(rows, 2), R_IN, f, 0);
        bi_add(pr, "rotary_sin", &a->rotary_sin, F32, 2, SHAPE(rows, 2), R_IN, f, 0);
        bi_add(pr, "alibi_slopes", &a->alibi_slopes, F32, 1, SHAPE(H), R_IN, f, 0);
        bi_add(pr, "out", &a->out, BF, 4, SHAPE(B, BI_KV_SQ, H, D), R_OUT, f, 0);
        bi_add(pr, "softmax_lse", &a->softmax_lse, F32, 3, SHAPE(B, H, BI_KV_SQ), R_OUT, f, 0);
        if (m > 1) pr->p.num_splits = 4; /* split-KV partials live in the workspace */
        break;
    }
    default: break;
    }
    bi_buf *al = bi_find(pr, "alibi_slopes");
    fc_fill_random(al->mem, F32, (int64_t)(al->bytes / 4), 0.0, 1.0); /* slopes >= 0 */
}

static void bi_free(bi_problem *pr) {
    for (int i = 0; i < pr->nbuf; i++) free(pr->buf[i].mem);
    pr->nbuf = 0;
}

static flashc_status bi_call(bi_problem *pr, bi_call_kind call, const void *args,
                             const flashc_params *p, void *ws, size_t ws_bytes, size_t *bytes) {
    int q = call == BI_QUERY;
    switch (pr->kind) {
    case K_FWD:
        return q ? flashc_fwd_workspace_size((const flashc_fwd_args *)args, p, bytes)
                 : flashc_fwd((const flashc_fwd_args *)args, p, ws, ws_bytes);
    case K_VFWD:
    case K_VPAGED:
        return q ? flashc_varlen_fwd_workspace_size((const flashc_varlen_fwd_args *)args, p, bytes)
                 : flashc_varlen_fwd((const flashc_varlen_fwd_args *)args, p, ws, ws_bytes);
    case K_BWD:
        return q ? flashc_bwd_workspace_size((const flashc_bwd_args *)args, p, bytes)
                 : flashc_bwd((const flashc_bwd_args *)args, p, ws, ws_bytes);
    case K_VBWD:
        return q ? flashc_varlen_bwd_workspace_size((const flashc_varlen_bwd_args *)args, p, bytes)
                 : flashc_varlen_bwd((const flashc_varlen_bwd_args *)args, p, ws, ws_bytes);
    default:
        return q ? flashc_fwd_kvcache_workspace_size((const flashc_kvcache_args *)args, p, bytes)
                 : flashc_fwd_kvcache((const flashc_kvcache_args *)args, p, ws, ws_bytes);
    }
}

// ---- edits ----

typedef enum {
    OP_END = 0,
    OP_NULL,        /* t.data = NULL (an optional tensor becomes absent) */
    OP_ATTACH,      /* attach the spare tensor t */
    OP_DTYPE,       /* t.dtype = v */
    OP_SHAPE,       /* t.shape[i] = v, strides kept (i < 0 counts from the end) */
    OP_SHAPE_ADD,   /* t.shape[i] += v, strides kept */
    OP_RESHAPE,     /* t.shape[i] = v, strides made contiguous */
    OP_STRIDE,      /* t.stride[i] = v */
    OP_STRIDE_NEG,  /* t.stride[i] = -t.stride[i] */
    OP_NDIM,        /* t.ndim = v, shape and strides as they are */
    OP_NDIM_ADD,    /* t.ndim += v, a new dim of size 1, strides made contiguous */
    OP_SET2,        /* t = contiguous 2-d [v, i] */
    OP_DEVICE,      /* t.device = CUDA */
    OP_ALL_CUDA,    /* every tensor on CUDA */
    OP_INT,         /* int32 element i of t's memory = v */
    OP_PF,          /* float param t = f */
    OP_PI,          /* int param t = v */
    OP_MAXQ,        /* max_seqlen_q = v */
    OP_MAXK,        /* max_seqlen_k = v */
    OP_HEADDIM,     /* D = v on every tensor with a head dim (rotary dropped if it no longer fits) */
    OP_KVHEADS,     /* Hk = v on every key/value tensor */
    OP_ARGS_NULL,
    OP_PARAMS_NULL,
    OP_BYTES_NULL,
    OP_WS_SMALL,     /* workspace_bytes = needed - 1 */
    OP_WS_MISALIGNED,/* workspace 8 bytes past a 256-byte boundary */
    OP_WS_NULL       /* workspace NULL with workspace_bytes = needed */
} bi_opcode;

typedef struct {
    bi_opcode op;
    const char *t;
    int64_t i;
    int64_t v;
    double f;
} bi_op;

#define NUL(t) {OP_NULL, t, 0, 0, 0}
#define ATTACH(t) {OP_ATTACH, t, 0, 0, 0}
#define DT(t, d) {OP_DTYPE, t, 0, d, 0}
#define SHP(t, i, v) {OP_SHAPE, t, i, v, 0}
#define SHPADD(t, i, v) {OP_SHAPE_ADD, t, i, v, 0}
#define RSH(t, i, v) {OP_RESHAPE, t, i, v, 0}
#define STR(t, i, v) {OP_STRIDE, t, i, v, 0}
#define STRNEG(t, i) {OP_STRIDE_NEG, t, i, 0, 0}
#define NDIM(t, v) {OP_NDIM, t, 0, v, 0}
#define NDIMADD(t, v) {OP_NDIM_ADD, t, 0, v, 0}
#define SET2(t, a, b) {OP_SET2, t, b, a, 0}
#define DEV(t) {OP_DEVICE, t, 0, 0, 0}
#define INT(t, i, v) {OP_INT, t, i, v, 0}
#define PF(name, x) {OP_PF, name, 0, 0, x}
#define PI(name, x) {OP_PI, name, 0, x, 0}
#define MAXQ(v) {OP_MAXQ, NULL, 0, v, 0}
#define MAXK(v) {OP_MAXK, NULL, 0, v, 0}
#define HEADDIM(v) {OP_HEADDIM, NULL, 0, v, 0}
#define KVHEADS(v) {OP_KVHEADS, NULL, 0, v, 0}
#define SIMPLE(op) {op, NULL, 0, 0, 0}

#define ST(s) (1u << (s))
#define INV ST(FLASHC_ERR_INVALID_ARG)
#define UNS ST(FLASHC_ERR_UNSUPPORTED)
#define WSS ST(FLASHC_ERR_WORKSPACE_TOO_SMALL)
#define OKS ST(FLASHC_OK)

enum { BI_NEEDS_NO_CUDA = 1 }; /* skipped when a CUDA backend is available */

typedef struct {
    const char *name;
    unsigned kinds;     /* KM() bits */
    unsigned calls;     /* BI_RUN / BI_QUERY */
    bi_op ops[4];
    unsigned accept;    /* ST() bits */
    const char *tokens; /* "a|b": the message must contain one of these names */
    unsigned flags;
} bi_case;

static const char *const bi_dlike[] = {"q", "k", "v", "out", "dout", "dq", "dk", "dv",
                                       "k_cache", "v_cache", "k_new", "v_new"};
static const char *const bi_kvlike[] = {"k", "v", "dk", "dv", "k_cache", "v_cache", "k_new", "v_new"};

static int bi_dim(const flashc_tensor *t, int64_t i) { return (int)(i < 0 ? t->ndim + i : i); }

static float *bi_param_f(flashc_params *p, const char *name) {
    if (!strcmp(name, "softmax_scale")) return &p->softmax_scale;
    if (!strcmp(name, "softcap")) return &p->softcap;
    if (!strcmp(name, "dropout_p")) return &p->dropout_p;
    return NULL;
}

static int32_t *bi_param_i(flashc_params *p, const char *name) {
    if (!strcmp(name, "causal")) return &p->causal;
    if (!strcmp(name, "windowed")) return &p->windowed;
    if (!strcmp(name, "window_left")) return &p->window_left;
    if (!strcmp(name, "window_right")) return &p->window_right;
    if (!strcmp(name, "num_splits")) return &p->num_splits;
    if (!strcmp(name, "backend")) return (int32_t *)&p->backend;
    return NULL;
}

/* Resize dimension i (from the end when < 0) of every tensor in names[] that is present. */
static void bi_reshape_all(bi_problem *pr, const char *const *names, int n, int64_t i, int64_t v) {
    for (int k = 0; k < n; k++) {
        bi_buf *b = bi_find(pr, names[k]);
        if (!b || !b->field->data) continue;
        b->field->shape[bi_dim(b->field, i)] = v;
        bi_recontig(b->field);
    }
}

/* Apply one edit to the problem (not the workspace ones). Returns 0 on a case bug. */
static int bi_apply(bi_problem *pr, const bi_op *o, const void **args, const flashc_params **pp,
                    size_t **bytes) {
    flashc_tensor *t = NULL;
    bi_buf *b = NULL;
    if (o->t && o->op != OP_PF && o->op != OP_PI) {
        b = bi_find(pr, o->t);
        if (!b) return 0;
        t = b->field;
    }
    switch (o->op) {
    case OP_NULL: t->data = NULL; break;
    case OP_ATTACH: *t = b->spare; break;
    case OP_DTYPE: t->dtype = (flashc_dtype)o->v; break;
    case OP_SHAPE: t->shape[bi_dim(t, o->i)] = o->v; break;
    case OP_SHAPE_ADD: t->shape[bi_dim(t, o->i)] += o->v; break;
    case OP_RESHAPE:
        t->shape[bi_dim(t, o->i)] = o->v;
        bi_recontig(t);
        break;
    case OP_STRIDE: t->stride[bi_dim(t, o->i)] = o->v; break;
    case OP_STRIDE_NEG: t->stride[bi_dim(t, o->i)] *= -1; break;
    case OP_NDIM: t->ndim = (int32_t)o->v; break;
    case OP_NDIM_ADD: {
        int32_t nd = t->ndim + (int32_t)o->v;
        for (int d = t->ndim; d < nd; d++) t->shape[d] = 1;
        t->ndim = nd;
        bi_recontig(t);
        break;
    }
    case OP_SET2:
        t->ndim = 2;
        t->shape[0] = o->v;
        t->shape[1] = o->i;
        bi_recontig(t);
        break;
    case OP_DEVICE: t->device = FLASHC_DEVICE_CUDA; break;
    case OP_ALL_CUDA:
        for (int k = 0; k < pr->nbuf; k++) pr->buf[k].field->device = FLASHC_DEVICE_CUDA;
        break;
    case OP_INT: ((int32_t *)b->mem)[o->i] = (int32_t)o->v; break;
    case OP_PF: {
        float *f = bi_param_f(&pr->p, o->t);
        if (!f) return 0;
        *f = (float)o->f;
        break;
    }
    case OP_PI: {
        int32_t *v = bi_param_i(&pr->p, o->t);
        if (!v) return 0;
        *v = (int32_t)o->v;
        break;
    }
    case OP_MAXQ:
        if (!pr->max_q) return 0;
        *pr->max_q = o->v;
        break;
    case OP_MAXK:
        if (!pr->max_k) return 0;
        *pr->max_k = o->v;
        break;
    case OP_HEADDIM: {
        bi_reshape_all(pr, bi_dlike, (int)(sizeof bi_dlike / sizeof *bi_dlike), -1, o->v);
        bi_buf *cos = bi_find(pr, "rotary_cos"), *sin = bi_find(pr, "rotary_sin");
        if (cos && 2 * cos->field->shape[1] > o->v) {
            cos->field->data = NULL;
            sin->field->data = NULL;
        }
        break;
    }
    case OP_KVHEADS:
        bi_reshape_all(pr, bi_kvlike, (int)(sizeof bi_kvlike / sizeof *bi_kvlike), -2, o->v);
        break;
    case OP_ARGS_NULL: *args = NULL; break;
    case OP_PARAMS_NULL: *pp = NULL; break;
    case OP_BYTES_NULL: *bytes = NULL; break;
    default: return 0;
    }
    return 1;
}

// ---- the cases ----

#define ALL M_ALL
#define BI_HUGE ((int64_t)1 << 60) /* a length whose extent overflows int64 */

static const bi_case bi_cases[] = {
    /* every entry point */
    {"valid_ok", ALL, RQ, {{OP_END}}, OKS, NULL, 0},
    {"null_args", ALL, RQ, {SIMPLE(OP_ARGS_NULL)}, INV, "args", 0},
    /* flashc.h does not say whether params = NULL means the defaults or is an error */
    {"null_params", ALL, RQ, {SIMPLE(OP_PARAMS_NULL)}, INV | OKS, "params", 0},
    {"null_bytes", ALL, BI_QUERY, {SIMPLE(OP_BYTES_NULL)}, INV, "bytes", 0},
    {"null_q_data", ALL, BI_RUN, {NUL("q")}, INV, "q", 0},
    {"null_out_data", ALL, BI_RUN, {NUL("out")}, INV, "out", 0},
    {"q_dtype_invalid", ALL, RQ, {DT("q", 99)}, INV, "q", 0},
    {"q_dtype_int32", ALL, RQ, {DT("q", FLASHC_DTYPE_INT32)}, INV, "q", 0},
    {"out_dtype_fp16", ALL, RQ, {DT("out", FLASHC_DTYPE_FP16)}, INV, "out", 0},
    {"q_last_stride_2", ALL, RQ, {STR("q", -1, 2)}, INV, "q", 0},
    {"out_last_stride_0", ALL, RQ, {STR("out", -1, 0)}, INV, "out", 0},
    {"q_stride_negative", ALL, RQ, {STRNEG("q", -3)}, INV, "q", 0},
    {"q_stride_overflow", ALL, RQ, {STR("q", 0, INT64_MAX)}, INV, "q", 0},
    {"q_stride_bytes_overflow", ALL, RQ, {STR("q", 0, (int64_t)1 << 62)}, INV, "q", 0},
    {"q_rank_minus_1", ALL, RQ, {NDIMADD("q", -1)}, INV, "q", 0},
    {"q_rank_5", ALL, RQ, {NDIM("q", 5)}, INV, "q", 0},
    {"q_rank_negative", ALL, RQ, {NDIM("q", -1)}, INV, "q", 0},
    {"q_shape_negative", ALL, RQ, {SHP("q", -3, -1)}, INV, "q", 0},
    {"q_shape_d", ALL, RQ, {SHPADD("q", -1, -1)}, INV, "q", 0},
    {"q_shape_batch", M_BATCHED, RQ, {SHPADD("q", 0, -1)}, INV, "q", 0},
    {"out_shape_d", ALL, RQ, {SHPADD("out", -1, -1)}, INV, "out", 0},
    {"out_shape_heads", ALL, RQ, {SHPADD("out", -2, -1)}, INV, "out", 0},
    {"out_shape_seq", ALL, RQ, {SHPADD("out", -3, -1)}, INV, "out", 0},
    {"out_shape_batch", M_BATCHED, RQ, {SHPADD("out", 0, -1)}, INV, "out", 0},
    {"out_rank_minus_1", ALL, RQ, {NDIMADD("out", -1)}, INV, "out", 0},
    {"head_dim_0", ALL, RQ, {HEADDIM(0)}, INV, "q|head_dim", 0},
    {"head_dim_1025", ALL, RQ, {HEADDIM(1025)}, INV | UNS, "q|head_dim", 0},
    {"kv_heads_not_divisor", ALL, RQ, {KVHEADS(3)}, INV, "q|k|k_cache", 0},
    {"kv_heads_0", ALL, RQ, {KVHEADS(0)}, INV, "q|k|k_cache", 0},
    {"softmax_lse_dtype_bf16", ALL, RQ, {DT("softmax_lse", FLASHC_DTYPE_BF16)}, INV, "softmax_lse", 0},
    {"softmax_lse_shape_heads", ALL, RQ, {SHPADD("softmax_lse", -2, -1)}, INV, "softmax_lse", 0},
    {"softmax_lse_shape_seq", ALL, RQ, {SHPADD("softmax_lse", -1, -1)}, INV, "softmax_lse", 0},
    {"softmax_lse_shape_batch", M_BATCHED, RQ, {SHPADD("softmax_lse", 0, -1)}, INV, "softmax_lse", 0},
    {"softmax_lse_rank_minus_1", ALL, RQ, {NDIMADD("softmax_lse", -1)}, INV, "softmax_lse", 0},
    {"softmax_lse_last_stride_2", ALL, RQ, {STR("softmax_lse", -1, 2)}, INV, "softmax_lse", 0},
    {"alibi_dtype_bf16", ALL, RQ, {DT("alibi_slopes", FLASHC_DTYPE_BF16)}, INV, "alibi_slopes", 0},
    {"alibi_shape_heads", ALL, RQ, {SHPADD("alibi_slopes", -1, -1)}, INV, "alibi_slopes", 0},
    {"alibi_shape_batch", ALL, RQ, {SET2("alibi_slopes", BI_B + 1, BI_H)}, INV, "alibi_slopes", 0},
    {"alibi_rank_3", ALL, RQ, {SET2("alibi_slopes", BI_B, BI_H), NDIMADD("alibi_slopes", 1)}, INV,
     "alibi_slopes", 0},
    {"softmax_scale_negative", ALL, RQ, {PF("softmax_scale", -1.0)}, INV, "softmax_scale", 0},
    {"softmax_scale_nan", ALL, RQ, {PF("softmax_scale", NAN)}, INV, "softmax_scale", 0},
    {"softcap_negative", ALL, RQ, {PF("softcap", -1.0)}, INV, "softcap", 0},
    {"softcap_nan", ALL, RQ, {PF("softcap", NAN)}, INV, "softcap", 0},
    {"windowed_2", ALL, RQ, {PI("windowed", 2)}, INV, "windowed", 0},
    {"window_off_left_3", ALL, RQ, {PI("window_left", 3)}, INV, "windowed", 0},
    {"window_left_m2", ALL, RQ, {PI("windowed", 1), PI("window_left", -2)}, INV, "window_left", 0},
    {"window_right_m5", ALL, RQ, {PI("windowed", 1), PI("window_right", -5)}, INV, "window_right", 0},
    {"causal_2", ALL, RQ, {PI("causal", 2)}, INV, "causal", 0},
    {"backend_99", ALL, RQ, {PI("backend", 99)}, INV, "backend", 0},
    {"backend_m1", ALL, RQ, {PI("backend", -1)}, INV, "backend", 0},
    {"backend_cuda_cpu_tensors", ALL, RQ, {PI("backend", FLASHC_BACKEND_CUDA)}, INV | UNS,
     "backend|q|cuda|CUDA", 0},
    {"all_tensors_cuda", ALL, RQ, {SIMPLE(OP_ALL_CUDA)}, INV | UNS, "q|backend|cuda|CUDA",
     BI_NEEDS_NO_CUDA},
    {"mixed_devices_out", ALL, RQ, {DEV("out")}, INV | UNS, "out|backend|cuda|CUDA", 0},
    {"mixed_devices_softmax_lse", ALL, RQ, {DEV("softmax_lse")}, INV | UNS,
     "softmax_lse|backend|cuda|CUDA", 0},
    {"workspace_too_small", ALL, BI_RUN, {SIMPLE(OP_WS_SMALL)}, WSS, "workspace|workspace_bytes", 0},
    {"workspace_misaligned", ALL, BI_RUN, {SIMPLE(OP_WS_MISALIGNED)}, INV, "workspace", 0},
    {"workspace_null_with_bytes", ALL, BI_RUN, {SIMPLE(OP_WS_NULL)}, INV,
     "workspace|workspace_bytes", 0},

    /* entry points with plain k, v (forward, varlen, backward) */
    {"null_k_data", M_NOKV, BI_RUN, {NUL("k")}, INV, "k", 0},
    {"null_v_data", M_NOKV, BI_RUN, {NUL("v")}, INV, "v", 0},
    {"k_dtype_fp16", M_NOKV, RQ, {DT("k", FLASHC_DTYPE_FP16)}, INV, "k", 0},
    {"v_dtype_fp32", M_NOKV, RQ, {DT("v", FLASHC_DTYPE_FP32)}, INV, "v", 0},
    {"k_shape_d", M_NOKV, RQ, {SHPADD("k", -1, -1)}, INV, "k", 0},
    {"v_shape_d", M_NOKV, RQ, {SHPADD("v", -1, -1)}, INV, "v", 0},
    {"v_shape_d_zero", M_NOKV, RQ, {RSH("v", -1, 0)}, INV, "v", 0},
    {"v_shape_d_1025", M_NOKV, RQ, {RSH("v", -1, 1025)}, INV, "v", 0},
    {"out_shape_d_of_q", M_FWDL, RQ, {RSH("v", -1, 4)}, INV, "out", 0},
    {"v_shape_heads", M_NOKV, RQ, {SHPADD("v", -2, -1)}, INV, "v", 0},
    {"v_shape_seq", M_NOKV, RQ, {SHPADD("v", -3, -1)}, INV, "v", 0},
    {"k_shape_batch", KM(K_FWD) | KM(K_BWD), RQ, {SHPADD("k", 0, -1)}, INV, "k", 0},
    {"v_shape_batch", KM(K_FWD) | KM(K_BWD), RQ, {SHPADD("v", 0, -1)}, INV, "v", 0},
    {"k_rank_minus_1", M_NOKV, RQ, {NDIMADD("k", -1)}, INV, "k", 0},
    {"k_last_stride_2", M_NOKV, RQ, {STR("k", -1, 2)}, INV, "k", 0},
    {"v_stride_negative", M_NOKV, RQ, {STRNEG("v", -2)}, INV, "v", 0},
    {"kv_shape_overflow", M_NOKV, RQ, {SHP("k", -3, BI_HUGE), SHP("v", -3, BI_HUGE)}, INV, "k|v", 0},
    {"k_stride_overflow", M_NOKV, RQ, {STR("k", 0, (int64_t)1 << 62), STR("k", 1, (int64_t)1 << 62)},
     INV, "k", 0},
    {"mixed_devices_k", M_NOKV, RQ, {DEV("k")}, INV | UNS, "k|backend|cuda|CUDA", 0},
    {"dropout_p_m0.1", M_NOKV, RQ, {PF("dropout_p", -0.1)}, INV, "dropout_p", 0},
    {"dropout_p_1.0", M_NOKV, RQ, {PF("dropout_p", 1.0)}, INV, "dropout_p", 0},
    {"dropout_p_1.5", M_NOKV, RQ, {PF("dropout_p", 1.5)}, INV, "dropout_p", 0},
    {"dropout_p_nan", M_NOKV, RQ, {PF("dropout_p", NAN)}, INV, "dropout_p", 0},

    /* forward: attn_probs */
    {"attn_probs_dtype_bf16", M_FWDL, RQ, {DT("attn_probs", FLASHC_DTYPE_BF16)}, INV, "attn_probs", 0},
    {"attn_probs_shape_cols", M_FWDL, RQ, {SHPADD("attn_probs", -1, -1)}, INV, "attn_probs", 0},
    {"attn_probs_shape_rows", M_FWDL, RQ, {SHPADD("attn_probs", -2, -1)}, INV, "attn_probs", 0},
    {"attn_probs_rank_minus_1", M_FWDL, RQ, {NDIMADD("attn_probs", -1)}, INV, "attn_probs", 0},

    /* varlen: cu_seqlens, max_seqlen */
    {"null_cu_seqlens_q_data", M_VAR, BI_RUN, {NUL("cu_seqlens_q")}, INV, "cu_seqlens_q", 0},
    {"null_cu_seqlens_k_data", M_VAR, BI_RUN, {NUL("cu_seqlens_k")}, INV, "cu_seqlens_k", 0},
    {"cu_seqlens_q_dtype_fp32", M_VAR, RQ, {DT("cu_seqlens_q", FLASHC_DTYPE_FP32)}, INV,
     "cu_seqlens_q", 0},
    {"cu_seqlens_k_dtype_fp32", M_VAR, RQ, {DT("cu_seqlens_k", FLASHC_DTYPE_FP32)}, INV,
     "cu_seqlens_k", 0},
    {"cu_seqlens_q_rank_2", M_VAR, RQ, {NDIMADD("cu_seqlens_q", 1)}, INV, "cu_seqlens_q", 0},
    {"cu_seqlens_k_length", M_VAR, RQ, {SHPADD("cu_seqlens_k", 0, -1)}, INV,
     "cu_seqlens_k|cu_seqlens_q", 0},
    {"cu_seqlens_q_first_1", M_VAR, BI_RUN, {INT("cu_seqlens_q", 0, 1)}, INV, "cu_seqlens_q", 0},
    {"cu_seqlens_k_first_1", M_VAR, BI_RUN, {INT("cu_seqlens_k", 0, 1)}, INV, "cu_seqlens_k", 0},
    {"cu_seqlens_q_decreasing", M_VAR, BI_RUN, {INT("cu_seqlens_q", 2, 1)}, INV, "cu_seqlens_q", 0},
    {"cu_seqlens_k_decreasing", M_VAR, BI_RUN, {INT("cu_seqlens_k", 2, 2)}, INV, "cu_seqlens_k", 0},
    {"cu_seqlens_q_past_total", M_VAR, BI_RUN, {INT("cu_seqlens_q", 2, 6)}, INV, "cu_seqlens_q", 0},
    {"cu_seqlens_k_past_total", M_VARU, BI_RUN, {INT("cu_seqlens_k", 2, 8)}, INV, "cu_seqlens_k", 0},
    {"max_seqlen_q_short", M_VAR, BI_RUN, {MAXQ(2)}, INV, "max_seqlen_q", 0},
    {"max_seqlen_k_short", M_VAR, BI_RUN, {MAXK(3)}, INV, "max_seqlen_k", 0},
    {"max_seqlen_q_negative", M_VAR, RQ, {MAXQ(-1)}, INV, "max_seqlen_q", 0},
    {"max_seqlen_k_negative", M_VAR, RQ, {MAXK(-1)}, INV, "max_seqlen_k", 0},
    {"k_shape_total", M_VARU, BI_RUN, {SHPADD("k", 0, -1), SHPADD("v", 0, -1)}, INV,
     "k|v|cu_seqlens_k", 0},
    {"q_shape_total", M_VAR, BI_RUN, {SHPADD("q", 0, -1)}, INV, "q|cu_seqlens_q", 0},
    {"mixed_devices_cu_seqlens_q", M_VAR, RQ, {DEV("cu_seqlens_q")}, INV | UNS,
     "cu_seqlens_q|backend|cuda|CUDA", 0},

    /* varlen forward: seqused_k */
    {"seqused_k_negative", KM(K_VFWD), BI_RUN, {INT("seqused_k", 0, -1)}, INV, "seqused_k", 0},
    {"seqused_k_past_seqlen", KM(K_VFWD), BI_RUN, {INT("seqused_k", 1, 5)}, INV, "seqused_k", 0},
    {"seqused_k_dtype_fp32", KM(K_VFWD), RQ, {DT("seqused_k", FLASHC_DTYPE_FP32)}, INV, "seqused_k", 0},
    {"seqused_k_length", KM(K_VFWD), RQ, {SHPADD("seqused_k", 0, 1)}, INV, "seqused_k", 0},

    /* varlen forward, paged */
    {"block_table_negative", KM(K_VPAGED), BI_RUN, {INT("block_table", 3, -1)}, INV, "block_table", 0},
    {"block_table_past_num_blocks", KM(K_VPAGED), BI_RUN, {INT("block_table", 1, 6)}, INV,
     "block_table", 0},
    {"block_table_dtype_fp32", KM(K_VPAGED), RQ, {DT("block_table", FLASHC_DTYPE_FP32)}, INV,
     "block_table", 0},
    {"block_table_batch", KM(K_VPAGED), RQ, {SHPADD("block_table", 0, 1)}, INV, "block_table", 0},
    {"block_table_rank_1", KM(K_VPAGED), RQ, {NDIMADD("block_table", -1)}, INV, "block_table", 0},
    {"block_table_last_stride_2", KM(K_VPAGED), RQ, {STR("block_table", -1, 2)}, INV, "block_table", 0},
    {"block_table_too_few_blocks", KM(K_VPAGED), BI_RUN, {SHP("block_table", 1, 1)}, INV,
     "block_table|cu_seqlens_k|max_seqlen_k", 0},
    {"page_size_0", KM(K_VPAGED), RQ, {SHP("k", 1, 0), SHP("v", 1, 0)}, INV,
     "k|v|page_size|block_table", 0},
    {"mixed_devices_block_table", KM(K_VPAGED), RQ, {DEV("block_table")}, INV | UNS,
     "block_table|backend|cuda|CUDA", 0},

    /* backward */
    {"null_dout_data", M_BWDL, BI_RUN, {NUL("dout")}, INV, "dout", 0},
    {"null_softmax_lse_data", M_BWDL, BI_RUN, {NUL("softmax_lse")}, INV, "softmax_lse", 0},
    {"null_dq_data", M_BWDL, BI_RUN, {NUL("dq")}, INV, "dq", 0},
    {"null_dk_data", M_BWDL, BI_RUN, {NUL("dk")}, INV, "dk", 0},
    {"null_dv_data", M_BWDL, BI_RUN, {NUL("dv")}, INV, "dv", 0},
    {"dout_dtype_fp16", M_BWDL, RQ, {DT("dout", FLASHC_DTYPE_FP16)}, INV, "dout", 0},
    {"dq_dtype_fp32", M_BWDL, RQ, {DT("dq", FLASHC_DTYPE_FP32)}, INV, "dq", 0},
    {"dk_dtype_fp16", M_BWDL, RQ, {DT("dk", FLASHC_DTYPE_FP16)}, INV, "dk", 0},
    {"dv_dtype_fp16", M_BWDL, RQ, {DT("dv", FLASHC_DTYPE_FP16)}, INV, "dv", 0},
#define BI_DIMS(t)                                                                              \
    {t "_shape_d", M_BWDL, RQ, {SHPADD(t, -1, -1)}, INV, t, 0},                                 \
    {t "_shape_heads", M_BWDL, RQ, {SHPADD(t, -2, -1)}, INV, t, 0},                             \
    {t "_shape_seq", M_BWDL, RQ, {SHPADD(t, -3, -1)}, INV, t, 0},                               \
    {t "_shape_batch", KM(K_BWD), RQ, {SHPADD(t, 0, -1)}, INV, t, 0}
    BI_DIMS("dout"), BI_DIMS("dq"), BI_DIMS("dk"), BI_DIMS("dv"),
#undef BI_DIMS
    /* a value head dim Dv = 4 != D = 8 where one tensor kept D */
    {"dv_shape_d_of_k", M_BWDL, RQ, {RSH("v", -1, 4), RSH("out", -1, 4), RSH("dout", -1, 4)}, INV,
     "dv", 0},
    {"dout_shape_d_of_q", M_BWDL, RQ, {RSH("v", -1, 4), RSH("out", -1, 4), RSH("dv", -1, 4)}, INV,
     "dout", 0},
    {"out_shape_d_of_q_bwd", M_BWDL, RQ,
     {RSH("v", -1, 4), RSH("dout", -1, 4), RSH("dv", -1, 4)}, INV, "dout|out", 0},
    {"dq_last_stride_2", M_BWDL, RQ, {STR("dq", -1, 2)}, INV, "dq", 0},
    {"dk_stride_negative", M_BWDL, RQ, {STRNEG("dk", -3)}, INV, "dk", 0},
    {"mixed_devices_dq", M_BWDL, RQ, {DEV("dq")}, INV | UNS, "dq|backend|cuda|CUDA", 0},

    /* kvcache */
    {"null_k_cache_data", M_KVS, BI_RUN, {NUL("k_cache")}, INV, "k_cache", 0},
    {"null_v_cache_data", M_KVS, BI_RUN, {NUL("v_cache")}, INV, "v_cache", 0},
    {"k_new_without_v_new", M_KVS, RQ, {NUL("v_new")}, INV, "v_new|k_new", 0},
    {"v_new_without_k_new", M_KVS, RQ, {NUL("k_new")}, INV, "v_new|k_new", 0},
    {"k_new_dtype_fp16", M_KVS, RQ, {DT("k_new", FLASHC_DTYPE_FP16)}, INV, "k_new", 0},
    {"k_cache_dtype_fp16", M_KVS, RQ, {DT("k_cache", FLASHC_DTYPE_FP16)}, INV, "k_cache", 0},
    {"v_cache_dtype_fp32", M_KVS, RQ, {DT("v_cache", FLASHC_DTYPE_FP32)}, INV, "v_cache", 0},
    {"v_new_shape_seq", M_KVS, RQ, {SHPADD("v_new", 1, -1)}, INV, "v_new|k_new", 0},
    {"k_new_shape_batch", M_KVS, RQ, {SHPADD("k_new", 0, -1)}, INV, "k_new", 0},
    {"k_new_shape_d", M_KVS, RQ, {SHPADD("k_new", -1, -1)}, INV, "k_new", 0},
    {"k_new_shape_heads", M_KVS, RQ, {SHPADD("k_new", -2, -1)}, INV, "k_new", 0},
    {"v_new_shape_batch", M_KVS, RQ, {SHPADD("v_new", 0, -1)}, INV, "v_new|k_new", 0},
    {"v_new_shape_heads", M_KVS, RQ, {SHPADD("v_new", -2, -1)}, INV, "v_new|k_new", 0},
    {"v_new_shape_d", M_KVS, RQ, {SHPADD("v_new", -1, -1)}, INV, "v_new|k_new", 0},
    {"k_cache_shape_d", M_KVS, RQ, {SHPADD("k_cache", -1, -1)}, INV, "k_cache", 0},
    {"v_cache_shape_heads", M_KVS, RQ, {SHPADD("v_cache", -2, -1)}, INV, "v_cache", 0},
    {"v_cache_shape_seq", M_KVS, RQ, {SHPADD("v_cache", 1, -1)}, INV, "v_cache|k_cache", 0},
    {"v_cache_shape_batch", M_KVS, RQ, {SHPADD("v_cache", 0, -1)}, INV, "v_cache|k_cache", 0},
    {"v_cache_shape_d", M_KVS, RQ, {SHPADD("v_cache", -1, -1)}, INV, "v_cache|k_cache", 0},
    {"v_cache_shape_d_1025", M_KVS, RQ, {RSH("v_cache", -1, 1025)}, INV, "v_cache", 0},
    {"out_shape_d_of_q_kv", M_KVS, RQ, {RSH("v_cache", -1, 4), RSH("v_new", -1, 4)}, INV, "out",
     0},
    {"v_new_shape_d_of_k", M_KVS, RQ, {RSH("v_cache", -1, 4), RSH("out", -1, 4)}, INV,
     "v_new", 0},
    {"k_cache_rank_minus_1", M_KVS, RQ, {NDIMADD("k_cache", -1)}, INV, "k_cache", 0},
    {"k_cache_last_stride_2", M_KVS, RQ, {STR("k_cache", -1, 2)}, INV, "k_cache", 0},
    {"k_cache_stride_negative", M_KVS, RQ, {STRNEG("k_cache", 1)}, INV, "k_cache", 0},
    {"cache_shape_overflow", M_KVS, RQ, {SHP("k_cache", 1, BI_HUGE), SHP("v_cache", 1, BI_HUGE)}, INV,
     "k_cache|v_cache", 0},
    {"cache_too_small_for_append", M_KVS, BI_RUN, {INT("cache_seqlens", 1, 7)}, INV,
     "cache_seqlens|k_cache|block_table", 0},
    {"cache_seqlens_negative", M_KVS, BI_RUN, {INT("cache_seqlens", 0, -1)}, INV, "cache_seqlens", 0},
    {"cache_seqlens_dtype_fp32", M_KVS, RQ, {DT("cache_seqlens", FLASHC_DTYPE_FP32)}, INV,
     "cache_seqlens", 0},
    {"cache_seqlens_length", M_KVS, RQ, {SHPADD("cache_seqlens", 0, 1)}, INV, "cache_seqlens", 0},
    {"cache_seqlens_rank_2", M_KVS, RQ, {NDIMADD("cache_seqlens", 1)}, INV, "cache_seqlens", 0},
    {"valid_cache_seqlens_scalar", M_KVS, RQ, {NDIM("cache_seqlens", 0)}, OKS, NULL, 0},
    {"cache_seqlens_scalar_negative", M_KVS, BI_RUN,
     {NDIM("cache_seqlens", 0), INT("cache_seqlens", 0, -1)}, INV, "cache_seqlens", 0},
    {"cache_seqlens_scalar_too_big", M_KVS, BI_RUN,
     {NDIM("cache_seqlens", 0), INT("cache_seqlens", 0, 7)}, INV, "cache_seqlens|k_cache|block_table",
     0},
    {"rotary_dim_past_head_dim", M_KVS, RQ, {RSH("rotary_cos", 1, 5), RSH("rotary_sin", 1, 5)}, INV,
     "rotary_cos|rotary_sin", 0},
    {"rotary_cos_sin_mismatch", M_KVS, RQ, {RSH("rotary_sin", 1, 1)}, INV, "rotary_cos|rotary_sin", 0},
    {"rotary_table_short", M_KVS, BI_RUN, {RSH("rotary_cos", 0, 4), RSH("rotary_sin", 0, 4)}, INV,
     "rotary_cos|rotary_sin", 0},
    {"rotary_sin_absent", M_KVS, RQ, {NUL("rotary_sin")}, INV, "rotary_cos|rotary_sin", 0},
    {"rotary_cos_absent", M_KVS, RQ, {NUL("rotary_cos")}, INV, "rotary_cos|rotary_sin", 0},
    {"rotary_dtype_fp16", M_KVS, RQ,
     {DT("rotary_cos", FLASHC_DTYPE_FP16), DT("rotary_sin", FLASHC_DTYPE_FP16)}, INV,
     "rotary_cos|rotary_sin", 0},
    {"rotary_rank_1", M_KVS, RQ, {NDIMADD("rotary_cos", -1), NDIMADD("rotary_sin", -1)}, INV,
     "rotary_cos|rotary_sin", 0},
    {"dropout_p_0.1", M_KVS, RQ, {PF("dropout_p", 0.1)}, INV, "dropout_p", 0},
    {"dropout_p_1.5", M_KVS, RQ, {PF("dropout_p", 1.5)}, INV, "dropout_p", 0},
    {"num_splits_negative", M_KVS, RQ, {PI("num_splits", -1)}, INV, "num_splits", 0},
    {"mixed_devices_k_cache", M_KVS, RQ, {DEV("k_cache")}, INV | UNS, "k_cache|backend|cuda|CUDA", 0},
    {"mixed_devices_k_new", M_KVS, RQ, {DEV("k_new")}, INV | UNS, "k_new|backend|cuda|CUDA", 0},
    {"mixed_devices_cache_seqlens", M_KVS, RQ, {DEV("cache_seqlens")}, INV | UNS,
     "cache_seqlens|backend|cuda|CUDA", 0},

    /* kvcache, contiguous cache */
    {"cache_rows_too_few", KM(K_KV), BI_RUN, {SHP("k_cache", 1, 6), SHP("v_cache", 1, 6)}, INV,
     "k_cache|v_cache|cache_seqlens", 0},
    {"cache_batch_idx_past_cache", KM(K_KV), BI_RUN, {INT("cache_batch_idx", 0, BI_KV_BC)}, INV,
     "cache_batch_idx", 0},
    {"cache_batch_idx_negative", KM(K_KV), BI_RUN, {INT("cache_batch_idx", 1, -1)}, INV,
     "cache_batch_idx", 0},
    {"cache_batch_idx_dtype_fp32", KM(K_KV), RQ, {DT("cache_batch_idx", FLASHC_DTYPE_FP32)}, INV,
     "cache_batch_idx", 0},
    {"cache_batch_idx_length", KM(K_KV), RQ, {SHPADD("cache_batch_idx", 0, -1)}, INV,
     "cache_batch_idx", 0},
    {"cache_batch_absent_cache_short", KM(K_KV), RQ,
     {NUL("cache_batch_idx"), SHP("k_cache", 0, 1), SHP("v_cache", 0, 1)}, INV, "k_cache|v_cache", 0},
    {"cache_leftpad_negative", KM(K_KV), BI_RUN, {INT("cache_leftpad", 0, -1)}, INV, "cache_leftpad", 0},
    {"cache_leftpad_past_keys", KM(K_KV), BI_RUN, {INT("cache_leftpad", 0, 6)}, INV, "cache_leftpad", 0},
    {"cache_leftpad_dtype_fp32", KM(K_KV), RQ, {DT("cache_leftpad", FLASHC_DTYPE_FP32)}, INV,
     "cache_leftpad", 0},

    /* kvcache, paged cache */
    {"block_table_negative", KM(K_KVPAGED), BI_RUN, {INT("block_table", 2, -1)}, INV, "block_table", 0},
    {"block_table_past_num_blocks", KM(K_KVPAGED), BI_RUN, {INT("block_table", 1, 5)}, INV,
     "block_table", 0},
    {"block_table_dtype_fp32", KM(K_KVPAGED), RQ, {DT("block_table", FLASHC_DTYPE_FP32)}, INV,
     "block_table", 0},
    {"block_table_batch", KM(K_KVPAGED), RQ, {SHPADD("block_table", 0, -1)}, INV, "block_table", 0},
    {"block_table_rank_1", KM(K_KVPAGED), RQ, {NDIMADD("block_table", -1)}, INV, "block_table", 0},
    {"block_table_too_few_blocks", KM(K_KVPAGED), BI_RUN, {SHP("block_table", 1, 1)}, INV,
     "block_table|cache_seqlens|k_cache", 0},
    {"page_size_0", KM(K_KVPAGED), RQ, {SHP("k_cache", 1, 0), SHP("v_cache", 1, 0)}, INV,
     "k_cache|v_cache|page_size|block_table", 0},
    {"cache_batch_idx_with_paged", KM(K_KVPAGED), RQ, {ATTACH("cache_batch_idx")}, INV,
     "cache_batch_idx", 0},
};

// ---- running one case ----

typedef struct {
    const bi_case *c;
    bi_kind kind;
    bi_call_kind call;
    char name[96];
} bi_inst;

static int bi_ident(char ch) { return isalnum((unsigned char)ch) || ch == '_'; }

/* 1 if msg contains tok as a whole identifier token. */
static int bi_has_token(const char *msg, const char *tok, size_t n) {
    for (const char *p = msg; (p = strstr(p, tok)) != NULL; p++) {
        if ((p == msg || !bi_ident(p[-1])) && !bi_ident(p[n])) return 1;
    }
    return 0;
}

/* 1 if msg contains one of the '|'-separated tokens. */
static int bi_names_one(const char *msg, const char *tokens) {
    char tok[64];
    for (const char *s = tokens; *s;) {
        const char *e = strchr(s, '|');
        size_t n = e ? (size_t)(e - s) : strlen(s);
        if (n < sizeof tok) {
            memcpy(tok, s, n);
            tok[n] = '\0';
            if (bi_has_token(msg, tok, n)) return 1;
        }
        s += n + (e ? 1 : 0);
    }
    return 0;
}

static bi_opcode bi_ws_op(const bi_case *c) {
    for (int i = 0; i < 4; i++)
        if (c->ops[i].op >= OP_WS_SMALL) return c->ops[i].op;
    return OP_END;
}

static void bi_run(const void *param) {
    const bi_inst *in = (const bi_inst *)param;
    const bi_case *c = in->c;
    bi_problem pr;
    unsigned char *snap[24] = {0};
    void *ws_mem = NULL;
    if ((c->flags & BI_NEEDS_NO_CUDA) && flashc_backend_available(FLASHC_BACKEND_CUDA)) {
        printf("  note %s: skipped, a CUDA backend is available\n", in->name);
        return;
    }
    bi_build(&pr, in->kind, 1);

    /* workspace: sized by the valid problem for the workspace cases and the valid run */
    bi_opcode wop = bi_ws_op(c);
    int may_pass = (c->accept & OKS) != 0;
    void *ws = NULL;
    size_t ws_bytes = 0, need = 0;
    if (wop != OP_END || (may_pass && in->call == BI_RUN)) {
        flashc_status s = bi_call(&pr, BI_QUERY, &pr.a, &pr.p, NULL, 0, &need);
        if (s != FLASHC_OK) {
            fc_test_fail(__FILE__, __LINE__, "workspace query of the valid problem: %s (%s)",
                         flashc_status_string(s), flashc_last_error());
            goto done;
        }
        if (wop != OP_END && need == 0) {
            bi_free(&pr);
            bi_build(&pr, in->kind, BI_BIG);
            s = bi_call(&pr, BI_QUERY, &pr.a, &pr.p, NULL, 0, &need);
            if (s != FLASHC_OK) {
                fc_test_fail(__FILE__, __LINE__, "workspace query of the larger problem: %s (%s)",
                             flashc_status_string(s), flashc_last_error());
                goto done;
            }
            if (need == 0) {
                printf("  note %s: skipped, no workspace needed even with lengths x%d\n", in->name,
                       BI_BIG);
                goto done;
            }
        }
        if (need > 0) {
            size_t cap = (need + 2 * FLASHC_WORKSPACE_ALIGN) / FLASHC_WORKSPACE_ALIGN *
                         FLASHC_WORKSPACE_ALIGN;
            ws_mem = aligned_alloc(FLASHC_WORKSPACE_ALIGN, cap);
            ws = ws_mem;
            ws_bytes = need;
        }
    }

    /* the edits */
    const void *args = &pr.a;
    const flashc_params *pp = &pr.p;
    size_t bytes_out = 0, *bytes = &bytes_out;
    for (int i = 0; i < 4 && c->ops[i].op != OP_END; i++) {
        switch (c->ops[i].op) {
        case OP_WS_SMALL: ws_bytes = need - 1; break;
        case OP_WS_MISALIGNED: ws = (char *)ws_mem + 8; break;
        case OP_WS_NULL: ws = NULL; break;
        default:
            if (!bi_apply(&pr, &c->ops[i], &args, &pp, &bytes)) {
                fc_test_fail(__FILE__, __LINE__, "case bug: edit %d does not apply to %s", i,
                             bi_kind_name[in->kind]);
                goto done;
            }
        }
    }

    for (int i = 0; i < pr.nbuf; i++) {
        snap[i] = (unsigned char *)malloc(pr.buf[i].bytes);
        memcpy(snap[i], pr.buf[i].mem, pr.buf[i].bytes);
    }
    flashc_status s = bi_call(&pr, in->call, args, pp, ws, ws_bytes, bytes);
    const char *msg = flashc_last_error();
    if (getenv("FLASHC_TEST_VERBOSE")) printf("  %-56s %s: %s\n", in->name, flashc_status_string(s), msg);

    /* 1. the status */
    if (!(c->accept & ST(s)))
        fc_test_fail(__FILE__, __LINE__, "status %s (%d) is not the one expected; last error: \"%s\"",
                     flashc_status_string(s), (int)s, msg);
    if (!c->tokens || (s == FLASHC_OK && (c->accept & OKS))) goto done; /* a valid call may write */
    /* 2. the message names the argument */
    if (s != FLASHC_OK && !bi_names_one(msg, c->tokens))
        fc_test_fail(__FILE__, __LINE__, "last error \"%s\" names none of: %s", msg, c->tokens);
    /* 3. nothing written */
    for (int i = 0; i < pr.nbuf; i++) {
        if (memcmp(snap[i], pr.buf[i].mem, pr.buf[i].bytes) == 0) continue;
        size_t at = 0;
        while (snap[i][at] == ((unsigned char *)pr.buf[i].mem)[at]) at++;
        fc_test_fail(__FILE__, __LINE__, "%s was written (first changed byte %zu) by a failing call",
                     pr.buf[i].name, at);
    }

done:
    for (int i = 0; i < 24; i++) free(snap[i]);
    free(ws_mem);
    bi_free(&pr);
}

FC_TEST_REGISTER(bad_input) {
    const int ncases = (int)(sizeof bi_cases / sizeof *bi_cases);
    /* kept for the whole run: the runner holds a pointer to each */
    bi_inst *insts = (bi_inst *)calloc((size_t)ncases * K_COUNT * 2, sizeof *insts);
    if (!insts) abort();
    int n = 0;
    for (int k = 0; k < K_COUNT; k++) {
        for (int ci = 0; ci < ncases; ci++) {
            const bi_case *c = &bi_cases[ci];
            if (!(c->kinds & KM(k))) continue;
            for (int call = BI_RUN; call <= BI_QUERY; call <<= 1) {
                if (!(c->calls & (unsigned)call)) continue;
                bi_inst *in = &insts[n++];
                in->c = c;
                in->kind = (bi_kind)k;
                in->call = (bi_call_kind)call;
                snprintf(in->name, sizeof in->name, "bad/%s%s/%s", bi_kind_name[k],
                         call == BI_QUERY ? "_ws" : "", c->name);
                fc_test_add(in->name, bi_run, in);
            }
        }
    }
}
