/* test_log.c : the launch log (FLASHC_LOG, src/util.c fc_log_on / fc_log). With
 * FLASHC_LOG=1 each CPU call writes its dispatch line (entry point, backend) and
 * its backend's launch line to stderr, every line prefixed "flashc: "; with the
 * variable unset or "0" a call writes nothing. stderr is captured by pointing
 * file descriptor 2 at a temporary file for the duration of one call
 * (helpers.h th_capture_log).
 *
 * Not here: the CUDA launch lines (tests/gpu/test_gpu_fwd.c: which family ran).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/internal.h"
#include "fc_test.h"
#include "helpers.h"

// ---- a small problem: B=1, S=16, H=2, Hk=1, D=8, bf16, CPU ----
enum { TL_S = 16, TL_NQ = TL_S * 2 * 8, TL_NK = TL_S * 8, TL_NL = 2 * TL_S };

typedef struct {
    uint16_t q[TL_NQ], k[TL_NK], v[TL_NK], out[TL_NQ], dout[TL_NQ], dq[TL_NQ], dk[TL_NK],
        dv[TL_NK];
    float lse[TL_NL];
    int32_t seqlens[1];
    flashc_fwd_args f;
    flashc_bwd_args b;
    flashc_kvcache_args kv;
} tl_prob;

static void tl_make(tl_prob *t) {
    const flashc_dtype BF = FLASHC_DTYPE_BF16;
    const flashc_device CPU = FLASHC_DEVICE_CPU;
    const int64_t qs[4] = {1, TL_S, 2, 8}, ks[4] = {1, TL_S, 1, 8}, ls[3] = {1, 2, TL_S};
    const int64_t q1[4] = {1, 1, 2, 8}, nb[1] = {1};
    memset(t, 0, sizeof *t);
    t->f.abi = t->b.abi = t->kv.abi = FLASHC_ABI_VERSION;
    fc_fill_random(t->q, BF, TL_NQ, -1.0, 1.0);
    fc_fill_random(t->k, BF, TL_NK, -1.0, 1.0);
    fc_fill_random(t->v, BF, TL_NK, -1.0, 1.0);
    fc_fill_random(t->dout, BF, TL_NQ, -1.0, 1.0);
    t->f.q = flashc_tensor_contiguous(t->q, BF, 4, qs, CPU);
    t->f.k = flashc_tensor_contiguous(t->k, BF, 4, ks, CPU);
    t->f.v = flashc_tensor_contiguous(t->v, BF, 4, ks, CPU);
    t->f.out = flashc_tensor_contiguous(t->out, BF, 4, qs, CPU);
    t->f.softmax_lse = flashc_tensor_contiguous(t->lse, FLASHC_DTYPE_FP32, 3, ls, CPU);
    t->b.q = t->f.q, t->b.k = t->f.k, t->b.v = t->f.v, t->b.out = t->f.out;
    t->b.softmax_lse = t->f.softmax_lse;
    t->b.dout = flashc_tensor_contiguous(t->dout, BF, 4, qs, CPU);
    t->b.dq = flashc_tensor_contiguous(t->dq, BF, 4, qs, CPU);
    t->b.dk = flashc_tensor_contiguous(t->dk, BF, 4, ks, CPU);
    t->b.dv = flashc_tensor_contiguous(t->dv, BF, 4, ks, CPU);
    // decode: one query token over the 16 rows of k, v as a full cache
    t->seqlens[0] = TL_S;
    t->kv.q = flashc_tensor_contiguous(t->q, BF, 4, q1, CPU);
    t->kv.out = flashc_tensor_contiguous(t->out, BF, 4, q1, CPU);
    t->kv.k_cache = t->f.k;
    t->kv.v_cache = t->f.v;
    t->kv.cache_seqlens = flashc_tensor_contiguous(t->seqlens, FLASHC_DTYPE_INT32, 1, nb, CPU);
}

// ---- stderr capture ----
typedef enum { TL_FWD, TL_BWD, TL_KVCACHE } tl_entry;

typedef struct {
    tl_prob *t;
    tl_entry e;
    flashc_status st;
} tl_call;

static void tl_call_run(void *ctx) {
    tl_call *c = (tl_call *)ctx;
    flashc_params p = flashc_params_default();
    p.causal = 1;
    c->st = c->e == TL_FWD ? flashc_fwd(&c->t->f, &p, NULL, 0)
            : c->e == TL_BWD ? flashc_bwd(&c->t->b, &p, NULL, 0)
                             : flashc_fwd_kvcache(&c->t->kv, &p, NULL, 0);
}

/* Run entry e of t with FLASHC_LOG set to val (NULL: unset); return what it
 * wrote to stderr (helpers.h th_capture_log). *st gets the call's status. */
