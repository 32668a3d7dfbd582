#pragma once
// Merges the partial outputs of split requests (in the output type, LSE-weighted, in fp32)
// into O and the optional LSE. A block of 256 threads serves one request, 256 / (kWarpSize W)
// rows of it (32-lane warps on NVIDIA, 64-lane waves on AMD) and 512 / C of the output columns:
// W warps per row (1, 2, 4 or 8 on NVIDIA, up to 4 on AMD; W = 1 is one warp per row) and
// C column slices (1, 2 or 4 on NVIDIA, up to 2 on AMD; each block of a row reads all of the
// row's LSEs, n floats). The pieces of a row go to its warps in turn (piece i to warp i mod W),
// each warp merging its pieces online in one pass (no wait for the row's merged LSE), so a row
// cut into hundreds of pieces (a long context at small batch) merges in a few memory latencies over
// W x C warps, while many short splits waste no threads. W and C are chosen on the host from
// the plan's shape (combine_layout), never from kv_len values. Column slices change no sum.
// Every sum has a fixed order (per warp in piece order, then over the row's warps in order):
// results are bitwise the same on every run. Requests that were not split return at once.
#include "../arch/convert.hpp"
#include "../core/attention_math.hpp"
#include "../core/numeric.hpp"
#include "../core/plan.hpp"
#include "../platform/intrinsics.hpp"
#include "../platform/runtime.hpp"
#include "workspace.hpp"

#if defined(MLAKIT_HAS_GPU_BACKEND)

namespace mlakit::detail {

inline constexpr int kCombineThreads = 256;
inline constexpr int kCombineWarps = kCombineThreads / kWarpSize;

// Most column slices: one group of 4 columns per lane and piece (4 on NVIDIA, 2 on AMD).
inline constexpr int kCombineMaxColSplits = kHeadDimV / kWarpSize / 4;

// Columns a lane loads at once from a slice of 512 / C columns: 8 (16 bytes of the 16-bit
// output type), or 4 (8 bytes) where the slice leaves fewer than 8 per lane.
template <int C>
inline constexpr int kCombineGroupCols = kHeadDimV / kWarpSize / C >= 8 ? 8 : 4;

// A group's bits (G / 2 words of two 16-bit values) and its words by index.
template <int G>
struct CombineGroup;
template <>
struct CombineGroup<8> {
  using type = uint4;
  __device__ static std::uint32_t word(const uint4& v, int q) {
    return q == 0 ? v.x : q == 1 ? v.y : q == 2 ? v.z : v.w;
  }
  __device__ static uint4 of(const std::uint32_t (&w)[4]) {
    return make_uint4(w[0], w[1], w[2], w[3]);
  }
};
template <>
struct CombineGroup<4> {
  using type = uint2;
  __device__ static std::uint32_t word(const uint2& v, int q) { return q == 0 ? v.x : v.y; }
  __device__ static uint2 of(const std::uint32_t (&w)[2]) { return make_uint2(w[0], w[1]); }
};

struct CombineLayout {
  int warps_per_row = 1;  // W
  int col_splits = 1;     // C
  // 256 instead of 64 bytes of loads per lane in flight (about 120 instead of 56 registers per
  // thread): for unsliced grids of at most one block per SM, where registers limit nothing and
  // a warp walking many pieces waits for memory once per batch. With column slices it was
  // slower (docs/performance.md, "Split plan, planner and combine").
  bool deep = false;

