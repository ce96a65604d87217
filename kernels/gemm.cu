// Matrix family: C = A B with an optional fused epilogue, for matmul and linear_gelu: the general
// kernels (any shape; exact FFMA, or mma.sync tensor cores for the half types) and the split-K
// reduction every GEMM of the family shares. The small-batch kernels are in kernels/gemm_small.cu,
// TF32 in gemm_tf32.cu, the Hopper WGMMA kernel in gemm_sm90.cu; rawops/gemm.py picks among them.
//
//   C[m][n] = epilogue(sum_k A(m, k) B(k, n)),  float32 accumulation for every storage type.
// Three operand layouts, named like BLAS on row-major storage (every operand C-contiguous):
//   nn  a (M, K), b (K, N)      matmul; linear backward dx = dpre @ W
//   nt  a (M, K), b (N, K)      linear forward: x @ W^T with W in torch.nn.Linear layout
//   tn  a (K, M), b (K, N)      linear backward dW = dpre^T @ x, matmul backward db = a^T @ dy
// Epilogue (flags, kernels/include/rawops/gemm_epilogue.cuh): none; bias + GELU, the
// pre-activation also stored when `pre` is not null; bias + GELU gradient, out = aux[m][n] *
// gelu'(acc + bias) (dpre recomputed in the backward); bias only; exact-erf or tanh GELU. bias
// may be null (no bias).
//
// Kernels (one set per dtype, entry names <kernel>_<layout>_<dtype>, arguments RAWOPS_GEMM_ARGS):
//   gemm_simt_*     any shape and alignment, any arch: 128x128x8 block tiles, 256 threads,
//                   8x8 outputs per thread in registers, double-buffered shared memory; FFMA
//                   (exact float32 math; half types convert on load). 4 LDS.128 per 64 FFMA.
//   gemm_simt_vec_*_f32  float32 whose rows are all whole float4 (16-byte aligned, contiguous
//                   dims % 4 == 0): the same tiles with BK = 16 and float4 global loads.
//   gemm_mma_*      float16 / bfloat16 on sm_80+: mma.sync m16n8k16 tensor cores, 128x128x32
//                   block tiles, 8 warps of 64x32, 3-stage cp.async pipeline (60 KB of dynamic
//                   shared memory), ldmatrix (.trans for M/N-major operands). Needs each
//                   operand's contiguous dim % 8 == 0 and 16-byte aligned pointers (the Python
//                   side checks; else gemm_simt). Older archs compile an empty body that traps.
//   gemm_reduce_*   split-K: adds the float32 partials of the splits in order, then the epilogue.
// The GEMMs split K over gridDim.z (float32 partials + gemm_reduce) when the output has too few
// tiles for the GPU (rawops/gemm.py: plan).
#include "rawops/dtype.cuh"
#include "rawops/gemm_epilogue.cuh"
#include "rawops/cp_async.cuh"
#include "rawops/mma_sync.cuh"

