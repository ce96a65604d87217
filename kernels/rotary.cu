// Rotary family: rope, the rotary position embedding applied in place to q and k, forward and
// backward.
//
// Each head row x (D elements, D even) of q (B, S, Hq, D) and k (B, S, Hk, D) at position (b, s)
// is rotated with that position's cos and sin rows (D elements each), pair by pair:
//   forward   o_i = x_i cos_i - x_j sin_i,   o_j = x_j cos_j + x_i sin_j
//   backward  g_i = d_i cos_i + d_j sin_j,   g_j = d_j cos_j - d_i sin_i   (the transpose: exact for
//             any cos / sin; with cos_i = cos_j and sin_i = sin_j it is the rotation by -sin)
// that is o = x * cos + R(x) * sin, R(x)_i = -x_j, R(x)_j = x_i. The pairs (i, j):
//   half         (i, i + D/2), i < D/2: HF's rotate_half, GPT-NeoX's ("neox", HF Llama's)
//   interleaved  (2p, 2p + 1): GPT-J's rotate_every_two and Meta's original Llama ("llama")
// Signature (both directions): q, k written in place; strides in elements, the last dim contiguous:
//   rope_<fwd|bwd>_<dtype>(T* q, T* k, const T* cos, const T* sin, int64 batch, int64 seq,
//                          int64 q_heads, int64 k_heads, int64 dim,
//                          int64 q_b, int64 q_s, int64 q_h, int64 k_b, int64 k_s, int64 k_h,
//                          int64 cos_b, int64 cos_s, int64 sin_b, int64 sin_s, int64 flags)
//   k_heads 0: q alone. cos / sin at (b, s): cos + b * cos_b + s * cos_s (cos_b 0: one table for
//   every batch row, (S, D) or (1, S, D)). flags: RAWOPS_ROPE_FLAG_VECTORS, _INTERLEAVED.
// Traffic: q and k read once and written once; cos and sin read once per group of heads (L1 / L2
// hits: a warp's consecutive units are consecutive heads of one position).
// Work: units, flat over (position, group of heads, unit of the head), the unit fastest. With 16-byte vectors
// (flags, rawops/rotary.py rope_plan: every pointer 16-byte aligned, every stride whole vectors, the
// half dim (half) or the dim (interleaved) whole vectors) a unit is the vectors at i and i + D/2
// (V pairs (i, i + D/2), half; V pairs (2p, 2p + 1), interleaved with the half dim whole vectors),
// or one vector of V/2 pairs (interleaved otherwise), with their cos and sin; otherwise one pair. A thread takes one unit of RAWOPS_ROPE_HEADS consecutive heads (q's then k's) of one
// position, RAWOPS_ROPE_THREADS a block, a grid-stride loop over the blocks the device holds at once. Each unit's elements are read, then written, by one thread: in place is safe.
// Math in float32, one rounding to T; 64-bit offsets, 32-bit divisions where the counts fit.
#include "rawops/dtype.cuh"

