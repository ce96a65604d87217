// Matrix family, small batches: the kernels for a few rows, where a 128 x 128 tile would compute
// mostly padding. Same contract as kernels/gemm.cu (layouts, epilogue, RAWOPS_GEMM_ARGS entries,
// split K summed by its gemm_reduce); rawops/gemm.py picks them:
//   gemm_small_m_nn_f32     nn with M <= 32 (linear_gelu's dx = dpre @ W), exact float32 FFMA;
//   linear_small_nt_*       nt (x @ W^T) with M <= 32 rows per blockIdx.y, sm_80+: x staged in
//                           shared memory, 24 output features per block, exact FFMA;
//   linear_small_tf32_nt_f32  the same for float32 linear_gelu on sm_90+ in 3xTF32 on the tensor
//                           pipe (float32-level error; rawops.config.linear_tf32 switches it off);
//   linear_small_mma_nt_<f16|bf16>  the half types' x @ W^T on sm_90+, one m16n8k16 a product.
#include "rawops/dtype.cuh"
#include "rawops/gemm_epilogue.cuh"
#include "rawops/cp_async.cuh"
#include "rawops/mma_sync.cuh"
#include "rawops/cluster.cuh"

namespace rawops {
namespace {

// A compile-time flag as a lambda argument (`auto tag`, decltype(tag)::value).
template <bool B> struct BoolConstant {
  static constexpr bool value = B;
};

// ============================================================================ small M, FFMA (nn)
// gemm_small_m_nn: C (M x N) = A (M x K, k contiguous) B (K x N, n contiguous) for M <= 32 in
// float32 FFMA, rows of a, b and c whole float4 (the Python side checks): linear_gelu's
// dx = dpre @ W at small batch, and matmul. gemm_simt_vec's 128 x 128 tiles spend 3/4 of their
// FMAs on padding rows there.
// A block: the (up to 32) rows x 64 columns over one K split, 128 threads of 4 rows x 4
// columns; BK = 16, double-buffered in shared memory, A stored transposed ([k][m]: a thread's
// 4 rows are one float4), B as it is. Split K as the other FFMA kernels (gemm_reduce).
constexpr int kSmallMRows = RAWOPS_GEMM_SMALL_M_ROWS, kSmallMCols = RAWOPS_GEMM_SMALL_M_COLS,
              kSmallMThreads = RAWOPS_GEMM_SMALL_M_THREADS, kSmallMK = 16;
static_assert(kSmallMRows == 32 && kSmallMCols == 64 && kSmallMThreads == 128, "a thread's 4 x 4 outputs below");
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

// ============================================================================ small batch (x @ W^T)
// linear_small: y = epilogue(x @ W^T) for up to 32 rows per blockIdx.y, sm_80+. Bound by
// reading W once (9.4 MB at 32x768->3072 f32) and by issue. A block of 384 threads owns 24
// features (N / 24 blocks: 128 at N = 3072, one per SM):
//   - x (32 rows x 768 of K) is staged once per block in shared memory by cp.async;
//   - thread (f, g) = (t % 24, t / 24) holds W[f][...] for the 16-byte vectors c * 16 + g
//     (c < 12 f32, < 6 f16/bf16) in registers, loaded before the x staging so that both
//     latencies overlap;
//   - each x vector read from shared memory (a warp reads 2 distinct vectors: a broadcast)
//     feeds 16 / sizeof(T) FMAs into one of the thread's 32 row sums;
//   - the 16 groups' partial sums meet in shared memory (reusing x's) and are added in a
//     fixed order (deterministic); a warp stores 24-feature row segments.
// K longer than one chunk (768) loops over chunks. Its limit: a 16-byte shared load costs its
// 16 bytes per lane even as a broadcast (128 B per SM cycle), and each x value a thread
// receives feeds 1 FMA per float, a quarter of what FFMA throughput needs (linear_small_tc
// below takes float32 linear_gelu on sm_90).
// Launch: grid (ceil(N / 24), ceil(M / 32)), kSmallThreads threads, kSmallRows x kSmallK
// elements of dynamic shared memory (rawops/gemm.py: small_shared_bytes).
constexpr int kSmallRows = RAWOPS_GEMM_SMALL_ROWS;          // rows per blockIdx.y
constexpr int kSmallFeatures = RAWOPS_GEMM_SMALL_FEATURES;  // output features per block
constexpr int kSmallGroups = RAWOPS_GEMM_SMALL_GROUPS;      // threads sharing one feature, along K
constexpr int kSmallK = RAWOPS_GEMM_SMALL_K;                // K per chunk: x chunk 96 KB f32, 48 KB f16/bf16
constexpr int kSmallThreads = kSmallFeatures * kSmallGroups;

// 16 bytes of T to floats from its 32-bit words (a bf16 is the high half of its float): one
// instruction per value. (Through a T* into the vector, nvcc splits each 16-byte shared load
// into eight 2-byte loads.)
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
// tensor pipe in 3xTF32 (kernels/include/rawops/mma_sync.cuh: float32-level error, as torch's
// float32) for linear_gelu only; matmul stays exact FFMA. The FFMA kernels are bound by shared
// memory and latency at these shapes; here no operand goes through shared memory and every SM
// streams its 1/128 of W (72 KB at 32x768->3072) once:
//   - a cluster of C CTAs (C = 1 ships: no cluster) owns kFeat = NWN * NT * 8 output
//     features; CTA r of it, warp (wn, wk), sums NT n8 tiles x both m16 tiles over K-part
//     r * NWK + wk (K split into C * NWK parts of whole 16-wide steps: 48 of K at K = 768);
//   - fragments come straight from global memory (L2): inside each 16-wide step lane (g, t)
//     loads x[row][k0 + 4t .. 4t + 3] for rows g + 8i and W[n][k0 + 4t .. 4t + 3] for n8 tile
//     rows g, one LDG.128 each (8 rows x 64 contiguous bytes a warp: whole sectors); the step
//     is two k8 mma slices with K permuted the same way for A and B (slice h: tf32 slot t <->
//     k0 + 4t + 2h, slot t + 4 <-> k0 + 4t + 2h + 1), so no shuffle is needed. A warp's loads
//     for kTf32Steps steps are all issued before the first split (latency is the enemy here);
//     the split is split_tf32_fast (3 instructions a value, where cvt.rna.tf32 is emulated in
//     4 on sm_90), as the source network's 3xTF32 kernel does;
//   - each warp's partial tile goes to shared memory; after a (cluster) barrier CTA r adds, in
//     a fixed order (deterministic), the C x NWK partials of its 32 / C rows (through
//     distributed shared memory when C > 1; 2 features a thread when C = 1) and applies the
//     epilogue.
// Shipped (rawops/_constants.py GEMM_SMALL_TF32_*): C1 NWN1 NT3 NWK16, 128 CTAs of 512 threads
// at N = 3072, 128 registers; the floor is the ~170 KB of operands each SM receives from L2.
// Launch: gridDim.x = C * ceil(N / kFeat) (clusters compiled in: __cluster_dims__),
// NWN * NWK warps, small_tf32_shared_bytes of dynamic shared memory (rawops/gemm.py).
template <int NWN, int NT, int NWK>
struct SmallTf32 {
  static constexpr int kFeat = NWN * NT * 8, kThreads = NWN * NWK * 32;
  // [wk][row][kStride]: float2 stores of lanes g = 0..3 (one half-warp phase) hit 32 banks. At
  // kFeat = 24 the sum's float2 reads (12 threads a row, then 4 of the next) would meet 2-way
  // conflicts, so odd rows hold their columns XOR 16 (kSwizzle): both patterns conflict-free
  // without more padding (a stride of 56 would do too, at 112 KB: over sm_120's 99).
  static constexpr int kStride = kFeat % 32 == 24 ? kFeat + 16 : kFeat + 8;
  static constexpr int kSwizzle = kFeat == 24 ? 16 : 0;
  static __device__ __forceinline__ int col(int row, int c) { return c ^ ((row & 1) * kSwizzle); }
  static constexpr int kSlab = kSmallRows * kStride;
};
constexpr int kTf32Steps = 3;  // K steps loaded per round (all in flight)

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
        // 3xTF32 as three passes over the 2 x NT accumulators (small terms first): the mma
        // asm is volatile, so mma_m16n8k8_tf32x3's three back-to-back mma on one accumulator
        // would wait out the tensor pipe's latency twice per call.
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
  cp_async_wait<0>();  // this thread's bias copy landed; the barrier publishes it
  if (C > 1)
    cluster_barrier();  // every CTA's partials written and visible cluster-wide
  else
    __syncthreads();

