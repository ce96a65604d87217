// Normalisation family: layer_norm and rms_norm over the last dim, forward and backward.
//
// Forward (one launch):
//   layer_norm  y = (x - mean) * rstd * w + b,  rstd = 1 / sqrt(var + eps), biased variance
//   rms_norm    y = x * rstd * w,               rstd = 1 / sqrt(mean(x^2) + eps)
//   w, b optional (flag bits; see RAWOPS_NORM below); mean (layer_norm) and rstd written per row in float32 for
//   the backward. Traffic: x read once, y written once (streaming mode reads x twice).
//   Variance is two-pass over the row held in registers (exact for a 1e4 offset); the
//   streaming mode uses sums shifted by the row's first element, which removes the offset.
// Backward (two launches, deterministic, no atomics):
//   xhat = (x - mean) * rstd, g = dy * w
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))       (rms_norm: no mean(g) term)
//   dw = sum over rows of dy * xhat, db = sum over rows of dy
//   norm_bwd: each row's three sums (of x - m, g and g * (x - m)) in one reduction; each
//   warp (warp mode) or block takes a fixed set of rows and keeps dw/db partials for its
//   columns in dynamic shared memory (ColumnPartials; the streaming mode in its own global
//   row), then writes one float32 row of partial_dw / partial_db [chunks, n] (chunks: the
//   launch's warps or blocks). norm_param_grad sums those rows in a fixed order. x and dy
//   are read once, dx written once; the partials are a few MB at most.
// add_rms_norm (ADD): the residual add fused in front of rms_norm, as a transformer block runs it:
//   forward   h = x + residual, rounded to T and written (residual_out: the block's new residual),
//             y = rms_norm(h) * w from the rounded h (the values the next block adds to, and the
//             values torch's unfused x + residual then rms_norm would normalise)
//   backward  dx = rms_norm's dx (of dy, at h) + d_residual_out (the gradient reaching the new
//             residual; optional, flag RAWOPS_NORM_FLAG_ADD): the gradient of x and of residual
//             both; dw as rms_norm's (deterministic partial rows, norm_param_grad)
//   Traffic: forward x, residual read once, residual_out and y written once (the streaming mode reads
//   residual_out back for its second pass, as it reads x twice); backward dy, h, d_residual_out read
//   once, dx written once. residual_out may be exactly x or residual (in place): every element is
//   read, then written, by one thread, and what the streaming mode reads back it reads from L2.
// Rows: x, y, dy and dx (and residual, residual_out, d_residual_out) each have their own row stride
// (rows.cuh: a row-strided view, or n); weight, bias, mean, rstd and the partial rows are dense.
// Launch: mode and block from rawops/_rows.py (see rawops/rows.cuh); the backward's grid is
// what the occupancy API says the device holds at once, its shared memory from
// rawops/norm.py (column_smem).
#include "rawops/bulk.cuh"
#include "rawops/rows.cuh"

namespace rawops {
namespace {


// The residual add's operands (ADD only): residual and residual_out rows at their own strides.
template <typename T> struct ResidualAdd {
  const T* residual;
  T* out;
  int64_t residual_stride, out_stride;
};

// v = x + residual of vector j of a row, rounded to T (0 past the row's end).
template <typename T, int V = Vec16<T>::size>
__device__ __forceinline__ void residual_sum(const T* x, const T* r, int64_t j, int64_t n, bool vec, float (&v)[V]) {
  float rv[V];
  load_row(x, j, n, vec, 0.f, v);
  load_row(r, j, n, vec, 0.f, rv);
#pragma unroll
  for (int e = 0; e < V; ++e) v[e] = to_float(from_float<T>(v[e] + rv[e]));
}

// load_row (pad 0) of a row this kernel wrote (residual_out, in the streaming mode's second pass):
// from L2 (ld.global.cg), never through the read-only path, which may hold the line as it was
// before the write when residual_out is x or residual (in place).
template <typename T, int V = Vec16<T>::size>
__device__ __forceinline__ void load_written_row(const T* row, int64_t j, int64_t n, bool vec, float (&v)[V]) {
  const int64_t first = j * V;
  if (vec) {
    const uint4 r = first < n ? __ldcg(reinterpret_cast<const uint4*>(row + first)) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int e = 0; e < V; ++e) v[e] = unpack<T>(r, e);
    return;
  }
#pragma unroll
  for (int e = 0; e < V; ++e) {
    float value = 0.f;
    if (first + e < n) {
      if (sizeof(T) == 4) {
        value = __ldcg(reinterpret_cast<const float*>(row + first + e));
      } else {
        const unsigned short bits = __ldcg(reinterpret_cast<const unsigned short*>(row + first + e));
        value = unpack<T>(make_uint4(bits, 0, 0, 0), 0);
      }
    }
    v[e] = value;
  }
}

template <typename T, bool RMS, bool ADD = false>
__device__ __forceinline__ void norm_fwd_stream(const T* __restrict__ x, const T* __restrict__ w,
                                                const T* __restrict__ b, T* __restrict__ y,
                                                float* __restrict__ mean_out, float* __restrict__ rstd_out,
                                                int64_t rows, int64_t n, int64_t x_stride, int64_t y_stride,
                                                float eps, bool vec, bool has_w, bool has_b, RowReducer& reduce,
                                                const ResidualAdd<T>& add = {}) {
  constexpr int V = Vec16<T>::size;
  const int64_t nvec = (n + V - 1) / V;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    // ADD: the first pass writes h = x + residual (residual_sum) to residual_out, the second reads
    // it back (load_written_row).
    const T* xr = x + row * x_stride;
    // Shifted sums: with the shift near the mean, s2 - s1^2/n does not cancel.
    const float shift = RMS ? 0.f : to_float(xr[0]);
    float s[2] = {0.f, 0.f};
    for (int64_t j = threadIdx.x; j < nvec; j += blockDim.x) {
      float v[V];
      if (ADD) {
        residual_sum(xr, add.residual + row * add.residual_stride, j, n, vec, v);
        store_row(add.out + row * add.out_stride, j, n, vec, v);
      } else {
        load_row(xr, j, n, vec, shift, v);  // padding equal to the shift adds 0
      }
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float d = v[e] - shift;
        s[0] += d;
        s[1] = fmaf(d, d, s[1]);
      }
    }
    reduce.reduce(s, SumOp());
    const float S1 = RMS ? 0.f : s[0] / float(n);
    const float S2 = s[1] / float(n);
    const float mean = shift + S1;
    const float rstd = rsqrtf(fmaxf(S2 - S1 * S1, 0.f) + eps);
    if (threadIdx.x == 0) {
      if (!RMS) mean_out[row] = mean;
      rstd_out[row] = rstd;
    }
    T* yr = y + row * y_stride;
    for (int64_t j = threadIdx.x; j < nvec; j += blockDim.x) {
      float v[V], wv[V], bv[V];
      if (ADD) {
        load_written_row(add.out + row * add.out_stride, j, n, vec, v);
      } else {
        load_row(xr, j, n, vec, 0.f, v);
      }
      if (has_w) load_row(w, j, n, vec, 1.f, wv);
      if (has_b) load_row(b, j, n, vec, 0.f, bv);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        float o = ((v[e] - shift) - S1) * rstd;  // not v - mean: mean rounds at ~1e-3 near 1e4
        if (has_w) o *= wv[e];
        if (has_b) o += bv[e];
        v[e] = o;
      }
      store_row(yr, j, n, vec, v);
    }
  }
}

