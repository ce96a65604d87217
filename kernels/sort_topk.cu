// topk over rows, the sort family's third op: the k smallest selection keys of every row and
// their positions, the key being rawops::sort_key(x, largest) (sort_keys.cuh), so that
// largest=True selects the k largest values in torch's order (NaN above +inf) and
// largest=False the k smallest, and ascending key order is torch.topk's sorted order.
//
//   x        rows of n elements of T at x + row * x_stride (the row's elements consecutive)
//   values   T, indices int64: k per row (or per chunk, below), dense
//
// Two kernels, chosen by rawops/_sort_topk.py's plan (a pure function of rows, n, k, dtype and
// the SM count):
//
// topk_warp<K>_<sfx>   (k <= K <= 32; many rows) one warp per row, 8 rows per 256-thread
//   block. Each lane streams its share of the row in 16-byte loads and keeps its own K
//   smallest (key, position) pairs sorted in registers (an insertion behind a one-compare
//   rejection); then k rounds of a warp arg-min over the lanes' heads pop the row's k
//   winners in order. The row is read once: bytes = rows * (n * sizeof(T) + k * (sizeof(T) + 8)).
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
// offsets are 64-bit.
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

template <typename Bits>
__device__ __forceinline__ bool before(Bits a, unsigned pa, Bits b, unsigned pb) {
  return a < b || (a == b && pa < pb);
}

// ------------------------------------------------------------------------------ warp per row
template <typename T, int K>
__device__ __forceinline__ void topk_warp(const T* __restrict__ x, T* __restrict__ values,
                                          i64* __restrict__ indices, long long rows, long long n,
                                          long long x_stride, long long k, long long largest) {
  using Bits = typename SortKey<T>::Bits;
  const int lane = threadIdx.x & 31;
  const long long warps = static_cast<long long>(gridDim.x) * (kThreads / 32);
  for (long long row = static_cast<long long>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32; row < rows;
       row += warps) {
    const T* xr = x + row * x_stride;
    Bits key[K];
    unsigned pos[K];
#pragma unroll
    for (int j = 0; j < K; ++j) {
      key[j] = static_cast<Bits>(~Bits(0));
      pos[j] = kNoPos;
    }
    for_each_element(xr, n, lane, 32, [&](T v, long long i) {
      const Bits kv = rawops::sort_key(v, largest != 0);
      const unsigned pv = static_cast<unsigned>(i);
      if (before(kv, pv, key[K - 1], pos[K - 1])) {
        key[K - 1] = kv;
        pos[K - 1] = pv;
#pragma unroll
        for (int j = K - 1; j > 0; --j) {
          if (before(key[j], pos[j], key[j - 1], pos[j - 1])) {
            const Bits tk = key[j];
            key[j] = key[j - 1];
            key[j - 1] = tk;
            const unsigned tp = pos[j];
            pos[j] = pos[j - 1];
            pos[j - 1] = tp;
          }
        }
      }
    });
    // k rounds: the smallest head over the lanes is the round's winner; its lane pops it.
    // Positions are unique within a row, so exactly one lane holds each winner.
    unsigned mine = kNoPos;
    for (int r = 0; r < k; ++r) {
      Bits bk = key[0];
      unsigned bp = pos[0];
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1) {
        const Bits ok = shuffle_xor(bk, offset);
        const unsigned op = __shfl_xor_sync(0xffffffffu, bp, offset);
        if (before(ok, op, bk, bp)) {
          bk = ok;
          bp = op;
        }
      }
      if (pos[0] == bp) {
#pragma unroll
        for (int j = 0; j < K - 1; ++j) {
          key[j] = key[j + 1];
          pos[j] = pos[j + 1];
        }
        key[K - 1] = static_cast<Bits>(~Bits(0));
        pos[K - 1] = kNoPos;
      }
      if (lane == r) mine = bp;
    }
    if (lane < k) {
      values[row * k + lane] = xr[mine];
      indices[row * k + lane] = static_cast<i64>(mine);
    }
  }
}

// ------------------------------------------------------------------------------ radix select
template <typename T>
struct RadixShared {
  using Bits = typename SortKey<T>::Bits;
  using Scan = cub::BlockScan<unsigned, kThreads>;
  using Sort = cub::BlockRadixSort<Bits, kThreads, kSortItems, int>;
  unsigned hist[256];
  typename Scan::TempStorage scan;
  int digit, missing, whole, below, equal;
  union {
    struct {
      Bits key[kMaxK];
      int pos[kMaxK];
    } picked;
    typename Sort::TempStorage sort;
  };
};

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
      Bits keys[kSortItems];
      int pos[kSortItems];
#pragma unroll
      for (int j = 0; j < kSortItems; ++j) {
        const int i = t * kSortItems + j;
        keys[j] = i < k ? s.picked.key[i] : static_cast<Bits>(~Bits(0));
        pos[j] = i < k ? s.picked.pos[i] : -1;
      }
      __syncthreads();  // the sort's storage overlays the picked arrays
      typename S::Sort(s.sort).SortBlockedToStriped(keys, pos);
#pragma unroll
      for (int j = 0; j < kSortItems; ++j) {
        const int r = j * kThreads + t;
        if (r < k) {
          vo[r] = xr[pos[j]];
          io[r] = ir ? ir[pos[j]] : static_cast<i64>(pos[j]);
        }
      }
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

#define RAWOPS_TOPK_WARP(T, K, suffix)                                                                    \
  extern "C" __global__ void __launch_bounds__(kThreads) topk_warp##K##_##suffix(                         \
      const T* x, T* values, i64* indices, long long rows, long long n, long long x_stride, long long k, \
      long long largest) {                                                                                \
    topk_warp<T, K>(x, values, indices, rows, n, x_stride, k, largest);                                   \
  }

#define RAWOPS_TOPK_FAMILY(T, suffix)                                                                       \
  RAWOPS_TOPK_WARP(T, 4, suffix)                                                                            \
  RAWOPS_TOPK_WARP(T, 8, suffix)                                                                            \
  RAWOPS_TOPK_WARP(T, 16, suffix)                                                                           \
  RAWOPS_TOPK_WARP(T, 32, suffix)                                                                           \
  extern "C" __global__ void __launch_bounds__(kThreads) topk_radix_##suffix(                              \
      const T* x, const i64* in_idx, T* values, i64* indices, long long rows, long long n,          \
      long long x_stride, long long chunks, long long k, long long largest, long long sorted) {             \
    topk_radix<T>(x, in_idx, values, indices, rows, n, x_stride, chunks, k, largest, sorted);               \
  }

RAWOPS_TOPK_FAMILY(float, f32)
RAWOPS_TOPK_FAMILY(__half, f16)
RAWOPS_TOPK_FAMILY(__nv_bfloat16, bf16)
RAWOPS_TOPK_FAMILY(int, i32)
RAWOPS_TOPK_FAMILY(long long, i64)
