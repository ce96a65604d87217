// Mixture-of-experts family: routing (scores, top-k, renormalise, per-expert counts) and token
// permutation (rows grouped by expert, and back with the weighted combine), forward and backward.
//
// Route: one warp a token row of E logits (E <= RAWOPS_MOE_MAX_EXPERTS, lane l holding experts l,
// l + 32, ...): scores in float32 (softmax: e_i = exp(x_i - max), p_i = e_i / sum e; sigmoid: s_i =
// 1 / (1 + exp(-x_i))), then k rounds of a warp argmax (k <= RAWOPS_MOE_MAX_K): the largest score,
// equal scores to the lower expert id, NaN above everything (a NaN logit makes its row NaN, never a
// silent number). Weights: the k scores divided by their sum (normalize) or as they are (softmax: p_i;
// sigmoid: s_i). counts[e] += tokens choosing e: a block's shared histogram, then one integer atomic an
// expert a block (the caller zeroes counts; integer sums are order-free: deterministic).
//   moe_route_<dtype>(const T* logits, float* weights, int* ids, int* counts, int64 tokens, int64 experts,
//                     int64 stride, int64 k, int64 flags)
//   moe_route_bwd_<dtype>(const T* logits, const int* ids, const float* grad_w, T* grad_logits,
//                         int64 tokens, int64 experts, int64 stride, int64 k, int64 flags)
//   The backward recomputes the scores from the logits (E values a row) and writes every logit's
//   gradient (zero where neither the chosen set nor the softmax's sum depends on it):
//     softmax, normalize   w = softmax over the chosen logits: dx_i = [i chosen] w_i (g_i - sum_j w_j g_j)
//     softmax              dx_i = p_i (g~_i - sum_j p_j g_j), g~ the weights' gradient scattered to E
//     sigmoid, normalize   dx_i = [i chosen] (g_i - sum_j w_j g_j) / S * s_i (1 - s_i), S = sum chosen s
//     sigmoid              dx_i = [i chosen] g_i s_i (1 - s_i)
//
// Permute: n = T k entries (t, j) with expert ids[t, j]; a stable counting sort by expert:
//   moe_count   block b of the flat entries [b chunk, (b + 1) chunk): its histogram over E + 1 buckets
//               (bucket E: ids outside [0, E)) into block_counts[.][b] (an expert's counts contiguous:
//               the scan's loads coalesce)
//   moe_place   block b again: first the scan, every block its own: each bucket's total and its
//               count in blocks before b, read from block_counts (a warp a bucket, kPrefixBatch
//               buckets' loads in flight), then offsets by a block scan of the totals (groups padded
//               to pad_to rows; offsets[E] the end of the last); block 0 stores offsets and counts. (A
//               one-block scan kernel between count and place cost 10.5 us of the H100's 27 us of
//               index kernels: a warp walked 8-9 buckets one load round trip each.) Then
//               RAWOPS_MOE_INDEX_THREADS entries a step: each entry's rank among the same
//               expert's earlier entries (__match_any_sync in a warp, the earlier warps' counts in shared
//               memory, the earlier steps' in a running base): index[t, j] = its row, in token order
//               within each group. An invalid id gets a row past offsets[E] (the bucket E rows),
//               stored as -(row + 1): the combine and the gradients read it as NaN. Where entry_of_row
//               is given, also entry_of_row[row] = t k + j (the permute's gather table; rows no entry
//               owns keep the caller's -1).
//   moe_pad_zero  the rows no entry owns (each group's padding, and every row past the entries)
//                 zeroed: a warp a row over the padding rows only (their table scanned in every block);
//                 the unpermute backward's d y (the permute zeroes its own padding rows).
// Rows (16-byte vectors where every row of every operand is 16-byte aligned, else element by element;
// a warp a token (the permute: a warp an output row); the kernels walk grid-stride, launched on a grid
// covering every row once (rawops/moe.py)):
//   moe_permute_<dtype>    out[r] = x[entry_of_row[r] / k], a warp an output row, the groups' rows
//                          interleaved (zeros where no entry owns r: entry_of_row -1); x's rows read k
//                          times (from L2 mostly), out written once
//   moe_unpermute_<dtype>  out[t] = sum_j w[t, j] y[index[t, j]] in j order, float32 (w null: 1): the
//                          permute's backward without weights; no atomics, the same bits every run
//   moe_unpermute_bwd_<dtype>  dy[index[t, j]] = w[t, j] dout[t]; dw[t, j] = <dout[t], y[index[t, j]]>
//                          (a warp's lanes in a fixed order, then a fixed shuffle tree)
// Traffic (bytes each must move): permute T H + (T k + padding) H elements, unpermute T k H + T H, its
// backward T H + 2 T k H; the index kernels read the ids twice and write one int32 an entry.
// 64-bit offsets; rows are int32 (T k + E (pad_to - 1) < 2^31, checked by the caller).
#include <cub/block/block_scan.cuh>
#include <cub/warp/warp_reduce.cuh>

