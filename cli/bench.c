/* flashc.c : the flashc command-line program.
 *
 *   flashc info            what this build and this machine offer: version, CUDA
 *                          compiled or not, backends (and which one `auto` picks),
 *                          CPU features, SIMD paths, threads, CUDA devices
 *   flashc bench [opts]    time one attention problem (forward, backward or both)
 *                          on random inputs: median ms, TFLOP/s, GB/s, workspace
 *                          and peak memory, and with --check the error against the
 *                          float64 reference with PASS/FAIL by DEVELOPERS.md's rule
 *
 * FLOPs follow flash-attention's benchmark convention (one function, fc_flops),
 * so numbers compare with the published ones. The median of --iters timed runs
 * is reported, after --warmup untimed runs. On the CPU a run is timed by the wall
 * clock (CLOCK_MONOTONIC); on CUDA by events on params.stream, with the L2 flushed
 * (untimed) before each run (STYLE.md section 7).
 *
 * The bench logic is one for both backends; what differs (allocation, upload,
 * download, timing, memory use) sits behind the fc_place_* functions. CUDA
 * tensors need a build with FLASHC_CUDA=ON (FLASHC_HAVE_CUDA here); the modes the
 * CUDA backend lacks are refused by the library, whose message is printed. The
 * check always runs the reference on host copies of the tensors.
 *
 * Exit status: 0 success, 1 the library, CUDA or the check failed, 2 bad usage.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#ifdef FLASHC_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "flashc.h"
#include "../src/internal.h"  /* fc_load / fc_store: dtype conversions */
#include "../src/reference.h" /* fc_ref_fwd / fc_ref_bwd: the float64 oracle */

/* The check refuses shapes whose reference work (both modes) exceeds this, and
 * warns above a tenth of it. The reference runs at about 3 GFLOP/s by this count
 * on a 2-core Zen4, so the limit is some 30 s of checking; run.sh's S=2048
 * causal bwd check (6e10) fits. */
#define FC_REF_FLOP_LIMIT 1e11
#define FC_SEED 0x5eed5eedULL

// ---- options ----

typedef enum { FC_MODE_FWD, FC_MODE_BWD, FC_MODE_FWDBWD } fc_mode;
static const char *const fc_mode_names[] = {"fwd", "bwd", "fwdbwd"};

typedef struct fc_opts {
    const char *command;    /* "info" or "bench" */
    int64_t batch;          /* B >= 1 */
    int64_t seqlen_q;       /* Sq >= 1 */
    int64_t seqlen_k;       /* Sk >= 1; 0 until parsed = same as Sq */
    int64_t heads;          /* H >= 1 */
    int64_t kv_heads;       /* Hk >= 1; 0 until parsed = same as H */
    int64_t head_dim;       /* D >= 1 */
    flashc_dtype dtype;
    int causal;             /* 0 or 1 */
    int window;             /* 1 when --window was given */
    int window_left;        /* -1 = unbounded */
    int window_right;       /* -1 = unbounded */
    float softcap;          /* 0 = off */
    float dropout_p;        /* [0, 1) */
    fc_mode mode;
    flashc_backend backend;
    int threads;            /* 0 = the library's default */
    int check, csv, csv_header;
    int iters;              /* timed runs >= 1 */
    int warmup;             /* untimed runs >= 0 */
} fc_opts;

static const char fc_usage_text[] =
    "usage: flashc <command> [options]\n"
    "\n"
    "commands:\n"
    "  info                      version, build, backends, CPU features, SIMD paths,\n"
    "                            threads and CUDA devices\n"
    "  bench [options]           time one attention problem on random inputs\n"
    "\n"
    "bench options [default]:\n"
    "  --batch B                 batch size [1]\n"
    "  --seqlen S                query length [1024]\n"
    "  --seqlen-k SK             key length [S]\n"
    "  --heads H                 query heads [8]\n"
    "  --kv-heads HK             key/value heads, H % HK == 0 (MQA/GQA) [H]\n"
    "  --headdim D               head dimension [128]\n"
    "  --dtype bf16|fp16|fp32    element type of q, k, v, out and gradients [bf16]\n"
    "  --causal                  causal mask, aligned to the bottom-right corner\n"
    "  --window L,R              sliding window (-1 = unbounded on that side)\n"
    "  --softcap X               softcap * tanh(score / softcap), X > 0 [off]\n"
    "  --dropout P               dropout probability in [0, 1) [0]\n"
    "  --mode fwd|bwd|fwdbwd     what is timed [fwd]; bwd runs one untimed forward\n"
    "                            first for out and softmax_lse\n"
    "  --backend auto|cpu|cuda   [auto] auto = cuda when a CUDA device of compute\n"
    "                            capability >= 8.0 is usable, else cpu\n"
    "  --threads N               CPU threads [FLASHC_NUM_THREADS, else all cores]\n"
    "  --iters N                 timed runs; the median is reported [10]\n"
    "  --warmup N                untimed runs before timing [1]\n"
    "  --check                   first compare out and lse (fwd, fwdbwd), dq, dk, dv\n"
    "                            (bwd, fwdbwd) with the float64 reference: max error\n"
    "                            and PASS/FAIL (exit 1 on FAIL)\n"
    "  --csv                     print one CSV row instead of the summary\n"
    "  --csv-header              print the CSV header line first (implies --csv)\n"
    "\n"
    "  -h, --help                this text\n"
    "\n"
    "FLOPs are flash-attention's: 4*B*H*Sq*Sk*D for the forward, halved when causal,\n"
    "counting the visible (i, j) pairs exactly with --window; backward 2.5x, fwdbwd 3.5x.\n"
    "On CUDA the L2 is flushed before each timed run, and runs are timed by CUDA events.\n"
    "Exit status: 0 ok, 1 the library, CUDA or the check failed, 2 bad usage.\n";

