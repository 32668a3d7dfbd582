// decode() on the emulated AMD device (gfx942 or gfx950, by the build), against the
// double-precision reference with NaN-poisoned outputs, unused pages and page tails: every
// axis of the domain at small kv_len (the emulator runs a 128-thread block in about a
// millisecond per KV tile), the shape that aborts a production ROCm stack, padded strides,
// and the global-memory traffic of each call.
#include <catch2/catch.hpp>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_harness.hpp"

using namespace mlakit;
using namespace mlakit::testing;

namespace {

double lse_tolerance(const Case& c) {
  return (c.kv_type == c.q_type || is_fp8(c.kv_type)) ? 1e-4 : 5e-3;
}

// The launches of the last call, one line each: kernel, grid, bytes read and written.
std::string traffic_lines() {
  std::string s;
  for (const emu::LaunchRecord& r : emu::launches()) {
    char line[256];
    std::snprintf(line, sizeof line,
                  "    %-15s grid %ux%ux%u x %u: read %" PRIu64 " B, wrote %" PRIu64 " B\n",
                  r.kernel.c_str(), r.grid.x, r.grid.y, r.grid.z, r.block.x, r.bytes_read,
                  r.bytes_written);
    s += line;
  }
  return s;
}

int g_checked = 0;

void check_outcome(const TestProblem& P, Outcome& o) {
  INFO(P.c.name());
  INFO(o.status.message());
  REQUIRE(o.status.is_ok());
  const auto ref = run_reference(P);
  compare(P, ref, o);
  INFO("rel_l2 " << o.rel_l2 << " max_abs " << o.max_abs << " lse_err " << o.lse_err);
  CHECK(o.rel_l2 < 1e-2);
  CHECK(o.lse_err < lse_tolerance(P.c));
  std::printf("%s %s: rel_l2 %.2e lse_err %.2e\n%s", emu::target().arch_name, P.c.name().c_str(),
              o.rel_l2, o.lse_err, traffic_lines().c_str());
  ++g_checked;
}

// Builds problem P from c, runs decode() on it and checks it; the launches stay recorded.
void run_case(TestProblem& P, const Case& c) {
  build(P, c);
  REQUIRE(P.ok);
  DeviceBuffer ws(workspace_for(P.dev));
  emu::clear_launches();
  Outcome o = run_device(P, ws);
  check_outcome(P, o);
}

void check_case(const Case& c) {
  TestProblem P;
  run_case(P, c);
}

// The seed shape (gpu_harness.hpp) at lengths the emulated device runs quickly.
Case seed_shape() { return testing::seed_shape({0, 5, 1, 64, 65, 300}); }

}  // namespace

TEST_CASE("emulated decode: the seed shape, both fp8 formats, 16 and 12 heads", "[amd-decode]") {
  for (DType kv : {DType::fp8_e4m3fn, DType::fp8_e4m3fnuz})
    for (int h : {16, 12}) {
      Case c = seed_shape();
      c.kv_type = kv;
      c.heads = h;
      c.seed = 10 + h + (kv == DType::fp8_e4m3fnuz);
      check_case(c);
    }
  Case peaky = seed_shape();
  peaky.q_magnitude = 8.0f;  // a sharp softmax
  peaky.seed = 2;
  check_case(peaky);
}

TEST_CASE("emulated decode: a separate rotary cache (kv_rope)", "[amd-decode]") {
  int i = 0;
  for (DType q : {DType::bf16, DType::fp16})
    for (DType kv : {DType::bf16, DType::fp16, DType::fp8_e4m3fn, DType::fp8_e4m3fnuz}) {
      Case c = seed_shape();
      c.q_type = q;
      c.kv_type = kv;
      c.page_size = i % 3 == 0 ? 1 : 16;
      c.ids = i % 2 ? PageIds::block_table : PageIds::csr;
      c.heads = i % 4 == 3 ? 128 : 16;
      c.q_len = i % 4 == 3 ? 1 : 8;
      c.kv_lens = {0, 7, 65, 130};
      c.split_cache = true;
      c.seed = 40 + i++;
      check_case(c);
    }
  // A split instantiation launched directly with a joined cache (kv_rope null) reads the
  // rotary values from columns 512.. of kv. (The converse, a joined instantiation given
  // kv_rope, is test/gpu_decode.cu's "a joined instantiation given kv_rope names it".)
  for (DType kv : {DType::fp8_e4m3fn, DType::fp8_e4m3fnuz}) {
    Case c = seed_shape();
    c.kv_type = kv;
    c.seed = 60 + int(kv);
    TestProblem P;
    build(P, c);
    REQUIRE(P.ok);
    REQUIRE(P.dev.kv_rope == nullptr);
    DeviceBuffer ws(workspace_for(P.dev));
    using SplitAny = Problem<bf16_t, kv_any_t, 0, 0, Causal::dynamic, CacheForm::split>;
    Outcome o = run_device(P, ws, nullptr,
                           [](const DecodeArgs& a, void* w, std::size_t bytes, Stream s) {
                             return Decode<SplitAny>::launch(a, w, bytes, s);
                           });
    check_outcome(P, o);
  }
}

