// MLP family: the source network 100-128-64-10 forward in one launch (seed_mlp_fwd_f32).
//
//   y = act(relu(relu(x W1^T + b1) W2^T + b2) W3^T + b3),  act = relu if flags & 1, else none
//   weights in torch.nn.Linear layout: W of shape [out, in], row-major; float32 math (FFMA,
//   no tensor cores), every dot product summed in k order.
// Per sample: 42,752 FLOPs (2 x (100x128 + 128x64 + 64x10)); 400 B of x read, 40 B of y
// written. The hidden activations (128 + 64 per sample) live in shared memory and
// registers only. At batch 2^20: 44.8 GFLOP, 0.67 ms at the H100's FFMA peak (132 SMs x 128
// lanes x 2 x 1.98 GHz = 66.9 TFLOP/s), ~0.9 ms at a realistic 50; memory 0.46 GB / 3 TB/s
// = 0.15 ms. Compute-bound: the kernel is an FFMA pipe with register tiles, not a stream.
// Launch: one block of 128 threads per tile of 64 samples (grid = ceil(batch / 64)); each
// layer is a register-tiled GEMM over the tile (layer 1: 8 samples x 8 units per thread,
// 4 LDS.128 per 64 FFMA; layer 2: 8 x 4, 3 per 32; layer 3: one sample x 10 outputs on
// half the threads, 3% of the FLOPs). Weights are staged through shared memory in K chunks,
// transposed to [k][unit] so a thread reads its units as float4; everything fits the 48 KB
// of static shared memory (47.6 KB: 4 blocks / 16 warps per H100 SM, 1 block on sm_75's
// 64 KB), so no opt-in attribute is needed on any target. The price: each block reads the
// 87 KB of weights again from L2 (1.4 GB of L2 -> SM traffic at 2^20, beside 0.46 GB of
// DRAM). A persistent version holding the weights resident in dynamic shared memory
// (sm_80+: > 100 KB) with 128-sample tiles is the next step if L2 or the per-chunk
// __syncthreads show up in the profile (bench/NOTES.md).
#include "rawops/dependent_launch.cuh"
#include "rawops/dtype.cuh"
#include "rawops/mma_sync.cuh"

namespace rawops {
namespace {

constexpr int kIn = 100, kH1 = 128, kH2 = 64, kOut = 10;
constexpr int kThreads = 128;
constexpr int kTile = 64;    // samples per block
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

// NaN propagates like torch.relu (fmaxf would turn it into 0).
__device__ __forceinline__ float relu(float v) { return (v > 0.f || v != v) ? v : 0.f; }

__device__ __forceinline__ float4 lds4(const float* p) { return *reinterpret_cast<const float4*>(p); }

__device__ __forceinline__ void seed_mlp_fwd(const float* __restrict__ x, const float* __restrict__ w1,
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
  for (int o = 0; o < kOut; ++o) row[o] = (flags & 1) ? relu(out[o]) : out[o];
}

}  // namespace
}  // namespace rawops

// Four blocks per SM where shared memory holds four (sm_80, sm_90, sm_100: <= 128 registers);
// sm_120 holds two (100 KB per SM), so its registers need no cap (at 128 it spilled 28 bytes).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1200
#define RAWOPS_SEED_MIN_BLOCKS 2
#else
#define RAWOPS_SEED_MIN_BLOCKS 4
#endif
extern "C" __global__ void __launch_bounds__(rawops::kThreads, RAWOPS_SEED_MIN_BLOCKS)
    seed_mlp_fwd_f32(const float* x, const float* w1, const float* b1, const float* w2, const float* b2,
                     const float* w3, const float* b3, float* y, float* h1s, float* h2s, long long batch,
                     long long flags) {
  rawops::seed_mlp_fwd(x, w1, b1, w2, b2, w3, b3, y, h1s, h2s, batch, flags);
}

// =====================================================================================
// Small batches of the source network: seed_mlp_small_fwd_f32.
// The tiled kernel above gives one block all of a small batch (batch 32: one block, 60 us,
// latency-bound on its ten staged weight chunks). Here a block of 8 warps takes
// kSmallTile = 2 samples, so a batch of 32 spreads over 16 SMs; each warp owns units and
// reads their weight rows straight from L2 (coalesced: lane k reads W[u][k + 32 i]). A warp's
// partial dot products (units x samples per lane) are summed by one reduce-scatter over the
// lanes (deterministic, 31 shuffles for 32 sums where a butterfly per sum takes 160). Three
// barriers in all.
// =====================================================================================
namespace rawops {
namespace {

constexpr int kSmallTile = 2;
constexpr int kSmallThreads = 256;

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

__device__ __forceinline__ void seed_mlp_small_fwd(const float* __restrict__ x, const float* __restrict__ w1,
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
  l3.apply(h2, nullptr, nullptr, first, batch, (flags & 1) != 0, y, warp, lane);
}

// =====================================================================================
// Float32 backward building blocks (SIMT, exact float32 FMA), used by the source network.
//   mlp_dgrad_f32: out[b][k] = (sum_n G'[b][n] W[n][k]) * (H == null || H[b][k] > 0)
//     with G' = G * (Gm == null || Gm[b][n] > 0): one step of the chain g_{l-1} = (g_l W_l)
//     masked by relu'(z_{l-1}), read off the kept post-ReLU activation (h > 0 iff z > 0).
//   mlp_wgrad_f32: per chunk of rows, P[n][k] = sum_b G'[b][n] A[b][k] and sum_b G'[b][n],
//     written to a float32 workspace; mlp_wgrad_reduce_* adds the chunks in chunk order
//     (deterministic, no atomics) into dW and db.
// =====================================================================================
constexpr int kDgradRows = 64, kDgradChunk = 32, kGradThreads = 256;

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

constexpr int kWgradRows = 32;

// Activation codes shared by the kernels and rawops/mlp.py.
constexpr int kActNone = 0, kActRelu = 1, kActGelu = 2;

__device__ __forceinline__ float activate(float v, int a) {
  if (a == kActRelu) return relu(v);
  if (a == kActGelu) return 0.5f * v * (1.f + erff(v * 0.70710678118654752f));
  return v;
}

__device__ __forceinline__ float activate_grad(float z, int a) {
  if (a == kActRelu) return z > 0.f ? 1.f : 0.f;
  if (a == kActGelu) return 0.5f * (1.f + erff(z * 0.70710678118654752f)) + z * 0.39894228040143268f * __expf(-0.5f * z * z);
  return 1.f;
}

template <int kNI, int kKJ>
__device__ __forceinline__ void wgrad_f32_tile(const float* __restrict__ G, const float* __restrict__ Gm,
                                          const float* __restrict__ A, float* __restrict__ ws, int64_t batch, int N,
                                          int K, int k_p, int64_t db_offset, int64_t stride, int a_act,
                                          int64_t rows_per_chunk,
                                               float (*gs)[129], float (*as)[129]) {
  const int t = threadIdx.x, ng = t / 16, kg = t % 16;
  const int64_t begin = int64_t(blockIdx.x) * rows_per_chunk;
  const int64_t end = begin + rows_per_chunk < batch ? begin + rows_per_chunk : batch;
  float acc[kNI][kKJ];
#pragma unroll
  for (int i = 0; i < kNI; ++i)
#pragma unroll
    for (int j = 0; j < kKJ; ++j) acc[i][j] = 0.f;
  float db = 0.f;
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
    if (t < N)
      for (int r = 0; r < kWgradRows; ++r) db += gs[r][t];
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
  }
  float* part = ws + int64_t(blockIdx.x) * stride;
#pragma unroll
  for (int i = 0; i < kNI; ++i) {
    const int n = ng + 16 * i;
    if (n >= N) continue;
#pragma unroll
    for (int j = 0; j < kKJ; ++j) {
      const int k = kg + 16 * j;
      if (k < K) part[n * k_p + k] = acc[i][j];
    }
  }
  if (t < N) part[db_offset + t] = db;
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

template <typename T>
__device__ __forceinline__ void wgrad_reduce(const float* __restrict__ ws, int64_t chunks, int64_t stride, int N,
                                             int K, int k_p, int64_t db_offset, T* __restrict__ dw,
                                             T* __restrict__ db) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nk = int64_t(N) * K;
  if (e >= nk + (db != nullptr ? N : 0)) return;
  int64_t src;
  if (e < nk) {
    const int n = int(e / K), k = int(e % K);
    src = int64_t(n) * k_p + k;
  } else {
    src = db_offset + (e - nk);
  }
  float s = 0.f;
#pragma unroll 8  // loads issued ahead; the sum stays in chunk order (deterministic)
  for (int64_t c = 0; c < chunks; ++c) s += ws[c * stride + src];
  if (e < nk) dw[e] = from_float<T>(s);
  else db[e - nk] = from_float<T>(s);
}

}  // namespace
}  // namespace rawops

extern "C" __global__ void __launch_bounds__(rawops::kSmallThreads)
    seed_mlp_small_fwd_f32(const float* x, const float* w1, const float* b1, const float* w2, const float* b2,
                           const float* w3, const float* b3, float* y, float* h1s, float* h2s, long long batch,
                           long long flags) {
  rawops::seed_mlp_small_fwd(x, w1, b1, w2, b2, w3, b3, y, h1s, h2s, batch, flags);
}

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

#define RAWOPS_REDUCE(suffix, T)                                                                              \
  extern "C" __global__ void __launch_bounds__(256)                                                          \
      mlp_wgrad_reduce_bwd_##suffix(const float* ws, long long chunks, long long stride, long long N,         \
                                    long long K, long long k_p, long long db_offset, T* dw, T* db) {          \
    rawops::wgrad_reduce<T>(ws, chunks, stride, int(N), int(K), int(k_p), db_offset, dw, db);                \
  }
RAWOPS_REDUCE(f32, float)
RAWOPS_REDUCE(f16, __half)
RAWOPS_REDUCE(bf16, __nv_bfloat16)

// =====================================================================================
// tiny-cuda-nn-style networks in float16 / bfloat16 on tensor cores (WMMA 16x16x16,
// float32 accumulation): tc_mlp_fwd_<dtype>, tc_mlp_bwd_<dtype>, tc_mlp_wgrad_bwd_<dtype>.
//   sizes: n_in in 1..128 (zero-padded to a multiple of 16), `hidden` layers (1..8) of one
//   width (16, 32, 64 or 128), n_out in 1..128; weights in nn.Linear layout [out][in].
// Forward: one block of 8 warps per tile of 128 samples; warp w owns rows 16w..16w+15 of
// the tile for the whole network, so the activations stay in its shared-memory rows (never
// in device memory) and only the weight loads need the block's barriers (2 per layer).
// Training (save != null) also writes each hidden layer's pre-activation z ([hidden][batch]
// [width], dtype T): the backward keeps them instead of recomputing the forward, because
// at these widths the network is memory-bound and the recompute would read x and every
// weight again and redo every layer; z gives both act'(z) and act(z) (GELU needs z).
// Backward chain (tc_mlp_bwd): same tile walk in reverse, g_{l-1} = (g_l W_l) * act'(z_{l-1}),
// each g written to a workspace for the weight gradients, dx = g_0 W_0 when asked.
// Weight gradients (tc_mlp_wgrad_bwd): per chunk of rows, dW_l partial = g_l^T a_l on tensor
// cores and db_l partial = column sums, to a float32 workspace; mlp_wgrad_reduce_bwd_* adds
// the chunks in order. Deterministic, no atomics.
// =====================================================================================
#include <mma.h>

