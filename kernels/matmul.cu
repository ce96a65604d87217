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
//   gemm_reduce_*   split-K: adds the float32 partials of the splits in order, then the epilogue.
//   gemm_mma_*      float16 / bfloat16 on sm_80+: mma.sync m16n8k16 tensor cores, 128x128x32
//                   block tiles, 8 warps of 64x32, 3-stage cp.async pipeline (60 KB of dynamic
//                   shared memory), ldmatrix (.trans for M/N-major operands). Needs each
//                   operand's contiguous dim % 8 == 0 and 16-byte aligned pointers (the Python
//                   side checks; else gemm_simt). Older archs compile an empty body that traps.
//                   Both GEMMs split K over gridDim.z (float32 partials + gemm_reduce) when
//                   the output has too few tiles for the GPU (rawops/matmul.py: plan).
// Measured on the H100 (bench/NOTES.md): bf16 8192^3 265 TFLOP/s (0.34x cuBLAS), f32 35.7
// (0.69x), linear_gelu f32 32x768->3072 19.5 us of device time (3.3 us floor).
//   linear_small_*  nt with M <= 32 rows per blockIdx.y (x @ W^T, small batch): weight
//                   bandwidth-bound (W read once from DRAM: 9.4 MB at 32x768->3072 f32), so
//                   the grid splits N over the whole GPU: a warp owns 4 output features and
//                   all 32 rows, lanes stride K with 16-byte loads of W and x (x stays in L1),
//                   one reduce-scatter butterfly at the end (124 shuffles for 128 sums).
#include "rawops/dtype.cuh"
#include "rawops/gemm_epilogue.cuh"

namespace rawops {
namespace {

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
  int64_t kb = 0, ke = K;
  float* partial = nullptr;
  if (gridDim.z > 1) {
    const int64_t kc = ((K + gridDim.z - 1) / gridDim.z + kSimtK - 1) / kSimtK * kSimtK;
    kb = int64_t(blockIdx.z) * kc;
    ke = kb + kc < K ? kb + kc : K;
    partial = reinterpret_cast<float*>(c) + int64_t(blockIdx.z) * M * N;
  }
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
    if (kt + 1 < tiles) load(kb + (kt + 1) * kSimtK);
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
    if (kt + 1 < tiles) store(s ^ 1);
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

template <typename T> struct MmaOp;
template <> struct MmaOp<__half> {
  __device__ static void run(float* d, const unsigned* a, const unsigned* b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
  }
};
template <> struct MmaOp<__nv_bfloat16> {
  __device__ static void run(float* d, const unsigned* a, const unsigned* b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
  }
};

__device__ __forceinline__ unsigned smem_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)), "l"(src),
               "r"(valid ? 16 : 0));
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N> __device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

template <bool TRANS> __device__ __forceinline__ void ldmatrix_x4(unsigned* r, const void* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if (TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_address(p)));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_address(p)));
#endif
}

// One operand tile (ROWS rows of M or N, 32 of K) of stage memory from global, 16 B per cp.async.
// KM: element (r, k) at g[r * K + k], stored [r][k]; else at g[k * R + r], stored [k][r].
// Columns k0 .. k0 + 31 of K, those at or past kend zero-filled.
template <typename T, bool KM, int ROWS>
__device__ __forceinline__ void load_tile(T* s, const T* __restrict__ g, int64_t r0, int64_t k0, int64_t R,
                                          int64_t K, int64_t kend, int t) {
  constexpr int stride = TileShape<KM, ROWS>::stride;
#pragma unroll
  for (int i = 0; i < ROWS / 64; ++i) {
    const int c = t + i * kMmaThreads;  // ROWS * 4 chunks of 8 elements
    if (KM) {
      const int r = c / 4, k = (c % 4) * 8;
      const bool valid = r0 + r < R && k0 + k < kend;
      cp_async16(s + r * stride + k, valid ? g + (r0 + r) * K + k0 + k : g, valid);
    } else {
      const int k = c / (ROWS / 8), r = (c % (ROWS / 8)) * 8;
      const bool valid = k0 + k < kend && r0 + r < R;
      cp_async16(s + k * stride + r, valid ? g + (k0 + k) * R + r0 + r : g, valid);
    }
  }
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
        for (int ni = 0; ni < NI; ++ni) MmaOp<T>::run(acc[mi][ni], af[mi], bf[ni]);
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
constexpr int kSmallThreads = 64;  // 2 warps
constexpr int kSmallFeatures = 4;  // output features per warp
constexpr int kSmallRows = 32;     // rows per blockIdx.y

template <typename T> __device__ __forceinline__ void unpack(const uint4& raw, float* f) {
  const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int i = 0; i < 16 / int(sizeof(T)); ++i) f[i] = to_float(v[i]);
}

// One step of a warp reduce-scatter: each lane keeps half of its HALF * 2 sums (the upper
// half when its MASK bit is set) and adds its partner's copy of that half. After the steps
// 16, 8, 4, 2, 1 of 128 sums, lane l holds the totals of sums 4l .. 4l + 3.
template <int MASK, int HALF> __device__ __forceinline__ void reduce_scatter(float* acc, int lane) {
  const bool upper = lane & MASK;
#pragma unroll
  for (int i = 0; i < HALF; ++i) {
    const float send = upper ? acc[i] : acc[i + HALF];
    const float keep = upper ? acc[i + HALF] : acc[i];
    acc[i] = keep + __shfl_xor_sync(0xffffffffu, send, MASK);
  }
}

