/* test_api.c : the parts of include/flashc.h that are not attention: version,
 * statuses and the thread-local last error, dtypes, tensor and params helpers,
 * SIMD path and thread-count settings, backend and CUDA device queries, the
 * convenience workspace path and the caller-set allocator, and the Philox4x32-10
 * generator behind dropout (src/common/philox.h) against the known-answer
 * vectors of the Random123 distribution (Salmon et al., SC'11).
 *
 * Not here: argument validation (test_bad_input.c) and numerics (the sweeps).
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../src/common/philox.h"
#include "../src/internal.h"
#include "fc_test.h"

// ---- a small problem: B=2, S, H=4, Hk=2, D=8, bf16, CPU ----

typedef struct {
    void *q, *k, *v, *out, *lse, *dout, *dq, *dk, *dv;
    flashc_fwd_args f;
    flashc_bwd_args b;
    flashc_params p;
} ta_prob;

static void *ta_buf(flashc_dtype dt, int64_t n, int out) {
    void *p = malloc((size_t)n * flashc_dtype_size(dt));
    if (out) fc_poison(p, dt, n);
    else fc_fill_random(p, dt, n, -1.0, 1.0);
    return p;
}

static void ta_make(ta_prob *t, int64_t s) {
    const flashc_dtype BF = FLASHC_DTYPE_BF16, F32 = FLASHC_DTYPE_FP32;
    const flashc_device CPU = FLASHC_DEVICE_CPU;
    int64_t qs[4] = {2, s, 4, 8}, ks[4] = {2, s, 2, 8}, ls[3] = {2, 4, s};
    int64_t nq = 2 * s * 4 * 8, nk = 2 * s * 2 * 8, nl = 2 * 4 * s;
    memset(t, 0, sizeof *t);
    t->f.abi = t->b.abi = FLASHC_ABI_VERSION;
    t->q = ta_buf(BF, nq, 0);
    t->k = ta_buf(BF, nk, 0);
    t->v = ta_buf(BF, nk, 0);
    t->out = ta_buf(BF, nq, 1);
    t->lse = ta_buf(F32, nl, 1);
    t->dout = ta_buf(BF, nq, 0);
    t->dq = ta_buf(BF, nq, 1);
    t->dk = ta_buf(BF, nk, 1);
    t->dv = ta_buf(BF, nk, 1);
    // q, out, dout, dq: (2, S, 4, 8)  k, v, dk, dv: (2, S, 2, 8)  lse: (2, 4, S)
    t->f.q = flashc_tensor_contiguous(t->q, BF, 4, qs, CPU);
    t->f.k = flashc_tensor_contiguous(t->k, BF, 4, ks, CPU);
    t->f.v = flashc_tensor_contiguous(t->v, BF, 4, ks, CPU);
    t->f.out = flashc_tensor_contiguous(t->out, BF, 4, qs, CPU);
    t->f.softmax_lse = flashc_tensor_contiguous(t->lse, F32, 3, ls, CPU);
    t->b.q = t->f.q;
    t->b.k = t->f.k;
    t->b.v = t->f.v;
    t->b.out = t->f.out;
    t->b.softmax_lse = t->f.softmax_lse;
    t->b.dout = flashc_tensor_contiguous(t->dout, BF, 4, qs, CPU);
    t->b.dq = flashc_tensor_contiguous(t->dq, BF, 4, qs, CPU);
    t->b.dk = flashc_tensor_contiguous(t->dk, BF, 4, ks, CPU);
    t->b.dv = flashc_tensor_contiguous(t->dv, BF, 4, ks, CPU);
    t->p = flashc_params_default();
}

static void ta_free(ta_prob *t) {
    void *all[] = {t->q, t->k, t->v, t->out, t->lse, t->dout, t->dq, t->dk, t->dv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
}

// ---- version and statuses ----

FC_TEST(api_version) {
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", FLASHC_VERSION_MAJOR, FLASHC_VERSION_MINOR,
             FLASHC_VERSION_PATCH);
    FC_EXPECT_TRUE(flashc_version() != NULL);
    if (flashc_version() && strcmp(flashc_version(), want) != 0)
        fc_test_fail(__FILE__, __LINE__, "flashc_version()=\"%s\" but the header says \"%s\"",
                     flashc_version(), want);
    FC_EXPECT_EQ(flashc_version_number(), FLASHC_VERSION_NUMBER);
    FC_EXPECT_EQ(FLASHC_VERSION_NUMBER,
                 FLASHC_VERSION_MAJOR * 10000 + FLASHC_VERSION_MINOR * 100 + FLASHC_VERSION_PATCH);
}

FC_TEST(api_status_strings) {
    static const struct {
        flashc_status s;
        int value;
        const char *text;
    } list[] = {
#define TA_STATUS_ROW_(name, value, text) {name, value, text},
        FLASHC_STATUS_LIST(TA_STATUS_ROW_)
#undef TA_STATUS_ROW_
    };
    const int n = (int)(sizeof list / sizeof *list);
    FC_EXPECT_EQ(n, FLASHC_STATUS_COUNT);
    /* the pinned values (STYLE.md §1) */
    FC_EXPECT_EQ(FLASHC_OK, 0);
    FC_EXPECT_EQ(FLASHC_ERR_INVALID_ARG, 1);
    FC_EXPECT_EQ(FLASHC_ERR_UNSUPPORTED, 2);
    FC_EXPECT_EQ(FLASHC_ERR_WORKSPACE_TOO_SMALL, 3);
    FC_EXPECT_EQ(FLASHC_ERR_OUT_OF_MEMORY, 4);
    FC_EXPECT_EQ(FLASHC_ERR_CUDA, 5);
    FC_EXPECT_EQ(FLASHC_ERR_INTERNAL, 6);
    for (int i = 0; i < n; i++) {
        FC_EXPECT_EQ(list[i].s, list[i].value);
        const char *si = flashc_status_string(list[i].s);
        if (!si || !*si) {
            fc_test_fail(__FILE__, __LINE__, "flashc_status_string(%d) is empty", list[i].value);
            continue;
        }
        if (strcmp(si, list[i].text) != 0)
            fc_test_fail(__FILE__, __LINE__, "flashc_status_string(%d)=\"%s\" but the header says \"%s\"",
                         list[i].value, si, list[i].text);
        for (int j = 0; j < i; j++) {
            const char *sj = flashc_status_string(list[j].s);
            if (sj && strcmp(si, sj) == 0)
                fc_test_fail(__FILE__, __LINE__, "statuses %d and %d share the string \"%s\"",
                             list[j].value, list[i].value, si);
        }
    }
    /* out of range: still static text, never NULL */
    FC_EXPECT_TRUE(flashc_status_string(FLASHC_STATUS_COUNT) != NULL);
    FC_EXPECT_TRUE(flashc_status_string((flashc_status)-1) != NULL);
}

