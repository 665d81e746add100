/* test_sink.c : learnable attention sinks (flashc.h, flashc_fwd_args.sink; issue 20)
 * against the float64 reference (tests/support/reference.c) by the tolerance rule
 * of DEVELOPERS.md.
 *
 * Cases: the forward (out, lse, attn_probs) and the backward (dq, dk, dv, dsink)
 * over every dtype, with causal / window / softcap / ALiBi / dropout, GQA and
 * Sq <, =, > Sk (causal with Sq > Sk leaves rows that see no key: out = 0 and
 * lse = s_h exactly), each under every SIMD path the CPU has; varlen forward and
 * backward with an empty sequence; the decode entry point (append, paged cache,
 * GQA); dsink by central differences of the reference and of the library; each
 * run twice and compared bitwise; and bad sink and dsink tensors (the CUDA
 * backend's sinks: tests/gpu/test_gpu_sink.c). Sinks are drawn in [-2, 3) with head
 * 0 at +12 (the sink takes nearly all the mass) and the last head at -30 (none),
 * so that both overflow-prone ends are exercised.
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/reference.h"
#include "fc_test.h"
#include "helpers.h"

// ---- shared ----

/* A sink tensor [H] of dtype dt (fp32, fp16 or bf16: the library reads each) in b:
 * uniform [-2, 3), head 0 at 12, head H-1 at -30. */
static flashc_tensor sk_sink_new(th_buf *b, int64_t H, flashc_dtype dt) {
    flashc_tensor t = th_new(b, dt, 1, (int64_t[]){H}, TH_CONTIG, -2.0, 3.0);
    if (H >= 2) {
        double *s = th_to_double(&t);
        s[0] = 12.0;
        s[H - 1] = -30.0;
        th_store_dense(&t, s);
        free(s);
    }
    return t;
}

/* Every element of got equals first bitwise; else a failure naming what. */
static void sk_same_bits(const char *what, const flashc_tensor *got, const double *first) {
    int64_t diff = th_bits_differ(got, first);
    if (diff)
        fc_test_fail(__FILE__, __LINE__, "%s: %lld elements differ between two runs", what,
                     (long long)diff);
}

/* Rows of the reference that see no key (out row all 0 and lse == s_h) must give
 * exactly out = 0 and lse = s_h. out [B, Sq, H, D], lse [B, H, Sq] dense. */
static int64_t sk_check_empty_rows(const double *o64, const double *l64, const double *out,
                                   const double *lse, const double *sink, int64_t B, int64_t Sq,
                                   int64_t H, int64_t D) {
    int64_t rows = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < Sq; i++) {
                const double *r = o64 + ((b * Sq + i) * H + h) * D;
                bool empty = l64[(b * H + h) * Sq + i] == (double)sink[h];
                for (int64_t d = 0; d < D && empty; d++) empty = r[d] == 0.0;
                if (!empty) continue;
                rows++;
                const double *g = out + ((b * Sq + i) * H + h) * D;
                for (int64_t d = 0; d < D; d++)
                    if (g[d] != 0.0) {
                        fc_test_fail(__FILE__, __LINE__, "row (%lld, %lld, %lld) sees no key but "
                                     "out[%lld] = %g", (long long)b, (long long)i, (long long)h,
                                     (long long)d, g[d]);
                        return rows;
                    }
                if (lse && lse[(b * H + h) * Sq + i] != (double)sink[h]) {
                    fc_test_fail(__FILE__, __LINE__, "row (%lld, %lld, %lld) sees no key but "
                                 "lse = %.9g, not the sink %.9g", (long long)b, (long long)i,
                                 (long long)h, lse[(b * H + h) * Sq + i], (double)sink[h]);
                    return rows;
                }
            }
    return rows;
}

/* The gradients of a backward, poisoned: dq [qs] and dk, dv [ks] (rank nd,
 * dtype dt), dsink fp32 [H]; the reference's answers beside them. */
typedef struct sk_grads {
    flashc_tensor t[4]; /* dq, dk, dv, dsink */
    th_buf *b[4];
    double *r64[4], *rlp[4];
} sk_grads;

static const char *const sk_grad_names[4] = {"dq", "dk", "dv", "dsink"};

static void sk_grads_new(sk_grads *g, th_arena *ar, flashc_dtype dt, int nd, const int64_t *qs,
                         const int64_t *ks, int64_t H) {
    const int64_t *shapes[4] = {qs, ks, ks, (int64_t[]){H}};
    for (int i = 0; i < 4; i++) {
        g->b[i] = th_buf_in(ar);
        g->t[i] = th_new_out(g->b[i], i == 3 ? FLASHC_DTYPE_FP32 : dt, i == 3 ? 1 : nd, shapes[i],
                             i == 1 ? TH_PADDED : TH_CONTIG);
        g->r64[i] = th_dbl(ar, th_numel(&g->t[i]));
        g->rlp[i] = th_dbl(ar, th_numel(&g->t[i]));
    }
}

