/* test_bwd.c : flashc_bwd against the float64 reference by the tolerance rule of
 * DEVELOPERS.md, and two checks of the reference itself.
 *
 * The backward gets out and softmax_lse from the reference forward (so a forward
 * bug does not show up here), dout uniform in [-1, 1). The sweep mirrors
 * test_fwd.c at smaller sizes: every head dim once, every option under every
 * dtype, layouts (padded, heads-major, a qkv-packed dqkv, K/V and dK/dV as views
 * into larger buffers), determinism (two runs bitwise equal), and a subset under
 * every SIMD path with 1 and 2 threads.
 *
 * The reference checks: its backward equals central finite differences of its
 * forward (every option on at once), and FC_REF_LOWP on fp32 inputs stays within
 * 1e-6 of FC_REF_F64.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/reference.h"
#include "fc_test.h"
#include "helpers.h"

// ---- cases ----

typedef enum {
    BW_CONTIG,
    BW_PADDED,
    BW_BHSD,
    BW_QKVPACKED, /* q, k, v and dq, dk, dv views of [B, S, 3, H, D] buffers */
    BW_KVVIEW     /* k, v, dk, dv rows 2.. of [B+1, Sk+5, Hk, D] buffers */
} bw_layout;

static const char *const bw_layout_names[] = {"", "/padded", "/bhsd", "/qkvpacked", "/kvview"};

typedef struct bw_case {
    flashc_dtype dt;
    int B, Sq, Sk, H, Hk, D;
    int Dv;            /* head dim of v, out, dout, dv (D when 0): contiguous, padded or bhsd */
    th_opts o;
    bw_layout layout;
    int deterministic; /* params.deterministic */
    int repeat;        /* run twice, the gradients must be bitwise equal */
    double qr;         /* q uniform in [-qr, qr): 3 by default, 10 for peaked softmaxes */
    int simd, threads;
} bw_case;

enum { BW_MAX = 400 };
static bw_case bw_cases[BW_MAX];
static int bw_ncases;

/* Three [B, S, H, D] views at 0, H*D, 2*H*D of one [B, S, 3, H, D] buffer. */
static void bw_packed(th_buf *b, flashc_dtype dt, int64_t B, int64_t S, int64_t H, int64_t D,
                      flashc_tensor *t, int poison) {
    th_buf_new(b, dt, B * S * 3 * H * D, -1.0, 1.0);
    int64_t sh[4] = {B, S, H, D}, st[4] = {S * 3 * H * D, 3 * H * D, D, 1};
    for (int i = 0; i < 3; i++) t[i] = th_view(b, i * H * D, 4, sh, st);
    if (poison) th_poison(b, &t[0]), th_poison(b, &t[1]), th_poison(b, &t[2]);
}

/* A [B, Sk, Hk, D] view at row 2 of a [B+1, Sk+5, Hk, D] buffer. */
static flashc_tensor bw_kvview(th_buf *b, flashc_dtype dt, int64_t B, int64_t Sk, int64_t Hk,
                               int64_t D) {
    int64_t S2 = Sk + 5, sh[4] = {B, Sk, Hk, D}, st[4] = {S2 * Hk * D, Hk * D, D, 1};
    th_buf_new(b, dt, (B + 1) * S2 * Hk * D, -1.0, 1.0);
    return th_view(b, 2 * Hk * D, 4, sh, st);
}

// ---- one case ----

