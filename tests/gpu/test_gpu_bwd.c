/* test_gpu_bwd.c : the CUDA backward against the float64 reference.
 *
 * Every case uploads random q, k, v, dout (uniform in [-1, 1)), runs the GPU
 * forward for out and softmax_lse, poisons dq, dk, dv with NaN, runs the GPU
 * backward, and checks dq, dk, dv with DEVELOPERS.md's tolerance rule against
 * fc_ref_bwd / fc_ref_varlen_bwd (float64 and the same-precision baseline) on
 * host copies of the same inputs (the reference recomputes the softmax).
 *
 * Cases:
 * - the sweep: dtype {bf16, fp16} x D {32, 64, 80 (zero-padded), 96, 128,
 *   160, 192, 224, 256} x the 13 option sets of th_option_cycle (causal,
 *   windows, softcap, ALiBi [H] and [B, H], dropout, combinations), with
 *   (Sq, Sk) from {(1, 1), (17, 113), (113, 17), (300, 300), (1000, 1000),
 *   (2049, 1000)} and GQA ratios 1, 2, 3 picked so every pair of values meets;
 * - deterministic mode: the same inputs 50 times, dq, dk, dv bitwise equal
 *   run to run (and correct), causal and not, with GQA, D 64, 128 (dropout),
 *   256;
 * - varlen with an empty query sequence and an empty key sequence, causal and
 *   not, GQA, packed views (qkvpacked strides);
 * - operands the kernels cannot read in place: D in {7, 36, 100} and a
 *   misaligned dq / dk;
 * - the GQA split of the sm90 kernel forced to 1, 2 and G (gpu_bwd_kv_split,
 *   below); every other case runs it as the rule picks;
 * - the warp-specialised sm90 kernel (the default on Hopper; gpu_bwd_ws
 *   below, FLASHC_CUDA_BWD_WS=1 set): its ring of query blocks wrapping, Sq
 *   not a multiple of Br, each head dim's row, options, deterministic runs,
 *   the GQA split with the dQ writer, varlen with NaN rows past the last
 *   sequence; the launch line must name sm90ws_bwd_kernel on Hopper; and
 *   gpu_bwd_ws_switch: unset or =1 names sm90ws, =0 sm90_bwd_kernel. Every
 *   other case here runs on the older sm90 kernel when the whole suite runs
 *   under FLASHC_CUDA_BWD_WS=0;
 * - the GQA split's rule (gpu_bwd_kv_split's split_rule_ cases): the launch
 *   line names the split it must pick, causal (key-major grid) and windowed.
 *
 * Build: this file + gpu_helpers.c + tests/helpers.c + tests/run.c, linked with
 * flashc_static and cudart. Needs a CUDA device of compute capability >= 8.0.
 * `flashc_gpu_tests gpu_bwd_bf16_d64` is the short set for compute-sanitizer.
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../support/reference.h"
#include "../fc_test.h"
#include "../helpers.h" /* th_option_cycle, th_params */
#include "gpu_helpers.h"

typedef struct {
    flashc_dtype dt;
    int64_t b, sq, sk, h, hk, d;
    th_opts o;
    int deterministic; /* runs: 1, or 50 for the bitwise race test */
    int misalign;      /* dq and dk one element past their buffers' starts */
    int split;         /* FLASHC_CUDA_BWD_SPLIT for the case, 0: the environment's (the rule) */
    int ws;            /* GBW_WS_*: FLASHC_CUDA_BWD_WS, the launch line checked */
    int want_split;    /* > 0: the sm90 family's launch line must say kv_split=want_split */
} gbw_case;

#define GBW_MAX_CASES 320
static gbw_case gbw_cases[GBW_MAX_CASES];
static int gbw_ncases;

static flashc_params gbw_params(const gbw_case *c) {
    flashc_params p = th_params(&c->o);
    if (p.softmax_scale == 0.0f) p.softmax_scale = (float)(2.0 / sqrt((double)c->d));
    p.deterministic = c->deterministic > 0;
    return p;
}

/* The references of dq, dk, dv (float64 and the baseline) and room for the
 * GPU's results as doubles, n[i] elements each, owned by the arena. */
typedef struct {
    double *r[3], *l[3], *g[3];
} gbw_refs;

static void gbw_refs_new(gb_arena *ar, const int64_t n[3], gbw_refs *rf) {
    for (int i = 0; i < 3; i++) {
        rf->r[i] = gb_dbl(ar, n[i]);
        rf->l[i] = gb_dbl(ar, n[i]);
        rf->g[i] = gb_dbl(ar, n[i]);
    }
}

