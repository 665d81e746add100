// bwd_kernel.cuh : the sm90 (Hopper, sm_90a) attention backward: the
// FlashAttention-2 work split (Dao 2023, Algorithm 2: key blocks parallel,
// query blocks a loop) on warpgroup MMAs, with FlashAttention-3's operand
// arrangement (Shah et al. 2024, §3 and App. B: the S and dP GEMMs swapped so
// the keys are wgmma's M side, dV and dK from registers, dQ reduced in bulk).
//
// A CTA of two warpgroups owns the key block Kj, Vj (Bc rows of one KV head
// hk of one sequence) and keeps dKj, dVj in registers while it walks every
// query block Qi (Br rows) of every query head of hk's group (GQA sums in
// place: dK, dV written once), or of its share of the group when the GQA
// split (bwd_params.h kv_split) gives the group to several CTAs so that few
// KV heads still fill the GPU (their fp32 partials summed afterwards):
//     S^T  = Kj Qi^T,  dP^T = Vj dOi^T    wgmma SS, fp32
//     P^T  = exp2(x sl2 - lse2)           x, masks, softcap, ALiBi as the
//     dS^T = P^T o (dP^T - delta) o dt    sm80 kernel (sm80/bwd_kernel.cuh)
//     dVj += P^T dOi,  dKj += dS^T Qi
//     dQi  = dS Kj                        wgmma SS m64n(D Br / 128), A = dS^T
//                                         and B = K read MN-major from smem
// The key tile (traits.h FC_SM90_BWD_TILES) picks the split:
//   Bc = 128  warpgroup w owns keys 64w .. 64w + 63: S^T, dP^T m64nBr, and
//             dV, dK wgmma RS m64nD (the accumulator of S^T is the A
//             fragment, wgmma.cuh);
//   Bc = 64   (D = 256) warpgroup w computes S^T, dP^T of queries
//             w Br/2 .. (m64n(Br/2)) and owns columns w D/2 .. of dK, dV:
//             P^T and dS^T meet in shared memory, and dV, dK are wgmma SS
//             m64n(D/2) with A = P^T, dS^T as stored.
// dQi goes to a shared fp32 tile and from there, by one thread, to dq_accum
// with one bulk reduction (cp.reduce.async.bulk .add.f32: the TMA unit does
// the adds, the warps issue no atomics). The tile's 16-byte chunks are
// XOR-swizzled by row (chunk c of row r at c ^ 2 (r % 4), bwd_params.h
// fc_dq_chunk) so the fragment stores hit distinct banks; dq_accum holds the
// same swizzle and the dQ kernel (common/bwd_prep.cuh, dq_swizzle) undoes it.
//
// Data movement: K, V once; Q, dO, lse2, delta through a ring of one or two
// slots (cp.async, wgmma.cuh's 128B-swizzled layout). Two: after the first
// barrier of iteration it the slot of it - 1 is free; it takes iteration
// it + 1's query block, issued once the S^T, dP^T GEMMs of it are (the issue
// of 16-byte copies by every thread then delays no GEMM), so every load has
// about an iteration to land. One (D = 256, where two do not fit): the next
// query block loads once dV and dK are done with the slot, while dQ
// computes. dS^T goes to shared memory [key][query] for the dQ GEMM. Within a
// warpgroup the exponentials of P^T run while the dP^T GEMM does (and with
// dropout the keep bits are drawn then too), and dV, dK run with the dQ GEMM.
//
// Deterministic mode: as the sm80 kernel, a turn counter per (head, query
// block); the issuing thread waits its turn, adds, waits for the bulk
// reduction to complete and releases the next key block.
//
// The code: fc_sm90_bwd_cta is what a thread knows for the whole walk (tile
// constants, the shared-memory carve-up, its warpgroup's part of each GEMM)
// and holds the stages, one member function each, in the order the kernel
// calls them per query block:
//     tile loads     load_kv, load_q (cp.async), qblock, wait_tiles
//     S, dP GEMMs    scores: S^T and dP^T issued as two commit groups
//     element-wise   mods, probs, dscores (+ draw, dropped: dropout),
//                    single_key_rows, store_ds
//     dV, dK GEMMs   dq_barrier, grads, wait_grads
//     dQ             dq_gemm, wait_all, store_dq (the tile to shared memory),
//                    retire_dq (the bulk reduction; deterministic: in turn)
//     epilogue       dK * scale, dV to the caller; with the GQA split
//                    (kv_split > 1) epilogue_part: fp32 partials instead
// sm90_bwd_kernel is the schedule: the barriers, which wgmma group each
// step waits for, and when the next query block loads.
//
// Code generation: the stages were split out of one kernel body with the
// SASS of every instance left byte-identical (issue 17). That is why the
// members hold the kernel's indices by reference (as the lambdas they
// replace captured them) and why three pieces stay written out in the kernel
// body: the warpgroup's part (k0 .. qc), the tile test of a query block, and
// the order of waits of the element-wise stage. Called as members (part,
// visits, elementwise: the warp-specialised kernel, sm90ws/bwd_kernel.cuh,
// calls them so), each changed the code nvcc emits here (instruction order,
// spills, up to a register more). Check a change here against the SASS and
// ptxas -v of the previous version (cuobjdump -sass).
//
// Template parameters: the head dim D (a row of traits.h FC_SM90_BWD_TILES),
// the dtype T, kCausal. Everything else is a field of bwd_params.h.
//
// Not here: paged K/V (the backward has none); TMA loads, warp
// specialisation and setmaxnreg (both warpgroups load with cp.async and both
// compute: sm90ws/bwd_kernel.cuh runs these stages with a producer warp and a
// dQ writer warp); a persistent scheduler (one CTA per key block, in grid
// order).
#ifndef FLASHC_CUDA_SM90_BWD_KERNEL_CUH
#define FLASHC_CUDA_SM90_BWD_KERNEL_CUH

