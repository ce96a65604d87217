// rawops-arch: 90a
// Matrix family, Hopper path: C = epilogue(A B) for float16 / bfloat16, and float32 as TF32
// (matmul's tf32=True), on sm_90a, with the tensor-core main loop of CuTe (CUTLASS's
// headers): WGMMA fed by the TMA copy engine.
//
// Same contract as kernels/matmul.cu (layouts nn / nt / tn on row-major storage, the
// epilogue of rawops/gemm_epilogue.cuh, float32 accumulation), for operands the copy engine
// can read: 16-byte aligned, 16-byte rows (rawops/_gemm_sm90.py checks). WGMMA reads TF32
// operands K-major only, so float32 has the nt layout alone (x @ W^T); rawops/_gemm_tf32.py
// transposes b (or a) into scratch for nn (tn) first. Tile edges are in bytes: a stage holds
// 128 bytes of K (64 16-bit or 32 float32 elements), an output box 128 bytes of columns.
//
// One persistent block per SM, 384 threads in three warpgroups:
//   producer   one thread issues the TMA loads of a 128 x 64 A tile and a 256 x 64 B tile
//              per stage into a 4-stage ring (48 KB a stage), each stage completing on its
//              "full" mbarrier; the warpgroup gives its registers to the consumers.
//   consumers  two warpgroups, 64 rows of the 128 x 256 output tile each: per stage four
//              m64n256k16 WGMMAs straight from shared memory, one stage kept in flight
//              while the previous one is released to the producer ("empty" mbarrier); then
//              the epilogue from the 128 float32 accumulators each thread holds (modes 0, 1
//              and 3 of rawops/gemm_epilogue.cuh: none, bias + GELU (+ pre-activation), bias),
//              stored through shared memory by TMA stores that drain during the next tile.
// Tiles are walked in groups of 8 tile-rows (A rows stay in L2 while B streams), the
// producer running ahead into the next tile while the consumers store the last.
// The tensor maps (TMA descriptors) are built on the host (cuTensorMapEncodeTiled) and
// passed by value; shared-memory tiles use the 128-byte swizzle that both TMA and WGMMA read.
#include <cuda.h>

#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/tensor.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/bfloat16.h>
#include <cutlass/half.h>

#include "rawops/gemm_epilogue.cuh"

