// fwd.cu : the forward on device tensors (fc_cuda_fwd, backend.h), the only
// file that knows the forward kernels.
//
//   fc_cuda_fwd(a)  fc_attn (prepare.c's validated problem) -> fc_cuda_fwd_params
//                   (plan.cu: host-derived constants such as score_scale * log2 e),
//                   the kernel family for the device (plan.h), the larger of the
//                   head dims D (q, k) and Dv (v, out) rounded up to a compiled
//                   instance of it (each operand zero-padded past its own), one switch over
//                   the family's generated list of head dims
//                   (sm80/inst/instances.h, sm90/inst/instances.h,
//                   sm90ws/inst/instances.h), grid from the tuning table
//                   (traits.h), launch on a->stream, cudaGetLastError.
//   fc_cuda_fwd_supported(a)  the same checks, nothing launched.
//   fc_cuda_fwd_workspace(a)  bytes for the repacked operands (plan.h):
//                   q, k, v, out that are not 16-byte aligned, have a stride
//                   that is not a multiple of 8 elements, or whose head dim (D
//                   for q, k; Dv for v, out) is not a multiple of 8; then, when
//                   the call asks for attn_probs but no softmax_lse, the lse
//                   they are computed from; 0 when every operand is read in
//                   place and no lse is carved.
//   attn_probs      after the forward, on the same stream, fc_probs_launch
//                   (probs.cu) from the lse the forward wrote.
//
// Families: sm90ws (TMA loads by a producer warpgroup, wgmma consumers,
// sm90ws/fwd_kernel.cuh), sm90 (wgmma, cp.async, sm90/fwd_kernel.cuh), sm80
// (mma.sync, sm80/fwd_kernel.cuh). fc_cuda_family chooses sm90 or sm80;
// fc_fwd_ws_refusal then says whether sm90ws can take the sm90 call.
// FLASHC_CUDA_FAMILY=sm90 keeps sm90, =sm80 forces sm80.
//
// Not here yet: fp32 inputs.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "sm80/inst/instances.h"
#include "sm90/inst/instances.h"
#include "sm90ws/inst/instances.h"
#include "traits.h"

// ---- the instances ----
static const int kFcSm80FwdDims[] = {FC_SM80_FWD_HEADDIMS(FC_DIM_ENTRY_) 0};
static const int kFcSm90FwdDims[] = {FC_SM90_FWD_HEADDIMS(FC_DIM_ENTRY_) 0};
static const int kFcSm90wsFwdDims[] = {FC_SM90WS_FWD_HEADDIMS(FC_DIM_ENTRY_) 0};

// Smallest compiled head dim >= d of the family, or 0.
static int fc_fwd_dim(int family, int64_t d) {
    return fc_dim_at_least(family == FC_FAMILY_SM90WS ? kFcSm90wsFwdDims
                           : family == FC_FAMILY_SM90 ? kFcSm90FwdDims
                                                      : kFcSm80FwdDims,
                           d);
}

// Head dims past the sm80 list (which every family's dims are among, so the
// dispatch falls back to sm80 where sm90 has no instance) are refused; the
// CPU backend takes them (issue 20: 512, MLA's 576/512).
flashc_status fc_cuda_fwd_dim_check(const fc_attn *a) {
    return fc_dim_check(a, kFcSm80FwdDims, "forward");
}

// ---- the sm90ws rows (traits.h): a head dim's row, or its short-work row ----
typedef struct {
    int br, bc;      // the TMA boxes' rows: the query tile, the key tile
    int smem;        // dynamic shared memory per CTA
    bool persistent; // one CTA per SM walking a schedule (and GQA packing)
} fc_ws_row;

template <int D>
static fc_ws_row fc_sm90ws_row_of(bool short_row) {
    if constexpr (fc_sm90ws_fwd_has_short<D>::value) {
        using Tr = fc_sm90ws_fwd_traits<D, true>;
        if (short_row) return {Tr::kBr, Tr::kBc, Tr::kSmemBytes, Tr::kPersistent};
    }
    using Tr = fc_sm90ws_fwd_traits<D>;
    return {Tr::kBr, Tr::kBc, Tr::kSmemBytes, Tr::kPersistent};
}

