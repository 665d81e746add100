/* test_gpu_fwd.c : the CUDA forward against the float64 reference.
 *
 * Runs flashc_fwd / flashc_varlen_fwd on device tensors (cudaMalloc'd, outputs
 * poisoned with NaN by cudaMemset 0xff before every call), copies the results
 * back and checks them with DEVELOPERS.md's tolerance rule against
 * fc_ref_fwd / fc_ref_varlen_fwd run on host copies of the same inputs.
 *
 * Cases:
 * - the sweep: dtype {bf16, fp16} x D {32, 64, 80 (zero-padded), 96, 128, 160,
 *   192, 224, 256} x option {none, causal, window, softcap, alibi, dropout,
 *   gqa}, each with one shape from (Sq, Sk) in {(1,1), (17,113), (113,17),
 *   (1000,1000), (2049,1000)}, picked so every pair of (dtype, D, shape,
 *   option) values meets in some case. On an sm90 device these run the kernel
 *   family fwd.cu picks (sm90ws for D > 32 where it can, else sm90);
 *   FLASHC_CUDA_FAMILY=sm90 and =sm80 run the same cases on those families;
 * - more query tiles than twice the SMs at D128 (the persistent sm90ws kernel:
 *   several tiles per CTA), causal, Sq < Sk, GQA and a window;
 * - packed layouts: qkvpacked [B,S,3,H,D] and kvpacked [B,S,2,Hk,D] views;
 * - operands the kernels cannot read in place (repacked through the
 *   workspace): D in {1, 7, 36, 100, 129, 250} x {bf16, fp16} x {none,
 *   causal}, q (and out) one element past a 16-byte boundary, and a varlen
 *   and a paged case with D not a multiple of 8;
 * - varlen with an empty query sequence and an empty key sequence, with and
 *   without causal, and with seqused_k;
 * - paged KV (varlen + block_table) with page sizes 1, 3, 8, 16, 32, 48, 64,
 *   128 and 256 (on sm90ws: one TMA box per key tile or per page of one);
 * - which family ran, from the launch log: sm90ws (paged K/V included), sm90
 *   (FLASHC_CUDA_FAMILY=sm90, pages of 3 rows) and sm80 (=sm80, D <= 32) on
 *   compute capability 9.0;
 * - GQA packing (sm90ws: the G = H / Hk query heads of one KV head share
 *   query tiles; the persistent instances pack, D128's and D64's short-work
 *   row, so of the cases below those with head dims 33..128 pack and the
 *   others run the unpacked GQA path; gpu_fwd_gqa_pack), every case with FLASHC_CUDA_GQA_PACK=1 so
 *   that it packs wherever the kernel can: a sweep of G {2, 4, 8, 16} x Sq
 *   {1, 2, 5, 16, 33, 100} x option {none, causal, window two-sided, window
 *   left-only, window causal-local, softcap}, with D {64, 80, 128, 256},
 *   dtype, Sk {< Sq, = Sq, > Sq: 37, 300 or 1000} and the lse returned or not
 *   picked so every pair of values meets over all 36 cases (not over the
 *   packed half alone); varlen and paged varlen (pages of 16 and 256) with
 *   per-sequence lengths of 0 to 100 query and 0 to 1000 key rows (an empty
 *   query sequence and an empty key one), G x option {none, causal, windows,
 *   softcap, no lse} with D {64, 100, 128, 256}, dtype, lengths, paging and
 *   seqused_k paired the same way (24 cases); odd groups (G = 3 and 6), MQA
 *   groups of 32, 64 and 128 (a position's rows fill a fragment or more), D
 *   96, 100 and 192, misaligned q and out, kvpacked K/V, a group that fills
 *   its tiles exactly or by one position more; more packed tiles than SMs at
 *   D128 (the persistent kernel; causal as pairs of tiles, with and without
 *   a window, and as single tiles); and calls that cannot pack (ALiBi,
 *   dropout, G = 3 or 6, the one-tile instances);
 * - the pack in the launch log (gpu_fwd_gqa_pack_dispatch): by the rule,
 *   pack=8 where packing halves the waves, pack=4 where it cuts them from 4
 *   to 3, and pack=1 where it does not cut them or Sq is long; FLASHC_CUDA_GQA_PACK=0 never and =1 always where the kernel can
 *   (batched and paged varlen), not with ALiBi nor with G = 6; D64's
 *   short-work row (short=1) by its rule (1024 keys a row, 2048 causal, a
 *   packed call) and not at 2048 keys, FLASHC_CUDA_SHORT_ROW=0 never and =1
 *   always (never at D128, which has none); packed
 *   causal items are single tiles (pairs=0) when pairs of tiles cannot fill
 *   the SMs, pairs (pairs=1) when they can;
 *   FLASHC_CUDA_FAMILY=sm90 and =sm80 run their families, which do not pack;
 * - the dropout mask bit for bit: with Sk <= D and V = identity, out[i][j] is
 *   0 exactly where element (i, j) was dropped, so the GPU's mask is read off
 *   its output and compared with the sign pattern of attn_probs from the
 *   reference and from the CPU backend (same seed and offset; the offset
 *   carries into the counter's high word).
 *
 * Build: this file + gpu_helpers.c + tests/helpers.c + tests/run.c, linked with
 * flashc_static and cudart.
 * Needs a CUDA device of compute capability >= 8.0; without one every case fails.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/internal.h" /* fc_store */
#include "../support/reference.h"
#include "../fc_test.h"
#include "../helpers.h" /* th_shuffle */
#include "gpu_helpers.h"

// ---- the batched sweep ----

typedef enum {
    GO_NONE,
    GO_CAUSAL,
    GO_WINDOW,
    GO_SOFTCAP,
    GO_ALIBI,
    GO_DROPOUT,
    GO_GQA,
    GO_COUNT
} gpu_opt;

static const char *const go_names[GO_COUNT] = {"none",  "causal",  "window", "softcap",
                                                "alibi", "dropout", "gqa"};

/* Layout of k and v: separate [B,Sk,Hk,D] tensors, views into one kvpacked
 * [B,Sk,2,Hk,D] buffer, or (Sq == Sk, Hk == H) q, k, v into qkvpacked [B,S,3,H,D]. */
typedef enum { GL_SEPARATE, GL_KVPACKED, GL_QKVPACKED } gpu_layout;

typedef struct {
    flashc_dtype dt;
    int64_t b, sq, sk, h, hk, d;
    gpu_opt opt;
    gpu_layout layout;
    int variant; /* picks a flavour of an option (window: 0 to 2, alibi: 0 or 1) */
    int misalign; /* bit 0: q one element past the buffer start; bit 1: out likewise */
    int nolse;    /* no softmax_lse: only out is returned and checked */
    int pack;     /* FLASHC_CUDA_GQA_PACK for the case: 1 "1" (GQA packing wherever it can),
                     -1 "0" (never), 0 unset (fwd.cu's rule) */
} gpu_case;

#define GPU_MAX_CASES 384
static gpu_case gpu_cases[GPU_MAX_CASES];
static int gpu_ncases;

/* variant 0: a two-sided window; 1: causal with a left edge (local); 2: a
 * left edge only (every key to the right seen) */
static void gpu_window(flashc_params *p, int variant) {
    static const int32_t edges[3][2] = {{41, 7}, {29, 0}, {23, -1}};
    p->windowed = 1;
    p->window_left = edges[variant][0];
    p->window_right = edges[variant][1];
}

static flashc_params gpu_params(const gpu_case *c) {
    flashc_params p = flashc_params_default();
    p.softmax_scale = (float)(2.0 / sqrt((double)c->d)); /* peakier than the default */
    switch (c->opt) {
    case GO_CAUSAL: p.causal = 1; break;
    case GO_WINDOW: gpu_window(&p, c->variant); break;
    case GO_SOFTCAP:
        p.softcap = 5.0f;
        p.softmax_scale = (float)(6.0 / sqrt((double)c->d));
        break;
    case GO_DROPOUT:
        p.dropout_p = 0.17f;
        p.dropout_seed = fc_rand_u64();
        p.dropout_offset = fc_rand_u64() >> 40;
        break;
    default: break;
    }
    return p;
}

