/* reference.c : naive attention with every option, the oracle of the tests and
 * of `flashc bench --check` (see reference.h for the contract). Test code, in
 * the flashc_support library: it is not part of libflashc.
 *
 * Algorithm: for each (sequence b, query head h) the K and V rows of b's KV head
 * are gathered into dense double arrays, then every query row is processed on
 * its own: all its scores, the softmax over the visible keys, the dropout mask,
 * then the output row (forward) or the row's share of dQ, dK, dV (backward,
 * softmax gradient dS = P * (dP - rowsum(P * dP))). Nothing is tiled and no
 * online softmax is used: the point is to be obviously right, not fast.
 *
 * The two modes share one code path. Every arithmetic result goes through
 * fc_ref_f32() (round to fp32 in FC_REF_LOWP, identity in FC_REF_F64) and every
 * value that a same-precision implementation would store in the input dtype
 * (scores, probabilities, GEMM results, outputs) through fc_ref_rnd(). A double
 * operation on two fp32 values rounded once to fp32 equals the fp32 operation
 * (53 >= 2*24 + 2 bits), so LOWP is plain fp32 arithmetic without FMA.
 *
 * It reads the PUBLIC argument structs, honouring their strides, so that it is
 * independent of prepare.c's normalisation (fc_attn). It uses from the library only
 * the dtype conversions and the Philox generator, which every backend shares.
 * It checks nothing (inputs are valid by contract) and never writes the caller's
 * tensors, the kvcache append included.
 */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/common/philox.h"
#include "../../src/internal.h"
#include "reference.h"

// ---- options and the arithmetic of the two modes ----

typedef struct fc_ref_ctx {
    bool lowp;
    flashc_dtype dt;
    int64_t H, Hk, D;
    int64_t Dv;         /* head dim of v, out, dout, dv (D when 0 is given) */
    double scale;       /* softmax_scale, or 1/sqrt(D) */
    double softcap;     /* 0 = off */
    int64_t wl, wr;     /* window; < 0 unbounded; causal folded into wr = 0 */
    bool dropout;
    double rp;          /* 1 / (1 - p), 1 without dropout */
    uint32_t thr;       /* drop iff the 16-bit word < thr */
    uint64_t seed, offset;
    const flashc_tensor *alibi; /* [H] or [B, H] fp32, data NULL when absent */
    const flashc_tensor *sink;  /* [H] fp32 learnable sinks, NULL or data NULL when absent */
} fc_ref_ctx;

static inline double fc_ref_f32(const fc_ref_ctx *c, double x) {
    return c->lowp ? (double)(float)x : x;
}

static inline double fc_ref_rnd(const fc_ref_ctx *c, double x) {
    return c->lowp ? (double)fc_round_to(c->dt, (float)x) : x;
}

/* x . y over n elements: exact-ish double, or an fp32 accumulation in order. */
static double fc_ref_dot(const fc_ref_ctx *c, const double *x, const double *y, int64_t n) {
    if (c->lowp) {
        float acc = 0.0f;
        for (int64_t d = 0; d < n; d++) acc += (float)x[d] * (float)y[d];
        return acc;
    }
    double acc = 0.0;
    for (int64_t d = 0; d < n; d++) acc += x[d] * y[d];
    return acc;
}

static void fc_ref_ctx_init(fc_ref_ctx *c, const flashc_params *p, fc_ref_mode mode,
                            flashc_dtype dt, int64_t H, int64_t Hk, int64_t D,
                            const flashc_tensor *alibi, bool train) {
    memset(c, 0, sizeof *c);
    c->lowp = mode == FC_REF_LOWP;
    c->dt = dt;
    c->H = H;
    c->Hk = Hk;
    c->D = D;
    c->Dv = D; /* the problem builders set v's own */
    c->scale = p->softmax_scale > 0.0f || p->scale_given ? (double)p->softmax_scale
                                                         : 1.0 / sqrt((double)D);
    c->scale = fc_ref_f32(c, c->scale);
    c->softcap = p->softcap > 0.0f ? (double)p->softcap : 0.0;
    c->wl = p->windowed ? p->window_left : -1;
    c->wr = p->causal ? 0 : p->windowed ? p->window_right : -1;
    c->dropout = train && p->dropout_p > 0.0f;
    c->rp = c->dropout ? fc_ref_f32(c, 1.0 / (1.0 - (double)p->dropout_p)) : 1.0;
    c->thr = fc_dropout_threshold(p->dropout_p);
    c->seed = p->dropout_seed;
    c->offset = p->dropout_offset;
    c->alibi = alibi;
}

/* The sink logit of head h (fp32, fp16 or bf16), or -inf (no sink: e^-inf adds
 * nothing). */
static double fc_ref_sink(const fc_ref_ctx *c, int64_t h) {
    const flashc_tensor *t = c->sink;
    if (!t || !t->data) return -INFINITY;
    return fc_load(t->dtype, t->data, h * t->stride[0]);
}