#include "rawops/dtype.cuh"

namespace rawops {
namespace {

constexpr int kMaxExperts = RAWOPS_MOE_MAX_EXPERTS;
constexpr int kPermutePieces = RAWOPS_MOE_PERMUTE_PIECES;  // 16-byte loads a lane in flight
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ float nan_f() { return __int_as_float(0x7fffffff); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

// The scores of one row: lane holds experts lane + 32 s (s < per); unused slots -inf (never chosen
// while k <= E). Returns the row's softmax denominator sum e (1 for sigmoid).
template <int kPerLane, typename T>
__device__ __forceinline__ float row_scores(const T* __restrict__ row, int experts, int per, int lane, bool sigmoid,
                                            float (&score)[kPerLane]) {
  float x[kPerLane];
#pragma unroll
  for (int s = 0; s < kPerLane; ++s) {
    const int e = lane + 32 * s;
    x[s] = (s < per && e < experts) ? to_float(row[e]) : -INFINITY;
  }
  if (sigmoid) {
#pragma unroll
    for (int s = 0; s < kPerLane; ++s) {
      const int e = lane + 32 * s;
      score[s] = (s < per && e < experts) ? 1.0f / (1.0f + expf(-x[s])) : -INFINITY;
    }
    return 1.0f;
  }
  float m = -INFINITY;
#pragma unroll
  for (int s = 0; s < kPerLane; ++s) m = fmaxf(m, x[s]);
  m = warp_max(m);
  float sum = 0.0f;
#pragma unroll
  for (int s = 0; s < kPerLane; ++s) {
    const int e = lane + 32 * s;
    score[s] = (s < per && e < experts) ? expf(x[s] - m) : -INFINITY;
    if (s < per && e < experts) sum += score[s];
  }
  return warp_sum(sum);
}

// k rounds of the warp argmax over the scores; lane j < k ends with the j-th choice (id, score).
// Scores are >= 0 or NaN (exp and the sigmoid), so a score's bits order as unsigned integers (a NaN
// made 0x7fffffff: above +inf): on sm_80+ a round is each lane's best untaken slot, then the warp's
// largest bits and, among the lanes holding them, the lowest id (two redux instructions); before
// sm_80, a shuffle tree over (score, id).
template <int kPerLane>
__device__ __forceinline__ void top_k(const float (&score)[kPerLane], int per, int experts, int k, int lane,
                                      int& my_id, float& my_score) {
  unsigned taken = 0;
  my_id = -1;
  my_score = 0.0f;
  for (int r = 0; r < k; ++r) {
    unsigned bits = 0;
    int best_id = 0x7fffffff;
#pragma unroll
    for (int s = 0; s < kPerLane; ++s) {
      const int e = lane + 32 * s;
      if (s < per && e < experts && !(taken >> s & 1u)) {
        const unsigned b = score[s] != score[s] ? 0x7fffffffu : __float_as_uint(score[s]);
        if (b > bits || best_id == 0x7fffffff) {  // slots in id order: equal bits keep the lower id
          bits = b;
          best_id = e;
        }
      }
    }
#if __CUDA_ARCH__ >= 800
    const unsigned top = __reduce_max_sync(kFull, bits);
    best_id = __reduce_min_sync(kFull, bits == top ? unsigned(best_id) : 0x7fffffffu);
#else
    unsigned top = bits;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const unsigned b = __shfl_xor_sync(kFull, top, o);
      const int i = __shfl_xor_sync(kFull, best_id, o);
      if (b > top || (b == top && i < best_id)) {
        top = b;
        best_id = i;
      }
    }
#endif
    if ((best_id & 31) == lane) taken |= 1u << (best_id >> 5);
    if (lane == r) {
      my_id = best_id;
      my_score = __uint_as_float(top);
    }
  }
}

template <typename T, int kPerLane>
__device__ void route(const T* __restrict__ logits, float* __restrict__ weights, int* __restrict__ ids,
                      int* __restrict__ counts, int64_t tokens, int experts, int64_t stride, int k, long long flags,
                      int* hist) {
  const bool sigmoid = flags & RAWOPS_MOE_FLAG_SIGMOID, normalize = flags & RAWOPS_MOE_FLAG_NORMALIZE;
  for (int e = threadIdx.x; e < experts; e += blockDim.x) hist[e] = 0;
  __syncthreads();
  const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  const int per = (experts + 31) >> 5;
  for (int64_t t = int64_t(blockIdx.x) * warps + (threadIdx.x >> 5); t < tokens; t += int64_t(gridDim.x) * warps) {
    float score[kPerLane];
    const float total = row_scores(logits + t * stride, experts, per, lane, sigmoid, score);
    int id;
    float v;
    top_k(score, per, experts, k, lane, id, v);
    const float chosen = warp_sum(lane < k ? v : 0.0f);
    const float scale = normalize ? 1.0f / chosen : 1.0f / total;  // sigmoid's total is 1
    if (lane < k) {
      weights[t * k + lane] = v * scale;
      ids[t * k + lane] = id;
      atomicAdd(&hist[id], 1);
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    if (hist[e]) atomicAdd(counts + e, hist[e]);
  }
}

template <typename T, int kPerLane>
__device__ void route_bwd(const T* __restrict__ logits, const int* __restrict__ ids, const float* __restrict__ grad_w,
                          T* __restrict__ grad_logits, int64_t tokens, int experts, int64_t stride, int k,
                          long long flags) {
  const bool sigmoid = flags & RAWOPS_MOE_FLAG_SIGMOID, normalize = flags & RAWOPS_MOE_FLAG_NORMALIZE;
  const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  const int per = (experts + 31) >> 5;
  for (int64_t t = int64_t(blockIdx.x) * warps + (threadIdx.x >> 5); t < tokens; t += int64_t(gridDim.x) * warps) {
    float score[kPerLane];
    const float total = row_scores(logits + t * stride, experts, per, lane, sigmoid, score);
    const int my_id = lane < k ? ids[t * k + lane] : -1;
    const float my_g = lane < k ? grad_w[t * k + lane] : 0.0f;
    // g~: the weights' gradient at each chosen expert (0 elsewhere); chosen: the chosen scores' sum.
    float g[kPerLane];
    unsigned chosen_mask = 0;
#pragma unroll
    for (int s = 0; s < kPerLane; ++s) g[s] = 0.0f;
    float chosen = 0.0f;
    for (int j = 0; j < k; ++j) {
      const int id = __shfl_sync(kFull, my_id, j);
      const float gj = __shfl_sync(kFull, my_g, j);
#pragma unroll
      for (int s = 0; s < kPerLane; ++s) {
        if (id == lane + 32 * s) {
          g[s] = gj;
          chosen_mask |= 1u << s;
          chosen += score[s];
        }
      }
    }
    chosen = warp_sum(chosen);
    // the weights w_i each mode gives the chosen (and, softmax without normalize, every) expert
    const float scale = normalize ? 1.0f / chosen : 1.0f / total;
    float dot = 0.0f;  // sum over the chosen of w_j g_j
#pragma unroll
    for (int s = 0; s < kPerLane; ++s) {
      if (chosen_mask >> s & 1u) dot += score[s] * scale * g[s];
    }
    dot = warp_sum(dot);
    T* out = grad_logits + t * int64_t(experts);
#pragma unroll
    for (int s = 0; s < kPerLane; ++s) {
      const int e = lane + 32 * s;
      if (s >= per || e >= experts) continue;
      const bool is_chosen = chosen_mask >> s & 1u;
      const float w = score[s] * scale;
      float d;
      if (!sigmoid) {
        d = (normalize && !is_chosen) ? 0.0f : w * (g[s] - dot);
      } else if (!is_chosen) {
        d = 0.0f;
      } else {
        const float ds = normalize ? (g[s] - dot) * scale : g[s];
        d = ds * score[s] * (1.0f - score[s]);
      }
      out[e] = from_float<T>(d);
    }
  }
}

// --------------------------------------------------------------------------- the counting sort
__device__ __forceinline__ int bucket_of(const void* ids, int64_t i, int experts, bool i64) {
  const long long id = i64 ? static_cast<const long long*>(ids)[i] : static_cast<const int*>(ids)[i];
  return (id >= 0 && id < experts) ? int(id) : experts;
}

__device__ void count(const void* ids, int* __restrict__ block_counts, int64_t n, int experts, int64_t chunk,
                      long long flags) {
  __shared__ int hist[kMaxExperts + 1];
  const bool i64 = flags & RAWOPS_MOE_FLAG_IDS_I64;
  for (int e = threadIdx.x; e <= experts; e += blockDim.x) hist[e] = 0;
  __syncthreads();
  const int64_t begin = int64_t(blockIdx.x) * chunk, end = begin + chunk < n ? begin + chunk : n;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) atomicAdd(&hist[bucket_of(ids, i, experts, i64)], 1);
  __syncthreads();
  for (int e = threadIdx.x; e <= experts; e += blockDim.x) block_counts[int64_t(e) * gridDim.x + blockIdx.x] = hist[e];
}

constexpr int kScanThreads = RAWOPS_MOE_SCAN_THREADS;  // pad_zero's block
constexpr int kScanItems = (kMaxExperts + kScanThreads) / kScanThreads;  // E + 1 buckets a block

constexpr int kIndexThreads = RAWOPS_MOE_INDEX_THREADS;
constexpr int kIndexWarps = kIndexThreads / 32;

constexpr int kPlaceItems = (kMaxExperts + kIndexThreads) / kIndexThreads;  // E + 1 buckets a block
constexpr int kPrefixBatch = 4;  // buckets a warp reads at once in place's scan
constexpr int kPrefixSlots = 8;  // blocks a lane reads of each (32 x 8 = 256 blocks a round)

__device__ __forceinline__ int warp_sum_int(int v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return __reduce_add_sync(kFull, v);
#else
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
#endif
}

__device__ void place(const void* ids, const int* __restrict__ block_counts, int* __restrict__ offsets,
                      int* __restrict__ counts, int* __restrict__ index, int* __restrict__ entry_of_row, int64_t n,
                      int experts, int64_t chunk, int64_t pad_to, long long flags) {
  using Scan = cub::BlockScan<int, kIndexThreads>;
  __shared__ typename Scan::TempStorage temp;
  __shared__ int base[kMaxExperts + 1];
  __shared__ int totals[kMaxExperts + 1];
  __shared__ int warp_counts[kIndexWarps][kMaxExperts + 1];
  const bool i64 = flags & RAWOPS_MOE_FLAG_IDS_I64;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int blocks = int(gridDim.x), self = int(blockIdx.x);
  // The scan, every block its own: bucket e's total and its entries in blocks before this one. Each
  // block starts its walk over the buckets at its own place (rot), so that the blocks do not all
  // read the same lines of block_counts at once (measured neutral on the H100: 240.5 against 241.0 us).
  const int buckets = experts + 1;
  const int rot = int(int64_t(self) * buckets / blocks);
  for (int v0 = warp * kPrefixBatch; v0 < buckets; v0 += kIndexWarps * kPrefixBatch) {
    int total[kPrefixBatch] = {}, before[kPrefixBatch] = {}, bucket[kPrefixBatch];
#pragma unroll
    for (int g = 0; g < kPrefixBatch; ++g) {
      const int v = v0 + g + rot;
      bucket[g] = v0 + g < buckets ? (v < buckets ? v : v - buckets) : -1;
    }
    for (int s0 = 0; s0 < blocks; s0 += 32 * kPrefixSlots) {
      int c[kPrefixBatch][kPrefixSlots];
#pragma unroll
      for (int g = 0; g < kPrefixBatch; ++g)
#pragma unroll
        for (int i = 0; i < kPrefixSlots; ++i) {
          const int b = s0 + i * 32 + lane;
          c[g][i] = (bucket[g] >= 0 && b < blocks) ? block_counts[int64_t(bucket[g]) * blocks + b] : 0;
        }
#pragma unroll
      for (int g = 0; g < kPrefixBatch; ++g)
#pragma unroll
        for (int i = 0; i < kPrefixSlots; ++i) {
          total[g] += c[g][i];
          before[g] += s0 + i * 32 + lane < self ? c[g][i] : 0;
        }
    }
#pragma unroll
    for (int g = 0; g < kPrefixBatch; ++g) {
      const int t = warp_sum_int(total[g]), p = warp_sum_int(before[g]);
      if (lane == 0 && bucket[g] >= 0) {
        totals[bucket[g]] = t;
        base[bucket[g]] = p;
      }
    }
  }
  for (int e = threadIdx.x; e <= experts; e += blockDim.x)
#pragma unroll
    for (int w = 0; w < kIndexWarps; ++w) warp_counts[w][e] = 0;
  __syncthreads();
  int padded[kPlaceItems];
#pragma unroll
  for (int i = 0; i < kPlaceItems; ++i) {
    const int e = threadIdx.x * kPlaceItems + i;
    padded[i] = e < experts ? int((totals[e] + pad_to - 1) / pad_to * pad_to) : 0;
  }
  Scan(temp).ExclusiveSum(padded, padded);
#pragma unroll
  for (int i = 0; i < kPlaceItems; ++i) {
    const int e = threadIdx.x * kPlaceItems + i;
    if (e <= experts) {
      base[e] += padded[i];
      if (self == 0) {
        offsets[e] = padded[i];
        if (e < experts) counts[e] = totals[e];
      }
    }
  }
  __syncthreads();
  const int64_t begin = int64_t(blockIdx.x) * chunk, end = begin + chunk < n ? begin + chunk : n;
  for (int64_t step = begin; step < end; step += kIndexThreads) {
    const int64_t i = step + threadIdx.x;
    const int e = i < end ? bucket_of(ids, i, experts, i64) : -1;
    const unsigned peers = __match_any_sync(kFull, e);
    const int rank = __popc(peers & ((1u << lane) - 1u));
    const bool leader = e >= 0 && rank == 0;
    if (leader) warp_counts[warp][e] = __popc(peers);
    __syncthreads();
    if (e >= 0) {
      int row_of = base[e] + rank;
      for (int w = 0; w < warp; ++w) row_of += warp_counts[w][e];
      index[i] = e < experts ? row_of : -(row_of + 1);
      if (entry_of_row) entry_of_row[row_of] = int(i);  // the permute's gather: the entry (t k + j) a row holds
    }
    __syncthreads();
    if (leader) {
      atomicAdd(&base[e], __popc(peers));
      warp_counts[warp][e] = 0;
    }
    __syncthreads();
  }
}

// Rows no entry owns: each group's padding [offsets[e] + counts[e], offsets[e + 1]) and the rows past
// the entries [offsets[E] + invalid, rows), invalid = n - sum counts. Their table is scanned in every
// block (E + 1 values); a warp a row.
__device__ void pad_zero(unsigned char* __restrict__ out, const int* __restrict__ offsets,
                         const int* __restrict__ counts, int64_t n, int experts, int64_t rows, int64_t row_bytes,
                         long long flags) {
  using Scan = cub::BlockScan<int, kScanThreads>;
  __shared__ typename Scan::TempStorage temp;
  __shared__ int pad_start[kMaxExperts + 1];  // padding rows before group e (E: the rows past the entries)
  __shared__ int row_start[kMaxExperts + 1];  // the first padding row of group e (E: past the entries)
  int items[kScanItems], assigned, total;
#pragma unroll
  for (int i = 0; i < kScanItems; ++i) {
    const int e = threadIdx.x * kScanItems + i;
    items[i] = e < experts ? counts[e] : 0;
  }
  Scan(temp).ExclusiveSum(items, items, assigned);
  __syncthreads();  // temp reused
  const int tail_row = offsets[experts] + int(n - assigned);
#pragma unroll
  for (int i = 0; i < kScanItems; ++i) {
    const int e = threadIdx.x * kScanItems + i;
    items[i] = e < experts ? offsets[e + 1] - offsets[e] - counts[e] : e == experts ? int(rows - tail_row) : 0;
    if (items[i] < 0) items[i] = 0;  // offsets / counts of another layout: nothing written outside out
  }
  Scan(temp).ExclusiveSum(items, items, total);
#pragma unroll
  for (int i = 0; i < kScanItems; ++i) {
    const int e = threadIdx.x * kScanItems + i;
    if (e <= experts) {
      pad_start[e] = items[i];
      row_start[e] = e < experts ? offsets[e] + counts[e] : tail_row;
    }
  }
  __syncthreads();
  const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  const bool vec = flags & RAWOPS_MOE_FLAG_VECTORS;
  for (int64_t p = int64_t(blockIdx.x) * warps + (threadIdx.x >> 5); p < total; p += int64_t(gridDim.x) * warps) {
    int lo = 0, hi = experts;  // the last group whose padding starts at or before p
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (pad_start[mid] <= p) lo = mid; else hi = mid - 1;
    }
    const int64_t row = row_start[lo] + (p - pad_start[lo]);
    if (row < 0 || row >= rows) continue;
    unsigned char* dst = out + row * row_bytes;
    if (vec) {
      for (int64_t c = lane * 16; c < row_bytes; c += 32 * 16) *reinterpret_cast<uint4*>(dst + c) = make_uint4(0, 0, 0, 0);
    } else {
      for (int64_t c = lane; c < row_bytes; c += 32) dst[c] = 0;
    }
  }
}

// --------------------------------------------------------------------------- rows
// N elements of T a lane moves at once: a 16-byte vector, or one element.
template <typename T, bool kVec> struct Piece {
  static constexpr int N = kVec ? Vec16<T>::size : 1;
  T v[N];
  __device__ __forceinline__ void load(const T* p) {
    if constexpr (kVec) {
      const Vec16<T> w = load16(p);
#pragma unroll
      for (int i = 0; i < N; ++i) v[i] = w.v[i];
    } else {
      v[0] = p[0];
    }
  }
  // kStream: evict-first (st.global.cs), for the permute's k copies, which must not push x's rows
  // (read again soon) out of L2
  template <bool kStream = false>
  __device__ __forceinline__ void store(T* p) const {
    if constexpr (kVec) {
      Vec16<T> w;
#pragma unroll
      for (int i = 0; i < N; ++i) w.v[i] = v[i];
      if constexpr (kStream) {
        store16_streaming(p, w);
      } else {
        store16(p, w);
      }
    } else if constexpr (kStream) {
      __stcs(p, v[0]);
    } else {
      p[0] = v[0];
    }
  }
};

__device__ __forceinline__ int row_of(int code) { return code >= 0 ? code : -(code + 1); }

// A warp an output row: out[r] = x[entry_of_row[r] / k], or zeros where no entry owns r (-1: a group's
// padding). The rows are taken group-interleaved, work item j = i (E + 1) + g the i-th row of group g
// (groups: the E experts' [offsets[g], offsets[g + 1]), and [offsets[E], rows): invalid ids, the
// tail), so that the warps in flight read tokens near one another (each group is in token order)
// and x's rows come from L2 while every group's rows are written in order. Rows taken in plain order
// read x from DRAM (a group's tokens span all of x) at 0.54 of the copy ceiling; each token's k
// copies scattered (a warp a token) ran L2-bound at 0.35 (H100, Qwen3 shape).
template <typename T, bool kVec>
__device__ void permute_rows(const T* __restrict__ x, const int* __restrict__ entry_of_row,
                             const int* __restrict__ offsets, T* __restrict__ out, int64_t rows, int64_t hidden, int k,
                             int64_t x_stride, int experts) {
  using P = Piece<T, kVec>;
  __shared__ int start[kMaxExperts + 2];
  const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  for (int g = threadIdx.x; g <= experts + 1; g += blockDim.x) start[g] = g <= experts ? offsets[g] : int(rows);
  __syncthreads();
  int longest = 0;  // the longest group's rows: every warp of every block the same
  for (int g = lane; g <= experts; g += 32) longest = max(longest, start[g + 1] - start[g]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) longest = max(longest, __shfl_xor_sync(kFull, longest, o));
  const int groups = experts + 1;
  const int64_t items = int64_t(groups) * longest, pieces = hidden / P::N;
  for (int64_t j = int64_t(blockIdx.x) * warps + (threadIdx.x >> 5); j < items; j += int64_t(gridDim.x) * warps) {
    const int g = int(j % groups);
    const int64_t r = start[g] + j / groups;
    if (r >= start[g + 1]) continue;  // a group shorter than the longest
    const int entry = entry_of_row[r];
    T* dst = out + r * hidden;
    if (entry < 0) {
      P zero;
#pragma unroll
      for (int i = 0; i < P::N; ++i) zero.v[i] = from_float<T>(0.f);
      for (int64_t c = lane; c < pieces; c += 32) zero.store(dst + c * P::N);
      continue;
    }
    const T* src = x + int64_t(entry / k) * x_stride;
    for (int64_t c0 = 0; c0 < pieces; c0 += 32 * kPermutePieces) {
      P a[kPermutePieces];
#pragma unroll
      for (int i = 0; i < kPermutePieces; ++i) {
        const int64_t c = c0 + lane + 32 * i;
        if (c < pieces) a[i].load(src + c * P::N);
      }
#pragma unroll
      for (int i = 0; i < kPermutePieces; ++i) {
        const int64_t c = c0 + lane + 32 * i;
        if (c < pieces) a[i].template store<true>(dst + c * P::N);
      }
    }
  }
}

template <typename T, bool kVec>
__device__ void unpermute_rows(const T* __restrict__ y, const float* __restrict__ weights,
                               const int* __restrict__ index, T* __restrict__ out, int64_t tokens, int64_t hidden,
                               int k, int64_t y_stride, int64_t y_rows) {
  using P = Piece<T, kVec>;
  const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  const int64_t pieces = hidden / P::N;
  for (int64_t t = int64_t(blockIdx.x) * warps + (threadIdx.x >> 5); t < tokens; t += int64_t(gridDim.x) * warps) {
    int mine = 0;
    float w = 1.0f;
    if (lane < k) {
      const int code = index[t * k + lane];
      mine = code;
      if (weights) w = weights[t * k + lane];
      if (code < 0 || code >= y_rows) {  // an invalid id, or a row y lacks: NaN, never a silent number
        w = nan_f();
        mine = 0;
      }
    }
    for (int64_t c0 = 0; c0 < pieces; c0 += 32) {  // warp-uniform: every lane reaches the shuffles
      const int64_t c = c0 + lane;
      const bool in = c < pieces;
      float acc[P::N];
#pragma unroll
      for (int i = 0; i < P::N; ++i) acc[i] = 0.0f;
#pragma unroll 4
      for (int j = 0; j < k; ++j) {  // j order: the same sum every run
        const int r = __shfl_sync(kFull, mine, j);
        const float wj = __shfl_sync(kFull, w, j);
        if (in) {
          P v;
          v.load(y + int64_t(r) * y_stride + c * P::N);
#pragma unroll
          for (int i = 0; i < P::N; ++i) acc[i] = fmaf(wj, to_float(v.v[i]), acc[i]);
        }
      }
      if (in) {
        P o;
#pragma unroll
        for (int i = 0; i < P::N; ++i) o.v[i] = from_float<T>(acc[i]);
        o.store(out + t * hidden + c * P::N);
      }
    }
  }
}

template <typename T, bool kVec>
__device__ void unpermute_bwd_rows(const T* __restrict__ dout, const T* __restrict__ y,
                                   const float* __restrict__ weights, const int* __restrict__ index,
                                   T* __restrict__ dy, float* __restrict__ dw, int64_t tokens, int64_t hidden, int k,
                                   int64_t dout_stride, int64_t y_stride, int64_t y_rows) {
  using P = Piece<T, kVec>;
  const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  const int64_t pieces = hidden / P::N;
  for (int64_t t = int64_t(blockIdx.x) * warps + (threadIdx.x >> 5); t < tokens; t += int64_t(gridDim.x) * warps) {
    const T* g = dout + t * dout_stride;
    for (int j = 0; j < k; ++j) {
      const int code = index[t * k + j];
      const bool bad = code < 0 || code >= y_rows;
      const int r = row_of(code);
      const float w = weights[t * k + j];
      float dot = 0.0f;
      for (int64_t c = lane; c < pieces; c += 32) {
        P gv, yv, o;
        gv.load(g + c * P::N);
        if (!bad) yv.load(y + int64_t(r) * y_stride + c * P::N);
#pragma unroll
        for (int i = 0; i < P::N; ++i) {
          const float gi = to_float(gv.v[i]);
          if (!bad) dot = fmaf(gi, to_float(yv.v[i]), dot);
          o.v[i] = from_float<T>(bad ? 0.0f : w * gi);
        }
        if (r < y_rows) o.store(dy + int64_t(r) * hidden + c * P::N);
      }
      dot = warp_sum(dot);
      if (lane == 0) dw[t * k + j] = bad ? nan_f() : dot;
    }
  }
}

}  // namespace
}  // namespace rawops