namespace rawops {
namespace {

constexpr int kTcWarps = 8, kTcThreads = 32 * kTcWarps, kTcRows = 16 * kTcWarps;
constexpr int kTcMaxLayers = 9;
constexpr int kWgradTcRows = 64;

__host__ __device__ constexpr int round16(int v) { return (v + 15) / 16 * 16; }

// dst[r][c] (r < rows_total, c < cols_p; row stride ld) = f(src[r][c]) for r < rows_valid,
// c < cols, else 0; f: optional mask m (value kept where m > 0) then activation a. Done by
// `nthreads` threads (a block, or one warp for its own rows), four loads in flight per
// thread before any store (a loop of load-then-store pays one memory latency per element).
template <typename T>
__device__ __forceinline__ void load_rows(T* __restrict__ dst, int ld, const T* __restrict__ src, int64_t stride,
                                          int rows_valid, int rows_total, int cols, int cols_p,
                                          const T* __restrict__ m, int a, int tid, int nthreads) {
  constexpr int kV = 16 / sizeof(T), kBatch = 4;
  const bool vec = cols % kV == 0 && stride % kV == 0 && (reinterpret_cast<size_t>(src) % 16) == 0 &&
                   (m == nullptr || (reinterpret_cast<size_t>(m) % 16) == 0);
  if (vec) {
    const int per_row = cols_p / kV, total = rows_total * per_row;
    for (int base = tid; base < total; base += kBatch * nthreads) {
      Vec16<T> v[kBatch], mv[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const int e = base + i * nthreads;
        const int r = e / per_row, c = (e % per_row) * kV;
        if (e < total && r < rows_valid && c < cols) {
          v[i] = load16(src + r * stride + c);
          if (m != nullptr) mv[i] = load16(m + r * stride + c);
        } else {
#pragma unroll
          for (int j = 0; j < kV; ++j) v[i].v[j] = from_float<T>(0.f);
        }
      }
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const int e = base + i * nthreads;
        if (e >= total) break;
        const int r = e / per_row, c = (e % per_row) * kV;
        if ((m != nullptr || a != kActNone) && r < rows_valid && c < cols) {
#pragma unroll
          for (int j = 0; j < kV; ++j) {
            float f = to_float(v[i].v[j]);
            if (m != nullptr && !(to_float(mv[i].v[j]) > 0.f)) f = 0.f;
            v[i].v[j] = from_float<T>(activate(f, a));
          }
        }
        *reinterpret_cast<Vec16<T>*>(dst + r * ld + c) = v[i];
      }
    }
  } else {
    const int total = rows_total * cols_p;
    for (int base = tid; base < total; base += kBatch * nthreads) {
      float f[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const int e = base + i * nthreads;
        const int r = e / cols_p, c = e % cols_p;
        f[i] = 0.f;
        if (e < total && r < rows_valid && c < cols) {
          f[i] = to_float(src[r * stride + c]);
          if (m != nullptr && !(to_float(m[r * stride + c]) > 0.f)) f[i] = 0.f;
        }
      }
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const int e = base + i * nthreads;
        if (e >= total) break;
        const int r = e / cols_p, c = e % cols_p;
        dst[r * ld + c] = from_float<T>(activate(f[i], a));
      }
    }
  }
}

struct TcShape {
  int n_in, width, n_out, hidden, layers;
  int act_ld, w_ld;
  __device__ TcShape(int n_in_, int width_, int n_out_, int hidden_)
      : n_in(n_in_), width(width_), n_out(n_out_), hidden(hidden_), layers(hidden_ + 1) {
    const int in_p = round16(n_in), out_p = round16(n_out);
    const int p = max(max(in_p, width), out_p);
    act_ld = p + 8;
    w_ld = max(in_p, width) + 8;
  }
  __device__ int in_of(int l) const { return l == 0 ? n_in : width; }
  __device__ int out_of(int l) const { return l == layers - 1 ? n_out : width; }
  // Resident kernels: layer l's weights start this many elements into the weight area.
  __device__ int w_offset(int l) const { return l == 0 ? 0 : (round16(width) * (l - 1) + width) * w_ld; }
};

// Shared memory of the tile kernels (rawops/mlp.py computes the same): float scratch (256 per
// warp), 128 float biases per layer held (one when streaming, all when resident), the
// activation tile [128][act_ld] and the weights: one layer [max(width, out_p)][w_ld] when
// streaming, every layer stacked ([out_p of layer l][w_ld] at w_offset(l)) when resident.
template <typename T> struct TcSmem {
  float* scratch;
  float* bias;
  T* act;
  T* w;
  __device__ TcSmem(unsigned char* base, const TcShape& s, int bias_layers) {
    scratch = reinterpret_cast<float*>(base);
    bias = scratch + kTcWarps * 256;
    act = reinterpret_cast<T*>(bias + 128 * bias_layers);
    w = act + kTcRows * s.act_ld;
  }
};

template <typename T, typename LayoutB>
using FragB = nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, T, LayoutB>;
template <typename T, typename LayoutA>
using FragA = nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, T, LayoutA>;
using FragC = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float>;

// std::conditional without <type_traits> (NVRTC, the fallback compiler, lacks it).
template <bool kRowMajor> struct PickLayout { using type = nvcuda::wmma::col_major; };
template <> struct PickLayout<true> { using type = nvcuda::wmma::row_major; };

// acc[nf] (nf < n_p / 16) = act rows of this warp (16 x k_p) times B; B[k][n] at
// w[n * w_ld + k] (forward: the weight W[o][i], k = i) or w[k * w_ld + n] (backward: k = o).
template <typename T, bool kTransposed, int kNF>
__device__ __forceinline__ void warp_gemm(FragC (&acc)[kNF], const T* a, int a_ld, const T* w, int w_ld, int k_p,
                                          int n_p) {
  using namespace nvcuda;
  using LayoutB = typename PickLayout<kTransposed>::type;
#pragma unroll
  for (int nf = 0; nf < kNF; ++nf) wmma::fill_fragment(acc[nf], 0.f);
  for (int kf = 0; kf < k_p / 16; ++kf) {
    FragA<T, wmma::row_major> fa;
    wmma::load_matrix_sync(fa, a + kf * 16, a_ld);
#pragma unroll
    for (int nf = 0; nf < kNF; ++nf) {
      if (nf * 16 < n_p) {
        FragB<T, LayoutB> fb;
        wmma::load_matrix_sync(fb, kTransposed ? w + kf * 16 * w_ld + nf * 16 : w + nf * 16 * w_ld + kf * 16, w_ld);
        wmma::mma_sync(acc[nf], fa, fb, acc[nf]);
      }
    }
  }
}

// Writes 8 values (one row segment of a 16x16 fragment) to row `row`, columns c..c+7 of a
// [*][cols] array, 16-byte store when the segment is whole and aligned.
template <typename T>
__device__ __forceinline__ void store_segment(T* base, int64_t row, int cols, int c, const float (&v)[8]) {
  T* p = base + row * cols + c;
  if (c + 8 <= cols && (reinterpret_cast<size_t>(p) % 16) == 0 && sizeof(T) == 2) {
    Vec16<T> out;
#pragma unroll
    for (int j = 0; j < 8; ++j) out.v[j] = from_float<T>(v[j]);
    *reinterpret_cast<Vec16<T>*>(p) = out;
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j)
      if (c + j < cols) p[j] = from_float<T>(v[j]);
  }
}

template <typename T>
__device__ __forceinline__ void load_layer(T* w, float* bias, const TcShape& s, const T* W, const T* B, int l) {
  const int in_l = s.in_of(l), out_l = s.out_of(l);
  load_rows<T>(w, s.w_ld, W, in_l, out_l, round16(out_l), in_l, round16(in_l), nullptr, kActNone, threadIdx.x,
               blockDim.x);
  if (bias != nullptr)
    for (int t = threadIdx.x; t < 128; t += blockDim.x) bias[t] = (B != nullptr && t < out_l) ? to_float(B[t]) : 0.f;
}

// One forward layer for one warp's 16 rows (global rows row0..row0+15) held in `a`: the
// outputs overwrite the inputs in place (hidden layers), or go to y (last layer).
template <typename T, int kNF>
__device__ __forceinline__ void fwd_layer(const TcShape& s, int l, T* a, const T* w, const float* bias,
                                          float* scratch, int64_t row0, int64_t batch, T* y, T* save, int act,
                                          int out_act) {
  using namespace nvcuda;
  const int lane = threadIdx.x % 32, r = lane / 2, c0 = (lane % 2) * 8;
  const int64_t row = row0 + r;
  const int in_p = round16(s.in_of(l)), out_p = round16(s.out_of(l));
  FragC acc[kNF];
  warp_gemm<T, false, kNF>(acc, a, s.act_ld, w, s.w_ld, in_p, out_p);
  __syncwarp();  // every lane has read its rows: the outputs may overwrite them
  const bool last = l == s.layers - 1;
#pragma unroll
  for (int nf = 0; nf < kNF; ++nf) {
    if (nf * 16 >= out_p) break;
    wmma::store_matrix_sync(scratch, acc[nf], 16, wmma::mem_row_major);
    __syncwarp();
    float v[8], h[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      v[j] = scratch[r * 16 + c0 + j] + bias[nf * 16 + c0 + j];
      h[j] = activate(v[j], last ? out_act : act);
    }
    if (!last) {
      if (save != nullptr && row < batch)
        store_segment<T>(save + int64_t(l) * batch * s.width, row, s.width, nf * 16 + c0, v);
      Vec16<T> hv;
#pragma unroll
      for (int j = 0; j < 8; ++j) hv.v[j] = from_float<T>(h[j]);
      *reinterpret_cast<Vec16<T>*>(a + r * s.act_ld + nf * 16 + c0) = hv;
    } else if (row < batch) {
      store_segment<T>(y, row, s.n_out, nf * 16 + c0, h);
    }
    __syncwarp();
  }
}

// One backward layer for one warp's rows: g_l in `a` ([16][out_p]) becomes
// g_{l-1} = (g_l W_l) * act'(z_{l-1}) in place (written to gws too), or dx for l = 0.
template <typename T, int kNF>
__device__ __forceinline__ void bwd_layer(const TcShape& s, int l, T* a, const T* w, float* scratch, int64_t row0,
                                          int64_t batch, const T* save, T* gws, T* dx, int act) {
  using namespace nvcuda;
  const int lane = threadIdx.x % 32, r = lane / 2, c0 = (lane % 2) * 8;
  const int64_t row = row0 + r;
  const int in_p = round16(s.in_of(l)), out_p = round16(s.out_of(l));
  const int64_t base = l > 0 ? int64_t(l - 1) * batch * s.width : 0;
  Vec16<T> zv[kNF];  // z_{l-1} of this lane's row segments, fetched before the product
  if (l > 0 && row < batch) {
#pragma unroll
    for (int nf = 0; nf < kNF; ++nf)
      if (nf * 16 < in_p) zv[nf] = load16(save + base + row * s.width + nf * 16 + c0);
  }
  FragC acc[kNF];
  warp_gemm<T, true, kNF>(acc, a, s.act_ld, w, s.w_ld, out_p, in_p);
  __syncwarp();
#pragma unroll
  for (int nf = 0; nf < kNF; ++nf) {
    if (nf * 16 >= in_p) break;
    wmma::store_matrix_sync(scratch, acc[nf], 16, wmma::mem_row_major);
    __syncwarp();
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = scratch[r * 16 + c0 + j];
    if (l > 0) {
      if (row < batch) {
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] *= activate_grad(to_float(zv[nf].v[j]), act);
        store_segment<T>(gws + base, row, s.width, nf * 16 + c0, v);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = 0.f;
      }
      Vec16<T> gv;
#pragma unroll
      for (int j = 0; j < 8; ++j) gv.v[j] = from_float<T>(v[j]);
      *reinterpret_cast<Vec16<T>*>(a + r * s.act_ld + nf * 16 + c0) = gv;
    } else if (row < batch) {
      store_segment<T>(dx, row, s.n_in, nf * 16 + c0, v);
    }
    __syncwarp();
  }
}

constexpr int kResident = 16;  // flags bit: weights resident in shared memory, persistent warps

