/* simd_avx512.c : fc_simd_ops for AVX-512 (F, BW, DQ, VL; BF16 for the optional
 * bf16 dot products), 16 fp32 lanes per zmm register. Built with -mavx512f
 * -mavx512bw -mavx512dq -mavx512vl -mavx512bf16 -mfma -mf16c; the bf16 entries
 * run only where flashc_cpu_features() has AVX512_BF16 (bf16_cpu).
 *
 * GEMMs: one register-blocked micro-kernel (the GotoBLAS / BLIS shape, Goto and
 * van de Geijn, "Anatomy of high-performance matrix multiplication", TOMS 2008).
 * An MR x NR = 6 x 64 tile of C lives in 24 zmm accumulators; each step of the
 * inner dimension loads one 64-wide row of B (4 zmm) and broadcasts 6 elements
 * of A: 24 FMAs for 10 loads, so the FMA pipes, not the load ports, set the
 * pace. gemm_nn broadcasts down the rows of A, gemm_tn along a row of A^T (A is
 * read in place in both), gemm_nt first transposes a 128 x 64 panel of B^T onto
 * the stack with 16 x 16 in-register transposes. Column tails use masked loads
 * and stores, row tails a smaller instance of the kernel. The bf16 GEMMs are
 * the same kernel on vdpbf16ps: one pair of the inner dimension per step, 32
 * multiply-adds per instruction instead of 16 (twice the fp32 rate on Zen4);
 * gemm_bf16_nt transposes panels of B as gemm_nt does (a pair is one 32-bit word).
 *
 * exp2: x = n + f with n = round(x), |f| <= 1/2; 2^f from a degree-6
 * polynomial (the Chebyshev interpolant of 2^f on [-1/2, 1/2], at most 1.4
 * units of 2^-24 relative error in fp32), times 2^n with vscalefps; below
 * 2^-126 the result is 0 rather than subnormal (FC_EXP2_LO).
 * tanh(x) = sign(x) (1 - e) / (1 + e) with e = 2^(-2 |x| log2 e): an absolute
 * error of a few 1e-8. Dropout runs Philox4x32-10 (philox.h) on 16 lanes, one
 * (query, group of 8 keys) per lane, with 32 x 32 -> 64-bit products from
 * vpmuludq on the even and odd lanes.
 *
 * Decode's row ops (narrow tiles of at most 8 query columns, fwd.c): dot_rows
 * takes one dot product per (K row, query column), 16 / NQ rows at a time in 16
 * accumulators summed together by a transpose-and-add tree (fc_hsum16);
 * axpy_rows adds each V row, scaled by its P, to the columns' rows of O with
 * NQ x W accumulators in registers. Both read the rows where they lie, fp16
 * widened by vcvtph2ps and bf16 by a shift (axpy_rows: a shift for the even
 * elements and a mask for the odd of 32), so a 16-bit cache is never copied
 * to fp32.
 *
 * Not here: attention itself (src/cpu/fwd.c and bwd.c own the algorithm).
 */
#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#include "simd.h"
#include "../common/philox.h"
#include "../common/score.h"

/* ---- constants ---- */
/* 2^f ~ sum_k fc_exp2_c[k] f^k on [-1/2, 1/2] */
static const float fc_exp2_c[7] = {1.000000000e+00f, 6.931471825e-01f, 2.402265072e-01f,
                                   5.550327152e-02f, 9.618056938e-03f, 1.340042800e-03f,
                                   1.546144485e-04f};
/* exp2 of x below FC_EXP2_LO is 0, not the subnormal 2^x: vscalefps takes a
 * microcode assist for a subnormal or underflowing result on Intel cores
 * (without FTZ), and masked scores (-inf) would hit it on every element (a
 * local window's forward on amx: 4.7 -> 2.0 ms, bench/NOTES.md). Above
 * FC_EXP2_HI, inf. */
#define FC_EXP2_LO (-126.0f)
#define FC_EXP2_HI 128.0f

/* ---- vector math ---- */
/* exp2(x) for x <= FC_EXP2_HI or NaN (NaN stays: max returns its second
 * operand when either is NaN) */
static inline __m512 fc_exp2_upto(__m512 x) {
    const __m512 lo = _mm512_set1_ps(FC_EXP2_LO);
    __mmask16 zero = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_max_ps(lo, x);
    __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(fc_exp2_c[6]);
    for (int k = 5; k >= 0; k--) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(fc_exp2_c[k]));
    return _mm512_maskz_scalef_ps((__mmask16)~zero, p, n);
}

static inline __m512 fc_exp2(__m512 x) {
    return fc_exp2_upto(_mm512_min_ps(_mm512_set1_ps(FC_EXP2_HI), x));
}

static inline __m512 fc_tanh(__m512 x) {
    __m512 ax = _mm512_abs_ps(x);
    __m512 e = fc_exp2(_mm512_mul_ps(ax, _mm512_set1_ps((float)(-2.0 * FC_LOG2E))));
    __m512 one = _mm512_set1_ps(1.0f);
    __m512 t = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
    /* t >= 0: give it the sign bit of x */
    return _mm512_or_ps(t, _mm512_and_ps(x, _mm512_set1_ps(-0.0f)));
}

/* The lanes [0, n) of a 16-lane vector, n in [0, 16]. */
static inline __mmask16 fc_mask(int n) {
    return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n > 0 ? n : 0)) - 1u);
}

/* ---- GEMM ---- */
enum { FC_MR = 6, FC_NV = 4, FC_NR = 16 * FC_NV, FC_KC = 128 };

/* C[R][16 NV] = (acc ? C : 0) + sum_k A(r, k) B[k][.], A(r, k) = A[r*ars + k*aks];
 * the last of the NV vectors covers the lanes of ml only. */
static inline __attribute__((always_inline)) void
fc_ukr(const int R, const int NV, int K, const float *A, ptrdiff_t ars, ptrdiff_t aks,
       const float *B, ptrdiff_t ldb, float *C, ptrdiff_t ldc, int acc, __mmask16 ml) {
    __m512 c[FC_MR][FC_NV];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++)
            c[r][v] = !acc          ? _mm512_setzero_ps()
                      : v == NV - 1 ? _mm512_maskz_loadu_ps(ml, C + r * ldc + 16 * v)
                                    : _mm512_loadu_ps(C + r * ldc + 16 * v);
    for (int k = 0; k < K; k++) {
        __m512 b[FC_NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++)
            b[v] =
                v == NV - 1 ? _mm512_maskz_loadu_ps(ml, B + 16 * v) : _mm512_loadu_ps(B + 16 * v);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512 a = _mm512_set1_ps(A[r * ars]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) c[r][v] = _mm512_fmadd_ps(a, b[v], c[r][v]);
        }
        A += aks;
        B += ldb;
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            if (v == NV - 1)
                _mm512_mask_storeu_ps(C + r * ldc + 16 * v, ml, c[r][v]);
            else
                _mm512_storeu_ps(C + r * ldc + 16 * v, c[r][v]);
        }
}

#define FC_UKR_NV(R_, ARS, AKS)                                                                    \
    switch (nv) {                                                                                  \
    case 1: fc_ukr(R_, 1, K, A, ARS, AKS, B, ldb, C, ldc, acc, ml); break;                         \
    case 2: fc_ukr(R_, 2, K, A, ARS, AKS, B, ldb, C, ldc, acc, ml); break;                         \
    case 3: fc_ukr(R_, 3, K, A, ARS, AKS, B, ldb, C, ldc, acc, ml); break;                         \
    default: fc_ukr(R_, 4, K, A, ARS, AKS, B, ldb, C, ldc, acc, ml); break;                        \
    }
#define FC_UKR_R(ARS, AKS)                                                                         \
    switch (R) {                                                                                   \
    case 1: FC_UKR_NV(1, ARS, AKS) break;                                                          \
    case 2: FC_UKR_NV(2, ARS, AKS) break;                                                          \
    case 3: FC_UKR_NV(3, ARS, AKS) break;                                                          \
    case 4: FC_UKR_NV(4, ARS, AKS) break;                                                          \
    case 5: FC_UKR_NV(5, ARS, AKS) break;                                                          \
    default: FC_UKR_NV(6, ARS, AKS) break;                                                         \
    }

/* One micro-tile, A read by rows (A(r, k) = A[r*lda + k]). */
static void fc_tile_n(int R, int nv, int K, const float *A, ptrdiff_t lda, const float *B,
                      ptrdiff_t ldb, float *C, ptrdiff_t ldc, int acc, __mmask16 ml) {
    FC_UKR_R(lda, 1)
}

