// fwd_tile.cuh : what every forward kernel does around its math: find the
// query tile's sequence and the rows it reads and writes, copy tiles of Q, K
// and V from global to shared memory, and write the output of a tile whose
// rows see no key.
//
//   fc_kv_rows      where key row j of a sequence lives (contiguous, varlen,
//                   paged through block_table with any page size, leftpad,
//                   cache_batch_idx): src/internal.h fc_kv_row; pages through
//                   seqlens.cuh fc_paged
//   fc_fwd_seq      the sequence of (batch b, head h, query tile m0) and its
//                   row bases
//   fc_tile_loader  cp.async 16-byte copies, one chunk column per thread; the
//                   kernel gives the shared address of the thread's first chunk
//                   and the step between its rows, so any shared layout works
//                   (sm80: padded rows; sm90: the 128B swizzle of wgmma.cuh)
//   fc_fwd_store_empty  out = 0 and lse = -inf (the sink with one) for a tile
//                   with no visible key
//   fc_fwd_tile_keys   what a query tile holds: past its sequence, empty, or
//                   key tiles to work
//   fc_fwd_tile_begin  the above, for the first lines of a one-tile kernel
//   fc_launch_kernel  the host side of a launch (shared memory limit once)
#ifndef FLASHC_CUDA_FWD_TILE_CUH
#define FLASHC_CUDA_FWD_TILE_CUH

#include <cuda_runtime.h>

#include <atomic>
#include <climits>
#include <math.h>

#include "../params.h"
#include "mask.cuh"
#include "ptx.cuh"
#include "seqlens.cuh"
#include "softmax.cuh"

// ---- where the key rows of one sequence live ----
struct fc_kv_rows {
    const int32_t *bt;  // this sequence's block_table row, or NULL (not paged)
    int page_size;
    int leftpad;        // k_leftpad[b], or 0
    int64_t k_base;     // k_batch_idx / varlen / head offset (paged: head offset only)
    int64_t v_base;

    // Element offset of key row j (j + leftpad < bt_cols * page_size when
    // paged) of the operand with base `base` and strides; `pages` bounds the
    // block_table entries (params.h total_k).
    __device__ __forceinline__ int64_t offset(int j, int64_t base, int64_t s_batch, int64_t s_seq,
                                              int pages) const {
        const int r = j + leftpad;
        if (bt) return fc_paged(bt, r, page_size, pages).offset(base, s_batch, s_seq);
        return base + (int64_t)r * s_seq;
    }
};

// ---- the sequence of one query tile ----
struct fc_fwd_seq {
    int sq, sk;        // query and key lengths of sequence b
    int m0;            // first query row of the tile (in the sequence)
    int rows;          // valid rows of the tile, min(Br, sq - m0)
    int64_t q_base;    // tile row r: q + q_base + r * q_s_seq (likewise o)
    int64_t o_base;
    int64_t lse_base;  // tile row r: lse + lse_base + r * lse_s_seq
    fc_kv_rows kv;

