// MLP family, the fused backward: tc_mlp_w<W>_<act>_bwd_<dtype> (W = 16/32/64, float16 /
// bfloat16, sm_80+, mma.sync m16n8k16, float32 accumulation), then
// mlp_wgrad_reduce_layers_bwd_<dtype>. One kernel does the whole backward of the training
// forward (kernels/mlp_fused_fwd.cu or the tile forward, which keep each hidden pre-activation z
// in [hidden][batch][W]):
//   g_L = dy (times relu'(y) for an output ReLU); for l = L-1 .. 0:
//     dW_l += g_l^T a_{l-1}, db_l += colsum(g_l)   (a_{l-1} = act(z_{l-1}), x for l = 0)
//     g_{l-1} = (g_l W_l) * act'(z_{l-1})          (l >= 1), dx = g_0 W_0 when asked.
// Why one kernel: a chain that writes every g to device memory for separate weight-gradient
// kernels, which read g and a back (the tile kernels' backward), moves 2 x 512 MB more for the
// 64x4 network at 2^20 rows; here nothing but dy, z, x (and dx) crosses device memory.
// Launch: persistent, one block of `warps` (<= 8) warps per SM, tiles of 32 x warps rows
// (rawops/_mlp_plans.py: fast_bwd_smem_bytes).
// Per tile and layer every warp stages its 32 rows of g_l (G) and a_{l-1} (A) in shared
// memory; after a barrier each warp accumulates its fixed share of dW_l (16x32 blocks,
// round robin; db through an mma with a ones B operand) over the tile's rows with A = G^T
// and B = A, both by ldmatrix.trans, and adds it to the block's float32 accumulators in
// shared memory (fragment order: conflict-free float4); then it runs the chain for its own
// rows (g_l from G by ldmatrix, W_l^T fragments by ldmatrix.trans from the resident
// [out][in] weights, act' from A for ReLU, from z in device memory for GELU), keeping
// g_{l-1} in registers until a second barrier frees G. The next step's rows (z, x, the
// next tile's dy) are loaded into registers at the start of a step, so their latency hides
// under the step's tensor-core work. At the end each block writes its partial dW/db to
// ws[blockIdx] ([out_p][in_p] then [out_p] per layer) and mlp_wgrad_reduce_layers_bwd_* sums
// the blocks in order: deterministic, no atomics.
#include "rawops/dependent_launch.cuh"
#include "rawops/dtype.cuh"
#include "rawops/mlp.cuh"

namespace rawops {
namespace {

constexpr int kBwdRows = RAWOPS_MLP_FAST_BWD_ROWS;  // rows a warp owns in a tile (two m16 tiles)
static_assert(kBwdRows == 32, "a warp's rows are two m16 tiles");

__device__ __forceinline__ void ldsm_x4_trans(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Applies the activation to the 8 values of a 16-byte vector (kAct known at compile time).
template <typename T, int kAct> __device__ __forceinline__ uint4 activate16(uint4 v) {
  if (kAct == kActNone) return v;
  unsigned* w = reinterpret_cast<unsigned*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if (kAct == kActRelu) {
      w[i] = Mma<T>::relu(w[i]);
    } else {
      const T* h = reinterpret_cast<const T*>(&w[i]);
      w[i] = Mma<T>::pack(activate(to_float(h[0]), kActGelu), activate(to_float(h[1]), kActGelu));
    }
  }
  return v;
}

// A warp's 32 rows of a [batch][cols] array (cols % 8 == 0, 16-byte aligned, padded to
// cols_p <= kMaxCols with zeros, rows past rows_valid zeros) held in registers between
// load() and store(): lane holds 16-byte chunks e = lane + 32 i of the [32][cols_p] block.
template <typename T, int kMaxCols> struct RowsInFlight {
  static constexpr int kN = kBwdRows * kMaxCols / 8 / 32;
  uint4 v[kN];
  __device__ __forceinline__ void load(const T* __restrict__ src, int cols, const SmallDiv& cpr, int rows_valid,
                                       int lane) {
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      const int e = lane + 32 * i, r = cpr.quot(e), c = (e - r * cpr.d) * 8;
      v[i] = make_uint4(0u, 0u, 0u, 0u);
      if (r < rows_valid && c < cols) v[i] = __ldg(reinterpret_cast<const uint4*>(src + r * cols + c));
    }
  }
  template <int kAct> __device__ __forceinline__ void store(T* dst, int ld, const SmallDiv& cpr, int lane) const {
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      const int e = lane + 32 * i, r = cpr.quot(e), c = (e - r * cpr.d) * 8;
      if (r < kBwdRows) *reinterpret_cast<uint4*>(dst + r * ld + c) = activate16<T, kAct>(v[i]);
    }
  }
};