TEST_CASE("emulated decode: every dtype pair", "[amd-decode]") {
  for (DType q : {DType::bf16, DType::fp16})
    for (DType kv : {DType::bf16, DType::fp16, DType::fp8_e4m3fn, DType::fp8_e4m3fnuz}) {
      Case c = seed_shape();
      c.q_type = q;
      c.kv_type = kv;
      c.page_size = 16;
      c.kv_lens = {0, 1, 7, 64, 65, 130};
      c.seed = 20 + int(q) * 4 + int(kv);
      check_case(c);
    }
}

TEST_CASE("emulated decode: q_len 1..32, causal and not, kv_len edges", "[amd-decode]") {
  for (int q : {1, 2, 3, 5, 8, 16, 32}) {
    Case c = seed_shape();
    c.heads = q >= 16 ? 4 : 16;
    c.q_len = q;
    c.page_size = 64;
    // 0, below q_len, equal, one more, both sides of a 64-token page and a 32-token tile.
    c.kv_lens = {0, q / 2, q, q + 1, 63, 64, 65};
    c.seed = 100 + q;
    check_case(c);
    c.causal = false;
    c.kv_type = DType::fp8_e4m3fnuz;
    c.seed += 1000;
    check_case(c);
  }
}

TEST_CASE("emulated decode: head counts 1, 7, 12, 16, 128", "[amd-decode]") {
  for (int h : {1, 7, 12, 16, 128}) {
    Case c = seed_shape();
    c.heads = h;
    c.q_len = h == 128 ? 1 : 3;
    c.page_size = 16;
    c.kv_lens = h == 128 ? std::vector<int>{0, 33, 70} : std::vector<int>{0, 2, 40, 97};
    c.seed = 300 + h;
    check_case(c);
  }
  Case wide = seed_shape();  // 128 heads x 2 tokens: 16 row tiles of one request
  wide.heads = 128;
  wide.q_len = 2;
  wide.kv_lens = {45};
  wide.kv_type = DType::bf16;
  wide.seed = 399;
  check_case(wide);
}

TEST_CASE("emulated decode: page sizes 1, 16, 64, 256, block table and CSR", "[amd-decode]") {
  for (int ps : {1, 16, 64, 256})
    for (PageIds ids : {PageIds::csr, PageIds::block_table}) {
      Case c = seed_shape();
      c.page_size = ps;
      c.ids = ids;
      c.q_len = 2;
      c.kv_lens = {1, 31, 257, 100};
      c.seed = 400 + ps + int(ids);
      check_case(c);
    }
}

TEST_CASE("emulated decode: split none, automatic and fixed; LSE on and off, its formats",
          "[amd-decode]") {
  struct S {
    SplitMode mode;
    int splits;
    LseFormat format;  // of the LSE-on run: rotated over the modes, so that the decode kernel
                       // (split none, fixed 1) and the combine (fixed 3, 64) write two each
  };
  for (S s : {S{SplitMode::none, 0, LseFormat::natural},
              S{SplitMode::automatic, 0, LseFormat::natural_empty_is_inf},
              S{SplitMode::fixed, 1, LseFormat::base2},
              S{SplitMode::fixed, 3, LseFormat::natural_empty_is_inf},
              S{SplitMode::fixed, 64, LseFormat::base2}})
    for (bool lse : {true, false}) {
      Case c = seed_shape();
      c.split = s.mode;
      c.num_splits = s.splits;
      c.lse = lse;
      c.lse_format = s.format;
      c.q_len = 2;
      c.kv_type = DType::bf16;
      c.page_size = 16;
      c.kv_lens = {0, 3, 200, 1000};
      c.seed = 500 + 10 * int(s.mode) + s.splits + (lse ? 0 : 100);
      check_case(c);
    }
}

TEST_CASE("emulated decode: a long request next to short ones", "[amd-decode]") {
  Case c = seed_shape();
  c.q_len = 1;
  c.page_size = 64;
  c.kv_lens = {4000, 1, 0, 70};
  c.seed = 600;
  check_case(c);
}