// layer_norm's row of a 16-bit type in registers (norm_fwd's register modes). Issue-bound on fast
// memory (the H200 streams 4 elements a clock an SM at its ceiling), so the fewest instructions an
// element: sum and sum of squares of d = x - shift in one pass and one barrier, var = E[d^2] -
// E[d]^2 (with the shift the row's first element E[d] is within a few deviations of 0: no
// cancellation that reaches 8 or 11 bits; float32 rows take two passes, exact), and the output as
// two FMAs, (d rstd - E[d] rstd) w + b.
template <typename T, int ITEMS>
__device__ __forceinline__ void layer_norm_row_half(const RowSlice<T, ITEMS>& xs, const RowCursor& c, int64_t n,
                                                    float shift, float eps, const T* __restrict__ w,
                                                    const T* __restrict__ b, T* __restrict__ yr, bool has_w,
                                                    bool has_b, RowReducer& reduce, float* mean_out,
                                                    float* rstd_out) {
  constexpr int V = Vec16<T>::size;
  using Slice = RowSlice<T, ITEMS>;
  float s[2] = {0.f, 0.f};
#pragma unroll
  for (int k = 0; k < ITEMS; ++k)
#pragma unroll
    for (int e = 0; e < V; ++e)
      if (Slice::valid(c, k, n)) {
        const float d = xs.at(k, e) - shift;
        s[0] += d;
        s[1] = fmaf(d, d, s[1]);
      }
  reduce.reduce(s, SumOp());
  const float S1 = s[0] / float(n);
  const float rstd = rsqrtf(fmaxf(s[1] / float(n) - S1 * S1, 0.f) + eps);
  if (c.lane == 0) {
    *mean_out = shift + S1;
    *rstd_out = rstd;
  }
  const float offset = -S1 * rstd;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int64_t j = int64_t(k) * c.width + c.lane;
    if (j * V >= n) break;
    float o[V], wv[V], bv[V];
    if (has_w) {
      load_row(opaque(w), j, n, true, 1.f, wv);
    } else {
#pragma unroll
      for (int e = 0; e < V; ++e) wv[e] = 1.f;
    }
    if (has_b) {
      load_row(opaque(b), j, n, true, 0.f, bv);
    } else {
#pragma unroll
      for (int e = 0; e < V; ++e) bv[e] = 0.f;
    }
#pragma unroll
    for (int e = 0; e < V; ++e) o[e] = fmaf(fmaf(xs.at(k, e) - shift, rstd, offset), wv[e], bv[e]);
    store_row(yr, j, n, true, o);
  }
}

// The row sums of the full-rows kernels, returned to every thread of the block: each warp's by
// an xor butterfly (every lane ends with the same bits: the adds commute), one barrier, then
// every thread adds the warps' sums from shared memory a float4 (four warps) at a time, in a
// fixed order (no second warp reduction, no broadcast). part's two slots alternate (slot flips
// each call): a slot is rewritten two rows on, after every thread passed the next barrier.
template <int K>
__device__ __forceinline__ void full_row_sums(float (&s)[K], float (&part)[2][K][kMaxRowWarps], int& slot) {
#pragma unroll
  for (int i = 0; i < K; ++i) {
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) s[i] += __shfl_xor_sync(0xffffffffu, s[i], o);
  }
  if (threadIdx.x % 32 == 0) {
#pragma unroll
    for (int i = 0; i < K; ++i) part[slot][i][threadIdx.x / 32] = s[i];
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < K; ++i) {
    float total = 0.f;
#pragma unroll
    for (int q = 0; q < kMaxRowWarps / 4; ++q) {
      if (128 * q >= int(blockDim.x)) break;
      const float4 a = *reinterpret_cast<const float4*>(&part[slot][i][4 * q]);
      const float quad = (a.x + a.y) + (a.z + a.w);
      total = q == 0 ? quad : total + quad;
    }
    s[i] = total;
  }
  slot ^= 1;
}

