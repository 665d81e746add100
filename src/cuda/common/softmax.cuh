// softmax.cuh : online softmax over the score fragments one thread holds
// (FlashAttention-2, Dao 2023, Algorithm 1), kept entirely in registers.
//
// A thread holds rows g and g+8 of each of its MT 16-row mma tiles (ptx.cuh
// fragment layout); the 4 threads of a quad (same g) hold the rest of the row,
// so the row max is a 2-step shfl.xor all-reduce inside the quad. The row sum
// stays a per-thread partial until finalize() (FA2 does the same).
//
// Scores are x in the units of params.h (raw q.k, or the softcapped tanh);
// the probability of x is exp2(x * sl2 - m * sl2) with sl2 = score_scale_log2,
// one FFMA and one MUFU.EX2 per element. A row whose keys are all masked so far
// has m = -inf; it uses 0 in place of m (so exp2(-inf) = 0 and no NaN), and ends
// with l = 0: output 0 and lse = -inf, as flash_attn. A NaN score makes its row's
// sum NaN, and the row's output and lse NaN (fmaxf skips it in the max, the sum
// does not), as flash_attn and PyTorch. A learnable sink (params.h) joins the
// denominator in finalize() (fc_sink_normalise); a row that saw no key then
// gets output 0 and lse = the sink.
#ifndef FLASHC_CUDA_SOFTMAX_CUH
#define FLASHC_CUDA_SOFTMAX_CUH

#include <math.h>

#include "flashc.h"
#include "../params.h"
#include "ptx.cuh"

__device__ __forceinline__ float fc_quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float fc_quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// O rows *= alpha (rows g and g+8 of each 16-row tile: alpha[mt][0], [1]).
template <int MT, int DT>
__device__ __forceinline__ void fc_softmax_rescale(float (&o)[MT][DT][4], const float (&alpha)[MT][2]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
            o[mt][dt][0] *= alpha[mt][0];
            o[mt][dt][1] *= alpha[mt][0];
            o[mt][dt][2] *= alpha[mt][1];
            o[mt][dt][3] *= alpha[mt][1];
        }
}

// A query head's learnable sink (params.h): s in natural units, s2 = s log2(e);
// both -inf without one.
struct fc_row_sink {
    float s, s2;
};

// Query head h's sink logit (p.sink given), from fp16 or bf16 exactly.
__device__ __forceinline__ float fc_sink_value(const fc_cuda_fwd_params &p, int h) {
    const int64_t i = (int64_t)h * p.sink_s;
    switch (p.sink_dtype) {
    case FLASHC_DTYPE_FP16: return __half2float(static_cast<const __half *>(p.sink)[i]);
    case FLASHC_DTYPE_BF16: return __bfloat162float(static_cast<const __nv_bfloat16 *>(p.sink)[i]);
    default: return static_cast<const float *>(p.sink)[i];
    }
}

__device__ __forceinline__ fc_row_sink fc_sink_of(const fc_cuda_fwd_params &p, int h) {
    if (!p.sink) return {-INFINITY, -INFINITY};
    const float s = fc_sink_value(p, h);
    return {s, s * p.log2e};
}

// A row's normaliser and lse with a learnable sink (flashc.h): `sum` is the
// row's sum of 2^(x - m2) over its keys (m2 its max, x in log2 units); the
// sink joins the denominator: sum 2^m2 + 2^s2. With M = max(m2, s2), so that
// nothing overflows either way (src/cpu/fwd.c does the same in double):
//     lse2 = M + log2(sum 2^(m2 - M) + 2^(s2 - M)),   inv = rescale 2^(m2 - lse2)
// and lse = lse2 ln2. A row that saw no key (sum = 0) gets inv = 0 and
// lse = the sink bit for bit (s, not s2 ln2); a NaN sum gives NaN.
__device__ __forceinline__ void fc_sink_normalise(float sum, float m2, fc_row_sink sink,
                                                  float rescale, float ln2, float *inv,
                                                  float *lse) {
    if (sum == 0.0f) {
        *inv = 0.0f;
        *lse = sink.s;
        return;
    }
    const float top = fmaxf(m2, sink.s2);
    const float lse2 = top + log2f(sum * fc_exp2(m2 - top) + fc_exp2(sink.s2 - top));
    *inv = rescale * fc_exp2(m2 - lse2);
    *lse = lse2 * ln2;
}

template <int MT>
struct fc_softmax {
    float m[MT][2];  // running row max of x, -inf before the first visible key
    float l[MT][2];  // this thread's part of the running row sum of exp2((x - m) * sl2)

    __device__ __forceinline__ void init() {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
                m[mt][hr] = -INFINITY;
                l[mt][hr] = 0.0f;
            }
    }

    // Fold one K tile into the running max and sum: s (scores, masked ones
    // -inf) becomes P = exp2((x - m_new) * sl2), unnormalised, and alpha gets
    // exp2((m_old - m_new) * sl2), the factor the caller applies to its rows of
    // O (0 while nothing was accumulated). O is not touched here, so an sm90
    // kernel can run this while a wgmma still writes O.
    template <int NT>
    __device__ __forceinline__ void step(float (&s)[MT][NT][4], float sl2, float (&alpha)[MT][2]) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
                float mx = m[mt][hr];
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
                    mx = fmaxf(mx, fmaxf(s[mt][nt][2 * hr], s[mt][nt][2 * hr + 1]));
                mx = fc_quad_max(mx);
                const float m_use = mx == -INFINITY ? 0.0f : mx;
                const float m_scaled = m_use * sl2;
                // m_old = -inf gives alpha = 0: nothing was accumulated yet
                alpha[mt][hr] = fc_exp2(m[mt][hr] * sl2 - m_scaled);
                m[mt][hr] = mx;
                float sum = 0.0f;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const float pr = fc_exp2(fmaf(s[mt][nt][2 * hr + e], sl2, -m_scaled));
                        s[mt][nt][2 * hr + e] = pr;
                        sum += pr;
                    }
                l[mt][hr] = l[mt][hr] * alpha[mt][hr] + sum;
            }
    }

    // step(), then O *= alpha unless this is the first tile (O still 0).
    template <int NT, int DT>
    __device__ __forceinline__ void update(float (&s)[MT][NT][4], float (&o)[MT][DT][4], float sl2,
                                           bool first) {
        float alpha[MT][2];
        step(s, sl2, alpha);
        if (!first) fc_softmax_rescale(o, alpha);
    }

    // After the last tile: the factor that normalises row (mt, hr) of O (times
    // `rescale`, the dropout 1/(1-p)), and its natural-log lse (score_scale,
    // sl2: the natural and log2 units of x). sink is the row's learnable sink,
    // -inf without one (fc_sink_normalise). A row that saw no
    // key gets 0 and lse -inf (the sink with one); a NaN sum gives NaN.
    __device__ __forceinline__ void finalize(int mt, int hr, float score_scale, float sl2,
                                             float rescale, fc_row_sink sink, float ln2, float *inv,
                                             float *lse) const {
        const float sum = fc_quad_sum(l[mt][hr]);
        if (sink.s2 != -INFINITY) {
            fc_sink_normalise(sum, m[mt][hr] * sl2, sink, rescale, ln2, inv, lse);
            return;
        }
        const bool empty = sum == 0.0f;
        *inv = empty ? 0.0f : rescale / sum;
        *lse = empty ? -INFINITY : m[mt][hr] * score_scale + logf(sum);
    }
};

#endif  // FLASHC_CUDA_SOFTMAX_CUH
