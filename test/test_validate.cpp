// Host tests of core/validate.hpp and of the host side of api/decode.hpp on a build without a
// GPU backend: every rejection is invalid_argument with a message that names the argument and
// its value; every shape of the domain is accepted; decode() and supported() answer with a
// Status (never abort); workspace_bytes() does not depend on kv_len or other per-step data.
// validate() never dereferences a pointer, so dummy aligned host buffers stand in for device
// memory.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "mlakit/api/decode.hpp"
#include "mlakit/api/dispatch.hpp"
#include "mlakit/core/decode_args.hpp"
#include "mlakit/core/plan.hpp"
#include "mlakit/core/status.hpp"
#include "mlakit/core/validate.hpp"

using namespace mlakit;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Never read: only addresses (and their alignment) matter to validate().
alignas(64) unsigned char g_bytes[1024];
alignas(64) float g_lse[64];
alignas(64) std::int32_t g_ints[64];

const void* at(int offset) { return g_bytes + offset; }
void* at_mut(int offset) { return g_bytes + offset; }

// A fully valid request: 3 requests, 16 heads, q_len 4, 64-token pages, packed strides.
DecodeArgs valid_args(PageIds ids = PageIds::block_table, DType q = DType::bf16,
                      DType kv = DType::bf16) {
  DecodeArgs a;
  a.q_type = q;
  a.kv_type = kv;
  a.batch = 3;
  a.num_heads = 16;
  a.q_len = 4;
  a.page_size = 64;
  a.kv_scale = is_fp8(kv) ? 0.02f : 1.0f;
  a.softmax_scale = 0.0721f;
  a.page_ids = ids;
  a.max_pages_per_request = 40;
  set_packed_strides(a);
  a.q = at(0);
  a.kv = at(256);
  a.out = at_mut(512);
  a.lse = g_lse;
  a.kv_len = g_ints;
  if (ids == PageIds::block_table) {
    a.block_table = g_ints + 8;
  } else {
    a.kv_indptr = g_ints + 8;
    a.kv_indices = g_ints + 16;
  }
  return a;
}

struct BadCase {
  std::string label;
  std::function<void(DecodeArgs&)> mutate;
  std::string name;          // argument the message must name
  std::string value;         // its value as the message prints it
  std::string allowed = "";  // a piece of the allowed range, when the message has a fixed one
};

