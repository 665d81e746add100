/* flashc.h : FlashAttention in C. This header is the whole public API and its spec.
 *
 * flashc computes exact attention, softmax(Q K^T * scale) V, tiled so that the
 * Sq x Sk score matrix never reaches memory (FlashAttention-2, Dao 2023), with the
 * semantics of the flash_attn 2.x Python package: causal masks aligned to the
 * bottom-right corner, sliding windows, softcap, ALiBi, dropout, MQA/GQA,
 * variable-length batches, and a decode entry point over a contiguous or paged
 * KV cache.
 *
 * One complete call sequence (batched forward, bf16, causal):
 *
 *     int64_t qs[4] = {B, S, H, D}, ks[4] = {B, S, Hk, D}, ls[3] = {B, H, S};
 *     flashc_fwd_args a = FLASHC_ARGS_INIT;          // every optional tensor absent
 *     a.q   = flashc_tensor_contiguous(q,   FLASHC_DTYPE_BF16, 4, qs, FLASHC_DEVICE_CPU);
 *     a.k   = flashc_tensor_contiguous(k,   FLASHC_DTYPE_BF16, 4, ks, FLASHC_DEVICE_CPU);
 *     a.v   = flashc_tensor_contiguous(v,   FLASHC_DTYPE_BF16, 4, ks, FLASHC_DEVICE_CPU);
 *     a.out = flashc_tensor_contiguous(out, FLASHC_DTYPE_BF16, 4, qs, FLASHC_DEVICE_CPU);
 *     a.softmax_lse = flashc_tensor_contiguous(lse, FLASHC_DTYPE_FP32, 3, ls, FLASHC_DEVICE_CPU);
 *     flashc_params p = {0};                         // flash_attn's defaults
 *     p.causal = 1;
 *     size_t bytes = 0;
 *     flashc_status s = flashc_fwd_workspace_size(&a, &p, &bytes);
 *     void *ws = bytes ? aligned_alloc(256, (bytes + 255) / 256 * 256) : NULL;
 *     if (s == FLASHC_OK) s = flashc_fwd(&a, &p, ws, bytes);
 *     if (s != FLASHC_OK) fprintf(stderr, "%s: %s\n", flashc_status_string(s), flashc_last_error());
 *
 * Rules that hold for every entry point:
 * - Tensors are described, not owned. The library keeps no caller pointer after
 *   a call returns, never prints (except the opt-in launch log), never exits or
 *   aborts. Every entry point validates all of its arguments before it touches
 *   memory: a call that returns an error has written nothing.
 * - Strides are in elements. The last dimension must be contiguous (stride 1;
 *   any stride when it has size 1, as torch may leave it); every other stride
 *   is free, so packed layouts such as qkvpacked [B,S,3,H,D] are plain views
 *   (q = base, k = base + H*D, v = base + 2*H*D, each with stride[1] = 3*H*D).
 * - Workspace: ask its size, pass a buffer of at least that many bytes aligned to
 *   256 bytes (FLASHC_WORKSPACE_ALIGN). A size of 0 means none is needed. Passing
 *   workspace = NULL with workspace_bytes = 0 when some is needed makes the library
 *   take it from the allocator (flashc_set_allocator, default malloc) for the
 *   duration of the call: the convenience path. The size follows the call's
 *   shapes and, on the CPU, its sequence lengths (cache_seqlens included, which
 *   set the thread count): ask again when they change.
 * - CUDA calls are asynchronous, ordered on params.stream, and never synchronise
 *   inside the op.
 * - Integer tensors (cu_seqlens, block_table, cache_seqlens, ...) are int32.
 *   On the CPU their values are validated (FLASHC_ERR_INVALID_ARG). On a CUDA
 *   device they are not read on the host (that would synchronise); the kernels
 *   clamp what they read instead, so that no value can make them touch memory
 *   outside the tensors or fault the device ("Metadata on the GPU" below).
 * - params == NULL means flashc_params_default(), which is all zeros; args ==
 *   NULL is an error.
 * - Every struct the library reads through a pointer (the args structs,
 *   flashc_allocator, flashc_cuda_device_info) starts with `abi`, which the
 *   caller sets to FLASHC_ABI_VERSION (FLASHC_ARGS_INIT does): the library
 *   rejects any other value with FLASHC_ERR_INVALID_ARG naming both versions,
 *   so a program compiled against another flashc.h fails clearly instead of
 *   having its structs misread. flashc_params travels with its args and has
 *   no `abi` of its own.
 * - The CUDA backend runs every entry point for fp16 and bf16 (fp32 is
 *   CPU-only). Its backward keeps an fp32 dQ accumulator and
 *   per-row scratch in the workspace (4 * H * (rows + 128 per sequence) * D
 *   bytes and a little more): size it with flashc_bwd_workspace_size.
 *   params.deterministic = 1 orders the dQ additions across key blocks (a
 *   turn counter per query block), at a cost in speed (bench/NOTES.md).
 */
