/* simd.h : the CPU backend's vector primitives, one table per SIMD path.
 *
 * simd_scalar.c, simd_avx2.c and simd_avx512.c each fill one fc_simd_ops and
 * are compiled with their own -m flags; simd.c picks the table at run time
 * from the CPU's features (or FLASHC_SIMD / flashc_set_simd). Kernel code calls
 * only through fc_simd() so that every path runs the same algorithm.
 *
 * All matrices are fp32, row-major, with leading dimensions in elements.
 */
#ifndef FLASHC_CPU_SIMD_H
#define FLASHC_CPU_SIMD_H

#include "../internal.h"

/* Score modifiers of a block x[M][N] (leading dimension ld). Element (r, c)
 * has the relative key position d = d0 + r*dr + c*dc (key index minus the
 * query's bottom-right diagonal i + Sk - Sq). Applied in this order:
 *   cap != 0:   x = cap * tanh(x)
 *   slope != 0: x -= slope * |d|                      (ALiBi)
 *   x = -inf where (wl >= 0 and d < -wl) or (wr >= 0 and d > wr), that is
 *     where !FC_WINDOW_SEES(d, wl, wr) (common/window.h; tests/test_rules.c
 *     checks every path against fc_key_range)
 * cap and slope are in the units of x (log2 scores: multiplied by log2 e).
 * Every d of the block must fit in int32. */
typedef struct fc_score_mod {
    float cap;      /* 0 = off */
    float slope;    /* 0 = off */
    int64_t d0;
    int32_t dr, dc; /* +1 or -1 */
    int32_t wl, wr; /* window, -1 = unbounded */
} fc_score_mod;

