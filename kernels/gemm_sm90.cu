// rawops-arch: 90a
// Matrix family, Hopper path: C = epilogue(A B) for float16 / bfloat16, and float32 as TF32
// (matmul's tf32=True), on sm_90a, with the tensor-core main loop of CuTe (CUTLASS's
// headers): WGMMA fed by the TMA copy engine.
//
// Same contract as kernels/gemm.cu (layouts nn / nt / tn on row-major storage, the
// epilogue of rawops/gemm_epilogue.cuh, float32 accumulation), for operands the copy engine
// can read: 16-byte aligned, 16-byte rows (rawops/_gemm_sm90.py checks). WGMMA reads TF32
// operands K-major only, so float32 has the nt layout alone (x @ W^T); rawops/_gemm_tf32.py
// transposes b (or a) into scratch for nn (tn) first. Tile edges are in bytes: a stage holds
// 128 bytes of K (64 16-bit or 32 float32 elements), an output box 128 bytes of columns.
//
// One persistent block per SM, 384 threads in three warpgroups, output tiles of 128 x BN
// (BN = 256, 128 or 64: the entry's suffix _n128 / _n64 names the narrower ones):
//   producer   one thread issues the TMA loads of a 128 x 128-byte A tile and a BN x 128-byte
//              B tile per stage into a ring of kStagesOf<BN> stages (4 x 48 KB at BN = 256,
//              8 x 24 KB at 64), each stage completing on its "full" mbarrier; the warpgroup
//              gives its registers to the consumers.
//   consumers  two warpgroups, 64 rows of the output tile each: per stage m64nBNk16 WGMMAs
//              straight from shared memory, one stage kept in flight while the previous one
//              is released to the producer ("empty" mbarrier); then the epilogue from the
//              BN / 2 float32 accumulators each thread holds (modes 0, 1 and 3 of
//              rawops/gemm_epilogue.cuh: none, bias + GELU (+ pre-activation), bias), stored
//              through shared memory by TMA stores that drain during the next tile.
// Split K (splits > 1, narrow tiles only: outputs with too few tiles to fill the GPU): a work
// unit is one tile's share of K; its raw float32 sums go straight to partial[split][M][N] and
// kernels/gemm.cu's gemm_reduce adds the splits in order and applies the epilogue.
// Work units are walked in groups of 8 tile-rows (A rows stay in L2 while B streams), the
// producer running ahead into the next unit while the consumers store the last.
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

#ifndef RAWOPS_GEMM_SM90_PROMOTE
#define RAWOPS_GEMM_SM90_PROMOTE 0
#endif
#ifndef RAWOPS_GEMM_SM90_PROMOTE_STAGES
#define RAWOPS_GEMM_SM90_PROMOTE_STAGES 1
#endif

