/* helpers.h : what the numeric tests share (test_fwd.c, test_varlen.c, test_bwd.c,
 * test_kvcache.c, test_dropout.c): strided tensors in buffers of their own, poisoned
 * outputs with a check that nothing outside them was written, workspaces with a
 * canary, the option set of a case and its name, the SIMD path / thread count
 * a case runs under, and the launch log of a call (test_log.c, tests/gpu).
 *
 * Every check records failures through fc_test.h; nothing here aborts a run.
 */
#ifndef FLASHC_TEST_HELPERS_H
#define FLASHC_TEST_HELPERS_H

#include <stddef.h>
#include <stdint.h>

#include "fc_test.h"
#include "flashc.h"

// ---- buffers and views ----

/* One allocation holding one or more views, with a snapshot of its bytes so a
 * check can tell that elements outside an output view were left alone. */
typedef struct th_buf {
    void *data;
    flashc_dtype dt;
    int64_t n;  /* elements */
    void *snap; /* copy of data at the last th_snapshot(), or NULL */
} th_buf;

/* How a tensor sits in its buffer.
 * TH_CONTIG  row-major.
 * TH_PADDED  every stride but the last larger than needed (gaps between heads,
 *            rows and batches) and a nonzero start offset.
 * TH_BHSD    4-d only: memory is [d0, d2, d1, d3] (heads outside tokens), the
 *            view is [d0, d1, d2, d3]. */
typedef enum { TH_CONTIG = 0, TH_PADDED, TH_BHSD } th_layout;

/* What a case allocates, freed in one call at its end (so an early return
 * from a failed expectation leaks nothing). */
typedef struct th_arena {
    th_buf bufs[40];
    int nbufs;
    void *ptrs[96];
    int nptrs;
} th_arena;

/* A fresh zeroed th_buf owned by a. */
th_buf *th_buf_in(th_arena *a);
/* Register malloc'd p with a; returns p. */
void *th_keep(th_arena *a, void *p);
/* n doubles owned by a (uninitialised). */
double *th_dbl(th_arena *a, int64_t n);
void th_arena_free(th_arena *a);

/* A buffer of n elements filled with uniform [lo, hi) (int32: 0). */
void th_buf_new(th_buf *b, flashc_dtype dt, int64_t n, double lo, double hi);
void th_buf_free(th_buf *b);
void th_snapshot(th_buf *b);

/* A view of b at element offset off. */
flashc_tensor th_view(const th_buf *b, int64_t off, int ndim, const int64_t *shape,
                      const int64_t *stride);

/* A new buffer with one tensor in layout lay; the whole buffer (padding
 * included) is uniform [lo, hi). */
flashc_tensor th_new(th_buf *b, flashc_dtype dt, int ndim, const int64_t *shape, th_layout lay,
                     double lo, double hi);
/* An output: th_new, snapshot, then the view poisoned (NaN). */
flashc_tensor th_new_out(th_buf *b, flashc_dtype dt, int ndim, const int64_t *shape,
                         th_layout lay);
/* An int32 tensor [n] (ndim 1) or a scalar (ndim 0) holding vals, in its own buffer. */
flashc_tensor th_new_i32(th_buf *b, int ndim, int64_t n, const int32_t *vals);

int64_t th_numel(const flashc_tensor *t);
/* Element offsets of every element of t, in logical row-major order (malloc'd). */
int64_t *th_offsets(const flashc_tensor *t);
/* Poison the view (NaN) and take a snapshot of the buffer. */
void th_poison(th_buf *b, const flashc_tensor *t);
/* 1 if every element of b outside the views t[0..nt) equals the snapshot
 * bitwise; otherwise records a failure naming what. */
int th_check_outside(const char *what, const th_buf *b, const flashc_tensor *t, int nt);
/* A refused call: status s is `want`, a size query left *bytes at 777 (the
 * caller's sentinel; bytes NULL: not a query) and the last error holds `part`;
 * otherwise records a failure at the caller's line. */
#define TH_EXPECT_REFUSED(s, want, bytes, part) \
    th_expect_refused((s), (want), (bytes), (part), __FILE__, __LINE__)
void th_expect_refused(flashc_status s, flashc_status want, const size_t *bytes, const char *part,
                       const char *file, int line);
/* Refill the view's elements with uniform [lo, hi). */
void th_fill_view(const flashc_tensor *t, double lo, double hi);
/* Store dense src (logical row-major) into the view, rounded to its dtype. */
void th_store_dense(const flashc_tensor *t, const double *src);
/* Dense double copy of a view, logical row-major (malloc'd). */
double *th_to_double(const flashc_tensor *t);
/* Elements of the view whose bits differ from first (an earlier th_to_double of it). */
int64_t th_bits_differ(const flashc_tensor *t, const double *first);
/* fc_check_close of a view against dense references. */
int th_check(const char *what, flashc_dtype dt, const flashc_tensor *got, const double *ref64,
             const double *lowp);

/* Dropout signs: every element where both got and ref are nonzero must have
 * the same sign (a dropped probability is negated). Records a failure. */
int th_check_signs(const char *what, const double *got, const double *ref, int64_t n);
/* Rows that see no key: where lse[(b*H + h)*Sq + i] is -inf (dense [B, H, Sq]),
 * out (dense [B, Sq, H, D]) must be exactly 0. Records a failure. */