namespace rawops {
namespace {


struct RopeArgs {
  int64_t batch, seq, q_heads, k_heads, dim;
  int64_t q_b, q_s, q_h, k_b, k_s, k_h, cos_b, cos_s, sin_b, sin_s;
};

// q = i / d and r = i - q d, 32-bit where both fit.
__device__ __forceinline__ int64_t divide(int64_t i, int64_t d, int64_t& r) {
  if (((i | d) >> 32) == 0) {
    const unsigned q = unsigned(i) / unsigned(d);
    r = int64_t(unsigned(i) - q * unsigned(d));
    return q;
  }
  const int64_t q = i / d;
  r = i - q * d;
  return q;
}

// One pair: (x_i, x_j) -> (o_i, o_j) with cos (c_i, c_j) and sin (s_i, s_j).
template <bool kBackward>
__device__ __forceinline__ void rotate(float xi, float xj, float ci, float cj, float si, float sj, float& oi,
                                       float& oj) {
  if (kBackward) {
    oi = fmaf(xj, sj, xi * ci);
    oj = fmaf(-xi, si, xj * cj);
  } else {
    oi = fmaf(-xj, si, xi * ci);
    oj = fmaf(xi, sj, xj * cj);
  }
}

// One vector of V / 2 interleaved pairs (2p, 2p + 1) rotated with its cos and sin vectors.
template <bool kBackward, typename T>
__device__ __forceinline__ Vec16<T> rotate_pairs(const Vec16<T>& x, const Vec16<T>& c, const Vec16<T>& s) {
  Vec16<T> o;
#pragma unroll
  for (int e = 0; e < Vec16<T>::size; e += 2) {
    const float2 xp = to_float2(x, e), cp = to_float2(c, e), sp = to_float2(s, e);
    float oi, oj;
    rotate<kBackward>(xp.x, xp.y, cp.x, cp.y, sp.x, sp.y, oi, oj);
    from_float2<T>(oi, oj, o.v + e);
  }
  return o;
}

template <typename T, bool kBackward, bool kInterleaved>
__device__ __forceinline__ void rope_units(T* __restrict__ q, T* __restrict__ k, const T* __restrict__ cos,
                                           const T* __restrict__ sin, const RopeArgs& a, bool vec) {
  constexpr int V = Vec16<T>::size;
  constexpr int G = RAWOPS_ROPE_HEADS;
  const int64_t half = a.dim / 2;
  // Units a head: V pairs each with vectors, one pair each without; a thread takes one unit of G
  // consecutive heads of one position (their cos and sin loaded once, G heads' loads in flight).
  // Interleaved with whole vectors in each half (two): a unit is the vectors at col and col + D/2,
  // as the half split's, so a thread has as many bytes in flight (one vector a unit held the H200
  // at 0.86 of the copy ceiling against the half split's 0.91-0.93).
  const bool two = kInterleaved && half % V == 0;
  const int64_t per_head = vec ? (kInterleaved && !two ? a.dim / V : half / V) : half;
  const int64_t heads = a.q_heads + a.k_heads;
  const int64_t groups = (heads + G - 1) / G;
  const int64_t total = a.batch * a.seq * groups * per_head;
  for (int64_t unit = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; unit < total;
       unit += int64_t(gridDim.x) * blockDim.x) {
    int64_t u, group, s;
    const int64_t row = divide(unit, per_head, u);  // (position, group of heads)
    const int64_t position = divide(row, groups, group);
    const int64_t b = divide(position, a.seq, s);
    T* x[G];
#pragma unroll
    for (int j = 0; j < G; ++j) {
      const int64_t head = group * G + j;
      x[j] = head >= heads      ? nullptr
             : head < a.q_heads ? q + b * a.q_b + s * a.q_s + head * a.q_h
                                : k + b * a.k_b + s * a.k_s + (head - a.q_heads) * a.k_h;
    }
    const T* c = cos + b * a.cos_b + s * a.cos_s;
    const T* sn = sin + b * a.sin_b + s * a.sin_s;
    if (vec && !kInterleaved) {  // the vectors at col and col + D/2: V pairs
      const int64_t col = u * V;
      const Vec16<T> ca = load16(c + col), cb = load16(c + half + col);
      const Vec16<T> sa = load16(sn + col), sb = load16(sn + half + col);
      Vec16<T> xa[G], xb[G];
#pragma unroll
      for (int j = 0; j < G; ++j) {
        if (x[j]) {
          xa[j] = load16(x[j] + col);
          xb[j] = load16(x[j] + half + col);
        }
      }
#pragma unroll
      for (int j = 0; j < G; ++j) {
        if (!x[j]) continue;
        Vec16<T> oa, ob;
#pragma unroll
        for (int e = 0; e < V; e += 2) {
          const float2 xi = to_float2(xa[j], e), xj = to_float2(xb[j], e), ci = to_float2(ca, e);
          const float2 cj = to_float2(cb, e), si = to_float2(sa, e), sj = to_float2(sb, e);
          float oi0, oj0, oi1, oj1;
          rotate<kBackward>(xi.x, xj.x, ci.x, cj.x, si.x, sj.x, oi0, oj0);
          rotate<kBackward>(xi.y, xj.y, ci.y, cj.y, si.y, sj.y, oi1, oj1);
          from_float2<T>(oi0, oi1, oa.v + e);
          from_float2<T>(oj0, oj1, ob.v + e);
        }
        store16(x[j] + col, oa);
        store16(x[j] + half + col, ob);
      }
    } else if (vec && two) {  // the vectors at col and col + D/2, V / 2 pairs (2p, 2p + 1) each
      const int64_t col = u * V;
      const Vec16<T> ca = load16(c + col), cb = load16(c + half + col);
      const Vec16<T> sa = load16(sn + col), sb = load16(sn + half + col);
      Vec16<T> xa[G], xb[G];
#pragma unroll
      for (int j = 0; j < G; ++j) {
        if (x[j]) {
          xa[j] = load16(x[j] + col);
          xb[j] = load16(x[j] + half + col);
        }
      }
#pragma unroll
      for (int j = 0; j < G; ++j) {
        if (!x[j]) continue;
        store16(x[j] + col, rotate_pairs<kBackward>(xa[j], ca, sa));
        store16(x[j] + half + col, rotate_pairs<kBackward>(xb[j], cb, sb));
      }
    } else if (vec) {  // one vector of V / 2 pairs (2p, 2p + 1)
      const int64_t col = u * V;
      const Vec16<T> cv = load16(c + col), sv = load16(sn + col);
      Vec16<T> xv[G];
#pragma unroll
      for (int j = 0; j < G; ++j) {
        if (x[j]) xv[j] = load16(x[j] + col);
      }
#pragma unroll
      for (int j = 0; j < G; ++j) {
        if (x[j]) store16(x[j] + col, rotate_pairs<kBackward>(xv[j], cv, sv));
      }
    } else {  // one pair
      const int64_t i = kInterleaved ? 2 * u : u, j = kInterleaved ? i + 1 : i + half;
      const float ci = to_float(__ldg(c + i)), cj = to_float(__ldg(c + j));
      const float si = to_float(__ldg(sn + i)), sj = to_float(__ldg(sn + j));
#pragma unroll
      for (int h = 0; h < G; ++h) {
        if (!x[h]) continue;
        float oi, oj;
        rotate<kBackward>(to_float(x[h][i]), to_float(x[h][j]), ci, cj, si, sj, oi, oj);
        x[h][i] = from_float<T>(oi);
        x[h][j] = from_float<T>(oj);
      }
    }
  }
}

template <typename T, bool kBackward>
__device__ __forceinline__ void rope(T* q, T* k, const T* cos, const T* sin, const RopeArgs& a, long long flags) {
  const bool vec = flags & RAWOPS_ROPE_FLAG_VECTORS;
  if (flags & RAWOPS_ROPE_FLAG_INTERLEAVED) {
    rope_units<T, kBackward, true>(q, k, cos, sin, a, vec);
  } else {
    rope_units<T, kBackward, false>(q, k, cos, sin, a, vec);
  }
}

}  // namespace
}  // namespace rawops

