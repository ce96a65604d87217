// Sort keys: every key type the sort family takes, mapped to an unsigned integer whose
// unsigned order is torch's order, so radix sorts, radix selects and comparison networks
// all compare plain unsigned words.
//
//   ordered_key(x)      unsigned, ascending in torch.sort's ascending order:
//                       -inf < finite < +inf < NaN (every NaN one key, after +inf, as torch
//                       places NaN last ascending and first descending); -0.0 and +0.0 one key
//                       (they compare equal in torch, so a stable sort keeps their order).
//   sort_key(x, desc)   ordered_key, complemented when descending: ascending unsigned order of
//                       sort_key is the requested order, and equal keys stay equal, so a stable
//                       radix sort of sort_key is a stable sort in either direction.
//
// The key canonicalises -0.0 and NaN payloads: it is not a value. Sorted values are gathered
// from the input by the sorted indices, never decoded from keys.
//
// Floats: flip every bit of a negative number, only the sign bit of a positive one (the
// usual radix-sort transform, as in CUB's traits). Signed integers: flip the sign bit.
#pragma once

#include "rawops/dtype.cuh"

namespace rawops {

template <typename T> struct SortKey;

template <> struct SortKey<float> {
  using Bits = unsigned;
  static constexpr int kBits = 32;
  __device__ __forceinline__ static Bits ordered(float x) {
    if (x != x) return 0xffffffffu;   // every NaN: above +inf (0xff800000)
    if (x == 0.0f) return 0x80000000u;  // -0.0 == +0.0
    const unsigned u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  }
};

// The half types: the same transform on 16 bits, in a 16-bit key.
template <> struct SortKey<__half> {
  using Bits = unsigned short;
  static constexpr int kBits = 16;
  __device__ __forceinline__ static Bits ordered(__half h) {
    const unsigned short u = __half_as_ushort(h);
    if ((u & 0x7c00u) == 0x7c00u && (u & 0x03ffu)) return 0xffffu;  // NaN
    if ((u & 0x7fffu) == 0) return 0x8000u;                          // +-0
    return (u & 0x8000u) ? static_cast<unsigned short>(~u) : static_cast<unsigned short>(u | 0x8000u);
  }
};

template <> struct SortKey<__nv_bfloat16> {
  using Bits = unsigned short;
  static constexpr int kBits = 16;
  __device__ __forceinline__ static Bits ordered(__nv_bfloat16 h) {
    const unsigned short u = __bfloat16_as_ushort(h);
    if ((u & 0x7f80u) == 0x7f80u && (u & 0x007fu)) return 0xffffu;  // NaN
    if ((u & 0x7fffu) == 0) return 0x8000u;                          // +-0
    return (u & 0x8000u) ? static_cast<unsigned short>(~u) : static_cast<unsigned short>(u | 0x8000u);
  }
};

template <> struct SortKey<int> {
  using Bits = unsigned;
  static constexpr int kBits = 32;
  __device__ __forceinline__ static Bits ordered(int x) { return static_cast<unsigned>(x) ^ 0x80000000u; }
};

template <> struct SortKey<long long> {
  using Bits = unsigned long long;
  static constexpr int kBits = 64;
  __device__ __forceinline__ static Bits ordered(long long x) {
    return static_cast<unsigned long long>(x) ^ 0x8000000000000000ull;
  }
};

template <typename T> __device__ __forceinline__ typename SortKey<T>::Bits ordered_key(T x) {
  return SortKey<T>::ordered(x);
}

template <typename T> __device__ __forceinline__ typename SortKey<T>::Bits sort_key(T x, bool descending) {
  const typename SortKey<T>::Bits k = SortKey<T>::ordered(x);
  return descending ? static_cast<typename SortKey<T>::Bits>(~k) : k;
}

}  // namespace rawops