static void gpu_run_batched(const void *param) {
    const gpu_case *c = (const gpu_case *)param;
    const flashc_dtype dt = c->dt;
    const int64_t B = c->b, Sq = c->sq, Sk = c->sk, H = c->h, Hk = c->hk, D = c->d;
    const size_t es = flashc_dtype_size(dt);
    gb_arena ar = {0};
    flashc_params p = gpu_params(c);

    // q, k, v in one of the layouts; values uniform in [-1, 1)
    int64_t qshape[4] = {B, Sq, H, D}, kshape[4] = {B, Sk, Hk, D};
    int64_t qstride[4], kstride[4], ostride[4];
    gb_buf *qb, *kb, *vb;
    int64_t k_off = 0, v_off = 0;
    gb_contig_strides(4, qshape, qstride);
    gb_contig_strides(4, qshape, ostride);
    gb_contig_strides(4, kshape, kstride);
    if (c->layout == GL_QKVPACKED) {
        qb = kb = vb = gb_new(&ar, (size_t)(B * Sq * 3 * H * D) * es);
        int64_t s[4] = {Sq * 3 * H * D, 3 * H * D, D, 1};
        memcpy(qstride, s, sizeof s);
        memcpy(kstride, s, sizeof s);
        k_off = H * D;
        v_off = 2 * H * D;
    } else {
        qb = gb_new(&ar, (size_t)(B * Sq * H * D + 1) * es);
        if (c->layout == GL_KVPACKED) {
            kb = vb = gb_new(&ar, (size_t)(B * Sk * 2 * Hk * D) * es);
            int64_t s[4] = {Sk * 2 * Hk * D, 2 * Hk * D, D, 1};
            memcpy(kstride, s, sizeof s);
            v_off = Hk * D;
        } else {
            kb = gb_new(&ar, (size_t)(B * Sk * Hk * D) * es);
            vb = gb_new(&ar, (size_t)(B * Sk * Hk * D) * es);
        }
    }
    gb_buf *ob = gb_new(&ar, (size_t)(B * Sq * H * D + 1) * es);
    gb_buf *lb = gb_new(&ar, (size_t)(B * H * Sq) * sizeof(float));
    gb_buf *ab = NULL;
    const int64_t q_off = c->misalign & 1, o_off = (c->misalign >> 1) & 1;
    int64_t ashape[2] = {B, H}, astride[2] = {H, 1};
    if (c->opt == GO_ALIBI) ab = gb_new(&ar, (size_t)(B * H) * sizeof(float));
    if (!qb || !kb || !vb || !ob || !lb || (c->opt == GO_ALIBI && !ab)) goto done;
    gb_fill(qb, dt, -1.0, 1.0);
    if (kb != qb) gb_fill(kb, dt, -1.0, 1.0);
    if (vb != kb) gb_fill(vb, dt, -1.0, 1.0);
    if (ab) {
        float *s = (float *)ab->h;
        for (int64_t i = 0; i < B * H; i++) s[i] = (float)fc_rand_uniform(0.01, 0.6);
    }
    if (!gb_upload(qb) || (kb != qb && !gb_upload(kb)) || (vb != kb && !gb_upload(vb)) ||
        (ab && !gb_upload(ab)) || !gb_poison(ob) || !gb_poison(lb))
        goto done;

    int64_t lshape[3] = {B, H, Sq}, lstride[3];
    gb_contig_strides(3, lshape, lstride);
    flashc_fwd_args da, ha;
    memset(&da, 0, sizeof da);
    da.abi = FLASHC_ABI_VERSION;
    memset(&ha, 0, sizeof ha);
    ha.abi = FLASHC_ABI_VERSION;
    for (int dev = 0; dev < 2; dev++) {
        flashc_fwd_args *x = dev ? &da : &ha;
        x->q = gb_view(qb, dev, dt, q_off, 4, qshape, qstride);
        x->k = gb_view(kb, dev, dt, k_off, 4, kshape, kstride);
        x->v = gb_view(vb, dev, dt, v_off, 4, kshape, kstride);
        x->out = gb_view(ob, dev, dt, o_off, 4, qshape, ostride);
        if (!c->nolse) x->softmax_lse = gb_view(lb, dev, FLASHC_DTYPE_FP32, 0, 3, lshape, lstride);
        if (ab) {
            /* variant 0: slopes [H] (the first row), 1: slopes [B, H] */
            x->alibi_slopes = c->variant ? gb_view(ab, dev, FLASHC_DTYPE_FP32, 0, 2, ashape, astride)
                                         : gb_view(ab, dev, FLASHC_DTYPE_FP32, 0, 1, ashape + 1,
                                                   astride + 1);
        }
    }

    size_t ws_bytes = 0;
    GB_OK(flashc_fwd_workspace_size(&da, &p, &ws_bytes));
    void *ws = gb_ws(&ar, ws_bytes);
    if (ws_bytes && !ws) goto done;
    GB_OK(flashc_fwd(&da, &p, ws, ws_bytes));
    if (!gb_sync() || !gb_download(ob) || !gb_download(lb)) goto done;

    {
        const int64_t no = B * Sq * H * D, nl = B * H * Sq;
        double *r_out = gb_dbl(&ar, no), *r_lse = gb_dbl(&ar, nl);
        double *l_out = gb_dbl(&ar, no), *l_lse = gb_dbl(&ar, nl);
        double *g_out = gb_dbl(&ar, no), *g_lse = gb_dbl(&ar, nl);
        GB_OK(fc_ref_fwd(&ha, &p, FC_REF_F64, r_out, r_lse, NULL));
        GB_OK(fc_ref_fwd(&ha, &p, FC_REF_LOWP, l_out, l_lse, NULL));
        fc_tensor_to_double(&ha.out, g_out);
        fc_check_close("out", dt, g_out, r_out, l_out, no);
        if (!c->nolse) {
            fc_tensor_to_double(&ha.softmax_lse, g_lse);
            fc_check_close("lse", dt, g_lse, r_lse, l_lse, nl);
        }
    }
done:
    gb_free(&ar);
}

static void gpu_run_batched_case(const void *param) {
    const gpu_case *c = (const gpu_case *)param;
    gb_with_env("FLASHC_CUDA_GQA_PACK", c->pack > 0 ? "1" : c->pack < 0 ? "0" : NULL,
                gpu_run_batched, param);
}

static void gpu_add(const char *name, const gpu_case *c) {
    if (gpu_ncases == GPU_MAX_CASES) {
        fprintf(stderr, "test_gpu_fwd: too many cases\n");
        abort();
    }
    gpu_cases[gpu_ncases] = *c;
    fc_test_add(name, gpu_run_batched_case, &gpu_cases[gpu_ncases]);
    gpu_ncases++;
}

FC_TEST_REGISTER(gpu_fwd_sweep) {
    static const int64_t dims[9] = {32, 64, 80, 96, 128, 160, 192, 224, 256};
    static const int64_t shapes[5][2] = {{1, 1}, {17, 113}, {113, 17}, {1000, 1000}, {2049, 1000}};
    static const flashc_dtype dts[2] = {FLASHC_DTYPE_BF16, FLASHC_DTYPE_FP16};
    for (int t = 0; t < 2; t++)
        for (int di = 0; di < 9; di++)
            for (int o = 0; o < GO_COUNT; o++) {
                const int si = (3 * o + di + t) % 5; /* every pair of values meets */
                gpu_case c;
                memset(&c, 0, sizeof c);
                c.dt = dts[t];
                c.d = dims[di];
                c.sq = shapes[si][0];
                c.sk = shapes[si][1];
                const int big = c.sq * c.sk > 100000; /* keep the float64 reference quick */
                c.b = big ? 1 : 2;
                c.h = big ? 1 : 3;
                c.hk = c.h;
                if (o == GO_GQA) {
                    c.h = big ? 2 : 6;
                    c.hk = big ? 1 : 2;
                }
                c.opt = (gpu_opt)o;
                c.variant = (di + t) % 2;
                c.layout = GL_SEPARATE;
                char name[128];
                snprintf(name, sizeof name, "gpu_fwd_%s_d%lld_%lldx%lld_%s%s", flashc_dtype_name(c.dt),
                         (long long)c.d, (long long)c.sq, (long long)c.sk, go_names[o],
                         (o == GO_WINDOW || o == GO_ALIBI) ? (c.variant ? "1" : "0") : "");
                gpu_add(name, &c);
            }
}

/* More query tiles than twice the SMs (132 on an H100/H200): the persistent
 * sm90ws kernels (D128, and D64's short-work row, which these D64 shapes
 * take by the rule) run one CTA per SM, so each CTA works several tiles,
 * uses both Q buffers and the second time waits for one to be freed, and runs
 * its K/V ring on across tiles. Causal items are pairs of tiles (M - 1 - k, k),
 * one a single tile when M is odd; Sq < Sk, GQA and a window shift the work.
 * FLASHC_CUDA_GQA_PACK=0: the GQA cases stay unpacked whatever the device's SM
 * count makes of the packing rule (gpu_fwd_gqa_pack has the packed ones). */
