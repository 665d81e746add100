// bwd_kernel.cuh : the sm90 (Hopper, sm_90a) attention backward: the
// FlashAttention-2 work split (Dao 2023, Algorithm 2: key blocks parallel,
// query blocks a loop) on warpgroup MMAs, with FlashAttention-3's operand
// arrangement (Shah et al. 2024, §3 and App. B: the S and dP GEMMs swapped so
// the keys are wgmma's M side, dV and dK from registers, dQ reduced in bulk).
//
// A CTA of two warpgroups owns the key block Kj, Vj (Bc rows of one KV head
// hk of one sequence) and keeps dKj, dVj in registers while it walks every
// query block Qi (Br rows) of every query head of hk's group (GQA sums in
// place: dK, dV written once):
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
// query block loads once dV and dK are done with the slot, while dQ computes. dS^T goes to shared memory [key][query] for the dQ
// GEMM. Within a warpgroup the exponentials of P^T run while the dP^T GEMM
// does (and with dropout the keep bits are drawn then too), and dV, dK run
// with the dQ GEMM.
//
// Deterministic mode: as the sm80 kernel, a turn counter per (head, query
// block); the issuing thread waits its turn, adds, waits for the bulk
// reduction to complete and releases the next key block.
//
// Template parameters: the head dim D (a row of traits.h FC_SM90_BWD_TILES),
// the dtype T, kCausal. Everything else is a field of bwd_params.h.
#ifndef FLASHC_CUDA_SM90_BWD_KERNEL_CUH
#define FLASHC_CUDA_SM90_BWD_KERNEL_CUH

#include <cuda_runtime.h>

#include <atomic>
#include <type_traits>

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

