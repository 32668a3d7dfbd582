// Host tests of core/plan.hpp (the split-KV planner's arithmetic, shared with the device
// planner) and of the causal window and LSE merge of core/attention_math.hpp.
// The plan is checked against properties derived from its definition, never against a second
// copy of the planner: every request's KV range is covered exactly once and in order, every
// CTA visits exactly the requests it has a piece of, CTA loads stay within the per-CTA budget,
// and partial slots fit the workspace bound.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "mlakit/core/attention_math.hpp"
#include "mlakit/core/decode_args.hpp"
#include "mlakit/core/plan.hpp"

using namespace mlakit;

namespace {

const char* mode_name(SplitMode m) {
  return m == SplitMode::automatic ? "automatic" : m == SplitMode::none ? "none" : "fixed";
}

long long ceil_div(long long a, long long b) { return (a + b - 1) / b; }

// Cost of a request as docs/design.md ("Planner") and plan.hpp define it, spelled out
// independently: automatic mode counts 2^shift tiles per unit (shift 0 but for absurd lines).
long long expected_cost(const PlanShape& p, int len, int shift = 0) {
  if (p.mode == SplitMode::none) return 1;
  if (p.mode == SplitMode::fixed) return p.fixed_splits;
  return kOverheadUnits + ceil_div(ceil_div(len, kPlanTokens), 1LL << shift);
}

// The least shift that keeps batch x (overhead + the longest request's units) within
// kMaxLineUnits (automatic mode; 0 otherwise).
int expected_shift(const PlanShape& p, long long max_tiles) {
  if (p.mode != SplitMode::automatic) return 0;
  int s = 0;
  while (1LL * p.batch * (kOverheadUnits + ceil_div(max_tiles, 1LL << s)) > kMaxLineUnits) ++s;
  return s;
}

struct PlanStats {
  int max_pieces = 0;    // most CTAs one request was cut over
  int max_overload = 0;  // worst (per-piece-overhead load - per_cta) over all CTAs
};

// Checks every invariant of plan_on_host(p, lens). Returns "" or the first violation.
std::string check_plan(const PlanShape& p, const std::vector<int>& lens, PlanStats* stats) {
  std::ostringstream err;
  const HostPlan h = plan_on_host(p, lens.data());
  const int G = p.num_ctas;
  const int B = p.batch;
  if (int(h.requests.size()) != B || int(h.ctas.size()) != G) return "wrong array sizes";

  // Totals and the per-CTA budget: ceil(total / G) units, so the load is balanced; in
  // automatic mode at least kMinPieceUnits, or the aligned budget: t + kOverheadUnits with t
  // the least tile count (at least the least piece) that cuts the longest request into at most
  // floor(G / B) pieces, if that makespan is at most 1/8 longer (counting the overhead).
  long long raw_total = 0, max_tiles = 0;
  for (int len : lens) max_tiles = std::max(max_tiles, ceil_div(len, kPlanTokens));
  const int shift = expected_shift(p, max_tiles);
  const long long unit = 1LL << shift;  // tiles per unit
  for (int len : lens) raw_total += expected_cost(p, len, shift);
  if (raw_total > kMaxLineUnits + 2LL * B) return "the line is longer than kMaxLineUnits";
  long long per = std::max(1LL, ceil_div(raw_total, G));
  long long t = 0;  // tiles per piece of an aligned plan, 0: packed
  if (p.mode == SplitMode::automatic) {
    per = std::max<long long>(per, kMinPieceUnits);
    const long long k = G / B;
    // Pieces under kMinPieceTiles tiles only where the policy allows them and the longest
    // request has at most kShortRequestTiles tiles.
    long long least = std::max(1, p.min_piece_tiles);
    const long long max_units = ceil_div(max_tiles, unit);
    if (max_units > kShortRequestTiles) least = std::max<long long>(least, kMinPieceTiles);
    const long long cand = std::max(least, ceil_div(max_units, k));
    if (8 * (cand + kOverheadUnits) <= 9 * (per + kOverheadUnits)) {
      // Rounded up to the tile step; with a weight M > 0, the step multiple u >= t, up to the
      // longest request (rounded up to the step), that minimises the real u x M + rows x
      // units / u, the least on a tie: compared exactly as a x M + W / a < b x M + W / b <=>
      // (a x M - b x M) x a x b < W x (a - b), in 128 bits.
      const long long step = std::max(1, p.tile_step);
      t = ceil_div(cand, step) * step;
      long long units = 0;
      for (int len : lens) units += ceil_div(ceil_div(len, kPlanTokens), unit);
      if (p.partials_per_tile > 0) {
        const __int128 m = p.partials_per_tile;
        const __int128 w = __int128(p.count_row_tiles ? p.row_tiles : 1) * units;
        const auto less = [&](__int128 a, __int128 b) {
          return (a * m - b * m) * a * b < w * (a - b);
        };
        long long best = t;
        for (long long u = t + step; u < max_units + step && u <= t + 4096 * step; u += step)
          if (less(u, best)) best = u;
        t = best;
      }
      per = t + kOverheadUnits;
    }
  }
  if (h.per_cta != per)
    return "per_cta " + std::to_string(h.per_cta) + " != " + std::to_string(per);
  // Aligned plans: each request takes ceil(tiles / t) budgets (one without keys) and starts
  // at a CTA boundary.
  const bool rounded = t > 0;
  std::vector<long long> cost_of(B);
  long long total = 0;
  for (int b = 0; b < B; ++b) {
    const long long c = expected_cost(p, lens[b], shift);
    cost_of[b] =
        rounded ? std::max(1LL, ceil_div(ceil_div(ceil_div(lens[b], kPlanTokens), unit), t)) * per
                : c;
    total += cost_of[b];
  }
  if (h.total != total) return "total " + std::to_string(h.total) + " != " + std::to_string(total);
  if (1LL * h.per_cta * G < total) return "budget does not cover the total";

  // (a) coverage, (c) partial slots, (d) empty requests, (e) pieces per mode.
  std::vector<int> slot_owner(std::max(h.partials, 0), -1);
  long long prefix = 0, split_pieces = 0, listings_expected = 0;
  std::vector<long long> tokens_of(G, 0), load_of(G, 0), pieces_of(G, 0);
  for (int b = 0; b < B; ++b) {
    const RequestPlan& r = h.requests[b];
    err << "request " << b << " len " << lens[b] << ": ";
    if (r.kv_len != lens[b]) return err.str() + "kv_len changed";
    if (r.cost_begin != prefix) return err.str() + "cost_begin is not the prefix sum";
    const long long cost = cost_of[b];
    if (r.cost != cost) return err.str() + "cost " + std::to_string(r.cost);
    // Aligned plans: every request starts at a CTA boundary, one piece per CTA.
    if (rounded && (r.cost_begin % h.per_cta != 0 || r.num_pieces != cost / h.per_cta))
      return err.str() + "aligned plan: request off a CTA boundary or with extra pieces";
    prefix += cost;
    if (r.num_pieces < 1) return err.str() + "no piece";
    if (r.first_cta < 0 || r.first_cta + r.num_pieces > G) return err.str() + "CTA out of range";
    if (p.mode == SplitMode::none && r.num_pieces != 1) return err.str() + "none mode split";
    if (p.mode == SplitMode::fixed && r.num_pieces != p.fixed_splits)
      return err.str() + "fixed mode: " + std::to_string(r.num_pieces) + " pieces";
    int next = 0;  // next KV token the pieces must start at
    long long piece_min = std::numeric_limits<long long>::max(), piece_max = 0;
    for (int i = 0; i < r.num_pieces; ++i) {
      const int c = r.first_cta + i;
      const Piece pc = piece_of(p, r, c, h.per_cta);
      if (pc.kv_begin != next || pc.kv_end < pc.kv_begin)
        return err.str() + "piece " + std::to_string(i) + " is [" + std::to_string(pc.kv_begin) +
               ", " + std::to_string(pc.kv_end) + "), expected to start at " + std::to_string(next);
      next = pc.kv_end;
      if (lens[b] == 0 && pc.kv_end != 0) return err.str() + "empty request with keys";
      if (h.ctas[c].req_begin > b || h.ctas[c].req_end < b)
        return err.str() + "CTA " + std::to_string(c) + " does not list it";
      if (r.num_pieces == 1) {
        if (pc.partial_slot != -1) return err.str() + "unsplit request has a partial slot";
      } else {
        if (pc.partial_slot < 0 || pc.partial_slot >= h.partials)
          return err.str() + "partial slot " + std::to_string(pc.partial_slot) + " out of range";
        if (slot_owner[pc.partial_slot] != -1) return err.str() + "partial slot used twice";
        slot_owner[pc.partial_slot] = b;
        ++split_pieces;
      }
      // Loads. The piece's share of the request's units is [lo, hi); in automatic mode it gets
      // its share of the request's tiles, rounded: at most ceil(share x tiles / cost) and never
      // none. Per-piece load: every piece loads Q and writes O (or a partial), so it pays the
      // full overhead.
      const long long tiles = ceil_div(pc.kv_end - pc.kv_begin, kPlanTokens);
      const long long lo = std::max<long long>(1LL * c * h.per_cta, r.cost_begin);
      const long long hi = std::min<long long>(1LL * (c + 1) * h.per_cta, r.cost_begin + cost);
      if (hi <= lo) return err.str() + "CTA " + std::to_string(c) + " has an empty share";
      if (p.mode == SplitMode::automatic) {
        const long long req_tiles = ceil_div(lens[b], kPlanTokens);
        if (tiles > ceil_div((hi - lo) * req_tiles, cost))
          return err.str() + "piece " + std::to_string(i) + " has " + std::to_string(tiles) +
                 " tiles for " + std::to_string(hi - lo) + " of " + std::to_string(cost) + " units";
        if (lens[b] > 0 && tiles == 0) return err.str() + "empty piece";
        if (rounded) {
          if (tiles > t * unit) return err.str() + "aligned piece over the tile budget";
          piece_min = std::min(piece_min, tiles);
          piece_max = std::max(piece_max, tiles);
        }
      }
      tokens_of[c] += pc.kv_end - pc.kv_begin;
      load_of[c] += ceil_div(tiles, unit) + kOverheadUnits;
      ++pieces_of[c];
    }
    // Aligned plans cut a request into pieces of equal tiles (within one).
    if (rounded && lens[b] > 0 && piece_max - piece_min > 1)
      return err.str() + "aligned pieces of " + std::to_string(piece_min) + " to " +
             std::to_string(piece_max) + " tiles";
    if (next != lens[b]) return err.str() + "pieces end at " + std::to_string(next);
    listings_expected += r.num_pieces;
    if (stats) stats->max_pieces = std::max(stats->max_pieces, r.num_pieces);
    err.str("");
  }
  if (h.partials != split_pieces) return "partials != pieces of split requests";
  if (h.partials > p.max_partials())
    return "partials " + std::to_string(h.partials) + " > max_partials " +
           std::to_string(p.max_partials());
  if (p.mode == SplitMode::none && h.partials != 0) return "none mode has partials";

  // (a) no CTA lists a request it has no piece of; empty CTAs only past the total or where
  // their whole interval holds leading units (no KV) of requests.
  long long listings = 0;
  for (int c = 0; c < G; ++c) {
    const CtaPlan& cp = h.ctas[c];
    if (cp.req_begin > cp.req_end) {
      const long long hi = std::min<long long>(1LL * (c + 1) * h.per_cta, total);
      for (long long pos = 1LL * c * h.per_cta; pos < hi; ++pos) {
        const int b = request_at(h.requests.data(), B, pos);
        const RequestPlan& r = h.requests[b];
        if (pos - r.cost_begin >= lead_units(p, r.cost, r.kv_len))
          return "CTA " + std::to_string(c) + " idle at KV units of request " + std::to_string(b);
      }
      continue;
    }
    if (cp.req_begin < 0 || cp.req_end >= B)
      return "CTA " + std::to_string(c) + " range outside batch";
    for (int b = cp.req_begin; b <= cp.req_end; ++b) {
      const RequestPlan& r = h.requests[b];
      if (c < r.first_cta || c >= r.first_cta + r.num_pieces)
        return "CTA " + std::to_string(c) + " lists request " + std::to_string(b) +
               " without a piece of it";
      ++listings;
    }
    if (p.mode == SplitMode::none && (cp.req_begin != c || cp.req_end != c))
      return "none mode: CTA " + std::to_string(c) + " is not request c";
    if (p.mode == SplitMode::fixed &&
        (cp.req_begin != c / p.fixed_splits || cp.req_end != c / p.fixed_splits))
      return "fixed mode: CTA " + std::to_string(c) + " covers more than one request";
  }
  if (listings != listings_expected) return "CTA listings != pieces";

  // (b) balance in automatic mode: no CTA holds more tiles than its budget; charging the full
  // overhead to every piece costs at most the two boundary pieces: load <= per_cta + 2 x
  // overhead; an aligned plan has one piece per CTA and load <= per_cta.
  if (p.mode == SplitMode::automatic) {
    for (int c = 0; c < G; ++c) {
      if (tokens_of[c] > 1LL * h.per_cta * kPlanTokens * unit)
        return "CTA " + std::to_string(c) + " has more KV tokens than its budget";
      const long long bound = rounded ? h.per_cta : h.per_cta + 2 * kOverheadUnits;
      if (load_of[c] > bound)
        return "CTA " + std::to_string(c) + " per-piece load " + std::to_string(load_of[c]) +
               " > " + std::to_string(bound);
      if (rounded && pieces_of[c] > 1)
        return "aligned plan: CTA " + std::to_string(c) + " has " + std::to_string(pieces_of[c]) +
               " pieces";
      if (stats)
        stats->max_overload = std::max<int>(stats->max_overload, int(load_of[c] - h.per_cta));
    }
  }
  return "";
}

// Length mixes: uniform, mostly zeros, two populations 1000x apart, one long request among
// tiny ones, tile boundaries, all zeros, all equal.
std::vector<int> random_lengths(std::mt19937_64& g, int batch, int kind) {
  std::vector<int> v(batch);
  auto uni = [&](int lo, int hi) { return lo + int(g() % std::uint64_t(hi - lo + 1)); };
  for (int b = 0; b < batch; ++b) {
    switch (kind) {
      case 0:
        v[b] = uni(0, 200000);
        break;
      case 1:
        v[b] = g() % 10 < 7 ? 0 : uni(0, 200000);
        break;
      case 2:
        v[b] = g() % 2 ? uni(100, 200) : uni(100000, 200000);
        break;
      case 3:
        v[b] = uni(0, 100);
        break;
      case 4:
        v[b] = std::max(0, kPlanTokens * uni(0, 40) + uni(-1, 1));
        break;
      case 5:
        v[b] = 0;
        break;
      default:
        v[b] = 777;
        break;
    }
  }
  if (kind == 3) v[g() % batch] = 200000;
  return v;
}

}  // namespace