// K % (16 / sizeof(T)) == 0 and x, w 16-byte aligned (the Python side checks).
template <typename T>
__device__ __forceinline__ void linear_small(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                                             const Epilogue<T> epi, int64_t M, int64_t N, int64_t K) {
  constexpr int V = 16 / sizeof(T);
  const int lane = threadIdx.x % 32;
  const int64_t n0 = (int64_t(blockIdx.x) * (kSmallThreads / 32) + threadIdx.x / 32) * kSmallFeatures;
  const int64_t row0 = int64_t(blockIdx.y) * kSmallRows;
  const int rows = int(M - row0 < kSmallRows ? M - row0 : kSmallRows);
  const T* xb = x + row0 * K;
  float acc[kSmallFeatures * kSmallRows];
#pragma unroll
  for (int i = 0; i < kSmallFeatures * kSmallRows; ++i) acc[i] = 0.f;

  const uint4 zero = make_uint4(0, 0, 0, 0);
  uint4 wnext[kSmallFeatures];
  int64_t k = int64_t(lane) * V;
#pragma unroll
  for (int f = 0; f < kSmallFeatures; ++f)
    wnext[f] = (k < K && n0 + f < N) ? __ldg(reinterpret_cast<const uint4*>(w + (n0 + f) * K + k)) : zero;
  for (; k < K; k += 32 * V) {
    float wv[kSmallFeatures][V];
#pragma unroll
    for (int f = 0; f < kSmallFeatures; ++f) unpack<T>(wnext[f], wv[f]);
    const int64_t kn = k + 32 * V;  // the next step's weights in flight during this step's FMAs
#pragma unroll
    for (int f = 0; f < kSmallFeatures; ++f)
      wnext[f] = (kn < K && n0 + f < N) ? __ldg(reinterpret_cast<const uint4*>(w + (n0 + f) * K + kn)) : zero;
    // Rows past M re-read the last row instead of branching: a branch per row serialised
    // the 32 loads (one L2 round trip each: 57 us at 32x768->3072 f32, measured), while
    // branch-free they are all in flight together. Their sums are never stored.
#pragma unroll
    for (int m = 0; m < kSmallRows; ++m) {
      float xv[V];
      unpack<T>(__ldg(reinterpret_cast<const uint4*>(xb + (m < rows ? m : rows - 1) * K + k)), xv);
#pragma unroll
      for (int f = 0; f < kSmallFeatures; ++f)
#pragma unroll
        for (int v = 0; v < V; ++v) acc[f * kSmallRows + m] = fmaf(wv[f][v], xv[v], acc[f * kSmallRows + m]);
    }
  }
  reduce_scatter<16, kSmallFeatures * kSmallRows / 2>(acc, lane);
  reduce_scatter<8, kSmallFeatures * kSmallRows / 4>(acc, lane);
  reduce_scatter<4, kSmallFeatures * kSmallRows / 8>(acc, lane);
  reduce_scatter<2, kSmallFeatures * kSmallRows / 16>(acc, lane);
  reduce_scatter<1, kSmallFeatures * kSmallRows / 32>(acc, lane);
#pragma unroll
  for (int v = 0; v < 4; ++v) {
    const int i = lane * 4 + v;
    const int f = i / kSmallRows, m = i % kSmallRows;
    const int64_t n = n0 + f, gm = row0 + m;
    if (m < rows && n < N) y[gm * N + n] = from_float<T>(epi(acc[v], gm, n));
  }
}

// ============================================================================ split-K reduction
// c[m][n] = epilogue(sum over z in order of partial[z][m][n]): deterministic, one thread
// per output (grid-stride), reads splits x 4 B and writes one element per output.
template <typename T>
__device__ __forceinline__ void gemm_reduce(const float* __restrict__ partial, T* __restrict__ c,
                                            const Epilogue<T> epi, int64_t M, int64_t N, int64_t splits) {
  const int64_t total = M * N;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    float sum = 0.f;
    for (int64_t z = 0; z < splits; ++z) sum += partial[z * total + i];
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
#define RAWOPS_MMA(layout, A_KM, B_KM, T, suffix)                                                       \
  extern "C" __global__ void __launch_bounds__(256, 2) gemm_mma_##layout##_##suffix(RAWOPS_GEMM_ARGS(T)) { \
    rawops::gemm_mma<T, A_KM, B_KM, 128>(a, b, c, RAWOPS_EPI(T), m, n, k);                              \
  }
#define RAWOPS_SMALL(T, suffix)                                                                          \
  extern "C" __global__ void __launch_bounds__(64) linear_small_nt_##suffix(RAWOPS_GEMM_ARGS(T)) {      \
    rawops::linear_small<T>(a, b, c, RAWOPS_EPI(T), m, n, k);                                           \
  }

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
RAWOPS_MATMUL_FAMILY(__half, f16)
RAWOPS_MATMUL_FAMILY(__nv_bfloat16, bf16)
RAWOPS_MATMUL_MMA_FAMILY(__half, f16)
RAWOPS_MATMUL_MMA_FAMILY(__nv_bfloat16, bf16)
