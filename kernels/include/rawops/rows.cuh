// Row-wise kernels (norm, softmax): one reduction per row over the last dim.
//
// Rows: row r of an operand starts at its pointer + r * its row stride (elements; any value,
// 0 and negative included, for a row-strided view such as x[:, :n] or x[::2]), and its n
// elements are consecutive. The host (rawops/_rows.py) passes each operand's stride; rows
// that are C-contiguous have stride n.
//
// Every row kernel runs in one of three modes, chosen by the host (rawops/_rows.py,
// row_plan) from the row width and passed as an argument, so that one extern "C" entry per
// op and dtype serves every width; the block size is the launch's (blockDim.x):
//   kWarpPerRow   256-thread blocks, 8 rows each, one warp per row, the row in registers;
//   kBlockPerRow  one row per block of 64..512 threads (the fewest powers of two that hold
//                 the row in registers): many small blocks per SM, so one row's reductions
//                 overlap other rows' loads (one 512-thread block holding a whole row in
//                 registers fills an SM alone: nothing overlaps its reductions);
//   kStreamRow    one row per block of 32..512 threads, read from memory once per pass: rows
//                 wider than the registers hold, and rows not on 16-byte boundaries (element
//                 by element, with bounds checks; a row stride that is not a whole number of
//                 16-byte vectors puts rows off them). The register modes thus only ever see
//                 16-byte vectors: compiled without the scalar path, they need no more than
//                 64 registers (with it, ptxas hoisted 32 element offsets and predicates per
//                 thread out of the row loop and spilled).
// Register layout (RowSlice): thread `lane` of a row's `width` threads holds 16-byte vectors
// j = lane, lane + width, ... (kFwdVectors forward, kBwdVectors backward), so a warp's loads
// are 512 contiguous bytes; they stay in the storage type (16-bit types packed two to a
// register) until used.
// NVRTC fallback: rawops/_modules.py adds CuPy's bundled CUB to NVRTC's include path;
// tests/test_nvrtc.py compiles every family that way (no GPU needed).
#pragma once

// Only the block and warp reductions: cub/cub.cuh also pulls in device-wide dispatch (host
// code), which NVRTC, the no-nvcc fallback, rejects.
#include <cub/block/block_reduce.cuh>
#include <cub/warp/warp_reduce.cuh>

#include "rawops/dtype.cuh"

namespace rawops {

constexpr int kMaxRowThreads = RAWOPS_ROW_MAX_THREADS;  // launch bound and widest block
constexpr int kMaxRowWarps = kMaxRowThreads / 32;
// Launch bound: two 512-thread blocks per SM, i.e. at most 64 registers a thread. Left to
// itself ptxas kept the loop-invariant weight and bias of every column a thread touches in
// registers, one or two blocks per SM; a block-per-row launch runs each block over one row,
// so those registers bought nothing but lost occupancy.
constexpr int kMinRowBlocks = RAWOPS_ROW_MIN_BLOCKS;
constexpr int kFwdVectors = RAWOPS_ROW_FWD_VECTORS;  // 16-byte vectors a thread holds of a row, forward
constexpr int kFwdWideVectors = RAWOPS_ROW_FWD_WIDE_VECTORS;  // the softmax forwards' wide entries
constexpr int kBwdVectors = RAWOPS_ROW_BWD_VECTORS;  // backward: of each of its two operands
constexpr int kBwdMaxStages = RAWOPS_ROW_BWD_MAX_STAGES;  // backward, bulk path: rows in flight ahead
enum RowMode { kWarpPerRow = RAWOPS_ROW_MODE_WARP, kBlockPerRow = RAWOPS_ROW_MODE_BLOCK, kStreamRow = RAWOPS_ROW_MODE_STREAM };

struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
// CUB's warp reduction has a two-instruction step for float sums under cuda::std::plus
// (shfl.down with its predicate, then a predicated add); any other functor, SumOp included,
// takes the generic step (shuffle, add, two selects a level). Used by norm's backward, where
// it was measured faster; elsewhere not yet compared.
using ShuffleSumOp = ::cuda::std::plus<>;
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Which rows this thread works on, and its place among the row's threads.
struct RowCursor {
  bool warp;       // kWarpPerRow
  int lane;        // index among the row's threads
  int width;       // threads per row
  int64_t row;     // first row
  int64_t step;    // rows between this thread's consecutive rows
  __device__ __forceinline__ explicit RowCursor(int mode) {
    warp = mode == kWarpPerRow;
    const int warps = blockDim.x / 32;
    lane = warp ? threadIdx.x % 32 : threadIdx.x;
    width = warp ? 32 : blockDim.x;
    row = warp ? int64_t(blockIdx.x) * warps + threadIdx.x / 32 : int64_t(blockIdx.x);
    step = warp ? int64_t(gridDim.x) * warps : int64_t(gridDim.x);
  }
};

// A row's reductions, returned to every thread of the row. Warp mode: CUB's warp reduction
// and a broadcast. Block mode: CUB's warp reduction, one barrier, then every warp reduces the
// warps' results again with CUB (lane i taking warp i's) and broadcasts: each thread gets the
// same bits in the same order, deterministic, at the price of one barrier. (Adding the
// warps' results one after another cost a chain of 16 dependent shared loads per value.)
// The two shared slots alternate: reduction k+2 reuses k's slot only after every thread
// passed reduction k+1's barrier, which follows its reads of slot k.
// kWarps: the widest block's warps; kParts: the most values reduced at once (shared storage
// for both). RowReducer is the norm and softmax kernels' (512-thread blocks, up to 6 values).
template <int kWarps, int kParts>
class BasicRowReducer {
 public:
  static constexpr int kMaxParts = kParts;
  struct Storage {
    typename cub::WarpReduce<float>::TempStorage warp[kWarps];
    float partial[2][kParts][kWarps];
  };
  __device__ __forceinline__ BasicRowReducer(Storage& s, bool warp) : s_(s), warp_(warp), slot_(0) {}

