/* info.c : `flashc info`, what this build and this machine offer: the version
 * (library and header), CUDA compiled in or not, the backends and the one
 * `--backend auto` picks, CPU features, SIMD paths, threads and CUDA devices.
 * Everything comes from the library's queries; nothing is probed here. */
#include <stdio.h>

#include "cli.h"

flashc_backend fc_auto_backend(void) {
    return flashc_backend_available(FLASHC_BACKEND_CUDA) ? FLASHC_BACKEND_CUDA : FLASHC_BACKEND_CPU;
}

int fc_cmd_info(void) {
    static const struct { unsigned bit; const char *name; } features[] = {
        {FLASHC_CPU_AVX2, "avx2"},         {FLASHC_CPU_FMA, "fma"},
        {FLASHC_CPU_F16C, "f16c"},         {FLASHC_CPU_AVX512F, "avx512f"},
        {FLASHC_CPU_AVX512BW, "avx512bw"}, {FLASHC_CPU_AVX512DQ, "avx512dq"},
        {FLASHC_CPU_AVX512VL, "avx512vl"}, {FLASHC_CPU_AVX512BF16, "avx512_bf16"},
        {FLASHC_CPU_AVX512FP16, "avx512_fp16"},
        {FLASHC_CPU_AMXBF16, "amx_bf16"}};

    printf("flashc %s (header %d.%d.%d)\n", flashc_version(), FLASHC_VERSION_MAJOR,
           FLASHC_VERSION_MINOR, FLASHC_VERSION_PATCH);
    printf("build:        CUDA %s\n", flashc_cuda_compiled() ? "compiled in" : "not compiled in");

    printf("backends:    ");
    for (int b = FLASHC_BACKEND_CPU; b < FLASHC_BACKEND_COUNT; b++)
        printf(" %s (%s)", flashc_backend_name((flashc_backend)b),
               flashc_backend_available((flashc_backend)b) ? "available" : "not available");
    printf("\n");
    printf("backend auto: %s (what `flashc bench --backend auto` runs on)\n",
           flashc_backend_name(fc_auto_backend()));

    unsigned f = flashc_cpu_features();
    printf("cpu features:");
    int any = 0;
    for (size_t i = 0; i < sizeof features / sizeof features[0]; i++)
        if (f & features[i].bit) {
            printf(" %s", features[i].name);
            any = 1;
        }
    printf("%s\n", any ? "" : " none of avx2, fma, f16c, avx512*, amx");

    flashc_simd active = flashc_simd_active();
    printf("simd paths:  ");
    for (int s = 0; s < FLASHC_SIMD_COUNT; s++)
        printf(" %s (%s%s)", flashc_simd_name((flashc_simd)s),
               flashc_simd_supported((flashc_simd)s) ? "supported" : "not supported",
               s == (int)active ? ", active" : "");
    printf("\n");
    printf("threads:      %d\n", flashc_get_num_threads());

    int n = flashc_cuda_device_count();
    if (n <= 0) printf("cuda devices: none\n");
    for (int i = 0; i < n; i++) {
        flashc_cuda_device_info d = FLASHC_ARGS_INIT;
        flashc_status s = flashc_cuda_device_get_info(i, &d);
        if (s != FLASHC_OK) {
            printf("cuda device %d: %s: %s\n", i, flashc_status_string(s), flashc_last_error());
            continue;
        }
        printf("cuda device %d: %s, compute capability %d.%d, %d SMs, %.1f GiB\n", i, d.name,
               d.major, d.minor, d.multiprocessors, (double)d.total_memory_bytes / (1 << 30));
    }
    return 0;
}