static double fc_ref_slope(const fc_ref_ctx *c, int64_t b, int64_t h) {
    const flashc_tensor *t = c->alibi;
    if (!t || !t->data) return 0.0;
    const float *s = (const float *)t->data;
    return t->ndim == 1 ? s[h * t->stride[0]] : s[b * t->stride[0] + h * t->stride[1]];
}

// ---- row addressing of the public layouts ----

typedef enum { FC_REF_BATCHED, FC_REF_PACKED, FC_REF_PAGED } fc_ref_layout;

/* How row r of sequence b of a tensor is found. */
typedef struct fc_ref_rows {
    fc_ref_layout layout;
    const int32_t *cu;        /* PACKED: sequence b starts at token cu[b] */
    const int32_t *batch_idx; /* BATCHED: sequence b uses batch batch_idx[b] (or b) */
    const int32_t *bt;        /* PAGED: block_table, row b at bt + b * bt_stride */
    int64_t bt_stride, page_size;
} fc_ref_rows;

/* Element offset of row r of sequence b (batched [B,S,H,D], packed [T,H,D],
 * paged [pages, page_size, H, D]). */
static int64_t fc_ref_row_offset(const flashc_tensor *t, const fc_ref_rows *m, int64_t b,
                                 int64_t r) {
    switch (m->layout) {
    case FC_REF_PACKED: return ((int64_t)m->cu[b] + r) * t->stride[0];
    case FC_REF_PAGED: {
        int64_t page = m->bt[b * m->bt_stride + r / m->page_size];
        return page * t->stride[0] + (r % m->page_size) * t->stride[1];
    }
    default: {
        int64_t kb = m->batch_idx ? m->batch_idx[b] : b;
        return kb * t->stride[0] + r * t->stride[1];
    }
    }
}

/* dst [n, D] = rows r0 .. r0+n-1 of sequence b, head `head`. */
static void fc_ref_gather(const flashc_tensor *t, const fc_ref_rows *m, int64_t b, int64_t r0,
                          int64_t n, int64_t head, int64_t D, double *dst) {
    int64_t hs = t->stride[t->ndim - 2];
    for (int64_t r = 0; r < n; r++) {
        int64_t base = fc_ref_row_offset(t, m, b, r0 + r) + head * hs;
        for (int64_t d = 0; d < D; d++) dst[r * D + d] = fc_load(t->dtype, t->data, base + d);
    }
}

/* An int32 tensor's element i, or a rank-0 scalar's value. */
static int64_t fc_ref_int(const flashc_tensor *t, int64_t i) {
    const int32_t *x = (const int32_t *)t->data;
    return t->ndim == 0 ? x[0] : x[i * t->stride[0]];
}

// ---- one (sequence, query head) ----

typedef struct fc_ref_head {
    int64_t b, h, sq, sk;
    const double *q;    /* [sq, D] */
    const double *k, *v;/* [sk, D], [sk, Dv] */
    double slope;       /* ALiBi, 0 = off */
    double sink;        /* learnable sink logit, -inf = none */
} fc_ref_head;

/* Per-row scratch. */
typedef struct fc_ref_scratch {
    double *p;          /* [sk_max] scores, then probabilities (0 where masked) */
    double *dcap;       /* [sk_max] d(softcapped score)/d(scaled score) = 1 - tanh^2 */
    double *dp;         /* [sk_max] backward: dP, then dS */
    unsigned char *keep;/* [sk_max] dropout: 1 = kept */
    double *acc;        /* [max(D, Dv)] */
} fc_ref_scratch;

static bool fc_ref_visible(const fc_ref_ctx *c, int64_t sq, int64_t sk, int64_t i, int64_t j) {
    int64_t diag = i + sk - sq; /* bottom-right aligned diagonal */
    if (c->wl >= 0 && j < diag - c->wl) return false;
    if (c->wr >= 0 && j > diag + c->wr) return false;
    return true;
}

/* Softmax row i of head hd into w->p, w->dcap, w->keep. Returns the lse, or
 * -inf when row i sees no key (then p is all 0). With a sink s the denominator
 * is e^s + sum_j e^{x_j} (the sink takes no value) and a row without keys
 * returns s. */
