/* test_gemm.c : the GEMMs of every SIMD table (src/cpu/simd.h) against float64
 * sums: the fp32 ones (gemm_nn, gemm_nt, gemm_tn) and the bf16 pair ones
 * (gemm_bf16_nn, gemm_bf16_tn, gemm_bf16_nt).
 *
 * gemm_ops_<op>: on each path the build has, for every M in gm_m (one row of a
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
 *
 * gemm_bf16_<op>: the same checks of C[M][N] = (acc ? C : 0) + scale * op(A, B)
 * on each path whose table has the op and whose bf16_cpu features this CPU has
 * (avx512 with AVX512_BF16; amx, the tile GEMMs of 16 x 16 tiles in 32 x 32
 * blocks with the inner dimension in chunks of 256 pairs). A and B are random
 * bf16 in [-1, 1], two to a uint32 word (element 2p low, 2p + 1 high), K2 pairs
 * along the inner dimension. Every M x N of gb_mn (1, 5, a tile and its edges,
 * a block and its edges, three tiles, two blocks, many blocks with tails) runs
 * with every K2 of gb_k2 (0, 1, a tile of pairs and its edges, four tiles); the
 * fewer M x N of gb_mn_long run with the K2 of gb_k2_long (a chunk of 256 pairs
 * and its edges, a chunk and a tail). Where M + N is odd the inner dimension has an odd length,
 * 2 K2 - 1: the high half of each last pair is 0 in both operands, as
 * pack_pairs with r1 = NULL pads it. Each shape runs with acc 0 and 1, and
 * scale 1 and log2(e) / sqrt(64) (the attention scale at D = 64: not a power of
 * two, so a scale applied twice or to C's old value shows). The reference is
 * the float64 sum of the exact products, the baseline the plain fp32 sum in
 * element order times scale plus C's old value; the sums of a shape are made
 * once and serve every path, acc and scale.
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

// ---- bf16 pair GEMMs ----

static const int gb_mn[] = {1, 5, 15, 16, 17, 31, 32, 33, 48, 64, 100, 130};
static const int gb_k2[] = {0, 1, 15, 16, 17, 64};
/* the long inner dimensions cost M N K2 each in the reference: fewer M x N */
static const int gb_mn_long[] = {1, 16, 17, 32, 33, 64, 100};
static const int gb_k2_long[] = {255, 256, 257, 300};
enum { GB_MAX = 130, GB_K2_MAX = 300, GB_PAD = 5, GB_LDC = GB_MAX + GB_PAD, GB_ROWS = GB_MAX + 1 };

typedef struct gb_buf {
    float *c;                   /* (GB_ROWS, GB_LDC) */
    float *af, *bf;             /* (GB_MAX, 2 GB_K2_MAX): rows of A, columns of B, as floats */
    float *s32;                 /* (M, N): the plain fp32 sum of a shape */
    double *s64;                /* (M, N): its float64 sum */
    double *got, *ref64, *lowp; /* (M, N) */
} gb_buf;

/* The bf16 bit pattern nearest x (ties to even; x finite). */
static uint32_t gb_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