/* One micro-tile, A read by columns (A(r, k) = A[k*lda + r]). */
static void fc_tile_t(int R, int nv, int K, const float *A, ptrdiff_t lda, const float *B,
                      ptrdiff_t ldb, float *C, ptrdiff_t ldc, int acc, __mmask16 ml) {
    FC_UKR_R(1, lda)
}

/* C[M][N] (+)= op(A) B over micro-tiles: column panels of B outside, so a
 * K x 64 panel of B stays in cache while the rows of A stream past it. */
static void fc_gemm(int at, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                    float *C, int ldc, int acc) {
    for (int n0 = 0; n0 < N; n0 += FC_NR) {
        int n = N - n0 < FC_NR ? N - n0 : FC_NR;
        int nv = (n + 15) / 16;
        __mmask16 ml = fc_mask(n - 16 * (nv - 1));
        for (int m0 = 0; m0 < M; m0 += FC_MR) {
            int R = M - m0 < FC_MR ? M - m0 : FC_MR;
            float *c = C + (size_t)m0 * ldc + n0;
            if (at)
                fc_tile_t(R, nv, K, A + m0, lda, B + n0, ldb, c, ldc, acc, ml);
            else
                fc_tile_n(R, nv, K, A + (size_t)m0 * lda, lda, B + n0, ldb, c, ldc, acc, ml);
        }
    }
}

static void fc_avx512_gemm_nn(int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                              float *C, int ldc, int acc) {
    fc_gemm(0, M, N, K, A, lda, B, ldb, C, ldc, acc);
}

static void fc_avx512_gemm_tn(int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                              float *C, int ldc, int acc) {
    fc_gemm(1, M, N, K, A, lda, B, ldb, C, ldc, acc);
}

/* In-register transpose of 16 rows of 16 floats. */
static inline void fc_transpose16(__m512 r[16]) {
    __m512 t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    /* u[4g + e], 128-bit lane l: column 4l + e of rows 4g .. 4g+3 */
    for (int g = 0; g < 4; g++) {
        __m512d a = _mm512_castps_pd(t[4 * g]), b = _mm512_castps_pd(t[4 * g + 1]);
        __m512d c = _mm512_castps_pd(t[4 * g + 2]), d = _mm512_castps_pd(t[4 * g + 3]);
        u[4 * g + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    /* 4 x 4 transpose of the 128-bit lanes of u[e], u[4+e], u[8+e], u[12+e] */
    for (int e = 0; e < 4; e++) {
        __m512 v0 = _mm512_shuffle_f32x4(u[e], u[4 + e], 0x44);
        __m512 v1 = _mm512_shuffle_f32x4(u[e], u[4 + e], 0xee);
        __m512 v2 = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], 0x44);
        __m512 v3 = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], 0xee);
        r[e] = _mm512_shuffle_f32x4(v0, v2, 0x88);
        r[4 + e] = _mm512_shuffle_f32x4(v0, v2, 0xdd);
        r[8 + e] = _mm512_shuffle_f32x4(v1, v3, 0x88);
        r[12 + e] = _mm512_shuffle_f32x4(v1, v3, 0xdd);
    }
}

/* bt[k][j] = B[j][k] for j < n (<= FC_NR), k < kc (<= FC_KC); lanes j in
 * [n, roundup16(n)) are 0. */
static void fc_pack_bt(int n, int kc, const float *B, int ldb, float *bt) {
    for (int j0 = 0; j0 < n; j0 += 16) {
        for (int k0 = 0; k0 < kc; k0 += 16) {
            __mmask16 mk = fc_mask(kc - k0);
            __m512 r[16];
            for (int i = 0; i < 16; i++)
                r[i] = j0 + i < n ? _mm512_maskz_loadu_ps(mk, B + (size_t)(j0 + i) * ldb + k0)
                                  : _mm512_setzero_ps();
            fc_transpose16(r);
            int kn = kc - k0 < 16 ? kc - k0 : 16;
            for (int i = 0; i < kn; i++) _mm512_storeu_ps(bt + (size_t)(k0 + i) * FC_NR + j0, r[i]);
        }
    }
}

/* ---- row helpers ---- */
static float fc_avx512_exp2_sum(int n, float *x, float m) {
    __m512 vm = _mm512_set1_ps(m), s = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) {
        __mmask16 k = fc_mask(n - i);
        __m512 e = fc_exp2(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), vm));
        _mm512_mask_storeu_ps(x + i, k, e);
        s = _mm512_mask_add_ps(s, k, s, e);
    }
    return _mm512_reduce_add_ps(s);
}

static float fc_avx512_max(int n, const float *x) {
    __m512 ninf = _mm512_set1_ps(-__builtin_inff()), v = ninf;
    for (int i = 0; i < n; i += 16)
        v = _mm512_max_ps(v, _mm512_mask_loadu_ps(ninf, fc_mask(n - i), x + i));
    return _mm512_reduce_max_ps(v);
}

static void fc_avx512_scale(int n, float *x, float s) {
    __m512 vs = _mm512_set1_ps(s);
    for (int i = 0; i < n; i += 16) {
        __mmask16 k = fc_mask(n - i);
        _mm512_mask_storeu_ps(x + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), vs));
    }
}

static void fc_avx512_load(flashc_dtype dt, int n, const void *src, float *dst, float mul) {
    __m512 vm = _mm512_set1_ps(mul);
    if (dt == FLASHC_DTYPE_FP32) {
        const float *s = (const float *)src;
        for (int i = 0; i < n; i += 16) {
            __mmask16 k = fc_mask(n - i);
            _mm512_mask_storeu_ps(dst + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, s + i), vm));
        }
        return;
    }
    const uint16_t *s = (const uint16_t *)src;
    for (int i = 0; i < n; i += 16) {
        __mmask16 k = fc_mask(n - i);
        __m256i h = _mm256_maskz_loadu_epi16(k, s + i);
        __m512 v = dt == FLASHC_DTYPE_FP16
                       ? _mm512_cvtph_ps(h)
                       : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
        _mm512_mask_storeu_ps(dst + i, k, _mm512_mul_ps(v, vm));
    }
}

/* fp32 -> bf16 bits in the low half of each 32-bit lane, round to nearest
 * even, NaN kept quiet (fc_float_to_bf16) */
static inline __m512i fc_bf16_bits(__m512 v) {
    __m512i u = _mm512_castps_si512(v);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd);
    r = _mm512_srli_epi32(r, 16);
    return _mm512_mask_mov_epi32(
        r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
}

static inline __m256i fc_to_bf16(__m512 v) { return _mm512_cvtepi32_epi16(fc_bf16_bits(v)); }

static void fc_avx512_store(flashc_dtype dt, int n, const float *src, void *dst, float mul) {
    __m512 vm = _mm512_set1_ps(mul);
    if (dt == FLASHC_DTYPE_FP32) {
        float *d = (float *)dst;
        for (int i = 0; i < n; i += 16) {
            __mmask16 k = fc_mask(n - i);
            _mm512_mask_storeu_ps(d + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, src + i), vm));
        }
        return;
    }
    uint16_t *d = (uint16_t *)dst;
    for (int i = 0; i < n; i += 16) {
        __mmask16 k = fc_mask(n - i);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, src + i), vm);
        __m256i h = dt == FLASHC_DTYPE_FP16
                        ? _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
                        : fc_to_bf16(v);
        _mm256_mask_storeu_epi16(d + i, k, h);
    }
}

static void fc_avx512_ds_row(int n, float *p, const float *dp, const float *z, const float *t,
                             float delta) {
    __m512 vd = _mm512_set1_ps(delta);
    for (int i = 0; i < n; i += 16) {
        __mmask16 k = fc_mask(n - i);
        __m512 d = _mm512_maskz_loadu_ps(k, dp + i);
        if (z) d = _mm512_mul_ps(d, _mm512_maskz_loadu_ps(k, z + i));
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, p + i), _mm512_sub_ps(d, vd));
        if (t) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(k, t + i));
        _mm512_mask_storeu_ps(p + i, k, v);
    }
}