static double fc_ref_row(const fc_ref_ctx *c, const fc_ref_head *hd, int64_t i,
                         fc_ref_scratch *w) {
    const int64_t D = c->D, sk = hd->sk;
    const double *q = hd->q + i * D;
    double m = -INFINITY;
    for (int64_t j = 0; j < sk; j++) {
        w->dcap[j] = 1.0;
        if (!fc_ref_visible(c, hd->sq, sk, i, j)) {
            w->p[j] = -INFINITY;
            continue;
        }
        double s = fc_ref_rnd(c, fc_ref_dot(c, q, hd->k + j * D, D));
        s = fc_ref_f32(c, c->scale * s);
        if (c->softcap > 0.0) {
            double t = fc_ref_f32(c, tanh(fc_ref_f32(c, s / c->softcap)));
            s = fc_ref_f32(c, c->softcap * t);
            w->dcap[j] = fc_ref_f32(c, 1.0 - fc_ref_f32(c, t * t));
        }
        if (hd->slope != 0.0) {
            double dist = fabs((double)(i + sk - hd->sq - j));
            s = fc_ref_f32(c, s - fc_ref_f32(c, hd->slope * dist));
        }
        w->p[j] = s;
        if (s > m || isnan(s)) m = s;  /* a NaN score makes m NaN: the row is NaN */
    }
    if (m == -INFINITY) {
        for (int64_t j = 0; j < sk; j++) w->p[j] = 0.0;
        memset(w->keep, 1, (size_t)sk);
        return hd->sink;
    }
    if (hd->sink > m) m = hd->sink; /* a NaN m stays NaN */
    double l = 0.0;
    for (int64_t j = 0; j < sk; j++) {
        double e = w->p[j] == -INFINITY ? 0.0 : fc_ref_f32(c, exp(fc_ref_f32(c, w->p[j] - m)));
        w->p[j] = e;
        l = fc_ref_f32(c, l + e);
    }
    if (hd->sink != -INFINITY) l = fc_ref_f32(c, l + fc_ref_f32(c, exp(fc_ref_f32(c, hd->sink - m))));
    for (int64_t j = 0; j < sk; j++) w->p[j] = fc_ref_rnd(c, fc_ref_f32(c, w->p[j] / l));
    uint32_t bh = (uint32_t)(hd->b * c->H + hd->h);
    for (int64_t j = 0; j < sk; j++)
        w->keep[j] = !c->dropout ||
                     fc_dropout_keep(c->seed, c->offset, bh, (uint32_t)i, (uint64_t)j, c->thr);
    return fc_ref_f32(c, m + fc_ref_f32(c, log(l)));
}

/* Output row of the probabilities in w (after fc_ref_row) into w->acc [Dv]:
 * sum over kept j of P_ij V_j / (1 - p), rounded to the dtype in LOWP. */
static void fc_ref_out_row(const fc_ref_ctx *c, const fc_ref_head *hd, fc_ref_scratch *w) {
    const int64_t D = c->Dv;
    for (int64_t d = 0; d < D; d++) w->acc[d] = 0.0;
    for (int64_t j = 0; j < hd->sk; j++) {
        double pj = w->p[j];
        if (!w->keep[j] || pj == 0.0) continue;
        const double *vj = hd->v + j * D;
        for (int64_t d = 0; d < D; d++)
            w->acc[d] = fc_ref_f32(c, w->acc[d] + fc_ref_f32(c, pj * vj[d]));
    }
    for (int64_t d = 0; d < D; d++) w->acc[d] = fc_ref_rnd(c, fc_ref_f32(c, w->acc[d] * c->rp));
}

/* Forward of one head: out row i at out + i*out_ld, lse at lse + i*lse_ld,
 * probs row i at probs + i*probs_ld (each pointer may be NULL). */
static void fc_ref_head_fwd(const fc_ref_ctx *c, const fc_ref_head *hd, fc_ref_scratch *w,
                            double *out, int64_t out_ld, double *lse, int64_t lse_ld,
                            double *probs, int64_t probs_ld) {
    for (int64_t i = 0; i < hd->sq; i++) {
        double l = fc_ref_row(c, hd, i, w);
        if (lse) lse[i * lse_ld] = l;
        if (probs)
            for (int64_t j = 0; j < hd->sk; j++)
                probs[i * probs_ld + j] = w->keep[j] ? w->p[j] : -w->p[j];
        if (!out) continue;
        fc_ref_out_row(c, hd, w);
        memcpy(out + i * out_ld, w->acc, (size_t)c->Dv * sizeof(double));
    }
}

/* Backward of one head: dq [sq, D] written, dk [sk, D] and dv [sk, Dv] accumulated
 * (fp32 sums in LOWP); the caller applies the scale to dk and rounds. With a
 * sink, *dsink (double) accumulates -sum_i e^{s - lse_i} D_i. */