FC_TEST(api_last_error_cleared_by_success) {
    ta_prob t;
    ta_make(&t, 5);
    size_t bytes = 0;
    FC_EXPECT_STATUS(flashc_fwd(NULL, &t.p, NULL, 0), FLASHC_ERR_INVALID_ARG);
    FC_EXPECT_TRUE(flashc_last_error()[0] != '\0');
    FC_EXPECT_STATUS(flashc_fwd_workspace_size(&t.f, &t.p, &bytes), FLASHC_OK);
    if (flashc_last_error()[0] != '\0')
        fc_test_fail(__FILE__, __LINE__, "last error \"%s\" after a successful query",
                     flashc_last_error());
    FC_EXPECT_STATUS(flashc_bwd(NULL, &t.p, NULL, 0), FLASHC_ERR_INVALID_ARG);
    FC_EXPECT_STATUS(flashc_fwd(&t.f, &t.p, NULL, 0), FLASHC_OK);
    if (flashc_last_error()[0] != '\0')
        fc_test_fail(__FILE__, __LINE__, "last error \"%s\" after a successful flashc_fwd",
                     flashc_last_error());
    ta_free(&t);
}

typedef struct {
    char seen_at_start[256];
    char own[256];
    flashc_status s;
} ta_thread_out;

static void *ta_thread_main(void *arg) {
    ta_thread_out *o = (ta_thread_out *)arg;
    snprintf(o->seen_at_start, sizeof o->seen_at_start, "%s", flashc_last_error());
    flashc_params p = flashc_params_default();
    o->s = flashc_bwd(NULL, &p, NULL, 0);
    snprintf(o->own, sizeof o->own, "%s", flashc_last_error());
    return NULL;
}

FC_TEST(api_last_error_thread_local) {
    ta_prob t;
    ta_make(&t, 5);
    t.p.dropout_p = 1.5f;
    FC_EXPECT_STATUS(flashc_fwd(&t.f, &t.p, NULL, 0), FLASHC_ERR_INVALID_ARG);
    char mine[256];
    snprintf(mine, sizeof mine, "%s", flashc_last_error());
    FC_EXPECT_TRUE(mine[0] != '\0');

    ta_thread_out o;
    memset(&o, 0, sizeof o);
    pthread_t th;
    FC_ASSERT_TRUE(pthread_create(&th, NULL, ta_thread_main, &o) == 0);
    pthread_join(th, NULL);
    if (o.seen_at_start[0] != '\0')
        fc_test_fail(__FILE__, __LINE__, "a new thread sees last error \"%s\" set by another thread",
                     o.seen_at_start);
    FC_EXPECT_EQ(o.s, FLASHC_ERR_INVALID_ARG);
    FC_EXPECT_TRUE(o.own[0] != '\0');
    if (strcmp(flashc_last_error(), mine) != 0)
        fc_test_fail(__FILE__, __LINE__, "this thread's last error changed from \"%s\" to \"%s\"",
                     mine, flashc_last_error());
    ta_free(&t);
}

// ---- dtypes, tensors, params ----

