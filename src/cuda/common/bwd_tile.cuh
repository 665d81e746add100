// bwd_tile.cuh : what the backward's main kernels (sm80/bwd_kernel.cuh,
// sm90/bwd_kernel.cuh) share around their GEMMs: the key block a CTA owns and
// the query blocks it walks, the loads of K, V and of one query block's Q, dO,
// lse2, delta, and the final dK, dV stores. The shared-memory layouts differ
// (padded rows on sm80, the 128B swizzle on sm90), so every function takes the
// thread's first shared address and the step between its rows, as
// fc_tile_loader does, or an offset function.
#ifndef FLASHC_CUDA_BWD_TILE_CUH
#define FLASHC_CUDA_BWD_TILE_CUH

#include "../../common/window.h"
#include "../bwd_params.h"
#include "fwd_tile.cuh"
#include "mask.cuh"
#include "ptx.cuh"
#include "seqlens.cuh"

// The CTA's key block n, grid row y (its KV head and, with the GQA split, its
// part: bwd_params.h kv_split) and sequence b: blockIdx (x, y, z), or (y, x, z)
// in a key-major causal grid (bwd_params.h key_major).
struct fc_bwd_coords {
    int n, y, b;
};
template <bool kCausal>
__device__ __forceinline__ fc_bwd_coords fc_bwd_cta_coords(const fc_cuda_bwd_params &p) {
    const bool key_major = kCausal && p.key_major;
    return {key_major ? (int)blockIdx.y : (int)blockIdx.x,
            key_major ? (int)blockIdx.x : (int)blockIdx.y, (int)blockIdx.z};
}

// ---- the key block of a CTA and its query blocks ----
struct fc_bwd_block {
    int64_t q_tok0, k_tok0;  // first query and key token of the sequence (varlen)
    int sq, sk;              // its lengths
    int j0, kv_rows;         // first key of the block, its valid rows
    int m_lo, m_span;        // the query blocks m_lo .. m_lo + m_span - 1 it may see
    int n_iters;             // heads * m_span: (query head, query block) pairs walked

    // False when key block n_block lies past sequence b's keys. The CTA walks
    // `heads` query heads from a first one h0 (iter_hm): the KV head's group,
    // or the part of it that bwd_params.h kv_split gives the CTA. The query
    // blocks come from
    // the window edges, widened by one block each way (the exact test,
    // fc_mask::tiles, runs per iteration: both sides of the deterministic turn
    // order agree on which CTAs visit a query block).
    template <int Br, int Bc, bool kCausal>
    __device__ __forceinline__ bool init(const fc_cuda_bwd_params &p, int b, int n_block,
                                         int heads) {
        const fc_cuda_fwd_params &f = p.f;
        int q0;
        fc_bwd_q_seq(p, b, &sq, &q0);
        q_tok0 = q0;
        k_tok0 = 0;
        sk = f.seqlen_k;
        if (f.cu_seqlens_k) {
            const fc_span s = fc_cu_span(f.cu_seqlens_k, b, f.total_k, f.seqlen_k);
            k_tok0 = s.start;
            sk = s.len;
        }
        j0 = n_block * Bc;
        if (j0 >= sk) return false;
        kv_rows = min(Bc, sk - j0);
        const int m_count = (sq + Br - 1) / Br;
        m_lo = 0;
        int m_hi = m_count;
        if (kCausal || f.window_right >= 0) {
            const int right = kCausal ? 0 : f.window_right;
            const int i_lo = FC_WINDOW_ROW_LO(j0, right, sq, sk);  // first row that sees key j0
            m_lo = max(0, i_lo / Br - 1);
        }
        if (f.window_left >= 0) {
            // the last row that sees the block's last key
            const int i_hi = FC_WINDOW_ROW_HI(j0 + Bc - 1, f.window_left, sq, sk);
            m_hi = min(m_count, max(0, i_hi / Br + 2));
        }
        m_span = m_hi > m_lo ? m_hi - m_lo : 0;
        n_iters = heads * m_span;
        return true;
    }

    // The first scratch row of the sequence (bwd_params.h fc_bwd_row0), from
    // q_tok0 when needed rather than kept in registers.
    __device__ __forceinline__ int64_t row0(const fc_cuda_bwd_params &p, int b) const {
        return fc_bwd_row0(p, b, (int)q_tok0);
    }

    // The query head and block of iteration `it`, the first head being h0.
    __device__ __forceinline__ void iter_hm(int it, int h0, int *h, int *m) const {
        *h = h0 + it / m_span;
        *m = m_lo + it % m_span;
    }
};

