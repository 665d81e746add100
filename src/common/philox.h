/* philox.h : the dropout random numbers every backend draws (Philox4x32-10,
 * Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11).
 *
 * Plain C that also compiles as CUDA device code, so the CPU backend, the
 * reference and the CUDA kernels cannot disagree. The mapping from an attention
 * element to a counter is specified in flashc.h ("Dropout").
 */
#ifndef FLASHC_PHILOX_H
#define FLASHC_PHILOX_H

#include <stdint.h>

#if defined(__CUDACC__)
#define FC_HD __host__ __device__ __forceinline__
#else
#define FC_HD static inline
#endif

/* The Philox4x32 multipliers and Weyl key increments (Salmon et al., Table 2);
 * the vector paths in src/cpu/simd_*.c use them too. */
#define FC_PHILOX_M0 0xD2511F53u
#define FC_PHILOX_M1 0xCD9E8D57u
#define FC_PHILOX_W0 0x9E3779B9u
#define FC_PHILOX_W1 0xBB67AE85u

typedef struct fc_philox4 {
    uint32_t x[4];
} fc_philox4;

FC_HD uint32_t fc_mulhilo32(uint32_t a, uint32_t b, uint32_t *hi) {
    uint64_t p = (uint64_t)a * (uint64_t)b;
    *hi = (uint32_t)(p >> 32);
    return (uint32_t)p;
}

/* Philox4x32-10 of counter c under key k. */
FC_HD fc_philox4 fc_philox(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                           uint32_t k1) {
    for (int r = 0; r < 10; r++) {
        uint32_t hi0, hi1;
        uint32_t lo0 = fc_mulhilo32(FC_PHILOX_M0, c0, &hi0);
        uint32_t lo1 = fc_mulhilo32(FC_PHILOX_M1, c2, &hi1);
        uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
        k0 += FC_PHILOX_W0;
        k1 += FC_PHILOX_W1;
    }
    fc_philox4 out = {{c0, c1, c2, c3}};
    return out;
}

/* The 8 dropout words of key columns 8*g .. 8*g+7 of row (i, bh = b*H + h).
 * Column j of the group is word j % 8: (x[w/2] >> (16*(w%2))) & 0xffff. */
FC_HD fc_philox4 fc_dropout_group(uint64_t seed, uint64_t offset, uint32_t bh, uint32_t i,
                                  uint64_t g) {
    uint64_t c = offset + g;
    return fc_philox((uint32_t)c, (uint32_t)(c >> 32), i, bh, (uint32_t)seed,
                     (uint32_t)(seed >> 32));
}

FC_HD uint32_t fc_dropout_word(fc_philox4 r, int w) {
    return (r.x[w >> 1] >> (16 * (w & 1))) & 0xffffu;
}

/* 1 if element (bh, i, j) is kept, for threshold = fc_dropout_threshold(p). */
FC_HD int fc_dropout_keep(uint64_t seed, uint64_t offset, uint32_t bh, uint32_t i, uint64_t j,
                          uint32_t threshold) {
    fc_philox4 r = fc_dropout_group(seed, offset, bh, i, j >> 3);
    return fc_dropout_word(r, (int)(j & 7)) >= threshold;
}

#endif /* FLASHC_PHILOX_H */
