// device.cu : CUDA device discovery (the public flashc_cuda_* queries, and
// whether the backend is usable at all) and the device memory of the default
// allocator (src/backend.c's table row for CUDA).
//
// Not here: the operations (fwd.cu, bwd.cu, kvcache.cu) and the properties
// their plans read (plan.cu: fc_cuda_device_get).
#include <cuda_runtime.h>
#include <string.h>

#include "backend.h"

extern "C" int flashc_cuda_compiled(void) { return 1; }

extern "C" int flashc_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // clear the sticky "no driver" error
        return 0;
    }
    return n;
}

extern "C" flashc_status flashc_cuda_device_get_info(int index, flashc_cuda_device_info *info) {
    fc_clear_error();
    if (!info) return fc_set_error(FLASHC_ERR_INVALID_ARG, "info is NULL");
    FC_TRY(fc_check_abi("info.abi", info->abi));
    int n = flashc_cuda_device_count();
    if (index < 0 || index >= n)
        return fc_set_error(FLASHC_ERR_INVALID_ARG, "device index %d but %d CUDA devices", index, n);
    cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceProperties(&prop, index);
    if (e != cudaSuccess)
        return fc_set_error(FLASHC_ERR_CUDA, "cudaGetDeviceProperties(%d): %s", index,
                            cudaGetErrorString(e));
    memset(info, 0, sizeof *info);
    info->abi = FLASHC_ABI_VERSION;
    memcpy(info->name, prop.name, sizeof info->name - 1);  // both 256 bytes; info was zeroed
    info->major = prop.major;
    info->minor = prop.minor;
    info->multiprocessors = prop.multiProcessorCount;
    info->total_memory_bytes = (int64_t)prop.totalGlobalMem;
    info->shared_memory_per_block_optin = (int64_t)prop.sharedMemPerBlockOptin;
    info->l2_cache_bytes = (int64_t)prop.l2CacheSize;
    return FLASHC_OK;
}

extern "C" int fc_cuda_usable(void) {
    int n = flashc_cuda_device_count();
    for (int i = 0; i < n; i++) {
        int major = 0;
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, i) == cudaSuccess &&
            major >= 8)
            return 1;
    }
    return 0;
}

extern "C" void *fc_cuda_malloc(size_t bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}

extern "C" void fc_cuda_free(void *p) { cudaFree(p); }
