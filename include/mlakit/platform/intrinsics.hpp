#pragma once
// Warp-level and math intrinsics with one spelling for both vendors. Device code only.
#include <cstdint>

#include "platform.hpp"

namespace mlakit::detail {

#if !defined(MLAKIT_PLATFORM_NONE)

#if defined(MLAKIT_PLATFORM_CUDA)
inline constexpr int kWarpSize = 32;
#else
inline constexpr int kWarpSize = 64;  // wave64 on every CDNA target
#endif

__device__ __forceinline__ float shfl_xor(float v, int mask) {
#if defined(MLAKIT_PLATFORM_CUDA)
  return __shfl_xor_sync(0xffffffffu, v, mask);
#else
  return __shfl_xor(v, mask, kWarpSize);
#endif
}

__device__ __forceinline__ int lane_id() { return static_cast<int>(threadIdx.x) % kWarpSize; }
__device__ __forceinline__ int warp_id() { return static_cast<int>(threadIdx.x) / kWarpSize; }

// 2^x. The softmax runs in base 2 with log2(e) folded into the scale. NVIDIA: the ftz form of
// ex2.approx is one MUFU.EX2; exp2f (ex2.approx without ftz) adds a compare and two predicated
// multiplies per call to produce subnormal results. Results below 2^-126 become 0 instead:
// every use is a softmax weight or a rescale factor relative to a running max, where such
// values are below the rounding of the sums they enter. AMD: v_exp_f32.
__device__ __forceinline__ float fast_exp2(float x) {
#if defined(MLAKIT_PLATFORM_CUDA)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}

__device__ __forceinline__ void block_sync() { __syncthreads(); }

// The block's dynamic shared memory (LDS on AMD), aligned to 1024 bytes.
__device__ __forceinline__ unsigned char* dynamic_smem() {
#if defined(MLAKIT_PLATFORM_EMULATED)
  return emu::dynamic_lds();
#else
  extern __shared__ __align__(1024) unsigned char smem[];
  return smem;
#endif
}

#if defined(MLAKIT_PLATFORM_CUDA)
// The 32-bit shared-memory address of a generic pointer into shared memory (PTX operands of
// cp.async, ldmatrix and wgmma descriptors).
__device__ __forceinline__ std::uint32_t smem_u32(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}
#endif

#endif  // !MLAKIT_PLATFORM_NONE

}  // namespace mlakit::detail