  // Without a cluster: 2 adjacent features a thread (384 threads of 512 summing: more threads in
  // the sum than at 4 features a thread), the warps' partials in order, every load before the
  // adds; scalar stores.
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
#else
  __trap();  // the Python side launches it on sm_90 and later only
#endif
}

}  // namespace
}  // namespace rawops

// ---------------------------------------------------------------------------- entry points
// Every entry: RAWOPS_GEMM_ARGS (rawops/gemm_epilogue.cuh); grids in rawops/gemm.py.
// gemm_small_m_nn: kSmallMThreads threads, static shared memory (rawops/gemm.py: SMALL_M_*).
extern "C" __global__ void __launch_bounds__(rawops::kSmallMThreads) gemm_small_m_nn_f32(RAWOPS_GEMM_ARGS(float)) {
  rawops::gemm_small_m_nn(a, b, c, RAWOPS_EPI(float), m, n, k);
}
// linear_small: kSmallThreads threads, one chunk of x in dynamic shared memory (rawops/gemm.py:
// SMALL_*).
#define RAWOPS_SMALL(T, suffix)                                                                          \
  extern "C" __global__ void __launch_bounds__(rawops::kSmallThreads, 1)                                \
      linear_small_nt_##suffix(RAWOPS_GEMM_ARGS(T)) {                                                   \
    rawops::linear_small<T>(a, b, c, RAWOPS_EPI(T), m, n, k);                                           \
  }
