/* bwd.c : the CPU attention backward, FlashAttention-2's algorithm by
 * recomputation (Dao 2023, "FlashAttention-2", Algorithm 2), bitwise
 * deterministic for any thread count and schedule.
 *
 * Per sequence b, query head h and its KV head hk = h / G (G = H / Hk), with
 * Br x Bc tiles (Qi, dOi: Br query rows; Kj, Vj: Bc key rows):
 *   S  = Qi Kj^T
 *   P  = exp(z - lse_i)      z = softcap'd scaled score + ALiBi; masked entries
 *                            and rows with lse = -inf give P = 0
 *   dVj += (P o Z)^T dOi     Z: the forward's dropout mask, 0 or 1/(1-p)
 *   dP = (dOi Vj^T) o Z
 *   dS = P o (dP - Delta_i) o (1 - tanh^2)    Delta_i = dO_i . O_i; the last
 *                            factor only with softcap
 *   dKj += scale dS^T Qi,  dQi += scale dS Kj
 * A learnable sink changes none of this (its mass is in lse) and adds
 * dsink_h = -sum_i e^{s_h - lse_i} Delta_i, summed with Delta (derived at
 * fc_bwd_delta_task).
 * Scores are kept in log2 units (times log2 e; the constants: common/score.h,
 * the forward's) and P comes from exp2. All sums
 * are fp32; each output element is written once, in the dtype. Delta is a
 * first pass (fp32, B x H x Sq floats of the workspace).
 *
 * Determinism without atomics: each output element is summed by one task in
 * one fixed order (dQi: key blocks j ascending; dKj, dVj: the query heads of
 * the group, then query blocks i ascending). Two schedules keep that order:
 *   fused     one task per (b, hk) walks h, then j, then i. Qi and dOi of the
 *             head are converted to fp32 once (Sq x D each), dQ of the head
 *             and dK, dV of the KV head accumulate in place (Sq x D and
 *             2 x Sk x D): 5 tile-GEMMs per tile and (3 Sq + 2 Sk) D floats per
 *             thread. Used while the B*Hk tasks keep the threads busy.
 *   two-pass  pass 1, one task per (b, hk, j), sums dKj, dVj; pass 2, one task
 *             per (b, h, i), recomputes S, P, dS and sums dQi: 7 tile-GEMMs per
 *             tile, but B*Hk*Sk/Bc and B*H*Sq/Br tasks, O(tile) per thread.
 * Both make the same GEMM calls (same shapes, same leading dimensions) on the
 * same values in the same order, so they agree bit for bit and the choice,
 * which depends on the thread count, never shows in the result. (The GEMMs of
 * simd_*.c sum each element over k in a fixed order that pointer alignment
 * does not change.)
 *
 * Masks: tiles no row of the tile sees are skipped in both schedules (by the
 * same test); only tiles on the boundary of a causal or local window apply the
 * element mask.
 *
 * Not here: paging (the backward has none; rows are still read through
 * fc_q_row / fc_kv_row), vector code (all of it goes through fc_simd()),
 * argument checks (prepare.c).
 */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "../common/philox.h"
#include "../common/score.h"
#include "pool.h"
#include "simd.h"

/* ---- tile sizes ---- */
/* Br x Bc by head dim: the first row with D <= max_d. A tile's working set
 * (Kj, Vj and the dKj, dVj rows: 4 Bc x D; Qi, dOi, dQi rows: 3 Br x D; S/P,
 * dP: 2 Br x Bc; fp32) stays inside Zen4's 1 MiB L2: 240 KiB at D = 64,
 * 416 KiB at D = 128, 480 KiB at D = 256. Measured on Zen4 (fused schedule,
 * S = 2048, one thread): 64 x 128 beat 64 x 64 by about 5% at D = 128;
 * 64 x 64, 48 x 96 and 32 x 128 tie at D = 256, 32 x 64 was 7% slower; the
 * tiles from 64 x 128 to 128 x 128 tie at D = 64. The GEMMs take ~85% of the
 * time, so the table matters little beyond keeping them in L2. */
typedef struct fc_bwd_tile_size {
    int64_t max_d;
    int br, bc;
} fc_bwd_tile_size;

static const fc_bwd_tile_size fc_bwd_tile_table[] = {
    {64, 64, 128},
    {128, 64, 128},
    {INT64_MAX, 64, 64},
};

