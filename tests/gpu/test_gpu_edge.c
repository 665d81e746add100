/* test_gpu_edge.c : test_edge.c's edge semantics on the CUDA backend, each on
 * every kernel family (FLASHC_CUDA_FAMILY "auto": on Hopper for D > 32 the
 * sm90ws forward and the sm90 backward; "sm90": the sm90 forward; "sm80"):
 * - rows that see exactly one key (seqlen_k = 1 with ALiBi [B, H]; the window
 *   (0, 0)), with dropout: dq and dk exactly 0;
 * - a NaN in q: NaN out, lse and dq of its row and dk, dv of the keys it sees,
 *   every other row and head exact;
 * - params.scale_given = 1 with softmax_scale = 0: uniform attention.
 * And a problem the CUDA backend refuses (fp32, attn_probs; head dims past 256):
 * every entry point's *_supported and *_workspace_size give the run's status
 * and message.
 * The GPU forward's out and lse feed the GPU backward; all are checked against
 * the float64 reference on host copies (DEVELOPERS.md's rule, NaN-aware).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../support/reference.h"
#include "../fc_test.h"
#include "../helpers.h" /* th_edge, th_nan_head */
#include "gpu_helpers.h"

static void ge_run(const void *param) {
    const th_edge *c = (const th_edge *)param;
    const flashc_dtype dt = c->dt, f32 = FLASHC_DTYPE_FP32;
    const int64_t B = c->B, Sq = c->Sq, Sk = c->Sk, H = c->H, D = c->D;
    const int64_t nq = B * Sq * H * D, nk = B * Sk * H * D, nl = B * H * Sq;
    const size_t es = flashc_dtype_size(dt);
    gb_family fam;
    gb_family_enter(&fam, c->family);
    gb_arena ar = {0};
    flashc_params p = th_edge_params(c);
    gb_buf *qb = gb_new(&ar, (size_t)nq * es), *kb = gb_new(&ar, (size_t)nk * es);
    gb_buf *vb = gb_new(&ar, (size_t)nk * es), *dob = gb_new(&ar, (size_t)nq * es);
    gb_buf *ob = gb_new(&ar, (size_t)nq * es), *lb = gb_new(&ar, (size_t)nl * 4);
    gb_buf *dqb = gb_new(&ar, (size_t)nq * es), *dkb = gb_new(&ar, (size_t)nk * es);
    gb_buf *dvb = gb_new(&ar, (size_t)nk * es), *ab = gb_new(&ar, (size_t)(B * H) * 4);
    if (!qb || !kb || !vb || !dob || !ob || !lb || !dqb || !dkb || !dvb || !ab) goto done;
    gb_fill(qb, dt, -3.0, 3.0);
    gb_fill(kb, dt, -1.0, 1.0);
    gb_fill(vb, dt, -1.0, 1.0);
    gb_fill(dob, dt, -1.0, 1.0);
    for (int64_t i = 0; i < B * H; i++) ((float *)ab->h)[i] = (float)fc_rand_uniform(0.01, 0.6);
    if (c->nan_q) fc_poison((char *)qb->h + ((Sq / 2) * H + H - 1) * D * es, dt, 1);
    if (!gb_upload(qb) || !gb_upload(kb) || !gb_upload(vb) || !gb_upload(dob) || !gb_upload(ab) ||
        !gb_poison(ob) || !gb_poison(lb) || !gb_poison(dqb) || !gb_poison(dkb) || !gb_poison(dvb))
        goto done;
    {
        int64_t qs[4] = {B, Sq, H, D}, ks[4] = {B, Sk, H, D}, ls[3] = {B, H, Sq}, as[2] = {B, H};
        int64_t qst[4], kst[4], lst[3], ast[2] = {H, 1};
        gb_contig_strides(4, qs, qst);
        gb_contig_strides(4, ks, kst);
        gb_contig_strides(3, ls, lst);
        flashc_bwd_args x[2];
        flashc_fwd_args f[2];
        for (int dev = 0; dev < 2; dev++) {
            flashc_bwd_args *a = &x[dev];
            memset(a, 0, sizeof *a);
            a->abi = FLASHC_ABI_VERSION;
            a->q = gb_view(qb, dev, dt, 0, 4, qs, qst);
            a->k = gb_view(kb, dev, dt, 0, 4, ks, kst);
            a->v = gb_view(vb, dev, dt, 0, 4, ks, kst);
            a->dout = gb_view(dob, dev, dt, 0, 4, qs, qst);
            a->out = gb_view(ob, dev, dt, 0, 4, qs, qst);
            a->softmax_lse = gb_view(lb, dev, f32, 0, 3, ls, lst);
            a->dq = gb_view(dqb, dev, dt, 0, 4, qs, qst);
            a->dk = gb_view(dkb, dev, dt, 0, 4, ks, kst);
            a->dv = gb_view(dvb, dev, dt, 0, 4, ks, kst);
            if (c->alibi) a->alibi_slopes = gb_view(ab, dev, f32, 0, 2, as, ast);
            memset(&f[dev], 0, sizeof f[dev]);
            f[dev].abi = FLASHC_ABI_VERSION;
            f[dev].q = a->q, f[dev].k = a->k, f[dev].v = a->v, f[dev].out = a->out;
            f[dev].softmax_lse = a->softmax_lse, f[dev].alibi_slopes = a->alibi_slopes;
        }
        size_t fb = 0, bb = 0;
        GB_OK(flashc_fwd_workspace_size(&f[1], &p, &fb));
        void *fws = gb_ws(&ar, fb);
        if (fb && !fws) goto done;
        GB_OK(flashc_fwd(&f[1], &p, fws, fb));
        GB_OK(flashc_bwd_workspace_size(&x[1], &p, &bb));
        void *bws = gb_ws(&ar, bb);
        if (bb && !bws) goto done;
        GB_OK(flashc_bwd(&x[1], &p, bws, bb));
        if (!gb_sync() || !gb_download(ob) || !gb_download(lb) || !gb_download(dqb) ||
            !gb_download(dkb) || !gb_download(dvb))
            goto done;
        const int64_t n[5] = {nq, nl, nq, nk, nk};
        static const char *const names[5] = {"out", "softmax_lse", "dq", "dk", "dv"};
        const flashc_tensor *got[5] = {&x[0].out, &x[0].softmax_lse, &x[0].dq, &x[0].dk, &x[0].dv};
        double *r[5], *l[5], *g[5];
        for (int i = 0; i < 5; i++) {
            r[i] = gb_dbl(&ar, n[i]), l[i] = gb_dbl(&ar, n[i]), g[i] = gb_dbl(&ar, n[i]);
            if (!r[i] || !l[i] || !g[i]) goto done;
            fc_tensor_to_double(got[i], g[i]);
        }
        GB_OK(fc_ref_fwd(&f[0], &p, FC_REF_F64, r[0], r[1], NULL));
        GB_OK(fc_ref_fwd(&f[0], &p, FC_REF_LOWP, l[0], l[1], NULL));
        GB_OK(fc_ref_bwd(&x[0], &p, FC_REF_F64, r[2], r[3], r[4]));
        GB_OK(fc_ref_bwd(&x[0], &p, FC_REF_LOWP, l[2], l[3], l[4]));
        if (c->nan_q)
            for (int i = 3; i < 5; i++)
                th_nan_head(names[i], g[i], r[i], l[i], Sq, Sk, H, D, c->wl, c->wr);
        for (int i = 0; i < 5; i++) fc_check_close(names[i], i == 1 ? f32 : dt, g[i], r[i], l[i], n[i]);
        if (c->one_key)
            for (int i = 2; i < 4; i++) {
                int64_t nz = 0;
                for (int64_t e = 0; e < n[i]; e++) nz += g[i][e] != 0.0;
                if (nz)
                    fc_test_fail(__FILE__, __LINE__, "%s: %lld nonzero elements, all must be 0 "
                                 "(one visible key per row)", names[i], (long long)nz);
            }
    }
done:
    gb_free(&ar);
    gb_family_leave(&fam);
}

