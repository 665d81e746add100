/* check.c : `flashc bench --check`: before timing, flashc's outputs against the
 * float64 reference by DEVELOPERS.md's tolerance rule, one line per output with
 * its error, the same-precision baseline's and the tolerance, and PASS/FAIL.
 *
 * The reference (fc_ref_fwd, fc_ref_bwd) and the rule (fc_tol_check) are the
 * tests' own, from the flashc_support library (tests/support/); this file only
 * runs them on this problem. The reference always runs on host copies of the
 * tensors, in both modes (FC_REF_F64 and the baseline FC_REF_LOWP). Every output
 * is held to the atol of the input dtype, softmax_lse too, as the tests do.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "../tests/support/check.h"
#include "../tests/support/reference.h"
#include "cli.h"

/* The check refuses shapes whose reference work (both modes) exceeds this, and
 * warns above a tenth of it. The reference runs at about 3 GFLOP/s by this count
 * on a 2-core Zen4, so the limit is some 30 s of checking; run.sh's S=2048
 * causal bwd check (6e10) fits. */
#define FC_REF_FLOP_LIMIT 1e11

/* The reference's work for this problem, both modes: its backward recomputes
 * the forward. */
int fc_check_affordable(const fc_opts *o) {
    static const double ref_factor[] = {1.0, 3.5, 4.5}; /* fc_mode order */
    double ref_flops = 2 * ref_factor[o->mode] * fc_problem_flops(o, FC_MODE_FWD);
    if (ref_flops > FC_REF_FLOP_LIMIT) {
        fprintf(stderr,
                "flashc bench: --check: the float64 reference would need %.0f GFLOP (limit %.0f): "
                "use a smaller shape\n",
                ref_flops * 1e-9, FC_REF_FLOP_LIMIT * 1e-9);
        return 0;
    }
    if (ref_flops > FC_REF_FLOP_LIMIT / 10)
        fprintf(stderr, "flashc bench: --check: running the float64 reference (%.1f GFLOP), "
                        "this takes a while\n", ref_flops * 1e-9);
    return 1;
}

/* Host tensor t against ref (float64) with baseline lowp; scratch holds t as doubles. */
static void fc_check_tensor(const fc_opts *o, const char *name, const fc_buffers *host, int t,
                            const double *ref, const double *lowp, double *scratch,
                            fc_check_result *r) {
    int64_t n = fc_tensor_numel(o, t);
    for (int64_t i = 0; i < n; i++) scratch[i] = fc_get(host->data[t], fc_tensor_dtype(o, t), i);
    fc_tol_result c = fc_tol_check(o->dtype, scratch, ref, lowp, n);
    fprintf(o->csv ? stderr : stdout, "  check      %-4s max|err| %.3e  (same-precision baseline %.3e, tolerance %.3e)  %s\n",
               name, c.err, c.base, c.tol, c.pass ? "PASS" : "FAIL");
    if (c.err > r->max_err) r->max_err = c.err;
    if (!c.pass) r->pass = 0;
}

/* out and lse in fwd modes, dq, dk, dv in bwd modes. */
int fc_check(const fc_opts *o, const fc_place *pl, const fc_problem *p, fc_buffers *dev,
             fc_buffers *host, fc_check_result *r) {
    /* in bwd mode the forward that produced out and lse ran already */
    if (!fc_run_once(o, p, dev)) return 0;
    fc_place_download(pl, dev, host);
    fc_problem hp = fc_problem_make(o, host, pl, FLASHC_DEVICE_CPU);

    int64_t nq = fc_tensor_numel(o, FC_Q), nkv = fc_tensor_numel(o, FC_K);
    int64_t nl = fc_tensor_numel(o, FC_LSE);
    int64_t nfwd = nq + nl, nbwd = nq + 2 * nkv;  /* out, lse; dq, dk, dv */
    int64_t nref = o->mode == FC_MODE_FWD ? nfwd : nfwd > nbwd ? nfwd : nbwd;
    int64_t nmax = nq > nkv ? nq : nkv;
    if (nl > nmax) nmax = nl;
    double *ref = malloc((size_t)nref * sizeof(double));
    double *lowp = malloc((size_t)nref * sizeof(double));
    double *scratch = malloc((size_t)nmax * sizeof(double));
    int ok = ref && lowp && scratch;
    if (!ok) fprintf(stderr, "flashc bench: --check: out of memory for the reference\n");
    r->max_err = 0;
    r->pass = 1;

    if (ok && o->mode != FC_MODE_BWD) {
        ok = !fc_report_status("fc_ref_fwd", fc_ref_fwd(&hp.fwd, &hp.params, FC_REF_F64, ref, ref + nq, NULL)) &&
             !fc_report_status("fc_ref_fwd", fc_ref_fwd(&hp.fwd, &hp.params, FC_REF_LOWP, lowp, lowp + nq, NULL));
        if (ok) {
            fc_check_tensor(o, "out", host, FC_OUT, ref, lowp, scratch, r);
            fc_check_tensor(o, "lse", host, FC_LSE, ref + nq, lowp + nq, scratch, r);
        }
    }
    if (ok && o->mode != FC_MODE_FWD) {
        double *dq = ref, *dk = ref + nq, *dv = dk + nkv;
        double *ldq = lowp, *ldk = lowp + nq, *ldv = ldk + nkv;
        ok = !fc_report_status("fc_ref_bwd", fc_ref_bwd(&hp.bwd, &hp.params, FC_REF_F64, dq, dk, dv)) &&
             !fc_report_status("fc_ref_bwd", fc_ref_bwd(&hp.bwd, &hp.params, FC_REF_LOWP, ldq, ldk, ldv));
        if (ok) {
            fc_check_tensor(o, "dq", host, FC_DQ, dq, ldq, scratch, r);
            fc_check_tensor(o, "dk", host, FC_DK, dk, ldk, scratch, r);
            fc_check_tensor(o, "dv", host, FC_DV, dv, ldv, scratch, r);
        }
    }
    free(ref);
    free(lowp);
    free(scratch);
    return ok;
}