FC_TEST_REGISTER(gpu_fwd_many_tiles) {
    static const struct {
        flashc_dtype dt;
        int64_t b, sq, sk, h, hk, d;
        gpu_opt opt;
        const char *name;
    } m[7] = {
        {FLASHC_DTYPE_BF16, 4, 257, 257, 24, 24, 128, GO_CAUSAL, "gpu_fwd_many_bf16_d128_4x257_h24_causal"},
        {FLASHC_DTYPE_FP16, 4, 257, 257, 24, 8, 128, GO_NONE, "gpu_fwd_many_fp16_d128_4x257_h24:8"},
        {FLASHC_DTYPE_BF16, 6, 200, 300, 24, 6, 128, GO_CAUSAL, "gpu_fwd_many_bf16_d128_6x200x300_h24:6_causal"},
        {FLASHC_DTYPE_FP16, 4, 300, 260, 24, 24, 128, GO_WINDOW, "gpu_fwd_many_fp16_d128_4x300x260_h24_window"},
        {FLASHC_DTYPE_FP16, 4, 257, 257, 24, 24, 64, GO_CAUSAL, "gpu_fwd_many_fp16_d64_4x257_h24_causal"},
        {FLASHC_DTYPE_BF16, 6, 200, 300, 24, 6, 64, GO_NONE, "gpu_fwd_many_bf16_d64_6x200x300_h24:6"},
        {FLASHC_DTYPE_BF16, 4, 300, 260, 24, 8, 48, GO_WINDOW, "gpu_fwd_many_bf16_d48_4x300x260_h24:8_window"},
    };
    for (int i = 0; i < 7; i++) {
        gpu_case c;
        memset(&c, 0, sizeof c);
        c.dt = m[i].dt;
        c.b = m[i].b, c.sq = m[i].sq, c.sk = m[i].sk, c.h = m[i].h, c.hk = m[i].hk, c.d = m[i].d;
        c.opt = m[i].opt;
        c.layout = GL_SEPARATE;
        c.pack = -1;
        gpu_add(m[i].name, &c);
    }
}

FC_TEST_REGISTER(gpu_fwd_packed) {
    gpu_case c;
    memset(&c, 0, sizeof c);
    c.dt = FLASHC_DTYPE_BF16;
    c.b = 2, c.sq = c.sk = 257, c.h = c.hk = 2, c.d = 64;
    c.opt = GO_CAUSAL;
    c.layout = GL_QKVPACKED;
    gpu_add("gpu_fwd_qkvpacked_bf16_d64_257_causal", &c);
    c.dt = FLASHC_DTYPE_FP16;
    c.sq = 130, c.sk = 301, c.h = 4, c.hk = 2, c.d = 128;
    c.opt = GO_GQA;
    c.layout = GL_KVPACKED;
    gpu_add("gpu_fwd_kvpacked_fp16_d128_130x301_gqa", &c);
}

FC_TEST_REGISTER(gpu_fwd_pad) {
    static const int64_t dims[6] = {1, 7, 36, 100, 129, 250};
    static const int64_t shapes[3][2] = {{17, 113}, {113, 17}, {130, 301}};
    static const flashc_dtype dts[2] = {FLASHC_DTYPE_BF16, FLASHC_DTYPE_FP16};
    gpu_case c;
    for (int t = 0; t < 2; t++)
        for (int di = 0; di < 6; di++)
            for (int causal = 0; causal < 2; causal++) {
                const int si = (di + t + causal) % 3;
                memset(&c, 0, sizeof c);
                c.dt = dts[t];
                c.d = dims[di];
                c.sq = shapes[si][0];
                c.sk = shapes[si][1];
                c.b = 2, c.h = 3, c.hk = 3;
                c.opt = causal ? GO_CAUSAL : GO_NONE;
                char name[128];
                snprintf(name, sizeof name, "gpu_fwd_pad_%s_d%lld_%lldx%lld_%s",
                         flashc_dtype_name(c.dt), (long long)c.d, (long long)c.sq,
                         (long long)c.sk, causal ? "causal" : "none");
                gpu_add(name, &c);
            }
    memset(&c, 0, sizeof c);
    c.dt = FLASHC_DTYPE_BF16;
    c.b = 2, c.sq = 77, c.sk = 190, c.h = 4, c.hk = 2, c.d = 64;
    c.opt = GO_CAUSAL;
    c.misalign = 1;
    gpu_add("gpu_fwd_pad_misaligned_q_bf16_d64_77x190_causal", &c);
    c.dt = FLASHC_DTYPE_FP16;
    c.d = 100;
    c.opt = GO_NONE;
    c.misalign = 3;
    gpu_add("gpu_fwd_pad_misaligned_qo_fp16_d100_77x190", &c);
}

// ---- varlen and paged ----

#define GV_B 4

/* The lengths of a varlen case's GV_B sequences: query rows, key rows and
 * seqused_k (<= the key rows). */
typedef struct {
    int32_t lq[GV_B], lk[GV_B], used[GV_B];
} gpu_varlen_lens;

typedef struct {
    flashc_dtype dt;
    int64_t d, h, hk;
    int causal;
    int seqused;   /* use seqused_k */
    int page_size; /* 0 = not paged */
} gpu_varlen_case;

/* A varlen case with more options and lengths of its own. */
typedef struct {
    gpu_varlen_case v;
    int window;    /* 0: none; 1 + gpu_window's variant */
    float softcap;
    int nolse;     /* no softmax_lse: only out is returned and checked */
    const gpu_varlen_lens *lens; /* NULL: gv_lens */
    int pack;      /* run with FLASHC_CUDA_GQA_PACK=1 */
} gpu_varlen_xcase;

static gpu_varlen_case gpu_vcases[24];
static int gpu_nvcases;

/* Sequence lengths: b = 1 has no query rows, b = 3 no keys. */
static const gpu_varlen_lens gv_lens = {
    {37, 0, 130, 5}, {45, 9, 190, 0}, {40, 9, 77, 0}};

