// topk over rows, the sorting family's third op: the k smallest selection keys of every row and
// their positions, the key being rawops::sort_key(x, largest) (sort_keys.cuh), so that
// largest=True selects the k largest values in torch's order (NaN above +inf) and
// largest=False the k smallest, and ascending key order is torch.topk's sorted order.
//
//   x        rows of n elements of T at x + row * x_stride (the row's elements consecutive)
//   values   T, indices int64: k per row (or per chunk, below), dense
//
// Two kernels, chosen by rawops/_sorting_topk.py's plan (a pure function of rows, n, k, dtype and
// the SM count):
//
// topk_warp_<sfx>   (k <= 32; many rows) one warp per row, 8 rows per 256-thread block. The
//   warp keeps the 32 smallest pairs seen, one per lane, and their k-th as a threshold; each
//   element costs a compare with it, the few below it are appended to a candidate ring in
//   shared memory (ballot-ranked) and merged 32 at a time (a warp bitonic sort and merge),
//   which lowers the threshold. The row is read once:
//   bytes = rows * (n * sizeof(T) + k * (sizeof(T) + 8)).
//
// topk_radix_<sfx>   (any k <= 1024) one 256-thread block per (row, chunk), the row cut into
//   `chunks` near-equal chunks of at least k elements each. A radix select over 8-bit digits,
//   most significant first: each pass builds the 256-bin histogram of the digit among the
//   elements matching the prefix fixed so far (shared-memory atomics) and a block scan finds
//   the bin holding the k-th smallest key; a pass whose bin is taken whole ends the search.
//   A last pass gathers the elements below the prefix and as many equal ones as the count
//   still missing (ties: any of them, as in torch). sorted != 0 then orders the k winners
//   with cub::BlockRadixSort (stable; padding keys sort after real ones). Few long rows
//   (chunks > 1): the chunks' unsorted candidates go to scratch, and a second launch of the
//   same kernel selects each row's k among its chunks * k candidates, reading their row
//   positions through in_idx. Every pass rereads the chunk (from L2 after the first).
//
// Positions inside a row are 32-bit (the plan refuses rows of 2^31 elements or more); row
// offsets are 64-bit. Loads are 16-byte vectors after a row's unaligned head.
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_scan.cuh>

#include "rawops/dtype.cuh"
#include "rawops/sort_keys.cuh"

