// plan.h : what the host files of the CUDA backend share. The host side is
// one file per operation, each the only place that knows that operation's
// kernels (flash-attention's flash_api.cpp + launch templates):
//
//   fwd.cu      fc_cuda_fwd*      the forward: instances, plan, launch
//   bwd.cu      fc_cuda_bwd*      the backward: preprocess, main kernel, dQ
//   kvcache.cu  fc_cuda_kvcache*  the decode path: append, rotary, split-KV
//   probs.cu    fc_probs_launch   the forward's attn_probs, after it
//   plan.cu     this header       errors, the device, the checks every
//                                 operation runs, the kernel family, the repack
//                                 of operands the kernels cannot read in place,
//                                 the kernel arguments every kernel embeds
//
// A new kernel family: its generated instance list (tools/gen_instances.py),
// fc_cuda_family below, and the dispatch switch of each operation it serves.
//
// Nothing here synchronises, allocates, or reads device memory: every pointer
// in fc_attn (tensors, cu_seqlens, seqused_k, block_table, ...) is a device
// pointer on this path, and prepare.c must not have read their contents. With
// FLASHC_LOG=1 every launch writes one line (FC_LOG, src/util.c): the kernel,
// its tile, grid, block, shared memory and, for decode, num_splits.
#ifndef FLASHC_CUDA_PLAN_H
#define FLASHC_CUDA_PLAN_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <initializer_list>
#include <type_traits>

#include "backend.h"
#include "params.h"

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

// "bf16" or "fp16", for the launch log.
template <typename T>
static inline const char *fc_cuda_dtype_name() {
    return std::is_same<T, __nv_bfloat16>::value ? "bf16" : "fp16";
}

// ---- the checks every operation runs ----
// bf16 or fp16.
flashc_status fc_cuda_dtype_check(const fc_attn *a);

// The current device's properties the plans read.
typedef struct {
    int dev, major, minor, sms, smem_optin;
} fc_cuda_device;

// The current device, checked: compute capability >= 8.0.
flashc_status fc_cuda_device_get(fc_cuda_device *d);

// Every length and row, page or batch count the kernels hold in an int is
// below 2^30, so their int row arithmetic (a sum of two) cannot overflow.
flashc_status fc_cuda_len_check(const fc_attn *a);

// A grid of (tiles, heads, batch): heads (named heads_name in the message) and
// batch are grid dimensions y and z, at most 65535 each.
flashc_status fc_cuda_grid_check(int64_t batch, int64_t heads, const char *heads_name);

// ---- compiled head dims ----
// A generated head-dim list (FC_<FAMILY>_<OP>_HEADDIMS(X) of sm80/inst/*.h,
// sm90/inst/*.h) as an array: {LIST(FC_DIM_ENTRY_) 0}, ascending, the 0 ending
// it (a list that FLASHC_CUDA_HEADDIMS trimmed may be empty).
#define FC_DIM_ENTRY_(D) D,

// The head dim an instance must cover: the larger of D (q, k) and Dv (v, out),
// rounded up to 8. One instance runs both, each operand's columns past its own
// head dim zero-filled (loads) or left out (stores).
int64_t fc_cuda_d8(const fc_attn *a);

// The smallest dim >= d of such a list (the instance that runs head dim d,
// zero-padded), or 0 when d is above them all.
int fc_dim_at_least(const int *dims, int64_t d);
// The largest dim of such a list, or 0 when it is empty.
int fc_dim_max(const int *dims);
// FLASHC_ERR_UNSUPPORTED, with a message naming op ("forward", "backward")
// and the head dim at fault (D, or Dv when larger), when fc_cuda_d8(a) is
// above every dim of such a list.
flashc_status fc_dim_check(const fc_attn *a, const int *dims, const char *op);
// fc_dim_check over the forward's sm80 list (fwd.cu); the forward and the
// kvcache check it first.
flashc_status fc_cuda_fwd_dim_check(const fc_attn *a);

// ---- the kernel family ----
// sm90ws: the forward's warp-specialised TMA kernels (fwd.cu picks it over sm90).
enum { FC_FAMILY_SM80 = 80, FC_FAMILY_SM90 = 90, FC_FAMILY_SM90WS = 91 };

// The family that runs an operation of head dim d8 (a multiple of 8) on device
// dv: sm90 (wgmma) on compute capability 9.0 exactly, where sm_90a code runs,
// for head dims above 32 when the build has an sm90 instance for d8
// (has_sm90); sm80 (mma.sync) everywhere else (>= 8.0). FLASHC_CUDA_FAMILY=sm80
// in the environment forces sm80 on Hopper too (tests and benchmarks of both).
// The forward then prefers sm90ws to sm90 where it can run the call (fwd.cu).
int fc_cuda_family(const fc_cuda_device &dv, int64_t d8, bool has_sm90);

