/* test_gpu_kvcache.c : flashc_fwd_kvcache on the GPU against the float64
 * reference and the CPU backend.
 *
 * Every case builds one problem on the host, uploads it, and runs
 *   the reference (fc_ref_kvcache, both modes) on the caches as they were,
 *   the CPU backend on host copies of the caches (it appends in place),
 *   the GPU on the device tensors, outputs poisoned with NaN before the call,
 * then checks out and softmax_lse with DEVELOPERS.md's tolerance rule, and the
 * whole K and V caches downloaded from the GPU against the CPU's bit for bit:
 * the appended rows (rotary included) must be identical, and every other
 * element untouched.
 *
 * The caches are NaN outside the rows in use (leftpad rows, rows past
 * cache_seqlens + S_new, spare pages, cache batches no sequence uses), so a
 * kernel that reads a key it must not see turns the output into NaN. Paged
 * caches take their pages in a random order from a pool with spare pages, and
 * block_table has a row stride larger than its width.
 *
 * Cases (the names say which options are on): contiguous caches and paged ones
 * with page sizes 1, 5, 16, 48, 64, 256; cache_seqlens absent, a scalar or per
 * sequence, with lengths of 0, 1 and ending mid-page; cache_batch_idx,
 * cache_leftpad (on paged caches too), padded strides; k_new / v_new with and without rotary
 * (interleaved or not, rotary_dim < D or = D, tables in fp32 or the dtype);
 * causal, windows, softcap, ALiBi [H] and [B, H], no lse; query lengths 1 to
 * 100 (the long ones and the GQA groups past 128 packed rows take the forward
 * kernel); GQA ratios 1 to 16; num_splits 0 (heuristic, long caches split
 * across many CTAs), 1, 3, 7 and 200 (clamped); head dims 32 to 256, 80 (a
 * padded instance), 36 and a misaligned q (the forward kernel's repack);
 * GQA groups of 4 to 16 past 128 packed rows (Sq 17 to 40) on the forward
 * kernel, which on sm90ws at head dims 33..128 packs the group's query heads
 * into its query tiles (D64 in its short-work row; the D192 and D256 ones run
 * unpacked):
 * paged (pages of 16 and 256) and contiguous caches, cache_seqlens of 0 to 999
 * per sequence, causal, windows, softcap, no lse, k_new appended (with rotary),
 * leftpad and cache_batch_idx, head dims 64, 80, 128, 192 and 256, and ALiBi
 * (which must not pack), run with FLASHC_CUDA_GQA_PACK=1 (packed wherever the
 * kernel can, not only where the heuristic would).
 * `flashc_gpu_tests gpu_kvcache_bf16_d64` is the short set for
 * compute-sanitizer (contiguous, paged 1, 16 and 48, splits, append + rotary,
 * the forward route). Paged KV on flashc_varlen_fwd is tested in test_gpu_fwd.c.
 *
 * Build: this file + gpu_helpers.c + tests/helpers.c + tests/run.c, linked
 * with flashc_static and cudart. Needs a CUDA device of compute capability >= 8.0.
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

// ---- cases ----

enum { GK_MAXB = 4 };

typedef struct gk_case {
    flashc_dtype dt;
    int B, Sq, H, Hk, D;
    int Sc;          /* contiguous: rows per cache; paged: rows per sequence (capacity) */
    int page;        /* 0: contiguous; else the page size */
    int seqlens;     /* cache_seqlens: 0 absent (every row in use), 1 rank-0 scalar cs[0], 2 [B] */
    int cs[GK_MAXB]; /* rows in use before the append */
    int leftpad;     /* cache_leftpad = lp */
    int lp[GK_MAXB];
    int batch_idx;   /* contiguous: sequence b uses cache batch perm[b] of B + 2 */
    int padded;      /* caches with gaps between heads, rows and batches */
    int Snew;        /* rows of k_new / v_new, 0 = none */
    int rotary;      /* rotary_dim, 0 = none */
    int interleaved; /* params.rotary_halves == 0 */
    int rot_lowp;    /* rotary tables in the dtype instead of fp32 */
    int causal;
    int win, wl, wr; /* win: window (wl, wr), -1 = unbounded side; else none */
    float softcap;
    int alibi;  /* 0 off, 1 slopes [H], 2 slopes [B, H] */
    int splits; /* params.num_splits */
    int nolse;
    int misalign; /* q and out one element past 16 bytes */
    int pack;     /* run with FLASHC_CUDA_GQA_PACK=1 (sm90ws: GQA packing wherever it can) */
} gk_case;

