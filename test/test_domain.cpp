// The README's "Supported domain" table against the code, on a build without a GPU backend:
//   a deterministic sweep of every field's edges (the table's limits and their neighbours, the
//   int and int64 extremes, the exact bound of every stride) over several valid calls, each
//   checked by check_host_api() (test/fuzz/domain_model.hpp, the table written independently
//   of core/validate.hpp): validate() accepts exactly what the table allows, every rejection
//   names a field outside the domain and its value, workspace_bytes() and decode() agree;
//   one test per rule that used to be broken (an overflow, a wrong acceptance, a check skipped
//   at batch 0, a misaligned pointer, an unchecked DeviceInfo, a misnamed argument);
//   and the table itself names every field and limit the code enforces.
// validate() never dereferences a pointer: aligned host buffers stand in for device memory.
#include <catch2/catch.hpp>
#include <cstdint>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz/domain_model.hpp"
#include "mlakit/api/decode.hpp"
#include "mlakit/api/dispatch.hpp"
#include "mlakit/core/decode_args.hpp"
#include "mlakit/core/plan.hpp"
#include "mlakit/core/validate.hpp"

using namespace mlakit;
using mlakit_test::check_host_api;
using mlakit_test::domain_violations;

namespace {

constexpr std::int64_t kI64Max = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kI64Min = std::numeric_limits<std::int64_t>::min();
constexpr int kIntMax = std::numeric_limits<int>::max();
constexpr int kIntMin = std::numeric_limits<int>::min();

alignas(64) unsigned char g_mem[8192];

const DeviceInfo kH100{0, 132, 232448, 90};

// One call of the host API: the arguments, the device and the workspace.
struct Call {
  DecodeArgs a;
  DeviceInfo dev = kH100;
  void* ws = g_mem;
  std::size_t ws_size = 1 << 20;
};

Call valid_call(PageIds ids, bool lse, int batch, int heads, int q_len, int page, DType kv) {
  Call c;
  DecodeArgs& a = c.a;
  a.q_type = DType::bf16;
  a.kv_type = kv;
  a.batch = batch;
  a.num_heads = heads;
  a.q_len = q_len;
  a.page_size = page;
  a.softmax_scale = 0.0721f;
  a.kv_scale = is_fp8(kv) ? 0.02f : 1.0f;
  a.page_ids = ids;
  a.max_pages_per_request = 40;
  set_packed_strides(a);
  a.q = g_mem;
  a.kv = g_mem + 1024;
  a.out = g_mem + 2048;
  a.lse = lse ? reinterpret_cast<float*>(g_mem + 3072) : nullptr;
  a.kv_len = reinterpret_cast<const std::int32_t*>(g_mem + 3584);
  a.block_table = reinterpret_cast<const std::int32_t*>(g_mem + 3712);
  a.kv_indptr = reinterpret_cast<const std::int32_t*>(g_mem + 3840);
  a.kv_indices = reinterpret_cast<const std::int32_t*>(g_mem + 3968);
  return c;
}

std::vector<Call> base_calls() {
  struct Shape {
    int batch, heads, q_len, page;
  };
  const Shape shapes[] = {
      {3, 16, 4, 64}, {0, 16, 4, 64}, {1, 1, 1, 1}, {65535, 128, 32, 256}, {2, 12, 3, 7}};
  std::vector<Call> v;
  for (PageIds ids : {PageIds::block_table, PageIds::csr})
    for (bool lse : {true, false})
      for (const Shape& s : shapes)
        for (DType kv : {DType::bf16, DType::fp8_e4m3fn})
          v.push_back(valid_call(ids, lse, s.batch, s.heads, s.q_len, s.page, kv));
  // A separate rotary cache: kv rows of 512 values, kv_rope rows of 64, both packed.
  for (const Shape& s : shapes)
    for (DType kv : {DType::bf16, DType::fp8_e4m3fn}) {
      Call c = valid_call(PageIds::block_table, true, s.batch, s.heads, s.q_len, s.page, kv);
      c.a.kv_rope = g_mem + 4096;
      c.a.kv_stride_token = kHeadDimV;
      c.a.kv_stride_page = std::int64_t(s.page) * kHeadDimV;
      v.push_back(c);
    }
  return v;
}

enum class Kind { i32, i64, f32, ptr, u8, flag, size };

// One field of a call: its name (as the model names it), kind, and how to set it.
struct Field {
  const char* name;
  Kind kind;
  std::function<void(Call&, std::int64_t)> set;  // ints, enums, flags, sizes
  std::function<void(Call&, float)> set_f = nullptr;
  std::function<void(Call&, const void*)> set_p = nullptr;
  std::int64_t mult = 1;  // strides: the multiple the table asks for (16-byte rows)
};

std::int64_t kv_vec(const Call& c) { return is_fp8(c.a.kv_type) ? 16 : 8; }

std::vector<Field> fields() {
  using C = Call&;
  using V = std::int64_t;
  auto i32 = [](V v) { return static_cast<int>(static_cast<std::uint32_t>(v)); };
  auto u8 = [](V v) { return static_cast<std::uint8_t>(v); };
  std::vector<Field> f = {
      {"q_type", Kind::u8, [=](C c, V v) { c.a.q_type = DType(u8(v)); }},
      {"kv_type", Kind::u8, [=](C c, V v) { c.a.kv_type = DType(u8(v)); }},
      {"page_ids", Kind::u8, [=](C c, V v) { c.a.page_ids = PageIds(u8(v)); }},
      {"split_mode", Kind::u8, [=](C c, V v) { c.a.split_mode = SplitMode(u8(v)); }},
      {"lse_format", Kind::u8, [=](C c, V v) { c.a.lse_format = LseFormat(u8(v)); }},
      {"plan_step", Kind::u8, [=](C c, V v) { c.a.plan_step = PlanStep(u8(v)); }},
      {"causal", Kind::flag, [](C c, V v) { c.a.causal = v != 0; }},
      {"deterministic", Kind::flag, [](C c, V v) { c.a.deterministic = v != 0; }},
      {"batch", Kind::i32, [=](C c, V v) { c.a.batch = i32(v); }},
      {"num_heads", Kind::i32, [=](C c, V v) { c.a.num_heads = i32(v); }},
      {"q_len", Kind::i32, [=](C c, V v) { c.a.q_len = i32(v); }},
      {"page_size", Kind::i32, [=](C c, V v) { c.a.page_size = i32(v); }},
      {"max_pages_per_request", Kind::i32, [=](C c, V v) { c.a.max_pages_per_request = i32(v); }},
      {"num_splits", Kind::i32, [=](C c, V v) { c.a.num_splits = i32(v); }},
      {"DeviceInfo.device", Kind::i32, [=](C c, V v) { c.dev.device = i32(v); }},
      {"DeviceInfo.sm_count", Kind::i32, [=](C c, V v) { c.dev.sm_count = i32(v); }},
      {"DeviceInfo.max_smem_optin", Kind::i32, [=](C c, V v) { c.dev.max_smem_optin = i32(v); }},
      {"DeviceInfo.arch", Kind::i32, [=](C c, V v) { c.dev.arch = i32(v); }},
      {"q_stride_head", Kind::i64, [](C c, V v) { c.a.q_stride_head = v; }, {}, {}, 8},
      {"q_stride_token", Kind::i64, [](C c, V v) { c.a.q_stride_token = v; }, {}, {}, 8},
      {"q_stride_batch", Kind::i64, [](C c, V v) { c.a.q_stride_batch = v; }, {}, {}, 8},
      {"kv_stride_token", Kind::i64, [](C c, V v) { c.a.kv_stride_token = v; }, {}, {}, 0},
      {"kv_stride_page", Kind::i64, [](C c, V v) { c.a.kv_stride_page = v; }, {}, {}, 0},
      {"kv_rope_stride_token", Kind::i64, [](C c, V v) { c.a.kv_rope_stride_token = v; }, {}, {},
       0},
      {"kv_rope_stride_page", Kind::i64, [](C c, V v) { c.a.kv_rope_stride_page = v; }, {}, {},
       0},
      {"o_stride_head", Kind::i64, [](C c, V v) { c.a.o_stride_head = v; }, {}, {}, 8},
      {"o_stride_token", Kind::i64, [](C c, V v) { c.a.o_stride_token = v; }, {}, {}, 8},
      {"o_stride_batch", Kind::i64, [](C c, V v) { c.a.o_stride_batch = v; }, {}, {}, 8},
      {"lse_stride_head", Kind::i64, [](C c, V v) { c.a.lse_stride_head = v; }},
      {"lse_stride_token", Kind::i64, [](C c, V v) { c.a.lse_stride_token = v; }},
      {"lse_stride_batch", Kind::i64, [](C c, V v) { c.a.lse_stride_batch = v; }},
      {"block_table_stride", Kind::i64, [](C c, V v) { c.a.block_table_stride = v; }},
      {"workspace_size", Kind::size, [](C c, V v) { c.ws_size = static_cast<std::size_t>(v); }},
      {"softmax_scale", Kind::f32, nullptr, [](C c, float x) { c.a.softmax_scale = x; }},
      {"kv_scale", Kind::f32, nullptr, [](C c, float x) { c.a.kv_scale = x; }},
  };
  auto ptr = [&](const char* name, std::function<void(Call&, const void*)> set) {
    f.push_back({name, Kind::ptr, nullptr, nullptr, std::move(set)});
  };
  ptr("q", [](C c, const void* p) { c.a.q = p; });
  ptr("kv", [](C c, const void* p) { c.a.kv = p; });
  ptr("kv_rope", [](C c, const void* p) { c.a.kv_rope = p; });
  ptr("out", [](C c, const void* p) { c.a.out = const_cast<void*>(p); });
  ptr("lse", [](C c, const void* p) { c.a.lse = static_cast<float*>(const_cast<void*>(p)); });
  ptr("kv_len", [](C c, const void* p) { c.a.kv_len = static_cast<const std::int32_t*>(p); });
  ptr("block_table",
      [](C c, const void* p) { c.a.block_table = static_cast<const std::int32_t*>(p); });
  ptr("kv_indptr", [](C c, const void* p) { c.a.kv_indptr = static_cast<const std::int32_t*>(p); });
  ptr("kv_indices",
      [](C c, const void* p) { c.a.kv_indices = static_cast<const std::int32_t*>(p); });
  ptr("workspace", [](C c, const void* p) { c.ws = const_cast<void*>(p); });
  return f;
}

// The least and the largest value of stride field `f` that the table allows in call `c`
// (others unchanged), found from the model alone by bisection over multiples of the stride's
// multiple, starting from an allowed value. {1, 0} when the start is not allowed.
std::pair<std::int64_t, std::int64_t> table_bounds(const Call& c, const Field& f,
                                                   std::int64_t start, std::int64_t mult) {
  auto allowed = [&](std::int64_t v) {
    Call x = c;
    f.set(x, v);
    return !domain_violations(x.a).has(f.name);
  };
  if (!allowed(start)) return {1, 0};
  auto search = [&](std::int64_t limit_steps, int dir) {  // last allowed start + dir k mult
    std::int64_t lo = 0, hi = limit_steps;
    while (lo < hi) {
      const std::int64_t mid = lo + (hi - lo + 1) / 2;
      if (allowed(start + dir * mid * mult))
        lo = mid;
      else
        hi = mid - 1;
    }
    return start + dir * lo * mult;
  };
  // Up to int64's end; down to -2^62 (every stride's least value is positive or absent).
  const std::int64_t up = (kI64Max - start) / mult, down = start / mult + (kI64Max / 2) / mult;
  return {search(down, -1), search(up, 1)};
}

// The edge values of field `f` in call `c`.
std::vector<std::int64_t> int_values(const Call& c, const Field& f) {
  std::vector<std::int64_t> v = mlakit_test::int_edges();
  if (f.kind == Kind::u8) v = {0, 1, 2, 3, 4, 5, 7, 127, 128, 255};
  if (f.kind == Kind::flag) v = {0, 1};
  if (f.kind == Kind::size) v = {0, 1, 4096, 1 << 20, kI64Max, -1};
  if (f.kind == Kind::i64) {
    const std::int64_t mult = f.mult == 0 ? kv_vec(c) : f.mult;
    // Start from the call's own value (allowed), or a full row for the block-table stride.
    const std::string n = f.name;
    const DecodeArgs& a = c.a;
    const std::int64_t start = n == "q_stride_head"      ? a.q_stride_head
                               : n == "q_stride_token"   ? a.q_stride_token
                               : n == "q_stride_batch"   ? a.q_stride_batch
                               : n == "kv_stride_token"  ? a.kv_stride_token
                               : n == "kv_stride_page"   ? a.kv_stride_page
                               : n == "kv_rope_stride_token" ? a.kv_rope_stride_token
                               : n == "kv_rope_stride_page"  ? a.kv_rope_stride_page
                               : n == "o_stride_head"    ? a.o_stride_head
                               : n == "o_stride_token"   ? a.o_stride_token
                               : n == "o_stride_batch"   ? a.o_stride_batch
                               : n == "lse_stride_head"  ? a.lse_stride_head
                               : n == "lse_stride_token" ? a.lse_stride_token
                               : n == "lse_stride_batch" ? a.lse_stride_batch
                                                         : a.max_pages_per_request;
    const auto [lo, hi] = table_bounds(c, f, start, mult);
    for (std::int64_t b : {lo, hi})
      for (std::int64_t d : {-mult, std::int64_t(-1), std::int64_t(0), std::int64_t(1), mult})
        if ((d >= 0 || b >= kI64Min - d) && (d <= 0 || b <= kI64Max - d)) v.push_back(b + d);
  }
  return v;
}

std::string describe(const Call& c) {
  std::ostringstream s;
  s << "batch " << c.a.batch << ", heads " << c.a.num_heads << ", q_len " << c.a.q_len << ", page "
    << c.a.page_size << ", kv " << dtype_name(c.a.kv_type) << ", "
    << (c.a.page_ids == PageIds::csr ? "csr" : "block table") << (c.a.lse ? ", lse" : "");
  return s.str();
}

// Runs check_host_api on the call; on a disagreement records it (first few) and counts it.
struct Sweep {
  long long calls = 0, accepted = 0, failures = 0;
  std::vector<std::string> first;
  void run(const Call& c, const std::string& what) {
    ++calls;
    const std::string e = check_host_api(c.a, c.dev, c.ws, c.ws_size);
    accepted += validate(c.a).is_ok();
    if (!e.empty() && failures++ < 8) first.push_back(describe(c) + "; " + what + ": " + e);
  }
};

std::string readme_domain_section() {
  std::ifstream in(MLAKIT_README_PATH);
  std::stringstream s;
  s << in.rdbuf();
  const std::string all = s.str();
  const std::size_t a = all.find("## Supported domain");
  const std::size_t b = all.find("\n## ", a + 1);
  return a == std::string::npos ? "" : all.substr(a, b == std::string::npos ? b : b - a);
}

void require_rejected(const Status& s, const std::string& prefix, const std::string& allowed = "") {
  INFO("\"" << s.message() << "\"");
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK(s.message().rfind(prefix, 0) == 0);
  if (!allowed.empty()) CHECK(s.message().find(allowed) != std::string::npos);
}

DecodeArgs valid_args(PageIds ids = PageIds::block_table) {
  return valid_call(ids, true, 3, 16, 4, 64, DType::bf16).a;
}

}  // namespace