#include <cuda_runtime.h>

#include <atomic>

#include "../bwd_params.h"
#include "../common/bwd_tile.cuh"
#include "../common/dropout.cuh"
#include "../common/mask.cuh"
#include "../common/ptx.cuh"
#include "../common/wgmma.cuh"
#include "../traits.h"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "the sm90 kernels use wgmma: compile them for sm_90a only"
#endif

// Byte offset of fp32 element (r, c) in a row-major tile of D columns whose
// 16-byte chunks are swizzled by row as dq_accum's (bwd_params.h fc_dq_chunk;
// the tile's rows start at a query block, a multiple of 4).
template <int D>
__device__ __forceinline__ uint32_t fc_dq_swz_offset(int r, int c) {
    return (uint32_t)(r * D * 4 + (fc_dq_chunk(c >> 2, r) << 4) + (c & 3) * 4);
}

// ---- what the stages pass on ----
// One query block of the walk (fc_sm90_bwd_cta::qblock).
struct fc_sm90_bwd_qblock {
    int h;             // query head
    int m0, rows;      // its first query row in the sequence, valid rows (<= Br)
    uint32_t slot;     // ring slot: iteration % QS
    uint32_t sQ, sdO;  // the slot's Q and dO tiles [Br][D]
};

// The score modifiers of one query block (fc_sm90_bwd_cta::mods).
struct fc_sm90_bwd_mods {
    bool partial;   // some row sees only part of the key block: element masks
    float slope_x;  // ALiBi slope in units of x, or 0
    bool cap;       // softcap
    bool drop;      // dropout
};

// The dQ tile of a visiting iteration waits in sdQ for the next iteration's
// first barrier; then thread 0 adds it to dq_accum (retire_dq).
struct fc_sm90_bwd_dq_tile {
    int turn;     // its turn: the visiting key blocks before this one
    int64_t row;  // scratch row of the waiting tile, or -1
};

// ---- the CTA and its stages ----
template <int D, typename T, bool kCausal>
struct fc_sm90_bwd_cta {
    using Tr = fc_sm90_bwd_traits<D>;
    static constexpr int Br = Tr::kBr, Bc = Tr::kBc, NTH = Tr::kThreads, CH = Tr::kChunks;
    static constexpr int QS = Tr::kQStages, MW = Tr::kMW, DQN = Tr::kDQN;
    static constexpr int SN = Tr::kSN, KN = Tr::kKN;
    static constexpr bool kSplit = Tr::kColSplit;
    static constexpr int NT = SN / 8;   // 8-query tiles of S^T per row
    static constexpr int DT = KN / 8;   // 8-column tiles of dK, dV per row
    static constexpr int QT = DQN / 8;  // 8-column tiles of this warpgroup's dQ
    static constexpr int KS = D / 16;   // k16 steps of S^T, dP^T
    static constexpr int PK = Br / 16;  // k16 steps of dV, dK
    static constexpr int QK = Bc / 16;  // k16 steps of dQ

    using Ld = fc_tile_loader<T, NTH, CH>;
    static_assert(Ld::RPP % 8 == 0, "loader rows must keep the swizzle phase");
    static constexpr uint32_t LD_STEP = Ld::RPP * 128;

    // The forward's dropout keep bits of this thread's S^T elements
    // (dropout.cuh): element (nt, e) is bit (nt % 8) 4 + e of word nt / 8.
    struct keep_bits {
        uint32_t w[(NT + 7) / 8];
        __device__ __forceinline__ uint32_t operator()(int nt, int e) const {
            return (w[nt / 8] >> ((nt % 8) * 4 + e)) & 1u;
        }
    };

    // the kernel's: the thread, its C-fragment row group and column pair
    // (ptx.cuh), the key block, grid row y (KV head y / kv_split, part
    // y % kv_split of its query heads) and sequence; the walk and its mask
    const int &tid, &g, &t, &n_block, &y, &b;
    const fc_bwd_block &blk;
    const fc_mask<kCausal> &mask;
    // shared memory (1024-aligned)
    uint32_t sK, sV;        // [Bc][D]
    uint32_t sQ, sdO;       // [QS][Br][D]
    uint32_t sdS, sP;       // [Bc][Br] (sP: kSplit only)
    uint32_t sdQ;           // [Br][D] f32
    uint32_t sLse, sDelta;  // [QS][Br] f32
    // this warpgroup's part (set by the kernel once K, V and the first query
    // block are loading) and its wgmma descriptors (wgmma.cuh layouts)
    int k0;                   // its first key row of S^T, dP^T, dK, dV
    int q0;                   // its first query column of S^T, dP^T
    int c0;                   // its first column of dK, dV
    uint64_t k_desc, v_desc;  // S^T, dP^T: A = 64 rows of K / V (K-major)
    uint64_t ds_desc;         // dQ: A = dS^T's query block wg % MW (MN-major)
    uint64_t kt_desc;         // dQ: B = K's column blocks of part wg / MW (MN-major)
    int kr;                   // key row (in the block) of C-fragment element 0
    int qr, qc;               // dQ: query row and column of element 0

