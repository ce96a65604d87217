// Variants of the matrix family's FFMA kernels for bench/explore_matmul.py: the production
// file included as is, plus extra instantiations timed side by side (not shipped).
#include "../../kernels/matmul.cu"

// gemm_simt_vec with 64 x 32 warp tiles (lanes 8 x 4) instead of the shipped 16 x 16 thread grid.
extern "C" __global__ void __launch_bounds__(256, 2) vec_warptiles_nn(RAWOPS_GEMM_ARGS(float)) {
  rawops::gemm_simt_vec<true, false, true>(a, b, c, RAWOPS_EPI(float), m, n, k);
}


// ============================================================================ v6: small batch on clusters
// Tried for linear_gelu f32 at batch 32 and kept here with its measurements (bench/NOTES.md,
// "Small batch, v6"): K split over the CTAs of a thread-block cluster, partial tiles reduced
// through distributed shared memory.
namespace rawops {
namespace {
// ============================================================================ small batch, float32, sm_90 (v6)
// linear_small_cluster: y = epilogue(x @ W^T) in float32 for up to 32 rows per blockIdx.y, on
// sm_90 thread-block clusters. v5 gave every block all of K, so each of its 128 blocks staged
// all of x (12 MB of L2 reads, more than W's 9.4 MB) before its first FMA, and fed each x value
// it read from shared memory to one feature. v6:
//   - a cluster of C CTAs owns 64 output features; CTA r of it sums the r-th slice of K (96 at
//     K = 768, C = 8), so x is read from L2 once per cluster, not once per block: 384 CTAs of
//     64 threads at 32x768->3072, 3 per SM;
//   - the slice streams through a 3-stage cp.async ring of 32-k chunks (x rows 0..31, then
//     the 64 W rows, 144-byte rows: conflict-free for the reads below), so FMAs start once
//     the first chunk lands;
//   - lane (fg, rg) = (lane % 8, lane / 8) of warp w sums features fg + 8j and rows rg + 4i
//     (8 x 8 in registers) over the k steps w * 4 / WARPS .. of each chunk: per 4 k one
//     16-byte x read feeds 32 FMAs and one W read 32 (a half-warp reads <= 8 distinct vectors);
//   - the warps' partial tiles meet in shared memory, then through distributed shared memory
//     CTA r adds the C x WARPS partials of its 1/C of the 64 x 32 outputs in a fixed order
//     (deterministic) and applies the epilogue.
// Measured (bench/NOTES.md, graph of 20 at 32x768->3072): no faster than v5; not shipped.
constexpr int kClusterFeatures = 64;  // output features per cluster (each CTA's partial tile)
constexpr int kClusterRows = 32;      // rows per blockIdx.y
constexpr int kClusterChunk = 32;     // k per pipeline stage
constexpr int kClusterStages = 3;
constexpr int kClusterStride = kClusterChunk + 4;  // floats per staged row (144 B: 16 mod 128)
constexpr int kClusterStageFloats = (kClusterRows + kClusterFeatures) * kClusterStride;
constexpr int kClusterPartialStride = kClusterFeatures + 8;  // [row][feature]: a warp's stores hit 32 banks
constexpr int kClusterPartialFloats = kClusterRows * kClusterPartialStride;

__device__ __forceinline__ int64_t clamp_last(int64_t i, int64_t count) { return i < count ? i : count - 1; }

// K % 4 == 0 and x, w 16-byte aligned (the Python side checks). gridDim.x = C * ceil(N / 64).
template <int C, int WARPS>
__device__ __forceinline__ void linear_small_cluster(const float* __restrict__ x, const float* __restrict__ w,
                                                     float* __restrict__ y, const Epilogue<float> epi, int64_t M,
                                                     int64_t N, int64_t K) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  static_assert(WARPS * kClusterPartialFloats <= kClusterStages * kClusterStageFloats, "partials reuse the ring");
  constexpr int kThreads = WARPS * 32, kSteps = kClusterChunk / 4 / WARPS;  // 4-k steps per warp per chunk
  constexpr int kLoads = (kClusterRows + kClusterFeatures) * (kClusterChunk / 4) / kThreads;  // cp.async a chunk
  static_assert(kLoads * kThreads == (kClusterRows + kClusterFeatures) * (kClusterChunk / 4), "whole chunks");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* const ring = reinterpret_cast<float*>(smem_raw);  // [stage][x rows, then W rows][kClusterStride]
  float* const partials = ring;                            // [warp][row][kClusterPartialStride], after the FMAs
  const int t = threadIdx.x, lane = t % 32, warp = t / 32, fg = lane % 8, rg = lane / 8;
  const unsigned rank = cluster_rank();
  const int64_t n0 = int64_t(blockIdx.x / C) * kClusterFeatures, row0 = int64_t(blockIdx.y) * kClusterRows;
  // This CTA's slice of K, whole 16-byte vectors; the last slices may be short or empty.
  const int64_t slice = (K + 4 * C - 1) / (4 * C) * 4;
  const int64_t kb = int64_t(rank) * slice < K ? int64_t(rank) * slice : K, ke = kb + slice < K ? kb + slice : K;
  const int chunks = int((ke - kb + kClusterChunk - 1) / kClusterChunk);