// Where one warp's staging of a [batch][cols] array can go through RowsInFlight.
template <typename T, int kMaxCols> __device__ __forceinline__ bool in_flight_ok(const T* p, int cols) {
  return cols % 8 == 0 && cols <= kMaxCols && (reinterpret_cast<size_t>(p) % 16) == 0;
}

// dW_l (and db_l) partial of one tile: for each of this warp's 16x16 blocks (m16 tile mt of
// the layer's outputs, 16 inputs at np) sum over the tile's rows of G^T A, added to the
// block's accumulators acc (fragment order: [groups][2][32 lanes] float4, then the db
// slots [out_p / 16][32 lanes] float4).
// Each warp takes 16x32 blocks (m16 tile mt, the two 16-input pairs np0, np0 + 1): one
// ldmatrix of G^T feeds both pairs' B fragments (3 ldmatrix per 4 mma). The db mma (ones as
// B) of an m16 tile is done by the warp of its first quad, into that block's slot
// (write_partials sums every quad's slot in order; the others stay zero): dealing the db k
// steps over the quads' warps instead would put a branch in every warp's k loop.
template <typename T>
__device__ __forceinline__ void wgrad_tile(float* __restrict__ acc, unsigned g_t, unsigned a_t, int gld, int ald,
                                           int out_p, int in_p, int ksteps, int warp, int warps, int lane) {
  const int npairs = in_p / 16, nquads = (npairs + 1) / 2, blocks = (out_p / 16) * nquads;
  const unsigned ones = Mma<T>::pack(1.f, 1.f);
  float4* frag = reinterpret_cast<float4*>(acc);
  float4* dbs = frag + (out_p / 16) * npairs * 64;
  for (int f = warp; f < blocks; f += warps) {
    const int mt = f / nquads, quad = f - mt * nquads, np0 = 2 * quad;
    const bool second = np0 + 1 < npairs, with_db = quad == 0;
    float d[5][4] = {};
#pragma unroll 4
    for (int ks = 0; ks < ksteps; ++ks) {
      unsigned a[4], b[4], c[4];
      ldsm_x4_trans(a, g_t + 2u * unsigned(ks * 16 * gld + mt * 16));
      ldsm_x4_trans(b, a_t + 2u * unsigned(ks * 16 * ald + np0 * 16));
      Mma<T>::mma(d[0], a, b[0], b[1]);
      Mma<T>::mma(d[1], a, b[2], b[3]);
      if (second) {
        ldsm_x4_trans(c, a_t + 2u * unsigned(ks * 16 * ald + np0 * 16 + 16));
        Mma<T>::mma(d[2], a, c[0], c[1]);
        Mma<T>::mma(d[3], a, c[2], c[3]);
      }
      if (with_db) Mma<T>::mma(d[4], a, ones, ones);
    }
#pragma unroll
    for (int h = 0; h < 5; ++h) {
      if ((h == 2 || h == 3) && !second) continue;
      if (h == 4 && !with_db) continue;
      float4* p = h < 4 ? frag + ((mt * npairs + np0) * 2 + h) * 32 + lane : dbs + f * 32 + lane;
      float4 s = *p;
      s.x += d[h][0], s.y += d[h][1], s.z += d[h][2], s.w += d[h][3];
      *p = s;
    }
  }
}

