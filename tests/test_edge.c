/* test_edge.c : edge semantics of the CPU backend that flash_attn and PyTorch
 * define and a tolerance test would not catch:
 * - a row that sees exactly one key has P = 1 there, so dq of the row and its
 *   share of dk are exactly 0 (a softmax over one element), dropout included
 *   (where O = V / (1 - p) rounded to the dtype would leave a residue through
 *   Delta = dO . O): seqlen_k = 1 with ALiBi [B, H] and deterministic, and the
 *   window (0, 0), where every row sees only its diagonal key;
 * - a NaN in q makes its row's out, lse and dq NaN, and dk, dv of the keys it
 *   sees (PyTorch and flash_attn propagate it); every other row and head stays
 *   exact;
 * - params.scale_given = 1 with softmax_scale = 0: every score 0 before ALiBi,
 *   so out is the mean of the visible values (flash_attn's softmax_scale=0.0).
 * Each runs the library's forward and backward (not the reference's forward),
 * checks against the float64 reference (which propagates NaN too), and for the
 * one-key rows requires exact zeros.
 * - edge_fp16_nonfinite: fp16 inputs holding inf give the same out, lse, dq,
 *   dk and dv on every SIMD path this CPU runs as on the scalar one: NaN,
 *   +inf, -inf in the same places (an inf in V makes inf or NaN outputs, a -inf
 *   in q a row that sees no key: out 0, lse -inf), finite values within fp16's
 *   rounding, and on each path the same bits at 1 and 5 threads (the
 *   backward's two schedules; 160 rows: more than one 128-row tile; and 1040 rows
 *   without a mask, a NaN in q). The amx path splits fp16 into bf16 halves,
 *   whose cross products would turn inf x 0 into NaN: it redoes such a tile
 *   (forward) or runs the call (backward) with fp32 products.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/check.h"
#include "support/reference.h"
#include "fc_test.h"
#include "helpers.h"

static double ed_max_abs(const double *x, int64_t n) {
    double m = 0.0;
    for (int64_t i = 0; i < n; i++) m = fabs(x[i]) > m ? fabs(x[i]) : m;
    return m;
}

static void ed_run(const void *param) {
    const th_edge *c = (const th_edge *)param;
    const flashc_dtype dt = c->dt;
    const int64_t B = c->B, Sq = c->Sq, Sk = c->Sk, H = c->H, D = c->D;
    const int64_t nq = B * Sq * H * D, nk = B * Sk * H * D, nl = B * H * Sq;
    th_arena ar;
    memset(&ar, 0, sizeof ar);
    int64_t qs[4] = {B, Sq, H, D}, ks[4] = {B, Sk, H, D}, ls[3] = {B, H, Sq};
    flashc_bwd_args a;
    memset(&a, 0, sizeof a);
    a.abi = FLASHC_ABI_VERSION;
    a.q = th_new(th_buf_in(&ar), dt, 4, qs, TH_CONTIG, -3.0, 3.0);
    a.k = th_new(th_buf_in(&ar), dt, 4, ks, TH_CONTIG, -1.0, 1.0);
    a.v = th_new(th_buf_in(&ar), dt, 4, ks, TH_CONTIG, -1.0, 1.0);
    a.dout = th_new(th_buf_in(&ar), dt, 4, qs, TH_CONTIG, -1.0, 1.0);
    a.alibi_slopes = th_alibi_new(th_buf_in(&ar), c->alibi, B, H);
    if (c->nan_q) fc_poison((char *)a.q.data + ((Sq / 2) * H + H - 1) * D * flashc_dtype_size(dt), dt, 1);
    th_buf *ob = th_buf_in(&ar), *lb = th_buf_in(&ar), *dqb = th_buf_in(&ar);
    th_buf *dkb = th_buf_in(&ar), *dvb = th_buf_in(&ar);
    a.out = th_new_out(ob, dt, 4, qs, TH_CONTIG);
    a.softmax_lse = th_new_out(lb, FLASHC_DTYPE_FP32, 3, ls, TH_CONTIG);
    a.dq = th_new_out(dqb, dt, 4, qs, TH_CONTIG);
    a.dk = th_new_out(dkb, dt, 4, ks, TH_CONTIG);
    a.dv = th_new_out(dvb, dt, 4, ks, TH_CONTIG);
    flashc_params p = th_edge_params(c);

    flashc_fwd_args f;
    memset(&f, 0, sizeof f);
    f.abi = FLASHC_ABI_VERSION;
    f.q = a.q, f.k = a.k, f.v = a.v, f.out = a.out, f.softmax_lse = a.softmax_lse;
    f.alibi_slopes = a.alibi_slopes;
    FC_ASSERT_OK(flashc_fwd(&f, &p, NULL, 0));
    FC_ASSERT_OK(flashc_bwd(&a, &p, NULL, 0));

    double *o64 = th_dbl(&ar, nq), *olp = th_dbl(&ar, nq), *l64 = th_dbl(&ar, nl);
    double *llp = th_dbl(&ar, nl);
    FC_ASSERT_OK(fc_ref_fwd(&f, &p, FC_REF_F64, o64, l64, NULL));
    FC_ASSERT_OK(fc_ref_fwd(&f, &p, FC_REF_LOWP, olp, llp, NULL));
    th_check("out", dt, &a.out, o64, olp);
    th_check("softmax_lse", FLASHC_DTYPE_FP32, &a.softmax_lse, l64, llp);
    if (c->nan_q) { /* the reference itself must say NaN for that row */
        const double l = l64[(H - 1) * Sq + Sq / 2];
        FC_EXPECT_TRUE(isnan(l));
    }
    double *dq64 = th_dbl(&ar, nq), *dqlp = th_dbl(&ar, nq), *dk64 = th_dbl(&ar, nk);
    double *dklp = th_dbl(&ar, nk), *dv64 = th_dbl(&ar, nk), *dvlp = th_dbl(&ar, nk);
    FC_ASSERT_OK(fc_ref_bwd(&a, &p, FC_REF_F64, dq64, dk64, dv64));
    FC_ASSERT_OK(fc_ref_bwd(&a, &p, FC_REF_LOWP, dqlp, dklp, dvlp));
    th_check("dq", dt, &a.dq, dq64, dqlp);
    if (c->nan_q) {
        double *dk = (double *)th_keep(&ar, th_to_double(&a.dk));
        double *dv = (double *)th_keep(&ar, th_to_double(&a.dv));
        th_nan_head("dk", dk, dk64, dklp, Sq, Sk, H, D, c->wl, c->wr);
        th_nan_head("dv", dv, dv64, dvlp, Sq, Sk, H, D, c->wl, c->wr);
        fc_check_close("dk", dt, dk, dk64, dklp, nk);
        fc_check_close("dv", dt, dv, dv64, dvlp, nk);
    } else {
        th_check("dk", dt, &a.dk, dk64, dklp);
        th_check("dv", dt, &a.dv, dv64, dvlp);
    }
    if (c->one_key) {
        double *dq = (double *)th_keep(&ar, th_to_double(&a.dq));
        double *dk = (double *)th_keep(&ar, th_to_double(&a.dk));
        FC_EXPECT_TRUE(ed_max_abs(dq, nq) == 0.0);
        FC_EXPECT_TRUE(ed_max_abs(dk, nk) == 0.0);
    }
    th_arena_free(&ar);
}

