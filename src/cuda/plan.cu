// plan.cu : the shared host side of the CUDA backend (plan.h says what each
// function does): the checks every operation runs, the kernel family, the
// repack of operands, the forward's kernel arguments.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../common/score.h"
#include "common/repack.cuh"
#include "plan.h"

// ---- the checks every operation runs ----
flashc_status fc_cuda_dtype_check(const fc_attn *a) {
    if (a->dtype != FLASHC_DTYPE_BF16 && a->dtype != FLASHC_DTYPE_FP16)
        return fc_set_error(FLASHC_ERR_UNSUPPORTED,
                            "q.dtype=%s but the CUDA backend supports bf16 and fp16",
                            flashc_dtype_name(a->dtype));
    return FLASHC_OK;
}

flashc_status fc_cuda_device_get(fc_cuda_device *d) {
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

flashc_status fc_cuda_len_check(const fc_attn *a) {
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

flashc_status fc_cuda_grid_check(int64_t batch, int64_t heads, const char *heads_name) {
    if (batch > 65535 || heads > 65535)
        return fc_set_error(FLASHC_ERR_UNSUPPORTED,
                            "batch=%lld, %s=%lld but the CUDA backend needs both <= 65535",
                            (long long)batch, heads_name, (long long)heads);
    return FLASHC_OK;
}

// ---- compiled head dims ----
int64_t fc_cuda_d8(const fc_attn *a) {
    const int64_t d = a->head_dim_v > a->head_dim ? a->head_dim_v : a->head_dim;
    return (d + 7) / 8 * 8;
}

int fc_dim_at_least(const int *dims, int64_t d) {
    for (; *dims; dims++)
        if (d <= *dims) return *dims;
    return 0;
}

int fc_dim_max(const int *dims) {
    int m = 0;
    for (; *dims; dims++) m = *dims;
    return m;
}

flashc_status fc_dim_check(const fc_attn *a, const int *dims, const char *op) {
    if (fc_dim_at_least(dims, fc_cuda_d8(a)) == 0) {
        const bool v = a->head_dim_v > a->head_dim;
        return fc_set_error(FLASHC_ERR_UNSUPPORTED,
                            "%s=%lld but the CUDA backend's %s takes head dims up to %d "
                            "(this build's instances; the CPU backend takes larger ones)",
                            v ? "the value head_dim (v.shape[-1])" : "head_dim",
                            (long long)(v ? a->head_dim_v : a->head_dim), op, fc_dim_max(dims));
    }
    return FLASHC_OK;
}

// ---- the kernel family ----
int fc_cuda_family(const fc_cuda_device &dv, int64_t d8, bool has_sm90) {
    const char *force = getenv("FLASHC_CUDA_FAMILY");
    const bool sm90 = dv.major == 9 && dv.minor == 0 && d8 > 32 && has_sm90 &&
                      !(force && strcmp(force, "sm80") == 0);
    return sm90 ? FC_FAMILY_SM90 : FC_FAMILY_SM80;
}

const char *fc_cuda_family_name(int family) {
    return family == FC_FAMILY_SM90WS ? "sm90ws" : family == FC_FAMILY_SM90 ? "sm90" : "sm80";
}

// ---- operands the kernels read in place, and the repacked rest ----
bool fc_cuda_view_direct(const fc_view *v, int64_t d) {
    return d % 8 == 0 && (uintptr_t)v->ptr % 16 == 0 && v->s_batch % 8 == 0 &&
           v->s_seq % 8 == 0 && v->s_head % 8 == 0;
}

// Which of them are k-likes ([.., Sk, Hk, D]; the rest are q-likes), and which
// have the value head dim Dv (the rest D).
static const bool kFcPackIsKv[FC_PACK_N] = {false, true, true, false, false, true, true};
static const bool kFcPackIsDv[FC_PACK_N] = {false, false, true, true, true, false, true};

// Operand i's head dim and packed row length.
static int64_t fc_cuda_pack_d(const fc_attn *a, int i) {
    return kFcPackIsDv[i] ? a->head_dim_v : a->head_dim;
}
static int64_t fc_cuda_pack_dp(const fc_cuda_pack_plan &pk, int i) {
    return kFcPackIsDv[i] ? pk.dpv : pk.dp;
}

// The operand views of *a in enum order (the backward's absent in a forward).
static void fc_cuda_pack_views(const fc_attn *a, const fc_view *v[FC_PACK_N]) {
    v[FC_PACK_Q] = &a->q, v[FC_PACK_K] = &a->k, v[FC_PACK_V] = &a->v, v[FC_PACK_OUT] = &a->out;
    v[FC_PACK_DOUT] = &a->dout, v[FC_PACK_DK] = &a->dk, v[FC_PACK_DV] = &a->dv;
}

fc_cuda_pack_plan fc_cuda_pack_layout(const fc_attn *a, int n) {
    fc_cuda_pack_plan pk = {};
    pk.dp = (a->head_dim + 7) / 8 * 8;
    pk.dpv = (a->head_dim_v + 7) / 8 * 8;
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
        pk.packed[i] = !empty && i < n && !fc_cuda_view_direct(views[i], fc_cuda_pack_d(a, i));
        sizes[i] =
            pk.packed[i] ? (size_t)fc_cuda_pack_elems(pk.dims[i], fc_cuda_pack_dp(pk, i)) * 2 : 0;
    }
    pk.bytes = fc_ws_layout(FC_PACK_N, sizes, pk.off);
    return pk;
}

cudaError_t fc_cuda_pack_start(const fc_attn *a, const fc_cuda_pack_plan &pk, void *ws,
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
        const int64_t dp = fc_cuda_pack_dp(pk, i);
        const int64_t s_head = dp, s_seq = e.heads * dp;
        const bool paged_kv = kFcPackIsKv[i] && a->block_table;
        const int64_t s_batch = a->cu_seqlens_q && !paged_kv ? 0 : e.n1 * s_seq;
        bool output = false;
        for (int o : outs) output = output || o == i;
        if (!output) {
            const cudaError_t err = fc_cuda_pack(buf, *src[i], e, fc_cuda_pack_d(a, i), dp, stream);
            if (err != cudaSuccess) return err;
        }
        *dst[i] = fc_view{buf, s_batch, s_seq, s_head};
    }
    return cudaSuccess;
}

