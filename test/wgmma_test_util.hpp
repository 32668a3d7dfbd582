#pragma once
// Pieces shared by the e4m3 warpgroup-MMA programs (test/gpu_wgmma_fp8.cu,
// test/gpu_wgmma_fp8_kt.cu, test/accuracy/fp8_wgmma_sum.cu, test/accuracy/fp8_matrix_tile.cu):
// host-side operand helpers, and the common preamble of their one-warpgroup sm_90a kernels (the
// thread's place in the warpgroup, the dynamic shared memory and shared addresses into it,
// 128-byte-swizzled operand stores, the hand-over of those stores to wgmma). For CUDA
// translation units (nvcc).
#include <cstdint>
#include <random>
#include <vector>

#include "mlakit/arch/wgmma_fp8_sm90.hpp"
#include "mlakit/core/numeric.hpp"

namespace mlakit::testing {

// A random finite e4m3fn code, uniform over the 254 finite codes (both zeros included): bytes
// are drawn until one is not a NaN code (S.1111.111).
inline std::uint8_t random_e4m3(std::mt19937& rng) {
  for (;;) {
    const auto b = static_cast<std::uint8_t>(rng() & 0xFFu);
    if ((b & 0x7Fu) != 0x7Fu) return b;
  }
}

// x rounded to the nearest bf16 value (ties to even), as a float. A double is rounded to float
// by the caller first (two roundings, as when the value is stored as float and then as bf16).
inline float bf16(float x) { return to_float(from_float<bf16_t>(x)); }

// Whether key_of maps each 16-key block of a 64-key tile onto itself, one to one (a kappa
// order of arch/wgmma_fp8_sm90.hpp).
inline bool permutes_16_key_blocks(int (*key_of)(int)) {
  int seen[64] = {};
  for (int kappa = 0; kappa < 64; ++kappa) {
    const int key = key_of(kappa);
    if (key < 0 || key >= 64 || key / 16 != kappa / 16) return false;
    ++seen[key];
  }
  for (int n : seen)
    if (n != 1) return false;
  return true;
}

#if defined(MLAKIT_PLATFORM_CUDA)
// The binary version of the code the runtime loads for `kernel` on the current device (90 for
// sm_90a code), 0 when it cannot be queried.
template <class Kernel>
int loaded_binary_version(Kernel* kernel) {
  cudaFuncAttributes attr{};
  return cudaFuncGetAttributes(&attr, kernel) == cudaSuccess ? attr.binaryVersion : 0;
}

// Declared for every CUDA pass (like the arch/ helpers they call); only the kernels' sm_90a
// bodies (MLAKIT_WGMMA_ENABLED) use them.

// A thread of a 128-thread warpgroup: tid = threadIdx.x, warp w, and its lane as (g, t) =
// (lane / 4, lane % 4), the coordinates of the mma / wgmma fragment layouts.
struct WarpgroupThread {
  int tid, w, g, t;
};
__device__ __forceinline__ WarpgroupThread warpgroup_thread() {
  const int tid = static_cast<int>(threadIdx.x);
  return {tid, tid / 32, (tid % 32) / 4, tid % 4};
}

// Row and column of element i of a wgmma m64nN f32 accumulator in thread (w, g, t): i = 4 b +
// 2 h + e is column 8 b + 2 t + e of row 16 w + g + 8 h (warp w holds rows 16 w .. 16 w + 15).
__device__ __forceinline__ int acc_row(int w, int g, int i) {
  return 16 * w + g + 8 * ((i >> 1) & 1);
}
__device__ __forceinline__ int acc_col(int t, int i) { return 8 * (i >> 2) + 2 * t + (i & 1); }

// The block's dynamic shared memory: its generic pointer and its shared-window address, the
// 32-bit form that sts32 / lds32 and wgmma descriptors take. The region is declared 1024-byte
// aligned and the kernels' layout structs are alignas(1024), so every 128-byte-swizzled tile
// at a multiple of 1024 bytes inside sits on its pattern's boundary (descriptor base offset 0).
struct DynamicSmem {
  unsigned char* raw;
  std::uint32_t base;

