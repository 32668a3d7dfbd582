#pragma once
// Merges the fp32 partial outputs of split requests (LSE-weighted) into O and the optional
// LSE. One warp per row; requests that were not split return at once. The grid depends only
// on batch and rows.
#include "../core/attention_math.hpp"
#include "../core/numeric.hpp"
#include "../platform/intrinsics.hpp"
#include "workspace.hpp"

#if !defined(MLAKIT_PLATFORM_NONE)

namespace mlakit::detail {

inline constexpr int kCombineThreads = 256;

template <class T>
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(DecodeArgs a, WorkspaceView ws) {
  constexpr int kWarps = kCombineThreads / kWarpSize;
  constexpr int kColsPerLane = kHeadDimV / kWarpSize;  // 16 (NVIDIA) or 8 (AMD)
  const int b = static_cast<int>(blockIdx.x);
  const int row = static_cast<int>(blockIdx.y) * kWarps + warp_id();
  const int rows = a.num_heads * a.q_len;
  if (row >= rows) return;
  const RequestPlan r = ws.requests[b];
  if (r.num_pieces <= 1) return;  // written directly by the decode kernel
  const int lane = lane_id();

  LseMerge merge;
  for (int i = 0; i < r.num_pieces; ++i)
    merge.add(ws.partial_lse[std::int64_t(r.partial_base + i) * ws.rows_padded + row]);

  float acc[kColsPerLane];
#pragma unroll
  for (int j = 0; j < kColsPerLane; ++j) acc[j] = 0.0f;
  for (int i = 0; i < r.num_pieces; ++i) {
    const std::int64_t slot_row = std::int64_t(r.partial_base + i) * ws.rows_padded + row;
    const float w = merge.weight(ws.partial_lse[slot_row]);
    if (w == 0.0f) continue;  // empty piece: its O is 0 and may be skipped
    const float4* src = reinterpret_cast<const float4*>(ws.partial_o + slot_row * kHeadDimV) + lane;
#pragma unroll
    for (int j = 0; j < kColsPerLane / 4; ++j) {
      const float4 v = src[j * kWarpSize];
      acc[4 * j + 0] += w * v.x;
      acc[4 * j + 1] += w * v.y;
      acc[4 * j + 2] += w * v.z;
      acc[4 * j + 3] += w * v.w;
    }
  }
  const int t = row / a.num_heads, h = row % a.num_heads;
  T* out =
      static_cast<T*>(a.out) + b * a.o_stride_batch + t * a.o_stride_token + h * a.o_stride_head;
#pragma unroll
  for (int j = 0; j < kColsPerLane / 4; ++j) {
    const int col = 4 * (lane + j * kWarpSize);
#pragma unroll
    for (int e = 0; e < 4; ++e) out[col + e] = from_float<T>(acc[4 * j + e]);
  }
  if (a.lse != nullptr && lane == 0)
    a.lse[b * a.lse_stride_batch + t * a.lse_stride_token + h * a.lse_stride_head] = merge.lse();
}

}  // namespace mlakit::detail

#endif  // !MLAKIT_PLATFORM_NONE
