// bwd_prep.cuh : the two small kernels around the backward's main kernel
// (FlashAttention-2, Dao 2023, Algorithm 2, lines 4 and the final dQ write).
//
//   fc_bwd_pre_kernel   per query row (b, h, i): delta = rowsum(dout o out) in
//                       fp32 over the value head dim Dv, lse2 = lse * log2(e)
//                       (+inf where lse = -inf: a row that sees no key gets
//                       P = 0), and its dq_accum row
//                       zeroed; pad rows (i >= sq, bwd_params.h) get lse2 =
//                       +inf and delta = 0, so the main kernel's tiles read
//                       them without a bounds test.
//   fc_bwd_dq_kernel    dq = dq_accum * scale in the dtype, at the caller's
//                       strides and head dim (un-swizzling the sm90 kernel's
//                       rows, bwd_params.h dq_swizzle).
//   fc_bwd_dkv_kernel   with the GQA split (bwd_params.h kv_split > 1):
//                       dk = scale sum_s part_s(dK), dv = sum_s part_s(dV),
//                       the parts in order, to the caller's dk, dv.
//   fc_bwd_dsink_kernel the learnable sink's gradient, after the first:
//                       dsink_h = -sum_i e^(s_h - lse_i) delta_i over the
//                       rows of head h (P of the sink times dP - delta, with
//                       dP = 0: the sink has no value), in a fixed order.
// The first two run over (128-row blocks, H, B), the dKV kernel over
// (128-row blocks, Hk, B); a row that lies past its sequence is skipped. out
// and dout are read with 16-byte loads: bwd.cu hands them in place only when
// aligned (else a repacked copy). Behind the sm90 main kernel (not sm90ws's,
// which has no trigger) the dKV and dQ kernels are programmatic dependent
// launches (ptx.cuh fc_pdl_wait: a no-op in a plain launch): their CTAs start
// while its last ones run and wait for its end.
#ifndef FLASHC_CUDA_BWD_PREP_CUH
#define FLASHC_CUDA_BWD_PREP_CUH

#include <cuda_runtime.h>
#include <math.h>

#include "../bwd_params.h"
#include "merge.cuh"
#include "ptx.cuh"
#include "softmax.cuh"

#define kFcBwdPrepRows 128   // rows per CTA of both kernels
#define kFcBwdPrepThreads 256

// grid (ceil(max_seqlen_q / 128), H, B), block 256: 8 lanes per row, 32 rows a pass.
template <typename T>
__global__ void __launch_bounds__(kFcBwdPrepThreads)
    fc_bwd_pre_kernel(const __grid_constant__ fc_cuda_bwd_params p) {
    fc_pdl_launch_dependents();  // the sm90 main kernel: its CTAs may start (and wait)
    const fc_cuda_fwd_params &f = p.f;
    const int b = blockIdx.z, h = blockIdx.y, lane8 = threadIdx.x & 7;
    int sq, tok0;
    fc_bwd_q_seq(p, b, &sq, &tok0);
    const int pad_end = (sq + kFcBwdPadRows - 1) / kFcBwdPadRows * kFcBwdPadRows;
    const int64_t srow0 = (int64_t)h * p.rows + fc_bwd_row0(p, b, tok0);
    const T *o = static_cast<const T *>(f.o);
    const T *dout = static_cast<const T *>(p.dout);
    const int chunks = f.head_dim_v / 8;  // out and dout have Dv columns
    for (int i = blockIdx.x * kFcBwdPrepRows + (threadIdx.x >> 3);
         i < (blockIdx.x + 1) * kFcBwdPrepRows && i < pad_end; i += kFcBwdPrepThreads / 8) {
        float acc = 0.0f;
        if (i < sq) {
            const int64_t tok = tok0 + i;
            const int64_t ob = (f.cu_seqlens_q ? 0 : (int64_t)b * f.o_s_batch) + tok * f.o_s_seq +
                               (int64_t)h * f.o_s_head;
            const int64_t db = (f.cu_seqlens_q ? 0 : (int64_t)b * p.do_s_batch) + tok * p.do_s_seq +
                               (int64_t)h * p.do_s_head;
            for (int c = lane8; c < chunks; c += 8) {
                const uint4 x = *reinterpret_cast<const uint4 *>(o + ob + c * 8);
                const uint4 y = *reinterpret_cast<const uint4 *>(dout + db + c * 8);
                const uint32_t xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float2 a = fc_unpack2<T>(xs[e]), d = fc_unpack2<T>(ys[e]);
                    acc = fmaf(a.x, d.x, fmaf(a.y, d.y, acc));
                }
            }
        }
        acc += __shfl_xor_sync(0xffffffffu, acc, 1);
        acc += __shfl_xor_sync(0xffffffffu, acc, 2);
        acc += __shfl_xor_sync(0xffffffffu, acc, 4);
        const int64_t srow = srow0 + i;
        if (lane8 == 0) {
            float l2 = INFINITY;
            if (i < sq) {
                const float lse = f.lse[(int64_t)b * f.lse_s_batch + (int64_t)h * f.lse_s_head +
                                        (tok0 + i) * f.lse_s_seq];
                l2 = lse == -INFINITY ? INFINITY : lse * p.log2e;
            }
            p.lse2[srow] = l2;
            p.delta[srow] = acc;
        }
        if (i < sq) {
            float4 *dqa = reinterpret_cast<float4 *>(p.dq_accum + srow * p.dq_pitch);
            for (int c = lane8; c < p.dq_pitch / 4; c += 8) dqa[c] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
    }
}