// Streaming: one block per 128-row tile, each layer's weights loaded in turn (2 barriers per
// layer); for networks whose weights do not fit in shared memory at once.
// Resident: every layer's weights loaded once per block; then each warp loops over 16-row
// tiles (tile = global warp, + all warps of the grid) with no block barrier at all.
template <typename T, int kNF>
__device__ void tc_fwd(const T* __restrict__ x, T* __restrict__ y, T* __restrict__ save, const T* const* W,
                       const T* const* B, int64_t batch, int n_in, int width, int n_out, int hidden, int flags) {
  extern __shared__ __align__(128) unsigned char tc_smem[];
  const TcShape s(n_in, width, n_out, hidden);
  const bool resident = (flags & kResident) != 0;
  const TcSmem<T> sm(tc_smem, s, resident ? s.layers : 1);
  const int act = flags & 3, out_act = (flags >> 2) & 3;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  T* a = sm.act + warp * 16 * s.act_ld;
  float* scratch = sm.scratch + warp * 256;
  if (resident) {
    for (int l = 0; l < s.layers; ++l) load_layer<T>(sm.w + s.w_offset(l), sm.bias + 128 * l, s, W[l], B[l], l);
    __syncthreads();
    const int64_t tiles = (batch + 15) / 16;
    for (int64_t tile = int64_t(blockIdx.x) * kTcWarps + warp; tile < tiles; tile += int64_t(gridDim.x) * kTcWarps) {
      const int64_t row0 = tile * 16;
      const int rows_valid = int(batch - row0 < 16 ? batch - row0 : 16);
      load_rows<T>(a, s.act_ld, x + row0 * n_in, n_in, rows_valid, 16, n_in, round16(n_in), nullptr, kActNone, lane, 32);
      __syncwarp();
      for (int l = 0; l < s.layers; ++l)
        fwd_layer<T, kNF>(s, l, a, sm.w + s.w_offset(l), sm.bias + 128 * l, scratch, row0, batch, y, save, act, out_act);
    }
    return;
  }
  const int64_t row0 = int64_t(blockIdx.x) * kTcRows;
  const int rows_valid = int(batch - row0 < kTcRows ? batch - row0 : kTcRows);
  load_rows<T>(sm.act, s.act_ld, x + row0 * n_in, n_in, rows_valid, kTcRows, n_in, round16(n_in), nullptr, kActNone,
               threadIdx.x, blockDim.x);
  for (int l = 0; l < s.layers; ++l) {
    __syncthreads();  // x loaded (l = 0); every warp done with the previous layer's weights
    load_layer<T>(sm.w, sm.bias, s, W[l], B[l], l);
    __syncthreads();
    fwd_layer<T, kNF>(s, l, a, sm.w, sm.bias, scratch, row0 + warp * 16, batch, y, save, act, out_act);
  }
}

template <typename T, int kNF>
__device__ void tc_bwd(const T* __restrict__ dy, const T* __restrict__ y, const T* __restrict__ save,
                       T* __restrict__ gws, T* __restrict__ dx, const T* const* W, int64_t batch, int n_in, int width,
                       int n_out, int hidden, int flags) {
  extern __shared__ __align__(128) unsigned char tc_smem[];
  const TcShape s(n_in, width, n_out, hidden);
  const bool resident = (flags & kResident) != 0;
  const TcSmem<T> sm(tc_smem, s, resident ? s.layers : 1);
  const int act = flags & 3, out_act = (flags >> 2) & 3;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int last = dx == nullptr ? 1 : 0;  // the lowest layer walked: 0 computes dx
  T* a = sm.act + warp * 16 * s.act_ld;
  float* scratch = sm.scratch + warp * 256;
  if (resident) {
    for (int l = last; l < s.layers; ++l) load_layer<T>(sm.w + s.w_offset(l), nullptr, s, W[l], nullptr, l);
    __syncthreads();
    const int64_t tiles = (batch + 15) / 16;
    for (int64_t tile = int64_t(blockIdx.x) * kTcWarps + warp; tile < tiles; tile += int64_t(gridDim.x) * kTcWarps) {
      const int64_t row0 = tile * 16;
      const int rows_valid = int(batch - row0 < 16 ? batch - row0 : 16);
      // g of the last layer: dy, masked by relu'(y) for an output ReLU.
      load_rows<T>(a, s.act_ld, dy + row0 * n_out, n_out, rows_valid, 16, n_out, round16(n_out),
                   out_act == kActRelu ? y + row0 * n_out : nullptr, kActNone, lane, 32);
      __syncwarp();
      for (int l = s.layers - 1; l >= last; --l)
        bwd_layer<T, kNF>(s, l, a, sm.w + s.w_offset(l), scratch, row0, batch, save, gws, dx, act);
    }
    return;
  }
  const int64_t row0 = int64_t(blockIdx.x) * kTcRows;
  const int rows_valid = int(batch - row0 < kTcRows ? batch - row0 : kTcRows);
  load_rows<T>(sm.act, s.act_ld, dy + row0 * n_out, n_out, rows_valid, kTcRows, n_out, round16(n_out),
               out_act == kActRelu ? y + row0 * n_out : nullptr, kActNone, threadIdx.x, blockDim.x);
  for (int l = s.layers - 1; l >= last; --l) {
    __syncthreads();
    load_layer<T>(sm.w, nullptr, s, W[l], nullptr, l);
    __syncthreads();
    bwd_layer<T, kNF>(s, l, a, sm.w, scratch, row0 + warp * 16, batch, save, gws, dx, act);
  }
}

// Partial weight gradient of one layer over one chunk of rows: ws[chunk] = [n_p][k_p] of
// sum_b G'[b][n] act(A[b][k]), then n_p column sums of G' at db_offset.
template <typename T, int kFPW>
__device__ void tc_wgrad(const T* __restrict__ G, const T* __restrict__ Gm, const T* __restrict__ A,
                         float* __restrict__ ws, int64_t batch, int N, int K, int64_t db_offset, int64_t stride,
                         int a_act, int64_t rows_per_chunk) {
  using namespace nvcuda;
  extern __shared__ __align__(128) unsigned char tc_smem[];
  const int n_p = round16(N), k_p = round16(K);
  const int g_ld = n_p + 8, a_ld = k_p + 8;
  T* gs = reinterpret_cast<T*>(tc_smem);
  T* as = gs + kWgradTcRows * g_ld;
  const int t = threadIdx.x, warp = t / 32;
  const int nfc = n_p / 16, kfc = k_p / 16, frags = nfc * kfc;
  const int64_t begin = int64_t(blockIdx.x) * rows_per_chunk;
  const int64_t end = begin + rows_per_chunk < batch ? begin + rows_per_chunk : batch;
  FragC acc[kFPW];
#pragma unroll
  for (int i = 0; i < kFPW; ++i) wmma::fill_fragment(acc[i], 0.f);
  float db = 0.f;
  for (int64_t r0 = begin; r0 < end; r0 += kWgradTcRows) {
    const int rows = int(end - r0 < kWgradTcRows ? end - r0 : kWgradTcRows);
    __syncthreads();
    load_rows<T>(gs, g_ld, G + r0 * N, N, rows, kWgradTcRows, N, n_p, Gm != nullptr ? Gm + r0 * N : nullptr,
                 kActNone, t, blockDim.x);
    load_rows<T>(as, a_ld, A + r0 * K, K, rows, kWgradTcRows, K, k_p, nullptr, a_act, t, blockDim.x);
    __syncthreads();
    if (t < n_p)
      for (int rr = 0; rr < kWgradTcRows; ++rr) db += to_float(gs[rr * g_ld + t]);
#pragma unroll
    for (int i = 0; i < kFPW; ++i) {
      const int f = warp + kTcWarps * i;
      if (f >= frags) break;
      const int nf = f / kfc, kf = f % kfc;
#pragma unroll
      for (int ks = 0; ks < kWgradTcRows / 16; ++ks) {
        FragA<T, wmma::col_major> fa;
        FragB<T, wmma::row_major> fb;
        wmma::load_matrix_sync(fa, gs + ks * 16 * g_ld + nf * 16, g_ld);
        wmma::load_matrix_sync(fb, as + ks * 16 * a_ld + kf * 16, a_ld);
        wmma::mma_sync(acc[i], fa, fb, acc[i]);
      }
    }
  }
  float* part = ws + int64_t(blockIdx.x) * stride;
#pragma unroll
  for (int i = 0; i < kFPW; ++i) {
    const int f = warp + kTcWarps * i;
    if (f >= frags) break;
    const int nf = f / kfc, kf = f % kfc;
    wmma::store_matrix_sync(part + nf * 16 * k_p + kf * 16, acc[i], k_p, wmma::mem_row_major);
  }
  if (t < n_p) part[db_offset + t] = db;
}

}  // namespace
}  // namespace rawops

#define RAWOPS_TC_PARAMS(T)                                                                                     \
  const T *w0, const T *w1, const T *w2, const T *w3, const T *w4, const T *w5, const T *w6, const T *w7,      \
      const T *w8
#define RAWOPS_TC_BIASES(T)                                                                                     \
  const T *b0, const T *b1, const T *b2, const T *b3, const T *b4, const T *b5, const T *b6, const T *b7,      \
      const T *b8

// One set of entries per accumulator count NF (fragments of 16 columns a warp holds: the
// widest layer / 16, rounded up to 4 or 8; for the weight gradient, fragments per warp
// of the [out][in] gradient / 8 warps), so that narrow networks do not pay a 128-wide
// network's registers. Two blocks per SM where that costs no spills (ptxas, sm_90). NF 1 and 2
// were measured by ptxas only (71/86 registers forward) and dropped to keep the build short. bfloat16 WMMA needs sm_80; older targets get a
// trap (rawops/mlp.py refuses before launch).
#define RAWOPS_TC_NF(suffix, T, NF, MINB, MINB_WGRAD)                                                           \
  extern "C" __global__ void __launch_bounds__(rawops::kTcThreads, MINB)                                       \
      tc_mlp_nf##NF##_fwd_##suffix(const T* x, T* y, T* save, RAWOPS_TC_PARAMS(T), RAWOPS_TC_BIASES(T),         \
                                   long long batch, long long n_in, long long width, long long n_out,          \
                                   long long hidden, long long flags) {                                        \
    const T* W[rawops::kTcMaxLayers] = {w0, w1, w2, w3, w4, w5, w6, w7, w8};                                   \
    const T* B[rawops::kTcMaxLayers] = {b0, b1, b2, b3, b4, b5, b6, b7, b8};                                   \
    RAWOPS_TC_CALL((rawops::tc_fwd<T, NF>(x, y, save, W, B, batch, int(n_in), int(width), int(n_out),           \
                                          int(hidden), int(flags))));                                          \
  }                                                                                                            \
  extern "C" __global__ void __launch_bounds__(rawops::kTcThreads, MINB)                                       \
      tc_mlp_nf##NF##_bwd_##suffix(const T* dy, const T* y, const T* save, T* gws, T* dx, RAWOPS_TC_PARAMS(T),  \
                                   long long batch, long long n_in, long long width, long long n_out,          \
                                   long long hidden, long long flags) {                                        \
    const T* W[rawops::kTcMaxLayers] = {w0, w1, w2, w3, w4, w5, w6, w7, w8};                                   \
    RAWOPS_TC_CALL((rawops::tc_bwd<T, NF>(dy, y, save, gws, dx, W, batch, int(n_in), int(width), int(n_out),    \
                                          int(hidden), int(flags))));                                          \
  }                                                                                                            \
  extern "C" __global__ void __launch_bounds__(rawops::kTcThreads, MINB_WGRAD)                                 \
      tc_mlp_wgrad_nf##NF##_bwd_##suffix(const T* G, const T* Gm, const T* A, float* ws, long long batch,       \
                                         long long N, long long K, long long db_offset, long long stride,      \
                                         long long a_act, long long rows_per_chunk) {                          \
    RAWOPS_TC_CALL((rawops::tc_wgrad<T, NF>(G, Gm, A, ws, batch, int(N), int(K), db_offset, stride,             \
                                            int(a_act), rows_per_chunk)));                                     \
  }

#define RAWOPS_TC_ENTRIES(suffix, T)                                                                           \
  RAWOPS_TC_NF(suffix, T, 4, 2, 1)                                                                             \
  RAWOPS_TC_NF(suffix, T, 8, 1, 1)

#define RAWOPS_TC_CALL(call) call
RAWOPS_TC_ENTRIES(f16, __half)
#undef RAWOPS_TC_CALL
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define RAWOPS_TC_CALL(call) call
#else
#define RAWOPS_TC_CALL(call) __trap()
#endif
RAWOPS_TC_ENTRIES(bf16, __nv_bfloat16)
#undef RAWOPS_TC_CALL

