/* blas_baseline.c : unfused attention on OpenBLAS, the CPU baseline flashc is
 * measured against (bench/cpu.sh), and the plain sgemm rate as a FLOP ceiling.
 *
 *   blas_baseline attn --mode fwd|bwd --dtype fp32|bf16 --batch B --seqlen S
 *                 --heads H --headdim D [--causal] [--iters N] [--warmup N]
 *                 [--threads T] [--softmax-threads T] [--check]
 *   blas_baseline sgemm --m M --n N --k K [--iters N] [--warmup N] [--threads T]
 *
 * --threads sets OpenBLAS's thread count (default: OPENBLAS_NUM_THREADS, else
 * all cores). The softmax passes run on --softmax-threads threads [1]: OpenBLAS's
 * idle workers keep spinning for a while after each GEMM, so on a 2-core machine
 * a second softmax thread only fights them (measured slower: bench/NOTES.md).
 *
 * Each prints one CSV row in the columns of `flashc bench --csv` (backend column
 * "openblas-unfused" or "openblas-sgemm"; for sgemm seqlen_q, seqlen_k, headdim
 * hold M, N, K and tflops is 2*M*N*K / time) and details on stderr: OpenBLAS's
 * core name and threads, the time split between GEMMs and softmax, the size of
 * the score matrices and the peak RSS.
 *
 * The algorithm is what a framework without a fused kernel does, per (batch,
 * head), materialising the Sq x Sk matrices that FlashAttention never stores:
 *   forward   S = scale * Q K^T (sgemm), P = softmax_rows(S) (causal: masked
 *             first), O = P V (sgemm)
 *   backward  with P of every head kept from the forward (as autograd keeps it):
 *             dV = P^T dO, dP = dO V^T, dS = P o (dP - rowsum(dO o O)),
 *             dQ = scale * dS K, dK = scale * dS^T Q  (four sgemms)
 * The backward's timed part starts from the kept P; the forward that made it
 * is not timed, as in `flashc bench --mode bwd`.
 *
 * bf16: Debian's OpenBLAS 0.3.21 declares cblas_sbgemm in its header but is
 * built without BUILD_BFLOAT16, so the symbol is missing. bf16 inputs are
 * converted to fp32 per head (inside the timed region), computed in fp32, and
 * the results rounded back to bf16.
 *
 * FLOPs are flash-attention's, counted by cli/flops.h as `flashc bench` counts
 * them: forward 4*B*H*Sq*Sk*D, halved when causal, backward 2.5x. The causal
 * baseline still computes the full Sq x Sk GEMMs, so its rate is an effective
 * one, as flashc's is.
 *
 * Not here: GQA, Sq != Sk, dropout, softcap, windows (the sweep uses none).
 *
 * Build: cc -O3 -march=native -pthread bench/blas_baseline.c -lopenblas -lm
 * (no -ffast-math: the softmax's exp and reductions are written to vectorise
 * without it, and the check's infinities stay meaningful).
 */
#define _POSIX_C_SOURCE 200809L

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "../cli/flops.h"

// ---- options ----

typedef struct bl_opts {
    int sgemm;               /* 1: the sgemm command, else attn */
    int bwd;                 /* attn: 0 forward, 1 backward */
    int bf16;                /* attn: 0 fp32, 1 bf16 */
    int64_t batch, seqlen, heads, head_dim;
    int causal;
    int64_t m, n, k;         /* sgemm shape */
    int iters, warmup;
    int threads;             /* OpenBLAS threads; 0 = OpenBLAS's own choice (OPENBLAS_NUM_THREADS) */
    int softmax_threads;     /* threads of the softmax passes, >= 1 */
    int check;
} bl_opts;

static void bl_usage(void) {
    fprintf(stderr,
            "usage: blas_baseline attn --mode fwd|bwd --dtype fp32|bf16 --batch B --seqlen S\n"
            "                          --heads H --headdim D [--causal] [--iters N] [--warmup N]\n"
            "                          [--threads T] [--softmax-threads T] [--check]\n"
            "       blas_baseline sgemm --m M --n N --k K [--iters N] [--warmup N] [--threads T]\n");
}

