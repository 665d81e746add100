/* simd_avx2.c : fc_simd_ops for AVX2 + FMA + F16C, 8 fp32 lanes per ymm
 * register. Built with -mavx2 -mfma -mf16c.
 *
 * The same algorithms as simd_avx512.c at half the width and with half the
 * registers: the GEMM micro-kernel keeps a 6 x 16 tile of C in 12 ymm
 * accumulators (each inner step: 2 loads of B, 6 broadcasts of A, 12 FMAs),
 * B comes from a 128 x 16 panel packed on the stack (gemm_nn, gemm_tn: a copy
 * zero past the last column; gemm_nt: 8 x 8 in-register transposes), so the
 * inner loop has no masked load; dropout runs Philox on 8 lanes. Column tails
 * of C use vmaskmovps loads and a bounce buffer for stores (masked stores are
 * slow on AMD parts); 16-bit tails are converted one element at a time (the
 * row ops: through a zeroed 8-element buffer). No
 * bf16 dot products (AVX2 has none).
 *
 * exp2: as in simd_avx512.c, with 2^n built in the exponent field; inputs
 * below -127 give 0 (2^n with n = -127 has an all-zero pattern), so results
 * under 2^-126.5 flush to 0, an absolute error below 1e-38.
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
/* 2^f ~ sum_k fc_exp2_c[k] f^k on [-1/2, 1/2] (as simd_avx512.c) */
static const float fc_exp2_c[7] = {1.000000000e+00f, 6.931471825e-01f, 2.402265072e-01f,
                                   5.550327152e-02f, 9.618056938e-03f, 1.340042800e-03f,
                                   1.546144485e-04f};
#define FC_EXP2_LO (-127.0f)
#define FC_EXP2_HI 128.0f
#define FC_EXP2_BIAS 127

/* ---- vector math ---- */
static inline __m256 fc_exp2(__m256 x) {
    /* min/max return their second operand when either is NaN: NaN propagates
     * (n then gives a garbage 2^n, and NaN * anything is NaN) */
    x = _mm256_min_ps(_mm256_set1_ps(FC_EXP2_HI), x);
    x = _mm256_max_ps(_mm256_set1_ps(FC_EXP2_LO), x);
    __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_sub_ps(x, n);
    __m256 p = _mm256_set1_ps(fc_exp2_c[6]);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(fc_exp2_c[5]));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(fc_exp2_c[4]));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(fc_exp2_c[3]));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(fc_exp2_c[2]));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(fc_exp2_c[1]));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(fc_exp2_c[0]));
    __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(FC_EXP2_BIAS)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

static inline __m256 fc_abs(__m256 x) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x); }

static inline __m256 fc_tanh(__m256 x) {
    __m256 e = fc_exp2(_mm256_mul_ps(fc_abs(x), _mm256_set1_ps((float)(-2.0 * FC_LOG2E))));
    __m256 one = _mm256_set1_ps(1.0f);
    __m256 t = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
    /* t >= 0: give it the sign bit of x */
    return _mm256_or_ps(t, _mm256_and_ps(x, _mm256_set1_ps(-0.0f)));
}

/* Lane mask of the lanes [0, n), n in [0, 8]. */
static inline __m256i fc_mask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* Store the lanes [0, n) of v. */
static inline void fc_store_n(float *p, __m256 v, int n) {
    if (n >= 8) {
        _mm256_storeu_ps(p, v);
        return;
    }
    float tmp[8];
    _mm256_storeu_ps(tmp, v);
    memcpy(p, tmp, (size_t)n * sizeof(float));
}

/* ---- GEMM ---- */
enum { FC_MR = 6, FC_NV = 2, FC_NR = 8 * FC_NV, FC_KC = 128 };

/* C[R][8 NV] = (acc ? C : 0) + sum_k A(r, k) B[k][.], A(r, k) = A[r*ars + k*aks];
 * the last of the NV vectors of C covers nl lanes (mask ml). B is read by
 * whole vectors: a full panel in place, or a packed one (fc_pack_b,
 * fc_pack_bt) zero past the last column, so no masked load enters the loop
 * over k. */