/* The tolerance rule on the downloaded (host-side) dq, dk, dv views. */
static void gbw_check3(gbw_refs *rf, flashc_dtype dt, const flashc_tensor *dq,
                       const flashc_tensor *dk, const flashc_tensor *dv, const int64_t n[3]) {
    const flashc_tensor *got[3] = {dq, dk, dv};
    static const char *const names[3] = {"dq", "dk", "dv"};
    for (int i = 0; i < 3; i++) {
        fc_tensor_to_double(got[i], rf->g[i]);
        fc_check_close(names[i], dt, rf->g[i], rf->r[i], rf->l[i], n[i]);
    }
}

static void gbw_run_batched(const void *param) {
    const gbw_case *c = (const gbw_case *)param;
    const flashc_dtype dt = c->dt;
    const int64_t B = c->b, Sq = c->sq, Sk = c->sk, H = c->h, Hk = c->hk, D = c->d;
    const size_t es = flashc_dtype_size(dt);
    const int64_t nq = B * Sq * H * D, nk = B * Sk * Hk * D;
    const int64_t mis = c->misalign ? 1 : 0;
    gb_arena ar = {0};
    flashc_params p = gbw_params(c);

    gb_buf *qb = gb_new(&ar, (size_t)nq * es), *kb = gb_new(&ar, (size_t)nk * es);
    gb_buf *vb = gb_new(&ar, (size_t)nk * es), *dob = gb_new(&ar, (size_t)nq * es);
    gb_buf *ob = gb_new(&ar, (size_t)nq * es), *lb = gb_new(&ar, (size_t)(B * H * Sq) * 4);
    gb_buf *dqb = gb_new(&ar, (size_t)(nq + mis) * es), *dkb = gb_new(&ar, (size_t)(nk + mis) * es);
    gb_buf *dvb = gb_new(&ar, (size_t)nk * es);
    gb_buf *ab = c->o.alibi ? gb_new(&ar, (size_t)(B * H) * 4) : NULL;
    gb_buf *save = c->deterministic > 1 ? gb_new(&ar, (size_t)(2 * nq + 2 * nk + 2) * es) : NULL;
    if (!qb || !kb || !vb || !dob || !ob || !lb || !dqb || !dkb || !dvb || (c->o.alibi && !ab) ||
        (c->deterministic > 1 && !save))
        goto done;
    gb_fill(qb, dt, -1.0, 1.0);
    gb_fill(kb, dt, -1.0, 1.0);
    gb_fill(vb, dt, -1.0, 1.0);
    gb_fill(dob, dt, -1.0, 1.0);
    if (ab) {
        float *s = (float *)ab->h;
        for (int64_t i = 0; i < B * H; i++) s[i] = (float)fc_rand_uniform(0.01, 0.6);
    }
    if (!gb_upload(qb) || !gb_upload(kb) || !gb_upload(vb) || !gb_upload(dob) ||
        (ab && !gb_upload(ab)) || !gb_poison(ob) || !gb_poison(lb))
        goto done;

    int64_t qs[4] = {B, Sq, H, D}, ks[4] = {B, Sk, Hk, D}, ls[3] = {B, H, Sq};
    int64_t qst[4], kst[4], lst[3], ash[2] = {B, H}, ast[2] = {H, 1};
    gb_contig_strides(4, qs, qst);
    gb_contig_strides(4, ks, kst);
    gb_contig_strides(3, ls, lst);
    flashc_bwd_args da, ha;
    memset(&da, 0, sizeof da);
    da.abi = FLASHC_ABI_VERSION;
    memset(&ha, 0, sizeof ha);
    ha.abi = FLASHC_ABI_VERSION;
    for (int dev = 0; dev < 2; dev++) {
        flashc_bwd_args *x = dev ? &da : &ha;
        x->q = gb_view(qb, dev, dt, 0, 4, qs, qst);
        x->k = gb_view(kb, dev, dt, 0, 4, ks, kst);
        x->v = gb_view(vb, dev, dt, 0, 4, ks, kst);
        x->dout = gb_view(dob, dev, dt, 0, 4, qs, qst);
        x->out = gb_view(ob, dev, dt, 0, 4, qs, qst);
        x->softmax_lse = gb_view(lb, dev, FLASHC_DTYPE_FP32, 0, 3, ls, lst);
        x->dq = gb_view(dqb, dev, dt, mis, 4, qs, qst);
        x->dk = gb_view(dkb, dev, dt, mis, 4, ks, kst);
        x->dv = gb_view(dvb, dev, dt, 0, 4, ks, kst);
        if (ab)
            x->alibi_slopes = c->o.alibi == 2 ? gb_view(ab, dev, FLASHC_DTYPE_FP32, 0, 2, ash, ast)
                                              : gb_view(ab, dev, FLASHC_DTYPE_FP32, 0, 1, ash + 1,
                                                        ast + 1);
    }

    {
        flashc_fwd_args fa;
        memset(&fa, 0, sizeof fa);
        fa.abi = FLASHC_ABI_VERSION;
        fa.q = da.q, fa.k = da.k, fa.v = da.v, fa.out = da.out, fa.softmax_lse = da.softmax_lse;
        fa.alibi_slopes = da.alibi_slopes;
        size_t fb = 0;
        GB_OK(flashc_fwd_workspace_size(&fa, &p, &fb));
        void *fws = gb_ws(&ar, fb);
        if (fb && !fws) goto done;
        GB_OK(flashc_fwd(&fa, &p, fws, fb));
    }
    size_t ws_bytes = 0;
    GB_OK(flashc_bwd_workspace_size(&da, &p, &ws_bytes));
    void *ws = gb_ws(&ar, ws_bytes);
    if (ws_bytes && !ws) goto done;
    const int runs = c->deterministic > 1 ? c->deterministic : 1;
    for (int run = 0; run < runs; run++) {
        if (!gb_poison(dqb) || !gb_poison(dkb) || !gb_poison(dvb)) goto done;
        GB_OK(flashc_bwd(&da, &p, ws, ws_bytes));
        if (!gb_sync() || !gb_download(dqb) || !gb_download(dkb) || !gb_download(dvb)) goto done;
        if (run == 0 && save) {
            char *s = save->h;
            memcpy(s, dqb->h, dqb->bytes);
            memcpy(s + dqb->bytes, dkb->h, dkb->bytes);
            memcpy(s + dqb->bytes + dkb->bytes, dvb->h, dvb->bytes);
        } else if (save) {
            const char *s = save->h;
            if (!gb_same_bits("dq", "deterministic runs", s, dqb->h, dqb->bytes) ||
                !gb_same_bits("dk", "deterministic runs", s + dqb->bytes, dkb->h, dkb->bytes) ||
                !gb_same_bits("dv", "deterministic runs", s + dqb->bytes + dkb->bytes, dvb->h, dvb->bytes))
                goto done;
        }
    }
    if (!gb_download(ob) || !gb_download(lb)) goto done;
    {
        const int64_t n[3] = {nq, nk, nk};
        gbw_refs rf;
        gbw_refs_new(&ar, n, &rf);
        GB_OK(fc_ref_bwd(&ha, &p, FC_REF_F64, rf.r[0], rf.r[1], rf.r[2]));
        GB_OK(fc_ref_bwd(&ha, &p, FC_REF_LOWP, rf.l[0], rf.l[1], rf.l[2]));
        gbw_check3(&rf, dt, &ha.dq, &ha.dk, &ha.dv, n);
    }
done:
    gb_free(&ar);
}

