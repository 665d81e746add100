/* test_gpu_probs.c : attn_probs on the CUDA backend (flashc.h; src/cuda/probs.cu)
 * against the float64 reference, by DEVELOPERS.md's tolerance rule, on inputs
 * uniform in [-1, 1) and outputs poisoned with NaN first.
 *
 * Every call is checked for: attn_probs against fc_ref_fwd's /
 * fc_ref_varlen_fwd's (the tolerance rule; 0 exactly where the reference is 0:
 * masked keys, keys and rows past a sequence; negative exactly where the
 * reference is: the dropout mask); nothing written between the rows of
 * attn_probs, whose rows are 3 floats apart more than their length; out and
 * lse of the same call (asking for attn_probs changes neither); and out
 * recomputed in float64 from the probabilities, sum_j max(P_ij, 0) v_j /
 * (1 - p), against the reference's out.
 *
 * Cases:
 * - the batched sweep (gpu_probs_*): dtype {bf16, fp16} x D {40 (zero-padded),
 *   64, 96, 128, 256} x option {none, causal, window, softcap, ALiBi, sink,
 *   dropout, all of causal with a left edge, softcap, ALiBi, sink and dropout},
 *   each with an (Sq, Sk) from {(1, 1), (17, 113), (113, 17), (64, 64),
 *   (257, 300)}, GQA 1 or 3, and softmax_lse requested or not (the workspace
 *   then holds the lse the probabilities are computed from), picked so that
 *   every pair of values meets;
 * - varlen (gpu_probs_varlen_*): 4 sequences, one without queries and one
 *   without keys, contiguous K/V or paged (pages of 16 and of 3), seqused_k,
 *   by option;
 * - the dropout mask bit for bit (gpu_probs_mask_*): V = identity (Sk <= D),
 *   so out[i][j] of the same call is 0 exactly where its forward dropped (i, j):
 *   the negative entries of attn_probs are those, and the CPU backend's
 *   attn_probs (same seed and offset) has the same signs;
 * - the workspace (gpu_probs_workspace): without softmax_lse the size query
 *   counts 4 B H Sq bytes more; one byte less than it is
 *   FLASHC_ERR_WORKSPACE_TOO_SMALL with nothing written; with softmax_lse the
 *   size is that of the call without attn_probs.
 *
 * Every case runs with FLASHC_CUDA_GQA_PACK=1 (on sm90ws, GQA packing wherever
 * the kernel can: the lse of packed rows). FLASHC_CUDA_FAMILY=sm90 and =sm80 run
 * the same cases on those families.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/internal.h" /* fc_store */
#include "../support/reference.h"
#include "../fc_test.h"
#include "../helpers.h"
#include "gpu_helpers.h"

/* attn_probs rows are this many floats longer than max_seqlen_k */
#define GP_ROW_PAD 3

// ---- the options ----

typedef enum {
    GP_NONE,
    GP_CAUSAL,
    GP_WINDOW,
    GP_SOFTCAP,
    GP_ALIBI,
    GP_SINK,
    GP_DROPOUT,
    GP_ALL,
    GP_COUNT
} gp_opt;

static const char *const gp_names[GP_COUNT] = {"none",  "causal", "window",  "softcap",
                                               "alibi", "sink",   "dropout", "all"};

static flashc_params gp_params(gp_opt o, int64_t D) {
    th_opts t = TH_OPTS_NONE;
    t.scale = (float)(2.0 / sqrt((double)D)); /* peakier than the default */
    if (o == GP_CAUSAL || o == GP_ALL) t.causal = 1;
    if (o == GP_WINDOW) {
        t.wl = 41;
        t.wr = 7;
    }
    if (o == GP_ALL) t.wl = 23;
    if (o == GP_SOFTCAP || o == GP_ALL) {
        t.softcap = 5.0f;
        t.scale = (float)(6.0 / sqrt((double)D));
    }
    if (o == GP_DROPOUT || o == GP_ALL) t.dropout = 0.17f;
    return th_params(&t);
}

static int gp_alibi(gp_opt o) { return o == GP_ALIBI || o == GP_ALL; }
static int gp_sink(gp_opt o) { return o == GP_SINK || o == GP_ALL; }

/* ALiBi slopes [B, H] in [0.01, 0.6), or sinks [H] in [-2, 3) with head 0 at
 * 12 (the sink takes nearly all the mass) and the last head at -30 (none). */
static void gp_fill_alibi(gb_buf *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) ((float *)b->h)[i] = (float)fc_rand_uniform(0.01, 0.6);
}
static void gp_fill_sink(gb_buf *b, int64_t H) {
    float *s = (float *)b->h;
    for (int64_t h = 0; h < H; h++) s[h] = (float)fc_rand_uniform(-2.0, 3.0);
    if (H >= 2) {
        s[0] = 12.0f;
        s[H - 1] = -30.0f;
    }
}