/* ---- plan: schedule and workspace layout ---- */
/* Regions of one thread's scratch (sizes 0 where the schedule needs none). */
enum {
    FC_WS_K,      /* (Bc, D) Kj */
    FC_WS_V,      /* (Bc, Dv) Vj */
    FC_WS_P,      /* (Br, Bc) S, then P, then dS */
    FC_WS_DP,     /* (Br, Bc) P o Z, then dP */
    FC_WS_DTANH,  /* (Br, Bc) 1 - tanh^2 (softcap) */
    FC_WS_DROP,   /* (Br, Bc) dropout multipliers Z (0 or 1/(1-p)) */
    FC_WS_LSE,    /* (Br) lse of the tile's rows */
    FC_WS_DELTA,  /* (Br) Delta of the tile's rows */
    FC_WS_Q,      /* fused: (Sq, D) Q of the head; two-pass: (Br, D) Qi; Delta: a row of O (Dv) */
    FC_WS_DO,     /* fused: (Sq, Dv) dO of the head; two-pass: (Br, Dv) dOi */
    FC_WS_DQ,     /* fused: (Sq, D) dQ of the head; two-pass: (Br, D) dQi */
    FC_WS_DK,     /* fused: (Sk, D) dK of the KV head; two-pass: (Bc, D) dKj */
    FC_WS_DV,     /* fused: (Sk, Dv) dV of the KV head; two-pass: (Bc, Dv) dVj */
    FC_WS_COUNT
};

typedef struct fc_bwd_plan {
    int br, bc;          /* tile */
    int64_t d, dv, group; /* D (q, k), Dv (v, out, dout), G = H / Hk */
    int64_t sq, sk;      /* longest query / key sequence */
    int threads;
    bool fused;
    size_t off[FC_WS_COUNT]; /* region offsets inside one thread's scratch */
    size_t thread_bytes;     /* one thread's scratch, a multiple of FLASHC_WORKSPACE_ALIGN */
    size_t delta_off, scratch_off, total;
    size_t dsink_off;        /* with dsink: (B, H) doubles, the sums of each (b, h) */
} fc_bwd_plan;

static int64_t fc_bwd_longest(const fc_attn *a, bool keys) {
    int64_t m = 0;
    for (int64_t b = 0; b < a->batch; b++) {
        int64_t s = keys ? fc_seqlen_k(a, b) : fc_seqlen_q(a, b);
        m = s > m ? s : m;
    }
    return m;
}

/* The fused schedule does 5/7 of the two-pass GEMM work and computes P once,
 * not twice, but has only B*Hk tasks: use it while they keep at least 3/4 of
 * the threads busy over the rounds they take. Then threads <= 4/3 B*Hk, so its
 * scratch, (3 Sq + 2 Sk) D floats per thread, stays below 4 times the fp32
 * size of q plus 3 times that of k. */
static bool fc_bwd_use_fused(const fc_attn *a, int threads) {
    int64_t tasks = a->batch * a->kv_heads;
    if (threads <= 1) return true;
    int64_t rounds = (tasks + threads - 1) / threads;
    return 4 * tasks >= 3 * rounds * (int64_t)threads;
}

/* Fill the plan for the current thread count; returns the workspace bytes. */
static size_t fc_bwd_plan_make(const fc_attn *a, fc_bwd_plan *pl) {
    memset(pl, 0, sizeof *pl);
    int t = 0;
    int64_t dmax = a->head_dim > a->head_dim_v ? a->head_dim : a->head_dim_v;
    while (dmax > fc_bwd_tile_table[t].max_d) t++;
    pl->br = fc_bwd_tile_table[t].br;
    pl->bc = fc_bwd_tile_table[t].bc;
    pl->d = a->head_dim;
    pl->dv = a->head_dim_v;
    pl->group = a->kv_heads > 0 ? a->heads / a->kv_heads : 1;
    pl->sq = fc_bwd_longest(a, false);
    pl->sk = fc_bwd_longest(a, true);
    pl->threads = fc_cpu_num_threads();
    pl->fused = fc_bwd_use_fused(a, pl->threads);

    size_t f = sizeof(float), d = (size_t)pl->d, dv = (size_t)pl->dv;
    size_t br = (size_t)pl->br, bc = (size_t)pl->bc;
    size_t rows_q = pl->fused ? (size_t)pl->sq : br, rows_k = pl->fused ? (size_t)pl->sk : bc;
    size_t sizes[FC_WS_COUNT];
    sizes[FC_WS_K] = bc * d * f;
    sizes[FC_WS_V] = bc * dv * f;
    sizes[FC_WS_P] = sizes[FC_WS_DP] = br * bc * f;
    sizes[FC_WS_DTANH] = a->softcap > 0.0f ? br * bc * f : 0;
    sizes[FC_WS_DROP] = a->dropout_p > 0.0f ? br * bc * f : 0;
    sizes[FC_WS_LSE] = sizes[FC_WS_DELTA] = br * f;
    /* Q also holds one row of out (Dv) in the Delta pass */
    sizes[FC_WS_Q] = (rows_q > 1 ? rows_q : 1) * (d > dv ? d : dv) * f;
    sizes[FC_WS_DQ] = rows_q * d * f;
    sizes[FC_WS_DO] = (rows_q > 1 ? rows_q : 1) * dv * f;
    sizes[FC_WS_DK] = rows_k * d * f;
    sizes[FC_WS_DV] = rows_k * dv * f;
    pl->thread_bytes = fc_ws_layout(FC_WS_COUNT, sizes, pl->off);

    size_t outer[3] = {(size_t)(a->batch * a->heads * pl->sq) * f,
                       (size_t)pl->threads * pl->thread_bytes,
                       a->dsink ? (size_t)(a->batch * a->heads) * sizeof(double) : 0};
    size_t outer_off[3];
    pl->total = fc_ws_layout(3, outer, outer_off);
    pl->delta_off = outer_off[0];
    pl->scratch_off = outer_off[1];
    pl->dsink_off = outer_off[2];
    return pl->total;
}

