#pragma once
// Argument checks for decode(): every rejection names the argument, its value and the
// allowed range. Nothing here reads device memory, so kv_len values are not checked (the
// device clamps them to the request's page capacity instead). Nothing here overflows: every
// stride is bounded before it is multiplied, so a value whose span does not fit in
// kMaxSpanBytes is rejected by name, whatever the other values are.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>

#include "attention_math.hpp"
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

// One tensor's strides, checked from the innermost dimension out. `span()` is what the tensor
// spans, in elements (the offset of its last element plus one), over the dimensions checked so
// far. The stride of a dimension of extent > 1 must be at least `min` elements, a multiple of
// `multiple`, and at most what keeps the whole span within kMaxSpanBytes; a dimension of
// extent 0 or 1 is never stepped over, so its stride is neither read nor checked. Each stride
// is bounded before it is multiplied: nothing overflows, whatever the values.
class SpanCheck {
 public:
  SpanCheck(std::int64_t row_elems, std::int64_t elem_bytes)
      : span_(row_elems), limit_(kMaxSpanBytes / elem_bytes) {}

  std::int64_t span() const { return span_; }

  Status dim(const char* name, std::int64_t stride, std::int64_t extent, std::int64_t min,
             std::int64_t multiple) {
    if (extent <= 1) return Status::ok();
    const std::int64_t max = (limit_ - span_) / (extent - 1);  // span_ <= limit_ always
    if (stride < min || stride > max || stride % multiple != 0) {
      std::string allowed = "at least " + std::to_string(min) + " elements";
      if (multiple > 1) allowed += ", a multiple of " + std::to_string(multiple);
      allowed += ", at most " + std::to_string(max);
      return bad_arg(name, std::to_string(stride), allowed);
    }
    span_ += (extent - 1) * stride;
    return Status::ok();
  }

 private:
  std::int64_t span_;
  std::int64_t limit_;
};

