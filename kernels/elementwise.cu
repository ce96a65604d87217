// Elementwise family: gelu (tanh / erf), relu, relu_scale, relu_scale_add, bias_gelu, add,
// and the backward of each differentiable one.
//
// Every map kernel has one signature, so the host launcher is one code path:
//   (const T* a, const T* b, const T* c, T* out, int64 n, int64 head, int64 inner, float alpha)
//   a      the first operand, n elements            (x, or dy in backward)
//   b      an optional second operand, n elements   (y of relu_scale_add, b of add, x in bwd)
//   c      an optional row vector of `inner` elements broadcast over the last dim (bias)
//   head   elements before `out` (and a, b) reach 16-byte alignment; -1 when a, b and out
//          disagree modulo 16, which forces the scalar path (correct, slower)
// Traffic: each input read once, out written once, 16 bytes per access per thread.
// Launch: RAWOPS_MAP_THREADS threads, each block owning RAWOPS_MAP_UNROLL x blockDim
// consecutive 16-byte vectors, every load issued before the math; one block per chunk, so the
// hardware balances the many short blocks (a persistent grid-stride grid leaves a partial last
// wave: docs/performance.md). The scalar fallback is a grid-stride loop.
//
// Each op also has a strided entry, <op>_strided_<dtype>, for operands of any layout (views with
// steps, transposes, broadcast stride-0 inputs, strided out=):
//   (const T* a, const T* b, const T* c, T* out, int64 n, float alpha, MapLayout layout)
// The host (rawops/_launch/launch.pyx, plan_layout) drops size-1 dims, orders the dims by out's
// strides and merges dims that are contiguous in every operand; layout holds the result (see
// MapLayout). Element by element, RAWOPS_MAP_STRIDED_UNROLL a thread per block step, all their
// loads issued before the math; a grid-stride loop over a bounded grid.
// Math in float32; 64-bit indices throughout (tensors past 2^31 elements).
#include "rawops/dependent_launch.cuh"
#include "rawops/dtype.cuh"
#include "rawops/gelu.cuh"

