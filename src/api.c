/* api.c : the second half of every public entry point of include/flashc.h that
 * runs attention, after prepare.c has checked the arguments and built an
 * fc_call (call.h): the backend's own checks, the workspace, the dispatch.
 *
 * Every entry point takes the same steps:
 *   1. fc_prepare_*: check, pick the backend, normalise (prepare.c);
 *   2. the backend's `supported` (the backend table, internal.h): a problem it
 *      refuses fails here, before any workspace is sized;
 *   3. fc_call_layout: the workspace the call needs, api.c's own region first
 *      and the backend's after it, carved by fc_ws_layout;
 *   4. fc_run: check the caller's workspace or borrow one from the allocator,
 *      fill api.c's region, call the backend's `run`.
 * flashc_*_supported stops after step 2, the *_workspace_size queries after 3,
 * so a query never answers OK for a call that its run would refuse. The run
 * itself skips step 2 (the backend's run makes the same checks: a decode call
 * pays for them once) unless it is about to borrow a workspace.
 *
 * api.c's region holds, for flashc_fwd_kvcache on host tensors only, the two
 * int32 [B] length arrays of fc_call_kv_lengths (call.h).
 *
 * Not here: argument checks (prepare.c), any attention arithmetic (src/cpu,
 * src/cuda), which backends exist (backend.c).
 */
#include <stdint.h>

#include "call.h"

// ---- the launch log ----
/* The dispatch line of FLASHC_LOG: the entry point, the backend that runs it,
 * the problem, and where the workspace comes from. */
static void fc_log_call(const fc_call *call, size_t ws_bytes, bool borrowed) {
    const fc_attn *a = call->op == FC_OP_KVCACHE ? &call->kc.attn : &call->attn;
    const bool varlen = a->cu_seqlens_q != NULL;
    const char *entry = call->op == FC_OP_KVCACHE ? "flashc_fwd_kvcache"
                        : call->op == FC_OP_BWD   ? (varlen ? "flashc_varlen_bwd" : "flashc_bwd")
                                                  : (varlen ? "flashc_varlen_fwd" : "flashc_fwd");
    fc_log("%s: backend=%s dtype=%s B=%lld H=%lld Hk=%lld Sq=%lld Sk=%lld D=%lld causal=%d "
           "window=(%d,%d) softcap=%g dropout=%g alibi=%d sink=%d page_size=%lld new=%lld "
           "rotary_dim=%lld workspace=%zu (%s)",
           entry, flashc_backend_name(call->impl->id), flashc_dtype_name(a->dtype),
           (long long)a->batch, (long long)a->heads, (long long)a->kv_heads,
           (long long)a->max_seqlen_q, (long long)a->max_seqlen_k, (long long)a->head_dim,
           (int)a->causal, (int)a->window_left, (int)a->window_right, (double)a->softcap,
           (double)a->dropout_p, a->alibi != NULL, a->sink != NULL, (long long)a->page_size,
           (long long)call->kc.seqlen_new, (long long)call->kc.rotary_dim, ws_bytes,
           borrowed ? "allocator" : "caller");
}

// ---- workspace and dispatch ----
enum { FC_WS_API, FC_WS_BACKEND, FC_WS_REGIONS };

/* Whether api.c's region holds the kvcache lengths: values on the host. */
static bool fc_call_has_lengths(const fc_call *call) {
    return call->op == FC_OP_KVCACHE && call->device == FLASHC_DEVICE_CPU;
}

/* Step 2: the backend's own checks. */
static flashc_status fc_call_supported(const fc_call *call) {
    const fc_backend_impl *b = call->impl;
    switch (call->op) {
    case FC_OP_FWD: return b->fwd.supported ? b->fwd.supported(&call->attn) : FLASHC_OK;
    case FC_OP_BWD: return b->bwd.supported ? b->bwd.supported(&call->attn) : FLASHC_OK;
    case FC_OP_KVCACHE: return b->kvcache.supported ? b->kvcache.supported(&call->kc) : FLASHC_OK;
    }
    return fc_set_error(FLASHC_ERR_INTERNAL, "call.op=%d is not an operation", (int)call->op);
}

/* Step 3: bytes of each region and the total the call needs. */
static size_t fc_call_layout(const fc_call *call, size_t off[FC_WS_REGIONS]) {
    const fc_backend_impl *b = call->impl;
    size_t sizes[FC_WS_REGIONS] = {0, 0};
    switch (call->op) {
    case FC_OP_FWD: sizes[FC_WS_BACKEND] = b->fwd.workspace(&call->attn); break;
    case FC_OP_BWD: sizes[FC_WS_BACKEND] = b->bwd.workspace(&call->attn); break;
    case FC_OP_KVCACHE: sizes[FC_WS_BACKEND] = b->kvcache.workspace(&call->kc); break;
    }
    if (fc_call_has_lengths(call)) sizes[FC_WS_API] = 2 * (size_t)call->kc.attn.batch * sizeof(int32_t);
    return fc_ws_layout(FC_WS_REGIONS, sizes, off);
}

