// Matrix family: C = A B with an optional fused epilogue, for matmul and linear_gelu.
//
//   C[m][n] = epilogue(sum_k A(m, k) B(k, n)),  float32 accumulation for every storage type.
// Three operand layouts, named like BLAS on row-major storage (every operand C-contiguous):
//   nn  a (M, K), b (K, N)      matmul; linear backward dx = dpre @ W
//   nt  a (M, K), b (N, K)      linear forward: x @ W^T with W in torch.nn.Linear layout
//   tn  a (K, M), b (K, N)      linear backward dW = dpre^T @ x, matmul backward db = a^T @ dy
// Epilogue (flags & 3): 0 none; 1 bias + GELU, the pre-activation also stored when `pre` is
// not null; 2 bias + GELU gradient, out = aux[m][n] * gelu'(acc + bias) (dpre recomputed in
// the backward); 3 bias only. flags & 4: exact-erf GELU, else the tanh approximation.
// bias may be null (no bias).
//
// Kernels (one set per dtype, entry names <kernel>_<layout>_<dtype>):
//   gemm_simt_*     any shape and alignment, any arch: 128x128x8 block tiles, 256 threads,
//                   8x8 outputs per thread in registers, double-buffered shared memory; FFMA
//                   (exact float32 math; half types convert on load). 4 LDS.128 per 64 FFMA.
//   gemm_simt_vec_*_f32  float32 whose rows are all whole float4 (16-byte aligned, contiguous
//                   dims % 4 == 0): the same tiles with BK = 16 and float4 global loads.
//   gemm_reduce_*   split-K: adds the float32 partials of the splits in order, then the epilogue.
//   gemm_mma_*      float16 / bfloat16 on sm_80+: mma.sync m16n8k16 tensor cores, 128x128x32
//                   block tiles, 8 warps of 64x32, 3-stage cp.async pipeline (60 KB of dynamic
//                   shared memory), ldmatrix (.trans for M/N-major operands). Needs each
//                   operand's contiguous dim % 8 == 0 and 16-byte aligned pointers (the Python
//                   side checks; else gemm_simt). Older archs compile an empty body that traps.
//                   The GEMMs split K over gridDim.z (float32 partials + gemm_reduce) when
//                   the output has too few tiles for the GPU (rawops/matmul.py: plan).
//   linear_small_*  nt with M <= 32 rows per blockIdx.y (x @ W^T, small batch), sm_80+: x
//                   staged in shared memory, 24 output features per block (details below).
//   linear_small_tf32_nt_f32  the same for float32 linear_gelu on sm_90+ in 3xTF32 on the
//                   tensor pipe (float32-level error; rawops.config.linear_tf32 switches it off).
// Measured on the H100 (bench/NOTES.md): bf16 8192^3 ~270 TFLOP/s (0.35x cuBLAS), f32 45.6
// (0.88x), linear_gelu f32 32x768->3072 12.5 us of kernel time exact (v5), 7.6 in 3xTF32 (v7).
#include "rawops/dtype.cuh"
#include "rawops/gemm_epilogue.cuh"
#include "rawops/cp_async.cuh"
#include "rawops/mma_sync.cuh"
#include "rawops/cluster.cuh"
#include "rawops/timeline.cuh"

namespace rawops {
namespace {

// A compile-time flag as a lambda argument (`auto tag`, decltype(tag)::value).
template <bool B> struct BoolConstant {
  static constexpr bool value = B;
};

// ============================================================================ SIMT (FFMA)
constexpr int kSimtThreads = 256;
constexpr int kSimtTile = 128;  // BM = BN
constexpr int kSimtK = 8;
constexpr int kSimtStride = kSimtTile + 4;  // conflict-free transposing stores, float4-aligned rows

// A_KM: a(m, k) at a[m * K + k] (else a[k * M + m]); B_KM: b(k, n) at b[n * K + k] (else b[k * N + n]).
// Split K (gridDim.z > 1): block z sums k in [z kc, (z + 1) kc) and stores its raw float32
// sums to partial[z][M][N]; gemm_reduce adds the splits in order and applies the epilogue.
template <typename T, bool A_KM, bool B_KM>
__device__ __forceinline__ void gemm_simt(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ c,
                                          const Epilogue<T> epi, int64_t M, int64_t N, int64_t K) {
  int64_t kb, ke;
  float* partial;
  split_k_range<kSimtK>(M, N, K, reinterpret_cast<float*>(c), kb, ke, partial);
  __shared__ __align__(16) float As[2][kSimtK][kSimtStride];
  __shared__ __align__(16) float Bs[2][kSimtK][kSimtStride];
  const int t = threadIdx.x;
  const int64_t m0 = int64_t(blockIdx.y) * kSimtTile, n0 = int64_t(blockIdx.x) * kSimtTile;
  const int tx = t % 16, ty = t / 16;

  // This thread's four elements of each operand tile: one base pointer, a fixed stride
  // between the four, and a fixed step per K tile (A_KM: rows t/8 + 32i at k t%8; else
  // column t%128 at k t/128 + 2i). Kept to one pointer per operand: 2 blocks of 256 per SM.
  const int64_t am = A_KM ? t / kSimtK : t % kSimtTile, ak = A_KM ? t % kSimtK : t / kSimtTile;
  const int64_t bn = B_KM ? t / kSimtK : t % kSimtTile, bk = B_KM ? t % kSimtK : t / kSimtTile;
  const T* pa = a + (A_KM ? (m0 + am) * K + kb + ak : (kb + ak) * M + m0 + am);
  const T* pb = b + (B_KM ? (n0 + bn) * K + kb + bk : (kb + bk) * N + n0 + bn);
  const int64_t a_stride = A_KM ? 32 * K : 2 * M, a_step = A_KM ? kSimtK : kSimtK * M;
  const int64_t b_stride = B_KM ? 32 * K : 2 * N, b_step = B_KM ? kSimtK : kSimtK * N;
  float ra[4], rb[4];
  auto load = [&](int64_t k0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const bool a_ok = A_KM ? (m0 + am + 32 * i < M && k0 + ak < ke) : (m0 + am < M && k0 + ak + 2 * i < ke);
      ra[i] = a_ok ? to_float(pa[i * a_stride]) : 0.f;
      const bool b_ok = B_KM ? (n0 + bn + 32 * i < N && k0 + bk < ke) : (n0 + bn < N && k0 + bk + 2 * i < ke);
      rb[i] = b_ok ? to_float(pb[i * b_stride]) : 0.f;
    }
    pa += a_step;
    pb += b_step;
  };
  auto store = [&](int s) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      As[s][A_KM ? ak : ak + 2 * i][A_KM ? am + 32 * i : am] = ra[i];
      Bs[s][B_KM ? bk : bk + 2 * i][B_KM ? bn + 32 * i : bn] = rb[i];
    }
  };

  float acc[8][8];
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[i][j] = 0.f;

  const int64_t tiles = ke > kb ? (ke - kb + kSimtK - 1) / kSimtK : 0;
  load(kb);
  store(0);
  __syncthreads();
  for (int64_t kt = 0; kt < tiles; ++kt) {
    const int s = int(kt & 1);
    load(kb + (kt + 1) * kSimtK);  // unconditional (predicated past ke): see gemm_simt_vec
#pragma unroll
    for (int k = 0; k < kSimtK; ++k) {
      const float4 a0 = *reinterpret_cast<const float4*>(&As[s][k][ty * 4]);
      const float4 a1 = *reinterpret_cast<const float4*>(&As[s][k][64 + ty * 4]);
      const float4 b0 = *reinterpret_cast<const float4*>(&Bs[s][k][tx * 4]);
      const float4 b1 = *reinterpret_cast<const float4*>(&Bs[s][k][64 + tx * 4]);
      const float av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
      const float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    store(s ^ 1);
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int64_t m = m0 + (i < 4 ? ty * 4 + i : 64 + ty * 4 + i - 4);
    if (m >= M) continue;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int64_t n = n0 + (j < 4 ? tx * 4 + j : 64 + tx * 4 + j - 4);
      if (n >= N) continue;
      if (partial != nullptr)
        partial[m * N + n] = acc[i][j];
      else
        c[m * N + n] = from_float<T>(epi(acc[i][j], m, n));
    }
  }
}

