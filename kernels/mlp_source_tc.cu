// MLP family, the source network on the tensor pipe: the float32 network 100-128-64-10 with ReLU
// (fused_mlp in float32) at large batches on sm_80+ (config.mlp_tf32, the default), its forwards
// and its backward, in 3xTF32 with float32's accuracy. The FFMA kernels, the small-batch forward
// and the network's shapes: kernels/mlp_source.cu; rawops/mlp.py picks between them
// (source_on_tensor_cores). The weight gradients' partials are summed by mlp_wgrad_reduce_bwd_f32
// (kernels/mlp_tiles.cu).
#include "rawops/dtype.cuh"
#include "rawops/mma_sync.cuh"
#include "rawops/mlp.cuh"

namespace rawops {
namespace {

constexpr int kIn = RAWOPS_MLP_SOURCE_IN, kH1 = RAWOPS_MLP_SOURCE_H1, kH2 = RAWOPS_MLP_SOURCE_H2,
              kOut = RAWOPS_MLP_SOURCE_OUT;
constexpr int64_t kOutputRelu = kActRelu;  // flags: the output activation's code, none or ReLU

__device__ __forceinline__ float masked(float v, const float* m, int64_t i) {
  return (m == nullptr || m[i] > 0.f) ? v : 0.f;
}

}  // namespace
}  // namespace rawops

