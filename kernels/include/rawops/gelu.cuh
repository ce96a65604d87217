// GELU math in float32 shared by the elementwise kernels and linear_small_tf32's epilogue
// (kernels/matmul.cu): tanh-GELU in sigmoid form, exact-erf GELU through an erfc fit, and
// their derivatives, each a few instructions in SASS.
#pragma once

namespace rawops {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;
constexpr float kGeluCubic = 0.044715f;

// tanh-GELU as x * sigmoid(2u): 0.5 (1 + tanh(u)) == 1 / (1 + exp(-2u)), with exp(-2u)
// folded into one ex2 of x * (A x^2 + B). Seven instructions (two MUFU) instead of tanhf's
// polynomial and __frcp_rn's slow-path call: at 8 elements per 16-byte load the half types
// are otherwise issue-bound (see bench/NOTES.md). Saturates correctly: ex2 -> inf gives -0,
// ex2 -> 0 gives x. Approximate ex2/rcp: relative error ~1e-7, far under float32 rounding
// of the comparisons we are held to.
__device__ __forceinline__ float ex2_approx(float v) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
  return r;
}
__device__ __forceinline__ float rcp_approx(float v) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
  return r;
}
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kExpB = -2.f * kLog2e * kSqrt2OverPi;  // exp(-2u) = 2^(x (A x^2 + B))
constexpr float kExpA = kExpB * kGeluCubic;
__device__ __forceinline__ float sigmoid_2u(float x) {
  return rcp_approx(1.f + ex2_approx(x * fmaf(kExpA, x * x, kExpB)));
}
__device__ __forceinline__ float gelu_tanh(float x) { return x * sigmoid_2u(x); }
// d/dx [x s(x)] with s = sigmoid(2u): s + x * 2 s (1 - s) * du/dx.
__device__ __forceinline__ float gelu_tanh_grad(float x) {
  const float s = sigmoid_2u(x);
  const float du = kSqrt2OverPi * fmaf(3.f * kGeluCubic, x * x, 1.f);
  return fmaf(2.f * x * s * (1.f - s), du, s);
}
// Exact-erf GELU as x * Phi(x), Phi(x) = erfc(-x / sqrt 2) / 2, with erfc from the Chebyshev
// fit of Numerical Recipes (erfcc: fractional error < 1.2e-7 everywhere). Relative accuracy
// holds in the negative tail, where 1 + erff(x) cancels (a single-element test caught that
// with Abramowitz & Stegun 7.1.26), and it costs ~16 instructions, a third of normcdff's.
template <typename T> __device__ __forceinline__ float erfc_positive(float z) {  // z >= 0
  const float t = rcp_approx(fmaf(0.5f, z, 1.f));
  float p = 0.17087277f;
  p = fmaf(p, t, -0.82215223f);
  p = fmaf(p, t, 1.48851587f);
  p = fmaf(p, t, -1.13520398f);
  p = fmaf(p, t, 0.27886807f);
  p = fmaf(p, t, -0.18628806f);
  p = fmaf(p, t, 0.09678418f);
  p = fmaf(p, t, 0.37409196f);
  p = fmaf(p, t, 1.00002368f);
  p = fmaf(p, t, -1.26551223f);
  // Half types: one ex2.approx (relative error ~1e-6 here) instead of expf's range reduction.
  const float e = sizeof(T) == 4 ? expf(fmaf(-z, z, p)) : ex2_approx(kLog2e * fmaf(-z, z, p));
  return t * e;
}
template <typename T> __device__ __forceinline__ float normal_cdf(float x) {
  const float tail = 0.5f * erfc_positive<T>(fabsf(x) * kInvSqrt2);
  return x < 0.f ? tail : 1.f - tail;
}
template <typename T> __device__ __forceinline__ float gelu_erf(float x) { return x * normal_cdf<T>(x); }
template <typename T> __device__ __forceinline__ float gelu_erf_grad(float x) {
  const float gauss = sizeof(T) == 4 ? expf(-0.5f * x * x) : ex2_approx(-0.5f * kLog2e * x * x);
  return fmaf(x * kInvSqrt2Pi, gauss, normal_cdf<T>(x));
}

}  // namespace rawops