  // Chunk c into stage s: 96 rows of 8 vectors. Rows past M or N read the last one (their
  // sums are never stored); k past ke is zero-filled in x and W alike.
  auto load_chunk = [&](int s, int c) {
    float* const st = ring + s * kClusterStageFloats;
    const int64_t k0 = kb + int64_t(c) * kClusterChunk;
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int i = t + u * kThreads, r = i / (kClusterChunk / 4), v = i % (kClusterChunk / 4);
      const int64_t k = k0 + v * 4;
      const float* src = r < kClusterRows ? x + clamp_last(row0 + r, M) * K : w + clamp_last(n0 + r - kClusterRows, N) * K;
      cp_async16(st + r * kClusterStride + v * 4, k < ke ? src + k : x, k < ke);
    }
  };

  float acc[8][8];  // [feature j: fg + 8j][row i: rg + 4i]
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[j][i] = 0.f;

#pragma unroll
  for (int s = 0; s < kClusterStages - 1; ++s) {
    if (s < chunks) load_chunk(s, s);
    cp_async_commit();
  }
  for (int c = 0; c < chunks; ++c) {
    cp_async_wait<kClusterStages - 2>();
    __syncthreads();  // chunk c visible to all; stage (c - 1) % S free for the next load
    if (c + kClusterStages - 1 < chunks) load_chunk((c + kClusterStages - 1) % kClusterStages, c + kClusterStages - 1);
    cp_async_commit();
    const float* const xs = ring + (c % kClusterStages) * kClusterStageFloats;
    const float* const ws = xs + kClusterRows * kClusterStride;
#pragma unroll
    for (int q = 0; q < kSteps; ++q) {
      const int k = (warp * kSteps + q) * 4;
      float4 wv[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) wv[j] = *reinterpret_cast<const float4*>(ws + (fg + 8 * j) * kClusterStride + k);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float4 xv = *reinterpret_cast<const float4*>(xs + (rg + 4 * i) * kClusterStride + k);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          acc[j][i] = fmaf(wv[j].x, xv.x, acc[j][i]);
          acc[j][i] = fmaf(wv[j].y, xv.y, acc[j][i]);
          acc[j][i] = fmaf(wv[j].z, xv.z, acc[j][i]);
          acc[j][i] = fmaf(wv[j].w, xv.w, acc[j][i]);
        }
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the ring is reused for the partial tiles

  float* const mine = partials + warp * kClusterPartialFloats;
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) mine[(rg + 4 * i) * kClusterPartialStride + fg + 8 * j] = acc[j][i];
  cluster_barrier();  // every CTA's partials written and visible cluster-wide