/* ---- score blocks ---- */
static void fc_avx512_score_mod(int M, int N, float *x, int ld, const fc_score_mod *mod) {
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i step = _mm512_mullo_epi32(iota, _mm512_set1_epi32(mod->dc));
    const __m512 cap = _mm512_set1_ps(mod->cap), slope = _mm512_set1_ps(mod->slope);
    const __m512 ninf = _mm512_set1_ps(-__builtin_inff());
    /* the window in lanes, as FC_WINDOW_SEES (common/window.h): masked iff
     * (wl >= 0 and d < -wl) or (wr >= 0 and d > wr) */
    const __m512i lo = _mm512_set1_epi32(-mod->wl), hi = _mm512_set1_epi32(mod->wr);
    for (int r = 0; r < M; r++) {
        float *row = x + (size_t)r * ld;
        int32_t drow = (int32_t)(mod->d0 + (int64_t)r * mod->dr);
        for (int c = 0; c < N; c += 16) {
            __mmask16 k = fc_mask(N - c);
            __m512i d = _mm512_add_epi32(_mm512_set1_epi32(drow + c * mod->dc), step);
            __m512 v = _mm512_maskz_loadu_ps(k, row + c);
            if (mod->cap != 0.0f) v = _mm512_mul_ps(cap, fc_tanh(v));
            if (mod->slope != 0.0f)
                v = _mm512_fnmadd_ps(slope, _mm512_abs_ps(_mm512_cvtepi32_ps(d)), v);
            __mmask16 out = 0;
            if (mod->wl >= 0) out |= _mm512_cmplt_epi32_mask(d, lo);
            if (mod->wr >= 0) out |= _mm512_cmpgt_epi32_mask(d, hi);
            v = _mm512_mask_mov_ps(v, out, ninf);
            _mm512_mask_storeu_ps(row + c, k, v);
        }
    }
}

static void fc_avx512_softmax_cols(int M, int N, float *x, int ld, float *m, float *l,
                                   float *alpha) {
    const __m512 ninf = _mm512_set1_ps(-__builtin_inff());
    for (int c = 0; c < N; c += 16) {
        __mmask16 k = fc_mask(N - c);
        __m512 mo = _mm512_maskz_loadu_ps(k, m + c), mx = mo;
        for (int r = 0; r < M; r++)
            mx = _mm512_max_ps(mx, _mm512_maskz_loadu_ps(k, x + (size_t)r * ld + c));
        __m512 u =
            _mm512_mask_mov_ps(mx, _mm512_cmp_ps_mask(mx, ninf, _CMP_EQ_OQ), _mm512_setzero_ps());
        __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
        int r = 0;
        for (; r + 1 < M; r += 2) {
            float *p0 = x + (size_t)r * ld + c, *p1 = p0 + ld;
            __m512 e0 = fc_exp2(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, p0), u));
            __m512 e1 = fc_exp2(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, p1), u));
            _mm512_mask_storeu_ps(p0, k, e0);
            _mm512_mask_storeu_ps(p1, k, e1);
            s0 = _mm512_add_ps(s0, e0);
            s1 = _mm512_add_ps(s1, e1);
        }
        if (r < M) {
            float *p0 = x + (size_t)r * ld + c;
            __m512 e0 = fc_exp2(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, p0), u));
            _mm512_mask_storeu_ps(p0, k, e0);
            s0 = _mm512_add_ps(s0, e0);
        }
        __m512 a = fc_exp2(_mm512_sub_ps(mo, u));
        __m512 lv = _mm512_fmadd_ps(a, _mm512_maskz_loadu_ps(k, l + c), _mm512_add_ps(s0, s1));
        _mm512_mask_storeu_ps(m + c, k, mx);
        _mm512_mask_storeu_ps(l + c, k, lv);
        _mm512_mask_storeu_ps(alpha + c, k, a);
    }
}

#if defined(FLASHC_HAVE_AMX) /* the amx forward's row softmax */
/* softmax_cols' twin along rows, P out as bf16 pairs (simd.h). By groups of
 * 64 rows: first every row's maximum, then every row's exponentials (the rows'
 * reductions then overlap: 0.20 against 0.25 ns an element, row by row), and
 * no upper clamp on exp2 (x <= 0 there). Masked lanes load -inf, whose exp2
 * is 0. */
enum { FC_SOFTMAX_ROWS = 64 };

/* 16 bf16 values as fp32 */
static inline __m512 fc_from_bf16(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static void fc_avx512_softmax_rows_bf16(int M, int N, const float *x, int ld, float xs, float *m,
                                        float *l, float *alpha, uint32_t *p2, uint32_t *p2lo,
                                        int ldp) {
    const __m512 ninf = _mm512_set1_ps(-__builtin_inff()), vxs = _mm512_set1_ps(xs);
    float top[FC_SOFTMAX_ROWS];
    for (int r0 = 0; r0 < M; r0 += FC_SOFTMAX_ROWS) {
        int rn = M - r0 < FC_SOFTMAX_ROWS ? M - r0 : FC_SOFTMAX_ROWS;
        for (int i = 0; i < rn; i++) {
            const float *row = x + (size_t)(r0 + i) * ld;
            __m512 v0 = ninf, v1 = ninf;
            int c = 0;
            for (; c + 32 <= N; c += 32) {
                v0 = _mm512_max_ps(v0, _mm512_loadu_ps(row + c));
                v1 = _mm512_max_ps(v1, _mm512_loadu_ps(row + c + 16));
            }
            for (; c < N; c += 16)
                v0 = _mm512_max_ps(v0, _mm512_mask_loadu_ps(ninf, fc_mask(N - c), row + c));
            top[i] = _mm512_reduce_max_ps(_mm512_max_ps(v0, v1));
        }
        for (int i = 0; i < rn; i++) {
            int r = r0 + i;
            const float *row = x + (size_t)r * ld;
            uint16_t *out = (uint16_t *)(p2 + (size_t)r * ldp);
            uint16_t *lo = p2lo ? (uint16_t *)(p2lo + (size_t)r * ldp) : NULL;
            float mo = m[r], mx = xs * top[i];
            mx = mo > mx ? mo : mx;
            __m512 u = _mm512_set1_ps(mx == -__builtin_inff() ? 0.0f : mx);
            __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
            int c = 0;
            for (; c + 32 <= N; c += 32) {
                __m512 e0 = fc_exp2_upto(_mm512_fmsub_ps(_mm512_loadu_ps(row + c), vxs, u));
                __m512 e1 = fc_exp2_upto(_mm512_fmsub_ps(_mm512_loadu_ps(row + c + 16), vxs, u));
                s0 = _mm512_add_ps(s0, e0);
                s1 = _mm512_add_ps(s1, e1);
                __m512i h = (__m512i)_mm512_cvtne2ps_pbh(e1, e0);
                _mm512_storeu_si512((void *)(out + c), h);
                if (lo) {
                    __m512 l0 = _mm512_sub_ps(e0, fc_from_bf16(_mm512_castsi512_si256(h)));
                    __m512 l1 = _mm512_sub_ps(e1, fc_from_bf16(_mm512_extracti64x4_epi64(h, 1)));
                    _mm512_storeu_si512((void *)(lo + c), (__m512i)_mm512_cvtne2ps_pbh(l1, l0));
                }
            }
            /* the last chunk's 16 lanes into the sum its place in a 32 takes (s0 or
             * s1), so that a row sums the same with more masked keys after it (a
             * tall tile's edge block is longer than a 256-row tile's) */
            for (; c < N; c += 16) {
                __mmask16 k = fc_mask(N - c);
                __m512 e0 =
                    fc_exp2_upto(_mm512_fmsub_ps(_mm512_mask_loadu_ps(ninf, k, row + c), vxs, u));
                if (c % 32)
                    s1 = _mm512_add_ps(s1, e0);
                else
                    s0 = _mm512_add_ps(s0, e0);
                __m256i h = (__m256i)_mm512_cvtneps_pbh(e0);
                _mm256_mask_storeu_epi16(out + c, k, h);
                if (lo)
                    _mm256_mask_storeu_epi16(
                        lo + c, k, (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(e0, fc_from_bf16(h))));
            }
            if (N & 1) out[N] = 0;
            if (lo && (N & 1)) lo[N] = 0;
            float a = _mm512_cvtss_f32(fc_exp2_upto(_mm512_sub_ps(_mm512_set1_ps(mo), u)));
            alpha[r] = a;
            l[r] = a * l[r] + _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
            m[r] = mx;
        }
    }
}
#endif /* FLASHC_HAVE_AMX */

/* ---- dropout ---- */
/* Philox4x32-10 of philox.h on 16 lanes (its constants). */

/* lo, hi: the 64-bit products m * c of each 32-bit lane, split */
static inline void fc_mulhilo16(__m512i m, __m512i c, __m512i *lo, __m512i *hi) {
    __m512i pe = _mm512_mul_epu32(c, m);                        /* even lanes */
    __m512i po = _mm512_mul_epu32(_mm512_srli_epi64(c, 32), m); /* odd lanes */
    *lo = _mm512_mask_blend_epi32(0xaaaa, pe, _mm512_slli_epi64(po, 32));
    *hi = _mm512_mask_blend_epi32(0xaaaa, _mm512_srli_epi64(pe, 32), po);
}

static inline void fc_philox16(__m512i c[4], uint32_t k0, uint32_t k1) {
    const __m512i m0 = _mm512_set1_epi32((int)FC_PHILOX_M0),
                  m1 = _mm512_set1_epi32((int)FC_PHILOX_M1);
    for (int r = 0; r < 10; r++) {
        __m512i lo0, hi0, lo1, hi1;
        fc_mulhilo16(m0, c[0], &lo0, &hi0);
        fc_mulhilo16(m1, c[2], &lo1, &hi1);
        c[0] = _mm512_xor_si512(_mm512_xor_si512(hi1, c[1]), _mm512_set1_epi32((int)k0));
        c[2] = _mm512_xor_si512(_mm512_xor_si512(hi0, c[3]), _mm512_set1_epi32((int)k1));
        c[1] = lo1;
        c[3] = lo0;
        k0 += FC_PHILOX_W0;
        k1 += FC_PHILOX_W1;
    }
}

/* One Philox call per (query lane, group of 8 keys) covers 8 rows of 16
 * columns: word w of a lane is key 8g + w. */
static void fc_avx512_dropout_cols(int M, int N, float *x, int ld, uint64_t seed, uint64_t offset,
                                   uint32_t bh, uint32_t i0, int64_t j0, uint32_t threshold,
                                   float scale) {
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i low16 = _mm512_set1_epi32(0xffff), thr = _mm512_set1_epi32((int)threshold);
    const __m512 vs = _mm512_set1_ps(scale);
    for (int c = 0; c < N; c += 16) {
        __mmask16 k = fc_mask(N - c);
        __m512i ci = _mm512_add_epi32(_mm512_set1_epi32((int)(i0 + (uint32_t)c)), iota);
        for (int64_t g = j0 >> 3; 8 * g < j0 + M; g++) {
            uint64_t cnt = offset + (uint64_t)g;
            __m512i st[4] = {_mm512_set1_epi32((int)(uint32_t)cnt),
                             _mm512_set1_epi32((int)(uint32_t)(cnt >> 32)), ci,
                             _mm512_set1_epi32((int)bh)};
            fc_philox16(st, (uint32_t)seed, (uint32_t)(seed >> 32));
            for (int w = 0; w < 8; w++) {
                int64_t j = 8 * g + w;
                if (j < j0 || j >= j0 + M) continue;
                __m512i word = w & 1 ? _mm512_srli_epi32(st[w >> 1], 16) : st[w >> 1];
                __mmask16 keep = _mm512_cmpge_epu32_mask(_mm512_and_si512(word, low16), thr);
                float *row = x + (size_t)(j - j0) * ld + c;
                _mm512_mask_storeu_ps(row, k,
                                      _mm512_maskz_mul_ps(keep, _mm512_maskz_loadu_ps(k, row), vs));
            }
        }
    }
}

/* ---- bf16 dot products (AVX512_BF16: vdpbf16ps) ---- */
/* The fp32 micro-kernel's shape with vdpbf16ps: each step takes one pair of
 * the inner dimension, 32 multiply-adds per instruction instead of 16.
 * C[R][16 NV] = (acc ? C : 0) + scale * sum_p A(r, p) . B[p][.] */
static inline __attribute__((always_inline)) void
fc_ukr_bf16(const int R, const int NV, int K2, const uint32_t *A, ptrdiff_t ars, ptrdiff_t aks,
            const uint32_t *B, ptrdiff_t ldb, float *C, ptrdiff_t ldc, float scale, int acc,
            __mmask16 ml) {
    __m512 c[FC_MR][FC_NV];
    const int from_c = acc && scale == 1.0f; /* start from C instead of adding it at the end */
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++)
            c[r][v] = !from_c       ? _mm512_setzero_ps()
                      : v == NV - 1 ? _mm512_maskz_loadu_ps(ml, C + r * ldc + 16 * v)
                                    : _mm512_loadu_ps(C + r * ldc + 16 * v);
    for (int k = 0; k < K2; k++) {
        __m512bh b[FC_NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++)
            b[v] = (__m512bh)(v == NV - 1 ? _mm512_maskz_loadu_epi32(ml, B + 16 * v)
                                          : _mm512_loadu_si512((const void *)(B + 16 * v)));
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            int32_t w; /* a pair of bf16 read as one word, whatever the caller's type */
            memcpy(&w, A + r * ars, sizeof w);
            __m512bh a = (__m512bh)_mm512_set1_epi32(w);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) c[r][v] = _mm512_dpbf16_ps(c[r][v], a, b[v]);
        }
        A += aks;
        B += ldb;
    }
    const __m512 vs = _mm512_set1_ps(scale);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            __m512 x = c[r][v];
            float *p = C + r * ldc + 16 * v;
            __mmask16 k = v == NV - 1 ? ml : (__mmask16)0xffff;
            if (!from_c)
                x = acc ? _mm512_fmadd_ps(vs, x, _mm512_maskz_loadu_ps(k, p))
                        : _mm512_mul_ps(vs, x);
            _mm512_mask_storeu_ps(p, k, x);
        }
}

