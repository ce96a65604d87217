// Experiment (dev/time_ln_bwd_exp.py), not shipped: the 16-bit layer_norm backward's per-row
// overhead. ncu on the H200 (docs/performance.md): ~600 instructions a thread a row for 16
// elements, of which the element math is ~320; the rest is the row's address arithmetic (64-bit
// row * stride for three operands, a bounds test a vector) and the block reduction (CUB's warp
// reduction, a barrier, CUB's bounded reduction over the warps' sums, a broadcast).
// layer_norm_bwd_exp_<bf16|f16> takes the shipped entry's arguments; rows whose slices are full
// (block mode, 256 threads, n = 256 x kBwdVectors x 8, 16-byte rows) run ln_bwd_full, every
// other launch the shipped norm_bwd. Switches:
//   RAWOPS_EXP_PTR=1  row pointers advanced by step x stride, no bounds tests;
//   RAWOPS_EXP_RED=1  the row sums by an xor butterfly (every lane ends with lane 0's bits, the adds
//                     commute) and the eight warps' sums read by every thread from shared memory
//                     (two 16-byte loads a sum) in CUB's tree order: no second warp reduction, no
//                     broadcast. Both keep the shipped kernel's bits (the script checks dx, dw, db).
#include "../kernels/norm.cu"

#ifndef RAWOPS_EXP_PTR
#define RAWOPS_EXP_PTR 0
#endif
#ifndef RAWOPS_EXP_RED
#define RAWOPS_EXP_RED 0
#endif
#ifndef RAWOPS_EXP_ONLY  // 1: the full path alone (for counting its SASS; wrong for other launches)
#define RAWOPS_EXP_ONLY 0
#endif

namespace rawops {
namespace {

constexpr int kExpThreads = 256;
constexpr int kExpWarps = kExpThreads / 32;

template <typename T, bool PTR, bool RED>
__device__ __forceinline__ void ln_bwd_full(const T* __restrict__ dy, const T* __restrict__ x,
                                            const T* __restrict__ w, const float* __restrict__ mean_in,
                                            const float* __restrict__ rstd_in, T* __restrict__ dx,
                                            float* __restrict__ partial_dw, float* __restrict__ partial_db,
                                            int64_t rows, int64_t n, int64_t dy_stride, int64_t x_stride,
                                            int64_t dx_stride, bool has_w) {
  constexpr int V = Vec16<T>::size;
  constexpr int ITEMS = kBwdVectors;
  constexpr int K = 2;  // sum(g (x - m)), sum(g): the shipped 16-bit rows' two sums
  using Slice = RowSlice<T, ITEMS>;
  __shared__ RowReducer::Storage storage;
  __shared__ __align__(16) float part[2][K][kExpWarps];
  const RowCursor c(kBlockPerRow);
  RowReducer reduce(storage, false);
  extern __shared__ float4 column_smem[];
  const float inv_n = 1.f / float(n);
  const ColumnPartials<T> acc(column_smem, partial_dw != nullptr, partial_db != nullptr);
  float4* free_smem =
      column_smem + ((partial_dw != nullptr) + (partial_db != nullptr)) * ColumnPartials<T>::Q * blockDim.x;
  const uint4* const ws = reinterpret_cast<const uint4*>(free_smem);
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
    float m, rstd;
    if (PTR) {
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        xs.raw[k] = words(load16(xp + k * kw));
        ds.raw[k] = words(load16(dyp + k * kw));
      }
      m = *mp;
      rstd = *rp;
    } else {
      xs.load(x + row * x_stride, c, n);
      ds.load(dy + row * dy_stride, c, n);
      m = mean_in[row];
      rstd = rstd_in[row];
    }
    float sums[K];
    {
      float s1 = 0.f, s2 = 0.f;
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        if (!PTR && !Slice::valid(c, k, n)) break;
        const uint4 wk = has_w ? ws[k * c.width + c.lane] : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const float g = has_w ? __fmul_rn(ds.at(k, e), unpack<T>(wk, e)) : ds.at(k, e);
          s1 += g;
          s2 = fmaf(g, xs.at(k, e) - m, s2);
        }
      }
      sums[0] = s2;
      sums[1] = s1;
    }
    xs.refresh();
    ds.refresh();
    if (RED) {
      const int wid = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
      for (int k = 0; k < K; ++k)
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) sums[k] += __shfl_xor_sync(0xffffffffu, sums[k], o);
      if (lane == 0)