    // False when the tile starting at query row m0 lies past sequence b's end.
    // The lengths and rows are clamped to the operands (common/seqlens.cuh).
    __device__ __forceinline__ bool init(const fc_cuda_fwd_params &p, int b, int h, int m0_,
                                         int Br) {
        int q_row0 = 0;
        sq = p.seqlen_q;
        if (p.cu_seqlens_q) {
            const fc_span s = fc_cu_span(p.cu_seqlens_q, b, p.total_q, p.seqlen_q);
            q_row0 = s.start;
            sq = s.len;
        }
        m0 = m0_;
        if (m0 >= sq) return false;
        int k_row0 = 0;
        sk = p.seqlen_k;
        if (p.cu_seqlens_k) {
            // paged: cu_seqlens_k gives lengths only, the pages hold the rows
            const fc_span s = fc_cu_span(p.cu_seqlens_k, b, p.block_table ? INT_MAX : p.total_k,
                                         p.seqlen_k);
            k_row0 = s.start;
            sk = s.len;
        }
        if (p.seqlens_k) sk = fc_clampi(p.seqlens_k[b], 0, sk);
        if (p.block_table)  // no key past the block_table row
            sk = (int)min((int64_t)sk, (int64_t)p.bt_cols * p.page_size -
                                           (p.k_leftpad ? p.k_leftpad[b] : 0));
        rows = min(Br, sq - m0);
        q_base = (p.cu_seqlens_q ? 0 : (int64_t)b * p.q_s_batch) +
                 (int64_t)(q_row0 + m0) * p.q_s_seq + (int64_t)h * p.q_s_head;
        o_base = (p.cu_seqlens_q ? 0 : (int64_t)b * p.o_s_batch) +
                 (int64_t)(q_row0 + m0) * p.o_s_seq + (int64_t)h * p.o_s_head;
        lse_base = (int64_t)b * p.lse_s_batch + (int64_t)h * p.lse_s_head +
                   (int64_t)(q_row0 + m0) * p.lse_s_seq;

        const int hk = h / p.kv_group;
        kv.bt = p.block_table ? p.block_table + (int64_t)b * p.bt_stride : nullptr;
        kv.page_size = p.page_size;
        kv.leftpad = p.k_leftpad ? p.k_leftpad[b] : 0;
        int64_t k_seq = 0, v_seq = 0;
        if (!p.block_table) {
            if (p.cu_seqlens_k) {
                k_seq = (int64_t)k_row0 * p.k_s_seq;
                v_seq = (int64_t)k_row0 * p.v_s_seq;
            } else {
                const int64_t kb = p.k_batch_idx ? fc_index(p.k_batch_idx, b, p.total_k) : b;
                k_seq = kb * p.k_s_batch;
                v_seq = kb * p.v_s_batch;
            }
        }
        kv.k_base = k_seq + (int64_t)hk * p.k_s_head;
        kv.v_base = v_seq + (int64_t)hk * p.v_s_head;
        return true;
    }
};

// ---- global -> shared tile copies ----
// Thread tid copies 16-byte chunk ch = tid % TPR of tile rows row + c * RPP
// (row = tid / TPR, c = 0, 1, ... while the row is below ROWS; the last pass
// may be partial when RPP does not divide ROWS) to shared address dst + c * step.
// Chunks past the operand's head dim (D for q, k; Dv for the value-dim
// operands: v, and dout on the query side) and rows past the valid ones are
// zero-filled (cp.async src-size 0); a thread whose chunk is past the
// instance's row (TPR > CH, a padded D) copies nothing. The caller commits.
template <typename T, int NTH, int CH>
struct fc_tile_loader {
    static constexpr int TPR = CH <= 4 ? 4 : CH <= 8 ? 8 : CH <= 16 ? 16 : 32;  // threads per row
    static constexpr int RPP = NTH / TPR;  // rows per pass of the CTA
    static_assert(NTH % TPR == 0, "the CTA must cover whole rows");

    // Passes over a tile of ROWS rows; the last one is partial when RPP does not divide ROWS.
    template <int ROWS>
    __host__ __device__ static constexpr int passes() { return (ROWS + RPP - 1) / RPP; }
    template <int ROWS>
    __device__ __forceinline__ bool in_tile(int c) const {
        return ROWS % RPP == 0 || c + 1 < passes<ROWS>() || row + c * RPP < ROWS;
    }

    int ch, row;
    bool active;        // the chunk is inside the instance's row
    int q_lim, kv_lim;  // row + c * RPP of a tile at j0 is copied iff j0 + c * RPP < lim
    int o_lim, v_lim;   // the same for the value head dim (q-like dout, and v)

    __device__ __forceinline__ fc_tile_loader(int tid, int head_dim, int head_dim_v, int q_rows,
                                              int sk) {
        ch = tid % TPR;
        row = tid / TPR;
        active = TPR == CH || ch < CH;
        const bool in_dim = ch * 8 < head_dim, in_dim_v = ch * 8 < head_dim_v;
        q_lim = in_dim ? q_rows - row : INT_MIN;
        kv_lim = in_dim ? sk - row : INT_MIN;
        o_lim = in_dim_v ? q_rows - row : INT_MIN;
        v_lim = in_dim_v ? sk - row : INT_MIN;
    }