  template <class Op>
  __device__ __forceinline__ float operator()(float v, Op op) {
    float one[1] = {v};
    reduce(one, op);
    return one[0];
  }

  // K reductions at the price of one barrier: v[k] becomes the row's reduction of v[k].
  template <int K, class Op>
  __device__ __forceinline__ void reduce(float (&v)[K], Op op) {
    static_assert(K <= kMaxParts, "RowReducer: too many values at once");
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = cub::WarpReduce<float>(s_.warp[w]).Reduce(v[k], op);  // lane 0's
    if (!warp_) {
      float (*slot)[kWarps] = s_.partial[slot_];
      slot_ ^= 1;
      if (lane == 0)
#pragma unroll
        for (int k = 0; k < K; ++k) slot[k][w] = v[k];
      __syncthreads();
      const int warps = blockDim.x / 32;
#pragma unroll
      for (int k = 0; k < K; ++k)
        v[k] = cub::WarpReduce<float>(s_.warp[w]).Reduce(lane < warps ? slot[k][lane] : 0.f, op, warps);
    }
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = __shfl_sync(0xffffffffu, v[k], 0);
  }

 private:
  Storage& s_;
  bool warp_;
  int slot_;
};
using RowReducer = BasicRowReducer<kMaxRowWarps, 6>;

// `p` as the compiler cannot see through: loads from it stay inside the row loop. Without it
// nvcc hoists a thread's loop-invariant weight / bias loads out of the loop and holds them in
// registers (or spills them) for every row, though a block-per-row block has one row.
template <typename T>
__device__ __forceinline__ const T* opaque(const T* p) {
  asm volatile("" : "+l"(p));
  return p;
}

// Element e of 16 bytes of T held as four 32-bit words, decoded with bit operations (e odd
// in a 16-bit type: the word's high half). Kept as words, a row's elements cost one register
// per two; as an array of __nv_bfloat16, nvcc gave each element its own register.
__device__ __forceinline__ unsigned word_of(const uint4& r, int i) {
  return i == 0 ? r.x : i == 1 ? r.y : i == 2 ? r.z : r.w;
}
__device__ __forceinline__ float unpack_word(unsigned w, int, const float*) { return __uint_as_float(w); }
__device__ __forceinline__ float unpack_word(unsigned w, int e, const __nv_bfloat16*) {
  return __uint_as_float(e % 2 ? w & 0xffff0000u : w << 16);  // bfloat16 is float's top half
}
__device__ __forceinline__ float unpack_word(unsigned w, int e, const __half*) {
  const __half2 h = *reinterpret_cast<const __half2*>(&w);
  return e % 2 ? __high2float(h) : __low2float(h);
}
template <typename T>
__device__ __forceinline__ uint4 words(const Vec16<T>& v) {  // load16's bits, as words
  return *reinterpret_cast<const uint4*>(&v);
}
template <typename T>
__device__ __forceinline__ float unpack(const uint4& r, int e) {
  return unpack_word(word_of(r, e * int(sizeof(T)) / 4), e, static_cast<const T*>(nullptr));
}

// A thread's share of a row, in registers, in the storage type: vector k holds elements
// (k * width + lane) * V ... + V - 1; zero past the row's end (`valid` says which are real).
// Held as 32-bit words, decoded on use (unpack).
template <typename T, int ITEMS>
struct RowSlice {
  static constexpr int V = Vec16<T>::size;
  uint4 raw[ITEMS];

