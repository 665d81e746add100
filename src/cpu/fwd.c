/* fwd.c : the CPU attention forward, FlashAttention-2 (Dao, "FlashAttention-2:
 * Faster Attention with Better Parallelism and Work Partitioning", 2023,
 * Algorithm 1), for batched, varlen, paged and kvcache problems alike.
 *
 * Names as in the paper. A task owns one query tile Qi (Br rows) of one
 * (b, h) and walks the key blocks Kj, Vj (Bc rows) that some row of the tile
 * can see, keeping per query row the running max m, the running sum l and the
 * unnormalised output Oi, all in fp32:
 *     S = Qi Kj^T,  m' = max(m, rowmax S),  P = exp2(S - m'),
 *     l = exp2(m - m') l + rowsum P,  Oi = exp2(m - m') Oi + P Vj,
 * and at the end Oi / l is written once in the dtype, lse = (m + log2 l) ln 2.
 *
 * Scores live in log2 units: Q K^T is multiplied by scale * log2(e) (by
 * scale / softcap when softcap is on, the cap then multiplying tanh by
 * softcap * log2(e)), ALiBi slopes are multiplied by log2(e), and the softmax
 * runs on exp2 (the constants: common/score.h). The fp32 path folds the factor
 * into Qi as it is loaded.
 *
 * Layout: the tile holds Qi^T (D x Br) and computes S^T = Kj Qi^T (keys down,
 * queries across). The softmax then runs down the columns of S^T with each
 * query's m and l in a vector lane (no horizontal reductions), Kj is the
 * broadcast operand of gemm_nn as plain rows (no transpose per block), and
 * Oi += P Vj is gemm_tn of P^T. fp32 K and V that are not paged are read in
 * place; other dtypes and layouts are converted to fp32 rows once per block, a
 * cost the Br rows of the tile share. The next block's rows are prefetched
 * while this one computes (they sit a head stride apart, beyond the reach of
 * the hardware prefetchers), except in narrow tiles whose rows lie end to end.
 *
 * Narrow tiles (decode: a sequence of at most FC_FWD_ROW_NQ columns a kv head) on a
 * path with the row ops (AVX-512) skip both GEMMs: Q K^T by dot products on K's
 * rows, P V by adding V's rows scaled by P, each row read where it lies and widened
 * in registers (no fp32 copy of Kj or Vj), for every dtype (bf16 with bf16 dot
 * products up to FC_FWD_ROW_NQ_DOT columns); P stays fp32 there, bf16's too.
 *
 * bf16 on a path with bf16 dot products (AVX512_BF16), other tiles: both GEMMs
 * run on bf16 pairs (simd.h), twice the fp32 rate. Qi^T and Kj are the inputs
 * as they are; P is rounded to bf16 for P Vj, as FlashAttention-2 does on the
 * GPU, while l sums the fp32 P; the factor of the scores is applied to the fp32
 * product. On the amx path (AMX tiles) the tile turns over: S = Qi Kj^T with
 * the queries down (fc_fwd_qdown_block), so that Qi's rows, Kj's rows and the
 * bf16 P the row softmax writes are each a GEMM operand as they lie; only
 * dropout keeps S^T (its per-column op); attn_probs, a second pass, takes
 * the layout its call's blocks took, so that out and lse do not depend on it.
 *
 * fp16 on the amx path (p->split, no dropout): the same queries-down tiles,
 * each fp16 operand (Qi, Kj, Vj) split into bf16 halves hi + lo (simd.h's
 * split, exact) and P into hi + lo to about 16 bits; each GEMM is three
 * tile GEMMs, hi hi' + hi lo' + lo hi', so the products keep about 16 bits,
 * more than fp16's 11 (a plain fp16 forward rounds S and P to fp16).
 *
 * Masks (common/window.h, through fc_key_range and score_mod): blocks no row of
 * the tile sees are skipped; blocks every row sees
 * whole skip the element mask; only the boundary blocks of causal or local
 * windows pay for it. Dropout (philox.h) scales kept P by 1/(1-p) after l has
 * taken the undropped P. attn_probs, a testing aid, is a second pass per tile
 * once lse is known.
 *
 * GQA with few query rows (decode): when the query heads of one kv head fit
 * one tile together (G * Sq <= Br), a task owns all of them: column c of the
 * tile is row c % Sq of head h0 + c / Sq. Kj, Vj are then read and converted
 * once for the G heads, and the GEMMs see G * Sq columns instead of Sq (a
 * single decode row leaves a micro-kernel's columns nearly empty). Masks,
 * ALiBi and dropout run per head on its Sq columns. A narrow tile (by rows)
 * may own several consecutive kv heads the same way (fc_fwd_kv_per_task), the
 * row ops running kv head by kv head on their columns.
 *
 * Not here: vector code (simd_*.c), argument checks (prepare.c), the KV append and
 * rotary of the decode entry (kvcache.c), split-KV.
 */
#include <math.h>
#include <string.h>

#include "../common/philox.h"
#include "../common/score.h"
#include "pool.h"
#include "simd.h"

/* ---- tile sizes ---- */
/* Br query rows per task, Bc key rows per block, by head dim; the first row
 * whose max_d >= D applies. The micro-kernels are 6 x 64 (simd_avx512.c), so
 * Br = 128 is two 64-wide column panels of S^T. Measured on Zen4 (1 MB L2,
 * 32 KB L1d per core), one thread, S = 2k..8k, D = 64/128/256, fp32 and bf16:
 * every (Br, Bc) in 64..256 x 64..192 lands within ~5% of the best, so the
 * table keeps the working set of a tile (Qi^T, Oi: Br x D; S^T: Bc x Br;
 * Kj, Vj: Bc x D; fp32: 320 KB at D = 128, 576 KB at D = 256) inside L2 with
 * room for the next block's prefetched rows. Larger Br reads K and V fewer
 * times (each tile streams them from L3: 2/Br bytes per FLOP) and shares the
 * per-block work (conversion, softmax, rescaling Oi) over more FLOPs; smaller
 * Br wastes less on causal diagonals (Br / S of the causal work). Small D
 * takes the longer key blocks: its FLOPs per key are fewer. */
typedef struct fc_fwd_tiles {
    int64_t max_d;
    int Br, Bc;
} fc_fwd_tiles;

static const fc_fwd_tiles fc_fwd_tile_table[] = {
    {64, 128, 192},
    {INT64_MAX, 128, 128},
};

/* bf16 on AMX tiles (p->tiles): the tiles' GEMMs run at 1.0-1.3 TFLOP/s from
 * cache, so the time goes to the softmax and to reading Kj, Vj once per query
 * tile (a head's K and V at S = 4k fill half the L2), each block of K transposed
 * and each of V packed into pairs again for every tile. Measured on the 2-core
 * Intel VM with AMX (2 MB L2 per core), one thread, S = 4k: 256 x 256 took
 * 0.84x the time of 128 x 128 at D 128, 0.97x and 0.90x of 128 x 192 at D 64
 * and 256; 512 x 256 another 0.91-0.95x without a mask, but 1.1x at S = 1k
 * with a causal one (bench/NOTES.md, session 35). So tiles of
 * FC_FWD_AMX_TALL_BR rows where simd.h's fc_amx_big_tiles allows (two such tiles
 * a head: at S 512 no gain; enough tasks for the threads) and no window bounds the
 * keys on the left: 0.90-0.97x the time at S 1k-4k without a mask (bench/NOTES.md,
 * session 39); with a causal one, and the kv head's copy below, 0.83-0.93x at S
 * 2k-8k but 1.02x at S 1k, so there four such tiles a head (session 40). A local
 * window's tiles see few keys each and keep 256 rows. Every row's
 * scores, softmax and products are the same in either tile, so out and lse
 * are too, bit for bit, as long as the same rows pack (p->pack_br) and run by
 * rows (fc_fwd_task: a sequence's choice, not a tile's). bf16 only: fp16's
 * split redoes a tile whose Q holds inf or NaN with fp32 products, and a tall
 * tile would take 256 more rows into the redo. */
static const fc_fwd_tiles fc_fwd_amx_tiles = {INT64_MAX, 256, 256};
enum { FC_FWD_AMX_TALL_BR = 512 };

static int fc_fwd_amx_tall(const fc_attn *a) {
    int64_t min_blocks = a->window_right < 0 ? 2 : 4; /* a causal S 1k: 1.02x the time */
    return a->dtype == FLASHC_DTYPE_BF16 && a->window_left < 0 &&
           fc_amx_big_tiles(a->max_seqlen_q, FC_FWD_AMX_TALL_BR, min_blocks, a->batch * a->heads);
}

static fc_fwd_tiles fc_fwd_amx_pick(const fc_attn *a) {
    fc_fwd_tiles t = fc_fwd_amx_tiles;
    if (fc_fwd_amx_tall(a)) t.Br = FC_FWD_AMX_TALL_BR;
    return t;
}

/* A tall tile reads its kv head's K and V block by block where they lie: K's rows
 * a head stride apart (2 KB at 8 heads of D 128), read again by each of the head's
 * tiles, and each block of V packed into pairs again for each tile. A head's tasks
 * come one after another (fc_fwd_task's order), so a thread copies the kv head's K
 * rows end to end and packs V's pairs once (fc_fwd_head_kv), and the tiles of that
 * kv head it takes next (the G query heads' too) read the copy; on several threads
 * each thread makes its own. The products are the same, so are the bits. Same-run
 * A/B on the 2-core Intel VM with AMX, 8 heads, D 128, one thread: S 2k 27.8-28.5 ->
 * 24.3-26.3 ms, S 4k 104.9-112.3 -> 93.0-99.4; two threads S 4k 53.8-55.1 ->
 * 48.5-50.2; GQA 8/2 and D 64 4-7% (bench/NOTES.md, session 40). 256-row causal
 * tiles gained nothing (S 8k: 243 -> 250), so the copy is the tall tiles'. It holds
 * at most p->head_rows keys: FC_FWD_HEAD_KV_BYTES a thread (8k keys at D 128) and
 * FC_FWD_HEAD_KV_TOTAL over the pool's threads, which bound the workspace; a longer
 * sequence's tiles read in place. The keys reserved grow with max_seqlen_k up to
 * that bound and stay there, so a workspace sized for a longest sequence serves
 * every shorter one. */
