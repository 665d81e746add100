/* simd_scalar.c : the portable fc_simd_ops, plain C loops.
 *
 * The reference every vector path must agree with, and the path on CPUs without
 * AVX2. Built without -m flags.
 */
#include <math.h>

#include "../common/philox.h"
#include "simd.h"

static void fc_scalar_gemm_nn(int M, int N, int K, const float *A, int lda, const float *B,
                              int ldb, float *C, int ldc, int acc) {
    for (int m = 0; m < M; m++) {
        float *c = C + (size_t)m * ldc;
        if (!acc)
            for (int n = 0; n < N; n++) c[n] = 0.0f;
        for (int k = 0; k < K; k++) {
            float a = A[(size_t)m * lda + k];
            const float *b = B + (size_t)k * ldb;
            for (int n = 0; n < N; n++) c[n] += a * b[n];
        }
    }
}

static void fc_scalar_gemm_nt(int M, int N, int K, const float *A, int lda, const float *B,
                              int ldb, float *C, int ldc, int acc) {
    for (int m = 0; m < M; m++) {
        const float *a = A + (size_t)m * lda;
        for (int n = 0; n < N; n++) {
            const float *b = B + (size_t)n * ldb;
            float s = 0.0f;
            for (int k = 0; k < K; k++) s += a[k] * b[k];
            C[(size_t)m * ldc + n] = acc ? C[(size_t)m * ldc + n] + s : s;
        }
    }
}

static void fc_scalar_gemm_tn(int M, int N, int K, const float *A, int lda, const float *B,
                              int ldb, float *C, int ldc, int acc) {
    if (!acc)
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) C[(size_t)m * ldc + n] = 0.0f;
    for (int k = 0; k < K; k++) {
        const float *b = B + (size_t)k * ldb;
        for (int m = 0; m < M; m++) {
            float a = A[(size_t)k * lda + m];
            float *c = C + (size_t)m * ldc;
            for (int n = 0; n < N; n++) c[n] += a * b[n];
        }
    }
}

static float fc_scalar_exp2_sum(int n, float *x, float m) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) {
        x[i] = exp2f(x[i] - m);
        s += x[i];
    }
    return s;
}

static float fc_scalar_max(int n, const float *x) {
    float m = -INFINITY;
    for (int i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

static void fc_scalar_scale(int n, float *x, float s) {
    for (int i = 0; i < n; i++) x[i] *= s;
}

static void fc_scalar_ds_row(int n, float *p, const float *dp, const float *z, const float *t,
                             float delta) {
    for (int i = 0; i < n; i++) {
        float v = p[i] * ((z ? dp[i] * z[i] : dp[i]) - delta);
        p[i] = t ? v * t[i] : v;
    }
}

static void fc_scalar_load(flashc_dtype dt, int n, const void *src, float *dst, float mul) {
    for (int i = 0; i < n; i++) dst[i] = mul * fc_load(dt, src, i);
}

static void fc_scalar_store(flashc_dtype dt, int n, const float *src, void *dst, float mul) {
    for (int i = 0; i < n; i++) fc_store(dt, dst, i, mul * src[i]);
}

static void fc_scalar_score_mod(int M, int N, float *x, int ld, const fc_score_mod *mod) {
    for (int r = 0; r < M; r++) {
        float *row = x + (size_t)r * ld;
        int32_t d = (int32_t)(mod->d0 + (int64_t)r * mod->dr);
        for (int c = 0; c < N; c++, d += mod->dc) {
            float v = row[c];
            if (mod->cap != 0.0f) v = mod->cap * tanhf(v);
            if (mod->slope != 0.0f) v -= mod->slope * fabsf((float)d);
            if (!FC_WINDOW_SEES(d, mod->wl, mod->wr)) v = -INFINITY;
            row[c] = v;
        }
    }
}

static void fc_scalar_softmax_cols(int M, int N, float *x, int ld, float *m, float *l,
                                   float *alpha) {
    for (int c = 0; c < N; c++) {
        float mo = m[c], mx = mo;
        for (int r = 0; r < M; r++) mx = x[(size_t)r * ld + c] > mx ? x[(size_t)r * ld + c] : mx;
        float u = mx == -INFINITY ? 0.0f : mx;
        float s = 0.0f;
        for (int r = 0; r < M; r++) {
            float e = exp2f(x[(size_t)r * ld + c] - u);
            x[(size_t)r * ld + c] = e;
            s += e;
        }
        m[c] = mx;
        alpha[c] = exp2f(mo - u);
        l[c] = alpha[c] * l[c] + s;
    }
}

static void fc_scalar_dropout_cols(int M, int N, float *x, int ld, uint64_t seed, uint64_t offset,
                                   uint32_t bh, uint32_t i0, int64_t j0, uint32_t threshold,
                                   float scale) {
    for (int c = 0; c < N; c++) {
        for (int64_t g = j0 >> 3; 8 * g < j0 + M; g++) {
            fc_philox4 r = fc_dropout_group(seed, offset, bh, i0 + (uint32_t)c, (uint64_t)g);
            for (int w = 0; w < 8; w++) {
                int64_t j = 8 * g + w;
                if (j < j0 || j >= j0 + M) continue;
                float *e = x + (size_t)(j - j0) * ld + c;
                *e = fc_dropout_word(r, w) >= threshold ? *e * scale : 0.0f;
            }
        }
    }
}

const fc_simd_ops fc_simd_scalar_ops = {
    FLASHC_SIMD_SCALAR, fc_scalar_gemm_nn, fc_scalar_gemm_nt, fc_scalar_gemm_tn,
    fc_scalar_exp2_sum, fc_scalar_max,     fc_scalar_scale,   fc_scalar_load,
    fc_scalar_store,  fc_scalar_score_mod, fc_scalar_softmax_cols, fc_scalar_dropout_cols,
    0,                NULL,                NULL,              NULL, NULL, /* no bf16 dot products */
    NULL, /* no softmax_rows_bf16 (the amx forward's) */
    NULL, NULL, NULL, /* no row ops (dot_rows, dot_rows_bf16, axpy_rows; fwd.c) */
    NULL, /* no split (the amx path's) */
    fc_scalar_ds_row,
    NULL, /* no row_pairs (no bf16 dot products) */
};
