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
#include "rawops/dtype.cuh"

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
                                             const float* __restrict__ b3, float* __restrict__ y, int64_t batch,
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
                     const float* w3, const float* b3, float* y, long long batch, long long flags) {
  rawops::seed_mlp_fwd(x, w1, b1, w2, b2, w3, b3, y, batch, flags);
}