// ---- the checks every call runs ----

/* A call's sequences as the checks see them: sequence b's query rows are rows
 * row0[b] .. row0[b] + lq[b] - 1 of out [rows, H, D], and its key j (< maxk) is
 * row vrow[b * maxk + j] of v seen as [rows, Hk, D], -1 past its keys. */
typedef struct {
    int64_t nseq, H, Hk, D, maxq, maxk;
    int64_t *row0, *lq, *vrow;
} gp_seqs;

/* The references of out, lse and attn_probs (float64 and the baseline) and
 * their sizes; probs dense [B, H, maxq, maxk]. */
typedef struct {
    double *out[2], *lse[2], *probs[2];
    int64_t no, nl, np;
} gp_refs;

static void gp_refs_new(gb_arena *ar, gp_refs *r, int64_t no, int64_t nl, int64_t np) {
    r->no = no;
    r->nl = nl;
    r->np = np;
    for (int m = 0; m < 2; m++) {
        r->out[m] = gb_dbl(ar, no);
        r->lse[m] = gb_dbl(ar, nl);
        r->probs[m] = gb_dbl(ar, np);
    }
}

/* The attn_probs tensor [B, H, maxq, maxk] of rows GP_ROW_PAD floats apart in
 * buffer b (host side, or device side when dev). */
static flashc_tensor gp_probs_view(const gb_buf *b, int dev, int64_t B, int64_t H, int64_t maxq,
                                   int64_t maxk) {
    const int64_t ld = maxk + GP_ROW_PAD;
    int64_t shape[4] = {B, H, maxq, maxk}, stride[4] = {H * maxq * ld, maxq * ld, ld, 1};
    return gb_view(b, dev, FLASHC_DTYPE_FP32, 0, 4, shape, stride);
}
static size_t gp_probs_bytes(int64_t B, int64_t H, int64_t maxq, int64_t maxk) {
    return (size_t)(B * H * maxq * (maxk + GP_ROW_PAD)) * sizeof(float);
}

/* got == 0 exactly where the reference's probability is 0 (masked, past a
 * sequence), and not 0 where it is above fp32's range of underflow. */
static void gp_check_zeros(const double *got, const double *ref, int64_t n) {
    int64_t bad = 0, first = -1;
    for (int64_t e = 0; e < n; e++)
        if ((ref[e] == 0.0 && got[e] != 0.0) || (fabs(ref[e]) > 1e-30 && got[e] == 0.0)) {
            if (first < 0) first = e;
            bad++;
        }
    if (bad)
        fc_test_fail(__FILE__, __LINE__, "probs: %lld elements are 0 where the reference is "
                     "not, or not 0 where it is (first at %lld: got %g want %g)", (long long)bad,
                     (long long)first, got[first], ref[first]);
}

/* The padding between the rows of attn_probs (host side of pb) still poisoned. */
static void gp_check_padding(const gb_buf *pb, int64_t rows, int64_t maxk) {
    const uint32_t *w = (const uint32_t *)pb->h;
    const int64_t ld = maxk + GP_ROW_PAD;
    int64_t bad = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = maxk; c < ld; c++) bad += w[r * ld + c] != 0xffffffffu;
    if (bad)
        fc_test_fail(__FILE__, __LINE__, "probs: %lld elements between rows were written",
                     (long long)bad);
}

/* out [rows, H, D] in float64 from the probabilities g (dense) and v:
 * sum_j max(P_ij, 0) v_j / (1 - p); rows of no sequence are left 0. */
static void gp_out_from_probs(const gp_seqs *s, const double *g, const double *v, double keep,
                              double *out, int64_t no) {
    const int64_t H = s->H, D = s->D, G = s->H / s->Hk;
    memset(out, 0, (size_t)no * sizeof(double));
    for (int64_t b = 0; b < s->nseq; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < s->lq[b]; i++) {
                double *o = out + ((s->row0[b] + i) * H + h) * D;
                const double *pr = g + ((b * H + h) * s->maxq + i) * s->maxk;
                for (int64_t j = 0; j < s->maxk; j++) {
                    const int64_t vr = s->vrow[b * s->maxk + j];
                    if (vr < 0 || pr[j] <= 0.0) continue;
                    const double *vj = v + (vr * s->Hk + h / G) * D;
                    for (int64_t d = 0; d < D; d++) o[d] += pr[j] * vj[d] / keep;
                }
            }
}

/* Run the forward of device args dev (flashc_varlen_fwd_args when varlen, else
 * flashc_fwd_args) with the workspace its size query asks for, download out, lse
 * and attn_probs (ob, lb, pb), and fill r from the reference on host args host.
 * 1 on success; a failure is recorded. */