namespace rawops {
namespace sm90 {

using namespace cute;

constexpr int kBM = 128, kBN = 256, kStages = 4;
constexpr int kSpanBytes = 128;     // the 128-byte swizzle span: a stage's K, an output box's columns
template <typename E> constexpr int kBKOf = kSpanBytes / int(sizeof(E));  // K elements a stage
constexpr int kThreads = 384;       // producer warpgroup + two consumer warpgroups
constexpr int kGroupRows = 8;       // tile-rows per group of the tile order
constexpr int kBox = 64;            // an M/N-major operand's TMA box edge (16-bit only): 64 x 2 bytes = the span
constexpr int kConsumers = 256;     // the two consumer warpgroups
constexpr int kEpilogueBarrier = 1; // named barrier of the consumers (0 is __syncthreads)

template <typename T> struct CuteType;
template <> struct CuteType<__half> { using type = cutlass::half_t; };
template <> struct CuteType<__nv_bfloat16> { using type = cutlass::bfloat16_t; };
template <> struct CuteType<float> { using type = cutlass::tfloat32_t; };  // WGMMA reads float32 as TF32

// Shared-memory layout of one operand, (rows, k, stage). K-major tiles stack 8-row swizzle
// atoms along the rows (one TMA box of rows x 64 fills a stage); MN-major tiles put the
// atoms' K first (Step<_2,_1>), so that each 64-wide column slab is one 64 x 64 TMA box.
template <typename E, bool K_MAJOR, int ROWS>
using SmemLayout = decltype(tile_to_shape(
    conditional_t<K_MAJOR, GMMA::Layout_K_SW128_Atom<E>, GMMA::Layout_MN_SW128_Atom<E>>{},
    make_shape(Int<ROWS>{}, Int<kBKOf<E>>{}, Int<kStages>{}),
    conditional_t<K_MAJOR, Step<_1, _2, _3>, Step<_2, _1, _3>>{}));

template <typename T, bool A_KM, bool B_KM> struct Config {
  using E = typename CuteType<T>::type;
  static_assert(sizeof(E) == 2 || (A_KM && B_KM), "WGMMA reads TF32 operands K-major only");
  static constexpr int kBK = kBKOf<E>;
  static constexpr GMMA::Major kMajorA = A_KM ? GMMA::Major::K : GMMA::Major::MN;
  static constexpr GMMA::Major kMajorB = B_KM ? GMMA::Major::K : GMMA::Major::MN;
  using LayoutA = SmemLayout<E, A_KM, kBM>;
  using LayoutB = SmemLayout<E, B_KM, kBN>;
  // Two warpgroups side by side along M, each one m64n256k16 atom wide.
  using Mma = decltype(make_tiled_mma(
      GMMA::ss_op_selector<E, E, float, Shape<Int<kBM>, Int<kBN>, Int<kBK>>, kMajorA, kMajorB>(),
      Layout<Shape<_2, _1, _1>>{}));
  static constexpr int kStageBytes = (kBM + kBN) * kBK * int(sizeof(E));  // 48 KB for every type
};

template <typename E> struct alignas(1024) Shared {
  E a[kStages][kBM * kBKOf<E>];  // 1024-byte aligned stages: the swizzle is taken from address bits
  E b[kStages][kBN * kBKOf<E>];
  char out[2][kBM * kSpanBytes]; // the epilogue's two staging buffers (128 rows x 128 bytes) for the TMA stores
  float bias[kBN];          // the tile's bias
  uint64_t full[kStages];
  uint64_t empty[kStages];
};

// Tile index -> (tile-row, tile-column), tile-rows grouped by kGroupRows.
__device__ __forceinline__ void tile_coords(int tile, int tiles_m, int tiles_n, int& tm, int& tn) {
  const int per_group = kGroupRows * tiles_n;
  const int group = tile / per_group, first = group * kGroupRows;
  const int rows = min(tiles_m - first, kGroupRows);
  const int in_group = tile - group * per_group;
  tm = first + in_group % rows;
  tn = in_group / rows;
}

// One stage of an operand: K-major, one box (k, rows); MN-major, rows / 64 boxes (mn, k).
template <bool K_MAJOR, int ROWS, typename E>
__device__ __forceinline__ void load_operand(const CUtensorMap* map, uint64_t* full, E* smem, int row0, int k0) {
  if (K_MAJOR) {
    SM90_TMA_LOAD_2D::copy(map, full, 0, smem, k0, row0);
  } else {
#pragma unroll
    for (int j = 0; j < ROWS / kBox; ++j)
      SM90_TMA_LOAD_2D::copy(map, full, 0, smem + j * kBox * kBKOf<E>, row0 + j * kBox, k0);
  }
}

__device__ __forceinline__ void consumers_sync() {
  cutlass::arch::NamedBarrier::sync(kConsumers, kEpilogueBarrier);
}

// Stores the tile's values (acc, float32) through the copy engine: per 128-byte column slab (64
// 16-bit or 32 float32 columns), the consumers write it to a staging buffer in the 128-byte
// swizzle (each thread a pair of columns: 4- or 8-byte stores), then one thread issues the TMA
// store of the 128-row box, which clips at the
// matrix's edges; the two buffers alternate, so the stores drain while the next quarter is
// written and while the next tile's main loop runs. `issued` counts the stores so far.
// Accumulator i of a thread is row (t / 4) % 8 + 16 (t / 32) + 64 warpgroup + 8 ((i / 2) % 2),
// column 2 (t % 4) + i % 2 + 8 (i / 4): CuTe's 64 x N GMMA C layout, ((4,8,4),(2,2,N/8)).
template <typename T, typename E, class Acc>
__device__ __forceinline__ void store_through_tma(const Acc& acc, Shared<E>& smem, const CUtensorMap* map, int thread,
                                                  int row0, int col0, int& issued) {
  using Pair = conditional_t<sizeof(T) == 2, uint32_t, uint2>;
  constexpr int kCols = kSpanBytes / int(sizeof(T));  // columns a box
  const int row = 64 * (thread / 128) + 16 * (thread % 128 / 32) + thread % 32 / 4;
  const int pair_bytes = int(sizeof(Pair)) * (thread % 4);  // within an 8-column group
#pragma unroll
  for (int q = 0; q < kBN / kCols; ++q) {
    const int buffer = issued & 1;
    if (thread == 0) tma_store_wait<1>();  // the store that last read this buffer is done with it
    consumers_sync();
    char* base = reinterpret_cast<char*>(smem.out[buffer]);
#pragma unroll
    for (int jj = 0; jj < kCols / 8; ++jj) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int i = 4 * (q * kCols / 8 + jj) + 2 * h;
        const int r = row + 8 * h;
        const int byte = jj * 8 * int(sizeof(T)) + pair_bytes;  // in the unswizzled 128-byte row
        __align__(8) T pair[2] = {from_float<T>(acc(i)), from_float<T>(acc(i + 1))};
        *reinterpret_cast<Pair*>(base + r * kSpanBytes + (((byte >> 4) ^ (r & 7)) << 4) + (byte & 15)) =
            *reinterpret_cast<const Pair*>(pair);
      }
    }
    cutlass::arch::fence_view_async_shared();  // make the writes visible to the copy engine
    consumers_sync();
    if (thread == 0) {
      SM90_TMA_STORE_2D::copy(map, smem.out[buffer], col0 + q * kCols, row0);
      tma_store_arrive();
    }
    ++issued;
  }
}