FC_TEST(api_dtype) {
    FC_EXPECT_EQ(flashc_dtype_size(FLASHC_DTYPE_FP32), 4);
    FC_EXPECT_EQ(flashc_dtype_size(FLASHC_DTYPE_FP16), 2);
    FC_EXPECT_EQ(flashc_dtype_size(FLASHC_DTYPE_BF16), 2);
    FC_EXPECT_EQ(flashc_dtype_size(FLASHC_DTYPE_INT32), 4);
    FC_EXPECT_EQ(flashc_dtype_size(FLASHC_DTYPE_COUNT), 0);
    FC_EXPECT_EQ(flashc_dtype_size((flashc_dtype)-1), 0);
    static const char *const names[FLASHC_DTYPE_COUNT] = {"fp32", "fp16", "bf16", "int32"};
    for (int d = 0; d < FLASHC_DTYPE_COUNT; d++) {
        const char *got = flashc_dtype_name((flashc_dtype)d);
        if (!got || strcmp(got, names[d]) != 0)
            fc_test_fail(__FILE__, __LINE__, "flashc_dtype_name(%d)=\"%s\", want \"%s\"", d,
                         got ? got : "(null)", names[d]);
    }
    FC_EXPECT_TRUE(strcmp(flashc_dtype_name(FLASHC_DTYPE_COUNT), "invalid") == 0);
    FC_EXPECT_TRUE(strcmp(flashc_dtype_name((flashc_dtype)99), "invalid") == 0);
}

FC_TEST(api_tensor_contiguous) {
    char mem[4];
    const int64_t shape[4] = {2, 3, 4, 5};
    flashc_tensor t = flashc_tensor_contiguous(mem, FLASHC_DTYPE_BF16, 4, shape, FLASHC_DEVICE_CUDA);
    FC_EXPECT_TRUE(t.data == mem);
    FC_EXPECT_EQ(t.dtype, FLASHC_DTYPE_BF16);
    FC_EXPECT_EQ(t.device, FLASHC_DEVICE_CUDA);
    FC_EXPECT_EQ(t.ndim, 4);
    const int64_t want[4] = {60, 20, 5, 1};
    for (int i = 0; i < 4; i++) {
        FC_EXPECT_EQ(t.shape[i], shape[i]);
        FC_EXPECT_EQ(t.stride[i], want[i]);
    }
    const int64_t s1[1] = {7};
    flashc_tensor u = flashc_tensor_contiguous(mem, FLASHC_DTYPE_INT32, 1, s1, FLASHC_DEVICE_CPU);
    FC_EXPECT_EQ(u.ndim, 1);
    FC_EXPECT_EQ(u.shape[0], 7);
    FC_EXPECT_EQ(u.stride[0], 1);
    FC_EXPECT_EQ(u.device, FLASHC_DEVICE_CPU);
    const int64_t s2[2] = {3, 9}; /* entries past ndim are not read */
    flashc_tensor w = flashc_tensor_contiguous(mem, FLASHC_DTYPE_FP32, 2, s2, FLASHC_DEVICE_CPU);
    FC_EXPECT_EQ(w.stride[0], 9);
    FC_EXPECT_EQ(w.stride[1], 1);
    flashc_tensor z = flashc_tensor_contiguous(mem, FLASHC_DTYPE_INT32, 0, NULL, FLASHC_DEVICE_CPU);
    FC_EXPECT_EQ(z.ndim, 0); /* a scalar */
    FC_EXPECT_TRUE(z.data == mem);
}

FC_TEST(api_params_default) {
    flashc_params d = flashc_params_default();
    flashc_params i = FLASHC_PARAMS_INIT;
    flashc_params z;
    memset(&z, 0, sizeof z);
    /* the defaults are all zeros: flashc_params_default(), FLASHC_PARAMS_INIT and
       a zeroed struct are the same bytes (padding included: memset) */
    FC_EXPECT_TRUE(memcmp(&d, &z, sizeof z) == 0);
    FC_EXPECT_TRUE(memcmp(&i, &z, sizeof z) == 0 || (i.softmax_scale == 0.0f && i.causal == 0 &&
                                                     i.windowed == 0 && i.rotary_halves == 0 &&
                                                     i.backend == FLASHC_BACKEND_AUTO &&
                                                     i.stream == NULL));
    /* and they are flash_attn 2.x's: softmax_scale=None (1/sqrt(D)), causal=False,
       window_size=(-1, -1), softcap=0.0, dropout_p=0.0, deterministic=False,
       rotary_interleaved=True, num_splits=0 (heuristic), the tensors' backend */
    FC_EXPECT_EQ(d.windowed, 0);
    FC_EXPECT_EQ(d.rotary_halves, 0);
    FC_EXPECT_EQ(d.backend, FLASHC_BACKEND_AUTO);
    FC_EXPECT_EQ(d.scale_given, 0);
}

/* A zeroed flashc_params runs exactly as params = NULL: the same bits out. */
FC_TEST(api_params_zero_is_default) {
    ta_prob t;
    ta_make(&t, 9);
    FC_EXPECT_STATUS(flashc_fwd(&t.f, NULL, NULL, 0), FLASHC_OK);
    size_t n = 2 * 9 * 4 * 8 * 2;
    void *want = malloc(n);
    memcpy(want, t.out, n);
    fc_poison(t.out, FLASHC_DTYPE_BF16, 2 * 9 * 4 * 8);
    flashc_params z;
    memset(&z, 0, sizeof z);
    FC_EXPECT_STATUS(flashc_fwd(&t.f, &z, NULL, 0), FLASHC_OK);
    FC_EXPECT_TRUE(memcmp(want, t.out, n) == 0);
    free(want);
    ta_free(&t);
}

/* windowed = 0 with a window edge set is refused with the fix in the message;
   windowed = 1 with both edges -1 is no window at all. */
