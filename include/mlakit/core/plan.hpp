#pragma once
// The split-KV planner's arithmetic, shared by the device planner kernel and the host tests.
//
// Every request b gets a cost interval [prefix[b], prefix[b] + cost[b]) on one line; the line
// [0, total) is cut into intervals of `per_cta` units, one per CTA (per row tile), with
// per_cta x num_ctas >= total (CTAs past the total have no work). A CTA processes, in order,
// the pieces of every request whose interval meets its own past the request's leading units
// (request_ctas), so KV work is balanced whatever the lengths, and the grid depends only on
// batch, rows and the device, never on kv_len values (one captured graph serves every decode
// step).
//
// Modes: automatic costs a request kOverheadUnits + ceil(kv_len / kPlanTokens) units (the
// overhead stands for loading Q and writing O or a partial); none costs 1 unit per request with
// one CTA per request; fixed costs num_splits units, one per CTA. In automatic mode a request's
// units map to its KV tiles in proportion (token_at): the overhead is spread over the request's
// pieces, as every piece pays it (a Q load, a partial). The automatic budget per CTA is one of
// two plans (plan_budget): the least budget that fits the line (ceil(total / num_ctas)
// units), requests packed end to end; or an aligned plan, taken when its makespan is at most
// 1/8 longer, in which every request starts at a CTA boundary and is cut into
// ceil(tiles / t) pieces of at most t tiles, one piece per CTA, where t is the least tile
// count that lets the longest request have floor(num_ctas / batch) pieces. Equal lengths then
// get equal pieces: k each (or none), never k + 1 at shifted boundaries, each costing a Q
// load, a partial and a pipeline fill.
#include <cstdint>

#include "config.hpp"
#include "decode_args.hpp"

namespace mlakit {

inline constexpr int kPlanTokens = 64;    // KV tokens per cost unit (one KV tile)
inline constexpr int kOverheadUnits = 2;  // automatic mode: fixed cost of each request (piece)
inline constexpr int kMinPieceUnits = 2;  // automatic mode: least budget per CTA, in units
inline constexpr int kMinPieceTiles = 2;  // automatic mode: least tiles of an aligned piece
// Automatic mode: requests of at most this many tiles may be cut into pieces of fewer than
// kMinPieceTiles tiles where the policy allows it (PlanShape::min_piece_tiles).
inline constexpr int kShortRequestTiles = 32;
inline constexpr int kAlignSlack = 8;  // automatic mode: aligned makespan <= least x (1 + 1/8)
// Longest request the planner and kernels take: kv_len is clamped to it on the device, like
// the page capacity (clamp_kv_len). 2^30 tokens is beyond any model's context and leaves the
// kernels' int token arithmetic (tile starts, a padded tile past the end) a factor of 2 of
// headroom.
inline constexpr int kMaxKvLen = 1 << 30;
// Automatic mode: most units on the line. A batch whose longest request would exceed it counts
// 2^s KV tiles per unit (tile_shift), so the int prefix sums of the line stay far from
// overflow whatever the lengths (65535 requests of kMaxKvLen tokens: 2^40 tiles).
inline constexpr int kMaxLineUnits = 1 << 28;
// Automatic mode: most CTAs per request (on average). High enough that one long request fills
// every SM (batch 1 x 131072 tokens had 64 CTAs under the old cap, the fixed-mode limit
// kMaxSplits, and ran at a tenth of the memory bound); the combine kernel merges hundreds of
// pieces per row in parallel.
inline constexpr int kMaxAutoSplits = 512;

// Grid-level shape of a plan: everything here is known on the host before launch.
struct PlanShape {
  int batch = 0;
  int row_tiles = 1;  // CTAs along the row dimension (rows of a request / rows per CTA)
  int num_ctas = 0;   // CTAs along the KV dimension (the planner's G)
  SplitMode mode = SplitMode::automatic;
  int fixed_splits = 1;
  // Automatic mode: least KV tiles of a piece in an aligned plan when the longest request has
  // at most kShortRequestTiles tiles (arch::TilePolicy::min_piece_tiles, >= 1); longer requests
  // get at least kMinPieceTiles (a shorter piece moves less KV than the Q load and partial it
  // costs, and adds a partial to merge).
  int min_piece_tiles = kMinPieceTiles;
  // Automatic mode: whether some request lengths the page mapping allows could give the line a
  // tile shift (line_may_shift, set on the host by plan_shape_for). When false the planner
  // takes shift 0 without first finding the longest request. true is always safe.
  bool may_shift = true;
  // Automatic mode, aligned plans: KV tiles the decode kernel consumes together (the 64-row
  // kernels take tiles in pairs and pad an odd count), so a piece of a multiple of it wastes
  // none; pieces of an aligned plan are at least this long and a multiple of it
  // (aligned_piece_tiles).
  int tile_step = 1;
  // Automatic mode, aligned plans: pieces of the line (each a partial written, read and
  // merged), counted in every row tile where count_row_tiles, else in one, that cost as much as
  // one more KV tile in every piece; 0 for none. With it the piece size trades the two
  // (aligned_piece_tiles): where pieces are many, fewer longer ones.
  int partials_per_tile = 0;
  bool count_row_tiles = false;