template <typename T, bool RMS, bool ADD = false>
__device__ __forceinline__ void norm_fwd(const T* __restrict__ x, const T* __restrict__ w,
                                         const T* __restrict__ b, T* __restrict__ y, float* __restrict__ mean_out,
                                         float* __restrict__ rstd_out, int64_t rows, int64_t n, int64_t x_stride,
                                         int64_t y_stride, float eps, int mode, bool vec, bool has_w, bool has_b,
                                         const ResidualAdd<T>& add = {}) {
  static_assert(RMS || !ADD, "the residual add is rms_norm's");
  __shared__ RowReducer::Storage storage;
  const RowCursor c(mode);
  RowReducer reduce(storage, c.warp);
  if (mode == kStreamRow) {
    norm_fwd_stream<T, RMS, ADD>(x, w, b, y, mean_out, rstd_out, rows, n, x_stride, y_stride, eps, vec, has_w, has_b,
                                 reduce, add);
    return;
  }
  constexpr int V = Vec16<T>::size;
  constexpr int ITEMS = kFwdVectors;
  using Slice = RowSlice<T, ITEMS>;
  for (int64_t row = c.row; row < rows; row += c.step) {  // uniform over the row's threads
    const T* xr = x + row * x_stride;
    Slice xs;
    xs.load(xr, c, n);
    if (ADD) {  // h = x + residual, rounded to T: written as the new residual, normalised below
      Slice rs;
      rs.load(add.residual + row * add.residual_stride, c, n);
      T* hr = add.out + row * add.out_stride;
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        if (!Slice::valid(c, k, n)) break;
        Vec16<T> h;
#pragma unroll
        for (int e = 0; e < V; e += 2) from_float2<T>(xs.at(k, e) + rs.at(k, e), xs.at(k, e + 1) + rs.at(k, e + 1), h.v + e);
        xs.raw[k] = words(h);
        store16(hr + Slice::first(c, k), h);
      }
    }
    // Summed relative to the row's first element: with a large common offset (1e4) a plain
    // float32 sum loses the mean to rounding, visibly in y.
    const float shift = RMS ? 0.f : to_float(xr[0]);
    if constexpr (!RMS && sizeof(T) == 2) {
      layer_norm_row_half(xs, c, n, shift, eps, w, b, y + row * y_stride, has_w, has_b, reduce, mean_out + row,
                          rstd_out + row);
      continue;
    }
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k)
#pragma unroll
      for (int e = 0; e < V; ++e)
        if (Slice::valid(c, k, n)) sum += xs.at(k, e) - shift;
    xs.refresh();
    // x - mean is taken as (x - shift) - S1: mean itself, stored as float32 near a 1e4
    // offset, carries ~5e-4 of rounding, which would show in every output.
    const float S1 = RMS ? 0.f : reduce(sum, SumOp()) / float(n);
    const float mean = shift + S1;
    float sq = 0.f;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k)
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float d = Slice::valid(c, k, n) ? (xs.at(k, e) - shift) - S1 : 0.f;
        sq = fmaf(d, d, sq);
      }
    xs.refresh();
    const float rstd = rsqrtf(reduce(sq, SumOp()) / float(n) + eps);
    if (c.lane == 0) {
      if (!RMS) mean_out[row] = mean;
      rstd_out[row] = rstd;
    }
    T* yr = y + row * y_stride;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int64_t j = int64_t(k) * c.width + c.lane;
      if (j * V >= n) break;
      float o[V], wv[V], bv[V];
      if (has_w) load_row(opaque(w), j, n, true, 1.f, wv);
      if (has_b) load_row(opaque(b), j, n, true, 0.f, bv);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        o[e] = ((xs.at(k, e) - shift) - S1) * rstd;
        if (has_w) o[e] *= wv[e];
        if (has_b) o[e] += bv[e];
      }
      store_row(yr, j, n, true, o);
    }
  }
}

// dx of one row from its sums: shared by the register and streaming modes.
//   sums: [0] sum(x - m), [1] sum(g), [2] sum(g * (x - m)), m the forward's float32 mean.
// x - mean is taken as (x - m) - r with r = mean(x - m) (0 for 16-bit rows: norm_bwd): exact
// near a 1e4 offset, where m alone carries ~5e-4 of rounding. Then
// mean(g * xhat) = rstd * (sum(g (x - m)) - r sum(g)) / n.
// inv_n = 1 / n, computed once: three IEEE divisions a row cost ~30 instructions a thread.
struct NormRowTerms {
  float r, rstd, mean_g, mean_gx;
  template <bool RMS>
  __device__ __forceinline__ static NormRowTerms from(const float (&sums)[3], float rstd, float inv_n) {
    NormRowTerms t;
    t.r = RMS ? 0.f : sums[0] * inv_n;
    t.rstd = rstd;
    t.mean_g = RMS ? 0.f : sums[1] * inv_n;
    t.mean_gx = rstd * (sums[2] - t.r * sums[1]) * inv_n;
    return t;
  }
  __device__ __forceinline__ float xhat(float x, float m) const { return ((x - m) - r) * rstd; }
  // Not as two FMAs (g rstd - (x-hat rstd mean_gx + rstd mean_g)): rstd mean_g's rounding then
  // leaves dx != 0 where g = mean(g) (a one-element row), and it gained nothing beside the two sums.
  template <bool RMS>
  __device__ __forceinline__ float dx(float g, float xhat) const {
    return rstd * (g - (RMS ? 0.f : mean_g) - xhat * mean_gx);
  }
};

// The gradient added to dx (ADD only, where has_add): d_residual_out's rows at their stride.
template <typename T> struct GradAdd {
  const T* grad;
  int64_t stride;
  bool has;
};

