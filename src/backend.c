/* backend.c : the backend table, the one place that knows which backends this
 * build has. api.c dispatches every operation through fc_backend_impl_of(id)
 * and util.c's default allocator asks it for device memory, so neither
 * mentions a backend by name; a new backend is one row here.
 *
 * Also here: the public queries about backends (flashc_backend_available,
 * flashc_backend_name) and, in a build without CUDA, the CUDA device queries
 * (src/cuda/device.cu has them otherwise).
 *
 * Not here: the choice of the backend for a call (prepare.c's fc_select_backend, from
 * the tensors' device and params.backend).
 */
#include <stdlib.h>

#include "internal.h"
#ifdef FLASHC_HAVE_CUDA
#include "cuda/backend.h"
#endif

static int fc_cpu_usable(void) { return 1; }

/* Host memory, aligned to FLASHC_WORKSPACE_ALIGN (aligned_alloc wants a
 * multiple of the alignment, and 0 bytes still gives a unique pointer). */
static void *fc_cpu_malloc(size_t bytes) {
    size_t rounded = (bytes + FLASHC_WORKSPACE_ALIGN - 1) / FLASHC_WORKSPACE_ALIGN * FLASHC_WORKSPACE_ALIGN;
    return aligned_alloc(FLASHC_WORKSPACE_ALIGN, rounded ? rounded : FLASHC_WORKSPACE_ALIGN);
}

static const fc_backend_impl fc_cpu_impl = {
    .id = FLASHC_BACKEND_CPU,
    .device = FLASHC_DEVICE_CPU,
    .usable = fc_cpu_usable,
    .fwd = {NULL, fc_cpu_fwd_workspace, fc_cpu_fwd},
    .bwd = {NULL, fc_cpu_bwd_workspace, fc_cpu_bwd},
    .kvcache = {NULL, fc_cpu_kvcache_workspace, fc_cpu_kvcache},
    .malloc = fc_cpu_malloc,
    .free = free,
};

#ifdef FLASHC_HAVE_CUDA
static const fc_backend_impl fc_cuda_impl = {
    .id = FLASHC_BACKEND_CUDA,
    .device = FLASHC_DEVICE_CUDA,
    .usable = fc_cuda_usable,
    .fwd = {fc_cuda_fwd_supported, fc_cuda_fwd_workspace, fc_cuda_fwd},
    .bwd = {fc_cuda_bwd_supported, fc_cuda_bwd_workspace, fc_cuda_bwd},
    .kvcache = {fc_cuda_kvcache_supported, fc_cuda_kvcache_workspace, fc_cuda_kvcache},
    .malloc = fc_cuda_malloc,
    .free = fc_cuda_free,
};
#else
int flashc_cuda_compiled(void) { return 0; }

int flashc_cuda_device_count(void) { return 0; }

flashc_status flashc_cuda_device_get_info(int index, flashc_cuda_device_info *info) {
    (void)index;
    fc_clear_error();
    FC_CHECK_ARG(info, "info is NULL");
    FC_TRY(fc_check_abi("info.abi", info->abi));
    return fc_set_error(FLASHC_ERR_UNSUPPORTED,
                        "flashc_cuda_device_get_info: this build has no CUDA backend");
}
#endif

const fc_backend_impl *fc_backend_impl_of(flashc_backend id) {
    switch (id) {
    case FLASHC_BACKEND_CPU: return &fc_cpu_impl;
#ifdef FLASHC_HAVE_CUDA
    case FLASHC_BACKEND_CUDA: return &fc_cuda_impl;
#endif
    default: return NULL;
    }
}

flashc_backend fc_backend_of_device(flashc_device dev) {
    return dev == FLASHC_DEVICE_CUDA ? FLASHC_BACKEND_CUDA : FLASHC_BACKEND_CPU;
}

int flashc_backend_available(flashc_backend b) {
    if (b == FLASHC_BACKEND_AUTO) return 1;
    const fc_backend_impl *impl = fc_backend_impl_of(b);
    return impl && impl->usable();
}

const char *flashc_backend_name(flashc_backend b) {
    switch (b) {
    case FLASHC_BACKEND_AUTO: return "auto";
    case FLASHC_BACKEND_CPU: return "cpu";
    case FLASHC_BACKEND_CUDA: return "cuda";
    default: return "invalid";
    }
}
