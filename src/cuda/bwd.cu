// bwd.cu : the backward on device tensors (fc_cuda_bwd, backend.h), the only
// file that knows the backward kernels.
//
// fc_cuda_bwd(a) runs on a->stream, in order: the repack of operands the
// kernels cannot read in place (as the forward), fc_bwd_pre_kernel (delta,
// lse2, dq_accum zeroed; common/bwd_prep.cuh), with a learnable sink
// fc_bwd_dsink_kernel (its gradient from delta and lse2), the main kernel (one CTA per
// (key block, kv head, sequence): sm90/bwd_kernel.cuh on compute capability
// 9.0 for head dims 33..256, else sm80/bwd_kernel.cuh; sm90 splits a KV head's
// query heads over several CTAs when the grid is short, fc_bwd_kv_split, and
// fc_bwd_dkv_kernel then sums their fp32 dK, dV parts), fc_bwd_dq_kernel
// (dq = dq_accum * scale), the copy-back of packed dk, dv.
// The sm90 family's main kernel runs warp-specialised, sm90ws/bwd_kernel.cuh
// (the same tiles, scratch and results; 3-18% faster on the H100, bench/NOTES.md
// run 59), unless fc_bwd_ws_refusal says it cannot (Dv != D, no instance, no
// TMA encoder) or FLASHC_CUDA_BWD_WS=0 is set (read at each call): then
// sm90/bwd_kernel.cuh runs.
// With params.deterministic the main kernel's turn counters are zeroed first.
// Scratch (bwd_params.h) comes from the workspace: lse2 and delta [H][rows],
// dq_accum [H][rows][dq_pitch] fp32, the counters [H][rows / Br] int32.
//
// fc_cuda_bwd_workspace(a) is the size of that workspace; fc_cuda_bwd_supported(a)
// runs the plan's checks and launches nothing. The kernel family is
// fc_cuda_family's (plan.h), as for the forward.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"

#ifndef FLASHC_CUDA_NO_BWD
#include "../common/score.h"
#include "bwd_params.h"
#include "common/bwd_prep.cuh"
#include "sm80/inst/bwd_instances.h"
#include "sm90/inst/bwd_instances.h"
#include "sm90ws/inst/bwd_instances.h"
#include "traits.h"
#include "ws_params.h"

static const int kFcSm80BwdDims[] = {FC_SM80_BWD_HEADDIMS(FC_DIM_ENTRY_) 0};
static const int kFcSm90BwdDims[] = {FC_SM90_BWD_HEADDIMS(FC_DIM_ENTRY_) 0};

// Smallest compiled backward head dim >= d of the family, or 0.
static int fc_bwd_dim(int family, int64_t d) {
    return fc_dim_at_least(family == FC_FAMILY_SM90 ? kFcSm90BwdDims : kFcSm80BwdDims, d);
}

// Tile (Br, Bc), shared memory and CTAs per SM (sm80: taken as 1) of the
// family's backward instance for head dim `dim`.
static void fc_bwd_shape(int family, int dim, int *br, int *bc, int *smem, int *per_sm) {
    *br = *bc = *smem = *per_sm = 0;
#define FC_SHAPE_(FAM, F, D, PER_SM)                        \
    if (family == FAM && dim == D) {                        \
        *br = fc_##F##_bwd_traits<D>::kBr;                  \
        *bc = fc_##F##_bwd_traits<D>::kBc;                  \
        *smem = fc_##F##_bwd_traits<D>::kSmemBytes;         \
        *per_sm = PER_SM;                                   \
    }
#define FC_SHAPE80_(D) FC_SHAPE_(FC_FAMILY_SM80, sm80, D, 1)
#define FC_SHAPE90_(D) FC_SHAPE_(FC_FAMILY_SM90, sm90, D, fc_sm90_bwd_traits<D>::kCtasPerSm)
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
           "block=%d smem=%d deterministic=%d kv_split=%d", D, fc_cuda_dtype_name<T>(),
           (int)causal, Tr::kBr, Tr::kBc, Tr::kQStages, grid.x, grid.y, grid.z, Tr::kThreads,
           Tr::kSmemBytes, (int)p.deterministic, p.kv_split);
    return causal ? sm90_bwd_launch<D, T, true>(p, grid, stream)
                  : sm90_bwd_launch<D, T, false>(p, grid, stream);
}

