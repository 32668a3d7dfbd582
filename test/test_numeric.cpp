// Tests of core/numeric.hpp against references written here from the format definitions
// (sign / exponent / mantissa fields and std::ldexp, nearest-value searches in double, and
// the compiler's _Float16 where it exists), never against the code under test.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>

#include "mlakit/core/numeric.hpp"

using namespace mlakit;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

float f32(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::uint32_t u32(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

std::string hex(unsigned v) {
  std::ostringstream s;
  s << "0x" << std::hex << v;
  return s.str();
}

// ---- fp8 reference -------------------------------------------------------------------
struct Fp8Format {
  bool fnuz;
  int bias() const { return fnuz ? 8 : 7; }
  unsigned max_code() const { return fnuz ? 0x7F : 0x7E; }
  double max_value() const { return fnuz ? 240.0 : 448.0; }
  bool is_nan(unsigned c) const { return fnuz ? c == 0x80 : (c & 0x7F) == 0x7F; }
  // Value of a code straight from the definition: (-1)^s * 2^(e - bias) * (1 + m/8), or
  // 2^(1 - bias) * m/8 for e == 0.
  double value(unsigned c) const {
    if (is_nan(c)) return kNaN;
    const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    const double v = e == 0 ? std::ldexp(m, 1 - bias() - 3) : std::ldexp(8 + m, e - bias() - 3);
    return s ? -v : v;
  }
  float decode(unsigned c) const {
    return fnuz ? decode_e4m3fnuz(std::uint8_t(c)) : decode_e4m3fn(std::uint8_t(c));
  }
  unsigned encode(float x) const { return fnuz ? encode_e4m3fnuz(x) : encode_e4m3fn(x); }
  // Saturating round-to-nearest-even by searching every positive code.
  unsigned reference_encode(float x) const {
    if (std::isnan(x)) return fnuz ? 0x80u : (std::signbit(x) ? 0xFFu : 0x7Fu);
    const double ax = std::fabs(double(x));
    unsigned mag = max_code();
    if (ax < max_value()) {
      double best = std::numeric_limits<double>::infinity();
      for (unsigned c = 0; c <= max_code(); ++c) {
        const double d = std::fabs(ax - value(c));
        if (d < best || (d == best && (c & 1u) == 0)) {
          best = d;
          mag = c;
        }
      }
    }
    if (mag == 0) return (fnuz || !std::signbit(x)) ? 0x00u : 0x80u;
    return (std::signbit(x) ? 0x80u : 0u) | mag;
  }
};

constexpr Fp8Format kFn{false};
constexpr Fp8Format kFnuz{true};

// ---- 16-bit references -----------------------------------------------------------------
struct F16Format {
  int exp_bits, man_bits;
  int bias() const { return (1 << (exp_bits - 1)) - 1; }
  unsigned inf_code() const { return ((1u << exp_bits) - 1) << man_bits; }
  bool is_nan(unsigned c) const { return (c & 0x7FFFu) > inf_code(); }
  // For the inf code this returns 2^(emax + 1), the value IEEE rounding measures against
  // ("as if the exponent range were unbounded"), so overflow falls out of the nearest search.
  double magnitude(unsigned c) const {
    const int e = int((c & 0x7FFFu) >> man_bits), m = int(c & ((1u << man_bits) - 1));
    if (e == 0) return std::ldexp(m, 1 - bias() - man_bits);
    return std::ldexp(m + (1 << man_bits), e - bias() - man_bits);
  }
  double value(unsigned c) const {
    if (is_nan(c)) return kNaN;
    const double v =
        (c & 0x7FFFu) == inf_code() ? std::numeric_limits<double>::infinity() : magnitude(c);
    return (c & 0x8000u) ? -v : v;
  }
  // Nearest code by binary search over the monotone positive codes, ties to even.
  unsigned reference_encode(float x) const {
    const unsigned sign = std::signbit(x) ? 0x8000u : 0u;
    const double ax = std::fabs(double(x));
    if (std::isinf(x)) return sign | inf_code();
    unsigned lo = 0, hi = inf_code();  // invariant: magnitude(lo) <= ax < magnitude(hi)
    if (ax >= magnitude(hi)) return sign | inf_code();
    while (hi - lo > 1) {
      const unsigned mid = (lo + hi) / 2;
      (magnitude(mid) <= ax ? lo : hi) = mid;
    }
    const double dl = ax - magnitude(lo), dh = magnitude(hi) - ax;
    const unsigned c = dl < dh ? lo : dh < dl ? hi : ((lo & 1u) ? hi : lo);
    return sign | c;
  }
};

constexpr F16Format kBf16{8, 7};
constexpr F16Format kFp16{5, 10};

bool same_value(double ref, float got) {
  if (std::isnan(ref)) return std::isnan(got);
  return double(got) == ref && std::signbit(got) == std::signbit(ref);
}

float random_float_in_range(std::mt19937& rng, int min_exp, int max_exp) {
  std::uniform_int_distribution<int> exp_dist(min_exp, max_exp);
  const std::uint32_t mant = rng() & 0x7FFFFFu;
  const float m = f32(0x3F800000u | mant);  // [1, 2), all 23 bits random
  const float v = std::ldexp(m, exp_dist(rng));
  return (rng() & 1u) ? -v : v;
}

}  // namespace

// Compile-time checks: the whole API is constexpr.
static_assert(decode_e4m3fn(0x7E) == 448.0f, "fn max");
static_assert(decode_e4m3fnuz(0x7F) == 240.0f, "fnuz max");
static_assert(encode_e4m3fn(1.0f) == 0x38 && encode_e4m3fnuz(1.0f) == 0x40, "one");
static_assert(encode_bf16(1.0f) == 0x3F80 && encode_fp16(1.0f) == 0x3C00, "one");
static_assert(std::is_same_v<storage_of_t<DType::fp8_e4m3fnuz>, fp8_e4m3fnuz_t>, "trait");
static_assert(dtype_of_v<fp16_t> == DType::fp16, "trait");
static_assert(std::is_trivially_copyable_v<bf16_t> && std::is_trivial_v<fp8_e4m3fn_t>, "pod");

TEST_CASE("fp8 decode: every code matches the field formula", "[numeric][fp8]") {
  for (const Fp8Format& f : {kFn, kFnuz}) {
    INFO((f.fnuz ? "e4m3fnuz" : "e4m3fn"));
    int nan_count = 0;
    for (unsigned c = 0; c < 256; ++c) {
      INFO("code " << hex(c));
      REQUIRE(same_value(f.value(c), f.decode(c)));
      nan_count += std::isnan(f.decode(c)) ? 1 : 0;
    }
    CHECK(nan_count == (f.fnuz ? 1 : 2));
  }
}

TEST_CASE("fp8 decode: known values", "[numeric][fp8]") {
  CHECK(decode_e4m3fn(0x7E) == 448.0f);
  CHECK(decode_e4m3fn(0xFE) == -448.0f);
  CHECK(decode_e4m3fn(0x38) == 1.0f);
  CHECK(decode_e4m3fn(0x08) == 0.015625f);     // min normal 2^-6
  CHECK(decode_e4m3fn(0x01) == 0.001953125f);  // min subnormal 2^-9
  CHECK(decode_e4m3fn(0x07) == 0.013671875f);  // max subnormal 7 * 2^-9
  CHECK(std::isnan(decode_e4m3fn(0x7F)));
  CHECK(std::isnan(decode_e4m3fn(0xFF)));
  CHECK(decode_e4m3fn(0x80) == 0.0f);
  CHECK(std::signbit(decode_e4m3fn(0x80)));  // fn has -0
  CHECK(!std::signbit(decode_e4m3fn(0x00)));
  CHECK(decode_e4m3fnuz(0x7F) == 240.0f);
  CHECK(decode_e4m3fnuz(0xFF) == -240.0f);
  CHECK(decode_e4m3fnuz(0x40) == 1.0f);
  CHECK(decode_e4m3fnuz(0x08) == 0.0078125f);     // min normal 2^-7
  CHECK(decode_e4m3fnuz(0x01) == 0.0009765625f);  // min subnormal 2^-10
  CHECK(std::isnan(decode_e4m3fnuz(0x80)));       // the only NaN
  CHECK(decode_e4m3fnuz(0x78) == 128.0f);         // 0x78 is finite in fnuz (inf in neither)
  CHECK(decode_e4m3fn(0x78) == 256.0f);
  CHECK(std::isnan(decode_fp8(DType::fp8_e4m3fnuz, 0x80)));
  CHECK(decode_fp8(DType::fp8_e4m3fn, 0x7E) == 448.0f);
  CHECK(decode_fp8(DType::fp8_e4m3fnuz, 0x7F) == 240.0f);
  CHECK(std::isnan(decode_fp8(DType::bf16, 0x38)));
  // encode_fp8 and fp8_max by dtype: the format's own encoder and largest finite value.
  CHECK(encode_fp8(DType::fp8_e4m3fn, 448.0f) == 0x7E);
  CHECK(encode_fp8(DType::fp8_e4m3fnuz, 240.0f) == 0x7F);
  CHECK(encode_fp8(DType::fp8_e4m3fn, -1e9f) == 0xFE);
  CHECK(encode_fp8(DType::fp8_e4m3fnuz, 1.0f) == 0x40);
  CHECK(encode_fp8(DType::bf16, 1.0f) == 0x00);
  CHECK(fp8_max(DType::fp8_e4m3fn) == 448.0f);
  CHECK(fp8_max(DType::fp8_e4m3fnuz) == 240.0f);
  CHECK(fp8_max(DType::fp16) == 0.0f);
  for (unsigned c = 0; c < 256; ++c) {
    const auto b = static_cast<std::uint8_t>(c);
    if (!std::isnan(decode_e4m3fn(b)))
      CHECK(encode_fp8(DType::fp8_e4m3fn, decode_e4m3fn(b)) == encode_e4m3fn(decode_e4m3fn(b)));
    if (!std::isnan(decode_e4m3fnuz(b)))
      CHECK(encode_fp8(DType::fp8_e4m3fnuz, decode_e4m3fnuz(b)) ==
            encode_e4m3fnuz(decode_e4m3fnuz(b)));
  }
}

TEST_CASE("fp8 encode: round trip of every non-NaN code", "[numeric][fp8]") {
  for (const Fp8Format& f : {kFn, kFnuz}) {
    for (unsigned c = 0; c < 256; ++c) {
      if (f.is_nan(c)) continue;
      INFO((f.fnuz ? "e4m3fnuz " : "e4m3fn ") << hex(c));
      REQUIRE(f.encode(f.decode(c)) == c);
    }
  }
  CHECK(encode_e4m3fn(-0.0f) == 0x80);    // fn keeps -0
  CHECK(encode_e4m3fnuz(-0.0f) == 0x00);  // fnuz has none
  // Type-based API.
  CHECK(from_float<fp8_e4m3fn_t>(-2.0f).bits == 0xC0);
  CHECK(to_float(fp8_e4m3fnuz_t{0x48}) == 2.0f);
}

TEST_CASE("fp8 encode: midpoints tie to even, neighbours round correctly", "[numeric][fp8]") {
  for (const Fp8Format& f : {kFn, kFnuz}) {
    for (unsigned c = 0; c < f.max_code(); ++c) {
      const double lo = f.value(c), hi = f.value(c + 1);
      const float mid = float((lo + hi) / 2);  // needs one more mantissa bit: exact in float
      REQUIRE(double(mid) == (lo + hi) / 2);
      const unsigned even = (c & 1u) ? c + 1 : c;
      for (float sgn : {1.0f, -1.0f}) {
        const unsigned s = sgn < 0 ? 0x80u : 0u;
        auto with_sign = [&](unsigned mag) {
          return (mag == 0 && (f.fnuz || s == 0)) ? 0u : (s | mag);
        };
        INFO((f.fnuz ? "e4m3fnuz " : "e4m3fn ")
             << "between " << hex(c) << " and " << hex(c + 1) << " sign " << sgn);
        CHECK(f.encode(sgn * mid) == with_sign(even));
        CHECK(f.encode(sgn * std::nextafter(mid, 1e9f)) == with_sign(c + 1));
        CHECK(f.encode(sgn * std::nextafter(mid, 0.0f)) == with_sign(c));
      }
    }
  }
}

TEST_CASE("fp8 encode: saturation, NaN, tiny values", "[numeric][fp8]") {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // e4m3fn: the next step above 448 would be 480 (a NaN code); 464 is their midpoint.
  for (float x : {448.0f, 449.0f, 463.9f, 464.0f, 464.1f, 480.0f, 1e6f, 3e38f, inf}) {
    INFO("x = " << x);
    CHECK(encode_e4m3fn(x) == 0x7E);
    CHECK(encode_e4m3fn(-x) == 0xFE);
  }
  for (float x : {240.0f, 247.9f, 248.0f, 1e6f, inf}) {
    INFO("x = " << x);
    CHECK(encode_e4m3fnuz(x) == 0x7F);
    CHECK(encode_e4m3fnuz(-x) == 0xFF);
  }
  CHECK(encode_e4m3fn(447.0f) == 0x7E);
  CHECK(encode_e4m3fn(431.0f) == 0x7D);  // 416 + 15 is below the 432 midpoint
  CHECK(encode_e4m3fn(nan) == 0x7F);
  CHECK(encode_e4m3fn(-nan) == 0xFF);
  CHECK(encode_e4m3fnuz(nan) == 0x80);
  CHECK(encode_e4m3fnuz(-nan) == 0x80);
  CHECK(encode_e4m3fn(f32(0x7F800001u)) == 0x7F);  // signalling NaN too
  // Half the min subnormal ties to 0; anything above it goes to the min subnormal.
  const float half_fn = std::ldexp(1.0f, -10), half_fnuz = std::ldexp(1.0f, -11);
  CHECK(encode_e4m3fn(half_fn) == 0x00);
  CHECK(encode_e4m3fn(-half_fn) == 0x80);
  CHECK(encode_e4m3fn(std::nextafter(half_fn, 1.0f)) == 0x01);
  CHECK(encode_e4m3fn(-std::nextafter(half_fn, 1.0f)) == 0x81);
  CHECK(encode_e4m3fnuz(half_fnuz) == 0x00);
  CHECK(encode_e4m3fnuz(-half_fnuz) == 0x00);  // no -0: +0, never the NaN code
  CHECK(encode_e4m3fnuz(std::nextafter(half_fnuz, 1.0f)) == 0x01);
  CHECK(encode_e4m3fnuz(-std::nextafter(half_fnuz, 1.0f)) == 0x81);
  for (float tiny : {1e-30f, 1e-44f, std::numeric_limits<float>::denorm_min(), 1e-5f}) {
    INFO("tiny = " << tiny);
    CHECK(encode_e4m3fn(tiny) == 0x00);
    CHECK(encode_e4m3fn(-tiny) == 0x80);
    CHECK(encode_e4m3fnuz(tiny) == 0x00);
    CHECK(encode_e4m3fnuz(-tiny) == 0x00);
  }
  // 1.5 * min subnormal ties to 2 * min subnormal (even); 2.5 ties to 2.
  CHECK(encode_e4m3fn(std::ldexp(3.0f, -10)) == 0x02);
  CHECK(encode_e4m3fn(std::ldexp(5.0f, -10)) == 0x02);
  // The largest subnormal plus half a step ties to the min normal (code 8, even).
  CHECK(encode_e4m3fn(std::ldexp(15.0f, -10)) == 0x08);
  CHECK(encode_e4m3fnuz(std::ldexp(15.0f, -11)) == 0x08);
}

TEST_CASE("fp8 encode: 1e6 random floats equal the brute-force nearest code", "[numeric][fp8]") {
  std::mt19937 rng(20261103u);
  for (const Fp8Format& f : {kFn, kFnuz}) {
    long mismatches = 0;
    std::string first;
    for (int i = 0; i < 500000; ++i) {
      // Exponents from far below the min subnormal (2^-10/2^-11) to past the max (2^8/2^7);
      // every 16th sample is a raw bit pattern (NaN, inf, float subnormals, huge values).
      const float x =
          (i % 16 == 0) ? f32(std::uint32_t(rng())) : random_float_in_range(rng, -16, 10);
      const unsigned got = f.encode(x), want = f.reference_encode(x);
      if (got != want && mismatches++ == 0) {
        first =
            std::to_string(x) + " (" + hex(u32(x)) + "): got " + hex(got) + " want " + hex(want);
      }
    }
    INFO((f.fnuz ? "e4m3fnuz " : "e4m3fn ") << "first mismatch: " << first);
    CHECK(mismatches == 0);
  }
}

TEST_CASE("bf16 and fp16 decode: every code matches the field formula", "[numeric][f16]") {
  for (const F16Format& f : {kBf16, kFp16}) {
    const bool is_bf16 = f.exp_bits == 8;
    long bad = 0;
    unsigned first = 0;
    for (unsigned c = 0; c < 65536; ++c) {
      const float got = is_bf16 ? decode_bf16(std::uint16_t(c)) : decode_fp16(std::uint16_t(c));
      if (!same_value(f.value(c), got) && bad++ == 0) first = c;
    }
    INFO((is_bf16 ? "bf16" : "fp16") << " first bad code " << hex(first));
    CHECK(bad == 0);
  }
  CHECK(decode_fp16(0x7BFF) == 65504.0f);
  CHECK(decode_fp16(0x0001) == std::ldexp(1.0f, -24));
  CHECK(decode_fp16(0x0400) == std::ldexp(1.0f, -14));
  CHECK(decode_fp16(0xFC00) == -std::numeric_limits<float>::infinity());
  CHECK(std::signbit(decode_fp16(0x8000)));
  CHECK(decode_bf16(0x7F7F) == 3.3895313892515355e38f);
  CHECK(to_float(bf16_t{0x3F80}) == 1.0f);
  CHECK(to_float(fp16_t{0x3C00}) == 1.0f);
}

TEST_CASE("bf16 and fp16 encode: all codes round trip, NaN stays NaN", "[numeric][f16]") {
  for (const F16Format& f : {kBf16, kFp16}) {
    const bool is_bf16 = f.exp_bits == 8;
    INFO((is_bf16 ? "bf16" : "fp16"));
    long bad = 0;
    unsigned first = 0;
    for (unsigned c = 0; c < 65536; ++c) {
      const float v = is_bf16 ? decode_bf16(std::uint16_t(c)) : decode_fp16(std::uint16_t(c));
      const unsigned e = is_bf16 ? encode_bf16(v) : encode_fp16(v);
      // NaN: stays a NaN code with the same sign; the decode/encode pair keeps the payload
      // and sets the quiet bit.
      const unsigned quiet = 1u << (f.man_bits - 1);
      const bool ok = f.is_nan(c)
                          ? (f.is_nan(e) && (e & 0x8000u) == (c & 0x8000u) && e == (c | quiet))
                          : e == c;
      if (!ok && bad++ == 0) first = c;
    }
    INFO("first bad code " << hex(first));
    CHECK(bad == 0);
  }
  // A signalling float NaN whose payload lies only in the low bits must not become inf.
  CHECK(encode_bf16(f32(0x7F800001u)) == 0x7FC0);
  CHECK(encode_fp16(f32(0xFF800001u)) == 0xFE00);
  CHECK(from_float<bf16_t>(-1.0f).bits == 0xBF80);
  CHECK(from_float<fp16_t>(-2.0f).bits == 0xC000);
}

TEST_CASE("bf16 and fp16 encode: ties, overflow, subnormals", "[numeric][f16]") {
  const float inf = std::numeric_limits<float>::infinity();
  // bf16: 1 + 2^-8 is the midpoint of 1 and 1 + 2^-7: ties to even (1.0).
  CHECK(encode_bf16(1.0f + std::ldexp(1.0f, -8)) == 0x3F80);
  CHECK(encode_bf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3F82);  // odd below: ties up
  CHECK(encode_bf16(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f)) == 0x3F81);
  CHECK(encode_bf16(3.4e38f) == 0x7F80);  // beyond max + half ulp
  CHECK(encode_bf16(std::numeric_limits<float>::max()) == 0x7F80);
  CHECK(encode_bf16(-inf) == 0xFF80);
  CHECK(encode_bf16(f32(0x00010000u)) == 0x0001);  // bf16 subnormal exact
  // fp16: 2049 is the midpoint of 2048 and 2050 -> 2048; 2051 -> 2052.
  CHECK(encode_fp16(2049.0f) == 0x6800);
  CHECK(encode_fp16(2051.0f) == 0x6802);
  CHECK(encode_fp16(65504.0f) == 0x7BFF);
  CHECK(encode_fp16(65519.99f) == 0x7BFF);
  CHECK(encode_fp16(65520.0f) == 0x7C00);  // ties to even = inf
  CHECK(encode_fp16(-1e6f) == 0xFC00);
  CHECK(encode_fp16(std::ldexp(1.0f, -24)) == 0x0001);
  CHECK(encode_fp16(std::ldexp(1.0f, -25)) == 0x0000);  // tie to 0
  CHECK(encode_fp16(-std::ldexp(1.0f, -25)) == 0x8000);
  CHECK(encode_fp16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)) == 0x0001);
  CHECK(encode_fp16(std::ldexp(3.0f, -25)) == 0x0002);     // 1.5 ulp ties to 2
  CHECK(encode_fp16(std::ldexp(2047.0f, -25)) == 0x0400);  // to the min normal
  CHECK(encode_fp16(1e-10f) == 0x0000);
}