#define FC_FWD_HEAD_KV_BYTES (4u << 20)
#define FC_FWD_HEAD_KV_TOTAL (128u << 20)

static fc_fwd_tiles fc_fwd_pick_tiles(int64_t D) {
    size_t n = sizeof fc_fwd_tile_table / sizeof fc_fwd_tile_table[0];
    for (size_t i = 0; i + 1 < n; i++)
        if (D <= fc_fwd_tile_table[i].max_d) return fc_fwd_tile_table[i];
    return fc_fwd_tile_table[n - 1];
}

/* Sequences of at most this many query columns a kv head (decode: G * Sq of a GQA
 * group, or the Sq rows of one head) run by rows on a path whose table has
 * dot_rows and axpy_rows (AVX-512), in every dtype: Q K^T with dot_rows
 * (fc_fwd_scores), each K row read where it lies and widened in registers, one
 * dot product per query column (1.3-1.46x gemm_nt's transposed panels on fp16
 * decode), and P V with axpy_rows (fc_fwd_pv_rows), each V row read in place and
 * added to the nq rows of Oi (bench/NOTES.md has both). Not on AVX2: its gemm_nt
 * transposes 8 x 8 blocks, and with K streaming from memory (32 heads x 1k..4k
 * keys, fp32) that was 15-25% slower than gemm_nn's narrow columns, though 6-12%
 * faster from cache (bench/NOTES.md). */
#define FC_FWD_ROW_NQ 8
_Static_assert(FC_FWD_ROW_NQ == FC_SPLIT_MIN_SQ, "a split problem's tiles are wide (simd.h)");
/* The bound for bf16 on the bf16 dot-product path (AVX512_BF16), whose GEMMs run
 * at twice the fp32 rate: there the row path won at 1, 2 and 4 columns (1.7x,
 * 1.45x, 1.1-1.7x) and lost at 6 and 8 (0.85x, 0.8x); MHA or GQA, 32 query
 * heads, 4k keys, 1 thread (bench/NOTES.md). */
#define FC_FWD_ROW_NQ_DOT 4
/* Key block of a problem whose tiles all run by rows (decode). Short blocks
 * keep a task's reads of its kv heads' rows close together in memory: 1 query,
 * 4k keys, one thread, on the Intel VM with AMX, Bc 32 against 128: bf16 8
 * heads 1.28 -> 1.20 ms, 32/8 heads 1.93 -> 1.73; fp32 2.52 -> 2.01 and 2.99 ->
 * 2.38; fp16 1.33 -> 1.31 (16 and 64 within a few % of 32; bench/NOTES.md). */
#define FC_FWD_ROW_BC 32

/* ---- workspace ---- */
/* One thread's scratch, fp32 unless said (pairs: uint32 bf16 pairs, see
 * simd.h; only the bf16 dot-product path uses them; qdown: the queries-down
 * layout of the amx path): */
enum {
    FC_FWD_QT,    /* (D, ldq)   Qi^T, scaled; pairs: (D/2, ldq) unscaled; qdown and bf16 row tiles: (Br, ldq2) Qi's rows of pairs */
    FC_FWD_O,     /* (Br, ldd)  Oi, unnormalised */
    FC_FWD_ST,    /* (Bc, ldq)  S^T, then P^T; qdown: (Br, lds) S */
    FC_FWD_K,     /* (Bc, ldd)  Kj; pairs: (Bc, ldd) rows of D/2 pairs (when not read in place) */
    FC_FWD_V,     /* (Bc, ldd)  Vj; pairs: (Bc/2, ldd), rows 2q and 2q+1 */
    FC_FWD_P2,    /* pairs: (Bc/2, ldq) P^T, rows 2q and 2q+1 in bf16; qdown: (Br, ldp2) P's rows */
    FC_FWD_M,     /* (ldq)      running max, log2 units */
    FC_FWD_L,     /* (ldq)      running sum */
    FC_FWD_ALPHA, /* (ldq)      exp2(m_old - m_new) of the last block */
    FC_FWD_LSE2,  /* (ldq)      m + log2 l, for attn_probs */
    FC_FWD_SR,    /* (FC_FWD_ROW_NQ, Bc) S of a narrow tile, queries down */
    FC_FWD_ROWP,  /* (2 Bc) addresses of Kj's and Vj's rows for a narrow tile's row ops */
    FC_FWD_HEAD_K, /* pairs: (head_rows, ldq2) a kv head's K rows (p->head_kv) */
    FC_FWD_HEAD_V, /* pairs: ((head_rows + 1) / 2, ldd) its V, rows 2q and 2q+1 */
    FC_FWD_HEAD_B, /* int64 (2): the (b, hk) they hold, -1 for none */
    FC_FWD_NBUF
};

typedef struct fc_fwd_plan {
    int Br, Bc;
    int pack_br;             /* Br without the amx path's tall tiles: the bound of GQA packing */
    int ldq;                 /* Br rounded up to 16: rows of Qi^T and S^T */
    int ldd;                 /* max(D, Dv) rounded up to 16: rows of Oi, Kj, Vj */
    int dot;                 /* bf16 inputs on a path with bf16 dot products */
    int tiles;               /* ... whose GEMMs run on AMX tiles (or fp16's, split) */
    int split;               /* fp16 inputs as bf16 hi + lo on the amx path */
    int qdown;               /* S with the queries down (fc_fwd_qdown_block) */
    int ldq2, lds, ldp2;     /* qdown: words of a Qi row, floats of an S row, words of a P row */
    int rows_nq;             /* tiles of at most this many columns: Q K^T by rows */
    int64_t kvg;             /* kv heads a narrow task may own (fc_fwd_kv_per_task) */
    int rows_dot;            /* narrow tiles' Q K^T on bf16 dot products (dot_rows_bf16) */
    int64_t head_rows;       /* keys a thread's copy of a kv head holds (0: none reserved) */
    int head_kv;             /* tall tiles of sequences of at most head_rows keys read it */
    size_t buf[FC_FWD_NBUF]; /* byte offsets inside one thread's scratch */
    size_t thread_bytes;     /* one thread's scratch, whole cache lines */
    int nthreads;
    size_t off_task0;   /* (B+1) int64: first task of sequence b */
    size_t off_scratch; /* nthreads x thread_bytes */
    size_t total;
} fc_fwd_plan;

/* Multiply-adds of the problem, bounded from its shapes alone (every query row
 * sees every key): the workspace query of a kvcache call comes before its
 * sequence lengths are known (kvcache.c), and the query and the run must agree. */
static double fc_fwd_work(const fc_attn *a) {
    return (double)a->batch * (double)a->heads * (double)a->max_seqlen_q *
           (double)a->max_seqlen_k * (double)(a->head_dim + a->head_dim_v);
}

/* Below this many multiply-adds the calling thread runs every task (the
 * small-call path): waking the pool's workers and joining them costs 10-30 us
 * on a loaded 2-core machine, more than such a problem takes on one thread.
 * bench/NOTES.md (CPU small calls) has the measurement. */
#define FC_FWD_INLINE_WORK 262144.0

/* A decode-shaped call (at most FC_FWD_ROW_NQ query rows of all the heads of a
 * kv head) streams K and V once; below this many bytes of them it runs on the
 * calling thread too. 1 query, 8 heads, D 64, bf16, on the 2-core Intel VM:
 * two threads lost up to 2k keys (4 MiB; 1k keys: 0.08 ms on one, 0.10-0.17 on
 * two) and won from 4k (0.42 against 0.33-0.36); bench/NOTES.md. */
#define FC_FWD_INLINE_KV_BYTES 4194304.0

/* The bf16 dot-product kernels of the active path, when they apply. */
static int fc_fwd_use_dot(const fc_attn *a, const fc_simd_ops *ops) {
    return a->dtype == FLASHC_DTYPE_BF16 && ops->gemm_bf16_nn && ops->gemm_bf16_tn &&
           ops->pack_pairs && (flashc_cpu_features() & ops->bf16_cpu) == ops->bf16_cpu;
}

/* Size and carving of the workspace, both from here. The size does not depend
 * on the SIMD path: bf16 problems always reserve the pair buffers of both
 * layouts, and on a CPU with AMX the larger of the two tables' tiles. */