// =====================================================================================
// The tensor-core forward with register-resident activations: tc_mlp_w<W>_<act>_fwd_<dtype>
// (W = hidden width 16/32/64/128, act = the hidden activation relu/gelu/none), sm_80+,
// mma.sync m16n8k16 (float32 accumulation) in inline PTX. Same arguments and results as tc_mlp_nf*_fwd (also the training forward's
// saved pre-activations), used wherever every layer's weights fit in shared memory beside
// the warps' staging rows (rawops/mlp.py: fast_fit); the WMMA kernels above serve the rest.
//
// Why: tc_mlp_nf*_fwd was shared-memory-bound (ncu: L1 86%, DRAM 14%, 460 us for the 64x4
// f16 network at 2^20): every 16-row warp tile re-read the whole layer's weight fragments
// and bounced every accumulator through shared memory. Here a warp owns kRows = 16 * kMT
// rows (32; 16 for W = 128, where 32 rows would need 128 accumulator registers) and walks
// all layers with its activations in registers: the C fragments of two n8 tiles, bias and
// activation applied and packed to half2, are exactly the A fragment of one k16 slice of
// the next layer. Each B fragment (ldmatrix.x4 from the resident, padded weights) feeds
// 2 * kMT mma, so a 64-wide layer moves 8 KB of shared memory per 32 rows (was 8 KB per
// 16 rows plus 4 KB of accumulator round trips). x comes in by cp.async (16-byte, coalesced,
// zero-filled padding) into the warp's staging rows, the next tile's fetch issued as soon as
// layer 0 has read them; y leaves through the warp's output rows as 16-byte coalesced stores.
// Launch: persistent, one block of up to 16 warps per SM (64-wide network: 191 KB of shared
// memory), warps loop over kRows-row tiles with no block barrier after the weight load.
// Floor for the 64x4 f16 network at 2^20: x + y 256 MB = 89 us at 3.0 TB/s; 43 GFLOP on
// mma.sync. Measured: bench/NOTES.md.
// =====================================================================================
namespace rawops {
namespace {

template <typename T> struct Mma;
template <> struct Mma<__half> {
  __device__ static __forceinline__ unsigned pack(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&h);
  }
  // max(v, 0) on both halves, NaN kept (torch.relu's semantics).
  __device__ static __forceinline__ unsigned relu(unsigned v) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    const __half2 h = __hmax2_nan(*reinterpret_cast<const __half2*>(&v), __float2half2_rn(0.f));
    return *reinterpret_cast<const unsigned*>(&h);
#else
    return v;
#endif
  }
  __device__ static __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    mma_m16n8k16<__half>(d, a, b0, b1);
  }
};
template <> struct Mma<__nv_bfloat16> {
  __device__ static __forceinline__ unsigned pack(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&h);
  }
  __device__ static __forceinline__ unsigned relu(unsigned v) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    const __nv_bfloat162 h =
        __hmax2_nan(*reinterpret_cast<const __nv_bfloat162*>(&v), __float2bfloat162_rn(0.f));
    return *reinterpret_cast<const unsigned*>(&h);
#else
    return v;
#endif
  }
  __device__ static __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    mma_m16n8k16<__nv_bfloat16>(d, a, b0, b1);
  }
};

__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// 16 bytes global -> shared without a register round trip; src_bytes 0 writes zeros.
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Packs act(lo), act(hi) (float) into the storage type's pair.
template <typename T, int kAct> __device__ __forceinline__ unsigned act_pack(float lo, float hi) {
  if (kAct == kActRelu) return Mma<T>::relu(Mma<T>::pack(lo, hi));
  if (kAct == kActGelu) return Mma<T>::pack(activate(lo, kActGelu), activate(hi, kActGelu));
  return Mma<T>::pack(lo, hi);
}

// e / d and e % d for 0 <= e < 2^12, 1 <= d <= 16 through a float reciprocal computed once
// (exact at these sizes: the error of (e + 0.5) * inv stays far under 0.5 / d); a runtime
// integer division costs ~15 instructions, and the staging loops do one per 16-byte chunk.
struct SmallDiv {
  int d;
  float inv;
  __device__ explicit SmallDiv(int d_) : d(d_), inv(1.f / float(d_)) {}
  __device__ __forceinline__ int quot(int e) const { return int((float(e) + 0.5f) * inv); }
};

// The warp's kRows x in_p rows of x into its staging rows xs (row stride ldx), columns past
// n_in and rows past rows_valid as zeros: cp.async 16-byte chunks when rows are whole 16-byte
// vectors (cpr = in_p / 8 chunks a row), else element by element (odd n_in, misaligned x).
template <typename T, int kRows>
__device__ __forceinline__ void fetch_x(T* xs, int ldx, const T* __restrict__ xt, int rows_valid, int n_in, int in_p,
                                        const SmallDiv& cpr, bool vec, int lane) {
  if (vec) {
    const unsigned base = smem_addr(xs);
    for (int e = lane; e < kRows * cpr.d; e += 32) {
      const int r = cpr.quot(e), c = (e - r * cpr.d) * 8;
      const bool ok = r < rows_valid && c < n_in;
      cp_async16(base + 2u * unsigned(r * ldx + c), ok ? xt + r * n_in + c : xt, ok ? 16 : 0);
    }
    cp_async_commit();
  } else {
    for (int e = lane; e < kRows * in_p; e += 32) {
      const int r = e / in_p, c = e - r * in_p;
      xs[r * ldx + c] = (r < rows_valid && c < n_in) ? xt[r * n_in + c] : from_float<T>(0.f);
    }
  }
}

// Stores one m16 x 16-column chunk held in the C-fragment layout (w[2h + half]: row g + 8 half,
// columns 8h + 2t, +1) as 16-byte row segments: lane t of a quad ends with row g + 8 (t / 2),
// columns 8 (t % 2) .. +7. With u[q] = w[{0, 2, 1, 3}[q]] (the word lane q wants) that is a 4x4
// transpose of u across the quad, done as two butterfly stages (lanes t ^ 2, then t ^ 1) of
// two shuffles and six selects each, branch-free. 4-byte stores of the fragments left every
// 32-byte sector half written per instruction (the training forward ran at 840 us against 200
// us for inference, H100, 64x4 f16 at 2^20); a first transpose picked words by index, which
// nvcc compiled into branches around every shuffle.
template <typename T>
__device__ __forceinline__ void store_chunk16(T* __restrict__ z, int width, int rows_valid, int row0, int col,
                                              const unsigned (&w)[4], int lane) {
  const int t = lane % 4;
  const bool hi2 = t & 2, hi1 = t & 1;
  unsigned v0 = w[0], v1 = w[2], v2 = w[1], v3 = w[3];
  // Stage 1: the off-diagonal 2x2 blocks change lanes (t ^ 2).
  {
    const unsigned r0 = __shfl_xor_sync(0xffffffffu, hi2 ? v0 : v2, 2);
    const unsigned r1 = __shfl_xor_sync(0xffffffffu, hi2 ? v1 : v3, 2);
    v0 = hi2 ? r0 : v0;
    v1 = hi2 ? r1 : v1;
    v2 = hi2 ? v2 : r0;
    v3 = hi2 ? v3 : r1;
  }
  // Stage 2: within each 2x2 block (t ^ 1).
  const unsigned r0 = __shfl_xor_sync(0xffffffffu, hi1 ? v0 : v1, 1);
  const unsigned r1 = __shfl_xor_sync(0xffffffffu, hi1 ? v2 : v3, 1);
  const uint4 seg = hi1 ? make_uint4(r0, v1, r1, v3) : make_uint4(v0, r0, v2, r1);
  const int r = row0 + lane / 4 + 8 * (t / 2);
  if (r < rows_valid) *reinterpret_cast<uint4*>(z + r * width + col + 8 * (t % 2)) = seg;
}

// Bias + activation of one 16-column chunk (two n8 tiles) of kMT m16 tiles, packed into the
// A fragments of the next layer's k16 slice; the pre-activation z stored when z != null
// (the tile's rows of this layer's [batch][width], columns col..col+15).
template <typename T, int kMT, int kAct>
__device__ __forceinline__ void chunk_to_a(const float (&acc)[kMT][2][4], unsigned (&out)[kMT][4],
                                           const float* bias, T* __restrict__ z, int rows_valid, int width, int col,
                                           int lane) {
  const int t = lane % 4;
  const float2 b[2] = {*reinterpret_cast<const float2*>(bias + col + 2 * t),
                       *reinterpret_cast<const float2*>(bias + col + 8 + 2 * t)};
#pragma unroll
  for (int m = 0; m < kMT; ++m) {
    unsigned zw[4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float v0 = acc[m][h][0] + b[h].x, v1 = acc[m][h][1] + b[h].y;  // row g
      const float v2 = acc[m][h][2] + b[h].x, v3 = acc[m][h][3] + b[h].y;  // row g + 8
      zw[2 * h] = Mma<T>::pack(v0, v1);
      zw[2 * h + 1] = Mma<T>::pack(v2, v3);
      out[m][2 * h] = act_pack<T, kAct>(v0, v1);
      out[m][2 * h + 1] = act_pack<T, kAct>(v2, v3);
    }
    if (z != nullptr) store_chunk16<T>(z, width, rows_valid, m * 16, col, zw, lane);
  }
}

