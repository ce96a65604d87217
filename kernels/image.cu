// Image family: rgb_to_gray, normalize_volume, to_tensor_normalize. Memory-bound maps, plus
// normalize_volume's min/max reduction; no backward.
//
// rgb_to_gray_fwd_<layout>_<in>_<out>(x, y, images, pixels, vec)
//   layout hwc: x is (pixels, 3) interleaved R, G, B (images == 1: a batch is one long row of
//   pixels); chw: x is (images, 3, pixels), one plane a channel. y is (images, pixels).
//   uint8 -> uint8: OpenCV's fixed point, (R*9798 + G*19235 + B*3735 + 2^14) >> 15 (the weights
//   of 0.299, 0.587, 0.114 in 15 bits; rawops/_constants.py), bit-exact with cv2.cvtColor.
//   Any other pair: g = (R*0.299f + G*0.587f) + B*0.114f in float32, each product and sum
//   rounded once (no FMA contraction), i.e. what torch computes in float32 for that expression;
//   then rounded to the output type (uint8: round to nearest even, saturated to [0, 255], NaN 0).
//   Bytes: 3 * pixels * sizeof(in) read, pixels * sizeof(out) written.
// to_tensor_normalize_fwd_<nchw|nhwc>_c<C>_<out>(x, y, images, pixels, vec, s0..s3, t0..t3)
//   x uint8 (images, pixels, C); y = x * s[c] + t[c] (one FMA: s = 1 / (255 std), t = -mean / std,
//   passed by value), as (images, C, pixels) (nchw) or (images, pixels, C) (nhwc).
//   Bytes: C * pixels read, C * pixels * sizeof(out) written.
// Both walk chunks of P pixels of one image, one chunk a thread per grid-stride step, P being
// IMAGE_PIXELS (16) bytes of the wider of the input and output types (pixels_per_step): every
// output plane is written a 16-byte word a thread (a 4- or 8-byte one for a narrower output), and
// consecutive threads' words are consecutive, so the warp's stores are whole lines; the input is
// the P pixels' words before them (48 bytes of interleaved RGB at most, three 16-byte loads).
// Full chunks take that vector path when `vec` (the launcher's check that every chunk starts
// aligned in every operand); otherwise, and an image's last partial chunk, element by element.
// nhwc to_tensor_normalize is a map over the interleaved elements, channel i % C, P at a step.
//
// volume_minmax_<in>(x, partials, n, vec) / normalize_volume_fwd_<in>_<out>(x, y, n, partials,
// count, lo, hi, flags, vec)
//   The first pass writes one (min, max) a block to partials; the map kernel's every block reduces
//   the `count` partials again (a few KB from L2, in a fixed order: deterministic) for what
//   `flags` takes from them (IMAGE_FLAG_LO, _HI; else lo / hi as given), then
//   y = (x - lo) / (hi - lo), clipped to [0, 1] under IMAGE_FLAG_CLIP. hi <= lo gives 0
//   (no NaN or inf); NaN propagates: a NaN in x makes min and max NaN, so every output is NaN,
//   as in torch's (v - v.min()) / (v.max() - v.min()); clipping keeps NaN.
//   Bytes: x read twice (once with lo and hi given), y written once. The map moves a 16-byte word
//   of the wider type a thread per step (the narrower side's word is consecutive too).
// Launch: blocks of IMAGE_THREADS; rgb_to_gray and to_tensor_normalize a grid covering every chunk
// once (the loops walk on only past gridDim.x's limit), normalize_volume's kernels a grid-stride grid
// of at most the blocks the device holds at once (rawops/image.py); 64-bit indexing throughout.
#include <cub/block/block_reduce.cuh>

#include "rawops/dependent_launch.cuh"
#include "rawops/dtype.cuh"