static void fc_fwd_plan_make(const fc_attn *a, const fc_simd_ops *ops, fc_fwd_plan *p) {
    /* Oi and Vj rows hold Dv, Kj rows D, and Qi rows pass through Oi */
    int64_t dmax = a->head_dim > a->head_dim_v ? a->head_dim : a->head_dim_v;
    int bf16 = a->dtype == FLASHC_DTYPE_BF16, amx_cpu = fc_simd_amx_possible();
    /* up to FC_FWD_ROW_NQ query rows (decode) keep the default tiles, the row
     * path's (and, past FC_FWD_ROW_NQ_DOT rows, a short queries-down tile's) */
    int wide = a->max_seqlen_q > FC_FWD_ROW_NQ;
    /* fp16 problems the split may run reserve its buffers (simd.h) */
    int fp16 = fc_split_problem(a), split = fc_split_runs(a, ops);
    int dot = fc_fwd_use_dot(a, ops), amx = dot && ops->level == FLASHC_SIMD_AMX;
    fc_fwd_tiles t = (amx || split) && wide ? fc_fwd_amx_pick(a) : fc_fwd_pick_tiles(dmax), r = t;
    p->pack_br = (amx || split) && wide ? fc_fwd_amx_tiles.Br : t.Br;
    if ((bf16 && amx_cpu && wide) || fp16) {
        fc_fwd_tiles o = amx || split ? fc_fwd_pick_tiles(dmax) : fc_fwd_amx_pick(a);
        r.Br = o.Br > r.Br ? o.Br : r.Br;
        r.Bc = o.Bc > r.Bc ? o.Bc : r.Bc;
    }
    /* (split: every tile, a sequence's short last one too, on the tiles, whose
     * scores the backward recomputes) */
    p->rows_nq = !ops->dot_rows || !ops->axpy_rows || split ? 0
                 : dot                                       ? FC_FWD_ROW_NQ_DOT
                                                             : FC_FWD_ROW_NQ;
    if (a->max_seqlen_q * (a->heads / a->kv_heads) <= p->rows_nq)
        t.Bc = FC_FWD_ROW_BC; /* every tile by rows (r keeps the table's, for the size) */
    p->Br = t.Br;
    p->Bc = t.Bc;
    p->ldq = (t.Br + 15) / 16 * 16;
    p->ldd = (int)((dmax + 15) / 16 * 16);
    p->dot = dot;
    p->tiles = amx || split;
    p->split = split;
    p->qdown = p->tiles && ops->softmax_rows_bf16 && a->dropout_p == 0.0f;
    p->rows_dot = p->dot && ops->dot_rows_bf16 != NULL;
    p->ldq2 = (int)((a->head_dim + 1) / 2 + 15) / 16 * 16;
    p->lds = (t.Bc + 15) / 16 * 16;
    p->ldp2 = ((t.Bc + 1) / 2 + 15) / 16 * 16;
    /* the sizes from the reserved tiles r (each at least t's) */
    size_t f = sizeof(float), D = (size_t)a->head_dim, Br = (size_t)r.Br, Bc = (size_t)r.Bc;
    size_t ldq = (Br + 15) / 16 * 16, lds = (Bc + 15) / 16 * 16, ldp2 = ((Bc + 1) / 2 + 15) / 16 * 16;
    size_t qt = D * ldq * f, st = Bc * ldq * f, p2 = bf16 ? (Bc + 1) / 2 * ldq * f : 0;
    /* the kv head's copy where a tall tile could take it (on any path of an AMX CPU):
     * as many keys as its bound allows, in pairs, at most max_seqlen_k */
    size_t pair_bytes = (2 * (size_t)p->ldq2 + (size_t)p->ldd) * sizeof(uint32_t);
    size_t head_cap = FC_FWD_HEAD_KV_TOTAL / (size_t)fc_cpu_num_threads();
    head_cap = head_cap < FC_FWD_HEAD_KV_BYTES ? head_cap : FC_FWD_HEAD_KV_BYTES;
    int64_t head_rows = (int64_t)(head_cap / pair_bytes) * 2;
    head_rows = head_rows < a->max_seqlen_k ? head_rows : a->max_seqlen_k;
    p->head_rows = amx_cpu && fc_fwd_amx_tall(a) ? head_rows : 0;
    p->head_kv = p->head_rows > 0 && p->qdown && p->Br == FC_FWD_AMX_TALL_BR;
    if (bf16 || fp16) { /* the queries-down layout's; fp16's: hi, then lo */
        size_t halves = fp16 ? 2 : 1;
        qt = qt > halves * Br * p->ldq2 * f ? qt : halves * Br * p->ldq2 * f;
        st = st > Br * lds * f ? st : Br * lds * f;
        p2 = p2 > halves * Br * ldp2 * f ? p2 : halves * Br * ldp2 * f;
    }
    size_t sizes[FC_FWD_NBUF] = {
        [FC_FWD_QT] = qt,
        [FC_FWD_O] = Br * p->ldd * f,
        [FC_FWD_ST] = st,
        [FC_FWD_K] = Bc * p->ldd * f,
        [FC_FWD_V] = Bc * p->ldd * f,
        [FC_FWD_P2] = p2,
        [FC_FWD_M] = ldq * f,
        [FC_FWD_L] = ldq * f,
        [FC_FWD_ALPHA] = ldq * f,
        [FC_FWD_LSE2] = ldq * f,
        [FC_FWD_SR] = (size_t)FC_FWD_ROW_NQ * Bc * f,
        [FC_FWD_ROWP] = 2 * Bc * sizeof(const void *),
        [FC_FWD_HEAD_K] = (size_t)p->head_rows * (size_t)p->ldq2 * sizeof(uint32_t),
        [FC_FWD_HEAD_V] = (size_t)(p->head_rows + 1) / 2 * (size_t)p->ldd * sizeof(uint32_t),
        [FC_FWD_HEAD_B] = p->head_rows ? 2 * sizeof(int64_t) : 0,
    };
    p->thread_bytes = fc_ws_layout(FC_FWD_NBUF, sizes, p->buf);
    double kv_bytes = (double)a->batch * (double)a->max_seqlen_k * (double)a->kv_heads *
                      (double)(a->head_dim + a->head_dim_v) * (double)flashc_dtype_size(a->dtype);
    int decode = a->max_seqlen_q * (a->heads / a->kv_heads) <= FC_FWD_ROW_NQ;
    p->nthreads = fc_fwd_work(a) < FC_FWD_INLINE_WORK ||
                          (decode && kv_bytes < FC_FWD_INLINE_KV_BYTES)
                      ? 1
                      : fc_cpu_num_threads();
    p->kvg = a->batch * a->kv_heads / p->nthreads;
    size_t regions[2] = {(size_t)(a->batch + 1) * sizeof(int64_t),
                         (size_t)p->nthreads * p->thread_bytes};
    size_t offs[2];
    p->total = fc_ws_layout(2, regions, offs);
    p->off_task0 = offs[0];
    p->off_scratch = offs[1];
}

size_t fc_cpu_fwd_workspace(const fc_attn *a) {
    fc_fwd_plan p;
    fc_fwd_plan_make(a, fc_simd(), &p);
    return p.total;
}

/* ---- one task: a query tile of one (b, h) ---- */
typedef struct fc_fwd_ctx {
    const fc_attn *a;
    const fc_simd_ops *ops;
    const fc_fwd_plan *plan;
    /* split: the plan without it, which redoes a tile whose fp16 inputs hold
     * inf or NaN (hi + lo products would make NaN of an inf: inf x 0) */
    const fc_fwd_plan *plain;
    const int64_t *task0; /* (B+1) */
    char *scratch;
    fc_score_consts sc; /* common/score.h */
    float qmul;         /* multiplies Q K^T: sc.qk_log2, or sc.qk_tanh with softcap */
    size_t es;          /* bytes of an element of the dtype */
} fc_fwd_ctx;

typedef struct fc_fwd_tile {
    int64_t b, h, hk;         /* h: the first query head of the tile */
    int64_t sq, sk;
    int64_t i0;               /* first query row */
    int nq;                   /* columns in the tile: nh heads x nqh rows */
    int nh, nqh;              /* column c: row i0 + c % nqh of head h + c / nqh */
    int nkv;                  /* kv heads hk .. hk+nkv-1, G heads each (narrow tiles) */
    int rows;                 /* narrow: by rows (dot_rows, axpy_rows), Qi in qt as rows */
    int64_t diag0;            /* i0 + sk - sq: the diagonal of row i0 */
    int64_t jlo, jhi;         /* keys some row sees */
    int64_t jlo_all, jhi_all; /* keys every row sees */
    float *qt, *o, *st, *k, *v, *m, *l, *alpha, *lse2, *sr;
    uint32_t *head_k, *head_v; /* the thread's copy of a kv head (p->head_kv) */
    int64_t *head_b;           /* the (b, hk) it holds */
    const void **rowp;
    uint32_t *p2;  /* pairs */
    int nonfinite; /* split: an input of the tile held inf or NaN */
} fc_fwd_tile;

/* The query head and row of column c of the tile. */
static inline int64_t fc_fwd_col_head(const fc_fwd_tile *t, int c) { return t->h + c / t->nqh; }
static inline int64_t fc_fwd_col_row(const fc_fwd_tile *t, int c) { return t->i0 + c % t->nqh; }

/* A task owns all G query heads of a kv head of sequence b (sq rows each)
 * when they fit one tile of pack_br rows. Not p->Br: packing moves rows between
 * partial and whole 16-row blocks of a tile, which round their sums apart, and
 * the amx path's tall tiles depend on the thread count (fc_amx_big_tiles). */
static int fc_fwd_packs_heads(const fc_attn *a, const fc_fwd_plan *p, int64_t sq) {
    int64_t group = a->heads / a->kv_heads;
    return group > 1 && sq >= 1 && group * sq <= p->pack_br;
}

/* How many consecutive kv heads a task of sequence b owns. 1, except for
 * narrow tiles (decode: each kv head's G * sq columns run by rows): there up
 * to B * Hk / threads, so that one task reads a key's rows of several heads
 * (neighbours in a (S, Hk, D) cache) page by page instead of one head's row per
 * page: a 1-query call over 4k keys and 8 heads, bf16, one thread, went from
 * 1.6 ms to 1.3 ms (bench/NOTES.md). */
static int64_t fc_fwd_kv_per_task(const fc_attn *a, const fc_fwd_plan *p, int64_t sq) {
    int64_t group = a->heads / a->kv_heads;
    if (sq < 1 || group * sq > p->rows_nq) return 1;
    int64_t n = p->kvg, cap = p->Br / (group * sq);
    n = n < cap ? n : cap;
    n = n < a->kv_heads ? n : a->kv_heads;
    return n > 1 ? n : 1;
}

