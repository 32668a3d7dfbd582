#pragma once
// Merges the partial outputs of split requests (in the output type, LSE-weighted, in fp32)
// into O and the optional LSE. A block of 256 threads serves one request, 256 / (kWarpSize W)
// rows of it (32-lane warps on NVIDIA, 64-lane waves on AMD) and 512 / C of the output columns:
// W warps per row (1, 2, 4 or 8 on NVIDIA, up to 4 on AMD; W = 1 is one warp per row) and
// C column slices (1, 2 or 4; each block of a row reads all of the row's LSEs, n floats). The
// pieces of a row go to its warps in turn (piece i to warp i mod W), each warp merging its
// pieces online in one pass (no wait for the row's merged LSE), so a row cut into
// hundreds of pieces (a long context at small batch) merges in a few memory latencies over
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

// Most column slices: one group of 4 columns per lane and piece.
inline constexpr int kCombineMaxColSplits = kHeadDimV / kWarpSize / 4;

struct CombineLayout {
  int warps_per_row = 1;  // W
  int col_splits = 1;     // C

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
  return l;
}

// One kernel per column-slice count C (1, 2 or 4): the 4-column groups per lane of a slice, and so
// how many pieces the loop below loads at once, are compile-time numbers.
template <class T, int C>
__global__ void __launch_bounds__(kCombineThreads)
    combine_kernel(DecodeArgs a, WorkspaceView ws, int warps_per_row) {
  constexpr int kVecPerLane = kHeadDimV / kWarpSize / 4;  // 4-column groups per lane, 2 on AMD
  constexpr int col_splits = C;
  static_assert(C >= 1 && C <= kCombineMaxColSplits,
                "column slices of one 4-column group per lane or more");
  __shared__ float red_m[kCombineWarps], red_l[kCombineWarps];
  __shared__ float part[kCombineWarps][kHeadDimV];
  const int b = static_cast<int>(blockIdx.x);
  constexpr int vecs = kVecPerLane / col_splits;  // 4-column groups per lane in this slice
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
  // row's merged LSE. The pieces are walked kPieces at a time (8 loads of 4 columns, 8 bytes,
  // per lane): every load of a batch (LSE and O) is issued before any is used, so a warp
  // waits for memory once per batch; the batch's largest LSE rescales acc and the sum once,
  // then its pieces are added in increasing order. Pieces that saw no key (LSE -inf) add
  // nothing. Columns of group j of this lane: col0 + 4 * (lane + j * kWarpSize) + 0..3.
  constexpr int kPieces = 8 / vecs;  // vecs is 1, 2 or 4
  const int mine = n > sub ? (n - sub + W - 1) / W : 0;  // pieces of this warp
  LseMerge st;  // the same in every lane of the warp (every lane reads the same LSEs)
  float acc[4 * vecs];
#pragma unroll
  for (int j = 0; j < 4 * vecs; ++j) acc[j] = 0.0f;
  for (int p0 = 0; p0 < mine; p0 += kPieces) {
    float lse_u[kPieces];
    uint2 v_u[kPieces][vecs];  // 4 values of the output type each
#pragma unroll
    for (int u = 0; u < kPieces; ++u) {
      lse_u[u] = neg_inf();
      if (p0 + u < mine) {
        const std::int64_t slot = first + std::int64_t(sub + (p0 + u) * W) * stride;
        lse_u[u] = ws.partial_lse[slot];
        const uint2* src =
            reinterpret_cast<const uint2*>(ws.partial_o + slot * kHeadDimV + col0) + lane;
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
      for (int j = 0; j < 4 * vecs; ++j) acc[j] *= f;
    }
#pragma unroll
    for (int u = 0; u < kPieces; ++u) {
      if (lse_u[u] != neg_inf()) {
        const float w = st.add_below_max(lse_u[u]);
#pragma unroll
        for (int j = 0; j < vecs; ++j) {
          float v0, v1, v2, v3;
          arch::unpack2<T>(v_u[u][j].x, v0, v1);
          arch::unpack2<T>(v_u[u][j].y, v2, v3);
          acc[4 * j + 0] += w * v0;
          acc[4 * j + 1] += w * v1;
          acc[4 * j + 2] += w * v2;
          acc[4 * j + 3] += w * v3;
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
    for (int j = 0; j < vecs; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) part[warp][4 * (lane + j * kWarpSize) + e] = acc[4 * j + e];
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
#pragma unroll
    for (int j = 0; j < vecs; ++j) {
      const int col = col0 + 4 * (lane + j * kWarpSize);
#pragma unroll
      for (int e = 0; e < 4; ++e) out[col + e] = from_float<T>(acc[4 * j + e] * inv);
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
  if constexpr (kCombineMaxColSplits >= 4) {
    if (l.col_splits == 4)
      return launch_kernel("combine_kernel", combine_kernel<T, 4>, grid, block, 0, stream, a, ws,
                           l.warps_per_row);
  }
  if (l.col_splits == 2)
    return launch_kernel("combine_kernel", combine_kernel<T, 2>, grid, block, 0, stream, a, ws,
                         l.warps_per_row);
  return launch_kernel("combine_kernel", combine_kernel<T, 1>, grid, block, 0, stream, a, ws,
                       l.warps_per_row);
}

}  // namespace mlakit::detail

#endif  // MLAKIT_HAS_GPU_BACKEND
