/* test_hdim.c : head dims past 256 on the CPU backend (issue 20: Gemma-style 512,
 * DeepSeek's absorbed MLA with D = 576 and Dv = 512), against the float64
 * reference by the tolerance rule of DEVELOPERS.md.
 *
 * Cases: (D, Dv) in {(512, 512), (576, 512), (512, 64), (64, 512), (320, 320),
 * (385, 385), (384, 200), (1024, 1024)} x the option cycle (causal, windows,
 * softcap, ALiBi, dropout, combinations) x dtypes x (Sq, Sk) from {(7, 33),
 * (33, 7), (40, 40), (1, 64)} x GQA 1 or 2, picked so every pair of values
 * meets; each under one SIMD path and thread count in turn, half of them with
 * a learnable sink. Each case runs the forward (out and lse, rows that see no
 * key exactly 0 and -inf) and the backward twice from the reference's out and
 * lse (dq, dk, dv and dsink, bitwise equal run to run). hdim_schedules: one
 * KV head and 1 then 5 threads, so the second backward takes bwd.c's two-pass
 * schedule and must match the fused one bit for bit. A decode case
 * (flashc_fwd_kvcache: an append into a paged cache, GQA) at (576, 512) and
 * (512, 512). The limit itself (1025 refused) is in test_bad_input.c.
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "support/reference.h"
#include "fc_test.h"
#include "helpers.h"

typedef struct hd_case {
    flashc_dtype dt;
    int B, Sq, Sk, H, Hk, D, Dv;
    th_opts o;
    int simd, threads;
    int threads2; /* > 0: the second backward runs on this many threads */
    int sink;     /* a learnable sink (fp32 [H]) and its gradient dsink */
} hd_case;

enum { HD_MAX = 48 };
static hd_case hd_cases[HD_MAX];
static int hd_ncases;

