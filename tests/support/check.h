/* check.h : a result against the float64 reference by DEVELOPERS.md's tolerance
 * rule, the one definition the C tests (fc_check_close in tests/run.c) and
 * `flashc bench --check` (cli/check.c) share, plus the element access both use
 * to bring a tensor of any dtype to doubles. tests/python/test_flashc.py's
 * check() is the Python twin of fc_tol_check.
 *
 * The rule, for one output of n elements:
 *
 *     max |got - ref64|  <=  2 * max |lowp - ref64|  +  atol(dtype) * max(1, max |ref64|)
 *
 * lowp is the plain same-precision result (reference.h, FC_REF_LOWP); atol is
 * one unit of rounding of the stored output: 2^-8 (bf16), 2^-11 (fp16), 1e-5
 * (fp32). Per element, a NaN matches only a NaN and an infinity only the same
 * infinity (lse = -inf of a fully masked row); any other mismatch of that kind
 * is an infinite error. max |ref64| is over its finite elements. A baseline
 * that is not finite (lowp overflowed) counts as 0, so it cannot loosen the
 * bound.
 *
 * Test code (the flashc_support library); nothing here prints.
 */
#ifndef FLASHC_TEST_CHECK_H
#define FLASHC_TEST_CHECK_H

#include <stdint.h>

#include "flashc.h"

/* Element i of p, dtype dt (fp32, fp16, bf16 or int32), as a double. */
double fc_get(const void *p, flashc_dtype dt, int64_t i);
/* Store v as element i of p, dtype dt: rounded to the float dtype, or
 * truncated to int32. */
void fc_set(void *p, flashc_dtype dt, int64_t i, double v);

/* |x - ref| of one element: 0 when both are NaN or both the same infinity,
 * +inf when only one is NaN or either is an infinity they do not share. */
double fc_abs_err(double x, double ref);
/* max fc_abs_err(x[i], ref[i]) over n elements. */
double fc_max_abs_err(const double *x, const double *ref, int64_t n);

typedef struct fc_tol_result {
    double err;  /* max |got - ref64| (fc_max_abs_err) */
    double base; /* max |lowp - ref64|; 0 without lowp or when not finite */
    double tol;  /* 2 * base + atol(dt) * max(1, max |ref64|) */
    int pass;    /* err <= tol */
} fc_tol_result;

/* got against ref64 with baseline lowp (may be NULL: no baseline), n doubles
 * each, by the rule above with the atol of dt. */
fc_tol_result fc_tol_check(flashc_dtype dt, const double *got, const double *ref64,
                           const double *lowp, int64_t n);

#endif /* FLASHC_TEST_CHECK_H */