/* Step 4: check (or, on the convenience path, borrow) the workspace and run. */
static flashc_status fc_run(fc_call *call, void *ws, size_t ws_bytes) {
    size_t off[FC_WS_REGIONS];
    size_t need = fc_call_layout(call, off);
    void *owned = NULL;
    if (!ws && ws_bytes == 0) {
        if (need > 0) {
            /* nothing borrowed for a call the backend refuses: its reason, not an
               allocation, is what the caller gets */
            FC_TRY(fc_call_supported(call));
            owned = ws = fc_alloc(need, call->device);
            if (!ws)
                return fc_set_error(FLASHC_ERR_OUT_OF_MEMORY,
                                    "workspace=NULL: the allocator returned NULL for %zu bytes", need);
            ws_bytes = need;
        }
    } else {
        FC_CHECK_ARG(ws, "workspace is NULL but workspace_bytes=%zu", ws_bytes);
        FC_CHECK_ARG((uintptr_t)ws % FLASHC_WORKSPACE_ALIGN == 0,
                     "workspace=%p is not aligned to %d bytes", ws, FLASHC_WORKSPACE_ALIGN);
        if (ws_bytes < need)
            return fc_set_error(FLASHC_ERR_WORKSPACE_TOO_SMALL, "workspace_bytes=%zu but %zu are needed",
                                ws_bytes, need);
    }
    if (fc_log_on()) fc_log_call(call, need, owned != NULL);
    char *base = (char *)ws;
    void *bws = base ? base + off[FC_WS_BACKEND] : NULL;
    size_t bbytes = base ? ws_bytes - off[FC_WS_BACKEND] : 0;
    if (fc_call_has_lengths(call) && call->kc.attn.batch > 0)
        fc_call_kv_lengths(call, (int32_t *)(base + off[FC_WS_API]));
    const fc_backend_impl *b = call->impl;
    flashc_status s = FLASHC_ERR_INTERNAL;
    switch (call->op) {
    case FC_OP_FWD: s = b->fwd.run(&call->attn, bws, bbytes); break;
    case FC_OP_BWD: s = b->bwd.run(&call->attn, bws, bbytes); break;
    case FC_OP_KVCACHE: s = b->kvcache.run(&call->kc, bws, bbytes); break;
    }
    fc_free(owned, call->device);
    return s;
}

// ---- public entry points ----
/* Three functions per entry point NAME with arguments ARGS, prepared by
 * PREPARE (prepare.c): NAME runs, NAME##_workspace_size sizes, NAME##_supported
 * answers whether NAME would run. Each clears the last error first. */
#define FC_ENTRY_POINT(NAME, ARGS, PREPARE)                                                     \
    flashc_status NAME(const ARGS *args, const flashc_params *params, void *workspace,          \
                       size_t workspace_bytes) {                                                \
        fc_clear_error();                                                                       \
        fc_call call;                                                                           \
        FC_TRY(PREPARE(args, params, &call));                                                   \
        return fc_run(&call, workspace, workspace_bytes);                                       \
    }                                                                                           \
    flashc_status NAME##_workspace_size(const ARGS *args, const flashc_params *params,          \
                                        size_t *bytes) {                                        \
        fc_clear_error();                                                                       \
        FC_CHECK_ARG(bytes, "bytes is NULL");                                                   \
        fc_call call;                                                                           \
        FC_TRY(PREPARE(args, params, &call));                                                   \
        FC_TRY(fc_call_supported(&call));                                                       \
        size_t off[FC_WS_REGIONS];                                                              \
        *bytes = fc_call_layout(&call, off);                                                    \
        return FLASHC_OK;                                                                       \
    }                                                                                           \
    flashc_status NAME##_supported(const ARGS *args, const flashc_params *params) {             \
        fc_clear_error();                                                                       \
        fc_call call;                                                                           \
        FC_TRY(PREPARE(args, params, &call));                                                   \
        return fc_call_supported(&call);                                                        \
    }

FC_ENTRY_POINT(flashc_fwd, flashc_fwd_args, fc_prepare_fwd)
FC_ENTRY_POINT(flashc_varlen_fwd, flashc_varlen_fwd_args, fc_prepare_varlen_fwd)
FC_ENTRY_POINT(flashc_bwd, flashc_bwd_args, fc_prepare_bwd)
FC_ENTRY_POINT(flashc_varlen_bwd, flashc_varlen_bwd_args, fc_prepare_varlen_bwd)
FC_ENTRY_POINT(flashc_fwd_kvcache, flashc_kvcache_args, fc_prepare_kvcache)