/* Each gradient against the reference, and nothing written outside it. */
static void sk_grads_check(const sk_grads *g, flashc_dtype dt) {
    for (int i = 0; i < 4; i++) {
        th_check(sk_grad_names[i], dt, &g->t[i], g->r64[i], g->rlp[i]);
        th_check_outside(sk_grad_names[i], g->b[i], &g->t[i], 1);
    }
}

/* Forward args of contiguous q [qs] uniform in [-qr, qr) and k, v [ks] in [-1, 1). */
static flashc_fwd_args sk_fwd_new(th_arena *ar, flashc_dtype dt, const int64_t *qs,
                                  const int64_t *ks, double qr) {
    flashc_fwd_args f;
    memset(&f, 0, sizeof f);
    f.abi = FLASHC_ABI_VERSION;
    f.q = th_new(th_buf_in(ar), dt, 4, qs, TH_CONTIG, -qr, qr);
    f.k = th_new(th_buf_in(ar), dt, 4, ks, TH_CONTIG, -1.0, 1.0);
    f.v = th_new(th_buf_in(ar), dt, 4, ks, TH_CONTIG, -1.0, 1.0);
    return f;
}

/* The backward args of forward f (q, k, v, ALiBi, sink), dout uniform [-1, 1),
 * out and lse the forward's o64 [qs] and l64 [ls] stored in their dtypes. */
static flashc_bwd_args sk_bwd_of(const flashc_fwd_args *f, th_arena *ar, const int64_t *qs,
                                 const int64_t *ls, const double *o64, const double *l64) {
    flashc_bwd_args a;
    memset(&a, 0, sizeof a);
    a.abi = FLASHC_ABI_VERSION;
    a.q = f->q;
    a.k = f->k;
    a.v = f->v;
    a.alibi_slopes = f->alibi_slopes;
    a.sink = f->sink;
    a.dout = th_new(th_buf_in(ar), f->q.dtype, 4, qs, TH_CONTIG, -1.0, 1.0);
    a.out = th_new(th_buf_in(ar), f->q.dtype, 4, qs, TH_CONTIG, 0.0, 0.0);
    a.softmax_lse = th_new(th_buf_in(ar), FLASHC_DTYPE_FP32, 3, ls, TH_CONTIG, 0.0, 0.0);
    th_store_dense(&a.out, o64);
    th_store_dense(&a.softmax_lse, l64);
    return a;
}

// ---- batched forward and backward ----

typedef struct sk_case {
    flashc_dtype dt, sink_dt; /* q's, the sink's */
    int B, Sq, Sk, H, Hk, D;
    th_opts o;
    int simd;
    int bwd;   /* also the backward with dsink */
    int probs; /* request attn_probs */
} sk_case;

enum { SK_MAX = 160 };
static sk_case sk_cases[SK_MAX];
static int sk_ncases;