static inline __attribute__((always_inline)) void
fc_ukr(const int R, const int NV, int K, const float *A, ptrdiff_t ars, ptrdiff_t aks,
       const float *B, ptrdiff_t ldb, float *C, ptrdiff_t ldc, int acc, __m256i ml, int nl) {
    __m256 c[FC_MR][FC_NV];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++)
            c[r][v] = !acc          ? _mm256_setzero_ps()
                      : v == NV - 1 ? _mm256_maskload_ps(C + r * ldc + 8 * v, ml)
                                    : _mm256_loadu_ps(C + r * ldc + 8 * v);
    for (int k = 0; k < K; k++) {
        __m256 b[FC_NV];
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) b[v] = _mm256_loadu_ps(B + 8 * v);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m256 a = _mm256_broadcast_ss(A + r * ars);
#pragma GCC unroll 2
            for (int v = 0; v < NV; v++) c[r][v] = _mm256_fmadd_ps(a, b[v], c[r][v]);
        }
        A += aks;
        B += ldb;
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) {
            if (v == NV - 1)
                fc_store_n(C + r * ldc + 8 * v, c[r][v], nl);
            else
                _mm256_storeu_ps(C + r * ldc + 8 * v, c[r][v]);
        }
}

#define FC_UKR_NV(R_, ARS, AKS)                                                                    \
    switch (nv) {                                                                                  \
    case 1: fc_ukr(R_, 1, K, A, ARS, AKS, B, ldb, C, ldc, acc, ml, nl); break;                     \
    default: fc_ukr(R_, 2, K, A, ARS, AKS, B, ldb, C, ldc, acc, ml, nl); break;                    \
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
                      ptrdiff_t ldb, float *C, ptrdiff_t ldc, int acc, __m256i ml, int nl) {
    FC_UKR_R(lda, 1)
}

/* One micro-tile, A read by columns (A(r, k) = A[k*lda + r]). */
static void fc_tile_t(int R, int nv, int K, const float *A, ptrdiff_t lda, const float *B,
                      ptrdiff_t ldb, float *C, ptrdiff_t ldc, int acc, __m256i ml, int nl) {
    FC_UKR_R(1, lda)
}

/* bp[k][j] = B[k][j] for j < n (<= FC_NR), k < kc (<= FC_KC); lanes j in
 * [n, 8 nv) are 0. Packing buys whole-vector loads of B (a vmaskmovps per step
 * held the kernel at 92-98 GFLOP/s on Zen4, whole loads 105-112 of the 117
 * FMA ceiling; bench/simd_gemm.c, bench/NOTES.md) and a contiguous panel: in
 * place, 16 columns at a power-of-two ldb (the tiles' 128) fall in 8 of L1's
 * 64 sets, and a 128-row panel does not fit them (gemm_tn at Bc x 128 x 64:
 * ~100 GFLOP/s in place, ~107 packed). */
static void fc_pack_b(int n, int kc, const float *B, int ldb, float *bp) {
    if (n == FC_NR) {
        for (int k = 0; k < kc; k++) {
            const float *b = B + (size_t)k * ldb;
            _mm256_store_ps(bp + (size_t)k * FC_NR, _mm256_loadu_ps(b));
            _mm256_store_ps(bp + (size_t)k * FC_NR + 8, _mm256_loadu_ps(b + 8));
        }
        return;
    }
    __m256i m0 = fc_mask(n < 8 ? n : 8), m1 = fc_mask(n > 8 ? n - 8 : 0);
    for (int k = 0; k < kc; k++) {
        const float *b = B + (size_t)k * ldb;
        _mm256_store_ps(bp + (size_t)k * FC_NR, _mm256_maskload_ps(b, m0));
        _mm256_store_ps(bp + (size_t)k * FC_NR + 8, _mm256_maskload_ps(b + 8, m1));
    }
}

