/* place.c : where `flashc bench` runs the library (the fc_place_* functions of
 * cli.h): host memory and the wall clock (CLOCK_MONOTONIC) for the CPU backend;
 * device memory, a stream (params.stream) and CUDA events for the CUDA backend,
 * with the L2 flushed (untimed) before each timed call (STYLE.md section 7).
 *
 * The only CUDA code of the program: cuda_runtime.h from C, in a build with
 * FLASHC_CUDA=ON (FLASHC_HAVE_CUDA here). Without it --backend cuda is refused
 * here with the reason; the modes the CUDA backend lacks are refused by the
 * library, whose message bench.c prints.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#ifdef FLASHC_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "cli.h"

#define FC_L2_FLUSH_BYTES ((size_t)256 << 20) /* above every GPU's L2 (H100/H200: 50 MB) */

static double fc_now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

// ---- CUDA ----

#ifdef FLASHC_HAVE_CUDA
#define FC_CUDA(expr) fc_cuda_check((expr), #expr)
static void fc_cuda_check(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return;
    fprintf(stderr, "flashc bench: %s: %s (%s)\n", what, cudaGetErrorString(e), cudaGetErrorName(e));
    exit(1);
}

/* The first device of compute capability >= 8.0 (the library's requirement),
 * made current; 0 with the reason printed when there is none. */
static int fc_cuda_open(fc_place *pl) {
    int n = 0, major = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice) {
        /* what the runtime answers when no NVIDIA driver is loaded, or no GPU is there */
        int rt = 0;
        cudaRuntimeGetVersion(&rt);
        fprintf(stderr, "flashc bench: --backend cuda: no CUDA device or driver is present on this "
                        "machine (%s: no GPU, no NVIDIA driver loaded, or a driver older than "
                        "this build's CUDA runtime %d.%d)\n",
                cudaGetErrorName(e), rt / 1000, rt % 1000 / 10);
        return 0;
    }
    if (e != cudaSuccess) {
        fprintf(stderr, "flashc bench: --backend cuda: no usable CUDA device: cudaGetDeviceCount: %s (%s)\n",
                cudaGetErrorString(e), cudaGetErrorName(e));
        return 0;
    }
    for (pl->cuda_index = 0; pl->cuda_index < n; pl->cuda_index++) {
        FC_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, pl->cuda_index));
        if (major >= 8) break;
    }
    if (pl->cuda_index == n) {
        fprintf(stderr, "flashc bench: --backend cuda: none of the %d CUDA devices has compute "
                        "capability >= 8.0\n", n);
        return 0;
    }
    FC_CUDA(cudaSetDevice(pl->cuda_index));
    /* a blocking stream: it also orders after the uploads on the legacy default stream */
    cudaStream_t s;
    cudaEvent_t start, stop;
    FC_CUDA(cudaStreamCreate(&s));
    FC_CUDA(cudaEventCreate(&start));
    FC_CUDA(cudaEventCreate(&stop));
    pl->stream = s;
    pl->start = start;
    pl->stop = stop;
    FC_CUDA(cudaMalloc(&pl->flush, FC_L2_FLUSH_BYTES));
    pl->device = FLASHC_DEVICE_CUDA;
    return 1;
}
#endif

// ---- the fc_place operations ----

int fc_place_open(fc_place *pl, flashc_backend want) {
    memset(pl, 0, sizeof *pl);
    pl->backend = want == FLASHC_BACKEND_AUTO ? fc_auto_backend() : want;
    pl->device = FLASHC_DEVICE_CPU;
    if (pl->backend == FLASHC_BACKEND_CPU) return 1;
#ifdef FLASHC_HAVE_CUDA
    return fc_cuda_open(pl);
#else
    fprintf(stderr, "flashc bench: --backend cuda: this flashc was built without CUDA "
                    "(configure with -DFLASHC_CUDA=ON)\n");
    return 0;
#endif
}

void fc_place_close(fc_place *pl) {
#ifdef FLASHC_HAVE_CUDA
    if (pl->device != FLASHC_DEVICE_CUDA) return;
    FC_CUDA(cudaFree(pl->flush));
    FC_CUDA(cudaEventDestroy((cudaEvent_t)pl->start));
    FC_CUDA(cudaEventDestroy((cudaEvent_t)pl->stop));
    FC_CUDA(cudaStreamDestroy((cudaStream_t)pl->stream));
#else
    (void)pl;
#endif
}