TEST_CASE("planner: coverage, balance and capacity on random length mixes", "[planner]") {
  std::mt19937_64 g(0x5eed0001);
  int trials = 0;
  PlanStats stats;
  for (int trial = 0; trial < 6000; ++trial) {
    int batch = 1 + int(g() % 300);
    if (trial % 50 == 0) batch = 1;
    if (trial % 50 == 1) batch = 300;
    const int kind = int(g() % 7);
    const std::vector<int> lens = random_lengths(g, batch, kind);
    PlanShape p;
    p.batch = batch;
    p.mode = SplitMode(trial % 3);
    p.row_tiles = 1 + int(g() % 64);
    p.min_piece_tiles = 1 + int(g() % 4);
    // Half the trials take tiles in pairs, half weigh the partials (1 to 32 per tile).
    p.tile_step = 1 + trial / 3 % 2;
    p.partials_per_tile = trial % 4 < 2 ? 0 : 1 + int(g() % 32);
    p.count_row_tiles = trial % 8 < 4;
    p.fixed_splits = p.mode == SplitMode::fixed ? 1 + int(g() % kMaxSplits) : 1;
    const int sms = trial % 2 ? 132 : 304;
    const int per_sm = 1 + (trial / 2) % 2;
    p.num_ctas = plan_num_ctas(p.mode, p.fixed_splits, batch, p.row_tiles, sms, per_sm);
    const std::string e = check_plan(p, lens, &stats);
    if (!e.empty()) {
      INFO("trial " << trial << " " << mode_name(p.mode) << " batch " << batch << " kind " << kind
                    << " row_tiles " << p.row_tiles << " splits " << p.fixed_splits << " ctas "
                    << p.num_ctas << " sms " << sms << " step " << p.tile_step
                    << " partials per tile " << p.partials_per_tile
                    << (p.count_row_tiles ? " of every row tile" : "") << ": " << e);
      REQUIRE(e.empty());
    }
    ++trials;
  }
  CHECK(trials == 6000);
  // The mixes do split requests; a request may be cut over more CTAs than kMaxSplits (one
  // long request among short ones gets most of the grid).
  INFO("most pieces of one request: " << stats.max_pieces << ", worst per-piece-overhead "
                                      << "overload: " << stats.max_overload << " units");
  CHECK(stats.max_pieces > 1);
}

