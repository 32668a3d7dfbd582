#pragma once
// Bit-exact 16-bit and fp8 number types shared by host and device. One implementation of
// every decode and encode, so the reference, the tests and the kernels agree to the bit
// (docs/design.md, "Number formats").
//
// Only integer operations and exact float operations are used: no <cmath>, no CUDA/HIP
// intrinsics, nothing that flush-to-zero or fast-math could change. Float <-> bits goes
// through __builtin_bit_cast (gcc >= 11, clang >= 9, nvcc and hipcc device code), which
// unlike memcpy is constexpr, so every function here can be evaluated at compile time.
#include <cstdint>

#include "mlakit/core/config.hpp"
#include "mlakit/core/dtype.hpp"

namespace mlakit {

// Storage types: one member, trivially copyable, so arrays of them can sit in device memory
// and be reinterpreted from raw buffers.
struct bf16_t {
  std::uint16_t bits;
};
struct fp16_t {
  std::uint16_t bits;
};
struct fp8_e4m3fn_t {
  std::uint8_t bits;
};
struct fp8_e4m3fnuz_t {
  std::uint8_t bits;
};

MLAKIT_HOST_DEVICE constexpr float bits_to_float(std::uint32_t u) {
  return __builtin_bit_cast(float, u);
}
MLAKIT_HOST_DEVICE constexpr std::uint32_t float_to_bits(float f) {
  return __builtin_bit_cast(std::uint32_t, f);
}

namespace detail {

inline constexpr std::uint32_t kF32SignMask = 0x80000000u;
inline constexpr std::uint32_t kF32AbsMask = 0x7FFFFFFFu;
inline constexpr std::uint32_t kF32Inf = 0x7F800000u;
inline constexpr std::uint32_t kF32QuietNaN = 0x7FC00000u;

// m >> s rounded to nearest, ties to even. s in [1, 31]. A carry out of the kept mantissa
// bits lands in the exponent field, which is exactly the next binade: callers rely on that.
MLAKIT_HOST_DEVICE constexpr std::uint32_t shift_right_rne(std::uint32_t m, int s) {
  const std::uint32_t q = m >> s;
  const std::uint32_t rem = m & ((1u << s) - 1u);
  const std::uint32_t half = 1u << (s - 1);
  return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}

// Both e4m3 flavours share the 1-4-3 layout and differ only in bias, the largest finite
// code and how NaN and zero are spelled. NaN codes are filtered by the callers.
template <int Bias>
MLAKIT_HOST_DEVICE constexpr float decode_e4m3(std::uint8_t b) {
  const std::uint32_t sign = std::uint32_t(b & 0x80u) << 24;
  const std::uint32_t e = (b >> 3) & 0xFu;
  const std::uint32_t m = b & 0x7u;
  if (e == 0) {
    // Subnormal: m * 2^(1 - Bias - 3). A product with a power of two is exact, and the
    // result (>= 2^-10) is a normal float, so device flush-to-zero cannot touch it.
    const float v = float(m) * bits_to_float(std::uint32_t(127 + 1 - Bias - 3) << 23);
    return bits_to_float(float_to_bits(v) | sign);
  }
  // Normal: rebias the exponent from Bias to 127, widen the mantissa from 3 to 23 bits.
  return bits_to_float(sign | ((e + 127u - Bias) << 23) | (m << 20));
}

// Round to nearest even, saturating: finite values beyond the largest code and +-inf clamp
// to +-max. NaN handling and the spelling of zero are left to the callers.
// Returns the magnitude code (7 bits); the sign is added by the caller.
template <int Bias, std::uint8_t MaxCode>
MLAKIT_HOST_DEVICE constexpr std::uint8_t encode_e4m3_magnitude(std::uint32_t abs_bits) {
  constexpr std::uint32_t kMaxBits =
      (std::uint32_t((MaxCode >> 3) + 127 - Bias) << 23) | (std::uint32_t(MaxCode & 7u) << 20);
  constexpr std::uint32_t kMinNormalBits = std::uint32_t(127 + 1 - Bias) << 23;
  if (abs_bits >= kMaxBits) return MaxCode;  // includes +inf; anything below rounds to <= max
  if (abs_bits >= kMinNormalBits) {
    // Rebias then drop 20 mantissa bits; a carry steps into the next exponent correctly.
    return std::uint8_t(shift_right_rne(abs_bits - (std::uint32_t(127 - Bias) << 23), 20));
  }
  // Subnormal result: x = mant24 * 2^(e - 150); in units of the smallest subnormal
  // 2^(1 - Bias - 3) that is mant24 >> (148 - Bias - e). A result of 8 is the min normal.
  const int e = int(abs_bits >> 23);
  const int shift = 148 - Bias - e;
  if (e == 0 || shift > 24) return 0;  // below half the smallest subnormal (or a float denormal)
  const std::uint32_t mant24 = (abs_bits & 0x7FFFFFu) | 0x800000u;
  return std::uint8_t(shift_right_rne(mant24, shift));
}

}  // namespace detail

// ---- fp8 e4m3fn (OCP): bias 7, max 448, S.1111.111 is NaN, no inf, has -0 -------------
MLAKIT_HOST_DEVICE constexpr float decode_e4m3fn(std::uint8_t b) {
  if ((b & 0x7Fu) == 0x7Fu) {
    return bits_to_float(detail::kF32QuietNaN | (std::uint32_t(b & 0x80u) << 24));
  }
  return detail::decode_e4m3<7>(b);
}

// Saturating (satfinite), like cvt.rn.satfinite.e4m3x2.f32 on NVIDIA and the OCP spec's
// saturation mode: +-inf and finite overflow give +-448. PyTorch's .to(float8_e4m3fn) does
// NOT saturate (overflow becomes NaN); callers quantising a KV cache want the clamp, and a
// scale chosen from amax never overflows anyway. NaN -> 0x7F with the input's sign.
MLAKIT_HOST_DEVICE constexpr std::uint8_t encode_e4m3fn(float x) {
  const std::uint32_t u = float_to_bits(x);
  const std::uint8_t sign = std::uint8_t((u >> 24) & 0x80u);
  const std::uint32_t a = u & detail::kF32AbsMask;
  if (a > detail::kF32Inf) return std::uint8_t(sign | 0x7Fu);
  return std::uint8_t(sign | detail::encode_e4m3_magnitude<7, 0x7E>(a));  // keeps -0
}

// ---- fp8 e4m3fnuz (AMD gfx942): bias 8, max 240, 0x80 is the only NaN, no inf, no -0 ---
MLAKIT_HOST_DEVICE constexpr float decode_e4m3fnuz(std::uint8_t b) {
  if (b == 0x80u) return bits_to_float(detail::kF32QuietNaN);
  return detail::decode_e4m3<8>(b);
}

// Saturating like encode_e4m3fn: +-inf and overflow give +-240. NaN -> 0x80. A result that
// rounds to zero is 0x00 whatever the sign, because 0x80 would be NaN.
MLAKIT_HOST_DEVICE constexpr std::uint8_t encode_e4m3fnuz(float x) {
  const std::uint32_t u = float_to_bits(x);
  const std::uint32_t a = u & detail::kF32AbsMask;
  if (a > detail::kF32Inf) return 0x80u;
  const std::uint8_t mag = detail::encode_e4m3_magnitude<8, 0x7F>(a);
  if (mag == 0) return 0x00u;
  return std::uint8_t(((u >> 24) & 0x80u) | mag);
}

// ---- bf16: the top half of a float ---------------------------------------------------
MLAKIT_HOST_DEVICE constexpr float decode_bf16(std::uint16_t h) {
  return bits_to_float(std::uint32_t(h) << 16);
}

// IEEE round to nearest even; overflow carries into the exponent and becomes inf. NaN keeps
// sign and top payload bits and is forced quiet, so truncation cannot turn it into inf.
MLAKIT_HOST_DEVICE constexpr std::uint16_t encode_bf16(float x) {
  const std::uint32_t u = float_to_bits(x);
  if ((u & detail::kF32AbsMask) > detail::kF32Inf) return std::uint16_t((u >> 16) | 0x0040u);
  return std::uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// ---- fp16: bias 15, max 65504, subnormals down to 2^-24 ------------------------------
MLAKIT_HOST_DEVICE constexpr float decode_fp16(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1Fu;
  const std::uint32_t m = h & 0x3FFu;
  if (e == 0x1Fu) return bits_to_float(sign | detail::kF32Inf | (m << 13));  // inf, NaN
  if (e == 0) {
    // Subnormal (or zero): m * 2^-24, exact, and a normal float (no flush-to-zero risk).
    const float v = float(m) * bits_to_float(std::uint32_t(127 - 24) << 23);
    return bits_to_float(float_to_bits(v) | sign);
  }
  return bits_to_float(sign | ((e + 112u) << 23) | (m << 13));  // rebias 15 -> 127
}

// IEEE round to nearest even; |x| >= 65520 (the midpoint above 65504, which ties to the even
// 65536) becomes inf. NaN keeps sign and top payload bits and is forced quiet.
MLAKIT_HOST_DEVICE constexpr std::uint16_t encode_fp16(float x) {
  const std::uint32_t u = float_to_bits(x);
  const std::uint16_t sign = std::uint16_t((u >> 16) & 0x8000u);
  const std::uint32_t a = u & detail::kF32AbsMask;
  if (a > detail::kF32Inf) return std::uint16_t(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  if (a >= 0x477FF000u) return std::uint16_t(sign | 0x7C00u);  // 65520 and up, inf
  if (a >= 0x38800000u) {                                      // 2^-14 and up: normal
    return std::uint16_t(sign | detail::shift_right_rne(a - (112u << 23), 13));
  }
  // Subnormal: x / 2^-24 = mant24 >> (126 - e). A result of 0x400 is the min normal.
  const int e = int(a >> 23);
  const int shift = 126 - e;
  if (e == 0 || shift > 24) return sign;  // |x| <= 2^-25 rounds to (signed) zero
  return std::uint16_t(sign | detail::shift_right_rne((a & 0x7FFFFFu) | 0x800000u, shift));
}

// ---- type-based API --------------------------------------------------------------------
MLAKIT_HOST_DEVICE constexpr float to_float(bf16_t v) { return decode_bf16(v.bits); }
MLAKIT_HOST_DEVICE constexpr float to_float(fp16_t v) { return decode_fp16(v.bits); }
MLAKIT_HOST_DEVICE constexpr float to_float(fp8_e4m3fn_t v) { return decode_e4m3fn(v.bits); }
MLAKIT_HOST_DEVICE constexpr float to_float(fp8_e4m3fnuz_t v) { return decode_e4m3fnuz(v.bits); }

namespace detail {
template <class T>
inline constexpr bool kAlwaysFalse = false;
}

// from_float<T>(x): round to nearest even; see encode_* for overflow and NaN rules.
template <class T>
MLAKIT_HOST_DEVICE constexpr T from_float(float) {
  static_assert(detail::kAlwaysFalse<T>, "from_float: T must be bf16_t, fp16_t or an fp8 type");
  return T{};
}
template <>
MLAKIT_HOST_DEVICE constexpr bf16_t from_float<bf16_t>(float x) {
  return bf16_t{encode_bf16(x)};
}
template <>
MLAKIT_HOST_DEVICE constexpr fp16_t from_float<fp16_t>(float x) {
  return fp16_t{encode_fp16(x)};
}
template <>
MLAKIT_HOST_DEVICE constexpr fp8_e4m3fn_t from_float<fp8_e4m3fn_t>(float x) {
  return fp8_e4m3fn_t{encode_e4m3fn(x)};
}
template <>
MLAKIT_HOST_DEVICE constexpr fp8_e4m3fnuz_t from_float<fp8_e4m3fnuz_t>(float x) {
  return fp8_e4m3fnuz_t{encode_e4m3fnuz(x)};
}

// ---- DType <-> storage type ------------------------------------------------------------
template <DType D>
struct StorageOf;
template <>
struct StorageOf<DType::bf16> {
  using type = bf16_t;
};
template <>
struct StorageOf<DType::fp16> {
  using type = fp16_t;
};
template <>
struct StorageOf<DType::fp8_e4m3fn> {
  using type = fp8_e4m3fn_t;
};
template <>
struct StorageOf<DType::fp8_e4m3fnuz> {
  using type = fp8_e4m3fnuz_t;
};
template <DType D>
using storage_of_t = typename StorageOf<D>::type;

template <class T>
struct DTypeOf;
template <>
struct DTypeOf<bf16_t> {
  static constexpr DType value = DType::bf16;
};
template <>
struct DTypeOf<fp16_t> {
  static constexpr DType value = DType::fp16;
};
template <>
struct DTypeOf<fp8_e4m3fn_t> {
  static constexpr DType value = DType::fp8_e4m3fn;
};
template <>
struct DTypeOf<fp8_e4m3fnuz_t> {
  static constexpr DType value = DType::fp8_e4m3fnuz;
};
template <class T>
inline constexpr DType dtype_of_v = DTypeOf<T>::value;

static_assert(sizeof(bf16_t) == 2 && sizeof(fp16_t) == 2, "16-bit storage must be 2 bytes");
static_assert(sizeof(fp8_e4m3fn_t) == 1 && sizeof(fp8_e4m3fnuz_t) == 1, "fp8 must be 1 byte");

// Runtime switch for the fp8 cache formats (the kernel and the reference pick the format at
// run time). A 16-bit or invalid dtype has no 1-byte code and gives NaN.
MLAKIT_HOST_DEVICE constexpr float decode_fp8(DType t, std::uint8_t byte) {
  return t == DType::fp8_e4m3fn     ? decode_e4m3fn(byte)
         : t == DType::fp8_e4m3fnuz ? decode_e4m3fnuz(byte)
                                    : bits_to_float(detail::kF32QuietNaN);
}

// The matching encoder (saturating, as encode_e4m3fn / encode_e4m3fnuz); a 16-bit or invalid
// dtype gives the code 0.
MLAKIT_HOST_DEVICE constexpr std::uint8_t encode_fp8(DType t, float x) {
  return t == DType::fp8_e4m3fn     ? encode_e4m3fn(x)
         : t == DType::fp8_e4m3fnuz ? encode_e4m3fnuz(x)
                                    : std::uint8_t(0);
}

// The largest finite value of an fp8 format (e4m3fn 448, e4m3fnuz 240); 0 for other dtypes.
MLAKIT_HOST_DEVICE constexpr float fp8_max(DType t) {
  return t == DType::fp8_e4m3fn ? 448.0f : t == DType::fp8_e4m3fnuz ? 240.0f : 0.0f;
}

}  // namespace mlakit
