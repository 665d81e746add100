// seqlens.cuh : the bounds of a sequence, read from metadata that lives on the
// GPU (cu_seqlens, seqused_k, block_table, cache_seqlens, cache_leftpad,
// cache_batch_idx), clamped so that no value moves a read or a write outside
// its tensor. The host never reads these arrays (that would need a
// synchronisation), so every kernel reads them through the helpers here;
// flashc.h ("Metadata on the GPU") states the rule for users, and the CPU
// backend rejects the same values instead (prepare.c).
//
// The clamped values define the result: a sequence is what its clamped bounds
// say, and a valid input is never changed by them.
#ifndef FLASHC_CUDA_SEQLENS_CUH
#define FLASHC_CUDA_SEQLENS_CUH

#include <stdint.h>

__device__ __forceinline__ int fc_clampi(int x, int lo, int hi) { return min(max(x, lo), hi); }

// Rows [start, start + len) of sequence b of an operand packed by cu [B + 1]
// over `total` rows: start = clamp(cu[b], 0, total), end = clamp(cu[b + 1],
// start, total), len = min(end - start, max_len). A decreasing entry gives an
// empty sequence; rows past max_len are not part of it.
struct fc_span {
    int start, len;
};
__device__ __forceinline__ fc_span fc_cu_span(const int32_t *cu, int b, int total, int max_len) {
    const int start = fc_clampi(cu[b], 0, total);
    const int end = fc_clampi(cu[b + 1], start, total);
    return {start, min(end - start, max_len)};
}

// The page of row r (< cols * page_size) of a sequence whose block_table row
// is bt: its entry clamped to [0, pages - 1]. kLdg reads the entry through the
// read-only data cache (__ldg).
template <bool kLdg = false>
__device__ __forceinline__ int fc_page(const int32_t *bt, int r, int page_size, int pages) {
    const int32_t *e = bt + r / page_size;
    return fc_clampi(kLdg ? __ldg(e) : *e, 0, pages - 1);
}

// ---- paged K/V: where a cache row lives ----
// The rule of every paged kernel (forward, decode, the kvcache append; the
// host's statement of it is src/internal.h fc_kv_row): key row j of sequence b
// is row r = j + leftpad(b) of the sequence's cache, and cache row r is row
// r % page_size of page block_table[b][r / page_size] (fc_page: the entry
// clamped). Its element offset in an operand is
//     page * s_batch + (r % page_size) * s_seq   (+ the head's offset)
struct fc_paged_row {
    int page;  // the block_table entry, clamped to [0, pages - 1]
    int row;   // r % page_size: the row inside the page

    // base + the element offset of the row in an operand with these strides.
    __device__ __forceinline__ int64_t offset(int64_t base, int64_t s_batch, int64_t s_seq) const {
        return base + (int64_t)page * s_batch + (int64_t)row * s_seq;
    }
};

// Cache row r (< cols * page_size) of the sequence whose block_table row is bt.
template <bool kLdg = false>
__device__ __forceinline__ fc_paged_row fc_paged(const int32_t *bt, int r, int page_size,
                                                 int pages) {
    return {fc_page<kLdg>(bt, r, page_size, pages), r % page_size};
}

// Row idx[b] of an index array (cache_batch_idx) clamped to [0, n - 1].
__device__ __forceinline__ int fc_index(const int32_t *idx, int b, int n) {
    return fc_clampi(idx[b], 0, n - 1);
}

#endif  // FLASHC_CUDA_SEQLENS_CUH
