/* util.c : the thread-local last error, the launch log (FLASHC_LOG), fp16
 * conversion, workspace layout and the allocator behind the convenience path. */
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ---- errors ---- */
static _Thread_local char fc_errbuf[512];

flashc_status fc_set_error(flashc_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(fc_errbuf, sizeof fc_errbuf, fmt, ap);
    va_end(ap);
    return s;
}

void fc_clear_error(void) { fc_errbuf[0] = '\0'; }

const char *flashc_last_error(void) { return fc_errbuf; }

const char *flashc_status_string(flashc_status s) {
    switch (s) {
#define FC_STATUS_CASE_(name, value, text) \
    case name: return text;
        FLASHC_STATUS_LIST(FC_STATUS_CASE_)
#undef FC_STATUS_CASE_
    default: return "unknown status";
    }
}

/* ---- the launch log ---- */
static atomic_int fc_log_state = -1; /* -1: FLASHC_LOG not read yet; else 0 or 1 */

bool fc_log_on(void) {
    int on = atomic_load_explicit(&fc_log_state, memory_order_relaxed);
    if (on < 0) {
        const char *env = getenv("FLASHC_LOG");
        on = env && *env && strcmp(env, "0") != 0;
        atomic_store_explicit(&fc_log_state, on, memory_order_relaxed);
    }
    return on != 0;
}

void fc_log_reload(void) { atomic_store_explicit(&fc_log_state, -1, memory_order_relaxed); }

void fc_log(const char *fmt, ...) {
    char line[512];
    static const char prefix[] = "flashc: ";
    memcpy(line, prefix, sizeof prefix - 1);
    size_t room = sizeof line - (sizeof prefix - 1) - 1; /* keep one byte for the newline */
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line + sizeof prefix - 1, room + 1, fmt, ap);
    va_end(ap);
    size_t len = sizeof prefix - 1 + (n < 0 ? 0 : (size_t)n < room ? (size_t)n : room);
    line[len++] = '\n';
    fwrite(line, 1, len, stderr); /* one write: lines of concurrent calls do not interleave */
}

/* ---- fp16 <-> fp32, exact, round to nearest even ---- */
float fc_half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    union { uint32_t u; float f; } x;
    if (exp == 0x1f) {
        x.u = sign | 0x7f800000u | (man << 13); /* inf, NaN */
    } else if (exp == 0) {
        float v = ldexpf((float)man, -24); /* zero, subnormal */
        x.f = v;
        x.u |= sign;
    } else {
        x.u = sign | ((exp + 112u) << 23) | (man << 13);
    }
    return x.f;
}

uint16_t fc_float_to_half(float f) {
    union { uint32_t u; float f; } x;
    x.f = f;
    uint32_t sign = (x.u >> 16) & 0x8000u;
    uint32_t a = x.u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);   /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  /* rounds past 65504: inf */
    if (a < 0x38800000u) {                                    /* below 2^-14: subnormal or 0 */
        union { uint32_t u; float f; } y;
        y.u = a;
        /* adding 0.5 shifts the subnormal grid (2^-24) to the float ulp at 0.5;
           the float add rounds to nearest even */
        y.f += 0.5f;
        return (uint16_t)(sign | (y.u - 0x3f000000u));
    }
    uint32_t odd = (a >> 13) & 1u;
    a += 0xc8000fffu + odd; /* rebias exponent (-112 << 23) and round */
    return (uint16_t)(sign | (a >> 13));
}

size_t flashc_dtype_size(flashc_dtype dt) {
    switch (dt) {
    case FLASHC_DTYPE_FP32: return 4;
    case FLASHC_DTYPE_FP16: return 2;
    case FLASHC_DTYPE_BF16: return 2;
    case FLASHC_DTYPE_INT32: return 4;
    default: return 0;
    }
}