// =====================================================================================
// The source network at large batches on the tensor pipe: source_mlp_tc{32,16}_fwd_f32, 3xTF32
// through mma.sync m16n8k8 (sm_80+; h1s and h2s, when given, get the post-ReLU activations for the
// backward). Same arguments as source_mlp_fwd_f32. Each product is big_a big_b + big_a small_b +
// small_a big_b (big = tf32(v), small = v - big: split_tf32_fast), the three summed by the tensor
// core from zero a k8 slice at a time and added to the accumulators in float32 (promoted): summed
// by the tensor core over all of K instead, its truncating adds gave 6.8x torch's float32 error;
// promoted, 0.8-0.9x.
// Why this shape: operands read as fragments from shared memory would be split after every load,
// and the split costs as much as the FFMA it replaces; here a warp owns kRows = 16 kMT rows and
// walks all three layers with its activations in registers. K is permuted inside each k8
// slice (A slot t <- column 2t, slot t + 4 <- column 2t + 1; B the same), so the C fragment
// of an n8 tile (columns 2t, 2t + 1 of rows g, g + 8), plus bias, ReLU and split, is the A
// fragment of one k8 slice of the next layer, and a lane's two B values are adjacent floats
// of a weight row: one 8-byte load from the resident [out][in] rows (row strides = 8 mod 32
// floats: conflict-free). Layer 1 runs in column chunks of kC, each chunk fed into layer 2's
// accumulators at once (registers stay bounded). x is staged per warp by cp.async (zero-
// filled to K = 104 and past the batch), the next tile's fetch issued once layer 1 has read
// it. Weights (93.5 KB, float) resident per block, split when loaded into fragments;
// persistent warps, no block barrier after the weight load. Launch: at most one block an SM, as
// many warps as fit (up to the entry's launch bounds), kStX floats of weights and biases then
// kRows x kStLdx floats of x per warp of dynamic shared memory (rawops/_mlp_plans.py:
// source_tc_smem).
// =====================================================================================
namespace rawops {
namespace {

constexpr int kStK1 = 104;                                   // layer 1's K: 100 padded to 13 k8 slices
constexpr int kStLd1 = RAWOPS_MLP_SOURCE_TC_LD1, kStLd2 = RAWOPS_MLP_SOURCE_TC_LD2,  // weight row strides
              kStLd3 = RAWOPS_MLP_SOURCE_TC_LD3;                                    // (floats), all 8 mod 32
constexpr int kStLdx = RAWOPS_MLP_SOURCE_TC_LDX;                                    // x staging rows (8 mod 32 too)
constexpr int kStW2 = kH1 * kStLd1, kStW3 = kStW2 + kH2 * kStLd2, kStB1 = kStW3 + 16 * kStLd3;
constexpr int kStB2 = kStB1 + kH1, kStB3 = kStB2 + kH2, kStX = kStB3 + 16;  // 23,376 floats = 93,504 bytes
static_assert(kStX % 4 == 0 && kStLdx % 4 == 0, "x staging rows 16-byte aligned");
static_assert(kStLd1 % 32 == 8 && kStLd2 % 32 == 8 && kStLd3 % 32 == 8 && kStLdx % 32 == 8, "conflict-free");

__device__ __forceinline__ void cp_async4(unsigned dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

__device__ __forceinline__ float2 lds2(const float* p) { return *reinterpret_cast<const float2*>(p); }

// relu(v + b), NaN kept (torch.relu): one max.NaN (sm_80+) instead of relu()'s compare and select.
__device__ __forceinline__ float bias_relu(float v, float b) {
  float r = v + b;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("max.NaN.f32 %0, %0, 0f00000000;\n" : "+f"(r));
#endif
  return r;
}

// A fragment of one k8 slice, split: a0 = (row g, column 2t), a1 = (g + 8, 2t), a2 = (g, 2t + 1),
// a3 = (g + 8, 2t + 1) in the permuted order.
struct SplitA {
  unsigned big[4], small[4];
  __device__ __forceinline__ void set(float a0, float a1, float a2, float a3) {
    const float v[4] = {a0, a1, a2, a3};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const Tf32Split s = split_tf32_fast(v[i]);
      big[i] = s.big;
      small[i] = s.small;
    }
  }
  // The next layer's A fragment from C fragment c (c0, c1 at row g; c2, c3 at row g + 8): the
  // permuted K puts columns 2t, 2t + 1 in slots t, t + 4.
  __device__ __forceinline__ void set_c(const float (&c)[4]) { set(c[0], c[2], c[1], c[3]); }
};

// d[m][n] += a[m] B for one k8 slice and n8 tile, w the lane's address in the tile's B rows
// ([n][k]: row g, column 2t of the slice; the forward's weights as they are, W^T for the
// backward's chain): one 8-byte load, split once for the kMT row tiles; the slice's sum promoted.
template <int kMT, int kN>
__device__ __forceinline__ void mma_slice(float (&d)[kMT][kN][4], int n, const SplitA (&a)[kMT], const float* w) {
  const float2 v = lds2(w);
  const Tf32Split s0 = split_tf32_fast(v.x), s1 = split_tf32_fast(v.y);
#pragma unroll
  for (int m = 0; m < kMT; ++m)
    mma_m16n8k8_tf32x3_promoted(d[m][n], a[m].big, a[m].small, s0.big, s1.big, s0.small, s1.small);
}

// Rows r and r + 8 of a [batch][ld] float32 array at columns col, col + 1 (a C fragment's lane:
// c0, c1 at row r, c2, c3 at r + 8): stored, or loaded (0 past the batch).
__device__ __forceinline__ void store_pair_rows(float* a, int ld, int64_t r, int col, int64_t batch, float c0,
                                                float c1, float c2, float c3) {
  if (r < batch) *reinterpret_cast<float2*>(a + r * ld + col) = make_float2(c0, c1);
  if (r + 8 < batch) *reinterpret_cast<float2*>(a + (r + 8) * ld + col) = make_float2(c2, c3);
}
__device__ __forceinline__ void load_pair_rows(const float* a, int ld, int64_t r, int col, int64_t batch,
                                               float (&c)[4]) {
  const float2 lo = r < batch ? __ldg(reinterpret_cast<const float2*>(a + r * ld + col)) : make_float2(0.f, 0.f);
  const float2 hi = r + 8 < batch ? __ldg(reinterpret_cast<const float2*>(a + (r + 8) * ld + col))
                                  : make_float2(0.f, 0.f);
  c[0] = lo.x;
  c[1] = lo.y;
  c[2] = hi.x;
  c[3] = hi.y;
}

// The warp's kRows x rows into its staging rows [kRows][kStLdx]: 16-byte cp.async when x is
// 16-byte aligned (rows are 400 bytes), else 4-byte; columns 100..103 and rows past the batch zero.
template <int kRows>
__device__ __forceinline__ void source_fetch_x(float* xs, const float* __restrict__ xt, int rows_valid, bool vec,
                                               int lane) {
  const unsigned base = smem_addr(xs);
  if (vec) {
    constexpr int kCpr = kStK1 / 4;  // 26 chunks a row, the last one zeros
    for (int e = lane; e < kRows * kCpr; e += 32) {
      const int r = e / kCpr, c = (e - r * kCpr) * 4;
      const bool ok = r < rows_valid && c < kIn;
      cp_async16(base + 4u * unsigned(r * kStLdx + c), ok ? xt + r * kIn + c : xt, ok ? 16 : 0);
    }
  } else {
    for (int e = lane; e < kRows * kStK1; e += 32) {
      const int r = e / kStK1, c = e - r * kStK1;
      const bool ok = r < rows_valid && c < kIn;
      cp_async4(base + 4u * unsigned(r * kStLdx + c), ok ? xt + r * kIn + c : xt, ok ? 4 : 0);
    }
  }
  cp_async_commit();
}

template <int kMT, int kC>
__device__ void source_tc_fwd(const float* __restrict__ x, const float* __restrict__ w1, const float* __restrict__ b1,
                              const float* __restrict__ w2, const float* __restrict__ b2,
                              const float* __restrict__ w3, const float* __restrict__ b3, float* __restrict__ y,
                              float* __restrict__ h1s, float* __restrict__ h2s, int64_t batch, int64_t flags) {
  constexpr int kRows = 16 * kMT, kJ = kC / 8;
  static_assert(kH1 % kC == 0 && kC % 8 == 0, "layer-1 chunks of whole n8 tiles");
  extern __shared__ __align__(128) unsigned char tc_smem[];
  float* sm = reinterpret_cast<float*>(tc_smem);
  // Weights [out][in] with zero padding (W1 columns 100..103 meet x's zero columns; W3 rows
  // 10..15 give the unused output columns), then the biases.
  for (int e = threadIdx.x; e < kH1 * kStLd1; e += blockDim.x) {
    const int u = e / kStLd1, k = e - u * kStLd1;
    sm[e] = k < kIn ? __ldg(w1 + u * kIn + k) : 0.f;
  }
  for (int e = threadIdx.x; e < kH2 * kStLd2; e += blockDim.x) {
    const int u = e / kStLd2, k = e - u * kStLd2;
    sm[kStW2 + e] = k < kH1 ? __ldg(w2 + u * kH1 + k) : 0.f;
  }
  for (int e = threadIdx.x; e < 16 * kStLd3; e += blockDim.x) {
    const int u = e / kStLd3, k = e - u * kStLd3;
    sm[kStW3 + e] = (u < kOut && k < kH2) ? __ldg(w3 + u * kH2 + k) : 0.f;
  }
  for (int e = threadIdx.x; e < kH1 + kH2 + 16; e += blockDim.x)
    sm[kStB1 + e] = e < kH1 ? __ldg(b1 + e) : e < kH1 + kH2 ? __ldg(b2 + e - kH1) : e - kH1 - kH2 < kOut ? __ldg(b3 + e - kH1 - kH2) : 0.f;
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int g = lane / 4, t = lane % 4;
  float* xs = sm + kStX + warp * kRows * kStLdx;
  const float* xa = xs + g * kStLdx + 2 * t;  // the lane's A reads: rows 16 m + g (+ 8), columns 8 kk + 2t (+ 1)
  const float* w1b = sm + g * kStLd1 + 2 * t;  // its B reads: row (unit) g of each n8 tile, the same columns
  const float* w2b = sm + kStW2 + g * kStLd2 + 2 * t;
  const float* w3b = sm + kStW3 + g * kStLd3 + 2 * t;
  const bool xvec = reinterpret_cast<size_t>(x) % 16 == 0;
  const bool yvec = reinterpret_cast<size_t>(y) % 8 == 0;
  const bool out_relu = flags & kOutputRelu;

  // Tiles dealt warp-major (as the fast forward): a last partial round lands on a few warps of every SM.
  const int64_t tiles = (batch + kRows - 1) / kRows, step = int64_t(gridDim.x) * warps;
  int64_t tile = int64_t(warp) * gridDim.x + blockIdx.x;
  auto rows_of = [&](int64_t tl) { return int(batch - tl * kRows < kRows ? batch - tl * kRows : kRows); };
  if (tile < tiles) source_fetch_x<kRows>(xs, x + tile * kRows * kIn, rows_of(tile), xvec, lane);
  for (; tile < tiles; tile += step) {
    const int64_t row0 = tile * kRows;
    cp_async_wait_all();
    __syncwarp();  // every lane's x rows landed

    float acc2[kMT][kH2 / 8][4];
#pragma unroll
    for (int m = 0; m < kMT; ++m)
#pragma unroll
      for (int n = 0; n < kH2 / 8; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc2[m][n][i] = 0.f;
#pragma unroll 1
    for (int c0 = 0; c0 < kH1; c0 += kC) {
      // Layer 1, columns c0 .. c0 + kC: 13 k8 slices of the staged x.
      float acc1[kMT][kJ][4];
#pragma unroll
      for (int m = 0; m < kMT; ++m)
#pragma unroll
        for (int j = 0; j < kJ; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc1[m][j][i] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kStK1 / 8; ++kk) {
        SplitA a[kMT];
#pragma unroll
        for (int m = 0; m < kMT; ++m) {
          const float2 lo = lds2(xa + 16 * m * kStLdx + 8 * kk), hi = lds2(xa + (16 * m + 8) * kStLdx + 8 * kk);
          a[m].set(lo.x, hi.x, lo.y, hi.y);
        }
#pragma unroll
        for (int j = 0; j < kJ; ++j) mma_slice(acc1, j, a, w1b + (c0 + 8 * j) * kStLd1 + 8 * kk);
      }
      if (c0 + kC == kH1) {
        __syncwarp();  // every lane has read its x rows: the next tile's fetch may overwrite them
        if (tile + step < tiles)
          source_fetch_x<kRows>(xs, x + (tile + step) * kRows * kIn, rows_of(tile + step), xvec, lane);
      }
      // Bias, ReLU (kept for the backward when training), split: each n8 tile of the chunk is one
      // k8 slice of layer 2.
#pragma unroll
      for (int j = 0; j < kJ; ++j) {
        const float2 bb = lds2(sm + kStB1 + c0 + 8 * j + 2 * t);
        SplitA a[kMT];
#pragma unroll
        for (int m = 0; m < kMT; ++m) {
          const float* c = acc1[m][j];
          const float v0 = bias_relu(c[0], bb.x), v1 = bias_relu(c[1], bb.y), v2 = bias_relu(c[2], bb.x),
                      v3 = bias_relu(c[3], bb.y);
          if (h1s != nullptr)
            store_pair_rows(h1s, kH1, row0 + 16 * m + g, c0 + 8 * j + 2 * t, batch, v0, v1, v2, v3);
          a[m].set(v0, v2, v1, v3);
        }
#pragma unroll
        for (int n = 0; n < kH2 / 8; ++n) mma_slice(acc2, n, a, w2b + 8 * n * kStLd2 + c0 + 8 * j);
      }
    }

    // Layer 3: 8 k8 slices from layer 2's accumulators, 2 n8 tiles (columns 10..15 unused).
    float acc3[kMT][2][4] = {};
#pragma unroll
    for (int kk = 0; kk < kH2 / 8; ++kk) {
      const float2 bb = lds2(sm + kStB2 + 8 * kk + 2 * t);
      SplitA a[kMT];
#pragma unroll
      for (int m = 0; m < kMT; ++m) {
        const float* c = acc2[m][kk];
        const float v0 = bias_relu(c[0], bb.x), v1 = bias_relu(c[1], bb.y), v2 = bias_relu(c[2], bb.x),
                    v3 = bias_relu(c[3], bb.y);
        if (h2s != nullptr) store_pair_rows(h2s, kH2, row0 + 16 * m + g, 8 * kk + 2 * t, batch, v0, v1, v2, v3);
        a[m].set(v0, v2, v1, v3);
      }
#pragma unroll
      for (int n = 0; n < 2; ++n) mma_slice(acc3, n, a, w3b + 8 * n * kStLd3 + 8 * kk);
    }
    // y: lane holds columns 8n + 2t, + 1 of rows 16 m + g (+ 8).
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      const int col = 8 * n + 2 * t;
      if (col >= kOut) continue;
      const float2 bb = lds2(sm + kStB3 + col);
#pragma unroll
      for (int m = 0; m < kMT; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t r = row0 + 16 * m + g + 8 * h;
          if (r >= batch) continue;
          float v0 = acc3[m][n][2 * h] + bb.x, v1 = acc3[m][n][2 * h + 1] + bb.y;
          if (out_relu) {
            v0 = relu(v0);
            v1 = relu(v1);
          }
          float* p = y + r * kOut + col;
          if (yvec) {
            *reinterpret_cast<float2*>(p) = make_float2(v0, v1);
          } else {
            p[0] = v0;
            p[1] = v1;
          }
        }
    }
  }
  cp_async_wait_all();  // nothing may be in flight into shared memory when the block exits
}

// ---------------------------------------------------------------- the backward on the tensor pipe
// source_mlp_tc_dgrad_bwd_f32: the chain g2 = (g3 W3) * (h2 > 0), g1 = (g2 W2) * (h1 > 0), with
// g3 = dy * (y > 0) under the output ReLU (ym = y; then g3 is written to g3s [batch][10] too), else
// dy, written to g2s [batch][64] and g1s [batch][128] for the weight gradients (torch's threshold_backward: a NaN h masks to 0). As the
// forward: a warp owns 16 rows through both products, 3xTF32 with each k8 slice promoted, a C
// fragment of g2 (masked) the A fragment of one k8 slice of the next product; B = W^T, staged once
// a block: w3t [64][kLdW3T] (W3's 10 rows zero-padded to 16 columns), w2t [128][kLdW2T] (47 KB of
// static shared memory). h and the stores: 8-byte pairs of a row, 32 bytes a row a quad of lanes;
// a tile's loads all issued before its products. Persistent warps (8 a block, up to 255 registers:
// the loads in flight), tiles of 16 rows dealt warp-major.
constexpr int kLdW3T = 40, kLdW2T = 72;  // 8 mod 32: conflict-free 8-byte B reads
static_assert(kLdW3T % 32 == 8 && kLdW2T % 32 == 8 && kLdW3T >= 16 && kLdW2T >= kH2, "B rows");
static_assert((kH2 * kLdW3T + kH1 * kLdW2T) * 4 <= 48 * 1024, "static shared memory limit");

__device__ __forceinline__ float relu_mask(float g, float h) { return h > 0.f ? g : 0.f; }

__device__ void source_tc_dgrad(const float* __restrict__ dy, const float* __restrict__ ym,
                                const float* __restrict__ w3, const float* __restrict__ w2,
                                const float* __restrict__ h2s, const float* __restrict__ h1s, float* __restrict__ g3s,
                                float* __restrict__ g2s, float* __restrict__ g1s, int64_t batch) {
  __shared__ __align__(16) float w3t[kH2 * kLdW3T];
  __shared__ __align__(16) float w2t[kH1 * kLdW2T];
  for (int e = threadIdx.x; e < kH2 * kLdW3T; e += blockDim.x) {
    const int u = e / kLdW3T, o = e - u * kLdW3T;  // w3t[u][o] = W3[o][u]
    w3t[e] = o < kOut ? __ldg(w3 + o * kH2 + u) : 0.f;
  }
  for (int e = threadIdx.x; e < kH1 * kLdW2T; e += blockDim.x) {
    const int u = e / kLdW2T, k = e - u * kLdW2T;  // w2t[u][k] = W2[k][u]
    w2t[e] = k < kH2 ? __ldg(w2 + k * kH1 + u) : 0.f;
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int g = lane / 4, t = lane % 4;
  const float* w3b = w3t + g * kLdW3T + 2 * t;
  const float* w2b = w2t + g * kLdW2T + 2 * t;
  const int64_t tiles = (batch + 15) / 16, step = int64_t(gridDim.x) * warps;
  for (int64_t tile = int64_t(warp) * gridDim.x + blockIdx.x; tile < tiles; tile += step) {
    const int64_t r = tile * 16 + g;  // the lane's rows r and r + 8
    // Every load of the tile issued first (h2, h1 at the lane's C positions: 96 registers), so
    // that a warp's 12 KB are in flight under its products; h1 is kept as a mask of 64 bits.
    float h2v[kH2 / 8][4], h1v[kH1 / 8][4];
#pragma unroll
    for (int n = 0; n < kH2 / 8; ++n) load_pair_rows(h2s, kH2, r, 8 * n + 2 * t, batch, h2v[n]);
#pragma unroll
    for (int j = 0; j < kH1 / 8; ++j) load_pair_rows(h1s, kH1, r, 8 * j + 2 * t, batch, h1v[j]);
    // g3 as A fragments: K = the 10 outputs zero-padded to 16, two k8 slices (dy and y read as
    // scalars: their rows are 40 bytes, the arrays as the caller gave them).
    SplitA a3[2][1];
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      const int col = 8 * kk + 2 * t;
      float v[4] = {0.f, 0.f, 0.f, 0.f};
      if (col < kOut) {  // col is even and kOut too: col + 1 < kOut
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int64_t row = r + 8 * (i / 2);
          if (row < batch) {
            const int64_t idx = row * kOut + col + (i & 1);
            v[i] = __ldg(dy + idx);
            if (ym != nullptr) v[i] = relu_mask(v[i], __ldg(ym + idx));
            if (g3s != nullptr) g3s[idx] = v[i];
          }
        }
      }
      a3[kk][0].set_c(v);
    }
    float acc2[1][kH2 / 8][4];
#pragma unroll
    for (int n = 0; n < kH2 / 8; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc2[0][n][i] = 0.f;
#pragma unroll
    for (int kk = 0; kk < 2; ++kk)
#pragma unroll
      for (int n = 0; n < kH2 / 8; ++n) mma_slice(acc2, n, a3[kk], w3b + 8 * n * kLdW3T + 8 * kk);
#pragma unroll
    for (int n = 0; n < kH2 / 8; ++n) {
      float* c = acc2[0][n];
#pragma unroll
      for (int i = 0; i < 4; ++i) c[i] = relu_mask(c[i], h2v[n][i]);
      store_pair_rows(g2s, kH2, r, 8 * n + 2 * t, batch, c[0], c[1], c[2], c[3]);
    }
    unsigned long long h1_on = 0;  // bit 4 j + i: h1 > 0 at the lane's value i of n8 tile j
#pragma unroll
    for (int j = 0; j < kH1 / 8; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) h1_on |= (unsigned long long)(h1v[j][i] > 0.f) << (4 * j + i);
    // g1 = g2 W2 in two 64-column chunks (g2's fragments split again for the second).
#pragma unroll 1
    for (int c0 = 0; c0 < kH1; c0 += 64) {
      float acc1[1][8][4];
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc1[0][j][i] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kH2 / 8; ++kk) {
        SplitA a[1];
        a[0].set_c(acc2[0][kk]);
#pragma unroll
        for (int j = 0; j < 8; ++j) mma_slice(acc1, j, a, w2b + (c0 + 8 * j) * kLdW2T + 8 * kk);
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const unsigned on = unsigned(h1_on >> (4 * (c0 / 8 + j))) & 15u;
        const float* c = acc1[0][j];
        store_pair_rows(g1s, kH1, r, c0 + 8 * j + 2 * t, batch, on & 1u ? c[0] : 0.f, on & 2u ? c[1] : 0.f,
                        on & 4u ? c[2] : 0.f, on & 8u ? c[3] : 0.f);
      }
    }
  }
}

// source_mlp_tc_wgrad<l>_bwd_f32, layer l's weight and bias gradient partials on the tensor pipe
// (mlp_wgrad_bwd_f32's arguments, workspace and reduce; Gm must be null, a_act 0: the dgrad
// wrote g3 masked, and A, x or a post-ReLU h, is used as it is): per chunk of rows, P[n][k] =
// sum_b G[b][n] A[b][k] as 3xTF32 mma.sync, M = n (G transposed), N = k, K = the chunk's rows,
// each 8-row slice promoted. Steps of kWtRows rows of G and A reach shared memory by cp.async
// (rows [kWtRows][ld], zero past N, K and the chunk), kWtStages in flight; a warp owns kMT
// 16-row tiles of n (two where there are: each B fragment's split serves both) and per_warp n8
// tiles of k. N and K compile-time: an entry a layer, each with its own registers and staging.
// Float32 accuracy at any batch as mlp_wgrad_bwd's: registers hold kWtFlushRows rows, then add
// into the thread's own outputs of the block's slot; db a thread a column, 8-row sums.
constexpr int kWtThreads = RAWOPS_MLP_WGRAD_TC_THREADS, kWtWarps = kWtThreads / 32;
constexpr int kWtRows = 16, kWtStages = 3, kWtFlushRows = 256;
static_assert(kWtRows % 8 == 0 && kWtFlushRows % kWtRows == 0 && kWtThreads % 32 == 0, "whole slices and warps");

template <int kBytes> __device__ __forceinline__ void cp_async_zfill(unsigned dst, const void* src, bool valid) {
  if constexpr (kBytes == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(kBytes),
                 "r"(valid ? kBytes : 0)
                 : "memory");
}
template <int kN> __device__ __forceinline__ void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kN) : "memory");
}