static void sk_body(const sk_case *c, th_arena *ar) {
    const flashc_dtype dt = c->dt;
    const int64_t B = c->B, Sq = c->Sq, Sk = c->Sk, H = c->H, Hk = c->Hk, D = c->D;
    int64_t qs[4] = {B, Sq, H, D}, ks[4] = {B, Sk, Hk, D}, ls[3] = {B, H, Sq};
    flashc_fwd_args f;
    memset(&f, 0, sizeof f);
    f.abi = FLASHC_ABI_VERSION;
    f.q = th_new(th_buf_in(ar), dt, 4, qs, TH_CONTIG, -3.0, 3.0);
    f.k = th_new(th_buf_in(ar), dt, 4, ks, TH_PADDED, -1.0, 1.0);
    f.v = th_new(th_buf_in(ar), dt, 4, ks, TH_CONTIG, -1.0, 1.0);
    f.alibi_slopes = th_alibi_new(th_buf_in(ar), c->o.alibi, B, H);
    th_buf *sinkb = th_buf_in(ar);
    f.sink = sk_sink_new(sinkb, H, c->sink_dt);
    th_snapshot(sinkb);
    th_buf *ob = th_buf_in(ar), *lb = th_buf_in(ar), *pb = th_buf_in(ar);
    f.out = th_new_out(ob, dt, 4, qs, TH_CONTIG);
    f.softmax_lse = th_new_out(lb, FLASHC_DTYPE_FP32, 3, ls, TH_PADDED);
    if (c->probs)
        f.attn_probs = th_new_out(pb, FLASHC_DTYPE_FP32, 4, (int64_t[]){B, H, Sq, Sk}, TH_CONTIG);
    flashc_params p = th_params(&c->o);
    p.deterministic = 1;

    // ---- forward, twice ----
    size_t bytes = 0;
    FC_ASSERT_OK(flashc_fwd_workspace_size(&f, &p, &bytes));
    double *first_o = NULL, *first_l = NULL;
    for (int run = 0; run < 2; run++) {
        if (run) {
            first_o = (double *)th_keep(ar, th_to_double(&f.out));
            first_l = (double *)th_keep(ar, th_to_double(&f.softmax_lse));
            th_poison(ob, &f.out);
            th_poison(lb, &f.softmax_lse);
        }
        void *ws = th_ws_new(bytes);
        flashc_status s = flashc_fwd(&f, &p, ws, bytes);
        th_ws_free(ws, bytes);
        FC_ASSERT_OK(s);
    }
    sk_same_bits("out", &f.out, first_o);
    sk_same_bits("lse", &f.softmax_lse, first_l);

    int64_t nq = B * Sq * H * D, nl = B * H * Sq, np = nl * Sk;
    double *o64 = th_dbl(ar, nq), *olp = th_dbl(ar, nq), *l64 = th_dbl(ar, nl),
           *llp = th_dbl(ar, nl);
    double *p64 = c->probs ? th_dbl(ar, np) : NULL, *plp = c->probs ? th_dbl(ar, np) : NULL;
    FC_ASSERT_OK(fc_ref_fwd(&f, &p, FC_REF_F64, o64, l64, p64));
    FC_ASSERT_OK(fc_ref_fwd(&f, &p, FC_REF_LOWP, olp, llp, plp));
    th_check("out", dt, &f.out, o64, olp);
    th_check("lse", dt, &f.softmax_lse, l64, llp);
    if (c->probs) th_check("probs", dt, &f.attn_probs, p64, plp);
    sk_check_empty_rows(o64, l64, (double *)th_keep(ar, th_to_double(&f.out)),
                        (double *)th_keep(ar, th_to_double(&f.softmax_lse)),
                        (double *)th_keep(ar, th_to_double(&f.sink)),
                        B, Sq, H, D);
    th_check_outside("out", ob, &f.out, 1);
    th_check_outside("softmax_lse", lb, &f.softmax_lse, 1);
    th_check_outside("sink", sinkb, NULL, 0);
    if (!c->bwd) return;

    // ---- backward: out and lse of the reference, stored in their dtypes ----
    flashc_bwd_args a = sk_bwd_of(&f, ar, qs, ls, o64, l64);
    sk_grads g;
    sk_grads_new(&g, ar, dt, 4, qs, ks, H);
    a.dq = g.t[0];
    a.dk = g.t[1];
    a.dv = g.t[2];
    a.dsink = g.t[3];
    FC_ASSERT_OK(flashc_bwd_workspace_size(&a, &p, &bytes));
    double *first[4];
    for (int run = 0; run < 2; run++) {
        if (run)
            for (int i = 0; i < 4; i++) {
                first[i] = (double *)th_keep(ar, th_to_double(&g.t[i]));
                th_poison(g.b[i], &g.t[i]);
            }
        void *ws = th_ws_new(bytes);
        flashc_status s = flashc_bwd(&a, &p, ws, bytes);
        th_ws_free(ws, bytes);
        FC_ASSERT_OK(s);
    }
    for (int i = 0; i < 4; i++) sk_same_bits(sk_grad_names[i], &g.t[i], first[i]);
    for (int m = 0; m < 2; m++) {
        double **r = m ? g.rlp : g.r64;
        fc_ref_mode mode = m ? FC_REF_LOWP : FC_REF_F64;
        FC_ASSERT_OK(fc_ref_bwd(&a, &p, mode, r[0], r[1], r[2]));
        FC_ASSERT_OK(fc_ref_bwd_dsink(&a, &p, mode, r[3]));
    }
    sk_grads_check(&g, dt);
}

static void sk_run(const void *param) {
    const sk_case *c = (const sk_case *)param;
    th_env env = {c->simd, 0, FLASHC_SIMD_SCALAR};
    if (!th_env_enter(&env)) return;
    th_arena ar = {0};
    sk_body(c, &ar);
    th_arena_free(&ar);
    th_env_leave(&env);
}

FC_TEST_REGISTER(sink_sweep) {
    static const flashc_dtype dts[3] = {FLASHC_DTYPE_BF16, FLASHC_DTYPE_FP16, FLASHC_DTYPE_FP32};
    /* Sq < Sk, =, > (causal: rows without keys), a decode row, long enough for
     * several tiles of the forward (Br 128) and the backward (64 x 128) */
    static const int lens[5][2] = {{17, 45}, {64, 64}, {50, 21}, {1, 77}, {150, 140}};
    static const int heads[3][2] = {{4, 4}, {6, 2}, {4, 1}}; /* MHA, GQA, MQA */
    static const int dims[3] = {32, 64, 40};
    static const char *const dtn[3] = {"bf16", "fp16", "fp32"};
    /* options: none, causal, window, softcap + ALiBi, causal + dropout, window +
     * softcap + ALiBi [B, H] */
    th_opts opts[6];
    for (int i = 0; i < 6; i++) opts[i] = (th_opts)TH_OPTS_NONE;
    opts[1].causal = 1;
    opts[2].wl = 9;
    opts[2].wr = 4;
    opts[3].softcap = 1.5f;
    opts[3].alibi = 1;
    opts[4].causal = 1;
    opts[4].dropout = 0.17f;
    opts[5].wl = 20;
    opts[5].wr = 0;
    opts[5].softcap = 2.0f;
    opts[5].alibi = 2;
    static const int simds[3] = {FLASHC_SIMD_SCALAR, FLASHC_SIMD_AVX2, FLASHC_SIMD_AVX512};
    int n = 0;
    for (int s = 0; s < 3; s++)
        for (int d = 0; d < 3; d++)
            for (int o = 0; o < 6; o++) {
                if (sk_ncases == SK_MAX) return;
                sk_case *c = &sk_cases[sk_ncases++];
                int l = n % 5, hh = (n / 5) % 3;
                n++;
                /* the sink in q's dtype with every other option, else fp32 */
                *c = (sk_case){dts[d], o % 2 ? dts[d] : FLASHC_DTYPE_FP32, 2, lens[l][0],
                               lens[l][1], heads[hh][0], heads[hh][1], dims[(n + s) % 3], opts[o],
                               simds[s], 1, o == 4 || o == 0};
                char name[200];
                snprintf(name, sizeof name, "sink_%s%s_d%d_%dx%d_h%d_%d", dtn[d],
                         c->sink_dt != FLASHC_DTYPE_FP32 ? "_sink16" : "", c->D, c->Sq, c->Sk,
                         c->H, c->Hk);
                th_opts_name(name + strlen(name), sizeof name - strlen(name), &c->o);
                th_env_name(name + strlen(name), sizeof name - strlen(name), c->simd, 0);
                fc_test_add(name, sk_run, c);
            }
}