// K and V rows j0 .. j0 + Bc - 1 of KV head hk (zero past the sequence's keys,
// and past D, Dv) to the thread's addresses k_dst, v_dst and rows `step` bytes apart.
template <class Ld, int Bc, typename T>
__device__ __forceinline__ void fc_bwd_load_kv(const Ld &ld, const fc_cuda_bwd_params &p, int b,
                                               int hk, const fc_bwd_block &blk, uint32_t k_dst,
                                               uint32_t v_dst, uint32_t step) {
    const fc_cuda_fwd_params &f = p.f;
    fc_kv_rows kv = {};
    kv.k_base = blk.k_tok0 * f.k_s_seq + (f.cu_seqlens_k ? 0 : (int64_t)b * f.k_s_batch) +
                (int64_t)hk * f.k_s_head;
    kv.v_base = blk.k_tok0 * f.v_s_seq + (f.cu_seqlens_k ? 0 : (int64_t)b * f.v_s_batch) +
                (int64_t)hk * f.v_s_head;
    ld.template load_kv<Bc>(k_dst, step, static_cast<const T *>(f.k), kv.k_base, 0, f.k_s_seq,
                            blk.j0, kv, 0, false);  // not paged
    ld.template load_kv<Bc>(v_dst, step, static_cast<const T *>(f.v), kv.v_base, 0, f.v_s_seq,
                            blk.j0, kv, 0, true);
}

// Iteration `it`'s query block (h0: the CTA's first query head; Q and dO rows
// of its head, zero past the sequence's rows and past D, Dv; lse2 and delta) into ring slot
// it % QS: Q at sQ + slot * q_bytes + dst(row, ch) for the thread's first row
// and chunk, rows `step` bytes apart, dO likewise at sdO, lse2 and delta to
// the fp32 arrays sLse, sDelta [QS][Br]. One cp.async commit, empty past the
// last iteration (the group count per iteration stays fixed).
template <class Ld, int Br, int QS, int NTH, typename T, class Dst>
__device__ __forceinline__ void fc_bwd_load_q(const fc_cuda_bwd_params &p, int b, int h0,
                                              const fc_bwd_block &blk, int tid, int it,
                                              uint32_t sQ, uint32_t sdO, uint32_t q_bytes,
                                              uint32_t step, uint32_t sLse, uint32_t sDelta,
                                              Dst dst) {
    if (it < blk.n_iters) {
        const fc_cuda_fwd_params &f = p.f;
        int h, m;
        blk.iter_hm(it, h0, &h, &m);
        const int m0 = m * Br;
        const Ld ld(tid, f.head_dim, f.head_dim_v, min(Br, blk.sq - m0), blk.sk);
        const uint32_t slot = (uint32_t)(it % QS), off = slot * q_bytes + dst(ld.row, ld.ch);
        const int64_t tok = blk.q_tok0 + m0;
        const int64_t qb = (f.cu_seqlens_q ? 0 : (int64_t)b * f.q_s_batch) + tok * f.q_s_seq +
                           (int64_t)h * f.q_s_head;
        const int64_t db = (f.cu_seqlens_q ? 0 : (int64_t)b * p.do_s_batch) + tok * p.do_s_seq +
                           (int64_t)h * p.do_s_head;
        ld.template load_q<Br>(sQ + off, step, static_cast<const T *>(f.q), qb, f.q_s_seq);
        ld.template load_q<Br>(sdO + off, step, static_cast<const T *>(p.dout), db, p.do_s_seq,
                               true);
        const int64_t srow = (int64_t)h * p.rows + blk.row0(p, b) + m0;
        for (int r = tid; r < Br; r += NTH) {
            fc_cp_async_4(sLse + (slot * Br + r) * 4, p.lse2 + srow + r);
            fc_cp_async_4(sDelta + (slot * Br + r) * 4, p.delta + srow + r);
        }
    }
    fc_cp_async_commit();
}

// dK and dV of the block, already in shared memory at sK + off(r, ch) and
// sV + off(r, ch) (16-byte chunk ch of row r, 16-bit), to the caller's rows
// with 16-byte stores; rows past the sequence and chunks past head_dim (dK)
// or head_dim_v (dV) are left out. The CTA's NTH threads share the rows.
template <typename T, int Bc, int CH, int NTH, class Off>
__device__ __forceinline__ void fc_bwd_store_dkdv(const fc_cuda_bwd_params &p, int b, int hk,
                                                  const fc_bwd_block &blk, int tid, uint32_t sK,
                                                  uint32_t sV, Off off) {
    const fc_cuda_fwd_params &f = p.f;
    T *dk = static_cast<T *>(p.dk), *dv = static_cast<T *>(p.dv);
    const int64_t dk_base = (f.cu_seqlens_k ? 0 : (int64_t)b * p.dk_s_batch) +
                            (blk.k_tok0 + blk.j0) * p.dk_s_seq + (int64_t)hk * p.dk_s_head;
    const int64_t dv_base = (f.cu_seqlens_k ? 0 : (int64_t)b * p.dv_s_batch) +
                            (blk.k_tok0 + blk.j0) * p.dv_s_seq + (int64_t)hk * p.dv_s_head;
    for (int idx = tid; idx < Bc * CH; idx += NTH) {
        const int r = idx / CH, ch = idx % CH;
        if (r >= blk.kv_rows) continue;
        if (ch * 8 < f.head_dim)
            fc_st_global_v4(dk + dk_base + (int64_t)r * p.dk_s_seq + ch * 8,
                            fc_ld_shared_v4(sK + off(r, ch)));
        if (ch * 8 < f.head_dim_v)
            fc_st_global_v4(dv + dv_base + (int64_t)r * p.dv_s_seq + ch * 8,
                            fc_ld_shared_v4(sV + off(r, ch)));
    }
}

#endif  // FLASHC_CUDA_BWD_TILE_CUH