// Rows [r0, r0 + kWtRows) of a dense [batch][C] array into shared rows of LD floats, zero past
// `end`: the widest copy C's rows allow (16, 8 or 4 bytes) where src is aligned to it, else 4.
template <int C, int LD>
__device__ __forceinline__ void wt_stage(float* dst, const float* __restrict__ src, int64_t r0, int64_t end) {
  constexpr int kW = (C * 4) % 16 == 0 ? 16 : (C * 4) % 8 == 0 ? 8 : 4, kPer = kW / 4, kCopies = C / kPer;
  const unsigned base = smem_addr(dst);
  if (reinterpret_cast<size_t>(src) % kW == 0) {
    for (int e = threadIdx.x; e < kWtRows * kCopies; e += kWtThreads) {
      const int r = e / kCopies, c = (e - r * kCopies) * kPer;
      const bool ok = r0 + r < end;
      cp_async_zfill<kW>(base + 4u * unsigned(r * LD + c), ok ? src + (r0 + r) * C + c : src, ok);
    }
  } else {
    for (int e = threadIdx.x; e < kWtRows * C; e += kWtThreads) {
      const int r = e / C, c = e - r * C;
      const bool ok = r0 + r < end;
      cp_async_zfill<4>(base + 4u * unsigned(r * LD + c), ok ? src + (r0 + r) * C + c : src, ok);
    }
  }
}