// The sm90ws row of head dim `dim`: its short-work row when short_row and
// there is one, else its row; all zero if no instance.
static fc_ws_row fc_sm90ws_row(int dim, bool short_row) {
#define FC_ROW90WS_(D) \
    if (dim == D) return fc_sm90ws_row_of<D>(short_row);
    FC_SM90WS_FWD_HEADDIMS(FC_ROW90WS_)
#undef FC_ROW90WS_
    return fc_ws_row{};
}

// Whether head dim `dim` has a short-work row in this build.
static bool fc_sm90ws_has_short(int dim) {
#define FC_HAS_SHORT90WS_(D) \
    if (dim == D) return fc_sm90ws_fwd_has_short<D>::value;
    FC_SM90WS_FWD_HEADDIMS(FC_HAS_SHORT90WS_)
#undef FC_HAS_SHORT90WS_
    return false;
}

// Shared memory of the family's instance for head dim `dim` (0 if none); sm90ws:
// of the row short_row picks.
static int fc_fwd_smem(int family, int dim, bool short_row) {
#define FC_SMEM80_(D) \
    if (family == FC_FAMILY_SM80 && dim == D) return fc_sm80_fwd_traits<D>::kSmemBytes;
#define FC_SMEM90_(D) \
    if (family == FC_FAMILY_SM90 && dim == D) return fc_sm90_fwd_traits<D>::kSmemBytes;
    FC_SM80_FWD_HEADDIMS(FC_SMEM80_)
    FC_SM90_FWD_HEADDIMS(FC_SMEM90_)
#undef FC_SMEM80_
#undef FC_SMEM90_
    return family == FC_FAMILY_SM90WS ? fc_sm90ws_row(dim, short_row).smem : 0;
}

static dim3 fc_fwd_grid(const fc_cuda_fwd_params &p, int br) {
    return dim3((unsigned)((p.seqlen_q + br - 1) / br), (unsigned)p.heads, (unsigned)p.batch);
}

template <int D, typename T>
static cudaError_t fc_sm80_fwd_run(const fc_cuda_fwd_params &p, bool causal,
                                   cudaStream_t stream) {
    using Tr = fc_sm80_fwd_traits<D>;
    const dim3 grid = fc_fwd_grid(p, Tr::kBr);
    FC_LOG("sm80_fwd_kernel<D=%d, %s, causal=%d>: Br=%d Bc=%d warps=%d stages=%d q_in_regs=%d "
           "grid=(%u,%u,%u) block=%d smem=%d", D, fc_cuda_dtype_name<T>(), (int)causal, Tr::kBr,
           Tr::kBc, Tr::kWarps, Tr::kStages, (int)Tr::kQinRegs, grid.x, grid.y, grid.z,
           Tr::kThreads, Tr::kSmemBytes);
    return causal ? sm80_fwd_launch<D, T, true>(p, grid, stream)
                  : sm80_fwd_launch<D, T, false>(p, grid, stream);
}

template <int D, typename T>
static cudaError_t fc_sm90_fwd_run(const fc_cuda_fwd_params &p, bool causal,
                                   cudaStream_t stream) {
    using Tr = fc_sm90_fwd_traits<D>;
    const dim3 grid = fc_fwd_grid(p, Tr::kBr);
    FC_LOG("sm90_fwd_kernel<D=%d, %s, causal=%d>: Br=%d Bc=%d warpgroups=%d stages=%d "
           "grid=(%u,%u,%u) block=%d smem=%d", D, fc_cuda_dtype_name<T>(), (int)causal, Tr::kBr,
           Tr::kBc, Tr::kWarpgroups, Tr::kStages, grid.x, grid.y, grid.z, Tr::kThreads,
           Tr::kSmemBytes);
    return causal ? sm90_fwd_launch<D, T, true>(p, grid, stream)
                  : sm90_fwd_launch<D, T, false>(p, grid, stream);
}