static int gp_call(gb_arena *ar, int varlen, const void *dev, const void *host,
                   const flashc_params *p, const gb_buf *ob, const gb_buf *lb, const gb_buf *pb,
                   gp_refs *r) {
    size_t n = 0;
    GB_OK(varlen ? flashc_varlen_fwd_workspace_size(dev, p, &n)
                 : flashc_fwd_workspace_size(dev, p, &n));
    void *ws = gb_ws(ar, n);
    if (n && !ws) return 0;
    GB_OK(varlen ? flashc_varlen_fwd(dev, p, ws, n) : flashc_fwd(dev, p, ws, n));
    if (!gb_sync() || !gb_download(ob) || !gb_download(lb) || !gb_download(pb)) return 0;
    for (int m = 0; m < 2; m++)
        GB_OK(varlen ? fc_ref_varlen_fwd(host, p, (fc_ref_mode)m, r->out[m], r->lse[m], r->probs[m])
                     : fc_ref_fwd(host, p, (fc_ref_mode)m, r->out[m], r->lse[m], r->probs[m]));
    return 1;
done:
    return 0;
}

/* The downloaded (host-side) out, lse (NULL: not asked for) and attn_probs of
 * a call against r; v: the call's v (host view). */
static void gp_check(gb_arena *ar, flashc_dtype dt, const flashc_params *p, const gp_seqs *s,
                     const gp_refs *r, const flashc_tensor *out, const flashc_tensor *lse,
                     const flashc_tensor *v, const flashc_tensor *probs, const gb_buf *pb) {
    double *g = gb_dbl(ar, r->np), *go = gb_dbl(ar, r->no), *gl = gb_dbl(ar, r->nl);
    int64_t nv = 1;
    for (int i = 0; i < v->ndim; i++) nv *= v->shape[i];
    double *gv = gb_dbl(ar, nv), *of = gb_dbl(ar, r->no);
    if (!g || !go || !gl || !gv || !of) return;
    fc_tensor_to_double(probs, g);
    fc_check_close("probs", dt, g, r->probs[0], r->probs[1], r->np);
    th_check_signs("probs", g, r->probs[0], r->np);
    gp_check_zeros(g, r->probs[0], r->np);
    gp_check_padding(pb, s->nseq * s->H * s->maxq, s->maxk);
    fc_tensor_to_double(out, go);
    fc_check_close("out", dt, go, r->out[0], r->out[1], r->no);
    if (lse) {
        fc_tensor_to_double(lse, gl);
        fc_check_close("lse", dt, gl, r->lse[0], r->lse[1], r->nl);
    }
    fc_tensor_to_double(v, gv);
    gp_out_from_probs(s, g, gv, 1.0 - (double)p->dropout_p, of, r->no);
    fc_check_close("out from probs", dt, of, r->out[0], r->out[1], r->no);
}

// ---- the batched sweep ----

typedef struct {
    flashc_dtype dt;
    int64_t b, sq, sk, h, hk, d;
    gp_opt opt;
    int nolse; /* no softmax_lse: the workspace holds the lse */
} gp_case;

#define GP_MAX_CASES 96
static gp_case gp_cases[GP_MAX_CASES];
static int gp_ncases;