TEST_CASE("planner: hand-picked mixes", "[planner]") {
  const std::vector<std::vector<int>> mixes = {
      {0},
      {1},
      {200000},
      {0, 0, 0, 0, 0, 0, 0},
      {100000, 1, 0, 100, 1000, 2},
      {63, 64, 65, 127, 128, 129},
      {200, 200000, 200, 200000, 0, 0},
  };
  for (const auto& lens : mixes)
    for (SplitMode m : {SplitMode::automatic, SplitMode::none, SplitMode::fixed})
      for (int row_tiles : {1, 2, 7, 64})
        for (int sms : {1, 132, 304})
          for (int splits : {1, 2, 64}) {
            PlanShape p;
            p.batch = int(lens.size());
            p.mode = m;
            p.row_tiles = row_tiles;
            p.fixed_splits = m == SplitMode::fixed ? splits : 1;
            p.num_ctas = plan_num_ctas(m, p.fixed_splits, p.batch, row_tiles, sms, 2);
            const std::string e = check_plan(p, lens, nullptr);
            INFO(mode_name(m) << " batch " << p.batch << " first len " << lens[0] << " rt "
                              << row_tiles << " sms " << sms << " splits " << splits << ": " << e);
            CHECK(e.empty());
          }
}

TEST_CASE("planner: lengths up to kMaxKvLen in any batch keep the line within int", "[planner]") {
  // Page aliasing lets a request reach the length cap without the memory; 65535 such requests
  // are 2^40 tiles. The line then counts 2^s tiles per unit, and the plan keeps every
  // invariant of check_plan (coverage of [0, kv_len), budgets, partial slots).
  std::mt19937_64 g(0x5eed0003);
  struct C {
    int batch, kind;  // kind 0: all kMaxKvLen, 1: one long among short, 2: random mix
  };
  int shifted = 0;
  for (C c : {C{1, 0}, C{2, 0}, C{15, 0}, C{16, 0}, C{17, 1}, C{300, 2}, C{4096, 2}, C{65535, 0},
              C{65535, 2}}) {
    std::vector<int> lens(c.batch, kMaxKvLen);
    if (c.kind == 1) {
      for (int& x : lens) x = int(g() % 5000);
      lens[g() % c.batch] = kMaxKvLen;
    } else if (c.kind == 2) {
      for (int& x : lens) x = g() % 3 ? kMaxKvLen - int(g() % 100000) : int(g() % 100000);
    }
    for (SplitMode m : {SplitMode::automatic, SplitMode::none, SplitMode::fixed})
      for (int row_tiles : {1, 2}) {
        PlanShape p;
        p.batch = c.batch;
        p.mode = m;
        p.row_tiles = row_tiles;
        p.fixed_splits = m == SplitMode::fixed ? std::max(1, std::min(64, 65535 / c.batch)) : 1;
        p.num_ctas = plan_num_ctas(m, p.fixed_splits, p.batch, row_tiles, 132, 1);
        const int s = plan_tile_shift(p, kv_tiles(*std::max_element(lens.begin(), lens.end())));
        shifted += s > 0;
        const std::string e = check_plan(p, lens, nullptr);
        INFO(mode_name(m) << " batch " << c.batch << " kind " << c.kind << " row_tiles "
                          << row_tiles << " shift " << s << ": " << e);
        CHECK(e.empty());
      }
  }
  CHECK(shifted > 0);  // the absurd batches did take the shifted line
  // kv_tiles and the clamp at the int limit.
  CHECK(kv_tiles(std::numeric_limits<int>::max()) == (1 << 25));
  CHECK(kv_tiles(kMaxKvLen) == (1 << 24));
  CHECK(kv_tiles(-5) == 0);
  CHECK(kv_tiles(65) == 2);
  CHECK(clamp_kv_len(std::numeric_limits<int>::max(), std::int64_t(1) << 40) == kMaxKvLen);
}

