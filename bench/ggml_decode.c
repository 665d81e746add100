/* ggml_decode.c : one decode step (one query token over a full KV cache) on the
 * CPU, flashc against ggml's flash-attention op (ggml_flash_attn_ext, what
 * llama.cpp runs for attention on the CPU), on the same K/V memory.
 *
 *   ggml_decode --batch B --heads H --kv-heads Hk --headdim D --seqlen-k N
 *               [--threads T] [--iters N]
 *
 * Built by bench/ggml_decode.sh against a ggml from PyPI's llama-cpp-python
 * sdist. Both read K and V in fp16 (llama.cpp's default cache type) from one
 * buffer in ggml's layout [B][Hk][N][D]; flashc takes it through strides as its
 * [B, N, Hk, D] cache. ggml's query is fp32 (as llama.cpp passes it), flashc's
 * the same values in fp16. The scale is 1/sqrt(D), no mask (every key seen).
 *
 * ggml runs its graph of the one op on a thread pool made once
 * (ggml_threadpool_new, ggml_graph_plan once, ggml_graph_compute per step), as
 * llama.cpp keeps its pool, with polling off (poll = 0: its threads sleep between
 * graphs rather than spin on the cores the other library's next call needs); flashc runs flashc_fwd_kvcache with a workspace
 * allocated once, on flashc_set_num_threads(T) threads. The two alternate in
 * blocks of --iters / 5 calls, each after 10 untimed ones; each figure is the
 * median of --iters calls.
 *
 * Prints one CSV row per backend: backend, batch, heads, kv_heads, headdim,
 * seqlen_k, threads, us (median per call), gbps (bytes of K and V / time), and
 * the largest |flashc - ggml| of the outputs on stderr.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flashc.h"
#include "ggml-cpu.h"
#include "ggml.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *x, int n) {
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* uniform [-1, 1) from a 64-bit LCG (fixed seed: the same inputs every run) */
static float rnd(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

int main(int argc, char **argv) {
    int64_t B = 1, H = 32, Hk = 8, D = 128, N = 4096;
    int threads = 1, iters = 200;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i];
        const long long v = atoll(argv[i + 1]);
        if (!strcmp(k, "--batch")) B = v;
        else if (!strcmp(k, "--heads")) H = v;
        else if (!strcmp(k, "--kv-heads")) Hk = v;
        else if (!strcmp(k, "--headdim")) D = v;
        else if (!strcmp(k, "--seqlen-k")) N = v;
        else if (!strcmp(k, "--threads")) threads = (int)v;
        else if (!strcmp(k, "--iters")) iters = (int)v;
        else {
            fprintf(stderr, "ggml_decode: unknown option %s\n", k);
            return 2;
        }
    }
    if (B < 1 || H < 1 || Hk < 1 || H % Hk || D < 1 || N < 1 || threads < 1 || iters < 1) {
        fprintf(stderr, "ggml_decode: want positive sizes with heads a multiple of kv-heads\n");
        return 2;
    }

    // ---- ggml: the tensors live in its context ----
    const size_t kv_elems = (size_t)(B * Hk * N * D);
    struct ggml_init_params ip = {
        .mem_size = 2 * kv_elems * sizeof(ggml_fp16_t) + (size_t)(B * H * D) * 8 + (16u << 20),
        .mem_buffer = NULL,
        .no_alloc = false,
    };
    struct ggml_context *ctx = ggml_init(ip);
    if (!ctx) {
        fprintf(stderr, "ggml_decode: ggml_init failed\n");
        return 1;
    }
    struct ggml_tensor *q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, D, 1, H, B);
    struct ggml_tensor *k = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, D, N, Hk, B);
    struct ggml_tensor *v = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, D, N, Hk, B);
    const float scale = (float)(1.0 / sqrt((double)D));
    struct ggml_tensor *o = ggml_flash_attn_ext(ctx, q, k, v, NULL, scale, 0.0f, 0.0f);
    struct ggml_cgraph *gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, o);

    uint64_t seed = 1;
    uint16_t *q16 = malloc((size_t)(B * H * D) * 2);
    float *qf = (float *)q->data;
    for (int64_t i = 0; i < B * H * D; i++) {
        const ggml_fp16_t h = ggml_fp32_to_fp16(rnd(&seed));
        qf[i] = ggml_fp16_to_fp32(h);  // both sides see the same values
        memcpy(&q16[i], &h, 2);
    }
    ggml_fp16_t *kd = (ggml_fp16_t *)k->data, *vd = (ggml_fp16_t *)v->data;
    for (size_t i = 0; i < kv_elems; i++) {
        kd[i] = ggml_fp32_to_fp16(rnd(&seed));
        vd[i] = ggml_fp32_to_fp16(rnd(&seed));
    }

    struct ggml_threadpool_params tpp = ggml_threadpool_params_default(threads);
    /* no polling between graphs: a polling pool spins on the cores flashc's threads
     * need for the next (alternating) call */
    tpp.poll = 0;
    struct ggml_threadpool *pool = ggml_threadpool_new(&tpp);
    struct ggml_cplan plan = ggml_graph_plan(gf, threads, pool);
    void *work = plan.work_size ? malloc(plan.work_size) : NULL;
    plan.work_data = work;

    // ---- flashc: the same K/V memory through strides ----
    flashc_set_num_threads(threads);
    float *out = malloc((size_t)(B * H * D) * 4);  // fp16 out below; fp32 copy to compare
    uint16_t *o16 = malloc((size_t)(B * H * D) * 2);
    flashc_kvcache_args kv = FLASHC_ARGS_INIT;
    const int64_t qs[4] = {B, 1, H, D}, ks[4] = {B, N, Hk, D};
    const int64_t kst[4] = {Hk * N * D, D, N * D, 1};
    kv.q = flashc_tensor_contiguous(q16, FLASHC_DTYPE_FP16, 4, qs, FLASHC_DEVICE_CPU);
    kv.out = flashc_tensor_contiguous(o16, FLASHC_DTYPE_FP16, 4, qs, FLASHC_DEVICE_CPU);
    kv.k_cache = flashc_tensor_contiguous(kd, FLASHC_DTYPE_FP16, 4, ks, FLASHC_DEVICE_CPU);
    kv.v_cache = flashc_tensor_contiguous(vd, FLASHC_DTYPE_FP16, 4, ks, FLASHC_DEVICE_CPU);
    memcpy(kv.k_cache.stride, kst, sizeof kst);
    memcpy(kv.v_cache.stride, kst, sizeof kst);
    flashc_params p = flashc_params_default();
    p.softmax_scale = scale;
    size_t ws_bytes = 0;
    if (flashc_fwd_kvcache_workspace_size(&kv, &p, &ws_bytes) != FLASHC_OK) {
        fprintf(stderr, "ggml_decode: flashc: %s\n", flashc_last_error());
        return 1;
    }
    void *ws = NULL;
    if (ws_bytes && posix_memalign(&ws, FLASHC_WORKSPACE_ALIGN, ws_bytes) != 0) {
        fprintf(stderr, "ggml_decode: out of memory\n");
        return 1;
    }

    // ---- the two, in alternating blocks of calls ----
    // Blocks, not single calls: a thread pool that has just worked keeps some threads
    // awake for a while (either library's), and call-by-call alternation hands that
    // cost to the other library. Blocks of iters / 5 calls still alternate often enough
    // that a load that comes and goes hits both.
    double *tf = malloc((size_t)iters * sizeof(double)), *tg = malloc((size_t)iters * sizeof(double));
    const int warm = 10, block = iters >= 5 ? iters / 5 : 1;
    int nf = 0, ng = 0;
    for (int round = 0; nf < iters || ng < iters; round++) {
        for (int side = 0; side < 2; side++) {
            int *n = side ? &ng : &nf;
            double *t = side ? tg : tf;
            for (int it = -warm; it < block && *n < iters; it++) {
                const double t0 = now_s();
                if (!side) {
                    if (flashc_fwd_kvcache(&kv, &p, ws, ws_bytes) != FLASHC_OK) {
                        fprintf(stderr, "ggml_decode: flashc: %s\n", flashc_last_error());
                        return 1;
                    }
                } else if (ggml_graph_compute(gf, &plan) != GGML_STATUS_SUCCESS) {
                    fprintf(stderr, "ggml_decode: ggml_graph_compute failed\n");
                    return 1;
                }
                if (it >= 0) t[(*n)++] = now_s() - t0;
            }
        }
        (void)round;
    }

    // ggml's result [D, H, 1, B] is flashc's out [B, 1, H, D] in memory
    const float *go = (const float *)o->data;
    double diff = 0.0;
    for (int64_t i = 0; i < B * H * D; i++) {
        ggml_fp16_t h;
        memcpy(&h, &o16[i], 2);
        out[i] = ggml_fp16_to_fp32(h);
        const double d = fabs((double)out[i] - (double)go[i]);
        diff = d > diff ? d : diff;
    }
    fprintf(stderr, "ggml_decode: B=%lld H=%lld Hk=%lld D=%lld N=%lld threads=%d: max |flashc - ggml| "
            "= %.3g\n", (long long)B, (long long)H, (long long)Hk, (long long)D, (long long)N,
            threads, diff);
    const double bytes = 2.0 * (double)kv_elems * 2.0;
    const double mf = median(tf, iters), mg = median(tg, iters);
    printf("flashc,%lld,%lld,%lld,%lld,%lld,%d,%.2f,%.2f\n", (long long)B, (long long)H,
           (long long)Hk, (long long)D, (long long)N, threads, mf * 1e6, bytes / mf / 1e9);
    printf("ggml,%lld,%lld,%lld,%lld,%lld,%d,%.2f,%.2f\n", (long long)B, (long long)H,
           (long long)Hk, (long long)D, (long long)N, threads, mg * 1e6, bytes / mg / 1e9);

    free(tf);
    free(tg);
    free(ws);
    free(o16);
    free(out);
    free(q16);
    free(work);
    ggml_threadpool_free(pool);
    ggml_free(ctx);
    return 0;
}