// grid and block as fc_bwd_pre_kernel; one thread per (row, column) pair of columns.
template <typename T>
__global__ void __launch_bounds__(kFcBwdPrepThreads)
    fc_bwd_dq_kernel(const __grid_constant__ fc_cuda_bwd_params p) {
    fc_pdl_wait();  // launched behind the main kernel (sm90): its dq_accum
    const int b = blockIdx.z, h = blockIdx.y;
    int sq, tok0;
    fc_bwd_q_seq(p, b, &sq, &tok0);
    const int i0 = blockIdx.x * kFcBwdPrepRows;
    const int rows = min(kFcBwdPrepRows, sq - i0);
    if (rows <= 0) return;
    const int pairs = (p.dq_head_dim + 1) / 2;
    const int64_t srow0 = (int64_t)h * p.rows + fc_bwd_row0(p, b, tok0) + i0;
    T *dq = static_cast<T *>(p.dq);
    for (int idx = threadIdx.x; idx < rows * pairs; idx += kFcBwdPrepThreads) {
        const int r = idx / pairs, c = 2 * (idx % pairs);
        const int64_t tok = tok0 + i0 + r;
        const int64_t base = (p.f.cu_seqlens_q ? 0 : (int64_t)b * p.dq_s_batch) +
                             tok * p.dq_s_seq + (int64_t)h * p.dq_s_head + c;
        // c is even: c and c + 1 share a 16-byte chunk, swizzled or not
        const int sc = p.dq_swizzle ? (fc_dq_chunk(c >> 2, i0 + r) << 2) + (c & 3) : c;
        const float *acc = p.dq_accum + (srow0 + r) * p.dq_pitch + sc;
        if (c + 1 < p.dq_head_dim && ((uintptr_t)(dq + base) & 3) == 0) {
            *reinterpret_cast<uint32_t *>(dq + base) = fc_pack2<T>(acc[0] * p.ds_scale, acc[1] * p.ds_scale);
        } else {
            dq[base] = T(acc[0] * p.ds_scale);
            if (c + 1 < p.dq_head_dim) dq[base + 1] = T(acc[1] * p.ds_scale);
        }
    }
}

