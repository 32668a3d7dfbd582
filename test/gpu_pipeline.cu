// GPU tests aimed at the KV pipelines of the mainloops: lengths that end inside the first, a
// middle and the last stage of the ring (and one tile before or after a wrap of it), a piece
// of a single tile or of one odd tile (the warp-specialized mainloop pads it to a pair),
// splits that give every CTA one tile, kv_len 0 and 1, and page size 1 with the harness's
// shuffled CSR page ids. Every row policy (16, 32 and 64 rows at 16 heads; on sm_90, 32 rows
// with KV of the Q type run the 64-row tile, half padding, 16 rows too from 32 requests up,
// and 16 and 32 rows of e4m3fn KV the keys-as-M tiles from 32 requests x row tiles up) and
// both the direct 16-bit path and the fp8 conversion paths.
#include <catch2/catch.hpp>

#include <initializer_list>
#include <vector>

#include "gpu_harness.hpp"
#include "gpu_require.hpp"

using namespace mlakit;
using namespace mlakit::testing;

namespace {

void check_pipeline_case(const Case& c) {
  INFO(c.name());
  TestProblem P;
  build(P, c);
  REQUIRE(P.ok);
  DeviceBuffer ws(workspace_for(P.dev));
  Outcome o = run_device(P, ws, nullptr, nullptr);
  INFO(o.status.message());
  REQUIRE(o.status.is_ok());
  const auto ref = run_reference(P);
  compare(P, ref, o);
  INFO("rel_l2 " << o.rel_l2 << " max_abs " << o.max_abs << " lse_err " << o.lse_err);
  CHECK(o.rel_l2 < 1e-2);
  CHECK(o.lse_err < (c.kv_type == c.q_type || is_fp8(c.kv_type) ? 1e-4 : 5e-3));
}

// Lengths around the 64-token tiles of a two-stage ring: inside tile 0, its end, tile 1
// (stage 1), the first reuse of stage 0 (tile 2), a middle tile, an odd and an even count of
// tiles, plus 0 and 1.
const std::vector<int> kRingLengths = {0, 1, 7, 63, 64, 65, 127, 128, 129, 191, 192, 193, 255,
                                       256, 257, 64 * 7 + 17, 64 * 8};

// Every ring length, then the same in reverse: 34 requests, enough for the sm_90 kernel
// choices that switch at 32 requests (x row tiles).
std::vector<int> ring_lengths_34() {
  std::vector<int> lens = kRingLengths;
  lens.insert(lens.end(), kRingLengths.rbegin(), kRingLengths.rend());
  return lens;
}

struct Rows {
  int heads, q_len;
};

// One case per row shape and page size (1: shuffled CSR ids, 64: block table) over the 34
// requests of ring_lengths_34(); by the case's seed (from `seed` up) Q alternates bf16 / fp16
// and the split mode cycles none / fixed 5 / automatic. KV is e4m3fn, or of the Q type when
// kv_of_q.
void check_rows_34_requests(std::initializer_list<Rows> shapes, int seed, bool kv_of_q) {
  const std::vector<int> lens = ring_lengths_34();
  for (Rows rw : shapes)
    for (int page_size : {1, 64}) {
      Case c;
      c.q_type = (seed & 1) ? DType::fp16 : DType::bf16;
      c.kv_type = kv_of_q ? c.q_type : DType::fp8_e4m3fn;
      c.heads = rw.heads;
      c.q_len = rw.q_len;
      c.page_size = page_size;
      c.ids = page_size == 1 ? PageIds::csr : PageIds::block_table;
      c.split = seed % 3 == 0 ? SplitMode::none
                              : (seed % 3 == 1 ? SplitMode::fixed : SplitMode::automatic);
      c.num_splits = c.split == SplitMode::fixed ? 5 : 0;
      c.kv_lens = lens;
      c.seed = seed++;
      check_pipeline_case(c);
    }
}

}  // namespace

TEST_CASE("pipeline: lengths ending in every stage of the ring", "[gpu][pipeline]") {
  MLAKIT_REQUIRE_GPU();
  int seed = 9000;
  for (int q_len : {1, 2, 4, 8})  // 16, 32, 64 and 2 x 64 rows at 16 heads
    for (DType kv : {DType::fp8_e4m3fn, DType::bf16}) {
      Case c;
      c.q_type = DType::bf16;
      c.kv_type = kv;
      c.heads = 16;
      c.q_len = q_len;
      c.page_size = 1;
      c.ids = PageIds::csr;  // pages shuffled by the harness
      c.split = SplitMode::none;
      c.kv_lens = kRingLengths;
      c.seed = seed++;
      check_pipeline_case(c);
    }
}