/* Tasks of sequence b (query length sq). */
static int64_t fc_fwd_tasks_of(const fc_attn *a, const fc_fwd_plan *p, int64_t sq) {
    int64_t n = fc_fwd_kv_per_task(a, p, sq);
    if (n > 1 || fc_fwd_packs_heads(a, p, sq)) return (a->kv_heads + n - 1) / n;
    return (sq + p->Br - 1) / p->Br * a->heads;
}

/* Key row j of operand v (k or v) of the tile's sequence and KV head, as bytes
 * (bwd.c's fc_bwd_kvrow for the forward's tile). */
static inline const char *fc_fwd_kvrow(const fc_attn *a, const fc_view *v, const fc_fwd_tile *t,
                                       int64_t j) {
    int64_t es = a->dtype == FLASHC_DTYPE_FP32 ? 4 : 2; /* fp32, or bf16 / fp16 (prepare.c) */
    return (const char *)v->ptr + (fc_kv_row(a, v, t->b, j) + t->hk * v->s_head) * es;
}

/* Rows j0 .. j0+nk-1 (dim elements each: D of k, Dv of v) of operand v (k or
 * v) of sequence b, kv head hk, as fp32 rows *ld apart: the operand itself when
 * it is fp32 with evenly spaced rows (not paged), else converted into buf. */
static const float *fc_fwd_rows(const fc_fwd_ctx *x, const fc_view *v, int dim,
                                const fc_fwd_tile *t, int64_t j0, int nk, float *buf, int *ld) {
    const fc_attn *a = x->a;
    if (a->dtype == FLASHC_DTYPE_FP32 && !a->block_table && v->s_seq <= INT32_MAX) {
        *ld = (int)v->s_seq;
        return (const float *)fc_fwd_kvrow(a, v, t, j0);
    }
    for (int r = 0; r < nk; r++)
        x->ops->load(a->dtype, dim, fc_fwd_kvrow(a, v, t, j0 + r), buf + (size_t)r * x->plan->ldd,
                     1.0f);
    *ld = x->plan->ldd;
    return buf;
}

/* Start moving `bytes` at p towards the cache (L2). */
static void fc_fwd_prefetch_row(const char *p, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o, 0, 2);
}

/* Start moving rows [j0, j0+nk) of operand v towards the cache: the rows of a
 * block sit a head stride apart, often a page each, out of reach of the
 * hardware prefetchers, and the loads of the next block would otherwise wait
 * on memory while the micro-kernels idle. Not for a narrow tile (the row path,
 * decode): its blocks of FC_FWD_ROW_BC keys of its kv heads are read soon
 * enough that the prefetches cost more than they save (1 query, 4k keys, bf16,
 * one thread on the Intel VM with AMX: 1.11 -> 0.85 ms without them; 256 keys
 * from L2: 0.048 -> 0.033 ms; bench/NOTES.md). Nor for a tile whose GEMMs run
 * on AMX tiles: there the prefetches cost 10% of the forward's time and the
 * tile loads wait no longer without them. */
static void fc_fwd_prefetch(const fc_fwd_ctx *x, const fc_view *v, int64_t dim, const fc_fwd_tile *t,
                            int64_t j0, int nk) {
    const fc_attn *a = x->a;
    if (t->rows || x->plan->tiles) return;
    for (int r = 0; r < nk; r++)
        fc_fwd_prefetch_row(fc_fwd_kvrow(a, v, t, j0 + r), (size_t)dim * x->es);
}

/* ---- edge blocks: only their visible part ----
 * In a block that some row of the tile sees only in part (a causal diagonal, a
 * window's edges), the GEMMs run on strips of FC_FWD_STRIP keys (Q K^T) or
 * query columns (P V), each over the columns or keys that the strip can see:
 * on a causal diagonal about half the block. The masked rest of S^T is set to
 * -inf (score_mod would mask it anyway) and its P is 0, so the result is the
 * same as over the whole block. Tiles of one head only (nh = 1): the columns of
 * a packed GQA tile are not in row order. */
enum { FC_FWD_STRIP = 16 };

static int fc_fwd_clamp(int64_t v, int hi) { return v < 0 ? 0 : v > hi ? hi : (int)v; }

/* Columns [*ca, *cb) of the tile that see some key of [ja, jb). */
static void fc_fwd_cols_seeing(const fc_attn *a, const fc_fwd_tile *t, int64_t ja, int64_t jb,
                               int *ca, int *cb) {
    int64_t lo = a->window_right >= 0
                     ? FC_WINDOW_ROW_LO(ja, a->window_right, t->sq, t->sk) - t->i0
                     : 0;
    int64_t hi = a->window_left >= 0
                     ? FC_WINDOW_ROW_HI(jb - 1, a->window_left, t->sq, t->sk) - t->i0 + 1
                     : t->nq;
    *ca = fc_fwd_clamp(lo, t->nq);
    *cb = fc_fwd_clamp(hi, t->nq);
    if (*cb < *ca) *cb = *ca;
}

/* Keys [*ra, *rb) of block j0 (nk keys) that some column of [ca, cb) sees. */
static void fc_fwd_keys_seen(const fc_attn *a, const fc_fwd_tile *t, int64_t j0, int nk, int ca,
                             int cb, int *ra, int *rb) {
    int64_t lo = FC_WINDOW_LO(FC_WINDOW_DIAG(t->i0 + ca, t->sq, t->sk), a->window_left);
    int64_t hi = FC_WINDOW_HI(FC_WINDOW_DIAG(t->i0 + cb - 1, t->sq, t->sk), a->window_right, t->sk);
    *ra = fc_fwd_clamp(lo - j0, nk);
    *rb = fc_fwd_clamp(hi - j0, nk);
    if (*rb < *ra) *rb = *ra;
}

/* Columns [*ca, *cb) that see some key of strip [r0, r0+rn) of block j0; the
 * strip's other columns of S^T are set to -inf. */
static void fc_fwd_edge_fill(const fc_fwd_ctx *x, const fc_fwd_tile *t, int64_t j0, int r0, int rn,
                             int *ca, int *cb) {
    fc_fwd_cols_seeing(x->a, t, j0 + r0, j0 + r0 + rn, ca, cb);
    for (int r = r0; r < r0 + rn; r++) {
        float *row = t->st + (size_t)r * x->plan->ldq;
        for (int c = 0; c < *ca; c++) row[c] = -INFINITY;
        for (int c = *cb; c < t->nq; c++) row[c] = -INFINITY;
    }
}

/* The addresses of rows [j0, j0+nk) of operand v (k or v) for the tile's first
 * kv head, in rows (of t->rowp's 2 * Bc): each row's place is found once per
 * block (fc_kv_row: pages, varlen, cache_batch_idx), and the next head's rows
 * are a head stride on (fc_fwd_next_head). */
static const void **fc_fwd_head_rows(const fc_fwd_ctx *x, const fc_view *v, const fc_fwd_tile *t,
                                     int64_t j0, int nk, const void **rows) {
    for (int r = 0; r < nk; r++) rows[r] = fc_fwd_kvrow(x->a, v, t, j0 + r);
    return rows;
}

/* fc_fwd_head_rows' rows moved on to the next kv head. */
static void fc_fwd_next_head(const fc_fwd_ctx *x, const fc_view *v, int nk, const void **rows) {
    const size_t step = (size_t)v->s_head * x->es;
    for (int r = 0; r < nk; r++) rows[r] = (const char *)rows[r] + step;
}

/* S^T of keys [j0, j0+nk) of a narrow tile (t->rows): S = Qi Kj^T with the keys
 * across, then S^T (gemm_nn's S^T would fill nq of each vector's lanes), by the
 * table's dot_rows on K's rows where they lie (a 16-bit cache widened in
 * registers). */
static void fc_fwd_scores_rows(const fc_fwd_ctx *x, const fc_fwd_tile *t, int64_t j0, int nk) {
    const fc_attn *a = x->a;
    const fc_fwd_plan *p = x->plan;
    const int D = (int)a->head_dim, nc = t->nq / t->nkv; /* columns of one kv head */
    const void **rows = fc_fwd_head_rows(x, &a->k, t, j0, nk, t->rowp);
    for (int c0 = 0, g = 0; c0 < t->nq; c0 += nc, g++) {
        if (g) fc_fwd_next_head(x, &a->k, nk, rows);
        if (p->rows_dot)
            x->ops->dot_rows_bf16(nk, D, rows, (const uint32_t *)t->qt + (size_t)c0 * p->ldq2,
                                  p->ldq2, nc, t->sr, p->Bc, x->qmul);
        else
            x->ops->dot_rows(a->dtype, nk, D, rows, t->qt + (size_t)c0 * D, D, nc, t->sr, p->Bc);
        for (int r = 0; r < nk; r++)
            for (int c = 0; c < nc; c++)
                t->st[(size_t)r * p->ldq + c0 + c] = t->sr[(size_t)c * p->Bc + r];
    }
}

/* K's rows [j0, j0+nk) copied as bf16 pairs into dst, ld words apart, an odd D
 * with a zero high half. */
static void fc_fwd_copy_k(const fc_fwd_ctx *x, const fc_fwd_tile *t, int64_t j0, int nk,
                          uint32_t *dst, int ld) {
    const fc_attn *a = x->a;
    const int D = (int)a->head_dim;
    for (int r = 0; r < nk; r++) {
        uint16_t *row = (uint16_t *)(dst + (size_t)r * ld);
        memcpy(row, fc_fwd_kvrow(a, &a->k, t, j0 + r), (size_t)D * sizeof(uint16_t));
        if (D & 1) row[D] = 0;
    }
}

/* Kj's rows [j0, j0+nk) as bf16 pairs, *ldk words apart: in place when whole
 * pairs lie evenly spaced (not paged, D and the row stride even); else copied
 * into t->k, an odd D with a zero high half. fp16 (p->split): each row split
 * into t->k, hi in the row's first half and lo (*klo) in its second. */
