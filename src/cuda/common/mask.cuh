// mask.cuh : what a query row may see, and the score modifiers applied before
// the softmax: softcap, ALiBi, causal / sliding-window masks.
//
// Semantics (flashc.h, flash_attn 2.x): with sequence lengths (sq, sk), query
// row i sees key j iff j < sk and
//     j >= i + sk - sq - window_left    (window_left  >= 0, else no bound)
//     j <= i + sk - sq + window_right   (window_right >= 0, else no bound; causal: 0)
// i.e. bottom-right aligned. fc_mask's diag, lo and hi are src/common/window.h's
// FC_WINDOW_* on int, the rule's one statement (the host's fc_key_range is the
// same on int64_t); everything else here is written in terms of them.
//
// Masks work at two granularities (FA2): key tiles outside the union of the
// block's rows' ranges are never loaded (fc_mask::tiles), and the per-element
// test runs only on the tiles that some row of the block sees partially
// (fc_mask::tile_partial). The host (plan.cu: fc_cuda_len_check, and the
// window clamp of fc_cuda_fwd_make_params) guarantees every length and window
// here is below 2^30, so the int arithmetic cannot overflow.
#ifndef FLASHC_CUDA_MASK_CUH
#define FLASHC_CUDA_MASK_CUH

#include <math.h>

#include "../../common/window.h"
#include "ptx.cuh"

template <bool kCausal>
struct fc_mask {
    int sq, sk;
    int left;   // -1 = unbounded
    int right;  // -1 = unbounded; ignored (0) when kCausal

    __device__ __forceinline__ fc_mask(int sq_, int sk_, int left_, int right_)
        : sq(sq_), sk(sk_), left(left_), right(kCausal ? 0 : right_) {}

    __device__ __forceinline__ int diag(int i) const { return FC_WINDOW_DIAG(i, sq, sk); }
    // First visible key of row i (may be <= 0: no bound).
    __device__ __forceinline__ int lo(int i) const { return FC_WINDOW_LO(diag(i), left); }
    // One past the last visible key of row i (may be <= lo: none visible). With
    // kCausal, right is the constant 0 and the unbounded case folds away.
    __device__ __forceinline__ int hi(int i) const { return FC_WINDOW_HI(diag(i), right, sk); }

    // Key tiles [*n_lo, *n_hi) of width Bc that rows i0..i1 may see; false if none.
    template <int Bc>
    __device__ __forceinline__ bool tiles(int i0, int i1, int *n_lo, int *n_hi) const {
        const int l = lo(i0) > 0 ? lo(i0) : 0;
        const int h = hi(i1);
        if (h <= l) return false;
        *n_lo = l / Bc;
        *n_hi = (h + Bc - 1) / Bc;
        return true;
    }

    // True if some row of i0..i1 sees only part of keys j0..j0+Bc-1 (needs element masks).
    template <int Bc>
    __device__ __forceinline__ bool tile_partial(int i0, int i1, int j0) const {
        return j0 + Bc > sk || hi(i0) < j0 + Bc || lo(i1) > j0;
    }

    // Set the masked scores of row half hr of one 16-row tile's fragment to
    // -inf: element (nt, 2hr + e) is query row i, key col0 + 8nt + e.
    template <int NT>
    __device__ __forceinline__ void apply_row(float (&s)[NT][4], int hr, int i, int col0) const {
        const int l = lo(i) - col0, h = hi(i) - col0;  // in fragment columns
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int c = 8 * nt + e;
                if (c < l || c >= h) s[nt][2 * hr + e] = -INFINITY;
            }
    }

    // Set the masked scores of a fragment to -inf. Thread element (mt, nt, 2hr + e)
    // is query row row0 + 16mt + 8hr, key col0 + 8nt + e.
    template <int MT, int NT>
    __device__ __forceinline__ void apply(float (&s)[MT][NT][4], int row0, int col0) const {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) apply_row(s[mt], hr, row0 + 16 * mt + 8 * hr, col0);
    }

    // apply() for one 16-row tile whose two rows are query rows i0 (hr 0) and
    // i1 (hr 1), not necessarily 8 apart (sm90ws GQA packing).
    template <int NT>
    __device__ __forceinline__ void apply_rows(float (&s)[1][NT][4], int i0, int i1,
                                               int col0) const {
        apply_row(s[0], 0, i0, col0);
        apply_row(s[0], 1, i1, col0);
    }

    // ALiBi: x -= slope_x * |i + sk - sq - j| (slope_x = slope in units of x).
    template <int MT, int NT>
    __device__ __forceinline__ void alibi(float (&s)[MT][NT][4], int row0, int col0,
                                          float slope_x) const {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
                const float d = (float)(diag(row0 + 16 * mt + 8 * hr) - col0);
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int e = 0; e < 2; ++e)
                        s[mt][nt][2 * hr + e] =
                            fmaf(-slope_x, fabsf(d - (float)(8 * nt + e)), s[mt][nt][2 * hr + e]);
            }
    }
};

// Softcap: x = tanh(q.k * scale / softcap), computed as 1 - 2 / (2^(q.k * pre) + 1)
// with pre = 2 * log2(e) * scale / softcap from the host: absolute error ~1e-7
// (tanh.approx's 2^-11 would be visible next to an fp16 baseline).
__device__ __forceinline__ float fc_softcap1(float qk, float pre) {
    return 1.0f - 2.0f * fc_rcp(fc_exp2(qk * pre) + 1.0f);
}

template <int MT, int NT>
__device__ __forceinline__ void fc_softcap(float (&s)[MT][NT][4], float pre) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[mt][nt][e] = fc_softcap1(s[mt][nt][e], pre);
}

#endif  // FLASHC_CUDA_MASK_CUH
