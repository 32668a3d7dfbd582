// GPU tests of decode(): every axis of the domain against the double-precision reference,
// on random data with NaN-poisoned outputs, unused pages and page tails.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "gpu_harness.hpp"
#include "gpu_require.hpp"

using namespace mlakit;
using namespace mlakit::testing;

namespace {

// The seed shape over lengths that include 0 and values below q_len.
Case crash_shape() { return seed_shape({0, 5, 1, 64, 65, 777, 2048}); }

// 16-bit KV of the other type is rounded to the compute type, so S carries that rounding.
double lse_tolerance(const Case& c) {
  return (c.kv_type == c.q_type || is_fp8(c.kv_type)) ? 1e-4 : 5e-3;
}

int g_cases = 0;

// Runs problem P (built from P.c) with workspace ws and checks it against the reference.
void run_and_check(TestProblem& P, DeviceBuffer& ws, const Launcher& launch = nullptr) {
  Outcome o = run_device(P, ws, nullptr, launch);
  INFO(o.status.message());
  REQUIRE(o.status.is_ok());
  const auto ref = run_reference(P);
  compare(P, ref, o);
  INFO("rel_l2 " << o.rel_l2 << " max_abs " << o.max_abs << " lse_err " << o.lse_err);
  CHECK(o.rel_l2 < 1e-2);
  CHECK(o.lse_err < lse_tolerance(P.c));
  ++g_cases;
}

void check_case(const Case& c, const Launcher& launch = nullptr) {
  INFO(c.name());
  TestProblem P;
  build(P, c);
  REQUIRE(P.ok);
  DeviceBuffer ws(workspace_for(P.dev));
  run_and_check(P, ws, launch);
}

// The plan decode() makes for problem P on this device, computed on the host from P's lengths
// (within each request's capacity by build()); `wl` receives the workspace layout of that plan.
HostPlan host_plan_of(const TestProblem& P, detail::WorkspaceLayout* wl = nullptr) {
  DeviceInfo dev;
  REQUIRE(cached_device_info(&dev));
  const int policy = detail::policy_index(P.dev, dev);
  const PlanShape shape = detail::plan_shape(P.dev, policy, dev);
  if (wl != nullptr)
    *wl = detail::workspace_layout(shape, shape.row_tiles * arch::kPolicies[policy].rows);
  return plan_on_host(shape, P.kv_len.data());
}

}  // namespace

TEST_CASE("crash shape: bf16 Q, fp8 KV, 16 heads, q_len 8, causal, page 1 CSR", "[gpu]") {
  MLAKIT_REQUIRE_GPU();
  check_case(crash_shape());
  Case peaky = crash_shape();
  peaky.q_magnitude = 8.0f;  // sharp softmax
  peaky.seed = 2;
  check_case(peaky);
}

// e4m3fn KV is read raw by the matrix atom with Q in f16 times a power of two per row; rows
// of bf16 Q far outside the f16 range (2^+-40 around ordinary rows) must come out exact.
TEST_CASE("bf16 Q rows over a wide exponent range with fp8 KV", "[gpu]") {
  MLAKIT_REQUIRE_GPU();
  for (int q_len : {1, 8}) {
    Case c = crash_shape();
    c.q_len = q_len;
    c.q_row_octaves = 40;
    c.lse_relative = true;
    c.seed = 40 + q_len;
    check_case(c);
    c.heads = 12;  // dynamic instantiation
    c.q_row_octaves = 60;
    c.kv_lens = {1, 300, 5000};
    check_case(c);
  }
  // 16 heads x q_len 8 at 16 requests (32 row tiles): the 64-row keys-as-M kernel, whose
  // exponent takes the rounded product of score and row scale for such rows.
  Case c = crash_shape();
  c.q_row_octaves = 40;
  c.lse_relative = true;
  c.seed = 48;
  c.kv_lens = {0, 5, 1, 64, 65, 777, 2048, 9, 130, 8, 4000, 300, 63, 1000, 17, 2500};
  REQUIRE(c.kv_lens.size() * 2 >= std::size_t(arch::kFp8CtasMinRowTiles));
  check_case(c);
}

// The split-O kernel (64-row tiles of 16-bit KV, and of e4m3fn KV below
// arch::kFp8CtasMinRowTiles) folds the score factor into its exponential's fma and takes the
// rounded products in a warp with a row at or beyond kWideBase: rows of Q 2^+-40 around
// ordinary ones, and scales whose product underflows (factor kMinRowScale), on bf16 KV with
// the causal mask in the last tiles. (f16 KV runs the same softmax; an underflowing pair of
// the form used here would also put O below f16's range, so it is not repeated for f16.)
TEST_CASE("split-O softmax: wide rows and underflowing scales with bf16 KV", "[gpu]") {
  MLAKIT_REQUIRE_GPU();
  Case c = crash_shape();
  c.kv_type = DType::bf16;
  c.page_size = 64;
  c.kv_lens = {1, 300, 5000};
  c.seed = 80;
  c.q_row_octaves = 40;
  c.lse_relative = true;
  check_case(c);
  c.q_row_octaves = 0;
  c.lse_relative = false;
  c.softmax_scale = 1e-23f;
  c.kv_scale = 1e-23f;
  c.seed = 90;
  check_case(c);
}

