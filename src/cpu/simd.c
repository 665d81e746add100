/* simd.c : CPU feature detection and the choice of SIMD path.
 *
 * Features come from cpuid and xgetbv (the OS must save the AVX / AVX-512
 * state). The active path is the best one the CPU and the build support, unless
 * FLASHC_SIMD=scalar|avx2|avx512|amx or flashc_set_simd() asks for another.
 * The amx path also needs the OS's permission for the tile state (Linux:
 * arch_prctl), asked for once, the first time the path is considered.
 */
#if defined(__linux__) && !defined(_DEFAULT_SOURCE)
#define _DEFAULT_SOURCE /* syscall() under -std=c11 */
#endif
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static uint64_t fc_xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static unsigned fc_detect_features(void) {
    unsigned a, b, c, d, f = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    int osxsave = (c >> 27) & 1;
    if (!osxsave) return 0;
    uint64_t xcr0 = fc_xgetbv0();
    int os_avx = (xcr0 & 0x6) == 0x6;
    int os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0;
    int os_amx = (xcr0 & 0x60000) == 0x60000; /* XTILECFG, XTILEDATA */
    if (!os_avx) return 0;
    if ((c >> 12) & 1) f |= FLASHC_CPU_FMA;
    if ((c >> 29) & 1) f |= FLASHC_CPU_F16C;
    if (__get_cpuid_max(0, NULL) < 7) return f;
    __cpuid_count(7, 0, a, b, c, d);
    if ((b >> 5) & 1) f |= FLASHC_CPU_AVX2;
    if (os_avx512) {
        if ((b >> 16) & 1) f |= FLASHC_CPU_AVX512F;
        if ((b >> 17) & 1) f |= FLASHC_CPU_AVX512DQ;
        if ((b >> 30) & 1) f |= FLASHC_CPU_AVX512BW;
        if ((b >> 31) & 1) f |= FLASHC_CPU_AVX512VL;
        if ((d >> 23) & 1) f |= FLASHC_CPU_AVX512FP16;
        if (os_amx && ((d >> 22) & 1) && ((d >> 24) & 1)) f |= FLASHC_CPU_AMXBF16;
        unsigned a1, b1, c1, d1;
        __cpuid_count(7, 1, a1, b1, c1, d1);
        if ((a1 >> 5) & 1) f |= FLASHC_CPU_AVX512BF16;
    }
    return f;
}

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
/* Linux hands out the AMX tile state per process on request (5.16 and later). */
static int fc_amx_request(void) {
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}
#else
static int fc_amx_request(void) { return 0; }
#endif
#else
static unsigned fc_detect_features(void) { return 0; }
static int fc_amx_request(void) { return 0; }
#endif

/* The amx path's permission, asked for once (1 granted, 0 refused). */
static atomic_int fc_amx_permission = -1; /* -1: not asked yet */

static int fc_amx_granted(void) {
    int g = atomic_load(&fc_amx_permission);
    if (g < 0) {
        g = fc_amx_request();
        atomic_store(&fc_amx_permission, g);
    }
    return g;
}

int fc_simd_amx_possible(void) {
#if defined(FLASHC_HAVE_AMX)
    return (flashc_cpu_features() & FLASHC_CPU_AMXBF16) && atomic_load(&fc_amx_permission) != 0;
#else
    return 0;
#endif
}

unsigned flashc_cpu_features(void) {
    static atomic_uint cached; /* features | 1u << 31 once detected */
    unsigned v = atomic_load(&cached);
    if (!v) {
        v = fc_detect_features() | (1u << 31);
        atomic_store(&cached, v);
    }
    return v & ~(1u << 31);
}

static const fc_simd_ops *fc_simd_table(flashc_simd s) {
    switch (s) {
    case FLASHC_SIMD_SCALAR: return &fc_simd_scalar_ops;
#if defined(FLASHC_HAVE_AVX2)
    case FLASHC_SIMD_AVX2: return &fc_simd_avx2_ops;
#endif
#if defined(FLASHC_HAVE_AVX512)
    case FLASHC_SIMD_AVX512: return &fc_simd_avx512_ops;
#endif
#if defined(FLASHC_HAVE_AMX)
    case FLASHC_SIMD_AMX: return &fc_simd_amx_ops;
#endif
    default: return NULL;
    }
}

int flashc_simd_supported(flashc_simd s) {
    unsigned f = flashc_cpu_features();
    if (!fc_simd_table(s)) return 0;
    switch (s) {
    case FLASHC_SIMD_SCALAR: return 1;
    case FLASHC_SIMD_AVX2: {
        unsigned need = FLASHC_CPU_AVX2 | FLASHC_CPU_FMA | FLASHC_CPU_F16C;
        return (f & need) == need;
    }
    case FLASHC_SIMD_AVX512: {
        unsigned need = FLASHC_CPU_AVX512F | FLASHC_CPU_AVX512BW | FLASHC_CPU_AVX512DQ |
                        FLASHC_CPU_AVX512VL | FLASHC_CPU_FMA | FLASHC_CPU_F16C;
        return (f & need) == need;
    }
    case FLASHC_SIMD_AMX:
        return flashc_simd_supported(FLASHC_SIMD_AVX512) && (f & FLASHC_CPU_AVX512BF16) &&
               (f & FLASHC_CPU_AMXBF16) && fc_amx_granted();
    default: return 0;
    }
}

const char *flashc_simd_name(flashc_simd s) {
    switch (s) {
    case FLASHC_SIMD_SCALAR: return "scalar";
    case FLASHC_SIMD_AVX2: return "avx2";
    case FLASHC_SIMD_AVX512: return "avx512";
    case FLASHC_SIMD_AMX: return "amx";
    default: return "invalid";
    }
}

static atomic_int fc_simd_forced = -1; /* -1: not forced */

static flashc_simd fc_simd_best(void) {
    const char *env = getenv("FLASHC_SIMD");
    if (env && *env) {
        for (int s = 0; s < FLASHC_SIMD_COUNT; s++)
            if (strcmp(env, flashc_simd_name((flashc_simd)s)) == 0 &&
                flashc_simd_supported((flashc_simd)s))
                return (flashc_simd)s;
    }
    for (int s = FLASHC_SIMD_COUNT - 1; s > 0; s--)
        if (flashc_simd_supported((flashc_simd)s)) return (flashc_simd)s;
    return FLASHC_SIMD_SCALAR;
}

flashc_simd flashc_simd_active(void) {
    static atomic_int best = -1; /* fc_simd_best(), read once */
    int forced = atomic_load(&fc_simd_forced);
    if (forced >= 0) return (flashc_simd)forced;
    int b = atomic_load(&best);
    if (b < 0) {
        b = (int)fc_simd_best();
        atomic_store(&best, b);
    }
    return (flashc_simd)b;
}

flashc_status flashc_set_simd(flashc_simd s) {
    fc_clear_error();
    if ((int)s < 0 || s >= FLASHC_SIMD_COUNT)
        return fc_set_error(FLASHC_ERR_INVALID_ARG, "simd=%d is not a flashc_simd", (int)s);
    if (!flashc_simd_supported(s))
        return fc_set_error(FLASHC_ERR_UNSUPPORTED, "simd path %s is not supported by this CPU or build",
                            flashc_simd_name(s));
    atomic_store(&fc_simd_forced, (int)s);
    return FLASHC_OK;
}

const fc_simd_ops *fc_simd(void) { return fc_simd_table(flashc_simd_active()); }