TEST_CASE("domain sweep: every field's edges, validate() against the README table", "[domain]") {
  const std::vector<Call> bases = base_calls();
  const std::vector<Field> fs = fields();
  Sweep sweep;
  const float kFloats[] = {0.0f,
                           -0.0f,
                           1.0f,
                           -1.0f,
                           1e-8f,
                           0.0721f,
                           std::numeric_limits<float>::denorm_min(),
                           std::numeric_limits<float>::max(),
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN()};
  for (const Call& base : bases) {
    {
      const std::string e = check_host_api(base.a, base.dev, base.ws, base.ws_size);
      INFO(describe(base) << ": " << e);
      REQUIRE(e.empty());
      REQUIRE(validate(base.a).is_ok());
    }
    for (const Field& f : fs) {
      if (f.kind == Kind::f32) {
        for (float x : kFloats) {
          Call c = base;
          f.set_f(c, x);
          sweep.run(c, std::string(f.name) + " = " + mlakit_test::float_g(x));
        }
      } else if (f.kind == Kind::ptr) {
        for (int off : {-1, 0, 1, 2, 4, 8, 12, 16}) {
          Call c = base;
          f.set_p(c, off < 0 ? nullptr : g_mem + 256 + off);
          sweep.run(c, std::string(f.name) + " at +" + std::to_string(off));
        }
      } else {
        for (std::int64_t v : int_values(base, f)) {
          Call c = base;
          f.set(c, v);
          sweep.run(c, std::string(f.name) + " = " + std::to_string(v));
          if (f.kind == Kind::i32 && std::string(f.name).find("DeviceInfo") == std::string::npos) {
            set_packed_strides(c.a);  // the shape's own packed strides: no overflow either
            sweep.run(c, std::string(f.name) + " = " + std::to_string(v) + ", packed strides");
          }
        }
      }
    }
  }
  std::string failures;
  for (const std::string& s : sweep.first) failures += s + "\n";
  INFO(failures);
  CHECK(sweep.failures == 0);
  // The sweep reaches both sides of the domain.
  CHECK(sweep.calls > 50000);
  CHECK(sweep.accepted > sweep.calls / 10);
  CHECK(sweep.accepted < sweep.calls * 9 / 10);
}

