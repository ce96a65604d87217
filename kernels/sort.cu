// Sort family: sort and argsort of every row, as torch.sort (values and int64 indices).
//
//   values[r, j] = x[r, order[j]], indices[r, j] = order[j], order the permutation that puts
//   row r in torch's order: ascending or descending, NaN after +inf ascending and first
//   descending, -0.0 == +0.0 (rawops/sort_keys.cuh). Every path is stable: equal keys keep
//   their positions' order, which satisfies stable=False as well.
// Keys: float32, float16, bfloat16, int32, int64 as sort_key() bits (16, 32 or 64 wide; the
// half types take half the radix passes of float32). Values are gathered from x by the sorted
// positions, never decoded from keys, so NaN payloads and -0.0 come back as they went in.
// Rows: x is read at row stride x_stride (a row-strided view or n); values and indices are
// dense, n a row; values may be null (argsort: indices only). Bytes: x read once (plus the
// gather's re-read of the row, from cache) and values + indices written once: n * (2 * sizeof(T)
// + 8) a row on the one-kernel paths.
//
// Three launch shapes, by row length (rawops/sort.py: plan):
//   n <= 32          sort_warp_<dt>: a bitonic network in registers over a power-of-two group
//                    of lanes (32 / width rows a warp), compare-exchanging (key, position)
//                    pairs through shuffles; the position tie-break makes it stable.
//   n <= one tile    sort_rows_<T>x<I>_<dt>: one block a row, cub::BlockRadixSort of T threads
//                    x I keys (key bits, 16-bit positions), the smallest tile that holds the
//                    row, padded with the largest key (padding sits at the highest blocked
//                    positions, so the stable sort leaves it last even beside equal keys).
//                    Keys are held blocked (thread t: positions t*I .. t*I+I-1), the order
//                    BlockRadixSort's ranking is stable in; results come out striped, so the
//                    stores are coalesced.
//   longer rows      sort_keys_<dt> writes key bits and int32 positions to scratch; then one
//                    sort_pass_k<bits> launch per radix digit (RAWOPS_SORT_SEGMENT_RADIX_BITS
//                    bits): cub's AgentSegmentedRadixSort (the block-per-segment machinery of
//                    cub::DeviceSegmentedRadixSort), one block a row, an upsweep histogram and
//                    a stable downsweep scatter, ping-ponging between two scratch pairs; last,
//                    sort_gather_<dt> writes values and int64 indices from the final order.
//                    Scratch: 2 x (key bits + 4 bytes) an element, allocated by the caller.
#include <cub/agent/agent_segmented_radix_sort.cuh>
#include <cub/block/block_radix_sort.cuh>

#include "rawops/sort_keys.cuh"

