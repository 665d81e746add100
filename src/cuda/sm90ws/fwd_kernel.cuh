// fwd_kernel.cuh : the sm90ws forward: the sm90 family's math (S = Q K^T and
// O += P V on wgmma, FA3's in-warpgroup overlap of the softmax of tile n with
// O += P V(n - 1)) on FA3's data movement and scheduling (Shah et al. 2024,
// §3.1-3.2):
//
//   producer   warpgroup 0, registers lowered with setmaxnreg; its thread 0
//              issues TMA loads of each query tile's Q and of its K, V tiles
//              into a ring of kStages slots (paged: the lanes of its warp one
//              page each) (common/tma.cuh: full_k[s], full_v[s] complete when
//              the bytes land; empty_k[s] when every consumer is past
//              S = Q K^T of the slot, empty_v[s] past O += P V, so the next K
//              load starts a softmax earlier than the next V)
//   consumers  warpgroups 1.., 64 query rows each, registers raised; they wait
//              for each slot on its transaction barrier and release it after
//              their last GEMM on it; no consumer issues a load or waits at a
//              CTA-wide barrier
//   ping-pong  (traits kPingPong) the consumers take turns issuing their
//              GEMMs: named barrier FC_WS_BAR_TURN + w lets warpgroup w issue,
//              and it lets the next one go once its GEMMs are issued, so one
//              warpgroup's softmax runs under another's GEMMs
//   epilogue   each consumer writes O / l through its own Q rows in shared
//              memory to 16-byte global stores, as the sm90 kernel
//   scheduler  fc_ws_schedule: one query tile per CTA, or (traits
//              kPersistent) one CTA per SM walking a static schedule, Q in
//              two buffers: the producer loads the next tile's Q and K, V
//              while the consumers finish this one, and a buffer is free again
//              once its epilogue has read O out of it (empty_q)
//   GQA pack   (persistent instances, ws_params.h pack = G) the G query heads
//              of a KV head share query tiles: short query sequences fill
//              the tiles, and each K/V tile serves G heads (fwd.cu
//              fc_sm90ws_pack says when)
//   rows       a head dim's instance is its row of the tuning table, or its
//              short-work row (kShort; traits.h FC_SM90WS_FWD_SHORT_TILES,
//              fwd.cu fc_sm90ws_short says when)
//
// Operands are read through TMA descriptors (ws_params.h): batched and varlen
// q, k, v, a cache through cache_batch_idx and cache_leftpad, and paged K/V
// whose pages hold whole key tiles or whole chunks of one (one TMA box per
// page). Rows past a sequence read as zeros (past the descriptor's tensor)
// or as whatever the operand holds there (another sequence, a cache's unused
// rows or pages): scores there are masked, and V rows there are zeroed in
// shared memory before O += P V reads them (0 * NaN is NaN). Other page
// sizes and paged K/V with cache_leftpad run on the sm90 family (fwd.cu).
//
// Not here yet: persistence for D64's long work (its three consumers at 160
// registers spill 3x as much in the tile loop; two persistent consumers are
// its short-work row) and at D192 / D256 (a second Q buffer does not fit),
// a dynamic tile counter for varlen and windows, a TMA store
// of O, GQA packing in the one-tile instances, a cp.async producer for pages
// a TMA box cannot cover.
#ifndef FLASHC_CUDA_SM90WS_FWD_KERNEL_CUH
#define FLASHC_CUDA_SM90WS_FWD_KERNEL_CUH

#include <cuda_runtime.h>

#include <atomic>

#include "../common/dropout.cuh"
#include "../common/fwd_tile.cuh"
#include "../common/mask.cuh"
#include "../common/ptx.cuh"
#include "../common/softmax.cuh"
#include "../common/tma.cuh"
#include "../common/wgmma.cuh"
#include "../traits.h"
#include "../ws_params.h"

// Named barriers (0 is __syncthreads): the top tile's V rows zeroed (every
// consumer), the epilogue of consumer w and the ping-pong turn of consumer w
// (three ids each: up to three consumers).
enum { FC_WS_BAR_TAIL = 1, FC_WS_BAR_EPILOGUE = 2, FC_WS_BAR_TURN = FC_WS_BAR_EPILOGUE + 3 };

