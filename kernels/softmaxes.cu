// Softmax family: softmax and log_softmax over the last dim, forward and backward.
//
//   softmax      y = exp(x - max) / sum(exp(x - max))
//   log_softmax  y = x - max - log(sum(exp(x - max)))
//   softmax bwd      dx = y * (dy - sum(dy * y))
//   log_softmax bwd  dx = dy - exp(y) * sum(dy)
// Subtracting the row max keeps every exp in (0, 1]: no overflow whatever the magnitude;
// a row of -inf gives NaN, as torch does. exp is ex2 of x * log2(e) (one MUFU op).
// Traffic: forward reads x once and writes y once; backward reads y and dy once, writes dx
// once. Rows wider than the registers hold (streaming mode) are read twice: an online
// (max, sum) pass, then the pass that writes.
// Rows: x, y, dy and dx each have their own row stride (rows.cuh: a row-strided view, or n).
// Launch: mode, block and grid from rawops/_rows.py (see rawops/rows.cuh).
#include "rawops/rows.cuh"

namespace rawops {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
// exp(x - max), subtracting first: x == max gives exactly 1 (an fma of x * log2e against a
// rounded max * log2e left a residual, so a one-element log_softmax was ~1e-7, not 0).
// 2^v as one MUFU.EX2: exp2f adds a range check and two multiplies (subnormal results; here those
// are exps below 2^-126 of the row's largest, flushed to 0).
__device__ __forceinline__ float ex2(float v) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
  return r;
}
__device__ __forceinline__ float exp_shifted(float x, float max) { return ex2((x - max) * kLog2e); }

// T's two-lane type: a 32-bit word of the row as two values; the word of two -inf.
template <typename T> struct Pair;
template <> struct Pair<__half> {
  using type = __half2;
  static constexpr unsigned neg_inf = 0xfc00fc00u;
};
template <> struct Pair<__nv_bfloat16> {
  using type = __nv_bfloat162;
  static constexpr unsigned neg_inf = 0xff80ff80u;
};
template <typename T> __device__ __forceinline__ typename Pair<T>::type pair_of(unsigned w) {
  return *reinterpret_cast<const typename Pair<T>::type*>(&w);
}

// One row of a 16-bit type in registers (the register modes' body for half and bfloat16).
// Issue-bound on fast memory (the H200 streams 4 elements a clock an SM at its ceiling), so
// the fewest instructions an element: the max in the storage type, two a word (a max rounds
// nothing); each exp one FFMA and one ex2 (x log2e - max log2e: the product's rounding, ~1e-6
// relative at |x| ~ 10, is far under the output's 8 or 11 bits; float32 rows subtract first);
// softmax's output exp(x - max - log(sum)) as one more ex2, not an exp and a multiply.
template <typename T, bool LOG, int ITEMS>
__device__ __forceinline__ void softmax_row_half(const RowSlice<T, ITEMS>& xs, const RowCursor& c, int64_t n,
                                                 T* __restrict__ yr, RowReducer& reduce) {
  constexpr int V = Vec16<T>::size;
  using P = typename Pair<T>::type;
  P m2 = pair_of<T>(Pair<T>::neg_inf);
#pragma unroll
  for (int k = 0; k < ITEMS; ++k)
    if (RowSlice<T, ITEMS>::valid(c, k, n))
#pragma unroll
      for (int i = 0; i < 4; ++i) m2 = __hmax2(m2, pair_of<T>(word_of(xs.raw[k], i)));
  const float max_l2 = reduce(fmaxf(to_float(m2.x), to_float(m2.y)), MaxOp()) * kLog2e;
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k)
#pragma unroll
    for (int e = 0; e < V; ++e)
      if (RowSlice<T, ITEMS>::valid(c, k, n)) s += ex2(fmaf(xs.at(k, e), kLog2e, -max_l2));
  const float sum = reduce(s, SumOp());
  const float shift_l2 = max_l2 + log2f(sum), shift = shift_l2 * (1.f / kLog2e);
  store_slice<ITEMS>(yr, c, n, [&](int k, int e) {
    return LOG ? xs.at(k, e) - shift : ex2(fmaf(xs.at(k, e), kLog2e, -shift_l2));
  });
}