/* ---- context ---- */
typedef struct fc_bwd_ctx {
    const fc_attn *a;
    const fc_simd_ops *ops;
    fc_bwd_plan pl;
    char *ws;
    float *delta;          /* (B, H, plan.sq) Delta */
    double *dsink_part;    /* (B, H) with dsink: -sum_i P_sink,i Delta_i of (b, h) */
    size_t esize;          /* bytes per element of the dtype */
    fc_score_consts sc;    /* common/score.h: dot product -> z in log2 units, dropout */
    atomic_int bad_thread; /* a pool thread index past plan.threads was seen */
} fc_bwd_ctx;

/* One thread's scratch (fp32, row-major; the (Br, Bc) tiles have leading
 * dimension Bc, the (rows, D) ones D). */
typedef struct fc_bwd_scratch {
    float *k, *v;           /* (Bc, D), (Bc, Dv) */
    float *p, *dp, *dtanh;  /* (Br, Bc) */
    float *drop;            /* (Br, Bc) dropout multipliers Z */
    float *lse, *delta;     /* (Br) */
    float *q, *dout, *dq;   /* (Sq or Br, D); dout: Dv */
    float *dk, *dv;         /* (Sk or Bc, D); dv: Dv */
} fc_bwd_scratch;

static bool fc_bwd_scratch_get(fc_bwd_ctx *c, int thread, fc_bwd_scratch *s) {
    if (thread < 0 || thread >= c->pl.threads) {
        atomic_store(&c->bad_thread, 1);
        return false;
    }
    char *base = c->ws + c->pl.scratch_off + (size_t)thread * c->pl.thread_bytes;
    const size_t *o = c->pl.off;
    s->k = (float *)(base + o[FC_WS_K]);
    s->v = (float *)(base + o[FC_WS_V]);
    s->p = (float *)(base + o[FC_WS_P]);
    s->dp = (float *)(base + o[FC_WS_DP]);
    s->dtanh = (float *)(base + o[FC_WS_DTANH]);
    s->drop = (float *)(base + o[FC_WS_DROP]);
    s->lse = (float *)(base + o[FC_WS_LSE]);
    s->delta = (float *)(base + o[FC_WS_DELTA]);
    s->q = (float *)(base + o[FC_WS_Q]);
    s->dout = (float *)(base + o[FC_WS_DO]);
    s->dq = (float *)(base + o[FC_WS_DQ]);
    s->dk = (float *)(base + o[FC_WS_DK]);
    s->dv = (float *)(base + o[FC_WS_DV]);
    return true;
}

/* ---- rows ---- */
/* Row i of head h of sequence b of a q-like operand (q, out, dout, dq). */
static inline char *fc_bwd_qrow(const fc_bwd_ctx *c, const fc_view *v, int64_t b, int64_t h,
                                int64_t i) {
    return (char *)v->ptr + (fc_q_row(c->a, v, b, i) + h * v->s_head) * (int64_t)c->esize;
}

/* Key row j of KV head hk of sequence b of a k-like operand (k, v, dk, dv). */
static inline char *fc_bwd_kvrow(const fc_bwd_ctx *c, const fc_view *v, int64_t b, int64_t hk,
                                 int64_t j) {
    return (char *)v->ptr + (fc_kv_row(c->a, v, b, j) + hk * v->s_head) * (int64_t)c->esize;
}

static inline float *fc_bwd_delta_row(const fc_bwd_ctx *c, int64_t b, int64_t h) {
    return c->delta + (b * c->a->heads + h) * c->pl.sq;
}

/* Rows [i0, i0 + n) of head h of q and dout as fp32, into q (ld D) and dout
 * (ld Dv). */
static void fc_bwd_load_q(const fc_bwd_ctx *c, int64_t b, int64_t h, int64_t i0, int64_t n,
                          float *q, float *dout) {
    const fc_attn *a = c->a;
    int d = (int)c->pl.d, dv = (int)c->pl.dv;
    for (int64_t r = 0; r < n; r++) {
        float *qr = q + (size_t)r * d, *dor = dout + (size_t)r * dv;
        c->ops->load(a->dtype, d, fc_bwd_qrow(c, &a->q, b, h, i0 + r), qr, 1.0f);
        c->ops->load(a->dtype, dv, fc_bwd_qrow(c, &a->dout, b, h, i0 + r), dor, 1.0f);
    }
}