// ---------------------------------------------------------------------------- FFMA, 16-byte loads
// float32 with every operand's contiguous dim % 4 == 0 and 16-byte aligned pointers (the
// Python side checks; else gemm_simt): the same 128 x 128 block tile and 8 x 8 outputs per
// thread, but BK = 16 (one barrier per 1024 FFMA per thread instead of 512), two float4
// global loads per operand per K tile (was 4 scalar loads per 8 k), issued before the FMAs
// and stored to the other buffer halfway through them. 8192^3 on the H100: 46.0 TFLOP/s
// (0.89x cuBLAS) with gemm_simt's thread grid (rows (t / 16) * 4 + {0, 64}); 64 x 32 warp
// tiles (WARP_TILES, lanes 8 x 4: each fragment LDS.128 reads 8 distinct float4) measured
// 44.7, and gemm_simt itself 35.8 before its loads moved ahead of the FMAs, 42.0 after.
//   K-major operand (a in nn/nt, b in nt): 128 rows x 16 k. Lanes 2r, 2r+1 read the 32
//   bytes of row r; the transposing scalar stores S[k][r] hit 32 distinct banks (row
//   stride 132 = 4 mod 32 words: k + 4 moves 16 banks, r moves 1).
//   M/N-major operand: 16 k x 128 columns, float4 copied as is (STS.128).
constexpr int kVecK = 16;

template <bool KM>
struct VecTile {
  // This thread's two float4 of a 128 x 16 tile: (row, k) offsets of the first, and the
  // step to the second (KM: +8 k; else +8 k rows).
  int row, k;
  __device__ __forceinline__ VecTile(int t) {
    if (KM) {
      row = (t / 32) * 16 + (t % 32) / 2;
      k = (t % 2) * 4;
    } else {
      row = (t % 32) * 4;  // here: the column (M or N) of the float4's first element
      k = t / 32;
    }
  }
};

// Four adjacent float32 outputs (m, n .. n + 3) as one float4 (N % 4 == 0 keeps it whole): the
// raw sums into this split's partial slab, or through the epilogue into c.
__device__ __forceinline__ void store_outputs4(float* c, float* partial, const Epilogue<float>& epi, int64_t N,
                                               int64_t m, int64_t n, float v0, float v1, float v2, float v3) {
  if (partial != nullptr)
    *reinterpret_cast<float4*>(partial + m * N + n) = make_float4(v0, v1, v2, v3);
  else
    *reinterpret_cast<float4*>(c + m * N + n) =
        make_float4(epi(v0, m, n), epi(v1, m, n + 1), epi(v2, m, n + 2), epi(v3, m, n + 3));
}

template <bool A_KM, bool B_KM, bool WARP_TILES = true>
__device__ __forceinline__ void gemm_simt_vec(const float* __restrict__ a, const float* __restrict__ b,
                                              float* __restrict__ c, const Epilogue<float> epi, int64_t M,
                                              int64_t N, int64_t K) {
  int64_t kb, ke;
  float* partial;
  split_k_range<kVecK>(M, N, K, c, kb, ke, partial);
  __shared__ __align__(16) float As[2][kVecK][kSimtStride];
  __shared__ __align__(16) float Bs[2][kVecK][kSimtStride];
  const int t = threadIdx.x, lane = t % 32, warp = t / 32;
  const int64_t m0 = int64_t(blockIdx.y) * kSimtTile, n0 = int64_t(blockIdx.x) * kSimtTile;

  // Global reads: a pointer to this thread's first float4 of each operand; the second is
  // `*_second` elements further, the next K tile `*_step` further.
  const VecTile<A_KM> ta(t);
  const VecTile<B_KM> tb(t);
  // Rows (K-major) or column vectors (else) past the matrix read the last one instead: their
  // sums land in outputs that are never stored, and no select per load is needed. With
  // dims % 4 == 0 a float4 is wholly inside or wholly outside.
  const int64_t a_rc = m0 + ta.row < M ? m0 + ta.row : (A_KM ? M - 1 : M - 4);
  const int64_t b_rc = n0 + tb.row < N ? n0 + tb.row : (B_KM ? N - 1 : N - 4);
  const float* pa = a + (A_KM ? a_rc * K + kb + ta.k : (kb + ta.k) * M + a_rc);
  const float* pb = b + (B_KM ? b_rc * K + kb + tb.k : (kb + tb.k) * N + b_rc);
  const int64_t a_second = A_KM ? 8 : 8 * M, a_step = A_KM ? kVecK : kVecK * M;
  const int64_t b_second = B_KM ? 8 : 8 * N, b_step = B_KM ? kVecK : kVecK * N;
  float4 ra[2], rb[2];
  // k past ke reads the matrix's first vector instead (unpredicated loads: a predicated
  // load must keep or zero its registers, ~100 MOV/CS2R per tile or 16 more registers live
  // across the loop), and a tile that crosses ke (only the last) zeroes those registers.
  auto load = [&](int64_t k0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      ra[i] = __ldg(reinterpret_cast<const float4*>(k0 + ta.k + 8 * i < ke ? pa + i * a_second : a));
      rb[i] = __ldg(reinterpret_cast<const float4*>(k0 + tb.k + 8 * i < ke ? pb + i * b_second : b));
    }
    pa += a_step;
    pb += b_step;
    if (k0 + kVecK > ke) {
      const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        if (k0 + ta.k + 8 * i >= ke) ra[i] = zero;
        if (k0 + tb.k + 8 * i >= ke) rb[i] = zero;
      }
    }
  };
  auto store_tile = [&](float (*S)[kSimtStride], const float4* r, int row, int k, bool km) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (km) {
        S[k + 8 * i + 0][row] = r[i].x;
        S[k + 8 * i + 1][row] = r[i].y;
        S[k + 8 * i + 2][row] = r[i].z;
        S[k + 8 * i + 3][row] = r[i].w;
      } else {
        *reinterpret_cast<float4*>(&S[k + 8 * i][row]) = r[i];
      }
    }
  };
  auto store = [&](int s) {
    store_tile(As[s], ra, ta.row, ta.k, A_KM);
    store_tile(Bs[s], rb, tb.row, tb.k, B_KM);
  };

  // Compute layout: warps 2 (M) x 4 (N) of 64 x 32; lane (lm, ln) = (lane / 4, lane % 4)
  // owns rows wm*64 + lm*4 + {0..3} + {0, 32} and columns wn*32 + ln*4 + {0..3} + {0, 16}.
  // (WARP_TILES false: gemm_simt's layout, rows (t / 16)*4 + {0, 64}, columns (t % 16)*4 + {0, 64}.)
  constexpr int R2 = WARP_TILES ? 32 : 64, C2 = WARP_TILES ? 16 : 64;
  const int row = WARP_TILES ? (warp / 4) * 64 + (lane / 4) * 4 : (t / 16) * 4;
  const int col = WARP_TILES ? (warp % 4) * 32 + (lane % 4) * 4 : (t % 16) * 4;
  float acc[8][8];
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[i][j] = 0.f;

  auto compute = [&](int s, int k_begin) {
#pragma unroll
    for (int k = k_begin; k < k_begin + kVecK / 2; ++k) {
      const float4 a0 = *reinterpret_cast<const float4*>(&As[s][k][row]);
      const float4 a1 = *reinterpret_cast<const float4*>(&As[s][k][row + R2]);
      const float4 b0 = *reinterpret_cast<const float4*>(&Bs[s][k][col]);
      const float4 b1 = *reinterpret_cast<const float4*>(&Bs[s][k][col + C2]);
      const float av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
      const float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
  };

  // One barrier per K tile. The next tile's global loads are issued first, unconditionally
  // (past ke they are predicated off), and land in shared memory halfway through this
  // tile's FMAs: buffer s ^ 1 is free since the last barrier. Behind an `if (more tiles)`
  // the compiler sank the loads below the FMAs, exposing their latency every tile (SASS).
  const int tiles = ke > kb ? int((ke - kb + kVecK - 1) / kVecK) : 0;
  if (tiles > 0) {  // else K == 0 (or an empty split): a and b may hold nothing to read
    load(kb);
    store(0);
  }
  __syncthreads();
  for (int kt = 0; kt < tiles; ++kt) {
    const int s = kt & 1;
    load(kb + int64_t(kt + 1) * kVecK);
    compute(s, 0);
    store(s ^ 1);
    compute(s, kVecK / 2);
    __syncthreads();
  }

  // N % 4 == 0: each thread's 4 adjacent columns are wholly in or out; float4 stores.
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int64_t m = m0 + row + (i < 4 ? i : R2 + i - 4);
    if (m >= M) continue;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t n = n0 + col + C2 * h;
      if (n < N) store_outputs4(c, partial, epi, N, m, n, acc[i][4 * h], acc[i][4 * h + 1], acc[i][4 * h + 2],
                                acc[i][4 * h + 3]);
    }
  }
}