namespace rawops {
namespace {

using u8 = unsigned char;
using u16 = unsigned short;
constexpr int kThreads = RAWOPS_IMAGE_THREADS;
constexpr int kUnroll = RAWOPS_IMAGE_REDUCE_UNROLL;

// K elements of T moved as the widest words (16, 8 or 4 bytes) its size is a multiple of.
template <int BYTES> struct WordOf;
template <> struct WordOf<16> { using type = uint4; };
template <> struct WordOf<8> { using type = uint2; };
template <> struct WordOf<4> { using type = unsigned; };
template <typename T, int K> struct alignas(16) Chunk {
  static constexpr int kBytes = int(K * sizeof(T));
  static_assert(kBytes % 4 == 0, "a chunk is whole 4-byte words");
  static constexpr int kWord = kBytes % 16 == 0 ? 16 : (kBytes % 8 == 0 ? 8 : 4);
  using Word = typename WordOf<kWord>::type;
  T v[K];
  __device__ __forceinline__ void load(const T* p) {
    const Word* src = reinterpret_cast<const Word*>(p);
    Word* dst = reinterpret_cast<Word*>(v);
#pragma unroll
    for (int i = 0; i < kBytes / kWord; ++i) dst[i] = __ldg(src + i);
  }
  __device__ __forceinline__ void store(T* p) const {
    Word* dst = reinterpret_cast<Word*>(p);
    const Word* src = reinterpret_cast<const Word*>(v);
#pragma unroll
    for (int i = 0; i < kBytes / kWord; ++i) dst[i] = src[i];
  }
};

// Pixels (elements) a thread moves per step: RAWOPS_IMAGE_PIXELS bytes of the wider of the two
// types, so that a warp's loads and stores of each plane are consecutive words (coalesced).
template <typename A, typename B> __host__ __device__ constexpr int pixels_per_step() {
  return RAWOPS_IMAGE_PIXELS / int(sizeof(A) > sizeof(B) ? sizeof(A) : sizeof(B));
}

__device__ __forceinline__ float as_float(u8 v) { return float(v); }
__device__ __forceinline__ float as_float(u16 v) { return float(v); }
__device__ __forceinline__ float as_float(float v) { return v; }
__device__ __forceinline__ float as_float(__half v) { return __half2float(v); }

// float -> T: float types round to nearest even; uint8 rounds to nearest even and saturates
// (cvt.rni to u32 clamps below 0 and sends NaN to 0; min clamps above 255).
template <typename T> __device__ __forceinline__ T convert(float v) { return from_float<T>(v); }
template <> __device__ __forceinline__ u8 convert<u8>(float v) { return u8(min(__float2uint_rn(v), 255u)); }

// ------------------------------------------------------------------------------ rgb_to_gray
template <typename Tin, typename Tout>
__device__ __forceinline__ Tout gray(Tin r, Tin g, Tin b) {
  if constexpr (sizeof(Tin) == 1 && sizeof(Tout) == 1) {
    constexpr unsigned kRound = 1u << (RAWOPS_IMAGE_GRAY_SHIFT - 1);
    return u8((unsigned(r) * RAWOPS_IMAGE_GRAY_R + unsigned(g) * RAWOPS_IMAGE_GRAY_G +
               unsigned(b) * RAWOPS_IMAGE_GRAY_B + kRound) >> RAWOPS_IMAGE_GRAY_SHIFT);
  } else {
    const float y = __fadd_rn(__fadd_rn(__fmul_rn(as_float(r), 0.299f), __fmul_rn(as_float(g), 0.587f)),
                              __fmul_rn(as_float(b), 0.114f));
    return convert<Tout>(y);
  }
}

template <typename Tin, typename Tout, bool PLANAR>
__device__ __forceinline__ void rgb_to_gray(const Tin* __restrict__ x, Tout* __restrict__ y, int64_t images,
                                            int64_t pixels, int64_t vec) {
  constexpr int P = pixels_per_step<Tin, Tout>();
  const int64_t per_image = (pixels + P - 1) / P;
  const int64_t chunks = images * per_image;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks; c += step) {
    const int64_t n = c / per_image, p0 = (c - n * per_image) * P;
    const int count = int(min(int64_t(P), pixels - p0));
    const Tin* src = PLANAR ? x + n * 3 * pixels + p0 : x + p0 * 3;  // hwc: images == 1
    Tout* dst = y + n * pixels + p0;
    if (vec && count == P) {
      Chunk<Tout, P> o;
      if constexpr (PLANAR) {
        Chunk<Tin, P> r, g, b;
        r.load(src);
        g.load(src + pixels);
        b.load(src + 2 * pixels);
#pragma unroll
        for (int e = 0; e < P; ++e) o.v[e] = gray<Tin, Tout>(r.v[e], g.v[e], b.v[e]);
      } else {
        Chunk<Tin, 3 * P> s;
        s.load(src);
#pragma unroll
        for (int e = 0; e < P; ++e) o.v[e] = gray<Tin, Tout>(s.v[3 * e], s.v[3 * e + 1], s.v[3 * e + 2]);
      }
      o.store(dst);
    } else {
      for (int e = 0; e < count; ++e) {
        const int64_t r = PLANAR ? e : 3 * e, channel = PLANAR ? pixels : 1;
        dst[e] = gray<Tin, Tout>(src[r], src[r + channel], src[r + 2 * channel]);
      }
    }
  }
}

// ------------------------------------------------------------------------------ to_tensor_normalize
// Planar output (nchw): a thread converts P pixels of one image, its C planes' stores a 16-byte
// word each (the warp's consecutive), its input the P * C bytes before them.
template <int C, typename Tout>
__device__ __forceinline__ void to_tensor_planar(const u8* __restrict__ x, Tout* __restrict__ y, int64_t images,
                                                 int64_t pixels, int64_t vec, const float (&s)[4],
                                                 const float (&t)[4]) {
  constexpr int P = pixels_per_step<u8, Tout>();
  const int64_t per_image = (pixels + P - 1) / P;
  const int64_t chunks = images * per_image;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < chunks; k += step) {
    const int64_t n = k / per_image, p0 = (k - n * per_image) * P;
    const int count = int(min(int64_t(P), pixels - p0));
    const u8* src = x + (n * pixels + p0) * C;
    Tout* dst = y + n * C * pixels + p0;  // channel c of pixel e at dst + c * pixels + e
    if (vec && count == P) {
      Chunk<u8, C * P> in;
      in.load(src);
#pragma unroll
      for (int c = 0; c < C; ++c) {
        Chunk<Tout, P> o;
#pragma unroll
        for (int e = 0; e < P; ++e) o.v[e] = convert<Tout>(fmaf(float(in.v[e * C + c]), s[c], t[c]));
        o.store(dst + c * pixels);
      }
    } else {
      for (int e = 0; e < count; ++e)
#pragma unroll
        for (int c = 0; c < C; ++c) dst[c * pixels + e] = convert<Tout>(fmaf(float(src[e * C + c]), s[c], t[c]));
    }
  }
}

