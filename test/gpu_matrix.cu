// GPU tests of the fp8 matrix mode (DecodeArgs::compute = Compute::fp8_matrix): both products
// on e4m3 tensor cores, NVIDIA sm_90a only. Every axis of the domain against the
// double-precision reference, on random data with NaN-poisoned outputs, unused pages and page
// tails, at the mode's tolerance (docs/design.md, "The fp8 matrix mode"): relative L2 2.5e-2 of
// O and an LSE error of 0.1 (the wide rows' relative to max(1, |LSE|)): e4m3 wgmma truncate
// each sum relative to its largest product, so the LSE's error grows with the scores (these
// cases' sharp softmaxes reach 2.3e-2 at |LSE| near 20 and 5.4e-2 near 160; N(0,1) data
// 1.4e-3). Where
// the device or the build has no sm_90a code the mode must return not_supported, which the
// first case checks instead.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <random>

#include "gpu_harness.hpp"
#include "gpu_require.hpp"

using namespace mlakit;
using namespace mlakit::testing;

namespace {

constexpr double kMatrixRelL2 = 2.5e-2;
constexpr double kMatrixLse = 0.1;

// Largest errors seen over the file's cases, printed at the end of each test case (the
// tolerance above must stay above them with a margin; docs/design.md records them).
double g_worst_l2 = 0.0, g_worst_lse = 0.0;

// Whether this device runs the mode (an sm_90 GPU and sm_90a code in this build), asked once.
bool matrix_runs() {
  static const bool runs = [] {
    DeviceInfo dev;
    if (!cached_device_info(&dev) || dev.arch != 90) return false;
    Case c = seed_shape({100});
    c.compute = Compute::fp8_matrix;
    TestProblem P;
    build(P, c);
    if (!P.ok) return false;
    DeviceBuffer ws(workspace_for(P.dev));
    return run_device(P, ws).status.is_ok();
  }();
  return runs;
}

Case matrix_case(std::vector<int> lens) {
  Case c = seed_shape(std::move(lens));
  c.compute = Compute::fp8_matrix;
  return c;
}

void check_matrix(const Case& c, double rel_l2 = kMatrixRelL2, double lse = kMatrixLse) {
  INFO(c.name());
  TestProblem P;
  build(P, c);
  REQUIRE(P.ok);
  DeviceBuffer ws(workspace_for(P.dev));
  Outcome o = run_device(P, ws);
  INFO(o.status.message());
  REQUIRE(o.status.is_ok());
  const auto ref = run_reference(P);
  compare(P, ref, o);
  INFO("rel_l2 " << o.rel_l2 << " max_abs " << o.max_abs << " lse_err " << o.lse_err);
  CHECK(o.rel_l2 < rel_l2);
  CHECK(o.lse_err < lse);
  g_worst_l2 = std::max(g_worst_l2, o.rel_l2);
  g_worst_lse = std::max(g_worst_lse, o.lse_err);
}

void report(const char* what) {
  std::printf("fp8_matrix %s: largest rel_l2 %.3e, largest lse_err %.3e\n", what, g_worst_l2,
              g_worst_lse);
  g_worst_l2 = g_worst_lse = 0.0;
}

}  // namespace

TEST_CASE("fp8 matrix: runs on sm_90a, not_supported elsewhere", "[gpu][matrix]") {
  MLAKIT_REQUIRE_GPU();
  DeviceInfo dev;
  REQUIRE(cached_device_info(&dev));
  Case c = matrix_case({0, 5, 1, 64, 65, 777, 2048});
  TestProblem P;
  build(P, c);
  REQUIRE(P.ok);
  DeviceBuffer ws(workspace_for(P.dev));
  const Outcome o = run_device(P, ws);
  INFO(o.status.message());
  if (dev.arch != 90) {
    CHECK(o.status.code() == StatusCode::not_supported);
    CHECK(o.status.message().rfind("compute = fp8_matrix", 0) == 0);
    return;
  }
  REQUIRE(o.status.is_ok());
  check_matrix(c);
  report("seed shape");
}