  __device__ __forceinline__ DynamicSmem()
      : raw(detail::dynamic_smem()), base(detail::smem_u32(raw)) {}
  // The region as the kernel's layout struct.
  template <class T>
  __device__ __forceinline__ T& as() const {
    return *reinterpret_cast<T*>(raw);
  }
  // The shared address of a pointer into the region (its byte distance from the start added
  // to the base: no conversion instruction per operand).
  __device__ __forceinline__ std::uint32_t addr(const void* p) const {
    return base + std::uint32_t(static_cast<const unsigned char*>(p) - raw);
  }
};

// A row-major [Rows][RowBytes] byte matrix in global memory stored to shared memory at
// address dst as chunks of 128 columns: chunk c, a [Rows][128 B] tile with the 128-byte
// swizzle, at dst + c * Rows * 128 (a last chunk of RowBytes % 128 columns laid out as a full
// one), the layout of raw KV tiles and of Q planes (arch/wgmma_fp8_sm90.hpp).
// The warpgroup's 128 threads store 4 bytes each per step: RowBytes is a multiple of 4 and src
// 4-byte aligned. Plain stores: wgmma may read them after publish_smem_to_wgmma().
template <int Rows, int RowBytes>
__device__ __forceinline__ void store_sw128(std::uint32_t dst, const std::uint8_t* src, int tid) {
  static_assert(RowBytes % 4 == 0, "4-byte stores");
  for (int i = tid; i < Rows * RowBytes / 4; i += 128) {
    const int r = i / (RowBytes / 4), c = 4 * (i % (RowBytes / 4));
    arch::sts32(dst + std::uint32_t(c / 128 * Rows * 128) + arch::sw128_offset(r, c % 128),
                *reinterpret_cast<const std::uint32_t*>(src + r * RowBytes + c));
  }
}

// A row-major [Rows][Cols] float matrix in global memory (Q), row r divided by row_scale[r] (a
// power of two, so the division is exact; row_scale null: no scaling), stored to shared memory
// as two e4m3 planes hi = e4m3(x), lo = e4m3(x - hi) (split_e4m3x4), each in the layout of
// store_sw128 with one byte per column: chunk c of the hi plane at hi + c * Rows * 128, of the
// lo plane at lo + c * Rows * 128. 4 columns per thread and step (Cols a multiple of 4); plain
// stores, like store_sw128.
template <int Rows, int Cols>
__device__ __forceinline__ void store_q_planes_sw128(std::uint32_t hi, std::uint32_t lo,
                                                     const float* q, const float* row_scale,
                                                     int tid) {
  static_assert(Cols % 4 == 0, "4-byte stores");
  for (int i = tid; i < Rows * Cols / 4; i += 128) {
    const int r = i / (Cols / 4), c = 4 * (i % (Cols / 4));
    const float inv = row_scale != nullptr ? 1.0f / row_scale[r] : 1.0f;
    const float* src = q + r * Cols + c;
    const float x[4] = {src[0] * inv, src[1] * inv, src[2] * inv, src[3] * inv};
    std::uint32_t h, l;
    arch::split_e4m3x4(x, h, l);
    const std::uint32_t off = std::uint32_t(c / 128 * Rows * 128) + arch::sw128_offset(r, c % 128);
    arch::sts32(hi + off, h);
    arch::sts32(lo + off, l);
  }
}

// Makes the block's ordinary shared-memory stores visible to wgmma, which reads its operands
// through the async proxy: every writer fences its own stores, then the barrier orders all the
// fences before any thread's next wgmma.
__device__ __forceinline__ void publish_smem_to_wgmma() {
  arch::fence_proxy_async_smem();
  __syncthreads();
}

#endif  // MLAKIT_PLATFORM_CUDA

}  // namespace mlakit::testing
