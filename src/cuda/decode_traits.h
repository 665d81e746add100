// decode_traits.h : the tuning table of the CUDA decode kernel
// (sm80/decode_kernel.cuh), and the sizes derived from it. traits.h holds the
// forward's; the two kernels share nothing but the fragment layouts.
//
// Decode is memory-bound: a CTA streams the K and V tiles of one (sequence,
// kv head, key split) once, for 16 packed query rows (the query heads of the
// GQA group times the query length), so the table's knobs are about bytes in
// flight, not FLOPs. One row per head dim D:
//   Bc      keys per K/V tile; each of the Bc / 16 warps takes 16 of them
//           (its own online softmax, merged across warps at the end)
//   stages  depth of the cp.async ring of (K tile, V tile) pairs: stages - 1
//           tiles load while one is computed
// Little's law for the H100/H200: ~4.5 TB/s over 132 SMs at ~1 us of loaded
// latency wants ~35 KB in flight per SM. The rows below keep 60-110 KB of
// shared memory per CTA, so 2 CTAs fit an sm90 SM (228 KB) with 2-4 tiles of
// 16-34 KB in flight each; an sm80 SM (164 KB) holds one.
//
// A problem head dim that is not a row runs with the next larger row (the
// columns past it are zero-filled). Shared memory rows of a D that is a
// multiple of 64 are unpadded and swizzled: 16-byte chunk c of row r sits at
// chunk c ^ (r % 8) of its 128-byte block, so each 128-byte line of global
// memory lands in one 128-byte block of shared memory and ldmatrix stays
// conflict-free (bench/NOTES.md, issue 18 run 49: with rows padded by 16 bytes,
// as other D have them, the same loads reach L2 as 2.6x the requests).
#ifndef FLASHC_CUDA_DECODE_TRAITS_H
#define FLASHC_CUDA_DECODE_TRAITS_H

// ---- the table ----
//   X(D,  Bc, stages)
#define FC_SM80_DECODE_TILES(X) \
    X(32,  64, 6)               \
    X(64,  64, 4)               \
    X(96,  64, 3)               \
    X(128, 64, 3)               \
    X(160, 64, 2)               \
    X(192, 64, 2)               \
    X(224, 32, 3)               \
    X(256, 32, 3)

// Opt-in dynamic shared memory per block of the smallest supported SM (sm80).
#define FC_SM80_DECODE_SMEM_LIMIT 166912

template <int D>
struct fc_sm80_decode_tile;  // only the rows of the table exist

#define FC_SM80_DECODE_TILE_ROW_(D_, BC, STAGES) \
    template <>                                  \
    struct fc_sm80_decode_tile<D_> {             \
        static constexpr int kBc = BC;           \
        static constexpr int kStages = STAGES;   \
    };
FC_SM80_DECODE_TILES(FC_SM80_DECODE_TILE_ROW_)
#undef FC_SM80_DECODE_TILE_ROW_

// ---- derived sizes and their bounds ----
template <int D>
struct fc_sm80_decode_traits {
    static constexpr int kD = D;
    static constexpr int kBr = 16;  // packed query rows per CTA: one mma row tile
    static constexpr int kBc = fc_sm80_decode_tile<D>::kBc;
    static constexpr int kStages = fc_sm80_decode_tile<D>::kStages;
    static constexpr int kWarps = kBc / 16;
    static constexpr int kThreads = 32 * kWarps;
    static constexpr bool kQinRegs = D <= 128;  // else Q fragments are re-read by ldmatrix
    static constexpr int kDT = D / 8;           // 8-column tiles of O
    static constexpr int kKS = D / 16;          // k16 steps of S = Q K^T
    static constexpr int kChunks = D / 8;       // 16-byte chunks per row
    static constexpr bool kSwizzle = D % 64 == 0;   // else rows padded by 8 elements
    static constexpr int kPitch = kSwizzle ? D : D + 8;  // smem row pitch, elements
    static constexpr int kRowBytes = kPitch * 2;
    static constexpr int kQBytes = kBr * kRowBytes;
    static constexpr int kTileBytes = kBc * kRowBytes;    // one K or V tile
    static constexpr int kStageBytes = 2 * kTileBytes;    // K tile, then V tile
    static constexpr int kRingBytes = kStages * kStageBytes;
    static constexpr int kSmemBytes = kQBytes + kRingBytes;
    // global -> shared copies: kLoadTPR threads per row (a power of two >=
    // kChunks), kLoadRPP rows per pass of the CTA, kLoadPasses passes per tile
    static constexpr int kLoadTPR = kChunks <= 4 ? 4 : kChunks <= 8 ? 8 : kChunks <= 16 ? 16 : 32;
    static constexpr int kLoadRPP = kThreads / kLoadTPR;
    static constexpr int kLoadPasses = kBc / kLoadRPP;
    // after the loop the ring holds each warp's O [16][D + 4] fp32, then its
    // row max and row sum [16] each
    static constexpr int kOPitch = D + 4;
    static constexpr int kScratchBytes = kWarps * kBr * (kOPitch + 2) * 4;

    static_assert(D % 32 == 0 && D >= 32 && D <= 256, "head dim: a multiple of 32 up to 256");
    static_assert(kBc % 16 == 0 && kBc >= 32 && kBc <= 128, "Bc: 16 keys per warp, 2 to 8 warps");
    static_assert(kStages >= 2, "at least one tile in flight while one is computed");
    static_assert(kBc % kLoadRPP == 0, "tile loads must split evenly");
    static_assert(kLoadPasses <= kLoadTPR, "a row group's lanes look up the pages of its passes");
    static_assert(kSwizzle || (kPitch / 8) % 2 == 1, "a padded row pitch in 16-byte chunks must be odd");
    static_assert(kScratchBytes <= kRingBytes, "the warp merge reuses the K/V ring");
    static_assert(kSmemBytes <= FC_SM80_DECODE_SMEM_LIMIT, "shared memory must fit 163 KB (sm80)");
};

#endif  // FLASHC_CUDA_DECODE_TRAITS_H