// ---- varlen ----

/* Varlen forward and backward with a sink: lengths with an empty sequence and
 * causal rows without keys, GQA; against the reference, dsink summed over the
 * sequences. */
static void sk_varlen_body(flashc_dtype dt, int causal, th_arena *ar) {
    enum { B = 4, H = 6, Hk = 3, D = 48 };
    static const int32_t cuq[B + 1] = {0, 30, 30, 37, 107}, cuk[B + 1] = {0, 25, 40, 40, 140};
    const int64_t tq = cuq[B], tk = cuk[B], mq = 70, mk = 100;
    flashc_varlen_fwd_args f;
    memset(&f, 0, sizeof f);
    f.abi = FLASHC_ABI_VERSION;
    f.q = th_new(th_buf_in(ar), dt, 3, (int64_t[]){tq, H, D}, TH_CONTIG, -3.0, 3.0);
    f.k = th_new(th_buf_in(ar), dt, 3, (int64_t[]){tk, Hk, D}, TH_CONTIG, -1.0, 1.0);
    f.v = th_new(th_buf_in(ar), dt, 3, (int64_t[]){tk, Hk, D}, TH_CONTIG, -1.0, 1.0);
    f.cu_seqlens_q = th_new_i32(th_buf_in(ar), 1, B + 1, cuq);
    f.cu_seqlens_k = th_new_i32(th_buf_in(ar), 1, B + 1, cuk);
    f.max_seqlen_q = mq;
    f.max_seqlen_k = mk;
    f.sink = sk_sink_new(th_buf_in(ar), H, dt);
    th_buf *ob = th_buf_in(ar), *lb = th_buf_in(ar);
    f.out = th_new_out(ob, dt, 3, (int64_t[]){tq, H, D}, TH_CONTIG);
    f.softmax_lse = th_new_out(lb, FLASHC_DTYPE_FP32, 2, (int64_t[]){H, tq}, TH_CONTIG);
    th_opts o = TH_OPTS_NONE;
    o.causal = causal;
    o.softcap = causal ? 0.0f : 1.5f;
    flashc_params p = th_params(&o);
    FC_ASSERT_OK(flashc_varlen_fwd(&f, &p, NULL, 0));
    int64_t nq = tq * H * D, nl = H * tq;
    double *o64 = th_dbl(ar, nq), *olp = th_dbl(ar, nq), *l64 = th_dbl(ar, nl), *llp = th_dbl(ar, nl);
    FC_ASSERT_OK(fc_ref_varlen_fwd(&f, &p, FC_REF_F64, o64, l64, NULL));
    FC_ASSERT_OK(fc_ref_varlen_fwd(&f, &p, FC_REF_LOWP, olp, llp, NULL));
    th_check("out", dt, &f.out, o64, olp);
    th_check("lse", dt, &f.softmax_lse, l64, llp);
    th_check_outside("out", ob, &f.out, 1);

    flashc_varlen_bwd_args a;
    memset(&a, 0, sizeof a);
    a.abi = FLASHC_ABI_VERSION;
    a.q = f.q;
    a.k = f.k;
    a.v = f.v;
    a.cu_seqlens_q = f.cu_seqlens_q;
    a.cu_seqlens_k = f.cu_seqlens_k;
    a.max_seqlen_q = mq;
    a.max_seqlen_k = mk;
    a.sink = f.sink;
    a.dout = th_new(th_buf_in(ar), dt, 3, (int64_t[]){tq, H, D}, TH_CONTIG, -1.0, 1.0);
    a.out = th_new(th_buf_in(ar), dt, 3, (int64_t[]){tq, H, D}, TH_CONTIG, 0.0, 0.0);
    a.softmax_lse = th_new(th_buf_in(ar), FLASHC_DTYPE_FP32, 2, (int64_t[]){H, tq}, TH_CONTIG, 0.0, 0.0);
    th_store_dense(&a.out, o64);
    th_store_dense(&a.softmax_lse, l64);
    sk_grads g;
    sk_grads_new(&g, ar, dt, 3, (int64_t[]){tq, H, D}, (int64_t[]){tk, Hk, D}, H);
    a.dq = g.t[0];
    a.dk = g.t[1];
    a.dv = g.t[2];
    a.dsink = g.t[3];
    FC_ASSERT_OK(flashc_varlen_bwd(&a, &p, NULL, 0));
    for (int m = 0; m < 2; m++) {
        double **r = m ? g.rlp : g.r64;
        fc_ref_mode mode = m ? FC_REF_LOWP : FC_REF_F64;
        FC_ASSERT_OK(fc_ref_varlen_bwd(&a, &p, mode, r[0], r[1], r[2]));
        FC_ASSERT_OK(fc_ref_varlen_bwd_dsink(&a, &p, mode, r[3]));
    }
    sk_grads_check(&g, dt);
}