// Scales inside the domain (finite, > 0) whose product with log2(e) underflows to 0 in
// fp32 (scores all 0: every visible key weighs the same), and rows of Q near the bottom of
// bf16's range with a small scale (the row scale of the f16 operand mode then near fp32's
// smallest values). 16 requests, causal (masked tiles): at q_len 1, 2 and 8 that is 16 row
// tiles of 16 and 32 rows and 32 of 64 rows, on the keys-as-M kernels of e4m3fn KV.
TEST_CASE("scales whose product underflows and Q rows at the bottom of bf16's range", "[gpu]") {
  MLAKIT_REQUIRE_GPU();
  for (int q_len : {1, 2, 8}) {
    Case c = crash_shape();
    c.q_len = q_len;
    c.softmax_scale = 1e-23f;
    c.kv_scale = 1e-23f;
    c.seed = 60 + q_len;
    c.kv_lens = {0, 5, 1, 64, 65, 777, 2048, 9, 130, 8, 4000, 300, 63, 1000, 17, 2500};
    check_case(c);
    c.softmax_scale = 0.07f;
    c.kv_scale = 1e-9f;  // x 2^-120 (the largest row scale exponent): below fp32's range
    c.q_row_octaves = 110;
    c.lse_relative = true;
    c.seed += 10;
    check_case(c);
  }
}

// The converting instantiation (kv_any_t) still serves e4m3fn KV when a user names it.
TEST_CASE("kv_any_t instantiation with e4m3fn KV", "[gpu]") {
  MLAKIT_REQUIRE_GPU();
  for (int q_len : {1, 3, 8}) {
    Case c = crash_shape();
    c.q_len = q_len;
    c.heads = 16;
    c.seed = 70 + q_len;
    check_case(c, [](const DecodeArgs& a, void* ws, std::size_t bytes, Stream s) {
      return Decode<Problem<bf16_t, kv_any_t>>::launch(a, ws, bytes, s);
    });
  }
}

TEST_CASE("every head count with the crash shape", "[gpu]") {
  MLAKIT_REQUIRE_GPU();
  for (int h : {1, 8, 12, 16, 32, 64, 128}) {
    Case c = crash_shape();
    c.heads = h;
    c.seed = 100 + h;
    if (h >= 64) c.kv_lens = {0, 3, 129, 700};
    check_case(c);
  }
}

TEST_CASE("every q_len with the crash shape", "[gpu]") {
  MLAKIT_REQUIRE_GPU();
  for (int q : {1, 2, 3, 4, 5, 7, 8, 16, 32}) {
    Case c = crash_shape();
    c.q_len = q;
    c.seed = 200 + q;
    c.kv_lens = {0, q / 2, q, q + 1, 500, 1500};
    check_case(c);
    c.causal = false;
    c.seed += 1000;
    check_case(c);
  }
}

TEST_CASE("every dtype pair", "[gpu]") {
  MLAKIT_REQUIRE_GPU();
  for (DType q : {DType::bf16, DType::fp16})
    for (DType kv : {DType::bf16, DType::fp16, DType::fp8_e4m3fn, DType::fp8_e4m3fnuz}) {
      Case c = crash_shape();
      c.q_type = q;
      c.kv_type = kv;
      c.seed = 300 + int(q) * 10 + int(kv);
      check_case(c);
      c.heads = 12;  // dynamic instantiation for every pair too
      c.q_len = 3;
      c.seed += 50;
      check_case(c);
    }
}

TEST_CASE("page sizes and page-id formats", "[gpu]") {
  MLAKIT_REQUIRE_GPU();
  for (int ps : {1, 3, 16, 64, 100, 256})
    for (PageIds ids : {PageIds::block_table, PageIds::csr}) {
      Case c = crash_shape();
      c.page_size = ps;
      c.ids = ids;
      c.seed = 400 + ps * 2 + int(ids);
      check_case(c);
    }
}

// The 16-row e4m3fn tile has two kernels, chosen by page size: page ids loaded a tile ahead
// below the 32-token tile, right before the copies from 32 up. Both sides of the boundary,
// the table instantiation (12 heads) and the fixed 16-head one, both Q types, both id formats,
// lengths that end inside a tile and a page.
TEST_CASE("16-row e4m3fn tile: page sizes on both sides of its kernel choice", "[gpu]") {
  MLAKIT_REQUIRE_GPU();
  for (int ps : {1, 3, 16, 31, 32, 33, 64})
    for (int heads : {16, 12})
      for (DType q : {DType::bf16, DType::fp16}) {
        Case c = crash_shape();
        c.q_type = q;
        c.heads = heads;
        c.q_len = 1;
        c.page_size = ps;
        c.ids = (ps + heads) % 2 == 0 ? PageIds::block_table : PageIds::csr;
        c.kv_lens = {0, 1, 31, 33, 95, 1000, 4099};
        c.seed = 1900 + ps * 4 + heads + int(q);
        check_case(c);
      }
}

