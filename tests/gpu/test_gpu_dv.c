/* test_gpu_dv.c : a value head dim Dv other than the query/key head dim D
 * (flashc.h; DeepSeek MLA's 192/128; issue 20) on the CUDA backend against the
 * float64 reference, by DEVELOPERS.md's tolerance rule, on inputs uniform in
 * [-1, 1) and outputs poisoned with NaN first. q, k have D columns; v, out,
 * dout, dv have Dv; the default scale stays 1/sqrt(D).
 *
 * The (D, Dv) pairs: (192, 128), (128, 64), (64, 128), (96, 72), (256, 128),
 * (40, 24), (128, 256), (33, 65) (both repacked: not multiples of 8), (64, 36)
 * (v, out, dout, dv repacked alone) and (36, 64) (q, k, dk alone). One
 * instance runs each pair, of the larger head dim, each operand zero-padded
 * past its own.
 *
 * Cases:
 * - the forward and backward sweep (gpu_dv_<dtype>_d<D>_dv<Dv>_...): every
 *   pair x option {none, causal, window, softcap, ALiBi, dropout} x GQA {1, 4},
 *   each with a dtype and an (Sq, Sk) from {(1, 1), (17, 113), (113, 17),
 *   (257, 300), (128, 128)} that vary with the other three, so every pair of
 *   values meets. Checked: out, lse, dq, dk, dv; in deterministic mode (every
 *   other case) the backward runs twice and must give the same bits. GQA
 *   cases run with FLASHC_CUDA_GQA_PACK=1 (sm90ws packs where it can) and
 *   FLASHC_CUDA_BWD_SPLIT=2 (the sm90 backward's fp32 dK, dV parts and their
 *   sum, common/bwd_prep.cuh fc_bwd_dkv_kernel, at both head dims);
 * - varlen (gpu_dv_varlen_...): four sequences, one without query rows and
 *   one without keys, H 4 : Hk 2, forward and backward, and the forward with
 *   paged K/V through block_table (pages of 16, 5: not a TMA box, and 256);
 *   causal, window or none;
 * - the decode path (gpu_dv_kvcache_...): flashc_fwd_kvcache with k_new
 *   (D) and v_new (Dv) appended to contiguous caches and to pages of 16 and
 *   256, query lengths 1 and 4 (the decode kernel, num_splits 1, 3 and the
 *   heuristic) and 40 with a GQA group of 8 (320 packed rows: the forward
 *   kernel over the cache, chunked prefill), causal or not. The cache rows
 *   not in use are NaN; out and lse are held to the tolerance rule, the caches
 *   downloaded after the call to the CPU backend's bit for bit (the appended
 *   rows, every other element untouched).
 *
 * FLASHC_CUDA_FAMILY=sm90 and =sm80 run the same cases on those families (the
 * default on Hopper: sm90ws for the forward). Refusals of a value head dim
 * past 256 are in test_gpu_edge.c (gpu_edge_head_dim_512_refused).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../support/reference.h"
#include "../fc_test.h"
#include "../helpers.h"
#include "gpu_helpers.h"

#define GD_NPAIRS 10
static const int64_t gd_pairs[GD_NPAIRS][2] = {{192, 128}, {128, 64}, {64, 128}, {96, 72},
                                              {256, 128}, {40, 24},   {128, 256}, {33, 65},
                                              {64, 36},   {36, 64}};

/* The downloaded (host-side) tensor t of n elements against the float64
 * reference r64 and the baseline rlp. */
static void gd_check(gb_arena *ar, const char *name, flashc_dtype dt, const flashc_tensor *t,
                     const double *r64, const double *rlp, int64_t n) {
    double *x = gb_dbl(ar, n);
    if (!x) return;
    fc_tensor_to_double(t, x);
    fc_check_close(name, dt, x, r64, rlp, n);
}

/* The references (float64 r, baseline l) of a call's k outputs: out, lse, or
 * dq, dk, dv. */
typedef struct {
    int k;
    const char *names[3];
    double *r[3], *l[3];
    int64_t n[3];
} gd_refs;

/* Room for them; 0 when out of memory (recorded). */
static int gd_refs_new(gb_arena *ar, gd_refs *g, int k, const char *const *names,
                       const int64_t *n) {
    g->k = k;
    for (int i = 0; i < k; i++) {
        g->names[i] = names[i];
        g->n[i] = n[i];
        g->r[i] = gb_dbl(ar, n[i]);
        g->l[i] = gb_dbl(ar, n[i]);
        if (!g->r[i] || !g->l[i]) return 0;
    }
    return 1;
}

