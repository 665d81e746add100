/* kvcache.c : the CPU decode path, flash_attn's mha_fwd_kvcache on the host.
 *
 * Three steps over the problem prepare.c normalised into fc_kvcache:
 *   1. append (with k_new): row t of k_new and v_new of batch b goes to logical
 *      key index j = cache_seqlens[b] - leftpad[b] + t of the cache, that is
 *      cache row cache_seqlens[b] + t; fc_kv_row adds the leftpad and resolves
 *      pages and cache_batch_idx. With rotary, k_new is rotated on the way at
 *      position cache_seqlens[b] + t.
 *   2. rotary: q is rotated into a contiguous [B, Sq, H, D] copy in the
 *      workspace at positions fc_rotary_q_pos (flash_attn's rule); without
 *      rotary q is read in place.
 *   3. fc_cpu_fwd over the cache, with q replaced by the copy.
 *
 * Rotary embedding (RoFormer, Su et al. 2021): for i < rotary_dim / 2 the pair
 *   interleaved (GPT-J):     (x[2i], x[2i+1])
 *   halves (GPT-NeoX):       (x[i],  x[i + rotary_dim/2])
 * becomes (x c - y s, x s + y c) with c = cos[pos][i], s = sin[pos][i],
 * computed in fp32 and rounded once to the dtype; dims >= rotary_dim are copied.
 *
 * Workspace: [rotated q, only with rotary][the forward's workspace], carved by
 * fc_ws_layout. fc_cpu_kvcache_workspace reads only shapes: api.c asks for it
 * before kc->cache_seqlens and kc->attn.seqlens_k exist (they live in api.c's
 * own region, in front of this one; see src/call.h fc_call_kv_lengths).
 *
 * Not here: validation (prepare.c did it all: capacity, pages, batch indices,
 * rotary length) and threading: decode appends a few rows per call, so the
 * append and the rotation run on the calling thread; the forward is threaded.
 */
#include <string.h>

#include "../internal.h"

/* y = x (one head vector [D] of dtype dt) rotated at position pos over its
 * first rotary_dim entries; y may be x. */
static void fc_rotate_head(const fc_kvcache *kc, flashc_dtype dt, size_t esz, const void *x, void *y,
                           int64_t pos) {
    int64_t half = kc->rotary_dim / 2;
    int64_t cos_row = pos * kc->rotary_s_row, sin_row = pos * kc->rotary_sin_s_row;
    memmove(y, x, (size_t)kc->attn.head_dim * esz);
    for (int64_t i = 0; i < half; i++) {
        float c = fc_load(kc->rotary_dtype, kc->rotary_cos, cos_row + i);
        float s = fc_load(kc->rotary_dtype, kc->rotary_sin, sin_row + i);
        int64_t i0 = kc->rotary_interleaved ? 2 * i : i;
        int64_t i1 = kc->rotary_interleaved ? 2 * i + 1 : i + half;
        float x0 = fc_load(dt, y, i0), x1 = fc_load(dt, y, i1);
        fc_store(dt, y, i0, x0 * c - x1 * s);
        fc_store(dt, y, i1, x0 * s + x1 * c);
    }
}

// ---- 1. append ----
static void fc_kv_append(const fc_kvcache *kc) {
    const fc_attn *a = &kc->attn;
    size_t esz = flashc_dtype_size(a->dtype), row_bytes = (size_t)a->head_dim * esz;
    size_t v_row_bytes = (size_t)a->head_dim_v * esz; /* v rows hold Dv */
    for (int64_t b = 0; b < a->batch; b++) {
        int64_t j0 = kc->cache_seqlens[b] - (a->k_leftpad ? a->k_leftpad[b] : 0);
        for (int64_t t = 0; t < kc->seqlen_new; t++) {
            int64_t kdst = fc_kv_row(a, &a->k, b, j0 + t), vdst = fc_kv_row(a, &a->v, b, j0 + t);
            int64_t ksrc = b * kc->k_new.s_batch + t * kc->k_new.s_seq;
            int64_t vsrc = b * kc->v_new.s_batch + t * kc->v_new.s_seq;
            for (int64_t hk = 0; hk < a->kv_heads; hk++) {
                const char *kx = (const char *)kc->k_new.ptr + (ksrc + hk * kc->k_new.s_head) * (int64_t)esz;
                const char *vx = (const char *)kc->v_new.ptr + (vsrc + hk * kc->v_new.s_head) * (int64_t)esz;
                char *ky = (char *)a->k.ptr + (kdst + hk * a->k.s_head) * (int64_t)esz;
                char *vy = (char *)a->v.ptr + (vdst + hk * a->v.s_head) * (int64_t)esz;
                if (kc->rotary_dim > 0)
                    fc_rotate_head(kc, a->dtype, esz, kx, ky, kc->cache_seqlens[b] + t);
                else
                    memmove(ky, kx, row_bytes);
                memmove(vy, vx, v_row_bytes);
            }
        }
    }
}