namespace rawops {

// The strided kernels' iteration space: `ndim` (>= 1) dims, outermost first, and each
// operand's stride of each dim in elements (negative or 0 allowed: a reversed view, a broadcast
// input). Operands a, b, c, out in that order; an operand the op does not read has strides 0, and
// the row vector c has stride 0 in every dim but its column dim. out's strides never make two
// elements share memory (the host refuses such an out=).
struct MapLayout {
  int64_t ndim;
  int64_t shape[RAWOPS_MAP_MAX_DIMS];
  int64_t stride[4][RAWOPS_MAP_MAX_DIMS];
};

namespace {

constexpr int kUnroll = RAWOPS_MAP_UNROLL;
constexpr int kStridedUnroll = RAWOPS_MAP_STRIDED_UNROLL;
using namespace gelu_math;  // rawops/gelu.cuh

// NaN propagates like torch.relu (fmaxf would turn it into 0).
__device__ __forceinline__ float relu(float x) { return (x > 0.f || x != x) ? x : 0.f; }
__device__ __forceinline__ float relu_grad(float x) { return x > 0.f ? 1.f : 0.f; }

// Each op maps (a, b, c, alpha) -> out; b and c are 0 when the op does not read them.
// T is the storage type, for ops whose float32 math may be cheaper when outputs are 16-bit.
template <typename T> struct GeluTanh     { static constexpr bool B = false, C = false; __device__ static float f(float a, float, float, float) { return gelu_tanh(a); } };
template <typename T> struct GeluErf      { static constexpr bool B = false, C = false; __device__ static float f(float a, float, float, float) { return gelu_erf<T>(a); } };
template <typename T> struct GeluTanhBwd  { static constexpr bool B = true,  C = false; __device__ static float f(float dy, float x, float, float) { return dy * gelu_tanh_grad(x); } };
template <typename T> struct GeluErfBwd   { static constexpr bool B = true,  C = false; __device__ static float f(float dy, float x, float, float) { return dy * gelu_erf_grad<T>(x); } };
template <typename T> struct Relu         { static constexpr bool B = false, C = false; __device__ static float f(float a, float, float, float) { return relu(a); } };
template <typename T> struct ReluBwd      { static constexpr bool B = true,  C = false; __device__ static float f(float dy, float x, float, float) { return dy * relu_grad(x); } };
template <typename T> struct ReluScale    { static constexpr bool B = false, C = false; __device__ static float f(float a, float, float, float s) { return relu(a) * s; } };
template <typename T> struct ReluScaleBwd { static constexpr bool B = true,  C = false; __device__ static float f(float dy, float x, float, float s) { return dy * s * relu_grad(x); } };
template <typename T> struct ReluScaleAdd { static constexpr bool B = true,  C = false; __device__ static float f(float a, float y, float, float s) { return fmaf(relu(a), s, y); } };
template <typename T> struct Add          { static constexpr bool B = true,  C = false; __device__ static float f(float a, float b, float, float) { return a + b; } };
template <typename T> struct BiasGeluTanh { static constexpr bool B = false, C = true;  __device__ static float f(float a, float, float bias, float) { return gelu_tanh(a + bias); } };
template <typename T> struct BiasGeluErf  { static constexpr bool B = false, C = true;  __device__ static float f(float a, float, float bias, float) { return gelu_erf<T>(a + bias); } };
template <typename T> struct BiasGeluTanhBwd { static constexpr bool B = true, C = true; __device__ static float f(float dy, float x, float bias, float) { return dy * gelu_tanh_grad(x + bias); } };
template <typename T> struct BiasGeluErfBwd  { static constexpr bool B = true, C = true; __device__ static float f(float dy, float x, float bias, float) { return dy * gelu_erf_grad<T>(x + bias); } };

// Column index of a flat element: 32-bit division where it fits (64-bit division is a long
// software sequence, paid once per 16 bytes here).
__device__ __forceinline__ int64_t column_of(int64_t i, int64_t inner) {
  if (((i | inner) >> 32) == 0) return static_cast<unsigned>(i) % static_cast<unsigned>(inner);
  return i % inner;
}

// The V row-vector values for the elements whose first sits in column `col`.
template <typename T, int V = Vec16<T>::size>
__device__ __forceinline__ void row_values(const T* c, int64_t col, int64_t inner, bool vectors, float (&cv)[V]) {
  if (vectors) {
    const Vec16<T> cvec = load16(c + col);
#pragma unroll
    for (int e = 0; e < V; e += 2) {
      const float2 pair = to_float2(cvec, e);
      cv[e] = pair.x;
      cv[e + 1] = pair.y;
    }
    return;
  }
#pragma unroll
  for (int e = 0; e < V; ++e) {
    cv[e] = to_float(__ldg(c + col));
    col = (col + 1 == inner) ? 0 : col + 1;
  }
}

template <class Op, typename T>
__device__ __forceinline__ void map_scalar(const T* a, const T* b, const T* c, T* out, int64_t i,
                                           int64_t inner, float alpha) {
  const float bv = Op::B ? to_float(b[i]) : 0.f;
  const float cv = Op::C ? to_float(c[column_of(i, inner)]) : 0.f;
  out[i] = from_float<T>(Op::f(to_float(a[i]), bv, cv, alpha));
}

template <class Op, typename T, int UNROLL = kUnroll>
__device__ __forceinline__ void map(const T* __restrict__ a, const T* __restrict__ b,
                                    const T* __restrict__ c, T* __restrict__ out, int64_t n,
                                    int64_t head, int64_t inner, float alpha) {
  constexpr int V = Vec16<T>::size;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nthreads = int64_t(gridDim.x) * blockDim.x;

  if (head < 0) {  // operands misaligned relative to each other: scalar everywhere
    for (int64_t i = tid; i < n; i += nthreads) map_scalar<Op>(a, b, c, out, i, inner, alpha);
    return;
  }
  // Scalar head (before 16-byte alignment) and tail (after the last whole vector).
  const int64_t nvec = (n - head) / V;
  const int64_t tail = head + nvec * V;
  if (blockIdx.x == 0) {
    if (threadIdx.x < head) map_scalar<Op>(a, b, c, out, threadIdx.x, inner, alpha);
    if (threadIdx.x < n - tail) map_scalar<Op>(a, b, c, out, tail + threadIdx.x, inner, alpha);
  }
  // The row vector c is read 16 bytes at a time when every vector starts a whole group of
  // V columns on a 16-byte boundary; otherwise element by element.
  const bool c_vectors = Op::C && head == 0 && inner % V == 0 && (reinterpret_cast<size_t>(c) & 15) == 0;
  // Work comes in chunks of UNROLL * blockDim consecutive vectors; a block takes chunks
  // blockIdx.x, blockIdx.x + gridDim.x, ... (one chunk each when the grid covers them all).
  const int64_t chunk_size = int64_t(blockDim.x) * UNROLL;
  // Consecutive vectors of a thread are blockDim * V elements apart: their columns advance
  // by a fixed step modulo inner, so only the first needs a division.
  const int64_t col_step = Op::C ? column_of(int64_t(blockDim.x) * V, inner) : 0;
  for (int64_t chunk = blockIdx.x; chunk * chunk_size < nvec; chunk += gridDim.x) {
    const int64_t first_vec = chunk * chunk_size + threadIdx.x;
    int64_t col = Op::C ? column_of(head + first_vec * V, inner) : 0;
    Vec16<T> va[UNROLL], vb[UNROLL];
#pragma unroll
    for (int k = 0; k < UNROLL; ++k) {  // every load in flight before any math
      const int64_t j = first_vec + k * blockDim.x;
      if (j < nvec) {
        va[k] = load16(a + head + j * V);
        if (Op::B) vb[k] = load16(b + head + j * V);
      }
    }
#pragma unroll
    for (int k = 0; k < UNROLL; ++k) {
      const int64_t j = first_vec + k * blockDim.x;
      if (j < nvec) {
        const int64_t first = head + j * V;
        float cv[V];
        if (Op::C) row_values(c, col, inner, c_vectors, cv);
        Vec16<T> r;
#pragma unroll
        for (int e = 0; e < V; e += 2) {  // pairs: bfloat16 converts two from a 32-bit word (to_float2)
          const float2 av = to_float2(va[k], e), bv = Op::B ? to_float2(vb[k], e) : make_float2(0.f, 0.f);
          r.v[e] = from_float<T>(Op::f(av.x, bv.x, Op::C ? cv[e] : 0.f, alpha));
          r.v[e + 1] = from_float<T>(Op::f(av.y, bv.y, Op::C ? cv[e + 1] : 0.f, alpha));
        }
        store16(out + first, r);
      }
      if (Op::C) {
        col += col_step;
        col = col >= inner ? col - inner : col;
      }
    }
  }
}

// Each operand's offset of element i of a strided launch: i's coordinates in the layout's
// shape, innermost dim first. Index is unsigned 32-bit where every index fits (a 64-bit division
// is a long software sequence, paid per element and dim here).
template <class Op, typename Index>
__device__ __forceinline__ void strided_offsets(Index i, const MapLayout& layout, int64_t& a, int64_t& b,
                                                int64_t& c, int64_t& out) {
  a = b = c = out = 0;
  for (int d = int(layout.ndim) - 1; d > 0; --d) {
    const Index size = Index(layout.shape[d]);
    const Index q = i / size;
    const int64_t coord = int64_t(i - q * size);
    i = q;
    a += coord * layout.stride[0][d];
    if (Op::B) b += coord * layout.stride[1][d];
    if (Op::C) c += coord * layout.stride[2][d];
    out += coord * layout.stride[3][d];
  }
  const int64_t coord = int64_t(i);  // the outermost dim's: no division
  a += coord * layout.stride[0][0];
  if (Op::B) b += coord * layout.stride[1][0];
  if (Op::C) c += coord * layout.stride[2][0];
  out += coord * layout.stride[3][0];
}

// The strided entries' body: element i of the layout's iteration order, i in [0, n). Work comes
// in chunks of kStridedUnroll * blockDim elements, a thread's elements blockDim apart (so that a
// warp's stores are consecutive where out's innermost stride is 1), every load issued before the
// math; blocks take chunks blockIdx.x, blockIdx.x + gridDim.x, ... Reads and writes are each
// element's own, by one thread: out == a or b exactly (in place) is safe here too.
template <class Op, typename Index, typename T>
__device__ __forceinline__ void map_strided_loop(const T* __restrict__ a, const T* __restrict__ b,
                                                 const T* __restrict__ c, T* __restrict__ out, int64_t n,
                                                 float alpha, const MapLayout& layout) {
  const int64_t chunk_size = int64_t(blockDim.x) * kStridedUnroll;
  for (int64_t first = int64_t(blockIdx.x) * chunk_size + threadIdx.x; first < n;
       first += int64_t(gridDim.x) * chunk_size) {
    float av[kStridedUnroll], bv[kStridedUnroll], cv[kStridedUnroll];
    int64_t where[kStridedUnroll];
#pragma unroll
    for (int k = 0; k < kStridedUnroll; ++k) {
      const int64_t i = first + int64_t(k) * blockDim.x;
      if (i < n) {
        int64_t oa, ob, oc;
        strided_offsets<Op>(Index(i), layout, oa, ob, oc, where[k]);
        av[k] = to_float(a[oa]);
        bv[k] = Op::B ? to_float(b[ob]) : 0.f;
        cv[k] = Op::C ? to_float(c[oc]) : 0.f;
      }
    }
#pragma unroll
    for (int k = 0; k < kStridedUnroll; ++k)
      if (first + int64_t(k) * blockDim.x < n) out[where[k]] = from_float<T>(Op::f(av[k], bv[k], cv[k], alpha));
  }
}

template <class Op, typename T>
__device__ __forceinline__ void map_strided(const T* a, const T* b, const T* c, T* out, int64_t n, float alpha,
                                            const MapLayout& layout) {
  if ((n >> 31) == 0) {  // every index and size fits 32 bits: one hardware division a dim
    map_strided_loop<Op, unsigned>(a, b, c, out, n, alpha, layout);
  } else {
    map_strided_loop<Op, unsigned long long>(a, b, c, out, n, alpha, layout);
  }
}

// Deterministic column sums of a (rows x cols) matrix, in two launches (no atomics, so the
// same input gives the same bits): partial[chunk, col] over a chunk of rows, then the chunks
// summed in a fixed order. Used for dbias. Element (r, col) of x is x[r * row_stride + col *
// col_stride] (cols and 1 for a dense matrix; a strided dx of bias_gelu_backward's out=
// otherwise). Reads the matrix once, coalesced along a row where col_stride is 1.
template <typename T>
__device__ __forceinline__ void column_sum_part(const T* __restrict__ x, float* __restrict__ partial,
                                                int64_t rows, int64_t cols, int64_t rows_per_chunk,
                                                int64_t row_stride, int64_t col_stride) {
  const int64_t col = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  const int64_t r0 = int64_t(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = min(rows, r0 + rows_per_chunk);
  const T* column = x + col * col_stride;
  float acc = 0.f;
  for (int64_t r = r0; r < r1; ++r) acc += to_float(column[r * row_stride]);
  partial[int64_t(blockIdx.y) * cols + col] = acc;
}

// Blocks of kFinalColumns x kFinalGroups threads: group g sums chunks g, g + kFinalGroups, ...
// of its column in order, then group 0 adds the groups in order: with one thread a column,
// each thread would wait on L2 once per chunk, one chunk after another.
constexpr int kFinalColumns = RAWOPS_COLUMN_SUM_FINAL_COLUMNS, kFinalGroups = RAWOPS_COLUMN_SUM_FINAL_GROUPS;
// Launched programmatically dependent on the kernel that writes the partials (sm_90): it waits
// for that grid before the first read. Each thread's loads are issued kFinalBatch at a time
// before their adds (in chunk order: the sum is the same, bit for bit).
constexpr int kFinalBatch = 4;
// float32 results keep float32's accuracy at any row count: a group's chunks are summed in
// runs of kFinalRunBatches batches, each run then added to the group's sum, so no running sum
// spans more than a few dozen terms where one would span chunks / kFinalGroups (hundreds for
// 2^20 rows of short row tiles). The 2-byte types keep the single run (the same bits as ever:
// their result is rounded to 2-byte precision anyway). A fixed order still: deterministic.
constexpr int kFinalRunBatches = 4;
template <typename T> struct FinalRuns { static constexpr bool value = false; };
template <> struct FinalRuns<float> { static constexpr bool value = true; };
template <typename T>
__device__ __forceinline__ void column_sum_final(const float* __restrict__ partial, T* __restrict__ out,
                                                 int64_t chunks, int64_t cols) {
  __shared__ float sums[kFinalGroups][kFinalColumns];
  const int c = threadIdx.x % kFinalColumns, g = threadIdx.x / kFinalColumns;
  const int64_t col = int64_t(blockIdx.x) * kFinalColumns + c;
  float acc = 0.f;
  wait_for_previous_grid();
  if (col < cols) {
    int64_t k = g;
    float run = 0.f;
    int batches = 0;
    for (; k + (kFinalBatch - 1) * kFinalGroups < chunks; k += kFinalBatch * kFinalGroups) {
      float v[kFinalBatch];
#pragma unroll
      for (int i = 0; i < kFinalBatch; ++i) v[i] = partial[(k + i * kFinalGroups) * cols + col];
#pragma unroll
      for (int i = 0; i < kFinalBatch; ++i) run += v[i];
      if (FinalRuns<T>::value && ++batches == kFinalRunBatches) {
        acc += run;
        run = 0.f;
        batches = 0;
      }
    }
    for (; k < chunks; k += kFinalGroups) run += partial[k * cols + col];
    acc += run;  // 0 + run for a single run: the same bits as summing into acc directly
  }
  sums[g][c] = acc;
  __syncthreads();
  if (g == 0 && col < cols) {
#pragma unroll
    for (int i = 1; i < kFinalGroups; ++i) acc += sums[i][c];
    out[col] = from_float<T>(acc);
  }
}

// bias_gelu's backward with dbias's first stage fused in (also instantiated without a bias, for
// linear_gelu's backward: dpre = dy * gelu'(pre) and dbias = its column sums): dx = dy *
// gelu'(x + bias), written as the map kernel writes it, and the column sums of that dx (the
// rounded values, as column_sum(dx) would see them) over each chunk of rows into
// partial[chunk][col]; column_sum_final then adds the chunks. One pass over dy and x: the map
// kernel + column_sum re-read dx, 4 tensor passes where 3 are needed.
// Launch (rawops/elementwise.py: bias_gelu_bwd_plan): 1-D blocks of strip x `by` threads;
// thread (tx, ty) = (t % strip, t / strip) owns column vector blockIdx.x * strip + tx (of
// BiasBwdShape<T>::bytes) and rows (i * chunks + blockIdx.y) * by + ty. Needs cols % V == 0
// and dy, x, bias, dx aligned to the vector (the plan checks; otherwise the unfused pair runs).
// Streaming: each thread keeps `ahead` rows of loads in flight at all times (a row's math,
// then the load of the row `ahead` further), `bytes` of each operand a row.
// Per storage type (RAWOPS_BIAS_BWD_*, rawops/_constants.py): float32 16-byte vectors, 2 rows
// ahead; the half types 8-byte vectors, 1 row ahead, twice the blocks an SM (the shapes swept,
// and why the short tiles below replaced these where they apply: docs/performance.md). A spill
// is fatal: the launch bounds keep `blocks` resident, and the plan's grid is one wave of them.
template <typename T> struct BiasBwdShape {
  static constexpr int bytes = sizeof(T) == 4 ? RAWOPS_BIAS_BWD_F32_BYTES : RAWOPS_BIAS_BWD_HALF_BYTES;
  static constexpr int blocks = sizeof(T) == 4 ? RAWOPS_BIAS_BWD_F32_BLOCKS : RAWOPS_BIAS_BWD_HALF_BLOCKS;
  static constexpr int ahead = sizeof(T) == 4 ? 2 : 1;
};
constexpr int kBiasBwdThreads = RAWOPS_BIAS_BWD_THREADS;

template <typename T, int kBytes> struct alignas(kBytes) VecN {
  static constexpr int size = kBytes / sizeof(T);
  T v[size];
};
template <typename T, int kBytes> __device__ __forceinline__ VecN<T, kBytes> load_vec(const T* p) {
  VecN<T, kBytes> out;
  if constexpr (kBytes == 16) {
    *reinterpret_cast<uint4*>(&out) = __ldg(reinterpret_cast<const uint4*>(p));
  } else {
    static_assert(kBytes == 8, "8- or 16-byte vectors");
    *reinterpret_cast<uint2*>(&out) = __ldg(reinterpret_cast<const uint2*>(p));
  }
  return out;
}
template <typename T, int kBytes> __device__ __forceinline__ void store_vec(T* p, const VecN<T, kBytes>& v) {
  if constexpr (kBytes == 16) {
    *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(&v);
  } else {
    *reinterpret_cast<uint2*>(p) = *reinterpret_cast<const uint2*>(&v);
  }
}

template <bool kLoad, typename T, int kBytes> __device__ __forceinline__ VecN<T, kBytes> bias_vec(const T* p) {
  if constexpr (kLoad) return load_vec<T, kBytes>(p);
  return VecN<T, kBytes>{};
}

template <class Op, typename T>
__device__ __forceinline__ void bias_bwd_partial(const T* __restrict__ dy, const T* __restrict__ x,
                                                 const T* __restrict__ bias, T* __restrict__ dx,
                                                 float* __restrict__ partial, int64_t rows, int64_t cols,
                                                 int strip) {
  constexpr int kBytes = BiasBwdShape<T>::bytes, A = BiasBwdShape<T>::ahead;
  using Vec = VecN<T, kBytes>;
  constexpr int V = Vec::size;
  __shared__ float sums[V][kBiasBwdThreads];
  // column_sum_final (launched dependent) may take its SM slots as ours free up; it waits for
  // this whole grid before reading the partials.
  allow_dependent_launch();
  const int tx = threadIdx.x % strip, ty = threadIdx.x / strip, by = blockDim.x / strip;
  const int64_t col = (int64_t(blockIdx.x) * strip + tx) * V;
  // Chunk c takes rows (i * chunks + c) * by + ty, i = 0, 1, ...: the whole grid walks memory in
  // order, as the map kernels' short blocks do (contiguous chunks, each block walking its own
  // range, were slower: docs/performance.md).
  const int64_t r_first = int64_t(blockIdx.y) * by + ty, r_step = int64_t(gridDim.y) * by;
  const int n = r_first < rows ? int((rows - r_first + r_step - 1) / r_step) : 0;  // 32-bit: rows / chunks
  float acc[V];
#pragma unroll
  for (int e = 0; e < V; ++e) acc[e] = 0.f;
  if (col < cols && n > 0) {
    // Kept packed, converted per use; Ops without a bias (the linear backward's dpre) ignore it.
    const Vec b = bias_vec<Op::C, T, kBytes>(bias + col);
    const int64_t stride = r_step * cols;  // elements between a thread's consecutive rows
    const int64_t first = r_first * cols + col;
    const T* pdy = dy + first;
    const T* px = x + first;
    T* pdx = dx + first;
    Vec d[A], v[A];
#pragma unroll
    for (int u = 0; u < A; ++u)
      if (u < n) {
        d[u] = load_vec<T, kBytes>(pdy + u * stride);
        v[u] = load_vec<T, kBytes>(px + u * stride);
      }
    // Slot u holds row i + u; after its math it is refilled with row i + u + A.
    for (int i = 0; i < n; i += A) {
#pragma unroll
      for (int u = 0; u < A; ++u) {
        if (i + u < n) {
          Vec out;
#pragma unroll
          for (int e = 0; e < V; ++e) {
            out.v[e] = from_float<T>(Op::f(to_float(d[u].v[e]), to_float(v[u].v[e]), to_float(b.v[e]), 0.f));
            acc[e] += to_float(out.v[e]);
          }
          store_vec<T, kBytes>(pdx, out);
          if (i + u + A < n) {
            d[u] = load_vec<T, kBytes>(pdy + A * stride);
            v[u] = load_vec<T, kBytes>(px + A * stride);
          }
          pdy += stride;
          px += stride;
          pdx += stride;
        }
      }
    }
  }
#pragma unroll
  for (int e = 0; e < V; ++e) sums[e][threadIdx.x] = acc[e];
  __syncthreads();
  if (ty == 0 && col < cols) {
    // One vector store per 4 (or 2) floats: scalar stores 16 bytes apart left a warp's store
    // spanning 4x the sectors it wrote.
    // col is a multiple of V and cols of V, so dst is 4V-byte aligned.
    float* dst = partial + int64_t(blockIdx.y) * cols + col;
    float s[V];
#pragma unroll
    for (int e = 0; e < V; ++e) {
      s[e] = acc[e];
      for (int k = 1; k < by; ++k) s[e] += sums[e][k * strip + tx];
    }
    if constexpr (V % 4 == 0) {
#pragma unroll
      for (int e = 0; e < V; e += 4)
        *reinterpret_cast<float4*>(dst + e) = make_float4(s[e], s[e + 1], s[e + 2], s[e + 3]);
    } else {
      static_assert(V == 2, "V is 2, 4 or 8 floats");
      *reinterpret_cast<float2*>(dst) = make_float2(s[0], s[1]);
    }
  }
}

// The same result as bias_bwd_partial (dx bit for bit; dbias from the same rounded dx values,
// added in another fixed order) from short blocks shaped like the map kernels': the grid covers
// the data, a block is a tile of kRows rows x kThreads * kPer / kRows 16-byte column vectors, and
// each thread owns one vector of kPer rows (ty, ty + kRows / kPer, ...), every load issued before
// the math. The tile's column sums (a warp's rows by shuffles, then the warps in order through
// shared memory) go to partial[row tile][col]; column_sum_final adds the row tiles in order. Why:
// the long-lived walkers of bias_bwd_partial stream below the map kernels' rate, and many short
// blocks with one partial row per 64-128 rows (a little more traffic) finish sooner
// (docs/performance.md). Shapes per type: BiasBwdTile, from RAWOPS_BIAS_BWD_TILE_*. Needs whole tiles across a row (cols % (kVecs * V) == 0: 64 columns for every type) and
// dy, x, bias, dx 16-byte aligned (rawops/elementwise.py plans it); the kernel has no guard for a
// part-filled last column tile (one made float16 slower: docs/performance.md).
template <typename T> struct BiasBwdTile;
template <> struct BiasBwdTile<float> {
  static constexpr int threads = RAWOPS_BIAS_BWD_TILE_F32_THREADS, rows = RAWOPS_BIAS_BWD_TILE_F32_ROWS,
                       per = RAWOPS_BIAS_BWD_TILE_F32_PER;
};
template <> struct BiasBwdTile<__half> {
  static constexpr int threads = RAWOPS_BIAS_BWD_TILE_F16_THREADS, rows = RAWOPS_BIAS_BWD_TILE_F16_ROWS,
                       per = RAWOPS_BIAS_BWD_TILE_F16_PER;
};
template <> struct BiasBwdTile<__nv_bfloat16> {
  static constexpr int threads = RAWOPS_BIAS_BWD_TILE_BF16_THREADS, rows = RAWOPS_BIAS_BWD_TILE_BF16_ROWS,
                       per = RAWOPS_BIAS_BWD_TILE_BF16_PER, blocks = RAWOPS_BIAS_BWD_TILE_BF16_BLOCKS;
};

constexpr float kFixedScale = 16777216.f;        // kExact below: float16's least bit, 2^-24, becomes 1
constexpr double kFixedUnit = 1.0 / 16777216.0;  // and back

// The entries take BiasBwdTile<T>'s shape.
// kExact (float16 only): instead of a partial row, each tile adds its column sums to one int64
// accumulator a column in fixed point (red.add: no wait, no order). Every float16 is a whole
// multiple of 2^-24 below 2^16, so a tile's float32 sum of them is too (below kRows x 2^16): times
// 2^24 it is an exact integer below kRows x 2^40, and integer addition is associative, so dbias comes
// out the same bits in any order, from the exact sum of the tiles' sums, for up to 2^23 rows (below
// 2^63 in all; the plan checks).
// What it saves: the partial rows (written and read again) and column_sum_final's pass over them. A tile sum that is Inf or NaN goes to a float32 accumulator
// instead (Inf + x, NaN + x and Inf + -Inf do not depend on the order either). `partial` is then
// the workspace: cols int64 sums, then cols floats, zeroed by fixed_sum_zero (the launch before,
// waited for here) and read by fixed_sum_final.
template <class Op, typename T, int kThreads, int kRows, int kPer, bool kExact = false>
__device__ __forceinline__ void bias_bwd_tile(const T* __restrict__ dy, const T* __restrict__ x,
                                              const T* __restrict__ bias, T* __restrict__ dx,
                                              float* __restrict__ partial, int64_t rows, int64_t cols) {
  constexpr int V = Vec16<T>::size, kVecs = kThreads * kPer / kRows, kWarps = kThreads / 32, kRowStep = kRows / kPer;
  static_assert(kVecs <= 32 && 32 % kVecs == 0, "a warp holds whole rows of the tile");
  __shared__ float sums[kWarps][kVecs * V];
  allow_dependent_launch();  // column_sum_final waits for this whole grid before reading partial
  // Blocks walk memory in order: the column tiles of row tile 0, then of row tile 1, ... (32-bit
  // division: the grid is below 2^31 blocks; a 64-bit one is a call).
  const unsigned col_tiles = unsigned(cols / (kVecs * V));  // whole tiles: the plan checks
  const unsigned row_tile = blockIdx.x / col_tiles, col_tile = blockIdx.x - row_tile * col_tiles;
  const int tx = threadIdx.x % kVecs, ty = threadIdx.x / kVecs;
  const int64_t row0 = int64_t(row_tile) * kRows + ty, col = (int64_t(col_tile) * kVecs + tx) * V;
  float acc[V];
#pragma unroll
  for (int e = 0; e < V; ++e) acc[e] = 0.f;
  Vec16<T> d[kPer], v[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k)
    if (row0 + k * kRowStep < rows) {
      d[k] = load16(dy + (row0 + k * kRowStep) * cols + col);
      v[k] = load16(x + (row0 + k * kRowStep) * cols + col);
    }
  Vec16<T> b;
  if (Op::C) b = load16(bias + col);
#pragma unroll
  for (int k = 0; k < kPer; ++k)
    if (row0 + k * kRowStep < rows) {
      Vec16<T> out;
#pragma unroll
      for (int e = 0; e < V; e += 2) {  // pairs: the half types' packed rounding (dtype.cuh from_float2)
        // Decoded a pair a word (to_float2): bfloat16 element by element held each half in a register
        // of its own (55 registers against float16's 40: two blocks an SM, not three).
        from_float2<T>(Op::f(to_float2(d[k], e).x, to_float2(v[k], e).x, Op::C ? to_float2(b, e).x : 0.f, 0.f),
                       Op::f(to_float2(d[k], e).y, to_float2(v[k], e).y, Op::C ? to_float2(b, e).y : 0.f, 0.f),
                       out.v + e);
        acc[e] += to_float(out.v[e]);  // the rounded dx, as column_sum(dx) would see it
        acc[e + 1] += to_float(out.v[e + 1]);
      }
      store16_pinned(dx + (row0 + k * kRowStep) * cols + col, out);
    }
  // A warp's lanes tx, tx + kVecs, ... hold the same columns of different rows.
#pragma unroll
  for (int step = kVecs; step < 32; step *= 2)
#pragma unroll
    for (int e = 0; e < V; ++e) acc[e] += __shfl_xor_sync(0xffffffffu, acc[e], step);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane < kVecs) {
#pragma unroll
    for (int e = 0; e < V; ++e) sums[warp][lane * V + e] = acc[e];
  }
  __syncthreads();
  if (kExact) wait_for_previous_grid();  // fixed_sum_zero has zeroed the accumulators
  for (int c = threadIdx.x; c < kVecs * V; c += kThreads) {
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += sums[w][c];
    const int64_t column = int64_t(col_tile) * kVecs * V + c;
    if (!kExact) {
      partial[int64_t(row_tile) * cols + column] = s;
    } else if (isfinite(s)) {  // two's complement: the unsigned add is the signed one
      atomicAdd(reinterpret_cast<unsigned long long*>(partial) + column,
                static_cast<unsigned long long>(__float2ll_rn(s * kFixedScale)));
    } else {
      atomicAdd(partial + 2 * cols + column, s);
    }
  }
}

// The exact dbias's two small launches around the tiles (see kExact above).
__device__ __forceinline__ void fixed_sum_zero(unsigned* __restrict__ words, int64_t count) {
  allow_dependent_launch();  // the tiles may start; they wait for this grid before their adds
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) words[i] = 0u;
}

__device__ __forceinline__ void fixed_sum_final(const float* __restrict__ workspace, __half* __restrict__ out,
                                                int64_t cols) {
  const int64_t col = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  wait_for_previous_grid();
  if (col >= cols) return;
  const float special = workspace[2 * cols + col];
  const long long sum = reinterpret_cast<const long long*>(workspace)[col];
  // One rounding to float16 from the exact sum (a double holds it whole below 2^53, and rounds it
  // once below 2^63: the same bits every time). Beyond 65504 it is Inf, as torch's cast gives.
  out[col] = special != 0.f ? __float2half_rn(special) : __double2half(__ll2double_rn(sum) * kFixedUnit);
}

}  // namespace
}  // namespace rawops