// The rows of one TMA box of K / V for key tiles of bc rows: bc, or, paged,
// the page size when it is a multiple of bc, or a multiple of 8 dividing it
// (then a tile takes bc / page_size boxes); 0 when no box fits the pages.
static int fc_sm90ws_kv_box_rows(const fc_attn *a, int bc) {
    if (!a->block_table) return bc;
    const int64_t ps = a->page_size;
    if (ps % bc == 0) return bc;
    return bc % ps == 0 && ps % 8 == 0 ? (int)ps : 0;
}

// GQA packing (ws_params.h): the G = heads / kv_heads query heads of a KV head
// share query tiles. It can when the instance is persistent (the one-tile
// kernels have no kPack instance), Br % G == 0 (a tile starts at a query
// position; Br is a power of two, so G is one too: the kernel shifts by
// pack_shift = log2 G) and there is no ALiBi or dropout (their per-row head).
// It does (FLASHC_CUDA_GQA_PACK unset or "auto") when it fills the tiles better, a
// head's own tiles holding Sq / round_up(Sq, Br) of their rows below 0.9 of
// the packed tiles' Sq G / round_up(Sq G, Br) (FA3's rule; Sq is
// max_seqlen_q for varlen), and it also takes fewer waves of tiles over the
// SMs. The waves part is fitted to the twelve shapes of bench/NOTES.md issue 18
// run 42: with as many waves, packing measured 1-6% slower (2% faster once);
// with fewer, 13-58% faster, causal or not. FLASHC_CUDA_GQA_PACK=1 packs
// whenever it can (the tests), =0 never, any other value is the rule. Returns
// G, or 1 (no packing).
static int fc_sm90ws_pack(const fc_attn *a, int br, bool persistent, int sms) {
    const int64_t g = a->heads / a->kv_heads, sq = a->max_seqlen_q;
    if (!persistent || br == 0 || g <= 1 || br % g != 0 || a->alibi || a->dropout_p > 0.0f) return 1;
    if (sq * g >= (int64_t)1 << 30) return 1;  // the kernel's packed rows are int
    if (g & (g - 1)) return 1;                   // the kernel shifts by log2(G)
    const char *force = getenv("FLASHC_CUDA_GQA_PACK");
    if (force && strcmp(force, "1") == 0) return (int)g;
    if (force && strcmp(force, "0") == 0) return 1;
    const auto fill = [br](int64_t rows) {
        return (double)rows / (double)((rows + br - 1) / br * br);
    };
    // waves of tiles: tiles per (batch, head) times the heads, over the SMs
    const auto waves = [&](int64_t rows, int64_t heads) {
        return ((rows + br - 1) / br * heads * a->batch + sms - 1) / sms;
    };
    const bool fewer = waves(sq * g, a->kv_heads) < waves(sq, a->heads);
    return fill(sq) < 0.9 * fill(sq * g) && fewer ? (int)g : 1;
}

// The keys a query row sees, on average over the rows of a sequence of
// max_seqlen_q queries and max_seqlen_k keys (causal aligned bottom-right; a
// window bounds it by its width).
static double fc_mean_keys(const fc_attn *a) {
    const double sq = (double)a->max_seqlen_q, sk = (double)a->max_seqlen_k;
    double keys = sk;
    if (a->window_right == 0 && a->window_left < 0)
        keys = sk >= sq ? sk - (sq - 1.0) / 2.0 : sk * (sk + 1.0) / (2.0 * sq);
    if (a->window_left >= 0 && a->window_right >= 0) {
        const double width = (double)a->window_left + (double)a->window_right + 1.0;
        if (width < keys) keys = width;
    }
    return keys;
}