static void fc_ref_head_bwd(const fc_ref_ctx *c, const fc_ref_head *hd, fc_ref_scratch *w,
                            const double *dout, double *dq, double *dk, double *dv,
                            double *dsink) {
    const int64_t D = c->D, Dv = c->Dv, sk = hd->sk;
    for (int64_t i = 0; i < hd->sq; i++) {
        double *dqi = dq + i * D;
        const double *qi = hd->q + i * D, *doi = dout + i * Dv;
        double lse = fc_ref_row(c, hd, i, w);
        if (lse == -INFINITY) {
            for (int64_t d = 0; d < D; d++) dqi[d] = 0.0;
            continue;
        }
        /* dP = dO V^T through the dropout mask, and D_i = rowsum(P * dP) = dO_i . O_i.
         * F64 sums P * dP; LOWP takes dO_i . O_i with O rounded to the dtype, as an
         * implementation that stores the forward's output does. */
        double di = 0.0;
        for (int64_t j = 0; j < sk; j++) {
            double dp = 0.0;
            if (w->keep[j] && w->p[j] != 0.0)
                dp = fc_ref_rnd(c, fc_ref_f32(c, fc_ref_dot(c, doi, hd->v + j * Dv, Dv) * c->rp));
            w->dp[j] = dp;
            di += w->p[j] * dp;
        }
        if (c->lowp) {
            fc_ref_out_row(c, hd, w);
            di = fc_ref_dot(c, doi, w->acc, Dv);
        }
        if (hd->sink != -INFINITY) *dsink -= fc_ref_f32(c, exp(fc_ref_f32(c, hd->sink - lse))) * di;
        /* dS = P * (dP - D_i), through the softcap's tanh' */
        for (int64_t j = 0; j < sk; j++) {
            double ds = fc_ref_rnd(c, fc_ref_f32(c, w->p[j] * fc_ref_f32(c, w->dp[j] - di)));
            if (c->softcap > 0.0) ds = fc_ref_rnd(c, fc_ref_f32(c, ds * w->dcap[j]));
            w->dp[j] = ds;
        }
        for (int64_t d = 0; d < D; d++) w->acc[d] = 0.0;
        for (int64_t j = 0; j < sk; j++) {
            double ds = w->dp[j],
                   pd = w->keep[j] ? fc_ref_rnd(c, fc_ref_f32(c, w->p[j] * c->rp)) : 0.0;
            const double *kj = hd->k + j * D;
            double *dkj = dk + j * D, *dvj = dv + j * Dv;
            if (ds != 0.0)
                for (int64_t d = 0; d < D; d++) {
                    w->acc[d] = fc_ref_f32(c, w->acc[d] + fc_ref_f32(c, ds * kj[d]));
                    dkj[d] = fc_ref_f32(c, dkj[d] + fc_ref_f32(c, ds * qi[d]));
                }
            if (pd != 0.0)
                for (int64_t d = 0; d < Dv; d++)
                    dvj[d] = fc_ref_f32(c, dvj[d] + fc_ref_f32(c, pd * doi[d]));
        }
        for (int64_t d = 0; d < D; d++) dqi[d] = fc_ref_rnd(c, fc_ref_f32(c, c->scale * w->acc[d]));
    }
}

// ---- the problem: sequences, layouts and the kvcache extras ----

typedef struct fc_ref_prob {
    fc_ref_ctx c;
    int64_t B;
    int64_t Sq, Sk;               /* batched lengths */
    const int32_t *cu_q, *cu_k;   /* varlen, else NULL */
    const int32_t *seqused_k;     /* varlen, or NULL */
    int64_t rows_q, rows_k;       /* rows of the dense q-like / k-like outputs */
    int64_t probs_sq, probs_sk;   /* attn_probs bounds */
    const flashc_tensor *q, *k, *v;
    fc_ref_rows qrows, krows;
    const flashc_kvcache_args *kv;/* kvcache extras, or NULL */
    int64_t cache_rows;           /* kvcache: rows per sequence when cache_seqlens is absent */
    bool rotary_per_row;          /* kvcache: q row i rotated at cache_seqlens[b] + i */
    bool rotary_interleaved;      /* kvcache: pairs (2r, 2r+1), else (r, r + rotary_dim/2) */
} fc_ref_prob;

static int64_t fc_ref_cache_seqlen(const fc_ref_prob *pr, int64_t b) {
    const flashc_tensor *t = &pr->kv->cache_seqlens;
    return t->data ? fc_ref_int(t, b) : pr->cache_rows;
}

static int64_t fc_ref_leftpad(const fc_ref_prob *pr, int64_t b) {
    const flashc_tensor *t = &pr->kv->cache_leftpad;
    return t->data ? fc_ref_int(t, b) : 0;
}

static int64_t fc_ref_new_rows(const fc_ref_prob *pr) {
    return pr->kv->k_new.data ? pr->kv->k_new.shape[1] : 0;
}

static void fc_ref_lens(const fc_ref_prob *pr, int64_t b, int64_t *sq, int64_t *sk) {
    if (pr->kv) {
        *sq = pr->Sq;
        *sk = fc_ref_cache_seqlen(pr, b) + fc_ref_new_rows(pr) - fc_ref_leftpad(pr, b);
    } else if (pr->cu_q) {
        *sq = (int64_t)pr->cu_q[b + 1] - pr->cu_q[b];
        *sk = pr->seqused_k ? (int64_t)pr->seqused_k[b] : (int64_t)pr->cu_k[b + 1] - pr->cu_k[b];
    } else {
        *sq = pr->Sq;
        *sk = pr->Sk;
    }
}

/* Rotary embedding of x [D] at position pos (kvcache). */
static void fc_ref_rotate(const fc_ref_prob *pr, double *x, int64_t pos) {
    const fc_ref_ctx *c = &pr->c;
    const flashc_tensor *ct = &pr->kv->rotary_cos, *st = &pr->kv->rotary_sin;
    int64_t half = ct->shape[1];
    for (int64_t r = 0; r < half; r++) {
        double co = fc_load(ct->dtype, ct->data, pos * ct->stride[0] + r);
        double si = fc_load(st->dtype, st->data, pos * st->stride[0] + r);
        int64_t i0 = pr->rotary_interleaved ? 2 * r : r;
        int64_t i1 = pr->rotary_interleaved ? 2 * r + 1 : r + half;
        double x0 = x[i0], x1 = x[i1];
        x[i0] = fc_ref_rnd(c, fc_ref_f32(c, fc_ref_f32(c, x0 * co) - fc_ref_f32(c, x1 * si)));
        x[i1] = fc_ref_rnd(c, fc_ref_f32(c, fc_ref_f32(c, x0 * si) + fc_ref_f32(c, x1 * co)));
    }
}

