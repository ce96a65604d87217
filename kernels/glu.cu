// GLU family: swiglu and geglu (tanh / exact erf), forward and backward, on a gate and an up
// operand given apart or packed in one (T, 2F) tensor (gate = its first F columns, up = its last F).
//
//   forward   out    = act(gate) * up                  act: silu | gelu_tanh | gelu_erf
//   backward  d_gate = dy * up * act'(gate)
//             d_up   = dy * act(gate)                  act recomputed from gate: nothing is saved
//                                                      but the inputs
// Every operand is a (rows x cols) matrix with its own row stride in elements; the packed layout is
// gate = x, up = x + F at x's row stride (2F when dense), and its gradient dx the same way:
//   <op>_fwd_<dtype>(const T* gate, const T* up, T* out, int64 rows, int64 cols,
//                    int64 gate_stride, int64 up_stride, int64 out_stride, int64 vec)
//   <op>_bwd_<dtype>(const T* dy, const T* gate, const T* up, T* dgate, T* dup, int64 rows,
//                    int64 cols, int64 dy_stride, int64 gate_stride, int64 up_stride,
//                    int64 dgate_stride, int64 dup_stride, int64 vec)
//   The backward may run in place, dgate == gate and dup == up (the torch adapter's SwiGLUMLP):
//   each element is read, then written, by one thread, and no two threads touch one element, so
//   the __restrict__ promise holds between the elements the compiler may reorder.
// Traffic: the forward reads two elements and writes one per output element, the backward reads
// three and writes two: the bytes the op must move, each once.
// Launch (rawops/glu.py, launch_plan): vec = 1 when every pointer is 16-byte aligned, every row
// stride a whole number of 16-byte vectors and a row at least one vector: the rows' whole vectors,
// rows * (cols / V) of them, one 16-byte vector of each operand a thread per unroll step,
// RAWOPS_MAP_UNROLL x blockDim consecutive vectors a block and one block per chunk, the elementwise
// map kernels' shape (many short blocks: the hardware balances them; a persistent grid leaves a
// partial last wave). A row's last cols % V columns go element by element (a dense call is one row,
// so at most V - 1 elements in all). vec = 0: element by element, a grid-stride loop over a grid
// bounded by the SM count.
// In place: out (dgate, dup) may be exactly an input (the same pointer and stride): each element is
// read, then written, by one thread, all its loads issued before its stores.
// Math in float32 with one rounding to T; 64-bit indices (32-bit divisions where they fit).
#include "rawops/dtype.cuh"
#include "rawops/gelu.cuh"

