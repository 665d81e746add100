/* test_varlen.c : flashc_varlen_fwd and flashc_varlen_bwd against the float64
 * reference by the tolerance rule of DEVELOPERS.md.
 *
 * Sequence sets mix empty sequences (no queries, or queries that see no key),
 * single-token queries, Sq < Sk and Sq > Sk in one batch. The forward adds
 * seqused_k, a paged K/V through block_table (pages shuffled, page sizes 1, 3,
 * 16, 64, unused pages left in the pool), qkv-packed views, padded strides and
 * max_seqlen larger than needed; the backward takes out and lse from the
 * reference forward. attn_probs is checked in full, zeros past each sequence's
 * lengths included. A subset runs under every SIMD path with 1 and 2 threads.
 * A few run on 1 and then 5 threads, where the amx path's tiles differ (fwd.c,
 * bwd.c: big tiles need tasks for the threads): the same bits both times.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/reference.h"
#include "fc_test.h"
#include "helpers.h"

// ---- cases ----

enum { VL_MAXSEQ = 6 };

typedef enum { VL_CONTIG, VL_PADDED, VL_QKVPACKED } vl_layout;

typedef struct vl_case {
    flashc_dtype dt;
    int H, Hk, D;
    int Dv;                           /* head dim of v, out (D when 0); not with VL_QKVPACKED */
    int nseq;
    int lq[VL_MAXSEQ], lk[VL_MAXSEQ]; /* query / key rows of each sequence */
    int seqused;                      /* pass seqused_k = used */
    int used[VL_MAXSEQ];
    int page;                         /* 0: packed keys; else the page size of a paged K/V */
    th_opts o;
    int lse, probs;
    int extra_max;                    /* max_seqlen_q/k exceed the longest sequence by this */
    vl_layout layout;                 /* VL_QKVPACKED needs lq == lk and H == Hk */
    int bwd;
    int simd, threads;
    int threads2;    /* > 0: the call again on this many threads, bit for bit the same */
    int other_tiles; /* ... and on the amx path on other tiles (its big tiles follow the
                        thread count) */
} vl_case;

enum { VL_MAX = 160 };
static vl_case vl_cases[VL_MAX];
static int vl_ncases;

/* Cumulative lengths [n + 1] and the maximum of len[0..n). */
static int vl_cumsum(const int *len, int n, int32_t *cu) {
    int mx = 0;
    cu[0] = 0;
    for (int b = 0; b < n; b++) {
        cu[b + 1] = cu[b] + len[b];
        if (len[b] > mx) mx = len[b];
    }
    return mx;
}

// ---- a call on two thread counts ----

typedef struct vl_call {
    int bwd;
    flashc_varlen_fwd_args *f;
    flashc_varlen_bwd_args *b;
    const flashc_params *p;
    flashc_status st;
} vl_call;

/* The call, its workspace sized for the current thread count. */
static void vl_call_run(void *ctx) {
    vl_call *k = (vl_call *)ctx;
    size_t bytes = 0;
    k->st = k->bwd ? flashc_varlen_bwd_workspace_size(k->b, k->p, &bytes)
                   : flashc_varlen_fwd_workspace_size(k->f, k->p, &bytes);
    if (k->st != FLASHC_OK) return;
    void *ws = th_ws_new(bytes);
    k->st = k->bwd ? flashc_varlen_bwd(k->b, k->p, ws, bytes)
                   : flashc_varlen_fwd(k->f, k->p, ws, bytes);
    th_ws_free(ws, bytes);
}

/* With c->threads2: the call (made once on c->threads, launch line in log1) again
 * on c->threads2 with its n outputs poisoned; the two must give the same bits and,
 * with c->other_tiles on the amx path, take other tiles. */
