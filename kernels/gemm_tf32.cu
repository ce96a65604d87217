// TF32 tensor-core GEMM for float32 operands: C = A B with the matrix family's epilogue, for
// rawops.matmul(a, b, tf32=True) and the torch adapter's matmul(tf32=True) (forward and backward).
//
//   C[m][n] = epilogue(sum_k tf32(A(m, k)) tf32(B(k, n))),  float32 accumulation.
// tf32(x) rounds x to 10 mantissa bits (cvt.rna.tf32.f32, nearest, ties away): each product
// carries ~2^-11 relative error, the sum ~1e-4..1e-3 relative to its norm (torch's
// allow_tf32 precision). Layouts and epilogue exactly as kernels/gemm.cu (nn a (M, K) b (K, N);
// nt a (M, K) b (N, K); tn a (K, M) b (K, N); flags & 3: none / bias+GELU / bias+GELU' / bias).
//
// gemm_tf32_<layout>_f32, sm_80+: mma.sync.m16n8k8.row.col.f32.tf32.tf32.f32, 128 x 128 block
// tiles, 8 warps of 64 x 32, BK = 16 floats (64 bytes per operand row, as gemm_mma's 32 halves),
// 4-stage cp.async pipeline (80 KB of dynamic shared memory at most: fits sm_86/89/120's 99 KB,
// 2 blocks per SM on sm_80/90). gemm_tf32_wide_<layout>_f32: the same with 128 x 256 tiles, warps
// of 64 x 64 (120 KB, one block per SM; sm_80/90/100 only), for outputs that fill the GPU.
// Split K over gridDim.z as the other GEMMs (float32 partials,
// kernels/gemm.cu's gemm_reduce_f32 applies the epilogue). Needs every operand's contiguous dim % 4 == 0,
// N % 4 == 0 when b is N-major, 16-byte aligned pointers (rawops/_gemm_tf32.py checks; else
// the exact FFMA kernels). Older archs compile a body that traps; the planner never picks it.
//
// Fragments (PTX m16n8k8 .tf32: lane = 4 g + t; a0 (g, t) a1 (g + 8, t) a2 (g, t + 4) a3 (g + 8,
// t + 4); b0 (k t, n g) b1 (k t + 4, n g)):
//   K-major operand, stored [rows][16 + 4 k]: ldmatrix.x4 (b16). An 8 x 8 b16 matrix is 8 rows x
//     4 floats and lane i receives row i / 4, float i % 4: exactly (g, t). Rows 80 bytes apart:
//     conflict-free.
//   M/N-major operand, stored [16 k][128 + 8]: ldmatrix.trans moves 16-bit elements only, so
//     plain LDS.128. The warp's rows (columns) are permuted so that one float4 at [k][4 g] holds
//     a lane's values for four fragments: A, logical row g / g + 8 of mi = 2P / 2P + 1 is
//     physical row 32 P + 4 g + {0, 1, 2, 3}; B, logical column g of ni is physical 4 g + ni.
//     The epilogue maps back (a lane then owns 8 adjacent columns: float4 stores). Row stride
//     136 floats = 8 mod 32 banks: each 8-lane phase of an LDS.128 hits 32 distinct banks.
// Per 8 k and warp (64 x 32): 16 mma, 24 cvt (2 instructions each in SASS), 2-4 ldmatrix.x4 or
// 2-4 LDS.128 per operand.
#include "rawops/dtype.cuh"
#include "rawops/cp_async.cuh"
#include "rawops/gemm_epilogue.cuh"
#include "rawops/mma_sync.cuh"

