/* test_rows.c : the row ops of decode (src/cpu/simd.h: dot_rows for Q K^T,
 * axpy_rows for P V, and dot_rows_bf16 for bf16 rows where a path has bf16
 * dot products) against float64 sums, on every SIMD path that has them.
 *
 * rows_ops_<dtype>: for every column count nq in 1..8, every length in
 * rw_dims (whole vectors, the % 16 tails, each width of axpy_rows' passes:
 * 16 vectors at nq = 1 down to 1, head dims 1..1024) and row counts 1, 5 and
 * 40, the rows sit out of order in a larger pool (as a paged cache's do) and:
 *   dot_rows:  s[c][r] = q[c] . k_r, written for r < nk only (the rest of s's
 *              rows keep their poison);
 *   axpy_rows: o[c][:Dv] += sum_r p[r][c] v_r, o[c][Dv:ldo] untouched.
 * Each result is held to DEVELOPERS.md's rule against a float64 sum with the
 * plain fp32 sum (in key or element order) as the baseline. The inputs are
 * values of the dtype, so widening them is exact.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/cpu/simd.h"
#include "fc_test.h"

static const int rw_dims[] = {1,  7,  15,  16,  17,  33,  64,  100, 128,
                              129, 200, 256, 257, 385, 512, 1000, 1024};
static const int rw_nrows[] = {1, 5, 40};
enum { RW_MAX_D = 1024, RW_MAX_NQ = 8, RW_MAX_ROWS = 40, RW_POOL = 2 * RW_MAX_ROWS, RW_PAD = 16 };

typedef struct rw_buf {
    flashc_dtype dt;
    size_t es;
    char *pool;          /* (RW_POOL, RW_MAX_D) rows of dtype dt */
    const void **rows;   /* (RW_MAX_ROWS) rows of the pool, out of order */
    int *row_of;         /* (RW_MAX_ROWS) their indices in the pool */
    float *a;            /* (RW_MAX_NQ, RW_MAX_D + RW_PAD) q, or (RW_MAX_ROWS, ...) p */
    float *out;          /* (RW_MAX_NQ, RW_MAX_D + RW_PAD) s or o */
    double *got, *ref64, *lowp;
} rw_buf;

/* Element d of pool row j as a double (a value of the dtype). */
static double rw_pool(const rw_buf *b, int j, int d) {
    return fc_get(b->pool + (size_t)j * RW_MAX_D * b->es, b->dt, d);
}

/* nr distinct pool rows in random order. */
static void rw_pick_rows(rw_buf *b, int nr) {
    for (int r = 0; r < nr; r++) {
        int j, dup;
        do {
            j = (int)(fc_rand_u64() % RW_POOL);
            dup = 0;
            for (int i = 0; i < r; i++) dup |= b->row_of[i] == j;
        } while (dup);
        b->row_of[r] = j;
        b->rows[r] = b->pool + (size_t)j * RW_MAX_D * b->es;
    }
}

/* The end of a dot_rows check (op names it): nothing written past row nk of
 * s (lds apart, poisoned), then got against ref64 with lowp as the baseline. */
static int rw_dot_check(const char *op, rw_buf *b, int nq, int nk, int D, int lds) {
    for (int c = 0; c < nq; c++)
        for (int r = nk; r < lds; r++)
            if (!isnan(b->out[c * lds + r])) {
                fc_test_fail(__FILE__, __LINE__, "%s nq=%d nk=%d D=%d wrote s[%d][%d]", op, nq, nk,
                             D, c, r);
                return 0;
            }
    char what[64];
    snprintf(what, sizeof what, "%s nq=%d nk=%d D=%d", op, nq, nk, D);
    return fc_check_close(what, FLASHC_DTYPE_FP32, b->got, b->ref64, b->lowp, (int64_t)nq * nk);
}