// ---- 2. rotary q ----
/* The forward's problem: kc->attn with q replaced by the contiguous
 * [B, Sq, H, D] copy at qbuf when rotary is on. */
static fc_attn fc_kv_fwd_problem(const fc_kvcache *kc, void *qbuf) {
    fc_attn a = kc->attn;
    if (kc->rotary_dim > 0) {
        a.q.ptr = qbuf;
        a.q.s_head = a.head_dim;
        a.q.s_seq = a.heads * a.head_dim;
        a.q.s_batch = a.max_seqlen_q * a.heads * a.head_dim;
    }
    return a;
}

/* qbuf [B, Sq, H, D] = q rotated, row i of b at position fc_rotary_q_pos(b, i). */
static void fc_kv_rotate_q(const fc_kvcache *kc, const fc_attn *rq) {
    const fc_attn *a = &kc->attn;
    size_t esz = flashc_dtype_size(a->dtype);
    for (int64_t b = 0; b < a->batch; b++)
        for (int64_t i = 0; i < a->max_seqlen_q; i++) {
            int64_t pos = fc_rotary_q_pos(kc, b, i);
            int64_t src = fc_q_row(a, &a->q, b, i), dst = fc_q_row(rq, &rq->q, b, i);
            for (int64_t h = 0; h < a->heads; h++)
                fc_rotate_head(kc, a->dtype, esz,
                               (const char *)a->q.ptr + (src + h * a->q.s_head) * (int64_t)esz,
                               (char *)rq->q.ptr + (dst + h * rq->q.s_head) * (int64_t)esz, pos);
        }
}

// ---- workspace and entry point ----
enum { FC_KV_WS_Q, FC_KV_WS_FWD, FC_KV_WS_REGIONS };

static size_t fc_kv_layout(const fc_kvcache *kc, size_t off[FC_KV_WS_REGIONS]) {
    const fc_attn *a = &kc->attn;
    size_t sizes[FC_KV_WS_REGIONS] = {0, 0};
    if (kc->rotary_dim > 0)
        sizes[FC_KV_WS_Q] = (size_t)(a->batch * a->max_seqlen_q * a->heads * a->head_dim) *
                            flashc_dtype_size(a->dtype);
    fc_attn fwd = fc_kv_fwd_problem(kc, NULL);
    sizes[FC_KV_WS_FWD] = fc_cpu_fwd_workspace(&fwd);
    return fc_ws_layout(FC_KV_WS_REGIONS, sizes, off);
}

size_t fc_cpu_kvcache_workspace(const fc_kvcache *kc) {
    size_t off[FC_KV_WS_REGIONS];
    return fc_kv_layout(kc, off);
}

flashc_status fc_cpu_kvcache(const fc_kvcache *kc, void *ws, size_t ws_bytes) {
    size_t off[FC_KV_WS_REGIONS];
    size_t need = fc_kv_layout(kc, off);
    if (ws_bytes < need || (need > 0 && !ws))
        return fc_set_error(FLASHC_ERR_INTERNAL, "kvcache: workspace_bytes=%zu but %zu are needed",
                            ws ? ws_bytes : (size_t)0, need);
    char *base = (char *)ws;
    if (kc->seqlen_new > 0) fc_kv_append(kc);
    fc_attn fwd = fc_kv_fwd_problem(kc, base ? base + off[FC_KV_WS_Q] : NULL);
    if (kc->rotary_dim > 0) fc_kv_rotate_q(kc, &fwd);
    return fc_cpu_fwd(&fwd, base ? base + off[FC_KV_WS_FWD] : NULL,
                      base ? ws_bytes - off[FC_KV_WS_FWD] : 0);
}