#define BF FLASHC_DTYPE_BF16
#define HF FLASHC_DTYPE_FP16
static const th_edge ge_shapes[] = {
    {NULL, HF, 1, 339, 1, 12, 59, -1, -1, 0.17f, 1, .one_key = 1},
    {NULL, BF, 1, 339, 1, 12, 192, -1, -1, 0.17f, 1, .one_key = 1},
    {NULL, BF, 2, 140, 140, 3, 64, 0, 0, 0.17f, 0, .one_key = 1},
    {NULL, HF, 2, 130, 130, 2, 128, 0, 0, 0.17f, 1, .one_key = 1},
    {NULL, BF, 2, 77, 300, 3, 128, -1, -1, 0.0f, 0, .nan_q = 1},
    {NULL, HF, 1, 90, 200, 2, 256, 30, 2, 0.0f, 1, .nan_q = 1},
    {NULL, BF, 2, 100, 150, 2, 64, -1, -1, 0.0f, 0, .scale_zero = 1},
    {NULL, HF, 1, 64, 64, 3, 128, 5, 0, 0.0f, 1, .scale_zero = 1},
};
#undef BF
#undef HF
#define GE_N (sizeof ge_shapes / sizeof ge_shapes[0])
static th_edge ge_cases[3 * GE_N];