// acc = the warp's 32 rows of G (k_p columns) times the kW columns at col0 of a [k_p][ld]
// weight block (W_l in [out][in] layout: k = out, so B fragments come by ldmatrix.trans);
// ncols (a multiple of 16) of the kW columns are valid.
template <typename T, int kW>
__device__ __forceinline__ void chain_product(float (&acc)[2][kW / 8][4], unsigned g_a, int gld, unsigned w_b,
                                              int ld, int k_p, int ncols) {
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int q = 0; q < kW / 8; ++q)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[m][q][i] = 0.f;
#pragma unroll 2
  for (int kk = 0; kk < k_p / 16; ++kk) {
    unsigned a[2][4];
#pragma unroll
    for (int m = 0; m < 2; ++m) ldsm_x4(a[m], g_a + 2u * unsigned(m * 16 * gld + kk * 16));
#pragma unroll
    for (int j = 0; j < kW / 16; ++j) {
      if (j * 16 >= ncols) break;
      unsigned b[4];
      ldsm_x4_trans(b, w_b + 2u * unsigned(kk * 16 * ld + j * 16));
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        Mma<T>::mma(acc[m][2 * j], a[m], b[0], b[1]);
        Mma<T>::mma(acc[m][2 * j + 1], a[m], b[2], b[3]);
      }
    }
  }
}

// g_{l-1} = acc * act'(z_{l-1}) packed in the C-fragment layout (pairs of row g, row g + 8),
// rows past rows_valid zeroed. act' from the staged a = relu(z) (ReLU: a > 0 iff z > 0),
// from z in device memory (GELU, the warp's rows of this layer's [batch][kW]), or 1.
template <typename T, int kW, int kAct>
__device__ __forceinline__ void chain_epilogue(const float (&acc)[2][kW / 8][4], unsigned (&gn)[2][kW / 8][2],
                                               const T* aw, int ald, const T* __restrict__ z, int rows_valid,
                                               int lane) {
  const int g = lane / 4, t = lane % 4;
  unsigned zw[2][kW / 8][2];
  if (kAct == kActGelu) {  // every load issued before the math that needs them
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int q = 0; q < kW / 8; ++q)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = m * 16 + g + 8 * h;
          zw[m][q][h] = r < rows_valid ? __ldg(reinterpret_cast<const unsigned*>(z + r * kW + q * 8 + 2 * t)) : 0u;
        }
  }
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int q = 0; q < kW / 8; ++q)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = m * 16 + g + 8 * h, c = q * 8 + 2 * t;
        float d0 = 1.f, d1 = 1.f;
        if (kAct == kActRelu) {
          const unsigned pair = *reinterpret_cast<const unsigned*>(aw + r * ald + c);
          const T* a = reinterpret_cast<const T*>(&pair);
          d0 = to_float(a[0]) > 0.f ? 1.f : 0.f;
          d1 = to_float(a[1]) > 0.f ? 1.f : 0.f;
        } else if (kAct == kActGelu) {
          const T* zz = reinterpret_cast<const T*>(&zw[m][q][h]);
          d0 = activate_grad(to_float(zz[0]), kActGelu);
          d1 = activate_grad(to_float(zz[1]), kActGelu);
        }
        if (r >= rows_valid) d0 = d1 = 0.f;
        gn[m][q][h] = Mma<T>::pack(acc[m][q][2 * h] * d0, acc[m][q][2 * h + 1] * d1);
      }
}