/* C[M][N] (+)= op(A) B over micro-tiles, column panels of B outside, each
 * packed by blocks of FC_KC rows (fc_pack_b) and reused down the M rows. A
 * full panel used by at most FC_IN_PLACE_ROWS rows of C is read in place:
 * there the copy costs as much as the FMAs (bench/simd_gemm.c: decode's P V,
 * 1 query row, 34 -> 18 GFLOP/s packed). A narrow last panel is always packed,
 * so B's loads are never masked. */
enum { FC_IN_PLACE_ROWS = 2 * FC_MR };
static void fc_gemm(int at, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                    float *C, int ldc, int acc) {
    float bp[FC_KC * FC_NR] __attribute__((aligned(32))); /* B panel, 8 KB */
    for (int n0 = 0; n0 < N; n0 += FC_NR) {
        int n = N - n0 < FC_NR ? N - n0 : FC_NR;
        int nv = (n + 7) / 8, nl = n - 8 * (nv - 1);
        __m256i ml = fc_mask(nl);
        int in_place = n == FC_NR && M <= FC_IN_PLACE_ROWS;
        for (int k0 = 0; k0 < K || k0 == 0; k0 += FC_KC) {
            int kc = K - k0 < FC_KC ? K - k0 : FC_KC;
            const float *b = B + (size_t)k0 * ldb + n0;
            ptrdiff_t ldp = ldb;
            if (!in_place) {
                fc_pack_b(n, kc, b, ldb, bp);
                b = bp;
                ldp = FC_NR;
            }
            for (int m0 = 0; m0 < M; m0 += FC_MR) {
                int R = M - m0 < FC_MR ? M - m0 : FC_MR;
                float *c = C + (size_t)m0 * ldc + n0;
                int ac = acc || k0 > 0;
                if (at)
                    fc_tile_t(R, nv, kc, A + (size_t)k0 * lda + m0, lda, b, ldp, c, ldc, ac, ml,
                              nl);
                else
                    fc_tile_n(R, nv, kc, A + (size_t)m0 * lda + k0, lda, b, ldp, c, ldc, ac, ml,
                              nl);
            }
        }
    }
}

static void fc_avx2_gemm_nn(int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                            float *C, int ldc, int acc) {
    fc_gemm(0, M, N, K, A, lda, B, ldb, C, ldc, acc);
}

static void fc_avx2_gemm_tn(int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                            float *C, int ldc, int acc) {
    fc_gemm(1, M, N, K, A, lda, B, ldb, C, ldc, acc);
}

