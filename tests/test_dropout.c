/* test_dropout.c : the dropout mask against the specification in flashc.h.
 *
 * Philox4x32-10 and the element-to-counter mapping are written here again from
 * the paper and from the header's text (not through src/common/philox.h), so the
 * library and this file can disagree. The mapping: element (b, h, i, j) is
 * dropped iff u16 < (uint32_t)(p * 65536 + 0.5), u16 being 16-bit word j % 8 of
 * Philox4x32-10 under key (lo32(seed), hi32(seed)) of the counter
 * (lo32(c), hi32(c), i, b*H + h), c = offset + j / 8, word w = (out[w/2] >>
 * (16 * (w%2))) & 0xffff.
 *
 * Checks: the generator's known answers (Random123's kat_vectors), the sign
 * pattern of attn_probs (batched, varlen, with masks, offsets that carry into
 * the high word) against this generator for both the reference and the
 * library, the drop rate, and that offsets ceil(Sk/8) apart draw different masks
 * while equal offsets draw the same.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/reference.h"
#include "fc_test.h"
#include "helpers.h"

// ---- Philox4x32-10 (Salmon et al., SC'11) ----

typedef struct { uint32_t v[4]; } dr_block;

static dr_block dr_philox(const uint32_t ctr[4], const uint32_t key[2]) {
    uint32_t x0 = ctr[0], x1 = ctr[1], x2 = ctr[2], x3 = ctr[3], k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        if (round) { /* the key schedule: Weyl sequence of the golden ratio and sqrt(3) - 1 */
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        uint64_t p0 = (uint64_t)0xD2511F53u * x0, p1 = (uint64_t)0xCD9E8D57u * x2;
        uint32_t y0 = (uint32_t)(p1 >> 32) ^ x1 ^ k0, y1 = (uint32_t)p1;
        uint32_t y2 = (uint32_t)(p0 >> 32) ^ x3 ^ k1, y3 = (uint32_t)p0;
        x0 = y0;
        x1 = y1;
        x2 = y2;
        x3 = y3;
    }
    dr_block r = {{x0, x1, x2, x3}};
    return r;
}

/* 1 if element (bh = b*H + h, row i, column j) is dropped. */
static int dr_dropped(uint64_t seed, uint64_t offset, uint32_t bh, uint32_t i, uint64_t j,
                      float p) {
    uint64_t c = offset + j / 8;
    uint32_t ctr[4] = {(uint32_t)c, (uint32_t)(c >> 32), i, bh};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    dr_block r = dr_philox(ctr, key);
    unsigned w = (unsigned)(j % 8);
    uint32_t u16 = (r.v[w / 2] >> (16 * (w % 2))) & 0xffffu;
    return u16 < (uint32_t)(p * 65536 + 0.5);
}

FC_TEST(dropout_philox_known_answers) {
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
        {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0x408f276du,
         0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu},
        {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u, 0xd16cfe09u,
         0x94fdccebu, 0x5001e420u, 0x24126ea1u},
    };
    for (int t = 0; t < 3; t++) {
        dr_block r = dr_philox(kat[t], kat[t] + 4);
        for (int w = 0; w < 4; w++) FC_EXPECT_EQ(r.v[w], kat[t][6 + w]);
    }
}

// ---- a batched forward that returns attn_probs ----

typedef struct dr_problem {
    flashc_dtype dt;
    int B, Sq, Sk, H, Hk, D;
    int causal;
    float p;
    uint64_t seed, offset;
} dr_problem;

/* Dense attn_probs [B, H, Sq, Sk] of the library (lib) or of the reference for
 * the args a made by dr_args. */