TEST_CASE("set_packed_strides: any int shape without overflow", "[domain]") {
  DecodeArgs a;
  a.num_heads = kIntMax;
  a.q_len = kIntMax;
  a.page_size = kIntMax;
  set_packed_strides(a);
  CHECK(a.q_stride_token == std::int64_t(kIntMax) * 576);
  CHECK(a.q_stride_batch == kI64Max);  // 2^62 x 576 saturates
  CHECK(a.o_stride_batch == kI64Max);
  CHECK(a.lse_stride_batch == std::int64_t(kIntMax) * kIntMax);
  CHECK(a.kv_stride_page == std::int64_t(kIntMax) * 576);
  require_rejected(validate(a), "num_heads = 2147483647:");
  a.num_heads = kIntMin;
  set_packed_strides(a);
  CHECK(a.q_stride_batch == kI64Min);
  CHECK(a.o_stride_batch == kI64Min);
  a.q_len = kIntMin;
  set_packed_strides(a);
  CHECK(a.q_stride_batch == kI64Max);
  // In the domain the strides are the exact products.
  a.num_heads = 128;
  a.q_len = 32;
  set_packed_strides(a);
  CHECK(a.q_stride_batch == 32 * 128 * 576);
  CHECK(a.o_stride_batch == 32 * 128 * 512);
  // rows() too: exact in the domain, clamped to the int range outside it.
  CHECK(a.rows() == 4096);
  a.num_heads = kIntMax;
  CHECK(a.rows() == kIntMax);
  a.q_len = kIntMin;
  CHECK(a.rows() == kIntMin);
}