/* Key rows [j0, j0 + n) of KV head hk as fp32, into s->k (ld D) and s->v
 * (ld Dv). */
static void fc_bwd_load_kv(const fc_bwd_ctx *c, const fc_bwd_scratch *s, int64_t b, int64_t hk,
                           int64_t j0, int n) {
    const fc_attn *a = c->a;
    int d = (int)c->pl.d, dv = (int)c->pl.dv;
    for (int r = 0; r < n; r++) {
        float *kr = s->k + (size_t)r * d, *vr = s->v + (size_t)r * dv;
        c->ops->load(a->dtype, d, fc_bwd_kvrow(c, &a->k, b, hk, j0 + r), kr, 1.0f);
        c->ops->load(a->dtype, dv, fc_bwd_kvrow(c, &a->v, b, hk, j0 + r), vr, 1.0f);
    }
}

/* Store dQ rows (n, D) of src, times scale, as rows [i0, i0 + n) of head h. */
static void fc_bwd_store_dq(const fc_bwd_ctx *c, int64_t b, int64_t h, int64_t i0, int64_t n,
                            const float *src) {
    const fc_attn *a = c->a;
    int d = (int)c->pl.d;
    for (int64_t r = 0; r < n; r++)
        c->ops->store(a->dtype, d, src + (size_t)r * d, fc_bwd_qrow(c, &a->dq, b, h, i0 + r),
                      a->scale);
}

/* Store dK rows (n, D) times scale and dV rows (n, Dv) as key rows
 * [j0, j0 + n) of hk. */
static void fc_bwd_store_dkdv(const fc_bwd_ctx *c, int64_t b, int64_t hk, int64_t j0, int64_t n,
                              const float *dk, const float *dv) {
    const fc_attn *a = c->a;
    int d = (int)c->pl.d, dvd = (int)c->pl.dv;
    for (int64_t r = 0; r < n; r++) {
        c->ops->store(a->dtype, d, dk + (size_t)r * d, fc_bwd_kvrow(c, &a->dk, b, hk, j0 + r),
                      a->scale);
        c->ops->store(a->dtype, dvd, dv + (size_t)r * dvd, fc_bwd_kvrow(c, &a->dv, b, hk, j0 + r),
                      1.0f);
    }
}

/* lse and Delta of rows [i0, i0 + n) of head h, into s->lse and s->delta. */
static void fc_bwd_load_stats(const fc_bwd_ctx *c, const fc_bwd_scratch *s, int64_t b, int64_t h,
                              int64_t i0, int n) {
    const float *delta = fc_bwd_delta_row(c, b, h);
    for (int r = 0; r < n; r++) {
        s->lse[r] = c->a->lse[fc_lse_index(c->a, b, h, i0 + r)];
        s->delta[r] = delta[i0 + r];
    }
}

/* ---- preprocess: Delta_i = dO_i . O_i ---- */
static void fc_bwd_delta_task(void *ctx, int64_t task, int thread) {
    fc_bwd_ctx *c = (fc_bwd_ctx *)ctx;
    const fc_attn *a = c->a;
    fc_bwd_scratch s;
    if (!fc_bwd_scratch_get(c, thread, &s)) return;
    int64_t b = task / a->heads, h = task % a->heads, sq = fc_seqlen_q(a, b);
    int d = (int)c->pl.dv; /* dO_i . O_i over Dv */
    float *delta = fc_bwd_delta_row(c, b, h);
    for (int64_t i = 0; i < sq; i++) {
        c->ops->load(a->dtype, d, fc_bwd_qrow(c, &a->dout, b, h, i), s.dout, 1.0f);
        c->ops->load(a->dtype, d, fc_bwd_qrow(c, &a->out, b, h, i), s.q, 1.0f);
        float acc = 0.0f;
        for (int e = 0; e < d; e++) acc += s.dout[e] * s.q[e];
        delta[i] = acc;
    }
    /* dsink. O_i = sum_j P_ij Z_ij v_j (Z: dropout's 0 or 1/(1-p)) with
     * P_ij = e^{x_ij - lse_i}, lse_i = log(e^s + sum_j e^{x_ij}), so
     * d lse_i / ds = e^{s - lse_i} = P_sink,i and d P_ij / ds = -P_ij P_sink,i:
     *   dL/ds = sum_ij (dL/dP_ij) (d P_ij / ds),  dL/dP_ij = dO_i . Z_ij v_j,
     *         = -sum_i P_sink,i dO_i . (sum_j P_ij Z_ij v_j) = -sum_i P_sink,i Delta_i.
     * A row that saw no key has O_i = 0, so Delta_i = 0;
     * an lse of -inf (a sink of -inf and no key) adds nothing. Summed in double
     * per (b, h) here, over b in order at the end: deterministic. */
    if (c->dsink_part) {
        double sum = 0.0, sink = (double)fc_sink_logit(a, h);
        for (int64_t i = 0; i < sq; i++) {
            double lse = (double)a->lse[fc_lse_index(a, b, h, i)];
            if (lse != -INFINITY) sum += exp(sink - lse) * (double)delta[i];
        }
        c->dsink_part[task] = -sum;
    }
}

