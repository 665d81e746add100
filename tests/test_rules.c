/* test_rules.c : the twins of the "one meaning, one place" rules agree.
 *
 * - rules_window: the window rule (src/common/window.h) in every form that
 *   runs. For all sq, sk in [1, 12], windows left, right in [-1, 13] (right = 0
 *   is causal) and every row i and key j:
 *     fc_key_range (the host's int64_t range, src/internal.h)
 *     == FC_WINDOW_LO / FC_WINDOW_HI on int (the GPU kernels' fc_mask form)
 *     == FC_WINDOW_SEES (the element form)
 *     == FC_WINDOW_ROW_LO / FC_WINDOW_ROW_HI (the rows that see key j: the
 *        backward's query-block bounds, common/bwd_tile.cuh)
 *   and the score_mod of every SIMD path this CPU runs (scalar, AVX2,
 *   AVX-512: lanes of FC_WINDOW_SEES) agrees with fc_key_range, in the
 *   forward's layout (keys down, queries across) and the backward's (queries
 *   down, keys across), on lengths up to 40 (whole vectors and their tails).
 *   Plus the host form at lengths and windows near INT32_MAX (64-bit sums).
 * - rules_score: the two factorings of the logit in fc_score_consts
 *   (src/common/score.h), the CPU's log2 units and the CUDA kernels' units,
 *   give the same x for a grid of q.k values, softcap on and off; a zero scale
 *   runs in finite units.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "../src/common/score.h"
#include "../src/common/window.h"
#include "../src/cpu/simd.h"
#include "../src/internal.h"
#include "fc_test.h"

/* The exhaustive sweep: lengths 1 .. RW_MAX_S, windows -1 .. RW_MAX_W. */
enum { RW_MAX_S = 12, RW_MAX_W = 13 };
/* The SIMD sweep: lengths and windows (AVX2 has 8 lanes, AVX-512 16). */
static const int rw_simd_len[] = {1, 2, 3, 5, 8, 12, 16, 17, 31, 33, 40};
static const int rw_simd_win[] = {-1, 0, 1, 2, 3, 5, 8, 13, 16, 31, 45};
enum { RW_SIMD_MAX = 40, RW_PAD = 4 };

/* Keys [*lo, *hi) of row i by fc_key_range. */
static void rw_host(int64_t sq, int64_t sk, int64_t i, int32_t left, int32_t right,
                    int64_t *lo, int64_t *hi) {
    fc_attn a;
    memset(&a, 0, sizeof a);
    a.window_left = left;
    a.window_right = right;
    fc_key_range(&a, sq, sk, i, lo, hi);
}

/* One SIMD path's score_mod on an all-zero block in the forward layout
 * (fwd = 1: element (r, c) is key r of query c) or the backward's (element
 * (r, c) is query r, key c); 1 iff every element matches [lo, hi) of its row. */
static int rw_simd_block(const fc_simd_ops *ops, int fwd, int sq, int sk, int left, int right,
                         const char *path) {
    float x[RW_SIMD_MAX * (RW_SIMD_MAX + RW_PAD)];
    int M = fwd ? sk : sq, N = fwd ? sq : sk, ld = N + RW_PAD;
    for (int e = 0; e < M * ld; e++) x[e] = 0.0f;
    /* d = j - diag(i) = d0 + r dr + c dc with i = row or column 0 at 0 */
    fc_score_mod mod = {0.0f, 0.0f, -(int64_t)FC_WINDOW_DIAG(0, sq, sk), fwd ? 1 : -1,
                        fwd ? -1 : 1, left, right};
    ops->score_mod(M, N, x, ld, &mod);
    for (int r = 0; r < M; r++)
        for (int c = 0; c < N; c++) {
            int i = fwd ? c : r, j = fwd ? r : c;
            int64_t lo, hi;
            rw_host(sq, sk, i, left, right, &lo, &hi);
            int want = j >= lo && j < hi, got = x[r * ld + c] == 0.0f;
            if (got != want || (!got && x[r * ld + c] != -INFINITY)) {
                fc_test_fail(__FILE__, __LINE__,
                             "%s score_mod (%s layout) sq=%d sk=%d window=(%d,%d) row %d key %d: "
                             "%g, want %s",
                             path, fwd ? "fwd" : "bwd", sq, sk, left, right, i, j,
                             (double)x[r * ld + c], want ? "visible (0)" : "masked (-inf)");
                return 0;
            }
            for (int e = N; e < ld; e++)
                if (x[r * ld + e] != 0.0f) {
                    fc_test_fail(__FILE__, __LINE__, "%s score_mod wrote past column %d", path,
                                 N - 1);
                    return 0;
                }
        }
    return 1;
}

