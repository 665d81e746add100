/* score.h : the constants of the score path (softmax scale, softcap, ALiBi,
 * dropout and log2 e), derived from the resolved options of fc_attn in one
 * place for every backend: src/cpu/fwd.c, src/cpu/bwd.c and the CUDA host's
 * kernel arguments.
 *
 * The logit of (query i, key j) is (flashc.h)
 *     z = scale q.k                              (no softcap)
 *     z = softcap tanh(scale q.k / softcap)      (softcap > 0)
 * minus slope |j - diag(i)| with ALiBi, -inf outside the window
 * (common/window.h). Every backend runs the softmax on exp2, so it keeps the
 * scores in log2 units, x = z log2(e); the two backends factor that differently:
 *   CPU   x directly: x = q.k qk_log2, or x = cap_log2 tanh(q.k qk_tanh); the
 *         slope times log2e; lse = (m + log2 l) ln2.
 *   CUDA  a score u per element in units of `unit`, z = u unit: u = q.k (no
 *         softcap) or u = tanh(q.k qk_tanh), computed as
 *         1 - 2 / (2^(q.k tanh_exp2) + 1); then x = u unit_log2, and the
 *         slope in units of u is slope unit_inv.
 *
 * Each field is computed in double from the float options and rounded to float
 * once, so a constant has one value everywhere it is used.
 *
 * Not here: the window (common/window.h), the dropout mask itself
 * (common/philox.h), the scale's default (prepare.c resolves it into fc_attn).
 */
#ifndef FLASHC_COMMON_SCORE_H
#define FLASHC_COMMON_SCORE_H

#include <float.h>
#include <stdint.h>

#include "../internal.h"

/* log2(e) and ln(2), in double (the float constant is fc_score_consts.log2e) */
#define FC_LOG2E 1.44269504088896340736
#define FC_LN2 0.693147180559945309417

typedef struct fc_score_consts {
    /* ---- scores in log2 units (the CPU's form) ---- */
    float qk_log2;  /* scale log2(e): q.k -> x without softcap */
    float qk_tanh;  /* scale / softcap: q.k -> the tanh argument; 0 when softcap is off */
    float cap_log2; /* softcap log2(e): tanh -> x; 0 when softcap is off */
    float log2e;    /* log2(e): ALiBi slopes and natural-log lse into log2 units */
    double ln2;     /* ln(2): log2 units back to natural log (lse = lse2 ln2) */

    /* ---- scores in units (the CUDA kernels' form) ---- */
    float unit;      /* softcap, else scale; a zero scale as FLT_MIN, so that units
                        stay finite (unit_inv) and an empty row's -inf max times
                        unit_log2 stays -inf; FLT_MIN q.k is far below the rounding
                        of any logit, so the result is a zero scale's */
    float unit_log2; /* unit log2(e): u -> x */
    float unit_inv;  /* 1 / unit: an ALiBi slope in units of u */
    float tanh_exp2; /* 2 log2(e) scale / softcap: tanh(q.k qk_tanh)
                        = 1 - 2 / (2^(q.k tanh_exp2) + 1); 0 when softcap is off */

    /* ---- dropout (flashc.h "Dropout") ---- */
    uint32_t drop_threshold; /* fc_dropout_threshold(p): drop iff u16 < threshold */
    float drop_scale;        /* 1 / (1 - p): kept probabilities; 1 when off */
} fc_score_consts;

/* fc_score_consts_of() : the constants of a's options (scale >= 0, softcap >= 0,
 * dropout_p in [0, 1)). */
static inline fc_score_consts fc_score_consts_of(const fc_attn *a) {
    const double scale = a->scale, cap = a->softcap, p = a->dropout_p;
    const int softcap = a->softcap > 0.0f;
    fc_score_consts c;
    c.qk_log2 = (float)(scale * FC_LOG2E);
    c.qk_tanh = softcap ? (float)(scale / cap) : 0.0f;
    c.cap_log2 = softcap ? (float)(cap * FC_LOG2E) : 0.0f;
    c.log2e = (float)FC_LOG2E;
    c.ln2 = FC_LN2;

    c.unit = softcap ? a->softcap : a->scale > 0.0f ? a->scale : FLT_MIN;
    c.unit_log2 = (float)((double)c.unit * FC_LOG2E);
    c.unit_inv = (float)(1.0 / (double)c.unit);
    c.tanh_exp2 = softcap ? (float)(2.0 * FC_LOG2E * scale / cap) : 0.0f;

    c.drop_threshold = fc_dropout_threshold(a->dropout_p);
    c.drop_scale = a->dropout_p > 0.0f ? (float)(1.0 / (1.0 - p)) : 1.0f;
    return c;
}

#endif /* FLASHC_COMMON_SCORE_H */
