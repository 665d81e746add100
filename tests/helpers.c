/* helpers.c : tensors, outputs, workspaces and case options of the numeric tests
 * (see helpers.h). */
#define _POSIX_C_SOURCE 200809L

#include "helpers.h"

#include "../src/internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// ---- buffers and views ----

th_buf *th_buf_in(th_arena *a) {
    if (a->nbufs == (int)(sizeof a->bufs / sizeof a->bufs[0]))
        abort(); /* a case too big: fix the test */
    th_buf *b = &a->bufs[a->nbufs++];
    memset(b, 0, sizeof *b);
    return b;
}

void *th_keep(th_arena *a, void *p) {
    if (a->nptrs == (int)(sizeof a->ptrs / sizeof a->ptrs[0])) abort();
    a->ptrs[a->nptrs++] = p;
    return p;
}

double *th_dbl(th_arena *a, int64_t n) {
    double *p = (double *)malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    if (!p) abort();
    return (double *)th_keep(a, p);
}

void th_arena_free(th_arena *a) {
    for (int i = 0; i < a->nbufs; i++) th_buf_free(&a->bufs[i]);
    for (int i = 0; i < a->nptrs; i++) free(a->ptrs[i]);
    a->nbufs = a->nptrs = 0;
}

void th_buf_new(th_buf *b, flashc_dtype dt, int64_t n, double lo, double hi) {
    size_t es = flashc_dtype_size(dt);
    b->dt = dt;
    b->n = n > 0 ? n : 1;
    b->snap = NULL;
    b->data = calloc((size_t)b->n, es);
    if (!b->data) abort(); /* test data must exist; a test has no way on without it */
    if (dt != FLASHC_DTYPE_INT32) fc_fill_random(b->data, dt, b->n, lo, hi);
}

void th_buf_free(th_buf *b) {
    free(b->data);
    free(b->snap);
    b->data = b->snap = NULL;
}

void th_snapshot(th_buf *b) {
    size_t bytes = (size_t)b->n * flashc_dtype_size(b->dt);
    if (!b->snap) b->snap = malloc(bytes);
    if (!b->snap) abort();
    memcpy(b->snap, b->data, bytes);
}

flashc_tensor th_view(const th_buf *b, int64_t off, int ndim, const int64_t *shape,
                      const int64_t *stride) {
    flashc_tensor t;
    memset(&t, 0, sizeof t);
    t.data = (char *)b->data + off * (int64_t)flashc_dtype_size(b->dt);
    t.dtype = b->dt;
    t.ndim = ndim;
    for (int d = 0; d < ndim; d++) {
        t.shape[d] = shape[d];
        t.stride[d] = stride[d];
    }
    t.device = FLASHC_DEVICE_CPU;
    return t;
}

flashc_tensor th_new(th_buf *b, flashc_dtype dt, int ndim, const int64_t *shape, th_layout lay,
                     double lo, double hi) {
    int64_t stride[FLASHC_MAX_DIMS] = {0, 0, 0, 0}, off = 0, numel = 1;
    for (int d = 0; d < ndim; d++) numel *= shape[d];
    if (ndim > 0) stride[ndim - 1] = 1;
    if (lay == TH_BHSD && ndim == 4) {
        stride[1] = shape[3];
        stride[2] = shape[1] * shape[3];
        stride[0] = shape[2] * shape[1] * shape[3];
    } else {
        for (int d = ndim - 2; d >= 0; d--)
            stride[d] = stride[d + 1] * shape[d + 1] + (lay == TH_PADDED ? 3 + 2 * d : 0);
        if (lay == TH_PADDED) off = 7;
    }
    int64_t extent = off + 1;
    for (int d = 0; d < ndim; d++) extent += (shape[d] - 1) * stride[d];
    if (numel == 0) extent = off + 1;
    th_buf_new(b, dt, extent + (lay == TH_PADDED ? 5 : 0), lo, hi);
    return th_view(b, off, ndim, shape, stride);
}