// One width -> width layer on the warp's rows, activations in registers both sides: `in` are
// the A fragments (k16 slice kk of m16 tile m), `out` the next layer's; wb the lane's
// ldmatrix address into the layer's [kW][kW + 8] weights.
// acc = a (the warp's kMT 16-row tiles, kKT k-fragments each) @ the 16 weight columns whose
// first row (of `ld` elements) starts at shared address wb: kKT ldmatrix.x4 of B fragments,
// each feeding 2 mma.sync per row tile.
template <typename T, int kMT, int kKT>
__device__ __forceinline__ void mma_16_columns(float (&acc)[kMT][2][4], const unsigned (&a)[kMT][kKT][4], unsigned wb) {
#pragma unroll
  for (int m = 0; m < kMT; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[m][h][i] = 0.f;
#pragma unroll
  for (int kk = 0; kk < kKT; ++kk) {
    unsigned b[4];
    ldsm_x4(b, wb + 2u * unsigned(kk * 16));
#pragma unroll
    for (int m = 0; m < kMT; ++m) {
      Mma<T>::mma(acc[m][0], a[m][kk], b[0], b[1]);
      Mma<T>::mma(acc[m][1], a[m][kk], b[2], b[3]);
    }
  }
}

template <typename T, int kW, int kMT, int kAct>
__device__ __forceinline__ void hidden_layer(const unsigned (&in)[kMT][kW / 16][4], unsigned (&out)[kMT][kW / 16][4],
                                             unsigned wb, const float* bias, T* z, int rows_valid, int lane) {
  constexpr int kKT = kW / 16, kLdw = kW + 8;
#pragma unroll
  for (int j = 0; j < kKT; ++j) {
    float acc[kMT][2][4];
    mma_16_columns<T, kMT, kKT>(acc, in, wb + 2u * unsigned(j * 16 * kLdw));
    unsigned chunk[kMT][4];
    chunk_to_a<T, kMT, kAct>(acc, chunk, bias, z, rows_valid, kW, j * 16, lane);
#pragma unroll
    for (int m = 0; m < kMT; ++m)
#pragma unroll
      for (int i = 0; i < 4; ++i) out[m][j][i] = chunk[m][i];
  }
}

template <typename T, int kW, int kMT, int kAct>
__device__ void fast_fwd(const T* __restrict__ x, T* __restrict__ y, T* __restrict__ save, const T* const* W,
                         const T* const* B, int64_t batch, int n_in, int n_out, int hidden, int flags) {
  constexpr int kKT = kW / 16, kRows = 16 * kMT, ldw = kW + 8;
  constexpr int kL0 = kKT < 4 ? kKT : 4;  // layer 0's 16-column chunks per pass
  extern __shared__ __align__(128) unsigned char tc_smem[];
  const int layers = hidden + 1;
  const int in_p = round16(n_in), out_p = round16(n_out);
  const int ld0 = in_p + 8, ldy = out_p + 8;  // +8: ldmatrix rows on distinct banks
  // Layout (rawops/mlp.py fast_smem_bytes): float biases [layers][128], weights of layer 0
  // [kW][ld0], of the hidden layers [hidden - 1][kW][ldw], of the output layer [out_p][ldw],
  // then per warp its x rows [kRows][ld0] and its y rows [kRows][ldy].
  float* bias = reinterpret_cast<float*>(tc_smem);
  T* w0 = reinterpret_cast<T*>(bias + 128 * layers);
  T* wh = w0 + kW * ld0;
  T* wl = wh + (hidden - 1) * kW * ldw;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  T* xs = wl + out_p * ldw + warp * kRows * (ld0 + ldy);
  T* ys = xs + kRows * ld0;

  for (int l = 0; l < layers; ++l) {
    const int in_l = l == 0 ? n_in : kW, out_l = l == hidden ? n_out : kW;
    T* dst = l == 0 ? w0 : l == hidden ? wl : wh + (l - 1) * kW * ldw;
    load_rows<T>(dst, l == 0 ? ld0 : ldw, W[l], in_l, out_l, round16(out_l), in_l, round16(in_l), nullptr, kActNone,
                 threadIdx.x, blockDim.x);
  }
  for (int e = threadIdx.x; e < 128 * layers; e += blockDim.x) {
    const int l = e / 128, c = e % 128;
    const T* b = B[l];
    bias[e] = (b != nullptr && c < (l == hidden ? n_out : kW)) ? to_float(b[c]) : 0.f;
  }
  __syncthreads();

  const bool out_relu = ((flags >> 2) & 3) == kActRelu;
  const bool xvec = n_in % 8 == 0 && (reinterpret_cast<size_t>(x) % 16) == 0;
  const bool yvec = n_out % 8 == 0 && (reinterpret_cast<size_t>(y) % 16) == 0;
  const SmallDiv x_cpr(in_p / 8), y_cpr(n_out % 8 == 0 ? n_out / 8 : 1);
  // Per-lane ldmatrix addresses: A rows lane % 16, k half lane / 16; B (weight rows = output
  // columns) rows lane % 8 + 8 * (lane / 16), k half (lane / 8) % 2.
  const unsigned xs_a = smem_addr(xs) + 2u * unsigned((lane % 16) * ld0 + (lane / 16) * 8);
  const int b_row = lane % 8 + 8 * (lane / 16), b_k = ((lane / 8) % 2) * 8;
  const unsigned w0_b = smem_addr(w0) + 2u * unsigned(b_row * ld0 + b_k);
  const unsigned wh_b = smem_addr(wh) + 2u * unsigned(b_row * ldw + b_k);
  const unsigned wl_b = smem_addr(wl) + 2u * unsigned(b_row * ldw + b_k);
  const int g = lane / 4, t = lane % 4;

  // Tiles dealt warp-major (tile = warp * gridDim + block): a last, partial round then lands on
  // a few warps of every SM rather than on every warp of a few SMs.
  const int64_t tiles = (batch + kRows - 1) / kRows, step = int64_t(gridDim.x) * warps;
  int64_t tile = int64_t(warp) * gridDim.x + blockIdx.x;
  auto rows_of = [&](int64_t tl) { return int(batch - tl * kRows < kRows ? batch - tl * kRows : kRows); };
  if (tile < tiles) fetch_x<T, kRows>(xs, ld0, x + tile * kRows * n_in, rows_of(tile), n_in, in_p, x_cpr, xvec, lane);
  for (; tile < tiles; tile += step) {
    const int64_t row0 = tile * kRows;
    const int rows_valid = rows_of(tile);
    cp_async_wait_all();
    __syncwarp();  // x rows visible to the warp; the previous tile's y rows consumed

    // Layer 0: A from the staged x rows, k16 slices in turn, up to 64 output columns held at a
    // time (all 128 at once spilled ~100 bytes for W = 128: ptxas, sm_90).
    unsigned a[kMT][kKT][4], b2[kMT][kKT][4];
#pragma unroll
    for (int j0 = 0; j0 < kKT; j0 += kL0) {
      float acc[kL0][kMT][2][4];
#pragma unroll
      for (int j = 0; j < kL0; ++j)
#pragma unroll
        for (int m = 0; m < kMT; ++m)
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[j][m][h][i] = 0.f;
      for (int kk = 0; kk < in_p / 16; ++kk) {
        unsigned xa[kMT][4];
#pragma unroll
        for (int m = 0; m < kMT; ++m) ldsm_x4(xa[m], xs_a + 2u * unsigned(m * 16 * ld0 + kk * 16));
#pragma unroll
        for (int j = 0; j < kL0; ++j) {
          unsigned b[4];
          ldsm_x4(b, w0_b + 2u * unsigned((j0 + j) * 16 * ld0 + kk * 16));
#pragma unroll
          for (int m = 0; m < kMT; ++m) {
            Mma<T>::mma(acc[j][m][0], xa[m], b[0], b[1]);
            Mma<T>::mma(acc[j][m][1], xa[m], b[2], b[3]);
          }
        }
      }
      if (j0 + kL0 == kKT) {
        __syncwarp();  // every lane has read its x rows: the next tile's fetch may overwrite them
        if (tile + step < tiles)
          fetch_x<T, kRows>(xs, ld0, x + (tile + step) * kRows * n_in, rows_of(tile + step), n_in, in_p, x_cpr, xvec,
                            lane);
      }
      T* z0 = save != nullptr ? save + row0 * kW : nullptr;
#pragma unroll
      for (int j = 0; j < kL0; ++j) {
        unsigned chunk[kMT][4];
        chunk_to_a<T, kMT, kAct>(acc[j], chunk, bias, z0, rows_valid, kW, (j0 + j) * 16, lane);
#pragma unroll
        for (int m = 0; m < kMT; ++m)
#pragma unroll
          for (int i = 0; i < 4; ++i) a[m][j0 + j][i] = chunk[m][i];
      }
    }

    // Hidden layers 1..hidden-1. (Two layers a step, ping-ponging between a and b2 without the
    // copy, spilled 20-104 bytes at the 128-register cap: ptxas, sm_90.)
    for (int l = 1; l < hidden; ++l) {
      hidden_layer<T, kW, kMT, kAct>(a, b2, wh_b + 2u * unsigned((l - 1) * kW * ldw), bias + 128 * l,
                                     save != nullptr ? save + (int64_t(l) * batch + row0) * kW : nullptr, rows_valid,
                                     lane);
#pragma unroll
      for (int m = 0; m < kMT; ++m)
#pragma unroll
        for (int j = 0; j < kKT; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) a[m][j][i] = b2[m][j][i];
    }

    // Output layer: 16 columns at a time into the warp's y rows, then 16-byte stores.
    const float* bl = bias + 128 * hidden;
    for (int j = 0; j < out_p / 16; ++j) {
      float acc[kMT][2][4];
      mma_16_columns<T, kMT, kKT>(acc, a, wl_b + 2u * unsigned(j * 16 * ldw));
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int c = j * 16 + h * 8 + 2 * t;
        const float2 b = *reinterpret_cast<const float2*>(bl + c);
#pragma unroll
        for (int m = 0; m < kMT; ++m) {
          T* row = ys + (m * 16 + g) * ldy + c;
          const float v0 = acc[m][h][0] + b.x, v1 = acc[m][h][1] + b.y;
          const float v2 = acc[m][h][2] + b.x, v3 = acc[m][h][3] + b.y;
          *reinterpret_cast<unsigned*>(row) =
              out_relu ? act_pack<T, kActRelu>(v0, v1) : act_pack<T, kActNone>(v0, v1);
          *reinterpret_cast<unsigned*>(row + 8 * ldy) =
              out_relu ? act_pack<T, kActRelu>(v2, v3) : act_pack<T, kActNone>(v2, v3);
        }
      }
    }
    __syncwarp();
    T* yt = y + row0 * n_out;
    if (yvec) {
      for (int e = lane; e < kRows * y_cpr.d; e += 32) {
        const int r = y_cpr.quot(e), c = (e - r * y_cpr.d) * 8;
        if (r < rows_valid) store16(yt + r * n_out + c, *reinterpret_cast<const Vec16<T>*>(ys + r * ldy + c));
      }
    } else {
      for (int e = lane; e < kRows * n_out; e += 32) {
        const int r = e / n_out, c = e - r * n_out;
        if (r < rows_valid) yt[r * n_out + c] = ys[r * ldy + c];
      }
    }
  }
  cp_async_wait_all();  // nothing may be in flight into shared memory when the block exits
}

}  // namespace
}  // namespace rawops

// One entry per hidden width W and hidden activation (each compiled alone: one register
// allocation per activation; all three in one kernel spilled 96 bytes at the 128-register
// cap, 666K local-memory requests per launch in ncu). kMT = 2 (32 rows a warp) except
// W = 128 (16 rows: 2 x 64 accumulators would spill). 512 threads, one block per SM: at most
// 128 registers (ptxas, sm_90: bench/NOTES.md).
#define RAWOPS_TC_FAST(suffix, T, W, MT, ACT, CODE)                                                             \
  extern "C" __global__ void __launch_bounds__(512, 1)                                                         \
      tc_mlp_w##W##_##ACT##_fwd_##suffix(const T* x, T* y, T* save, RAWOPS_TC_PARAMS(T), RAWOPS_TC_BIASES(T),   \
                                         long long batch, long long n_in, long long width, long long n_out,    \
                                         long long hidden, long long flags) {                                  \
    const T* W_[rawops::kTcMaxLayers] = {w0, w1, w2, w3, w4, w5, w6, w7, w8};                                  \
    const T* B_[rawops::kTcMaxLayers] = {b0, b1, b2, b3, b4, b5, b6, b7, b8};                                  \
    RAWOPS_TC_FAST_CALL((rawops::fast_fwd<T, W, MT, CODE>(x, y, save, W_, B_, batch, int(n_in), int(n_out),     \
                                                          int(hidden), int(flags))));                          \
  }
#define RAWOPS_TC_FAST_ACTS(suffix, T, W, MT)                                                                  \
  RAWOPS_TC_FAST(suffix, T, W, MT, relu, rawops::kActRelu)                                                     \
  RAWOPS_TC_FAST(suffix, T, W, MT, gelu, rawops::kActGelu)                                                     \
  RAWOPS_TC_FAST(suffix, T, W, MT, none, rawops::kActNone)
#define RAWOPS_TC_FAST_ENTRIES(suffix, T)                                                                      \
  RAWOPS_TC_FAST_ACTS(suffix, T, 16, 2)                                                                        \
  RAWOPS_TC_FAST_ACTS(suffix, T, 32, 2)                                                                        \
  RAWOPS_TC_FAST_ACTS(suffix, T, 64, 2)                                                                        \
  RAWOPS_TC_FAST_ACTS(suffix, T, 128, 1)

// mma.sync m16n8k16, ldmatrix and cp.async need sm_80; rawops/mlp.py launches these there only.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define RAWOPS_TC_FAST_CALL(call) call
#else
#define RAWOPS_TC_FAST_CALL(call) __trap()
#endif
RAWOPS_TC_FAST_ENTRIES(f16, __half)
RAWOPS_TC_FAST_ENTRIES(bf16, __nv_bfloat16)
#undef RAWOPS_TC_FAST_CALL