TEST_CASE("validate: a stride whose span passes 2^62 bytes is rejected by name", "[domain]") {
  // The same rule at 1024 and at 2^62: 2^62 used to wrap to a span the packed token stride
  // covered, and pass.
  DecodeArgs a = valid_args();
  a.o_stride_head = 1024;
  require_rejected(validate(a), "o_stride_token = 8192:", "at least 15872 elements");
  a.o_stride_head = std::int64_t(1) << 62;
  const std::int64_t o_head_max = ((std::int64_t(1) << 61) - 512) / 15;
  require_rejected(validate(a),
                   "o_stride_head = 4611686018427387904:", "at most " + std::to_string(o_head_max));

  a = valid_args();
  a.o_stride_token = std::int64_t(1) << 62;
  require_rejected(validate(a), "o_stride_token = 4611686018427387904:");
  a = valid_args();
  a.o_stride_batch = std::int64_t(1) << 61;
  require_rejected(validate(a), "o_stride_batch = 2305843009213693952:");

  // LSE: the head stride at fault is named, not the token stride it made look short.
  a = valid_args();
  a.lse_stride_head = 5208208757389214273;
  require_rejected(validate(a), "lse_stride_head = 5208208757389214273:");
  a = valid_args();
  a.lse_stride_token = kI64Max;
  require_rejected(validate(a), "lse_stride_token = 9223372036854775807:");
  a = valid_args();
  a.lse_stride_batch = kI64Max;
  require_rejected(validate(a), "lse_stride_batch = 9223372036854775807:");

  // Q, KV and the block table have bounds too (no overlap rule: inputs may be shared).
  a = valid_args();
  a.q_stride_batch = kI64Max - 7;
  require_rejected(validate(a), "q_stride_batch = 9223372036854775800:");
  a = valid_args();
  a.kv_stride_page = std::int64_t(1) << 40;  // page ids up to 2^31 - 1
  require_rejected(validate(a), "kv_stride_page = 1099511627776:");
  a = valid_args();
  a.block_table_stride = std::int64_t(1) << 59;  // 2 x 2^59 entries of 4 bytes
  require_rejected(validate(a), "block_table_stride = 576460752303423488:",
                   ">= max_pages_per_request (40) and <= ");

  // The largest head stride allowed passes with one token and one request.
  a = valid_args();
  a.batch = 1;
  a.q_len = 1;
  a.o_stride_head = o_head_max / 8 * 8;
  CHECK(validate(a).is_ok());
  a.o_stride_head += 8;
  require_rejected(validate(a), "o_stride_head = ");
}