namespace rawops {
namespace {

template <typename Bits> __device__ __forceinline__ Bits shfl_xor(Bits v, int mask) {
  if constexpr (sizeof(Bits) == 8) {
    return __shfl_xor_sync(0xffffffffu, static_cast<unsigned long long>(v), mask);
  } else {
    return static_cast<Bits>(__shfl_xor_sync(0xffffffffu, static_cast<unsigned>(v), mask));
  }
}

// ------------------------------------------------------------------------------ n <= 32
// Each group of `width` lanes (a power of two >= n) sorts one row: lane p holds position p
// (positions >= n hold the largest key, tie-broken after every real one by their position).
template <typename T>
__device__ __forceinline__ void sort_warp(const T* __restrict__ x, T* __restrict__ values,
                                          int64_t* __restrict__ indices, int64_t rows, int64_t n, int64_t x_stride,
                                          int64_t descending) {
  using Bits = typename SortKey<T>::Bits;
  int width = 1;
  while (width < n) width <<= 1;
  const int lane = threadIdx.x & 31;
  const int pos = lane & (width - 1);
  const int64_t rows_per_warp = 32 / width;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t warps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  for (int64_t first = warp * rows_per_warp; first < rows; first += warps * rows_per_warp) {
    const int64_t row = first + lane / width;
    const bool real = row < rows && pos < n;
    Bits key = real ? sort_key(x[row * x_stride + pos], descending != 0) : static_cast<Bits>(~Bits(0));
    int idx = pos;
    for (int k = 2; k <= width; k <<= 1) {
      for (int j = k >> 1; j > 0; j >>= 1) {
        const Bits other_key = shfl_xor(key, j);
        const int other_idx = __shfl_xor_sync(0xffffffffu, idx, j);
        const bool other_first = other_key < key || (other_key == key && other_idx < idx);
        const bool ascending = (pos & k) == 0, lower = (pos & j) == 0;
        if ((lower == ascending) == other_first) {
          key = other_key;
          idx = other_idx;
        }
      }
    }
    if (real) {
      if (values) values[row * n + pos] = x[row * x_stride + idx];
      indices[row * n + pos] = idx;
    }
  }
}

// ------------------------------------------------------------------------------ n <= one tile
// A block's LSD radix sort of THREADS x ITEMS keys carrying 16-bit positions, one cub ranking
// per RADIX_BITS digit. MATCH: cub::BlockRadixRankMatch (per-warp digit counters found with
// match.any), stable in warp-striped order; else cub::BlockRadixRank (a thread's counters, packed
// and scanned), stable in blocked order. Keys go in and every pass reads them back in that
// order, so ranking by position order is what makes the sort stable. The last pass scatters the
// positions only (values are gathered from x, never decoded) and reads them back striped, so
// that a row's results are stored coalesced.
template <typename Bits, int THREADS, int ITEMS, int RADIX_BITS, bool MATCH>
struct BlockSort {
  static constexpr int kTile = THREADS * ITEMS;
  using Rank = typename ::cuda::std::conditional_t<MATCH, cub::BlockRadixRankMatch<THREADS, RADIX_BITS, false>,
                                                   cub::BlockRadixRank<THREADS, RADIX_BITS, false>>;
  // Keys and positions exchanged together while both fit 32 KB, else one after the other.
  static constexpr bool kTogether = kTile * (sizeof(Bits) + sizeof(unsigned short)) <= 32768;
  struct Exchange {
    Bits keys[kTile];
    unsigned short pos[kTogether ? kTile : 1];
  };
  union TempStorage {
    typename Rank::TempStorage rank;
    Exchange exchange;
    unsigned short pos[kTile];
  };

  // Where item i of this thread sits in the order the ranking is stable in.
  static __device__ __forceinline__ int slot(int i) {
    if constexpr (MATCH) {
      return (threadIdx.x >> 5) * (32 * ITEMS) + i * 32 + (threadIdx.x & 31);
    } else {
      return threadIdx.x * ITEMS + i;
    }
  }

  // Sorts bits [0, end_bit) of keys, stable; on return pos[i] is the position of sorted slot
  // i * THREADS + threadIdx.x (striped). Ends with a barrier: temp may be reused at once.
  static __device__ __forceinline__ void sort(TempStorage& temp, Bits (&keys)[ITEMS], unsigned short (&pos)[ITEMS],
                                              int end_bit) {
    for (int bit = 0; bit < end_bit; bit += RADIX_BITS) {
      const bool last = bit + RADIX_BITS >= end_bit;
      int ranks[ITEMS];
      Rank(temp.rank).RankKeys(keys, ranks, cub::BFEDigitExtractor<Bits>(bit, ::cuda::std::min(RADIX_BITS, end_bit - bit)));
      __syncthreads();
      if (last || !kTogether) {
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) temp.pos[ranks[i]] = pos[i];
        __syncthreads();
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) pos[i] = temp.pos[last ? i * THREADS + threadIdx.x : slot(i)];
        __syncthreads();
        if (last) break;
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) temp.exchange.keys[ranks[i]] = keys[i];
        __syncthreads();
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) keys[i] = temp.exchange.keys[slot(i)];
      } else {
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
          temp.exchange.keys[ranks[i]] = keys[i];
          temp.exchange.pos[ranks[i]] = pos[i];
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
          keys[i] = temp.exchange.keys[slot(i)];
          pos[i] = temp.exchange.pos[slot(i)];
        }
      }
      __syncthreads();
    }
  }
};