TEST_CASE("split modes, LSE on and off, every LSE format", "[gpu]") {
  MLAKIT_REQUIRE_GPU();
  struct S {
    SplitMode m;
    int n;
  };
  // The crash shape's lengths include 0 (rows without keys: -inf, or +inf in FlashMLA's
  // format) and requests the split plans cut (the combine writes their LSE) next to ones they
  // do not (the decode kernel does).
  for (S s : {S{SplitMode::automatic, 0}, S{SplitMode::none, 0}, S{SplitMode::fixed, 1},
              S{SplitMode::fixed, 3}, S{SplitMode::fixed, 7}, S{SplitMode::fixed, 64}})
    for (int lse = 0; lse <= 3; ++lse) {
      Case c = crash_shape();
      c.split = s.m;
      c.num_splits = s.n;
      c.lse = lse > 0;
      if (lse > 0) c.lse_format = LseFormat(lse - 1);
      c.seed = 500 + int(s.m) * 100 + s.n + lse;
      check_case(c);
    }
}

// kv_rope: the latent and rotary values in two caches with strides of their own (NaN past
// each row's values), for each kernel family and copy form: the 64-row kernels (bf16 and
// fp16 KV, e4m3fn read raw, the other formats converted by the producer), the 16- and
// 32-row ones, 128 heads, every page size class, split plans, both page-id formats.
TEST_CASE("a separate rotary cache (kv_rope) in every kernel family", "[gpu]") {
  MLAKIT_REQUIRE_GPU();
  struct K {
    DType q, kv;
    int heads, q_len, page;
    SplitMode split;
  };
  const K ks[] = {{DType::bf16, DType::fp8_e4m3fn, 16, 8, 1, SplitMode::automatic},
                  {DType::bf16, DType::fp8_e4m3fn, 16, 8, 64, SplitMode::fixed},
                  {DType::bf16, DType::bf16, 16, 8, 64, SplitMode::automatic},
                  {DType::fp16, DType::fp16, 16, 4, 16, SplitMode::none},
                  {DType::bf16, DType::fp16, 16, 8, 64, SplitMode::automatic},
                  {DType::fp16, DType::fp8_e4m3fnuz, 16, 8, 64, SplitMode::automatic},
                  {DType::bf16, DType::fp8_e4m3fn, 16, 1, 3, SplitMode::automatic},
                  {DType::fp16, DType::fp8_e4m3fn, 12, 1, 64, SplitMode::fixed},
                  {DType::bf16, DType::bf16, 16, 1, 1, SplitMode::automatic},
                  {DType::bf16, DType::fp8_e4m3fn, 16, 2, 64, SplitMode::automatic},
                  {DType::bf16, DType::fp8_e4m3fn, 128, 1, 64, SplitMode::automatic},
                  {DType::fp16, DType::bf16, 128, 2, 256, SplitMode::none},
                  {DType::bf16, DType::fp8_e4m3fnuz, 7, 5, 16, SplitMode::automatic},
                  {DType::fp16, DType::fp8_e4m3fn, 32, 32, 64, SplitMode::automatic}};
  int i = 0;
  for (const K& k : ks) {
    Case c = crash_shape();
    c.q_type = k.q;
    c.kv_type = k.kv;
    c.heads = k.heads;
    c.q_len = k.q_len;
    c.page_size = k.page;
    c.split = k.split;
    c.num_splits = 3;
    c.ids = i % 2 ? PageIds::block_table : PageIds::csr;
    c.split_cache = true;
    c.seed = 2500 + i++;
    check_case(c);
  }
}

// A joined instantiation launched directly with kv_rope set names it instead of reading the
// rotary values from columns 512.. of kv (no kernel runs).
TEST_CASE("a joined instantiation given kv_rope names it", "[gpu]") {
  MLAKIT_REQUIRE_GPU();
  Case c = crash_shape();
  c.kv_type = DType::fp16;
  c.split_cache = true;
  TestProblem P;
  build(P, c);
  REQUIRE(P.ok);
  DeviceBuffer ws(workspace_for(P.dev));
  const Status s = Decode<Problem<bf16_t, kv_any_t>>::launch(P.dev, ws.ptr, ws.bytes, nullptr);
  INFO(s.message());
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK(s.message().rfind("kv_rope = non-null:", 0) == 0);
}