// dx rows of the warp (columns col0 + the kW of acc, < n_in), rows past rows_valid skipped.
template <typename T, int kW>
__device__ __forceinline__ void store_dx(const float (&acc)[2][kW / 8][4], T* __restrict__ dx, int n_in, int col0,
                                         int rows_valid, int lane) {
  const int g = lane / 4, t = lane % 4;
  const bool pairs = n_in % 2 == 0 && (reinterpret_cast<size_t>(dx) % 4) == 0;
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int q = 0; q < kW / 8; ++q)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = m * 16 + g + 8 * h, c = col0 + q * 8 + 2 * t;
        if (r >= rows_valid || c >= n_in) continue;
        T* p = dx + int64_t(r) * n_in + c;
        const float v0 = acc[m][q][2 * h], v1 = acc[m][q][2 * h + 1];
        if (pairs) {
          *reinterpret_cast<unsigned*>(p) = Mma<T>::pack(v0, v1);
        } else {
          p[0] = from_float<T>(v0);
          if (c + 1 < n_in) p[1] = from_float<T>(v1);
        }
      }
}

// The block's accumulators, fragment order -> ws (per layer [out_p][in_p] then [out_p]).
__device__ __forceinline__ void write_partials(const float* acc, float* __restrict__ ws, int out_p, int in_p) {
  const int npairs = in_p / 16, groups = (out_p / 16) * npairs;
  const float4* frag = reinterpret_cast<const float4*>(acc);
  for (int e = threadIdx.x; e < groups * 64; e += blockDim.x) {
    const int f = e / 64, h = (e / 32) % 2, lane = e % 32;
    const int mt = f / npairs, np = f - mt * npairs;
    const int r = mt * 16 + lane / 4, c = np * 16 + h * 8 + 2 * (lane % 4);
    const float4 v = frag[e];
    *reinterpret_cast<float2*>(ws + r * in_p + c) = make_float2(v.x, v.y);
    *reinterpret_cast<float2*>(ws + (r + 8) * in_p + c) = make_float2(v.z, v.w);
  }
  const float4* dbs = frag + groups * 64;
  const int nquads = (npairs + 1) / 2;
  for (int e = threadIdx.x; e < (out_p / 16) * 32; e += blockDim.x) {
    const int mt = e / 32, lane = e % 32;
    if (lane % 4 != 0) continue;
    float lo = 0.f, hi = 0.f;  // column 0 of the ones products: the row sums of g^T
    for (int q = 0; q < nquads; ++q) {
      const float4 v = dbs[(mt * nquads + q) * 32 + lane];
      lo += v.x, hi += v.z;
    }
    ws[out_p * in_p + mt * 16 + lane / 4] = lo;
    ws[out_p * in_p + mt * 16 + lane / 4 + 8] = hi;
  }
}

// Floats of one layer's accumulators: the [out_p][in_p] weight gradient in fragment order
// and a db slot (8 floats a row) per 16x32 block.
__host__ __device__ constexpr int accumulator_floats(int out_p, int in_p) {
  return out_p * (in_p + 8 * ((in_p + 31) / 32));
}

