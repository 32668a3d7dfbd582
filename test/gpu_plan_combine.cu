// GPU tests of the two small kernels around the decode mainloop:
//  - the device planner (kernel/planner_kernel.hpp) must write exactly what plan_on_host()
//    computes from the clamped lengths, field by field, and nothing outside its arrays;
//  - the combine kernel (kernel/combine_kernel.hpp) must merge the partials of split requests
//    as a double-precision LSE merge does, and leave unsplit requests and padding untouched.
// Workspaces and outputs are poisoned (0xFF bytes, NaN) before every launch.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gpu_harness.hpp"
#include "gpu_require.hpp"
#include "mlakit/kernel/combine_kernel.hpp"
#include "mlakit/kernel/planner_kernel.hpp"
#include "mlakit/kernel/workspace.hpp"

using namespace mlakit;
using namespace mlakit::testing;

namespace {

constexpr std::int64_t kGuardBytes = 4096;  // poisoned bytes past the workspace

// ---- planner ---------------------------------------------------------------------------

struct PlannerCase {
  std::vector<int> lens;  // raw kv_len values: negative and beyond capacity allowed
  PageIds ids = PageIds::block_table;
  int page_size = 16;
  int max_pages = 8;       // block_table capacity
  std::vector<int> pages;  // csr: pages of each request
  SplitMode mode = SplitMode::automatic;
  int splits = 1;
  int row_tiles = 1;
  int sms = 132;
  int min_piece_tiles = kMinPieceTiles;
  int tile_step = 1;          // PlanShape::tile_step
  int partials_per_tile = 0;  // PlanShape::partials_per_tile
  bool count_row_tiles = false;
  // PlanShape::may_shift from the longest capacity (what decode() derives for a block table)
  // rather than true (the search for the longest request, always safe).
  bool bound_shift = false;