static int bl_parse(int argc, char **argv, bl_opts *o) {
    const bl_opts defaults = {.batch = 1, .seqlen = 1024, .heads = 8, .head_dim = 128,
                              .m = 4096, .n = 4096, .k = 128, .iters = 5, .warmup = 1,
                              .softmax_threads = 1};
    *o = defaults;
    if (argc < 2) return 0;
    if (strcmp(argv[1], "sgemm") == 0) o->sgemm = 1;
    else if (strcmp(argv[1], "attn") != 0) return 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--causal") == 0) { o->causal = 1; continue; }
        if (strcmp(a, "--check") == 0) { o->check = 1; continue; }
        if (i + 1 >= argc) return 0;
        const char *v = argv[++i];
        char *end = NULL;
        long long n = strtoll(v, &end, 10);
        int is_num = end != v && *end == '\0' && n >= 0;
        if (strcmp(a, "--mode") == 0 && (!strcmp(v, "fwd") || !strcmp(v, "bwd"))) o->bwd = !strcmp(v, "bwd");
        else if (strcmp(a, "--dtype") == 0 && (!strcmp(v, "fp32") || !strcmp(v, "bf16"))) o->bf16 = !strcmp(v, "bf16");
        else if (!is_num) return 0;
        else if (strcmp(a, "--batch") == 0 && n >= 1) o->batch = n;
        else if (strcmp(a, "--seqlen") == 0 && n >= 1) o->seqlen = n;
        else if (strcmp(a, "--heads") == 0 && n >= 1) o->heads = n;
        else if (strcmp(a, "--headdim") == 0 && n >= 1) o->head_dim = n;
        else if (strcmp(a, "--m") == 0 && n >= 1) o->m = n;
        else if (strcmp(a, "--n") == 0 && n >= 1) o->n = n;
        else if (strcmp(a, "--k") == 0 && n >= 1) o->k = n;
        else if (strcmp(a, "--iters") == 0 && n >= 1) o->iters = (int)n;
        else if (strcmp(a, "--warmup") == 0) o->warmup = (int)n;
        else if (strcmp(a, "--threads") == 0 && n >= 1) o->threads = (int)n;
        else if (strcmp(a, "--softmax-threads") == 0 && n >= 1) o->softmax_threads = (int)n;
        else return 0;
    }
    return 1;
}

// ---- helpers ----

static double bl_now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static int bl_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double bl_peak_rss_mib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0;
}

static float bl_bf16_to_float(uint16_t h) {
    union { uint32_t u; float f; } x = {.u = (uint32_t)h << 16};
    return x.f;
}

static uint16_t bl_float_to_bf16(float f) { /* round to nearest even */
    union { uint32_t u; float f; } x = {.f = f};
    x.u += 0x7fffu + ((x.u >> 16) & 1u);
    return (uint16_t)(x.u >> 16);
}

static uint64_t bl_rng = 0x5eed5eedULL;
static float bl_uniform(void) { /* xorshift64*, [-1, 1) */
    bl_rng ^= bl_rng >> 12;
    bl_rng ^= bl_rng << 25;
    bl_rng ^= bl_rng >> 27;
    return (float)((double)((bl_rng * 0x2545F4914F6CDD1DULL) >> 11) * 0x1p-52 - 1.0);
}

static void *bl_xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "blas_baseline: out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

/* cli/flops.h's count, without a window. */
static double bl_flops(const bl_opts *o) {
    double pairs = fc_visible_pairs(o->seqlen, o->seqlen, o->causal, 0, -1, -1);
    return fc_flops(o->batch, o->heads, pairs, o->head_dim, o->bwd ? FC_MODE_BWD : FC_MODE_FWD);
}

/* Same convention as cli/bench.c fc_bytes(). */
static double bl_bytes(const bl_opts *o) {
    double es = o->bf16 ? 2.0 : 4.0;
    double t = (double)o->batch * o->seqlen * o->heads * o->head_dim * es;
    double lse = (double)o->batch * o->heads * o->seqlen * 4.0;
    return o->bwd ? 8 * t + lse : 4 * t;
}

