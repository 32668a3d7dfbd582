#pragma once
// KV element conversion to the 16-bit compute type, right before the matrix instruction.
// Each call converts one 16-byte chunk of raw cache bytes into compute-type values.
#include <cstdint>

#include "../core/dtype.hpp"
#include "../core/numeric.hpp"
#include "../platform/platform.hpp"

#if defined(MLAKIT_PLATFORM_CUDA)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace mlakit::arch {

// ---- AMD hardware fp8 conversion -------------------------------------------------------
// gfx940/941/942 (CDNA3) and gfx950 (CDNA4) convert fp8 in hardware: V_CVT_PK_F32_FP8 turns
// two bytes of a 32-bit register (bytes 0-1, or 2-3 with op_sel) into two f32. The opcode
// is the same on both; the byte format is not: CDNA3 decodes E4M3 "FNUZ" (bias 8, 0x80 the
// only NaN), CDNA4 the OCP E4M3FN (bias 7, S.1111.111 NaN). Sources: the MI300 (CDNA3) ISA
// reference guide, V_CVT_PK_F32_FP8; clang's AMDGPUBuiltins.rst and BuiltinsAMDGPU.def for
// __builtin_amdgcn_cvt_pk_f32_fp8(int, bool hi); LLVM pull request #106160 for the OCP
// meaning of the gfx940 fp8 opcodes on gfx950; ROCm's precision-support page (FNUZ fp8 on
// CDNA3, OCP on CDNA4). The other format goes through the same instruction (fp8x4_other).
//
// Every fp8 value is exact in bf16 and in fp16 (magnitudes 2^-10 .. 448, at most 4
// significant bits), so the f32 pair packs into the compute type without rounding: bf16
// takes the upper halves of the f32 bits, fp16 goes through V_CVT_PKRTZ_F16_F32 (round
// toward zero, which equals round-to-nearest on exact values).
//
// The packing is written against an instruction object (`cvt(word, hi)` -> F32x2,
// `pkrtz(lo, hi)` -> packed f16 pair), so host tests run the same code with simulated
// instructions (test/test_amd.cpp); the device passes the builtins.
struct F32x2 {
  float lo, hi;
};

// The fp8 format the compiled AMD target converts in hardware (device pass), else bf16 as
// "none" (no fp8 format compares equal to it).
#if defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__)
inline constexpr DType kNativeFp8 = DType::fp8_e4m3fnuz;
#elif defined(__gfx950__)
inline constexpr DType kNativeFp8 = DType::fp8_e4m3fn;
#else
inline constexpr DType kNativeFp8 = DType::bf16;
#endif

// The upper half of an f32 as bf16 bits: exact for every fp8 value; a NaN gets its quiet bit
// set, so it stays NaN whichever mantissa bits the conversion put its payload in.
MLAKIT_HOST_DEVICE inline __attribute__((always_inline)) std::uint32_t bf16_upper(float f) {
  const std::uint32_t b = float_to_bits(f);
  return (b >> 16) | ((b & 0x7FFFFFFFu) > 0x7F800000u ? 0x40u : 0u);
}

// One 32-bit word of four fp8 bytes -> four compute values in two b32 words (low half =
// lower byte), through two packed conversions.
template <class T, class Instr>
MLAKIT_HOST_DEVICE inline __attribute__((always_inline)) void fp8x4_native(std::uint32_t word,
                                                                           const Instr& in,
                                                                           std::uint32_t& out01,
                                                                           std::uint32_t& out23) {
  const F32x2 a = in.cvt(word, false), b = in.cvt(word, true);
  if constexpr (DTypeOf<T>::value == DType::bf16) {
    out01 = bf16_upper(a.lo) | (bf16_upper(a.hi) << 16);
    out23 = bf16_upper(b.lo) | (bf16_upper(b.hi) << 16);
  } else {
    out01 = in.pkrtz(a.lo, a.hi);
    out23 = in.pkrtz(b.lo, b.hi);
  }
}

// One fp8 byte (e4m3fn, or e4m3fnuz when `fnuz`) -> f32, without branches or calls: the
// decode of targets with no fp8 conversion instruction (gfx90a), short enough to stay inline
// in the CDNA mainloop. Normal codes move their exponent and mantissa bits into place;
// subnormals are m x 2^(1 - bias - 3), exact in f32; the NaN codes give a quiet NaN.
MLAKIT_HOST_DEVICE inline __attribute__((always_inline)) float fp8_to_f32_bits(std::uint32_t b,
                                                                               bool fnuz) {
  const std::uint32_t e = (b >> 3) & 0xFu, m = b & 7u, sign = (b & 0x80u) << 24;
  const std::uint32_t bias = fnuz ? 8u : 7u;
  const float sub = float(m) * (fnuz ? 0.0009765625f : 0.001953125f);  // 2^-10, 2^-9
  const std::uint32_t normal = sign | ((e + 127u - bias) << 23) | (m << 20);
  std::uint32_t bits = e == 0 ? (sign | float_to_bits(sub)) : normal;
  const bool nan = fnuz ? b == 0x80u : (b & 0x7Fu) == 0x7Fu;
  return bits_to_float(nan ? 0x7FC00000u : bits);
}