/* The queries never answer OK for a call the run refuses: fp32 tensors, on
 * the device, at every entry point; nothing written. (attn_probs, refused
 * here once, runs on CUDA now: test_gpu_probs.c.) */
FC_TEST(gpu_edge_refused_queries) {
    gb_arena ar;
    memset(&ar, 0, sizeof ar);
    const int64_t B = 1, S = 16, H = 2, D = 64;
    const int64_t qs[4] = {B, S, H, D}, ls[3] = {B, H, S};
    int64_t qst[4], lst[3];
    gb_contig_strides(4, qs, qst);
    gb_contig_strides(3, ls, lst);
    const size_t n = (size_t)(B * S * H * D) * 4;
    gb_buf *q = gb_new(&ar, n), *k = gb_new(&ar, n), *v = gb_new(&ar, n), *o = gb_new(&ar, n),
           *lse = gb_new(&ar, (size_t)(B * H * S) * 4);
    if (!lse) goto done;
    const flashc_dtype dt = FLASHC_DTYPE_FP32;
    flashc_fwd_args f = FLASHC_ARGS_INIT;
    f.q = gb_view(q, 1, dt, 0, 4, qs, qst);
    f.k = gb_view(k, 1, dt, 0, 4, qs, qst);
    f.v = gb_view(v, 1, dt, 0, 4, qs, qst);
    f.out = gb_view(o, 1, dt, 0, 4, qs, qst);
    f.softmax_lse = gb_view(lse, 1, FLASHC_DTYPE_FP32, 0, 3, ls, lst);
    size_t bytes = 777;
    FC_EXPECT_STATUS(flashc_fwd_supported(&f, NULL), FLASHC_ERR_UNSUPPORTED);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", flashc_last_error());
    FC_EXPECT_STATUS(flashc_fwd_workspace_size(&f, NULL, &bytes), FLASHC_ERR_UNSUPPORTED);
    FC_EXPECT_TRUE(bytes == 777 && strcmp(msg, flashc_last_error()) == 0);
    FC_EXPECT_STATUS(flashc_fwd(&f, NULL, NULL, 0), FLASHC_ERR_UNSUPPORTED);
    FC_EXPECT_TRUE(strcmp(msg, flashc_last_error()) == 0);
    flashc_bwd_args b = FLASHC_ARGS_INIT;
    b.q = f.q, b.k = f.k, b.v = f.v, b.out = f.out, b.softmax_lse = f.softmax_lse;
    b.dout = f.q, b.dq = f.out, b.dk = f.k, b.dv = f.v;
    FC_EXPECT_STATUS(flashc_bwd_supported(&b, NULL), FLASHC_ERR_UNSUPPORTED);
    FC_EXPECT_STATUS(flashc_bwd_workspace_size(&b, NULL, &bytes), FLASHC_ERR_UNSUPPORTED);
    FC_EXPECT_TRUE(bytes == 777);
    flashc_kvcache_args kv = FLASHC_ARGS_INIT;
    kv.q = f.q, kv.k_cache = f.k, kv.v_cache = f.v, kv.out = f.out;
    FC_EXPECT_STATUS(flashc_fwd_kvcache_supported(&kv, NULL), FLASHC_ERR_UNSUPPORTED);
    FC_EXPECT_STATUS(flashc_fwd_kvcache_workspace_size(&kv, NULL, &bytes), FLASHC_ERR_UNSUPPORTED);
    FC_EXPECT_TRUE(bytes == 777);
done:
    gb_free(&ar);
}

