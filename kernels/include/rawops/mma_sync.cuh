// One warp's mma.sync.m16n8k16 with float32 accumulation, d += a b, for float16 and
// bfloat16 operands in the PTX fragment layouts (a: 4 registers, b: 2, d: 4 floats).
// Shared by the matrix and MLP families; sm_80+ (below, it compiles to nothing and the
// planners never pick its callers).
#pragma once

#include "rawops/dtype.cuh"

namespace rawops {

template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float* d, const unsigned* a, unsigned b0, unsigned b1);

template <>
__device__ __forceinline__ void mma_m16n8k16<__half>(float* d, const unsigned* a, unsigned b0, unsigned b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

template <>
__device__ __forceinline__ void mma_m16n8k16<__nv_bfloat16>(float* d, const unsigned* a, unsigned b0, unsigned b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

}  // namespace rawops
