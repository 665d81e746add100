// bwd_kernel.cuh : the sm80 attention backward, FlashAttention-2 (Dao 2023,
// "FlashAttention-2", Algorithm 2: the key blocks are parallel, the query
// blocks a loop) with mma.sync + ldmatrix + cp.async. It also runs on sm90.
//
// Names as in the paper. A CTA owns the key block Kj, Vj (Bc rows of one KV
// head hk of one sequence) and keeps dKj, dVj in registers while it walks every
// query block Qi (Br rows) of every query head of hk's group (GQA: the group's
// sum accumulates in place, so dK and dV are written once, deterministically):
//     S  = Qi Kj^T, dP = dOi Vj^T          mma.sync m16n8k16, fp32
//     P  = exp2(x sl2 - lse2_i)            x = q.k, or tanh(q.k scale / cap) with
//                                          softcap, plus ALiBi; masked: 0
//     Pd = P o Z                           Z: the forward's dropout mask, 0 or 1/(1-p)
//     dS = P o (dP o Z - delta_i) o (1 - x^2 with softcap, else 1)
//     dVj += Pd^T dOi,  dKj += dS^T Qi     Pd, dS through shared memory (16-bit)
//     dQi += dS Kj                         fp32 atomics into dq_accum
// and at the end dKj * scale and dVj to the caller. delta_i = rowsum(dOi o Oi)
// and lse2 come from the preprocess kernel (common/bwd_prep.cuh), dq_accum
// goes to dQ * scale in the dQ kernel there.
//
// Data movement: Kj and Vj are loaded once; Qi, dOi and the tile's lse2 and
// delta stream through a ring of kQStages slots, one cp.async group per query
// block, issued right after the last read of the slot it reuses (the dK GEMM),
// so with two stages the next block loads under five GEMMs, with one under the
// dQ GEMM. Shared rows are padded by 16 bytes (traits.h) so every ldmatrix is
// conflict-free; P and dS are stored [query][key] and read as Pd^T, dS^T with
// ldmatrix.trans and as dS with ldmatrix.
//
// Masks: query blocks no row of which sees a key of the block are skipped (the
// block's visible query range, widened by one block and filtered by
// fc_mask::tiles, the forward's test, so both sides of deterministic mode agree
// on which CTAs visit a query block); the element test runs only on partial tiles.
//
// Deterministic mode: the CTA that owns key block n adds to the dq_accum rows
// of (h, query block m) only after the CTAs of the key blocks before n that
// visit m have (a turn counter per (h, m) in the workspace): the fp32 sums run
// in one order, so dQ is bitwise reproducible. The waits go only to CTAs of
// lower block index (key blocks are grid x), which are resident or done.
//
// Template parameters: the head dim D (a row of traits.h FC_SM80_BWD_TILES),
// the dtype T, kCausal. Everything else is a field of bwd_params.h.
//
// Not here: paged K/V (the backward has none), unaligned operands (bwd.cu
// repacks them), split of the query loop across CTAs.
#ifndef FLASHC_CUDA_SM80_BWD_KERNEL_CUH
#define FLASHC_CUDA_SM80_BWD_KERNEL_CUH

#include <cuda_runtime.h>

#include <atomic>

#include "../bwd_params.h"
#include "../common/dropout.cuh"
#include "../common/bwd_tile.cuh"
#include "../common/mask.cuh"
#include "../common/ptx.cuh"
#include "../traits.h"

// The dQ reductions of a pair of 8-column C-fragment tiles (a, b: cols col0 ..
// col0 + 15 of rows g and g + 8) into the fp32 rows at row0 and row1 (NULL:
// a row past the tile's valid rows), atomically per element; a tile at or past
// column `cols` (the rows' width, a multiple of 8) is left out. They are this
// kernel's largest cost (bench/NOTES.md), so sm90 uses its vector reductions:
// the lanes of a quad pair up (shfl.xor 1) so that each holds 4 consecutive
// floats of one tile, one 16-byte red.v4 a lane per row, 2 full sectors per
// 8 rows of a tile (sm80 has only scalar float reductions). Every lane of the
// warp must call it (it shuffles).
__device__ __forceinline__ void fc_red_pair(float *row0, float *row1, int col0, int cols, int t,
                                            const float (&a)[4], const float (&b)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const bool odd = t & 1;  // even lanes keep tile a, odd lanes tile b
    const int col = col0 + (odd ? 8 : 0) + 2 * (t & ~1);
    const bool in = col < cols;
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const float s0 = odd ? a[2 * hr] : b[2 * hr], s1 = odd ? a[2 * hr + 1] : b[2 * hr + 1];
        const float r0 = __shfl_xor_sync(0xffffffffu, s0, 1);
        const float r1 = __shfl_xor_sync(0xffffffffu, s1, 1);
        float *row = hr ? row1 : row0;
        if (!row || !in) continue;
        const float4 v = odd ? make_float4(r0, r1, b[2 * hr], b[2 * hr + 1])
                             : make_float4(a[2 * hr], a[2 * hr + 1], r0, r1);
        asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(row + col), "f"(v.x),
                     "f"(v.y), "f"(v.z), "f"(v.w)
                     : "memory");
    }
