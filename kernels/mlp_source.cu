// MLP family, the source network: the float32 network 100-128-64-10 with ReLU (fused_mlp in
// float32), its forwards and its backward.
//
//   y = act(relu(relu(x W1^T + b1) W2^T + b2) W3^T + b3),  act = relu if flags & kOutputRelu
//   weights in torch.nn.Linear layout: W of shape [out, in], row-major. Every forward takes
//   (x, w1, b1, w2, b2, w3, b3, y, h1s, h2s, batch, flags); h1s / h2s (training: the post-ReLU
//   activations [batch][128] and [batch][64] the backward reads) may be null.
// Per sample: 42,752 FLOPs (2 x (100x128 + 128x64 + 64x10)); 400 B of x read, 40 B of y
// written (~97 FLOP a byte: compute-bound at any batch worth a launch). The hidden activations
// live in shared memory and registers only. rawops/mlp.py picks source_mlp_small_fwd_f32 for
// small batches; beyond them on sm_80+ (config.mlp_tf32, the default) source_mlp_tc32_fwd_f32
// (3xTF32 with promoted sums, float32's accuracy; training too) and the backward on the tensor
// pipe, source_mlp_tc_dgrad_bwd_f32 and source_mlp_tc_wgrad<l>_bwd_f32; else source_mlp_fwd_f32
// (exact FFMA) and the backward mlp_dgrad_bwd_f32 and mlp_wgrad_bwd_f32. The weight gradients'
// partials are summed by mlp_wgrad_reduce_bwd_f32 (kernels/mlp_tiles.cu).
//
// source_mlp_fwd_f32: one block of 128 threads per tile of 64 samples (grid = ceil(batch / 64));
// each layer is a register-tiled GEMM over the tile (layer 1: 8 samples x 8 units per thread,
// 4 LDS.128 per 64 FFMA; layer 2: 8 x 4, 3 per 32; layer 3: one sample x 10 outputs on half the
// threads, 3% of the FLOPs), every dot product summed in k order. Weights are staged through
// shared memory in K chunks, transposed to [k][unit] so a thread reads its units as float4;
// everything fits the 48 KB of static shared memory (47.6 KB: 4 blocks / 16 warps per SM where
// 228 KB are, 1 block on sm_75's 64 KB), so no opt-in attribute is needed on any target. The
// price: each block reads the 87 KB of weights again from L2.
#include "rawops/dtype.cuh"
#include "rawops/mma_sync.cuh"
#include "rawops/mlp.cuh"

