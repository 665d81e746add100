// generated; do not edit. Written by tools/gen_instances.py from src/cuda/traits.h.
// The sm80 forward instances that exist, for fwd.cu. A build trimmed with
// FLASHC_CUDA_HEADDIMS (or without the family's arch) defines FC_SM80_HD_<D>=0
// for the head dims it leaves out.
#ifndef FLASHC_CUDA_SM80_INSTANCES_H
#define FLASHC_CUDA_SM80_INSTANCES_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "../../params.h"

template <int D, typename T, bool kCausal>
cudaError_t sm80_fwd_launch(const fc_cuda_fwd_params &p, dim3 grid, cudaStream_t stream);

#ifndef FC_SM80_HD_32
#define FC_SM80_HD_32 1
#endif
#if FC_SM80_HD_32
#define FC_SM80_FWD_HD_32_(X) X(32)
extern template cudaError_t sm80_fwd_launch<32, __nv_bfloat16, false>(const fc_cuda_fwd_params &, dim3, cudaStream_t);
extern template cudaError_t sm80_fwd_launch<32, __nv_bfloat16, true>(const fc_cuda_fwd_params &, dim3, cudaStream_t);
extern template cudaError_t sm80_fwd_launch<32, __half, false>(const fc_cuda_fwd_params &, dim3, cudaStream_t);
extern template cudaError_t sm80_fwd_launch<32, __half, true>(const fc_cuda_fwd_params &, dim3, cudaStream_t);
#else
#define FC_SM80_FWD_HD_32_(X)
#endif

#ifndef FC_SM80_HD_64
#define FC_SM80_HD_64 1
#endif
#if FC_SM80_HD_64
#define FC_SM80_FWD_HD_64_(X) X(64)
extern template cudaError_t sm80_fwd_launch<64, __nv_bfloat16, false>(const fc_cuda_fwd_params &, dim3, cudaStream_t);
extern template cudaError_t sm80_fwd_launch<64, __nv_bfloat16, true>(const fc_cuda_fwd_params &, dim3, cudaStream_t);
extern template cudaError_t sm80_fwd_launch<64, __half, false>(const fc_cuda_fwd_params &, dim3, cudaStream_t);
extern template cudaError_t sm80_fwd_launch<64, __half, true>(const fc_cuda_fwd_params &, dim3, cudaStream_t);
#else
#define FC_SM80_FWD_HD_64_(X)
#endif

#ifndef FC_SM80_HD_96
#define FC_SM80_HD_96 1
#endif
#if FC_SM80_HD_96
#define FC_SM80_FWD_HD_96_(X) X(96)
extern template cudaError_t sm80_fwd_launch<96, __nv_bfloat16, false>(const fc_cuda_fwd_params &, dim3, cudaStream_t);
extern template cudaError_t sm80_fwd_launch<96, __nv_bfloat16, true>(const fc_cuda_fwd_params &, dim3, cudaStream_t);
extern template cudaError_t sm80_fwd_launch<96, __half, false>(const fc_cuda_fwd_params &, dim3, cudaStream_t);
extern template cudaError_t sm80_fwd_launch<96, __half, true>(const fc_cuda_fwd_params &, dim3, cudaStream_t);
#else
#define FC_SM80_FWD_HD_96_(X)
#endif

#ifndef FC_SM80_HD_128
#define FC_SM80_HD_128 1
#endif
#if FC_SM80_HD_128
#define FC_SM80_FWD_HD_128_(X) X(128)
extern template cudaError_t sm80_fwd_launch<128, __nv_bfloat16, false>(const fc_cuda_fwd_params &, dim3, cudaStream_t);
extern template cudaError_t sm80_fwd_launch<128, __nv_bfloat16, true>(const fc_cuda_fwd_params &, dim3, cudaStream_t);
extern template cudaError_t sm80_fwd_launch<128, __half, false>(const fc_cuda_fwd_params &, dim3, cudaStream_t);
extern template cudaError_t sm80_fwd_launch<128, __half, true>(const fc_cuda_fwd_params &, dim3, cudaStream_t);
#else
#define FC_SM80_FWD_HD_128_(X)
#endif