extern "C" __global__ void __launch_bounds__(RAWOPS_MOE_INDEX_THREADS)
    moe_count(const void* ids, int* block_counts, long long n, long long experts, long long chunk, long long flags) {
  rawops::count(ids, block_counts, n, int(experts), chunk, flags);
}

extern "C" __global__ void __launch_bounds__(RAWOPS_MOE_INDEX_THREADS)
    moe_place(const void* ids, const int* block_counts, int* offsets, int* counts, int* index, int* entry_of_row,
              long long n, long long experts, long long chunk, long long pad_to, long long flags) {
  rawops::place(ids, block_counts, offsets, counts, index, entry_of_row, n, int(experts), chunk, pad_to, flags);
}

extern "C" __global__ void __launch_bounds__(RAWOPS_MOE_SCAN_THREADS)
    moe_pad_zero(unsigned char* out, const int* offsets, const int* counts, long long n, long long experts,
                 long long rows, long long row_bytes, long long flags) {
  rawops::pad_zero(out, offsets, counts, n, int(experts), rows, row_bytes, flags);
}

// The router's body for the fewest slots a lane (a power of two) that hold `experts` scores: the
// top-k rounds scan every slot, so a row of 128 experts takes 4 a lane, not the widest router's 32.
#define RAWOPS_MOE_PER_LANE(experts, ...)                                                                      \
  do {                                                                                                             \
    const int per = int((experts + 31) / 32);                                                                      \
    if (per <= 1) { constexpr int kPer = 1; __VA_ARGS__; }                                                                \
    else if (per <= 2) { constexpr int kPer = 2; __VA_ARGS__; }                                                           \
    else if (per <= 4) { constexpr int kPer = 4; __VA_ARGS__; }                                                           \
    else if (per <= 8) { constexpr int kPer = 8; __VA_ARGS__; }                                                           \
    else if (per <= 16) { constexpr int kPer = 16; __VA_ARGS__; }                                                         \
    else { constexpr int kPer = RAWOPS_MOE_MAX_EXPERTS / 32; __VA_ARGS__; }                                               \
  } while (0)

