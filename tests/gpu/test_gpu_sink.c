/* test_gpu_sink.c : learnable attention sinks (flashc.h, args.sink; issue 20) on
 * the CUDA backend against the float64 reference, by DEVELOPERS.md's tolerance
 * rule, on inputs uniform in [-1, 1) and outputs poisoned with NaN first.
 *
 * Sinks are drawn in [-2, 3) with head 0 at +12 (the sink takes nearly all the
 * mass) and the last head at -30 (none), as tests/test_sink.c does on the CPU.
 * Half the sweep's and the decode's cases, and the varlen case, hand the library
 * the sink in q's 16-bit dtype (gs_sink16: the reference reads the same values).
 *
 * Cases:
 * - the forward and backward sweep (gpu_sink_*): D {40 (zero-padded), 64, 96,
 *   128, 256} x option {none, causal, window, softcap, ALiBi, dropout} x GQA
 *   {1, 4}, each with a dtype and an (Sq, Sk) from {(1, 1), (17, 113),
 *   (113, 17), (257, 300), (640, 640)} that vary with the other three, so
 *   every pair of values meets. Checked: out, lse, dq, dk, dv and dsink; rows
 *   that see no key (causal with Sq > Sk, windows) give out = 0 and lse = the
 *   sink exactly; the backward runs twice, dsink bitwise equal run to run (and
 *   dq, dk, dv too in deterministic mode, every other case). GQA cases run with
 *   FLASHC_CUDA_GQA_PACK=1, so the sm90ws kernel packs where it can (a packed
 *   tile's rows belong to G heads, each with its own sink);
 * - the decode path (gpu_sink_kvcache_*): flashc_fwd_kvcache over a full
 *   cache, D {64, 128, 256} x cache {contiguous, pages of 16, pages of 256} x
 *   num_splits {1, 3, 0 (the heuristic)}, query length 1 or 4 (causal), GQA
 *   1 or 8: the sink joins in the decode kernel with one split and in the
 *   combine kernel with several;
 * - a varlen forward and backward (gpu_sink_varlen) with an empty query
 *   sequence and an empty key sequence (its rows: out = 0, lse = the sink).
 *
 * FLASHC_CUDA_FAMILY=sm90 and =sm80 run the same cases on those families.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../support/reference.h"
#include "../fc_test.h"
#include "../helpers.h"
#include "gpu_helpers.h"

/* A sink [H] on the host side of b: uniform [-2, 3), head 0 at 12, head H-1 at -30. */
static void gs_sink_fill(gb_buf *b, int64_t H) {
    float *s = (float *)b->h;
    for (int64_t h = 0; h < H; h++) s[h] = (float)fc_rand_uniform(-2.0, 3.0);
    if (H >= 2) {
        s[0] = 12.0f;
        s[H - 1] = -30.0f;
    }
}

/* A 16-bit sink (the library reads fp16 and bf16 as their fp32 values): sb's host
 * values rounded to dt in place, so the host side the reference reads holds the
 * same values, and the device copy in dt, uploaded; NULL on failure. */
static gb_buf *gs_sink16(gb_arena *ar, gb_buf *sb, flashc_dtype dt, int64_t H) {
    gb_buf *b = gb_new(ar, (size_t)H * 2);
    if (!b) return NULL;
    for (int64_t h = 0; h < H; h++) {
        fc_set(b->h, dt, h, fc_get(sb->h, FLASHC_DTYPE_FP32, h));
        ((float *)sb->h)[h] = (float)fc_get(b->h, dt, h);
    }
    return gb_upload(b) ? b : NULL;
}

/* The sink's view on the device (dev 1: s16 in dt where given, else sb in fp32) or on
 * the host (sb, fp32). */
static flashc_tensor gs_sink_view(const gb_buf *sb, const gb_buf *s16, flashc_dtype dt, int dev,
                                  const int64_t *hs, const int64_t *hst) {
    return dev && s16 ? gb_view(s16, 1, dt, 0, 1, hs, hst)
                      : gb_view(sb, dev, FLASHC_DTYPE_FP32, 0, 1, hs, hst);
}

/* Rows that see no key in the reference (lse == the sink and out all 0) must
 * read out = 0 and lse = the sink bit for bit. Dense: out [B, Sq, H, D], lse
 * [B, H, Sq]. */