// Every rejection validate() knows, each applied to an otherwise valid request.
std::vector<BadCase> bad_cases() {
  using A = DecodeArgs&;
  std::vector<BadCase> v = {
      {"q_type fp8", [](A a) { a.q_type = DType::fp8_e4m3fn; }, "q_type", "fp8_e4m3fn",
       "bf16 or fp16"},
      {"q_type fp8 fnuz", [](A a) { a.q_type = DType::fp8_e4m3fnuz; }, "q_type", "fp8_e4m3fnuz"},
      {"q_type invalid", [](A a) { a.q_type = DType(7); }, "q_type", "7", "bf16 or fp16"},
      {"kv_type invalid", [](A a) { a.kv_type = DType(7); }, "kv_type", "7", "fp8_e4m3fnuz"},
      {"kv_type 4", [](A a) { a.kv_type = DType(4); }, "kv_type", "4"},
      {"compute 7", [](A a) { a.compute = Compute(7); }, "compute", "7", "standard or fp8_matrix"},
      {"compute fp8_matrix with a bf16 cache", [](A a) { a.compute = Compute::fp8_matrix; },
       "compute", "fp8_matrix", "an fp8_e4m3fn cache (kv_type is bf16"},
      {"compute fp8_matrix with an e4m3fnuz cache",
       [](A a) {
         a.kv_type = DType::fp8_e4m3fnuz;
         a.kv_scale = 0.02f;
         a.kv_stride_token = 576;
         a.compute = Compute::fp8_matrix;
       },
       "compute", "fp8_matrix", "(kv_type is fp8_e4m3fnuz"},
      {"batch -1", [](A a) { a.batch = -1; }, "batch", "-1"},
      {"batch 65536", [](A a) { a.batch = 65536; }, "batch", "65536", "0..65535"},
      {"fixed, batch x num_splits past the grid",
       [](A a) {
         a.batch = 2000;
         a.split_mode = SplitMode::fixed;
         a.num_splits = 40;
       },
       "num_splits", "40", "65535"},
      {"num_heads 0", [](A a) { a.num_heads = 0; }, "num_heads", "0", "1..128"},
      {"num_heads 129", [](A a) { a.num_heads = 129; }, "num_heads", "129", "1..128"},
      {"num_heads -3", [](A a) { a.num_heads = -3; }, "num_heads", "-3", "1..128"},
      {"q_len 0", [](A a) { a.q_len = 0; }, "q_len", "0", "1..32"},
      {"q_len 33", [](A a) { a.q_len = 33; }, "q_len", "33", "1..32"},
      {"page_size 0", [](A a) { a.page_size = 0; }, "page_size", "0", "1..256"},
      {"page_size 257", [](A a) { a.page_size = 257; }, "page_size", "257", "1..256"},
      {"softmax_scale 0", [](A a) { a.softmax_scale = 0.0f; }, "softmax_scale", "0", "> 0"},
      {"softmax_scale -0.5", [](A a) { a.softmax_scale = -0.5f; }, "softmax_scale", "-0.5"},
      {"softmax_scale NaN", [](A a) { a.softmax_scale = kNaN; }, "softmax_scale", "nan"},
      {"softmax_scale inf", [](A a) { a.softmax_scale = kInf; }, "softmax_scale", "inf"},
      {"softmax_scale -inf", [](A a) { a.softmax_scale = -kInf; }, "softmax_scale", "-inf"},
      {"kv_scale 0", [](A a) { a.kv_scale = 0.0f; }, "kv_scale", "0", "> 0"},
      {"kv_scale -1", [](A a) { a.kv_scale = -1.0f; }, "kv_scale", "-1"},
      {"kv_scale NaN", [](A a) { a.kv_scale = kNaN; }, "kv_scale", "nan"},
      {"kv_scale inf", [](A a) { a.kv_scale = kInf; }, "kv_scale", "inf"},
      {"split_mode 3", [](A a) { a.split_mode = SplitMode(3); }, "split_mode", "3"},
      {"lse_format 3", [](A a) { a.lse_format = LseFormat(3); }, "lse_format", "3",
       "natural, natural_empty_is_inf or base2"},
      {"plan_step 3", [](A a) { a.plan_step = PlanStep(3); }, "plan_step", "3",
       "plan_and_decode, plan_only or decode_only"},
      {"fixed, num_splits 0",
       [](A a) {
         a.split_mode = SplitMode::fixed;
         a.num_splits = 0;
       },
       "num_splits", "0", "1..64"},
      {"fixed, num_splits 65",
       [](A a) {
         a.split_mode = SplitMode::fixed;
         a.num_splits = 65;
       },
       "num_splits", "65", "1..64"},
      {"fixed, num_splits -1",
       [](A a) {
         a.split_mode = SplitMode::fixed;
         a.num_splits = -1;
       },
       "num_splits", "-1"},
      {"null q", [](A a) { a.q = nullptr; }, "q", "null"},
      {"null kv", [](A a) { a.kv = nullptr; }, "kv", "null"},
      {"null out", [](A a) { a.out = nullptr; }, "out", "null"},
      {"null kv_len", [](A a) { a.kv_len = nullptr; }, "kv_len", "null"},
      {"q 2-byte aligned", [](A a) { a.q = at(2); }, "q", "0x", "16-byte aligned address"},
      {"q 8-byte aligned", [](A a) { a.q = at(8); }, "q", "0x", "16-byte aligned address"},
      {"kv 1-byte aligned", [](A a) { a.kv = at(257); }, "kv", "0x", "16-byte aligned address"},
      {"kv 8-byte aligned", [](A a) { a.kv = at(264); }, "kv", "0x"},
      {"out 2-byte aligned", [](A a) { a.out = at_mut(514); }, "out", "0x"},
      {"out 8-byte aligned", [](A a) { a.out = at_mut(520); }, "out", "0x"},
      {"lse 2-byte aligned", [](A a) { a.lse = reinterpret_cast<float*>(at_mut(770)); }, "lse",
       "0x"},
      {"q_stride_head 500", [](A a) { a.q_stride_head = 500; }, "q_stride_head", "500",
       "at least 576"},
      {"q_stride_head 580", [](A a) { a.q_stride_head = 580; }, "q_stride_head", "580",
       "multiple of 8"},
      {"q_stride_head -576", [](A a) { a.q_stride_head = -576; }, "q_stride_head", "-576"},
      {"q_stride_token 100", [](A a) { a.q_stride_token = 100; }, "q_stride_token", "100"},
      {"q_stride_batch 582", [](A a) { a.q_stride_batch = 582; }, "q_stride_batch", "582"},
      {"kv_stride_token 100", [](A a) { a.kv_stride_token = 100; }, "kv_stride_token", "100"},
      {"kv_stride_token 580", [](A a) { a.kv_stride_token = 580; }, "kv_stride_token", "580"},
      {"kv_stride_page 0", [](A a) { a.kv_stride_page = 0; }, "kv_stride_page", "0"},
      {"kv rows of 512 without kv_rope", [](A a) { a.kv_stride_token = 512; }, "kv_stride_token",
       "512", "at least 576"},
      {"kv_rope 8-byte aligned", [](A a) { a.kv_rope = at(904); }, "kv_rope", "0x",
       "16-byte aligned address"},
      {"kv rows of 504 with kv_rope",
       [](A a) {
         a.kv_rope = at(896);
         a.kv_stride_token = 504;
       },
       "kv_stride_token", "504", "at least 512"},
      {"kv_rope_stride_token 32",
       [](A a) {
         a.kv_rope = at(896);
         a.kv_rope_stride_token = 32;
       },
       "kv_rope_stride_token", "32", "at least 64"},
      {"kv_rope_stride_token 68",
       [](A a) {
         a.kv_rope = at(896);
         a.kv_rope_stride_token = 68;
       },
       "kv_rope_stride_token", "68", "multiple of 8"},
      {"kv_rope_stride_page overflows",
       [](A a) {
         a.kv_rope = at(896);
         a.kv_rope_stride_page = std::int64_t(1) << 40;
       },
       "kv_rope_stride_page", "1099511627776", "at most"},
      {"o_stride_head 256", [](A a) { a.o_stride_head = 256; }, "o_stride_head", "256",
       "at least 512"},
      {"o_stride_head 516", [](A a) { a.o_stride_head = 516; }, "o_stride_head", "516"},
      // Heads of token t + 1 would start inside the last head of token t.
      {"o_stride_token overlaps heads", [](A a) { a.o_stride_token = 15 * 512; }, "o_stride_token",
       "7680", "at least 8192"},
      {"o_stride_token with padded heads",
       [](A a) {
         a.o_stride_head = 640;
         a.o_stride_token = 16 * 512;
       },
       "o_stride_token", "8192", "at least 10112"},
      {"o_stride_batch overlaps tokens", [](A a) { a.o_stride_batch = 3 * 16 * 512; },
       "o_stride_batch", "24576", "at least 32768"},
      {"lse_stride_head 0", [](A a) { a.lse_stride_head = 0; }, "lse_stride_head", "0"},
      {"lse_stride_token overlaps heads", [](A a) { a.lse_stride_token = 15; }, "lse_stride_token",
       "15", "at least 16 elements"},
      {"lse_stride_batch overlaps tokens", [](A a) { a.lse_stride_batch = 63; }, "lse_stride_batch",
       "63", "at least 64 elements"},
      {"block_table null", [](A a) { a.block_table = nullptr; }, "block_table", "null"},
      {"max_pages_per_request 0", [](A a) { a.max_pages_per_request = 0; }, "max_pages_per_request",
       "0"},
      {"block_table_stride < max_pages_per_request", [](A a) { a.block_table_stride = 39; },
       "block_table_stride", "39", ">= max_pages_per_request (40) and <= "},
      {"block_table_stride negative", [](A a) { a.block_table_stride = -40; }, "block_table_stride",
       "-40"},
      {"page_ids 2", [](A a) { a.page_ids = PageIds(2); }, "page_ids", "2", "block_table or csr"},
      {"csr, kv_indptr null",
       [](A a) {
         a.page_ids = PageIds::csr;
         a.kv_indptr = nullptr;
         a.kv_indices = g_ints;
       },
       "kv_indptr", "null"},
  };
  return v;
}

