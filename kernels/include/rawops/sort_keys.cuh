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
// The key canonicalises -0.0 and NaN payloads: it is not always a value.
//   sort_value(key, desc, &v)  the inverse of sort_key where it has one: false for the keys of
//                       NaN and of zero (every payload, both signs, one key each), whose values
//                       a kernel gathers from the input by position instead; true (v set) for
//                       every other key, so a value decoded is bit for bit the input's.
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
  __device__ __forceinline__ static bool value(Bits k, float* v) {
    if (k == 0xffffffffu || k == 0x80000000u) return false;
    *v = __uint_as_float((k & 0x80000000u) ? (k ^ 0x80000000u) : ~k);
    return true;
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
  __device__ __forceinline__ static bool value(Bits k, __half* v) {
    if (k == 0xffffu || k == 0x8000u) return false;
    *v = __ushort_as_half((k & 0x8000u) ? static_cast<unsigned short>(k ^ 0x8000u) : static_cast<unsigned short>(~k));
    return true;
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
  __device__ __forceinline__ static bool value(Bits k, __nv_bfloat16* v) {
    if (k == 0xffffu || k == 0x8000u) return false;
    *v = __ushort_as_bfloat16((k & 0x8000u) ? static_cast<unsigned short>(k ^ 0x8000u)
                                            : static_cast<unsigned short>(~k));
    return true;
  }
};

template <> struct SortKey<int> {
  using Bits = unsigned;
  static constexpr int kBits = 32;
  __device__ __forceinline__ static Bits ordered(int x) { return static_cast<unsigned>(x) ^ 0x80000000u; }
  __device__ __forceinline__ static bool value(Bits k, int* v) {
    *v = static_cast<int>(k ^ 0x80000000u);
    return true;
  }
};

template <> struct SortKey<long long> {
  using Bits = unsigned long long;
  static constexpr int kBits = 64;
  __device__ __forceinline__ static Bits ordered(long long x) {
    return static_cast<unsigned long long>(x) ^ 0x8000000000000000ull;
  }
  __device__ __forceinline__ static bool value(Bits k, long long* v) {
    *v = static_cast<long long>(k ^ 0x8000000000000000ull);
    return true;
  }
};

template <typename T> __device__ __forceinline__ typename SortKey<T>::Bits ordered_key(T x) {
  return SortKey<T>::ordered(x);
}

template <typename T> __device__ __forceinline__ typename SortKey<T>::Bits sort_key(T x, bool descending) {
  const typename SortKey<T>::Bits k = SortKey<T>::ordered(x);
  return descending ? static_cast<typename SortKey<T>::Bits>(~k) : k;
}

template <typename T>
__device__ __forceinline__ bool sort_value(typename SortKey<T>::Bits key, bool descending, T* value) {
  return SortKey<T>::value(descending ? static_cast<typename SortKey<T>::Bits>(~key) : key, value);
}

}  // namespace rawops