static void gp_run(const void *param) {
    const gp_case *c = (const gp_case *)param;
    const flashc_dtype dt = c->dt;
    const int64_t B = c->b, Sq = c->sq, Sk = c->sk, H = c->h, Hk = c->hk, D = c->d;
    const size_t es = flashc_dtype_size(dt);
    const int64_t nq = B * Sq * H * D, nk = B * Sk * Hk * D, nl = B * H * Sq;
    gb_arena ar = {0};
    flashc_params p = gp_params(c->opt, D);

    gb_buf *qb = gb_new(&ar, (size_t)nq * es), *kb = gb_new(&ar, (size_t)nk * es);
    gb_buf *vb = gb_new(&ar, (size_t)nk * es), *ob = gb_new(&ar, (size_t)nq * es);
    gb_buf *lb = gb_new(&ar, (size_t)nl * 4), *pb = gb_new(&ar, gp_probs_bytes(B, H, Sq, Sk));
    gb_buf *ab = gb_new(&ar, (size_t)(B * H) * 4), *sb = gb_new(&ar, (size_t)H * 4);
    /* gp_seqs' index arrays: int64_t in arena arrays of doubles (the same size) */
    int64_t *row0 = (int64_t *)gb_dbl(&ar, B), *lq = (int64_t *)gb_dbl(&ar, B);
    int64_t *vrow = (int64_t *)gb_dbl(&ar, B * Sk);
    if (!qb || !kb || !vb || !ob || !lb || !pb || !ab || !sb || !row0 || !lq || !vrow) goto done;
    gb_fill(qb, dt, -1.0, 1.0);
    gb_fill(kb, dt, -1.0, 1.0);
    gb_fill(vb, dt, -1.0, 1.0);
    gp_fill_alibi(ab, B * H);
    gp_fill_sink(sb, H);
    if (!gb_upload(qb) || !gb_upload(kb) || !gb_upload(vb) || !gb_upload(ab) || !gb_upload(sb) ||
        !gb_poison(ob) || !gb_poison(lb) || !gb_poison(pb))
        goto done;

    int64_t qshape[4] = {B, Sq, H, D}, kshape[4] = {B, Sk, Hk, D}, lshape[3] = {B, H, Sq};
    int64_t ashape[2] = {B, H}, qs[4], ks[4], ls[3], as[2];
    gb_contig_strides(4, qshape, qs);
    gb_contig_strides(4, kshape, ks);
    gb_contig_strides(3, lshape, ls);
    gb_contig_strides(2, ashape, as);
    flashc_fwd_args x[2]; /* host, device */
    for (int dev = 0; dev < 2; dev++) {
        memset(&x[dev], 0, sizeof x[dev]);
        x[dev].abi = FLASHC_ABI_VERSION;
        x[dev].q = gb_view(qb, dev, dt, 0, 4, qshape, qs);
        x[dev].k = gb_view(kb, dev, dt, 0, 4, kshape, ks);
        x[dev].v = gb_view(vb, dev, dt, 0, 4, kshape, ks);
        x[dev].out = gb_view(ob, dev, dt, 0, 4, qshape, qs);
        if (!c->nolse) x[dev].softmax_lse = gb_view(lb, dev, FLASHC_DTYPE_FP32, 0, 3, lshape, ls);
        if (gp_alibi(c->opt)) x[dev].alibi_slopes = gb_view(ab, dev, FLASHC_DTYPE_FP32, 0, 2, ashape, as);
        if (gp_sink(c->opt)) x[dev].sink = gb_view(sb, dev, FLASHC_DTYPE_FP32, 0, 1, &H, as + 1);
        x[dev].attn_probs = gp_probs_view(pb, dev, B, H, Sq, Sk);
    }

    {
        gp_refs r;
        gp_refs_new(&ar, &r, nq, nl, B * H * Sq * Sk);
        if (!gp_call(&ar, 0, &x[1], &x[0], &p, ob, lb, pb, &r)) goto done;
        for (int64_t b = 0; b < B; b++) {
            row0[b] = b * Sq;
            lq[b] = Sq;
            for (int64_t j = 0; j < Sk; j++) vrow[b * Sk + j] = b * Sk + j;
        }
        const gp_seqs s = {B, H, Hk, D, Sq, Sk, row0, lq, vrow};
        gp_check(&ar, dt, &p, &s, &r, &x[0].out, c->nolse ? NULL : &x[0].softmax_lse, &x[0].v,
                 &x[0].attn_probs, pb);
    }
done:
    gb_free(&ar);
}

static void gp_run_case(const void *param) {
    gb_with_env("FLASHC_CUDA_GQA_PACK", "1", gp_run, param);
}

FC_TEST_REGISTER(gpu_probs_sweep) {
    static const int64_t dims[5] = {40, 64, 96, 128, 256};
    static const int64_t shapes[5][2] = {{1, 1}, {17, 113}, {113, 17}, {64, 64}, {257, 300}};
    static const flashc_dtype dts[2] = {FLASHC_DTYPE_BF16, FLASHC_DTYPE_FP16};
    for (int t = 0; t < 2; t++)
        for (int di = 0; di < 5; di++)
            for (int o = 0; o < GP_COUNT; o++) {
                const int si = (3 * o + di + t) % 5; /* every pair of values meets */
                gp_case *c = &gp_cases[gp_ncases++];
                memset(c, 0, sizeof *c);
                c->dt = dts[t];
                c->d = dims[di];
                c->sq = shapes[si][0];
                c->sk = shapes[si][1];
                c->b = 2;
                c->hk = 2;
                c->h = (o + di + t) % 2 ? 6 : 2; /* GQA 3 or none */
                c->opt = (gp_opt)o;
                c->nolse = (o / 2 + di + t) % 2;
                char name[128];
                snprintf(name, sizeof name, "gpu_probs_%s_d%lld_%lldx%lld_h%lld:%lld_%s%s",
                         flashc_dtype_name(c->dt), (long long)c->d, (long long)c->sq,
                         (long long)c->sk, (long long)c->h, (long long)c->hk, gp_names[o],
                         c->nolse ? "_nolse" : "");
                fc_test_add(name, gp_run_case, c);
            }
}

// ---- varlen and paged ----

#define GPV_B 4

typedef struct {
    flashc_dtype dt;
    int64_t d, h, hk;
    gp_opt opt;
    int page_size; /* 0: K/V not paged */
    int seqused;
    int nolse;
} gpv_case;

static gpv_case gpv_cases[8];

/* b = 1 has no query rows, b = 3 no keys; seqused_k <= the keys */
static const int32_t gpv_lq[GPV_B] = {37, 0, 130, 5}, gpv_lk[GPV_B] = {45, 9, 190, 0},
                     gpv_used[GPV_B] = {40, 9, 77, 0};

