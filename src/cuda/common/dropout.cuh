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

// Bit w set iff 16-bit word w of the group's Philox draw keeps its element.
__device__ __forceinline__ uint32_t fc_dropout_keep8(const fc_philox4 &r, uint32_t threshold) {
    uint32_t keep = 0;
#pragma unroll
    for (int w = 0; w < 8; ++w) keep |= (uint32_t)(fc_dropout_word(r, w) >= threshold) << w;
    return keep;
}

// The keep bits of query row i (within its sequence) for the 32 key columns
// of the 8-key groups group0 .. group0 + 3 that this thread's quad holds in the
// mma C layout: bit 8u + e of the result is set iff the element at column
// 8 * (group0 + u) + 2t + e is kept (t = lane % 4; bh = b * H + h). All 4
// threads of a quad must call it together (it shuffles within the quad).
__device__ __forceinline__ uint32_t fc_dropout_keep4(uint64_t seed, uint64_t offset,
                                                     uint32_t threshold, uint32_t bh, uint32_t i,
                                                     uint64_t group0, int t) {
    uint32_t keep = fc_dropout_keep8(fc_dropout_group(seed, offset, bh, i, group0 + t), threshold);
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

// The keep bits of two 8-query tiles in the transposed C layout of the sm90
// backward (keys on the rows): thread (g, t) holds keys key0 + g + 8hr (hr = 0,
// 1; key0 % 16 == 0) of query columns i0 + 8u + 2t + e1 (u = 0, 1: the two
// tiles; e1 = 0, 1), i0 the query row (within its sequence) of the first
// tile's column 0. Bit 4u + 2hr + e1 of the result is set iff that element is
// kept. A Philox call serves a (query, 8-key group), which here is one element
// of each of the 8 lanes of a column t: lane (g', t) draws the group of query
// i0 + 8 (g' >> 2) + 2t + (g' & 1) and keys key0 + 8 ((g' >> 1) & 1) .. + 7,
// and each thread gathers bit g of the 8 groups of its column (8 shuffles).
// The whole warp must call it together.
__device__ __forceinline__ uint32_t fc_dropout_keep_t2(uint64_t seed, uint64_t offset,
                                                       uint32_t threshold, uint32_t bh, int i0,
                                                       int key0, int g, int t) {
    const uint32_t i = (uint32_t)(i0 + 8 * (g >> 2) + 2 * t + (g & 1));
    // bit w: key 8 ((g >> 1) & 1) + w of the group is kept
    const uint32_t mine = fc_dropout_keep8(
        fc_dropout_group(seed, offset, bh, i, (uint64_t)(key0 >> 3) + (uint64_t)((g >> 1) & 1)),
        threshold);
    uint32_t keep = 0;
#pragma unroll
    for (int s = 0; s < 8; ++s)
        keep |= ((__shfl_sync(0xffffffffu, mine, (s << 2) | t) >> g) & 1u) << s;
    return keep;
}

#endif  // FLASHC_CUDA_DROPOUT_CUH