namespace rawops {
namespace {

constexpr int kTf32Threads = RAWOPS_GEMM_TF32_THREADS;
constexpr int kTf32Tile = RAWOPS_GEMM_TF32_TILE;  // BM = BN
constexpr int kTf32K = RAWOPS_GEMM_TF32_K;        // floats of K per stage
constexpr int kTf32Stages = RAWOPS_GEMM_TF32_STAGES;
constexpr int kTf32WideN = RAWOPS_GEMM_TF32_WIDE_N;  // gemm_tf32_wide: 128 x 256 tiles, 120 KB (sm_80/90/100 only)
constexpr int kTf32WideStages = RAWOPS_GEMM_TF32_WIDE_STAGES;
constexpr int kTf32Group = 8;  // block tiles walk 8 tile-rows at a time (L2 reuse of B's panels)
constexpr int kTf32KMajorStride = kTf32K + RAWOPS_GEMM_TF32_KMAJOR_PAD;  // [rows][16 + 4]
// [16 k][rows + 8] when the operand is M- or N-contiguous (rows + 8 = 8 mod 32 banks).
constexpr int kTf32MnMajorPad = RAWOPS_GEMM_TF32_MNMAJOR_PAD;

template <bool KM, int ROWS> struct Tf32Tile {
  static constexpr int stride = KM ? kTf32KMajorStride : ROWS + kTf32MnMajorPad;
  static constexpr int elems = KM ? ROWS * kTf32KMajorStride : kTf32K * (ROWS + kTf32MnMajorPad);
};

// One operand tile (128 rows of M or N, 16 of K) from global, 16 bytes per cp.async, 2 per thread
// (kTf32K / 8 for other K tiles).
// KM: element (r, k) at g[r * K + k], stored [r][k]; else at g[k * R + r], stored [k][r].
// Chunks at or past kend (or past R) are zero-filled: with K % 4 == 0 and R % 4 == 0 (M/N-major)
// a chunk is wholly inside or outside.
template <bool KM, int ROWS>
__device__ __forceinline__ void tf32_load_tile(float* s, const float* __restrict__ g, int64_t r0, int64_t k0,
                                               int64_t R, int64_t K, int64_t kend, int t) {
  stage_tile<float, KM, ROWS, kTf32K, Tf32Tile<KM, ROWS>::stride, kTf32Threads>(s, g, r0, k0, R, K, kend, t);
}

// BN = 128: warps of 64 x 32, 2 blocks per SM. BN = 256 (gemm_tf32_wide): warps of 64 x 64, half
// the shared-memory and L2 bytes per MAC of BN = 128 (32 FLOP per L2 byte, L2-bound), one block
// per SM.
// Split K (gridDim.z > 1): block z sums k in [z kc, (z + 1) kc) into partial[z][M][N] (raw sums).
template <bool A_KM, bool B_KM, int BN, int STAGES>
__device__ __forceinline__ void gemm_tf32(const float* __restrict__ a, const float* __restrict__ b,
                                          float* __restrict__ c, const Epilogue<float> epi, int64_t M, int64_t N,
                                          int64_t K) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int kA = Tf32Tile<A_KM, kTf32Tile>::elems, kB = Tf32Tile<B_KM, BN>::elems;
  constexpr int kAStride = Tf32Tile<A_KM, kTf32Tile>::stride, kBStride = Tf32Tile<B_KM, BN>::stride;
  constexpr int WN = BN / 4, NI = WN / 8;
  float* const smem = reinterpret_cast<float*>(smem_raw);
  const int t = threadIdx.x, lane = t % 32, warp = t / 32;
  const int wm = warp / 4, wn = warp % 4;  // warp tile: rows wm*64 + [0, 64), cols wn*WN + [0, WN)
  const int g = lane / 4, q = lane % 4;    // fragment group and thread-in-group
  // Tile (ty, tx) of the block: column-major within groups of kTf32Group tile-rows, so that the
  // blocks resident together share B's column panels and a few of A's row panels in L2.
  // (gridDim.x * gridDim.y < 2^31: the planner checks.)
  int ty = blockIdx.y, tx = blockIdx.x;
  if (kTf32Group > 1) {
    const int id = blockIdx.y * gridDim.x + blockIdx.x, per_group = kTf32Group * gridDim.x;
    const int first = id / per_group * kTf32Group, rows = min(int(gridDim.y) - first, kTf32Group);
    ty = first + (id % per_group) % rows;
    tx = (id % per_group) / rows;
  }
  const int64_t m0 = int64_t(ty) * kTf32Tile, n0 = int64_t(tx) * BN;
  int64_t kb, ke;
  float* partial;
  split_k_range<kTf32K>(M, N, K, c, kb, ke, partial);
  const int tiles = ke > kb ? int((ke - kb + kTf32K - 1) / kTf32K) : 0;