// A pointer the kernels read or write: null is rejected where `required`, else accepted (it is
// then not read); any other value must be `align`-byte aligned.
inline Status check_pointer(const char* name, const void* p, std::uintptr_t align, bool required) {
  if (p == nullptr) return required ? check_ptr(name, p) : Status::ok();
  return check_align(name, p, align);
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

namespace detail {

// Every pointer the kernels use. Batch 0 reads nothing, so there every pointer may be null;
// a pointer that is given is checked for alignment at every batch. Page-id pointers: see
// validate_page_ids().
inline Status validate_pointers(const DecodeArgs& a) {
  const bool required = a.batch > 0;
  // KV is reached through page ids only: CSR ids without a kv_indices array give no request a
  // page (page_capacity() is 0), so there an empty cache (null kv) is never read either.
  const bool kv_read = required && !(a.page_ids == PageIds::csr && a.kv_indices == nullptr);
  Status s;
  // Q, KV and O rows move in 16-byte pieces; LSE and kv_len are read and written as 4 bytes.
  if (!(s = check_pointer("q", a.q, 16, required)) ||
      !(s = check_pointer("kv", a.kv, 16, kv_read)) ||
      !(s = check_pointer("kv_rope", a.kv_rope, 16, false)) ||
      !(s = check_pointer("out", a.out, 16, required)) ||
      !(s = check_pointer("kv_len", a.kv_len, 4, required)) ||
      !(s = check_pointer("lse", a.lse, 4, false)))
    return s;
  return Status::ok();
}

// Strides of Q, KV, O and (when lse is given) LSE. Rows are read and written in 16-byte pieces,
// so the strides keep every row 16-byte aligned. Outputs must not overlap: each stride of O
// covers the dimensions inside it, and so does each of LSE, in the order of its strides. Every
// tensor spans at most kMaxSpanBytes; KV for every page id up to kMaxPageId.
inline Status validate_strides(const DecodeArgs& a) {
  Status s;
  const std::int64_t q_bytes = std::int64_t(dtype_bytes(a.q_type));
  SpanCheck q(kHeadDimQK, q_bytes);
  if (!(s = q.dim("q_stride_head", a.q_stride_head, a.num_heads, kHeadDimQK, 8)) ||
      !(s = q.dim("q_stride_token", a.q_stride_token, a.q_len, kHeadDimQK, 8)) ||
      !(s = q.dim("q_stride_batch", a.q_stride_batch, a.batch, kHeadDimQK, 8)))
    return s;

  // KV rows: all 576 values, or with a separate rotary cache the 512 latent values in kv and
  // the 64 rotary values in kv_rope (each its own tensor, strides checked alike).
  const std::int64_t kv_bytes = std::int64_t(dtype_bytes(a.kv_type));
  const bool split_cache = a.kv_rope != nullptr;
  const std::int64_t kv_row = split_cache ? kHeadDimV : kHeadDimQK;
  SpanCheck kv(kv_row, kv_bytes);
  if (!(s = kv.dim("kv_stride_token", a.kv_stride_token, a.page_size, kv_row, 16 / kv_bytes)) ||
      !(s = kv.dim("kv_stride_page", a.kv_stride_page, kMaxPageId + 1, kv_row, 16 / kv_bytes)))
    return s;
  if (split_cache) {
    constexpr std::int64_t kRope = kHeadDimQK - kHeadDimV;
    SpanCheck rope(kRope, kv_bytes);
    if (!(s = rope.dim("kv_rope_stride_token", a.kv_rope_stride_token, a.page_size, kRope,
                       16 / kv_bytes)) ||
        !(s = rope.dim("kv_rope_stride_page", a.kv_rope_stride_page, kMaxPageId + 1, kRope,
                       16 / kv_bytes)))
      return s;
  }

  SpanCheck o(kHeadDimV, q_bytes);
  if (!(s = o.dim("o_stride_head", a.o_stride_head, a.num_heads, o.span(), 8)) ||
      !(s = o.dim("o_stride_token", a.o_stride_token, a.q_len, o.span(), 8)) ||
      !(s = o.dim("o_stride_batch", a.o_stride_batch, a.batch, o.span(), 8)))
    return s;

  if (a.lse == nullptr) return Status::ok();  // not written: its strides are unused
  // LSE rows are single floats, so its dimensions may come in any order of strides (FlashMLA
  // keeps LSE as [batch, heads, q_len]): checked from the smallest stride up (ties in the order
  // head, token, batch), each covering the span of those before it.
  struct LseDim {
    const char* name;
    std::int64_t stride;
    std::int64_t extent;
  };
  LseDim d[3] = {{"lse_stride_head", a.lse_stride_head, a.num_heads},
                 {"lse_stride_token", a.lse_stride_token, a.q_len},
                 {"lse_stride_batch", a.lse_stride_batch, a.batch}};
  for (int i = 1; i < 3; ++i)  // stable insertion sort by stride
    for (int j = i; j > 0 && d[j].stride < d[j - 1].stride; --j) {
      const LseDim t = d[j];
      d[j] = d[j - 1];
      d[j - 1] = t;
    }
  SpanCheck l(1, sizeof(float));
  for (const LseDim& x : d)
    if (!(s = l.dim(x.name, x.stride, x.extent, l.span(), 1))) return s;
  return Status::ok();
}

// The page-id fields of the mode page_ids selects; those of the other mode are not read.
inline Status validate_page_ids(const DecodeArgs& a) {
  Status s;
  const bool required = a.batch > 0;
  if (a.page_ids == PageIds::csr) {
    // kv_indices may be null: then no request has a page (page_capacity() is 0) and the
    // kernels never read it.
    if (!(s = check_pointer("kv_indptr", a.kv_indptr, 4, required)) ||
        !(s = check_pointer("kv_indices", a.kv_indices, 4, false)))
      return s;
    return Status::ok();
  }
  if (!(s = check_pointer("block_table", a.block_table, 4, required))) return s;
  if (!(s = check_range("max_pages_per_request", a.max_pages_per_request, 1, kMaxPagesPerRequest)))
    return s;
  // 0 selects rows of exactly max_pages_per_request entries (block_table_row_stride()); the
  // table then spans at most 65535 x 2^30 entries. Any other row stride is read from request 1
  // on: at least a row, and the table within kMaxSpanBytes.
  if (a.batch > 1 && a.block_table_stride != 0) {
    const std::int64_t max =
        (kMaxSpanBytes / std::int64_t(sizeof(std::int32_t)) - a.max_pages_per_request) /
        (a.batch - 1);
    if (a.block_table_stride < a.max_pages_per_request || a.block_table_stride > max)
      return bad_arg("block_table_stride", std::to_string(a.block_table_stride),
                     ">= max_pages_per_request (" + std::to_string(a.max_pages_per_request) +
                         ") and <= " + std::to_string(max) + ", or 0 for packed rows");
  }
  return Status::ok();
}

}  // namespace detail

// Full validation of a decode() request. Ok means the shape is inside the domain and every
// pointer and stride the kernels use is present and consistent. The rules are the same at
// every batch, except that batch 0 (nothing to read) does not require pointers; the README's
// "Supported domain" states them all.
inline Status validate(const DecodeArgs& a) {
  using namespace detail;
  Status s;
  if (a.q_type != DType::bf16 && a.q_type != DType::fp16)
    return bad_arg("q_type",
                   is_valid_dtype(a.q_type) ? dtype_name(a.q_type) : std::to_string(int(a.q_type)),
                   "bf16 or fp16");
  if (!is_valid_dtype(a.kv_type))
    return bad_arg("kv_type", std::to_string(int(a.kv_type)),
                   "bf16, fp16, fp8_e4m3fn or fp8_e4m3fnuz");
  if (!(s = validate_shape(a))) return s;
  if (!(s = check_range("page_size", a.page_size, 1, kMaxPageSize))) return s;
  if (!(s = check_scale("softmax_scale", a.softmax_scale))) return s;
  // kv_scale multiplies every cache element, 16-bit caches included (see DecodeArgs).
  if (!(s = check_scale("kv_scale", a.kv_scale))) return s;
  // Each finite, their product with log2(e) too: the kernels take it as one fp32 factor, and an
  // infinite one would give NaN scores. (A product below fp32's range gives 0: every visible
  // key then weighs the same, as the scores' true values, far below 1, would make them.)
  if (!std::isfinite(scale_log2_of(a)))
    return bad_arg("softmax_scale x kv_scale",
                   format_float(a.softmax_scale) + " x " + format_float(a.kv_scale),
                   "a product below " + format_float(std::numeric_limits<float>::max() / kLog2e));
  if (a.page_ids != PageIds::block_table && a.page_ids != PageIds::csr)
    return bad_arg("page_ids", std::to_string(int(a.page_ids)), "block_table or csr");
  if (a.lse_format != LseFormat::natural && a.lse_format != LseFormat::natural_empty_is_inf &&
      a.lse_format != LseFormat::base2)
    return bad_arg("lse_format", std::to_string(int(a.lse_format)),
                   "natural, natural_empty_is_inf or base2");
  if (a.plan_step != PlanStep::plan_and_decode && a.plan_step != PlanStep::plan_only &&
      a.plan_step != PlanStep::decode_only)
    return bad_arg("plan_step", std::to_string(int(a.plan_step)),
                   "plan_and_decode, plan_only or decode_only");
  if (a.compute != Compute::standard && a.compute != Compute::fp8_matrix)
    return bad_arg("compute", std::to_string(int(a.compute)), "standard or fp8_matrix");
  // The e4m3 tensor cores take the cache's bytes as they are: e4m3fn only.
  if (a.compute == Compute::fp8_matrix && a.kv_type != DType::fp8_e4m3fn)
    return bad_arg("compute", "fp8_matrix",
                   std::string("an fp8_e4m3fn cache (kv_type is ") + dtype_name(a.kv_type) +
                       "; Compute::standard serves every cache type)");
  if (!(s = validate_pointers(a)) || !(s = validate_strides(a)) || !(s = validate_page_ids(a)))
    return s;
  return Status::ok();
}

}  // namespace mlakit