// ---- row-parallel loops ----
/* The GEMMs run on OpenBLAS's threads; the softmax passes on softmax_threads
 * of our own, split by rows. */

typedef void (*bl_rows_fn)(void *ctx, int64_t r0, int64_t r1);
typedef struct { bl_rows_fn fn; void *ctx; int64_t r0, r1; } bl_rows_job;

static void *bl_rows_thread(void *arg) {
    bl_rows_job *j = arg;
    j->fn(j->ctx, j->r0, j->r1);
    return NULL;
}

static void bl_parallel_rows(int threads, int64_t rows, bl_rows_fn fn, void *ctx) {
    enum { MAX_THREADS = 64 };
    pthread_t tid[MAX_THREADS];
    bl_rows_job jobs[MAX_THREADS];
    int t = threads > MAX_THREADS ? MAX_THREADS : threads;
    if (t > rows) t = (int)rows;
    for (int i = 0; i < t; i++) {
        jobs[i] = (bl_rows_job){fn, ctx, rows * i / t, rows * (i + 1) / t};
        if (i > 0) pthread_create(&tid[i], NULL, bl_rows_thread, &jobs[i]);
    }
    if (t > 0) bl_rows_thread(&jobs[0]);
    for (int i = 1; i < t; i++) pthread_join(tid[i], NULL);
}

// ---- the problem ----

/* Tensors in flash_attn's layout: q, k, v, out, dout, dq, dk, dv [B, S, H, D] in
 * the input dtype (fp32 or bf16 bits); lse [B, H, S] fp32; probs [B, H, S, S]
 * fp32, the P kept for the backward. Per-head fp32 scratch: the S x S score or
 * dP matrix and, for bf16, fp32 copies of the head's operands. */
typedef struct bl_problem {
    const bl_opts *o;
    int64_t S, D, ld;        /* ld = H * D, the row stride of a head's slice */
    void *q, *k, *v, *out, *dout, *dq, *dk, *dv;
    float *lse, *probs;
    float *scores;           /* (S, S) */
    float *h32[8];           /* bf16 only: (S, D) fp32 q, k, v, out, dout, dq, dk, dv of one head */
    double t_gemm, t_rows;   /* ms accumulated over the last call */
} bl_problem;

enum { BL_Q, BL_K, BL_V, BL_OUT, BL_DOUT, BL_DQ, BL_DK, BL_DV };

static void *bl_tensor(bl_problem *p, int which) {
    void *t[] = {p->q, p->k, p->v, p->out, p->dout, p->dq, p->dk, p->dv};
    return t[which];
}

/* fp32 view of tensor `which` for head (b, h): a pointer and its row stride.
 * For bf16 the head is converted into scratch when `load` is set. */
static float *bl_head(bl_problem *p, int which, int64_t b, int64_t h, int load, int64_t *ld) {
    int64_t off = b * p->S * p->ld + h * p->D;
    if (!p->o->bf16) {
        *ld = p->ld;
        return (float *)bl_tensor(p, which) + off;
    }
    const uint16_t *src = (const uint16_t *)bl_tensor(p, which) + off;
    float *dst = p->h32[which];
    if (load)
        for (int64_t i = 0; i < p->S; i++)
            for (int64_t d = 0; d < p->D; d++) dst[i * p->D + d] = bl_bf16_to_float(src[i * p->ld + d]);
    *ld = p->D;
    return dst;
}

/* bf16: round the head's fp32 result back into the tensor. */
static void bl_head_store(bl_problem *p, int which, int64_t b, int64_t h) {
    if (!p->o->bf16) return;
    uint16_t *dst = (uint16_t *)bl_tensor(p, which) + b * p->S * p->ld + h * p->D;
    const float *src = p->h32[which];
    for (int64_t i = 0; i < p->S; i++)
        for (int64_t d = 0; d < p->D; d++) dst[i * p->ld + d] = bl_float_to_bf16(src[i * p->D + d]);
}