TEST_CASE("plan_num_ctas: any int inputs without overflow", "[domain]") {
  // sm_count = INT_MAX used to overflow (3 x sm_count) and give 1 CTA.
  CHECK(plan_num_ctas(SplitMode::automatic, 1, 1, 1, kIntMax, 3) == kMaxAutoSplits);
  CHECK(plan_num_ctas(SplitMode::automatic, 1, kIntMax, 1, kIntMax, kIntMax) == kIntMax);
  CHECK(plan_num_ctas(SplitMode::fixed, kIntMax, kIntMax, 1, 132, 1) == kIntMax);
  CHECK(plan_num_ctas(SplitMode::automatic, 1, 5, 0, 132, 2) == 264);  // row_tiles 0 as 1
  CHECK(plan_num_ctas(SplitMode::automatic, 1, 5, 1, kIntMin, 2) == 5);
  // In the domain: the counts the planner always had.
  CHECK(plan_num_ctas(SplitMode::automatic, 1, 3, 1, 132, 2) == 264);
  CHECK(plan_num_ctas(SplitMode::automatic, 1, 3, 4, 132, 2) == 66);
  CHECK(plan_num_ctas(SplitMode::automatic, 1, 1, 1, 132, 1) == 132);
  CHECK(plan_num_ctas(SplitMode::automatic, 1, 1000, 1, 132, 1) == 1000);
  CHECK(plan_num_ctas(SplitMode::fixed, 40, 1000, 1, 132, 1) == 40000);
  CHECK(plan_num_ctas(SplitMode::none, 40, 1000, 1, 132, 1) == 1000);
}

