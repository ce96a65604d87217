// Sorting family: sort and argsort of every row, as torch.sort (values and int64 indices).
//
//   values[r, j] = x[r, order[j]], indices[r, j] = order[j], order the permutation that puts
//   row r in torch's order: ascending or descending, NaN after +inf ascending and first
//   descending, -0.0 == +0.0 (rawops/sort_keys.cuh). Every path is stable: equal keys keep
//   their positions' order, which satisfies stable=False as well.
// Keys: float32, float16, bfloat16, int32, int64 as sort_key() bits (16, 32 or 64 wide; the
// half types take half the radix passes of float32). Values are gathered from x by the sorted
// positions, or decoded from keys where the key has one value (sort_value: every key but NaN's
// and zero's), so NaN payloads and -0.0 come back as they went in.
// Rows: x is read at row stride x_stride (a row-strided view or n); values and indices are
// dense, n a row; values may be null (argsort: indices only). Bytes: x read once (plus the
// gather's re-read of the row, from cache) and values + indices written once: n * (2 * sizeof(T)
// + 8) a row on the one-kernel paths.
//
// Launch shapes, by row length (rawops/sorting.py: plan):
//   n <= 32          sort_warp_<dt>: a bitonic network in registers over a power-of-two group
//                    of lanes (32 / width rows a warp), compare-exchanging (key, position)
//                    pairs through shuffles; the position tie-break makes it stable.
//   n <= 1024        sort_net_<shfl|smem>_<I>_<dt> (16- and 32-bit keys, where the plan's
//                    NETWORK_MAX says): one warp a row of up to 32 x I keys, a bitonic network
//                    over (key, position) words in registers (sort_net below).
//   n <= one tile    sort_rows_<T>x<I>_<ranking>_<dt>: one block a row, an LSD radix sort of T
//                    threads x I keys (key bits, 16-bit positions) on cub's block ranking
//                    (BlockSort below), the smallest tile that holds the row, padded with the
//                    largest key (padding sits at the highest slots, so the stable sort leaves
//                    it last even beside equal keys).
//   longer rows      merge: sort_chunks_<T>x<I>_<ranking>_<dt> sorts chunks of the largest tile
//                    a block each into scratch (key bits, int32 positions); then one launch per
//                    doubling of the sorted run length (stable merge-path merges of run pairs),
//                    the last writing values and int64 indices: block_merge (sort_bmerge_k<bits>,
//                    sort_bmerge_final_<dt>: a block a window of outputs staged in shared memory)
//                    or the thread merge (sort_merge_k<bits>, sort_merge_final_<dt>: a thread a
//                    few outputs, searched and read in global memory). Traffic a round: key +
//                    position read and written.
//                    segmented (the alternative): sort_keys_<dt> writes key bits and int32
//                    positions; one sort_pass_k<bits> launch per RAWOPS_SORT_SEGMENT_RADIX_BITS
//                    digit: cub's AgentSegmentedRadixSort (the block-per-segment machinery of
//                    cub::DeviceSegmentedRadixSort), one block a row, an upsweep histogram and a
//                    stable downsweep scatter; sort_gather_<dt> writes the results.
//                    Both ping-pong between two scratch pairs: 2 x (key bytes + 4) an element,
//                    allocated by the caller.
#include <cub/agent/agent_segmented_radix_sort.cuh>
#include <cub/block/block_merge_sort.cuh>
#include <cub/block/block_radix_sort.cuh>

#include "rawops/sort_keys.cuh"

