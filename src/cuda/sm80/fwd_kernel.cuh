// fwd_kernel.cuh : the sm80 attention forward, FlashAttention-2 (Dao 2023,
// "FlashAttention-2: Faster Attention with Better Parallelism and Work
// Partitioning", Algorithm 1), with mma.sync + ldmatrix + cp.async. It also
// runs on sm90 (the Hopper family, sm90/, is a separate kernel).
//
// Names as in the paper: the CTA owns the query tile Qi (Br rows of one head of
// one sequence) and walks the key/value tiles Kj, Vj (Bc rows each):
//     S = Qi Kj^T                  mma.sync m16n8k16, fp32 accumulate
//     m, l, P = online softmax(S)  in registers (common/softmax.cuh)
//     O = diag(alpha) O + P Vj     P converted to 16 bits in registers as the
//                                  A operand: no shared-memory round trip
//     O /= l, lse = m + log l      once, after the last tile
// Each of the W warps owns Br/W query rows (MT = Br/(16W) mma row tiles), so a
// row's softmax never leaves its quad of threads.
//
// Data movement: Q is loaded once by cp.async (and, with kQinRegs, moved to
// registers by ldmatrix at the first tile); K and V stream through rings of
// kStages tiles each in the order K0 V0 K1 V1 ..., one cp.async group per tile,
// so V(n) loads while S(n) computes and K(n+1) while O += P V(n) does (FA2's
// interleave; with one stage also under softmax(S(n)), FA2's order: the second
// wait comes right after the masks) plus kStages - 1 tiles of prefetch. Shared
// rows are padded by 16 bytes (traits.h) so ldmatrix is conflict-free. Loads past the sequence or
// past the operand's head dim (D for Q and K, Dv for V) are zero-filled
// (cp.async src-size 0); the output's first Dv columns are stored. The output
// goes through this warp's Q rows in shared memory to 16-byte global stores.
//
// Key tiles run from the last visible one down to the first (FA2 order: the
// diagonal tiles of a causal block come first); tiles no row of the block can
// see are skipped, and element masks run only on partially visible tiles.
//
// Template parameters are only what changes the code's shape: the head dim D
// (a row of traits.h), the dtype T (__nv_bfloat16 or __half), kCausal (the right
// window edge is the diagonal). Everything else is a field of params.h.
//
// Not here: attn_probs output, split-KV, persistent scheduling, packed GQA rows,
// unaligned operands (fwd.cu repacks them).
#ifndef FLASHC_CUDA_SM80_FWD_KERNEL_CUH
#define FLASHC_CUDA_SM80_FWD_KERNEL_CUH

#include <cuda_runtime.h>

#include <atomic>

#include "../common/dropout.cuh"
#include "../common/fwd_tile.cuh"
#include "../common/mask.cuh"
#include "../common/ptx.cuh"
#include "../common/softmax.cuh"
#include "../params.h"
#include "../traits.h"

