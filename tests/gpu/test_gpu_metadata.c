/* test_gpu_metadata.c : integer metadata on the GPU with any content never
 * faults, and means what flashc.h ("Metadata on the GPU") says.
 *
 * cu_seqlens_q / _k, seqused_k, block_table, cache_seqlens, cache_leftpad,
 * cache_batch_idx and the rotary positions they imply live in device memory on
 * the CUDA path, and the library never reads them on the host (that would
 * need a synchronisation): the kernels clamp them (src/cuda/common/seqlens.cuh).
 * Each case runs one entry point twice on the same inputs:
 *   1. with a bad value (past the operand, negative, decreasing, past the
 *      cache or the packed total), outputs poisoned first: the call must
 *      succeed and the device must synchronise without an error;
 *   2. with the valid metadata the clamp rule makes of it (for the kvcache
 *      cases the caches re-uploaded first): its outputs are checked against
 *      the float64 reference (DEVELOPERS.md's rule), which also proves the
 *      CUDA context survived call 1;
 * and, where the clamp rule has a valid equivalent ("same"), the two calls'
 * outputs (out, lse, dq, dk, dv, the caches after the append) must agree bit
 * for bit. A case whose bad call leaves rows unwritten or makes sequences
 * overlap has no such equivalent and checks 1 and 2 only; the backward case
 * whose sequences share scratch rows in deterministic mode must end (the
 * turn wait of src/cuda/sm90/bwd_kernel.cuh cannot hang).
 *
 * Entry points: flashc_varlen_fwd (contiguous and paged K/V), flashc_varlen_bwd
 * (deterministic, so the bitwise comparison holds), flashc_fwd_kvcache through
 * the decode kernel (one query row) and through the forward kernel (80 query
 * rows), contiguous and paged caches. compute-sanitizer memcheck runs these
 * (`flashc_gpu_tests gpu_metadata`): no access may leave its tensor.
 *
 * Build: this file + gpu_helpers.c + tests/helpers.c + tests/run.c, linked with
 * flashc_static and cudart (only with FLASHC_CUDA_BWD).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/internal.h" /* fc_store */
#include "../support/reference.h"
#include "../fc_test.h"
#include "gpu_helpers.h"

#define GM_H 4
#define GM_HK 2
#define GM_D 64
#define GM_DT FLASHC_DTYPE_BF16

/* Keep a copy of the host side of bufs[0..n) (the first call's results). */
static int gm_keep(gb_arena *ar, gb_buf *const *bufs, int n, char **copy) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += bufs[i]->bytes;
    gb_buf *k = gb_new(ar, total);
    if (!k) return 0;
    char *p = k->h;
    for (int i = 0; i < n; i++) {
        memcpy(p, bufs[i]->h, bufs[i]->bytes);
        p += bufs[i]->bytes;
    }
    *copy = k->h;
    return 1;
}

static int gm_compare(const char *const *names, gb_buf *const *bufs, int n, const char *copy) {
    int ok = 1;
    for (int i = 0; i < n; i++) {
        ok = gb_same_bits(names[i], "the bad call and its valid equivalent", copy, bufs[i]->h,
                          bufs[i]->bytes) &&
             ok;
        copy += bufs[i]->bytes;
    }
    return ok;
}

// ---- varlen forward and backward ----

#define GV_MAXB 3
typedef struct {
    const char *name;
    int bwd;                     /* 1: forward then deterministic backward */
    int paged;                   /* K, V as 8 pages of 16 rows, block_table [B, 4] */
    int B, total_q, total_k;     /* total_k: rows of k (not paged) */
    int64_t max_q, max_k;        /* max_seqlen_q, _k of the bad call (the valid one: its longest) */
    int32_t cq[2][GV_MAXB + 1];  /* cu_seqlens_q: bad, good */
    int32_t ck[2][GV_MAXB + 1];  /* cu_seqlens_k: bad, good */
    int used;                    /* seqused_k given */
    int32_t su[2][GV_MAXB];
    int32_t bt[2][GV_MAXB][4];   /* paged */
    int same;                    /* the bad call has a valid equivalent: outputs bitwise equal */
} gv_case;