static void gpv_run(const void *param) {
    const gpv_case *c = (const gpv_case *)param;
    const flashc_dtype dt = c->dt;
    const int64_t H = c->h, Hk = c->hk, D = c->d, NB = GPV_B;
    const size_t es = flashc_dtype_size(dt);
    gb_arena ar = {0};
    flashc_params p = gp_params(c->opt, D);

    int32_t cuq[GPV_B + 1] = {0}, cuk[GPV_B + 1] = {0};
    int64_t maxq = 0, maxk = 0;
    for (int b = 0; b < GPV_B; b++) {
        cuq[b + 1] = cuq[b] + gpv_lq[b];
        cuk[b + 1] = cuk[b] + gpv_lk[b];
        if (gpv_lq[b] > maxq) maxq = gpv_lq[b];
        if (gpv_lk[b] > maxk) maxk = gpv_lk[b];
    }
    const int64_t tq = cuq[GPV_B], tk = cuk[GPV_B], ps = c->page_size;
    const int64_t mb = ps ? (maxk + ps - 1) / ps : 0, nblocks = ps ? GPV_B * mb + 3 : 0;
    const int64_t krows = ps ? nblocks * ps : tk;
    const int64_t nq = tq * H * D, nk = krows * Hk * D, nl = H * tq;

    gb_buf *qb = gb_new(&ar, (size_t)nq * es), *kb = gb_new(&ar, (size_t)nk * es);
    gb_buf *vb = gb_new(&ar, (size_t)nk * es), *ob = gb_new(&ar, (size_t)nq * es);
    gb_buf *lb = gb_new(&ar, (size_t)nl * 4), *pb = gb_new(&ar, gp_probs_bytes(NB, H, maxq, maxk));
    gb_buf *ab = gb_new(&ar, (size_t)(NB * H) * 4), *sb = gb_new(&ar, (size_t)H * 4);
    gb_buf *cqb = gb_new(&ar, sizeof cuq), *ckb = gb_new(&ar, sizeof cuk);
    gb_buf *ub = gb_new(&ar, sizeof gpv_used);
    gb_buf *btb = gb_new(&ar, (size_t)(GPV_B * mb) * sizeof(int32_t));
    int64_t *row0 = (int64_t *)gb_dbl(&ar, NB), *lq = (int64_t *)gb_dbl(&ar, NB);
    int64_t *vrow = (int64_t *)gb_dbl(&ar, NB * maxk);
    if (!qb || !kb || !vb || !ob || !lb || !pb || !ab || !sb || !cqb || !ckb || !ub || !btb ||
        !row0 || !lq || !vrow)
        goto done;
    gb_fill(qb, dt, -1.0, 1.0);
    gb_fill(kb, dt, -1.0, 1.0);
    gb_fill(vb, dt, -1.0, 1.0);
    gp_fill_alibi(ab, NB * H);
    gp_fill_sink(sb, H);
    memcpy(cqb->h, cuq, sizeof cuq);
    memcpy(ckb->h, cuk, sizeof cuk);
    memcpy(ub->h, gpv_used, sizeof gpv_used);
    int32_t *bt = (int32_t *)btb->h;
    if (ps) {
        /* a random permutation of the pages, so neighbours are far apart */
        int32_t *perm = (int32_t *)malloc((size_t)nblocks * sizeof(int32_t));
        if (!perm) goto done;
        th_shuffle(perm, nblocks);
        memcpy(bt, perm, (size_t)(GPV_B * mb) * sizeof(int32_t));
        free(perm);
    }
    if (!gb_upload(qb) || !gb_upload(kb) || !gb_upload(vb) || !gb_upload(ab) || !gb_upload(sb) ||
        !gb_upload(cqb) || !gb_upload(ckb) || !gb_upload(ub) || !gb_upload(btb) ||
        !gb_poison(ob) || !gb_poison(lb) || !gb_poison(pb))
        goto done;

    int64_t qshape[3] = {tq, H, D}, k3[3] = {tk, Hk, D}, k4[4] = {nblocks, ps, Hk, D};
    int64_t lshape[2] = {H, tq}, ashape[2] = {NB, H}, cshape[1] = {GPV_B + 1}, ushape[1] = {NB};
    int64_t btshape[2] = {NB, mb}, qs[3], ks3[3], ks4[4], ls[2], as[2], bts[2], one[1] = {1};
    gb_contig_strides(3, qshape, qs);
    gb_contig_strides(3, k3, ks3);
    gb_contig_strides(4, k4, ks4);
    gb_contig_strides(2, lshape, ls);
    gb_contig_strides(2, ashape, as);
    gb_contig_strides(2, btshape, bts);
    flashc_varlen_fwd_args x[2]; /* host, device */
    for (int dev = 0; dev < 2; dev++) {
        memset(&x[dev], 0, sizeof x[dev]);
        x[dev].abi = FLASHC_ABI_VERSION;
        x[dev].q = gb_view(qb, dev, dt, 0, 3, qshape, qs);
        x[dev].out = gb_view(ob, dev, dt, 0, 3, qshape, qs);
        if (ps) {
            x[dev].k = gb_view(kb, dev, dt, 0, 4, k4, ks4);
            x[dev].v = gb_view(vb, dev, dt, 0, 4, k4, ks4);
            x[dev].block_table = gb_view(btb, dev, FLASHC_DTYPE_INT32, 0, 2, btshape, bts);
        } else {
            x[dev].k = gb_view(kb, dev, dt, 0, 3, k3, ks3);
            x[dev].v = gb_view(vb, dev, dt, 0, 3, k3, ks3);
        }
        x[dev].cu_seqlens_q = gb_view(cqb, dev, FLASHC_DTYPE_INT32, 0, 1, cshape, one);
        x[dev].cu_seqlens_k = gb_view(ckb, dev, FLASHC_DTYPE_INT32, 0, 1, cshape, one);
        if (c->seqused) x[dev].seqused_k = gb_view(ub, dev, FLASHC_DTYPE_INT32, 0, 1, ushape, one);
        x[dev].max_seqlen_q = maxq;
        x[dev].max_seqlen_k = maxk;
        if (!c->nolse) x[dev].softmax_lse = gb_view(lb, dev, FLASHC_DTYPE_FP32, 0, 2, lshape, ls);
        if (gp_alibi(c->opt)) x[dev].alibi_slopes = gb_view(ab, dev, FLASHC_DTYPE_FP32, 0, 2, ashape, as);
        if (gp_sink(c->opt)) x[dev].sink = gb_view(sb, dev, FLASHC_DTYPE_FP32, 0, 1, &H, one);
        x[dev].attn_probs = gp_probs_view(pb, dev, NB, H, maxq, maxk);
    }

    {
        gp_refs r;
        gp_refs_new(&ar, &r, nq, nl, NB * H * maxq * maxk);
        if (!gp_call(&ar, 1, &x[1], &x[0], &p, ob, lb, pb, &r)) goto done;
        for (int64_t b = 0; b < NB; b++) {
            row0[b] = cuq[b];
            lq[b] = gpv_lq[b];
            const int64_t keys = c->seqused ? gpv_used[b] : gpv_lk[b];
            for (int64_t j = 0; j < maxk; j++)
                vrow[b * maxk + j] = j >= keys ? -1 : ps ? bt[b * mb + j / ps] * ps + j % ps
                                                         : cuk[b] + j;
        }
        const gp_seqs s = {NB, H, Hk, D, maxq, maxk, row0, lq, vrow};
        gp_check(&ar, dt, &p, &s, &r, &x[0].out, c->nolse ? NULL : &x[0].softmax_lse, &x[0].v,
                 &x[0].attn_probs, pb);
    }
done:
    gb_free(&ar);
}