// The name of a family for messages: "sm80", "sm90", "sm90ws".
const char *fc_cuda_family_name(int family);

// ---- operands the kernels read in place, and the repacked rest ----
// [n0, n1, heads, d] of one operand; rows (b, s, h) of the caller's view at
// b*s_batch + s*s_seq + h*s_head (common/repack.cuh copies them).
typedef struct {
    int64_t n0, n1, heads;
} fc_cuda_pack_dims;

__host__ __device__ inline int64_t fc_cuda_pack_elems(const fc_cuda_pack_dims &e, int64_t dp) {
    return e.n0 * e.n1 * e.heads * dp;
}

// 16-byte cp.async / vector stores: data 16-byte aligned, every stride a
// multiple of 8 elements (2-byte dtypes), the operand's head dim d a multiple of 8.
bool fc_cuda_view_direct(const fc_view *v, int64_t d);

// The operands a call may repack: the forward's q, k, v, out, and the
// backward's dout, dk, dv besides. q, k, dk have head dim D; v, out, dout, dv
// have Dv.
enum { FC_PACK_Q, FC_PACK_K, FC_PACK_V, FC_PACK_OUT, FC_PACK_DOUT, FC_PACK_DK, FC_PACK_DV, FC_PACK_N };

// Which operands go through the workspace, their index spaces and its carving.
typedef struct {
    int64_t dp;                      // D rounded up to 8: the packed row length of q, k, dk
    int64_t dpv;                     // Dv rounded up to 8: that of v, out, dout, dv
    bool packed[FC_PACK_N];          // the operands in enum order (false: in place or absent)
    fc_cuda_pack_dims dims[FC_PACK_N];
    size_t off[FC_PACK_N];           // region offsets in the workspace
    size_t bytes;                    // the workspace needed (0: none)
} fc_cuda_pack_plan;

// The plan for the first n operands of the enum (the forward's 4, the backward's all).
fc_cuda_pack_plan fc_cuda_pack_layout(const fc_attn *a, int n);

// *a with every packed operand replaced by its dense copy in ws: the inputs
// are copied there on stream, the outputs (operands in `outs`) are copied back
// by fc_cuda_pack_finish.
cudaError_t fc_cuda_pack_start(const fc_attn *a, const fc_cuda_pack_plan &pk, void *ws,
                               std::initializer_list<int> outs, cudaStream_t stream,
                               fc_attn *packed);

// Copy the packed outputs among `outs` back into the caller's views.
cudaError_t fc_cuda_pack_finish(const fc_attn *a, const fc_cuda_pack_plan &pk, void *ws,
                                std::initializer_list<int> outs, cudaStream_t stream);

// ---- TMA descriptors (the warp-specialised family, ws_params.h) ----
// The descriptor of operand v seen as the 4-d tensor (d, heads, n1, n0) of
// dims e with d = dp columns (a multiple of 8; columns of a box past them read
// as zeros, a box wholly past them too), boxes of (64, box_heads,
// box_rows, 1) stored 128B-swizzled. False when the driver has no cuTensorMapEncodeTiled
// or refuses the view (the repacked operands meet TMA's alignment and stride
// rules, so a refusal is an error of the call).
// fc_cuda_tma_available: whether the driver has cuTensorMapEncodeTiled.
struct CUtensorMap_st;
bool fc_cuda_tma_available();
bool fc_cuda_tma_map(struct CUtensorMap_st *map, const fc_view &v, const fc_cuda_pack_dims &e,
                     int64_t dp, int box_heads, int box_rows);

// ---- attn_probs (probs.cu) ----
// Where fc_probs_kernel writes: a->probs, fp32, the column stride 1.
typedef struct {
    float *probs;
    int64_t s_batch, s_head, s_row;
} fc_probs_dst;

// Launch the kernel that writes the attn_probs of the forward p describes
// (p.lse: the lse that forward wrote, never NULL; p.head_dim: the row length
// of p.q and p.k, zero-padded past the problem's) on stream, after it.
cudaError_t fc_probs_launch(const fc_cuda_fwd_params &p, const fc_probs_dst &dst, bool bf16,
                            cudaStream_t stream);

// ---- the kernel arguments ----
// The forward kernels' arguments of *a, host-derived constants included; the
// backward's and the decode kernel's embed them.
fc_cuda_fwd_params fc_cuda_fwd_make_params(const fc_attn *a);

#endif  // FLASHC_CUDA_PLAN_H