  float acc[4][NI][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int v = 0; v < 4; ++v) acc[i][j][v] = 0.f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < tiles) {
      tf32_load_tile<A_KM, kTf32Tile>(smem + s * (kA + kB), a, m0, kb + int64_t(s) * kTf32K, M, K, ke, t);
      tf32_load_tile<B_KM, BN>(smem + s * (kA + kB) + kA, b, n0, kb + int64_t(s) * kTf32K, N, K, ke, t);
    }
    cp_async_commit();
  }
  const int j = lane / 8, r = lane % 8;
  for (int kt = 0; kt < tiles; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // tile kt visible to all; stage (kt - 1) % S free for the next load
    const int next = kt + STAGES - 1;
    if (next < tiles) {
      float* st = smem + (next % STAGES) * (kA + kB);
      tf32_load_tile<A_KM, kTf32Tile>(st, a, m0, kb + int64_t(next) * kTf32K, M, K, ke, t);
      tf32_load_tile<B_KM, BN>(st + kA, b, n0, kb + int64_t(next) * kTf32K, N, K, ke, t);
    }
    cp_async_commit();
    const float* As = smem + (kt % STAGES) * (kA + kB);
    const float* Bs = As + kA;
#pragma unroll
    for (int kk = 0; kk < kTf32K; kk += 8) {
      unsigned af[4][4], bf[NI][2];
      if (A_KM) {
#pragma unroll
        for (int mi = 0; mi < 4; ++mi)
          ldmatrix_x4<false>(af[mi], As + (wm * 64 + mi * 16 + lane % 16) * kAStride + kk + (lane / 16) * 4);
      } else {
#pragma unroll
        for (int p = 0; p < 2; ++p) {
          const int col = wm * 64 + p * 32 + 4 * g;
          const float4 lo = *reinterpret_cast<const float4*>(As + (kk + q) * kAStride + col);
          const float4 hi = *reinterpret_cast<const float4*>(As + (kk + q + 4) * kAStride + col);
          af[2 * p][0] = __float_as_uint(lo.x);
          af[2 * p][1] = __float_as_uint(lo.y);
          af[2 * p][2] = __float_as_uint(hi.x);
          af[2 * p][3] = __float_as_uint(hi.y);
          af[2 * p + 1][0] = __float_as_uint(lo.z);
          af[2 * p + 1][1] = __float_as_uint(lo.w);
          af[2 * p + 1][2] = __float_as_uint(hi.z);
          af[2 * p + 1][3] = __float_as_uint(hi.w);
        }
      }
      if (B_KM) {
#pragma unroll
        for (int p = 0; p < NI / 2; ++p) {
          unsigned x[4];
          ldmatrix_x4<false>(x, Bs + (wn * WN + p * 16 + r + (j / 2) * 8) * kBStride + kk + (j % 2) * 4);
          bf[2 * p][0] = x[0];
          bf[2 * p][1] = x[1];
          bf[2 * p + 1][0] = x[2];
          bf[2 * p + 1][1] = x[3];
        }
      } else {
        // 32 columns per pair of float4: physical column 32 (ni / 4) + 4 g + ni % 4.
#pragma unroll
        for (int h = 0; h < NI / 4; ++h) {
          const int col = wn * WN + 32 * h + 4 * g;
          const float4 lo = *reinterpret_cast<const float4*>(Bs + (kk + q) * kBStride + col);
          const float4 hi = *reinterpret_cast<const float4*>(Bs + (kk + q + 4) * kBStride + col);
          const float l[4] = {lo.x, lo.y, lo.z, lo.w}, u[4] = {hi.x, hi.y, hi.z, hi.w};
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            bf[4 * h + i][0] = __float_as_uint(l[i]);
            bf[4 * h + i][1] = __float_as_uint(u[i]);
          }
        }
      }
#pragma unroll
      for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int v = 0; v < 4; ++v) af[mi][v] = to_tf32(af[mi][v]);
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) {
        bf[ni][0] = to_tf32(bf[ni][0]);
        bf[ni][1] = to_tf32(bf[ni][1]);
      }