#else
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        float *row = hr ? row1 : row0;
        if (!row) continue;
        if (col0 < cols) {
            atomicAdd(row + col0 + 2 * t, a[2 * hr]);
            atomicAdd(row + col0 + 2 * t + 1, a[2 * hr + 1]);
        }
        if (col0 + 8 < cols) {
            atomicAdd(row + col0 + 8 + 2 * t, b[2 * hr]);
            atomicAdd(row + col0 + 8 + 2 * t + 1, b[2 * hr + 1]);
        }
    }
#endif
}


// ---- the kernel ----
// grid (ceil(max_seqlen_k / Bc), Hk, B), block kThreads, dynamic smem kSmemBytes.
template <int D, typename T, bool kCausal>
__global__ void __launch_bounds__(fc_sm80_bwd_traits<D>::kThreads)
    sm80_bwd_kernel(const __grid_constant__ fc_cuda_bwd_params p) {
    using Tr = fc_sm80_bwd_traits<D>;
    constexpr int Br = Tr::kBr, Bc = Tr::kBc, NTH = Tr::kThreads, CH = Tr::kChunks;
    constexpr int QS = Tr::kQStages, SR = Tr::kSR, NT = Tr::kSNT;
    constexpr int KR = Tr::kKR, KT = Tr::kKT, KDT = Tr::kKDT, QDT = Tr::kQDT;
    constexpr int RBD = Tr::kPitchD * 2, RBC = Tr::kPitchC * 2;  // smem row bytes
    const fc_cuda_fwd_params &f = p.f;

    extern __shared__ __align__(128) unsigned char fc_smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int n_block = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;

    // ---- this sequence, key block and the query blocks it walks ----
    fc_bwd_block blk = {};
    if (!blk.template init<Br, Bc, kCausal>(p, b, n_block, f.kv_group)) return;
    const int sq = blk.sq, sk = blk.sk, j0 = blk.j0, n_iters = blk.n_iters;
    const fc_mask<kCausal> mask(sq, sk, f.window_left, f.window_right);

    // ---- shared memory ----
    const uint32_t sK = fc_smem_u32(fc_smem);
    const uint32_t sV = sK + Tr::kKVBytes;
    const uint32_t sQ = sV + Tr::kKVBytes;           // [QS][Br][pitchD]
    const uint32_t sdO = sQ + QS * Tr::kQBytes;      // [QS][Br][pitchD]
    const uint32_t sP = sdO + QS * Tr::kQBytes;      // [Br][pitchC]
    const uint32_t sdS = sP + Tr::kPBytes;           // [Br][pitchC]
    const uint32_t sLse = sdS + Tr::kPBytes;         // [QS][Br] f32
    const uint32_t sDelta = sLse + QS * Br * 4;      // [QS][Br] f32

    using Ld = fc_tile_loader<T, NTH, CH>;
    constexpr uint32_t LD_STEP = Ld::RPP * RBD;

    // ---- K, V once ----
    {
        const Ld ld(tid, f.head_dim, f.head_dim_v, Bc, sk);
        const uint32_t dst = ld.row * RBD + ld.ch * 16;
        fc_bwd_load_kv<Ld, Bc, T>(ld, p, b, hk, blk, sK + dst, sV + dst, LD_STEP);
    }
    // Q, dO, lse2, delta of iteration `it` into slot it % QS (one commit)
    auto load_q = [&](int it) {
        fc_bwd_load_q<Ld, Br, QS, NTH, T>(p, b, hk * f.kv_group, blk, tid, it, sQ, sdO,
                                          Tr::kQBytes, LD_STEP, sLse, sDelta,
                                          [](int row, int ch) { return (uint32_t)(row * RBD + ch * 16); });
    };
    load_q(0);  // with K, V: group 0
#pragma unroll
    for (int s = 1; s < QS; ++s) load_q(s);

    // ---- warp tiles ----
    const int s_wr = warp % SR, s_wc = warp / SR;  // S / dP and dQ: query rows, key (d) cols
    const int k_wr = warp % KR, k_wc = warp / KR;  // dK / dV: key rows, d cols
    float acc_dk[KT][KDT][4], acc_dv[KT][KDT][4];
#pragma unroll
    for (int kt = 0; kt < KT; ++kt)
#pragma unroll
        for (int dt = 0; dt < KDT; ++dt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_dk[kt][dt][e] = acc_dv[kt][dt][e] = 0.0f;

    // ldmatrix lane addresses (ptx.cuh layouts; see sm80/fwd_kernel.cuh):
    // A row-major from [row][k] storage ("a" pattern), B from [n][k] ("b"),
    // B from [k][n] with .trans ("bt"), A from [k][m] with .trans (= "b")
    const int a_row = lane & 15;
    const uint32_t a_off = (lane >> 4) * 16;
    const int b_row = (lane & 7) + ((lane >> 4) << 3);
    const uint32_t b_off = ((lane >> 3) & 1) * 16;
    const int s_row = s_wr * 16;                 // first query row of the warp's S tile
    const int s_col = s_wc * (Bc / Tr::kSC);     // first key column of the warp's S tile

    for (int it = 0; it < n_iters; ++it) {
        int h, m;
        blk.iter_hm(it, hk * f.kv_group, &h, &m);
        const int m0 = m * Br, rows = min(Br, sq - m0);
        const uint32_t slot = (uint32_t)(it % QS);
        const uint32_t sQs = sQ + slot * Tr::kQBytes, sdOs = sdO + slot * Tr::kQBytes;

        // this iteration's Q, dO, lse2, delta (and K, V at it = 0) have landed;
        // every warp is past the last iteration's dQ GEMM (sP, sdS are free)
        fc_cp_async_wait<QS - 1>();
        __syncthreads();

        // does this query block see the key block at all (the forward's test)?
        int n_lo, n_hi;
        const bool visits = mask.template tiles<Bc>(m0, m0 + rows - 1, &n_lo, &n_hi) &&
                            n_block >= n_lo && n_block < n_hi;
        if (!visits) {
            __syncthreads();
            load_q(it + QS);
            continue;
        }

        // ---- S = Q K^T and dP = dO V^T (warp tile 16 x Bc / kSC) ----
        float acc_s[1][NT][4], acc_dp[1][NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_s[0][nt][e] = acc_dp[0][nt][e] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) {
            uint32_t aq[4], ado[4];
            fc_ldmatrix_x4(aq, sQs + (s_row + a_row) * RBD + a_off + ks * 32);
            fc_ldmatrix_x4(ado, sdOs + (s_row + a_row) * RBD + a_off + ks * 32);
#pragma unroll
            for (int np = 0; np < NT / 2; ++np) {
                uint32_t bk[4], bv[4];
                const uint32_t off = (s_col + np * 16 + b_row) * RBD + b_off + ks * 32;
                fc_ldmatrix_x4(bk, sK + off);
                fc_ldmatrix_x4(bv, sV + off);
                fc_mma_16816<T>(acc_s[0][2 * np], aq, bk[0], bk[1]);
                fc_mma_16816<T>(acc_s[0][2 * np + 1], aq, bk[2], bk[3]);
                fc_mma_16816<T>(acc_dp[0][2 * np], ado, bv[0], bv[1]);
                fc_mma_16816<T>(acc_dp[0][2 * np + 1], ado, bv[2], bv[3]);
            }
        }

        // ---- P, Pd, dS elementwise, to shared memory as 16-bit pairs ----
        {
            const bool partial = mask.template tile_partial<Bc>(m0, m0 + rows - 1, j0);
            const float slope_x =
                f.alibi ? f.alibi[(int64_t)b * f.alibi_s_batch + h] * f.alibi_scale : 0.0f;
            const uint32_t bh = (uint32_t)b * (uint32_t)f.heads + (uint32_t)h;
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
                const int r = s_row + g + 8 * hr;  // tile row
                const int i = m0 + r;              // query row in the sequence
                const float lse2 = fc_ld_shared_f32(sLse + (slot * Br + r) * 4);
                const float dl = fc_ld_shared_f32(sDelta + (slot * Br + r) * 4);
                const int lo = mask.lo(i), hi = mask.hi(i);
                // one visible key: common/window.h's one-key rule (dS = 0 where P
                // is at least FC_ONE_KEY_P); off with a sink, which takes mass
                const bool one_key = !f.sink && max(lo, 0) + 1 == hi;
                uint32_t keep[NT / 4];
                if (f.dropout) {
#pragma unroll
                    for (int qd = 0; qd < NT / 4; ++qd)
                        keep[qd] = fc_dropout_keep4(f.dropout_seed, f.dropout_offset,
                                                    f.dropout_threshold, bh, (uint32_t)i,
                                                    (uint64_t)((j0 + s_col) / 8 + 4 * qd), t);
                }
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    float pd[2], ds[2];
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int c = s_col + 8 * nt + 2 * t + e;  // tile column
                        const int j = j0 + c;
                        float x = acc_s[0][nt][2 * hr + e], dt = 1.0f;
                        if (f.softcap_pre != 0.0f) {
                            x = fc_softcap1(x, f.softcap_pre);
                            dt = 1.0f - x * x;
                        }
                        if (f.alibi) x = fmaf(-slope_x, fabsf((float)(mask.diag(i) - j)), x);
                        float pr = fc_exp2(fmaf(x, f.score_scale_log2, -lse2));
                        if (partial && (j < lo || j >= hi)) pr = 0.0f;
                        float dp = acc_dp[0][nt][2 * hr + e];
                        float pdrop = pr;
                        if (f.dropout) {
                            const bool k = (keep[nt / 4] >> (8 * (nt % 4) + e)) & 1u;
                            pdrop = k ? pr * f.dropout_rescale : 0.0f;
                            dp = k ? dp * f.dropout_rescale : 0.0f;
                        }
                        pd[e] = pdrop;
                        ds[e] = one_key && pr >= FC_ONE_KEY_P ? 0.0f : pr * (dp - dl) * dt;
                    }
                    const uint32_t off = r * RBC + (s_col + 8 * nt + 2 * t) * 2;
                    fc_st_shared_b32(sP + off, fc_pack2<T>(pd[0], pd[1]));
                    fc_st_shared_b32(sdS + off, fc_pack2<T>(ds[0], ds[1]));
                }
            }
        }
        __syncthreads();  // sP, sdS complete

        // ---- dV += Pd^T dO, dK += dS^T Q (warp tile 16 KT keys x D / kKC) ----
        {
            const int kr0 = k_wr * 16 * KT, dc0 = k_wc * (D / Tr::kKC);
#pragma unroll
            for (int kq = 0; kq < Br / 16; ++kq) {
                uint32_t ap[KT][4], as[KT][4];
#pragma unroll
                for (int kt = 0; kt < KT; ++kt) {
                    const uint32_t off = (kq * 16 + b_row) * RBC + (kr0 + kt * 16) * 2 + b_off;
                    fc_ldmatrix_x4_trans(ap[kt], sP + off);
                    fc_ldmatrix_x4_trans(as[kt], sdS + off);
                }
#pragma unroll
                for (int dp = 0; dp < KDT / 2; ++dp) {
                    uint32_t bo[4], bq[4];
                    const uint32_t off = (kq * 16 + a_row) * RBD + (dc0 + dp * 16) * 2 + a_off;
                    fc_ldmatrix_x4_trans(bo, sdOs + off);
                    fc_ldmatrix_x4_trans(bq, sQs + off);
#pragma unroll
                    for (int kt = 0; kt < KT; ++kt) {
                        fc_mma_16816<T>(acc_dv[kt][2 * dp], ap[kt], bo[0], bo[1]);
                        fc_mma_16816<T>(acc_dv[kt][2 * dp + 1], ap[kt], bo[2], bo[3]);
                        fc_mma_16816<T>(acc_dk[kt][2 * dp], as[kt], bq[0], bq[1]);
                        fc_mma_16816<T>(acc_dk[kt][2 * dp + 1], as[kt], bq[2], bq[3]);
                    }
                }
            }
        }
        __syncthreads();  // every warp is done with this slot's Q and dO
        load_q(it + QS);

        // ---- dQ += dS K (warp tile 16 queries x D / kSC, in chunks) ----
        const int64_t srow = (int64_t)h * p.rows + blk.row0(p, b) + m0;
        int32_t *sem = p.sem ? p.sem + srow / p.sem_br : nullptr;  // one counter per Br scratch rows
        if (p.deterministic) {
            // my turn: the key blocks n_lo .. n_block - 1 that visit m have added
            // (">=", not "==": with valid metadata the count cannot pass my turn
            // before I add; with cu_seqlens that make two sequences share scratch
            // rows it can, and the wait must still end)
            if (tid == 0)
                while (fc_ld_acquire(sem) < n_block - n_lo) {
                }
            __syncthreads();
        }
        {
            constexpr int QC = 8;  // 8-column tiles per chunk
            const int dc0 = s_wc * (D / Tr::kSC);
#pragma unroll
            for (int c0 = 0; c0 < QDT; c0 += QC) {
                constexpr int kMaxC = QDT < QC ? QDT : QC;
                float acc_q[kMaxC][4];
#pragma unroll
                for (int dt = 0; dt < kMaxC; ++dt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc_q[dt][e] = 0.0f;
#pragma unroll
                for (int kk = 0; kk < Bc / 16; ++kk) {
                    uint32_t as[4];
                    fc_ldmatrix_x4(as, sdS + (s_row + a_row) * RBC + a_off + kk * 32);
#pragma unroll
                    for (int dp = 0; dp < kMaxC / 2; ++dp) {
                        if (c0 + 2 * dp >= QDT) break;
                        uint32_t bk[4];
                        fc_ldmatrix_x4_trans(
                            bk, sK + (kk * 16 + a_row) * RBD + (dc0 + (c0 + 2 * dp) * 8) * 2 + a_off);
                        fc_mma_16816<T>(acc_q[2 * dp], as, bk[0], bk[1]);
                        fc_mma_16816<T>(acc_q[2 * dp + 1], as, bk[2], bk[3]);
                    }
                }
                float *row0 = s_row + g < rows ? p.dq_accum + (srow + s_row + g) * p.dq_pitch
                                               : nullptr;
                float *row1 = s_row + g + 8 < rows
                                  ? p.dq_accum + (srow + s_row + g + 8) * p.dq_pitch
                                  : nullptr;
#pragma unroll
                for (int dt = 0; dt < kMaxC; dt += 2) {
                    if (c0 + dt >= QDT) break;  // QDT and the chunks are even
                    const int col0 = dc0 + (c0 + dt) * 8;
                    fc_red_pair(row0, row1, col0, f.head_dim, t, acc_q[dt], acc_q[dt + 1]);
                }
            }
        }
        if (p.deterministic) {
            __syncthreads();  // every thread's adds are issued
            if (tid == 0) {
                __threadfence();
                atomicAdd(sem, 1);
            }
        }
    }
    fc_cp_async_wait<0>();  // only empty groups can remain
    __syncthreads();        // every warp is done with sK, sV

    // ---- epilogue: dK * scale, dV through sK / sV to 16-byte stores ----
    {
        const int kr0 = k_wr * 16 * KT, dc0 = k_wc * (D / Tr::kKC);
#pragma unroll
        for (int kt = 0; kt < KT; ++kt)
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
                const int r = kr0 + kt * 16 + g + 8 * hr;
#pragma unroll
                for (int dt = 0; dt < KDT; ++dt) {
                    const uint32_t off = r * RBD + (dc0 + dt * 8 + 2 * t) * 2;
                    fc_st_shared_b32(sK + off, fc_pack2<T>(acc_dk[kt][dt][2 * hr] * p.ds_scale,
                                                           acc_dk[kt][dt][2 * hr + 1] * p.ds_scale));
                    fc_st_shared_b32(sV + off, fc_pack2<T>(acc_dv[kt][dt][2 * hr],
                                                           acc_dv[kt][dt][2 * hr + 1]));
                }
            }
    }
    __syncthreads();
    fc_bwd_store_dkdv<T, Bc, CH, NTH>(p, b, hk, blk, tid, sK, sV,
                                      [](int r, int ch) { return (uint32_t)(r * RBD + ch * 16); });
}

// ---- the launcher of one instance (instantiated in inst/*.cu) ----
// Sets the dynamic shared memory limit once per device, then launches on
// `stream`. Returns the launch's cudaError_t; never synchronises.
template <int D, typename T, bool kCausal>
cudaError_t sm80_bwd_launch(const fc_cuda_bwd_params &p, dim3 grid, cudaStream_t stream) {
    using Tr = fc_sm80_bwd_traits<D>;
    static std::atomic<uint64_t> smem_set{0};  // bit d: the limit is raised on device d
    return fc_launch_kernel(sm80_bwd_kernel<D, T, kCausal>, &smem_set, Tr::kSmemBytes,
                            Tr::kThreads, grid, stream, p, false);
}

#endif  // FLASHC_CUDA_SM80_BWD_KERNEL_CUH