/* The downloaded outputs got[i] against them. */
static void gd_refs_check(gb_arena *ar, const gd_refs *g, flashc_dtype dt,
                          const flashc_tensor *const *got) {
    for (int i = 0; i < g->k; i++) gd_check(ar, g->names[i], dt, got[i], g->r[i], g->l[i], g->n[i]);
}

/* The float64 out and lse of f into ob (rounded to dt) and lb, uploaded: the
 * backward then reads them, so its check does not carry the forward's error. */
static int gd_feed_ref(const gd_refs *f, flashc_dtype dt, gb_buf *ob, gb_buf *lb) {
    for (int64_t i = 0; i < f->n[0]; i++) fc_set(ob->h, dt, i, f->r[0][i]);
    for (int64_t i = 0; i < f->n[1]; i++) fc_set(lb->h, FLASHC_DTYPE_FP32, i, f->r[1][i]);
    return gb_upload(ob) && gb_upload(lb);
}

static const char *const gd_fwd_names[2] = {"out", "lse"}, *const gd_bwd_names[3] = {"dq", "dk", "dv"};

/* Two runs of an option through an environment variable, e.g. the GQA ones. */
typedef struct {
    gb_env pack, split;
} gd_envs;

static void gd_envs_enter(gd_envs *e, int gqa) {
    gb_env_enter(&e->pack, "FLASHC_CUDA_GQA_PACK", gqa ? "1" : NULL);
    gb_env_enter(&e->split, "FLASHC_CUDA_BWD_SPLIT", gqa ? "2" : NULL);
}

static void gd_envs_leave(const gd_envs *e) {
    gb_env_leave(&e->split);
    gb_env_leave(&e->pack);
}

// ---- the forward and backward sweep ----

typedef struct {
    flashc_dtype dt;
    int64_t b, sq, sk, h, hk, d, dv;
    th_opts o;
    int deterministic;
} gd_case;

#define GD_MAX_CASES (GD_NPAIRS * 12)
static gd_case gd_cases[GD_MAX_CASES];
static int gd_ncases;