/* ---- one tile ---- */
typedef enum { FC_TILE_SKIP, FC_TILE_FULL, FC_TILE_EDGE } fc_tile_kind;

/* How rows [i0, i1) meet keys [j0, j1). Visible ranges [lo(i), hi(i)) are
 * non-decreasing in i, so the rows see at most keys [lo(i0), hi(i1-1)), and
 * all of [j0, j1) when lo(i1-1) <= j0 and hi(i0) >= j1. */
static fc_tile_kind fc_bwd_tile_kind(const fc_attn *a, int64_t sq, int64_t sk, int64_t i0,
                                     int64_t i1, int64_t j0, int64_t j1) {
    int64_t lo0, hi0, lo1, hi1;
    fc_key_range(a, sq, sk, i0, &lo0, &hi0);
    fc_key_range(a, sq, sk, i1 - 1, &lo1, &hi1);
    if (hi1 <= j0 || lo0 >= j1 || lo0 >= hi1) return FC_TILE_SKIP;
    if (lo1 <= j0 && hi0 >= j1) return FC_TILE_FULL;
    return FC_TILE_EDGE;
}

/* One tile: rows i0 .. i0+br-1 of head h, key columns j0 .. j0+bc-1. */
typedef struct fc_bwd_tile {
    int64_t b, h, sq, sk, i0, j0;
    int br, bc;
    fc_tile_kind kind;
} fc_bwd_tile;

/* s->p holds Qi Kj^T: turn it into P; with dropout fill s->drop, with softcap
 * s->dtanh. */
static void fc_bwd_probs(const fc_bwd_ctx *c, const fc_bwd_scratch *s, const fc_bwd_tile *t) {
    const fc_attn *a = c->a;
    const fc_simd_ops *ops = c->ops;
    int ld = c->pl.bc, br = t->br, bc = t->bc;
    /* x = z log2(e). Element (r, col) has d = j - diag(i) = d0 - r + col. */
    fc_score_mod mod = {0.0f, fc_alibi_slope(a, t->b, t->h) * c->sc.log2e,
                        t->j0 - FC_WINDOW_DIAG(t->i0, t->sq, t->sk), -1, 1, -1, -1};
    if (t->kind == FC_TILE_EDGE) {
        mod.wl = a->window_left;
        mod.wr = a->window_right;
    }
    if (a->softcap > 0.0f) {
        /* x = softcap log2(e) tanh(s / softcap), then 1 - tanh^2 from x */
        fc_score_mod cap = {c->sc.cap_log2, 0.0f, 0, -1, 1, -1, -1};
        for (int r = 0; r < br; r++) ops->scale(bc, s->p + (size_t)r * ld, c->sc.qk_tanh);
        ops->score_mod(br, bc, s->p, ld, &cap);
        float inv = 1.0f / c->sc.cap_log2;
        for (int r = 0; r < br; r++) {
            const float *x = s->p + (size_t)r * ld;
            float *dt = s->dtanh + (size_t)r * ld;
            for (int col = 0; col < bc; col++) dt[col] = 1.0f - (x[col] * inv) * (x[col] * inv);
        }
    } else {
        for (int r = 0; r < br; r++) ops->scale(bc, s->p + (size_t)r * ld, c->sc.qk_log2);
    }
    if (mod.slope != 0.0f || t->kind == FC_TILE_EDGE) ops->score_mod(br, bc, s->p, ld, &mod);

    uint32_t bh = (uint32_t)(t->b * a->heads + t->h);
    for (int r = 0; r < br; r++) {
        float *x = s->p + (size_t)r * ld;
        float lse = s->lse[r];
        if (lse == -INFINITY) { /* the row saw no key: P = 0, and P o Z = 0 */
            memset(x, 0, (size_t)bc * sizeof(float));
            if (a->dropout_p > 0.0f)
                memset(s->drop + (size_t)r * ld, 0, (size_t)bc * sizeof(float));
            continue;
        }
        ops->exp2_sum(bc, x, lse * c->sc.log2e);
        if (a->dropout_p > 0.0f) {
            /* one Philox call per group of 8 key columns (flashc.h, "Dropout") */
            float *zr = s->drop + (size_t)r * ld;
            for (int64_t j = t->j0 & ~(int64_t)7; j < t->j0 + bc; j += 8) {
                fc_philox4 rnd = fc_dropout_group(a->seed, a->offset, bh, (uint32_t)(t->i0 + r),
                                                  (uint64_t)j >> 3);
                for (int w = 0; w < 8; w++) {
                    int64_t col = j + w - t->j0;
                    if (col >= 0 && col < bc)
                        zr[col] = fc_dropout_word(rnd, w) >= c->sc.drop_threshold ? c->sc.drop_scale
                                                                                  : 0.0f;
                }
            }
        }
    }
}