static void hd_body(const hd_case *c, th_arena *ar) {
    const flashc_dtype dt = c->dt;
    const int64_t B = c->B, Sq = c->Sq, Sk = c->Sk, H = c->H, Hk = c->Hk, D = c->D, Dv = c->Dv;
    const int64_t qs[4] = {B, Sq, H, D}, ks[4] = {B, Sk, Hk, D}, vs[4] = {B, Sk, Hk, Dv},
                  os[4] = {B, Sq, H, Dv}, ls[3] = {B, H, Sq};
    flashc_params p = th_params(&c->o);

    // ---- forward ----
    flashc_fwd_args f;
    memset(&f, 0, sizeof f);
    f.abi = FLASHC_ABI_VERSION;
    f.q = th_new(th_buf_in(ar), dt, 4, qs, TH_CONTIG, -3.0, 3.0);
    f.k = th_new(th_buf_in(ar), dt, 4, ks, TH_PADDED, -1.0, 1.0);
    f.v = th_new(th_buf_in(ar), dt, 4, vs, TH_CONTIG, -1.0, 1.0);
    f.alibi_slopes = th_alibi_new(th_buf_in(ar), c->o.alibi, B, H);
    if (c->sink) { /* one sink above every score, one far below, the rest in between */
        f.sink = th_new(th_buf_in(ar), FLASHC_DTYPE_FP32, 1, (int64_t[]){H}, TH_CONTIG, -2.0, 3.0);
        ((float *)f.sink.data)[0] = 12.0f;
        ((float *)f.sink.data)[H - 1] = -30.0f;
    }
    th_buf *ob = th_buf_in(ar);
    f.out = th_new_out(ob, dt, 4, os, TH_CONTIG);
    f.softmax_lse = th_new_out(th_buf_in(ar), FLASHC_DTYPE_FP32, 3, ls, TH_CONTIG);
    size_t bytes = 0;
    FC_ASSERT_OK(flashc_fwd_workspace_size(&f, &p, &bytes));
    void *ws = th_ws_new(bytes);
    flashc_status s = flashc_fwd(&f, &p, ws, bytes);
    th_ws_free(ws, bytes);
    FC_ASSERT_OK(s);
    const int64_t no = B * Sq * H * Dv, nl = B * H * Sq;
    double *o64 = th_dbl(ar, no), *olp = th_dbl(ar, no), *l64 = th_dbl(ar, nl),
           *llp = th_dbl(ar, nl);
    FC_ASSERT_OK(fc_ref_fwd(&f, &p, FC_REF_F64, o64, l64, NULL));
    FC_ASSERT_OK(fc_ref_fwd(&f, &p, FC_REF_LOWP, olp, llp, NULL));
    th_check("out", dt, &f.out, o64, olp);
    th_check("lse", dt, &f.softmax_lse, l64, llp);
    th_check_masked_rows(l64, (double *)th_keep(ar, th_to_double(&f.out)), B, Sq, H, Dv);
    th_check_outside("out", ob, &f.out, 1);

    // ---- backward, twice, from the reference's out and lse (as test_bwd.c) ----
    th_store_dense(&f.out, o64);
    th_store_dense(&f.softmax_lse, l64);
    flashc_bwd_args a;
    memset(&a, 0, sizeof a);
    a.abi = FLASHC_ABI_VERSION;
    a.q = f.q, a.k = f.k, a.v = f.v, a.out = f.out, a.softmax_lse = f.softmax_lse;
    a.alibi_slopes = f.alibi_slopes;
    a.sink = f.sink;
    a.dout = th_new(th_buf_in(ar), dt, 4, os, TH_CONTIG, -1.0, 1.0);
    th_buf *gb[4] = {th_buf_in(ar), th_buf_in(ar), th_buf_in(ar), NULL};
    a.dq = th_new_out(gb[0], dt, 4, qs, TH_CONTIG);
    a.dk = th_new_out(gb[1], dt, 4, ks, TH_PADDED);
    a.dv = th_new_out(gb[2], dt, 4, vs, TH_CONTIG);
    gb[3] = th_buf_in(ar);
    if (c->sink) a.dsink = th_new_out(gb[3], FLASHC_DTYPE_FP32, 1, (int64_t[]){H}, TH_CONTIG);
    flashc_tensor *g[4] = {&a.dq, &a.dk, &a.dv, &a.dsink};
    static const char *const names[4] = {"dq", "dk", "dv", "dsink"};
    const int ng = c->sink ? 4 : 3;
    double *first[4] = {NULL, NULL, NULL, NULL};
    for (int run = 0; run < 2; run++) {
        if (run) {
            for (int i = 0; i < ng; i++) {
                first[i] = (double *)th_keep(ar, th_to_double(g[i]));
                th_poison(gb[i], g[i]);
            }
            if (c->threads2) flashc_set_num_threads(c->threads2);
        }
        /* sized per run: the schedule, and so the workspace, follows the thread count */
        FC_ASSERT_OK(flashc_bwd_workspace_size(&a, &p, &bytes));
        ws = th_ws_new(bytes);
        s = flashc_bwd(&a, &p, ws, bytes);
        th_ws_free(ws, bytes);
        FC_ASSERT_OK(s);
    }
    const int64_t n[4] = {B * Sq * H * D, B * Sk * Hk * D, B * Sk * Hk * Dv, H};
    double *r64[4], *rlp[4];
    for (int i = 0; i < 4; i++) {
        r64[i] = th_dbl(ar, n[i]);
        rlp[i] = th_dbl(ar, n[i]);
    }
    FC_ASSERT_OK(fc_ref_bwd(&a, &p, FC_REF_F64, r64[0], r64[1], r64[2]));
    FC_ASSERT_OK(fc_ref_bwd(&a, &p, FC_REF_LOWP, rlp[0], rlp[1], rlp[2]));
    if (c->sink) {
        FC_ASSERT_OK(fc_ref_bwd_dsink(&a, &p, FC_REF_F64, r64[3]));
        FC_ASSERT_OK(fc_ref_bwd_dsink(&a, &p, FC_REF_LOWP, rlp[3]));
    }
    for (int i = 0; i < ng; i++) {
        int64_t diff = th_bits_differ(g[i], first[i]);
        if (diff)
            fc_test_fail(__FILE__, __LINE__, "%s: %lld elements differ between two runs", names[i],
                         (long long)diff);
        th_check(names[i], dt, g[i], r64[i], rlp[i]);
        th_check_outside(names[i], gb[i], g[i], 1);
    }
}

static void hd_run(const void *param);

/* Register case c under prefix_<dtype>_d<D>_dv<Dv>_<Sq>x<Sk>_h<H>k<Hk>, then
 * the options, sink, SIMD path and threads. */
