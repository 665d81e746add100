/* test_gemm.c : the fp32 GEMMs of every SIMD table (src/cpu/simd.h: gemm_nn,
 * gemm_nt, gemm_tn) against float64 sums.
 *
 * gemm_<op>: on each path the build has, for every M in gm_m (one row of a
 * micro-tile, a tile and one, the largest in-place M of simd_avx2.c and one
 * past it, many tiles), every N in gm_n (1, the 8- and 16-lane edges, two
 * panels and a tail, the 64-lane panel of AVX-512 and past it), every K in
 * gm_k (0, 1, the 128-row packing block and one past it, three blocks), and
 * acc 0 and 1, with leading dimensions past the logical sizes:
 *   C[M][N] = (acc ? C : 0) + op(A, B), C poisoned (NaN) when acc = 0, and
 *   nothing written past column N of a row or past row M.
 * A and B are allocated to their last element (the last row ends at its last
 * column), so an ASan build catches a read past them. Each result is held to
 * DEVELOPERS.md's rule against a float64 sum with the plain fp32 sum in k
 * order (after C's old value) as the baseline.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/cpu/simd.h"
#include "fc_test.h"

static const int gm_m[] = {1, 5, 6, 7, 12, 13, 64, 130};
static const int gm_n[] = {1, 8, 9, 16, 17, 40, 64, 100};
static const int gm_k[] = {0, 1, 128, 129, 300};
enum { GM_MAX = 300, GM_PAD = 5, GM_LD = GM_MAX + GM_PAD, GM_ROWS = GM_MAX + 2 };

typedef enum { GM_NN, GM_NT, GM_TN } gm_op;
static const char *const gm_names[] = {"nn", "nt", "tn"};

typedef struct gm_buf {
    float *c; /* (GM_ROWS, GM_LD) */
    double *got, *ref64, *lowp;
} gm_buf;

/* rows x cols at leading dimension ld, allocated to the last element, random */
static float *gm_matrix(int rows, int cols, int ld) {
    size_t n = rows > 0 && cols > 0 ? (size_t)(rows - 1) * ld + cols : 1;
    float *x = (float *)malloc(n * sizeof(float));
    if (x)
        for (size_t i = 0; i < n; i++) x[i] = (float)fc_rand_uniform(-1.0, 1.0);
    return x;
}

/* One call of op on path ops; 1 on pass. */
static int gm_one(const fc_simd_ops *ops, gm_op op, gm_buf *g, int M, int N, int K, int acc) {
    const float canary = 4321.25f;
    /* A is (M, K) for nn and nt, (K, M) for tn; B is (K, N) for nn and tn, (N, K) for nt */
    const int lda = (op == GM_TN ? M : K) + 3, ldb = (op == GM_NT ? K : N) + 2, ldc = N + GM_PAD;
    float *a = op == GM_TN ? gm_matrix(K, M, lda) : gm_matrix(M, K, lda);
    float *b = op == GM_NT ? gm_matrix(N, K, ldb) : gm_matrix(K, N, ldb);
    if (!a || !b) {
        free(a);
        free(b);
        fc_test_fail(__FILE__, __LINE__, "out of memory");
        return 0;
    }
    for (int i = 0; i < (M + 1) * ldc; i++) g->c[i] = canary;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++)
            g->c[m * ldc + n] = acc ? (float)fc_rand_uniform(-1.0, 1.0) : NAN;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s64 = acc ? g->c[m * ldc + n] : 0.0;
            float s32 = acc ? g->c[m * ldc + n] : 0.0f;
            for (int k = 0; k < K; k++) {
                float x = op == GM_TN ? a[k * lda + m] : a[m * lda + k];
                float y = op == GM_NT ? b[n * ldb + k] : b[k * ldb + n];
                s64 += (double)x * y;
                s32 += x * y;
            }
            g->ref64[m * N + n] = s64;
            g->lowp[m * N + n] = s32;
        }
    void (*f)(int, int, int, const float *, int, const float *, int, float *, int, int) =
        op == GM_NN ? ops->gemm_nn : op == GM_NT ? ops->gemm_nt : ops->gemm_tn;
    f(M, N, K, a, lda, b, ldb, g->c, ldc, acc);
    free(a);
    free(b);
    for (int m = 0; m <= M; m++)
        for (int n = m < M ? N : 0; n < ldc; n++)
            if (g->c[m * ldc + n] != canary) {
                fc_test_fail(__FILE__, __LINE__, "gemm_%s %s M=%d N=%d K=%d acc=%d wrote c[%d][%d]",
                             gm_names[op], flashc_simd_name(ops->level), M, N, K, acc, m, n);
                return 0;
            }
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) g->got[m * N + n] = g->c[m * ldc + n];
    char what[96];
    snprintf(what, sizeof what, "gemm_%s %s M=%d N=%d K=%d acc=%d", gm_names[op],
             flashc_simd_name(ops->level), M, N, K, acc);
    return fc_check_close(what, FLASHC_DTYPE_FP32, g->got, g->ref64, g->lowp, (int64_t)M * N);
}

static void gm_run(const void *param) {
    const gm_op op = *(const gm_op *)param;
    gm_buf g;
    const size_t n = (size_t)GM_ROWS * GM_LD;
    g.c = (float *)malloc(n * sizeof(float));
    g.got = (double *)malloc(n * sizeof(double));
    g.ref64 = (double *)malloc(n * sizeof(double));
    g.lowp = (double *)malloc(n * sizeof(double));
    FC_ASSERT_TRUE(g.c && g.got && g.ref64 && g.lowp);
    const flashc_simd saved = flashc_simd_active();
    for (int s = 0; s < FLASHC_SIMD_COUNT && !fc_test_failed(); s++) {
        if (!flashc_simd_supported((flashc_simd)s)) continue;
        FC_EXPECT_STATUS(flashc_set_simd((flashc_simd)s), FLASHC_OK);
        const fc_simd_ops *ops = fc_simd();
        for (int i = 0; i < FC_COUNT(gm_m); i++)
            for (int j = 0; j < FC_COUNT(gm_n); j++)
                for (int k = 0; k < FC_COUNT(gm_k); k++)
                    for (int acc = 0; acc <= 1; acc++)
                        if (!gm_one(ops, op, &g, gm_m[i], gm_n[j], gm_k[k], acc)) goto done;
    }
done:
    FC_EXPECT_STATUS(flashc_set_simd(saved), FLASHC_OK);
    free(g.c);
    free(g.got);
    free(g.ref64);
    free(g.lowp);
}

static const gm_op gm_ops[] = {GM_NN, GM_NT, GM_TN};

FC_TEST_REGISTER(gemm_ops) {
    for (int i = 0; i < FC_COUNT(gm_ops); i++) {
        char name[32];
        snprintf(name, sizeof name, "gemm_ops_%s", gm_names[gm_ops[i]]);
        fc_test_add(name, gm_run, &gm_ops[i]);
    }
}
