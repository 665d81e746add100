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
 * bf16 on a path with bf16 dot products (AVX512_BF16, simd.h): the five
 * products run on vdpbf16ps, twice the fp32 rate, with fp32 sums. Qi, dOi, Kj,
 * Vj are the inputs as they are, in pairs along the head dim (S, dP: the nt
 * form) and in pairs of rows (dV, dK: tn; dQ: nn); P o Z and dS are rounded to
 * bf16 before their products, as FlashAttention-2 does on the GPU (and as the
 * tests' same-precision baseline does), while Delta and the dS formula use the
 * fp32 P and dP. fp32 stays on the fp32 GEMMs, and so does fp16 but on AMX.
 *
 * fp16 on AMX tiles (the amx path, plan.split): the same pairs, each operand as
 * bf16 hi + lo (simd.h's split: exact for the fp16 inputs, ~16 bits for P o Z
 * and dS) and each product as three tile products, hi hi' + hi lo' + lo hi'.
 * When q, k, v, out or dout hold inf or NaN (inf x 0 in a cross product
 * would be NaN) the whole call takes the fp32 products instead: the Delta
 * pass looks (fc_bwd_delta_task), so every schedule makes the same choice.
 *
 * Masks: tiles no row of the tile sees are skipped in both schedules (by the
 * same test); only tiles on the boundary of a causal or local window apply the
 * element mask. A boundary tile runs in sub-blocks of FC_BWD_SUB query rows
 * (S, dP, dQ) and FC_BWD_SUB keys (dV, dK), each over the span of keys or rows
 * it can see (fc_bwd_blocks_make): on the causal diagonal of Sq = Sk the two
 * boundary tiles of a key block (64 x 128) do 5/16 and 13/16 of their GEMM
 * work, against 1/4 and 3/4 unmasked. What a span leaves out is masked, so its S
 * and dP are set to 0 (P = 0 and dS = 0 after the mask).
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

/* At most FC_BWD_BR_MAX x FC_BWD_BC_MAX (the sub-block tables of a tile), Br even
 * (pairs of rows of the bf16 products start on an even row). */
enum { FC_BWD_BR_MAX = 128, FC_BWD_BC_MAX = 256 };
static const fc_bwd_tile_size fc_bwd_tile_table[] = {
    {64, 64, 128},
    {128, 64, 128},
    {INT64_MAX, 64, 64},
};
/* bf16 on AMX tiles (the amx path): each product's operand copies (B^T of the
 * nt products, A^T of the tn ones, fc_amx_gemm) serve more of the tile at
 * 128 x 128. Measured on the 2-core Intel VM with AMX (2 MB L2 a core), S =
 * 2k, one thread, D 64/128/256 against the table's tiles: non-causal 0.98,
 * 0.98, 0.89x the time, causal 0.98, 0.98, 0.89x; 128 x 256 was 0.84-0.92x
 * without a mask but 1.05-1.07x with a causal one at D <= 128 (bench/NOTES.md). */
static const fc_bwd_tile_size fc_bwd_amx_tiles = {INT64_MAX, 128, 128};
/* So 128 x FC_BWD_AMX_WIDE_BC where no mask is set (checked here) and simd.h's
 * fc_amx_big_tiles allows (two such key blocks a KV head, enough of them for the
 * threads: the two-pass schedule's first pass takes one a task): bf16, S 1k-2k,
 * 0.93-0.98x the time (bench/NOTES.md, session 39); 256 x 256 and 64 x 256 were
 * slower. */
enum { FC_BWD_AMX_WIDE_BC = 256 };

static fc_bwd_tile_size fc_bwd_amx_pick(const fc_attn *a) {
    fc_bwd_tile_size t = fc_bwd_amx_tiles;
    if (a->window_left < 0 && a->window_right < 0 &&
        fc_amx_big_tiles(a->max_seqlen_k, FC_BWD_AMX_WIDE_BC, 2, a->batch * a->kv_heads))
        t.bc = FC_BWD_AMX_WIDE_BC;
    return t;
}

/* ---- plan: schedule and workspace layout ---- */
/* Regions of one thread's scratch (sizes 0 where the schedule needs none). */
enum {
    FC_WS_K,      /* (Bc, D) Kj */
    FC_WS_V,      /* (Bc, Dv) Vj */
    FC_WS_P,      /* (Br, Bc) S, then P, then dS */
    FC_WS_DP,     /* (Br, Bc) P o Z, then dP */
    FC_WS_DTANH,  /* (Br, Bc) 1 - tanh^2 (softcap) */
    FC_WS_PS2R,   /* bf16: (Br/2, Bc) P o Z, then dS, in pairs of rows */
    FC_WS_DS2K,   /* bf16: (Br, Bc/2) dS in pairs of keys */
    FC_WS_DROP,   /* (Br, Bc) dropout multipliers Z (0 or 1/(1-p)) */
    FC_WS_LSE,    /* (Br) lse of the tile's rows */
    FC_WS_DELTA,  /* (Br) Delta of the tile's rows */
    /* K, V, Q, DO hold fp32 rows, or with bf16 dot products (plan.dot) the
     * operands in pairs (fc_bwd_scratch); bf16 problems size them for both */
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
    bool dot;                /* bf16 dot products (fc_bwd_use_dot) */
    bool split;              /* fp16 as bf16 hi + lo on AMX tiles (simd.h's fc_split_runs) */
    bool pairs;              /* dot or split: the operands in bf16 pairs */
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
 * size of q plus 3 times that of k (fp16 split on AMX: Q's and dO's pairs,
 * hi and lo, take twice their fp32 rows, (5 Sq + 2 Sk) D: below 7 times q's). */
static bool fc_bwd_use_fused(const fc_attn *a, int threads) {
    int64_t tasks = a->batch * a->kv_heads;
    if (threads <= 1) return true;
    int64_t rounds = (tasks + threads - 1) / threads;
    return 4 * tasks >= 3 * rounds * (int64_t)threads;
}

/* The bf16 dot-product kernels of the path, when they apply (simd.h). */
static bool fc_bwd_use_dot(const fc_attn *a, const fc_simd_ops *ops) {
    return a->dtype == FLASHC_DTYPE_BF16 && ops->gemm_bf16_nn && ops->gemm_bf16_tn &&
           ops->gemm_bf16_nt && ops->pack_pairs &&
           (flashc_cpu_features() & ops->bf16_cpu) == ops->bf16_cpu;
}

static size_t fc_bwd_max_size(size_t x, size_t y) { return x > y ? x : y; }

/* Fill the plan for the current thread count and SIMD path ops; returns the
 * workspace bytes, which do not depend on the path. */
static size_t fc_bwd_plan_make(const fc_attn *a, const fc_simd_ops *ops, fc_bwd_plan *pl) {
    memset(pl, 0, sizeof *pl);
    int t = 0;
    int64_t dmax = a->head_dim > a->head_dim_v ? a->head_dim : a->head_dim_v;
    while (dmax > fc_bwd_tile_table[t].max_d) t++;
    pl->dot = fc_bwd_use_dot(a, ops);
    pl->split = fc_split_runs(a, ops); /* the forward's rule (simd.h) */
    pl->pairs = pl->dot || pl->split;
    bool amx = (pl->dot && ops->level == FLASHC_SIMD_AMX) || pl->split;
    fc_bwd_tile_size tile = amx ? fc_bwd_amx_pick(a) : fc_bwd_tile_table[t];
    pl->br = tile.br;
    pl->bc = tile.bc;
    /* the sizes below reserve, on a CPU with AMX, the larger of both tiles for
     * bf16 and fp16 (and fp16's pairs, hi and lo), so that the workspace is the
     * same on every path */
    int rbr = pl->br, rbc = pl->bc;
    bool fp16_amx = fc_split_problem(a);
    if ((a->dtype == FLASHC_DTYPE_BF16 && fc_simd_amx_possible()) || fp16_amx) {
        fc_bwd_tile_size o = amx ? fc_bwd_tile_table[t] : fc_bwd_amx_pick(a);
        rbr = o.br > rbr ? o.br : rbr;
        rbc = o.bc > rbc ? o.bc : rbc;
    }
    pl->d = a->head_dim;
    pl->dv = a->head_dim_v;
    pl->group = a->kv_heads > 0 ? a->heads / a->kv_heads : 1;
    pl->sq = fc_bwd_longest(a, false);
    pl->sk = fc_bwd_longest(a, true);
    pl->threads = fc_cpu_num_threads();
    pl->fused = fc_bwd_use_fused(a, pl->threads);

    size_t f = sizeof(float), d = (size_t)pl->d, dv = (size_t)pl->dv;
    size_t br = (size_t)rbr, bc = (size_t)rbc;
    size_t rows_q = pl->fused ? (size_t)pl->sq : br, rows_k = pl->fused ? (size_t)pl->sk : bc;
    /* bf16 pairs (uint32): along D and Dv, and of rows; fp16's: hi, then lo */
    size_t u = a->dtype == FLASHC_DTYPE_BF16 ? sizeof(uint32_t)
               : fp16_amx                     ? 2 * sizeof(uint32_t)
                                              : 0;
    size_t d2 = (d + 1) / 2, dv2 = (dv + 1) / 2, bc2 = (bc + 1) / 2, br2 = (br + 1) / 2;
    size_t rows_q2 = (rows_q + 1) / 2;
    size_t sizes[FC_WS_COUNT];
    sizes[FC_WS_K] = fc_bwd_max_size(bc * d * f, (bc * d2 + bc2 * d) * u);
    sizes[FC_WS_V] = fc_bwd_max_size(bc * dv * f, bc * dv2 * u);
    sizes[FC_WS_P] = sizes[FC_WS_DP] = br * bc * f;
    sizes[FC_WS_DTANH] = a->softcap > 0.0f ? br * bc * f : 0;
    sizes[FC_WS_PS2R] = br2 * bc * u;
    sizes[FC_WS_DS2K] = br * bc2 * u;
    sizes[FC_WS_DROP] = a->dropout_p > 0.0f ? br * bc * f : 0;
    sizes[FC_WS_LSE] = sizes[FC_WS_DELTA] = br * f;
    /* Q also holds one row of out (Dv) in the Delta pass */
    sizes[FC_WS_Q] = fc_bwd_max_size((rows_q > 1 ? rows_q : 1) * (d > dv ? d : dv) * f,
                                     (rows_q * d2 + rows_q2 * d) * u);
    sizes[FC_WS_DQ] = rows_q * d * f;
    sizes[FC_WS_DO] = fc_bwd_max_size((rows_q > 1 ? rows_q : 1) * dv * f,
                                      (rows_q * dv2 + rows_q2 * dv) * u);
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
    atomic_int nonfinite;  /* plan.split: an input holds inf or NaN (fc_bwd_delta_task) */
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
    /* bf16 pairs (plan.pairs), in the regions of k, v, q, dout; D2, Dv2:
     * (D + 1) / 2, (Dv + 1) / 2 pairs (an odd length ends in a zero half);
     * rows: Sq (fused) or Br (two-pass); pairs of rows: (2p, 2p + 1) */
    uint32_t *k2d, *k2r;    /* (Bc, D2) Kj; (Bc/2, D) pairs of its rows */
    uint32_t *v2d;          /* (Bc, Dv2) Vj */
    uint32_t *q2d, *q2r;    /* (rows, D2) Q; (rows/2, D) pairs of its rows */
    uint32_t *do2d, *do2r;  /* (rows, Dv2) dO; (rows/2, Dv) pairs of its rows */
    uint32_t *ps2r;         /* (Br/2, Bc) P o Z, then dS, pairs of rows */
    uint32_t *ds2k;         /* (Br, Bc/2) dS, pairs of keys */
    /* plan.split: the lo halves of each, laid out as its hi (NULL otherwise) */
    uint32_t *k2d_lo, *k2r_lo, *v2d_lo, *q2d_lo, *q2r_lo, *do2d_lo, *do2r_lo, *ps2r_lo, *ds2k_lo;
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
    size_t rows = (size_t)(c->pl.fused ? c->pl.sq : c->pl.br);
    size_t d = (size_t)c->pl.d, dv = (size_t)c->pl.dv;
    s->k2d = (uint32_t *)s->k;
    s->k2r = s->k2d + (size_t)c->pl.bc * ((d + 1) / 2);
    s->v2d = (uint32_t *)s->v;
    s->q2d = (uint32_t *)s->q;
    s->q2r = s->q2d + rows * ((d + 1) / 2);
    s->do2d = (uint32_t *)s->dout;
    s->do2r = s->do2d + rows * ((dv + 1) / 2);
    s->ps2r = (uint32_t *)(base + o[FC_WS_PS2R]);
    s->ds2k = (uint32_t *)(base + o[FC_WS_DS2K]);
    s->k2d_lo = s->k2r_lo = s->v2d_lo = s->q2d_lo = s->q2r_lo = NULL;
    s->do2d_lo = s->do2r_lo = s->ps2r_lo = s->ds2k_lo = NULL;
    if (c->pl.split) { /* each lo after its region's hi */
        size_t bc = (size_t)c->pl.bc, br = (size_t)c->pl.br, d2 = (d + 1) / 2, dv2 = (dv + 1) / 2;
        s->k2d_lo = s->k2d + bc * d2 + (bc + 1) / 2 * d;
        s->k2r_lo = s->k2d_lo + bc * d2;
        s->v2d_lo = s->v2d + bc * dv2;
        s->q2d_lo = s->q2d + rows * d2 + (rows + 1) / 2 * d;
        s->q2r_lo = s->q2d_lo + rows * d2;
        s->do2d_lo = s->do2d + rows * dv2 + (rows + 1) / 2 * dv;
        s->do2r_lo = s->do2d_lo + rows * dv2;
        s->ps2r_lo = s->ps2r + (br + 1) / 2 * bc;
        s->ds2k_lo = s->ds2k + br * ((bc + 1) / 2);
    }
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

/* A bf16 row of n elements as (n + 1) / 2 pairs: an odd n ends in a zero half. */
static void fc_bwd_row_pairs(const void *src, int n, uint32_t *dst) {
    memcpy(dst, src, (size_t)n * sizeof(uint16_t));
    if (n & 1) ((uint16_t *)dst)[n] = 0;
}

/* Rows [i0, i0 + n) of head h of q and dout into the scratch's first rows: as
 * fp32 into s->q (ld D) and s->dout (ld Dv), or (plan.dot) as pairs into
 * q2d, q2r, do2d, do2r. i0 is even, so the pairs of rows are the same for the
 * whole head (fused) and for a tile (two-pass). */
static void fc_bwd_load_q(const fc_bwd_ctx *c, const fc_bwd_scratch *s, int64_t b, int64_t h,
                          int64_t i0, int64_t n) {
    const fc_attn *a = c->a;
    int d = (int)c->pl.d, dv = (int)c->pl.dv;
    if (c->pl.split) {
        size_t d2 = (size_t)(d + 1) / 2, dv2 = (size_t)(dv + 1) / 2;
        for (int64_t r = 0; r < n; r++) {
            const void *q = fc_bwd_qrow(c, &a->q, b, h, i0 + r);
            const void *dout = fc_bwd_qrow(c, &a->dout, b, h, i0 + r);
            c->ops->split(FLASHC_DTYPE_FP16, d, q, NULL, 0, s->q2d + (size_t)r * d2,
                          s->q2d_lo + (size_t)r * d2);
            c->ops->split(FLASHC_DTYPE_FP16, dv, dout, NULL, 0, s->do2d + (size_t)r * dv2,
                          s->do2d_lo + (size_t)r * dv2);
        }
        for (int64_t r = 0; r < n; r += 2) {
            bool odd = r + 1 == n; /* the last row of an odd count pairs with zeros */
            size_t qo = (size_t)(r / 2) * d, doo = (size_t)(r / 2) * dv;
            c->ops->split(FLASHC_DTYPE_FP16, d, fc_bwd_qrow(c, &a->q, b, h, i0 + r),
                          odd ? NULL : fc_bwd_qrow(c, &a->q, b, h, i0 + r + 1), 1, s->q2r + qo,
                          s->q2r_lo + qo);
            c->ops->split(FLASHC_DTYPE_FP16, dv, fc_bwd_qrow(c, &a->dout, b, h, i0 + r),
                          odd ? NULL : fc_bwd_qrow(c, &a->dout, b, h, i0 + r + 1), 1,
                          s->do2r + doo, s->do2r_lo + doo);
        }
        return;
    }
    if (c->pl.dot) {
        size_t d2 = (size_t)(d + 1) / 2, dv2 = (size_t)(dv + 1) / 2;
        for (int64_t r = 0; r < n; r++) {
            fc_bwd_row_pairs(fc_bwd_qrow(c, &a->q, b, h, i0 + r), d, s->q2d + (size_t)r * d2);
            fc_bwd_row_pairs(fc_bwd_qrow(c, &a->dout, b, h, i0 + r), dv, s->do2d + (size_t)r * dv2);
        }
        for (int64_t r = 0; r < n; r += 2) {
            bool odd = r + 1 == n; /* the last row of an odd count pairs with zeros */
            c->ops->pack_pairs(FLASHC_DTYPE_BF16, d, fc_bwd_qrow(c, &a->q, b, h, i0 + r),
                               odd ? NULL : fc_bwd_qrow(c, &a->q, b, h, i0 + r + 1),
                               s->q2r + (size_t)(r / 2) * d);
            c->ops->pack_pairs(FLASHC_DTYPE_BF16, dv, fc_bwd_qrow(c, &a->dout, b, h, i0 + r),
                               odd ? NULL : fc_bwd_qrow(c, &a->dout, b, h, i0 + r + 1),
                               s->do2r + (size_t)(r / 2) * dv);
        }
        return;
    }
    for (int64_t r = 0; r < n; r++) {
        float *qr = s->q + (size_t)r * d, *dor = s->dout + (size_t)r * dv;
        c->ops->load(a->dtype, d, fc_bwd_qrow(c, &a->q, b, h, i0 + r), qr, 1.0f);
        c->ops->load(a->dtype, dv, fc_bwd_qrow(c, &a->dout, b, h, i0 + r), dor, 1.0f);
    }
}

/* Key rows [j0, j0 + n) of KV head hk: as fp32 into s->k (ld D) and s->v
 * (ld Dv), or (plan.dot) as pairs into k2d, k2r, v2d. */
static void fc_bwd_load_kv(const fc_bwd_ctx *c, const fc_bwd_scratch *s, int64_t b, int64_t hk,
                           int64_t j0, int n) {
    const fc_attn *a = c->a;
    int d = (int)c->pl.d, dv = (int)c->pl.dv;
    if (c->pl.split) {
        size_t d2 = (size_t)(d + 1) / 2, dv2 = (size_t)(dv + 1) / 2;
        for (int r = 0; r < n; r++) {
            const void *k = fc_bwd_kvrow(c, &a->k, b, hk, j0 + r);
            const void *v = fc_bwd_kvrow(c, &a->v, b, hk, j0 + r);
            c->ops->split(FLASHC_DTYPE_FP16, d, k, NULL, 0, s->k2d + (size_t)r * d2,
                          s->k2d_lo + (size_t)r * d2);
            c->ops->split(FLASHC_DTYPE_FP16, dv, v, NULL, 0, s->v2d + (size_t)r * dv2,
                          s->v2d_lo + (size_t)r * dv2);
        }
        for (int r = 0; r < n; r += 2)
            c->ops->split(FLASHC_DTYPE_FP16, d, fc_bwd_kvrow(c, &a->k, b, hk, j0 + r),
                          r + 1 == n ? NULL : fc_bwd_kvrow(c, &a->k, b, hk, j0 + r + 1), 1,
                          s->k2r + (size_t)(r / 2) * d, s->k2r_lo + (size_t)(r / 2) * d);
        return;
    }
    if (c->pl.dot) {
        size_t d2 = (size_t)(d + 1) / 2, dv2 = (size_t)(dv + 1) / 2;
        for (int r = 0; r < n; r++) {
            fc_bwd_row_pairs(fc_bwd_kvrow(c, &a->k, b, hk, j0 + r), d, s->k2d + (size_t)r * d2);
            fc_bwd_row_pairs(fc_bwd_kvrow(c, &a->v, b, hk, j0 + r), dv, s->v2d + (size_t)r * dv2);
        }
        for (int r = 0; r < n; r += 2)
            c->ops->pack_pairs(FLASHC_DTYPE_BF16, d, fc_bwd_kvrow(c, &a->k, b, hk, j0 + r),
                               r + 1 == n ? NULL : fc_bwd_kvrow(c, &a->k, b, hk, j0 + r + 1),
                               s->k2r + (size_t)(r / 2) * d);
        return;
    }
    for (int r = 0; r < n; r++) {
        float *kr = s->k + (size_t)r * d, *vr = s->v + (size_t)r * dv;
        c->ops->load(a->dtype, d, fc_bwd_kvrow(c, &a->k, b, hk, j0 + r), kr, 1.0f);
        c->ops->load(a->dtype, dv, fc_bwd_kvrow(c, &a->v, b, hk, j0 + r), vr, 1.0f);
    }
}

/* The query-side operands of a tile whose first row is row r (even) of the
 * scratch: fp32 rows, or (plan.dot) bf16 pairs. */
typedef struct fc_bwd_qops {
    const float *q, *dout;                   /* (Br, D), (Br, Dv) */
    const uint32_t *q2d, *q2r, *do2d, *do2r; /* as in fc_bwd_scratch */
    const uint32_t *q2d_lo, *q2r_lo, *do2d_lo, *do2r_lo; /* plan.split: their lo halves */
} fc_bwd_qops;

static fc_bwd_qops fc_bwd_qops_at(const fc_bwd_ctx *c, const fc_bwd_scratch *s, int64_t r) {
    size_t d = (size_t)c->pl.d, dv = (size_t)c->pl.dv, rr = (size_t)r;
    fc_bwd_qops x = {NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    if (c->pl.pairs) {
        x.q2d = s->q2d + rr * ((d + 1) / 2);
        x.q2r = s->q2r + rr / 2 * d;
        x.do2d = s->do2d + rr * ((dv + 1) / 2);
        x.do2r = s->do2r + rr / 2 * dv;
    }
    if (c->pl.split) {
        x.q2d_lo = s->q2d_lo + rr * ((d + 1) / 2);
        x.q2r_lo = s->q2r_lo + rr / 2 * d;
        x.do2d_lo = s->do2d_lo + rr * ((dv + 1) / 2);
        x.do2r_lo = s->do2r_lo + rr / 2 * dv;
    }
    if (!c->pl.pairs) {
        x.q = s->q + rr * d;
        x.dout = s->dout + rr * dv;
    }
    return x;
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
    bool finite = true;
    for (int64_t i = 0; i < sq; i++) {
        c->ops->load(a->dtype, d, fc_bwd_qrow(c, &a->dout, b, h, i), s.dout, 1.0f);
        c->ops->load(a->dtype, d, fc_bwd_qrow(c, &a->out, b, h, i), s.q, 1.0f);
        float acc = 0.0f;
        for (int e = 0; e < d; e++) acc += s.dout[e] * s.q[e];
        delta[i] = acc;
        finite = finite && isfinite(acc); /* not, where dout or out is (16-bit: no overflow) */
    }
    /* plan.split: q's rows of head h, and k's and v's of its kv head (the group's
     * first head looks), inf or NaN (split's answer; its halves go to the
     * regions of q, k, v, where their first row of pairs would) */
    if (c->pl.split) {
        int dq = (int)c->pl.d, dvv = (int)c->pl.dv;
        uint32_t *q2 = (uint32_t *)s.q, *k2 = (uint32_t *)s.k, *v2 = (uint32_t *)s.v;
        int64_t hk = h / c->pl.group, sk = fc_seqlen_k(a, b);
        for (int64_t i = 0; finite && i < sq; i++)
            finite = !c->ops->split(FLASHC_DTYPE_FP16, dq, fc_bwd_qrow(c, &a->q, b, h, i), NULL,
                                    0, q2, q2 + (dq + 1) / 2);
        for (int64_t j = 0; finite && h % c->pl.group == 0 && j < sk; j++)
            finite = !c->ops->split(FLASHC_DTYPE_FP16, dq, fc_bwd_kvrow(c, &a->k, b, hk, j), NULL,
                                    0, k2, k2 + (dq + 1) / 2) &&
                     !c->ops->split(FLASHC_DTYPE_FP16, dvv, fc_bwd_kvrow(c, &a->v, b, hk, j),
                                    NULL, 0, v2, v2 + (dvv + 1) / 2);
        if (!finite) atomic_store(&c->nonfinite, 1);
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
        if (!c->pl.pairs) /* (the pairs' GEMM applied it) */
            for (int r = 0; r < br; r++) ops->scale(bc, s->p + (size_t)r * ld, c->sc.qk_tanh);
        ops->score_mod(br, bc, s->p, ld, &cap);
        float inv = 1.0f / c->sc.cap_log2;
        for (int r = 0; r < br; r++) {
            const float *x = s->p + (size_t)r * ld;
            float *dt = s->dtanh + (size_t)r * ld;
            for (int col = 0; col < bc; col++) dt[col] = 1.0f - (x[col] * inv) * (x[col] * inv);
        }
    } else if (!c->pl.pairs) {
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
 * in another tile (P = 0 here): common/window.h's one-key rule, for 16-bit
 * dtypes only (fp32's residue is its own rounding, 2^-24). With a
 * learnable sink the row's P is below 1 and the formula applies (the rule is
 * off): the sink takes no value, so for one key (no dropout) Delta = P dP and
 * dS = P (1 - P) dP != 0. */
static void fc_bwd_dscores(const fc_bwd_ctx *c, const fc_bwd_scratch *s, const fc_bwd_tile *t) {
    int ld = c->pl.bc;
    bool dropout = c->a->dropout_p > 0.0f, cap = c->a->softcap > 0.0f;
    bool one_key_rule = !c->a->sink && c->a->dtype != FLASHC_DTYPE_FP32;
    for (int r = 0; r < t->br; r++) {
        if (s->lse[r] == -INFINITY) continue; /* P = 0, so dS = 0 */
        float *p = s->p + (size_t)r * ld;
        int64_t lo, hi;
        fc_key_range(c->a, t->sq, t->sk, t->i0 + r, &lo, &hi);
        if (one_key_rule && hi - lo == 1 &&
            (lo < t->j0 || lo >= t->j0 + t->bc || p[lo - t->j0] >= FC_ONE_KEY_P)) {
            memset(p, 0, (size_t)t->bc * sizeof(float));
            continue;
        }
        c->ops->ds_row(t->bc, p, s->dp + (size_t)r * ld, dropout ? s->drop + (size_t)r * ld : NULL,
                       cap ? s->dtanh + (size_t)r * ld : NULL, s->delta[r]);
    }
}

/* ---- sub-blocks of a boundary tile ---- */
enum { FC_BWD_SUB = 16 }; /* query rows, and keys, of a sub-block */

/* Rows [r0, r1) and key columns [c0, c1) of the tile: a query sub-block with
 * the keys its rows can see, or a key sub-block with the rows that can see
 * it. The start of the inner dimension (c0 of a query sub-block, r0 of a key
 * sub-block) is even, for the pairs of the bf16 products. */
typedef struct fc_bwd_block {
    int r0, r1, c0, c1;
} fc_bwd_block;

typedef struct fc_bwd_blocks {
    int nq, nk;
    fc_bwd_block q[FC_BWD_BR_MAX / FC_BWD_SUB]; /* S, dP, dQ */
    fc_bwd_block k[FC_BWD_BC_MAX / FC_BWD_SUB]; /* dV, dK */
} fc_bwd_blocks;

static int fc_bwd_clamp(int64_t x, int hi) { return x < 0 ? 0 : x > hi ? hi : (int)x; }

/* A full tile is one block of both kinds. For a boundary tile, with row r
 * seeing columns [lo(r), hi(r)) (both non-decreasing in r, fc_bwd_tile_kind),
 * query sub-block [r0, r1) sees at most [lo(r0), hi(r1 - 1)) and key sub-block
 * [c0, c1) is seen at most by rows from the first with hi > c0 to the last with
 * lo < c1. An empty span becomes [0, 0). */
static void fc_bwd_blocks_make(const fc_attn *a, const fc_bwd_tile *t, fc_bwd_blocks *bl) {
    if (t->kind == FC_TILE_FULL) {
        bl->nq = bl->nk = 1;
        bl->q[0] = bl->k[0] = (fc_bwd_block){0, t->br, 0, t->bc};
        return;
    }
    int lo[FC_BWD_BR_MAX], hi[FC_BWD_BR_MAX];
    for (int r = 0; r < t->br; r++) {
        int64_t l, h;
        fc_key_range(a, t->sq, t->sk, t->i0 + r, &l, &h);
        lo[r] = fc_bwd_clamp(l - t->j0, t->bc);
        hi[r] = fc_bwd_clamp(h - t->j0, t->bc);
    }
    bl->nq = (t->br + FC_BWD_SUB - 1) / FC_BWD_SUB;
    for (int g = 0; g < bl->nq; g++) {
        fc_bwd_block *q = &bl->q[g];
        q->r0 = g * FC_BWD_SUB;
        q->r1 = q->r0 + FC_BWD_SUB < t->br ? q->r0 + FC_BWD_SUB : t->br;
        q->c0 = lo[q->r0] & ~1;
        q->c1 = hi[q->r1 - 1];
        if (q->c1 <= lo[q->r0]) q->c0 = q->c1 = 0;
    }
    bl->nk = (t->bc + FC_BWD_SUB - 1) / FC_BWD_SUB;
    for (int g = 0; g < bl->nk; g++) {
        fc_bwd_block *k = &bl->k[g];
        k->c0 = g * FC_BWD_SUB;
        k->c1 = k->c0 + FC_BWD_SUB < t->bc ? k->c0 + FC_BWD_SUB : t->bc;
        int r0 = 0, r1 = t->br;
        while (r0 < t->br && hi[r0] <= k->c0) r0++;
        while (r1 > r0 && lo[r1 - 1] >= k->c1) r1--;
        k->r0 = r0 & ~1;
        k->r1 = r1;
        if (r1 <= r0) k->r0 = k->r1 = 0;
    }
}

/* Zero row r0 .. r1 - 1 of x (ld) outside columns [c0, c1), up to bc. */
static void fc_bwd_zero_outside(float *x, int ld, int bc, const fc_bwd_block *q) {
    for (int r = q->r0; r < q->r1; r++) {
        float *row = x + (size_t)r * ld;
        memset(row, 0, (size_t)q->c0 * sizeof(float));
        memset(row + q->c1, 0, (size_t)(bc - q->c1) * sizeof(float));
    }
}

/* x (br, bc; ld Bc) rounded to bf16 in pairs of rows into dst (ld Bc): the
 * operand A of a tn product; with lo (plan.split) split into dst and lo. */
static void fc_bwd_pairs_of_rows(const fc_bwd_ctx *c, const float *x, int br, int bc,
                                 uint32_t *dst, uint32_t *lo) {
    size_t ld = (size_t)c->pl.bc;
    for (int r = 0; r < br; r += 2) {
        const float *r1 = r + 1 < br ? x + (r + 1) * ld : NULL;
        if (lo)
            c->ops->split(FLASHC_DTYPE_FP32, bc, x + r * ld, r1, 1, dst + (size_t)(r / 2) * ld,
                          lo + (size_t)(r / 2) * ld);
        else
            c->ops->pack_pairs(FLASHC_DTYPE_FP32, bc, x + r * ld, r1, dst + (size_t)(r / 2) * ld);
    }
}

/* x (br, bc; ld Bc) rounded to bf16 in pairs of keys into dst (ld Bc / 2): the
 * operand A of an nn product; with lo (plan.split) split into dst and lo. */
static void fc_bwd_pairs_of_keys(const fc_bwd_ctx *c, const float *x, int br, int bc,
                                 uint32_t *dst, uint32_t *lo) {
    size_t ld = (size_t)c->pl.bc, ld2 = (ld + 1) / 2;
    for (int r = 0; r < br; r++) {
        if (lo)
            c->ops->split(FLASHC_DTYPE_FP32, bc, x + r * ld, NULL, 0, dst + r * ld2, lo + r * ld2);
        else
            c->ops->row_pairs(bc, x + r * ld, (uint16_t *)(dst + r * ld2));
    }
}

/* C (by query sub-block, ld Bc) = rows of A against key rows of B over the keys
 * each sub-block sees, zero elsewhere: S = Qi Kj^T (n = D) or dP = dOi Vj^T
 * (n = Dv). a, b: fp32 rows (ld n); a2, b2: pairs along n (plan.pairs), whose
 * GEMMs multiply C by scale (fp32 rows: the caller does); a2lo, b2lo: their lo
 * halves (plan.split). */
static void fc_bwd_rows_by_keys(const fc_bwd_ctx *c, const fc_bwd_blocks *bl, int bc, int n,
                                const float *a, const float *b, const uint32_t *a2,
                                const uint32_t *b2, const uint32_t *a2lo, const uint32_t *b2lo,
                                float scale, float *C) {
    int ld = c->pl.bc, n2 = (n + 1) / 2;
    for (int g = 0; g < bl->nq; g++) {
        const fc_bwd_block *q = &bl->q[g];
        float *cq = C + (size_t)q->r0 * ld + q->c0;
        if (q->c1 > q->c0) {
            int m = q->r1 - q->r0, nc = q->c1 - q->c0;
            size_t ao = (size_t)q->r0 * n2, bo = (size_t)q->c0 * n2;
            if (c->pl.pairs)
                fc_gemm_bf16_split(c->ops->gemm_bf16_nt, m, nc, n2, a2 + ao,
                                   c->pl.split ? a2lo + ao : NULL, n2, b2 + bo,
                                   c->pl.split ? b2lo + bo : NULL, n2, cq, ld, scale, 0);
            else
                c->ops->gemm_nt(q->r1 - q->r0, q->c1 - q->c0, n, a + (size_t)q->r0 * n, n,
                                b + (size_t)q->c0 * n, n, cq, ld, 0);
        }
        fc_bwd_zero_outside(C, ld, bc, q);
    }
}

/* dst (Bc, n) += X^T R by key sub-block over the rows that see it: dVj +=
 * (P o Z)^T dOi (n = Dv) or dKj += dS^T Qi (n = D). x: (Br, Bc) fp32, r: rows
 * (ld n); x2, r2: pairs of rows (plan.pairs); x2lo, r2lo: their lo halves
 * (plan.split). */
static void fc_bwd_keys_by_rows(const fc_bwd_ctx *c, const fc_bwd_blocks *bl, int n,
                                const float *x, const float *r, const uint32_t *x2,
                                const uint32_t *r2, const uint32_t *x2lo, const uint32_t *r2lo,
                                float *dst) {
    int ld = c->pl.bc;
    for (int g = 0; g < bl->nk; g++) {
        const fc_bwd_block *k = &bl->k[g];
        int m = k->c1 - k->c0, rows = k->r1 - k->r0;
        if (rows <= 0) continue;
        float *dk = dst + (size_t)k->c0 * n;
        size_t xo = (size_t)(k->r0 / 2) * ld + k->c0, ro = (size_t)(k->r0 / 2) * n;
        int k2 = (rows + 1) / 2;
        if (c->pl.pairs)
            fc_gemm_bf16_split(c->ops->gemm_bf16_tn, m, n, k2, x2 + xo,
                               c->pl.split ? x2lo + xo : NULL, ld, r2 + ro,
                               c->pl.split ? r2lo + ro : NULL, n, dk, n, 1.0f, 1);
        else
            c->ops->gemm_tn(m, n, rows, x + (size_t)k->r0 * ld + k->c0, ld,
                            r + (size_t)k->r0 * n, n, dk, n, 1);
    }
}

/* dQi (Br, D) += dS Kj by query sub-block over the keys it sees, in products of
 * at most FC_BWD_DQ_KEYS keys (from a multiple of it): a wide tile (the amx
 * path's 256 keys, fc_bwd_amx_pick) then sums dQ as two tiles of 128 keys would,
 * so that the tile width, which the thread count may decide, never shows in dQ
 * (a product over 256 keys rounds its partial blocks and fp16's split terms
 * apart). */
enum { FC_BWD_DQ_KEYS = 128 };

static void fc_bwd_dq_by_keys(const fc_bwd_ctx *c, const fc_bwd_scratch *s,
                              const fc_bwd_blocks *bl, float *dq) {
    int ld = c->pl.bc, ld2 = (ld + 1) / 2, d = (int)c->pl.d;
    for (int g = 0; g < bl->nq; g++) {
        const fc_bwd_block *q = &bl->q[g];
        float *dqq = dq + (size_t)q->r0 * d;
        int m = q->r1 - q->r0;
        for (int c0 = q->c0, c1; c0 < q->c1; c0 = c1) {
            c1 = (c0 / FC_BWD_DQ_KEYS + 1) * FC_BWD_DQ_KEYS;
            c1 = c1 < q->c1 ? c1 : q->c1;
            int nc = c1 - c0, k2 = (nc + 1) / 2;
            size_t ao = (size_t)q->r0 * ld2 + c0 / 2, bo = (size_t)(c0 / 2) * d;
            if (c->pl.pairs)
                fc_gemm_bf16_split(c->ops->gemm_bf16_nn, m, d, k2, s->ds2k + ao,
                                   c->pl.split ? s->ds2k_lo + ao : NULL, ld2, s->k2r + bo,
                                   c->pl.split ? s->k2r_lo + bo : NULL, d, dqq, d, 1.0f, 1);
            else
                c->ops->gemm_nn(m, d, nc, s->p + (size_t)q->r0 * ld + c0, ld,
                                s->k + (size_t)c0 * d, d, dqq, d, 1);
        }
    }
}

/* One tile: recompute S and P, then (dv != NULL) dVj += (P o Z)^T dOi, dP,
 * dS (into s->p), then (dk) dKj += dS^T Qi and (dq) dQi += dS Kj, without the
 * factor scale, which the stores apply. x: the tile's rows of q and dout;
 * s->k, s->v (or their pairs), s->lse, s->delta are loaded; dq: (Br, D) rows
 * of the tile, dk, dv: (Bc, D), (Bc, Dv) rows of the key block. */
static void fc_bwd_tile_run(const fc_bwd_ctx *c, const fc_bwd_scratch *s, const fc_bwd_tile *t,
                            const fc_bwd_qops *x, float *dq, float *dk, float *dv) {
    int d = (int)c->pl.d, dvd = (int)c->pl.dv, ld = c->pl.bc, br = t->br, bc = t->bc;
    bool pairs = c->pl.pairs;
    fc_bwd_blocks bl;
    fc_bwd_blocks_make(c->a, t, &bl);
    /* S times the score's factor (fc_bwd_probs applies it to fp32 rows) */
    float qk = c->a->softcap > 0.0f ? c->sc.qk_tanh : c->sc.qk_log2;
    fc_bwd_rows_by_keys(c, &bl, bc, d, x->q, s->k, x->q2d, s->k2d, x->q2d_lo, s->k2d_lo, qk, s->p);
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
        if (pairs) fc_bwd_pairs_of_rows(c, pz, br, bc, s->ps2r, s->ps2r_lo);
        fc_bwd_keys_by_rows(c, &bl, dvd, pz, x->dout, s->ps2r, x->do2r, s->ps2r_lo, x->do2r_lo,
                            dv);
    }
    fc_bwd_rows_by_keys(c, &bl, bc, dvd, x->dout, s->v, x->do2d, s->v2d, x->do2d_lo, s->v2d_lo,
                        1.0f, s->dp);
    fc_bwd_dscores(c, s, t);
    if (dk) {
        if (pairs) fc_bwd_pairs_of_rows(c, s->p, br, bc, s->ps2r, s->ps2r_lo);
        fc_bwd_keys_by_rows(c, &bl, d, s->p, x->q, s->ps2r, x->q2r, s->ps2r_lo, x->q2r_lo, dk);
    }
    if (dq) {
        if (pairs) fc_bwd_pairs_of_keys(c, s->p, br, bc, s->ds2k, s->ds2k_lo);
        fc_bwd_dq_by_keys(c, s, &bl, dq);
    }
}


/* ---- fused schedule: one task per (b, hk) ---- */
static void fc_bwd_fused_task(void *ctx, int64_t task, int thread) {
    fc_bwd_ctx *c = (fc_bwd_ctx *)ctx;
    const fc_attn *a = c->a;
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
        fc_bwd_load_q(c, &s, t.b, t.h, 0, t.sq);
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
                fc_bwd_qops x = fc_bwd_qops_at(c, &s, t.i0);
                fc_bwd_load_stats(c, &s, t.b, t.h, t.i0, t.br);
                fc_bwd_tile_run(c, &s, &t, &x, s.dq + (size_t)t.i0 * d, s.dk + (size_t)t.j0 * d,
                                s.dv + (size_t)t.j0 * dvd);
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
            fc_bwd_load_q(c, &s, t.b, t.h, t.i0, t.br);
            fc_bwd_load_stats(c, &s, t.b, t.h, t.i0, t.br);
            fc_bwd_qops x = fc_bwd_qops_at(c, &s, 0);
            fc_bwd_tile_run(c, &s, &t, &x, NULL, s.dk, s.dv);
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
    fc_bwd_load_q(c, &s, t.b, t.h, t.i0, t.br);
    fc_bwd_load_stats(c, &s, t.b, t.h, t.i0, t.br);
    fc_bwd_qops x = fc_bwd_qops_at(c, &s, 0);
    memset(s.dq, 0, (size_t)t.br * d * sizeof(float));
    for (t.j0 = 0; t.j0 < t.sk; t.j0 += ld) {
        t.bc = (int)(t.sk - t.j0 < ld ? t.sk - t.j0 : ld);
        t.kind = fc_bwd_tile_kind(a, t.sq, t.sk, t.i0, t.i0 + t.br, t.j0, t.j0 + t.bc);
        if (t.kind == FC_TILE_SKIP) continue;
        fc_bwd_load_kv(c, &s, t.b, hk, t.j0, t.bc);
        fc_bwd_tile_run(c, &s, &t, &x, s.dq, NULL, NULL);
    }
    fc_bwd_store_dq(c, t.b, t.h, t.i0, t.br, s.dq);
}

/* ---- entry points ---- */
size_t fc_cpu_bwd_workspace(const fc_attn *a) {
    fc_bwd_plan pl;
    return fc_bwd_plan_make(a, fc_simd(), &pl);
}

flashc_status fc_cpu_bwd(const fc_attn *a, void *ws, size_t ws_bytes) {
    fc_bwd_ctx c;
    memset(&c, 0, sizeof c);
    c.ops = fc_simd();
    size_t need = fc_bwd_plan_make(a, c.ops, &c.pl);
    if (ws_bytes < need || (need > 0 && !ws))
        return fc_set_error(FLASHC_ERR_WORKSPACE_TOO_SMALL,
                            "workspace_bytes=%zu but %zu are needed", ws ? ws_bytes : (size_t)0,
                            need);
    c.a = a;
    c.ws = (char *)ws;
    c.delta = (float *)(c.ws + c.pl.delta_off);
    c.dsink_part = a->dsink ? (double *)(c.ws + c.pl.dsink_off) : NULL;
    c.esize = flashc_dtype_size(a->dtype);
    c.sc = fc_score_consts_of(a);
    atomic_init(&c.bad_thread, 0);
    atomic_init(&c.nonfinite, 0);

    FC_LOG("cpu bwd: simd=%s bf16_dot=%d fp16_split=%d schedule=%s Br=%d Bc=%d threads=%d",
           flashc_simd_name(flashc_simd_active()), (int)c.pl.dot, (int)c.pl.split,
           c.pl.fused ? "fused" : "dkdv+dq",
           c.pl.br, c.pl.bc, c.pl.threads);
    fc_pool_run(a->batch * a->heads, fc_bwd_delta_task, &c);
    if (atomic_load(&c.nonfinite)) /* the fp32 products, same tiles and workspace */
        c.pl.split = c.pl.pairs = false;
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