TEST_CASE("line_may_shift: false only where no allowed length shifts the line", "[planner]") {
  // The device planner skips the search for the longest request when PlanShape::may_shift is
  // false, taking shift 0: sound only if every length up to the mapping's bound gives shift 0.
  std::mt19937_64 g(0x5eed0004);
  int fast = 0, slow = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    PlanShape p;
    p.batch = trial % 4 == 0 ? 1 + int(g() % 20) : 1 + int(g() % 65535);
    p.mode = trial % 7 == 0 ? SplitMode::fixed : SplitMode::automatic;
    const int bound = trial % 3 == 0 ? kMaxKvLen : int(g() % (std::uint64_t(kMaxKvLen) + 1));
    const bool may = line_may_shift(p, bound);
    fast += !may;
    slow += may;
    const int max_tiles = kv_tiles(bound);
    INFO("batch " << p.batch << " bound " << bound << " " << mode_name(p.mode));
    CHECK(may == (expected_shift(p, max_tiles) > 0));  // the bound's own shift, by definition
    // Monotone in the length: no length up to the bound needs a shift when the bound does not.
    if (!may) CHECK(expected_shift(p, int(g() % (std::uint64_t(max_tiles) + 1))) == 0);
    CHECK(plan_tile_shift(p, max_tiles) == expected_shift(p, max_tiles));
  }
  CHECK(fast > 0);
  CHECK(slow > 0);
  // Any batch of up to 15 requests takes the single pass whatever the mapping; lengths past
  // kMaxKvLen count as kMaxKvLen.
  for (int b = 1; b <= 15; ++b) {
    PlanShape p;
    p.batch = b;
    CHECK_FALSE(line_may_shift(p, std::numeric_limits<int>::max()));
  }
  PlanShape p16;
  p16.batch = 16;
  CHECK(line_may_shift(p16, kMaxKvLen));
  CHECK_FALSE(line_may_shift(p16, 8192));
}