/* Element 2p (half 0) or 2p + 1 (half 1) of pair word w. */
static float gb_half(uint32_t w, int half) {
    uint32_t u = half ? w & 0xffff0000u : w << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* rows x cols pairs at leading dimension ld, allocated to the last element, random */
static uint32_t *gb_pairs(int rows, int cols, int ld) {
    size_t n = rows > 0 && cols > 0 ? (size_t)(rows - 1) * ld + cols : 1;
    uint32_t *x = (uint32_t *)malloc(n * sizeof(uint32_t));
    if (x)
        for (size_t i = 0; i < n; i++)
            x[i] = gb_bf16((float)fc_rand_uniform(-1.0, 1.0)) |
                   gb_bf16((float)fc_rand_uniform(-1.0, 1.0)) << 16;
    return x;
}

typedef void (*gb_fn)(int, int, int, const uint32_t *, int, const uint32_t *, int, float *, int,
                      float, int);

static gb_fn gb_op_of(const fc_simd_ops *ops, gm_op op) {
    return op == GM_NN ? ops->gemm_bf16_nn : op == GM_NT ? ops->gemm_bf16_nt : ops->gemm_bf16_tn;
}

/* The table of path s when it has op and this CPU has its bf16_cpu features, else NULL;
 * switches to s. */
static const fc_simd_ops *gb_path(flashc_simd s, gm_op op) {
    if (!flashc_simd_supported(s) || flashc_set_simd(s) != FLASHC_OK) return NULL;
    const fc_simd_ops *ops = fc_simd();
    if (!gb_op_of(ops, op) || (flashc_cpu_features() & ops->bf16_cpu) != ops->bf16_cpu) return NULL;
    return ops;
}

/* One call of the op on the operands of gb_shape, whose sums are in g; 1 on pass. */
static int gb_one(const fc_simd_ops *ops, gm_op op, gb_buf *g, int M, int N, int K2, int odd,
                  const uint32_t *a, int lda, const uint32_t *b, int ldb, float scale, int acc) {
    const float canary = 4321.25f;
    const int ldc = N + GB_PAD;
    for (int i = 0; i < (M + 1) * ldc; i++) g->c[i] = canary;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            const int i = m * N + n;
            float c0 = acc ? (float)fc_rand_uniform(-1.0, 1.0) : NAN;
            g->c[m * ldc + n] = c0;
            g->ref64[i] = (acc ? c0 : 0.0) + (double)scale * g->s64[i];
            g->lowp[i] = (acc ? c0 : 0.0f) + scale * g->s32[i];
        }
    gb_op_of(ops, op)(M, N, K2, a, lda, b, ldb, g->c, ldc, scale, acc);
    char what[128];
    snprintf(what, sizeof what, "gemm_bf16_%s %s M=%d N=%d K2=%d%s acc=%d scale=%.9g", gm_names[op],
             flashc_simd_name(ops->level), M, N, K2, odd ? " (odd K)" : "", acc, scale);
    for (int m = 0; m <= M; m++)
        for (int n = m < M ? N : 0; n < ldc; n++)
            if (g->c[m * ldc + n] != canary) {
                fc_test_fail(__FILE__, __LINE__, "%s wrote c[%d][%d]", what, m, n);
                return 0;
            }
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) g->got[m * N + n] = g->c[m * ldc + n];
    return fc_check_close(what, FLASHC_DTYPE_FP32, g->got, g->ref64, g->lowp, (int64_t)M * N);
}

/* Operand x (pairs, ld apart) as dst[r][2 K2] floats, row r of the product's
 * side (m of A, n of B): pair (r, p) at x[r * ld + p] when by_row, else at
 * x[p * ld + r]. With odd, the last pair's high half is set to 0 first (as the
 * callers pad an odd inner dimension). */
static void gb_unpack(uint32_t *x, int ld, int rows, int K2, int by_row, int odd, float *dst) {
    for (int r = 0; r < rows; r++)
        for (int p = 0; p < K2; p++) {
            uint32_t *w = by_row ? &x[r * ld + p] : &x[p * ld + r];
            if (odd && p == K2 - 1) *w &= 0xffffu;
            dst[r * 2 * K2 + 2 * p] = gb_half(*w, 0);
            dst[r * 2 * K2 + 2 * p + 1] = gb_half(*w, 1);
        }
}

