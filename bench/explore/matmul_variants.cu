// Variants of the matrix family's FFMA kernels for bench/explore_matmul.py: the production
// file included as is, plus extra instantiations timed side by side (not shipped).
#include "../../kernels/matmul.cu"

// small_<features per lane group>_<warps splitting K>_<steps in flight>_<min blocks per SM>
#define SMALL_VARIANT(FL, KS, U, MINB)                                                                    \
  extern "C" __global__ void __launch_bounds__(KS * 32, MINB)                                           \
      small_##FL##_##KS##_##U##_##MINB(RAWOPS_GEMM_ARGS(float)) {                                       \
    rawops::linear_small<float, FL, KS, U>(a, b, c, RAWOPS_EPI(float), m, n, k);                         \
  }
SMALL_VARIANT(1, 4, 6, 4)
SMALL_VARIANT(1, 4, 3, 4)
SMALL_VARIANT(2, 4, 3, 1)
SMALL_VARIANT(2, 4, 3, 3)
SMALL_VARIANT(2, 4, 6, 3)
SMALL_VARIANT(2, 8, 3, 1)
SMALL_VARIANT(2, 2, 6, 3)
SMALL_VARIANT(4, 4, 3, 2)

extern "C" __global__ void __launch_bounds__(256, 2) vec_oldlayout_nn(RAWOPS_GEMM_ARGS(float)) {
  rawops::gemm_simt_vec<true, false, false>(a, b, c, RAWOPS_EPI(float), m, n, k);
}