/* dot_rows with nq columns of q, nk rows of D elements. */
static int rw_dot(const fc_simd_ops *ops, rw_buf *b, int nq, int nk, int D) {
    const int ldq = D + 3, lds = nk + 5;
    rw_pick_rows(b, nk);
    for (int e = 0; e < nq * ldq; e++) b->a[e] = (float)fc_rand_uniform(-1.0, 1.0);
    fc_poison(b->out, FLASHC_DTYPE_FP32, (int64_t)nq * lds);
    ops->dot_rows(b->dt, nk, D, b->rows, b->a, ldq, nq, b->out, lds);
    for (int c = 0; c < nq; c++)
        for (int r = 0; r < nk; r++) {
            double s64 = 0.0;
            float s32 = 0.0f;
            for (int d = 0; d < D; d++) {
                double k = rw_pool(b, b->row_of[r], d);
                s64 += (double)b->a[c * ldq + d] * k;
                s32 += b->a[c * ldq + d] * (float)k;
            }
            b->got[c * nk + r] = b->out[c * lds + r];
            b->ref64[c * nk + r] = s64;
            b->lowp[c * nk + r] = s32;
        }
    return rw_dot_check("dot_rows", b, nq, nk, D, lds);
}

/* dot_rows_bf16 (bf16 rows, where the path has it) with nq columns of q in bf16
 * pairs and a scale; element D of each K row is a NaN, which must not be read
 * (q's pair past an odd D has a 0 high half, and NaN times 0 is NaN). */
static int rw_dot_bf16(const fc_simd_ops *ops, rw_buf *b, int nq, int nk, int D) {
    const int ldq2 = (D + 1) / 2 + 3, lds = nk + 5;
    const float scale = 0.18033688f;
    uint32_t *q2 = (uint32_t *)b->a; /* (nq, ldq2) words: fits b->a's floats */
    uint16_t *q16 = (uint16_t *)q2;
    rw_pick_rows(b, nk);
    for (int c = 0; c < nq; c++)
        for (int d = 0; d < 2 * ldq2; d++) {
            float v = (float)fc_rand_uniform(-1.0, 1.0);
            uint16_t h;
            fc_set(&h, FLASHC_DTYPE_BF16, 0, v);
            q16[(size_t)c * 2 * ldq2 + d] = d < D ? h : (uint16_t)0;
        }
    uint16_t saved[RW_MAX_ROWS];
    for (int r = 0; r < nk; r++)
        if (D < RW_MAX_D) {
            uint16_t *row = (uint16_t *)b->rows[r];
            saved[r] = row[D];
            row[D] = 0x7fc0; /* bf16 NaN */
        }
    fc_poison(b->out, FLASHC_DTYPE_FP32, (int64_t)nq * lds);
    ops->dot_rows_bf16(nk, D, b->rows, q2, ldq2, nq, b->out, lds, scale);
    for (int r = 0; r < nk; r++)
        if (D < RW_MAX_D) ((uint16_t *)b->rows[r])[D] = saved[r];
    for (int c = 0; c < nq; c++)
        for (int r = 0; r < nk; r++) {
            double s64 = 0.0;
            float s32 = 0.0f;
            for (int d = 0; d < D; d++) {
                double q = fc_get(q16 + (size_t)c * 2 * ldq2, FLASHC_DTYPE_BF16, d);
                double k = rw_pool(b, b->row_of[r], d);
                s64 += q * k;
                s32 += (float)q * (float)k;
            }
            b->got[c * nk + r] = b->out[c * lds + r];
            b->ref64[c * nk + r] = scale * s64;
            b->lowp[c * nk + r] = scale * s32;
        }
    return rw_dot_check("dot_rows_bf16", b, nq, nk, D, lds);
}