// ============================================================================ small M, FFMA (nn)
// gemm_small_m_nn: C (M x N) = A (M x K, k contiguous) B (K x N, n contiguous) for M <= 32 in
// float32 FFMA, rows of a, b and c whole float4 (the Python side checks): linear_gelu's
// dx = dpre @ W at small batch, and matmul. gemm_simt_vec's 128 x 128 tiles spent 3/4 of their
// FMAs on padding rows there (32x768x3072: 32.8 us against cuBLAS's 13.5, H100, CUDA graphs; this
// kernel + gemm_reduce 10.3, bench/results/explore_linear_bwd_small.md).
// A block: the (up to 32) rows x 64 columns over one K split, 128 threads of 4 rows x 4
// columns; BK = 16, double-buffered in shared memory, A stored transposed ([k][m]: a thread's
// 4 rows are one float4), B as it is. Split K as the other FFMA kernels (gemm_reduce).
constexpr int kSmallMRows = 32, kSmallMCols = 64, kSmallMThreads = 128, kSmallMK = 16;
constexpr int kSmallMStrideA = kSmallMRows + 4;  // float4-aligned rows; transposing stores 2-way at most

__device__ __forceinline__ void gemm_small_m_nn(const float* __restrict__ a, const float* __restrict__ b,
                                                float* __restrict__ c, const Epilogue<float> epi, int64_t M,
                                                int64_t N, int64_t K) {
  int64_t kb, ke;
  float* partial;
  split_k_range<kSmallMK>(M, N, K, c, kb, ke, partial);
  __shared__ __align__(16) float As[2][kSmallMK][kSmallMStrideA];
  __shared__ __align__(16) float Bs[2][kSmallMK][kSmallMCols];
  const int t = threadIdx.x;
  const int64_t m0 = int64_t(blockIdx.y) * kSmallMRows, n0 = int64_t(blockIdx.x) * kSmallMCols;

  // Global reads a K tile: A 32 rows x 16 k, one float4 a thread (row t / 4, k 4 (t % 4));
  // B 16 k x 64 columns, two float4 a thread (k t / 16 and + 8, columns 4 (t % 16)). Rows and
  // column vectors past the matrix read the last one (their sums are never stored); k past ke
  // reads zeros.
  const int a_row = t / 4, a_k = 4 * (t % 4), b_k = t / 16, b_col = 4 * (t % 16);
  const float* pa = a + (m0 + a_row < M ? m0 + a_row : M - 1) * K + a_k;
  const float* pb = b + (n0 + b_col < N ? n0 + b_col : N - 4);
  // Two K tiles in flight in registers: a tile's loads go out two tiles before its FMAs.
  float4 ra[2], rb[2][2];
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
  auto load = [&](int r, int64_t k0) {
    ra[r] = k0 + a_k < ke ? __ldg(reinterpret_cast<const float4*>(pa + k0)) : zero;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int64_t k = k0 + b_k + 8 * i;
      rb[r][i] = k < ke ? __ldg(reinterpret_cast<const float4*>(pb + k * N)) : zero;
    }
  };
  auto store = [&](int s, int r) {
    As[s][a_k + 0][a_row] = ra[r].x;
    As[s][a_k + 1][a_row] = ra[r].y;
    As[s][a_k + 2][a_row] = ra[r].z;
    As[s][a_k + 3][a_row] = ra[r].w;
#pragma unroll
    for (int i = 0; i < 2; ++i) *reinterpret_cast<float4*>(&Bs[s][b_k + 8 * i][b_col]) = rb[r][i];
  };

  const int row = 4 * (t / 16), col = 4 * (t % 16);  // this thread's 4 x 4 outputs
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;

  const int tiles = ke > kb ? int((ke - kb + kSmallMK - 1) / kSmallMK) : 0;
  if (tiles > 0) {  // else K == 0 (or an empty split): a and b may hold nothing to read
    load(0, kb);
    store(0, 0);
    load(1, kb + kSmallMK);  // past ke: zeros
  }
  __syncthreads();
  // Tile kt: its FMAs from buffer kt & 1; tile kt + 2's loads (unconditional: past ke they read
  // zeros) into the registers tile kt left; tile kt + 1 (loaded an iteration ago) stored to the
  // other buffer, free since the last barrier. One barrier per tile.
  // (Buffer and register indices are compile-time: tiles go in pairs; a runtime index put the
  // registers on the stack.)
  auto tile = [&](int kt, auto odd) {
    constexpr int st = decltype(odd)::value ? 1 : 0;
    load(st, kb + int64_t(kt + 2) * kSmallMK);
#pragma unroll
    for (int k = 0; k < kSmallMK; ++k) {
      const float4 av = *reinterpret_cast<const float4*>(&As[st][k][row]);
      const float4 bv = *reinterpret_cast<const float4*>(&Bs[st][k][col]);
      const float ai[4] = {av.x, av.y, av.z, av.w}, bj[4] = {bv.x, bv.y, bv.z, bv.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(ai[i], bj[j], acc[i][j]);
    }
    store(st ^ 1, st ^ 1);
    __syncthreads();
  };
  for (int kt = 0; kt < tiles; kt += 2) {
    tile(kt, BoolConstant<false>());
    if (kt + 1 < tiles) tile(kt + 1, BoolConstant<true>());
  }

  const int64_t n = n0 + col;
  if (n >= N) return;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t m = m0 + row + i;
    if (m < M) store_outputs4(c, partial, epi, N, m, n, acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
  }
}

// ============================================================================ tensor cores (sm_80+)
constexpr int kMmaThreads = 256;
constexpr int kMmaTile = 128;
constexpr int kMmaK = 32;
constexpr int kMmaStages = 3;
constexpr int kKMajorStride = kMmaK + 8;  // [rows][32 k + 8]: ldmatrix conflict-free
// [32 k][rows + 8] when the operand is M- or N-contiguous.
template <bool KM, int ROWS> struct TileShape {
  static constexpr int stride = KM ? kKMajorStride : ROWS + 8;
  static constexpr int elems = KM ? ROWS * kKMajorStride : kMmaK * (ROWS + 8);
};

// One operand tile (ROWS rows of M or N, 32 of K) of stage memory (rawops/cp_async.cuh).
template <typename T, bool KM, int ROWS>
__device__ __forceinline__ void load_tile(T* s, const T* __restrict__ g, int64_t r0, int64_t k0, int64_t R,
                                          int64_t K, int64_t kend, int t) {
  stage_tile<T, KM, ROWS, kMmaK, TileShape<KM, ROWS>::stride, kMmaThreads>(s, g, r0, k0, R, K, kend, t);
}