FC_TEST(rules_window) {
    /* scalar forms: host range, int range, element test */
    for (int sq = 1; sq <= RW_MAX_S; sq++)
        for (int sk = 1; sk <= RW_MAX_S; sk++)
            for (int left = -1; left <= RW_MAX_W; left++)
                for (int right = -1; right <= RW_MAX_W; right++)
                    for (int i = 0; i < sq; i++) {
                        int64_t lo, hi;
                        rw_host(sq, sk, i, left, right, &lo, &hi);
                        const int diag = FC_WINDOW_DIAG(i, sq, sk);
                        const int lo32 = FC_WINDOW_LO(diag, left), hi32 = FC_WINDOW_HI(diag, right, sk);
                        if ((lo32 < 0 ? 0 : lo32) != lo || hi32 != hi) {
                            fc_test_fail(__FILE__, __LINE__,
                                         "sq=%d sk=%d window=(%d,%d) row %d: int range [%d, %d) "
                                         "but fc_key_range [%lld, %lld)",
                                         sq, sk, left, right, i, lo32, hi32, (long long)lo,
                                         (long long)hi);
                            return;
                        }
                        for (int j = 0; j < sk; j++) {
                            int want = j >= lo && j < hi;
                            /* the rows form: row i inside key j's row bounds */
                            int rows = (right < 0 || i >= FC_WINDOW_ROW_LO(j, right, sq, sk)) &&
                                       (left < 0 || i <= FC_WINDOW_ROW_HI(j, left, sq, sk));
                            if (rows != want) {
                                fc_test_fail(__FILE__, __LINE__,
                                             "sq=%d sk=%d window=(%d,%d) row %d key %d: the rows "
                                             "form says %d but fc_key_range [%lld, %lld)",
                                             sq, sk, left, right, i, j, rows, (long long)lo,
                                             (long long)hi);
                                return;
                            }
                            if (FC_WINDOW_SEES(j - diag, left, right) != want) {
                                fc_test_fail(__FILE__, __LINE__,
                                             "sq=%d sk=%d window=(%d,%d) row %d key %d: "
                                             "FC_WINDOW_SEES=%d but fc_key_range [%lld, %lld)",
                                             sq, sk, left, right, i, j, !want, (long long)lo,
                                             (long long)hi);
                                return;
                            }
                        }
                    }

    /* the host form where the sums need 64 bits */
    const int64_t big = INT32_MAX;
    int64_t lo, hi;
    rw_host(1, big, 0, INT32_MAX, INT32_MAX, &lo, &hi); /* diag = big - 1 */
    FC_EXPECT_EQ(lo, 0);
    FC_EXPECT_EQ(hi, big);
    rw_host(big, 1, 0, INT32_MAX, INT32_MAX, &lo, &hi); /* diag = 1 - big */
    FC_EXPECT_EQ(lo, 0);
    FC_EXPECT_EQ(hi, 1);
    rw_host(big, 1, 0, -1, 0, &lo, &hi); /* causal: row 0 sees nothing */
    FC_EXPECT_EQ(lo, 0);
    FC_EXPECT_EQ(hi, 2 - big);
    rw_host(big, big, big - 1, 5, 0, &lo, &hi);
    FC_EXPECT_EQ(lo, big - 6);
    FC_EXPECT_EQ(hi, big);

    /* every SIMD path this CPU and build run */
    const flashc_simd saved = flashc_simd_active();
    for (int s = 0; s < FLASHC_SIMD_COUNT && !fc_test_failed(); s++) {
        if (!flashc_simd_supported((flashc_simd)s)) continue;
        FC_EXPECT_STATUS(flashc_set_simd((flashc_simd)s), FLASHC_OK);
        const fc_simd_ops *ops = fc_simd();
        const char *path = flashc_simd_name((flashc_simd)s);
        for (int q = 0; q < FC_COUNT(rw_simd_len) && !fc_test_failed(); q++)
            for (int k = 0; k < FC_COUNT(rw_simd_len) && !fc_test_failed(); k++)
                for (int l = 0; l < FC_COUNT(rw_simd_win) && !fc_test_failed(); l++)
                    for (int r = 0; r < FC_COUNT(rw_simd_win); r++) {
                        int sq = rw_simd_len[q], sk = rw_simd_len[k];
                        int left = rw_simd_win[l], right = rw_simd_win[r];
                        if (!rw_simd_block(ops, 1, sq, sk, left, right, path) ||
                            !rw_simd_block(ops, 0, sq, sk, left, right, path))
                            break;
                    }
    }
    FC_EXPECT_STATUS(flashc_set_simd(saved), FLASHC_OK);
}