#ifndef RAWOPS_DEV_SORT_PACK
#define RAWOPS_DEV_SORT_PACK 0  // dev: see BlockSort::kPack
#endif

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
// A block's LSD radix sort of THREADS x ITEMS keys carrying 16-bit positions, 8-bit digits, one
// cub ranking a digit: EARLY, cub::BlockRadixRankMatchEarlyCounts (a warp's digit histogram by
// shared atomics first, then each key's rank among its warp's equal digits by atomicOr masks);
// else cub::BlockRadixRankMatch (the equal-digit masks by ballots). Both rank stably in
// warp-striped order (warp w, key i, lane l: slot w * 32 * ITEMS + i * 32 + l), so keys go in
// and every pass reads them back in that order, which is what makes the sort stable; loads in
// that order are coalesced too. The last pass reads back striped (slot i * THREADS + t), so a
// row's results are stored coalesced, and exchanges the keys only when the caller wants them
// (values are gathered from x by position, never decoded from keys).
template <typename Bits, int THREADS, int ITEMS, bool EARLY>
struct BlockSort {
  static constexpr int kTile = THREADS * ITEMS;
  static constexpr int kRadixBits = 8;
  using Rank = typename ::cuda::std::conditional_t<
      EARLY,
      cub::BlockRadixRankMatchEarlyCounts<THREADS, kRadixBits, false, cub::BLOCK_SCAN_WARP_SCANS,
                                          cub::WARP_MATCH_ATOMIC_OR>,
      cub::BlockRadixRankMatch<THREADS, kRadixBits, false>>;
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
    return (threadIdx.x >> 5) * (32 * ITEMS) + i * 32 + (threadIdx.x & 31);
  }

  static __device__ __forceinline__ void rank(TempStorage& temp, Bits (&keys)[ITEMS], int (&ranks)[ITEMS], int bit,
                                              int bits) {
    const cub::BFEDigitExtractor<Bits> digit(bit, bits);
    if constexpr (EARLY) {
      int exclusive_digit_prefix[Rank::BINS_PER_THREAD];
      Rank(temp.rank).RankKeys(keys, ranks, digit, exclusive_digit_prefix);
    } else {
      Rank(temp.rank).RankKeys(keys, ranks, digit);
    }
  }

  // dev (RAWOPS_DEV_SORT_PACK=1, dev/time_sort_pack.py): where the keys' own bits are not wanted back
  // (values gathered from x by position), each item's position rides in the keys' low kPackBits bits
  // once the passes over those bits are ranked (8 where a position fits them, tiles of <= 256 keys;
  // else 16): from that pass on, one word an item is exchanged instead of a key and a position.
  static constexpr int kPackBits = kTile <= 256 ? 8 : 16;
  static constexpr bool kPack = RAWOPS_DEV_SORT_PACK && kPackBits < int(sizeof(Bits)) * 8;

  // Sorts bits [0, end_bit) of keys, stable; on return pos[i] (and keys[i] when WANT_KEYS) is
  // sorted slot i * THREADS + threadIdx.x (striped). Ends with a barrier: temp may be reused.
  template <bool WANT_KEYS>
  static __device__ __forceinline__ void sort(TempStorage& temp, Bits (&keys)[ITEMS], unsigned short (&pos)[ITEMS],
                                              int end_bit) {
    for (int bit = 0; bit < end_bit; bit += kRadixBits) {
      const bool last = bit + kRadixBits >= end_bit;
      int ranks[ITEMS];
      rank(temp, keys, ranks, bit, end_bit - bit < kRadixBits ? end_bit - bit : int(kRadixBits));
      __syncthreads();
      if constexpr (kPack && !WANT_KEYS) {
        if (bit + kRadixBits >= kPackBits) {
          constexpr Bits kLow = (Bits(1) << kPackBits) - 1;
          if (bit + kRadixBits == kPackBits) {
#pragma unroll
            for (int i = 0; i < ITEMS; ++i) keys[i] = (keys[i] & ~kLow) | Bits(pos[i]);
          }
          if (last) {
#pragma unroll
            for (int i = 0; i < ITEMS; ++i) pos[i] = static_cast<unsigned short>(keys[i] & kLow);
          } else {
#pragma unroll
            for (int i = 0; i < ITEMS; ++i) temp.exchange.keys[ranks[i]] = keys[i];
            __syncthreads();
#pragma unroll
            for (int i = 0; i < ITEMS; ++i) keys[i] = temp.exchange.keys[slot(i)];
            __syncthreads();
            continue;
          }
        }
      }
      if ((last && !WANT_KEYS) || !kTogether) {
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) temp.pos[ranks[i]] = pos[i];
        __syncthreads();
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) pos[i] = temp.pos[last ? i * THREADS + threadIdx.x : slot(i)];
        __syncthreads();
        if (last && !WANT_KEYS) break;
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) temp.exchange.keys[ranks[i]] = keys[i];
        __syncthreads();
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) keys[i] = temp.exchange.keys[last ? i * THREADS + threadIdx.x : slot(i)];
      } else {
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
          temp.exchange.keys[ranks[i]] = keys[i];
          temp.exchange.pos[ranks[i]] = pos[i];
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
          const int from = last ? i * THREADS + threadIdx.x : slot(i);
          keys[i] = temp.exchange.keys[from];
          pos[i] = temp.exchange.pos[from];
        }
      }
      __syncthreads();
    }
  }
};