static void bl_problem_init(bl_problem *p, const bl_opts *o) {
    memset(p, 0, sizeof *p);
    p->o = o;
    p->S = o->seqlen;
    p->D = o->head_dim;
    p->ld = o->heads * o->head_dim;
    size_t n = (size_t)(o->batch * o->seqlen * p->ld), es = o->bf16 ? 2 : 4;
    void **in[] = {&p->q, &p->k, &p->v, &p->dout};
    void **outs[] = {&p->out, &p->dq, &p->dk, &p->dv};
    for (int t = 0; t < 4; t++) {
        if (t == 3 && !o->bwd) break;
        *in[t] = bl_xmalloc(n * es);
        *outs[t] = bl_xmalloc(n * es);
        memset(*outs[t], 0, n * es);
        for (size_t i = 0; i < n; i++) {
            float x = bl_uniform();
            if (o->bf16) ((uint16_t *)*in[t])[i] = bl_float_to_bf16(x);
            else ((float *)*in[t])[i] = x;
        }
    }
    p->lse = bl_xmalloc((size_t)(o->batch * o->heads * p->S) * sizeof(float));
    p->scores = bl_xmalloc((size_t)(p->S * p->S) * sizeof(float));
    if (o->bwd) p->probs = bl_xmalloc((size_t)(o->batch * o->heads) * (size_t)(p->S * p->S) * sizeof(float));
    if (o->bf16)
        for (int t = 0; t < 8; t++) p->h32[t] = bl_xmalloc((size_t)(p->S * p->D) * sizeof(float));
}

static void bl_problem_free(bl_problem *p) {
    void *all[] = {p->q, p->k, p->v, p->out, p->dout, p->dq, p->dk, p->dv, p->lse, p->probs, p->scores};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
    for (int t = 0; t < 8; t++) free(p->h32[t]);
}

// ---- forward ----

/* exp(x) for the softmax, x <= 0, in plain C that the compiler vectorises
 * (glibc's expf is vectorised only under -ffast-math): x = n ln2 + r with
 * |r| <= ln2/2, e^r by its degree-6 Taylor polynomial (relative error < 3e-7,
 * about 2 ulp), 2^n put into the exponent bits. Below -87, where e^x is about
 * to leave the normal range, the result is flushed to 0. */
static inline float bl_expf(float x) {
    const float log2e = 1.44269504f, ln2_hi = 0.693145752f, ln2_lo = 1.42860677e-6f;
    float xc = x < -87.0f ? -87.0f : x;
    float n = rintf(xc * log2e);
    float r = xc - n * ln2_hi - n * ln2_lo;
    float e = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720))))));
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return x < -87.0f ? 0.0f : e * scale;
}

enum { BL_LANES = 16 }; /* independent partial max / sum accumulators */

/* max and sum over row[0..n) with BL_LANES accumulators, so the loops
 * vectorise without -ffast-math's reassociation. */
static float bl_row_max(const float *row, int64_t n) {
    float acc[BL_LANES], m = -INFINITY;
    for (int l = 0; l < BL_LANES; l++) acc[l] = -INFINITY;
    int64_t j = 0;
    for (; j + BL_LANES <= n; j += BL_LANES)
        for (int l = 0; l < BL_LANES; l++) acc[l] = row[j + l] > acc[l] ? row[j + l] : acc[l];
    for (; j < n; j++) m = row[j] > m ? row[j] : m;
    for (int l = 0; l < BL_LANES; l++) m = acc[l] > m ? acc[l] : m;
    return m;
}

/* row[j] = exp(row[j] - m) for j < n; returns the sum. */
static float bl_row_exp_sum(float *row, int64_t n, float m) {
    float acc[BL_LANES] = {0}, sum = 0;
    int64_t j = 0;
    for (; j + BL_LANES <= n; j += BL_LANES)
        for (int l = 0; l < BL_LANES; l++) {
            row[j + l] = bl_expf(row[j + l] - m);
            acc[l] += row[j + l];
        }
    for (; j < n; j++) {
        row[j] = bl_expf(row[j] - m);
        sum += row[j];
    }
    for (int l = 0; l < BL_LANES; l++) sum += acc[l];
    return sum;
}

