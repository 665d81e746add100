// probs.cu : attn_probs on device tensors (flashc.h: fp32 [B, H, Sq, Sk], or
// [B, H, max_seqlen_q, max_seqlen_k] varlen), written after the forward by
// one plain kernel from the lse the forward wrote. A testing aid: O(Sq Sk)
// memory anyway, so the kernel is written to be obviously right, not fast.
//
//   fc_probs_kernel  one CTA per query row (b, h, i) at a time (grid-stride
//                    over the rows): q's row into shared memory as fp32, then
//                    each thread one key column at a time:
//                      P = exp2(x * score_scale_log2 - lse log2 e)
//                    where key j is visible (mask.cuh fc_mask), with x the
//                    forward's score (q.k in fp32; the softcapped tanh,
//                    mask.cuh fc_softcap1; ALiBi in units of x), negated
//                    where the forward's dropout mask (common/philox.h, the
//                    Philox draw of every backend) dropped (b, h, i, j)
//
// The CPU backend's semantics (src/cpu/fwd.c fc_fwd_probs): 0 where a key is
// masked, past the sequence's keys or queries, and on a row whose lse is -inf
// (no key, no sink); a learnable sink is in the lse, so a row sums to less
// than 1 there. The rows and keys of a sequence, its K rows (varlen, paged,
// leftpad, cache_batch_idx) and the clamping of device metadata are the
// forward's own (common/fwd_tile.cuh fc_fwd_seq).
//
// Not here: the lse when the caller wants none (fwd.cu carves it in the
// workspace and the forward writes it there).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "../common/philox.h"
#include "common/fwd_tile.cuh"
#include "common/mask.cuh"
#include "plan.h"

static const int kFcProbsThreads = 128;

__device__ __forceinline__ float fc_probs_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float fc_probs_float(__half x) { return __half2float(x); }

// q, k of p as T, p.lse the forward's (never NULL here); dst: a->probs.
template <typename T>
__global__ void __launch_bounds__(kFcProbsThreads)
    fc_probs_kernel(const __grid_constant__ fc_cuda_fwd_params p, const fc_probs_dst dst) {
    extern __shared__ float qs[];  // [head_dim]: the row's q in fp32
    const T *q = static_cast<const T *>(p.q), *k = static_cast<const T *>(p.k);
    const int cols = p.seqlen_k;
    const int64_t rows = (int64_t)p.batch * p.heads * p.seqlen_q;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const int i = (int)(r % p.seqlen_q);
        const int h = (int)(r / p.seqlen_q % p.heads);
        const int b = (int)(r / p.seqlen_q / p.heads);
        float *out = dst.probs + (int64_t)b * dst.s_batch + (int64_t)h * dst.s_head +
                     (int64_t)i * dst.s_row;
        fc_fwd_seq seq;
        if (!seq.init(p, b, h, i, 1)) {  // a row past the sequence's queries
            for (int j = threadIdx.x; j < cols; j += blockDim.x) out[j] = 0.0f;
            continue;
        }
        __syncthreads();  // the previous row's qs is read
        for (int d = threadIdx.x; d < p.head_dim; d += blockDim.x)
            qs[d] = fc_probs_float(q[seq.q_base + d]);
        __syncthreads();

        const fc_mask<false> mask(seq.sq, seq.sk, p.window_left, p.window_right);
        const int lo = max(mask.lo(i), 0), hi = mask.hi(i), diag = mask.diag(i);
        const float lse2 = p.lse[seq.lse_base] * p.log2e;
        const float slope_x = p.alibi ? p.alibi[(int64_t)b * p.alibi_s_batch + h] * p.alibi_scale
                                      : 0.0f;
        const uint32_t bh = (uint32_t)(b * p.heads + h);
        for (int j = threadIdx.x; j < cols; j += blockDim.x) {
            float pr = 0.0f;
            if (j >= lo && j < hi && lse2 != -INFINITY) {
                const T *kr = k + seq.kv.offset(j, seq.kv.k_base, p.k_s_batch, p.k_s_seq, p.total_k);
                float x = 0.0f;
                for (int d = 0; d < p.head_dim; ++d) x = fmaf(qs[d], fc_probs_float(kr[d]), x);
                if (p.softcap_pre != 0.0f) x = fc_softcap1(x, p.softcap_pre);
                x = fmaf(-slope_x, fabsf((float)(diag - j)), x);
                pr = exp2f(x * p.score_scale_log2 - lse2);
                if (p.dropout && !fc_dropout_keep(p.dropout_seed, p.dropout_offset, bh,
                                                  (uint32_t)i, (uint64_t)j, p.dropout_threshold))
                    pr = -pr;
            }
            out[j] = pr;
        }
    }
}

cudaError_t fc_probs_launch(const fc_cuda_fwd_params &p, const fc_probs_dst &dst, bool bf16,
                                 cudaStream_t stream) {
    const int64_t rows = (int64_t)p.batch * p.heads * p.seqlen_q;
    if (rows == 0) return cudaSuccess;
    const dim3 grid((unsigned)(rows < (1 << 20) ? rows : (1 << 20)));
    const int smem = p.head_dim * (int)sizeof(float);
    FC_LOG("fc_probs_kernel<%s>: rows=%lld cols=%d grid=%u block=%d smem=%d", bf16 ? "bf16" : "fp16",
           (long long)rows, p.seqlen_k, grid.x, kFcProbsThreads, smem);
    if (bf16)
        fc_probs_kernel<__nv_bfloat16><<<grid, kFcProbsThreads, smem, stream>>>(p, dst);
    else
        fc_probs_kernel<__half><<<grid, kFcProbsThreads, smem, stream>>>(p, dst);
    return cudaGetLastError();
}