template <int D, typename T>
static cudaError_t fc_sm90ws_bwd_run(const fc_cuda_bwd_ws_params &wp, bool causal, dim3 grid,
                                     cudaStream_t stream) {
    using Tr = fc_sm90ws_bwd_traits<D>;
    FC_LOG("sm90ws_bwd_kernel<D=%d, %s, causal=%d>: Br=%d Bc=%d q_stages=%d dq_bufs=%d "
           "grid=(%u,%u,%u) block=%d smem=%d deterministic=%d kv_split=%d", D,
           fc_cuda_dtype_name<T>(), (int)causal, Tr::kBr, Tr::kBc, Tr::kQStages, Tr::kDQBufs,
           grid.x, grid.y, grid.z, Tr::kThreads, Tr::kSmemBytes, (int)wp.b.deterministic,
           wp.b.kv_split);
    return causal ? sm90ws_bwd_launch<D, T, true>(wp, grid, stream)
                  : sm90ws_bwd_launch<D, T, false>(wp, grid, stream);
}

// Shared memory of the sm90ws backward instance of head dim `dim`, or 0 if none.
static int fc_bwd_ws_smem(int dim) {
#define FC_WS_SMEM_(D) \
    if (dim == D) return fc_sm90ws_bwd_traits<D>::kSmemBytes;
    FC_SM90WS_BWD_HEADDIMS(FC_WS_SMEM_)
#undef FC_WS_SMEM_
    return 0;
}

// Why the sm90ws backward cannot run a call that the sm90 family runs with
// the instance of head dim `dim` (its tile: the same), or NULL.
static const char *fc_bwd_ws_refusal(const fc_attn *a, int dim, const fc_cuda_device &dv) {
    if (a->head_dim_v != a->head_dim) return "a value head dim other than the query's";
    const int smem = fc_bwd_ws_smem(dim);
    if (smem == 0) return "no sm90ws backward instance for this head dim";
    if (smem > dv.smem_optin) return "its shared memory exceeds the device's limit";
    if (!fc_cuda_tma_available()) return "the driver has no cuTensorMapEncodeTiled";
    return NULL;
}

enum { FC_BWW_PACK, FC_BWW_LSE2, FC_BWW_DELTA, FC_BWW_DQACC, FC_BWW_SEM, FC_BWW_DKV, FC_BWW_N };

// Whether the sm90 grid is key-major (bwd_params.h key_major): causal with
// no left window (the CTAs' work falls with the key block), the key blocks
// within grid y's limit.
static bool fc_bwd_key_major(const fc_attn *a, int bc) {
    return a->window_right == 0 && a->window_left < 0 &&
           (a->max_seqlen_k + bc - 1) / bc <= 65535;
}

// The GQA split of the sm90 kernel (bwd_params.h kv_split): S CTAs per (key
// block, KV head), S a divisor of the group G, each walking G / S query heads,
// when the grid of one CTA per (key block, KV head) would leave SMs idle (few
// KV heads, short sequences). Without a causal mask (every CTA the same work),
// among the S whose grid stays within two waves of `slots` CTAs, the one whose
// last wave is fullest; ties go to the smaller S (less fp32 partial traffic).
// Causal (no left window), key block n's CTAs meet ~(Sq - n Bc) / Br query
// blocks, so a grid of few waves waits for its first key blocks: there the
// grid is key-major (the longest CTAs dispatched first) and S the largest
// divisor with at least two heads a CTA (S <= G / 2) whose grid has at most 16
// waves (its dK/dV parts: 2 S Hk <= H rows of keys, no more workspace than
// the dQ accumulator where Sk <= Sq). Measured on the H100 (bench/NOTES.md
// run 59), causal bf16, 32/2 heads D128 2k and 8k, D256 8k, 64/8 heads B2
// D128 2k and 8k: that S was the best S or within 3% of it at each, and S = G
// (one head a CTA) was 3-51% slower than G / 2. key_major: fc_bwd_key_major's
// answer for this call. FLASHC_CUDA_BWD_SPLIT=n takes the largest divisor of G
// that is at most n instead (tests, measurements).
static int fc_bwd_kv_split(const fc_attn *a, int bc, bool key_major, int64_t slots) {
    const int64_t G = a->heads / a->kv_heads;
    const char *force = getenv("FLASHC_CUDA_BWD_SPLIT");
    if (force && *force) {
        const int64_t most = atoll(force);
        int split = 1;
        for (int64_t s = 1; s <= G && s <= most; ++s)
            if (G % s == 0 && a->kv_heads * s <= 65535) split = (int)s;
        return split;
    }
    const int64_t ctas = (a->max_seqlen_k + bc - 1) / bc * a->kv_heads * a->batch;
    if (key_major) {
        int split = 1;
        for (int64_t s = 2; s <= G / 2 && ctas * s <= 16 * slots; ++s)
            if (G % s == 0) split = (int)s;
        return split;
    }
    if (ctas >= slots) return 1;
    int split = 1;
    double best = 0.0;
    for (int64_t s = 1; s <= G && a->kv_heads * s <= 65535; ++s) {
        if (G % s) continue;
        const int64_t n = ctas * s, waves = (n + slots - 1) / slots;
        if (waves > 2) break;
        const double fill = (double)n / (double)(waves * slots);
        if (fill > best + 1e-9) {
            split = (int)s;
            best = fill;
        }
    }
    return split;
}