#define FC_UKR_BF16_NV(R_, ARS, AKS)                                                               \
    switch (nv) {                                                                                  \
    case 1: fc_ukr_bf16(R_, 1, K2, A, ARS, AKS, B, ldb, C, ldc, scale, acc, ml); break;            \
    case 2: fc_ukr_bf16(R_, 2, K2, A, ARS, AKS, B, ldb, C, ldc, scale, acc, ml); break;            \
    case 3: fc_ukr_bf16(R_, 3, K2, A, ARS, AKS, B, ldb, C, ldc, scale, acc, ml); break;            \
    default: fc_ukr_bf16(R_, 4, K2, A, ARS, AKS, B, ldb, C, ldc, scale, acc, ml); break;           \
    }
#define FC_UKR_BF16_R(ARS, AKS)                                                                    \
    switch (R) {                                                                                   \
    case 1: FC_UKR_BF16_NV(1, ARS, AKS) break;                                                     \
    case 2: FC_UKR_BF16_NV(2, ARS, AKS) break;                                                     \
    case 3: FC_UKR_BF16_NV(3, ARS, AKS) break;                                                     \
    case 4: FC_UKR_BF16_NV(4, ARS, AKS) break;                                                     \
    case 5: FC_UKR_BF16_NV(5, ARS, AKS) break;                                                     \
    default: FC_UKR_BF16_NV(6, ARS, AKS) break;                                                    \
    }

static void fc_tile_bf16_n(int R, int nv, int K2, const uint32_t *A, ptrdiff_t lda,
                           const uint32_t *B, ptrdiff_t ldb, float *C, ptrdiff_t ldc, float scale,
                           int acc, __mmask16 ml) {
    FC_UKR_BF16_R(lda, 1)
}

static void fc_tile_bf16_t(int R, int nv, int K2, const uint32_t *A, ptrdiff_t lda,
                           const uint32_t *B, ptrdiff_t ldb, float *C, ptrdiff_t ldc, float scale,
                           int acc, __mmask16 ml) {
    FC_UKR_BF16_R(1, lda)
}

static void fc_gemm_bf16(int at, int M, int N, int K2, const uint32_t *A, int lda,
                         const uint32_t *B, int ldb, float *C, int ldc, float scale, int acc) {
    for (int n0 = 0; n0 < N; n0 += FC_NR) {
        int n = N - n0 < FC_NR ? N - n0 : FC_NR;
        int nv = (n + 15) / 16;
        __mmask16 ml = fc_mask(n - 16 * (nv - 1));
        for (int m0 = 0; m0 < M; m0 += FC_MR) {
            int R = M - m0 < FC_MR ? M - m0 : FC_MR;
            float *c = C + (size_t)m0 * ldc + n0;
            if (at)
                fc_tile_bf16_t(R, nv, K2, A + m0, lda, B + n0, ldb, c, ldc, scale, acc, ml);
            else
                fc_tile_bf16_n(R, nv, K2, A + (size_t)m0 * lda, lda, B + n0, ldb, c, ldc, scale,
                               acc, ml);
        }
    }
}

static void fc_avx512_gemm_bf16_nn(int M, int N, int K2, const uint32_t *A, int lda,
                                   const uint32_t *B, int ldb, float *C, int ldc, float scale,
                                   int acc) {
    fc_gemm_bf16(0, M, N, K2, A, lda, B, ldb, C, ldc, scale, acc);
}

static void fc_avx512_gemm_bf16_tn(int M, int N, int K2, const uint32_t *A, int lda,
                                   const uint32_t *B, int ldb, float *C, int ldc, float scale,
                                   int acc) {
    fc_gemm_bf16(1, M, N, K2, A, lda, B, ldb, C, ldc, scale, acc);
}

