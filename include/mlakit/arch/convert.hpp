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

#if !defined(MLAKIT_PLATFORM_NONE)

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
  return std::uint32_t(from_float<T>(lo).bits) | (std::uint32_t(from_float<T>(hi).bits) << 16);
#endif
}

#if defined(MLAKIT_PLATFORM_CUDA)
// Two e4m3fn bytes (low byte first) -> two floats, through the native cvt (sm_89+: exact for
// every code, NaN stays NaN; docs/design.md, "fp8 decoding"). sm_80 takes the portable decode.
__device__ __forceinline__ void e4m3fn_x2_to_float(std::uint16_t two, float& lo, float& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  std::uint32_t h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h2) : "h"(two));
  const __half2 h = *reinterpret_cast<const __half2*>(&h2);
  const float2 f = __half22float2(h);
  lo = f.x;
  hi = f.y;
#else
  lo = decode_e4m3fn(std::uint8_t(two & 0xFF));
  hi = decode_e4m3fn(std::uint8_t(two >> 8));
#endif
}
#endif

// 16 fp8 bytes -> 16 compute values (8 b32 words). Both fp8 flavours decode bit-exactly;
// e4m3fn uses the hardware converter on NVIDIA, e4m3fnuz the portable decode from core/.
template <class T>
__device__ __forceinline__ void convert_fp8x16(DType kv, const uint4& in, uint4& out0,
                                               uint4& out1) {
  const std::uint32_t w[4] = {in.x, in.y, in.z, in.w};
  std::uint32_t o[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const std::uint16_t two = std::uint16_t(w[i / 2] >> (16 * (i % 2)));
    float lo, hi;
#if defined(MLAKIT_PLATFORM_CUDA)
    if (kv == DType::fp8_e4m3fn) {
      e4m3fn_x2_to_float(two, lo, hi);
    } else
#endif
    {
      lo = decode_fp8(kv, std::uint8_t(two & 0xFF));
      hi = decode_fp8(kv, std::uint8_t(two >> 8));
    }
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
    const float fa = kv == DType::bf16 ? decode_bf16(a) : decode_fp16(a);
    const float fb = kv == DType::bf16 ? decode_bf16(b) : decode_fp16(b);
    o[i] = pack2<T>(fa, fb);
  }
  return uint4{o[0], o[1], o[2], o[3]};
}

#endif  // !MLAKIT_PLATFORM_NONE

}  // namespace mlakit::arch