static void gd_run(const void *param) {
    const gd_case *c = (const gd_case *)param;
    const flashc_dtype dt = c->dt;
    const int64_t B = c->b, Sq = c->sq, Sk = c->sk, H = c->h, Hk = c->hk, D = c->d, Dv = c->dv;
    const size_t es = flashc_dtype_size(dt);
    const int64_t nq = B * Sq * H * D, nk = B * Sk * Hk * D, no = B * Sq * H * Dv,
                  nv = B * Sk * Hk * Dv, nl = B * H * Sq;
    gb_arena ar = {0};
    gd_envs env;
    gd_envs_enter(&env, H > Hk);
    flashc_params p = th_params(&c->o);
    p.deterministic = c->deterministic;

    gb_buf *qb = gb_new(&ar, (size_t)nq * es), *kb = gb_new(&ar, (size_t)nk * es);
    gb_buf *vb = gb_new(&ar, (size_t)nv * es), *dob = gb_new(&ar, (size_t)no * es);
    gb_buf *ob = gb_new(&ar, (size_t)no * es), *lb = gb_new(&ar, (size_t)nl * 4);
    gb_buf *dqb = gb_new(&ar, (size_t)nq * es), *dkb = gb_new(&ar, (size_t)nk * es);
    gb_buf *dvb = gb_new(&ar, (size_t)nv * es);
    gb_buf *ab = c->o.alibi ? gb_new(&ar, (size_t)H * 4) : NULL;
    gb_buf *save = gb_new(&ar, (size_t)(nq + nk + nv) * es);
    if (!qb || !kb || !vb || !dob || !ob || !lb || !dqb || !dkb || !dvb ||
        (c->o.alibi && !ab) || !save)
        goto done;
    gb_fill(qb, dt, -1.0, 1.0);
    gb_fill(kb, dt, -1.0, 1.0);
    gb_fill(vb, dt, -1.0, 1.0);
    gb_fill(dob, dt, -1.0, 1.0);
    if (ab)
        for (int64_t h = 0; h < H; h++) ((float *)ab->h)[h] = (float)fc_rand_uniform(0.01, 0.6);
    if (!gb_upload(qb) || !gb_upload(kb) || !gb_upload(vb) || !gb_upload(dob) ||
        (ab && !gb_upload(ab)) || !gb_poison(ob) || !gb_poison(lb))
        goto done;

    int64_t qs[4] = {B, Sq, H, D}, ks[4] = {B, Sk, Hk, D}, os[4] = {B, Sq, H, Dv},
            vs[4] = {B, Sk, Hk, Dv}, ls[3] = {B, H, Sq}, hs[1] = {H};
    int64_t qst[4], kst[4], ost[4], vst[4], lst[3], hst[1] = {1};
    gb_contig_strides(4, qs, qst);
    gb_contig_strides(4, ks, kst);
    gb_contig_strides(4, os, ost);
    gb_contig_strides(4, vs, vst);
    gb_contig_strides(3, ls, lst);
    flashc_fwd_args df = FLASHC_ARGS_INIT, hf = FLASHC_ARGS_INIT;
    flashc_bwd_args da = FLASHC_ARGS_INIT, ha = FLASHC_ARGS_INIT;
    for (int dev = 0; dev < 2; dev++) {
        flashc_fwd_args *f = dev ? &df : &hf;
        flashc_bwd_args *x = dev ? &da : &ha;
        f->q = x->q = gb_view(qb, dev, dt, 0, 4, qs, qst);
        f->k = x->k = gb_view(kb, dev, dt, 0, 4, ks, kst);
        f->v = x->v = gb_view(vb, dev, dt, 0, 4, vs, vst);
        f->out = x->out = gb_view(ob, dev, dt, 0, 4, os, ost);
        f->softmax_lse = x->softmax_lse = gb_view(lb, dev, FLASHC_DTYPE_FP32, 0, 3, ls, lst);
        if (ab)
            f->alibi_slopes = x->alibi_slopes = gb_view(ab, dev, FLASHC_DTYPE_FP32, 0, 1, hs, hst);
        x->dout = gb_view(dob, dev, dt, 0, 4, os, ost);
        x->dq = gb_view(dqb, dev, dt, 0, 4, qs, qst);
        x->dk = gb_view(dkb, dev, dt, 0, 4, ks, kst);
        x->dv = gb_view(dvb, dev, dt, 0, 4, vs, vst);
    }

    // ---- forward ----
    size_t fb = 0;
    GB_OK(flashc_fwd_workspace_size(&df, &p, &fb));
    void *fws = gb_ws(&ar, fb);
    if (fb && !fws) goto done;
    GB_OK(flashc_fwd(&df, &p, fws, fb));
    if (!gb_sync() || !gb_download(ob) || !gb_download(lb)) goto done;
    {
        gd_refs f;
        const int64_t n[2] = {no, nl};
        if (!gd_refs_new(&ar, &f, 2, gd_fwd_names, n)) goto done;
        GB_OK(fc_ref_fwd(&hf, &p, FC_REF_F64, f.r[0], f.r[1], NULL));
        GB_OK(fc_ref_fwd(&hf, &p, FC_REF_LOWP, f.l[0], f.l[1], NULL));
        gd_refs_check(&ar, &f, dt, (const flashc_tensor *const[]){&hf.out, &hf.softmax_lse});
        if (!gd_feed_ref(&f, dt, ob, lb)) goto done;
    }

    // ---- backward (twice in deterministic mode: the same bits) ----
    size_t wb = 0;
    GB_OK(flashc_bwd_workspace_size(&da, &p, &wb));
    void *ws = gb_ws(&ar, wb);
    if (wb && !ws) goto done;
    for (int run = 0; run < (c->deterministic ? 2 : 1); run++) {
        if (!gb_poison(dqb) || !gb_poison(dkb) || !gb_poison(dvb)) goto done;
        GB_OK(flashc_bwd(&da, &p, ws, wb));
        if (!gb_sync() || !gb_download(dqb) || !gb_download(dkb) || !gb_download(dvb)) goto done;
        const gb_buf *const g[3] = {dqb, dkb, dvb};
        static const char *const names[3] = {"dq", "dk", "dv"};
        char *s = save->h;
        for (int i = 0; i < 3; s += g[i]->bytes, i++) {
            if (run == 0)
                memcpy(s, g[i]->h, g[i]->bytes);
            else if (!gb_same_bits(names[i], "two runs", s, g[i]->h, g[i]->bytes))
                goto done;
        }
    }
    {
        gd_refs g;
        const int64_t n[3] = {nq, nk, nv};
        if (!gd_refs_new(&ar, &g, 3, gd_bwd_names, n)) goto done;
        GB_OK(fc_ref_bwd(&ha, &p, FC_REF_F64, g.r[0], g.r[1], g.r[2]));
        GB_OK(fc_ref_bwd(&ha, &p, FC_REF_LOWP, g.l[0], g.l[1], g.l[2]));
        gd_refs_check(&ar, &g, dt, (const flashc_tensor *const[]){&ha.dq, &ha.dk, &ha.dv});
    }
done:
    gb_free(&ar);
    gd_envs_leave(&env);
}

