// test/uniform.hpp's draws against std::uniform_real_distribution<float>.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <random>

#include "uniform.hpp"

namespace {

std::uint32_t bits(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

}  // namespace

TEST_CASE("uniform draws what std::uniform_real_distribution<float> draws", "[test-util]") {
#if defined(__GLIBCXX__)
  // Several ranges (the builders' [-1, 1) and [0, 1) among them), and engine outputs near
  // 2^64 where the long-double quotient rounds up to 1.
  const float ranges[][2] = {{-1.0f, 1.0f}, {0.0f, 1.0f}, {-3.5f, 0.25f}, {2.0f, 1e6f}};
  long long draws = 0, differ = 0;
  for (const auto& r : ranges) {
    std::mt19937_64 g1(0x5eed0001u + draws), g2(0x5eed0001u + draws);
    std::uniform_real_distribution<float> dist(r[0], r[1]);
    for (int i = 0; i < 200000; ++i, ++draws) {
      const float a = mlakit::testing::uniform(g1, r[0], r[1]);
      const float b = dist(g2);
      differ += bits(a) != bits(b);
    }
  }
  // An engine whose outputs are all 2^64 - 1: the quotient rounds to 1 and is pulled below.
  struct Top {
    using result_type = std::uint64_t;
    static constexpr result_type min() { return 0; }
    static constexpr result_type max() { return ~result_type(0); }
    result_type operator()() { return max(); }
  };
  Top top;
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  INFO("draws " << draws << ", differing " << differ);
  CHECK(draws == 800000);
  CHECK(differ == 0);
  CHECK(bits(mlakit::testing::uniform(top, 0.0f, 1.0f)) == bits(unit(top)));
  CHECK(mlakit::testing::uniform(top, 0.0f, 1.0f) == std::nextafter(1.0f, 0.0f));
#else
  SUCCEED("the reference sequence is libstdc++'s; another standard library draws other values");
#endif
}