  std::string name() const {
    std::ostringstream s;
    s << "batch " << lens.size() << (ids == PageIds::csr ? " csr" : " bt") << " ps " << page_size
      << " mode " << int(mode) << "/" << splits << " row_tiles " << row_tiles << " sms " << sms
      << " min piece " << min_piece_tiles << " step " << tile_step << " partials per tile "
      << partials_per_tile << (count_row_tiles ? " of every row tile" : "")
      << (bound_shift ? " bounded shift" : "");
    return s.str();
  }
};

// Runs the device planner on a poisoned workspace; "" or the first difference from the host.
std::string run_planner(const PlannerCase& c) {
  const int batch = int(c.lens.size());
  PlanShape shape;
  shape.batch = batch;
  shape.row_tiles = c.row_tiles;
  shape.mode = c.mode;
  shape.fixed_splits = c.mode == SplitMode::fixed ? c.splits : 1;
  shape.min_piece_tiles = c.min_piece_tiles;
  shape.tile_step = c.tile_step;
  shape.partials_per_tile = c.partials_per_tile;
  shape.count_row_tiles = c.count_row_tiles;
  // 1 + batch % 2 CTAs per SM: both values the policies use.
  shape.num_ctas =
      plan_num_ctas(c.mode, shape.fixed_splits, batch, c.row_tiles, c.sms, 1 + batch % 2);

  // Host plan from lengths clamped to each request's page capacity.
  std::vector<std::int32_t> indptr(batch + 1, 0);
  std::vector<int> clamped(batch);
  std::int64_t max_cap = 0;
  for (int b = 0; b < batch; ++b) {
    std::int64_t cap = std::int64_t(c.max_pages) * c.page_size;
    if (c.ids == PageIds::csr) {
      indptr[b + 1] = indptr[b] + c.pages[b];
      cap = std::int64_t(c.pages[b]) * c.page_size;
    }
    clamped[b] = clamp_kv_len(c.lens[b], cap);
    max_cap = cap > max_cap ? cap : max_cap;
  }
  if (c.bound_shift) shape.may_shift = line_may_shift(shape, clamp_kv_len(kMaxKvLen, max_cap));
  const HostPlan h = plan_on_host(shape, clamped.data());

  // The planner touches only the plan part: keep the partial area small for huge grids.
  int rows_padded = c.row_tiles * 16;
  if (detail::workspace_layout(shape, rows_padded).bytes > (std::int64_t(1) << 28)) rows_padded = 0;
  const detail::WorkspaceLayout wl = detail::workspace_layout(shape, rows_padded);
  const std::int64_t bytes = wl.bytes + kGuardBytes;
  std::vector<std::uint8_t> image(bytes, 0xFF);
  DeviceBuffer ws(bytes), d_len(batch * 4), d_indptr((batch + 1) * 4);
  if (!ws.ptr || !d_len.ptr || !d_indptr.ptr) return "allocation failed";
  if (!gpu_h2d(ws.ptr, image.data(), bytes) || !gpu_h2d(d_len.ptr, c.lens.data(), batch * 4) ||
      !gpu_h2d(d_indptr.ptr, indptr.data(), (batch + 1) * 4))
    return "upload failed";

  DecodeArgs a;
  a.batch = batch;
  a.page_ids = c.ids;
  a.page_size = c.page_size;
  a.max_pages_per_request = c.max_pages;
  a.kv_len = d_len.as<std::int32_t>();
  a.kv_indptr = d_indptr.as<std::int32_t>();
  // Never read by the planner, but a null kv_indices would declare that no request has a page.
  a.kv_indices = d_indptr.as<std::int32_t>();
  a.split_mode = c.mode;
  a.num_splits = c.splits;
  const detail::WorkspaceView view = detail::workspace_view(ws.ptr, wl, rows_padded);
  // decode()'s launch: the small planner block up to 128 requests, the large one beyond.
  const Status launch = detail::launch_planner(a, shape, view, nullptr);
  if (!launch) return launch.message();
  if (!gpu_sync() || !gpu_d2h(image.data(), ws.ptr, bytes)) return "planner failed";

  std::ostringstream err;
  int header[4];
  std::memcpy(header, image.data() + wl.plan.header_offset, sizeof(header));
  if (header[0] != h.total || header[1] != h.per_cta || header[2] != h.partials) {
    err << "header " << header[0] << " " << header[1] << " " << header[2] << ", host " << h.total
        << " " << h.per_cta << " " << h.partials;
    return err.str();
  }
  for (int b = 0; b < batch; ++b) {
    RequestPlan d;
    std::memcpy(&d, image.data() + wl.plan.requests_offset + b * sizeof(RequestPlan), sizeof d);
    const RequestPlan& r = h.requests[b];
    if (d.kv_len != r.kv_len || d.cost_begin != r.cost_begin || d.cost != r.cost ||
        d.first_cta != r.first_cta || d.num_pieces != r.num_pieces ||
        d.partial_base != r.partial_base) {
      err << "request " << b << " (len " << c.lens[b] << "): device {" << d.kv_len << ", "
          << d.cost_begin << ", " << d.cost << ", " << d.first_cta << ", " << d.num_pieces << ", "
          << d.partial_base << "} host {" << r.kv_len << ", " << r.cost_begin << ", " << r.cost
          << ", " << r.first_cta << ", " << r.num_pieces << ", " << r.partial_base << "}";
      return err.str();
    }
  }
  for (int k = 0; k < shape.num_ctas; ++k) {
    CtaPlan d;
    std::memcpy(&d, image.data() + wl.plan.ctas_offset + k * sizeof(CtaPlan), sizeof d);
    if (d.req_begin != h.ctas[k].req_begin || d.req_end != h.ctas[k].req_end) {
      err << "CTA " << k << ": device [" << d.req_begin << ", " << d.req_end << "] host ["
          << h.ctas[k].req_begin << ", " << h.ctas[k].req_end << "]";
      return err.str();
    }
  }
  // Nothing outside header[0..3], RequestPlan[batch] and CtaPlan[num_ctas] was written.
  auto untouched = [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t i = lo; i < hi; ++i)
      if (image[i] != 0xFF) return i;
    return std::int64_t(-1);
  };
  const std::int64_t req_end = wl.plan.requests_offset + batch * std::int64_t(sizeof(RequestPlan));
  const std::int64_t cta_end = wl.plan.ctas_offset + shape.num_ctas * std::int64_t(sizeof(CtaPlan));
  for (std::int64_t at : {untouched(16, wl.plan.requests_offset),
                          untouched(req_end, wl.plan.ctas_offset), untouched(cta_end, bytes)})
    if (at >= 0) return "byte " + std::to_string(at) + " outside the plan arrays was written";
  return "";
}

