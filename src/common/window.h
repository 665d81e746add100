/* window.h : which keys a query row sees (causal and local windows), the one
 * statement of the rule for every backend.
 *
 * flash_attn 2.x's rule (flashc.h, params.window_left/right). In a sequence of
 * sq query rows and sk keys, query row i has the bottom-right aligned diagonal
 *     diag = i + sk - sq
 * and sees key j (0 <= j < sk) iff
 *     left  < 0  or  j >= diag - left
 *     right < 0  or  j <= diag + right
 * where left, right are fc_attn's window (-1 = unbounded; causal is right = 0;
 * prepare.c turns flashc_params' windowed = 0 into -1, -1).
 *
 * Three forms, side by side here; tests/test_rules.c proves that they agree:
 *   range    keys [FC_WINDOW_LO(diag, left), FC_WINDOW_HI(diag, right, sk)):
 *            LO may be < 0 (no bound below; clamp it at 0 to index) or >= sk,
 *            HI is <= sk; no key is visible when HI <= max(LO, 0).
 *   element  FC_WINDOW_SEES(d, left, right) for the key at d = j - diag
 *            (the caller bounds j < sk).
 *   rows     the inverse, which rows see key j: i >= FC_WINDOW_ROW_LO(j,
 *            right, sq, sk) when right >= 0, and i <= FC_WINDOW_ROW_HI(j, left,
 *            sq, sk) when left >= 0 (unclamped; rows are 0 .. sq - 1). The
 *            backward walks a key block's query blocks by it.
 *
 * Macros, generic over the index type, because the two sides need different
 * widths: the GPU kernels use int (src/cuda/common/mask.cuh; src/cuda/plan.cu
 * keeps every length and window below 2^30 there), the host int64_t (src/internal.h
 * fc_key_range: lengths and windows up to INT32_MAX, whose sums need 64 bits).
 * A macro also expands to the very expression a kernel had written inline, so
 * the kernels compile to the same SASS. Arguments may be evaluated more than
 * once: pass plain values. Plain C: it compiles as CUDA host and device code.
 *
 * Users: fc_key_range (the host form: src/cpu), common/mask.cuh fc_mask
 * (every GPU kernel's masks and tile ranges), the scalar score_mod,
 * common/bwd_tile.cuh fc_bwd_block (the rows form), cli/flops.h. Twins in
 * their own form, checked by tests/test_rules.c: the vector score_mod of
 * src/cpu/simd_avx2.c and simd_avx512.c (lanes of FC_WINDOW_SEES). The CUDA
 * host's kernel arguments turn a window edge no sequence can reach into -1:
 * the same keys, and it keeps the int arithmetic in range.
 */
#ifndef FLASHC_COMMON_WINDOW_H
#define FLASHC_COMMON_WINDOW_H

/* The diagonal of query row i: the key it is aligned with. */
#define FC_WINDOW_DIAG(i, sq, sk) ((i) + (sk) - (sq))

/* The first key a row with diagonal diag sees (not clamped at 0). */
#define FC_WINDOW_LO(diag, left) ((left) >= 0 ? (diag) - (left) : 0)

/* One past the last key a row with diagonal diag sees, at most sk. */
#define FC_WINDOW_HI(diag, right, sk) \
    ((right) < 0 ? (sk) : (diag) + (right) + 1 < (sk) ? (diag) + (right) + 1 : (sk))

/* 1 iff the key at d = j - diag is inside the window (j < sk not checked). */
#define FC_WINDOW_SEES(d, left, right) \
    (((left) < 0 || (d) >= -(left)) && ((right) < 0 || (d) <= (right)))

/* The first row that sees key j (right >= 0), and the last (left >= 0). */
#define FC_WINDOW_ROW_LO(j, right, sq, sk) ((j) - ((sk) - (sq)) - (right))
#define FC_WINDOW_ROW_HI(j, left, sq, sk) ((j) - ((sk) - (sq)) + (left))

/* The backward's one-key rule, for every backend, in bf16 and fp16. A row
 * that sees one key has P = 1 there when the lse is its own (the forward of
 * this call), and then dS = P (dP - Delta) = 0 exactly: a softmax over one
 * element. The formula would leave the rounding of O in Delta (with dropout,
 * V / (1 - p) rounded to the dtype) as a residue, so the backends write
 * dS = 0 for such a row when its P, recomputed from the lse, is at least
 * FC_ONE_KEY_P (1 - 2^-10; exp2's rounding stays far below). With an lse
 * merged over several calls (ring attention's key blocks) P is 1 - e below
 * 1, and the exact dS = P (1 - P) dO.(V_j - O_rest) is at most e of the
 * row's scale: the rule drops it only where e <= 2^-10, below the 16-bit
 * dtypes' own rounding (2^-8, 2^-11 relative) of O. In fp32 that would be
 * far above the rounding, and the residue the rule removes is fp32's own
 * (2^-24), so fp32 (the CPU's) has no rule: the formula on every row. A
 * learnable sink turns the rule off too (it takes mass: P < 1 always). */
#define FC_ONE_KEY_P 0.9990234375f

#endif /* FLASHC_COMMON_WINDOW_H */
