// bias_gelu's forward as short tiles, shape variants for bench/explore_bias_map_tiles.py: the
// production file included as is, and its tile kernel (bias_map_tile) instantiated with other
// shapes (threads, rows a tile, rows a thread) than BiasMapTile's.
#include "../../kernels/elementwise.cu"

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