enum { GV_PAGES = 8, GV_PAGE = 16, GV_COLS = 4 };

/* The longest sequence of valid cu_seqlens (the valid call's max_seqlen). */
static int64_t gv_longest(const int32_t *cu, int64_t B) {
    int64_t m = 0;
    for (int64_t b = 0; b < B; b++) m = cu[b + 1] - cu[b] > m ? cu[b + 1] - cu[b] : m;
    return m;
}

static void gv_run(const void *param) {
    const gv_case *c = (const gv_case *)param;
    const flashc_dtype dt = GM_DT, i32 = FLASHC_DTYPE_INT32, f32 = FLASHC_DTYPE_FP32;
    const int64_t B = c->B, H = GM_H, Hk = GM_HK, D = GM_D, tq = c->total_q;
    const int64_t krows = c->paged ? GV_PAGES * GV_PAGE : c->total_k;
    const size_t es = flashc_dtype_size(dt);
    gb_arena ar = {0};
    flashc_params p = flashc_params_default();
    p.softmax_scale = (float)(2.0 / sqrt((double)D));
    p.deterministic = 1;

    gb_buf *qb = gb_new(&ar, (size_t)(tq * H * D) * es), *kb = gb_new(&ar, (size_t)(krows * Hk * D) * es);
    gb_buf *vb = gb_new(&ar, (size_t)(krows * Hk * D) * es), *dob = gb_new(&ar, (size_t)(tq * H * D) * es);
    gb_buf *ob = gb_new(&ar, (size_t)(tq * H * D) * es), *lb = gb_new(&ar, (size_t)(H * tq) * 4);
    gb_buf *dqb = gb_new(&ar, (size_t)(tq * H * D) * es), *dkb = gb_new(&ar, (size_t)(krows * Hk * D) * es);
    gb_buf *dvb = gb_new(&ar, (size_t)(krows * Hk * D) * es);
    gb_buf *cqb = gb_new(&ar, sizeof c->cq[0]), *ckb = gb_new(&ar, sizeof c->ck[0]);
    gb_buf *sub = gb_new(&ar, sizeof c->su[0]), *btb = gb_new(&ar, sizeof c->bt[0]);
    if (!qb || !kb || !vb || !dob || !ob || !lb || !dqb || !dkb || !dvb || !cqb || !ckb || !sub || !btb)
        goto done;
    gb_fill(qb, dt, -1.0, 1.0);
    gb_fill(kb, dt, -1.0, 1.0);
    gb_fill(vb, dt, -1.0, 1.0);
    gb_fill(dob, dt, -1.0, 1.0);
    if (!gb_upload(qb) || !gb_upload(kb) || !gb_upload(vb) || !gb_upload(dob)) goto done;

    gb_buf *outs[5] = {ob, lb, dqb, dkb, dvb};
    static const char *const names[5] = {"out", "softmax_lse", "dq", "dk", "dv"};
    const int nout = c->bwd ? 5 : 2;
    char *first = NULL;
    flashc_varlen_bwd_args x[2]; /* host (0) and device (1) views */
    for (int call = 0; call < 2; call++) {
        memcpy(cqb->h, c->cq[call], sizeof c->cq[0]);
        memcpy(ckb->h, c->ck[call], sizeof c->ck[0]);
        memcpy(sub->h, c->su[call], sizeof c->su[0]);
        memcpy(btb->h, c->bt[call], sizeof c->bt[0]);
        if (!gb_upload(cqb) || !gb_upload(ckb) || !gb_upload(sub) || !gb_upload(btb)) goto done;
        int64_t qs[3] = {tq, H, D}, qst[3], ks[3] = {krows, Hk, D}, kst[3];
        int64_t ps[4] = {GV_PAGES, GV_PAGE, Hk, D}, pst[4], ls[2] = {H, tq}, lst[2];
        int64_t cs[1] = {B + 1}, one[1] = {1}, us[1] = {B}, bs[2] = {B, GV_COLS}, bst[2] = {GV_COLS, 1};
        gb_contig_strides(3, qs, qst);
        gb_contig_strides(3, ks, kst);
        gb_contig_strides(4, ps, pst);
        gb_contig_strides(2, ls, lst);
        for (int dev = 0; dev < 2; dev++) {
            flashc_varlen_bwd_args *a = &x[dev];
            memset(a, 0, sizeof *a);
            a->abi = FLASHC_ABI_VERSION;
            a->q = gb_view(qb, dev, dt, 0, 3, qs, qst);
            a->k = c->paged ? gb_view(kb, dev, dt, 0, 4, ps, pst) : gb_view(kb, dev, dt, 0, 3, ks, kst);
            a->v = c->paged ? gb_view(vb, dev, dt, 0, 4, ps, pst) : gb_view(vb, dev, dt, 0, 3, ks, kst);
            a->dout = gb_view(dob, dev, dt, 0, 3, qs, qst);
            a->out = gb_view(ob, dev, dt, 0, 3, qs, qst);
            a->softmax_lse = gb_view(lb, dev, f32, 0, 2, ls, lst);
            a->dq = gb_view(dqb, dev, dt, 0, 3, qs, qst);
            a->dk = gb_view(dkb, dev, dt, 0, 3, ks, kst);
            a->dv = gb_view(dvb, dev, dt, 0, 3, ks, kst);
            a->cu_seqlens_q = gb_view(cqb, dev, i32, 0, 1, cs, one);
            a->cu_seqlens_k = gb_view(ckb, dev, i32, 0, 1, cs, one);
            a->max_seqlen_q = call ? gv_longest(c->cq[1], B) : c->max_q;
            a->max_seqlen_k = call ? gv_longest(c->ck[1], B) : c->max_k;
        }
        flashc_varlen_fwd_args f[2];
        for (int dev = 0; dev < 2; dev++) {
            memset(&f[dev], 0, sizeof f[dev]);
            f[dev].abi = FLASHC_ABI_VERSION;
            f[dev].q = x[dev].q, f[dev].k = x[dev].k, f[dev].v = x[dev].v;
            f[dev].out = x[dev].out, f[dev].softmax_lse = x[dev].softmax_lse;
            f[dev].cu_seqlens_q = x[dev].cu_seqlens_q, f[dev].cu_seqlens_k = x[dev].cu_seqlens_k;
            f[dev].max_seqlen_q = x[dev].max_seqlen_q, f[dev].max_seqlen_k = x[dev].max_seqlen_k;
            if (c->used) f[dev].seqused_k = gb_view(sub, dev, i32, 0, 1, us, one);
            if (c->paged) f[dev].block_table = gb_view(btb, dev, i32, 0, 2, bs, bst);
        }
        for (int i = 0; i < nout; i++)
            if (!gb_poison(outs[i])) goto done;
        size_t fb = 0, bb = 0;
        GB_OK(flashc_varlen_fwd_workspace_size(&f[1], &p, &fb));
        void *fws = gb_ws(&ar, fb);
        if (fb && !fws) goto done;
        GB_OK(flashc_varlen_fwd(&f[1], &p, fws, fb));
        if (c->bwd) {
            GB_OK(flashc_varlen_bwd_workspace_size(&x[1], &p, &bb));
            void *bws = gb_ws(&ar, bb);
            if (bb && !bws) goto done;
            GB_OK(flashc_varlen_bwd(&x[1], &p, bws, bb));
        }
        if (!gb_sync()) goto done; /* a fault would show here, and in every later call */
        for (int i = 0; i < nout; i++)
            if (!gb_download(outs[i])) goto done;
        if (call == 0) {
            if (!gm_keep(&ar, outs, nout, &first)) goto done;
            continue;
        }
        // ---- the valid call against the reference ----
        const int64_t no = tq * H * D, nk = krows * Hk * D;
        double *r_o = gb_dbl(&ar, no), *l_o = gb_dbl(&ar, no), *g_o = gb_dbl(&ar, no);
        if (!r_o || !l_o || !g_o) goto done;
        GB_OK(fc_ref_varlen_fwd(&f[0], &p, FC_REF_F64, r_o, NULL, NULL));
        GB_OK(fc_ref_varlen_fwd(&f[0], &p, FC_REF_LOWP, l_o, NULL, NULL));
        fc_tensor_to_double(&x[0].out, g_o);
        fc_check_close("out (valid call)", dt, g_o, r_o, l_o, no);
        if (c->bwd) {
            const int64_t n[3] = {no, nk, nk};
            const flashc_tensor *got[3] = {&x[0].dq, &x[0].dk, &x[0].dv};
            double *r[3], *l[3], *g[3];
            for (int i = 0; i < 3; i++) {
                r[i] = gb_dbl(&ar, n[i]), l[i] = gb_dbl(&ar, n[i]), g[i] = gb_dbl(&ar, n[i]);
                if (!r[i] || !l[i] || !g[i]) goto done;
            }
            GB_OK(fc_ref_varlen_bwd(&x[0], &p, FC_REF_F64, r[0], r[1], r[2]));
            GB_OK(fc_ref_varlen_bwd(&x[0], &p, FC_REF_LOWP, l[0], l[1], l[2]));
            for (int i = 0; i < 3; i++) {
                fc_tensor_to_double(got[i], g[i]);
                fc_check_close(names[2 + i], dt, g[i], r[i], l[i], n[i]);
            }
        }
        if (c->same) gm_compare(names, outs, nout, first);
    }
done:
    gb_free(&ar);
}