// ---- FLASHC_CUDA_BWD_WS: the warp-specialised kernel, and the launch line ----

typedef struct {
    void (*run)(const void *);
    const void *param;
} gbw_call;

static void gbw_call_run(void *ctx) {
    const gbw_call *k = (const gbw_call *)ctx;
    k->run(k->param);
}

/* Whether the backward runs the sm80 family: not compute capability 9.0, or
 * FLASHC_CUDA_FAMILY=sm80. */
static int gbw_sm80_family(void) {
    const char *family = getenv("FLASHC_CUDA_FAMILY");
    return !gb_device_is_sm90() || (family && strcmp(family, "sm80") == 0);
}

/* How a case sets FLASHC_CUDA_BWD_WS (gbw_case, gbw_vcase .ws): left alone
 * (the launch line unchecked), =1, unset or =0 (the line checked). */
enum { GBW_WS_KEEP, GBW_WS_ON, GBW_WS_UNSET, GBW_WS_OFF };

/* run(param) with FLASHC_CUDA_BWD_WS as ws says, the backward's launch line
 * then checked unless GBW_WS_KEEP: on compute capability 9.0 (every head dim
 * of these cases has an instance) sm90ws_bwd_kernel, or sm90_bwd_kernel for
 * =0, unless FLASHC_CUDA_FAMILY=sm80 asks for the sm80 family;
 * sm80_bwd_kernel then and elsewhere; nothing else. */
static void gbw_with_ws(int ws, void (*run)(const void *), const void *param) {
    if (ws == GBW_WS_KEEP) {
        run(param);
        return;
    }
    static const char *const values[4] = {NULL, "1", NULL, "0"};
    gb_env e;
    gb_env_enter(&e, "FLASHC_CUDA_BWD_WS", values[ws]);
    gbw_call k = {run, param};
    char *log = th_capture_log("1", gbw_call_run, &k);
    gb_env_leave(&e);
    FC_ASSERT_TRUE(log != NULL);
    static const char *const kernels[3] = {"sm80_bwd_kernel<", "sm90_bwd_kernel<",
                                           "sm90ws_bwd_kernel<"};
    const int sm80 = gbw_sm80_family();
    const char *want = sm80 ? kernels[0] : ws == GBW_WS_OFF ? kernels[1] : kernels[2];
    for (int i = 0; i < 3; i++)
        if ((strstr(log, kernels[i]) != NULL) != (kernels[i] == want))
            fc_test_fail(__FILE__, __LINE__, "FLASHC_CUDA_BWD_WS=%s: %s \"%s\" in the log:\n%s",
                         values[ws] ? values[ws] : "(unset)", kernels[i] == want ? "no" : "unexpected",
                         kernels[i], log);
    free(log);
}