namespace rawops {
namespace {

using namespace gelu_math;

constexpr int kUnroll = RAWOPS_MAP_UNROLL;

// The activations: act(g) and, for the backward, act(g) and act'(g) together (sharing their
// exponential). silu(g) = g s, s = sigmoid(g) = 1 / (1 + 2^(-g log2 e)); silu'(g) = s (1 + g (1 - s)).
// Saturates as torch does: g -> -inf gives s = 0 (silu -0, silu' 0), g -> +inf s = 1.
struct Silu {
  template <typename T> __device__ __forceinline__ static float act(float g) {
    return g * rcp_approx(1.f + ex2_approx(-kLog2e * g));
  }
  template <typename T> __device__ __forceinline__ static void act_grad(float g, float& a, float& da) {
    const float s = rcp_approx(1.f + ex2_approx(-kLog2e * g));
    a = g * s;
    da = fmaf(a, 1.f - s, s);
  }
};
// gelu_tanh(g) = g s, s = sigmoid(2u) (rawops/gelu.cuh); its derivative shares s.
struct GeluTanh {
  template <typename T> __device__ __forceinline__ static float act(float g) { return gelu_tanh(g); }
  template <typename T> __device__ __forceinline__ static void act_grad(float g, float& a, float& da) {
    const float s = sigmoid_2u(g);
    const float du = kSqrt2OverPi * fmaf(3.f * kGeluCubic, g * g, 1.f);
    a = g * s;
    da = fmaf(2.f * g * s * (1.f - s), du, s);
  }
};
// The exact-erf GELU and its derivative (rawops/gelu.cuh: float32 and the half types' fits).
struct GeluErf {
  template <typename T> __device__ __forceinline__ static float act(float g) { return gelu_erf<T>(g); }
  template <typename T> __device__ __forceinline__ static void act_grad(float g, float& a, float& da) {
    a = gelu_erf<T>(g);
    da = gelu_erf_grad<T>(g);
  }
};

// Row and column of flat index i in a matrix `per` wide: 32-bit division where both fit.
__device__ __forceinline__ void split(int64_t i, int64_t per, int64_t& row, int64_t& col) {
  if (((i | per) >> 32) == 0) {
    const unsigned q = unsigned(i) / unsigned(per);
    row = q;
    col = int64_t(unsigned(i) - q * unsigned(per));
  } else {
    row = i / per;
    col = i - row * per;
  }
}

template <class Op, typename T>
__device__ __forceinline__ void fwd_element(const T* gate, const T* up, T* out, int64_t row, int64_t col,
                                            int64_t gs, int64_t us, int64_t os) {
  const float g = to_float(gate[row * gs + col]), u = to_float(up[row * us + col]);
  out[row * os + col] = from_float<T>(Op::template act<T>(g) * u);
}

template <class Op, typename T>
__device__ __forceinline__ void bwd_element(const T* dy, const T* gate, const T* up, T* dgate, T* dup, int64_t row,
                                            int64_t col, int64_t ds, int64_t gs, int64_t us, int64_t dgs,
                                            int64_t dus) {
  const float d = to_float(dy[row * ds + col]), g = to_float(gate[row * gs + col]), u = to_float(up[row * us + col]);
  float a, da;
  Op::template act_grad<T>(g, a, da);
  dgate[row * dgs + col] = from_float<T>(d * u * da);
  dup[row * dus + col] = from_float<T>(d * a);
}

template <class Op, typename T>
__device__ __forceinline__ void glu_fwd(const T* __restrict__ gate, const T* __restrict__ up, T* __restrict__ out,
                                        int64_t rows, int64_t cols, int64_t gs, int64_t us, int64_t os, bool vec) {
  constexpr int V = Vec16<T>::size;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nthreads = int64_t(gridDim.x) * blockDim.x;
  if (!vec) {
    for (int64_t i = tid; i < rows * cols; i += nthreads) {
      int64_t row, col;
      split(i, cols, row, col);
      fwd_element<Op>(gate, up, out, row, col, gs, us, os);
    }
    return;
  }
  const int64_t per_row = cols / V, nvec = rows * per_row, tail = cols - per_row * V;
  const int64_t chunk_size = int64_t(blockDim.x) * kUnroll;
  for (int64_t first = int64_t(blockIdx.x) * chunk_size + threadIdx.x; first - threadIdx.x < nvec;
       first += int64_t(gridDim.x) * chunk_size) {
    Vec16<T> g[kUnroll], u[kUnroll];
    int64_t row[kUnroll], col[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {  // every load in flight before any math
      const int64_t j = first + int64_t(k) * blockDim.x;
      if (j < nvec) {
        split(j, per_row, row[k], col[k]);
        col[k] *= V;
        g[k] = load16(gate + row[k] * gs + col[k]);
        u[k] = load16(up + row[k] * us + col[k]);
      }
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      if (first + int64_t(k) * blockDim.x < nvec) {
        Vec16<T> o;
#pragma unroll
        for (int e = 0; e < V; e += 2) {  // pairs: bfloat16 converts two from a 32-bit word (to_float2)
          const float2 gv = to_float2(g[k], e), uv = to_float2(u[k], e);
          from_float2<T>(Op::template act<T>(gv.x) * uv.x, Op::template act<T>(gv.y) * uv.y, o.v + e);
        }
        store16(out + row[k] * os + col[k], o);
      }
    }
  }
  if (tail) {
    for (int64_t i = tid; i < rows * tail; i += nthreads) {
      int64_t row, col;
      split(i, tail, row, col);
      fwd_element<Op>(gate, up, out, row, per_row * V + col, gs, us, os);
    }
  }
}

template <class Op, typename T>
__device__ __forceinline__ void glu_bwd(const T* __restrict__ dy, const T* __restrict__ gate,
                                        const T* __restrict__ up, T* __restrict__ dgate, T* __restrict__ dup,
                                        int64_t rows, int64_t cols, int64_t ds, int64_t gs, int64_t us, int64_t dgs,
                                        int64_t dus, bool vec) {
  constexpr int V = Vec16<T>::size;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nthreads = int64_t(gridDim.x) * blockDim.x;
  if (!vec) {
    for (int64_t i = tid; i < rows * cols; i += nthreads) {
      int64_t row, col;
      split(i, cols, row, col);
      bwd_element<Op>(dy, gate, up, dgate, dup, row, col, ds, gs, us, dgs, dus);
    }
    return;
  }
  const int64_t per_row = cols / V, nvec = rows * per_row, tail = cols - per_row * V;
  const int64_t chunk_size = int64_t(blockDim.x) * kUnroll;
  for (int64_t first = int64_t(blockIdx.x) * chunk_size + threadIdx.x; first - threadIdx.x < nvec;
       first += int64_t(gridDim.x) * chunk_size) {
    Vec16<T> d[kUnroll], g[kUnroll], u[kUnroll];
    int64_t row[kUnroll], col[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int64_t j = first + int64_t(k) * blockDim.x;
      if (j < nvec) {
        split(j, per_row, row[k], col[k]);
        col[k] *= V;
        d[k] = load16(dy + row[k] * ds + col[k]);
        g[k] = load16(gate + row[k] * gs + col[k]);
        u[k] = load16(up + row[k] * us + col[k]);
      }
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      if (first + int64_t(k) * blockDim.x < nvec) {
        Vec16<T> og, ou;
#pragma unroll
        for (int e = 0; e < V; e += 2) {
          const float2 dv = to_float2(d[k], e), gv = to_float2(g[k], e), uv = to_float2(u[k], e);
          float a0, da0, a1, da1;
          Op::template act_grad<T>(gv.x, a0, da0);
          Op::template act_grad<T>(gv.y, a1, da1);
          from_float2<T>(dv.x * uv.x * da0, dv.y * uv.y * da1, og.v + e);
          from_float2<T>(dv.x * a0, dv.y * a1, ou.v + e);
        }
        store16(dgate + row[k] * dgs + col[k], og);
        store16(dup + row[k] * dus + col[k], ou);
      }
    }
  }
  if (tail) {
    for (int64_t i = tid; i < rows * tail; i += nthreads) {
      int64_t row, col;
      split(i, tail, row, col);
      bwd_element<Op>(dy, gate, up, dgate, dup, row, per_row * V + col, ds, gs, us, dgs, dus);
    }
  }
}

}  // namespace
}  // namespace rawops

#define RAWOPS_GLU(name, Op, T, suffix)                                                                          \
  extern "C" __global__ void __launch_bounds__(RAWOPS_MAP_THREADS)                                              \
      name##_fwd_##suffix(const T* gate, const T* up, T* out, long long rows, long long cols,                   \
                          long long gate_stride, long long up_stride, long long out_stride, long long vec) {    \
    rawops::glu_fwd<rawops::Op>(gate, up, out, rows, cols, gate_stride, up_stride, out_stride, vec != 0);       \
  }                                                                                                             \
  extern "C" __global__ void __launch_bounds__(RAWOPS_MAP_THREADS)                                              \
      name##_bwd_##suffix(const T* dy, const T* gate, const T* up, T* dgate, T* dup, long long rows,            \
                          long long cols, long long dy_stride, long long gate_stride, long long up_stride,      \
                          long long dgate_stride, long long dup_stride, long long vec) {                        \
    rawops::glu_bwd<rawops::Op>(dy, gate, up, dgate, dup, rows, cols, dy_stride, gate_stride, up_stride,        \
                                dgate_stride, dup_stride, vec != 0);                                            \
  }

#define RAWOPS_GLU_FAMILY(T, suffix)         \
  RAWOPS_GLU(swiglu, Silu, T, suffix)        \
  RAWOPS_GLU(geglu_tanh, GeluTanh, T, suffix) \
  RAWOPS_GLU(geglu_erf, GeluErf, T, suffix)

RAWOPS_GLU_FAMILY(float, f32)
RAWOPS_GLU_FAMILY(__half, f16)
RAWOPS_GLU_FAMILY(__nv_bfloat16, bf16)