static void vl_again(const vl_case *c, th_arena *ar, vl_call *k, char *log1, int n,
                     flashc_tensor *const *outs, th_buf *const *bufs, const char *const *names) {
    double *first[3];
    for (int i = 0; i < n; i++) {
        first[i] = (double *)th_keep(ar, th_to_double(outs[i]));
        th_poison(bufs[i], outs[i]);
    }
    flashc_set_num_threads(c->threads2);
    char *log2 = th_capture_log("1", vl_call_run, k);
    flashc_set_num_threads(c->threads);
    const char *entry = k->bwd ? "cpu bwd: " : "cpu fwd: ";
    char t1[64], t2[64];
    if (!th_log_tiles(log1, entry, t1, sizeof t1) || !th_log_tiles(log2, entry, t2, sizeof t2))
        fc_test_fail(__FILE__, __LINE__, "no launch line: %s / %s", log1 ? log1 : "(none)",
                     log2 ? log2 : "(none)");
    else if (c->other_tiles && flashc_simd_active() == FLASHC_SIMD_AMX && strcmp(t1, t2) == 0)
        fc_test_fail(__FILE__, __LINE__, "%d and %d threads took the same tiles (%s): the case "
                     "no longer compares two", c->threads, c->threads2, t1);
    free(log1);
    free(log2);
    FC_ASSERT_OK(k->st);
    for (int i = 0; i < n; i++) {
        int64_t diff = th_bits_differ(outs[i], first[i]);
        if (diff)
            fc_test_fail(__FILE__, __LINE__, "%s: %lld elements differ between %d and %d threads",
                         names[i], (long long)diff, c->threads, c->threads2);
    }
}

// ---- forward ----

