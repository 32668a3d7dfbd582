#pragma once
// merge_states(): N partial attention results of the same rows merged by their LSEs. One
// warp per row (token, head); a lane holds 8 output columns at a time, so a warp covers
// 8 x kWarpSize columns per pass over the parts and a wider head takes several passes. Each
// pass walks the parts in increasing order with the split-KV combine's LSE merge (LseMerge,
// core/attention_math.hpp): the row's largest LSE first (a butterfly max, exact, so every lane
// holds the same value), then each part's weight exp(lse_p - max) in order, its 8 values
// loaded only when the weight is not 0. Every lane computes the same sequence of sums: the
// result does not depend on the grid or on timing, and is bitwise the same on every run.
// kMergeUnroll parts are loaded before any is added, so a lane waits for memory once per
// group of parts.
#include <cstdint>

#include "../arch/convert.hpp"
#include "../core/attention_math.hpp"
#include "../core/merge_args.hpp"
#include "../core/numeric.hpp"
#include "../core/status.hpp"
#include "../platform/intrinsics.hpp"
#include "../platform/runtime.hpp"

#if defined(MLAKIT_HAS_GPU_BACKEND)

namespace mlakit::detail {

inline constexpr int kMergeThreads = 256;
inline constexpr int kMergeWarps = kMergeThreads / kWarpSize;  // rows per block
inline constexpr int kMergeVec = 8;                            // columns per lane and pass
inline constexpr int kMergeCols = kMergeVec * kWarpSize;       // columns per warp and pass
inline constexpr int kMergeUnroll = 4;                         // parts loaded together
// Blocks of the grid at most; a larger problem has each warp take several rows in turn.
inline constexpr std::int64_t kMergeMaxBlocks = std::int64_t(1) << 20;

// The element type of a MergeDType.
template <MergeDType D>
struct MergeElem;
template <>
struct MergeElem<MergeDType::bf16> {
  using type = bf16_t;
};
template <>
struct MergeElem<MergeDType::fp16> {
  using type = fp16_t;
};
template <>
struct MergeElem<MergeDType::fp32> {
  using type = float;
};

// 8 values at p (16-byte aligned: validate_merge() checks pointers and strides) as floats.
template <class T>
__device__ __forceinline__ void load8(const T* p, float (&v)[kMergeVec]) {
  if constexpr (sizeof(T) == 4) {
    const float4 a = reinterpret_cast<const float4*>(p)[0];
    const float4 b = reinterpret_cast<const float4*>(p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
    v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    arch::unpack2<T>(u.x, v[0], v[1]);
    arch::unpack2<T>(u.y, v[2], v[3]);
    arch::unpack2<T>(u.z, v[4], v[5]);
    arch::unpack2<T>(u.w, v[6], v[7]);
  }
}

template <class T>
__device__ __forceinline__ void store8(T* p, const float (&v)[kMergeVec]) {
  if constexpr (sizeof(T) == 4) {
    reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
    uint4 u;
    u.x = arch::pack2<T>(v[0], v[1]);
    u.y = arch::pack2<T>(v[2], v[3]);
    u.z = arch::pack2<T>(v[4], v[5]);
    u.w = arch::pack2<T>(v[6], v[7]);
    *reinterpret_cast<uint4*>(p) = u;
  }
}

// grid.x blocks of kMergeWarps rows; row = token * num_heads + head.
template <class TP, class TO>
__global__ void __launch_bounds__(kMergeThreads) merge_states_kernel(MergeArgs a) {
  const int lane = lane_id();
  const std::int64_t rows = std::int64_t(a.num_tokens) * a.num_heads;
  const std::int64_t step = std::int64_t(gridDim.x) * kMergeWarps;
  const int n = a.num_parts;
  // Every lane of a warp takes the same rows, so the shuffles below see the whole warp.
  for (std::int64_t row = std::int64_t(blockIdx.x) * kMergeWarps + warp_id(); row < rows;
       row += step) {
    const std::int64_t t = row / a.num_heads, h = row - t * a.num_heads;
    const float* lse = a.part_lse + t * a.part_lse_stride_token + h * a.part_lse_stride_head;
    const TP* po =
        static_cast<const TP*>(a.part_o) + t * a.part_o_stride_token + h * a.part_o_stride_head;
    // The row's largest LSE (empty parts count as -inf; a NaN is ignored here and poisons the
    // sum below).
    float m = neg_inf();
    for (int p = lane; p < n; p += kWarpSize)
      m = fmaxf(m, merge_part_lse(lse[p * a.part_lse_stride_part]));
#pragma unroll
    for (int off = kWarpSize / 2; off > 0; off >>= 1) m = fmaxf(m, shfl_xor(m, off));

    LseMerge st;
    for (int c0 = 0; c0 < a.head_dim; c0 += kMergeCols) {
      const int col = c0 + lane * kMergeVec;
      const bool active = col < a.head_dim;
      st = LseMerge{};
      st.raise_max(m);
      float acc[kMergeVec] = {};
      for (int p0 = 0; p0 < n; p0 += kMergeUnroll) {
        float w[kMergeUnroll];
        float v[kMergeUnroll][kMergeVec] = {};
#pragma unroll
        for (int u = 0; u < kMergeUnroll; ++u) {
          w[u] = 0.0f;
          if (p0 + u < n) {
            const std::int64_t p = p0 + u;
            w[u] = st.add_below_max(merge_part_lse(lse[p * a.part_lse_stride_part]));
            if (active && w[u] != 0.0f) load8(po + p * a.part_o_stride_part + col, v[u]);
          }
        }
#pragma unroll
        for (int u = 0; u < kMergeUnroll; ++u) {
          if (w[u] != 0.0f) {
#pragma unroll
            for (int j = 0; j < kMergeVec; ++j) acc[j] += w[u] * v[u][j];
          }
        }
      }
      if (active) {
        const float inv = st.inv_sum();
#pragma unroll
        for (int j = 0; j < kMergeVec; ++j) acc[j] *= inv;
        store8(static_cast<TO*>(a.out) + t * a.out_stride_token + h * a.out_stride_head + col, acc);
      }
    }
    if (a.out_lse != nullptr && lane == 0)
      a.out_lse[t * a.out_lse_stride_token + h * a.out_lse_stride_head] = st.lse();
  }
}

template <MergeDType P, MergeDType O>
inline Status launch_merge_typed(const MergeArgs& a, Stream stream) {
  using TP = typename MergeElem<P>::type;
  using TO = typename MergeElem<O>::type;
  const std::int64_t rows = std::int64_t(a.num_tokens) * a.num_heads;
  std::int64_t blocks = (rows + kMergeWarps - 1) / kMergeWarps;
  blocks = blocks < kMergeMaxBlocks ? blocks : kMergeMaxBlocks;
  return launch_kernel("merge_states_kernel", merge_states_kernel<TP, TO>,
                       dim3(static_cast<unsigned>(blocks)), dim3(kMergeThreads), 0, stream, a);
}

template <MergeDType P>
inline Status launch_merge_out(const MergeArgs& a, Stream stream) {
  switch (a.out_type) {
    case MergeDType::bf16:
      return launch_merge_typed<P, MergeDType::bf16>(a, stream);
    case MergeDType::fp16:
      return launch_merge_typed<P, MergeDType::fp16>(a, stream);
    case MergeDType::fp32:
      return launch_merge_typed<P, MergeDType::fp32>(a, stream);
  }
  return Status(StatusCode::invalid_argument, "out_type: not bf16, fp16 or fp32");
}

// One launch for validated arguments (validate_merge()) with num_tokens > 0.
inline Status launch_merge(const MergeArgs& a, Stream stream) {
  switch (a.part_type) {
    case MergeDType::bf16:
      return launch_merge_out<MergeDType::bf16>(a, stream);
    case MergeDType::fp16:
      return launch_merge_out<MergeDType::fp16>(a, stream);
    case MergeDType::fp32:
      return launch_merge_out<MergeDType::fp32>(a, stream);
  }
  return Status(StatusCode::invalid_argument, "part_type: not bf16, fp16 or fp32");
}

}  // namespace mlakit::detail

#endif  // MLAKIT_HAS_GPU_BACKEND