  // Equal shapes give equal plans for equal lengths and page capacities (every field above
  // enters the plan).
  bool operator==(const PlanShape& o) const {
    return batch == o.batch && row_tiles == o.row_tiles && num_ctas == o.num_ctas &&
           mode == o.mode && fixed_splits == o.fixed_splits &&
           min_piece_tiles == o.min_piece_tiles && may_shift == o.may_shift &&
           tile_step == o.tile_step && partials_per_tile == o.partials_per_tile &&
           count_row_tiles == o.count_row_tiles;
  }

  // Upper bound on pieces that belong to split requests: each CTA is the first or last CTA
  // of at most two split requests, and a request strictly inside a CTA's range is unsplit.
  MLAKIT_HOST_DEVICE std::int64_t max_partials() const {
    if (mode == SplitMode::none) return 0;
    const std::int64_t a = 2 * std::int64_t(num_ctas);
    const std::int64_t b = std::int64_t(num_ctas) + batch;
    return a < b ? a : b;
  }
};

// Number of CTAs along KV for a request mix of `batch` requests and `row_tiles` row tiles on
// a device with `sm_count` SMs, for a kernel that keeps `ctas_per_sm` CTAs resident per SM.
// Depends on nothing that lives on the device. Computed in 64 bits, so any int inputs give a
// count without overflow (saturating at INT_MAX; decode() only passes validated ones, for which
// every count fits the grid).
MLAKIT_HOST_DEVICE inline int plan_num_ctas(SplitMode mode, int fixed_splits, int batch,
                                            int row_tiles, int sm_count, int ctas_per_sm) {
  if (batch <= 0) return 0;
  if (mode == SplitMode::none) return batch;
  std::int64_t g = std::int64_t(batch) * fixed_splits;
  if (mode != SplitMode::fixed) {
    // One wave of resident CTAs: a second wave of a one-CTA-per-SM kernel only adds pieces
    // (partials, combine, Q reloads) and no SM to run them (docs/performance.md, "Constants").
    const std::int64_t per_sm = ctas_per_sm < 1 ? 1 : ctas_per_sm;
    const std::int64_t tiles = row_tiles < 1 ? 1 : row_tiles;
    const std::int64_t target = (per_sm * sm_count + tiles - 1) / tiles;
    const std::int64_t cap = std::int64_t(batch) * kMaxAutoSplits;
    // At least one CTA per request: when requests (times row tiles) already fill the waves,
    // fewer CTAs than requests only adds boundary splits and coarser waves (docs/performance.md).
    g = target > batch ? target : batch;
    g = g < cap ? g : cap;
  }
  constexpr std::int64_t kIntMax = 2147483647;
  return static_cast<int>(g < kIntMax ? g : kIntMax);
}

// Tokens the page mapping of request b holds: max_pages_per_request x page_size (block table)
// or (kv_indptr[b + 1] - kv_indptr[b]) x page_size (CSR; 0 when kv_indices is null, which
// declares that no request has a page). Reads kv_indptr: device memory in the planner kernel,
// host memory in the reference. Negative for a decreasing kv_indptr; clamp_kv_len takes that
// as 0.
MLAKIT_HOST_DEVICE inline std::int64_t page_capacity(const DecodeArgs& a, int b) {
  if (a.page_ids == PageIds::block_table)
    return std::int64_t(a.max_pages_per_request) * a.page_size;
  if (a.kv_indices == nullptr) return 0;
  return (std::int64_t(a.kv_indptr[b + 1]) - a.kv_indptr[b]) * a.page_size;
}

// Request length after the device-side clamp: negative values count as 0 and values past the
// request's page capacity are cut to it, so no page outside the mapping is ever read; lengths
// past kMaxKvLen are cut to it. A negative capacity (a decreasing CSR kv_indptr) counts as 0.
MLAKIT_HOST_DEVICE inline int clamp_kv_len(int len, std::int64_t capacity) {
  if (len <= 0 || capacity <= 0) return 0;
  if (capacity > kMaxKvLen) capacity = kMaxKvLen;
  return std::int64_t(len) > capacity ? static_cast<int>(capacity) : len;
}

// The CTA (line slot) that the block with grid index i of g along KV runs: even indices take
// slots 0, 1, ... and odd ones the upper half, so that a plan that uses only its first slots
// (a short request at small batch) runs on every other block. The GPU hands the blocks of a
// one-CTA-per-SM grid to the two SMs of a TPC in turn (blocks 2k and 2k + 1 share one), so such
// a plan then runs on one SM of as many TPCs, as fast as a grid of only its working blocks. Only
// the warp-specialized kernel uses it: the other kernels gain nothing from it or lose
// (docs/performance.md, "Constants").
MLAKIT_HOST_DEVICE inline int cta_slot(int i, int g) {
  return (i & 1) ? (g + 1) / 2 + (i >> 1) : (i >> 1);
}

// KV tiles of a request of kv_len tokens (0 for kv_len <= 0; no overflow near INT_MAX).
MLAKIT_HOST_DEVICE inline int kv_tiles(int kv_len) {
  return kv_len > 0 ? (kv_len - 1) / kPlanTokens + 1 : 0;
}

// Automatic mode: KV tiles per cost unit, as a power of two: the least s with
// batch x (kOverheadUnits + ceil(max_tiles / 2^s)) <= kMaxLineUnits, where max_tiles is the
// longest request's tile count. 0 whenever the line fits (all but absurd inputs: up to 65535
// requests of 4094 tiles, or 128 of 2 million tiles); other modes count no tiles.
// Multiplications only: a 64-bit division is a long subroutine on the GPU (the planner's
// search form evaluates this in every thread).
MLAKIT_HOST_DEVICE inline int plan_tile_shift(const PlanShape& p, int max_tiles) {
  if (p.mode != SplitMode::automatic || p.batch <= 0) return 0;
  const std::int64_t tiles = max_tiles;
  int s = 0;
  for (; s < 30; ++s) {
    const std::int64_t units = (tiles + (std::int64_t(1) << s) - 1) >> s;  // ceil(tiles / 2^s)
    if (p.batch * (kOverheadUnits + units) <= kMaxLineUnits) break;
  }
  return s;
}

// Whether a request of up to max_len tokens (clamped: at most kMaxKvLen) could give the line of
// p a tile shift: PlanShape::may_shift for the longest length a mapping allows, min(page
// capacity, kMaxKvLen) for a block table, kMaxKvLen for CSR. False for every batch of up to
// 15 requests and for block tables of ordinary capacity.
MLAKIT_HOST_DEVICE inline bool line_may_shift(const PlanShape& p, int max_len) {
  return plan_tile_shift(p, kv_tiles(max_len < kMaxKvLen ? max_len : kMaxKvLen)) > 0;
}

// KV units of a request of kv_len tokens: its tiles counted 2^tile_shift per unit, rounded up.
MLAKIT_HOST_DEVICE inline int kv_units(int kv_len, int tile_shift) {
  const int tiles = kv_tiles(kv_len);
  return tiles > 0 ? ((tiles - 1) >> tile_shift) + 1 : 0;
}

// Units of a request: none 1, fixed num_splits, automatic kOverheadUnits + kv_units.
MLAKIT_HOST_DEVICE inline int request_cost(const PlanShape& p, int kv_len, int tile_shift = 0) {
  switch (p.mode) {
    case SplitMode::none:
      return 1;
    case SplitMode::fixed:
      return p.fixed_splits;
    default:
      return kOverheadUnits + kv_units(kv_len, tile_shift);
  }
}

// First KV token that belongs to cost position `pos` (0..cost) of a request: the pieces of a
// request cover [token_at(lo), token_at(hi)) and together exactly [0, kv_len). Automatic mode:
// tile floor(pos x tiles / cost), so a piece of w units gets w x tiles / cost tiles (rounded),
// whatever the overhead and padding in the cost, and equal shares of a request get equal tiles.
MLAKIT_HOST_DEVICE inline int token_at(const PlanShape& p, int kv_len, int cost, int pos) {
  if (pos >= cost) return kv_len;
  switch (p.mode) {
    case SplitMode::none:
      return 0;
    case SplitMode::fixed: {
      const int tiles = kv_tiles(kv_len);
      const int chunk = ((tiles + cost - 1) / cost) * kPlanTokens;
      const std::int64_t t = std::int64_t(pos) * chunk;
      return t > kv_len ? kv_len : static_cast<int>(t);
    }
    default:  // 0 <= pos < cost: tile < tiles, so the token is below kv_len
      return static_cast<int>(std::int64_t(pos) * kv_tiles(kv_len) / cost) * kPlanTokens;
  }
}

// Units per CTA for a total cost: ceil(total / num_ctas), at least 1.
MLAKIT_HOST_DEVICE inline int per_cta_units(int total, int num_ctas) {
  const int u = (total + num_ctas - 1) / num_ctas;
  return u < 1 ? 1 : u;
}

// Least tiles of a piece of an aligned plan whose longest request has max_tiles tiles.
MLAKIT_HOST_DEVICE inline int least_piece_tiles(const PlanShape& p, int max_tiles) {
  const int m = p.min_piece_tiles > 1 ? p.min_piece_tiles : 1;
  return max_tiles <= kShortRequestTiles || m >= kMinPieceTiles ? m : kMinPieceTiles;
}

// Aligned plan: the tiles of a piece, given the least count t that fits the grid, the line's
// KV units `units` (the total less every request's overhead) and the longest request's
// `max_tiles`: t rounded up to p.tile_step; then, with M = p.partials_per_tile > 0, the step
// multiple u >= t that minimises u x M + rows x units / u (a piece's tiles plus the pieces of
// the line as if its requests were one; rows: p.row_tiles where p.count_row_tiles, else 1):
// the least u with u x (u + step) x M >= rows x units, where the next step stops paying,
// and at most max_tiles rounded up to the step. Multiplications only, and no step where
// t x (t + step) x M already reaches rows x units (every plan but those of many short
// pieces): the planner is latency bound and every instruction on its path adds to a small
// batch's call (docs/performance.md, "Split plan, planner and combine").
MLAKIT_HOST_DEVICE inline int aligned_piece_tiles(const PlanShape& p, int units, int max_tiles,
                                                  int t) {
  const int step = p.tile_step < 1 ? 1 : p.tile_step > 64 ? 64 : p.tile_step;
  t = (t + step - 1) / step * step;
  // M <= 1024 and u < 2^18 keep u x (u + step) x M below 2^47; from u = 2^18 on the product
  // passes rows x units < 2^36 (at most 256 row tiles, units <= kMaxLineUnits) anyway.
  const std::int64_t m = p.partials_per_tile > 1024 ? 1024 : p.partials_per_tile;
  if (m <= 0) return t;
  const std::int64_t rows = p.count_row_tiles && p.row_tiles > 1 ? p.row_tiles : 1;
  const std::int64_t need = rows * units;
  int u = t;
  while (u < max_tiles && u < (1 << 18) && std::int64_t(u) * (u + step) * m < need) u += step;
  return u;
}

// The budget of a plan: units per CTA, and for an aligned automatic plan the most KV tiles of
// a piece (0: not aligned, requests packed end to end on the line).
struct PlanBudget {
  int per_cta = 1;
  int piece_tiles = 0;  // in units of 2^tile_shift tiles
  int tile_shift = 0;   // plan_tile_shift
};

// Budget of a plan, given the total and the largest of the request costs (request_cost with
// tile_shift, whose units every tile count here is in). Other modes: the least budget.
// Automatic mode: the least budget U (at least kMinPieceUnits: a one-unit piece moves less KV
// than the Q load and partial it costs), or the aligned plan:
// k = floor(num_ctas / batch) pieces for the longest request, t = max(least, ceil(max_tiles /
// k)) tiles per piece (least_piece_tiles), t + kOverheadUnits units per CTA. Every request then
// needs ceil(tiles / t) <= k CTAs, so the batch fits the grid. Taken when its makespan (t plus
// the overhead) is at most 1/kAlignSlack longer than the packed plan's (U plus the overhead of
// the piece a CTA continues). An aligned plan then takes aligned_piece_tiles(t): as long or
// longer pieces, so that it fits the grid too.
MLAKIT_HOST_DEVICE inline PlanBudget plan_budget(const PlanShape& p, int total, int max_cost,
                                                 int tile_shift = 0) {
  const int g = p.num_ctas > 0 ? p.num_ctas : 1;
  PlanBudget b;
  b.tile_shift = tile_shift;
  b.per_cta = per_cta_units(total, g);
  if (p.mode != SplitMode::automatic) return b;
  if (b.per_cta < kMinPieceUnits) b.per_cta = kMinPieceUnits;
  const int k = p.batch > 0 && g >= p.batch ? g / p.batch : 1;
  const int max_tiles = max_cost - kOverheadUnits;
  const int least = least_piece_tiles(p, max_tiles);
  int t = (max_tiles + k - 1) / k;
  t = t < least ? least : t;
  if (std::int64_t(t + kOverheadUnits) * kAlignSlack <=
      std::int64_t(b.per_cta + kOverheadUnits) * (kAlignSlack + 1)) {
    t = aligned_piece_tiles(p, total - p.batch * kOverheadUnits, max_tiles, t);
    b.per_cta = t + kOverheadUnits;
    b.piece_tiles = t;
  }
  return b;
}

// Units request b occupies on the line: its cost (request_cost) on a packed plan; on an
// aligned plan one budget per piece, ceil(tiles / piece_tiles) pieces (one for no KV), so the
// request starts and ends at CTA boundaries.
MLAKIT_HOST_DEVICE inline int line_cost(const PlanShape& p, const PlanBudget& b, int kv_len) {
  if (b.piece_tiles <= 0) return request_cost(p, kv_len, b.tile_shift);
  const int tiles = kv_units(kv_len, b.tile_shift);
  const int pieces = tiles > 0 ? (tiles + b.piece_tiles - 1) / b.piece_tiles : 1;
  return pieces * b.per_cta;
}

// What the planner writes per request.
struct RequestPlan {
  int kv_len;        // clamped length
  int cost_begin;    // prefix[b]
  int cost;          // units on the line (line_cost)
  int first_cta;     // first CTA that touches the request
  int num_pieces;    // CTAs that touch it; > 1 means split (partials + combine)
  int partial_base;  // first partial slot of a split request (exclusive scan of pieces)
};

// What the planner writes per CTA: the requests it covers, [req_begin, req_end].
struct CtaPlan {
  int req_begin;  // > req_end when the CTA has no work
  int req_end;
};

// The piece of request `b` that CTA `c` processes: KV tokens [kv_begin, kv_end) and, for a
// split request, the partial slot to write.
struct Piece {
  int kv_begin;
  int kv_end;
  int partial_slot;  // -1: unsplit, write O directly
};

MLAKIT_HOST_DEVICE inline Piece piece_of(const PlanShape& p, const RequestPlan& r, int c,
                                         int per_cta) {
  const int cost = r.cost;
  const std::int64_t lo_abs = std::int64_t(c) * per_cta;
  const std::int64_t hi_abs = lo_abs + per_cta;
  std::int64_t lo = lo_abs - r.cost_begin;
  std::int64_t hi = hi_abs - r.cost_begin;
  lo = lo < 0 ? 0 : lo;
  hi = hi > cost ? cost : hi;
  Piece piece;
  piece.kv_begin = token_at(p, r.kv_len, cost, static_cast<int>(lo));
  piece.kv_end = token_at(p, r.kv_len, cost, static_cast<int>(hi));
  piece.partial_slot = r.num_pieces > 1 ? r.partial_base + (c - r.first_cta) : -1;
  return piece;
}

// Last request whose cost interval starts at or before `pos` (requests sorted by cost_begin).
MLAKIT_HOST_DEVICE inline int request_at(const RequestPlan* r, int batch, std::int64_t pos) {
  int lo = 0, hi = batch - 1;  // invariant: r[lo].cost_begin <= pos (r[0].cost_begin == 0)
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (r[mid].cost_begin <= pos)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// Requests CTA c processes, given every request's cost_begin and first_cta (total = sum of
// costs); req_begin > req_end when none.
MLAKIT_HOST_DEVICE inline CtaPlan cta_plan_of(const RequestPlan* r, int batch, int c, int per_cta,
                                              int total) {
  const std::int64_t lo = std::int64_t(c) * per_cta;
  std::int64_t hi = lo + per_cta;
  if (hi > total) hi = total;
  if (lo >= hi) return CtaPlan{1, 0};
  CtaPlan cp{request_at(r, batch, lo), request_at(r, batch, hi - 1)};
  // The last request may start in this interval with leading units only (request_ctas): not
  // processed here. Requests before it end inside the interval, past their own leading units.
  if (c < r[cp.req_end].first_cta) --cp.req_end;
  return cp;
}

// Leading units of a request that hold no KV: in automatic mode the positions token_at maps to
// token 0 (pos x tiles < cost: ceil(cost / tiles) - 1 of them), all but the last unit for a
// request without keys.
MLAKIT_HOST_DEVICE inline int lead_units(const PlanShape& p, int cost, int kv_len) {
  if (p.mode != SplitMode::automatic) return 0;
  const int tiles = kv_tiles(kv_len);
  return tiles > 0 ? (cost + tiles - 1) / tiles - 1 : cost - 1;
}

// First and count of the CTAs that process request r: those whose intervals meet r's past its
// leading units. A CTA whose interval holds only those units would get an empty piece (no
// KV, yet a partial to write and merge).
MLAKIT_HOST_DEVICE inline void request_ctas(const PlanShape& p, RequestPlan& r, int per_cta) {
  r.first_cta = (r.cost_begin + lead_units(p, r.cost, r.kv_len)) / per_cta;
  r.num_pieces = (r.cost_begin + r.cost - 1) / per_cta - r.first_cta + 1;
}

// Byte layout of the planner's part of the workspace (the partials follow it).
struct PlanLayout {
  std::int64_t requests_offset;  // RequestPlan[batch]
  std::int64_t ctas_offset;      // CtaPlan[num_ctas]
  std::int64_t header_offset;    // int[4]: total cost, per_cta units, partial count, spare
  std::int64_t bytes;            // total, 256-byte aligned
};

MLAKIT_HOST_DEVICE inline std::int64_t align_up(std::int64_t x, std::int64_t a) {
  return (x + a - 1) / a * a;
}

MLAKIT_HOST_DEVICE inline PlanLayout plan_layout(const PlanShape& p) {
  PlanLayout l;
  l.header_offset = 0;
  l.requests_offset = 256;
  l.ctas_offset = align_up(l.requests_offset + std::int64_t(sizeof(RequestPlan)) * p.batch, 256);
  l.bytes = align_up(l.ctas_offset + std::int64_t(sizeof(CtaPlan)) * p.num_ctas, 256);
  return l;
}

}  // namespace mlakit

#include <vector>

namespace mlakit {

// The whole plan computed on the host with the same functions as the device planner; the
// tests compare the two, and the reference path of the examples uses it.
struct HostPlan {
  int total = 0;
  int per_cta = 1;
  int partials = 0;
  std::vector<RequestPlan> requests;
  std::vector<CtaPlan> ctas;
};

inline HostPlan plan_on_host(const PlanShape& p, const int* kv_len_clamped) {
  HostPlan h;
  h.requests.resize(p.batch);
  int max_len = 0;
  for (int b = 0; b < p.batch; ++b)
    max_len = kv_len_clamped[b] > max_len ? kv_len_clamped[b] : max_len;
  const int shift = plan_tile_shift(p, kv_tiles(max_len));
  int sum = 0;
  for (int b = 0; b < p.batch; ++b) sum += request_cost(p, kv_len_clamped[b], shift);
  const PlanBudget budget = plan_budget(p, sum, request_cost(p, max_len, shift), shift);
  h.per_cta = budget.per_cta;
  int prefix = 0;
  for (int b = 0; b < p.batch; ++b) {
    h.requests[b].kv_len = kv_len_clamped[b];
    h.requests[b].cost_begin = prefix;
    h.requests[b].cost = line_cost(p, budget, kv_len_clamped[b]);
    prefix += h.requests[b].cost;
  }
  h.total = prefix;
  int partials = 0;
  for (int b = 0; b < p.batch; ++b) {
    request_ctas(p, h.requests[b], h.per_cta);
    h.requests[b].partial_base = partials;
    if (h.requests[b].num_pieces > 1) partials += h.requests[b].num_pieces;
  }
  h.partials = partials;
  h.ctas.resize(p.num_ctas);
  for (int c = 0; c < p.num_ctas; ++c)
    h.ctas[c] = cta_plan_of(h.requests.data(), p.batch, c, h.per_cta, h.total);
  return h;
}

}  // namespace mlakit
