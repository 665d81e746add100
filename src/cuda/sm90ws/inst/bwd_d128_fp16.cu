// generated; do not edit. Written by tools/gen_instances.py from src/cuda/traits.h.
#include "../bwd_kernel.cuh"

template cudaError_t sm90ws_bwd_launch<128, __half, false>(const fc_cuda_bwd_ws_params &, dim3, cudaStream_t);
template cudaError_t sm90ws_bwd_launch<128, __half, true>(const fc_cuda_bwd_ws_params &, dim3, cudaStream_t);
