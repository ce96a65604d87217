// MLP family, the WMMA tile kernels: tiny-cuda-nn-style networks in float16 / bfloat16 on tensor
// cores (WMMA 16x16x16, float32 accumulation), forward, backward chain and weight gradients, for
// the networks the register-resident kernels (kernels/mlp_fused_*.cu) do not take: every backward
// of 128-wide networks, networks whose weights leave too little shared memory there, sm_75.
//   sizes: n_in in 1..128 (zero-padded to a multiple of 16), `hidden` layers (1..8) of one
//   width (16, 32, 64 or 128), n_out in 1..128; weights in nn.Linear layout [out][in];
//   flags: the hidden activation code | the output one << kOutputActShift | kResident.
// tc_mlp_nf<NF>_fwd_<dtype>: one block of 8 warps per tile of 128 samples; warp w owns rows
// 16w..16w+15 of the tile for the whole network, so the activations stay in its shared-memory
// rows (never in device memory) and only the weight loads need the block's barriers (2 per
// layer). Training (save != null) also writes each hidden layer's pre-activation z ([hidden]
// [batch][width], dtype T): the backward keeps them instead of recomputing the forward, because
// at these widths the network is memory-bound and the recompute would read x and every weight
// again and redo every layer; z gives both act'(z) and act(z) (GELU needs z).
// tc_mlp_nf<NF>_bwd_<dtype> (the chain): the same tile walk in reverse, g_{l-1} = (g_l W_l) *
// act'(z_{l-1}), each g written to a workspace (gws) for the weight gradients, dx = g_0 W_0
// when asked.
// tc_mlp_wgrad_nf<NF>_bwd_<dtype>: per chunk of rows (one block each), dW_l partial = g_l^T a_l
// on tensor cores and db_l partial = column sums, to a float32 workspace; mlp_wgrad_reduce_bwd_*
// (the end of this file, also the source network's) adds the chunks in order. Deterministic,
// no atomics.
// Launch (rawops/mlp.py: tc_fit, tc_grid): weights resident (kResident: every layer loaded
// once, persistent warps over 16-row tiles, as many blocks as fit) when the kernel's shared
// memory allows, else streamed (one block per 128-row tile, each layer's weights in turn).
#include <mma.h>

#include "rawops/dtype.cuh"
#include "rawops/mlp.cuh"

