#pragma once
// Arguments of merge_states(): N partial attention results of the same rows, each computed
// over its own part of the keys (a shard of one request's KV on another GPU, a shared-prefix
// pass and a per-request pass), merged by their LSEs into one. Plain data (the Python
// extension passes it between its two translation units); validate_merge.hpp checks it.
#include <cstdint>

#include "attention_math.hpp"
#include "config.hpp"

namespace mlakit {

// Element types of the partial and merged outputs. fp32 is allowed here (partials kept in
// fp32 by an engine) though decode() writes 16-bit outputs only.
enum class MergeDType : std::uint8_t {
  bf16 = 0,
  fp16 = 1,
  fp32 = 2,
};

MLAKIT_HOST_DEVICE constexpr bool is_valid_merge_dtype(MergeDType t) {
  return static_cast<unsigned>(t) <= static_cast<unsigned>(MergeDType::fp32);
}
MLAKIT_HOST_DEVICE constexpr std::int64_t merge_dtype_bytes(MergeDType t) {
  return t == MergeDType::fp32 ? 4 : 2;
}
constexpr const char* merge_dtype_name(MergeDType t) {
  switch (t) {
    case MergeDType::bf16:
      return "bf16";
    case MergeDType::fp16:
      return "fp16";
    case MergeDType::fp32:
      return "fp32";
  }
  return "invalid";
}

// A part's LSE as the merge reads it: +inf, FlashMLA's mark of a row that saw no key, is an
// empty part like -inf (what decode() writes for such a row).
MLAKIT_HOST_DEVICE constexpr float merge_part_lse(float lse) {
  return lse == __builtin_huge_valf() ? neg_inf() : lse;
}

// The domain of merge_states().
inline constexpr int kMaxMergeParts = 4096;
inline constexpr int kMaxMergeTokens = 2147483647;
inline constexpr int kMaxMergeHeads = 65535;
inline constexpr int kMaxMergeHeadDim = 16384;  // a multiple of kMergeHeadDimMultiple
inline constexpr int kMergeHeadDimMultiple = 8;
// Most bytes a tensor may span (the offset of its last element plus one, times the element
// size), as for decode(): every 64-bit offset the kernel computes fits with room to spare.
inline constexpr std::int64_t kMaxMergeSpanBytes = std::int64_t(1) << 62;

// One merge_states() call. Rows are (token, head) pairs; each has N parts. Strides are in
// elements of the tensor's own type; the innermost dimension of O is contiguous. Part p of
// row (t, h) is part_o[p * part_o_stride_part + t * part_o_stride_token + h * part_o_stride_head
// + d] (its output, normalised by its own softmax sum) with natural-log LSE
// part_lse[p * part_lse_stride_part + t * part_lse_stride_token + h * part_lse_stride_head];
// an LSE of -inf (or +inf, FlashMLA's mark of a row without keys) is an empty part, whose O
// is never read. The merged row is sum_p exp(lse_p - lse) o_p with lse = log sum_p exp(lse_p),
// summed over the parts in increasing order (bitwise repeatable); a row whose parts are all
// empty gets O = 0 and LSE = -inf.
struct MergeArgs {
  MergeDType part_type = MergeDType::bf16;  // the parts' O
  MergeDType out_type = MergeDType::bf16;   // the merged O

  int num_parts = 0;   // N, 1..kMaxMergeParts
  int num_tokens = 0;  // T, 0..kMaxMergeTokens (0: nothing to do)
  int num_heads = 0;   // H, 1..kMaxMergeHeads
  int head_dim = 0;    // D, 8..kMaxMergeHeadDim, a multiple of 8 (MLA: 512)

  // [N, T, H, D]; inputs may overlap each other (strides 0 broadcast), never the outputs.
  const void* part_o = nullptr;
  std::int64_t part_o_stride_part = 0;
  std::int64_t part_o_stride_token = 0;
  std::int64_t part_o_stride_head = 0;
  // [N, T, H] fp32, natural log.
  const float* part_lse = nullptr;
  std::int64_t part_lse_stride_part = 0;
  std::int64_t part_lse_stride_token = 0;
  std::int64_t part_lse_stride_head = 0;

  // [T, H, D]: the token and head dimensions in either order of strides (rows never overlap).
  void* out = nullptr;
  std::int64_t out_stride_token = 0;
  std::int64_t out_stride_head = 0;
  // Optional [T, H] fp32: the merged natural-log LSE, -inf for a row without keys; either
  // order of strides ([H, T] as vLLM keeps it included).
  float* out_lse = nullptr;
  std::int64_t out_lse_stride_token = 0;
  std::int64_t out_lse_stride_head = 0;
};

// Strides of densely packed tensors of the shapes in `a`: parts [N, T, H, D] and [N, T, H],
// outputs [T, H, D] and [T, H]. Reads num_tokens, num_heads and head_dim only; products
// saturate at the int64 range for shapes far outside the domain (validate_merge() rejects
// those by name).
inline void set_packed_strides(MergeArgs& a) {
  constexpr std::int64_t kMax = 0x7fffffffffffffff;
  auto mul = [](std::int64_t x, std::int64_t y) {  // x, y >= 0 after the clamp below
    x = x < 0 ? 0 : x;
    y = y < 0 ? 0 : y;
    return (y != 0 && x > kMax / y) ? kMax : x * y;
  };
  const std::int64_t rows = mul(a.num_tokens, a.num_heads);
  a.part_o_stride_head = a.head_dim;
  a.part_o_stride_token = mul(a.num_heads, a.head_dim);
  a.part_o_stride_part = mul(rows, a.head_dim);
  a.part_lse_stride_head = 1;
  a.part_lse_stride_token = a.num_heads;
  a.part_lse_stride_part = rows;
  a.out_stride_head = a.head_dim;
  a.out_stride_token = mul(a.num_heads, a.head_dim);
  a.out_lse_stride_head = 1;
  a.out_lse_stride_token = a.num_heads;
}

}  // namespace mlakit