// =====================================================================================
// The fused tensor-core backward: tc_mlp_w<W>_<act>_bwd_<dtype> (W = 16/32/64, sm_80+,
// mma.sync m16n8k16, float32 accumulation). One kernel does the whole backward of the
// training forward above (which kept each hidden pre-activation z in [hidden][batch][W]):
//   g_L = dy (times relu'(y) for an output ReLU); for l = L-1 .. 0:
//     dW_l += g_l^T a_{l-1}, db_l += colsum(g_l)   (a_{l-1} = act(z_{l-1}), x for l = 0)
//     g_{l-1} = (g_l W_l) * act'(z_{l-1})          (l >= 1), dx = g_0 W_0 when asked.
// Why one kernel: the old chain wrote every g to device memory for separate weight-gradient
// kernels that read g and a back (2 x 512 MB more traffic for the 64x4 network at 2^20,
// plus 12.5%-occupancy GEMMs); here nothing but dy, z, x (and dx) crosses device memory.
// Launch: persistent, one block of `warps` (<= 8) warps per SM, tiles of 32 x warps rows.
// Per tile and layer every warp stages its 32 rows of g_l (G) and a_{l-1} (A) in shared
// memory; after a barrier each warp accumulates its fixed share of dW_l (16x32 blocks,
// round robin; db through an mma with a ones B operand) over the tile's rows with A = G^T
// and B = A, both by ldmatrix.trans, and adds it to the block's float32 accumulators in
// shared memory (fragment order: conflict-free float4); then it runs the chain for its own
// rows (g_l from G by ldmatrix, W_l^T fragments by ldmatrix.trans from the resident
// [out][in] weights, act' from A for ReLU, from z in device memory for GELU), keeping
// g_{l-1} in registers until a second barrier frees G. The next step's rows (z, x, the
// next tile's dy) are loaded into registers at the start of a step, so their latency hides
// under the step's tensor-core work. At the end each block writes its partial dW/db to
// ws[blockIdx] ([out_p][in_p] then [out_p] per layer) and mlp_wgrad_reduce_bwd_* sums the
// blocks in order: deterministic, no atomics. Floors and measurements: bench/NOTES.md.
// =====================================================================================
namespace rawops {
namespace {

constexpr int kBwdRows = 32;  // rows a warp owns in a tile (two m16 tiles)

__device__ __forceinline__ void ldsm_x4_trans(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Applies the activation to the 8 values of a 16-byte vector (kAct known at compile time).
template <typename T, int kAct> __device__ __forceinline__ uint4 activate16(uint4 v) {
  if (kAct == kActNone) return v;
  unsigned* w = reinterpret_cast<unsigned*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if (kAct == kActRelu) {
      w[i] = Mma<T>::relu(w[i]);
    } else {
      const T* h = reinterpret_cast<const T*>(&w[i]);
      w[i] = Mma<T>::pack(activate(to_float(h[0]), kActGelu), activate(to_float(h[1]), kActGelu));
    }
  }
  return v;
}

// A warp's 32 rows of a [batch][cols] array (cols % 8 == 0, 16-byte aligned, padded to
// cols_p <= kMaxCols with zeros, rows past rows_valid zeros) held in registers between
// load() and store(): lane holds 16-byte chunks e = lane + 32 i of the [32][cols_p] block.
template <typename T, int kMaxCols> struct RowsInFlight {
  static constexpr int kN = kBwdRows * kMaxCols / 8 / 32;
  uint4 v[kN];
  __device__ __forceinline__ void load(const T* __restrict__ src, int cols, const SmallDiv& cpr, int rows_valid,
                                       int lane) {
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      const int e = lane + 32 * i, r = cpr.quot(e), c = (e - r * cpr.d) * 8;
      v[i] = make_uint4(0u, 0u, 0u, 0u);
      if (r < rows_valid && c < cols) v[i] = __ldg(reinterpret_cast<const uint4*>(src + r * cols + c));
    }
  }
  template <int kAct> __device__ __forceinline__ void store(T* dst, int ld, const SmallDiv& cpr, int lane) const {
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      const int e = lane + 32 * i, r = cpr.quot(e), c = (e - r * cpr.d) * 8;
      if (r < kBwdRows) *reinterpret_cast<uint4*>(dst + r * ld + c) = activate16<T, kAct>(v[i]);
    }
  }
};

// Where one warp's staging of a [batch][cols] array can go through RowsInFlight.
template <typename T, int kMaxCols> __device__ __forceinline__ bool in_flight_ok(const T* p, int cols) {
  return cols % 8 == 0 && cols <= kMaxCols && (reinterpret_cast<size_t>(p) % 16) == 0;
}

// dW_l (and db_l) partial of one tile: for each of this warp's 16x16 blocks (m16 tile mt of
// the layer's outputs, 16 inputs at np) sum over the tile's rows of G^T A, added to the
// block's accumulators acc (fragment order: [groups][2][32 lanes] float4, then the db
// slots [out_p / 16][32 lanes] float4).
// Each warp takes 16x32 blocks (m16 tile mt, the two 16-input pairs np0, np0 + 1): one
// ldmatrix of G^T feeds both pairs' B fragments (3 ldmatrix per 4 mma). The db mma (ones as
// B) of an m16 tile is done by the warp of its first quad, into that block's slot
// (write_partials sums every quad's slot in order; the others stay zero). Dealing the db
// k steps round robin over the quads' warps measured slower (695 vs 680 us at 64x4 f16,
// 2^20 rows: a branch in every warp's k loop, and no shorter wait at the barrier).
template <typename T>
__device__ __forceinline__ void wgrad_tile(float* __restrict__ acc, unsigned g_t, unsigned a_t, int gld, int ald,
                                           int out_p, int in_p, int ksteps, int warp, int warps, int lane) {
  const int npairs = in_p / 16, nquads = (npairs + 1) / 2, blocks = (out_p / 16) * nquads;
  const unsigned ones = Mma<T>::pack(1.f, 1.f);
  float4* frag = reinterpret_cast<float4*>(acc);
  float4* dbs = frag + (out_p / 16) * npairs * 64;
  for (int f = warp; f < blocks; f += warps) {
    const int mt = f / nquads, quad = f - mt * nquads, np0 = 2 * quad;
    const bool second = np0 + 1 < npairs, with_db = quad == 0;
    float d[5][4] = {};
#pragma unroll 4
    for (int ks = 0; ks < ksteps; ++ks) {
      unsigned a[4], b[4], c[4];
      ldsm_x4_trans(a, g_t + 2u * unsigned(ks * 16 * gld + mt * 16));
      ldsm_x4_trans(b, a_t + 2u * unsigned(ks * 16 * ald + np0 * 16));
      Mma<T>::mma(d[0], a, b[0], b[1]);
      Mma<T>::mma(d[1], a, b[2], b[3]);
      if (second) {
        ldsm_x4_trans(c, a_t + 2u * unsigned(ks * 16 * ald + np0 * 16 + 16));
        Mma<T>::mma(d[2], a, c[0], c[1]);
        Mma<T>::mma(d[3], a, c[2], c[3]);
      }
      if (with_db) Mma<T>::mma(d[4], a, ones, ones);
    }
#pragma unroll
    for (int h = 0; h < 5; ++h) {
      if ((h == 2 || h == 3) && !second) continue;
      if (h == 4 && !with_db) continue;
      float4* p = h < 4 ? frag + ((mt * npairs + np0) * 2 + h) * 32 + lane : dbs + f * 32 + lane;
      float4 s = *p;
      s.x += d[h][0], s.y += d[h][1], s.z += d[h][2], s.w += d[h][3];
      *p = s;
    }
  }
}

// acc = the warp's 32 rows of G (k_p columns) times the kW columns at col0 of a [k_p][ld]
// weight block (W_l in [out][in] layout: k = out, so B fragments come by ldmatrix.trans);
// ncols (a multiple of 16) of the kW columns are valid.
template <typename T, int kW>
__device__ __forceinline__ void chain_product(float (&acc)[2][kW / 8][4], unsigned g_a, int gld, unsigned w_b,
                                              int ld, int k_p, int ncols) {
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int q = 0; q < kW / 8; ++q)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[m][q][i] = 0.f;
#pragma unroll 2
  for (int kk = 0; kk < k_p / 16; ++kk) {
    unsigned a[2][4];
#pragma unroll
    for (int m = 0; m < 2; ++m) ldsm_x4(a[m], g_a + 2u * unsigned(m * 16 * gld + kk * 16));
#pragma unroll
    for (int j = 0; j < kW / 16; ++j) {
      if (j * 16 >= ncols) break;
      unsigned b[4];
      ldsm_x4_trans(b, w_b + 2u * unsigned(kk * 16 * ld + j * 16));
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        Mma<T>::mma(acc[m][2 * j], a[m], b[0], b[1]);
        Mma<T>::mma(acc[m][2 * j + 1], a[m], b[2], b[3]);
      }
    }
  }
}

// g_{l-1} = acc * act'(z_{l-1}) packed in the C-fragment layout (pairs of row g, row g + 8),
// rows past rows_valid zeroed. act' from the staged a = relu(z) (ReLU: a > 0 iff z > 0),
// from z in device memory (GELU, the warp's rows of this layer's [batch][kW]), or 1.
template <typename T, int kW, int kAct>
__device__ __forceinline__ void chain_epilogue(const float (&acc)[2][kW / 8][4], unsigned (&gn)[2][kW / 8][2],
                                               const T* aw, int ald, const T* __restrict__ z, int rows_valid,
                                               int lane) {
  const int g = lane / 4, t = lane % 4;
  unsigned zw[2][kW / 8][2];
  if (kAct == kActGelu) {  // every load issued before the math that needs them
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int q = 0; q < kW / 8; ++q)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = m * 16 + g + 8 * h;
          zw[m][q][h] = r < rows_valid ? __ldg(reinterpret_cast<const unsigned*>(z + r * kW + q * 8 + 2 * t)) : 0u;
        }
  }
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int q = 0; q < kW / 8; ++q)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = m * 16 + g + 8 * h, c = q * 8 + 2 * t;
        float d0 = 1.f, d1 = 1.f;
        if (kAct == kActRelu) {
          const unsigned pair = *reinterpret_cast<const unsigned*>(aw + r * ald + c);
          const T* a = reinterpret_cast<const T*>(&pair);
          d0 = to_float(a[0]) > 0.f ? 1.f : 0.f;
          d1 = to_float(a[1]) > 0.f ? 1.f : 0.f;
        } else if (kAct == kActGelu) {
          const T* zz = reinterpret_cast<const T*>(&zw[m][q][h]);
          d0 = activate_grad(to_float(zz[0]), kActGelu);
          d1 = activate_grad(to_float(zz[1]), kActGelu);
        }
        if (r >= rows_valid) d0 = d1 = 0.f;
        gn[m][q][h] = Mma<T>::pack(acc[m][q][2 * h] * d0, acc[m][q][2 * h + 1] * d1);
      }
}

// dx rows of the warp (columns col0 + the kW of acc, < n_in), rows past rows_valid skipped.
template <typename T, int kW>
__device__ __forceinline__ void store_dx(const float (&acc)[2][kW / 8][4], T* __restrict__ dx, int n_in, int col0,
                                         int rows_valid, int lane) {
  const int g = lane / 4, t = lane % 4;
  const bool pairs = n_in % 2 == 0 && (reinterpret_cast<size_t>(dx) % 4) == 0;
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int q = 0; q < kW / 8; ++q)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = m * 16 + g + 8 * h, c = col0 + q * 8 + 2 * t;
        if (r >= rows_valid || c >= n_in) continue;
        T* p = dx + int64_t(r) * n_in + c;
        const float v0 = acc[m][q][2 * h], v1 = acc[m][q][2 * h + 1];
        if (pairs) {
          *reinterpret_cast<unsigned*>(p) = Mma<T>::pack(v0, v1);
        } else {
          p[0] = from_float<T>(v0);
          if (c + 1 < n_in) p[1] = from_float<T>(v1);
        }
      }
}

