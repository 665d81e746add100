// kvcache.cu : flashc_fwd_kvcache on device tensors (fc_cuda_kvcache,
// backend.h), "the decode path"; the only file that knows the decode kernels.
//
// fc_cuda_kvcache(kc) runs up to three steps on kc->attn.stream, in order:
//   1. fc_kvcache_prep_kernel (common/kvcache_kernels.cuh): k_new / v_new
//      appended to the cache in place (rotary on k_new first), q rotated into
//      the workspace, and for step 2b the key lengths; skipped when there is
//      nothing to do. Step 2 starts after it on the stream, so no attention CTA
//      reads a cache row that is still being written.
//   2a. the decode kernel (sm80/decode_kernel.cuh): one CTA per (16 packed
//      query rows, key split, kv head, sequence), then, with more than one
//      split, the combine kernel; for head dims D and Dv that are multiples of
//      8 with 16-byte aligned operands and at most kFcDecodeMaxRows packed rows
//      (the instance covers the larger of D and Dv);
//   2b. otherwise fc_cuda_fwd over the cache (any layout: it repacks what it
//      cannot read in place; long query chunks: its 128-row tiles).
// The lengths live in device memory and are never read here: the plan uses the
// cache capacity (what flash_attn's split heuristic uses too).
// fc_cuda_kvcache_supported(kc) runs the plan's checks and launches nothing;
// fc_cuda_kvcache_workspace(kc) is the workspace the plan carves.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "common/kvcache_kernels.cuh"
#include "decode_params.h"
#include "decode_traits.h"
#include "plan.h"
#include "sm80/inst/decode_instances.h"

// Packed query rows (Sq * H / Hk) above which step 2b serves the call: each 16
// rows re-read every K/V tile (from L2 at best), where the forward's 128-row
// tiles read it once per query head.
static const int64_t kFcDecodeMaxRows = 128;

static const int kFcDecodeDims[] = {FC_SM80_DECODE_HEADDIMS(FC_DIM_ENTRY_) 0};

// Key tile and shared memory of the decode instance for head dim `dim`.
static void fc_decode_shape(int dim, int *bc, int *smem) {
    *bc = *smem = 0;
#define FC_SHAPE_(D)                                      \
    if (dim == D) {                                       \
        *bc = fc_sm80_decode_traits<D>::kBc;              \
        *smem = fc_sm80_decode_traits<D>::kSmemBytes;     \
    }
    FC_SM80_DECODE_HEADDIMS(FC_SHAPE_)
#undef FC_SHAPE_
}

// The number of key splits for params.num_splits = 0: flash_attn 2's rule
// (flash_api.cpp num_splits_heuristic) over
// the device's CTA slots (SMs x decode CTAs per SM). A grid that fills 80% of
// the slots runs unsplit. Else each s up to min(128, slots, tiles) scores its
// last-wave efficiency w / ceil(w), w = ctas * s / slots; an s that gives each
// split as many tiles as s - 1 does is skipped (the same time for more
// partials); the smallest s within 85% of the best score wins.
static int fc_decode_splits_heuristic(int64_t ctas, int64_t slots, int64_t tiles) {
    if (ctas * 5 >= slots * 4) return 1;
    int64_t most = slots < tiles ? slots : tiles;
    most = most < FC_COMBINE_MAX_SPLITS ? most : FC_COMBINE_MAX_SPLITS;
    double eff[FC_COMBINE_MAX_SPLITS + 1] = {0.0}, best = 0.0;
    for (int64_t s = 1; s <= most; s++) {
        const bool same = s > 1 && (tiles + s - 1) / s == (tiles + s - 2) / (s - 1);
        const double w = (double)(ctas * s) / (double)slots;
        eff[s] = same ? 0.0 : w / ceil(w);
        best = eff[s] > best ? eff[s] : best;
    }
    for (int64_t s = 1; s <= most; s++)
        if (eff[s] > 0.0 && eff[s] >= 0.85 * best) return (int)s;
    return 1;
}

// CTAs of the decode instance (dim, dtype) per SM of the current device.
static cudaError_t fc_decode_ctas_per_sm(int dim, bool bf16, int *n) {
    *n = 0;
    switch (dim) {
#define FC_CASE_(D)                                                                 \
    case D:                                                                         \
        return bf16 ? sm80_decode_ctas_per_sm<D, __nv_bfloat16>(n)                  \
                    : sm80_decode_ctas_per_sm<D, __half>(n);
        FC_SM80_DECODE_HEADDIMS(FC_CASE_)
#undef FC_CASE_
    default: return cudaSuccess;
    }
}