typedef struct fc_simd_ops {
    flashc_simd level;
    /* C[M][N] = (acc ? C : 0) + A[M][K] * B[K][N] */
    void (*gemm_nn)(int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                    float *C, int ldc, int acc);
    /* C[M][N] = (acc ? C : 0) + A[M][K] * B[N][K]^T */
    void (*gemm_nt)(int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                    float *C, int ldc, int acc);
    /* C[M][N] = (acc ? C : 0) + A[K][M]^T * B[K][N] */
    void (*gemm_tn)(int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                    float *C, int ldc, int acc);
    /* x[i] = exp2(x[i] - m) for i < n (exp2(-inf) = 0); returns the sum of the new x */
    float (*exp2_sum)(int n, float *x, float m);
    /* max of x[0..n), -inf for n == 0 */
    float (*max)(int n, const float *x);
    /* x[i] *= s */
    void (*scale)(int n, float *x, float s);
    /* dst[i] = mul * (float)src[i] for n elements of dtype dt (fp32, fp16, bf16) */
    void (*load)(flashc_dtype dt, int n, const void *src, float *dst, float mul);
    /* dst[i] = (dtype)(mul * src[i]), round to nearest even */
    void (*store)(flashc_dtype dt, int n, const float *src, void *dst, float mul);
    /* Modifiers of a block x[M][N] of scores (see fc_score_mod). */
    void (*score_mod)(int M, int N, float *x, int ld, const fc_score_mod *mod);
    /* Online softmax down the columns of x[M][N]: column c holds one query's
     * scores of M keys in log2 units. With mo = m[c] on entry:
     *   m[c] = max(mo, max_r x[r][c]), u = (m[c] == -inf ? 0 : m[c]),
     *   x[r][c] = exp2(x[r][c] - u), alpha[c] = exp2(mo - u),
     *   l[c] = alpha[c] * l[c] + sum_r x[r][c].
     * So a column that has seen only -inf keeps x = 0, alpha = 0, l = 0. */
    void (*softmax_cols)(int M, int N, float *x, int ld, float *m, float *l, float *alpha);
    /* Dropout down the columns of x[M][N]: element (r, c) is key j0 + r of
     * query i0 + c of bh = b * H + h; kept elements (fc_dropout_keep of
     * philox.h with seed, offset, threshold) are multiplied by scale, dropped
     * ones become 0. */
    void (*dropout_cols)(int M, int N, float *x, int ld, uint64_t seed, uint64_t offset,
                         uint32_t bh, uint32_t i0, int64_t j0, uint32_t threshold, float scale);

    /* ---- bf16 dot products (optional) ----
     * NULL where the path has none; usable only when flashc_cpu_features()
     * has every bit of bf16_cpu. Operands hold bf16 pairs: one uint32 carries
     * elements 2p (low half) and 2p+1 (high half) of the inner dimension, which
     * has K2 pairs (an odd length is padded with a zero). Leading dimensions
     * of A and B count pairs. Products are exact, sums fp32. */
    unsigned bf16_cpu;
    /* C[M][N] = (acc ? C : 0) + scale * sum_p A[m][p] . B[p][n] */
    void (*gemm_bf16_nn)(int M, int N, int K2, const uint32_t *A, int lda, const uint32_t *B,
                         int ldb, float *C, int ldc, float scale, int acc);
    /* C[M][N] = (acc ? C : 0) + scale * sum_p A[p][m] . B[p][n] */
    void (*gemm_bf16_tn)(int M, int N, int K2, const uint32_t *A, int lda, const uint32_t *B,
                         int ldb, float *C, int ldc, float scale, int acc);
    /* C[M][N] = (acc ? C : 0) + scale * sum_p A[m][p] . B[n][p] (rows of A
     * against rows of B: Qi Kj^T and dOi Vj^T of the backward) */
    void (*gemm_bf16_nt)(int M, int N, int K2, const uint32_t *A, int lda, const uint32_t *B,
                         int ldb, float *C, int ldc, float scale, int acc);
    /* dst[i] = bf16(r0[i]) | bf16(r1[i]) << 16 for i < n: two rows of dtype dt
     * (fp32 or bf16) interleaved into pairs, fp32 rounded to nearest even
     * (denormals may flush to 0); r1 == NULL gives 0 high halves. */
    void (*pack_pairs)(flashc_dtype dt, int n, const void *r0, const void *r1, uint32_t *dst);
    /* softmax_cols along the rows of xs * x[M][N] (row r: one query's scores of
     * N keys, log2 units, once multiplied by xs > 0; m, l, alpha per row, as
     * softmax_cols has them per column), x left as it is and P written as
     * bf16 into p2: row r at
     * p2 + r * ldp holds the N values as pairs of keys (simd.h's pairs, an odd
     * N's last pair with a 0 high half); l sums the fp32 P. With p2lo (not
     * NULL) also P - bf16(P) as bf16 into p2lo, laid out as p2: P to about 16
     * bits in two halves (split's). NULL where the forward's queries-down
     * layout is not used (fwd.c: the amx table only). */
    void (*softmax_rows_bf16)(int M, int N, const float *x, int ld, float xs, float *m, float *l,
                              float *alpha, uint32_t *p2, uint32_t *p2lo, int ldp);

    /* ---- decode's scores (optional; NULL where the path has none) ----
     * s[c * lds + r] = sum_d q[c * ldq + d] * k_r[d] for r < nk, c < nq (1..8): the
     * rows k_r = krows[r] of D elements of dtype dt (fp32, fp16 or bf16), widened to
     * fp32 in registers, so a 16-bit cache needs no fp32 copy and no transpose. */
    void (*dot_rows)(flashc_dtype dt, int nk, int D, const void *const *krows, const float *q,
                     int ldq, int nq, float *s, int lds);
    /* dot_rows for bf16 rows on bf16 dot products (optional, with bf16_cpu):
     * s[c * lds + r] = scale * sum_d q(c, d) k_r[d], q as bf16 pairs (row c at
     * q2 + c * ldq2 words, (D + 1) / 2 pairs, an odd D's last high half 0); the
     * products exact, the sums fp32. */
    void (*dot_rows_bf16)(int nk, int D, const void *const *krows, const uint32_t *q2, int ldq2,
                          int nq, float *s, int lds, float scale);

    /* ---- decode's P V (optional; NULL where the path has none) ----
     * o[c * ldo + d] += sum_r p[r * ldp + c] * v_r[d] for d < Dv, c < nq (1..8): the
     * rows v_r = vrows[r] (r < nv) of Dv elements of dtype dt (fp32, fp16 or bf16),
     * widened to fp32 in registers (dot_rows' twin: P^T as softmax_cols leaves it,
     * keys down, against V's rows where they lie). */
    void (*axpy_rows)(flashc_dtype dt, int nv, int Dv, const void *const *vrows, const float *p,
                      int ldp, int nq, float *o, int ldo);

    /* ---- fp16 on bf16 dot products (optional; the amx path's) ----
     * A value x of dtype dt (fp16 or fp32) as bf16 hi + lo: hi = bf16(x) to
     * nearest even, lo = bf16(x - hi) (0 where x is not finite). For fp16 that
     * is exact (its 11 significant bits less hi's 8 leave at most 4), for fp32
     * about 16 bits. Three bf16 products, hi hi' + hi lo' + lo hi', then give
     * x x' to about 2^-16 of it, the lo lo' term left out. pairs 0: row r0's n
     * values as (n + 1) / 2 pairs along the row (an odd n's last high half 0);
     * pairs 1: rows r0 and r1 (NULL: zeros) interleaved as pack_pairs does.
     * Returns nonzero when some value is inf or NaN: its products would not be
     * hi hi' (inf x 0 is NaN), and the caller computes that part another way. */
    int (*split)(flashc_dtype dt, int n, const void *r0, const void *r1, int pairs, uint32_t *hi,
                 uint32_t *lo);

    /* ---- the backward's dS (bwd.c:fc_bwd_dscores) ----
     * Along a row of n: p[i] = p[i] (dp[i] z[i] - delta) t[i], with z (dropout's
     * multipliers) and t (softcap's 1 - tanh^2) left out where NULL. */
    void (*ds_row)(int n, float *p, const float *dp, const float *z, const float *t, float delta);
    /* One fp32 row of n as (n + 1) / 2 bf16 pairs along it (dst[i] = bf16(x[i]),
     * pack_pairs' rounding; an odd n's dst[n] = 0): the backward's dS in pairs of
     * keys. Present, and usable, where the bf16 dot products are. */
    void (*row_pairs)(int n, const float *x, uint16_t *dst);
} fc_simd_ops;