// The block's accumulators, fragment order -> ws (per layer [out_p][in_p] then [out_p]).
__device__ __forceinline__ void write_partials(const float* acc, float* __restrict__ ws, int out_p, int in_p) {
  const int npairs = in_p / 16, groups = (out_p / 16) * npairs;
  const float4* frag = reinterpret_cast<const float4*>(acc);
  for (int e = threadIdx.x; e < groups * 64; e += blockDim.x) {
    const int f = e / 64, h = (e / 32) % 2, lane = e % 32;
    const int mt = f / npairs, np = f - mt * npairs;
    const int r = mt * 16 + lane / 4, c = np * 16 + h * 8 + 2 * (lane % 4);
    const float4 v = frag[e];
    *reinterpret_cast<float2*>(ws + r * in_p + c) = make_float2(v.x, v.y);
    *reinterpret_cast<float2*>(ws + (r + 8) * in_p + c) = make_float2(v.z, v.w);
  }
  const float4* dbs = frag + groups * 64;
  const int nquads = (npairs + 1) / 2;
  for (int e = threadIdx.x; e < (out_p / 16) * 32; e += blockDim.x) {
    const int mt = e / 32, lane = e % 32;
    if (lane % 4 != 0) continue;
    float lo = 0.f, hi = 0.f;  // column 0 of the ones products: the row sums of g^T
    for (int q = 0; q < nquads; ++q) {
      const float4 v = dbs[(mt * nquads + q) * 32 + lane];
      lo += v.x, hi += v.z;
    }
    ws[out_p * in_p + mt * 16 + lane / 4] = lo;
    ws[out_p * in_p + mt * 16 + lane / 4 + 8] = hi;
  }
}

// Floats of one layer's accumulators: the [out_p][in_p] weight gradient in fragment order
// and a db slot (8 floats a row) per 16x32 block.
__host__ __device__ constexpr int accumulator_floats(int out_p, int in_p) {
  return out_p * (in_p + 8 * ((in_p + 31) / 32));
}

template <typename T, int kW, int kAct>
__device__ void fast_bwd(const T* __restrict__ dy, const T* __restrict__ y, const T* __restrict__ x,
                         const T* __restrict__ save, T* __restrict__ dx, float* __restrict__ ws, const T* const* W,
                         int64_t batch, int n_in, int n_out, int hidden, int flags, int64_t ws_stride) {
  // The layers' reduce (launched programmatically dependent on sm_90) may be scheduled now: its
  // blocks take SM slots as these retire and wait for the whole grid before reading ws.
  allow_dependent_launch();
  constexpr int ldw = kW + 8;
  extern __shared__ __align__(128) unsigned char tc_smem[];
  const int layers = hidden + 1;
  const int in_p = round16(n_in), out_p = round16(n_out);
  const int ld0 = in_p + 8, gld = max(out_p, kW) + 8, ald = max(in_p, kW) + 8;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int rows = kBwdRows * warps;  // a tile
  auto out_p_of = [&](int l) { return l == hidden ? out_p : kW; };
  auto in_p_of = [&](int l) { return l == 0 ? in_p : kW; };
  // Layout (rawops/mlp.py fast_bwd_smem_bytes): float accumulators of every layer
  // (accumulator_floats each), weights like fast_fwd's (no biases), G [rows][gld],
  // A [rows][ald] (2-byte elements).
  auto acc_of = [&](int l) {
    return reinterpret_cast<float*>(tc_smem) +
           (l == 0 ? 0 : accumulator_floats(kW, in_p) + (l - 1) * accumulator_floats(kW, kW));
  };
  T* w0 = reinterpret_cast<T*>(acc_of(hidden) + accumulator_floats(out_p, kW));
  T* wh = w0 + kW * ld0;
  T* wl = wh + (hidden - 1) * kW * ldw;
  T* G = wl + out_p * ldw;
  T* A = G + rows * gld;
  T* gw = G + warp * kBwdRows * gld;  // this warp's rows
  T* aw = A + warp * kBwdRows * ald;

  for (int e = threadIdx.x; e < (w0 - reinterpret_cast<T*>(tc_smem)) / 2; e += blockDim.x)
    reinterpret_cast<float*>(tc_smem)[e] = 0.f;
  for (int l = 0; l < layers; ++l) {
    const int in_l = l == 0 ? n_in : kW, out_l = l == hidden ? n_out : kW;
    T* dst = l == 0 ? w0 : l == hidden ? wl : wh + (l - 1) * kW * ldw;
    load_rows<T>(dst, l == 0 ? ld0 : ldw, W[l], in_l, out_l, round16(out_l), in_l, round16(in_l), nullptr, kActNone,
                 threadIdx.x, blockDim.x);
  }

  const bool out_relu = ((flags >> 2) & 3) == kActRelu;
  const bool dy_fly = !out_relu && in_flight_ok<T, kW>(dy, n_out);
  const bool x_fly = in_flight_ok<T, kW>(x, n_in);
  const SmallDiv z_cpr(kW / 8), x_cpr(in_p / 8), dy_cpr(out_p / 8);
  // ldmatrix lane addresses: g_a the A fragments of the warp's rows of G; g_t / a_t the
  // transposed reads of G and A over a tile's rows (k = rows); w_b the weights' transposed
  // B fragments (k = out rows).
  const unsigned g_a = smem_addr(gw) + 2u * unsigned((lane % 16) * gld + (lane / 16) * 8);
  const unsigned g_t = smem_addr(G) + 2u * unsigned((lane % 8 + 8 * (lane / 16)) * gld + 8 * ((lane / 8) % 2));
  const unsigned a_t = smem_addr(A) + 2u * unsigned((lane % 8 + 8 * ((lane / 8) % 2)) * ald + 8 * (lane / 16));
  const int b_k = lane % 8 + 8 * ((lane / 8) % 2), b_n = 8 * (lane / 16);
  auto w_b = [&](int l) {
    const T* base = l == 0 ? w0 : l == hidden ? wl : wh + (l - 1) * kW * ldw;
    return smem_addr(base) + 2u * unsigned(b_k * (l == 0 ? ld0 : ldw) + b_n);
  };
  // Each block owns one contiguous range of whole 32-row warp units, as equal as the grid
  // allows, walked in tiles of `rows` (its last one short). Tiles dealt round robin left the
  // last round to a few blocks: 2^20 rows are 4096 tiles over 132 SMs, 32 rounds on 4 of them
  // and 31 on the rest; a range is 31 tiles and one of 32 rows.
  const int64_t units = (batch + kBwdRows - 1) / kBwdRows, per_block = (units + gridDim.x - 1) / gridDim.x;
  const int64_t begin = min(batch, int64_t(blockIdx.x) * per_block * kBwdRows);
  const int64_t end = min(batch, begin + per_block * kBwdRows);
  auto warp_rows = [&](int64_t row0) {  // valid rows of this warp in the tile at row0
    const int64_t v = end - row0 - warp * kBwdRows;
    return int(v < 0 ? 0 : v < kBwdRows ? v : kBwdRows);
  };
  auto z_rows = [&](int l, int64_t row0) { return save + (int64_t(l) * batch + row0 + warp * kBwdRows) * kW; };
  // Synchronous staging (the first tile, and rows RowsInFlight cannot hold).
  auto stage_dy = [&](int64_t row0) {
    const int64_t r = row0 + warp * kBwdRows;
    load_rows<T>(gw, gld, dy + r * n_out, n_out, warp_rows(row0), kBwdRows, n_out, out_p,
                 out_relu ? y + r * n_out : nullptr, kActNone, lane, 32);
  };
  auto stage_z = [&](int l, int64_t row0) {
    load_rows<T>(aw, ald, z_rows(l, row0), kW, warp_rows(row0), kBwdRows, kW, kW, nullptr, kAct, lane, 32);
  };

  RowsInFlight<T, kW> next_a, next_g;
  if (begin < end) {
    stage_dy(begin);
    stage_z(hidden - 1, begin);
  }
  for (int64_t row0 = begin; row0 < end; row0 += rows) {
    const int64_t next = row0 + rows;  // the next tile's first row (none at end)
    const int rows_valid = warp_rows(row0);
    const int tile_rows = int(end - row0 < rows ? end - row0 : rows);
    for (int l = hidden; l >= 0; --l) {
      __syncthreads();  // G = g_l and A = a_{l-1} staged by every warp
      // The next step's rows in flight while this one computes.
      if (l >= 2) {
        next_a.load(z_rows(l - 2, row0), kW, z_cpr, rows_valid, lane);
      } else if (l == 1) {
        if (x_fly) next_a.load(x + (row0 + warp * kBwdRows) * n_in, n_in, x_cpr, rows_valid, lane);
      } else if (next < end) {
        next_a.load(z_rows(hidden - 1, next), kW, z_cpr, warp_rows(next), lane);
        if (dy_fly) next_g.load(dy + (next + warp * kBwdRows) * n_out, n_out, dy_cpr, warp_rows(next), lane);
      }
      wgrad_tile<T>(acc_of(l), g_t, a_t, gld, ald, out_p_of(l), in_p_of(l), (tile_rows + 15) / 16, warp, warps, lane);
      // A warp with no rows in a short tile skips the chain (its G rows are never read: the
      // weight gradient's k steps end at the tile's last row rounded to 16).
      unsigned gn[2][kW / 8][2];
      if (rows_valid == 0) {
      } else if (l >= 1) {
        float acc[2][kW / 8][4];
        chain_product<T, kW>(acc, g_a, gld, w_b(l), ldw, out_p_of(l), kW);
        chain_epilogue<T, kW, kAct>(acc, gn, aw, ald, z_rows(l - 1, row0), rows_valid, lane);
      } else if (dx != nullptr) {
        for (int c0 = 0; c0 < in_p; c0 += kW) {
          float acc[2][kW / 8][4];
          chain_product<T, kW>(acc, g_a, gld, w_b(0) + 2u * unsigned(c0), ld0, kW, in_p - c0 < kW ? in_p - c0 : kW);
          store_dx<T, kW>(acc, dx + (row0 + warp * kBwdRows) * n_in, n_in, c0, rows_valid, lane);
        }
      }
      __syncthreads();  // every warp done reading G and A
      if (l >= 1) {
        const int g = lane / 4, t = lane % 4;
        if (rows_valid > 0)
#pragma unroll
          for (int m = 0; m < 2; ++m)
#pragma unroll
            for (int q = 0; q < kW / 8; ++q)
#pragma unroll
              for (int h = 0; h < 2; ++h)
                *reinterpret_cast<unsigned*>(gw + (m * 16 + g + 8 * h) * gld + q * 8 + 2 * t) = gn[m][q][h];
        if (l >= 2) {
          next_a.template store<kAct>(aw, ald, z_cpr, lane);
        } else if (x_fly) {
          next_a.template store<kActNone>(aw, ald, x_cpr, lane);
        } else {
          load_rows<T>(aw, ald, x + (row0 + warp * kBwdRows) * n_in, n_in, rows_valid, kBwdRows, n_in, in_p, nullptr,
                       kActNone, lane, 32);
        }
      } else if (next < end) {
        next_a.template store<kAct>(aw, ald, z_cpr, lane);
        if (dy_fly) next_g.template store<kActNone>(gw, gld, dy_cpr, lane);
        else stage_dy(next);
      }
      __syncwarp();
    }
  }
  __syncthreads();
  float* part = ws + int64_t(blockIdx.x) * ws_stride;
  for (int l = 0; l < layers; ++l) {
    write_partials(acc_of(l), part, out_p_of(l), in_p_of(l));
    part += out_p_of(l) * (in_p_of(l) + 1);
  }
}

