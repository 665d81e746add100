// traits.h : the tuning tables of the CUDA kernels (the one place their tile
// sizes are chosen), and the sizes derived from them. Each table has its own
// section: the forward and the backward of the sm80 family (which also runs
// on sm90), of the sm90 family (wgmma, sm_90a only), and of the sm90ws family
// (warp-specialised, TMA).
// tools/gen_instances.py and tools/gen_wgmma.py read their rows.
//
// The sm80 forward, first: one row per head dim D (sm80/fwd_kernel.cuh): the
// query tile Br, the key tile Bc, the warps of a CTA, the K/V pipeline depth,
// and whether the Q tile stays in registers for the whole KV loop (else it is
// re-read from shared memory by ldmatrix at every K tile, as FA2 does when
// registers are short). A problem head dim that is not a row runs with the
// next larger row, zero-padded.
//
// Stages: the K ring and the V ring each hold kStages tiles. With 1 the kernel
// runs FA2's interleave (V(n) loads under S(n) = Q K(n)^T, K(n+1) under
// softmax and O += P V(n)); every extra stage adds one tile pair of prefetch
// distance.
//
// Registers (per thread): O accumulator MT*D/8*4 + S accumulator MT*Bc/8*4
// (+ MT*D/16*4 for Q in registers) fp32/b32, MT = Br / (16 * warps) row tiles
// of 16 per warp. The rows start from FA2's tiles (flash_fwd_launch_template.h:
// D64 128x128 and D128 128x64 with 4 warps, D192 128x64 with 8; D256 64x64 with
// 4, FA2's H100 choice: 101 KB, so 2 CTAs per SM on sm90 against 1 for 128x64
// with 8 warps, and D224 likewise: 89 KB); D160 takes 8 warps here because
// FA2's 128x32 with 4 spills.
// They are the knobs to tune on the device (measurements: bench/NOTES.md);
// after changing a row, check `-Xptxas -v` for spills (D64 128x128 spills 4
// bytes on sm90a, outside the measured cost: it still beats 128x64 by 5-8%).
// Every row must fit both arches: D128 (104 KB) runs 2 CTAs per SM on sm90 but
// 1 on sm80.
//
// Shared memory layout: rows of D elements padded by 8 (16 bytes), so the 8 row
// addresses of an ldmatrix 8x8 matrix fall in 8 different 16-byte bank groups
// (row pitch D/8 + 1 chunks, odd because D % 16 == 0): conflict-free without a
// swizzle, for every D of the table.
#ifndef FLASHC_CUDA_TRAITS_H
#define FLASHC_CUDA_TRAITS_H

#include "bwd_params.h"  // kFcBwdPadRows

// ---- the table ----
//   X(D,  Br,  Bc, warps, stages, q_in_regs)
#define FC_SM80_FWD_TILES(X)      \
    X(32,  128, 128, 4, 2, 1)     \
    X(64,  128, 128, 4, 2, 0)     \
    X(96,  128, 64,  4, 2, 0)     \
    X(128, 128, 64,  4, 2, 0)     \
    X(160, 128, 64,  8, 2, 0)     \
    X(192, 128, 64,  8, 2, 0)     \
    X(224, 64,  64,  4, 1, 0)     \
    X(256, 64,  64,  4, 1, 0)

// Opt-in dynamic shared memory per block: A100 (sm80) 163 KB, H100/H200 (sm90) 227 KB.
#define FC_SM80_SMEM_LIMIT 166912
#define FC_SM90_SMEM_LIMIT 232448

template <int D>
struct fc_sm80_fwd_tile;  // only the rows of the table exist

#define FC_SM80_FWD_TILE_ROW_(D_, BR, BC, WARPS, STAGES, QREGS) \
    template <>                                                 \
    struct fc_sm80_fwd_tile<D_> {                               \
        static constexpr int kBr = BR;                          \
        static constexpr int kBc = BC;                          \
        static constexpr int kWarps = WARPS;                    \
        static constexpr int kStages = STAGES;                  \
        static constexpr bool kQinRegs = QREGS != 0;            \
    };
