// kvcache_kernels.cuh : the two small kernels around the decode kernel
// (included by kvcache.cu only):
//
//   fc_kvcache_prep_kernel    before the attention: appends k_new / v_new to
//                             the cache in place (rotary on k_new first),
//                             writes the rotated q, and the key lengths the
//                             forward kernel reads when it serves the call
//   fc_decode_combine_kernel  after a split decode: merges the splits'
//                             partial outputs by their lse (Flash-Decoding)
//
// Both are plain CUDA (no mma, no architecture-specific instruction): they run
// on every architecture the build targets, whatever kernel family attends.
//
// The append is its own kernel, on the caller's stream before the attention,
// so no attention CTA can read a cache row while another CTA still writes it.
// Both kernels move little data (a few rows per sequence; the partials are
// splits * H * Sq * D floats): one warp per row, plain loads.
//
// Not here: validation (prepare.c), the choice of splits (kvcache.cu).
#ifndef FLASHC_CUDA_COMMON_KVCACHE_KERNELS_CUH
#define FLASHC_CUDA_COMMON_KVCACHE_KERNELS_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "../../internal.h"
#include "merge.cuh"
#include "ptx.cuh"
#include "../decode_params.h"
#include "softmax.cuh"

// ---- element conversions (round to nearest even, as src/internal.h) ----
__device__ __forceinline__ float fc_elem_to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float fc_elem_to_float(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T fc_elem_from_float(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 fc_elem_from_float<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half fc_elem_from_float<__half>(float x) {
    return __float2half_rn(x);
}

// ---- the prep kernel ----
// y[0 .. d) = x rotated at position pos over its first rotary_dim entries (a
// copy past them, or everywhere without rotary), by the 32 lanes of a warp.
template <typename T>
__device__ __forceinline__ void fc_rotate_row(const fc_cuda_kvprep_params &p, const T *x, T *y,
                                              int d, int64_t pos, bool rotate, int lane) {
    const int rot = rotate ? p.rotary_dim : 0, half = rot / 2;
    pos = min(pos, (int64_t)p.rotary_rows - 1);  // the table's last row past its end
    for (int e = lane; e < d; e += 32) {
        if (e >= rot) {
            y[e] = x[e];
            continue;
        }
        // pair i = (e0, e1); this lane writes e, which is e0 (first) or e1
        int i, e0, e1;
        if (p.interleaved) {
            i = e >> 1;
            e0 = e & ~1;
            e1 = e0 + 1;
        } else {
            i = e < half ? e : e - half;
            e0 = i;
            e1 = i + half;
        }
        const int64_t ci = pos * p.cos_s_row + i, si = pos * p.sin_s_row + i;  // pos < rotary_rows
        const float c = p.rotary_fp32 ? static_cast<const float *>(p.rotary_cos)[ci]
                                      : fc_elem_to_float(static_cast<const T *>(p.rotary_cos)[ci]);
        const float s = p.rotary_fp32 ? static_cast<const float *>(p.rotary_sin)[si]
                                      : fc_elem_to_float(static_cast<const T *>(p.rotary_sin)[si]);
        const float x0 = fc_elem_to_float(x[e0]), x1 = fc_elem_to_float(x[e1]);
        // the CPU's x0 * c - x1 * s and x0 * s + x1 * c, each operation rounded (no FMA)
        const float r = e == e0 ? __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s))
                                : __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
        y[e] = fc_elem_from_float<T>(r);
    }
}

