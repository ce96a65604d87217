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

// small_r<rows>_s<stream W>: the shipped FL=2, KS=4, U=3 with other rows per pass / W loads.
#define SMALL_ROWS_VARIANT(R, WS, MINB)                                                                   \
  extern "C" __global__ void __launch_bounds__(128, MINB) small_r##R##_s##WS(RAWOPS_GEMM_ARGS(float)) {   \
    rawops::linear_small<float, 2, 4, 3, R, WS>(a, b, c, RAWOPS_EPI(float), m, n, k);                   \
  }
SMALL_ROWS_VARIANT(32, true, 3)
SMALL_ROWS_VARIANT(16, false, 4)
SMALL_ROWS_VARIANT(16, true, 4)
extern "C" __global__ void __launch_bounds__(128, 4) small_4_4_3_r16(RAWOPS_GEMM_ARGS(float)) {
  rawops::linear_small<float, 4, 4, 3, 16, true>(a, b, c, RAWOPS_EPI(float), m, n, k);
}

extern "C" __global__ void __launch_bounds__(256, 2) vec_oldlayout_nn(RAWOPS_GEMM_ARGS(float)) {
  rawops::gemm_simt_vec<true, false, false>(a, b, c, RAWOPS_EPI(float), m, n, k);
}

// bf16 small batch: the shipped instantiation spills (368 B at 168 registers); lighter ones.
#define SMALL_BF16_VARIANT(FL, KS, U, MINB)                                                               \
  extern "C" __global__ void __launch_bounds__(KS * 32, MINB)                                           \
      small_bf16_##FL##_##KS##_##U##_##MINB(RAWOPS_GEMM_ARGS(__nv_bfloat16)) {                           \
    rawops::linear_small<__nv_bfloat16, FL, KS, U>(a, b, c, RAWOPS_EPI(__nv_bfloat16), m, n, k);          \
  }
SMALL_BF16_VARIANT(2, 4, 2, 3)
SMALL_BF16_VARIANT(1, 4, 3, 4)
SMALL_BF16_VARIANT(2, 4, 3, 2)