static void gs_check_empty_rows(const double *r_out, const double *r_lse, const double *g_out,
                                const double *g_lse, const float *sink, int64_t B, int64_t Sq,
                                int64_t H, int64_t D) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < Sq; i++) {
                const int64_t o = ((b * Sq + i) * H + h) * D, l = (b * H + h) * Sq + i;
                int empty = r_lse[l] == (double)sink[h];
                for (int64_t d = 0; d < D && empty; d++) empty = r_out[o + d] == 0.0;
                if (!empty) continue;
                for (int64_t d = 0; d < D; d++)
                    if (g_out[o + d] != 0.0) {
                        fc_test_fail(__FILE__, __LINE__, "row (b %lld, i %lld, h %lld) sees no key "
                                     "but out[%lld] = %g", (long long)b, (long long)i,
                                     (long long)h, (long long)d, g_out[o + d]);
                        return;
                    }
                if (g_lse && g_lse[l] != (double)sink[h]) {
                    fc_test_fail(__FILE__, __LINE__, "row (b %lld, i %lld, h %lld) sees no key but "
                                 "lse = %.9g, not the sink %.9g", (long long)b, (long long)i,
                                 (long long)h, g_lse[l], (double)sink[h]);
                    return;
                }
            }
}

/* Room for the references of out and lse (float64 and the baseline) and for
 * flashc's out and lse as doubles. */
typedef struct {
    double *r[2], *l[2], *g[2];
    int64_t n[2];
} gs_fwd;

static void gs_fwd_new(gb_arena *ar, gs_fwd *f, int64_t nq, int64_t nl) {
    const int64_t n[2] = {nq, nl};
    for (int i = 0; i < 2; i++) {
        f->n[i] = n[i];
        f->r[i] = gb_dbl(ar, n[i]);
        f->l[i] = gb_dbl(ar, n[i]);
        f->g[i] = gb_dbl(ar, n[i]);
    }
}

/* The downloaded (host-side) out and lse, into f->g, against the references. */
static void gs_fwd_check(gs_fwd *f, flashc_dtype dt, const flashc_tensor *out,
                         const flashc_tensor *lse) {
    static const char *const names[2] = {"out", "lse"};
    const flashc_tensor *const got[2] = {out, lse};
    for (int i = 0; i < 2; i++) {
        fc_tensor_to_double(got[i], f->g[i]);
        fc_check_close(names[i], dt, f->g[i], f->r[i], f->l[i], f->n[i]);
    }
}

/* Room for the references of dq, dk, dv and dsink (float64 and the baseline). */
typedef struct {
    double *r[4], *l[4];
    int64_t n[4];
} gs_grads;

static void gs_grads_new(gb_arena *ar, gs_grads *g, int64_t nq, int64_t nk, int64_t H) {
    const int64_t n[4] = {nq, nk, nk, H};
    for (int i = 0; i < 4; i++) {
        g->n[i] = n[i];
        g->r[i] = gb_dbl(ar, n[i]);
        g->l[i] = gb_dbl(ar, n[i]);
    }
}

/* The downloaded (host-side) dq, dk, dv, dsink against the references. */
static void gs_grads_check(gb_arena *ar, const gs_grads *g, flashc_dtype dt,
                           const flashc_tensor *const got[4]) {
    static const char *const names[4] = {"dq", "dk", "dv", "dsink"};
    for (int i = 0; i < 4; i++) {
        double *x = gb_dbl(ar, g->n[i]);
        fc_tensor_to_double(got[i], x);
        fc_check_close(names[i], dt, x, g->r[i], g->l[i], g->n[i]);
    }
}

/* dsink as a plain implementation that stores out in dt gets it: in float64
 * from that out and lse (ob's and lb's host sides) and dout, dsink_h = -sum_i
 * e^(s_h - lse_i) dout_i . out_i. Dense: out, dout [B, Sq, H, D], lse
 * [B, H, Sq]. The sweep's baseline for dsink: a sum over every row of a head,
 * it moves with out's rounding (~1% at 257 x 300 with ALiBi) more than with
 * the baseline's other roundings, so flashc is held to 2x of this one. */
static void gs_dsink_of_out(const gb_buf *ob, const gb_buf *dob, const gb_buf *lb,
                            flashc_dtype dt, const float *sink, int64_t B, int64_t Sq,
                            int64_t H, int64_t D, double *dsink) {
    for (int64_t h = 0; h < H; h++) {
        double acc = 0.0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < Sq; i++) {
                const double l = fc_get(lb->h, FLASHC_DTYPE_FP32, (b * H + h) * Sq + i);
                if (l == -INFINITY) continue; /* no key and no sink: P = 0 */
                const int64_t o = ((b * Sq + i) * H + h) * D;
                double di = 0.0;
                for (int64_t d = 0; d < D; d++)
                    di += fc_get(ob->h, dt, o + d) * fc_get(dob->h, dt, o + d);
                acc += exp((double)sink[h] - l) * di;
            }
        dsink[h] = -acc;
    }
}

// ---- the forward and backward sweep ----