void check_rejected(const Status& s, const BadCase& c) {
  INFO(c.label << ": \"" << s.message() << "\"");
  CHECK(s.code() == StatusCode::invalid_argument);
  // Exactly the mutated argument is named first, with its value.
  CHECK(s.message().rfind(c.name + " = " + c.value, 0) == 0);
  if (!c.allowed.empty()) CHECK(s.message().find(c.allowed) != std::string::npos);
}

const DeviceInfo kH100{0, 132, 232448, 90};
const DeviceInfo kMI300{0, 304, 65536, 942};

}  // namespace

TEST_CASE("validate: the base requests are valid", "[validate]") {
  for (PageIds ids : {PageIds::block_table, PageIds::csr}) {
    const Status s = validate(valid_args(ids));
    INFO(s.message());
    CHECK(s.is_ok());
    CHECK(s.message().empty());
  }
}

TEST_CASE("validate: a separate rotary cache (kv_rope) with 512-value kv rows", "[validate]") {
  for (DType kv : {DType::bf16, DType::fp8_e4m3fn}) {
    DecodeArgs a = valid_args();
    a.kv_type = kv;
    a.kv_rope = at(896);
    a.kv_stride_token = kHeadDimV;
    a.kv_stride_page = std::int64_t(a.page_size) * kHeadDimV;
    a.kv_rope_stride_token = 64;
    a.kv_rope_stride_page = std::int64_t(a.page_size) * 64;
    const Status s = validate(a);
    INFO(s.message());
    CHECK(s.is_ok());
    a.kv_rope = nullptr;  // the same kv rows without it hold no rotary values
    CHECK(validate(a).message().rfind("kv_stride_token = 512:", 0) == 0);
  }
  // resolve_rope_part(): a joined cache reads its rotary values 512 elements into kv's rows.
  DecodeArgs j = valid_args();
  j.kv_type = DType::fp8_e4m3fn;
  resolve_rope_part(j);
  CHECK(j.kv_rope == static_cast<const unsigned char*>(j.kv) + 512);
  CHECK(j.kv_rope_stride_token == j.kv_stride_token);
  CHECK(j.kv_rope_stride_page == j.kv_stride_page);
  DecodeArgs given = valid_args();
  given.kv_rope = at(896);
  given.kv_rope_stride_token = 80;
  resolve_rope_part(given);
  CHECK(given.kv_rope == at(896));
  CHECK(given.kv_rope_stride_token == 80);
}