static void vl_fwd_body(const vl_case *c, th_arena *ar) {
    const flashc_dtype dt = c->dt;
    const int64_t H = c->H, Hk = c->Hk, D = c->D, B = c->nseq, Dv = c->Dv ? c->Dv : D;
    int32_t cuq[VL_MAXSEQ + 1], cuk[VL_MAXSEQ + 1];
    int64_t maxq = vl_cumsum(c->lq, c->nseq, cuq) + c->extra_max;
    int64_t maxk = vl_cumsum(c->lk, c->nseq, cuk) + c->extra_max;
    const int64_t tq = cuq[B], tk = cuk[B];
    th_layout lay = c->layout == VL_PADDED ? TH_PADDED : TH_CONTIG;

    flashc_varlen_fwd_args a;
    memset(&a, 0, sizeof a);
    a.abi = FLASHC_ABI_VERSION;
    a.cu_seqlens_q = th_new_i32(th_buf_in(ar), 1, B + 1, cuq);
    a.cu_seqlens_k = th_new_i32(th_buf_in(ar), 1, B + 1, cuk);
    a.max_seqlen_q = maxq;
    a.max_seqlen_k = maxk;
    if (c->seqused) a.seqused_k = th_new_i32(th_buf_in(ar), 1, B, c->used);

    // ---- inputs ----
    th_buf *qb = th_buf_in(ar), *kb = qb, *vb = qb;
    if (c->layout == VL_QKVPACKED) {
        th_buf_new(qb, dt, tq * 3 * H * D, -1.0, 1.0);
        int64_t st[3] = {3 * H * D, D, 1};
        a.q = th_view(qb, 0, 3, (int64_t[]){tq, H, D}, st);
        a.k = th_view(qb, H * D, 3, (int64_t[]){tk, Hk, D}, st);
        a.v = th_view(qb, 2 * H * D, 3, (int64_t[]){tk, Hk, D}, st);
        th_fill_view(&a.q, -3.0, 3.0);
    } else {
        a.q = th_new(qb, dt, 3, (int64_t[]){tq, H, D}, lay, -3.0, 3.0);
        kb = th_buf_in(ar);
        vb = th_buf_in(ar);
    }
    if (c->page) {
        /* pages of sequence b: the next ceil(lk/page) of a shuffled pool with 3 spares */
        int64_t ps = c->page, need = 0, maxb = 1;
        for (int b = 0; b < c->nseq; b++) {
            int64_t nb = (c->lk[b] + ps - 1) / ps;
            need += nb;
            if (nb > maxb) maxb = nb;
        }
        int64_t nblocks = need + 3;
        int32_t *perm = (int32_t *)th_keep(ar, malloc((size_t)nblocks * sizeof(int32_t)));
        th_shuffle(perm, nblocks);
        th_buf *tb = th_buf_in(ar);
        th_buf_new(tb, FLASHC_DTYPE_INT32, B * (maxb + 2), 0.0, 0.0);
        int32_t *bt = (int32_t *)tb->data;
        int64_t next = 0;
        for (int b = 0; b < c->nseq; b++)
            for (int64_t e = 0; e < maxb; e++) {
                int64_t nb = (c->lk[b] + ps - 1) / ps;
                bt[b * (maxb + 2) + e] = e < nb ? perm[next++] : perm[nblocks - 1 - e % 3];
            }
        a.block_table = th_view(tb, 0, 2, (int64_t[]){B, maxb}, (int64_t[]){maxb + 2, 1});
        int64_t ks[4] = {nblocks, ps, Hk, D}, vs[4] = {nblocks, ps, Hk, Dv};
        a.k = th_new(kb, dt, 4, ks, lay, -1.0, 1.0);
        a.v = th_new(vb, dt, 4, vs, lay, -1.0, 1.0);
    } else if (c->layout != VL_QKVPACKED) {
        a.k = th_new(kb, dt, 3, (int64_t[]){tk, Hk, D}, lay, -1.0, 1.0);
        a.v = th_new(vb, dt, 3, (int64_t[]){tk, Hk, Dv}, lay, -1.0, 1.0);
    }
    a.alibi_slopes = th_alibi_new(th_buf_in(ar), c->o.alibi, B, H);
    th_snapshot(qb);
    if (kb != qb) th_snapshot(kb);
    if (vb != kb) th_snapshot(vb);

    // ---- outputs ----
    th_buf *ob = th_buf_in(ar), *lb = th_buf_in(ar), *pb = th_buf_in(ar);
    a.out = th_new_out(ob, dt, 3, (int64_t[]){tq, H, Dv}, lay);
    if (c->lse) a.softmax_lse = th_new_out(lb, FLASHC_DTYPE_FP32, 2, (int64_t[]){H, tq}, lay);
    if (c->probs)
        a.attn_probs = th_new_out(pb, FLASHC_DTYPE_FP32, 4, (int64_t[]){B, H, maxq, maxk}, lay);
    flashc_params p = th_params(&c->o);

    vl_call k = {0, &a, NULL, &p, FLASHC_ERR_INTERNAL};
    char *log1 = c->threads2 ? th_capture_log("1", vl_call_run, &k) : NULL;
    if (!c->threads2) vl_call_run(&k);
    FC_ASSERT_OK(k.st);
    if (c->threads2) {
        flashc_tensor *outs[2] = {&a.out, &a.softmax_lse};
        th_buf *bufs[2] = {ob, lb};
        static const char *const names[2] = {"out", "lse"};
        vl_again(c, ar, &k, log1, c->lse ? 2 : 1, outs, bufs, names);
    }

    // ---- reference and checks ----
    int64_t nq = tq * H * Dv, nl = H * tq, np = B * H * maxq * maxk;
    double *o64 = th_dbl(ar, nq), *olp = th_dbl(ar, nq), *l64 = th_dbl(ar, nl),
           *llp = th_dbl(ar, nl);
    double *p64 = c->probs ? th_dbl(ar, np) : NULL, *plp = c->probs ? th_dbl(ar, np) : NULL;
    FC_ASSERT_OK(fc_ref_varlen_fwd(&a, &p, FC_REF_F64, o64, l64, p64));
    FC_ASSERT_OK(fc_ref_varlen_fwd(&a, &p, FC_REF_LOWP, olp, llp, plp));
    th_check("out", dt, &a.out, o64, olp);
    /* lse [H, total_q] and out [total_q, H, D] are one batch of length total_q */
    th_check_masked_rows(l64, (double *)th_keep(ar, th_to_double(&a.out)), 1, tq, H, Dv);
    if (c->lse) th_check("lse", dt, &a.softmax_lse, l64, llp);
    if (c->probs) {
        th_check("probs", dt, &a.attn_probs, p64, plp);
        th_check_signs("probs", (double *)th_keep(ar, th_to_double(&a.attn_probs)), p64, np);
    }
    th_check_outside("out", ob, &a.out, 1);
    if (c->lse) th_check_outside("softmax_lse", lb, &a.softmax_lse, 1);
    if (c->probs) th_check_outside("attn_probs", pb, &a.attn_probs, 1);
    th_check_outside("q", qb, NULL, 0);
    if (kb != qb) th_check_outside("k", kb, NULL, 0);
    if (vb != kb) th_check_outside("v", vb, NULL, 0);
}