// Each op twice: the contiguous entry and the strided one (<name>_strided_<suffix>).
#define RAWOPS_MAP(name, Op, T, suffix)                                                                \
  extern "C" __global__ void __launch_bounds__(RAWOPS_MAP_THREADS)                                    \
      name##_##suffix(const T* a, const T* b, const T* c, T* out, long long n, long long head,        \
                      long long inner, float alpha) {                                                 \
    rawops::map<rawops::Op<T>>(a, b, c, out, n, head, inner, alpha);                                  \
  }                                                                                                   \
  extern "C" __global__ void __launch_bounds__(RAWOPS_MAP_THREADS)                                    \
      name##_strided_##suffix(const T* a, const T* b, const T* c, T* out, long long n, float alpha,   \
                              rawops::MapLayout layout) {                                             \
    rawops::map_strided<rawops::Op<T>>(a, b, c, out, n, alpha, layout);                               \
  }

// The heavier forwards also as <name>_x<U>_<suffix>: U 16-byte vectors a thread, every load in
// flight before the math. Taken where the memory is fast an SM (rawops._modules.fast_memory: the H200),
// where one vector a thread left too few bytes in flight behind the erf / bias arithmetic (rawops/
// elementwise.py FAST_UNROLL, measured with dev/time_map_shapes.py).
#define RAWOPS_UNROLLED_MAP(name, Op, T, suffix, U)                                                    \
  extern "C" __global__ void __launch_bounds__(RAWOPS_MAP_THREADS)                                    \
      name##_x##U##_##suffix(const T* a, const T* b, const T* c, T* out, long long n, long long head, \
                             long long inner, float alpha) {                                          \
    rawops::map<rawops::Op<T>, T, U>(a, b, c, out, n, head, inner, alpha);                            \
  }
