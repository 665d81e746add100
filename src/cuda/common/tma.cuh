// tma.cuh : Hopper's asynchronous copy machinery for producer/consumer kernels
// (sm_90a): transaction barriers (mbarrier), tensor-memory-accelerator loads
// (cp.async.bulk.tensor) and the per-warpgroup register budget (setmaxnreg).
//
// The protocol of one ring slot, as FA3 runs it (Shah et al. 2024, §3.1):
//   producer  wait empty[s] (phase), arrive full[s] announcing the bytes
//             (expect_tx), issue the TMA loads that complete full[s]
//   consumer  wait full[s] (phase): the bytes have landed and are visible to
//             the async proxy (wgmma reads them directly), compute, then
//             arrive empty[s] once nothing reads the slot any more
// Phases alternate 0, 1, 0, ... per use of a slot: the k-th use (k = it / S)
// waits on parity k & 1.
//
// Not here: the host side of a TMA load (tma_map.cu builds the CUtensorMap).
#ifndef FLASHC_CUDA_TMA_CUH
#define FLASHC_CUDA_TMA_CUH

#include <stdint.h>

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "tma.cuh is sm_90a code"
#endif

// ---- transaction barriers ----
// Initialise the barrier at shared address bar for `count` arrivals per phase.
__device__ __forceinline__ void fc_mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// Make barrier initialisations visible to the async proxy (the TMA unit)
// before any thread uses them; a CTA barrier must follow.
__device__ __forceinline__ void fc_mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival that also announces `bytes` more of transactions this phase.
__device__ __forceinline__ void fc_mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}

// One plain arrival.
__device__ __forceinline__ void fc_mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// One arrival once every cp.async this thread has issued so far has landed
// (.noinc: the arrival is one of the `count` the barrier was initialised with).
__device__ __forceinline__ void fc_mbar_arrive_cp_async(uint32_t bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// Wait until the phase of parity `parity` has completed.
__device__ __forceinline__ void fc_mbar_wait(uint32_t bar, uint32_t parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "FC_MBAR_WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra FC_MBAR_WAIT_%=;\n"
        "}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}

// ---- TMA loads ----
// A 4-d box of the tensor described by *map (a CUtensorMap in the kernel's
// parameter space) at coordinates (c0 fastest .. c3) into shared address dst;
// its bytes complete the transaction count of barrier bar. Elements outside
// the tensor are filled with zeros.
__device__ __forceinline__ void fc_tma_load_4d(uint32_t dst, const void *map, uint32_t bar, int c0,
                                               int c1, int c2, int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
        "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
        : "memory");
}

// Bring the tensor map into the constant cache ahead of its first use.
__device__ __forceinline__ void fc_tma_prefetch_map(const void *map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}

// ---- register budgets of a warpgroup ----
template <int N>
__device__ __forceinline__ void fc_setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void fc_setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

#endif  // FLASHC_CUDA_TMA_CUH