// The query tiles one CTA works, in order.
//   one tile per CTA (traits kPersistent 0): grid (ceil(Sq / Br), H, B), the
//     longest causal rows (largest m_block) first;
//   persistent: grid min(items, SMs), CTA c works items c, c + gridDim.x, ...
//     Without causal, item i is tile (m_block i % M, head-batch i / M), so the
//     CTAs at work at one time share one head's K and V in L2. With causal,
//     item i is the pair of tiles M - 1 - k and k of head-batch i / P (k = i %
//     P, P = ceil(M / 2)): a pair's key tiles sum to about M + 1 whatever k,
//     so the static round robin stays balanced without a tile counter; packed
//     (kPack) with too few pairs to fill the SMs (P.pair 0), item i is tile
//     M - 1 - i % M of head-batch i / M. Packed, the heads are the KV heads.
struct fc_ws_tile {
    int m_block, h, b;
};
template <bool kCausal, bool kPersistent, bool kPack>
struct fc_ws_schedule {
    int64_t i;  // the item
    int j;      // its tile: 0, or 1 (a pair's second)

    __device__ __forceinline__ fc_ws_schedule() : i(kPersistent ? (int64_t)blockIdx.x : 0), j(0) {}

    __device__ __forceinline__ bool done(const fc_cuda_fwd_ws_params &P) const {
        return kPersistent ? i >= P.items : i > 0;
    }
    __device__ __forceinline__ fc_ws_tile tile(const fc_cuda_fwd_ws_params &P) const {
        if (!kPersistent) {
            const int x = (int)blockIdx.x;
            return {kCausal ? (int)gridDim.x - 1 - x : x, (int)blockIdx.y, (int)blockIdx.z};
        }
        const int M = P.m_blocks, H = kPack ? P.f.heads / P.pack : P.f.heads;
        int m;
        int64_t bh;
        if (kCausal && kPack && !P.pair) {  // single tiles, the longest of a head first
            m = M - 1 - (int)(i % M);
            bh = i / M;
        } else if (kCausal) {
            const int pairs = (M + 1) / 2, k = (int)(i % pairs);
            m = j == 0 ? M - 1 - k : k;
            bh = i / pairs;
        } else {
            m = (int)(i % M);
            bh = i / M;
        }
        return {m, (int)(bh % H), (int)(bh / H)};
    }
    __device__ __forceinline__ void advance(const fc_cuda_fwd_ws_params &P) {
        if (!kPersistent) {
            i = 1;
            return;
        }
        if (kCausal && (!kPack || P.pair) && j == 0) {
            const int M = P.m_blocks, k = (int)(i % ((M + 1) / 2));
            if (M - 1 - k != k) {
                j = 1;
                return;
            }
        }
        j = 0;
        i += gridDim.x;
    }
};

// GQA packing (ws_params.h, P.pack = G > 1; the kPack instances of the
// persistent kernels only: in the others even the G = 1 branches cost time,
// 2-12% at D128, and registers the D64 consumers do not have): a tile of the
// schedule's head h holds packed rows
// m_block * Br .. of query heads h * G .. h * G + G - 1. fc_ws_tile_keys is
// fc_fwd_tile_keys for both: hq is the tile's (first) query head; packed,
// *seq is the sequence of head hq from query position m_block * Br / G on
// (Br % G == 0, fwd.cu), and seq->rows counts the tile's valid packed rows.
template <bool kCausal, int Br, int Bc, bool kPack>
__device__ __forceinline__ int fc_ws_tile_keys(const fc_cuda_fwd_ws_params &P, int b, int hq,
                                               int m_block, fc_fwd_seq *seq, int *n_lo,
                                               int *n_hi) {
    if (!kPack) return fc_fwd_tile_keys<kCausal, Br, Bc>(P.f, b, hq, m_block, seq, n_lo, n_hi);
    const int G = P.pack, sh = P.pack_shift, r0 = m_block * Br;  // G = 2^sh
    if (!seq->init(P.f, b, hq, r0 >> sh, Br)) return FC_TILE_PAST;
    seq->rows = min(Br, seq->sq * G - r0);
    const fc_mask<kCausal> mask(seq->sq, seq->sk, P.f.window_left, P.f.window_right);
    return mask.template tiles<Bc>(seq->m0, seq->m0 + ((seq->rows - 1) >> sh), n_lo, n_hi)
               ? FC_TILE_WORK
               : FC_TILE_EMPTY;
}