// What fc_cuda_bwd will run.
typedef struct {
    int family;       // FC_FAMILY_SM80 or FC_FAMILY_SM90
    int dim;          // compiled head dim of the family (>= D and Dv, zero-padded)
    int br, bc;       // its tile
    int64_t dq_pitch; // floats per dq_accum row: sm90 the instance's D (its bulk
                      // reductions cover whole rows), sm80 the packed row
    bool causal;      // the kCausal instance
    bool ws;          // sm90: the warp-specialised kernel (not FLASHC_CUDA_BWD_WS=0)
    bool empty;       // no batch, head or key: nothing to write
    int64_t rows;     // scratch rows per head (a multiple of 128)
    int32_t sq_pad;   // batched: Sq rounded up to kFcBwdPadRows
    int kv_split;     // CTAs per (key block, KV head): fc_bwd_kv_split
    bool key_major;   // sm90, causal: the grid (Hk S, key blocks, B) (bwd_params.h)
    int64_t kv_rows;  // key rows of one dkv_accum part (kv_split > 1)
    fc_cuda_pack_plan pk;
    size_t off[FC_BWW_N];
    size_t bytes;
} fc_cuda_bwd_plan;

static flashc_status fc_cuda_bwd_plan_make(const fc_attn *a, fc_cuda_bwd_plan *pl) {
    *pl = fc_cuda_bwd_plan{};
    FC_TRY(fc_cuda_dtype_check(a));
    FC_TRY(fc_dim_check(a, kFcSm80BwdDims, "backward"));
    const int64_t d8 = fc_cuda_d8(a);
    FC_TRY(fc_cuda_len_check(a));
    FC_TRY(fc_cuda_grid_check(a->batch, a->kv_heads, "kv_heads"));
    fc_cuda_device dv;
    FC_TRY(fc_cuda_device_get(&dv));
    pl->family = fc_cuda_family(dv, d8, fc_bwd_dim(FC_FAMILY_SM90, d8) != 0);
    const bool sm90 = pl->family == FC_FAMILY_SM90;
    pl->dim = fc_bwd_dim(pl->family, d8);
    int smem = 0, per_sm = 0;
    fc_bwd_shape(pl->family, pl->dim, &pl->br, &pl->bc, &smem, &per_sm);
    if (smem > dv.smem_optin)
        return fc_set_error(FLASHC_ERR_UNSUPPORTED,
                            "head_dim=%lld, value head_dim=%lld: the backward needs %d bytes "
                            "of shared memory per block but CUDA device %d allows %d",
                            (long long)a->head_dim, (long long)a->head_dim_v, smem, dv.dev,
                            dv.smem_optin);
    pl->causal = a->window_right == 0;
    const char *ws_env = getenv("FLASHC_CUDA_BWD_WS");
    if (sm90 && !(ws_env && strcmp(ws_env, "0") == 0)) {
        const char *why = fc_bwd_ws_refusal(a, pl->dim, dv);
        if (why)
            FC_LOG("sm90ws backward not used (%s): the sm90 kernel runs", why);
        else
            pl->ws = true;
    }
    pl->empty = a->batch == 0 || a->heads == 0 || a->max_seqlen_k == 0;

    const int64_t pad = kFcBwdPadRows;
    pl->sq_pad = (int32_t)((a->max_seqlen_q + pad - 1) / pad * pad);
    const int64_t rows = a->cu_seqlens_q ? a->total_q + a->batch * pad : a->batch * pl->sq_pad;
    pl->rows = (rows + pad - 1) / pad * pad;
    pl->pk = fc_cuda_pack_layout(a, FC_PACK_N);
    pl->dq_pitch = sm90 ? pl->dim : pl->pk.dp;
    pl->key_major = sm90 && fc_bwd_key_major(a, pl->bc);
    pl->kv_split =
        sm90 ? fc_bwd_kv_split(a, pl->bc, pl->key_major, (int64_t)dv.sms * per_sm) : 1;
    pl->kv_rows = a->cu_seqlens_k ? a->total_k : a->batch * a->max_seqlen_k;
    const size_t h = (size_t)a->heads, r = (size_t)pl->rows;
    size_t sizes[FC_BWW_N] = {0};
    if (!pl->empty) {
        sizes[FC_BWW_PACK] = pl->pk.bytes;
        sizes[FC_BWW_LSE2] = h * r * sizeof(float);
        sizes[FC_BWW_DELTA] = h * r * sizeof(float);
        sizes[FC_BWW_DQACC] = h * r * (size_t)pl->dq_pitch * sizeof(float);
        if (a->deterministic) sizes[FC_BWW_SEM] = h * (r / (size_t)pl->br) * sizeof(int32_t);
        if (pl->kv_split > 1)  // dK and dV parts
            sizes[FC_BWW_DKV] = 2 * (size_t)pl->kv_split * (size_t)a->kv_heads *
                                (size_t)pl->kv_rows * (size_t)pl->dim * sizeof(float);
    }
    pl->bytes = fc_ws_layout(FC_BWW_N, sizes, pl->off);
    return FLASHC_OK;
}