/* Metadata on the GPU. A call on CUDA tensors reads its integer tensors on the
 * device, clamped as follows; a valid value is never changed, and the result is
 * the attention of the clamped sequences. Here total is q.shape[0] (cu_seqlens_q)
 * or k.shape[0] (cu_seqlens_k; paged K/V: no bound), and clamp(x, lo, hi) =
 * min(max(x, lo), hi):
 * - cu_seqlens: sequence b is rows [s, s + n) with s = clamp(cu[b], 0, total),
 *   e = clamp(cu[b + 1], s, total), n = min(e - s, max_seqlen): a decreasing
 *   entry gives an empty sequence, rows past max_seqlen are not computed (their
 *   outputs are left as they were), and where bad entries make two sequences
 *   share rows, those rows get either one's result;
 * - seqused_k[b]: clamp(seqused_k[b], 0, n_k(b));
 * - block_table: each entry clamp(entry, 0, num_pages - 1); keys past the row's
 *   block_table.shape[1] * page_size are not used;
 * - cache_seqlens[b]: used = clamp(cache_seqlens[b], 0, capacity); new rows that
 *   would land at or past the capacity are neither written nor attended;
 *   cache_leftpad[b]: clamp(cache_leftpad[b], 0, used); cache_batch_idx[b]:
 *   clamp(cache_batch_idx[b], 0, k_cache.shape[0] - 1);
 * - rotary positions past rotary_cos.shape[0] - 1 use that last row. */

#ifndef FLASHC_H
#define FLASHC_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32) && defined(FLASHC_BUILD_SHARED)
#define FLASHC_API __declspec(dllexport)
#elif defined(__GNUC__)
#define FLASHC_API __attribute__((visibility("default")))
#else
#define FLASHC_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- version ---- */
#define FLASHC_VERSION_MAJOR 0
#define FLASHC_VERSION_MINOR 4
#define FLASHC_VERSION_PATCH 0
#define FLASHC_VERSION_NUMBER \
    (FLASHC_VERSION_MAJOR * 10000 + FLASHC_VERSION_MINOR * 100 + FLASHC_VERSION_PATCH)

/* flashc_version() : "MAJOR.MINOR.PATCH" of the library that is linked. */
FLASHC_API const char *flashc_version(void);
/* flashc_version_number() : FLASHC_VERSION_NUMBER of the library that is linked. */
FLASHC_API unsigned flashc_version_number(void);

/* The layout and meaning of the structs of this header: bumped whenever one of
 * them changes (2: flashc 0.2's scale_given; 3: flashc 0.3's abi fields,
 * zero-default windows and rotary; 4: the learnable sink fields, sink and dsink,
 * at the end of the args structs). */
#define FLASHC_ABI_VERSION 4
/* The initialiser of every args struct (and of flashc_cuda_device_info): the
 * ABI version, every tensor absent. */
#if defined(__cplusplus) && __cplusplus < 202002L
#define FLASHC_ARGS_INIT {FLASHC_ABI_VERSION}
#else
#define FLASHC_ARGS_INIT {.abi = FLASHC_ABI_VERSION}
#endif
/* flashc_abi_version() : FLASHC_ABI_VERSION of the library that is linked. */
FLASHC_API unsigned flashc_abi_version(void);

/* ---- status codes (pinned values; the list only grows) ---- */
#define FLASHC_STATUS_LIST(X)                                           \
    X(FLASHC_OK, 0, "ok")                                               \
    X(FLASHC_ERR_INVALID_ARG, 1, "invalid argument")                    \
    X(FLASHC_ERR_UNSUPPORTED, 2, "unsupported on this backend")         \
    X(FLASHC_ERR_WORKSPACE_TOO_SMALL, 3, "workspace too small")         \
    X(FLASHC_ERR_OUT_OF_MEMORY, 4, "out of memory")                     \
    X(FLASHC_ERR_CUDA, 5, "CUDA error")                                 \
    X(FLASHC_ERR_INTERNAL, 6, "internal error")

typedef enum {
#define FLASHC_STATUS_ENUM_(name, value, text) name = value,
    FLASHC_STATUS_LIST(FLASHC_STATUS_ENUM_)
#undef FLASHC_STATUS_ENUM_
    FLASHC_STATUS_COUNT
} flashc_status;