TEST_CASE("self-planned calls leave the planner's plan in the workspace", "[gpu]") {
  // Automatic mode with few requests: the decode kernel plans for itself. 16 rows (16 heads x
  // q_len 1): with an e4m3fn cache the keys-as-M kernel on sm_90a, the mma.sync kernel
  // elsewhere, below kFp8CtasMinRowTiles requests (batch 1 and 3; elsewhere up to
  // kSelfPlanMaxBatch); with a bf16 cache the mma.sync kernel below kSplitOMinRequests16 requests.
  // Its output must match the reference and the plan it stores for the combine (header,
  // RequestPlan[batch]) must equal plan_on_host(). The other calls take the planner kernel:
  // the same checks hold.
  MLAKIT_REQUIRE_GPU();
  std::mt19937 rng(0x5e1f);
  for (DType kv : {DType::fp8_e4m3fn, DType::bf16})
    for (int batch : {1, 3, 37, 128, 129}) {
      Case c;
      c.kv_type = kv;
      c.heads = 16;
      c.q_len = 1;
      c.page_size = 1 + int(rng() % 64);
      c.kv_lens.resize(batch);
      for (int& l : c.kv_lens) l = rng() % 4 == 0 ? 0 : int(rng() % 3000);
      c.kv_lens[rng() % batch] = 20000;  // one long request among short ones: split
      c.seed = 900 + batch;
      INFO(c.name());
      TestProblem P;
      build(P, c);
      REQUIRE(P.ok);
      DeviceBuffer ws(workspace_for(P.dev));
      run_and_check(P, ws);

      detail::WorkspaceLayout wl;
      const HostPlan h = host_plan_of(P, &wl);
      int header[3];
      REQUIRE(gpu_d2h(header, static_cast<char*>(ws.ptr) + wl.plan.header_offset, sizeof header));
      CHECK(header[0] == h.total);
      CHECK(header[1] == h.per_cta);
      CHECK(header[2] == h.partials);
      CHECK(h.partials > 0);
      std::vector<RequestPlan> d(batch);
      REQUIRE(gpu_d2h(d.data(), static_cast<char*>(ws.ptr) + wl.plan.requests_offset,
                      batch * sizeof(RequestPlan)));
      for (int b = 0; b < batch; ++b) {
        INFO("request " << b);
        CHECK(std::memcmp(&d[b], &h.requests[b], sizeof(RequestPlan)) == 0);
      }
    }
}

TEST_CASE("length mixes: 0, below q_len, 1 to 100k in one batch", "[gpu]") {
  MLAKIT_REQUIRE_GPU();
  Case c = crash_shape();
  c.q_len = 2;
  c.kv_lens = {100000, 1, 0, 100, 1000, 2};
  c.seed = 600;
  check_case(c);
  Case d = crash_shape();
  d.kv_lens.assign(40, 0);  // a larger batch of short and empty requests
  for (int i = 0; i < 40; ++i) d.kv_lens[i] = (i * 37) % 90;
  d.seed = 601;
  check_case(d);
}

// The largest batch the domain allows (kMaxBatch = 65535), planned by the planner kernel's
// large block: mostly empty and short requests with a few long ones; automatic mode splits
// the requests that cross a CTA boundary of the line. One or two rows per request
// (1 head x q_len 1 or 2) and 32-token pages keep Q and the host reference small; the
// kernels of the 16-row tile run it (e4m3fn: the keys-as-M kernel on sm_90a; bf16: the
// warp-specialized 64-row tile, padded, there; more rows at this batch would need gigabytes
// of Q).
TEST_CASE("batch 65535: empty, short and long requests in one call", "[gpu]") {
  MLAKIT_REQUIRE_GPU();
  struct V {
    DType kv;
    int heads, q_len;
    SplitMode mode;
  };
  for (V v :
       {V{DType::fp8_e4m3fn, 1, 1, SplitMode::automatic},
        V{DType::bf16, 1, 1, SplitMode::automatic}, V{DType::fp8_e4m3fn, 1, 1, SplitMode::none},
        V{DType::fp8_e4m3fn, 1, 2, SplitMode::automatic}}) {
    Case c;
    c.q_type = DType::bf16;
    c.kv_type = v.kv;
    c.heads = v.heads;
    c.q_len = v.q_len;
    c.page_size = 32;
    c.ids = PageIds::csr;
    c.split = v.mode;
    c.seed = 6553 + int(v.kv) + 10 * v.q_len + 100 * int(v.mode);
    std::mt19937 rng(static_cast<unsigned>(c.seed));
    c.kv_lens.assign(kMaxBatch, 0);
    for (int& l : c.kv_lens) {
      const unsigned r = rng() % 512;
      l = r < 256 ? 0 : r < 508 ? int(rng() % 16) : int(rng() % 1000);
    }
    // The line is not aligned to CTA boundaries, so requests that cross one are split.
    for (int k = 0; k < 4; ++k) c.kv_lens[rng() % kMaxBatch] = 5000 + int(rng() % 5000);
    INFO(c.name());
    TestProblem P;
    build(P, c);
    REQUIRE(P.ok);
    DeviceBuffer ws(workspace_for(P.dev));
    run_and_check(P, ws);
    // The case reaches the combine: the plan splits some requests (none in mode none).
    const HostPlan h = host_plan_of(P);
    INFO("partials " << h.partials << ", CTAs " << h.ctas.size());
    CHECK((v.mode == SplitMode::none ? h.partials == 0 : h.partials > 0));
  }
}

