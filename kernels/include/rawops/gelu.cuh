// GELU math in float32 shared by the families that apply it (elementwise's gelu / bias_gelu, glu's
// geglu): the tanh form through one ex2 and one rcp, the exact-erf form through a rational fit of
// erfc. Each function's accuracy is stated beside it.
#pragma once

namespace rawops {
namespace gelu_math {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;
constexpr float kGeluCubic = 0.044715f;

// tanh-GELU as x * sigmoid(2u): 0.5 (1 + tanh(u)) == 1 / (1 + exp(-2u)), with exp(-2u)
// folded into one ex2 of x * (A x^2 + B). Seven instructions (two MUFU) instead of tanhf's
// polynomial and __frcp_rn's slow-path call: at 8 elements per 16-byte load the half types
// are otherwise issue-bound (docs/performance.md). Saturates correctly: ex2 -> inf gives -0,
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
__device__ __forceinline__ float erfc_positive(float z) {  // z >= 0
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
  return t * expf(fmaf(-z, z, p));
}
// Phi(x) = erfc(|x| / sqrt 2) / 2 for x < 0. The half types round the result to 8 or 11 bits:
// their P is a degree-5 fit of the same function, log(erfc(z) / t) + z^2 on t in [1/6, 1] (z <= 10;
// erfc(10) is below float32's range), fractional error < 8.3e-6 (five FMAs instead of nine; least
// squares on Chebyshev nodes against mpmath; outside the fit P stays in [-1.27, -1.09]
// while -z^2 < -100, so exp underflows), with the constants folded in: erfc(z) / 2 = t exp2(log2(e)
// (P(t) - z^2) - 1), log2(e) and the -1 in P's coefficients, z^2 = x^2 / 2 taken from x, one ex2.approx.
template <typename T> __device__ __forceinline__ float normal_cdf(float x) {
  float tail;
  if (sizeof(T) == 4) {
    tail = 0.5f * erfc_positive(fabsf(x) * kInvSqrt2);
  } else {
    const float t = rcp_approx(fmaf(0.5f * kInvSqrt2, fabsf(x), 1.f));
    float p = 0.33266491f;  // the fit (0.23058574, -0.71484584, 0.48126912, 0.2506239, 1.0190123,
    // -1.2666371 from t^5 down) times log2(e), the last less 1
    p = fmaf(p, t, -1.0313046f);
    p = fmaf(p, t, 0.69432455f);
    p = fmaf(p, t, 0.36157385f);
    p = fmaf(p, t, 1.4701240f);
    p = fmaf(p, t, -2.8273711f);
    tail = t * ex2_approx(fmaf(-0.5f * kLog2e * x, x, p));
  }
  return x < 0.f ? tail : 1.f - tail;
}
template <typename T> __device__ __forceinline__ float gelu_erf(float x) { return x * normal_cdf<T>(x); }
// gelu'(x) = Phi(x) + x phi(x). The half types share one ex2 between the two terms: erfc(z) =
// t Q(t) exp(-z^2) with z = |x| / sqrt 2, so exp(-z^2) = exp(-x^2 / 2) is phi's too; Q(t) = erfcx(z)
// / t is a degree-6 fit on t in [1/6, 1] (fractional error < 1.8e-6 in float32 Horner; least squares
// on Chebyshev nodes against mpmath; in [0.28, 0.34] beyond the fit, where exp(-z^2)
// underflows). One MUFU an element fewer than an ex2 for erfc beside phi's.
template <typename T> __device__ __forceinline__ float gelu_erf_grad(float x) {
  if (sizeof(T) == 4) return fmaf(x * kInvSqrt2Pi, expf(-0.5f * x * x), normal_cdf<T>(x));
  const float gauss = ex2_approx(-0.5f * kLog2e * x * x);  // exp(-x^2 / 2)
  const float t = rcp_approx(fmaf(0.5f * kInvSqrt2, fabsf(x), 1.f));
  float q = 0.09010113f;
  q = fmaf(q, t, -0.36294097f);
  q = fmaf(q, t, 0.39720023f);
  q = fmaf(q, t, 0.03276928f);
  q = fmaf(q, t, 0.28322276f);
  q = fmaf(q, t, 0.27729785f);
  q = fmaf(q, t, 0.28234947f);
  const float tail = 0.5f * t * q * gauss;
  return fmaf(x * kInvSqrt2Pi, gauss, x < 0.f ? tail : 1.f - tail);
}

}  // namespace gelu_math
}  // namespace rawops
