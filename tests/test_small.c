/* test_small.c : the CPU forward's small-call path (fwd.c FC_FWD_INLINE_WORK,
 * and FC_FWD_INLINE_KV_BYTES for decode shapes: below them the calling thread
 * runs every task, no worker is woken) and its narrow tiles (decode:
 * FC_FWD_ROW_NQ columns or fewer compute Q K^T by rows).
 *
 * Each case is one problem, decode-shaped (Sq 1..16, GQA groups packed into
 * one task) or causal, of flashc_fwd, flashc_varlen_fwd or flashc_fwd_kvcache
 * over a paged cache with an append, with few keys (under the thresholds) or
 * enough keys to be threaded (4200 for the decode shapes, whose K and V must
 * reach 4 MiB). It runs with 1 thread and with 3: out and lse
 * must be bitwise equal (the algorithm does not depend on the thread count,
 * so the inline path and the pool's agree to the bit), and the launch line of
 * the 3-thread run must say threads=1 under the threshold and threads=3 above
 * it. The results against the float64 reference are test_fwd.c's,
 * test_varlen.c's and test_kvcache.c's decode sweeps.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fc_test.h"
#include "helpers.h"

// ---- cases ----

typedef enum { SM_FWD, SM_VARLEN, SM_KVCACHE } sm_entry;

typedef struct sm_case {
    sm_entry entry;
    flashc_dtype dt;
    int B, Sq, Sk, H, Hk, D;
    int causal;
    int threaded; /* 1: the problem is above the small-call threshold */
} sm_case;

enum { SM_MAX = 64, SM_PAGE = 16 };
static sm_case sm_cases[SM_MAX];
static int sm_ncases;

/* One problem's tensors; a run writes out and lse. */
typedef struct sm_prob {
    flashc_fwd_args f;
    flashc_varlen_fwd_args vl;
    flashc_kvcache_args kv;
    flashc_tensor out, lse;
    th_buf *ob, *lb;
} sm_prob;

static void sm_make(const sm_case *c, th_arena *ar, sm_prob *p) {
    const flashc_dtype dt = c->dt, I32 = FLASHC_DTYPE_INT32;
    const int64_t B = c->B, Sq = c->Sq, Sk = c->Sk, H = c->H, Hk = c->Hk, D = c->D;
    memset(p, 0, sizeof *p);
    p->ob = th_buf_in(ar);
    p->lb = th_buf_in(ar);
    if (c->entry == SM_FWD) {
        p->f.abi = FLASHC_ABI_VERSION;
        p->f.q = th_new(th_buf_in(ar), dt, 4, (int64_t[]){B, Sq, H, D}, TH_CONTIG, -3.0, 3.0);
        p->f.k = th_new(th_buf_in(ar), dt, 4, (int64_t[]){B, Sk, Hk, D}, TH_CONTIG, -1.0, 1.0);
        p->f.v = th_new(th_buf_in(ar), dt, 4, (int64_t[]){B, Sk, Hk, D}, TH_CONTIG, -1.0, 1.0);
        p->out = p->f.out = th_new_out(p->ob, dt, 4, (int64_t[]){B, Sq, H, D}, TH_CONTIG);
        p->lse = p->f.softmax_lse =
            th_new_out(p->lb, FLASHC_DTYPE_FP32, 3, (int64_t[]){B, H, Sq}, TH_CONTIG);
    } else if (c->entry == SM_VARLEN) {
        /* B sequences of Sq queries and Sk - b keys, packed */
        int32_t cq[8], ck[8];
        cq[0] = ck[0] = 0;
        for (int b = 0; b < c->B; b++) {
            cq[b + 1] = cq[b] + c->Sq;
            ck[b + 1] = ck[b] + c->Sk - b;
        }
        p->vl.abi = FLASHC_ABI_VERSION;
        p->vl.q = th_new(th_buf_in(ar), dt, 3, (int64_t[]){cq[B], H, D}, TH_CONTIG, -3.0, 3.0);
        p->vl.k = th_new(th_buf_in(ar), dt, 3, (int64_t[]){ck[B], Hk, D}, TH_CONTIG, -1.0, 1.0);
        p->vl.v = th_new(th_buf_in(ar), dt, 3, (int64_t[]){ck[B], Hk, D}, TH_CONTIG, -1.0, 1.0);
        p->vl.cu_seqlens_q = th_new_i32(th_buf_in(ar), 1, B + 1, cq);
        p->vl.cu_seqlens_k = th_new_i32(th_buf_in(ar), 1, B + 1, ck);
        p->vl.max_seqlen_q = Sq;
        p->vl.max_seqlen_k = Sk;
        p->out = p->vl.out = th_new_out(p->ob, dt, 3, (int64_t[]){cq[B], H, D}, TH_CONTIG);
        p->lse = p->vl.softmax_lse =
            th_new_out(p->lb, FLASHC_DTYPE_FP32, 2, (int64_t[]){H, cq[B]}, TH_CONTIG);
    } else {
        /* a paged cache of Sk rows per sequence, pages in reverse order, holding
           Sk - 1 - b rows before one new row is appended */
        int64_t per = (Sk + SM_PAGE - 1) / SM_PAGE, pages = B * per;
        int32_t *table = th_keep(ar, malloc((size_t)pages * sizeof *table)), lens[8];
        FC_ASSERT_TRUE(table != NULL);
        for (int64_t i = 0; i < pages; i++) table[i] = (int32_t)(pages - 1 - i);
        for (int b = 0; b < c->B; b++) lens[b] = c->Sk - 1 - b;
        int64_t cs[4] = {pages, SM_PAGE, Hk, D}, ns[4] = {B, 1, Hk, D};
        p->kv.abi = FLASHC_ABI_VERSION;
        p->kv.q = th_new(th_buf_in(ar), dt, 4, (int64_t[]){B, Sq, H, D}, TH_CONTIG, -3.0, 3.0);
        p->kv.k_cache = th_new(th_buf_in(ar), dt, 4, cs, TH_CONTIG, -1.0, 1.0);
        p->kv.v_cache = th_new(th_buf_in(ar), dt, 4, cs, TH_CONTIG, -1.0, 1.0);
        p->kv.k_new = th_new(th_buf_in(ar), dt, 4, ns, TH_CONTIG, -1.0, 1.0);
        p->kv.v_new = th_new(th_buf_in(ar), dt, 4, ns, TH_CONTIG, -1.0, 1.0);
        p->kv.cache_seqlens = th_new_i32(th_buf_in(ar), 1, B, lens);
        th_buf *tb = th_buf_in(ar);
        th_buf_new(tb, I32, pages, 0.0, 0.0);
        memcpy(tb->data, table, (size_t)pages * sizeof(int32_t));
        p->kv.block_table = th_view(tb, 0, 2, (int64_t[]){B, per}, (int64_t[]){per, 1});
        p->out = p->kv.out = th_new_out(p->ob, dt, 4, (int64_t[]){B, Sq, H, D}, TH_CONTIG);
        p->lse = p->kv.softmax_lse =
            th_new_out(p->lb, FLASHC_DTYPE_FP32, 3, (int64_t[]){B, H, Sq}, TH_CONTIG);
    }
}