static const char fc_csv_header[] =
    "backend,mode,dtype,batch,seqlen_q,seqlen_k,heads,kv_heads,headdim,causal,ms,tflops,gbps,"
    "max_err";

typedef enum { FC_PARSE_OK, FC_PARSE_HELP, FC_PARSE_ERROR } fc_parse_result;

/* Print "flashc: <message>" and the usage line on stderr. */
__attribute__((format(printf, 1, 2))) static fc_parse_result fc_usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "flashc: ");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nusage: flashc info | flashc bench [options]   ('flashc --help' lists them)\n");
    return FC_PARSE_ERROR;
}

/* An integer flag value: the whole string must be a number in [lo, hi]. */
static int fc_parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end = NULL;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end != '\0' || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

static int fc_parse_float(const char *s, double lo, double hi_excl, float *out) {
    char *end = NULL;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || !(v >= lo && v < hi_excl)) return 0;
    *out = (float)v;
    return 1;
}

/* "L,R" with L, R >= -1. */
static int fc_parse_window(const char *s, int *left, int *right) {
    const char *comma = strchr(s, ',');
    char l[32];
    int64_t lv, rv;
    if (!comma || (size_t)(comma - s) >= sizeof l) return 0;
    memcpy(l, s, (size_t)(comma - s));
    l[comma - s] = '\0';
    if (!fc_parse_int(l, -1, INT32_MAX, &lv) || !fc_parse_int(comma + 1, -1, INT32_MAX, &rv))
        return 0;
    *left = (int)lv;
    *right = (int)rv;
    return 1;
}

/* Index of s in names[0..n), or -1. */
static int fc_lookup(const char *s, const char *const *names, int n) {
    for (int i = 0; i < n; i++)
        if (strcmp(s, names[i]) == 0) return i;
    return -1;
}

static fc_parse_result fc_parse(int argc, char **argv, fc_opts *o) {
    static const char *const dtypes[] = {"fp32", "fp16", "bf16"}; /* flashc_dtype order */
    static const char *const backends[] = {"auto", "cpu", "cuda"}; /* flashc_backend order */
    const fc_opts defaults = {.batch = 1, .seqlen_q = 1024, .heads = 8, .head_dim = 128,
                              .dtype = FLASHC_DTYPE_BF16, .window_left = -1, .window_right = -1,
                              .mode = FC_MODE_FWD, .backend = FLASHC_BACKEND_AUTO, .iters = 10,
                              .warmup = 1};
    *o = defaults;
    if (argc < 2) return fc_usage_error("no command given");
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) return FC_PARSE_HELP;
    o->command = argv[1];
    if (strcmp(o->command, "help") == 0) return FC_PARSE_HELP;
    if (strcmp(o->command, "info") != 0 && strcmp(o->command, "bench") != 0)
        return fc_usage_error("unknown command '%s'", o->command);
    if (strcmp(o->command, "info") == 0 && argc > 2)
        return fc_usage_error("info takes no options (got '%s')", argv[2]);

    for (int i = 2; i < argc; i++) {
        /* --name value, or --name=value */
        char name[32];
        const char *arg = argv[i], *eq = strchr(arg, '='), *val = NULL;
        size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
        if (len >= sizeof name) return fc_usage_error("unknown option '%s'", arg);
        memcpy(name, arg, len);
        name[len] = '\0';

        /* flags without a value */
        int *flag = strcmp(name, "--causal") == 0       ? &o->causal
                    : strcmp(name, "--check") == 0      ? &o->check
                    : strcmp(name, "--csv") == 0        ? &o->csv
                    : strcmp(name, "--csv-header") == 0 ? &o->csv_header
                                                        : NULL;
        if (flag) {
            if (eq) return fc_usage_error("option '%s' takes no value", name);
            *flag = 1;
            continue;
        }

        if (eq) val = eq + 1;
        else if (i + 1 < argc) val = argv[++i];
        const char *v = val ? val : "";
        int64_t n = 0;
        int k, ok;
        if (strcmp(name, "--batch") == 0) ok = fc_parse_int(v, 1, INT32_MAX, &o->batch);
        else if (strcmp(name, "--seqlen") == 0) ok = fc_parse_int(v, 1, INT32_MAX, &o->seqlen_q);
        else if (strcmp(name, "--seqlen-k") == 0) ok = fc_parse_int(v, 1, INT32_MAX, &o->seqlen_k);
        else if (strcmp(name, "--heads") == 0) ok = fc_parse_int(v, 1, 65536, &o->heads);
        else if (strcmp(name, "--kv-heads") == 0) ok = fc_parse_int(v, 1, 65536, &o->kv_heads);
        else if (strcmp(name, "--headdim") == 0) ok = fc_parse_int(v, 1, 65536, &o->head_dim);
        else if (strcmp(name, "--softcap") == 0) ok = fc_parse_float(v, 0.0, INFINITY, &o->softcap);
        else if (strcmp(name, "--dropout") == 0) ok = fc_parse_float(v, 0.0, 1.0, &o->dropout_p);
        else if (strcmp(name, "--window") == 0)
            ok = o->window = fc_parse_window(v, &o->window_left, &o->window_right);
        else if (strcmp(name, "--threads") == 0) {
            ok = fc_parse_int(v, 1, 4096, &n);
            o->threads = (int)n;
        } else if (strcmp(name, "--iters") == 0) {
            ok = fc_parse_int(v, 1, 1000000, &n);
            o->iters = (int)n;
        } else if (strcmp(name, "--warmup") == 0) {
            ok = fc_parse_int(v, 0, 1000000, &n);
            o->warmup = (int)n;
        } else if (strcmp(name, "--dtype") == 0) {
            if ((ok = (k = fc_lookup(v, dtypes, 3)) >= 0)) o->dtype = (flashc_dtype)k;
        } else if (strcmp(name, "--mode") == 0) {
            if ((ok = (k = fc_lookup(v, fc_mode_names, 3)) >= 0)) o->mode = (fc_mode)k;
        } else if (strcmp(name, "--backend") == 0) {
            if ((ok = (k = fc_lookup(v, backends, 3)) >= 0)) o->backend = (flashc_backend)k;
        } else {
            return fc_usage_error("unknown option '%s'", name);
        }
        if (!val) return fc_usage_error("option %s needs a value", name);
        if (!ok) return fc_usage_error("option %s: bad value '%s'", name, val);
    }
    if (o->csv_header) o->csv = 1;
    if (o->seqlen_k == 0) o->seqlen_k = o->seqlen_q;
    if (o->kv_heads == 0) o->kv_heads = o->heads;
    return FC_PARSE_OK;
}