/* Q [sq, D] (or dout [sq, Dv]: D given) of sequence b, head h (rotated in kvcache). */
static void fc_ref_load_q(const fc_ref_prob *pr, const flashc_tensor *t, int64_t b, int64_t h,
                          int64_t sq, bool rotate, int64_t D, double *q) {
    fc_ref_gather(t, &pr->qrows, b, 0, sq, h, D, q);
    if (!rotate) return;
    int64_t cs = fc_ref_cache_seqlen(pr, b);
    for (int64_t i = 0; i < sq; i++)
        fc_ref_rotate(pr, q + i * D, cs + (pr->rotary_per_row ? i : 0));
}

/* K [sk, D], V [sk, Dv] of sequence b, KV head hk. kvcache: the cache rows leftpad ..
 * cache_seqlens-1 as they are now, then k_new (rotated; also written to
 * k_new_rot when not NULL) and v_new. */
static void fc_ref_load_kv(const fc_ref_prob *pr, int64_t b, int64_t hk, int64_t sk, double *k,
                           double *v, double *k_new_rot) {
    const int64_t D = pr->c.D, Dv = pr->c.Dv;
    if (!pr->kv) {
        fc_ref_gather(pr->k, &pr->krows, b, 0, sk, hk, D, k);
        fc_ref_gather(pr->v, &pr->krows, b, 0, sk, hk, Dv, v);
        return;
    }
    const flashc_kvcache_args *a = pr->kv;
    int64_t lp = fc_ref_leftpad(pr, b), cs = fc_ref_cache_seqlen(pr, b), sn = fc_ref_new_rows(pr);
    int64_t nc = cs - lp; /* cache rows that are keys */
    fc_ref_gather(&a->k_cache, &pr->krows, b, lp, nc, hk, D, k);
    fc_ref_gather(&a->v_cache, &pr->krows, b, lp, nc, hk, Dv, v);
    if (sn == 0) return;
    fc_ref_rows nrows = {FC_REF_BATCHED, NULL, NULL, NULL, 0, 0};
    double *kn = k + nc * D;
    fc_ref_gather(&a->k_new, &nrows, b, 0, sn, hk, D, kn);
    fc_ref_gather(&a->v_new, &nrows, b, 0, sn, hk, Dv, v + nc * Dv);
    if (a->rotary_cos.data)
        for (int64_t t = 0; t < sn; t++) fc_ref_rotate(pr, kn + t * D, cs + t);
    if (k_new_rot)
        for (int64_t t = 0; t < sn; t++)
            memcpy(k_new_rot + ((b * sn + t) * pr->c.Hk + hk) * D, kn + t * D,
                   (size_t)D * sizeof(double));
}

// ---- drivers ----

typedef struct fc_ref_bufs {
    double *q, *k, *v;       /* [sq_max, D], [sk_max, D] x2 */
    double *dout, *dq;       /* backward: [sq_max, D] */
    double *dk1, *dv1;       /* backward: one head's [sk_max, D] */
    double *dkg, *dvg;       /* backward: the group's [sk_max, D] */
    fc_ref_scratch w;
    void *blocks[11];
} fc_ref_bufs;

static void fc_ref_bufs_free(fc_ref_bufs *m) {
    for (int i = 0; i < 11; i++) free(m->blocks[i]);
}

static flashc_status fc_ref_bufs_alloc(const fc_ref_prob *pr, bool bwd, fc_ref_bufs *m) {
    memset(m, 0, sizeof *m);
    /* every buffer holds rows of max(D, Dv) */
    int64_t sq_max = 1, sk_max = 1, D = pr->c.D > pr->c.Dv ? pr->c.D : pr->c.Dv;
    for (int64_t b = 0; b < pr->B; b++) {
        int64_t sq, sk;
        fc_ref_lens(pr, b, &sq, &sk);
        if (sq > sq_max) sq_max = sq;
        if (sk > sk_max) sk_max = sk;
    }
    size_t qd = (size_t)(sq_max * D) * sizeof(double), kd = (size_t)(sk_max * D) * sizeof(double);
    size_t kr = (size_t)sk_max * sizeof(double);
    size_t sizes[11] = {qd, kd, kd, bwd ? qd : 1, bwd ? qd : 1, bwd ? kd : 1, bwd ? kd : 1,
                        bwd ? kd : 1, bwd ? kd : 1, 3 * kr + (size_t)D * sizeof(double),
                        (size_t)sk_max};
    for (int i = 0; i < 11; i++) {
        m->blocks[i] = malloc(sizes[i]);
        if (!m->blocks[i]) {
            fc_ref_bufs_free(m);
            return fc_set_error(FLASHC_ERR_OUT_OF_MEMORY, "reference: %zu bytes", sizes[i]);
        }
    }
    double **dst[9] = {&m->q, &m->k, &m->v, &m->dout, &m->dq, &m->dk1, &m->dv1, &m->dkg, &m->dvg};
    for (int i = 0; i < 9; i++) *dst[i] = (double *)m->blocks[i];
    double *row = (double *)m->blocks[9];
    m->w.p = row;
    m->w.dcap = row + sk_max;
    m->w.dp = row + 2 * sk_max;
    m->w.acc = row + 3 * sk_max;
    m->w.keep = (unsigned char *)m->blocks[10];
    return FLASHC_OK;
}

