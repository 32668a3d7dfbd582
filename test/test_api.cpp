// Host tests of the public API's defined behaviour where it used to be implicit:
//   set_packed_strides() does not depend on the order in which fields are set;
//   kv_scale multiplies every cache type (16-bit caches included);
//   workspace_bytes() checks the shape it depends on and says why it returns 0;
//   CSR page ids without any page may leave kv_indices null;
//   kv_len beyond a request's page capacity is clamped (page_capacity(), clamp_kv_len());
//   rejection messages print floats with %g and strides in plain words;
//   the host's record of the plan a workspace holds (what PlanStep::decode_only is checked
//   against) follows the plan's inputs and forgets nothing it should not.
// The reference (host memory) stands in for the kernels: both read pages and lengths through
// the same core/ functions (block_table_row_stride, page_capacity, clamp_kv_len).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "mlakit/api/decode.hpp"
#include "mlakit/api/dispatch.hpp"
#include "mlakit/api/plan_record.hpp"
#include "mlakit/core/decode_args.hpp"
#include "mlakit/core/numeric.hpp"
#include "mlakit/core/plan.hpp"
#include "mlakit/core/validate.hpp"
#include "mlakit/reference/decode_reference.hpp"

using namespace mlakit;

namespace {

const DeviceInfo kDev{0, 132, 232448, 90};

// A small problem in host memory: bf16 Q, a 16-bit or fp8 cache, random values, every
// request's pages in a block table and in CSR form (the same pages).
struct Host {
  DecodeArgs a;
  std::vector<std::uint16_t> q, kv16;
  std::vector<std::uint8_t> kv8;
  std::vector<std::int32_t> table, indptr, indices, kv_len;
};

Host make_host(DType kv_type, PageIds ids, std::uint32_t seed) {
  Host h;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  DecodeArgs& a = h.a;
  a.q_type = DType::bf16;
  a.kv_type = kv_type;
  a.batch = 3;
  a.num_heads = 2;
  a.q_len = 2;
  a.page_size = 4;
  a.causal = true;
  a.softmax_scale = 0.05f;
  a.page_ids = ids;
  set_packed_strides(a);  // before max_pages_per_request on purpose: order must not matter
  a.max_pages_per_request = 3;
  const int pages = a.batch * a.max_pages_per_request;
  h.q.resize(std::size_t(a.batch) * a.q_len * a.num_heads * kHeadDimQK);
  for (auto& v : h.q) v = encode_bf16(uni(rng));
  const std::size_t kv_elems = std::size_t(pages) * a.page_size * kHeadDimQK;
  if (is_fp8(kv_type)) {
    h.kv8.resize(kv_elems);
    for (auto& v : h.kv8) v = encode_e4m3fn(uni(rng) * 8.0f);
    a.kv = h.kv8.data();
  } else {
    h.kv16.resize(kv_elems);
    for (auto& v : h.kv16)
      v = kv_type == DType::bf16 ? encode_bf16(uni(rng)) : encode_fp16(uni(rng));
    a.kv = h.kv16.data();
  }
  // Request b owns pages {b, b + 3, b + 6} (interleaved, so a wrong row stride reads another
  // request's pages).
  for (int b = 0; b < a.batch; ++b)
    for (int i = 0; i < a.max_pages_per_request; ++i) h.table.push_back(b + a.batch * i);
  h.indptr.push_back(0);
  for (int b = 0; b < a.batch; ++b) {
    for (int i = 0; i < a.max_pages_per_request; ++i) h.indices.push_back(b + a.batch * i);
    h.indptr.push_back(static_cast<std::int32_t>(h.indices.size()));
  }
  h.kv_len = {12, 7, 3};
  a.q = h.q.data();
  a.kv_len = h.kv_len.data();
  a.block_table = h.table.data();
  a.kv_indptr = h.indptr.data();
  a.kv_indices = h.indices.data();
  return h;
}

reference::ReferenceOutput run(const DecodeArgs& a) {
  reference::ReferenceOutput r;
  const Status s = reference::decode_reference(a, &r);
  INFO(s.message());
  REQUIRE(s.is_ok());
  return r;
}

// A request valid for validate(): dummy aligned host addresses stand in for device memory.
alignas(64) unsigned char g_bytes[1024];
alignas(64) std::int32_t g_ints[64];
DecodeArgs valid_args() {
  DecodeArgs a;
  a.batch = 3;
  a.num_heads = 16;
  a.q_len = 4;
  a.page_size = 64;
  a.softmax_scale = 0.07f;
  a.max_pages_per_request = 40;
  set_packed_strides(a);
  a.q = g_bytes;
  a.kv = g_bytes + 256;
  a.out = g_bytes + 512;
  a.kv_len = g_ints;
  a.block_table = g_ints + 8;
  return a;
}

}  // namespace

