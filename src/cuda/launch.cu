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
// Nothing here synchronises, allocates, or reads device memory: every pointer
// in fc_attn (tensors, cu_seqlens, seqused_k, block_table, ...) is a device
// pointer on this path, and api.c must not have read their contents.
//
// Not here yet: attn_probs (FLASHC_ERR_UNSUPPORTED), fp32 inputs.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

// ---- operands the kernels read in place, and the repacked rest ----
// 16-byte cp.async / vector stores: data 16-byte aligned, every stride a
// multiple of 8 elements (2-byte dtypes), D a multiple of 8.
static bool fc_cuda_view_direct(const fc_view *v, int64_t d) {
    return d % 8 == 0 && (uintptr_t)v->ptr % 16 == 0 && v->s_batch % 8 == 0 &&
           v->s_seq % 8 == 0 && v->s_head % 8 == 0;
}

enum { FC_PACK_Q, FC_PACK_K, FC_PACK_V, FC_PACK_OUT, FC_PACK_N };

// Which operands go through the workspace, their index spaces and its carving.
typedef struct {
    int64_t dp;                      // D rounded up to 8: the packed row length
    bool packed[FC_PACK_N];          // q, k, v, out
    fc_cuda_pack_dims dims[FC_PACK_N];
    size_t off[FC_PACK_N];           // region offsets in the workspace
    size_t bytes;                    // the workspace needed (0: none)
} fc_cuda_pack_plan;