namespace rawops {
namespace {

constexpr int kIn = RAWOPS_MLP_SOURCE_IN, kH1 = RAWOPS_MLP_SOURCE_H1, kH2 = RAWOPS_MLP_SOURCE_H2,
              kOut = RAWOPS_MLP_SOURCE_OUT;
constexpr int64_t kOutputRelu = kActRelu;  // flags: the output activation's code, none or ReLU
constexpr int kThreads = RAWOPS_MLP_SOURCE_THREADS;
constexpr int kTile = RAWOPS_MLP_SOURCE_TILE;  // samples per block
constexpr int kChunk1 = 20;  // layer-1 K per staged pass (100 = 5 x 20)
constexpr int kChunk2 = 32;  // layer-2 K per staged pass (128 = 4 x 32)
// Row strides of the staged [k][sample] / [k][unit] arrays, padded by 4 floats: rows stay
// 16-byte aligned for float4 reads, and the transposing stores spread over the banks
// (3- to 4-way conflicts instead of 20- to 32-way).
constexpr int kXStride = kTile + 4;
constexpr int kW1Stride = kH1 + 4;
constexpr int kW2Stride = kH2 + 4;
constexpr int kW3Stride = 12;  // 10 outputs, padded to three float4
constexpr int kStage = kChunk1 * kXStride + kChunk1 * kW1Stride;
static_assert(kIn % kChunk1 == 0 && kH1 % kChunk2 == 0, "K chunks must divide K");
static_assert(kChunk2 * kW2Stride <= kStage && kH2 * kW3Stride <= kStage, "stage holds every chunk");
static_assert((kH1 * kTile + kStage) * 4 <= 48 * 1024, "static shared memory limit");
static_assert(kThreads == 128 && kTile == 64, "the thread tiling below: 8 sample groups x 16 unit groups");

__device__ __forceinline__ float4 lds4(const float* p) { return *reinterpret_cast<const float4*>(p); }

__device__ __forceinline__ void source_mlp_fwd(const float* __restrict__ x, const float* __restrict__ w1,
                                               const float* __restrict__ b1, const float* __restrict__ w2,
                                               const float* __restrict__ b2, const float* __restrict__ w3,
                                               const float* __restrict__ b3, float* __restrict__ y,
                                               float* __restrict__ h1s, float* __restrict__ h2s, int64_t batch,
                                               int64_t flags) {
  // h: layer 1's output transposed, [128 units][64 samples]; then layer 2's, [64][64].
  __shared__ __align__(16) float h[kH1 * kTile];
  __shared__ __align__(16) float stage[kStage];
  float* const xt = stage;                         // [kChunk1][kXStride]  x chunk, transposed
  float* const w1t = stage + kChunk1 * kXStride;   // [kChunk1][kW1Stride] W1 chunk, transposed
  float* const w2t = stage;                        // [kChunk2][kW2Stride]
  float* const w3t = stage;                        // [kH2][kW3Stride]

  const int t = threadIdx.x;
  const int64_t first = int64_t(blockIdx.x) * kTile;
  // A thread's samples are ts*4 + {0..3} and 32 + ts*4 + {0..3}: eight threads reading
  // float4s at one k cover 128 contiguous bytes (no bank conflict); the eight share their units.
  const int ts = t % 8;
  const int tu = t / 8;  // 16 groups

  // ---------------------------------------------------------------- layer 1: 64 x 128, K = 100
  float acc[8][8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float bias = __ldg(b1 + (j < 4 ? tu * 4 + j : 64 + tu * 4 + j - 4));
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i][j] = bias;
  }
  for (int k0 = 0; k0 < kIn; k0 += kChunk1) {
    __syncthreads();  // the previous chunk is consumed
    for (int e = t; e < kTile * kChunk1; e += kThreads) {  // consecutive threads: consecutive k of a row
      const int s = e / kChunk1, k = e - s * kChunk1;
      const int64_t sample = first + s;
      xt[k * kXStride + s] = sample < batch ? __ldg(x + sample * kIn + k0 + k) : 0.f;
    }
    for (int e = t; e < kH1 * kChunk1; e += kThreads) {
      const int u = e / kChunk1, k = e - u * kChunk1;
      w1t[k * kW1Stride + u] = __ldg(w1 + u * kIn + k0 + k);
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kChunk1; ++k) {
      const float4 xa = lds4(xt + k * kXStride + ts * 4), xb = lds4(xt + k * kXStride + 32 + ts * 4);
      const float4 wa = lds4(w1t + k * kW1Stride + tu * 4), wb = lds4(w1t + k * kW1Stride + 64 + tu * 4);
      const float xv[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
      const float wv[8] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(xv[i], wv[j], acc[i][j]);
    }
  }
  if (h1s != nullptr) {  // training: keep relu(layer 1) per sample for the backward ([batch][128])
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int64_t sample = first + (i < 4 ? ts * 4 + i : 32 + ts * 4 + i - 4);
      if (sample < batch) {
        float* row = h1s + sample * kH1;
#pragma unroll
        for (int j = 0; j < 8; ++j) row[j < 4 ? tu * 4 + j : 64 + tu * 4 + j - 4] = relu(acc[i][j]);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) {  // h[unit][sample], four samples per float4 store
    const int u = j < 4 ? tu * 4 + j : 64 + tu * 4 + j - 4;
    *reinterpret_cast<float4*>(h + u * kTile + ts * 4) =
        make_float4(relu(acc[0][j]), relu(acc[1][j]), relu(acc[2][j]), relu(acc[3][j]));
    *reinterpret_cast<float4*>(h + u * kTile + 32 + ts * 4) =
        make_float4(relu(acc[4][j]), relu(acc[5][j]), relu(acc[6][j]), relu(acc[7][j]));
  }

  // ---------------------------------------------------------------- layer 2: 64 x 64, K = 128
  // Same samples per thread; units tu*4 + {0..3}.
  float acc2[8][4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float bias = __ldg(b2 + tu * 4 + j);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc2[i][j] = bias;
  }
  for (int k0 = 0; k0 < kH1; k0 += kChunk2) {
    __syncthreads();  // h complete (first pass); the previous chunk consumed
    for (int e = t; e < kH2 * kChunk2; e += kThreads) {
      const int u = e / kChunk2, k = e - u * kChunk2;
      w2t[k * kW2Stride + u] = __ldg(w2 + u * kH1 + k0 + k);
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kChunk2; ++k) {
      const float* hk = h + (k0 + k) * kTile;
      const float4 ha = lds4(hk + ts * 4), hb = lds4(hk + 32 + ts * 4);
      const float4 w = lds4(w2t + k * kW2Stride + tu * 4);
      const float hv[8] = {ha.x, ha.y, ha.z, ha.w, hb.x, hb.y, hb.z, hb.w};
      const float wv[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc2[i][j] = fmaf(hv[i], wv[j], acc2[i][j]);
    }
  }
  if (h2s != nullptr) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int64_t sample = first + (i < 4 ? ts * 4 + i : 32 + ts * 4 + i - 4);
      if (sample < batch) {
#pragma unroll
        for (int j = 0; j < 4; ++j) h2s[sample * kH2 + tu * 4 + j] = relu(acc2[i][j]);
      }
    }
  }
  __syncthreads();  // every thread is done reading layer 1's h and the last W2 chunk
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int u = tu * 4 + j;
    *reinterpret_cast<float4*>(h + u * kTile + ts * 4) =
        make_float4(relu(acc2[0][j]), relu(acc2[1][j]), relu(acc2[2][j]), relu(acc2[3][j]));
    *reinterpret_cast<float4*>(h + u * kTile + 32 + ts * 4) =
        make_float4(relu(acc2[4][j]), relu(acc2[5][j]), relu(acc2[6][j]), relu(acc2[7][j]));
  }
  for (int e = t; e < kOut * kH2; e += kThreads) {
    const int o = e / kH2, k = e - o * kH2;
    w3t[k * kW3Stride + o] = __ldg(w3 + e);  // w3[o][k]
  }
  __syncthreads();