/* gbw_with_ws; for a case with want_split (FLASHC_CUDA_BWD_WS left alone,
 * FLASHC_CUDA_BWD_SPLIT unset), the batched run with its launch line checked
 * instead: on the sm90 family it names the GQA split the rule picked (the
 * sm80 kernel does not split). */
static void gbw_run_ws(const void *param) {
    const gbw_case *c = (const gbw_case *)param;
    if (!c->want_split) {
        gbw_with_ws(c->ws, gbw_run_batched, param);
        return;
    }
    gb_env e;
    gb_env_enter(&e, "FLASHC_CUDA_BWD_SPLIT", NULL);
    gbw_call k = {gbw_run_batched, param};
    char *log = th_capture_log("1", gbw_call_run, &k);
    gb_env_leave(&e);
    FC_ASSERT_TRUE(log != NULL);
    char want[32];
    snprintf(want, sizeof want, "kv_split=%d", c->want_split);
    const char *at = strstr(log, want);
    if (!gbw_sm80_family() && (!at || isdigit((unsigned char)at[strlen(want)])))
        fc_test_fail(__FILE__, __LINE__, "no \"%s\" in the log:\n%s", want, log);
    free(log);
}

/* gbw_run_batched with FLASHC_CUDA_BWD_SPLIT set to the case's split (left as
 * it is for 0) and FLASHC_CUDA_BWD_WS as the case says. */
static void gbw_run_case(const void *param) {
    const gbw_case *c = (const gbw_case *)param;
    char v[16];
    snprintf(v, sizeof v, "%d", c->split);
    gb_with_env("FLASHC_CUDA_BWD_SPLIT", c->split ? v : NULL, gbw_run_ws, param);
}

static void gbw_add(const char *name, const gbw_case *c) {
    if (gbw_ncases == GBW_MAX_CASES) {
        fprintf(stderr, "test_gpu_bwd: too many cases\n");
        abort();
    }
    gbw_cases[gbw_ncases] = *c;
    fc_test_add(name, gbw_run_case, &gbw_cases[gbw_ncases]);
    gbw_ncases++;
}

static void gbw_name(char *buf, size_t n, const char *kind, const gbw_case *c) {
    snprintf(buf, n, "gpu_bwd_%s%s_d%lld_%lldx%lld_h%lldk%lld", kind, flashc_dtype_name(c->dt),
             (long long)c->d, (long long)c->sq, (long long)c->sk, (long long)c->h, (long long)c->hk);
    th_opts_name(buf, n, &c->o);
}

FC_TEST_REGISTER(gpu_bwd_sweep) {
    static const int64_t dims[9] = {32, 64, 80, 96, 128, 160, 192, 224, 256};
    static const int64_t shapes[6][2] = {{1, 1},     {17, 113},   {113, 17},
                                         {300, 300}, {1000, 1000}, {2049, 1000}};
    static const flashc_dtype dts[2] = {FLASHC_DTYPE_BF16, FLASHC_DTYPE_FP16};
    const th_windows w = {37, 11, 23, 19, 45, 5};
    for (int t = 0; t < 2; t++)
        for (int di = 0; di < 9; di++)
            for (int o = 0; o < TH_OPTION_CYCLE; o++) {
                gbw_case c;
                memset(&c, 0, sizeof c);
                const int si = (2 * o + di + 3 * t) % 6; /* every pair of values meets */
                c.dt = dts[t];
                c.d = dims[di];
                c.sq = shapes[si][0];
                c.sk = shapes[si][1];
                const int big = c.sq * c.sk > 100000;
                const int g = 1 + (o + di) % 3;
                c.hk = big ? 1 : 2;
                c.h = c.hk * g;
                c.b = big ? 1 : 2;
                c.o = th_option_cycle(o, w);
                char name[160];
                gbw_name(name, sizeof name, "", &c);
                gbw_add(name, &c);
            }
}

FC_TEST_REGISTER(gpu_bwd_deterministic) {
    gbw_case c;
    memset(&c, 0, sizeof c);
    c.o = (th_opts)TH_OPTS_NONE;
    c.dt = FLASHC_DTYPE_BF16;
    c.b = 2, c.sq = 700, c.sk = 900, c.h = 4, c.hk = 2, c.d = 64;
    c.deterministic = 50;
    char name[160];
    gbw_name(name, sizeof name, "det50_", &c);
    gbw_add(name, &c);
    c.dt = FLASHC_DTYPE_FP16;
    c.d = 128;
    c.o.causal = 1;
    c.o.dropout = 0.1f;
    gbw_name(name, sizeof name, "det50_", &c);
    gbw_add(name, &c);
    /* without dropout D = 256 runs the sm90 kernel's column split on Hopper */
    c.dt = FLASHC_DTYPE_BF16;
    c.d = 256;
    c.o.dropout = 0.0f;
    gbw_name(name, sizeof name, "det50_", &c);
    gbw_add(name, &c);
}

