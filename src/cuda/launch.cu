// launch.cu : the host side of the CUDA backend, and the only file that knows
// which kernels exist (flash-attention's flash_api.cpp + launch templates).
//
//   fc_cuda_fwd(a)  fc_attn (api.c's validated problem) -> fc_cuda_fwd_params
//                   (params.h: host-derived constants such as score_scale * log2 e),
//                   the kernel family for the device, head dim rounded up to a
//                   compiled instance of it (zero-padded), one switch over the
//                   family's generated list of head dims (sm80/inst/instances.h,
//                   sm90/inst/instances.h), grid from the tuning table
//                   (traits.h), launch on a->stream, cudaGetLastError.
//   fc_cuda_fwd_supported(a)  the same checks, nothing launched.
//   fc_cuda_fwd_workspace(a)  bytes for the repacked operands (common/repack.cuh):
//                   q, k, v, out that are not 16-byte aligned, have a stride
//                   that is not a multiple of 8 elements, or (all four) when D
//                   is not a multiple of 8; 0 when every operand is read in place.
//
// Families: sm90 (wgmma, sm90/fwd_kernel.cuh) on devices of compute capability
// 9.0 when the build has sm_90a code, for head dims above 32; sm80 (mma.sync,
// sm80/fwd_kernel.cuh) everywhere else (>= 8.0). FLASHC_CUDA_FAMILY=sm80 in the
// environment forces sm80 on Hopper too (tests and benchmarks of both).
// With FLASHC_LOG=1 every launch writes one line (FC_LOG, src/util.c): the
// kernel, its tile, grid, block, shared memory and, for decode, num_splits.
// Nothing here synchronises, allocates, or reads device memory: every pointer
// in fc_attn (tensors, cu_seqlens, seqused_k, block_table, ...) is a device
// pointer on this path, and api.c must not have read their contents.
//
// Not here yet: attn_probs (FLASHC_ERR_UNSUPPORTED), fp32 inputs.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <initializer_list>
#include <type_traits>

#include "backend.h"
#include "common/repack.cuh"
#include "params.h"
#include "sm80/inst/instances.h"
#include "sm90/inst/instances.h"
#include "traits.h"

// ---- errors ----
// Evaluate a CUDA runtime call; on failure record it (call, error, place) and
// return FLASHC_ERR_CUDA from the enclosing function. Never aborts.
#define FC_CUDA_TRY(expr)                                                                    \
    do {                                                                                     \
        cudaError_t fc_cuda_e_ = (expr);                                                     \
        if (fc_cuda_e_ != cudaSuccess)                                                       \
            return fc_set_error(FLASHC_ERR_CUDA, "%s: %s (%s:%d)", #expr,                    \
                                cudaGetErrorString(fc_cuda_e_), __FILE__, __LINE__);         \
    } while (0)

// ---- the dtype and device every kernel needs ----
// bf16 or fp16.
static flashc_status fc_cuda_dtype_check(const fc_attn *a) {
    if (a->dtype != FLASHC_DTYPE_BF16 && a->dtype != FLASHC_DTYPE_FP16)
        return fc_set_error(FLASHC_ERR_UNSUPPORTED,
                            "q.dtype=%s but the CUDA backend supports bf16 and fp16",
                            flashc_dtype_name(a->dtype));
    return FLASHC_OK;
}

// The current device's properties the plans read.
typedef struct {
    int dev, major, minor, sms, smem_optin;
} fc_cuda_device;

// The current device, checked: compute capability >= 8.0.
static flashc_status fc_cuda_device_get(fc_cuda_device *d) {
    *d = fc_cuda_device{};
    FC_CUDA_TRY(cudaGetDevice(&d->dev));
    FC_CUDA_TRY(cudaDeviceGetAttribute(&d->major, cudaDevAttrComputeCapabilityMajor, d->dev));
    FC_CUDA_TRY(cudaDeviceGetAttribute(&d->minor, cudaDevAttrComputeCapabilityMinor, d->dev));
    FC_CUDA_TRY(cudaDeviceGetAttribute(&d->sms, cudaDevAttrMultiProcessorCount, d->dev));
    FC_CUDA_TRY(cudaDeviceGetAttribute(&d->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                       d->dev));
    if (d->major < 8)
        return fc_set_error(FLASHC_ERR_UNSUPPORTED,
                            "CUDA device %d has compute capability %d.x but flashc needs >= 8.0",
                            d->dev, d->major);
    return FLASHC_OK;
}

// Every length and row, page or batch count the kernels hold in an int is
// below 2^30, so their int row arithmetic (a sum of two) cannot overflow.
static flashc_status fc_cuda_len_check(const fc_attn *a) {
    const int64_t kMaxLen = (int64_t)1 << 30;
    if (a->max_seqlen_q >= kMaxLen || a->max_seqlen_k >= kMaxLen || a->total_q >= kMaxLen ||
        a->total_k >= kMaxLen || a->bt_cols >= kMaxLen)
        return fc_set_error(FLASHC_ERR_UNSUPPORTED,
                            "max_seqlen_q=%lld, max_seqlen_k=%lld, total_q=%lld, total_k=%lld, "
                            "block_table.shape[1]=%lld but the CUDA backend needs each below 2^30",
                            (long long)a->max_seqlen_q, (long long)a->max_seqlen_k,
                            (long long)a->total_q, (long long)a->total_k, (long long)a->bt_cols);
    return FLASHC_OK;
}