#define RAWOPS_UNROLLED_HALF_MAPS(T, suffix)                        \
  RAWOPS_UNROLLED_MAP(gelu_erf_fwd, GeluErf, T, suffix, 2)         \
  RAWOPS_UNROLLED_MAP(bias_gelu_tanh_fwd, BiasGeluTanh, T, suffix, 2) \
  RAWOPS_UNROLLED_MAP(bias_gelu_erf_fwd, BiasGeluErf, T, suffix, 4)
#define RAWOPS_UNROLLED_F32_MAPS                                    \
  RAWOPS_UNROLLED_MAP(gelu_erf_fwd, GeluErf, float, f32, 2)        \
  RAWOPS_UNROLLED_MAP(bias_gelu_erf_fwd, BiasGeluErf, float, f32, 4)

#define RAWOPS_BIAS_BWD_PARTIAL(name, Op, T, suffix)                                            \
  extern "C" __global__ void __launch_bounds__(rawops::kBiasBwdThreads, rawops::BiasBwdShape<T>::blocks) \
      name##_##suffix(const T* dy, const T* x, const T* bias, T* dx, float* partial, long long rows, \
                      long long cols, long long strip) {                                         \
    rawops::bias_bwd_partial<rawops::Op<T>>(dy, x, bias, dx, partial, rows, cols, int(strip));     \
  }