// Q, KV, O and LSE with padding between heads, tokens, requests and pages: the kernels must
// follow every stride, read no padding (NaN there) and write none (the padding of O and LSE
// stays NaN).
TEST_CASE("emulated decode: padded strides", "[amd-decode]") {
  for (DType kv : {DType::bf16, DType::fp8_e4m3fnuz}) {
    Case c = seed_shape();
    c.kv_type = kv;
    c.heads = 12;
    c.q_len = 3;
    c.page_size = 16;
    c.kv_lens = {5, 40, 0};
    c.seed = 700 + int(kv);
    TestProblem P;
    build(P, c);
    REQUIRE(P.ok);
    const DecodeArgs& a = P.host;
    DecodeArgs d = P.dev;
    const std::int64_t H = a.num_heads, T = a.q_len, B = a.batch;
    d.q_stride_head = kHeadDimQK + 64;
    d.q_stride_token = H * d.q_stride_head + 8;
    d.q_stride_batch = T * d.q_stride_token + 24;
    d.o_stride_head = kHeadDimV + 32;
    d.o_stride_token = H * d.o_stride_head + 8;
    d.o_stride_batch = T * d.o_stride_token + 40;
    d.lse_stride_head = 2;
    d.lse_stride_token = H * 2 + 1;
    d.lse_stride_batch = T * d.lse_stride_token + 3;
    const std::size_t eb = dtype_bytes(kv);
    d.kv_stride_token = kHeadDimQK + 64;
    d.kv_stride_page = std::int64_t(a.page_size) * d.kv_stride_token + 128;
    const std::size_t pages = P.kv.size() / (std::size_t(a.page_size) * kHeadDimQK * eb);

    std::vector<std::uint16_t> q(std::size_t(B * d.q_stride_batch), nan_bits16(c.q_type));
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t h = 0; h < H; ++h)
          std::memcpy(&q[b * d.q_stride_batch + t * d.q_stride_token + h * d.q_stride_head],
                      &P.q[((b * T + t) * H + h) * kHeadDimQK], kHeadDimQK * 2);
    std::vector<std::uint8_t> kvb(pages * d.kv_stride_page * eb);
    for (std::size_t i = 0; i < kvb.size(); i += eb) {  // NaN padding
      const std::uint16_t nan16 = nan_bits16(kv);
      if (eb == 2)
        std::memcpy(&kvb[i], &nan16, 2);
      else
        kvb[i] = nan_bits8(kv);
    }
    for (std::size_t p = 0; p < pages; ++p)
      for (int r = 0; r < a.page_size; ++r)
        std::memcpy(&kvb[(p * d.kv_stride_page + r * d.kv_stride_token) * eb],
                    &P.kv[(p * a.page_size + r) * kHeadDimQK * eb], kHeadDimQK * eb);
    const std::size_t out_elems = std::size_t(B * d.o_stride_batch);
    const std::size_t lse_elems = std::size_t(B * d.lse_stride_batch);
    DeviceBuffer dq(q.size() * 2), dkv(kvb.size()), dout(out_elems * 2), dlse(lse_elems * 4);
    REQUIRE(gpu_h2d(dq.ptr, q.data(), q.size() * 2));
    REQUIRE(gpu_h2d(dkv.ptr, kvb.data(), kvb.size()));
    const std::vector<std::uint16_t> nan_out(out_elems, 0xFFFF);
    const std::vector<float> nan_lse(lse_elems, NAN);
    REQUIRE(gpu_h2d(dout.ptr, nan_out.data(), out_elems * 2));
    REQUIRE(gpu_h2d(dlse.ptr, nan_lse.data(), lse_elems * 4));
    d.q = dq.ptr;
    d.kv = dkv.ptr;
    d.out = dout.ptr;
    d.lse = dlse.as<float>();
    DeviceBuffer ws(workspace_for(d));
    emu::clear_launches();
    Outcome o;
    o.status = decode(d, ws.ptr, ws.bytes, nullptr);
    REQUIRE(o.status.is_ok());
    REQUIRE(gpu_sync());
    std::vector<std::uint16_t> out(out_elems);
    std::vector<float> lse(lse_elems);
    REQUIRE(gpu_d2h(out.data(), dout.ptr, out_elems * 2));
    REQUIRE(gpu_d2h(lse.data(), dlse.ptr, lse_elems * 4));
    // Gather into the packed order the comparison reads; mark what was visited.
    std::vector<bool> visited_out(out_elems, false), visited_lse(lse_elems, false);
    o.out.resize(P.out_elems);
    o.lse.resize(P.lse_elems);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t h = 0; h < H; ++h) {
          const std::size_t row = std::size_t((b * T + t) * H + h);
          const std::size_t ob =
              std::size_t(b * d.o_stride_batch + t * d.o_stride_token + h * d.o_stride_head);
          for (int e = 0; e < kHeadDimV; ++e) {
            o.out[row * kHeadDimV + e] = out[ob + e];
            visited_out[ob + e] = true;
          }
          const std::size_t lb =
              std::size_t(b * d.lse_stride_batch + t * d.lse_stride_token + h * d.lse_stride_head);
          o.lse[row] = lse[lb];
          visited_lse[lb] = true;
        }
    std::size_t written_padding = 0;
    for (std::size_t i = 0; i < out_elems; ++i)
      if (!visited_out[i] && out[i] != 0xFFFF) ++written_padding;
    for (std::size_t i = 0; i < lse_elems; ++i)
      if (!visited_lse[i] && !std::isnan(lse[i])) ++written_padding;
    CHECK(written_padding == 0);
    check_outcome(P, o);
  }
}