FC_TEST(sink_varlen_bf16_causal) {
    th_arena ar = {0};
    sk_varlen_body(FLASHC_DTYPE_BF16, 1, &ar);
    th_arena_free(&ar);
}

FC_TEST(sink_varlen_fp32_softcap) {
    th_arena ar = {0};
    sk_varlen_body(FLASHC_DTYPE_FP32, 0, &ar);
    th_arena_free(&ar);
}

// ---- kvcache ----

/* Decode with a sink: k_new appended at cache_seqlens, GQA, causal and a
 * window, contiguous or paged; out and lse against the reference (called
 * first: the call appends in place). */
static void sk_kvcache_body(flashc_dtype dt, int paged, int Sq, th_arena *ar) {
    enum { B = 3, H = 8, Hk = 2, D = 64, Sc = 96, Snew = 2, page = 16 };
    static const int32_t seqlens[B] = {0, 37, 90};
    flashc_kvcache_args a;
    memset(&a, 0, sizeof a);
    a.abi = FLASHC_ABI_VERSION;
    a.q = th_new(th_buf_in(ar), dt, 4, (int64_t[]){B, Sq, H, D}, TH_CONTIG, -3.0, 3.0);
    th_buf *kb = th_buf_in(ar), *vb = th_buf_in(ar);
    if (paged) {
        int64_t pages = B * Sc / page;
        a.k_cache = th_new(kb, dt, 4, (int64_t[]){pages, page, Hk, D}, TH_CONTIG, -1.0, 1.0);
        a.v_cache = th_new(vb, dt, 4, (int64_t[]){pages, page, Hk, D}, TH_CONTIG, -1.0, 1.0);
        int32_t bt[B * (Sc / page)];
        for (int i = 0; i < B * (Sc / page); i++) bt[i] = i;
        th_shuffle(bt, B * (Sc / page));
        flashc_tensor t = th_new_i32(th_buf_in(ar), 1, B * (Sc / page), bt);
        t.ndim = 2;
        t.shape[0] = B;
        t.shape[1] = Sc / page;
        t.stride[0] = Sc / page;
        t.stride[1] = 1;
        a.block_table = t;
    } else {
        a.k_cache = th_new(kb, dt, 4, (int64_t[]){B, Sc, Hk, D}, TH_CONTIG, -1.0, 1.0);
        a.v_cache = th_new(vb, dt, 4, (int64_t[]){B, Sc, Hk, D}, TH_CONTIG, -1.0, 1.0);
    }
    a.k_new = th_new(th_buf_in(ar), dt, 4, (int64_t[]){B, Snew, Hk, D}, TH_CONTIG, -1.0, 1.0);
    a.v_new = th_new(th_buf_in(ar), dt, 4, (int64_t[]){B, Snew, Hk, D}, TH_CONTIG, -1.0, 1.0);
    a.cache_seqlens = th_new_i32(th_buf_in(ar), 1, B, seqlens);
    a.sink = sk_sink_new(th_buf_in(ar), H, dt);
    th_buf *ob = th_buf_in(ar), *lb = th_buf_in(ar);
    a.out = th_new_out(ob, dt, 4, (int64_t[]){B, Sq, H, D}, TH_CONTIG);
    a.softmax_lse = th_new_out(lb, FLASHC_DTYPE_FP32, 3, (int64_t[]){B, H, Sq}, TH_CONTIG);
    th_opts o = TH_OPTS_NONE;
    o.causal = 1;
    o.wl = paged ? 20 : -1;
    flashc_params p = th_params(&o);
    int64_t nq = (int64_t)B * Sq * H * D, nl = (int64_t)B * H * Sq;
    double *o64 = th_dbl(ar, nq), *olp = th_dbl(ar, nq), *l64 = th_dbl(ar, nl), *llp = th_dbl(ar, nl);
    FC_ASSERT_OK(fc_ref_kvcache(&a, &p, FC_REF_F64, o64, l64, NULL));
    FC_ASSERT_OK(fc_ref_kvcache(&a, &p, FC_REF_LOWP, olp, llp, NULL));
    FC_ASSERT_OK(flashc_fwd_kvcache(&a, &p, NULL, 0));
    th_check("out", dt, &a.out, o64, olp);
    th_check("lse", dt, &a.softmax_lse, l64, llp);
    sk_check_empty_rows(o64, l64, (double *)th_keep(ar, th_to_double(&a.out)),
                        (double *)th_keep(ar, th_to_double(&a.softmax_lse)),
                        (double *)th_keep(ar, th_to_double(&a.sink)),
                        B, Sq, H, D);
    th_check_outside("out", ob, &a.out, 1);
}