// BOUNDS: the entry's launch bounds (the tiles' TILE_BOUNDS of RAWOPS_ELEMENTWISE).
#define RAWOPS_BIAS_BWD_TILE(name, Op, T, suffix, BOUNDS)                                                   \
  extern "C" __global__ void BOUNDS                                                                          \
      name##_##suffix(const T* dy, const T* x, const T* bias, T* dx, float* partial, long long rows,         \
                      long long cols) {                                                                      \
    using Shape = rawops::BiasBwdTile<T>;                                                                    \
    rawops::bias_bwd_tile<rawops::Op<T>, T, Shape::threads, Shape::rows, Shape::per>(dy, x, bias, dx, partial, \
                                                                                     rows, cols);             \
  }

// TILE_BOUNDS: the short tiles' launch bounds (bfloat16's keep BiasBwdTile's blocks an SM).
#define RAWOPS_ELEMENTWISE(T, suffix, TILE_BOUNDS)                                       \
  RAWOPS_MAP(gelu_tanh_fwd, GeluTanh, T, suffix)                                         \
  RAWOPS_MAP(gelu_tanh_bwd, GeluTanhBwd, T, suffix)                                      \
  RAWOPS_MAP(gelu_erf_fwd, GeluErf, T, suffix)                                           \
  RAWOPS_MAP(gelu_erf_bwd, GeluErfBwd, T, suffix)                                        \
  RAWOPS_MAP(relu_fwd, Relu, T, suffix)                                                  \
  RAWOPS_MAP(relu_bwd, ReluBwd, T, suffix)                                               \
  RAWOPS_MAP(relu_scale_fwd, ReluScale, T, suffix)                                       \
  RAWOPS_MAP(relu_scale_bwd, ReluScaleBwd, T, suffix)                                    \
  RAWOPS_MAP(relu_scale_add_fwd, ReluScaleAdd, T, suffix)                                \
  RAWOPS_MAP(add_fwd, Add, T, suffix)                                                    \
  RAWOPS_MAP(bias_gelu_tanh_fwd, BiasGeluTanh, T, suffix)                                \
  RAWOPS_MAP(bias_gelu_tanh_bwd, BiasGeluTanhBwd, T, suffix)                             \
  RAWOPS_MAP(bias_gelu_erf_fwd, BiasGeluErf, T, suffix)                                  \
  RAWOPS_MAP(bias_gelu_erf_bwd, BiasGeluErfBwd, T, suffix)                               \
  extern "C" __global__ void column_sum_part_##suffix(const T* x, float* partial, long long rows, \
                                                      long long cols, long long rows_per_chunk,   \
                                                      long long row_stride, long long col_stride) { \
    rawops::column_sum_part(x, partial, rows, cols, rows_per_chunk, row_stride, col_stride); \
  }                                                                                      \
  extern "C" __global__ void __launch_bounds__(rawops::kFinalColumns * rawops::kFinalGroups) \
      column_sum_final_##suffix(const float* partial, T* out, long long chunks, long long cols) { \
    rawops::column_sum_final(partial, out, chunks, cols);                                \
  }                                                                                      \
  RAWOPS_BIAS_BWD_PARTIAL(bias_gelu_tanh_bwd_partial, BiasGeluTanhBwd, T, suffix)        \
  RAWOPS_BIAS_BWD_PARTIAL(bias_gelu_erf_bwd_partial, BiasGeluErfBwd, T, suffix)        \
  RAWOPS_BIAS_BWD_PARTIAL(gelu_tanh_bwd_partial, GeluTanhBwd, T, suffix)                 \
  RAWOPS_BIAS_BWD_PARTIAL(gelu_erf_bwd_partial, GeluErfBwd, T, suffix)                  \
  RAWOPS_BIAS_BWD_TILE(bias_gelu_tanh_bwd_tile, BiasGeluTanhBwd, T, suffix, TILE_BOUNDS) \
  RAWOPS_BIAS_BWD_TILE(bias_gelu_erf_bwd_tile, BiasGeluErfBwd, T, suffix, TILE_BOUNDS) \
  RAWOPS_BIAS_BWD_TILE(gelu_tanh_bwd_tile, GeluTanhBwd, T, suffix, TILE_BOUNDS) \
  RAWOPS_BIAS_BWD_TILE(gelu_erf_bwd_tile, GeluErfBwd, T, suffix, TILE_BOUNDS)