// ---- backward ----

static void vl_bwd_body(const vl_case *c, th_arena *ar) {
    const flashc_dtype dt = c->dt;
    const int64_t H = c->H, Hk = c->Hk, D = c->D, B = c->nseq, Dv = c->Dv ? c->Dv : D;
    int32_t cuq[VL_MAXSEQ + 1], cuk[VL_MAXSEQ + 1];
    int64_t maxq = vl_cumsum(c->lq, c->nseq, cuq) + c->extra_max;
    int64_t maxk = vl_cumsum(c->lk, c->nseq, cuk) + c->extra_max;
    const int64_t tq = cuq[B], tk = cuk[B];
    th_layout lay = c->layout == VL_PADDED ? TH_PADDED : TH_CONTIG;
    int64_t qs[3] = {tq, H, D}, ks[3] = {tk, Hk, D}, vs[3] = {tk, Hk, Dv}, os[3] = {tq, H, Dv};

    flashc_varlen_bwd_args a;
    memset(&a, 0, sizeof a);
    a.abi = FLASHC_ABI_VERSION;
    a.cu_seqlens_q = th_new_i32(th_buf_in(ar), 1, B + 1, cuq);
    a.cu_seqlens_k = th_new_i32(th_buf_in(ar), 1, B + 1, cuk);
    a.max_seqlen_q = maxq;
    a.max_seqlen_k = maxk;
    a.q = th_new(th_buf_in(ar), dt, 3, qs, lay, -3.0, 3.0);
    a.k = th_new(th_buf_in(ar), dt, 3, ks, lay, -1.0, 1.0);
    a.v = th_new(th_buf_in(ar), dt, 3, vs, lay, -1.0, 1.0);
    a.dout = th_new(th_buf_in(ar), dt, 3, os, lay, -1.0, 1.0);
    a.alibi_slopes = th_alibi_new(th_buf_in(ar), c->o.alibi, B, H);
    flashc_params p = th_params(&c->o);

    /* out and lse of the forward, from the reference */
    flashc_varlen_fwd_args f;
    memset(&f, 0, sizeof f);
    f.abi = FLASHC_ABI_VERSION;
    f.q = a.q;
    f.k = a.k;
    f.v = a.v;
    f.cu_seqlens_q = a.cu_seqlens_q;
    f.cu_seqlens_k = a.cu_seqlens_k;
    f.max_seqlen_q = maxq;
    f.max_seqlen_k = maxk;
    f.alibi_slopes = a.alibi_slopes;
    double *o64 = th_dbl(ar, tq * H * Dv), *l64 = th_dbl(ar, H * tq);
    FC_ASSERT_OK(fc_ref_varlen_fwd(&f, &p, FC_REF_F64, o64, l64, NULL));
    th_buf *ob = th_buf_in(ar), *lb = th_buf_in(ar);
    a.out = th_new(ob, dt, 3, os, TH_CONTIG, 0.0, 0.0);
    a.softmax_lse = th_new(lb, FLASHC_DTYPE_FP32, 2, (int64_t[]){H, tq}, TH_CONTIG, 0.0, 0.0);
    th_store_dense(&a.out, o64);
    th_store_dense(&a.softmax_lse, l64);

    th_buf *dqb = th_buf_in(ar), *dkb = th_buf_in(ar), *dvb = th_buf_in(ar);
    a.dq = th_new_out(dqb, dt, 3, qs, lay);
    a.dk = th_new_out(dkb, dt, 3, ks, lay);
    a.dv = th_new_out(dvb, dt, 3, vs, lay);

    vl_call k = {1, NULL, &a, &p, FLASHC_ERR_INTERNAL};
    char *log1 = c->threads2 ? th_capture_log("1", vl_call_run, &k) : NULL;
    if (!c->threads2) vl_call_run(&k);
    FC_ASSERT_OK(k.st);
    if (c->threads2) {
        flashc_tensor *outs[3] = {&a.dq, &a.dk, &a.dv};
        th_buf *bufs[3] = {dqb, dkb, dvb};
        static const char *const names[3] = {"dq", "dk", "dv"};
        vl_again(c, ar, &k, log1, 3, outs, bufs, names);
    }

    int64_t nq = tq * H * D, nk = tk * Hk * D, nv = tk * Hk * Dv;
    double *dq64 = th_dbl(ar, nq), *dqlp = th_dbl(ar, nq), *dk64 = th_dbl(ar, nk),
           *dklp = th_dbl(ar, nk), *dv64 = th_dbl(ar, nv), *dvlp = th_dbl(ar, nv);
    FC_ASSERT_OK(fc_ref_varlen_bwd(&a, &p, FC_REF_F64, dq64, dk64, dv64));
    FC_ASSERT_OK(fc_ref_varlen_bwd(&a, &p, FC_REF_LOWP, dqlp, dklp, dvlp));
    th_check("dq", dt, &a.dq, dq64, dqlp);
    th_check("dk", dt, &a.dk, dk64, dklp);
    th_check("dv", dt, &a.dv, dv64, dvlp);
    th_check_outside("dq", dqb, &a.dq, 1);
    th_check_outside("dk", dkb, &a.dk, 1);
    th_check_outside("dv", dvb, &a.dv, 1);
}