#define BF FLASHC_DTYPE_BF16
#define HF FLASHC_DTYPE_FP16
#define F32 FLASHC_DTYPE_FP32
static const th_edge ed_cases[] = {
    /* flash_attn's test shape: 339 queries on one key, ALiBi [B, H], dropout */
    {NULL, HF, 1, 339, 1, 12, 59, -1, -1, 0.17f, 2, .one_key = 1},
    {NULL, BF, 1, 339, 1, 12, 192, -1, -1, 0.17f, 2, .one_key = 1},
    {NULL, BF, 2, 40, 40, 3, 64, 0, 0, 0.17f, 0, .one_key = 1},
    {NULL, HF, 2, 33, 33, 2, 32, 0, 0, 0.0f, 1, .one_key = 1},
    {NULL, BF, 2, 17, 23, 3, 32, -1, -1, 0.0f, 0, .nan_q = 1},
    {NULL, F32, 1, 9, 30, 2, 16, 4, 2, 0.0f, 1, .nan_q = 1},
    {NULL, BF, 2, 17, 23, 2, 64, -1, -1, 0.0f, 0, .scale_zero = 1},
    {NULL, HF, 1, 20, 20, 3, 40, 5, 0, 0.0f, 2, .scale_zero = 1},
};
#undef BF
#undef HF
#undef F32