flashc_tensor th_new_out(th_buf *b, flashc_dtype dt, int ndim, const int64_t *shape,
                         th_layout lay) {
    flashc_tensor t = th_new(b, dt, ndim, shape, lay, -1.0, 1.0);
    th_poison(b, &t);
    return t;
}

flashc_tensor th_new_i32(th_buf *b, int ndim, int64_t n, const int32_t *vals) {
    int64_t shape[1] = {n}, stride[1] = {1};
    th_buf_new(b, FLASHC_DTYPE_INT32, ndim == 0 ? 1 : n, 0.0, 0.0);
    memcpy(b->data, vals, (size_t)(ndim == 0 ? 1 : n) * sizeof(int32_t));
    return th_view(b, 0, ndim, shape, stride);
}

int64_t th_numel(const flashc_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

int64_t *th_offsets(const flashc_tensor *t) {
    int64_t n = th_numel(t);
    int64_t *o = (int64_t *)malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
    if (!o) abort();
    int64_t idx[FLASHC_MAX_DIMS] = {0, 0, 0, 0};
    for (int64_t e = 0; e < n; e++) {
        int64_t off = 0;
        for (int d = 0; d < t->ndim; d++) off += idx[d] * t->stride[d];
        o[e] = off;
        for (int d = t->ndim - 1; d >= 0; d--) {
            if (++idx[d] < t->shape[d]) break;
            idx[d] = 0;
        }
    }
    return o;
}

/* Element offset of the view's origin inside its buffer. */
static int64_t th_origin(const th_buf *b, const flashc_tensor *t) {
    return ((const char *)t->data - (const char *)b->data) / (int64_t)flashc_dtype_size(b->dt);
}

void th_poison(th_buf *b, const flashc_tensor *t) {
    int64_t n = th_numel(t), *o = th_offsets(t);
    for (int64_t e = 0; e < n; e++)
        fc_poison((char *)t->data + o[e] * (int64_t)flashc_dtype_size(t->dtype), t->dtype, 1);
    free(o);
    th_snapshot(b);
}

void th_expect_refused(flashc_status s, flashc_status want, const size_t *bytes, const char *part,
                       const char *file, int line) {
    if (s != want)
        fc_test_fail(file, line, "status %s, want %s (%s)", flashc_status_string(s),
                     flashc_status_string(want), flashc_last_error());
    else if (bytes && *bytes != 777)
        fc_test_fail(file, line, "the size query wrote *bytes=%zu", *bytes);
    else if (!strstr(flashc_last_error(), part))
        fc_test_fail(file, line, "message \"%s\" lacks \"%s\"", flashc_last_error(), part);
}

int th_check_outside(const char *what, const th_buf *b, const flashc_tensor *t, int nt) {
    size_t es = flashc_dtype_size(b->dt);
    unsigned char *in = (unsigned char *)calloc((size_t)b->n, 1);
    if (!in) abort();
    for (int v = 0; v < nt; v++) {
        int64_t n = th_numel(&t[v]), *o = th_offsets(&t[v]), base = th_origin(b, &t[v]);
        for (int64_t e = 0; e < n; e++) in[base + o[e]] = 1;
        free(o);
    }
    int64_t bad = 0, first = -1;
    for (int64_t e = 0; e < b->n; e++)
        if (!in[e] && memcmp((char *)b->data + e * es, (char *)b->snap + e * es, es) != 0) {
            if (first < 0) first = e;
            bad++;
        }
    free(in);
    if (bad)
        fc_test_fail(__FILE__, __LINE__,
                     "%s: %lld elements outside the view changed (first at %lld)", what,
                     (long long)bad, (long long)first);
    return bad == 0;
}

void th_fill_view(const flashc_tensor *t, double lo, double hi) {
    int64_t n = th_numel(t), *o = th_offsets(t);
    for (int64_t e = 0; e < n; e++)
        fc_fill_random((char *)t->data + o[e] * (int64_t)flashc_dtype_size(t->dtype), t->dtype, 1,
                       lo, hi);
    free(o);
}

void th_store_dense(const flashc_tensor *t, const double *src) {
    int64_t n = th_numel(t), *o = th_offsets(t);
    for (int64_t e = 0; e < n; e++) fc_store(t->dtype, t->data, o[e], (float)src[e]);
    free(o);
}

double *th_to_double(const flashc_tensor *t) {
    int64_t n = th_numel(t);
    double *d = (double *)malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    if (!d) abort();
    int64_t *o = th_offsets(t);
    for (int64_t e = 0; e < n; e++) d[e] = fc_get(t->data, t->dtype, o[e]);
    free(o);
    return d;
}

int64_t th_bits_differ(const flashc_tensor *t, const double *first) {
    double *again = th_to_double(t);
    int64_t n = th_numel(t), diff = 0;
    for (int64_t e = 0; e < n; e++) diff += memcmp(&again[e], &first[e], sizeof(double)) != 0;
    free(again);
    return diff;
}

int th_check(const char *what, flashc_dtype dt, const flashc_tensor *got, const double *ref64,
             const double *lowp) {
    double *g = th_to_double(got);
    int ok = fc_check_close(what, dt, g, ref64, lowp, th_numel(got));
    free(g);
    return ok;
}

int th_check_signs(const char *what, const double *got, const double *ref, int64_t n) {
    int64_t bad = 0, first = -1;
    for (int64_t e = 0; e < n; e++)
        if (got[e] != 0.0 && ref[e] != 0.0 && (got[e] < 0.0) != (ref[e] < 0.0)) {
            if (first < 0) first = e;
            bad++;
        }
    if (bad)
        fc_test_fail(__FILE__, __LINE__,
                     "%s: %lld dropout signs differ (first at %lld: got %g want %g)", what,
                     (long long)bad, (long long)first, got[first], ref[first]);
    return bad == 0;
}

int th_check_masked_rows(const double *lse, const double *out, int64_t B, int64_t Sq, int64_t H,
                         int64_t D) {
    int64_t bad = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < Sq; i++) {
                if (lse[(b * H + h) * Sq + i] != -INFINITY) continue;
                const double *o = out + ((b * Sq + i) * H + h) * D;
                for (int64_t d = 0; d < D; d++) bad += o[d] != 0.0;
            }
    if (bad)
        fc_test_fail(__FILE__, __LINE__, "%lld outputs of rows that see no key are not 0",
                     (long long)bad);
    return bad == 0;
}