TEST_CASE("validate: every rejection names the argument and its value", "[validate]") {
  for (const BadCase& c : bad_cases()) {
    DecodeArgs a = valid_args();
    c.mutate(a);
    const Status s = validate(a);
    check_rejected(s, c);
    // supported() and decode() report the same rejection, not the missing backend.
    const Status sup = supported(a);
    CHECK(sup.code() == StatusCode::invalid_argument);
    CHECK(sup.message() == s.message());
    const Status dec = decode(a, at_mut(0), 1 << 20, nullptr);
    CHECK(dec.code() == StatusCode::invalid_argument);
    CHECK(dec.message() == s.message());
  }
}

TEST_CASE("validate: fp8 caches need 16-element KV strides, 16-bit caches 8", "[validate]") {
  for (DType kv : {DType::bf16, DType::fp16, DType::fp8_e4m3fn, DType::fp8_e4m3fnuz}) {
    INFO(dtype_name(kv));
    DecodeArgs a = valid_args(PageIds::block_table, DType::bf16, kv);
    a.kv_stride_token = 584;  // multiple of 8, not of 16
    const Status s = validate(a);
    if (is_fp8(kv)) {
      check_rejected(
          s, {"fp8 kv_stride_token 584", nullptr, "kv_stride_token", "584", "multiple of 16"});
    } else {
      CHECK(s.is_ok());
    }
    a = valid_args(PageIds::block_table, DType::bf16, kv);
    a.kv_stride_page = std::int64_t(a.page_size) * kHeadDimQK + 8;
    CHECK(validate(a).is_ok() == !is_fp8(kv));
  }
}

TEST_CASE("validate: arguments that do not apply are not checked", "[validate]") {
  DecodeArgs a = valid_args(PageIds::csr);
  a.block_table = nullptr;  // csr: block table and its capacity unused
  a.max_pages_per_request = 0;
  a.block_table_stride = -5;
  CHECK(validate(a).is_ok());

  a = valid_args(PageIds::block_table);
  a.kv_indptr = nullptr;
  a.kv_indices = nullptr;
  CHECK(validate(a).is_ok());

  a = valid_args();
  a.lse = nullptr;  // LSE not requested: its strides are unused
  a.lse_stride_head = 0;
  a.lse_stride_token = -1;
  a.lse_stride_batch = 0;
  CHECK(validate(a).is_ok());

  for (SplitMode m : {SplitMode::automatic, SplitMode::none}) {
    for (int n : {-1, 0, 65, 1000}) {
      a = valid_args();
      a.split_mode = m;
      a.num_splits = n;  // only read in fixed mode
      CHECK(validate(a).is_ok());
    }
  }
  for (int n : {1, 2, 63, 64}) {
    a = valid_args();
    a.split_mode = SplitMode::fixed;
    a.num_splits = n;
    CHECK(validate(a).is_ok());
  }

  a = valid_args();
  a.batch = 1;  // one request: the block-table row stride is never used
  a.block_table_stride = 0;
  a.q_stride_batch = 0;
  a.o_stride_batch = 0;
  a.lse_stride_batch = 0;
  CHECK(validate(a).is_ok());

  a = valid_args();
  a.num_heads = 1;  // a dimension of extent 1 has no stride constraint
  a.q_len = 1;
  a.page_size = 1;
  a.q_stride_head = a.q_stride_token = 0;
  a.o_stride_head = a.o_stride_token = 0;
  a.kv_stride_token = 0;
  a.lse_stride_head = a.lse_stride_token = 0;
  a.q_stride_batch = kHeadDimQK;
  a.o_stride_batch = kHeadDimV;
  a.lse_stride_batch = 1;
  a.kv_stride_page = kHeadDimQK;
  CHECK(validate(a).is_ok());

  a = valid_args();  // padded, non-packed strides
  a.q_stride_head = 640;
  a.q_stride_token = 16 * 640 + 8;
  a.q_stride_batch = 4 * a.q_stride_token + 64;
  a.kv_stride_token = 592;
  a.kv_stride_page = 64 * 592 + 16;
  a.o_stride_head = 520;
  a.o_stride_token = 15 * 520 + 512;  // exactly the span of 16 heads
  a.o_stride_batch = 3 * a.o_stride_token + 15 * 520 + 512;
  a.lse_stride_head = 3;
  a.lse_stride_token = 15 * 3 + 1;
  a.lse_stride_batch = 3 * a.lse_stride_token + 15 * 3 + 1;
  a.block_table_stride = 41;
  CHECK(validate(a).is_ok());
}

