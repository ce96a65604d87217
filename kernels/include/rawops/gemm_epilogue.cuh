// The GEMM epilogue shared by the matrix kernels (kernels/gemm.cu, kernels/gemm_sm90.cu):
// what is stored at C[m][n] for a float32 accumulator, with bias, GELU and its gradient.
//
// Epilogue (flags & 3): 0 none; 1 bias + GELU, the pre-activation also stored when `pre` is
// not null; 2 bias + GELU gradient, out = aux[m][n] * gelu'(acc + bias); 3 bias only.
// flags & 4: exact-erf GELU, else the tanh approximation. bias may be null (no bias).
#pragma once

#include "rawops/dtype.cuh"

namespace rawops {

constexpr int kEpiNone = 0, kEpiBiasGelu = 1, kEpiBias = 3;  // 2: bias + GELU gradient
constexpr int kEpiErf = 4;

// Half types: tanh.approx (one MUFU op, relative error ~2^-11, under bf16/f16 rounding)
// instead of tanhf's ~20 instructions. Measured at bf16 8192x768->3072: 331 -> 327 us, so
// the epilogue is not what limits that shape (bench/NOTES.md). float32 keeps tanhf (1e-5).
template <typename T> __device__ __forceinline__ float tanh_for(float u) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  if (sizeof(T) == 2) {
    float r;
    asm("tanh.approx.f32 %0, %1;" : "=f"(r) : "f"(u));
    return r;
  }
#endif
  return tanhf(u);
}

template <typename T> __device__ __forceinline__ float gelu(float x, bool erf) {
  if (erf) return x * normcdff(x);
  const float u = 0.7978845608028654f * fmaf(0.044715f * x, x * x, x);
  return 0.5f * x * (1.f + tanh_for<T>(u));
}

template <typename T> __device__ __forceinline__ float gelu_grad(float x, bool erf) {
  if (erf) return fmaf(x * 0.3989422804014327f, expf(-0.5f * x * x), normcdff(x));
  const float u = 0.7978845608028654f * fmaf(0.044715f * x, x * x, x);
  const float t = tanh_for<T>(u);
  const float du = 0.7978845608028654f * fmaf(3.f * 0.044715f, x * x, 1.f);
  return fmaf(0.5f * x * (1.f - t * t), du, 0.5f * (1.f + t));
}

template <typename T> struct Epilogue {
  const T* bias;
  const T* aux;
  T* pre;
  int64_t n_cols;
  int flags;

  // The value stored at (m, n) for accumulator acc; stores the pre-activation on the way.
  __device__ __forceinline__ float operator()(float acc, int64_t m, int64_t n) const {
    const int mode = flags & 3;
    if (mode == kEpiNone) return acc;
    const float v = bias != nullptr ? acc + to_float(bias[n]) : acc;
    if (mode == kEpiBias) return v;
    const bool erf = flags & kEpiErf;
    if (mode == kEpiBiasGelu) {
      if (pre != nullptr) pre[m * n_cols + n] = from_float<T>(v);
      return gelu<T>(v, erf);
    }
    return to_float(aux[m * n_cols + n]) * gelu_grad<T>(v, erf);
  }
};

// Split K (gridDim.z > 1): block z sums k in [kb, ke), chunks of whole KT-wide tiles, and
// stores its raw float32 sums to partial = c + z M N (the split's slab; gemm_reduce adds the
// slabs in order). Without a split: [0, K) and partial null (the epilogue writes c).
template <int KT>
__device__ __forceinline__ void split_k_range(int64_t M, int64_t N, int64_t K, float* c, int64_t& kb, int64_t& ke,
                                              float*& partial) {
  kb = 0, ke = K, partial = nullptr;
  if (gridDim.z > 1) {
    const int64_t kc = ((K + gridDim.z - 1) / gridDim.z + KT - 1) / KT * KT;
    kb = int64_t(blockIdx.z) * kc;
    ke = kb + kc < K ? kb + kc : K;
    partial = c + int64_t(blockIdx.z) * M * N;
  }
}

}  // namespace rawops