FC_TEST(api_params_windowed) {
    ta_prob t;
    ta_make(&t, 9);
    flashc_params p = flashc_params_default();
    p.window_left = 3;
    FC_EXPECT_STATUS(flashc_fwd(&t.f, &p, NULL, 0), FLASHC_ERR_INVALID_ARG);
    FC_EXPECT_TRUE(strstr(flashc_last_error(), "windowed") != NULL);
    p.window_left = -1;
    p.window_right = 0; /* causal's window, forgotten flag: refused, not ignored */
    FC_EXPECT_STATUS(flashc_fwd(&t.f, &p, NULL, 0), FLASHC_ERR_INVALID_ARG);
    FC_EXPECT_TRUE(strstr(flashc_last_error(), "windowed") != NULL);
    p.window_right = -1;
    FC_EXPECT_STATUS(flashc_fwd(&t.f, &p, NULL, 0), FLASHC_OK); /* -1: unbounded either way */
    size_t n = 2 * 9 * 4 * 8 * 2;
    void *want = malloc(n);
    memcpy(want, t.out, n);
    p.windowed = 1;
    FC_EXPECT_STATUS(flashc_fwd(&t.f, &p, NULL, 0), FLASHC_OK);
    FC_EXPECT_TRUE(memcmp(want, t.out, n) == 0);
    p.windowed = 2;
    FC_EXPECT_STATUS(flashc_fwd(&t.f, &p, NULL, 0), FLASHC_ERR_INVALID_ARG);
    free(want);
    ta_free(&t);
}

// ---- the ABI ----

/* Every entry point, its workspace query and its supported query refuse args
   of another ABI version, naming both versions, and write nothing. */
FC_TEST(api_abi_args) {
    ta_prob t;
    ta_make(&t, 5);
    const uint32_t bad[] = {0, FLASHC_ABI_VERSION - 1, FLASHC_ABI_VERSION + 1, 0xdeadbeefu};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        t.f.abi = t.b.abi = bad[i];
        size_t bytes = 12345;
        FC_EXPECT_STATUS(flashc_fwd(&t.f, &t.p, NULL, 0), FLASHC_ERR_INVALID_ARG);
        char want[32];
        snprintf(want, sizeof want, "args.abi=%u", (unsigned)bad[i]);
        FC_EXPECT_TRUE(strstr(flashc_last_error(), want) != NULL);
        FC_EXPECT_STATUS(flashc_fwd_workspace_size(&t.f, &t.p, &bytes), FLASHC_ERR_INVALID_ARG);
        FC_EXPECT_TRUE(bytes == 12345);
        FC_EXPECT_STATUS(flashc_fwd_supported(&t.f, &t.p), FLASHC_ERR_INVALID_ARG);
        FC_EXPECT_STATUS(flashc_bwd(&t.b, &t.p, NULL, 0), FLASHC_ERR_INVALID_ARG);
        FC_EXPECT_STATUS(flashc_bwd_workspace_size(&t.b, &t.p, &bytes), FLASHC_ERR_INVALID_ARG);
        FC_EXPECT_STATUS(flashc_bwd_supported(&t.b, &t.p), FLASHC_ERR_INVALID_ARG);
        flashc_varlen_fwd_args vf;
        flashc_varlen_bwd_args vb;
        flashc_kvcache_args kv;
        memset(&vf, 0, sizeof vf);
        memset(&vb, 0, sizeof vb);
        memset(&kv, 0, sizeof kv);
        vf.abi = vb.abi = kv.abi = bad[i];
        FC_EXPECT_STATUS(flashc_varlen_fwd_supported(&vf, NULL), FLASHC_ERR_INVALID_ARG);
        FC_EXPECT_STATUS(flashc_varlen_bwd_supported(&vb, NULL), FLASHC_ERR_INVALID_ARG);
        FC_EXPECT_STATUS(flashc_fwd_kvcache_supported(&kv, NULL), FLASHC_ERR_INVALID_ARG);
        FC_EXPECT_TRUE(strstr(flashc_last_error(), "args.abi") != NULL);
    }
    FC_EXPECT_TRUE(isnan(fc_get(t.out, FLASHC_DTYPE_BF16, 0))); /* nothing written */
    t.f.abi = t.b.abi = FLASHC_ABI_VERSION;
    FC_EXPECT_STATUS(flashc_fwd_supported(&t.f, &t.p), FLASHC_OK);
    FC_EXPECT_STATUS(flashc_bwd_supported(&t.b, &t.p), FLASHC_OK);
    FC_EXPECT_EQ(flashc_abi_version(), FLASHC_ABI_VERSION);
    ta_free(&t);
}

/* *_supported answers as the run does: OK for what runs, the run's status and
   message for what does not. */
FC_TEST(api_supported_matches_run) {
    ta_prob t;
    ta_make(&t, 5);
    FC_EXPECT_STATUS(flashc_bwd_supported(&t.b, &t.p), FLASHC_OK);
    t.b.dq.shape[3] = 7; /* dq no longer like q */
    FC_EXPECT_STATUS(flashc_bwd_supported(&t.b, &t.p), FLASHC_ERR_INVALID_ARG);
    char msg[256];
    snprintf(msg, sizeof msg, "%s", flashc_last_error());
    FC_EXPECT_STATUS(flashc_bwd(&t.b, &t.p, NULL, 0), FLASHC_ERR_INVALID_ARG);
    FC_EXPECT_TRUE(strcmp(msg, flashc_last_error()) == 0);
    ta_free(&t);
}