std::vector<int> planner_lengths(std::mt19937_64& g, int batch, std::int64_t capacity, int kind) {
  const int kMin = std::numeric_limits<int>::min(), kMax = std::numeric_limits<int>::max();
  const int cap = int(std::min<std::int64_t>(capacity, 1 << 30));
  std::vector<int> v(batch);
  for (int& x : v) {
    const int r = int(g() % 20);
    if (r == 0)
      x = kMin;
    else if (r == 1)
      x = kMax;
    else if (r == 2)
      x = -int(g() % 1000) - 1;
    else if (r < 7)
      x = 0;
    else if (r < 9)
      x = cap + 1 + int(g() % 1000);  // beyond capacity
    else if (kind == 1)
      x = g() % 2 ? int(g() % 200) : 1000 * int(g() % 200);  // 1000x apart
    else
      x = int(g() % (std::uint64_t(cap) + 1));
  }
  return v;
}

// A random planner case of `batch` requests; `trial` picks the page-id format ((trial / 10) %
// 2), split mode ((trial / 20) % 3), SM count, least piece, the shift form and the length mix.
PlannerCase random_planner_case(std::mt19937_64& g, int batch, int trial) {
  PlannerCase c;
  c.ids = (trial / 10) % 2 ? PageIds::csr : PageIds::block_table;
  c.mode = SplitMode((trial / 20) % 3);
  c.splits = 1 + int(g() % kMaxSplits);
  c.row_tiles = 1 + int(g() % 64);
  c.sms = trial % 3 == 0 ? 304 : 132;
  c.min_piece_tiles = 1 + trial % 3;
  c.tile_step = 1 + trial / 5 % 2;
  c.partials_per_tile = trial % 5 < 2 ? 0 : 8 * (trial % 5);
  c.count_row_tiles = trial % 7 < 4;
  c.bound_shift = trial % 4 < 2;
  c.page_size = 1 + int(g() % 256);
  c.max_pages = 1 + int(g() % 3000);
  c.pages.resize(batch);
  std::int64_t max_cap = std::int64_t(c.max_pages) * c.page_size;
  if (c.ids == PageIds::csr) {
    max_cap = 0;
    for (int& p : c.pages) {
      // Some requests get a negative page count (a decreasing kv_indptr): capacity 0.
      const int kind = int(g() % 10);
      p = kind < 2 ? 0 : kind == 2 ? -int(g() % 50) : int(g() % 800);
      max_cap = std::max<std::int64_t>(max_cap, std::int64_t(p) * c.page_size);
    }
  }
  c.lens = planner_lengths(g, batch, std::max<std::int64_t>(max_cap, 1), int(trial % 2));
  return c;
}

// ---- combine ---------------------------------------------------------------------------

struct CombineCase {
  DType q_type = DType::bf16;
  int heads = 16, q_len = 8;
  std::vector<int> lens;
  SplitMode mode = SplitMode::automatic;
  int splits = 1;
  int sms = 132;
  bool padded = false;  // O and LSE strides with gaps (which must stay poisoned)
  bool lse = true;
  std::uint64_t seed = 1;
  // The combine layout: forced where forced.warps_per_row > 0, else the one decode() picks.
  detail::CombineLayout forced{0, 0, false};
};

double decode16(DType t, std::uint16_t h) {
  return t == DType::bf16 ? decode_bf16(h) : decode_fp16(h);
}

// One unit in the last place of the 16-bit type at |x| (the subnormal step near 0).
double ulp16(DType t, double x) {
  const int mant = t == DType::bf16 ? 7 : 10;
  const int min_exp = t == DType::bf16 ? -126 : -14;
  int e = 0;
  std::frexp(std::fabs(x), &e);  // |x| = f * 2^e, f in [0.5, 1)
  return std::ldexp(1.0, std::max(e - 1, min_exp) - mant);
}

