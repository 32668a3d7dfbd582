#pragma once
// Arguments of merge_states() and their validation: N partial attention results of the same
// rows, each computed over its own part of the keys (a shard of one request's KV on another
// GPU, a shared-prefix pass and a per-request pass), merged by their LSEs into one.
// Every rejection names the argument, its value and the allowed range. Nothing here reads
// device memory and nothing overflows: each stride is bounded before it is multiplied.
#include <cstdint>
#include <initializer_list>
#include <string>

#include "attention_math.hpp"
#include "config.hpp"
#include "status.hpp"
#include "validate.hpp"

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

namespace detail {

// One dimension of a tensor: its stride (elements) and extent.
struct MergeDim {
  const char* name;
  std::int64_t stride;
  std::int64_t extent;
};

// An input tensor (read only, may overlap itself): each stride of a dimension of extent > 1
// is 0 (broadcast) or more, a multiple of `multiple`, and at most what keeps the span
// (row + sum (extent - 1) x stride elements) within `limit` elements. Dimensions are bounded
// one by one, each before it is multiplied.
template <int N>
inline Status check_input_strides(const MergeDim (&dims)[N], std::int64_t row,
                                  std::int64_t limit, std::int64_t multiple) {
  std::int64_t span = row;  // <= limit
  for (const MergeDim& d : dims) {
    if (d.extent <= 1) continue;  // never stepped over: neither read nor checked
    const std::int64_t max = (limit - span) / (d.extent - 1);
    if (d.stride < 0 || d.stride > max || d.stride % multiple != 0) {
      std::string allowed = "0..";
      allowed += std::to_string(max);
      if (multiple > 1) allowed += ", a multiple of " + std::to_string(multiple);
      return bad_arg(d.name, std::to_string(d.stride), allowed);
    }
    span += (d.extent - 1) * d.stride;
  }
  return Status::ok();
}

// An output tensor of two outer dimensions in either order: rows never overlap. The dimension
// of the smaller stride is checked first (ties: the order given); each stride must cover the
// span of what lies inside it (>= that many elements), be a multiple of `multiple`, and keep
// the whole span within `limit` elements.
inline Status check_output_strides(MergeDim inner, MergeDim outer, std::int64_t row,
                                   std::int64_t limit, std::int64_t multiple) {
  if (outer.extent > 1 && (inner.extent <= 1 || outer.stride < inner.stride)) {
    const MergeDim t = inner;
    inner = outer;
    outer = t;
  }
  std::int64_t span = row;
  for (const MergeDim& d : {inner, outer}) {
    if (d.extent <= 1) continue;
    const std::int64_t max = (limit - span) / (d.extent - 1);
    if (d.stride < span || d.stride > max || d.stride % multiple != 0) {
      std::string allowed = "at least " + std::to_string(span) + " elements";
      if (multiple > 1) allowed += ", a multiple of " + std::to_string(multiple);
      allowed += ", at most " + std::to_string(max);
      return bad_arg(d.name, std::to_string(d.stride), allowed);
    }
    span += (d.extent - 1) * d.stride;
  }
  return Status::ok();
}

inline Status check_merge_pointer(const char* name, const void* p, std::uintptr_t align,
                                  bool required) {
  if (p == nullptr) return required ? check_ptr(name, p) : Status::ok();
  return check_align(name, p, align);
}

}  // namespace detail

// Ok when merge_states(a) would run (on a build with a GPU backend). Rules: the enums valid;
// num_parts 1..4096, num_tokens 0..2^31-1, num_heads 1..65535, head_dim 8..16384 and a multiple
// of 8; pointers part_o, part_lse and out required when num_tokens > 0 (out_lse optional), O
// pointers 16-byte and LSE pointers 4-byte aligned at any num_tokens; O strides multiples of
// 16 bytes' worth of elements (8 for 16-bit types, 4 for fp32); outputs whose rows do not
// overlap; every tensor within kMaxMergeSpanBytes. The stride of a dimension of extent 0 or
// 1 is neither read nor checked. The first argument out of the domain is named.
inline Status validate_merge(const MergeArgs& a) {
  using namespace detail;
  Status s;
  if (!is_valid_merge_dtype(a.part_type))
    return bad_arg("part_type", std::to_string(int(a.part_type)), "bf16, fp16 or fp32");
  if (!is_valid_merge_dtype(a.out_type))
    return bad_arg("out_type", std::to_string(int(a.out_type)), "bf16, fp16 or fp32");
  if (!(s = check_range("num_parts", a.num_parts, 1, kMaxMergeParts)) ||
      !(s = check_range("num_tokens", a.num_tokens, 0, kMaxMergeTokens)) ||
      !(s = check_range("num_heads", a.num_heads, 1, kMaxMergeHeads)))
    return s;
  if (a.head_dim < kMergeHeadDimMultiple || a.head_dim > kMaxMergeHeadDim ||
      a.head_dim % kMergeHeadDimMultiple != 0)
    return bad_arg("head_dim", std::to_string(a.head_dim),
                   std::to_string(kMergeHeadDimMultiple) + ".." +
                       std::to_string(kMaxMergeHeadDim) + ", a multiple of " +
                       std::to_string(kMergeHeadDimMultiple));

  const bool required = a.num_tokens > 0;
  if (!(s = check_merge_pointer("part_o", a.part_o, 16, required)) ||
      !(s = check_merge_pointer("part_lse", a.part_lse, 4, required)) ||
      !(s = check_merge_pointer("out", a.out, 16, required)) ||
      !(s = check_merge_pointer("out_lse", a.out_lse, 4, false)))
    return s;

  const std::int64_t part_bytes = merge_dtype_bytes(a.part_type);
  const std::int64_t out_bytes = merge_dtype_bytes(a.out_type);
  const MergeDim part_o[3] = {{"part_o_stride_head", a.part_o_stride_head, a.num_heads},
                              {"part_o_stride_token", a.part_o_stride_token, a.num_tokens},
                              {"part_o_stride_part", a.part_o_stride_part, a.num_parts}};
  if (!(s = check_input_strides(part_o, a.head_dim, kMaxMergeSpanBytes / part_bytes,
                                16 / part_bytes)))
    return s;
  const MergeDim part_lse[3] = {{"part_lse_stride_head", a.part_lse_stride_head, a.num_heads},
                                {"part_lse_stride_token", a.part_lse_stride_token, a.num_tokens},
                                {"part_lse_stride_part", a.part_lse_stride_part, a.num_parts}};
  if (!(s = check_input_strides(part_lse, 1, kMaxMergeSpanBytes / 4, 1))) return s;
  if (!(s = check_output_strides({"out_stride_head", a.out_stride_head, a.num_heads},
                                 {"out_stride_token", a.out_stride_token, a.num_tokens},
                                 a.head_dim, kMaxMergeSpanBytes / out_bytes, 16 / out_bytes)))
    return s;
  if (a.out_lse != nullptr &&
      !(s = check_output_strides({"out_lse_stride_head", a.out_lse_stride_head, a.num_heads},
                                 {"out_lse_stride_token", a.out_lse_stride_token, a.num_tokens},
                                 1, kMaxMergeSpanBytes / 4, 1)))
    return s;
  return Status::ok();
}

}  // namespace mlakit
