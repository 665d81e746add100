/* test_gpu_window.c : sliding windows on the CUDA forward and backward, every
 * kernel family, against the float64 reference.
 *
 * Windows are where the kernels skip work: key blocks a query block never
 * sees, query blocks a key block never visits, partial tiles that need the
 * element mask, rows that see no key. Each case draws a window (left and
 * right each one of: unbounded, 0, a random width below the sequence, a width
 * at or past it, INT32_MAX) and runs, on one family (FLASHC_CUDA_FAMILY set
 * for the case and restored after):
 *   - the forward twice: out and softmax_lse checked by DEVELOPERS.md's rule
 *     against fc_ref_fwd, and bitwise equal run to run;
 *   - the backward twice on that forward's out and lse: dq, dk, dv checked
 *     against fc_ref_bwd; in deterministic mode (every other case) the two
 *     runs must agree bit for bit.
 * The sweep: family {auto (on Hopper for D > 32: the sm90ws forward and
 * backward), sm90 (the sm90 forward, the sm90ws backward), sm80} x dtype {bf16,
 * fp16} x D {32, 64, 96, 111, 128, 160, 192, 224, 256} x causal {no, yes},
 * two windows each, each with one (Sq, Sk) from a list with Sq < Sk (short against very long
 * included), Sq = Sk and Sq > Sk, chosen so every pair of values meets; GQA
 * groups of 1 to 3. Outputs are poisoned with NaN before every call.
 *
 * Build: this file + gpu_helpers.c + tests/helpers.c + tests/run.c, linked with
 * flashc_static and cudart (only with FLASHC_CUDA_BWD). `flashc_gpu_tests
 * gpu_window` runs these alone.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../support/reference.h"
#include "../fc_test.h"
#include "gpu_helpers.h"

typedef struct {
    const char *family; /* the value of FLASHC_CUDA_FAMILY for the case */
    flashc_dtype dt;
    int64_t b, sq, sk, h, hk, d;
    int causal, wl, wr; /* wr is ignored (0) when causal */
    int deterministic;
} gw_case;

#define GW_MAX_CASES 240
#define GW_RUNS "two runs on the same inputs"
static gw_case gw_cases[GW_MAX_CASES];
static int gw_ncases;