// ---- CPU settings ----

FC_TEST(api_simd) {
    FC_EXPECT_EQ(flashc_simd_supported(FLASHC_SIMD_SCALAR), 1);
    FC_EXPECT_EQ(flashc_simd_supported(FLASHC_SIMD_COUNT), 0);
    const flashc_simd orig = flashc_simd_active();
    FC_EXPECT_EQ(flashc_simd_supported(orig), 1);
    unsigned f = flashc_cpu_features();
    if (flashc_simd_supported(FLASHC_SIMD_AVX2)) {
        unsigned need = FLASHC_CPU_AVX2 | FLASHC_CPU_FMA | FLASHC_CPU_F16C;
        FC_EXPECT_EQ(f & need, need);
    }
    if (flashc_simd_supported(FLASHC_SIMD_AVX512)) {
        unsigned need = FLASHC_CPU_AVX512F | FLASHC_CPU_AVX512BW | FLASHC_CPU_AVX512DQ |
                        FLASHC_CPU_AVX512VL;
        FC_EXPECT_EQ(f & need, need);
    }
    if (flashc_simd_supported(FLASHC_SIMD_AMX)) {
        FC_EXPECT_EQ(flashc_simd_supported(FLASHC_SIMD_AVX512), 1);
        unsigned need = FLASHC_CPU_AVX512BF16 | FLASHC_CPU_AMXBF16;
        FC_EXPECT_EQ(f & need, need);
    }
    static const char *const names[FLASHC_SIMD_COUNT] = {"scalar", "avx2", "avx512", "amx"};
    for (int s = 0; s < FLASHC_SIMD_COUNT; s++) {
        const char *nm = flashc_simd_name((flashc_simd)s);
        if (!nm || strcmp(nm, names[s]) != 0)
            fc_test_fail(__FILE__, __LINE__, "flashc_simd_name(%d)=\"%s\", want \"%s\"", s,
                         nm ? nm : "(null)", names[s]);
        if (flashc_simd_supported((flashc_simd)s)) {
            FC_EXPECT_STATUS(flashc_set_simd((flashc_simd)s), FLASHC_OK);
            FC_EXPECT_EQ(flashc_simd_active(), s);
        } else {
            FC_EXPECT_STATUS(flashc_set_simd((flashc_simd)s), FLASHC_ERR_UNSUPPORTED);
        }
    }
    FC_EXPECT_STATUS(flashc_set_simd(orig), FLASHC_OK);
    FC_EXPECT_EQ(flashc_simd_active(), orig);
}

/* A workspace sized under one SIMD path serves every other (fwd.c, bwd.c
 * reserve the largest layout a CPU's paths use), bf16 and fp16 included, whose
 * amx paths have their own tiles (and fp16's split its own buffers). */
FC_TEST(api_workspace_same_on_every_path) {
    const flashc_simd orig = flashc_simd_active();
    const int64_t lens[] = {1, 7, 300, 2048}; /* 2048: the amx path's big tiles */
    for (size_t i = 0; i < 2 * sizeof lens / sizeof *lens; i++) {
        ta_prob t;
        ta_make(&t, lens[i / 2]);
        if (i % 2) { /* the same problem in fp16 (2-byte elements too) */
            flashc_tensor *h[] = {&t.f.q,    &t.f.k,  &t.f.v,  &t.f.out, &t.b.q, &t.b.k, &t.b.v,
                                  &t.b.out, &t.b.dout, &t.b.dq, &t.b.dk,  &t.b.dv};
            for (size_t k = 0; k < sizeof h / sizeof *h; k++) h[k]->dtype = FLASHC_DTYPE_FP16;
        }
        size_t fwd0 = 0, bwd0 = 0;
        int first = 1;
        for (int s = 0; s < FLASHC_SIMD_COUNT; s++) {
            if (!flashc_simd_supported((flashc_simd)s)) continue;
            FC_EXPECT_STATUS(flashc_set_simd((flashc_simd)s), FLASHC_OK);
            size_t fwd = 0, bwd = 0;
            FC_EXPECT_STATUS(flashc_fwd_workspace_size(&t.f, &t.p, &fwd), FLASHC_OK);
            FC_EXPECT_STATUS(flashc_bwd_workspace_size(&t.b, &t.p, &bwd), FLASHC_OK);
            if (first) {
                fwd0 = fwd;
                bwd0 = bwd;
                first = 0;
            } else if (fwd != fwd0 || bwd != bwd0) {
                fc_test_fail(__FILE__, __LINE__,
                             "%s S=%lld: path %s needs fwd %zu / bwd %zu bytes, the first path "
                             "%zu / %zu", i % 2 ? "fp16" : "bf16", (long long)lens[i / 2],
                             flashc_simd_name((flashc_simd)s), fwd, bwd, fwd0, bwd0);
            }
        }
        ta_free(&t);
    }
    FC_EXPECT_STATUS(flashc_set_simd(orig), FLASHC_OK);
}

/* A workspace sized for the longest sequence serves every shorter one: the forward's
 * size never falls as max_seqlen_k grows (fwd.c reserves a kv head's copy for tall
 * tiles up to a bound, then stays at it). Only the size is queried: no data is read. */