FC_SM80_FWD_TILES(FC_SM80_FWD_TILE_ROW_)
#undef FC_SM80_FWD_TILE_ROW_

// ---- derived sizes and their bounds ----
template <int D>
struct fc_sm80_fwd_traits : fc_sm80_fwd_tile<D> {
    using tile = fc_sm80_fwd_tile<D>;
    static constexpr int kD = D;
    static constexpr int kBr = tile::kBr, kBc = tile::kBc, kWarps = tile::kWarps;
    static constexpr int kStages = tile::kStages;
    static constexpr bool kQinRegs = tile::kQinRegs;
    static constexpr int kThreads = 32 * kWarps;
    static constexpr int kMT = kBr / (16 * kWarps);  // 16-row mma tiles per warp
    static constexpr int kNT = kBc / 8;              // 8-column tiles of S per row tile
    static constexpr int kDT = D / 8;                // 8-column tiles of O per row tile
    static constexpr int kKS = D / 16;               // k16 steps of S = Q K^T
    static constexpr int kChunks = D / 8;            // 16-byte chunks per row
    static constexpr int kPitch = D + 8;             // smem row pitch, elements
    static constexpr int kRowBytes = kPitch * 2;
    static constexpr int kQBytes = kBr * kRowBytes;
    static constexpr int kKVTileBytes = kBc * kRowBytes;
    static constexpr int kSmemBytes = kQBytes + 2 * kStages * kKVTileBytes;
    static constexpr int kAccRegs = kMT * kDT * 4 + kMT * kNT * 4 + (kQinRegs ? kMT * kKS * 4 : 0);

    static_assert(D % 32 == 0 && D >= 32 && D <= 256, "head dim: a multiple of 32 up to 256");
    static_assert(kBr % (16 * kWarps) == 0, "Br must be a multiple of 16 * warps");
    static_assert(kBc % 32 == 0, "Bc must be a multiple of 32 (ldmatrix pairs, dropout groups of 4)");
    static_assert(kStages >= 1, "at least one K/V stage");
    static_assert((kPitch / 8) % 2 == 1, "the row pitch in 16-byte chunks must be odd");
    static_assert(kSmemBytes <= FC_SM80_SMEM_LIMIT, "shared memory must fit 163 KB (sm80)");
    static_assert(kSmemBytes <= FC_SM90_SMEM_LIMIT, "shared memory must fit 227 KB (sm90)");
    static_assert(kAccRegs <= 200, "accumulators leave too few of the 255 registers");
};

// ---- the sm80 backward (sm80/bwd_kernel.cuh; also runs on sm90) ----
// One row per head dim D: the query tile Br walked per iteration, the key
// tile Bc a CTA owns (its dK, dV stay in registers), the warps, and the
// stages of the Q / dO ring (2: the next tile pair loads under this one's
// five GEMMs; 1: it loads under the dQ GEMM and its atomics only).
// Warp layouts, derived below: S = Q K^T and dP = dO V^T (Br x Bc) split
// Br / 16 warps along the queries and the rest along the keys; dV, dK (Bc x D)
// min(W, Bc / 16) warps along the keys and the rest along D; dQ (Br x D)
// Br / 16 along the queries and the rest along D. Registers per thread: dK +
// dV 2 Bc D / (32 W), S + dP 2 Br Bc / (32 W), dQ in chunks of 8 column tiles.
// Shared memory: K, V Bc (D + 8) 2 bytes each, Q, dO stages Br (D + 8) 2 each,
// P and dS Br (Bc + 8) 2 each, lse2 and delta stages Br 4 each; it must fit
// sm80's 163 KB. Measured (bench/NOTES.md): at D128, 64 x 128 with one stage
// beat 64 x 64 with two by 40% (half the dQ atomics per FLOP); D160 and up
// keep Bc = 64 for their registers.
// A tuning build may replace the table (bench/tune.sh, as for FC_SM90_FWD_TILES).
#ifndef FC_SM80_BWD_TILES
//   X(D,  Br, Bc,  warps, q_stages)
#define FC_SM80_BWD_TILES(X)  \
    X(32,  64, 128, 8, 2)     \
    X(64,  64, 128, 8, 2)     \
    X(96,  64, 128, 8, 1)     \
    X(128, 64, 128, 8, 1)     \
    X(160, 64, 64,  8, 2)     \
    X(192, 64, 64,  8, 1)     \
    X(224, 64, 64,  8, 1)     \
    X(256, 64, 64,  8, 1)