namespace {

using i64 = long long;  // indices: torch.int64
using rawops::SortKey;

constexpr int kThreads = 256;        // both kernels' block
constexpr int kMaxK = 1024;          // radix select's largest k: kThreads * kSortItems
constexpr int kSortItems = kMaxK / kThreads;
constexpr int kRadixBlocksPerSM = 4;  // radix select: registers capped so that 4 blocks share an SM
constexpr int kUnroll = 4;           // 16-byte loads in flight per thread before any is used
constexpr unsigned kNoPos = 0x7fffffffu;  // an empty register slot's position: after every real one

// f(value, position) for every element of p[0, len) that thread `lane` of `lanes` owns: the
// elements before the first 16-byte boundary one by one, then 16-byte vectors (kUnroll in
// flight), then the tail. p is element-aligned; positions rise along each thread's calls.
template <typename T, typename F>
__device__ __forceinline__ void for_each_element(const T* p, long long len, int lane, int lanes, F&& f) {
  constexpr int V = 16 / sizeof(T);
  long long head = static_cast<long long>(((16 - (reinterpret_cast<unsigned long long>(p) & 15)) & 15) / sizeof(T));
  if (head > len) head = len;
  for (long long i = lane; i < head; i += lanes) f(p[i], i);
  const long long vectors = (len - head) / V;
  const uint4* pv = reinterpret_cast<const uint4*>(p + head);
  long long v = lane;
  for (; v + (kUnroll - 1) * lanes < vectors; v += kUnroll * lanes) {
    uint4 u[kUnroll];
#pragma unroll
    for (int q = 0; q < kUnroll; ++q) u[q] = __ldg(pv + v + q * lanes);
#pragma unroll
    for (int q = 0; q < kUnroll; ++q) {
      const T* e = reinterpret_cast<const T*>(&u[q]);
#pragma unroll
      for (int j = 0; j < V; ++j) f(e[j], head + (v + q * lanes) * V + j);
    }
  }
  for (; v < vectors; v += lanes) {
    const uint4 u = __ldg(pv + v);
    const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
    for (int j = 0; j < V; ++j) f(e[j], head + v * V + j);
  }
  for (long long i = head + vectors * V + lane; i < len; i += lanes) f(p[i], i);
}

// A key from lane `lane ^ offset`: 16-bit keys travel as 32-bit words.
template <typename Bits> __device__ __forceinline__ Bits shuffle_xor(Bits v, int offset) {
  return static_cast<Bits>(__shfl_xor_sync(0xffffffffu, static_cast<unsigned>(v), offset));
}
template <> __device__ __forceinline__ unsigned long long shuffle_xor(unsigned long long v, int offset) {
  return __shfl_xor_sync(0xffffffffu, v, offset);
}

// A key from lane `source`.
template <typename Bits> __device__ __forceinline__ Bits shuffle_from(Bits v, int source) {
  return static_cast<Bits>(__shfl_sync(0xffffffffu, static_cast<unsigned>(v), source));
}
template <> __device__ __forceinline__ unsigned long long shuffle_from(unsigned long long v, int source) {
  return __shfl_sync(0xffffffffu, v, source);
}

template <typename Bits>
__device__ __forceinline__ bool before(Bits a, unsigned pa, Bits b, unsigned pb) {
  return a < b || (a == b && pa < pb);
}

// ------------------------------------------------------------------------------ warp filter
// One warp per row, k <= 32: the warp's list of the 32 smallest (key, position) pairs seen so
// far, one per lane in ascending lane order, and its k-th entry as the threshold. Every element
// is compared with the threshold (one compare: most fail once the list has filled); those
// below it are appended to the warp's ring of candidates in shared memory (ballot-ranked), and
// every 32 candidates are sorted across the warp (bitonic) and merged into the list (the
// pairwise minimum with the reversed list, then a bitonic merge), which lowers the threshold.
// Any element above the threshold has k seen ones before it, so the list ends holding the
// row's k smallest, in order. Loops are warp-uniform (the ballots need every lane).

// The ring: candidates appended between two flushes (a vector's elements per lane, 32 lanes)
// plus the 31 a flush may leave, rounded up to a power of two.
template <typename T> struct Ring {
  static constexpr int kVector = 16 / sizeof(T);
  static constexpr int kNeed = 32 * (kVector + 1);
  static constexpr int kSize = kNeed <= 128 ? 128 : kNeed <= 256 ? 256 : 512;
};

// One compare-exchange of a bitonic network: lanes `stride` apart, the lower lane keeping the
// smaller pair of an ascending block and the larger of a descending one.
template <typename Bits>
__device__ __forceinline__ void exchange(Bits& key, unsigned& pos, int lane, int stride, bool ascending) {
  const Bits ok = shuffle_xor(key, stride);
  const unsigned op = __shfl_xor_sync(0xffffffffu, pos, stride);
  const bool lower = (lane & stride) == 0;
  if (lower == ascending ? before(ok, op, key, pos) : before(key, pos, ok, op)) {
    key = ok;
    pos = op;
  }
}

// The list (ascending over lanes) becomes the 32 smallest of itself and 32 candidates.
template <typename Bits>
__device__ __forceinline__ void merge_candidates(Bits& lk, unsigned& lp, Bits ck, unsigned cp, int lane) {
#pragma unroll
  for (int size = 2; size <= 32; size <<= 1) {
#pragma unroll
    for (int stride = size >> 1; stride > 0; stride >>= 1) exchange(ck, cp, lane, stride, (lane & size) == 0);
  }
  const Bits rk = shuffle_xor(ck, 31);  // the candidates reversed: min with the list is bitonic
  const unsigned rp = __shfl_xor_sync(0xffffffffu, cp, 31);
  if (before(rk, rp, lk, lp)) {
    lk = rk;
    lp = rp;
  }
#pragma unroll
  for (int stride = 16; stride > 0; stride >>= 1) exchange(lk, lp, lane, stride, true);
}

template <typename T>
__device__ __forceinline__ void topk_warp_filter(const T* __restrict__ x, T* __restrict__ values,
                                                 i64* __restrict__ indices, long long rows, long long n,
                                                 long long x_stride, long long k, long long largest) {
  using Bits = typename SortKey<T>::Bits;
  constexpr int V = 16 / sizeof(T);
  constexpr int kRing = Ring<T>::kSize;
  constexpr int kWarps = kThreads / 32;
  constexpr Bits kNoKey = static_cast<Bits>(~Bits(0));
  __shared__ Bits ring_key[kWarps][kRing];
  __shared__ unsigned ring_pos[kWarps][kRing];
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  Bits* rk = ring_key[warp];
  unsigned* rp = ring_pos[warp];
  const bool desc = largest != 0;
  const unsigned below_me = (1u << lane) - 1u;
  for (long long row = static_cast<long long>(blockIdx.x) * kWarps + warp; row < rows;
       row += static_cast<long long>(gridDim.x) * kWarps) {
    const T* xr = x + row * x_stride;
    Bits lk = kNoKey, tk = kNoKey;  // the list's entry of this lane; the threshold (entry k-1)
    unsigned lp = kNoPos, tp = kNoPos;
    int first = 0, count = 0;  // the ring's unmerged candidates (warp-uniform)
    auto flush = [&]() {       // merge the ring's first min(count, 32) candidates
      __syncwarp();
      Bits ck = kNoKey;
      unsigned cp = kNoPos;
      if (lane < count) {
        ck = rk[(first + lane) & (kRing - 1)];
        cp = rp[(first + lane) & (kRing - 1)];
      }
      __syncwarp();
      const int taken = count < 32 ? count : 32;
      first = (first + taken) & (kRing - 1);
      count -= taken;
      merge_candidates(lk, lp, ck, cp, lane);
      tk = shuffle_from(lk, static_cast<int>(k - 1));
      tp = __shfl_sync(0xffffffffu, lp, static_cast<int>(k - 1));
    };
    auto offer = [&](T v, long long i, bool valid) {
      const Bits kv = rawops::sort_key(v, desc);
      const unsigned pv = static_cast<unsigned>(i);
      const bool pass = valid && before(kv, pv, tk, tp);
      const unsigned m = __ballot_sync(0xffffffffu, pass);
      if (pass) {
        const int slot = (first + count + __popc(m & below_me)) & (kRing - 1);
        rk[slot] = kv;
        rp[slot] = pv;
      }
      count += __popc(m);
    };
    // Elements before the row's first 16-byte boundary, then vectors, then the tail: every
    // lane takes each step, those without an element offering nothing.
    long long head = static_cast<long long>(((16 - (reinterpret_cast<unsigned long long>(xr) & 15)) & 15) / sizeof(T));
    if (head > n) head = n;
    offer(lane < head ? xr[lane] : T(), lane, lane < head);
    const long long vectors = (n - head) / V;
    const uint4* xv = reinterpret_cast<const uint4*>(xr + head);
    for (long long base = 0; base < vectors; base += 32 * kUnroll) {
      uint4 u[kUnroll];
#pragma unroll
      for (int q = 0; q < kUnroll; ++q) {
        const long long vi = base + q * 32 + lane;
        if (vi < vectors) u[q] = __ldg(xv + vi);
      }
#pragma unroll
      for (int q = 0; q < kUnroll; ++q) {
        const long long vi = base + q * 32 + lane;
        const T* e = reinterpret_cast<const T*>(&u[q]);
#pragma unroll
        for (int j = 0; j < V; ++j) offer(e[j], head + vi * V + j, vi < vectors);
        while (count >= 32) flush();
      }
    }
    const long long done = head + vectors * V;
    offer(done + lane < n ? xr[done + lane] : T(), done + lane, done + lane < n);
    while (count > 0) flush();
    if (lane < k) {
      values[row * k + lane] = xr[lp];
      indices[row * k + lane] = static_cast<i64>(lp);
    }
  }
}

// ------------------------------------------------------------------------------ radix select
template <typename T>
struct RadixShared {
  using Bits = typename SortKey<T>::Bits;
  using Scan = cub::BlockScan<unsigned, kThreads>;
  template <int ITEMS> using Sort = cub::BlockRadixSort<Bits, kThreads, ITEMS, int>;
  unsigned hist[256];
  typename Scan::TempStorage scan;
  int digit, missing, whole, below, equal;
  union {
    struct {
      Bits key[kMaxK];
      int pos[kMaxK];
    } picked;
    typename Sort<1>::TempStorage sort1;
    typename Sort<2>::TempStorage sort2;
    typename Sort<kSortItems>::TempStorage sort4;
  };
  template <int ITEMS> __device__ __forceinline__ typename Sort<ITEMS>::TempStorage& sort() {
    if constexpr (ITEMS == 1) return sort1;
    else if constexpr (ITEMS == 2) return sort2;
    else return sort4;
  }
};

// The k picked pairs in ascending key order (stable: the padding after real keys), each
// written as its value (gathered from the row) and index; the sort as wide as k needs.
template <typename T, int ITEMS>
__device__ __forceinline__ void sort_and_write(RadixShared<T>& s, int t, long long k, const T* xr, const i64* ir,
                                               T* vo, i64* io) {
  using Bits = typename SortKey<T>::Bits;
  Bits keys[ITEMS];
  int pos[ITEMS];
#pragma unroll
  for (int j = 0; j < ITEMS; ++j) {
    const int i = t * ITEMS + j;
    keys[j] = i < k ? s.picked.key[i] : static_cast<Bits>(~Bits(0));
    pos[j] = i < k ? s.picked.pos[i] : -1;
  }
  __syncthreads();  // the sort's storage overlays the picked arrays
  typename RadixShared<T>::template Sort<ITEMS>(s.template sort<ITEMS>()).SortBlockedToStriped(keys, pos);
#pragma unroll
  for (int j = 0; j < ITEMS; ++j) {
    const int r = j * kThreads + t;
    if (r < k) {
      vo[r] = xr[pos[j]];
      io[r] = ir ? ir[pos[j]] : static_cast<i64>(pos[j]);
    }
  }
}

template <typename T>
__device__ __forceinline__ void topk_radix(const T* __restrict__ x, const i64* __restrict__ in_idx,
                                           T* __restrict__ values, i64* __restrict__ indices, long long rows,
                                           long long n, long long x_stride, long long chunks, long long k,
                                           long long largest, long long sorted) {
  using Bits = typename SortKey<T>::Bits;
  using S = RadixShared<T>;
  __shared__ S s;
  const int t = threadIdx.x;
  const bool desc = largest != 0;
  for (long long b = blockIdx.x; b < rows * chunks; b += gridDim.x) {
    const long long row = b / chunks, c = b % chunks;
    const long long start = c * n / chunks, len = (c + 1) * n / chunks - start;
    const T* seg = x + row * x_stride + start;
    Bits prefix = 0, mask = 0;
    int missing = static_cast<int>(k);
    for (int shift = SortKey<T>::kBits - 8; shift >= 0; shift -= 8) {
      s.hist[t] = 0;
      __syncthreads();
      for_each_element(seg, len, t, kThreads, [&](T v, long long) {
        const Bits kv = rawops::sort_key(v, desc);
        if ((kv & mask) == prefix) atomicAdd(&s.hist[(kv >> shift) & 255], 1u);
      });
      __syncthreads();
      const unsigned h = s.hist[t];
      unsigned below;
      typename S::Scan(s.scan).ExclusiveSum(h, below);
      if (below < static_cast<unsigned>(missing) && static_cast<unsigned>(missing) <= below + h) {
        s.digit = t;
        s.missing = missing - static_cast<int>(below);
        s.whole = (below + h == static_cast<unsigned>(missing));
      }
      __syncthreads();
      prefix |= static_cast<Bits>(static_cast<Bits>(s.digit) << shift);
      mask |= static_cast<Bits>(static_cast<Bits>(255) << shift);
      missing = s.missing;
      const bool whole = s.whole;
      if (t == 0) {
        s.below = 0;
        s.equal = 0;
      }
      __syncthreads();
      if (whole) break;
    }
    // Keys under the mask below the prefix are all in; of those equal to it, `missing`.
    const int taken_below = static_cast<int>(k) - missing;
    for_each_element(seg, len, t, kThreads, [&](T v, long long i) {
      const Bits kv = rawops::sort_key(v, desc);
      const Bits km = kv & mask;
      int slot = -1;
      if (km < prefix) {
        slot = atomicAdd(&s.below, 1);
      } else if (km == prefix) {
        const int q = atomicAdd(&s.equal, 1);
        if (q < missing) slot = taken_below + q;
      }
      if (slot >= 0) {
        s.picked.key[slot] = kv;
        s.picked.pos[slot] = static_cast<int>(start + i);
      }
    });
    __syncthreads();
    const T* xr = x + row * x_stride;
    const i64* ir = in_idx ? in_idx + row * x_stride : nullptr;
    T* vo = values + b * k;
    i64* io = indices + b * k;
    if (sorted) {
      if (k <= kThreads) sort_and_write<T, 1>(s, t, k, xr, ir, vo, io);
      else if (k <= 2 * kThreads) sort_and_write<T, 2>(s, t, k, xr, ir, vo, io);
      else sort_and_write<T, kSortItems>(s, t, k, xr, ir, vo, io);
    } else {
      for (int r = t; r < k; r += kThreads) {
        const int p = s.picked.pos[r];
        vo[r] = xr[p];
        io[r] = ir ? ir[p] : static_cast<i64>(p);
      }
    }
    __syncthreads();
  }
}

}  // namespace

#define RAWOPS_TOPK_FAMILY(T, suffix)                                                                    \
  extern "C" __global__ void __launch_bounds__(kThreads) topk_warp_##suffix(                             \
      const T* x, T* values, i64* indices, long long rows, long long n, long long x_stride, long long k, \
      long long largest) {                                                                               \
    topk_warp_filter<T>(x, values, indices, rows, n, x_stride, k, largest);                              \
  }                                                                                                      \
  extern "C" __global__ void __launch_bounds__(kThreads, kRadixBlocksPerSM) topk_radix_##suffix(         \
      const T* x, const i64* in_idx, T* values, i64* indices, long long rows, long long n,               \
      long long x_stride, long long chunks, long long k, long long largest, long long sorted) {          \
    topk_radix<T>(x, in_idx, values, indices, rows, n, x_stride, chunks, k, largest, sorted);            \
  }

RAWOPS_TOPK_FAMILY(float, f32)
RAWOPS_TOPK_FAMILY(__half, f16)
RAWOPS_TOPK_FAMILY(__nv_bfloat16, bf16)
RAWOPS_TOPK_FAMILY(int, i32)
RAWOPS_TOPK_FAMILY(long long, i64)
