// Host tests of the AMD-specific code paths that no AMD GPU here can run:
//  - the hardware fp8 conversion of arch/convert.hpp (fp8x4_native), driven by a simulation
//    of the two instructions it uses, V_CVT_PK_F32_FP8 and V_CVT_PKRTZ_F16_F32, written from
//    their documented semantics (see the comment above F32x2 in convert.hpp), and compared
//    bit for bit with the software decode of core/numeric.hpp for all 256 codes of both
//    fp8 formats, into bf16 and fp16;
//  - the architecture number derived from hipDeviceProp_t::gcnArchName;
//  - the offset split that the MFMA atom's V-fragment loads rely on.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "mlakit/arch/convert.hpp"
#include "mlakit/core/decode_args.hpp"
#include "mlakit/core/numeric.hpp"
#include "mlakit/kernel/smem_tile.hpp"
#include "mlakit/platform/runtime.hpp"

using namespace mlakit;

namespace {

std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// V_CVT_PK_F32_FP8, one byte: the E4M3 value with the format's bias (8 for FNUZ on CDNA3,
// 7 for OCP E4M3FN on CDNA4), (-1)^s * 2^(e - bias) * (1 + m/8), subnormal
// (-1)^s * 2^(1 - bias) * m/8; NaN codes (FNUZ 0x80, OCP S.1111.111) give a quiet NaN.
float sim_cvt_f32_fp8(DType format, std::uint8_t b) {
  const bool fnuz = format == DType::fp8_e4m3fnuz;
  if (fnuz ? b == 0x80 : (b & 0x7F) == 0x7F) return std::numeric_limits<float>::quiet_NaN();
  const int bias = fnuz ? 8 : 7;
  const int e = (b >> 3) & 0xF, m = b & 7;
  const double mag = e == 0 ? std::ldexp(m / 8.0, 1 - bias) : std::ldexp(1.0 + m / 8.0, e - bias);
  return static_cast<float>((b & 0x80) ? -mag : mag);
}

// V_CVT_PKRTZ_F16_F32, one value: IEEE half, rounded toward zero (finite overflow gives the
// largest finite half, not infinity).
std::uint16_t sim_f16_rtz(float x) {
  const std::uint32_t u = bits_of(x);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7E00u);
  if (a == 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7C00u);
  const int e = static_cast<int>(a >> 23);  // biased f32 exponent
  if (e - 127 > 15) return static_cast<std::uint16_t>(sign | 0x7BFFu);
  if (e - 127 >= -14)
    return static_cast<std::uint16_t>(sign | ((e - 127 + 15) << 10) | ((a & 0x7FFFFFu) >> 13));
  const int shift = 126 - e;  // x / 2^-24 = mant24 >> shift, truncated
  if (e == 0 || shift > 24) return sign;
  return static_cast<std::uint16_t>(sign | (((a & 0x7FFFFFu) | 0x800000u) >> shift));
}

struct SimInstr {
  DType format;
  arch::F32x2 cvt(std::uint32_t word, bool hi) const {
    const int b0 = hi ? 2 : 0;
    return arch::F32x2{sim_cvt_f32_fp8(format, std::uint8_t(word >> (8 * b0))),
                       sim_cvt_f32_fp8(format, std::uint8_t(word >> (8 * (b0 + 1))))};
  }
  std::uint32_t pkrtz(float lo, float hi) const {
    return std::uint32_t(sim_f16_rtz(lo)) | (std::uint32_t(sim_f16_rtz(hi)) << 16);
  }
};

bool is_nan16(DType t, std::uint16_t h) {
  return t == DType::bf16 ? ((h & 0x7F80u) == 0x7F80u && (h & 0x7Fu) != 0)
                          : ((h & 0x7C00u) == 0x7C00u && (h & 0x3FFu) != 0);
}

// Every code at every byte position of the word (the word holds codes c, c+1, c+2, c+3),
// decoded as `format` by an instruction that converts `through` (the native path when they
// are the same, fp8x4_other when not).
template <class T>
void check_all_codes(DType format, DType through) {
  const SimInstr sim{through};
  int nan_codes = 0;
  for (int c = 0; c < 256; ++c) {
    std::uint8_t codes[4];
    std::uint32_t word = 0;
    for (int i = 0; i < 4; ++i) {
      codes[i] = std::uint8_t(c + i);
      word |= std::uint32_t(codes[i]) << (8 * i);
    }
    std::uint32_t o01 = 0, o23 = 0;
    if (through == format)
      arch::fp8x4_native<T>(word, sim, o01, o23);
    else
      arch::fp8x4_other<T>(word, sim, through, o01, o23);
    const std::uint16_t got[4] = {std::uint16_t(o01), std::uint16_t(o01 >> 16), std::uint16_t(o23),
                                  std::uint16_t(o23 >> 16)};
    for (int i = 0; i < 4; ++i) {
      const float ref = decode_fp8(format, codes[i]);
      const std::uint16_t want = from_float<T>(ref).bits;
      INFO("format " << dtype_name(format) << ", compute " << dtype_name(DTypeOf<T>::value)
                     << ", code 0x" << std::hex << int(codes[i]) << ", byte " << i << ": got 0x"
                     << got[i] << ", want 0x" << want);
      if (std::isnan(ref)) {
        // The NaN's payload is not specified by the documents: only NaN-ness is checked.
        CHECK(is_nan16(DTypeOf<T>::value, got[i]));
        if (i == 0) ++nan_codes;
      } else {
        CHECK(got[i] == want);
      }
    }
  }
  CHECK(nan_codes == (format == DType::fp8_e4m3fnuz ? 1 : 2));
}

}  // namespace