TEST_CASE("bf16 and fp16 encode: random floats equal the nearest code", "[numeric][f16]") {
  std::mt19937 rng(7u);
  for (const F16Format& f : {kBf16, kFp16}) {
    const bool is_bf16 = f.exp_bits == 8;
    long bad = 0;
    std::string first;
    for (int i = 0; i < 1000000; ++i) {
      const float x = (i % 2 == 0)
                          ? f32(std::uint32_t(rng()))
                          : random_float_in_range(rng, is_bf16 ? -140 : -27, is_bf16 ? 127 : 17);
      const unsigned got = is_bf16 ? encode_bf16(x) : encode_fp16(x);
      bool ok;
      if (std::isnan(x)) {
        ok = f.is_nan(got) && ((got & 0x8000u) != 0) == std::signbit(x);
      } else {
        ok = got == f.reference_encode(x);
#ifdef __FLT16_MAX__
        // Second opinion from the compiler's own float -> _Float16 conversion.
        if (!is_bf16) {
          const _Float16 h = static_cast<_Float16>(x);
          std::uint16_t hb;
          std::memcpy(&hb, &h, 2);
          ok = ok && got == hb;
        }
#endif
      }
      if (!ok && bad++ == 0) first = std::to_string(x) + " (" + hex(u32(x)) + ") -> " + hex(got);
    }
    INFO((is_bf16 ? "bf16" : "fp16") << " first mismatch: " << first);
    CHECK(bad == 0);
  }
}