template <typename T, bool RMS, bool ADD = false>
__device__ __forceinline__ void norm_bwd_stream(const T* __restrict__ dy, const T* __restrict__ x,
                                                const T* __restrict__ w, const float* __restrict__ mean_in,
                                                const float* __restrict__ rstd_in, T* __restrict__ dx,
                                                float* partial_dw, float* partial_db, int64_t rows, int64_t n,
                                                int64_t dy_stride, int64_t x_stride, int64_t dx_stride, bool vec,
                                                bool has_w, RowReducer& reduce, const GradAdd<T>& add = {}) {
  constexpr int V = Vec16<T>::size;
  const int64_t nvec = (n + V - 1) / V;
  // This block's partial rows, updated in place by the thread that owns each column (same
  // layout every row): no other thread touches them, so no atomics and a fixed order.
  float* pdw = partial_dw ? partial_dw + int64_t(blockIdx.x) * n : nullptr;
  float* pdb = partial_db ? partial_db + int64_t(blockIdx.x) * n : nullptr;
  for (int64_t col = threadIdx.x * int64_t(V); col < n; col += int64_t(blockDim.x) * V) {
#pragma unroll
    for (int e = 0; e < V; ++e) {
      if (col + e < n) {
        if (pdw) pdw[col + e] = 0.f;
        if (pdb) pdb[col + e] = 0.f;
      }
    }
  }
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * x_stride;
    const T* dyr = dy + row * dy_stride;
    const float m = RMS ? 0.f : mean_in[row];
    float sums[3] = {0.f, 0.f, 0.f};
    for (int64_t j = threadIdx.x; j < nvec; j += blockDim.x) {
      float xv[V], gv[V], wv[V];
      load_row(xr, j, n, vec, m, xv);  // padding equal to m adds 0
      load_row(dyr, j, n, vec, 0.f, gv);
      if (has_w) load_row(w, j, n, vec, 1.f, wv);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float g = has_w ? __fmul_rn(gv[e], wv[e]) : gv[e];  // 0 past the row's end (dy padded with 0)
        sums[0] += xv[e] - m;
        sums[1] += g;
        sums[2] = fmaf(g, xv[e] - m, sums[2]);
      }
    }
    reduce.reduce(sums, SumOp());
    const NormRowTerms t = NormRowTerms::from<RMS>(sums, rstd_in[row], 1.f / float(n));  // once a row: streaming rows are wide
    T* dxr = dx + row * dx_stride;
    for (int64_t j = threadIdx.x; j < nvec; j += blockDim.x) {
      float xv[V], gv[V], wv[V];
      load_row(xr, j, n, vec, 0.f, xv);
      load_row(dyr, j, n, vec, 0.f, gv);
      if (has_w) load_row(w, j, n, vec, 1.f, wv);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float xhat = t.xhat(xv[e], m);
        const int64_t col = j * V + e;
        if (col < n) {
          if (pdw) pdw[col] = fmaf(gv[e], xhat, pdw[col]);
          if (pdb) pdb[col] += gv[e];
        }
        xv[e] = t.dx<RMS>(has_w ? __fmul_rn(gv[e], wv[e]) : gv[e], xhat);
      }
      if (ADD && add.has) {
        float av[V];
        load_row(add.grad + row * add.stride, j, n, vec, 0.f, av);
#pragma unroll
        for (int e = 0; e < V; ++e) xv[e] += av[e];
      }
      store_row(dxr, j, n, vec, xv);
    }
  }
}

// The register modes' dw / db partials: each thread's running sums for the columns it holds,
// in dynamic shared memory (held in registers, 32 a thread in 16-bit types, they capped a
// 256-thread block at 2 per SM: docs/performance.md). Only the owning
// thread touches its slots, so no barrier, no atomics, a fixed order. float4 q of thread t
// lies at [q][t]: a warp's 16-byte accesses are contiguous, free of bank conflicts.
template <typename T>
struct ColumnPartials {
  static constexpr int V = Vec16<T>::size;
  static constexpr int Q = kBwdVectors * V / 4;  // float4s a thread owns per partial
  float4* dw;  // null when not wanted
  float4* db;
  __device__ __forceinline__ ColumnPartials(float4* smem, bool want_dw, bool want_db) {
    dw = want_dw ? smem : nullptr;
    db = want_db ? smem + (want_dw ? Q * blockDim.x : 0) : nullptr;
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int q = 0; q < Q; ++q) {
      if (dw) dw[slot(q)] = zero;
      if (db) db[slot(q)] = zero;
    }
  }
  __device__ __forceinline__ static int slot(int q) { return q * blockDim.x + threadIdx.x; }
  // Vector k's columns of p += u * v (one rounding, as an fma), or += u.
  __device__ __forceinline__ static void add(float4* p, int k, const float (&u)[V], const float (&v)[V]) {
#pragma unroll
    for (int i = 0; i < V / 4; ++i) {
      float4 a = p[slot(k * V / 4 + i)];
      a.x = fmaf(u[4 * i], v[4 * i], a.x);
      a.y = fmaf(u[4 * i + 1], v[4 * i + 1], a.y);
      a.z = fmaf(u[4 * i + 2], v[4 * i + 2], a.z);
      a.w = fmaf(u[4 * i + 3], v[4 * i + 3], a.w);
      p[slot(k * V / 4 + i)] = a;
    }
  }
  __device__ __forceinline__ static void add(float4* p, int k, const float (&u)[V]) {
#pragma unroll
    for (int i = 0; i < V / 4; ++i) {
      float4 a = p[slot(k * V / 4 + i)];
      a.x += u[4 * i];
      a.y += u[4 * i + 1];
      a.z += u[4 * i + 2];
      a.w += u[4 * i + 3];
      p[slot(k * V / 4 + i)] = a;
    }
  }
  // Vector k's columns of p to out (float32, a row of the global partials).
  __device__ __forceinline__ static void flush(const float4* p, int k, float* out) {
#pragma unroll
    for (int i = 0; i < V / 4; ++i) reinterpret_cast<float4*>(out)[i] = p[slot(k * V / 4 + i)];
  }
};