#define RAWOPS_MOE(T, suffix)                                                                                      \
  extern "C" __global__ void __launch_bounds__(RAWOPS_MOE_ROUTE_THREADS)                                          \
      moe_route_##suffix(const T* logits, float* weights, int* ids, int* counts, long long tokens,                \
                         long long experts, long long stride, long long k, long long flags) {                    \
    __shared__ int hist[RAWOPS_MOE_MAX_EXPERTS]; /* the block's counts: one table whichever body runs */        \
    RAWOPS_MOE_PER_LANE(experts, rawops::route<T, kPer>(logits, weights, ids, counts, tokens, int(experts), stride, \
                                                        int(k), flags, hist));                                    \
  }                                                                                                                \
  extern "C" __global__ void __launch_bounds__(RAWOPS_MOE_ROUTE_THREADS)                                          \
      moe_route_bwd_##suffix(const T* logits, const int* ids, const float* grad_w, T* grad_logits,                \
                             long long tokens, long long experts, long long stride, long long k, long long flags) { \
    RAWOPS_MOE_PER_LANE(experts, rawops::route_bwd<T, kPer>(logits, ids, grad_w, grad_logits, tokens,            \
                                                            int(experts), stride, int(k), flags));                \
  }                                                                                                                \
  extern "C" __global__ void __launch_bounds__(RAWOPS_MOE_ROWS_THREADS)                                           \
      moe_permute_##suffix(const T* x, const int* entry_of_row, const int* offsets, T* out, long long rows,       \
                           long long hidden, long long k, long long x_stride, long long experts, long long flags) { \
    if (flags & RAWOPS_MOE_FLAG_VECTORS)                                                                          \
      rawops::permute_rows<T, true>(x, entry_of_row, offsets, out, rows, hidden, int(k), x_stride, int(experts)); \
    else                                                                                                           \
      rawops::permute_rows<T, false>(x, entry_of_row, offsets, out, rows, hidden, int(k), x_stride, int(experts)); \
  }                                                                                                                \
  extern "C" __global__ void __launch_bounds__(RAWOPS_MOE_ROWS_THREADS)                                           \
      moe_unpermute_##suffix(const T* y, const float* weights, const int* index, T* out, long long tokens,        \
                             long long hidden, long long k, long long y_stride, long long y_rows, long long flags) { \
    if (flags & RAWOPS_MOE_FLAG_VECTORS)                                                                          \
      rawops::unpermute_rows<T, true>(y, weights, index, out, tokens, hidden, int(k), y_stride, y_rows);          \
    else                                                                                                           \
      rawops::unpermute_rows<T, false>(y, weights, index, out, tokens, hidden, int(k), y_stride, y_rows);         \
  }                                                                                                                \
  extern "C" __global__ void __launch_bounds__(RAWOPS_MOE_ROWS_THREADS)                                           \
      moe_unpermute_bwd_##suffix(const T* dout, const T* y, const float* weights, const int* index, T* dy,        \
                                 float* dw, long long tokens, long long hidden, long long k, long long dout_stride, \
                                 long long y_stride, long long y_rows, long long flags) {                         \
    if (flags & RAWOPS_MOE_FLAG_VECTORS)                                                                          \
      rawops::unpermute_bwd_rows<T, true>(dout, y, weights, index, dy, dw, tokens, hidden, int(k), dout_stride,   \
                                          y_stride, y_rows);                                                      \
    else                                                                                                           \
      rawops::unpermute_bwd_rows<T, false>(dout, y, weights, index, dy, dw, tokens, hidden, int(k), dout_stride,  \
                                           y_stride, y_rows);                                                     \
  }

RAWOPS_MOE(float, f32)
RAWOPS_MOE(__half, f16)
RAWOPS_MOE(__nv_bfloat16, bf16)
