/* reference.h : naive float64 attention, every option: the oracle of the tests
 * and of `flashc bench --check`. Test code (the flashc_support library, with
 * check.h), not part of libflashc; it reads the library's internals
 * (src/internal.h), so it links flashc_static.
 *
 * It reads the PUBLIC argument structs (not prepare.c's normalised fc_attn), so a
 * mistake in prepare.c's shape and stride handling cannot hide by agreeing with
 * itself. It materialises the whole Sq x Sk score matrix per (batch, head):
 * slow and simple on purpose. Inputs must already be valid (run the flashc
 * entry point, or its *_workspace_size query, first to validate); the
 * reference checks nothing and never writes the caller's tensors.
 *
 * Two modes:
 *   FC_REF_F64   every operation in double: the truth.
 *   FC_REF_LOWP  a plain same-precision implementation, the baseline of the
 *                tolerance rule (DEVELOPERS.md): dot products accumulated in
 *                fp32, the scores, the probabilities and the output each rounded
 *                to the input dtype, softmax in fp32 (for fp32 inputs: all fp32).
 *
 * Learnable sinks (args.sink) join every softmax denominator as flashc.h says.
 *
 * Outputs are dense double arrays in the canonical layouts below; any output
 * pointer may be NULL to skip it.
 */
#ifndef FLASHC_REFERENCE_H
#define FLASHC_REFERENCE_H

#include "flashc.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { FC_REF_F64 = 0, FC_REF_LOWP = 1 } fc_ref_mode;

/* Dv is v's head dim (the last dim of v, v_cache, out, dout, dv), D that of q
 * and k; the default scale is 1/sqrt(D).
 *
 * out [B, Sq, H, Dv], lse [B, H, Sq] (-inf for a row with no visible key),
 * probs [B, H, Sq, Sk] (softmax before dropout, negated where dropped) */
flashc_status fc_ref_fwd(const flashc_fwd_args *a, const flashc_params *p, fc_ref_mode mode,
                         double *out, double *lse, double *probs);

/* out [total_q, H, Dv], lse [H, total_q], probs [B, H, max_seqlen_q, max_seqlen_k]
 * (0 outside each sequence's lengths). Honours seqused_k and block_table. */
flashc_status fc_ref_varlen_fwd(const flashc_varlen_fwd_args *a, const flashc_params *p,
                                fc_ref_mode mode, double *out, double *lse, double *probs);

/* dq [B, Sq, H, D], dk [B, Sk, Hk, D], dv [B, Sk, Hk, Dv]. Uses a->softmax_lse only for its
 * shape: the reference recomputes the softmax itself. */
flashc_status fc_ref_bwd(const flashc_bwd_args *a, const flashc_params *p, fc_ref_mode mode,
                         double *dq, double *dk, double *dv);

/* dq [total_q, H, D], dk [total_k, Hk, D], dv [total_k, Hk, Dv] */
flashc_status fc_ref_varlen_bwd(const flashc_varlen_bwd_args *a, const flashc_params *p,
                                fc_ref_mode mode, double *dq, double *dk, double *dv);

/* dsink [H] of the backward with a learnable sink (a->sink; all 0 without):
 * -sum over the rows i of head h of e^{s_h - lse_i} (dO_i . O_i). */
flashc_status fc_ref_bwd_dsink(const flashc_bwd_args *a, const flashc_params *p, fc_ref_mode mode,
                               double *dsink);
flashc_status fc_ref_varlen_bwd_dsink(const flashc_varlen_bwd_args *a, const flashc_params *p,
                                      fc_ref_mode mode, double *dsink);

/* The decode entry point, computed from the caches as they are BEFORE the call
 * (call the reference first: flashc_fwd_kvcache appends in place).
 * out [B, Sq, H, Dv], lse [B, H, Sq], k_new_rot [B, S_new, Hk, D] (k_new after
 * rotary, the rows the append must write; v_new is written as is). */
flashc_status fc_ref_kvcache(const flashc_kvcache_args *a, const flashc_params *p,
                             fc_ref_mode mode, double *out, double *lse, double *k_new_rot);

#ifdef __cplusplus
}
#endif

#endif /* FLASHC_REFERENCE_H */
