// One warp's mma.sync with float32 accumulation, d += a b, in the PTX fragment layouts:
// m16n8k16 for float16 and bfloat16 operands (a: 4 registers, b: 2, d: 4 floats), m16n8k8 for
// tf32 (float32 bits rounded by to_tf32; the same register counts), and the 3xTF32 split that
// gives float32-level products on the TF32 pipe. Shared by the matrix and MLP families; sm_80+
// (below, it compiles to nothing and the planners never pick its callers).
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

// float32 bits -> tf32 (round to nearest, ties away from zero), still in a 32-bit register.
__device__ __forceinline__ unsigned to_tf32(unsigned x) {
  unsigned r = x;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(__uint_as_float(x)));
#endif
  return r;
}

__device__ __forceinline__ void mma_m16n8k8_tf32(float* d, const unsigned* a, unsigned b0, unsigned b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// 3xTF32: v = big + small with big = tf32(v) and small = tf32(v - big) (exact in float32, at
// most 2^-11 |v|), so a b ~ big_a big_b + big_a small_b + small_a big_b, each product exact on
// the tensor pipe, the dropped small_a small_b below 2^-22 |a b|: float32-level accuracy at three
// TF32 mma per product (CUTLASS's "3xTF32").
struct Tf32Split {
  unsigned big, small;
};

__device__ __forceinline__ Tf32Split split_tf32(float v) {
  const unsigned big = to_tf32(__float_as_uint(v));
  return {big, to_tf32(__float_as_uint(v - __uint_as_float(big)))};
}

// The same split in 3 instructions instead of 8 (cvt.rna.tf32 is emulated on sm_90: 4 each),
// for values that go straight into mma.sync: the tensor core reads a tf32 operand's top 19 bits
// and ignores the low 13 (CUTLASS's fast 3xTF32 relies on it too). big = the bits plus half a
// tf32 ulp, masked (cvt.rna's result for finite v); small = v - big, exact in float32, is left
// for the tensor core to truncate: off by < 2^-10 of itself, 2^-21 |v| (split_tf32: 2^-22).
// NaN stays NaN in small; inf gives big = inf, small = NaN, as split_tf32 does.
__device__ __forceinline__ Tf32Split split_tf32_fast(float v) {
  const unsigned big = (__float_as_uint(v) + 0x1000u) & 0xffffe000u;
  return {big, __float_as_uint(v - __uint_as_float(big))};
}

// d += a b in 3xTF32, the small cross terms first (they are the smaller addends).
__device__ __forceinline__ void mma_m16n8k8_tf32x3(float* d, const unsigned* a_big, const unsigned* a_small,
                                                   unsigned b0_big, unsigned b1_big, unsigned b0_small,
                                                   unsigned b1_small) {
  mma_m16n8k8_tf32(d, a_small, b0_big, b1_big);
  mma_m16n8k8_tf32(d, a_big, b0_small, b1_small);
  mma_m16n8k8_tf32(d, a_big, b0_big, b1_big);
}

// d += a b in 3xTF32 with the slice's sum promoted: the three products summed by the tensor core
// from zero (C = RZ), then added to d by FADD. Accumulated into d itself, the tensor core's
// truncating adds run over all of K, several times float32's error growing with K (the float32
// GEMMs' probe, docs/performance.md); promoted, they run over one k8 slice and d's sum rounds to
// nearest, float32's own accuracy.
__device__ __forceinline__ void mma_m16n8k8_tf32x3_promoted(float* d, const unsigned* a_big, const unsigned* a_small,
                                                            unsigned b0_big, unsigned b1_big, unsigned b0_small,
                                                            unsigned b1_small) {
  float p[4];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%10,%10,%10,%10};\n"
               : "=f"(p[0]), "=f"(p[1]), "=f"(p[2]), "=f"(p[3])
               : "r"(a_small[0]), "r"(a_small[1]), "r"(a_small[2]), "r"(a_small[3]), "r"(b0_big), "r"(b1_big),
                 "f"(0.f));
#else
  p[0] = p[1] = p[2] = p[3] = 0.f;
#endif
  mma_m16n8k8_tf32(p, a_big, b0_small, b1_small);
  mma_m16n8k8_tf32(p, a_big, b0_big, b1_big);
#pragma unroll
  for (int i = 0; i < 4; ++i) d[i] += p[i];
}

}  // namespace rawops