typedef struct sm_run {
    const sm_case *c;
    sm_prob *p;
    flashc_status st;
} sm_run;

static void sm_call(void *ctx) {
    sm_run *r = (sm_run *)ctx;
    flashc_params prm = flashc_params_default();
    prm.causal = r->c->causal;
    r->st = r->c->entry == SM_FWD      ? flashc_fwd(&r->p->f, &prm, NULL, 0)
            : r->c->entry == SM_VARLEN ? flashc_varlen_fwd(&r->p->vl, &prm, NULL, 0)
                                       : flashc_fwd_kvcache(&r->p->kv, &prm, NULL, 0);
}

/* Bytes of the view t (contiguous) copied out. */
static void *sm_copy(th_arena *ar, const flashc_tensor *t) {
    size_t bytes = (size_t)th_numel(t) * flashc_dtype_size(t->dtype);
    void *d = th_keep(ar, malloc(bytes));
    if (d) memcpy(d, t->data, bytes);
    return d;
}

static void sm_body(const sm_case *c, th_arena *ar) {
    sm_prob p;
    sm_make(c, ar, &p);
    sm_run r = {c, &p, FLASHC_ERR_INTERNAL};

    // ---- one thread: the reference result of this test ----
    flashc_set_num_threads(1);
    sm_call(&r);
    FC_ASSERT_OK(r.st);
    void *out1 = sm_copy(ar, &p.out), *lse1 = sm_copy(ar, &p.lse);
    FC_ASSERT_TRUE(out1 && lse1);

    // ---- three threads, poisoned outputs, the launch line captured ----
    th_poison(p.ob, &p.out);
    th_poison(p.lb, &p.lse);
    flashc_set_num_threads(3);
    char *text = th_capture_log("1", sm_call, &r);
    flashc_set_num_threads(0);
    FC_ASSERT_OK(r.st);
    const char *want = c->threaded ? "threads=3" : "threads=1";
    const char *line = text ? strstr(text, "cpu fwd: ") : NULL;
    const char *got = line ? strstr(line, "threads=") : NULL;
    if (!got || strncmp(got, want, strlen(want)) != 0)
        fc_test_fail(__FILE__, __LINE__, "launch line lacks %s: %s", want, text ? text : "(none)");
    free(text);
    size_t nout = (size_t)th_numel(&p.out) * flashc_dtype_size(c->dt);
    size_t nlse = (size_t)th_numel(&p.lse) * sizeof(float);
    if (memcmp(out1, p.out.data, nout) != 0)
        fc_test_fail(__FILE__, __LINE__, "out with 3 threads differs from 1 thread");
    if (memcmp(lse1, p.lse.data, nlse) != 0)
        fc_test_fail(__FILE__, __LINE__, "lse with 3 threads differs from 1 thread");
}