    // The query tile: row r at q + q_base + r * s_seq; value: an operand of
    // the value head dim (dout).
    template <int ROWS>
    __device__ __forceinline__ void load_q(uint32_t dst, uint32_t step, const T *q, int64_t q_base,
                                           int64_t s_seq, bool value = false) const {
        if (!active) return;
        const int lim = value ? o_lim : q_lim;
        const T *src = q + q_base + (int64_t)row * s_seq + ch * 8;
        const int64_t jump = (int64_t)RPP * s_seq;
#pragma unroll
        for (int c = 0; c < passes<ROWS>(); ++c, src += jump) {
            if (!in_tile<ROWS>(c)) break;
            const bool ok = c * RPP < lim;
            fc_cp_async_16(dst + c * step, ok ? src : q, ok);
        }
    }

    // Key rows (value: value rows, of the value head dim) j0 .. j0 + ROWS - 1
    // of operand `base` (kv.offset; pages: the cache's, when paged).
    template <int ROWS>
    __device__ __forceinline__ void load_kv(uint32_t dst, uint32_t step, const T *base,
                                            int64_t op_base, int64_t s_batch, int64_t s_seq,
                                            int j0, const fc_kv_rows &kv, int pages,
                                            bool value) const {
        if (!active) return;
        const int lim = value ? v_lim : kv_lim;
        op_base += ch * 8;
        if (!kv.bt) {
            // contiguous rows: one pointer, stepped by RPP rows
            const T *src = base + op_base + (int64_t)(j0 + kv.leftpad + row) * s_seq;
            const int64_t jump = (int64_t)RPP * s_seq;
#pragma unroll
            for (int c = 0; c < passes<ROWS>(); ++c, src += jump) {
                if (!in_tile<ROWS>(c)) break;
                const bool ok = j0 + c * RPP < lim;
                fc_cp_async_16(dst + c * step, ok ? src : base, ok);
            }
        } else {
            // paged: every row looks up its page (any page size)
#pragma unroll
            for (int c = 0; c < passes<ROWS>(); ++c) {
                if (!in_tile<ROWS>(c)) break;
                const bool ok = j0 + c * RPP < lim;
                const int j = j0 + row + c * RPP;
                const T *src = ok ? base + kv.offset(j, op_base, s_batch, s_seq, pages) : base;
                fc_cp_async_16(dst + c * step, src, ok);
            }
        }
    }
};

// Key rows j0 .. j0 + ROWS - 1 of K (is_v false) or V of the tile's sequence.
template <typename Ld, int ROWS, typename T>
__device__ __forceinline__ void fc_load_kv_tile(const Ld &ld, uint32_t dst, uint32_t step, bool is_v,
                                                const fc_cuda_fwd_params &p, const fc_fwd_seq &seq,
                                                int j0) {
    if (is_v)
        ld.template load_kv<ROWS>(dst, step, static_cast<const T *>(p.v), seq.kv.v_base,
                                  p.v_s_batch, p.v_s_seq, j0, seq.kv, p.total_k, true);
    else
        ld.template load_kv<ROWS>(dst, step, static_cast<const T *>(p.k), seq.kv.k_base,
                                  p.k_s_batch, p.k_s_seq, j0, seq.kv, p.total_k, false);
}