static void vl_run(const void *param) {
    const vl_case *c = (const vl_case *)param;
    th_env env = {c->simd, c->threads, FLASHC_SIMD_SCALAR};
    if (!th_env_enter(&env)) return;
    th_arena ar = {0};
    if (c->bwd) vl_bwd_body(c, &ar);
    else vl_fwd_body(c, &ar);
    th_arena_free(&ar);
    th_env_leave(&env);
}

// ---- the sweep ----

typedef struct vl_set {
    int n;
    int lq[VL_MAXSEQ], lk[VL_MAXSEQ];
} vl_set;

static const vl_set vl_sets[7] = {
    {4, {17, 0, 113, 1}, {17, 5, 257, 0}}, /* an empty query sequence; queries with no key */
    {2, {113, 64}, {113, 64}},
    {5, {1, 1, 1, 1, 1}, {257, 17, 1, 100, 33}},
    {3, {257, 30, 0}, {113, 200, 0}},
    {3, {40, 7, 90}, {7, 40, 90}},
    {2, {0, 0}, {0, 0}}, /* nothing at all */
    {2, {3, 0}, {0, 4}},
};

static vl_case *vl_add(flashc_dtype dt, int set, int H, int Hk, int D, th_opts o) {
    if (vl_ncases == VL_MAX) return &vl_cases[VL_MAX - 1]; /* table full: grow VL_MAX */
    vl_case *c = &vl_cases[vl_ncases++];
    memset(c, 0, sizeof *c);
    c->dt = dt;
    c->H = H;
    c->Hk = Hk;
    c->D = D;
    c->nseq = vl_sets[set].n;
    memcpy(c->lq, vl_sets[set].lq, sizeof c->lq);
    memcpy(c->lk, vl_sets[set].lk, sizeof c->lk);
    c->o = o;
    c->lse = 1;
    c->probs = o.dropout > 0.0f;
    c->simd = -1;
    return c;
}

static th_opts vl_option(int i) {
    th_opts o = TH_OPTS_NONE;
    switch (i % 10) {
    case 0: break;
    case 1: o.causal = 1; break;
    case 2: o.wl = 16; o.wr = 4; break;
    case 3: o.softcap = 1.5f; break;
    case 4: o.alibi = 2; break;
    case 5: o.dropout = 0.17f; break;
    case 6: o.causal = 1; o.wl = 20; break;
    case 7: o.alibi = 1; o.wr = 10; break;
    case 8: o.causal = 1; o.dropout = 0.17f; o.softcap = 2.0f; break;
    default: o.scale = 0.25f; o.wr = 0; break;
    }
    return o;
}

