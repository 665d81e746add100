// repack.cuh : copies of operands the sm80 kernels cannot read in place
// (included by plan.cu only).
//
// The kernels need 16-byte aligned data, strides that are multiples of 8
// elements and a head dim that is a multiple of 8. An operand that misses one
// is copied into a dense, zero-padded workspace buffer [n0, n1, heads, dp]
// (dp = its own head dim d rounded up to 8: D for q, k, dk, Dv for v, out,
// dout, dv) and the kernel reads that; `out` is written to such a buffer and
// the first d columns are copied back. The index space (n0, n1) is the operand's
// own first two axes, so every layout of fc_attn maps onto it unchanged:
//   batched q/out [B, Sq], k/v [B, Sk]; varlen [1, total] (s_batch 0, rows by
//   token index); paged k/v [pages, page_size] (pages copied as pages).
// Zero columns in q and k leave the scores exact; extra v columns land only in
// out's padding, which is never copied back. 2-byte dtypes, bits copied as is.
#ifndef FLASHC_CUDA_REPACK_CUH
#define FLASHC_CUDA_REPACK_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "../../internal.h"
#include "../plan.h"  // fc_cuda_pack_dims

// The element offset in view v of row `row` (= (b*n1 + s)*heads + h).
__device__ __forceinline__ int64_t fc_cuda_pack_src(const fc_cuda_pack_dims &e, int64_t s_batch,
                                                    int64_t s_seq, int64_t s_head, int64_t row) {
    const int64_t h = row % e.heads, bs = row / e.heads;
    return (bs / e.n1) * s_batch + (bs % e.n1) * s_seq + h * s_head;
}

// ---- kernels ----
// dst[row][c] = c < d ? src(row)[c] : 0, dst dense with row stride dp.
__global__ void fc_cuda_pack_kernel(uint16_t *__restrict__ dst, const uint16_t *__restrict__ src,
                                    fc_cuda_pack_dims e, int64_t s_batch, int64_t s_seq,
                                    int64_t s_head, int64_t d, int64_t dp) {
    const int64_t n = fc_cuda_pack_elems(e, dp);
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t c = i % dp, row = i / dp;
        dst[i] = c < d ? src[fc_cuda_pack_src(e, s_batch, s_seq, s_head, row) + c] : (uint16_t)0;
    }
}

// dst(row)[c] = src[row][c] for c < d. Varlen (cu_q set): rows at token
// index >= cu_q[batch] belong to no sequence and are left alone.
__global__ void fc_cuda_unpack_kernel(uint16_t *__restrict__ dst, const uint16_t *__restrict__ src,
                                      fc_cuda_pack_dims e, int64_t s_batch, int64_t s_seq,
                                      int64_t s_head, int64_t d, int64_t dp,
                                      const int32_t *__restrict__ cu_q, int64_t batch) {
    const int64_t n = fc_cuda_pack_elems(e, d);
    const int64_t end = cu_q ? (int64_t)cu_q[batch] : e.n1;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t c = i % d, row = i / d;
        if ((row / e.heads) % e.n1 >= end) continue;
        dst[fc_cuda_pack_src(e, s_batch, s_seq, s_head, row) + c] = src[row * dp + c];
    }
}

// ---- host side ----
// Blocks of a grid-stride launch over n elements.
static inline unsigned fc_cuda_pack_blocks(int64_t n) {
    const int64_t b = (n + 255) / 256;
    return (unsigned)(b < (1 << 20) ? b : (1 << 20));
}

// Copy view v (dims e, d columns) into dst [n0, n1, heads, dp] on stream.
static inline cudaError_t fc_cuda_pack(void *dst, const fc_view &v, const fc_cuda_pack_dims &e,
                                       int64_t d, int64_t dp, cudaStream_t stream) {
    const int64_t n = fc_cuda_pack_elems(e, dp);
    if (n == 0) return cudaSuccess;
    FC_LOG("fc_cuda_pack_kernel: [%lld, %lld, %lld, %lld of %lld] grid=%u block=256 smem=0",
           (long long)e.n0, (long long)e.n1, (long long)e.heads, (long long)d, (long long)dp,
           fc_cuda_pack_blocks(n));
    fc_cuda_pack_kernel<<<fc_cuda_pack_blocks(n), 256, 0, stream>>>(
        (uint16_t *)dst, (const uint16_t *)v.ptr, e, v.s_batch, v.s_seq, v.s_head, d, dp);
    return cudaGetLastError();
}

// Copy the first d columns of src [n0, n1, heads, dp] into view v on stream.
static inline cudaError_t fc_cuda_unpack(const fc_view &v, const void *src,
                                         const fc_cuda_pack_dims &e, int64_t d, int64_t dp,
                                         const int32_t *cu_q, int64_t batch, cudaStream_t stream) {
    const int64_t n = fc_cuda_pack_elems(e, d);
    if (n == 0) return cudaSuccess;
    FC_LOG("fc_cuda_unpack_kernel: [%lld, %lld, %lld, %lld of %lld] grid=%u block=256 smem=0",
           (long long)e.n0, (long long)e.n1, (long long)e.heads, (long long)d, (long long)dp,
           fc_cuda_pack_blocks(n));
    fc_cuda_unpack_kernel<<<fc_cuda_pack_blocks(n), 256, 0, stream>>>(
        (uint16_t *)v.ptr, (const uint16_t *)src, e, v.s_batch, v.s_seq, v.s_head, d, dp, cu_q,
        batch);
    return cudaGetLastError();
}

#endif // FLASHC_CUDA_REPACK_CUH
