/* main.c : the flashc command-line program: its options, their parsing and the
 * dispatch to a subcommand.
 *
 *   flashc info            what this build and this machine offer: version, CUDA
 *                          compiled or not, backends (and which one `auto` picks),
 *                          CPU features, SIMD paths, threads, CUDA devices (info.c)
 *   flashc bench [opts]    time one attention problem (forward, backward or both)
 *                          on random inputs: median ms, TFLOP/s, GB/s, workspace
 *                          and peak memory (bench.c), and with --check the error
 *                          against the float64 reference with PASS/FAIL by
 *                          DEVELOPERS.md's rule (check.c)
 *   flashc --version       "flashc MAJOR.MINOR.PATCH", the library's version
 *
 * cli.h lists the files. The program uses the library through its public header
 * alone; the reference check comes from the flashc_support library (tests/support/).
 *
 * Exit status: 0 success, 1 the library, CUDA or the check failed, 2 bad usage.
 */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

// ---- options ----

const char *const fc_mode_names[] = {"fwd", "bwd", "fwdbwd"};

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
    "  --version                 the library's version\n"
    "\n"
    "FLOPs are flash-attention's: 4*B*H*Sq*Sk*D for the forward, halved when causal,\n"
    "counting the visible (i, j) pairs exactly with --window; backward 2.5x, fwdbwd 3.5x.\n"
    "On CUDA the L2 is flushed before each timed run, and runs are timed by CUDA events.\n"
    "Exit status: 0 ok, 1 the library, CUDA or the check failed, 2 bad usage.\n";

typedef enum { FC_PARSE_OK, FC_PARSE_HELP, FC_PARSE_VERSION, FC_PARSE_ERROR } fc_parse_result;

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
    if (strcmp(argv[1], "--version") == 0) return FC_PARSE_VERSION;
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

// ---- main ----

int main(int argc, char **argv) {
    fc_opts o;
    switch (fc_parse(argc, argv, &o)) {
    case FC_PARSE_HELP: fputs(fc_usage_text, stdout); return 0;
    case FC_PARSE_VERSION: printf("flashc %s\n", flashc_version()); return 0;
    case FC_PARSE_ERROR: return 2;
    case FC_PARSE_OK: break;
    }
    return strcmp(o.command, "info") == 0 ? fc_cmd_info() : fc_cmd_bench(&o);
}