// Element offset of tile row r in an operand of row stride s_seq and head
// stride s_head, from the tile's base (o_base, lse_base): packed, row r is
// position r / G of head r % G (G = 2^sh: Br % G == 0 and Br is a power of two).
__device__ __forceinline__ int64_t fc_ws_row_offset(int sh, int r, int64_t s_seq,
                                                    int64_t s_head) {
    return (int64_t)(r >> sh) * s_seq + (int64_t)(r & ((1 << sh) - 1)) * s_head;
}

// out = 0 and lse = -inf (the sink with one) for a tile of first query head hq
// whose rows see no key (fc_fwd_store_empty through fc_ws_row_offset).
template <typename T, int CH, int BR, int NTH>
__device__ __forceinline__ void fc_ws_store_empty(const fc_cuda_fwd_params &p, int hq, int sh,
                                                  const fc_fwd_seq &seq, int tid) {
    T *o = static_cast<T *>(p.o);
    for (int idx = tid; idx < BR * CH; idx += NTH) {
        const int r = idx / CH, ch = idx % CH;
        if (r < seq.rows && ch * 8 < p.head_dim_v)
            *reinterpret_cast<uint4 *>(o + seq.o_base + fc_ws_row_offset(sh, r, p.o_s_seq, p.o_s_head) +
                                       ch * 8) = make_uint4(0u, 0u, 0u, 0u);
    }
    if (p.lse)
        for (int r = tid; r < seq.rows; r += NTH)
            p.lse[seq.lse_base + fc_ws_row_offset(sh, r, p.lse_s_seq, p.lse_s_head)] =
                fc_sink_of(p, hq + (r & ((1 << sh) - 1))).s;
}