// ---- workspace ----

enum { TH_CANARY = 64 };

void *th_ws_new(size_t bytes) {
    if (bytes == 0) return NULL;
    size_t a = FLASHC_WORKSPACE_ALIGN, total = (bytes + TH_CANARY + a - 1) / a * a;
    unsigned char *p = (unsigned char *)aligned_alloc(a, total);
    if (!p) abort();
    memset(p, 0xff, bytes); /* NaN as fp32/fp16/bf16, -1 as int32: stale data shows */
    memset(p + bytes, 0xa5, total - bytes);
    return p;
}

void th_ws_free(void *ws, size_t bytes) {
    if (!ws) return;
    size_t a = FLASHC_WORKSPACE_ALIGN, total = (bytes + TH_CANARY + a - 1) / a * a;
    const unsigned char *p = (const unsigned char *)ws;
    for (size_t i = bytes; i < total; i++)
        if (p[i] != 0xa5) {
            fc_test_fail(__FILE__, __LINE__, "workspace written past its %zu bytes (at byte %zu)",
                         bytes, i);
            break;
        }
    free(ws);
}

// ---- options of a case ----

flashc_params th_params(const th_opts *o) {
    flashc_params p = flashc_params_default();
    p.causal = o->causal;
    p.windowed = o->wl >= 0 || o->wr >= 0;
    p.window_left = o->wl;
    p.window_right = o->wr;
    p.softcap = o->softcap;
    p.dropout_p = o->dropout;
    p.softmax_scale = o->scale;
    p.dropout_seed = fc_rand_u64();
    p.dropout_offset = fc_rand_u64() >> 24;
    return p;
}

