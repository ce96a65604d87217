// Device code the MLP kernel files share (kernels/mlp_source.cu, mlp_source_tc.cu, mlp_tiles.cu,
// mlp_fused_fwd.cu, mlp_fused_bwd.cu): the activations and their codes, the per-layer pointers
// of the tensor-core entries, the staging of rows into shared memory (load_rows), and the pieces
// of the mma.sync kernels (sm_80+: cp.async with zero fill, ldmatrix, the storage type's pairs). Each kernel file
// is its own translation unit (its own fatbin): what is here has internal linkage there, as if
// written in each.
#pragma once

#include "rawops/dtype.cuh"
#include "rawops/mma_sync.cuh"

namespace rawops {
namespace {

// NaN propagates like torch.relu (fmaxf would turn it into 0).
__device__ __forceinline__ float relu(float v) { return (v > 0.f || v != v) ? v : 0.f; }

// Activation codes (hidden and output). The tensor-core kernels' flags hold the hidden one in
// bits 0-1 and the output one from bit kOutputActShift; the source network's flags are its output
// activation's code.
constexpr int kActNone = RAWOPS_MLP_ACT_NONE, kActRelu = RAWOPS_MLP_ACT_RELU, kActGelu = RAWOPS_MLP_ACT_GELU;
constexpr int kOutputActShift = RAWOPS_MLP_OUTPUT_ACT_SHIFT;
// Layers a tensor-core entry takes pointers for (up to 8 hidden ones, RAWOPS_TC_PARAMS below), and
// the widest layer: a layer's biases take a row of kMaxWidth floats in shared memory.
constexpr int kMaxLayers = RAWOPS_MLP_MAX_LAYERS;
constexpr int kMaxWidth = RAWOPS_MLP_MAX_WIDTH;

__device__ __forceinline__ float activate(float v, int a) {
  if (a == kActRelu) return relu(v);
  if (a == kActGelu) return 0.5f * v * (1.f + erff(v * 0.70710678118654752f));
  return v;
}

__device__ __forceinline__ float activate_grad(float z, int a) {
  if (a == kActRelu) return z > 0.f ? 1.f : 0.f;
  if (a == kActGelu) return 0.5f * (1.f + erff(z * 0.70710678118654752f)) + z * 0.39894228040143268f * __expf(-0.5f * z * z);
  return 1.f;
}

__host__ __device__ constexpr int round16(int v) { return (v + 15) / 16 * 16; }

// dst[r][c] (r < rows_total, c < cols_p; row stride ld) = f(src[r][c]) for r < rows_valid,
// c < cols, else 0; f: optional mask m (value kept where m > 0) then activation a. Done by
// `nthreads` threads (a block, or one warp for its own rows), four loads in flight per
// thread before any store (a loop of load-then-store pays one memory latency per element).
template <typename T>
__device__ __forceinline__ void load_rows(T* __restrict__ dst, int ld, const T* __restrict__ src, int64_t stride,
                                          int rows_valid, int rows_total, int cols, int cols_p,
                                          const T* __restrict__ m, int a, int tid, int nthreads) {
  constexpr int kV = 16 / sizeof(T), kBatch = 4;
  const bool vec = cols % kV == 0 && stride % kV == 0 && (reinterpret_cast<size_t>(src) % 16) == 0 &&
                   (m == nullptr || (reinterpret_cast<size_t>(m) % 16) == 0);
  if (vec) {
    const int per_row = cols_p / kV, total = rows_total * per_row;
    for (int base = tid; base < total; base += kBatch * nthreads) {
      Vec16<T> v[kBatch], mv[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const int e = base + i * nthreads;
        const int r = e / per_row, c = (e % per_row) * kV;
        if (e < total && r < rows_valid && c < cols) {
          v[i] = load16(src + r * stride + c);
          if (m != nullptr) mv[i] = load16(m + r * stride + c);
        } else {
#pragma unroll
          for (int j = 0; j < kV; ++j) v[i].v[j] = from_float<T>(0.f);
        }
      }
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const int e = base + i * nthreads;
        if (e >= total) break;
        const int r = e / per_row, c = (e % per_row) * kV;
        if ((m != nullptr || a != kActNone) && r < rows_valid && c < cols) {
#pragma unroll
          for (int j = 0; j < kV; ++j) {
            float f = to_float(v[i].v[j]);
            if (m != nullptr && !(to_float(mv[i].v[j]) > 0.f)) f = 0.f;
            v[i].v[j] = from_float<T>(activate(f, a));
          }
        }
        *reinterpret_cast<Vec16<T>*>(dst + r * ld + c) = v[i];
      }
    }
  } else {
    const int total = rows_total * cols_p;
    for (int base = tid; base < total; base += kBatch * nthreads) {
      float f[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const int e = base + i * nthreads;
        const int r = e / cols_p, c = e % cols_p;
        f[i] = 0.f;
        if (e < total && r < rows_valid && c < cols) {
          f[i] = to_float(src[r * stride + c]);
          if (m != nullptr && !(to_float(m[r * stride + c]) > 0.f)) f[i] = 0.f;
        }
      }
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const int e = base + i * nthreads;
        if (e >= total) break;
        const int r = e / cols_p, c = e % cols_p;
        dst[r * ld + c] = from_float<T>(activate(f[i], a));
      }
    }
  }
}