TEST_CASE("set_packed_strides: the block-table stride follows max_pages_per_request", "[api]") {
  DecodeArgs early;  // strides set first, capacity later (the order that used to break)
  early.num_heads = 16;
  early.q_len = 4;
  early.page_size = 64;
  set_packed_strides(early);
  early.max_pages_per_request = 40;
  DecodeArgs late = early;
  late.max_pages_per_request = 40;
  set_packed_strides(late);
  CHECK(early.block_table_stride == 0);
  CHECK(block_table_row_stride(early) == 40);
  CHECK(block_table_row_stride(early) == block_table_row_stride(late));
  early.max_pages_per_request = 57;  // and whatever it is changed to afterwards
  CHECK(block_table_row_stride(early) == 57);

  // An explicit stride wins; validate() still rejects one shorter than a row.
  DecodeArgs a = valid_args();
  CHECK(validate(a).is_ok());
  a.block_table_stride = 41;
  CHECK(block_table_row_stride(a) == 41);
  CHECK(validate(a).is_ok());
  a.block_table_stride = 39;
  CHECK(validate(a).message().rfind("block_table_stride = 39:", 0) == 0);
  a.block_table_stride = -1;
  CHECK(validate(a).code() == StatusCode::invalid_argument);

  // The pages read with stride 0 are those of an explicit stride of max_pages_per_request.
  Host h = make_host(DType::bf16, PageIds::block_table, 7);
  REQUIRE(h.a.block_table_stride == 0);
  const reference::ReferenceOutput packed = run(h.a);
  DecodeArgs expl = h.a;
  expl.block_table_stride = expl.max_pages_per_request;
  const reference::ReferenceOutput explicit_out = run(expl);
  CHECK(packed.out == explicit_out.out);
  CHECK(packed.lse == explicit_out.lse);
  // ... and those of the CSR form of the same mapping, so stride 0 is not read as "row 0".
  DecodeArgs csr = h.a;
  csr.page_ids = PageIds::csr;
  CHECK(run(csr).out == packed.out);
}

TEST_CASE("kv_scale multiplies every cache type, 16-bit caches included", "[api]") {
  for (DType kv : {DType::bf16, DType::fp16, DType::fp8_e4m3fn}) {
    INFO(dtype_name(kv));
    Host h = make_host(kv, PageIds::csr, 11);
    const reference::ReferenceOutput base = run(h.a);
    // Scaling by 2 is exact in every format: kv_scale = 2 must equal a cache of doubled values.
    DecodeArgs scaled = h.a;
    scaled.kv_scale = 2.0f;
    Host doubled = make_host(kv, PageIds::csr, 11);
    for (auto& v : doubled.kv16)
      v = kv == DType::bf16 ? encode_bf16(2.0f * decode_bf16(v))
                            : encode_fp16(2.0f * decode_fp16(v));
    for (auto& v : doubled.kv8) v = encode_e4m3fn(2.0f * decode_e4m3fn(v));
    const reference::ReferenceOutput by_scale = run(scaled);
    const reference::ReferenceOutput by_values = run(doubled.a);
    REQUIRE(by_scale.out.size() == by_values.out.size());
    double max_diff = 0.0, max_change = 0.0;
    for (std::size_t i = 0; i < by_scale.out.size(); ++i) {
      max_diff = std::max(max_diff, std::fabs(by_scale.out[i] - by_values.out[i]));
      max_change = std::max(max_change, std::fabs(by_scale.out[i] - base.out[i]));
    }
    CHECK(max_diff < 1e-12);
    CHECK(max_change > 1e-3);  // the scale did change the result

    // validate() accepts any finite positive kv_scale for every cache type.
    DecodeArgs a = valid_args();
    a.kv_type = kv;
    a.kv_scale = 0.5f;
    CHECK(validate(a).is_ok());
    a.kv_scale = 0.0f;
    CHECK(validate(a).message() == "kv_scale = 0: not in the supported domain (finite and > 0)");
  }
}