static void th_append(char *buf, size_t n, const char *fmt, double v) {
    size_t len = strlen(buf);
    if (len < n) snprintf(buf + len, n - len, fmt, v);
}

void th_opts_name(char *buf, size_t n, const th_opts *o) {
    if (o->causal) th_append(buf, n, "/causal", 0);
    if (o->wl >= 0) th_append(buf, n, "/wl%g", o->wl);
    if (o->wr >= 0) th_append(buf, n, "/wr%g", o->wr);
    if (o->softcap > 0) th_append(buf, n, "/cap%g", o->softcap);
    if (o->alibi == 1) th_append(buf, n, "/alibiH", 0);
    if (o->alibi == 2) th_append(buf, n, "/alibiBH", 0);
    if (o->dropout > 0) th_append(buf, n, "/drop%g", o->dropout);
    if (o->scale > 0) th_append(buf, n, "/scale%g", o->scale);
}

flashc_tensor th_alibi_new(th_buf *b, int kind, int64_t B, int64_t H) {
    flashc_tensor t;
    memset(&t, 0, sizeof t);
    if (kind == 1) t = th_new(b, FLASHC_DTYPE_FP32, 1, (int64_t[]){H}, TH_CONTIG, 0.05, 0.6);
    if (kind == 2) t = th_new(b, FLASHC_DTYPE_FP32, 2, (int64_t[]){B, H}, TH_PADDED, 0.05, 0.6);
    if (kind == 0) b->data = b->snap = NULL;
    return t;
}

// ---- SIMD path and threads ----

int th_env_enter(th_env *e) {
    if (e->simd >= 0) {
        if (!flashc_simd_supported((flashc_simd)e->simd)) return 0;
        e->saved = flashc_simd_active();
        if (flashc_set_simd((flashc_simd)e->simd) != FLASHC_OK) return 0;
    }
    if (e->threads > 0) flashc_set_num_threads(e->threads);
    return 1;
}

void th_env_leave(th_env *e) {
    if (e->simd >= 0) flashc_set_simd(e->saved);
    if (e->threads > 0) flashc_set_num_threads(0);
}

void th_env_name(char *buf, size_t n, int simd, int threads) {
    size_t len = strlen(buf);
    if (simd >= 0 && len < n)
        len +=
            (size_t)snprintf(buf + len, n - len, "/simd=%s", flashc_simd_name((flashc_simd)simd));
    if (threads > 0 && len < n) snprintf(buf + len, n - len, "/threads=%d", threads);
}

void th_shuffle(int32_t *p, int64_t n) {
    for (int64_t i = 0; i < n; i++) p[i] = (int32_t)i;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(fc_rand_u64() % (uint64_t)(i + 1));
        int32_t t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
}

th_opts th_option_cycle(int i, th_windows w) {
    th_opts o = TH_OPTS_NONE;
    switch (i % TH_OPTION_CYCLE) {
    case 0: break;
    case 1: o.causal = 1; break;
    case 2: o.wl = w.left; break;
    case 3: o.wr = w.right; break;
    case 4: o.wl = w.both_left; o.wr = w.both_right; break;
    case 5: o.causal = 1; o.wl = w.causal_left; break;
    case 6: o.softcap = 1.5f; break;
    case 7: o.alibi = 1; break;
    case 8: o.alibi = 2; o.causal = 1; break;
    case 9: o.dropout = 0.17f; break;
    case 10: o.scale = 0.3f; o.wl = 0; o.wr = 0; break;
    case 11: o.causal = 1; o.softcap = 2.0f; o.alibi = 2; o.dropout = 0.17f; break;
    default: o.softcap = 1.0f; o.wl = 7; o.wr = w.last_right; o.alibi = 1; break;
    }
    return o;
}