static void bw_body(const bw_case *c, th_arena *ar) {
    const flashc_dtype dt = c->dt;
    const int64_t B = c->B, Sq = c->Sq, Sk = c->Sk, H = c->H, Hk = c->Hk, D = c->D;
    const int64_t Dv = c->Dv ? c->Dv : D;
    int64_t qs[4] = {B, Sq, H, D}, ks[4] = {B, Sk, Hk, D}, vs[4] = {B, Sk, Hk, Dv},
            os[4] = {B, Sq, H, Dv};
    th_layout lay = c->layout == BW_PADDED ? TH_PADDED : c->layout == BW_BHSD ? TH_BHSD : TH_CONTIG;

    // ---- inputs ----
    flashc_bwd_args a;
    memset(&a, 0, sizeof a);
    a.abi = FLASHC_ABI_VERSION;
    th_buf *dqb = th_buf_in(ar), *dkb = dqb, *dvb = dqb;
    if (c->layout == BW_QKVPACKED) {
        flashc_tensor t[3];
        bw_packed(th_buf_in(ar), dt, B, Sq, H, D, t, 0);
        a.q = t[0];
        a.k = t[1];
        a.v = t[2];
        th_fill_view(&a.q, -c->qr, c->qr);
        bw_packed(dqb, dt, B, Sq, H, D, t, 1);
        a.dq = t[0];
        a.dk = t[1];
        a.dv = t[2];
    } else if (c->layout == BW_KVVIEW) {
        a.q = th_new(th_buf_in(ar), dt, 4, qs, TH_CONTIG, -c->qr, c->qr);
        a.k = bw_kvview(th_buf_in(ar), dt, B, Sk, Hk, D);
        a.v = bw_kvview(th_buf_in(ar), dt, B, Sk, Hk, D);
        a.dq = th_new_out(dqb, dt, 4, qs, TH_CONTIG);
        dkb = th_buf_in(ar);
        dvb = th_buf_in(ar);
        a.dk = bw_kvview(dkb, dt, B, Sk, Hk, D);
        a.dv = bw_kvview(dvb, dt, B, Sk, Hk, D);
        th_poison(dkb, &a.dk);
        th_poison(dvb, &a.dv);
    } else {
        a.q = th_new(th_buf_in(ar), dt, 4, qs, lay, -c->qr, c->qr);
        a.k = th_new(th_buf_in(ar), dt, 4, ks, lay, -1.0, 1.0);
        a.v = th_new(th_buf_in(ar), dt, 4, vs, lay, -1.0, 1.0);
        a.dq = th_new_out(dqb, dt, 4, qs, lay);
        dkb = th_buf_in(ar);
        dvb = th_buf_in(ar);
        a.dk = th_new_out(dkb, dt, 4, ks, lay);
        a.dv = th_new_out(dvb, dt, 4, vs, lay);
    }
    a.dout = th_new(th_buf_in(ar), dt, 4, os, lay, -1.0, 1.0);
    a.alibi_slopes = th_alibi_new(th_buf_in(ar), c->o.alibi, B, H);
    flashc_params p = th_params(&c->o);
    p.deterministic = c->deterministic;

    /* out and lse of the forward, from the reference */
    flashc_fwd_args f;
    memset(&f, 0, sizeof f);
    f.abi = FLASHC_ABI_VERSION;
    f.q = a.q;
    f.k = a.k;
    f.v = a.v;
    f.alibi_slopes = a.alibi_slopes;
    int64_t nq = B * Sq * H * D, nk = B * Sk * Hk * D, nl = B * H * Sq;
    int64_t no = B * Sq * H * Dv, nv = B * Sk * Hk * Dv;
    double *o64 = th_dbl(ar, no), *l64 = th_dbl(ar, nl);
    FC_ASSERT_OK(fc_ref_fwd(&f, &p, FC_REF_F64, o64, l64, NULL));
    a.out = th_new(th_buf_in(ar), dt, 4, os, lay, 0.0, 0.0);
    a.softmax_lse = th_new(th_buf_in(ar), FLASHC_DTYPE_FP32, 3, (int64_t[]){B, H, Sq},
                           lay == TH_PADDED ? TH_PADDED : TH_CONTIG, 0.0, 0.0);
    th_store_dense(&a.out, o64);
    th_store_dense(&a.softmax_lse, l64);

    // ---- run (twice when checking determinism) ----
    size_t bytes = 0;
    FC_ASSERT_OK(flashc_bwd_workspace_size(&a, &p, &bytes));
    double *first[3] = {NULL, NULL, NULL};
    flashc_tensor *grads[3] = {&a.dq, &a.dk, &a.dv};
    th_buf *gbufs[3] = {dqb, dkb, dvb};
    for (int run = 0; run <= c->repeat; run++) {
        if (run) {
            for (int g = 0; g < 3; g++) {
                first[g] = (double *)th_keep(ar, th_to_double(grads[g]));
                th_poison(gbufs[g], grads[g]);
            }
        }
        void *ws = th_ws_new(bytes);
        flashc_status s = flashc_bwd(&a, &p, ws, bytes);
        th_ws_free(ws, bytes);
        FC_ASSERT_OK(s);
    }
    if (c->repeat)
        for (int g = 0; g < 3; g++) {
            int64_t diff = th_bits_differ(grads[g], first[g]);
            if (diff)
                fc_test_fail(__FILE__, __LINE__, "%s: %lld elements differ between two runs",
                             g == 0 ? "dq" : g == 1 ? "dk" : "dv", (long long)diff);
        }

    // ---- reference and checks ----
    double *dq64 = th_dbl(ar, nq), *dqlp = th_dbl(ar, nq), *dk64 = th_dbl(ar, nk),
           *dklp = th_dbl(ar, nk), *dv64 = th_dbl(ar, nv), *dvlp = th_dbl(ar, nv);
    FC_ASSERT_OK(fc_ref_bwd(&a, &p, FC_REF_F64, dq64, dk64, dv64));
    FC_ASSERT_OK(fc_ref_bwd(&a, &p, FC_REF_LOWP, dqlp, dklp, dvlp));
    th_check("dq", dt, &a.dq, dq64, dqlp);
    th_check("dk", dt, &a.dk, dk64, dklp);
    th_check("dv", dt, &a.dv, dv64, dvlp);
    if (c->layout == BW_QKVPACKED) {
        flashc_tensor v3[3] = {a.dq, a.dk, a.dv};
        th_check_outside("dqkv", dqb, v3, 3);
    } else {
        th_check_outside("dq", dqb, &a.dq, 1);
        th_check_outside("dk", dkb, &a.dk, 1);
        th_check_outside("dv", dvb, &a.dv, 1);
    }
}