TEST_CASE("amd fp8: hardware conversion paths (either format) equal the software decode",
          "[amd][convert]") {
  for (DType through : {DType::fp8_e4m3fnuz, DType::fp8_e4m3fn}) {
    check_all_codes<bf16_t>(DType::fp8_e4m3fnuz, through);
    check_all_codes<fp16_t>(DType::fp8_e4m3fnuz, through);
    check_all_codes<bf16_t>(DType::fp8_e4m3fn, through);
    check_all_codes<fp16_t>(DType::fp8_e4m3fn, through);
  }
}

TEST_CASE("amd fp8: the branch-free decode of targets without the instruction, all codes",
          "[amd][convert]") {
  for (DType f : {DType::fp8_e4m3fn, DType::fp8_e4m3fnuz})
    for (int c = 0; c < 256; ++c) {
      const float want = decode_fp8(f, std::uint8_t(c));
      const float got = arch::fp8_to_f32_bits(std::uint32_t(c), f == DType::fp8_e4m3fnuz);
      INFO(dtype_name(f) << " code " << c << ": got " << got << ", want " << want);
      if (std::isnan(want))
        CHECK(std::isnan(got));
      else
        CHECK(bits_of(got) == bits_of(want));  // -0 included
    }
}

TEST_CASE("amd fp8: the simulated instructions tell the two formats apart", "[amd][convert]") {
  // The same byte means different values on CDNA3 and CDNA4: the format choice matters.
  CHECK(sim_cvt_f32_fp8(DType::fp8_e4m3fn, 0x7E) == 448.0f);
  CHECK(sim_cvt_f32_fp8(DType::fp8_e4m3fnuz, 0x7F) == 240.0f);
  CHECK(sim_cvt_f32_fp8(DType::fp8_e4m3fnuz, 0x38) ==
        0.5f * sim_cvt_f32_fp8(DType::fp8_e4m3fn, 0x38));
  CHECK(std::isnan(sim_cvt_f32_fp8(DType::fp8_e4m3fnuz, 0x80)));
  CHECK(bits_of(sim_cvt_f32_fp8(DType::fp8_e4m3fn, 0x80)) == 0x80000000u);  // -0
  CHECK(sim_f16_rtz(65519.0f) == 0x7BFFu);  // round toward zero: no carry into infinity
  CHECK(sim_f16_rtz(1.0f + 1.0f / 1024 + 1.0f / 4096) == 0x3C01u);
  // Only a host build selects no native format.
  CHECK(arch::kNativeFp8 == DType::bf16);
}

TEST_CASE("amd: architecture number from gcnArchName", "[amd][runtime]") {
  CHECK(detail::gfx_arch_number("gfx942:sramecc+:xnack-") == 942);
  CHECK(detail::gfx_arch_number("gfx950") == 950);
  CHECK(detail::gfx_arch_number("gfx90a:sramecc-:xnack+") == 910);
  CHECK(detail::gfx_arch_number("gfx1100") == 1100);
  CHECK(detail::gfx_arch_number("gfx1030") == 1030);
  CHECK(detail::gfx_arch_number("") == 0);
  CHECK(detail::gfx_arch_number(nullptr) == 0);
  CHECK(detail::gfx_arch_number("sm_90") == 0);
  CHECK(detail::gfx_arch_number("gfx9") == 0);
  CHECK(detail::gfx_arch_number("gfxa42") == 0);
}

// MmaAtomMfma16::load_b_kn splits V-tile offsets into a uniform and a lane part; the split
// is exact for rows r0 % 8 == 0 and columns c0 % 64 == 0 of the KV tile layout.
TEST_CASE("amd mfma atom: swizzled V-tile offsets split into uniform + lane parts",
          "[amd][layout]") {
  using L = detail::SwizzledRows<kHeadDimQK>;
  STATIC_REQUIRE(L::kMask == 7);
  STATIC_REQUIRE(L::kCols % 64 == 0);
  int bad = 0;
  for (int r0 = 0; r0 < 64; r0 += 8)
    for (int c0 = 0; c0 < kHeadDimQK; c0 += 64)
      for (int r = 0; r < 8; ++r)
        for (int c = 0; c < 64; ++c)
          if (L::offset(r0 + r, c0 + c) != L::offset(r0, c0) + L::offset(r, c)) ++bad;
  CHECK(bad == 0);
  // And not for a row offset that is not a multiple of 8 (the swizzle depends on it).
  CHECK(L::offset(4 + 5, 8) != L::offset(4, 0) + L::offset(5, 8));
}