// ---- the cache layout of a case ----

typedef struct {
    int64_t ps, maxb, nblk, bt_stride; /* paged */
    int64_t n0, n1;                    /* cache batches or pages, rows per batch or page */
    int64_t shape[4], stride[4], elems;
    int32_t bt[GK_MAXB * 64];  /* block_table [B, bt_stride] */
    int32_t bidx[GK_MAXB + 2]; /* cache_batch_idx */
    int32_t used[GK_MAXB], pad[GK_MAXB];
    int64_t capacity;
} gk_geo;

static int gk_geometry(const gk_case *c, gk_geo *g) {
    memset(g, 0, sizeof *g);
    const int64_t B = c->B, Hk = c->Hk, D = c->D;
    g->ps = c->page;
    if (g->ps) {
        g->maxb = (c->Sc + g->ps - 1) / g->ps;
        g->nblk = B * g->maxb + 3;
        g->bt_stride = g->maxb + 1;
        if (B * g->bt_stride > GK_MAXB * 64) return 0;
        int32_t *perm = (int32_t *)malloc((size_t)g->nblk * sizeof(int32_t));
        if (!perm) return 0;
        th_shuffle(perm, g->nblk);
        for (int64_t b = 0; b < B; b++)
            for (int64_t e = 0; e < g->bt_stride; e++)
                g->bt[b * g->bt_stride + e] = e < g->maxb ? perm[b * g->maxb + e] : -1;
        free(perm);
        g->n0 = g->nblk;
        g->n1 = g->ps;
        g->capacity = g->maxb * g->ps;
    } else {
        g->n0 = c->batch_idx ? B + 2 : B;
        g->n1 = c->Sc;
        th_shuffle(g->bidx, g->n0);
        g->capacity = c->Sc;
    }
    int64_t shape[4] = {g->n0, g->n1, Hk, D};
    memcpy(g->shape, shape, sizeof shape);
    if (c->padded) {
        g->stride[3] = 1;
        g->stride[2] = D + 8;
        g->stride[1] = Hk * (D + 8) + 16;
        g->stride[0] = g->n1 * g->stride[1] + 8;
    } else {
        gb_contig_strides(4, shape, g->stride);
    }
    g->elems = (g->n0 - 1) * g->stride[0] + g->stride[0];
    for (int64_t b = 0; b < B; b++) {
        g->used[b] = c->seqlens == 0 ? (int32_t)g->capacity : c->cs[c->seqlens == 1 ? 0 : b];
        g->pad[b] = c->leftpad ? c->lp[b] : 0;
    }
    return 1;
}

/* Element offset of row r (0 .. capacity) of sequence b's cache, head 0. */
static int64_t gk_row(const gk_case *c, const gk_geo *g, int64_t b, int64_t r) {
    if (g->ps)
        return g->bt[b * g->bt_stride + r / g->ps] * g->stride[0] + (r % g->ps) * g->stride[1];
    return (c->batch_idx ? g->bidx[b] : b) * g->stride[0] + r * g->stride[1];
}

/* The cache: NaN everywhere, then uniform [-1, 1) in rows [pad, used) of each sequence. */
static void gk_fill_cache(const gk_case *c, const gk_geo *g, gb_buf *buf) {
    fc_poison(buf->h, c->dt, (int64_t)(buf->bytes / flashc_dtype_size(c->dt)));
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t r = g->pad[b]; r < g->used[b]; r++)
            for (int64_t h = 0; h < c->Hk; h++)
                fc_fill_random((char *)buf->h + (gk_row(c, g, b, r) + h * g->stride[2]) *
                                                    (int64_t)flashc_dtype_size(c->dt),
                               c->dt, c->D, -1.0, 1.0);
}