FC_TEST(sink_kvcache_bf16) {
    th_arena ar = {0};
    sk_kvcache_body(FLASHC_DTYPE_BF16, 0, 1, &ar);
    th_arena_free(&ar);
}

FC_TEST(sink_kvcache_fp16_paged_window) {
    th_arena ar = {0};
    sk_kvcache_body(FLASHC_DTYPE_FP16, 1, 3, &ar);
    th_arena_free(&ar);
}

FC_TEST(sink_kvcache_fp32_sq5) {
    th_arena ar = {0};
    sk_kvcache_body(FLASHC_DTYPE_FP32, 0, 5, &ar);
    th_arena_free(&ar);
}

// ---- dsink by finite differences ----

/* dsink of the reference and of the library (fp32) against central
 * differences of L = sum(out * dout) of the reference's forward in s_h, with
 * causal (Sq > Sk: rows without keys), softcap, ALiBi and dropout on. */
FC_TEST(sink_dsink_finite_differences) {
    enum { B = 2, Sq = 9, Sk = 7, H = 4, Hk = 2, D = 8 };
    th_arena ar = {0};
    const int64_t qs[4] = {B, Sq, H, D}, ks[4] = {B, Sk, Hk, D}, ls[3] = {B, H, Sq};
    flashc_fwd_args f = sk_fwd_new(&ar, FLASHC_DTYPE_FP32, qs, ks, 2.0);
    f.alibi_slopes = th_alibi_new(th_buf_in(&ar), 1, B, H);
    f.sink = th_new(th_buf_in(&ar), FLASHC_DTYPE_FP32, 1, (int64_t[]){H}, TH_CONTIG, -1.0, 2.0);
    float *sink = (float *)f.sink.data;
    for (int h = 0; h < H; h++) sink[h] = (float)(floor(sink[h] * 4096.0) / 4096.0); /* x +- 2^-10 exact */
    th_opts o = TH_OPTS_NONE;
    o.causal = 1;
    o.softcap = 1.2f;
    o.dropout = 0.25f;
    flashc_params p = th_params(&o);
    int64_t nq = B * Sq * H * D;
    double *o64 = th_dbl(&ar, nq), *l64 = th_dbl(&ar, B * H * Sq), *dsink = th_dbl(&ar, H);
    FC_ASSERT_OK(fc_ref_fwd(&f, &p, FC_REF_F64, o64, l64, NULL));
    flashc_bwd_args a = sk_bwd_of(&f, &ar, qs, ls, o64, l64);
    a.dq = th_new_out(th_buf_in(&ar), FLASHC_DTYPE_FP32, 4, qs, TH_CONTIG);
    a.dk = th_new_out(th_buf_in(&ar), FLASHC_DTYPE_FP32, 4, ks, TH_CONTIG);
    a.dv = th_new_out(th_buf_in(&ar), FLASHC_DTYPE_FP32, 4, ks, TH_CONTIG);
    a.dsink = th_new_out(th_buf_in(&ar), FLASHC_DTYPE_FP32, 1, (int64_t[]){H}, TH_CONTIG);
    FC_ASSERT_OK(fc_ref_bwd_dsink(&a, &p, FC_REF_F64, dsink));
    FC_ASSERT_OK(flashc_bwd(&a, &p, NULL, 0));
    double *dout = th_to_double(&a.dout);
    th_keep(&ar, dout);
    const double eps = 1.0 / 1024.0;
    double worst = 0.0, worst_lib = 0.0, gmax = 0.0;
    for (int h = 0; h < H; h++) {
        float save = sink[h];
        double L[2];
        for (int s = 0; s < 2; s++) {
            sink[h] = save + (float)(s ? -eps : eps);
            FC_ASSERT_OK(fc_ref_fwd(&f, &p, FC_REF_F64, o64, NULL, NULL));
            L[s] = 0.0;
            for (int64_t i = 0; i < nq; i++) L[s] += o64[i] * dout[i];
        }
        sink[h] = save;
        double fd = (L[0] - L[1]) / (2.0 * eps), lib = ((const float *)a.dsink.data)[h];
        worst = fmax(worst, fabs(fd - dsink[h]));
        worst_lib = fmax(worst_lib, fabs(fd - lib));
        gmax = fmax(gmax, fabs(fd));
    }
    /* central differences with eps = 2^-10 are accurate to ~eps^2 */
    FC_EXPECT_NEAR(worst, 0.0, 1e-5);
    FC_EXPECT_NEAR(worst_lib, 0.0, 1e-4); /* fp32 sums */
    FC_EXPECT_TRUE(gmax > 0.05);
    th_arena_free(&ar);
}

// ---- bad input ----