static void gpu_run_varlen_x(const void *param) {
    const gpu_varlen_xcase *xc = (const gpu_varlen_xcase *)param;
    const gpu_varlen_case *c = &xc->v;
    const flashc_dtype dt = c->dt;
    const int64_t H = c->h, Hk = c->hk, D = c->d;
    const size_t es = flashc_dtype_size(dt);
    gb_arena ar = {0};
    flashc_params p = flashc_params_default();
    p.causal = c->causal;
    p.softmax_scale = (float)(2.0 / sqrt((double)D));
    if (xc->window) gpu_window(&p, xc->window - 1);
    if (xc->softcap > 0.0f) {
        p.softcap = xc->softcap;
        p.softmax_scale = (float)(6.0 / sqrt((double)D));
    }
    const gpu_varlen_lens *lens = xc->lens ? xc->lens : &gv_lens;
    const int32_t *lq = lens->lq, *lk = lens->lk, *used = lens->used;

    int32_t cuq[GV_B + 1] = {0}, cuk[GV_B + 1] = {0};
    int64_t max_q = 0, max_k = 0;
    for (int b = 0; b < GV_B; b++) {
        cuq[b + 1] = cuq[b] + lq[b];
        cuk[b + 1] = cuk[b] + lk[b];
        if (lq[b] > max_q) max_q = lq[b];
        if (lk[b] > max_k) max_k = lk[b];
    }
    const int64_t tq = cuq[GV_B], tk = cuk[GV_B];
    // paged: pages of page_size rows, shuffled, max_blocks per sequence
    const int64_t ps = c->page_size;
    const int64_t max_blocks = ps ? (max_k + ps - 1) / ps : 0;
    const int64_t nblocks = ps ? GV_B * max_blocks + 3 : 0;
    const int64_t krows = ps ? nblocks * ps : tk;

    gb_buf *qb = gb_new(&ar, (size_t)(tq * H * D) * es);
    gb_buf *kb = gb_new(&ar, (size_t)(krows * Hk * D) * es);
    gb_buf *vb = gb_new(&ar, (size_t)(krows * Hk * D) * es);
    gb_buf *ob = gb_new(&ar, (size_t)(tq * H * D) * es);
    gb_buf *lb = gb_new(&ar, (size_t)(H * tq) * sizeof(float));
    gb_buf *cqb = gb_new(&ar, sizeof cuq), *ckb = gb_new(&ar, sizeof cuk);
    gb_buf *ub = gb_new(&ar, GV_B * sizeof(int32_t));
    gb_buf *btb = ps ? gb_new(&ar, (size_t)(GV_B * max_blocks) * sizeof(int32_t)) : NULL;
    if (!qb || !kb || !vb || !ob || !lb || !cqb || !ckb || !ub || (ps && !btb)) goto done;
    gb_fill(qb, dt, -1.0, 1.0);
    gb_fill(kb, dt, -1.0, 1.0);
    gb_fill(vb, dt, -1.0, 1.0);
    memcpy(cqb->h, cuq, sizeof cuq);
    memcpy(ckb->h, cuk, sizeof cuk);
    memcpy(ub->h, used, GV_B * sizeof(int32_t));
    if (btb) {
        /* a random permutation of the pages, so neighbours are far apart */
        int32_t *perm = (int32_t *)malloc((size_t)nblocks * sizeof(int32_t));
        th_shuffle(perm, nblocks);
        memcpy(btb->h, perm, (size_t)(GV_B * max_blocks) * sizeof(int32_t));
        free(perm);
    }
    if (!gb_upload(qb) || !gb_upload(kb) || !gb_upload(vb) || !gb_upload(cqb) ||
        !gb_upload(ckb) || !gb_upload(ub) || (btb && !gb_upload(btb)) || !gb_poison(ob) ||
        !gb_poison(lb))
        goto done;

    flashc_varlen_fwd_args da, ha;
    memset(&da, 0, sizeof da);
    da.abi = FLASHC_ABI_VERSION;
    memset(&ha, 0, sizeof ha);
    ha.abi = FLASHC_ABI_VERSION;
    int64_t qshape[3] = {tq, H, D}, qstride[3];
    int64_t kshape3[3] = {tk, Hk, D}, kstride3[3];
    int64_t kshape4[4] = {nblocks, ps, Hk, D}, kstride4[4];
    int64_t lshape[2] = {H, tq}, lstride[2];
    int64_t cshape[1] = {GV_B + 1}, ushape[1] = {GV_B}, one[1] = {1};
    int64_t btshape[2] = {GV_B, max_blocks}, btstride[2] = {max_blocks, 1};
    gb_contig_strides(3, qshape, qstride);
    gb_contig_strides(3, kshape3, kstride3);
    gb_contig_strides(4, kshape4, kstride4);
    gb_contig_strides(2, lshape, lstride);
    for (int dev = 0; dev < 2; dev++) {
        flashc_varlen_fwd_args *x = dev ? &da : &ha;
        x->q = gb_view(qb, dev, dt, 0, 3, qshape, qstride);
        x->out = gb_view(ob, dev, dt, 0, 3, qshape, qstride);
        if (ps) {
            x->k = gb_view(kb, dev, dt, 0, 4, kshape4, kstride4);
            x->v = gb_view(vb, dev, dt, 0, 4, kshape4, kstride4);
            x->block_table = gb_view(btb, dev, FLASHC_DTYPE_INT32, 0, 2, btshape, btstride);
        } else {
            x->k = gb_view(kb, dev, dt, 0, 3, kshape3, kstride3);
            x->v = gb_view(vb, dev, dt, 0, 3, kshape3, kstride3);
        }
        x->cu_seqlens_q = gb_view(cqb, dev, FLASHC_DTYPE_INT32, 0, 1, cshape, one);
        x->cu_seqlens_k = gb_view(ckb, dev, FLASHC_DTYPE_INT32, 0, 1, cshape, one);
        if (c->seqused) x->seqused_k = gb_view(ub, dev, FLASHC_DTYPE_INT32, 0, 1, ushape, one);
        x->max_seqlen_q = max_q;
        x->max_seqlen_k = max_k;
        if (!xc->nolse) x->softmax_lse = gb_view(lb, dev, FLASHC_DTYPE_FP32, 0, 2, lshape, lstride);
    }

    size_t ws_bytes = 0;
    GB_OK(flashc_varlen_fwd_workspace_size(&da, &p, &ws_bytes));
    void *ws = gb_ws(&ar, ws_bytes);
    if (ws_bytes && !ws) goto done;
    GB_OK(flashc_varlen_fwd(&da, &p, ws, ws_bytes));
    if (!gb_sync() || !gb_download(ob) || !gb_download(lb)) goto done;
    {
        const int64_t no = tq * H * D, nl = H * tq;
        double *r_out = gb_dbl(&ar, no), *r_lse = gb_dbl(&ar, nl);
        double *l_out = gb_dbl(&ar, no), *l_lse = gb_dbl(&ar, nl);
        double *g_out = gb_dbl(&ar, no), *g_lse = gb_dbl(&ar, nl);
        GB_OK(fc_ref_varlen_fwd(&ha, &p, FC_REF_F64, r_out, r_lse, NULL));
        GB_OK(fc_ref_varlen_fwd(&ha, &p, FC_REF_LOWP, l_out, l_lse, NULL));
        fc_tensor_to_double(&ha.out, g_out);
        fc_check_close("out", dt, g_out, r_out, l_out, no);
        if (!xc->nolse) {
            fc_tensor_to_double(&ha.softmax_lse, g_lse);
            fc_check_close("lse", dt, g_lse, r_lse, l_lse, nl);
        }
    }
done:
    gb_free(&ar);
}

static void gpu_run_varlen_x_case(const void *param) {
    const gpu_varlen_xcase *x = (const gpu_varlen_xcase *)param;
    gb_with_env("FLASHC_CUDA_GQA_PACK", x->pack ? "1" : NULL, gpu_run_varlen_x, param);
}

static void gpu_run_varlen(const void *param) {
    gpu_varlen_xcase x;
    memset(&x, 0, sizeof x);
    x.v = *(const gpu_varlen_case *)param;
    gpu_run_varlen_x(&x);
}

static void gpu_add_varlen(const char *name, gpu_varlen_case c) {
    gpu_vcases[gpu_nvcases] = c;
    fc_test_add(name, gpu_run_varlen, &gpu_vcases[gpu_nvcases]);
    gpu_nvcases++;
}

FC_TEST_REGISTER(gpu_fwd_varlen) {
    const flashc_dtype bf = FLASHC_DTYPE_BF16, fp = FLASHC_DTYPE_FP16;
    /* dt, D, H, Hk, causal, seqused, page_size */
    gpu_add_varlen("gpu_varlen_bf16_d128", (gpu_varlen_case){bf, 128, 4, 2, 0, 0, 0});
    gpu_add_varlen("gpu_varlen_fp16_d64_causal", (gpu_varlen_case){fp, 64, 2, 2, 1, 0, 0});
    gpu_add_varlen("gpu_varlen_bf16_d96_causal_seqused", (gpu_varlen_case){bf, 96, 3, 1, 1, 1, 0});
    gpu_add_varlen("gpu_varlen_fp16_d256_seqused", (gpu_varlen_case){fp, 256, 2, 1, 0, 1, 0});
    gpu_add_varlen("gpu_paged_bf16_d128_page16", (gpu_varlen_case){bf, 128, 4, 2, 0, 0, 16});
    gpu_add_varlen("gpu_paged_fp16_d64_page3_causal", (gpu_varlen_case){fp, 64, 2, 1, 1, 0, 3});
    gpu_add_varlen("gpu_paged_bf16_d32_page1_seqused", (gpu_varlen_case){bf, 32, 2, 2, 0, 1, 1});
    /* chunked prefill: cached prefixes of 8 to 60 keys before the query chunk */
    gpu_add_varlen("gpu_paged_fp16_d64_page48_causal", (gpu_varlen_case){fp, 64, 4, 1, 1, 0, 48});
    gpu_add_varlen("gpu_paged_bf16_d128_page64_causal", (gpu_varlen_case){bf, 128, 8, 2, 1, 0, 64});
    gpu_add_varlen("gpu_paged_bf16_d128_page256_seqused", (gpu_varlen_case){bf, 128, 4, 4, 0, 1, 256});
    /* sm90ws: a page of whole key tiles, or of a multiple of 8 rows dividing one */
    gpu_add_varlen("gpu_paged_bf16_d256_page32_causal", (gpu_varlen_case){bf, 256, 4, 2, 1, 0, 32});
    gpu_add_varlen("gpu_paged_fp16_d192_page48_seqused", (gpu_varlen_case){fp, 192, 2, 1, 0, 1, 48});
    gpu_add_varlen("gpu_paged_bf16_d64_page8_causal_seqused", (gpu_varlen_case){bf, 64, 4, 1, 1, 1, 8});
    gpu_add_varlen("gpu_paged_fp16_d256_page128", (gpu_varlen_case){fp, 256, 2, 2, 0, 0, 128});
    /* D not a multiple of 8: repacked through the workspace */
    gpu_add_varlen("gpu_varlen_pad_fp16_d36_causal", (gpu_varlen_case){fp, 36, 3, 1, 1, 0, 0});
    gpu_add_varlen("gpu_paged_pad_bf16_d100_page3_seqused", (gpu_varlen_case){bf, 100, 2, 1, 0, 1, 3});
}

// ---- GQA packing (sm90ws) ----

/* On sm90ws, fwd.cu packs the G = H / Hk query heads of one KV head into the
 * rows of one query tile when Sq is short: packed row R of (b, hk) is query
 * position R / G of head hk * G + R % G. With FLASHC_CUDA_GQA_PACK=1 (every case
 * here) it packs wherever the kernel can: the persistent instances (head dims
 * 65..128, Br 128, and D64's short-work row, Br 128, which a call that packs
 * runs), Br % G == 0 with G a power of two, no ALiBi and no dropout. These
 * cases check the results like every other: on sm90ws the D64- and
 * D128-instance ones pack, the others (D192, D256, G = 3 or 6, "nopack") run
 * the unpacked GQA path, and on the other families all are plain GQA cases. */

static const int64_t gp_groups[4] = {2, 4, 8, 16};
static gpu_varlen_xcase gpu_xvcases[24];
static int gpu_nxvcases;

/* Query, key and seqused_k lengths of the varlen cases: each set has sequences
 * with Sk < Sq, = Sq and > Sq, and 0 to 3 has an empty query sequence (3 an
 * empty key one too); max_seqlen_q 1, 16, 33 and 100. */