static const uint32_t *fc_fwd_k_pairs(const fc_fwd_ctx *x, fc_fwd_tile *t, int64_t j0, int nk,
                                      int *ldk, const uint32_t **klo) {
    const fc_attn *a = x->a;
    const int D = (int)a->head_dim, ldd = x->plan->ldd;
    *klo = NULL;
    if (x->plan->split) {
        uint32_t *kc = (uint32_t *)t->k;
        for (int r = 0; r < nk; r++)
            t->nonfinite |= x->ops->split(FLASHC_DTYPE_FP16, D, fc_fwd_kvrow(a, &a->k, t, j0 + r),
                                          NULL, 0, kc + (size_t)r * ldd,
                                          kc + (size_t)r * ldd + ldd / 2);
        *ldk = ldd;
        *klo = kc + ldd / 2;
        return kc;
    }
    const char *k0 = fc_fwd_kvrow(a, &a->k, t, j0);
    if (!a->block_table && D % 2 == 0 && a->k.s_seq % 2 == 0 && a->k.s_seq / 2 <= INT32_MAX &&
        (uintptr_t)k0 % sizeof(uint32_t) == 0) {
        *ldk = (int)(a->k.s_seq / 2);
        return (const uint32_t *)k0;
    }
    fc_fwd_copy_k(x, t, j0, nk, (uint32_t *)t->k, ldd);
    *ldk = ldd;
    return (const uint32_t *)t->k;
}

/* S^T of keys [j0, j0+nk) with softcap and ALiBi applied, masked where
 * `edge` (some row of the tile does not see every key of the block). */
static void fc_fwd_scores(const fc_fwd_ctx *x, fc_fwd_tile *t, int64_t j0, int nk, int edge) {
    const fc_attn *a = x->a;
    const fc_fwd_plan *p = x->plan;
    int strip = edge && t->nh == 1 ? FC_FWD_STRIP : nk; /* the whole block at once */
    if (t->rows) {
        fc_fwd_scores_rows(x, t, j0, nk);
    } else if (p->dot) {
        int D = (int)a->head_dim, ldk;
        const uint32_t *klo, *k2 = fc_fwd_k_pairs(x, t, j0, nk, &ldk, &klo);
        const uint32_t *qt2 = (const uint32_t *)t->qt;
        for (int r0 = 0; r0 < nk; r0 += strip) {
            int rn = nk - r0 < strip ? nk - r0 : strip, ca = 0, cb = t->nq;
            if (strip < nk) fc_fwd_edge_fill(x, t, j0, r0, rn, &ca, &cb);
            if (cb > ca)
                x->ops->gemm_bf16_nn(rn, cb - ca, (D + 1) / 2, k2 + (size_t)r0 * ldk, ldk,
                                     qt2 + ca, p->ldq, t->st + (size_t)r0 * p->ldq + ca, p->ldq,
                                     x->qmul, 0);
        }
    } else {
        int ldk;
        const float *k = fc_fwd_rows(x, &a->k, (int)a->head_dim, t, j0, nk, t->k, &ldk);
        for (int r0 = 0; r0 < nk; r0 += strip) {
            int rn = nk - r0 < strip ? nk - r0 : strip, ca = 0, cb = t->nq;
            if (strip < nk) fc_fwd_edge_fill(x, t, j0, r0, rn, &ca, &cb);
            if (cb > ca)
                x->ops->gemm_nn(rn, cb - ca, (int)a->head_dim, k + (size_t)r0 * ldk, ldk,
                                t->qt + ca, p->ldq, t->st + (size_t)r0 * p->ldq + ca, p->ldq, 0);
        }
    }
    fc_score_mod mod = {
        .cap = x->sc.cap_log2,
        .d0 = j0 - t->diag0, /* element (r, c) of a head's columns: key j0 + r, query i0 + c */
        .dr = 1,
        .dc = -1,
        .wl = edge ? a->window_left : -1,
        .wr = edge ? a->window_right : -1,
    };
    for (int g = 0; g < t->nh; g++) { /* per head: its ALiBi slope */
        mod.slope = fc_alibi_slope(a, t->b, t->h + g) * x->sc.log2e;
        if (mod.cap != 0.0f || mod.slope != 0.0f || mod.wl >= 0 || mod.wr >= 0)
            x->ops->score_mod(nk, t->nqh, t->st + (size_t)g * t->nqh, p->ldq, &mod);
    }
}

/* S with the queries down (p->qdown) of the tile's rows [r0, r0+rn) and keys
 * [ka, kb) of block j0, at t->st + r0 * lds + ka: Qi Kj^T on tiles (gemm_bf16_nt:
 * Qi's rows of pairs against Kj's rows k2, which the GEMM transposes once per
 * 32 keys for all the rows; fp16 split: hi hi' + hi lo' + lo hi', klo Kj's lo),
 * times qmul unless `plain` (the softmax applies it then, one pass less), with
 * softcap, ALiBi and, on an edge block, the masks. Rows [r0, r0+rn) short of
 * the tile are a strip of a one-head tile. */
static float *fc_fwd_qdown_scores(const fc_fwd_ctx *x, const fc_fwd_tile *t, int64_t j0,
                                  const uint32_t *k2, const uint32_t *klo, int ldk, int r0, int rn,
                                  int ka, int kb, int edge, int plain) {
    const fc_attn *a = x->a;
    const fc_fwd_plan *p = x->plan;
    float *st = t->st + (size_t)r0 * p->lds + ka, scale = plain ? 1.0f : x->qmul;
    const int K2 = (int)(a->head_dim + 1) / 2;
    const uint32_t *qh = (const uint32_t *)t->qt + (size_t)r0 * p->ldq2;
    fc_gemm_bf16_split(x->ops->gemm_bf16_nt, rn, kb - ka, K2, qh,
                       klo ? qh + (size_t)p->Br * p->ldq2 : NULL, p->ldq2, k2 + (size_t)ka * ldk,
                       klo ? klo + (size_t)ka * ldk : NULL, ldk, st, p->lds, scale, 0);
    fc_score_mod mod = {
        .cap = x->sc.cap_log2,
        /* element (r, c) of a head's rows: query i0 + r0 + r, key j0 + ka + c */
        .d0 = j0 + ka - t->diag0 - r0,
        .dr = -1,
        .dc = 1,
        .wl = edge ? a->window_left : -1,
        .wr = edge ? a->window_right : -1,
    };
    int nqh = rn < t->nq ? rn : t->nqh;
    for (int g = 0; g < t->nh; g++) {
        mod.slope = fc_alibi_slope(a, t->b, t->h + g) * x->sc.log2e;
        if (mod.cap != 0.0f || mod.slope != 0.0f || mod.wl >= 0 || mod.wr >= 0)
            x->ops->score_mod(nqh, kb - ka, st + (size_t)g * nqh * p->lds, p->lds, &mod);
    }
    return st;
}

/* Column c of the tile in attn_probs. */
static float *fc_fwd_probs_row(const fc_attn *a, const fc_fwd_tile *t, int c) {
    return a->probs + t->b * a->probs_s_batch + fc_fwd_col_head(t, c) * a->probs_s_head +
           fc_fwd_col_row(t, c) * a->probs_s_row;
}

/* attn_probs rows of the tile: exp2(s - lse2) where visible, 0 where masked,
 * negated where dropped; 0 past the sequence's keys. */
static void fc_fwd_probs(const fc_fwd_ctx *x, fc_fwd_tile *t) {
    const fc_attn *a = x->a;
    const fc_fwd_plan *p = x->plan;
    for (int64_t j0 = 0; j0 < t->sk; j0 += p->Bc) {
        int nk = (int)(t->sk - j0 < p->Bc ? t->sk - j0 : p->Bc);
        if (j0 + nk <= t->jlo || j0 >= t->jhi) {
            for (int c = 0; c < t->nq; c++)
                memset(fc_fwd_probs_row(a, t, c) + j0, 0, (size_t)nk * sizeof(float));
            continue;
        }
        /* S in the layout the tile's blocks used, scaled in the GEMM */
        size_t rs = p->ldq, cs = 1; /* S^T: element (key r, column c) at r * rs + c * cs */
        if (p->qdown && !t->rows) {
            int ldk;
            const uint32_t *klo, *k2 = fc_fwd_k_pairs(x, t, j0, nk, &ldk, &klo);
            fc_fwd_qdown_scores(x, t, j0, k2, klo, ldk, 0, t->nq, 0, nk, 1, 0);
            rs = 1;
            cs = p->lds;
        } else {
            fc_fwd_scores(x, t, j0, nk, 1);
        }
        for (int r = 0; r < nk; r++) {
            int64_t j = j0 + r;
            for (int c = 0; c < t->nq; c++) {
                float sv = t->st[r * rs + c * cs], pr = 0.0f;
                if (sv != -INFINITY && t->lse2[c] != -INFINITY) {
                    pr = exp2f(sv - t->lse2[c]);
                    uint32_t bh = (uint32_t)(t->b * a->heads + fc_fwd_col_head(t, c));
                    if (a->dropout_p > 0.0f &&
                        !fc_dropout_keep(a->seed, a->offset, bh, (uint32_t)fc_fwd_col_row(t, c),
                                         (uint64_t)j, x->sc.drop_threshold))
                        pr = -pr;
                }
                fc_fwd_probs_row(a, t, c)[j] = pr;
            }
        }
    }
    for (int c = 0; c < t->nq; c++)
        if (a->max_seqlen_k > t->sk)
            memset(fc_fwd_probs_row(a, t, c) + t->sk, 0,
                   (size_t)(a->max_seqlen_k - t->sk) * sizeof(float));
}