// Whether the call runs head dim `dim`'s short-work row (traits.h
// FC_SM90WS_FWD_SHORT_TILES), when it has one: when that row packs the call's
// GQA groups (fc_sm90ws_pack), or when a query row sees at most 1280 keys on
// average (10 key tiles of 128). Fitted to bench/NOTES.md issue 18 run 46 (D64,
// two persistent consumers against three one-tile ones): 2-17% faster at
// 512-1k keys a row, as fast at ~1k (2k causal), 9-19% slower at 2k-8k, and
// 2.4x as fast where packing applies (16 queries over 4k keys).
// FLASHC_CUDA_SHORT_ROW=1 takes the short-work row wherever there is one (the
// tests), =0 never, any other value is the rule. *pack: the pack of the row
// that runs (fc_sm90ws_pack), computed once here.
static bool fc_sm90ws_short(const fc_attn *a, int dim, int sms, int *pack) {
    const fc_ws_row row = fc_sm90ws_row(dim, false);
    *pack = fc_sm90ws_pack(a, row.br, row.persistent, sms);
    if (!fc_sm90ws_has_short(dim)) return false;
    const fc_ws_row r = fc_sm90ws_row(dim, true);
    const int short_pack = fc_sm90ws_pack(a, r.br, r.persistent, sms);
    const char *force = getenv("FLASHC_CUDA_SHORT_ROW");
    bool take = short_pack > 1 || fc_mean_keys(a) <= 1280.0;
    if (force && strcmp(force, "1") == 0) take = true;
    if (force && strcmp(force, "0") == 0) take = false;
    if (take) *pack = short_pack;
    return take;
}

// A persistent instance (traits.h) gets the schedule's size (sm90ws/fwd_kernel.cuh
// fc_ws_schedule: tiles, or causal pairs of tiles) and one CTA per SM, or fewer
// when there are fewer items; the others one CTA per query tile. Packed
// (wp.pack > 1), a head's tiles are its KV head's packed rows.
template <int D, bool kShort, typename T>
static cudaError_t fc_sm90ws_fwd_run_row(fc_cuda_fwd_ws_params wp, bool causal, int sms,
                                         cudaStream_t stream) {
    using Tr = fc_sm90ws_fwd_traits<D, kShort>;
    const fc_cuda_fwd_params &p = wp.f;
    const int64_t packed_rows = (int64_t)p.seqlen_q * wp.pack;
    dim3 grid((unsigned)((packed_rows + Tr::kBr - 1) / Tr::kBr), (unsigned)(p.heads / wp.pack),
              (unsigned)p.batch);
    wp.m_blocks = (int32_t)grid.x;
    // Causal pairs of tiles balance the work of a head's tiles, but halve the
    // items: packed, a pair is an item only while there are enough pairs to
    // fill the SMs (a short query over long keys: every tile sees about the
    // same keys anyway).
    const int64_t pairs = (int64_t)(grid.x + 1) / 2 * grid.y * p.batch;
    wp.pair = causal && (wp.pack == 1 || pairs >= sms);
    wp.items = wp.pair ? pairs : (int64_t)grid.x * grid.y * p.batch;
    if (Tr::kPersistent) grid = dim3((unsigned)(wp.items < sms ? wp.items : sms));
    FC_LOG("sm90ws_fwd_kernel<D=%d, %s, causal=%d>: short=%d Br=%d Bc=%d consumers=%d "
           "stages=%d ping-pong=%d persistent=%d pack=%d pairs=%d items=%lld grid=(%u,%u,%u) "
           "block=%d smem=%d", D, fc_cuda_dtype_name<T>(), (int)causal, (int)kShort, Tr::kBr,
           Tr::kBc, Tr::kConsumers, Tr::kStages, (int)Tr::kPingPong, (int)Tr::kPersistent,
           wp.pack, wp.pair, (long long)wp.items, grid.x, grid.y, grid.z, Tr::kThreads,
           Tr::kSmemBytes);
    return causal ? sm90ws_fwd_launch<D, T, true>(wp, grid, stream)
                  : sm90ws_fwd_launch<D, T, false>(wp, grid, stream);
}
template <int D, typename T>
static cudaError_t fc_sm90ws_fwd_run(const fc_cuda_fwd_ws_params &wp, bool causal, int sms,
                                     cudaStream_t stream) {
    if constexpr (fc_sm90ws_fwd_has_short<D>::value)
        if (wp.short_row) return fc_sm90ws_fwd_run_row<D, true, T>(wp, causal, sms, stream);
    return fc_sm90ws_fwd_run_row<D, false, T>(wp, causal, sms, stream);
}