static void gw_run(const void *param) {
    const gw_case *c = (const gw_case *)param;
    const flashc_dtype dt = c->dt;
    const int64_t B = c->b, Sq = c->sq, Sk = c->sk, H = c->h, Hk = c->hk, D = c->d;
    const size_t es = flashc_dtype_size(dt);
    const int64_t nq = B * Sq * H * D, nk = B * Sk * Hk * D, nl = B * H * Sq;
    gb_family fam;
    gb_family_enter(&fam, c->family);
    gb_arena ar = {0};
    flashc_params p = flashc_params_default();
    p.softmax_scale = (float)(2.0 / sqrt((double)D)); /* peakier than the default */
    p.causal = c->causal;
    p.windowed = 1; /* every edge of the table, -1 included */
    p.window_left = c->wl;
    p.window_right = c->causal ? -1 : c->wr;
    p.deterministic = c->deterministic;

    gb_buf *qb = gb_new(&ar, (size_t)nq * es), *kb = gb_new(&ar, (size_t)nk * es);
    gb_buf *vb = gb_new(&ar, (size_t)nk * es), *dob = gb_new(&ar, (size_t)nq * es);
    gb_buf *ob = gb_new(&ar, (size_t)nq * es), *lb = gb_new(&ar, (size_t)nl * 4);
    gb_buf *dqb = gb_new(&ar, (size_t)nq * es), *dkb = gb_new(&ar, (size_t)nk * es);
    gb_buf *dvb = gb_new(&ar, (size_t)nk * es);
    /* the first run's results: out, lse, dq, dk, dv */
    gb_buf *first = gb_new(&ar, (size_t)(2 * nq + 2 * nk) * es + (size_t)nl * 4);
    if (!qb || !kb || !vb || !dob || !ob || !lb || !dqb || !dkb || !dvb || !first) goto done;
    gb_fill(qb, dt, -1.0, 1.0);
    gb_fill(kb, dt, -1.0, 1.0);
    gb_fill(vb, dt, -1.0, 1.0);
    gb_fill(dob, dt, -1.0, 1.0);
    if (!gb_upload(qb) || !gb_upload(kb) || !gb_upload(vb) || !gb_upload(dob)) goto done;

    {
        int64_t qs[4] = {B, Sq, H, D}, ks[4] = {B, Sk, Hk, D}, ls[3] = {B, H, Sq};
        int64_t qst[4], kst[4], lst[3];
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
            x->dq = gb_view(dqb, dev, dt, 0, 4, qs, qst);
            x->dk = gb_view(dkb, dev, dt, 0, 4, ks, kst);
            x->dv = gb_view(dvb, dev, dt, 0, 4, ks, kst);
        }
        char *keep = first->h;
        const size_t ob_bytes = ob->bytes, lb_bytes = lb->bytes;

        // ---- the forward, twice ----
        flashc_fwd_args fa, hfa;
        memset(&fa, 0, sizeof fa);
        fa.abi = FLASHC_ABI_VERSION;
        fa.q = da.q, fa.k = da.k, fa.v = da.v, fa.out = da.out, fa.softmax_lse = da.softmax_lse;
        memset(&hfa, 0, sizeof hfa);
        hfa.abi = FLASHC_ABI_VERSION;
        hfa.q = ha.q, hfa.k = ha.k, hfa.v = ha.v, hfa.out = ha.out, hfa.softmax_lse = ha.softmax_lse;
        size_t fb = 0;
        GB_OK(flashc_fwd_workspace_size(&fa, &p, &fb));
        void *fws = gb_ws(&ar, fb);
        if (fb && !fws) goto done;
        for (int run = 0; run < 2; run++) {
            if (!gb_poison(ob) || !gb_poison(lb)) goto done;
            GB_OK(flashc_fwd(&fa, &p, fws, fb));
            if (!gb_sync() || !gb_download(ob) || !gb_download(lb)) goto done;
            if (run == 0) {
                memcpy(keep, ob->h, ob_bytes);
                memcpy(keep + ob_bytes, lb->h, lb_bytes);
            } else if (!gb_same_bits("out", GW_RUNS, keep, ob->h, ob_bytes) ||
                       !gb_same_bits("softmax_lse", GW_RUNS, keep + ob_bytes, lb->h, lb_bytes)) {
                goto done;
            }
        }
        {
            double *r_o = gb_dbl(&ar, nq), *l_o = gb_dbl(&ar, nq), *g_o = gb_dbl(&ar, nq);
            double *r_l = gb_dbl(&ar, nl), *l_l = gb_dbl(&ar, nl), *g_l = gb_dbl(&ar, nl);
            if (!r_o || !l_o || !g_o || !r_l || !l_l || !g_l) goto done;
            GB_OK(fc_ref_fwd(&hfa, &p, FC_REF_F64, r_o, r_l, NULL));
            GB_OK(fc_ref_fwd(&hfa, &p, FC_REF_LOWP, l_o, l_l, NULL));
            fc_tensor_to_double(&ha.out, g_o);
            fc_tensor_to_double(&ha.softmax_lse, g_l);
            if (!fc_check_close("out", dt, g_o, r_o, l_o, nq) ||
                !fc_check_close("softmax_lse", FLASHC_DTYPE_FP32, g_l, r_l, l_l, nl))
                goto done;
        }

        // ---- the backward, twice, on that forward's out and lse ----
        size_t wb = 0;
        GB_OK(flashc_bwd_workspace_size(&da, &p, &wb));
        void *ws = gb_ws(&ar, wb);
        if (wb && !ws) goto done;
        gb_buf *grads[3] = {dqb, dkb, dvb};
        static const char *const names[3] = {"dq", "dk", "dv"};
        for (int run = 0; run < 2; run++) {
            if (!gb_poison(dqb) || !gb_poison(dkb) || !gb_poison(dvb)) goto done;
            GB_OK(flashc_bwd(&da, &p, ws, wb));
            if (!gb_sync() || !gb_download(dqb) || !gb_download(dkb) || !gb_download(dvb))
                goto done;
            char *s = keep + ob_bytes + lb_bytes;
            for (int i = 0; i < 3; i++) {
                if (run == 0) memcpy(s, grads[i]->h, grads[i]->bytes);
                else if (c->deterministic &&
                         !gb_same_bits(names[i], GW_RUNS, s, grads[i]->h, grads[i]->bytes))
                    goto done;
                s += grads[i]->bytes;
            }
            if (run == 1) break;
            const int64_t n[3] = {nq, nk, nk};
            const flashc_tensor *got[3] = {&ha.dq, &ha.dk, &ha.dv};
            double *r[3], *l[3];
            for (int i = 0; i < 3; i++) {
                r[i] = gb_dbl(&ar, n[i]);
                l[i] = gb_dbl(&ar, n[i]);
                if (!r[i] || !l[i]) goto done;
            }
            GB_OK(fc_ref_bwd(&ha, &p, FC_REF_F64, r[0], r[1], r[2]));
            GB_OK(fc_ref_bwd(&ha, &p, FC_REF_LOWP, l[0], l[1], l[2]));
            for (int i = 0; i < 3; i++) {
                double *g = gb_dbl(&ar, n[i]);
                if (!g) goto done;
                fc_tensor_to_double(got[i], g);
                fc_check_close(names[i], dt, g, r[i], l[i], n[i]);
            }
        }
    }
