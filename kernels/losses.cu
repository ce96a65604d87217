// Losses family: cross_entropy over the rows of (N, V) logits, forward and its gradient.
//
//   lse_i   = log(sum_j exp(x_ij))                       (the row's logsumexp, max subtracted)
//   loss_i  = lse_i - (1 - eps) x_iy - (eps / V) sum_j x_ij + z lse_i^2     (target y = target[i])
//   dx_ij   = s_i (exp(x_ij - lse_i) (1 + 2 z lse_i) - eps / V - (1 - eps) [j == y])
// eps: label_smoothing (torch's definition: (1 - eps) nll + eps * the mean over classes of
// -log_softmax); z: z_loss (PaLM's auxiliary loss, Liger's lse_square_scale). A row whose target
// is ignore_index has loss 0 and gradient 0; a row whose target is neither ignore_index nor in
// [0, V) has loss NaN and a NaN gradient row (the host may check the count kernel's flag).
// s_i: 1 / N_valid for reduction "mean" (N_valid: the rows not ignored, counted on the device by
// cross_entropy_targets before the row kernel runs), else 1; times grad_output (one value, or one
// per row) when the launch passes one.
//
// Kernels (each per logits dtype: f32, f16, bf16; math in float32):
//   cross_entropy_targets  one block: N_valid, the first bad target's row and value (counts[3]);
//   cross_entropy_fwd      the rows: a first pass over the row (online max and sum of exp, and
//                          the row's sum for smoothing) gives lse; then, where `grad` is given, a
//                          second pass writes dx (grad may be the logits' own buffer: each element
//                          is read, then written, by one thread, and never read again). Writes the
//                          per-row loss (float32) and, where given, lse (float32);
//   cross_entropy_reduce   one block: the per-row losses to the result in the logits' dtype
//                          ("none": each row; "sum"/"mean": a fixed-order sum, / N_valid for mean:
//                          deterministic, no atomics; N_valid = 0 gives NaN, as torch);
//   cross_entropy_scale    dx *= grad_output (one value, or one per row), in place or into
//                          another buffer; in place, a row whose factor is exactly 1 or whose
//                          target is ignored is left as it is (no traffic: the usual backward of a
//                          loss is a factor 1 on the device, checked there without a host sync).
// Bytes: forward alone reads the logits once; forward with the gradient reads them twice and
// writes the gradient once (the second read is of a row read a moment before: the host keeps the
// rows in flight within L2, rawops/losses.py's plan).
// Launch: cross_entropy_fwd / _scale in one of two modes (flags): a warp per row (blocks of
// CE_WARP_THREADS, rows up to CE_WARP_VECTORS 16-byte vectors), or a block per row (32..1024
// threads); both grid-stride over the rows. The one-block kernels run CE_SMALL_THREADS threads.
// Rows: logits and grad each have a row stride (elements); 16-byte accesses where the host says
// every row is on 16-byte boundaries (CE_FLAG_VECTORS), element by element otherwise.
// 64-bit indices throughout (N * V may pass 2^31).
#include <cub/block/block_reduce.cuh>
#include <cub/warp/warp_reduce.cuh>

#include "rawops/rows.cuh"

