#pragma once
// Validation of merge_states() arguments: every rejection names the argument, its value and the
// allowed range. Nothing here reads device memory and nothing overflows: each stride is bounded
// before it is multiplied.
#include <cstdint>
#include <initializer_list>
#include <string>

#include "merge_args.hpp"
#include "status.hpp"
#include "validate.hpp"

namespace mlakit {

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
inline Status check_input_strides(const MergeDim (&dims)[N], std::int64_t row, std::int64_t limit,
                                  std::int64_t multiple) {
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
                   std::to_string(kMergeHeadDimMultiple) + ".." + std::to_string(kMaxMergeHeadDim) +
                       ", a multiple of " + std::to_string(kMergeHeadDimMultiple));

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
                                 {"out_stride_token", a.out_stride_token, a.num_tokens}, a.head_dim,
                                 kMaxMergeSpanBytes / out_bytes, 16 / out_bytes)))
    return s;
  if (a.out_lse != nullptr &&
      !(s = check_output_strides({"out_lse_stride_head", a.out_lse_stride_head, a.num_heads},
                                 {"out_lse_stride_token", a.out_lse_stride_token, a.num_tokens}, 1,
                                 kMaxMergeSpanBytes / 4, 1)))
    return s;
  return Status::ok();
}

}  // namespace mlakit