TEST_CASE("validate: every head count, q_len and page size of the domain", "[validate]") {
  long long checked = 0, failed = 0;
  std::string first_failure;
  for (int h = 1; h <= kMaxHeads; ++h)
    for (int q = 1; q <= kMaxQLen; ++q)
      for (int ps = 1; ps <= kMaxPageSize; ++ps) {
        DecodeArgs a = valid_args(ps % 2 ? PageIds::csr : PageIds::block_table);
        a.num_heads = h;
        a.q_len = q;
        a.page_size = ps;
        set_packed_strides(a);
        const Status s = validate(a);
        ++checked;
        if (!s) {
          if (failed++ == 0)
            first_failure = "h " + std::to_string(h) + " q " + std::to_string(q) + " ps " +
                            std::to_string(ps) + ": " + s.message();
        }
      }
  INFO(first_failure);
  CHECK(checked == 128LL * 32 * 256);
  CHECK(failed == 0);
}

TEST_CASE("validate: all 8 dtype pairs are accepted", "[validate]") {
  int accepted = 0;
  for (DType q : {DType::bf16, DType::fp16})
    for (DType kv : {DType::bf16, DType::fp16, DType::fp8_e4m3fn, DType::fp8_e4m3fnuz})
      for (PageIds ids : {PageIds::block_table, PageIds::csr}) {
        const Status s = validate(valid_args(ids, q, kv));
        INFO(dtype_name(q) << "/" << dtype_name(kv) << ": " << s.message());
        CHECK(s.is_ok());
        accepted += s.is_ok();
      }
  CHECK(accepted == 16);
}

TEST_CASE("validate: batch 0 needs no pointers, but everything else is still checked",
          "[validate]") {
  DecodeArgs a = valid_args();
  a.batch = 0;
  a.q = a.kv = nullptr;
  a.out = nullptr;
  a.lse = nullptr;
  a.kv_len = nullptr;
  a.block_table = nullptr;
  a.q_stride_batch = 1;  // the batch dimension has extent 0: its strides are never used
  CHECK(validate(a).is_ok());
  // No backend: a valid empty request is still "not supported" by this build.
  CHECK(supported(a).code() == StatusCode::not_supported);
  CHECK(decode(a, nullptr, 0, nullptr).code() == StatusCode::not_supported);

  DecodeArgs b = a;
  b.num_heads = 0;
  check_rejected(validate(b), {"batch 0, heads 0", nullptr, "num_heads", "0", "1..128"});
  b = a;
  b.softmax_scale = kNaN;
  check_rejected(validate(b), {"batch 0, NaN scale", nullptr, "softmax_scale", "nan"});
  b = a;
  b.split_mode = SplitMode::fixed;
  b.num_splits = 65;
  check_rejected(validate(b), {"batch 0, 65 splits", nullptr, "num_splits", "65"});
  // The rules of batch > 0 other than the pointer requirement (test_domain.cpp has them all).
  b = a;
  b.max_pages_per_request = 0;
  check_rejected(validate(b), {"batch 0, no pages", nullptr, "max_pages_per_request", "0"});
  b = a;
  b.q_stride_head = 1;
  check_rejected(validate(b), {"batch 0, q_stride_head 1", nullptr, "q_stride_head", "1"});
}

TEST_CASE("no backend: decode() and supported() return not_supported for valid args",
          "[validate]") {
  CHECK_FALSE(kHaveGpuBackend);
  for (DType q : {DType::bf16, DType::fp16})
    for (DType kv : {DType::bf16, DType::fp16, DType::fp8_e4m3fn, DType::fp8_e4m3fnuz})
      for (SplitMode m : {SplitMode::automatic, SplitMode::none, SplitMode::fixed}) {
        DecodeArgs a = valid_args(PageIds::csr, q, kv);
        a.split_mode = m;
        a.num_splits = 5;
        const Status sup = supported(a);
        CHECK(sup.code() == StatusCode::not_supported);
        CHECK(sup.message().find("no GPU backend") != std::string::npos);
        // Workspace arguments are irrelevant when nothing can run: never an abort.
        CHECK(decode(a, nullptr, 0, nullptr).code() == StatusCode::not_supported);
        CHECK(decode(a, at_mut(0), 1 << 30, nullptr).code() == StatusCode::not_supported);
      }
  DeviceInfo info{};
  CHECK(query_device(&info).code() == StatusCode::not_supported);
  CHECK(query_device(nullptr).code() == StatusCode::invalid_argument);
}