const char *flashc_dtype_name(flashc_dtype dt) {
    switch (dt) {
    case FLASHC_DTYPE_FP32: return "fp32";
    case FLASHC_DTYPE_FP16: return "fp16";
    case FLASHC_DTYPE_BF16: return "bf16";
    case FLASHC_DTYPE_INT32: return "int32";
    default: return "invalid";
    }
}

flashc_tensor flashc_tensor_contiguous(void *data, flashc_dtype dtype, int32_t ndim,
                                       const int64_t *shape, flashc_device device) {
    flashc_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dtype;
    t.device = device;
    t.ndim = ndim < 0 ? 0 : ndim > FLASHC_MAX_DIMS ? FLASHC_MAX_DIMS : ndim;
    int64_t s = 1;
    for (int i = t.ndim - 1; i >= 0; i--) {
        t.shape[i] = shape ? shape[i] : 0;
        t.stride[i] = s;
        s *= t.shape[i] > 0 ? t.shape[i] : 1;
    }
    return t;
}

flashc_params flashc_params_default(void) {
    flashc_params p = FLASHC_PARAMS_INIT;
    return p;
}

unsigned flashc_abi_version(void) { return FLASHC_ABI_VERSION; }

flashc_status fc_check_abi(const char *name, uint32_t abi) {
    FC_CHECK_ARG(abi == FLASHC_ABI_VERSION,
                 "%s=%u but this library (flashc %s) has ABI version %d: compile against its "
                 "flashc.h and set %s = FLASHC_ABI_VERSION (FLASHC_ARGS_INIT does for args)",
                 name, (unsigned)abi, flashc_version(), FLASHC_ABI_VERSION, name);
    return FLASHC_OK;
}

const char *flashc_version(void) {
#define FC_STR2_(x) #x
#define FC_STR_(x) FC_STR2_(x)
    return FC_STR_(FLASHC_VERSION_MAJOR) "." FC_STR_(FLASHC_VERSION_MINOR) "." FC_STR_(
        FLASHC_VERSION_PATCH);
#undef FC_STR_
#undef FC_STR2_
}

unsigned flashc_version_number(void) { return FLASHC_VERSION_NUMBER; }

/* ---- workspace layout ---- */
size_t fc_ws_layout(int n, const size_t *sizes, size_t *offsets) {
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        offsets[i] = total;
        size_t s = sizes[i];
        total += (s + FLASHC_WORKSPACE_ALIGN - 1) / FLASHC_WORKSPACE_ALIGN * FLASHC_WORKSPACE_ALIGN;
    }
    return total;
}

/* ---- allocator ---- */
/* The default: the memory of the backend whose tensors live on dev (backend.c);
 * NULL for a device this build has no backend for. */
static void *fc_default_alloc(size_t bytes, flashc_device dev, void *user) {
    (void)user;
    const fc_backend_impl *impl = fc_backend_impl_of(fc_backend_of_device(dev));
    return impl ? impl->malloc(bytes) : NULL;
}

static void fc_default_free(void *p, flashc_device dev, void *user) {
    (void)user;
    const fc_backend_impl *impl = fc_backend_impl_of(fc_backend_of_device(dev));
    if (impl) impl->free(p);
}

static flashc_allocator fc_allocator = {FLASHC_ABI_VERSION, fc_default_alloc, fc_default_free, NULL};

flashc_status flashc_set_allocator(const flashc_allocator *a) {
    fc_clear_error();
    if (a) FC_TRY(fc_check_abi("allocator.abi", a->abi));
    if (a && a->alloc && a->free) {
        fc_allocator = *a;
    } else {
        fc_allocator.alloc = fc_default_alloc;
        fc_allocator.free = fc_default_free;
        fc_allocator.user = NULL;
    }
    return FLASHC_OK;
}

void *fc_alloc(size_t bytes, flashc_device dev) { return fc_allocator.alloc(bytes, dev, fc_allocator.user); }

void fc_free(void *p, flashc_device dev) {
    if (p) fc_allocator.free(p, dev, fc_allocator.user);
}