    __device__ __forceinline__ fc_sm90_bwd_cta(const int &tid_, const int &g_, const int &t_,
                                               const int &n_block_, const int &y_, const int &b_,
                                               const fc_bwd_block &blk_,
                                               const fc_mask<kCausal> &mask_, unsigned char *smem)
        : tid(tid_), g(g_), t(t_), n_block(n_block_), y(y_), b(b_), blk(blk_), mask(mask_) {
        sK = (fc_smem_u32(smem) + 1023u) & ~1023u;
        sV = sK + Tr::kKVBytes;
        sQ = sV + Tr::kKVBytes;
        sdO = sQ + QS * Tr::kQBytes;
        sdS = sdO + QS * Tr::kQBytes;
        sP = sdS + Tr::kDSBytes;
        sdQ = sP + Tr::kPBytes;
        sLse = sdQ + Tr::kDQBytes;
        sDelta = sLse + QS * Br * 4;
    }

    // Warpgroup wg's part of each GEMM and its wgmma descriptors (warp: the
    // thread's warp in the CTA); once K, V are loading.
    __device__ __forceinline__ void part(int wg, int warp) {
        k0 = kSplit ? 0 : wg * 64;
        q0 = kSplit ? wg * SN : 0;
        c0 = kSplit ? wg * KN : 0;
        k_desc = fc_wgmma_desc(sK + k0 * 128, 16, 1024);
        v_desc = fc_wgmma_desc(sV + k0 * 128, 16, 1024);
        ds_desc = fc_wgmma_desc(sdS + (wg % MW) * Bc * 128, Bc * 128, 1024);
        kt_desc = fc_wgmma_desc(sK + (wg / MW) * (DQN / 64) * Bc * 128, Bc * 128, 1024);
        kr = k0 + (warp & 3) * 16 + g;
        qr = (wg % MW) * 64 + (warp & 3) * 16 + g;
        qc = (wg / MW) * DQN + 2 * t;
    }

    // Whether query block q sees this key block; *n_lo: the first it sees.
    __device__ __forceinline__ bool visits(const fc_sm90_bwd_qblock &q, int *n_lo) const {
        int n_hi;
        return mask.template tiles<Bc>(q.m0, q.m0 + q.rows - 1, n_lo, &n_hi) &&
               n_block >= *n_lo && n_block < n_hi;
    }

    // An [R][4] C-fragment array as the flat register list of a wgmma.
    template <int N, int R>
    __device__ __forceinline__ static float (&regs(float (&acc)[R][4]))[N] {
        static_assert(N == R * 4, "4 accumulator registers per 8-column tile");
        return *reinterpret_cast<float(*)[N]>(&acc[0][0]);
    }

    // ---- stage: tile loads (cp.async) ----
    // K, V of the block, once.
    __device__ __forceinline__ void load_kv(const fc_cuda_bwd_params &p) const {
        const Ld ld(tid, p.f.head_dim, p.f.head_dim_v, Bc, blk.sk);
        const uint32_t dst = fc_sw128_offset(Bc, ld.row, ld.ch);
        fc_bwd_load_kv<Ld, Bc, T>(ld, p, b, y / p.kv_split, blk, sK + dst, sV + dst, LD_STEP);
    }

    // Q, dO, lse2, delta of iteration `it` into slot it % QS (one commit).
    __device__ __forceinline__ void load_q(const fc_cuda_bwd_params &p, int it) const {
        fc_bwd_load_q<Ld, Br, QS, NTH, T>(
            p, b, y * p.split_heads, blk, tid, it, sQ, sdO, Tr::kQBytes, LD_STEP, sLse, sDelta,
            [](int row, int ch) { return fc_sw128_offset(Br, row, ch); });
    }

    // The query block of iteration `it` and its slot, that of ring position
    // `pos` (the iteration here; sm90ws: the CTA's count of visited blocks).
    __device__ __forceinline__ fc_sm90_bwd_qblock qblock(const fc_cuda_bwd_params &p, int it,
                                                         int pos) const {
        fc_sm90_bwd_qblock q;
        int m;
        blk.iter_hm(it, y * p.split_heads, &q.h, &m);
        q.m0 = m * Br;
        q.rows = min(Br, blk.sq - q.m0);
        q.slot = (uint32_t)(pos % QS);
        q.sQ = sQ + q.slot * Tr::kQBytes;
        q.sdO = sdO + q.slot * Tr::kQBytes;
        return q;
    }

    // This iteration's Q, dO, lse2, delta (and K, V at it = 0) have landed
    // and are visible to wgmma (the only group in flight, loaded during the
    // last iteration); the last iteration's dQ tile is complete and, with two
    // slots, the last iteration's slot is free for the next one.
    __device__ __forceinline__ void wait_tiles() const {
        fc_cp_async_wait<0>();
        fc_fence_proxy_async();
        __syncthreads();
    }

    // ---- stage: S^T = K Q^T, dP^T = V dO^T ----
    // acc = A B^T over D (A: 64 key rows, B: SN query rows), one commit group.
    __device__ __forceinline__ static void gemm_kd(float (&acc)[SN / 2], uint64_t a, uint64_t bq) {
        fc_wgmma_abt<SN, T, KS>(acc, a, Bc, bq, Br);
    }

    // Issues S^T (the older group), then dP^T; waits for neither.
    __device__ __forceinline__ void scores(float (&acc_s)[NT][4], float (&acc_dp)[NT][4],
                                           const fc_sm90_bwd_qblock &q) const {
        fc_wgmma_fence();
        gemm_kd(regs<SN / 2>(acc_s), k_desc, fc_wgmma_desc(q.sQ + q0 * 128, 16, 1024));
        gemm_kd(regs<SN / 2>(acc_dp), v_desc, fc_wgmma_desc(q.sdO + q0 * 128, 16, 1024));
    }

