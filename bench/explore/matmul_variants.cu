// Variants of the matrix family's FFMA kernels for bench/explore_matmul.py: the production
// file included as is, plus extra instantiations timed side by side (not shipped).
#include "../../kernels/matmul.cu"

// gemm_simt_vec with 64 x 32 warp tiles (lanes 8 x 4) instead of the shipped 16 x 16 thread grid.
extern "C" __global__ void __launch_bounds__(256, 2) vec_warptiles_nn(RAWOPS_GEMM_ARGS(float)) {
  rawops::gemm_simt_vec<true, false, true>(a, b, c, RAWOPS_EPI(float), m, n, k);
}


// linear_small_cluster (v6) shapes beside the shipped C = 8, WARPS = 2: 4 warps splitting each
// chunk's K (more warps per SM, twice the partial tiles), clusters of 4 (192 CTAs) and of 2
// (96 CTAs, 12 chunks each: the deepest stream).
RAWOPS_SMALL_CLUSTER(cluster_c8_w4, 8, 4)
RAWOPS_SMALL_CLUSTER(cluster_c4_w2, 4, 2)
RAWOPS_SMALL_CLUSTER(cluster_c4_w4, 4, 4)
RAWOPS_SMALL_CLUSTER(cluster_c2_w4, 2, 4)
