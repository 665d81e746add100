// decode_kernel.cuh : the sm80 split-KV decode kernel (attention of a few query
// rows over a long KV cache), Flash-Decoding (Dao, Haziza, Massa, Sizov 2023:
// split the keys across CTAs, merge the partial softmaxes by their lse) with
// mma.sync + ldmatrix + cp.async. It also runs on sm90.
//
// Names as in the FlashAttention papers. A CTA owns Br = 16 packed query rows
// of one (sequence b, kv head hk) (decode_params.h: row R = i * G + gq is query
// row i of head hk * G + gq, G = H / Hk, so the G heads that share a kv head
// read each K/V byte once) and one split of the key tiles Kj, Vj (Bc keys each).
// The tiles stream through a ring of kStages (K, V) pairs, one cp.async group
// per pair, 16-byte copies. Each of the W = Bc / 16 warps takes 16 keys of every
// tile and runs its own FlashAttention-2 loop over them:
//     S = Qi Kj^T            mma.sync m16n8k16, fp32 accumulate (16 x 16 per warp)
//     m, l, P = online softmax(S)    (common/softmax.cuh)
//     O = diag(alpha) O + P Vj       P stays in registers as the A operand
// After the last tile the W partial (m, l, O) are merged through shared memory
// (the ring, free by then) into O / l and lse = m + log l: written to out and
// softmax_lse when there is one split, else to the fp32 partial buffers that
// the combine kernel (kvcache_kernels.cuh) merges the same way across splits.
//
// Paged caches of any page size: the key row j of sequence b is cache row
// r = j + leftpad in page block_table[b][r / page_size] (common/seqlens.cuh
// fc_paged, read through __ldg here). The 32 / TPR row groups
// of a warp each load a row per pass; lane c of a group looks up the page of the
// group's pass-c row once per tile (one division, one block_table read) and the
// group's lanes take it by __shfl_sync, so the int64 address math is per row,
// not per 16-byte chunk. The lookups for tile n + 1 are issued right after the
// copies of tile n, a full iteration before they are needed, so the block_table
// latency never stalls the copies. Contiguous caches step one pointer per row.
//
// Keys past the sequence, and columns past the operand's head dim (D for Q
// and K, Dv for V), are zero-filled (cp.async src-size 0): never read, and
// 0 * P cannot make a NaN. The output's first Dv columns are written.
// Masks (causal / window, common/mask.cuh) and ALiBi use each packed row's own
// query index and head; key tiles no row of the CTA sees are never loaded.
//
// Template parameters: the head dim D (a row of decode_traits.h) and the dtype
// T. Everything else is a field of decode_params.h.
//
// Not here: dropout (kvcache has none), attn_probs, unaligned operands or head
// dims that are not a multiple of 8 (kvcache.cu sends those through the forward
// kernel and its repack), more than 128 packed rows (likewise).
#ifndef FLASHC_CUDA_SM80_DECODE_KERNEL_CUH
#define FLASHC_CUDA_SM80_DECODE_KERNEL_CUH

#include <cuda_runtime.h>

#include <atomic>
#include <climits>

#include "../common/mask.cuh"
#include "../common/merge.cuh"
#include "../common/ptx.cuh"
#include "../common/seqlens.cuh"
#include "../common/softmax.cuh"
#include "../decode_params.h"
#include "../decode_traits.h"