  // Blocks along the row dimension for `rows` rows per request (grid.y).
  int row_groups(int rows) const {
    const int rows_per_block = kCombineWarps / warps_per_row;
    return (rows + rows_per_block - 1) / rows_per_block;
  }
};

// Layout for a plan over `rows` rows per request on `sm_count` SMs: about one warp per four
// pieces of an average request, first more warps per row (at most the whole block), then
// column slices while the grid has fewer blocks than SMs. A warp walking many pieces is bound
// by the latency of its loads, so long rows take more warps and a small grid more blocks;
// once the grid has a block per SM, slices only add blocks (docs/performance.md, "Constants").
inline CombineLayout combine_layout(const PlanShape& shape, int rows, int sm_count) {
  const int avg = shape.batch > 0 ? (shape.num_ctas + shape.batch - 1) / shape.batch : 1;
  CombineLayout l;
  while (l.warps_per_row < kCombineWarps && 4 * l.warps_per_row < avg) l.warps_per_row *= 2;
  const std::int64_t blocks = std::int64_t(shape.batch) * l.row_groups(rows);
  while (l.col_splits < kCombineMaxColSplits && 4 * l.warps_per_row * l.col_splits < avg &&
         2 * blocks * l.col_splits <= sm_count)
    l.col_splits *= 2;
  l.deep = l.col_splits == 1 && blocks <= sm_count;
  return l;
}

// One kernel per column-slice count C (1, 2 or 4) and batch depth (kDeep: CombineLayout::deep):
// the column groups per lane of a slice, and so how many pieces the loop below loads at
// once, are compile-time numbers.
template <class T, int C, bool kDeep>
__global__ void __launch_bounds__(kCombineThreads)
    combine_kernel(DecodeArgs a, WorkspaceView ws, int warps_per_row) {
  constexpr int col_splits = C;
  static_assert(C >= 1 && C <= kCombineMaxColSplits,
                "column slices of one 4-column group per lane or more");
  constexpr int G = kCombineGroupCols<C>;
  using Group = CombineGroup<G>;
  using Vec = typename Group::type;
  constexpr int vecs = kHeadDimV / kWarpSize / C / G;  // G-column groups per lane in the slice
  __shared__ float red_m[kCombineWarps], red_l[kCombineWarps];
  alignas(16) __shared__ float part[kCombineWarps][kHeadDimV];
  const int b = static_cast<int>(blockIdx.x);
  const int col0 = static_cast<int>(blockIdx.z) * (kHeadDimV / col_splits);
  const RequestPlan r = ws.requests[b];
  if (r.num_pieces <= 1) return;  // written directly by the decode kernel (whole block)
  const int W = warps_per_row;
  const int lane = lane_id(), warp = warp_id();
  const int sub = warp % W, lead = warp - sub;  // this warp's rank in its row, first warp
  const int row = static_cast<int>(blockIdx.y) * (kCombineWarps / W) + warp / W;
  const bool valid = row < a.num_heads * a.q_len;
  const int n = valid ? r.num_pieces : 0;
  const std::int64_t stride = ws.rows_padded;  // slot of piece i: first + i * stride
  const std::int64_t first = std::int64_t(r.partial_base) * stride + row;
  const int tid_row = sub * kWarpSize + lane, threads_row = W * kWarpSize;

  // One pass: each warp merges its pieces online (LseMerge: running max and sum, and the
  // weighted sum acc of their outputs, all relative to the max), so no load waits for the
  // row's merged LSE. The pieces are walked kPieces at a time (256 or 64 bytes of loads of G
  // columns per lane, kDeep or not): every load of a batch (LSE and O) is issued before any is
  // used, so a warp waits for memory once per batch; the batch's largest LSE rescales acc and
  // the sum once, then its pieces are added in increasing order. Pieces that saw no key (LSE
  // -inf) add nothing. Columns of group j of this lane: col0 + G (lane + j kWarpSize) + 0..G-1.
  constexpr int kPieces = (kDeep ? 256 : 64) / (vecs * G * 2);
  const int mine = n > sub ? (n - sub + W - 1) / W : 0;  // pieces of this warp
  LseMerge st;  // the same in every lane of the warp (every lane reads the same LSEs)
  float acc[G * vecs];
#pragma unroll
  for (int j = 0; j < G * vecs; ++j) acc[j] = 0.0f;
  for (int p0 = 0; p0 < mine; p0 += kPieces) {
    float lse_u[kPieces];
    Vec v_u[kPieces][vecs];  // G values of the output type each
#pragma unroll
    for (int u = 0; u < kPieces; ++u) {
      lse_u[u] = neg_inf();
      if (p0 + u < mine) {
        const std::int64_t slot = first + std::int64_t(sub + (p0 + u) * W) * stride;
        lse_u[u] = ws.partial_lse[slot];
        const Vec* src =
            reinterpret_cast<const Vec*>(ws.partial_o + slot * kHeadDimV + col0) + lane;
#pragma unroll
        for (int j = 0; j < vecs; ++j) v_u[u][j] = src[j * kWarpSize];
      }
    }
    float bm = neg_inf();
#pragma unroll
    for (int u = 0; u < kPieces; ++u) bm = fmaxf(bm, lse_u[u]);
    if (bm == neg_inf()) continue;     // no piece of the batch saw a key
    const float f = st.raise_max(bm);  // 0 while acc is still empty
    if (f != 1.0f) {
#pragma unroll
      for (int j = 0; j < G * vecs; ++j) acc[j] *= f;
    }
#pragma unroll
    for (int u = 0; u < kPieces; ++u) {
      if (lse_u[u] != neg_inf()) {
        const float w = st.add_below_max(lse_u[u]);
#pragma unroll
        for (int j = 0; j < vecs; ++j) {
#pragma unroll
          for (int q = 0; q < G / 2; ++q) {
            float lo, hi;
            arch::unpack2<T>(Group::word(v_u[u][j], q), lo, hi);
            acc[G * j + 2 * q] += w * lo;
            acc[G * j + 2 * q + 1] += w * hi;
          }
        }
      }
    }
  }
  // The row's warps merge in order: the row's max M first, then each warp's state; warp k's
  // output is scaled by exp(m_k - M) / L (0 for a warp that saw no key).
  LseMerge merged = st;
  float fac[kCombineWarps] = {};  // W > 1 only; unrolled with k < W guards: stays in registers
  if (W > 1) {  // W is the same in the whole block: every thread reaches the barrier
#pragma unroll
    for (int j = 0; j < vecs; ++j)  // 16-byte stores
#pragma unroll
      for (int k = 0; k < G / 4; ++k) {
        const float* v = &acc[G * j + 4 * k];
        *reinterpret_cast<uint4*>(&part[warp][G * (lane + j * kWarpSize) + 4 * k]) =
            make_uint4(float_to_bits(v[0]), float_to_bits(v[1]), float_to_bits(v[2]),
                       float_to_bits(v[3]));
      }
    if (lane == 0) {
      red_m[warp] = st.max_lse;
      red_l[warp] = st.sum;
    }
    block_sync();
    float row_max = red_m[lead];
    for (int k = 1; k < W; ++k) row_max = fmaxf(row_max, red_m[lead + k]);
    merged = LseMerge{};
    merged.raise_max(row_max);
#pragma unroll
    for (int k = 0; k < kCombineWarps; ++k)
      fac[k] = k < W ? merged.merge_below_max(LseMerge{red_m[lead + k], red_l[lead + k]}) : 0.0f;
  }
  const float inv = merged.inv_sum();
  if (!valid) return;
  const int t = row / a.num_heads, h = row % a.num_heads;
  T* out =
      static_cast<T*>(a.out) + b * a.o_stride_batch + t * a.o_stride_token + h * a.o_stride_head;
  if (W == 1) {
    // 16-byte stores: O's rows are 16-byte aligned (validate_pointers, validate_strides).
#pragma unroll
    for (int j = 0; j < vecs; ++j) {
      const float* v = &acc[G * j];
      std::uint32_t w[G / 2];
#pragma unroll
      for (int q = 0; q < G / 2; ++q) w[q] = arch::pack2<T>(v[2 * q] * inv, v[2 * q + 1] * inv);
      *reinterpret_cast<Vec*>(out + col0 + G * (lane + j * kWarpSize)) = Group::of(w);
    }
  } else {
#pragma unroll
    for (int k = 0; k < kCombineWarps; ++k) fac[k] *= inv;
    for (int col = tid_row; col < kHeadDimV / col_splits; col += threads_row) {
      float v = part[lead][col] * fac[0];
#pragma unroll
      for (int k = 1; k < kCombineWarps; ++k)
        if (k < W) v += part[lead + k][col] * fac[k];
      out[col0 + col] = from_float<T>(v);
    }
  }
  if (a.lse != nullptr && tid_row == 0 && blockIdx.z == 0)
    a.lse[b * a.lse_stride_batch + t * a.lse_stride_token + h * a.lse_stride_head] =
        lse_in_format(merged.lse(), a.lse_format);
}

// The launch decode() makes: grid (batch, row groups, column slices), W warps per row.
template <class T>
inline Status launch_combine(const DecodeArgs& a, const WorkspaceView& ws, CombineLayout l,
                             Stream stream) {
  const dim3 grid(a.batch, l.row_groups(a.rows()), l.col_splits);
  const dim3 block(kCombineThreads);
  const auto launch = [&](auto kernel) {
    return launch_kernel("combine_kernel", kernel, grid, block, 0, stream, a, ws,
                         l.warps_per_row);
  };
  if constexpr (kCombineMaxColSplits >= 4) {
    if (l.col_splits == 4)
      return l.deep ? launch(combine_kernel<T, 4, true>) : launch(combine_kernel<T, 4, false>);
  }
  if (l.col_splits == 2)
    return l.deep ? launch(combine_kernel<T, 2, true>) : launch(combine_kernel<T, 2, false>);
  return l.deep ? launch(combine_kernel<T, 1, true>) : launch(combine_kernel<T, 1, false>);
}

}  // namespace mlakit::detail

#endif  // MLAKIT_HAS_GPU_BACKEND