/* s->p holds P, s->dp holds dOi Vj^T: overwrite s->p with dS (without the
 * factor scale, which the stores of dQ and dK apply). A row that sees one key
 * gets dS = 0 when that key's P is at least FC_ONE_KEY_P, or when the key is
 * in another tile (P = 0 here): common/window.h's one-key rule. With a
 * learnable sink the row's P is below 1 and the formula applies (the rule is
 * off): the sink takes no value, so for one key (no dropout) Delta = P dP and
 * dS = P (1 - P) dP != 0. */
static void fc_bwd_dscores(const fc_bwd_ctx *c, const fc_bwd_scratch *s, const fc_bwd_tile *t) {
    int ld = c->pl.bc;
    bool dropout = c->a->dropout_p > 0.0f, cap = c->a->softcap > 0.0f;
    for (int r = 0; r < t->br; r++) {
        if (s->lse[r] == -INFINITY) continue; /* P = 0, so dS = 0 */
        float *p = s->p + (size_t)r * ld;
        int64_t lo, hi;
        fc_key_range(c->a, t->sq, t->sk, t->i0 + r, &lo, &hi);
        if (!c->a->sink && hi - lo == 1 &&
            (lo < t->j0 || lo >= t->j0 + t->bc || p[lo - t->j0] >= FC_ONE_KEY_P)) {
            memset(p, 0, (size_t)t->bc * sizeof(float));
            continue;
        }
        const float *dp = s->dp + (size_t)r * ld;
        float delta = s->delta[r];
        if (dropout) {
            const float *zr = s->drop + (size_t)r * ld;
            for (int col = 0; col < t->bc; col++) p[col] *= dp[col] * zr[col] - delta;
        } else {
            for (int col = 0; col < t->bc; col++) p[col] *= dp[col] - delta;
        }
        if (cap) {
            const float *dt = s->dtanh + (size_t)r * ld;
            for (int col = 0; col < t->bc; col++) p[col] *= dt[col];
        }
    }
}

/* Recompute S and P of the tile, then dP and dS (into s->p). q, dout: the
 * tile's rows (Br, D); s->k, s->v, s->lse, s->delta are loaded. With
 * dv != NULL, first dv (Bc, Dv) += (P o Z)^T dOi (dout rows: Dv). */
static void fc_bwd_tile_ds(const fc_bwd_ctx *c, const fc_bwd_scratch *s, const fc_bwd_tile *t,
                           const float *q, const float *dout, float *dv) {
    const fc_simd_ops *ops = c->ops;
    int d = (int)c->pl.d, dvd = (int)c->pl.dv, ld = c->pl.bc, br = t->br, bc = t->bc;
    ops->gemm_nt(br, bc, d, q, d, s->k, d, s->p, ld, 0);
    fc_bwd_probs(c, s, t);
    if (dv) {
        const float *pz = s->p;
        if (c->a->dropout_p > 0.0f) {
            for (int r = 0; r < br; r++) {
                const float *p = s->p + (size_t)r * ld, *zr = s->drop + (size_t)r * ld;
                float *pz_row = s->dp + (size_t)r * ld;
                for (int col = 0; col < bc; col++) pz_row[col] = p[col] * zr[col];
            }
            pz = s->dp;
        }
        ops->gemm_tn(bc, dvd, br, pz, ld, dout, dvd, dv, dvd, 1);
    }
    ops->gemm_nt(br, bc, dvd, dout, dvd, s->v, dvd, s->dp, ld, 0);
    fc_bwd_dscores(c, s, t);
}