// ---- the kernel ----
// grid: one CTA per (m_block, split, kv head, sequence), m_block fastest (the
// CTAs of one split read the same tiles at the same time: L2 hits); block
// kThreads; dynamic smem kSmemBytes.
template <int D, typename T>
__global__ void __launch_bounds__(fc_sm80_decode_traits<D>::kThreads)
    sm80_decode_kernel(const __grid_constant__ fc_cuda_decode_params p) {
    using Tr = fc_sm80_decode_traits<D>;
    constexpr int Br = Tr::kBr, Bc = Tr::kBc, S = Tr::kStages, W = Tr::kWarps;
    constexpr int NTH = Tr::kThreads, DT = Tr::kDT, KS = Tr::kKS, CH = Tr::kChunks;
    constexpr int RB = Tr::kRowBytes, TILE = Tr::kTileBytes, STAGE = Tr::kStageBytes;
    // chunk c of row r of a Q, K or V tile is chunk c ^ swz(r) of the row (decode_traits.h)
    const auto swz = [](int r) { return Tr::kSwizzle ? r & 7 : 0; };
    constexpr int TPR = Tr::kLoadTPR, RPP = Tr::kLoadRPP, PASSES = Tr::kLoadPasses;

    extern __shared__ __align__(128) unsigned char fc_smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    // the combine kernel (splits > 1) may place its CTAs once every CTA of
    // this grid runs; they wait for its end (ptx.cuh fc_pdl_wait)
    fc_pdl_launch_dependents();

    // ---- this CTA: (b, hk, split, m_block) ----
    int cta = (int)blockIdx.x;
    const int m_block = cta % p.m_blocks;
    cta /= p.m_blocks;
    const int split = cta % p.splits;
    cta /= p.splits;
    const int hk = cta % p.kv_heads, b = cta / p.kv_heads;
    const int bh = cta;  // b * Hk + hk
    const int G = p.f.kv_group;
    const int m0 = m_block * Br;            // first packed row of the CTA
    const int rows = min(Br, p.rows - m0);  // valid packed rows
    const int sq = p.f.seqlen_q;
    const fc_kv_span span = fc_kv_span_of(p.lens, b);  // clamped (decode_params.h)
    const int pad = span.pad, sk = span.keys;

    const T *q = static_cast<const T *>(p.f.q);
    const T *k = static_cast<const T *>(p.f.k);
    const T *v = static_cast<const T *>(p.f.v);

    // ---- the key tiles of this split ----
    // Rows of the CTA are query rows i_first .. i_last; the tiles any of them
    // sees are split into p.splits ranges of `per` tiles (the last ones may be
    // short or empty: those CTAs write an empty partial, lse = -inf).
    const fc_mask<false> mask(sq, sk, p.f.window_left, p.f.window_right);
    const int i_first = m0 / G, i_last = (m0 + rows - 1) / G;
    int t_begin = 0, n_tiles = 0;
    {
        int n_lo, n_hi;
        if (mask.template tiles<Bc>(i_first, i_last, &n_lo, &n_hi)) {
            const int per = (n_hi - n_lo + p.splits - 1) / p.splits;
            t_begin = n_lo + split * per;
            n_tiles = max(0, min(per, n_hi - t_begin));
        }
    }

    // ---- where the keys live ----
    const int32_t *bt = p.f.block_table ? p.f.block_table + (int64_t)b * p.f.bt_stride : nullptr;
    int64_t k_base = (int64_t)hk * p.f.k_s_head, v_base = (int64_t)hk * p.f.v_s_head;
    if (!bt) {
        const int64_t kb = p.f.k_batch_idx ? fc_index(p.f.k_batch_idx, b, p.f.total_k) : b;
        k_base += kb * p.f.k_s_batch;
        v_base += kb * p.f.v_s_batch;
    }

    // ---- shared memory: Q [Br][pitch], then the ring of (K [Bc][pitch], V [Bc][pitch]); rows
    // swizzled or padded (decode_traits.h) ----
    const uint32_t sQ = fc_smem_u32(fc_smem);
    const uint32_t sK = sQ + Tr::kQBytes;

    // ---- global -> shared loads ----
    // Q: packed row r of the CTA is query row i = R / G of head hk * G + R % G.
    auto load_q = [&]() {
        for (int e = tid; e < Br * CH; e += NTH) {
            const int r = e / CH, ch = e % CH;
            const bool ok = r < rows && ch * 8 < p.f.head_dim;
            const int R = m0 + (r < rows ? r : 0);
            const int64_t off = (int64_t)b * p.f.q_s_batch + (int64_t)(R / G) * p.f.q_s_seq +
                                (int64_t)(hk * G + R % G) * p.f.q_s_head + ch * 8;
            fc_cp_async_16(sQ + r * RB + (ch ^ swz(r)) * 16, ok ? q + off : q, ok);
        }
    };
    // K, V: thread tid copies chunk ld_ch of tile rows ld_row + c * RPP. Chunks
    // past the head dim are zero-filled; with a padded D, ld_ch may be past the
    // row too (the thread then copies nothing but still looks up pages).
    const int ld_ch = tid % TPR, ld_row = tid / TPR;
    const bool ld_in_row = TPR == CH || ld_ch < CH;
    // row ld_row + c * RPP of a tile starting at key j0 is copied iff j0 + c * RPP < kv_lim
    // (K; v_lim: V, of the value head dim)
    const int kv_lim = ld_ch * 8 < p.f.head_dim ? sk - ld_row : INT_MIN;
    const int v_lim = ld_ch * 8 < p.f.head_dim_v ? sk - ld_row : INT_MIN;
    // pass 0's destination, and pass c's offset from it: c * RPP rows on (the
    // swizzled chunk moves too when RPP is not a multiple of 8)
    const uint32_t ld_dst = ld_row * RB + (ld_ch ^ swz(ld_row)) * 16;
    const auto ld_pass = [&](int c) -> int {
        return c * RPP * RB + ((ld_ch ^ swz(ld_row + c * RPP)) - (ld_ch ^ swz(ld_row))) * 16;
    };
    // Paged: lane ld_ch < PASSES of a row group looks up the page of the group's
    // pass-ld_ch row (tile row ld_row + ld_ch * RPP) in the next tile to load.
    const int pg_row = ld_row + ld_ch * RPP;
    const int pg_src = lane & ~(TPR - 1);  // lane of the group's pass 0
    int pg_page = 0, pg_in = 0;            // its page and row in the page
    auto lookup = [&](int n) {
        const int j = (t_begin + n) * Bc + pg_row;
        if (n < n_tiles && ld_ch < PASSES && j < sk) {
            const fc_paged_row pr = fc_paged<true>(bt, j + pad, p.f.page_size, p.f.total_k);
            pg_page = pr.page;
            pg_in = pr.row;
        }
    };
    // Tile n of the split into ring slot n % S, one commit group (empty past
    // the last tile, so the group count per iteration stays fixed).
    auto load_tile = [&](int n) {
        if (n < n_tiles) {
            const int j0 = (t_begin + n) * Bc;
            const uint32_t dk = sK + (n % S) * STAGE + ld_dst, dv = dk + TILE;
            if (!bt) {
                if (ld_in_row) {
                    const int64_t row0 = j0 + pad + ld_row;
                    const T *ks = k + k_base + row0 * p.f.k_s_seq + ld_ch * 8;
                    const T *vs = v + v_base + row0 * p.f.v_s_seq + ld_ch * 8;
                    const int64_t kstep = (int64_t)RPP * p.f.k_s_seq,
                                  vstep = (int64_t)RPP * p.f.v_s_seq;
#pragma unroll
                    for (int c = 0; c < PASSES; ++c, ks += kstep, vs += vstep) {
                        const bool ok = j0 + c * RPP < kv_lim, ok_v = j0 + c * RPP < v_lim;
                        fc_cp_async_16(dk + ld_pass(c), ok ? ks : k, ok);
                        fc_cp_async_16(dv + ld_pass(c), ok_v ? vs : v, ok_v);
                    }
                }
            } else {
#pragma unroll
                for (int c = 0; c < PASSES; ++c) {
                    const fc_paged_row pr = {__shfl_sync(0xffffffffu, pg_page, pg_src + c),
                                             __shfl_sync(0xffffffffu, pg_in, pg_src + c)};
                    if (ld_in_row) {
                        const bool ok = j0 + c * RPP < kv_lim, ok_v = j0 + c * RPP < v_lim;
                        const T *ks =
                            k + pr.offset(k_base, p.f.k_s_batch, p.f.k_s_seq) + ld_ch * 8;
                        const T *vs =
                            v + pr.offset(v_base, p.f.v_s_batch, p.f.v_s_seq) + ld_ch * 8;
                        fc_cp_async_16(dk + ld_pass(c), ok ? ks : k, ok);
                        fc_cp_async_16(dv + ld_pass(c), ok_v ? vs : v, ok_v);
                    }
                }
                lookup(n + 1);
            }
        }
        fc_cp_async_commit();
    };

    // ---- per-lane ldmatrix addresses (ptx.cuh layouts), this warp's 16 keys ----
    // A lane reads chunk c0 + 2 s (c0 = 0 or 1) of its row at step s (16 columns);
    // swizzled, that is chunk (c0 ^ (x & 1)) + ((2 s) ^ (x & 6)), x = swz(row): the
    // address of step 0 and an offset per step.
    const auto step = [](int s, int x) { return ((2 * s) ^ (x & 6)) * 16; };
    const int wkey = 16 * warp;  // first key of this warp within a tile
    const int q_x = swz(lane & 15);
    const uint32_t q_lds = sQ + (lane & 15) * RB + ((lane >> 4) ^ (q_x & 1)) * 16;
    // K (B operand): matrices (keys 0-7, d 0-7), (0-7, 8-15), (8-15, 0-7), (8-15, 8-15)
    const int k_row = wkey + (lane & 7) + ((lane >> 4) << 3), k_x = swz(k_row);
    const uint32_t k_lds = sK + k_row * RB + (((lane >> 3) & 1) ^ (k_x & 1)) * 16;
    // V (B operand, transposed): rows 8 * (m % 2) .. +7, columns 8 * (m / 2) .. +7, m = lane / 8
    const int v_row = wkey + (lane & 15), v_x = swz(v_row);
    const uint32_t v_lds = sK + TILE + v_row * RB + ((lane >> 4) ^ (v_x & 1)) * 16;

    // ---- prologue: Q with tile 0 in group 0, tiles 1 .. S-2 in their own ----
    load_q();
    if (bt) lookup(0);
#pragma unroll
    for (int s = 0; s + 1 < S; ++s) load_tile(s);

    // ---- per-row constants of this thread's rows g and g + 8 ----
    // (padding rows past p.rows borrow the last valid row: their results are dropped)
    int qi[2];
    float slope_x[2];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const int R = min(m0 + g + 8 * hr, p.rows - 1);
        qi[hr] = R / G;
        const int h = hk * G + R % G;
        slope_x[hr] =
            p.f.alibi ? p.f.alibi[(int64_t)b * p.f.alibi_s_batch + h] * p.f.alibi_scale : 0.0f;
    }

    float acc_o[1][DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_o[0][dt][e] = 0.0f;
    fc_softmax<1> sm;
    sm.init();
    uint32_t q_frag[Tr::kQinRegs ? KS : 1][4];

    // ---- the KV loop ----
    for (int it = 0; it < n_tiles; ++it) {
        // tile it (and Q) landed (S - 2 younger groups may fly); every warp is
        // past tile it - 1, so its slot, (it + S - 1) % S, is free
        fc_cp_async_wait<S - 2>();
        __syncthreads();
        load_tile(it + S - 1);

        if constexpr (Tr::kQinRegs) {
            if (it == 0) {
#pragma unroll
                for (int ks = 0; ks < KS; ++ks) fc_ldmatrix_x4(q_frag[ks], q_lds + step(ks, q_x));
            }
        }
        const uint32_t slot = (uint32_t)(it % S) * STAGE;

        // S = Q K^T over this warp's 16 keys: two 8-key tiles
        float acc_s[1][2][4];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_s[0][nt][e] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
            uint32_t a[4], bk[4];
            if constexpr (Tr::kQinRegs) {
#pragma unroll
                for (int e = 0; e < 4; ++e) a[e] = q_frag[ks][e];
            } else {
                fc_ldmatrix_x4(a, q_lds + step(ks, q_x));
            }
            fc_ldmatrix_x4(bk, k_lds + slot + step(ks, k_x));
            fc_mma_16816<T>(acc_s[0][0], a, bk[0], bk[1]);
            fc_mma_16816<T>(acc_s[0][1], a, bk[2], bk[3]);
        }

        // score modifiers and masks; element (nt, 2hr + e) is row g + 8hr, key jw + 8nt + e
        const int jw = (t_begin + it) * Bc + wkey + 2 * t;
        if (p.f.softcap_pre != 0.0f) fc_softcap(acc_s, p.f.softcap_pre);
        if (p.f.alibi) {
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
                const float d = (float)(mask.diag(qi[hr]) - jw);
#pragma unroll
                for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                    for (int e = 0; e < 2; ++e)
                        acc_s[0][nt][2 * hr + e] = fmaf(
                            -slope_x[hr], fabsf(d - (float)(8 * nt + e)), acc_s[0][nt][2 * hr + e]);
            }
        }
        if (mask.template tile_partial<16>(i_first, i_last, jw - 2 * t)) {
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
                const int lo = mask.lo(qi[hr]) - jw, hi = mask.hi(qi[hr]) - jw;
#pragma unroll
                for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int c = 8 * nt + e;
                        if (c < lo || c >= hi) acc_s[0][nt][2 * hr + e] = -INFINITY;
                    }
            }
        }

        sm.update(acc_s, acc_o, p.f.score_scale_log2, it == 0);

        // O += P V: the C fragments of the two 8-key tiles are the A fragment of one k16 slice
        uint32_t pf[4];
        pf[0] = fc_pack2<T>(acc_s[0][0][0], acc_s[0][0][1]);
        pf[1] = fc_pack2<T>(acc_s[0][0][2], acc_s[0][0][3]);
        pf[2] = fc_pack2<T>(acc_s[0][1][0], acc_s[0][1][1]);
        pf[3] = fc_pack2<T>(acc_s[0][1][2], acc_s[0][1][3]);