TEST_CASE("planner: equal lengths split into equal pieces, or not at all", "[planner]") {
  // Shapes measured on the H200 (132 SMs; kv_len 8192 is 128 tiles, 1024 is 16): the pieces
  // each request gets, k = floor(CTAs / batch) at most, each of the same tile count (within
  // one). Requests start at CTA boundaries, so none gets k + 1 pieces at shifted boundaries.
  struct C {
    int batch, len, row_tiles, per_sm, min_tiles, pieces, piece_tiles;
  };
  const C cases[] = {
      {128, 8192, 1, 1, 2, 1, 128},  // 64-row tile, 128 requests on 132 SMs: no split
      {128, 8192, 1, 2, 2, 2, 64},   // 16-row tile, two per SM: 2 pieces each
      {32, 8192, 2, 1, 2, 2, 64},    // 128 rows (2 row tiles), batch 32: 2 pieces
      {32, 1024, 2, 1, 2, 2, 8},     //   ... with kv_len 1024
      {128, 1024, 2, 1, 2, 1, 16},   // batch 128, kv_len 1024, 2 row tiles: no split
      {32, 8192, 1, 1, 2, 4, 32},    // 32 requests of one row tile: 4 pieces
      {8, 8192, 2, 1, 2, 8, 16},     // batch 8, 2 row tiles: 8 pieces of 16 tiles (a packed
                                     //   plan cut 15, 17 x 6 and 11)
      {8, 1024, 2, 1, 2, 8, 2},      // ... kv_len 1024: 8 pieces of 2 tiles (packed: 6 of 1-3)
      {8, 8192, 1, 1, 2, 16, 8},     // batch 8, one row tile: 16 pieces of 8 (packed: 17)
      {1, 8192, 2, 1, 2, 64, 2},     // batch 1: 64 pieces of 2 tiles (min_piece_tiles)
      {1, 8192, 1, 2, 2, 64, 2},     //   ... also with 264 CTAs
      {1, 1024, 1, 2, 1, 16, 1},     // a policy with 1-tile pieces (16-row tiles): 16 of them
      {1, 2048, 1, 2, 1, 32, 1},     //   ... up to kShortRequestTiles tiles
      {1, 8192, 1, 2, 1, 64, 2},     //   ... but 2-tile pieces for longer requests
      {1, 32768, 2, 1, 2, 64, 8},    // batch 1, kv_len 32768: 64 pieces of 8 tiles
  };
  for (const C& c : cases) {
    PlanShape p;
    p.batch = c.batch;
    p.mode = SplitMode::automatic;
    p.row_tiles = c.row_tiles;
    p.min_piece_tiles = c.min_tiles;
    p.num_ctas = plan_num_ctas(p.mode, 1, p.batch, p.row_tiles, 132, c.per_sm);
    const std::vector<int> lens(c.batch, c.len);
    INFO("batch " << c.batch << " kv_len " << c.len << " row tiles " << c.row_tiles << " per SM "
                  << c.per_sm << " CTAs " << p.num_ctas);
    REQUIRE(check_plan(p, lens, nullptr).empty());
    const HostPlan h = plan_on_host(p, lens.data());
    for (int b = 0; b < c.batch; ++b) {
      const RequestPlan& r = h.requests[b];
      CHECK(r.num_pieces == c.pieces);
      for (int i = 0; i < r.num_pieces; ++i) {
        const Piece pc = piece_of(p, r, r.first_cta + i, h.per_cta);
        CHECK(pc.kv_end - pc.kv_begin == c.piece_tiles * kPlanTokens);
      }
    }
    // The makespan (t + overhead: the budget) is never more than 1/8 above the packed plan's.
    long long raw = 0;
    for (int len : lens) raw += expected_cost(p, len);
    const long long least = std::max<long long>(kMinPieceUnits, ceil_div(raw, p.num_ctas));
    CHECK(8LL * h.per_cta <= 9 * (least + kOverheadUnits));
  }
}

TEST_CASE("planner: one grid serves every step (num_ctas never depends on kv_len)", "[planner]") {
  // plan_num_ctas takes no lengths: check its values against the documented formula, then
  // that one shape yields a valid plan for every length mix of the same batch.
  for (int sms : {1, 80, 132, 304})
    for (int per_sm : {1, 2, 3})
      for (int batch : {0, 1, 2, 3, 5, 64, 300, 5000})
        for (int rt = 1; rt <= 64; ++rt) {
          // One wave of resident CTAs per row tile.
          const int target = std::max(1, int(ceil_div(1LL * per_sm * sms, rt)));
          // At least one CTA per request, at most kMaxAutoSplits per request.
          const int autom =
              batch == 0 ? 0 : std::min(std::max(target, batch), batch * kMaxAutoSplits);
          CHECK(plan_num_ctas(SplitMode::automatic, 1, batch, rt, sms, per_sm) == autom);
          CHECK(plan_num_ctas(SplitMode::none, 7, batch, rt, sms, per_sm) == batch);
          CHECK(plan_num_ctas(SplitMode::fixed, 7, batch, rt, sms, per_sm) == 7 * batch);
        }
  std::mt19937_64 g(0x5eed0002);
  for (int trial = 0; trial < 300; ++trial) {
    PlanShape p;
    p.batch = 1 + int(g() % 300);
    p.mode = SplitMode(trial % 3);
    p.row_tiles = 1 + int(g() % 64);
    p.fixed_splits = 1 + int(g() % 64);
    p.num_ctas = plan_num_ctas(p.mode, p.fixed_splits, p.batch, p.row_tiles, 132, 1 + trial % 2);
    for (int step = 0; step < 8; ++step) {
      const std::string e = check_plan(p, random_lengths(g, p.batch, step % 7), nullptr);
      INFO("trial " << trial << " step " << step << ": " << e);
      REQUIRE(e.empty());
    }
  }
}