TEST_CASE("random cross-product sample of the domain", "[gpu]") {
  MLAKIT_REQUIRE_GPU();
  std::mt19937 rng(7);
  const int heads[] = {1, 8, 12, 16, 32, 64, 128};
  const int qlens[] = {1, 2, 3, 4, 5, 7, 8, 16, 32};
  const int pages[] = {1, 16, 64, 5};
  for (int i = 0; i < 40; ++i) {
    Case c;
    c.q_type = rng() % 2 ? DType::bf16 : DType::fp16;
    c.kv_type = DType(rng() % 4);
    c.heads = heads[rng() % 7];
    c.q_len = qlens[rng() % 9];
    if (c.heads * c.q_len > 1024) c.q_len = 1024 / c.heads;  // keeps the reference quick
    c.causal = rng() % 2;
    c.page_size = pages[rng() % 4];
    c.ids = rng() % 2 ? PageIds::csr : PageIds::block_table;
    c.split = SplitMode(rng() % 3);
    c.num_splits = 1 + rng() % 9;
    c.lse = rng() % 2;
    const int n = 1 + rng() % 5;
    c.kv_lens.clear();
    for (int j = 0; j < n; ++j) c.kv_lens.push_back(rng() % 3 == 0 ? rng() % 10 : rng() % 1500);
    c.seed = 700 + i;
    check_case(c);
  }
}

TEST_CASE("deterministic: repeated runs are bitwise equal", "[gpu]") {
  MLAKIT_REQUIRE_GPU();
  for (SplitMode m : {SplitMode::automatic, SplitMode::fixed}) {
    Case c = crash_shape();
    c.split = m;
    c.num_splits = 5;
    c.kv_lens = {5000, 17, 3000};
    TestProblem P;
    build(P, c);
    REQUIRE(P.ok);
    P.dev.deterministic = true;
    DeviceBuffer ws(workspace_for(P.dev));
    Outcome a = run_device(P, ws);
    Outcome b = run_device(P, ws);
    REQUIRE(a.status.is_ok());
    REQUIRE(b.status.is_ok());
    CHECK(a.out == b.out);
    CHECK(std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4) == 0);
  }
}

namespace {

// A model step: `layers` problems of one shape and one set of lengths (so one plan), each
// with its own data, scales and page order (seeds seed, seed + 1, ...).
struct PlanFamily {
  const char* what;
  DType kv;
  int heads, q_len;
  std::vector<int> lens;
  SplitMode split;
  int num_splits;
  bool planner;  // the decode kernel reads the planner's plan (else it plans for itself)

  // The family's call at pages of 64 tokens (CSR, seed 1 unless the caller sets them).
  Case case_of() const {
    Case c;
    c.kv_type = kv;
    c.heads = heads;
    c.q_len = q_len;
    c.page_size = 64;
    c.kv_lens = lens;
    c.split = split;
    c.num_splits = num_splits;
    return c;
  }
};

std::vector<PlanFamily> plan_families_full() {
  std::mt19937 rng(0x91a2);
  std::vector<int> many(34);
  for (int& l : many) l = rng() % 5 == 0 ? 0 : 1 + int(rng() % 2500);
  many[3] = 6000;
  const SplitMode kAuto = SplitMode::automatic;
  return {
      {"16 rows, e4m3fn, 3 requests", DType::fp8_e4m3fn, 16, 1, {5000, 300, 0}, kAuto, 0, false},
      {"16 rows, bf16, 3 requests", DType::bf16, 16, 1, {5000, 300, 0}, kAuto, 0, false},
      {"16 rows, e4m3fn, 34 requests", DType::fp8_e4m3fn, 16, 1, many, kAuto, 0, true},
      {"64 rows, bf16", DType::bf16, 16, 8, {6000, 700, 0, 65}, kAuto, 0, true},
      {"64 rows, e4m3fn, 1 request", DType::fp8_e4m3fn, 16, 8, {6000}, kAuto, 0, true},
      {"64 rows, e4m3fn, 34 requests", DType::fp8_e4m3fn, 16, 8, many, kAuto, 0, true},
      {"96 rows, fixed splits", DType::fp8_e4m3fn, 12, 8, {3000, 50}, SplitMode::fixed, 5, true},
      {"64 rows, split none", DType::bf16, 16, 4, {3000, 50}, SplitMode::none, 0, true},
  };
}

// On the emulated AMD device (a CPU) three of them with a quarter of the keys: a 16-row
// request set, a 64-row one and fixed splits.
std::vector<PlanFamily> plan_families() {
#if defined(MLAKIT_EMULATED_AMD)
  std::vector<PlanFamily> all = plan_families_full(), some;
  for (int i : {0, 3, 6}) {
    some.push_back(all[i]);
    for (int& l : some.back().lens) l /= 4;
  }
  return some;
#else
  return plan_families_full();
#endif
}

// Runs P with plan step `step` (its outputs NaN-poisoned first) and checks it against the
// reference.
void check_step(TestProblem& P, DeviceBuffer& ws, PlanStep step) {
  P.dev.plan_step = step;
  run_and_check(P, ws);
  P.dev.plan_step = PlanStep::plan_and_decode;
}

}  // namespace

