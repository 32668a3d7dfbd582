// Host tests of the decode() arguments that the FlashMLA and FlashInfer adapters (python/mlakit)
// pass straight through: LSE in FlashMLA's [batch, heads, q_len] layout (any order of the LSE
// strides whose rows do not overlap), and an empty cache (null kv) where CSR page ids give no
// request a page. validate() never dereferences a pointer, so aligned host buffers stand in for
// device memory.
#include <catch2/catch.hpp>
#include <cstdint>
#include <limits>
#include <string>

#include "mlakit/api/decode.hpp"
#include "mlakit/core/decode_args.hpp"
#include "mlakit/core/status.hpp"
#include "mlakit/core/validate.hpp"

using namespace mlakit;

namespace {

alignas(64) unsigned char g_bytes[1024];
alignas(64) float g_lse[64];
alignas(64) std::int32_t g_ints[64];

// 3 requests, 16 heads, q_len 4, page size 1, CSR page ids, packed strides, LSE given.
DecodeArgs valid_args() {
  DecodeArgs a;
  a.batch = 3;
  a.num_heads = 16;
  a.q_len = 4;
  a.page_size = 1;
  a.softmax_scale = 0.0721f;
  a.page_ids = PageIds::csr;
  set_packed_strides(a);
  a.q = g_bytes;
  a.kv = g_bytes + 256;
  a.out = g_bytes + 512;
  a.lse = g_lse;
  a.kv_len = g_ints;
  a.kv_indptr = g_ints + 8;
  a.kv_indices = g_ints + 16;
  return a;
}

// LSE [batch, heads, q_len] seen as [batch, q_len, heads]: FlashMLA's softmax_lse.
void flashmla_lse(DecodeArgs& a) {
  a.lse_stride_token = 1;
  a.lse_stride_head = a.q_len;
  a.lse_stride_batch = std::int64_t(a.num_heads) * a.q_len;
}

std::string message(const DecodeArgs& a) {
  const Status s = validate(a);
  return s ? "accepted" : s.message();
}

}  // namespace

TEST_CASE("LSE strides in any order whose rows do not overlap", "[validate][adapters]") {
  DecodeArgs a = valid_args();
  flashmla_lse(a);
  CHECK(message(a) == "accepted");
  // Every permutation of packed [batch, q_len, heads] dimensions.
  const std::int64_t B = a.batch, T = a.q_len, H = a.num_heads;
  const std::int64_t perms[6][3] = {
      // strides of head, token, batch
      {1, H, H * T}, {T, 1, H * T}, {1, H * B, H}, {T * B, 1, T}, {B, B * H, 1}, {B * T, B, 1}};
  for (const auto& p : perms) {
    a = valid_args();
    a.lse_stride_head = p[0];
    a.lse_stride_token = p[1];
    a.lse_stride_batch = p[2];
    INFO(p[0] << " " << p[1] << " " << p[2]);
    CHECK(message(a) == "accepted");
  }
  // Padding between rows is allowed in any order too.
  a = valid_args();
  flashmla_lse(a);
  a.lse_stride_head = 5;  // q_len 4 plus one float
  a.lse_stride_batch = 5 * H + 3;
  CHECK(message(a) == "accepted");
}

TEST_CASE("LSE strides that overlap are rejected by the stride at fault", "[validate][adapters]") {
  DecodeArgs a = valid_args();
  flashmla_lse(a);
  a.lse_stride_head = 3;  // head h + 1 starts inside head h's 4 tokens
  CHECK(message(a) ==
        "lse_stride_head = 3: not in the supported domain (at least 4 elements, at most " +
            std::to_string(((std::int64_t(1) << 60) - 4) / 15) + ")");
  a = valid_args();
  a.lse_stride_head = a.lse_stride_token = 1;  // equal strides: the token dimension overlaps
  CHECK(message(a).rfind("lse_stride_token = 1: not in the supported domain (at least 16 "
                         "elements",
                         0) == 0);
  a = valid_args();
  flashmla_lse(a);
  a.lse_stride_batch = 63;  // one short of heads x q_len
  CHECK(message(a).rfind("lse_stride_batch = 63: not in the supported domain (at least 64", 0) ==
        0);
  a = valid_args();
  a.lse_stride_head = std::numeric_limits<std::int64_t>::max();  // the largest: checked last
  CHECK(message(a).rfind("lse_stride_head = 9223372036854775807:", 0) == 0);
  a = valid_args();
  a.lse_stride_token = -1;  // the smallest: checked first
  CHECK(message(a).rfind("lse_stride_token = -1: not in the supported domain (at least 1 ", 0) ==
        0);
  // Without lse the strides are not read.
  a.lse = nullptr;
  CHECK(message(a) == "accepted");
}

TEST_CASE("an empty cache: kv may be null where CSR ids have no kv_indices",
          "[validate][adapters]") {
  DecodeArgs a = valid_args();
  a.kv = nullptr;
  CHECK(message(a) == "kv = null: not in the supported domain (a device pointer is required)");
  a.kv_indices = nullptr;  // no request has a page: nothing is read from the cache
  CHECK(message(a) == "accepted");
  a.kv = g_bytes + 8;  // a cache that is given is still checked
  CHECK(message(a).rfind("kv = 0x", 0) == 0);
  // Block tables always map pages: kv is required.
  a = valid_args();
  a.page_ids = PageIds::block_table;
  a.block_table = g_ints + 8;
  a.max_pages_per_request = 4;
  a.kv = nullptr;
  a.kv_indices = nullptr;
  CHECK(message(a) == "kv = null: not in the supported domain (a device pointer is required)");
  // The KV strides are checked whether or not kv is given.
  a = valid_args();
  a.kv = nullptr;
  a.kv_indices = nullptr;
  a.kv_stride_page = 8;
  CHECK(message(a).rfind("kv_stride_page = 8:", 0) == 0);
}