/* In-register transpose of 8 rows of 8 floats. */
static inline void fc_transpose8(__m256 r[8]) {
    __m256 t[8], s[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    /* s[4g + e], 128-bit lane l: column 4l + e of rows 4g .. 4g+3 */
    for (int g = 0; g < 2; g++) {
        s[4 * g + 0] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
        s[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0xee);
        s[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
        s[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xee);
    }
    for (int e = 0; e < 4; e++) {
        r[e] = _mm256_permute2f128_ps(s[e], s[4 + e], 0x20);
        r[4 + e] = _mm256_permute2f128_ps(s[e], s[4 + e], 0x31);
    }
}

/* bt[k][j] = B[j][k] for j < n (<= FC_NR), k < kc (<= FC_KC); lanes j in
 * [n, roundup8(n)) are 0. */
static void fc_pack_bt(int n, int kc, const float *B, int ldb, float *bt) {
    for (int j0 = 0; j0 < n; j0 += 8) {
        for (int k0 = 0; k0 < kc; k0 += 8) {
            __m256i mk = fc_mask(kc - k0);
            __m256 r[8];
            for (int i = 0; i < 8; i++)
                r[i] = j0 + i < n ? _mm256_maskload_ps(B + (size_t)(j0 + i) * ldb + k0, mk)
                                  : _mm256_setzero_ps();
            fc_transpose8(r);
            int kn = kc - k0 < 8 ? kc - k0 : 8;
            for (int i = 0; i < kn; i++) _mm256_storeu_ps(bt + (size_t)(k0 + i) * FC_NR + j0, r[i]);
        }
    }
}

static void fc_avx2_gemm_nt(int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                            float *C, int ldc, int acc) {
    if (K == 0) {
        fc_gemm(0, M, N, 0, A, lda, B, ldb, C, ldc, acc);
        return;
    }
    float bt[FC_KC * FC_NR] __attribute__((aligned(32))); /* B^T panel, 8 KB */
    for (int n0 = 0; n0 < N; n0 += FC_NR) {
        int n = N - n0 < FC_NR ? N - n0 : FC_NR;
        int nv = (n + 7) / 8, nl = n - 8 * (nv - 1);
        __m256i ml = fc_mask(nl);
        for (int k0 = 0; k0 < K; k0 += FC_KC) {
            int kc = K - k0 < FC_KC ? K - k0 : FC_KC;
            fc_pack_bt(n, kc, B + (size_t)n0 * ldb + k0, ldb, bt);
            for (int m0 = 0; m0 < M; m0 += FC_MR) {
                int R = M - m0 < FC_MR ? M - m0 : FC_MR;
                fc_tile_n(R, nv, kc, A + (size_t)m0 * lda + k0, lda, bt, FC_NR,
                          C + (size_t)m0 * ldc + n0, ldc, acc || k0 > 0, ml, nl);
            }
        }
    }
}

/* ---- row helpers ---- */
static float fc_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static float fc_hmax(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static float fc_avx2_exp2_sum(int n, float *x, float m) {
    __m256 vm = _mm256_set1_ps(m), s = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = fc_exp2(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
        _mm256_storeu_ps(x + i, e);
        s = _mm256_add_ps(s, e);
    }
    if (i < n) {
        __m256i k = fc_mask(n - i);
        __m256 e = fc_exp2(_mm256_sub_ps(_mm256_maskload_ps(x + i, k), vm));
        e = _mm256_and_ps(e, _mm256_castsi256_ps(k));
        fc_store_n(x + i, e, n - i);
        s = _mm256_add_ps(s, e);
    }
    return fc_hsum(s);
}

static float fc_avx2_max(int n, const float *x) {
    __m256 ninf = _mm256_set1_ps(-__builtin_inff()), v = ninf;
    int i = 0;
    for (; i + 8 <= n; i += 8) v = _mm256_max_ps(v, _mm256_loadu_ps(x + i));
    if (i < n) {
        __m256i k = fc_mask(n - i);
        v = _mm256_max_ps(
            v, _mm256_blendv_ps(ninf, _mm256_maskload_ps(x + i, k), _mm256_castsi256_ps(k)));
    }
    return fc_hmax(v);
}

static void fc_avx2_scale(int n, float *x, float s) {
    __m256 vs = _mm256_set1_ps(s);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vs));
    for (; i < n; i++) x[i] *= s;
}

static void fc_avx2_ds_row(int n, float *p, const float *dp, const float *z, const float *t,
                           float delta) {
    __m256 vd = _mm256_set1_ps(delta);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 d = _mm256_loadu_ps(dp + i);
        if (z) d = _mm256_mul_ps(d, _mm256_loadu_ps(z + i));
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(p + i), _mm256_sub_ps(d, vd));
        if (t) v = _mm256_mul_ps(v, _mm256_loadu_ps(t + i));
        _mm256_storeu_ps(p + i, v);
    }
    for (; i < n; i++) {
        float v = p[i] * ((z ? dp[i] * z[i] : dp[i]) - delta);
        p[i] = t ? v * t[i] : v;
    }
}

static inline __m256 fc_load16(flashc_dtype dt, const uint16_t *p) {
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return dt == FLASHC_DTYPE_FP16
               ? _mm256_cvtph_ps(h)
               : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static void fc_avx2_load(flashc_dtype dt, int n, const void *src, float *dst, float mul) {
    __m256 vm = _mm256_set1_ps(mul);
    int i = 0;
    if (dt == FLASHC_DTYPE_FP32) {
        const float *s = (const float *)src;
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_loadu_ps(s + i), vm));
    } else {
        const uint16_t *s = (const uint16_t *)src;
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_mul_ps(fc_load16(dt, s + i), vm));
    }
    for (; i < n; i++) dst[i] = mul * fc_load(dt, src, i);
}