// 16 bytes global -> shared without a register round trip; src_bytes 0 writes zeros (sm_80+).
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// The storage type's pairs (half2 / bfloat162 in a 32-bit register) and its m16n8k16 mma.sync.
template <typename T> struct Mma;
template <> struct Mma<__half> {
  __device__ static __forceinline__ unsigned pack(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&h);
  }
  // max(v, 0) on both halves, NaN kept (torch.relu's semantics).
  __device__ static __forceinline__ unsigned relu(unsigned v) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    const __half2 h = __hmax2_nan(*reinterpret_cast<const __half2*>(&v), __float2half2_rn(0.f));
    return *reinterpret_cast<const unsigned*>(&h);
#else
    return v;
#endif
  }
  __device__ static __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    mma_m16n8k16<__half>(d, a, b0, b1);
  }
};
template <> struct Mma<__nv_bfloat16> {
  __device__ static __forceinline__ unsigned pack(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&h);
  }
  __device__ static __forceinline__ unsigned relu(unsigned v) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    const __nv_bfloat162 h =
        __hmax2_nan(*reinterpret_cast<const __nv_bfloat162*>(&v), __float2bfloat162_rn(0.f));
    return *reinterpret_cast<const unsigned*>(&h);
#else
    return v;
#endif
  }
  __device__ static __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    mma_m16n8k16<__nv_bfloat16>(d, a, b0, b1);
  }
};

__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// e / d and e % d for 0 <= e < 2^12, 1 <= d <= 16 through a float reciprocal computed once
// (exact at these sizes: the error of (e + 0.5) * inv stays far under 0.5 / d); a runtime
// integer division costs ~15 instructions, and the staging loops do one per 16-byte chunk.
struct SmallDiv {
  int d;
  float inv;
  __device__ explicit SmallDiv(int d_) : d(d_), inv(1.f / float(d_)) {}
  __device__ __forceinline__ int quot(int e) const { return int((float(e) + 0.5f) * inv); }
};

}  // namespace
}  // namespace rawops

// The per-layer weight (and bias) pointers of a tensor-core entry, kMaxLayers of them (null past
// the network's layers).
#define RAWOPS_TC_PARAMS(T)                                                                                     \
  const T *w0, const T *w1, const T *w2, const T *w3, const T *w4, const T *w5, const T *w6, const T *w7,      \
      const T *w8
#define RAWOPS_TC_BIASES(T)                                                                                     \
  const T *b0, const T *b1, const T *b2, const T *b3, const T *b4, const T *b5, const T *b6, const T *b7,      \
      const T *b8