cudaError_t fc_cuda_pack_finish(const fc_attn *a, const fc_cuda_pack_plan &pk, void *ws,
                                std::initializer_list<int> outs, cudaStream_t stream) {
    const fc_view *views[FC_PACK_N];
    fc_cuda_pack_views(a, views);
    for (int i : outs) {
        if (!pk.packed[i]) continue;
        // dk, dv rows past cu_seqlens_k[B] belong to no sequence (q-likes: cu_seqlens_q)
        const int32_t *cu = kFcPackIsKv[i] ? a->cu_seqlens_k : a->cu_seqlens_q;
        const cudaError_t err =
            fc_cuda_unpack(*views[i], (char *)ws + pk.off[i], pk.dims[i], fc_cuda_pack_d(a, i),
                           fc_cuda_pack_dp(pk, i), cu, a->batch, stream);
        if (err != cudaSuccess) return err;
    }
    return cudaSuccess;
}

// ---- TMA descriptors ----
// cuTensorMapEncodeTiled through the runtime's driver entry point (no link
// against libcuda), looked up once.
static PFN_cuTensorMapEncodeTiled_v12000 fc_cuda_encode_tiled() {
    static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
        void *f = nullptr;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                             &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess) {
            cudaGetLastError();
            f = nullptr;
        }
        return (PFN_cuTensorMapEncodeTiled_v12000)f;
    }();
    return fn;
}

bool fc_cuda_tma_available() { return fc_cuda_encode_tiled() != nullptr; }

bool fc_cuda_tma_map(CUtensorMap *map, const fc_view &v, const fc_cuda_pack_dims &e, int64_t dp,
                     int box_heads, int box_rows) {
    const PFN_cuTensorMapEncodeTiled_v12000 encode = fc_cuda_encode_tiled();
    if (!encode) return false;
    const cuuint64_t dims[4] = {(cuuint64_t)dp, (cuuint64_t)e.heads, (cuuint64_t)e.n1,
                                (cuuint64_t)e.n0};
    // byte strides of dims 1..3; one batch (varlen) still needs a stride
    const int64_t s_batch = e.n0 > 1 ? v.s_batch : v.s_seq * e.n1;
    const cuuint64_t strides[3] = {(cuuint64_t)v.s_head * 2, (cuuint64_t)v.s_seq * 2,
                                   (cuuint64_t)s_batch * 2};
    const cuuint32_t box[4] = {64, (cuuint32_t)box_heads, (cuuint32_t)box_rows, 1};
    const cuuint32_t elem[4] = {1, 1, 1, 1};
    if (v.s_head <= 0 || v.s_seq <= 0 || s_batch <= 0) return false;
    return encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 4, v.ptr, dims, strides, box, elem,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                  CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) ==
           CUDA_SUCCESS;
}

// ---- the kernel arguments ----
fc_cuda_fwd_params fc_cuda_fwd_make_params(const fc_attn *a) {
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
    p.head_dim_v = (int32_t)a->head_dim_v;
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

    // the score constants (common/score.h: the CPU backends derive theirs there too)
    const fc_score_consts c = fc_score_consts_of(a);
    p.score_scale = c.unit;
    p.score_scale_log2 = c.unit_log2;
    p.softcap_pre = c.tanh_exp2;
    p.alibi = a->alibi;
    p.alibi_s_batch = a->alibi_s_batch;
    p.alibi_scale = c.unit_inv;
    // A window edge that no sequence can reach is no edge (keeps the int math
    // in range): left >= Sk_max never clips a key, nor right >= Sq_max.
    p.window_left = a->window_left >= a->max_seqlen_k ? -1 : a->window_left;
    p.window_right = a->window_right >= a->max_seqlen_q ? -1 : a->window_right;

    p.dropout = a->dropout_p > 0.0f;
    p.dropout_threshold = c.drop_threshold;
    p.dropout_rescale = c.drop_scale;
    p.dropout_seed = a->seed;
    p.dropout_offset = a->offset;

    p.sink = a->sink;
    p.sink_s = a->sink_s;
    p.sink_dtype = a->sink_dtype;
    p.log2e = c.log2e;
    p.ln2 = (float)c.ln2;
    return p;
}