// The other fp8 format through the same instruction (`native`: the format it converts). Both
// are sign, 4 exponent and 3 mantissa bits, with biases 7 (e4m3fn) and 8 (e4m3fnuz), so a byte
// means 2^(8 - 7) = 2 times more in e4m3fn than in e4m3fnuz, exactly, subnormals included,
// except two codes whose meaning differs: 0x80 (e4m3fnuz NaN, e4m3fn -0) and S.1111.111
// (e4m3fn NaN, e4m3fnuz +-240). Four multiplies and those fixes, where the portable decode
// spends a dozen instructions and branches per byte.
template <class T, class Instr>
MLAKIT_HOST_DEVICE inline __attribute__((always_inline)) void fp8x4_other(
    std::uint32_t word, const Instr& in, DType native, std::uint32_t& out01, std::uint32_t& out23) {
  const F32x2 a = in.cvt(word, false), b = in.cvt(word, true);
  float v[4] = {a.lo, a.hi, b.lo, b.hi};
  const bool fn_wanted = native == DType::fp8_e4m3fnuz;  // decoding e4m3fn on fnuz hardware
  const float factor = fn_wanted ? 2.0f : 0.5f;
  for (int e = 0; e < 4; ++e) {
    const std::uint32_t c = (word >> (8 * e)) & 0xFFu;
    float x = v[e] * factor;
    if ((c & 0x7Fu) == 0x7Fu)
      x = fn_wanted ? bits_to_float(0x7FC00000u) : ((c & 0x80u) ? -240.0f : 240.0f);
    else if (c == 0x80u)
      x = fn_wanted ? -0.0f : bits_to_float(0x7FC00000u);
    v[e] = x;
  }
  if constexpr (DTypeOf<T>::value == DType::bf16) {
    out01 = bf16_upper(v[0]) | (bf16_upper(v[1]) << 16);
    out23 = bf16_upper(v[2]) | (bf16_upper(v[3]) << 16);
  } else {
    out01 = in.pkrtz(v[0], v[1]);
    out23 = in.pkrtz(v[2], v[3]);
  }
}

#if defined(MLAKIT_PLATFORM_HIP) && defined(MLAKIT_DEVICE_PASS) && \
    (defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__) || defined(__gfx950__))
// The builtins behind fp8x4_native on CDNA3 / CDNA4.
struct AmdFp8Instr {
  using f32x2_t = float __attribute__((ext_vector_type(2)));
  __device__ F32x2 cvt(std::uint32_t word, bool hi) const {
    // The builtin's selector must be a constant: two calls instead of passing `hi` on.
    const f32x2_t v = hi ? __builtin_amdgcn_cvt_pk_f32_fp8(static_cast<int>(word), true)
                         : __builtin_amdgcn_cvt_pk_f32_fp8(static_cast<int>(word), false);
    return F32x2{v[0], v[1]};
  }
  __device__ std::uint32_t pkrtz(float lo, float hi) const {
    return __builtin_bit_cast(std::uint32_t, __builtin_amdgcn_cvt_pkrtz(lo, hi));
  }
};
#define MLAKIT_AMD_FP8_CVT 1
#endif

#if !defined(MLAKIT_PLATFORM_NONE)

#if defined(MLAKIT_PLATFORM_HIP)
// encode_bf16 without branches: round to nearest even, a NaN keeps its upper bits with the
// quiet bit set.
__device__ __forceinline__ std::uint32_t bf16_rne_bits(float f) {
  const std::uint32_t u = float_to_bits(f);
  const std::uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return (u & 0x7FFFFFFFu) > 0x7F800000u ? (u >> 16) | 0x40u : rounded;
}
#endif

// Packs two floats into the compute type's b32 pair (low half = first value). Exact when the
// floats are representable (all fp8 values are), round-to-nearest-even otherwise.
template <class T>
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi) {
#if defined(MLAKIT_PLATFORM_CUDA)
  // One cvt.rn.{bf16x2,f16x2}.f32 instead of the portable integer rounding.
  std::uint32_t r;
  if constexpr (DTypeOf<T>::value == DType::bf16) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    r = *reinterpret_cast<const std::uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    r = *reinterpret_cast<const std::uint32_t*>(&v);
  }
  return r;
#else
  // AMD: the rounding of from_float<T> without control flow (its branches become exec-mask
  // code inside the CDNA tile loop). bf16: encode_bf16 as selects; fp16: V_CVT_F16_F32 (IEEE
  // round to nearest even, what encode_fp16 computes, for every finite value and infinity; a
  // NaN stays NaN).
  if constexpr (DTypeOf<T>::value == DType::bf16) {
    return bf16_rne_bits(lo) | (bf16_rne_bits(hi) << 16);
  } else {
    return std::uint32_t(__builtin_bit_cast(std::uint16_t, static_cast<_Float16>(lo))) |
           (std::uint32_t(__builtin_bit_cast(std::uint16_t, static_cast<_Float16>(hi))) << 16);
  }