// One block a row: values and indices of rows of n <= THREADS * ITEMS.
template <typename T, int THREADS, int ITEMS, bool EARLY>
__device__ __forceinline__ void sort_rows(const T* __restrict__ x, T* __restrict__ values,
                                          int64_t* __restrict__ indices, int64_t rows, int64_t n, int64_t x_stride,
                                          int64_t descending) {
  using Bits = typename SortKey<T>::Bits;
  using Sorter = BlockSort<Bits, THREADS, ITEMS, EARLY>;
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
    Sorter::template sort<false>(temp, keys, pos, SortKey<T>::kBits);
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

// One block a chunk of THREADS * ITEMS elements of a longer row (chunks c = 0, 1, ... of row r
// start at c * THREADS * ITEMS; the last may be short): the chunk's sorted key bits and int32
// positions in the row, into keys and pos (dense rows of n), for the merge rounds.
template <typename T, int THREADS, int ITEMS, bool EARLY>
__device__ __forceinline__ void sort_chunks(const T* __restrict__ x, typename SortKey<T>::Bits* __restrict__ keys_out,
                                            int* __restrict__ pos_out, int64_t rows, int64_t n, int64_t x_stride,
                                            int64_t descending) {
  using Bits = typename SortKey<T>::Bits;
  using Sorter = BlockSort<Bits, THREADS, ITEMS, EARLY>;
  constexpr int kTile = Sorter::kTile;
  __shared__ typename Sorter::TempStorage temp;
  const int64_t chunks = (n + kTile - 1) / kTile;
  for (int64_t block = blockIdx.x; block < rows * chunks; block += gridDim.x) {
    const int64_t row = block / chunks, start = (block - row * chunks) * kTile;
    const int64_t len = n - start < kTile ? n - start : kTile;
    const T* xr = x + row * x_stride + start;
    Bits keys[ITEMS];
    unsigned short pos[ITEMS];
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int p = Sorter::slot(i);
      pos[i] = static_cast<unsigned short>(p);
      keys[i] = p < len ? sort_key(xr[p], descending != 0) : static_cast<Bits>(~Bits(0));
    }
    Sorter::template sort<true>(temp, keys, pos, SortKey<T>::kBits);
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int p = i * THREADS + threadIdx.x;
      if (p < len) {
        keys_out[row * n + start + p] = keys[i];
        pos_out[row * n + start + p] = static_cast<int>(start + pos[i]);
      }
    }
  }
}

// One merge round: in every row, runs [2k * run, (2k + 1) * run) and [(2k + 1) * run,
// (2k + 2) * run) (clipped to n; a last run without a partner is copied) merged into one, stable
// (on equal keys the first run's element goes first). Each thread writes RAWOPS_SORT_MERGE_ITEMS
// consecutive outputs: a binary search of the merge path finds how many of the first run's
// elements precede its first output, then it merges sequentially. FINAL: the last round writes
// values (gathered from x; skipped when values is null) and int64 indices instead of keys and
// positions.
template <typename Bits, typename T, bool FINAL>
__device__ __forceinline__ void merge_runs(const Bits* __restrict__ keys_in, const int* __restrict__ pos_in,
                                           Bits* __restrict__ keys_out, int* __restrict__ pos_out,
                                           const T* __restrict__ x, T* __restrict__ values,
                                           int64_t* __restrict__ indices, int64_t rows, int64_t n, int64_t x_stride,
                                           int64_t run) {
  constexpr int kItems = RAWOPS_SORT_MERGE_ITEMS;
  const int64_t per_row = (n + kItems - 1) / kItems;
  const int64_t total = rows * per_row;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = t / per_row;
    const int64_t first = (t - row * per_row) * kItems;  // output index in the row
    const int64_t pair = first / (2 * run) * (2 * run);
    const int64_t a_len = n - pair < run ? n - pair : run;
    const int64_t b_start = pair + a_len;
    const int64_t b_len = n - b_start < run ? n - b_start : run;
    const Bits* A = keys_in + row * n + pair;
    const Bits* B = A + a_len;
    const int* A_pos = pos_in + row * n + pair;
    const int* B_pos = A_pos + a_len;
    const int64_t d = first - pair;
    int64_t lo = d - b_len > 0 ? d - b_len : 0, hi = d < a_len ? d : a_len;
    while (lo < hi) {
      const int64_t mid = (lo + hi) >> 1;
      if (A[mid] <= B[d - 1 - mid]) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    int64_t i = lo, j = d - lo;
    const int64_t end = first + kItems < pair + a_len + b_len ? first + kItems : pair + a_len + b_len;
    Bits a = i < a_len ? A[i] : Bits(0), b = j < b_len ? B[j] : Bits(0);
    for (int64_t o = first; o < end; ++o) {
      const bool take_a = j >= b_len || (i < a_len && a <= b);
      Bits key;
      int p;
      if (take_a) {
        key = a;
        p = A_pos[i];
        ++i;
        if (i < a_len) a = A[i];
      } else {
        key = b;
        p = B_pos[j];
        ++j;
        if (j < b_len) b = B[j];
      }
      if constexpr (FINAL) {
        if (values) values[row * n + o] = x[row * x_stride + p];
        indices[row * n + o] = p;
      } else {
        keys_out[row * n + o] = key;
        pos_out[row * n + o] = p;
      }
    }
  }
}