/* flashc_status_string() : static text for a status ("invalid argument"). */
FLASHC_API const char *flashc_status_string(flashc_status s);
/* flashc_last_error() : detail of the last failure on this thread, naming the
 * argument and its values ("k.shape[3]=128 but q.shape[3]=96"). "" after a
 * success. The pointer stays valid until the next flashc call on this thread. */
FLASHC_API const char *flashc_last_error(void);

/* ---- enums (new values go before _COUNT) ---- */
typedef enum {
    FLASHC_DTYPE_FP32 = 0,
    FLASHC_DTYPE_FP16 = 1,
    FLASHC_DTYPE_BF16 = 2,
    FLASHC_DTYPE_INT32 = 3,
    FLASHC_DTYPE_COUNT
} flashc_dtype;

typedef enum {
    FLASHC_DEVICE_CPU = 0,  /* host memory */
    FLASHC_DEVICE_CUDA = 1, /* memory of the current CUDA device */
    FLASHC_DEVICE_COUNT
} flashc_device;

typedef enum {
    FLASHC_BACKEND_AUTO = 0, /* the backend that can reach the tensors' device */
    FLASHC_BACKEND_CPU = 1,
    FLASHC_BACKEND_CUDA = 2,
    FLASHC_BACKEND_COUNT
} flashc_backend;

/* flashc_dtype_size() : bytes per element (4, 2, 2, 4), 0 for an invalid dtype. */
FLASHC_API size_t flashc_dtype_size(flashc_dtype dt);
/* flashc_dtype_name() : "fp32", "fp16", "bf16", "int32", or "invalid". */
FLASHC_API const char *flashc_dtype_name(flashc_dtype dt);

/* ---- tensors ---- */
#define FLASHC_MAX_DIMS 4

/* A strided view of memory the caller owns. An optional argument is absent when
 * data == NULL (a zero-initialised flashc_tensor is absent). A rank-0 tensor is
 * a scalar. stride[ndim-1] must be 1; other strides may be anything >= 0. */
typedef struct flashc_tensor {
    void *data;
    flashc_dtype dtype;
    int32_t ndim;                     /* 0 .. FLASHC_MAX_DIMS */
    int64_t shape[FLASHC_MAX_DIMS];   /* each >= 0 */
    int64_t stride[FLASHC_MAX_DIMS];  /* in elements */
    flashc_device device;
} flashc_tensor;

/* flashc_tensor_contiguous() : a row-major (C-contiguous) view of `data`.
 * Entries of shape past ndim are ignored. */
FLASHC_API flashc_tensor flashc_tensor_contiguous(void *data, flashc_dtype dtype, int32_t ndim,
                                                  const int64_t *shape, flashc_device device);

/* ---- parameters ---- */
/* Every option of flash_attn 2.x. A zero-initialised flashc_params ({0},
 * flashc_params_default(), FLASHC_PARAMS_INIT) is flash_attn's defaults: scale
 * 1/sqrt(head_dim), no mask, no window, no softcap, no dropout, the fast
 * (non-deterministic) backward, interleaved rotary, the backend of the
 * tensors' device, the default stream. */
typedef struct flashc_params {
    float softmax_scale;       /* >= 0; 0 means 1/sqrt(head_dim) unless scale_given = 1
                                  (head_dim: q's and k's, D, also when v's Dv differs) */
    int32_t scale_given;       /* 0 or 1: 1 = softmax_scale is the scale as given, 0
                                  included (flash_attn's softmax_scale=0.0: every score 0
                                  before ALiBi, so uniform attention over the visible keys) */
    int32_t causal;            /* 0 or 1; with Sq != Sk the mask is aligned to the
                                  bottom-right corner: query i sees key j iff
                                  j <= i + Sk - Sq. Same as a window with right = 0. */
    int32_t windowed;          /* 0 or 1: 1 = a sliding window (flash_attn's window_size)
                                  given by window_left and window_right; 0 = none, and
                                  both must then be 0, or both -1 */
    int32_t window_left;       /* windowed, >= -1: query i sees key j only if
                                  j >= i + Sk - Sq - left; -1 = unbounded */
    int32_t window_right;      /* windowed, >= -1: ... and only if j <= i + Sk - Sq + right;
                                  -1 = unbounded (causal = 1 makes it 0) */
    float softcap;             /* >= 0; > 0 replaces each scaled score s by
                                  softcap * tanh(s / softcap); 0 = off */
    float dropout_p;           /* [0, 1): probability of dropping an attention
                                  probability (forward and backward only) */
    uint64_t dropout_seed;     /* Philox key; see "dropout" below */
    uint64_t dropout_offset;   /* Philox counter offset */
    int32_t deterministic;     /* backward: 1 = bitwise-reproducible gradients */
    int32_t rotary_halves;     /* kvcache rotary: 0 = rotate pairs (x[2i], x[2i+1]) (GPT-J,
                                  flash_attn's rotary_interleaved=True), 1 = rotate halves
                                  (x[i], x[i + rotary_dim/2]) (GPT-NeoX) */
    int32_t num_splits;        /* kvcache: >= 0 splits of the keys; 0 = heuristic. Results
                                  do not depend on it beyond rounding; the CUDA decode
                                  kernel caps it at 128 and at the cache's key tiles */
    flashc_backend backend;    /* AUTO picks the backend of the tensors' device */
    void *stream;              /* cudaStream_t for the CUDA backend; NULL = default stream */
} flashc_params;