/* fp32 -> bf16 bits in the low half of each 32-bit lane, round to nearest even,
 * NaN kept quiet (fc_float_to_bf16) */
static inline __m256i fc_to_bf16(__m256 v) {
    __m256i u = _mm256_castps_si256(v);
    __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    __m256i nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7f800000)); /* a < 2^31: signed ok */
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd), 16);
    __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    return _mm256_blendv_epi8(r, q, nan);
}

static void fc_avx2_store(flashc_dtype dt, int n, const float *src, void *dst, float mul) {
    __m256 vm = _mm256_set1_ps(mul);
    int i = 0;
    if (dt == FLASHC_DTYPE_FP32) {
        float *d = (float *)dst;
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(d + i, _mm256_mul_ps(_mm256_loadu_ps(src + i), vm));
    } else {
        uint16_t *d = (uint16_t *)dst;
        for (; i + 8 <= n; i += 8) {
            __m256 v = _mm256_mul_ps(_mm256_loadu_ps(src + i), vm);
            __m128i h;
            if (dt == FLASHC_DTYPE_FP16) {
                h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            } else {
                __m256i w = fc_to_bf16(v); /* < 2^16 per lane: packus keeps it */
                h = _mm_packus_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
            }
            _mm_storeu_si128((__m128i *)(d + i), h);
        }
    }
    for (; i < n; i++) fc_store(dt, dst, i, mul * src[i]);
}

/* ---- score blocks ---- */
static void fc_avx2_score_mod(int M, int N, float *x, int ld, const fc_score_mod *mod) {
    const __m256i step =
        _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(mod->dc));
    const __m256 cap = _mm256_set1_ps(mod->cap), slope = _mm256_set1_ps(mod->slope);
    const __m256 ninf = _mm256_set1_ps(-__builtin_inff());
    /* the window in lanes, as FC_WINDOW_SEES (common/window.h): masked iff
     * (wl >= 0 and d < -wl, i.e. -wl > d) or (wr >= 0 and d > wr) */
    const __m256i lo = _mm256_set1_epi32(-mod->wl), hi = _mm256_set1_epi32(mod->wr);
    for (int r = 0; r < M; r++) {
        float *row = x + (size_t)r * ld;
        int32_t drow = (int32_t)(mod->d0 + (int64_t)r * mod->dr);
        for (int c = 0; c < N; c += 8) {
            int n = N - c < 8 ? N - c : 8;
            __m256i k = fc_mask(n);
            __m256i d = _mm256_add_epi32(_mm256_set1_epi32(drow + c * mod->dc), step);
            __m256 v = _mm256_maskload_ps(row + c, k);
            if (mod->cap != 0.0f) v = _mm256_mul_ps(cap, fc_tanh(v));
            if (mod->slope != 0.0f) v = _mm256_fnmadd_ps(slope, fc_abs(_mm256_cvtepi32_ps(d)), v);
            __m256i out = _mm256_setzero_si256();
            if (mod->wl >= 0) out = _mm256_or_si256(out, _mm256_cmpgt_epi32(lo, d));
            if (mod->wr >= 0) out = _mm256_or_si256(out, _mm256_cmpgt_epi32(d, hi));
            v = _mm256_blendv_ps(v, ninf, _mm256_castsi256_ps(out));
            fc_store_n(row + c, v, n);
        }
    }
}