/* V's rows [j0, j0+nk) in pairs of keys (rows 2q and 2q+1 in one row of words,
 * ldd apart) into v2; with lo (fp16, split) split, hi into v2 and lo into lo. */
static void fc_fwd_pack_v(const fc_fwd_ctx *x, fc_fwd_tile *t, int64_t j0, int nk, uint32_t *v2,
                          uint32_t *lo) {
    const fc_attn *a = x->a;
    const fc_fwd_plan *p = x->plan;
    for (int r = 0; r < nk; r += 2) {
        const void *v0 = fc_fwd_kvrow(a, &a->v, t, j0 + r);
        const void *v1 = r + 1 < nk ? fc_fwd_kvrow(a, &a->v, t, j0 + r + 1) : NULL;
        size_t row = (size_t)(r / 2) * p->ldd;
        if (lo)
            t->nonfinite |= x->ops->split(FLASHC_DTYPE_FP16, (int)a->head_dim_v, v0, v1, 1,
                                          v2 + row, lo + row);
        else
            x->ops->pack_pairs(FLASHC_DTYPE_BF16, (int)a->head_dim_v, v0, v1, v2 + row);
    }
}

/* Vj's rows [j0, j0+nk) in pairs of keys into t->v (fc_fwd_pack_v). fp16
 * (p->split): split, hi there and lo Bc / 2 rows on (the amx tiles' Bc is even),
 * returned in *vlo. */
static const uint32_t *fc_fwd_v_pairs(const fc_fwd_ctx *x, fc_fwd_tile *t, int64_t j0,
                                      int nk, const uint32_t **vlo) {
    const fc_fwd_plan *p = x->plan;
    uint32_t *v2 = (uint32_t *)t->v, *lo = p->split ? v2 + (size_t)(p->Bc / 2) * p->ldd : NULL;
    fc_fwd_pack_v(x, t, j0, nk, v2, lo);
    *vlo = lo;
    return v2;
}

/* The thread's copy of the tile's kv head (p->head_kv, t->sk <= p->head_rows, which
 * fits an int): K's t->sk rows end to end, ldq2 words apart, and V in pairs of keys,
 * ldd words apart, as fc_fwd_k_pairs and fc_fwd_v_pairs give a block (a tall tile's
 * blocks start at even keys; bf16 only, never split). Made when the thread's copy
 * holds another (b, hk). */
static void fc_fwd_head_kv(const fc_fwd_ctx *x, fc_fwd_tile *t) {
    if (t->head_b[0] == t->b && t->head_b[1] == t->hk) return;
    fc_fwd_copy_k(x, t, 0, (int)t->sk, t->head_k, x->plan->ldq2);
    fc_fwd_pack_v(x, t, 0, (int)t->sk, t->head_v, NULL);
    t->head_b[0] = t->b;
    t->head_b[1] = t->hk;
}

/* Oi += P Vj with bf16 dot products: P^T rounded to bf16 (as FlashAttention-2
 * does on the GPU; l already has the fp32 P) and Vj, both in pairs of keys. */
static void fc_fwd_pv_dot(const fc_fwd_ctx *x, fc_fwd_tile *t, int64_t j0, int nk, int edge) {
    const fc_attn *a = x->a;
    const fc_fwd_plan *p = x->plan;
    const uint32_t *vlo, *v2 = fc_fwd_v_pairs(x, t, j0, nk, &vlo);
    for (int r = 0; r < nk; r += 2) {
        const float *s0 = t->st + (size_t)r * p->ldq;
        x->ops->pack_pairs(FLASHC_DTYPE_FP32, t->nq, s0, r + 1 < nk ? s0 + p->ldq : NULL,
                           t->p2 + (size_t)(r / 2) * p->ldq);
    }
    /* an edge block by strips of columns, over the pairs holding their keys (P
     * is 0 on the masked key of a pair) */
    int strip = edge && t->nh == 1 ? FC_FWD_STRIP : t->nq;
    for (int c0 = 0; c0 < t->nq; c0 += strip) {
        int cn = t->nq - c0 < strip ? t->nq - c0 : strip, ra = 0, rb = nk;
        if (strip < t->nq) fc_fwd_keys_seen(a, t, j0, nk, c0, c0 + cn, &ra, &rb);
        int qa = ra / 2, qb = (rb + 1) / 2;
        if (qb > qa)
            x->ops->gemm_bf16_tn(cn, (int)a->head_dim_v, qb - qa, t->p2 + (size_t)qa * p->ldq + c0,
                                 p->ldq, v2 + (size_t)qa * p->ldd, p->ldd,
                                 t->o + (size_t)c0 * p->ldd, p->ldd, 1.0f, 1);
    }
}

/* Oi += P Vj of a narrow tile (t->rows) with the table's axpy_rows: each V row
 * read where it lies (a 16-bit cache widened in registers, no fp32 copy) and
 * added to the tile's nq rows of Oi, scaled by their P. No strips: nq is below
 * FC_FWD_STRIP, and P is 0 where a key is masked. */
static void fc_fwd_pv_rows(const fc_fwd_ctx *x, const fc_fwd_tile *t, int64_t j0, int nk) {
    const fc_attn *a = x->a;
    const fc_fwd_plan *p = x->plan;
    const int nc = t->nq / t->nkv; /* columns of one kv head */
    const void **rows = fc_fwd_head_rows(x, &a->v, t, j0, nk, t->rowp);
    for (int c0 = 0, g = 0; c0 < t->nq; c0 += nc, g++) {
        if (g) fc_fwd_next_head(x, &a->v, nk, rows);
        x->ops->axpy_rows(a->dtype, nk, (int)a->head_dim_v, rows, t->st + c0, p->ldq, nc,
                          t->o + (size_t)c0 * p->ldd, p->ldd);
    }
}

/* One key block of a narrow tile with one column per kv head (decode without
 * GQA), head by head: S's row of the block by dot_rows (nk scores in a row,
 * not transposed), the modifiers on that row, its online softmax by max and
 * exp2_sum over whole vectors of keys (softmax_cols on S^T would fill one lane
 * per head), dropout, and Oi's row += P Vj by axpy_rows. The columns' path's
 * arithmetic but for alpha, here exp2f's. 1 query, 8 heads, one thread, this
 * Intel VM: 4k keys D 64 bf16 0.45 -> 0.41 ms, fp32 0.68 -> 0.64; 32k keys of
 * one head 0.66 -> 0.48. Only for fewer than FC_FWD_BY_HEAD kv heads: from 16
 * on, softmax_cols fills whole vectors and the per-head calls cost more (32
 * heads, D 128, 2k keys: 1.45 -> 1.60 ms by head; bench/NOTES.md). The choice
 * is the problem's, not the task's (whose heads depend on the thread count and
 * the batch), so that the result does not depend on either: the two paths
 * round alpha and sum l differently. */
enum { FC_FWD_BY_HEAD = 16 };

static void fc_fwd_rows_block(const fc_fwd_ctx *x, fc_fwd_tile *t, int64_t j0, int nk, int edge) {
    const fc_attn *a = x->a;
    const fc_fwd_plan *p = x->plan;
    const fc_simd_ops *ops = x->ops;
    const int D = (int)a->head_dim, Dv = (int)a->head_dim_v;
    const void **krows = fc_fwd_head_rows(x, &a->k, t, j0, nk, t->rowp);
    const void **vrows = fc_fwd_head_rows(x, &a->v, t, j0, nk, t->rowp + p->Bc);
    fc_score_mod mod = {.cap = x->sc.cap_log2, .d0 = j0 - t->diag0, .dr = 1, .dc = 1,
                        .wl = edge ? a->window_left : -1, .wr = edge ? a->window_right : -1};
    float *s = t->sr;
    for (int c = 0; c < t->nq; c++) {
        if (c) {
            fc_fwd_next_head(x, &a->k, nk, krows);
            fc_fwd_next_head(x, &a->v, nk, vrows);
        }
        if (p->rows_dot)
            ops->dot_rows_bf16(nk, D, krows, (const uint32_t *)t->qt + (size_t)c * p->ldq2, p->ldq2,
                               1, s, p->Bc, x->qmul);
        else
            ops->dot_rows(a->dtype, nk, D, krows, t->qt + (size_t)c * D, D, 1, s, p->Bc);
        mod.slope = fc_alibi_slope(a, t->b, t->h + c) * x->sc.log2e;
        if (mod.cap != 0.0f || mod.slope != 0.0f || mod.wl >= 0 || mod.wr >= 0)
            ops->score_mod(1, nk, s, nk, &mod);
        float mo = t->m[c], mx = ops->max(nk, s);
        if (mo > mx) mx = mo; /* a NaN maximum stays NaN */
        float u = mx == -INFINITY ? 0.0f : mx;
        float sum = ops->exp2_sum(nk, s, u), alpha = exp2f(mo - u);
        t->m[c] = mx;
        t->l[c] = alpha * t->l[c] + sum;
        if (alpha != 1.0f) ops->scale(Dv, t->o + (size_t)c * p->ldd, alpha);
        if (a->dropout_p > 0.0f)
            ops->dropout_cols(nk, 1, s, 1, a->seed, a->offset,
                              (uint32_t)(t->b * a->heads + t->h + c), (uint32_t)t->i0, j0,
                              x->sc.drop_threshold, x->sc.drop_scale);
        ops->axpy_rows(a->dtype, nk, Dv, vrows, s, 1, 1, t->o + (size_t)c * p->ldd, p->ldd);
    }
}