/* ---- fused schedule: one task per (b, hk) ---- */
static void fc_bwd_fused_task(void *ctx, int64_t task, int thread) {
    fc_bwd_ctx *c = (fc_bwd_ctx *)ctx;
    const fc_attn *a = c->a;
    const fc_simd_ops *ops = c->ops;
    fc_bwd_scratch s;
    if (!fc_bwd_scratch_get(c, thread, &s)) return;
    fc_bwd_tile t;
    t.b = task / a->kv_heads;
    int64_t hk = task % a->kv_heads;
    t.sq = fc_seqlen_q(a, t.b);
    t.sk = fc_seqlen_k(a, t.b);
    int d = (int)c->pl.d, dvd = (int)c->pl.dv, ld = c->pl.bc;
    /* s.q, s.dq: (sq, D) and s.dout: (sq, Dv) of head h; s.dk: (sk, D) and
     * s.dv: (sk, Dv) of hk */
    memset(s.dk, 0, (size_t)t.sk * d * sizeof(float));
    memset(s.dv, 0, (size_t)t.sk * dvd * sizeof(float));
    for (int64_t g = 0; g < c->pl.group; g++) {
        t.h = hk * c->pl.group + g;
        fc_bwd_load_q(c, t.b, t.h, 0, t.sq, s.q, s.dout);
        memset(s.dq, 0, (size_t)t.sq * d * sizeof(float));
        for (t.j0 = 0; t.j0 < t.sk; t.j0 += ld) {
            t.bc = (int)(t.sk - t.j0 < ld ? t.sk - t.j0 : ld);
            bool loaded = false;
            for (t.i0 = 0; t.i0 < t.sq; t.i0 += c->pl.br) {
                t.br = (int)(t.sq - t.i0 < c->pl.br ? t.sq - t.i0 : c->pl.br);
                t.kind = fc_bwd_tile_kind(a, t.sq, t.sk, t.i0, t.i0 + t.br, t.j0, t.j0 + t.bc);
                if (t.kind == FC_TILE_SKIP) continue;
                if (!loaded) fc_bwd_load_kv(c, &s, t.b, hk, t.j0, t.bc);
                loaded = true;
                const float *q = s.q + (size_t)t.i0 * d, *dout = s.dout + (size_t)t.i0 * dvd;
                float *dk = s.dk + (size_t)t.j0 * d, *dv = s.dv + (size_t)t.j0 * dvd;
                fc_bwd_load_stats(c, &s, t.b, t.h, t.i0, t.br);
                fc_bwd_tile_ds(c, &s, &t, q, dout, dv);
                ops->gemm_tn(t.bc, d, t.br, s.p, ld, q, d, dk, d, 1);
                ops->gemm_nn(t.br, d, t.bc, s.p, ld, s.k, d, s.dq + (size_t)t.i0 * d, d, 1);
            }
        }
        fc_bwd_store_dq(c, t.b, t.h, 0, t.sq, s.dq);
    }
    fc_bwd_store_dkdv(c, t.b, hk, 0, t.sk, s.dk, s.dv);
}

/* ---- two-pass schedule ---- */
/* Pass 1: task = (key block, b, hk), key block 0 first: under a causal mask
 * it meets the most query rows, so the long tasks start early. */
static void fc_bwd_dkdv_task(void *ctx, int64_t task, int thread) {
    fc_bwd_ctx *c = (fc_bwd_ctx *)ctx;
    const fc_attn *a = c->a;
    const fc_simd_ops *ops = c->ops;
    fc_bwd_scratch s;
    if (!fc_bwd_scratch_get(c, thread, &s)) return;
    int64_t nbhk = a->batch * a->kv_heads, bhk = task % nbhk;
    int64_t hk = bhk % a->kv_heads;
    int d = (int)c->pl.d, dvd = (int)c->pl.dv, ld = c->pl.bc;
    fc_bwd_tile t;
    t.b = bhk / a->kv_heads;
    t.sq = fc_seqlen_q(a, t.b);
    t.sk = fc_seqlen_k(a, t.b);
    t.j0 = task / nbhk * ld;
    if (t.j0 >= t.sk) return;
    t.bc = (int)(t.sk - t.j0 < ld ? t.sk - t.j0 : ld);
    fc_bwd_load_kv(c, &s, t.b, hk, t.j0, t.bc);
    memset(s.dk, 0, (size_t)t.bc * d * sizeof(float));
    memset(s.dv, 0, (size_t)t.bc * dvd * sizeof(float));
    for (int64_t g = 0; g < c->pl.group; g++) {
        t.h = hk * c->pl.group + g;
        for (t.i0 = 0; t.i0 < t.sq; t.i0 += c->pl.br) {
            t.br = (int)(t.sq - t.i0 < c->pl.br ? t.sq - t.i0 : c->pl.br);
            t.kind = fc_bwd_tile_kind(a, t.sq, t.sk, t.i0, t.i0 + t.br, t.j0, t.j0 + t.bc);
            if (t.kind == FC_TILE_SKIP) continue;
            fc_bwd_load_q(c, t.b, t.h, t.i0, t.br, s.q, s.dout);
            fc_bwd_load_stats(c, &s, t.b, t.h, t.i0, t.br);
            fc_bwd_tile_ds(c, &s, &t, s.q, s.dout, s.dv);
            ops->gemm_tn(t.bc, d, t.br, s.p, ld, s.q, d, s.dk, d, 1);
        }
    }
    fc_bwd_store_dkdv(c, t.b, hk, t.j0, t.bc, s.dk, s.dv);
}