// The launch log line of the decode instance D.
template <int D>
static void fc_decode_log(const fc_cuda_decode_params &p, unsigned grid, bool bf16) {
    using Tr = fc_sm80_decode_traits<D>;
    FC_LOG("sm80_decode_kernel<D=%d, %s>: rows=%d m_blocks=%d Bc=%d warps=%d stages=%d grid=%u "
           "block=%d smem=%d num_splits=%d", D, bf16 ? "bf16" : "fp16", p.rows, p.m_blocks, Tr::kBc,
           Tr::kWarps, Tr::kStages, grid, Tr::kThreads, Tr::kSmemBytes, p.splits);
}

// Workspace regions: the rotated q (dense [B, Sq, H, D]), the key lengths
// and leftpads [2, B] int32 of step 2b, the split partials (decode_params.h),
// step 2b's own.
enum { FC_KVW_QROT, FC_KVW_LENS, FC_KVW_OACC, FC_KVW_LSEACC, FC_KVW_FWD, FC_KVW_N };

// What fc_cuda_kvcache will run.
typedef struct {
    bool attend;  // some query row exists (else only the append runs)
    bool rotary;  // q is rotated into the workspace first
    bool decode;  // step 2a (else 2b)
    int dim;      // the decode instance's head dim
    int rows;     // packed rows per (b, hk): Sq * H / Hk
    int m_blocks; // ceil(rows / 16)
    int splits;   // key splits of step 2a
    bool pdl;     // the combine as a programmatic dependent launch (sm_90+)
    size_t off[FC_KVW_N];
    size_t bytes; // the workspace needed
} fc_cuda_kv_plan;

// The problem of the attention: kc->attn, with q the rotated copy at qrot when
// rotary is on, and the key lengths at seqlens, the leftpads (if any) after
// them (step 2b: the prep kernel's clamped copies; NULL for step 2a). The copy
// is dense [B, Sq, H, D]; while sizing, qrot is NULL (the region is 256-byte
// aligned, and alignment is all the checks read of the pointer).
static fc_attn fc_kv_attn(const fc_kvcache *kc, bool rotary, void *qrot, const int32_t *seqlens) {
    fc_attn a = kc->attn;
    if (rotary) {
        a.q.ptr = qrot;
        a.q.s_head = a.head_dim;
        a.q.s_seq = a.heads * a.head_dim;
        a.q.s_batch = a.max_seqlen_q * a.heads * a.head_dim;
    }
    a.seqlens_k = seqlens;
    if (seqlens && a.k_leftpad) a.k_leftpad = seqlens + a.batch;
    return a;
}

// Every check of the decode path, the choice of step 2a or 2b, the splits and
// the workspace layout; nothing launched.
static flashc_status fc_cuda_kv_plan_make(const fc_kvcache *kc, fc_cuda_kv_plan *pl) {
    const fc_attn *a = &kc->attn;
    *pl = fc_cuda_kv_plan{};
    FC_TRY(fc_cuda_dtype_check(a));
    // an append-only call (no query row) is refused past the instances too, as
    // one that attends is by the forward's checks
    FC_TRY(fc_cuda_fwd_dim_check(a));
    FC_TRY(fc_cuda_len_check(a));  // a->max_seqlen_k is the cache capacity
    fc_cuda_device dv;
    FC_TRY(fc_cuda_device_get(&dv));

    pl->attend = a->batch > 0 && a->max_seqlen_q > 0;
    pl->rotary = pl->attend && kc->rotary_dim > 0;
    const int64_t group = a->heads / a->kv_heads, rows = a->max_seqlen_q * group;
    const fc_attn att = fc_kv_attn(kc, pl->rotary, NULL, NULL);
    int bc = 0, smem = 0;
    pl->dim = fc_dim_at_least(kFcDecodeDims, fc_cuda_d8(a));
    fc_decode_shape(pl->dim, &bc, &smem);
    pl->decode = pl->attend && pl->dim > 0 && smem <= dv.smem_optin &&
                 rows <= kFcDecodeMaxRows && fc_cuda_view_direct(&att.q, a->head_dim) &&
                 fc_cuda_view_direct(&att.k, a->head_dim) &&
                 fc_cuda_view_direct(&att.v, a->head_dim_v) &&
                 fc_cuda_view_direct(&att.out, a->head_dim_v);
    if (pl->decode) {
        pl->pdl = dv.major >= 9;
        pl->rows = (int)rows;
        pl->m_blocks = (int)((rows + 15) / 16);
        const int64_t ctas = a->batch * a->kv_heads * pl->m_blocks;
        const int64_t tiles = (kc->kv_capacity + bc - 1) / bc;
        const int64_t most = tiles < FC_COMBINE_MAX_SPLITS ? (tiles > 1 ? tiles : 1)
                                                           : FC_COMBINE_MAX_SPLITS;
        if (a->num_splits > 0) {
            pl->splits = (int)(a->num_splits < most ? a->num_splits : most);
        } else {
            int per_sm = 0;
            FC_CUDA_TRY(fc_decode_ctas_per_sm(pl->dim, a->dtype == FLASHC_DTYPE_BF16, &per_sm));
            pl->splits = fc_decode_splits_heuristic(ctas, (int64_t)dv.sms * (per_sm > 0 ? per_sm : 1),
                                                    tiles);
        }
        // one CTA per grid index, one combine warp per output row: int32 indices
        if (ctas * pl->splits > INT32_MAX || a->batch * a->kv_heads * rows > INT32_MAX)
            pl->decode = false;
    }

    size_t sizes[FC_KVW_N] = {0};
    if (pl->rotary)
        sizes[FC_KVW_QROT] = (size_t)(a->batch * a->max_seqlen_q * a->heads * a->head_dim) * 2;
    if (pl->decode && pl->splits > 1) {
        const size_t prows = (size_t)pl->splits * (size_t)(a->batch * a->kv_heads) * (size_t)pl->rows;
        sizes[FC_KVW_OACC] = prows * (size_t)a->head_dim_v * sizeof(float);
        sizes[FC_KVW_LSEACC] = prows * sizeof(float);
    }
    if (pl->attend && !pl->decode) {
        FC_TRY(fc_cuda_fwd_supported(&att));
        sizes[FC_KVW_LENS] = 2 * (size_t)a->batch * sizeof(int32_t);  // key lengths, leftpads
        sizes[FC_KVW_FWD] = fc_cuda_fwd_workspace(&att);
    }
    pl->bytes = fc_ws_layout(FC_KVW_N, sizes, pl->off);
    return FLASHC_OK;
}