#pragma unroll
      for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) mma_m16n8k8_tf32(acc[mi][ni], af[mi], bf[ni][0], bf[ni][1]);
    }
  }
  cp_async_wait<0>();

  // acc[mi][ni][2 half + e]: logical row g + 8 half of mi, logical column 2 q + e of ni.
#pragma unroll
  for (int mi = 0; mi < 4; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = A_KM ? wm * 64 + mi * 16 + g + 8 * half : wm * 64 + (mi / 2) * 32 + 4 * g + (mi % 2) * 2 + half;
      const int64_t m = m0 + row;
      if (m >= M) continue;
      if (!B_KM) {
        // Logical column 2 q + e of ni is physical 32 (ni / 4) + 4 (2 q + e) + ni % 4: this lane's
        // values of the row are columns 32 h + 8 q .. + 7, float4 pairs (N % 4 == 0: each wholly
        // in or out).
#pragma unroll
        for (int he = 0; he < NI / 2; ++he) {
          const int h = he / 2, e = he % 2;
          const int64_t n = n0 + wn * WN + 32 * h + 8 * q + 4 * e;
          if (n >= N) continue;
          float v[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) v[i] = acc[mi][4 * h + i][2 * half + e];
          if (partial == nullptr) {
#pragma unroll
            for (int i = 0; i < 4; ++i) v[i] = epi(v[i], m, n + i);
          }
          float* const out = partial != nullptr ? partial : c;
          *reinterpret_cast<float4*>(out + m * N + n) = make_float4(v[0], v[1], v[2], v[3]);
        }
      } else {
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) {
          const int64_t n = n0 + wn * WN + ni * 8 + 2 * q;
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            if (n + e >= N) continue;
            const float v = acc[mi][ni][2 * half + e];
            if (partial != nullptr)
              partial[m * N + n + e] = v;
            else
              c[m * N + n + e] = epi(v, m, n + e);
          }
        }
      }
    }
#else
  __trap();  // the Python side never launches it below sm_80
#endif
}

}  // namespace
}  // namespace rawops

// ---------------------------------------------------------------------------- entry points
// The wide kernels are planned only on sm_80, sm_90 and sm_100 (rawops/_gemm_tf32.py
// WIDE_CCS: a block needs 120 KB of shared memory); elsewhere their entries trap, which
// spares nvcc half of this family's code for the other targets.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ != 800 && __CUDA_ARCH__ != 900 && __CUDA_ARCH__ != 1000
#define RAWOPS_TF32_WIDE(A_KM, B_KM) __trap()
#else
#define RAWOPS_TF32_WIDE(A_KM, B_KM)                                                                   \
  rawops::gemm_tf32<A_KM, B_KM, rawops::kTf32WideN, rawops::kTf32WideStages>(a, b, c, RAWOPS_EPI(float), m, n, \
                                                                             k)