/* ---- nt: fp32 and bf16 ---- */
/* Rows of A against rows of B, fp32 (bf16 = 0) or bf16 pairs (bf16 = 1, with
 * scale): each 64-row x 128-element panel of B is transposed onto the stack
 * (fc_pack_bt moves 32-bit words, so a pair travels whole) and the nn kernel
 * runs on it. The panels of the inner dimension after the first add to C (for
 * bf16 with the same scale: scale (s0 + s1) as scale s0 + scale s1). */
static void fc_gemm_nt(int bf16, int M, int N, int K, const void *A, int lda, const void *B,
                       int ldb, float *C, int ldc, float scale, int acc) {
    const float *a = (const float *)A, *b = (const float *)B; /* 32-bit words */
    if (K == 0) {
        if (bf16)
            fc_gemm_bf16(0, M, N, 0, (const uint32_t *)A, lda, (const uint32_t *)B, ldb, C, ldc,
                         scale, acc);
        else
            fc_gemm(0, M, N, 0, a, lda, b, ldb, C, ldc, acc);
        return;
    }
    float bt[FC_KC * FC_NR] __attribute__((aligned(64))); /* B^T panel, 32 KB */
    for (int n0 = 0; n0 < N; n0 += FC_NR) {
        int n = N - n0 < FC_NR ? N - n0 : FC_NR;
        for (int k0 = 0; k0 < K; k0 += FC_KC) {
            int kc = K - k0 < FC_KC ? K - k0 : FC_KC;
            fc_pack_bt(n, kc, b + (size_t)n0 * ldb + k0, ldb, bt);
            if (bf16)
                fc_gemm_bf16(0, M, n, kc, (const uint32_t *)(a + k0), lda, (const uint32_t *)bt,
                             FC_NR, C + n0, ldc, scale, acc || k0 > 0);
            else
                fc_gemm(0, M, n, kc, a + k0, lda, bt, FC_NR, C + n0, ldc, acc || k0 > 0);
        }
    }
}

static void fc_avx512_gemm_nt(int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                              float *C, int ldc, int acc) {
    fc_gemm_nt(0, M, N, K, A, lda, B, ldb, C, ldc, 1.0f, acc);
}

static void fc_avx512_gemm_bf16_nt(int M, int N, int K2, const uint32_t *A, int lda,
                                   const uint32_t *B, int ldb, float *C, int ldc, float scale,
                                   int acc) {
    fc_gemm_nt(1, M, N, K2, A, lda, B, ldb, C, ldc, scale, acc);
}

/* 16 pairs from a vector with one row in words 0..15 and the other in 16..31 */
static inline __m512i fc_interleave16(__m512i w) {
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24,
                                         8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(idx, w);
}

static void fc_avx512_pack_pairs(flashc_dtype dt, int n, const void *r0, const void *r1,
                                 uint32_t *dst) {
    for (int i = 0; i < n; i += 16) {
        __mmask16 k = fc_mask(n - i);
        __m512i w;
        if (dt == FLASHC_DTYPE_FP32) {
            /* vcvtne2ps2bf16: round to nearest even, denormals to 0 */
            __m512 a = _mm512_maskz_loadu_ps(k, (const float *)r0 + i);
            __m512 b = r1 ? _mm512_maskz_loadu_ps(k, (const float *)r1 + i) : _mm512_setzero_ps();
            w = (__m512i)_mm512_cvtne2ps_pbh(b, a);
        } else {
            __m256i a = _mm256_maskz_loadu_epi16(k, (const uint16_t *)r0 + i);
            __m256i b =
                r1 ? _mm256_maskz_loadu_epi16(k, (const uint16_t *)r1 + i) : _mm256_setzero_si256();
            w = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
        }
        _mm512_mask_storeu_epi32(dst + i, k, fc_interleave16(w));
    }
}

static void fc_avx512_row_pairs(int n, const float *x, uint16_t *dst) {
    for (int i = 0; i < n; i += 16) {
        __mmask16 k = fc_mask(n - i);
        _mm256_mask_storeu_epi16(dst + i, k,
                                 (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(k, x + i)));
    }
    if (n & 1) dst[n] = 0;
}