  // CTA `rank` finishes rows [rank * 32 / C, (rank + 1) * 32 / C): 4 adjacent features a thread,
  // summed over the cluster's CTAs, then warps, in order.
  constexpr int kRowsPerCta = kClusterRows / C, kQuads = kClusterFeatures / 4;
  for (int o = t; o < kRowsPerCta * kQuads; o += kThreads) {
    const int row = int(rank) * kRowsPerCta + o / kQuads, f = (o % kQuads) * 4;
    const float* const mine_first = partials + row * kClusterPartialStride + f;
    float4 p[C * WARPS];  // every load in flight before the first add
#pragma unroll
    for (int r = 0; r < C; ++r) {
      const unsigned remote = peer_address(mine_first, r);
#pragma unroll
      for (int ww = 0; ww < WARPS; ++ww) p[r * WARPS + ww] = load_peer_float4(remote + ww * kClusterPartialFloats * 4);
    }
    float sum[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int i = 0; i < C * WARPS; ++i) {
      sum[0] += p[i].x;
      sum[1] += p[i].y;
      sum[2] += p[i].z;
      sum[3] += p[i].w;
    }
    const int64_t m = row0 + row;
    if (m < M) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t n = n0 + f + e;
        if (n < N) y[m * N + n] = epi(sum[e], m, n);
      }
    }
  }
  cluster_barrier();  // no CTA leaves (freeing its shared memory) while a peer still reads it
#else
  __trap();  // the Python side launches it on sm_90 and later only
#endif
}

}  // namespace
}  // namespace rawops

// Clusters of C CTAs along x, WARPS * 32 threads, the 3-stage ring in dynamic shared memory
// (40.5 KB; more caps the CTAs per SM). The cluster shape is compiled in: a plain launch honours it.
#define RAWOPS_SMALL_CLUSTER(name, C, WARPS)                                                          \
  extern "C" __global__ void __launch_bounds__(WARPS * 32) RAWOPS_CLUSTER_DIMS(C)                    \
      name(RAWOPS_GEMM_ARGS(float)) {                                                                   \
    rawops::linear_small_cluster<C, WARPS>(a, b, c, RAWOPS_EPI(float), m, n, k);                        \
  }

// Shapes: 8 CTAs x 2 warps (384 CTAs at N = 3072), 4 warps splitting each chunk's K, clusters
// of 4 (192 CTAs) and of 2 (96 CTAs, 12 chunks each: the deepest stream).
RAWOPS_SMALL_CLUSTER(cluster_c8_w2, 8, 2)
RAWOPS_SMALL_CLUSTER(cluster_c8_w4, 8, 4)
RAWOPS_SMALL_CLUSTER(cluster_c4_w2, 4, 2)
RAWOPS_SMALL_CLUSTER(cluster_c4_w4, 4, 4)
RAWOPS_SMALL_CLUSTER(cluster_c2_w4, 2, 4)

// linear_small_tf32 shapes (C CTAs a cluster, NWN x NWK warps, NT n8 tiles a warp, CTAs per
// SM): features a cluster NWN * NT * 8, K in C * NWK parts (48 of K a warp at K = 768).
// Clusters of 4 (tf32_c4_n2_t6_k4, tf32_c4_n2_t3_k4) measured 15-18 us in the first run (NOTES.md).
// The shipped shape is C1 N1 T3 K16 (128 CTAs of 16 warps, no cluster); C2 N2 T3 K8 (128 CTAs of
// 16 warps, clusters of 2) measured 8.6 us in the second run.
RAWOPS_SMALL_TF32(tf32_c2_n1_t6_k8, 2, 1, 6, 8, 1)   // 128 CTAs of 8 warps, clusters of 2
RAWOPS_SMALL_TF32(tf32_c2_n1_t3_k8, 2, 1, 3, 8, 2)   // 256 CTAs of 8 warps, <= 128 registers