static void gpv_run_case(const void *param) {
    gb_with_env("FLASHC_CUDA_GQA_PACK", "1", gpv_run, param);
}

FC_TEST_REGISTER(gpu_probs_varlen) {
    const flashc_dtype bf = FLASHC_DTYPE_BF16, hf = FLASHC_DTYPE_FP16;
    static const char *const names[8] = {
        "gpu_probs_varlen_bf16_d128_h4:2_none",
        "gpu_probs_varlen_fp16_d64_h2:2_causal_seqused_nolse",
        "gpu_probs_varlen_bf16_d96_h3:1_window_seqused",
        "gpu_probs_varlen_fp16_d256_h2:1_all_nolse",
        "gpu_probs_paged_bf16_d128_h4:2_page16_dropout_nolse",
        "gpu_probs_paged_fp16_d64_h2:1_page3_causal",
        "gpu_probs_paged_bf16_d40_h4:4_page16_alibi_seqused",
        "gpu_probs_paged_fp16_d128_h6:2_page3_all_seqused",
    };
    /* dt, D, H, Hk, option, page_size, seqused, nolse */
    const gpv_case cs[8] = {
        {bf, 128, 4, 2, GP_NONE, 0, 0, 0},    {hf, 64, 2, 2, GP_CAUSAL, 0, 1, 1},
        {bf, 96, 3, 1, GP_WINDOW, 0, 1, 0},   {hf, 256, 2, 1, GP_ALL, 0, 0, 1},
        {bf, 128, 4, 2, GP_DROPOUT, 16, 0, 1}, {hf, 64, 2, 1, GP_CAUSAL, 3, 0, 0},
        {bf, 40, 4, 4, GP_ALIBI, 16, 1, 0},   {hf, 128, 6, 2, GP_ALL, 3, 1, 0},
    };
    for (int i = 0; i < 8; i++) {
        gpv_cases[i] = cs[i];
        fc_test_add(names[i], gpv_run_case, &gpv_cases[i]);
    }
}

