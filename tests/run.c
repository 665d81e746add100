/* run.c : the test runner. Runs every registered case (or those whose name
 * contains one of the arguments), each with its own random seed, and prints
 * "N passed, N failed" last. `flashc_tests -l` lists the cases.
 * FLASHC_TEST_SHARD=k/n runs every n-th selected case from the k-th (0 <= k < n),
 * so that n processes run one selection between them. FLASHC_TEST_VERBOSE=1
 * prints "ok NAME (seconds)" after each passing case too, so that a run cut
 * off by a timeout shows how far it came and what it was running. */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fc_test.h"

typedef struct {
    char *name;
    fc_test_fn fn;
    const void *param;
} fc_case;

static fc_case *fc_cases;
static int fc_ncases, fc_capcases;
static int fc_cur_failed;
static int fc_cur_fail_prints;
static const char *fc_cur_name;

void fc_test_add(const char *name, fc_test_fn fn, const void *param) {
    if (fc_ncases == fc_capcases) {
        fc_capcases = fc_capcases ? 2 * fc_capcases : 256;
        fc_cases = (fc_case *)realloc(fc_cases, (size_t)fc_capcases * sizeof *fc_cases);
        if (!fc_cases) abort();
    }
    size_t len = strlen(name) + 1;
    char *copy = (char *)malloc(len);
    if (!copy) abort();
    memcpy(copy, name, len);
    fc_cases[fc_ncases].name = copy;
    fc_cases[fc_ncases].fn = fn;
    fc_cases[fc_ncases].param = param;
    fc_ncases++;
}

void fc_test_fail(const char *file, int line, const char *fmt, ...) {
    fc_cur_failed = 1;
    if (fc_cur_fail_prints++ >= 8) return; /* enough to diagnose */
    va_list ap;
    va_start(ap, fmt);
    fprintf(stdout, "  FAIL %s (%s:%d): ", fc_cur_name, file, line);
    vfprintf(stdout, fmt, ap);
    fputc('\n', stdout);
    va_end(ap);
}

int fc_test_failed(void) { return fc_cur_failed; }

/* ---- random numbers ---- */
static uint64_t fc_rng_state = 0x9e3779b97f4a7c15ull;

static void fc_rand_seed(const char *name) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a of the case name */
    for (const char *c = name; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
    const char *env = getenv("FLASHC_TEST_SEED");
    if (env) h ^= strtoull(env, NULL, 10) * 0x9e3779b97f4a7c15ull;
    fc_rng_state = h ? h : 1;
}

uint64_t fc_rand_u64(void) {
    uint64_t x = fc_rng_state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    fc_rng_state = x;
    return x * 2685821657736338717ull;
}

double fc_rand_uniform(double lo, double hi) {
    return lo + (hi - lo) * (double)(fc_rand_u64() >> 11) * (1.0 / 9007199254740992.0);
}

void fc_fill_random(void *p, flashc_dtype dt, int64_t n, double lo, double hi) {
    for (int64_t i = 0; i < n; i++) fc_set(p, dt, i, fc_rand_uniform(lo, hi));
}

void fc_poison(void *p, flashc_dtype dt, int64_t n) {
    for (int64_t i = 0; i < n; i++) fc_set(p, dt, i, dt == FLASHC_DTYPE_INT32 ? INT32_MIN : NAN);
}

void fc_tensor_to_double(const flashc_tensor *t, double *dst) {
    int64_t shape[FLASHC_MAX_DIMS] = {1, 1, 1, 1}, stride[FLASHC_MAX_DIMS] = {0, 0, 0, 0};
    int off = FLASHC_MAX_DIMS - t->ndim; /* right-align into 4 dims */
    for (int d = 0; d < t->ndim; d++) {
        shape[off + d] = t->shape[d];
        stride[off + d] = t->stride[d];
    }
    int64_t k = 0;
    for (int64_t a = 0; a < shape[0]; a++)
        for (int64_t b = 0; b < shape[1]; b++)
            for (int64_t c = 0; c < shape[2]; c++)
                for (int64_t d = 0; d < shape[3]; d++)
                    dst[k++] = fc_get(t->data, t->dtype,
                                      a * stride[0] + b * stride[1] + c * stride[2] + d * stride[3]);
}

/* ---- the tolerance rule (tests/support/check.c), with the failure printed ---- */
int fc_check_close(const char *what, flashc_dtype dt, const double *got, const double *ref64,
                   const double *lowp, int64_t n) {
    fc_tol_result r = fc_tol_check(dt, got, ref64, lowp, n);
    if (r.pass) return 1;
    fc_test_fail(__FILE__, __LINE__, "%s: max err %.3g > tol %.3g (baseline err %.3g, n=%lld)", what,
                 r.err, r.tol, r.base, (long long)n);
    int shown = 0;
    for (int64_t i = 0; i < n && shown < 4; i++) {
        if (fc_abs_err(got[i], ref64[i]) > r.tol) {
            fprintf(stdout, "    [%lld] got %.9g want %.9g\n", (long long)i, got[i], ref64[i]);
            shown++;
        }
    }
    return 0;
}

/* Does the case name contain one of the filters (every case when there are none)? */
static int fc_selected(const char *name, char **filters, int nfilters) {
    if (nfilters == 0) return 1;
    for (int i = 0; i < nfilters; i++)
        if (strstr(name, filters[i])) return 1;
    return 0;
}

/* Why this test binary cannot run here (NULL: it can). The GPU tests define
 * it (gpu_helpers.c: no usable CUDA device); main then prints the reason and
 * exits with 77, which ctest reports as skipped. */
__attribute__((weak)) const char *fc_test_skip_reason(void) { return NULL; }

int main(int argc, char **argv) {
    char **filters = argv + 1;  /* the name filters, compacted in place */
    int nfilters = 0, list = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-l") == 0) list = 1;
        else filters[nfilters++] = argv[i];
    }
    int shard = 0, nshards = 1;
    const char *shard_env = getenv("FLASHC_TEST_SHARD");
    if (shard_env && (sscanf(shard_env, "%d/%d", &shard, &nshards) != 2 || nshards < 1 ||
                      shard < 0 || shard >= nshards)) {
        fprintf(stderr, "FLASHC_TEST_SHARD=%s: want k/n with 0 <= k < n\n", shard_env);
        return 2;
    }
    const char *skip = list ? NULL : fc_test_skip_reason();
    if (skip) {
        printf("skipped: %s\n", skip);
        return 77;
    }
    const char *verbose_env = getenv("FLASHC_TEST_VERBOSE");
    const int verbose = verbose_env && strcmp(verbose_env, "1") == 0;
    int passed = 0, failed = 0, nselected = 0;
    for (int c = 0; c < fc_ncases; c++) {
        if (!fc_selected(fc_cases[c].name, filters, nfilters)) continue;
        if (nselected++ % nshards != shard) continue;
        if (list) {
            printf("%s\n", fc_cases[c].name);
            continue;
        }
        fc_cur_name = fc_cases[c].name;
        fc_cur_failed = 0;
        fc_cur_fail_prints = 0;
        fc_rand_seed(fc_cur_name);
        struct timespec t0, t1;
        timespec_get(&t0, TIME_UTC);
        fc_cases[c].fn(fc_cases[c].param);
        timespec_get(&t1, TIME_UTC);
        if (fc_cur_failed) {
            failed++;
            printf("not ok %s\n", fc_cur_name);
        } else {
            passed++;
            if (verbose)
                printf("ok %s (%.2f s)\n", fc_cur_name,
                       (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
        }
        fflush(stdout);
    }
    if (!list) printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