void check_combine_once(const CombineCase& c) {
  std::mt19937_64 g(c.seed);
  const int batch = int(c.lens.size()), rows = c.heads * c.q_len;
  const int rpc = arch::kPolicies[arch::policy_index_for_rows(rows)].rows;
  PlanShape shape;
  shape.batch = batch;
  shape.row_tiles = (rows + rpc - 1) / rpc;
  shape.mode = c.mode;
  shape.fixed_splits = c.mode == SplitMode::fixed ? c.splits : 1;
  shape.num_ctas =
      plan_num_ctas(c.mode, shape.fixed_splits, batch, shape.row_tiles, c.sms,
                    arch::kPolicies[arch::policy_index_for_rows(rows)].ctas_per_sm);
  const HostPlan h = plan_on_host(shape, c.lens.data());
  const int rows_padded = shape.row_tiles * rpc;
  const detail::WorkspaceLayout wl = detail::workspace_layout(shape, rows_padded);
  INFO(dtype_name(c.q_type) << " heads " << c.heads << " q_len " << c.q_len << " batch " << batch
                            << " mode " << int(c.mode) << "/" << c.splits << " partials "
                            << h.partials << " padded " << c.padded << " lse " << c.lse);
  REQUIRE(h.partials <= shape.max_partials());

  // Workspace image: the plan, then partials. Unused slots and rows are NaN; empty pieces
  // (no keys: LSE -inf) carry finite garbage in O, which must get weight 0.
  std::vector<std::uint8_t> image(wl.bytes, 0xFF);
  std::memcpy(image.data() + wl.plan.requests_offset, h.requests.data(),
              h.requests.size() * sizeof(RequestPlan));
  // Partial outputs are stored in the output type (16 bits); NaN in both is 0xFFFF.
  std::uint16_t* po = reinterpret_cast<std::uint16_t*>(image.data() + wl.partial_o_offset);
  float* pl = reinterpret_cast<float*>(image.data() + wl.partial_lse_offset);
  const std::int64_t slots = shape.max_partials();
  std::fill(po, po + slots * rows_padded * kHeadDimV, std::uint16_t(0xFFFF));
  std::fill(pl, pl + slots * rows_padded, NAN);
  for (int b = 0; b < batch; ++b) {
    const RequestPlan& r = h.requests[b];
    if (r.num_pieces <= 1) continue;
    const int dead_row = int(g() % rows);  // a row whose every piece saw no key
    for (int i = 0; i < r.num_pieces; ++i) {
      const Piece pc = piece_of(shape, r, r.first_cta + i, h.per_cta);
      for (int row = 0; row < rows; ++row) {
        const std::int64_t sr = std::int64_t(pc.partial_slot) * rows_padded + row;
        const bool empty = pc.kv_end == pc.kv_begin || row == dead_row || g() % 8 == 0;
        pl[sr] = empty ? -INFINITY : 15.0f * uniform(g);
        const float amplitude = empty ? 3.0f : 2.0f;
        for (int d = 0; d < kHeadDimV; ++d)
          po[sr * kHeadDimV + d] = encode16(c.q_type, amplitude * uniform(g));
      }
    }
  }

  // Outputs poisoned; padded strides leave gaps between heads, tokens and requests.
  const int pad = c.padded ? 1 : 0;
  DecodeArgs a;
  a.q_type = c.q_type;
  a.batch = batch;
  a.num_heads = c.heads;
  a.q_len = c.q_len;
  a.o_stride_head = kHeadDimV + 8 * pad;
  a.o_stride_token = c.heads * a.o_stride_head + 24 * pad;
  a.o_stride_batch = c.q_len * a.o_stride_token + 64 * pad;
  a.lse_stride_head = 1 + 2 * pad;
  a.lse_stride_token = c.heads * a.lse_stride_head + pad;
  a.lse_stride_batch = c.q_len * a.lse_stride_token + 5 * pad;
  const std::size_t out_elems = std::size_t(batch) * a.o_stride_batch;
  const std::size_t lse_elems = std::size_t(batch) * a.lse_stride_batch;
  std::vector<std::uint16_t> out(out_elems, 0xFFFF);
  std::vector<float> lse(lse_elems, NAN);
  DeviceBuffer d_ws(wl.bytes), d_out(out_elems * 2), d_lse(lse_elems * 4);
  REQUIRE((d_ws.ptr && d_out.ptr && d_lse.ptr));
  REQUIRE(gpu_h2d(d_ws.ptr, image.data(), wl.bytes));
  REQUIRE(gpu_h2d(d_out.ptr, out.data(), out_elems * 2));
  REQUIRE(gpu_h2d(d_lse.ptr, lse.data(), lse_elems * 4));
  a.out = d_out.ptr;
  a.lse = c.lse ? d_lse.as<float>() : nullptr;

  // The launch of api/decode.hpp, with the layout it picks for this plan (0) or forced to
  // 1, 2, 4 or 8 warps per row, 1, 2 or 4 column slices and either batch depth, so that every
  // layout of the kernel meets every case.
  detail::CombineLayout layout = detail::combine_layout(shape, rows, c.sms);
  if (c.forced.warps_per_row > 0) layout = c.forced;
  INFO("warps per row " << layout.warps_per_row << ", column slices " << layout.col_splits
                        << ", deep " << layout.deep);
  const detail::WorkspaceView view = detail::workspace_view(d_ws.ptr, wl, rows_padded);
  const Status launch = c.q_type == DType::bf16
                            ? detail::launch_combine<bf16_t>(a, view, layout, nullptr)
                            : detail::launch_combine<fp16_t>(a, view, layout, nullptr);
  INFO(launch.message());
  REQUIRE(launch.is_ok());
  REQUIRE(gpu_sync());
  REQUIRE(gpu_d2h(out.data(), d_out.ptr, out_elems * 2));
  REQUIRE(gpu_d2h(lse.data(), d_lse.ptr, lse_elems * 4));

  // Double-precision merge of every split request; everything else must still be poison.
  std::vector<bool> written_o(out_elems, false), written_l(lse_elems, false);
  double err2 = 0, ref2 = 0, max_abs = 0, max_lse = 0;
  long long bad_o = 0, bad_l = 0, merged_rows = 0;
  std::vector<double> weights;
  for (int b = 0; b < batch; ++b) {
    const RequestPlan& r = h.requests[b];
    if (r.num_pieces <= 1) continue;
    for (int row = 0; row < rows; ++row) {
      const int t = row / c.heads, hd = row % c.heads;
      double m = -INFINITY;
      for (int i = 0; i < r.num_pieces; ++i)
        m = std::max(m, double(pl[std::int64_t(r.partial_base + i) * rows_padded + row]));
      double sum = 0;
      for (int i = 0; i < r.num_pieces; ++i) {
        const double l = pl[std::int64_t(r.partial_base + i) * rows_padded + row];
        if (l != -INFINITY) sum += std::exp(l - m);
      }
      const double L = sum > 0 ? m + std::log(sum) : -INFINITY;
      const std::size_t obase = b * a.o_stride_batch + t * a.o_stride_token + hd * a.o_stride_head;
      // Each piece's weight, once per row (pieces without keys are skipped below).
      weights.assign(r.num_pieces, 0.0);
      for (int i = 0; i < r.num_pieces; ++i) {
        const float l = pl[std::int64_t(r.partial_base + i) * rows_padded + row];
        if (l != -INFINITY) weights[i] = std::exp(double(l) - L);
      }
      for (int d = 0; d < kHeadDimV; ++d) {
        double ref = 0, mag = 0;
        for (int i = 0; i < r.num_pieces; ++i) {
          const std::int64_t sr = std::int64_t(r.partial_base + i) * rows_padded + row;
          if (pl[sr] == -INFINITY) continue;
          const double w = weights[i];
          const double v = decode16(c.q_type, po[sr * kHeadDimV + d]);
          ref += w * v;
          mag += w * std::fabs(v);
        }
        const double got = decode16(c.q_type, out[obase + d]);
        const double e = std::fabs(got - ref);
        // fp32 accumulation, then one rounding to 16 bits.
        if (!(e <= ulp16(c.q_type, ref) + 2e-5 * mag)) ++bad_o;
        err2 += e * e;
        ref2 += ref * ref;
        max_abs = std::max(max_abs, std::isnan(e) ? INFINITY : e);
        written_o[obase + d] = true;
      }
      if (c.lse) {
        const std::size_t li =
            b * a.lse_stride_batch + t * a.lse_stride_token + hd * a.lse_stride_head;
        const double got = lse[li];
        const double e = L == -INFINITY ? (got == -INFINITY ? 0.0 : INFINITY) : std::fabs(got - L);
        if (!(e <= 1e-5)) ++bad_l;
        max_lse = std::max(max_lse, std::isnan(e) ? INFINITY : e);
        written_l[li] = true;
      }
      ++merged_rows;
    }
  }
  long long touched_o = 0, touched_l = 0;
  for (std::size_t i = 0; i < out_elems; ++i) touched_o += !written_o[i] && out[i] != 0xFFFF;
  for (std::size_t i = 0; i < lse_elems; ++i) touched_l += !written_l[i] && !std::isnan(lse[i]);
  const double rel_l2 = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  INFO("merged rows " << merged_rows << " rel_l2 " << rel_l2 << " max_abs " << max_abs
                      << " max_lse_err " << max_lse << " bad O " << bad_o << " bad LSE " << bad_l
                      << " written outside split rows: O " << touched_o << " LSE " << touched_l);
  CHECK(bad_o == 0);
  CHECK(bad_l == 0);
  CHECK(rel_l2 < 1e-2);
  CHECK(touched_o == 0);
  CHECK(touched_l == 0);
}

}  // namespace

