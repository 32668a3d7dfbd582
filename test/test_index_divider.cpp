// core/index_divider.hpp against the integer division it replaces: every page size of the
// domain, every index below 2^16 and in the top 2^16 of the index range, indices either side
// of multiples of the divisor, and random ones.
#include <catch2/catch.hpp>
#include <cstdint>
#include <random>

#include "mlakit/core/index_divider.hpp"

using mlakit::IndexDivider;

TEST_CASE("IndexDivider: multiply-high division equals j / d over the domain", "[divider]") {
  std::mt19937 rng(20261206);
  std::uniform_int_distribution<int> any_index(0, IndexDivider::kMaxIndex);
  long long checked = 0, wrong = 0;
  for (int d = 1; d <= IndexDivider::kMaxDivisor; ++d) {
    const IndexDivider div = IndexDivider::make(d);
    REQUIRE(div.magic != 0u);  // m < 2^32 and not truncated to 0
    const auto check = [&](int j) {
      const int q = div.div(j);
      ++checked;
      if (q != j / d || div.mod(j, q) != j % d) {
        ++wrong;
        if (wrong <= 5) FAIL_CHECK("d " << d << " j " << j << ": " << q << " != " << j / d);
      }
    };
    for (int j = 0; j < (1 << 16); ++j) check(j);
    for (long long j = IndexDivider::kMaxIndex - (1 << 16); j <= IndexDivider::kMaxIndex; ++j)
      check(static_cast<int>(j));
    for (int k = 0; k < 4096; ++k) {
      const int q = any_index(rng) / d;
      for (int r = -1; r <= 1; ++r) {
        const long long j = static_cast<long long>(q) * d + (r < 0 ? -1 : r == 0 ? 0 : d - 1);
        if (j >= 0 && j <= IndexDivider::kMaxIndex) check(static_cast<int>(j));
      }
      check(any_index(rng));
    }
  }
  CHECK(wrong == 0);
  CHECK(checked > 256LL * 131072);
}