extern "C" flashc_status fc_cuda_bwd_supported(const fc_attn *a) {
    fc_cuda_bwd_plan pl;
    return fc_cuda_bwd_plan_make(a, &pl);
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
    const cudaStream_t stream = (cudaStream_t)a->stream;
    if (pl.empty) {
        // no key: every row sees the sink alone, delta = 0, so dsink = 0
        if (a->dsink && a->heads > 0) {
            fc_cuda_bwd_params z = {};
            z.f.sink = a->sink, z.f.sink_s = a->sink_s, z.f.sink_dtype = a->sink_dtype;
            z.dsink = a->dsink, z.dsink_s = a->dsink_s;
            fc_bwd_dsink_kernel<<<(unsigned)a->heads, kFcBwdPrepThreads, 0, stream>>>(z);
            FC_CUDA_TRY(cudaGetLastError());
        }
        return FLASHC_OK;
    }
    if (ws_bytes < pl.bytes || !ws)
        return fc_set_error(FLASHC_ERR_WORKSPACE_TOO_SMALL, "workspace_bytes=%zu but %zu are needed",
                            ws_bytes, pl.bytes);
    char *base = (char *)ws;
    void *pack_ws = base + pl.off[FC_BWW_PACK];

    fc_attn packed;
    FC_CUDA_TRY(fc_cuda_pack_start(a, pl.pk, pack_ws, {FC_PACK_DK, FC_PACK_DV}, stream, &packed));
    fc_cuda_bwd_params p = {};
    p.f = fc_cuda_fwd_make_params(&packed);
    p.f.head_dim = (int32_t)pl.pk.dp;
    p.f.head_dim_v = (int32_t)pl.pk.dpv;
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
    p.kv_split = pl.kv_split;
    p.key_major = pl.key_major;
    p.split_heads = (int32_t)(a->heads / a->kv_heads / pl.kv_split);
    p.dkv_accum = pl.kv_split > 1 ? (float *)(base + pl.off[FC_BWW_DKV]) : NULL;
    p.kv_rows = pl.kv_rows;
    p.dkv_pitch = pl.dim;
    p.dsink = a->dsink;
    p.dsink_s = a->dsink_s;
    p.ds_scale = a->scale;
    p.log2e = fc_score_consts_of(a).log2e;
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
    if (p.dsink) {
        fc_bwd_dsink_kernel<<<(unsigned)a->heads, kFcBwdPrepThreads, 0, stream>>>(p);
        FC_CUDA_TRY(cudaGetLastError());
    }
    const unsigned nblocks = (unsigned)((a->max_seqlen_k + pl.bc - 1) / pl.bc),
                   ys = (unsigned)(a->kv_heads * pl.kv_split);
    const dim3 grid(pl.key_major ? ys : nblocks, pl.key_major ? nblocks : ys, (unsigned)a->batch);
    e = cudaErrorInvalidValue;  // no instance: cannot happen after the plan
#define FC_CASE_(F, D)                                                                 \
    case D:                                                                            \
        e = bf16 ? fc_##F##_bwd_run<D, __nv_bfloat16>(p, pl.causal, grid, stream)      \
                 : fc_##F##_bwd_run<D, __half>(p, pl.causal, grid, stream);            \
        break;
#define FC_CASE80_(D) FC_CASE_(sm80, D)
#define FC_CASE90_(D) FC_CASE_(sm90, D)
#define FC_CASE90WS_(D)                                                        \
    case D:                                                                    \
        e = bf16 ? fc_sm90ws_bwd_run<D, __nv_bfloat16>(wp, pl.causal, grid, stream) \
                 : fc_sm90ws_bwd_run<D, __half>(wp, pl.causal, grid, stream);       \
        break;
    bool use_ws = pl.ws;
    fc_cuda_bwd_ws_params wp;
    if (use_ws) {
        // the TMA descriptors of q and dout: boxes of 64 columns by Br rows of one head
        wp.b = p;
        use_ws =
            fc_cuda_tma_map(&wp.tma_q, packed.q, pl.pk.dims[FC_PACK_Q], pl.pk.dp, 1, pl.br) &&
            fc_cuda_tma_map(&wp.tma_do, packed.dout, pl.pk.dims[FC_PACK_DOUT], pl.pk.dp, 1, pl.br);
        if (!use_ws)
            FC_LOG("sm90ws backward not used (the CUDA driver refused a TMA descriptor of q or "
                   "dout): the sm90 kernel runs");
    }
    if (use_ws) {
        switch (pl.dim) { FC_SM90WS_BWD_HEADDIMS(FC_CASE90WS_) default: break; }
    } else if (pl.family == FC_FAMILY_SM90) {
        switch (pl.dim) { FC_SM90_BWD_HEADDIMS(FC_CASE90_) default: break; }
    } else {
        switch (pl.dim) { FC_SM80_BWD_HEADDIMS(FC_CASE80_) default: break; }
    }
#undef FC_CASE90WS_
#undef FC_CASE90_
#undef FC_CASE80_
#undef FC_CASE_
    if (e != cudaSuccess)
        return fc_set_error(FLASHC_ERR_CUDA, "sm%d%s_bwd_kernel<D=%d, %s, causal=%d> launch: %s",
                            pl.family, use_ws ? "ws" : "", pl.dim, bf16 ? "bf16" : "fp16",
                            (int)pl.causal, cudaGetErrorString(e));
    // behind the sm90 main kernel (a programmatic dependent launch itself) the
    // dKV and dQ kernels are too: they start during its last wave, and wait;
    // behind sm90ws (no trigger) and sm80 they are plain launches
    const bool pdl = pl.family == FC_FAMILY_SM90 && !use_ws;
    if (pl.kv_split > 1) {
        const dim3 kv_grid((unsigned)((a->max_seqlen_k + kFcBwdPrepRows - 1) / kFcBwdPrepRows),
                           (unsigned)a->kv_heads, (unsigned)a->batch);
        FC_CUDA_TRY(fc_launch(bf16 ? fc_bwd_dkv_kernel<__nv_bfloat16> : fc_bwd_dkv_kernel<__half>,
                              kv_grid, dim3(kFcBwdPrepThreads), 0, stream, pdl, p));
    }
    if (prep_grid.x > 0) {
        FC_CUDA_TRY(fc_launch(bf16 ? fc_bwd_dq_kernel<__nv_bfloat16> : fc_bwd_dq_kernel<__half>,
                              prep_grid, dim3(kFcBwdPrepThreads), 0, stream, pdl, p));
    }
    FC_CUDA_TRY(fc_cuda_pack_finish(a, pl.pk, pack_ws, {FC_PACK_DK, FC_PACK_DV}, stream));
    return FLASHC_OK;
}
#else   // FLASHC_CUDA_BWD=OFF: a build without the backward kernels
extern "C" flashc_status fc_cuda_bwd_supported(const fc_attn *a) {
    return fc_set_error(FLASHC_ERR_UNSUPPORTED,
                        "q.device=cuda but this build has no CUDA backward (FLASHC_CUDA_BWD=OFF)");
}

extern "C" size_t fc_cuda_bwd_workspace(const fc_attn *a) { return 0; }

extern "C" flashc_status fc_cuda_bwd(const fc_attn *a, void *ws, size_t ws_bytes) {
    return fc_cuda_bwd_supported(a);
}
#endif  // FLASHC_CUDA_NO_BWD
