// ptx.cuh : the PTX instructions of the sm80 kernels, one thin wrapper each.
//
//   cp.async.cg 16 B (with zero fill)  global -> shared, bypassing L1
//   cp.async.commit_group / wait_group
//   ldmatrix.x4 (and .trans)            shared -> the mma fragment registers
//   mma.sync.m16n8k16 bf16 / f16 -> f32 tensor-core multiply-accumulate
//   ex2.approx, rcp.approx, shared and global vector moves
//   4-byte cp.async, ld.shared.f32, ld.acquire.gpu (the backward's per-row
//   scratch and its deterministic turn counters)
//   griddepcontrol (programmatic dependent launch, sm_90 and later; nothing
//   on earlier architectures)
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"), with
// g = lane / 4 and t = lane % 4:
//   A 16x16 (row):  a[0] = (g, 2t..2t+1)  a[1] = (g+8, 2t..)  a[2] = (g, 2t+8..)  a[3] = (g+8, 2t+8..)
//   B 16x8  (col):  b[0] = (k 2t..2t+1, n g)   b[1] = (k 2t+8.., n g)
//   C 16x8  (f32):  c[0..1] = (g, 2t..2t+1)    c[2..3] = (g+8, 2t..2t+1)
// so the C fragments of two adjacent 8-column tiles are, after a conversion to
// 16 bits, exactly the A fragment of one k16 slice (P stays in registers).
#ifndef FLASHC_CUDA_PTX_CUH
#define FLASHC_CUDA_PTX_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

// ---- shared memory addresses ----
__device__ __forceinline__ uint32_t fc_smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

// ---- cp.async ----
// Copy 16 bytes global -> shared; when !pred nothing is read and the 16 bytes
// are zero-filled (src must still be a valid address: pass any in-bounds one).
__device__ __forceinline__ void fc_cp_async_16(uint32_t dst, const void *src, bool pred) {
    const int bytes = pred ? 16 : 0;
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(bytes));
}

// Copy 4 bytes global -> shared (both 4-byte aligned), through L1.
__device__ __forceinline__ void fc_cp_async_4(uint32_t dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
}

__device__ __forceinline__ void fc_cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}

// Wait until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void fc_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---- ldmatrix ----
// Four 8x8 b16 matrices; lanes 8m..8m+7 give the row addresses of matrix m,
// and r[m] receives the lane's (row g, cols 2t..2t+1) pair of matrix m.
__device__ __forceinline__ void fc_ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// As fc_ldmatrix_x4, each matrix transposed: r[m] = (rows 2t..2t+1, col g).
__device__ __forceinline__ void fc_ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// ---- mma.sync m16n8k16, fp32 accumulate ----
template <typename T>
__device__ __forceinline__ void fc_mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1);

template <>
__device__ __forceinline__ void fc_mma_16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                                            uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void fc_mma_16816<__half>(float (&d)[4], const uint32_t (&a)[4],
                                                     uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- conversions ----
// Two floats to a packed pair of T, lo in the low 16 bits (round to nearest even).
template <typename T>
__device__ __forceinline__ uint32_t fc_pack2(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t fc_pack2<__nv_bfloat16>(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

template <>
__device__ __forceinline__ uint32_t fc_pack2<__half>(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

// Two packed 16-bit values as floats.
template <typename T>
__device__ __forceinline__ float2 fc_unpack2(uint32_t v);
template <>
__device__ __forceinline__ float2 fc_unpack2<__nv_bfloat16>(uint32_t v) {
    return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&v));
}
template <>
__device__ __forceinline__ float2 fc_unpack2<__half>(uint32_t v) {
    return __half22float2(*reinterpret_cast<__half2 *>(&v));
}

// ---- special functions ----
// max(a, b) that is NaN when either is (PTX max.NaN, sm_80+; fmaxf returns the other).
__device__ __forceinline__ float fc_fmax_nan(float a, float b) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}

// 2^x, max relative error 2^-22; 2^-inf = +0 (the masked-score path relies on it).
__device__ __forceinline__ float fc_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float fc_rcp(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// ---- shared / global vector moves ----
__device__ __forceinline__ void fc_st_shared_b32(uint32_t addr, uint32_t v) {
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

// 16 zero bytes at addr (16-byte aligned).
__device__ __forceinline__ void fc_st_shared_zero16(uint32_t addr) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0u) : "memory");
}

__device__ __forceinline__ float fc_ld_shared_f32(uint32_t addr) {
    float v;
    asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr));
    return v;
}

__device__ __forceinline__ float2 fc_ld_shared_v2f(uint32_t addr) {
    float2 v;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr));
    return v;
}

__device__ __forceinline__ void fc_st_shared_v2f(uint32_t addr, float x, float y) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
}

__device__ __forceinline__ uint4 fc_ld_shared_v4(uint32_t addr) {
    uint4 v;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(addr)
                 : "memory");
    return v;
}

// 16-byte global store (ptr 16-byte aligned).
__device__ __forceinline__ void fc_st_global_v4(void *ptr, uint4 v) {
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(ptr), "r"(v.x), "r"(v.y),
                 "r"(v.z), "r"(v.w)
                 : "memory");
}

// A 4-byte load with acquire semantics at GPU scope (a turn counter another
// CTA releases).
__device__ __forceinline__ int fc_ld_acquire(const int32_t *p) {
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// ---- programmatic dependent launch ----
// A kernel launched after this one on the same stream with the
// programmatic-serialization attribute (fc_launch with pdl) may start
// once every CTA of this one has called fc_pdl_launch_dependents (or exited);
// it calls fc_pdl_wait before it reads what this one writes: the wait returns
// when this grid has completed and its writes are visible. Below sm_90 the
// launch is an ordinary one and both are no-ops.
__device__ __forceinline__ void fc_pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void fc_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Launch kernel<<<grid, block, smem, stream>>>(p); pdl: with the
// programmatic-serialization attribute (the kernel must call fc_pdl_wait
// before it reads what the kernel before it on the stream writes). Host code.
template <typename Params>
static inline cudaError_t fc_launch(void (*kernel)(Params), dim3 grid, dim3 block, size_t smem,
                                    cudaStream_t stream, bool pdl, const Params &p) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, p);
}

#endif  // FLASHC_CUDA_PTX_CUH