static void hd_add(const hd_case *c, const char *prefix) {
    char name[200];
    int m = snprintf(name, sizeof name, "%s_%s_d%d_dv%d_%dx%d_h%dk%d%s", prefix,
                     flashc_dtype_name(c->dt), c->D, c->Dv, c->Sq, c->Sk, c->H, c->Hk,
                     c->sink ? "_sink" : "");
    th_opts_name(name + m, sizeof name - (size_t)m, &c->o);
    m = (int)strlen(name);
    th_env_name(name + m, sizeof name - (size_t)m, c->simd, c->threads);
    if (c->threads2) {
        m = (int)strlen(name);
        snprintf(name + m, sizeof name - (size_t)m, "_then_t%d", c->threads2);
    }
    fc_test_add(name, hd_run, c);
}

static void hd_run(const void *param) {
    const hd_case *c = (const hd_case *)param;
    th_env env = {c->simd, c->threads, FLASHC_SIMD_SCALAR};
    if (!th_env_enter(&env)) return;
    th_arena ar = {0};
    hd_body(c, &ar);
    th_arena_free(&ar);
    th_env_leave(&env);
}

FC_TEST_REGISTER(hdim_sweep) {
    static const int dims[8][2] = {{512, 512}, {576, 512}, {512, 64},  {64, 512},
                                   {320, 320}, {385, 385}, {384, 200}, {1024, 1024}};
    static const int lens[4][2] = {{7, 33}, {33, 7}, {40, 40}, {1, 64}};
    static const flashc_dtype dts[3] = {FLASHC_DTYPE_BF16, FLASHC_DTYPE_FP16, FLASHC_DTYPE_FP32};
    /* -1: the best path the CPU has */
    static const int simds[4] = {-1, FLASHC_SIMD_SCALAR, FLASHC_SIMD_AVX2, FLASHC_SIMD_AVX512};
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 4; j++) {
            hd_case *c = &hd_cases[hd_ncases++];
            memset(c, 0, sizeof *c);
            const int k = 4 * i + j, l = (i + 3 * j) % 4;
            c->dt = dts[(i + j) % 3];
            c->D = dims[i][0];
            c->Dv = dims[i][1];
            c->Sq = lens[l][0];
            c->Sk = lens[l][1];
            c->B = 1 + (j % 2);
            c->Hk = 2;
            c->H = (i + j) % 2 ? 4 : 2;
            c->o = th_option_cycle(k, (th_windows){9, 5, 12, 3, 10, 20});
            c->simd = simds[(i + 2 * j) % 4];
            c->threads = 1 + (k % 2);
            c->sink = j == 0 || j == 3;
            hd_add(c, "hdim");
        }
}

/* The fused and the two-pass backward at D > 256: B * Hk = 1 task, so 5
 * threads take the two-pass schedule (bwd.c:fc_bwd_use_fused); Sq, Sk = 70
 * span two tiles of each (64 x 64 here). */
FC_TEST_REGISTER(hdim_schedules) {
    static const int dims[3][2] = {{512, 512}, {576, 512}, {385, 385}};
    static const flashc_dtype dts[3] = {FLASHC_DTYPE_BF16, FLASHC_DTYPE_FP16, FLASHC_DTYPE_FP32};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) {
            hd_case *c = &hd_cases[hd_ncases++];
            memset(c, 0, sizeof *c);
            c->dt = dts[(i + j) % 3];
            c->D = dims[i][0];
            c->Dv = dims[i][1];
            c->B = 1;
            c->Sq = 70 - 20 * (j == 1);
            c->Sk = 70;
            c->H = 2 + 2 * (j == 2);
            c->Hk = 1;
            c->o = th_option_cycle(3 * i + j, (th_windows){9, 5, 12, 3, 10, 20});
            c->simd = -1;
            c->threads = 1;
            c->threads2 = 5;
            c->sink = j != 1;
            hd_add(c, "hdim_sched");
        }
}

/* A decode step: q [2, 1 or 3, 8, D] over a paged cache (pages of 16, shuffled
 * into a pool with spare pages) after appending two rows, GQA 8:2, causal. The
 * reference runs on the contiguous copy of the cache after the append. */