#pragma unroll
        for (int dp = 0; dp < DT / 2; ++dp) {
            uint32_t bv[4];
            fc_ldmatrix_x4_trans(bv, v_lds + slot + step(dp, v_x));
            fc_mma_16816<T>(acc_o[0][2 * dp], pf, bv[0], bv[1]);
            fc_mma_16816<T>(acc_o[0][2 * dp + 1], pf, bv[2], bv[3]);
        }
    }
    fc_cp_async_wait<0>();  // only empty groups can remain
    __syncthreads();        // every warp is done with the ring: it becomes the merge scratch

    // ---- merge the W warps' (m, l, O) ----
    // scratch: O [W][Br][kOPitch] fp32, then m [W][Br] and l [W][Br]
    float *sO = reinterpret_cast<float *>(fc_smem + Tr::kQBytes);
    float *sM = sO + W * Br * Tr::kOPitch;
    float *sL = sM + W * Br;
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const int r = g + 8 * hr;
        const float l = fc_quad_sum(sm.l[0][hr]);
        if (t == 0) {
            sM[warp * Br + r] = sm.m[0][hr];
            sL[warp * Br + r] = l;
        }
        float *dst = sO + (warp * Br + r) * Tr::kOPitch + 2 * t;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt)
            *reinterpret_cast<float2 *>(dst + dt * 8) =
                make_float2(acc_o[0][dt][2 * hr], acc_o[0][dt][2 * hr + 1]);
    }
    __syncthreads();

    // out row = sum_w e^(m_w - M) O_w / sum_w e^(m_w - M) l_w, M = max_w m_w
    // (x units: e^(m * scale) = 2^(m * score_scale_log2)); a row that saw no
    // key (every m_w = -inf) gets 0 and lse = -inf. A learnable sink joins the
    // denominator here when there is one split (fc_sink_normalise), else in
    // the combine kernel.
    const float sl2 = p.f.score_scale_log2;
    T *o = static_cast<T *>(p.f.o);
    for (int e = tid; e < Br * CH; e += NTH) {
        const int r = e / CH, ch = e % CH;
        if (r >= rows || ch * 8 >= p.f.head_dim_v) continue;
        float mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < W; ++w) mx = fmaxf(mx, sM[w * Br + r]);
        float scale[W], l = 0.0f;