FC_TEST_REGISTER(gpu_bwd_pad) {
    static const int64_t dims[3] = {7, 36, 100};
    gbw_case c;
    for (int di = 0; di < 3; di++)
        for (int m = 0; m < 2; m++) {
            memset(&c, 0, sizeof c);
            c.o = (th_opts)TH_OPTS_NONE;
            c.dt = m ? FLASHC_DTYPE_FP16 : FLASHC_DTYPE_BF16;
            c.b = 2, c.sq = 77, c.sk = 190, c.h = 4, c.hk = 2, c.d = dims[di];
            c.o.causal = m;
            c.misalign = m;
            char name[160];
            gbw_name(name, sizeof name, m ? "pad_misaligned_" : "pad_", &c);
            gbw_add(name, &c);
        }
}

// ---- varlen ----

/* Sequence lengths: b = 1 has no query rows, b = 3 no keys. */
#define GBV_B 4
static const int32_t gbv_lq[GBV_B] = {37, 0, 260, 5};
static const int32_t gbv_lk[GBV_B] = {45, 9, 190, 0};

typedef struct {
    flashc_dtype dt;
    int64_t d, h, hk;
    int causal;
    int split; /* FLASHC_CUDA_BWD_SPLIT, 0: the environment's */
    int ws;    /* GBW_WS_*: FLASHC_CUDA_BWD_WS, the launch line checked */
    int slack; /* q and dout rows past the last sequence (total_q > cu_seqlens_q[B]), NaN */
} gbw_vcase;
static gbw_vcase gbw_vcases[12];
static int gbw_nvcases;