static flashc_params gk_params(const gk_case *c) {
    flashc_params p = flashc_params_default();
    p.softmax_scale = (float)(2.0 / sqrt((double)c->D)); /* peakier than the default */
    p.causal = c->causal;
    p.windowed = c->win;
    p.window_left = c->win ? c->wl : -1;
    p.window_right = c->win ? c->wr : -1;
    p.softcap = c->softcap;
    if (c->softcap > 0.0f) p.softmax_scale = (float)(6.0 / sqrt((double)c->D));
    p.rotary_halves = !c->interleaved;
    p.num_splits = c->splits;
    return p;
}

// ---- one case ----

/* Bitwise differences between the GPU's cache and the CPU's; a few are printed. */
static int64_t gk_cache_diff(const char *what, const gk_case *c, const void *gpu, const void *cpu,
                             size_t bytes) {
    const uint16_t *x = (const uint16_t *)gpu, *y = (const uint16_t *)cpu;
    int64_t n = (int64_t)(bytes / 2), bad = 0;
    for (int64_t i = 0; i < n; i++)
        if (x[i] != y[i] && bad++ < 4)
            printf("    %s element %lld: gpu 0x%04x (%g) cpu 0x%04x (%g)\n", what, (long long)i,
                   x[i], fc_get(gpu, c->dt, i), y[i], fc_get(cpu, c->dt, i));
    return bad;
}