/* ---- decode's scores: rows of K against at most 8 rows of Q ---- */
/* 16 elements of row p (dtype dt) from element d as fp32; lanes off in m are 0. */
static inline __m512 fc_widen16(flashc_dtype dt, const void *p, int d, __mmask16 m) {
    if (dt == FLASHC_DTYPE_FP32) return _mm512_maskz_loadu_ps(m, (const float *)p + d);
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)p + d);
    if (dt == FLASHC_DTYPE_FP16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* The sums of a[0..15]'s lanes, in lanes 0..15: a transpose-and-add tree, 15
 * adds and 30 shuffles for 16 sums (a reduce per row takes 4 adds, 4
 * shuffles and a chain of their latencies). */
static inline __attribute__((always_inline)) __m512 fc_hsum16(const __m512 *a) {
    __m512 b[8], c[4], d[2];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) /* lane L: (a[2i] L0+L2, a[2i+1] L0+L2, a[2i] L1+L3, a[2i+1] L1+L3) */
        b[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                             _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) { /* lane L: the lane-L sums of a[4i .. 4i+3] */
        __m512d x = _mm512_castps_pd(b[2 * i]), y = _mm512_castps_pd(b[2 * i + 1]);
        c[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++) /* (c[2i] L0+L2, L1+L3, c[2i+1] L0+L2, L1+L3) */
        d[i] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(d[0], d[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(d[0], d[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* Rows [r0, r0+R) of krows, the last row standing in past nk (its sums are not
 * stored). */
static inline __attribute__((always_inline)) void fc_rows_group(const int R, const void *const *krows,
                                                                int r0, int nk, const void **rows) {
#pragma GCC unroll 16
    for (int i = 0; i < R; i++) rows[i] = krows[r0 + i < nk ? r0 + i : nk - 1];
}

/* The sums of a group of R = 16 / NQ rows against NQ columns (fc_hsum16: lane
 * r * NQ + c for row r, column c) into s[c * lds + r0 + r] for the group's rows
 * below nk, times scale. */
static inline __attribute__((always_inline)) void
fc_dot_store(const int NQ, const int R, const __m512 *acc, int r0, int nk, float *s, int lds,
             float scale) {
    __m512 sums = _mm512_mul_ps(_mm512_set1_ps(scale), fc_hsum16(acc));
    const int n = nk - r0 < R ? nk - r0 : R;
    if (NQ == 1) {
        _mm512_mask_storeu_ps(s + r0, fc_mask(n), sums);
        return;
    }
    float lanes[16];
    _mm512_storeu_ps(lanes, sums);
    for (int r = 0; r < n; r++)
#pragma GCC unroll 8
        for (int c = 0; c < NQ; c++) s[(size_t)c * lds + r0 + r] = lanes[r * NQ + c];
}

/* Rows by groups of R = 16 / NQ: the group's R x NQ sums in 16 independent
 * accumulators (the rest 0), each K vector loaded once for the NQ columns,
 * and the 16 summed at once by fc_hsum16. */
static inline __attribute__((always_inline)) void
fc_dot_rows_nq(const int NQ, flashc_dtype dt, int nk, int D, const void *const *krows,
               const float *q, int ldq, float *s, int lds) {
    const int R = 16 / NQ;
    const __mmask16 tail = (__mmask16)((1u << (D & 15)) - 1u);
    for (int r0 = 0; r0 < nk; r0 += R) {
        const void *rows[16];
        fc_rows_group(R, krows, r0, nk, rows);
        __m512 acc[16];
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
        for (int d = 0; d < D; d += 16) {
            const __mmask16 m = d + 16 <= D ? (__mmask16)0xffff : tail;
            __m512 qv[8];
#pragma GCC unroll 8
            for (int c = 0; c < NQ; c++) qv[c] = _mm512_maskz_loadu_ps(m, q + (size_t)c * ldq + d);
#pragma GCC unroll 16
            for (int r = 0; r < R; r++) {
                __m512 k = fc_widen16(dt, rows[r], d, m);
#pragma GCC unroll 8
                for (int c = 0; c < NQ; c++)
                    acc[r * NQ + c] = _mm512_fmadd_ps(qv[c], k, acc[r * NQ + c]);
            }
        }
        fc_dot_store(NQ, R, acc, r0, nk, s, lds, 1.0f);
    }
}

static void fc_avx512_dot_rows(flashc_dtype dt, int nk, int D, const void *const *krows,
                               const float *q, int ldq, int nq, float *s, int lds) {
    FC_SWITCH_NQ(nq, fc_dot_rows_nq, dt, nk, D, krows, q, ldq, s, lds)
}

/* fc_dot_rows_nq on bf16 dot products: 32 elements of a row per vdpbf16ps. */
static inline __attribute__((always_inline)) void
fc_dot_rows_bf16_nq(const int NQ, int nk, int D, const void *const *krows, const uint32_t *q2,
                    int ldq2, float *s, int lds, float scale) {
    const int R = 16 / NQ;
    /* the tail: D % 32 elements of K (a masked load, so no element past D is
     * read), and the pairs of q that hold them */
    const int dt = D / 32 * 32, rest = D - dt;
    const __mmask32 mk = rest ? (__mmask32)((1u << rest) - 1u) : 0;
    const __mmask16 mq = fc_mask((rest + 1) / 2);
    for (int r0 = 0; r0 < nk; r0 += R) {
        const void *rows[16];
        fc_rows_group(R, krows, r0, nk, rows);
        __m512 acc[16];
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
        for (int d = 0; d < D; d += 32) {
            const __mmask32 km = d < dt ? (__mmask32)0xffffffffu : mk;
            const __mmask16 qm = d < dt ? (__mmask16)0xffff : mq;
            __m512bh qv[8];
#pragma GCC unroll 8
            for (int c = 0; c < NQ; c++)
                qv[c] = (__m512bh)_mm512_maskz_loadu_epi32(qm, q2 + (size_t)c * ldq2 + d / 2);
#pragma GCC unroll 16
            for (int r = 0; r < R; r++) {
                __m512bh k = (__m512bh)_mm512_maskz_loadu_epi16(km, (const uint16_t *)rows[r] + d);
#pragma GCC unroll 8
                for (int c = 0; c < NQ; c++)
                    acc[r * NQ + c] = _mm512_dpbf16_ps(acc[r * NQ + c], k, qv[c]);
            }
        }
        fc_dot_store(NQ, R, acc, r0, nk, s, lds, scale);
    }
}

static void fc_avx512_dot_rows_bf16(int nk, int D, const void *const *krows, const uint32_t *q2,
                                    int ldq2, int nq, float *s, int lds, float scale) {
    FC_SWITCH_NQ(nq, fc_dot_rows_bf16_nq, nk, D, krows, q2, ldq2, s, lds, scale)
}

/* ---- decode's P V: at most 8 columns of P against rows of V ---- */
/* One pass over the nv rows for elements [d, d + 16 W) of the NQ output rows:
 * NQ x W accumulators stay in registers while each V row's W vectors are widened
 * and scaled by the NQ probabilities of that key. The last vector covers the lanes
 * of `last` only (the Dv % 16 tail). */
static inline __attribute__((always_inline)) void
fc_axpy_pass(const int NQ, const int W, flashc_dtype dt, int nv, const void *const *vrows,
             int d, __mmask16 last, const float *p, int ldp, float *o, int ldo) {
    __m512 acc[8][16];
#pragma GCC unroll 8
    for (int c = 0; c < NQ; c++)
#pragma GCC unroll 16
        for (int w = 0; w < W; w++)
            acc[c][w] = _mm512_maskz_loadu_ps(w == W - 1 ? last : (__mmask16)0xffff,
                                              o + (size_t)c * ldo + d + 16 * w);
    for (int r = 0; r < nv; r++) {
        __m512 pr[8];
#pragma GCC unroll 8
        for (int c = 0; c < NQ; c++) pr[c] = _mm512_set1_ps(p[(size_t)r * ldp + c]);
#pragma GCC unroll 16
        for (int w = 0; w < W; w++) {
            __m512 v = fc_widen16(dt, vrows[r], d + 16 * w, w == W - 1 ? last : (__mmask16)0xffff);
#pragma GCC unroll 8
            for (int c = 0; c < NQ; c++) acc[c][w] = _mm512_fmadd_ps(pr[c], v, acc[c][w]);
        }
    }
#pragma GCC unroll 8
    for (int c = 0; c < NQ; c++)
#pragma GCC unroll 16
        for (int w = 0; w < W; w++)
            _mm512_mask_storeu_ps(o + (size_t)c * ldo + d + 16 * w,
                                  w == W - 1 ? last : (__mmask16)0xffff, acc[c][w]);
}

/* fc_axpy_pass for bf16 rows, elements [d, d + 32 W) in W chunks of 32: a chunk
 * is one load, its even elements widened by a shift and its odd ones by a mask
 * (two operations for 32 elements, against four for two vpmovzxwd and their
 * shifts), each half with its own accumulator; O's chunk is split into its even
 * and odd elements on the way in and interleaved again on the way out. */
static inline __attribute__((always_inline)) void
fc_axpy_bf16_pass(const int NQ, const int W, int nv, const void *const *vrows, int d,
                  const float *p, int ldp, float *o, int ldo) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
    const __m512i high_half = _mm512_set1_epi32((int)0xffff0000u);
    __m512 acc[8][16];
#pragma GCC unroll 8
    for (int c = 0; c < NQ; c++)
#pragma GCC unroll 8
        for (int w = 0; w < W; w++) {
            const float *oc = o + (size_t)c * ldo + d + 32 * w;
            __m512 a = _mm512_loadu_ps(oc), b = _mm512_loadu_ps(oc + 16);
            acc[c][2 * w] = _mm512_permutex2var_ps(a, even, b);
            acc[c][2 * w + 1] = _mm512_permutex2var_ps(a, odd, b);
        }
    for (int r = 0; r < nv; r++) {
        __m512 pr[8];
#pragma GCC unroll 8
        for (int c = 0; c < NQ; c++) pr[c] = _mm512_set1_ps(p[(size_t)r * ldp + c]);
#pragma GCC unroll 8
        for (int w = 0; w < W; w++) {
            __m512i x = _mm512_loadu_si512((const void *)((const uint16_t *)vrows[r] + d + 32 * w));
            __m512 ve = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
            __m512 vo = _mm512_castsi512_ps(_mm512_and_si512(x, high_half));
#pragma GCC unroll 8
            for (int c = 0; c < NQ; c++) {
                acc[c][2 * w] = _mm512_fmadd_ps(pr[c], ve, acc[c][2 * w]);
                acc[c][2 * w + 1] = _mm512_fmadd_ps(pr[c], vo, acc[c][2 * w + 1]);
            }
        }
    }
#pragma GCC unroll 8
    for (int c = 0; c < NQ; c++)
#pragma GCC unroll 8
        for (int w = 0; w < W; w++) {
            float *oc = o + (size_t)c * ldo + d + 32 * w;
            _mm512_storeu_ps(oc, _mm512_permutex2var_ps(acc[c][2 * w], lo, acc[c][2 * w + 1]));
            _mm512_storeu_ps(oc + 16, _mm512_permutex2var_ps(acc[c][2 * w], hi, acc[c][2 * w + 1]));
        }
}

/* Dv in passes of W vectors, W a power of two: as many passes of the widest W
 * as fit, then at most one of each narrower W (so 8 vectors, Dv = 128, are one
 * pass at NQ = 1). The widest W keeps NQ x W <= 16 accumulators (with the NQ
 * broadcasts and one widened vector, inside the 32 zmm registers). Only the
 * vector that ends Dv is masked. bf16 rows take whole chunks of 32 by
 * fc_axpy_bf16_pass first. */
static inline __attribute__((always_inline)) void
fc_axpy_rows_nq(const int NQ, flashc_dtype dt, int nv, int Dv, const void *const *vrows,
                const float *p, int ldp, float *o, int ldo) {
    const int Wmax = 16 / NQ;
    const int nvec = (Dv + 15) / 16;
    const __mmask16 tail = fc_mask(Dv - 16 * (nvec - 1));
    int v = 0;
    if (dt == FLASHC_DTYPE_BF16) { /* whole chunks of 32 by halves, the rest below */
#define FC_AXPY_BF16_STEP_(W)                                                                      \
    if (2 * (W) <= Wmax)                                                                           \
        for (; Dv - 16 * v >= 32 * (W); v += 2 * (W))                                              \
            fc_axpy_bf16_pass(NQ, (W), nv, vrows, 16 * v, p, ldp, o, ldo);
        FC_AXPY_BF16_STEP_(8) FC_AXPY_BF16_STEP_(4) FC_AXPY_BF16_STEP_(2) FC_AXPY_BF16_STEP_(1)
#undef FC_AXPY_BF16_STEP_
    }
#define FC_AXPY_STEP_(W)                                                                           \
    if ((W) <= Wmax)                                                                               \
        for (; nvec - v >= (W); v += (W))                                                          \
            fc_axpy_pass(NQ, (W), dt, nv, vrows, 16 * v,                                           \
                         v + (W) == nvec ? tail : (__mmask16)0xffff, p, ldp, o, ldo);
    FC_AXPY_STEP_(16) FC_AXPY_STEP_(8) FC_AXPY_STEP_(4) FC_AXPY_STEP_(2) FC_AXPY_STEP_(1)
#undef FC_AXPY_STEP_
}

static void fc_avx512_axpy_rows(flashc_dtype dt, int nv, int Dv, const void *const *vrows,
                                const float *p, int ldp, int nq, float *o, int ldo) {
    FC_SWITCH_NQ(nq, fc_axpy_rows_nq, dt, nv, Dv, vrows, p, ldp, o, ldo)
}

#if defined(FLASHC_HAVE_AMX)
/* ---- bf16 GEMMs on AMX tiles (AMX-TILE, AMX-BF16: tdpbf16ps) ----
 * A tile register holds 16 rows of 64 bytes. tdpbf16ps C += A B takes A as 16
 * rows of 16 pairs (the inner dimension along a row) and B as 16 rows of pairs
 * by 16 columns: simd.h's pair layout is the tiles' own, so gemm_bf16_nn reads
 * A and B where they lie. One instruction is 16 x 16 x 32 multiply-adds.
 *
 * C is computed in blocks of 32 x 32 (tiles 0-3), from two tiles of A (4, 5)
 * and two of B (6, 7) per 16 pairs of the inner dimension. An operand is read
 * in place when its tiles are whole; otherwise (A^T of gemm_bf16_tn, B^T of
 * gemm_bf16_nt, a dimension off a multiple of 16) a panel of 32 rows (A) or
 * 32 columns (B) is copied onto the stack, transposed by 16 x 16 blocks of
 * 32-bit words where it comes transposed, zero past its edges; the loop runs
 * first over the blocks of the operand that was copied, so each copy is made
 * once. Inner dimensions past FC_AMX_KC pairs (D > 256) run in chunks that
 * add to C.
 *
 * The tile configuration is loaded at the start of every call and released
 * at its end: a thread may run other AMX code (oneDNN, say) between two calls,
 * and released tiles cost nothing at a context switch. */
enum { FC_AMX_KC = 128 }; /* two 16 KB panels on the stack, as fc_gemm_nt's 32 KB */

typedef struct fc_amx_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} fc_amx_config;

static void fc_amx_configure(void) {
    fc_amx_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) {
        c.rows[t] = 16;
        c.colsb[t] = 64;
    }
    /* gcc 12 declares _tile_loadconfig as reading only 8 bytes of the 64, so
     * the stores above could be dropped as dead (a microbenchmark's were: the
     * tiles were never configured, SIGILL); the empty asm reads all of c. */
    __asm__ volatile("" : : "m"(c));
    _tile_loadconfig(&c);
}

/* dst (16 x 16 words, rows ldd apart) = the block at src of nr rows by nc
 * words (rows ld apart; zero past them), transposed when t. Masked-off lanes
 * are not read. */
static void fc_amx_block(int t, int nr, int nc, const uint32_t *src, ptrdiff_t ld, uint32_t *dst,
                         ptrdiff_t ldd) {
    __m512 r[16];
    __mmask16 mk = fc_mask(nc);
    for (int i = 0; i < 16; i++)
        r[i] = i < nr ? _mm512_maskz_loadu_ps(mk, src + (size_t)i * ld) : _mm512_setzero_ps();
    if (t) fc_transpose16(r);
    for (int i = 0; i < 16; i++) _mm512_storeu_ps(dst + (size_t)i * ldd, r[i]);
}

/* A 32 x K2p panel of A (rows of pairs), zero past mrows and K2: at = 0
 * copies rows of A, at = 1 transposes A^T (A[p][m]). */
static void fc_amx_pack_a(int at, int mrows, int K2, int K2p, const uint32_t *A, ptrdiff_t lda,
                          uint32_t *dst) {
    for (int m0 = 0; m0 < 32; m0 += 16)
        for (int p0 = 0; p0 < K2p; p0 += 16) {
            uint32_t *d = dst + (size_t)m0 * K2p + p0;
            if (at)
                fc_amx_block(1, K2 - p0, mrows - m0, A + (size_t)p0 * lda + m0, lda, d, K2p);
            else
                fc_amx_block(0, mrows - m0, K2 - p0, A + (size_t)m0 * lda + p0, lda, d, K2p);
        }
}

/* A K2p x 32 panel of B (pairs down, columns across), zero past ncols and K2:
 * bt = 0 copies rows of B (B[p][n]), bt = 1 transposes B^T (B[n][p]). */
static void fc_amx_pack_b(int bt, int ncols, int K2, int K2p, const uint32_t *B, ptrdiff_t ldb,
                          uint32_t *dst) {
    for (int n0 = 0; n0 < 32; n0 += 16)
        for (int p0 = 0; p0 < K2p; p0 += 16) {
            uint32_t *d = dst + (size_t)p0 * 32 + n0;
            if (bt)
                fc_amx_block(1, ncols - n0, K2 - p0, B + (size_t)n0 * ldb + p0, ldb, d, 32);
            else
                fc_amx_block(0, K2 - p0, ncols - n0, B + (size_t)p0 * ldb + n0, ldb, d, 32);
        }
}

/* C = (acc ? C : 0) + scale * (tile t's product) for a block of mr x nc at c.
 * A whole block with acc and scale 1 started from C (FC_AMX_LOAD) and is stored
 * as it is; a whole block without acc is stored, then scaled in place; a
 * partial block goes through tmp, whose rows and columns past it are dropped. */
#define FC_AMX_LOAD(t, c, mr, nc)                                                                  \
    do {                                                                                           \
        if (from_c && (mr) == 16 && (nc) == 16)                                                    \
            _tile_loadd(t, c, (ptrdiff_t)ldc * 4);                                                 \
        else                                                                                       \
            _tile_zero(t);                                                                         \
    } while (0)
#define FC_AMX_STORE(t, c, mr, nc)                                                                 \
    do {                                                                                           \
        if ((mr) == 16 && (nc) == 16 && (from_c || !acc)) {                                        \
            _tile_stored(t, c, (ptrdiff_t)ldc * 4);                                                \
            if (!from_c && scale != 1.0f) fc_amx_out(c, ldc, c, ldc, 16, 16, scale, 0);            \
        } else {                                                                                   \
            _tile_stored(t, tmp, 64);                                                              \
            fc_amx_out(tmp, 16, c, ldc, mr, nc, scale, acc);                                       \
        }                                                                                          \
    } while (0)

static inline void fc_amx_out(const float *src, ptrdiff_t lds, float *c, ptrdiff_t ldc, int mr,
                              int nc, float scale, int acc) {
    const __m512 vs = _mm512_set1_ps(scale);
    __mmask16 k = fc_mask(nc);
    for (int r = 0; r < mr; r++) {
        float *p = c + r * ldc;
        __m512 x = _mm512_mul_ps(vs, _mm512_maskz_loadu_ps(k, src + r * lds));
        if (acc) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(k, p));
        _mm512_mask_storeu_ps(p, k, x);
    }
}

/* One chunk of at most FC_AMX_KC pairs (1 <= K2); M, N >= 1. */
static void fc_amx_gemm_chunk(int at, int bt, int M, int N, int K2, const uint32_t *A, int lda,
                              const uint32_t *B, int ldb, float *C, int ldc, float scale, int acc) {
    const int K2p = (K2 + 15) / 16 * 16;
    const int kwhole = K2 % 16 == 0;
    uint32_t apanel[32 * FC_AMX_KC] __attribute__((aligned(64)));
    uint32_t bpanel[FC_AMX_KC * 32] __attribute__((aligned(64)));
    /* which operand is copied: the loop runs over its panels first */
    const int a_copy = at || !kwhole || M % 16 != 0;
    const int b_copy = bt || !kwhole || N % 16 != 0;
    const int m_outer = a_copy || !b_copy;
    const int from_c = acc && scale == 1.0f;
    float tmp[256] __attribute__((aligned(64)));
    const int nmo = m_outer ? (M + 31) / 32 : (N + 31) / 32;
    const int nin = m_outer ? (N + 31) / 32 : (M + 31) / 32;
    fc_amx_configure();
    for (int io = 0; io < nmo; io++) {
        for (int ii = 0; ii < nin; ii++) {
            int m0 = 32 * (m_outer ? io : ii), n0 = 32 * (m_outer ? ii : io);
            int mr = M - m0 < 32 ? M - m0 : 32, nc = N - n0 < 32 ? N - n0 : 32;
            const uint32_t *a, *b;
            ptrdiff_t sa, sb; /* bytes between tile rows */
            if (a_copy) {
                if (ii == 0 || !m_outer) fc_amx_pack_a(at, mr, K2, K2p, at ? A + m0 : A + (size_t)m0 * lda, lda, apanel);
                a = apanel;
                sa = (ptrdiff_t)K2p * 4;
            } else {
                a = A + (size_t)m0 * lda;
                sa = (ptrdiff_t)lda * 4;
            }
            if (b_copy) {
                if (ii == 0 || m_outer) fc_amx_pack_b(bt, nc, K2, K2p, bt ? B + (size_t)n0 * ldb : B + n0, ldb, bpanel);
                b = bpanel;
                sb = 32 * 4;
            } else {
                b = B + n0;
                sb = (ptrdiff_t)ldb * 4;
            }
            const int two_m = mr > 16, two_n = nc > 16;
            const ptrdiff_t a1 = a_copy ? (ptrdiff_t)16 * K2p : (ptrdiff_t)16 * lda;
            const ptrdiff_t bstep = b_copy ? 16 * 32 : (ptrdiff_t)16 * ldb;
            float *c = C + (size_t)m0 * ldc + n0;
            const int m_lo = mr < 16 ? mr : 16, n_lo = nc < 16 ? nc : 16;
            FC_AMX_LOAD(0, c, m_lo, n_lo);
            if (two_n) FC_AMX_LOAD(1, c + 16, m_lo, nc - 16);
            if (two_m) {
                FC_AMX_LOAD(2, c + (size_t)16 * ldc, mr - 16, n_lo);
                if (two_n) FC_AMX_LOAD(3, c + (size_t)16 * ldc + 16, mr - 16, nc - 16);
            }
            for (int p0 = 0; p0 < K2p; p0 += 16) {
                const uint32_t *ap = a + p0, *bp = b + (ptrdiff_t)(p0 / 16) * bstep;
                _tile_loadd(4, ap, sa);
                _tile_loadd(6, bp, sb);
                _tile_dpbf16ps(0, 4, 6);
                if (two_n) {
                    _tile_loadd(7, bp + 16, sb);
                    _tile_dpbf16ps(1, 4, 7);
                }
                if (two_m) {
                    _tile_loadd(5, ap + a1, sa);
                    _tile_dpbf16ps(2, 5, 6);
                    if (two_n) _tile_dpbf16ps(3, 5, 7);
                }
            }
            FC_AMX_STORE(0, c, m_lo, n_lo);
            if (two_n) FC_AMX_STORE(1, c + 16, m_lo, nc - 16);
            if (two_m) {
                FC_AMX_STORE(2, c + (size_t)16 * ldc, mr - 16, n_lo);
                if (two_n) FC_AMX_STORE(3, c + (size_t)16 * ldc + 16, mr - 16, nc - 16);
            }
        }
    }
    _tile_release();
}

static void fc_amx_gemm(int at, int bt, int M, int N, int K2, const uint32_t *A, int lda,
                        const uint32_t *B, int ldb, float *C, int ldc, float scale, int acc) {
    if (M <= 0 || N <= 0) return;
    if (K2 <= 0) {
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) C[(size_t)m * ldc + n] = acc ? C[(size_t)m * ldc + n] : 0.0f;
        return;
    }
    /* chunks of the inner dimension, each adding to C (scale (s0 + s1) as
     * scale s0 + scale s1, as fc_gemm_nt's panels) */
    for (int k0 = 0; k0 < K2; k0 += FC_AMX_KC) {
        int kc = K2 - k0 < FC_AMX_KC ? K2 - k0 : FC_AMX_KC;
        fc_amx_gemm_chunk(at, bt, M, N, kc, at ? A + (size_t)k0 * lda : A + k0, lda,
                          bt ? B + k0 : B + (size_t)k0 * ldb, ldb, C, ldc, scale, acc || k0 > 0);
    }
}

static void fc_amx_gemm_bf16_nn(int M, int N, int K2, const uint32_t *A, int lda,
                                const uint32_t *B, int ldb, float *C, int ldc, float scale,
                                int acc) {
    fc_amx_gemm(0, 0, M, N, K2, A, lda, B, ldb, C, ldc, scale, acc);
}

static void fc_amx_gemm_bf16_tn(int M, int N, int K2, const uint32_t *A, int lda,
                                const uint32_t *B, int ldb, float *C, int ldc, float scale,
                                int acc) {
    fc_amx_gemm(1, 0, M, N, K2, A, lda, B, ldb, C, ldc, scale, acc);
}

static void fc_amx_gemm_bf16_nt(int M, int N, int K2, const uint32_t *A, int lda,
                                const uint32_t *B, int ldb, float *C, int ldc, float scale,
                                int acc) {
    fc_amx_gemm(0, 1, M, N, K2, A, lda, B, ldb, C, ldc, scale, acc);
}
#endif /* FLASHC_HAVE_AMX */

#if defined(FLASHC_HAVE_AMX)
/* 16 values as bf16 hi and lo (simd.h's split); the lanes that are not finite */
static inline __mmask16 fc_split16(__m512 x, __m256i *hi, __m256i *lo) {
    __m256i b = (__m256i)_mm512_cvtneps_pbh(x);
    __mmask16 finite = _mm512_cmp_ps_mask(_mm512_abs_ps(x), _mm512_set1_ps(__builtin_inff()),
                                          _CMP_LT_OQ);
    *hi = b;
    *lo = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_sub_ps(finite, x, fc_from_bf16(b)));
    return (__mmask16)~finite;
}