TEST_CASE("workspace_bytes: a Status for shapes outside the domain, 0 from the size overload",
          "[api]") {
  struct Bad {
    const char* what;
    void (*mutate)(DecodeArgs&);
    const char* prefix;
  };
  const Bad bad[] = {
      {"q_len 33", [](DecodeArgs& a) { a.q_len = 33; }, "q_len = 33:"},
      {"q_len 0", [](DecodeArgs& a) { a.q_len = 0; }, "q_len = 0:"},
      {"heads 0", [](DecodeArgs& a) { a.num_heads = 0; }, "num_heads = 0:"},
      {"heads 129", [](DecodeArgs& a) { a.num_heads = 129; }, "num_heads = 129:"},
      {"batch -1", [](DecodeArgs& a) { a.batch = -1; }, "batch = -1:"},
      {"batch 65536", [](DecodeArgs& a) { a.batch = 65536; }, "batch = 65536:"},
      {"split mode 3", [](DecodeArgs& a) { a.split_mode = SplitMode(3); }, "split_mode = 3:"},
      {"fixed, 0 splits",
       [](DecodeArgs& a) {
         a.split_mode = SplitMode::fixed;
         a.num_splits = 0;
       },
       "num_splits = 0:"},
      {"fixed, batch x splits past the grid",
       [](DecodeArgs& a) {
         a.batch = 2000;
         a.split_mode = SplitMode::fixed;
         a.num_splits = 40;
       },
       "num_splits = 40:"},
  };
  for (const Bad& c : bad) {
    INFO(c.what);
    DecodeArgs a = valid_args();
    c.mutate(a);
    std::size_t bytes = 12345;
    const Status s = workspace_bytes(a, kDev, &bytes);
    CHECK(s.code() == StatusCode::invalid_argument);
    CHECK(s.message().rfind(c.prefix, 0) == 0);
    CHECK(s.message() == validate(a).message());  // the same words decode() would use
    CHECK(bytes == 0);
    CHECK(workspace_bytes(a, kDev) == 0);
  }

  // In the domain: both overloads agree, and no pointer or per-step value is needed.
  DecodeArgs a = valid_args();
  a.q = a.kv = nullptr;
  a.out = nullptr;
  a.kv_len = nullptr;
  a.block_table = nullptr;
  a.page_size = 0;         // not part of the workspace's shape
  a.softmax_scale = 0.0f;  // nor this
  for (int q_len : {1, 7, 32}) {
    a.q_len = q_len;
    std::size_t bytes = 0;
    const Status s = workspace_bytes(a, kDev, &bytes);
    INFO(s.message());
    CHECK(s.is_ok());
    CHECK(bytes > 0);
    CHECK(bytes == workspace_bytes(a, kDev));
  }
  a.batch = 0;  // nothing to compute: Ok and 0 bytes
  std::size_t bytes = 1;
  CHECK(workspace_bytes(a, kDev, &bytes).is_ok());
  CHECK(bytes == 0);
  const Status null_out = workspace_bytes(a, kDev, nullptr);
  CHECK(null_out.code() == StatusCode::invalid_argument);
  CHECK(null_out.message().rfind("bytes = null:", 0) == 0);
}