// s[c] for a channel known only at run time, as selects (an indexed register array would go to
// local memory).
__device__ __forceinline__ float pick(const float (&a)[4], int c) {
  return c == 0 ? a[0] : (c == 1 ? a[1] : (c == 2 ? a[2] : a[3]));
}

// Interleaved output (nhwc): a map over the n = images * pixels * C elements, E a thread per step
// (a 16-byte word of output, E bytes of input); element i is channel i % C.
template <int C, typename Tout>
__device__ __forceinline__ void to_tensor_interleaved(const u8* __restrict__ x, Tout* __restrict__ y, int64_t n,
                                                      int64_t vec, const float (&s)[4], const float (&t)[4]) {
  constexpr int E = pixels_per_step<u8, Tout>();
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, step = int64_t(gridDim.x) * blockDim.x;
  int64_t done = 0;
  if (vec) {
    const int64_t chunks = n / E;
    for (int64_t k = tid; k < chunks; k += step) {
      const int first = int((k * E) % C);  // 0 unless C == 3 (E is a multiple of 1, 2 and 4)
      Chunk<u8, E> in;
      Chunk<Tout, E> o;
      in.load(x + k * E);
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const int c = (first + e) % C;
        o.v[e] = convert<Tout>(fmaf(float(in.v[e]), pick(s, c), pick(t, c)));
      }
      o.store(y + k * E);
    }
    done = chunks * E;
  }
  for (int64_t i = done + tid; i < n; i += step) {
    const int c = int(i % C);
    y[i] = convert<Tout>(fmaf(float(x[i]), pick(s, c), pick(t, c)));
  }
}