// ------------------------------------------------------------------------------ block merge
template <typename Bits> struct Less {
  __device__ __forceinline__ bool operator()(Bits a, Bits b) const { return a < b; }
};

// The stable merge-path split of diagonal d of sorted runs A (a_len keys) and B (b_len): how
// many of A's keys are among the first d outputs, A's first on equal keys (A[mid] <= B[d - 1 -
// mid] holds below the answer and fails from it). One warp finds it, every lane calling with the
// same arguments: a step probes 32 points of the remaining interval at once, so a split in a run
// of 2^15 keys costs 4 dependent rounds of loads instead of a binary search's 15.
template <typename Bits>
__device__ __forceinline__ int64_t warp_merge_path(const Bits* __restrict__ A, int64_t a_len,
                                                   const Bits* __restrict__ B, int64_t b_len, int64_t d) {
  const int lane = threadIdx.x & 31;
  int64_t lo = d - b_len > 0 ? d - b_len : 0, hi = d < a_len ? d : a_len;  // the answer is in [lo, hi]
  while (lo < hi) {
    const int64_t step = (hi - lo + 31) >> 5;
    const int64_t mid = lo + lane * step;
    const bool before = mid < hi && A[mid] <= B[d - 1 - mid];
    const int count = __popc(__ballot_sync(0xffffffffu, before));  // the predicate is monotone: a prefix
    if (count == 0) {
      hi = lo;
    } else {
      const int64_t failed = lo + count * step;  // the first probe that failed, or past hi
      lo += (count - 1) * step + 1;
      hi = failed < hi ? failed : hi;
    }
  }
  return lo;
}