static const gpu_varlen_lens gp_vlens[4] = {
    {{1, 0, 1, 1}, {300, 37, 1, 1000}, {250, 37, 1, 999}},
    {{5, 0, 16, 2}, {37, 9, 1000, 1}, {30, 9, 600, 1}},
    {{33, 16, 0, 20}, {33, 300, 5, 7}, {33, 100, 5, 3}},
    {{100, 1, 60, 0}, {1000, 0, 60, 45}, {700, 0, 59, 45}},
};

/* B and Hk of a batched case with G = g: 2 and hk, fewer when the float64
 * reference would take long (B H Sq Sk D over 2e8). */
static void gpu_pack_size(gpu_case *c, int64_t g, int64_t hk) {
    c->b = 2, c->hk = hk;
    if (c->b * c->hk * g * c->sq * c->sk * c->d > 200000000) c->b = 1;
    if (c->b * c->hk * g * c->sq * c->sk * c->d > 200000000) c->hk = 1;
    c->h = g * c->hk;
}

/* One batched case of the table below. */
typedef struct {
    flashc_dtype dt;
    int64_t b, sq, sk, h, hk, d;
    gpu_opt opt;
    int variant, misalign;
    gpu_layout layout;
    const char *name;
} gpu_pack_row;

#define BF FLASHC_DTYPE_BF16
#define HF FLASHC_DTYPE_FP16
static const gpu_pack_row gpu_pack_rows[] = {
    // groups that are no power of two (unpacked)
    {BF, 2, 16, 300, 12, 2, 64, GO_CAUSAL, 0, 0, GL_SEPARATE,
     "gpu_fwd_gqapack_bf16_d64_16x300_h12:2_causal"}, /* G 6: 32 positions a tile */
    {HF, 2, 33, 33, 9, 3, 64, GO_NONE, 0, 0, GL_SEPARATE, "gpu_fwd_gqapack_fp16_d64_33x33_h9:3"},
    {BF, 2, 70, 500, 6, 2, 64, GO_WINDOW, 0, 0, GL_SEPARATE,
     "gpu_fwd_gqapack_bf16_d64_70x500_h6:2_window0"}, /* G 3: 210 rows, two tiles */
    // the group fills its tiles exactly, or by one position more
    {BF, 2, 17, 17, 16, 2, 128, GO_CAUSAL, 0, 0, GL_SEPARATE,
     "gpu_fwd_gqapack_bf16_d128_17x17_h16:2_causal"}, /* 136 rows: 128 + 8 */
    {HF, 2, 16, 129, 16, 2, 128, GO_WINDOW, 1, 0, GL_SEPARATE,
     "gpu_fwd_gqapack_fp16_d128_16x129_h16:2_window1"}, /* 128 rows */
    {BF, 1, 12, 1000, 32, 2, 64, GO_NONE, 0, 0, GL_SEPARATE,
     "gpu_fwd_gqapack_bf16_d64_12x1000_h32:2"}, /* 192 rows */
    {HF, 2, 13, 200, 32, 2, 64, GO_CAUSAL, 0, 0, GL_SEPARATE,
     "gpu_fwd_gqapack_fp16_d64_13x200_h32:2_causal"}, /* 208 rows: 192 + 16 */
    {HF, 2, 200, 200, 8, 2, 128, GO_CAUSAL, 0, 0, GL_SEPARATE,
     "gpu_fwd_gqapack_fp16_d128_200x200_h8:2_causal"}, /* G 4: 800 rows, 7 tiles */
    // other instances and operands
    {BF, 2, 2, 1000, 32, 2, 192, GO_SOFTCAP, 0, 0, GL_SEPARATE,
     "gpu_fwd_gqapack_bf16_d192_2x1000_h32:2_softcap"},
    {HF, 2, 16, 300, 16, 2, 100, GO_CAUSAL, 0, 0, GL_SEPARATE,
     "gpu_fwd_gqapack_fp16_d100_16x300_h16:2_causal"}, /* repacked through the workspace */
    {BF, 2, 5, 37, 8, 2, 100, GO_WINDOW, 0, 3, GL_SEPARATE,
     "gpu_fwd_gqapack_misaligned_qo_bf16_d100_5x37_h8:2_window0"},
    {HF, 2, 7, 90, 16, 1, 256, GO_NONE, 0, 1, GL_SEPARATE,
     "gpu_fwd_gqapack_misaligned_q_fp16_d256_7x90_h16:1"},
    {BF, 2, 16, 300, 16, 2, 128, GO_CAUSAL, 0, 0, GL_KVPACKED,
     "gpu_fwd_gqapack_kvpacked_bf16_d128_16x300_h16:2_causal"},
    {HF, 2, 33, 1000, 8, 2, 64, GO_WINDOW, 2, 0, GL_KVPACKED,
     "gpu_fwd_gqapack_kvpacked_fp16_d64_33x1000_h8:2_window2"},
    // more packed tiles than SMs at D128 (the persistent kernel: CTAs walk several)
    {BF, 8, 16, 1000, 64, 8, 128, GO_NONE, 0, 0, GL_SEPARATE,
     "gpu_fwd_gqapack_many_bf16_d128_8x16x1000_h64:8"}, /* 64 tiles, 512 unpacked */
    {HF, 16, 33, 200, 32, 8, 128, GO_WINDOW, 0, 0, GL_SEPARATE,
     "gpu_fwd_gqapack_many_fp16_d128_16x33x200_h32:8_window0"}, /* 256 tiles */
    {BF, 8, 33, 100, 128, 16, 128, GO_CAUSAL, 0, 0, GL_SEPARATE,
     "gpu_fwd_gqapack_many_bf16_d128_8x33x100_h128:16_causal"}, /* 384 tiles, 256 items */
    {HF, 8, 16, 100, 256, 16, 128, GO_SOFTCAP, 0, 0, GL_SEPARATE,
     "gpu_fwd_gqapack_many_fp16_d128_8x16x100_h256:16_softcap"}, /* 256 tiles */
    {HF, 8, 33, 100, 128, 16, 128, GO_WINDOW, 1, 0, GL_SEPARATE,
     "gpu_fwd_gqapack_many_fp16_d128_8x33x100_h128:16_window1"}, /* causal-local: 256 pairs */
    // MQA-sized groups: one position holds 32 to 128 rows, a Q box 4 to 1 rows deep
    {BF, 2, 17, 300, 32, 1, 128, GO_CAUSAL, 0, 0, GL_SEPARATE,
     "gpu_fwd_gqapack_mqa_bf16_d128_17x300_h32:1_causal"},
    {HF, 2, 5, 200, 64, 1, 128, GO_WINDOW, 0, 0, GL_SEPARATE,
     "gpu_fwd_gqapack_mqa_fp16_d128_5x200_h64:1_window0"},
    {BF, 1, 3, 150, 128, 1, 96, GO_SOFTCAP, 0, 0, GL_SEPARATE,
     "gpu_fwd_gqapack_mqa_bf16_d96_3x150_h128:1_softcap"},
    {HF, 3, 2, 2, 128, 2, 128, GO_CAUSAL, 0, 0, GL_SEPARATE,
     "gpu_fwd_gqapack_mqa_fp16_d128_2x2_h128:2_causal"}, /* G 64 */
    // GQA with a short Sq that must not pack
    {BF, 2, 16, 300, 32, 4, 128, GO_ALIBI, 0, 0, GL_SEPARATE,
     "gpu_fwd_gqa_nopack_bf16_d128_16x300_h32:4_alibi0"},
    {HF, 2, 5, 1000, 16, 4, 64, GO_ALIBI, 1, 0, GL_SEPARATE,
     "gpu_fwd_gqa_nopack_fp16_d64_5x1000_h16:4_alibi1"},
    {HF, 2, 5, 300, 8, 2, 128, GO_DROPOUT, 0, 0, GL_SEPARATE,
     "gpu_fwd_gqa_nopack_fp16_d128_5x300_h8:2_dropout"},
    {BF, 2, 16, 37, 16, 2, 64, GO_DROPOUT, 0, 0, GL_SEPARATE,
     "gpu_fwd_gqa_nopack_bf16_d64_16x37_h16:2_dropout"},
    {BF, 2, 16, 300, 6, 2, 128, GO_CAUSAL, 0, 0, GL_SEPARATE,
     "gpu_fwd_gqa_nopack_bf16_d128_16x300_h6:2_causal"}, /* G 3: 128 % 3 */
    {HF, 2, 5, 37, 12, 2, 128, GO_WINDOW, 0, 0, GL_SEPARATE,
     "gpu_fwd_gqa_nopack_fp16_d128_5x37_h12:2_window0"}, /* G 6: 128 % 6 */
    {BF, 1, 128, 128, 16, 1, 128, GO_CAUSAL, 0, 0, GL_SEPARATE,
     "gpu_fwd_gqa_nopack_bf16_d128_128x128_h16:1_causal"}, /* full tiles already */
};
#undef BF
#undef HF