  // ---------------------------------------------------------------- layer 3: 64 x 10, K = 64
  if (t >= kTile) return;
  const int64_t sample = first + t;
  if (sample >= batch) return;
  float out[kOut];
#pragma unroll
  for (int o = 0; o < kOut; ++o) out[o] = __ldg(b3 + o);
#pragma unroll 8
  for (int k = 0; k < kH2; ++k) {
    const float hv = h[k * kTile + t];  // consecutive threads, consecutive words
    const float4 wa = lds4(w3t + k * kW3Stride), wb = lds4(w3t + k * kW3Stride + 4);
    const float2 wc = *reinterpret_cast<const float2*>(w3t + k * kW3Stride + 8);
    const float wv[kOut] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w, wc.x, wc.y};
#pragma unroll
    for (int o = 0; o < kOut; ++o) out[o] = fmaf(hv, wv[o], out[o]);
  }
  float* row = y + sample * kOut;
#pragma unroll
  for (int o = 0; o < kOut; ++o) row[o] = (flags & kOutputRelu) ? relu(out[o]) : out[o];
}

}  // namespace
}  // namespace rawops

// Four blocks per SM where shared memory holds four (sm_80, sm_90, sm_100: <= 128 registers);
// sm_120 holds two (100 KB per SM), so its registers need no cap (capped at 128 it spills).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1200
#define RAWOPS_SOURCE_MIN_BLOCKS 2
#else
#define RAWOPS_SOURCE_MIN_BLOCKS 4
#endif
extern "C" __global__ void __launch_bounds__(rawops::kThreads, RAWOPS_SOURCE_MIN_BLOCKS)
    source_mlp_fwd_f32(const float* x, const float* w1, const float* b1, const float* w2, const float* b2,
                       const float* w3, const float* b3, float* y, float* h1s, float* h2s, long long batch,
                       long long flags) {
  rawops::source_mlp_fwd(x, w1, b1, w2, b2, w3, b3, y, h1s, h2s, batch, flags);
}