    // ---- stage: P^T, dS^T element-wise (rows: keys, columns: queries) ----
    __device__ __forceinline__ fc_sm90_bwd_mods mods(const fc_cuda_bwd_params &p,
                                                     const fc_sm90_bwd_qblock &q) const {
        const fc_cuda_fwd_params &f = p.f;
        fc_sm90_bwd_mods md;
        md.partial = mask.template tile_partial<Bc>(q.m0, q.m0 + q.rows - 1, blk.j0);
        md.slope_x = f.alibi ? f.alibi[(int64_t)b * f.alibi_s_batch + q.h] * f.alibi_scale : 0.0f;
        md.cap = f.softcap_pre != 0.0f;
        md.drop = f.dropout != 0;
        return md;
    }

    // The keep bits of query block q (the whole warp calls it together).
    __device__ __forceinline__ void draw(const fc_cuda_bwd_params &p, const fc_sm90_bwd_qblock &q,
                                         keep_bits &kb) const {
        const fc_cuda_fwd_params &f = p.f;
        const uint32_t bh = (uint32_t)b * (uint32_t)f.heads + (uint32_t)q.h;
#pragma unroll
        for (int pr = 0; pr < NT / 2; ++pr) {
            const uint32_t k2 = fc_dropout_keep_t2(f.dropout_seed, f.dropout_offset,
                                                   f.dropout_threshold, bh, q.m0 + q0 + 16 * pr,
                                                   blk.j0 + kr - g, g, t);
            kb.w[pr / 4] = (pr % 4 ? kb.w[pr / 4] : 0u) | k2 << (8 * (pr % 4));
        }
    }

    // With dropout (k the keep bit, rs = 1 / (1 - p)): dS^T uses P^T and
    // dP^T o k rs, and P^T becomes P^T o k rs for dV.
    __device__ __forceinline__ static float dropped(const fc_cuda_bwd_params &p,
                                                    const keep_bits &kb, int nt, int e, float pr,
                                                    float dp, float *pd) {
        const bool k = kb(nt, e);
        *pd = k ? pr * p.f.dropout_rescale : 0.0f;
        return k ? dp * p.f.dropout_rescale : 0.0f;
    }

