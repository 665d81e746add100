// generated; do not edit. Written by tools/gen_instances.py from src/cuda/decode_traits.h.
// The sm80 decode instances that exist, for kvcache.cu. A build trimmed with
// FLASHC_CUDA_HEADDIMS defines FC_SM80_DECODE_HD_<D>=0 for the head dims it leaves out.
#ifndef FLASHC_CUDA_SM80_DECODE_INSTANCES_H
#define FLASHC_CUDA_SM80_DECODE_INSTANCES_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "../../decode_params.h"

template <int D, typename T>
cudaError_t sm80_decode_launch(const fc_cuda_decode_params &, unsigned, cudaStream_t);
template <int D, typename T>
cudaError_t sm80_decode_ctas_per_sm(int *);

#ifndef FC_SM80_DECODE_HD_32
#define FC_SM80_DECODE_HD_32 1
#endif
#if FC_SM80_DECODE_HD_32
#define FC_SM80_DECODE_HD_32_(X) X(32)
extern template cudaError_t sm80_decode_launch<32, __nv_bfloat16>(const fc_cuda_decode_params &, unsigned, cudaStream_t);
extern template cudaError_t sm80_decode_ctas_per_sm<32, __nv_bfloat16>(int *);
extern template cudaError_t sm80_decode_launch<32, __half>(const fc_cuda_decode_params &, unsigned, cudaStream_t);
extern template cudaError_t sm80_decode_ctas_per_sm<32, __half>(int *);
#else
#define FC_SM80_DECODE_HD_32_(X)
#endif

#ifndef FC_SM80_DECODE_HD_64
#define FC_SM80_DECODE_HD_64 1
#endif
#if FC_SM80_DECODE_HD_64
#define FC_SM80_DECODE_HD_64_(X) X(64)
extern template cudaError_t sm80_decode_launch<64, __nv_bfloat16>(const fc_cuda_decode_params &, unsigned, cudaStream_t);
extern template cudaError_t sm80_decode_ctas_per_sm<64, __nv_bfloat16>(int *);
extern template cudaError_t sm80_decode_launch<64, __half>(const fc_cuda_decode_params &, unsigned, cudaStream_t);
extern template cudaError_t sm80_decode_ctas_per_sm<64, __half>(int *);
#else
#define FC_SM80_DECODE_HD_64_(X)
#endif

#ifndef FC_SM80_DECODE_HD_96
#define FC_SM80_DECODE_HD_96 1
#endif
#if FC_SM80_DECODE_HD_96
#define FC_SM80_DECODE_HD_96_(X) X(96)
extern template cudaError_t sm80_decode_launch<96, __nv_bfloat16>(const fc_cuda_decode_params &, unsigned, cudaStream_t);
extern template cudaError_t sm80_decode_ctas_per_sm<96, __nv_bfloat16>(int *);
extern template cudaError_t sm80_decode_launch<96, __half>(const fc_cuda_decode_params &, unsigned, cudaStream_t);
extern template cudaError_t sm80_decode_ctas_per_sm<96, __half>(int *);
#else
#define FC_SM80_DECODE_HD_96_(X)
#endif

#ifndef FC_SM80_DECODE_HD_128
#define FC_SM80_DECODE_HD_128 1
#endif
#if FC_SM80_DECODE_HD_128
#define FC_SM80_DECODE_HD_128_(X) X(128)
extern template cudaError_t sm80_decode_launch<128, __nv_bfloat16>(const fc_cuda_decode_params &, unsigned, cudaStream_t);
extern template cudaError_t sm80_decode_ctas_per_sm<128, __nv_bfloat16>(int *);
extern template cudaError_t sm80_decode_launch<128, __half>(const fc_cuda_decode_params &, unsigned, cudaStream_t);
extern template cudaError_t sm80_decode_ctas_per_sm<128, __half>(int *);
#else
#define FC_SM80_DECODE_HD_128_(X)
#endif

#ifndef FC_SM80_DECODE_HD_160
#define FC_SM80_DECODE_HD_160 1
#endif
#if FC_SM80_DECODE_HD_160
#define FC_SM80_DECODE_HD_160_(X) X(160)
extern template cudaError_t sm80_decode_launch<160, __nv_bfloat16>(const fc_cuda_decode_params &, unsigned, cudaStream_t);
extern template cudaError_t sm80_decode_ctas_per_sm<160, __nv_bfloat16>(int *);
extern template cudaError_t sm80_decode_launch<160, __half>(const fc_cuda_decode_params &, unsigned, cudaStream_t);
extern template cudaError_t sm80_decode_ctas_per_sm<160, __half>(int *);
#else
#define FC_SM80_DECODE_HD_160_(X)
#endif

#ifndef FC_SM80_DECODE_HD_192
#define FC_SM80_DECODE_HD_192 1
#endif
#if FC_SM80_DECODE_HD_192
#define FC_SM80_DECODE_HD_192_(X) X(192)
extern template cudaError_t sm80_decode_launch<192, __nv_bfloat16>(const fc_cuda_decode_params &, unsigned, cudaStream_t);
extern template cudaError_t sm80_decode_ctas_per_sm<192, __nv_bfloat16>(int *);
extern template cudaError_t sm80_decode_launch<192, __half>(const fc_cuda_decode_params &, unsigned, cudaStream_t);
extern template cudaError_t sm80_decode_ctas_per_sm<192, __half>(int *);
#else
#define FC_SM80_DECODE_HD_192_(X)
#endif

#ifndef FC_SM80_DECODE_HD_224
#define FC_SM80_DECODE_HD_224 1
#endif
#if FC_SM80_DECODE_HD_224
#define FC_SM80_DECODE_HD_224_(X) X(224)
extern template cudaError_t sm80_decode_launch<224, __nv_bfloat16>(const fc_cuda_decode_params &, unsigned, cudaStream_t);
extern template cudaError_t sm80_decode_ctas_per_sm<224, __nv_bfloat16>(int *);
extern template cudaError_t sm80_decode_launch<224, __half>(const fc_cuda_decode_params &, unsigned, cudaStream_t);
extern template cudaError_t sm80_decode_ctas_per_sm<224, __half>(int *);
#else
#define FC_SM80_DECODE_HD_224_(X)
#endif

#ifndef FC_SM80_DECODE_HD_256
#define FC_SM80_DECODE_HD_256 1
#endif
#if FC_SM80_DECODE_HD_256
#define FC_SM80_DECODE_HD_256_(X) X(256)
extern template cudaError_t sm80_decode_launch<256, __nv_bfloat16>(const fc_cuda_decode_params &, unsigned, cudaStream_t);
extern template cudaError_t sm80_decode_ctas_per_sm<256, __nv_bfloat16>(int *);
extern template cudaError_t sm80_decode_launch<256, __half>(const fc_cuda_decode_params &, unsigned, cudaStream_t);
extern template cudaError_t sm80_decode_ctas_per_sm<256, __half>(int *);
#else
#define FC_SM80_DECODE_HD_256_(X)
#endif

// X(D) for every compiled decode head dim, ascending
#define FC_SM80_DECODE_HEADDIMS(X) FC_SM80_DECODE_HD_32_(X) FC_SM80_DECODE_HD_64_(X) FC_SM80_DECODE_HD_96_(X) FC_SM80_DECODE_HD_128_(X) FC_SM80_DECODE_HD_160_(X) FC_SM80_DECODE_HD_192_(X) FC_SM80_DECODE_HD_224_(X) FC_SM80_DECODE_HD_256_(X)

#endif  // FLASHC_CUDA_SM80_DECODE_INSTANCES_H