/* The active table (never NULL). */
const fc_simd_ops *fc_simd(void);

/* F(NQ, ...) with the column count nq (1..8, above) as a constant: the row ops'
 * kernels are unrolled over their NQ columns. */
#define FC_SWITCH_NQ(nq, F, ...)                                                                   \
    switch (nq) {                                                                                  \
    case 1: F(1, __VA_ARGS__); break;                                                              \
    case 2: F(2, __VA_ARGS__); break;                                                              \
    case 3: F(3, __VA_ARGS__); break;                                                              \
    case 4: F(4, __VA_ARGS__); break;                                                              \
    case 5: F(5, __VA_ARGS__); break;                                                              \
    case 6: F(6, __VA_ARGS__); break;                                                              \
    case 7: F(7, __VA_ARGS__); break;                                                              \
    case 8: F(8, __VA_ARGS__); break;                                                              \
    default: break;                                                                                \
    }

/* 0 when the amx path can never run in this process (not built, not on this
 * CPU, or the OS refused it), else 1 (without asking the OS): fwd.c and bwd.c
 * then reserve the amx tiles' workspace too, so that its size is the same on
 * every path. */
int fc_simd_amx_possible(void);

/* fp16 as bf16 hi + lo on AMX tiles (the split op): one rule for the forward
 * and the backward, so that the backward recomputes the scores the forward
 * made. A split problem (fp16, more than FC_SPLIT_MIN_SQ query rows, no
 * dropout, on a CPU with AMX) reserves the split's workspace on every path and
 * runs split on the amx table (fc_split_runs). Decode (FC_SPLIT_MIN_SQ rows
 * or fewer) keeps its row ops, which read fp16 where it lies. */