TEST_CASE("policy choice: rows, KV type and device", "[validate]") {
  using arch::kNumPolicies;
  using arch::kPolicies;
  using arch::policy_index_for;
  for (int rows = 1; rows <= 4096; ++rows) {
    for (bool direct : {false, true}) {
      for (int device_arch : {80, 90, 942}) {
        for (int batch : {1, arch::kSplitOMinRequests16 - 1, arch::kSplitOMinRequests16, 65535})
          for (int page : {1, 16, arch::kKtDirectMinPage, 256}) {
            const int by_rows = arch::policy_index_for_rows(rows);
            const int i = policy_index_for(rows, direct, device_arch, batch, page);
            INFO("rows " << rows << " direct " << direct << " arch " << device_arch << " batch "
                         << batch << " page " << page);
            REQUIRE(i >= 0);
            REQUIRE(i < kNumPolicies);
            CHECK(kPolicies[i].rows >= std::min(rows, kPolicies[kNumPolicies - 1].rows));
            // sm_90, KV of the Q type: the small tile's keys-as-M form from kFp8CtasMinRowTiles
            // requests up and pages of kKtDirectMinPage; else 17..32 rows (and 1..16 rows from
            // kSplitOMinRequests16 requests up) the warp-specialized 64-row tile.
            const bool keys_as_m =
                kPolicies[by_rows].direct_mainloop == arch::Mainloop::keys_as_m &&
                batch >= arch::kFp8CtasMinRowTiles && page >= arch::kKtDirectMinPage;
            const bool small =
                !keys_as_m &&
                (kPolicies[by_rows].rows == 32 ||
                 (kPolicies[by_rows].rows == 16 && batch >= arch::kSplitOMinRequests16));
            const bool promoted =
                direct && device_arch == 90 && small &&
                kPolicies[kNumPolicies - 1].mainloop == arch::Mainloop::warpgroup_split_o;
            CHECK(i == (promoted ? kNumPolicies - 1 : by_rows));
          }
      }
    }
  }
  // Concrete cases (the default table): 16 heads of bf16 KV on sm_90.
  CHECK(policy_index_for(32, true, 90, 128, 64) == 1);  // keys-as-M, 32 rows
  CHECK(policy_index_for(32, true, 90, 128, 1) == 2);   // warp-specialized 64-row tile
  CHECK(policy_index_for(32, true, 90, 31, 64) == 2);
  CHECK(policy_index_for(16, true, 90, 128, 64) == 0);  // keys-as-M, 16 rows
  CHECK(policy_index_for(16, true, 90, 128, 1) == 2);   // warp-specialized 64-row tile
  CHECK(policy_index_for(16, true, 90, 31, 64) == 0);   // mma.sync, 16 rows
  CHECK(policy_index_for(32, false, 90, 31, 64) == 1);
  // decode() and workspace_bytes() agree: KV of the Q type on the H100-like device, 32 rows,
  // below and from kFp8CtasMinRowTiles requests (valid_args(): page size 64).
  REQUIRE(valid_args().page_size >= arch::kKtDirectMinPage);
  for (int batch : {3, 128}) {
    DecodeArgs a = valid_args();
    a.batch = batch;
    a.num_heads = 16;
    a.q_len = 2;
    a.kv_type = a.q_type;
    set_packed_strides(a);
    INFO("batch " << batch);
    const bool ws_tile = kPolicies[kNumPolicies - 1].mainloop == arch::Mainloop::warpgroup_split_o;
    CHECK(detail::policy_rows(a, kH100) == (ws_tile && batch < 32 ? 64 : 32));
    CHECK(detail::policy_rows(a, kMI300) == arch::kPolicies[arch::policy_index_for_rows(32)].rows);
    // The workspace is sized for the larger tile whatever the KV type, and fits the launch of
    // either.
    DecodeArgs f = a;
    f.kv_type = DType::fp8_e4m3fn;
    CHECK(detail::policy_rows(f, kH100) == 32);
    CHECK(workspace_bytes(f, kH100) == workspace_bytes(a, kH100));
    for (const DecodeArgs& x : {a, f}) {
      const int idx = detail::policy_index(x, kH100);
      const int rpc = arch::kPolicies[idx].rows;
      const PlanShape sh = detail::plan_shape(x, idx, kH100);
      CHECK(std::size_t(detail::workspace_layout(sh, sh.row_tiles * rpc).bytes) <=
            workspace_bytes(x, kH100));
    }
  }
}