// The 16-bit layer_norm backward of full rows (entries layer_norm_bwd_full_<f16|bf16>, picked by
// rawops/norm.py full_rows): block mode, every thread's kBwdVectors vectors inside the row (n =
// blockDim.x x kBwdVectors x V: 2048, 4096, 8192 wide at 128, 256, 512 threads), 16-byte rows, a
// multiple of 4 warps. An entry of its own, so that norm_bwd keeps its register allocation for
// every other row. norm_bwd's math an element; less a row: row pointers advanced by the grid's
// step (no 64-bit row x stride products, no bounds tests) and the row sums by full_row_sums.
template <typename T>
__device__ __forceinline__ void layer_norm_bwd_full_rows(const T* __restrict__ dy, const T* __restrict__ x,
                                                         const T* __restrict__ w, const float* __restrict__ mean_in,
                                                         const float* __restrict__ rstd_in, T* __restrict__ dx,
                                                         float* __restrict__ partial_dw,
                                                         float* __restrict__ partial_db, int64_t rows, int64_t n,
                                                         int64_t dy_stride, int64_t x_stride, int64_t dx_stride,
                                                         bool has_w) {
  constexpr int V = Vec16<T>::size;
  constexpr int ITEMS = kBwdVectors;
  constexpr int K = 2;  // sum(g (x - m)), sum(g): norm_bwd's 16-bit rows
  using Slice = RowSlice<T, ITEMS>;
  __shared__ __align__(16) float part[2][K][kMaxRowWarps];  // alternating slots, as RowReducer's
  const RowCursor c(kBlockPerRow);
  extern __shared__ float4 column_smem[];
  const float inv_n = 1.f / float(n);
  const ColumnPartials<T> acc(column_smem, partial_dw != nullptr, partial_db != nullptr);
  float4* free_smem =
      column_smem + ((partial_dw != nullptr) + (partial_db != nullptr)) * ColumnPartials<T>::Q * blockDim.x;
  const uint4* const ws = reinterpret_cast<const uint4*>(free_smem);  // the weight, as in norm_bwd
  if (has_w) {
    const int64_t words = n * int64_t(sizeof(T)) / 16;
    for (int64_t i = threadIdx.x; i < words; i += blockDim.x)
      reinterpret_cast<uint4*>(free_smem)[i] = __ldg(reinterpret_cast<const uint4*>(w) + i);
    __syncthreads();
  }
  const int64_t kw = int64_t(c.width) * V;  // elements between a thread's vectors
  const int64_t lane0 = int64_t(c.lane) * V;
  const T* xp = x + c.row * x_stride + lane0;
  const T* dyp = dy + c.row * dy_stride + lane0;
  T* dxp = dx + c.row * dx_stride + lane0;
  const float* mp = mean_in + c.row;
  const float* rp = rstd_in + c.row;
  const int64_t x_step = c.step * x_stride, dy_step = c.step * dy_stride, dx_step = c.step * dx_stride;
  int slot = 0;
  for (int64_t row = c.row; row < rows; row += c.step) {
    Slice xs, ds;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      xs.raw[k] = words(load16(xp + k * kw));
      ds.raw[k] = words(load16(dyp + k * kw));
    }
    const float m = *mp, rstd = *rp;
    float sums[K];
    {
      float s1 = 0.f, s2 = 0.f;
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        const uint4 wk = has_w ? ws[k * c.width + c.lane] : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const float g = has_w ? __fmul_rn(ds.at(k, e), unpack<T>(wk, e)) : ds.at(k, e);  // as norm_bwd
          s1 += g;
          s2 = fmaf(g, xs.at(k, e) - m, s2);
        }
      }
      sums[0] = s2;
      sums[1] = s1;
    }
    xs.refresh();
    ds.refresh();
    full_row_sums(sums, part, slot);
    const float row_sums[3] = {0.f, sums[1], sums[0]};
    const NormRowTerms t = NormRowTerms::from<false>(row_sums, rstd, inv_n);
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const uint4 wk = has_w ? ws[k * c.width + c.lane] : make_uint4(0, 0, 0, 0);
      float xhat[V], dyv[V];
      Vec16<T> out;
#pragma unroll
      for (int e = 0; e < V; ++e) {
        dyv[e] = ds.at(k, e);
        xhat[e] = t.xhat(xs.at(k, e), m);
        out.v[e] = from_float<T>(t.dx<false>(has_w ? __fmul_rn(dyv[e], unpack<T>(wk, e)) : dyv[e], xhat[e]));
      }
      if (acc.dw) acc.add(acc.dw, k, dyv, xhat);
      if (acc.db) acc.add(acc.db, k, dyv);
      store16(dxp + k * kw, out);
    }
    xp += x_step;
    dyp += dy_step;
    dxp += dx_step;
    mp += c.step;
    rp += c.step;
  }
  const int64_t chunk = blockIdx.x;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int64_t col = (int64_t(k) * c.width + c.lane) * V;
    if (acc.dw) acc.flush(acc.dw, k, partial_dw + chunk * n + col);
    if (acc.db) acc.flush(acc.db, k, partial_db + chunk * n + col);
  }
}