/* The defaults as an initialiser: all zeros. */
#define FLASHC_PARAMS_INIT {0}

/* flashc_params_default() : the defaults as a value (all zeros). */
FLASHC_API flashc_params flashc_params_default(void);

/* Dropout. Element (b, h, i, j) (batch or varlen sequence b, query head h, query
 * row i within its sequence, key column j) is dropped iff
 *     u16 < (uint32_t)(dropout_p * 65536 + 0.5),
 * where u16 is 16-bit word (j % 8) of Philox4x32-10 with
 *     key     = (lo32(seed), hi32(seed)),
 *     counter = (lo32(c), hi32(c), i, b * H + h),   c = offset + j / 8  (64-bit add),
 * word w taken as (out[w / 2] >> (16 * (w % 2))) & 0xffff. Kept probabilities
 * are scaled by 1 / (1 - dropout_p). Every backend draws this same mask, and the
 * backward regenerates it. Two calls with the same seed draw independent masks
 * when their offsets differ by at least ceil(max_seqlen_k / 8). */

/* ---- forward, batched ---- */
/* q, k: [B, Sq, H, D], [B, Sk, Hk, D]  v: [B, Sk, Hk, Dv]  (H % Hk == 0; D and
 *   Dv in 1..1024 on the CPU, 1..256 on CUDA)
 * out: [B, Sq, H, Dv], same dtype as q
 * Dv, the value head dim, is read from v's shape and may differ from D, the
 * head dim of Q K^T (DeepSeek MLA: D = 192, Dv = 128): out, and in the backward
 * dout and dv, carry Dv. Both backends support every pair in their ranges, in
 * every entry point; the CUDA backend runs the kernel instance of the larger of
 * the two (no fast path for a particular pair yet) and refuses a D or Dv past 256
 * with FLASHC_ERR_UNSUPPORTED, before any launch.
 * softmax_lse: optional fp32 [B, H, Sq], natural log of the softmax denominator;
 *   a row that sees no key gets out = 0 and lse = -inf
 * alibi_slopes: optional fp32 [H] or [B, H]; adds -slope * |i + Sk - Sq - j| to the
 *   (scaled, softcapped) score
 * attn_probs: optional fp32 [B, H, Sq, Sk], for tests: the softmax probabilities
 *   (before dropout), negated where dropout dropped the element, 0 where masked;
 *   any strides with a contiguous last dim. Every backend; the CUDA backend writes
 *   them after the forward with a plain kernel from the forward's lse (O(B H Sq Sk
 *   D) work: a testing aid), which without softmax_lse lives in the workspace
 *   (4 H B Sq bytes more, varlen 4 H total_q: the size query counts them)
 * sink: optional [H] of fp32, fp16 or bf16, whatever q's dtype (a 16-bit sink's
 *   values are exact in fp32: the same results as its fp32 copy), learnable attention
 *   sinks (gpt-oss); default absent (data NULL: no sink, results bitwise as without the
 *   field). Query head h
 *   gets one more logit s_h in the softmax's denominator that takes no value:
 *     out_i = sum_j e^{x_ij} v_j / (e^{s_h} + sum_j e^{x_ij}),
 *     lse_i = log(e^{s_h} + sum_j e^{x_ij}),
 *   x_ij being the final scores (after scale, softcap, ALiBi and masks). A row
 *   that sees no key gets out = 0 and lse = s_h. Dropout drops the keys'
 *   probabilities only; the sink's mass stays in the denominator. */
