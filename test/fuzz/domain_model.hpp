#pragma once
// The README's "Supported domain" table written out a second time, independently of
// core/validate.hpp, for the edge sweep (test/test_domain.cpp) and the fuzz target
// (test/fuzz/fuzz_validate.cpp): which fields of a call are outside the domain, computed in
// exact 128-bit arithmetic straight from the table's formulas. check_host_api() runs every host
// entry point on one call and compares them with this model and with each other.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "mlakit/api/decode.hpp"
#include "mlakit/api/dispatch.hpp"
#include "mlakit/core/decode_args.hpp"
#include "mlakit/core/validate.hpp"

namespace mlakit_test {

__extension__ typedef __int128 i128;  // products of two 64-bit values, exact

// The fields outside the domain: every rule of the table that the call breaks adds the field
// the rule is about (a rule that joins fields names the one the table lists it under).
struct Violations {
  std::vector<std::string> fields;
  void add(const std::string& f) { fields.push_back(f); }
  bool empty() const { return fields.empty(); }
  bool has(const std::string& f) const {
    for (const std::string& x : fields)
      if (x == f) return true;
    return false;
  }
  std::string list() const {
    std::string s;
    for (const std::string& x : fields) s += (s.empty() ? "" : ", ") + x;
    return s.empty() ? "none" : s;
  }
};

// --- the table, row by row ----------------------------------------------------------------

// Fields workspace_bytes() reads: batch 0..65535, num_heads 1..128, q_len 1..32, split_mode
// automatic/none/fixed, num_splits 1..64 in fixed mode with batch x num_splits <= 65535.
inline void shape_rules(const mlakit::DecodeArgs& a, Violations& v) {
  if (a.batch < 0 || a.batch > 65535) v.add("batch");
  if (a.num_heads < 1 || a.num_heads > 128) v.add("num_heads");
  if (a.q_len < 1 || a.q_len > 32) v.add("q_len");
  const int mode = static_cast<int>(a.split_mode);
  if (mode > 2) v.add("split_mode");
  if (mode == 2) {
    if (a.num_splits < 1 || a.num_splits > 64)
      v.add("num_splits");
    else if (a.batch >= 0 && i128(a.batch) * a.num_splits > 65535)
      v.add("num_splits");
  }
}

// DeviceInfo: sm_count 1..4096; device, max_smem_optin and arch >= 0.
inline void device_rules(const mlakit::DeviceInfo& d, Violations& v) {
  if (d.device < 0) v.add("DeviceInfo.device");
  if (d.sm_count < 1 || d.sm_count > 4096) v.add("DeviceInfo.sm_count");
  if (d.max_smem_optin < 0) v.add("DeviceInfo.max_smem_optin");
  if (d.arch < 0) v.add("DeviceInfo.arch");
}

inline bool finite_positive(float x) { return std::isfinite(x) && x > 0.0f; }

// A pointer: required when batch > 0 (if `required`), and aligned when given.
inline void pointer_rule(const char* name, const void* p, unsigned align, bool required,
                         Violations& v) {
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  if ((p == nullptr && required) || addr % align != 0) v.add(name);
}

// One tensor: strides[i] of dimension i (innermost first) with extent ext[i] must be >= min[i]
// and a multiple of `mult` when ext[i] > 1; the span sum_i max(ext[i] - 1, 0) x strides[i] +
// row must stay within 2^62 bytes; the first dimension at which the running span passes it is
// the one named.
struct Dim {
  const char* name;
  std::int64_t stride;
  i128 extent;
  i128 min;
};
inline void tensor_rules(const std::vector<Dim>& dims, i128 row, i128 elem_bytes, i128 mult,
                         Violations& v) {
  const i128 limit = (i128(1) << 62) / elem_bytes;
  i128 span = row;
  bool over = false;
  for (const Dim& d : dims) {
    if (d.extent <= 1) continue;
    if (d.stride < d.min || d.stride % mult != 0) v.add(d.name);
    span += (d.extent - 1) * d.stride;
    if (!over && span > limit) {
      v.add(d.name);
      over = true;
    }
  }
}

inline i128 at_least_0(i128 x) { return x < 0 ? 0 : x; }

// Every row of the table for one call to decode() (validate()).
inline Violations domain_violations(const mlakit::DecodeArgs& a) {
  using mlakit::DType;
  Violations v;
  const int qt = static_cast<int>(a.q_type), kt = static_cast<int>(a.kv_type);
  if (qt != 0 && qt != 1) v.add("q_type");  // bf16, fp16
  if (kt > 3) v.add("kv_type");             // bf16, fp16, fp8_e4m3fn, fp8_e4m3fnuz
  shape_rules(a, v);
  if (a.page_size < 1 || a.page_size > 256) v.add("page_size");
  if (!finite_positive(a.softmax_scale)) v.add("softmax_scale");
  if (!finite_positive(a.kv_scale)) v.add("kv_scale");
  // The score factor softmax_scale x kv_scale x log2(e), formed in fp32, finite.
  if (finite_positive(a.softmax_scale) && finite_positive(a.kv_scale) &&
      !std::isfinite(a.softmax_scale * a.kv_scale * 1.4426950408889634f))
    v.add("softmax_scale x kv_scale");
  const int ids = static_cast<int>(a.page_ids);
  if (ids > 1) v.add("page_ids");
  if (static_cast<int>(a.lse_format) > 2) v.add("lse_format");  // natural, +inf empty, base 2
  if (static_cast<int>(a.plan_step) > 2) v.add("plan_step");    // both, plan only, decode only

  const bool req = a.batch > 0;
  pointer_rule("q", a.q, 16, req, v);
  // kv may be null where CSR page ids have no kv_indices: no request has a page to read.
  pointer_rule("kv", a.kv, 16,
               req && !(a.page_ids == mlakit::PageIds::csr && a.kv_indices == nullptr), v);
  pointer_rule("out", a.out, 16, req, v);
  pointer_rule("kv_len", a.kv_len, 4, req, v);
  pointer_rule("lse", a.lse, 4, false, v);
  pointer_rule("kv_rope", a.kv_rope, 16, false, v);

  const i128 H = a.num_heads, T = a.q_len, B = a.batch, P = a.page_size;
  // Q: every stride >= 576, a multiple of 8; rows of 576 two-byte elements.
  tensor_rules({{"q_stride_head", a.q_stride_head, H, 576},
                {"q_stride_token", a.q_stride_token, T, 576},
                {"q_stride_batch", a.q_stride_batch, B, 576}},
               576, 2, 8, v);
  // KV: >= 576 (>= 512 with a separate rotary cache kv_rope, whose strides are >= 64),
  // multiples of 16 bytes; every page id up to 2^31 - 1.
  const i128 kv_bytes = (kt == 2 || kt == 3) ? 1 : 2;
  const i128 kv_row = a.kv_rope != nullptr ? 512 : 576;
  tensor_rules({{"kv_stride_token", a.kv_stride_token, P, kv_row},
                {"kv_stride_page", a.kv_stride_page, i128(1) << 31, kv_row}},
               kv_row, kv_bytes, 16 / kv_bytes, v);
  if (a.kv_rope != nullptr)
    tensor_rules({{"kv_rope_stride_token", a.kv_rope_stride_token, P, 64},
                  {"kv_rope_stride_page", a.kv_rope_stride_page, i128(1) << 31, 64}},
                 64, kv_bytes, 16 / kv_bytes, v);
  // O: no overlap. o_stride_token >= (heads - 1) x o_stride_head + 512, o_stride_batch >=
  // (q_len - 1) x o_stride_token + (heads - 1) x o_stride_head + 512.
  const i128 o_tok = at_least_0(H - 1) * a.o_stride_head + 512;
  tensor_rules(
      {{"o_stride_head", a.o_stride_head, H, 512},
       {"o_stride_token", a.o_stride_token, T, o_tok},
       {"o_stride_batch", a.o_stride_batch, B, at_least_0(T - 1) * a.o_stride_token + o_tok}},
      512, 2, 8, v);
  if (a.lse != nullptr) {
    // LSE: rows of one float, its dimensions in any order of strides (smallest first, ties in
    // the order head, token, batch), each at least the span of those before it.
    std::vector<Dim> l = {{"lse_stride_head", a.lse_stride_head, H, 0},
                          {"lse_stride_token", a.lse_stride_token, T, 0},
                          {"lse_stride_batch", a.lse_stride_batch, B, 0}};
    // A stable insertion sort by stride: std::stable_sort instantiates get_temporary_buffer,
    // deprecated in C++17, which clang 19 with libstdc++ 12 reports (an error under -Werror).
    for (std::size_t i = 1; i < l.size(); ++i)
      for (std::size_t j = i; j > 0 && l[j].stride < l[j - 1].stride; --j)
        std::swap(l[j], l[j - 1]);
    i128 span = 1;
    for (Dim& d : l) {
      d.min = span;
      span += at_least_0(d.extent - 1) * d.stride;
    }
    tensor_rules(l, 1, 4, 1, v);
  }

  if (ids == 0) {  // block table
    pointer_rule("block_table", a.block_table, 4, req, v);
    const i128 m = a.max_pages_per_request;
    if (m < 1 || m > (i128(1) << 30)) v.add("max_pages_per_request");
    const i128 s = a.block_table_stride;
    if (B > 1 && s != 0 && (s < m || (B - 1) * s + m > (i128(1) << 60)))
      v.add("block_table_stride");
  } else if (ids == 1) {  // CSR
    pointer_rule("kv_indptr", a.kv_indptr, 4, req, v);
    pointer_rule("kv_indices", a.kv_indices, 4, false, v);
  }
  return v;
}

// What workspace_bytes(a, dev) checks: the shape rows and the DeviceInfo row.
inline Violations workspace_violations(const mlakit::DecodeArgs& a, const mlakit::DeviceInfo& d) {
  Violations v;
  shape_rules(a, v);
  device_rules(d, v);
  return v;
}

// --- edge values ------------------------------------------------------------------------

// Integer edges: the table's limits and their neighbours, the int and int64 extremes, and
// values around the 2^62-byte span bound (2^59..2^63 elements).
inline const std::vector<std::int64_t>& int_edges() {
  constexpr std::int64_t kI64Max = 0x7fffffffffffffff, kI64Min = -kI64Max - 1;
  constexpr std::int64_t kIntMax = 2147483647, kIntMin = -kIntMax - 1;
  auto p2 = [](int k) { return std::int64_t(1) << k; };
  static const std::vector<std::int64_t> v = {
      0,          1,           -1,          2,           3,
      4,          7,           8,           15,          16,
      31,         32,          33,          63,          64,
      65,         80,          90,          127,         128,
      129,        255,         256,         257,         511,
      512,        513,         520,         575,         576,
      577,        584,         592,         942,         4095,
      4096,       4097,        8192,        36864,       65535,
      65536,      p2(30) - 1,  p2(30),      p2(30) + 1,  kIntMax - 1,
      kIntMax,    kIntMin,     kIntMin + 1, p2(31),      p2(31) + 16,
      p2(32),     p2(40),      p2(59),      p2(59) + 8,  p2(60) - 8,
      p2(60),     p2(60) + 8,  p2(61) - 8,  p2(61),      p2(61) + 8,
      p2(62) - 8, p2(62),      p2(62) + 8,  kI64Max - 7, kI64Max,
      kI64Min,    kI64Min + 8, -576,        -512,        5208208757389214273LL};
  return v;
}

// --- field values as a rejection prints them -----------------------------------------------

inline std::string hex_or_null(const void* p) {
  if (p == nullptr) return "null";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%llx",
                static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(p)));
  return buf;
}
inline std::string float_g(float x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", static_cast<double>(x));
  return buf;
}