// The prep kernel's arguments: the append, the rotary q (at qrot), the lengths
// of step 2b (at seqlens); the job counts say which run.
static fc_cuda_kvprep_params fc_kv_prep_params(const fc_kvcache *kc, const fc_cuda_kv_plan *pl,
                                               void *qrot, int32_t *seqlens) {
    const fc_attn *a = &kc->attn;
    fc_cuda_kvprep_params p = {};
    p.lens.cache_seqlens = kc->cache_seqlens_in;
    p.lens.cs_stride = kc->cache_seqlens_in_stride;
    p.lens.capacity = (int32_t)kc->kv_capacity;
    p.lens.seqlen_new = (int32_t)kc->seqlen_new;
    p.lens.leftpad = a->k_leftpad;
    p.batch = (int32_t)a->batch;
    p.seqlen_q = (int32_t)a->max_seqlen_q;
    p.heads = (int32_t)a->heads;
    p.kv_heads = (int32_t)a->kv_heads;
    p.head_dim = (int32_t)a->head_dim;
    p.head_dim_v = (int32_t)a->head_dim_v;
    p.k_new = kc->k_new.ptr, p.v_new = kc->v_new.ptr;
    p.kn_s_batch = kc->k_new.s_batch, p.kn_s_seq = kc->k_new.s_seq, p.kn_s_head = kc->k_new.s_head;
    p.vn_s_batch = kc->v_new.s_batch, p.vn_s_seq = kc->v_new.s_seq, p.vn_s_head = kc->v_new.s_head;
    p.k_cache = a->k.ptr, p.v_cache = a->v.ptr;
    p.kc_s_batch = a->k.s_batch, p.kc_s_seq = a->k.s_seq, p.kc_s_head = a->k.s_head;
    p.vc_s_batch = a->v.s_batch, p.vc_s_seq = a->v.s_seq, p.vc_s_head = a->v.s_head;
    p.block_table = a->block_table;
    p.bt_stride = a->bt_stride;
    p.page_size = (int32_t)a->page_size;
    p.k_batch_idx = a->k_batch_idx;
    p.caches = (int32_t)a->total_k;
    p.q = a->q.ptr;
    p.q_s_batch = a->q.s_batch, p.q_s_seq = a->q.s_seq, p.q_s_head = a->q.s_head;
    p.q_rot = qrot;
    p.rotary_cos = kc->rotary_cos, p.rotary_sin = kc->rotary_sin;
    p.cos_s_row = kc->rotary_s_row, p.sin_s_row = kc->rotary_sin_s_row;
    p.rotary_rows = (int32_t)kc->rotary_seqlen;
    p.rotary_dim = (int32_t)kc->rotary_dim;
    p.interleaved = kc->rotary_interleaved;
    p.rotary_fp32 = kc->rotary_dtype == FLASHC_DTYPE_FP32;
    p.q_per_row = fc_kv_rotary_per_row(kc);
    p.seqlens_k = seqlens;
    p.n_append = kc->seqlen_new > 0 ? a->batch * kc->seqlen_new * a->kv_heads : 0;
    p.n_q = pl->rotary ? a->batch * a->max_seqlen_q * a->heads : 0;
    p.n_lens = seqlens ? (a->batch + 31) / 32 : 0;
    return p;
}