TEST_CASE("device planner equals plan_on_host field by field", "[gpu]") {
  MLAKIT_REQUIRE_GPU();
  std::mt19937_64 g(0x91a40001);
  const int batches[] = {1, 2, 7, 128, 129, 1024, 1025, 2048, 2049, 5000};
  int cases = 0;
  for (int trial = 0; trial < 90; ++trial) {
    const PlannerCase c = random_planner_case(g, batches[trial % 10], trial);
    INFO("trial " << trial << ": " << c.name());
    const std::string e = run_planner(c);
    INFO(e);
    CHECK(e.empty());
    ++cases;
  }
  CHECK(cases == 90);
}

// The largest batch (kMaxBatch): the planner kernel's large block, both page-id formats and
// every split mode (trials 10 k + k % 4 of random_planner_case's pattern), fixed splits kept
// in the domain (batch x num_splits <= kMaxBatch).
TEST_CASE("device planner equals plan_on_host at batch 65535", "[gpu]") {
  MLAKIT_REQUIRE_GPU();
  std::mt19937_64 g(0x91a4ffff);
  int cases = 0;
  for (int k = 0; k < 12; ++k) {
    const int trial = 10 * k + k % 4;
    PlannerCase c = random_planner_case(g, kMaxBatch, trial);
    c.splits = 1;
    INFO("trial " << trial << ": " << c.name());
    const std::string e = run_planner(c);
    INFO(e);
    CHECK(e.empty());
    ++cases;
  }
  CHECK(cases == 12);
}