#endif

template <int D>
struct fc_sm80_bwd_tile;  // only the rows of the table exist

#define FC_SM80_BWD_TILE_ROW_(D_, BR, BC, WARPS, QS) \
    template <>                                     \
    struct fc_sm80_bwd_tile<D_> {                   \
        static constexpr int kBr = BR;              \
        static constexpr int kBc = BC;              \
        static constexpr int kWarps = WARPS;        \
        static constexpr int kQStages = QS;         \
    };
FC_SM80_BWD_TILES(FC_SM80_BWD_TILE_ROW_)
#undef FC_SM80_BWD_TILE_ROW_

template <int D>
struct fc_sm80_bwd_traits : fc_sm80_bwd_tile<D> {
    using tile = fc_sm80_bwd_tile<D>;
    static constexpr int kD = D;
    static constexpr int kBr = tile::kBr, kBc = tile::kBc, kWarps = tile::kWarps;
    static constexpr int kQStages = tile::kQStages;
    static constexpr int kThreads = 32 * kWarps;
    // S / dP: warps (row, col) = (warp % kSR, warp / kSR)
    static constexpr int kSR = kBr / 16, kSC = kWarps / kSR;
    static constexpr int kSNT = kBc / (8 * kSC);          // 8-key tiles per warp
    // dK / dV: warps (key, d) = (warp % kKR, warp / kKR)
    static constexpr int kKR = kWarps < kBc / 16 ? kWarps : kBc / 16, kKC = kWarps / kKR;
    static constexpr int kKT = kBc / (16 * kKR);          // 16-key tiles per warp
    static constexpr int kKDT = D / (8 * kKC);            // 8-column tiles per warp
    // dQ: warps (query, d) = (warp % kSR, warp / kSR)
    static constexpr int kQDT = D / (8 * kSC);
    static constexpr int kChunks = D / 8;
    static constexpr int kPitchD = D + 8, kPitchC = kBc + 8;  // smem row pitches, elements
    static constexpr int kKVBytes = kBc * kPitchD * 2;
    static constexpr int kQBytes = kBr * kPitchD * 2;
    static constexpr int kPBytes = kBr * kPitchC * 2;
    static constexpr int kSmemBytes =
        2 * kKVBytes + 2 * kQStages * kQBytes + 2 * kPBytes + 2 * kQStages * kBr * 4;
    static constexpr int kAccRegs = 2 * kKT * kKDT * 4 + 2 * kSNT * 4;

    static_assert(D % 32 == 0 && D >= 32 && D <= 256, "head dim: a multiple of 32 up to 256");
    static_assert(kBr % 16 == 0 && kBr <= 128 && kWarps % kSR == 0, "Br: 16 rows per warp row");
    static_assert(kBr <= kFcBwdPadRows, "Br must not exceed the scratch pad rows");
    static_assert(kSNT % 4 == 0, "each warp's S columns: whole dropout groups of 32 keys");
    static_assert(kBc % (16 * kKR) == 0 && kKDT % 2 == 0 && kQDT % 2 == 0,
                  "dK, dV, dQ columns: pairs of 8-column tiles per warp");
    static_assert(kQStages == 1 || kQStages == 2, "one or two Q / dO stages");
    static_assert(((kPitchD / 8) % 2 == 1) && ((kPitchC / 8) % 2 == 1),
                  "row pitches in 16-byte chunks must be odd");
    static_assert(kSmemBytes <= FC_SM80_SMEM_LIMIT, "shared memory must fit 163 KB (sm80)");
    static_assert(kAccRegs <= 192, "accumulators leave too few of the 255 registers");
};

