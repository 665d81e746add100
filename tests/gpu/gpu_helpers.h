/* gpu_helpers.h : what the GPU tests share (test_gpu_fwd.c, test_gpu_kvcache.c):
 * host buffers with device twins, NaN poisoning of device outputs, views of
 * either side as flashc tensors, and device workspaces. The GPU tests also link
 * tests/helpers.c (th_shuffle for block tables).
 *
 * Failures are recorded through fc_test.h; nothing here aborts a run.
 */
#ifndef FLASHC_TEST_GPU_HELPERS_H
#define FLASHC_TEST_GPU_HELPERS_H

#include <stddef.h>
#include <stdint.h>

#include "../fc_test.h"
#include "flashc.h"

/* Like FC_ASSERT_OK, but jumps to the case's `done:` so its buffers are freed. */
#define GB_OK(expr)                                                                 \
    do {                                                                            \
        flashc_status gb_s_ = (expr);                                               \
        if (gb_s_ != FLASHC_OK) {                                                   \
            fc_test_fail(__FILE__, __LINE__, "%s: %s (%s)", #expr,                  \
                         flashc_status_string(gb_s_), flashc_last_error());         \
            goto done;                                                              \
        }                                                                           \
    } while (0)

/* A host buffer and its device twin; one per tensor. */
typedef struct {
    void *h, *d;
    size_t bytes;
} gb_buf;

/* What a case allocates, freed by gb_free at its end. */
#define GB_MAX_BUFS 32
typedef struct {
    gb_buf b[GB_MAX_BUFS];
    int n;
    void *host[GB_MAX_BUFS];
    int nhost;
} gb_arena;

/* A buffer of `bytes` (host zeroed, device unset). NULL on failure (recorded). */
gb_buf *gb_new(gb_arena *a, size_t bytes);
/* Copy the host side to the device side, or back; 1 on success. */
int gb_upload(const gb_buf *b);
int gb_download(const gb_buf *b);
/* NaN in every float dtype on the device side: 0xffff (bf16, fp16), 0xffffffff (fp32). */
int gb_poison(const gb_buf *b);
/* n doubles owned by the arena (uninitialised). */
double *gb_dbl(gb_arena *a, int64_t n);
void gb_free(gb_arena *a);
/* A view of buffer b (host side, or device side when dev) at element offset off. */
flashc_tensor gb_view(const gb_buf *b, int dev, flashc_dtype dt, int64_t off, int ndim,
                      const int64_t *shape, const int64_t *stride);
void gb_contig_strides(int ndim, const int64_t *shape, int64_t *stride);
/* Fill the host side with uniform [lo, hi) values of dtype dt. */
void gb_fill(gb_buf *b, flashc_dtype dt, double lo, double hi);
/* Wait for the device; 1 on success. */
int gb_sync(void);
/* A device workspace of `bytes` owned by the arena (NULL for 0 or on failure). */
void *gb_ws(gb_arena *a, size_t bytes);
/* FLASHC_CUDA_FAMILY set to `family` ("auto" or "sm80") for one case; leave
 * puts the previous value (or its absence) back. */
typedef struct {
    char saved[32];
    int had;
} gb_family;
void gb_family_enter(gb_family *f, const char *family);
void gb_family_leave(const gb_family *f);

/* Environment variable `name` set to `value` (NULL: unset) until gb_env_leave
 * restores it (e.g. FLASHC_CUDA_GQA_PACK=1: GQA packing wherever the kernel can). */
typedef struct {
    const char *name;
    int had;
    char saved[64];
} gb_env;
void gb_env_enter(gb_env *e, const char *name, const char *value);
void gb_env_leave(const gb_env *e);
/* fn(param) with `name` set to `value` meanwhile (NULL: left as it is). */
void gb_with_env(const char *name, const char *value, void (*fn)(const void *), const void *param);

/* 1 when the current device has compute capability 9.0 (the sm90 families run). */
int gb_device_is_sm90(void);

/* 1 if a and b (two runs' results) agree bit for bit; else a failure
 * "<what> differs between <runs> at byte N" (the first byte that differs). */
int gb_same_bits(const char *what, const char *runs, const void *a, const void *b, size_t bytes);

#endif /* FLASHC_TEST_GPU_HELPERS_H */
