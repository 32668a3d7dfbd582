// Shared-memory layouts of the kernels (kernel/smem_tile.hpp): every layout is a bijection
// within its rows, the accesses the kernels make hit distinct bank groups, and the wgmma tile
// equals the hardware's 128-byte swizzle pattern.
#include <catch2/catch.hpp>
#include <mlakit/kernel/decode_cdna.hpp>
#include <mlakit/kernel/smem_tile.hpp>
#include <set>

using namespace mlakit;
using namespace mlakit::detail;

namespace {

// Bank group of a 16-byte access: 128-bit accesses are served eight lanes at a time, and eight
// 16-byte pieces with distinct (address / 16) % 8 cover all 32 banks once.
int bank_group(int byte_offset) { return (byte_offset / 16) % 8; }

}  // namespace

TEST_CASE("SwizzledByteRows<576>: a permutation of each row's chunks", "[layout]") {
  using L = SwizzledByteRows<576>;
  for (int r = 0; r < 64; ++r) {
    std::set<int> seen;
    for (int c = 0; c < 36; ++c) {
      const int off = L::chunk_offset(r, c);
      CHECK(off % 16 == 0);
      CHECK(off >= r * 576);
      CHECK(off < (r + 1) * 576);
      seen.insert(off);
    }
    CHECK(seen.size() == 36);
  }
}

TEST_CASE("SwizzledByteRows<576>: ldmatrix rows and cp.async stores are conflict-free",
          "[layout]") {
  using L = SwizzledByteRows<576>;
  // ldmatrix: one 8x8 matrix = eight consecutive rows (from a multiple of 8) at one chunk.
  for (int r0 = 0; r0 < 64; r0 += 8)
    for (int c = 0; c < 36; ++c) {
      std::set<int> groups;
      for (int j = 0; j < 8; ++j) groups.insert(bank_group(L::chunk_offset(r0 + j, c)));
      INFO("rows " << r0 << ".. chunk " << c);
      CHECK(groups.size() == 8);
    }
  // The copy loop: four threads per token, thread `sub` stores chunks sub + 4i; a phase of
  // eight lanes is two consecutive tokens x four subs.
  for (int t0 = 0; t0 < 64; t0 += 2)
    for (int i = 0; i < 9; ++i) {
      std::set<int> groups;
      for (int lane = 0; lane < 8; ++lane)
        groups.insert(bank_group(L::chunk_offset(t0 + lane / 4, lane % 4 + 4 * i)));
      INFO("tokens " << t0 << ".. step " << i);
      CHECK(groups.size() == 8);
    }
  // Without the swizzle the 576-byte stride puts rows r and r + 2 on one bank group.
  CHECK(bank_group(0 * 576) == bank_group(2 * 576));
}

TEST_CASE("SwizzledRows<576>: a permutation per row, conflict-free ldmatrix", "[layout]") {
  using L = SwizzledRows<576>;
  for (int r = 0; r < 64; ++r) {
    std::set<int> seen;
    for (int c = 0; c < 72; ++c) seen.insert(L::chunk_offset(r, c));
    CHECK(seen.size() == 72);
    CHECK(*seen.begin() == r * 576);
    CHECK(*seen.rbegin() == r * 576 + 71 * 8);
  }
  for (int r0 = 0; r0 < 64; r0 += 8)
    for (int c = 0; c < 72; ++c) {
      std::set<int> groups;
      for (int j = 0; j < 8; ++j) groups.insert(bank_group(2 * L::chunk_offset(r0 + j, c)));
      CHECK(groups.size() == 8);
    }
}

TEST_CASE("Swizzle128Tile: the hardware 128-byte swizzle of a K-major wgmma tile", "[layout]") {
  using L = Swizzle128Tile<64>;
  std::set<int> seen;
  for (int r = 0; r < 64; ++r)
    for (int u = 0; u < 72; ++u) {
      // Unswizzled K-major position: chunk u / 8 is a [64 rows][128 B] block, then row, unit.
      const int plain = (u / 8) * (64 * 128) + r * 128 + (u % 8) * 16;
      // 128B pattern: address bits 4-6 XOR address bits 7-9 (tile 1024-byte aligned).
      const int hw = plain ^ (((plain >> 7) & 7) << 4);
      INFO("row " << r << " unit " << u);
      CHECK(L::unit_offset(r, u) == hw);
      seen.insert(L::unit_offset(r, u));
    }
  CHECK(seen.size() == 64 * 72);
  CHECK(*seen.rbegin() == 9 * 64 * 128 - 16);
}

// The CDNA mainloop's KV tile (kernel/decode_cdna.hpp): a bijection from (dim pair, key) onto
// the tile's words, every pair's 4-key chunks 16-byte aligned and whole, and the V^T reads of
// 16 lanes (16 consecutive pairs, one chunk each) spread evenly over the 16-byte bank groups.
TEST_CASE("CdnaKvLayout<16>: a bijection, whole 4-key chunks, spread V^T reads", "[layout]") {
  using L = CdnaKvLayout<16>;
  std::set<int> words;
  for (int p = 0; p < L::kPairs; ++p)
    for (int k = 0; k < 16; ++k) {
      const int w = L::word(p, k);
      CHECK(w / 16 == p);  // a pair's keys stay in its 64-byte row
      words.insert(w);
      if (k % 4 != 0) CHECK(w == L::word(p, k - k % 4) + k % 4);  // chunks stay whole
      if (k % 4 == 0) CHECK(w % 4 == 0);                          // and 16-byte aligned
    }
  CHECK(static_cast<int>(words.size()) == L::kWords);
  CHECK(*words.rbegin() == L::kWords - 1);
  for (int p0 = 0; p0 < kHeadDimV / 2; p0 += 16)
    for (int g = 0; g < 4; ++g) {
      int hits[8] = {};
      for (int q = 0; q < 16; ++q) ++hits[bank_group(4 * L::word(p0 + q, 4 * g))];
      for (int h : hits) CHECK(h == 2);  // 16 chunks, each bank group twice: no more passes
    }
}