#pragma unroll
        for (int w = 0; w < W; ++w) {
            scale[w] = mx == -INFINITY ? 0.0f : fc_exp2((sM[w * Br + r] - mx) * sl2);
            l += scale[w] * sL[w * Br + r];
        }
        const int R = m0 + r, i = R / G, h = hk * G + R % G;
        // one split: the sink (if any) joins here, else in the combine kernel
        const fc_row_sink sink =
            p.splits == 1 ? fc_sink_of(p.f, h) : fc_row_sink{-INFINITY, -INFINITY};
        float inv, lse;
        if (sink.s2 != -INFINITY) {
            fc_sink_normalise(l, mx * sl2, sink, 1.0f, p.f.ln2, &inv, &lse);
        } else {
            const bool empty = l == 0.0f;  // NaN (a NaN score) is not empty: NaN out, lse
            inv = empty ? 0.0f : 1.0f / l;
            lse = empty ? -INFINITY : mx * p.f.score_scale + logf(l);
        }
        float acc[8];
#pragma unroll
        for (int x = 0; x < 8; ++x) acc[x] = 0.0f;
#pragma unroll
        for (int w = 0; w < W; ++w)
            fc_axpy8(acc, scale[w] * inv, sO + (w * Br + r) * Tr::kOPitch + ch * 8);
        if (p.splits == 1) {
            fc_st_global_v4(o + (int64_t)b * p.f.o_s_batch + (int64_t)i * p.f.o_s_seq +
                                (int64_t)h * p.f.o_s_head + ch * 8,
                            fc_pack8<T>(acc));
            if (ch == 0 && p.f.lse)
                p.f.lse[(int64_t)b * p.f.lse_s_batch + (int64_t)h * p.f.lse_s_head +
                        (int64_t)i * p.f.lse_s_seq] = lse;
        } else {
            const int64_t prow = ((int64_t)split * p.f.batch * p.kv_heads + bh) * p.rows + R;
            float4 *dst = reinterpret_cast<float4 *>(p.o_accum + prow * p.f.head_dim_v + ch * 8);
            dst[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
            dst[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
            if (ch == 0) p.lse_accum[prow] = lse;
        }
    }
}

