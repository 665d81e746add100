// fwd_kernel.cuh : the sm90 (Hopper, sm_90a) attention forward: the
// FlashAttention-2 work split (Dao 2023, Algorithm 1: a CTA owns a query tile
// and walks the key/value tiles with an online softmax) on Hopper's
// asynchronous warpgroup MMA, with the intra-warpgroup overlap of
// FlashAttention-3 (Shah et al. 2024, §3.2): the softmax of key tile n runs
// while the tensor cores compute O += P V of tile n - 1.
//
// Names as in the papers: the CTA owns the query tile Qi (Br = 64 * W rows, W
// warpgroups of 128 threads, warpgroup w the rows 64w .. 64w + 63) and walks
// the key/value tiles Kj, Vj (Bc rows each), last visible tile first:
//     S = Qi Kj^T                  wgmma m64nBck16, Q and K from shared memory
//     m, l, P = online softmax(S)  in registers (common/softmax.cuh, MT = 1)
//     O = diag(alpha) O + P Vj     wgmma m64nDk16, P from registers (the
//                                  accumulator layout is the A fragment's), V
//                                  from shared memory, transposed
//     O /= l, lse = m + log l      once, after the last tile
// Iteration n of a warpgroup issues S(n) and then O += P(n-1) V(n-1), waits for
// S(n) only, masks and folds it into the softmax while the second GEMM runs,
// then waits for it and rescales O (FA3's order).
//
// Data movement: every thread copies K and V tiles with cp.async into a ring
// of kStages slots (wgmma.cuh's 128B-swizzled layout), in the order K0 V0 K1
// V1 ...; iteration n issues V(n + S - 2) and K(n + S - 1) into the slots
// freed by iteration n - 1, then computes on K(n) and V(n - 1). Q is loaded
// once, with K0. A copy becomes visible to wgmma after cp.async.wait_group,
// fence.proxy.async and the CTA barrier. The output goes through this
// warpgroup's Q rows in shared memory to 16-byte global stores.
//
// Template parameters are what changes the code's shape: the head dim D (a row
// of traits.h FC_SM90_FWD_TILES), the dtype T, kCausal; everything else is a
// field of params.h, read exactly as the sm80 kernel reads it (common/).
//
// Not here (the FA3 features a later version adds): TMA loads, a producer
// warpgroup with setmaxnreg, ping-pong scheduling of the two warpgroups, a
// persistent tile scheduler; head dims that are not multiples of 64 (padded by
// fwd.cu), attn_probs, split-KV.
#ifndef FLASHC_CUDA_SM90_FWD_KERNEL_CUH
#define FLASHC_CUDA_SM90_FWD_KERNEL_CUH

#include <cuda_runtime.h>

#include <atomic>

#include "../common/dropout.cuh"
#include "../common/fwd_tile.cuh"
#include "../common/mask.cuh"
#include "../common/ptx.cuh"
#include "../common/softmax.cuh"
#include "../common/wgmma.cuh"
#include "../params.h"
#include "../traits.h"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "the sm90 kernels use wgmma: compile them for sm_90a only"
#endif