// Modes 0 (none), 1 (bias + GELU, + pre-activation) and 3 (bias) of rawops/gemm_epilogue.cuh.
// The GELU-gradient mode (2) is not compiled here: rawops/_gemm_sm90.py never plans it.
template <typename T, typename E, class Acc>
__device__ __forceinline__ void store_tile(Acc& acc, Shared<E>& smem, const CUtensorMap* map_c,
                                           const CUtensorMap* map_pre, int flags, bool has_bias, bool has_pre,
                                           int thread, int row0, int col0, int& issued) {
  const int mode = flags & 3;
  if (mode != kEpiNone && has_bias) {
    const int col = 2 * (thread % 4);
#pragma unroll
    for (int i = 0; i < size(acc); ++i) acc(i) += smem.bias[col + i % 2 + 8 * (i / 4)];
  }
  if (mode == kEpiBiasGelu) {
    if (has_pre) store_through_tma<T>(acc, smem, map_pre, thread, row0, col0, issued);
    if (flags & kEpiErf) {
#pragma unroll
      for (int i = 0; i < size(acc); ++i) acc(i) = gelu<T>(acc(i), true);
    } else {
#pragma unroll
      for (int i = 0; i < size(acc); ++i) acc(i) = gelu<T>(acc(i), false);
    }
  }
  store_through_tma<T>(acc, smem, map_c, thread, row0, col0, issued);
}

