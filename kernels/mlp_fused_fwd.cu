// MLP family, the register-resident forward: tc_mlp_w<W>_<act>_fwd_<dtype> (W = hidden width
// 16/32/64/128, act = the hidden activation relu/gelu/none), float16 / bfloat16, sm_80+,
// mma.sync m16n8k16 (float32 accumulation) in inline PTX. Same arguments and results as the
// WMMA tile forward tc_mlp_nf*_fwd (kernels/mlp_tiles.cu), the training forward's saved
// pre-activations z ([hidden][batch][W]) included: used wherever every layer's weights fit in
// shared memory beside the warps' staging rows (rawops/mlp.py: fast_fit); the tile kernels
// serve the rest.
//
// Why: the tile forward is bound by shared memory, where every 16-row warp tile re-reads the
// whole layer's weight fragments and bounces every accumulator through shared memory. Here a
// warp owns kRows = 16 * kMT rows (32; 16 for W = 128, where 32 rows would need 128
// accumulator registers) and walks all layers with its activations in registers: the C
// fragments of two n8 tiles, bias and activation applied and packed to half2, are exactly the
// A fragment of one k16 slice of the next layer. Each B fragment (ldmatrix.x4 from the
// resident, padded weights) feeds 2 * kMT mma, so a 64-wide layer moves 8 KB of shared memory
// per 32 rows (the tile kernel: 8 KB per 16 rows plus 4 KB of accumulator round trips). x comes
// in by cp.async (16-byte, coalesced, zero-filled padding) into the warp's staging rows, the
// next tile's fetch issued as soon as layer 0 has read them; y leaves through the warp's output
// rows as 16-byte coalesced stores.
// Launch: persistent, one block of up to 16 warps per SM (64-wide network: 191 KB of shared
// memory, rawops/_mlp_plans.py: fast_smem_bytes), warps loop over kRows-row tiles with no
// block barrier after the weight load. The 64x4 f16 network at 2^20 rows moves 256 MB (x + y)
// and computes 43 GFLOP: memory-bound.
#include "rawops/dtype.cuh"
#include "rawops/mlp.cuh"

namespace rawops {
namespace {

// Packs act(lo), act(hi) (float) into the storage type's pair.
template <typename T, int kAct> __device__ __forceinline__ unsigned act_pack(float lo, float hi) {
  if (kAct == kActRelu) return Mma<T>::relu(Mma<T>::pack(lo, hi));
  if (kAct == kActGelu) return Mma<T>::pack(activate(lo, kActGelu), activate(hi, kActGelu));
  return Mma<T>::pack(lo, hi);
}

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
// two shuffles and six selects each, branch-free. (4-byte stores of the fragments would leave
// every 32-byte sector half written per instruction; picking the words by index, nvcc branches
// around every shuffle.)
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
  // Layout (rawops/_mlp_plans.py fast_smem_bytes): float biases [layers][kMaxWidth], weights of
  // layer 0 [kW][ld0], of the hidden layers [hidden - 1][kW][ldw], of the output layer
  // [out_p][ldw], then per warp its x rows [kRows][ld0] and its y rows [kRows][ldy].
  float* bias = reinterpret_cast<float*>(tc_smem);
  T* w0 = reinterpret_cast<T*>(bias + kMaxWidth * layers);
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
  for (int e = threadIdx.x; e < kMaxWidth * layers; e += blockDim.x) {
    const int l = e / kMaxWidth, c = e % kMaxWidth;
    const T* b = B[l];
    bias[e] = (b != nullptr && c < (l == hidden ? n_out : kW)) ? to_float(b[c]) : 0.f;
  }
  __syncthreads();

  const bool out_relu = ((flags >> kOutputActShift) & 3) == kActRelu;
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
    // time (all 128 at once would spill for W = 128).
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
    // copy, would spill at the 128-register cap.)
    for (int l = 1; l < hidden; ++l) {
      hidden_layer<T, kW, kMT, kAct>(a, b2, wh_b + 2u * unsigned((l - 1) * kW * ldw), bias + kMaxWidth * l,
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
    const float* bl = bias + kMaxWidth * hidden;
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
// allocation per activation; the activation as a runtime branch spills at the 128-register
// cap). kMT = 2 (32 rows a warp) except W = 128 (16 rows: 2 x 64 accumulators would spill).
// Up to 16 warps, one block per SM: at most 128 registers.
#define RAWOPS_TC_FAST(suffix, T, W, MT, ACT, CODE)                                                             \
  extern "C" __global__ void __launch_bounds__(32 * RAWOPS_MLP_FAST_MAX_WARPS, 1)                             \
      tc_mlp_w##W##_##ACT##_fwd_##suffix(const T* x, T* y, T* save, RAWOPS_TC_PARAMS(T), RAWOPS_TC_BIASES(T),   \
                                         long long batch, long long n_in, long long width, long long n_out,    \
                                         long long hidden, long long flags) {                                  \
    const T* W_[rawops::kMaxLayers] = {w0, w1, w2, w3, w4, w5, w6, w7, w8};                                  \
    const T* B_[rawops::kMaxLayers] = {b0, b1, b2, b3, b4, b5, b6, b7, b8};                                  \
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