TEST_CASE("plan steps: one plan serves every layer of a step", "[gpu]") {
  // Layer 0 plans (plan_and_decode, or plan_only first), the other layers decode_only with
  // the plan left in the one workspace; every layer's output must match the reference. A
  // plan_only call writes no output.
  MLAKIT_REQUIRE_GPU();
  constexpr int kLayers = 3;
  for (const PlanFamily& f : plan_families())
    for (bool plan_first : {false, true}) {
      INFO(f.what << (plan_first ? ", plan_only first" : ", layer 0 plans"));
      std::vector<TestProblem> layers(kLayers);
      for (int l = 0; l < kLayers; ++l) {
        Case c = f.case_of();
        c.ids = plan_first ? PageIds::block_table : PageIds::csr;
        c.seed = 7100 + 10 * l + (plan_first ? 1 : 0);
        build(layers[l], c);
        REQUIRE(layers[l].ok);
        // A model's layers share the step's lengths and CSR offsets (equal values here); each
        // has its own cache, page order (kv_indices or block table) and Q.
        layers[l].dev.kv_len = layers[0].dev.kv_len;
        layers[l].dev.kv_indptr = layers[0].dev.kv_indptr;
      }
      DeviceBuffer ws(workspace_for(layers[0].dev));
      if (plan_first) {
        layers[0].dev.plan_step = PlanStep::plan_only;
        Outcome o = run_device(layers[0], ws);
        layers[0].dev.plan_step = PlanStep::plan_and_decode;
        INFO(o.status.message());
        REQUIRE(o.status.is_ok());
        const std::vector<std::uint16_t> nan_out(o.out.size(), 0xFFFF);
        CHECK(o.out == nan_out);
        CHECK(std::all_of(o.lse.begin(), o.lse.end(), [](float v) { return std::isnan(v); }));
      }
      for (int l = 0; l < kLayers; ++l) {
        INFO("layer " << l);
        check_step(layers[l], ws,
                   l == 0 && !plan_first ? PlanStep::plan_and_decode : PlanStep::decode_only);
      }

      // A plan of another batch enqueued into a workspace: a decode_only call of this shape
      // there is refused before any launch (a Status naming plan_step) where its kernel reads
      // the planner's plan, and runs where the kernel plans for itself.
      Case c2 = layers[1].c;
      c2.kv_lens.push_back(300);
      TestProblem other;
      build(other, c2);
      REQUIRE(other.ok);
      DeviceBuffer ws2(std::max(workspace_for(layers[1].dev), workspace_for(other.dev)));
      other.dev.plan_step = PlanStep::plan_only;
      REQUIRE(decode(other.dev, ws2.ptr, ws2.bytes, nullptr).is_ok());
      REQUIRE(gpu_sync());
      DeviceInfo dev;
      REQUIRE(cached_device_info(&dev));
      const bool reads_plan =
          !detail::choose_kernel(layers[1].dev, dev, detail::policy_index(layers[1].dev, dev))
               .self_plan;
      layers[1].dev.plan_step = PlanStep::decode_only;
      const Status refused = decode(layers[1].dev, ws2.ptr, ws2.bytes, nullptr);
      layers[1].dev.plan_step = PlanStep::plan_and_decode;
      INFO(refused.message());
      if (reads_plan) {
        CHECK(refused.code() == StatusCode::invalid_argument);
        CHECK(refused.message().find("plan_step = decode_only") != std::string::npos);
      } else {
        CHECK(refused.is_ok());
        CHECK(gpu_sync());
      }
      // After a plan of its own shape in that workspace, the same call runs.
      check_step(layers[1], ws2, PlanStep::plan_and_decode);
      check_step(layers[1], ws2, PlanStep::decode_only);
    }
}