// BN = 128: warps of 64x32 (6 ldmatrix.x4 per 16 mma). BN = 256 (warps of 64x64, 8 per 32,
// 92 KB of stages, 222 registers: one block per SM) measured slower on the H100 (212 against
// 256 TFLOP/s at 8192^3 bf16; bench/NOTES.md) and is not instantiated.
// Split K (gridDim.z > 1): as gemm_simt, raw float32 sums to partial[z][M][N].
template <typename T, bool A_KM, bool B_KM, int BN>
__device__ __forceinline__ void gemm_mma(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ c,
                                         const Epilogue<T> epi, int64_t M, int64_t N, int64_t K) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int kA = TileShape<A_KM, kMmaTile>::elems, kB = TileShape<B_KM, BN>::elems;
  constexpr int kAStride = TileShape<A_KM, kMmaTile>::stride, kBStride = TileShape<B_KM, BN>::stride;
  constexpr int WN = BN / 4, NI = WN / 8;
  T* const smem = reinterpret_cast<T*>(smem_raw);
  const int t = threadIdx.x, lane = t % 32, warp = t / 32;
  const int wm = warp / 4, wn = warp % 4;  // warp tile: rows wm*64 + [0, 64), cols wn*WN + [0, WN)
  const int64_t m0 = int64_t(blockIdx.y) * kMmaTile, n0 = int64_t(blockIdx.x) * BN;
  // split_k_range's arithmetic written out: through the helper ptxas allocates this kernel's
  // registers differently (same instruction count, sm_90), and it is timed only as it is.
  int64_t kb = 0, ke = K;
  float* partial = nullptr;
  if (gridDim.z > 1) {
    const int64_t kc = ((K + gridDim.z - 1) / gridDim.z + kMmaK - 1) / kMmaK * kMmaK;
    kb = int64_t(blockIdx.z) * kc;
    ke = kb + kc < K ? kb + kc : K;
    partial = reinterpret_cast<float*>(c) + int64_t(blockIdx.z) * M * N;
  }
  // Operands are addressed from k = kb with ke - kb columns; K stays the row stride.
  const int tiles = ke > kb ? int((ke - kb + kMmaK - 1) / kMmaK) : 0;

  float acc[4][NI][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int v = 0; v < 4; ++v) acc[i][j][v] = 0.f;

#pragma unroll
  for (int s = 0; s < kMmaStages - 1; ++s) {
    if (s < tiles) {
      load_tile<T, A_KM, kMmaTile>(smem + s * (kA + kB), a, m0, kb + int64_t(s) * kMmaK, M, K, ke, t);
      load_tile<T, B_KM, BN>(smem + s * (kA + kB) + kA, b, n0, kb + int64_t(s) * kMmaK, N, K, ke, t);
    }
    cp_async_commit();
  }
  const int j = lane / 8, r = lane % 8;
  for (int kt = 0; kt < tiles; ++kt) {
    cp_async_wait<kMmaStages - 2>();
    __syncthreads();  // tile kt visible to all; stage (kt - 1) % S free for the next load
    const int next = kt + kMmaStages - 1;
    if (next < tiles) {
      T* st = smem + (next % kMmaStages) * (kA + kB);
      load_tile<T, A_KM, kMmaTile>(st, a, m0, kb + int64_t(next) * kMmaK, M, K, ke, t);
      load_tile<T, B_KM, BN>(st + kA, b, n0, kb + int64_t(next) * kMmaK, N, K, ke, t);
    }
    cp_async_commit();
    const T* As = smem + (kt % kMmaStages) * (kA + kB);
    const T* Bs = As + kA;
#pragma unroll
    for (int kk = 0; kk < kMmaK; kk += 16) {
      unsigned af[4][4], bf[NI][2];
#pragma unroll
      for (int mi = 0; mi < 4; ++mi) {
        const int mb = wm * 64 + mi * 16;
        if (A_KM)
          ldmatrix_x4<false>(af[mi], As + (mb + lane % 16) * kAStride + kk + (lane / 16) * 8);
        else
          ldmatrix_x4<true>(af[mi], As + (kk + r + (j / 2) * 8) * kAStride + mb + (j % 2) * 8);
      }
#pragma unroll
      for (int p = 0; p < NI / 2; ++p) {
        const int nb = wn * WN + p * 16;
        unsigned q[4];
        if (B_KM)
          ldmatrix_x4<false>(q, Bs + (nb + r + (j / 2) * 8) * kBStride + kk + (j % 2) * 8);
        else
          ldmatrix_x4<true>(q, Bs + (kk + r + (j % 2) * 8) * kBStride + nb + (j / 2) * 8);
        bf[2 * p][0] = q[0];
        bf[2 * p][1] = q[1];
        bf[2 * p + 1][0] = q[2];
        bf[2 * p + 1][1] = q[3];
      }
#pragma unroll
      for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) mma_m16n8k16<T>(acc[mi][ni], af[mi], bf[ni][0], bf[ni][1]);
    }
  }
  cp_async_wait<0>();

  const bool pairs = (N % 2) == 0;  // two adjacent outputs per 32-bit store
#pragma unroll
  for (int mi = 0; mi < 4; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t m = m0 + wm * 64 + mi * 16 + lane / 4 + half * 8;
      if (m >= M) continue;
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) {
        const int64_t n = n0 + wn * WN + ni * 8 + (lane % 4) * 2;
        const float v0 = acc[mi][ni][half * 2], v1 = acc[mi][ni][half * 2 + 1];
        if (partial != nullptr) {
          if (n < N) partial[m * N + n] = v0;
          if (n + 1 < N) partial[m * N + n + 1] = v1;
        } else if (pairs && n + 1 < N) {
          T out[2] = {from_float<T>(epi(v0, m, n)), from_float<T>(epi(v1, m, n + 1))};
          *reinterpret_cast<unsigned*>(c + m * N + n) = *reinterpret_cast<const unsigned*>(out);
        } else {
          if (n < N) c[m * N + n] = from_float<T>(epi(v0, m, n));
          if (n + 1 < N) c[m * N + n + 1] = from_float<T>(epi(v1, m, n + 1));
        }
      }
    }
#else
  __trap();  // the Python side never launches these below sm_80
#endif
}

// ============================================================================ small batch (x @ W^T)
// linear_small: y = epilogue(x @ W^T) for up to 32 rows per blockIdx.y, sm_80+. Bound by
// reading W once (9.4 MB at 32x768->3072 f32) and by issue: v3 (a warp per 4 features x 32
// rows, lanes along K, x re-read through L1 per warp) ran 13.5 us at 0.4-0.55 issued warps per
// scheduler, 9-18% occupancy, ~4 non-FMA instructions per x load (ncu, bench/NOTES.md).
// v5 (12.8 us, not the hoped ~5: see the end of this comment): a block of 384 threads owns
// 24 features (N / 24 blocks: 128 at N = 3072, one per SM):
//   - x (32 rows x 768 of K) is staged once per block in shared memory by cp.async;
//   - thread (f, g) = (t % 24, t / 24) holds W[f][...] for the 16-byte vectors c * 16 + g
//     (c < 12 f32, < 6 f16/bf16) in registers, loaded before the x staging so that both
//     latencies overlap;
//   - each x vector read from shared memory (a warp reads 2 distinct vectors: a broadcast)
//     feeds 16 / sizeof(T) FMAs into one of the thread's 32 row sums;
//   - the 16 groups' partial sums meet in shared memory (reusing x's) and are added in a
//     fixed order (deterministic); a warp stores 24-feature row segments.
// K longer than one chunk (768) loops over chunks. Measured limit (ncu: shared-memory pipe 63%,
// 0.37 issued warps per scheduler): a 16-byte shared load costs its 16 bytes per lane even as
// a broadcast (128 B per SM cycle), and each x value a thread receives feeds 1 FMA per float,
// a quarter of what FFMA throughput needs. Tried since (bench/NOTES.md, "Small batch, v5.1/v6"):
// x staged in 4 parts along K (slower: 14.3 us), K split over the CTAs of a cluster with 8 x 8
// outputs per thread (bench/explore/matmul_variants.cu: 12.2 us at 32 rows, 38 us at 128).
constexpr int kSmallRows = 32;      // rows per blockIdx.y
constexpr int kSmallFeatures = 24;  // output features per block
constexpr int kSmallGroups = 16;    // threads sharing one feature, along K
constexpr int kSmallK = 768;        // K per chunk: x chunk 96 KB f32, 48 KB f16/bf16
constexpr int kSmallThreads = kSmallFeatures * kSmallGroups;

