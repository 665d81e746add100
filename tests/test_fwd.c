/* test_fwd.c : flashc_fwd against the float64 reference (tests/support/reference.c) by the
 * tolerance rule of DEVELOPERS.md.
 *
 * The sweep is pairwise rather than a full cross product: a head-dim sweep (every
 * D once, the other parameters cycling), an option sweep (every mask / softcap /
 * ALiBi / dropout option under every dtype, lengths and GQA ratios cycling),
 * memory layouts (padded strides, heads-major, qkv- and kv-packed views, KV as a
 * view into a larger buffer), a few long sequences, a subset run under every
 * SIMD path with 1 and 2 threads, and decode shapes (Sq 1..16, GQA groups of 1..8
 * packed into one task, few keys and many). Every case checks out, lse and attn_probs where
 * present, that rows which see no key give out = 0 and lse = -inf, that nothing
 * outside the output views and no input was written, and the workspace canary.
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
    FWD_CONTIG,
    FWD_PADDED,    /* every operand with padded strides */
    FWD_BHSD,      /* every operand heads-major in memory */
    FWD_QKVPACKED, /* q, k, v views of one [B, S, 3, H, D] buffer */
    FWD_KVPACKED,  /* k, v views of one [B, Sk, 2, Hk, D] buffer */
    FWD_KVVIEW     /* k, v rows 3.. of a [B+1, Sk+11, Hk, D] buffer */
} fwd_layout;

static const char *const fwd_layout_names[] = {"", "/padded", "/bhsd", "/qkvpacked", "/kvpacked",
                                               "/kvview"};

typedef struct fwd_case {
    flashc_dtype dt;
    int B, Sq, Sk, H, Hk, D;
    int Dv;         /* head dim of v and out (D when 0): contiguous, padded or bhsd layouts */
    th_opts o;
    int lse, probs; /* request softmax_lse / attn_probs */
    fwd_layout layout;
    int conv_ws;    /* workspace NULL with 0 bytes: the library allocates */
    double qr;      /* q uniform in [-qr, qr): 3 by default, 10 for peaked softmaxes */
    int simd, threads;
} fwd_case;

enum { FWD_MAX = 440 };
static fwd_case fwd_cases[FWD_MAX];
static int fwd_ncases;

// ---- one case ----