// The value of field `name` of the call as its rejection must print it; "?" for a name that
// is no field.
inline std::string printed_value(const mlakit::DecodeArgs& a, const mlakit::DeviceInfo& d,
                                 const std::string& name) {
  using std::to_string;
  const int qt = static_cast<int>(a.q_type);
  if (name == "q_type")
    return qt <= 3 ? mlakit::dtype_name(a.q_type) : to_string(qt);  // names for valid types
  if (name == "kv_type") return to_string(static_cast<int>(a.kv_type));
  if (name == "page_ids") return to_string(static_cast<int>(a.page_ids));
  if (name == "split_mode") return to_string(static_cast<int>(a.split_mode));
  if (name == "lse_format") return to_string(static_cast<int>(a.lse_format));
  if (name == "plan_step") return to_string(static_cast<int>(a.plan_step));
  if (name == "batch") return to_string(a.batch);
  if (name == "num_heads") return to_string(a.num_heads);
  if (name == "q_len") return to_string(a.q_len);
  if (name == "page_size") return to_string(a.page_size);
  if (name == "num_splits") return to_string(a.num_splits);
  if (name == "max_pages_per_request") return to_string(a.max_pages_per_request);
  if (name == "softmax_scale") return float_g(a.softmax_scale);
  if (name == "kv_scale") return float_g(a.kv_scale);
  if (name == "softmax_scale x kv_scale")
    return float_g(a.softmax_scale) + " x " + float_g(a.kv_scale);
  if (name == "q") return hex_or_null(a.q);
  if (name == "kv") return hex_or_null(a.kv);
  if (name == "kv_rope") return hex_or_null(a.kv_rope);
  if (name == "out") return hex_or_null(a.out);
  if (name == "lse") return hex_or_null(a.lse);
  if (name == "kv_len") return hex_or_null(a.kv_len);
  if (name == "block_table") return hex_or_null(a.block_table);
  if (name == "kv_indptr") return hex_or_null(a.kv_indptr);
  if (name == "kv_indices") return hex_or_null(a.kv_indices);
  const std::pair<const char*, std::int64_t> strides[] = {
      {"q_stride_batch", a.q_stride_batch},
      {"q_stride_token", a.q_stride_token},
      {"q_stride_head", a.q_stride_head},
      {"kv_stride_page", a.kv_stride_page},
      {"kv_stride_token", a.kv_stride_token},
      {"kv_rope_stride_page", a.kv_rope_stride_page},
      {"kv_rope_stride_token", a.kv_rope_stride_token},
      {"o_stride_batch", a.o_stride_batch},
      {"o_stride_token", a.o_stride_token},
      {"o_stride_head", a.o_stride_head},
      {"lse_stride_batch", a.lse_stride_batch},
      {"lse_stride_token", a.lse_stride_token},
      {"lse_stride_head", a.lse_stride_head},
      {"block_table_stride", a.block_table_stride},
      {"DeviceInfo.device", d.device},
      {"DeviceInfo.sm_count", d.sm_count},
      {"DeviceInfo.max_smem_optin", d.max_smem_optin},
      {"DeviceInfo.arch", d.arch}};
  for (const auto& [n, value] : strides)
    if (name == n) return to_string(value);
  return "?";
}