typedef struct flashc_fwd_args {
    uint32_t abi; /* FLASHC_ABI_VERSION */
    flashc_tensor q, k, v;
    flashc_tensor out;
    flashc_tensor softmax_lse;
    flashc_tensor alibi_slopes;
    flashc_tensor attn_probs;
    flashc_tensor sink; /* optional [H], fp32, fp16 or bf16; absent = no sink */
} flashc_fwd_args;

/* flashc_fwd() : batched attention forward.
 * @return FLASHC_OK, or FLASHC_ERR_INVALID_ARG (bad shape, stride, dtype, option),
 *   FLASHC_ERR_UNSUPPORTED (the backend lacks this dtype / head dim / option),
 *   FLASHC_ERR_WORKSPACE_TOO_SMALL, FLASHC_ERR_OUT_OF_MEMORY, FLASHC_ERR_CUDA. */
FLASHC_API flashc_status flashc_fwd(const flashc_fwd_args *args, const flashc_params *params,
                                    void *workspace, size_t workspace_bytes);
/* flashc_fwd_workspace_size() : the workspace flashc_fwd needs for these
 * arguments; fails as flashc_fwd_supported does, so it never answers OK for a
 * call the run would refuse. */
FLASHC_API flashc_status flashc_fwd_workspace_size(const flashc_fwd_args *args,
                                                   const flashc_params *params, size_t *bytes);
/* flashc_fwd_supported() : FLASHC_OK if flashc_fwd would run these arguments;
 * the same validation and kernel selection as the run path, nothing written.
 * Every entry point has this pair, *_workspace_size and *_supported. */
FLASHC_API flashc_status flashc_fwd_supported(const flashc_fwd_args *args,
                                              const flashc_params *params);

/* ---- forward, variable length ---- */
/* Sequences packed along the token axis:
 * q: [total_q, H, D]  k: [total_k, Hk, D]  v: [total_k, Hk, Dv], or with
 *   block_table the paged caches [num_blocks, page_size, Hk, D] and
 *   [num_blocks, page_size, Hk, Dv] (Dv as in flashc_fwd_args)
 * cu_seqlens_q, cu_seqlens_k: int32 [B + 1], cu[0] = 0, non-decreasing, cu[B] <= total;
 *   sequence b holds rows cu[b] .. cu[b+1]-1 (empty sequences allowed)
 * max_seqlen_q, max_seqlen_k: >= every sequence length (the bound of attn_probs)
 * seqused_k: optional int32 [B]: only the first seqused_k[b] keys of sequence b are used
 * block_table: optional int32 [B, max_blocks]: key row j of sequence b lives in
 *   page block_table[b][j / page_size] at row j % page_size (paged KV, chunked prefill);
 *   the key length of b is still cu_seqlens_k[b+1] - cu_seqlens_k[b]; any
 *   page_size >= 1 (flash_attn needs multiples of 256), on every backend
 * out: [total_q, H, Dv]  softmax_lse: optional fp32 [H, total_q]
 * alibi_slopes: optional fp32 [H] or [B, H]
 * attn_probs: optional fp32 [B, H, max_seqlen_q, max_seqlen_k] (rows/cols past a
 *   sequence's lengths are written 0)
 * sink: optional [H], as in flashc_fwd_args (one s_h for every sequence) */
typedef struct flashc_varlen_fwd_args {
    uint32_t abi; /* FLASHC_ABI_VERSION */
    flashc_tensor q, k, v;
    flashc_tensor out;
    flashc_tensor cu_seqlens_q, cu_seqlens_k;
    int64_t max_seqlen_q, max_seqlen_k;
    flashc_tensor seqused_k;
    flashc_tensor block_table;
    flashc_tensor softmax_lse;
    flashc_tensor alibi_slopes;
    flashc_tensor attn_probs;
    flashc_tensor sink; /* optional [H], fp32, fp16 or bf16; absent = no sink */
} flashc_varlen_fwd_args;

/* flashc_varlen_fwd() : forward over packed variable-length sequences.
 * @return as flashc_fwd(). */
FLASHC_API flashc_status flashc_varlen_fwd(const flashc_varlen_fwd_args *args,
                                           const flashc_params *params, void *workspace,
                                           size_t workspace_bytes);
FLASHC_API flashc_status flashc_varlen_fwd_workspace_size(const flashc_varlen_fwd_args *args,
                                                          const flashc_params *params,
                                                          size_t *bytes);
FLASHC_API flashc_status flashc_varlen_fwd_supported(const flashc_varlen_fwd_args *args,
                                                     const flashc_params *params);