// Grid and order: fc_ws_schedule; block kThreads, dynamic smem kSmemBytes.
// kCache: K/V rows through a cache's indirection (block_table, cache_batch_idx,
// cache_leftpad); the other kernel's producer has none of that code. kPack:
// GQA packing (persistent instances only).
template <int D, bool kShort, typename T, bool kCausal, bool kCache, bool kPack>
__global__ void __launch_bounds__(fc_sm90ws_fwd_traits<D, kShort>::kThreads, 1)
    sm90ws_fwd_kernel(const __grid_constant__ fc_cuda_fwd_ws_params P) {
    const fc_cuda_fwd_params &p = P.f;
    using Tr = fc_sm90ws_fwd_traits<D, kShort>;
    static_assert(!kPack || Tr::kPersistent, "GQA packing: persistent instances");
    using Sched = fc_ws_schedule<kCausal, Tr::kPersistent, kPack>;
    constexpr int Br = Tr::kBr, Bc = Tr::kBc, S = Tr::kStages, QB = Tr::kQBufs;
    constexpr int C = Tr::kConsumers, CT = 128 * C;  // consumer warpgroups, threads
    constexpr int DT = D / 8, KS = D / 16, PK = Bc / 16, CH = Tr::kChunks;
    constexpr int CB = D / 64;  // 64-column blocks: one TMA box each
    constexpr uint32_t TILE = Tr::kKVTileBytes;
    static_assert(FC_WS_BAR_TURN + C <= 16, "named barriers");
    static_assert(Bc / 8 <= 32, "a paged tile's chunks: one producer lane each");

    extern __shared__ unsigned char fc_smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    // One tile per CTA: its tile first, as every one-tile forward kernel (the
    // CTA ends here when the tile has no work).
    fc_fwd_seq seq1;
    int b1 = 0, h1 = 0, n_lo1 = 0, n_hi1 = 0;
    if (!Tr::kPersistent) {
        const fc_ws_tile w = Sched().tile(P);
        b1 = w.b, h1 = w.h;
        if (!fc_fwd_tile_begin<T, kCausal, Br, Bc, CH, Tr::kThreads>(p, b1, h1, w.m_block, tid,
                                                                      &seq1, &n_lo1, &n_hi1))
            return;
    }

    // ---- shared memory (1024-aligned): Q (QB buffers), the K ring, the V ring, the barriers ----
    const uint32_t sQ0 = (fc_smem_u32(fc_smem) + 1023u) & ~1023u;
    const uint32_t sK = sQ0 + QB * Tr::kQBytes;
    const uint32_t sV = sK + S * TILE;
    const uint32_t bar = sV + S * TILE;
    constexpr uint32_t QBAR = 8u * (Tr::kPersistent ? 2 * QB : QB);  // Q's barriers
    auto full_q = [&](int q) { return bar + 8u * (uint32_t)q; };
    auto empty_q = [&](int q) { return bar + 8u * (uint32_t)(QB + q); };
    auto full_k = [&](int s) { return bar + QBAR + 8u * (uint32_t)s; };
    auto full_v = [&](int s) { return bar + QBAR + 8u * (uint32_t)(S + s); };
    auto empty_k = [&](int s) { return bar + QBAR + 8u * (uint32_t)(2 * S + s); };
    auto empty_v = [&](int s) { return bar + QBAR + 8u * (uint32_t)(3 * S + s); };
    if (tid == 0) {
        for (int q = 0; q < QB; ++q) {
            fc_mbar_init(full_q(q), 1);
            if (Tr::kPersistent) fc_mbar_init(empty_q(q), CT);
        }
        for (int s = 0; s < S; ++s) {
            fc_mbar_init(full_k(s), 1);
            fc_mbar_init(full_v(s), 1);
            fc_mbar_init(empty_k(s), CT);
            fc_mbar_init(empty_v(s), CT);
        }
        fc_mbar_init_fence();
    }
    __syncthreads();

    // Tile u of the CTA's work (tiles past their sequence or with no visible
    // key do not count) uses Q buffer u % QB for the (u / QB)-th time; ring
    // position n (counted over the CTA's key tiles) uses slot n % S for the
    // (n / S)-th time. Phases of a barrier alternate 0, 1, 0, ... per use.

    // ---- the producer: one thread issues the loads (kCache: the lanes of its
    // warp look up the pages of a paged tile together and issue a box each) ----
    if (warp < 4) {
        fc_setmaxnreg_dec<Tr::kProducerRegs>();
        if (kCache ? warp != 0 : tid != 0) return;
        const bool lead = !kCache || lane == 0;
        // the loads of work tile u of the CTA (batch b, (first) query head h,
        // sequence seq, key tiles [n_lo, n_hi)), its key tiles from ring position
        // n0 on; packed, Q's box holds the G heads from h on
        auto produce = [&](const int b, const int h, const fc_fwd_seq &seq, const int n_lo,
                           const int n_hi, const int u, const int n0) {
            const int q_tok = seq.m0 + (p.cu_seqlens_q
                                            ? fc_cu_span(p.cu_seqlens_q, b, p.total_q, p.seqlen_q).start
                                            : 0);
            // Key row j in the K / V descriptors' (row, n0) coordinates: row k_tok + j
            // of n0 kb (batched, varlen, cache_batch_idx, leftpad), or, paged, row
            // j % page_size of page block_table[b][j / page_size], in chunks of
            // R rows that each lie in one page (fwd.cu: R = min(Bc, page_size)
            // divides the one or is a multiple of 8 dividing the other; no leftpad)
            int k_tok =
                p.cu_seqlens_k ? fc_cu_span(p.cu_seqlens_k, b, p.total_k, p.seqlen_k).start : 0;
            int kb = p.cu_seqlens_k ? 0 : b;
            const int qb = p.cu_seqlens_q ? 0 : b, hk = h / p.kv_group;
            if (kCache) {
                k_tok += seq.kv.leftpad;
                if (p.k_batch_idx) kb = fc_index(p.k_batch_idx, b, p.total_k);
            }
            // the TMA loads of the K or V tile at key row j0 into dst
            auto load_kv = [&](uint32_t dst, const CUtensorMap *map, uint32_t full, int j0) {
                if (!kCache || !seq.kv.bt) {
                    if (lead)
#pragma unroll
                        for (int cb = 0; cb < CB; ++cb)
                            fc_tma_load_4d(dst + cb * Bc * 128, map, full, cb * 64, hk, k_tok + j0,
                                           kb);
                    return;
                }
                // lane l: chunk l (R >= 8: at most Bc / 8 <= 32 chunks); a chunk past the
                // block_table row (the top tile's rows past the keys, masked and
                // zeroed) reads the row's last page
                const int ps = p.page_size, R = min(Bc, ps), c = lane * R;
                if (c < Bc) {
                    const int col = min((j0 + c) / ps, p.bt_cols - 1);
                    const int page = fc_clampi(__ldg(seq.kv.bt + col), 0, p.total_k - 1);
#pragma unroll
                    for (int cb = 0; cb < CB; ++cb)
                        fc_tma_load_4d(dst + cb * Bc * 128 + c * 128, map, full, cb * 64, hk,
                                       (j0 + c) % ps, page);
                }
            };
            const int qbuf = u % QB;
            if (u >= QB) fc_mbar_wait(empty_q(qbuf), (uint32_t)((u / QB - 1) & 1));
            if (lead) {
                const uint32_t sQ = sQ0 + qbuf * Tr::kQBytes;
                fc_mbar_arrive_expect_tx(full_q(qbuf), Tr::kQBytes);
#pragma unroll
                for (int cb = 0; cb < CB; ++cb)
                    fc_tma_load_4d(sQ + cb * Br * 128, &P.tma_q, full_q(qbuf), cb * 64, h, q_tok, qb);
            }
            for (int it = 0; it < n_hi - n_lo; ++it) {
                const int n = n0 + it, s = n % S, j0 = (n_hi - 1 - it) * Bc;
                const uint32_t used = (uint32_t)((n / S - 1) & 1);  // the slot's last use
                if (n >= S) fc_mbar_wait(empty_k(s), used);
                if (lead) fc_mbar_arrive_expect_tx(full_k(s), TILE);
                load_kv(sK + s * TILE, &P.tma_k, full_k(s), j0);
                if (n >= S) fc_mbar_wait(empty_v(s), used);
                if (lead) fc_mbar_arrive_expect_tx(full_v(s), TILE);
                load_kv(sV + s * TILE, &P.tma_v, full_v(s), j0);
            }
        };
        if constexpr (Tr::kPersistent) {
            int u = 0, n0 = 0;
            for (Sched sc; !sc.done(P); sc.advance(P)) {
                const fc_ws_tile w = sc.tile(P);
                fc_fwd_seq seq;
                int n_lo, n_hi;
                const int hq = kPack ? w.h * P.pack : w.h;
                if (fc_ws_tile_keys<kCausal, Br, Bc, kPack>(P, w.b, hq, w.m_block, &seq, &n_lo,
                                                            &n_hi) != FC_TILE_WORK)
                    continue;
                produce(w.b, hq, seq, n_lo, n_hi, u, n0);
                n0 += n_hi - n_lo;
                ++u;
            }
        } else {
            produce(b1, h1, seq1, n_lo1, n_hi1, 0, 0);
        }
        return;
    }

    // ---- the consumers ----
    fc_setmaxnreg_inc<Tr::kConsumerRegs>();
    const int wg = (warp >> 2) - 1;  // this warpgroup's rows: 64 wg .. 64 wg + 63 of a tile
    const int g = lane >> 2, t = lane & 3;
    T *o = static_cast<T *>(p.o);

    // wgmma descriptors (wgmma.cuh layouts): S = Q K^T k16 step ks reads column
    // block ks / 4 at byte 32 (ks % 4); O += P V: V is MN-major, k16 step kk
    // starts at key row 16 kk
    const uint64_t k_desc = fc_wgmma_desc(sK, 16, 1024);
    const uint64_t v_desc = fc_wgmma_desc(sV, Bc * 128, 1024);

    // Ping-pong: wait for this warpgroup's turn to issue GEMMs; pass the turn
    // on once they are issued. The last warpgroup opens the first turn; the
    // turns run on from tile to tile (every consumer takes as many); the last
    // pass stays unmatched (a CTA's barriers start empty). The passes are
    // unconditional: a branch between wgmma issue and wait makes ptxas
    // serialise every wgmma (C7520).
    auto turn_wait = [&] {
        if (Tr::kPingPong) fc_bar_sync(FC_WS_BAR_TURN + wg, 256);
    };
    auto turn_pass = [&] {
        if (Tr::kPingPong) fc_bar_arrive(FC_WS_BAR_TURN + (wg + 1) % C, 256);
    };
    if (Tr::kPingPong && wg == C - 1) fc_bar_arrive(FC_WS_BAR_TURN, 256);

    // work tile u of the CTA (batch b, (first) query head h, sequence seq, key
    // tiles [n_lo, n_hi)), its key tiles from ring position n0 on
    auto consume = [&](const int b, const int h, const fc_fwd_seq &seq, const int n_lo,
                       const int n_hi, const int u, const int n0) {
        const int n_tiles = n_hi - n_lo;
        const int m0 = seq.m0, rows = seq.rows;
        const fc_mask<kCausal> mask(seq.sq, seq.sk, p.window_left, p.window_right);
        const int qbuf = u % QB;
        const uint32_t sQ = sQ0 + qbuf * Tr::kQBytes;
        const uint64_t q_desc = fc_wgmma_desc(sQ + wg * 64 * 128, 16, 1024);

        float acc_o[1][DT][4];
#pragma unroll
        for (int dt = 0; dt < DT; ++dt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_o[0][dt][e] = 0.0f;
        float(&o_regs)[D / 2] = *reinterpret_cast<float(*)[D / 2]>(&acc_o[0][0][0]);
        fc_softmax<1> sm;
        sm.init();
        uint32_t p_frag[PK][4];  // P(n - 1) as 16-bit A fragments

        const int row0 = m0 + wg * 64 + (warp & 3) * 16 + g;  // query row of element 0
        // Packed (G > 1), tile row r is query position m0 + r / G (no ALiBi or
        // dropout then).
        const int sh = kPack ? P.pack_shift : 0;  // G = 2^sh
        const float slope_x =
            p.alibi ? p.alibi[(int64_t)b * p.alibi_s_batch + h] * p.alibi_scale : 0.0f;
        const uint32_t bh = (uint32_t)b * (uint32_t)p.heads + (uint32_t)h;

        // O += P V of ring position n once V has landed; committed as one group.
        auto issue_pv = [&](int n) {
            fc_mbar_wait(full_v(n % S), (uint32_t)((n / S) & 1));
            const uint64_t vd = fc_wgmma_desc_add(v_desc, (uint32_t)(n % S) * TILE);
#pragma unroll
            for (int kk = 0; kk < PK; ++kk)
                fc_wgmma_rs<D, T>(o_regs, p_frag[kk], fc_wgmma_desc_add(vd, kk * 16 * 128), 1);
            fc_wgmma_commit();
        };

        fc_mbar_wait(full_q(qbuf), (uint32_t)((u / QB) & 1));
        for (int it = 0; it < n_tiles; ++it) {
            const int n = n0 + it, j0 = (n_hi - 1 - it) * Bc;
            fc_mbar_wait(full_k(n % S), (uint32_t)((n / S) & 1));

            float acc_s[1][Bc / 8][4];
            float(&s_regs)[Bc / 2] = *reinterpret_cast<float(*)[Bc / 2]>(&acc_s[0][0][0]);
            turn_wait();
            fc_wgmma_fence();
            fc_wgmma_abt<Bc, T, KS>(s_regs, q_desc, Br,
                                    fc_wgmma_desc_add(k_desc, (uint32_t)(n % S) * TILE), Bc);
            if (it > 0) {
                issue_pv(n - 1);
                turn_pass();
                fc_wgmma_wait<1>();  // S(it) done; O += P V(it - 1) may still run
            } else {
                turn_pass();
                // The top tile may hold V rows past the sequence's keys: zero
                // them before O += P V reads them (outside the turns, so every
                // consumer gets here).
                const int keep = seq.sk - j0;
                if (keep < Bc) {
                    fc_mbar_wait(full_v(n % S), (uint32_t)((n / S) & 1));
                    const uint32_t v0 = sV + (uint32_t)(n % S) * TILE;
                    for (int idx = tid - 128; idx < (Bc - keep) * CH; idx += CT)
                        fc_st_shared_zero16(v0 + fc_sw128_offset(Bc, keep + idx / CH, idx % CH));
                    fc_fence_proxy_async();  // the generic stores, before wgmma's async reads
                    fc_bar_sync(FC_WS_BAR_TAIL, CT);
                }
                fc_wgmma_wait<0>();
            }
            fc_reg_fence(s_regs);
            fc_mbar_arrive(empty_k(n % S));  // S(it) done: K slot free

            // score modifiers, masks, online softmax, dropout (O untouched)
            const int col0 = j0 + 2 * t;  // key of this thread's element 0
            if (p.softcap_pre != 0.0f) fc_softcap(acc_s, p.softcap_pre);
            if (p.alibi) mask.alibi(acc_s, row0, col0, slope_x);
            if constexpr (!kPack) {
                if (mask.template tile_partial<Bc>(m0, m0 + rows - 1, j0))
                    mask.apply(acc_s, row0, col0);
            } else if (mask.template tile_partial<Bc>(m0, m0 + ((rows - 1) >> sh), j0)) {
                const int r = row0 - m0;
                mask.apply_rows(acc_s, m0 + (r >> sh), m0 + ((r + 8) >> sh), col0);
            }
            float alpha[1][2];
            sm.step(acc_s, p.score_scale_log2, alpha);
            if (p.dropout)
                fc_dropout_apply(acc_s, p.dropout_seed, p.dropout_offset, p.dropout_threshold, bh,
                                 row0, (uint64_t)(j0 / 8), t);

            if (it > 0) {
                fc_wgmma_wait<0>();  // O += P V(it - 1) done: its V slot is free
                fc_mbar_arrive(empty_v((n - 1) % S));
                fc_reg_fence(o_regs);
                fc_reg_fence(p_frag);
                fc_softmax_rescale(acc_o, alpha);
            }
            fc_acc_to_afrag<T>(acc_s[0], p_frag);  // P(it) to 16 bits
        }
        turn_wait();
        fc_wgmma_fence();
        issue_pv(n0 + n_tiles - 1);
        turn_pass();
        fc_wgmma_wait<0>();
        fc_reg_fence(o_regs);
        fc_reg_fence(p_frag);
        if (Tr::kPersistent) fc_mbar_arrive(empty_v((n0 + n_tiles - 1) % S));  // the ring runs on

        // ---- epilogue: O / l through this warpgroup's Q rows to 16-byte stores ----
        // (every wgmma of this warpgroup, the only readers of these rows, is done)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const int r = wg * 64 + (warp & 3) * 16 + 8 * hr + g;  // tile row
            float inv, lse;  // packed, row r is of query head h + r % G
            sm.finalize(0, hr, p.score_scale, p.score_scale_log2, p.dropout_rescale,
                        fc_sink_of(p, h + (r & ((1 << sh) - 1))), p.ln2, &inv, &lse);
#pragma unroll
            for (int dt = 0; dt < DT; ++dt)
                fc_st_shared_b32(sQ + fc_sw128_offset(Br, r, dt) + t * 4,
                                 fc_pack2<T>(acc_o[0][dt][2 * hr] * inv,
                                             acc_o[0][dt][2 * hr + 1] * inv));
            if (p.lse && t == 0 && r < rows)
                p.lse[seq.lse_base + fc_ws_row_offset(sh, r, p.lse_s_seq, p.lse_s_head)] = lse;
        }
        fc_bar_sync(FC_WS_BAR_EPILOGUE + wg, 128);
        const int wtid = tid & 127;
#pragma unroll
        for (int c = 0; c < 64 * CH / 128; ++c) {
            const int idx = wtid + 128 * c, r = wg * 64 + idx / CH, ch = idx % CH;
            if (r < rows && ch * 8 < p.head_dim_v)
                fc_st_global_v4(o + seq.o_base + fc_ws_row_offset(sh, r, p.o_s_seq, p.o_s_head) + ch * 8,
                                fc_ld_shared_v4(sQ + fc_sw128_offset(Br, r, ch)));
        }
        if (Tr::kPersistent) {
            // the buffer's reads are done before the producer's next TMA write to it
            fc_fence_proxy_async();
            fc_mbar_arrive(empty_q(qbuf));
        }
    };
    if constexpr (Tr::kPersistent) {
        int u = 0, n0 = 0;
        for (Sched sc; !sc.done(P); sc.advance(P)) {
            const fc_ws_tile w = sc.tile(P);
            fc_fwd_seq seq;
            int n_lo, n_hi;
            const int hq = kPack ? w.h * P.pack : w.h;
            const int kind =
                fc_ws_tile_keys<kCausal, Br, Bc, kPack>(P, w.b, hq, w.m_block, &seq, &n_lo, &n_hi);
            if (kind == FC_TILE_EMPTY)
                fc_ws_store_empty<T, CH, Br, CT>(p, hq, kPack ? P.pack_shift : 0, seq, tid - 128);
            if (kind != FC_TILE_WORK) continue;
            consume(w.b, hq, seq, n_lo, n_hi, u, n0);
            n0 += n_hi - n_lo;
            ++u;
        }
    } else {
        consume(b1, h1, seq1, n_lo1, n_hi1, 0, 0);
    }
}

