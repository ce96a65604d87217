// Row-wise kernels (norm, softmax): one reduction per row over the last dim.
//
// Every row kernel runs 512-thread blocks in one of three modes, chosen by the host
// (rawops/_rows.py, row_plan) from the row width, and passed as an argument so that one
// extern "C" entry per op and dtype serves every width:
//   kWarpPerRow   16 rows per block, one warp each, the row in registers (narrow rows);
//   kBlockPerRow  one row per block, the row in registers (up to 512 x ELEMS elements);
//   kStreamRow    one row per block, read from memory once per pass (rows wider than the
//                 registers hold: every architecture has them, unlike 128+ KB of shared memory).
// Register layout: thread `lane` of a row's `width` threads holds 16-byte vectors
// j = lane, lane + width, ... (ELEMS / V of them), so a warp's loads are 512 contiguous bytes.
// Without 16-byte alignment (row start or another operand) the same layout is read element by
// element, with bounds checks: correct for any width, slower.
// NVRTC fallback: rawops/_modules.py adds CuPy's bundled CUB to NVRTC's include path;
// tests/test_nvrtc.py compiles every family that way (no GPU needed).
#pragma once

// Only the block and warp reductions: cub/cub.cuh also pulls in device-wide dispatch (host
// code), which NVRTC, the no-nvcc fallback, rejects.
#include <cub/block/block_reduce.cuh>
#include <cub/warp/warp_reduce.cuh>

#include "rawops/dtype.cuh"

namespace rawops {

constexpr int kRowThreads = 512;  // blockDim of every row kernel (rawops/_rows.py ROW_THREADS)
constexpr int kWarpRows = kRowThreads / 32;
constexpr int kFwdElems = 32;  // floats per thread held in registers, forward
constexpr int kBwdElems = 16;  // backward holds two operands (and norm's dw/db partials)
enum RowMode { kWarpPerRow = 0, kBlockPerRow = 1, kStreamRow = 2 };

struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
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
    lane = warp ? threadIdx.x % 32 : threadIdx.x;
    width = warp ? 32 : kRowThreads;
    row = warp ? int64_t(blockIdx.x) * kWarpRows + threadIdx.x / 32 : int64_t(blockIdx.x);
    step = warp ? int64_t(gridDim.x) * kWarpRows : int64_t(gridDim.x);
  }
};

struct RowReduceStorage {
  union {
    typename cub::WarpReduce<float>::TempStorage warp[kWarpRows];
    typename cub::BlockReduce<float, kRowThreads>::TempStorage block;
  };
  float broadcast;
};

// The row's reduction, returned to every thread of the row. Block mode synchronises the
// block (all its threads must call it); warp mode only the warp.
template <class Op>
__device__ __forceinline__ float row_reduce(float v, Op op, bool warp, RowReduceStorage& s) {
  if (warp) {
    const float r = cub::WarpReduce<float>(s.warp[threadIdx.x / 32]).Reduce(v, op);
    return __shfl_sync(0xffffffffu, r, 0);  // CUB leaves the result in lane 0 only
  }
  const float r = cub::BlockReduce<float, kRowThreads>(s.block).Reduce(v, op);
  if (threadIdx.x == 0) s.broadcast = r;
  __syncthreads();
  const float all = s.broadcast;
  __syncthreads();  // the storage is reused by the next reduction
  return all;
}

// V elements from element j*V of a row (n wide); `pad` where past the row's end. `vec`:
// one 16-byte load (the host guarantees alignment and n % V == 0).
template <typename T, int V = Vec16<T>::size>
__device__ __forceinline__ void load_row(const T* row, int64_t j, int64_t n, bool vec, float pad, float (&v)[V]) {
  const int64_t first = j * V;
  if (vec) {
    if (first < n) {
      const Vec16<T> r = load16(row + first);
#pragma unroll
      for (int e = 0; e < V; ++e) v[e] = to_float(r.v[e]);
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

}  // namespace rawops
