/* cli.h : what the files of the flashc program share (see main.c for the
 * program itself).
 *
 *   main.c    the options, their parsing and the dispatch to a subcommand
 *   info.c    `flashc info`
 *   bench.c   `flashc bench`: the problem's tensors and arguments, the timed
 *             runs and the reports
 *   place.c   where the library runs: host memory and the wall clock, or CUDA
 *             memory, a stream and events (the only CUDA code)
 *   check.c   `flashc bench --check`: the outputs against the float64
 *             reference (tests/support/, the flashc_support library)
 *   flops.h   the FLOP count
 *
 * The program uses the library through include/flashc.h alone; flashc_support
 * is the test code it shares with tests/.
 */
#ifndef FLASHC_CLI_H
#define FLASHC_CLI_H

#include <stddef.h>
#include <stdint.h>

#include "flashc.h"
#include "flops.h"

// ---- options (main.c) ----

extern const char *const fc_mode_names[]; /* "fwd", "bwd", "fwdbwd": fc_mode order */

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

// ---- subcommands ----

int fc_cmd_info(void);                /* info.c */
int fc_cmd_bench(const fc_opts *o);   /* bench.c */

/* The backend `--backend auto` benchmarks: CUDA when a device of compute
 * capability >= 8.0 is usable, else the CPU (info.c). */
flashc_backend fc_auto_backend(void);

// ---- the problem's tensors (bench.c) ----

/* The tensors of one problem, contiguous: q-like [B, Sq, H, D], kv-like
 * [B, Sk, Hk, D], lse [B, H, Sq] fp32. Inputs come first (random), then outputs
 * (poisoned); dout and the gradients exist in bwd modes only. */
typedef enum {
    FC_Q, FC_K, FC_V, FC_DOUT,             /* inputs */
    FC_OUT, FC_LSE, FC_DQ, FC_DK, FC_DV,   /* outputs */
    FC_NTENSORS
} fc_tensor_id;
#define FC_FIRST_OUTPUT FC_OUT

flashc_dtype fc_tensor_dtype(const fc_opts *o, int t);
int64_t fc_tensor_numel(const fc_opts *o, int t);

/* One set of the problem's tensors, on the host or on the device, and the
 * workspace of the set the library runs on. */
typedef struct fc_buffers {
    void *data[FC_NTENSORS];  /* NULL where this mode does not use the tensor */
    size_t bytes[FC_NTENSORS];
    void *ws;
    size_t ws_bytes;
} fc_buffers;

/* FLOPs of one call of `mode` on this problem (flops.h). */
double fc_problem_flops(const fc_opts *o, fc_mode mode);

// ---- where the library runs (place.c) ----

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
 * exits 1. */
typedef struct fc_place {
    flashc_backend backend; /* CPU or CUDA, never AUTO */
    flashc_device device;
    int cuda_index;         /* the CUDA device in use */
    void *stream;           /* cudaStream_t on CUDA, NULL on the CPU */
    double t0;              /* the CPU timer's start */
    void *flush;            /* CUDA: device scratch larger than the L2 */
    void *start, *stop;     /* CUDA: the timer's cudaEvent_t */
} fc_place;

/* 0 when the backend cannot run here (the reason printed). */
int fc_place_open(fc_place *pl, flashc_backend want);
void fc_place_close(fc_place *pl);
/* bytes > 0 of zeroed memory aligned to FLASHC_WORKSPACE_ALIGN, or NULL (printed). */
void *fc_place_alloc(const fc_place *pl, size_t bytes);
void fc_place_free(const fc_place *pl, void *p);
void fc_place_upload(const fc_place *pl, const fc_buffers *host, fc_buffers *dev);
/* Free what fc_place_upload and the workspace allocation made. */
void fc_place_release(const fc_place *pl, fc_buffers *dev);
/* Wait for the queued work, then copy the outputs into host's tensors. */
void fc_place_download(const fc_place *pl, const fc_buffers *dev, fc_buffers *host);
void fc_place_timer_start(fc_place *pl);
double fc_place_timer_stop(fc_place *pl);
double fc_place_mem_mib(const fc_place *pl);

// ---- the calls (bench.c) ----

/* The arguments of the library's calls over one set of tensors. */
typedef struct fc_problem {
    flashc_fwd_args fwd;
    flashc_bwd_args bwd;    /* zero in fwd mode */
    flashc_params params;
} fc_problem;

/* The arguments over b's tensors on dev; pl gives the backend and the stream. */
fc_problem fc_problem_make(const fc_opts *o, const fc_buffers *b, const fc_place *pl,
                           flashc_device dev);
/* One timed unit of work: the forward, the backward, or both. 0 on failure
 * (printed). */
int fc_run_once(const fc_opts *o, const fc_problem *p, fc_buffers *b);
/* 0 for FLASHC_OK; else prints "flashc bench: <call>: <status>: <message>" and
 * returns 1. */
int fc_report_status(const char *call, flashc_status s);

// ---- the check (check.c) ----

typedef struct fc_check_result {
    double max_err; /* over every checked tensor */
    int pass;       /* every tensor within its tolerance */
} fc_check_result;

/* Is the reference's work for this problem affordable? Prints why not, or a
 * warning when it is slow. */
int fc_check_affordable(const fc_opts *o);
/* Run flashc once on dev's tensors, bring the outputs to host's, and compare
 * them with the reference. Returns 0 when the check could not run (the message
 * is printed), 1 otherwise (see r->pass). */
int fc_check(const fc_opts *o, const fc_place *pl, const fc_problem *p, fc_buffers *dev,
             fc_buffers *host, fc_check_result *r);

#endif /* FLASHC_CLI_H */