template <typename T, bool RMS, bool ADD = false>
__device__ __forceinline__ void norm_bwd(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ w,
                                         const float* __restrict__ mean_in, const float* __restrict__ rstd_in,
                                         T* __restrict__ dx, float* __restrict__ partial_dw,
                                         float* __restrict__ partial_db, int64_t rows, int64_t n, int64_t dy_stride,
                                         int64_t x_stride, int64_t dx_stride, int mode, bool vec, bool has_w,
                                         const GradAdd<T>& add = {}, int stages = 0) {
  static_assert(RMS || !ADD, "the residual add is rms_norm's");
  __shared__ RowReducer::Storage storage;
  const RowCursor c(mode);
  RowReducer reduce(storage, c.warp);
  if (mode == kStreamRow) {
    norm_bwd_stream<T, RMS, ADD>(dy, x, w, mean_in, rstd_in, dx, partial_dw, partial_db, rows, n, dy_stride,
                                 x_stride, dx_stride, vec, has_w, reduce, add);
    return;
  }
  constexpr int V = Vec16<T>::size;
  constexpr int ITEMS = kBwdVectors;
  // 16-bit rows: no sum(x - m) (r = 0: x - mean as x - m, torch's formula). m's float32 rounding
  // is ~6e-8 of |mean|, and a 16-bit row's spread is at least its type's spacing (2^-11 of |mean|
  // or coarser) unless constant (then r = 0 exactly): r rstd stays under ~1e-4 of x-hat's scale.
  // One add an element and a third of the reduction fewer (docs/performance.md).
  constexpr bool HALF = sizeof(T) == 2;
  constexpr bool SHIFTED = !RMS && !HALF;
  constexpr int K = RMS ? 1 : (SHIFTED ? 3 : 2);  // sums a row reduces: sum(g (x - m)) [, sum(x - m)], sum(g)
  using Slice = RowSlice<T, ITEMS>;
  extern __shared__ float4 column_smem[];
  const float inv_n = 1.f / float(n);
  const ColumnPartials<T> acc(column_smem, partial_dw != nullptr, partial_db != nullptr);

  // The weight, copied once into shared memory after the partials (has_w; rawops/norm.py sizes
  // the dynamic shared memory for it): read every row from there. Read through L1 instead, the
  // streamed rows evicted it (ncu, H200: 39% L1 hits, warps stalled on L1TEX 41% of cycles).
  float4* free_smem =
      column_smem + ((partial_dw != nullptr) + (partial_db != nullptr)) * ColumnPartials<T>::Q * blockDim.x;
  const uint4* const ws = reinterpret_cast<const uint4*>(free_smem);
  if (has_w) {
    const int64_t words = n * int64_t(sizeof(T)) / 16;  // register modes: n % V == 0
    for (int64_t i = threadIdx.x; i < words; i += blockDim.x)
      reinterpret_cast<uint4*>(free_smem)[i] = __ldg(reinterpret_cast<const uint4*>(w) + i);
    free_smem += words;
    __syncthreads();
  }

  // The bulk path (sm_90, block mode, `stages` > 0): the block's rows x, dy (and d_residual_out)
  // land in `stages` shared-memory stages after the partials, posted by thread 0 that many rows
  // ahead, so the next rows stream in while this one computes; each thread then reads its slice
  // from shared memory (docs/performance.md, the norm backward on the H200).
#ifdef RAWOPS_HAS_BULK
  __shared__ unsigned long long stage_bar[kBwdMaxStages];
  static_assert(kBwdMaxStages == 2, "the stage of row it is it % stages, written for stages 1 and 2");
  stages = stages < kBwdMaxStages ? stages : kBwdMaxStages;
  const bool use_bulk = RMS && stages > 0 && !c.warp;  // layer_norm: no gain measured, and it spilled at 64
  const int ops = (ADD && add.has) ? 3 : 2;
  T* const stage0 = reinterpret_cast<T*>(free_smem);
  const unsigned row_bytes = unsigned(n * int64_t(sizeof(T)));
  auto post = [&](int s, int64_t r) {  // thread 0: row r's operands into stage s
    bulk_expect(&stage_bar[s], row_bytes * ops);
    T* d = stage0 + int64_t(s) * ops * n;
    bulk_copy(d, x + r * x_stride, row_bytes, &stage_bar[s]);
    bulk_copy(d + n, dy + r * dy_stride, row_bytes, &stage_bar[s]);
    if (ADD && ops == 3) bulk_copy(d + 2 * n, add.grad + r * add.stride, row_bytes, &stage_bar[s]);
  };
  if (use_bulk) {
    if (threadIdx.x == 0) {
      for (int s = 0; s < stages; ++s) bulk_barrier_init(&stage_bar[s]);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int s = 0; s < stages; ++s)
        if (c.row + s * c.step < rows) post(s, c.row + s * c.step);
    }
  }
  // The next row's statistics loaded a row ahead: behind the stage's wait they would be one
  // more memory round trip a row.
  float rstd_ahead = use_bulk && c.row < rows ? rstd_in[c.row] : 0.f;
  float m_ahead = !RMS && use_bulk && c.row < rows ? mean_in[c.row] : 0.f;
#else
  constexpr bool use_bulk = false;
  float rstd_ahead = 0.f, m_ahead = 0.f;
#endif

  int it = 0;  // this block's rows so far (the bulk path's stage and phase)
  for (int64_t row = c.row; row < rows; row += c.step, ++it) {  // uniform over the row's threads
    // Loading the next row before this one's reduction (software pipelining) cost 16 more
    // registers: it spilled at 64, and ran slower with the registers to hold it
    // (docs/performance.md).
    Slice xs, ds, rs;  // rs: d_residual_out (bulk path of add_rms_norm)
    float m, rstd;
    if (use_bulk) {
#ifdef RAWOPS_HAS_BULK
      const int s = stages == 1 ? 0 : (it & 1);  // stages is 1 or 2 (kBwdMaxStages)
      m = m_ahead;
      rstd = rstd_ahead;
      const int64_t next = row + c.step;
      if (next < rows) {
        rstd_ahead = rstd_in[next];
        if (!RMS) m_ahead = mean_in[next];
      }
      bulk_wait(&stage_bar[s], unsigned(stages == 1 ? it : it >> 1) & 1u);
      const T* d = stage0 + int64_t(s) * ops * n;
      xs.load_shared(d, c, n);
      ds.load_shared(d + n, c, n);
      if (ADD && ops == 3) rs.load_shared(d + 2 * n, c, n);
#endif
    } else {
      xs.load(x + row * x_stride, c, n);
      ds.load(dy + row * dy_stride, c, n);  // dy = 0 past the row's end
      m = RMS ? 0.f : mean_in[row];
      rstd = rstd_in[row];
    }
    float sums[K];
    {
      float s0 = 0.f, s1 = 0.f, s2 = 0.f;
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        // A vector past the row's end adds nothing: skipped whole (one branch, not a select
        // per element).
        if (!Slice::valid(c, k, n)) break;
        const uint4 wk = has_w ? ws[k * c.width + c.lane] : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int e = 0; e < V; ++e) {
          // g rounded once (__fmul_rn, no contraction into a later fma): the same g here and in
          // dx, so that g - mean(g) is exactly 0 for a one-element row, as in float64.
          const float g = has_w ? __fmul_rn(ds.at(k, e), unpack<T>(wk, e)) : ds.at(k, e);
          const float d = xs.at(k, e) - m;
          s0 += d;
          s1 += g;
          s2 = fmaf(g, d, s2);
        }
      }
      sums[0] = s2;
      if constexpr (SHIFTED) {
        sums[1] = s0;
        sums[2] = s1;
      } else if constexpr (!RMS) {
        sums[1] = s1;
      }
    }
    // Decoded x and dy are recomputed after the reduction, not held across it.
    xs.refresh();
    ds.refresh();
    reduce.reduce(sums, ShuffleSumOp());
#ifdef RAWOPS_HAS_BULK
    // Past the reduction's barrier every thread holds its slice of this stage: refill it.
    if (use_bulk && threadIdx.x == 0 && row + stages * c.step < rows) post(stages == 1 ? 0 : (it & 1), row + stages * c.step);