// ---- the launcher and occupancy of one instance (instantiated in inst/*.cu) ----
// Per device, once: the dynamic shared memory limit, and the whole unified
// L1/shared array as shared memory (the kernel reads global memory through
// cp.async.cg only, so L1 is worth nothing to it, and a second CTA per SM is).
template <int D, typename T>
static cudaError_t fc_sm80_decode_setup(int *dev_out) {
    static std::atomic<uint64_t> done{0};  // bit d: device d is set up
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    *dev_out = dev;
    const uint64_t bit = dev < 64 ? 1ull << dev : 0;
    if (done.load(std::memory_order_relaxed) & bit) return cudaSuccess;
    e = cudaFuncSetAttribute(sm80_decode_kernel<D, T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             fc_sm80_decode_traits<D>::kSmemBytes);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(sm80_decode_kernel<D, T>,
                                 cudaFuncAttributePreferredSharedMemoryCarveout,
                                 (int)cudaSharedmemCarveoutMaxShared);
    if (e == cudaSuccess) done.fetch_or(bit, std::memory_order_relaxed);
    return e;
}

// Launch `grid` CTAs on `stream`. Returns the launch's cudaError_t; never synchronises.
template <int D, typename T>
cudaError_t sm80_decode_launch(const fc_cuda_decode_params &p, unsigned grid, cudaStream_t stream) {
    using Tr = fc_sm80_decode_traits<D>;
    int dev = 0;
    const cudaError_t e = fc_sm80_decode_setup<D, T>(&dev);
    if (e != cudaSuccess) return e;
    sm80_decode_kernel<D, T><<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(p);
    return cudaGetLastError();
}

// CTAs of this instance that fit one SM of the current device (the split
// heuristic's slot count), cached per device.
template <int D, typename T>
cudaError_t sm80_decode_ctas_per_sm(int *n) {
    static std::atomic<int> cached[64];  // 0 = not asked yet
    int dev = 0;
    cudaError_t e = fc_sm80_decode_setup<D, T>(&dev);
    if (e != cudaSuccess) return e;
    if (dev < 64 && (*n = cached[dev].load(std::memory_order_relaxed)) > 0) return cudaSuccess;
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(n, sm80_decode_kernel<D, T>,
                                                      fc_sm80_decode_traits<D>::kThreads,
                                                      fc_sm80_decode_traits<D>::kSmemBytes);
    if (e == cudaSuccess && dev < 64) cached[dev].store(*n, std::memory_order_relaxed);
    return e;
}

#endif  // FLASHC_CUDA_SM80_DECODE_KERNEL_CUH