static double *dr_probs(th_arena *ar, const dr_problem *pr, const flashc_fwd_args *a, int lib,
                        flashc_status *st) {
    flashc_params p = flashc_params_default();
    p.causal = pr->causal;
    p.dropout_p = pr->p;
    p.dropout_seed = pr->seed;
    p.dropout_offset = pr->offset;
    int64_t np = (int64_t)pr->B * pr->H * pr->Sq * pr->Sk;
    double *probs = th_dbl(ar, np);
    if (!lib) {
        *st = fc_ref_fwd(a, &p, FC_REF_F64, NULL, NULL, probs);
        return probs;
    }
    th_poison(&ar->bufs[3], &a->attn_probs); /* dr_args put attn_probs in bufs[3] */
    size_t bytes = 0;
    *st = flashc_fwd_workspace_size(a, &p, &bytes);
    if (*st != FLASHC_OK) return probs;
    void *ws = th_ws_new(bytes);
    *st = flashc_fwd(a, &p, ws, bytes);
    th_ws_free(ws, bytes);
    double *got = th_to_double(&a->attn_probs);
    memcpy(probs, got, (size_t)np * sizeof(double));
    free(got);
    return probs;
}

/* The args of pr in ar: bufs[0..2] q, k, v, bufs[3] attn_probs, bufs[4] out. */
static flashc_fwd_args dr_args(th_arena *ar, const dr_problem *pr) {
    flashc_fwd_args a;
    memset(&a, 0, sizeof a);
    a.abi = FLASHC_ABI_VERSION;
    int64_t qs[4] = {pr->B, pr->Sq, pr->H, pr->D}, ks[4] = {pr->B, pr->Sk, pr->Hk, pr->D};
    a.q = th_new(th_buf_in(ar), pr->dt, 4, qs, TH_CONTIG, -3.0, 3.0);
    a.k = th_new(th_buf_in(ar), pr->dt, 4, ks, TH_CONTIG, -1.0, 1.0);
    a.v = th_new(th_buf_in(ar), pr->dt, 4, ks, TH_CONTIG, -1.0, 1.0);
    a.attn_probs = th_new_out(th_buf_in(ar), FLASHC_DTYPE_FP32, 4,
                              (int64_t[]){pr->B, pr->H, pr->Sq, pr->Sk}, TH_CONTIG);
    a.out = th_new_out(th_buf_in(ar), pr->dt, 4, qs, TH_CONTIG);
    return a;
}

/* Signs of probs against dr_dropped: mismatches, and visible elements that are 0
 * (whose sign cannot tell). */
static void dr_compare(const char *who, const dr_problem *pr, const double *probs) {
    int64_t wrong = 0, zero = 0, first = -1;
    for (int64_t b = 0; b < pr->B; b++)
        for (int64_t h = 0; h < pr->H; h++)
            for (int64_t i = 0; i < pr->Sq; i++)
                for (int64_t j = 0; j < pr->Sk; j++) {
                    if (pr->causal && j > i + pr->Sk - pr->Sq) continue;
                    int64_t e = ((b * pr->H + h) * pr->Sq + i) * pr->Sk + j;
                    if (probs[e] == 0.0 || isnan(probs[e])) {
                        zero++;
                        continue;
                    }
                    int want = dr_dropped(pr->seed, pr->offset, (uint32_t)(b * pr->H + h),
                                          (uint32_t)i, (uint64_t)j, pr->p);
                    if ((probs[e] < 0.0) != want) {
                        if (first < 0) first = e;
                        wrong++;
                    }
                }
    if (wrong)
        fc_test_fail(__FILE__, __LINE__,
                     "%s: %lld dropout decisions differ from the spec (first at %lld)", who,
                     (long long)wrong, (long long)first);
    if (zero)
        fc_test_fail(__FILE__, __LINE__, "%s: %lld visible probabilities are 0 or NaN", who,
                     (long long)zero);
}

// ---- sign patterns ----

static dr_problem dr_sign_cases[4] = {
    {FLASHC_DTYPE_FP32, 2, 37, 45, 3, 3, 32, 0, 0.17f, 0x0123456789abcdefull, 5},
    {FLASHC_DTYPE_BF16, 1, 113, 257, 2, 1, 64, 0, 0.5f, 0xfedcba9800000001ull, 0xfffffff0ull},
    {FLASHC_DTYPE_FP16, 2, 17, 1000, 2, 2, 16, 0, 0.03f, 42, 0x1ffffffceull},
    {FLASHC_DTYPE_BF16, 2, 64, 64, 4, 2, 32, 1, 0.17f, 7, 0},
};