namespace rawops {
namespace {

constexpr int kTcWarps = RAWOPS_MLP_TC_WARPS, kTcThreads = 32 * kTcWarps, kTcRows = 16 * kTcWarps;
constexpr int kWgradTcRows = RAWOPS_MLP_WGRAD_TC_ROWS;  // rows a tc_mlp_wgrad step stages

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

// Shared memory of the tile kernels (rawops/_mlp_plans.py: tc_smem_bytes): float scratch (256 per
// warp), kMaxWidth float biases per layer held (one when streaming, all when resident), the
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
    act = reinterpret_cast<T*>(bias + kMaxWidth * bias_layers);
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
    for (int t = threadIdx.x; t < kMaxWidth; t += blockDim.x)
      bias[t] = (B != nullptr && t < out_l) ? to_float(B[t]) : 0.f;
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

constexpr int kResident = RAWOPS_MLP_TC_RESIDENT;  // flags bit: weights resident in shared memory, persistent warps

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
  const int act = flags & 3, out_act = (flags >> kOutputActShift) & 3;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  T* a = sm.act + warp * 16 * s.act_ld;
  float* scratch = sm.scratch + warp * 256;
  if (resident) {
    for (int l = 0; l < s.layers; ++l) load_layer<T>(sm.w + s.w_offset(l), sm.bias + kMaxWidth * l, s, W[l], B[l], l);
    __syncthreads();
    const int64_t tiles = (batch + 15) / 16;
    for (int64_t tile = int64_t(blockIdx.x) * kTcWarps + warp; tile < tiles; tile += int64_t(gridDim.x) * kTcWarps) {
      const int64_t row0 = tile * 16;
      const int rows_valid = int(batch - row0 < 16 ? batch - row0 : 16);
      load_rows<T>(a, s.act_ld, x + row0 * n_in, n_in, rows_valid, 16, n_in, round16(n_in), nullptr, kActNone, lane, 32);
      __syncwarp();
      for (int l = 0; l < s.layers; ++l)
        fwd_layer<T, kNF>(s, l, a, sm.w + s.w_offset(l), sm.bias + kMaxWidth * l, scratch, row0, batch, y, save, act,
                          out_act);
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
  const int act = flags & 3, out_act = (flags >> kOutputActShift) & 3;
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

// One set of entries per accumulator count NF (fragments of 16 columns a warp holds: the
// widest layer / 16, rounded up to 4 or 8; for the weight gradient, fragments per warp
// of the [out][in] gradient / 8 warps), so that narrow networks do not pay a 128-wide
// network's registers (NF 1 and 2 are not instantiated: a shorter build). Two blocks per SM
// where that costs no spills. bfloat16 WMMA needs sm_80; older targets get a trap (rawops/mlp.py
// refuses before launch).
#define RAWOPS_TC_NF(suffix, T, NF, MINB, MINB_WGRAD)                                                           \
  extern "C" __global__ void __launch_bounds__(rawops::kTcThreads, MINB)                                       \
      tc_mlp_nf##NF##_fwd_##suffix(const T* x, T* y, T* save, RAWOPS_TC_PARAMS(T), RAWOPS_TC_BIASES(T),         \
                                   long long batch, long long n_in, long long width, long long n_out,          \
                                   long long hidden, long long flags) {                                        \
    const T* W[rawops::kMaxLayers] = {w0, w1, w2, w3, w4, w5, w6, w7, w8};                                   \
    const T* B[rawops::kMaxLayers] = {b0, b1, b2, b3, b4, b5, b6, b7, b8};                                   \
    RAWOPS_TC_CALL((rawops::tc_fwd<T, NF>(x, y, save, W, B, batch, int(n_in), int(width), int(n_out),           \
                                          int(hidden), int(flags))));                                          \
  }                                                                                                            \
  extern "C" __global__ void __launch_bounds__(rawops::kTcThreads, MINB)                                       \
      tc_mlp_nf##NF##_bwd_##suffix(const T* dy, const T* y, const T* save, T* gws, T* dx, RAWOPS_TC_PARAMS(T),  \
                                   long long batch, long long n_in, long long width, long long n_out,          \
                                   long long hidden, long long flags) {                                        \
    const T* W[rawops::kMaxLayers] = {w0, w1, w2, w3, w4, w5, w6, w7, w8};                                   \
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

// The ordered sum of per-chunk weight-gradient partials, shared by the source network's backward
// (float32) and the tile kernels' (float16 / bfloat16): mlp_wgrad_reduce_bwd_<dtype>.
//   dw[n][k] = sum over chunks c in order of ws[c * stride + n * k_p + k],
//   db[n] = the same of ws[c * stride + db_offset + n] (db may be null);
// one thread an output, blocks of kReduceThreads (grid = ceil((N K + N) / kReduceThreads)).
// float32 (kRuns; the source network, whose gradients must carry float32's accuracy at any batch):
// the chunks in runs of kReduceRun, each run's sum then added in order, so no running sum
// spans more than a few dozen terms (a fixed order still: deterministic). The half types keep
// the single run: their result is rounded to 2-byte precision anyway.
namespace rawops {
namespace {

constexpr int kReduceThreads = RAWOPS_MLP_REDUCE_THREADS;
constexpr int kReduceRun = 16;  // float32: chunks summed a run (~sqrt of the most chunks, 2 per SM)

template <typename T, bool kRuns>
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
  if constexpr (kRuns) {
    for (int64_t c0 = 0; c0 < chunks; c0 += kReduceRun) {
      const int64_t c1 = c0 + kReduceRun < chunks ? c0 + kReduceRun : chunks;
      float run = 0.f;
#pragma unroll 8  // loads issued ahead; the sum stays in chunk order (deterministic)
      for (int64_t c = c0; c < c1; ++c) run += ws[c * stride + src];
      s += run;
    }
  } else {
#pragma unroll 8  // loads issued ahead; the sum stays in chunk order (deterministic)
    for (int64_t c = 0; c < chunks; ++c) s += ws[c * stride + src];
  }
  if (e < nk) dw[e] = from_float<T>(s);
  else db[e - nk] = from_float<T>(s);
}

}  // namespace
}  // namespace rawops

#define RAWOPS_REDUCE(suffix, T, runs)                                                                        \
  extern "C" __global__ void __launch_bounds__(rawops::kReduceThreads)                                       \
      mlp_wgrad_reduce_bwd_##suffix(const float* ws, long long chunks, long long stride, long long N,         \
                                    long long K, long long k_p, long long db_offset, T* dw, T* db) {          \
    rawops::wgrad_reduce<T, runs>(ws, chunks, stride, int(N), int(K), int(k_p), db_offset, dw, db);          \
  }
RAWOPS_REDUCE(f32, float, true)
RAWOPS_REDUCE(f16, __half, false)
RAWOPS_REDUCE(bf16, __nv_bfloat16, false)
