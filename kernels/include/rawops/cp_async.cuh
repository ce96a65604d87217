// Shared-memory staging for the tensor-core GEMMs (sm_80+; below, these compile to nothing
// and the planners never pick their callers): 16-byte cp.async with zero fill, its group
// commit / wait, ldmatrix.x4 (optionally transposing 16-bit elements), and one operand tile
// of a pipeline stage loaded through them.
#pragma once

#include "rawops/dtype.cuh"  // int64_t, as every kernel file has it

namespace rawops {

__device__ __forceinline__ unsigned smem_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)), "l"(src),
               "r"(valid ? 16 : 0));
#endif
}
// 4, 8 or 16 bytes, no zero fill (operands whose every copy is in bounds); 16 bytes bypass
// L1 (.cg), 4 and 8 can only go through it (.ca).
template <int kBytes> __device__ __forceinline__ void cp_async_bytes(void* dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "4-, 8- or 16-byte copies");
  if constexpr (kBytes == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_address(dst)), "l"(src));
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(smem_address(dst)), "l"(src), "n"(kBytes));
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N> __device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

template <bool TRANS> __device__ __forceinline__ void ldmatrix_x4(unsigned* r, const void* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if (TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_address(p)));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_address(p)));
#endif
}

// One operand tile (ROWS rows of M or N, KT of K) of stage memory from global, 16 B per
// cp.async, THREADS threads. KM: element (r, k) at g[r * K + k], stored [r][k]; else at
// g[k * R + r], stored [k][r]; STRIDE elements between stored rows. Columns k0 .. k0 + KT - 1
// of K, those at or past kend (and rows past R) zero-filled.
template <typename T, bool KM, int ROWS, int KT, int STRIDE, int THREADS>
__device__ __forceinline__ void stage_tile(T* s, const T* __restrict__ g, int64_t r0, int64_t k0, int64_t R,
                                           int64_t K, int64_t kend, int t) {
  constexpr int kVec = 16 / sizeof(T);  // elements per cp.async
#pragma unroll
  for (int i = 0; i < ROWS * KT / kVec / THREADS; ++i) {
    const int c = t + i * THREADS;
    if (KM) {
      const int r = c / (KT / kVec), k = (c % (KT / kVec)) * kVec;
      const bool valid = r0 + r < R && k0 + k < kend;
      cp_async16(s + r * STRIDE + k, valid ? g + (r0 + r) * K + k0 + k : g, valid);
    } else {
      const int k = c / (ROWS / kVec), r = (c % (ROWS / kVec)) * kVec;
      const bool valid = k0 + k < kend && r0 + r < R;
      cp_async16(s + k * STRIDE + r, valid ? g + (k0 + k) * R + r0 + r : g, valid);
    }
  }
}

}  // namespace rawops
