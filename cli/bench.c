/* bench.c : `flashc bench`, one attention problem (forward, backward or both)
 * timed on random inputs: the median ms of --iters timed runs after --warmup
 * untimed ones, TFLOP/s, GB/s, the workspace and the memory in use, as a summary
 * or one CSV row; with --check the outputs are compared with the float64
 * reference first (check.c).
 *
 * FLOPs follow flash-attention's benchmark convention (flops.h), so numbers
 * compare with the published ones. The bench logic is one for both backends;
 * what differs (allocation, upload, download, timing, memory use) sits behind
 * the fc_place_* functions (place.c).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tests/support/check.h" /* fc_set: a value in any dtype */
#include "cli.h"

#define FC_SEED 0x5eed5eedULL

static const char fc_csv_header[] =
    "backend,mode,dtype,batch,seqlen_q,seqlen_k,heads,kv_heads,headdim,causal,ms,tflops,gbps,"
    "max_err";

// ---- work and traffic of one call ----

double fc_problem_flops(const fc_opts *o, fc_mode mode) {
    double pairs = fc_visible_pairs(o->seqlen_q, o->seqlen_k, o->causal, o->window,
                                    o->window_left, o->window_right);
    return fc_flops(o->batch, o->heads, pairs, o->head_dim, mode);
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

// ---- tensors ----

static int fc_tensor_used(const fc_opts *o, int t) {
    return o->mode != FC_MODE_FWD || !(t == FC_DOUT || t >= FC_DQ);
}

flashc_dtype fc_tensor_dtype(const fc_opts *o, int t) {
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

int64_t fc_tensor_numel(const fc_opts *o, int t) {
    int64_t shape[4], n = 1;
    for (int d = 0, nd = fc_tensor_shape(o, t, shape); d < nd; d++) n *= shape[d];
    return n;
}

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
            fc_set(b->data[t], dt, i, t < FC_FIRST_OUTPUT ? fc_uniform() : NAN);
    }
    return 1;
}

static void fc_host_free(fc_buffers *b) {
    for (int t = 0; t < FC_NTENSORS; t++) free(b->data[t]);
}

// ---- the calls ----

static flashc_tensor fc_tensor_of(const fc_opts *o, const fc_buffers *b, int t, flashc_device dev) {
    int64_t shape[4];
    int nd = fc_tensor_shape(o, t, shape);
    return flashc_tensor_contiguous(b->data[t], fc_tensor_dtype(o, t), nd, shape, dev);
}

/* The arguments of each call kind, one helper each. */
static flashc_fwd_args fc_fwd_args_of(const fc_opts *o, const fc_buffers *b, flashc_device dev) {
    flashc_fwd_args a;
    memset(&a, 0, sizeof a);
    a.abi = FLASHC_ABI_VERSION;
    a.q = fc_tensor_of(o, b, FC_Q, dev);
    a.k = fc_tensor_of(o, b, FC_K, dev);
    a.v = fc_tensor_of(o, b, FC_V, dev);
    a.out = fc_tensor_of(o, b, FC_OUT, dev);
    a.softmax_lse = fc_tensor_of(o, b, FC_LSE, dev);
    return a;
}

static flashc_bwd_args fc_bwd_args_of(const fc_opts *o, const fc_buffers *b, flashc_device dev) {
    flashc_bwd_args a;
    memset(&a, 0, sizeof a);
    a.abi = FLASHC_ABI_VERSION;
    a.dout = fc_tensor_of(o, b, FC_DOUT, dev);
    a.q = fc_tensor_of(o, b, FC_Q, dev);
    a.k = fc_tensor_of(o, b, FC_K, dev);
    a.v = fc_tensor_of(o, b, FC_V, dev);
    a.out = fc_tensor_of(o, b, FC_OUT, dev);
    a.softmax_lse = fc_tensor_of(o, b, FC_LSE, dev);
    a.dq = fc_tensor_of(o, b, FC_DQ, dev);
    a.dk = fc_tensor_of(o, b, FC_DK, dev);
    a.dv = fc_tensor_of(o, b, FC_DV, dev);
    return a;
}

static flashc_params fc_params_of(const fc_opts *o, const fc_place *pl) {
    flashc_params p = flashc_params_default();
    p.causal = o->causal;
    p.windowed = o->window;
    p.window_left = o->window_left;
    p.window_right = o->window_right;
    p.softcap = o->softcap;
    p.dropout_p = o->dropout_p;
    p.dropout_seed = FC_SEED;
    p.backend = pl->backend;
    p.stream = pl->stream;
    return p;
}

fc_problem fc_problem_make(const fc_opts *o, const fc_buffers *b, const fc_place *pl,
                           flashc_device dev) {
    fc_problem p;
    memset(&p, 0, sizeof p);
    p.fwd = fc_fwd_args_of(o, b, dev);
    if (o->mode != FC_MODE_FWD) p.bwd = fc_bwd_args_of(o, b, dev);
    p.params = fc_params_of(o, pl);
    return p;
}

int fc_report_status(const char *call, flashc_status s) {
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

int fc_run_once(const fc_opts *o, const fc_problem *p, fc_buffers *b) {
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

// ---- reports ----

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
    flashc_cuda_device_info d = FLASHC_ARGS_INIT;
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
    double med = ms[o->iters / 2], flops = fc_problem_flops(o, o->mode), bytes = fc_bytes(o);
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
           (long long)o->head_dim, o->causal, med,
           fc_problem_flops(o, o->mode) / (med * 1e-3) * 1e-12, fc_bytes(o) / (med * 1e-3) * 1e-9);
    if (chk) printf("%.3e", chk->max_err);
    printf("\n");
}

// ---- bench ----

int fc_cmd_bench(const fc_opts *o) {
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