/* Valid paged tables: sequence b's pages 4b .. 4b + 3. */
#define GV_BT_OK {{0, 1, 2, 3}, {4, 5, 6, 7}}
static const gv_case gv_cases[] = {
    {"gpu_metadata_varlen_fwd_cu_q_past_total", 0, 0, 2, 60, 80, 64, 64,
     {{0, 30, 500}, {0, 30, 60}}, {{0, 40, 80}, {0, 40, 80}}, .same = 1},
    {"gpu_metadata_varlen_fwd_cu_q_negative", 0, 0, 2, 60, 80, 64, 64,
     {{-7, 30, 60}, {0, 30, 60}}, {{0, 40, 80}, {0, 40, 80}}, .same = 1},
    {"gpu_metadata_varlen_fwd_cu_q_int_extremes", 0, 0, 2, 60, 80, 64, 64,
     {{INT32_MIN, 2147483647, 60}, {0, 60, 60}}, {{0, 40, 80}, {0, 40, 80}}, .same = 1},
    {"gpu_metadata_varlen_fwd_cu_q_decreasing", 0, 0, 2, 60, 80, 64, 64,
     {{0, 45, 20}, {0, 45, 60}}, {{0, 40, 80}, {0, 40, 80}}, .same = 0},
    {"gpu_metadata_varlen_fwd_longer_than_max_seqlen_q", 0, 0, 2, 60, 80, 32, 64,
     {{0, 50, 60}, {0, 50, 60}}, {{0, 40, 80}, {0, 40, 80}}, .same = 0},
    {"gpu_metadata_varlen_fwd_cu_k_past_total_and_negative", 0, 0, 2, 60, 80, 64, 64,
     {{0, 30, 60}, {0, 30, 60}}, {{-3, 50, 9999}, {0, 50, 80}}, .same = 1},
    {"gpu_metadata_varlen_fwd_cu_k_overlapping", 0, 0, 2, 60, 80, 64, 64,
     {{0, 30, 60}, {0, 30, 60}}, {{30, 10, 80}, {0, 40, 80}}, .same = 0},
    {"gpu_metadata_varlen_fwd_seqused_k_out_of_range", 0, 0, 2, 60, 80, 64, 64,
     {{0, 30, 60}, {0, 30, 60}}, {{0, 40, 80}, {0, 40, 80}}, .used = 1,
     .su = {{-5, 9999}, {0, 40}}, .same = 1},
    {"gpu_metadata_varlen_fwd_paged_block_table_out_of_range", 0, 1, 2, 60, 0, 64, 64,
     {{0, 30, 60}, {0, 30, 60}}, {{0, 50, 100}, {0, 50, 100}},
     .bt = {{{0, 99, 2, -1}, {4, 5, INT32_MIN, 2147483647}}, {{0, 7, 2, 0}, {4, 5, 0, 7}}},
     .same = 1},
    {"gpu_metadata_varlen_fwd_paged_past_the_table", 0, 1, 2, 60, 0, 500, 500,
     {{0, 30, 60}, {0, 30, 60}}, {{0, 400, 64}, {0, 64, 64}}, .bt = {GV_BT_OK, GV_BT_OK},
     .same = 1},
    {"gpu_metadata_varlen_fwd_paged_seqused_k", 0, 1, 2, 60, 0, 64, 64,
     {{0, 30, 60}, {0, 30, 60}}, {{0, 64, 128}, {0, 64, 128}}, .used = 1,
     .su = {{-1, 1000}, {0, 64}}, .bt = {GV_BT_OK, GV_BT_OK}, .same = 1},
    {"gpu_metadata_varlen_bwd_cu_q_past_total_and_negative", 1, 0, 2, 60, 80, 64, 64,
     {{-4, 25, 700}, {0, 25, 60}}, {{0, 40, 80}, {0, 40, 80}}, .same = 1},
    {"gpu_metadata_varlen_bwd_cu_k_past_total", 1, 0, 2, 60, 80, 64, 64,
     {{0, 25, 60}, {0, 25, 60}}, {{0, 33, 12345}, {0, 33, 80}}, .same = 1},
    /* b2's rows 50..299 are b0's too, and its scratch rows (row0 = 50 + 2 * 128)
     * lie inside b0's (0 .. 383): the deterministic turn counters are shared */
    {"gpu_metadata_varlen_bwd_sequences_share_scratch", 1, 0, 3, 400, 80, 400, 64,
     {{0, 300, 50, 400}, {0, 300, 350, 400}}, {{0, 30, 60, 80}, {0, 30, 60, 80}}, .same = 0},
};