// One merge round as merge_runs does it (same runs, same stable order, same FINAL outputs), one
// block a window of THREADS * ITEMS consecutive outputs of a row (a power of two dividing 2 * run,
// so a window never spans two run pairs): warps 0 and 1 find the window's two merge-path splits
// in global memory, the block stages the two input ranges (keys and positions, coalesced) in
// shared memory, each thread merges ITEMS outputs there (cub::MergePath on its diagonal, then
// cub::SerialMerge), and the block writes the window coalesced through a padded shared transpose.
// FINAL: values decoded from the keys (sort_value: desc says which way they were made) and
// gathered from x by position only for NaN and zero keys.
template <typename Bits, typename T, bool FINAL, int THREADS, int ITEMS>
__device__ __forceinline__ void block_merge(const Bits* __restrict__ keys_in, const int* __restrict__ pos_in,
                                            Bits* __restrict__ keys_out, int* __restrict__ pos_out,
                                            const T* __restrict__ x, T* __restrict__ values,
                                            int64_t* __restrict__ indices, int64_t rows, int64_t n, int64_t x_stride,
                                            int64_t run, int64_t desc) {
  constexpr int kWindow = THREADS * ITEMS;
  constexpr int kPadded = kWindow + kWindow / 32;  // slot o at o + o / 32: blocked stores conflict-free
  static_assert(THREADS >= 64 && THREADS % 32 == 0 && (kWindow & (kWindow - 1)) == 0, "block_merge shape");
  static_assert(kWindow / 32 >= ITEMS + 1, "the serial merge's reads past a range stay in the buffer");
  __shared__ Bits s_keys[kPadded];
  __shared__ int s_pos[kPadded];
  __shared__ int64_t s_split[2];
  const int64_t windows = (n + kWindow - 1) / kWindow;
  for (int64_t w = blockIdx.x; w < rows * windows; w += gridDim.x) {
    const int64_t row = w / windows;
    const int64_t first = (w - row * windows) * kWindow;  // the window's first output in the row
    const int64_t pair = first / (2 * run) * (2 * run);
    const int64_t a_len = n - pair < run ? n - pair : run;
    const int64_t b_len = n - pair - a_len < run ? n - pair - a_len : run;
    const int64_t d0 = first - pair;
    const int64_t d1 = d0 + kWindow < a_len + b_len ? d0 + kWindow : a_len + b_len;
    const Bits* A = keys_in + row * n + pair;
    const Bits* B = A + a_len;
    const int* A_pos = pos_in + row * n + pair;
    const int* B_pos = A_pos + a_len;
    const int warp = threadIdx.x >> 5;
    if (warp < 2) {
      const int64_t split = warp_merge_path(A, a_len, B, b_len, warp ? d1 : d0);
      if ((threadIdx.x & 31) == 0) s_split[warp] = split;
    }
    __syncthreads();
    const int64_t a0 = s_split[0], b0 = d0 - a0;
    const int la = static_cast<int>(s_split[1] - a0);
    const int total = static_cast<int>(d1 - d0);
    const int lb = total - la;
    // A's range at [0, la), B's at [la, total)
#pragma unroll
    for (int r = 0; r < ITEMS; ++r) {
      const int k = r * THREADS + threadIdx.x;
      if (k < total) {
        const bool from_a = k < la;
        const int64_t at = from_a ? a0 + k : b0 + (k - la);
        s_keys[k] = from_a ? A[at] : B[at];
        s_pos[k] = from_a ? A_pos[at] : B_pos[at];
      }
    }
    __syncthreads();
    // cub's merge path and serial merge: B's key goes first only when strictly less (stable);
    // outputs past total are garbage, never stored (the serial merge's reads past a range stay
    // inside the padded buffer: total + ITEMS <= kPadded)
    const int diag = threadIdx.x * ITEMS < total ? threadIdx.x * ITEMS : total;
    const int i = cub::MergePath(s_keys, s_keys + la, la, lb, diag, Less<Bits>());
    Bits out_keys[ITEMS];
    int from[ITEMS], out_pos[ITEMS];
    cub::SerialMerge(s_keys, i, la + diag - i, la - i, lb - (diag - i), out_keys, from, Less<Bits>());
#pragma unroll
    for (int r = 0; r < ITEMS; ++r) out_pos[r] = diag + r < total ? s_pos[from[r]] : 0;
    __syncthreads();
#pragma unroll
    for (int r = 0; r < ITEMS; ++r) {
      const int o = threadIdx.x * ITEMS + r;
      if (o < total) {
        s_keys[o + (o >> 5)] = out_keys[r];
        s_pos[o + (o >> 5)] = out_pos[r];
      }
    }
    __syncthreads();
    const int64_t out = row * n + first;
#pragma unroll
    for (int r = 0; r < ITEMS; ++r) {
      const int o = r * THREADS + threadIdx.x;
      if (o < total) {
        const int p = s_pos[o + (o >> 5)];
        if constexpr (FINAL) {
          if (values) {  // the keys are sort_key(x, desc): decoded back where exact
            T v;
            if (!sort_value<T>(s_keys[o + (o >> 5)], desc != 0, &v)) v = x[row * x_stride + p];
            values[out + o] = v;
          }
          indices[out + o] = p;
        } else {
          keys_out[out + o] = s_keys[o + (o >> 5)];
          pos_out[out + o] = p;
        }
      }
    }
    __syncthreads();  // the shared buffers are reused by the next window
  }
}

// ------------------------------------------------------------------------------ merge network
// One warp a row of n <= 32 * ITEMS keys 16 or 32 bits wide: a bitonic sorting network over
// (key, position) packed into one word (key above, position below: 32-bit words for 16-bit keys,
// 64-bit for 32-bit ones), so every word is distinct and the network's order is the stable
// order. Each lane holds ITEMS slots in one of two layouts: blocked (slot lane * ITEMS + i) or
// striped (slot i * 32 + lane). A compare-exchange of slots j apart stays in one thread's
// registers when j < ITEMS (blocked) or j >= 32 (striped), else goes through shuffles. TRANSPOSE:
// the warp switches layout (through its padded slice of shared memory, slot s at s + s / 32:
// conflict-free both ways) whenever that turns a shuffle stage into a register stage; else it
// stays blocked. No barrier but the warp's. Loads are striped and coalesced (which slot holds
// which key does not matter to a sorting network), padding the largest key with positions >= n;
// the sorted slots are stored from the striped layout (a last transpose), coalesced, values
// decoded from the keys (sort_value), gathered from x by position only for NaN and zero keys.
template <typename Bits> struct NetWord;
template <> struct NetWord<unsigned short> { using Type = unsigned; };
template <> struct NetWord<unsigned> { using Type = unsigned long long; };

