// sm_90 thread-block clusters: a CTA's rank in its cluster, the cluster-wide barrier and
// 16-byte reads of a peer CTA's shared memory (distributed shared memory). Below sm_90 these
// compile to nothing and the planners never pick their callers.
#pragma once

#include "rawops/cp_async.cuh"  // smem_address

namespace rawops {

__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
#endif
  return r;
}

// Every thread of every CTA of the cluster; orders shared-memory writes before and reads after.
__device__ __forceinline__ void cluster_barrier() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}

// The address of shared-memory location `p` in the cluster's CTA `rank`.
__device__ __forceinline__ unsigned peer_address(const void* p, unsigned rank) {
  unsigned remote = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_address(p)), "r"(rank));
#endif
  return remote;
}

// 16 bytes of a peer's shared memory. No "memory" clobber: the loads of one reduction issue
// back to back (cluster_barrier orders them against the writes).
__device__ __forceinline__ float4 load_peer_float4(unsigned remote) {
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(remote));
#endif
  return v;
}

}  // namespace rawops