/* 16 elements of row r (fp16 or fp32) from i as fp32; lanes off in k are 0 */
static inline __m512 fc_split_load(flashc_dtype dt, const void *r, int i, __mmask16 k) {
    if (dt == FLASHC_DTYPE_FP32) return _mm512_maskz_loadu_ps(k, (const float *)r + i);
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, (const uint16_t *)r + i));
}

static int fc_avx512_split(flashc_dtype dt, int n, const void *r0, const void *r1, int pairs,
                           uint32_t *hi, uint32_t *lo) {
    __mmask16 bad = 0; /* (masked-off lanes load 0: finite) */
    for (int i = 0; i < n; i += 16) {
        __mmask16 k = fc_mask(n - i);
        __m256i h0, l0, h1 = _mm256_setzero_si256(), l1 = _mm256_setzero_si256();
        bad |= fc_split16(fc_split_load(dt, r0, i, k), &h0, &l0);
        if (!pairs) {
            _mm256_mask_storeu_epi16((uint16_t *)hi + i, k, h0);
            _mm256_mask_storeu_epi16((uint16_t *)lo + i, k, l0);
            continue;
        }
        if (r1) bad |= fc_split16(fc_split_load(dt, r1, i, k), &h1, &l1);
        __m512i wh = _mm512_inserti64x4(_mm512_castsi256_si512(h0), h1, 1);
        __m512i wl = _mm512_inserti64x4(_mm512_castsi256_si512(l0), l1, 1);
        _mm512_mask_storeu_epi32(hi + i, k, fc_interleave16(wh));
        _mm512_mask_storeu_epi32(lo + i, k, fc_interleave16(wl));
    }
    if (!pairs && (n & 1)) {
        ((uint16_t *)hi)[n] = 0;
        ((uint16_t *)lo)[n] = 0;
    }
    return bad != 0;
}
#endif /* FLASHC_HAVE_AMX */

