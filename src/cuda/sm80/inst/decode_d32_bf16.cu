// generated; do not edit. Written by tools/gen_instances.py from src/cuda/decode_traits.h.
#include "../decode_kernel.cuh"

template cudaError_t sm80_decode_launch<32, __nv_bfloat16>(const fc_cuda_decode_params &, unsigned, cudaStream_t);
template cudaError_t sm80_decode_ctas_per_sm<32, __nv_bfloat16>(int *);
