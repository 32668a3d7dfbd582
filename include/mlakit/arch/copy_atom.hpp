#pragma once
// 16-byte global -> shared copies. NVIDIA: cp.async with zero fill, completed in groups
// (sm_80+). AMD: a plain 16-byte load and LDS store, complete on return (clang 15 has no
// asynchronous global->LDS copy of 16 bytes; docs/design.md, "Kernels and schedules").
#include <cstdint>

#include "../platform/intrinsics.hpp"
#include "../platform/platform.hpp"

namespace mlakit::arch {

#if defined(MLAKIT_PLATFORM_CUDA)

struct CopyAtomCpAsync {
  static constexpr bool kAsync = true;
  // Copies 16 bytes from `src` to `dst`, or writes 16 zero bytes (reading nothing) when
  // !valid, so that tokens past a request's end never touch memory.
  __device__ static void copy16(void* dst, const void* src, bool valid) {
    copy16(detail::smem_u32(dst), src, valid ? 16u : 0u);
  }
  // The same at a shared-memory address (callers add constant offsets to one base):
  // `src_bytes` 16 copies, 0 writes zeros and reads nothing.
  __device__ static void copy16(std::uint32_t dst, const void* src, std::uint32_t src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes));
  }
  // The same, with the lines marked evict-first in L2: for KV tiles, which stream through L2
  // (read by the CTAs of one piece's row tiles and by nothing later), so that they do not
  // displace the Q rows, page tables and partial results that other CTAs read again. Every
  // KV copy into shared memory uses it (here or through copy16_stream); Q copies do not.
  // `dst` must be held in a vector register (see `per_thread`): where ptxas 13.0 folds a
  // uniform shared-memory base into a hinted copy (`[R+UR+imm]`), it names a misaligned
  // uniform-register pair as the copy's cache-policy descriptor, and the kernel stops with an
  // illegal-instruction error on sm_90 (tools/check-wgmma.sh fails on that form anywhere in
  // decode()'s table).
  __device__ static void copy16_evict_first(std::uint32_t dst, const void* src,
                                            std::uint32_t src_bytes) {
    std::uint64_t policy;
    // Not volatile, so that the compiler may compute one policy for many copies.
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst),
                 "l"(src), "r"(src_bytes), "l"(policy));
  }
  // A warp-uniform shared-memory address as a value ptxas keeps in a vector register (it
  // does not treat a shuffle's result as uniform), so that the hinted copies built on it take
  // the `[R+imm]` form. All 32 lanes of the warp must call it with the same value.
  __device__ static std::uint32_t per_thread(std::uint32_t uniform_addr) {
    return __shfl_sync(0xffffffffu, uniform_addr, 0);
  }
  // A KV stage for copy16_stream, formed once per stage by all 32 lanes of each warp (see
  // per_thread), and a copy of 16 bytes to `offset` bytes into it, evict-first in L2 (zeros
  // and no read when !valid). The kernels written for both platforms copy KV through these.
  using StreamBase = std::uint32_t;
  __device__ static StreamBase stream_base(void* stage) {
    return per_thread(detail::smem_u32(stage));
  }
  __device__ static void copy16_stream(StreamBase base, int offset, const void* src, bool valid) {
    copy16_evict_first(base + static_cast<std::uint32_t>(offset), src, valid ? 16u : 0u);
  }
  __device__ static void commit() { asm volatile("cp.async.commit_group;\n" ::); }
  template <int Pending>
  __device__ static void wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending));
  }
};

using DefaultCopyAtom = CopyAtomCpAsync;

#elif defined(MLAKIT_PLATFORM_HIP)

struct CopyAtomSync {
  static constexpr bool kAsync = false;
  __device__ static void copy16(void* dst, const void* src, bool valid) {
    uint4 v = valid ? *static_cast<const uint4*>(src) : uint4{0, 0, 0, 0};
    *static_cast<uint4*>(dst) = v;
  }
  // No cache hint: the plain copy at a byte offset into the stage.
  using StreamBase = unsigned char*;
  __device__ static StreamBase stream_base(void* stage) {
    return static_cast<unsigned char*>(stage);
  }
  __device__ static void copy16_stream(StreamBase base, int offset, const void* src, bool valid) {
    copy16(base + offset, src, valid);
  }
  __device__ static void commit() {}
  template <int Pending>
  __device__ static void wait() {}
};

using DefaultCopyAtom = CopyAtomSync;

#endif

}  // namespace mlakit::arch