static void fwd_body(const fwd_case *c, th_arena *ar) {
    const flashc_dtype dt = c->dt;
    const int64_t B = c->B, Sq = c->Sq, Sk = c->Sk, H = c->H, Hk = c->Hk, D = c->D;
    const int64_t Dv = c->Dv ? c->Dv : D;
    int64_t qs[4] = {B, Sq, H, D}, ks[4] = {B, Sk, Hk, D}, vs[4] = {B, Sk, Hk, Dv},
            os[4] = {B, Sq, H, Dv};
    th_layout lay = c->layout == FWD_PADDED ? TH_PADDED
                    : c->layout == FWD_BHSD ? TH_BHSD
                                            : TH_CONTIG;
    th_layout lay_small = c->layout == FWD_PADDED ? TH_PADDED : TH_CONTIG;

    // ---- inputs: q in [-qr, qr) so the softmax is peaked, k and v in [-1, 1) ----
    const double qr = c->qr;
    flashc_fwd_args a;
    memset(&a, 0, sizeof a);
    a.abi = FLASHC_ABI_VERSION;
    th_buf *qb = th_buf_in(ar), *kb = qb, *vb = qb;
    if (c->layout == FWD_QKVPACKED) {
        th_buf_new(qb, dt, B * Sq * 3 * H * D, -1.0, 1.0);
        int64_t st[4] = {Sq * 3 * H * D, 3 * H * D, D, 1};
        a.q = th_view(qb, 0, 4, qs, st);
        a.k = th_view(qb, H * D, 4, ks, st);
        a.v = th_view(qb, 2 * H * D, 4, ks, st);
        th_fill_view(&a.q, -qr, qr);
    } else if (c->layout == FWD_KVPACKED) {
        a.q = th_new(qb, dt, 4, qs, TH_CONTIG, -qr, qr);
        kb = vb = th_buf_in(ar);
        th_buf_new(kb, dt, B * Sk * 2 * Hk * D, -1.0, 1.0);
        int64_t st[4] = {Sk * 2 * Hk * D, 2 * Hk * D, D, 1};
        a.k = th_view(kb, 0, 4, ks, st);
        a.v = th_view(kb, Hk * D, 4, ks, st);
    } else if (c->layout == FWD_KVVIEW) {
        a.q = th_new(qb, dt, 4, qs, TH_CONTIG, -qr, qr);
        int64_t S2 = Sk + 11, st[4] = {S2 * Hk * D, Hk * D, D, 1};
        kb = th_buf_in(ar);
        vb = th_buf_in(ar);
        th_buf_new(kb, dt, (B + 1) * S2 * Hk * D, -1.0, 1.0);
        th_buf_new(vb, dt, (B + 1) * S2 * Hk * D, -1.0, 1.0);
        a.k = th_view(kb, 3 * Hk * D, 4, ks, st);
        a.v = th_view(vb, (S2 + 3) * Hk * D, 4, ks, st);
    } else {
        a.q = th_new(qb, dt, 4, qs, lay, -qr, qr);
        kb = th_buf_in(ar);
        vb = th_buf_in(ar);
        a.k = th_new(kb, dt, 4, ks, lay, -1.0, 1.0);
        a.v = th_new(vb, dt, 4, vs, lay, -1.0, 1.0);
    }
    th_buf *sb = th_buf_in(ar);
    a.alibi_slopes = th_alibi_new(sb, c->o.alibi, B, H);
    th_snapshot(qb);
    if (kb != qb) th_snapshot(kb);
    if (vb != kb) th_snapshot(vb);

    // ---- outputs, poisoned ----
    th_buf *ob = th_buf_in(ar), *lb = th_buf_in(ar), *pb = th_buf_in(ar);
    a.out = th_new_out(ob, dt, 4, os, lay);
    if (c->lse)
        a.softmax_lse = th_new_out(lb, FLASHC_DTYPE_FP32, 3, (int64_t[]){B, H, Sq}, lay_small);
    if (c->probs)
        a.attn_probs = th_new_out(pb, FLASHC_DTYPE_FP32, 4, (int64_t[]){B, H, Sq, Sk}, lay_small);
    flashc_params p = th_params(&c->o);

    // ---- run ----
    size_t bytes = 0;
    FC_ASSERT_OK(flashc_fwd_workspace_size(&a, &p, &bytes));
    void *ws = c->conv_ws ? NULL : th_ws_new(bytes);
    flashc_status s = flashc_fwd(&a, &p, ws, c->conv_ws ? 0 : bytes);
    th_ws_free(ws, bytes);
    FC_ASSERT_OK(s);

    // ---- reference and checks ----
    int64_t nq = B * Sq * H * Dv, nl = B * H * Sq, np = nl * Sk;
    double *o64 = th_dbl(ar, nq), *olp = th_dbl(ar, nq), *l64 = th_dbl(ar, nl),
           *llp = th_dbl(ar, nl);
    double *p64 = c->probs ? th_dbl(ar, np) : NULL, *plp = c->probs ? th_dbl(ar, np) : NULL;
    FC_ASSERT_OK(fc_ref_fwd(&a, &p, FC_REF_F64, o64, l64, p64));
    FC_ASSERT_OK(fc_ref_fwd(&a, &p, FC_REF_LOWP, olp, llp, plp));
    th_check("out", dt, &a.out, o64, olp);
    th_check_masked_rows(l64, (double *)th_keep(ar, th_to_double(&a.out)), B, Sq, H, Dv);
    if (c->lse) th_check("lse", dt, &a.softmax_lse, l64, llp);
    if (c->probs) {
        th_check("probs", dt, &a.attn_probs, p64, plp);
        th_check_signs("probs", (double *)th_keep(ar, th_to_double(&a.attn_probs)), p64, np);
    }
    th_check_outside("out", ob, &a.out, 1);
    if (c->lse) th_check_outside("softmax_lse", lb, &a.softmax_lse, 1);
    if (c->probs) th_check_outside("attn_probs", pb, &a.attn_probs, 1);
    if (c->probs) {
        /* attn_probs is a pass of its own: out and lse are, bit for bit, those
         * of the same call without it (every layout a path picks included) */
        double *out1 = (double *)th_keep(ar, th_to_double(&a.out));
        double *lse1 = c->lse ? (double *)th_keep(ar, th_to_double(&a.softmax_lse)) : NULL;
        flashc_fwd_args a2 = a;
        a2.attn_probs = (flashc_tensor){0};
        a2.out = th_new_out(th_buf_in(ar), dt, 4, os, lay);
        if (c->lse)
            a2.softmax_lse =
                th_new_out(th_buf_in(ar), FLASHC_DTYPE_FP32, 3, (int64_t[]){B, H, Sq}, lay_small);
        FC_ASSERT_OK(flashc_fwd_workspace_size(&a2, &p, &bytes));
        ws = th_ws_new(bytes);
        s = flashc_fwd(&a2, &p, ws, bytes);
        th_ws_free(ws, bytes);
        FC_ASSERT_OK(s);
        double *out2 = (double *)th_keep(ar, th_to_double(&a2.out));
        if (memcmp(out1, out2, (size_t)nq * sizeof(double)) != 0)
            fc_test_fail(__FILE__, __LINE__, "out differs from the same call without attn_probs");
        if (c->lse &&
            memcmp(lse1, th_keep(ar, th_to_double(&a2.softmax_lse)), (size_t)nl * sizeof(double)))
            fc_test_fail(__FILE__, __LINE__, "lse differs from the same call without attn_probs");
    }
    th_check_outside("q", qb, NULL, 0);
    if (kb != qb) th_check_outside("k", kb, NULL, 0);
    if (vb != kb) th_check_outside("v", vb, NULL, 0);
}