FC_TEST_REGISTER(gpu_fwd_gqa_pack) {
    static const flashc_dtype dts[2] = {FLASHC_DTYPE_BF16, FLASHC_DTYPE_FP16};
    // ---- the batched sweep: Sq x option, with G, D, dtype, Sk and lse picked
    // so that every pair of (G, Sq, option, D, dtype, Sk vs Sq, lse) values
    // meets in some case ----
    static const int64_t sqs[6] = {1, 2, 5, 16, 33, 100};
    static const int64_t shorter[6] = {1, 1, 3, 7, 17, 37};
    static const int64_t longer[3] = {37, 300, 1000};
    static const int64_t dims[4] = {64, 80, 128, 256}; /* 80: zero-padded to 128 */
    static const struct {
        gpu_opt opt;
        int variant;
    } opts[6] = {{GO_NONE, 0},   {GO_CAUSAL, 0}, {GO_WINDOW, 0},
                 {GO_WINDOW, 2}, {GO_WINDOW, 1}, {GO_SOFTCAP, 0}};
    static const char *const wvariant[3] = {"0", "1", "2"};
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 6; j++) {
            const int64_t g = gp_groups[(i + j) % 4];
            int rel = (i / 2 + j / 2 + 2) % 3; /* 0: Sk < Sq, 1: Sk = Sq, 2: Sk > Sq */
            if (i == 0 && rel == 0) rel = 1;   /* Sq = 1 has no shorter Sk */
            gpu_case c;
            memset(&c, 0, sizeof c);
            c.dt = dts[(j / 2 + i / 3) % 2];
            c.d = dims[(i + 2 * j + j / 2) % 4];
            c.sq = sqs[i];
            c.sk = rel == 0 ? (j % 2 ? 1 : shorter[i]) : rel == 1 ? c.sq : longer[(i + j) % 3];
            if (rel == 2 && c.sk <= c.sq) c.sk = 300;
            c.opt = opts[j].opt;
            c.variant = opts[j].variant;
            c.nolse = (j + i / 3) % 2;
            c.layout = GL_SEPARATE;
            c.pack = 1;
            gpu_pack_size(&c, g, 2 + (i + j) % 2);
            char name[128];
            snprintf(name, sizeof name, "gpu_fwd_gqapack_%s_d%lld_%lldx%lld_h%lld:%lld_%s%s%s",
                     flashc_dtype_name(c.dt), (long long)c.d, (long long)c.sq, (long long)c.sk,
                     (long long)c.h, (long long)c.hk, go_names[c.opt],
                     c.opt == GO_WINDOW ? wvariant[c.variant] : "",
                     c.nolse ? "_nolse" : "");
            gpu_add(name, &c);
        }

    // ---- odd groups, tile edges, other instances and layouts, many tiles, no pack ----
    for (size_t r = 0; r < sizeof gpu_pack_rows / sizeof gpu_pack_rows[0]; r++) {
        const gpu_pack_row *m = &gpu_pack_rows[r];
        gpu_case c;
        memset(&c, 0, sizeof c);
        c.dt = m->dt;
        c.b = m->b, c.sq = m->sq, c.sk = m->sk, c.h = m->h, c.hk = m->hk, c.d = m->d;
        c.opt = m->opt;
        c.variant = m->variant;
        c.misalign = m->misalign;
        c.layout = m->layout;
        c.pack = 1;
        gpu_add(m->name, &c);
    }

    // ---- varlen and paged varlen: G x option, with D, dtype, lengths, paging
    // and seqused_k picked so that every pair of values meets ----
    static const int64_t vdims[4] = {64, 100, 128, 256}; /* 100: repacked */
    static const int pages[3] = {0, 16, 256};
    static const char *const vopts[6] = {"none", "causal", "window0", "window2", "softcap", "nolse"};
    for (int o = 0; o < 6; o++)
        for (int a = 0; a < 4; a++) {
            if (gpu_nxvcases == (int)(sizeof gpu_xvcases / sizeof gpu_xvcases[0])) {
                fprintf(stderr, "test_gpu_fwd: too many varlen pack cases\n");
                abort();
            }
            gpu_varlen_xcase *x = &gpu_xvcases[gpu_nxvcases++];
            gpu_varlen_case *v = &x->v;
            memset(x, 0, sizeof *x);
            const int li = (a + 2 * o + 3 * (o / 3)) % 4;
            v->dt = dts[(a + o / 2) % 2];
            v->d = vdims[(a + o) % 4];
            v->page_size = pages[(a + 2 * o + 2 * (o / 3)) % 3];
            v->seqused = (a + o / 2 + o / 3) % 2;
            v->causal = o == 1;
            x->lens = &gp_vlens[li];
            x->window = o == 2 ? 1 : o == 3 ? 3 : 0; /* gpu_window's variants 0 and 2 */
            x->softcap = o == 4 ? 5.0f : 0.0f;
            x->nolse = o == 5;
            x->pack = 1;
            int64_t work = 0; /* sum of Sq Sk over the sequences */
            for (int b = 0; b < GV_B; b++) work += (int64_t)gp_vlens[li].lq[b] * gp_vlens[li].lk[b];
            v->hk = gp_groups[a] * 2 * work * v->d > 200000000 ? 1 : 2;
            v->h = gp_groups[a] * v->hk;
            char name[128];
            int n = snprintf(name, sizeof name, "gpu_%s_gqapack_%s_d%lld_h%lld:%lld_lens%d_%s",
                             v->page_size ? "paged" : "varlen", flashc_dtype_name(v->dt),
                             (long long)v->d, (long long)v->h, (long long)v->hk, li, vopts[o]);
            if (v->page_size)
                n += snprintf(name + n, sizeof name - (size_t)n, "_page%d", v->page_size);
            if (v->seqused) snprintf(name + n, sizeof name - (size_t)n, "_seqused");
            fc_test_add(name, gpu_run_varlen_x_case, x);
        }
}

// ---- the dropout mask, bit for bit ----

typedef struct {
    flashc_dtype dt;
    int64_t d, sq; /* Sk = D */
} gpu_mask_case;

static gpu_mask_case gpu_mcases[4];

static void gpu_run_mask(const void *param) {
    const gpu_mask_case *c = (const gpu_mask_case *)param;
    const flashc_dtype dt = c->dt;
    const int64_t B = 2, H = 3, Sq = c->sq, Sk = c->d, D = c->d;
    const size_t es = flashc_dtype_size(dt);
    gb_arena ar = {0};
    flashc_params p = flashc_params_default();
    p.dropout_p = 0.3f;
    p.dropout_seed = 0x9e3779b97f4a7c15ull ^ (fc_rand_u64() & 0xffff);
    p.dropout_offset = 0xfffffffdull; /* j / 8 >= 3 carries into the counter's high word */

    int64_t qshape[4] = {B, Sq, H, D}, kshape[4] = {B, Sk, H, D}, qs[4], ks[4];
    int64_t lshape[3] = {B, H, Sq}, ls[3], pshape[4] = {B, H, Sq, Sk}, pstr[4];
    gb_contig_strides(4, qshape, qs);
    gb_contig_strides(4, kshape, ks);
    gb_contig_strides(3, lshape, ls);
    gb_contig_strides(4, pshape, pstr);
    gb_buf *qb = gb_new(&ar, (size_t)(B * Sq * H * D) * es);
    gb_buf *kb = gb_new(&ar, (size_t)(B * Sk * H * D) * es);
    gb_buf *vb = gb_new(&ar, (size_t)(B * Sk * H * D) * es);
    gb_buf *ob = gb_new(&ar, (size_t)(B * Sq * H * D) * es);
    gb_buf *lb = gb_new(&ar, (size_t)(B * H * Sq) * sizeof(float));
    if (!qb || !kb || !vb || !ob || !lb) goto done;
    gb_fill(qb, dt, -1.0, 1.0);
    gb_fill(kb, dt, -1.0, 1.0);
    /* V[b, j, h, :] = e_j: out[b, i, h, j] = P'[i, j], which is 0 iff dropped */
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < Sk; j++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t d = 0; d < D; d++)
                    fc_store(dt, vb->h, ((b * Sk + j) * H + h) * D + d, d == j ? 1.0f : 0.0f);
    if (!gb_upload(qb) || !gb_upload(kb) || !gb_upload(vb) || !gb_poison(ob) || !gb_poison(lb))
        goto done;

    flashc_fwd_args da, ha;
    for (int dev = 0; dev < 2; dev++) {
        flashc_fwd_args *x = dev ? &da : &ha;
        memset(x, 0, sizeof *x);
        x->abi = FLASHC_ABI_VERSION;
        x->q = gb_view(qb, dev, dt, 0, 4, qshape, qs);
        x->k = gb_view(kb, dev, dt, 0, 4, kshape, ks);
        x->v = gb_view(vb, dev, dt, 0, 4, kshape, ks);
        x->out = gb_view(ob, dev, dt, 0, 4, qshape, qs);
        x->softmax_lse = gb_view(lb, dev, FLASHC_DTYPE_FP32, 0, 3, lshape, ls);
    }
    GB_OK(flashc_fwd(&da, &p, NULL, 0));
    if (!gb_sync() || !gb_download(ob)) goto done;

    {
        const int64_t np = B * H * Sq * Sk;
        double *ref_probs = gb_dbl(&ar, np), *cpu_probs = gb_dbl(&ar, np);
        GB_OK(fc_ref_fwd(&ha, &p, FC_REF_F64, NULL, NULL, ref_probs));
        /* the CPU backend on host tensors: its attn_probs carries the mask as signs */
        gb_buf *cpu_out = gb_new(&ar, (size_t)(B * Sq * H * D) * es);
        gb_buf *cpu_pr = gb_new(&ar, (size_t)np * sizeof(float));
        if (!cpu_out || !cpu_pr) goto done;
        flashc_fwd_args ca = ha;
        ca.out = gb_view(cpu_out, 0, dt, 0, 4, qshape, qs);
        ca.softmax_lse.data = NULL;
        ca.attn_probs = gb_view(cpu_pr, 0, FLASHC_DTYPE_FP32, 0, 4, pshape, pstr);
        GB_OK(flashc_fwd(&ca, &p, NULL, 0));
        fc_tensor_to_double(&ca.attn_probs, cpu_probs);

        int64_t bad_ref = 0, bad_cpu = 0, dropped = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < Sq; i++)
                    for (int64_t j = 0; j < Sk; j++) {
                        const double o = fc_get(ob->h, dt, ((b * Sq + i) * H + h) * D + j);
                        const int gpu_drop = o == 0.0;
                        const int64_t pi = ((b * H + h) * Sq + i) * Sk + j;
                        const int ref_drop = signbit(ref_probs[pi]) != 0;
                        const int cpu_drop = signbit(cpu_probs[pi]) != 0;
                        dropped += gpu_drop;
                        if (gpu_drop != ref_drop && bad_ref++ < 4)
                            printf("    mask (b=%lld h=%lld i=%lld j=%lld): gpu %d ref %d (out %g)\n",
                                   (long long)b, (long long)h, (long long)i, (long long)j,
                                   gpu_drop, ref_drop, o);
                        if (gpu_drop != cpu_drop) bad_cpu++;
                    }
        FC_EXPECT_EQ(bad_ref, 0);
        FC_EXPECT_EQ(bad_cpu, 0);
        /* the drop rate is near p (a sanity check that the mask is not empty) */
        const double rate = (double)dropped / (double)np;
        FC_EXPECT_NEAR(rate, p.dropout_p, 0.03);
    }