// ---- the dropout mask, bit for bit ----

typedef struct {
    flashc_dtype dt;
    int64_t d, sq, h, hk; /* Sk = D */
    int causal, nolse;
} gpm_case;

static gpm_case gpm_cases[2];

static void gpm_run(const void *param) {
    const gpm_case *c = (const gpm_case *)param;
    const flashc_dtype dt = c->dt;
    const int64_t B = 2, H = c->h, Hk = c->hk, Sq = c->sq, Sk = c->d, D = c->d;
    const size_t es = flashc_dtype_size(dt);
    const int64_t nq = B * Sq * H * D, nk = B * Sk * Hk * D, np = B * H * Sq * Sk;
    gb_arena ar = {0};
    flashc_params p = flashc_params_default();
    p.causal = c->causal;
    p.dropout_p = 0.3f;
    p.dropout_seed = 0x9e3779b97f4a7c15ull ^ (fc_rand_u64() & 0xffff);
    p.dropout_offset = 0xfffffffdull; /* j / 8 >= 3 carries into the counter's high word */

    gb_buf *qb = gb_new(&ar, (size_t)nq * es), *kb = gb_new(&ar, (size_t)nk * es);
    gb_buf *vb = gb_new(&ar, (size_t)nk * es), *ob = gb_new(&ar, (size_t)nq * es);
    gb_buf *lb = gb_new(&ar, (size_t)(B * H * Sq) * 4), *pb = gb_new(&ar, gp_probs_bytes(B, H, Sq, Sk));
    gb_buf *cob = gb_new(&ar, (size_t)nq * es), *cpb = gb_new(&ar, gp_probs_bytes(B, H, Sq, Sk));
    double *g = gb_dbl(&ar, np), *cpu = gb_dbl(&ar, np);
    if (!qb || !kb || !vb || !ob || !lb || !pb || !cob || !cpb || !g || !cpu) goto done;
    gb_fill(qb, dt, -1.0, 1.0);
    gb_fill(kb, dt, -1.0, 1.0);
    /* V[b, j, hk, :] = e_j: out[b, i, h, j] = P'[i, j], which is 0 iff dropped */
    for (int64_t r = 0; r < B * Sk * Hk; r++)
        for (int64_t d = 0; d < D; d++) fc_store(dt, vb->h, r * D + d, d == r / Hk % Sk ? 1.0f : 0.0f);
    if (!gb_upload(qb) || !gb_upload(kb) || !gb_upload(vb) || !gb_poison(ob) || !gb_poison(lb) ||
        !gb_poison(pb))
        goto done;

    int64_t qshape[4] = {B, Sq, H, D}, kshape[4] = {B, Sk, Hk, D}, lshape[3] = {B, H, Sq};
    int64_t qs[4], ks[4], ls[3];
    gb_contig_strides(4, qshape, qs);
    gb_contig_strides(4, kshape, ks);
    gb_contig_strides(3, lshape, ls);
    flashc_fwd_args x[2]; /* host (the CPU backend's call), device */
    for (int dev = 0; dev < 2; dev++) {
        memset(&x[dev], 0, sizeof x[dev]);
        x[dev].abi = FLASHC_ABI_VERSION;
        x[dev].q = gb_view(qb, dev, dt, 0, 4, qshape, qs);
        x[dev].k = gb_view(kb, dev, dt, 0, 4, kshape, ks);
        x[dev].v = gb_view(vb, dev, dt, 0, 4, kshape, ks);
        x[dev].out = gb_view(dev ? ob : cob, dev, dt, 0, 4, qshape, qs);
        if (!c->nolse) x[dev].softmax_lse = gb_view(lb, dev, FLASHC_DTYPE_FP32, 0, 3, lshape, ls);
        x[dev].attn_probs = gp_probs_view(dev ? pb : cpb, dev, B, H, Sq, Sk);
    }
    GB_OK(flashc_fwd(&x[1], &p, NULL, 0));
    if (!gb_sync() || !gb_download(ob) || !gb_download(pb)) goto done;
    GB_OK(flashc_fwd(&x[0], &p, NULL, 0));
    fc_tensor_to_double(&x[0].attn_probs, cpu);
    {
        flashc_tensor gt = gp_probs_view(pb, 0, B, H, Sq, Sk);
        fc_tensor_to_double(&gt, g);
    }
    {
        int64_t bad_out = 0, bad_cpu = 0, dropped = 0, seen = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < Sq; i++)
                    for (int64_t j = 0; j < Sk; j++) {
                        const int64_t e = ((b * H + h) * Sq + i) * Sk + j;
                        if (g[e] == 0.0 && cpu[e] == 0.0) continue; /* masked */
                        const double o = fc_get(ob->h, dt, ((b * Sq + i) * H + h) * D + j);
                        const int drop = signbit(g[e]) != 0;
                        seen++;
                        dropped += drop;
                        if (drop != (o == 0.0) && bad_out++ < 4)
                            printf("    (b=%lld h=%lld i=%lld j=%lld): probs %g but out %g\n",
                                   (long long)b, (long long)h, (long long)i, (long long)j, g[e], o);
                        bad_cpu += drop != (signbit(cpu[e]) != 0);
                    }
        FC_EXPECT_EQ(bad_out, 0);
        FC_EXPECT_EQ(bad_cpu, 0);
        /* the drop rate is near p (the mask is not empty) */
        FC_EXPECT_TRUE(seen > 0);
        if (seen) FC_EXPECT_NEAR((double)dropped / (double)seen, p.dropout_p, 0.03);
    }