    // P^T into acc_s; with kDS also dS^T into acc_dp (and P^T with dropout
    // applied into acc_s). kPlain: no softcap, ALiBi, element mask or
    // dropout, the common case, kept free of branches so that its code stays
    // short and contiguous.
    template <bool kPlain, bool kDS>
    __device__ __forceinline__ void probs(const fc_cuda_bwd_params &p, float (&acc_s)[NT][4],
                                          float (&acc_dp)[NT][4], const fc_sm90_bwd_qblock &q,
                                          const fc_sm90_bwd_mods &md, const keep_bits &kb) const {
        const fc_cuda_fwd_params &f = p.f;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const int c = q0 + 8 * nt + 2 * t;  // tile column (query) of element pair 0
            const float2 l2 = fc_ld_shared_v2f(sLse + (q.slot * Br + c) * 4);
            const float2 dl = fc_ld_shared_v2f(sDelta + (q.slot * Br + c) * 4);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = q.m0 + c + (e & 1);          // query row in the sequence
                const int j = blk.j0 + kr + 8 * (e >> 1);  // key
                float x = acc_s[nt][e], dt = 1.0f;
                if (!kPlain && md.cap) {
                    x = fc_softcap1(x, f.softcap_pre);
                    dt = 1.0f - x * x;
                }
                if (!kPlain && f.alibi) x = fmaf(-md.slope_x, fabsf((float)(mask.diag(i) - j)), x);
                float pr = fc_exp2(fmaf(x, f.score_scale_log2, -((e & 1) ? l2.y : l2.x)));
                if (!kPlain && md.partial && (j < mask.lo(i) || j >= mask.hi(i))) pr = 0.0f;
                acc_s[nt][e] = pr;
                if (kDS) {
                    float dp = acc_dp[nt][e];
                    if (!kPlain && md.drop) dp = dropped(p, kb, nt, e, pr, dp, &acc_s[nt][e]);
                    acc_dp[nt][e] = pr * (dp - ((e & 1) ? dl.y : dl.x)) * dt;
                }
            }
        }
    }

    // dS^T into acc_dp from P^T in acc_s (no softcap); with kDrop the keep
    // bits applied as in dropped().
    template <bool kDrop>
    __device__ __forceinline__ void dscores(const fc_cuda_bwd_params &p, float (&acc_s)[NT][4],
                                            float (&acc_dp)[NT][4], const fc_sm90_bwd_qblock &q,
                                            const keep_bits &kb) const {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const float2 dl = fc_ld_shared_v2f(sDelta + (q.slot * Br + q0 + 8 * nt + 2 * t) * 4);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float pr = acc_s[nt][e];
                float dp = acc_dp[nt][e];
                if (kDrop) dp = dropped(p, kb, nt, e, pr, dp, &acc_s[nt][e]);
                acc_dp[nt][e] = pr * (dp - ((e & 1) ? dl.y : dl.x));
            }
        }
    }

    // common/window.h's one-key rule: dS = 0 where a row (query) sees one key
    // and its P there is at least FC_ONE_KEY_P. acc_s holds P^T, with dropout
    // P^T o k rs: p_min is FC_ONE_KEY_P in those units (a dropped key has
    // P^T o k = 0, O = 0 and Delta = 0, so dS = 0 already). Such a row makes
    // every tile it meets partial.
    __device__ __forceinline__ void single_key_rows(float (&acc_dp)[NT][4],
                                                    const float (&acc_s)[NT][4],
                                                    const fc_sm90_bwd_qblock &q,
                                                    float p_min) const {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = q.m0 + q0 + 8 * nt + 2 * t + (e & 1);
                if (max(mask.lo(i), 0) + 1 == mask.hi(i) && acc_s[nt][e] >= p_min)
                    acc_dp[nt][e] = 0.0f;
            }
    }

    // dS^T (and with kSplit P^T) to shared memory [key][query]: the C fragment
    // pairs of 8-query tile nt are chunk q0 / 8 + nt of their rows. Without
    // kSplit also the A fragments of dV += P^T dO, dK += dS^T Q.
    __device__ __forceinline__ void store_ds(const float (&acc_s)[NT][4],
                                             const float (&acc_dp)[NT][4],
                                             uint32_t (&p_frag)[PK][4],
                                             uint32_t (&ds_frag)[PK][4]) const {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
                const uint32_t off = fc_sw128_offset(Bc, kr + 8 * hr, q0 / 8 + nt) + t * 4;
                fc_st_shared_b32(sdS + off,
                                 fc_pack2<T>(acc_dp[nt][2 * hr], acc_dp[nt][2 * hr + 1]));
                if (kSplit)
                    fc_st_shared_b32(sP + off,
                                     fc_pack2<T>(acc_s[nt][2 * hr], acc_s[nt][2 * hr + 1]));
            }
        if constexpr (!kSplit) {
            fc_acc_to_afrag<T>(acc_s, p_frag);
            fc_acc_to_afrag<T>(acc_dp, ds_frag);
        }
        fc_fence_proxy_async();
    }

    // ---- stage: P^T, dS^T in their order of waits, to store_ds ----
    // P^T runs while the dP^T GEMM does; with softcap dS^T needs the tanh's
    // derivative too, so both wait for dP^T and run in one pass. On return
    // both GEMMs are done and dS^T (P^T) is stored (store_ds).
    __device__ __forceinline__ void elementwise(const fc_cuda_bwd_params &p,
                                                float (&acc_s)[NT][4], float (&acc_dp)[NT][4],
                                                const fc_sm90_bwd_qblock &q,
                                                uint32_t (&p_frag)[PK][4],
                                                uint32_t (&ds_frag)[PK][4]) const {
        const fc_sm90_bwd_mods md = mods(p, q);
        keep_bits kb;
        if (md.cap) {
            if (md.drop) draw(p, q, kb);
            fc_wgmma_wait<0>();
            fc_reg_fence(regs<SN / 2>(acc_s));
            fc_reg_fence(regs<SN / 2>(acc_dp));
            probs<false, true>(p, acc_s, acc_dp, q, md, kb);
        } else {
            fc_wgmma_wait<1>();  // S^T done; dP^T may still run
            fc_reg_fence(regs<SN / 2>(acc_s));
            if (md.partial || p.f.alibi)
                probs<false, false>(p, acc_s, acc_dp, q, md, kb);
            else
                probs<true, false>(p, acc_s, acc_dp, q, md, kb);
            if (md.drop) draw(p, q, kb);  // drawn while dP^T runs
            fc_wgmma_wait<0>();
            fc_reg_fence(regs<SN / 2>(acc_dp));
            if (md.drop)
                dscores<true>(p, acc_s, acc_dp, q, kb);
            else
                dscores<false>(p, acc_s, acc_dp, q, kb);
        }
        if (md.partial && !p.f.sink)  // the rule is off with a sink, which takes mass
            single_key_rows(acc_dp, acc_s, q,
                            md.drop ? FC_ONE_KEY_P * p.f.dropout_rescale : FC_ONE_KEY_P);
        store_ds(acc_s, acc_dp, p_frag, ds_frag);
    }

    // ---- stage: dV += P^T dO, dK += dS^T Q (B MN-major: k16 step kk at query row 16 kk) ----
    // Both warpgroups' dS^T (and P^T) are in shared memory, and the bulk
    // reduction of the last dQ tile has read sdQ.
    __device__ __forceinline__ void dq_barrier() const {
        if (tid == 0) fc_bulk_wait_read<0>();
        __syncthreads();
    }

    // acc += A B over the Br queries: A = P^T or dS^T (kSplit: as stored,
    // K-major with the queries contiguous; else the registers in frag).
    __device__ __forceinline__ static void gemm_kq(float (&acc)[KN / 2], uint32_t sa,
                                                   const uint32_t (&frag)[PK][4], uint64_t bt) {
        const uint64_t a = fc_wgmma_desc(sa, 16, 1024);
#pragma unroll
        for (int kk = 0; kk < PK; ++kk) {
            const uint64_t bk = fc_wgmma_desc_add(bt, kk * 16 * 128);
            if constexpr (kSplit)
                fc_wgmma_ss_bmn<KN, T>(acc, fc_wgmma_desc_add(a, fc_kmajor_step(Bc, kk)), bk, 1);
            else
                fc_wgmma_rs<KN, T>(acc, frag[kk], bk, 1);
        }
    }

    // dV, dK as one commit group.
    __device__ __forceinline__ void grads(float (&acc_dk)[DT][4], float (&acc_dv)[DT][4],
                                          const uint32_t (&p_frag)[PK][4],
                                          const uint32_t (&ds_frag)[PK][4],
                                          const fc_sm90_bwd_qblock &q) const {
        const uint64_t do_t = fc_wgmma_desc(q.sdO + (c0 / 64) * Br * 128, Br * 128, 1024);
        const uint64_t q_t = fc_wgmma_desc(q.sQ + (c0 / 64) * Br * 128, Br * 128, 1024);
        fc_wgmma_fence();
        gemm_kq(regs<KN / 2>(acc_dv), sP, p_frag, do_t);
        gemm_kq(regs<KN / 2>(acc_dk), sdS, ds_frag, q_t);
        fc_wgmma_commit();
    }

    // dV, dK are done (the dQ group may still run).
    __device__ __forceinline__ static void wait_grads(float (&acc_dk)[DT][4],
                                                      float (&acc_dv)[DT][4]) {
        fc_wgmma_wait<1>();
        fc_reg_fence(regs<KN / 2>(acc_dk));
        fc_reg_fence(regs<KN / 2>(acc_dv));
    }

    // ---- stage: dQ = dS K, and its reduction into dq_accum ----
    __device__ __forceinline__ void dq_gemm(float (&acc_q)[QT][4]) const {
        fc_wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < QK; ++kk)
            fc_wgmma_ss_mn<DQN, T>(regs<DQN / 2>(acc_q), fc_wgmma_desc_add(ds_desc, kk * 16 * 128),
                                   fc_wgmma_desc_add(kt_desc, kk * 16 * 128), kk > 0);
        fc_wgmma_commit();
    }

    // Every GEMM of the iteration is done, with its registers.
    __device__ __forceinline__ static void wait_all(float (&acc_dk)[DT][4], float (&acc_dv)[DT][4],
                                                    float (&acc_q)[QT][4],
                                                    uint32_t (&p_frag)[PK][4],
                                                    uint32_t (&ds_frag)[PK][4]) {
        fc_wgmma_wait<0>();
        fc_reg_fence(regs<KN / 2>(acc_dk));
        fc_reg_fence(regs<KN / 2>(acc_dv));
        fc_reg_fence(regs<DQN / 2>(acc_q));
        if constexpr (!kSplit) {
            fc_reg_fence(p_frag);
            fc_reg_fence(ds_frag);
        }
    }

    // This thread's part of the dQ tile to the fp32 tile at dst (sdQ, or an
    // sm90ws dQ buffer), fenced for the bulk reduction that reads it.
    __device__ __forceinline__ void store_dq_tile(const float (&acc_q)[QT][4],
                                                  uint32_t dst) const {
#pragma unroll
        for (int qt = 0; qt < QT; ++qt)
#pragma unroll
            for (int hr = 0; hr < 2; ++hr)
                fc_st_shared_v2f(dst + fc_dq_swz_offset<D>(qr + 8 * hr, qc + 8 * qt),
                                 acc_q[qt][2 * hr], acc_q[qt][2 * hr + 1]);
        fc_fence_proxy_async();
    }

    // The scratch row of query block q's dQ tile and its deterministic turn
    // (the visiting key blocks before this one; n_lo: the first that q sees).
    __device__ __forceinline__ fc_sm90_bwd_dq_tile dq_tile(const fc_cuda_bwd_params &p,
                                                           const fc_sm90_bwd_qblock &q,
                                                           int n_lo) const {
        fc_sm90_bwd_dq_tile dq;
        dq.row = (int64_t)q.h * p.rows + blk.row0(p, b) + q.m0;
        dq.turn = n_block - n_lo;
        return dq;
    }

    // The dQ tile to shared memory, where it waits for retire_dq.
    __device__ __forceinline__ void store_dq(const fc_cuda_bwd_params &p,
                                             const float (&acc_q)[QT][4],
                                             const fc_sm90_bwd_qblock &q, int n_lo,
                                             fc_sm90_bwd_dq_tile &dq) const {
        store_dq_tile(acc_q, sdQ);
        dq = dq_tile(p, q, n_lo);
    }

    // The calling thread adds the fp32 dQ tile at src to dq_accum with one
    // bulk reduction (committed, not waited for), in deterministic mode once
    // its turn has come, and then, complete, it passes the turn on.
    __device__ __forceinline__ static void reduce_dq(const fc_cuda_bwd_params &p,
                                                     const fc_sm90_bwd_dq_tile &dq,
                                                     uint32_t src) {
        int32_t *sem = p.sem ? p.sem + dq.row / p.sem_br : nullptr;
        // ">=" as in the sm80 kernel: a wait that ends for any metadata
        if (p.deterministic)
            while (fc_ld_acquire(sem) < dq.turn) {
            }
        fc_bulk_reduce_add_f32(p.dq_accum + dq.row * D, src, Tr::kDQBytes);
        fc_bulk_commit();
        if (p.deterministic) {
            fc_bulk_wait_done<0>();
            __threadfence();
            atomicAdd(sem, 1);
        }
    }

    // Thread 0 adds the waiting dQ tile to dq_accum (reduce_dq). Called after
    // a barrier that follows store_dq.
    __device__ __forceinline__ void retire_dq(const fc_cuda_bwd_params &p,
                                              fc_sm90_bwd_dq_tile &dq) const {
        if (tid == 0 && dq.row >= 0) reduce_dq(p, dq, sdQ);
        dq.row = -1;
    }

    // ---- stage: epilogue, dK * scale, dV through sK / sV to 16-byte stores ----
    // Every wgmma and cp.async is done with sK, sV; sync() is the barrier of
    // the threads that run it (the CTA's, sm90ws: its consumers').
    template <class Sync>
    __device__ __forceinline__ void epilogue(const fc_cuda_bwd_params &p,
                                             const float (&acc_dk)[DT][4],
                                             const float (&acc_dv)[DT][4], Sync sync) const {
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const int r = kr + 8 * hr;
#pragma unroll
            for (int dt = 0; dt < DT; ++dt) {
                const uint32_t off = fc_sw128_offset(Bc, r, c0 / 8 + dt) + t * 4;
                fc_st_shared_b32(sK + off, fc_pack2<T>(acc_dk[dt][2 * hr] * p.ds_scale,
                                                       acc_dk[dt][2 * hr + 1] * p.ds_scale));
                fc_st_shared_b32(sV + off, fc_pack2<T>(acc_dv[dt][2 * hr], acc_dv[dt][2 * hr + 1]));
            }
        }
        sync();
        // not split: y is the KV head
        fc_bwd_store_dkdv<T, Bc, CH, NTH>(p, b, y, blk, tid, sK, sV, [](int r, int ch) {
            return fc_sw128_offset(Bc, r, ch);
        });
    }

    // ---- stage: epilogue of a CTA of the GQA split (kv_split > 1) ----
    // Its dK (unscaled) and dV in fp32 straight from the fragments to part
    // row y of dkv_accum (bwd_params.h); rows past the sequence's keys are left out.
    __device__ __forceinline__ void epilogue_part(const fc_cuda_bwd_params &p,
                                                  const float (&acc_dk)[DT][4],
                                                  const float (&acc_dv)[DT][4]) const {
        const fc_cuda_fwd_params &f = p.f;
        const int64_t parts = (int64_t)(f.heads / f.kv_group) * p.kv_split;
        const int64_t row0 = (f.cu_seqlens_k ? 0 : (int64_t)b * f.seqlen_k) + blk.k_tok0 + blk.j0;
        const int64_t part = (int64_t)y * p.kv_rows + row0;
        const int64_t v_off = parts * p.kv_rows * p.dkv_pitch;
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const int r = kr + 8 * hr;
            if (r >= blk.kv_rows) continue;
            float *dk = p.dkv_accum + (part + r) * p.dkv_pitch + c0 + 2 * t;
#pragma unroll
            for (int dt = 0; dt < DT; ++dt) {
                *reinterpret_cast<float2 *>(dk + dt * 8) =
                    make_float2(acc_dk[dt][2 * hr], acc_dk[dt][2 * hr + 1]);
                *reinterpret_cast<float2 *>(dk + v_off + dt * 8) =
                    make_float2(acc_dv[dt][2 * hr], acc_dv[dt][2 * hr + 1]);
            }
        }
    }
};