static void bw_run(const void *param) {
    const bw_case *c = (const bw_case *)param;
    th_env env = {c->simd, c->threads, FLASHC_SIMD_SCALAR};
    if (!th_env_enter(&env)) return;
    th_arena ar = {0};
    bw_body(c, &ar);
    th_arena_free(&ar);
    th_env_leave(&env);
}

// ---- checks of the reference itself ----

/* Inputs on a 2^-12 grid so that x +- 2^-10 is exact in fp32. */
static void bw_grid(float *x, int64_t n, double lo, double hi) {
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(floor(fc_rand_uniform(lo, hi) * 4096.0) / 4096.0);
}

/* dq, dk, dv of the reference against central differences of
 * L = sum(out * dout) of its forward, every option on. */
FC_TEST(bwd_reference_finite_differences) {
    enum { B = 2, Sq = 6, Sk = 7, H = 4, Hk = 2, D = 5 };
    static float q[B * Sq * H * D], k[B * Sk * Hk * D], v[B * Sk * Hk * D], dout[B * Sq * H * D];
    static float o[B * Sq * H * D], slopes[B * H];
    static double dq[B * Sq * H * D], dk[B * Sk * Hk * D], dv[B * Sk * Hk * D], ob[B * Sq * H * D];
    bw_grid(q, B * Sq * H * D, -2.0, 2.0);
    bw_grid(k, B * Sk * Hk * D, -1.0, 1.0);
    bw_grid(v, B * Sk * Hk * D, -1.0, 1.0);
    bw_grid(dout, B * Sq * H * D, -1.0, 1.0);
    for (int i = 0; i < B * H; i++) slopes[i] = 0.1f + 0.05f * (float)i;
    const int64_t qs[4] = {B, Sq, H, D}, ks[4] = {B, Sk, Hk, D}, as[2] = {B, H};
    flashc_fwd_args f;
    memset(&f, 0, sizeof f);
    f.abi = FLASHC_ABI_VERSION;
    f.q = flashc_tensor_contiguous(q, FLASHC_DTYPE_FP32, 4, qs, FLASHC_DEVICE_CPU);
    f.k = flashc_tensor_contiguous(k, FLASHC_DTYPE_FP32, 4, ks, FLASHC_DEVICE_CPU);
    f.v = flashc_tensor_contiguous(v, FLASHC_DTYPE_FP32, 4, ks, FLASHC_DEVICE_CPU);
    f.alibi_slopes = flashc_tensor_contiguous(slopes, FLASHC_DTYPE_FP32, 2, as, FLASHC_DEVICE_CPU);
    flashc_bwd_args a;
    memset(&a, 0, sizeof a);
    a.abi = FLASHC_ABI_VERSION;
    a.q = f.q;
    a.k = f.k;
    a.v = f.v;
    a.alibi_slopes = f.alibi_slopes;
    a.dout = flashc_tensor_contiguous(dout, FLASHC_DTYPE_FP32, 4, qs, FLASHC_DEVICE_CPU);
    a.out = flashc_tensor_contiguous(o, FLASHC_DTYPE_FP32, 4, qs, FLASHC_DEVICE_CPU);
    th_opts opt = TH_OPTS_NONE;
    opt.causal = 1;
    opt.wl = 3;
    opt.softcap = 0.9f;
    opt.dropout = 0.3f;
    opt.scale = 0.6f;
    flashc_params p = th_params(&opt);
    FC_ASSERT_OK(fc_ref_bwd(&a, &p, FC_REF_F64, dq, dk, dv));
    float *xs[3] = {q, k, v};
    const double *gs[3] = {dq, dk, dv};
    const int64_t ns[3] = {B * Sq * H * D, B * Sk * Hk * D, B * Sk * Hk * D};
    const double eps = 1.0 / 1024.0;
    double worst = 0.0, gmax = 0.0;
    for (int t = 0; t < 3; t++)
        for (int64_t e = 0; e < ns[t]; e++) {
            float save = xs[t][e];
            double L[2];
            for (int s = 0; s < 2; s++) {
                xs[t][e] = save + (float)(s ? -eps : eps);
                FC_ASSERT_OK(fc_ref_fwd(&f, &p, FC_REF_F64, ob, NULL, NULL));
                L[s] = 0.0;
                for (int64_t i = 0; i < ns[0]; i++) L[s] += ob[i] * dout[i];
            }
            xs[t][e] = save;
            double fd = (L[0] - L[1]) / (2.0 * eps);
            if (fabs(fd - gs[t][e]) > worst) worst = fabs(fd - gs[t][e]);
            if (fabs(gs[t][e]) > gmax) gmax = fabs(gs[t][e]);
        }
    /* central differences with eps = 2^-10 are accurate to ~eps^2 */
    FC_EXPECT_NEAR(worst, 0.0, 1e-5);
    FC_EXPECT_TRUE(gmax > 0.1);
}