static void gk_run(const void *param) {
    const gk_case *c = (const gk_case *)param;
    const flashc_dtype dt = c->dt, f32 = FLASHC_DTYPE_FP32, i32 = FLASHC_DTYPE_INT32;
    const int64_t B = c->B, Sq = c->Sq, H = c->H, Hk = c->Hk, D = c->D, Sn = c->Snew;
    const size_t es = flashc_dtype_size(dt);
    const int64_t mis = c->misalign ? 1 : 0;
    gb_arena ar = {0};
    void *cpu_k = NULL, *cpu_v = NULL, *cpu_o = NULL, *cpu_l = NULL;
    flashc_params p = gk_params(c);
    gk_geo g;
    if (!gk_geometry(c, &g)) {
        fc_test_fail(__FILE__, __LINE__, "case geometry too large for the test's tables");
        return;
    }

    // ---- buffers ----
    const int64_t nq = B * Sq * H * D, nl = B * H * Sq, nn = B * Sn * Hk * D;
    const int64_t half = c->rotary / 2, sro = g.capacity + Sq + 2, rpitch = half + 3;
    gb_buf *qb = gb_new(&ar, (size_t)(nq + mis) * es);
    gb_buf *kcb = gb_new(&ar, (size_t)g.elems * es), *vcb = gb_new(&ar, (size_t)g.elems * es);
    gb_buf *ob = gb_new(&ar, (size_t)(nq + mis) * es);
    gb_buf *lb = gb_new(&ar, (size_t)nl * sizeof(float));
    gb_buf *knb = gb_new(&ar, (size_t)nn * es), *vnb = gb_new(&ar, (size_t)nn * es);
    gb_buf *csb = gb_new(&ar, sizeof g.used), *lpb = gb_new(&ar, sizeof g.pad);
    gb_buf *bib = gb_new(&ar, sizeof g.bidx), *btb = gb_new(&ar, sizeof g.bt);
    const flashc_dtype rdt = c->rot_lowp ? dt : f32;
    gb_buf *cosb = gb_new(&ar, (size_t)(sro * rpitch) * flashc_dtype_size(rdt));
    gb_buf *sinb = gb_new(&ar, (size_t)(sro * rpitch) * flashc_dtype_size(rdt));
    gb_buf *alb = gb_new(&ar, (size_t)(B * H) * sizeof(float));
    if (!qb || !kcb || !vcb || !ob || !lb || !knb || !vnb || !csb || !lpb || !bib || !btb ||
        !cosb || !sinb || !alb)
        goto done;

    // ---- contents ----
    gb_fill(qb, dt, -1.0, 1.0);
    gk_fill_cache(c, &g, kcb);
    gk_fill_cache(c, &g, vcb);
    gb_fill(knb, dt, -1.0, 1.0);
    gb_fill(vnb, dt, -1.0, 1.0);
    memcpy(csb->h, g.used, sizeof g.used);
    memcpy(lpb->h, g.pad, sizeof g.pad);
    memcpy(bib->h, g.bidx, sizeof g.bidx);
    memcpy(btb->h, g.bt, sizeof g.bt);
    for (int64_t pos = 0; pos < sro; pos++)
        for (int64_t r = 0; r < half; r++) {
            /* the usual frequencies: angle(pos, r) = pos * 10000^(-2r / rotary_dim) */
            double ang = (double)pos * pow(10000.0, -2.0 * (double)r / (double)c->rotary);
            fc_store(rdt, cosb->h, pos * rpitch + r, (float)cos(ang));
            fc_store(rdt, sinb->h, pos * rpitch + r, (float)sin(ang));
        }
    for (int64_t i = 0; i < B * H; i++) ((float *)alb->h)[i] = (float)fc_rand_uniform(0.01, 0.6);
    for (int i = 0; i < ar.n; i++)
        if (!gb_upload(&ar.b[i])) goto done;
    if (!gb_poison(ob) || !gb_poison(lb)) goto done;

    // ---- the args, host side (0) and device side (1) ----
    flashc_kvcache_args x[2];
    {
        int64_t qs[4] = {B, Sq, H, D}, qst[4], ns[4] = {B, Sn, Hk, D}, nst[4];
        int64_t ls[3] = {B, H, Sq}, lst[3], vecn[1] = {B}, one[1] = {1};
        int64_t bts[2] = {B, g.maxb}, btst[2] = {g.bt_stride, 1};
        int64_t rs[2] = {sro, half}, rst[2] = {rpitch, 1};
        int64_t as[2] = {B, H}, ast[2] = {H, 1};
        gb_contig_strides(4, qs, qst);
        gb_contig_strides(4, ns, nst);
        gb_contig_strides(3, ls, lst);
        for (int dev = 0; dev < 2; dev++) {
            flashc_kvcache_args *a = &x[dev];
            memset(a, 0, sizeof *a);
            a->abi = FLASHC_ABI_VERSION;
            a->q = gb_view(qb, dev, dt, mis, 4, qs, qst);
            a->out = gb_view(ob, dev, dt, mis, 4, qs, qst);
            a->k_cache = gb_view(kcb, dev, dt, 0, 4, g.shape, g.stride);
            a->v_cache = gb_view(vcb, dev, dt, 0, 4, g.shape, g.stride);
            if (!c->nolse) a->softmax_lse = gb_view(lb, dev, f32, 0, 3, ls, lst);
            if (Sn) {
                a->k_new = gb_view(knb, dev, dt, 0, 4, ns, nst);
                a->v_new = gb_view(vnb, dev, dt, 0, 4, ns, nst);
            }
            if (c->seqlens)
                a->cache_seqlens = gb_view(csb, dev, i32, 0, c->seqlens == 1 ? 0 : 1, vecn, one);
            if (c->leftpad) a->cache_leftpad = gb_view(lpb, dev, i32, 0, 1, vecn, one);
            if (c->batch_idx) a->cache_batch_idx = gb_view(bib, dev, i32, 0, 1, vecn, one);
            if (g.ps) a->block_table = gb_view(btb, dev, i32, 0, 2, bts, btst);
            if (c->rotary) {
                a->rotary_cos = gb_view(cosb, dev, rdt, 0, 2, rs, rst);
                a->rotary_sin = gb_view(sinb, dev, rdt, 0, 2, rs, rst);
            }
            /* alibi 1: slopes [H] (the first row), 2: slopes [B, H] */
            if (c->alibi)
                a->alibi_slopes = gb_view(alb, dev, f32, 0, c->alibi, c->alibi == 1 ? as + 1 : as,
                                          c->alibi == 1 ? ast + 1 : ast);
        }
    }

    // ---- the reference, on the caches as they were ----
    double *o64 = gb_dbl(&ar, nq), *olp = gb_dbl(&ar, nq), *l64 = gb_dbl(&ar, nl),
           *llp = gb_dbl(&ar, nl);
    double *gout = gb_dbl(&ar, nq), *glse = gb_dbl(&ar, nl);
    if (!o64 || !olp || !l64 || !llp || !gout || !glse) goto done;
    GB_OK(fc_ref_kvcache(&x[0], &p, FC_REF_F64, o64, l64, NULL));
    GB_OK(fc_ref_kvcache(&x[0], &p, FC_REF_LOWP, olp, llp, NULL));

    // ---- the CPU backend on copies of the caches: the expected append ----
    {
        flashc_kvcache_args ca = x[0];
        cpu_k = malloc(kcb->bytes);
        cpu_v = malloc(vcb->bytes);
        cpu_o = malloc(ob->bytes);
        cpu_l = malloc(lb->bytes);
        if (!cpu_k || !cpu_v || !cpu_o || !cpu_l) {
            fc_test_fail(__FILE__, __LINE__, "out of host memory");
            goto done;
        }
        memcpy(cpu_k, kcb->h, kcb->bytes);
        memcpy(cpu_v, vcb->h, vcb->bytes);
        ca.k_cache.data = cpu_k;
        ca.v_cache.data = cpu_v;
        ca.out.data = (char *)cpu_o + mis * (int64_t)es;
        if (!c->nolse) ca.softmax_lse.data = cpu_l;
        GB_OK(flashc_fwd_kvcache(&ca, &p, NULL, 0));
    }

    // ---- the GPU ----
    {
        size_t ws_bytes = 0;
        GB_OK(flashc_fwd_kvcache_workspace_size(&x[1], &p, &ws_bytes));
        void *ws = gb_ws(&ar, ws_bytes);
        if (ws_bytes && !ws) goto done;
        GB_OK(flashc_fwd_kvcache(&x[1], &p, ws, ws_bytes));
        if (!gb_sync() || !gb_download(ob) || !gb_download(lb) || !gb_download(kcb) ||
            !gb_download(vcb))
            goto done;
    }

    // ---- checks ----
    fc_tensor_to_double(&x[0].out, gout);
    fc_check_close("out", dt, gout, o64, olp, nq);
    if (!c->nolse) {
        fc_tensor_to_double(&x[0].softmax_lse, glse);
        fc_check_close("lse", dt, glse, l64, llp, nl);
    }
    {
        const int64_t kbad = gk_cache_diff("k_cache", c, kcb->h, cpu_k, kcb->bytes);
        const int64_t vbad = gk_cache_diff("v_cache", c, vcb->h, cpu_v, vcb->bytes);
        if (kbad || vbad)
            fc_test_fail(
                __FILE__, __LINE__,
                "caches after the append: %lld k and %lld v elements differ from the CPU's",
                (long long)kbad, (long long)vbad);
    }
done:
    free(cpu_k);
    free(cpu_v);
    free(cpu_o);
    free(cpu_l);
    gb_free(&ar);
}