done:
    gb_free(&ar);
    gb_family_leave(&fam);
}

// ---- the sweep ----

/* splitmix64: the case list's own random numbers (the case's seed is drawn
 * from its name, which holds the window, so the window is drawn first). */
static uint64_t gw_mix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* One window edge for a side whose reach is `span` rows: unbounded, 0, a
 * random width below span (half the time), a width at or past it, INT32_MAX. */
static int gw_edge(uint64_t *s, int64_t span) {
    const uint64_t r = gw_mix(s);
    switch (r % 8) {
    case 0: return -1;
    case 1: return 0;
    case 2: return (int)(span + (int64_t)((r >> 8) % 3));
    case 3: return INT32_MAX;
    default: return span > 1 ? 1 + (int)((r >> 8) % (uint64_t)(span - 1)) : 0;
    }
}

FC_TEST_REGISTER(gpu_window_sweep) {
    static const char *const fams[3] = {"auto", "sm90", "sm80"};
    static const flashc_dtype dts[2] = {FLASHC_DTYPE_BF16, FLASHC_DTYPE_FP16};
    static const int64_t dims[9] = {32, 64, 96, 111, 128, 160, 192, 224, 256};
    /* Sq < Sk (short against long and very long), Sq = Sk, Sq > Sk */
    static const int64_t shapes[9][2] = {{3, 799},   {16, 20000}, {64, 2048}, {127, 512}, {1, 129},
                                         {300, 300}, {77, 77},    {512, 127}, {1000, 65}};
    const char *seed_env = getenv("FLASHC_TEST_SEED");
    uint64_t s = 0x5eed0f3a11ull ^ (seed_env ? strtoull(seed_env, NULL, 10) : 0);
    int idx = 0;
    for (int f = 0; f < 3; f++)
        for (int t = 0; t < 2; t++)
            for (int di = 0; di < 9; di++)
                for (int causal = 0; causal < 2; causal++)
                    for (int rep = 0; rep < 2; rep++, idx++) {
                        gw_case c;
                        memset(&c, 0, sizeof c);
                        c.family = fams[f];
                        c.dt = dts[t];
                        c.d = dims[di];
                        const int si = (idx + 2 * di + 5 * t + 3 * f) % 9; /* every pair meets */
                        c.sq = shapes[si][0];
                        c.sk = shapes[si][1];
                        const int long_k = c.sk > 4096;
                        c.b = long_k ? 1 : 2;
                        c.hk = long_k ? 1 : 1 + (idx / 4 + rep) % 2;
                        c.h = c.hk * (1 + (idx / 4 + di + f) % 3);
                        c.causal = causal;
                        c.wl = gw_edge(&s, c.sk);
                        c.wr = causal ? 0 : gw_edge(&s, c.sq);
                        c.deterministic = (idx / 4 + rep) % 2;
                        char name[192];
                        snprintf(name, sizeof name,
                                 "gpu_window_%s_%s_d%lld_%lldx%lld_h%lldk%lld%s/wl%d/wr%d%s", c.family,
                                 flashc_dtype_name(c.dt), (long long)c.d, (long long)c.sq,
                                 (long long)c.sk, (long long)c.h, (long long)c.hk,
                                 causal ? "/causal" : "", c.wl, causal ? 0 : c.wr,
                                 c.deterministic ? "/det" : "");
                        if (gw_ncases == GW_MAX_CASES) {
                            fprintf(stderr, "test_gpu_window: too many cases\n");
                            abort();
                        }
                        gw_cases[gw_ncases] = c;
                        fc_test_add(name, gw_run, &gw_cases[gw_ncases]);
                        gw_ncases++;
                    }
}