// Page sizes of 64, 128 and 256 tokens (a tile inside one page, the page's NaN-poisoned tail
// after the last tile), in packed caches and in caches whose rows (592 values) and pages (one
// row more) are padded with NaN, so the token and page strides are not the packed ones: every
// ring length twice (34 requests), 2, 4 and 8 query tokens (32 rows run the 64-row tile on
// sm_90 with KV of the Q type), both page-id formats, KV of the Q type (bf16, fp16) and both
// fp8 formats, every split mode.
TEST_CASE("pipeline: page sizes 64, 128 and 256, packed and padded caches, every ring length",
          "[gpu][pipeline]") {
  MLAKIT_REQUIRE_GPU();
  struct Kv {
    DType q, kv;
  };
  int seed = 9300;
  for (int page_size : {64, 128, 256})
    for (bool padded : {false, true})
      for (int q_len : {2, 4, 8})
        for (Kv t : {Kv{DType::bf16, DType::fp8_e4m3fn}, Kv{DType::bf16, DType::bf16},
                     Kv{DType::bf16, DType::fp8_e4m3fnuz}, Kv{DType::fp16, DType::fp16}}) {
          Case c;
          c.q_type = t.q;
          c.kv_type = t.kv;
          c.heads = 16;
          c.q_len = q_len;
          c.page_size = page_size;
          c.padded_cache = padded;
          c.ids = (seed & 1) ? PageIds::csr : PageIds::block_table;
          c.split = seed % 3 == 0 ? SplitMode::none
                                  : (seed % 3 == 1 ? SplitMode::fixed : SplitMode::automatic);
          c.num_splits = c.split == SplitMode::fixed ? 3 : 0;
          c.kv_lens = ring_lengths_34();
          c.seed = seed++;
          check_pipeline_case(c);
        }
}

TEST_CASE("pipeline: one-tile pieces from fixed splits, other KV types", "[gpu][pipeline]") {
  MLAKIT_REQUIRE_GPU();
  int seed = 9100;
  struct Kv {
    DType q, kv;
  };
  for (Kv t : {Kv{DType::bf16, DType::fp8_e4m3fn}, Kv{DType::bf16, DType::fp8_e4m3fnuz},
               Kv{DType::fp16, DType::bf16}, Kv{DType::fp16, DType::fp16}})
    for (int q_len : {1, 8})
      for (int splits : {5, 64}) {
        Case c;
        c.q_type = t.q;
        c.kv_type = t.kv;
        c.heads = 16;
        c.q_len = q_len;
        c.page_size = 64;
        c.ids = PageIds::block_table;
        c.split = SplitMode::fixed;
        c.num_splits = splits;  // 64 splits of <= 300 tokens: one tile (or none) per CTA
        c.kv_lens = {300, 65, 1, 0, 129};
        c.seed = seed++;
        check_pipeline_case(c);
      }
}

TEST_CASE("pipeline: 12 heads (row tiles that end inside a tile), non-causal", "[gpu][pipeline]") {
  MLAKIT_REQUIRE_GPU();
  int seed = 9200;
  for (int q_len : {3, 6, 11})
    for (bool causal : {true, false}) {
      Case c;
      c.q_type = DType::bf16;
      c.kv_type = DType::fp8_e4m3fn;
      c.heads = 12;
      c.q_len = q_len;
      c.causal = causal;
      c.page_size = 16;
      c.ids = PageIds::csr;
      c.kv_lens = {129, 2, 64 * 5 + 3, 0};
      c.seed = seed++;
      check_pipeline_case(c);
    }
}

// The keys-as-M tiles (sm_90: 16-, 32- and 64-row tiles of e4m3fn KV from 32 requests x row
// tiles up; elsewhere, and below that, the mma.sync tiles or for 64 rows the
// warp-specialized tile): 34 requests of every ring length.
// 16 rows: 16 and 12 heads at q_len 1, 8 heads at q_len 2 and 5 at q_len 3 (rows of two and
// three tokens in one tile, each with its own causal limit). 32 rows (two warpgroups on
// alternate tiles, four stages: lengths of 0..9 tiles end on either warpgroup and wrap the
// ring): 16 heads at q_len 2, 12 at q_len 2, 8 at q_len 4, 32 at q_len 1 and 6 at q_len 5.
// 64 rows (the warpgroups split the dims and take pairs of tiles, an odd count padded with a
// masked tile; three stages, so pairs start on every stage): 16 heads at q_len 4, 12 at 5
// (60 rows), 7 at 9 (63), 64 at q_len 1, and two row tiles: 16 heads at q_len 8, 128 at 1.
// Page size 1 with shuffled CSR ids and 64 with a block table, bf16 and fp16 Q, splits off,
// fixed and automatic.
TEST_CASE("pipeline: keys-as-M tiles, 16, 32 and 64 rows of e4m3fn KV, 34 requests",
          "[gpu][pipeline]") {
  MLAKIT_REQUIRE_GPU();
  check_rows_34_requests({Rows{16, 1}, Rows{12, 1}, Rows{8, 2}, Rows{5, 3}, Rows{16, 2},
                          Rows{12, 2}, Rows{8, 4}, Rows{32, 1}, Rows{6, 5}, Rows{16, 4},
                          Rows{12, 5}, Rows{7, 9}, Rows{64, 1}, Rows{16, 8}, Rows{128, 1}},
                         9400, false);
}