// Every case with decode()'s layout and with each forced one (1, 2, 4, 8 warps per row;
// 1, 2 and 4 column slices; both batch depths).
void check_combine(CombineCase c) {
  c.forced = detail::CombineLayout{0, 0, false};
  check_combine_once(c);
  for (int w = 1; w <= detail::kCombineWarps; w *= 2)
    for (int cs = 1; cs <= detail::kCombineMaxColSplits; cs *= 2)
      for (bool deep : {false, true}) {
        c.forced = detail::CombineLayout{w, cs, deep};
        check_combine_once(c);
      }
}

TEST_CASE("combine merges split partials like a double LSE merge", "[gpu]") {
  MLAKIT_REQUIRE_GPU();
  std::mt19937_64 g(0xc0b10001);
  for (DType q : {DType::bf16, DType::fp16}) {
    CombineCase c;
    c.q_type = q;
    c.lens = {100000, 1, 0, 100, 1000, 2};  // 1000x apart, empty and tiny requests
    c.seed = 1 + int(q);
    check_combine(c);

    c.heads = 12;  // 36 rows: the last block has idle warps
    c.q_len = 3;
    c.padded = true;
    c.sms = 304;
    c.lens.assign(20, 0);
    for (int& l : c.lens) l = g() % 3 == 0 ? 0 : int(g() % 50000);
    c.seed = 10 + int(q);
    check_combine(c);

    c.heads = 128;  // 4096 rows over 64 row tiles
    c.q_len = 32;
    c.padded = false;
    c.sms = 132;
    c.lens = {0, 70000, 5};
    c.seed = 20 + int(q);
    check_combine(c);

    c.heads = 1;  // every request cut into 7 pieces, LSE not requested
    c.q_len = 1;
    c.mode = SplitMode::fixed;
    c.splits = 7;
    c.lse = false;
    c.lens.assign(40, 0);
    for (int& l : c.lens) l = int(g() % 3000);
    c.seed = 30 + int(q);
    check_combine(c);

    c.heads = 16;  // only empty requests: every piece has LSE -inf
    c.q_len = 5;
    c.mode = SplitMode::automatic;
    c.lse = true;
    c.lens.assign(9, 0);
    c.seed = 40 + int(q);
    check_combine(c);

    // Batch 1 with a long context: hundreds of pieces per row (several per warp), and 128 rows
    // of 66 pieces.
    c.q_len = 1;
    c.lens = {131072};
    c.seed = 50 + int(q);
    check_combine(c);
    c.q_len = 8;
    c.lens = {32768};
    c.seed = 60 + int(q);
    check_combine(c);
  }
}

TEST_CASE("combine leaves unsplit requests alone", "[gpu]") {
  MLAKIT_REQUIRE_GPU();
  // Nothing is split: every output must keep its poison.
  CombineCase c;
  c.lens = {5, 70000, 0, 300};
  c.mode = SplitMode::fixed;
  c.splits = 1;
  check_combine(c);
  c.mode = SplitMode::none;
  c.padded = true;
  check_combine(c);
  // One long request takes most of the grid; most short ones stay whole and untouched.
  c.mode = SplitMode::automatic;
  c.lens.assign(60, 64);
  c.lens[17] = 200000;
  c.seed = 3;
  check_combine(c);
}
