// bias_gelu's backward as short tiles, shape variants for bench/explore_bias_bwd_tiles.py: the
// production file included as is, plus the tile kernel with its shape as template parameters
// (threads, rows a tile, rows a thread). The shipped kernel (kernels/elementwise.cu
// bias_bwd_tile, BiasBwdTile) came out of these runs; its comment says what they measured.
#include "../../kernels/elementwise.cu"

namespace rawops {
namespace {

template <class Op, typename T, int kThreads, int kRows, int kPer>
__device__ __forceinline__ void bias_bwd_tile_variant(const T* __restrict__ dy, const T* __restrict__ x,
                                              const T* __restrict__ bias, T* __restrict__ dx,
                                              float* __restrict__ partial, int64_t rows, int64_t cols) {
  // kPer rows a thread (rows ty, ty + kRows / kPer, ...), their loads all issued before the math.
  constexpr int V = 16 / sizeof(T), kVecs = kThreads * kPer / kRows, kWarps = kThreads / 32;
  constexpr int kRowStep = kRows / kPer;
  static_assert(kVecs <= 32 && 32 % kVecs == 0, "a warp holds whole rows of the tile");
  __shared__ float sums[kWarps][kVecs * V];
  allow_dependent_launch();
  // Blocks walk memory in order: the column tiles of row tile 0, then of row tile 1, ...
  const unsigned col_tiles = unsigned(cols / (kVecs * V));  // 32-bit: a 64-bit division is a call
  const unsigned row_tile = blockIdx.x / col_tiles, col_tile = blockIdx.x - row_tile * col_tiles;
  const int tx = threadIdx.x % kVecs, ty = threadIdx.x / kVecs;
  const int64_t row0 = int64_t(row_tile) * kRows + ty, col = (int64_t(col_tile) * kVecs + tx) * V;
  float acc[V];
#pragma unroll
  for (int e = 0; e < V; ++e) acc[e] = 0.f;
  Vec16<T> d[kPer], v[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k)
    if (row0 + k * kRowStep < rows) {
      d[k] = load16(dy + (row0 + k * kRowStep) * cols + col);
      v[k] = load16(x + (row0 + k * kRowStep) * cols + col);
    }
  Vec16<T> b;
  if (Op::C) b = load16(bias + col);
#pragma unroll
  for (int k = 0; k < kPer; ++k)
    if (row0 + k * kRowStep < rows) {
      Vec16<T> out;
#pragma unroll
      for (int e = 0; e < V; ++e) {
        out.v[e] = from_float<T>(Op::f(to_float(d[k].v[e]), to_float(v[k].v[e]), Op::C ? to_float(b.v[e]) : 0.f, 0.f));
        acc[e] += to_float(out.v[e]);
      }
      store16(dx + (row0 + k * kRowStep) * cols + col, out);
    }
  // The warp's rows: lanes tx, tx + kVecs, ... hold the same columns.
#pragma unroll
  for (int step = kVecs; step < 32; step *= 2)
#pragma unroll
    for (int e = 0; e < V; ++e) acc[e] += __shfl_xor_sync(0xffffffffu, acc[e], step);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane < kVecs) {
#pragma unroll
    for (int e = 0; e < V; ++e) sums[warp][lane * V + e] = acc[e];
  }
  __syncthreads();
  for (int c = threadIdx.x; c < kVecs * V; c += kThreads) {
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += sums[w][c];
    partial[int64_t(row_tile) * cols + int64_t(col_tile) * kVecs * V + c] = s;
  }
}

// Staged in session 10, not yet run: the tile kernel with column_sum_final folded in. After its
// partial row, a block takes a ticket for its column tile; the block that draws the last one adds
// that column tile's partial rows in a fixed order (thread group g takes rows g, g + kGroups, ...,
// then the groups in order: deterministic) and writes dbias, then resets the counter for the next
// call (so calls must be stream-ordered: one counter array per stream in a real version). It saves
// the final kernel's launch and its pass over the partials from another grid; the question for the
// H100 is whether the last blocks' tail (64 column tiles x up to 256 partial rows, at the very end)
// costs less than that.
template <class Op, typename T, int kThreads, int kRows, int kPer>
__device__ __forceinline__ void bias_bwd_tile_fused_final(const T* __restrict__ dy, const T* __restrict__ x,
                                                          const T* __restrict__ bias, T* __restrict__ dx,
                                                          float* __restrict__ partial, int64_t rows, int64_t cols,
                                                          unsigned* __restrict__ counters, T* __restrict__ dbias) {
  constexpr int V = 16 / sizeof(T), kCols = kThreads * kPer / kRows * V, kGroups = kThreads / kCols;
  static_assert(kThreads % kCols == 0, "whole thread groups a column");
  __shared__ float group_sums[kGroups][kCols];
  __shared__ unsigned ticket;
  bias_bwd_tile_variant<Op, T, kThreads, kRows, kPer>(dy, x, bias, dx, partial, rows, cols);
  const unsigned col_tiles = unsigned(cols / kCols);
  const unsigned row_tile = blockIdx.x / col_tiles, col_tile = blockIdx.x - row_tile * col_tiles;
  const unsigned row_tiles = unsigned((rows + kRows - 1) / kRows);
  __threadfence();  // this block's partial row, visible to whichever block adds the column tile
  __syncthreads();
  if (threadIdx.x == 0) ticket = atomicAdd(counters + col_tile, 1u);
  __syncthreads();
  if (ticket != row_tiles - 1) return;
  __threadfence();  // every other row tile's partial, visible here
  const int c = threadIdx.x % kCols, g = threadIdx.x / kCols;
  const float* column = partial + int64_t(col_tile) * kCols + c;
  float s = 0.f;
#pragma unroll 8
  for (unsigned r = g; r < row_tiles; r += kGroups) s += __ldcg(column + int64_t(r) * cols);
  group_sums[g][c] = s;
  __syncthreads();
  if (g == 0) {
    float t = 0.f;
#pragma unroll
    for (int k = 0; k < kGroups; ++k) t += group_sums[k][c];
    dbias[int64_t(col_tile) * kCols + c] = from_float<T>(t);
  }
  if (threadIdx.x == 0) counters[col_tile] = 0u;  // the next call starts from zero
  (void)row_tile;
}

}  // namespace
}  // namespace rawops