namespace rawops {
namespace {

constexpr int kCeMaxThreads = RAWOPS_CE_MAX_THREADS;
constexpr int kCeMaxWarps = kCeMaxThreads / 32;
constexpr int kCeUnroll = RAWOPS_CE_UNROLL;
constexpr int kCeSmallThreads = RAWOPS_CE_SMALL_THREADS;
constexpr long long kFlagVectors = RAWOPS_CE_FLAG_VECTORS;
constexpr long long kFlagTargetI32 = RAWOPS_CE_FLAG_TARGET_I32;
constexpr long long kFlagMean = RAWOPS_CE_FLAG_MEAN;
constexpr long long kFlagGradOutput = RAWOPS_CE_FLAG_GRAD_OUTPUT;
constexpr long long kFlagPerRowGradOutput = RAWOPS_CE_FLAG_PER_ROW_GRAD_OUTPUT;
constexpr long long kFlagWarp = RAWOPS_CE_FLAG_WARP;
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float exp_of(float x) { return exp2f(x * kLog2e); }

__device__ __forceinline__ long long target_at(const void* target, long long stride, long long row, bool i32) {
  return i32 ? (long long)static_cast<const int*>(target)[row * stride]
             : static_cast<const long long*>(target)[row * stride];
}

// A row's reductions: rows.cuh's, for blocks of up to CE_MAX_THREADS threads and two values at once.
using CeReducer = BasicRowReducer<kCeMaxWarps, 2>;

// One value of the row's online (max, sum of exp(x - max)) pair absorbing a vector: the vector's
// max first, one rescale of the sum, then one exp per element. NaN propagates through the sum
// (fmaxf drops it from the max, exp(NaN) does not); -inf elements add 0.
// `valid`: the vector's elements inside the row (the rest are -inf pads, left out of total).
template <int VE>
__device__ __forceinline__ void absorb(const float (&v)[VE], int valid, float& m, float& s, float& total) {
  float vm = v[0];
#pragma unroll
  for (int e = 0; e < VE; ++e) {
    vm = fmaxf(vm, v[e]);
    if (e < valid) total += v[e];
  }
  const float next = fmaxf(m, vm);
  if (next == -INFINITY) {  // all -inf so far: exp(-inf - -inf) would be NaN
#pragma unroll
    for (int e = 0; e < VE; ++e)
      if (v[e] != v[e]) s = v[e];
    return;
  }
  s *= exp_of(m - next);
#pragma unroll
  for (int e = 0; e < VE; ++e) s += exp_of(v[e] - next);
  m = next;
}

// f(j, v, valid) for each of this thread's 16-byte vectors j of a row, as floats: VEC, 16-byte
// loads, kCeUnroll of them in flight, held as packed words until decoded (16 registers rather
// than 32 floats: the launch bound leaves 64); else element by element, one vector at a time,
// -inf past the row's end (`valid` elements real).
template <typename T, bool VEC, class F>
__device__ __forceinline__ void for_row(const T* row, long long n, long long nvec, const RowCursor& c, F f) {
  constexpr int VE = Vec16<T>::size;
  if (VEC) {
    for (long long j0 = c.lane; j0 < nvec; j0 += (long long)kCeUnroll * c.width) {
      uint4 raw[kCeUnroll];
#pragma unroll
      for (int u = 0; u < kCeUnroll; ++u) {
        const long long j = j0 + (long long)u * c.width;
        raw[u] = j < nvec ? words(load16(row + j * VE)) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < kCeUnroll; ++u) {
        const long long j = j0 + (long long)u * c.width;
        if (j >= nvec) break;
        float v[VE];
#pragma unroll
        for (int e = 0; e < VE; ++e) v[e] = unpack<T>(raw[u], e);
        f(j, v, VE);
      }
    }
  } else {
    for (long long j = c.lane; j < nvec; j += c.width) {
      float v[VE];
      load_row(row, j, n, false, -INFINITY, v);
      f(j, v, int(min((long long)VE, n - j * VE)));
    }
  }
}

template <typename T, bool VEC>
__device__ __forceinline__ void ce_fwd_rows(const T* logits, const void* target, T* grad, float* loss_rows,
                                            float* lse_rows, const long long* counts, const T* grad_output,
                                            long long rows, long long n, long long x_stride, long long target_stride,
                                            long long grad_stride, long long ignore_index, long long flags,
                                            float smoothing, float z_loss) {
  __shared__ CeReducer::Storage storage;
  constexpr int VE = Vec16<T>::size;
  const bool i32 = flags & kFlagTargetI32;
  const RowCursor c((flags & kFlagWarp) ? kWarpPerRow : kBlockPerRow);
  CeReducer reduce(storage, c.warp);
  const long long nvec = (n + VE - 1) / VE;
  const float mean_scale = (flags & kFlagMean) ? 1.f / float(counts[0]) : 1.f;
  const float eps_v = smoothing / float(n);
  for (long long row = c.row; row < rows; row += c.step) {
    const T* xr = logits + row * x_stride;
    const long long t = target_at(target, target_stride, row, i32);
    const bool ignored = t == ignore_index;
    const bool bad = !ignored && (t < 0 || t >= n);
    // lse as (max, log sum): x - lse is taken as (x - max) - log_sum, the first difference exact
    // for the classes that matter (Sterbenz), where x - (max + log_sum) would carry lse's rounding
    // (half an ulp of the max: 5e-4 at 1e4) into every probability.
    float row_max = 0.f, log_sum = 0.f, lse = 0.f, xt = 0.f;
    // The target's logit before the row's first barrier: in place, other threads overwrite the
    // row once past the reductions.
    if (!ignored && !bad && c.lane == 0) xt = to_float(xr[t]);
    if (!ignored) {
      float m = -INFINITY, s = 0.f, total = 0.f;
      for_row<T, VEC>(xr, n, nvec, c, [&](long long, const float (&v)[VE], int valid) {
        absorb(v, valid, m, s, total);
      });
      float top[1] = {m};
      reduce.reduce(top, MaxOp());
      row_max = top[0];
      float sums[2] = {m == -INFINITY ? s : s * exp_of(m - row_max), total};
      reduce.reduce(sums, SumOp());
      log_sum = logf(sums[0]);
      lse = row_max + log_sum;
      if (c.lane == 0) {
        float loss = NAN;
        if (!bad) {
          // lse - (1 - eps) x_t - eps mean(x) = log_sum + (1 - eps)(max - x_t) + eps (max - mean(x))
          loss = log_sum + (1.f - smoothing) * (row_max - xt);
          if (smoothing != 0.f) loss += smoothing * (row_max - sums[1] / float(n));  // 0 * -inf: NaN
          if (z_loss != 0.f) loss += z_loss * lse * lse;
        }
        loss_rows[row] = loss;
        if (lse_rows) lse_rows[row] = lse;
      }
    } else if (c.lane == 0) {
      loss_rows[row] = 0.f;
      if (lse_rows) lse_rows[row] = 0.f;
    }
    if (!grad) continue;
    T* gr = grad + row * grad_stride;
    if (ignored) {
      const float zero[VE] = {};
      for (long long j = c.lane; j < nvec; j += c.width) store_row(gr, j, n, VEC, zero);
      continue;
    }
    float scale = mean_scale;
    if (flags & kFlagGradOutput) scale *= to_float(grad_output[(flags & kFlagPerRowGradOutput) ? row : 0]);
    if (bad) scale = NAN;
    const float p_scale = scale * (1.f + 2.f * z_loss * lse), shift = scale * eps_v, hit = scale * (1.f - smoothing);
    for_row<T, VEC>(xr, n, nvec, c, [&](long long j, const float (&v)[VE], int) {
      // the target's place in this vector (-1 or VE: not in it), an int compare per element
      const int at = int(min(max(t - j * VE, -1LL), (long long)VE));
      float o[VE];
#pragma unroll
      for (int e = 0; e < VE; ++e) o[e] = p_scale * exp_of((v[e] - row_max) - log_sum) - shift - (e == at ? hit : 0.f);
      store_row(gr, j, n, VEC, o);
    });
  }
}

template <typename T>
__device__ __forceinline__ void ce_fwd(const T* logits, const void* target, T* grad, float* loss_rows,
                                       float* lse_rows, const long long* counts, const T* grad_output,
                                       long long rows, long long n, long long x_stride, long long target_stride,
                                       long long grad_stride, long long ignore_index, long long flags,
                                       float smoothing, float z_loss) {
  if (flags & kFlagVectors)
    ce_fwd_rows<T, true>(logits, target, grad, loss_rows, lse_rows, counts, grad_output, rows, n, x_stride,
                         target_stride, grad_stride, ignore_index, flags, smoothing, z_loss);
  else
    ce_fwd_rows<T, false>(logits, target, grad, loss_rows, lse_rows, counts, grad_output, rows, n, x_stride,
                          target_stride, grad_stride, ignore_index, flags, smoothing, z_loss);
}

template <typename T, bool VEC>
__device__ __forceinline__ void ce_scale_rows(const T* grad, T* out, const void* target, const T* grad_output,
                                              long long rows, long long n, long long grad_stride,
                                              long long out_stride, long long target_stride,
                                              long long ignore_index, long long flags) {
  constexpr int VE = Vec16<T>::size;
  const bool i32 = flags & kFlagTargetI32;
  const bool in_place = grad == out && grad_stride == out_stride;
  const RowCursor c((flags & kFlagWarp) ? kWarpPerRow : kBlockPerRow);
  const long long nvec = (n + VE - 1) / VE;
  for (long long row = c.row; row < rows; row += c.step) {
    const float factor = to_float(grad_output[(flags & kFlagPerRowGradOutput) ? row : 0]);
    const bool ignored = target_at(target, target_stride, row, i32) == ignore_index;
    if (in_place && (factor == 1.f || ignored)) continue;
    T* orow = out + row * out_stride;
    if (ignored) {  // torch: 0 whatever the factor (NaN and inf included)
      const float zero[VE] = {};
      for (long long j = c.lane; j < nvec; j += c.width) store_row(orow, j, n, VEC, zero);
      continue;
    }
    for_row<T, VEC>(grad + row * grad_stride, n, nvec, c, [&](long long j, const float (&v)[VE], int) {
      float o[VE];
#pragma unroll
      for (int e = 0; e < VE; ++e) o[e] = v[e] * factor;
      store_row(orow, j, n, VEC, o);
    });
  }
}

template <typename T>
__device__ __forceinline__ void ce_scale(const T* grad, T* out, const void* target, const T* grad_output,
                                         long long rows, long long n, long long grad_stride, long long out_stride,
                                         long long target_stride, long long ignore_index, long long flags) {
  if (flags & kFlagVectors)
    ce_scale_rows<T, true>(grad, out, target, grad_output, rows, n, grad_stride, out_stride, target_stride,
                           ignore_index, flags);
  else
    ce_scale_rows<T, false>(grad, out, target, grad_output, rows, n, grad_stride, out_stride, target_stride,
                            ignore_index, flags);
}

struct MinOp {
  __device__ __forceinline__ long long operator()(long long a, long long b) const { return a < b ? a : b; }
};

// counts[0] = rows whose target is not ignore_index; counts[1] = the first row whose target is
// neither ignore_index nor in [0, n), else -1; counts[2] = that target. Integer reductions:
// deterministic.
__device__ __forceinline__ void ce_targets(const void* target, long long* counts, long long rows, long long n,
                                           long long target_stride, long long ignore_index, long long flags) {
  using Reduce = cub::BlockReduce<long long, kCeSmallThreads>;
  __shared__ typename Reduce::TempStorage storage;
  const bool i32 = flags & kFlagTargetI32;
  long long valid = 0, first_bad = rows;
  for (long long row = threadIdx.x; row < rows; row += kCeSmallThreads) {
    const long long t = target_at(target, target_stride, row, i32);
    if (t == ignore_index) continue;
    ++valid;
    if ((t < 0 || t >= n) && row < first_bad) first_bad = row;
  }
  valid = Reduce(storage).Sum(valid);
  __syncthreads();
  first_bad = Reduce(storage).Reduce(first_bad, MinOp());
  if (threadIdx.x == 0) {
    counts[0] = valid;
    counts[1] = first_bad < rows ? first_bad : -1;
    counts[2] = first_bad < rows ? target_at(target, target_stride, first_bad, i32) : 0;
  }
}

// mode 0 ("none"): out[i] = loss_rows[i]; 1 ("sum"), 2 ("mean"): out[0] = the sum (/ counts[0]).
// Thread k adds rows k, k + CE_SMALL_THREADS, ... in order, then CUB's block sum: a fixed order.
template <typename T>
__device__ __forceinline__ void ce_reduce(const float* loss_rows, const long long* counts, T* out, long long rows,
                                          long long mode) {
  if (mode == 0) {
    for (long long row = threadIdx.x; row < rows; row += kCeSmallThreads) out[row] = from_float<T>(loss_rows[row]);
    return;
  }
  using Reduce = cub::BlockReduce<float, kCeSmallThreads>;
  __shared__ typename Reduce::TempStorage storage;
  float sum = 0.f;
  for (long long row = threadIdx.x; row < rows; row += kCeSmallThreads) sum += loss_rows[row];
  sum = Reduce(storage).Sum(sum);
  if (threadIdx.x == 0) out[0] = from_float<T>(mode == 2 ? sum / float(counts[0]) : sum);
}

}  // namespace
}  // namespace rawops