TEST_CASE("workspace_bytes: the DeviceInfo is checked where it enters", "[domain]") {
  const DecodeArgs a = valid_args();
  for (int sms : {0, -1, kIntMax, kMaxSmCount + 1, kIntMin}) {
    DeviceInfo dev = kH100;
    dev.sm_count = sms;
    std::size_t bytes = 1;
    require_rejected(workspace_bytes(a, dev, &bytes),
                     "DeviceInfo.sm_count = " + std::to_string(sms) + ":", "allowed 1..4096");
    CHECK(bytes == 0);
    CHECK(workspace_bytes(a, dev) == 0);
    DecodeArgs empty = a;  // batch 0 too: the same rule at every batch
    empty.batch = 0;
    require_rejected(workspace_bytes(empty, dev, &bytes), "DeviceInfo.sm_count = ");
  }
  for (int sms : {1, 132, 304, kMaxSmCount}) {
    DeviceInfo dev = kH100;
    dev.sm_count = sms;
    CHECK(workspace_bytes(a, dev) > 0);
  }
  DeviceInfo dev = kH100;
  dev.device = -1;
  std::size_t bytes = 0;
  require_rejected(workspace_bytes(a, dev, &bytes), "DeviceInfo.device = -1:");
  dev = kH100;
  dev.max_smem_optin = -1;
  require_rejected(validate_device(dev), "DeviceInfo.max_smem_optin = -1:");
  dev = kH100;
  dev.arch = -90;
  require_rejected(validate_device(dev), "DeviceInfo.arch = -90:");
  CHECK(validate_device(kH100).is_ok());
  CHECK(validate_device(DeviceInfo{0, 304, 65536, 942}).is_ok());
}