// ---- the kernel ----
// grid (ceil(seqlen_q / Br), H, B), block kThreads, dynamic smem kSmemBytes.
template <int D, typename T, bool kCausal>
__global__ void __launch_bounds__(fc_sm80_fwd_traits<D>::kThreads)
    sm80_fwd_kernel(const __grid_constant__ fc_cuda_fwd_params p) {
    using Tr = fc_sm80_fwd_traits<D>;
    constexpr int Br = Tr::kBr, Bc = Tr::kBc, MT = Tr::kMT, NT = Tr::kNT, DT = Tr::kDT;
    constexpr int KS = Tr::kKS, S = Tr::kStages, NTH = Tr::kThreads, CH = Tr::kChunks;
    constexpr int RB = Tr::kRowBytes, TILE = Tr::kKVTileBytes;
    constexpr int RW = 16 * MT;  // query rows per warp

    extern __shared__ __align__(128) unsigned char fc_smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
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
    const T *q = static_cast<const T *>(p.q);
    T *o = static_cast<T *>(p.o);

    const int n_tiles = n_hi - n_lo;

    // ---- shared memory: Q [Br][pitch], K [S][Bc][pitch], V [S][Bc][pitch] ----
    const uint32_t sQ = fc_smem_u32(fc_smem);
    const uint32_t sK = sQ + Tr::kQBytes;
    const uint32_t sV = sK + S * TILE;

    // ---- global -> shared loads (one cp.async group each) ----
    // Padded rows: the thread's first chunk at row * RB + ch * 16, RPP rows a pass.
    using Ld = fc_tile_loader<T, NTH, CH>;
    const Ld ld(tid, p.head_dim, p.head_dim_v, rows, seq.sk);
    const uint32_t ld_dst = ld.row * RB + ld.ch * 16;
    constexpr uint32_t LD_STEP = Ld::RPP * RB;
    // K or V of iteration `it` (key tile n_hi - 1 - it) into ring slot it % S;
    // past the last tile it commits an empty group, so the group count per
    // iteration stays fixed.
    auto load_kv = [&](int it, bool is_v) {
        if (it < n_tiles) {
            const int j0 = (n_hi - 1 - it) * Bc;
            const uint32_t dst = (is_v ? sV : sK) + (it % S) * TILE + ld_dst;
            fc_load_kv_tile<Ld, Bc, T>(ld, dst, LD_STEP, is_v, p, seq, j0);
        }
        fc_cp_async_commit();
    };

    // ---- per-lane ldmatrix addresses (ptx.cuh layouts) ----
    const int wrow = warp * RW;  // first tile row of this warp
    // Q (A operand) and V (B operand, transposed): matrix m = lane / 8 covers
    // rows 8 * (m % 2) .. +7 and columns 8 * (m / 2) .. +7 of a 16x16 block
    const uint32_t q_lds = sQ + (wrow + (lane & 15)) * RB + (lane >> 4) * 16;
    const uint32_t v_lds = sV + (lane & 15) * RB + (lane >> 4) * 16;
    // K (B operand): matrices (keys 0-7, d 0-7), (keys 0-7, d 8-15), (keys 8-15, d 0-7), (8-15, 8-15)
    const uint32_t k_lds = sK + ((lane & 7) + ((lane >> 4) << 3)) * RB + ((lane >> 3) & 1) * 16;

    // ---- prologue: Q + K(0), then V(s), K(s+1) for the other stages ----
    ld.template load_q<Br>(sQ + ld_dst, LD_STEP, q, seq.q_base, p.q_s_seq);
    load_kv(0, false);
#pragma unroll
    for (int s = 0; s + 1 < S; ++s) {
        load_kv(s, true);
        load_kv(s + 1, false);
    }

    float acc_o[MT][DT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int dt = 0; dt < DT; ++dt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_o[mt][dt][e] = 0.0f;
    fc_softmax<MT> sm;
    sm.init();
    uint32_t q_frag[Tr::kQinRegs ? MT : 1][Tr::kQinRegs ? KS : 1][4];

    const int row0 = m0 + wrow + g;  // query row (in the sequence) of this thread's element 0
    const float slope_x =
        p.alibi ? p.alibi[(int64_t)b * p.alibi_s_batch + h] * p.alibi_scale : 0.0f;
    const uint32_t bh = (uint32_t)b * (uint32_t)p.heads + (uint32_t)h;

    // ---- the KV loop ----
    for (int it = 0; it < n_tiles; ++it) {
        const int j0 = (n_hi - 1 - it) * Bc;
        const uint32_t slot = (uint32_t)(it % S) * TILE;

        // K(it) has landed (2S - 2 younger groups may fly); every warp is past
        // O += P V(it - 1), so V slot (it - 1) % S is free
        fc_cp_async_wait<2 * S - 2>();
        __syncthreads();
        load_kv(it + S - 1, true);

        if constexpr (Tr::kQinRegs) {
            if (it == 0) {
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int ks = 0; ks < KS; ++ks)
                        fc_ldmatrix_x4(q_frag[mt][ks], q_lds + mt * 16 * RB + ks * 32);
            }
        }

        // S = Q K^T, software-pipelined over the (k16 step ks, key pair np)
        // steps: the fragments of the next step are read from shared memory
        // while this one multiplies (two register sets each for Q and K)
        float acc_s[MT][NT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc_s[mt][nt][e] = 0.0f;
        constexpr int NP = NT / 2;
        uint32_t a[2][MT][4], bk[2][4];
        auto load_a = [&](int ks) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                if constexpr (Tr::kQinRegs) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) a[ks & 1][mt][e] = q_frag[mt][ks][e];
                } else {
                    fc_ldmatrix_x4(a[ks & 1][mt], q_lds + mt * 16 * RB + ks * 32);
                }
            }
        };
        auto load_b = [&](int step) {
            fc_ldmatrix_x4(bk[step & 1], k_lds + slot + (step % NP) * 16 * RB + (step / NP) * 32);
        };
        load_a(0);
        load_b(0);
#pragma unroll
        for (int ks = 0; ks < KS; ++ks)