// 16 bytes of T to floats from its 32-bit words (a bf16 is the high half of its float): one
// instruction per value. Through a T* into the vector, nvcc split each 16-byte shared load
// into eight 2-byte loads (3091 LDS in the bf16 kernel's SASS).
__device__ __forceinline__ void unpack_word(unsigned w, float* f, const float*) { f[0] = __uint_as_float(w); }
__device__ __forceinline__ void unpack_word(unsigned w, float* f, const __nv_bfloat16*) {
  f[0] = __uint_as_float(w << 16);
  f[1] = __uint_as_float(w & 0xffff0000u);
}
__device__ __forceinline__ void unpack_word(unsigned w, float* f, const __half*) {
  const float2 p = __half22float2(*reinterpret_cast<const __half2*>(&w));
  f[0] = p.x;
  f[1] = p.y;
}
template <typename T> __device__ __forceinline__ void unpack(const uint4& raw, float* f) {
  constexpr int per_word = 4 / sizeof(T);
  unpack_word(raw.x, f, static_cast<const T*>(nullptr));
  unpack_word(raw.y, f + per_word, static_cast<const T*>(nullptr));
  unpack_word(raw.z, f + 2 * per_word, static_cast<const T*>(nullptr));
  unpack_word(raw.w, f + 3 * per_word, static_cast<const T*>(nullptr));
}

// K % (16 / sizeof(T)) == 0 and x, w 16-byte aligned (the Python side checks).
template <typename T>
__device__ __forceinline__ void linear_small(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                                             const Epilogue<T> epi, int64_t M, int64_t N, int64_t K) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  // 12 W vectors per thread for float32, 6 for half types (more hoisted loads spilled).
  constexpr int V = 16 / sizeof(T), KC = kSmallK, VECTORS = KC / (kSmallGroups * V);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* const xs = reinterpret_cast<T*>(smem_raw);          // [kSmallRows][KC]
  float* const red = reinterpret_cast<float*>(smem_raw);  // [groups][rows][features], after the FMAs
  const int t = threadIdx.x, f = t % kSmallFeatures, g = t / kSmallFeatures;
  const int64_t n0 = int64_t(blockIdx.x) * kSmallFeatures, row0 = int64_t(blockIdx.y) * kSmallRows;
  const int rows = int(M - row0 < kSmallRows ? M - row0 : kSmallRows);
  // Features past N read the last row of W: their sums are never stored.
  const T* const wf = w + (n0 + f < N ? n0 + f : N - 1) * K;
  const T* const xb = x + row0 * K;
  float acc[kSmallRows];
#pragma unroll
  for (int m = 0; m < kSmallRows; ++m) acc[m] = 0.f;

  for (int64_t k0 = 0; k0 < K; k0 += KC) {
    const int kc = int(K - k0 < KC ? K - k0 : KC);  // columns of this chunk
    uint4 wv[VECTORS];
#pragma unroll
    for (int c = 0; c < VECTORS; ++c) {
      const int k = (c * kSmallGroups + g) * V;
      wv[c] = k < kc ? __ldg(reinterpret_cast<const uint4*>(wf + k0 + k)) : make_uint4(0, 0, 0, 0);
    }
    // Only rows < rows and columns < kc are staged: the FMAs below skip vectors past kc, and
    // rows past M only feed sums that are never stored.
    const int width = kc / V;
    for (int i = t; i < rows * width; i += kSmallThreads) {
      const int r = i / width, v = i % width;
      cp_async16(xs + r * KC + v * V, xb + r * K + k0 + v * V, true);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
#pragma unroll
    for (int c = 0; c < VECTORS; ++c) {
      const int k = (c * kSmallGroups + g) * V;
      if (k < kc) {
        float wc[V];
        unpack<T>(wv[c], wc);
#pragma unroll
        for (int m = 0; m < kSmallRows; ++m) {
          float xv[V];
          unpack<T>(*reinterpret_cast<const uint4*>(xs + m * KC + k), xv);
#pragma unroll
          for (int v = 0; v < V; ++v) acc[m] = fmaf(wc[v], xv[v], acc[m]);
        }
      }
    }
    __syncthreads();  // xs is rewritten by the next chunk, or reused for the partial sums
  }
#pragma unroll
  for (int m = 0; m < kSmallRows; ++m) red[(g * kSmallRows + m) * kSmallFeatures + f] = acc[m];
  __syncthreads();
  for (int o = t; o < kSmallRows * kSmallFeatures; o += kSmallThreads) {
    const int m = o / kSmallFeatures, fo = o % kSmallFeatures;
    float sum = 0.f;
#pragma unroll
    for (int s = 0; s < kSmallGroups; ++s) sum += red[(s * kSmallRows + m) * kSmallFeatures + fo];
    const int64_t n = n0 + fo, gm = row0 + m;
    if (m < rows && n < N) y[gm * N + n] = from_float<T>(epi(sum, gm, n));
  }
#else
  __trap();  // the Python side never launches it below sm_80
#endif
}

// ============================================================================ small batch, 3xTF32 (sm_90)
// linear_small_tf32: y = epilogue(x @ W^T) in float32 for up to 32 rows per blockIdx.y, on the
// tensor pipe in 3xTF32 (kernels/include/rawops/mma_sync.cuh: ~3e-7 relative measured, as
// torch's float32) for linear_gelu only; matmul stays exact FFMA. The FFMA kernels (v3-v6)
// stalled at ~12 us at 32x768->3072 (shared-memory bandwidth, latency); here no operand goes
// through shared memory and every SM streams its 1/128 of W (72 KB) once:
//   - a cluster of C CTAs (C = 1 ships: no cluster) owns kFeat = NWN * NT * 8 output
//     features; CTA r of it, warp (wn, wk), sums NT n8 tiles x both m16 tiles over K-part
//     r * NWK + wk (K split into C * NWK parts of whole 16-wide steps: 48 of K at K = 768);
//   - fragments come straight from global memory (L2): inside each 16-wide step lane (g, t)
//     loads x[row][k0 + 4t .. 4t + 3] for rows g + 8i and W[n][k0 + 4t .. 4t + 3] for n8 tile
//     rows g, one LDG.128 each (8 rows x 64 contiguous bytes a warp: whole sectors); the step
//     is two k8 mma slices with K permuted the same way for A and B (slice h: tf32 slot t <->
//     k0 + 4t + 2h, slot t + 4 <-> k0 + 4t + 2h + 1), so no shuffle is needed. A warp's loads
//     for up to 3 steps are all issued before the first split (latency is the enemy here);
//     the split is split_tf32_fast (3 instructions a value, where cvt.rna.tf32 is emulated in
//     4 on sm_90: 2880 -> 2208 SASS instructions), as the source network's 3xTF32 kernel does;
//   - each warp's partial tile goes to shared memory; after a (cluster) barrier CTA r adds, in
//     a fixed order (deterministic), the C x NWK partials of its 32 / C rows (through
//     distributed shared memory when C > 1; 2 features a thread when C = 1) and applies the
//     epilogue.
// Shipped: C1 NWN1 NT3 NWK16 (128 CTAs of 512 threads at N = 3072, 128 registers). H100, CUDA
// graph of 20 (bench/NOTES.md, "Small batch, v7" and sessions 12-13): 7.6 us at 32x768->3072 (v5
// 12.5), 6.7-6.8 by session 11, 6.3-6.4 with the sum over pairs, 6.2-6.3 with the sum's reads
// conflict-free; with no math at all it would still take 5.7 (the loads: ~170 KB into each SM).
// Clusters splitting K (2 or 4 CTAs: 7.6-14.7), x multicast to a cluster's shared memories (9.1,
// 15), the operands staged through shared memory by cp.async (9.1) and every load issued before
// the first mma (7.9) were slower (bench/results/explore_linear_*.md).
// Launch: gridDim.x = C * ceil(N / kFeat) (clusters compiled in: __cluster_dims__),
// NWN * NWK warps, small_tf32_shared_bytes of dynamic shared memory (rawops/matmul.py).
template <int NWN, int NT, int NWK>
struct SmallTf32 {
  static constexpr int kFeat = NWN * NT * 8, kThreads = NWN * NWK * 32;
  // [wk][row][kStride]: float2 stores of lanes g = 0..3 (one half-warp phase) hit 32 banks. At
  // kFeat = 24 the sum's float2 reads (12 threads a row, then 4 of the next) would meet 2-way
  // conflicts, so odd rows hold their columns XOR 16 (kSwizzle): both patterns conflict-free
  // without more padding. H100, CUDA graphs of 20: stride 56 (the same, at 112 KB: over sm_120's
  // 99) 6.38 -> 6.16 us a call; this 6.41 -> 6.21 (bench/results/explore_linear_epilogue.md, _swizzle.md).
  static constexpr int kStride = kFeat % 32 == 24 ? kFeat + 16 : kFeat + 8;
  static constexpr int kSwizzle = kFeat == 24 ? 16 : 0;
  static __device__ __forceinline__ int col(int row, int c) { return c ^ ((row & 1) * kSwizzle); }
  static constexpr int kSlab = kSmallRows * kStride;
};
#ifndef RAWOPS_SMALL_TF32_STEPS
#define RAWOPS_SMALL_TF32_STEPS 3
#endif
constexpr int kTf32Steps = RAWOPS_SMALL_TF32_STEPS;  // 16-wide K steps loaded per round (all in flight)