// =====================================================================================
// Small batches of the source network: source_mlp_small_fwd_f32.
// The tiled kernel above gives one block all of a small batch (batch 32: one block, latency-bound
// on its ten staged weight chunks). Here a block of 8 warps takes kSmallTile = 2 samples, so a
// batch of 32 spreads over 16 SMs; each warp owns units and reads their weight rows straight from
// L2 (coalesced: lane k reads W[u][k + 32 i]). A warp's partial dot products (units x samples per
// lane) are summed by one reduce-scatter over the lanes (deterministic, 31 shuffles for 32 sums
// where a butterfly per sum takes 160). Three barriers in all. Launch: ceil(batch / 2) blocks.
// =====================================================================================
namespace rawops {
namespace {

constexpr int kSmallTile = RAWOPS_MLP_SOURCE_SMALL_TILE;
constexpr int kSmallThreads = RAWOPS_MLP_SOURCE_SMALL_THREADS;  // 8 warps
static_assert(kSmallThreads == 8 * 32, "the units of a layer are dealt over 8 warps");

__host__ __device__ constexpr int log2_of(int v) { return v <= 1 ? 0 : 1 + log2_of(v / 2); }

// Sums each of a lane's V values over the warp's 32 lanes (V a power of two <= 32). Each
// halving exchange sends the half of the values the partner keeps and adds the half it
// receives, so after log2 V of them a lane holds one value summed over 2^(log2 V) lanes: index
// lane >> (5 - log2 V). Plain exchanges finish the sum over the lanes that share that index.
// The order of every addition is fixed: the same inputs give the same bits.
template <int C, int V> __device__ __forceinline__ void halving_exchanges(float (&v)[V], int lane) {
  if constexpr (C > 1) {
    constexpr int m = 16 * C / V;  // the lane bit this exchange splits on: 16, 8, ...
    const bool upper = (lane & m) != 0;
#pragma unroll
    for (int i = 0; i < C / 2; ++i) {
      const float send = upper ? v[i] : v[i + C / 2];
      const float keep = upper ? v[i + C / 2] : v[i];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, m);
    }
    halving_exchanges<C / 2>(v, lane);
  }
}

template <int V> __device__ __forceinline__ float warp_reduce_scatter(float (&v)[V], int lane) {
  static_assert(V >= 1 && V <= 32 && (V & (V - 1)) == 0, "V must be a power of two <= 32");
  halving_exchanges<V>(v, lane);
  float r = v[0];
#pragma unroll
  for (int m = 16 / V; m >= 1; m /= 2) r += __shfl_xor_sync(0xffffffffu, r, m);
  return r;
}

// A warp's share of one dense layer for kSmallTile samples: units u = warp + 8 j (j <
// kUnitsPerWarp, u < kN), lane k reading W[u][k + 32 i]. Every weight of the warp's units, and
// the one bias of the sum this lane finishes, is loaded into registers at the kernel's start
// (load), so the three layers pay one L2 latency together instead of one each.
template <int kK, int kN, int kUnitsPerWarp> struct SmallWeights {
  static constexpr int kSteps = (kK + 31) / 32;
  static constexpr int kSums = kUnitsPerWarp * kSmallTile;  // index j * kSmallTile + s
  static constexpr int kLanesPerSum = 32 / kSums;
  static constexpr int kSumShift = 5 - log2_of(kSums);  // lane >> kSumShift: the sum a lane finishes
  float w[kUnitsPerWarp][kSteps];
  float bias;  // of unit_of(lane)
  __device__ __forceinline__ static int sum_of(int lane) { return lane >> kSumShift; }
  __device__ __forceinline__ static int unit_of(int lane, int warp) { return warp + 8 * (sum_of(lane) / kSmallTile); }
  __device__ __forceinline__ void load(const float* __restrict__ W, const float* __restrict__ B, int warp, int lane) {
#pragma unroll
    for (int j = 0; j < kUnitsPerWarp; ++j) {
      const int u = warp + 8 * j;
#pragma unroll
      for (int i = 0; i < kSteps; ++i) {
        const int k = lane + 32 * i;
        w[j][i] = (u < kN && k < kK) ? __ldg(W + u * kK + k) : 0.f;
      }
    }
    const int u = unit_of(lane, warp);
    bias = u < kN ? __ldg(B + u) : 0.f;
  }
  // out[s][u] = act(b[u] + sum_k in[s][k] w[u][k]) (in/out in shared memory).
  __device__ __forceinline__ void apply(const float* __restrict__ in, float* __restrict__ out,
                                        float* __restrict__ save, int64_t first, int64_t batch, bool relu_out,
                                        float* __restrict__ y_global, int warp, int lane) const {
    float acc[kSums];
#pragma unroll
    for (int j = 0; j < kUnitsPerWarp; ++j)
#pragma unroll
      for (int s = 0; s < kSmallTile; ++s) {
        float a = 0.f;
#pragma unroll
        for (int i = 0; i < kSteps; ++i) {
          const int k = lane + 32 * i;
          if (k < kK) a = fmaf(in[s * kK + k], w[j][i], a);
        }
        acc[j * kSmallTile + s] = a;
      }
    const float v = warp_reduce_scatter(acc, lane);
    const int u = unit_of(lane, warp), s = sum_of(lane) % kSmallTile;
    if (u < kN && lane % kLanesPerSum == 0) {
      float r = v + bias;
      if (relu_out) r = relu(r);
      const int64_t sample = first + s;
      if (out != nullptr) out[s * kN + u] = r;
      if (sample < batch) {
        if (save != nullptr) save[sample * kN + u] = r;
        if (y_global != nullptr) y_global[sample * kN + u] = r;
      }
    }
  }
};

__device__ __forceinline__ void source_mlp_small_fwd(const float* __restrict__ x, const float* __restrict__ w1,
                                                     const float* __restrict__ b1, const float* __restrict__ w2,
                                                     const float* __restrict__ b2, const float* __restrict__ w3,
                                                     const float* __restrict__ b3, float* __restrict__ y,
                                                     float* __restrict__ h1s, float* __restrict__ h2s, int64_t batch,
                                                     int64_t flags) {
  __shared__ float xs[kSmallTile * kIn];
  __shared__ float h1[kSmallTile * kH1];
  __shared__ float h2[kSmallTile * kH2];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t first = int64_t(blockIdx.x) * kSmallTile;
  SmallWeights<kIn, kH1, kH1 / 8> l1;
  SmallWeights<kH1, kH2, kH2 / 8> l2;
  SmallWeights<kH2, kOut, 2> l3;
  l1.load(w1, b1, warp, lane);
  l2.load(w2, b2, warp, lane);
  l3.load(w3, b3, warp, lane);
  for (int e = threadIdx.x; e < kSmallTile * kIn; e += kSmallThreads) {
    const int s = e / kIn;
    xs[e] = first + s < batch ? __ldg(x + first * kIn + e) : 0.f;
  }
  __syncthreads();
  l1.apply(xs, h1, h1s, first, batch, true, nullptr, warp, lane);
  __syncthreads();
  l2.apply(h1, h2, h2s, first, batch, true, nullptr, warp, lane);
  __syncthreads();
  l3.apply(h2, nullptr, nullptr, first, batch, (flags & kOutputRelu) != 0, y, warp, lane);
}

}  // namespace
}  // namespace rawops

