// generated; do not edit. Written by tools/gen_instances.py from src/cuda/decode_traits.h.
#include "../decode_kernel.cuh"

template cudaError_t sm80_decode_launch<224, __half>(const fc_cuda_decode_params &, unsigned, cudaStream_t);
template cudaError_t sm80_decode_ctas_per_sm<224, __half>(int *);