// ------------------------------------------------------------------------------ normalize_volume
// min and max that propagate NaN (fminf / fmaxf would drop it).
__device__ __forceinline__ float nan_min(float a, float b) { return (a < b || a != a) ? a : b; }
__device__ __forceinline__ float nan_max(float a, float b) { return (a > b || a != a) ? a : b; }
struct MinMaxOp {
  __device__ __forceinline__ float2 operator()(const float2& a, const float2& b) const {
    return make_float2(nan_min(a.x, b.x), nan_max(a.y, b.y));
  }
};
using BlockMinMax = cub::BlockReduce<float2, kThreads>;

// A thread's running (min, max): integers compare as unsigned (exact, no NaN), floats as floats.
template <typename T> struct IsInt { static constexpr bool value = false; };
template <> struct IsInt<u8> { static constexpr bool value = true; };
template <> struct IsInt<u16> { static constexpr bool value = true; };
template <typename T, bool INT = IsInt<T>::value> struct Extremes {
  float lo = INFINITY, hi = -INFINITY;
  __device__ __forceinline__ void add(T v) {
    const float f = as_float(v);
    lo = nan_min(lo, f);
    hi = nan_max(hi, f);
  }
  __device__ __forceinline__ float2 get() const { return make_float2(lo, hi); }
};
template <typename T> struct Extremes<T, true> {
  unsigned lo = 0xffffffffu, hi = 0u;
  __device__ __forceinline__ void add(T v) {
    lo = min(lo, unsigned(v));
    hi = max(hi, unsigned(v));
  }
  __device__ __forceinline__ float2 get() const { return make_float2(float(lo), float(hi)); }
};

// Integer voxels' running (min, max) two 16-bit lanes a word: u16 words as they are, u8 words as their
// even and odd bytes (w & 0x00ff00ff, w >> 8 & 0x00ff00ff), each pair folded by one three-way
// VIMNMX3.U16x2 (sm_90; elsewhere what the compiler makes of __vminu2): ~1.25 instructions a u8 voxel
// against three (a byte's extraction and two IMNMX), which left the u8 pass short of the H200's memory.
template <typename T> struct PackedExtremes {
  unsigned lo = 0xffffffffu, hi = 0u;
  __device__ __forceinline__ void add(unsigned w) {
    if (sizeof(T) == 1) {
      const unsigned even = w & 0x00ff00ffu, odd = (w >> 8) & 0x00ff00ffu;
      lo = __vminu2(__vminu2(lo, even), odd);
      hi = __vmaxu2(__vmaxu2(hi, even), odd);
    } else {
      lo = __vminu2(lo, w);
      hi = __vmaxu2(hi, w);
    }
  }
  __device__ __forceinline__ void into(Extremes<T>& m) const {
    m.lo = min(m.lo, min(lo & 0xffffu, lo >> 16));
    m.hi = max(m.hi, max(hi & 0xffffu, hi >> 16));
  }
};