template <typename T, int THREADS, int ITEMS, int RADIX_BITS, bool MATCH>
__device__ __forceinline__ void sort_rows(const T* __restrict__ x, T* __restrict__ values,
                                          int64_t* __restrict__ indices, int64_t rows, int64_t n, int64_t x_stride,
                                          int64_t descending) {
  using Bits = typename SortKey<T>::Bits;
  using Sorter = BlockSort<Bits, THREADS, ITEMS, RADIX_BITS, MATCH>;
  __shared__ typename Sorter::TempStorage temp;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * x_stride;
    Bits keys[ITEMS];
    unsigned short pos[ITEMS];
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int p = Sorter::slot(i);
      pos[i] = static_cast<unsigned short>(p);
      keys[i] = p < n ? sort_key(xr[p], descending != 0) : static_cast<Bits>(~Bits(0));
    }
    Sorter::sort(temp, keys, pos, SortKey<T>::kBits);
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int p = i * THREADS + threadIdx.x;
      if (p < n) {
        if (values) values[row * n + p] = xr[pos[i]];
        indices[row * n + p] = pos[i];
      }
    }
  }
}

// ------------------------------------------------------------------------------ longer rows
template <typename T>
__device__ __forceinline__ void sort_keys(const T* __restrict__ x, typename SortKey<T>::Bits* __restrict__ keys,
                                          int* __restrict__ order, int64_t rows, int64_t n, int64_t x_stride,
                                          int64_t descending) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      keys[row * n + j] = sort_key(x[row * x_stride + j], descending != 0);
      order[row * n + j] = static_cast<int>(j);
    }
  }
}

template <typename T>
__device__ __forceinline__ void sort_gather(const T* __restrict__ x, const int* __restrict__ order,
                                            T* __restrict__ values, int64_t* __restrict__ indices, int64_t rows,
                                            int64_t n, int64_t x_stride) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const int p = order[row * n + j];
      if (values) values[row * n + j] = x[row * x_stride + p];
      indices[row * n + j] = p;
    }
  }
}

// cub's segmented policy shape for 4-byte keys (192 threads x 39 keys, scaled down for wider
// ones by RegBoundScaling), ranking by memoized counters.
template <typename Bits>
using SegmentPolicy =
    cub::AgentRadixSortDownsweepPolicy<RAWOPS_SORT_SEGMENT_THREADS, RAWOPS_SORT_SEGMENT_ITEMS,
                                       ::cuda::std::conditional_t<(sizeof(Bits) > 4), Bits, int>,
                                       cub::BLOCK_LOAD_TRANSPOSE, cub::LOAD_DEFAULT, cub::RADIX_RANK_MEMOIZE,
                                       cub::BLOCK_SCAN_WARP_SCANS, RAWOPS_SORT_SEGMENT_RADIX_BITS>;

// One digit pass over every row: bits [bit, bit + pass_bits) of keys_in (ascending, stable) into
// keys_out, carrying order. One block a row.
template <typename Bits>
__device__ __forceinline__ void sort_pass(const Bits* __restrict__ keys_in, const int* __restrict__ order_in,
                                          Bits* __restrict__ keys_out, int* __restrict__ order_out, int64_t rows,
                                          int64_t n, int64_t bit, int64_t pass_bits) {
  using Agent = cub::detail::radix_sort::AgentSegmentedRadixSort<false, SegmentPolicy<Bits>, Bits, int, int>;
  __shared__ typename Agent::TempStorage temp;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t offset = row * n;
    Agent agent(static_cast<int>(n), temp);
    agent.ProcessIterative(static_cast<int>(bit), static_cast<int>(pass_bits), keys_in + offset, order_in + offset, keys_out + offset,
                           order_out + offset);
    __syncthreads();  // temp is reused by the next row
  }
}

}  // namespace
}  // namespace rawops



#define RAWOPS_SORT_ARGS(T) \
  const T *x, T *values, long long *indices, long long rows, long long n, long long x_stride, long long descending

#define RAWOPS_SORT_WARP(T, suffix)                                                               \
  extern "C" __global__ void __launch_bounds__(RAWOPS_SORT_WARP_THREADS)                          \
      sort_warp_##suffix(RAWOPS_SORT_ARGS(T)) {                                                   \
    rawops::sort_warp<T>(x, values, indices, rows, n, x_stride, descending);                      \
  }

#define RAWOPS_SORT_TILE(T, suffix, THREADS, ITEMS, RANK, BITS, MATCH)                                       \
  extern "C" __global__ void __launch_bounds__(THREADS)                                                        \
      sort_rows_##THREADS##x##ITEMS##_##RANK##BITS##_##suffix(RAWOPS_SORT_ARGS(T)) {                           \
    rawops::sort_rows<T, THREADS, ITEMS, BITS, MATCH>(x, values, indices, rows, n, x_stride, descending);     \
  }

