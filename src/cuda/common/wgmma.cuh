// wgmma.cuh : the Hopper (sm_90a) PTX of the sm90 kernels, one thin wrapper
// each, and the shared-memory layout their operands use.
//
//   wgmma.fence / commit_group / wait_group   order the asynchronous
//                                             warpgroup MMAs (wgmma_ops.cuh)
//   shared-memory matrix descriptors          128-byte swizzle
//   fence.proxy.async.shared::cta             generic-proxy writes (cp.async,
//                                             st.shared) -> wgmma reads
//   bar.sync id, n                            a barrier of one warpgroup
//   cp.reduce.async.bulk (.add.f32)           a shared fp32 tile added to
//                                             global memory by the TMA unit
//
// The layout (PTX ISA "Shared Memory Matrix Layout", 128B swizzle): a tile of
// R rows x D 16-bit elements is stored as D/64 column blocks of R rows x 128
// bytes; in row r of a block, 16-byte chunk c (elements 8c..8c+7 of the block)
// sits at chunk position c ^ (r % 8). Blocks start at multiples of 1024 bytes
// (the 8-row swizzle atom), so the tile base must be 1024-byte aligned.
//   K-major operand (Q and K of S = Q K^T: the reduction dim d is contiguous):
//     SBO = 1024 (next 8 rows), LBO unused; the k16 step ks starts at column
//     block ks / 4, byte 32 * (ks % 4) of its rows (the hardware applies the
//     swizzle to the full address).
//   MN-major operand (V of O += P V: the output dim d is contiguous, the
//     reduction runs over the key rows): LBO = R * 128 (next 64 columns of d),
//     SBO = 1024 (next 8 key rows); the k16 step kk starts at row 16 kk.
// Accumulators (m64nN, fp32): warp w of the warpgroup holds rows 16w..16w+15;
// with g = lane / 4, t = lane % 4, registers 4i..4i+3 are the mma.m16n8k16 C
// fragment of 8-column tile i (ptx.cuh), so the softmax, mask and dropout code
// of the sm80 family applies unchanged with MT = 1.
#ifndef FLASHC_CUDA_WGMMA_CUH
#define FLASHC_CUDA_WGMMA_CUH

#include <stdint.h>

#include "ptx.cuh"
#include "wgmma_ops.cuh"

// ---- descriptors ----
// A 128B-swizzled shared-memory matrix descriptor: start address, leading and
// stride byte offsets (all stored >> 4), layout type 1 = 128-byte swizzle.
__device__ __forceinline__ uint64_t fc_wgmma_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((saddr & 0x3FFFFu) >> 4) | ((uint64_t)((lbo >> 4) & 0x3FFFu) << 16) |
           ((uint64_t)((sbo >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}

// The descriptor of the same matrix `bytes` further on (bytes % 16 == 0; the
// start address field cannot carry over, shared addresses being < 2^18).
__device__ __forceinline__ uint64_t fc_wgmma_desc_add(uint64_t desc, uint32_t bytes) {
    return desc + (bytes >> 4);
}

// Byte offset of k16 step ks of a K-major operand (a tile of `rows` rows):
// column block ks / 4, byte 32 (ks % 4) of its rows.
__device__ __forceinline__ uint32_t fc_kmajor_step(int rows, int ks) {
    return (uint32_t)((ks / 4) * rows * 128 + (ks % 4) * 32);
}

// Byte offset of 16-byte chunk `ch` of row `r` in a swizzled tile of `rows` rows.
__device__ __forceinline__ uint32_t fc_sw128_offset(int rows, int r, int ch) {
    return (uint32_t)((ch >> 3) * rows * 128 + r * 128 + (((ch & 7) ^ (r & 7)) << 4));
}

// ---- ordering ----
// Before the first wgmma that reads registers written since the last fence
// (accumulators, the A fragment).
__device__ __forceinline__ void fc_wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void fc_wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// Wait until at most N of this warpgroup's committed wgmma groups are pending.
template <int N>
__device__ __forceinline__ void fc_wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// acc = A B^T over 16 KS columns of K-major operands (a: A's descriptor, its
// tile a_rows rows; b likewise, N of its rows in this wgmma), k16 step ks
// reading column block ks / 4 of each (fc_kmajor_step); one commit group. The
// caller fences before it and waits after.
template <int N, typename T, int KS>
__device__ __forceinline__ void fc_wgmma_abt(float (&acc)[N / 2], uint64_t a, int a_rows,
                                             uint64_t b, int b_rows) {
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
        fc_wgmma_ss<N, T>(acc, fc_wgmma_desc_add(a, fc_kmajor_step(a_rows, ks)),
                          fc_wgmma_desc_add(b, fc_kmajor_step(b_rows, ks)), ks > 0);
    fc_wgmma_commit();
}

// Pin registers an in-flight wgmma reads or writes to this point of the
// program: the compiler neither reads the accumulators early nor reuses the A
// fragment's registers before the wait that precedes this call.
template <int N>
__device__ __forceinline__ void fc_reg_fence(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

template <int N>
__device__ __forceinline__ void fc_reg_fence(uint32_t (&r)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(r[i][e])::"memory");
}

// The A fragments (RS wgmma, one per k16 slice kk) of an m64nN fp32
// accumulator, rounded to T: the C fragments of 8-column tiles 2kk, 2kk + 1.
template <typename T, int NT>
__device__ __forceinline__ void fc_acc_to_afrag(const float (&acc)[NT][4],
                                                uint32_t (&a)[NT / 2][4]) {
#pragma unroll
    for (int kk = 0; kk < NT / 2; ++kk) {
        a[kk][0] = fc_pack2<T>(acc[2 * kk][0], acc[2 * kk][1]);
        a[kk][1] = fc_pack2<T>(acc[2 * kk][2], acc[2 * kk][3]);
        a[kk][2] = fc_pack2<T>(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);
        a[kk][3] = fc_pack2<T>(acc[2 * kk + 1][2], acc[2 * kk + 1][3]);
    }
}

// Make this thread's generic-proxy shared writes (cp.async included, once
// waited for) visible to the async proxy that wgmma reads through.
__device__ __forceinline__ void fc_fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Barrier `id` (1..15; 0 is __syncthreads) over `threads` threads.
__device__ __forceinline__ void fc_bar_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Arrive at named barrier `id` (of `threads` arrivals) without waiting: the
// signalling half of a producer/consumer handshake whose other half syncs.
__device__ __forceinline__ void fc_bar_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads));
}

// ---- bulk reductions (the backward's dQ) ----
// Add `bytes` (a multiple of 16; both addresses 16-byte aligned) of fp32 from
// shared address `src` to global `dst`, element by element, asynchronously;
// one thread issues it. The shared writes it reads must be fenced
// (fc_fence_proxy_async) by their writers and ordered before it by a barrier.
__device__ __forceinline__ void fc_bulk_reduce_add_f32(float *dst, uint32_t src, uint32_t bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
                 "r"(src), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void fc_bulk_commit() {
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

// Until at most N of this thread's bulk groups still read their shared source.
template <int N>
__device__ __forceinline__ void fc_bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}

// Until at most N of this thread's bulk groups are incomplete (their global
// writes performed), then order them before this thread's later generic
// accesses (a release that publishes them).
template <int N>
__device__ __forceinline__ void fc_bulk_wait_done() {
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

#endif  // FLASHC_CUDA_WGMMA_CUH