static void sk_small(flashc_fwd_args *f, flashc_bwd_args *a, th_arena *ar) {
    const int64_t qs[4] = {1, 4, 2, 8}, ls[3] = {1, 2, 4};
    memset(f, 0, sizeof *f);
    memset(a, 0, sizeof *a);
    f->abi = a->abi = FLASHC_ABI_VERSION;
    f->q = th_new(th_buf_in(ar), FLASHC_DTYPE_BF16, 4, qs, TH_CONTIG, -1.0, 1.0);
    f->k = th_new(th_buf_in(ar), FLASHC_DTYPE_BF16, 4, qs, TH_CONTIG, -1.0, 1.0);
    f->v = th_new(th_buf_in(ar), FLASHC_DTYPE_BF16, 4, qs, TH_CONTIG, -1.0, 1.0);
    f->out = th_new_out(th_buf_in(ar), FLASHC_DTYPE_BF16, 4, qs, TH_CONTIG);
    f->softmax_lse = th_new_out(th_buf_in(ar), FLASHC_DTYPE_FP32, 3, ls, TH_CONTIG);
    f->sink = th_new(th_buf_in(ar), FLASHC_DTYPE_FP32, 1, (int64_t[]){2}, TH_CONTIG, -1.0, 1.0);
    a->dq = th_new_out(th_buf_in(ar), FLASHC_DTYPE_BF16, 4, qs, TH_CONTIG);
    a->dk = th_new_out(th_buf_in(ar), FLASHC_DTYPE_BF16, 4, qs, TH_CONTIG);
    a->dv = th_new_out(th_buf_in(ar), FLASHC_DTYPE_BF16, 4, qs, TH_CONTIG);
    a->dsink = th_new_out(th_buf_in(ar), FLASHC_DTYPE_FP32, 1, (int64_t[]){2}, TH_CONTIG);
    /* the backward reads the forward's tensors: q stands in for out and dout */
    a->q = f->q;
    a->k = f->k;
    a->v = f->v;
    a->out = f->q;
    a->dout = f->q;
    a->softmax_lse = f->softmax_lse;
    a->sink = f->sink;
}

/* The decode args of forward f: q over a cache of f's k and v, with its sink. */
static flashc_kvcache_args sk_kv_of(const flashc_fwd_args *f) {
    flashc_kvcache_args kv;
    memset(&kv, 0, sizeof kv);
    kv.abi = FLASHC_ABI_VERSION;
    kv.q = f->q;
    kv.k_cache = f->k;
    kv.v_cache = f->v;
    kv.out = f->out;
    kv.sink = f->sink;
    return kv;
}

static void sk_expect_refused(flashc_status s, flashc_status want, const char *part) {
    FC_EXPECT_STATUS(s, want);
    if (!strstr(flashc_last_error(), part))
        fc_test_fail(__FILE__, __LINE__, "message \"%s\" lacks \"%s\"", flashc_last_error(), part);
}

FC_TEST(sink_bad_input) {
    th_arena ar = {0};
    flashc_fwd_args f;
    flashc_bwd_args a;
    flashc_params p = flashc_params_default();
    /* a sink of the wrong length, rank and dtype; nothing written */
    sk_small(&f, &a, &ar);
    f.sink.shape[0] = 3;
    sk_expect_refused(flashc_fwd(&f, &p, NULL, 0), FLASHC_ERR_INVALID_ARG, "sink.shape[0]=3");
    f.sink.shape[0] = 2;
    f.sink.dtype = FLASHC_DTYPE_INT32;
    sk_expect_refused(flashc_fwd(&f, &p, NULL, 0), FLASHC_ERR_INVALID_ARG,
                      "sink.dtype=int32 but must be fp32, fp16 or bf16");
    f.sink.dtype = FLASHC_DTYPE_FP32;
    f.sink.ndim = 2;
    f.sink.shape[1] = 1;
    f.sink.stride[1] = 1;
    sk_expect_refused(flashc_fwd(&f, &p, NULL, 0), FLASHC_ERR_INVALID_ARG, "sink");
    const float *o = (const float *)f.out.data;
    FC_EXPECT_TRUE(o != NULL && isnan(((const float *)f.softmax_lse.data)[0]));
    /* dsink without sink, dsink of the wrong length */
    a.sink.data = NULL;
    sk_expect_refused(flashc_bwd(&a, &p, NULL, 0), FLASHC_ERR_INVALID_ARG, "sink is absent");
    a.sink = f.sink;
    a.sink.ndim = 1;
    a.dsink.shape[0] = 4;
    sk_expect_refused(flashc_bwd(&a, &p, NULL, 0), FLASHC_ERR_INVALID_ARG, "dsink.shape[0]=4");
    a.dsink.shape[0] = 2;
    a.dsink.dtype = FLASHC_DTYPE_BF16; /* the gradient is fp32, whatever the sink's dtype */
    sk_expect_refused(flashc_bwd(&a, &p, NULL, 0), FLASHC_ERR_INVALID_ARG,
                      "dsink.dtype=bf16 but must be fp32");
    FC_EXPECT_TRUE(isnan(((const float *)a.dsink.data)[0]));
    /* kvcache: a sink of the wrong length */
    flashc_kvcache_args kv = sk_kv_of(&f);
    kv.sink.ndim = 1;
    kv.sink.shape[0] = 1;
    sk_expect_refused(flashc_fwd_kvcache(&kv, &p, NULL, 0), FLASHC_ERR_INVALID_ARG, "sink.shape[0]=1");
    th_arena_free(&ar);
}