static void fwd_run(const void *param) {
    const fwd_case *c = (const fwd_case *)param;
    th_env env = {c->simd, c->threads, FLASHC_SIMD_SCALAR};
    if (!th_env_enter(&env)) return;
    th_arena ar = {0};
    fwd_body(c, &ar);
    th_arena_free(&ar);
    th_env_leave(&env);
}

// ---- one workspace for several calls ----
/* A model's layers call the forward again and again with one workspace and new K
 * and V at the same places. The second call's out and lse must be right, and those
 * of a fresh workspace bit for bit: the amx path's tall tiles keep a copy of a kv
 * head in the workspace with the (b, hk) it holds (fwd.c, fc_fwd_head_kv), which a
 * call must not take from the call before. MQA, so that every tile of both calls has
 * (b, hk) = (0, 0); and the workspace zeroed between the calls, which reads as
 * holding (0, 0) too (th_ws_new's 0xff poison reads as none). */
typedef struct fwd_reuse_case {
    int simd, threads;
} fwd_reuse_case;

typedef struct fwd_reuse_call {
    const flashc_fwd_args *a;
    const flashc_params *p;
    void *ws;
    size_t bytes;
    flashc_status st;
} fwd_reuse_call;

static void fwd_reuse_call_run(void *ctx) {
    fwd_reuse_call *k = (fwd_reuse_call *)ctx;
    k->st = flashc_fwd(k->a, k->p, k->ws, k->bytes);
}