FC_TEST_REGISTER(gpu_dv_sweep) {
    static const int64_t shapes[5][2] = {{1, 1}, {17, 113}, {113, 17}, {257, 300}, {128, 128}};
    static const char *const opt_names[6] = {"none", "causal", "window", "softcap", "alibi",
                                             "dropout"};
    for (int ip = 0; ip < GD_NPAIRS; ip++)
        for (int io = 0; io < 6; io++)
            for (int ig = 0; ig < 2; ig++) {
                gd_case c;
                memset(&c, 0, sizeof c);
                c.dt = (ip + io + ig) % 2 ? FLASHC_DTYPE_FP16 : FLASHC_DTYPE_BF16;
                const int is = (2 * ip + io + 3 * ig) % 5;
                c.b = 2;
                c.sq = shapes[is][0];
                c.sk = shapes[is][1];
                c.h = 4;
                c.hk = ig ? 1 : 4;
                c.d = gd_pairs[ip][0];
                c.dv = gd_pairs[ip][1];
                th_opts o = TH_OPTS_NONE;
                if (io == 1) o.causal = 1;
                if (io == 2) o.wl = 40, o.wr = 7;
                if (io == 3) o.softcap = 4.0f;
                if (io == 4) o.alibi = 1;
                if (io == 5) o.dropout = 0.17f;
                c.o = o;
                c.deterministic = (ip + io) % 2;
                if (gd_ncases == GD_MAX_CASES) abort();
                gd_cases[gd_ncases] = c;
                char name[128];
                snprintf(name, sizeof name, "gpu_dv_%s_d%lld_dv%lld_%lldx%lld_h4k%lld_%s%s",
                         flashc_dtype_name(c.dt), (long long)c.d, (long long)c.dv,
                         (long long)c.sq, (long long)c.sk, (long long)c.hk, opt_names[io],
                         c.deterministic ? "_det" : "");
                fc_test_add(name, gd_run, &gd_cases[gd_ncases++]);
            }
}

// ---- varlen: forward and backward, and the forward over paged K/V ----

enum { GDV_B = 4, GDV_H = 4, GDV_HK = 2 };

typedef struct {
    flashc_dtype dt;
    int64_t d, dv;
    int opt;  /* 0 none, 1 causal, 2 window (wl 30, wr 0) */
    int page; /* 0: contiguous K/V, forward and backward; else pages of this many rows, forward */
} gdv_case;

static gdv_case gdv_cases[GD_NPAIRS * 3];
static int gdv_ncases;

/* Sequence lengths: b = 1 has no query rows, b = 2 no keys. */
static const int32_t gdv_lq[GDV_B] = {37, 0, 64, 130}, gdv_lk[GDV_B] = {90, 50, 0, 190};