typedef struct { float *s; float *lse; int64_t S; int causal; } bl_softmax_ctx;

/* Rows r0..r1 of S (S x S) in place: P = exp(S - rowmax) / rowsum, masked
 * entries (causal: j > i) set to 0; lse = rowmax + log(rowsum). */
static void bl_softmax_rows(void *vctx, int64_t r0, int64_t r1) {
    bl_softmax_ctx *c = vctx;
    for (int64_t i = r0; i < r1; i++) {
        float *row = c->s + i * c->S;
        int64_t n = c->causal ? i + 1 : c->S;
        float m = bl_row_max(row, n);
        float sum = bl_row_exp_sum(row, n, m);
        float inv = 1.0f / sum;
        for (int64_t j = 0; j < n; j++) row[j] *= inv;
        for (int64_t j = n; j < c->S; j++) row[j] = 0;
        c->lse[i] = m + logf(sum);
    }
}

static void bl_forward(bl_problem *p) {
    const bl_opts *o = p->o;
    int64_t S = p->S, D = p->D, ldq, ldk, ldv, ldo;
    float scale = 1.0f / sqrtf((float)D);
    p->t_gemm = p->t_rows = 0;
    for (int64_t b = 0; b < o->batch; b++)
        for (int64_t h = 0; h < o->heads; h++) {
            double t0 = bl_now_ms();
            float *Q = bl_head(p, BL_Q, b, h, 1, &ldq);
            float *K = bl_head(p, BL_K, b, h, 1, &ldk);
            float *V = bl_head(p, BL_V, b, h, 1, &ldv);
            float *O = bl_head(p, BL_OUT, b, h, 0, &ldo);
            float *P = o->bwd ? p->probs + (b * o->heads + h) * S * S : p->scores;
            /* S = scale * Q K^T: (S, D) x (D, S) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)S, (int)S, (int)D, scale, Q,
                        (int)ldq, K, (int)ldk, 0.0f, P, (int)S);
            double t1 = bl_now_ms();
            bl_softmax_ctx c = {P, p->lse + (b * o->heads + h) * S, S, o->causal};
            bl_parallel_rows(o->softmax_threads, S, bl_softmax_rows, &c);
            double t2 = bl_now_ms();
            /* O = P V: (S, S) x (S, D) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)S, (int)D, (int)S, 1.0f, P,
                        (int)S, V, (int)ldv, 0.0f, O, (int)ldo);
            bl_head_store(p, BL_OUT, b, h);
            double t3 = bl_now_ms();
            p->t_gemm += (t1 - t0) + (t3 - t2);
            p->t_rows += t2 - t1;
        }
}

// ---- backward ----

typedef struct {
    const float *P, *dO, *O;
    float *dS;
    int64_t S, D, ld_do, ld_o;
} bl_dsoftmax_ctx;

/* Rows r0..r1: dS = P o (dP - Di), Di = sum_d dO[i,d] O[i,d]; dS holds dP on entry. */
static void bl_dsoftmax_rows(void *vctx, int64_t r0, int64_t r1) {
    bl_dsoftmax_ctx *c = vctx;
    for (int64_t i = r0; i < r1; i++) {
        float di = 0; /* D terms: short, left scalar */
        for (int64_t d = 0; d < c->D; d++) di += c->dO[i * c->ld_do + d] * c->O[i * c->ld_o + d];
        const float *prow = c->P + i * c->S;
        float *row = c->dS + i * c->S;
        for (int64_t j = 0; j < c->S; j++) row[j] = prow[j] * (row[j] - di);
    }
}

static void bl_backward(bl_problem *p) {
    const bl_opts *o = p->o;
    int64_t S = p->S, D = p->D, ldq, ldk, ldv, ldo, lddo, lddq, lddk, lddv;
    float scale = 1.0f / sqrtf((float)D);
    p->t_gemm = p->t_rows = 0;
    for (int64_t b = 0; b < o->batch; b++)
        for (int64_t h = 0; h < o->heads; h++) {
            double t0 = bl_now_ms();
            const float *P = p->probs + (b * o->heads + h) * S * S;
            float *Q = bl_head(p, BL_Q, b, h, 1, &ldq);
            float *K = bl_head(p, BL_K, b, h, 1, &ldk);
            float *V = bl_head(p, BL_V, b, h, 1, &ldv);
            float *O = bl_head(p, BL_OUT, b, h, 1, &ldo);
            float *dO = bl_head(p, BL_DOUT, b, h, 1, &lddo);
            float *dQ = bl_head(p, BL_DQ, b, h, 0, &lddq);
            float *dK = bl_head(p, BL_DK, b, h, 0, &lddk);
            float *dV = bl_head(p, BL_DV, b, h, 0, &lddv);
            float *dS = p->scores;
            /* dV = P^T dO: (S, S)^T x (S, D) */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)S, (int)D, (int)S, 1.0f, P,
                        (int)S, dO, (int)lddo, 0.0f, dV, (int)lddv);
            /* dP = dO V^T: (S, D) x (D, S) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)S, (int)S, (int)D, 1.0f, dO,
                        (int)lddo, V, (int)ldv, 0.0f, dS, (int)S);
            double t1 = bl_now_ms();
            bl_dsoftmax_ctx c = {P, dO, O, dS, S, D, lddo, ldo};
            bl_parallel_rows(o->softmax_threads, S, bl_dsoftmax_rows, &c);
            double t2 = bl_now_ms();
            /* dQ = scale * dS K: (S, S) x (S, D) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)S, (int)D, (int)S, scale,
                        dS, (int)S, K, (int)ldk, 0.0f, dQ, (int)lddq);
            /* dK = scale * dS^T Q: (S, S)^T x (S, D) */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)S, (int)D, (int)S, scale, dS,
                        (int)S, Q, (int)ldq, 0.0f, dK, (int)lddk);
            bl_head_store(p, BL_DQ, b, h);
            bl_head_store(p, BL_DK, b, h);
            bl_head_store(p, BL_DV, b, h);
            double t3 = bl_now_ms();
            p->t_gemm += (t1 - t0) + (t3 - t2);
            p->t_rows += t2 - t1;
        }
}