/* ---- backward, batched ---- */
/* q, dq: [B, Sq, H, D]  out, dout: [B, Sq, H, Dv]  k, dk: [B, Sk, Hk, D]
 * v, dv: [B, Sk, Hk, Dv] (Dv as in flashc_fwd_args)
 * softmax_lse: fp32 [B, H, Sq] from the forward (required)
 * Gradients of the forward with the same params (scale, masks, softcap, ALiBi,
 * dropout seed and offset). With GQA, dk/dv hold the sum over each KV head's
 * query group. params.deterministic = 1 makes dq, dk, dv bitwise identical from
 * run to run (the CPU backend always is).
 * sink: optional [H] (fp32, fp16 or bf16), the forward's sink (softmax_lse then
 *   includes it);
 *   default absent. dq, dk, dv need nothing else: P = e^{x - lse}.
 * dsink: optional fp32 [H], only with sink; default absent (not computed).
 *   Written, not accumulated (as flash_attn's gradients):
 *     dsink_h = -sum_i e^{s_h - lse_i} * Delta_i,  Delta_i = dout_i . out_i,
 *   over every query row i of head h in every batch (or varlen sequence). */
typedef struct flashc_bwd_args {
    uint32_t abi; /* FLASHC_ABI_VERSION */
    flashc_tensor dout, q, k, v, out;
    flashc_tensor softmax_lse;
    flashc_tensor dq, dk, dv;
    flashc_tensor alibi_slopes;
    flashc_tensor sink;  /* optional [H], fp32, fp16 or bf16; absent = no sink */
    flashc_tensor dsink; /* optional fp32 [H] output, only with sink; absent = not computed */
} flashc_bwd_args;

/* flashc_bwd() : batched attention backward. @return as flashc_fwd(). */
FLASHC_API flashc_status flashc_bwd(const flashc_bwd_args *args, const flashc_params *params,
                                    void *workspace, size_t workspace_bytes);
FLASHC_API flashc_status flashc_bwd_workspace_size(const flashc_bwd_args *args,
                                                   const flashc_params *params, size_t *bytes);
FLASHC_API flashc_status flashc_bwd_supported(const flashc_bwd_args *args,
                                              const flashc_params *params);

/* ---- backward, variable length ---- */
/* q, dq: [total_q, H, D]  out, dout: [total_q, H, Dv]  k, dk: [total_k, Hk, D]
 * v, dv: [total_k, Hk, Dv]
 * softmax_lse: fp32 [H, total_q]; cu_seqlens and max_seqlen as in the forward.
 * sink, dsink: as in flashc_bwd_args; dsink sums over every sequence. */
typedef struct flashc_varlen_bwd_args {
    uint32_t abi; /* FLASHC_ABI_VERSION */
    flashc_tensor dout, q, k, v, out;
    flashc_tensor softmax_lse;
    flashc_tensor dq, dk, dv;
    flashc_tensor cu_seqlens_q, cu_seqlens_k;
    int64_t max_seqlen_q, max_seqlen_k;
    flashc_tensor alibi_slopes;
    flashc_tensor sink;  /* optional [H], fp32, fp16 or bf16; absent = no sink */
    flashc_tensor dsink; /* optional fp32 [H] output, only with sink; absent = not computed */
} flashc_varlen_bwd_args;

/* flashc_varlen_bwd() : backward over packed variable-length sequences.
 * @return as flashc_fwd(). */
FLASHC_API flashc_status flashc_varlen_bwd(const flashc_varlen_bwd_args *args,
                                           const flashc_params *params, void *workspace,
                                           size_t workspace_bytes);
FLASHC_API flashc_status flashc_varlen_bwd_workspace_size(const flashc_varlen_bwd_args *args,
                                                          const flashc_params *params,
                                                          size_t *bytes);
FLASHC_API flashc_status flashc_varlen_bwd_supported(const flashc_varlen_bwd_args *args,
                                                     const flashc_params *params);