// The fused backward's partials of every layer reduced in one launch (blockIdx.y = layer):
// the per-layer sum of wgrad_reduce at the layer's offset in a block's row (the layout of
// write_partials: [n_p][k_p] then [n_p] floats per layer).
// A block of 256 threads takes 32 outputs; each output's chunks are split into 8 fixed runs
// summed in order by 8 threads, the 8 run sums then added in run order (deterministic): one
// thread walking all 132 chunks was latency-bound (21 us for the 64x4 network's 5 layers).
constexpr int kReduceOutputs = 32, kReduceRuns = 8, kReduceInFlight = 24;
template <typename T>
__device__ __forceinline__ void wgrad_reduce_layers(const float* __restrict__ ws, int64_t chunks, int64_t stride,
                                                    int n_in, int width, int n_out, int hidden, T* const* dw,
                                                    T* const* db) {
  __shared__ float runs[kReduceRuns][kReduceOutputs];
  const int l = blockIdx.y, lane = threadIdx.x % kReduceOutputs, run = threadIdx.x / kReduceOutputs;
  auto n_p_of = [&](int i) { return i == hidden ? round16(n_out) : width; };
  auto k_p_of = [&](int i) { return i == 0 ? round16(n_in) : width; };
  int64_t offset = 0;
  for (int i = 0; i < l; ++i) offset += int64_t(n_p_of(i)) * (k_p_of(i) + 1);
  const int N = l == hidden ? n_out : width, K = l == 0 ? n_in : width, k_p = k_p_of(l);
  const int64_t nk = int64_t(N) * K, total = nk + (db[l] != nullptr ? N : 0);
  const int64_t e = int64_t(blockIdx.x) * kReduceOutputs + lane;
  wait_for_previous_grid();  // the fused backward's partials (a programmatic dependent launch on sm_90)
  float s = 0.f;
  if (e < total) {
    const int64_t src = offset + (e < nk ? (e / K) * k_p + e % K : int64_t(n_p_of(l)) * k_p + (e - nk));
    const int64_t per = (chunks + kReduceRuns - 1) / kReduceRuns, c0 = run * per, c1 = min(chunks, c0 + per);
    if (c1 - c0 <= kReduceInFlight) {
      // Every load of the run in flight at once (a loop unrolled by 4 waited on L2 five times
      // at 132 chunks: 11.8 us for the 64x4 network's five layers), then summed in chunk order.
      float v[kReduceInFlight];
#pragma unroll
      for (int i = 0; i < kReduceInFlight; ++i) v[i] = c0 + i < c1 ? ws[(c0 + i) * stride + src] : 0.f;
#pragma unroll
      for (int i = 0; i < kReduceInFlight; ++i) s += v[i];
    } else {
#pragma unroll 8
      for (int64_t c = c0; c < c1; ++c) s += ws[c * stride + src];
    }
  }
  runs[run][lane] = s;
  __syncthreads();
  if (run != 0 || e >= total) return;
  float sum = 0.f;
#pragma unroll
  for (int r = 0; r < kReduceRuns; ++r) sum += runs[r][lane];
  if (e < nk) dw[l][e] = from_float<T>(sum);
  else db[l][e - nk] = from_float<T>(sum);
}

}  // namespace
}  // namespace rawops

#define RAWOPS_REDUCE_LAYERS(suffix, T)                                                                        \
  extern "C" __global__ void __launch_bounds__(256)                                                          \
      mlp_wgrad_reduce_layers_bwd_##suffix(const float* ws, long long chunks, long long stride, long long n_in, \
                                           long long width, long long n_out, long long hidden, T* dw0, T* dw1,  \
                                           T* dw2, T* dw3, T* dw4, T* dw5, T* dw6, T* dw7, T* dw8, T* db0,      \
                                           T* db1, T* db2, T* db3, T* db4, T* db5, T* db6, T* db7, T* db8) {    \
    T* const dw[rawops::kTcMaxLayers] = {dw0, dw1, dw2, dw3, dw4, dw5, dw6, dw7, dw8};                          \
    T* const db[rawops::kTcMaxLayers] = {db0, db1, db2, db3, db4, db5, db6, db7, db8};                          \
    rawops::wgrad_reduce_layers<T>(ws, chunks, stride, int(n_in), int(width), int(n_out), int(hidden), dw, db); \
  }
RAWOPS_REDUCE_LAYERS(f16, __half)
RAWOPS_REDUCE_LAYERS(bf16, __nv_bfloat16)

// One entry per hidden width W and hidden activation, like the fast forward; 8 warps at
// most, one block per SM (the accumulators and weights take most of the shared memory).
#define RAWOPS_TC_FAST_BWD(suffix, T, W, ACT, CODE)                                                             \
  extern "C" __global__ void __launch_bounds__(256, 1)                                                         \
      tc_mlp_w##W##_##ACT##_bwd_##suffix(const T* dy, const T* y, const T* x, const T* save, T* dx, float* ws,  \
                                         RAWOPS_TC_PARAMS(T), long long batch, long long n_in, long long n_out, \
                                         long long hidden, long long flags, long long ws_stride) {             \
    const T* W_[rawops::kTcMaxLayers] = {w0, w1, w2, w3, w4, w5, w6, w7, w8};                                  \
    RAWOPS_TC_FAST_CALL((rawops::fast_bwd<T, W, CODE>(dy, y, x, save, dx, ws, W_, batch, int(n_in), int(n_out), \
                                                      int(hidden), int(flags), ws_stride)));                   \
  }
#define RAWOPS_TC_FAST_BWD_ACTS(suffix, T, W)                                                                  \
  RAWOPS_TC_FAST_BWD(suffix, T, W, relu, rawops::kActRelu)                                                     \
  RAWOPS_TC_FAST_BWD(suffix, T, W, gelu, rawops::kActGelu)                                                     \
  RAWOPS_TC_FAST_BWD(suffix, T, W, none, rawops::kActNone)
#define RAWOPS_TC_FAST_BWD_ENTRIES(suffix, T)                                                                  \
  RAWOPS_TC_FAST_BWD_ACTS(suffix, T, 16)                                                                       \
  RAWOPS_TC_FAST_BWD_ACTS(suffix, T, 32)                                                                       \
  RAWOPS_TC_FAST_BWD_ACTS(suffix, T, 64)

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define RAWOPS_TC_FAST_CALL(call) call
#else
#define RAWOPS_TC_FAST_CALL(call) __trap()
#endif
RAWOPS_TC_FAST_BWD_ENTRIES(f16, __half)
RAWOPS_TC_FAST_BWD_ENTRIES(bf16, __nv_bfloat16)
#undef RAWOPS_TC_FAST_CALL

// =====================================================================================
// The source network at large batches on the tensor pipe: seed_mlp_tc_fwd_f32, 3xTF32
// through mma.sync m16n8k8 (sm_80+, inference: h1s and h2s must be null; the training
// forward keeps the exact FFMA kernel, bench/NOTES.md says why). Same arguments as
// seed_mlp_fwd_f32. Each product is big_a big_b + big_a small_b + small_a big_b (big =
// tf32(v), small = v - big: split_tf32_fast), accumulated in float32: ~1e-6 relative.
// Why this shape (the WMMA 3xTF32 kernel it replaces ran at FFMA speed: every fragment went
// through shared memory and was split after each load): a warp owns kRows = 16 kMT rows and
// walks all three layers with its activations in registers. K is permuted inside each k8
// slice (A slot t <- column 2t, slot t + 4 <- column 2t + 1; B the same), so the C fragment
// of an n8 tile (columns 2t, 2t + 1 of rows g, g + 8), plus bias, ReLU and split, is the A
// fragment of one k8 slice of the next layer, and a lane's two B values are adjacent floats
// of a weight row: one 8-byte load from the resident [out][in] rows (row strides = 8 mod 32
// floats: conflict-free). Layer 1 runs in column chunks of kC, each chunk fed into layer 2's
// accumulators at once (registers stay bounded). x is staged per warp by cp.async (zero-
// filled to K = 104 and past the batch), the next tile's fetch issued once layer 1 has read
// it. Weights (93.5 KB, float) resident per block, split when loaded into fragments;
// persistent warps, no block barrier after the weight load. Estimate, measurements:
// bench/NOTES.md.
// =====================================================================================
namespace rawops {
namespace {

constexpr int kStK1 = 104;                                   // layer 1's K: 100 padded to 13 k8 slices
constexpr int kStLd1 = 104, kStLd2 = 136, kStLd3 = 72;       // weight row strides (floats), all 8 mod 32
constexpr int kStLdx = 104;                                  // x staging rows (8 mod 32 too)
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
  // The next layer's A fragment from C fragment c (d0, d1 at row g; d2, d3 at row g + 8):
  // bias + ReLU, then the split; the permuted K puts columns 2t, 2t + 1 in slots t, t + 4.
  __device__ __forceinline__ void set_bias_relu(const float (&c)[4], float2 b) {
    set(bias_relu(c[0], b.x), bias_relu(c[2], b.x), bias_relu(c[1], b.y), bias_relu(c[3], b.y));
  }
};

// d[m][n] += a[m] W^T for one k8 slice and n8 tile, w the lane's address in the tile's weight
// rows (row g, column 2t of the slice): one 8-byte load, split once for the kMT row tiles.
template <int kMT, int kN>
__device__ __forceinline__ void mma_slice(float (&d)[kMT][kN][4], int n, const SplitA (&a)[kMT], const float* w) {
  const float2 v = lds2(w);
  const Tf32Split s0 = split_tf32_fast(v.x), s1 = split_tf32_fast(v.y);
#pragma unroll
  for (int m = 0; m < kMT; ++m)
    mma_m16n8k8_tf32x3(d[m][n], a[m].big, a[m].small, s0.big, s1.big, s0.small, s1.small);
}

// The warp's kRows x rows into its staging rows [kRows][kStLdx]: 16-byte cp.async when x is
// 16-byte aligned (rows are 400 bytes), else 4-byte; columns 100..103 and rows past the batch zero.
template <int kRows>
__device__ __forceinline__ void seed_fetch_x(float* xs, const float* __restrict__ xt, int rows_valid, bool vec,
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
__device__ void seed_tc_fwd(const float* __restrict__ x, const float* __restrict__ w1, const float* __restrict__ b1,
                            const float* __restrict__ w2, const float* __restrict__ b2,
                            const float* __restrict__ w3, const float* __restrict__ b3, float* __restrict__ y,
                            int64_t batch, int64_t flags) {
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
  const bool out_relu = flags & 1;

  // Tiles dealt warp-major (as the fast forward): a last partial round lands on a few warps of every SM.
  const int64_t tiles = (batch + kRows - 1) / kRows, step = int64_t(gridDim.x) * warps;
  int64_t tile = int64_t(warp) * gridDim.x + blockIdx.x;
  auto rows_of = [&](int64_t tl) { return int(batch - tl * kRows < kRows ? batch - tl * kRows : kRows); };
  if (tile < tiles) seed_fetch_x<kRows>(xs, x + tile * kRows * kIn, rows_of(tile), xvec, lane);
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
          seed_fetch_x<kRows>(xs, x + (tile + step) * kRows * kIn, rows_of(tile + step), xvec, lane);
      }
      // Bias, ReLU, split: each n8 tile of the chunk is one k8 slice of layer 2.
#pragma unroll
      for (int j = 0; j < kJ; ++j) {
        const float2 bb = lds2(sm + kStB1 + c0 + 8 * j + 2 * t);
        SplitA a[kMT];
#pragma unroll
        for (int m = 0; m < kMT; ++m)
          a[m].set_bias_relu(acc1[m][j], bb);
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
      for (int m = 0; m < kMT; ++m)
        a[m].set_bias_relu(acc2[m][kk], bb);
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

}  // namespace
}  // namespace rawops

// Two variants, measured side by side (bench/NOTES.md): 32-row warp tiles, 8 warps, 204
// registers (the default: each B fragment's split serves 2 row tiles); 16-row tiles, 16 warps,
// <= 128 registers. Layer 1 in 64-column chunks (32: 2% slower, x re-split 4 times). Warps a
// block in multiples of 4: each SM quarter has its own tensor core (10 warps ran slower than 8).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define RAWOPS_SEED_TC_CALL(call) call
#else
#define RAWOPS_SEED_TC_CALL(call) __trap()  // mma.sync tf32 and cp.async need sm_80; rawops/mlp.py never launches it there
#endif
extern "C" __global__ void __launch_bounds__(256, 1)
    seed_mlp_tc32_fwd_f32(const float* x, const float* w1, const float* b1, const float* w2, const float* b2,
                          const float* w3, const float* b3, float* y, float* h1s, float* h2s, long long batch,
                          long long flags) {
  RAWOPS_SEED_TC_CALL((rawops::seed_tc_fwd<2, 64>(x, w1, b1, w2, b2, w3, b3, y, batch, flags)));
}
extern "C" __global__ void __launch_bounds__(512, 1)
    seed_mlp_tc16_fwd_f32(const float* x, const float* w1, const float* b1, const float* w2, const float* b2,
                          const float* w3, const float* b3, float* y, float* h1s, float* h2s, long long batch,
                          long long flags) {
  RAWOPS_SEED_TC_CALL((rawops::seed_tc_fwd<1, 64>(x, w1, b1, w2, b2, w3, b3, y, batch, flags)));
}
#undef RAWOPS_SEED_TC_CALL