  __device__ __forceinline__ static int64_t first(const RowCursor& c, int k) {
    return (int64_t(k) * c.width + c.lane) * V;
  }
  // Whether vector k lies inside the row (register modes read whole vectors: n % V == 0).
  __device__ __forceinline__ static bool valid(const RowCursor& c, int k, int64_t n) { return first(c, k) < n; }
  // 16-byte loads: register modes only see aligned rows with n % V == 0 (rawops/_rows.py).
  // Past the row's end all-zero bits: 0.0 in every type.
  __device__ __forceinline__ void load(const T* row, const RowCursor& c, int64_t n) {
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int64_t f = first(c, k);
      raw[k] = f < n ? words(load16(row + f)) : make_uint4(0, 0, 0, 0);
    }
  }
  // The same from a copy of the row in shared memory (the bulk path's stages), element 0 at `row`.
  __device__ __forceinline__ void load_shared(const T* row, const RowCursor& c, int64_t n) {
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int64_t f = first(c, k);
      raw[k] = f < n ? *reinterpret_cast<const uint4*>(row + f) : make_uint4(0, 0, 0, 0);
    }
  }
  // The words as the compiler cannot see through: values decoded before this point are
  // decoded again after it instead of being held in registers (across a reduction, say).
  __device__ __forceinline__ void refresh() {
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) asm volatile("" : "+r"(raw[k].x), "+r"(raw[k].y), "+r"(raw[k].z), "+r"(raw[k].w));
  }
  __device__ __forceinline__ float at(int k, int e) const { return unpack<T>(raw[k], e); }

};

// V elements from element j*V of a row (n wide); `pad` where past the row's end. `vec`:
// one 16-byte load (the host guarantees alignment and n % V == 0).
template <typename T, int V = Vec16<T>::size>
__device__ __forceinline__ void load_row(const T* row, int64_t j, int64_t n, bool vec, float pad, float (&v)[V]) {
  const int64_t first = j * V;
  if (vec) {
    if (first < n) {
      const uint4 r = words(load16(row + first));
#pragma unroll
      for (int e = 0; e < V; ++e) v[e] = unpack<T>(r, e);
    } else {
#pragma unroll
      for (int e = 0; e < V; ++e) v[e] = pad;
    }
    return;
  }
#pragma unroll
  for (int e = 0; e < V; ++e) v[e] = first + e < n ? to_float(__ldg(row + first + e)) : pad;
}

template <typename T, int V = Vec16<T>::size>
__device__ __forceinline__ void store_row(T* row, int64_t j, int64_t n, bool vec, const float (&v)[V]) {
  const int64_t first = j * V;
  if (vec) {
    if (first < n) {
      Vec16<T> r;
#pragma unroll
      for (int e = 0; e < V; ++e) r.v[e] = from_float<T>(v[e]);
      store16(row + first, r);
    }
    return;
  }
#pragma unroll
  for (int e = 0; e < V; ++e)
    if (first + e < n) row[first + e] = from_float<T>(v[e]);
}

// A row's register-mode output: vector k of this thread's slice (RowSlice's layout), element e,
// is value(k, e), stored as one 16-byte vector while the vector lies inside the row.
template <int ITEMS, typename T, class F>
__device__ __forceinline__ void store_slice(T* row, const RowCursor& c, int64_t n, F value) {
  constexpr int V = Vec16<T>::size;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int64_t j = int64_t(k) * c.width + c.lane;
    if (j * V >= n) break;
    float o[V];
#pragma unroll
    for (int e = 0; e < V; ++e) o[e] = value(k, e);
    store_row(row, j, n, true, o);
  }
}

}  // namespace rawops