// ---- the sm90 family (sm90/fwd_kernel.cuh: wgmma, sm_90a only) ----
// One row per head dim D: the warpgroups of a CTA (each owns 64 query rows, so
// Br = 64 * warpgroups), the key tile Bc, the K/V ring depth (>= 2: the tiles
// of iteration n + 1 load while iteration n computes), and the CTAs per SM the
// registers are budgeted for (__launch_bounds__ minBlocks: 2 caps a 256-thread
// CTA at 128 registers a thread). Every operand tile is stored in wgmma's
// 128-byte-swizzled K-major layout, in column blocks of 64 elements, so D must
// be a multiple of 64; other head dims run zero-padded on the next row
// (fwd.cu), and D <= 32 stays on the sm80 family.
// Registers per thread: O D/2 + S Bc/2 + P Bc/4 fp32/b32 (wgmma m64nN
// accumulators hold N/2 per thread). Shared memory: Q Br*D*2 + K, V 2 * stages
// * Bc*D*2 bytes, + 1 KB to align the base to 1024 bytes (the swizzle atom).
// A tuning build may replace the table: -D'FC_SM90_FWD_TILES(X)=X(64, 2, ...) ...'
// (bench/tune.sh; tools/gen_wgmma.py must then know the Bc values used).
#ifndef FC_SM90_FWD_TILES
//   X(D,  warpgroups, Bc, stages, ctas per SM)
#define FC_SM90_FWD_TILES(X) \
    X(64,  2, 64,  3, 2)     \
    X(128, 2, 128, 3, 1)     \
    X(192, 2, 96,  2, 1)     \
    X(256, 2, 64,  2, 1)
#endif

template <int D>
struct fc_sm90_fwd_tile;  // only the rows of the table exist

#define FC_SM90_FWD_TILE_ROW_(D_, WG, BC, STAGES, CTAS) \
    template <>                                         \
    struct fc_sm90_fwd_tile<D_> {                       \
        static constexpr int kWarpgroups = WG;          \
        static constexpr int kBc = BC;                  \
        static constexpr int kStages = STAGES;          \
        static constexpr int kCtasPerSm = CTAS;         \
    };
FC_SM90_FWD_TILES(FC_SM90_FWD_TILE_ROW_)
#undef FC_SM90_FWD_TILE_ROW_

template <int D>
struct fc_sm90_fwd_traits : fc_sm90_fwd_tile<D> {
    using tile = fc_sm90_fwd_tile<D>;
    static constexpr int kD = D;
    static constexpr int kWarpgroups = tile::kWarpgroups, kBc = tile::kBc;
    static constexpr int kStages = tile::kStages, kCtasPerSm = tile::kCtasPerSm;
    static constexpr int kBr = 64 * kWarpgroups;
    static constexpr int kThreads = 128 * kWarpgroups;
    static constexpr int kChunks = D / 8;             // 16-byte chunks per row
    static constexpr int kQBytes = kBr * D * 2;
    static constexpr int kKVTileBytes = kBc * D * 2;
    static constexpr int kSmemBytes = 1024 + kQBytes + 2 * kStages * kKVTileBytes;
    static constexpr int kAccRegs = D / 2 + kBc / 2 + kBc / 4;

    static_assert(D % 64 == 0 && D >= 64 && D <= 256, "head dim: a multiple of 64 up to 256");
    static_assert(kBc % 32 == 0 && kBc <= 256, "Bc: a multiple of 32 (dropout groups) up to 256");
    static_assert(kStages >= 2, "the K/V ring needs two stages");
    static_assert(kSmemBytes <= FC_SM90_SMEM_LIMIT, "shared memory must fit 227 KB (sm90)");
    static_assert(kCtasPerSm >= 1 && kCtasPerSm * kSmemBytes <= FC_SM90_SMEM_LIMIT,
                  "the CTAs per SM must fit the SM's shared memory");
    static_assert(kAccRegs <= 200, "accumulators leave too few of the 255 registers");
};