// MINB: the blocks an SM of the plain kernel (its registers), kept so that the comparison is of
// the fold alone (bf16's 4-row shape went from 76 to 89 registers: 2 blocks instead of 3).
#define RAWOPS_BIAS_BWD_TILE_FF(T, suffix, THREADS, ROWS, PER, MINB)                                          \
  extern "C" __global__ void __launch_bounds__(THREADS, MINB)                                               \
      bias_gelu_tanh_bwd_tile_ff_##THREADS##_##ROWS##_##PER##_##suffix(                                      \
          const T* dy, const T* x, const T* bias, T* dx, float* partial, long long rows, long long cols,     \
          unsigned* counters, T* dbias) {                                                                    \
    rawops::bias_bwd_tile_fused_final<rawops::BiasGeluTanhBwd<T>, T, THREADS, ROWS, PER>(                    \
        dy, x, bias, dx, partial, rows, cols, counters, dbias);                                              \
  }
RAWOPS_BIAS_BWD_TILE_FF(float, f32, 1024, 64, 1, 2)
RAWOPS_BIAS_BWD_TILE_FF(__half, f16, 512, 64, 1, 4)
RAWOPS_BIAS_BWD_TILE_FF(__half, f16, 256, 128, 4, 4)
RAWOPS_BIAS_BWD_TILE_FF(__nv_bfloat16, bf16, 256, 128, 4, 3)

#define RAWOPS_BIAS_BWD_TILE_VARIANT(T, suffix, THREADS, ROWS, PER)                                                   \
  extern "C" __global__ void __launch_bounds__(THREADS)                                                        \
      bias_gelu_tanh_bwd_tile_##THREADS##_##ROWS##_##PER##_##suffix(const T* dy, const T* x, const T* bias,     \
                                                                    T* dx, float* partial, long long rows,     \
                                                                    long long cols) {                          \
    rawops::bias_bwd_tile_variant<rawops::BiasGeluTanhBwd<T>, T, THREADS, ROWS, PER>(dy, x, bias, dx, partial, rows,    \
                                                                             cols);                            \
  }
#define RAWOPS_BIAS_BWD_TILE_VARIANTS(T, suffix)       \
  RAWOPS_BIAS_BWD_TILE_VARIANT(T, suffix, 512, 64, 1)  \
  RAWOPS_BIAS_BWD_TILE_VARIANT(T, suffix, 1024, 64, 1) \
  RAWOPS_BIAS_BWD_TILE_VARIANT(T, suffix, 1024, 128, 1) \
  RAWOPS_BIAS_BWD_TILE_VARIANT(T, suffix, 512, 64, 2)  \
  RAWOPS_BIAS_BWD_TILE_VARIANT(T, suffix, 512, 128, 2) \
  RAWOPS_BIAS_BWD_TILE_VARIANT(T, suffix, 512, 256, 4) \
  RAWOPS_BIAS_BWD_TILE_VARIANT(T, suffix, 256, 128, 4)
RAWOPS_BIAS_BWD_TILE_VARIANTS(float, f32)
RAWOPS_BIAS_BWD_TILE_VARIANTS(__half, f16)
RAWOPS_BIAS_BWD_TILE_VARIANTS(__nv_bfloat16, bf16)