static void sm_run_case(const void *param) {
    th_arena ar = {0};
    sm_body((const sm_case *)param, &ar);
    flashc_set_num_threads(0);
    th_arena_free(&ar);
}

// ---- the sweep ----

static void sm_add(sm_entry e, flashc_dtype dt, int B, int Sq, int Sk, int H, int Hk, int D,
                   int causal) {
    if (sm_ncases == SM_MAX) return; /* table full: grow SM_MAX */
    sm_case *c = &sm_cases[sm_ncases++];
    *c = (sm_case){e, dt, B, Sq, Sk, H, Hk, D, causal, 0};
    /* fwd.c's rules: B H Sq Sk (D + Dv) multiply-adds against 2^18, and for a
       decode shape (Sq G <= 8) B Sk Hk (D + Dv) bytes of K and V against 4 MiB;
       a paged cache counts its block_table's rows */
    int64_t sk = e == SM_KVCACHE ? (Sk + SM_PAGE - 1) / SM_PAGE * SM_PAGE : Sk;
    double kv_bytes = (double)B * sk * Hk * (2.0 * D) * (double)flashc_dtype_size(dt);
    c->threaded = (double)B * H * Sq * sk * (2.0 * D) >= 262144.0 &&
                  !(Sq * (H / Hk) <= 8 && kv_bytes < 4194304.0);
}

FC_TEST_REGISTER(small) {
    static const flashc_dtype dts[2] = {FLASHC_DTYPE_FP32, FLASHC_DTYPE_BF16};
    static const sm_entry entries[3] = {SM_FWD, SM_VARLEN, SM_KVCACHE};
    /* Sq x G (query heads per kv head): tiles of 1, 3, 4, 5, 12 and 16 columns */
    static const int shapes[6][2] = {{1, 1}, {1, 3}, {1, 4}, {5, 1}, {3, 4}, {16, 1}};
    for (int e = 0; e < 3; e++)
        for (int s = 0; s < 6; s++)
            for (int big = 0; big < 2; big++) {
                int Sq = shapes[s][0], G = shapes[s][1], Hk = 2;
                int Sk = !big ? 20 : Sq * G <= 8 ? 4200 : 300;
                sm_add(entries[e], dts[(e + s + big) % 2], 2, Sq, Sk, G * Hk, Hk,
                       64 + 64 * ((s + big) % 2), (e + s) % 2);
            }
    /* decode around the 4 MiB of K and V (2^18 multiply-adds passed either way):
       1000 keys inline, 4200 threaded (above) */
    sm_add(SM_FWD, FLASHC_DTYPE_FP32, 2, 1, 1000, 2, 2, 64, 0);
    /* one query head per kv head: fewer than 16 kv heads run head by head
       (fwd.c fc_fwd_rows_block), 12 of them in one task on one thread, 4 on
       three; 16 and more by columns, whose tasks on three threads hold 10 */
    sm_add(SM_KVCACHE, FLASHC_DTYPE_FP32, 1, 1, 1000, 12, 12, 64, 1);
    sm_add(SM_FWD, FLASHC_DTYPE_FP32, 2, 1, 4200, 16, 16, 64, 0);
    /* causal prefill around the threshold: the diagonal strips of fwd.c */
    sm_add(SM_FWD, FLASHC_DTYPE_FP32, 1, 24, 24, 2, 1, 64, 1);
    sm_add(SM_FWD, FLASHC_DTYPE_BF16, 1, 300, 300, 2, 1, 64, 1);
    for (int i = 0; i < sm_ncases; i++) {
        const sm_case *k = &sm_cases[i];
        static const char *const en[3] = {"fwd", "varlen", "kvcache_paged_append"};
        char name[160];
        snprintf(name, sizeof name, "small/%s/%s/d%d/b%d/sq%d/sk%d/h%d:%d%s/%s", en[k->entry],
                 flashc_dtype_name(k->dt), k->D, k->B, k->Sq, k->Sk, k->H, k->Hk,
                 k->causal ? "/causal" : "", k->threaded ? "threaded" : "inline");
        fc_test_add(name, sm_run_case, k);
    }
}