RAWOPS_ELEMENTWISE(float, f32, __launch_bounds__(rawops::BiasBwdTile<float>::threads))
RAWOPS_ELEMENTWISE(__half, f16, __launch_bounds__(rawops::BiasBwdTile<__half>::threads))
RAWOPS_ELEMENTWISE(__nv_bfloat16, bf16,
                   __launch_bounds__(rawops::BiasBwdTile<__nv_bfloat16>::threads,
                                     rawops::BiasBwdTile<__nv_bfloat16>::blocks))
RAWOPS_UNROLLED_F32_MAPS
RAWOPS_UNROLLED_HALF_MAPS(__half, f16)
RAWOPS_UNROLLED_HALF_MAPS(__nv_bfloat16, bf16)

// float16's tiles with dbias summed exactly (bias_bwd_tile's kExact), and their two small launches.
#define RAWOPS_BIAS_BWD_TILE_EXACT(name, Op)                                                                   \
  extern "C" __global__ void __launch_bounds__(rawops::BiasBwdTile<__half>::threads)                           \
      name##_f16(const __half* dy, const __half* x, const __half* bias, __half* dx, float* partial,            \
                 long long rows, long long cols) {                                                             \
    using Shape = rawops::BiasBwdTile<__half>;                                                                 \
    rawops::bias_bwd_tile<rawops::Op<__half>, __half, Shape::threads, Shape::rows, Shape::per, true>(         \
        dy, x, bias, dx, partial, rows, cols);                                                                 \
  }

RAWOPS_BIAS_BWD_TILE_EXACT(bias_gelu_tanh_bwd_tile_exact, BiasGeluTanhBwd)
RAWOPS_BIAS_BWD_TILE_EXACT(bias_gelu_erf_bwd_tile_exact, BiasGeluErfBwd)
RAWOPS_BIAS_BWD_TILE_EXACT(gelu_tanh_bwd_tile_exact, GeluTanhBwd)
RAWOPS_BIAS_BWD_TILE_EXACT(gelu_erf_bwd_tile_exact, GeluErfBwd)

extern "C" __global__ void __launch_bounds__(RAWOPS_FIXED_SUM_THREADS) fixed_sum_zero(unsigned* words,
                                                                                   long long count) {
  rawops::fixed_sum_zero(words, count);
}

extern "C" __global__ void __launch_bounds__(RAWOPS_FIXED_SUM_THREADS) fixed_sum_final_f16(const float* workspace,
                                                                                        __half* out,
                                                                                        long long cols) {
  rawops::fixed_sum_final(workspace, out, cols);
}