// The same kernel serves float16 / bfloat16 (linear_small_mma_nt_<f16|bf16>, sm_90+): one
// m16n8k16 mma per product instead of three m16n8k8 TF32 ones. A 16-byte vector is then 8
// values, so a warp's step covers 32 of K (still 64 bytes a row), split into two k16 slices
// the same way: slice h takes the lane's words 2h and 2h + 1 (its values 4h .. 4h + 3), as
// the fragment's k pairs (2t, 2t + 1) and (2t + 8, 2t + 9), for A and B alike.
// K % (16 / sizeof(T)) == 0 and x, w 16-byte aligned (the Python side checks).
template <typename T, int C, int NWN, int NT, int NWK>
__device__ __forceinline__ void linear_small_tc(const T* __restrict__ x, const T* __restrict__ w,
                                                T* __restrict__ y, const Epilogue<T> epi, int64_t M,
                                                int64_t N, int64_t K) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using S = SmallTf32<NWN, NT, NWK>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* const red = reinterpret_cast<float*>(smem_raw);  // [NWK][kSmallRows][kStride]
  const int t = threadIdx.x, lane = t % 32, warp = t / 32, g = lane / 4, q = lane % 4;
#ifdef RAWOPS_TIMELINE
  // Lane 0 of each warp: entry, first operands split, partial tile stored, CTA barrier, exit.
  const int slot = lane == 0 ? int(blockIdx.y * gridDim.x + blockIdx.x) * (S::kThreads / 32) + warp
                             : RAWOPS_TIMELINE_SLOTS;
  timeline_mark(slot, 0, timeline_now());
  bool first_split = true;
#endif
  const int wn = warp % NWN, wk = warp / NWN;
  const unsigned rank = C > 1 ? cluster_rank() : 0u;
  constexpr int V = 16 / int(sizeof(T)), KS = 4 * V;  // values a vector; K a warp's step covers
  const int64_t n0 = int64_t(blockIdx.x / C) * S::kFeat, row0 = int64_t(blockIdx.y) * kSmallRows;
  const int64_t steps = (K + KS - 1) / KS, per = (steps + C * NWK - 1) / (C * NWK);
  const int64_t kb = (int64_t(rank) * NWK + wk) * per * KS, ke = kb + per * KS < K ? kb + per * KS : K;

  // Rows past M and features past N read the last one: their sums are never stored.
  const T* xr[4];
  const T* wr[NT];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t r = row0 + g + 8 * i;
    xr[i] = x + (r < M ? r : M - 1) * K + V * q;
  }
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int64_t n = n0 + (wn * NT + j) * 8 + g;
    wr[j] = w + (n < N ? n : N - 1) * K + V * q;
  }

  // The epilogue's bias slice, copied in while the operands stream (read after the barrier:
  // from global memory there it cost an L2 round trip at the end of every CTA). cp.async moves
  // 4 bytes at least: a 16-bit bias is loaded and stored (the barrier publishes it too).
  __shared__ T bias_slice[S::kFeat];
  Epilogue<T> tail_epi = epi;
  if (epi.bias != nullptr) {
    if constexpr (sizeof(T) == 4) {
      if (t < S::kFeat) cp_async_bytes<4>(bias_slice + t, epi.bias + (n0 + t < N ? n0 + t : N - 1));
      cp_async_commit();
    } else {
      if (t < S::kFeat) bias_slice[t] = epi.bias[n0 + t < N ? n0 + t : N - 1];
    }
    tail_epi.bias = bias_slice - n0;  // indexed by the global feature n, n0 <= n < n0 + kFeat
  }

  float acc[2][NT][4] = {};

  // One round: kTf32Steps 16-wide steps from k0, every load issued before the first split.
  // Whole rounds load unpredicated; only a tail round (TAIL) checks k against ke (behind a
  // check per load nvcc branched around each one and recomputed its address: ~25 instructions
  // per LDG).
  auto round = [&](int64_t k0, auto tail) {
    constexpr bool TAIL = decltype(tail)::value;
    float4 xv[kTf32Steps][4], wv[kTf32Steps][NT];
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int s = 0; s < kTf32Steps; ++s) {
      const int64_t k = k0 + 16 * s;
      const bool ok = !TAIL || k + 4 * q < ke;  // K % 4 == 0: a vector is wholly inside or outside
#pragma unroll
      for (int i = 0; i < 4; ++i) xv[s][i] = ok ? __ldg(reinterpret_cast<const float4*>(xr[i] + k)) : zero;
#pragma unroll
      for (int j = 0; j < NT; ++j) wv[s][j] = ok ? __ldg(reinterpret_cast<const float4*>(wr[j] + k)) : zero;
    }
#pragma unroll
    for (int s = 0; s < kTf32Steps; ++s)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        unsigned ab[2][4], as[2][4];  // A fragments of both m16 tiles: rows g, g + 8 (+16 mt)
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          const float4 lo = xv[s][2 * mt], hi = xv[s][2 * mt + 1];
          const float v[4] = {h ? lo.z : lo.x, h ? hi.z : hi.x, h ? lo.w : lo.y, h ? hi.w : hi.y};
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const Tf32Split p = split_tf32_fast(v[e]);
            ab[mt][e] = p.big;
            as[mt][e] = p.small;
          }
        }
        unsigned bb[NT][2], bs[NT][2];
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const Tf32Split b0 = split_tf32_fast(h ? wv[s][j].z : wv[s][j].x);
          const Tf32Split b1 = split_tf32_fast(h ? wv[s][j].w : wv[s][j].y);
          bb[j][0] = b0.big, bb[j][1] = b1.big, bs[j][0] = b0.small, bs[j][1] = b1.small;
        }
#ifdef RAWOPS_TIMELINE
        if (first_split) timeline_mark(slot, 1, timeline_after(ab[0][0] ^ bb[0][0]));
        first_split = false;