// ---- check against a naive float64 computation ----

static double bl_get(const bl_problem *p, const void *t, int64_t i) {
    return p->o->bf16 ? bl_bf16_to_float(((const uint16_t *)t)[i]) : ((const float *)t)[i];
}

/* max |x - ref| / max(1, max |ref|) over head (b, h) of a [B, S, H, D] tensor. */
static double bl_err(const bl_problem *p, const void *t, const double *ref, int64_t b, int64_t h) {
    double e = 0, m = 1;
    for (int64_t i = 0; i < p->S; i++)
        for (int64_t d = 0; d < p->D; d++) {
            double r = ref[i * p->D + d];
            double x = bl_get(p, t, b * p->S * p->ld + i * p->ld + h * p->D + d);
            e = fabs(x - r) > e ? fabs(x - r) : e;
            m = fabs(r) > m ? fabs(r) : m;
        }
    return e / m;
}

/* Relative max error of out (fwd) or dq, dk, dv (bwd) against float64 math on
 * the same (already rounded) inputs. O(S^2 D) per head: small shapes only. */
static double bl_check(const bl_problem *p) {
    const bl_opts *o = p->o;
    int64_t S = p->S, D = p->D;
    double scale = 1.0 / sqrt((double)D), worst = 0;
    double *P = bl_xmalloc((size_t)(S * S) * sizeof(double));
    double *dP = bl_xmalloc((size_t)(S * S) * sizeof(double));
    double *r[4];
    for (int t = 0; t < 4; t++) r[t] = bl_xmalloc((size_t)(S * D) * sizeof(double));
    for (int64_t b = 0; b < o->batch; b++)
        for (int64_t h = 0; h < o->heads; h++) {
            int64_t base = b * S * p->ld + h * D;
#define BL_AT(t, i, d) bl_get(p, (t), base + (i) * p->ld + (d))
            for (int64_t i = 0; i < S; i++) {
                double m = -INFINITY, sum = 0;
                for (int64_t j = 0; j < S; j++) {
                    double s = 0;
                    for (int64_t d = 0; d < D; d++) s += BL_AT(p->q, i, d) * BL_AT(p->k, j, d);
                    P[i * S + j] = (o->causal && j > i) ? -INFINITY : s * scale;
                    m = P[i * S + j] > m ? P[i * S + j] : m;
                }
                for (int64_t j = 0; j < S; j++) sum += (P[i * S + j] = exp(P[i * S + j] - m));
                for (int64_t j = 0; j < S; j++) P[i * S + j] /= sum;
            }
            /* out = P V */
            for (int64_t i = 0; i < S; i++)
                for (int64_t d = 0; d < D; d++) {
                    double acc = 0;
                    for (int64_t j = 0; j < S; j++) acc += P[i * S + j] * BL_AT(p->v, j, d);
                    r[0][i * D + d] = acc;
                }
            if (!o->bwd) {
                double e = bl_err(p, p->out, r[0], b, h);
                worst = e > worst ? e : worst;
                continue;
            }
            /* dP = dO V^T; dS = P o (dP - rowsum(dO o O)), O from the baseline's forward */
            for (int64_t i = 0; i < S; i++) {
                double di = 0;
                for (int64_t d = 0; d < D; d++) di += BL_AT(p->dout, i, d) * BL_AT(p->out, i, d);
                for (int64_t j = 0; j < S; j++) {
                    double s = 0;
                    for (int64_t d = 0; d < D; d++) s += BL_AT(p->dout, i, d) * BL_AT(p->v, j, d);
                    dP[i * S + j] = P[i * S + j] * (s - di);
                }
            }
            /* dq = scale dS K, dk = scale dS^T Q, dv = P^T dO */
            for (int64_t i = 0; i < S; i++)
                for (int64_t d = 0; d < D; d++) {
                    double aq = 0, ak = 0, av = 0;
                    for (int64_t j = 0; j < S; j++) {
                        aq += dP[i * S + j] * BL_AT(p->k, j, d);
                        ak += dP[j * S + i] * BL_AT(p->q, j, d);
                        av += P[j * S + i] * BL_AT(p->dout, j, d);
                    }
                    r[1][i * D + d] = aq * scale;
                    r[2][i * D + d] = ak * scale;
                    r[3][i * D + d] = av;
                }
#undef BL_AT
            const void *got[3] = {p->dq, p->dk, p->dv};
            for (int t = 0; t < 3; t++) {
                double e = bl_err(p, got[t], r[t + 1], b, h);
                worst = e > worst ? e : worst;
            }
        }
    free(P);
    free(dP);
    for (int t = 0; t < 4; t++) free(r[t]);
    return worst;
}