/* FC_REF_LOWP on fp32 inputs is plain fp32: within 1e-6 of FC_REF_F64. */
FC_TEST(bwd_reference_lowp_fp32) {
    enum { B = 2, Sq = 37, Sk = 53, H = 4, Hk = 2, D = 40 };
    th_arena ar = {0};
    const int64_t qs[4] = {B, Sq, H, D}, ks[4] = {B, Sk, Hk, D};
    flashc_bwd_args a;
    memset(&a, 0, sizeof a);
    a.abi = FLASHC_ABI_VERSION;
    a.q = th_new(th_buf_in(&ar), FLASHC_DTYPE_FP32, 4, qs, TH_CONTIG, -3.0, 3.0);
    a.k = th_new(th_buf_in(&ar), FLASHC_DTYPE_FP32, 4, ks, TH_CONTIG, -1.0, 1.0);
    a.v = th_new(th_buf_in(&ar), FLASHC_DTYPE_FP32, 4, ks, TH_CONTIG, -1.0, 1.0);
    a.dout = th_new(th_buf_in(&ar), FLASHC_DTYPE_FP32, 4, qs, TH_CONTIG, -1.0, 1.0);
    a.out = th_new(th_buf_in(&ar), FLASHC_DTYPE_FP32, 4, qs, TH_CONTIG, 0.0, 0.0);
    a.alibi_slopes = th_alibi_new(th_buf_in(&ar), 1, B, H);
    th_opts opt = TH_OPTS_NONE;
    opt.causal = 1;
    opt.softcap = 1.5f;
    opt.dropout = 0.17f;
    flashc_params p = th_params(&opt);
    flashc_fwd_args f;
    memset(&f, 0, sizeof f);
    f.abi = FLASHC_ABI_VERSION;
    f.q = a.q;
    f.k = a.k;
    f.v = a.v;
    f.alibi_slopes = a.alibi_slopes;
    int64_t nq = B * Sq * H * D, nk = B * Sk * Hk * D, nl = B * H * Sq;
    double *r[2][6];
    for (int m = 0; m < 2; m++) {
        r[m][0] = th_dbl(&ar, nq);
        r[m][1] = th_dbl(&ar, nl);
        r[m][2] = th_dbl(&ar, nq);
        r[m][3] = th_dbl(&ar, nk);
        r[m][4] = th_dbl(&ar, nk);
        r[m][5] = th_dbl(&ar, nl * Sk);
        fc_ref_mode mode = m ? FC_REF_LOWP : FC_REF_F64;
        FC_EXPECT_STATUS(fc_ref_fwd(&f, &p, mode, r[m][0], r[m][1], r[m][5]), FLASHC_OK);
        FC_EXPECT_STATUS(fc_ref_bwd(&a, &p, mode, r[m][2], r[m][3], r[m][4]), FLASHC_OK);
    }
    const int64_t ns[6] = {nq, nl, nq, nk, nk, nl * Sk};
    for (int i = 0; i < 6; i++) FC_EXPECT_NEAR(fc_max_abs_err(r[1][i], r[0][i], ns[i]), 0.0, 1e-6);
    th_arena_free(&ar);
}