template <typename T, bool LOG>
__device__ __forceinline__ void softmax_fwd_stream(const T* __restrict__ x, T* __restrict__ y, int64_t rows,
                                                   int64_t n, int64_t x_stride, int64_t y_stride, bool vec,
                                                   RowReducer& reduce) {
  constexpr int V = Vec16<T>::size;
  const int64_t nvec = (n + V - 1) / V;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * x_stride;
    float m = -INFINITY, s = 0.f;  // online: s = sum of exp(x - m) over this thread's elements
    for (int64_t j = threadIdx.x; j < nvec; j += blockDim.x) {
      float v[V];
      load_row(xr, j, n, vec, -INFINITY, v);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        if (v[e] > m) {
          s = s * exp_shifted(m, v[e]) + 1.f;
          m = v[e];
        } else if (m != -INFINITY) {  // -inf - -inf would be NaN; those add 0
          s += exp_shifted(v[e], m);
        } else if (v[e] != v[e]) {
          s = v[e];  // NaN propagates, as in torch
        }
      }
    }
    const float row_max = reduce(m, MaxOp());
    const float scaled = m == -INFINITY ? s : s * exp_shifted(m, row_max);
    const float sum = reduce(scaled, SumOp());
    const float inv = 1.f / sum, log_sum = logf(sum);
    T* yr = y + row * y_stride;
    for (int64_t j = threadIdx.x; j < nvec; j += blockDim.x) {
      float v[V];
      load_row(xr, j, n, vec, 0.f, v);
#pragma unroll
      for (int e = 0; e < V; ++e) v[e] = LOG ? v[e] - row_max - log_sum : exp_shifted(v[e], row_max) * inv;
      store_row(yr, j, n, vec, v);
    }
  }
}

// ITEMS: 16-byte vectors a thread holds (kFwdVectors; the wide entries kFwdWideVectors, where the
// host's plan spreads a row over fewer threads: more loads in flight a thread, fewer to reduce over).
template <typename T, bool LOG, int ITEMS = kFwdVectors>
__device__ __forceinline__ void softmax_fwd(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t n,
                                            int64_t x_stride, int64_t y_stride, int mode, bool vec) {
  __shared__ RowReducer::Storage storage;
  const RowCursor c(mode);
  RowReducer reduce(storage, c.warp);
  if (mode == kStreamRow) {
    softmax_fwd_stream<T, LOG>(x, y, rows, n, x_stride, y_stride, vec, reduce);
    return;
  }
  constexpr int V = Vec16<T>::size;
  using Slice = RowSlice<T, ITEMS>;
  for (int64_t row = c.row; row < rows; row += c.step) {
    const T* xr = x + row * x_stride;
    Slice xs;
    xs.load(xr, c, n);
    if constexpr (sizeof(T) == 2) {
      softmax_row_half<T, LOG>(xs, c, n, y + row * y_stride, reduce);
      continue;
    }
    float m = -INFINITY;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k)
#pragma unroll
      for (int e = 0; e < V; ++e)
        if (Slice::valid(c, k, n)) m = fmaxf(m, xs.at(k, e));
    const float row_max = reduce(m, MaxOp());
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k)
#pragma unroll
      for (int e = 0; e < V; ++e)
        if (Slice::valid(c, k, n)) s += exp_shifted(xs.at(k, e), row_max);
    const float sum = reduce(s, SumOp());
    const float inv = 1.f / sum, shift = row_max + logf(sum);
    // exp again rather than held: registers buy more bandwidth than MUFU costs
    store_slice<ITEMS>(y + row * y_stride, c, n, [&](int k, int e) {
      return LOG ? xs.at(k, e) - shift : exp_shifted(xs.at(k, e), row_max) * inv;
    });
  }
}

// The row's reduction in the backward: sum(dy * y) for softmax, sum(dy) for log_softmax.
template <bool LOG>
__device__ __forceinline__ float bwd_term(float dy, float y) { return LOG ? dy : dy * y; }
template <bool LOG>
__device__ __forceinline__ float bwd_dx(float dy, float y, float total) {
  return LOG ? dy - expf(y) * total : y * (dy - total);
}