// ---- the forward ----
// What fc_cuda_fwd will run: the instance and whether there is work at all.
typedef struct {
    int family;  // FC_FAMILY_SM80, FC_FAMILY_SM90 or FC_FAMILY_SM90WS
    int dim;     // compiled head dim of the family (>= D and Dv, zero-padded)
    bool causal; // the kCausal instance (right window edge on the diagonal)
    bool empty;  // nothing to compute (no batch, head or query row)
    int sms;     // the device's multiprocessors (a persistent grid's size)
    bool short_row; // sm90ws: the head dim's short-work row (fc_sm90ws_short)
    int pack;       // sm90ws: GQA packing of that row, G or 1 (fc_sm90ws_pack)
} fc_cuda_fwd_plan;

// Why the sm90ws family cannot take a call the sm90 family can, or NULL; the
// row of `dim` that would run it is short_row's.
static const char *fc_fwd_ws_refusal(const fc_attn *a, int dim, bool short_row) {
    const char *force = getenv("FLASHC_CUDA_FAMILY");
    if (force && strcmp(force, "sm90") == 0) return "FLASHC_CUDA_FAMILY=sm90";
    if (dim == 0) return "no instance for this head dim";
    // paged: a page holds whole key tiles, or whole chunks of a tile of a
    // multiple of 8 rows (the 128B swizzle repeats every 8 rows), each one TMA
    // box (fc_sm90ws_kv_box_rows); a cp.async producer for the rest is not here yet
    if (a->block_table) {
        if (fc_sm90ws_kv_box_rows(a, fc_sm90ws_row(dim, short_row).bc) == 0)
            return "paged K/V with a page size that is neither a multiple of the key tile nor a "
                   "multiple of 8 dividing it";
        if (a->k_leftpad) return "paged K/V with cache_leftpad";
    }
    if (!fc_cuda_tma_available()) return "the driver has no cuTensorMapEncodeTiled";
    return NULL;
}

// Every check of the CUDA forward, nothing launched: the dtype, options and
// layouts the kernels take, and the current device.
static flashc_status fc_cuda_fwd_check(const fc_attn *a, fc_cuda_fwd_plan *plan) {
    FC_TRY(fc_cuda_dtype_check(a));
    FC_TRY(fc_cuda_fwd_dim_check(a));
    const int64_t d8 = fc_cuda_d8(a);
    FC_TRY(fc_cuda_len_check(a));
    FC_TRY(fc_cuda_grid_check(a->batch, a->heads, "heads"));
    plan->causal = a->window_right == 0;
    plan->empty = a->batch == 0 || a->heads == 0 || a->max_seqlen_q == 0;

    fc_cuda_device dv;
    FC_TRY(fc_cuda_device_get(&dv));
    plan->family = fc_cuda_family(dv, d8, fc_fwd_dim(FC_FAMILY_SM90, d8) != 0);
    plan->sms = dv.sms;
    plan->short_row = false;
    plan->pack = 1;
    if (plan->family == FC_FAMILY_SM90) {
        const int dim = fc_fwd_dim(FC_FAMILY_SM90WS, d8);
        int pack = 1;
        const bool short_row = dim != 0 && fc_sm90ws_short(a, dim, dv.sms, &pack);
        const char *why = fc_fwd_ws_refusal(a, dim, short_row);
        if (why) {
            FC_LOG("sm90ws family not used (%s): the sm90 family runs", why);
        } else {
            plan->family = FC_FAMILY_SM90WS;
            plan->short_row = short_row;
            plan->pack = pack;
        }
    }
    plan->dim = fc_fwd_dim(plan->family, d8);
    const int smem = fc_fwd_smem(plan->family, plan->dim, plan->short_row);
    if (smem > dv.smem_optin)
        return fc_set_error(FLASHC_ERR_UNSUPPORTED,
                            "head_dim=%lld, value head_dim=%lld need %d bytes of shared memory "
                            "per block but CUDA device %d allows %d",
                            (long long)a->head_dim, (long long)a->head_dim_v, smem, dv.dev,
                            dv.smem_optin);
    return FLASHC_OK;
}