done:
    gb_free(&ar);
}

FC_TEST_REGISTER(gpu_probs_mask) {
    gpm_cases[0] = (gpm_case){FLASHC_DTYPE_BF16, 128, 300, 3, 3, 0, 1};
    gpm_cases[1] = (gpm_case){FLASHC_DTYPE_FP16, 64, 257, 6, 2, 1, 0};
    fc_test_add("gpu_probs_mask_bf16_d128_300x128_nolse", gpm_run, &gpm_cases[0]);
    fc_test_add("gpu_probs_mask_fp16_d64_257x64_h6:2_causal", gpm_run, &gpm_cases[1]);
}

// ---- the workspace ----

FC_TEST(gpu_probs_workspace) {
    const flashc_dtype dt = FLASHC_DTYPE_BF16;
    const int64_t B = 2, Sq = 33, Sk = 70, H = 4, D = 64;
    const size_t es = flashc_dtype_size(dt);
    gb_arena ar = {0};
    flashc_params p = flashc_params_default();
    gb_buf *qb = gb_new(&ar, (size_t)(B * Sq * H * D) * es);
    gb_buf *kb = gb_new(&ar, (size_t)(B * Sk * H * D) * es);
    gb_buf *ob = gb_new(&ar, (size_t)(B * Sq * H * D) * es);
    gb_buf *lb = gb_new(&ar, (size_t)(B * H * Sq) * 4), *pb = gb_new(&ar, gp_probs_bytes(B, H, Sq, Sk));
    if (!qb || !kb || !ob || !lb || !pb) goto done;
    gb_fill(qb, dt, -1.0, 1.0);
    gb_fill(kb, dt, -1.0, 1.0);
    if (!gb_upload(qb) || !gb_upload(kb) || !gb_poison(ob) || !gb_poison(pb)) goto done;
    {
        int64_t qshape[4] = {B, Sq, H, D}, kshape[4] = {B, Sk, H, D}, lshape[3] = {B, H, Sq};
        int64_t qs[4], ks[4], ls[3];
        gb_contig_strides(4, qshape, qs);
        gb_contig_strides(4, kshape, ks);
        gb_contig_strides(3, lshape, ls);
        flashc_fwd_args a;
        memset(&a, 0, sizeof a);
        a.abi = FLASHC_ABI_VERSION;
        a.q = gb_view(qb, 1, dt, 0, 4, qshape, qs);
        a.k = a.v = gb_view(kb, 1, dt, 0, 4, kshape, ks);
        a.out = gb_view(ob, 1, dt, 0, 4, qshape, qs);
        size_t plain = 0, with_lse = 0, no_lse = 0;
        GB_OK(flashc_fwd_workspace_size(&a, &p, &plain));
        a.attn_probs = gp_probs_view(pb, 1, B, H, Sq, Sk);
        GB_OK(flashc_fwd_workspace_size(&a, &p, &no_lse));
        FC_EXPECT_TRUE(no_lse >= plain + (size_t)(B * H * Sq) * sizeof(float));
        a.softmax_lse = gb_view(lb, 1, FLASHC_DTYPE_FP32, 0, 3, lshape, ls);
        GB_OK(flashc_fwd_workspace_size(&a, &p, &with_lse));
        FC_EXPECT_EQ(with_lse, plain);
        a.softmax_lse.data = NULL;
        void *ws = gb_ws(&ar, no_lse);
        if (!ws) goto done;
        FC_EXPECT_STATUS(flashc_fwd(&a, &p, ws, no_lse - 1), FLASHC_ERR_WORKSPACE_TOO_SMALL);
        FC_EXPECT_TRUE(strstr(flashc_last_error(), "workspace") != NULL);
        if (!gb_sync() || !gb_download(ob) || !gb_download(pb)) goto done;
        int64_t written = 0;
        for (size_t i = 0; i < pb->bytes; i++) written += ((unsigned char *)pb->h)[i] != 0xff;
        for (size_t i = 0; i < ob->bytes; i++) written += ((unsigned char *)ob->h)[i] != 0xff;
        FC_EXPECT_EQ(written, 0);
    }
done:
    gb_free(&ar);
}
