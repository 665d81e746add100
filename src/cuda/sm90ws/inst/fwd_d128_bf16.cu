// generated; do not edit. Written by tools/gen_instances.py from src/cuda/traits.h.
#include "../fwd_kernel.cuh"

template cudaError_t sm90ws_fwd_launch<128, __nv_bfloat16, false>(const fc_cuda_fwd_ws_params &, dim3, cudaStream_t);
template cudaError_t sm90ws_fwd_launch<128, __nv_bfloat16, true>(const fc_cuda_fwd_ws_params &, dim3, cudaStream_t);