template <typename Word, int ITEMS>
__device__ __forceinline__ void net_transpose(Word (&v)[ITEMS], Word* own, bool to_striped) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int s = to_striped ? lane * ITEMS + i : i * 32 + lane;
    own[s + (s >> 5)] = v[i];
  }
  __syncwarp();
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int s = to_striped ? i * 32 + lane : lane * ITEMS + i;
    v[i] = own[s + (s >> 5)];
  }
  __syncwarp();  // the slice may be rewritten next
}

template <typename T, int ITEMS, bool TRANSPOSE>
__device__ __forceinline__ void sort_net(const T* __restrict__ x, T* __restrict__ values,
                                         int64_t* __restrict__ indices, int64_t rows, int64_t n, int64_t x_stride,
                                         int64_t descending) {
  using Bits = typename SortKey<T>::Bits;
  using Word = typename NetWord<Bits>::Type;
  constexpr int kShift = 8 * sizeof(Bits);
  constexpr Word kPosMask = (Word(1) << kShift) - 1;
  constexpr int kSlots = 32 * ITEMS + ITEMS;
  __shared__ Word s_words[RAWOPS_SORT_NET_THREADS / 32][kSlots];
  Word* own = s_words[threadIdx.x >> 5];
  const int lane = threadIdx.x & 31;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t warps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  for (int64_t row = warp; row < rows; row += warps) {
    const T* xr = x + row * x_stride;
    Word v[ITEMS];
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int p = i * 32 + lane;
      const Bits key = p < n ? sort_key(xr[p], descending != 0) : static_cast<Bits>(~Bits(0));
      v[i] = (static_cast<Word>(key) << kShift) | static_cast<Word>(p);
    }
    bool striped = false;  // the layout: known at every point once the loops unroll
#pragma unroll
    for (int k = 2; k <= 32 * ITEMS; k <<= 1) {
#pragma unroll
      for (int j = k >> 1; j > 0; j >>= 1) {
        if (TRANSPOSE && (striped ? j < 32 && j < ITEMS : j >= 32)) {
          net_transpose(v, own, !striped);
          striped = !striped;
        }
        if (striped ? j >= 32 : j < ITEMS) {  // both slots in this thread: registers i and i ^ r
          const int r = striped ? j / 32 : j;
#pragma unroll
          for (int i = 0; i < ITEMS; ++i) {
            if ((i & r) == 0) {
              const int s = striped ? i * 32 + lane : lane * ITEMS + i;
              const bool ascending = (s & k) == 0;
              const Word first = v[i], second = v[i | r];
              const bool swap = (second < first) == ascending;
              v[i] = swap ? second : first;
              v[i | r] = swap ? first : second;
            }
          }
        } else {  // the partner slot is in lane ^ l, same register
          const int l = striped ? j : j / ITEMS;
          const bool lower = (lane & l) == 0;
#pragma unroll
          for (int i = 0; i < ITEMS; ++i) {
            const int s = striped ? i * 32 + lane : lane * ITEMS + i;
            const bool ascending = (s & k) == 0;
            const Word other = shfl_xor(v[i], l);
            v[i] = ((other < v[i]) == (lower == ascending)) ? other : v[i];
          }
        }
      }
    }
    if (!striped) net_transpose(v, own, true);
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int s = i * 32 + lane;
      if (s < n) {
        const int p = static_cast<int>(v[i] & kPosMask);
        if (values) {
          T value;
          if (!sort_value<T>(static_cast<Bits>(v[i] >> kShift), descending != 0, &value)) value = xr[p];
          values[row * n + s] = value;
        }
        indices[row * n + s] = p;
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

// dev: RAWOPS_DEV_SORT_TILE_MIN_BLOCKS=B builds the one-block-a-row tiles with __launch_bounds__(THREADS, B)
// (registers capped so B blocks fit an SM; dev/time_sort_occupancy.py); unset, the shipped bounds.
#ifdef RAWOPS_DEV_SORT_TILE_MIN_BLOCKS
#define RAWOPS_SORT_TILE_BOUNDS(THREADS) __launch_bounds__(THREADS, RAWOPS_DEV_SORT_TILE_MIN_BLOCKS)
#else
#define RAWOPS_SORT_TILE_BOUNDS(THREADS) __launch_bounds__(THREADS)
#endif

#define RAWOPS_SORT_TILE(T, suffix, THREADS, ITEMS, RANK, EARLY)                                             \
  extern "C" __global__ void RAWOPS_SORT_TILE_BOUNDS(THREADS)                                                  \
      sort_rows_##THREADS##x##ITEMS##_##RANK##_##suffix(RAWOPS_SORT_ARGS(T)) {                                 \
    rawops::sort_rows<T, THREADS, ITEMS, EARLY>(x, values, indices, rows, n, x_stride, descending);           \
  }

// Each tile in both rankings (rawops/sorting.py's RANKING picks one).
#define RAWOPS_SORT_TILE_PAIR(T, suffix, THREADS, ITEMS) \
  RAWOPS_SORT_TILE(T, suffix, THREADS, ITEMS, match, false) \
  RAWOPS_SORT_TILE(T, suffix, THREADS, ITEMS, early, true)

// The chunk sort of the merge path, from the largest tile, in both rankings.
#define RAWOPS_SORT_CHUNKS_RANK(T, suffix, THREADS, ITEMS, RANK, EARLY)                                           \
  extern "C" __global__ void __launch_bounds__(THREADS) sort_chunks_##THREADS##x##ITEMS##_##RANK##_##suffix(     \
      const T *x, typename rawops::SortKey<T>::Bits *keys, int *pos, long long rows, long long n,               \
      long long x_stride, long long descending) {                                                               \
    rawops::sort_chunks<T, THREADS, ITEMS, EARLY>(x, keys, pos, rows, n, x_stride, descending);                  \
  }