/* Every row sees one key (window 0, 0) and the sink holds ~5e-4 of the mass:
 * P ~ 0.9995 is above FC_ONE_KEY_P, but dS = P (1 - P) dP is not 0, so the
 * backward's one-key rule (dS = 0) must be off with a sink. */
FC_TEST(sink_one_key_rows) {
    enum { B = 1, S = 24, H = 2, D = 16 };
    th_arena ar = {0};
    const int64_t qs[4] = {B, S, H, D}, ls[3] = {B, H, S};
    flashc_fwd_args f = sk_fwd_new(&ar, FLASHC_DTYPE_FP32, qs, qs, 0.01);
    f.sink = th_new(th_buf_in(&ar), FLASHC_DTYPE_FP32, 1, (int64_t[]){H}, TH_CONTIG, -7.6, -7.5);
    th_opts o = TH_OPTS_NONE;
    o.wl = 0;
    o.wr = 0;
    flashc_params p = th_params(&o);
    int64_t n = B * S * H * D;
    double *o64 = th_dbl(&ar, n), *l64 = th_dbl(&ar, B * H * S);
    FC_ASSERT_OK(fc_ref_fwd(&f, &p, FC_REF_F64, o64, l64, NULL));
    flashc_bwd_args a = sk_bwd_of(&f, &ar, qs, ls, o64, l64);
    a.dq = th_new_out(th_buf_in(&ar), FLASHC_DTYPE_FP32, 4, qs, TH_CONTIG);
    a.dk = th_new_out(th_buf_in(&ar), FLASHC_DTYPE_FP32, 4, qs, TH_CONTIG);
    a.dv = th_new_out(th_buf_in(&ar), FLASHC_DTYPE_FP32, 4, qs, TH_CONTIG);
    FC_ASSERT_OK(flashc_bwd(&a, &p, NULL, 0));
    double *r64[3] = {th_dbl(&ar, n), th_dbl(&ar, n), th_dbl(&ar, n)};
    double *rlp[3] = {th_dbl(&ar, n), th_dbl(&ar, n), th_dbl(&ar, n)};
    FC_ASSERT_OK(fc_ref_bwd(&a, &p, FC_REF_F64, r64[0], r64[1], r64[2]));
    FC_ASSERT_OK(fc_ref_bwd(&a, &p, FC_REF_LOWP, rlp[0], rlp[1], rlp[2]));
    th_check("dq", FLASHC_DTYPE_FP32, &a.dq, r64[0], rlp[0]);
    th_check("dk", FLASHC_DTYPE_FP32, &a.dk, r64[1], rlp[1]);
    th_check("dv", FLASHC_DTYPE_FP32, &a.dv, r64[2], rlp[2]);
    th_arena_free(&ar);
}

/* dq, dk, dv and dsink are bitwise the same for 1 and 5 threads (the fused and
 * the two-pass schedules of bwd.c; dsink is summed per (b, h), then over b in
 * order, whatever the schedule). */
FC_TEST(sink_bwd_thread_counts) {
    enum { B = 3, Sq = 70, Sk = 90, H = 4, Hk = 2, D = 32 };
    th_arena ar = {0};
    const int64_t qs[4] = {B, Sq, H, D}, ks[4] = {B, Sk, Hk, D}, ls[3] = {B, H, Sq};
    flashc_fwd_args f = sk_fwd_new(&ar, FLASHC_DTYPE_BF16, qs, ks, 3.0);
    f.sink = sk_sink_new(th_buf_in(&ar), H, FLASHC_DTYPE_BF16);
    th_opts o = TH_OPTS_NONE;
    o.causal = 1;
    flashc_params p = th_params(&o);
    double *o64 = th_dbl(&ar, B * Sq * H * D), *l64 = th_dbl(&ar, B * H * Sq);
    FC_ASSERT_OK(fc_ref_fwd(&f, &p, FC_REF_F64, o64, l64, NULL));
    flashc_bwd_args a = sk_bwd_of(&f, &ar, qs, ls, o64, l64);
    sk_grads g;
    sk_grads_new(&g, &ar, FLASHC_DTYPE_BF16, 4, qs, ks, H);
    a.dq = g.t[0];
    a.dk = g.t[1];
    a.dv = g.t[2];
    a.dsink = g.t[3];
    int saved = flashc_get_num_threads();
    double *first[4];
    for (int run = 0; run < 2; run++) {
        flashc_set_num_threads(run ? 5 : 1);
        if (run)
            for (int i = 0; i < 4; i++) {
                first[i] = (double *)th_keep(&ar, th_to_double(&g.t[i]));
                th_poison(g.b[i], &g.t[i]);
            }
        flashc_status s = flashc_bwd(&a, &p, NULL, 0);
        if (s != FLASHC_OK) flashc_set_num_threads(saved);
        FC_ASSERT_OK(s);
    }
    flashc_set_num_threads(saved);
    for (int i = 0; i < 4; i++) sk_same_bits(sk_grad_names[i], &g.t[i], first[i]);
    th_arena_free(&ar);
}