// grid (ceil(max_seqlen_k / 128), Hk, B), block 256: one thread per (key row,
// 16-byte chunk of the row), over the rows of sequence b's keys (every one of
// them had a CTA per part: the main kernel returns only past the keys); the
// chunks of the wider of D (dk) and Dv (dv), each stored within its own.
template <typename T>
__global__ void __launch_bounds__(kFcBwdPrepThreads)
    fc_bwd_dkv_kernel(const __grid_constant__ fc_cuda_bwd_params p) {
    fc_pdl_launch_dependents();  // the dQ kernel
    fc_pdl_wait();               // the main kernel's parts
    const fc_cuda_fwd_params &f = p.f;
    const int b = blockIdx.z, hk = blockIdx.y, j0 = blockIdx.x * kFcBwdPrepRows;
    int64_t k_tok0 = 0;
    int sk = f.seqlen_k;
    if (f.cu_seqlens_k) {
        const fc_span s = fc_cu_span(f.cu_seqlens_k, b, f.total_k, f.seqlen_k);
        k_tok0 = s.start;
        sk = s.len;
    }
    const int rows = min(kFcBwdPrepRows, sk - j0);
    const int chunks = max(f.head_dim, f.head_dim_v) / 8;
    if (rows <= 0) return;
    const int64_t kv_heads = f.heads / f.kv_group;
    const int64_t row0 = (f.cu_seqlens_k ? 0 : (int64_t)b * f.seqlen_k) + k_tok0 + j0;
    const int64_t part = p.kv_rows * p.dkv_pitch;  // floats per part
    const int64_t v_off = kv_heads * p.kv_split * part;
    T *dk = static_cast<T *>(p.dk), *dv = static_cast<T *>(p.dv);
    for (int idx = threadIdx.x; idx < rows * chunks; idx += kFcBwdPrepThreads) {
        const int r = idx / chunks, ch = idx % chunks;
        const float *src =
            p.dkv_accum + ((int64_t)hk * p.kv_split * p.kv_rows + row0 + r) * p.dkv_pitch + ch * 8;
        float ak[8], av[8];
#pragma unroll
        for (int x = 0; x < 8; ++x) ak[x] = av[x] = 0.0f;
        for (int s = 0; s < p.kv_split; ++s) {
            fc_axpy8(ak, 1.0f, src + s * part);
            fc_axpy8(av, 1.0f, src + v_off + s * part);
        }
#pragma unroll
        for (int x = 0; x < 8; ++x) ak[x] *= p.ds_scale;
        const int64_t tok = k_tok0 + j0 + r;
        if (ch * 8 < f.head_dim)
            fc_st_global_v4(dk + (f.cu_seqlens_k ? 0 : (int64_t)b * p.dk_s_batch) +
                                tok * p.dk_s_seq + hk * p.dk_s_head + ch * 8,
                            fc_pack8<T>(ak));
        if (ch * 8 < f.head_dim_v)
            fc_st_global_v4(dv + (f.cu_seqlens_k ? 0 : (int64_t)b * p.dv_s_batch) +
                                tok * p.dv_s_seq + hk * p.dv_s_head + ch * 8,
                            fc_pack8<T>(av));
    }
}

// grid (H), block 256. Each thread sums its rows in order, sequence by sequence
// (rows i < sq only: rows no sequence owns are never read), then a fixed tree:
// the same bits every run. With batch 0 (nothing to read) it writes 0.
__global__ void __launch_bounds__(kFcBwdPrepThreads)
    fc_bwd_dsink_kernel(const __grid_constant__ fc_cuda_bwd_params p) {
    __shared__ float s_part[kFcBwdPrepThreads / 32];
    fc_pdl_launch_dependents();  // the sm90 main kernel (it waits for this one's end)
    const int h = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float s2 = fc_sink_value(p.f, h) * p.log2e;
    float acc = 0.0f;
    for (int b = 0; b < p.f.batch; ++b) {
        int sq, tok0;
        fc_bwd_q_seq(p, b, &sq, &tok0);
        const int64_t srow0 = (int64_t)h * p.rows + fc_bwd_row0(p, b, tok0);
        // lse2 = +inf (no key and no sink) gives 2^-inf = 0
        for (int i = threadIdx.x; i < sq; i += kFcBwdPrepThreads)
            acc = fmaf(fc_exp2(s2 - p.lse2[srow0 + i]), p.delta[srow0 + i], acc);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) s_part[warp] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        float sum = 0.0f;
        for (int w = 0; w < kFcBwdPrepThreads / 32; ++w) sum += s_part[w];
        p.dsink[(int64_t)h * p.dsink_s] = 0.0f - sum;  // +0, not -0, for no rows
    }
}

#endif  // FLASHC_CUDA_BWD_PREP_CUH
