// Variants of the matrix family's FFMA kernels for bench/explore_matmul.py: the production
// file included as is, plus extra instantiations timed side by side (not shipped).
#include "../../kernels/matmul.cu"

// gemm_simt_vec with 64 x 32 warp tiles (lanes 8 x 4) instead of the shipped 16 x 16 thread grid.
extern "C" __global__ void __launch_bounds__(256, 2) vec_warptiles_nn(RAWOPS_GEMM_ARGS(float)) {
  rawops::gemm_simt_vec<true, false, true>(a, b, c, RAWOPS_EPI(float), m, n, k);
}