template <typename T, bool LOG>
__device__ __forceinline__ void softmax_bwd(const T* __restrict__ dy, const T* __restrict__ y, T* __restrict__ dx,
                                            int64_t rows, int64_t n, int64_t dy_stride, int64_t y_stride,
                                            int64_t dx_stride, int mode, bool vec) {
  __shared__ RowReducer::Storage storage;
  const RowCursor c(mode);
  RowReducer reduce(storage, c.warp);
  constexpr int V = Vec16<T>::size;
  if (mode == kStreamRow) {
    const int64_t nvec = (n + V - 1) / V;
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
      const T* dyr = dy + row * dy_stride;
      const T* yr = y + row * y_stride;
      float t = 0.f;
      for (int64_t j = threadIdx.x; j < nvec; j += blockDim.x) {
        float dv[V], yv[V];
        load_row(dyr, j, n, vec, 0.f, dv);
        load_row(yr, j, n, vec, 0.f, yv);
#pragma unroll
        for (int e = 0; e < V; ++e) t += bwd_term<LOG>(dv[e], yv[e]);
      }
      const float total = reduce(t, SumOp());
      T* dxr = dx + row * dx_stride;
      for (int64_t j = threadIdx.x; j < nvec; j += blockDim.x) {
        float dv[V], yv[V];
        load_row(dyr, j, n, vec, 0.f, dv);
        load_row(yr, j, n, vec, 0.f, yv);
#pragma unroll
        for (int e = 0; e < V; ++e) dv[e] = bwd_dx<LOG>(dv[e], yv[e], total);
        store_row(dxr, j, n, vec, dv);
      }
    }
    return;
  }
  constexpr int ITEMS = kBwdVectors;
  using Slice = RowSlice<T, ITEMS>;
  for (int64_t row = c.row; row < rows; row += c.step) {
    Slice ds, ys;
    ds.load(dy + row * dy_stride, c, n);  // 0 past the row's end: adds nothing
    ys.load(y + row * y_stride, c, n);
    float t = 0.f;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k)
#pragma unroll
      for (int e = 0; e < V; ++e) t += bwd_term<LOG>(ds.at(k, e), ys.at(k, e));
    const float total = reduce(t, SumOp());
    T* dxr = dx + row * dx_stride;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {  // spelled out: through store_slice nvcc moved registers differently
      const int64_t j = int64_t(k) * c.width + c.lane;
      if (j * V >= n) break;
      float o[V];
#pragma unroll
      for (int e = 0; e < V; ++e) o[e] = bwd_dx<LOG>(ds.at(k, e), ys.at(k, e), total);
      store_row(dxr, j, n, true, o);
    }
  }
}

}  // namespace
}  // namespace rawops

// The *_stride arguments: each operand's row stride in elements (rows.cuh).
// BWD_MIN_BLOCKS: the backward's blocks an SM (log_softmax's: RAWOPS_ROW_LOG_SOFTMAX_BWD_MIN_BLOCKS).
#define RAWOPS_SOFTMAX(name, LOG, T, suffix, BWD_MIN_BLOCKS)                                                   \
  extern "C" __global__ void __launch_bounds__(rawops::kMaxRowThreads, rawops::kMinRowBlocks)                  \
      name##_fwd_##suffix(const T* x, T* y, long long rows, long long n, long long x_stride, long long y_stride, \
                          long long mode, long long vec) {                                                     \
    rawops::softmax_fwd<T, LOG>(x, y, rows, n, x_stride, y_stride, int(mode), vec != 0);                      \
  }                                                                                                            \
  extern "C" __global__ void __launch_bounds__(rawops::kMaxRowThreads, rawops::kMinRowBlocks)                  \
      name##_fwd_wide_##suffix(const T* x, T* y, long long rows, long long n, long long x_stride,              \
                               long long y_stride, long long mode, long long vec) {                            \
    rawops::softmax_fwd<T, LOG, rawops::kFwdWideVectors>(x, y, rows, n, x_stride, y_stride, int(mode), vec != 0); \
  }                                                                                                            \
  extern "C" __global__ void __launch_bounds__(rawops::kMaxRowThreads, BWD_MIN_BLOCKS)                         \
      name##_bwd_##suffix(const T* dy, const T* y, T* dx, long long rows, long long n, long long dy_stride,   \
                          long long y_stride, long long dx_stride, long long mode, long long vec) {            \
    rawops::softmax_bwd<T, LOG>(dy, y, dx, rows, n, dy_stride, y_stride, dx_stride, int(mode), vec != 0);     \
  }

#define RAWOPS_SOFTMAX_FAMILY(T, suffix)                             \
  RAWOPS_SOFTMAX(softmax, false, T, suffix, rawops::kMinRowBlocks)   \
  RAWOPS_SOFTMAX(log_softmax, true, T, suffix, RAWOPS_ROW_LOG_SOFTMAX_BWD_MIN_BLOCKS)

RAWOPS_SOFTMAX_FAMILY(float, f32)
RAWOPS_SOFTMAX_FAMILY(__half, f16)
RAWOPS_SOFTMAX_FAMILY(__nv_bfloat16, bf16)