TEST_CASE("cta_slot: a bijection of the grid, even blocks first", "[planner]") {
  for (int g = 1; g <= 300; ++g) {
    std::vector<int> seen(g, 0);
    for (int i = 0; i < g; ++i) {
      const int s = cta_slot(i, g);
      REQUIRE(s >= 0);
      REQUIRE(s < g);
      ++seen[s];
      // Slots 0 .. ceil(g / 2) - 1 run on the even blocks, in order.
      if (i % 2 == 0) REQUIRE(s == i / 2);
    }
    for (int s = 0; s < g; ++s) REQUIRE(seen[s] == 1);
  }
}

TEST_CASE("clamp_kv_len: negative to 0, beyond capacity to capacity, negative capacity to 0",
          "[planner]") {
  const int kMin = std::numeric_limits<int>::min(), kMax = std::numeric_limits<int>::max();
  struct C {
    int len;
    std::int64_t cap;
    int want;
  };
  for (C c : {C{-1, 100, 0}, C{kMin, 100, 0}, C{0, 100, 0}, C{0, 0, 0}, C{5, 0, 0}, C{99, 100, 99},
              C{100, 100, 100}, C{101, 100, 100}, C{kMax, 100, 100},
              C{kMax, std::int64_t(1) << 40, kMaxKvLen}, C{7, std::int64_t(1) << 40, 7},
              C{300, 256, 256}, C{5, -64, 0}, C{0, -1, 0}, C{kMax, -(std::int64_t(1) << 40), 0}}) {
    INFO("len " << c.len << " capacity " << c.cap);
    CHECK(clamp_kv_len(c.len, c.cap) == c.want);
  }
}

TEST_CASE("visible_keys: bottom-right causal window", "[planner]") {
  static_assert(visible_keys(5, 8, 0, true) == 0, "kv_len < q_len: first tokens see nothing");
  static_assert(visible_keys(5, 8, 7, true) == 5, "the last token sees every key");
  static_assert(visible_keys(5, 8, 0, false) == 5, "non-causal sees every key");
  for (int kv = -3; kv <= 80; ++kv)
    for (int q = 1; q <= kMaxQLen; ++q)
      for (int t = 0; t < q; ++t) {
        // Token t sees keys j in [0, kv) with j <= kv - q + t.
        int causal = 0;
        for (int j = 0; j < kv; ++j) causal += j <= kv - q + t;
        const int full = std::max(kv, 0);
        if (visible_keys(kv, q, t, true) != causal || visible_keys(kv, q, t, false) != full) {
          INFO("kv " << kv << " q " << q << " t " << t);
          CHECK(visible_keys(kv, q, t, true) == causal);
          CHECK(visible_keys(kv, q, t, false) == full);
        }
        // The last query token (the end of a row tile's KV range) sees every cached key.
        if (t == q - 1) CHECK(visible_keys(kv, q, t, true) == full);
      }
}

namespace {

// A softmax over `s` (scores) and `v` (values, dim D) computed directly in double.
struct Softmax {
  double lse = -INFINITY;
  std::vector<double> o;
};

Softmax direct(const std::vector<double>& s, const std::vector<std::vector<double>>& v, int lo,
               int hi, int D) {
  Softmax r;
  r.o.assign(D, 0.0);
  if (hi <= lo) return r;
  double m = -INFINITY;
  for (int j = lo; j < hi; ++j) m = std::max(m, s[j]);
  double sum = 0;
  for (int j = lo; j < hi; ++j) {
    const double p = std::exp(s[j] - m);
    sum += p;
    for (int d = 0; d < D; ++d) r.o[d] += p * v[j][d];
  }
  for (int d = 0; d < D; ++d) r.o[d] /= sum;
  r.lse = m + std::log(sum);
  return r;
}

}  // namespace