TEST_CASE("fp8 matrix: other caches are refused by name", "[gpu][matrix]") {
  MLAKIT_REQUIRE_GPU();
  for (DType kv : {DType::bf16, DType::fp16, DType::fp8_e4m3fnuz}) {
    Case c = matrix_case({100});
    c.kv_type = kv;
    TestProblem P;
    build(P, c);
    REQUIRE(P.ok);
    DeviceBuffer ws(workspace_for(P.dev));
    const Status s = decode(P.dev, ws.ptr, ws.bytes, nullptr);
    INFO(s.message());
    CHECK(s.code() == StatusCode::invalid_argument);
    CHECK(s.message().rfind("compute = fp8_matrix:", 0) == 0);
  }
}

TEST_CASE("fp8 matrix: every q_len, causal and not, both Q types", "[gpu][matrix]") {
  MLAKIT_REQUIRE_GPU();
  if (!matrix_runs()) return;
  for (int q : {1, 2, 3, 4, 5, 7, 8, 16, 32})
    for (DType qt : {DType::bf16, DType::fp16}) {
      Case c = matrix_case({0, q / 2, q, q + 1, 500, 1500});
      c.q_len = q;
      c.q_type = qt;
      c.seed = 9000 + 2 * q + int(qt);
      check_matrix(c);
      c.causal = false;
      c.seed += 100;
      check_matrix(c);
    }
  report("q_len");
}

TEST_CASE("fp8 matrix: every head count", "[gpu][matrix]") {
  MLAKIT_REQUIRE_GPU();
  if (!matrix_runs()) return;
  for (int h : {1, 7, 12, 16, 32, 64, 128}) {
    Case c = matrix_case({0, 3, 129, 700, 2000});
    c.heads = h;
    c.q_len = h >= 64 ? 2 : 8;
    c.seed = 9200 + h;
    check_matrix(c);
  }
  report("heads");
}

TEST_CASE("fp8 matrix: page sizes and page-id formats", "[gpu][matrix]") {
  MLAKIT_REQUIRE_GPU();
  if (!matrix_runs()) return;
  for (int ps : {1, 3, 16, 64, 100, 256})
    for (PageIds ids : {PageIds::block_table, PageIds::csr}) {
      Case c = matrix_case({0, 1, 63, 64, 65, 1000, 3001});
      c.page_size = ps;
      c.ids = ids;
      c.seed = 9300 + ps * 2 + int(ids);
      check_matrix(c);
    }
  report("page sizes");
}

TEST_CASE("fp8 matrix: split modes and LSE formats", "[gpu][matrix]") {
  MLAKIT_REQUIRE_GPU();
  if (!matrix_runs()) return;
  struct S {
    SplitMode m;
    int n;
  };
  for (S s : {S{SplitMode::automatic, 0}, S{SplitMode::none, 0}, S{SplitMode::fixed, 1},
              S{SplitMode::fixed, 3}, S{SplitMode::fixed, 64}})
    for (int lse = 0; lse <= 3; ++lse) {
      Case c = matrix_case({0, 5, 1, 64, 65, 777, 5000});
      c.split = s.m;
      c.num_splits = s.n;
      c.lse = lse > 0;
      if (lse > 0) c.lse_format = LseFormat(lse - 1);
      c.seed = 9400 + int(s.m) * 100 + s.n + lse;
      check_matrix(c);
    }
  report("split modes");
}

// O is promoted to f32 after every pair of tiles, so its error must not grow with the length
// (unsplit: one piece reads the whole request).
TEST_CASE("fp8 matrix: long requests, one piece and split", "[gpu][matrix]") {
  MLAKIT_REQUIRE_GPU();
  if (!matrix_runs()) return;
  for (SplitMode m : {SplitMode::none, SplitMode::automatic}) {
    Case c = matrix_case({8192, 32768, 100000});
    c.page_size = 64;
    c.ids = PageIds::block_table;
    c.split = m;
    c.seed = 9500 + int(m);
    check_matrix(c);
  }
  report("long requests");
}