RAWOPS_SMALL(float, f32)
RAWOPS_SMALL(__half, f16)
RAWOPS_SMALL(__nv_bfloat16, bf16)

// linear_small_tc: clusters of C CTAs along x (compiled in: a plain launch honours them),
// MIN_BLOCKS CTAs per SM (the register cap), dynamic shared memory for the partial tiles
// (rawops/gemm.py: SMALL_TF32_*, SMALL_MMA_*). Below sm_90 the body traps and carries no
// cluster shape.
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
// float32 in 3xTF32: one CTA an SM.
RAWOPS_SMALL_TC(linear_small_tf32_nt_f32, float, RAWOPS_GEMM_SMALL_TF32_CLUSTER, 1, RAWOPS_GEMM_SMALL_TF32_TILES,
                RAWOPS_GEMM_SMALL_TF32_WARPS, 1)
// The 16-bit types: 16 features a CTA (2 n8 tiles), 8 warps splitting K (3 steps of 32 each at
// K = 768: one whole round), 2 CTAs an SM (128 registers): more CTAs in flight than 24 features
// at one CTA an SM.
RAWOPS_SMALL_TC(linear_small_mma_nt_f16, __half, 1, 1, RAWOPS_GEMM_SMALL_MMA_TILES, RAWOPS_GEMM_SMALL_MMA_WARPS, 2)
RAWOPS_SMALL_TC(linear_small_mma_nt_bf16, __nv_bfloat16, 1, 1, RAWOPS_GEMM_SMALL_MMA_TILES,
                RAWOPS_GEMM_SMALL_MMA_WARPS, 2)