#if defined(MLAKIT_HAS_CUDA_RUNTIME_API)
TEST_CASE("graph capture: one captured graph replays while kv_len changes", "[gpu]") {
  MLAKIT_REQUIRE_GPU();
  Case c = crash_shape();
  c.kv_lens = {2000, 1500, 900};  // capacity; replays use shorter lengths
  TestProblem P;
  build(P, c);
  REQUIRE(P.ok);
  DeviceBuffer ws(workspace_for(P.dev));
  cudaStream_t stream;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  // No ordinary call first: decode() may be captured from its first use (gpu_engine.cu
  // checks a capture that is the very first use of a kernel).
  cudaGraph_t graph;
  REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
  const Status s = decode(P.dev, ws.ptr, ws.bytes, stream);
  REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
  REQUIRE(s.is_ok());
  cudaGraphExec_t exec;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  const std::vector<std::vector<int>> steps = {{2000, 1500, 900}, {7, 1499, 0}, {1234, 3, 64}};
  for (const auto& lens : steps) {
    P.kv_len.assign(lens.begin(), lens.end());
    REQUIRE(gpu_h2d(P.d_kv_len.ptr, P.kv_len.data(), P.kv_len.size() * 4));
    std::vector<std::uint16_t> nan_out(P.out_elems, 0xFFFF);
    REQUIRE(gpu_h2d(P.d_out.ptr, nan_out.data(), nan_out.size() * 2));
    REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    Outcome o;
    o.out.resize(P.out_elems);
    o.lse.resize(P.lse_elems);
    REQUIRE(gpu_d2h(o.out.data(), P.d_out.ptr, P.out_elems * 2));
    REQUIRE(gpu_d2h(o.lse.data(), P.d_lse.ptr, P.lse_elems * 4));
    const auto ref = run_reference(P);  // host args see the new lengths
    compare(P, ref, o);
    INFO("lens " << lens[0] << " " << lens[1] << " " << lens[2] << " rel " << o.rel_l2);
    CHECK(o.rel_l2 < 1e-2);
    CHECK(o.lse_err < 1e-4);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST_CASE("plan steps: decode_only launches no planner, plan_only nothing else", "[gpu]") {
  // The kernels each step enqueues, counted as the nodes of a captured graph: plan_only and
  // decode_only together are plan_and_decode, and plan_only is the planner or nothing (a
  // decode kernel that plans for itself).
  MLAKIT_REQUIRE_GPU();
  cudaStream_t stream;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  for (const PlanFamily& f : plan_families()) {
    INFO(f.what);
    TestProblem P;
    build(P, f.case_of());
    REQUIRE(P.ok);
    DeviceBuffer ws(workspace_for(P.dev));
    std::size_t nodes[3] = {0, 0, 0};
    for (PlanStep step : {PlanStep::plan_and_decode, PlanStep::plan_only, PlanStep::decode_only}) {
      P.dev.plan_step = step;
      cudaGraph_t graph;
      REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
      const Status s = decode(P.dev, ws.ptr, ws.bytes, stream);
      REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
      INFO(s.message());
      REQUIRE(s.is_ok());
      REQUIRE(cudaGraphGetNodes(graph, nullptr, &nodes[int(step)]) == cudaSuccess);
      cudaGraphDestroy(graph);
    }
    INFO("nodes " << nodes[0] << " / " << nodes[1] << " / " << nodes[2]);
    CHECK(nodes[1] + nodes[2] == nodes[0]);
    CHECK(nodes[1] == (f.planner ? 1u : 0u));
    CHECK(nodes[2] >= 1);
  }
  cudaStreamDestroy(stream);
}
#endif

TEST_CASE("decode errors: out-of-domain arguments return a Status", "[gpu]") {
  MLAKIT_REQUIRE_GPU();
  TestProblem P;
  build(P, crash_shape());
  REQUIRE(P.ok);
  DeviceBuffer ws(workspace_for(P.dev));
  DecodeArgs a = P.dev;
  a.q_len = 33;
  Status s = decode(a, ws.ptr, ws.bytes, nullptr);
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK(s.message().find("q_len = 33") != std::string::npos);
  s = decode(P.dev, ws.ptr, 16, nullptr);
  CHECK(s.code() == StatusCode::workspace_too_small);
  // A null workspace with a size names the workspace, in decode() and in the launch that the
  // dispatch table reaches without decode()'s checks.
  s = decode(P.dev, nullptr, ws.bytes, nullptr);
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK(s.message().rfind("workspace = null:", 0) == 0);
  DeviceInfo dev;
  REQUIRE(query_device(&dev).is_ok());
  s = detail::dispatch(P.dev, dev, nullptr, ws.bytes, nullptr);
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK(s.message().rfind("workspace = null:", 0) == 0);
  // A DeviceInfo outside its domain is rejected where it enters a launch (launch_with()).
  for (int sms : {0, -1, 1 << 30}) {
    DeviceInfo bad = dev;
    bad.sm_count = sms;
    s = detail::dispatch(P.dev, bad, ws.ptr, ws.bytes, nullptr);
    INFO(s.message());
    CHECK(s.code() == StatusCode::invalid_argument);
    CHECK(s.message().rfind("DeviceInfo.sm_count = " + std::to_string(sms) + ":", 0) == 0);
  }
}

TEST_CASE("CSR page ids with a null kv_indices: no request has a page", "[gpu]") {
  MLAKIT_REQUIRE_GPU();
  TestProblem P;
  build(P, crash_shape());
  REQUIRE(P.ok);
  P.host.kv_indices = nullptr;  // the reference reads the same declaration
  P.dev.kv_indices = nullptr;
  DeviceBuffer ws(workspace_for(P.dev));
  Outcome o = run_device(P, ws);
  INFO(o.status.message());
  REQUIRE(o.status.is_ok());
  const auto ref = run_reference(P);
  compare(P, ref, o);
  CHECK(o.max_abs == 0.0);  // every row sees no key: O = 0 (the NaN poison is overwritten)
  CHECK(o.lse_err == 0.0);  // and LSE = -inf
  for (float l : o.lse) CHECK(l == -INFINITY);
}

TEST_CASE("block table: stride 0 (packed rows) equals the explicit stride", "[gpu]") {
  MLAKIT_REQUIRE_GPU();
  Case c = crash_shape();
  c.ids = PageIds::block_table;
  c.page_size = 16;
  TestProblem P;
  build(P, c);
  REQUIRE(P.ok);
  REQUIRE(P.dev.block_table_stride == 0);  // what set_packed_strides() sets
  DeviceBuffer ws(workspace_for(P.dev));
  Outcome packed = run_device(P, ws);
  REQUIRE(packed.status.is_ok());
  P.dev.block_table_stride = P.dev.max_pages_per_request;
  Outcome explicit_stride = run_device(P, ws);
  REQUIRE(explicit_stride.status.is_ok());
  CHECK(packed.out == explicit_stride.out);
  CHECK(std::memcmp(packed.lse.data(), explicit_stride.lse.data(), packed.lse.size() * 4) == 0);
  const auto ref = run_reference(P);
  compare(P, ref, packed);
  CHECK(packed.rel_l2 < 1e-2);
}

// kv_len past kMaxKvLen is cut to it on the device, like a length past the page capacity. Each
// request maps 2^23 pages of 256 tokens (capacity 2^31 tokens) that all alias its one real
// page, and asks for INT_MAX tokens: the kernels run 2^30 keys, every key of the page exactly
// 2^22 times, so O is the output over the page alone and LSE that one plus 22 ln 2 (no causal
// mask, which would drop a few of the last page's repeats). The LSE counts the keys: a piece
// dropped or run twice (at least 1/264 of a request's keys here) moves it by 3.8e-3 or more,
// a wrong clamp by far more. O mixes the same 256 keys whatever their count, so it checks that
// the keys read are the right ones (a wrapped index reads other pages, or the NaN poison); its
// bound is looser than the suite's because each CTA adds about 2^17 tiles into the tensor
// cores' fp32 accumulators: the H200 measured a relative L2 error of 2.2e-2 for the bf16 cache
// (LSE error 2.2e-4), against about 2e-3 for ordinary lengths.
TEST_CASE("kv_len past kMaxKvLen on aliased pages is cut to kMaxKvLen", "[gpu]") {
  MLAKIT_REQUIRE_GPU();
  struct V {
    DType kv;
    int q_len;
  };
  for (V v : {V{DType::fp8_e4m3fn, 8}, V{DType::fp8_e4m3fn, 1}, V{DType::bf16, 2}}) {
    Case c;
    c.q_type = DType::bf16;
    c.kv_type = v.kv;
    c.q_len = v.q_len;
    c.causal = false;
    c.page_size = 256;
    c.ids = PageIds::csr;
    c.kv_lens = {256, 256};
    c.seed = 7;
    INFO(c.name());
    TestProblem P;
    build(P, c);
    REQUIRE(P.ok);
    const auto ref = run_reference(P);  // over the one page of each request
    // The aliased mapping: request b's 2^23 page ids all name its real page.
    const int pages = 1 << 23;
    REQUIRE(std::int64_t(pages) * c.page_size > std::numeric_limits<int>::max());
    std::vector<std::int32_t> indptr = {0, pages, 2 * pages};
    std::vector<std::int32_t> indices(std::size_t(2) * pages);
    std::fill(indices.begin(), indices.begin() + pages, P.indices[0]);
    std::fill(indices.begin() + pages, indices.end(), P.indices[1]);
    const std::vector<std::int32_t> lens = {std::numeric_limits<int>::max(), kMaxKvLen + 12345};
    DeviceBuffer d_indptr(indptr.size() * 4), d_indices(indices.size() * 4),
        d_lens(lens.size() * 4);
    REQUIRE(d_indptr.ptr);
    REQUIRE(d_indices.ptr);
    REQUIRE(d_lens.ptr);
    REQUIRE(gpu_h2d(d_indptr.ptr, indptr.data(), indptr.size() * 4));
    REQUIRE(gpu_h2d(d_indices.ptr, indices.data(), indices.size() * 4));
    REQUIRE(gpu_h2d(d_lens.ptr, lens.data(), lens.size() * 4));
    P.dev.kv_indptr = d_indptr.as<std::int32_t>();
    P.dev.kv_indices = d_indices.as<std::int32_t>();
    P.dev.kv_len = d_lens.as<std::int32_t>();
    DeviceBuffer ws(workspace_for(P.dev));
    Outcome o = run_device(P, ws);
    INFO(o.status.message());
    REQUIRE(o.status.is_ok());
    auto big = ref;
    for (double& l : big.lse) l += 22.0 * std::log(2.0);
    compare(P, big, o);
    WARN(c.name() << ": rel_l2 " << o.rel_l2 << " max_abs " << o.max_abs << " lse_err "
                  << o.lse_err);
    CHECK(o.rel_l2 < 5e-2);
    CHECK(o.lse_err < 2e-3);
    ++g_cases;
  }
}