template <int N, int K>
__device__ __forceinline__ void wgrad_tc(const float* __restrict__ G, const float* __restrict__ A,
                                         float* __restrict__ ws, int64_t batch, int k_p, int64_t db_offset,
                                         int64_t stride, int64_t rows_per_chunk) {
  constexpr int tiles_m = (N + 15) / 16;
  constexpr int kMT = tiles_m >= 2 ? 2 : 1;                // 16-row tiles of n a warp
  constexpr int groups = tiles_m / kMT;
  constexpr int share = kWtWarps / groups;                 // warps on one group of n tiles
  static_assert(tiles_m % kMT == 0 && groups <= kWtWarps, "whole groups of n tiles");
  // n8 tiles of k, rounded up to a whole number a warp (the padding's columns are zero): every
  // warp's tile loop is then branch-free, so its mma chains interleave (layer 0's 13 tiles over
  // two warps, one of them skipping a tile, put each tile's chain behind a branch of its own).
  constexpr int per_warp = ((K + 7) / 8 + share - 1) / share, tiles_n = per_warp * share;
  // Row strides: 4 mod 8 (4, 12, 20 or 28 mod 32): the fragment reads at rows 2t, 2t + 1 fall in
  // distinct banks.
  constexpr int kGLd = 16 * tiles_m + 4, kALd = 8 * tiles_n + 4;
  static_assert(N <= 128 && K <= 128 && kGLd % 8 == 4 && kALd % 8 == 4, "staging rows");
  __shared__ __align__(16) float gs[kWtStages][kWtRows * kGLd];
  __shared__ __align__(16) float as[kWtStages][kWtRows * kALd];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const bool active = warp < groups * share;
  const int mt0 = (warp % groups) * kMT, j0 = (warp / groups) * per_warp;
  const int64_t begin = int64_t(blockIdx.x) * rows_per_chunk;
  const int64_t end = begin + rows_per_chunk < batch ? begin + rows_per_chunk : batch;
  const int steps = begin < end ? int((end - begin + kWtRows - 1) / kWtRows) : 0;
  for (int e = tid; e < kWtStages * kWtRows * kGLd; e += kWtThreads) (&gs[0][0])[e] = 0.f;  // the padding stays 0
  for (int e = tid; e < kWtStages * kWtRows * kALd; e += kWtThreads) (&as[0][0])[e] = 0.f;
  __syncthreads();  // the zeros land before any copy into the same rows
  auto stage = [&](int s) {
    if (s < steps) {
      wt_stage<N, kGLd>(gs[s % kWtStages], G, begin + int64_t(s) * kWtRows, end);
      wt_stage<K, kALd>(as[s % kWtStages], A, begin + int64_t(s) * kWtRows, end);
    }
    cp_async_commit();  // empty groups too: the wait below counts one a step
  };
#pragma unroll
  for (int s = 0; s < kWtStages - 1; ++s) stage(s);

  float acc[kMT][per_warp][4];
#pragma unroll
  for (int m = 0; m < kMT; ++m)
#pragma unroll
    for (int j = 0; j < per_warp; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[m][j][i] = 0.f;
  float db = 0.f;
  auto flush = [&](bool first) {
    float* slot = ws + int64_t(blockIdx.x) * stride;
    asm volatile("" : "+l"(slot));
    if (active) {
#pragma unroll
      for (int m = 0; m < kMT; ++m)
#pragma unroll
        for (int j = 0; j < per_warp; ++j) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int n = 16 * (mt0 + m) + g + 8 * (i / 2), k = 8 * (j0 + j) + 2 * t + (i & 1);
            if (n < N && k < K) {
              float* p = slot + n * k_p + k;
              *p = first ? acc[m][j][i] : *p + acc[m][j][i];
            }
            acc[m][j][i] = 0.f;
          }
        }
    }
    if (tid < N) {
      float* p = slot + db_offset + tid;
      *p = first ? db : *p + db;
    }
    db = 0.f;
  };
  constexpr int kFlushSteps = kWtFlushRows / kWtRows;
  for (int s = 0; s < steps; ++s) {
    cp_async_wait_group<kWtStages - 2>();
    __syncthreads();  // step s landed for every thread; step s - 1's buffers are consumed
    stage(s + kWtStages - 1);
    const float* gsb = gs[s % kWtStages];
    const float* asb = as[s % kWtStages];
    if (tid < N) {  // the step's rows in sums of 8, then one add into db: no long running sum
      float part[kWtRows / 8] = {};
#pragma unroll
      for (int r = 0; r < kWtRows; ++r) part[r / 8] += gsb[r * kGLd + tid];
#pragma unroll
      for (int q = 0; q < kWtRows / 8; ++q) db += part[q];
    }
    if (active) {
#pragma unroll
      for (int kk = 0; kk < kWtRows / 8; ++kk) {
        const float* gr = gsb + (8 * kk + 2 * t) * kGLd + 16 * mt0 + g;
        SplitA a[kMT];
#pragma unroll
        for (int m = 0; m < kMT; ++m) a[m].set(gr[16 * m], gr[16 * m + 8], gr[16 * m + kGLd], gr[16 * m + kGLd + 8]);
        const float* ar = asb + (8 * kk + 2 * t) * kALd + 8 * j0 + g;
#pragma unroll
        for (int j = 0; j < per_warp; ++j) {
          const Tf32Split s0 = split_tf32_fast(ar[8 * j]), s1 = split_tf32_fast(ar[8 * j + kALd]);
#pragma unroll
          for (int m = 0; m < kMT; ++m)
            mma_m16n8k8_tf32x3_promoted(acc[m][j], a[m].big, a[m].small, s0.big, s1.big, s0.small, s1.small);
        }
      }
    }
    // Block-uniform: a flush every kWtFlushRows rows but the last.
    if ((s + 1) % kFlushSteps == 0 && s + 1 < steps) flush(s + 1 == kFlushSteps);
  }
  flush(steps <= kFlushSteps);  // the last (or only) run: a short chunk stores its sums once
  cp_async_wait_all();          // nothing in flight into shared memory when the block exits (empty groups)
}

}  // namespace
}  // namespace rawops