// ---- the kernel ----
// grid (ceil(max_seqlen_k / Bc), Hk, B), block 256, dynamic smem kSmemBytes.
template <int D, typename T, bool kCausal>
__global__ void __launch_bounds__(256, 1)
    sm90_bwd_kernel(const __grid_constant__ fc_cuda_bwd_params p) {
    using Tr = fc_sm90_bwd_traits<D>;
    constexpr int Br = Tr::kBr, Bc = Tr::kBc, NTH = Tr::kThreads, CH = Tr::kChunks;
    constexpr int QS = Tr::kQStages, MW = Tr::kMW, DQN = Tr::kDQN;
    constexpr int SN = Tr::kSN, KN = Tr::kKN;
    constexpr bool kSplit = Tr::kColSplit;
    constexpr int NT = SN / 8;   // 8-query tiles of S^T per row
    constexpr int DT = KN / 8;   // 8-column tiles of dK, dV per row
    constexpr int QT = DQN / 8;  // 8-column tiles of this warpgroup's dQ
    constexpr int KS = D / 16;   // k16 steps of S^T, dP^T
    constexpr int PK = Br / 16;  // k16 steps of dV, dK
    constexpr int QK = Bc / 16;  // k16 steps of dQ
    const fc_cuda_fwd_params &f = p.f;

    extern __shared__ unsigned char fc_smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2;
    const int g = lane >> 2, t = lane & 3;
    const int n_block = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;

    // ---- this sequence, key block and the query blocks it walks ----
    fc_bwd_block blk = {};
    if (!blk.template init<Br, Bc, kCausal>(p, b, n_block)) return;
    const int sq = blk.sq, sk = blk.sk, j0 = blk.j0, n_iters = blk.n_iters;
    const fc_mask<kCausal> mask(sq, sk, f.window_left, f.window_right);

    // ---- shared memory (1024-aligned) ----
    const uint32_t sK = (fc_smem_u32(fc_smem) + 1023u) & ~1023u;  // [Bc][D]
    const uint32_t sV = sK + Tr::kKVBytes;                          // [Bc][D]
    const uint32_t sQ = sV + Tr::kKVBytes;                          // [QS][Br][D]
    const uint32_t sdO = sQ + QS * Tr::kQBytes;                     // [QS][Br][D]
    const uint32_t sdS = sdO + QS * Tr::kQBytes;                    // [Bc][Br]
    const uint32_t sP = sdS + Tr::kDSBytes;                         // [Bc][Br] (kSplit)
    const uint32_t sdQ = sP + Tr::kPBytes;                          // [Br][D] f32
    const uint32_t sLse = sdQ + Tr::kDQBytes;                       // [QS][Br] f32
    const uint32_t sDelta = sLse + QS * Br * 4;                     // [QS][Br] f32

    using Ld = fc_tile_loader<T, NTH, CH>;
    static_assert(Ld::RPP % 8 == 0, "loader rows must keep the swizzle phase");
    constexpr uint32_t LD_STEP = Ld::RPP * 128;

    // ---- K, V once ----
    {
        const Ld ld(tid, f.head_dim, Bc, sk);
        const uint32_t dst = fc_sw128_offset(Bc, ld.row, ld.ch);
        fc_bwd_load_kv<Ld, Bc, T>(ld, p, b, hk, blk, sK + dst, sV + dst, LD_STEP);
    }
    // Q, dO, lse2, delta of iteration `it` into slot it % QS (one commit)
    auto load_q = [&](int it) {
        fc_bwd_load_q<Ld, Br, QS, NTH, T>(p, b, hk, blk, tid, it, sQ, sdO, Tr::kQBytes, LD_STEP,
                                          sLse, sDelta,
                                          [](int row, int ch) { return fc_sw128_offset(Br, row, ch); });
    };
    load_q(0);  // with K, V: group 0

    // ---- this warpgroup's part and wgmma descriptors (wgmma.cuh layouts) ----
    const int k0 = kSplit ? 0 : wg * 64;   // its first key row of S^T, dP^T, dK, dV
    const int q0 = kSplit ? wg * SN : 0;   // its first query column of S^T, dP^T
    const int c0 = kSplit ? wg * KN : 0;   // its first column of dK, dV
    // S^T, dP^T: A = 64 rows of K / V (K-major), B = Q / dO (K-major)
    const uint64_t k_desc = fc_wgmma_desc(sK + k0 * 128, 16, 1024);
    const uint64_t v_desc = fc_wgmma_desc(sV + k0 * 128, 16, 1024);
    // dQ: A = dS^T's query block wg % MW, B = K's column blocks of part wg / MW (both MN-major)
    const uint64_t ds_desc = fc_wgmma_desc(sdS + (wg % MW) * Bc * 128, Bc * 128, 1024);
    const uint64_t kt_desc = fc_wgmma_desc(sK + (wg / MW) * (DQN / 64) * Bc * 128, Bc * 128, 1024);

    float acc_dk[DT][4], acc_dv[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_dk[dt][e] = acc_dv[dt][e] = 0.0f;
    float(&dk_regs)[KN / 2] = *reinterpret_cast<float(*)[KN / 2]>(&acc_dk[0][0]);
    float(&dv_regs)[KN / 2] = *reinterpret_cast<float(*)[KN / 2]>(&acc_dv[0][0]);

    const int kr = k0 + (warp & 3) * 16 + g;       // key row (in the block) of element 0
    const int qr = (wg % MW) * 64 + (warp & 3) * 16 + g;  // dQ: query row of element 0
    const int qc = (wg / MW) * DQN + 2 * t;               // dQ: column of element 0

    // The dQ tile of a visiting iteration waits in sdQ for the next
    // iteration's first barrier; then thread 0 adds it to dq_accum (waiting
    // its turn in deterministic mode).
    int64_t dq_row = -1;  // scratch row of the waiting tile, or -1
    int dq_turn = 0;      // its turn: the visiting key blocks before this one
    auto retire = [&] {
        if (tid == 0 && dq_row >= 0) {
            int32_t *sem = p.sem ? p.sem + dq_row / p.sem_br : nullptr;
            // ">=" as in the sm80 kernel: a wait that ends for any metadata
            if (p.deterministic)
                while (fc_ld_acquire(sem) < dq_turn) {
                }
            fc_bulk_reduce_add_f32(p.dq_accum + dq_row * D, sdQ, Tr::kDQBytes);
            fc_bulk_commit();
            if (p.deterministic) {
                fc_bulk_wait_done<0>();
                __threadfence();
                atomicAdd(sem, 1);
            }
        }
        dq_row = -1;
    };

    for (int it = 0; it < n_iters; ++it) {
        int h, m;
        blk.iter_hm(f, hk, it, &h, &m);
        const int m0 = m * Br, rows = min(Br, sq - m0);
        const uint32_t slot = (uint32_t)(it % QS);
        const uint32_t sQs = sQ + slot * Tr::kQBytes, sdOs = sdO + slot * Tr::kQBytes;

        // this iteration's Q, dO, lse2, delta (and K, V at it = 0) have landed
        // and are visible to wgmma (the only group in flight, loaded during
        // the last iteration); the last iteration's dQ tile is complete and,
        // with two slots, the last iteration's slot is free for the next one
        fc_cp_async_wait<0>();
        fc_fence_proxy_async();
        __syncthreads();
        retire();

        int n_lo, n_hi;
        const bool visits = mask.template tiles<Bc>(m0, m0 + rows - 1, &n_lo, &n_hi) &&
                            n_block >= n_lo && n_block < n_hi;
        if (!visits) {
            load_q(it + 1);
            continue;
        }

        // ---- S^T = K Q^T, dP^T = V dO^T ----
        float acc_s[NT][4], acc_dp[NT][4];
        float(&s_regs)[SN / 2] = *reinterpret_cast<float(*)[SN / 2]>(&acc_s[0][0]);
        float(&dp_regs)[SN / 2] = *reinterpret_cast<float(*)[SN / 2]>(&acc_dp[0][0]);
        {
            // acc = A B^T over D (A: 64 key rows, B: SN query rows), one commit group
            auto scores = [&](float(&acc)[SN / 2], uint64_t a, uint64_t b) {
#pragma unroll
                for (int ks = 0; ks < KS; ++ks)
                    fc_wgmma_ss<SN, T>(acc, fc_wgmma_desc_add(a, fc_kmajor_step(Bc, ks)),
                                       fc_wgmma_desc_add(b, fc_kmajor_step(Br, ks)), ks > 0);
                fc_wgmma_commit();
            };
            fc_wgmma_fence();
            scores(s_regs, k_desc, fc_wgmma_desc(sQs + q0 * 128, 16, 1024));
            scores(dp_regs, v_desc, fc_wgmma_desc(sdOs + q0 * 128, 16, 1024));
        }
        // two slots: the next query block into the free one, issued while the
        // GEMMs run (one slot: once dV, dK are done with it, below)
        if (QS == 2) load_q(it + 1);

        // ---- P^T, dS^T elementwise (rows: keys, columns: queries) ----
        // P^T runs while the dP^T GEMM does; with softcap dS^T needs the
        // tanh's derivative too, so both wait for dP^T and run in one pass.
        uint32_t p_frag[PK][4], ds_frag[PK][4];
        {
            const bool partial = mask.template tile_partial<Bc>(m0, m0 + rows - 1, j0);
            const float slope_x =
                f.alibi ? f.alibi[(int64_t)b * f.alibi_s_batch + h] * f.alibi_scale : 0.0f;
            const bool cap = f.softcap_pre != 0.0f, drop = f.dropout != 0;
            // dropout: the forward's keep bits of element (nt, e) (dropout.cuh),
            // drawn while the dP^T GEMM runs
            uint32_t kb[(NT + 7) / 8];
            auto keep = [&](int nt, int e) { return (kb[nt / 8] >> ((nt % 8) * 4 + e)) & 1u; };
            auto draw = [&] {
                const uint32_t bh = (uint32_t)b * (uint32_t)f.heads + (uint32_t)h;
#pragma unroll
                for (int pr = 0; pr < NT / 2; ++pr) {
                    const uint32_t k2 = fc_dropout_keep_t2(f.dropout_seed, f.dropout_offset,
                                                           f.dropout_threshold, bh,
                                                           m0 + q0 + 16 * pr, j0 + kr - g, g, t);
                    kb[pr / 4] = (pr % 4 ? kb[pr / 4] : 0u) | k2 << (8 * (pr % 4));
                }
            };
            // With dropout (k the keep bit, rs = 1 / (1 - p)): dS^T uses P^T and
            // dP^T o k rs, and P^T becomes P^T o k rs for dV.
            auto dropped = [&](int nt, int e, float pr, float dp, float *pd) {
                const bool k = keep(nt, e);
                *pd = k ? pr * f.dropout_rescale : 0.0f;
                return k ? dp * f.dropout_rescale : 0.0f;
            };
            // P^T into acc_s; with `ds` also dS^T into acc_dp (and P^T with
            // dropout applied into acc_s). kPlain: no softcap, ALiBi, element
            // mask or dropout, the common case, kept free of branches so that
            // its code stays short and contiguous.
            auto probs = [&](auto plain, bool ds) {
                constexpr bool kPlain = decltype(plain)::value;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    const int c = q0 + 8 * nt + 2 * t;  // tile column (query) of element pair 0
                    const float2 l2 = fc_ld_shared_v2f(sLse + (slot * Br + c) * 4);
                    const float2 dl = fc_ld_shared_v2f(sDelta + (slot * Br + c) * 4);
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int i = m0 + c + (e & 1);        // query row in the sequence
                        const int j = j0 + kr + 8 * (e >> 1);  // key
                        float x = acc_s[nt][e], dt = 1.0f;
                        if (!kPlain && cap) {
                            x = fc_softcap1(x, f.softcap_pre);
                            dt = 1.0f - x * x;
                        }
                        if (!kPlain && f.alibi)
                            x = fmaf(-slope_x, fabsf((float)(mask.diag(i) - j)), x);
                        float pr = fc_exp2(fmaf(x, f.score_scale_log2, -((e & 1) ? l2.y : l2.x)));
                        if (!kPlain && partial && (j < mask.lo(i) || j >= mask.hi(i))) pr = 0.0f;
                        acc_s[nt][e] = pr;
                        if (ds) {
                            float dp = acc_dp[nt][e];
                            if (!kPlain && drop) dp = dropped(nt, e, pr, dp, &acc_s[nt][e]);
                            acc_dp[nt][e] = pr * (dp - ((e & 1) ? dl.y : dl.x)) * dt;
                        }
                    }
                }
            };
            constexpr std::true_type kPlainPath{};
            constexpr std::false_type kAnyPath{};
            if (cap) {
                if (drop) draw();
                fc_wgmma_wait<0>();
                fc_reg_fence(s_regs);
                fc_reg_fence(dp_regs);
                probs(kAnyPath, true);
            } else {
                fc_wgmma_wait<1>();  // S^T done; dP^T may still run
                fc_reg_fence(s_regs);
                if (partial || f.alibi)
                    probs(kAnyPath, false);
                else
                    probs(kPlainPath, false);
                if (drop) draw();
                fc_wgmma_wait<0>();
                fc_reg_fence(dp_regs);
                auto dscores = [&](auto dropout) {
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) {
                        const float2 dl =
                            fc_ld_shared_v2f(sDelta + (slot * Br + q0 + 8 * nt + 2 * t) * 4);
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            const float pr = acc_s[nt][e];
                            float dp = acc_dp[nt][e];
                            if (decltype(dropout)::value) dp = dropped(nt, e, pr, dp, &acc_s[nt][e]);
                            acc_dp[nt][e] = pr * (dp - ((e & 1) ? dl.y : dl.x));
                        }
                    }
                };
                if (drop)
                    dscores(std::true_type{});
                else
                    dscores(std::false_type{});
            }
            // A row (query) that sees one key has P = 1 there and dS = 0 exactly (a
            // softmax over one element; Delta from the rounded O would leave a
            // residue). Such a row makes every tile it meets partial.
            if (partial) {
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int i = m0 + q0 + 8 * nt + 2 * t + (e & 1);
                        if (max(mask.lo(i), 0) + 1 == mask.hi(i)) acc_dp[nt][e] = 0.0f;
                    }
            }
            // dS^T (and with kSplit P^T) to shared memory [key][query]: the C
            // fragment pairs of 8-query tile nt are chunk q0 / 8 + nt of their rows
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int hr = 0; hr < 2; ++hr) {
                    const uint32_t off = fc_sw128_offset(Bc, kr + 8 * hr, q0 / 8 + nt) + t * 4;
                    fc_st_shared_b32(sdS + off, fc_pack2<T>(acc_dp[nt][2 * hr], acc_dp[nt][2 * hr + 1]));
                    if (kSplit)
                        fc_st_shared_b32(sP + off, fc_pack2<T>(acc_s[nt][2 * hr], acc_s[nt][2 * hr + 1]));
                }
            if constexpr (!kSplit) {
                // the A fragments of dV += P^T dO, dK += dS^T Q
                fc_acc_to_afrag<T>(acc_s, p_frag);
                fc_acc_to_afrag<T>(acc_dp, ds_frag);
            }
            fc_fence_proxy_async();
        }

        // ---- dV += P^T dO, dK += dS^T Q (B MN-major: k16 step kk at query row 16 kk) ----
        // kSplit: both warpgroups' halves of P^T, dS^T must be stored first;
        // the dQ GEMM below needs the whole dS^T either way, and the bulk
        // reduction of the last dQ tile must have read sdQ.
        auto dq_barrier = [&] {
            if (tid == 0) fc_bulk_wait_read<0>();
            __syncthreads();
        };
        if (kSplit) dq_barrier();
        {
            const uint64_t do_t = fc_wgmma_desc(sdOs + (c0 / 64) * Br * 128, Br * 128, 1024);
            const uint64_t q_t = fc_wgmma_desc(sQs + (c0 / 64) * Br * 128, Br * 128, 1024);
            fc_wgmma_fence();
            // acc += A B over the Br queries: A = P^T or dS^T (kSplit: as
            // stored, K-major with the queries contiguous; else registers)
            auto grads = [&](float(&acc)[KN / 2], uint32_t sa, const uint32_t(&frag)[PK][4],
                             uint64_t bt) {
                const uint64_t a = fc_wgmma_desc(sa, 16, 1024);
#pragma unroll
                for (int kk = 0; kk < PK; ++kk) {
                    const uint64_t b = fc_wgmma_desc_add(bt, kk * 16 * 128);
                    if constexpr (kSplit)
                        fc_wgmma_ss_bmn<KN, T>(acc, fc_wgmma_desc_add(a, fc_kmajor_step(Bc, kk)), b, 1);
                    else
                        fc_wgmma_rs<KN, T>(acc, frag[kk], b, 1);
                }
            };
            grads(dv_regs, sP, p_frag, do_t);
            grads(dk_regs, sdS, ds_frag, q_t);
            fc_wgmma_commit();
        }

        // ---- dQ = dS K ----
        if (!kSplit) dq_barrier();
        float acc_q[QT][4];
        float(&q_regs)[DQN / 2] = *reinterpret_cast<float(*)[DQN / 2]>(&acc_q[0][0]);
        fc_wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < QK; ++kk)
            fc_wgmma_ss_mn<DQN, T>(q_regs, fc_wgmma_desc_add(ds_desc, kk * 16 * 128),
                                   fc_wgmma_desc_add(kt_desc, kk * 16 * 128), kk > 0);
        fc_wgmma_commit();
        if (QS == 1) {
            // both warpgroups' dV, dK are done with the slot: the next query block
            fc_wgmma_wait<1>();
            fc_reg_fence(dk_regs);
            fc_reg_fence(dv_regs);
            __syncthreads();
            load_q(it + 1);
        }
        fc_wgmma_wait<0>();
        fc_reg_fence(dk_regs);
        fc_reg_fence(dv_regs);
        fc_reg_fence(q_regs);
        if constexpr (!kSplit) {
            fc_reg_fence(p_frag);
            fc_reg_fence(ds_frag);
        }

        // the dQ tile to shared memory, for retire()