static char *tl_capture(tl_prob *t, tl_entry e, const char *val, flashc_status *st) {
    tl_call c = {t, e, FLASHC_ERR_INVALID_ARG};
    char *text = th_capture_log(val, tl_call_run, &c);
    *st = c.st;
    return text;
}

/* Every line of text starts with "flashc: " and ends with a newline. */
static int tl_lines_prefixed(const char *text) {
    for (const char *l = text; *l;) {
        if (strncmp(l, "flashc: ", 8) != 0) return 0;
        const char *nl = strchr(l, '\n');
        if (!nl) return 0;
        l = nl + 1;
    }
    return 1;
}

// ---- cases ----
typedef struct {
    tl_entry entry;
    const char *dispatch; /* the start of the dispatch line */
    const char *launch;   /* the start of the backend's launch line */
} tl_want;

static const tl_want tl_wants[] = {
    {TL_FWD, "flashc: flashc_fwd: backend=cpu dtype=bf16 B=1 H=2 Hk=1 Sq=16 Sk=16 D=8 causal=1",
     "flashc: cpu fwd: simd="},
    {TL_BWD, "flashc: flashc_bwd: backend=cpu dtype=bf16 B=1 H=2 Hk=1 Sq=16 Sk=16 D=8 causal=1",
     "flashc: cpu bwd: simd="},
    {TL_KVCACHE, "flashc: flashc_fwd_kvcache: backend=cpu dtype=bf16 B=1 H=2 Hk=1 Sq=1",
     "flashc: cpu fwd: simd="},
};

static void tl_run_on(const void *param) {
    const tl_want *w = (const tl_want *)param;
    tl_prob *t = (tl_prob *)malloc(sizeof *t);
    FC_ASSERT_TRUE(t != NULL);
    tl_make(t);
    flashc_status st = FLASHC_ERR_INTERNAL;
    char *text = tl_capture(t, w->entry, "1", &st);
    FC_EXPECT_STATUS(st, FLASHC_OK);
    FC_EXPECT_TRUE(text != NULL);
    if (text) {
        FC_EXPECT_TRUE(strncmp(text, w->dispatch, strlen(w->dispatch)) == 0);
        FC_EXPECT_TRUE(strstr(text, w->launch) != NULL);
        FC_EXPECT_TRUE(tl_lines_prefixed(text));
        if (fc_test_failed()) fprintf(stdout, "    captured: %s", text);
    }
    free(text);
    free(t);
}

static void tl_run_off(const void *param) {
    const tl_want *w = (const tl_want *)param;
    tl_prob *t = (tl_prob *)malloc(sizeof *t);
    FC_ASSERT_TRUE(t != NULL);
    tl_make(t);
    static const char *const offs[] = {NULL, "0", ""};
    for (int i = 0; i < 3; i++) {
        flashc_status st = FLASHC_ERR_INTERNAL;
        char *text = tl_capture(t, w->entry, offs[i], &st);
        FC_EXPECT_STATUS(st, FLASHC_OK);
        FC_EXPECT_TRUE(text != NULL && text[0] == '\0');
        free(text);
    }
    free(t);
}

FC_TEST_REGISTER(log) {
    static const char *const names[] = {"fwd", "bwd", "kvcache"};
    char name[64];
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "log_on/%s", names[i]);
        fc_test_add(name, tl_run_on, &tl_wants[i]);
        snprintf(name, sizeof name, "log_off/%s", names[i]);
        fc_test_add(name, tl_run_off, &tl_wants[i]);
    }
}