// Two variants (rawops/mlp.py launches SOURCE_TC; docs/performance.md compares them): 32-row warp
// tiles, 8 warps (each B fragment's split serves 2 row tiles); 16-row tiles, 16 warps, <= 128
// registers. Layer 1 in 64-column chunks (32-column chunks split x twice as often). Warps a block
// come in multiples of 4: each SM quarter has its own tensor core.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define RAWOPS_SOURCE_TC_CALL(call) call
#else
#define RAWOPS_SOURCE_TC_CALL(call) __trap()  // mma.sync tf32 and cp.async: sm_80; never launched there
#endif
extern "C" __global__ void __launch_bounds__(32 * RAWOPS_MLP_SOURCE_TC32_WARPS, 1)
    source_mlp_tc32_fwd_f32(const float* x, const float* w1, const float* b1, const float* w2, const float* b2,
                            const float* w3, const float* b3, float* y, float* h1s, float* h2s, long long batch,
                            long long flags) {
  RAWOPS_SOURCE_TC_CALL((rawops::source_tc_fwd<2, 64>(x, w1, b1, w2, b2, w3, b3, y, h1s, h2s, batch, flags)));
}
extern "C" __global__ void __launch_bounds__(32 * RAWOPS_MLP_SOURCE_TC16_WARPS, 1)
    source_mlp_tc16_fwd_f32(const float* x, const float* w1, const float* b1, const float* w2, const float* b2,
                            const float* w3, const float* b3, float* y, float* h1s, float* h2s, long long batch,
                            long long flags) {
  RAWOPS_SOURCE_TC_CALL((rawops::source_tc_fwd<1, 64>(x, w1, b1, w2, b2, w3, b3, y, h1s, h2s, batch, flags)));
}
extern "C" __global__ void __launch_bounds__(32 * RAWOPS_MLP_SOURCE_TC_DGRAD_WARPS, 1)
    source_mlp_tc_dgrad_bwd_f32(const float* dy, const float* ym, const float* w3, const float* w2, const float* h2s,
                                const float* h1s, float* g3s, float* g2s, float* g1s, long long batch) {
  RAWOPS_SOURCE_TC_CALL((rawops::source_tc_dgrad(dy, ym, w3, w2, h2s, h1s, g3s, g2s, g1s, batch)));
}
// The three layers' weight gradients (layer l: G = g_{l+1} [batch][N], A = layer l's input [batch][K]),
// an entry each: its own registers and staging (mlp_wgrad_bwd_f32's arguments).
#define RAWOPS_WGRAD_TC_ENTRY(l, n, k, blocks)                                                                 \
  extern "C" __global__ void __launch_bounds__(rawops::kWtThreads, blocks) source_mlp_tc_wgrad##l##_bwd_f32(   \
      const float* G, const float* Gm, const float* A, float* ws, long long batch, long long N, long long K,   \
      long long k_p, long long db_offset, long long stride, long long a_act, long long rows_per_chunk) {       \
    RAWOPS_SOURCE_TC_CALL((rawops::wgrad_tc<n, k>(G, A, ws, batch, int(k_p), db_offset, stride, rows_per_chunk))); \
  }
RAWOPS_WGRAD_TC_ENTRY(0, rawops::kH1, rawops::kIn, 1)
RAWOPS_WGRAD_TC_ENTRY(1, rawops::kH2, rawops::kH1, 2)
RAWOPS_WGRAD_TC_ENTRY(2, rawops::kOut, rawops::kH2, 2)
#undef RAWOPS_WGRAD_TC_ENTRY
#undef RAWOPS_SOURCE_TC_CALL