template <typename T>
__device__ __forceinline__ void volume_minmax(const T* __restrict__ x, float2* __restrict__ partials, int64_t n,
                                              int64_t vec) {
  constexpr int V = 16 / sizeof(T);
  allow_dependent_launch();  // the map may be scheduled now: it waits for this whole grid first
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, step = int64_t(gridDim.x) * blockDim.x;
  Extremes<T> m;
  int64_t done = 0;
  if (vec) {
    const int64_t vectors = n / V;
    PackedExtremes<T> packed;
    for (int64_t base = tid; base < vectors; base += step * kUnroll) {
      uint4 c[kUnroll];  // kUnroll independent 16-byte loads in flight a thread
#pragma unroll
      for (int k = 0; k < kUnroll; ++k)
        if (base + k * step < vectors) c[k] = __ldg(reinterpret_cast<const uint4*>(x) + base + k * step);
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        if (base + k * step >= vectors) continue;
        if constexpr (IsInt<T>::value) {
          packed.add(c[k].x);
          packed.add(c[k].y);
          packed.add(c[k].z);
          packed.add(c[k].w);
        } else {
          const T* v = reinterpret_cast<const T*>(&c[k]);
#pragma unroll
          for (int e = 0; e < V; ++e) m.add(v[e]);
        }
      }
    }
    if constexpr (IsInt<T>::value) packed.into(m);
    done = vectors * V;
  }
  for (int64_t i = done + tid; i < n; i += step) m.add(x[i]);
  __shared__ typename BlockMinMax::TempStorage storage;
  const float2 r = BlockMinMax(storage).Reduce(m.get(), MinMaxOp());
  if (threadIdx.x == 0) partials[blockIdx.x] = r;
}

// (v - lo) / range, a true division: exactly 0 at lo and 1 at hi, and for float32 the bits of
// torch's (v - lo) / (hi - lo). `flat` (hi <= lo, neither NaN): 0, a NaN voxel still NaN.
template <typename Tin>
__device__ __forceinline__ float map_volume(Tin v, float lo, float range, bool flat, bool clip) {
  const float x = as_float(v);
  const float y = flat ? (x == x ? 0.f : x) : (x - lo) / range;
  return clip ? (y < 0.f ? 0.f : (y > 1.f ? 1.f : y)) : y;  // comparisons keep NaN
}

// Integer voxels (u8, u16) on the map's fast path: as_float without I2F (a quarter-rate conversion;
// with div.rn's MUFU.RCP it made the u8 -> 16-bit map issue-bound on fast memory), the bits of
// 2^23 + v less 2^23, exact for v < 2^23.
template <typename T> __device__ __forceinline__ float int_as_float(T v) {
  return __int_as_float(0x4B000000u | unsigned(v)) - 8388608.f;
}

// (x - lo) / range for integer x, correctly rounded, from r = RN(1 / range): q = t r, e = t - q range
// (exact, one FMA), q + e r (Markstein: r within half an ulp of 1 / range and q within one ulp of the
// quotient make that the correctly rounded quotient). Three FMA-pipe instructions instead of div.rn's
// MUFU.RCP, FCHK and slow-path branch; the caller takes it only where no step can overflow or
// underflow (fast_bounds), where t is finite, so the clip needs no NaN care.
__device__ __forceinline__ float map_int(float x, float lo, float range, float r, bool clip) {
  const float t = x - lo;
  const float q = t * r;
  const float y = fmaf(fmaf(-q, range, t), r, q);
  return clip ? fminf(fmaxf(y, 0.f), 1.f) : y;
}
// Bounds under which map_int is exact: 2^-32 <= range <= 2^32 and lo 0 or 2^-32 <= |lo| <= 2^32 (every
// bound an integer volume's min / max gives; NaN and inf fail every comparison).
__device__ __forceinline__ bool fast_bounds(float lo, float range) {
  constexpr float kSmall = 0x1p-32f, kLarge = 0x1p32f;
  const float a = fabsf(lo);
  return range >= kSmall && range <= kLarge && (lo == 0.f || (a >= kSmall && a <= kLarge));
}