// ---- the sm90ws family (sm90ws/fwd_kernel.cuh: TMA, warp specialisation, sm_90a only) ----
// One row per head dim D: the consumer warpgroups (each owns 64 query rows, so
// Br = 64 * consumers), the key tile Bc and the K/V ring depth. A CTA is one
// producer warpgroup (its one thread issues every TMA load) and the consumers,
// one CTA per SM; setmaxnreg moves the producer's registers to the consumers:
// 24 / 240 a thread with two consumers, 24 / 160 with three. Layouts as the
// sm90 family (128-byte swizzle, 64-column blocks), so D is a multiple of 64
// and other head dims run zero-padded on the next row. Ping-pong (1): the
// consumers take turns issuing their GEMMs (named barriers), so one
// warpgroup's softmax runs under another's GEMMs (FA3, Shah et al. 2024, §3.2).
// Persistent (1): one CTA per SM walks a schedule of query tiles, with Q in
// two buffers so that the next tile's Q and K, V load under this one's
// compute and epilogue; it needs the second Q buffer to fit.
// Registers per consumer thread: O D/2 + S Bc/2 + P Bc/4. Shared memory: Q
// Br*D*2 (twice when persistent) + K, V 2 * stages * Bc*D*2, the barriers,
// + 1 KB of alignment.
#ifndef FC_SM90WS_FWD_TILES
//   X(D,  consumers, Bc, stages, ping-pong, persistent)
#define FC_SM90WS_FWD_TILES(X) \
    X(64,  3, 128, 3, 1, 0)   \
    X(128, 2, 128, 2, 1, 1)   \
    X(192, 2, 96,  2, 0, 0)   \
    X(256, 2, 64,  2, 0, 0)
#endif

// Short-work rows, same columns: a second instance of a head dim of the table
// above, for calls whose query tiles each see few key tiles or that pack GQA
// groups (fwd.cu fc_sm90ws_short says which). At D64 three one-tile consumers
// win on long sequences (they spill, but keep the tensor cores busier) and two
// persistent ones on short work: the next tile's loads hide under this one's
// epilogue, 128-row tiles waste less of a 1k sequence than 192-row ones, and
// a persistent instance can pack (bench/NOTES.md, issue 18 run 46).
#ifndef FC_SM90WS_FWD_SHORT_TILES
//   X(D,  consumers, Bc, stages, ping-pong, persistent)
#define FC_SM90WS_FWD_SHORT_TILES(X) \
    X(64,  2, 128, 3, 1, 1)
#endif

// fc_sm90ws_fwd_tile<D> is the row of D, fc_sm90ws_fwd_tile<D, true> its
// short-work row; fc_sm90ws_fwd_has_short<D> says whether there is one.
template <int D, bool kShort = false>
struct fc_sm90ws_fwd_tile;  // only the rows of the tables exist
template <int D>
struct fc_sm90ws_fwd_has_short {
    static constexpr bool value = false;
};

#define FC_SM90WS_FWD_TILE_ROW_(D_, SHORT, WG, BC, STAGES, PP, PERSIST) \
    template <>                                                         \
    struct fc_sm90ws_fwd_tile<D_, SHORT> {                              \
        static constexpr int kConsumers = WG;                           \
        static constexpr int kBc = BC;                                  \
        static constexpr int kStages = STAGES;                          \
        static constexpr bool kPingPong = PP;                           \
        static constexpr bool kPersistent = PERSIST;                    \
    };
#define FC_SM90WS_FWD_LONG_ROW_(D_, WG, BC, STAGES, PP, PERSIST) \
    FC_SM90WS_FWD_TILE_ROW_(D_, false, WG, BC, STAGES, PP, PERSIST)