// ---- work and traffic of one call ----

/* Query-key pairs the mask lets through. Causal alone counts Sq*Sk/2 (flash-
 * attention's convention, which ignores the diagonal); a window counts each row's
 * visible range exactly, bottom-right aligned, causal meaning right = 0. */
static double fc_visible_pairs(const fc_opts *o) {
    double sq = (double)o->seqlen_q, sk = (double)o->seqlen_k;
    if (!o->window) return o->causal ? sq * sk / 2 : sq * sk;
    int64_t right = o->causal ? 0 : o->window_right;
    double pairs = 0;
    for (int64_t i = 0; i < o->seqlen_q; i++) {
        int64_t diag = i + o->seqlen_k - o->seqlen_q;
        int64_t lo = o->window_left >= 0 ? diag - o->window_left : 0;
        int64_t hi = right >= 0 ? diag + right + 1 : o->seqlen_k;
        if (lo < 0) lo = 0;
        if (hi > o->seqlen_k) hi = o->seqlen_k;
        if (hi > lo) pairs += (double)(hi - lo);
    }
    return pairs;
}

/* FLOPs of one timed call, flash-attention's formula
 * (benchmarks/benchmark_flash_attention.py): the forward's two GEMMs, Q K^T and
 * P V, at 2 FLOPs per multiply-add = 4*B*H*pairs*D; the backward does 2.5x that
 * (five GEMMs), forward + backward 3.5x. Softmax work is not counted. */
static double fc_flops(const fc_opts *o) {
    double fwd = 4.0 * (double)o->batch * (double)o->heads * fc_visible_pairs(o) * (double)o->head_dim;
    static const double factor[] = {1.0, 2.5, 3.5}; /* fc_mode order */
    return fwd * factor[o->mode];
}

/* Bytes of one timed call if every tensor is read or written once: forward q, k,
 * v, out; backward q, k, v, out, dout, dq, dk, dv and softmax_lse (fp32). */
static double fc_bytes(const fc_opts *o) {
    double es = (double)flashc_dtype_size(o->dtype);
    double qlike = (double)o->batch * o->seqlen_q * o->heads * o->head_dim * es;
    double kvlike = (double)o->batch * o->seqlen_k * o->kv_heads * o->head_dim * es;
    double lse = (double)o->batch * o->heads * o->seqlen_q * 4.0;
    double fwd = 2 * qlike + 2 * kvlike;                 /* q, out; k, v */
    double bwd = 4 * qlike + 4 * kvlike + lse;           /* q, out, dout, dq; k, v, dk, dv */
    return o->mode == FC_MODE_FWD ? fwd : o->mode == FC_MODE_BWD ? bwd : fwd + bwd;
}

// ---- info ----

/* The backend `--backend auto` benchmarks: CUDA when a device of compute
 * capability >= 8.0 is usable, else the CPU. */
static flashc_backend fc_auto_backend(void) {
    return flashc_backend_available(FLASHC_BACKEND_CUDA) ? FLASHC_BACKEND_CUDA : FLASHC_BACKEND_CPU;
}