/* q, k, v as views of one [total, H + 2 Hk, D] buffer per side (a packed layout). */
static void gbw_run_varlen(const void *param) {
    const gbw_vcase *c = (const gbw_vcase *)param;
    const flashc_dtype dt = c->dt;
    const int64_t H = c->h, Hk = c->hk, D = c->d;
    const size_t es = flashc_dtype_size(dt);
    gb_arena ar = {0};
    flashc_params p = flashc_params_default();
    p.causal = c->causal;
    p.softmax_scale = (float)(2.0 / sqrt((double)D));
    int32_t cuq[GBV_B + 1] = {0}, cuk[GBV_B + 1] = {0};
    int64_t max_q = 0, max_k = 0;
    for (int b = 0; b < GBV_B; b++) {
        cuq[b + 1] = cuq[b] + gbv_lq[b];
        cuk[b + 1] = cuk[b] + gbv_lk[b];
        max_q = gbv_lq[b] > max_q ? gbv_lq[b] : max_q;
        max_k = gbv_lk[b] > max_k ? gbv_lk[b] : max_k;
    }
    /* tq rows of q-likes, the last `slack` in no sequence */
    const int64_t sq_rows = cuq[GBV_B], tq = sq_rows + c->slack, tk = cuk[GBV_B], W = H + 2 * Hk;
    const int64_t tmax = tq > tk ? tq : tk;
    gb_buf *in = gb_new(&ar, (size_t)(tmax * W * D) * es);  /* q | k | v per token */
    gb_buf *dob = gb_new(&ar, (size_t)(tq * H * D) * es), *ob = gb_new(&ar, (size_t)(tq * H * D) * es);
    gb_buf *lb = gb_new(&ar, (size_t)(H * tq + 1) * 4);
    gb_buf *gr = gb_new(&ar, (size_t)(tmax * W * D) * es);  /* dq | dk | dv per token */
    gb_buf *cq = gb_new(&ar, sizeof cuq), *ck = gb_new(&ar, sizeof cuk);
    if (!in || !dob || !ob || !lb || !gr || !cq || !ck) goto done;
    gb_fill(in, dt, -1.0, 1.0);
    gb_fill(dob, dt, -1.0, 1.0);
    if (c->slack) {
        /* NaN q (the H heads of each packed row) and dout past the sequences */
        for (int64_t r = sq_rows; r < tq; r++) fc_poison((char *)in->h + (size_t)(r * W * D) * es, dt, H * D);
        fc_poison((char *)dob->h + (size_t)(sq_rows * H * D) * es, dt, c->slack * H * D);
    }
    memcpy(cq->h, cuq, sizeof cuq);
    memcpy(ck->h, cuk, sizeof cuk);
    if (!gb_upload(in) || !gb_upload(dob) || !gb_upload(cq) || !gb_upload(ck) || !gb_poison(ob) ||
        !gb_poison(lb) || !gb_poison(gr))
        goto done;
    {
        int64_t qsh[3] = {tq, H, D}, ksh[3] = {tk, Hk, D}, pst[3] = {W * D, D, 1};
        int64_t dst[3] = {H * D, D, 1}, lsh[2] = {H, tq}, lst[2] = {tq, 1}, csh[1] = {GBV_B + 1},
                cst[1] = {1};
        flashc_varlen_bwd_args da, ha;
        memset(&da, 0, sizeof da);
        da.abi = FLASHC_ABI_VERSION;
        memset(&ha, 0, sizeof ha);
        ha.abi = FLASHC_ABI_VERSION;
        for (int dev = 0; dev < 2; dev++) {
            flashc_varlen_bwd_args *x = dev ? &da : &ha;
            x->q = gb_view(in, dev, dt, 0, 3, qsh, pst);
            x->k = gb_view(in, dev, dt, H * D, 3, ksh, pst);
            x->v = gb_view(in, dev, dt, (H + Hk) * D, 3, ksh, pst);
            x->dout = gb_view(dob, dev, dt, 0, 3, qsh, dst);
            x->out = gb_view(ob, dev, dt, 0, 3, qsh, dst);
            x->softmax_lse = gb_view(lb, dev, FLASHC_DTYPE_FP32, 0, 2, lsh, lst);
            x->dq = gb_view(gr, dev, dt, 0, 3, qsh, pst);
            x->dk = gb_view(gr, dev, dt, H * D, 3, ksh, pst);
            x->dv = gb_view(gr, dev, dt, (H + Hk) * D, 3, ksh, pst);
            x->cu_seqlens_q = gb_view(cq, dev, FLASHC_DTYPE_INT32, 0, 1, csh, cst);
            x->cu_seqlens_k = gb_view(ck, dev, FLASHC_DTYPE_INT32, 0, 1, csh, cst);
            x->max_seqlen_q = max_q;
            x->max_seqlen_k = max_k;
        }
        flashc_varlen_fwd_args fa;
        memset(&fa, 0, sizeof fa);
        fa.abi = FLASHC_ABI_VERSION;
        fa.q = da.q, fa.k = da.k, fa.v = da.v, fa.out = da.out, fa.softmax_lse = da.softmax_lse;
        fa.cu_seqlens_q = da.cu_seqlens_q, fa.cu_seqlens_k = da.cu_seqlens_k;
        fa.max_seqlen_q = max_q, fa.max_seqlen_k = max_k;
        size_t fb = 0, bb = 0;
        GB_OK(flashc_varlen_fwd_workspace_size(&fa, &p, &fb));
        void *fws = gb_ws(&ar, fb);
        if (fb && !fws) goto done;
        GB_OK(flashc_varlen_fwd(&fa, &p, fws, fb));
        GB_OK(flashc_varlen_bwd_workspace_size(&da, &p, &bb));
        void *bws = gb_ws(&ar, bb);
        if (bb && !bws) goto done;
        GB_OK(flashc_varlen_bwd(&da, &p, bws, bb));
        if (!gb_sync() || !gb_download(gr) || !gb_download(ob) || !gb_download(lb)) goto done;
        const int64_t n[3] = {tq * H * D, tk * Hk * D, tk * Hk * D};
        gbw_refs rf;
        gbw_refs_new(&ar, n, &rf);
        GB_OK(fc_ref_varlen_bwd(&ha, &p, FC_REF_F64, rf.r[0], rf.r[1], rf.r[2]));
        GB_OK(fc_ref_varlen_bwd(&ha, &p, FC_REF_LOWP, rf.l[0], rf.l[1], rf.l[2]));
        /* dq's rows in no sequence are nobody's: checked are the sequences' */
        flashc_tensor dq_seq = ha.dq;
        dq_seq.shape[0] = sq_rows;
        const int64_t n_seq[3] = {sq_rows * H * D, n[1], n[2]};
        gbw_check3(&rf, dt, &dq_seq, &ha.dk, &ha.dv, n_seq);
    }
done:
    gb_free(&ar);
}

static void gbw_run_varlen_ws(const void *param) {
    gbw_with_ws(((const gbw_vcase *)param)->ws, gbw_run_varlen, param);
}

static void gbw_run_varlen_case(const void *param) {
    const gbw_vcase *c = (const gbw_vcase *)param;
    char v[16];
    snprintf(v, sizeof v, "%d", c->split);
    gb_with_env("FLASHC_CUDA_BWD_SPLIT", c->split ? v : NULL, gbw_run_varlen_ws, param);
}

static void gbw_add_varlen(const char *kind, const gbw_vcase *c) {
    if (gbw_nvcases == (int)FC_COUNT(gbw_vcases)) {
        fprintf(stderr, "test_gpu_bwd: too many varlen cases\n");
        abort();
    }
    gbw_vcases[gbw_nvcases] = *c;
    char name[128];
    snprintf(name, sizeof name, "gpu_bwd_varlen_%s%s_d%lld_h%lldk%lld%s", kind,
             flashc_dtype_name(c->dt), (long long)c->d, (long long)c->h, (long long)c->hk,
             c->causal ? "/causal" : "");
    fc_test_add(name, gbw_run_varlen_case, &gbw_vcases[gbw_nvcases]);
    gbw_nvcases++;
}