// ---- operands the kernels read in place, and the repacked rest ----
// 16-byte cp.async / vector stores: data 16-byte aligned, every stride a
// multiple of 8 elements (2-byte dtypes), D a multiple of 8.
static bool fc_cuda_view_direct(const fc_view *v, int64_t d) {
    return d % 8 == 0 && (uintptr_t)v->ptr % 16 == 0 && v->s_batch % 8 == 0 &&
           v->s_seq % 8 == 0 && v->s_head % 8 == 0;
}

// The operands a call may repack: the forward's q, k, v, out, and the
// backward's dout, dk, dv besides.
enum { FC_PACK_Q, FC_PACK_K, FC_PACK_V, FC_PACK_OUT, FC_PACK_DOUT, FC_PACK_DK, FC_PACK_DV, FC_PACK_N };
static const bool kFcPackIsKv[FC_PACK_N] = {false, true, true, false, false, true, true};

// Which operands go through the workspace, their index spaces and its carving.
typedef struct {
    int64_t dp;                      // D rounded up to 8: the packed row length
    bool packed[FC_PACK_N];          // the operands in enum order (false: in place or absent)
    fc_cuda_pack_dims dims[FC_PACK_N];
    size_t off[FC_PACK_N];           // region offsets in the workspace
    size_t bytes;                    // the workspace needed (0: none)
} fc_cuda_pack_plan;

// The operand views of *a in enum order (the backward's absent in a forward).
static void fc_cuda_pack_views(const fc_attn *a, const fc_view *v[FC_PACK_N]) {
    v[FC_PACK_Q] = &a->q, v[FC_PACK_K] = &a->k, v[FC_PACK_V] = &a->v, v[FC_PACK_OUT] = &a->out;
    v[FC_PACK_DOUT] = &a->dout, v[FC_PACK_DK] = &a->dk, v[FC_PACK_DV] = &a->dv;
}

// The plan for the first n operands of the enum (the forward's 4, the backward's all).
static fc_cuda_pack_plan fc_cuda_pack_layout(const fc_attn *a, int n) {
    fc_cuda_pack_plan pk = {};
    pk.dp = (a->head_dim + 7) / 8 * 8;
    const bool varlen = a->cu_seqlens_q != NULL;
    // q-likes: batched [B, Sq], varlen [1, total_q]
    const fc_cuda_pack_dims qd = {varlen ? 1 : a->batch, varlen ? a->total_q : a->max_seqlen_q,
                                  a->heads};
    // k-likes: batched [B, Sk], varlen [1, total_k], paged [pages, page_size], a
    // kvcache read through k_batch_idx [cache batches (total_k), Sk]
    const fc_cuda_pack_dims kd = {a->block_table || a->k_batch_idx ? a->total_k
                                  : varlen                        ? 1
                                                                  : a->batch,
                                  a->block_table ? a->page_size
                                  : varlen       ? a->total_k
                                                 : a->max_seqlen_k,
                                  a->kv_heads};
    const fc_view *views[FC_PACK_N];
    fc_cuda_pack_views(a, views);
    size_t sizes[FC_PACK_N];
    const bool empty = a->batch == 0 || a->heads == 0 || a->max_seqlen_q == 0;
    for (int i = 0; i < FC_PACK_N; i++) {
        pk.dims[i] = kFcPackIsKv[i] ? kd : qd;
        pk.packed[i] = !empty && i < n && !fc_cuda_view_direct(views[i], a->head_dim);
        sizes[i] = pk.packed[i] ? (size_t)fc_cuda_pack_elems(pk.dims[i], pk.dp) * 2 : 0;
    }
    pk.bytes = fc_ws_layout(FC_PACK_N, sizes, pk.off);
    return pk;
}

// *a with every packed operand replaced by its dense copy in ws: the inputs
// are copied there on stream, the outputs (operands in `outs`) are copied back
// by fc_cuda_pack_finish.
static cudaError_t fc_cuda_pack_start(const fc_attn *a, const fc_cuda_pack_plan &pk, void *ws,
                                      std::initializer_list<int> outs, cudaStream_t stream,
                                      fc_attn *packed) {
    *packed = *a;
    const fc_view *src[FC_PACK_N];
    fc_cuda_pack_views(a, src);
    fc_view *dst[FC_PACK_N] = {&packed->q,    &packed->k,  &packed->v, &packed->out,
                               &packed->dout, &packed->dk, &packed->dv};
    for (int i = 0; i < FC_PACK_N; i++) {
        if (!pk.packed[i]) continue;
        const fc_cuda_pack_dims &e = pk.dims[i];
        void *buf = (char *)ws + pk.off[i];
        // dense [n0, n1, heads, dp]; varlen rows by token index (s_batch 0)
        const int64_t s_head = pk.dp, s_seq = e.heads * pk.dp;
        const bool paged_kv = kFcPackIsKv[i] && a->block_table;
        const int64_t s_batch = a->cu_seqlens_q && !paged_kv ? 0 : e.n1 * s_seq;
        bool output = false;
        for (int o : outs) output = output || o == i;
        if (!output) {
            const cudaError_t err = fc_cuda_pack(buf, *src[i], e, a->head_dim, pk.dp, stream);
            if (err != cudaSuccess) return err;
        }
        *dst[i] = fc_view{buf, s_batch, s_seq, s_head};
    }
    return cudaSuccess;
}

