// The bulk copy engine (sm_90: cp.async.bulk, global -> shared, completing on an mbarrier): a row
// kernel's next rows land in shared memory while it computes the current one, with no registers
// and no load instructions of its threads (docs/performance.md, the norm backward on the H200).
// Compiled for sm_90 and later (before it the helpers are absent and callers keep their register
// loads); rawops/norm.py asks for the bulk path on sm_90 only, where it was measured (sm_120 compiles
// cp.async.bulk to a call into the toolkit).
#pragma once

namespace rawops {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define RAWOPS_HAS_BULK 1

__device__ __forceinline__ unsigned smem_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// One thread: an mbarrier expecting one arrival (the thread that posts each phase's bytes).
__device__ __forceinline__ void bulk_barrier_init(unsigned long long* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_address(bar)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// The arrival of this phase, and the bytes its copies will complete.
__device__ __forceinline__ void bulk_expect(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
}

// bytes (a multiple of 16; both addresses 16-byte aligned) from global src to shared dst.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_address(dst)),
               "l"(src), "r"(bytes), "r"(smem_address(bar))
               : "memory");
}

// Every thread: until the phase of parity `parity` has completed (its bytes have landed).
__device__ __forceinline__ void bulk_wait(unsigned long long* bar, unsigned parity) {
  unsigned done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_address(bar)), "r"(parity)
        : "memory");
  } while (!done);
}
#endif

}  // namespace rawops
