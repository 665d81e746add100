/* gpu_helpers.c : host buffers with device twins for the GPU tests (gpu_helpers.h). */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "gpu_helpers.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int gb_cuda_ok(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 1;
    fc_test_fail(__FILE__, __LINE__, "%s: %s", what, cudaGetErrorString(e));
    return 0;
}

/* A buffer of `bytes` (host zeroed, device unset). NULL on failure (recorded). */
gb_buf *gb_new(gb_arena *a, size_t bytes) {
    if (a->n == GB_MAX_BUFS) {
        fc_test_fail(__FILE__, __LINE__, "gb_new: more than %d buffers in one case", GB_MAX_BUFS);
        return NULL;
    }
    gb_buf *b = &a->b[a->n++];
    b->bytes = bytes ? bytes : 16;
    b->h = calloc(1, b->bytes);
    b->d = NULL;
    if (!b->h || !gb_cuda_ok(cudaMalloc(&b->d, b->bytes), "cudaMalloc")) return NULL;
    return b;
}

int gb_upload(const gb_buf *b) {
    return gb_cuda_ok(cudaMemcpy(b->d, b->h, b->bytes, cudaMemcpyHostToDevice), "upload");
}

int gb_download(const gb_buf *b) {
    return gb_cuda_ok(cudaMemcpy(b->h, b->d, b->bytes, cudaMemcpyDeviceToHost), "download");
}

/* NaN in every float dtype: 0xffff (bf16, fp16), 0xffffffff (fp32). */
int gb_poison(const gb_buf *b) { return gb_cuda_ok(cudaMemset(b->d, 0xff, b->bytes), "poison"); }

double *gb_dbl(gb_arena *a, int64_t n) {
    if (a->nhost == GB_MAX_BUFS) {
        fc_test_fail(__FILE__, __LINE__, "gb_dbl: more than %d arrays in one case", GB_MAX_BUFS);
        return NULL;
    }
    double *p = (double *)malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    a->host[a->nhost++] = p;
    return p;
}

void gb_free(gb_arena *a) {
    for (int i = 0; i < a->n; i++) {
        free(a->b[i].h);
        if (a->b[i].d) cudaFree(a->b[i].d);
    }
    for (int i = 0; i < a->nhost; i++) free(a->host[i]);
    a->n = a->nhost = 0;
}

/* A view of buffer b (host or device side) at element offset off. */
flashc_tensor gb_view(const gb_buf *b, int dev, flashc_dtype dt, int64_t off, int ndim,
                      const int64_t *shape, const int64_t *stride) {
    flashc_tensor t;
    memset(&t, 0, sizeof t);
    t.data = (char *)(dev ? b->d : b->h) + off * (int64_t)flashc_dtype_size(dt);
    t.dtype = dt;
    t.ndim = ndim;
    for (int i = 0; i < ndim; i++) {
        t.shape[i] = shape[i];
        t.stride[i] = stride[i];
    }
    t.device = dev ? FLASHC_DEVICE_CUDA : FLASHC_DEVICE_CPU;
    return t;
}

void gb_contig_strides(int ndim, const int64_t *shape, int64_t *stride) {
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        stride[i] = s;
        s *= shape[i];
    }
}

void gb_fill(gb_buf *b, flashc_dtype dt, double lo, double hi) {
    fc_fill_random(b->h, dt, (int64_t)(b->bytes / flashc_dtype_size(dt)), lo, hi);
}

/* Run the call on the device and wait for it; 1 on success. */
int gb_sync(void) { return gb_cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

/* A device workspace for `bytes` (NULL for 0). */
void *gb_ws(gb_arena *a, size_t bytes) {
    if (!bytes) return NULL;
    gb_buf *b = gb_new(a, bytes);
    return b ? b->d : NULL;
}

int gb_same_bits(const char *what, const char *runs, const void *a, const void *b, size_t bytes) {
    if (memcmp(a, b, bytes) == 0) return 1;
    const unsigned char *x = a, *y = b;
    size_t i = 0;
    while (x[i] == y[i]) i++;
    fc_test_fail(__FILE__, __LINE__, "%s differs between %s at byte %zu", what, runs, i);
    return 0;
}

void gb_family_enter(gb_family *f, const char *family) {
    const char *old = getenv("FLASHC_CUDA_FAMILY");
    f->had = old != NULL;
    snprintf(f->saved, sizeof f->saved, "%s", old ? old : "");
    setenv("FLASHC_CUDA_FAMILY", family, 1);
}

void gb_family_leave(const gb_family *f) {
    if (f->had) setenv("FLASHC_CUDA_FAMILY", f->saved, 1);
    else unsetenv("FLASHC_CUDA_FAMILY");
}

void gb_env_enter(gb_env *e, const char *name, const char *value) {
    const char *old = getenv(name);
    e->name = name;
    e->had = old != NULL;
    snprintf(e->saved, sizeof e->saved, "%s", old ? old : "");
    if (value) setenv(name, value, 1);
    else unsetenv(name);
}

void gb_env_leave(const gb_env *e) {
    if (e->had) setenv(e->name, e->saved, 1);
    else unsetenv(e->name);
}

void gb_with_env(const char *name, const char *value, void (*fn)(const void *), const void *param) {
    gb_env e;
    if (value) gb_env_enter(&e, name, value);
    fn(param);
    if (value) gb_env_leave(&e);
}

int gb_device_is_sm90(void) {
    int dev = 0, major = 0, minor = 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
           major == 9 && minor == 0;
}

/* The GPU tests need a CUDA device of compute capability >= 8.0 (run.c). */
const char *fc_test_skip_reason(void) {
    static char why[200];
    int n = 0, major = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(why, sizeof why, "no CUDA device or driver (cudaGetDeviceCount: %s)",
                 cudaGetErrorString(e));
        return why;
    }
    for (int i = 0; i < n; i++)
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, i) == cudaSuccess &&
            major >= 8)
            return NULL;
    snprintf(why, sizeof why, "none of the %d CUDA devices has compute capability >= 8.0", n);
    return why;
}