TEST_CASE(
    "the e4m3fn 16-row plan: three CTAs per SM from 32 row tiles up (mma.sync), two on sm_90 "
    "(keys-as-M)",
    "[validate]") {
  const DeviceInfo a100{0, 108, 166912, 80};
  DecodeArgs a = valid_args();
  a.num_heads = 16;
  a.q_len = 1;
  a.split_mode = SplitMode::automatic;
  REQUIRE(arch::kPolicies[arch::policy_index_for_rows(16)].fp8_mainloop ==
          arch::Mainloop::keys_as_m);
  for (DType kv : {DType::fp8_e4m3fn, DType::bf16, DType::fp8_e4m3fnuz}) {
    for (int batch : {1, 31, 32, 128}) {
      a.kv_type = kv;
      a.batch = batch;
      const int idx = detail::policy_index(a, a100);
      REQUIRE(arch::kPolicies[idx].rows == 16);
      // sm_90, KV of the Q type from kSplitOMinRequests16 requests up: the 16-row keys-as-M 16-bit
      // form (one CTA per SM) at pages of kKtDirectMinPage tokens or more, the warp-specialized
      // 64-row tile at smaller pages; both plans fit the same workspace.
      const bool direct16 = kv == a.q_type && batch >= arch::kSplitOMinRequests16;
      CHECK(detail::policy_index(a, kH100) == idx);
      if (direct16) {
        REQUIRE(a.page_size >= arch::kKtDirectMinPage);
        DecodeArgs small_pages = a;
        small_pages.page_size = 1;
        const int ws_idx = detail::policy_index(small_pages, kH100);
        CHECK(arch::kPolicies[ws_idx].rows == 64);
        const PlanShape sws = detail::plan_shape(small_pages, ws_idx, kH100);
        CHECK(sws.row_tiles == 1);
        CHECK(std::size_t(detail::workspace_layout(sws, 64).bytes) <= workspace_bytes(a, kH100));
      }
      const bool e4m3 = kv == DType::fp8_e4m3fn;
      const bool three = e4m3 && batch >= arch::kFp8CtasMinRowTiles;
      // sm_80: the mma.sync kernel's e4m3fn path keeps three CTAs per SM.
      CHECK(detail::choose_kernel(a, a100, idx).resident_ctas_per_sm == (e4m3 ? 3 : 2));
      CHECK(detail::plan_ctas_per_sm(a, idx,
                                     detail::choose_kernel(a, a100, idx).resident_ctas_per_sm) ==
            (three ? 3 : 2));
      // A kernel that keeps two resident (a kv_any_t entry given e4m3fn KV) is planned for two.
      CHECK(detail::plan_ctas_per_sm(a, idx, 2) == 2);
      const PlanShape s80 = detail::plan_shape(a, idx, a100);
      CHECK(s80.num_ctas == (three ? 3 : 2) * a100.sm_count);
      // sm_90: e4m3fn runs the keys-as-M kernel, two CTAs per SM at every batch; so do the
      // other KV types below 32 requests (mma.sync); the 16-bit keys-as-M form keeps one.
      const int ctas90 = direct16 ? 1 : 2;
      CHECK(detail::choose_kernel(a, kH100, idx).resident_ctas_per_sm == ctas90);
      const PlanShape s90 = detail::plan_shape(a, idx, kH100);
      CHECK(s90.num_ctas == ctas90 * kH100.sm_count);
      // The workspace holds the plan of either CTA count, whatever the KV type.
      for (const auto& [s, dev] : {std::pair{s80, a100}, std::pair{s90, kH100}})
        CHECK(std::size_t(detail::workspace_layout(s, s.row_tiles * 16).bytes) <=
              workspace_bytes(a, dev));
    }
  }
}

namespace {

// e4m3fn requests of `rows`-row tiles (heads x q_len of `shapes`): every kernel the launch may
// pick for them (sm_80: mma.sync; sm_90: keys-as-M, or below kFp8CtasMinRowTiles the policy's
// own) keeps one CTA per SM, so the plan and the workspace do not depend on the choice.
void check_one_cta_fp8_plan(int rows, std::initializer_list<std::pair<int, int>> shapes,
                            std::initializer_list<int> batches) {
  const DeviceInfo a100{0, 108, 166912, 80};
  DecodeArgs a = valid_args();
  a.split_mode = SplitMode::automatic;
  REQUIRE(arch::kPolicies[arch::policy_index_for_rows(rows)].fp8_mainloop ==
          arch::Mainloop::keys_as_m);
  for (auto [heads, q_len] : shapes)
    for (int batch : batches) {
      a.num_heads = heads;
      a.q_len = q_len;
      a.batch = batch;
      a.kv_type = DType::fp8_e4m3fn;
      set_packed_strides(a);
      INFO("heads " << heads << " q_len " << q_len << " batch " << batch);
      const int idx = detail::policy_index(a, kH100);
      REQUIRE(arch::kPolicies[idx].rows == rows);
      CHECK(arch::keys_as_m_ctas_per_sm(rows) == arch::kPolicies[idx].ctas_per_sm);
      for (const DeviceInfo& dev : {kH100, a100}) {
        CHECK(detail::choose_kernel(a, dev, idx).resident_ctas_per_sm == 1);
        CHECK(detail::plan_ctas_per_sm(
                  a, idx, detail::choose_kernel(a, dev, idx).resident_ctas_per_sm) == 1);
        const PlanShape sh = detail::plan_shape(a, idx, dev);
        CHECK(std::size_t(detail::workspace_layout(sh, sh.row_tiles * rows).bytes) <=
              workspace_bytes(a, dev));
      }
    }
}

}  // namespace

TEST_CASE("the e4m3fn 32-row plan: one CTA per SM on sm_80 (mma.sync) and sm_90 (keys-as-M)",
          "[validate]") {
  check_one_cta_fp8_plan(32, {{16, 2}, {8, 4}, {12, 2}, {32, 1}}, {1, 32, 128});
}