/* Pass 2: task = (query block, b, h), last query block first (the longest
 * under a causal mask). dQi sums over key blocks ascending, as the fused
 * schedule does. */
static void fc_bwd_dq_task(void *ctx, int64_t task, int thread) {
    fc_bwd_ctx *c = (fc_bwd_ctx *)ctx;
    const fc_attn *a = c->a;
    const fc_simd_ops *ops = c->ops;
    fc_bwd_scratch s;
    if (!fc_bwd_scratch_get(c, thread, &s)) return;
    int64_t nbh = a->batch * a->heads, nbq = (c->pl.sq + c->pl.br - 1) / c->pl.br;
    int64_t bh = task % nbh;
    int d = (int)c->pl.d, ld = c->pl.bc;
    fc_bwd_tile t;
    t.b = bh / a->heads;
    t.h = bh % a->heads;
    t.sq = fc_seqlen_q(a, t.b);
    t.sk = fc_seqlen_k(a, t.b);
    t.i0 = (nbq - 1 - task / nbh) * c->pl.br;
    if (t.i0 >= t.sq) return;
    t.br = (int)(t.sq - t.i0 < c->pl.br ? t.sq - t.i0 : c->pl.br);
    int64_t hk = t.h / c->pl.group;
    fc_bwd_load_q(c, t.b, t.h, t.i0, t.br, s.q, s.dout);
    fc_bwd_load_stats(c, &s, t.b, t.h, t.i0, t.br);
    memset(s.dq, 0, (size_t)t.br * d * sizeof(float));
    for (t.j0 = 0; t.j0 < t.sk; t.j0 += ld) {
        t.bc = (int)(t.sk - t.j0 < ld ? t.sk - t.j0 : ld);
        t.kind = fc_bwd_tile_kind(a, t.sq, t.sk, t.i0, t.i0 + t.br, t.j0, t.j0 + t.bc);
        if (t.kind == FC_TILE_SKIP) continue;
        fc_bwd_load_kv(c, &s, t.b, hk, t.j0, t.bc);
        fc_bwd_tile_ds(c, &s, &t, s.q, s.dout, NULL);
        ops->gemm_nn(t.br, d, t.bc, s.p, ld, s.k, d, s.dq, d, 1);
    }
    fc_bwd_store_dq(c, t.b, t.h, t.i0, t.br, s.dq);
}

/* ---- entry points ---- */
size_t fc_cpu_bwd_workspace(const fc_attn *a) {
    fc_bwd_plan pl;
    return fc_bwd_plan_make(a, &pl);
}

flashc_status fc_cpu_bwd(const fc_attn *a, void *ws, size_t ws_bytes) {
    fc_bwd_ctx c;
    memset(&c, 0, sizeof c);
    size_t need = fc_bwd_plan_make(a, &c.pl);
    if (ws_bytes < need || (need > 0 && !ws))
        return fc_set_error(FLASHC_ERR_WORKSPACE_TOO_SMALL,
                            "workspace_bytes=%zu but %zu are needed", ws ? ws_bytes : (size_t)0,
                            need);
    c.a = a;
    c.ops = fc_simd();
    c.ws = (char *)ws;
    c.delta = (float *)(c.ws + c.pl.delta_off);
    c.dsink_part = a->dsink ? (double *)(c.ws + c.pl.dsink_off) : NULL;
    c.esize = flashc_dtype_size(a->dtype);
    c.sc = fc_score_consts_of(a);
    atomic_init(&c.bad_thread, 0);

    FC_LOG("cpu bwd: simd=%s schedule=%s Br=%d Bc=%d threads=%d",
           flashc_simd_name(flashc_simd_active()), c.pl.fused ? "fused" : "dkdv+dq", c.pl.br,
           c.pl.bc, c.pl.threads);
    fc_pool_run(a->batch * a->heads, fc_bwd_delta_task, &c);
    if (c.pl.fused) {
        fc_pool_run(a->batch * a->kv_heads, fc_bwd_fused_task, &c);
    } else {
        int64_t nbk = (c.pl.sk + c.pl.bc - 1) / c.pl.bc, nbq = (c.pl.sq + c.pl.br - 1) / c.pl.br;
        fc_pool_run(a->batch * a->kv_heads * nbk, fc_bwd_dkdv_task, &c);
        fc_pool_run(a->batch * a->heads * nbq, fc_bwd_dq_task, &c);
    }
    if (c.dsink_part)
        for (int64_t h = 0; h < a->heads; h++) {
            double sum = 0.0;
            for (int64_t b = 0; b < a->batch; b++) sum += c.dsink_part[b * a->heads + h];
            a->dsink[h * a->dsink_s] = (float)sum;
        }
    if (atomic_load(&c.bad_thread))
        return fc_set_error(FLASHC_ERR_INTERNAL,
                            "the thread count changed during the call (planned for %d threads)",
                            c.pl.threads);
    return FLASHC_OK;
}