template <typename T, int kW, int kAct>
__device__ void fast_bwd(const T* __restrict__ dy, const T* __restrict__ y, const T* __restrict__ x,
                         const T* __restrict__ save, T* __restrict__ dx, float* __restrict__ ws, const T* const* W,
                         int64_t batch, int n_in, int n_out, int hidden, int flags, int64_t ws_stride) {
  // The layers' reduce (launched programmatically dependent on sm_90) may be scheduled now: its
  // blocks take SM slots as these retire and wait for the whole grid before reading ws.
  allow_dependent_launch();
  constexpr int ldw = kW + 8;
  extern __shared__ __align__(128) unsigned char tc_smem[];
  const int layers = hidden + 1;
  const int in_p = round16(n_in), out_p = round16(n_out);
  const int ld0 = in_p + 8, gld = max(out_p, kW) + 8, ald = max(in_p, kW) + 8;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int rows = kBwdRows * warps;  // a tile
  auto out_p_of = [&](int l) { return l == hidden ? out_p : kW; };
  auto in_p_of = [&](int l) { return l == 0 ? in_p : kW; };
  // Layout (rawops/_mlp_plans.py fast_bwd_smem_bytes): float accumulators of every layer
  // (accumulator_floats each), weights like fast_fwd's (no biases), G [rows][gld],
  // A [rows][ald] (2-byte elements).
  auto acc_of = [&](int l) {
    return reinterpret_cast<float*>(tc_smem) +
           (l == 0 ? 0 : accumulator_floats(kW, in_p) + (l - 1) * accumulator_floats(kW, kW));
  };
  T* w0 = reinterpret_cast<T*>(acc_of(hidden) + accumulator_floats(out_p, kW));
  T* wh = w0 + kW * ld0;
  T* wl = wh + (hidden - 1) * kW * ldw;
  T* G = wl + out_p * ldw;
  T* A = G + rows * gld;
  T* gw = G + warp * kBwdRows * gld;  // this warp's rows
  T* aw = A + warp * kBwdRows * ald;

  for (int e = threadIdx.x; e < (w0 - reinterpret_cast<T*>(tc_smem)) / 2; e += blockDim.x)
    reinterpret_cast<float*>(tc_smem)[e] = 0.f;
  for (int l = 0; l < layers; ++l) {
    const int in_l = l == 0 ? n_in : kW, out_l = l == hidden ? n_out : kW;
    T* dst = l == 0 ? w0 : l == hidden ? wl : wh + (l - 1) * kW * ldw;
    load_rows<T>(dst, l == 0 ? ld0 : ldw, W[l], in_l, out_l, round16(out_l), in_l, round16(in_l), nullptr, kActNone,
                 threadIdx.x, blockDim.x);
  }

  const bool out_relu = ((flags >> kOutputActShift) & 3) == kActRelu;
  const bool dy_fly = !out_relu && in_flight_ok<T, kW>(dy, n_out);
  const bool x_fly = in_flight_ok<T, kW>(x, n_in);
  const SmallDiv z_cpr(kW / 8), x_cpr(in_p / 8), dy_cpr(out_p / 8);
  // ldmatrix lane addresses: g_a the A fragments of the warp's rows of G; g_t / a_t the
  // transposed reads of G and A over a tile's rows (k = rows); w_b the weights' transposed
  // B fragments (k = out rows).
  const unsigned g_a = smem_addr(gw) + 2u * unsigned((lane % 16) * gld + (lane / 16) * 8);
  const unsigned g_t = smem_addr(G) + 2u * unsigned((lane % 8 + 8 * (lane / 16)) * gld + 8 * ((lane / 8) % 2));
  const unsigned a_t = smem_addr(A) + 2u * unsigned((lane % 8 + 8 * ((lane / 8) % 2)) * ald + 8 * (lane / 16));
  const int b_k = lane % 8 + 8 * ((lane / 8) % 2), b_n = 8 * (lane / 16);
  auto w_b = [&](int l) {
    const T* base = l == 0 ? w0 : l == hidden ? wl : wh + (l - 1) * kW * ldw;
    return smem_addr(base) + 2u * unsigned(b_k * (l == 0 ? ld0 : ldw) + b_n);
  };
  // Each block owns one contiguous range of whole 32-row warp units, as equal as the grid
  // allows, walked in tiles of `rows` (its last one short). Tiles dealt round robin would leave
  // the last round to a few blocks (2^20 rows are 4096 tiles of 256 rows: over 132 SMs, 32
  // rounds on 4 of them and 31 on the rest); a range is 31 tiles and one of 32 rows.
  const int64_t units = (batch + kBwdRows - 1) / kBwdRows, per_block = (units + gridDim.x - 1) / gridDim.x;
  const int64_t begin = min(batch, int64_t(blockIdx.x) * per_block * kBwdRows);
  const int64_t end = min(batch, begin + per_block * kBwdRows);
  auto warp_rows = [&](int64_t row0) {  // valid rows of this warp in the tile at row0
    const int64_t v = end - row0 - warp * kBwdRows;
    return int(v < 0 ? 0 : v < kBwdRows ? v : kBwdRows);
  };
  auto z_rows = [&](int l, int64_t row0) { return save + (int64_t(l) * batch + row0 + warp * kBwdRows) * kW; };
  // Synchronous staging (the first tile, and rows RowsInFlight cannot hold).
  auto stage_dy = [&](int64_t row0) {
    const int64_t r = row0 + warp * kBwdRows;
    load_rows<T>(gw, gld, dy + r * n_out, n_out, warp_rows(row0), kBwdRows, n_out, out_p,
                 out_relu ? y + r * n_out : nullptr, kActNone, lane, 32);
  };
  auto stage_z = [&](int l, int64_t row0) {
    load_rows<T>(aw, ald, z_rows(l, row0), kW, warp_rows(row0), kBwdRows, kW, kW, nullptr, kAct, lane, 32);
  };

  RowsInFlight<T, kW> next_a, next_g;
  if (begin < end) {
    stage_dy(begin);
    stage_z(hidden - 1, begin);
  }
  for (int64_t row0 = begin; row0 < end; row0 += rows) {
    const int64_t next = row0 + rows;  // the next tile's first row (none at end)
    const int rows_valid = warp_rows(row0);
    const int tile_rows = int(end - row0 < rows ? end - row0 : rows);
    for (int l = hidden; l >= 0; --l) {
      __syncthreads();  // G = g_l and A = a_{l-1} staged by every warp
      // The next step's rows in flight while this one computes.
      if (l >= 2) {
        next_a.load(z_rows(l - 2, row0), kW, z_cpr, rows_valid, lane);
      } else if (l == 1) {
        if (x_fly) next_a.load(x + (row0 + warp * kBwdRows) * n_in, n_in, x_cpr, rows_valid, lane);
      } else if (next < end) {
        next_a.load(z_rows(hidden - 1, next), kW, z_cpr, warp_rows(next), lane);
        if (dy_fly) next_g.load(dy + (next + warp * kBwdRows) * n_out, n_out, dy_cpr, warp_rows(next), lane);
      }
      wgrad_tile<T>(acc_of(l), g_t, a_t, gld, ald, out_p_of(l), in_p_of(l), (tile_rows + 15) / 16, warp, warps, lane);
      // A warp with no rows in a short tile skips the chain (its G rows are never read: the
      // weight gradient's k steps end at the tile's last row rounded to 16).
      unsigned gn[2][kW / 8][2];
      if (rows_valid == 0) {
      } else if (l >= 1) {
        float acc[2][kW / 8][4];
        chain_product<T, kW>(acc, g_a, gld, w_b(l), ldw, out_p_of(l), kW);
        chain_epilogue<T, kW, kAct>(acc, gn, aw, ald, z_rows(l - 1, row0), rows_valid, lane);
      } else if (dx != nullptr) {
        for (int c0 = 0; c0 < in_p; c0 += kW) {
          float acc[2][kW / 8][4];
          chain_product<T, kW>(acc, g_a, gld, w_b(0) + 2u * unsigned(c0), ld0, kW, in_p - c0 < kW ? in_p - c0 : kW);
          store_dx<T, kW>(acc, dx + (row0 + warp * kBwdRows) * n_in, n_in, c0, rows_valid, lane);
        }
      }
      __syncthreads();  // every warp done reading G and A
      if (l >= 1) {
        const int g = lane / 4, t = lane % 4;
        if (rows_valid > 0)
#pragma unroll
          for (int m = 0; m < 2; ++m)
#pragma unroll
            for (int q = 0; q < kW / 8; ++q)
#pragma unroll
              for (int h = 0; h < 2; ++h)
                *reinterpret_cast<unsigned*>(gw + (m * 16 + g + 8 * h) * gld + q * 8 + 2 * t) = gn[m][q][h];
        if (l >= 2) {
          next_a.template store<kAct>(aw, ald, z_cpr, lane);
        } else if (x_fly) {
          next_a.template store<kActNone>(aw, ald, x_cpr, lane);
        } else {
          load_rows<T>(aw, ald, x + (row0 + warp * kBwdRows) * n_in, n_in, rows_valid, kBwdRows, n_in, in_p, nullptr,
                       kActNone, lane, 32);
        }
      } else if (next < end) {
        next_a.template store<kAct>(aw, ald, z_cpr, lane);
        if (dy_fly) next_g.template store<kActNone>(gw, gld, dy_cpr, lane);
        else stage_dy(next);
      }
      __syncwarp();
    }
  }
  __syncthreads();
  float* part = ws + int64_t(blockIdx.x) * ws_stride;
  for (int l = 0; l < layers; ++l) {
    write_partials(acc_of(l), part, out_p_of(l), in_p_of(l));
    part += out_p_of(l) * (in_p_of(l) + 1);
  }
}