static void gdv_run(const void *param) {
    const gdv_case *c = (const gdv_case *)param;
    const flashc_dtype dt = c->dt;
    const int64_t H = GDV_H, Hk = GDV_HK, D = c->d, Dv = c->dv, ps = c->page;
    const size_t es = flashc_dtype_size(dt);
    gb_arena ar = {0};
    th_opts o = TH_OPTS_NONE;
    o.causal = c->opt == 1;
    if (c->opt == 2) o.wl = 30, o.wr = 0;
    flashc_params p = th_params(&o);

    int32_t cuq[GDV_B + 1] = {0}, cuk[GDV_B + 1] = {0};
    int64_t max_q = 0, max_k = 0;
    for (int b = 0; b < GDV_B; b++) {
        cuq[b + 1] = cuq[b] + gdv_lq[b];
        cuk[b + 1] = cuk[b] + gdv_lk[b];
        if (gdv_lq[b] > max_q) max_q = gdv_lq[b];
        if (gdv_lk[b] > max_k) max_k = gdv_lk[b];
    }
    const int64_t tq = cuq[GDV_B], tk = cuk[GDV_B];
    /* paged: the pages of sequence b hold its keys in order, in a shuffled pool
     * with spare pages */
    const int64_t maxb = ps ? (max_k + ps - 1) / ps : 0, nblk = ps ? GDV_B * maxb + 3 : 0;
    const int64_t krows = ps ? nblk * ps : tk;
    const int64_t nq = tq * H * D, no = tq * H * Dv, nk = krows * Hk * D, nv = krows * Hk * Dv,
                  nl = H * tq;
    gb_buf *qb = gb_new(&ar, (size_t)nq * es), *kb = gb_new(&ar, (size_t)nk * es);
    gb_buf *vb = gb_new(&ar, (size_t)nv * es), *ob = gb_new(&ar, (size_t)no * es);
    gb_buf *dob = gb_new(&ar, (size_t)no * es), *lb = gb_new(&ar, (size_t)nl * 4);
    gb_buf *dqb = gb_new(&ar, (size_t)nq * es), *dkb = gb_new(&ar, (size_t)nk * es);
    gb_buf *dvb = gb_new(&ar, (size_t)nv * es);
    gb_buf *cqb = gb_new(&ar, sizeof cuq), *ckb = gb_new(&ar, sizeof cuk);
    gb_buf *btb = ps ? gb_new(&ar, (size_t)(GDV_B * maxb) * 4) : NULL;
    if (!qb || !kb || !vb || !ob || !dob || !lb || !dqb || !dkb || !dvb || !cqb || !ckb ||
        (ps && !btb))
        goto done;
    gb_fill(qb, dt, -1.0, 1.0);
    gb_fill(kb, dt, -1.0, 1.0);
    gb_fill(vb, dt, -1.0, 1.0);
    gb_fill(dob, dt, -1.0, 1.0);
    memcpy(cqb->h, cuq, sizeof cuq);
    memcpy(ckb->h, cuk, sizeof cuk);
    if (btb) {
        int32_t *perm = (int32_t *)malloc((size_t)nblk * sizeof(int32_t));
        if (!perm) goto done;
        th_shuffle(perm, nblk);
        memcpy(btb->h, perm, (size_t)(GDV_B * maxb) * 4);
        free(perm);
    }
    for (int i = 0; i < ar.n; i++)
        if (!gb_upload(&ar.b[i])) goto done;
    if (!gb_poison(ob) || !gb_poison(lb) || !gb_poison(dqb) || !gb_poison(dkb) ||
        !gb_poison(dvb))
        goto done;

    int64_t qs[3] = {tq, H, D}, os[3] = {tq, H, Dv}, ks[3] = {tk, Hk, D}, vs[3] = {tk, Hk, Dv};
    int64_t kps[4] = {nblk, ps, Hk, D}, vps[4] = {nblk, ps, Hk, Dv}, ls[2] = {H, tq};
    int64_t cs[1] = {GDV_B + 1}, bts[2] = {GDV_B, maxb}, one[1] = {1};
    int64_t qst[3], ost[3], kst[3], vst[3], kpst[4], vpst[4], lst[2], btst[2];
    gb_contig_strides(3, qs, qst);
    gb_contig_strides(3, os, ost);
    gb_contig_strides(3, ks, kst);
    gb_contig_strides(3, vs, vst);
    gb_contig_strides(4, kps, kpst);
    gb_contig_strides(4, vps, vpst);
    gb_contig_strides(2, ls, lst);
    gb_contig_strides(2, bts, btst);
    flashc_varlen_bwd_args da = FLASHC_ARGS_INIT, ha = FLASHC_ARGS_INIT;
    flashc_varlen_fwd_args df = FLASHC_ARGS_INIT, hf = FLASHC_ARGS_INIT;
    for (int dev = 0; dev < 2; dev++) {
        flashc_varlen_bwd_args *x = dev ? &da : &ha;
        flashc_varlen_fwd_args *f = dev ? &df : &hf;
        f->q = x->q = gb_view(qb, dev, dt, 0, 3, qs, qst);
        if (ps) {
            f->k = gb_view(kb, dev, dt, 0, 4, kps, kpst);
            f->v = gb_view(vb, dev, dt, 0, 4, vps, vpst);
            f->block_table = gb_view(btb, dev, FLASHC_DTYPE_INT32, 0, 2, bts, btst);
        } else {
            f->k = x->k = gb_view(kb, dev, dt, 0, 3, ks, kst);
            f->v = x->v = gb_view(vb, dev, dt, 0, 3, vs, vst);
        }
        f->out = x->out = gb_view(ob, dev, dt, 0, 3, os, ost);
        f->softmax_lse = x->softmax_lse = gb_view(lb, dev, FLASHC_DTYPE_FP32, 0, 2, ls, lst);
        f->cu_seqlens_q = x->cu_seqlens_q = gb_view(cqb, dev, FLASHC_DTYPE_INT32, 0, 1, cs, one);
        f->cu_seqlens_k = x->cu_seqlens_k = gb_view(ckb, dev, FLASHC_DTYPE_INT32, 0, 1, cs, one);
        f->max_seqlen_q = x->max_seqlen_q = max_q;
        f->max_seqlen_k = x->max_seqlen_k = max_k;
        x->dout = gb_view(dob, dev, dt, 0, 3, os, ost);
        x->dq = gb_view(dqb, dev, dt, 0, 3, qs, qst);
        x->dk = gb_view(dkb, dev, dt, 0, 3, ks, kst);
        x->dv = gb_view(dvb, dev, dt, 0, 3, vs, vst);
    }
    size_t fb = 0;
    GB_OK(flashc_varlen_fwd_workspace_size(&df, &p, &fb));
    void *fws = gb_ws(&ar, fb);
    if (fb && !fws) goto done;
    GB_OK(flashc_varlen_fwd(&df, &p, fws, fb));
    if (!gb_sync() || !gb_download(ob) || !gb_download(lb)) goto done;
    {
        gd_refs f;
        const int64_t n[2] = {no, nl};
        if (!gd_refs_new(&ar, &f, 2, gd_fwd_names, n)) goto done;
        GB_OK(fc_ref_varlen_fwd(&hf, &p, FC_REF_F64, f.r[0], f.r[1], NULL));
        GB_OK(fc_ref_varlen_fwd(&hf, &p, FC_REF_LOWP, f.l[0], f.l[1], NULL));
        gd_refs_check(&ar, &f, dt, (const flashc_tensor *const[]){&hf.out, &hf.softmax_lse});
        if (ps) goto done; /* the backward has no paged K/V */
        if (!gd_feed_ref(&f, dt, ob, lb)) goto done;
    }
    size_t wb = 0;
    GB_OK(flashc_varlen_bwd_workspace_size(&da, &p, &wb));
    void *ws = gb_ws(&ar, wb);
    if (wb && !ws) goto done;
    GB_OK(flashc_varlen_bwd(&da, &p, ws, wb));
    if (!gb_sync() || !gb_download(dqb) || !gb_download(dkb) || !gb_download(dvb)) goto done;
    {
        gd_refs g;
        const int64_t n[3] = {nq, nk, nv};
        if (!gd_refs_new(&ar, &g, 3, gd_bwd_names, n)) goto done;
        GB_OK(fc_ref_varlen_bwd(&ha, &p, FC_REF_F64, g.r[0], g.r[1], g.r[2]));
        GB_OK(fc_ref_varlen_bwd(&ha, &p, FC_REF_LOWP, g.l[0], g.l[1], g.l[2]));
        gd_refs_check(&ar, &g, dt, (const flashc_tensor *const[]){&ha.dq, &ha.dk, &ha.dv});
    }
done:
    gb_free(&ar);
}