static void hd_kv_run(const void *param) {
    const int *dd = (const int *)param;
    const int64_t B = 2, Sq = dd[2], H = 8, Hk = 2, D = dd[0], Dv = dd[1], page = 16, Snew = 2;
    const int64_t used[2] = {21, 40}, cap = 64, pps = cap / page, pages = B * pps + 3;
    const flashc_dtype dt = FLASHC_DTYPE_BF16;
    th_arena ar = {0};
    const int64_t qs[4] = {B, Sq, H, D}, os[4] = {B, Sq, H, Dv}, ns[4] = {B, Snew, Hk, D},
                  nvs[4] = {B, Snew, Hk, Dv}, kcs[4] = {pages, page, Hk, D},
                  vcs[4] = {pages, page, Hk, Dv}, bts[2] = {B, pps}, ls[3] = {B, H, Sq};
    flashc_kvcache_args kv;
    memset(&kv, 0, sizeof kv);
    kv.abi = FLASHC_ABI_VERSION;
    kv.q = th_new(th_buf_in(&ar), dt, 4, qs, TH_CONTIG, -3.0, 3.0);
    kv.k_cache = th_new(th_buf_in(&ar), dt, 4, kcs, TH_CONTIG, -1.0, 1.0);
    kv.v_cache = th_new(th_buf_in(&ar), dt, 4, vcs, TH_CONTIG, -1.0, 1.0);
    kv.k_new = th_new(th_buf_in(&ar), dt, 4, ns, TH_CONTIG, -1.0, 1.0);
    kv.v_new = th_new(th_buf_in(&ar), dt, 4, nvs, TH_CONTIG, -1.0, 1.0);
    kv.block_table = th_new(th_buf_in(&ar), FLASHC_DTYPE_INT32, 2, bts, TH_CONTIG, 0.0, 0.0);
    kv.cache_seqlens = th_new(th_buf_in(&ar), FLASHC_DTYPE_INT32, 1, (int64_t[]){B}, TH_CONTIG,
                              0.0, 0.0);
    int32_t perm[2 * 4 + 3];
    for (int i = 0; i < pages; i++) perm[i] = i;
    th_shuffle(perm, pages);
    memcpy(kv.block_table.data, perm, (size_t)(B * pps) * 4);
    for (int b = 0; b < B; b++) ((int32_t *)kv.cache_seqlens.data)[b] = (int32_t)used[b];
    kv.out = th_new_out(th_buf_in(&ar), dt, 4, os, TH_CONTIG);
    kv.softmax_lse = th_new_out(th_buf_in(&ar), FLASHC_DTYPE_FP32, 3, ls, TH_CONTIG);
    flashc_params p = flashc_params_default();
    p.causal = 1;

    /* the reference per sequence, on K, V rows gathered from the pages (the rows
     * in use before the append), then k_new, v_new; f64 and the baseline */
    const size_t es = 2;
    double *r_out[2], *r_lse[2];
    for (int b = 0; b < B; b++) {
        const int64_t Sk = used[b] + Snew, kss[4] = {1, Sk, Hk, D}, vss[4] = {1, Sk, Hk, Dv},
                      q1[4] = {1, Sq, H, D};
        flashc_fwd_args f;
        memset(&f, 0, sizeof f);
        f.abi = FLASHC_ABI_VERSION;
        f.q = th_new(th_buf_in(&ar), dt, 4, q1, TH_CONTIG, 0.0, 0.0);
        f.k = th_new(th_buf_in(&ar), dt, 4, kss, TH_CONTIG, 0.0, 0.0);
        f.v = th_new(th_buf_in(&ar), dt, 4, vss, TH_CONTIG, 0.0, 0.0);
        memcpy(f.q.data, (char *)kv.q.data + (size_t)(b * Sq * H * D) * es,
               (size_t)(Sq * H * D) * es);
        for (int64_t j = 0; j < Sk; j++) {
            /* row j: cache row j % page of page perm[...], or row j - used of the append */
            const bool old = j < used[b];
            const int64_t row = old ? perm[b * pps + j / page] * page + j % page
                                    : b * Snew + j - used[b];
            const char *ks = old ? kv.k_cache.data : kv.k_new.data;
            const char *vs = old ? kv.v_cache.data : kv.v_new.data;
            memcpy((char *)f.k.data + (size_t)(j * Hk * D) * es, ks + (size_t)(row * Hk * D) * es,
                   (size_t)(Hk * D) * es);
            memcpy((char *)f.v.data + (size_t)(j * Hk * Dv) * es, vs + (size_t)(row * Hk * Dv) * es,
                   (size_t)(Hk * Dv) * es);
        }
        r_out[b] = th_dbl(&ar, 2 * Sq * H * Dv);
        r_lse[b] = th_dbl(&ar, 2 * H * Sq);
        FC_ASSERT_OK(fc_ref_fwd(&f, &p, FC_REF_F64, r_out[b], r_lse[b], NULL));
        FC_ASSERT_OK(
            fc_ref_fwd(&f, &p, FC_REF_LOWP, r_out[b] + Sq * H * Dv, r_lse[b] + H * Sq, NULL));
    }
    size_t bytes = 0;
    FC_ASSERT_OK(flashc_fwd_kvcache_workspace_size(&kv, &p, &bytes));
    void *ws = th_ws_new(bytes);
    flashc_status s = flashc_fwd_kvcache(&kv, &p, ws, bytes);
    th_ws_free(ws, bytes);
    FC_ASSERT_OK(s);
    /* out [B, Sq, H, Dv] and lse [B, H, Sq] as dense doubles, checked per sequence */
    const double *go = (double *)th_keep(&ar, th_to_double(&kv.out));
    const double *gl = (double *)th_keep(&ar, th_to_double(&kv.softmax_lse));
    for (int b = 0; b < B; b++) {
        fc_check_close("out", dt, go + b * Sq * H * Dv, r_out[b], r_out[b] + Sq * H * Dv,
                       Sq * H * Dv);
        fc_check_close("lse", dt, gl + b * H * Sq, r_lse[b], r_lse[b] + H * Sq, H * Sq);
    }
    th_arena_free(&ar);
}