TEST_CASE("fp8 matrix: a separate rotary cache, padded rows, sharp and wide rows",
          "[gpu][matrix]") {
  MLAKIT_REQUIRE_GPU();
  if (!matrix_runs()) return;
  for (int i = 0; i < 2; ++i) {
    Case c = matrix_case({0, 33, 700, 2100});
    c.q_type = i ? DType::fp16 : DType::bf16;
    c.page_size = i ? 16 : 1;
    c.split_cache = true;
    c.seed = 9600 + i;
    check_matrix(c);
    c.split_cache = false;
    c.padded_cache = true;
    c.seed += 10;
    check_matrix(c);
  }
  Case peaky = matrix_case({300, 1000, 4000});
  peaky.q_magnitude = 8.0f;  // sharp softmax
  peaky.seed = 9620;
  check_matrix(peaky);
  // bf16 Q rows 2^+-40 around ordinary ones (each row has its own power-of-two scale): LSE
  // relative to max(1, |lse|), as for the 16-bit path.
  Case wide = matrix_case({0, 200, 1500});
  wide.q_row_octaves = 40;
  wide.lse_relative = true;
  wide.seed = 9630;
  check_matrix(wide);
  report("kv_rope, padded, sharp, wide");
}

TEST_CASE("fp8 matrix: random sample of the domain", "[gpu][matrix]") {
  MLAKIT_REQUIRE_GPU();
  if (!matrix_runs()) return;
  std::mt19937 rng(17);
  const int heads[] = {1, 8, 12, 16, 32, 64, 128};
  const int qlens[] = {1, 2, 3, 4, 5, 7, 8, 16, 32};
  const int pages[] = {1, 16, 64, 5};
  for (int i = 0; i < 24; ++i) {
    Case c = matrix_case({});
    c.q_type = rng() % 2 ? DType::bf16 : DType::fp16;
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
    for (int j = 0; j < n; ++j) c.kv_lens.push_back(rng() % 3 == 0 ? rng() % 10 : rng() % 1500);
    c.seed = 9700 + i;
    check_matrix(c);
  }
  report("random sample");
}

TEST_CASE("fp8 matrix: repeated runs are bitwise equal", "[gpu][matrix]") {
  MLAKIT_REQUIRE_GPU();
  if (!matrix_runs()) return;
  for (SplitMode m : {SplitMode::automatic, SplitMode::fixed}) {
    Case c = matrix_case({5000, 17, 3000});
    c.split = m;
    c.num_splits = 5;
    TestProblem P;
    build(P, c);
    REQUIRE(P.ok);
    DeviceBuffer ws(workspace_for(P.dev));
    const Outcome a = run_device(P, ws);
    const Outcome b = run_device(P, ws);
    REQUIRE(a.status.is_ok());
    REQUIRE(b.status.is_ok());
    CHECK(a.out == b.out);
    CHECK(std::equal(a.lse.begin(), a.lse.end(), b.lse.begin(), [](float x, float y) {
      return (std::isnan(x) && std::isnan(y)) || x == y;
    }));
  }
}

// Small enough for compute-sanitizer (memcheck, synccheck, racecheck): pieces of one to a few
// pairs, an odd tile count (a padded tile), a length ending inside a tile and an empty request,
// split and not.
TEST_CASE("fp8 matrix: short mixed requests", "[gpu][matrix]") {
  MLAKIT_REQUIRE_GPU();
  if (!matrix_runs()) return;
  for (SplitMode m : {SplitMode::none, SplitMode::fixed, SplitMode::automatic}) {
    Case c = matrix_case({0, 65, 300, 129});
    c.page_size = 3;
    c.split = m;
    c.num_splits = 2;
    c.seed = 9800 + int(m);
    check_matrix(c);
  }
  report("short mixed");
}