#endif
// Every entry: RAWOPS_GEMM_ARGS (rawops/gemm_epilogue.cuh), as kernels/gemm.cu; grids in
// rawops/_gemm_tf32.py.
#define RAWOPS_TF32(layout, A_KM, B_KM)                                                                      \
  extern "C" __global__ void __launch_bounds__(rawops::kTf32Threads, 2)                                    \
      gemm_tf32_##layout##_f32(RAWOPS_GEMM_ARGS(float)) {                                                   \
    rawops::gemm_tf32<A_KM, B_KM, rawops::kTf32Tile, rawops::kTf32Stages>(a, b, c, RAWOPS_EPI(float), m, n,  \
                                                                          k);                               \
  }                                                                                                         \
  extern "C" __global__ void __launch_bounds__(rawops::kTf32Threads, 1)                                    \
      gemm_tf32_wide_##layout##_f32(RAWOPS_GEMM_ARGS(float)) {                                              \
    RAWOPS_TF32_WIDE(A_KM, B_KM);                                                                           \
  }

RAWOPS_TF32(nn, true, false)
RAWOPS_TF32(nt, true, true)
RAWOPS_TF32(tn, false, false)

// in (rows x cols, row-major) -> out (cols x rows), each value rounded to TF32 (to_tf32: nearest,
// ties away, as the mma.sync kernels round): the Hopper TF32 GEMM (kernels/gemm_sm90.cu) reads
// its operands K-major only, so nn's b (K x N) and tn's a and b go through this first
// (rawops/_gemm_tf32.py). 64 x 64 tiles through shared memory, 65-float rows so that the column
// reads are conflict-free; 256 threads (64 x 4), 16 values each; grid (ceil(cols / 64),
// ceil(rows / 64)). Moves 2 x rows x cols x 4 bytes.
constexpr int kTransposeTile = RAWOPS_GEMM_TF32_TRANSPOSE_TILE;
constexpr int kTransposeThreads = RAWOPS_GEMM_TF32_TRANSPOSE_THREADS;
static_assert(kTransposeThreads == 4 * kTransposeTile, "4 rows of the tile a step: i += 4 below");
extern "C" __global__ void __launch_bounds__(kTransposeThreads)
    transpose_tf32_f32(const float* in, float* out, long long rows, long long cols) {
  __shared__ float tile[kTransposeTile][kTransposeTile + 1];
  const int tx = threadIdx.x % kTransposeTile, ty = threadIdx.x / kTransposeTile;
  const long long r0 = (long long)blockIdx.y * kTransposeTile, c0 = (long long)blockIdx.x * kTransposeTile;
#pragma unroll
  for (int i = ty; i < kTransposeTile; i += 4)
    if (r0 + i < rows && c0 + tx < cols) tile[i][tx] = in[(r0 + i) * cols + c0 + tx];
  __syncthreads();
#pragma unroll
  for (int i = ty; i < kTransposeTile; i += 4)
    if (c0 + i < cols && r0 + tx < rows)
      out[(c0 + i) * rows + r0 + tx] = __uint_as_float(rawops::to_tf32(__float_as_uint(tile[tx][i])));
}

// The 3xTF32 operands of the Hopper float32 GEMM (gemm_sm90_nt_3xtf32_*, kernels/gemm_sm90.cu;
// rawops/_gemm_tf32.py): each value v = big + small by split_tf32 (both TF32, so the tensor core
// reads them exactly), written K-major into out (rows x 2 kp): big in columns [0, k), small in
// [kp, kp + k), zeros in the padding (kp: k rounded up to the GEMM's 32-column stage). A value
// that is not finite is its own big part with small 0, and marks its row in row_flags and `any`
// (both zeroed first by fill_zero_u32): split3_fixup_f32 then recomputes the outputs it reaches
// exactly, as torch's (a split's products would give NaN where torch gives inf). Each moves
// rows x k x 4 bytes in and 2 x rows x kp x 4 out.
__device__ __forceinline__ void store_split(float* out, long long row, long long col, long long kp, float v,
                                            int* row_flags, int* any) {
  rawops::Tf32Split s{__float_as_uint(v), 0u};
  if (isfinite(v)) {
    s = rawops::split_tf32(v);
  } else {  // stores of 1 only: the races between threads are benign
    row_flags[row] = 1;
    *any = 1;
  }
  out[row * 2 * kp + col] = __uint_as_float(s.big);
  out[row * 2 * kp + kp + col] = __uint_as_float(s.small);
}