// Copy the packed outputs among `outs` back into the caller's views.
static cudaError_t fc_cuda_pack_finish(const fc_attn *a, const fc_cuda_pack_plan &pk, void *ws,
                                       std::initializer_list<int> outs, cudaStream_t stream) {
    const fc_view *views[FC_PACK_N];
    fc_cuda_pack_views(a, views);
    for (int i : outs) {
        if (!pk.packed[i]) continue;
        // dk, dv rows past cu_seqlens_k[B] belong to no sequence (q-likes: cu_seqlens_q)
        const int32_t *cu = kFcPackIsKv[i] ? a->cu_seqlens_k : a->cu_seqlens_q;
        const cudaError_t err = fc_cuda_unpack(*views[i], (char *)ws + pk.off[i], pk.dims[i],
                                               a->head_dim, pk.dp, cu, a->batch, stream);
        if (err != cudaSuccess) return err;
    }
    return cudaSuccess;
}

// ---- the instances ----
enum { FC_FAMILY_SM80 = 80, FC_FAMILY_SM90 = 90 };

// Smallest compiled head dim >= d of the family, or 0.
static int fc_fwd_dim(int family, int64_t d) {
#define FC_DIM_(D) \
    if (d <= D) return D;
    if (family == FC_FAMILY_SM90) {
        FC_SM90_FWD_HEADDIMS(FC_DIM_)
    } else {
        FC_SM80_FWD_HEADDIMS(FC_DIM_)
    }
#undef FC_DIM_
    return 0;
}

// Largest compiled head dim (of the sm80 family, which has them all).
static int fc_fwd_max_dim(void) {
    int m = 0;
#define FC_MAX_(D) m = D;
    FC_SM80_FWD_HEADDIMS(FC_MAX_)
#undef FC_MAX_
    return m;
}

// Shared memory of the family's instance for head dim `dim` (0 if none).
static int fc_fwd_smem(int family, int dim) {
#define FC_SMEM80_(D) \
    if (family == FC_FAMILY_SM80 && dim == D) return fc_sm80_fwd_traits<D>::kSmemBytes;
#define FC_SMEM90_(D) \
    if (family == FC_FAMILY_SM90 && dim == D) return fc_sm90_fwd_traits<D>::kSmemBytes;
    FC_SM80_FWD_HEADDIMS(FC_SMEM80_)
    FC_SM90_FWD_HEADDIMS(FC_SMEM90_)
#undef FC_SMEM80_
#undef FC_SMEM90_
    return 0;
}

static dim3 fc_fwd_grid(const fc_cuda_fwd_params &p, int br) {
    return dim3((unsigned)((p.seqlen_q + br - 1) / br), (unsigned)p.heads, (unsigned)p.batch);
}