#define RAWOPS_SORT_CHUNKS(T, suffix, THREADS, ITEMS)                \
  RAWOPS_SORT_CHUNKS_RANK(T, suffix, THREADS, ITEMS, match, false)   \
  RAWOPS_SORT_CHUNKS_RANK(T, suffix, THREADS, ITEMS, early, true)    \
  extern "C" __global__ void __launch_bounds__(RAWOPS_SORT_STREAM_THREADS) sort_merge_final_##suffix(            \
      const typename rawops::SortKey<T>::Bits *keys, const int *pos, const T *x, T *values, long long *indices,  \
      long long rows, long long n, long long x_stride, long long run) {                                          \
    rawops::merge_runs<typename rawops::SortKey<T>::Bits, T, true>(keys, pos, nullptr, nullptr, x, values,       \
                                                                    indices, rows, n, x_stride, run);           \
  }                                                                                                              \
  extern "C" __global__ void __launch_bounds__(RAWOPS_SORT_BMERGE_THREADS) sort_bmerge_final_##suffix(           \
      const typename rawops::SortKey<T>::Bits *keys, const int *pos, const T *x, T *values, long long *indices,  \
      long long rows, long long n, long long x_stride, long long run, long long descending) {                    \
    rawops::block_merge<typename rawops::SortKey<T>::Bits, T, true, RAWOPS_SORT_BMERGE_THREADS,                  \
                        RAWOPS_SORT_BMERGE_ITEMS>(keys, pos, nullptr, nullptr, x, values, indices, rows, n,      \
                                                  x_stride, run, descending);                                   \
  }

// The merge networks (16- and 32-bit keys): one warp a row of up to 32 x ITEMS keys, exchanging
// slots through shuffles only (shfl) or switching layouts through shared memory (smem).
#define RAWOPS_SORT_NET(T, suffix, ITEMS)                                                        \
  extern "C" __global__ void __launch_bounds__(RAWOPS_SORT_NET_THREADS)                          \
      sort_net_shfl_##ITEMS##_##suffix(RAWOPS_SORT_ARGS(T)) {                                    \
    rawops::sort_net<T, ITEMS, false>(x, values, indices, rows, n, x_stride, descending);        \
  }                                                                                              \
  extern "C" __global__ void __launch_bounds__(RAWOPS_SORT_NET_THREADS)                          \
      sort_net_smem_##ITEMS##_##suffix(RAWOPS_SORT_ARGS(T)) {                                    \
    rawops::sort_net<T, ITEMS, true>(x, values, indices, rows, n, x_stride, descending);         \
  }

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

