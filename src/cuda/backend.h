/* backend.h : the CUDA backend as plain C, for the backend table (src/backend.c).
 * Everything behind it (the .cu files in src/cuda) is CUDA C++; nothing C++ leaks out. */
#ifndef FLASHC_CUDA_BACKEND_H
#define FLASHC_CUDA_BACKEND_H

#include <stddef.h>

#include "../internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* device.cu: 1 if at least one CUDA device of compute capability >= 8.0 is
 * usable; device memory for the default allocator (NULL on failure). */
int fc_cuda_usable(void);
void *fc_cuda_malloc(size_t bytes);
void fc_cuda_free(void *p);

/* Each operation comes as three functions: *_supported runs every check of
 * the run and launches nothing; *_workspace is the device workspace the run
 * needs, for a problem *_supported accepts; the run itself is asynchronous:
 * it returns after the launches on the stream, FLASHC_OK or
 * FLASHC_ERR_UNSUPPORTED (dtype, head dim, device) / FLASHC_ERR_CUDA
 * with the message set. */

/* The forward on device tensors (fwd.cu): every pointer in *a (tensors,
 * cu_seqlens, seqlens_k, block_table, ...) is a device pointer and is never read
 * on the host; a->stream is the cudaStream_t. The workspace holds the operands
 * that are repacked because the kernels cannot read them in place, and the lse
 * attn_probs are computed from when the caller asks for them without
 * softmax_lse (0 bytes when there is neither). */
flashc_status fc_cuda_fwd_supported(const fc_attn *a);
size_t fc_cuda_fwd_workspace(const fc_attn *a);
flashc_status fc_cuda_fwd(const fc_attn *a, void *ws, size_t ws_bytes);

/* The backward on device tensors (bwd.cu): as fc_cuda_fwd, for a problem with
 * dout, dq, dk, dv set. The workspace holds the fp32 dQ accumulator, per-row
 * scratch, the repacked operands, the deterministic mode's counters. */
flashc_status fc_cuda_bwd_supported(const fc_attn *a);
size_t fc_cuda_bwd_workspace(const fc_attn *a);
flashc_status fc_cuda_bwd(const fc_attn *a, void *ws, size_t ws_bytes);

/* flashc_fwd_kvcache on device tensors (kvcache.cu, "the decode path"): the
 * append of k_new / v_new (rotary first) and the rotary q, then the attention
 * by the split-KV decode kernels, or by fc_cuda_fwd for layouts and query
 * lengths they do not take. kc->cache_seqlens and kc->attn.seqlens_k are NULL:
 * the lengths come from kc->cache_seqlens_in, read on the device. The workspace
 * holds the split partials, the rotated q, the forward's own. */
flashc_status fc_cuda_kvcache_supported(const fc_kvcache *kc);
size_t fc_cuda_kvcache_workspace(const fc_kvcache *kc);
flashc_status fc_cuda_kvcache(const fc_kvcache *kc, void *ws, size_t ws_bytes);

#ifdef __cplusplus
}
#endif

#endif /* FLASHC_CUDA_BACKEND_H */