// ---- the kernel: the schedule ----
// grid (ceil(max_seqlen_k / Bc), Hk * kv_split, B), or key-major (Hk *
// kv_split, ceil(max_seqlen_k / Bc), B) with key_major (causal only: bwd_params.h),
// block kThreads, dynamic smem kSmemBytes.
template <int D, typename T, bool kCausal>
__global__ void __launch_bounds__(fc_sm90_bwd_traits<D>::kThreads,
                                  fc_sm90_bwd_traits<D>::kCtasPerSm)
    sm90_bwd_kernel(const __grid_constant__ fc_cuda_bwd_params p) {
    using C = fc_sm90_bwd_cta<D, T, kCausal>;
    constexpr int Br = C::Br, Bc = C::Bc, QS = C::QS, MW = C::MW, DQN = C::DQN;
    constexpr bool kSplit = C::kSplit;
    extern __shared__ unsigned char fc_smem[];

    // ---- this thread, and the CTA's key block, KV head and sequence ----
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2;
    const int g = lane >> 2, t = lane & 3;
    // the GQA split: grid row y walks query heads y * split_heads .. of KV head
    // y / kv_split (y is the KV head without a split)
    const fc_bwd_coords cta = fc_bwd_cta_coords<kCausal>(p);
    const int n_block = cta.n, y = cta.y, b = cta.b;

    // ---- this sequence, key block and the query blocks (of its heads) it walks ----
    fc_bwd_block blk = {};
    if (!blk.template init<Br, Bc, kCausal>(p, b, n_block, p.split_heads)) return;
    const int n_iters = blk.n_iters;
    const fc_mask<kCausal> mask(blk.sq, blk.sk, p.f.window_left, p.f.window_right);
    C c(tid, g, t, n_block, y, b, blk, mask, fc_smem);

    // the dK/dV sum or dQ kernel after this one may place its CTAs once
    // every CTA of this grid runs (they wait for its end)
    fc_pdl_launch_dependents();
    c.load_kv(p);
    fc_pdl_wait();   // fc_bwd_pre_kernel's lse2, delta and zeroed dq_accum
    c.load_q(p, 0);  // with K, V: group 0

    // ---- this warpgroup's part and its wgmma descriptors ----
    // (fc_sm90_bwd_cta::part, written out: see the head of the file)
    c.k0 = kSplit ? 0 : wg * 64;
    c.q0 = kSplit ? wg * C::SN : 0;
    c.c0 = kSplit ? wg * C::KN : 0;
    c.k_desc = fc_wgmma_desc(c.sK + c.k0 * 128, 16, 1024);
    c.v_desc = fc_wgmma_desc(c.sV + c.k0 * 128, 16, 1024);
    c.ds_desc = fc_wgmma_desc(c.sdS + (wg % MW) * Bc * 128, Bc * 128, 1024);
    c.kt_desc = fc_wgmma_desc(c.sK + (wg / MW) * (DQN / 64) * Bc * 128, Bc * 128, 1024);
    float acc_dk[C::DT][4], acc_dv[C::DT][4];
#pragma unroll
    for (int dt = 0; dt < C::DT; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_dk[dt][e] = acc_dv[dt][e] = 0.0f;
    c.kr = c.k0 + (warp & 3) * 16 + g;
    c.qr = (wg % MW) * 64 + (warp & 3) * 16 + g;
    c.qc = (wg / MW) * DQN + 2 * t;

    // ---- the walk: one query block per iteration ----
    fc_sm90_bwd_dq_tile dq = {0, -1};
    for (int it = 0; it < n_iters; ++it) {
        const fc_sm90_bwd_qblock q = c.qblock(p, it, it);
        c.wait_tiles();
        c.retire_dq(p, dq);
        int n_lo, n_hi;  // fc_sm90_bwd_cta::visits, written out
        const bool visits = mask.template tiles<Bc>(q.m0, q.m0 + q.rows - 1, &n_lo, &n_hi) &&
                            n_block >= n_lo && n_block < n_hi;
        if (!visits) {
            c.load_q(p, it + 1);
            continue;
        }

        float acc_s[C::NT][4], acc_dp[C::NT][4];
        c.scores(acc_s, acc_dp, q);
        // two slots: the next query block into the free one, issued while the
        // GEMMs run (one slot: once dV, dK are done with it, below)
        if (QS == 2) c.load_q(p, it + 1);

        // element-wise: fc_sm90_bwd_cta::elementwise, written out here (as a
        // call the SASS of this kernel changed: see the head of the file)
        uint32_t p_frag[C::PK][4], ds_frag[C::PK][4];
        {
            const fc_sm90_bwd_mods md = c.mods(p, q);
            typename C::keep_bits kb;
            if (md.cap) {
                if (md.drop) c.draw(p, q, kb);
                fc_wgmma_wait<0>();
                fc_reg_fence(C::template regs<C::SN / 2>(acc_s));
                fc_reg_fence(C::template regs<C::SN / 2>(acc_dp));
                c.template probs<false, true>(p, acc_s, acc_dp, q, md, kb);
            } else {
                fc_wgmma_wait<1>();  // S^T done; dP^T may still run
                fc_reg_fence(C::template regs<C::SN / 2>(acc_s));
                if (md.partial || p.f.alibi)
                    c.template probs<false, false>(p, acc_s, acc_dp, q, md, kb);
                else
                    c.template probs<true, false>(p, acc_s, acc_dp, q, md, kb);
                if (md.drop) c.draw(p, q, kb);  // drawn while dP^T runs
                fc_wgmma_wait<0>();
                fc_reg_fence(C::template regs<C::SN / 2>(acc_dp));
                if (md.drop)
                    c.template dscores<true>(p, acc_s, acc_dp, q, kb);
                else
                    c.template dscores<false>(p, acc_s, acc_dp, q, kb);
            }
            if (md.partial && !p.f.sink)  // the rule is off with a sink, which takes mass
                c.single_key_rows(acc_dp, acc_s, q,
                                  md.drop ? FC_ONE_KEY_P * p.f.dropout_rescale : FC_ONE_KEY_P);
            c.store_ds(acc_s, acc_dp, p_frag, ds_frag);
        }

        // kSplit: both warpgroups' halves of P^T, dS^T must be stored before
        // dV, dK; the dQ GEMM needs the whole dS^T either way.
        if (kSplit) c.dq_barrier();
        c.grads(acc_dk, acc_dv, p_frag, ds_frag, q);
        if (!kSplit) c.dq_barrier();
        float acc_q[C::QT][4];
        c.dq_gemm(acc_q);
        if (QS == 1) {
            // both warpgroups' dV, dK are done with the slot: the next query block
            c.wait_grads(acc_dk, acc_dv);
            __syncthreads();
            c.load_q(p, it + 1);
        }
        c.wait_all(acc_dk, acc_dv, acc_q, p_frag, ds_frag);
        c.store_dq(p, acc_q, q, n_lo, dq);
    }

    // ---- the epilogue ----
    // Every copy has landed before the epilogue reuses sK, sV: only empty groups
    // remain after a walk, but a CTA that walked no query block (n_iters = 0, a
    // key block outside every row's window) never waited for group 0.
    fc_cp_async_wait<0>();
    __syncthreads();  // the last dQ tile is complete; every wgmma is done with sK, sV
    c.retire_dq(p, dq);
    if (tid == 0) fc_bulk_wait_read<0>();
    if (p.kv_split > 1)
        c.epilogue_part(p, acc_dk, acc_dv);
    else
        c.epilogue(p, acc_dk, acc_dv, [] { __syncthreads(); });
}

// ---- the launcher of one instance (instantiated in inst/*.cu) ----
// Sets the dynamic shared memory limit once per device, then launches on
// `stream`, as a programmatic dependent launch: the CTAs start while the
// preprocessing kernel's last ones run, load K and V, and wait for it (ptx.cuh
// fc_pdl_wait) before the first query block. Returns the launch's
// cudaError_t; never synchronises.
template <int D, typename T, bool kCausal>
cudaError_t sm90_bwd_launch(const fc_cuda_bwd_params &p, dim3 grid, cudaStream_t stream) {
    using Tr = fc_sm90_bwd_traits<D>;
    static std::atomic<uint64_t> smem_set{0};  // bit d: the limit is raised on device d
    return fc_launch_kernel(sm90_bwd_kernel<D, T, kCausal>, &smem_set, Tr::kSmemBytes,
                            Tr::kThreads, grid, stream, p, true);
}

#endif  // FLASHC_CUDA_SM90_BWD_KERNEL_CUH
