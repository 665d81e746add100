// bwd_kernel.cuh : the sm90ws backward: the sm90 backward's math
// (sm90/bwd_kernel.cuh: fc_sm90_bwd_cta's stages, the same split of S^T, dP^T,
// dV, dK and dQ over two warpgroups) on FlashAttention-3's warp
// specialisation (Shah et al. 2024, §3.1 and App. B.1):
//
//   consumers  warpgroups 0 and 1, registers raised to 240 (setmaxnreg): the
//              sm90 kernel's two warpgroups less every per-iteration load and
//              every dQ reduction. They load K, V once (cp.async, zero past
//              the keys), wait for each query block on a transaction barrier
//              and meet at named barrier FC_BWS_BAR (their 256 threads) only
//              where the warpgroups exchange data: dS^T (and P^T) stored
//              before dV, dK or dQ read them, and the one dS^T buffer free
//              (every dQ GEMM of the last block done) before the next is
//              stored
//   producer   warp 8 (warpgroup 2, registers lowered to 24): Q and dO of each
//              query block by TMA (lane 0; ws_params.h tma_q, tma_do), lse2
//              and delta by 4-byte cp.async of its 32 lanes (a varlen
//              sequence's scratch rows start at any float), into a ring of
//              kQStages slots. full[s] completes when the TMA bytes have
//              landed and each lane's cp.async have (count 1 + 32: lane 0's
//              expect_tx and the lanes' cp.async.mbarrier.arrive.noinc);
//              empty[s] when the 256 consumer threads are done with the slot
//              (after dV, dK with one stage, after the dQ GEMM with two)
//   dQ writer  warp 9, lane 0: the consumers store each dQ tile (fp32, the
//              sm90 kernel's swizzle) to buffer v % kDQBufs and arrive on its
//              dq_full (count 256); the writer adds it to dq_accum with one
//              bulk reduction (deterministic: in its turn, completed, then the
//              turn passed on: fc_sm90_bwd_cta::reduce_dq), waits until the
//              reduction has read the buffer and arrives on its dq_empty
//              (count 1). The consumers wait for a buffer only when the writer
//              is kDQBufs tiles behind; the deterministic turn wait stalls the
//              writer, not warpgroup 0
//   warps 10, 11 lower their registers and exit.
//
// The three roles walk the same iterations (fc_bwd_block) and skip the same
// query blocks, those that do not see the key block (fc_sm90_bwd_cta::visits),
// so the v-th visited block (v counted per CTA) uses Q slot v % kQStages and
// dQ buffer v % kDQBufs, each for the (v / n)-th time: its full barrier's
// phase of parity (v / n) & 1, its empty barrier's of the use before.
//
// Rows past a sequence: TMA fills rows past the operand's end with zeros, which
// covers the batched layout (its row axis is Sq). In a varlen batch the rows
// past a sequence are the next one's or no sequence's (maybe not finite), so
// the consumers zero them in the slot when the block is a sequence's last,
// partial one, as the sm90 kernel's loader does: lse2 = +inf on the pad rows
// makes P = 0 there only when the scores are finite.
//
// Template parameters and arguments: as the sm90 kernel (fc_cuda_bwd_params,
// in fc_cuda_bwd_ws_params with the two TMA descriptors). bwd.cu runs it for
// the sm90 family unless FLASHC_CUDA_BWD_WS=0 or fc_bwd_ws_refusal.
//
// Not here: dS^T in two buffers (FA3's D <= 128: the consumers would meet once
// per block, not twice), TMA loads of K, V, a persistent scheduler.
#ifndef FLASHC_CUDA_SM90WS_BWD_KERNEL_CUH
#define FLASHC_CUDA_SM90WS_BWD_KERNEL_CUH

#include <cuda_runtime.h>

#include <atomic>

#include "../common/tma.cuh"
#include "../sm90/bwd_kernel.cuh"
#include "../ws_params.h"

// Named barrier of the consumers' 256 threads (0 is __syncthreads).
enum { FC_BWS_BAR = 1 };