typedef struct {
    flashc_dtype dt;
    int64_t b, sq, sk, h, hk, d;
    th_opts o;
    int deterministic;
    int sink16; /* the sink in dt on the device (gs_sink16), else fp32 */
} gs_case;

#define GS_MAX_CASES 64
static gs_case gs_cases[GS_MAX_CASES];
static int gs_ncases;

static void gs_run(const void *param) {
    const gs_case *c = (const gs_case *)param;
    const flashc_dtype dt = c->dt;
    const int64_t B = c->b, Sq = c->sq, Sk = c->sk, H = c->h, Hk = c->hk, D = c->d;
    const size_t es = flashc_dtype_size(dt);
    const int64_t nq = B * Sq * H * D, nk = B * Sk * Hk * D, nl = B * H * Sq;
    gb_arena ar = {0};
    flashc_params p = th_params(&c->o);
    p.deterministic = c->deterministic;

    gb_buf *qb = gb_new(&ar, (size_t)nq * es), *kb = gb_new(&ar, (size_t)nk * es);
    gb_buf *vb = gb_new(&ar, (size_t)nk * es), *dob = gb_new(&ar, (size_t)nq * es);
    gb_buf *ob = gb_new(&ar, (size_t)nq * es), *lb = gb_new(&ar, (size_t)nl * 4);
    gb_buf *sb = gb_new(&ar, (size_t)H * 4), *dsb = gb_new(&ar, (size_t)H * 4);
    gb_buf *dqb = gb_new(&ar, (size_t)nq * es), *dkb = gb_new(&ar, (size_t)nk * es);
    gb_buf *dvb = gb_new(&ar, (size_t)nk * es);
    gb_buf *ab = c->o.alibi ? gb_new(&ar, (size_t)H * 4) : NULL;
    gb_buf *save = gb_new(&ar, (size_t)(nq + 2 * nk) * es + (size_t)H * 4);
    if (!qb || !kb || !vb || !dob || !ob || !lb || !sb || !dsb || !dqb || !dkb || !dvb ||
        (c->o.alibi && !ab) || !save)
        goto done;
    gb_fill(qb, dt, -1.0, 1.0);
    gb_fill(kb, dt, -1.0, 1.0);
    gb_fill(vb, dt, -1.0, 1.0);
    gb_fill(dob, dt, -1.0, 1.0);
    gs_sink_fill(sb, H);
    gb_buf *s16 = c->sink16 ? gs_sink16(&ar, sb, dt, H) : NULL;
    if (c->sink16 && !s16) goto done;
    if (ab)
        for (int64_t h = 0; h < H; h++) ((float *)ab->h)[h] = (float)fc_rand_uniform(0.01, 0.6);
    if (!gb_upload(qb) || !gb_upload(kb) || !gb_upload(vb) || !gb_upload(dob) || !gb_upload(sb) ||
        (ab && !gb_upload(ab)) || !gb_poison(ob) || !gb_poison(lb))
        goto done;

    int64_t qs[4] = {B, Sq, H, D}, ks[4] = {B, Sk, Hk, D}, ls[3] = {B, H, Sq}, hs[1] = {H};
    int64_t qst[4], kst[4], lst[3], hst[1] = {1};
    gb_contig_strides(4, qs, qst);
    gb_contig_strides(4, ks, kst);
    gb_contig_strides(3, ls, lst);
    flashc_fwd_args df, hf;
    flashc_bwd_args da, ha;
    memset(&df, 0, sizeof df);
    memset(&hf, 0, sizeof hf);
    memset(&da, 0, sizeof da);
    memset(&ha, 0, sizeof ha);
    df.abi = hf.abi = da.abi = ha.abi = FLASHC_ABI_VERSION;
    for (int dev = 0; dev < 2; dev++) {
        flashc_fwd_args *f = dev ? &df : &hf;
        flashc_bwd_args *x = dev ? &da : &ha;
        f->q = x->q = gb_view(qb, dev, dt, 0, 4, qs, qst);
        f->k = x->k = gb_view(kb, dev, dt, 0, 4, ks, kst);
        f->v = x->v = gb_view(vb, dev, dt, 0, 4, ks, kst);
        f->out = x->out = gb_view(ob, dev, dt, 0, 4, qs, qst);
        f->softmax_lse = x->softmax_lse = gb_view(lb, dev, FLASHC_DTYPE_FP32, 0, 3, ls, lst);
        f->sink = x->sink = gs_sink_view(sb, s16, dt, dev, hs, hst);
        if (ab)
            f->alibi_slopes = x->alibi_slopes = gb_view(ab, dev, FLASHC_DTYPE_FP32, 0, 1, hs, hst);
        x->dout = gb_view(dob, dev, dt, 0, 4, qs, qst);
        x->dq = gb_view(dqb, dev, dt, 0, 4, qs, qst);
        x->dk = gb_view(dkb, dev, dt, 0, 4, ks, kst);
        x->dv = gb_view(dvb, dev, dt, 0, 4, ks, kst);
        x->dsink = gb_view(dsb, dev, FLASHC_DTYPE_FP32, 0, 1, hs, hst);
    }

    // ---- forward ----
    size_t fb = 0;
    GB_OK(flashc_fwd_workspace_size(&df, &p, &fb));
    void *fws = gb_ws(&ar, fb);
    if (fb && !fws) goto done;
    GB_OK(flashc_fwd(&df, &p, fws, fb));
    if (!gb_sync() || !gb_download(ob) || !gb_download(lb)) goto done;
    {
        gs_fwd f;
        gs_fwd_new(&ar, &f, nq, nl);
        GB_OK(fc_ref_fwd(&hf, &p, FC_REF_F64, f.r[0], f.r[1], NULL));
        GB_OK(fc_ref_fwd(&hf, &p, FC_REF_LOWP, f.l[0], f.l[1], NULL));
        gs_fwd_check(&f, dt, &hf.out, &hf.softmax_lse);
        const double *r_out = f.r[0], *r_lse = f.r[1];
        gs_check_empty_rows(r_out, r_lse, f.g[0], f.g[1], (const float *)sb->h, B, Sq, H, D);
        /* The backward reads the reference's out (rounded to dt) and lse, as
         * tests/test_sink.c does on the CPU; dsink's baseline is the float64 sum
         * over them (gs_dsink_of_out) */
        for (int64_t i = 0; i < nq; i++) fc_set(ob->h, dt, i, r_out[i]);
        for (int64_t i = 0; i < nl; i++) fc_set(lb->h, FLASHC_DTYPE_FP32, i, r_lse[i]);
        if (!gb_upload(ob) || !gb_upload(lb)) goto done;
    }

    // ---- backward, twice ----
    size_t wb = 0;
    GB_OK(flashc_bwd_workspace_size(&da, &p, &wb));
    void *ws = gb_ws(&ar, wb);
    if (wb && !ws) goto done;
    for (int run = 0; run < 2; run++) {
        if (!gb_poison(dqb) || !gb_poison(dkb) || !gb_poison(dvb) || !gb_poison(dsb)) goto done;
        GB_OK(flashc_bwd(&da, &p, ws, wb));
        if (!gb_sync() || !gb_download(dqb) || !gb_download(dkb) || !gb_download(dvb) ||
            !gb_download(dsb))
            goto done;
        /* save: dsink, dq, dk, dv of the first run, one after the other */
        const gb_buf *const g[4] = {dsb, dqb, dkb, dvb};
        static const char *const names[4] = {"dsink", "dq", "dk", "dv"};
        char *s = save->h;
        for (int i = 0; i < 4; s += g[i]->bytes, i++) {
            if (run == 0)
                memcpy(s, g[i]->h, g[i]->bytes);
            else if ((i == 0 || c->deterministic) &&
                     !gb_same_bits(names[i], "two runs", s, g[i]->h, g[i]->bytes))
                goto done;
        }
    }
    {
        const flashc_tensor *const got[4] = {&ha.dq, &ha.dk, &ha.dv, &ha.dsink};
        gs_grads g;
        gs_grads_new(&ar, &g, nq, nk, H);
        GB_OK(fc_ref_bwd(&ha, &p, FC_REF_F64, g.r[0], g.r[1], g.r[2]));
        GB_OK(fc_ref_bwd(&ha, &p, FC_REF_LOWP, g.l[0], g.l[1], g.l[2]));
        GB_OK(fc_ref_bwd_dsink(&ha, &p, FC_REF_F64, g.r[3]));
        gs_dsink_of_out(ob, dob, lb, dt, (const float *)sb->h, B, Sq, H, D, g.l[3]);
        gs_grads_check(&ar, &g, dt, got);
    }
done:
    gb_free(&ar);
}