// ---- the case table ----

#define BF FLASHC_DTYPE_BF16
#define HF FLASHC_DTYPE_FP16
static const gk_case gk_cases[] = {
    // the short set (bf16, d64): compute-sanitizer runs these
    {BF, 2, 1, 8, 2, 64, 300, 0, .seqlens = 2, .cs = {123, 299}, .Snew = 1, .rotary = 64,
     .interleaved = 1, .batch_idx = 1, .causal = 1},
    {BF, 3, 1, 4, 4, 64, 200, 16, .seqlens = 2, .cs = {37, 1, 170}, .Snew = 2, .leftpad = 1,
     .lp = {5, 0, 33}, .rotary = 32},
    {BF, 2, 2, 6, 3, 64, 500, 48, .seqlens = 2, .cs = {250, 431}, .Snew = 2, .splits = 3,
     .causal = 1},
    {BF, 1, 1, 4, 1, 64, 3000, 0, .seqlens = 1, .cs = {2990}, .Snew = 1}, /* heuristic splits */
    {BF, 2, 40, 8, 2, 64, 300, 16, .seqlens = 2, .cs = {100, 220}, .Snew = 40, .rotary = 64,
     .causal = 1}, /* 160 packed rows: the forward kernel */
    {BF, 2, 4, 8, 1, 64, 256, 64, .seqlens = 2, .cs = {64, 189}, .Snew = 4, .win = 1, .wl = 50,
     .wr = 0, .alibi = 2}, /* 32 packed rows: two row blocks */

    // contiguous caches
    {BF, 2, 1, 4, 1, 128, 257, 0, .seqlens = 2, .cs = {100, 257}},
    {HF, 3, 1, 2, 2, 128, 113, 0, .seqlens = 1, .cs = {77}, .nolse = 1},
    {BF, 2, 1, 2, 1, 32, 17, 0, .seqlens = 0}, /* no cache_seqlens: every row */
    {BF, 2, 1, 8, 2, 128, 257, 0, .seqlens = 2, .cs = {50, 200}, .Snew = 1, .rotary = 128,
     .causal = 1},
    {HF, 2, 4, 4, 2, 64, 80, 0, .seqlens = 2, .cs = {10, 60}, .Snew = 4, .rotary = 32,
     .interleaved = 1, .causal = 1},
    {BF, 3, 1, 4, 4, 80, 64, 0, .seqlens = 2, .cs = {3, 40, 63}, .Snew = 1, .rotary = 80,
     .interleaved = 1, .rot_lowp = 1, .batch_idx = 1}, /* D 80 on the D 96 instance */
    {HF, 2, 3, 4, 2, 96, 128, 0, .seqlens = 2, .cs = {40, 90}, .Snew = 2, .rotary = 64,
     .leftpad = 1, .lp = {3, 17}, .win = 1, .wl = 16, .wr = -1, .padded = 1},
    {BF, 2, 1, 2, 1, 256, 100, 0, .seqlens = 2, .cs = {60, 99}, .Snew = 1, .batch_idx = 1,
     .leftpad = 1, .lp = {5, 0}, .softcap = 1.5f},
    {HF, 2, 2, 6, 3, 160, 150, 0, .seqlens = 2, .cs = {20, 133}, .alibi = 1, .causal = 1},
    {BF, 2, 5, 4, 1, 192, 64, 0, .seqlens = 2, .cs = {0, 30}, .Snew = 5, .rotary = 64,
     .rot_lowp = 1, .alibi = 2, .causal = 1},
    {HF, 2, 1, 4, 2, 224, 90, 0, .seqlens = 2, .cs = {1, 80}, .splits = 7}, /* one key */
    {BF, 2, 3, 2, 2, 64, 40, 0, .seqlens = 2, .cs = {11, 25}, .Snew = 2, .rotary = 64,
     .interleaved = 1}, /* rotary without a mask: every q row at cache_seqlens */
    {BF, 1, 4, 2, 1, 128, 8, 0, .seqlens = 2, .cs = {0}, .Snew = 1,
     .causal = 1}, /* empty cache, one new key: 3 rows see nothing */
    {HF, 2, 4, 4, 2, 128, 64, 0, .seqlens = 2, .cs = {30, 45}, .Snew = 4, .rotary = 48, .win = 1,
     .wl = 8, .wr = 2},
    {BF, 2, 1, 16, 1, 128, 700, 0, .seqlens = 2, .cs = {650, 333}, .Snew = 1,
     .softcap = 30.0f}, /* MQA: 16 heads on one kv head */
    {HF, 1, 8, 32, 2, 128, 600, 0, .seqlens = 1, .cs = {500}, .Snew = 8, .rotary = 128,
     .interleaved = 1, .causal = 1}, /* 128 packed rows: 8 row blocks, still the decode kernel */
    {BF, 2, 1, 4, 2, 128, 400, 0, .seqlens = 2, .cs = {399, 200}, .Snew = 1, .splits = 200,
     .alibi = 1}, /* clamped to the key tiles */

    // paged caches
    {BF, 2, 1, 4, 2, 64, 40, 1, .seqlens = 2, .cs = {5, 33}, .Snew = 1, .rotary = 64,
     .interleaved = 1},
    {HF, 3, 2, 4, 2, 128, 50, 5, .seqlens = 2, .cs = {12, 0, 37}, .Snew = 3, .causal = 1},
    {BF, 2, 1, 8, 1, 128, 640, 16, .seqlens = 1, .cs = {401}, .Snew = 1, .rotary = 32,
     .interleaved = 1, .win = 1, .wl = 100, .wr = -1},
    {HF, 2, 1, 8, 8, 128, 1000, 16, .seqlens = 2, .cs = {999, 17}, .splits = 1},
    {BF, 2, 1, 4, 4, 128, 1024, 256, .seqlens = 2, .cs = {300, 1000}},
    {HF, 2, 2, 8, 2, 128, 700, 256, .seqlens = 2, .cs = {255, 600}, .Snew = 2, .rotary = 128,
     .rot_lowp = 1, .leftpad = 1, .lp = {0, 300}},
    {BF, 2, 3, 4, 2, 96, 80, 16, .seqlens = 2, .cs = {17, 50}, .Snew = 2, .softcap = 1.5f,
     .alibi = 2, .padded = 1},
    {HF, 2, 1, 2, 1, 64, 48, 16, .seqlens = 0}, /* no cache_seqlens: every row of every page */
    {BF, 3, 1, 8, 2, 128, 900, 64, .seqlens = 2, .cs = {128, 1, 830},
     .splits = 7}, /* two full pages; a sequence of one key */
    {BF, 2, 2, 6, 3, 192, 70, 16, .seqlens = 2, .cs = {31, 64}, .Snew = 2, .rotary = 192,
     .rot_lowp = 1, .causal = 1, .win = 1, .wl = 10, .wr = 0},
    {HF, 2, 1, 4, 2, 256, 300, 48, .seqlens = 2, .cs = {47, 200}, .Snew = 1, .rotary = 256,
     .interleaved = 1},
    {BF, 1, 1, 8, 2, 128, 4000, 16, .seqlens = 1, .cs = {3333}, .Snew = 1, .rotary = 128,
     .causal = 1}, /* long paged cache, heuristic splits */
    {HF, 2, 1, 4, 4, 32, 300, 64, .seqlens = 2, .cs = {64, 130}, .splits = 3, .nolse = 1},

    // the forward kernel's share: long query chunks, odd layouts
    {HF, 2, 100, 4, 4, 128, 400, 64, .seqlens = 2, .cs = {150, 290}, .Snew = 100, .rotary = 64,
     .interleaved = 1, .causal = 1}, /* chunked prefill over a paged cache */
    {BF, 2, 33, 8, 2, 96, 200, 0, .seqlens = 2, .cs = {40, 150}, .leftpad = 1, .lp = {7, 2},
     .batch_idx = 1, .win = 1, .wl = 20, .wr = 5},
    {BF, 2, 2, 4, 2, 36, 100, 0, .seqlens = 2, .cs = {30, 90}, .Snew = 2, .rotary = 36,
     .batch_idx = 1, .causal = 1}, /* D 36: the repacked forward, cache batch idx */
    {HF, 2, 1, 4, 1, 36, 90, 5, .seqlens = 2, .cs = {44, 80}, .Snew = 1}, /* D 36, paged */
    {BF, 2, 1, 4, 2, 128, 200, 16, .seqlens = 2, .cs = {77, 150}, .Snew = 1, .rotary = 128,
     .interleaved = 1, .misalign = 1}, /* q and out misaligned: the forward kernel */
    {BF, 2, 64, 8, 2, 256, 300, 16, .seqlens = 2, .cs = {40, 230}, .Snew = 64,
     .causal = 1}, /* sm90ws: 16-row pages, four TMA boxes per 64-key tile */
    {HF, 2, 40, 4, 1, 128, 400, 16, .seqlens = 2, .cs = {100, 300}, .leftpad = 1,
     .lp = {8, 40}, .causal = 1}, /* paged with leftpad: the sm90 family on sm90 */
    {BF, 2, 50, 6, 2, 64, 333, 0, .seqlens = 2, .cs = {200, 117}, .Snew = 3, .leftpad = 1,
     .lp = {9, 100}, .batch_idx = 1, .causal = 1}, /* sm90ws: leftpad and batch idx (D64 rows) */
    {BF, 2, 0, 4, 2, 64, 50, 0, .seqlens = 2, .cs = {10, 20}, .Snew = 2, .rotary = 64,
     .interleaved = 1}, /* no query rows: only the append */

    // GQA groups past 128 packed rows: the forward kernel, on sm90ws (D128) with
    // the G query heads of a KV head packed into its query tiles (Sq G rows),
    // FLASHC_CUDA_GQA_PACK=1 so that they pack whatever the waves
    {BF, 3, 40, 16, 2, 128, 700, 16, .seqlens = 2, .cs = {1, 333, 650},
     .causal = 1, .pack = 1}, /* G 8: 320 rows; 39 rows of b 0 see no key */
    {HF, 2, 20, 32, 2, 128, 1024, 256, .seqlens = 2, .cs = {1000, 257}, .pack = 1}, /* G 16: 320 rows */
    {BF, 2, 40, 8, 1, 64, 500, 16, .seqlens = 2, .cs = {100, 417}, .Snew = 40, .rotary = 64,
     .causal = 1, .pack = 1}, /* G 8 at D64 (D64's short-work row), k_new appended */
    {HF, 4, 20, 16, 1, 256, 300, 0, .seqlens = 2, .cs = {0, 1, 150, 280}, .win = 1, .wl = 64,
     .wr = -1, .pack = 1}, /* G 16, an empty cache */
    {BF, 2, 17, 24, 3, 80, 200, 0, .seqlens = 2, .cs = {40, 150}, .leftpad = 1, .lp = {7, 2},
     .batch_idx = 1, .Snew = 17, .rotary = 80, .interleaved = 1,
     .causal = 1, .pack = 1}, /* G 8: 136 rows, 128 + 8 */
    {HF, 2, 40, 16, 4, 128, 600, 256, .seqlens = 2, .cs = {255, 500}, .Snew = 8, .win = 1,
     .wl = 100, .wr = 20, .nolse = 1, .pack = 1}, /* G 4: 160 rows */
    {HF, 2, 33, 64, 4, 64, 1000, 16, .seqlens = 2, .cs = {999, 17}, .Snew = 1,
     .softcap = 30.0f, .pack = 1}, /* G 16 at D64 (D64's short-work row) */
    {BF, 1, 20, 16, 1, 192, 300, 16, .seqlens = 1, .cs = {250},
     .causal = 1, .pack = 1}, /* G 16 at D192 (not packed): 96-key tiles of 6 pages */
    {BF, 2, 40, 16, 2, 128, 400, 16, .seqlens = 2, .cs = {200, 390}, .alibi = 2,
     .causal = 1, .pack = 1}, /* ALiBi: must not pack */
};
#undef BF
#undef HF