// One warp per job (decode_params.h), grid-stride.
template <typename T>
__global__ void __launch_bounds__(256)
    fc_kvcache_prep_kernel(const __grid_constant__ fc_cuda_kvprep_params p) {
    const int lane = threadIdx.x & 31;
    const int64_t n_warps = ((int64_t)gridDim.x * blockDim.x) >> 5;
    const int64_t n_jobs = p.n_append + p.n_q + p.n_lens;
    for (int64_t job = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; job < n_jobs;
         job += n_warps) {
        if (job < p.n_append) {
            // (b, t, hk): cache row r = used(b) + t, k rotated at position r
            const int hk = (int)(job % p.kv_heads);
            const int64_t bt_ = job / p.kv_heads;
            const int t = (int)(bt_ % p.lens.seqlen_new), b = (int)(bt_ / p.lens.seqlen_new);
            const int r = fc_kv_span_of(p.lens, b).used + t;
            if (r >= p.lens.capacity) continue;  // past the cache: not written (the whole warp)
            int64_t kdst, vdst;
            if (p.block_table) {
                const fc_paged_row pr =
                    fc_paged(p.block_table + (int64_t)b * p.bt_stride, r, p.page_size, p.caches);
                kdst = pr.offset(0, p.kc_s_batch, p.kc_s_seq);
                vdst = pr.offset(0, p.vc_s_batch, p.vc_s_seq);
            } else {
                const int64_t kb = p.k_batch_idx ? fc_index(p.k_batch_idx, b, p.caches) : b;
                kdst = kb * p.kc_s_batch + (int64_t)r * p.kc_s_seq;
                vdst = kb * p.vc_s_batch + (int64_t)r * p.vc_s_seq;
            }
            const T *kx = static_cast<const T *>(p.k_new) + b * p.kn_s_batch + t * p.kn_s_seq +
                          hk * p.kn_s_head;
            const T *vx = static_cast<const T *>(p.v_new) + b * p.vn_s_batch + t * p.vn_s_seq +
                          hk * p.vn_s_head;
            T *ky = static_cast<T *>(p.k_cache) + kdst + hk * p.kc_s_head;
            T *vy = static_cast<T *>(p.v_cache) + vdst + hk * p.vc_s_head;
            fc_rotate_row<T>(p, kx, ky, p.head_dim, r, true, lane);
            fc_rotate_row<T>(p, vx, vy, p.head_dim_v, 0, false, lane);
        } else if (job < p.n_append + p.n_q) {
            // (b, i, h): q row rotated into the dense copy
            const int64_t jq = job - p.n_append;
            const int h = (int)(jq % p.heads);
            const int64_t bi = jq / p.heads;
            const int i = (int)(bi % p.seqlen_q), b = (int)(bi / p.seqlen_q);
            const int64_t pos = fc_kv_span_of(p.lens, b).used + (p.q_per_row ? i : 0);
            const T *x =
                static_cast<const T *>(p.q) + b * p.q_s_batch + i * p.q_s_seq + h * p.q_s_head;
            T *y = static_cast<T *>(p.q_rot) + jq * p.head_dim;
            fc_rotate_row<T>(p, x, y, p.head_dim, pos, true, lane);
        } else {
            const int b = (int)((job - p.n_append - p.n_q) * 32) + lane;
            if (b < p.batch) {
                const fc_kv_span span = fc_kv_span_of(p.lens, b);
                p.seqlens_k[b] = span.keys;
                p.seqlens_k[p.batch + b] = span.pad;
            }
        }
    }
}

// ---- the combine kernel ----
// One warp per output row (b, hk, packed row R), 4 per CTA. With lse_s the
// splits' natural-log lse and O_s their normalised outputs:
//     lse = log sum_s e^(lse_s),  out = sum_s e^(lse_s - lse) O_s
// (flash_attn's combine); every lse_s = -inf (no key seen) gives 0 and -inf, a
// NaN lse_s (a NaN score) NaN. A learnable sink s of the row's head is one more
// term e^s in the first sum, with no O: every lse_s = -inf then gives 0 and s.
enum { FC_COMBINE_WARPS = 4, FC_COMBINE_MAX_SPLITS = 128 };

