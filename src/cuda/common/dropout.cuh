// dropout.cuh : the dropout mask on the probability fragments, bit for bit the
// mask of every other backend (flashc.h "Dropout", src/common/philox.h).
//
// Element (b, h, i, j) is dropped iff 16-bit word j % 8 of
// Philox4x32-10(counter = (offset + j/8, i, b*H + h), key = seed) is below the
// threshold. One Philox call thus serves a (row, 8-key group), which in the
// mma C layout is one 8-column tile of one row, spread over the 4 threads of a
// quad (2 columns each). Instead of each thread drawing the whole group (4x the
// Philox work), thread t of the quad draws group 4q + t, turns its 8 words into
// 8 keep bits, and the quad ORs the four bytes together (2 shfl.xor): every
// thread then reads its own 2 bits of each of the 4 groups with a shift.
#ifndef FLASHC_CUDA_DROPOUT_CUH
#define FLASHC_CUDA_DROPOUT_CUH

#include "../../common/philox.h"

// The keep bits of query row i (within its sequence) for the 32 key columns
// of the 8-key groups group0 .. group0 + 3 that this thread's quad holds in the
// mma C layout: bit 8u + e of the result is set iff the element at column
// 8 * (group0 + u) + 2t + e is kept (t = lane % 4; bh = b * H + h). All 4
// threads of a quad must call it together (it shuffles within the quad).
__device__ __forceinline__ uint32_t fc_dropout_keep4(uint64_t seed, uint64_t offset,
                                                     uint32_t threshold, uint32_t bh, uint32_t i,
                                                     uint64_t group0, int t) {
    const fc_philox4 r = fc_dropout_group(seed, offset, bh, i, group0 + t);
    uint32_t keep = 0;
#pragma unroll
    for (int w = 0; w < 8; ++w) keep |= (uint32_t)(fc_dropout_word(r, w) >= threshold) << w;
    keep <<= 8 * t;  // byte t = group group0 + t
    keep |= __shfl_xor_sync(0xffffffffu, keep, 1);
    keep |= __shfl_xor_sync(0xffffffffu, keep, 2);
    return keep >> (2 * t);
}

// Zero the dropped probabilities of p. Thread element (mt, nt, 2hr + e) is query
// row row0 + 16mt + 8hr (within its sequence) and key column 8 * (group0 + nt) +
// 2t + e, t = lane % 4; bh = b * H + h. The kept ones are left unscaled (the
// 1 / (1 - p) is folded into the final normalisation).
template <int MT, int NT>
__device__ __forceinline__ void fc_dropout_apply(float (&p)[MT][NT][4], uint64_t seed,
                                                 uint64_t offset, uint32_t threshold, uint32_t bh,
                                                 int row0, uint64_t group0, int t) {
    static_assert(NT % 4 == 0, "groups are drawn 4 per quad");
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const uint32_t i = (uint32_t)(row0 + 16 * mt + 8 * hr);
#pragma unroll
            for (int q = 0; q < NT / 4; ++q) {
                const uint32_t keep =
                    fc_dropout_keep4(seed, offset, threshold, bh, i, group0 + 4 * q, t);
#pragma unroll
                for (int u = 0; u < 4; ++u)
#pragma unroll
                    for (int e = 0; e < 2; ++e)
                        if (!((keep >> (8 * u + e)) & 1u)) p[mt][4 * q + u][2 * hr + e] = 0.0f;
            }
        }
}

#endif  // FLASHC_CUDA_DROPOUT_CUH