TEST_CASE("batch 0: every rule but the pointer requirement applies", "[domain]") {
  DecodeArgs a = valid_args();
  a.batch = 0;
  a.q = a.kv = nullptr;
  a.out = nullptr;
  a.lse = nullptr;
  a.kv_len = nullptr;
  a.block_table = nullptr;
  CHECK(validate(a).is_ok());                // nothing is read: null pointers are fine
  a.q_stride_batch = a.o_stride_batch = -1;  // extent 0: unused
  CHECK(validate(a).is_ok());

  struct Case {
    std::function<void(DecodeArgs&)> mutate;
    const char* prefix;
  };
  const Case cases[] = {
      {[](DecodeArgs& x) { x.page_ids = PageIds(2); }, "page_ids = 2:"},
      {[](DecodeArgs& x) { x.q_type = DType(7); }, "q_type = 7:"},
      {[](DecodeArgs& x) { x.kv_type = DType(9); }, "kv_type = 9:"},
      {[](DecodeArgs& x) { x.split_mode = SplitMode(3); }, "split_mode = 3:"},
      {[](DecodeArgs& x) { x.q_stride_head = 1; }, "q_stride_head = 1:"},
      {[](DecodeArgs& x) { x.o_stride_token = 512; }, "o_stride_token = 512:"},
      {[](DecodeArgs& x) { x.kv_stride_page = 0; }, "kv_stride_page = 0:"},
      {[](DecodeArgs& x) { x.max_pages_per_request = 0; }, "max_pages_per_request = 0:"},
      {[](DecodeArgs& x) { x.page_size = 0; }, "page_size = 0:"},
      {[](DecodeArgs& x) { x.q = g_mem + 8; }, "q = 0x"},  // given: still aligned
      {[](DecodeArgs& x) { x.kv_len = reinterpret_cast<const std::int32_t*>(g_mem + 2); },
       "kv_len = 0x"},
      {[](DecodeArgs& x) {
         x.lse = reinterpret_cast<float*>(g_mem);
         x.lse_stride_token = 3;
       },
       "lse_stride_token = 3:"},
  };
  for (const Case& c : cases) {
    DecodeArgs b = a;
    c.mutate(b);
    require_rejected(validate(b), c.prefix);
    // decode() says the same at batch 0 (it used to return ok for these).
    CHECK(decode(b, nullptr, 0, nullptr).message() == validate(b).message());
    // Batch 1 rejects the same value with the same words.
    DecodeArgs one = valid_args();
    one.batch = 1;
    c.mutate(one);
    require_rejected(validate(one), c.prefix);
  }
}

TEST_CASE("decode: a null workspace with a size is named as the workspace", "[domain]") {
  const DecodeArgs a = valid_args();
  require_rejected(decode(a, nullptr, 4096, nullptr), "workspace = null:",
                   "a device pointer is required when workspace_size = 4096 > 0");
  DecodeArgs empty = a;
  empty.batch = 0;
  require_rejected(decode(empty, nullptr, 1, nullptr), "workspace = null:");
  // Null with size 0 is no argument error (the launch reports a workspace too small).
  CHECK(decode(a, nullptr, 0, nullptr).code() == StatusCode::not_supported);
  CHECK(decode(empty, nullptr, 0, nullptr).code() == StatusCode::not_supported);
  // An invalid request is reported first.
  DecodeArgs bad = a;
  bad.q_len = 40;
  require_rejected(decode(bad, nullptr, 4096, nullptr), "q_len = 40:");
}

