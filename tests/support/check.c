/* check.c : the tolerance rule of DEVELOPERS.md and element access as doubles
 * (see check.h). */
#include <math.h>

#include "../../src/internal.h" /* fc_load, fc_store: the library's dtype conversions */
#include "check.h"

// ---- elements as doubles ----

double fc_get(const void *p, flashc_dtype dt, int64_t i) {
    if (dt == FLASHC_DTYPE_INT32) return ((const int32_t *)p)[i];
    return fc_load(dt, p, i);
}

void fc_set(void *p, flashc_dtype dt, int64_t i, double v) {
    if (dt == FLASHC_DTYPE_INT32) ((int32_t *)p)[i] = (int32_t)v;
    else fc_store(dt, p, i, (float)v);
}

// ---- the tolerance rule ----

/* One unit of rounding of the stored output. */
static double fc_atol(flashc_dtype dt) {
    switch (dt) {
    case FLASHC_DTYPE_BF16: return 0x1p-8;
    case FLASHC_DTYPE_FP16: return 0x1p-11;
    default: return 1e-5;
    }
}

double fc_abs_err(double x, double ref) {
    if (isnan(x) || isnan(ref)) return isnan(x) && isnan(ref) ? 0.0 : INFINITY;
    if (isinf(x) || isinf(ref)) return x == ref ? 0.0 : INFINITY;
    return fabs(x - ref);
}

double fc_max_abs_err(const double *x, const double *ref, int64_t n) {
    double m = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double e = fc_abs_err(x[i], ref[i]);
        if (e > m) m = e;
    }
    return m;
}

fc_tol_result fc_tol_check(flashc_dtype dt, const double *got, const double *ref64,
                           const double *lowp, int64_t n) {
    double scale = 1.0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(ref64[i]) && fabs(ref64[i]) > scale) scale = fabs(ref64[i]);
    fc_tol_result r;
    r.err = fc_max_abs_err(got, ref64, n);
    r.base = lowp ? fc_max_abs_err(lowp, ref64, n) : 0.0;
    if (!isfinite(r.base)) r.base = 0.0; /* a baseline overflow must not loosen the bound */
    r.tol = 2.0 * r.base + fc_atol(dt) * scale;
    r.pass = r.err <= r.tol;
    return r;
}