/* Operands of one shape, their sums, and every path x acc x scale on them; 1 on pass. */
static int gb_shape(gm_op op, gb_buf *g, int M, int N, int K2, const float *scales, int nscales) {
    /* pairs: A is (M, K2) for nn and nt, (K2, M) for tn; B (K2, N) for nn and tn, (N, K2) for nt */
    const int lda = (op == GM_TN ? M : K2) + 3, ldb = (op == GM_NT ? K2 : N) + 2;
    uint32_t *a = op == GM_TN ? gb_pairs(K2, M, lda) : gb_pairs(M, K2, lda);
    uint32_t *b = op == GM_NT ? gb_pairs(N, K2, ldb) : gb_pairs(K2, N, ldb);
    if (!a || !b) {
        free(a);
        free(b);
        fc_test_fail(__FILE__, __LINE__, "out of memory");
        return 0;
    }
    const int odd = K2 > 0 && (M + N) % 2 == 1;
    const int ka = 2 * K2; /* elements of the inner dimension, the odd one's 0 included */
    gb_unpack(a, lda, M, K2, op != GM_TN, odd, g->af);
    gb_unpack(b, ldb, N, K2, op == GM_NT, odd, g->bf);
    /* bf16 x bf16 has at most 16 significant bits: exact in fp32 and float64 */
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            const float *x = g->af + m * ka, *y = g->bf + n * ka;
            double s64 = 0.0;
            float s32 = 0.0f;
            for (int k = 0; k < ka; k++) {
                s64 += (double)x[k] * y[k];
                s32 += x[k] * y[k];
            }
            g->s64[m * N + n] = s64;
            g->s32[m * N + n] = s32;
        }
    int ok = 1;
    for (int s = 0; s < FLASHC_SIMD_COUNT && ok; s++) {
        const fc_simd_ops *ops = gb_path((flashc_simd)s, op);
        if (!ops) continue;
        for (int acc = 0; acc <= 1 && ok; acc++)
            for (int i = 0; i < nscales && ok; i++)
                ok = gb_one(ops, op, g, M, N, K2, odd, a, lda, b, ldb, scales[i], acc);
    }
    free(a);
    free(b);
    return ok;
}

static void gb_run(const void *param) {
    const gm_op op = *(const gm_op *)param;
    const float scales[] = {1.0f, (float)(1.0 / (sqrt(64.0) * log(2.0)))};
    gb_buf g;
    const size_t nc = (size_t)GB_ROWS * GB_LDC, nmn = (size_t)GB_MAX * GB_MAX;
    const size_t nk = (size_t)GB_MAX * 2 * GB_K2_MAX;
    g.c = (float *)malloc(nc * sizeof(float));
    g.af = (float *)malloc(nk * sizeof(float));
    g.bf = (float *)malloc(nk * sizeof(float));
    g.s32 = (float *)malloc(nmn * sizeof(float));
    g.s64 = (double *)malloc(nmn * sizeof(double));
    g.got = (double *)malloc(nmn * sizeof(double));
    g.ref64 = (double *)malloc(nmn * sizeof(double));
    g.lowp = (double *)malloc(nmn * sizeof(double));
    const flashc_simd saved = flashc_simd_active();
    int npaths = 0; /* none (no AVX512_BF16): the case passes without running */
    for (int s = 0; s < FLASHC_SIMD_COUNT; s++) npaths += gb_path((flashc_simd)s, op) != NULL;
    int ok = g.c && g.af && g.bf && g.s32 && g.s64 && g.got && g.ref64 && g.lowp;
    FC_EXPECT_TRUE(ok);
    ok = ok && npaths > 0;
    for (int i = 0; i < FC_COUNT(gb_mn) && ok; i++)
        for (int j = 0; j < FC_COUNT(gb_mn) && ok; j++)
            for (int k = 0; k < FC_COUNT(gb_k2) && ok; k++)
                ok = gb_shape(op, &g, gb_mn[i], gb_mn[j], gb_k2[k], scales, FC_COUNT(scales));
    for (int i = 0; i < FC_COUNT(gb_mn_long) && ok; i++)
        for (int j = 0; j < FC_COUNT(gb_mn_long) && ok; j++)
            for (int k = 0; k < FC_COUNT(gb_k2_long) && ok; k++)
                ok = gb_shape(op, &g, gb_mn_long[i], gb_mn_long[j], gb_k2_long[k], scales,
                              FC_COUNT(scales));
    FC_EXPECT_STATUS(flashc_set_simd(saved), FLASHC_OK);
    free(g.c);
    free(g.af);
    free(g.bf);
    free(g.s32);
    free(g.s64);
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

static const gm_op gb_ops[] = {GM_NN, GM_TN, GM_NT};

FC_TEST_REGISTER(gemm_bf16) {
    for (int i = 0; i < FC_COUNT(gb_ops); i++) {
        char name[32];
        snprintf(name, sizeof name, "gemm_bf16_%s", gm_names[gb_ops[i]]);
        fc_test_add(name, gb_run, &gb_ops[i]);
    }
}
