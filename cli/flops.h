/* flops.h : flash-attention's FLOP count of one attention call
 * (benchmarks/benchmark_flash_attention.py), the one C definition: `flashc
 * bench` (cli/bench.c) and bench/blas_baseline.c report TFLOP/s by it, and
 * bench/compare.py's flops() states the same formula in Python.
 *
 *   forward   4 * B * H * pairs * D   the two GEMMs Q K^T and P V at 2 FLOPs per
 *                                     multiply-add; softmax work is not counted
 *   backward  2.5x the forward (five GEMMs); forward + backward 3.5x
 *
 * pairs are the (query, key) pairs of one (batch, head) that the mask lets
 * through. Without a window: Sq * Sk, halved when causal (flash-attention's
 * convention, which ignores the diagonal). With a window (left, right; -1 =
 * unbounded on that side; causal means right = 0) each row's visible range is
 * counted exactly by the library's rule (src/common/window.h), bottom-right
 * aligned: row i sees keys [i + Sk - Sq - left, i + Sk - Sq + right] within
 * [0, Sk).
 *
 * Header-only, on window.h's macros alone (no flashc.h), so that
 * bench/blas_baseline.c (built by bench/cpu.sh without CMake or the library)
 * includes it as it is.
 */
#ifndef FLASHC_CLI_FLOPS_H
#define FLASHC_CLI_FLOPS_H

#include <stdint.h>

#include "../src/common/window.h"

/* What one timed call does. */
typedef enum { FC_MODE_FWD, FC_MODE_BWD, FC_MODE_FWDBWD } fc_mode;

/* Visible (query, key) pairs of one (batch, head); window = 0 ignores left and right. */
static inline double fc_visible_pairs(int64_t seqlen_q, int64_t seqlen_k, int causal, int window,
                                      int64_t left, int64_t right) {
    double sq = (double)seqlen_q, sk = (double)seqlen_k;
    if (!window) return causal ? sq * sk / 2 : sq * sk;
    if (causal) right = 0;
    double pairs = 0;
    for (int64_t i = 0; i < seqlen_q; i++) {
        int64_t diag = FC_WINDOW_DIAG(i, seqlen_q, seqlen_k);
        int64_t lo = FC_WINDOW_LO(diag, left), hi = FC_WINDOW_HI(diag, right, seqlen_k);
        if (lo < 0) lo = 0;
        if (hi > lo) pairs += (double)(hi - lo);
    }
    return pairs;
}

/* FLOPs of one call of `mode` over `pairs` visible pairs per (batch, head). */
static inline double fc_flops(int64_t batch, int64_t heads, double pairs, int64_t head_dim,
                              fc_mode mode) {
    double fwd = 4.0 * (double)batch * (double)heads * pairs * (double)head_dim;
    return mode == FC_MODE_FWD ? fwd : mode == FC_MODE_BWD ? 2.5 * fwd : 3.5 * fwd;
}

#endif /* FLASHC_CLI_FLOPS_H */
