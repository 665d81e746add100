/* test_kvcache.c : flashc_fwd_kvcache against the float64 reference by the
 * tolerance rule of DEVELOPERS.md.
 *
 * Caches are contiguous (optionally through cache_batch_idx into a larger cache,
 * optionally with padded strides) or paged (page sizes 1, 5, 16, 256, pages
 * shuffled, spare pages in the pool). cache_seqlens is absent, a rank-0 scalar or
 * per batch, with lengths ending mid-page; cache_leftpad; k_new / v_new appended
 * with rotary (interleaved or not, rotary_dim < D or == D, cos/sin in fp32 or
 * q's dtype); Sq > 1 (speculative decode); causal, windows, softcap, ALiBi and
 * num_splits. The reference runs first, on the caches as they were. Checks: out
 * and lse; the appended K rows equal the rotated k_new up to one rounding (and
 * bitwise without rotary); the appended V rows equal v_new bitwise; every other
 * cache element and every input is unchanged bitwise. A subset runs under every
 * SIMD path with 1 and 2 threads.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/reference.h"
#include "fc_test.h"
#include "helpers.h"

// ---- cases ----

enum { KV_MAXB = 4 };

typedef struct kv_case {
    flashc_dtype dt;
    int B, Sq, H, Hk, D;
    int Dv;           /* head dim of v_cache, v_new, out (D when 0) */
    int Sc;           /* rows per sequence: contiguous cache length, or paged capacity */
    int page;         /* 0: contiguous; else the page size */
    int seqlens;      /* cache_seqlens: 0 absent (every row in use), 1 rank-0 scalar cs[0], 2 [B] */
    int cs[KV_MAXB];  /* rows in use before the append */
    int batch_idx;    /* contiguous: sequence b uses row perm[b] of a cache of B + 2 */
    int leftpad;      /* cache_leftpad = lp */
    int lp[KV_MAXB];
    int Snew;         /* rows of k_new / v_new, 0 = none */
    int rotary;       /* rotary_dim, 0 = none */
    int interleaved;  /* params.rotary_halves == 0 */
    int rot_dtype;    /* cos/sin in q's dtype instead of fp32 */
    int padded;       /* q, caches and out with padded strides */
    th_opts o;
    int num_splits;
    int lse;
    int simd, threads;
} kv_case;

enum { KV_MAX = 96 };
static kv_case kv_cases[KV_MAX];
static int kv_ncases;

/* Smallest spacing of dtype dt at |x| (one unit in the last place). */
static double kv_ulp(flashc_dtype dt, double x) {
    int mant = dt == FLASHC_DTYPE_BF16 ? 7 : dt == FLASHC_DTYPE_FP16 ? 10 : 23;
    int emin = dt == FLASHC_DTYPE_FP16 ? -14 : -126;
    int e = x != 0.0 ? ilogb(x) : emin;
    if (e < emin) e = emin;
    return ldexp(1.0, e - mant);
}

// ---- one case ----