/* Canonical index of q-like row i of sequence b (out, dq: [rows_q, H, D]). */
static int64_t fc_ref_qrow(const fc_ref_prob *pr, int64_t b, int64_t i) {
    return pr->cu_q ? (int64_t)pr->cu_q[b] + i : b * pr->Sq + i;
}

/* Canonical index of k-like row j of sequence b (dk, dv: [rows_k, Hk, D]). */
static int64_t fc_ref_krow(const fc_ref_prob *pr, int64_t b, int64_t j) {
    return pr->cu_k ? (int64_t)pr->cu_k[b] + j : b * pr->Sk + j;
}

static flashc_status fc_ref_run_fwd(const fc_ref_prob *pr, double *out, double *lse,
                                    double *probs, double *k_new_rot) {
    const fc_ref_ctx *c = &pr->c;
    const int64_t H = c->H, Hk = c->Hk, D = c->Dv, G = H / Hk; /* out: [rows_q, H, Dv] */
    if (out)
        for (int64_t i = 0; i < pr->rows_q * H * D; i++) out[i] = 0.0;
    if (lse)
        for (int64_t i = 0; i < pr->rows_q * H; i++) lse[i] = -INFINITY;
    if (probs)
        for (int64_t i = 0; i < pr->B * H * pr->probs_sq * pr->probs_sk; i++) probs[i] = 0.0;
    fc_ref_bufs m;
    FC_TRY(fc_ref_bufs_alloc(pr, false, &m));
    bool rotate = pr->kv && pr->kv->rotary_cos.data;
    for (int64_t b = 0; b < pr->B; b++) {
        int64_t sq, sk;
        fc_ref_lens(pr, b, &sq, &sk);
        for (int64_t hk = 0; hk < Hk; hk++) {
            fc_ref_load_kv(pr, b, hk, sk, m.k, m.v, k_new_rot);
            for (int64_t h = hk * G; h < (hk + 1) * G; h++) {
                fc_ref_load_q(pr, pr->q, b, h, sq, rotate, c->D, m.q);
                fc_ref_head hd = {b,   h,   sq,  sk,
                                  m.q, m.k, m.v, fc_ref_f32(c, fc_ref_slope(c, b, h)),
                                  fc_ref_sink(c, h)};
                /* lse: [B, H, Sq] batched, [H, total_q] varlen */
                double *l = !lse ? NULL
                            : pr->cu_q ? lse + h * pr->rows_q + pr->cu_q[b]
                                       : lse + (b * H + h) * pr->Sq;
                double *o = out ? out + fc_ref_qrow(pr, b, 0) * H * D + h * D : NULL;
                double *p = probs ? probs + (b * H + h) * pr->probs_sq * pr->probs_sk : NULL;
                fc_ref_head_fwd(c, &hd, &m.w, o, H * D, l, 1, p, pr->probs_sk);
            }
        }
    }
    fc_ref_bufs_free(&m);
    return FLASHC_OK;
}