int th_check_masked_rows(const double *lse, const double *out, int64_t B, int64_t Sq, int64_t H,
                         int64_t D);

/* One case of the edge-semantics tests (test_edge.c, gpu/test_gpu_edge.c), MHA. */
typedef struct th_edge {
    const char *family; /* GPU: FLASHC_CUDA_FAMILY of the case; CPU: NULL */
    flashc_dtype dt;
    int B, Sq, Sk, H, D;
    int wl, wr;         /* window */
    float dropout;      /* 0 off */
    int alibi;          /* th_alibi_new's kind (GPU: slopes [B, H] when nonzero) */
    int nan_q;          /* q[0, Sq / 2, H - 1, 0] = NaN */
    int scale_zero;     /* scale_given = 1, softmax_scale = 0 */
    int one_key;        /* every row sees one key: dq and dk must be exactly 0 */
} th_edge;

/* The params of an edge case: window, dropout (seed and offset drawn from the
 * case's random numbers), deterministic, the zero scale. */
flashc_params th_edge_params(const th_edge *c);
/* "<prefix><family>_one_key_bf16_d64_40x40/dropout/alibi" */
void th_edge_name(char *buf, size_t n, const char *prefix, const th_edge *c);

/* For a NaN put in q at (batch 0, row Sq / 2, head H - 1): dk, dv (dense [B, Sk, H,
 * D] got, ref64, lowp; MHA) of that head must be NaN at the keys the row sees
 * (window wl, wr; -1 unbounded), else a failure naming what. At its other keys they
 * are implementation-defined (a GEMM with the NaN q row reaches every key of a
 * tile it visits, the reference every key), so the head is zeroed in all three
 * arrays: the tolerance check that follows covers the other heads and batches. */
void th_nan_head(const char *what, double *got, double *ref, double *lowp, int64_t Sq,
                 int64_t Sk, int64_t H, int64_t D, int wl, int wr);

// ---- workspace ----

/* A workspace of `bytes` aligned to FLASHC_WORKSPACE_ALIGN, followed by a
 * canary; NULL for 0 bytes. th_ws_free checks the canary (a failure if the
 * library wrote past `bytes`). */
void *th_ws_new(size_t bytes);
void th_ws_free(void *ws, size_t bytes);

// ---- options of a case ----

typedef struct th_opts {
    int causal;
    int wl, wr;    /* window; -1 unbounded */
    float softcap; /* 0 off */
    int alibi;     /* 0 off, 1 slopes [H], 2 slopes [B, H] */
    float dropout; /* 0 off */
    float scale;   /* 0 = 1/sqrt(D) */
} th_opts;

#define TH_OPTS_NONE {0, -1, -1, 0.0f, 0, 0.0f, 0.0f}

/* Window sizes of the option cycle, so short backward cases can use narrower
 * windows than the forward's: left-only, right-only, both, causal + left, and
 * the right side of the last (softcap + ALiBi) entry. */
typedef struct th_windows {
    int left, right, both_left, both_right, causal_left, last_right;
} th_windows;
#define TH_OPTION_CYCLE 13
/* Entry i % TH_OPTION_CYCLE of the option set every sweep cycles through. */
th_opts th_option_cycle(int i, th_windows w);

/* params for o; the dropout seed and offset are drawn from the case's random
 * numbers (a 64-bit seed with both halves used). */
flashc_params th_params(const th_opts *o);
/* Append o's name ("/causal/wl8/wr3/cap1.5/alibiBH/drop0.17/scale0.3") to buf. */
void th_opts_name(char *buf, size_t n, const th_opts *o);
/* ALiBi slopes for kind 1 ([H]) or 2 ([B, H]) in b; absent tensor for kind 0. */
flashc_tensor th_alibi_new(th_buf *b, int kind, int64_t B, int64_t H);

// ---- SIMD path and threads ----

/* simd: -1 default, else a flashc_simd; threads: 0 default, else a count. */
typedef struct th_env {
    int simd, threads;
    flashc_simd saved;
} th_env;

/* Switch to e's path and thread count. Returns 0 (nothing switched) when this
 * CPU lacks the path: the case then passes without running. */
int th_env_enter(th_env *e);
void th_env_leave(th_env *e);
/* Append "/simd=avx2/threads=1" parts to buf for the fields that are set. */
void th_env_name(char *buf, size_t n, int simd, int threads);

/* Random permutation of 0 .. n-1 in p (from the case's random numbers). */
void th_shuffle(int32_t *p, int64_t n);

// ---- the launch log ----

/* Run fn(ctx) with FLASHC_LOG set to val (NULL: unset) and stderr pointed at a
 * temporary file; return what it wrote (malloc'd, NUL-terminated), or NULL when
 * the capture failed. The variable and the library's cached answer are restored. */
char *th_capture_log(const char *val, void (*fn)(void *), void *ctx);
/* The "Br=.. Bc=.." of the first launch line of text that holds `entry` ("cpu fwd: ",
 * "cpu bwd: ") into buf; 0 when there is none. */
int th_log_tiles(const char *text, const char *entry, char *buf, size_t n);

#endif /* FLASHC_TEST_HELPERS_H */