extern "C" __global__ void __launch_bounds__(rawops::kSmallThreads)
    source_mlp_small_fwd_f32(const float* x, const float* w1, const float* b1, const float* w2, const float* b2,
                             const float* w3, const float* b3, float* y, float* h1s, float* h2s, long long batch,
                             long long flags) {
  rawops::source_mlp_small_fwd(x, w1, b1, w2, b2, w3, b3, y, h1s, h2s, batch, flags);
}

// =====================================================================================
// The source network's backward (SIMT, exact float32 FMA), one layer a launch.
//   mlp_dgrad_bwd_f32: out[b][k] = (sum_n G'[b][n] W[n][k]) * (H == null || H[b][k] > 0)
//     with G' = G * (Gm == null || Gm[b][n] > 0): one step of the chain g_{l-1} = (g_l W_l)
//     masked by relu'(z_{l-1}), read off the kept post-ReLU activation (h > 0 iff z > 0).
//     Blocks of kGradThreads threads, kDgradRows rows each (N, K <= 128).
//   mlp_wgrad_bwd_f32: per chunk of rows (one block each), P[n][k] = sum_b G'[b][n] act(A[b][k])
//     and sum_b G'[b][n], written to a float32 workspace; mlp_wgrad_reduce_bwd_f32
//     (kernels/mlp_tiles.cu) adds the chunks in a fixed blocked order (deterministic, no atomics)
//     into dW and db. Float32 accuracy at any batch: a running float32 sum of L terms is off by
//     ~sqrt(L) roundings, so no sum runs long: a thread's registers sum kWgradFlushRows rows, then
//     are added into its own outputs of the block's workspace slot (same thread, no barrier),
//     and the reduce sums the chunks in blocks of a few; every sum then runs over at most a few
//     hundred terms, where one running sum over a chunk of thousands of rows (a 2^20-row batch)
//     would be several times torch's float32 error.
// =====================================================================================
namespace rawops {
namespace {

constexpr int kDgradRows = RAWOPS_MLP_DGRAD_ROWS, kDgradChunk = 32, kGradThreads = RAWOPS_MLP_GRAD_THREADS;

__device__ __forceinline__ float masked(float v, const float* m, int64_t i) {
  return (m == nullptr || m[i] > 0.f) ? v : 0.f;
}

template <int kKJ>
__device__ __forceinline__ void dgrad_f32_tile(const float* __restrict__ G, const float* __restrict__ Gm,
                                               const float* __restrict__ W, const float* __restrict__ H,
                                               float* __restrict__ out, int64_t batch, int N, int K,
                                               float (*gs)[kDgradChunk + 1], float (*ws)[128]) {
  const int t = threadIdx.x, rg = t / 16, kg = t % 16;
  const int64_t row0 = int64_t(blockIdx.x) * kDgradRows;
  float acc[4][kKJ];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < kKJ; ++j) acc[i][j] = 0.f;
  for (int n0 = 0; n0 < N; n0 += kDgradChunk) {
    // Every load of the step in flight before the barrier, then the stores.
    constexpr int kG = kDgradRows * kDgradChunk / kGradThreads, kW = kDgradChunk * 128 / kGradThreads;
    float gl[kG], wl[kW];
#pragma unroll
    for (int i = 0; i < kG; ++i) {
      const int e = t + i * kGradThreads, r = e / kDgradChunk, n = e % kDgradChunk;
      const int64_t row = row0 + r, idx = row * N + n0 + n;
      gl[i] = (row < batch && n0 + n < N) ? masked(G[idx], Gm, idx) : 0.f;
    }
#pragma unroll
    for (int i = 0; i < kW; ++i) {
      const int e = t + i * kGradThreads, n = e / 128, k = e % 128;
      wl[i] = (n0 + n < N && k < K) ? __ldg(W + (n0 + n) * K + k) : 0.f;
    }
    __syncthreads();  // the previous step is consumed
#pragma unroll
    for (int i = 0; i < kG; ++i) {
      const int e = t + i * kGradThreads;
      gs[e / kDgradChunk][e % kDgradChunk] = gl[i];
    }
#pragma unroll
    for (int i = 0; i < kW; ++i) {
      const int e = t + i * kGradThreads;
      ws[e / 128][e % 128] = wl[i];
    }
    __syncthreads();
#pragma unroll 4
    for (int n = 0; n < kDgradChunk; ++n) {
      float gv[4], wv[kKJ];
#pragma unroll
      for (int i = 0; i < 4; ++i) gv[i] = gs[rg + 16 * i][n];
#pragma unroll
      for (int j = 0; j < kKJ; ++j) wv[j] = ws[n][kg + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < kKJ; ++j) acc[i][j] = fmaf(gv[i], wv[j], acc[i][j]);
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t row = row0 + rg + 16 * i;
    if (row >= batch) continue;
#pragma unroll
    for (int j = 0; j < kKJ; ++j) {
      const int k = kg + 16 * j;
      if (k < K) out[row * K + k] = masked(acc[i][j], H, row * K + k);
    }
  }
}

__device__ __forceinline__ void dgrad_f32(const float* __restrict__ G, const float* __restrict__ Gm,
                                          const float* __restrict__ W, const float* __restrict__ H,
                                          float* __restrict__ out, int64_t batch, int N, int K) {
  __shared__ float gs[kDgradRows][kDgradChunk + 1];
  __shared__ __align__(16) float ws[kDgradChunk][128];
  if (K <= 64)
    dgrad_f32_tile<4>(G, Gm, W, H, out, batch, N, K, gs, ws);
  else if (K <= 112)
    dgrad_f32_tile<7>(G, Gm, W, H, out, batch, N, K, gs, ws);
  else
    dgrad_f32_tile<8>(G, Gm, W, H, out, batch, N, K, gs, ws);
}

constexpr int kWgradRows = RAWOPS_MLP_WGRAD_ROWS;  // rows staged a step
constexpr int kWgradFlushSteps = 4;                // steps summed in registers before a flush
constexpr int kWgradFlushRows = kWgradFlushSteps * kWgradRows;

template <int kNI, int kKJ>
__device__ __forceinline__ void wgrad_f32_tile(const float* __restrict__ G, const float* __restrict__ Gm,
                                               const float* __restrict__ A, float* __restrict__ ws, int64_t batch,
                                               int N, int K, int k_p, int64_t db_offset, int64_t stride, int a_act,
                                               int64_t rows_per_chunk, float (*gs)[129], float (*as)[129]) {
  const int t = threadIdx.x, ng = t / 16, kg = t % 16;
  const int64_t begin = int64_t(blockIdx.x) * rows_per_chunk;
  const int64_t end = begin + rows_per_chunk < batch ? begin + rows_per_chunk : batch;
  float acc[kNI][kKJ];
#pragma unroll
  for (int i = 0; i < kNI; ++i)
#pragma unroll
    for (int j = 0; j < kKJ; ++j) acc[i][j] = 0.f;
  float db = 0.f;
  // The registers' sums so far into the thread's own outputs of the block's slot (stored by the
  // first flush, added by the later ones), then zeroed: no running sum spans more than
  // kWgradFlushRows rows. Only this thread touches these words: program order suffices.
  auto flush = [&](bool first) {
    // The slot's address made opaque here, so that its element addresses are computed at each
    // (rare) flush instead of hoisted out of the row loop into registers the FFMA tile needs.
    float* slot = ws + int64_t(blockIdx.x) * stride;
    asm volatile("" : "+l"(slot));
#pragma unroll
    for (int i = 0; i < kNI; ++i) {
      const int n = ng + 16 * i;
      if (n < N) {
#pragma unroll
        for (int j = 0; j < kKJ; ++j) {
          const int k = kg + 16 * j;
          if (k < K) {
            float* p = slot + n * k_p + k;
            *p = first ? acc[i][j] : *p + acc[i][j];
          }
        }
      }
      // a row of kKJ loads in flight at a time: all of them at once would need registers the
      // tile's accumulators hold
      asm volatile("" ::: "memory");
#pragma unroll
      for (int j = 0; j < kKJ; ++j) acc[i][j] = 0.f;
    }
    if (t < N) {
      float* p = slot + db_offset + t;
      *p = first ? db : *p + db;
    }
    db = 0.f;
  };
  for (int64_t r0 = begin; r0 < end; r0 += kWgradRows) {
    // Every load of the step in flight before the barrier, then the stores (N, K <= 128).
    constexpr int kL = kWgradRows * 128 / kGradThreads;
    float gl[kL], al[kL];
#pragma unroll
    for (int i = 0; i < kL; ++i) {
      const int e = t + i * kGradThreads;
      gl[i] = al[i] = 0.f;
      if (e < kWgradRows * N) {
        const int r = e / N, n = e % N;
        const int64_t idx = (r0 + r) * N + n;
        if (r0 + r < end) gl[i] = masked(G[idx], Gm, idx);
      }
      if (e < kWgradRows * K) {
        const int r = e / K, k = e % K;
        if (r0 + r < end) al[i] = A[(r0 + r) * K + k];
      }
    }
    __syncthreads();  // the previous step is consumed
#pragma unroll
    for (int i = 0; i < kL; ++i) {
      const int e = t + i * kGradThreads;
      if (e < kWgradRows * N) gs[e / N][e % N] = gl[i];
      if (e < kWgradRows * K) as[e / K][e % K] = activate(al[i], a_act);
    }
    __syncthreads();
    if (t < N) {  // the step's rows in sums of 8, then one add into db: a running sum over the 128
                  // rows of a flush read 2.5x torch's error (db2 at 513 rows, H200)
      float part[kWgradRows / 8] = {};
#pragma unroll
      for (int r = 0; r < kWgradRows; ++r) part[r / 8] += gs[r][t];
#pragma unroll
      for (int q = 0; q < kWgradRows / 8; ++q) db += part[q];
    }
#pragma unroll 2
    for (int r = 0; r < kWgradRows; ++r) {
      float gv[kNI], av[kKJ];
#pragma unroll
      for (int i = 0; i < kNI; ++i) gv[i] = gs[r][ng + 16 * i];
#pragma unroll
      for (int j = 0; j < kKJ; ++j) av[j] = as[r][kg + 16 * j];
#pragma unroll
      for (int i = 0; i < kNI; ++i)
#pragma unroll
        for (int j = 0; j < kKJ; ++j) acc[i][j] = fmaf(gv[i], av[j], acc[i][j]);
    }
    // Block-uniform (r0 alone decides): a flush every kWgradFlushRows rows but the last.
    if ((r0 - begin + kWgradRows) % kWgradFlushRows == 0 && r0 + kWgradRows < end)
      flush(r0 - begin + kWgradRows == kWgradFlushRows);
  }
  flush(end - begin <= kWgradFlushRows);  // the last (or only) run: a short chunk stores its sums once
}

// The thread tile fitted to the layer (a thread holds n = ng + 16 i, k = kg + 16 j): the
// source network's 128x100, 64x128 and 10x64 gradients, and 128x128 for anything else.
__device__ __forceinline__ void wgrad_f32(const float* __restrict__ G, const float* __restrict__ Gm,
                                          const float* __restrict__ A, float* __restrict__ ws, int64_t batch, int N,
                                          int K, int k_p, int64_t db_offset, int64_t stride, int a_act,
                                          int64_t rows_per_chunk) {
  __shared__ float gs[kWgradRows][129];
  __shared__ float as[kWgradRows][129];
  if (N <= 16 && K <= 64)
    wgrad_f32_tile<1, 4>(G, Gm, A, ws, batch, N, K, k_p, db_offset, stride, a_act, rows_per_chunk, gs, as);
  else if (N <= 64)
    wgrad_f32_tile<4, 8>(G, Gm, A, ws, batch, N, K, k_p, db_offset, stride, a_act, rows_per_chunk, gs, as);
  else if (K <= 112)
    wgrad_f32_tile<8, 7>(G, Gm, A, ws, batch, N, K, k_p, db_offset, stride, a_act, rows_per_chunk, gs, as);
  else
    wgrad_f32_tile<8, 8>(G, Gm, A, ws, batch, N, K, k_p, db_offset, stride, a_act, rows_per_chunk, gs, as);
}

}  // namespace
}  // namespace rawops

extern "C" __global__ void __launch_bounds__(rawops::kGradThreads)
    mlp_dgrad_bwd_f32(const float* G, const float* Gm, const float* W, const float* H, float* out, long long batch,
                      long long N, long long K) {
  rawops::dgrad_f32(G, Gm, W, H, out, batch, int(N), int(K));
}

extern "C" __global__ void __launch_bounds__(rawops::kGradThreads)
    mlp_wgrad_bwd_f32(const float* G, const float* Gm, const float* A, float* ws, long long batch, long long N,
                      long long K, long long k_p, long long db_offset, long long stride, long long a_act,
                      long long rows_per_chunk) {
  rawops::wgrad_f32(G, Gm, A, ws, batch, int(N), int(K), int(k_p), db_offset, stride, int(a_act), rows_per_chunk);
}

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