/* x of q.k in log2 units by both factorings of c. */
static void rs_both(const fc_score_consts *c, int softcap, float qk, double *cpu, double *gpu) {
    if (softcap) {
        *cpu = (double)c->cap_log2 * tanh((double)qk * c->qk_tanh);
        double u = 1.0 - 2.0 / (exp2((double)qk * c->tanh_exp2) + 1.0);
        *gpu = u * c->unit_log2;
    } else {
        *cpu = (double)qk * c->qk_log2;
        *gpu = (double)qk * c->unit_log2;
    }
}

FC_TEST(rules_score) {
    const float scales[] = {0.125f, 0.08838834764831845f, 0.3f, 1.0f};
    const float caps[] = {0.0f, 1.0f, 30.0f, 50.0f};
    for (size_t si = 0; si < sizeof scales / sizeof scales[0]; si++)
        for (size_t ci = 0; ci < sizeof caps / sizeof caps[0]; ci++) {
            fc_attn a;
            memset(&a, 0, sizeof a);
            a.scale = scales[si];
            a.softcap = caps[ci];
            fc_score_consts c = fc_score_consts_of(&a);
            const int softcap = caps[ci] > 0.0f;
            FC_EXPECT_TRUE(c.log2e == (float)(1.0 / log(2.0)));
            FC_EXPECT_TRUE(c.ln2 == log(2.0));
            /* the slope in units of u times unit_log2 is the slope times log2e */
            FC_EXPECT_NEAR((double)c.unit_inv * c.unit_log2, c.log2e, 1e-6);
            FC_EXPECT_TRUE(softcap ? c.unit == a.softcap : c.unit == a.scale);
            for (float qk = -40.0f; qk <= 40.0f; qk += 0.75f) {
                double cpu, gpu;
                rs_both(&c, softcap, qk, &cpu, &gpu);
                FC_EXPECT_NEAR(cpu, gpu, 1e-6 * (1.0 + fabs(cpu)));
            }
        }

    /* a zero scale: the CPU's x is 0, the GPU's units are finite */
    fc_attn a;
    memset(&a, 0, sizeof a);
    fc_score_consts c = fc_score_consts_of(&a);
    FC_EXPECT_TRUE(c.qk_log2 == 0.0f);
    FC_EXPECT_TRUE(c.unit == FLT_MIN);
    FC_EXPECT_TRUE(isfinite(c.unit_inv) && c.unit_inv > 0.0f);
    FC_EXPECT_TRUE(c.drop_scale == 1.0f && c.drop_threshold == 0);

    /* dropout */
    a.dropout_p = 0.25f;
    c = fc_score_consts_of(&a);
    FC_EXPECT_TRUE(c.drop_scale == (float)(1.0 / 0.75));
    FC_EXPECT_EQ(c.drop_threshold, fc_dropout_threshold(0.25f));
}