done:
    gb_free(&ar);
}

FC_TEST_REGISTER(gpu_fwd_dropout_mask) {
    gpu_mcases[0] = (gpu_mask_case){FLASHC_DTYPE_BF16, 128, 300};
    gpu_mcases[1] = (gpu_mask_case){FLASHC_DTYPE_FP16, 64, 257};
    fc_test_add("gpu_dropout_mask_bf16_d128_300x128", gpu_run_mask, &gpu_mcases[0]);
    fc_test_add("gpu_dropout_mask_fp16_d64_257x64", gpu_run_mask, &gpu_mcases[1]);
}

// ---- which family ran ----

/* The launch line (FLASHC_LOG=1) of a forward names its kernel. On compute
 * capability 9.0: sm90ws by default (paged K/V too, when a page holds whole
 * TMA boxes), sm90 with FLASHC_CUDA_FAMILY=sm90 and for pages of 3 rows, sm80
 * with =sm80 and for D <= 32; elsewhere sm80 always. Each call's results are
 * checked as in its sweep. */
typedef struct {
    const char *family; /* FLASHC_CUDA_FAMILY */
    int64_t d;
    int page;           /* the paged varlen case of this page size, or 0: a batched GQA causal one */
    const char *kernel; /* the kernel on compute capability 9.0 */
} gpu_dispatch_case;

static void gpu_dispatch_call(void *ctx) {
    const gpu_dispatch_case *c = (const gpu_dispatch_case *)ctx;
    if (c->page) {
        const gpu_varlen_case v = {FLASHC_DTYPE_BF16, c->d, 4, 2, 0, 0, c->page};
        gpu_run_varlen(&v);
    } else {
        gpu_case b;
        memset(&b, 0, sizeof b);
        b.dt = FLASHC_DTYPE_FP16;
        b.b = 2, b.sq = 200, b.sk = 300, b.h = 4, b.hk = 2, b.d = c->d;
        b.opt = GO_CAUSAL;
        gpu_run_batched(&b);
    }
}

/* A failure unless `want` is the one forward kernel named in the log. */
static void gpu_check_kernel(const char *log, const char *family, const char *want) {
    static const char *const kernels[3] = {"sm80_fwd_kernel<", "sm90_fwd_kernel<",
                                           "sm90ws_fwd_kernel<"};
    for (int k = 0; k < 3; k++)
        if ((strstr(log, kernels[k]) != NULL) != (strcmp(kernels[k], want) == 0))
            fc_test_fail(__FILE__, __LINE__, "FLASHC_CUDA_FAMILY=%s: %s \"%s\" in the log:\n%s",
                         family, strcmp(kernels[k], want) == 0 ? "no" : "unexpected",
                         kernels[k], log);
}

static void gpu_run_dispatch(const void *param) {
    const gpu_dispatch_case *c = (const gpu_dispatch_case *)param;
    gb_family fam;
    gb_family_enter(&fam, c->family);
    char *log = th_capture_log("1", gpu_dispatch_call, (void *)c);
    gb_family_leave(&fam);
    FC_ASSERT_TRUE(log != NULL);
    gpu_check_kernel(log, c->family, gb_device_is_sm90() ? c->kernel : "sm80_fwd_kernel<");
    free(log);
}

static gpu_dispatch_case gpu_dcases[] = {
    {"auto", 128, 0, "sm90ws_fwd_kernel<"}, {"auto", 72, 0, "sm90ws_fwd_kernel<"},
    {"auto", 32, 0, "sm80_fwd_kernel<"},    {"sm90", 128, 0, "sm90_fwd_kernel<"},
    {"sm80", 128, 0, "sm80_fwd_kernel<"},   {"auto", 128, 16, "sm90ws_fwd_kernel<"},
    {"auto", 128, 3, "sm90_fwd_kernel<"},
};

FC_TEST_REGISTER(gpu_fwd_dispatch) {
    for (size_t i = 0; i < sizeof gpu_dcases / sizeof gpu_dcases[0]; i++) {
        const gpu_dispatch_case *c = &gpu_dcases[i];
        char name[64];
        snprintf(name, sizeof name, "gpu_fwd_dispatch_%s_d%lld", c->family, (long long)c->d);
        if (c->page) snprintf(name + strlen(name), sizeof name - strlen(name), "_page%d", c->page);
        fc_test_add(name, gpu_run_dispatch, c);
    }
}

// ---- the GQA pack in the launch log ----

/* The sm90ws launch line says pack=G when the G query heads of a KV head share
 * its query tiles, pack=1 when not: with FLASHC_CUDA_GQA_PACK unset, by
 * fwd.cu's rule (packed tiles fill better and take fewer waves over the SMs),
 * =1 wherever the kernel can (the persistent instances, D128's and D64's
 * short-work row, no ALiBi or dropout), =0 never. It says short=1 when D64's
 * short-work row runs: with FLASHC_CUDA_SHORT_ROW unset when a query row sees
 * at most 1280 keys on average or the row packs the call, =1 always and =0
 * never (D128 has no such row: short=0 whatever the variable says).
 * FLASHC_CUDA_FAMILY=sm90 and =sm80 run their own kernels (no packing), and
 * so does any device but compute capability 9.0 (sm80 there). The results are
 * checked as in the sweeps. */
typedef struct {
    const char *family;  /* FLASHC_CUDA_FAMILY */
    const char *kernel;  /* the kernel on compute capability 9.0 */
    int want;            /* sm90ws's pack */
    const char *packenv; /* FLASHC_CUDA_GQA_PACK, NULL: unset */
    int want_pairs;      /* sm90ws's pairs= (causal items as pairs of tiles); -1: unchecked */
    int varlen;          /* run v, else b */
    gpu_case b;
    gpu_varlen_xcase v;
    const char *name;
    int want_short;       /* sm90ws's short= */
    const char *shortenv; /* FLASHC_CUDA_SHORT_ROW, NULL: unset */
} gpu_pack_dispatch_case;

static void gpu_pack_dispatch_call(void *ctx) {
    const gpu_pack_dispatch_case *c = (const gpu_pack_dispatch_case *)ctx;
    if (c->varlen) gpu_run_varlen_x(&c->v);
    else gpu_run_batched(&c->b);
}