static fc_cuda_pack_plan fc_cuda_pack_layout(const fc_attn *a) {
    fc_cuda_pack_plan pk = {};
    pk.dp = (a->head_dim + 7) / 8 * 8;
    const bool varlen = a->cu_seqlens_q != NULL;
    // q, out: batched [B, Sq], varlen [1, total_q]
    const fc_cuda_pack_dims qd = {varlen ? 1 : a->batch, varlen ? a->total_q : a->max_seqlen_q,
                                  a->heads};
    // k, v: batched [B, Sk], varlen [1, total_k], paged [pages, page_size]
    const fc_cuda_pack_dims kd = {a->block_table ? a->total_k : varlen ? 1 : a->batch,
                                  a->block_table ? a->page_size
                                  : varlen       ? a->total_k
                                                 : a->max_seqlen_k,
                                  a->kv_heads};
    const fc_view *const views[FC_PACK_N] = {&a->q, &a->k, &a->v, &a->out};
    size_t sizes[FC_PACK_N];
    const bool empty = a->batch == 0 || a->heads == 0 || a->max_seqlen_q == 0;
    for (int i = 0; i < FC_PACK_N; i++) {
        pk.dims[i] = i == FC_PACK_K || i == FC_PACK_V ? kd : qd;
        pk.packed[i] = !empty && !fc_cuda_view_direct(views[i], a->head_dim);
        sizes[i] = pk.packed[i] ? (size_t)fc_cuda_pack_elems(pk.dims[i], pk.dp) * 2 : 0;
    }
    pk.bytes = fc_ws_layout(FC_PACK_N, sizes, pk.off);
    return pk;
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

template <int D, typename T>
static cudaError_t fc_sm80_fwd_run(const fc_cuda_fwd_params &p, bool causal,
                                   cudaStream_t stream) {
    const dim3 grid = fc_fwd_grid(p, fc_sm80_fwd_traits<D>::kBr);
    return causal ? sm80_fwd_launch<D, T, true>(p, grid, stream)
                  : sm80_fwd_launch<D, T, false>(p, grid, stream);
}

template <int D, typename T>
static cudaError_t fc_sm90_fwd_run(const fc_cuda_fwd_params &p, bool causal,
                                   cudaStream_t stream) {
    const dim3 grid = fc_fwd_grid(p, fc_sm90_fwd_traits<D>::kBr);
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
    if (a->dtype != FLASHC_DTYPE_BF16 && a->dtype != FLASHC_DTYPE_FP16)
        return fc_set_error(FLASHC_ERR_UNSUPPORTED,
                            "q.dtype=%s but the CUDA backend supports bf16 and fp16",
                            flashc_dtype_name(a->dtype));
    if (a->probs)
        return fc_set_error(FLASHC_ERR_UNSUPPORTED,
                            "attn_probs is not supported by the CUDA backend (use the CPU)");
    const int64_t d8 = (a->head_dim + 7) / 8 * 8;
    if (fc_fwd_dim(FC_FAMILY_SM80, d8) == 0)
        return fc_set_error(FLASHC_ERR_UNSUPPORTED,
                            "head_dim=%lld but this CUDA build supports up to %d",
                            (long long)a->head_dim, fc_fwd_max_dim());
    const int64_t kMaxLen = (int64_t)1 << 30;  // keeps the kernels' int row arithmetic exact
    if (a->max_seqlen_q >= kMaxLen || a->max_seqlen_k >= kMaxLen)
        return fc_set_error(FLASHC_ERR_UNSUPPORTED,
                            "max_seqlen_q=%lld, max_seqlen_k=%lld but the CUDA backend needs "
                            "both below 2^30",
                            (long long)a->max_seqlen_q, (long long)a->max_seqlen_k);
    if (a->batch > 65535 || a->heads > 65535)
        return fc_set_error(FLASHC_ERR_UNSUPPORTED,
                            "batch=%lld, heads=%lld but the CUDA backend needs both <= 65535",
                            (long long)a->batch, (long long)a->heads);
    plan->causal = a->window_right == 0;
    plan->empty = a->batch == 0 || a->heads == 0 || a->max_seqlen_q == 0;

    int dev = 0, major = 0, minor = 0, smem_optin = 0;
    FC_CUDA_TRY(cudaGetDevice(&dev));
    FC_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    FC_CUDA_TRY(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    FC_CUDA_TRY(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (major < 8)
        return fc_set_error(FLASHC_ERR_UNSUPPORTED,
                            "CUDA device %d has compute capability %d.x but flashc needs >= 8.0",
                            dev, major);
    // sm_90a code runs on compute capability 9.0 exactly
    const char *force = getenv("FLASHC_CUDA_FAMILY");
    const bool sm90 = major == 9 && minor == 0 && d8 > 32 && fc_fwd_dim(FC_FAMILY_SM90, d8) != 0 &&
                      !(force && strcmp(force, "sm80") == 0);
    plan->family = sm90 ? FC_FAMILY_SM90 : FC_FAMILY_SM80;
    plan->dim = fc_fwd_dim(plan->family, d8);
    const int smem = fc_fwd_smem(plan->family, plan->dim);
    if (smem > smem_optin)
        return fc_set_error(FLASHC_ERR_UNSUPPORTED,
                            "head_dim=%lld needs %d bytes of shared memory per block but CUDA "
                            "device %d allows %d",
                            (long long)a->head_dim, smem, dev, smem_optin);
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
    p.page_size = (int32_t)a->page_size;
    p.k_batch_idx = a->k_batch_idx;
    p.k_leftpad = a->k_leftpad;

    const double log2e = 1.0 / log(2.0);
    const bool softcap = a->softcap > 0.0f;
    p.score_scale = softcap ? a->softcap : a->scale;
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
    return fc_cuda_pack_layout(a).bytes;
}

extern "C" flashc_status fc_cuda_fwd_supported(const fc_attn *a) {
    fc_cuda_fwd_plan plan;
    return fc_cuda_fwd_check(a, &plan);
}

extern "C" flashc_status fc_cuda_fwd(const fc_attn *a, void *ws, size_t ws_bytes) {
    fc_cuda_fwd_plan plan;
    FC_TRY(fc_cuda_fwd_check(a, &plan));
    if (plan.empty) return FLASHC_OK;
    fc_cuda_fwd_params p = fc_cuda_fwd_make_params(a);
    const cudaStream_t stream = (cudaStream_t)a->stream;

    // ---- repack what the kernels cannot read in place ----
    const fc_cuda_pack_plan pk = fc_cuda_pack_layout(a);
    if (ws_bytes < pk.bytes || (pk.bytes && !ws))
        return fc_set_error(FLASHC_ERR_WORKSPACE_TOO_SMALL,
                            "workspace_bytes=%zu but %zu are needed", ws_bytes, pk.bytes);
    const fc_view *const views[FC_PACK_N] = {&a->q, &a->k, &a->v, &a->out};
    void *buf[FC_PACK_N] = {};
    for (int i = 0; i < FC_PACK_N; i++) {
        if (!pk.packed[i]) continue;
        buf[i] = (char *)ws + pk.off[i];
        const fc_cuda_pack_dims &e = pk.dims[i];
        // dense [n0, n1, heads, dp]; varlen rows by token index (s_batch 0)
        const bool kv = i == FC_PACK_K || i == FC_PACK_V;
        const int64_t s_head = pk.dp, s_seq = e.heads * pk.dp;
        const int64_t s_batch = a->cu_seqlens_q && !(kv && a->block_table) ? 0 : e.n1 * s_seq;
        if (i != FC_PACK_OUT)
            FC_CUDA_TRY(fc_cuda_pack(buf[i], *views[i], e, a->head_dim, pk.dp, stream));
        switch (i) {
        case FC_PACK_Q:
            p.q = buf[i], p.q_s_batch = s_batch, p.q_s_seq = s_seq, p.q_s_head = s_head;
            break;
        case FC_PACK_K:
            p.k = buf[i], p.k_s_batch = s_batch, p.k_s_seq = s_seq, p.k_s_head = s_head;
            break;
        case FC_PACK_V:
            p.v = buf[i], p.v_s_batch = s_batch, p.v_s_seq = s_seq, p.v_s_head = s_head;
            break;
        default:
            p.o = buf[i], p.o_s_batch = s_batch, p.o_s_seq = s_seq, p.o_s_head = s_head;
            break;
        }
    }
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
    if (pk.packed[FC_PACK_OUT])
        FC_CUDA_TRY(fc_cuda_unpack(a->out, buf[FC_PACK_OUT], pk.dims[FC_PACK_OUT], a->head_dim,
                                   pk.dp, a->cu_seqlens_q, a->batch, stream));
    return FLASHC_OK;
}