// The fused backward's partials of every layer reduced in one launch (blockIdx.y = layer; grid.x
// = ceil(outputs of the largest layer / kReduceOutputs)): the per-layer sum of
// mlp_wgrad_reduce_bwd (kernels/mlp_tiles.cu) at the layer's offset in a block's row (the layout
// of write_partials: [n_p][k_p] then [n_p] floats per layer).
// A block of kReduceRuns x kReduceOutputs threads takes kReduceOutputs outputs; each output's
// chunks are split into kReduceRuns fixed runs summed in order by as many threads, the run sums
// then added in run order (deterministic): one thread walking all of a column's chunks (one per
// SM) would be latency-bound.
constexpr int kReduceOutputs = RAWOPS_MLP_REDUCE_LAYERS_OUTPUTS, kReduceRuns = RAWOPS_MLP_REDUCE_LAYERS_RUNS,
              kReduceInFlight = 24;
template <typename T>
__device__ __forceinline__ void wgrad_reduce_layers(const float* __restrict__ ws, int64_t chunks, int64_t stride,
                                                    int n_in, int width, int n_out, int hidden, T* const* dw,
                                                    T* const* db) {
  __shared__ float runs[kReduceRuns][kReduceOutputs];
  const int l = blockIdx.y, lane = threadIdx.x % kReduceOutputs, run = threadIdx.x / kReduceOutputs;
  auto n_p_of = [&](int i) { return i == hidden ? round16(n_out) : width; };
  auto k_p_of = [&](int i) { return i == 0 ? round16(n_in) : width; };
  int64_t offset = 0;
  for (int i = 0; i < l; ++i) offset += int64_t(n_p_of(i)) * (k_p_of(i) + 1);
  const int N = l == hidden ? n_out : width, K = l == 0 ? n_in : width, k_p = k_p_of(l);
  const int64_t nk = int64_t(N) * K, total = nk + (db[l] != nullptr ? N : 0);
  const int64_t e = int64_t(blockIdx.x) * kReduceOutputs + lane;
  wait_for_previous_grid();  // the fused backward's partials (a programmatic dependent launch on sm_90)
  float s = 0.f;
  if (e < total) {
    const int64_t src = offset + (e < nk ? (e / K) * k_p + e % K : int64_t(n_p_of(l)) * k_p + (e - nk));
    const int64_t per = (chunks + kReduceRuns - 1) / kReduceRuns, c0 = run * per, c1 = min(chunks, c0 + per);
    if (c1 - c0 <= kReduceInFlight) {
      // Every load of the run in flight at once (a loop unrolled by 4 would wait on L2 once a
      // group of 4), then summed in chunk order.
      float v[kReduceInFlight];
#pragma unroll
      for (int i = 0; i < kReduceInFlight; ++i) v[i] = c0 + i < c1 ? ws[(c0 + i) * stride + src] : 0.f;
#pragma unroll
      for (int i = 0; i < kReduceInFlight; ++i) s += v[i];
    } else {
#pragma unroll 8
      for (int64_t c = c0; c < c1; ++c) s += ws[c * stride + src];
    }
  }
  runs[run][lane] = s;
  __syncthreads();
  if (run != 0 || e >= total) return;
  float sum = 0.f;
#pragma unroll
  for (int r = 0; r < kReduceRuns; ++r) sum += runs[r][lane];
  if (e < nk) dw[l][e] = from_float<T>(sum);
  else db[l][e - nk] = from_float<T>(sum);
}

}  // namespace
}  // namespace rawops