// A rejection: "NAME = VALUE: not in the supported domain (ALLOWED)", NAME one of the fields in
// `v` and VALUE its value. Returns what is wrong, or "".
inline std::string check_rejection(const mlakit::Status& s, const mlakit::DecodeArgs& a,
                                   const mlakit::DeviceInfo& d, const Violations& v) {
  const std::string& m = s.message();
  if (s.code() != mlakit::StatusCode::invalid_argument)
    return "code " + std::string(mlakit::status_code_name(s.code())) + ": " + m;
  const std::size_t eq = m.find(" = ");
  if (eq == std::string::npos) return "no \"NAME = VALUE\" in \"" + m + "\"";
  const std::string name = m.substr(0, eq);
  const std::string expect =
      name + " = " + printed_value(a, d, name) + ": not in the supported domain (";
  if (m.rfind(expect, 0) != 0 || m.back() != ')')
    return "\"" + m + "\" does not start with \"" + expect + "\"";
  if (!v.has(name))
    return "names " + name + ", outside the domain: " + v.list() + " (\"" + m + "\")";
  return "";
}

// Runs validate(), validate_shape(), supported(), workspace_bytes() (both overloads) and
// decode() on one call and checks them against the model and each other: validate() accepts
// exactly the calls the table allows; every rejection names a field outside the domain and
// its value; workspace_bytes() accepts exactly the shapes and devices the table allows, and
// whatever decode() accepts; decode() reports what validate() reports, then a null workspace
// with a size, then the missing backend. Returns the first disagreement, or "".
inline std::string check_host_api(const mlakit::DecodeArgs& a, const mlakit::DeviceInfo& dev,
                                  void* workspace, std::size_t workspace_size) {
  using mlakit::Status;
  using mlakit::StatusCode;
  const Violations dv = domain_violations(a);
  const Status vs = mlakit::validate(a);
  if (vs.is_ok() != dv.empty())
    return "validate() " +
           (vs.is_ok() ? std::string("accepts") : "rejects (" + vs.message() + ")") +
           "; the table: outside the domain: " + dv.list();
  if (!vs.is_ok()) {
    const std::string e = check_rejection(vs, a, dev, dv);
    if (!e.empty()) return "validate(): " + e;
  }

  Violations sv;
  shape_rules(a, sv);
  const Status ss = mlakit::validate_shape(a);
  if (ss.is_ok() != sv.empty()) return "validate_shape() disagrees with the table: " + sv.list();
  if (!ss.is_ok()) {
    const std::string e = check_rejection(ss, a, dev, sv);
    if (!e.empty()) return "validate_shape(): " + e;
  }

  const Status sup = mlakit::supported(a);
  if (!vs.is_ok() ? sup.message() != vs.message() : sup.code() != StatusCode::not_supported)
    return "supported(): " + sup.message();

  const Violations wv = workspace_violations(a, dev);
  std::size_t bytes = 12345;
  const Status ws = mlakit::workspace_bytes(a, dev, &bytes);
  if (ws.is_ok() != wv.empty())
    return "workspace_bytes() " +
           (ws.is_ok() ? std::string("accepts") : "rejects (" + ws.message() + ")") +
           "; the table: outside its domain: " + wv.list();
  if (!ws.is_ok()) {
    const std::string e = check_rejection(ws, a, dev, wv);
    if (!e.empty()) return "workspace_bytes(): " + e;
    if (bytes != 0) return "workspace_bytes() rejects but writes " + std::to_string(bytes);
  } else if ((a.batch > 0) != (bytes > 0)) {
    return "workspace_bytes() = " + std::to_string(bytes) + " at batch " + std::to_string(a.batch);
  }
  if (mlakit::workspace_bytes(a, dev) != bytes) return "the two workspace_bytes() overloads differ";
  // What decode() accepts, workspace_bytes() sizes (for any valid device).
  if (vs.is_ok() && !ss.is_ok()) return "validate() accepts a shape validate_shape() rejects";

  const Status dec = mlakit::decode(a, workspace, workspace_size, nullptr);
  if (!vs.is_ok()) {
    if (dec.code() != vs.code() || dec.message() != vs.message())
      return "decode(): \"" + dec.message() + "\", validate(): \"" + vs.message() + "\"";
  } else if (workspace == nullptr && workspace_size > 0) {
    const std::string expect = "workspace = null: not in the supported domain (";
    if (dec.code() != StatusCode::invalid_argument || dec.message().rfind(expect, 0) != 0)
      return "decode() with a null workspace of " + std::to_string(workspace_size) + " bytes: \"" +
             dec.message() + "\"";
  } else if (dec.code() != StatusCode::not_supported) {
    return "decode() in a build without a backend: \"" + dec.message() + "\"";
  }
  return "";
}

}  // namespace mlakit_test