// ---- the kernel ----
// grid (ceil(seqlen_q / Br), H, B), block kThreads, dynamic smem kSmemBytes.
template <int D, typename T, bool kCausal>
__global__ void __launch_bounds__(fc_sm90_fwd_traits<D>::kThreads,
                                  fc_sm90_fwd_traits<D>::kCtasPerSm)
    sm90_fwd_kernel(const __grid_constant__ fc_cuda_fwd_params p) {
    using Tr = fc_sm90_fwd_traits<D>;
    constexpr int Br = Tr::kBr, Bc = Tr::kBc, S = Tr::kStages, NTH = Tr::kThreads;
    constexpr int NT = Bc / 8;   // 8-column tiles of S per row
    constexpr int DT = D / 8;    // 8-column tiles of O per row
    constexpr int KS = D / 16;   // k16 steps of S = Q K^T
    constexpr int PK = Bc / 16;  // k16 steps of O += P V
    constexpr int CH = Tr::kChunks;
    constexpr uint32_t TILE = Tr::kKVTileBytes;

    extern __shared__ unsigned char fc_smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2;  // this warpgroup's rows: 64 wg .. 64 wg + 63 of the tile
    const int g = lane >> 2, t = lane & 3;
    const int b = blockIdx.z, h = blockIdx.y;
    // causal: the longest rows (largest m_block) start first
    const int m_block = kCausal ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;

    // ---- this sequence and the key tiles the block sees ----
    fc_fwd_seq seq;
    int n_lo, n_hi;
    if (!fc_fwd_tile_begin<T, kCausal, Br, Bc, CH, NTH>(p, b, h, m_block, tid, &seq, &n_lo, &n_hi))
        return;
    const int m0 = seq.m0, rows = seq.rows;
    const fc_mask<kCausal> mask(seq.sq, seq.sk, p.window_left, p.window_right);
    const int n_tiles = n_hi - n_lo;
    const T *q = static_cast<const T *>(p.q);
    T *o = static_cast<T *>(p.o);

    // ---- shared memory (1024-aligned): Q [Br x D], K [S][Bc x D], V [S][Bc x D] ----
    const uint32_t sQ = (fc_smem_u32(fc_smem) + 1023u) & ~1023u;
    const uint32_t sK = sQ + Tr::kQBytes;
    const uint32_t sV = sK + S * TILE;

    // ---- global -> shared loads (one cp.async group each) ----
    // RPP is a multiple of 8, so a thread's rows share r % 8 and its chunks
    // sit at one swizzled position, RPP * 128 bytes apart.
    using Ld = fc_tile_loader<T, NTH, CH>;
    static_assert(Ld::RPP % 8 == 0, "loader rows must keep the swizzle phase");
    const Ld ld(tid, p.head_dim, p.head_dim_v, rows, seq.sk);
    constexpr uint32_t LD_STEP = Ld::RPP * 128;
    const uint32_t kv_dst = fc_sw128_offset(Bc, ld.row, ld.ch);
    // K or V of iteration `it` (key tile n_hi - 1 - it) into ring slot it % S;
    // past the last tile (or before the first) it commits an empty group, so
    // the group count per iteration stays fixed.
    auto load_kv = [&](int it, bool is_v) {
        if (it >= 0 && it < n_tiles) {
            const int j0 = (n_hi - 1 - it) * Bc;
            const uint32_t dst = (is_v ? sV : sK) + (it % S) * TILE + kv_dst;
            fc_load_kv_tile<Ld, Bc, T>(ld, dst, LD_STEP, is_v, p, seq, j0);
        }
        fc_cp_async_commit();
    };

    // ---- prologue: Q + K0, then V(s-1), K(s) up to what iteration 0 issues ----
    ld.template load_q<Br>(sQ + fc_sw128_offset(Br, ld.row, ld.ch), LD_STEP, q, seq.q_base,
                           p.q_s_seq);
    load_kv(0, false);
#pragma unroll
    for (int s = 1; s + 1 < S; ++s) {
        load_kv(s - 1, true);
        load_kv(s, false);
    }

    // ---- wgmma descriptors (wgmma.cuh layouts) ----
    // S = Q K^T: k16 step ks reads column block ks / 4 at byte 32 (ks % 4)
    const uint64_t q_desc = fc_wgmma_desc(sQ + wg * 64 * 128, 16, 1024);
    const uint64_t k_desc = fc_wgmma_desc(sK, 16, 1024);
    // O += P V: V is MN-major; k16 step kk starts at key row 16 kk
    const uint64_t v_desc = fc_wgmma_desc(sV, Bc * 128, 1024);

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
    const float slope_x =
        p.alibi ? p.alibi[(int64_t)b * p.alibi_s_batch + h] * p.alibi_scale : 0.0f;
    const uint32_t bh = (uint32_t)b * (uint32_t)p.heads + (uint32_t)h;

    // O += P(n) V(n) for the tile of iteration n, committed as one group.
    auto issue_pv = [&](int n) {
        const uint64_t vd = fc_wgmma_desc_add(v_desc, (uint32_t)(n % S) * TILE);
#pragma unroll
        for (int kk = 0; kk < PK; ++kk)
            fc_wgmma_rs<D, T>(o_regs, p_frag[kk], fc_wgmma_desc_add(vd, kk * 16 * 128), 1);
        fc_wgmma_commit();
    };

    // ---- the KV loop ----
    for (int it = 0; it < n_tiles; ++it) {
        const int j0 = (n_hi - 1 - it) * Bc;

        // K(it) and V(it - 1) have landed (2S - 4 younger groups may fly) and
        // are visible to wgmma; every warpgroup is past S(it - 1) and
        // O += P V(it - 2), so K slot (it - 1) % S and V slot (it - 2) % S are free
        fc_cp_async_wait<2 * S - 4>();
        fc_fence_proxy_async();
        __syncthreads();
        load_kv(it + S - 2, true);
        load_kv(it + S - 1, false);

        float acc_s[1][NT][4];
        float(&s_regs)[Bc / 2] = *reinterpret_cast<float(*)[Bc / 2]>(&acc_s[0][0][0]);
        fc_wgmma_fence();
        fc_wgmma_abt<Bc, T, KS>(s_regs, q_desc, Br,
                                fc_wgmma_desc_add(k_desc, (uint32_t)(it % S) * TILE), Bc);
        if (it > 0) {
            issue_pv(it - 1);
            fc_wgmma_wait<1>();  // S(it) done; O += P V(it - 1) may still run
        } else {
            fc_wgmma_wait<0>();
        }
        fc_reg_fence(s_regs);

        // score modifiers, masks, online softmax, dropout (O untouched)
        const int col0 = j0 + 2 * t;  // key of this thread's element 0
        if (p.softcap_pre != 0.0f) fc_softcap(acc_s, p.softcap_pre);
        if (p.alibi) mask.alibi(acc_s, row0, col0, slope_x);
        if (mask.template tile_partial<Bc>(m0, m0 + rows - 1, j0)) mask.apply(acc_s, row0, col0);
        float alpha[1][2];
        sm.step(acc_s, p.score_scale_log2, alpha);
        if (p.dropout)
            fc_dropout_apply(acc_s, p.dropout_seed, p.dropout_offset, p.dropout_threshold, bh, row0,
                             (uint64_t)(j0 / 8), t);

        if (it > 0) {
            fc_wgmma_wait<0>();  // O += P V(it - 1) done: O and P(it - 1) are free
            fc_reg_fence(o_regs);
            fc_reg_fence(p_frag);
            fc_softmax_rescale(acc_o, alpha);
        }
        // P(it) to 16 bits, the A fragments of O += P V
        fc_acc_to_afrag<T>(acc_s[0], p_frag);
    }

    // ---- the last O += P V ----
    fc_cp_async_wait<0>();  // V(n_tiles - 1); only empty groups remain
    fc_fence_proxy_async();
    __syncthreads();
    fc_wgmma_fence();
    issue_pv(n_tiles - 1);
    fc_wgmma_wait<0>();
    fc_reg_fence(o_regs);
    fc_reg_fence(p_frag);

    // ---- epilogue: O / l through this warpgroup's Q rows to 16-byte stores ----
    // (every wgmma of this warpgroup, the only readers of these rows, is done)
    const fc_row_sink sink = fc_sink_of(p, h);
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        float inv, lse;
        sm.finalize(0, hr, p.score_scale, p.score_scale_log2, p.dropout_rescale, sink,
                        p.ln2, &inv, &lse);
        const int r = wg * 64 + (warp & 3) * 16 + 8 * hr + g;  // tile row
#pragma unroll
        for (int dt = 0; dt < DT; ++dt)
            fc_st_shared_b32(sQ + fc_sw128_offset(Br, r, dt) + t * 4,
                             fc_pack2<T>(acc_o[0][dt][2 * hr] * inv, acc_o[0][dt][2 * hr + 1] * inv));
        if (p.lse && t == 0 && r < rows) p.lse[seq.lse_base + (int64_t)r * p.lse_s_seq] = lse;
    }
    fc_bar_sync(1 + wg, 128);
    const int wtid = tid & 127;
#pragma unroll
    for (int c = 0; c < 64 * CH / 128; ++c) {
        const int idx = wtid + 128 * c, r = wg * 64 + idx / CH, ch = idx % CH;
        if (r < rows && ch * 8 < p.head_dim_v)
            fc_st_global_v4(o + seq.o_base + (int64_t)r * p.o_s_seq + ch * 8,
                            fc_ld_shared_v4(sQ + fc_sw128_offset(Br, r, ch)));
    }
}

// ---- the launcher of one instance (instantiated in inst/*.cu) ----
// Sets the dynamic shared memory limit once per device, then launches on
// `stream`. Returns the launch's cudaError_t; never synchronises.
template <int D, typename T, bool kCausal>
cudaError_t sm90_fwd_launch(const fc_cuda_fwd_params &p, dim3 grid, cudaStream_t stream) {
    using Tr = fc_sm90_fwd_traits<D>;
    static std::atomic<uint64_t> smem_set{0};  // bit d: the limit is raised on device d
    return fc_launch_kernel(sm90_fwd_kernel<D, T, kCausal>, &smem_set, Tr::kSmemBytes,
                            Tr::kThreads, grid, stream, p, false);
}

#endif  // FLASHC_CUDA_SM90_FWD_KERNEL_CUH