// grid as the sm90 kernel's (key-major with key_major), block kThreads (384),
// dynamic smem kSmemBytes.
template <int D, typename T, bool kCausal>
__global__ void __launch_bounds__(fc_sm90ws_bwd_traits<D>::kThreads, 1)
    sm90ws_bwd_kernel(const __grid_constant__ fc_cuda_bwd_ws_params P) {
    const fc_cuda_bwd_params &p = P.b;
    using Tr = fc_sm90ws_bwd_traits<D>;
    using C = fc_sm90_bwd_cta<D, T, kCausal>;
    constexpr int Br = C::Br, Bc = C::Bc, QS = C::QS, CH = C::CH, DQB = Tr::kDQBufs;
    constexpr int CT = Tr::kConsumerThreads, CB = D / 64;  // consumer threads, TMA boxes a row
    constexpr uint32_t QB = C::Tr::kQBytes, DQ = C::Tr::kDQBytes;
    constexpr bool kSplit = C::kSplit;
    extern __shared__ unsigned char fc_smem[];

    // ---- this thread, and the CTA's key block, KV head and sequence (as sm90) ----
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2;
    const int g = lane >> 2, t = lane & 3;
    const fc_bwd_coords cta = fc_bwd_cta_coords<kCausal>(p);
    const int n_block = cta.n, y = cta.y, b = cta.b;
    fc_bwd_block blk = {};
    if (!blk.template init<Br, Bc, kCausal>(p, b, n_block, p.split_heads)) return;
    const int n_iters = blk.n_iters;
    const fc_mask<kCausal> mask(blk.sq, blk.sk, p.f.window_left, p.f.window_right);
    C c(tid, g, t, n_block, y, b, blk, mask, fc_smem);

    // ---- past the sm90 kernel's shared memory: dQ buffers 1.., the barriers ----
    const uint32_t s_end = c.sDelta + QS * Br * 4;  // 256-byte aligned
    const uint32_t bar = s_end + (DQB - 1) * DQ;
    auto dq_buf = [&](int i) { return i == 0 ? c.sdQ : s_end + (uint32_t)(i - 1) * DQ; };
    auto full = [&](uint32_t s) { return bar + 8u * s; };
    auto empty = [&](uint32_t s) { return bar + 8u * (QS + s); };
    auto dq_full = [&](int i) { return bar + 8u * (uint32_t)(2 * QS + i); };
    auto dq_empty = [&](int i) { return bar + 8u * (uint32_t)(2 * QS + DQB + i); };
    if (tid == 0) {
        for (int s = 0; s < QS; ++s) {
            fc_mbar_init(full(s), 1 + 32);
            fc_mbar_init(empty(s), CT);
        }
        for (int i = 0; i < DQB; ++i) {
            fc_mbar_init(dq_full(i), CT);
            fc_mbar_init(dq_empty(i), 1);
        }
        fc_mbar_init_fence();
    }
    __syncthreads();  // the last CTA-wide barrier: warps 10, 11 exit below

    // ---- warpgroup 2: the producer warp and the dQ writer ----
    if (wg == 2) {
        fc_setmaxnreg_dec<Tr::kProducerRegs>();
        if (warp == 8) {
            if (lane == 0) {
                fc_tma_prefetch_map(&P.tma_q);
                fc_tma_prefetch_map(&P.tma_do);
            }
            const int nb = p.f.cu_seqlens_q ? 0 : b;  // the descriptors' batch coordinate
            int v = 0;
            for (int it = 0; it < n_iters; ++it) {
                const fc_sm90_bwd_qblock q = c.qblock(p, it, v);
                int n_lo;
                if (!c.visits(q, &n_lo)) continue;
                if (v >= QS) fc_mbar_wait(empty(q.slot), (uint32_t)((v / QS - 1) & 1));
                const int64_t srow = (int64_t)q.h * p.rows + blk.row0(p, b) + q.m0;
                for (int r = lane; r < Br; r += 32) {
                    fc_cp_async_4(c.sLse + (q.slot * Br + r) * 4, p.lse2 + srow + r);
                    fc_cp_async_4(c.sDelta + (q.slot * Br + r) * 4, p.delta + srow + r);
                }
                fc_mbar_arrive_cp_async(full(q.slot));
                if (lane == 0) {
                    const int row = (int)blk.q_tok0 + q.m0;
                    fc_mbar_arrive_expect_tx(full(q.slot), 2 * QB);
#pragma unroll
                    for (int cb = 0; cb < CB; ++cb) {
                        fc_tma_load_4d(q.sQ + cb * Br * 128, &P.tma_q, full(q.slot), cb * 64, q.h,
                                       row, nb);
                        fc_tma_load_4d(q.sdO + cb * Br * 128, &P.tma_do, full(q.slot), cb * 64,
                                       q.h, row, nb);
                    }
                }
                ++v;
            }
        } else if (warp == 9 && lane == 0) {
            int v = 0;
            for (int it = 0; it < n_iters; ++it) {
                const fc_sm90_bwd_qblock q = c.qblock(p, it, v);
                int n_lo;
                if (!c.visits(q, &n_lo)) continue;
                const int i = v % DQB;
                fc_mbar_wait(dq_full(i), (uint32_t)((v / DQB) & 1));
                C::reduce_dq(p, c.dq_tile(p, q, n_lo), dq_buf(i));
                fc_bulk_wait_read<0>();
                fc_mbar_arrive(dq_empty(i));
                ++v;
            }
        }
        return;
    }

    // ---- the consumers ----
    fc_setmaxnreg_inc<Tr::kConsumerRegs>();
    const auto sync = [] { fc_bar_sync(FC_BWS_BAR, Tr::kConsumerThreads); };
    c.load_kv(p);
    fc_cp_async_commit();
    c.part(wg, warp);
    float acc_dk[C::DT][4], acc_dv[C::DT][4];
#pragma unroll
    for (int dt = 0; dt < C::DT; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_dk[dt][e] = acc_dv[dt][e] = 0.0f;
    fc_cp_async_wait<0>();
    fc_fence_proxy_async();
    sync();  // K, V have landed, visible to wgmma

    // ---- the walk: one visited query block per step ----
    int v = 0;
    for (int it = 0; it < n_iters; ++it) {
        const fc_sm90_bwd_qblock q = c.qblock(p, it, v);
        int n_lo;
        if (!c.visits(q, &n_lo)) continue;
        fc_mbar_wait(full(q.slot), (uint32_t)((v / QS) & 1));
        if (p.f.cu_seqlens_q && q.rows < Br) {
            // rows past the sequence (varlen): zeros, as the sm90 loader's
            for (int idx = tid; idx < (Br - q.rows) * CH; idx += CT) {
                const uint32_t off = fc_sw128_offset(Br, q.rows + idx / CH, idx % CH);
                fc_st_shared_zero16(q.sQ + off);
                fc_st_shared_zero16(q.sdO + off);
            }
            fc_fence_proxy_async();
            sync();
        }

        float acc_s[C::NT][4], acc_dp[C::NT][4];
        c.scores(acc_s, acc_dp, q);
        // every consumer is past the last block's dQ GEMM (and, kSplit, its
        // dV, dK): dS^T and P^T may be overwritten
        sync();
        uint32_t p_frag[C::PK][4], ds_frag[C::PK][4];
        c.elementwise(p, acc_s, acc_dp, q, p_frag, ds_frag);

        // kSplit: both warpgroups' halves of P^T, dS^T are stored before dV,
        // dK; the dQ GEMM needs the whole dS^T either way.
        if (kSplit) sync();
        c.grads(acc_dk, acc_dv, p_frag, ds_frag, q);
        if (!kSplit) sync();
        float acc_q[C::QT][4];
        c.dq_gemm(acc_q);
        if (QS == 1) {
            // dV, dK are done with the slot: the next query block may load
            c.wait_grads(acc_dk, acc_dv);
            fc_mbar_arrive(empty(q.slot));
        }
        c.wait_all(acc_dk, acc_dv, acc_q, p_frag, ds_frag);
        if (QS > 1) fc_mbar_arrive(empty(q.slot));
        const int i = v % DQB;
        if (v >= DQB) fc_mbar_wait(dq_empty(i), (uint32_t)((v / DQB - 1) & 1));
        c.store_dq_tile(acc_q, dq_buf(i));
        fc_mbar_arrive(dq_full(i));
        ++v;
    }

    // ---- the epilogue ----
    sync();  // every wgmma is done with sK, sV
    if (p.kv_split > 1)
        c.epilogue_part(p, acc_dk, acc_dv);
    else
        c.epilogue(p, acc_dk, acc_dv, sync);
}

// ---- the launcher of one instance (instantiated in inst/*.cu) ----
// Sets the dynamic shared memory limit once per device, then launches on
// `stream`. Returns the launch's cudaError_t; never synchronises.
template <int D, typename T, bool kCausal>
cudaError_t sm90ws_bwd_launch(const fc_cuda_bwd_ws_params &p, dim3 grid, cudaStream_t stream) {
    using Tr = fc_sm90ws_bwd_traits<D>;
    static std::atomic<uint64_t> smem_set{0};  // bit d: the limit is raised on device d
    return fc_launch_kernel(sm90ws_bwd_kernel<D, T, kCausal>, &smem_set, Tr::kSmemBytes,
                            Tr::kThreads, grid, stream, p, false);
}

#endif  // FLASHC_CUDA_SM90WS_BWD_KERNEL_CUH