#endif
        // 3xTF32 as three passes over the 2 x NT accumulators (small terms first): the mma
        // asm is volatile, so mma_m16n8k8_tf32x3's three back-to-back mma on one accumulator
        // would wait out the tensor pipe's latency twice per call (C2 T6 K8: 9.1 -> 8.0 us).
#pragma unroll
        for (int term = 0; term < 3; ++term)
#pragma unroll
          for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
              mma_m16n8k8_tf32(acc[mt][j], term == 0 ? as[mt] : ab[mt],
                               term == 1 ? bs[j][0] : bb[j][0], term == 1 ? bs[j][1] : bb[j][1]);
      }
  };
  // The 16-bit types: one m16n8k16 per (m16 tile, n8 tile, slice); words 2h, 2h + 1 of a
  // lane's vector are its k pairs (2t, 2t + 1) and (2t + 8, 2t + 9) of slice h.
  auto round16 = [&](int64_t k0, auto tail) {
    constexpr bool TAIL = decltype(tail)::value;
    uint4 xv[kTf32Steps][4], wv[kTf32Steps][NT];
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int s = 0; s < kTf32Steps; ++s) {
      const int64_t k = k0 + KS * s;
      const bool ok = !TAIL || k + V * q < ke;  // K % V == 0: a vector is wholly inside or outside
#pragma unroll
      for (int i = 0; i < 4; ++i) xv[s][i] = ok ? __ldg(reinterpret_cast<const uint4*>(xr[i] + k)) : zero;
#pragma unroll
      for (int j = 0; j < NT; ++j) wv[s][j] = ok ? __ldg(reinterpret_cast<const uint4*>(wr[j] + k)) : zero;
    }
#pragma unroll
    for (int s = 0; s < kTf32Steps; ++s)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        unsigned a[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          const uint4 lo = xv[s][2 * mt], hi = xv[s][2 * mt + 1];  // rows g, g + 8 of the tile
          a[mt][0] = h ? lo.z : lo.x;
          a[mt][1] = h ? hi.z : hi.x;
          a[mt][2] = h ? lo.w : lo.y;
          a[mt][3] = h ? hi.w : hi.y;
        }
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int mt = 0; mt < 2; ++mt)
            if constexpr (sizeof(T) == 2)  // (the float32 instantiation never calls round16)
              mma_m16n8k16<T>(acc[mt][j], a[mt], h ? wv[s][j].z : wv[s][j].x, h ? wv[s][j].w : wv[s][j].y);
      }
  };
  int64_t k0 = kb;
  if constexpr (sizeof(T) == 4) {
    for (; k0 + KS * kTf32Steps <= ke; k0 += KS * kTf32Steps) round(k0, BoolConstant<false>());
    if (k0 < ke) round(k0, BoolConstant<true>());
  } else {
    for (; k0 + KS * kTf32Steps <= ke; k0 += KS * kTf32Steps) round16(k0, BoolConstant<false>());
    if (k0 < ke) round16(k0, BoolConstant<true>());
  }

  // Accumulator e of tile (mt, j): row mt * 16 + g + 8 (e / 2), feature (wn NT + j) 8 + 2t + e % 2.
  float* const mine = red + wk * S::kSlab;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr)
        *reinterpret_cast<float2*>(mine + (mt * 16 + g + 8 * hr) * S::kStride + S::col(g, (wn * NT + j) * 8) + 2 * q) =
            make_float2(acc[mt][j][2 * hr], acc[mt][j][2 * hr + 1]);
#ifdef RAWOPS_TIMELINE
  timeline_mark(slot, 2, timeline_now());
#endif
  cp_async_wait<0>();  // this thread's bias copy landed; the barrier publishes it
  if (C > 1)
    cluster_barrier();  // every CTA's partials written and visible cluster-wide
  else
    __syncthreads();
#ifdef RAWOPS_TIMELINE
  timeline_mark(slot, 3, timeline_now());
#endif

  // Without a cluster: 2 adjacent features a thread (384 threads of 512 summing: 6.7 -> 6.35 us
  // against 4 features a thread, H100, bench/results/explore_linear_reduce.md), the warps'
  // partials in order, every load before the adds; scalar stores (float2 stores measured 6.5).
  // With a cluster, CTA `rank` finishes rows [rank * 32 / C, (rank + 1) * 32 / C): 4 adjacent
  // features a thread, summed over the cluster's CTAs, then warps, in order.
  constexpr int kRows = kSmallRows / C, kQuads = S::kFeat / 4, kPairs = S::kFeat / 2;
  if constexpr (C == 1) {
    for (int o = t; o < kSmallRows * kPairs; o += S::kThreads) {
      const int row = o / kPairs, f = (o % kPairs) * 2;
      const int64_t m = row0 + row;
      if (m >= M) continue;
      const float* const first = red + row * S::kStride + S::col(row, f);
      float2 p[NWK];
#pragma unroll
      for (int u = 0; u < NWK; ++u) p[u] = *reinterpret_cast<const float2*>(first + u * S::kSlab);
      float s0 = 0.f, s1 = 0.f;
#pragma unroll
      for (int u = 0; u < NWK; ++u) s0 += p[u].x, s1 += p[u].y;
      const int64_t n = n0 + f;
      if (n < N) y[m * N + n] = from_float<T>(tail_epi(s0, m, n));
      if (n + 1 < N) y[m * N + n + 1] = from_float<T>(tail_epi(s1, m, n + 1));
    }
  } else {
    for (int o = t; o < kRows * kQuads; o += S::kThreads) {
      const int row = int(rank) * kRows + o / kQuads, f = (o % kQuads) * 4;
      const int64_t m = row0 + row;
      if (m >= M) continue;
      const float* const first = red + row * S::kStride + S::col(row, f);
      float4 p[C * NWK];
#pragma unroll
      for (int r = 0; r < C; ++r) {
        const unsigned remote = peer_address(first, r);
#pragma unroll
        for (int u = 0; u < NWK; ++u) p[r * NWK + u] = load_peer_float4(remote + u * S::kSlab * 4);
      }
      float sum[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int i = 0; i < C * NWK; ++i) {
        sum[0] += p[i].x;
        sum[1] += p[i].y;
        sum[2] += p[i].z;
        sum[3] += p[i].w;
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t n = n0 + f + e;
        if (n < N) y[m * N + n] = from_float<T>(tail_epi(sum[e], m, n));
      }
    }
  }
  if (C > 1) cluster_barrier();  // no CTA leaves (freeing its shared memory) while a peer reads it
#ifdef RAWOPS_TIMELINE
  timeline_mark(slot, 4, timeline_now());
#endif
#else
  __trap();  // the Python side launches it on sm_90 and later only
#endif
}

// ============================================================================ split-K reduction
// c[m][n] = epilogue(sum over z in order of partial[z][m][n]): deterministic, one thread
// per output (grid-stride), reads splits x 4 B and writes one element per output.
template <typename T>
__device__ __forceinline__ void gemm_reduce(const float* __restrict__ partial, T* __restrict__ c,
                                            const Epilogue<T> epi, int64_t M, int64_t N, int64_t splits) {
  const int64_t total = M * N;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    // 8 slabs' loads issued before their adds (in order: the same sum as one at a time); one
    // load at a time waited out L2's latency per split (33 splits: ~10 us at 32 x 768).
    float sum = 0.f;
    int64_t z = 0;
    for (; z + 8 <= splits; z += 8) {
      float p[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) p[u] = partial[(z + u) * total + i];
#pragma unroll
      for (int u = 0; u < 8; ++u) sum += p[u];
    }
    for (; z < splits; ++z) sum += partial[z * total + i];
    c[i] = from_float<T>(epi(sum, i / N, i % N));
  }
}

}  // namespace
}  // namespace rawops

