// bias_gelu's forward as short tiles, shape variants for bench/explore_bias_map_tiles.py: the
// production file included as is, and a tile kernel (bias_map_tile) instantiated with several
// shapes (threads, rows a tile, rows a thread).
#include "../../kernels/elementwise.cu"

// Session 17: measured no faster than the map kernel (bench/results/explore_bias_map_tiles.md), so
// the kernel lives here only.
namespace rawops {
namespace {
// bias_gelu's forward (the map ops with a row vector but no second operand) as short tiles: a block is
// kRows rows x kThreads * kPer / kRows 16-byte column vectors, each thread one column vector of kPer
// rows (ty, ty + kRows / kPer, ...), its bias vector loaded once, every load issued before the math.
// The map kernel's grid instead finds each 16-byte vector's column by a division and loads the
// bias beside every vector: with erf GELU's math that took bias_gelu erf to 0.92-0.95 of the copy
// ceiling where gelu erf alone reaches 0.97 (H100, session 17). Same signature as the map kernel
// (rows = n / inner, cols = inner; head unused), whole column tiles, 16-byte aligned operands.
template <class Op, typename T, int kThreads, int kRows, int kPer>
__device__ __forceinline__ void bias_map_tile(const T* __restrict__ a, const T* __restrict__ b,
                                              const T* __restrict__ c, T* __restrict__ out, int64_t n,
                                              int64_t cols, float alpha) {
  constexpr int V = Vec16<T>::size, kVecs = kThreads * kPer / kRows, kRowStep = kRows / kPer;
  static_assert(kThreads * kPer % kRows == 0 && kRows % kPer == 0, "whole rows of whole vectors");
  const int64_t rows = n / cols;
  const unsigned col_tiles = unsigned(cols / (kVecs * V));  // whole tiles: the launcher checks
  const unsigned row_tile = blockIdx.x / col_tiles, col_tile = blockIdx.x - row_tile * col_tiles;
  const int tx = threadIdx.x % kVecs, ty = threadIdx.x / kVecs;
  const int64_t row0 = int64_t(row_tile) * kRows + ty, col = (int64_t(col_tile) * kVecs + tx) * V;
  Vec16<T> va[kPer], vb[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k)
    if (row0 + k * kRowStep < rows) {
      va[k] = load16(a + (row0 + k * kRowStep) * cols + col);
      if (Op::B) vb[k] = load16(b + (row0 + k * kRowStep) * cols + col);
    }
  const Vec16<T> vc = load16(c + col);
#pragma unroll
  for (int k = 0; k < kPer; ++k)
    if (row0 + k * kRowStep < rows) {
      Vec16<T> r;
#pragma unroll
      for (int e = 0; e < V; e += 2)
        from_float2<T>(Op::f(to_float(va[k].v[e]), Op::B ? to_float(vb[k].v[e]) : 0.f, to_float(vc.v[e]), alpha),
                       Op::f(to_float(va[k].v[e + 1]), Op::B ? to_float(vb[k].v[e + 1]) : 0.f, to_float(vc.v[e + 1]),
                             alpha),
                       r.v + e);
      store16(out + (row0 + k * kRowStep) * cols + col, r);
    }
}

}  // namespace
}  // namespace rawops

#define RAWOPS_BIAS_MAP_TILE_VARIANT(T, suffix, MODE, Op, THREADS, ROWS, PER)                                  \
  extern "C" __global__ void __launch_bounds__(THREADS)                                                       \
      bias_gelu_##MODE##_fwd_tile_##THREADS##_##ROWS##_##PER##_##suffix(                                      \
          const T* a, const T* b, const T* c, T* out, long long n, long long head, long long inner,           \
          float alpha) {                                                                                      \
    rawops::bias_map_tile<rawops::Op<T>, T, THREADS, ROWS, PER>(a, b, c, out, n, inner, alpha);              \
    (void)head;                                                                                               \
  }
#define RAWOPS_BIAS_MAP_TILE_SHAPES(T, suffix, MODE, Op)                 \
  RAWOPS_BIAS_MAP_TILE_VARIANT(T, suffix, MODE, Op, 128, 16, 1)          \
  RAWOPS_BIAS_MAP_TILE_VARIANT(T, suffix, MODE, Op, 128, 32, 2)          \
  RAWOPS_BIAS_MAP_TILE_VARIANT(T, suffix, MODE, Op, 256, 32, 1)          \
  RAWOPS_BIAS_MAP_TILE_VARIANT(T, suffix, MODE, Op, 256, 64, 2)          \
  RAWOPS_BIAS_MAP_TILE_VARIANT(T, suffix, MODE, Op, 256, 128, 4)         \
  RAWOPS_BIAS_MAP_TILE_VARIANT(T, suffix, MODE, Op, 512, 64, 1)          \
  RAWOPS_BIAS_MAP_TILE_VARIANT(T, suffix, MODE, Op, 512, 128, 2)         \
  RAWOPS_BIAS_MAP_TILE_VARIANT(T, suffix, MODE, Op, 1024, 128, 1)
#define RAWOPS_BIAS_MAP_TILE_TYPES(MODE, Op)                          \
  RAWOPS_BIAS_MAP_TILE_SHAPES(float, f32, MODE, Op)                   \
  RAWOPS_BIAS_MAP_TILE_SHAPES(__half, f16, MODE, Op)                  \
  RAWOPS_BIAS_MAP_TILE_SHAPES(__nv_bfloat16, bf16, MODE, Op)
RAWOPS_BIAS_MAP_TILE_TYPES(tanh, BiasGeluTanh)
RAWOPS_BIAS_MAP_TILE_TYPES(erf, BiasGeluErf)