template <typename T>
__global__ void __launch_bounds__(32 * FC_COMBINE_WARPS)
    fc_decode_combine_kernel(const __grid_constant__ fc_cuda_decode_params p) {
    __shared__ float s_w[FC_COMBINE_WARPS][FC_COMBINE_MAX_SPLITS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    fc_pdl_wait();  // the decode kernel's partials
    const int64_t per_split = (int64_t)p.f.batch * p.kv_heads * p.rows;  // rows of one split
    const int64_t row = (int64_t)blockIdx.x * FC_COMBINE_WARPS + warp;   // (b * Hk + hk) * rows + R
    if (row >= per_split) return;  // whole warps only; no block-wide barrier follows

    const int R = (int)(row % p.rows);
    const int bh = (int)(row / p.rows), b = bh / p.kv_heads, hk = bh % p.kv_heads;
    const int G = p.f.kv_group, i = R / G, h = hk * G + R % G;
    const float sink = fc_sink_of(p.f, h).s;

    constexpr int kPerLane = FC_COMBINE_MAX_SPLITS / 32;
    float w[kPerLane], mx = sink;
#pragma unroll
    for (int x = 0; x < kPerLane; ++x) {
        const int s = lane + 32 * x;
        w[x] = s < p.splits ? p.lse_accum[s * per_split + row] : -INFINITY;
        mx = fc_fmax_nan(mx, w[x]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fc_fmax_nan(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.0f;
#pragma unroll
    for (int x = 0; x < kPerLane; ++x) {
        w[x] = mx == -INFINITY ? 0.0f : __expf(w[x] - mx);
        sum += w[x];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (sink != -INFINITY) sum += __expf(sink - mx);
    const bool empty = sum == 0.0f;
    const float inv = empty ? 0.0f : 1.0f / sum;
#pragma unroll
    for (int x = 0; x < kPerLane; ++x) {
        const int s = lane + 32 * x;
        if (s < p.splits) s_w[warp][s] = w[x] * inv;
    }
    __syncwarp();

    // lane handles columns 8 lane .. 8 lane + 7 of out (head_dim_v <= 256)
    const int c0 = 8 * lane;
    if (c0 < p.f.head_dim_v) {
        float acc[8];
#pragma unroll
        for (int x = 0; x < 8; ++x) acc[x] = 0.0f;
        const float *src = p.o_accum + row * p.f.head_dim_v + c0;
        const int64_t step = per_split * p.f.head_dim_v;
#pragma unroll 4
        for (int s = 0; s < p.splits; ++s) fc_axpy8(acc, s_w[warp][s], src + s * step);
        fc_st_global_v4(static_cast<T *>(p.f.o) + (int64_t)b * p.f.o_s_batch +
                            (int64_t)i * p.f.o_s_seq + (int64_t)h * p.f.o_s_head + c0,
                        fc_pack8<T>(acc));
    }
    if (lane == 0 && p.f.lse)
        p.f.lse[(int64_t)b * p.f.lse_s_batch + (int64_t)h * p.f.lse_s_head +
                (int64_t)i * p.f.lse_s_seq] = empty ? -INFINITY : mx + logf(sum);
}

// ---- host side ----
// Launch the prep kernel for p's jobs on stream (nothing when there are none).
template <typename T>
static cudaError_t fc_kvcache_prep(const fc_cuda_kvprep_params &p, cudaStream_t stream) {
    const int64_t jobs = p.n_append + p.n_q + p.n_lens;
    if (jobs == 0) return cudaSuccess;
    const int64_t blocks = (jobs + 7) / 8;  // 8 warps of 256 threads
    const unsigned grid = (unsigned)(blocks < (1 << 20) ? blocks : (1 << 20));
    FC_LOG("fc_kvcache_prep_kernel: append=%lld rotary_q=%lld lens=%lld grid=%u block=256 smem=0",
           (long long)p.n_append, (long long)p.n_q, (long long)p.n_lens, grid);
    fc_kvcache_prep_kernel<T><<<grid, 256, 0, stream>>>(p);
    return cudaGetLastError();
}

// Launch the combine of p.splits partials on stream, right behind the decode
// kernel. pdl (a device of compute capability 9.0 or later): as a programmatic
// dependent launch, so its CTAs start while the decode kernel's last ones run
// and wait in the kernel (fc_pdl_wait) rather than behind a launch.
template <typename T>
static cudaError_t fc_decode_combine(const fc_cuda_decode_params &p, bool pdl,
                                     cudaStream_t stream) {
    const int64_t rows = (int64_t)p.f.batch * p.kv_heads * p.rows;
    const int64_t blocks = (rows + FC_COMBINE_WARPS - 1) / FC_COMBINE_WARPS;
    FC_LOG("fc_decode_combine_kernel: rows=%lld num_splits=%d grid=%lld block=%d smem=0 pdl=%d",
           (long long)rows, p.splits, (long long)blocks, 32 * FC_COMBINE_WARPS, (int)pdl);
    return fc_launch(fc_decode_combine_kernel<T>, dim3((unsigned)blocks), dim3(32 * FC_COMBINE_WARPS), 0,
                     stream, pdl, p);
}

#endif  // FLASHC_CUDA_COMMON_KVCACHE_KERNELS_CUH