#endif
}

// The inverse of pack2: the two 16-bit values of a b32 pair as floats (exact).
template <class T>
__device__ __forceinline__ void unpack2(std::uint32_t w, float& lo, float& hi) {
  if constexpr (DTypeOf<T>::value == DType::bf16) {
    lo = bits_to_float(w << 16);
    hi = bits_to_float(w & 0xFFFF0000u);
  } else {
#if defined(MLAKIT_PLATFORM_CUDA)
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w));
    lo = f.x;
    hi = f.y;
#else
    lo = to_float(fp16_t{std::uint16_t(w & 0xFFFFu)});
    hi = to_float(fp16_t{std::uint16_t(w >> 16)});
#endif
  }
}

#if defined(MLAKIT_PLATFORM_CUDA)
// Two e4m3fn bytes (low byte first) -> two floats, through the native cvt (sm_89+: exact for
// every code, NaN stays NaN; docs/design.md, "fp8 decoding"). sm_80 takes the portable decode.
__device__ __forceinline__ void e4m3fn_x2_to_float(std::uint16_t two, float& lo, float& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  std::uint32_t h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h2) : "h"(two));
  unpack2<fp16_t>(h2, lo, hi);
#else
  lo = decode_e4m3fn(std::uint8_t(two & 0xFF));
  hi = decode_e4m3fn(std::uint8_t(two >> 8));
#endif
}
#endif

// 16 fp8 bytes -> 16 compute values (8 b32 words). Both fp8 flavours decode bit-exactly;
// the hardware converts e4m3fn on NVIDIA (sm_89+) and on gfx950, e4m3fnuz on gfx940-942, and
// on those AMD targets the other format too, through the same instruction (fp8x4_other);
// every other case takes the portable decode from core/.
template <class T>
__device__ __forceinline__ void convert_fp8x16(DType kv, const uint4& in, uint4& out0,
                                               uint4& out1) {
  const std::uint32_t w[4] = {in.x, in.y, in.z, in.w};
  std::uint32_t o[8];
#if defined(MLAKIT_AMD_FP8_CVT)
  if (kv == kNativeFp8) {
#pragma unroll
    for (int i = 0; i < 4; ++i) fp8x4_native<T>(w[i], AmdFp8Instr{}, o[2 * i], o[2 * i + 1]);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i)
      fp8x4_other<T>(w[i], AmdFp8Instr{}, kNativeFp8, o[2 * i], o[2 * i + 1]);
  }
  out0 = uint4{o[0], o[1], o[2], o[3]};
  out1 = uint4{o[4], o[5], o[6], o[7]};
  return;
#endif
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const std::uint16_t two = std::uint16_t(w[i / 2] >> (16 * (i % 2)));
    float lo, hi;
#if defined(MLAKIT_PLATFORM_CUDA)
    if (kv == DType::fp8_e4m3fn) {
      e4m3fn_x2_to_float(two, lo, hi);
    } else {
      lo = decode_fp8(kv, std::uint8_t(two & 0xFF));
      hi = decode_fp8(kv, std::uint8_t(two >> 8));
    }
#else
    lo = fp8_to_f32_bits(two & 0xFFu, kv == DType::fp8_e4m3fnuz);
    hi = fp8_to_f32_bits(two >> 8, kv == DType::fp8_e4m3fnuz);
#endif
    o[i] = pack2<T>(lo, hi);
  }
  out0 = uint4{o[0], o[1], o[2], o[3]};
  out1 = uint4{o[4], o[5], o[6], o[7]};
}

// 8 values of the other 16-bit type -> 8 compute values (bf16 <-> fp16, rounded to nearest).
template <class T>
__device__ __forceinline__ uint4 convert_16x8(DType kv, const uint4& in) {
  const std::uint32_t w[4] = {in.x, in.y, in.z, in.w};
  std::uint32_t o[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const std::uint16_t a = std::uint16_t(w[i] & 0xFFFF), b = std::uint16_t(w[i] >> 16);
#if defined(MLAKIT_PLATFORM_HIP)
    // AMD: fp16 -> f32 is V_CVT_F32_F16 (exact, as decode_fp16; a NaN stays NaN), not
    // decode_fp16's branches.
    const float fa = kv == DType::bf16 ? decode_bf16(a)
                                       : float(__builtin_bit_cast(_Float16, a));
    const float fb = kv == DType::bf16 ? decode_bf16(b)
                                       : float(__builtin_bit_cast(_Float16, b));
#else
    const float fa = kv == DType::bf16 ? decode_bf16(a) : decode_fp16(a);
    const float fb = kv == DType::bf16 ? decode_bf16(b) : decode_fp16(b);
#endif
    o[i] = pack2<T>(fa, fb);
  }
  return uint4{o[0], o[1], o[2], o[3]};
}

#endif  // !MLAKIT_PLATFORM_NONE

}  // namespace mlakit::arch