// "bf16" or "fp16", for the launch log.
template <typename T>
static const char *fc_cuda_dtype_name() {
    return std::is_same<T, __nv_bfloat16>::value ? "bf16" : "fp16";
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

// ---- the forward ----
// What fc_cuda_fwd will run: the instance and whether there is work at all.
typedef struct {
    int family;  // FC_FAMILY_SM80 or FC_FAMILY_SM90
    int dim;     // compiled head dim of the family (>= head_dim, zero-padded)
    bool causal; // the kCausal instance (right window edge on the diagonal)
    bool empty;  // nothing to compute (no batch, head or query row)
} fc_cuda_fwd_plan;

// Every check of the CUDA forward, nothing launched: the dtype, options and
// layouts the kernels take, and the current device.
static flashc_status fc_cuda_fwd_check(const fc_attn *a, fc_cuda_fwd_plan *plan) {
    FC_TRY(fc_cuda_dtype_check(a));
    if (a->probs)
        return fc_set_error(FLASHC_ERR_UNSUPPORTED,
                            "attn_probs is not supported by the CUDA backend (use the CPU)");
    const int64_t d8 = (a->head_dim + 7) / 8 * 8;
    if (fc_fwd_dim(FC_FAMILY_SM80, d8) == 0)
        return fc_set_error(FLASHC_ERR_UNSUPPORTED,
                            "head_dim=%lld but this CUDA build supports up to %d",
                            (long long)a->head_dim, fc_fwd_max_dim());
    FC_TRY(fc_cuda_len_check(a));
    if (a->batch > 65535 || a->heads > 65535)
        return fc_set_error(FLASHC_ERR_UNSUPPORTED,
                            "batch=%lld, heads=%lld but the CUDA backend needs both <= 65535",
                            (long long)a->batch, (long long)a->heads);
    plan->causal = a->window_right == 0;
    plan->empty = a->batch == 0 || a->heads == 0 || a->max_seqlen_q == 0;

    fc_cuda_device dv;
    FC_TRY(fc_cuda_device_get(&dv));
    // sm_90a code runs on compute capability 9.0 exactly
    const char *force = getenv("FLASHC_CUDA_FAMILY");
    const bool sm90 = dv.major == 9 && dv.minor == 0 && d8 > 32 &&
                      fc_fwd_dim(FC_FAMILY_SM90, d8) != 0 && !(force && strcmp(force, "sm80") == 0);
    plan->family = sm90 ? FC_FAMILY_SM90 : FC_FAMILY_SM80;
    plan->dim = fc_fwd_dim(plan->family, d8);
    const int smem = fc_fwd_smem(plan->family, plan->dim);
    if (smem > dv.smem_optin)
        return fc_set_error(FLASHC_ERR_UNSUPPORTED,
                            "head_dim=%lld needs %d bytes of shared memory per block but CUDA "
                            "device %d allows %d",
                            (long long)a->head_dim, smem, dv.dev, dv.smem_optin);
    return FLASHC_OK;
}

// The kernel arguments of *a: host-derived constants included.
static fc_cuda_fwd_params fc_cuda_fwd_make_params(const fc_attn *a) {
    fc_cuda_fwd_params p = {};
    p.q = a->q.ptr;
    p.k = a->k.ptr;
    p.v = a->v.ptr;
    p.o = a->out.ptr;
    p.q_s_batch = a->q.s_batch, p.q_s_seq = a->q.s_seq, p.q_s_head = a->q.s_head;
    p.k_s_batch = a->k.s_batch, p.k_s_seq = a->k.s_seq, p.k_s_head = a->k.s_head;
    p.v_s_batch = a->v.s_batch, p.v_s_seq = a->v.s_seq, p.v_s_head = a->v.s_head;
    p.o_s_batch = a->out.s_batch, p.o_s_seq = a->out.s_seq, p.o_s_head = a->out.s_head;
    p.lse = a->lse;
    p.lse_s_batch = a->lse_s_batch, p.lse_s_head = a->lse_s_head, p.lse_s_seq = a->lse_s_seq;
    p.batch = (int32_t)a->batch;
    p.heads = (int32_t)a->heads;
    p.kv_group = (int32_t)(a->heads / a->kv_heads);
    p.head_dim = (int32_t)a->head_dim;
    p.seqlen_q = (int32_t)a->max_seqlen_q;
    p.seqlen_k = (int32_t)a->max_seqlen_k;
    p.cu_seqlens_q = a->cu_seqlens_q;
    p.cu_seqlens_k = a->cu_seqlens_k;
    p.seqlens_k = a->seqlens_k;
    p.block_table = a->block_table;
    p.bt_stride = a->bt_stride;
    p.bt_cols = (int32_t)a->bt_cols;
    p.page_size = (int32_t)a->page_size;
    p.k_batch_idx = a->k_batch_idx;
    p.k_leftpad = a->k_leftpad;
    p.total_q = (int32_t)a->total_q;
    p.total_k = (int32_t)a->total_k;

    const double log2e = 1.0 / log(2.0);
    const bool softcap = a->softcap > 0.0f;
    // A softmax scale of 0 (scale_given) runs as FLT_MIN: x * FLT_MIN is far below
    // the rounding of any logit, so the result is that of a zero scale, and the
    // units of x stay finite (ALiBi's alibi_scale = 1 / score_scale, the -inf of
    // an empty running max times score_scale_log2). dS keeps the exact 0 (ds_scale).
    p.score_scale = softcap ? a->softcap : a->scale > 0.0f ? a->scale : FLT_MIN;
    p.score_scale_log2 = (float)((double)p.score_scale * log2e);
    p.softcap_pre = softcap ? (float)(2.0 * log2e * (double)a->scale / (double)a->softcap) : 0.0f;
    p.alibi = a->alibi;
    p.alibi_s_batch = a->alibi_s_batch;
    p.alibi_scale = (float)(1.0 / (double)p.score_scale);
    // A window edge that no sequence can reach is no edge (keeps the int math
    // in range): left >= Sk_max never clips a key, nor right >= Sq_max.
    p.window_left = a->window_left >= a->max_seqlen_k ? -1 : a->window_left;
    p.window_right = a->window_right >= a->max_seqlen_q ? -1 : a->window_right;

    p.dropout = a->dropout_p > 0.0f;
    p.dropout_threshold = fc_dropout_threshold(a->dropout_p);
    p.dropout_rescale = p.dropout ? (float)(1.0 / (1.0 - (double)a->dropout_p)) : 1.0f;
    p.dropout_seed = a->seed;
    p.dropout_offset = a->offset;
    return p;
}

extern "C" size_t fc_cuda_fwd_workspace(const fc_attn *a) {
    return fc_cuda_pack_layout(a, FC_PACK_DOUT).bytes;
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
    const fc_cuda_pack_plan pk = fc_cuda_pack_layout(a, FC_PACK_DOUT);
    if (ws_bytes < pk.bytes || (pk.bytes && !ws))
        return fc_set_error(FLASHC_ERR_WORKSPACE_TOO_SMALL,
                            "workspace_bytes=%zu but %zu are needed", ws_bytes, pk.bytes);
    fc_attn packed;
    FC_CUDA_TRY(fc_cuda_pack_start(a, pk, ws, {FC_PACK_OUT}, stream, &packed));
    fc_cuda_fwd_params p = fc_cuda_fwd_make_params(&packed);
    p.head_dim = (int32_t)pk.dp;

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
    if (plan.family == FC_FAMILY_SM90) {
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
#undef FC_CASE_
    if (e != cudaSuccess)
        return fc_set_error(FLASHC_ERR_CUDA, "sm%d_fwd_kernel<D=%d, %s, causal=%d> launch: %s",
                            plan.family, plan.dim, bf16 ? "bf16" : "fp16", (int)plan.causal,
                            cudaGetErrorString(e));
    FC_CUDA_TRY(fc_cuda_pack_finish(a, pk, ws, {FC_PACK_OUT}, stream));
    return FLASHC_OK;
}

// ---- the backward ----
// fc_cuda_bwd(a) runs on a->stream, in order: the repack of operands the
// kernels cannot read in place (as the forward), fc_bwd_pre_kernel (delta,
// lse2, dq_accum zeroed; common/bwd_prep.cuh), the main kernel (one CTA per
// (key block, kv head, sequence): sm90/bwd_kernel.cuh on compute capability
// 9.0 for head dims 33..256, else sm80/bwd_kernel.cuh),
// fc_bwd_dq_kernel (dq = dq_accum * scale), the copy-back of packed dk, dv.
// With params.deterministic the main kernel's turn counters are zeroed first.
// Scratch (bwd_params.h) comes from the workspace: lse2 and delta [H][rows],
// dq_accum [H][rows][dq_pitch] fp32, the counters [H][rows / Br] int32.
#ifndef FLASHC_CUDA_NO_BWD
#include "bwd_params.h"
#include "common/bwd_prep.cuh"
#include "sm80/inst/bwd_instances.h"
#include "sm90/inst/bwd_instances.h"

// Smallest compiled backward head dim >= d of the family, or 0.
static int fc_bwd_dim(int family, int64_t d) {
#define FC_DIM_(D) \
    if (d <= D) return D;
    if (family == FC_FAMILY_SM90) {
        FC_SM90_BWD_HEADDIMS(FC_DIM_)
        return 0;
    }
    FC_SM80_BWD_HEADDIMS(FC_DIM_)
#undef FC_DIM_
    return 0;
}

// Largest compiled backward head dim (of the sm80 family, which has them all).
static int fc_bwd_max_dim(void) {
    int m = 0;
#define FC_MAX_(D) m = D;
    FC_SM80_BWD_HEADDIMS(FC_MAX_)
#undef FC_MAX_
    return m;
}

// Tile (Br, Bc) and shared memory of the family's backward instance for head dim `dim`.
static void fc_bwd_shape(int family, int dim, int *br, int *bc, int *smem) {
    *br = *bc = *smem = 0;
#define FC_SHAPE_(FAM, F, D)                                \
    if (family == FAM && dim == D) {                        \
        *br = fc_##F##_bwd_traits<D>::kBr;                  \
        *bc = fc_##F##_bwd_traits<D>::kBc;                  \
        *smem = fc_##F##_bwd_traits<D>::kSmemBytes;         \
    }
#define FC_SHAPE80_(D) FC_SHAPE_(FC_FAMILY_SM80, sm80, D)
#define FC_SHAPE90_(D) FC_SHAPE_(FC_FAMILY_SM90, sm90, D)
    FC_SM80_BWD_HEADDIMS(FC_SHAPE80_)
    FC_SM90_BWD_HEADDIMS(FC_SHAPE90_)
#undef FC_SHAPE90_
#undef FC_SHAPE80_
#undef FC_SHAPE_
}

template <int D, typename T>
static cudaError_t fc_sm80_bwd_run(const fc_cuda_bwd_params &p, bool causal, dim3 grid,
                                   cudaStream_t stream) {
    using Tr = fc_sm80_bwd_traits<D>;
    FC_LOG("sm80_bwd_kernel<D=%d, %s, causal=%d>: Br=%d Bc=%d warps=%d q_stages=%d grid=(%u,%u,%u) "
           "block=%d smem=%d deterministic=%d", D, fc_cuda_dtype_name<T>(), (int)causal, Tr::kBr,
           Tr::kBc, Tr::kWarps, Tr::kQStages, grid.x, grid.y, grid.z, Tr::kThreads,
           Tr::kSmemBytes, (int)p.deterministic);
    return causal ? sm80_bwd_launch<D, T, true>(p, grid, stream)
                  : sm80_bwd_launch<D, T, false>(p, grid, stream);
}

template <int D, typename T>
static cudaError_t fc_sm90_bwd_run(const fc_cuda_bwd_params &p, bool causal, dim3 grid,
                                   cudaStream_t stream) {
    using Tr = fc_sm90_bwd_traits<D>;
    FC_LOG("sm90_bwd_kernel<D=%d, %s, causal=%d>: Br=%d Bc=%d q_stages=%d grid=(%u,%u,%u) "
           "block=%d smem=%d deterministic=%d", D, fc_cuda_dtype_name<T>(), (int)causal, Tr::kBr,
           Tr::kBc, Tr::kQStages, grid.x, grid.y, grid.z, Tr::kThreads, Tr::kSmemBytes,
           (int)p.deterministic);
    return causal ? sm90_bwd_launch<D, T, true>(p, grid, stream)
                  : sm90_bwd_launch<D, T, false>(p, grid, stream);
}

enum { FC_BWW_PACK, FC_BWW_LSE2, FC_BWW_DELTA, FC_BWW_DQACC, FC_BWW_SEM, FC_BWW_N };

// What fc_cuda_bwd will run.
typedef struct {
    int family;       // FC_FAMILY_SM80 or FC_FAMILY_SM90
    int dim;          // compiled head dim of the family (>= head_dim, zero-padded)
    int br, bc;       // its tile
    int64_t dq_pitch; // floats per dq_accum row: sm90 the instance's D (its bulk
                      // reductions cover whole rows), sm80 the packed row
    bool causal;      // the kCausal instance
    bool empty;       // no batch, head or key: nothing to write
    int64_t rows;     // scratch rows per head (a multiple of 128)
    int32_t sq_pad;   // batched: Sq rounded up to kFcBwdPadRows
    fc_cuda_pack_plan pk;
    size_t off[FC_BWW_N];
    size_t bytes;
} fc_cuda_bwd_plan;

static flashc_status fc_cuda_bwd_plan_make(const fc_attn *a, fc_cuda_bwd_plan *pl) {
    *pl = fc_cuda_bwd_plan{};
    FC_TRY(fc_cuda_dtype_check(a));
    const int64_t d8 = (a->head_dim + 7) / 8 * 8;
    if (fc_bwd_dim(FC_FAMILY_SM80, d8) == 0)
        return fc_set_error(FLASHC_ERR_UNSUPPORTED,
                            "head_dim=%lld but this CUDA build's backward supports up to %d",
                            (long long)a->head_dim, fc_bwd_max_dim());
    FC_TRY(fc_cuda_len_check(a));
    if (a->batch > 65535 || a->kv_heads > 65535)
        return fc_set_error(FLASHC_ERR_UNSUPPORTED,
                            "batch=%lld, kv_heads=%lld but the CUDA backend needs both <= 65535",
                            (long long)a->batch, (long long)a->kv_heads);
    fc_cuda_device dv;
    FC_TRY(fc_cuda_device_get(&dv));
    // sm_90a code runs on compute capability 9.0 exactly
    const char *force = getenv("FLASHC_CUDA_FAMILY");
    const bool sm90 = dv.major == 9 && dv.minor == 0 && d8 > 32 &&
                      fc_bwd_dim(FC_FAMILY_SM90, d8) != 0 && !(force && strcmp(force, "sm80") == 0);
    pl->family = sm90 ? FC_FAMILY_SM90 : FC_FAMILY_SM80;
    pl->dim = fc_bwd_dim(pl->family, d8);
    int smem = 0;
    fc_bwd_shape(pl->family, pl->dim, &pl->br, &pl->bc, &smem);
    if (smem > dv.smem_optin)
        return fc_set_error(FLASHC_ERR_UNSUPPORTED,
                            "head_dim=%lld: the backward needs %d bytes of shared memory per "
                            "block but CUDA device %d allows %d",
                            (long long)a->head_dim, smem, dv.dev, dv.smem_optin);
    pl->causal = a->window_right == 0;
    pl->empty = a->batch == 0 || a->heads == 0 || a->max_seqlen_k == 0;

    const int64_t pad = kFcBwdPadRows;
    pl->sq_pad = (int32_t)((a->max_seqlen_q + pad - 1) / pad * pad);
    const int64_t rows = a->cu_seqlens_q ? a->total_q + a->batch * pad : a->batch * pl->sq_pad;
    pl->rows = (rows + pad - 1) / pad * pad;
    pl->pk = fc_cuda_pack_layout(a, FC_PACK_N);
    pl->dq_pitch = sm90 ? pl->dim : pl->pk.dp;
    const size_t h = (size_t)a->heads, r = (size_t)pl->rows;
    size_t sizes[FC_BWW_N] = {0};
    if (!pl->empty) {
        sizes[FC_BWW_PACK] = pl->pk.bytes;
        sizes[FC_BWW_LSE2] = h * r * sizeof(float);
        sizes[FC_BWW_DELTA] = h * r * sizeof(float);
        sizes[FC_BWW_DQACC] = h * r * (size_t)pl->dq_pitch * sizeof(float);
        if (a->deterministic) sizes[FC_BWW_SEM] = h * (r / (size_t)pl->br) * sizeof(int32_t);
    }
    pl->bytes = fc_ws_layout(FC_BWW_N, sizes, pl->off);
    return FLASHC_OK;
}

// A problem the plan refuses needs no workspace: the run reports why.
extern "C" size_t fc_cuda_bwd_workspace(const fc_attn *a) {
    fc_cuda_bwd_plan pl;
    if (fc_cuda_bwd_plan_make(a, &pl) == FLASHC_OK) return pl.bytes;
    fc_clear_error();
    return 0;
}

extern "C" flashc_status fc_cuda_bwd(const fc_attn *a, void *ws, size_t ws_bytes) {
    fc_cuda_bwd_plan pl;
    FC_TRY(fc_cuda_bwd_plan_make(a, &pl));
    if (pl.empty) return FLASHC_OK;
    if (ws_bytes < pl.bytes || !ws)
        return fc_set_error(FLASHC_ERR_WORKSPACE_TOO_SMALL, "workspace_bytes=%zu but %zu are needed",
                            ws_bytes, pl.bytes);
    const cudaStream_t stream = (cudaStream_t)a->stream;
    char *base = (char *)ws;
    void *pack_ws = base + pl.off[FC_BWW_PACK];

    fc_attn packed;
    FC_CUDA_TRY(fc_cuda_pack_start(a, pl.pk, pack_ws, {FC_PACK_DK, FC_PACK_DV}, stream, &packed));
    fc_cuda_bwd_params p = {};
    p.f = fc_cuda_fwd_make_params(&packed);
    p.f.head_dim = (int32_t)pl.pk.dp;
    p.dout = packed.dout.ptr;
    p.do_s_batch = packed.dout.s_batch, p.do_s_seq = packed.dout.s_seq, p.do_s_head = packed.dout.s_head;
    p.dq = a->dq.ptr;  // the dQ kernel writes any stride and head dim
    p.dq_s_batch = a->dq.s_batch, p.dq_s_seq = a->dq.s_seq, p.dq_s_head = a->dq.s_head;
    p.dk = packed.dk.ptr, p.dv = packed.dv.ptr;
    p.dk_s_batch = packed.dk.s_batch, p.dk_s_seq = packed.dk.s_seq, p.dk_s_head = packed.dk.s_head;
    p.dv_s_batch = packed.dv.s_batch, p.dv_s_seq = packed.dv.s_seq, p.dv_s_head = packed.dv.s_head;
    p.dq_head_dim = (int32_t)a->head_dim;
    p.lse2 = (float *)(base + pl.off[FC_BWW_LSE2]);
    p.delta = (float *)(base + pl.off[FC_BWW_DELTA]);
    p.dq_accum = (float *)(base + pl.off[FC_BWW_DQACC]);
    p.sem = a->deterministic ? (int32_t *)(base + pl.off[FC_BWW_SEM]) : NULL;
    p.rows = pl.rows;
    p.sq_pad = pl.sq_pad;
    p.dq_pitch = (int32_t)pl.dq_pitch;
    p.dq_swizzle = pl.family == FC_FAMILY_SM90;
    p.sem_br = pl.br;
    p.ds_scale = a->scale;
    p.log2e = (float)(1.0 / log(2.0));
    p.deterministic = a->deterministic;

    const bool bf16 = a->dtype == FLASHC_DTYPE_BF16;
    const dim3 prep_grid((unsigned)((a->max_seqlen_q + kFcBwdPrepRows - 1) / kFcBwdPrepRows),
                         (unsigned)a->heads, (unsigned)a->batch);
    if (p.sem)
        FC_CUDA_TRY(cudaMemsetAsync(p.sem, 0, (size_t)a->heads * (size_t)(pl.rows / pl.br) * 4, stream));
    FC_LOG("fc_bwd_pre_kernel, fc_bwd_dq_kernel: grid=(%u,%u,%u) block=%d; scratch rows=%lld "
           "workspace=%zu packed=%d", prep_grid.x, prep_grid.y, prep_grid.z, kFcBwdPrepThreads,
           (long long)pl.rows, pl.bytes, pl.pk.bytes > 0);
    cudaError_t e = cudaSuccess;
    if (prep_grid.x > 0) {
        if (bf16)
            fc_bwd_pre_kernel<__nv_bfloat16><<<prep_grid, kFcBwdPrepThreads, 0, stream>>>(p);
        else
            fc_bwd_pre_kernel<__half><<<prep_grid, kFcBwdPrepThreads, 0, stream>>>(p);
        FC_CUDA_TRY(cudaGetLastError());
    }
    const dim3 grid((unsigned)((a->max_seqlen_k + pl.bc - 1) / pl.bc), (unsigned)a->kv_heads,
                    (unsigned)a->batch);
    e = cudaErrorInvalidValue;  // no instance: cannot happen after the plan
#define FC_CASE_(F, D)                                                                 \
    case D:                                                                            \
        e = bf16 ? fc_##F##_bwd_run<D, __nv_bfloat16>(p, pl.causal, grid, stream)      \
                 : fc_##F##_bwd_run<D, __half>(p, pl.causal, grid, stream);            \
        break;
#define FC_CASE80_(D) FC_CASE_(sm80, D)
#define FC_CASE90_(D) FC_CASE_(sm90, D)
    if (pl.family == FC_FAMILY_SM90) {
        switch (pl.dim) { FC_SM90_BWD_HEADDIMS(FC_CASE90_) default: break; }
    } else {
        switch (pl.dim) { FC_SM80_BWD_HEADDIMS(FC_CASE80_) default: break; }
    }
#undef FC_CASE90_
#undef FC_CASE80_
#undef FC_CASE_
    if (e != cudaSuccess)
        return fc_set_error(FLASHC_ERR_CUDA, "sm%d_bwd_kernel<D=%d, %s, causal=%d> launch: %s",
                            pl.family, pl.dim, bf16 ? "bf16" : "fp16", (int)pl.causal,
                            cudaGetErrorString(e));
    if (prep_grid.x > 0) {
        if (bf16)
            fc_bwd_dq_kernel<__nv_bfloat16><<<prep_grid, kFcBwdPrepThreads, 0, stream>>>(p);
        else
            fc_bwd_dq_kernel<__half><<<prep_grid, kFcBwdPrepThreads, 0, stream>>>(p);
        FC_CUDA_TRY(cudaGetLastError());
    }
    FC_CUDA_TRY(fc_cuda_pack_finish(a, pl.pk, pack_ws, {FC_PACK_DK, FC_PACK_DV}, stream));
    return FLASHC_OK;
}
#else   // FLASHC_CUDA_BWD=OFF: a build without the backward kernels
extern "C" size_t fc_cuda_bwd_workspace(const fc_attn *a) { return 0; }

extern "C" flashc_status fc_cuda_bwd(const fc_attn *a, void *ws, size_t ws_bytes) {
    return fc_set_error(FLASHC_ERR_UNSUPPORTED,
                        "q.device=cuda but this build has no CUDA backward (FLASHC_CUDA_BWD=OFF)");
}
#endif  // FLASHC_CUDA_NO_BWD

// ---- the decode path: flashc_fwd_kvcache ----
// fc_cuda_kvcache(kc) runs up to three steps on kc->attn.stream, in order:
//   1. sm80_kvcache_prep_kernel (sm80/kvcache_kernels.cuh): k_new / v_new
//      appended to the cache in place (rotary on k_new first), q rotated into
//      the workspace, and for step 2b the key lengths; skipped when there is
//      nothing to do. Step 2 starts after it on the stream, so no attention CTA
//      reads a cache row that is still being written.
//   2a. the decode kernel (sm80/decode_kernel.cuh): one CTA per (16 packed
//      query rows, key split, kv head, sequence), then, with more than one
//      split, the combine kernel; for head dims that are a multiple of 8 with
//      16-byte aligned operands and at most kFcDecodeMaxRows packed rows;
//   2b. otherwise fc_cuda_fwd over the cache (any layout: it repacks what it
//      cannot read in place; long query chunks: its 128-row tiles).
// The lengths live in device memory and are never read here: the plan uses the
// cache capacity (what flash_attn's split heuristic uses too).
#include "decode_params.h"
#include "decode_traits.h"
#include "sm80/inst/decode_instances.h"
#include "sm80/kvcache_kernels.cuh"

// Packed query rows (Sq * H / Hk) above which step 2b serves the call: each 16
// rows re-read every K/V tile (from L2 at best), where the forward's 128-row
// tiles read it once per query head.
static const int64_t kFcDecodeMaxRows = 128;

// Smallest compiled decode head dim >= d, or 0.
static int fc_decode_dim(int64_t d) {
#define FC_DIM_(D) \
    if (d <= D) return D;
    FC_SM80_DECODE_HEADDIMS(FC_DIM_)
#undef FC_DIM_
    return 0;
}

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
// (flash_api.cpp num_splits_heuristic; shared/HOPPER-NOTES.md section 4) over
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
    FC_TRY(fc_cuda_len_check(a));  // a->max_seqlen_k is the cache capacity
    fc_cuda_device dv;
    FC_TRY(fc_cuda_device_get(&dv));

    pl->attend = a->batch > 0 && a->max_seqlen_q > 0;
    pl->rotary = pl->attend && kc->rotary_dim > 0;
    const int64_t group = a->heads / a->kv_heads, rows = a->max_seqlen_q * group;
    const fc_attn att = fc_kv_attn(kc, pl->rotary, NULL, NULL);
    int bc = 0, smem = 0;
    pl->dim = fc_decode_dim(a->head_dim);
    fc_decode_shape(pl->dim, &bc, &smem);
    pl->decode = pl->attend && a->head_dim % 8 == 0 && pl->dim > 0 && smem <= dv.smem_optin &&
                 rows <= kFcDecodeMaxRows && fc_cuda_view_direct(&att.q, a->head_dim) &&
                 fc_cuda_view_direct(&att.k, a->head_dim) &&
                 fc_cuda_view_direct(&att.v, a->head_dim) &&
                 fc_cuda_view_direct(&att.out, a->head_dim);
    if (pl->decode) {
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
        sizes[FC_KVW_OACC] = prows * (size_t)a->head_dim * sizeof(float);
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
    p.q_per_row = a->window_left >= 0 || a->window_right >= 0;  // src/internal.h fc_rotary_q_pos
    p.seqlens_k = seqlens;
    p.n_append = kc->seqlen_new > 0 ? a->batch * kc->seqlen_new * a->kv_heads : 0;
    p.n_q = pl->rotary ? a->batch * a->max_seqlen_q * a->heads : 0;
    p.n_lens = seqlens ? (a->batch + 31) / 32 : 0;
    return p;
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
        return fc_set_error(FLASHC_ERR_CUDA, "sm80_kvcache_prep_kernel launch: %s", cudaGetErrorString(e));
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
        e = bf16 ? fc_decode_combine<__nv_bfloat16>(p, stream) : fc_decode_combine<__half>(p, stream);
        if (e != cudaSuccess)
            return fc_set_error(FLASHC_ERR_CUDA, "sm80_decode_combine_kernel launch: %s",
                                cudaGetErrorString(e));
    }
    return FLASHC_OK;
}