// ---- the workspace: the repacked operands, then the lse of attn_probs ----
// attn_probs are computed from the forward's lse (probs.cu); a call that asks
// for them but not for softmax_lse gets one here, fp32 [H, total_q] (varlen:
// rows are global tokens, lse_s_batch = 0) or [B, H, Sq], after the repack.
typedef struct {
    fc_cuda_pack_plan pk;
    size_t lse_off;  // the lse's region, when lse_elems > 0
    int64_t lse_elems;
    size_t bytes;    // the whole workspace
} fc_cuda_fwd_ws;

static fc_cuda_fwd_ws fc_cuda_fwd_ws_layout(const fc_attn *a) {
    fc_cuda_fwd_ws w;
    w.pk = fc_cuda_pack_layout(a, FC_PACK_DOUT);
    w.lse_off = (w.pk.bytes + FLASHC_WORKSPACE_ALIGN - 1) / FLASHC_WORKSPACE_ALIGN *
                FLASHC_WORKSPACE_ALIGN;
    w.lse_elems = a->probs && !a->lse
                      ? a->heads * (a->cu_seqlens_q ? a->total_q : a->batch * a->max_seqlen_q)
                      : 0;
    w.bytes = w.lse_elems ? w.lse_off + (size_t)w.lse_elems * sizeof(float) : w.pk.bytes;
    return w;
}

extern "C" size_t fc_cuda_fwd_workspace(const fc_attn *a) {
    return fc_cuda_fwd_ws_layout(a).bytes;
}

extern "C" flashc_status fc_cuda_fwd_supported(const fc_attn *a) {
    fc_cuda_fwd_plan plan;
    return fc_cuda_fwd_check(a, &plan);
}