#define FC_SM90WS_FWD_SHORT_ROW_(D_, WG, BC, STAGES, PP, PERSIST)  \
    FC_SM90WS_FWD_TILE_ROW_(D_, true, WG, BC, STAGES, PP, PERSIST) \
    template <>                                                    \
    struct fc_sm90ws_fwd_has_short<D_> {                           \
        static constexpr bool value = true;                        \
    };
FC_SM90WS_FWD_TILES(FC_SM90WS_FWD_LONG_ROW_)
FC_SM90WS_FWD_SHORT_TILES(FC_SM90WS_FWD_SHORT_ROW_)
#undef FC_SM90WS_FWD_SHORT_ROW_
#undef FC_SM90WS_FWD_LONG_ROW_
#undef FC_SM90WS_FWD_TILE_ROW_

template <int D, bool kShort = false>
struct fc_sm90ws_fwd_traits : fc_sm90ws_fwd_tile<D, kShort> {
    using tile = fc_sm90ws_fwd_tile<D, kShort>;
    static constexpr int kD = D;
    static constexpr int kConsumers = tile::kConsumers, kBc = tile::kBc, kStages = tile::kStages;
    static constexpr bool kPingPong = tile::kPingPong, kPersistent = tile::kPersistent;
    static constexpr int kBr = 64 * kConsumers;
    static constexpr int kQBufs = kPersistent ? 2 : 1;  // the next tile's Q loads under this one
    static constexpr int kThreads = 128 * (kConsumers + 1);  // + the producer warpgroup
    static constexpr int kProducerRegs = 24, kConsumerRegs = kConsumers == 2 ? 240 : 160;
    static constexpr int kChunks = D / 8;  // 16-byte chunks per row
    static constexpr int kQBytes = kBr * D * 2;
    static constexpr int kKVTileBytes = kBc * D * 2;
    // full Q per buffer (and empty Q when persistent); full, empty K, V per slot
    static constexpr int kBarBytes = 8 * ((kPersistent ? 2 : 1) * kQBufs + 4 * kStages);
    static constexpr int kSmemBytes =
        1024 + kQBufs * kQBytes + 2 * kStages * kKVTileBytes + kBarBytes;
    static constexpr int kAccRegs = D / 2 + kBc / 2 + kBc / 4;

    static_assert(D % 64 == 0 && D >= 64 && D <= 256, "head dim: a multiple of 64 up to 256");
    static_assert(kConsumers == 2 || kConsumers == 3, "two or three consumer warpgroups");
    static_assert(kBr <= 256 && kBc % 32 == 0 && kBc <= 256,
                  "TMA boxes: at most 256 rows; Bc a multiple of 32 (dropout groups)");
    static_assert(kStages >= 2, "the K/V ring needs two stages");
    static_assert(kSmemBytes <= FC_SM90_SMEM_LIMIT, "shared memory must fit 227 KB (sm90)");
    static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumers <= 65536,
                  "the register budgets must fit the register file");
    static_assert(kAccRegs + 32 <= kConsumerRegs, "accumulators leave too few registers");
};

