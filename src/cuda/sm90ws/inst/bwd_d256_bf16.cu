// generated; do not edit. Written by tools/gen_instances.py from src/cuda/traits.h.
#include "../bwd_kernel.cuh"

template cudaError_t sm90ws_bwd_launch<256, __nv_bfloat16, false>(const fc_cuda_bwd_ws_params &, dim3, cudaStream_t);
template cudaError_t sm90ws_bwd_launch<256, __nv_bfloat16, true>(const fc_cuda_bwd_ws_params &, dim3, cudaStream_t);