static int fc_cmd_info(void) {
    static const struct { unsigned bit; const char *name; } features[] = {
        {FLASHC_CPU_AVX2, "avx2"},         {FLASHC_CPU_FMA, "fma"},
        {FLASHC_CPU_F16C, "f16c"},         {FLASHC_CPU_AVX512F, "avx512f"},
        {FLASHC_CPU_AVX512BW, "avx512bw"}, {FLASHC_CPU_AVX512DQ, "avx512dq"},
        {FLASHC_CPU_AVX512VL, "avx512vl"}, {FLASHC_CPU_AVX512BF16, "avx512_bf16"},
        {FLASHC_CPU_AVX512FP16, "avx512_fp16"}};

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
    printf("%s\n", any ? "" : " none of avx2, fma, f16c, avx512*");

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
        flashc_cuda_device_info d;
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

// ---- bench: tensors ----

/* The tensors of one problem, contiguous: q-like [B, Sq, H, D], kv-like
 * [B, Sk, Hk, D], lse [B, H, Sq] fp32. Inputs come first (random), then outputs
 * (poisoned); dout and the gradients exist in bwd modes only. */
typedef enum {
    FC_Q, FC_K, FC_V, FC_DOUT,             /* inputs */
    FC_OUT, FC_LSE, FC_DQ, FC_DK, FC_DV,   /* outputs */
    FC_NTENSORS
} fc_tensor_id;
#define FC_FIRST_OUTPUT FC_OUT

static int fc_tensor_used(const fc_opts *o, int t) {
    return o->mode != FC_MODE_FWD || !(t == FC_DOUT || t >= FC_DQ);
}

static flashc_dtype fc_tensor_dtype(const fc_opts *o, int t) {
    return t == FC_LSE ? FLASHC_DTYPE_FP32 : o->dtype;
}

/* The shape of tensor t in shape[0..ndim); returns ndim. */
static int fc_tensor_shape(const fc_opts *o, int t, int64_t shape[4]) {
    if (t == FC_LSE) {
        shape[0] = o->batch, shape[1] = o->heads, shape[2] = o->seqlen_q;
        return 3;
    }
    int kvlike = t == FC_K || t == FC_V || t == FC_DK || t == FC_DV;
    shape[0] = o->batch;
    shape[1] = kvlike ? o->seqlen_k : o->seqlen_q;
    shape[2] = kvlike ? o->kv_heads : o->heads;
    shape[3] = o->head_dim;
    return 4;
}

static int64_t fc_tensor_numel(const fc_opts *o, int t) {
    int64_t shape[4], n = 1;
    for (int d = 0, nd = fc_tensor_shape(o, t, shape); d < nd; d++) n *= shape[d];
    return n;
}

/* One set of the problem's tensors, on the host or on the device, and the
 * workspace of the set the library runs on. */
typedef struct fc_buffers {
    void *data[FC_NTENSORS];  /* NULL where this mode does not use the tensor */
    size_t bytes[FC_NTENSORS];
    void *ws;
    size_t ws_bytes;
} fc_buffers;

static uint64_t fc_rng = FC_SEED;
static double fc_uniform(void) { /* xorshift64*, [-1, 1) */
    fc_rng ^= fc_rng >> 12;
    fc_rng ^= fc_rng << 25;
    fc_rng ^= fc_rng >> 27;
    return (double)((fc_rng * 0x2545F4914F6CDD1DULL) >> 11) * 0x1p-52 - 1.0;
}

/* Host tensors: inputs uniform in [-1, 1), in fc_tensor_id order from one
 * generator; outputs NaN (an element the library leaves unwritten then fails the
 * check). Every element is written, so the pages count in RSS before timing. */
static int fc_host_alloc(const fc_opts *o, fc_buffers *b) {
    memset(b, 0, sizeof *b);
    for (int t = 0; t < FC_NTENSORS; t++) {
        if (!fc_tensor_used(o, t)) continue;
        flashc_dtype dt = fc_tensor_dtype(o, t);
        int64_t n = fc_tensor_numel(o, t);
        b->bytes[t] = (size_t)n * flashc_dtype_size(dt);
        if (!(b->data[t] = malloc(b->bytes[t]))) return 0;
        for (int64_t i = 0; i < n; i++)
            fc_store(dt, b->data[t], i, t < FC_FIRST_OUTPUT ? (float)fc_uniform() : NAN);
    }
    return 1;
}

static void fc_host_free(fc_buffers *b) {
    for (int t = 0; t < FC_NTENSORS; t++) free(b->data[t]);
}

// ---- bench: where the library runs ----

/* fc_place: the backend under test and the few operations that differ between
 * host memory (CPU) and CUDA device memory; the bench logic around them is one.
 *   fc_place_open / close        resolve --backend auto; on CUDA pick the device,
 *                                create the stream (params.stream), events, scratch
 *   fc_place_alloc / free        zeroed memory there (the workspace)
 *   fc_place_upload / release    the library's tensors: on the CPU the host
 *                                tensors themselves; on CUDA device copies, inputs
 *                                uploaded, outputs poisoned with 0xff bytes (NaN
 *                                in fp32, fp16 and bf16)
 *   fc_place_download            outputs back into the host tensors (the check)
 *   fc_place_timer_start / stop  one timed call in ms: wall clock on the CPU; on
 *                                CUDA events on the stream, after an untimed L2
 *                                flush, so every call reads q, k, v from HBM
 *   fc_place_mem_mib             memory in use: peak RSS on the CPU, the device's
 *                                used memory (cudaMemGetInfo) on CUDA
 * A failing CUDA call is a broken device or a bug: the program prints it and
 * exits 1 (FC_CUDA). */

#define FC_L2_FLUSH_BYTES ((size_t)256 << 20) /* above every GPU's L2 (H100/H200: 50 MB) */

typedef struct fc_place {
    flashc_backend backend; /* CPU or CUDA, never AUTO */
    flashc_device device;
    int cuda_index;         /* the CUDA device in use */
    void *stream;           /* cudaStream_t on CUDA, NULL on the CPU */
    double t0;              /* the CPU timer's start */
#ifdef FLASHC_HAVE_CUDA
    void *flush;            /* FC_L2_FLUSH_BYTES of device scratch */
    cudaEvent_t start, stop;
#endif
} fc_place;

static double fc_now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

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
    FC_CUDA(cudaStreamCreate(&s));
    pl->stream = s;
    FC_CUDA(cudaEventCreate(&pl->start));
    FC_CUDA(cudaEventCreate(&pl->stop));
    FC_CUDA(cudaMalloc(&pl->flush, FC_L2_FLUSH_BYTES));
    pl->device = FLASHC_DEVICE_CUDA;
    return 1;
}
#endif