static void gs_run_case(const void *param) {
    const gs_case *c = (const gs_case *)param;
    gb_with_env("FLASHC_CUDA_GQA_PACK", c->h > c->hk ? "1" : NULL, gs_run, param);
}

FC_TEST_REGISTER(gpu_sink_sweep) {
    static const int64_t dims[5] = {40, 64, 96, 128, 256};
    static const int64_t shapes[5][2] = {{1, 1}, {17, 113}, {113, 17}, {257, 300}, {640, 640}};
    static const char *const opt_names[6] = {"none", "causal", "window", "softcap", "alibi",
                                             "dropout"};
    for (int id = 0; id < 5; id++)
        for (int io = 0; io < 6; io++)
            for (int ig = 0; ig < 2; ig++) {
                gs_case c;
                memset(&c, 0, sizeof c);
                c.dt = (id + io + ig) % 2 ? FLASHC_DTYPE_FP16 : FLASHC_DTYPE_BF16;
                const int is = (2 * id + io + 3 * ig) % 5;
                c.b = 2;
                c.sq = shapes[is][0];
                c.sk = shapes[is][1];
                c.hk = ig ? 1 : 4;
                c.h = 4;
                c.d = dims[id];
                th_opts o = TH_OPTS_NONE;
                if (io == 1) o.causal = 1;
                if (io == 2) o.wl = 40, o.wr = 7;
                if (io == 3) o.softcap = 4.0f;
                if (io == 4) o.alibi = 1;
                if (io == 5) o.dropout = 0.17f;
                c.o = o;
                c.deterministic = (id + io) % 2;
                c.sink16 = (io + ig) % 2;
                if (gs_ncases == GS_MAX_CASES) abort();
                gs_cases[gs_ncases] = c;
                char name[128];
                snprintf(name, sizeof name, "gpu_sink_%s_d%lld_%lldx%lld_h4k%lld_%s%s%s",
                         flashc_dtype_name(c.dt), (long long)c.d, (long long)c.sq, (long long)c.sk,
                         (long long)c.hk, opt_names[io], c.deterministic ? "_det" : "",
                         c.sink16 ? "_sink16" : "");
                fc_test_add(name, gs_run_case, &gs_cases[gs_ncases++]);
            }
}

