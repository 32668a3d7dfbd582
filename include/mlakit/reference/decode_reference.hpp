#pragma once
// Host reference of MLA decode in absorbed form (docs/design.md, "Domain"), in double precision.
// Tests, examples and benchmarks compare the GPU kernels against it, so it follows the exact
// semantics decode() promises over the whole domain: both page-id formats, any page size,
// kv_len clamped to the request's page capacity, bottom-right causal windows (core's
// visible_keys), rows with no visible key (O = 0, LSE = -inf), kv_scale for every KV dtype.
// It is written for clarity, not speed: two passes per row (max, then sums), no online softmax.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "../core/attention_math.hpp"
#include "../core/decode_args.hpp"
#include "../core/dtype.hpp"
#include "../core/numeric.hpp"
#include "../core/plan.hpp"
#include "../core/status.hpp"

namespace mlakit {
namespace reference {

struct ReferenceOutput {
  std::vector<double> out;  // packed [batch, q_len, num_heads, 512]
  std::vector<double> lse;  // packed [batch, q_len, num_heads], natural log; -inf if no key
};

namespace detail {

inline Status invalid(const std::string& msg) {
  return Status(StatusCode::invalid_argument, "decode_reference: " + msg);
}

// kv_len[b] clamped to [0, min(page capacity, kMaxKvLen)], with the device planner's
// functions (core/plan.hpp).
inline int effective_kv_len(const DecodeArgs& a, int b) {
  return clamp_kv_len(a.kv_len[b], page_capacity(a, b));
}

// Page id holding the i-th page of request b.
inline std::int64_t page_id(const DecodeArgs& a, int b, std::int64_t i) {
  return a.page_ids == PageIds::block_table
             ? a.block_table[std::int64_t(b) * block_table_row_stride(a) + i]
             : a.kv_indices[std::int64_t(a.kv_indptr[b]) + i];
}

inline double load_q(const DecodeArgs& a, std::int64_t i) {
  const std::uint16_t bits = static_cast<const std::uint16_t*>(a.q)[i];
  return a.q_type == DType::bf16 ? decode_bf16(bits) : decode_fp16(bits);
}

// Element i of a cache tensor (kv or kv_rope), decoded and multiplied by kv_scale (which
// applies to every KV dtype).
inline double load_kv(const DecodeArgs& a, const void* base, std::int64_t i) {
  double v;
  if (is_fp8(a.kv_type)) {
    v = decode_fp8(a.kv_type, static_cast<const std::uint8_t*>(base)[i]);
  } else {
    const std::uint16_t bits = static_cast<const std::uint16_t*>(base)[i];
    v = a.kv_type == DType::bf16 ? decode_bf16(bits) : decode_fp16(bits);
  }
  return v * double(a.kv_scale);
}

// keys: [end - begin, 576], token j of request b at row j - begin. Needs begin <= end <= L.
inline void gather_keys(const DecodeArgs& a, int b, int begin, int end, std::vector<double>* keys) {
  keys->assign(std::size_t(end - begin) * kHeadDimQK, 0.0);
  // Latent values from kv; rotary values from kv_rope, or from columns 512.. of kv's rows.
  const bool split_cache = a.kv_rope != nullptr;
  for (int j = begin; j < end; ++j) {
    const std::int64_t page = page_id(a, b, j / a.page_size), slot = j % a.page_size;
    const std::int64_t row = page * a.kv_stride_page + slot * a.kv_stride_token;
    double* dst = keys->data() + std::size_t(j - begin) * kHeadDimQK;
    for (int d = 0; d < kHeadDimV; ++d) dst[d] = load_kv(a, a.kv, row + d);
    const std::int64_t rope_row =
        split_cache ? page * a.kv_rope_stride_page + slot * a.kv_rope_stride_token : row + kHeadDimV;
    for (int d = kHeadDimV; d < kHeadDimQK; ++d)
      dst[d] = load_kv(a, split_cache ? a.kv_rope : a.kv, rope_row + d - kHeadDimV);
  }
}

// q: [576], Q[b, t, h, :] decoded.
inline void load_q_row(const DecodeArgs& a, int b, int t, int h, double* q) {
  const std::int64_t base = std::int64_t(b) * a.q_stride_batch +
                            std::int64_t(t) * a.q_stride_token + std::int64_t(h) * a.q_stride_head;
  for (int d = 0; d < kHeadDimQK; ++d) q[d] = load_q(a, base + d);
}

// One row: q [576] against keys [n, 576]; writes o [512] (normalised by its own sum) and the
// natural-log LSE. n == 0 gives o = 0 and lse = -inf. The max is subtracted before exp so the
// sum cannot overflow; NaN anywhere in q or keys propagates to o and lse on purpose.
inline void attend_row(const double* q, const double* keys, int n, double scale, double* o,
                       double* lse) {
  std::fill(o, o + kHeadDimV, 0.0);
  if (n <= 0) {
    *lse = -std::numeric_limits<double>::infinity();
    return;
  }
  std::vector<double> s(std::size_t(n), 0.0);  // [n] scores
  for (int j = 0; j < n; ++j) {
    const double* k = keys + std::size_t(j) * kHeadDimQK;
    double dot = 0.0;
    for (int d = 0; d < kHeadDimQK; ++d) dot += q[d] * k[d];
    s[std::size_t(j)] = scale * dot;
  }
  double m = s[0];
  for (double v : s) m = std::max(m, v);
  double sum = 0.0;
  for (int j = 0; j < n; ++j) {
    const double p = std::exp(s[std::size_t(j)] - m);
    sum += p;
    const double* v = keys + std::size_t(j) * kHeadDimQK;  // V = first 512 of the row
    for (int d = 0; d < kHeadDimV; ++d) o[d] += p * v[d];
  }
  for (int d = 0; d < kHeadDimV; ++d) o[d] /= sum;
  *lse = m + std::log(sum);
}

}  // namespace detail

// Checks what the reference itself relies on (it reads host memory through every pointer and
// page id it is given); not the GPU domain limits, which decode() checks.
inline Status check_reference_args(const DecodeArgs& a) {
  using std::to_string;
  if (a.q == nullptr)
    return detail::invalid("q is null: must point to host Q [batch, q_len, num_heads, 576]");
  if (a.kv == nullptr) return detail::invalid("kv is null: must point to the host paged cache");
  if (a.kv_len == nullptr)
    return detail::invalid("kv_len is null: must point to host kv_len[batch]");
  if (a.q_type != DType::bf16 && a.q_type != DType::fp16)
    return detail::invalid(std::string("q_type ") + dtype_name(a.q_type) +
                           ": must be bf16 or fp16");
  if (!is_valid_dtype(a.kv_type))
    return detail::invalid("kv_type " + to_string(int(a.kv_type)) +
                           ": must be one of bf16, fp16, fp8_e4m3fn, fp8_e4m3fnuz");
  if (a.batch < 0) return detail::invalid("batch " + to_string(a.batch) + " < 0: must be >= 0");
  if (a.num_heads < 1)
    return detail::invalid("num_heads " + to_string(a.num_heads) + " < 1: must be >= 1");
  if (a.q_len < 1) return detail::invalid("q_len " + to_string(a.q_len) + " < 1: must be >= 1");
  if (a.page_size < 1)
    return detail::invalid("page_size " + to_string(a.page_size) + " < 1: must be >= 1");
  if (a.page_ids == PageIds::block_table) {
    if (a.block_table == nullptr)
      return detail::invalid("block_table is null with page_ids = block_table");
    if (a.max_pages_per_request < 0)
      return detail::invalid("max_pages_per_request " + to_string(a.max_pages_per_request) +
                             " < 0: must be >= 0");
  } else if (a.page_ids == PageIds::csr) {
    if (a.kv_indptr == nullptr) return detail::invalid("kv_indptr is null with page_ids = csr");
  } else {
    return detail::invalid("page_ids " + to_string(int(a.page_ids)) +
                           ": must be block_table (0) or csr (1)");
  }
  // Every page id the reference will read must be a valid (non-negative) index.
  for (int b = 0; b < a.batch; ++b) {
    const int len = detail::effective_kv_len(a, b);
    if (len == 0) continue;
    if (a.page_ids == PageIds::csr && a.kv_indptr[b] < 0)
      return detail::invalid("kv_indptr[" + to_string(b) + "] = " + to_string(a.kv_indptr[b]) +
                             " < 0: must be >= 0");
    const int pages = (len + a.page_size - 1) / a.page_size;
    for (int i = 0; i < pages; ++i) {
      const std::int64_t p = detail::page_id(a, b, i);
      if (p < 0)
        return detail::invalid(
            "page id " + to_string(p) + " of request " + to_string(b) + ", page " + to_string(i) +
            " (" + (a.page_ids == PageIds::csr ? "kv_indices" : "block_table") + "): must be >= 0");
    }
  }
  return Status::ok();
}

// The reference for one row (b, t, h) over the keys [key_begin, key_end) intersected with the
// row's causal window [0, visible_keys(L, q_len, t, causal)): o [512] is normalised by this
// range's own sum, lse is this range's natural-log LSE (-inf, o = 0 when the range is empty).
// Partial results over disjoint ranges merge like the kernels' split-KV partials (LseMerge).
inline Status decode_reference_range(const DecodeArgs& a, int b, int t, int h, int key_begin,
                                     int key_end, double* o, double* lse) {
  using std::to_string;
  if (o == nullptr || lse == nullptr)
    return detail::invalid("o or lse is null: both must point to host memory");
  Status s = check_reference_args(a);
  if (!s) return s;
  if (b < 0 || b >= a.batch)
    return detail::invalid("b " + to_string(b) + ": must be in [0, " + to_string(a.batch) + ")");
  if (t < 0 || t >= a.q_len)
    return detail::invalid("t " + to_string(t) + ": must be in [0, " + to_string(a.q_len) + ")");
  if (h < 0 || h >= a.num_heads)
    return detail::invalid("h " + to_string(h) + ": must be in [0, " + to_string(a.num_heads) +
                           ")");
  const int visible = visible_keys(detail::effective_kv_len(a, b), a.q_len, t, a.causal);
  const int begin = std::min(std::max(key_begin, 0), visible);
  const int end = std::max(std::min(key_end, visible), begin);
  std::vector<double> keys;  // [end - begin, 576]
  detail::gather_keys(a, b, begin, end, &keys);
  double q[kHeadDimQK];
  detail::load_q_row(a, b, t, h, q);
  detail::attend_row(q, keys.data(), end - begin, double(a.softmax_scale), o, lse);
  return Status::ok();
}

// The full reference: every (b, t, h) over its whole causal window. Keys of a request are
// decoded once and shared by its q_len * num_heads rows.
inline Status decode_reference(const DecodeArgs& a, ReferenceOutput* r) {
  if (r == nullptr) return detail::invalid("r is null: must point to a ReferenceOutput");
  Status s = check_reference_args(a);
  if (!s) return s;
  const std::size_t rows = std::size_t(a.batch) * std::size_t(a.q_len) * std::size_t(a.num_heads);
  r->out.assign(rows * kHeadDimV, 0.0);
  r->lse.assign(rows, -std::numeric_limits<double>::infinity());
  std::vector<double> keys;  // [L, 576] of the current request
  double q[kHeadDimQK];
  for (int b = 0; b < a.batch; ++b) {
    const int len = detail::effective_kv_len(a, b);
    detail::gather_keys(a, b, 0, len, &keys);
    for (int t = 0; t < a.q_len; ++t) {
      const int visible = visible_keys(len, a.q_len, t, a.causal);
      for (int h = 0; h < a.num_heads; ++h) {
        const std::size_t row = (std::size_t(b) * a.q_len + t) * a.num_heads + h;
        detail::load_q_row(a, b, t, h, q);
        detail::attend_row(q, keys.data(), visible, double(a.softmax_scale),
                           r->out.data() + row * kHeadDimV, &r->lse[row]);
      }
    }
  }
  return Status::ok();
}

// ---- comparison helpers (got may be float or double; ref is the double reference) ---------

// ||got - ref|| / ||ref|| (||got|| when ||ref|| == 0). +inf on a size mismatch or when a value
// is non-finite in one and not identical in the other (a NaN in got always fails).
template <class T>
double rel_l2_error(const std::vector<double>& ref, const std::vector<T>& got) {
  const double inf = std::numeric_limits<double>::infinity();
  if (ref.size() != got.size()) return inf;
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double r = ref[i], g = double(got[i]);
    if (!std::isfinite(r) || !std::isfinite(g)) {
      if (r == g) continue;  // the same infinity in both
      return inf;
    }
    num += (g - r) * (g - r);
    den += r * r;
  }
  return den == 0.0 ? std::sqrt(num) : std::sqrt(num) / std::sqrt(den);
}

// max_i |got_i - ref_i|; NaN (in either) counts as +inf, identical infinities as 0.
template <class T>
double max_abs_error(const std::vector<double>& ref, const std::vector<T>& got) {
  const double inf = std::numeric_limits<double>::infinity();
  if (ref.size() != got.size()) return inf;
  double worst = 0.0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double r = ref[i], g = double(got[i]);
    if (r == g) continue;
    const double e = std::fabs(g - r);
    if (std::isnan(e)) return inf;
    worst = std::max(worst, e);
  }
  return worst;
}

// max abs LSE error: -inf vs -inf (a row with no key in both) is 0, -inf vs finite is +inf,
// NaN is +inf.
template <class T>
double max_lse_error(const std::vector<double>& ref, const std::vector<T>& got) {
  const double inf = std::numeric_limits<double>::infinity();
  if (ref.size() != got.size()) return inf;
  double worst = 0.0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double r = ref[i], g = double(got[i]);
    if (std::isnan(r) || std::isnan(g)) return inf;
    if (std::isinf(r) || std::isinf(g)) {
      if (r != g) return inf;
      continue;
    }
    worst = std::max(worst, std::fabs(g - r));
  }
  return worst;
}

}  // namespace reference
}  // namespace mlakit