static flashc_status fc_ref_run_bwd(const fc_ref_prob *pr, const flashc_tensor *dout, double *dq,
                                    double *dk, double *dv, double *dsink) {
    const fc_ref_ctx *c = &pr->c;
    const int64_t H = c->H, Hk = c->Hk, D = c->D, Dv = c->Dv, G = H / Hk;
    if (dq)
        for (int64_t i = 0; i < pr->rows_q * H * D; i++) dq[i] = 0.0;
    if (dk)
        for (int64_t i = 0; i < pr->rows_k * Hk * D; i++) dk[i] = 0.0;
    if (dv)
        for (int64_t i = 0; i < pr->rows_k * Hk * Dv; i++) dv[i] = 0.0;
    if (dsink)
        for (int64_t h = 0; h < H; h++) dsink[h] = 0.0;
    double dsink_unused = 0.0;
    fc_ref_bufs m;
    FC_TRY(fc_ref_bufs_alloc(pr, true, &m));
    for (int64_t b = 0; b < pr->B; b++) {
        int64_t sq, sk;
        fc_ref_lens(pr, b, &sq, &sk);
        for (int64_t hk = 0; hk < Hk; hk++) {
            fc_ref_load_kv(pr, b, hk, sk, m.k, m.v, NULL);
            for (int64_t e = 0; e < sk * D; e++) m.dkg[e] = 0.0;
            for (int64_t e = 0; e < sk * Dv; e++) m.dvg[e] = 0.0;
            for (int64_t h = hk * G; h < (hk + 1) * G; h++) {
                fc_ref_load_q(pr, pr->q, b, h, sq, false, D, m.q);
                fc_ref_load_q(pr, dout, b, h, sq, false, Dv, m.dout);
                for (int64_t e = 0; e < sk * D; e++) m.dk1[e] = 0.0;
                for (int64_t e = 0; e < sk * Dv; e++) m.dv1[e] = 0.0;
                fc_ref_head hd = {b,   h,   sq,  sk,
                                  m.q, m.k, m.v, fc_ref_f32(c, fc_ref_slope(c, b, h)),
                                  fc_ref_sink(c, h)};
                fc_ref_head_bwd(c, &hd, &m.w, m.dout, m.dq, m.dk1, m.dv1,
                                dsink ? &dsink[h] : &dsink_unused);
                if (dq)
                    for (int64_t i = 0; i < sq; i++)
                        memcpy(dq + (fc_ref_qrow(pr, b, i) * H + h) * D, m.dq + i * D,
                               (size_t)D * sizeof(double));
                /* each head's dK, dV rounded as a GEMM result, summed over the group */
                for (int64_t e = 0; e < sk * D; e++)
                    m.dkg[e] =
                        fc_ref_f32(c, m.dkg[e] + fc_ref_rnd(c, fc_ref_f32(c, c->scale * m.dk1[e])));
                for (int64_t e = 0; e < sk * Dv; e++)
                    m.dvg[e] = fc_ref_f32(c, m.dvg[e] + fc_ref_rnd(c, m.dv1[e]));
            }
            for (int64_t j = 0; j < sk; j++) {
                int64_t r = fc_ref_krow(pr, b, j) * Hk + hk;
                if (dk)
                    for (int64_t d = 0; d < D; d++) dk[r * D + d] = fc_ref_rnd(c, m.dkg[j * D + d]);
                if (dv)
                    for (int64_t d = 0; d < Dv; d++)
                        dv[r * Dv + d] = fc_ref_rnd(c, m.dvg[j * Dv + d]);
            }
        }
    }
    fc_ref_bufs_free(&m);
    return FLASHC_OK;
}

// ---- entry points ----

// The batched problem of the forward and the backward: q [B, Sq, H, D], k and
// v [B, Sk, Hk, D].
static void fc_ref_prob_batched(fc_ref_prob *pr, const flashc_params *p, fc_ref_mode mode,
                                const flashc_tensor *q, const flashc_tensor *k,
                                const flashc_tensor *v, const flashc_tensor *alibi) {
    memset(pr, 0, sizeof *pr);
    fc_ref_ctx_init(&pr->c, p, mode, q->dtype, q->shape[2], k->shape[2], q->shape[3], alibi, true);
    pr->B = q->shape[0];
    pr->Sq = q->shape[1];
    pr->Sk = k->shape[1];
    pr->rows_q = pr->B * pr->Sq;
    pr->c.Dv = v->shape[3];
    pr->q = q;
    pr->k = k;
    pr->v = v;
}

// The varlen problem of the forward and the backward: q [total_q, H, D], k and
// v [total_k, Hk, D] (the forward's may be pages: Hk is second to last), the
// sequences by cu_seqlens_q and cu_seqlens_k, rows packed.
static void fc_ref_prob_varlen(fc_ref_prob *pr, const flashc_params *p, fc_ref_mode mode,
                               const flashc_tensor *q, const flashc_tensor *k,
                               const flashc_tensor *v, const flashc_tensor *alibi,
                               const flashc_tensor *cu_seqlens_q,
                               const flashc_tensor *cu_seqlens_k) {
    memset(pr, 0, sizeof *pr);
    fc_ref_ctx_init(&pr->c, p, mode, q->dtype, q->shape[1], k->shape[k->ndim - 2], q->shape[2],
                    alibi, true);
    pr->B = cu_seqlens_q->shape[0] - 1;
    pr->cu_q = (const int32_t *)cu_seqlens_q->data;
    pr->cu_k = (const int32_t *)cu_seqlens_k->data;
    pr->rows_q = q->shape[0];
    pr->c.Dv = v->shape[v->ndim - 1];
    pr->q = q;
    pr->k = k;
    pr->v = v;
    pr->qrows.layout = FC_REF_PACKED;
    pr->qrows.cu = pr->cu_q;
    pr->krows.layout = FC_REF_PACKED;
    pr->krows.cu = pr->cu_k;
}

flashc_status fc_ref_fwd(const flashc_fwd_args *a, const flashc_params *p, fc_ref_mode mode,
                         double *out, double *lse, double *probs) {
    fc_ref_prob pr;
    fc_ref_prob_batched(&pr, p, mode, &a->q, &a->k, &a->v, &a->alibi_slopes);
    pr.c.sink = &a->sink;
    pr.probs_sq = pr.Sq;
    pr.probs_sk = pr.Sk;
    return fc_ref_run_fwd(&pr, out, lse, probs, NULL);
}