// ---- decode: flashc_fwd_kvcache over a full cache ----

typedef struct {
    flashc_dtype dt;
    int64_t sq, sk, hk, g, d;
    int page;       /* 0: contiguous cache; else rows per page */
    int num_splits; /* params.num_splits */
    int sink16;     /* the sink in dt on the device (gs_sink16), else fp32 */
} gsk_case;

static gsk_case gsk_cases[27];
static int gsk_ncases;

static void gsk_run(const void *param) {
    const gsk_case *c = (const gsk_case *)param;
    const flashc_dtype dt = c->dt;
    const int64_t B = 2, Sq = c->sq, Sk = c->sk, Hk = c->hk, H = Hk * c->g, D = c->d;
    const size_t es = flashc_dtype_size(dt);
    const int64_t nq = B * Sq * H * D, nk = B * Sk * Hk * D, nl = B * H * Sq;
    gb_arena ar = {0};
    th_opts o = TH_OPTS_NONE;
    o.causal = Sq > 1;
    flashc_params p = th_params(&o);
    p.num_splits = c->num_splits;

    const int64_t pps = c->page ? Sk / c->page : 0, pages = B * pps; /* Sk % page == 0 */
    gb_buf *qb = gb_new(&ar, (size_t)nq * es), *kb = gb_new(&ar, (size_t)nk * es);
    gb_buf *vb = gb_new(&ar, (size_t)nk * es), *ob = gb_new(&ar, (size_t)nq * es);
    gb_buf *lb = gb_new(&ar, (size_t)nl * 4), *sb = gb_new(&ar, (size_t)H * 4);
    gb_buf *pkb = c->page ? gb_new(&ar, (size_t)nk * es) : NULL;
    gb_buf *pvb = c->page ? gb_new(&ar, (size_t)nk * es) : NULL;
    gb_buf *btb = c->page ? gb_new(&ar, (size_t)pages * 4) : NULL;
    if (!qb || !kb || !vb || !ob || !lb || !sb || (c->page && (!pkb || !pvb || !btb))) goto done;
    gb_fill(qb, dt, -1.0, 1.0);
    gb_fill(kb, dt, -1.0, 1.0);
    gb_fill(vb, dt, -1.0, 1.0);
    gs_sink_fill(sb, H);
    gb_buf *s16 = c->sink16 ? gs_sink16(&ar, sb, dt, H) : NULL;
    if (c->sink16 && !s16) goto done;
    if (c->page) {
        /* page bt[b][j] holds rows j*page .. of sequence b */
        int32_t *bt = (int32_t *)btb->h;
        for (int64_t i = 0; i < pages; i++) bt[i] = (int32_t)i;
        th_shuffle(bt, pages);
        const size_t row = (size_t)(Hk * D) * es, page_bytes = row * (size_t)c->page;
        for (int64_t b = 0; b < B; b++)
            for (int64_t j = 0; j < pps; j++) {
                const size_t src = (size_t)(b * Sk + j * c->page) * row;
                const size_t dst = (size_t)bt[b * pps + j] * page_bytes;
                memcpy((char *)pkb->h + dst, (char *)kb->h + src, page_bytes);
                memcpy((char *)pvb->h + dst, (char *)vb->h + src, page_bytes);
            }
        if (!gb_upload(pkb) || !gb_upload(pvb) || !gb_upload(btb)) goto done;
    } else if (!gb_upload(kb) || !gb_upload(vb)) {
        goto done;
    }
    if (!gb_upload(qb) || !gb_upload(sb) || !gb_poison(ob) || !gb_poison(lb)) goto done;

    int64_t qs[4] = {B, Sq, H, D}, ks[4] = {B, Sk, Hk, D}, ls[3] = {B, H, Sq}, hs[1] = {H};
    int64_t ps[4] = {pages, c->page, Hk, D}, bs[2] = {B, pps};
    int64_t qst[4], kst[4], lst[3], pst[4], bst[2], hst[1] = {1};
    gb_contig_strides(4, qs, qst);
    gb_contig_strides(4, ks, kst);
    gb_contig_strides(3, ls, lst);
    gb_contig_strides(4, ps, pst);
    gb_contig_strides(2, bs, bst);
    flashc_kvcache_args kv;
    memset(&kv, 0, sizeof kv);
    kv.abi = FLASHC_ABI_VERSION;
    kv.q = gb_view(qb, 1, dt, 0, 4, qs, qst);
    if (c->page) {
        kv.k_cache = gb_view(pkb, 1, dt, 0, 4, ps, pst);
        kv.v_cache = gb_view(pvb, 1, dt, 0, 4, ps, pst);
        kv.block_table = gb_view(btb, 1, FLASHC_DTYPE_INT32, 0, 2, bs, bst);
    } else {
        kv.k_cache = gb_view(kb, 1, dt, 0, 4, ks, kst);
        kv.v_cache = gb_view(vb, 1, dt, 0, 4, ks, kst);
    }
    kv.out = gb_view(ob, 1, dt, 0, 4, qs, qst);
    kv.softmax_lse = gb_view(lb, 1, FLASHC_DTYPE_FP32, 0, 3, ls, lst);
    kv.sink = gs_sink_view(sb, s16, dt, 1, hs, hst);
    size_t wb = 0;
    GB_OK(flashc_fwd_kvcache_workspace_size(&kv, &p, &wb));
    void *ws = gb_ws(&ar, wb);
    if (wb && !ws) goto done;
    GB_OK(flashc_fwd_kvcache(&kv, &p, ws, wb));
    if (!gb_sync() || !gb_download(ob) || !gb_download(lb)) goto done;
    {
        flashc_fwd_args hf;
        memset(&hf, 0, sizeof hf);
        hf.abi = FLASHC_ABI_VERSION;
        hf.q = gb_view(qb, 0, dt, 0, 4, qs, qst);
        hf.k = gb_view(kb, 0, dt, 0, 4, ks, kst);
        hf.v = gb_view(vb, 0, dt, 0, 4, ks, kst);
        hf.sink = gb_view(sb, 0, FLASHC_DTYPE_FP32, 0, 1, hs, hst);
        gs_fwd f;
        gs_fwd_new(&ar, &f, nq, nl);
        GB_OK(fc_ref_fwd(&hf, &p, FC_REF_F64, f.r[0], f.r[1], NULL));
        GB_OK(fc_ref_fwd(&hf, &p, FC_REF_LOWP, f.l[0], f.l[1], NULL));
        const flashc_tensor ho = gb_view(ob, 0, dt, 0, 4, qs, qst);
        const flashc_tensor hl = gb_view(lb, 0, FLASHC_DTYPE_FP32, 0, 3, ls, lst);
        gs_fwd_check(&f, dt, &ho, &hl);
    }
done:
    gb_free(&ar);
}

