/* simd_gemm.c : GFLOP/s of the CPU backend's fp32 GEMM micro-kernels (the
 * fc_simd_ops tables of src/cpu/simd_*.c) at the shapes the forward and the
 * backward call them with, against the core's FMA ceiling measured by a loop
 * of independent FMAs at the same width. One thread; each row is the median of
 * 7 timed runs of 0.4 GFLOP of calls each (~4 ms), operands resident in cache as
 * they are inside a tile, leading dimensions the logical sizes (as the tiles'
 * at D 64 and 128). On Zen4 the 512-bit FMA rate equals the 256-bit one, so the
 * ceiling holds for the avx512 table too.
 *
 *   cc -O3 -DFLASHC_HAVE_AVX2 -DFLASHC_HAVE_AVX512 -I include -I src bench/simd_gemm.c \
 *      build/libflashc.a -lm -lpthread -o simd_gemm && ./simd_gemm [avx2|avx512]
 *
 * (an x86-64 build of the library with both paths; default avx2). Output: the
 * ceiling, then CSV rows shape,op,M,N,K,GFLOP/s.
 *
 * Shapes (M N K, the op): fwd S^T = Kj Qi^T is gemm_nn Bc x Br x D, fwd O += P V
 * is gemm_tn Br x Dv x Bc; bwd S = Qi Kj^T is gemm_nt Br x Bc x D, dV, dK are
 * gemm_tn Bc x D x Br, dQ is gemm_nn Br x D x Bc (fwd.c, bwd.c tile tables);
 * decode (a narrow tile of 1..8 query columns, D 128): S^T is gemm_nn Bc x nq x D,
 * O += P V gemm_tn nq x Dv x Bc; "odd" has every dimension off the tile sizes.
 * Not here: correctness (tests/ hold every path to the float64 reference).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/simd.h"

static double fc_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static int fc_cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* 12 independent chains of 8-lane FMAs (vfmadd231ps ymm, 4 cycles of latency,
 * 2 pipes: 8 chains keep both busy), in assembly so that no register moves or
 * spills enter the loop: the AVX2 ceiling in FLOP per second. */
static double fc_peak_avx2(void) {
    long n = 20000000;
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        long k = n;
        double t0 = fc_now();
        __asm__ volatile("vxorps %%ymm0, %%ymm0, %%ymm0\n\t"
                         "vxorps %%ymm1, %%ymm1, %%ymm1\n\t"
                         "1:\n\t"
                         "vfmadd231ps %%ymm0, %%ymm1, %%ymm2\n\t"
                         "vfmadd231ps %%ymm0, %%ymm1, %%ymm3\n\t"
                         "vfmadd231ps %%ymm0, %%ymm1, %%ymm4\n\t"
                         "vfmadd231ps %%ymm0, %%ymm1, %%ymm5\n\t"
                         "vfmadd231ps %%ymm0, %%ymm1, %%ymm6\n\t"
                         "vfmadd231ps %%ymm0, %%ymm1, %%ymm7\n\t"
                         "vfmadd231ps %%ymm0, %%ymm1, %%ymm8\n\t"
                         "vfmadd231ps %%ymm0, %%ymm1, %%ymm9\n\t"
                         "vfmadd231ps %%ymm0, %%ymm1, %%ymm10\n\t"
                         "vfmadd231ps %%ymm0, %%ymm1, %%ymm11\n\t"
                         "vfmadd231ps %%ymm0, %%ymm1, %%ymm12\n\t"
                         "vfmadd231ps %%ymm0, %%ymm1, %%ymm13\n\t"
                         "dec %0\n\t"
                         "jnz 1b\n\t"
                         "vzeroupper"
                         : "+r"(k)
                         :
                         : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",
                           "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "cc");
        double t = fc_now() - t0;
        if (t < best) best = t;
    }
    return (double)n * 12 * 8 * 2 / best;
}

typedef struct {
    const char *what, *op;
    int M, N, K;
} fc_shape;

int main(int argc, char **argv) {
    const fc_simd_ops *ops = &fc_simd_avx2_ops;
    if (argc > 1 && strcmp(argv[1], "avx512") == 0) ops = &fc_simd_avx512_ops;
    printf("AVX2 FMA ceiling: %.1f GFLOP/s\n", fc_peak_avx2() * 1e-9);
    const fc_shape shapes[] = {
        {"fwd S D64", "nn", 192, 128, 64},  {"fwd S D128", "nn", 128, 128, 128},
        {"fwd PV D64", "tn", 128, 64, 192}, {"fwd PV D128", "tn", 128, 128, 128},
        {"bwd S D64", "nt", 64, 128, 64},   {"bwd S D128", "nt", 64, 128, 128},
        {"bwd dK D64", "tn", 128, 64, 64},  {"bwd dK D128", "tn", 128, 128, 64},
        {"bwd dQ D64", "nn", 64, 64, 128},  {"bwd dQ D128", "nn", 64, 128, 128},
        {"dec S 1q", "nn", 128, 1, 128},    {"dec S 8q", "nn", 128, 8, 128},
        {"dec PV 1q", "tn", 1, 128, 128},   {"dec PV 4q", "tn", 4, 128, 128},
        {"dec PV 8q", "tn", 8, 128, 128},   {"odd", "tn", 113, 100, 77},
    };
    float *A = aligned_alloc(64, 256 * 256 * 4), *B = aligned_alloc(64, 256 * 256 * 4),
          *C = aligned_alloc(64, 256 * 256 * 4);
    for (int i = 0; i < 256 * 256; i++) {
        A[i] = (float)(rand() % 100) / 100.0f;
        B[i] = (float)(rand() % 100) / 100.0f;
        C[i] = 0;
    }
    printf("shape,op,M,N,K,GFLOP/s\n");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const fc_shape *h = &shapes[s];
        int M = h->M, N = h->N, K = h->K, lda, ldb;
        void (*f)(int, int, int, const float *, int, const float *, int, float *, int, int);
        if (h->op[0] == 'n' && h->op[1] == 'n') f = ops->gemm_nn, lda = K, ldb = N;
        else if (h->op[0] == 'n') f = ops->gemm_nt, lda = K, ldb = K;
        else f = ops->gemm_tn, lda = M, ldb = N;
        int calls = (int)(4e8 / (2.0 * M * N * K)) + 1; /* ~4 ms a run */
        double t[7];
        for (int r = 0; r < 7; r++) {
            double t0 = fc_now();
            for (int i = 0; i < calls; i++) f(M, N, K, A, lda, B, ldb, C, N, 1);
            t[r] = fc_now() - t0;
        }
        qsort(t, 7, sizeof t[0], fc_cmp);
        printf("%s,%s,%d,%d,%d,%.1f\n", h->what, h->op, M, N, K,
               2.0 * M * N * K * calls / t[3] * 1e-9);
    }
    return 0;
}