FC_TEST_REGISTER(gpu_bwd_varlen) {
    static const gbw_vcase cs[4] = {{FLASHC_DTYPE_BF16, 64, 4, 2, 0, 0, 0, 0},
                                    {FLASHC_DTYPE_BF16, 64, 4, 2, 1, 0, 0, 0},
                                    {FLASHC_DTYPE_FP16, 128, 3, 3, 1, 0, 0, 0},
                                    {FLASHC_DTYPE_FP16, 256, 2, 1, 0, 0, 0, 0}};
    for (int i = 0; i < 4; i++) gbw_add_varlen("", &cs[i]);
}

/* The GQA split of the sm90 backward (bwd.cu fc_bwd_kv_split; S CTAs per key
 * block and KV head, fp32 parts of dK, dV summed after): forced through
 * FLASHC_CUDA_BWD_SPLIT to 1 (no split), 2 and G, for groups G {2, 4, 8, 16},
 * D {64, 128, 256} and the option cycle, with (Sq, Sk) from {(300, 300),
 * (113, 17), (17, 113), (1000, 1000)}, every other case deterministic (3 runs,
 * bitwise); varlen with empty sequences split 2 and G. The other backward
 * cases run the split by the rule (most short GQA grids split). The sm80
 * family ignores the variable. */
FC_TEST_REGISTER(gpu_bwd_kv_split) {
    static const int64_t groups[4] = {2, 4, 8, 16}, dims[3] = {64, 128, 256};
    static const int64_t shapes[4][2] = {{300, 300}, {113, 17}, {17, 113}, {1000, 1000}};
    const th_windows w = {37, 11, 23, 19, 45, 5};
    int n = 0;
    for (int gi = 0; gi < 4; gi++)
        for (int si = 0; si < 3; si++, n++) {
            gbw_case c;
            memset(&c, 0, sizeof c);
            const int64_t G = groups[gi];
            c.split = si == 0 ? 1 : si == 1 ? 2 : (int)G;
            if (si == 2 && G == 2) c.split = 3; /* not a divisor: the largest one below, 2 */
            c.dt = n % 2 ? FLASHC_DTYPE_FP16 : FLASHC_DTYPE_BF16;
            c.d = dims[(gi + si) % 3];
            const int sh = (gi + 2 * si) % 4;
            c.sq = shapes[sh][0];
            c.sk = shapes[sh][1];
            c.hk = G >= 8 ? 1 : 2;
            c.h = c.hk * G;
            c.b = c.sq * c.sk > 100000 ? 1 : 2;
            c.o = th_option_cycle(n % TH_OPTION_CYCLE, w);
            c.deterministic = n % 2 ? 3 : 0;
            char name[160], kind[16];
            snprintf(kind, sizeof kind, "split%d_", c.split);
            gbw_name(name, sizeof name, kind, &c);
            gbw_add(name, &c);
        }
    /* the rule's own picks (bwd.cu fc_bwd_kv_split), every one of these grids
     * far below 16 waves: causal, the largest divisor S <= G / 2 (G 8: 4; G 8
     * at D256, Bc 64, deterministic: 4), and causal with a left window (not
     * key-major: the fullest wave within two, G 8 over 8 key blocks: 8) */
    static const struct {
        flashc_dtype dt;
        int64_t d, h, hk, b, s;
        int wl, det, want;
    } rule[3] = {{FLASHC_DTYPE_BF16, 128, 8, 1, 1, 1000, -1, 0, 4},
                 {FLASHC_DTYPE_FP16, 256, 16, 2, 2, 700, -1, 3, 4},
                 {FLASHC_DTYPE_BF16, 128, 8, 1, 1, 1000, 100, 0, 8}};
    for (int i = 0; i < 3; i++) {
        gbw_case c;
        memset(&c, 0, sizeof c);
        c.o.causal = 1, c.o.wl = rule[i].wl, c.o.wr = 0;
        c.dt = rule[i].dt, c.d = rule[i].d, c.h = rule[i].h, c.hk = rule[i].hk;
        c.b = rule[i].b, c.sq = c.sk = rule[i].s;
        c.deterministic = rule[i].det;
        c.want_split = rule[i].want;
        char name[160];
        gbw_name(name, sizeof name, "split_rule_", &c);
        gbw_add(name, &c);
    }
    static const gbw_vcase vs[2] = {{FLASHC_DTYPE_BF16, 128, 8, 1, 1, 2, 0, 0},
                                    {FLASHC_DTYPE_FP16, 64, 8, 2, 0, 4, 0, 0}};
    for (int i = 0; i < 2; i++) {
        char kind[16];
        snprintf(kind, sizeof kind, "split%d_", vs[i].split);
        gbw_add_varlen(kind, &vs[i]);
    }
}