#define RAWOPS_REDUCE_LAYERS(suffix, T)                                                                        \
  extern "C" __global__ void __launch_bounds__(rawops::kReduceRuns * rawops::kReduceOutputs)                 \
      mlp_wgrad_reduce_layers_bwd_##suffix(const float* ws, long long chunks, long long stride, long long n_in, \
                                           long long width, long long n_out, long long hidden, T* dw0, T* dw1,  \
                                           T* dw2, T* dw3, T* dw4, T* dw5, T* dw6, T* dw7, T* dw8, T* db0,      \
                                           T* db1, T* db2, T* db3, T* db4, T* db5, T* db6, T* db7, T* db8) {    \
    T* const dw[rawops::kMaxLayers] = {dw0, dw1, dw2, dw3, dw4, dw5, dw6, dw7, dw8};                          \
    T* const db[rawops::kMaxLayers] = {db0, db1, db2, db3, db4, db5, db6, db7, db8};                          \
    rawops::wgrad_reduce_layers<T>(ws, chunks, stride, int(n_in), int(width), int(n_out), int(hidden), dw, db); \
  }
RAWOPS_REDUCE_LAYERS(f16, __half)
RAWOPS_REDUCE_LAYERS(bf16, __nv_bfloat16)

// One entry per hidden width W and hidden activation, like the forward's; 8 warps at most, one
// block per SM (the accumulators and weights take most of the shared memory).
#define RAWOPS_TC_FAST_BWD(suffix, T, W, ACT, CODE)                                                             \
  extern "C" __global__ void __launch_bounds__(32 * RAWOPS_MLP_FAST_BWD_MAX_WARPS, 1)                          \
      tc_mlp_w##W##_##ACT##_bwd_##suffix(const T* dy, const T* y, const T* x, const T* save, T* dx, float* ws,  \
                                         RAWOPS_TC_PARAMS(T), long long batch, long long n_in, long long n_out, \
                                         long long hidden, long long flags, long long ws_stride) {             \
    const T* W_[rawops::kMaxLayers] = {w0, w1, w2, w3, w4, w5, w6, w7, w8};                                  \
    RAWOPS_TC_FAST_CALL((rawops::fast_bwd<T, W, CODE>(dy, y, x, save, dx, ws, W_, batch, int(n_in), int(n_out), \
                                                      int(hidden), int(flags), ws_stride)));                   \
  }
#define RAWOPS_TC_FAST_BWD_ACTS(suffix, T, W)                                                                  \
  RAWOPS_TC_FAST_BWD(suffix, T, W, relu, rawops::kActRelu)                                                     \
  RAWOPS_TC_FAST_BWD(suffix, T, W, gelu, rawops::kActGelu)                                                     \
  RAWOPS_TC_FAST_BWD(suffix, T, W, none, rawops::kActNone)
#define RAWOPS_TC_FAST_BWD_ENTRIES(suffix, T)                                                                  \
  RAWOPS_TC_FAST_BWD_ACTS(suffix, T, 16)                                                                       \
  RAWOPS_TC_FAST_BWD_ACTS(suffix, T, 32)                                                                       \
  RAWOPS_TC_FAST_BWD_ACTS(suffix, T, 64)

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define RAWOPS_TC_FAST_CALL(call) call
#else
#define RAWOPS_TC_FAST_CALL(call) __trap()
#endif
RAWOPS_TC_FAST_BWD_ENTRIES(f16, __half)
RAWOPS_TC_FAST_BWD_ENTRIES(bf16, __nv_bfloat16)
#undef RAWOPS_TC_FAST_CALL