static void gpu_run_pack_dispatch(const void *param) {
    const gpu_pack_dispatch_case *c = (const gpu_pack_dispatch_case *)param;
    gb_family fam;
    gb_env env, short_env;
    gb_family_enter(&fam, c->family);
    gb_env_enter(&env, "FLASHC_CUDA_GQA_PACK", c->packenv);
    gb_env_enter(&short_env, "FLASHC_CUDA_SHORT_ROW", c->shortenv);
    char *log = th_capture_log("1", gpu_pack_dispatch_call, (void *)c);
    gb_env_leave(&short_env);
    gb_env_leave(&env);
    gb_family_leave(&fam);
    FC_ASSERT_TRUE(log != NULL);
    const int sm90 = gb_device_is_sm90();
    gpu_check_kernel(log, c->family, sm90 ? c->kernel : "sm80_fwd_kernel<");
    const char *at = strstr(log, "sm90ws_fwd_kernel<");
    if (sm90 && at && strcmp(c->kernel, "sm90ws_fwd_kernel<") == 0) {
        char line[512];
        snprintf(line, sizeof line, "%.*s", (int)strcspn(at, "\n"), at);
        const char *pack_at = strstr(line, " pack=");
        if (!pack_at)
            fc_test_fail(__FILE__, __LINE__, "no \" pack=\" in the launch line:\n%s", line);
        else if (atoi(pack_at + 6) != c->want)
            fc_test_fail(__FILE__, __LINE__, "want pack=%d in the launch line:\n%s", c->want,
                         line);
        const char *pairs_at = strstr(line, " pairs=");
        if (c->want_pairs >= 0 && (!pairs_at || atoi(pairs_at + 7) != c->want_pairs))
            fc_test_fail(__FILE__, __LINE__, "want pairs=%d in the launch line:\n%s",
                         c->want_pairs, line);
        const char *short_at = strstr(line, " short=");
        if (!short_at || atoi(short_at + 7) != c->want_short)
            fc_test_fail(__FILE__, __LINE__, "want short=%d in the launch line:\n%s",
                         c->want_short, line);
    }
    free(log);
}

#define BF FLASHC_DTYPE_BF16
#define HF FLASHC_DTYPE_FP16
#define WS "sm90ws_fwd_kernel<"
#define B_(DT, NB, SQ, SK, NH, NHK, HD, OPT) \
    .b = {.dt = DT, .b = NB, .sq = SQ, .sk = SK, .h = NH, .hk = NHK, .d = HD, .opt = OPT}
static const gpu_pack_dispatch_case gpu_pdcases[] = {
    /* auto: 256 tiles of 16 rows (2 waves on 114-132 SMs) against 32 packed (1) */
    {"auto", WS, 8, NULL, -1, 0, B_(BF, 8, 16, 256, 32, 4, 128, GO_NONE),
     .name = "gpu_fwd_dispatch_gqapack_auto_d128_8x16x256_h32:4_pack8"},
    /* auto: 64 tiles against 32, one wave either way */
    {"auto", WS, 1, NULL, -1, 0, B_(BF, 1, 64, 512, 64, 8, 128, GO_NONE),
     .name = "gpu_fwd_dispatch_gqapack_auto_d128_1x64x512_h64:8_pack1"},
    {"auto", WS, 1, NULL, -1, 0, B_(BF, 1, 2048, 64, 8, 1, 128, GO_NONE),
     .name = "gpu_fwd_dispatch_gqapack_auto_d128_2048x64_h8:1_pack1"},
    /* auto: 512 tiles (4 waves on 132 SMs, 5 on 114) against 384 packed (3, 4):
     * fewer waves, though more than two thirds of them */
    {"auto", WS, 4, NULL, -1, 0, B_(BF, 16, 80, 64, 32, 8, 128, GO_NONE),
     .name = "gpu_fwd_dispatch_gqapack_auto_d128_16x80x64_h32:8_pack4"},
    {"auto", WS, 1, "0", -1, 0, B_(BF, 8, 16, 256, 32, 4, 128, GO_NONE),
     .name = "gpu_fwd_dispatch_gqapack_never_d128_8x16x256_h32:4_pack1"},
    {"auto", WS, 8, "1", -1, 0, B_(BF, 2, 16, 512, 32, 4, 128, GO_NONE),
     .name = "gpu_fwd_dispatch_gqapack_force_d128_16x512_h32:4_pack8"},
    {"auto", WS, 1, "1", -1, 0, B_(BF, 2, 16, 512, 32, 4, 128, GO_ALIBI),
     .name = "gpu_fwd_dispatch_gqapack_force_d128_16x512_h32:4_alibi_pack1"},
    {"auto", WS, 8, "1", -1, 1,
     .v = {.v = {.dt = BF, .d = 128, .h = 32, .hk = 4, .page_size = 16}, .lens = &gp_vlens[1]},
     .name = "gpu_fwd_dispatch_gqapack_force_d128_paged16_h32:4_pack8"},
    /* causal, packed: 8 pairs cannot fill the SMs (single tiles); 256 can */
    {"auto", WS, 8, "1", 0, 0, B_(BF, 2, 16, 512, 32, 4, 128, GO_CAUSAL),
     .name = "gpu_fwd_dispatch_gqapack_force_d128_16x512_h32:4_causal_pack8_pairs0"},
    {"auto", WS, 8, "1", 1, 0, B_(HF, 8, 33, 100, 128, 16, 128, GO_CAUSAL),
     .name = "gpu_fwd_dispatch_gqapack_force_d128_8x33x100_h128:16_causal_pack8_pairs1"},
    /* G = 6 is no power of two: D64's short-work row runs (292 keys a row), unpacked */
    {"auto", WS, 1, "1", -1, 0, B_(HF, 2, 16, 300, 12, 2, 64, GO_CAUSAL),
     .name = "gpu_fwd_dispatch_gqapack_force_d64_16x300_h12:2_causal_pack1", .want_short = 1},
    /* D64's rows by the rule: the short-work row up to 1280 keys a query row
     * (1024; 2048 causal: 1024.5 on average), or where it packs (2048 keys,
     * 256 tiles of 16 rows against 32 packed); its three-consumer row at 2048 */
    {"auto", WS, 1, NULL, -1, 0, B_(BF, 1, 1024, 1024, 2, 2, 64, GO_NONE),
     .name = "gpu_fwd_dispatch_short_auto_d64_1024x1024", .want_short = 1},
    {"auto", WS, 1, NULL, -1, 0, B_(HF, 1, 2048, 2048, 2, 2, 64, GO_NONE),
     .name = "gpu_fwd_dispatch_short_auto_d64_2048x2048_long", .want_short = 0},
    {"auto", WS, 1, NULL, -1, 0, B_(BF, 1, 2048, 2048, 2, 1, 64, GO_CAUSAL),
     .name = "gpu_fwd_dispatch_short_auto_d64_2048x2048_h2:1_causal", .want_short = 1},
    {"auto", WS, 8, NULL, -1, 0, B_(BF, 8, 16, 2048, 32, 4, 64, GO_NONE),
     .name = "gpu_fwd_dispatch_short_auto_d64_8x16x2048_h32:4_pack8", .want_short = 1},
    /* FLASHC_CUDA_SHORT_ROW: =0 never, =1 always where the head dim has the row */
    {"auto", WS, 1, NULL, -1, 0, B_(BF, 1, 1024, 1024, 2, 2, 64, GO_CAUSAL),
     .name = "gpu_fwd_dispatch_short_never_d64_1024x1024_causal", .want_short = 0,
     .shortenv = "0"},
    {"auto", WS, 1, NULL, -1, 0, B_(HF, 1, 2048, 2048, 2, 2, 64, GO_NONE),
     .name = "gpu_fwd_dispatch_short_force_d64_2048x2048", .want_short = 1, .shortenv = "1"},
    {"auto", WS, 1, NULL, -1, 0, B_(BF, 1, 300, 300, 2, 2, 128, GO_NONE),
     .name = "gpu_fwd_dispatch_short_force_d128_300x300", .want_short = 0, .shortenv = "1"},
    {"sm90", "sm90_fwd_kernel<", 0, "1", -1, 0, B_(BF, 2, 16, 512, 32, 4, 128, GO_NONE),
     .name = "gpu_fwd_dispatch_gqapack_sm90_d128_16x512_h32:4"},
    {"sm80", "sm80_fwd_kernel<", 0, "1", -1, 0, B_(BF, 2, 16, 512, 32, 4, 128, GO_NONE),
     .name = "gpu_fwd_dispatch_gqapack_sm80_d128_16x512_h32:4"},
};
#undef B_
#undef BF
#undef HF
#undef WS

FC_TEST_REGISTER(gpu_fwd_gqa_pack_dispatch) {
    for (size_t i = 0; i < sizeof gpu_pdcases / sizeof gpu_pdcases[0]; i++)
        fc_test_add(gpu_pdcases[i].name, gpu_run_pack_dispatch, &gpu_pdcases[i]);
}