template <int D, bool kShort, typename T, bool kCausal, bool kCache, bool kPack>
cudaError_t sm90ws_fwd_launch_kernel(const fc_cuda_fwd_ws_params &p, dim3 grid,
                                     cudaStream_t stream) {
    using Tr = fc_sm90ws_fwd_traits<D, kShort>;
    static std::atomic<uint64_t> smem_set{0};  // bit d: the limit is raised on device d
    return fc_launch_kernel(sm90ws_fwd_kernel<D, kShort, T, kCausal, kCache, kPack>, &smem_set,
                            Tr::kSmemBytes, Tr::kThreads, grid, stream, p, false);
}

// A cache's K/V runs a kernel of its own: with the paged producer's code in it,
// ptxas allocates the consumers' registers differently, which measured 1-3%
// slower at S = 1k (bench/NOTES.md, issue 18 run 29). So does GQA packing
// (p.pack > 1, persistent instances).
template <int D, bool kShort, typename T, bool kCausal, bool kCache>
cudaError_t sm90ws_fwd_launch_cache(const fc_cuda_fwd_ws_params &p, dim3 grid,
                                    cudaStream_t stream) {
    if constexpr (fc_sm90ws_fwd_traits<D, kShort>::kPersistent)
        if (p.pack > 1)
            return sm90ws_fwd_launch_kernel<D, kShort, T, kCausal, kCache, true>(p, grid, stream);
    return sm90ws_fwd_launch_kernel<D, kShort, T, kCausal, kCache, false>(p, grid, stream);
}
template <int D, bool kShort, typename T, bool kCausal>
cudaError_t sm90ws_fwd_launch_row(const fc_cuda_fwd_ws_params &p, dim3 grid, cudaStream_t stream) {
    return p.f.block_table || p.f.k_batch_idx || p.f.k_leftpad
               ? sm90ws_fwd_launch_cache<D, kShort, T, kCausal, true>(p, grid, stream)
               : sm90ws_fwd_launch_cache<D, kShort, T, kCausal, false>(p, grid, stream);
}
// The instance of head dim D: its short-work row's kernels when p.short_row
// (traits.h; fwd.cu sized the grid and the TMA boxes for that row).
template <int D, typename T, bool kCausal>
cudaError_t sm90ws_fwd_launch(const fc_cuda_fwd_ws_params &p, dim3 grid, cudaStream_t stream) {
    if constexpr (fc_sm90ws_fwd_has_short<D>::value)
        if (p.short_row) return sm90ws_fwd_launch_row<D, true, T, kCausal>(p, grid, stream);
    return sm90ws_fwd_launch_row<D, false, T, kCausal>(p, grid, stream);
}

#endif  // FLASHC_CUDA_SM90WS_FWD_KERNEL_CUH