FC_TEST_REGISTER(gpu_dv_varlen) {
    static const int pages[3] = {0, 16, 5};
    static const char *const opt_names[3] = {"none", "causal", "window"};
    for (int ip = 0; ip < GD_NPAIRS; ip++)
        for (int k = 0; k < 2; k++) {
            gdv_case c;
            memset(&c, 0, sizeof c);
            c.dt = (ip + k) % 2 ? FLASHC_DTYPE_BF16 : FLASHC_DTYPE_FP16;
            c.d = gd_pairs[ip][0];
            c.dv = gd_pairs[ip][1];
            c.opt = (ip + 2 * k) % 3;
            /* k = 0: contiguous, forward and backward; k = 1: paged forward,
             * pages of 256 for the last pairs */
            c.page = k == 0 ? 0 : ip >= GD_NPAIRS - 3 ? 256 : pages[1 + ip % 2];
            gdv_cases[gdv_ncases] = c;
            char name[128];
            snprintf(name, sizeof name, "gpu_dv_varlen_%s_d%lld_dv%lld_%s%s%.0d",
                     flashc_dtype_name(c.dt), (long long)c.d, (long long)c.dv,
                     opt_names[c.opt], c.page ? "_page" : "", c.page);
            fc_test_add(name, gdv_run, &gdv_cases[gdv_ncases++]);
        }
}

// ---- the decode path: flashc_fwd_kvcache with an append ----

enum { GDK_B = 2, GDK_HK = 2 };

typedef struct {
    flashc_dtype dt;
    int64_t d, dv, sq, g;
    int page;       /* 0: contiguous caches of 300 rows; else pages of this many rows */
    int snew;       /* rows of k_new, v_new */
    int num_splits; /* params.num_splits */
    int causal;
} gdk_case;

static gdk_case gdk_cases[GD_NPAIRS * 3];
static int gdk_ncases;

