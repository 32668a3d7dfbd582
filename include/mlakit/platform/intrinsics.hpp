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

// v from lane `src` of the warp / wave (every lane takes part).
__device__ __forceinline__ int shfl(int v, int src) {
#if defined(MLAKIT_PLATFORM_CUDA)
  return __shfl_sync(0xffffffffu, v, src);
#else
  return __shfl(v, src, kWarpSize);
#endif
}

__device__ __forceinline__ int lane_id() { return static_cast<int>(threadIdx.x) % kWarpSize; }
__device__ __forceinline__ int warp_id() { return static_cast<int>(threadIdx.x) / kWarpSize; }

// 2^x. The softmax runs in base 2 with log2(e) folded into the scale. NVIDIA: the ftz form of
// ex2.approx is one MUFU.EX2; exp2f (ex2.approx without ftz) adds a compare and two predicated
// multiplies per call to produce subnormal results. Results below 2^-126 become 0 instead:
// every use is a softmax weight or a rescale factor relative to a running max, where such
// values are below the rounding of the sums they enter. AMD: one v_exp_f32 through
// __builtin_amdgcn_exp2f (exp2f compiles to __ocml_exp2_f32, which adds a compare, two selects,
// an add and a multiply around it to keep subnormal results); the same flush to zero as on
// NVIDIA. Compilers without the builtin (clang < 18: Debian's hipcc 5.2) take exp2f.
__device__ __forceinline__ float fast_exp2(float x) {
#if defined(MLAKIT_PLATFORM_CUDA)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
#elif defined(MLAKIT_PLATFORM_EMULATED) || __has_builtin(__builtin_amdgcn_exp2f)
  return __builtin_amdgcn_exp2f(x);
#else
  return exp2f(x);
#endif
}

// A point the compiler's instruction scheduler moves nothing across (AMD: sched_barrier 0; no
// code). It bounds how far ahead loads are hoisted, and so the registers they hold. Elsewhere
// nothing.
__device__ __forceinline__ void schedule_barrier() {
#if defined(MLAKIT_PLATFORM_HIP) && \
    (defined(MLAKIT_PLATFORM_EMULATED) || __has_builtin(__builtin_amdgcn_sched_barrier))
  __builtin_amdgcn_sched_barrier(0);
#endif
}

// x, unknown to the optimiser: values computed from it inside a loop are not hoisted out of
// the loop (where they would hold registers for its whole length). No instruction.
__device__ __forceinline__ int opaque(int x) {
#if defined(MLAKIT_PLATFORM_HIP) && !defined(MLAKIT_PLATFORM_EMULATED)
  asm volatile("" : "+v"(x));
#else
  asm volatile("" : "+r"(x));
#endif
  return x;
}

// The second argument of __launch_bounds__ for a kernel of `threads` threads that should
// keep `blocks` blocks resident per SM / CU: CUDA reads it as blocks per SM, HIP as the
// minimum waves per SIMD (amdgpu_waves_per_eu; a CDNA CU has 4 SIMDs; rounded up, so that
// the SIMDs that get the most waves have the registers for them).
constexpr int launch_bounds_residency(int threads, int blocks) {
#if defined(MLAKIT_PLATFORM_CUDA)
  (void)threads;
  return blocks;
#else
  const int waves = blocks * ((threads + kWarpSize - 1) / kWarpSize);
  return (waves + 3) / 4;
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