extern "C" flashc_status fc_cuda_fwd(const fc_attn *a, void *ws, size_t ws_bytes) {
    fc_cuda_fwd_plan plan;
    FC_TRY(fc_cuda_fwd_check(a, &plan));
    if (plan.empty) return FLASHC_OK;
    const cudaStream_t stream = (cudaStream_t)a->stream;

    // ---- repack what the kernels cannot read in place ----
    const fc_cuda_fwd_ws w = fc_cuda_fwd_ws_layout(a);
    const fc_cuda_pack_plan &pk = w.pk;
    if (ws_bytes < w.bytes || (w.bytes && !ws))
        return fc_set_error(FLASHC_ERR_WORKSPACE_TOO_SMALL,
                            "workspace_bytes=%zu but %zu are needed", ws_bytes, w.bytes);
    fc_attn packed;
    FC_CUDA_TRY(fc_cuda_pack_start(a, pk, ws, {FC_PACK_OUT}, stream, &packed));
    if (w.lse_elems) {  // attn_probs without softmax_lse: the workspace's lse
        const int64_t rows = a->cu_seqlens_q ? a->total_q : a->max_seqlen_q;
        packed.lse = (float *)((char *)ws + w.lse_off);
        packed.lse_s_batch = a->cu_seqlens_q ? 0 : a->heads * rows;
        packed.lse_s_head = rows;
        packed.lse_s_seq = 1;
    }
    fc_cuda_fwd_params p = fc_cuda_fwd_make_params(&packed);
    p.head_dim = (int32_t)pk.dp;
    p.head_dim_v = (int32_t)pk.dpv;

    // ---- dispatch: one switch over the family's compiled head dims ----
    const bool bf16 = a->dtype == FLASHC_DTYPE_BF16;
    cudaError_t e = cudaErrorInvalidValue;  // no instance: cannot happen after the check
#define FC_CASE_(F, D)                                                            \
    case D:                                                                       \
        e = bf16 ? fc_##F##_fwd_run<D, __nv_bfloat16>(p, plan.causal, stream)     \
                 : fc_##F##_fwd_run<D, __half>(p, plan.causal, stream);           \
        break;
#define FC_CASE80_(D) FC_CASE_(sm80, D)
#define FC_CASE90_(D) FC_CASE_(sm90, D)
#define FC_CASE90WS_(D)                                                         \
    case D:                                                                     \
        e = bf16 ? fc_sm90ws_fwd_run<D, __nv_bfloat16>(wp, plan.causal, plan.sms, stream) \
                 : fc_sm90ws_fwd_run<D, __half>(wp, plan.causal, plan.sms, stream);       \
        break;
    if (plan.family == FC_FAMILY_SM90WS) {
        // the TMA descriptors of q, k, v: boxes of 64 columns by Br rows (q; packed,
        // G heads by Br / G rows), Bc rows or, paged, a page of a size that divides
        // Bc (k, v); v of its own head dim (the columns past it read as zeros)
        fc_cuda_fwd_ws_params wp;
        wp.f = p;
        wp.short_row = plan.short_row;
        const fc_ws_row row = fc_sm90ws_row(plan.dim, plan.short_row);
        const int br = row.br;
        wp.pack = plan.pack;
        wp.pack_shift = __builtin_ctz((unsigned)wp.pack);  // a power of two
        const int kv_rows = fc_sm90ws_kv_box_rows(a, row.bc);
        if (!fc_cuda_tma_map(&wp.tma_q, packed.q, pk.dims[FC_PACK_Q], pk.dp, wp.pack,
                             br / wp.pack) ||
            !fc_cuda_tma_map(&wp.tma_k, packed.k, pk.dims[FC_PACK_K], pk.dp, 1, kv_rows) ||
            !fc_cuda_tma_map(&wp.tma_v, packed.v, pk.dims[FC_PACK_V], pk.dpv, 1, kv_rows))
            return fc_set_error(FLASHC_ERR_CUDA,
                                "the CUDA driver refused a TMA descriptor of q, k or v (the "
                                "sm90ws family; FLASHC_CUDA_FAMILY=sm90 runs without TMA)");
        switch (plan.dim) {
            FC_SM90WS_FWD_HEADDIMS(FC_CASE90WS_)
        default: break;
        }
    } else if (plan.family == FC_FAMILY_SM90) {
        switch (plan.dim) {
            FC_SM90_FWD_HEADDIMS(FC_CASE90_)
        default: break;
        }
    } else {
        switch (plan.dim) {
            FC_SM80_FWD_HEADDIMS(FC_CASE80_)
        default: break;
        }
    }
#undef FC_CASE80_
#undef FC_CASE90_
#undef FC_CASE90WS_
#undef FC_CASE_
    if (e != cudaSuccess)
        return fc_set_error(FLASHC_ERR_CUDA, "%s_fwd_kernel<D=%d, %s, causal=%d> launch: %s",
                            fc_cuda_family_name(plan.family), plan.dim, bf16 ? "bf16" : "fp16", (int)plan.causal,
                            cudaGetErrorString(e));
    if (a->probs) {
        const fc_probs_dst dst = {a->probs, a->probs_s_batch, a->probs_s_head, a->probs_s_row};
        e = fc_probs_launch(p, dst, bf16, stream);
        if (e != cudaSuccess)
            return fc_set_error(FLASHC_ERR_CUDA, "fc_probs_kernel launch: %s",
                                cudaGetErrorString(e));
    }
    FC_CUDA_TRY(fc_cuda_pack_finish(a, pk, ws, {FC_PACK_OUT}, stream));
    return FLASHC_OK;
}
