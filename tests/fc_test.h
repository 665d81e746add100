/* fc_test.h : the test runner's case table and expectations (libuv task.h style).
 *
 * A case is a function registered before main() runs:
 *
 *     FC_TEST(fwd_basic) { ... FC_EXPECT_EQ(a, b); ... }
 *
 * or, for a parametrised sweep, one registration function that adds a case per
 * parameter set with its own name:
 *
 *     static void run_one(const void *param) { const my_case *c = param; ... }
 *     FC_TEST_REGISTER(fwd_sweep) {
 *         for (...) fc_test_add(name, run_one, &cases[i]);  // name is copied
 *     }
 *
 * FC_EXPECT_* record a failure (printing both values, file and line) and go on;
 * FC_ASSERT_* record it and return from the case. A case passes when it
 * recorded no failure. The runner prints "N passed, N failed" last.
 */
#ifndef FLASHC_TEST_H
#define FLASHC_TEST_H

#include <stdint.h>
#include <stdio.h>

#include "flashc.h"
#include "support/check.h"

/* The number of elements of an array (not a pointer), as an int. */
#define FC_COUNT(x) ((int)(sizeof(x) / sizeof((x)[0])))

typedef void (*fc_test_fn)(const void *param);

/* Add a case; name and param are kept (name is copied, param is not). */
void fc_test_add(const char *name, fc_test_fn fn, const void *param);
/* Record a failure of the running case, printf-style. */
void fc_test_fail(const char *file, int line, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* 1 if the running case has recorded a failure. */
int fc_test_failed(void);

#define FC_TEST(name)                                                              \
    static void fc_test_##name(const void *fc_param);                              \
    __attribute__((constructor)) static void fc_test_reg_##name(void) {           \
        fc_test_add(#name, fc_test_##name, NULL);                                  \
    }                                                                              \
    static void fc_test_##name(const void *fc_param)

#define FC_TEST_REGISTER(name)                                                     \
    static void fc_test_registrar_##name(void);                                    \
    __attribute__((constructor)) static void fc_test_reg_##name(void) {           \
        fc_test_registrar_##name();                                                \
    }                                                                              \
    static void fc_test_registrar_##name(void)

#define FC_EXPECT_EQ(a, b)                                                          \
    do {                                                                            \
        long long fc_a_ = (long long)(a), fc_b_ = (long long)(b);                   \
        if (fc_a_ != fc_b_)                                                         \
            fc_test_fail(__FILE__, __LINE__, "%s == %s: %lld vs %lld", #a, #b, fc_a_, fc_b_); \
    } while (0)

#define FC_EXPECT_NEAR(a, b, tol)                                                   \
    do {                                                                            \
        double fc_a_ = (double)(a), fc_b_ = (double)(b), fc_t_ = (double)(tol);     \
        if (!(fc_a_ - fc_b_ <= fc_t_ && fc_b_ - fc_a_ <= fc_t_))                    \
            fc_test_fail(__FILE__, __LINE__, "%s ~ %s: %.9g vs %.9g (tol %.3g)", #a, #b, fc_a_, \
                         fc_b_, fc_t_);                                             \
    } while (0)

#define FC_EXPECT_TRUE(c)                                                           \
    do {                                                                            \
        if (!(c)) fc_test_fail(__FILE__, __LINE__, "expected %s", #c);              \
    } while (0)

#define FC_EXPECT_STATUS(expr, want)                                                \
    do {                                                                            \
        flashc_status fc_s_ = (expr);                                               \
        if (fc_s_ != (want))                                                        \
            fc_test_fail(__FILE__, __LINE__, "%s: got %s, want %s (last error: %s)", #expr, \
                         flashc_status_string(fc_s_), flashc_status_string(want),   \
                         flashc_last_error());                                      \
    } while (0)

#define FC_ASSERT_TRUE(c)                                                           \
    do {                                                                            \
        if (!(c)) {                                                                 \
            fc_test_fail(__FILE__, __LINE__, "expected %s", #c);                    \
            return;                                                                 \
        }                                                                           \
    } while (0)

#define FC_ASSERT_OK(expr)                                                          \
    do {                                                                            \
        flashc_status fc_s_ = (expr);                                               \
        if (fc_s_ != FLASHC_OK) {                                                   \
            fc_test_fail(__FILE__, __LINE__, "%s: %s (%s)", #expr, flashc_status_string(fc_s_), \
                         flashc_last_error());                                      \
            return;                                                                 \
        }                                                                           \
    } while (0)

/* Why the cases of this binary cannot run here, or NULL (a weak default in
 * run.c; the GPU tests override it). A reason makes the runner print it and
 * exit with 77, ctest's "skipped". */
const char *fc_test_skip_reason(void);

/* ---- numeric comparison by the tolerance rule (DEVELOPERS.md) ---- */
/* Check got against ref64 with baseline lowp (the plain same-precision result,
 * or NULL) by fc_tol_check (support/check.h). On failure prints what, both
 * errors and the first few failing indices, and records the failure. Returns 1
 * on pass. */
int fc_check_close(const char *what, flashc_dtype dt, const double *got, const double *ref64,
                   const double *lowp, int64_t n);

/* ---- data helpers ---- */
/* Deterministic per-case random numbers (xorshift64*), seeded from the case name. */
uint64_t fc_rand_u64(void);
double fc_rand_uniform(double lo, double hi);
/* Fill n elements of dtype dt with uniform values in [lo, hi). */
void fc_fill_random(void *p, flashc_dtype dt, int64_t n, double lo, double hi);
/* Poison: fill n elements with NaN (float dtypes) so unwritten outputs fail. */
void fc_poison(void *p, flashc_dtype dt, int64_t n);
/* Convert a strided 4-d or 3-d tensor's logical contents into a dense double
 * array [shape...] (element by element with fc_get, support/check.h). */
void fc_tensor_to_double(const flashc_tensor *t, double *dst);

#endif /* FLASHC_TEST_H */