TEST_CASE("CSR page ids without any page may leave kv_indices null", "[api]") {
  DecodeArgs a = valid_args();
  a.page_ids = PageIds::csr;
  a.block_table = nullptr;
  a.kv_indptr = g_ints;
  a.kv_indices = nullptr;
  CHECK(validate(a).is_ok());
  a.kv_indptr = nullptr;  // the page counts are still required
  CHECK(validate(a).message().rfind("kv_indptr = null:", 0) == 0);

  // Null kv_indices: no request has a page, whatever kv_indptr and kv_len say, so every row
  // sees no key (O = 0, LSE = -inf) and kv_indices is never read.
  Host h = make_host(DType::bf16, PageIds::csr, 3);
  for (int b = 0; b < h.a.batch; ++b) {
    CHECK(page_capacity(h.a, b) == 3 * 4);
    DecodeArgs none = h.a;
    none.kv_indices = nullptr;
    CHECK(page_capacity(none, b) == 0);
    CHECK(clamp_kv_len(none.kv_len[b], page_capacity(none, b)) == 0);
  }
  DecodeArgs none = h.a;
  none.kv_indices = nullptr;
  const reference::ReferenceOutput r = run(none);
  for (double v : r.out) CHECK(v == 0.0);
  for (double l : r.lse) CHECK(l == -std::numeric_limits<double>::infinity());
}

TEST_CASE("kv_len beyond the page capacity is clamped to it, negative kv_len to 0", "[api]") {
  for (PageIds ids : {PageIds::block_table, PageIds::csr}) {
    Host h = make_host(DType::bf16, ids, 5);
    // Capacity 3 pages x 4 tokens = 12 per request.
    for (int b = 0; b < h.a.batch; ++b) CHECK(page_capacity(h.a, b) == 12);
    CHECK(clamp_kv_len(13, 12) == 12);
    CHECK(clamp_kv_len(1 << 30, 12) == 12);
    CHECK(clamp_kv_len(-4, 12) == 0);
    CHECK(clamp_kv_len(5, -8) == 0);
    // Written in place: h.a.kv_len points into h.kv_len.
    for (auto& len : h.kv_len) len = 12;
    const reference::ReferenceOutput full = run(h.a);
    h.kv_len[0] = 13;
    h.kv_len[1] = 1000;
    h.kv_len[2] = 1 << 30;
    const reference::ReferenceOutput past = run(h.a);
    CHECK(past.out == full.out);
    CHECK(past.lse == full.lse);
  }
}

TEST_CASE("messages print floats with %g and strides in plain words", "[api]") {
  DecodeArgs a = valid_args();
  a.softmax_scale = 0.0f;
  CHECK(validate(a).message() == "softmax_scale = 0: not in the supported domain (finite and > 0)");
  a.softmax_scale = -0.5f;
  CHECK(validate(a).message().rfind("softmax_scale = -0.5:", 0) == 0);
  a.softmax_scale = 1e-8f;
  CHECK(validate(a).is_ok());
  a.softmax_scale = std::numeric_limits<float>::quiet_NaN();
  CHECK(validate(a).message().rfind("softmax_scale = nan:", 0) == 0);
  // Each scale finite, their product with log2(e) not: the kernels' one factor would be inf.
  a.softmax_scale = 1e30f;
  a.kv_scale = 1e30f;
  CHECK(validate(a).message() ==
        "softmax_scale x kv_scale = 1e+30 x 1e+30: not in the supported domain (a product below "
        "2.35866e+38)");
  a.kv_scale = 1e9f;  // 1e39: above fp32's largest value
  CHECK(validate(a).message().rfind("softmax_scale x kv_scale = 1e+30 x 1e+09:", 0) == 0);
  a.kv_scale = 1e8f;  // 1e38 x log2(e) = 1.44e38: finite
  CHECK(validate(a).is_ok());
  a.softmax_scale = 1e-30f;  // a product below fp32's range: 0, accepted (uniform weights)
  a.kv_scale = 1e-30f;
  CHECK(validate(a).is_ok());

  a = valid_args();
  a.lse = reinterpret_cast<float*>(g_bytes + 768);
  a.lse_stride_token = 15;  // 16 heads of one float each need 16
  // The upper bound keeps LSE within 2^62 bytes (2^60 floats): 16 heads, then 3 more tokens.
  CHECK(validate(a).message() ==
        "lse_stride_token = 15: not in the supported domain (at least 16 elements, at most " +
            std::to_string(((std::int64_t(1) << 60) - 16) / 3) + ")");
  a = valid_args();
  a.q_stride_head = 580;
  CHECK(validate(a).message() ==
        "q_stride_head = 580: not in the supported domain (at least 576 elements, a multiple of 8, "
        "at most " +
            std::to_string(((std::int64_t(1) << 61) - 576) / 15) + ")");
}