static void kv_body(const kv_case *c, th_arena *ar) {
    const flashc_dtype dt = c->dt;
    const int64_t B = c->B, Sq = c->Sq, H = c->H, Hk = c->Hk, D = c->D, Sn = c->Snew;
    const int64_t Dv = c->Dv ? c->Dv : D;
    int64_t qs[4] = {B, Sq, H, D}, os[4] = {B, Sq, H, Dv};
    th_layout lay = c->padded ? TH_PADDED : TH_CONTIG;

    flashc_kvcache_args a;
    memset(&a, 0, sizeof a);
    a.abi = FLASHC_ABI_VERSION;
    th_buf *qb = th_buf_in(ar);
    a.q = th_new(qb, dt, 4, qs, lay, -3.0, 3.0);

    // ---- the cache ----
    th_buf *kcb = th_buf_in(ar), *vcb = th_buf_in(ar);
    const int32_t *bt = NULL, *bidx = NULL;
    int64_t bt_stride = 0, ps = c->page;
    if (c->page) {
        int64_t maxb = (c->Sc + ps - 1) / ps, nblocks = B * maxb + 2;
        int32_t *perm = (int32_t *)th_keep(ar, malloc((size_t)nblocks * sizeof(int32_t)));
        th_shuffle(perm, nblocks);
        th_buf *tb = th_buf_in(ar);
        bt_stride = maxb + 1;
        th_buf_new(tb, FLASHC_DTYPE_INT32, B * bt_stride, 0.0, 0.0);
        int32_t *t = (int32_t *)tb->data;
        for (int64_t b = 0; b < B; b++)
            for (int64_t e = 0; e < maxb; e++) t[b * bt_stride + e] = perm[b * maxb + e];
        bt = t;
        a.block_table = th_view(tb, 0, 2, (int64_t[]){B, maxb}, (int64_t[]){bt_stride, 1});
        int64_t ks[4] = {nblocks, ps, Hk, D}, vs[4] = {nblocks, ps, Hk, Dv};
        a.k_cache = th_new(kcb, dt, 4, ks, lay, -1.0, 1.0);
        a.v_cache = th_new(vcb, dt, 4, vs, lay, -1.0, 1.0);
    } else {
        int64_t Bc = c->batch_idx ? B + 2 : B, ks[4] = {Bc, c->Sc, Hk, D},
                vs[4] = {Bc, c->Sc, Hk, Dv};
        a.k_cache = th_new(kcb, dt, 4, ks, lay, -1.0, 1.0);
        a.v_cache = th_new(vcb, dt, 4, vs, lay, -1.0, 1.0);
        if (c->batch_idx) {
            int32_t perm[KV_MAXB + 2];
            th_shuffle(perm, Bc);
            a.cache_batch_idx = th_new_i32(th_buf_in(ar), 1, B, perm);
            bidx = (const int32_t *)a.cache_batch_idx.data;
        }
    }
    if (c->seqlens) a.cache_seqlens = th_new_i32(th_buf_in(ar), c->seqlens == 1 ? 0 : 1, B, c->cs);
    if (c->leftpad) a.cache_leftpad = th_new_i32(th_buf_in(ar), 1, B, c->lp);

    // ---- new rows, rotary, ALiBi ----
    th_buf *knb = th_buf_in(ar), *vnb = th_buf_in(ar), *cb = th_buf_in(ar), *sb = th_buf_in(ar);
    if (Sn) {
        int64_t ns[4] = {B, Sn, Hk, D}, vns[4] = {B, Sn, Hk, Dv};
        a.k_new = th_new(knb, dt, 4, ns, TH_CONTIG, -1.0, 1.0);
        a.v_new = th_new(vnb, dt, 4, vns, TH_CONTIG, -1.0, 1.0);
    }
    if (c->rotary) {
        /* the usual frequencies: angle(pos, r) = pos * 10000^(-2r / rotary_dim) */
        int64_t half = c->rotary / 2, sro = c->Sc + Sq + 2;
        flashc_dtype rdt = c->rot_dtype ? dt : FLASHC_DTYPE_FP32;
        a.rotary_cos = th_new(cb, rdt, 2, (int64_t[]){sro, half}, TH_PADDED, 0.0, 0.0);
        a.rotary_sin = th_new(sb, rdt, 2, (int64_t[]){sro, half}, TH_PADDED, 0.0, 0.0);
        double *cv = th_dbl(ar, sro * half), *sv = th_dbl(ar, sro * half);
        for (int64_t pos = 0; pos < sro; pos++)
            for (int64_t r = 0; r < half; r++) {
                double ang = (double)pos * pow(10000.0, -2.0 * (double)r / (double)c->rotary);
                cv[pos * half + r] = cos(ang);
                sv[pos * half + r] = sin(ang);
            }
        th_store_dense(&a.rotary_cos, cv);
        th_store_dense(&a.rotary_sin, sv);
    }
    a.alibi_slopes = th_alibi_new(th_buf_in(ar), c->o.alibi, B, H);

    // ---- outputs ----
    th_buf *ob = th_buf_in(ar), *lb = th_buf_in(ar);
    a.out = th_new_out(ob, dt, 4, os, lay);
    if (c->lse) a.softmax_lse = th_new_out(lb, FLASHC_DTYPE_FP32, 3, (int64_t[]){B, H, Sq}, lay);
    flashc_params p = th_params(&c->o);
    p.rotary_halves = !c->interleaved;
    p.num_splits = c->num_splits;
    th_buf *ins[6] = {qb, kcb, vcb, knb, vnb, cb};
    for (int i = 0; i < 6; i++)
        if (ins[i]->data) th_snapshot(ins[i]);
    if (sb->data) th_snapshot(sb);

    // ---- the reference first: the call appends in place ----
    int64_t nq = B * Sq * H * Dv, nl = B * H * Sq, nn = B * Sn * Hk * D;
    double *o64 = th_dbl(ar, nq), *olp = th_dbl(ar, nq), *l64 = th_dbl(ar, nl),
           *llp = th_dbl(ar, nl);
    double *kn64 = th_dbl(ar, nn), *knlp = th_dbl(ar, nn);
    FC_ASSERT_OK(fc_ref_kvcache(&a, &p, FC_REF_F64, o64, l64, kn64));
    FC_ASSERT_OK(fc_ref_kvcache(&a, &p, FC_REF_LOWP, olp, llp, knlp));

    size_t bytes = 0;
    FC_ASSERT_OK(flashc_fwd_kvcache_workspace_size(&a, &p, &bytes));
    void *ws = th_ws_new(bytes);
    flashc_status s = flashc_fwd_kvcache(&a, &p, ws, bytes);
    th_ws_free(ws, bytes);
    FC_ASSERT_OK(s);

    th_check("out", dt, &a.out, o64, olp);
    th_check_masked_rows(l64, (double *)th_keep(ar, th_to_double(&a.out)), B, Sq, H, Dv);
    if (c->lse) th_check("lse", dt, &a.softmax_lse, l64, llp);
    th_check_outside("out", ob, &a.out, 1);
    if (c->lse) th_check_outside("softmax_lse", lb, &a.softmax_lse, 1);

    // ---- the appended rows, and nothing else in the cache ----
    flashc_tensor *kv_rows =
        (flashc_tensor *)th_keep(ar, malloc((size_t)(B * Sn + 1) * 2 * sizeof(flashc_tensor)));
    flashc_tensor *vv_rows = kv_rows + B * Sn + 1;
    double *kgot = th_dbl(ar, nn);
    int64_t vbad = 0, kstrict = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < Sn; t++) {
            int64_t cs = c->seqlens == 1 ? c->cs[0] : c->cs[b], r = cs + t, kofs, vofs;
            const flashc_tensor *kc = &a.k_cache, *vc = &a.v_cache;
            if (bt) {
                int64_t page = bt[b * bt_stride + r / ps];
                kofs = page * kc->stride[0] + (r % ps) * kc->stride[1];
                vofs = page * vc->stride[0] + (r % ps) * vc->stride[1];
            } else {
                int64_t kb = bidx ? bidx[b] : b;
                kofs = kb * kc->stride[0] + r * kc->stride[1];
                vofs = kb * vc->stride[0] + r * vc->stride[1];
            }
            int64_t hd[2] = {Hk, D}, hdv[2] = {Hk, Dv};
            flashc_tensor kr = *kc, vr = *vc;
            kr.data = (char *)kc->data + kofs * (int64_t)flashc_dtype_size(dt);
            vr.data = (char *)vc->data + vofs * (int64_t)flashc_dtype_size(dt);
            kr.ndim = vr.ndim = 2;
            memcpy(kr.shape, hd, sizeof hd);
            memcpy(vr.shape, hdv, sizeof hdv);
            kr.stride[0] = kc->stride[2];
            kr.stride[1] = 1;
            vr.stride[0] = vc->stride[2];
            vr.stride[1] = 1;
            kv_rows[b * Sn + t] = kr;
            vv_rows[b * Sn + t] = vr;
            for (int64_t h = 0; h < Hk; h++)
                for (int64_t d = 0; d < Dv; d++) {
                    double vg = fc_get(vr.data, dt, h * vr.stride[0] + d);
                    double vw = fc_get(a.v_new.data, dt, ((b * Sn + t) * Hk + h) * Dv + d);
                    vbad += vg != vw;
                }
            for (int64_t h = 0; h < Hk; h++)
                for (int64_t d = 0; d < D; d++) {
                    int64_t e = ((b * Sn + t) * Hk + h) * D + d;
                    double kg = fc_get(kr.data, dt, h * kr.stride[0] + d);
                    kgot[e] = kg;
                    /* one rounding of the exactly rotated value (none without rotary) */
                    double tol = c->rotary ? kv_ulp(dt, kn64[e]) + ldexp(1.0, -22) : 0.0;
                    kstrict += !(fabs(kg - kn64[e]) <= tol);
                }
        }
    if (Sn) fc_check_close("appended k rows", dt, kgot, kn64, knlp, nn);
    if (kstrict)
        fc_test_fail(__FILE__, __LINE__,
                     "appended k rows: %lld elements off by more than one rounding",
                     (long long)kstrict);
    if (vbad)
        fc_test_fail(__FILE__, __LINE__, "appended v rows: %lld elements differ from v_new",
                     (long long)vbad);
    th_check_outside("k_cache", kcb, kv_rows, (int)(B * Sn));
    th_check_outside("v_cache", vcb, vv_rows, (int)(B * Sn));
    th_check_outside("q", qb, NULL, 0);
    if (knb->data) th_check_outside("k_new", knb, NULL, 0);
    if (vnb->data) th_check_outside("v_new", vnb, NULL, 0);
    if (cb->data) th_check_outside("rotary_cos", cb, NULL, 0);
    if (sb->data) th_check_outside("rotary_sin", sb, NULL, 0);
}