static int fc_place_open(fc_place *pl, flashc_backend want) {
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

static void fc_place_close(fc_place *pl) {
#ifdef FLASHC_HAVE_CUDA
    if (pl->device != FLASHC_DEVICE_CUDA) return;
    FC_CUDA(cudaFree(pl->flush));
    FC_CUDA(cudaEventDestroy(pl->start));
    FC_CUDA(cudaEventDestroy(pl->stop));
    FC_CUDA(cudaStreamDestroy((cudaStream_t)pl->stream));
#else
    (void)pl;
#endif
}

/* bytes > 0 of zeroed memory aligned to FLASHC_WORKSPACE_ALIGN, or NULL (printed). */
static void *fc_place_alloc(const fc_place *pl, size_t bytes) {
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

static void fc_place_free(const fc_place *pl, void *p) {
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

static void fc_place_upload(const fc_place *pl, const fc_buffers *host, fc_buffers *dev) {
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

/* Free what fc_place_upload and the workspace allocation made. */
static void fc_place_release(const fc_place *pl, fc_buffers *dev) {
    fc_place_free(pl, dev->ws);
    if (pl->device == FLASHC_DEVICE_CPU) return; /* the tensors are the host's */
    for (int t = 0; t < FC_NTENSORS; t++) fc_place_free(pl, dev->data[t]);
}

/* Wait for the queued work, then copy the outputs into host's tensors. */
static void fc_place_download(const fc_place *pl, const fc_buffers *dev, fc_buffers *host) {
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

static void fc_place_timer_start(fc_place *pl) {
#ifdef FLASHC_HAVE_CUDA
    if (pl->device == FLASHC_DEVICE_CUDA) {
        cudaStream_t s = (cudaStream_t)pl->stream;
        FC_CUDA(cudaMemsetAsync(pl->flush, 0, FC_L2_FLUSH_BYTES, s)); /* evicts the L2, untimed */
        FC_CUDA(cudaEventRecord(pl->start, s));
        return;
    }
#endif
    pl->t0 = fc_now_ms();
}

static double fc_place_timer_stop(fc_place *pl) {
#ifdef FLASHC_HAVE_CUDA
    if (pl->device == FLASHC_DEVICE_CUDA) {
        float ms = 0;
        FC_CUDA(cudaEventRecord(pl->stop, (cudaStream_t)pl->stream));
        FC_CUDA(cudaEventSynchronize(pl->stop));
        FC_CUDA(cudaEventElapsedTime(&ms, pl->start, pl->stop));
        return ms;
    }
#else
    (void)pl;
#endif
    return fc_now_ms() - pl->t0;
}

static double fc_place_mem_mib(const fc_place *pl) {
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

// ---- bench: the calls ----

typedef struct fc_problem {
    flashc_fwd_args fwd;
    flashc_bwd_args bwd;
    flashc_params params;
} fc_problem;

static flashc_tensor fc_tensor_of(const fc_opts *o, const fc_buffers *b, int t, flashc_device dev) {
    int64_t shape[4];
    int nd = fc_tensor_shape(o, t, shape);
    return flashc_tensor_contiguous(b->data[t], fc_tensor_dtype(o, t), nd, shape, dev);
}

/* The arguments over b's tensors on dev; pl gives the backend and the stream. */
static fc_problem fc_problem_make(const fc_opts *o, const fc_buffers *b, const fc_place *pl,
                                  flashc_device dev) {
    fc_problem p;
    memset(&p, 0, sizeof p);
    p.fwd.q = fc_tensor_of(o, b, FC_Q, dev);
    p.fwd.k = fc_tensor_of(o, b, FC_K, dev);
    p.fwd.v = fc_tensor_of(o, b, FC_V, dev);
    p.fwd.out = fc_tensor_of(o, b, FC_OUT, dev);
    p.fwd.softmax_lse = fc_tensor_of(o, b, FC_LSE, dev);
    if (o->mode != FC_MODE_FWD) {
        p.bwd.dout = fc_tensor_of(o, b, FC_DOUT, dev);
        p.bwd.q = p.fwd.q;
        p.bwd.k = p.fwd.k;
        p.bwd.v = p.fwd.v;
        p.bwd.out = p.fwd.out;
        p.bwd.softmax_lse = p.fwd.softmax_lse;
        p.bwd.dq = fc_tensor_of(o, b, FC_DQ, dev);
        p.bwd.dk = fc_tensor_of(o, b, FC_DK, dev);
        p.bwd.dv = fc_tensor_of(o, b, FC_DV, dev);
    }
    p.params = flashc_params_default();
    p.params.causal = o->causal;
    p.params.window_left = o->window_left;
    p.params.window_right = o->window_right;
    p.params.softcap = o->softcap;
    p.params.dropout_p = o->dropout_p;
    p.params.dropout_seed = FC_SEED;
    p.params.backend = pl->backend;
    p.params.stream = pl->stream;
    return p;
}

static int fc_report_status(const char *call, flashc_status s) {
    if (s == FLASHC_OK) return 0;
    fprintf(stderr, "flashc bench: %s: %s: %s\n", call, flashc_status_string(s), flashc_last_error());
    return 1;
}

/* Validate through the workspace queries and allocate the larger workspace. */
static int fc_workspace_alloc(const fc_opts *o, const fc_place *pl, const fc_problem *p,
                              fc_buffers *b) {
    size_t fwd = 0, bwd = 0;
    if (fc_report_status("flashc_fwd_workspace_size",
                         flashc_fwd_workspace_size(&p->fwd, &p->params, &fwd)))
        return 0;
    if (o->mode != FC_MODE_FWD &&
        fc_report_status("flashc_bwd_workspace_size",
                         flashc_bwd_workspace_size(&p->bwd, &p->params, &bwd)))
        return 0;
    b->ws_bytes = fwd > bwd ? fwd : bwd;
    return b->ws_bytes == 0 || (b->ws = fc_place_alloc(pl, b->ws_bytes)) != NULL;
}

/* One timed unit of work: the forward, the backward, or both. */
static int fc_run_once(const fc_opts *o, const fc_problem *p, fc_buffers *b) {
    if (o->mode != FC_MODE_BWD &&
        fc_report_status("flashc_fwd", flashc_fwd(&p->fwd, &p->params, b->ws, b->ws_bytes)))
        return 0;
    if (o->mode != FC_MODE_FWD &&
        fc_report_status("flashc_bwd", flashc_bwd(&p->bwd, &p->params, b->ws, b->ws_bytes)))
        return 0;
    return 1;
}

static int fc_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

// ---- bench: the check against the float64 reference ----

/* max |got - ref|; NaN where the reference is not gives +inf; equal infinities match. */
static double fc_max_err(const double *got, const double *ref, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        if (got[i] == ref[i]) continue;
        double d = fabs(got[i] - ref[i]);
        if (isnan(d)) return INFINITY;
        if (d > m) m = d;
    }
    return m;
}

static double fc_max_abs(const double *x, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(x[i]) && fabs(x[i]) > m) m = fabs(x[i]);
    return m;
}

/* DEVELOPERS.md's atol: one unit of rounding of the stored output. */
static double fc_atol(flashc_dtype dt) {
    return dt == FLASHC_DTYPE_BF16 ? 0x1p-8 : dt == FLASHC_DTYPE_FP16 ? 0x1p-11 : 1e-5;
}

typedef struct fc_check_result {
    double max_err; /* over every checked tensor */
    int pass;       /* every tensor within its tolerance */
} fc_check_result;

/* Host tensor t by the tolerance rule, with the atol of the input dtype (lse too,
 * as the tests do):
 *   max|got - ref64| <= 2 * max|lowp - ref64| + atol(dtype) * max(1, max|ref64|) */
static void fc_check_tensor(const fc_opts *o, const char *name, const fc_buffers *host, int t,
                            const double *ref, const double *lowp, double *scratch,
                            fc_check_result *r) {
    int64_t n = fc_tensor_numel(o, t);
    for (int64_t i = 0; i < n; i++) scratch[i] = fc_load(fc_tensor_dtype(o, t), host->data[t], i);
    double err = fc_max_err(scratch, ref, n), base = fc_max_err(lowp, ref, n);
    double ref_max = fc_max_abs(ref, n);
    double tol = 2 * base + fc_atol(o->dtype) * (ref_max > 1 ? ref_max : 1);
    int pass = err <= tol;
    fprintf(o->csv ? stderr : stdout, "  check      %-4s max|err| %.3e  (same-precision baseline %.3e, tolerance %.3e)  %s\n",
               name, err, base, tol, pass ? "PASS" : "FAIL");
    if (err > r->max_err) r->max_err = err;
    if (!pass) r->pass = 0;
}

/* The reference's work for this problem (both modes; its backward recomputes
 * the forward): refuse above FC_REF_FLOP_LIMIT, warn above a tenth of it. */
static int fc_check_affordable(const fc_opts *o) {
    static const double ref_factor[] = {1.0, 3.5, 4.5}; /* fc_mode order */
    double ref_flops = 2 * ref_factor[o->mode] * 4.0 * (double)o->batch * o->heads *
                       fc_visible_pairs(o) * o->head_dim;
    if (ref_flops > FC_REF_FLOP_LIMIT) {
        fprintf(stderr,
                "flashc bench: --check: the float64 reference would need %.0f GFLOP (limit %.0f): "
                "use a smaller shape\n",
                ref_flops * 1e-9, FC_REF_FLOP_LIMIT * 1e-9);
        return 0;
    }
    if (ref_flops > FC_REF_FLOP_LIMIT / 10)
        fprintf(stderr, "flashc bench: --check: running the float64 reference (%.1f GFLOP), "
                        "this takes a while\n", ref_flops * 1e-9);
    return 1;
}

/* Run flashc once on dev's tensors, bring the outputs to host's, run the
 * reference in both modes on the host tensors and compare: out and lse in fwd
 * modes, dq, dk, dv in bwd modes. Returns 0 when the check could not run (the
 * message is printed), 1 otherwise (see r->pass). */
static int fc_check(const fc_opts *o, const fc_place *pl, const fc_problem *p, fc_buffers *dev,
                    fc_buffers *host, fc_check_result *r) {
    /* in bwd mode the forward that produced out and lse ran already */
    if (!fc_run_once(o, p, dev)) return 0;
    fc_place_download(pl, dev, host);
    fc_problem hp = fc_problem_make(o, host, pl, FLASHC_DEVICE_CPU);

    int64_t nq = fc_tensor_numel(o, FC_Q), nkv = fc_tensor_numel(o, FC_K);
    int64_t nl = fc_tensor_numel(o, FC_LSE);
    int64_t nfwd = nq + nl, nbwd = nq + 2 * nkv;  /* out, lse; dq, dk, dv */
    int64_t nref = o->mode == FC_MODE_FWD ? nfwd : nfwd > nbwd ? nfwd : nbwd;
    int64_t nmax = nq > nkv ? nq : nkv;
    if (nl > nmax) nmax = nl;
    double *ref = malloc((size_t)nref * sizeof(double));
    double *lowp = malloc((size_t)nref * sizeof(double));
    double *scratch = malloc((size_t)nmax * sizeof(double));
    int ok = ref && lowp && scratch;
    if (!ok) fprintf(stderr, "flashc bench: --check: out of memory for the reference\n");
    r->max_err = 0;
    r->pass = 1;

    if (ok && o->mode != FC_MODE_BWD) {
        ok = !fc_report_status("fc_ref_fwd", fc_ref_fwd(&hp.fwd, &hp.params, FC_REF_F64, ref, ref + nq, NULL)) &&
             !fc_report_status("fc_ref_fwd", fc_ref_fwd(&hp.fwd, &hp.params, FC_REF_LOWP, lowp, lowp + nq, NULL));
        if (ok) {
            fc_check_tensor(o, "out", host, FC_OUT, ref, lowp, scratch, r);
            fc_check_tensor(o, "lse", host, FC_LSE, ref + nq, lowp + nq, scratch, r);
        }
    }
    if (ok && o->mode != FC_MODE_FWD) {
        double *dq = ref, *dk = ref + nq, *dv = dk + nkv;
        double *ldq = lowp, *ldk = lowp + nq, *ldv = ldk + nkv;
        ok = !fc_report_status("fc_ref_bwd", fc_ref_bwd(&hp.bwd, &hp.params, FC_REF_F64, dq, dk, dv)) &&
             !fc_report_status("fc_ref_bwd", fc_ref_bwd(&hp.bwd, &hp.params, FC_REF_LOWP, ldq, ldk, ldv));
        if (ok) {
            fc_check_tensor(o, "dq", host, FC_DQ, dq, ldq, scratch, r);
            fc_check_tensor(o, "dk", host, FC_DK, dk, ldk, scratch, r);
            fc_check_tensor(o, "dv", host, FC_DV, dv, ldv, scratch, r);
        }
    }
    free(ref);
    free(lowp);
    free(scratch);
    return ok;
}

// ---- bench ----

static void fc_print_problem(const fc_opts *o, const fc_place *pl) {
    const char *mask = o->window ? "window" : o->causal ? "causal" : "non-causal";
    printf("flashc bench: %s %s %s  B=%lld Sq=%lld Sk=%lld H=%lld Hk=%lld D=%lld  %s",
           flashc_backend_name(pl->backend), fc_mode_names[o->mode],
           flashc_dtype_name(o->dtype), (long long)o->batch, (long long)o->seqlen_q,
           (long long)o->seqlen_k, (long long)o->heads, (long long)o->kv_heads,
           (long long)o->head_dim, mask);
    if (o->window) printf(" (%d,%d)%s", o->window_left, o->window_right, o->causal ? " causal" : "");
    if (o->softcap > 0) printf("  softcap=%g", o->softcap);
    if (o->dropout_p > 0) printf("  dropout=%g", o->dropout_p);
    printf("\n");
    flashc_cuda_device_info d;
    if (pl->device == FLASHC_DEVICE_CPU)
        printf("  threads    %d, simd %s\n", flashc_get_num_threads(),
               flashc_simd_name(flashc_simd_active()));
    else if (flashc_cuda_device_get_info(pl->cuda_index, &d) == FLASHC_OK)
        printf("  device     cuda:%d %s, compute capability %d.%d, %d SMs; L2 flushed before "
               "each timed call\n", pl->cuda_index, d.name, d.major, d.minor, d.multiprocessors);
}

/* mem0, mem1: fc_place_mem_mib before the workspace and after the timed runs. */
static void fc_print_summary(const fc_opts *o, const fc_place *pl, const fc_buffers *b,
                             const double *ms, double mem0, double mem1) {
    double med = ms[o->iters / 2], flops = fc_flops(o), bytes = fc_bytes(o);
    double gflops = flops / (med * 1e-3) * 1e-9;
    printf("  time       %.3f ms  (median of %d; min %.3f, max %.3f)\n", med, o->iters, ms[0],
           ms[o->iters - 1]);
    printf("  compute    %.4f TFLOP/s = %.1f GFLOP/s  (%.4g GFLOP per call)\n", gflops * 1e-3,
           gflops, flops * 1e-9);
    printf("  memory     %.2f GB/s  (%.1f MB per call if each tensor moves once)\n",
           bytes / (med * 1e-3) * 1e-9, bytes * 1e-6);
    printf("  workspace  %.2f MiB (%zu bytes)\n", (double)b->ws_bytes / (1 << 20), b->ws_bytes);
    if (pl->device == FLASHC_DEVICE_CUDA)
        printf("  device mem %.1f MiB used  (+%.1f MiB during the runs, workspace included; "
               "cudaMemGetInfo)\n", mem1, mem1 - mem0);
    else if (o->check)
        printf("  peak RSS   %.1f MiB  (includes the reference check's arrays)\n", mem1);
    else
        printf("  peak RSS   %.1f MiB  (+%.1f MiB during the runs, workspace included)\n", mem1,
               mem1 - mem0);
}

static void fc_print_csv(const fc_opts *o, const fc_place *pl, const double *ms,
                         const fc_check_result *chk) {
    double med = ms[o->iters / 2];
    if (o->csv_header) printf("%s\n", fc_csv_header);
    printf("%s,%s,%s,%lld,%lld,%lld,%lld,%lld,%lld,%d,%.4f,%.5f,%.3f,",
           flashc_backend_name(pl->backend), fc_mode_names[o->mode],
           flashc_dtype_name(o->dtype), (long long)o->batch, (long long)o->seqlen_q,
           (long long)o->seqlen_k, (long long)o->heads, (long long)o->kv_heads,
           (long long)o->head_dim, o->causal, med, fc_flops(o) / (med * 1e-3) * 1e-12,
           fc_bytes(o) / (med * 1e-3) * 1e-9);
    if (chk) printf("%.3e", chk->max_err);
    printf("\n");
}

static int fc_cmd_bench(const fc_opts *o) {
    if (o->check && !fc_check_affordable(o)) return 1;
    fc_place pl;
    if (!fc_place_open(&pl, o->backend)) return 1;
    if (o->threads) flashc_set_num_threads(o->threads);

    /* host: the inputs, and the outputs for the check; dev: what the library runs on */
    fc_buffers host, dev;
    int rc = 1;
    if (!fc_host_alloc(o, &host)) {
        fprintf(stderr, "flashc bench: out of memory for the inputs\n");
        fc_host_free(&host);
        fc_place_close(&pl);
        return 1;
    }
    fc_place_upload(&pl, &host, &dev);
    fc_problem p = fc_problem_make(o, &dev, &pl, pl.device);
    double *ms = malloc((size_t)o->iters * sizeof(double));
    fc_check_result chk = {0, 1};
    double mem0 = fc_place_mem_mib(&pl);
    if (!ms || !fc_workspace_alloc(o, &pl, &p, &dev)) goto done;

    /* the backward reads the forward's out and softmax_lse: produce them once, untimed */
    if (o->mode == FC_MODE_BWD &&
        fc_report_status("flashc_fwd", flashc_fwd(&p.fwd, &p.params, dev.ws, dev.ws_bytes)))
        goto done;
    if (!o->csv) fc_print_problem(o, &pl);
    if (o->check && !fc_check(o, &pl, &p, &dev, &host, &chk)) goto done;

    for (int i = 0; i < o->warmup; i++)
        if (!fc_run_once(o, &p, &dev)) goto done;
    for (int i = 0; i < o->iters; i++) {
        fc_place_timer_start(&pl);
        if (!fc_run_once(o, &p, &dev)) goto done;
        ms[i] = fc_place_timer_stop(&pl);
    }
    qsort(ms, (size_t)o->iters, sizeof(double), fc_cmp_double);
    double mem1 = fc_place_mem_mib(&pl);

    if (o->csv) fc_print_csv(o, &pl, ms, o->check ? &chk : NULL);
    else fc_print_summary(o, &pl, &dev, ms, mem0, mem1);
    rc = o->check && !chk.pass ? 1 : 0;
done:
    free(ms);
    fc_place_release(&pl, &dev);
    fc_host_free(&host);
    fc_place_close(&pl);
    return rc;
}

// ---- main ----

int main(int argc, char **argv) {
    fc_opts o;
    switch (fc_parse(argc, argv, &o)) {
    case FC_PARSE_HELP: fputs(fc_usage_text, stdout); return 0;
    case FC_PARSE_ERROR: return 2;
    case FC_PARSE_OK: break;
    }
    return strcmp(o.command, "info") == 0 ? fc_cmd_info() : fc_cmd_bench(&o);
}