static void gk_name(const gk_case *k, char *name, size_t n) {
    size_t len = (size_t)snprintf(name, n, "gpu_kvcache_%s_d%d_b%d_sq%d_h%d:%d_%s%d",
                                  flashc_dtype_name(k->dt), k->D, k->B, k->Sq, k->H, k->Hk,
                                  k->page ? "page" : "contig", k->page ? k->page : k->Sc);
#define GK_PUT(...) len += (size_t)snprintf(name + len, len < n ? n - len : 0, __VA_ARGS__)
    if (k->page) GK_PUT("_cap%d", k->Sc);
    if (k->seqlens == 0) GK_PUT("_full");
    if (k->seqlens == 1) GK_PUT("_seqlen%d", k->cs[0]);
    if (k->seqlens == 2) {
        GK_PUT("_seqlens");
        for (int b = 0; b < k->B; b++) GK_PUT("%s%d", b ? "," : "", k->cs[b]);
    }
    if (k->leftpad) {
        GK_PUT("_leftpad");
        for (int b = 0; b < k->B; b++) GK_PUT("%s%d", b ? "," : "", k->lp[b]);
    }
    if (k->batch_idx) GK_PUT("_batchidx");
    if (k->padded) GK_PUT("_padded");
    if (k->Snew) GK_PUT("_new%d", k->Snew);
    if (k->rotary)
        GK_PUT("_rope%d%s%s", k->rotary, k->interleaved ? "i" : "", k->rot_lowp ? "lowp" : "");
    if (k->causal) GK_PUT("_causal");
    if (k->win) GK_PUT("_win%d,%d", k->wl, k->wr);
    if (k->softcap > 0.0f) GK_PUT("_softcap%g", (double)k->softcap);
    if (k->alibi) GK_PUT("_alibi%s", k->alibi == 1 ? "H" : "BH");
    if (k->splits) GK_PUT("_splits%d", k->splits);
    if (k->nolse) GK_PUT("_nolse");
    if (k->misalign) GK_PUT("_misaligned");
#undef GK_PUT
}

static void gk_run_case(const void *param) {
    const gk_case *c = (const gk_case *)param;
    gb_with_env("FLASHC_CUDA_GQA_PACK", c->pack ? "1" : NULL, gk_run, param);
}

FC_TEST_REGISTER(gpu_kvcache) {
    for (size_t i = 0; i < sizeof gk_cases / sizeof gk_cases[0]; i++) {
        char name[320];
        gk_name(&gk_cases[i], name, sizeof name);
        fc_test_add(name, gk_run_case, &gk_cases[i]);
    }
}