// ---- fwd_kvcache ----

typedef struct {
    const char *name;
    int Sq;                  /* 1: the decode kernel; 80 (160 packed rows): the forward kernel */
    int paged;               /* 10 pages of 16 rows, block_table [2, 4]; else caches [3, 64] */
    int Snew[2];             /* rows of k_new (the valid call may take fewer, a view) */
    int32_t cs[2][2];        /* cache_seqlens: bad, good */
    int leftpad;
    int32_t lp[2][2];
    int batch_idx;           /* contiguous only */
    int32_t bi[2][2];
    int32_t bt[2][2][4];     /* paged */
    int rot_rows[2];         /* rotary tables (rotary_dim = D): rows of the bad and the good
                                table, the good one repeating its rows past the bad one's
                                last; 0: no rotary */
    int same;
} gk_case;

enum { GK_B = 2, GK_BC = 3, GK_SC = 64, GK_PAGES = 10, GK_PAGE = 16, GK_COLS = 4 };

static void gk_run(const void *param) {
    const gk_case *c = (const gk_case *)param;
    const flashc_dtype dt = GM_DT, i32 = FLASHC_DTYPE_INT32, f32 = FLASHC_DTYPE_FP32;
    const int64_t B = GK_B, Sq = c->Sq, H = GM_H, Hk = GM_HK, D = GM_D;
    const size_t es = flashc_dtype_size(dt);
    const int64_t n0 = c->paged ? GK_PAGES : GK_BC, n1 = c->paged ? GK_PAGE : GK_SC;
    const int64_t ncache = n0 * n1 * Hk * D, nq = B * Sq * H * D, nl = B * H * Sq;
    const int64_t Sn = c->Snew[0], rmax = c->rot_rows[1] > c->rot_rows[0] ? c->rot_rows[1] : 1;
    gb_arena ar = {0};
    flashc_params p = flashc_params_default();
    p.softmax_scale = (float)(2.0 / sqrt((double)D));
    p.causal = 1;

    gb_buf *qb = gb_new(&ar, (size_t)nq * es), *ob = gb_new(&ar, (size_t)nq * es);
    gb_buf *lb = gb_new(&ar, (size_t)nl * 4);
    gb_buf *kc0 = gb_new(&ar, (size_t)ncache * es), *vc0 = gb_new(&ar, (size_t)ncache * es);
    gb_buf *kcb = gb_new(&ar, (size_t)ncache * es), *vcb = gb_new(&ar, (size_t)ncache * es);
    gb_buf *knb = gb_new(&ar, (size_t)(B * (Sn ? Sn : 1) * Hk * D) * es);
    gb_buf *vnb = gb_new(&ar, (size_t)(B * (Sn ? Sn : 1) * Hk * D) * es);
    gb_buf *csb = gb_new(&ar, sizeof c->cs[0]), *lpb = gb_new(&ar, sizeof c->lp[0]);
    gb_buf *bib = gb_new(&ar, sizeof c->bi[0]), *btb = gb_new(&ar, sizeof c->bt[0]);
    gb_buf *cosb = gb_new(&ar, (size_t)(rmax * D / 2) * 4), *sinb = gb_new(&ar, (size_t)(rmax * D / 2) * 4);
    if (!qb || !ob || !lb || !kc0 || !vc0 || !kcb || !vcb || !knb || !vnb || !csb || !lpb || !bib ||
        !btb || !cosb || !sinb)
        goto done;
    gb_fill(qb, dt, -1.0, 1.0);
    gb_fill(kc0, dt, -1.0, 1.0);
    gb_fill(vc0, dt, -1.0, 1.0);
    gb_fill(knb, dt, -1.0, 1.0);
    gb_fill(vnb, dt, -1.0, 1.0);
    if (!gb_upload(qb) || !gb_upload(knb) || !gb_upload(vnb)) goto done;

    gb_buf *outs[4] = {ob, lb, kcb, vcb};
    static const char *const names[4] = {"out", "softmax_lse", "k_cache", "v_cache"};
    char *first = NULL;
    for (int call = 0; call < 2; call++) {
        /* fresh caches, this call's metadata and rotary table */
        memcpy(kcb->h, kc0->h, kcb->bytes);
        memcpy(vcb->h, vc0->h, vcb->bytes);
        memcpy(csb->h, c->cs[call], sizeof c->cs[0]);
        memcpy(lpb->h, c->lp[call], sizeof c->lp[0]);
        memcpy(bib->h, c->bi[call], sizeof c->bi[0]);
        memcpy(btb->h, c->bt[call], sizeof c->bt[0]);
        const int64_t rows = c->rot_rows[call], half = D / 2, last = c->rot_rows[0] - 1;
        for (int64_t pos = 0; pos < rows; pos++)
            for (int64_t r = 0; r < half; r++) {
                const int64_t at = pos < last ? pos : last; /* the clamp, written out */
                const double ang = (double)at * pow(10000.0, -2.0 * (double)r / (double)D);
                ((float *)cosb->h)[pos * half + r] = (float)cos(ang);
                ((float *)sinb->h)[pos * half + r] = (float)sin(ang);
            }
        if (!gb_upload(kcb) || !gb_upload(vcb) || !gb_upload(csb) || !gb_upload(lpb) ||
            !gb_upload(bib) || !gb_upload(btb) || !gb_upload(cosb) || !gb_upload(sinb) ||
            !gb_poison(ob) || !gb_poison(lb))
            goto done;
        flashc_kvcache_args x[2];
        int64_t qs[4] = {B, Sq, H, D}, qst[4], ls[3] = {B, H, Sq}, lst[3];
        int64_t cshape[4] = {n0, n1, Hk, D}, cst[4], ns[4] = {B, c->Snew[call], Hk, D};
        int64_t nst[4] = {Sn * Hk * D, Hk * D, D, 1}, vecn[1] = {B}, one[1] = {1};
        int64_t bs[2] = {B, GK_COLS}, bst[2] = {GK_COLS, 1}, rs[2] = {rows, half}, rst[2] = {half, 1};
        gb_contig_strides(4, qs, qst);
        gb_contig_strides(3, ls, lst);
        gb_contig_strides(4, cshape, cst);
        for (int dev = 0; dev < 2; dev++) {
            flashc_kvcache_args *a = &x[dev];
            memset(a, 0, sizeof *a);
            a->abi = FLASHC_ABI_VERSION;
            a->q = gb_view(qb, dev, dt, 0, 4, qs, qst);
            a->out = gb_view(ob, dev, dt, 0, 4, qs, qst);
            a->softmax_lse = gb_view(lb, dev, f32, 0, 3, ls, lst);
            a->k_cache = gb_view(kcb, dev, dt, 0, 4, cshape, cst);
            a->v_cache = gb_view(vcb, dev, dt, 0, 4, cshape, cst);
            if (Sn) {
                a->k_new = gb_view(knb, dev, dt, 0, 4, ns, nst);
                a->v_new = gb_view(vnb, dev, dt, 0, 4, ns, nst);
            }
            a->cache_seqlens = gb_view(csb, dev, i32, 0, 1, vecn, one);
            if (c->leftpad) a->cache_leftpad = gb_view(lpb, dev, i32, 0, 1, vecn, one);
            if (c->batch_idx) a->cache_batch_idx = gb_view(bib, dev, i32, 0, 1, vecn, one);
            if (c->paged) a->block_table = gb_view(btb, dev, i32, 0, 2, bs, bst);
            if (rows) {
                a->rotary_cos = gb_view(cosb, dev, f32, 0, 2, rs, rst);
                a->rotary_sin = gb_view(sinb, dev, f32, 0, 2, rs, rst);
            }
        }
        double *r_o = NULL, *l_o = NULL, *r_l = NULL, *l_l = NULL;
        if (call == 1) { /* the reference reads the caches as they are before the call */
            r_o = gb_dbl(&ar, nq), l_o = gb_dbl(&ar, nq), r_l = gb_dbl(&ar, nl), l_l = gb_dbl(&ar, nl);
            if (!r_o || !l_o || !r_l || !l_l) goto done;
            GB_OK(fc_ref_kvcache(&x[0], &p, FC_REF_F64, r_o, r_l, NULL));
            GB_OK(fc_ref_kvcache(&x[0], &p, FC_REF_LOWP, l_o, l_l, NULL));
        }
        size_t wb = 0;
        GB_OK(flashc_fwd_kvcache_workspace_size(&x[1], &p, &wb));
        void *ws = gb_ws(&ar, wb);
        if (wb && !ws) goto done;
        GB_OK(flashc_fwd_kvcache(&x[1], &p, ws, wb));
        if (!gb_sync()) goto done;
        for (int i = 0; i < 4; i++)
            if (!gb_download(outs[i])) goto done;
        if (call == 0) {
            if (!gm_keep(&ar, outs, 4, &first)) goto done;
            continue;
        }
        double *g_o = gb_dbl(&ar, nq), *g_l = gb_dbl(&ar, nl);
        if (!g_o || !g_l) goto done;
        fc_tensor_to_double(&x[0].out, g_o);
        fc_tensor_to_double(&x[0].softmax_lse, g_l);
        fc_check_close("out (valid call)", dt, g_o, r_o, l_o, nq);
        fc_check_close("lse (valid call)", f32, g_l, r_l, l_l, nl);
        if (c->same) gm_compare(names, outs, 4, first);
    }
done:
    gb_free(&ar);
}