FC_TEST_REGISTER(varlen_sweep) {
    static const flashc_dtype dts[3] = {FLASHC_DTYPE_BF16, FLASHC_DTYPE_FP16, FLASHC_DTYPE_FP32};
    static const int dims[7] = {64, 128, 32, 96, 7, 256, 80};
    static const int gqa[4][2] = {{2, 2}, {4, 2}, {4, 1}, {6, 3}};

    // ---- forward: sequence sets x options x dtypes, cycling ----
    for (int i = 0; i < 15; i++) {
        const int *g = gqa[i % 4];
        vl_case *c = vl_add(dts[i % 3], i % 5, g[0], g[1], dims[i % 7], vl_option(i));
        c->probs = c->probs || i % 4 == 2;
        c->lse = i % 7 != 4;
        c->layout = i % 5 == 3 ? VL_PADDED : VL_CONTIG;
    }
    vl_add(FLASHC_DTYPE_BF16, 5, 2, 1, 64, vl_option(1));
    vl_add(FLASHC_DTYPE_FP32, 6, 2, 2, 32, vl_option(0))->probs = 1;
    vl_case *c = vl_add(FLASHC_DTYPE_FP16, 0, 4, 2, 64, vl_option(5));
    c->extra_max = 3;
    c = vl_add(FLASHC_DTYPE_BF16, 4, 2, 2, 128, vl_option(1));
    c->extra_max = 9;
    c->probs = 1;

    // ---- seqused_k ----
    static const int used[3][VL_MAXSEQ] = {{10, 3, 100, 0}, {100, 1}, {200, 1, 0, 50, 33}};
    static const int used_set[3] = {0, 1, 2};
    for (int i = 0; i < 3; i++) {
        c = vl_add(dts[i], used_set[i], 4, 2, 64 + 32 * i, vl_option(i + 1));
        c->seqused = 1;
        memcpy(c->used, used[i], sizeof c->used);
        c->probs = 1;
    }

    // ---- paged K/V ----
    static const int pages[6] = {1, 3, 16, 64, 16, 3};
    static const int page_set[6] = {2, 0, 4, 3, 0, 1};
    for (int i = 0; i < 6; i++) {
        c = vl_add(dts[i % 3], page_set[i], 4, 2 - (i % 2), dims[(i + 2) % 7], vl_option(i * 3));
        c->page = pages[i];
        if (i == 4) {
            c->seqused = 1;
            memcpy(c->used, used[0], sizeof c->used);
        }
        if (i == 5) {
            c->o = vl_option(8);
            c->probs = 1;
            c->layout = VL_PADDED;
        }
    }

    // ---- packed and long ----
    vl_add(FLASHC_DTYPE_BF16, 1, 4, 4, 64, vl_option(1))->layout = VL_QKVPACKED;
    vl_add(FLASHC_DTYPE_FP16, 1, 2, 2, 32, vl_option(5))->layout = VL_QKVPACKED;
    c = vl_add(FLASHC_DTYPE_BF16, 1, 2, 2, 64, vl_option(1));
    c->nseq = 2;
    c->lq[0] = 1000;
    c->lk[0] = 1000;
    c->lq[1] = 24;
    c->lk[1] = 1000;

    // ---- the amx path's big tiles follow the thread count (fwd.c, bwd.c): the same
    // bits on 1 and 5 threads. The short sequence's group of 4 heads (288 rows) would
    // pack into the forward's 512-row tiles, its 16-row blocks then all whole; the long
    // one's last 4 rows are a tile of their own in 256-row tiles (1284 = 5 x 256 + 4).
    // fp16's forward keeps its tiles (fwd.c: fc_fwd_amx_pick) ----
    for (int i = 0; i < 4; i++) {
        c = vl_add(i % 2 ? FLASHC_DTYPE_FP16 : FLASHC_DTYPE_BF16, 0, 4, 1, 64,
                   (th_opts)TH_OPTS_NONE);
        c->nseq = 2;
        c->lq[0] = c->lk[0] = 1284;
        c->lq[1] = 72;
        c->lk[1] = 600;
        c->lse = 1;
        c->bwd = i >= 2;
        c->threads = 1;
        c->threads2 = 5;
        c->other_tiles = i != 1;
    }

    // ---- causal tall tiles (no window bounds the keys on the left; four a head) on 1
    // thread, 256-row ones on 9: with Sq < Sk a tall tile's last key block runs longer
    // than a 256-row tile's (more masked keys after a row's last: the smaller tile's last
    // block has 152 keys, 24 past whole chunks of 32, the larger's 256), and its edge
    // blocks are whole blocks of the smaller tile; the scale's place and the row sums
    // must not show it (fwd.c fc_fwd_qdown_block, simd_avx512.c softmax_rows_bf16). The
    // second case has a window bounded on the right only. Both fail with the scale's
    // place by tile; the sums' order shows only in the second's bits (2 lse elements),
    // so test_rows.c checks the row softmax itself ----
    for (int i = 0; i < 2; i++) {
        th_opts o = TH_OPTS_NONE;
        if (i) {
            o.wr = 8;
        } else {
            o.causal = 1;
        }
        c = vl_add(FLASHC_DTYPE_BF16, 0, 4, 4, 64, o);
        c->nseq = 2;
        c->lq[0] = 2100;
        c->lk[0] = i ? 2500 : 2508; /* keys a row sees past its own: 408 either way */
        c->lq[1] = 600;
        c->lk[1] = 1000;
        c->threads = 1;
        c->threads2 = 9;
        c->other_tiles = 1;
    }

    // ---- the amx path's tall tiles read a thread's copy of their kv head (fwd.c:
    // fc_fwd_head_kv): sequences of odd key counts, an odd D with another Dv (the copy's
    // zero pad), a short sequence's heads packed into one tile, ALiBi, packed and paged
    // K and V; on 1 then 2 threads, the same bits (both take the tall tiles) ----
    for (int i = 0; i < 2; i++) {
        th_opts o = TH_OPTS_NONE;
        o.alibi = 2;
        c = vl_add(FLASHC_DTYPE_BF16, 0, 4, 2, 65, o);
        c->Dv = 80;
        c->nseq = 3;
        c->lq[0] = 1100;
        c->lk[0] = 1101;
        c->lq[1] = 40;
        c->lk[1] = 333;
        c->lq[2] = 1030;
        c->lk[2] = 1999;
        c->page = i ? 16 : 0;
        c->threads = 1;
        c->threads2 = 2;
    }

    // ---- backward ----
    for (int i = 0; i < 10; i++) {
        static const int bsets[5] = {0, 1, 4, 3, 6}; /* the empty set 6 gets options 4, 9 */
        const int *g = gqa[i % 4];
        c = vl_add(dts[i % 3], bsets[i % 5], g[0], g[1],
                   dims[(i * 2) % 7] > 128 ? 96 : dims[(i * 2) % 7], vl_option(i));
        c->bwd = 1;
        c->layout = i % 4 == 3 ? VL_PADDED : VL_CONTIG;
    }

    // ---- every SIMD path with 1 and 2 threads ----
    for (int simd = 0; simd < FLASHC_SIMD_COUNT; simd++)
        for (int t = 1; t <= 2; t++) {
            c = vl_add(FLASHC_DTYPE_BF16, 0, 4, 2, 80, vl_option(8));
            c->page = 16;
            c->simd = simd;
            c->threads = t;
            c = vl_add(FLASHC_DTYPE_FP16, 4, 4, 1, 64, vl_option(6));
            c->bwd = 1;
            c->simd = simd;
            c->threads = t;
        }

    // ---- a value head dim Dv other than D: packed, seqused, paged; fwd and bwd ----
    static const int dvs[6][2] = {{192, 128}, {128, 192}, {64, 32}, {72, 40}, {40, 72}, {7, 33}};
    for (int i = 0; i < 24; i++) {
        const int *g = gqa[i % 4];
        int set = i < 16 && i % 4 == 2 ? 0 : i % 6 == 5 ? 1 : i % 5; /* seqused: set 0 */
        c = vl_add(dts[i % 3], set, g[0], g[1], dvs[i % 6][0], vl_option(i));
        c->Dv = dvs[i % 6][1];
        c->layout = i % 4 == 3 ? VL_PADDED : VL_CONTIG;
        if (i >= 16) {
            c->bwd = 1;
            continue;
        }
        c->probs = i % 3 == 1;
        if (i % 4 == 1) c->page = i % 8 == 1 ? 3 : 16;
        if (i % 4 == 2) {
            c->seqused = 1;
            memcpy(c->used, used[0], sizeof c->used);
        }
    }
    // ---- head dims past 256 (issue 20): absorbed MLA's 576/512 and 512, paged,
    // seqused and the backward, short sequences (set 4, and set 6 without keys) ----
    static const int big[2][2] = {{576, 512}, {512, 512}};
    for (int i = 0; i < 6; i++) {
        c = vl_add(dts[i % 3], i == 5 ? 6 : 4, 4, 2 - (i % 2), big[i % 2][0], vl_option(i + 1));
        c->Dv = big[i % 2][1];
        if (i >= 4) {
            c->bwd = 1;
            continue;
        }
        if (i < 2) c->page = 16;
        if (i == 2) {
            c->seqused = 1;
            memcpy(c->used, (int[]){5, 40, 33}, 3 * sizeof(int));
        }
        c->probs = i == 3;
    }
    for (int simd = 0; simd < FLASHC_SIMD_COUNT; simd++)
        for (int t = 1; t <= 2; t++) {
            c = vl_add(dts[simd % 3], 0, 4, 2, 192, vl_option(8 + simd));
            c->Dv = 128;
            c->page = 16;
            c->simd = simd;
            c->threads = t;
            c = vl_add(dts[(simd + 1) % 3], 4, 4, 1, 40, vl_option(6 + t));
            c->Dv = 72;
            c->bwd = 1;
            c->simd = simd;
            c->threads = t;
        }

    for (int i = 0; i < vl_ncases; i++) {
        const vl_case *k = &vl_cases[i];
        char name[320];
        size_t len =
            (size_t)snprintf(name, sizeof name, "varlen/%s/%s/d%d/h%d:%d/q", k->bwd ? "bwd" : "fwd",
                             flashc_dtype_name(k->dt), k->D, k->H, k->Hk);
        if (k->Dv) {
            len = strlen(name) - 2; /* before "/q" */
            len += (size_t)snprintf(name + len, sizeof name - len, "/dv%d/q", k->Dv);
        }
        for (int b = 0; b < k->nseq && len < sizeof name; b++)
            len += (size_t)snprintf(name + len, sizeof name - len, "%s%d", b ? "," : "", k->lq[b]);
        len += (size_t)snprintf(name + len, sizeof name - len, "/k");
        for (int b = 0; b < k->nseq && len < sizeof name; b++)
            len += (size_t)snprintf(name + len, sizeof name - len, "%s%d", b ? "," : "", k->lk[b]);
        if (k->seqused) {
            len += (size_t)snprintf(name + len, sizeof name - len, "/used");
            for (int b = 0; b < k->nseq && len < sizeof name; b++)
                len += (size_t)snprintf(name + len, sizeof name - len, "%s%d", b ? "," : "",
                                        k->used[b]);
        }
        if (k->page) snprintf(name + len, sizeof name - len, "/page%d", k->page);
        th_opts_name(name, sizeof name, &k->o);
        len = strlen(name);
        snprintf(name + len, sizeof name - len, "%s%s%s%s%s", k->lse ? "" : "/nolse",
                 k->probs ? "/probs" : "",
                 k->layout == VL_PADDED      ? "/padded"
                 : k->layout == VL_QKVPACKED ? "/qkvpacked"
                                             : "",
                 k->extra_max ? "/maxpad" : "", "");
        th_env_name(name, sizeof name, k->simd, k->threads);
        if (k->threads2) {
            len = strlen(name);
            snprintf(name + len, sizeof name - len, "_then_t%d", k->threads2);
        }
        fc_test_add(name, vl_run, k);
    }
}