// 1..32 rows whose KV is of the Q type, 34 requests of every ring length. sm_90: at page size
// 64 the 16- and 32-row keys-as-M tiles of 16-bit KV (rings of 25 and 22 chunk slots, nine per
// tile, so lengths of 0..9 tiles end with the ring wrapped inside a tile and between tiles;
// 16 rows: two consumer warpgroups on alternate tiles, so they end on either one), at page
// size 1 the warp-specialized 64-row tile (arch::kSplitOMinRequests16 requests and more; 32 to 63
// of its rows padding); elsewhere the mma.sync tiles. 16 rows: 16 and 12 heads at q_len 1, 8
// at q_len 2, 5 at q_len 3 (rows of several tokens, each with its own causal limit), one head
// at q_len 1 and 3 at q_len 5; 32 rows: 16 heads at q_len 2, 12 at q_len 2, 8 at q_len 4, 32
// at q_len 1 and 6 at q_len 5; page size 1 with shuffled CSR ids and 64 with a block table,
// bf16 and fp16, splits off, fixed and automatic.
TEST_CASE("pipeline: 1..32 rows of KV of the Q type, 34 requests", "[gpu][pipeline]") {
  MLAKIT_REQUIRE_GPU();
  REQUIRE(int(ring_lengths_34().size()) >= arch::kFp8CtasMinRowTiles);
  check_rows_34_requests({Rows{16, 1}, Rows{12, 1}, Rows{8, 2}, Rows{5, 3}, Rows{1, 1},
                          Rows{3, 5}, Rows{16, 2}, Rows{12, 2}, Rows{8, 4}, Rows{32, 1},
                          Rows{6, 5}},
                         9600, true);
}

// The online softmax keeps a row's running max while the scores' max exceeds it by at most
// kRescaleSlack (2^8) and rescales O and l only when it moves further. Keys whose magnitude
// grows along the sequence, with a sharp softmax, make the max move in many tiles of a piece,
// by less and by more than the slack, while others keep it: every mainloop (16-, 32- and
// 64-row keys-as-M tiles of e4m3fn KV and the 32-row one of bf16 KV at page 64 from 32
// requests x row tiles up, the warp-specialized 64-row tile and the mma.sync tiles) against
// the reference.
TEST_CASE("online softmax: running maxima that move along the keys", "[gpu][pipeline]") {
  MLAKIT_REQUIRE_GPU();
  int seed = 9700;
  std::vector<int> lens = {2500, 1, 700, 64 * 13 + 5, 129, 1200, 64 * 9, 3000, 0, 450};
  std::vector<int> many;
  while (many.size() < 34) many.insert(many.end(), lens.begin(), lens.end());
  many.resize(34);
  for (Rows rw : {Rows{16, 1}, Rows{16, 2}, Rows{16, 4}, Rows{16, 8}, Rows{128, 1}})
    for (DType kv : {DType::fp8_e4m3fn, DType::bf16})
      for (int batch : {34, 3}) {
        Case c;
        c.q_type = DType::bf16;
        c.kv_type = kv;
        c.heads = rw.heads;
        c.q_len = rw.q_len;
        c.page_size = seed % 2 ? 1 : 64;
        c.ids = c.page_size == 1 ? PageIds::csr : PageIds::block_table;
        c.split = seed % 3 == 0 ? SplitMode::none : SplitMode::automatic;
        c.kv_lens.assign(many.begin(), many.begin() + batch);
        c.q_magnitude = 16.0f;  // the largest scores reach about 2^5.5 in base-2 units
        c.kv_ramp = 7.0f;       // and the first tile's about 2^2: several moves per piece
        c.lse_relative = true;  // LSEs of ~30: f32 scores of that size, as in gpu_decode.cu
        c.seed = seed++;
        check_pipeline_case(c);
      }
}