/* Head dims past 256 (issue 20; the CPU backend takes them): D = 512, MLA's
 * 576/512 and a value head dim of 320 with D = 128 on device memory under each
 * family setting, refused with
 * FLASHC_ERR_UNSUPPORTED by every query and run of the forward, the backward,
 * a decode step and an append alone (no query row): the size queries leave
 * *bytes alone and the poisoned outputs and cache stay poisoned. */
FC_TEST(gpu_edge_head_dim_512_refused) {
    static const int dims[3][2] = {{512, 512}, {576, 512}, {128, 320}};
    static const char *const fams[2] = {"auto", "sm80"};
    const flashc_dtype bf = FLASHC_DTYPE_BF16;
    for (int i = 0; i < 6; i++) {
        const int64_t D = dims[i % 3][0], Dv = dims[i % 3][1], S = 4, H = 2;
        char why[96];
        snprintf(why, sizeof why, "%s=%lld but the CUDA backend's",
                 Dv > D ? "the value head_dim (v.shape[-1])" : "head_dim",
                 (long long)(Dv > D ? Dv : D));
        const int64_t qs[4] = {1, S, H, D}, vs[4] = {1, S, H, Dv}, ls[3] = {1, H, S},
                      q0[4] = {1, 0, H, D}, o0[4] = {1, 0, H, Dv}, ns[4] = {1, 1, H, D},
                      nvs[4] = {1, 1, H, Dv}, one[1] = {1};
        int64_t qst[4], vst[4], lst[3], q0t[4], o0t[4], nst[4], nvst[4], onet[1];
        gb_contig_strides(4, qs, qst);
        gb_contig_strides(4, vs, vst);
        gb_contig_strides(3, ls, lst);
        gb_contig_strides(4, q0, q0t);
        gb_contig_strides(4, o0, o0t);
        gb_contig_strides(4, ns, nst);
        gb_contig_strides(4, nvs, nvst);
        gb_contig_strides(1, one, onet);
        gb_family fam;
        gb_family_enter(&fam, fams[i / 3]);
        gb_arena ar;
        memset(&ar, 0, sizeof ar);
        const size_t nq = (size_t)(S * H * D) * 2, nv = (size_t)(S * H * Dv) * 2;
        gb_buf *q = gb_new(&ar, nq), *k = gb_new(&ar, nq), *v = gb_new(&ar, nv),
               *o = gb_new(&ar, nv), *lse = gb_new(&ar, (size_t)(H * S) * 4),
               *dq = gb_new(&ar, nq), *dk = gb_new(&ar, nq), *dv = gb_new(&ar, nv),
               *kn = gb_new(&ar, (size_t)(H * D) * 2), *vn = gb_new(&ar, (size_t)(H * Dv) * 2),
               *cs = gb_new(&ar, 4);
        if (!cs) goto done;
        gb_buf *in[3] = {q, kn, vn}, *outs[7] = {o, lse, dq, dk, dv, k, v};
        for (int b = 0; b < 3; b++) {
            gb_fill(in[b], bf, -1.0, 1.0);
            if (!gb_upload(in[b])) goto done;
        }
        *(int32_t *)cs->h = 2; /* two of the S rows in use: room for the append */
        if (!gb_upload(cs)) goto done;
        for (int b = 0; b < 7; b++)
            if (!gb_poison(outs[b])) goto done;
        {
            flashc_fwd_args f = FLASHC_ARGS_INIT;
            f.q = gb_view(q, 1, bf, 0, 4, qs, qst);
            f.k = gb_view(k, 1, bf, 0, 4, qs, qst);
            f.v = gb_view(v, 1, bf, 0, 4, vs, vst);
            f.out = gb_view(o, 1, bf, 0, 4, vs, vst);
            f.softmax_lse = gb_view(lse, 1, FLASHC_DTYPE_FP32, 0, 3, ls, lst);
            flashc_bwd_args a = FLASHC_ARGS_INIT;
            a.q = f.q, a.k = f.k, a.v = f.v, a.out = f.out, a.dout = f.out;
            a.softmax_lse = f.softmax_lse;
            a.dq = gb_view(dq, 1, bf, 0, 4, qs, qst);
            a.dk = gb_view(dk, 1, bf, 0, 4, qs, qst);
            a.dv = gb_view(dv, 1, bf, 0, 4, vs, vst);
            flashc_kvcache_args kv = FLASHC_ARGS_INIT, ap = FLASHC_ARGS_INIT;
            kv.q = f.q, kv.k_cache = f.k, kv.v_cache = f.v, kv.out = f.out;
            ap.q = gb_view(q, 1, bf, 0, 4, q0, q0t);
            ap.out = gb_view(o, 1, bf, 0, 4, o0, o0t);
            ap.k_cache = f.k, ap.v_cache = f.v;
            ap.k_new = gb_view(kn, 1, bf, 0, 4, ns, nst);
            ap.v_new = gb_view(vn, 1, bf, 0, 4, nvs, nvst);
            ap.cache_seqlens = gb_view(cs, 1, FLASHC_DTYPE_INT32, 0, 1, one, onet);
            const flashc_status UNS = FLASHC_ERR_UNSUPPORTED;
            size_t bytes = 777; /* the size queries must leave it */
            TH_EXPECT_REFUSED(flashc_fwd_supported(&f, NULL), UNS, &bytes, why);
            TH_EXPECT_REFUSED(flashc_fwd_workspace_size(&f, NULL, &bytes), UNS, &bytes, why);
            TH_EXPECT_REFUSED(flashc_fwd(&f, NULL, NULL, 0), UNS, &bytes, why);
            TH_EXPECT_REFUSED(flashc_bwd_supported(&a, NULL), UNS, &bytes, why);
            TH_EXPECT_REFUSED(flashc_bwd_workspace_size(&a, NULL, &bytes), UNS, &bytes, why);
            TH_EXPECT_REFUSED(flashc_bwd(&a, NULL, NULL, 0), UNS, &bytes, why);
            TH_EXPECT_REFUSED(flashc_fwd_kvcache_supported(&kv, NULL), UNS, &bytes, why);
            TH_EXPECT_REFUSED(flashc_fwd_kvcache_workspace_size(&kv, NULL, &bytes), UNS, &bytes,
                              why);
            TH_EXPECT_REFUSED(flashc_fwd_kvcache(&kv, NULL, NULL, 0), UNS, &bytes, why);
            TH_EXPECT_REFUSED(flashc_fwd_kvcache_supported(&ap, NULL), UNS, &bytes, why);
            TH_EXPECT_REFUSED(flashc_fwd_kvcache(&ap, NULL, NULL, 0), UNS, &bytes, why);
        }
        if (!gb_sync()) goto done;
        for (int b = 0; b < 7; b++) {
            if (!gb_download(outs[b])) goto done;
            const unsigned char *h = (const unsigned char *)outs[b]->h;
            for (size_t e = 0; e < outs[b]->bytes; e++)
                if (h[e] != 0xff) {
                    fc_test_fail(__FILE__, __LINE__, "output %d (out, lse, dq, dk, dv, k_cache, "
                                 "v_cache) written at byte %zu", b, e);
                    break;
                }
        }
    done:
        gb_free(&ar);
        gb_family_leave(&fam);
    }
}

FC_TEST_REGISTER(gpu_edge) {
    static const char *const fams[3] = {"auto", "sm90", "sm80"};
    for (int f = 0; f < 3; f++)
        for (size_t i = 0; i < GE_N; i++) {
            th_edge *c = &ge_cases[f * GE_N + i];
            *c = ge_shapes[i];
            c->family = fams[f];
            char name[128];
            th_edge_name(name, sizeof name, "gpu_edge_", c);
            fc_test_add(name, ge_run, c);
        }
}