static void dr_signs_run(const void *param) {
    const dr_problem *pr = (const dr_problem *)param;
    th_arena ar = {0};
    flashc_fwd_args a = dr_args(&ar, pr);
    flashc_status st;
    double *ref = dr_probs(&ar, pr, &a, 0, &st);
    FC_EXPECT_STATUS(st, FLASHC_OK);
    dr_compare("reference", pr, ref);
    double *got = dr_probs(&ar, pr, &a, 1, &st);
    FC_EXPECT_STATUS(st, FLASHC_OK);
    if (st == FLASHC_OK) dr_compare("flashc_fwd", pr, got);
    th_arena_free(&ar);
}

FC_TEST_REGISTER(dropout_signs) {
    for (int i = 0; i < 4; i++) {
        const dr_problem *pr = &dr_sign_cases[i];
        char name[200];
        snprintf(name, sizeof name, "dropout/signs/%s/b%d/sq%d/sk%d/h%d:%d/p%g/offset%llx%s",
                 flashc_dtype_name(pr->dt), pr->B, pr->Sq, pr->Sk, pr->H, pr->Hk, pr->p,
                 (unsigned long long)pr->offset, pr->causal ? "/causal" : "");
        fc_test_add(name, dr_signs_run, pr);
    }
}

// ---- varlen: b is the sequence, i the row within it ----

FC_TEST(dropout_varlen_signs) {
    enum { NS = 3, H = 2, D = 16 };
    static const int32_t cuq[NS + 1] = {0, 20, 21, 61}, cuk[NS + 1] = {0, 33, 50, 100};
    const int64_t tq = cuq[NS], tk = cuk[NS], maxq = 40, maxk = 50;
    th_arena ar = {0};
    flashc_varlen_fwd_args a;
    memset(&a, 0, sizeof a);
    a.abi = FLASHC_ABI_VERSION;
    a.q = th_new(th_buf_in(&ar), FLASHC_DTYPE_FP32, 3, (int64_t[]){tq, H, D}, TH_CONTIG, -3.0, 3.0);
    a.k = th_new(th_buf_in(&ar), FLASHC_DTYPE_FP32, 3, (int64_t[]){tk, H, D}, TH_CONTIG, -1.0, 1.0);
    a.v = th_new(th_buf_in(&ar), FLASHC_DTYPE_FP32, 3, (int64_t[]){tk, H, D}, TH_CONTIG, -1.0, 1.0);
    a.out = th_new_out(th_buf_in(&ar), FLASHC_DTYPE_FP32, 3, (int64_t[]){tq, H, D}, TH_CONTIG);
    a.cu_seqlens_q = th_new_i32(th_buf_in(&ar), 1, NS + 1, cuq);
    a.cu_seqlens_k = th_new_i32(th_buf_in(&ar), 1, NS + 1, cuk);
    a.max_seqlen_q = maxq;
    a.max_seqlen_k = maxk;
    a.attn_probs =
        th_new_out(th_buf_in(&ar), FLASHC_DTYPE_FP32, 4, (int64_t[]){NS, H, maxq, maxk}, TH_CONTIG);
    flashc_params p = flashc_params_default();
    p.dropout_p = 0.17f;
    p.dropout_seed = 0x5eed5eed12345678ull;
    p.dropout_offset = 1234567;
    double *probs[2];
    probs[0] = th_dbl(&ar, NS * H * maxq * maxk);
    FC_EXPECT_STATUS(fc_ref_varlen_fwd(&a, &p, FC_REF_F64, NULL, NULL, probs[0]), FLASHC_OK);
    size_t bytes = 0;
    flashc_status st = flashc_varlen_fwd_workspace_size(&a, &p, &bytes);
    if (st == FLASHC_OK) {
        void *ws = th_ws_new(bytes);
        st = flashc_varlen_fwd(&a, &p, ws, bytes);
        th_ws_free(ws, bytes);
    }
    FC_EXPECT_STATUS(st, FLASHC_OK);
    probs[1] = (double *)th_keep(&ar, th_to_double(&a.attn_probs));
    for (int who = 0; who < (st == FLASHC_OK ? 2 : 1); who++) {
        int64_t wrong = 0, zero = 0;
        for (int64_t b = 0; b < NS; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < cuq[b + 1] - cuq[b]; i++)
                    for (int64_t j = 0; j < cuk[b + 1] - cuk[b]; j++) {
                        double v = probs[who][((b * H + h) * maxq + i) * maxk + j];
                        if (v == 0.0 || isnan(v)) {
                            zero++;
                            continue;
                        }
                        wrong += (v < 0.0) != dr_dropped(p.dropout_seed, p.dropout_offset,
                                                         (uint32_t)(b * H + h), (uint32_t)i,
                                                         (uint64_t)j, p.dropout_p);
                    }
        if (wrong || zero)
            fc_test_fail(__FILE__, __LINE__,
                         "%s: %lld dropout decisions differ, %lld probabilities 0 or NaN",
                         who ? "flashc_varlen_fwd" : "reference", (long long)wrong,
                         (long long)zero);
    }
    th_arena_free(&ar);
}