TEST_CASE("plan record: decode_only is allowed only where the workspace holds the call's plan",
          "[api]") {
  using detail::plan_record_of;
  using detail::PlanRegistry;
  DecodeArgs a;
  a.batch = 3;
  a.num_heads = 16;
  a.q_len = 8;
  a.page_size = 64;
  a.max_pages_per_request = 40;
  std::int32_t lens[3] = {}, lens2[3] = {}, table[120] = {}, table2[120] = {}, indptr[4] = {};
  a.kv_len = lens;
  a.block_table = table;
  const PlanShape shape = detail::plan_shape_for(a, 2, kDev, 1);
  PlanRegistry& r = PlanRegistry::instance();
  int ws_a = 0, ws_b = 0;  // two workspace addresses
  const auto rec = plan_record_of(a, shape);
  r.forget(&ws_a);
  r.forget(&ws_b);
  CHECK_FALSE(r.holds(&ws_a, rec));
  r.note(&ws_a, rec);
  CHECK(r.holds(&ws_a, rec));
  CHECK_FALSE(r.holds(&ws_b, rec));
  // The block table's address and entries do not enter a plan; its width does.
  DecodeArgs b = a;
  b.block_table = table2;
  CHECK(r.holds(&ws_a, plan_record_of(b, shape)));
  b.max_pages_per_request = 41;
  CHECK_FALSE(r.holds(&ws_a, plan_record_of(b, shape)));
  // Another kv_len array, page size or plan shape (the kernel choice enters through it: its
  // CTAs per SM set num_ctas): another plan.
  b = a;
  b.kv_len = lens2;
  CHECK_FALSE(r.holds(&ws_a, plan_record_of(b, shape)));
  b = a;
  b.page_size = 32;
  CHECK_FALSE(r.holds(&ws_a, plan_record_of(b, shape)));
  CHECK_FALSE(r.holds(&ws_a, plan_record_of(a, detail::plan_shape_for(a, 2, kDev, 2))));
  CHECK_FALSE(r.holds(&ws_a, plan_record_of(a, detail::plan_shape_for(a, 1, kDev, 1))));
  PlanShape other = shape;
  other.batch = 4;
  CHECK_FALSE(r.holds(&ws_a, plan_record_of(a, other)));
  other = shape;
  other.tile_step = shape.tile_step + 1;
  CHECK_FALSE(r.holds(&ws_a, plan_record_of(a, other)));
  // CSR: the offsets array enters by address, max_pages_per_request (not read) does not.
  DecodeArgs c = a;
  c.page_ids = PageIds::csr;
  c.kv_indptr = indptr;
  r.note(&ws_b, plan_record_of(c, shape));
  DecodeArgs d = c;
  d.max_pages_per_request = 7;
  CHECK(r.holds(&ws_b, plan_record_of(d, shape)));
  d.kv_indptr = indptr + 1;
  CHECK_FALSE(r.holds(&ws_b, plan_record_of(d, shape)));
  CHECK_FALSE(r.holds(&ws_b, rec));  // block-table ids against a CSR plan
  // A later plan replaces the earlier one; forget() leaves nothing.
  r.note(&ws_a, plan_record_of(a, other));
  CHECK_FALSE(r.holds(&ws_a, rec));
  r.forget(&ws_a);
  CHECK_FALSE(r.holds(&ws_a, plan_record_of(a, other)));
  r.forget(&ws_b);
}