// ---- the sm90 backward (sm90/bwd_kernel.cuh: wgmma, sm_90a only) ----
// One row per head dim D: the query tile Br walked per iteration, the key tile
// Bc a CTA of two warpgroups owns, the depth of the Q / dO ring. S^T = K Q^T
// and dP^T = V dO^T put the keys on wgmma's M side; the key tile picks how the
// warpgroups share the work:
//   Bc = 128  each warpgroup owns 64 keys: it computes S^T, dP^T of its keys
//             for all Br queries and feeds P^T, dS^T to dV += P^T dO and
//             dK += dS^T Q from registers (N = D). Registers: dK + dV D, S^T
//             + dP^T Br.
//   Bc = 64   (large D, where dK, dV of 128 keys do not fit the registers) the
//             warpgroups split S^T, dP^T by queries (N = Br / 2) and dK, dV by
//             columns (N = D / 2); P^T and dS^T meet in shared memory, the
//             operands of dV and dK. Registers: dK + dV D / 2, S^T + dP^T Br / 2.
// dQ = dS K (Br x D) is split over the two warpgroups by query rows when
// Br = 128, by D columns when Br = 64 (each part a multiple of 64 columns).
// Shared memory: K, V Bc D 2 each, Q, dO stages Br D 2 each, dS^T (and P^T
// when Bc = 64) Bc Br 2, the fp32 dQ tile Br D 4 (the source of one bulk
// reduction), lse2 and delta stages Br 4 each, + 1 KB for the 1024-byte
// alignment. With one stage the next query block loads while dQ computes;
// with two, a whole iteration ahead. Other head dims than the rows' run
// zero-padded on the next row (bwd.cu), as in the forward.
#ifndef FC_SM90_BWD_TILES
//   X(D,  Br,  Bc,  Q stages)
#define FC_SM90_BWD_TILES(X) \
    X(64,  128, 128, 2)      \
    X(128, 64,  128, 2)      \
    X(256, 64,  64,  1)
#endif

template <int D>
struct fc_sm90_bwd_tile;  // only the rows of the table exist

#define FC_SM90_BWD_TILE_ROW_(D_, BR, BC, QS) \
    template <>                               \
    struct fc_sm90_bwd_tile<D_> {             \
        static constexpr int kBr = BR;         \
        static constexpr int kBc = BC;         \
        static constexpr int kQStages = QS;    \
    };
FC_SM90_BWD_TILES(FC_SM90_BWD_TILE_ROW_)
#undef FC_SM90_BWD_TILE_ROW_

template <int D>
struct fc_sm90_bwd_traits : fc_sm90_bwd_tile<D> {
    using tile = fc_sm90_bwd_tile<D>;
    static constexpr int kD = D;
    static constexpr int kBr = tile::kBr, kBc = tile::kBc, kQStages = tile::kQStages;
    static constexpr int kThreads = 256;  // two warpgroups
    // __launch_bounds__ minBlocks: one CTA per SM, so a thread may use all
    // 255 registers (256 x 255 < 64K); every row's shared memory is over half
    // the SM's anyway.
    static constexpr int kCtasPerSm = 1;
    // Bc = 64: the warpgroups split S^T by queries and dK, dV by columns
    static constexpr bool kColSplit = kBc == 64;
    static constexpr int kSN = kColSplit ? kBr / 2 : kBr;  // S^T, dP^T columns per warpgroup
    static constexpr int kKN = kColSplit ? D / 2 : D;      // dK, dV columns per warpgroup
    static constexpr int kChunks = D / 8;
    // dQ: warpgroup w owns query rows 64 (w % kMW) .., columns kDQN (w / kMW) ..
    static constexpr int kMW = kBr / 64, kDQN = D * kMW / 2;
    static constexpr int kKVBytes = kBc * D * 2;
    static constexpr int kQBytes = kBr * D * 2;
    static constexpr int kDSBytes = kBc * kBr * 2;
    static constexpr int kPBytes = kColSplit ? kDSBytes : 0;
    static constexpr int kDQBytes = kBr * D * 4;
    static constexpr int kSmemBytes = 1024 + 2 * kKVBytes + 2 * kQStages * kQBytes + kDSBytes +
                                      kPBytes + kDQBytes + 2 * kQStages * kBr * 4;
    static constexpr int kAccRegs = kKN + kSN;