/* The avx512 table, and the amx table: the same with the bf16 GEMMs on tiles. */
#define FC_AVX512_TABLE(level, bf16_cpu, bf16_nn, bf16_tn, bf16_nt, softmax_rows_bf16,             \
                        split)                                                                     \
    {                                                                                              \
        level, fc_avx512_gemm_nn, fc_avx512_gemm_nt, fc_avx512_gemm_tn, fc_avx512_exp2_sum,        \
        fc_avx512_max, fc_avx512_scale, fc_avx512_load, fc_avx512_store, fc_avx512_score_mod,      \
        fc_avx512_softmax_cols, fc_avx512_dropout_cols, bf16_cpu, bf16_nn, bf16_tn, bf16_nt,       \
        fc_avx512_pack_pairs, softmax_rows_bf16, fc_avx512_dot_rows, fc_avx512_dot_rows_bf16,      \
        fc_avx512_axpy_rows, split, fc_avx512_ds_row, fc_avx512_row_pairs,                         \
    }

const fc_simd_ops fc_simd_avx512_ops =
    FC_AVX512_TABLE(FLASHC_SIMD_AVX512, FLASHC_CPU_AVX512BF16, fc_avx512_gemm_bf16_nn,
                    fc_avx512_gemm_bf16_tn, fc_avx512_gemm_bf16_nt, NULL, NULL);
#if defined(FLASHC_HAVE_AMX)
const fc_simd_ops fc_simd_amx_ops =
    FC_AVX512_TABLE(FLASHC_SIMD_AMX, FLASHC_CPU_AVX512BF16 | FLASHC_CPU_AMXBF16,
                    fc_amx_gemm_bf16_nn, fc_amx_gemm_bf16_tn, fc_amx_gemm_bf16_nt,
                    fc_avx512_softmax_rows_bf16, fc_avx512_split);
#endif