static void fwd_reuse_body(th_arena *ar) {
    const flashc_dtype dt = FLASHC_DTYPE_BF16;
    const int64_t B = 1, Sq = 1100, Sk = 600, H = 8, Hk = 1, D = 64;
    int64_t qs[4] = {B, Sq, H, D}, ks[4] = {B, Sk, Hk, D};
    flashc_fwd_args a;
    memset(&a, 0, sizeof a);
    a.abi = FLASHC_ABI_VERSION;
    a.q = th_new(th_buf_in(ar), dt, 4, qs, TH_CONTIG, -3.0, 3.0);
    a.k = th_new(th_buf_in(ar), dt, 4, ks, TH_CONTIG, -1.0, 1.0);
    a.v = th_new(th_buf_in(ar), dt, 4, ks, TH_CONTIG, -1.0, 1.0);
    a.out = th_new_out(th_buf_in(ar), dt, 4, qs, TH_CONTIG);
    a.softmax_lse = th_new_out(th_buf_in(ar), FLASHC_DTYPE_FP32, 3, (int64_t[]){B, H, Sq},
                               TH_CONTIG);
    flashc_params p = th_params(&(th_opts)TH_OPTS_NONE);
    size_t bytes = 0;
    FC_ASSERT_OK(flashc_fwd_workspace_size(&a, &p, &bytes));
    void *ws = th_ws_new(bytes);
    fwd_reuse_call call = {&a, &p, ws, bytes, FLASHC_OK};
    char *log = th_capture_log("1", fwd_reuse_call_run, &call);
    if (call.st == FLASHC_OK && flashc_simd_active() == FLASHC_SIMD_AMX &&
        !(log && strstr(log, "head_kv=1")))
        fc_test_fail(__FILE__, __LINE__, "the amx path took no copy of a kv head: %s",
                     log ? log : "(no log)");
    free(log);
    memset(ws, 0, bytes);
    th_fill_view(&a.k, -1.0, 1.0); /* new K and V where the first call's were */
    th_fill_view(&a.v, -1.0, 1.0);
    if (call.st == FLASHC_OK) call.st = flashc_fwd(&a, &p, ws, bytes);
    th_ws_free(ws, bytes);
    FC_ASSERT_OK(call.st);
    double *out = (double *)th_keep(ar, th_to_double(&a.out));
    double *lse = (double *)th_keep(ar, th_to_double(&a.softmax_lse));

    int64_t nq = B * Sq * H * D, nl = B * H * Sq;
    double *o64 = th_dbl(ar, nq), *olp = th_dbl(ar, nq), *l64 = th_dbl(ar, nl),
           *llp = th_dbl(ar, nl);
    FC_ASSERT_OK(fc_ref_fwd(&a, &p, FC_REF_F64, o64, l64, NULL));
    FC_ASSERT_OK(fc_ref_fwd(&a, &p, FC_REF_LOWP, olp, llp, NULL));
    th_check("out", dt, &a.out, o64, olp);
    th_check("lse", FLASHC_DTYPE_FP32, &a.softmax_lse, l64, llp);

    ws = th_ws_new(bytes);
    flashc_status s = flashc_fwd(&a, &p, ws, bytes);
    th_ws_free(ws, bytes);
    FC_ASSERT_OK(s);
    int64_t dout = th_bits_differ(&a.out, out), dlse = th_bits_differ(&a.softmax_lse, lse);
    if (dout || dlse)
        fc_test_fail(__FILE__, __LINE__, "a reused workspace gave other bits than a fresh one: "
                     "%lld out and %lld lse elements", (long long)dout, (long long)dlse);
}

static void fwd_reuse_run(const void *param) {
    const fwd_reuse_case *c = (const fwd_reuse_case *)param;
    th_env env = {c->simd, c->threads, FLASHC_SIMD_SCALAR};
    if (!th_env_enter(&env)) return;
    th_arena ar = {0};
    fwd_reuse_body(&ar);
    th_arena_free(&ar);
    th_env_leave(&env);
}

// ---- the sweep ----

static fwd_case *fwd_add(flashc_dtype dt, int B, int Sq, int Sk, int H, int Hk, int D, th_opts o) {
    if (fwd_ncases == FWD_MAX) return &fwd_cases[FWD_MAX - 1]; /* table full: grow FWD_MAX */
    fwd_case *c = &fwd_cases[fwd_ncases++];
    memset(c, 0, sizeof *c);
    c->dt = dt;
    c->B = B;
    c->Sq = Sq;
    c->Sk = Sk;
    c->H = H;
    c->Hk = Hk;
    c->D = D;
    c->o = o;
    c->lse = 1;
    c->probs = o.dropout > 0.0f;
    c->qr = 3.0;
    c->simd = -1;
    return c;
}

static const flashc_dtype fwd_dtypes[3] = {FLASHC_DTYPE_BF16, FLASHC_DTYPE_FP16, FLASHC_DTYPE_FP32};