static void gdk_run(const void *param) {
    const gdk_case *c = (const gdk_case *)param;
    const flashc_dtype dt = c->dt, i32 = FLASHC_DTYPE_INT32, f32 = FLASHC_DTYPE_FP32;
    const int64_t B = GDK_B, Hk = GDK_HK, H = Hk * c->g, Sq = c->sq, D = c->d, Dv = c->dv;
    const int64_t Sn = c->snew, ps = c->page;
    const size_t es = flashc_dtype_size(dt);
    gb_arena ar = {0};
    void *cpu_k = NULL, *cpu_v = NULL, *cpu_o = NULL;
    th_opts o = TH_OPTS_NONE;
    o.causal = c->causal;
    flashc_params p = th_params(&o);
    p.num_splits = c->num_splits;

    /* capacity 256 paged (maxb pages per sequence), 300 contiguous; rows in use
     * before the append: capacity - Sn - 5 and 17, so the appends end mid-page */
    const int64_t cap = ps ? 256 : 300, maxb = ps ? cap / ps : 0, nblk = ps ? B * maxb + 2 : B;
    const int64_t rows = ps ? ps : cap; /* rows of a page or cache batch */
    const int32_t used[GDK_B] = {(int32_t)(cap - Sn - 5), 17};
    const int64_t nq = B * Sq * H * D, no = B * Sq * H * Dv, nl = B * H * Sq;
    const int64_t nkc = nblk * rows * Hk * D, nvc = nblk * rows * Hk * Dv;
    const int64_t nkn = B * Sn * Hk * D, nvn = B * Sn * Hk * Dv;
    gb_buf *qb = gb_new(&ar, (size_t)nq * es), *ob = gb_new(&ar, (size_t)no * es);
    gb_buf *lb = gb_new(&ar, (size_t)nl * 4);
    gb_buf *kcb = gb_new(&ar, (size_t)nkc * es), *vcb = gb_new(&ar, (size_t)nvc * es);
    gb_buf *knb = gb_new(&ar, (size_t)nkn * es + 2), *vnb = gb_new(&ar, (size_t)nvn * es + 2);
    gb_buf *csb = gb_new(&ar, sizeof used);
    gb_buf *btb = ps ? gb_new(&ar, (size_t)(B * maxb) * 4) : NULL;
    if (!qb || !ob || !lb || !kcb || !vcb || !knb || !vnb || !csb || (ps && !btb)) goto done;
    int32_t bt[GDK_B * 256];
    if (ps) {
        int32_t *perm = (int32_t *)malloc((size_t)nblk * sizeof(int32_t));
        if (!perm) goto done;
        th_shuffle(perm, nblk);
        memcpy(bt, perm, (size_t)(B * maxb) * 4);
        memcpy(btb->h, bt, (size_t)(B * maxb) * 4);
        free(perm);
    }
    /* the caches: NaN, then uniform [-1, 1) in the rows in use */
    gb_buf *const caches[2] = {kcb, vcb};
    const int64_t cd[2] = {D, Dv};
    for (int i = 0; i < 2; i++) {
        fc_poison(caches[i]->h, dt, (int64_t)(caches[i]->bytes / es));
        for (int64_t b = 0; b < B; b++)
            for (int64_t r = 0; r < used[b]; r++) {
                const int64_t row = ps ? bt[b * maxb + r / ps] * ps + r % ps : b * cap + r;
                fc_fill_random((char *)caches[i]->h + (size_t)(row * Hk * cd[i]) * es, dt,
                               Hk * cd[i], -1.0, 1.0);
            }
    }
    gb_fill(qb, dt, -1.0, 1.0);
    gb_fill(knb, dt, -1.0, 1.0);
    gb_fill(vnb, dt, -1.0, 1.0);
    memcpy(csb->h, used, sizeof used);
    for (int i = 0; i < ar.n; i++)
        if (!gb_upload(&ar.b[i])) goto done;
    if (!gb_poison(ob) || !gb_poison(lb)) goto done;

    flashc_kvcache_args x[2];
    {
        int64_t qs[4] = {B, Sq, H, D}, os[4] = {B, Sq, H, Dv}, ls[3] = {B, H, Sq};
        int64_t kcs[4] = {nblk, rows, Hk, D}, vcs[4] = {nblk, rows, Hk, Dv};
        int64_t kns[4] = {B, Sn, Hk, D}, vns[4] = {B, Sn, Hk, Dv};
        int64_t bts[2] = {B, maxb}, vec[1] = {B}, one[1] = {1};
        int64_t qst[4], ost[4], lst[3], kcst[4], vcst[4], knst[4], vnst[4], btst[2];
        gb_contig_strides(4, qs, qst);
        gb_contig_strides(4, os, ost);
        gb_contig_strides(3, ls, lst);
        gb_contig_strides(4, kcs, kcst);
        gb_contig_strides(4, vcs, vcst);
        gb_contig_strides(4, kns, knst);
        gb_contig_strides(4, vns, vnst);
        gb_contig_strides(2, bts, btst);
        for (int dev = 0; dev < 2; dev++) {
            flashc_kvcache_args *a = &x[dev];
            memset(a, 0, sizeof *a);
            a->abi = FLASHC_ABI_VERSION;
            a->q = gb_view(qb, dev, dt, 0, 4, qs, qst);
            a->out = gb_view(ob, dev, dt, 0, 4, os, ost);
            a->softmax_lse = gb_view(lb, dev, f32, 0, 3, ls, lst);
            a->k_cache = gb_view(kcb, dev, dt, 0, 4, kcs, kcst);
            a->v_cache = gb_view(vcb, dev, dt, 0, 4, vcs, vcst);
            /* v_new one element past 16 bytes: its rows are read as they lie */
            a->k_new = gb_view(knb, dev, dt, 0, 4, kns, knst);
            a->v_new = gb_view(vnb, dev, dt, 1, 4, vns, vnst);
            a->cache_seqlens = gb_view(csb, dev, i32, 0, 1, vec, one);
            if (ps) a->block_table = gb_view(btb, dev, i32, 0, 2, bts, btst);
        }
    }

    // ---- the reference on the caches as they are, the CPU on copies ----
    gd_refs f;
    const int64_t n[2] = {no, nl};
    if (!gd_refs_new(&ar, &f, 2, gd_fwd_names, n)) goto done;
    GB_OK(fc_ref_kvcache(&x[0], &p, FC_REF_F64, f.r[0], f.r[1], NULL));
    GB_OK(fc_ref_kvcache(&x[0], &p, FC_REF_LOWP, f.l[0], f.l[1], NULL));
    {
        flashc_kvcache_args ca = x[0];
        cpu_k = malloc(kcb->bytes);
        cpu_v = malloc(vcb->bytes);
        cpu_o = malloc(ob->bytes);
        if (!cpu_k || !cpu_v || !cpu_o) {
            fc_test_fail(__FILE__, __LINE__, "out of host memory");
            goto done;
        }
        memcpy(cpu_k, kcb->h, kcb->bytes);
        memcpy(cpu_v, vcb->h, vcb->bytes);
        ca.k_cache.data = cpu_k;
        ca.v_cache.data = cpu_v;
        ca.out.data = cpu_o;
        ca.softmax_lse.data = NULL;
        GB_OK(flashc_fwd_kvcache(&ca, &p, NULL, 0));
    }

    // ---- the GPU ----
    {
        size_t wb = 0;
        GB_OK(flashc_fwd_kvcache_workspace_size(&x[1], &p, &wb));
        void *ws = gb_ws(&ar, wb);
        if (wb && !ws) goto done;
        GB_OK(flashc_fwd_kvcache(&x[1], &p, ws, wb));
        if (!gb_sync() || !gb_download(ob) || !gb_download(lb) || !gb_download(kcb) ||
            !gb_download(vcb))
            goto done;
    }
    gd_refs_check(&ar, &f, dt, (const flashc_tensor *const[]){&x[0].out, &x[0].softmax_lse});
    gb_same_bits("k_cache", "the GPU and the CPU", kcb->h, cpu_k, kcb->bytes);
    gb_same_bits("v_cache", "the GPU and the CPU", vcb->h, cpu_v, vcb->bytes);
done:
    free(cpu_k);
    free(cpu_v);
    free(cpu_o);
    gb_free(&ar);
}