static void kv_run(const void *param) {
    const kv_case *c = (const kv_case *)param;
    th_env env = {c->simd, c->threads, FLASHC_SIMD_SCALAR};
    if (!th_env_enter(&env)) return;
    th_arena ar = {0};
    kv_body(c, &ar);
    th_arena_free(&ar);
    th_env_leave(&env);
}

// ---- the sweep ----

static kv_case *kv_add(flashc_dtype dt, int B, int Sq, int H, int Hk, int D, int Sc, int page) {
    if (kv_ncases == KV_MAX) return &kv_cases[KV_MAX - 1]; /* table full: grow KV_MAX */
    kv_case *c = &kv_cases[kv_ncases++];
    memset(c, 0, sizeof *c);
    c->dt = dt;
    c->B = B;
    c->Sq = Sq;
    c->H = H;
    c->Hk = Hk;
    c->D = D;
    c->Sc = Sc;
    c->page = page;
    c->o = (th_opts)TH_OPTS_NONE;
    c->lse = 1;
    c->simd = -1;
    return c;
}

static void kv_lens(kv_case *c, int mode, const int *cs, int Snew) {
    c->seqlens = mode;
    for (int b = 0; b < c->B; b++) c->cs[b] = cs[mode == 1 ? 0 : b];
    c->Snew = Snew;
}