#define FC_SPLIT_MIN_SQ 8

/* A bf16 GEMM of the table (gemm_bf16_nn, _tn or _nt) */
typedef void (*fc_gemm_bf16_fn)(int M, int N, int K2, const uint32_t *A, int lda,
                                const uint32_t *B, int ldb, float *C, int ldc, float scale,
                                int acc);

/* gemm(A, B) with C as it says; where alo is given (with blo: the split's lo
 * halves, laid out as A and B) two more products added, A blo and alo B. */
static inline void fc_gemm_bf16_split(fc_gemm_bf16_fn gemm, int M, int N, int K2,
                                      const uint32_t *A, const uint32_t *alo, int lda,
                                      const uint32_t *B, const uint32_t *blo, int ldb, float *C,
                                      int ldc, float scale, int acc) {
    gemm(M, N, K2, A, lda, B, ldb, C, ldc, scale, acc);
    if (alo) {
        gemm(M, N, K2, A, lda, blo, ldb, C, ldc, scale, 1);
        gemm(M, N, K2, alo, lda, B, ldb, C, ldc, scale, 1);
    }
}
static inline int fc_split_problem(const fc_attn *a) {
    return a->dtype == FLASHC_DTYPE_FP16 && a->max_seqlen_q > FC_SPLIT_MIN_SQ &&
           a->dropout_p == 0.0f && fc_simd_amx_possible();
}

static inline int fc_split_runs(const fc_attn *a, const fc_simd_ops *ops) {
    return fc_split_problem(a) && ops->level == FLASHC_SIMD_AMX && ops->split &&
           ops->gemm_bf16_nn && ops->gemm_bf16_tn && ops->gemm_bf16_nt &&
           ops->softmax_rows_bf16 && (flashc_cpu_features() & ops->bf16_cpu) == ops->bf16_cpu;
}

/* Whether the amx path's tiles grow to `big` rows along a sequence of length len
 * (the forward's query rows, the backward's keys): the sequence holds at least
 * min_blocks such blocks, and units (the heads a block is taken per) times that many
 * blocks leave at least 4 a thread; which masks allow them is the caller's (the
 * forward's: none bounded on the left, causal included; the backward's: none). Bigger tiles
 * repack K and V less often (fwd.c, bwd.c). Either choice gives the same bits, so
 * the thread count, which the rule reads, never shows in a result: the forward's
 * GQA packing keeps the 256-row bound (fwd.c pack_br), rows or tiles is a sequence's
 * choice (fc_fwd_task), a block's scores are scaled in one place whether or not the
 * tile masks it (fc_fwd_qdown_block), the row sums do not depend on how many masked
 * keys a block carries (softmax_rows_bf16), fp16's split keeps 256-row tiles
 * (fc_fwd_amx_pick), and the backward sums dQ over 128 keys at a time (bwd.c
 * FC_BWD_DQ_KEYS); test_varlen.c and test_edge.c compare 1 thread with 5 or 9,
 * test_rows.c the row softmax with more masked keys. */
static inline int fc_amx_big_tiles(int64_t len, int64_t big, int64_t min_blocks,
                                   int64_t units) {
    int64_t per = len / big;
    return per >= min_blocks && units * per >= 4 * (int64_t)fc_cpu_num_threads();
}

/* Tables of the paths; a path's table is NULL when the build lacks it. */
extern const fc_simd_ops fc_simd_scalar_ops;
#if defined(FLASHC_HAVE_AVX2)
extern const fc_simd_ops fc_simd_avx2_ops;
#endif
#if defined(FLASHC_HAVE_AVX512)
extern const fc_simd_ops fc_simd_avx512_ops;
#endif
#if defined(FLASHC_HAVE_AMX)
extern const fc_simd_ops fc_simd_amx_ops;
#endif

#endif /* FLASHC_CPU_SIMD_H */