#pragma unroll
        for (int k = 0; k < K; ++k) part[slot][k][wid] = sums[k];
      __syncthreads();
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const float4 a = *reinterpret_cast<const float4*>(&part[slot][k][0]);
        const float4 b = *reinterpret_cast<const float4*>(&part[slot][k][4]);
        sums[k] = ((a.x + a.y) + (a.z + a.w)) + ((b.x + b.y) + (b.z + b.w));
      }
      slot ^= 1;
    } else {
      reduce.reduce(sums, ShuffleSumOp());
    }
    const float row_sums[3] = {0.f, sums[1], sums[0]};
    const NormRowTerms t = NormRowTerms::from<false>(row_sums, rstd, inv_n);
    T* dxr = PTR ? dxp : dx + row * dx_stride + lane0;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int64_t j = int64_t(k) * c.width + c.lane;
      if (!PTR && j * V >= n) break;
      const uint4 wk = has_w ? ws[j] : make_uint4(0, 0, 0, 0);
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
      store16(dxr + k * kw, out);
    }
    if (PTR) {
      xp += x_step;
      dyp += dy_step;
      dxp += dx_step;
      mp += c.step;
      rp += c.step;
    }
  }
  const int64_t chunk = blockIdx.x;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int64_t col = (int64_t(k) * c.width + c.lane) * V;
    if (acc.dw) acc.flush(acc.dw, k, partial_dw + chunk * n + col);
    if (acc.db) acc.flush(acc.db, k, partial_db + chunk * n + col);
  }
}

}  // namespace
}  // namespace rawops

#define RAWOPS_LN_BWD_EXP(T, suffix)                                                                           \
  extern "C" __global__ void __launch_bounds__(rawops::kMaxRowThreads, rawops::kMinRowBlocks)                  \
      layer_norm_bwd_exp_##suffix(const T* dy, const T* x, const T* w, const float* mean, const float* rstd,  \
                                  T* dx, float* partial_dw, float* partial_db, long long rows, long long n,    \
                                  long long dy_stride, long long x_stride, long long dx_stride, long long mode, \
                                  long long vec) {                                                             \
    constexpr int V = rawops::Vec16<T>::size;                                                                  \
    const bool full = mode == rawops::kBlockPerRow && blockDim.x == rawops::kExpThreads &&                      \
                      n == int64_t(rawops::kExpThreads) * rawops::kBwdVectors * V &&                           \
                      (vec & RAWOPS_NORM_FLAG_VECTORS) && (vec >> RAWOPS_NORM_STAGES_SHIFT) == 0;              \
    if (full) {                                                                                                \
      rawops::ln_bwd_full<T, RAWOPS_EXP_PTR != 0, RAWOPS_EXP_RED != 0>(                                        \
          dy, x, w, mean, rstd, dx, partial_dw, partial_db, rows, n, dy_stride, x_stride, dx_stride,           \
          vec & RAWOPS_NORM_FLAG_WEIGHT);                                                                      \
    } else if (!RAWOPS_EXP_ONLY) {                                                                             \
      rawops::norm_bwd<T, false>(dy, x, w, mean, rstd, dx, partial_dw, partial_db, rows, n, dy_stride,         \
                                 x_stride, dx_stride, int(mode), vec & RAWOPS_NORM_FLAG_VECTORS,               \
                                 vec & RAWOPS_NORM_FLAG_WEIGHT, {}, int(vec >> RAWOPS_NORM_STAGES_SHIFT) & 3); \
    }                                                                                                          \
  }

RAWOPS_LN_BWD_EXP(__half, f16)
RAWOPS_LN_BWD_EXP(__nv_bfloat16, bf16)