static void kv_rope(kv_case *c, int dim, int interleaved, int rot_dtype) {
    c->rotary = dim;
    c->interleaved = interleaved;
    c->rot_dtype = rot_dtype;
}

FC_TEST_REGISTER(kvcache_sweep) {
    const flashc_dtype bf = FLASHC_DTYPE_BF16, hf = FLASHC_DTYPE_FP16, f32 = FLASHC_DTYPE_FP32;
    kv_case *c;

    // ---- contiguous caches ----
    c = kv_add(bf, 2, 1, 4, 1, 128, 257, 0);
    kv_lens(c, 2, (int[]){100, 257}, 0);
    c = kv_add(hf, 3, 1, 2, 2, 64, 113, 0);
    kv_lens(c, 1, (int[]){77}, 0);
    c->lse = 0;
    c = kv_add(f32, 2, 1, 2, 1, 32, 17, 0); /* no cache_seqlens: every row */
    c = kv_add(bf, 2, 1, 8, 2, 128, 257, 0);
    kv_lens(c, 2, (int[]){50, 200}, 1);
    kv_rope(c, 128, 0, 0);
    c->o.causal = 1;
    c = kv_add(hf, 2, 4, 4, 2, 64, 80, 0);
    kv_lens(c, 2, (int[]){10, 60}, 4);
    kv_rope(c, 32, 1, 0);
    c->o.causal = 1;
    c = kv_add(bf, 3, 1, 4, 4, 80, 64, 0);
    kv_lens(c, 2, (int[]){3, 40, 63}, 1);
    kv_rope(c, 80, 1, 1);
    c->batch_idx = 1;
    c = kv_add(f32, 2, 3, 4, 2, 96, 128, 0);
    kv_lens(c, 2, (int[]){40, 90}, 2);
    kv_rope(c, 64, 0, 0);
    c->leftpad = 1;
    c->lp[0] = 3;
    c->lp[1] = 17;
    c->o.wl = 16;
    c->padded = 1;
    c = kv_add(bf, 2, 1, 2, 1, 256, 100, 0);
    kv_lens(c, 2, (int[]){60, 99}, 1);
    c->batch_idx = 1;
    c->leftpad = 1;
    c->lp[0] = 5;
    c->o.softcap = 1.5f;
    c = kv_add(hf, 2, 2, 6, 3, 7, 50, 0);
    kv_lens(c, 2, (int[]){20, 33}, 0);
    c->o.alibi = 1;
    c->o.causal = 1;
    c = kv_add(bf, 2, 5, 4, 1, 160, 64, 0);
    kv_lens(c, 2, (int[]){0, 30}, 5);
    kv_rope(c, 64, 0, 1);
    c->o.alibi = 2;
    c->o.causal = 1;
    c = kv_add(bf, 2, 3, 2, 2, 64, 40, 0); /* rotary without a mask: every q row at cache_seqlens */
    kv_lens(c, 2, (int[]){11, 25}, 2);
    kv_rope(c, 64, 1, 0);
    /* a left edge at the cache's rows is no edge (flash_attn's rule): every q row
       rotated at cache_seqlens, as without a window */
    c = kv_add(bf, 2, 3, 2, 2, 64, 40, 0);
    kv_lens(c, 2, (int[]){11, 25}, 2);
    kv_rope(c, 64, 1, 0);
    c->o.wl = 40;
    c = kv_add(bf, 1, 4, 2, 1, 64, 8, 0); /* empty cache, one new key, 3 rows see nothing */
    kv_lens(c, 2, (int[]){0}, 1);
    c->o.causal = 1;
    c = kv_add(hf, 2, 4, 4, 2, 64, 64, 0);
    kv_lens(c, 2, (int[]){30, 45}, 4);
    kv_rope(c, 48, 0, 0);
    c->o.wl = 8;
    c->o.wr = 2;

    // ---- paged caches ----
    c = kv_add(bf, 2, 1, 4, 2, 64, 40, 1);
    kv_lens(c, 2, (int[]){5, 33}, 1);
    kv_rope(c, 64, 1, 0);
    c = kv_add(hf, 3, 2, 4, 2, 128, 50, 5);
    kv_lens(c, 2, (int[]){12, 0, 37}, 3);
    c->o.causal = 1;
    c = kv_add(bf, 2, 1, 4, 1, 64, 64, 16);
    kv_lens(c, 1, (int[]){40}, 1);
    kv_rope(c, 32, 1, 0);
    c->o.wl = 20;
    c = kv_add(f32, 2, 1, 2, 2, 32, 512, 256);
    kv_lens(c, 2, (int[]){100, 300}, 0);
    c = kv_add(bf, 2, 3, 4, 2, 96, 80, 16);
    kv_lens(c, 2, (int[]){17, 50}, 2);
    c->o.softcap = 1.5f;
    c->o.alibi = 2;
    c->padded = 1;
    c = kv_add(hf, 2, 1, 2, 1, 64, 48, 16); /* no cache_seqlens: every row of every page */
    c = kv_add(f32, 2, 4, 4, 2, 64, 30, 5);
    kv_lens(c, 2, (int[]){7, 23}, 1);
    kv_rope(c, 32, 0, 0);
    c = kv_add(bf, 2, 2, 6, 3, 192, 70, 16);
    kv_lens(c, 2, (int[]){31, 64}, 2);
    kv_rope(c, 192, 0, 1);
    c->o.causal = 1;
    c->o.wl = 10;

    // ---- a long cache under each num_splits ----
    static const int splits[3] = {0, 1, 5};
    for (int i = 0; i < 3; i++) {
        c = kv_add(bf, 1, 1, 4, 1, 128, 1000, i == 2 ? 64 : 0);
        kv_lens(c, 2, (int[]){999}, 1);
        c->num_splits = splits[i];
        if (i == 1) kv_rope(c, 128, 0, 0);
    }

    // ---- every SIMD path with 1 and 2 threads ----
    for (int simd = 0; simd < FLASHC_SIMD_COUNT; simd++)
        for (int t = 1; t <= 2; t++) {
            c = kv_add(bf, 2, 1, 4, 2, 80, 64, 16);
            kv_lens(c, 2, (int[]){20, 47}, 1);
            kv_rope(c, 80, 1, 0);
            c->o.causal = 1;
            c->simd = simd;
            c->threads = t;
            c = kv_add(hf, 2, 4, 4, 1, 64, 64, 0);
            kv_lens(c, 2, (int[]){30, 50}, 2);
            c->leftpad = 1;
            c->lp[0] = 4;
            c->lp[1] = 9;
            c->o.alibi = 1;
            c->o.softcap = 2.0f;
            c->o.causal = 1;
            c->simd = simd;
            c->threads = t;
        }

    // ---- decode through the small-call path and threaded (fwd.c), GQA groups of 3
    // and 4 packed into one task: a paged cache with an append, a contiguous one ----
    c = kv_add(f32, 2, 1, 6, 2, 64, 300, 16);
    kv_lens(c, 2, (int[]){250, 298}, 1);
    c->threads = 2;
    c = kv_add(f32, 2, 1, 6, 2, 64, 20, 4);
    kv_lens(c, 2, (int[]){7, 18}, 1);
    c->threads = 2;
    c = kv_add(bf, 2, 3, 8, 2, 128, 20, 0);
    kv_lens(c, 2, (int[]){10, 17}, 3);
    c->o.causal = 1;
    c->threads = 2;

    // ---- a value head dim Dv other than D: contiguous and paged caches, appends,
    // rotary (over D only), Sq < = > cached keys ----
    c = kv_add(bf, 2, 1, 4, 1, 192, 257, 0);
    c->Dv = 128;
    kv_lens(c, 2, (int[]){100, 257}, 0);
    c = kv_add(hf, 2, 4, 4, 2, 128, 80, 0);
    c->Dv = 192;
    kv_lens(c, 2, (int[]){10, 60}, 4);
    kv_rope(c, 64, 1, 0);
    c->o.causal = 1;
    c = kv_add(f32, 3, 1, 4, 4, 72, 64, 0);
    c->Dv = 40;
    kv_lens(c, 2, (int[]){3, 40, 63}, 1);
    c->batch_idx = 1;
    c->o.softcap = 1.5f;
    c = kv_add(bf, 2, 3, 4, 2, 64, 48, 0);
    c->Dv = 32;
    kv_lens(c, 2, (int[]){40, 30}, 2);
    kv_rope(c, 64, 0, 0);
    c->leftpad = 1;
    c->lp[0] = 3;
    c->lp[1] = 17;
    c->o.alibi = 2;
    c = kv_add(bf, 2, 2, 6, 3, 192, 70, 16);
    c->Dv = 128;
    kv_lens(c, 2, (int[]){31, 64}, 2);
    kv_rope(c, 64, 0, 1);
    c->o.causal = 1;
    c->o.wl = 10;
    c = kv_add(hf, 3, 2, 4, 2, 40, 50, 5);
    c->Dv = 72;
    kv_lens(c, 2, (int[]){12, 0, 37}, 3);
    c->padded = 1;
    c->o.causal = 1;
    c = kv_add(f32, 2, 60, 2, 1, 7, 40, 3); /* Sq > keys: rows with no key */
    c->Dv = 33;
    kv_lens(c, 2, (int[]){5, 20}, 2);
    c->o.causal = 1;
    c = kv_add(bf, 1, 1, 4, 1, 128, 1000, 64);
    c->Dv = 64;
    kv_lens(c, 2, (int[]){999}, 1);
    c->num_splits = 5;
    // ---- head dims past 256 (issue 20): absorbed MLA's 576/512 (rotary over the
    // first 64 of D, as DeepSeek's rope part) and 512, appends, paged and contiguous ----
    c = kv_add(bf, 2, 1, 8, 1, 576, 64, 16);
    c->Dv = 512;
    kv_lens(c, 2, (int[]){20, 47}, 1);
    kv_rope(c, 64, 0, 0);
    c->o.causal = 1;
    c = kv_add(f32, 2, 3, 4, 2, 576, 48, 0);
    c->Dv = 512;
    kv_lens(c, 2, (int[]){10, 30}, 3);
    kv_rope(c, 64, 1, 1);
    c->o.causal = 1;
    c->o.softcap = 1.5f;
    c = kv_add(hf, 2, 2, 4, 2, 512, 40, 8);
    kv_lens(c, 2, (int[]){9, 31}, 2);
    kv_rope(c, 512, 1, 0);
    c->o.causal = 1;
    c->o.wl = 10;
    c = kv_add(bf, 1, 1, 4, 1, 512, 300, 64);
    kv_lens(c, 2, (int[]){299}, 1);
    c->num_splits = 4;
    for (int simd = 0; simd < FLASHC_SIMD_COUNT; simd++)
        for (int t = 1; t <= 2; t++) {
            c = kv_add(simd % 2 ? hf : bf, 2, 2, 4, 2, 192, 64, 16);
            c->Dv = 128;
            kv_lens(c, 2, (int[]){20, 47}, 1);
            kv_rope(c, 64, 1, 0);
            c->o.causal = 1;
            c->simd = simd;
            c->threads = t;
        }

    for (int i = 0; i < kv_ncases; i++) {
        const kv_case *k = &kv_cases[i];
        char name[256];
        size_t len = (size_t)snprintf(name, sizeof name, "kvcache/%s/d%d/b%d/sq%d/h%d:%d/%s%d",
                                      flashc_dtype_name(k->dt), k->D, k->B, k->Sq, k->H, k->Hk,
                                      k->page ? "page" : "contig", k->page ? k->page : k->Sc);
        if (k->Dv) len += (size_t)snprintf(name + len, sizeof name - len, "/dv%d", k->Dv);
        if (k->seqlens == 1)
            len += (size_t)snprintf(name + len, sizeof name - len, "/seqlen%d", k->cs[0]);
        if (k->seqlens == 2) {
            len += (size_t)snprintf(name + len, sizeof name - len, "/seqlens");
            for (int b = 0; b < k->B; b++)
                len +=
                    (size_t)snprintf(name + len, sizeof name - len, "%s%d", b ? "," : "", k->cs[b]);
        }
        if (k->seqlens == 0) len += (size_t)snprintf(name + len, sizeof name - len, "/full");
        if (k->batch_idx) len += (size_t)snprintf(name + len, sizeof name - len, "/batchidx");
        if (k->leftpad)
            len += (size_t)snprintf(name + len, sizeof name - len, "/leftpad%d,%d", k->lp[0],
                                    k->lp[1]);
        if (k->Snew) len += (size_t)snprintf(name + len, sizeof name - len, "/new%d", k->Snew);
        if (k->rotary)
            len += (size_t)snprintf(name + len, sizeof name - len, "/rope%d%s%s", k->rotary,
                                    k->interleaved ? "i" : "", k->rot_dtype ? "lowp" : "");
        if (k->padded) len += (size_t)snprintf(name + len, sizeof name - len, "/padded");
        if (k->num_splits)
            len += (size_t)snprintf(name + len, sizeof name - len, "/splits%d", k->num_splits);
        if (!k->lse) snprintf(name + len, sizeof name - len, "/nolse");
        th_opts_name(name, sizeof name, &k->o);
        th_env_name(name, sizeof name, k->simd, k->threads);
        fc_test_add(name, kv_run, k);
    }
}