// ---- commands ----

static void bl_describe_blas(const bl_opts *o) {
    fprintf(stderr, "blas_baseline: OpenBLAS core %s, %d OpenBLAS threads, %d softmax threads\n",
            openblas_get_corename(), openblas_get_num_threads(), o->softmax_threads);
}

static double bl_median(double *ms, int n) {
    qsort(ms, (size_t)n, sizeof(double), bl_cmp_double);
    return ms[n / 2];
}

static int bl_cmd_attn(const bl_opts *o) {
    bl_problem p;
    bl_problem_init(&p, o);
    double *ms = bl_xmalloc((size_t)o->iters * sizeof(double));
    double gemm = 0, rows = 0;
    if (o->bwd) bl_forward(&p); /* P, out and lse for the backward, untimed */
    for (int i = 0; i < o->warmup + o->iters; i++) {
        double t0 = bl_now_ms();
        if (o->bwd) bl_backward(&p);
        else bl_forward(&p);
        double t = bl_now_ms() - t0;
        if (i >= o->warmup) {
            ms[i - o->warmup] = t;
            gemm += p.t_gemm / o->iters;
            rows += p.t_rows / o->iters;
        }
    }
    double med = bl_median(ms, o->iters);
    double err = o->check ? bl_check(&p) : -1;

    bl_describe_blas(o);
    double mat_mib = (double)(p.S * p.S) * 4 / (1 << 20);
    fprintf(stderr,
            "blas_baseline: attn %s %s B=%lld S=%lld H=%lld D=%lld %s: median %.3f ms "
            "(mean split: gemm %.3f ms, %s %.3f ms)\n",
            o->bwd ? "bwd" : "fwd", o->bf16 ? "bf16" : "fp32", (long long)o->batch,
            (long long)o->seqlen, (long long)o->heads, (long long)o->head_dim,
            o->causal ? "causal" : "non-causal", med, gemm, o->bwd ? "softmax-bwd" : "softmax", rows);
    fprintf(stderr,
            "blas_baseline: S x S matrix %.1f MiB per head%s; peak RSS %.1f MiB\n", mat_mib,
            o->bwd ? ", plus P of every head kept from the forward" : "", bl_peak_rss_mib());
    if (o->check)
        fprintf(stderr, "blas_baseline: check against float64: max relative error %.3e\n", err);

    printf("openblas-unfused,%s,%s,%lld,%lld,%lld,%lld,%lld,%lld,%d,%.4f,%.5f,%.3f,", o->bwd ? "bwd" : "fwd",
           o->bf16 ? "bf16" : "fp32", (long long)o->batch, (long long)o->seqlen,
           (long long)o->seqlen, (long long)o->heads, (long long)o->heads, (long long)o->head_dim,
           o->causal, med, bl_flops(o) / (med * 1e-3) * 1e-12, bl_bytes(o) / (med * 1e-3) * 1e-9);
    if (o->check) printf("%.3e", err);
    printf("\n");
    free(ms);
    bl_problem_free(&p);
    /* a baseline that is fast and wrong is no baseline: fail loudly */
    return o->check && err > (o->bf16 ? 2e-2 : 1e-4) ? 1 : 0;
}