TEST_CASE("validate: every pointer the kernels read is aligned", "[domain]") {
  struct Case {
    PageIds ids;
    std::function<void(DecodeArgs&, int)> set;
    const char* name;
  };
  auto i32p = [](int off) { return reinterpret_cast<const std::int32_t*>(g_mem + 256 + off); };
  const Case cases[] = {
      {PageIds::block_table, [&](DecodeArgs& a, int o) { a.kv_len = i32p(o); }, "kv_len"},
      {PageIds::block_table, [&](DecodeArgs& a, int o) { a.block_table = i32p(o); }, "block_table"},
      {PageIds::csr, [&](DecodeArgs& a, int o) { a.kv_indptr = i32p(o); }, "kv_indptr"},
      {PageIds::csr, [&](DecodeArgs& a, int o) { a.kv_indices = i32p(o); }, "kv_indices"},
  };
  for (const Case& c : cases) {
    for (int off : {1, 2, 3, 5, 6}) {
      DecodeArgs a = valid_args(c.ids);
      c.set(a, off);
      INFO(c.name << " at +" << off);
      require_rejected(validate(a), std::string(c.name) + " = 0x", "a 4-byte aligned address");
    }
    for (int off : {0, 4, 8, 12}) {
      DecodeArgs a = valid_args(c.ids);
      c.set(a, off);
      CHECK(validate(a).is_ok());
    }
  }
  // The pointers of the other page-id mode are not read, so not checked.
  DecodeArgs a = valid_args(PageIds::block_table);
  a.kv_indptr = i32p(1);
  a.kv_indices = i32p(2);
  CHECK(validate(a).is_ok());
  a = valid_args(PageIds::csr);
  a.block_table = i32p(3);
  CHECK(validate(a).is_ok());
}

TEST_CASE("validate: an invalid q_type is printed as its value", "[domain]") {
  DecodeArgs a = valid_args();
  a.q_type = DType(7);
  CHECK(validate(a).message() == "q_type = 7: not in the supported domain (bf16 or fp16)");
  a.q_type = DType::fp8_e4m3fn;  // a valid type that Q cannot have: its name
  CHECK(validate(a).message().rfind("q_type = fp8_e4m3fn:", 0) == 0);
}

TEST_CASE("README: the Supported domain table states every rule validate() enforces", "[domain]") {
  const std::string t = readme_domain_section();
  REQUIRE(!t.empty());
  // Every field a rejection can name, as the table writes it.
  for (const char* name : {"`batch`",
                           "`num_heads`",
                           "`q_len`",
                           "`q_type`",
                           "`kv_type`",
                           "`kv_scale`",
                           "`softmax_scale`",
                           "`page_size`",
                           "`page_ids`",
                           "`block_table`",
                           "`max_pages_per_request`",
                           "`block_table_stride`",
                           "`kv_indptr`",
                           "`kv_indices`",
                           "`kv_len`",
                           "`q`",
                           "`kv`",
                           "`out`",
                           "`lse`",
                           "`q_stride_head`",
                           "`q_stride_token`",
                           "`q_stride_batch`",
                           "`kv_stride_token`",
                           "`kv_stride_page`",
                           "`kv_rope`",
                           "`kv_rope_stride_token`",
                           "`kv_rope_stride_page`",
                           "`o_stride_head`",
                           "`o_stride_token`",
                           "`o_stride_batch`",
                           "`split_mode`",
                           "`num_splits`",
                           "`lse_format`",
                           "`plan_step`",
                           "`workspace_size`",
                           "`DeviceInfo`",
                           "`sm_count`",
                           "`device`",
                           "`max_smem_optin`",
                           "`arch`"}) {
    INFO(name);
    CHECK(t.find(name) != std::string::npos);
  }
  // Every limit, as the code has it.
  const std::string limits[] = {
      "0.." + std::to_string(kMaxBatch),
      "1.." + std::to_string(kMaxHeads),
      "1.." + std::to_string(kMaxQLen),
      "1.." + std::to_string(kMaxPageSize),
      "1.." + std::to_string(kMaxSplits),
      "batch x num_splits <= " + std::to_string(kMaxBatch),
      "1..4096",
      "1..2^30",
      "2^62 bytes",
      "(2^31 - 1) x kv_stride_page",
      "16-byte aligned",
      "4-byte aligned",
      "multiples of 8 (16-bit cache) or 16 (fp8)",
      "finite, > 0",
      "`softmax_scale x kv_scale x log2(e)`, which must be finite",
      "default 0 is rejected",
      "0 (packed rows) or >= `max_pages_per_request`",
      "not checked at batch <= 1",
      "extent 0 or 1",
      "batch 0",
      "null only with `workspace_size` 0",
  };
  for (const std::string& l : limits) {
    INFO(l);
    CHECK(t.find(l) != std::string::npos);
  }
  CHECK(kMaxSmCount == 4096);
  CHECK(kMaxPagesPerRequest == 1 << 30);
  CHECK(kMaxSpanBytes == std::int64_t(1) << 62);
  CHECK(kMaxPageId == (std::int64_t(1) << 31) - 1);
}