FC_TEST_REGISTER(gpu_dv_kvcache) {
    static const int pages[3] = {0, 16, 256}, splits[3] = {1, 3, 0};
    static const int64_t sq[3] = {1, 4, 40};
    for (int ip = 0; ip < GD_NPAIRS; ip++)
        for (int m = 0; m < 3; m++) {
            gdk_case c;
            memset(&c, 0, sizeof c);
            c.dt = (ip + m) % 2 ? FLASHC_DTYPE_FP16 : FLASHC_DTYPE_BF16;
            c.d = gd_pairs[ip][0];
            c.dv = gd_pairs[ip][1];
            c.sq = sq[m];
            /* m = 2: 320 packed rows, the forward kernel over the cache */
            c.g = m == 2 || (ip + m) % 2 ? 8 : 1;
            c.page = pages[(ip + m) % 3];
            c.num_splits = splits[(2 * ip + m) % 3];
            c.snew = 1 + (ip + m) % 3;
            c.causal = (ip + m) % 2;
            gdk_cases[gdk_ncases] = c;
            char name[128];
            snprintf(name, sizeof name,
                     "gpu_dv_kvcache_%s_d%lld_dv%lld_q%lld_g%lld_%s%.0d_new%d_splits%d%s",
                     flashc_dtype_name(c.dt), (long long)c.d, (long long)c.dv, (long long)c.sq,
                     (long long)c.g, c.page ? "page" : "contig", c.page, c.snew, c.num_splits,
                     c.causal ? "_causal" : "");
            fc_test_add(name, gdk_run, &gdk_cases[gdk_ncases++]);
        }
}