// ---------------------------------------------------------------------------- entry points
// Every entry: (a, b, c, bias, aux, pre, m, n, k, flags); grids in rawops/matmul.py.
#define RAWOPS_GEMM_ARGS(T)                                                                              \
  const T *a, const T *b, T *c, const T *bias, const T *aux, T *pre, long long m, long long n, long long k, \
      long long flags
#define RAWOPS_EPI(T) rawops::Epilogue<T>{bias, aux, pre, n, int(flags)}

#define RAWOPS_SIMT(layout, A_KM, B_KM, T, suffix)                                                      \
  extern "C" __global__ void __launch_bounds__(256, 2) gemm_simt_##layout##_##suffix(RAWOPS_GEMM_ARGS(T)) { \
    rawops::gemm_simt<T, A_KM, B_KM>(a, b, c, RAWOPS_EPI(T), m, n, k);                                  \
  }
#define RAWOPS_SIMT_VEC(layout, A_KM, B_KM)                                                           \
  extern "C" __global__ void __launch_bounds__(256, 2) gemm_simt_vec_##layout##_f32(RAWOPS_GEMM_ARGS(float)) { \
    rawops::gemm_simt_vec<A_KM, B_KM, false>(a, b, c, RAWOPS_EPI(float), m, n, k);                      \
  }
// gemm_small_m_nn: 128 threads, static shared memory (rawops/matmul.py: SMALL_M_*).
extern "C" __global__ void __launch_bounds__(rawops::kSmallMThreads) gemm_small_m_nn_f32(RAWOPS_GEMM_ARGS(float)) {
  rawops::gemm_small_m_nn(a, b, c, RAWOPS_EPI(float), m, n, k);
}
#define RAWOPS_MMA(layout, A_KM, B_KM, T, suffix)                                                       \
  extern "C" __global__ void __launch_bounds__(256, 2) gemm_mma_##layout##_##suffix(RAWOPS_GEMM_ARGS(T)) { \
    rawops::gemm_mma<T, A_KM, B_KM, 128>(a, b, c, RAWOPS_EPI(T), m, n, k);                              \
  }
// linear_small: 384 threads, 96 KB of dynamic shared memory (rawops/matmul.py: SMALL_*).
#define RAWOPS_SMALL(T, suffix)                                                                          \
  extern "C" __global__ void __launch_bounds__(rawops::kSmallThreads, 1)                                \
      linear_small_nt_##suffix(RAWOPS_GEMM_ARGS(T)) {                                                   \
    rawops::linear_small<T>(a, b, c, RAWOPS_EPI(T), m, n, k);                                           \
  }

// linear_small_tf32: clusters of C CTAs along x (compiled in: a plain launch honours them),
// MIN_BLOCKS CTAs per SM (the register cap), dynamic shared memory for the partial tiles (rawops/matmul.py:
// SMALL_TF32_*). Below sm_90 the body traps and carries no cluster shape.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define RAWOPS_CLUSTER_DIMS(C)
#else
#define RAWOPS_CLUSTER_DIMS(C) __cluster_dims__(C, 1, 1)
#endif
#define RAWOPS_SMALL_TC(name, T, C, NWN, NT, NWK, MIN_BLOCKS)                                        \
  extern "C" __global__ void __launch_bounds__(NWN * NWK * 32, MIN_BLOCKS) RAWOPS_CLUSTER_DIMS(C)      \
      name(RAWOPS_GEMM_ARGS(T)) {                                                                       \
    rawops::linear_small_tc<T, C, NWN, NT, NWK>(a, b, c, RAWOPS_EPI(T), m, n, k);                       \
  }
#define RAWOPS_SMALL_TF32(name, C, NWN, NT, NWK, MIN_BLOCKS) RAWOPS_SMALL_TC(name, float, C, NWN, NT, NWK, MIN_BLOCKS)

// gemm_reduce: a = the float32 partials, k = the number of splits; b unused.
#define RAWOPS_REDUCE(T, suffix)                                                                         \
  extern "C" __global__ void __launch_bounds__(256) gemm_reduce_##suffix(RAWOPS_GEMM_ARGS(T)) {         \
    rawops::gemm_reduce<T>(reinterpret_cast<const float*>(a), c, RAWOPS_EPI(T), m, n, k);              \
  }

#define RAWOPS_MATMUL_FAMILY(T, suffix) \
  RAWOPS_SIMT(nn, true, false, T, suffix) \
  RAWOPS_SIMT(nt, true, true, T, suffix)  \
  RAWOPS_SIMT(tn, false, false, T, suffix) \
  RAWOPS_SMALL(T, suffix)                  \
  RAWOPS_REDUCE(T, suffix)
#define RAWOPS_MATMUL_MMA_FAMILY(T, suffix) \
  RAWOPS_MMA(nn, true, false, T, suffix)    \
  RAWOPS_MMA(nt, true, true, T, suffix)     \
  RAWOPS_MMA(tn, false, false, T, suffix)

RAWOPS_MATMUL_FAMILY(float, f32)
RAWOPS_SIMT_VEC(nn, true, false)
RAWOPS_SIMT_VEC(nt, true, true)
RAWOPS_SIMT_VEC(tn, false, false)
// Shipped shape C1 NWN1 NT3 NWK16 MIN_BLOCKS1; bench/explore_timeline.py builds others with
// -DRAWOPS_SMALL_TF32_SHAPE -DRAWOPS_SMALL_TF32_C=.. (_NWN, _NT, _NWK, _MIN_BLOCKS).
#ifdef RAWOPS_SMALL_TF32_SHAPE
RAWOPS_SMALL_TF32(linear_small_tf32_nt_f32, RAWOPS_SMALL_TF32_C, RAWOPS_SMALL_TF32_NWN, RAWOPS_SMALL_TF32_NT,
                  RAWOPS_SMALL_TF32_NWK, RAWOPS_SMALL_TF32_MIN_BLOCKS)
#else
RAWOPS_SMALL_TF32(linear_small_tf32_nt_f32, 1, 1, 3, 16, 1)
#endif
RAWOPS_MATMUL_FAMILY(__half, f16)
RAWOPS_MATMUL_FAMILY(__nv_bfloat16, bf16)
RAWOPS_MATMUL_MMA_FAMILY(__half, f16)
RAWOPS_MATMUL_MMA_FAMILY(__nv_bfloat16, bf16)
// The 16-bit small batch on the tensor pipe: 16 features a CTA (2 n8 tiles), 8 warps splitting K
// (3 steps of 32 each at K = 768: one whole round), 2 CTAs an SM (128 registers; rawops/matmul.py:
// SMALL_MMA_*). H100, CUDA graphs of 20 (bench/results/explore_small_mma.md): bf16 32x768->3072
// 4.36 us a call (24 features, 1 CTA an SM: 4.37; cuBLASLt's epilogue 3.88, F.linear + gelu 5.26),
// 8x4096->4096 8.84 (14.37; cuBLASLt 9.38), 128x768->3072 10.95 (13.73; cuBLASLt 4.98: W is read
// once per 32 rows). bench/explore_small_mma.py builds other shapes with -DRAWOPS_SMALL_MMA_NT=..
// -DRAWOPS_SMALL_MMA_NWK=.. -DRAWOPS_SMALL_MMA_MINB=..
#ifndef RAWOPS_SMALL_MMA_NT
#define RAWOPS_SMALL_MMA_NT 2
#define RAWOPS_SMALL_MMA_NWK 8
#endif
#ifndef RAWOPS_SMALL_MMA_MINB
#define RAWOPS_SMALL_MMA_MINB 2
#endif
RAWOPS_SMALL_TC(linear_small_mma_nt_f16, __half, 1, 1, RAWOPS_SMALL_MMA_NT, RAWOPS_SMALL_MMA_NWK, RAWOPS_SMALL_MMA_MINB)
RAWOPS_SMALL_TC(linear_small_mma_nt_bf16, __nv_bfloat16, 1, 1, RAWOPS_SMALL_MMA_NT, RAWOPS_SMALL_MMA_NWK,
                RAWOPS_SMALL_MMA_MINB)
