// The GEMM epilogue shared by the matrix kernels (kernels/gemm.cu, gemm_small.cu, gemm_tf32.cu,
// gemm_sm90.cu): what is stored at C[m][n] for a float32 accumulator, with bias, GELU and its
// gradient; the split-K range of a block; the entry points' common parameters.
//
// Epilogue (flags & 3): kEpiNone; kEpiBiasGelu, bias + GELU, the pre-activation also stored
// when `pre` is not null; kEpiBiasGeluGrad, bias + GELU gradient, out = aux[m][n] *
// gelu'(acc + bias); kEpiBias, bias only. flags & kEpiErf: exact-erf GELU, else the tanh
// approximation. bias may be null (no bias). The codes: rawops/_constants.py GEMM_EPI_*.
#pragma once

#include "rawops/dtype.cuh"
#include "rawops/gelu.cuh"

namespace rawops {

constexpr int kEpiNone = RAWOPS_GEMM_EPI_NONE, kEpiBiasGelu = RAWOPS_GEMM_EPI_BIAS_GELU,
              kEpiBiasGeluGrad = RAWOPS_GEMM_EPI_BIAS_GELU_GRAD, kEpiBias = RAWOPS_GEMM_EPI_BIAS;
constexpr int kEpiErf = RAWOPS_GEMM_EPI_ERF;

// Half types: tanh.approx (one MUFU op, relative error ~2^-11, under bf16/f16 rounding)
// instead of tanhf's ~20 instructions. float32 keeps tanhf.
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

// The exact-erf form through rawops/gelu.cuh's fits (elementwise's and glu's: ~16 instructions in
// float32, ~9 in the half types, where normcdff takes ~50; their accuracy stated there): unrolled
// over a tile's 128 accumulators a thread, normcdff made the epilogue of an 8192 x 1024 -> 4096
// bf16 linear_gelu longer than its main loop (docs/performance.md).
template <typename T> __device__ __forceinline__ float gelu(float x, bool erf) {
  if (erf) return gelu_math::gelu_erf<T>(x);
  const float u = 0.7978845608028654f * fmaf(0.044715f * x, x * x, x);
  return 0.5f * x * (1.f + tanh_for<T>(u));
}

template <typename T> __device__ __forceinline__ float gelu_grad(float x, bool erf) {
  if (erf) return gelu_math::gelu_erf_grad<T>(x);
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

// Four adjacent float32 outputs (m, n .. n + 3) as one float4 (N % 4 == 0 keeps it whole): the
// raw sums into this split's partial slab, or through the epilogue into c.
__device__ __forceinline__ void store_outputs4(float* c, float* partial, const Epilogue<float>& epi, int64_t N,
                                               int64_t m, int64_t n, float v0, float v1, float v2, float v3) {
  if (partial != nullptr)
    *reinterpret_cast<float4*>(partial + m * N + n) = make_float4(v0, v1, v2, v3);
  else
    *reinterpret_cast<float4*>(c + m * N + n) =
        make_float4(epi(v0, m, n), epi(v1, m, n + 1), epi(v2, m, n + 2), epi(v3, m, n + 3));
}

}  // namespace rawops

// The parameters of every matrix entry point but the Hopper kernel's: (a, b, c, bias, aux, pre,
// m, n, k, flags) (rawops/gemm.py: ARGS, KINDS), and the epilogue they describe.
#define RAWOPS_GEMM_ARGS(T)                                                                              \
  const T *a, const T *b, T *c, const T *bias, const T *aux, T *pre, long long m, long long n, long long k, \
      long long flags
#define RAWOPS_EPI(T) rawops::Epilogue<T>{bias, aux, pre, n, int(flags)}