/* Oi += P Vj; an edge block by strips of columns, over the keys they see. */
static void fc_fwd_pv(const fc_fwd_ctx *x, const fc_fwd_tile *t, int64_t j0, int nk, int edge,
                      const float *v, int ldv) {
    const fc_fwd_plan *p = x->plan;
    int strip = edge && t->nh == 1 ? FC_FWD_STRIP : t->nq;
    for (int c0 = 0; c0 < t->nq; c0 += strip) {
        int cn = t->nq - c0 < strip ? t->nq - c0 : strip, ra = 0, rb = nk;
        if (strip < t->nq) fc_fwd_keys_seen(x->a, t, j0, nk, c0, c0 + cn, &ra, &rb);
        if (rb > ra)
            x->ops->gemm_tn(cn, (int)x->a->head_dim_v, rb - ra, t->st + (size_t)ra * p->ldq + c0,
                            p->ldq, v + (size_t)ra * ldv, ldv, t->o + (size_t)c0 * p->ldd, p->ldd,
                            1);
    }
}

/* One key block of a tile with the queries down (p->qdown: bf16 on AMX tiles,
 * no dropout): S by fc_fwd_qdown_scores, softmax_rows_bf16 (P rounded to bf16
 * as it is written, pairs of keys along each query's row: AMX's own layout of
 * A), Oi rescaled, then Oi += P Vj (gemm_bf16_nn). Each operand of a GEMM is
 * read as it lies; S^T's layout would need P transposed. An edge block of a
 * one-head tile runs by strips of FC_FWD_QSTRIP rows over the keys they see,
 * rounded out to 32 (whole tiles): a causal diagonal costs about half a block. */
enum { FC_FWD_QSTRIP = 32 };

static void fc_fwd_qdown_block(const fc_fwd_ctx *x, fc_fwd_tile *t, int64_t j0, int nk, int edge) {
    const fc_attn *a = x->a;
    const fc_fwd_plan *p = x->plan;
    const fc_simd_ops *ops = x->ops;
    const int Dv = (int)a->head_dim_v;
    int ldk = p->ldq2;
    const uint32_t *klo = NULL, *vlo = NULL, *k2, *v2;
    if (p->head_kv && t->sk <= p->head_rows) {
        fc_fwd_head_kv(x, t);
        k2 = t->head_k + (size_t)j0 * p->ldq2;
        v2 = t->head_v + (size_t)(j0 / 2) * p->ldd;
    } else {
        k2 = fc_fwd_k_pairs(x, t, j0, nk, &ldk, &klo);
        v2 = fc_fwd_v_pairs(x, t, j0, nk, &vlo);
    }
    /* the scores' factor goes into the softmax where no modifier needs the scaled
     * scores, edge blocks too: a block is an edge of a tall tile where it is whole for
     * a 256-row one, and the two must scale a row's scores the same way */
    int plain = x->sc.cap_log2 == 0.0f && !a->alibi && x->qmul > 0.0f;
    int strip = edge && t->nh == 1 ? FC_FWD_QSTRIP : t->nq;
    for (int r0 = 0; r0 < t->nq; r0 += strip) {
        int rn = t->nq - r0 < strip ? t->nq - r0 : strip, ka = 0, kb = nk;
        if (strip < t->nq) {
            fc_fwd_keys_seen(a, t, j0, nk, r0, r0 + rn, &ka, &kb);
            if (kb == ka) continue; /* m, l and Oi as they were */
            ka = ka / 32 * 32;
            kb = (kb + 31) / 32 * 32 < nk ? (kb + 31) / 32 * 32 : nk;
        }
        float *st = fc_fwd_qdown_scores(x, t, j0, k2, klo, ldk, r0, rn, ka, kb, edge, plain);
        uint32_t *p2 = t->p2 + (size_t)r0 * p->ldp2 + ka / 2;
        uint32_t *p2lo = p->split ? p2 + (size_t)p->Br * p->ldp2 : NULL;
        ops->softmax_rows_bf16(rn, kb - ka, st, p->lds, plain ? x->qmul : 1.0f, t->m + r0,
                               t->l + r0, t->alpha + r0, p2, p2lo, p->ldp2);
        for (int c = r0; c < r0 + rn; c++)
            if (t->alpha[c] != 1.0f) ops->scale(Dv, t->o + (size_t)c * p->ldd, t->alpha[c]);
        const int K2 = (kb - ka + 1) / 2;
        const size_t vrow = (size_t)(ka / 2) * p->ldd;
        fc_gemm_bf16_split(ops->gemm_bf16_nn, rn, Dv, K2, p2, p2lo, p->ldp2, v2 + vrow,
                           vlo ? vlo + vrow : NULL, p->ldd, t->o + (size_t)r0 * p->ldd, p->ldd,
                           1.0f, 1);
    }
}