/* ---- fp16 with inf, every SIMD path against the scalar one ---- */
enum { EN_H = 2, EN_D = 24 };

typedef struct en_case {
    const char *name;
    int64_t at;   /* element set to value: in q (which 0), k (1), v (2) or dout (3) */
    int which;
    double value; /* +-inf, NaN */
    int64_t S;    /* query and key rows */
    int causal;
} en_case;

static const en_case en_cases[] = {
    {"v_inf", (5 * EN_H + 1) * EN_D + 3, 2, INFINITY, 160, 1},
    {"q_minus_inf", (7 * EN_H) * EN_D, 0, -INFINITY, 160, 1},
    {"k_inf", (40 * EN_H) * EN_D + 2, 1, INFINITY, 160, 1},
    {"dout_inf", (50 * EN_H + 1) * EN_D + 5, 3, -INFINITY, 160, 1},
    /* no mask and 1040 rows: the amx path's tiles could grow with the thread count
       (fwd.c fc_fwd_amx_pick), and a redo of a tile holding the NaN row must then not
       take in more rows on one thread than on five */
    {"q_nan_1040_rows", (3 * EN_H) * EN_D + 1, 0, NAN, 1040, 0},
};

/* 0 finite, 1 NaN, 2 +inf, 3 -inf */
static int en_class(double x) { return isnan(x) ? 1 : isinf(x) ? (x > 0 ? 2 : 3) : 0; }

/* The forward and backward of q, k, v, dout (qkvd, N = S H D each) on one path:
 * out, lse, dq, dk, dv into res (N, L = H S, then 3 N) as doubles; o (4 N) and l
 * (L) the outputs. */
static void en_path(const en_case *c, flashc_simd simd, const uint16_t *qkvd, uint16_t *o,
                    float *l, double *res) {
    const int64_t nn = c->S * EN_H * EN_D, nl = EN_H * c->S;
    int64_t sh[4] = {1, c->S, EN_H, EN_D}, ls[3] = {1, EN_H, c->S};
    flashc_tensor t[8];
    for (int i = 0; i < 4; i++)
        t[i] = flashc_tensor_contiguous((void *)(qkvd + i * nn), FLASHC_DTYPE_FP16, 4, sh,
                                        FLASHC_DEVICE_CPU);
    for (int i = 0; i < 4; i++)
        t[4 + i] = flashc_tensor_contiguous(o + i * nn, FLASHC_DTYPE_FP16, 4, sh,
                                            FLASHC_DEVICE_CPU);
    flashc_tensor lse = flashc_tensor_contiguous(l, FLASHC_DTYPE_FP32, 3, ls, FLASHC_DEVICE_CPU);
    flashc_fwd_args f;
    memset(&f, 0, sizeof f);
    f.abi = FLASHC_ABI_VERSION;
    f.q = t[0], f.k = t[1], f.v = t[2], f.out = t[4], f.softmax_lse = lse;
    flashc_bwd_args g;
    memset(&g, 0, sizeof g);
    g.abi = FLASHC_ABI_VERSION;
    g.q = t[0], g.k = t[1], g.v = t[2], g.dout = t[3], g.out = t[4], g.softmax_lse = lse;
    g.dq = t[5], g.dk = t[6], g.dv = t[7];
    flashc_params p = flashc_params_default();
    p.causal = c->causal;
    FC_ASSERT_OK(flashc_set_simd(simd));
    FC_ASSERT_OK(flashc_fwd(&f, &p, NULL, 0));
    FC_ASSERT_OK(flashc_bwd(&g, &p, NULL, 0));
    for (int64_t i = 0; i < nn; i++) res[i] = fc_get(o, FLASHC_DTYPE_FP16, i);
    for (int64_t i = 0; i < nl; i++) res[nn + i] = l[i];
    for (int64_t i = 0; i < 3 * nn; i++)
        res[nn + nl + i] = fc_get(o + nn, FLASHC_DTYPE_FP16, i);
}