/* The warp-specialised sm90 kernel (FLASHC_CUDA_BWD_WS=1; elsewhere the sm80
 * kernel runs them, and the launch line says so). Its own edges: the ring of
 * Q / dO slots and dQ buffers wrapping many times (1000 query rows: 16 blocks
 * of 64 per head, 8 of 128 at D64), the last query block partial (Sq not a
 * multiple of Br) and, varlen, zeroed in the slot where the rows past a
 * sequence are NaN (slack rows after the last sequence: without the zeroing
 * dK and dV turn NaN); each head dim's row (D64 Br 128, D128, D256 one slot
 * and one dQ buffer) through the option cycle (D128 all of it, the others
 * every second set); deterministic runs (the writer
 * waits for the turns), and the GQA split with the writer (deterministic
 * too). */
FC_TEST_REGISTER(gpu_bwd_ws) {
    static const int64_t dims[3] = {64, 128, 256};
    static const int64_t shapes[3][2] = {{1000, 1000}, {257, 300}, {300, 77}};
    const th_windows w = {37, 11, 23, 19, 45, 5};
    char name[160];
    int n = 0;
    for (int di = 0; di < 3; di++)
        for (int o = 0; o < TH_OPTION_CYCLE; o += di == 1 ? 1 : 2, n++) {
            gbw_case c;
            memset(&c, 0, sizeof c);
            c.ws = GBW_WS_ON;
            c.dt = n % 2 ? FLASHC_DTYPE_FP16 : FLASHC_DTYPE_BF16;
            c.d = dims[di];
            const int si = (o / 2 + di) % 3;
            c.sq = shapes[si][0];
            c.sk = shapes[si][1];
            c.hk = 2;
            c.h = 2 * (1 + n % 3);
            c.b = c.sq > 500 ? 1 : 2;
            c.o = th_option_cycle(o, w);
            gbw_name(name, sizeof name, "ws_", &c);
            gbw_add(name, &c);
        }
    for (int di = 0; di < 3; di++) {
        gbw_case c;
        memset(&c, 0, sizeof c);
        c.ws = GBW_WS_ON;
        c.o = th_option_cycle(di == 1 ? 1 : 9, w);  /* causal, dropout */
        c.dt = di == 1 ? FLASHC_DTYPE_FP16 : FLASHC_DTYPE_BF16;
        c.b = 2, c.sq = 700, c.sk = 900, c.h = 4, c.hk = 2, c.d = dims[di];
        c.deterministic = 20;
        gbw_name(name, sizeof name, "ws_det20_", &c);
        gbw_add(name, &c);
        /* the split: 8 query heads on one KV head over 8 and 4 CTAs */
        c.h = 8, c.hk = 1, c.b = 1, c.sq = 1000, c.sk = 300;
        c.split = di == 2 ? 4 : 8;
        c.deterministic = di == 0 ? 3 : 0;
        char kind[24];
        snprintf(kind, sizeof kind, "ws_split%d_", c.split);
        gbw_name(name, sizeof name, kind, &c);
        gbw_add(name, &c);
    }
    static const gbw_vcase vs[4] = {{FLASHC_DTYPE_BF16, 128, 4, 2, 1, 0, GBW_WS_ON, 70},
                                    {FLASHC_DTYPE_FP16, 128, 4, 2, 0, 0, GBW_WS_ON, 70},
                                    {FLASHC_DTYPE_FP16, 64, 4, 1, 0, 0, GBW_WS_ON, 130},
                                    {FLASHC_DTYPE_BF16, 256, 4, 2, 1, 2, GBW_WS_ON, 9}};
    for (int i = 0; i < 4; i++) gbw_add_varlen("ws_slack_", &vs[i]);
}

/* The switch: FLASHC_CUDA_BWD_WS unset runs sm90ws_bwd_kernel on Hopper (the
 * default), =0 sm90_bwd_kernel; one causal GQA case each, its gradients checked. */
FC_TEST_REGISTER(gpu_bwd_ws_switch) {
    static const int modes[2] = {GBW_WS_UNSET, GBW_WS_OFF};
    static const char *const kinds[2] = {"ws_unset_", "ws_off_"};
    char name[160];
    for (int i = 0; i < 2; i++) {
        gbw_case c;
        memset(&c, 0, sizeof c);
        c.ws = modes[i];
        c.o = th_option_cycle(1, (th_windows){37, 11, 23, 19, 45, 5}); /* causal */
        c.dt = i ? FLASHC_DTYPE_FP16 : FLASHC_DTYPE_BF16;
        c.b = 2, c.sq = 257, c.sk = 300, c.h = 4, c.hk = 2, c.d = 128;
        gbw_name(name, sizeof name, kinds[i], &c);
        gbw_add(name, &c);
    }
}