static void fc_avx2_softmax_cols(int M, int N, float *x, int ld, float *m, float *l, float *alpha) {
    const __m256 ninf = _mm256_set1_ps(-__builtin_inff());
    for (int c = 0; c < N; c += 8) {
        int n = N - c < 8 ? N - c : 8;
        __m256i k = fc_mask(n);
        __m256 mo = _mm256_maskload_ps(m + c, k), mx = mo;
        for (int r = 0; r < M; r++)
            mx = _mm256_max_ps(mx, _mm256_maskload_ps(x + (size_t)r * ld + c, k));
        __m256 u = _mm256_andnot_ps(_mm256_cmp_ps(mx, ninf, _CMP_EQ_OQ), mx);
        __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
        int r = 0;
        for (; r + 1 < M; r += 2) {
            float *p0 = x + (size_t)r * ld + c, *p1 = p0 + ld;
            __m256 e0 = fc_exp2(_mm256_sub_ps(_mm256_maskload_ps(p0, k), u));
            __m256 e1 = fc_exp2(_mm256_sub_ps(_mm256_maskload_ps(p1, k), u));
            fc_store_n(p0, e0, n);
            fc_store_n(p1, e1, n);
            s0 = _mm256_add_ps(s0, e0);
            s1 = _mm256_add_ps(s1, e1);
        }
        if (r < M) {
            float *p0 = x + (size_t)r * ld + c;
            __m256 e0 = fc_exp2(_mm256_sub_ps(_mm256_maskload_ps(p0, k), u));
            fc_store_n(p0, e0, n);
            s0 = _mm256_add_ps(s0, e0);
        }
        __m256 a = fc_exp2(_mm256_sub_ps(mo, u));
        __m256 lv = _mm256_fmadd_ps(a, _mm256_maskload_ps(l + c, k), _mm256_add_ps(s0, s1));
        fc_store_n(m + c, mx, n);
        fc_store_n(l + c, lv, n);
        fc_store_n(alpha + c, a, n);
    }
}

/* ---- dropout ---- */
/* Philox4x32-10 of philox.h on 8 lanes (its constants). */

/* lo, hi: the 64-bit products m * c of each 32-bit lane, split */
static inline void fc_mulhilo8(__m256i m, __m256i c, __m256i *lo, __m256i *hi) {
    __m256i pe = _mm256_mul_epu32(c, m);                        /* even lanes */
    __m256i po = _mm256_mul_epu32(_mm256_srli_epi64(c, 32), m); /* odd lanes */
    *lo = _mm256_blend_epi32(pe, _mm256_slli_epi64(po, 32), 0xaa);
    *hi = _mm256_blend_epi32(_mm256_srli_epi64(pe, 32), po, 0xaa);
}

static inline void fc_philox8(__m256i c[4], uint32_t k0, uint32_t k1) {
    const __m256i m0 = _mm256_set1_epi32((int)FC_PHILOX_M0),
                  m1 = _mm256_set1_epi32((int)FC_PHILOX_M1);
    for (int r = 0; r < 10; r++) {
        __m256i lo0, hi0, lo1, hi1;
        fc_mulhilo8(m0, c[0], &lo0, &hi0);
        fc_mulhilo8(m1, c[2], &lo1, &hi1);
        c[0] = _mm256_xor_si256(_mm256_xor_si256(hi1, c[1]), _mm256_set1_epi32((int)k0));
        c[2] = _mm256_xor_si256(_mm256_xor_si256(hi0, c[3]), _mm256_set1_epi32((int)k1));
        c[1] = lo1;
        c[3] = lo0;
        k0 += FC_PHILOX_W0;
        k1 += FC_PHILOX_W1;
    }
}

/* One Philox call per (query lane, group of 8 keys) covers 8 rows of 8
 * columns: word w of a lane is key 8g + w. */