FC_TEST_REGISTER(gpu_sink_kvcache) {
    static const int64_t dims[3] = {64, 128, 256};
    static const int pages[3] = {0, 16, 256}, splits[3] = {1, 3, 0};
    for (int id = 0; id < 3; id++)
        for (int ip = 0; ip < 3; ip++)
            for (int is = 0; is < 3; is++) {
                gsk_case c;
                memset(&c, 0, sizeof c);
                c.dt = (id + ip + is) % 2 ? FLASHC_DTYPE_FP16 : FLASHC_DTYPE_BF16;
                c.d = dims[id];
                c.page = pages[ip];
                c.num_splits = splits[is];
                c.sq = (id + is) % 2 ? 4 : 1;
                c.g = (ip + is) % 2 ? 8 : 1;
                c.hk = 2;
                c.sk = c.page ? 1024 : 1000;
                c.sink16 = (id + ip) % 2;
                gsk_cases[gsk_ncases] = c;
                char name[128];
                snprintf(name, sizeof name, "gpu_sink_kvcache_%s_d%lld_q%lld_g%lld_%s%d_splits%d%s",
                         flashc_dtype_name(c.dt), (long long)c.d, (long long)c.sq, (long long)c.g,
                         c.page ? "page" : "contig", c.page, c.num_splits,
                         c.sink16 ? "_sink16" : "");
                fc_test_add(name, gsk_run, &gsk_cases[gsk_ncases++]);
            }
}