void *fc_place_alloc(const fc_place *pl, size_t bytes) {
    void *p = NULL;
#ifdef FLASHC_HAVE_CUDA
    if (pl->device == FLASHC_DEVICE_CUDA) { /* cudaMalloc aligns to at least 256 bytes */
        FC_CUDA(cudaMalloc(&p, bytes));
        FC_CUDA(cudaMemset(p, 0, bytes));
        return p;
    }
#else
    (void)pl;
#endif
    size_t rounded = (bytes + FLASHC_WORKSPACE_ALIGN - 1) / FLASHC_WORKSPACE_ALIGN * FLASHC_WORKSPACE_ALIGN;
    if ((p = aligned_alloc(FLASHC_WORKSPACE_ALIGN, rounded))) memset(p, 0, rounded);
    else fprintf(stderr, "flashc bench: out of memory for %zu bytes\n", bytes);
    return p;
}

void fc_place_free(const fc_place *pl, void *p) {
#ifdef FLASHC_HAVE_CUDA
    if (pl->device == FLASHC_DEVICE_CUDA) {
        if (p) FC_CUDA(cudaFree(p));
        return;
    }
#else
    (void)pl;
#endif
    free(p);
}

void fc_place_upload(const fc_place *pl, const fc_buffers *host, fc_buffers *dev) {
    *dev = *host;
#ifdef FLASHC_HAVE_CUDA
    if (pl->device != FLASHC_DEVICE_CUDA) return;
    for (int t = 0; t < FC_NTENSORS; t++) {
        if (!host->data[t]) continue;
        FC_CUDA(cudaMalloc(&dev->data[t], host->bytes[t]));
        if (t < FC_FIRST_OUTPUT)
            FC_CUDA(cudaMemcpy(dev->data[t], host->data[t], host->bytes[t], cudaMemcpyHostToDevice));
        else
            FC_CUDA(cudaMemset(dev->data[t], 0xff, host->bytes[t]));
    }
    FC_CUDA(cudaDeviceSynchronize());
#else
    (void)pl;
#endif
}

void fc_place_release(const fc_place *pl, fc_buffers *dev) {
    fc_place_free(pl, dev->ws);
    if (pl->device == FLASHC_DEVICE_CPU) return; /* the tensors are the host's */
    for (int t = 0; t < FC_NTENSORS; t++) fc_place_free(pl, dev->data[t]);
}

void fc_place_download(const fc_place *pl, const fc_buffers *dev, fc_buffers *host) {
#ifdef FLASHC_HAVE_CUDA
    if (pl->device != FLASHC_DEVICE_CUDA) return;
    FC_CUDA(cudaStreamSynchronize((cudaStream_t)pl->stream));
    for (int t = FC_FIRST_OUTPUT; t < FC_NTENSORS; t++)
        if (host->data[t])
            FC_CUDA(cudaMemcpy(host->data[t], dev->data[t], host->bytes[t], cudaMemcpyDeviceToHost));
#else
    (void)pl, (void)dev, (void)host;
#endif
}

void fc_place_timer_start(fc_place *pl) {
#ifdef FLASHC_HAVE_CUDA
    if (pl->device == FLASHC_DEVICE_CUDA) {
        cudaStream_t s = (cudaStream_t)pl->stream;
        FC_CUDA(cudaMemsetAsync(pl->flush, 0, FC_L2_FLUSH_BYTES, s)); /* evicts the L2, untimed */
        FC_CUDA(cudaEventRecord((cudaEvent_t)pl->start, s));
        return;
    }
#endif
    pl->t0 = fc_now_ms();
}

double fc_place_timer_stop(fc_place *pl) {
#ifdef FLASHC_HAVE_CUDA
    if (pl->device == FLASHC_DEVICE_CUDA) {
        float ms = 0;
        FC_CUDA(cudaEventRecord((cudaEvent_t)pl->stop, (cudaStream_t)pl->stream));
        FC_CUDA(cudaEventSynchronize((cudaEvent_t)pl->stop));
        FC_CUDA(cudaEventElapsedTime(&ms, (cudaEvent_t)pl->start, (cudaEvent_t)pl->stop));
        return ms;
    }
#endif
    return fc_now_ms() - pl->t0;
}

double fc_place_mem_mib(const fc_place *pl) {
#ifdef FLASHC_HAVE_CUDA
    if (pl->device == FLASHC_DEVICE_CUDA) {
        size_t free_bytes = 0, total = 0;
        FC_CUDA(cudaMemGetInfo(&free_bytes, &total));
        return (double)(total - free_bytes) / (1 << 20);
    }
#else
    (void)pl;
#endif
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0; /* ru_maxrss is in KiB on Linux */
}