FC_TEST(api_workspace_grows_with_seqlen_k) {
    const int64_t sks[] = {1000, 4000, 8191, 8192, 8193, 12000, 40000};
    static uint16_t dummy[64];
    size_t last = 0;
    for (size_t i = 0; i < sizeof sks / sizeof *sks; i++) {
        int64_t qs[4] = {1, 1100, 8, 128}, ks[4] = {1, sks[i], 1, 128};
        flashc_fwd_args a;
        memset(&a, 0, sizeof a);
        a.abi = FLASHC_ABI_VERSION;
        a.q = flashc_tensor_contiguous(dummy, FLASHC_DTYPE_BF16, 4, qs, FLASHC_DEVICE_CPU);
        a.k = flashc_tensor_contiguous(dummy, FLASHC_DTYPE_BF16, 4, ks, FLASHC_DEVICE_CPU);
        a.v = a.k;
        a.out = flashc_tensor_contiguous(dummy, FLASHC_DTYPE_BF16, 4, qs, FLASHC_DEVICE_CPU);
        flashc_params p = flashc_params_default();
        size_t bytes = 0;
        FC_EXPECT_STATUS(flashc_fwd_workspace_size(&a, &p, &bytes), FLASHC_OK);
        if (bytes < last)
            fc_test_fail(__FILE__, __LINE__,
                         "Sk=%lld needs %zu bytes, less than the %zu of Sk=%lld",
                         (long long)sks[i], bytes, last, (long long)sks[i - 1]);
        last = bytes;
    }
}

FC_TEST(api_simd_bad) {
    const flashc_simd orig = flashc_simd_active();
    const flashc_simd bad[] = {FLASHC_SIMD_COUNT, (flashc_simd)-1, (flashc_simd)99};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        flashc_status s = flashc_set_simd(bad[i]);
        if (s != FLASHC_ERR_INVALID_ARG && s != FLASHC_ERR_UNSUPPORTED)
            fc_test_fail(__FILE__, __LINE__, "flashc_set_simd(%d) returned %s", (int)bad[i],
                         flashc_status_string(s));
        FC_EXPECT_EQ(flashc_simd_active(), orig);
    }
}

FC_TEST(api_num_threads) {
    flashc_set_num_threads(1);
    FC_EXPECT_EQ(flashc_get_num_threads(), 1);
    flashc_set_num_threads(3);
    FC_EXPECT_EQ(flashc_get_num_threads(), 3);
    flashc_set_num_threads(0);
    FC_EXPECT_TRUE(flashc_get_num_threads() >= 1);
}

// ---- backends and CUDA devices ----

FC_TEST(api_backends) {
    FC_EXPECT_EQ(flashc_backend_available(FLASHC_BACKEND_CPU), 1);
    FC_EXPECT_EQ(flashc_backend_available(FLASHC_BACKEND_COUNT), 0);
    FC_EXPECT_EQ(flashc_backend_available((flashc_backend)99), 0);
    static const char *const names[FLASHC_BACKEND_COUNT] = {"auto", "cpu", "cuda"};
    for (int b = 0; b < FLASHC_BACKEND_COUNT; b++) {
        const char *nm = flashc_backend_name((flashc_backend)b);
        if (!nm || strcmp(nm, names[b]) != 0)
            fc_test_fail(__FILE__, __LINE__, "flashc_backend_name(%d)=\"%s\", want \"%s\"", b,
                         nm ? nm : "(null)", names[b]);
    }
    FC_EXPECT_TRUE(flashc_backend_name((flashc_backend)99) != NULL);
    if (!flashc_cuda_compiled()) {
        FC_EXPECT_EQ(flashc_backend_available(FLASHC_BACKEND_CUDA), 0);
        FC_EXPECT_EQ(flashc_cuda_device_count(), 0);
    }
}

FC_TEST(api_cuda_device_info) {
    int n = flashc_cuda_device_count();
    FC_EXPECT_TRUE(n >= 0);
    flashc_cuda_device_info info;
    memset(&info, 0, sizeof info);
    info.abi = FLASHC_ABI_VERSION;
    const int bad[] = {-1, n, n + 7};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        flashc_status s = flashc_cuda_device_get_info(bad[i], &info);
        int ok = flashc_cuda_compiled() ? s == FLASHC_ERR_INVALID_ARG
                                        : (s == FLASHC_ERR_INVALID_ARG || s == FLASHC_ERR_UNSUPPORTED);
        if (!ok)
            fc_test_fail(__FILE__, __LINE__, "flashc_cuda_device_get_info(%d) returned %s", bad[i],
                         flashc_status_string(s));
        FC_EXPECT_TRUE(flashc_last_error()[0] != '\0');
    }
    flashc_status s = flashc_cuda_device_get_info(0, NULL);
    FC_EXPECT_TRUE(s == FLASHC_ERR_INVALID_ARG || s == FLASHC_ERR_UNSUPPORTED);
    info.abi = FLASHC_ABI_VERSION + 1; /* another header's struct */
    FC_EXPECT_STATUS(flashc_cuda_device_get_info(0, &info), FLASHC_ERR_INVALID_ARG);
    FC_EXPECT_TRUE(strstr(flashc_last_error(), "info.abi") != NULL);
    if (n > 0) {
        memset(&info, 0, sizeof info);
        info.abi = FLASHC_ABI_VERSION;
        FC_EXPECT_STATUS(flashc_cuda_device_get_info(0, &info), FLASHC_OK);
        FC_EXPECT_EQ(info.abi, FLASHC_ABI_VERSION);
        FC_EXPECT_TRUE(info.name[0] != '\0');
        FC_EXPECT_TRUE(info.major >= 1);
        FC_EXPECT_TRUE(info.multiprocessors >= 1);
        FC_EXPECT_TRUE(info.total_memory_bytes > 0);
    }
}