void th_nan_head(const char *what, double *got, double *ref, double *lowp, int64_t Sq,
                 int64_t Sk, int64_t H, int64_t D, int wl, int wr) {
    const int64_t diag = Sq / 2 + Sk - Sq;
    const int64_t lo = wl >= 0 && diag - wl > 0 ? diag - wl : 0;
    const int64_t hi = wr >= 0 && diag + wr + 1 < Sk ? diag + wr + 1 : Sk;
    int64_t finite = 0;
    for (int64_t j = 0; j < Sk; j++)
        for (int64_t d = 0; d < D; d++) {
            const int64_t e = (j * H + H - 1) * D + d;
            if (j >= lo && j < hi) finite += !isnan(got[e]);
            got[e] = ref[e] = lowp[e] = 0.0;
        }
    if (finite)
        fc_test_fail(__FILE__, __LINE__, "%s: %lld elements of the keys the NaN row sees are not NaN",
                     what, (long long)finite);
}

flashc_params th_edge_params(const th_edge *c) {
    flashc_params p = flashc_params_default();
    p.windowed = c->wl >= 0 || c->wr >= 0;
    p.window_left = c->wl;
    p.window_right = c->wr;
    p.dropout_p = c->dropout;
    p.dropout_seed = fc_rand_u64();
    p.dropout_offset = fc_rand_u64() >> 40;
    p.deterministic = 1;
    if (c->scale_zero) {
        p.softmax_scale = 0.0f;
        p.scale_given = 1;
    }
    return p;
}

void th_edge_name(char *buf, size_t n, const char *prefix, const th_edge *c) {
    snprintf(buf, n, "%s%s%s%s_%s_d%d_%dx%d%s%s", prefix, c->family ? c->family : "",
             c->family ? "_" : "", c->one_key ? "one_key" : c->nan_q ? "nan_q" : "scale_zero",
             flashc_dtype_name(c->dt), c->D, c->Sq, c->Sk, c->dropout > 0.0f ? "/dropout" : "",
             c->alibi ? "/alibi" : "");
}

// ---- the launch log ----

char *th_capture_log(const char *val, void (*fn)(void *), void *ctx) {
    const char *old_env = getenv("FLASHC_LOG");
    char *old = old_env ? strdup(old_env) : NULL;
    if (val) setenv("FLASHC_LOG", val, 1);
    else unsetenv("FLASHC_LOG");
    fc_log_reload();

    FILE *tmp = tmpfile();
    int saved = dup(2);
    char *text = NULL;
    if (tmp && saved >= 0) {
        fflush(stderr);
        dup2(fileno(tmp), 2);
        fn(ctx);
        fflush(stderr);
        dup2(saved, 2);
        long n = ftell(tmp);
        text = (char *)calloc((size_t)(n > 0 ? n : 0) + 1, 1);
        rewind(tmp);
        if (text && n > 0 && fread(text, 1, (size_t)n, tmp) != (size_t)n) text[0] = '\0';
    }
    if (saved >= 0) close(saved);
    if (tmp) fclose(tmp);

    if (old) setenv("FLASHC_LOG", old, 1);
    else unsetenv("FLASHC_LOG");
    free(old);
    fc_log_reload();
    return text;
}

int th_log_tiles(const char *text, const char *entry, char *buf, size_t n) {
    const char *line = text ? strstr(text, entry) : NULL;
    const char *br = line ? strstr(line, "Br=") : NULL;
    const char *end = br ? strstr(br, " threads=") : NULL;
    const char *tasks = br ? strstr(br, " tasks=") : NULL;
    const char *eol = line ? strchr(line, '\n') : NULL;
    if (tasks && (!end || tasks < end)) end = tasks;
    if (!end || (eol && end > eol) || (size_t)(end - br) >= n) return 0;
    memcpy(buf, br, (size_t)(end - br));
    buf[end - br] = '\0';
    return 1;
}