// y[i] = f(x[i]) over the volume, grid-stride: a word of each side a thread a step where `vec` (x and y
// 16-byte aligned: the launcher checks), element by element past the last whole word. The words are
// walked from the volume's end: the min/max pass before read it from the start, so its last reads are
// still in L2 when the map starts (docs/performance.md: 2-3 us of ~150 at 512^3 on the H200).
template <typename Tin, typename Tout, typename F>
__device__ __forceinline__ void map_voxels(const Tin* x, Tout* y, int64_t n, int64_t vec, F f) {
  constexpr int E = 16 / (sizeof(Tin) > sizeof(Tout) ? sizeof(Tin) : sizeof(Tout));  // a word of each, coalesced
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, step = int64_t(gridDim.x) * blockDim.x;
  int64_t done = 0;
  if (vec) {
    const int64_t chunks = n / E;
    for (int64_t i = tid; i < chunks; i += step) {
      const int64_t k = chunks - 1 - i;
      Chunk<Tin, E> in;
      Chunk<Tout, E> out;
      in.load(x + k * E);
#pragma unroll
      for (int e = 0; e < E; ++e) out.v[e] = convert<Tout>(f(in.v[e]));
      out.store(y + k * E);
    }
    done = chunks * E;
  }
  for (int64_t i = done + tid; i < n; i += step) y[i] = convert<Tout>(f(x[i]));
}

template <typename Tin, typename Tout>
__device__ __forceinline__ void normalize_volume(const Tin* x, Tout* y, int64_t n, const float2* __restrict__ partials,
                                                 int64_t count, float lo, float hi, int64_t flags,
                                                 int64_t vec) {
  if (flags & (RAWOPS_IMAGE_FLAG_LO | RAWOPS_IMAGE_FLAG_HI)) {
    // Launched programmatically dependent on the min/max pass on sm_90 (rawops/image.py): its
    // partials, and its reads of x (y may be x), are complete past this wait.
    wait_for_previous_grid();
    float2 m = make_float2(INFINITY, -INFINITY);
    for (int64_t i = threadIdx.x; i < count; i += blockDim.x) m = MinMaxOp()(m, partials[i]);
    __shared__ typename BlockMinMax::TempStorage storage;
    __shared__ float2 total;
    m = BlockMinMax(storage).Reduce(m, MinMaxOp());
    if (threadIdx.x == 0) total = m;
    __syncthreads();
    if (flags & RAWOPS_IMAGE_FLAG_LO) lo = total.x;
    if (flags & RAWOPS_IMAGE_FLAG_HI) hi = total.y;
  }
  const float range = hi - lo;  // a NaN bound makes it NaN, and every output NaN
  const bool flat = hi <= lo;
  const bool clip = flags & RAWOPS_IMAGE_FLAG_CLIP;
  if constexpr (IsInt<Tin>::value) {
    if (fast_bounds(lo, range)) {  // uniform: every thread takes the same path
      const float r = 1.f / range;
      map_voxels(x, y, n, vec, [=](Tin v) { return map_int(int_as_float(v), lo, range, r, clip); });
      return;
    }
  }
  map_voxels(x, y, n, vec, [=](Tin v) { return map_volume<Tin>(v, lo, range, flat, clip); });
}

}  // namespace
}  // namespace rawops

using rawops::u8;
using rawops::u16;

#define RAWOPS_GRAY(layout, planar, tin, sin, tout, sout)                                                       \
  extern "C" __global__ void __launch_bounds__(RAWOPS_IMAGE_THREADS)                                           \
      rgb_to_gray_fwd_##layout##_##sin##_##sout(const tin* x, tout* y, long long images, long long pixels,          \
                                                 long long vec) {                                                 \
    rawops::rgb_to_gray<tin, tout, planar>(x, y, images, pixels, vec);                                         \
  }