// in (rows x k, row-major): a K-major operand. Grid (ceil(kp / 256), min(rows, 65535)), 256
// threads, a thread a column, the rows strided by the grid.
extern "C" __global__ void __launch_bounds__(256)
    split_tf32_f32(const float* in, float* out, long long rows, long long k, long long kp, int* row_flags, int* any) {
  const long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= kp) return;
  for (long long r = blockIdx.y; r < rows; r += gridDim.y)
    store_split(out, r, c, kp, c < k ? in[r * k + c] : 0.f, row_flags, any);
}

// in (k x rows, row-major): an M/N-major operand, written transposed through the transpose
// kernel's 64 x 64 tiles. Grid (ceil(rows / 64), ceil(kp / 64)).
extern "C" __global__ void __launch_bounds__(kTransposeThreads)
    split_tf32_transposed_f32(const float* in, float* out, long long rows, long long k, long long kp,
                              int* row_flags, int* any) {
  __shared__ float tile[kTransposeTile][kTransposeTile + 1];
  const int tx = threadIdx.x % kTransposeTile, ty = threadIdx.x / kTransposeTile;
  const long long r0 = (long long)blockIdx.x * kTransposeTile, c0 = (long long)blockIdx.y * kTransposeTile;
#pragma unroll
  for (int i = ty; i < kTransposeTile; i += 4)
    tile[i][tx] = c0 + i < k && r0 + tx < rows ? in[(c0 + i) * rows + r0 + tx] : 0.f;
  __syncthreads();
#pragma unroll
  for (int i = ty; i < kTransposeTile; i += 4)
    if (r0 + i < rows && c0 + tx < kp) store_split(out, r0 + i, c0 + tx, kp, tile[tx][i], row_flags, any);
}

// p[0, count) = 0: the split flags, before the splits. Grid-stride, 256 threads.
extern "C" __global__ void __launch_bounds__(256) fill_zero_u32(unsigned* p, long long count) {
  const long long step = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += step) p[i] = 0u;
}

// After the 3xTF32 GEMM: where a split saw a value that is not finite (`any`), every output of a
// marked row of A (flags_a) or column of B (flags_b) is summed again in exact float32 from the
// operands as the caller laid them out (layout bit 0: a is K-major (m, k), else (k, m); bit 1: b is
// K-major (n, k), else (k, n)) and stored through the epilogue (bias, GELU, pre): inf and NaN as
// torch's. Without one, every block returns at once. Grid-stride over the m x n outputs, 256 threads.
extern "C" __global__ void __launch_bounds__(256)
    split3_fixup_f32(const float* a, const float* b, float* c, const float* bias, float* pre, long long m,
                     long long n, long long k, long long flags, long long layout, const int* flags_a,
                     const int* flags_b, const int* any) {
  if (*any == 0) return;
  const rawops::Epilogue<float> epi{bias, nullptr, pre, n, int(flags)};
  const bool a_kmajor = layout & 1, b_kmajor = layout & 2;
  for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < m * n;
       idx += (long long)gridDim.x * blockDim.x) {
    const long long i = idx / n, j = idx - i * n;
    if (!flags_a[i] && !flags_b[j]) continue;
    float acc = 0.f;
    for (long long kk = 0; kk < k; ++kk)
      acc = fmaf(a_kmajor ? a[i * k + kk] : a[kk * m + i], b_kmajor ? b[j * k + kk] : b[kk * n + j], acc);
    c[idx] = epi(acc, i, j);
  }
}
