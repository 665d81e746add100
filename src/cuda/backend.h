/* backend.h : the CUDA backend as plain C, for api.c and util.c.
 * Everything behind it (the .cu files in src/cuda) is CUDA C++; nothing C++ leaks out. */
#ifndef FLASHC_CUDA_BACKEND_H
#define FLASHC_CUDA_BACKEND_H

#include <stddef.h>

#include "../internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 if at least one CUDA device of compute capability >= 8.0 is usable. */
int fc_cuda_usable(void);
/* 1 if ptr is device (or managed) memory the CUDA runtime knows. */
int fc_cuda_is_device_pointer(const void *ptr);
void *fc_cuda_malloc(size_t bytes);
void fc_cuda_free(void *p);

/* The forward on device tensors (launch.cu): every pointer in *a (tensors,
 * cu_seqlens, seqlens_k, block_table, ...) is a device pointer and is never read
 * on the host; a->stream is the cudaStream_t. Asynchronous: returns after the
 * launch, FLASHC_OK or FLASHC_ERR_UNSUPPORTED (dtype, head dim, attn_probs,
 * alignment, device) / FLASHC_ERR_CUDA with the message set. It needs
 * fc_cuda_fwd_workspace(a) bytes of device workspace (0 for now).
 * fc_cuda_fwd_supported() runs the same checks and launches nothing. */
size_t fc_cuda_fwd_workspace(const fc_attn *a);
flashc_status fc_cuda_fwd_supported(const fc_attn *a);
flashc_status fc_cuda_fwd(const fc_attn *a, void *ws, size_t ws_bytes);

/* The backward on device tensors (launch.cu): as fc_cuda_fwd, for a problem
 * with dout, dq, dk, dv set. Asynchronous; needs fc_cuda_bwd_workspace(a)
 * bytes of device workspace (the fp32 dQ accumulator, per-row scratch, the
 * repacked operands, the deterministic mode's counters). */
size_t fc_cuda_bwd_workspace(const fc_attn *a);
flashc_status fc_cuda_bwd(const fc_attn *a, void *ws, size_t ws_bytes);

/* flashc_fwd_kvcache on device tensors (launch.cu, "the decode path"): the
 * append of k_new / v_new (rotary first) and the rotary q, then the attention
 * by the split-KV decode kernels, or by fc_cuda_fwd for layouts and query
 * lengths they do not take. kc->cache_seqlens and kc->attn.seqlens_k are NULL:
 * the lengths come from kc->cache_seqlens_in, read on the device. Asynchronous
 * as fc_cuda_fwd; needs fc_cuda_kvcache_workspace(kc) bytes of device
 * workspace (the split partials, the rotated q, the forward's own). */
size_t fc_cuda_kvcache_workspace(const fc_kvcache *kc);
flashc_status fc_cuda_kvcache(const fc_kvcache *kc, void *ws, size_t ws_bytes);

#ifdef __cplusplus
}
#endif

#endif /* FLASHC_CUDA_BACKEND_H */
