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

}  // namespace
}  // namespace rawops

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