#endif
    const float row_sums[3] = {SHIFTED ? sums[1] : 0.f, RMS ? 0.f : sums[K - 1], sums[0]};
    const NormRowTerms t = NormRowTerms::from<RMS>(row_sums, rstd, inv_n);
    T* dxr = dx + row * dx_stride;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int64_t j = int64_t(k) * c.width + c.lane;
      if (j * V >= n) break;
      // weight: from shared memory again; holding it in registers cost occupancy
      const uint4 wk = has_w ? ws[j] : make_uint4(0, 0, 0, 0);
      float o[V], xhat[V], dyv[V];
#pragma unroll
      for (int e = 0; e < V; ++e) {
        dyv[e] = ds.at(k, e);
        xhat[e] = t.xhat(xs.at(k, e), m);
        o[e] = t.dx<RMS>(has_w ? __fmul_rn(dyv[e], unpack<T>(wk, e)) : dyv[e], xhat[e]);
      }
      if (acc.dw) acc.add(acc.dw, k, dyv, xhat);
      if (acc.db) acc.add(acc.db, k, dyv);
      if (ADD && add.has) {
        float av[V];
        if (use_bulk) {
#pragma unroll
          for (int e = 0; e < V; ++e) av[e] = rs.at(k, e);
        } else {
          load_row(add.grad + row * add.stride, j, n, true, 0.f, av);
        }
#pragma unroll
        for (int e = 0; e < V; ++e) o[e] += av[e];
      }
      store_row(dxr, j, n, true, o);
    }
  }
  (void)rstd_ahead;
  (void)m_ahead;

  // One partial row per warp (warp mode) or block, each thread writing its own columns.
  const int64_t chunk = c.warp ? int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32 : blockIdx.x;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int64_t col = (int64_t(k) * c.width + c.lane) * V;
    if (col < n) {
      if (acc.dw) acc.flush(acc.dw, k, partial_dw + chunk * n + col);
      if (acc.db) acc.flush(acc.db, k, partial_db + chunk * n + col);
    }
  }
}

// dw[col] = sum over chunks of partial_dw[chunk, col] (blockIdx.y == 0), db likewise
// (blockIdx.y == 1), in chunk order. Blocks of kParamColumns columns x kParamLanes chunk lanes,
// each lane summing chunks lane, lane + kParamLanes, ... then the lanes added in order in shared
// memory. Reads the partials once, coalesced along a row.
constexpr int kParamColumns = RAWOPS_NORM_PARAM_GRAD_COLUMNS, kParamLanes = RAWOPS_NORM_PARAM_GRAD_LANES;
template <typename T>
__device__ __forceinline__ void norm_param_grad(const float* __restrict__ partial_dw,
                                                const float* __restrict__ partial_db, T* __restrict__ dw,
                                                T* __restrict__ db, int64_t chunks, int64_t n) {
  const float* partial = blockIdx.y == 0 ? partial_dw : partial_db;
  T* out = blockIdx.y == 0 ? dw : db;
  if (out == nullptr) return;
  __shared__ float lanes[kParamLanes][kParamColumns + 1];  // + 1: a lane's column in another bank
  const int tx = threadIdx.x % kParamColumns, ty = threadIdx.x / kParamColumns;
  const int64_t col = int64_t(blockIdx.x) * kParamColumns + tx;
  // Loads issued 8 at a time, added in the same order (the same bits as one at a time); no
  // faster than the plain loop where measured (docs/performance.md).
  constexpr int kBatch = 8;
  float acc = 0.f;
  if (col < n) {
    int64_t k = ty;
    for (; k + (kBatch - 1) * kParamLanes < chunks; k += kBatch * kParamLanes) {
      float v[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i) v[i] = __ldcs(partial + (k + i * kParamLanes) * n + col);  // read once
#pragma unroll
      for (int i = 0; i < kBatch; ++i) acc += v[i];
    }
    for (; k < chunks; k += kParamLanes) acc += __ldcs(partial + k * n + col);
  }
  lanes[ty][tx] = acc;
  __syncthreads();
  if (ty == 0 && col < n) {
    float total = 0.f;
#pragma unroll
    for (int l = 0; l < kParamLanes; ++l) total += lanes[l][tx];
    out[col] = from_float<T>(total);
  }
}

}  // namespace
}  // namespace rawops

// `vec` carries flags (RAWOPS_NORM_FLAG_*): 16-byte rows, weight given, bias given. Absent
// weight / bias still arrive as valid pointers (x): nvcc hoists their loop-invariant loads
// above the `has_w` test (seen in SASS: a null bias faulted), so a null pointer is unsafe.
// The *_stride arguments: each operand's row stride in elements (rows.cuh).
#define RAWOPS_NORM(name, RMS, T, suffix, FWD_MIN_BLOCKS, BWD_MIN_BLOCKS)                                      \
  extern "C" __global__ void __launch_bounds__(rawops::kMaxRowThreads, FWD_MIN_BLOCKS)                         \
      name##_fwd_##suffix(const T* x, const T* w, const T* b, T* y, float* mean, float* rstd, long long rows,  \
                          long long n, long long x_stride, long long y_stride, long long mode, long long vec,  \
                          float eps) {                                                                         \
    rawops::norm_fwd<T, RMS>(x, w, b, y, mean, rstd, rows, n, x_stride, y_stride, eps, int(mode),             \
                             vec & RAWOPS_NORM_FLAG_VECTORS, vec & RAWOPS_NORM_FLAG_WEIGHT,                   \
                             vec & RAWOPS_NORM_FLAG_BIAS);                                                     \
  }                                                                                                            \
  extern "C" __global__ void __launch_bounds__(rawops::kMaxRowThreads, BWD_MIN_BLOCKS)                         \
      name##_bwd_##suffix(const T* dy, const T* x, const T* w, const float* mean, const float* rstd, T* dx,    \
                          float* partial_dw, float* partial_db, long long rows, long long n, long long dy_stride, \
                          long long x_stride, long long dx_stride, long long mode, long long vec) {            \
    rawops::norm_bwd<T, RMS>(dy, x, w, mean, rstd, dx, partial_dw, partial_db, rows, n, dy_stride, x_stride,  \
                             dx_stride, int(mode), vec & RAWOPS_NORM_FLAG_VECTORS,                            \
                             vec & RAWOPS_NORM_FLAG_WEIGHT, {}, int(vec >> RAWOPS_NORM_STAGES_SHIFT) & 3);  \
  }