static void fc_fwd_task(void *vctx, int64_t task, int thread) {
    const fc_fwd_ctx *x = (const fc_fwd_ctx *)vctx;
    const fc_attn *a = x->a;
    const fc_fwd_plan *p = x->plan;
    const fc_simd_ops *ops = x->ops;
    const int D = (int)a->head_dim, Dv = (int)a->head_dim_v, ldq = p->ldq, ldd = p->ldd;
    const size_t es = flashc_dtype_size(a->dtype);

    /* sequence b: task0[b] <= task < task0[b+1] (empty sequences own no task) */
    int64_t lo = 0, hi = a->batch;
    while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        if (x->task0[mid] <= task)
            lo = mid;
        else
            hi = mid;
    }
    fc_fwd_tile t;
    t.b = lo;
    t.sq = fc_seqlen_q(a, t.b);
    t.sk = fc_seqlen_k(a, t.b);
    int64_t local = task - x->task0[t.b], group = a->heads / a->kv_heads;
    int64_t kvn = fc_fwd_kv_per_task(a, p, t.sq), seq_cols;
    t.nkv = 1;
    if (kvn > 1 || fc_fwd_packs_heads(a, p, t.sq)) {
        /* kvn kv heads (one unless narrow): their G query heads, all rows */
        t.hk = local * kvn;
        t.nkv = (int)(a->kv_heads - t.hk < kvn ? a->kv_heads - t.hk : kvn);
        t.h = t.hk * group;
        t.i0 = 0;
        t.nh = (int)group * t.nkv;
        t.nqh = (int)t.sq;
        seq_cols = group * t.sq;
    } else {
        /* within b: head by head, so that consecutive tasks share Kj, Vj in
         * cache (the heads of one kv head are neighbours), and within a head
         * the tiles from the last (the most keys under a causal mask) down */
        int64_t ntiles = (t.sq + p->Br - 1) / p->Br;
        t.h = local / ntiles;
        t.hk = t.h / group;
        t.i0 = (ntiles - 1 - local % ntiles) * p->Br;
        t.nh = 1;
        t.nqh = (int)(t.sq - t.i0 < p->Br ? t.sq - t.i0 : p->Br);
        seq_cols = t.sq;
    }
    t.nq = t.nh * t.nqh;
    /* by rows when the sequence's columns of a kv head are few (decode): decided by
     * the sequence, not the tile, so that a long sequence's short last tile, whose
     * length follows Br (and so the thread count: fc_amx_big_tiles), runs on the
     * products its other tiles take */
    t.rows = seq_cols <= p->rows_nq;
    t.diag0 = FC_WINDOW_DIAG(t.i0, t.sq, t.sk);
    /* visible ranges are non-decreasing in the row: the tile's rows see at most
     * [lo(first), hi(last)) and all see [lo(last), hi(first)) */
    fc_key_range(a, t.sq, t.sk, t.i0, &t.jlo, &t.jhi_all);
    fc_key_range(a, t.sq, t.sk, t.i0 + t.nqh - 1, &t.jlo_all, &t.jhi);

    char *s = x->scratch + (size_t)thread * p->thread_bytes;
    t.qt = (float *)(s + p->buf[FC_FWD_QT]);
    t.sr = (float *)(s + p->buf[FC_FWD_SR]);
    t.rowp = (const void **)(s + p->buf[FC_FWD_ROWP]);
    t.o = (float *)(s + p->buf[FC_FWD_O]);
    t.st = (float *)(s + p->buf[FC_FWD_ST]);
    t.k = (float *)(s + p->buf[FC_FWD_K]);
    t.v = (float *)(s + p->buf[FC_FWD_V]);
    t.m = (float *)(s + p->buf[FC_FWD_M]);
    t.l = (float *)(s + p->buf[FC_FWD_L]);
    t.alpha = (float *)(s + p->buf[FC_FWD_ALPHA]);
    t.lse2 = (float *)(s + p->buf[FC_FWD_LSE2]);
    t.p2 = (uint32_t *)(s + p->buf[FC_FWD_P2]);
    t.head_k = (uint32_t *)(s + p->buf[FC_FWD_HEAD_K]);
    t.head_v = (uint32_t *)(s + p->buf[FC_FWD_HEAD_V]);
    t.head_b = (int64_t *)(s + p->buf[FC_FWD_HEAD_B]);
    t.nonfinite = 0;

    for (int c = 0; c < t.nq; c++)
        fc_fwd_prefetch_row((const char *)a->q.ptr +
                                (fc_q_row(a, &a->q, t.b, fc_fwd_col_row(&t, c)) +
                                 fc_fwd_col_head(&t, c) * a->q.s_head) *
                                    (int64_t)es,
                            (size_t)D * es);
    if (t.jlo < t.jhi) {
        int nk0 = (int)(t.jhi - t.jlo < p->Bc ? t.jhi - t.jlo : p->Bc);
        fc_fwd_prefetch(x, &a->k, D, &t, t.jlo, nk0);
        fc_fwd_prefetch(x, &a->v, Dv, &t, t.jlo, nk0);
    }

    if (t.rows ? p->rows_dot : p->qdown) {
        /* Qi's rows as pairs, ldq2 words apart, unscaled (dot_rows_bf16 or
         * the GEMM applies qmul) */
        uint32_t *q2 = (uint32_t *)t.qt;
        for (int c = 0; c < t.nq; c++) {
            uint16_t *dst = (uint16_t *)(q2 + (size_t)c * p->ldq2);
            const uint16_t *src = (const uint16_t *)a->q.ptr +
                                  fc_q_row(a, &a->q, t.b, fc_fwd_col_row(&t, c)) +
                                  fc_fwd_col_head(&t, c) * a->q.s_head;
            if (p->split) { /* hi, and lo Br rows on (a split plan has no row tiles) */
                t.nonfinite |= ops->split(FLASHC_DTYPE_FP16, D, src, NULL, 0, (uint32_t *)dst,
                                          (uint32_t *)dst + (size_t)p->Br * p->ldq2);
                continue;
            }
            memcpy(dst, src, (size_t)D * sizeof(uint16_t));
            if (D & 1) dst[D] = 0;
        }
    } else if (t.rows) {
        /* Qi as rows of D, scaled (dot_rows' q) */
        for (int c = 0; c < t.nq; c++) {
            int64_t off = fc_q_row(a, &a->q, t.b, fc_fwd_col_row(&t, c)) +
                          fc_fwd_col_head(&t, c) * a->q.s_head;
            ops->load(a->dtype, D, (const char *)a->q.ptr + off * (int64_t)es,
                      t.qt + (size_t)c * D, x->qmul);
        }
    } else if (p->dot) {
        /* Qi^T in pairs, unscaled (the GEMM applies qmul) */
        uint32_t *qt2 = (uint32_t *)t.qt;
        for (int c = 0; c < t.nq; c++) {
            const uint16_t *q = (const uint16_t *)a->q.ptr +
                                fc_q_row(a, &a->q, t.b, fc_fwd_col_row(&t, c)) +
                                fc_fwd_col_head(&t, c) * a->q.s_head;
            for (int d = 0; d < D; d += 2)
                qt2[(size_t)(d / 2) * ldq + c] = q[d] | (d + 1 < D ? (uint32_t)q[d + 1] << 16 : 0u);
        }
    } else {
        /* Qi^T, scaled: rows go through Oi */
        for (int c = 0; c < t.nq; c++) {
            int64_t off = fc_q_row(a, &a->q, t.b, fc_fwd_col_row(&t, c)) +
                          fc_fwd_col_head(&t, c) * a->q.s_head;
            ops->load(a->dtype, D, (const char *)a->q.ptr + off * (int64_t)es,
                      t.o + (size_t)c * ldd, x->qmul);
        }
        for (int d = 0; d < D; d++)
            for (int c = 0; c < t.nq; c++) t.qt[(size_t)d * ldq + c] = t.o[(size_t)c * ldd + d];
    }
    memset(t.o, 0, (size_t)t.nq * ldd * sizeof(float));
    for (int c = 0; c < t.nq; c++) {
        t.m[c] = -INFINITY;
        t.l[c] = 0.0f;
    }

    for (int64_t j0 = t.jlo; j0 < t.jhi; j0 += p->Bc) {
        if (t.nonfinite) break; /* redone below */
        int nk = (int)(t.jhi - j0 < p->Bc ? t.jhi - j0 : p->Bc);
        int edge = j0 < t.jlo_all || j0 + nk > t.jhi_all;
        int64_t j1 = j0 + p->Bc;
        int nk1 = (int)(t.jhi - j1 < p->Bc ? t.jhi - j1 : p->Bc);
        if (nk1 > 0) fc_fwd_prefetch(x, &a->k, D, &t, j1, nk1);
        if (p->qdown && !t.rows) {
            fc_fwd_qdown_block(x, &t, j0, nk, edge);
            continue;
        }
        if (t.rows && t.nq == t.nkv && a->kv_heads < FC_FWD_BY_HEAD) {
            fc_fwd_rows_block(x, &t, j0, nk, edge);
            continue;
        }
        fc_fwd_scores(x, &t, j0, nk, edge);
        ops->softmax_cols(nk, t.nq, t.st, ldq, t.m, t.l, t.alpha);
        for (int c = 0; c < t.nq; c++)
            if (t.alpha[c] != 1.0f) ops->scale(Dv, t.o + (size_t)c * ldd, t.alpha[c]);
        if (a->dropout_p > 0.0f)
            for (int g = 0; g < t.nh; g++)
                ops->dropout_cols(nk, t.nqh, t.st + (size_t)g * t.nqh, ldq, a->seed, a->offset,
                                  (uint32_t)(t.b * a->heads + t.h + g), (uint32_t)t.i0, j0,
                                  x->sc.drop_threshold, x->sc.drop_scale);
        if (nk1 > 0) fc_fwd_prefetch(x, &a->v, Dv, &t, j1, nk1);
        if (t.rows)
            fc_fwd_pv_rows(x, &t, j0, nk);
        else if (p->dot)
            fc_fwd_pv_dot(x, &t, j0, nk, edge);
        else {
            int ldv;
            const float *v = fc_fwd_rows(x, &a->v, Dv, &t, j0, nk, t.v, &ldv);
            fc_fwd_pv(x, &t, j0, nk, edge, v, ldv);
        }
    }
    if (t.nonfinite) { /* the tile again without the split (x->plain): fp32 products */
        fc_fwd_ctx y = *x;
        y.plan = x->plain;
        fc_fwd_task(&y, task, thread);
        return;
    }

    /* Oi / l, lse; a row that saw no key has l = 0, Oi = 0. With a learnable
     * sink s (log2 units s2 = s log2 e) the denominator is l 2^m + 2^s2:
     * lse2 = M + log2(l 2^(m-M) + 2^(s2-M)) with M = max(m, s2) (no overflow
     * either way), and out = Oi 2^m / 2^lse2 = Oi 2^(m - lse2); a row that saw
     * no key gets lse2 = s2 and out = 0. Shared by every SIMD path. */
    for (int c = 0; c < t.nq; c++) {
        int seen = t.l[c] != 0.0f; /* NaN (a NaN score) is seen: NaN out and lse */
        int64_t hc = fc_fwd_col_head(&t, c), ic = fc_fwd_col_row(&t, c);
        double lse2 = seen ? (double)t.m[c] + log2((double)t.l[c]) : -INFINITY;
        float factor = seen ? 1.0f / t.l[c] : 0.0f;
        if (a->sink) {
            double s2 = (double)fc_sink_logit(a, hc) * FC_LOG2E;
            if (seen) {
                double m = t.m[c], top = m > s2 ? m : s2;
                lse2 = top + log2((double)t.l[c] * exp2(m - top) + exp2(s2 - top));
                factor = (float)exp2(m - lse2);
            } else {
                lse2 = s2;
            }
        }
        t.lse2[c] = (float)lse2;
        int64_t off = fc_q_row(a, &a->out, t.b, ic) + hc * a->out.s_head;
        ops->store(a->dtype, Dv, t.o + (size_t)c * ldd, (char *)a->out.ptr + off * (int64_t)es,
                   factor);
        if (a->lse) a->lse[fc_lse_index(a, t.b, hc, ic)] = (float)(lse2 * x->sc.ln2);
    }
    if (a->probs) fc_fwd_probs(x, &t);
}

/* ---- entry ---- */
flashc_status fc_cpu_fwd(const fc_attn *a, void *ws, size_t ws_bytes) {
    const fc_simd_ops *ops = fc_simd();
    fc_fwd_plan p;
    fc_fwd_plan_make(a, ops, &p);
    if (ws_bytes < p.total)
        return fc_set_error(FLASHC_ERR_WORKSPACE_TOO_SMALL,
                            "workspace_bytes=%zu but %zu are needed", ws_bytes, p.total);
    FC_CHECK_ARG(ws != NULL || p.total == 0, "workspace is NULL but %zu bytes are needed", p.total);

    int64_t *task0 = (int64_t *)((char *)ws + p.off_task0);
    task0[0] = 0;
    for (int64_t b = 0; b < a->batch; b++) {
        int64_t sq = fc_seqlen_q(a, b);
        task0[b + 1] = task0[b] + fc_fwd_tasks_of(a, &p, sq);
    }

    fc_fwd_plan plain = p; /* the same tiles and workspace, fp32 products */
    plain.split = plain.tiles = plain.qdown = plain.head_kv = 0;
    fc_fwd_ctx x = {
        .a = a,
        .ops = ops,
        .plan = &p,
        .plain = &plain,
        .task0 = task0,
        .scratch = (char *)ws + p.off_scratch,
        .sc = fc_score_consts_of(a),
        .es = flashc_dtype_size(a->dtype),
    };
    x.qmul = a->softcap > 0.0f ? x.sc.qk_tanh : x.sc.qk_log2;

    /* attn_probs rows past each sequence's queries (tasks write the others) */
    if (a->probs)
        for (int64_t b = 0; b < a->batch; b++)
            for (int64_t h = 0; h < a->heads; h++)
                for (int64_t i = fc_seqlen_q(a, b); i < a->max_seqlen_q; i++)
                    memset(a->probs + b * a->probs_s_batch + h * a->probs_s_head +
                               i * a->probs_s_row,
                           0, (size_t)a->max_seqlen_k * sizeof(float));

    FC_LOG("cpu fwd: simd=%s bf16_dot=%d queries_down=%d Br=%d Bc=%d head_kv=%d tasks=%lld "
           "threads=%d",
           flashc_simd_name(flashc_simd_active()), p.dot, p.qdown, p.Br, p.Bc, p.head_kv,
           (long long)task0[a->batch], p.nthreads);
    if (p.head_kv) /* no thread holds a kv head yet (the workspace may be an earlier call's) */
        for (int th = 0; th < p.nthreads; th++) {
            int64_t *held = (int64_t *)(x.scratch + (size_t)th * p.thread_bytes +
                                        p.buf[FC_FWD_HEAD_B]);
            held[0] = held[1] = -1;
        }
    fc_pool_run_on(task0[a->batch], p.nthreads, fc_fwd_task, &x);
    return FLASHC_OK;
}
