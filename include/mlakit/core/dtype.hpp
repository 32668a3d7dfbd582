#pragma once
#include <cstddef>
#include <cstdint>

#include "config.hpp"

namespace mlakit {

// Element types the library reads and writes. Q and O share one 16-bit type; the KV cache
// may be 16-bit or fp8 (with one fp32 kv_scale per tensor).
enum class DType : std::uint8_t {
  bf16 = 0,
  fp16 = 1,
  fp8_e4m3fn = 2,    // OCP e4m3: bias 7, max 448, NaN = S.1111.111, no inf
  fp8_e4m3fnuz = 3,  // AMD gfx942 e4m3: bias 8, max 240, NaN = 0x80 only, no -0, no inf
};

inline constexpr int kNumDTypes = 4;

// These are host and device functions: the kernels size and decode KV by them, and a user's
// plain `nvcc -std=c++17` compile (no --expt-relaxed-constexpr) must accept that.

MLAKIT_HOST_DEVICE constexpr std::size_t dtype_bytes(DType t) {
  return (t == DType::bf16 || t == DType::fp16) ? 2 : 1;
}

MLAKIT_HOST_DEVICE constexpr bool is_fp8(DType t) {
  return t == DType::fp8_e4m3fn || t == DType::fp8_e4m3fnuz;
}

MLAKIT_HOST_DEVICE constexpr bool is_valid_dtype(DType t) {
  return static_cast<unsigned>(t) < kNumDTypes;
}

MLAKIT_HOST_DEVICE constexpr const char* dtype_name(DType t) {
  switch (t) {
    case DType::bf16:
      return "bf16";
    case DType::fp16:
      return "fp16";
    case DType::fp8_e4m3fn:
      return "fp8_e4m3fn";
    case DType::fp8_e4m3fnuz:
      return "fp8_e4m3fnuz";
  }
  return "invalid";
}

}  // namespace mlakit