// ---- the sweep ----

static bw_case *bw_add(flashc_dtype dt, int B, int Sq, int Sk, int H, int Hk, int D, th_opts o) {
    if (bw_ncases == BW_MAX) return &bw_cases[BW_MAX - 1]; /* table full: grow BW_MAX */
    bw_case *c = &bw_cases[bw_ncases++];
    memset(c, 0, sizeof *c);
    c->dt = dt;
    c->B = B;
    c->Sq = Sq;
    c->Sk = Sk;
    c->H = H;
    c->Hk = Hk;
    c->D = D;
    c->o = o;
    c->qr = 3.0;
    c->simd = -1;
    return c;
}

static th_opts bw_option(int i) { return th_option_cycle(i, (th_windows){9, 5, 12, 3, 10, 20}); }

FC_TEST_REGISTER(bwd_sweep) {
    static const flashc_dtype dts[3] = {FLASHC_DTYPE_BF16, FLASHC_DTYPE_FP16, FLASHC_DTYPE_FP32};
    static const int lens[7][2] = {{17, 33}, {33, 17},   {64, 64}, {1, 40},
                                   {40, 1},  {113, 113}, {50, 113}};
    static const int gqa[4][2] = {{2, 2}, {4, 2}, {4, 1}, {6, 3}};

    // ---- every head dim once ----
    static const int dims[12] = {1, 7, 32, 64, 80, 96, 128, 160, 192, 200, 224, 256};
    for (int i = 0; i < 12; i++) {
        int big = dims[i] >= 160;
        const int *l = lens[i % 7], *g = gqa[big ? i % 2 : i % 4];
        bw_add(dts[i % 3], big ? 1 : 2, l[0], l[1], g[0], g[1], dims[i], bw_option(i * 5));
    }

    // ---- every option under every dtype ----
    static const int odims[4] = {64, 32, 96, 128};
    for (int d = 0; d < 3; d++)
        for (int i = 0; i < TH_OPTION_CYCLE; i++) {
            int k = d * 13 + i;
            const int *l = lens[k % 7], *g = gqa[k % 4];
            bw_add(dts[d], 2, l[0], l[1], g[0], g[1], odims[k % 4], bw_option(i));
        }

    // ---- layouts ----
    bw_add(FLASHC_DTYPE_BF16, 2, 64, 64, 4, 4, 64, bw_option(1))->layout = BW_QKVPACKED;
    bw_add(FLASHC_DTYPE_FP32, 2, 17, 17, 2, 2, 32, bw_option(9))->layout = BW_QKVPACKED;
    bw_add(FLASHC_DTYPE_FP16, 2, 40, 64, 6, 3, 80, bw_option(6))->layout = BW_PADDED;
    bw_add(FLASHC_DTYPE_BF16, 2, 64, 33, 4, 2, 64, bw_option(8))->layout = BW_BHSD;
    bw_add(FLASHC_DTYPE_FP32, 2, 33, 64, 4, 1, 96, bw_option(4))->layout = BW_KVVIEW;

    // ---- determinism: requested, and the CPU backend's promise without it ----
    bw_case *c = bw_add(FLASHC_DTYPE_BF16, 2, 113, 113, 4, 1, 64, bw_option(11));
    c->deterministic = 1;
    c->repeat = 1;
    c = bw_add(FLASHC_DTYPE_FP32, 1, 64, 113, 6, 3, 128, bw_option(7));
    c->repeat = 1;
    c->threads = 2;

    // ---- longer ----
    bw_add(FLASHC_DTYPE_BF16, 1, 257, 257, 2, 2, 128, bw_option(1));
    th_opts o = TH_OPTS_NONE;
    o.wl = 64;
    o.wr = 0;
    bw_add(FLASHC_DTYPE_FP16, 1, 1000, 113, 2, 1, 64, o);
    // the amx path's wide tiles (bwd.c: no mask, at least two blocks of 256 keys a KV
    // head, enough of them for the threads), a short last block; both schedules, twice
    for (int t = 1; t <= 2; t++) {
        o = (th_opts)TH_OPTS_NONE;
        o.softcap = 1.5f;
        o.dropout = t == 2 ? 0.1f : 0.0f;
        c = bw_add(FLASHC_DTYPE_BF16, 2, 300, 600, 8, 4, 72, o);
        c->threads = t;
        c->repeat = 1;
        o = (th_opts)TH_OPTS_NONE;
        o.alibi = t;
        c = bw_add(FLASHC_DTYPE_FP16, 1, 200, 530, 4, 4, 64, o);
        c->threads = t;
        c->repeat = 1;
    }
    c = bw_add(FLASHC_DTYPE_BF16, 1, 64, 2100, 2, 1, 40, (th_opts)TH_OPTS_NONE); /* two-pass */
    c->threads = 2;
    c->repeat = 1;

    // ---- peaked softmaxes (q in [-10, 10)) ----
    bw_add(FLASHC_DTYPE_FP32, 1, 113, 257, 2, 1, 64, bw_option(0))->qr = 10.0;
    bw_add(FLASHC_DTYPE_BF16, 2, 64, 113, 4, 2, 96, bw_option(11))->qr = 10.0;

    // ---- every head dim under every option, short sequences ----
    static const int glens[3][2] = {{21, 30}, {30, 21}, {26, 26}};
    for (int i = 0; i < 12; i++)
        for (int k = 0; k < TH_OPTION_CYCLE; k++) {
            const int *l = glens[(i + k) % 3];
            bw_add(dts[(i + 2 * k) % 3], 1, l[0], l[1], 4, 2, dims[i], bw_option(k));
        }

    // ---- every SIMD path with 1 and 2 threads ----
    for (int simd = 0; simd < FLASHC_SIMD_COUNT; simd++)
        for (int t = 1; t <= 2; t++) {
            c = bw_add(FLASHC_DTYPE_BF16, 2, 40, 64, 4, 2, 80, bw_option(11));
            c->simd = simd;
            c->threads = t;
            c = bw_add(FLASHC_DTYPE_FP16, 2, 64, 33, 2, 2, 7, bw_option(12));
            c->simd = simd;
            c->threads = t;
        }

    // ---- a value head dim Dv other than D (MLA: 192/128), every option, both
    // schedules (1 thread: fused; 2 threads, many tasks: two-pass), twice ----
    static const int dvs[8][2] = {{192, 128}, {128, 192}, {64, 32}, {72, 40},
                                  {40, 72},   {7, 33},    {256, 16}, {1, 256}};
    for (int i = 0; i < 8; i++)
        for (int k = 0; k < TH_OPTION_CYCLE; k++) {
            const int *l = lens[(i + k) % 7], *g = gqa[(i + k) % 4];
            c = bw_add(dts[(i + k) % 3], 2, l[0], l[1], g[0], g[1], dvs[i][0], bw_option(k));
            c->Dv = dvs[i][1];
            c->layout = k % 3 == 1 ? BW_PADDED : k % 3 == 2 ? BW_BHSD : BW_CONTIG;
            c->repeat = k % 4 == 0;
            c->deterministic = k % 2;
        }
    for (int simd = 0; simd < FLASHC_SIMD_COUNT; simd++)
        for (int t = 1; t <= 2; t++)
            for (int i = 0; i < 3; i++) {
                c = bw_add(dts[i], 2, 40 + 24 * i, 64 - 24 * i, 4, 2, dvs[i][0],
                           bw_option(4 * i + simd + t));
                c->Dv = dvs[i][1];
                c->simd = simd;
                c->threads = t;
                c->repeat = 1;
            }

    // ---- bf16 on AVX-512 (its bf16 dot products where the CPU has
    // AVX512_BF16): head dims odd and off the multiples of 2, 16 and 32,
    // Dv != D, Sq != Sk both ways with diagonals at odd offsets across
    // several tiles (the sub-blocks of boundary tiles), both schedules, twice ----
    static const int bdims[7][2] = {{7, 0}, {18, 0}, {33, 17}, {40, 0}, {72, 40}, {100, 0}, {128, 0}};
    static const int blens[5][2] = {{197, 262}, {262, 197}, {131, 131}, {1, 300}, {300, 1}};
    static const int bopts[12] = {1, 5, 4, 0, 11, 12, 9, 2, 3, 8, 6, 1};
    for (int i = 0; i < 12; i++) {
        const int *l = blens[i % 5], *g = gqa[i % 4];
        c = bw_add(FLASHC_DTYPE_BF16, 1 + i % 2, l[0], l[1], g[0], g[1], bdims[i % 7][0],
                   bw_option(bopts[i]));
        c->Dv = bdims[i % 7][1];
        c->simd = FLASHC_SIMD_AVX512;
        c->threads = 1 + i % 2;
        c->repeat = 1;
        c->qr = i % 3 == 2 ? 10.0 : 3.0;
    }
    static const int clens[4][2] = {{257, 320}, {320, 257}, {255, 255}, {129, 450}};
    for (int i = 0; i < 8; i++) {
        th_opts oc = TH_OPTS_NONE;
        oc.causal = 1;
        if (i >= 4) oc.wl = 37; /* a local window: both edges of the band */
        c = bw_add(FLASHC_DTYPE_BF16, 1, clens[i % 4][0], clens[i % 4][1], 2, 1, 64 + 16 * (i % 2),
                   oc);
        c->simd = FLASHC_SIMD_AVX512;
        c->threads = 1 + i % 2;
        c->repeat = 1;
    }

    for (int i = 0; i < bw_ncases; i++) {
        const bw_case *k = &bw_cases[i];
        char name[256];
        snprintf(name, sizeof name, "bwd/%s/d%d/b%d/sq%d/sk%d/h%d:%d", flashc_dtype_name(k->dt),
                 k->D, k->B, k->Sq, k->Sk, k->H, k->Hk);
        if (k->Dv) {
            size_t n0 = strlen(name);
            snprintf(name + n0, sizeof name - n0, "/dv%d", k->Dv);
        }
        th_opts_name(name, sizeof name, &k->o);
        size_t len = strlen(name);
        snprintf(name + len, sizeof name - len, "%s%s%s%s", bw_layout_names[k->layout],
                 k->deterministic ? "/deterministic" : "", k->repeat ? "/twice" : "",
                 k->qr > 3.0 ? "/peaked" : "");
        th_env_name(name, sizeof name, k->simd, k->threads);
        fc_test_add(name, bw_run, k);
    }
}