/* axpy_rows with nq columns of p, nv rows of Dv elements. */
static int rw_axpy(const fc_simd_ops *ops, rw_buf *b, int nq, int nv, int Dv) {
    const int ldp = nq + 3, ldo = Dv + RW_PAD;
    const float canary = 1234.5f;
    rw_pick_rows(b, nv);
    for (int e = 0; e < nv * ldp; e++) b->a[e] = (float)fc_rand_uniform(0.0, 1.0);
    for (int c = 0; c < nq; c++)
        for (int d = 0; d < ldo; d++)
            b->out[c * ldo + d] = d < Dv ? (float)fc_rand_uniform(-1.0, 1.0) : canary;
    for (int c = 0; c < nq; c++)
        for (int d = 0; d < Dv; d++) {
            double o64 = b->out[c * ldo + d];
            float o32 = b->out[c * ldo + d];
            for (int r = 0; r < nv; r++) {
                double v = rw_pool(b, b->row_of[r], d);
                o64 += (double)b->a[r * ldp + c] * v;
                o32 += b->a[r * ldp + c] * (float)v;
            }
            b->ref64[c * Dv + d] = o64;
            b->lowp[c * Dv + d] = o32;
        }
    ops->axpy_rows(b->dt, nv, Dv, b->rows, b->a, ldp, nq, b->out, ldo);
    for (int c = 0; c < nq; c++) {
        for (int d = 0; d < Dv; d++) b->got[c * Dv + d] = b->out[c * ldo + d];
        for (int d = Dv; d < ldo; d++)
            if (b->out[c * ldo + d] != canary) {
                fc_test_fail(__FILE__, __LINE__, "axpy_rows nq=%d nv=%d Dv=%d wrote o[%d][%d]",
                             nq, nv, Dv, c, d);
                return 0;
            }
    }
    char what[64];
    snprintf(what, sizeof what, "axpy_rows nq=%d nv=%d Dv=%d", nq, nv, Dv);
    return fc_check_close(what, FLASHC_DTYPE_FP32, b->got, b->ref64, b->lowp, (int64_t)nq * Dv);
}

static void rw_run(const void *param) {
    rw_buf b;
    memset(&b, 0, sizeof b);
    b.dt = *(const flashc_dtype *)param;
    b.es = flashc_dtype_size(b.dt);
    const size_t wide = (size_t)RW_MAX_D + RW_PAD;
    b.pool = (char *)malloc((size_t)RW_POOL * RW_MAX_D * b.es);
    b.rows = (const void **)malloc(RW_MAX_ROWS * sizeof *b.rows);
    b.row_of = (int *)malloc(RW_MAX_ROWS * sizeof *b.row_of);
    b.a = (float *)malloc(RW_MAX_ROWS * wide * sizeof *b.a);
    b.out = (float *)malloc(RW_MAX_NQ * wide * sizeof *b.out);
    b.got = (double *)malloc(RW_MAX_NQ * wide * sizeof *b.got);
    b.ref64 = (double *)malloc(RW_MAX_NQ * wide * sizeof *b.ref64);
    b.lowp = (double *)malloc(RW_MAX_NQ * wide * sizeof *b.lowp);
    FC_ASSERT_TRUE(b.pool && b.rows && b.row_of && b.a && b.out && b.got && b.ref64 && b.lowp);
    fc_fill_random(b.pool, b.dt, (int64_t)RW_POOL * RW_MAX_D, -1.0, 1.0);

    const flashc_simd saved = flashc_simd_active();
    for (int s = 0; s < FLASHC_SIMD_COUNT && !fc_test_failed(); s++) {
        if (!flashc_simd_supported((flashc_simd)s)) continue;
        FC_EXPECT_STATUS(flashc_set_simd((flashc_simd)s), FLASHC_OK);
        const fc_simd_ops *ops = fc_simd();
        /* fwd.c runs by rows only where a path has both */
        FC_EXPECT_TRUE(!ops->dot_rows == !ops->axpy_rows);
        if (!ops->dot_rows || !ops->axpy_rows) continue;
        int bf16_dot = b.dt == FLASHC_DTYPE_BF16 && ops->dot_rows_bf16 &&
                       (flashc_cpu_features() & ops->bf16_cpu) == ops->bf16_cpu;
        for (int nq = 1; nq <= RW_MAX_NQ; nq++)
            for (int i = 0; i < FC_COUNT(rw_dims); i++)
                for (int k = 0; k < FC_COUNT(rw_nrows); k++)
                    if (!rw_dot(ops, &b, nq, rw_nrows[k], rw_dims[i]) ||
                        !rw_axpy(ops, &b, nq, rw_nrows[k], rw_dims[i]) ||
                        (bf16_dot && !rw_dot_bf16(ops, &b, nq, rw_nrows[k], rw_dims[i])))
                        goto done;
    }
done:
    FC_EXPECT_STATUS(flashc_set_simd(saved), FLASHC_OK);
    free(b.pool);
    free((void *)b.rows);
    free(b.row_of);
    free(b.a);
    free(b.out);
    free(b.got);
    free(b.ref64);
    free(b.lowp);
}