// ---- launching a kernel (forward or backward) ----
// Raise `kernel`'s dynamic shared memory limit to `smem` once per device (bit
// d of *smem_set), then launch it on `stream` with the argument struct p; pdl:
// as a programmatic dependent launch (ptx.cuh fc_pdl_wait: the kernel waits
// for the one before it; only for devices of compute capability 9.0 and later).
// Returns the launch's cudaError_t; never synchronises.
template <typename Kernel, typename Params>
cudaError_t fc_launch_kernel(Kernel kernel, std::atomic<uint64_t> *smem_set, int smem, int threads,
                             dim3 grid, cudaStream_t stream, const Params &p, bool pdl) {
    if (smem > 48 * 1024) {
        int dev = 0;
        cudaError_t e = cudaGetDevice(&dev);
        if (e != cudaSuccess) return e;
        const uint64_t bit = dev < 64 ? 1ull << dev : 0;
        if (!(smem_set->load(std::memory_order_relaxed) & bit)) {
            e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
            if (e != cudaSuccess) return e;
            smem_set->fetch_or(bit, std::memory_order_relaxed);
        }
    }
    return fc_launch(kernel, grid, dim3(threads), smem, stream, pdl, p);
}

// ---- a tile of head h whose rows see no key: out = 0, lse = -inf (the sink with one) ----
template <typename T, int CH, int BR, int NTH>
__device__ __forceinline__ void fc_fwd_store_empty(const fc_cuda_fwd_params &p, int h,
                                                   const fc_fwd_seq &seq, int tid) {
    T *o = static_cast<T *>(p.o);
    for (int idx = tid; idx < BR * CH; idx += NTH) {
        const int r = idx / CH, ch = idx % CH;
        if (r < seq.rows && ch * 8 < p.head_dim_v)
            *reinterpret_cast<uint4 *>(o + seq.o_base + (int64_t)r * p.o_s_seq + ch * 8) =
                make_uint4(0u, 0u, 0u, 0u);
    }
    if (p.lse) {
        const float lse = fc_sink_of(p, h).s;
        for (int r = tid; r < seq.rows; r += NTH)
            p.lse[seq.lse_base + (int64_t)r * p.lse_s_seq] = lse;
    }
}

// ---- the start of every forward kernel ----
// What query tile m_block of (b, h) holds: FC_TILE_PAST (it lies past its
// sequence), FC_TILE_EMPTY (no row sees a key) or FC_TILE_WORK (its rows may
// see the key tiles [*n_lo, *n_hi)); *seq is its sequence unless PAST.
enum { FC_TILE_PAST, FC_TILE_EMPTY, FC_TILE_WORK };
template <bool kCausal, int BR, int BC>
__device__ __forceinline__ int fc_fwd_tile_keys(const fc_cuda_fwd_params &p, int b, int h,
                                                int m_block, fc_fwd_seq *seq, int *n_lo,
                                                int *n_hi) {
    if (!seq->init(p, b, h, m_block * BR, BR)) return FC_TILE_PAST;
    const fc_mask<kCausal> mask(seq->sq, seq->sk, p.window_left, p.window_right);
    return mask.template tiles<BC>(seq->m0, seq->m0 + seq->rows - 1, n_lo, n_hi) ? FC_TILE_WORK
                                                                                : FC_TILE_EMPTY;
}

// The same for a kernel of one tile per CTA: false when there is nothing more
// to do (and for an empty tile out = 0 and lse = -inf, or the sink, are
// written). Written out, not through fc_fwd_tile_keys: through it, ptxas
// (nvcc 13.0) compiles the sm80 and sm90 kernels differently (48 more
// instructions at sm90 D64).
template <typename T, bool kCausal, int BR, int BC, int CH, int NTH>
__device__ __forceinline__ bool fc_fwd_tile_begin(const fc_cuda_fwd_params &p, int b, int h,
                                                  int m_block, int tid, fc_fwd_seq *seq, int *n_lo,
                                                  int *n_hi) {
    if (!seq->init(p, b, h, m_block * BR, BR)) return false;
    const fc_mask<kCausal> mask(seq->sq, seq->sk, p.window_left, p.window_right);
    if (!mask.template tiles<BC>(seq->m0, seq->m0 + seq->rows - 1, n_lo, n_hi)) {
        fc_fwd_store_empty<T, CH, BR, NTH>(p, h, *seq, tid);
        return false;
    }
    return true;
}

#endif  // FLASHC_CUDA_FWD_TILE_CUH