static void en_body(const en_case *c, th_arena *ar) {
    const int64_t nn = c->S * EN_H * EN_D, nl = EN_H * c->S, R = 4 * nn + nl;
    uint16_t *qkvd = (uint16_t *)th_keep(ar, malloc((size_t)(4 * nn) * sizeof(uint16_t)));
    uint16_t *o = (uint16_t *)th_keep(ar, malloc((size_t)(4 * nn) * sizeof(uint16_t)));
    float *l = (float *)th_keep(ar, malloc((size_t)nl * sizeof(float)));
    double *r0 = th_dbl(ar, R), *r1 = th_dbl(ar, R), *one = th_dbl(ar, R);
    FC_ASSERT_TRUE(qkvd && o && l && r0 && r1 && one);
    static const char *what[] = {"out", "lse", "dq", "dk", "dv"};
    for (int64_t i = 0; i < 4 * nn; i++)
        fc_set(qkvd, FLASHC_DTYPE_FP16, i, fc_rand_uniform(-1.0, 1.0));
    if (c->which == 0) /* q's element against a key column of one sign: every score -inf */
        for (int64_t j = 0; j < c->S; j++)
            fc_set(qkvd + nn, FLASHC_DTYPE_FP16, (j * EN_H) * EN_D, 0.5);
    fc_set(qkvd + c->which * nn, FLASHC_DTYPE_FP16, c->at, c->value);
    flashc_simd saved = flashc_simd_active();
    en_path(c, FLASHC_SIMD_SCALAR, qkvd, o, l, r0);
    int nonfinite = 0;
    for (int64_t i = 0; i < R; i++) nonfinite += en_class(r0[i]) != 0;
    FC_EXPECT_TRUE(nonfinite > 0); /* the case reaches the outputs */
    /* one thread: the backward's fused schedule; five (B Hk = 2 tasks): two-pass */
    for (int s = FLASHC_SIMD_AVX2, threads = 1; s < FLASHC_SIMD_COUNT; threads = 6 - threads,
             s += threads == 1) {
        if (!flashc_simd_supported((flashc_simd)s)) continue;
        flashc_set_num_threads(threads);
        en_path(c, (flashc_simd)s, qkvd, o, l, r1);
        flashc_set_num_threads(0);
        int bad[5] = {0, 0, 0, 0, 0};
        for (int64_t i = 0; i < R; i++) {
            int k = i < nn ? 0 : i < nn + nl ? 1 : 2 + (int)((i - nn - nl) / nn);
            double tol = k == 1 ? 1e-3 : k == 0 ? 0x1p-8 : 0x1p-6; /* (gradients: fp16 sums) */
            bad[k] += en_class(r1[i]) != en_class(r0[i]) ||
                      (!en_class(r0[i]) && fabs(r1[i] - r0[i]) > tol * (1.0 + fabs(r0[i])));
        }
        for (int k = 0; k < 5; k++)
            if (bad[k])
                fc_test_fail(__FILE__, __LINE__, "simd=%s threads=%d: %d of %s differ from "
                             "scalar's", flashc_simd_name((flashc_simd)s), threads, bad[k],
                             what[k]);
        if (threads == 1) { /* and the other schedule bit for bit (NaN where NaN) */
            memcpy(one, r1, (size_t)R * sizeof(double));
            continue;
        }
        int moved = 0;
        for (int64_t i = 0; i < R; i++)
            moved += en_class(one[i]) != en_class(r1[i]) || (!en_class(r1[i]) && one[i] != r1[i]);
        if (moved)
            fc_test_fail(__FILE__, __LINE__, "simd=%s: %d values differ between 1 and 5 threads",
                         flashc_simd_name((flashc_simd)s), moved);
    }
    flashc_set_simd(saved);
}

static void en_run(const void *param) {
    th_arena ar = {0};
    en_body((const en_case *)param, &ar);
    th_arena_free(&ar);
}

FC_TEST_REGISTER(edge) {
    for (size_t i = 0; i < sizeof en_cases / sizeof en_cases[0]; i++) {
        char name[64];
        snprintf(name, sizeof name, "edge_fp16_nonfinite_%s", en_cases[i].name);
        fc_test_add(name, en_run, &en_cases[i]);
    }
    for (size_t i = 0; i < sizeof ed_cases / sizeof ed_cases[0]; i++) {
        char name[128];
        th_edge_name(name, sizeof name, "edge_", &ed_cases[i]);
        fc_test_add(name, ed_run, &ed_cases[i]);
    }
}