static int bl_cmd_sgemm(const bl_opts *o) {
    size_t m = (size_t)o->m, n = (size_t)o->n, k = (size_t)o->k;
    float *A = bl_xmalloc(m * k * sizeof(float)), *B = bl_xmalloc(k * n * sizeof(float));
    float *C = bl_xmalloc(m * n * sizeof(float));
    for (size_t i = 0; i < m * k; i++) A[i] = bl_uniform();
    for (size_t i = 0; i < k * n; i++) B[i] = bl_uniform();
    memset(C, 0, m * n * sizeof(float));
    double *ms = bl_xmalloc((size_t)o->iters * sizeof(double));
    for (int i = 0; i < o->warmup + o->iters; i++) {
        double t0 = bl_now_ms();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)n, (int)k, 1.0f, A,
                    (int)k, B, (int)n, 0.0f, C, (int)n);
        if (i >= o->warmup) ms[i - o->warmup] = bl_now_ms() - t0;
    }
    double med = bl_median(ms, o->iters), flops = 2.0 * m * n * k;
    bl_describe_blas(o);
    fprintf(stderr, "blas_baseline: sgemm %zux%zux%zu: median %.3f ms, %.1f GFLOP/s; peak RSS %.1f MiB\n",
            m, n, k, med, flops / (med * 1e-3) * 1e-9, bl_peak_rss_mib());
    printf("openblas-sgemm,gemm,fp32,1,%zu,%zu,1,1,%zu,0,%.4f,%.5f,%.3f,\n", m, n, k, med,
           flops / (med * 1e-3) * 1e-12, 4.0 * (m * k + k * n + m * n) / (med * 1e-3) * 1e-9);
    free(A);
    free(B);
    free(C);
    free(ms);
    return 0;
}

int main(int argc, char **argv) {
    bl_opts o;
    if (!bl_parse(argc, argv, &o)) {
        bl_usage();
        return 2;
    }
    if (o.threads) openblas_set_num_threads(o.threads);
    return o.sgemm ? bl_cmd_sgemm(&o) : bl_cmd_attn(&o);
}