// ---- workspace: the convenience path and the allocator ----

FC_TEST(api_convenience_workspace) {
    ta_prob t;
    ta_make(&t, 5);
    FC_EXPECT_STATUS(flashc_fwd(&t.f, &t.p, NULL, 0), FLASHC_OK);
    FC_EXPECT_TRUE(!isnan(fc_get(t.out, FLASHC_DTYPE_BF16, 0)));
    FC_EXPECT_STATUS(flashc_bwd(&t.b, &t.p, NULL, 0), FLASHC_OK);
    FC_EXPECT_TRUE(!isnan(fc_get(t.dq, FLASHC_DTYPE_BF16, 0)));
    ta_free(&t);
}

typedef struct {
    int allocs, frees, misaligned, not_cpu, fail;
    size_t largest;
} ta_count;

static void *ta_alloc(size_t bytes, flashc_device dev, void *user) {
    ta_count *c = (ta_count *)user;
    c->allocs++;
    if (dev != FLASHC_DEVICE_CPU) c->not_cpu++;
    if (bytes > c->largest) c->largest = bytes;
    if (c->fail) return NULL;
    size_t r = (bytes + FLASHC_WORKSPACE_ALIGN - 1) / FLASHC_WORKSPACE_ALIGN * FLASHC_WORKSPACE_ALIGN;
    return aligned_alloc(FLASHC_WORKSPACE_ALIGN, r ? r : FLASHC_WORKSPACE_ALIGN);
}

static void ta_release(void *p, flashc_device dev, void *user) {
    ta_count *c = (ta_count *)user;
    c->frees++;
    if (dev != FLASHC_DEVICE_CPU) c->not_cpu++;
    free(p);
}

/* A backward problem whose workspace is > 0 (its size in *need), or S = 0 if
 * none up to S = 320 needs one. */
static int64_t ta_bwd_with_workspace(ta_prob *t, size_t *need) {
    for (int64_t s = 5; s <= 320; s *= 4) {
        ta_make(t, s);
        *need = 0;
        if (flashc_bwd_workspace_size(&t->b, &t->p, need) == FLASHC_OK && *need > 0) return s;
        ta_free(t);
    }
    return 0;
}

FC_TEST(api_allocator) {
    ta_prob t;
    size_t need = 0;
    int64_t s = ta_bwd_with_workspace(&t, &need);
    if (!s) {
        printf("  note api_allocator: no backward problem needs a workspace; only checking "
               "that the allocator is not called\n");
        ta_make(&t, 5);
    }
    ta_count c;
    memset(&c, 0, sizeof c);
    /* an allocator of another ABI version is refused and not installed */
    flashc_allocator old = {FLASHC_ABI_VERSION - 1, ta_alloc, ta_release, &c};
    FC_EXPECT_STATUS(flashc_set_allocator(&old), FLASHC_ERR_INVALID_ARG);
    FC_EXPECT_TRUE(strstr(flashc_last_error(), "allocator.abi") != NULL);
    FC_EXPECT_STATUS(flashc_bwd(&t.b, &t.p, NULL, 0), FLASHC_OK);
    FC_EXPECT_EQ(c.allocs, 0);
    flashc_allocator a = {FLASHC_ABI_VERSION, ta_alloc, ta_release, &c};
    FC_EXPECT_STATUS(flashc_set_allocator(&a), FLASHC_OK);
    FC_EXPECT_STATUS(flashc_bwd(&t.b, &t.p, NULL, 0), FLASHC_OK);
    /* a caller workspace of the right size: the allocator is not asked */
    void *ws = need ? aligned_alloc(FLASHC_WORKSPACE_ALIGN,
                                    (need + FLASHC_WORKSPACE_ALIGN - 1) / FLASHC_WORKSPACE_ALIGN *
                                        FLASHC_WORKSPACE_ALIGN)
                    : NULL;
    int after_convenience = c.allocs;
    FC_EXPECT_STATUS(flashc_bwd(&t.b, &t.p, ws, need), FLASHC_OK);
    FC_EXPECT_EQ(c.allocs, after_convenience);
    flashc_set_allocator(NULL);
    if (s) {
        FC_EXPECT_TRUE(after_convenience >= 1);
        FC_EXPECT_TRUE(c.largest >= need);
    }
    FC_EXPECT_EQ(c.frees, c.allocs);
    FC_EXPECT_EQ(c.not_cpu, 0);
    /* restored: the default serves the convenience path again */
    int before = c.allocs;
    FC_EXPECT_STATUS(flashc_bwd(&t.b, &t.p, NULL, 0), FLASHC_OK);
    FC_EXPECT_EQ(c.allocs, before);
    free(ws);
    ta_free(&t);
}

