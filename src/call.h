/* call.h : the normalised call, between the two halves of the public entry
 * points: prepare.c checks a call's arguments and builds an fc_call; api.c
 * sizes its workspace and runs it on its backend (through the backend table,
 * internal.h).
 *
 * Not here: the problem itself (fc_attn, fc_kvcache: internal.h).
 */
#ifndef FLASHC_CALL_H
#define FLASHC_CALL_H

#include "internal.h"

typedef enum { FC_OP_FWD, FC_OP_BWD, FC_OP_KVCACHE } fc_op;

typedef struct fc_call {
    fc_op op;
    const fc_backend_impl *impl;      /* the backend that runs it */
    flashc_device device;             /* where the tensors live */
    fc_attn attn;                     /* FC_OP_FWD, FC_OP_BWD */
    fc_kvcache kc;                    /* FC_OP_KVCACHE: kc.attn is the problem */
    const flashc_kvcache_args *kv;    /* FC_OP_KVCACHE: read again by fc_call_kv_lengths */
} fc_call;

/* Check every argument of one entry point and build *call. args NULL is an
 * error; params NULL means flashc_params_default(). Nothing is written, so a
 * call that fails leaves the caller's memory as it was; a call that passes is
 * one its backend's `supported` may still refuse (api.c asks it). Messages
 * start with the argument's name as spelled in the args struct or in
 * flashc_params, then its value and the reason. */
flashc_status fc_prepare_fwd(const flashc_fwd_args *args, const flashc_params *params,
                             fc_call *call);
flashc_status fc_prepare_varlen_fwd(const flashc_varlen_fwd_args *args,
                                    const flashc_params *params, fc_call *call);
flashc_status fc_prepare_bwd(const flashc_bwd_args *args, const flashc_params *params,
                             fc_call *call);
flashc_status fc_prepare_varlen_bwd(const flashc_varlen_bwd_args *args,
                                    const flashc_params *params, fc_call *call);
flashc_status fc_prepare_kvcache(const flashc_kvcache_args *args, const flashc_params *params,
                                 fc_call *call);

/* The int32 lengths a kvcache call on host tensors hands its backend:
 * cache_seqlens [B] (materialised, since the caller may pass a scalar or
 * nothing) then the total key lengths seqlens_k [B], written to region
 * (2 * B int32, from api.c's part of the workspace); points call->kc at them.
 * On CUDA the values live in device memory and the backend reads the caller's
 * cache_seqlens itself (kc.cache_seqlens_in). */
void fc_call_kv_lengths(fc_call *call, int32_t *region);

#endif /* FLASHC_CALL_H */