static void fc_avx2_dropout_cols(int M, int N, float *x, int ld, uint64_t seed, uint64_t offset,
                                 uint32_t bh, uint32_t i0, int64_t j0, uint32_t threshold,
                                 float scale) {
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    /* words are < 2^16 and threshold <= 2^16: signed compares are exact */
    const __m256i low16 = _mm256_set1_epi32(0xffff), thr1 = _mm256_set1_epi32((int)threshold - 1);
    const __m256 vs = _mm256_set1_ps(scale);
    for (int c = 0; c < N; c += 8) {
        int n = N - c < 8 ? N - c : 8;
        __m256i k = fc_mask(n);
        __m256i ci = _mm256_add_epi32(_mm256_set1_epi32((int)(i0 + (uint32_t)c)), iota);
        for (int64_t g = j0 >> 3; 8 * g < j0 + M; g++) {
            uint64_t cnt = offset + (uint64_t)g;
            __m256i st[4] = {_mm256_set1_epi32((int)(uint32_t)cnt),
                             _mm256_set1_epi32((int)(uint32_t)(cnt >> 32)), ci,
                             _mm256_set1_epi32((int)bh)};
            fc_philox8(st, (uint32_t)seed, (uint32_t)(seed >> 32));
            for (int w = 0; w < 8; w++) {
                int64_t j = 8 * g + w;
                if (j < j0 || j >= j0 + M) continue;
                __m256i word = w & 1 ? _mm256_srli_epi32(st[w >> 1], 16) : st[w >> 1];
                __m256i keep = _mm256_cmpgt_epi32(_mm256_and_si256(word, low16), thr1);
                float *row = x + (size_t)(j - j0) * ld + c;
                __m256 v = _mm256_mul_ps(_mm256_maskload_ps(row, k), vs);
                fc_store_n(row, _mm256_and_ps(v, _mm256_castsi256_ps(keep)), n);
            }
        }
    }
}

/* ---- decode's row ops (fwd.c's narrow tiles, simd.h) ----
 * As simd_avx512.c's at half the width: dot_rows sums K rows against the NQ
 * columns of q, R = 8 / NQ rows at a time (one accumulator per row and column,
 * each K vector loaded once for the NQ columns), each sum reduced by fc_hsum;
 * axpy_rows adds each V row, scaled by its P, to the columns' rows of O, W
 * vectors of 8 elements at a time (NQ W accumulators). Rows of 16-bit elements
 * are widened in registers; a tail of fewer than 8 is read through a zeroed
 * buffer (16-bit) or vmaskmovps (fp32). Without them AVX2 decoded through the
 * tile path: 8 heads, D 128, fp32, 4k keys, one thread took 4.2-4.4 ms, with
 * them 1.5-1.65 (the Intel VM of bench/NOTES.md, session 37). */

/* Elements [d, d + n) of row (dtype dt) as fp32 lanes, n in [1, 8], 0 past n. */
static inline __attribute__((always_inline)) __m256 fc_row8(flashc_dtype dt, const void *row,
                                                             int d, int n) {
    if (dt == FLASHC_DTYPE_FP32) {
        const float *p = (const float *)row + d;
        return n >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, fc_mask(n));
    }
    const uint16_t *p = (const uint16_t *)row + d;
    if (n >= 8) return fc_load16(dt, p);
    uint16_t tmp[8] = {0};
    memcpy(tmp, p, (size_t)n * sizeof(uint16_t));
    return fc_load16(dt, tmp);
}

static inline __attribute__((always_inline)) void
fc_dot_rows_nq(const int NQ, flashc_dtype dt, int nk, int D, const void *const *krows,
               const float *q, int ldq, float *s, int lds) {
    const int R = NQ >= 8 ? 1 : 8 / NQ;
    for (int r0 = 0; r0 < nk; r0 += R) {
        const int nr = nk - r0 < R ? nk - r0 : R;
        const void *rows[8]; /* the last row stands in past nk (its sums are not stored) */
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) rows[r] = krows[r < nr ? r0 + r : nk - 1];
        __m256 acc[8];
#pragma GCC unroll 8
        for (int i = 0; i < R * NQ; i++) acc[i] = _mm256_setzero_ps();
        for (int d = 0; d < D; d += 8) {
            const int n = D - d < 8 ? D - d : 8;
            __m256 qv[8];
#pragma GCC unroll 8
            for (int c = 0; c < NQ; c++)
                qv[c] = fc_row8(FLASHC_DTYPE_FP32, q + (size_t)c * ldq, d, n);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                __m256 k = fc_row8(dt, rows[r], d, n);
#pragma GCC unroll 8
                for (int c = 0; c < NQ; c++)
                    acc[r * NQ + c] = _mm256_fmadd_ps(qv[c], k, acc[r * NQ + c]);
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) /* over the constant R: acc stays in registers */
            if (r < nr)
#pragma GCC unroll 8
                for (int c = 0; c < NQ; c++)
                    s[(size_t)c * lds + r0 + r] = fc_hsum(acc[r * NQ + c]);
    }
}

