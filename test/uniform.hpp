#pragma once
// uniform(g, lo, hi): a float drawn uniformly from [lo, hi) with one draw of a 64-bit engine,
// the same value libstdc++'s std::uniform_real_distribution<float>(lo, hi) gives for the same
// engine state (test_uniform.cpp checks this where the standard library is libstdc++), without
// the two long-double logarithms its std::generate_canonical computes on every call. The
// test data builders draw millions of values; on the emulated AMD device those logarithms
// took most of the time of the combine tests.
#include <cmath>
#include <cstdint>
#include <random>

namespace mlakit::testing {

template <class Engine>  // std::mt19937_64, or any engine of the full 64-bit range
float uniform(Engine& g, float lo, float hi) {
  static_assert(Engine::min() == 0 && Engine::max() == ~std::uint64_t(0),
                "uniform() models the draw of an engine with the full 64-bit range");
  // generate_canonical<float, 24>: one 64-bit draw over 2^64 in long double, rounded to float,
  // and kept below 1.
  float u = static_cast<float>(static_cast<long double>(g()) * 0x1p-64L);
  if (u >= 1.0f) u = std::nextafter(1.0f, 0.0f);
  const float span = hi - lo;
  const float scaled = u * span;
  return scaled + lo;
}
// The test data's usual range, [-1, 1).
template <class Engine>
float uniform(Engine& g) {
  return uniform(g, -1.0f, 1.0f);
}

}  // namespace mlakit::testing