#define RAWOPS_GRAY_OUT(layout, planar, tin, sin)       \
  RAWOPS_GRAY(layout, planar, tin, sin, u8, u8)         \
  RAWOPS_GRAY(layout, planar, tin, sin, float, f32)     \
  RAWOPS_GRAY(layout, planar, tin, sin, __half, f16)
#define RAWOPS_GRAY_LAYOUT(layout, planar)         \
  RAWOPS_GRAY_OUT(layout, planar, u8, u8)          \
  RAWOPS_GRAY_OUT(layout, planar, float, f32)      \
  RAWOPS_GRAY_OUT(layout, planar, __half, f16)
RAWOPS_GRAY_LAYOUT(hwc, false)
RAWOPS_GRAY_LAYOUT(chw, true)

#define RAWOPS_TO_TENSOR(layout, planar, C, tout, sout)                                                          \
  extern "C" __global__ void __launch_bounds__(RAWOPS_IMAGE_THREADS)                                            \
      to_tensor_normalize_fwd_##layout##_c##C##_##sout(const u8* x, tout* y, long long images, long long pixels, \
                                                       long long vec, float s0, float s1, float s2, float s3,    \
                                                       float t0, float t1, float t2, float t3) {                 \
    const float s[4] = {s0, s1, s2, s3}, t[4] = {t0, t1, t2, t3};                                               \
    if constexpr (planar)                                                                                        \
      rawops::to_tensor_planar<C, tout>(x, y, images, pixels, vec, s, t);                                       \
    else                                                                                                         \
      rawops::to_tensor_interleaved<C, tout>(x, y, images * pixels * C, vec, s, t);                             \
  }
#define RAWOPS_TO_TENSOR_OUT(layout, planar, C)                \
  RAWOPS_TO_TENSOR(layout, planar, C, float, f32)              \
  RAWOPS_TO_TENSOR(layout, planar, C, __half, f16)             \
  RAWOPS_TO_TENSOR(layout, planar, C, __nv_bfloat16, bf16)
#define RAWOPS_TO_TENSOR_LAYOUT(layout, planar) \
  RAWOPS_TO_TENSOR_OUT(layout, planar, 1)       \
  RAWOPS_TO_TENSOR_OUT(layout, planar, 2)       \
  RAWOPS_TO_TENSOR_OUT(layout, planar, 3)       \
  RAWOPS_TO_TENSOR_OUT(layout, planar, 4)
RAWOPS_TO_TENSOR_LAYOUT(nchw, true)
RAWOPS_TO_TENSOR_LAYOUT(nhwc, false)

#define RAWOPS_VOLUME_OUT(tin, sin, tout, sout)                                                                  \
  extern "C" __global__ void __launch_bounds__(RAWOPS_IMAGE_THREADS)                                            \
      normalize_volume_fwd_##sin##_##sout(const tin* x, tout* y, long long n, const float2* partials,              \
                                          long long count, float lo, float hi, long long flags, long long vec) {      \
    rawops::normalize_volume<tin, tout>(x, y, n, partials, count, lo, hi, flags, vec);                         \
  }
#define RAWOPS_VOLUME(tin, sin)                                                                                  \
  extern "C" __global__ void __launch_bounds__(RAWOPS_IMAGE_THREADS)                                            \
      volume_minmax_##sin(const tin* x, float2* partials, long long n, long long vec) {                             \
    rawops::volume_minmax<tin>(x, partials, n, vec);                                                           \
  }                                                                                                            \
  RAWOPS_VOLUME_OUT(tin, sin, float, f32)                                                                      \
  RAWOPS_VOLUME_OUT(tin, sin, __half, f16)                                                                     \
  RAWOPS_VOLUME_OUT(tin, sin, __nv_bfloat16, bf16)
RAWOPS_VOLUME(u8, u8)
RAWOPS_VOLUME(u16, u16)
RAWOPS_VOLUME(__half, f16)
RAWOPS_VOLUME(float, f32)