// ---- varlen: an empty query sequence and an empty key sequence ----

/* Sequences (Sq, Sk): (37, 90), (0, 50), (64, 0), (100, 100); causal, GQA 4:2,
 * D 128, bf16, the sink in bf16 too. Checks out, lse and the rows of the keyless sequence exactly,
 * then dq, dk, dv and dsink. */
FC_TEST(gpu_sink_varlen) {
    enum { NB = 4, H = 4, Hk = 2, D = 128 };
    static const int32_t lq[NB] = {37, 0, 64, 100}, lk[NB] = {90, 50, 0, 100};
    const flashc_dtype dt = FLASHC_DTYPE_BF16;
    const size_t es = 2;
    int32_t cq[NB + 1] = {0}, ck[NB + 1] = {0};
    for (int b = 0; b < NB; b++) {
        cq[b + 1] = cq[b] + lq[b];
        ck[b + 1] = ck[b] + lk[b];
    }
    const int64_t Tq = cq[NB], Tk = ck[NB], nq = Tq * H * D, nk = Tk * Hk * D;
    gb_arena ar = {0};
    th_opts o = TH_OPTS_NONE;
    o.causal = 1;
    flashc_params p = th_params(&o);
    gb_buf *qb = gb_new(&ar, (size_t)nq * es), *kb = gb_new(&ar, (size_t)nk * es);
    gb_buf *vb = gb_new(&ar, (size_t)nk * es), *dob = gb_new(&ar, (size_t)nq * es);
    gb_buf *ob = gb_new(&ar, (size_t)nq * es), *lb = gb_new(&ar, (size_t)(H * Tq) * 4);
    gb_buf *sb = gb_new(&ar, H * 4), *dsb = gb_new(&ar, H * 4);
    gb_buf *dqb = gb_new(&ar, (size_t)nq * es), *dkb = gb_new(&ar, (size_t)nk * es);
    gb_buf *dvb = gb_new(&ar, (size_t)nk * es);
    gb_buf *cqb = gb_new(&ar, sizeof cq), *ckb = gb_new(&ar, sizeof ck);
    if (!qb || !kb || !vb || !dob || !ob || !lb || !sb || !dsb || !dqb || !dkb || !dvb || !cqb ||
        !ckb)
        goto done;
    gb_fill(qb, dt, -1.0, 1.0);
    gb_fill(kb, dt, -1.0, 1.0);
    gb_fill(vb, dt, -1.0, 1.0);
    gb_fill(dob, dt, -1.0, 1.0);
    gs_sink_fill(sb, H);
    gb_buf *s16 = gs_sink16(&ar, sb, dt, H); /* the sink in bf16 on the device */
    if (!s16) goto done;
    memcpy(cqb->h, cq, sizeof cq);
    memcpy(ckb->h, ck, sizeof ck);
    if (!gb_upload(qb) || !gb_upload(kb) || !gb_upload(vb) || !gb_upload(dob) || !gb_upload(sb) ||
        !gb_upload(cqb) || !gb_upload(ckb) || !gb_poison(ob) || !gb_poison(lb) ||
        !gb_poison(dqb) || !gb_poison(dkb) || !gb_poison(dvb) || !gb_poison(dsb))
        goto done;

    int64_t qs[3] = {Tq, H, D}, ks[3] = {Tk, Hk, D}, ls[2] = {H, Tq}, hs[1] = {H}, cs[1] = {NB + 1};
    int64_t qst[3], kst[3], lst[2], one[1] = {1};
    gb_contig_strides(3, qs, qst);
    gb_contig_strides(3, ks, kst);
    gb_contig_strides(2, ls, lst);
    flashc_varlen_bwd_args da, ha;
    memset(&da, 0, sizeof da);
    memset(&ha, 0, sizeof ha);
    da.abi = ha.abi = FLASHC_ABI_VERSION;
    for (int dev = 0; dev < 2; dev++) {
        flashc_varlen_bwd_args *x = dev ? &da : &ha;
        x->q = gb_view(qb, dev, dt, 0, 3, qs, qst);
        x->k = gb_view(kb, dev, dt, 0, 3, ks, kst);
        x->v = gb_view(vb, dev, dt, 0, 3, ks, kst);
        x->out = gb_view(ob, dev, dt, 0, 3, qs, qst);
        x->dout = gb_view(dob, dev, dt, 0, 3, qs, qst);
        x->softmax_lse = gb_view(lb, dev, FLASHC_DTYPE_FP32, 0, 2, ls, lst);
        x->cu_seqlens_q = gb_view(cqb, dev, FLASHC_DTYPE_INT32, 0, 1, cs, one);
        x->cu_seqlens_k = gb_view(ckb, dev, FLASHC_DTYPE_INT32, 0, 1, cs, one);
        x->max_seqlen_q = 100;
        x->max_seqlen_k = 100;
        x->sink = gs_sink_view(sb, s16, dt, dev, hs, one);
        x->dq = gb_view(dqb, dev, dt, 0, 3, qs, qst);
        x->dk = gb_view(dkb, dev, dt, 0, 3, ks, kst);
        x->dv = gb_view(dvb, dev, dt, 0, 3, ks, kst);
        x->dsink = gb_view(dsb, dev, FLASHC_DTYPE_FP32, 0, 1, hs, one);
    }
    flashc_varlen_fwd_args df, hf;
    memset(&df, 0, sizeof df);
    memset(&hf, 0, sizeof hf);
    df.abi = hf.abi = FLASHC_ABI_VERSION;
    for (int dev = 0; dev < 2; dev++) {
        flashc_varlen_fwd_args *f = dev ? &df : &hf;
        const flashc_varlen_bwd_args *x = dev ? &da : &ha;
        f->q = x->q, f->k = x->k, f->v = x->v, f->out = x->out, f->softmax_lse = x->softmax_lse;
        f->cu_seqlens_q = x->cu_seqlens_q, f->cu_seqlens_k = x->cu_seqlens_k;
        f->max_seqlen_q = x->max_seqlen_q, f->max_seqlen_k = x->max_seqlen_k;
        f->sink = x->sink;
    }
    size_t fb = 0, wb = 0;
    GB_OK(flashc_varlen_fwd_workspace_size(&df, &p, &fb));
    void *fws = gb_ws(&ar, fb);
    if (fb && !fws) goto done;
    GB_OK(flashc_varlen_fwd(&df, &p, fws, fb));
    GB_OK(flashc_varlen_bwd_workspace_size(&da, &p, &wb));
    void *ws = gb_ws(&ar, wb);
    if (wb && !ws) goto done;
    GB_OK(flashc_varlen_bwd(&da, &p, ws, wb));
    if (!gb_sync() || !gb_download(ob) || !gb_download(lb) || !gb_download(dqb) ||
        !gb_download(dkb) || !gb_download(dvb) || !gb_download(dsb))
        goto done;
    {
        gs_fwd f;
        gs_fwd_new(&ar, &f, nq, H * Tq);
        GB_OK(fc_ref_varlen_fwd(&hf, &p, FC_REF_F64, f.r[0], f.r[1], NULL));
        GB_OK(fc_ref_varlen_fwd(&hf, &p, FC_REF_LOWP, f.l[0], f.l[1], NULL));
        gs_fwd_check(&f, dt, &hf.out, &hf.softmax_lse);
        const double *g_out = f.g[0], *g_lse = f.g[1];
        /* sequence 2 sees no key: out 0 and lse the sink, exactly */
        const float *sink = (const float *)sb->h;
        for (int64_t t = cq[2]; t < cq[3]; t++)
            for (int64_t h = 0; h < H; h++) {
                for (int64_t d = 0; d < D; d++)
                    if (g_out[(t * H + h) * D + d] != 0.0)
                        fc_test_fail(__FILE__, __LINE__,
                                     "keyless row %lld head %lld: out[%lld] = %g", (long long)t,
                                     (long long)h, (long long)d, g_out[(t * H + h) * D + d]);
                if (g_lse[h * Tq + t] != (double)sink[h])
                    fc_test_fail(__FILE__, __LINE__,
                                 "keyless row %lld head %lld: lse %.9g, not the sink %.9g",
                                 (long long)t, (long long)h, g_lse[h * Tq + t], (double)sink[h]);
            }
    }
    {
        const flashc_tensor *const got[4] = {&ha.dq, &ha.dk, &ha.dv, &ha.dsink};
        gs_grads g;
        gs_grads_new(&ar, &g, nq, nk, H);
        GB_OK(fc_ref_varlen_bwd(&ha, &p, FC_REF_F64, g.r[0], g.r[1], g.r[2]));
        GB_OK(fc_ref_varlen_bwd(&ha, &p, FC_REF_LOWP, g.l[0], g.l[1], g.l[2]));
        GB_OK(fc_ref_varlen_bwd_dsink(&ha, &p, FC_REF_F64, g.r[3]));
        GB_OK(fc_ref_varlen_bwd_dsink(&ha, &p, FC_REF_LOWP, g.l[3]));
        gs_grads_check(&ar, &g, dt, got);
    }
done:
    gb_free(&ar);
}
