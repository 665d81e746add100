// merge.cuh : the arithmetic of merging partial attention outputs
// (Flash-Decoding: out = sum_i w_i O_i with w_i from each part's max and sum),
// eight columns at a time: the decode kernel merges its warps with it
// (sm80/decode_kernel.cuh), the combine kernel its key splits
// (common/kvcache_kernels.cuh).
#ifndef FLASHC_CUDA_MERGE_CUH
#define FLASHC_CUDA_MERGE_CUH

#include <stdint.h>

#include "ptx.cuh"

// acc[0..7] += w * src[0..7], src fp32 and 16-byte aligned (two 16-byte loads).
__device__ __forceinline__ void fc_axpy8(float (&acc)[8], float w, const float *src) {
    const float4 lo = *reinterpret_cast<const float4 *>(src);
    const float4 hi = *reinterpret_cast<const float4 *>(src + 4);
    acc[0] = fmaf(w, lo.x, acc[0]);
    acc[1] = fmaf(w, lo.y, acc[1]);
    acc[2] = fmaf(w, lo.z, acc[2]);
    acc[3] = fmaf(w, lo.w, acc[3]);
    acc[4] = fmaf(w, hi.x, acc[4]);
    acc[5] = fmaf(w, hi.y, acc[5]);
    acc[6] = fmaf(w, hi.z, acc[6]);
    acc[7] = fmaf(w, hi.w, acc[7]);
}

// Eight floats as eight T in one 16-byte word, element 0 lowest.
template <typename T>
__device__ __forceinline__ uint4 fc_pack8(const float (&x)[8]) {
    return make_uint4(fc_pack2<T>(x[0], x[1]), fc_pack2<T>(x[2], x[3]), fc_pack2<T>(x[4], x[5]),
                      fc_pack2<T>(x[6], x[7]));
}

#endif  // FLASHC_CUDA_MERGE_CUH