/* ---- forward over a KV cache (decode) ---- */
/* q: [B, Sq, H, D]
 * k_cache: contiguous [B_c, S_c, Hk, D], or with block_table paged
 *   [num_blocks, page_size, Hk, D] (any page_size >= 1); v_cache the same with
 *   the value head dim Dv (as in flashc_fwd_args) last
 * k_new, v_new: optional [B, S_new, Hk, D] and [B, S_new, Hk, Dv]; written into the cache in place at
 *   rows cache_seqlens[b] .. cache_seqlens[b] + S_new - 1 (rotary applied to k_new
 *   first), then attended to
 * cache_seqlens: optional int32 [B], or a rank-0 int32 scalar for every b: the
 *   number of cache rows already in use (leftpad rows included); absent = all of
 *   them (S_c, or max_blocks * page_size when paged)
 * cache_batch_idx: optional int32 [B]: batch b uses cache row cache_batch_idx[b]
 *   (contiguous cache only)
 * cache_leftpad: optional int32 [B]: keys of b start at cache row cache_leftpad[b]
 * block_table: optional int32 [B, max_blocks]
 * rotary_cos, rotary_sin: optional [S_ro, rotary_dim / 2], fp32 or q's dtype;
 *   rotary_dim is even and <= D. k_new row t is rotated at position
 *   cache_seqlens[b] + t; q row i at cache_seqlens[b] + i when causal or windowed
 *   with an edge below the cache's rows (S_c, or max_blocks * page_size; an edge
 *   at or past them is no edge), else at cache_seqlens[b] (as flash_attn)
 * alibi_slopes: optional fp32 [H] or [B, H]
 * sink: optional [H], as in flashc_fwd_args; default absent
 * out: [B, Sq, H, Dv]  softmax_lse: optional fp32 [B, H, Sq]
 * The keys of b are cache rows cache_leftpad[b] .. cache_seqlens[b] + S_new - 1;
 * masks are aligned to their bottom-right corner as in flashc_fwd().
 * With k_new, no two sequences may share an appended cache row (through
 * cache_batch_idx or block_table): the rows are written concurrently on CUDA.
 * On CUDA the cache's rows per sequence (S_c, or max_blocks * page_size) must be
 * below 2^30; the append runs before the attention on params.stream, and the
 * query heads of each KV head are processed together, each KV byte read once. */
typedef struct flashc_kvcache_args {
    uint32_t abi; /* FLASHC_ABI_VERSION */
    flashc_tensor q;
    flashc_tensor k_cache, v_cache;
    flashc_tensor k_new, v_new;
    flashc_tensor rotary_cos, rotary_sin;
    flashc_tensor cache_seqlens;
    flashc_tensor cache_batch_idx;
    flashc_tensor cache_leftpad;
    flashc_tensor block_table;
    flashc_tensor alibi_slopes;
    flashc_tensor out;
    flashc_tensor softmax_lse;
    flashc_tensor sink; /* optional [H], fp32, fp16 or bf16; absent = no sink */
} flashc_kvcache_args;

/* flashc_fwd_kvcache() : attention of q over a KV cache, with optional in-place
 * append. params.dropout_p must be 0. @return as flashc_fwd(). */
FLASHC_API flashc_status flashc_fwd_kvcache(const flashc_kvcache_args *args,
                                            const flashc_params *params, void *workspace,
                                            size_t workspace_bytes);
FLASHC_API flashc_status flashc_fwd_kvcache_workspace_size(const flashc_kvcache_args *args,
                                                           const flashc_params *params,
                                                           size_t *bytes);
FLASHC_API flashc_status flashc_fwd_kvcache_supported(const flashc_kvcache_args *args,
                                                      const flashc_params *params);

#define FLASHC_WORKSPACE_ALIGN 256

/* ---- memory ---- */
/* The allocator serves only the convenience path (workspace NULL with 0 bytes).
 * alloc returns memory aligned to FLASHC_WORKSPACE_ALIGN on `device`, or NULL. */
typedef struct flashc_allocator {
    uint32_t abi; /* FLASHC_ABI_VERSION */
    void *(*alloc)(size_t bytes, flashc_device device, void *user);
    void (*free)(void *ptr, flashc_device device, void *user);
    void *user;
} flashc_allocator;

/* flashc_set_allocator() : replace the allocator process-wide; NULL (or alloc or
 * free NULL) restores the default (aligned malloc on the CPU, cudaMalloc on
 * CUDA). Not thread-safe against concurrent flashc calls.
 * @return FLASHC_OK, or FLASHC_ERR_INVALID_ARG (allocator->abi), which keeps the
 *   allocator as it was. */
FLASHC_API flashc_status flashc_set_allocator(const flashc_allocator *allocator);

/* ---- CPU backend settings ---- */
/* flashc_set_num_threads() : threads of the CPU backend's pool (>= 1), or 0 for the
 * default: the environment variable FLASHC_NUM_THREADS if set, else all cores (both
 * read once, at the first call that needs them). A forward too small to gain from
 * threads (about 2^18 multiply-adds) runs on the calling thread alone. */
FLASHC_API void flashc_set_num_threads(int n);
FLASHC_API int flashc_get_num_threads(void);