TEST_CASE("LseMerge: merging split softmaxes equals the unsplit softmax", "[planner]") {
  std::mt19937_64 g(0x5eed0003);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  constexpr int D = 8;
  double worst_lse = 0, worst_o = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const int n = 1 + int(g() % 600);
    const double spread = trial % 4 == 0 ? 40.0 : 8.0;  // peaky softmax: far-apart part LSEs
    const double shift = u(g) * 15.0;
    std::vector<double> s(n);
    std::vector<std::vector<double>> v(n, std::vector<double>(D));
    for (int j = 0; j < n; ++j) {
      s[j] = shift + spread * u(g);
      for (int d = 0; d < D; ++d) v[j][d] = u(g);
    }
    // Random cut points, empty parts allowed (they carry LSE -inf).
    const int parts = 1 + int(g() % 12);
    std::vector<int> cuts = {0, n};
    for (int i = 1; i < parts; ++i) cuts.push_back(int(g() % (n + 1)));
    std::sort(cuts.begin(), cuts.end());
    std::vector<float> lse;
    std::vector<std::vector<float>> o;
    for (std::size_t i = 0; i + 1 < cuts.size(); ++i) {
      const Softmax part = direct(s, v, cuts[i], cuts[i + 1], D);
      lse.push_back(static_cast<float>(part.lse));
      o.emplace_back(part.o.begin(), part.o.end());
    }
    // Merge in a shuffled order: the result must not depend on it.
    std::vector<int> order(lse.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = int(i);
    std::shuffle(order.begin(), order.end(), g);
    LseMerge merge;
    for (int i : order) merge.add(lse[i]);
    std::vector<double> merged(D, 0.0);
    double wsum = 0;
    for (int i : order) {
      const float w = merge.weight(lse[i]);
      CHECK(w >= 0.0f);
      if (std::isinf(lse[i])) CHECK(w == 0.0f);
      wsum += w;
      for (int d = 0; d < D; ++d) merged[d] += double(w) * o[i][d];
    }
    // The two-pass form the combine kernel uses (max of all parts first, then
    // add_below_max in any fixed order) gives the same LSE.
    LseMerge two_pass;
    for (int i : order) two_pass.max_lse = std::max(two_pass.max_lse, lse[i]);
    for (int i : order) two_pass.add_below_max(lse[i]);
    CHECK(two_pass.lse() == Approx(merge.lse()).margin(1e-5));
    const Softmax full = direct(s, v, 0, n, D);
    const double lse_err = std::fabs(double(merge.lse()) - full.lse);
    double o_err = 0;
    for (int d = 0; d < D; ++d) o_err = std::max(o_err, std::fabs(merged[d] - full.o[d]));
    worst_lse = std::max(worst_lse, lse_err);
    worst_o = std::max(worst_o, o_err);
    if (lse_err > 1e-5 || o_err > 1e-5 || std::fabs(wsum - 1.0) > 1e-5) {
      INFO("trial " << trial << " n " << n << " parts " << lse.size() << " lse " << merge.lse()
                    << " vs " << full.lse << " o_err " << o_err << " wsum " << wsum);
      CHECK(lse_err <= 1e-5);
      CHECK(o_err <= 1e-5);
      CHECK(std::fabs(wsum - 1.0) <= 1e-5);
    }
  }
  INFO("worst lse error " << worst_lse << ", worst output error " << worst_o);
  CHECK(worst_lse <= 1e-5);
}

TEST_CASE("LseMerge: batch steps and state merges give the part-by-part merge", "[planner]") {
  // The combine kernel's form: parts dealt to W groups in turn, each group walks its parts k
  // at a time (raise_max with the batch's largest LSE, rescale the weighted sum, add_below_max
  // per part), then the groups' states are merged (max first, then merge_below_max in group
  // order) and each group's weighted sum is scaled by the factor merge_below_max returned times
  // inv_sum(). It must give the LSE and the merged output of add() + weight() part by part.
  std::mt19937_64 g(0x5eed0004);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  const float ninf = -std::numeric_limits<float>::infinity();
  double worst_lse = 0, worst_o = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int n = 1 + int(g() % 300);
    const int W = 1 << int(g() % 4), k = 1 + int(g() % 8);
    const double spread = trial % 3 == 0 ? 60.0 : 6.0;
    std::vector<float> lse(n), o(n);
    for (int i = 0; i < n; ++i) {
      lse[i] = g() % 7 == 0 ? ninf : float(spread * u(g));
      o[i] = float(u(g));
    }
    LseMerge ref;
    for (float x : lse) ref.add(x);
    double ref_o = 0;
    for (int i = 0; i < n; ++i) ref_o += double(ref.weight(lse[i])) * o[i];

    std::vector<LseMerge> st(W);
    std::vector<float> acc(W, 0.0f);
    for (int w = 0; w < W; ++w) {
      std::vector<int> mine;
      for (int i = w; i < n; i += W) mine.push_back(i);
      for (std::size_t p0 = 0; p0 < mine.size(); p0 += k) {
        const std::size_t end = std::min(mine.size(), p0 + k);
        float bm = ninf;
        for (std::size_t p = p0; p < end; ++p) bm = std::max(bm, lse[mine[p]]);
        if (bm == ninf) continue;
        const bool was_empty = st[w].max_lse == ninf;
        const float f = st[w].raise_max(bm);
        if (was_empty) CHECK(f == 0.0f);  // first batch with a key: acc is dropped
        acc[w] *= f;
        for (std::size_t p = p0; p < end; ++p)
          acc[w] += st[w].add_below_max(lse[mine[p]]) * o[mine[p]];
      }
    }
    LseMerge row;
    for (int w = 0; w < W; ++w) row.raise_max(st[w].max_lse);
    std::vector<float> fac(W);
    for (int w = 0; w < W; ++w) fac[w] = row.merge_below_max(st[w]);
    double got_o = 0;
    for (int w = 0; w < W; ++w) {
      got_o += double(fac[w] * row.inv_sum()) * acc[w];
      // The factor times 1 / sum is the group's weight in the merge.
      CHECK(fac[w] * row.inv_sum() == Approx(row.weight(st[w].max_lse)).margin(1e-7));
    }
    if (ref.lse() == ninf) {
      CHECK(row.lse() == ninf);
      CHECK(got_o == 0.0);
      continue;
    }
    const double lse_err = std::fabs(double(row.lse()) - double(ref.lse()));
    const double o_err = std::fabs(got_o - ref_o);
    worst_lse = std::max(worst_lse, lse_err);
    worst_o = std::max(worst_o, o_err);
    if (lse_err > 1e-5 || o_err > 1e-5) {
      INFO("trial " << trial << " n " << n << " W " << W << " k " << k);
      CHECK(lse_err <= 1e-5);
      CHECK(o_err <= 1e-5);
    }
  }
  INFO("worst lse error " << worst_lse << ", worst output error " << worst_o);
  CHECK(worst_lse <= 1e-5);
  CHECK(worst_o <= 1e-5);
  // raise_max: no move gives 1 and changes nothing; a move rescales the sum.
  LseMerge m;
  CHECK(m.raise_max(ninf) == 1.0f);
  CHECK(m.raise_max(2.0f) == 0.0f);
  CHECK(m.add_below_max(2.0f) == 1.0f);
  CHECK(m.raise_max(1.0f) == 1.0f);
  CHECK(m.max_lse == 2.0f);
  const float f = m.raise_max(2.0f + float(std::log(4.0)));
  CHECK(f == Approx(0.25).epsilon(1e-6));
  CHECK(m.sum == Approx(0.25).epsilon(1e-6));
  LseMerge e;
  CHECK(e.merge_below_max(LseMerge{}) == 0.0f);  // an empty state adds nothing
  CHECK(e.lse() == ninf);
  CHECK(e.inv_sum() == 0.0f);
  e.raise_max(m.max_lse);
  CHECK(e.merge_below_max(m) == 1.0f);
  CHECK(e.lse() == Approx(m.lse()).epsilon(1e-7));
  CHECK(e.inv_sum() == Approx(1.0 / m.sum).epsilon(1e-7));
}

