// generated; do not edit. Written by tools/gen_instances.py from src/cuda/traits.h.
// The sm90ws backward instances that exist, for bwd.cu. A build trimmed with
// FLASHC_CUDA_HEADDIMS (or without the family's arch) defines FC_SM90WS_BWD_HD_<D>=0
// for the head dims it leaves out.
#ifndef FLASHC_CUDA_SM90WS_BWD_INSTANCES_H
#define FLASHC_CUDA_SM90WS_BWD_INSTANCES_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "../../ws_params.h"

template <int D, typename T, bool kCausal>
cudaError_t sm90ws_bwd_launch(const fc_cuda_bwd_ws_params &p, dim3 grid, cudaStream_t stream);

#ifndef FC_SM90WS_BWD_HD_64
#define FC_SM90WS_BWD_HD_64 1
#endif
#if FC_SM90WS_BWD_HD_64
#define FC_SM90WS_BWD_HD_64_(X) X(64)
extern template cudaError_t sm90ws_bwd_launch<64, __nv_bfloat16, false>(const fc_cuda_bwd_ws_params &, dim3, cudaStream_t);
extern template cudaError_t sm90ws_bwd_launch<64, __nv_bfloat16, true>(const fc_cuda_bwd_ws_params &, dim3, cudaStream_t);
extern template cudaError_t sm90ws_bwd_launch<64, __half, false>(const fc_cuda_bwd_ws_params &, dim3, cudaStream_t);
extern template cudaError_t sm90ws_bwd_launch<64, __half, true>(const fc_cuda_bwd_ws_params &, dim3, cudaStream_t);
#else
#define FC_SM90WS_BWD_HD_64_(X)
#endif

#ifndef FC_SM90WS_BWD_HD_128
#define FC_SM90WS_BWD_HD_128 1
#endif
#if FC_SM90WS_BWD_HD_128
#define FC_SM90WS_BWD_HD_128_(X) X(128)
extern template cudaError_t sm90ws_bwd_launch<128, __nv_bfloat16, false>(const fc_cuda_bwd_ws_params &, dim3, cudaStream_t);
extern template cudaError_t sm90ws_bwd_launch<128, __nv_bfloat16, true>(const fc_cuda_bwd_ws_params &, dim3, cudaStream_t);
extern template cudaError_t sm90ws_bwd_launch<128, __half, false>(const fc_cuda_bwd_ws_params &, dim3, cudaStream_t);
extern template cudaError_t sm90ws_bwd_launch<128, __half, true>(const fc_cuda_bwd_ws_params &, dim3, cudaStream_t);
#else
#define FC_SM90WS_BWD_HD_128_(X)
#endif

#ifndef FC_SM90WS_BWD_HD_256
#define FC_SM90WS_BWD_HD_256 1
#endif
#if FC_SM90WS_BWD_HD_256
#define FC_SM90WS_BWD_HD_256_(X) X(256)
extern template cudaError_t sm90ws_bwd_launch<256, __nv_bfloat16, false>(const fc_cuda_bwd_ws_params &, dim3, cudaStream_t);
extern template cudaError_t sm90ws_bwd_launch<256, __nv_bfloat16, true>(const fc_cuda_bwd_ws_params &, dim3, cudaStream_t);
extern template cudaError_t sm90ws_bwd_launch<256, __half, false>(const fc_cuda_bwd_ws_params &, dim3, cudaStream_t);
extern template cudaError_t sm90ws_bwd_launch<256, __half, true>(const fc_cuda_bwd_ws_params &, dim3, cudaStream_t);
#else
#define FC_SM90WS_BWD_HD_256_(X)
#endif

// X(D) for every compiled head dim, ascending
#define FC_SM90WS_BWD_HEADDIMS(X) FC_SM90WS_BWD_HD_64_(X) FC_SM90WS_BWD_HD_128_(X) FC_SM90WS_BWD_HD_256_(X)

#endif  // FLASHC_CUDA_SM90WS_BWD_INSTANCES_H