// The tiles (threads x keys a thread) rawops/sorting.py's TILE_CANDIDATES lists (WIDE_CANDIDATES
// for 64-bit keys); its TILES takes one a size. Every key width has these:
#define RAWOPS_SORT_TILES_UP_TO_4096(T, suffix) \
  RAWOPS_SORT_WARP(T, suffix)                  \
  RAWOPS_SORT_TILE_PAIR(T, suffix, 32, 4)      \
  RAWOPS_SORT_TILE_PAIR(T, suffix, 32, 8)      \
  RAWOPS_SORT_TILE_PAIR(T, suffix, 32, 16)     \
  RAWOPS_SORT_TILE_PAIR(T, suffix, 64, 8)      \
  RAWOPS_SORT_TILE_PAIR(T, suffix, 64, 16)     \
  RAWOPS_SORT_TILE_PAIR(T, suffix, 128, 8)     \
  RAWOPS_SORT_TILE_PAIR(T, suffix, 128, 16)    \
  RAWOPS_SORT_TILE_PAIR(T, suffix, 256, 8)     \
  RAWOPS_SORT_TILE_PAIR(T, suffix, 256, 16)    \
  RAWOPS_SORT_TILE_PAIR(T, suffix, 512, 8)

#define RAWOPS_SORT_TILES_NARROW(T, suffix)    \
  RAWOPS_SORT_TILES_UP_TO_4096(T, suffix)      \
  RAWOPS_SORT_TILE_PAIR(T, suffix, 512, 16)    \
  RAWOPS_SORT_CHUNKS(T, suffix, 512, 16)       \
  RAWOPS_SORT_NET(T, suffix, 4)                \
  RAWOPS_SORT_NET(T, suffix, 8)                \
  RAWOPS_SORT_NET(T, suffix, 16)               \
  RAWOPS_SORT_NET(T, suffix, 32)               \
  RAWOPS_SORT_LONG(T, suffix)

// 64-bit keys: an 8192-key tile would need 64 KB of exchange space; rows past 4096 go long.
#define RAWOPS_SORT_TILES_WIDE(T, suffix)      \
  RAWOPS_SORT_TILES_UP_TO_4096(T, suffix)      \
  RAWOPS_SORT_CHUNKS(T, suffix, 256, 16)       \
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

#define RAWOPS_SORT_MERGE(Bits, suffix)                                                                        \
  extern "C" __global__ void __launch_bounds__(RAWOPS_SORT_STREAM_THREADS)                                     \
      sort_merge_##suffix(const Bits *keys_in, const int *pos_in, Bits *keys_out, int *pos_out, long long rows, \
                          long long n, long long run) {                                                        \
    rawops::merge_runs<Bits, float, false>(keys_in, pos_in, keys_out, pos_out, nullptr, nullptr, nullptr, rows, \
                                           n, 0, run);                                                         \
  }

#define RAWOPS_SORT_BMERGE(Bits, suffix)                                                                       \
  extern "C" __global__ void __launch_bounds__(RAWOPS_SORT_BMERGE_THREADS)                                     \
      sort_bmerge_##suffix(const Bits *keys_in, const int *pos_in, Bits *keys_out, int *pos_out, long long rows, \
                           long long n, long long run) {                                                        \
    rawops::block_merge<Bits, float, false, RAWOPS_SORT_BMERGE_THREADS, RAWOPS_SORT_BMERGE_ITEMS>(              \
        keys_in, pos_in, keys_out, pos_out, nullptr, nullptr, nullptr, rows, n, 0, run, 0);                    \
  }

RAWOPS_SORT_PASS(unsigned short, k16)
RAWOPS_SORT_PASS(unsigned, k32)
RAWOPS_SORT_PASS(unsigned long long, k64)
RAWOPS_SORT_MERGE(unsigned short, k16)
RAWOPS_SORT_MERGE(unsigned, k32)
RAWOPS_SORT_MERGE(unsigned long long, k64)
RAWOPS_SORT_BMERGE(unsigned short, k16)
RAWOPS_SORT_BMERGE(unsigned, k32)
RAWOPS_SORT_BMERGE(unsigned long long, k64)