/* The option set every sweep cycles through. */
static th_opts fwd_option(int i) { return th_option_cycle(i, (th_windows){16, 8, 32, 5, 24, 40}); }

FC_TEST_REGISTER(fwd_sweep) {
    static const int lens[7][2] = {{113, 257}, {257, 113}, {113, 113}, {17, 257},
                                   {257, 17}, {1, 257}, {257, 1}};
    static const int gqa[4][2] = {{2, 2}, {4, 2}, {4, 1}, {6, 3}};

    // ---- every head dim once ----
    static const int dims[12] = {1, 7, 32, 64, 80, 96, 128, 160, 192, 200, 224, 256};
    for (int i = 0; i < 12; i++) {
        int big = dims[i] >= 160;
        const int *l = lens[i % 7], *g = gqa[big ? i % 2 : i % 4];
        fwd_add(fwd_dtypes[i % 3], big ? 1 : 2, l[0], l[1], g[0], g[1], dims[i], fwd_option(i * 5));
    }

    // ---- every option under every dtype ----
    static const int odims[4] = {64, 128, 96, 32};
    for (int d = 0; d < 3; d++)
        for (int i = 0; i < TH_OPTION_CYCLE; i++) {
            int k = d * 13 + i;
            const int *l = lens[k % 7], *g = gqa[k % 4];
            fwd_case *c =
                fwd_add(fwd_dtypes[d], 2, l[0], l[1], g[0], g[1], odims[k % 4], fwd_option(i));
            c->lse = k % 5 != 3;
            c->probs = c->probs || k % 6 == 2;
        }

    // ---- rows that see no key: causal or a window with Sq > Sk ----
    th_opts o = TH_OPTS_NONE;
    o.causal = 1;
    fwd_add(FLASHC_DTYPE_BF16, 2, 40, 9, 4, 2, 64, o)->probs = 1;
    fwd_add(FLASHC_DTYPE_FP32, 1, 17, 1, 2, 1, 32, o);
    o = (th_opts)TH_OPTS_NONE;
    o.wl = 3;
    o.wr = 2;
    fwd_add(FLASHC_DTYPE_FP16, 2, 113, 30, 2, 2, 64, o);

    // ---- memory layouts ----
    o = (th_opts)TH_OPTS_NONE;
    o.causal = 1;
    fwd_add(FLASHC_DTYPE_BF16, 2, 113, 113, 4, 4, 64, o)->layout = FWD_QKVPACKED;
    o = (th_opts)TH_OPTS_NONE;
    o.dropout = 0.17f;
    fwd_add(FLASHC_DTYPE_FP32, 2, 17, 17, 2, 2, 32, o)->layout = FWD_QKVPACKED;
    o = (th_opts)TH_OPTS_NONE;
    o.wl = 20;
    o.wr = 3;
    fwd_add(FLASHC_DTYPE_FP16, 2, 113, 257, 4, 2, 128, o)->layout = FWD_KVPACKED;
    o = (th_opts)TH_OPTS_NONE;
    o.alibi = 2;
    fwd_add(FLASHC_DTYPE_BF16, 2, 257, 17, 4, 1, 80, o)->layout = FWD_KVPACKED;
    o = (th_opts)TH_OPTS_NONE;
    o.softcap = 1.5f;
    fwd_case *c = fwd_add(FLASHC_DTYPE_BF16, 2, 113, 257, 6, 3, 96, o);
    c->layout = FWD_PADDED;
    c->probs = 1;
    o = (th_opts)TH_OPTS_NONE;
    o.causal = 1;
    o.dropout = 0.17f;
    fwd_add(FLASHC_DTYPE_FP16, 2, 257, 113, 2, 2, 7, o)->layout = FWD_PADDED;
    o = (th_opts)TH_OPTS_NONE;
    o.alibi = 1;
    fwd_add(FLASHC_DTYPE_FP32, 2, 113, 113, 4, 2, 64, o)->layout = FWD_BHSD;
    o = (th_opts)TH_OPTS_NONE;
    o.wl = 16;
    fwd_add(FLASHC_DTYPE_BF16, 2, 17, 257, 2, 1, 128, o)->layout = FWD_BHSD;
    fwd_add(FLASHC_DTYPE_BF16, 2, 17, 257, 4, 1, 64, (th_opts)TH_OPTS_NONE)->layout = FWD_KVVIEW;
    o = (th_opts)TH_OPTS_NONE;
    o.causal = 1;
    fwd_add(FLASHC_DTYPE_FP16, 2, 1, 1000, 2, 2, 160, o)->layout = FWD_KVVIEW;

    // ---- long sequences, workspace from the library's allocator ----
    o = (th_opts)TH_OPTS_NONE;
    o.causal = 1;
    fwd_add(FLASHC_DTYPE_BF16, 1, 1000, 1000, 2, 2, 128, o);
    o = (th_opts)TH_OPTS_NONE;
    o.wl = 128;
    o.wr = 0;
    fwd_add(FLASHC_DTYPE_FP16, 1, 1000, 257, 2, 1, 64, o)->conv_ws = 1;
    o = (th_opts)TH_OPTS_NONE;
    o.softcap = 1.5f;
    fwd_add(FLASHC_DTYPE_FP32, 1, 17, 1000, 2, 2, 96, o);
    fwd_add(FLASHC_DTYPE_BF16, 3, 113, 257, 2, 1, 64, fwd_option(11))->conv_ws = 1;
    // the amx path's tall tiles (fwd.c: no mask, at least two tiles of 512 query rows a
    // head, enough tasks for the threads), a short last tile: bf16; fp16's split keeps
    // 256-row tiles on the same shape
    o = (th_opts)TH_OPTS_NONE;
    o.softcap = 1.5f;
    fwd_add(FLASHC_DTYPE_BF16, 1, 1100, 300, 8, 2, 72, o)->threads = 2;
    o = (th_opts)TH_OPTS_NONE;
    o.alibi = 1;
    fwd_add(FLASHC_DTYPE_FP16, 1, 1100, 300, 8, 4, 64, o)->threads = 2;

    // ---- peaked softmaxes (q in [-10, 10)): the running max moves a lot ----
    fwd_add(FLASHC_DTYPE_FP32, 1, 257, 1000, 2, 1, 64, (th_opts)TH_OPTS_NONE)->qr = 10.0;
    fwd_add(FLASHC_DTYPE_BF16, 2, 113, 257, 4, 2, 128, fwd_option(1))->qr = 10.0;
    c = fwd_add(FLASHC_DTYPE_FP16, 2, 257, 113, 2, 2, 32, fwd_option(11));
    c->qr = 10.0;

    // ---- every head dim under every option, short sequences ----
    static const int glens[3][2] = {{33, 47}, {47, 33}, {40, 40}};
    for (int i = 0; i < 12; i++)
        for (int k = 0; k < TH_OPTION_CYCLE; k++) {
            const int *l = glens[(i + k) % 3];
            fwd_add(fwd_dtypes[(i + 2 * k) % 3], 1, l[0], l[1], 4, 2, dims[i], fwd_option(k));
        }

    // ---- every SIMD path with 1 and 2 threads ----
    for (int simd = 0; simd < FLASHC_SIMD_COUNT; simd++)
        for (int t = 1; t <= 2; t++) {
            o = (th_opts)TH_OPTS_NONE;
            o.causal = 1;
            o.dropout = 0.17f;
            c = fwd_add(FLASHC_DTYPE_BF16, 2, 113, 257, 4, 2, 80, o);
            c->simd = simd;
            c->threads = t;
            o = (th_opts)TH_OPTS_NONE;
            o.wl = 20;
            o.wr = 4;
            o.softcap = 1.5f;
            o.alibi = 2;
            c = fwd_add(FLASHC_DTYPE_FP16, 2, 257, 113, 2, 2, 7, o);
            c->simd = simd;
            c->threads = t;
            c = fwd_add(FLASHC_DTYPE_FP32, 1, 17, 113, 2, 2, 200, (th_opts)TH_OPTS_NONE);
            c->simd = simd;
            c->threads = t;
        }

    // ---- a value head dim Dv other than D (MLA: 192/128), every option ----
    static const int dvs[8][2] = {{192, 128}, {128, 192}, {64, 32}, {72, 40},
                                  {40, 72},   {7, 33},    {256, 16}, {1, 256}};
    for (int i = 0; i < 8; i++)
        for (int k = 0; k < TH_OPTION_CYCLE; k++) {
            const int *l = lens[(i + k) % 7], *g = gqa[(i + k) % 4];
            int big = dvs[i][0] + dvs[i][1] >= 256;
            c = fwd_add(fwd_dtypes[(i + k) % 3], big ? 1 : 2, big ? (l[0] + 1) / 2 : l[0],
                        big ? (l[1] + 1) / 2 : l[1], g[0], g[1], dvs[i][0], fwd_option(k));
            c->Dv = dvs[i][1];
            c->layout = k % 3 == 1 ? FWD_PADDED : k % 3 == 2 ? FWD_BHSD : FWD_CONTIG;
            c->probs = c->probs || k % 4 == 1;
        }
    for (int simd = 0; simd < FLASHC_SIMD_COUNT; simd++)
        for (int t = 1; t <= 2; t++)
            for (int i = 0; i < 3; i++) {
                o = fwd_option(4 * i + simd + t);
                c = fwd_add(fwd_dtypes[i], 2, 113, 257 - 100 * i, 4, 2, dvs[i][0], o);
                c->Dv = dvs[i][1];
                c->simd = simd;
                c->threads = t;
            }

    // ---- decode and narrow tiles (fwd.c): Sq 1..16 with GQA groups of 1..8 packed
    // into one task (tiles of 1..64 columns, Q K^T by rows up to FC_FWD_ROW_NQ), few
    // keys (the small-call path) and enough to be threaded, every SIMD path ----
    static const int nsq[8] = {1, 2, 3, 5, 7, 9, 16, 1}, ngrp[8] = {1, 3, 2, 1, 8, 1, 4, 3};
    for (int i = 0; i < 8; i++)
        for (int big = 0; big < 2; big++) {
            o = fwd_option(i * 3 + big);
            if (o.dropout > 0.0f) o = (th_opts)TH_OPTS_NONE; /* probs cost Sk columns */
            c = fwd_add(fwd_dtypes[(i + big) % 3], 2, nsq[i], big ? 300 : 20, 2 * ngrp[i], 2,
                        i % 2 ? 128 : 64, o);
            c->simd = (i + big) % FLASHC_SIMD_COUNT;
            c->threads = 1 + (i + big) % 2;
        }

    static const fwd_reuse_case reuse[4] = {
        {FLASHC_SIMD_AMX, 1}, {FLASHC_SIMD_AMX, 2}, {FLASHC_SIMD_AVX512, 1}, {-1, 3}};
    for (int i = 0; i < 4; i++) {
        char name[96] = "fwd/ws_reused/bf16/sq1100/sk600/h8:1";
        th_env_name(name, sizeof name, reuse[i].simd, reuse[i].threads);
        fc_test_add(name, fwd_reuse_run, &reuse[i]);
    }

    for (int i = 0; i < fwd_ncases; i++) {
        const fwd_case *k = &fwd_cases[i];
        char name[256];
        snprintf(name, sizeof name, "fwd/%s/d%d/b%d/sq%d/sk%d/h%d:%d", flashc_dtype_name(k->dt),
                 k->D, k->B, k->Sq, k->Sk, k->H, k->Hk);
        if (k->Dv) {
            size_t n0 = strlen(name);
            snprintf(name + n0, sizeof name - n0, "/dv%d", k->Dv);
        }
        th_opts_name(name, sizeof name, &k->o);
        size_t len = strlen(name);
        snprintf(name + len, sizeof name - len, "%s%s%s%s%s", k->lse ? "" : "/nolse",
                 k->probs ? "/probs" : "", fwd_layout_names[k->layout],
                 k->conv_ws ? "/allocws" : "", k->qr > 3.0 ? "/peaked" : "");
        th_env_name(name, sizeof name, k->simd, k->threads);
        fc_test_add(name, fwd_run, k);
    }
}