TEST_CASE("emulated decode: out-of-domain arguments return a Status", "[amd-decode]") {
  TestProblem P;
  build(P, seed_shape());
  REQUIRE(P.ok);
  DeviceBuffer ws(workspace_for(P.dev));
  DecodeArgs a = P.dev;
  a.q_len = 33;
  Status s = decode(a, ws.ptr, ws.bytes, nullptr);
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK(s.message().find("q_len = 33") != std::string::npos);
  a = P.dev;
  a.num_heads = 129;
  s = decode(a, ws.ptr, ws.bytes, nullptr);
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK(s.message().find("num_heads = 129") != std::string::npos);
  a = P.dev;
  a.page_size = 257;
  s = decode(a, ws.ptr, ws.bytes, nullptr);
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK(s.message().find("page_size = 257") != std::string::npos);
  s = decode(P.dev, ws.ptr, 16, nullptr);
  CHECK(s.code() == StatusCode::workspace_too_small);
  emu::clear_launches();
  a = P.dev;
  a.q = nullptr;
  s = decode(a, ws.ptr, ws.bytes, nullptr);
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK(emu::launches().empty());  // nothing was launched for a rejected call
}

// Bytes each kernel reads and writes for the speculative-decoding shapes, against the bytes
// the shape needs: Q, the cache once per request, the page ids, kv_len, O and LSE.
TEST_CASE("emulated decode: global-memory traffic per call", "[amd-traffic]") {
  struct Shape {
    int heads, q_len;
  };
  std::printf("%s traffic: batch 2, kv_len 4096, page 64, CSR, e4m3 cache, LSE, split none\n",
              emu::target().arch_name);
  for (Shape s : {Shape{16, 1}, Shape{16, 2}, Shape{16, 4}, Shape{16, 8}, Shape{12, 8}}) {
    Case c = seed_shape();
    c.kv_type = emu::target().gfx == 942 ? DType::fp8_e4m3fnuz : DType::fp8_e4m3fn;
    c.heads = s.heads;
    c.q_len = s.q_len;
    c.page_size = 64;
    c.kv_lens = {4096, 4096};
    c.split = SplitMode::none;
    c.seed = 800 + s.heads * s.q_len;
    TestProblem P;
    run_case(P, c);
    std::uint64_t read = 0, written = 0;
    for (const emu::LaunchRecord& r : emu::launches()) {
      read += r.bytes_read;
      written += r.bytes_written;
    }
    const std::uint64_t rows = std::uint64_t(c.heads) * c.q_len * c.kv_lens.size();
    std::uint64_t kv = 0, pages = 0;
    for (int l : c.kv_lens) {
      kv += std::uint64_t(l) * kHeadDimQK * dtype_bytes(c.kv_type);
      pages += (l + c.page_size - 1) / c.page_size;
    }
    const std::uint64_t need_read =
        rows * kHeadDimQK * 2 + kv + pages * 4 + (c.kv_lens.size() + 1) * 4 + c.kv_lens.size() * 4;
    const std::uint64_t need_write = rows * kHeadDimV * 2 + rows * 4;
    std::printf("  %3d heads x q_len %2d: read %10" PRIu64 " B (%.2fx the %" PRIu64
                " B needed), wrote %8" PRIu64 " B (%.2fx)\n",
                c.heads, c.q_len, read, double(read) / double(need_read), need_read, written,
                double(written) / double(need_write));
    CHECK(read >= kv);                                // the cache is read at least once
    CHECK(double(read) <= 1.05 * double(need_read));  // and once: within 5% of the need
    CHECK(double(written) <= 1.05 * double(need_write));
  }
}
