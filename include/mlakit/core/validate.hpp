#pragma once
// Argument checks for decode(): every rejection names the argument, its value and the
// allowed range. Nothing here reads device memory, so kv_len values are not checked (the
// device clamps them to the request's page capacity instead).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include "decode_args.hpp"
#include "status.hpp"

namespace mlakit {

namespace detail {

inline Status bad_arg(const std::string& name, const std::string& value,
                      const std::string& allowed) {
  return Status(StatusCode::invalid_argument,
                name + " = " + value + ": not in the supported domain (" + allowed + ")");
}

inline Status check_range(const char* name, long long v, long long lo, long long hi) {
  if (v < lo || v > hi)
    return bad_arg(name, std::to_string(v),
                   "allowed " + std::to_string(lo) + ".." + std::to_string(hi));
  return Status::ok();
}

inline Status check_ptr(const char* name, const void* p) {
  if (p == nullptr) return bad_arg(name, "null", "a device pointer is required");
  return Status::ok();
}

inline Status check_align(const char* name, const void* p, std::uintptr_t bytes) {
  const std::uintptr_t v = reinterpret_cast<std::uintptr_t>(p);
  if (v % bytes != 0) {
    char hex[2 + 2 * sizeof(v) + 1];
    std::snprintf(hex, sizeof(hex), "0x%llx", static_cast<unsigned long long>(v));
    return bad_arg(name, hex, "a " + std::to_string(bytes) + "-byte aligned address");
  }
  return Status::ok();
}

// Floats as %g prints them ("0", "-0.5", "1e-08", "nan", "inf"): short and exact enough to
// recognise the value the caller passed.
inline std::string format_float(float v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", static_cast<double>(v));
  return buf;
}

// A stride of a dimension with `extent` > 1 must be >= `min` and a multiple of `multiple`.
inline Status check_stride(const char* name, std::int64_t stride, int extent, std::int64_t min,
                           std::int64_t multiple) {
  if (extent <= 1) return Status::ok();
  if (stride < min || stride % multiple != 0) {
    std::string allowed = "at least " + std::to_string(min) + " elements";
    if (multiple > 1) allowed += ", a multiple of " + std::to_string(multiple);
    return bad_arg(name, std::to_string(stride), allowed);
  }
  return Status::ok();
}

inline Status check_scale(const char* name, float v) {
  if (!std::isfinite(v) || !(v > 0.0f)) return bad_arg(name, format_float(v), "finite and > 0");
  return Status::ok();
}

}  // namespace detail

// The arguments that set the size of decode()'s grid and workspace: batch, num_heads, q_len,
// split_mode and (fixed mode) num_splits. workspace_bytes() checks only these, so a workspace
// can be sized before any buffer exists.
inline Status validate_shape(const DecodeArgs& a) {
  using namespace detail;
  Status s;
  if (!(s = check_range("batch", a.batch, 0, kMaxBatch))) return s;
  if (!(s = check_range("num_heads", a.num_heads, 1, kMaxHeads))) return s;
  if (!(s = check_range("q_len", a.q_len, 1, kMaxQLen))) return s;
  if (a.split_mode != SplitMode::automatic && a.split_mode != SplitMode::none &&
      a.split_mode != SplitMode::fixed)
    return bad_arg("split_mode", std::to_string(int(a.split_mode)), "automatic, none or fixed");
  if (a.split_mode == SplitMode::fixed &&
      !(s = check_range("num_splits", a.num_splits, 1, kMaxSplits)))
    return s;
  if (a.split_mode == SplitMode::fixed && a.batch > 0 &&
      (long long)a.batch * a.num_splits > kMaxBatch)
    return bad_arg("num_splits", std::to_string(a.num_splits),
                   "batch x num_splits <= " + std::to_string(kMaxBatch) + " (batch " +
                       std::to_string(a.batch) + ")");
  return Status::ok();
}

// Full validation of a decode() request. Ok means the shape is inside the domain and every
// pointer and stride the kernels use is present and consistent.
inline Status validate(const DecodeArgs& a) {
  using namespace detail;
  Status s;
  if (a.q_type != DType::bf16 && a.q_type != DType::fp16)
    return bad_arg("q_type", is_valid_dtype(a.q_type) ? dtype_name(a.q_type) : "invalid",
                   "bf16 or fp16");
  if (!is_valid_dtype(a.kv_type))
    return bad_arg("kv_type", std::to_string(int(a.kv_type)),
                   "bf16, fp16, fp8_e4m3fn or fp8_e4m3fnuz");
  if (!(s = validate_shape(a))) return s;
  if (!(s = check_range("page_size", a.page_size, 1, kMaxPageSize))) return s;
  if (!(s = check_scale("softmax_scale", a.softmax_scale))) return s;
  // kv_scale multiplies every cache element, 16-bit caches included (see DecodeArgs).
  if (!(s = check_scale("kv_scale", a.kv_scale))) return s;
  if (a.batch == 0) return Status::ok();  // nothing to compute; pointers may be null

  if (!(s = check_ptr("q", a.q)) || !(s = check_ptr("kv", a.kv)) ||
      !(s = check_ptr("out", a.out)) || !(s = check_ptr("kv_len", a.kv_len)))
    return s;
  if (!(s = check_align("q", a.q, 16)) || !(s = check_align("kv", a.kv, 16)) ||
      !(s = check_align("out", a.out, 16)))
    return s;
  if (a.lse != nullptr && !(s = check_align("lse", a.lse, 4))) return s;

  // Rows are read and written in 16-byte pieces: strides keep every row 16-byte aligned.
  const std::int64_t kv_vec = 16 / std::int64_t(dtype_bytes(a.kv_type));
  if (!(s = check_stride("q_stride_head", a.q_stride_head, a.num_heads, kHeadDimQK, 8))) return s;
  if (!(s = check_stride("q_stride_token", a.q_stride_token, a.q_len, kHeadDimQK, 8))) return s;
  if (!(s = check_stride("q_stride_batch", a.q_stride_batch, a.batch, kHeadDimQK, 8))) return s;
  if (!(s = check_stride("kv_stride_token", a.kv_stride_token, a.page_size, kHeadDimQK, kv_vec)))
    return s;
  if (!(s = check_stride("kv_stride_page", a.kv_stride_page, 2, kHeadDimQK, kv_vec))) return s;
  // Outputs must not overlap: each dimension's stride covers the dimensions inside it.
  const std::int64_t o_head_span = kHeadDimV;
  if (!(s = check_stride("o_stride_head", a.o_stride_head, a.num_heads, o_head_span, 8))) return s;
  const std::int64_t o_tok_span = (a.num_heads - 1) * a.o_stride_head + kHeadDimV;
  if (!(s = check_stride("o_stride_token", a.o_stride_token, a.q_len, o_tok_span, 8))) return s;
  const std::int64_t o_b_span = (a.q_len - 1) * a.o_stride_token + o_tok_span;
  if (!(s = check_stride("o_stride_batch", a.o_stride_batch, a.batch, o_b_span, 8))) return s;
  if (a.lse != nullptr) {
    if (!(s = check_stride("lse_stride_head", a.lse_stride_head, a.num_heads, 1, 1))) return s;
    const std::int64_t l_tok = (a.num_heads - 1) * a.lse_stride_head + 1;
    if (!(s = check_stride("lse_stride_token", a.lse_stride_token, a.q_len, l_tok, 1))) return s;
    const std::int64_t l_b = (a.q_len - 1) * a.lse_stride_token + l_tok;
    if (!(s = check_stride("lse_stride_batch", a.lse_stride_batch, a.batch, l_b, 1))) return s;
  }

  if (a.page_ids == PageIds::block_table) {
    if (!(s = check_ptr("block_table", a.block_table))) return s;
    if (!(s = check_range("max_pages_per_request", a.max_pages_per_request, 1, 1 << 30))) return s;
    // 0 selects rows of exactly max_pages_per_request entries (block_table_row_stride()).
    if (a.batch > 1 && a.block_table_stride != 0 && a.block_table_stride < a.max_pages_per_request)
      return bad_arg("block_table_stride", std::to_string(a.block_table_stride),
                     ">= max_pages_per_request (" + std::to_string(a.max_pages_per_request) +
                         "), or 0 for packed rows");
  } else if (a.page_ids == PageIds::csr) {
    // kv_indices may be null: then no request has a page (page_capacity() is 0) and the
    // kernels never read it.
    if (!(s = check_ptr("kv_indptr", a.kv_indptr))) return s;
  } else {
    return bad_arg("page_ids", std::to_string(int(a.page_ids)), "block_table or csr");
  }
  return Status::ok();
}

}  // namespace mlakit