#define RAWOPS_NORM_FAMILY(T, suffix, FWD_MIN_BLOCKS, LN_BWD_MIN_BLOCKS, RMS_BWD_MIN_BLOCKS)            \
  RAWOPS_NORM(layer_norm, false, T, suffix, FWD_MIN_BLOCKS, LN_BWD_MIN_BLOCKS)                         \
  RAWOPS_NORM(rms_norm, true, T, suffix, FWD_MIN_BLOCKS, RMS_BWD_MIN_BLOCKS)                           \
  extern "C" __global__ void __launch_bounds__(rawops::kParamColumns * rawops::kParamLanes)             \
      norm_param_grad_##suffix(const float* partial_dw, const float* partial_db, T* dw, T* db,         \
                               long long chunks, long long n) {                                        \
    rawops::norm_param_grad(partial_dw, partial_db, dw, db, chunks, n);                                \
  }

// Register bounds (blocks of 512 per SM; 2 = 64 registers a thread, 1 = what ptxas picks up
// to 128); the backward's grid is what the occupancy API then reports (rawops/norm.py). The
// 16-bit rms_norm backward runs faster with the registers it asks for, layer_norm's at 64
// (docs/performance.md); bfloat16's forward fits 64 with its row held as 32-bit words.
// add_rms_norm's entries: rms_norm's with the residual operands after the row operands. d_residual_out
// is optional (flag RAWOPS_NORM_FLAG_ADD; absent, any valid pointer). The backward's bound: float32's
// rms_norm's; the 16-bit types' RAWOPS_ROW_BWD_MAX_REGISTERS (__maxnreg__: under (512, 1) the bulk
// path's third operand took 96 registers, two 256-thread blocks an SM).
#define RAWOPS_ADD_RMS_NORM(T, suffix, BWD_BOUNDS)                                                           \
  extern "C" __global__ void __launch_bounds__(rawops::kMaxRowThreads, rawops::kMinRowBlocks)                    \
      add_rms_norm_fwd_##suffix(const T* x, const T* residual, const T* w, T* y, T* residual_out, float* rstd,   \
                                long long rows, long long n, long long x_stride, long long residual_stride,     \
                                long long y_stride, long long residual_out_stride, long long mode,              \
                                long long vec, float eps) {                                                     \
    const rawops::ResidualAdd<T> add{residual, residual_out, residual_stride, residual_out_stride};             \
    rawops::norm_fwd<T, true, true>(x, w, w, y, rstd, rstd, rows, n, x_stride, y_stride, eps, int(mode),        \
                                    vec & RAWOPS_NORM_FLAG_VECTORS, vec & RAWOPS_NORM_FLAG_WEIGHT, false, add); \
  }                                                                                                             \
  extern "C" __global__ void BWD_BOUNDS                                                                          \
      add_rms_norm_bwd_##suffix(const T* dy, const T* h, const T* w, const float* rstd, const T* d_residual_out, \
                                T* dx, float* partial_dw, long long rows, long long n, long long dy_stride,      \
                                long long h_stride, long long d_residual_out_stride, long long dx_stride,         \
                                long long mode, long long vec) {                                                 \
    const rawops::GradAdd<T> add{d_residual_out, d_residual_out_stride, (vec & RAWOPS_NORM_FLAG_ADD) != 0};     \
    rawops::norm_bwd<T, true, true>(dy, h, w, rstd, rstd, dx, partial_dw, nullptr, rows, n, dy_stride, h_stride, \
                                    dx_stride, int(mode), vec & RAWOPS_NORM_FLAG_VECTORS,                        \
                                    vec & RAWOPS_NORM_FLAG_WEIGHT, add, int(vec >> RAWOPS_NORM_STAGES_SHIFT) & 3); \
  }

// The 16-bit layer_norm backward of full rows: layer_norm_bwd_<suffix>'s arguments (mode: block;
// the vector flag set, no stages).
#define RAWOPS_LN_BWD_FULL(T, suffix)                                                                         \
  extern "C" __global__ void __launch_bounds__(rawops::kMaxRowThreads, rawops::kMinRowBlocks)                 \
      layer_norm_bwd_full_##suffix(const T* dy, const T* x, const T* w, const float* mean, const float* rstd, \
                                   T* dx, float* partial_dw, float* partial_db, long long rows, long long n,   \
                                   long long dy_stride, long long x_stride, long long dx_stride,              \
                                   long long mode, long long vec) {                                           \
    (void)mode;                                                                                               \
    rawops::layer_norm_bwd_full_rows<T>(dy, x, w, mean, rstd, dx, partial_dw, partial_db, rows, n, dy_stride, \
                                        x_stride, dx_stride, vec & RAWOPS_NORM_FLAG_WEIGHT);                  \
  }

RAWOPS_NORM_FAMILY(float, f32, rawops::kMinRowBlocks, rawops::kMinRowBlocks, rawops::kMinRowBlocks)
RAWOPS_NORM_FAMILY(__half, f16, rawops::kMinRowBlocks, rawops::kMinRowBlocks, 1)
RAWOPS_NORM_FAMILY(__nv_bfloat16, bf16, rawops::kMinRowBlocks, rawops::kMinRowBlocks, 1)
RAWOPS_LN_BWD_FULL(__half, f16)
RAWOPS_LN_BWD_FULL(__nv_bfloat16, bf16)
RAWOPS_ADD_RMS_NORM(float, f32, __launch_bounds__(rawops::kMaxRowThreads, rawops::kMinRowBlocks))
RAWOPS_ADD_RMS_NORM(__half, f16, __maxnreg__(RAWOPS_ROW_BWD_MAX_REGISTERS))
RAWOPS_ADD_RMS_NORM(__nv_bfloat16, bf16, __maxnreg__(RAWOPS_ROW_BWD_MAX_REGISTERS))