TEST_CASE("LseMerge: -inf parts are ignored, all -inf gives -inf and zero weights", "[planner]") {
  const float ninf = -std::numeric_limits<float>::infinity();
  LseMerge none;
  CHECK(none.lse() == ninf);
  CHECK(none.weight(ninf) == 0.0f);
  CHECK(none.weight(0.0f) == 0.0f);
  for (int k = 1; k <= 5; ++k) {
    LseMerge m, p;
    for (int i = 0; i < k; ++i) m.add(ninf);
    for (int i = 0; i < k; ++i) p.add_below_max(ninf);  // max stays -inf: nothing is added
    CHECK(m.lse() == ninf);
    CHECK(m.weight(ninf) == 0.0f);
    CHECK(p.lse() == ninf);
    CHECK(p.weight(0.0f) == 0.0f);
  }
  // A single finite part keeps its LSE exactly and gets weight 1, wherever the -inf parts go.
  for (float x : {-87.5f, -3.25f, 0.0f, 1.0f, 12.75f, 5000.0f}) {
    LseMerge a, b;
    a.add(ninf);
    a.add(x);
    a.add(ninf);
    b.add(x);
    CHECK(a.lse() == x);
    CHECK(b.lse() == x);
    CHECK(a.weight(x) == 1.0f);
    CHECK(a.weight(ninf) == 0.0f);
  }
  // Two equal parts: LSE + ln 2, weights 1/2; far-apart parts: the small one vanishes.
  LseMerge two;
  two.add(3.0f);
  two.add(ninf);
  two.add(3.0f);
  CHECK(two.lse() == Approx(3.0 + std::log(2.0)).epsilon(1e-6));
  CHECK(two.weight(3.0f) == Approx(0.5).epsilon(1e-6));
  LseMerge far;
  far.add(-100.0f);
  far.add(100.0f);
  CHECK(far.lse() == Approx(100.0).epsilon(1e-7));
  CHECK(far.weight(100.0f) == Approx(1.0).epsilon(1e-7));
  CHECK(far.weight(-100.0f) == 0.0f);
  CHECK_FALSE(std::isnan(far.lse()));
}

TEST_CASE("planner: aligned pieces of tile pairs weighed against their partials", "[planner]") {
  PlanShape p;
  p.mode = SplitMode::automatic;
  p.tile_step = 2;
  p.partials_per_tile = 24;
  // No weight: t rounded up to the step only.
  PlanShape plain = p;
  plain.partials_per_tile = 0;
  CHECK(aligned_piece_tiles(plain, 1000, 100, 3) == 4);
  CHECK(aligned_piece_tiles(plain, 1000, 100, 4) == 4);
  // 128 tiles on one row tile: 2 x 4 x 24 = 192 >= 128, t stays 2; on two counted row tiles
  // 192 < 256 and 4 x 6 x 24 >= 256: 4.
  p.row_tiles = 2;
  CHECK(aligned_piece_tiles(p, 128, 128, 2) == 2);
  p.count_row_tiles = true;
  CHECK(aligned_piece_tiles(p, 128, 128, 2) == 4);
  // A tie (2 x 24 + 192 / 2 == 4 x 24 + 192 / 4) keeps the shorter piece.
  p.count_row_tiles = false;
  CHECK(aligned_piece_tiles(p, 192, 192, 2) == 2);
  CHECK(aligned_piece_tiles(p, 193, 193, 2) == 4);
  // Never past the longest request rounded up to the step.
  CHECK(aligned_piece_tiles(p, 100000, 5, 2) == 6);
  // The whole plan: batch 1 x 8192 tokens on 2 row tiles of 66 CTAs, 32 pieces of 4 tiles.
  p.batch = 1;
  p.count_row_tiles = true;
  p.num_ctas = plan_num_ctas(p.mode, 1, 1, 2, 132, 1);
  const int len = 8192;
  const HostPlan h = plan_on_host(p, &len);
  REQUIRE(check_plan(p, {len}, nullptr).empty());
  CHECK(h.requests[0].num_pieces == 32);
  CHECK(h.per_cta == 4 + kOverheadUnits);
}