static const flashc_dtype rw_dtypes[] = {FLASHC_DTYPE_FP32, FLASHC_DTYPE_FP16, FLASHC_DTYPE_BF16};

FC_TEST_REGISTER(rows_ops) {
    for (int i = 0; i < FC_COUNT(rw_dtypes); i++) {
        char name[64];
        snprintf(name, sizeof name, "rows_ops_%s", flashc_dtype_name(rw_dtypes[i]));
        fc_test_add(name, rw_run, &rw_dtypes[i]);
    }
}

/* softmax_rows_bf16 (the amx path's row softmax, fwd.c's queries-down tiles) sums a
 * row the same whatever masked keys (-inf) follow its last one: a tall tile's edge
 * block carries more of them than a 256-row tile's, and the thread count picks the
 * tile. For lengths n around the 16- and 32-lane chunks and 1..40 such keys after
 * them, m, l, alpha and the n bf16 probabilities (and an odd n's zero pad) must be
 * bit for bit those of the n keys alone; each row starts from a running m and l. */
FC_TEST(rows_softmax_bf16_masked_tail) {
    const flashc_simd orig = flashc_simd_active();
    enum { M = 3, NMAX = 256, LDP = NMAX / 2 };
    static const int ns[] = {1, 15, 16, 17, 31, 33, 47, 49, 100, 152, 200};
    static const int extras[] = {1, 7, 8, 16, 17, 24, 40};
    static float x[M * NMAX];
    static uint32_t p2a[M * LDP], p2b[M * LDP];
    for (int s = 0; s < FLASHC_SIMD_COUNT; s++) {
        if (!flashc_simd_supported((flashc_simd)s) ||
            flashc_set_simd((flashc_simd)s) != FLASHC_OK)
            continue;
        const fc_simd_ops *ops = fc_simd();
        if (!ops->softmax_rows_bf16 || (flashc_cpu_features() & ops->bf16_cpu) != ops->bf16_cpu)
            continue;
        for (int in = 0; in < FC_COUNT(ns); in++)
            for (int ie = 0; ie < FC_COUNT(extras); ie++) {
                const int n = ns[in], n2 = n + extras[ie];
                if (n2 > NMAX) continue;
                for (int i = 0; i < M * NMAX; i++)
                    x[i] = (float)(fc_rand_u64() % 4001) / 500.0f - 4.0f;
                for (int r = 0; r < M; r++)
                    for (int c = n; c < NMAX; c++) x[r * NMAX + c] = -INFINITY;
                float ma[M], la[M], aa[M], mb[M], lb[M], ab[M];
                for (int r = 0; r < M; r++) {
                    ma[r] = mb[r] = 2.0f - (float)r;
                    la[r] = lb[r] = 1.5f + (float)r;
                }
                memset(p2a, 0xff, sizeof p2a);
                memset(p2b, 0xff, sizeof p2b);
                ops->softmax_rows_bf16(M, n, x, NMAX, 0.75f, ma, la, aa, p2a, NULL, LDP);
                ops->softmax_rows_bf16(M, n2, x, NMAX, 0.75f, mb, lb, ab, p2b, NULL, LDP);
                for (int r = 0; r < M; r++) {
                    const uint16_t *pa = (const uint16_t *)(p2a + r * LDP),
                                   *pb = (const uint16_t *)(p2b + r * LDP);
                    int same = memcmp(&ma[r], &mb[r], sizeof(float)) == 0 &&
                               memcmp(&la[r], &lb[r], sizeof(float)) == 0 &&
                               memcmp(&aa[r], &ab[r], sizeof(float)) == 0 &&
                               memcmp(pa, pb, (size_t)(n + (n & 1)) * sizeof(uint16_t)) == 0;
                    if (!same)
                        fc_test_fail(__FILE__, __LINE__,
                                     "%s: row %d of %d keys differs with %d masked keys after them "
                                     "(l %.9g against %.9g)",
                                     flashc_simd_name((flashc_simd)s), r, n, extras[ie],
                                     (double)la[r], (double)lb[r]);
                }
            }
    }
    FC_EXPECT_STATUS(flashc_set_simd(orig), FLASHC_OK);
}