namespace rawops {
namespace sm90 {

using namespace cute;

constexpr int kBM = RAWOPS_GEMM_SM90_TILE_M;
// Stages of the ring for a BN-wide tile: as many as the 227 KB of shared memory hold.
template <int BN>
constexpr int kStagesOf = BN == 256   ? RAWOPS_GEMM_SM90_STAGES_N256
                          : BN == 128 ? RAWOPS_GEMM_SM90_STAGES_N128
                                      : RAWOPS_GEMM_SM90_STAGES_N64;
// The 128-byte swizzle span: a stage's K, an output box's columns.
constexpr int kSpanBytes = RAWOPS_GEMM_SM90_SPAN_BYTES;
template <typename E> constexpr int kBKOf = kSpanBytes / int(sizeof(E));  // K elements a stage
constexpr int kThreads = RAWOPS_GEMM_SM90_THREADS;  // producer warpgroup + two consumer warpgroups
constexpr int kGroupRows = 8;       // tile-rows per group of the tile order
// An M/N-major operand's TMA box edge (16-bit only): 64 x 2 bytes = the span.
constexpr int kBox = RAWOPS_GEMM_SM90_BOX;
constexpr int kFlagPre = RAWOPS_GEMM_EPI_PRE;  // flags: a pre-activation is stored (through map_pre)
static_assert(kThreads == 3 * 128 && kSpanBytes == 128 && kBox * 2 == kSpanBytes, "the warpgroups and swizzle below");
constexpr int kConsumers = 256;     // the two consumer warpgroups
constexpr int kEpilogueBarrier = 1; // named barrier of the consumers (0 is __syncthreads)

template <typename T> struct CuteType;
template <> struct CuteType<__half> { using type = cutlass::half_t; };
template <> struct CuteType<__nv_bfloat16> { using type = cutlass::bfloat16_t; };
template <> struct CuteType<float> { using type = cutlass::tfloat32_t; };  // WGMMA reads float32 as TF32

// Shared-memory layout of one operand, (rows, k, stage). K-major tiles stack 8-row swizzle
// atoms along the rows (one TMA box of rows x 64 fills a stage); MN-major tiles put the
// atoms' K first (Step<_2,_1>), so that each 64-wide column slab is one 64 x 64 TMA box.
template <typename E, bool K_MAJOR, int ROWS, int STAGES>
using SmemLayout = decltype(tile_to_shape(
    conditional_t<K_MAJOR, GMMA::Layout_K_SW128_Atom<E>, GMMA::Layout_MN_SW128_Atom<E>>{},
    make_shape(Int<ROWS>{}, Int<kBKOf<E>>{}, Int<STAGES>{}),
    conditional_t<K_MAJOR, Step<_1, _2, _3>, Step<_2, _1, _3>>{}));

template <typename T, bool A_KM, bool B_KM, int BN> struct Config {
  using E = typename CuteType<T>::type;
  static_assert(sizeof(E) == 2 || (A_KM && B_KM), "WGMMA reads TF32 operands K-major only");
  static constexpr int kBN = BN, kStages = kStagesOf<BN>;
  static constexpr int kBK = kBKOf<E>;
  static constexpr GMMA::Major kMajorA = A_KM ? GMMA::Major::K : GMMA::Major::MN;
  static constexpr GMMA::Major kMajorB = B_KM ? GMMA::Major::K : GMMA::Major::MN;
  using LayoutA = SmemLayout<E, A_KM, kBM, kStages>;
  using LayoutB = SmemLayout<E, B_KM, BN, kStages>;
  // Two warpgroups side by side along M, each one m64nBNk16 atom wide.
  using Mma = decltype(make_tiled_mma(
      GMMA::ss_op_selector<E, E, float, Shape<Int<kBM>, Int<BN>, Int<kBK>>, kMajorA, kMajorB>(),
      Layout<Shape<_2, _1, _1>>{}));
};

template <typename E, int BN> struct alignas(1024) Shared {
  static constexpr int kStages = kStagesOf<BN>;
  E a[kStages][kBM * kBKOf<E>];  // 1024-byte aligned stages: the swizzle is taken from address bits
  E b[kStages][BN * kBKOf<E>];
  char out[2][kBM * kSpanBytes]; // the epilogue's two staging buffers (128 rows x 128 bytes) for the TMA stores
  float bias[BN];           // the tile's bias
  uint64_t full[kStages];
  uint64_t empty[kStages];
};
// rawops/_gemm_sm90.py's shared_bytes(BN) asks for sizeof + 1024 (the base's alignment).
static_assert(sizeof(Shared<__half, 256>) + 1024 <= 232448 && sizeof(Shared<__half, 128>) + 1024 <= 232448 &&
                  sizeof(Shared<__half, 64>) + 1024 <= 232448,
              "a block's shared memory on sm_90");

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

// Stores slab q (128 bytes of columns: 64 16-bit or 32 float32) of the tile through the copy
// engine: the consumers write it to a staging buffer in the 128-byte swizzle (each thread a pair
// of columns: 4- or 8-byte stores; pair(i) gives accumulators i and i + 1 as T), then one thread
// issues the TMA store of the 128-row box, which clips at the matrix's edges; the two buffers
// alternate, so the stores drain while the next slab is written and while the next tile's main
// loop runs. `issued` counts the stores so far. q must be a constant once unrolled.
// Accumulator i of a thread is row (t / 4) % 8 + 16 (t / 32) + 64 warpgroup + 8 ((i / 2) % 2),
// column 2 (t % 4) + i % 2 + 8 (i / 4): CuTe's 64 x N GMMA C layout, ((4,8,4),(2,2,N/8)).
template <typename T, typename E, int BN, class Pair, class Pairs>
__device__ __forceinline__ void store_slab(const Pairs& pair, int q, Shared<E, BN>& smem, const CUtensorMap* map,
                                           int thread, int row0, int col0, int& issued) {
  constexpr int kCols = kSpanBytes / int(sizeof(T));  // columns a box
  const int row = 64 * (thread / 128) + 16 * (thread % 128 / 32) + thread % 32 / 4;
  const int pair_bytes = int(sizeof(Pair)) * (thread % 4);  // within an 8-column group
  const int buffer = issued & 1;
  if (thread == 0) tma_store_wait<1>();  // the store that last read this buffer is done with it
  consumers_sync();
  // st.shared at 32-bit shared addresses: the generic stores a plain pointer compiles to carry 64-bit
  // address arithmetic and the generic-to-shared conversion
  const uint32_t base = cast_smem_ptr_to_uint(smem.out[buffer]);
#pragma unroll
  for (int jj = 0; jj < kCols / 8; ++jj) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = 4 * (q * kCols / 8 + jj) + 2 * h;
      const int r = row + 8 * h;
      const int byte = jj * 8 * int(sizeof(T)) + pair_bytes;  // in the unswizzled 128-byte row
      const uint32_t at = base + uint32_t(r * kSpanBytes + (((byte >> 4) ^ (r & 7)) << 4) + (byte & 15));
      const Pair value = pair(i);
      if constexpr (sizeof(Pair) == 4)
        asm volatile("st.shared.b32 [%0], %1;" ::"r"(at), "r"(value) : "memory");
      else
        asm volatile("st.shared.v2.b32 [%0], {%1, %2};" ::"r"(at), "r"(value.x), "r"(value.y) : "memory");
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

// The whole tile (acc, float32) as T, slab by slab.
template <typename T, typename E, int BN, class Acc>
__device__ __forceinline__ void store_through_tma(const Acc& acc, Shared<E, BN>& smem, const CUtensorMap* map,
                                                  int thread, int row0, int col0, int& issued) {
  using Pair = conditional_t<sizeof(T) == 2, uint32_t, uint2>;
  auto pair = [&](int i) {
    __align__(8) T two[2] = {from_float<T>(acc(i)), from_float<T>(acc(i + 1))};
    return *reinterpret_cast<const Pair*>(two);
  };
#pragma unroll
  for (int q = 0; q < BN * int(sizeof(T)) / kSpanBytes; ++q)
    store_slab<T, E, BN, Pair>(pair, q, smem, map, thread, row0, col0, issued);
}

// A split's raw float32 sums into partial (M x N, row-major), straight from the accumulators:
// a warp's store covers 8 rows x 32 bytes (whole sectors). Rows and columns past the matrix
// are dropped (N is even: a pair is in or out whole).
template <class Acc>
__device__ __forceinline__ void store_partial(const Acc& acc, float* partial, int thread, int64_t row0, int64_t col0,
                                              int64_t M, int64_t N) {
  const int64_t row = row0 + 64 * (thread / 128) + 16 * (thread % 128 / 32) + thread % 32 / 4;
  const int64_t col = col0 + 2 * (thread % 4);
#pragma unroll
  for (int i = 0; i < size(acc); i += 2) {
    const int64_t r = row + 8 * ((i / 2) % 2), c = col + 8 * (i / 4);
    if (r < M && c < N) *reinterpret_cast<float2*>(partial + r * N + c) = make_float2(acc(i), acc(i + 1));
  }
}

// Modes 0 (none), 1 (bias + GELU, + pre-activation) and 3 (bias) of rawops/gemm_epilogue.cuh.
// The GELU-gradient mode (2) is not compiled here: rawops/_gemm_sm90.py never plans it.
template <typename T, typename E, int BN, class Acc>
__device__ __forceinline__ void store_tile(Acc& acc, Shared<E, BN>& smem, const CUtensorMap* map_c,
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

// Grouped (groups > 0): A's rows are the experts' groups [offsets[e], offsets[e + 1]), each a whole
// number of 128-row tiles (moe_permute's pad_to = 128), B the experts' matrices stacked along its
// rows (b_group_rows rows each: N of an (N, K) K-major matrix, K of a (K, N) MN-major one). A tile
// takes its expert's B (the largest e with offsets[e] <= its first row); tiles past offsets[groups]
// load nothing and store zeros.
__device__ __forceinline__ int expert_of(const int* __restrict__ offsets, int groups, int row) {
  int lo = 0, hi = groups;  // offsets[lo] <= row < offsets[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (offsets[mid] <= row) lo = mid; else hi = mid;
  }
  return lo;
}

// DEFER (the experts' weight gradients: 9-17 stages a tile): a tile's values are rounded to T and
// packed into registers at the end of its main loop, and its slabs stored one a stage during the
// next tile's main loop, between the WGMMAs' issue and their wait, so the tensor cores are not
// left idle through the epilogue.
// SPLIT3 (gemm_sm90_nt_3xtf32_*: float32 at float32's accuracy): A and B are (rows, 2 kp) of TF32
// parts, big in columns [0, kp), small in [kp, 2 kp) (kernels/gemm_tf32.cu split_tf32_*), and K is
// 3 kp: each 32-column stage kk of the parts is three stages, small_a big_b, big_a small_b, big_a
// big_b (the small terms first), each summed apart and added by FADD (kPromote).
template <typename T, bool A_KM, bool B_KM, int BN, bool DEFER = false, bool SPLIT3 = false>
__device__ __forceinline__ void gemm(const CUtensorMap* map_a, const CUtensorMap* map_a_tail,
                                     const CUtensorMap* map_b, const CUtensorMap* map_c, const CUtensorMap* map_pre,
                                     const T* __restrict__ bias, int flags, bool has_pre, int64_t M, int64_t N,
                                     int64_t K, float* __restrict__ partial, int splits,
                                     const int* __restrict__ group_offsets = nullptr, int groups = 0,
                                     int b_group_rows = 0, bool k_groups = false) {
  using C = Config<T, A_KM, B_KM, BN>;
  using E = typename C::E;
  constexpr int kBN = BN, kStages = C::kStages;
  extern __shared__ char shared_raw[];
  Shared<E, BN>& smem = *reinterpret_cast<Shared<E, BN>*>(
      (reinterpret_cast<uintptr_t>(shared_raw) + 1023) / 1024 * 1024);

  const int warpgroup = threadIdx.x / 128;
  if (BN == 256) splits = 1;  // the full-width tiles never split (the planner's rule): their code stays lean
  const int tiles_m = int((M + kBM - 1) / kBM), tiles_n = int((N + kBN - 1) / kBN);
  // k_groups (an expert's weight gradient): a unit is one tile of one expert, K its rows
  // [offsets[e], offsets[e + 1]) (whole stages: the groups are padded to 128 rows); the output
  // is the experts' M x N matrices stacked, expert e's at row e M.
  const int parts = k_groups ? groups : splits;
  const int tiles = tiles_m * tiles_n, units = tiles * parts;
  constexpr int kBK = C::kBK;
  const int k_tiles = int((K + kBK - 1) / kBK);
  const int split_tiles = (k_tiles + splits - 1) / splits;  // K tiles a split (the last may have fewer)
  // A K-major A's last tile-row is read through map_a_tail, whose box is the rows left rounded up
  // to 8 (rawops/_gemm_sm90.py: operand_maps): the copy engine's fill of out-of-bounds rows is
  // slow. The tile's other rows keep stale shared memory; their sums are never stored
  // (the TMA stores clip at M, store_partial checks).
  const int tail_rows = A_KM ? int((M - int64_t(tiles_m - 1) * kBM + 7) / 8 * 8) : kBM;
  const uint32_t stage_bytes = uint32_t((kBM + kBN) * kBK * int(sizeof(E)));
  const uint32_t tail_stage_bytes = uint32_t((tail_rows + kBN) * kBK * int(sizeof(E)));

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
      prefetch_tma_descriptor(map_a_tail);
      prefetch_tma_descriptor(map_b);
      int stage = 0;
      uint32_t phase = 1;  // a fresh "empty" barrier counts as released
      for (int unit = blockIdx.x; unit < units; unit += gridDim.x) {
        // k_groups: expert-major (the blocks running together share an expert's rows in L2: tile-major, each
        // read its own expert's, 0.42x torch._grouped_mm at DRAM speed); splits: tile-major
        const int tile = k_groups ? unit % tiles : unit / parts, split = k_groups ? unit / tiles : unit - tile * parts;
        int tm, tn;
        tile_coords(tile, tiles_m, tiles_n, tm, tn);
        int b_shift = 0;  // the tile's expert's first row in the stacked B
        if (groups && !k_groups) {
          if (tm * kBM >= group_offsets[groups]) continue;  // past the last group
          b_shift = expert_of(group_offsets, groups, tm * kBM) * b_group_rows;
        }
        const int kt_begin = k_groups ? group_offsets[split] / kBK : split * split_tiles;
        const int kt_end = k_groups ? group_offsets[split + 1] / kBK : min(k_tiles, (split + 1) * split_tiles);
        const bool tail = tm == tiles_m - 1;
        const CUtensorMap* a_map = tail ? map_a_tail : map_a;
        const uint32_t bytes = tail ? tail_stage_bytes : stage_bytes;
        for (int kt = kt_begin; kt < kt_end; ++kt) {
          int ka = kt, kb = kt;  // the stages of A and B read
          if (SPLIT3) {
            const int kk = kt / 3, product = kt - 3 * kk;
            ka = kk + (product == 0 ? k_tiles / 3 : 0);  // small_a in the first product
            kb = kk + (product == 1 ? k_tiles / 3 : 0);  // small_b in the second
          }
          cutlass::arch::ClusterBarrier::wait(&smem.empty[stage], phase);
          cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&smem.full[stage], bytes);
          load_operand<A_KM, kBM>(a_map, &smem.full[stage], smem.a[stage], tm * kBM, ka * kBK);
          if (B_KM)
            load_operand<B_KM, kBN>(map_b, &smem.full[stage], smem.b[stage], tn * kBN + b_shift, kb * kBK);
          else
            load_operand<B_KM, kBN>(map_b, &smem.full[stage], smem.b[stage], tn * kBN, kb * kBK + b_shift);
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
  // kPromote (SPLIT3; RAWOPS_GEMM_SM90_PROMOTE, dev: every float32 tile of <= 128 columns): each
  // stage's WGMMAs sum into `part`, added to acc by FADD. The tensor core's float32 sums round worse
  // than IEEE, their error growing with K (3xTF32 summed in them: 4-16x torch's float32 error on the
  // H200, linear in K; promoted: 0.2-1.3x, docs/performance.md).
  constexpr bool kPromote = (SPLIT3 || RAWOPS_GEMM_SM90_PROMOTE) && sizeof(T) == 4 && BN <= 128;
  static_assert(!SPLIT3 || (sizeof(T) == 4 && BN <= 128 && A_KM && B_KM), "3xTF32: float32 nt, <= 128 wide");
  // Stages summed in part before each FADD (RAWOPS_GEMM_SM90_PROMOTE_STAGES, dev: 1 ships, each stage's
  // WGMMAs waited on; more let them pipeline as the main loop's, the tensor core summing longer).
  constexpr int kPromoteStages = RAWOPS_GEMM_SM90_PROMOTE_STAGES;
  Tensor part = partition_fragment_C(mma, Shape<Int<kBM>, Int<kBN>>{});  // unused (no registers) unless kPromote
  const bool lane0 = threadIdx.x % 32 == 0;
  const bool has_bias = (flags & 3) != kEpiNone && bias != nullptr;
  int issued = 0;  // TMA stores issued by this block (thread 0 waits on them)
  static_assert(!DEFER || (sizeof(T) == 2 && BN == 256), "the deferred stores: 16-bit tiles, full width");
  constexpr int kSlabs = BN * int(sizeof(T)) / kSpanBytes;
  uint32_t packed[DEFER ? decltype(size(acc))::value / 2 : 1] = {};  // DEFER: the last tile's values, pairs of T
  int pending = kSlabs, pending_row0 = 0, pending_col0 = 0;  // its first slab not yet stored, its corner
  auto packed_pair = [&](int i) { return packed[DEFER ? i / 2 : 0]; };
  // Slab `pending` of the last tile, if any is left.
  auto store_pending = [&]() {
#pragma unroll
    for (int q = 0; q < kSlabs; ++q)
      if (q == pending)
        store_slab<T, E, BN, uint32_t>(packed_pair, q, smem, map_c, thread, pending_row0, pending_col0, issued);
    ++pending;
  };

  int stage = 0;
  uint32_t phase = 0;
  for (int unit = blockIdx.x; unit < units; unit += gridDim.x) {
    const int tile = k_groups ? unit % tiles : unit / parts, split = k_groups ? unit / tiles : unit - tile * parts;
    int tm, tn;
    tile_coords(tile, tiles_m, tiles_n, tm, tn);
    if (groups && !k_groups && tm * kBM >= group_offsets[groups]) {  // past the last group: no loads (as the producer), zeros
#pragma unroll
      for (int i = 0; i < size(acc); ++i) acc(i) = 0.f;
      store_tile<T>(acc, smem, map_c, map_pre, 0, false, false, thread, tm * kBM, tn * kBN, issued);
      continue;
    }
    // The tile's bias, loaded now and parked in shared memory after the main loop.
    const float bias_value =
        has_bias && thread < kBN ? to_float(bias[min(int64_t(tn) * kBN + thread, N - 1)]) : 0.f;
    mma.accumulate_ = GMMA::ScaleOut::Zero;
    int release = -1;  // the stage whose WGMMAs may still be reading it
    const int kt_begin = k_groups ? group_offsets[split] / kBK : split * split_tiles;
    const int kt_end = k_groups ? group_offsets[split + 1] / kBK : min(k_tiles, kt_begin + split_tiles);
    // zeros: an empty split (the planner avoids them), an expert without rows; kPromote adds to acc
    if (kPromote || kt_begin >= kt_end) {
#pragma unroll
      for (int i = 0; i < size(acc); ++i) acc(i) = 0.f;
    }
    for (int kt = kt_begin; kt < kt_end; ++kt) {
      cutlass::arch::ClusterTransactionBarrier::wait(&smem.full[stage], phase);
      if (kPromote) {  // kPromoteStages stages summed apart in part (pipelined as the main loop), then added
        const int step = (kt - kt_begin) % kPromoteStages;
        const bool last = step == kPromoteStages - 1 || kt + 1 == kt_end;
        warpgroup_fence_operand(part);
        warpgroup_arrive();
        if (step == 0) mma.accumulate_ = GMMA::ScaleOut::Zero;
#pragma unroll
        for (int kb = 0; kb < size<2>(fA); ++kb) {
          cute::gemm(mma, fA(_, _, kb, stage), fB(_, _, kb, stage), part);
          mma.accumulate_ = GMMA::ScaleOut::One;
        }
        warpgroup_commit_batch();
        if (last) warpgroup_wait<0>(); else warpgroup_wait<1>();
        warpgroup_fence_operand(part);
        if (release >= 0 && lane0) cutlass::arch::ClusterBarrier::arrive(&smem.empty[release]);
        release = stage;
        if (last) {
          if (lane0) cutlass::arch::ClusterBarrier::arrive(&smem.empty[stage]);
          release = -1;
#pragma unroll
          for (int i = 0; i < size(acc); ++i) acc(i) += part(i);
        }
        if (++stage == kStages) stage = 0, phase ^= 1;
        continue;
      }
      warpgroup_fence_operand(acc);
      warpgroup_arrive();
#pragma unroll
      for (int kb = 0; kb < size<2>(fA); ++kb) {
        cute::gemm(mma, fA(_, _, kb, stage), fB(_, _, kb, stage), acc);
        mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      if (DEFER && pending < kSlabs) store_pending();  // while the WGMMAs run
      warpgroup_wait<1>();  // the previous stage's WGMMAs are done: hand it back
      warpgroup_fence_operand(acc);
      if (release >= 0 && lane0) cutlass::arch::ClusterBarrier::arrive(&smem.empty[release]);
      release = stage;
      if (++stage == kStages) stage = 0, phase ^= 1;
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc);
    if (release >= 0 && lane0) cutlass::arch::ClusterBarrier::arrive(&smem.empty[release]);

    if (splits > 1) {
      store_partial(acc, partial + int64_t(split) * M * N, thread, int64_t(tm) * kBM, int64_t(tn) * kBN, M, N);
      continue;
    }
    if (has_bias) {  // every consumer is past the last tile's reads of smem.bias (its barriers)
      if (thread < kBN) smem.bias[thread] = bias_value;
      consumers_sync();
    }
    const int row0 = (k_groups ? split * int(M) : 0) + tm * kBM;  // k_groups: expert `split`'s matrix
    if (DEFER) {
      while (pending < kSlabs) store_pending();  // a tile of fewer stages than slabs (or none)
#pragma unroll
      for (int i = 0; i < size(acc); i += 2) {
        __align__(4) T two[2] = {from_float<T>(acc(i)), from_float<T>(acc(i + 1))};
        packed[i / 2] = *reinterpret_cast<const uint32_t*>(two);
      }
      pending = 0, pending_row0 = row0, pending_col0 = tn * kBN;
      continue;
    }
    store_tile<T>(acc, smem, map_c, map_pre, flags, has_bias, has_pre, thread, row0, tn * kBN, issued);
  }
  if (DEFER)
    while (pending < kSlabs) store_pending();
  if (thread == 0) tma_store_wait<0>();  // shared memory must outlive the stores reading it
}

}  // namespace sm90
}  // namespace rawops

// ---------------------------------------------------------------------------- entry points
// (map_a, map_b, map_c, map_pre, map_a_tail, bias, m, n, k, flags, partial, splits): tensor maps
// of the operands, of c and of the pre-activation (map_c again when none is stored: flags &
// kFlagPre says one is; the epilogue's bits are below it), and of A's last tile-row (map_a again
// for an M-major A), built by
// rawops/_gemm_sm90.py; bias and flags as in kernels/gemm.cu; with splits
// > 1 the sums go to partial (splits x m x n float32) and c, bias and flags are unused.
#define RAWOPS_SM90_ENTRY(A_KM, B_KM, T, BN, SPLIT3, name)                                                   \
  extern "C" __global__ void __launch_bounds__(rawops::sm90::kThreads, 1) name(                              \
      const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,                 \
      const __grid_constant__ CUtensorMap map_c, const __grid_constant__ CUtensorMap map_pre,                \
      const __grid_constant__ CUtensorMap map_a_tail, const T* bias, long long m, long long n, long long k,    \
      long long flags, float* partial, long long splits) {                                                  \
    rawops::sm90::gemm<T, A_KM, B_KM, BN, false, SPLIT3>(&map_a, &map_a_tail, &map_b, &map_c, &map_pre, bias,  \
                                                         int(flags & 7), (flags & rawops::sm90::kFlagPre) != 0, \
                                                         m, n, k, partial, int(splits));                   \
  }
#define RAWOPS_SM90_BN(layout, A_KM, B_KM, T, suffix, BN, name) RAWOPS_SM90_ENTRY(A_KM, B_KM, T, BN, false, name)
#define RAWOPS_SM90(layout, A_KM, B_KM, T, suffix)                                                 \
  RAWOPS_SM90_BN(layout, A_KM, B_KM, T, suffix, 256, gemm_sm90_##layout##_##suffix)               \
  RAWOPS_SM90_BN(layout, A_KM, B_KM, T, suffix, 128, gemm_sm90_##layout##_##suffix##_n128)        \
  RAWOPS_SM90_BN(layout, A_KM, B_KM, T, suffix, 64, gemm_sm90_##layout##_##suffix##_n64)
#define RAWOPS_SM90_FAMILY(T, suffix)      \
  RAWOPS_SM90(nn, true, false, T, suffix)  \
  RAWOPS_SM90(nt, true, true, T, suffix)   \
  RAWOPS_SM90(tn, false, false, T, suffix)

// Grouped entries (map_a, map_b, map_c, map_a_tail, offsets, groups, b_group_rows, m, n, k): 128 x 256
// tiles, no bias, no epilogue, no split; nt: each expert's y = x W_e^T (W stacked (E N, K), nn.Linear
// layout), nn: y = x W_e (W stacked (E K, N): the forward's dx through its weight).
#define RAWOPS_SM90_GROUPED(layout, A_KM, B_KM, T, suffix)                                                    \
  extern "C" __global__ void __launch_bounds__(rawops::sm90::kThreads, 1) gemm_sm90_grouped_##layout##_##suffix( \
      const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,                 \
      const __grid_constant__ CUtensorMap map_c, const __grid_constant__ CUtensorMap map_a_tail,            \
      const int* offsets, long long groups, long long b_group_rows, long long m, long long n, long long k) { \
    rawops::sm90::gemm<T, A_KM, B_KM, 256>(&map_a, &map_a_tail, &map_b, &map_c, &map_c, nullptr, 0, false, m, n, k, \
                                           nullptr, 1, offsets, int(groups), int(b_group_rows));            \
  }

RAWOPS_SM90_FAMILY(__half, f16)
RAWOPS_SM90_FAMILY(__nv_bfloat16, bf16)
// The experts' weight gradients (map_a, map_b, map_c, offsets, groups, m, n): dW_e (M x N, stacked
// (E M, N)) = A_e^T B_e over expert e's rows of A (rows, M) and B (rows, N), both M/N-major (tn);
// M a multiple of 128 (the TMA store of a tile must not cross into the next expert's matrix).
#define RAWOPS_SM90_GROUPED_TN(T, suffix)                                                                       \
  extern "C" __global__ void __launch_bounds__(rawops::sm90::kThreads, 1) gemm_sm90_grouped_tn_##suffix(     \
      const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,                 \
      const __grid_constant__ CUtensorMap map_c, const int* offsets, long long groups, long long m,         \
      long long n) {                                                                                        \
    rawops::sm90::gemm<T, false, false, 256, true>(                                                          \
        &map_a, &map_a, &map_b, &map_c, &map_c, nullptr, 0, false, m, n, 0, nullptr, 1, offsets, int(groups), 0, \
        true);                                                                                              \
  }

RAWOPS_SM90_GROUPED(nt, true, true, __half, f16)
RAWOPS_SM90_GROUPED(nt, true, true, __nv_bfloat16, bf16)
RAWOPS_SM90_GROUPED(nn, true, false, __half, f16)
RAWOPS_SM90_GROUPED(nn, true, false, __nv_bfloat16, bf16)
RAWOPS_SM90_GROUPED_TN(__half, f16)
RAWOPS_SM90_GROUPED_TN(__nv_bfloat16, bf16)
RAWOPS_SM90(nt, true, true, float, tf32)  // float32 as TF32: K-major operands only
// float32 at float32's accuracy (3xTF32, rawops/_gemm_tf32.py): the tf32 entries' arguments, a and b
// the split parts (rows, 2 kp), k = 3 kp; tiles of <= 128 columns (the promoted sums' registers).
RAWOPS_SM90_ENTRY(true, true, float, 128, true, gemm_sm90_nt_3xtf32_n128)
RAWOPS_SM90_ENTRY(true, true, float, 64, true, gemm_sm90_nt_3xtf32_n64)