#pragma unroll
            for (int np = 0; np < NP; ++np) {
                const int step = ks * NP + np, cur = step & 1;
                if (step + 1 < KS * NP) load_b(step + 1);
                if (np == 0 && ks + 1 < KS) load_a(ks + 1);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    fc_mma_16816<T>(acc_s[mt][2 * np], a[ks & 1][mt], bk[cur][0], bk[cur][1]);
                    fc_mma_16816<T>(acc_s[mt][2 * np + 1], a[ks & 1][mt], bk[cur][2], bk[cur][3]);
                }
            }

        // score modifiers, masks, online softmax, dropout
        const int col0 = j0 + 2 * t;  // key of this thread's element 0
        if (p.softcap_pre != 0.0f) fc_softcap(acc_s, p.softcap_pre);
        if (p.alibi) mask.alibi(acc_s, row0, col0, slope_x);
        if (mask.template tile_partial<Bc>(m0, m0 + rows - 1, j0)) mask.apply(acc_s, row0, col0);

        // V(it) has landed; every warp is past S(it), so K slot it % S is free.
        // With one stage, waiting here, before the softmax (FA2's order), lets
        // K(it + 1) load under the softmax as well as O += P V(it); with more
        // stages K is already prefetched and the wait comes after the P pack
        // (here it would hold the fp32 S live across the load: spills at D64, D128)
        auto wait_v_load_k = [&]() {
            fc_cp_async_wait<2 * S - 2>();
            __syncthreads();
            load_kv(it + S, false);
        };
        if constexpr (S == 1) wait_v_load_k();

        sm.update(acc_s, acc_o, p.score_scale_log2, it == 0);
        if (p.dropout)
            fc_dropout_apply(acc_s, p.dropout_seed, p.dropout_offset, p.dropout_threshold, bh, row0,
                             (uint64_t)(j0 / 8), t);

        // P to 16 bits: the C fragments of 8-column tiles 2kk, 2kk+1 are the A
        // fragment of k16 slice kk (ptx.cuh)
        uint32_t p_frag[MT][Bc / 16][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int kk = 0; kk < Bc / 16; ++kk) {
                p_frag[mt][kk][0] = fc_pack2<T>(acc_s[mt][2 * kk][0], acc_s[mt][2 * kk][1]);
                p_frag[mt][kk][1] = fc_pack2<T>(acc_s[mt][2 * kk][2], acc_s[mt][2 * kk][3]);
                p_frag[mt][kk][2] = fc_pack2<T>(acc_s[mt][2 * kk + 1][0], acc_s[mt][2 * kk + 1][1]);
                p_frag[mt][kk][3] = fc_pack2<T>(acc_s[mt][2 * kk + 1][2], acc_s[mt][2 * kk + 1][3]);
            }
        if constexpr (S != 1) wait_v_load_k();

        // O += P V
#pragma unroll
        for (int kk = 0; kk < Bc / 16; ++kk)
#pragma unroll
            for (int dp = 0; dp < DT / 2; ++dp) {
                uint32_t bv[4];
                fc_ldmatrix_x4_trans(bv, v_lds + slot + kk * 16 * RB + dp * 32);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    fc_mma_16816<T>(acc_o[mt][2 * dp], p_frag[mt][kk], bv[0], bv[1]);
                    fc_mma_16816<T>(acc_o[mt][2 * dp + 1], p_frag[mt][kk], bv[2], bv[3]);
                }
            }
    }
    fc_cp_async_wait<0>();  // only empty groups can remain

    // ---- epilogue: O / l through this warp's own Q rows to 16-byte stores ----
    __syncwarp();  // this warp's last ldmatrix of its Q rows is done
    const fc_row_sink sink = fc_sink_of(p, h);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            float inv, lse;
            sm.finalize(mt, hr, p.score_scale, p.score_scale_log2, p.dropout_rescale, sink,
                        p.ln2, &inv, &lse);
            const int r = wrow + 16 * mt + 8 * hr + g;  // tile row
            const uint32_t dst = sQ + r * RB + t * 4;
#pragma unroll
            for (int dt = 0; dt < DT; ++dt)
                fc_st_shared_b32(dst + dt * 16, fc_pack2<T>(acc_o[mt][dt][2 * hr] * inv,
                                                            acc_o[mt][dt][2 * hr + 1] * inv));
            if (p.lse && t == 0 && r < rows) p.lse[seq.lse_base + (int64_t)r * p.lse_s_seq] = lse;
        }
    __syncwarp();
#pragma unroll
    for (int c = 0; c < RW * CH / 32; ++c) {
        const int idx = lane + 32 * c, r = wrow + idx / CH, ch = idx % CH;
        if (r < rows && ch * 8 < p.head_dim_v)
            fc_st_global_v4(o + seq.o_base + (int64_t)r * p.o_s_seq + ch * 8,
                            fc_ld_shared_v4(sQ + r * RB + ch * 16));
    }
}

// ---- the launcher of one instance (instantiated in inst/*.cu) ----
// Sets the dynamic shared memory limit once per device, then launches on
// `stream`. Returns the launch's cudaError_t; never synchronises.
template <int D, typename T, bool kCausal>
cudaError_t sm80_fwd_launch(const fc_cuda_fwd_params &p, dim3 grid, cudaStream_t stream) {
    using Tr = fc_sm80_fwd_traits<D>;
    static std::atomic<uint64_t> smem_set{0};  // bit d: the limit is raised on device d
    return fc_launch_kernel(sm80_fwd_kernel<D, T, kCausal>, &smem_set, Tr::kSmemBytes,
                            Tr::kThreads, grid, stream, p, false);
}

#endif  // FLASHC_CUDA_SM80_FWD_KERNEL_CUH