flashc_status fc_ref_varlen_fwd(const flashc_varlen_fwd_args *a, const flashc_params *p,
                                fc_ref_mode mode, double *out, double *lse, double *probs) {
    fc_ref_prob pr;
    fc_ref_prob_varlen(&pr, p, mode, &a->q, &a->k, &a->v, &a->alibi_slopes, &a->cu_seqlens_q,
                       &a->cu_seqlens_k);
    pr.c.sink = &a->sink;
    pr.seqused_k = (const int32_t *)a->seqused_k.data;
    pr.probs_sq = a->max_seqlen_q;
    pr.probs_sk = a->max_seqlen_k;
    if (a->block_table.data) {
        pr.krows.layout = FC_REF_PAGED;
        pr.krows.cu = NULL;
        pr.krows.bt = (const int32_t *)a->block_table.data;
        pr.krows.bt_stride = a->block_table.stride[0];
        pr.krows.page_size = a->k.shape[1];
    }
    return fc_ref_run_fwd(&pr, out, lse, probs, NULL);
}

/* The backward of a batched (b) or varlen (v) call: dq, dk, dv, dsink, each
 * NULL to skip. */
static flashc_status fc_ref_bwd_of(const flashc_bwd_args *b, const flashc_varlen_bwd_args *v,
                                   const flashc_params *p, fc_ref_mode mode, double *dq,
                                   double *dk, double *dv, double *dsink) {
    fc_ref_prob pr;
    if (b) {
        fc_ref_prob_batched(&pr, p, mode, &b->q, &b->k, &b->v, &b->alibi_slopes);
        pr.c.sink = &b->sink;
        pr.rows_k = pr.B * pr.Sk;
        return fc_ref_run_bwd(&pr, &b->dout, dq, dk, dv, dsink);
    }
    fc_ref_prob_varlen(&pr, p, mode, &v->q, &v->k, &v->v, &v->alibi_slopes, &v->cu_seqlens_q,
                       &v->cu_seqlens_k);
    pr.c.sink = &v->sink;
    pr.rows_k = v->k.shape[0];
    return fc_ref_run_bwd(&pr, &v->dout, dq, dk, dv, dsink);
}

flashc_status fc_ref_bwd(const flashc_bwd_args *a, const flashc_params *p, fc_ref_mode mode,
                         double *dq, double *dk, double *dv) {
    return fc_ref_bwd_of(a, NULL, p, mode, dq, dk, dv, NULL);
}

flashc_status fc_ref_varlen_bwd(const flashc_varlen_bwd_args *a, const flashc_params *p,
                                fc_ref_mode mode, double *dq, double *dk, double *dv) {
    return fc_ref_bwd_of(NULL, a, p, mode, dq, dk, dv, NULL);
}

flashc_status fc_ref_bwd_dsink(const flashc_bwd_args *a, const flashc_params *p, fc_ref_mode mode,
                               double *dsink) {
    return fc_ref_bwd_of(a, NULL, p, mode, NULL, NULL, NULL, dsink);
}

flashc_status fc_ref_varlen_bwd_dsink(const flashc_varlen_bwd_args *a, const flashc_params *p,
                                      fc_ref_mode mode, double *dsink) {
    return fc_ref_bwd_of(NULL, a, p, mode, NULL, NULL, NULL, dsink);
}

flashc_status fc_ref_kvcache(const flashc_kvcache_args *a, const flashc_params *p,
                             fc_ref_mode mode, double *out, double *lse, double *k_new_rot) {
    fc_ref_prob pr;
    memset(&pr, 0, sizeof pr);
    fc_ref_ctx_init(&pr.c, p, mode, a->q.dtype, a->q.shape[2], a->k_cache.shape[2],
                    a->q.shape[3], &a->alibi_slopes, false);
    pr.c.sink = &a->sink;
    pr.c.Dv = a->v_cache.shape[3];
    pr.B = a->q.shape[0];
    pr.Sq = a->q.shape[1];
    pr.rows_q = pr.B * pr.Sq;
    pr.q = &a->q;
    pr.kv = a;
    pr.rotary_interleaved = p->rotary_halves == 0;
    if (a->block_table.data) {
        pr.krows.layout = FC_REF_PAGED;
        pr.krows.bt = (const int32_t *)a->block_table.data;
        pr.krows.bt_stride = a->block_table.stride[0];
        pr.krows.page_size = a->k_cache.shape[1];
        pr.cache_rows = a->block_table.shape[1] * a->k_cache.shape[1];
    } else {
        pr.krows.layout = FC_REF_BATCHED;
        pr.krows.batch_idx = (const int32_t *)a->cache_batch_idx.data;
        pr.cache_rows = a->k_cache.shape[1];
    }
    /* flash_attn's rule: q rows per row when an edge below the cache's rows can
     * clip a key (mha_fwd_kvcache turns an edge at or past them into -1) */
    pr.rotary_per_row = (pr.c.wl >= 0 && pr.c.wl < pr.cache_rows) ||
                        (pr.c.wr >= 0 && pr.c.wr < pr.cache_rows);
    return fc_ref_run_fwd(&pr, out, lse, NULL, k_new_rot);
}