// ---- rate and offsets ----

FC_TEST(dropout_rate) {
    static const float ps[2] = {0.17f, 0.5f};
    for (int t = 0; t < 2; t++) {
        dr_problem pr = {FLASHC_DTYPE_FP32, 2, 128, 256, 4, 4, 8, 0, ps[t], fc_rand_u64(),
                         fc_rand_u64() >> 8};
        th_arena ar = {0};
        flashc_fwd_args a = dr_args(&ar, &pr);
        flashc_status st;
        double *got = dr_probs(&ar, &pr, &a, 1, &st);
        FC_EXPECT_STATUS(st, FLASHC_OK);
        if (st == FLASHC_OK) {
            int64_t n = (int64_t)pr.B * pr.H * pr.Sq * pr.Sk, dropped = 0, rows_bad = 0;
            for (int64_t e = 0; e < n; e++) dropped += got[e] < 0.0;
            /* each row of |probs| is a softmax: it sums to 1 */
            for (int64_t r = 0; r < n / pr.Sk; r++) {
                double s = 0.0;
                for (int64_t j = 0; j < pr.Sk; j++) s += fabs(got[r * pr.Sk + j]);
                rows_bad += !(fabs(s - 1.0) < 1e-4);
            }
            double rate = (double)dropped / (double)n;
            double want = (double)(uint32_t)(pr.p * 65536 + 0.5) / 65536.0;
            double sigma = sqrt(want * (1.0 - want) / (double)n);
            FC_EXPECT_NEAR(rate, want, 5.0 * sigma);
            FC_EXPECT_NEAR(rate, pr.p, 0.01);
            FC_EXPECT_EQ(rows_bad, 0);
        }
        th_arena_free(&ar);
    }
}

FC_TEST(dropout_offsets) {
    dr_problem pr = {FLASHC_DTYPE_FP32, 1, 64, 200, 2, 2, 8, 0, 0.17f, fc_rand_u64(), 1000};
    th_arena ar = {0};
    flashc_fwd_args a = dr_args(&ar, &pr);
    flashc_status st[3];
    double *m[3];
    m[0] = dr_probs(&ar, &pr, &a, 1, &st[0]);
    m[1] = dr_probs(&ar, &pr, &a, 1, &st[1]);
    pr.offset += (pr.Sk + 7) / 8;
    m[2] = dr_probs(&ar, &pr, &a, 1, &st[2]);
    for (int i = 0; i < 3; i++) FC_EXPECT_STATUS(st[i], FLASHC_OK);
    if (st[0] == FLASHC_OK && st[1] == FLASHC_OK && st[2] == FLASHC_OK) {
        int64_t n = (int64_t)pr.B * pr.H * pr.Sq * pr.Sk, same_off = 0, other_off = 0;
        for (int64_t e = 0; e < n; e++) {
            same_off += (m[0][e] < 0.0) != (m[1][e] < 0.0);
            other_off += (m[0][e] < 0.0) != (m[2][e] < 0.0);
        }
        /* independent masks disagree on a fraction 2p(1-p) of the elements */
        double frac = (double)other_off / (double)n, want = 2.0 * 0.17 * 0.83;
        FC_EXPECT_EQ(same_off, 0);
        FC_EXPECT_NEAR(frac, want, 0.03);
    }
    th_arena_free(&ar);
}