extern "C" flashc_status fc_cuda_kvcache_supported(const fc_kvcache *kc) {
    fc_cuda_kv_plan pl;
    return fc_cuda_kv_plan_make(kc, &pl);
}

// A problem the plan refuses needs no workspace: the run reports why.
extern "C" size_t fc_cuda_kvcache_workspace(const fc_kvcache *kc) {
    fc_cuda_kv_plan pl;
    if (fc_cuda_kv_plan_make(kc, &pl) == FLASHC_OK) return pl.bytes;
    fc_clear_error();
    return 0;
}

extern "C" flashc_status fc_cuda_kvcache(const fc_kvcache *kc, void *ws, size_t ws_bytes) {
    fc_cuda_kv_plan pl;
    FC_TRY(fc_cuda_kv_plan_make(kc, &pl));
    if (ws_bytes < pl.bytes || (pl.bytes && !ws))
        return fc_set_error(FLASHC_ERR_WORKSPACE_TOO_SMALL, "workspace_bytes=%zu but %zu are needed",
                            ws_bytes, pl.bytes);
    char *base = (char *)ws;
    auto region = [&](int r) -> void * { return base ? base + pl.off[r] : NULL; };
    const cudaStream_t stream = (cudaStream_t)kc->attn.stream;
    const bool bf16 = kc->attn.dtype == FLASHC_DTYPE_BF16;
    void *qrot = pl.rotary ? region(FC_KVW_QROT) : NULL;
    int32_t *lens = pl.attend && !pl.decode ? (int32_t *)region(FC_KVW_LENS) : NULL;

    // ---- 1. append, rotary q, key lengths ----
    const fc_cuda_kvprep_params pp = fc_kv_prep_params(kc, &pl, qrot, lens);
    cudaError_t e = bf16 ? fc_kvcache_prep<__nv_bfloat16>(pp, stream) : fc_kvcache_prep<__half>(pp, stream);
    if (e != cudaSuccess)
        return fc_set_error(FLASHC_ERR_CUDA, "fc_kvcache_prep_kernel launch: %s", cudaGetErrorString(e));
    if (!pl.attend) return FLASHC_OK;

    // ---- 2b. the forward kernel over the cache ----
    const fc_attn att = fc_kv_attn(kc, pl.rotary, qrot, lens);
    if (!pl.decode)
        return fc_cuda_fwd(&att, region(FC_KVW_FWD), base ? ws_bytes - pl.off[FC_KVW_FWD] : 0);

    // ---- 2a. the decode kernel, then the combine of its splits ----
    fc_cuda_decode_params p = {};
    p.f = fc_cuda_fwd_make_params(&att);
    p.lens = pp.lens;
    p.kv_heads = (int32_t)att.kv_heads;
    p.rows = pl.rows;
    p.m_blocks = pl.m_blocks;
    p.splits = pl.splits;
    p.o_accum = (float *)region(FC_KVW_OACC);
    p.lse_accum = (float *)region(FC_KVW_LSEACC);
    const unsigned grid = (unsigned)(att.batch * att.kv_heads * pl.m_blocks * pl.splits);
    switch (pl.dim) {
#define FC_CASE_(D)                                                              \
    case D:                                                                      \
        fc_decode_log<D>(p, grid, bf16);                                         \
        e = bf16 ? sm80_decode_launch<D, __nv_bfloat16>(p, grid, stream)         \
                 : sm80_decode_launch<D, __half>(p, grid, stream);               \
        break;
        FC_SM80_DECODE_HEADDIMS(FC_CASE_)
#undef FC_CASE_
    default:
        return fc_set_error(FLASHC_ERR_INTERNAL, "head_dim=%lld: no decode instance for D=%d",
                            (long long)att.head_dim, pl.dim);
    }
    if (e != cudaSuccess)
        return fc_set_error(FLASHC_ERR_CUDA, "sm80_decode_kernel<D=%d, %s> launch: %s", pl.dim,
                            bf16 ? "bf16" : "fp16", cudaGetErrorString(e));
    if (pl.splits > 1) {
        e = bf16 ? fc_decode_combine<__nv_bfloat16>(p, pl.pdl, stream)
                 : fc_decode_combine<__half>(p, pl.pdl, stream);
        if (e != cudaSuccess)
            return fc_set_error(FLASHC_ERR_CUDA, "fc_decode_combine_kernel launch: %s",
                                cudaGetErrorString(e));
    }
    return FLASHC_OK;
}