#define RAWOPS_ROPE(T, suffix)                                                                                    \
  extern "C" __global__ void __launch_bounds__(RAWOPS_ROPE_THREADS)                                              \
      rope_fwd_##suffix(T* q, T* k, const T* cos, const T* sin, long long batch, long long seq, long long q_heads, \
                        long long k_heads, long long dim, long long q_b, long long q_s, long long q_h, long long k_b, \
                        long long k_s, long long k_h, long long cos_b, long long cos_s, long long sin_b,           \
                        long long sin_s, long long flags) {                                                      \
    const rawops::RopeArgs a{batch, seq, q_heads, k_heads, dim, q_b, q_s, q_h, k_b, k_s, k_h, cos_b, cos_s, sin_b, \
                             sin_s};                                                                             \
    rawops::rope<T, false>(q, k, cos, sin, a, flags);                                                            \
  }                                                                                                              \
  extern "C" __global__ void __launch_bounds__(RAWOPS_ROPE_THREADS)                                              \
      rope_bwd_##suffix(T* q, T* k, const T* cos, const T* sin, long long batch, long long seq, long long q_heads, \
                        long long k_heads, long long dim, long long q_b, long long q_s, long long q_h, long long k_b, \
                        long long k_s, long long k_h, long long cos_b, long long cos_s, long long sin_b,           \
                        long long sin_s, long long flags) {                                                      \
    const rawops::RopeArgs a{batch, seq, q_heads, k_heads, dim, q_b, q_s, q_h, k_b, k_s, k_h, cos_b, cos_s, sin_b, \
                             sin_s};                                                                             \
    rawops::rope<T, true>(q, k, cos, sin, a, flags);                                                             \
  }

RAWOPS_ROPE(float, f32)
RAWOPS_ROPE(__half, f16)
RAWOPS_ROPE(__nv_bfloat16, bf16)
