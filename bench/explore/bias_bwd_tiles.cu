// bias_gelu's backward as short tiles, shape variants for bench/explore_bias_bwd_tiles.py: the
// production file included as is, and its tile kernel (bias_bwd_tile) instantiated with other
// shapes (threads, rows a tile, rows a thread) than BiasBwdTile's. The shipped shapes came out of
// these runs; kernels/elementwise.cu says what they measured.
#include "../../kernels/elementwise.cu"

namespace rawops {
namespace {

// Staged in session 10, not yet run: the tile kernel with column_sum_final folded in. After its
// partial row, a block takes a ticket for its column tile; the block that draws the last one adds
// that column tile's partial rows in a fixed order (thread group g takes rows g, g + kGroups, ...,
// then the groups in order: deterministic) and writes dbias, then resets the counter for the next
// call (so calls must be stream-ordered: one counter array per stream in a real version). It saves
// the final kernel's launch and its pass over the partials from another grid; the question for the
// H100 is whether the last blocks' tail (64 column tiles x up to 256 partial rows, at the very end)
// costs less than that.
// kOneFence (session 11): run 1 of --fused-final (02:22) had every thread fence, which waits for its
// own dx stores to drain: 10-26% slower. With kOneFence only thread 0 fences, after the block's barrier
// (cumulative through bar.sync: cooperative groups' grid sync does the same).
template <class Op, typename T, int kThreads, int kRows, int kPer, bool kOneFence>
__device__ __forceinline__ void bias_bwd_tile_fused_final(const T* __restrict__ dy, const T* __restrict__ x,
                                                          const T* __restrict__ bias, T* __restrict__ dx,
                                                          float* __restrict__ partial, int64_t rows, int64_t cols,
                                                          unsigned* __restrict__ counters, T* __restrict__ dbias) {
  constexpr int V = 16 / sizeof(T), kCols = kThreads * kPer / kRows * V, kGroups = kThreads / kCols;
  static_assert(kThreads % kCols == 0, "whole thread groups a column");
  __shared__ float group_sums[kGroups][kCols];
  __shared__ unsigned ticket;
  bias_bwd_tile<Op, T, kThreads, kRows, kPer>(dy, x, bias, dx, partial, rows, cols);
  const unsigned col_tiles = unsigned(cols / kCols);
  const unsigned row_tile = blockIdx.x / col_tiles, col_tile = blockIdx.x - row_tile * col_tiles;
  const unsigned row_tiles = unsigned((rows + kRows - 1) / kRows);
  if (!kOneFence) __threadfence();  // this block's partial row, visible to whichever block adds the column tile
  __syncthreads();
  if (threadIdx.x == 0) {
    if (kOneFence) __threadfence();
    ticket = atomicAdd(counters + col_tile, 1u);
    if (kOneFence) __threadfence();
  }
  __syncthreads();
  if (ticket != row_tiles - 1) return;
  if (!kOneFence) __threadfence();  // every other row tile's partial, visible here
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
#define RAWOPS_BIAS_BWD_TILE_FF1(T, suffix, THREADS, ROWS, PER, MINB, NAME, ONE)                              \
  extern "C" __global__ void __launch_bounds__(THREADS, MINB)                                               \
      bias_gelu_tanh_bwd_tile_##NAME##_##THREADS##_##ROWS##_##PER##_##suffix(                                \
          const T* dy, const T* x, const T* bias, T* dx, float* partial, long long rows, long long cols,     \
          unsigned* counters, T* dbias) {                                                                    \
    rawops::bias_bwd_tile_fused_final<rawops::BiasGeluTanhBwd<T>, T, THREADS, ROWS, PER, ONE>(               \
        dy, x, bias, dx, partial, rows, cols, counters, dbias);                                              \
  }
#define RAWOPS_BIAS_BWD_TILE_FF(T, suffix, THREADS, ROWS, PER, MINB)      \
  RAWOPS_BIAS_BWD_TILE_FF1(T, suffix, THREADS, ROWS, PER, MINB, ff, false) \
  RAWOPS_BIAS_BWD_TILE_FF1(T, suffix, THREADS, ROWS, PER, MINB, ff1, true)
RAWOPS_BIAS_BWD_TILE_FF(float, f32, 1024, 64, 1, 2)
RAWOPS_BIAS_BWD_TILE_FF(__half, f16, 512, 64, 1, 4)
RAWOPS_BIAS_BWD_TILE_FF(__half, f16, 256, 128, 4, 4)
RAWOPS_BIAS_BWD_TILE_FF(__nv_bfloat16, bf16, 256, 128, 4, 3)

#define RAWOPS_BIAS_BWD_TILE_VARIANT(T, suffix, THREADS, ROWS, PER)                                                   \
  extern "C" __global__ void __launch_bounds__(THREADS)                                                        \
      bias_gelu_tanh_bwd_tile_##THREADS##_##ROWS##_##PER##_##suffix(const T* dy, const T* x, const T* bias,     \
                                                                    T* dx, float* partial, long long rows,     \
                                                                    long long cols) {                          \
    rawops::bias_bwd_tile<rawops::BiasGeluTanhBwd<T>, T, THREADS, ROWS, PER>(dy, x, bias, dx, partial, rows,    \
                                                                             cols);                            \
  }
#define RAWOPS_BIAS_BWD_TILE_VARIANTS(T, suffix)       \
  RAWOPS_BIAS_BWD_TILE_VARIANT(T, suffix, 512, 64, 1)  \
  RAWOPS_BIAS_BWD_TILE_VARIANT(T, suffix, 1024, 64, 1) \
  RAWOPS_BIAS_BWD_TILE_VARIANT(T, suffix, 1024, 128, 1) \
  RAWOPS_BIAS_BWD_TILE_VARIANT(T, suffix, 512, 64, 2)  \
  RAWOPS_BIAS_BWD_TILE_VARIANT(T, suffix, 512, 128, 2) \
  RAWOPS_BIAS_BWD_TILE_VARIANT(T, suffix, 512, 256, 4) \
  RAWOPS_BIAS_BWD_TILE_VARIANT(T, suffix, 256, 128, 4) \
  RAWOPS_BIAS_BWD_TILE_VARIANT(T, suffix, 256, 64, 2)
RAWOPS_BIAS_BWD_TILE_VARIANTS(float, f32)
RAWOPS_BIAS_BWD_TILE_VARIANTS(__half, f16)
RAWOPS_BIAS_BWD_TILE_VARIANTS(__nv_bfloat16, bf16)
