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
// small batches; beyond them on sm_80+ (config.mlp_tf32, the default) the tensor pipe's kernels
// (kernels/mlp_source_tc.cu: 3xTF32 with float32's accuracy, training too); else source_mlp_fwd_f32
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
// source_mlp_small_bwd_f32: the whole backward of a batch of at most kSmallBwdRows rows in one
// launch, every gradient written once (no partials, no reduce, no temporaries): at batch 32 the
// eight launches above were most of a training step's host time.
//   Weight blocks 0 .. kWeightBlocks-1 each own kBwdUnits of layer 1's 128 units (J): every one
//   computes g2 = (dy' W3) * (h2 > 0) for all rows (640 FMA a row, the only repeated work), then
//   g1[:, J] = (g2 W2[:, J]) * (h1[:, J] > 0), and writes dW1[J, :] = g1[:, J]^T x and
//   dW2[:, J] = g2^T h1[:, J] (warps 0-3 and 4-5), while warps 6-7 write its share of dW3 (4 of
//   the 64 columns) and of db1, db2 (db3: block 0). dy' = dy * (ym > 0) (ym: y under the output
//   ReLU, else null).
//   dx blocks (only where dx is wanted) each own kBwdDxRows rows: g2 and every unit's g1 of
//   those rows, then dx = g1 W1.
// The chain's sums run over n in the order of mlp_dgrad_bwd_f32's (the same g2, g1, dx); dW's
// over the rows in order, at most 128 terms (one flush of mlp_wgrad_bwd_f32); the biases' in runs
// of 8 rows, each then added. rawops/mlp.py routes here only batches of 1 .. kSmallBwdRows.
// =====================================================================================
namespace rawops {
namespace {

constexpr int kSmallBwdRows = RAWOPS_MLP_SOURCE_SMALL_BWD_ROWS, kBwdUnits = RAWOPS_MLP_SOURCE_SMALL_BWD_UNITS,
              kBwdDxRows = RAWOPS_MLP_SOURCE_SMALL_BWD_DX_ROWS;
constexpr int kWeightBlocks = kH1 / kBwdUnits;
constexpr int kG2Stride = kH2 + 1;  // g2's rows one bank apart
static_assert(kGradThreads == 256 && kBwdUnits == 8 && kH1 == 128 && kH2 == 64 && kOut == 10 && kIn <= 128,
              "the thread roles below");
static_assert(kWeightBlocks * 4 == kH2 && kBwdDxRows * kH1 == kSmallBwdRows * kBwdUnits,
              "a weight block owns 4 of dW3's columns; a dx block's g1 fits the weight block's");
static_assert((kSmallBwdRows * (kOut + kG2Stride + kBwdUnits) + kH2 * kBwdUnits) * 4 <= 48 * 1024,
              "static shared memory limit");

// The sum over rows of v(r) as the wgrad kernel sums the biases: runs of 8 rows, each then added.
template <typename V>
__device__ __forceinline__ float bias_sum(int rows, V v) {
  float total = 0.f;
  for (int r0 = 0; r0 < rows; r0 += 8) {
    float part = 0.f;
    for (int r = r0; r < r0 + 8 && r < rows; ++r) part += v(r);
    total += part;
  }
  return total;
}

// acc[i] += sum_n a[i * a_step + n] w[n * ldw] over n < kN, in n order: a dx block's rows (every
// other one from its first) times one column of a weight.
template <int kN>
__device__ __forceinline__ void rows_times_column(const float* a, int a_step, const float* __restrict__ w, int ldw,
                                                  float (&acc)[kBwdDxRows / 2]) {
#pragma unroll 4
  for (int n = 0; n < kN; ++n) {
    const float wn = __ldg(w + n * ldw);
#pragma unroll
    for (int i = 0; i < kBwdDxRows / 2; ++i) acc[i] = fmaf(a[i * a_step + n], wn, acc[i]);
  }
}

__device__ __forceinline__ void source_small_bwd(const float* __restrict__ dy, const float* __restrict__ ym,
                                                 const float* __restrict__ w1, const float* __restrict__ w2,
                                                 const float* __restrict__ w3, const float* __restrict__ x,
                                                 const float* __restrict__ h1, const float* __restrict__ h2,
                                                 float* __restrict__ dx, float* __restrict__ dw1,
                                                 float* __restrict__ db1, float* __restrict__ dw2,
                                                 float* __restrict__ db2, float* __restrict__ dw3,
                                                 float* __restrict__ db3, int batch) {
  __shared__ __align__(16) float g1s[kSmallBwdRows * kBwdUnits];  // weight block: [row][unit of J]; dx block:
                                                                    // [row][128 units]
  __shared__ float gy[kSmallBwdRows * kOut];                        // dy' [row][10]
  __shared__ float g2s[kSmallBwdRows * kG2Stride];                  // g2 [row][64 (+1)]
  __shared__ float w2s[kH2 * kBwdUnits];                            // W2[:, J] as [m][unit of J]
  const int t = threadIdx.x;
  const bool weights = blockIdx.x < kWeightBlocks;
  const int b = weights ? blockIdx.x : blockIdx.x - kWeightBlocks;
  const int r0 = weights ? 0 : b * kBwdDxRows;  // the block's first row
  const int rows = weights ? batch : min(kBwdDxRows, batch - r0);
  const int j0 = b * kBwdUnits;  // a weight block's first unit of layer 1
  for (int e = t; e < rows * kOut; e += kGradThreads) {
    const int64_t idx = int64_t(r0) * kOut + e;
    gy[e] = masked(dy[idx], ym, idx);
  }
  if (weights)
    for (int e = t; e < kH2 * kBwdUnits; e += kGradThreads) w2s[e] = __ldg(w2 + (e / kBwdUnits) * kH1 + j0 + e % kBwdUnits);
  __syncthreads();
  {  // g2: a thread's unit m and its W3 column fixed, rows 4 apart
    const int m = t % kH2;
    float w3c[kOut];
#pragma unroll
    for (int o = 0; o < kOut; ++o) w3c[o] = __ldg(w3 + o * kH2 + m);
    for (int r = t / kH2; r < rows; r += kGradThreads / kH2) {
      float acc = 0.f;
#pragma unroll
      for (int o = 0; o < kOut; ++o) acc = fmaf(gy[r * kOut + o], w3c[o], acc);
      g2s[r * kG2Stride + m] = masked(acc, h2, int64_t(r0 + r) * kH2 + m);
    }
  }
  __syncthreads();
  if (!weights) {
    // g1 of the block's rows, every unit: a thread's unit k, rows 2 apart
    const int k = t % kH1, rg = t / kH1;
    float acc[kBwdDxRows / 2] = {};
    rows_times_column<kH2>(g2s + rg * kG2Stride, 2 * kG2Stride, w2 + k, kH1, acc);
#pragma unroll
    for (int i = 0; i < kBwdDxRows / 2; ++i) {
      const int r = rg + 2 * i;
      if (r < rows) g1s[r * kH1 + k] = masked(acc[i], h1, int64_t(r0 + r) * kH1 + k);
    }
    __syncthreads();
    if (k < kIn) {  // dx = g1 W1 (the input has no activation)
      float d[kBwdDxRows / 2] = {};
      rows_times_column<kH1>(g1s + rg * kH1, 2 * kH1, w1 + k, kIn, d);
#pragma unroll
      for (int i = 0; i < kBwdDxRows / 2; ++i) {
        const int r = rg + 2 * i;
        if (r < rows) dx[int64_t(r0 + r) * kIn + k] = d[i];
      }
    }
    return;
  }
  {  // g1[:, J]: a thread's unit j, rows 32 apart
    const int j = t % kBwdUnits;
    for (int r = t / kBwdUnits; r < rows; r += kGradThreads / kBwdUnits) {
      float acc = 0.f;
#pragma unroll 16
      for (int m = 0; m < kH2; ++m) acc = fmaf(g2s[r * kG2Stride + m], w2s[m * kBwdUnits + j], acc);
      g1s[r * kBwdUnits + j] = masked(acc, h1, int64_t(r) * kH1 + j0 + j);
    }
  }
  __syncthreads();
  float acc[kBwdUnits] = {};
  if (t < 128) {  // dW1[J, k] = sum_r g1[r, J] x[r, k]: a thread's input k, every unit of J
    const int k = t;
    if (k < kIn) {
#pragma unroll 4
      for (int r = 0; r < rows; ++r) {
        const float xv = __ldg(x + int64_t(r) * kIn + k);
        const float4 ga = lds4(g1s + r * kBwdUnits), gb = lds4(g1s + r * kBwdUnits + 4);
        const float g[kBwdUnits] = {ga.x, ga.y, ga.z, ga.w, gb.x, gb.y, gb.z, gb.w};
#pragma unroll
        for (int j = 0; j < kBwdUnits; ++j) acc[j] = fmaf(g[j], xv, acc[j]);
      }
#pragma unroll
      for (int j = 0; j < kBwdUnits; ++j) dw1[(j0 + j) * kIn + k] = acc[j];
    }
  } else if (t < 192) {  // dW2[m, J] = sum_r g2[r, m] h1[r, J]: a thread's m, every unit of J
    const int m = t - 128;
#pragma unroll 4
    for (int r = 0; r < rows; ++r) {
      const float g = g2s[r * kG2Stride + m];
#pragma unroll
      for (int j = 0; j < kBwdUnits; ++j) acc[j] = fmaf(g, __ldg(h1 + int64_t(r) * kH1 + j0 + j), acc[j]);
    }
#pragma unroll
    for (int j = 0; j < kBwdUnits; ++j) dw2[m * kH1 + j0 + j] = acc[j];
  } else {  // 64 threads: dW3's 4 columns of this block (40), db2's 4, db1's 8, db3's 10 (block 0)
    const int u = t - 192;
    if (u < 40) {
      const int o = u / 4, m = b * 4 + u % 4;
      float s = 0.f;
      for (int r = 0; r < rows; ++r) s = fmaf(gy[r * kOut + o], __ldg(h2 + int64_t(r) * kH2 + m), s);
      dw3[o * kH2 + m] = s;
    } else if (u < 44) {
      const int m = b * 4 + u - 40;
      if (db2 != nullptr) db2[m] = bias_sum(rows, [&](int r) { return g2s[r * kG2Stride + m]; });
    } else if (u < 52) {
      const int j = u - 44;
      if (db1 != nullptr) db1[j0 + j] = bias_sum(rows, [&](int r) { return g1s[r * kBwdUnits + j]; });
    } else if (u < 62 && b == 0) {
      const int o = u - 52;
      if (db3 != nullptr) db3[o] = bias_sum(rows, [&](int r) { return gy[r * kOut + o]; });
    }
  }
}

}  // namespace
}  // namespace rawops

extern "C" __global__ void __launch_bounds__(rawops::kGradThreads)
    source_mlp_small_bwd_f32(const float* dy, const float* ym, const float* w1, const float* w2, const float* w3,
                             const float* x, const float* h1, const float* h2, float* dx, float* dw1, float* db1,
                             float* dw2, float* db2, float* dw3, float* db3, long long batch) {
  rawops::source_small_bwd(dy, ym, w1, w2, w3, x, h1, h2, dx, dw1, db1, dw2, db2, dw3, db3, int(batch));
}
