// Scalar types, float conversion and 16-byte vector access shared by every kernel family.
//
// Kernels do their math in float32 whatever the storage type; these helpers are the only
// place that knows how float16 and bfloat16 convert, so every family rounds the same way.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace rawops {

// Not <stdint.h>: NVRTC, the fallback compiler, does not ship it.
using int64_t = long long;

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Two floats rounded to T at once, into out[0] and out[1]: the half types' packed conversion
// (F2FP.*.PACK_AB). Rounding one value at a time where the rounded value is read back as a float
// too, nvcc emitted a scalar F2F.BF16.F32 per bfloat16 element (a conversion-pipe op beside the
// GELU's MUFU ones) and a PRMT to pack each pair.
template <typename T> __device__ __forceinline__ void from_float2(float a, float b, T* out) {
  out[0] = from_float<T>(a);
  out[1] = from_float<T>(b);
}
template <> __device__ __forceinline__ void from_float2<__half>(float a, float b, __half* out) {
  *reinterpret_cast<__half2*>(out) = __floats2half2_rn(a, b);
}
template <> __device__ __forceinline__ void from_float2<__nv_bfloat16>(float a, float b, __nv_bfloat16* out) {
  *reinterpret_cast<__nv_bfloat162*>(out) = __floats2bfloat162_rn(a, b);
}

// Sixteen bytes of T: one LDG.128 / STG.128 per thread.
template <typename T> struct alignas(16) Vec16 {
  static constexpr int size = 16 / sizeof(T);
  T v[size];
};

// Elements e and e + 1 of a vector as floats. bfloat16 takes its pair from one 32-bit word, a
// shift and a mask; one at a time nvcc extracts each 16-bit half and then shifts it.
template <typename T> __device__ __forceinline__ float2 to_float2(const Vec16<T>& v, int e) {
  return make_float2(to_float(v.v[e]), to_float(v.v[e + 1]));
}
template <> __device__ __forceinline__ float2 to_float2<__nv_bfloat16>(const Vec16<__nv_bfloat16>& v, int e) {
  const unsigned w = reinterpret_cast<const unsigned*>(v.v)[e / 2];
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}

template <typename T> __device__ __forceinline__ Vec16<T> load16(const T* p) {
  // Read-only path. In place (out == input) is still safe: each element is read, then
  // written, by the same thread, and no line is read again after its write. (Cache hints
  // and plain loads measured no better: docs/performance.md.)
  const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
  Vec16<T> out;
  *reinterpret_cast<uint4*>(&out) = raw;
  return out;
}

template <typename T> __device__ __forceinline__ void store16(T* p, const Vec16<T>& v) {
  *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(&v);
}

// store16 that streams past L2 (st.global.cs: evict first), for rows written once and never read
// again by the kernel while the rows it reads should stay in L2 (moe_permute).
template <typename T> __device__ __forceinline__ void store16_streaming(T* p, const Vec16<T>& v) {
  __stcs(reinterpret_cast<uint4*>(p), *reinterpret_cast<const uint4*>(&v));
}

// store16 with its width pinned: one STG.E.128. In bias_bwd_tile nvcc split store16 into four
// 32-bit STG.E (4x the store instructions, each writing a quarter of every sector). Only there:
// as asm volatile it also reorders a kernel's schedule, and every other store16 already gets
// the 128-bit store.
template <typename T> __device__ __forceinline__ void store16_pinned(T* p, const Vec16<T>& v) {
  const unsigned* w = reinterpret_cast<const unsigned*>(v.v);
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3])
               : "memory");
}

}  // namespace rawops
