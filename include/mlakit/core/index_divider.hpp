#pragma once
// Division of a token index by the page size as one multiply-high and a shift, for the
// producers that resolve a page per token and tile (a division by a value known only at run
// time is a sequence of about twenty instructions on a GPU).
#include <cstdint>

#include "config.hpp"

namespace mlakit {

// q = j / d for j in [0, 2^31) and d in [1, 256] (any token index, the page-size domain):
// q = hi32(2 j x m) >> s with s = ceil(log2 d) and m = ceil(2^(31 + s) / d), which is below
// 2^32 because d > 2^(s - 1) (2 j fits 32 bits). Exact: m d = 2^(31 + s) + e with
// 0 <= e < d <= 2^s, so 2 j m / 2^(32 + s) = j / d + j e / (d 2^(31 + s)), whose excess is
// below 2^(31 + s) / (d 2^(31 + s)) = 1 / d, and j / d is an integer or at least 1 / d below
// the next one: the floor is j / d's.
struct IndexDivider {
  std::uint32_t magic = 0;
  int shift = 0;
  int divisor = 1;

  static constexpr int kMaxDivisor = 256;
  static constexpr int kMaxIndex = 2147483647;  // 2^31 - 1

  // d in [1, kMaxDivisor].
  static constexpr IndexDivider make(int d) {
    IndexDivider r;
    int s = 0;
    while ((1 << s) < d) ++s;
    const std::uint64_t num = std::uint64_t(1) << (31 + s);
    r.magic = static_cast<std::uint32_t>((num + std::uint64_t(d) - 1) / std::uint64_t(d));
    r.shift = s;
    r.divisor = d;
    return r;
  }
  // j in [0, kMaxIndex].
  MLAKIT_HOST_DEVICE constexpr int div(int j) const {
    const std::uint64_t p = std::uint64_t(2u * static_cast<std::uint32_t>(j)) * magic;
    return static_cast<int>(static_cast<std::uint32_t>(p >> 32) >> shift);
  }
  MLAKIT_HOST_DEVICE constexpr int mod(int j, int q) const { return j - q * divisor; }
};

}  // namespace mlakit