#ifndef FC_SM80_HD_160
#define FC_SM80_HD_160 1
#endif
#if FC_SM80_HD_160
#define FC_SM80_FWD_HD_160_(X) X(160)
extern template cudaError_t sm80_fwd_launch<160, __nv_bfloat16, false>(const fc_cuda_fwd_params &, dim3, cudaStream_t);
extern template cudaError_t sm80_fwd_launch<160, __nv_bfloat16, true>(const fc_cuda_fwd_params &, dim3, cudaStream_t);
extern template cudaError_t sm80_fwd_launch<160, __half, false>(const fc_cuda_fwd_params &, dim3, cudaStream_t);
extern template cudaError_t sm80_fwd_launch<160, __half, true>(const fc_cuda_fwd_params &, dim3, cudaStream_t);
#else
#define FC_SM80_FWD_HD_160_(X)
#endif

#ifndef FC_SM80_HD_192
#define FC_SM80_HD_192 1
#endif
#if FC_SM80_HD_192
#define FC_SM80_FWD_HD_192_(X) X(192)
extern template cudaError_t sm80_fwd_launch<192, __nv_bfloat16, false>(const fc_cuda_fwd_params &, dim3, cudaStream_t);
extern template cudaError_t sm80_fwd_launch<192, __nv_bfloat16, true>(const fc_cuda_fwd_params &, dim3, cudaStream_t);
extern template cudaError_t sm80_fwd_launch<192, __half, false>(const fc_cuda_fwd_params &, dim3, cudaStream_t);
extern template cudaError_t sm80_fwd_launch<192, __half, true>(const fc_cuda_fwd_params &, dim3, cudaStream_t);
#else
#define FC_SM80_FWD_HD_192_(X)
#endif

#ifndef FC_SM80_HD_224
#define FC_SM80_HD_224 1
#endif
#if FC_SM80_HD_224
#define FC_SM80_FWD_HD_224_(X) X(224)
extern template cudaError_t sm80_fwd_launch<224, __nv_bfloat16, false>(const fc_cuda_fwd_params &, dim3, cudaStream_t);
extern template cudaError_t sm80_fwd_launch<224, __nv_bfloat16, true>(const fc_cuda_fwd_params &, dim3, cudaStream_t);
extern template cudaError_t sm80_fwd_launch<224, __half, false>(const fc_cuda_fwd_params &, dim3, cudaStream_t);
extern template cudaError_t sm80_fwd_launch<224, __half, true>(const fc_cuda_fwd_params &, dim3, cudaStream_t);
#else
#define FC_SM80_FWD_HD_224_(X)
#endif

#ifndef FC_SM80_HD_256
#define FC_SM80_HD_256 1
#endif
#if FC_SM80_HD_256
#define FC_SM80_FWD_HD_256_(X) X(256)
extern template cudaError_t sm80_fwd_launch<256, __nv_bfloat16, false>(const fc_cuda_fwd_params &, dim3, cudaStream_t);
extern template cudaError_t sm80_fwd_launch<256, __nv_bfloat16, true>(const fc_cuda_fwd_params &, dim3, cudaStream_t);
extern template cudaError_t sm80_fwd_launch<256, __half, false>(const fc_cuda_fwd_params &, dim3, cudaStream_t);
extern template cudaError_t sm80_fwd_launch<256, __half, true>(const fc_cuda_fwd_params &, dim3, cudaStream_t);
#else
#define FC_SM80_FWD_HD_256_(X)
#endif

// X(D) for every compiled head dim, ascending
#define FC_SM80_FWD_HEADDIMS(X) FC_SM80_FWD_HD_32_(X) FC_SM80_FWD_HD_64_(X) FC_SM80_FWD_HD_96_(X) FC_SM80_FWD_HD_128_(X) FC_SM80_FWD_HD_160_(X) FC_SM80_FWD_HD_192_(X) FC_SM80_FWD_HD_224_(X) FC_SM80_FWD_HD_256_(X)

#endif  // FLASHC_CUDA_SM80_INSTANCES_H