namespace rawops {
namespace {

// ============================================================================ SIMT (FFMA)
constexpr int kSimtThreads = RAWOPS_GEMM_SIMT_THREADS;
constexpr int kSimtTile = RAWOPS_GEMM_SIMT_TILE;  // BM = BN
static_assert(kSimtThreads == 256 && kSimtTile == 128, "the thread grid below: 16 x 16 threads of 8 x 8 outputs");
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
// thread on gemm_simt's thread grid (rows (t / 16) * 4 + {0, 64}, columns (t % 16) * 4 +
// {0, 64}), but BK = 16 (one barrier per 1024 FFMA per thread instead of 512) and two float4
// global loads per operand per K tile (gemm_simt: 4 scalar loads per 8 k), issued before the
// FMAs and stored to the other buffer halfway through them.
//   K-major operand (a in nn/nt, b in nt): 128 rows x 16 k. Lanes 2r, 2r+1 read the 32
//   bytes of row r; the transposing scalar stores S[k][r] hit 32 distinct banks (row
//   stride 132 = 4 mod 32 words: k + 4 moves 16 banks, r moves 1).
//   M/N-major operand: 16 k x 128 columns, float4 copied as is (STS.128).
constexpr int kVecK = RAWOPS_GEMM_SIMT_VEC_K;

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
template <bool A_KM, bool B_KM>
__device__ __forceinline__ void gemm_simt_vec(const float* __restrict__ a, const float* __restrict__ b,
                                              float* __restrict__ c, const Epilogue<float> epi, int64_t M,
                                              int64_t N, int64_t K) {
  int64_t kb, ke;
  float* partial;
  split_k_range<kVecK>(M, N, K, c, kb, ke, partial);
  __shared__ __align__(16) float As[2][kVecK][kSimtStride];
  __shared__ __align__(16) float Bs[2][kVecK][kSimtStride];
  const int t = threadIdx.x;
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

  // Compute layout (gemm_simt's): thread t owns rows (t / 16)*4 + {0..3} + {0, R2} and columns
  // (t % 16)*4 + {0..3} + {0, C2}.
  constexpr int R2 = 64, C2 = 64;
  const int row = (t / 16) * 4;
  const int col = (t % 16) * 4;
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
  // the compiler sinks the loads below the FMAs, exposing their latency every tile.
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

// ============================================================================ tensor cores (sm_80+)
constexpr int kMmaThreads = RAWOPS_GEMM_MMA_THREADS;
constexpr int kMmaTile = RAWOPS_GEMM_MMA_TILE;
constexpr int kMmaK = RAWOPS_GEMM_MMA_K;
constexpr int kMmaStages = RAWOPS_GEMM_MMA_STAGES;
constexpr int kMmaPad = RAWOPS_GEMM_MMA_PAD;  // elements a staged row is padded by: ldmatrix conflict-free
constexpr int kKMajorStride = kMmaK + kMmaPad;  // [rows][32 k + 8]
// [32 k][rows + 8] when the operand is M- or N-contiguous.
template <bool KM, int ROWS> struct TileShape {
  static constexpr int stride = KM ? kKMajorStride : ROWS + kMmaPad;
  static constexpr int elems = KM ? ROWS * kKMajorStride : kMmaK * (ROWS + kMmaPad);
};

// One operand tile (ROWS rows of M or N, 32 of K) of stage memory (rawops/cp_async.cuh).
template <typename T, bool KM, int ROWS>
__device__ __forceinline__ void load_tile(T* s, const T* __restrict__ g, int64_t r0, int64_t k0, int64_t R,
                                          int64_t K, int64_t kend, int t) {
  stage_tile<T, KM, ROWS, kMmaK, TileShape<KM, ROWS>::stride, kMmaThreads>(s, g, r0, k0, R, K, kend, t);
}

// BN = kMmaTile ships: warps of 64x32 (6 ldmatrix.x4 per 16 mma), two blocks per SM. (BN = 256,
// warps of 64x64, needs 92 KB of stages and one block per SM: too little latency hiding with 3
// stages, docs/performance.md.)
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
  // registers differently (same instruction count), and the allocation below is the one timed.
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

// ============================================================================ split-K reduction
// c[m][n] = epilogue(sum over z in order of partial[z][m][n]): deterministic, one thread
// per output (grid-stride), reads splits x 4 B and writes one element per output. Every split
// GEMM of the family (gemm_small.cu, gemm_tf32.cu, gemm_sm90.cu too) ends with it.
constexpr int kReduceThreads = RAWOPS_GEMM_REDUCE_THREADS;

template <typename T>
__device__ __forceinline__ void gemm_reduce(const float* __restrict__ partial, T* __restrict__ c,
                                            const Epilogue<T> epi, int64_t M, int64_t N, int64_t splits) {
  const int64_t total = M * N;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    // 8 slabs' loads issued before their adds (in order: the same sum as one at a time); one
    // load at a time would wait out L2's latency once per split.
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
// Grids in rawops/gemm.py.
#define RAWOPS_SIMT(layout, A_KM, B_KM, T, suffix)                                                      \
  extern "C" __global__ void __launch_bounds__(rawops::kSimtThreads, 2)                                 \
      gemm_simt_##layout##_##suffix(RAWOPS_GEMM_ARGS(T)) {                                              \
    rawops::gemm_simt<T, A_KM, B_KM>(a, b, c, RAWOPS_EPI(T), m, n, k);                                  \
  }
#define RAWOPS_SIMT_VEC(layout, A_KM, B_KM)                                                           \
  extern "C" __global__ void __launch_bounds__(rawops::kSimtThreads, 2)                               \
      gemm_simt_vec_##layout##_f32(RAWOPS_GEMM_ARGS(float)) {                                         \
    rawops::gemm_simt_vec<A_KM, B_KM>(a, b, c, RAWOPS_EPI(float), m, n, k);                           \
  }
#define RAWOPS_MMA(layout, A_KM, B_KM, T, suffix)                                                       \
  extern "C" __global__ void __launch_bounds__(rawops::kMmaThreads, 2)                                  \
      gemm_mma_##layout##_##suffix(RAWOPS_GEMM_ARGS(T)) {                                               \
    rawops::gemm_mma<T, A_KM, B_KM, rawops::kMmaTile>(a, b, c, RAWOPS_EPI(T), m, n, k);                 \
  }
// gemm_reduce: a = the float32 partials, k = the number of splits; b unused.
#define RAWOPS_REDUCE(T, suffix)                                                                         \
  extern "C" __global__ void __launch_bounds__(rawops::kReduceThreads)                                  \
      gemm_reduce_##suffix(RAWOPS_GEMM_ARGS(T)) {                                                       \
    rawops::gemm_reduce<T>(reinterpret_cast<const float*>(a), c, RAWOPS_EPI(T), m, n, k);              \
  }

#define RAWOPS_MATMUL_FAMILY(T, suffix) \
  RAWOPS_SIMT(nn, true, false, T, suffix) \
  RAWOPS_SIMT(nt, true, true, T, suffix)  \
  RAWOPS_SIMT(tn, false, false, T, suffix) \
  RAWOPS_REDUCE(T, suffix)
#define RAWOPS_MATMUL_MMA_FAMILY(T, suffix) \
  RAWOPS_MMA(nn, true, false, T, suffix)    \
  RAWOPS_MMA(nt, true, true, T, suffix)     \
  RAWOPS_MMA(tn, false, false, T, suffix)

RAWOPS_MATMUL_FAMILY(float, f32)
RAWOPS_SIMT_VEC(nn, true, false)
RAWOPS_SIMT_VEC(nt, true, true)
RAWOPS_SIMT_VEC(tn, false, false)
RAWOPS_MATMUL_FAMILY(__half, f16)
RAWOPS_MATMUL_FAMILY(__nv_bfloat16, bf16)
RAWOPS_MATMUL_MMA_FAMILY(__half, f16)
RAWOPS_MATMUL_MMA_FAMILY(__nv_bfloat16, bf16)