/* CPU SIMD paths, chosen at run time; a path is usable when the CPU has its features. */
typedef enum {
    FLASHC_SIMD_SCALAR = 0, /* portable C */
    FLASHC_SIMD_AVX2 = 1,   /* AVX2 + FMA + F16C */
    FLASHC_SIMD_AVX512 = 2, /* AVX-512 F/BW/DQ/VL, using AVX512_BF16 when present */
    FLASHC_SIMD_AMX = 3,    /* avx512, with bf16 products on AMX tiles (AMX-TILE, AMX-BF16) */
    FLASHC_SIMD_COUNT
} flashc_simd;

/* flashc_simd_name() : "scalar", "avx2", "avx512", "amx". */
FLASHC_API const char *flashc_simd_name(flashc_simd s);
/* flashc_simd_supported() : 1 if this CPU (and this build) can run path s. */
FLASHC_API int flashc_simd_supported(flashc_simd s);
/* flashc_simd_active() : the path in use: the best supported one, or the one set
 * by flashc_set_simd() or the environment variable FLASHC_SIMD (a name). */
FLASHC_API flashc_simd flashc_simd_active(void);
/* flashc_set_simd() : force a path. @return FLASHC_OK, or FLASHC_ERR_UNSUPPORTED
 * if this CPU cannot run it. */
FLASHC_API flashc_status flashc_set_simd(flashc_simd s);

/* CPU features, as bits of flashc_cpu_features(). */
#define FLASHC_CPU_AVX2 (1u << 0)
#define FLASHC_CPU_FMA (1u << 1)
#define FLASHC_CPU_F16C (1u << 2)
#define FLASHC_CPU_AVX512F (1u << 3)
#define FLASHC_CPU_AVX512BW (1u << 4)
#define FLASHC_CPU_AVX512DQ (1u << 5)
#define FLASHC_CPU_AVX512VL (1u << 6)
#define FLASHC_CPU_AVX512BF16 (1u << 7)
#define FLASHC_CPU_AVX512FP16 (1u << 8)
/* AMX-TILE and AMX-BF16, with the tile state enabled by the OS. The amx path also
 * needs Linux to grant the process that state (arch_prctl ARCH_REQ_XCOMP_PERM):
 * flashc asks the first time it considers the path (flashc_simd_supported(
 * FLASHC_SIMD_AMX), hence the default choice unless FLASHC_SIMD names another
 * path); where that is refused, the path is unsupported and avx512 is used.
 * Once granted, the whole process has the larger signal frames of the tile
 * state (about 11 KB), so a later sigaltstack() with a smaller stack fails; a
 * program that needs small signal stacks sets FLASHC_SIMD=avx512 (or calls
 * flashc_set_simd before any other flashc call, or is built with
 * -DFLASHC_AMX=OFF), and flashc never asks. */
#define FLASHC_CPU_AMXBF16 (1u << 9)
FLASHC_API unsigned flashc_cpu_features(void);

/* ---- backends ---- */
/* flashc_backend_available() : 1 if the backend is built in and usable now (for
 * CUDA: compiled in and at least one device of compute capability >= 8.0). */
FLASHC_API int flashc_backend_available(flashc_backend b);
/* flashc_backend_name() : "auto", "cpu", "cuda". */
FLASHC_API const char *flashc_backend_name(flashc_backend b);

typedef struct flashc_cuda_device_info {
    uint32_t abi;                   /* FLASHC_ABI_VERSION, set by the caller */
    char name[256];
    int32_t major, minor;           /* compute capability */
    int32_t multiprocessors;
    int64_t total_memory_bytes;
    int64_t shared_memory_per_block_optin;
    int64_t l2_cache_bytes;
} flashc_cuda_device_info;

/* flashc_cuda_device_count() : CUDA devices visible (0 when CUDA is not built in
 * or no driver is present). */
FLASHC_API int flashc_cuda_device_count(void);
/* flashc_cuda_device_get_info() : fill *info (info->abi set by the caller).
 * @return FLASHC_OK, FLASHC_ERR_INVALID_ARG (bad index, NULL, info->abi),
 *   FLASHC_ERR_UNSUPPORTED (CUDA not built in), FLASHC_ERR_CUDA. */
FLASHC_API flashc_status flashc_cuda_device_get_info(int index, flashc_cuda_device_info *info);
/* flashc_cuda_compiled() : 1 if this build contains the CUDA backend. */
FLASHC_API int flashc_cuda_compiled(void);

#ifdef __cplusplus
}
#endif

#endif /* FLASHC_H */