TEST_CASE(
    "the e4m3fn 64-row plan: one CTA per SM for the warp-specialized and the keys-as-M kernel",
    "[validate]") {
  REQUIRE(arch::kPolicies[arch::policy_index_for_rows(64)].mainloop ==
          arch::Mainloop::warpgroup_split_o);
  check_one_cta_fp8_plan(64, {{16, 4}, {16, 8}, {12, 5}, {128, 1}, {64, 1}}, {1, 31, 32, 128});
}

TEST_CASE("workspace_bytes depends on batch, heads, q_len, split mode and device only",
          "[validate]") {
  std::mt19937 rng(20240611);
  for (const DeviceInfo& dev : {kH100, kMI300}) {
    for (SplitMode m : {SplitMode::automatic, SplitMode::none, SplitMode::fixed}) {
      for (int trial = 0; trial < 60; ++trial) {
        DecodeArgs a = valid_args();
        a.batch = 1 + int(rng() % 300);
        a.num_heads = 1 + int(rng() % 128);
        a.q_len = 1 + int(rng() % 32);
        a.split_mode = m;
        a.num_splits = 1 + int(rng() % 64);
        set_packed_strides(a);
        const std::size_t ws = workspace_bytes(a, dev);
        INFO("mode " << int(m) << " batch " << a.batch << " heads " << a.num_heads << " q_len "
                     << a.q_len << " splits " << a.num_splits << " sms " << dev.sm_count);
        REQUIRE(ws > 0);

        // Per-step data and unrelated arguments: the size stays the same.
        std::vector<std::int32_t> lens(a.batch);
        for (auto& l : lens) l = int(rng() % 200000);
        DecodeArgs b = a;
        b.kv_len = lens.data();
        b.page_size = 1 + int(rng() % 256);
        b.kv_type = DType(rng() % 4);
        b.q_type = rng() % 2 ? DType::bf16 : DType::fp16;
        b.causal = !a.causal;
        b.page_ids = PageIds::csr;
        b.max_pages_per_request = 1 + int(rng() % 5000);
        b.softmax_scale = 3.0f;
        b.deterministic = true;
        b.lse = nullptr;
        CHECK(workspace_bytes(b, dev) == ws);

        // Room for the worst split: fixed mode cuts every request into num_splits pieces,
        // each with O [rows, 512] in the output type (2 bytes) and fp32 LSE [rows].
        const std::size_t per_slot = std::size_t(a.rows()) * (kHeadDimV * 2 + 4);
        if (m == SplitMode::fixed && a.num_splits > 1)
          CHECK(ws >= std::size_t(a.batch) * a.num_splits * per_slot);
        // Automatic mode: whatever the lengths, the plan fits the partial slots reserved.
        if (m == SplitMode::automatic) {
          const PlanShape s = detail::plan_shape(a, detail::policy_index(a, dev), dev);
          std::vector<int> clamped(lens.begin(), lens.end());
          clamped[rng() % clamped.size()] = 150000;  // one long request among the rest
          const HostPlan h = plan_on_host(s, clamped.data());
          CHECK(ws >= std::size_t(h.partials) * per_slot);
        }

        // Allocating for the largest batch serves every smaller one.
        DecodeArgs c = a;
        c.batch = a.batch + 1 + int(rng() % 50);
        CHECK(workspace_bytes(c, dev) >= ws);
      }
    }
  }
  DecodeArgs z = valid_args();
  z.batch = 0;
  CHECK(workspace_bytes(z, kH100) == 0);
}

TEST_CASE("plan_shape: may_shift from the longest length the page mapping allows", "[validate]") {
  // Block tables bound every request by their capacity; CSR capacities live on the device, so
  // only the batch bounds them (kMaxKvLen per request).
  for (int batch : {1, 15, 16, 128, 65535}) {
    for (PageIds ids : {PageIds::block_table, PageIds::csr}) {
      DecodeArgs a = valid_args(ids);
      a.batch = batch;
      const int idx = detail::policy_index(a, kH100);
      const PlanShape sh = detail::plan_shape(a, idx, kH100);
      const int bound = ids == PageIds::block_table ? 40 * 64 : kMaxKvLen;
      INFO("batch " << batch << (ids == PageIds::block_table ? " block table" : " csr"));
      CHECK(sh.may_shift == line_may_shift(sh, bound));
      CHECK(sh.may_shift == (ids == PageIds::csr && batch >= 16));
    }
  }
  // A block table of 2^23 pages of 256 tokens allows kMaxKvLen (aliased pages).
  DecodeArgs big = valid_args();
  big.batch = 16;
  big.page_size = 256;
  big.max_pages_per_request = 1 << 23;
  set_packed_strides(big);
  CHECK(detail::plan_shape(big, detail::policy_index(big, kH100), kH100).may_shift);
  DecodeArgs fixed = valid_args(PageIds::csr);
  fixed.batch = 65535;
  fixed.split_mode = SplitMode::fixed;
  fixed.num_splits = 1;
  CHECK_FALSE(detail::plan_shape(fixed, detail::policy_index(fixed, kH100), kH100).may_shift);
}