static const gk_case gk_cases[] = {
    {"gpu_metadata_kvcache_decode_cache_seqlens_negative", 1, 0, {0, 0}, {{-9, 20}, {0, 20}}, .same = 1},
    {"gpu_metadata_kvcache_fwd_cache_seqlens_negative", 80, 0, {0, 0}, {{-9, 20}, {0, 20}}, .same = 1},
    {"gpu_metadata_kvcache_decode_cache_seqlens_past_capacity", 1, 0, {0, 0}, {{999, 20}, {64, 20}},
     .same = 1},
    {"gpu_metadata_kvcache_fwd_cache_seqlens_int_max", 80, 1, {0, 0}, {{2147483647, 3}, {64, 3}},
     .bt = {{{0, 1, 2, 3}, {4, 5, 6, 7}}, {{0, 1, 2, 3}, {4, 5, 6, 7}}}, .same = 1},
    /* two of the four new rows fit: the valid call appends a 2-row view of k_new */
    {"gpu_metadata_kvcache_decode_append_past_capacity", 1, 0, {4, 2}, {{62, 62}, {62, 62}}, .same = 1},
    {"gpu_metadata_kvcache_fwd_paged_append_past_capacity", 80, 1, {4, 2}, {{62, 62}, {62, 62}},
     .bt = {{{9, 1, 2, 3}, {4, 5, 6, 8}}, {{9, 1, 2, 3}, {4, 5, 6, 8}}}, .same = 1},
    {"gpu_metadata_kvcache_decode_leftpad_out_of_range", 1, 0, {2, 2}, {{20, 30}, {20, 30}},
     .leftpad = 1, .lp = {{-3, 50}, {0, 30}}, .same = 1},
    {"gpu_metadata_kvcache_fwd_leftpad_out_of_range", 80, 0, {0, 0}, {{20, 30}, {20, 30}},
     .leftpad = 1, .lp = {{-3, 50}, {0, 30}}, .same = 1},
    {"gpu_metadata_kvcache_decode_batch_idx_out_of_range", 1, 0, {1, 1}, {{20, 30}, {20, 30}},
     .batch_idx = 1, .bi = {{7, -2}, {2, 0}}, .same = 1},
    {"gpu_metadata_kvcache_fwd_batch_idx_out_of_range", 80, 0, {1, 1}, {{20, 30}, {20, 30}},
     .batch_idx = 1, .bi = {{INT32_MIN, 3}, {0, 2}}, .same = 1},
    /* the clamped pages are distinct among the rows in use (the reference reads
     * the caches before the append, so aliased pages would differ from it) */
    {"gpu_metadata_kvcache_decode_block_table_out_of_range", 1, 1, {1, 1}, {{40, 60}, {40, 60}},
     .bt = {{{99, 1, 2, -1}, {4, 5, 6, INT32_MIN}}, {{9, 1, 2, 0}, {4, 5, 6, 0}}}, .same = 1},
    {"gpu_metadata_kvcache_fwd_block_table_out_of_range", 80, 1, {1, 1}, {{40, 60}, {40, 60}},
     .bt = {{{2147483647, 1, 2, -1}, {4, 5, 6, -8}}, {{9, 1, 2, 0}, {4, 5, 6, 0}}}, .same = 1},
    {"gpu_metadata_kvcache_decode_rotary_past_the_table", 1, 0, {2, 2}, {{50, 10}, {50, 10}},
     .rot_rows = {40, 64}, .same = 1},
    {"gpu_metadata_kvcache_fwd_rotary_past_the_table", 80, 1, {2, 2}, {{50, 10}, {50, 10}},
     .bt = {{{0, 1, 2, 3}, {4, 5, 6, 7}}, {{0, 1, 2, 3}, {4, 5, 6, 7}}}, .rot_rows = {40, 150},
     .same = 1},
};

FC_TEST_REGISTER(gpu_metadata) {
    for (size_t i = 0; i < sizeof gv_cases / sizeof gv_cases[0]; i++)
        fc_test_add(gv_cases[i].name, gv_run, &gv_cases[i]);
    for (size_t i = 0; i < sizeof gk_cases / sizeof gk_cases[0]; i++)
        fc_test_add(gk_cases[i].name, gk_run, &gk_cases[i]);
}