// Each tile in both rankings: match with 8-bit digits (a warp's counters: 256 x warps), and
// counters with 6-bit digits (5-bit at 512 threads), whose packed per-thread counters (33 x 4
// bytes a thread at 6 bits) keep every tile within the 48 KB of static shared memory.
#define RAWOPS_SORT_TILE_PAIR(T, suffix, THREADS, ITEMS, COUNT_BITS) \
  RAWOPS_SORT_TILE(T, suffix, THREADS, ITEMS, match, 8, true)         \
  RAWOPS_SORT_TILE(T, suffix, THREADS, ITEMS, count, COUNT_BITS, false)

#define RAWOPS_SORT_LONG(T, suffix)                                                                                \
  extern "C" __global__ void __launch_bounds__(RAWOPS_SORT_STREAM_THREADS)                                         \
      sort_keys_##suffix(const T *x, typename rawops::SortKey<T>::Bits *keys, int *order, long long rows, long long n, \
                         long long x_stride, long long descending) {                                                       \
    rawops::sort_keys<T>(x, keys, order, rows, n, x_stride, descending);                                           \
  }                                                                                                                \
  extern "C" __global__ void __launch_bounds__(RAWOPS_SORT_STREAM_THREADS)                                         \
      sort_gather_##suffix(const T *x, const int *order, T *values, long long *indices, long long rows, long long n,     \
                           long long x_stride) {                                                                     \
    rawops::sort_gather<T>(x, order, values, indices, rows, n, x_stride);                                          \
  }

// The tiles (threads x keys a thread) of rawops/sort.py's TILES.
#define RAWOPS_SORT_TILES_NARROW(T, suffix)  \
  RAWOPS_SORT_WARP(T, suffix)                \
  RAWOPS_SORT_TILE_PAIR(T, suffix, 32, 4, 6)   \
  RAWOPS_SORT_TILE_PAIR(T, suffix, 32, 8, 6)   \
  RAWOPS_SORT_TILE_PAIR(T, suffix, 64, 8, 6)   \
  RAWOPS_SORT_TILE_PAIR(T, suffix, 128, 8, 6)  \
  RAWOPS_SORT_TILE_PAIR(T, suffix, 256, 8, 6)  \
  RAWOPS_SORT_TILE_PAIR(T, suffix, 256, 16, 6) \
  RAWOPS_SORT_TILE_PAIR(T, suffix, 512, 16, 5) \
  RAWOPS_SORT_LONG(T, suffix)

// 64-bit keys: an 8192-key tile would need 64 KB of exchange space; rows past 4096 go long.
#define RAWOPS_SORT_TILES_WIDE(T, suffix)  \
  RAWOPS_SORT_WARP(T, suffix)              \
  RAWOPS_SORT_TILE_PAIR(T, suffix, 32, 4, 6)   \
  RAWOPS_SORT_TILE_PAIR(T, suffix, 32, 8, 6)   \
  RAWOPS_SORT_TILE_PAIR(T, suffix, 64, 8, 6)   \
  RAWOPS_SORT_TILE_PAIR(T, suffix, 128, 8, 6)  \
  RAWOPS_SORT_TILE_PAIR(T, suffix, 256, 8, 6)  \
  RAWOPS_SORT_TILE_PAIR(T, suffix, 256, 16, 6) \
  RAWOPS_SORT_LONG(T, suffix)

RAWOPS_SORT_TILES_NARROW(float, f32)
RAWOPS_SORT_TILES_NARROW(__half, f16)
RAWOPS_SORT_TILES_NARROW(__nv_bfloat16, bf16)
RAWOPS_SORT_TILES_NARROW(int, i32)
RAWOPS_SORT_TILES_WIDE(long long, i64)

#define RAWOPS_SORT_PASS(Bits, suffix)                                                                           \
  extern "C" __global__ void __launch_bounds__(RAWOPS_SORT_SEGMENT_THREADS)                                      \
      sort_pass_##suffix(const Bits *keys_in, const int *order_in, Bits *keys_out, int *order_out, long long rows, \
                         long long n, long long bit, long long pass_bits) {                                                    \
    rawops::sort_pass<Bits>(keys_in, order_in, keys_out, order_out, rows, n, bit, pass_bits);                    \
  }

RAWOPS_SORT_PASS(unsigned short, k16)
RAWOPS_SORT_PASS(unsigned, k32)
RAWOPS_SORT_PASS(unsigned long long, k64)