static void fc_avx2_dot_rows(flashc_dtype dt, int nk, int D, const void *const *krows,
                             const float *q, int ldq, int nq, float *s, int lds) {
    FC_SWITCH_NQ(nq, fc_dot_rows_nq, dt, nk, D, krows, q, ldq, s, lds)
}

static inline __attribute__((always_inline)) void
fc_axpy_rows_nq(const int NQ, flashc_dtype dt, int nv, int Dv, const void *const *vrows,
                const float *p, int ldp, float *o, int ldo) {
    const int W = NQ == 1 ? 8 : NQ == 2 ? 4 : NQ <= 4 ? 2 : 1; /* NQ W <= 8 accumulators */
    for (int d = 0; d < Dv; d += 8 * W) {
        int n[8];
        __m256 acc[8][8];
#pragma GCC unroll 8
        for (int w = 0; w < W; w++) {
            int left = Dv - d - 8 * w;
            n[w] = left < 0 ? 0 : left < 8 ? left : 8;
        }
#pragma GCC unroll 8
        for (int c = 0; c < NQ; c++)
#pragma GCC unroll 8
            for (int w = 0; w < W; w++)
                acc[c][w] = n[w] ? fc_row8(FLASHC_DTYPE_FP32, o + (size_t)c * ldo, d + 8 * w, n[w])
                                 : _mm256_setzero_ps();
        for (int r = 0; r < nv; r++) {
            __m256 pr[8];
#pragma GCC unroll 8
            for (int c = 0; c < NQ; c++) pr[c] = _mm256_set1_ps(p[(size_t)r * ldp + c]);
#pragma GCC unroll 8
            for (int w = 0; w < W; w++) {
                if (!n[w]) continue;
                __m256 v = fc_row8(dt, vrows[r], d + 8 * w, n[w]);
#pragma GCC unroll 8
                for (int c = 0; c < NQ; c++) acc[c][w] = _mm256_fmadd_ps(pr[c], v, acc[c][w]);
            }
        }
#pragma GCC unroll 8
        for (int c = 0; c < NQ; c++)
#pragma GCC unroll 8
            for (int w = 0; w < W; w++)
                if (n[w]) fc_store_n(o + (size_t)c * ldo + d + 8 * w, acc[c][w], n[w]);
    }
}

static void fc_avx2_axpy_rows(flashc_dtype dt, int nv, int Dv, const void *const *vrows,
                              const float *p, int ldp, int nq, float *o, int ldo) {
    FC_SWITCH_NQ(nq, fc_axpy_rows_nq, dt, nv, Dv, vrows, p, ldp, o, ldo)
}

const fc_simd_ops fc_simd_avx2_ops = {
    FLASHC_SIMD_AVX2,  fc_avx2_gemm_nn,   fc_avx2_gemm_nt,      fc_avx2_gemm_tn,
    fc_avx2_exp2_sum,  fc_avx2_max,       fc_avx2_scale,        fc_avx2_load,
    fc_avx2_store,     fc_avx2_score_mod, fc_avx2_softmax_cols, fc_avx2_dropout_cols,
    0,                 NULL,              NULL,                 NULL, NULL, /* no bf16 dot products */
    NULL, /* no softmax_rows_bf16 (the amx forward's) */
    fc_avx2_dot_rows, NULL, fc_avx2_axpy_rows, /* (no bf16 dot products) */
    NULL, /* no split (the amx path's) */
    fc_avx2_ds_row,
    NULL, /* no row_pairs (no bf16 dot products) */
};