#pragma unroll
        for (int qt = 0; qt < QT; ++qt)
#pragma unroll
            for (int hr = 0; hr < 2; ++hr)
                fc_st_shared_v2f(sdQ + fc_dq_swz_offset<D>(qr + 8 * hr, qc + 8 * qt),
                                 acc_q[qt][2 * hr], acc_q[qt][2 * hr + 1]);
        fc_fence_proxy_async();
        dq_row = (int64_t)h * p.rows + blk.row0(p, b) + m0;
        dq_turn = n_block - n_lo;
    }
    // Every copy has landed before the epilogue reuses sK, sV: only empty groups
    // remain after a walk, but a CTA that walked no query block (n_iters = 0, a
    // key block outside every row's window) never waited for group 0.
    fc_cp_async_wait<0>();
    __syncthreads();  // the last dQ tile is complete; every wgmma is done with sK, sV
    retire();
    if (tid == 0) fc_bulk_wait_read<0>();

    // ---- epilogue: dK * scale, dV through sK / sV to 16-byte stores ----
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
    __syncthreads();
    fc_bwd_store_dkdv<T, Bc, CH, NTH>(p, b, hk, blk, tid, sK, sV, [](int r, int ch) {
        return fc_sw128_offset(Bc, r, ch);
    });
}

// ---- the launcher of one instance (instantiated in inst/*.cu) ----
// Sets the dynamic shared memory limit once per device, then launches on
// `stream`. Returns the launch's cudaError_t; never synchronises.
template <int D, typename T, bool kCausal>
cudaError_t sm90_bwd_launch(const fc_cuda_bwd_params &p, dim3 grid, cudaStream_t stream) {
    using Tr = fc_sm90_bwd_traits<D>;
    static std::atomic<uint64_t> smem_set{0};  // bit d: the limit is raised on device d
    return fc_launch_kernel(sm90_bwd_kernel<D, T, kCausal>, &smem_set, Tr::kSmemBytes,
                            Tr::kThreads, grid, stream, p);
}

#endif  // FLASHC_CUDA_SM90_BWD_KERNEL_CUH