FC_TEST(api_allocator_out_of_memory) {
    ta_prob t;
    size_t need = 0;
    if (!ta_bwd_with_workspace(&t, &need)) {
        printf("  note api_allocator_out_of_memory: skipped, no backward problem needs a workspace\n");
        return;
    }
    ta_count c;
    memset(&c, 0, sizeof c);
    c.fail = 1;
    flashc_allocator a = {FLASHC_ABI_VERSION, ta_alloc, ta_release, &c};
    FC_EXPECT_STATUS(flashc_set_allocator(&a), FLASHC_OK);
    int64_t nq = t.b.dq.shape[0] * t.b.dq.stride[0], nk = t.b.dk.shape[0] * t.b.dk.stride[0];
    size_t bq = (size_t)nq * 2, bk = (size_t)nk * 2;
    unsigned char *sq = malloc(bq), *sk = malloc(bk), *sv = malloc(bk);
    memcpy(sq, t.dq, bq);
    memcpy(sk, t.dk, bk);
    memcpy(sv, t.dv, bk);
    flashc_status s = flashc_bwd(&t.b, &t.p, NULL, 0);
    FC_EXPECT_TRUE(flashc_last_error()[0] != '\0');
    flashc_set_allocator(NULL); /* a flashc call: clears the last error */
    FC_EXPECT_STATUS(s, FLASHC_ERR_OUT_OF_MEMORY);
    FC_EXPECT_TRUE(c.allocs >= 1);
    FC_EXPECT_EQ(c.frees, 0);
    FC_EXPECT_TRUE(memcmp(sq, t.dq, bq) == 0 && memcmp(sk, t.dk, bk) == 0 &&
                   memcmp(sv, t.dv, bk) == 0); /* nothing written */
    free(sq);
    free(sk);
    free(sv);
    ta_free(&t);
}

// ---- Philox4x32-10 ----

/* Known-answer vectors of philox4x32-10 from Random123's kat_vectors:
 * counter (4 words), key (2 words) -> output (4 words). */
static const uint32_t ta_philox_kat[3][10] = {
    {0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u,
     0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
    {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu,
     0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu},
    {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u,
     0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u},
};

FC_TEST(api_philox_known_answers) {
    for (int v = 0; v < 3; v++) {
        const uint32_t *k = ta_philox_kat[v];
        fc_philox4 r = fc_philox(k[0], k[1], k[2], k[3], k[4], k[5]);
        for (int w = 0; w < 4; w++)
            if (r.x[w] != k[6 + w])
                fc_test_fail(__FILE__, __LINE__, "vector %d word %d: got %08x want %08x", v, w,
                             r.x[w], k[6 + w]);
    }
}

/* The dropout mapping of flashc.h: key = (lo32(seed), hi32(seed)), counter =
 * (lo32(c), hi32(c), i, b*H + h) with c = offset + j/8 (64-bit add), word j % 8
 * taken as (x[w/2] >> 16*(w%2)) & 0xffff, dropped iff word < threshold. */
FC_TEST(api_philox_dropout_mapping) {
    /* vector 3 through the dropout mapping: seed and c assembled from its words */
    const uint32_t *k = ta_philox_kat[2];
    uint64_t seed = (uint64_t)k[5] << 32 | k[4];
    uint64_t c = (uint64_t)k[1] << 32 | k[0];
    fc_philox4 r = fc_dropout_group(seed, c - 3, k[3], k[2], 3);
    for (int w = 0; w < 4; w++) FC_EXPECT_EQ(r.x[w], k[6 + w]);
    /* the 64-bit add carries into the second counter word */
    fc_philox4 a = fc_dropout_group(7, 0xffffffffull, 5, 2, 1);
    fc_philox4 b = fc_philox(0, 1, 2, 5, 7, 0);
    for (int w = 0; w < 4; w++) FC_EXPECT_EQ(a.x[w], b.x[w]);
    /* word order: vector 1 gives x = {6627e8d5, e169c58d, bc57ac4c, 9b00dbd8} */
    fc_philox4 z = fc_dropout_group(0, 0, 0, 0, 0);
    const uint32_t words[8] = {0xe8d5, 0x6627, 0xc58d, 0xe169, 0xac4c, 0xbc57, 0xdbd8, 0x9b00};
    for (int w = 0; w < 8; w++) FC_EXPECT_EQ(fc_dropout_word(z, w), words[w]);
    /* keep iff word >= threshold; column j reads word j % 8 of group j / 8 */
    for (int j = 0; j < 8; j++) {
        FC_EXPECT_EQ(fc_dropout_keep(0, 0, 0, 0, (uint64_t)j, words[j]), 1);
        FC_EXPECT_EQ(fc_dropout_keep(0, 0, 0, 0, (uint64_t)j, words[j] + 1), 0);
    }
    fc_philox4 g1 = fc_dropout_group(0, 0, 0, 0, 1);
    uint32_t w9 = fc_dropout_word(g1, 1);
    FC_EXPECT_EQ(fc_dropout_keep(0, 0, 0, 0, 9, w9), 1);
    FC_EXPECT_EQ(fc_dropout_keep(0, 0, 0, 0, 9, w9 + 1), 0);
    /* threshold = (uint32_t)(p * 65536 + 0.5) */
    FC_EXPECT_EQ(fc_dropout_threshold(0.0f), 0);
    FC_EXPECT_EQ(fc_dropout_threshold(0.5f), 32768);
    FC_EXPECT_EQ(fc_dropout_threshold(0.1f), 6554);
    FC_EXPECT_EQ(fc_dropout_threshold(0.99999f), 65535);
}