    static_assert(D % 64 == 0 && D >= 64 && D <= 256, "head dim: a multiple of 64 up to 256");
    static_assert(kBr == 64 || kBr == 128, "Br: one or two 64-row wgmma tiles");
    static_assert(kBc == 128 || (kBc == 64 && kBr == 64 && D % 128 == 0),
                  "Bc: 64 keys a warpgroup, or 64 shared (Br = 64, D / 2 whole column blocks)");
    static_assert(kQStages == 1 || kQStages == 2, "one or two Q / dO stages");
    static_assert(kBr <= kFcBwdPadRows, "Br must not exceed the scratch pad rows");
    static_assert(kDQN % 64 == 0, "each warpgroup's dQ columns: whole 64-column blocks");
    static_assert(kSmemBytes <= FC_SM90_SMEM_LIMIT, "shared memory must fit 227 KB (sm90)");
    static_assert(kCtasPerSm >= 1 && kCtasPerSm * kSmemBytes <= FC_SM90_SMEM_LIMIT,
                  "the CTAs per SM must fit the SM's shared memory");
    static_assert(kAccRegs <= 192 && kKN + kDQN / 2 <= 192,
                  "accumulators leave too few of the 255 registers");
};

// ---- the sm90ws backward (sm90ws/bwd_kernel.cuh: the sm90 backward, warp-specialised) ----
// One row per head dim D with a warp-specialised instance; its tile is D's
// row of FC_SM90_BWD_TILES. The CTA adds a producer warpgroup (one warp loads
// Q, dO by TMA and lse2, delta by cp.async, one is the dQ writer) to the two
// consumer warpgroups, one CTA per SM: setmaxnreg gives the producer 24
// registers a thread and the consumers 240 (24 x 128 + 240 x 256 = 384 x
// 168, the CTA's registers at launch: with 32 for the producer the
// consumers' setmaxnreg.inc would wait forever).
// The column: the fp32 dQ tiles between the consumers and the writer, 2 where
// they fit (the consumers store the next while the writer's reduction of the
// last reads the other), else 1 (D = 256: 64 KB each). Shared memory: the sm90
// row's, one dQ tile more per extra buffer, and the barriers (full and empty
// per Q / dO stage and per dQ buffer).
#ifndef FC_SM90WS_BWD_TILES
//   X(D,  dQ buffers)
#define FC_SM90WS_BWD_TILES(X) \
    X(64,  2)                  \
    X(128, 2)                  \
    X(256, 1)
#endif

template <int D>
struct fc_sm90ws_bwd_tile;  // only the rows of the table exist

#define FC_SM90WS_BWD_TILE_ROW_(D_, DQB) \
    template <>                          \
    struct fc_sm90ws_bwd_tile<D_> {      \
        static constexpr int kDQBufs = DQB; \
    };
FC_SM90WS_BWD_TILES(FC_SM90WS_BWD_TILE_ROW_)
#undef FC_SM90WS_BWD_TILE_ROW_

template <int D>
struct fc_sm90ws_bwd_traits {
    using base = fc_sm90_bwd_traits<D>;  // the tile, the consumers' layout
    static constexpr int kBr = base::kBr, kBc = base::kBc, kQStages = base::kQStages;
    static constexpr int kDQBufs = fc_sm90ws_bwd_tile<D>::kDQBufs;
    static constexpr int kConsumerThreads = base::kThreads;  // the sm90 kernel's two warpgroups
    static constexpr int kThreads = kConsumerThreads + 128;  // + the producer warpgroup
    // setmaxnreg moves registers within the CTA's launch allocation: 384
    // threads at 168 (64K / 384, a multiple of 8) = 24 x 128 + 240 x 256
    static constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
    static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
    static constexpr int kBarBytes = 8 * 2 * (kQStages + kDQBufs);
    static constexpr int kSmemBytes = base::kSmemBytes + (kDQBufs - 1) * base::kDQBytes + kBarBytes;

    static_assert(kDQBufs == 1 || kDQBufs == 2, "one or two dQ buffers");
    static_assert(kSmemBytes <= FC_SM90_SMEM_LIMIT, "shared memory must fit 227 KB (sm90)");
    static_assert(kProducerRegs * 128 + kConsumerRegs * kConsumerThreads <=
                      kLaunchRegs * kThreads,
                  "the register budgets must fit the CTA's launch allocation");
    static_assert(kBr <= 256, "a TMA box has at most 256 rows");
};

#endif  // FLASHC_CUDA_TRAITS_H