template <typename T, bool A_KM, bool B_KM>
__device__ __forceinline__ void gemm(const CUtensorMap* map_a, const CUtensorMap* map_b, const CUtensorMap* map_c,
                                     const CUtensorMap* map_pre, const T* __restrict__ bias, int flags, bool has_pre,
                                     int64_t M, int64_t N, int64_t K) {
  using C = Config<T, A_KM, B_KM>;
  using E = typename C::E;
  extern __shared__ char shared_raw[];
  Shared<E>& smem = *reinterpret_cast<Shared<E>*>(
      (reinterpret_cast<uintptr_t>(shared_raw) + 1023) / 1024 * 1024);

  const int warpgroup = threadIdx.x / 128;
  const int tiles_m = int((M + kBM - 1) / kBM), tiles_n = int((N + kBN - 1) / kBN);
  const int tiles = tiles_m * tiles_n;
  constexpr int kBK = C::kBK;
  const int k_tiles = int((K + kBK - 1) / kBK);

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      cutlass::arch::ClusterTransactionBarrier::init(&smem.full[s], 1);
      cutlass::arch::ClusterBarrier::init(&smem.empty[s], 8);  // one arrival per consumer warp
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (warpgroup == 0) {  // ------------------------------------------------ producer
    cutlass::arch::warpgroup_reg_dealloc<40>();
    if (threadIdx.x == 0) {
      prefetch_tma_descriptor(map_a);
      prefetch_tma_descriptor(map_b);
      int stage = 0;
      uint32_t phase = 1;  // a fresh "empty" barrier counts as released
      for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        int tm, tn;
        tile_coords(tile, tiles_m, tiles_n, tm, tn);
        for (int kt = 0; kt < k_tiles; ++kt) {
          cutlass::arch::ClusterBarrier::wait(&smem.empty[stage], phase);
          cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&smem.full[stage], C::kStageBytes);
          load_operand<A_KM, kBM>(map_a, &smem.full[stage], smem.a[stage], tm * kBM, kt * kBK);
          load_operand<B_KM, kBN>(map_b, &smem.full[stage], smem.b[stage], tn * kBN, kt * kBK);
          if (++stage == kStages) stage = 0, phase ^= 1;
        }
      }
    }
    return;
  }
  // ------------------------------------------------------------------------ consumers
  cutlass::arch::warpgroup_reg_alloc<232>();
  const int thread = threadIdx.x - 128;
  typename C::Mma mma;
  auto thr = mma.get_slice(thread);
  Tensor sA = make_tensor(make_smem_ptr(&smem.a[0][0]), typename C::LayoutA{});
  Tensor sB = make_tensor(make_smem_ptr(&smem.b[0][0]), typename C::LayoutB{});
  Tensor fA = thr.make_fragment_A(thr.partition_A(sA));  // (MMA, 1, K blocks, stage) descriptors
  Tensor fB = thr.make_fragment_B(thr.partition_B(sB));
  Tensor acc = partition_fragment_C(mma, Shape<Int<kBM>, Int<kBN>>{});
  const bool lane0 = threadIdx.x % 32 == 0;
  const bool has_bias = (flags & 3) != kEpiNone && bias != nullptr;
  int issued = 0;  // TMA stores issued by this block (thread 0 waits on them)

  int stage = 0;
  uint32_t phase = 0;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    int tm, tn;
    tile_coords(tile, tiles_m, tiles_n, tm, tn);
    // The tile's bias, loaded now and parked in shared memory after the main loop.
    const float bias_value = has_bias ? to_float(bias[min(int64_t(tn) * kBN + thread, N - 1)]) : 0.f;
    mma.accumulate_ = GMMA::ScaleOut::Zero;
    int release = -1;  // the stage whose WGMMAs may still be reading it
    for (int kt = 0; kt < k_tiles; ++kt) {
      cutlass::arch::ClusterTransactionBarrier::wait(&smem.full[stage], phase);
      warpgroup_fence_operand(acc);
      warpgroup_arrive();
#pragma unroll
      for (int kb = 0; kb < size<2>(fA); ++kb) {
        cute::gemm(mma, fA(_, _, kb, stage), fB(_, _, kb, stage), acc);
        mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_wait<1>();  // the previous stage's WGMMAs are done: hand it back
      warpgroup_fence_operand(acc);
      if (release >= 0 && lane0) cutlass::arch::ClusterBarrier::arrive(&smem.empty[release]);
      release = stage;
      if (++stage == kStages) stage = 0, phase ^= 1;
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc);
    if (release >= 0 && lane0) cutlass::arch::ClusterBarrier::arrive(&smem.empty[release]);

    if (has_bias) {  // every consumer is past the last tile's reads of smem.bias (its barriers)
      smem.bias[thread] = bias_value;
      consumers_sync();
    }
    store_tile<T>(acc, smem, map_c, map_pre, flags, has_bias, has_pre, thread, tm * kBM, tn * kBN, issued);
  }
  if (thread == 0) tma_store_wait<0>();  // shared memory must outlive the stores reading it
}

}  // namespace sm90
}  // namespace rawops

// ---------------------------------------------------------------------------- entry points
// (map_a, map_b, map_c, map_pre, bias, m, n, k, flags): tensor maps of the operands, of c and
// of the pre-activation (map_c again when none is stored: flags & 8 says one is), built by
// rawops/_gemm_sm90.py; bias and flags as in kernels/matmul.cu.
#define RAWOPS_SM90(layout, A_KM, B_KM, T, suffix)                                                          \
  extern "C" __global__ void __launch_bounds__(rawops::sm90::kThreads, 1) gemm_sm90_##layout##_##suffix(   \
      const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,                 \
      const __grid_constant__ CUtensorMap map_c, const __grid_constant__ CUtensorMap map_pre, const T* bias, \
      long long m, long long n, long long k, long long flags) {                                             \
    rawops::sm90::gemm<T, A_KM, B_KM>(&map_a, &map_b, &map_c, &map_pre, bias, int(flags & 7), (flags & 8) != 0, \
                                      m, n, k);                                                             \
  }
#define RAWOPS_SM90_FAMILY(T, suffix)      \
  RAWOPS_SM90(nn, true, false, T, suffix)  \
  RAWOPS_SM90(nt, true, true, T, suffix)   \
  RAWOPS_SM90(tn, false, false, T, suffix)

RAWOPS_SM90_FAMILY(__half, f16)
RAWOPS_SM90_FAMILY(__nv_bfloat16, bf16)
RAWOPS_SM90(nt, true, true, float, tf32)  // float32 as TF32: K-major operands only