static int hd_kv_dims[4][3] = {{576, 512, 1}, {576, 512, 3}, {512, 512, 1}, {512, 512, 3}};

FC_TEST_REGISTER(hdim_kvcache) {
    for (int i = 0; i < 4; i++) {
        char name[96];
        snprintf(name, sizeof name, "hdim_kvcache_d%d_dv%d_q%d_paged16_g4", hd_kv_dims[i][0],
                 hd_kv_dims[i][1], hd_kv_dims[i][2]);
        fc_test_add(name, hd_kv_run, hd_kv_dims[i]);
    }
}

/* The CUDA backend refuses D = 512, MLA's 576/512 and a value head dim past its
 * instances (128/320) in every entry point and query with
 * FLASHC_ERR_UNSUPPORTED, before any workspace or launch: the size queries
 * leave *bytes alone. Runs where CUDA is compiled in and a device is usable;
 * the tensors are host buffers labelled as device memory, which nothing reads
 * because every call stops first (the GPU suite, tests/gpu/test_gpu_edge.c,
 * runs the same on device memory). */
FC_TEST(hdim_cuda_refused) {
    if (!flashc_backend_available(FLASHC_BACKEND_CUDA)) return;
    static const int dims[3][2] = {{512, 512}, {576, 512}, {128, 320}};
    for (int i = 0; i < 3; i++) {
        const int64_t D = dims[i][0], Dv = dims[i][1];
        char why[96];
        snprintf(why, sizeof why, "%s=%lld but the CUDA backend's",
                 Dv > D ? "the value head_dim (v.shape[-1])" : "head_dim",
                 (long long)(Dv > D ? Dv : D));
        const int64_t qs[4] = {1, 4, 2, D}, vs[4] = {1, 4, 2, Dv}, ls[3] = {1, 2, 4},
                      q0[4] = {1, 0, 2, D}, o0[4] = {1, 0, 2, Dv}, ns[4] = {1, 1, 2, D},
                      nvs[4] = {1, 1, 2, Dv};
        const flashc_dtype bf = FLASHC_DTYPE_BF16;
        th_arena ar = {0};
        flashc_fwd_args f = FLASHC_ARGS_INIT;
        f.q = th_new(th_buf_in(&ar), bf, 4, qs, TH_CONTIG, -1.0, 1.0);
        f.k = th_new(th_buf_in(&ar), bf, 4, qs, TH_CONTIG, -1.0, 1.0);
        f.v = th_new(th_buf_in(&ar), bf, 4, vs, TH_CONTIG, -1.0, 1.0);
        f.out = th_new_out(th_buf_in(&ar), bf, 4, vs, TH_CONTIG);
        f.softmax_lse = th_new_out(th_buf_in(&ar), FLASHC_DTYPE_FP32, 3, ls, TH_CONTIG);
        flashc_bwd_args a = FLASHC_ARGS_INIT;
        a.dq = th_new_out(th_buf_in(&ar), bf, 4, qs, TH_CONTIG);
        a.dk = th_new_out(th_buf_in(&ar), bf, 4, qs, TH_CONTIG);
        a.dv = th_new_out(th_buf_in(&ar), bf, 4, vs, TH_CONTIG);
        /* decode over the cache (k, v), and an append alone (no query row) */
        flashc_kvcache_args kv = FLASHC_ARGS_INIT, ap = FLASHC_ARGS_INIT;
        ap.q = th_new(th_buf_in(&ar), bf, 4, q0, TH_CONTIG, 0.0, 0.0);
        ap.out = th_new_out(th_buf_in(&ar), bf, 4, o0, TH_CONTIG);
        ap.k_new = th_new(th_buf_in(&ar), bf, 4, ns, TH_CONTIG, -1.0, 1.0);
        ap.v_new = th_new(th_buf_in(&ar), bf, 4, nvs, TH_CONTIG, -1.0, 1.0);
        ap.cache_seqlens = th_new(th_buf_in(&ar), FLASHC_DTYPE_INT32, 1, (int64_t[]){1}, TH_CONTIG,
                                  0.0, 0.0);
        *(int32_t *)ap.cache_seqlens.data = 2; /* two of the 4 rows in use: room to append */
        flashc_tensor *all[] = {&f.q,   &f.k,    &f.v,      &f.out,   &f.softmax_lse,
                                &a.dq,  &a.dk,   &a.dv,     &ap.q,    &ap.out,
                                &ap.k_new, &ap.v_new, &ap.cache_seqlens};
        for (size_t t = 0; t < sizeof all / sizeof all[0]; t++) all[t]->device = FLASHC_DEVICE_CUDA;
        a.q = f.q, a.k = f.k, a.v = f.v, a.out = f.out, a.dout = f.out;
        a.softmax_lse = f.softmax_lse;
        kv.q = f.q, kv.k_cache = f.k, kv.v_cache = f.v, kv.out = f.out;
        ap.k_cache = f.k, ap.v_cache = f.v;
        flashc_params p = flashc_params_default();
        const flashc_status UNS = FLASHC_ERR_UNSUPPORTED;
        size_t bytes = 777; /* the size queries must leave it */
        TH_EXPECT_REFUSED(flashc_fwd_supported(&f, &p), UNS, &bytes, why);
        TH_EXPECT_REFUSED(flashc_fwd_workspace_size(&f, &p, &bytes), UNS, &bytes, why);
        TH_EXPECT_REFUSED(flashc_fwd(&f, &p, NULL, 0), UNS, &bytes, why);
        TH_EXPECT_REFUSED(flashc_bwd_supported(&a, &p), UNS, &bytes, why);
        TH_EXPECT_REFUSED(flashc_bwd_workspace_size(&a, &p, &bytes), UNS, &bytes, why);
        TH_EXPECT_REFUSED(flashc_bwd(&a, &p, NULL, 0), UNS, &bytes, why);
        TH_EXPECT_REFUSED(flashc_fwd_kvcache_supported(&kv, &p), UNS, &bytes, why);
        TH_EXPECT_REFUSED(flashc_fwd_kvcache_workspace_size(&kv, &p, &bytes), UNS, &bytes, why);
        TH_EXPECT_REFUSED(flashc_fwd_kvcache(&kv, &p, NULL, 0), UNS, &bytes, why);
        TH_EXPECT_REFUSED(flashc_fwd_kvcache_supported(&ap, &p), UNS, &bytes, why);
        TH_EXPECT_REFUSED(flashc_fwd_kvcache(&ap, &p, NULL, 0), UNS, &bytes, why);
        th_arena_free(&ar);
    }
}