// target: int64, or int32 under CE_FLAG_TARGET_I32, at target_stride elements apart. Nullable:
// grad (no gradient), lse_rows, grad_output (without CE_FLAG_GRAD_OUTPUT), counts (without
// CE_FLAG_MEAN).
#define RAWOPS_CROSS_ENTROPY(T, suffix)                                                                        \
  extern "C" __global__ void __launch_bounds__(rawops::kCeMaxThreads) cross_entropy_fwd_##suffix(               \
      const T* logits, const void* target, T* grad, float* loss_rows, float* lse_rows, const long long* counts,  \
      const T* grad_output, long long rows, long long n, long long x_stride, long long target_stride,            \
      long long grad_stride, long long ignore_index, long long flags, float label_smoothing, float z_loss) {     \
    rawops::ce_fwd<T>(logits, target, grad, loss_rows, lse_rows, counts, grad_output, rows, n, x_stride,         \
                      target_stride, grad_stride, ignore_index, flags, label_smoothing, z_loss);                 \
  }                                                                                                              \
  extern "C" __global__ void __launch_bounds__(rawops::kCeMaxThreads) cross_entropy_scale_##suffix(             \
      const T* grad, T* out, const void* target, const T* grad_output, long long rows, long long n,              \
      long long grad_stride, long long out_stride, long long target_stride, long long ignore_index,              \
      long long flags) {                                                                                         \
    rawops::ce_scale<T>(grad, out, target, grad_output, rows, n, grad_stride, out_stride, target_stride,         \
                        ignore_index, flags);                                                                    \
  }                                                                                                              \
  extern "C" __global__ void __launch_bounds__(rawops::kCeSmallThreads) cross_entropy_targets_##suffix(         \
      const void* target, long long* counts, long long rows, long long n, long long target_stride,               \
      long long ignore_index, long long flags) {                                                                 \
    rawops::ce_targets(target, counts, rows, n, target_stride, ignore_index, flags);                             \
  }                                                                                                              \
  extern "C" __global__ void __launch_bounds__(rawops::kCeSmallThreads) cross_entropy_reduce_##suffix(          \
      const float* loss_rows, const long long* counts, T* out, long long rows, long long mode) {                 \
    rawops::ce_reduce<T>(loss_rows, counts, out, rows, mode);                                                    \
  }

RAWOPS_CROSS_ENTROPY(float, f32)
RAWOPS_CROSS_ENTROPY(__half, f16)
RAWOPS_CROSS_ENTROPY(__nv_bfloat16, bf16)
