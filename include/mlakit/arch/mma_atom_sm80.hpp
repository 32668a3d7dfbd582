#pragma once
// NVIDIA warp matrix atom: mma.sync.m16n8k16 (bf16 or fp16 in, fp32 accumulate), operands
// read from shared memory with ldmatrix. sm_80 and newer (run on the H200).
#include <cstdint>

#include "../core/numeric.hpp"
#include "../platform/intrinsics.hpp"
#include "../platform/platform.hpp"

#if defined(MLAKIT_PLATFORM_CUDA)
#include <cuda_fp16.h>
#endif

namespace mlakit::arch {

#if defined(MLAKIT_PLATFORM_CUDA)

// Register fragments of one warp (lane l: g = l / 4, t = l % 4):
//   A 16x16: 4 x b32;  B 16x8: 2 x b32;  C 16x8: 4 x f32 with element i at
//   row g + 8 * (i / 2), column 2t + (i % 2).
template <class T>  // bf16_t or fp16_t
struct MmaAtomSm80 {
  static constexpr int kM = 16, kN = 8, kK = 16;
  static constexpr int kWarpSize = 32;
  static constexpr int kAccPerLane = 4;
  // Two C elements (i, i+1) of a lane sit on one row in adjacent columns.
  static constexpr int kAccPairStride = 2;
  // Distinct rows a lane holds in one C tile (rows g and g + 8); row_slot maps an element
  // to its slot, slot_row a slot to its row.
  static constexpr int kRowsPerLane = 2;

  struct FragA {
    std::uint32_t r[4];
  };
  struct FragB {
    std::uint32_t r[2];
  };
  using Acc = float[4];

  __device__ static int acc_row(int i, int lane) { return (lane >> 2) + 8 * (i >> 1); }
  __device__ static int acc_col(int i, int lane) { return 2 * (lane & 3) + (i & 1); }
  __device__ static int row_slot(int i) { return i >> 1; }
  __device__ static int slot_row(int slot, int lane) { return (lane >> 2) + 8 * slot; }

  // Reduces a per-row value over the lanes that hold the same row (the 4 lanes of a quad).
  __device__ static float row_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
  }
  __device__ static float row_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
  }

  // ldmatrix .x4 (.trans): four 8x8 b16 matrices whose rows lanes 8j..8j+7 address (a
  // shared-memory pointer, or a shared address for callers that add constant offsets).
  __device__ static void ldsm_x4(std::uint32_t& r0, std::uint32_t& r1, std::uint32_t& r2,
                                 std::uint32_t& r3, std::uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
  }
  __device__ static void ldsm_x4(std::uint32_t& r0, std::uint32_t& r1, std::uint32_t& r2,
                                 std::uint32_t& r3, const void* p) {
    ldsm_x4(r0, r1, r2, r3, detail::smem_u32(p));
  }
  __device__ static void ldsm_x4_trans(std::uint32_t& r0, std::uint32_t& r1, std::uint32_t& r2,
                                       std::uint32_t& r3, std::uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
  }
  __device__ static void ldsm_x4_trans(std::uint32_t& r0, std::uint32_t& r1, std::uint32_t& r2,
                                       std::uint32_t& r3, const void* p) {
    ldsm_x4_trans(r0, r1, r2, r3, detail::smem_u32(p));
  }

  // Operands live in shared-memory tiles whose element offsets come from Layout::offset(row,
  // col) (16-byte chunks may be swizzled; 8 consecutive columns starting at a multiple of 8
  // are always contiguous).

  // A: rows [row0, row0+16), cols [col0, col0+16) of a row-major tile (Q, P).
  template <class Layout>
  __device__ static void load_a(FragA& a, const T* tile, int row0, int col0, int lane) {
    const T* p = tile + Layout::offset(row0 + (lane & 15), col0 + 8 * (lane >> 4));
    ldsm_x4(a.r[0], a.r[1], a.r[2], a.r[3], p);
  }

  // B of n-tile [n0, n0+8) for k steps k0 and k0+16, from a tile stored [n][k]
  // (the K tile [token][dim] in S = Q K^T).
  template <class Layout>
  __device__ static void load_b_nk(FragB (&b)[2], const T* tile, int n0, int k0, int lane) {
    const T* p = tile + Layout::offset(n0 + (lane & 7), k0 + 8 * (lane >> 3));
    ldsm_x4(b[0].r[0], b[0].r[1], b[1].r[0], b[1].r[1], p);
  }

  // B of k step [k0, k0+16) for n-tiles n0 and n0+8, from a tile stored [k][n]
  // (the V tile [token][dim] in O += P V), transposed by ldmatrix.
  template <class Layout>
  __device__ static void load_b_kn(FragB (&b)[2], const T* tile, int k0, int n0, int lane) {
    const T* p =
        tile + Layout::offset(k0 + (lane & 7) + 8 * ((lane >> 3) & 1), n0 + 8 * (lane >> 4));
    ldsm_x4_trans(b[0].r[0], b[0].r[1], b[1].r[0], b[1].r[1], p);
  }

  // ---- e4m3fn KV read raw (one byte per element) and widened to f16 in registers. ----
  // Used with T = fp16_t only. A 16-byte chunk of raw KV holds 16 consecutive dims of one
  // token; ldmatrix (b16) moves byte pairs, and each pair is widened by one conversion.

  // Two e4m3fn bytes (low byte = first value) -> f16x2. sm_89+: the hardware converter (exact
  // for every code, NaN stays NaN). sm_80: exponent re-bias by bit moves and one f16x2
  // multiply by 2^8 (exact for every finite code; NaN codes become +-480).
  __device__ static std::uint32_t e4m3x2_to_f16x2(std::uint32_t two) {
    std::uint32_t h;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h) : "h"(static_cast<std::uint16_t>(two)));
#else
    const std::uint32_t u = __byte_perm(two, 0u, 0x1404);  // x0 << 8 | x1 << 24
    const std::uint32_t bits = (u & 0x80008000u) | ((u >> 1) & 0x3F803F80u);
    const __half2 x = __hmul2(*reinterpret_cast<const __half2*>(&bits), __float2half2_rn(256.0f));
    h = *reinterpret_cast<const std::uint32_t*>(&x);
#endif
    return h;
  }

  // Four e4m3fn bytes -> f16x2 of bytes 0, 1 (lo) and of bytes 2, 3 (hi). sm_89+: the 32-bit
  // word is split into its 16-bit halves inside one asm block, so ptxas reads the high half
  // through an operand selector instead of shifting it down first (one instruction per two
  // values instead of three per four).
  __device__ static void e4m3x4_to_f16x2x2(std::uint32_t four, std::uint32_t& lo,
                                           std::uint32_t& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    asm("{\n.reg .b16 l16, h16;\nmov.b32 {l16, h16}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l16;\n"
        "cvt.rn.f16x2.e4m3x2 %1, h16;\n}\n"
        : "=r"(lo), "=r"(hi)
        : "r"(four));
#else
    lo = e4m3x2_to_f16x2(four & 0xFFFFu);
    hi = e4m3x2_to_f16x2(four >> 16);
#endif
  }

  // K as B of S = Q K^T: n-tile [n0, n0+8) (tokens) for the four k16 steps of raw chunks
  // chunk0..chunk0+3 (64 dims). Lane (g, t) receives token n0+g, dims 4t..4t+3 of each chunk,
  // so k step j uses the dim order {4t, 4t+1 | 4t+2, 4t+3} for k = {2t, 2t+1 | 2t+8, 2t+9}:
  // A operands multiplied with these fragments must store each 16-dim block permuted the same
  // way (physical 2t+i <- dim 4t+i, 8+2t+i <- dim 4t+2+i; DecodeMainloop::load_q).
  template <class RawLayout>
  __device__ static void load_b_nk_e4m3(FragB (&b)[4], const unsigned char* tile, int n0,
                                        int chunk0, int lane) {
    const unsigned char* p = tile + RawLayout::chunk_offset(n0 + (lane & 7), chunk0 + (lane >> 3));
    std::uint32_t r[4];
    ldsm_x4(r[0], r[1], r[2], r[3], p);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      e4m3x4_to_f16x2x2(r[j], b[j].r[0], b[j].r[1]);
    }
  }

  // V as B of O += P V: k step [k0, k0+16) (tokens) for the 32 V columns of raw chunks
  // chunk0 and chunk0+1, transposed by ldmatrix at byte-pair granularity. Lane (g, t) holds
  // tokens 2t, 2t+1 (+8) of columns 2g and 2g+1; the bytes are regrouped by column, so
  // fragment 2c + e is the n-tile of columns 16 (chunk0 + c) + 2n + e, n = 0..7 (e = 0, 1).
  template <class RawLayout>
  __device__ static void load_b_kn_e4m3(FragB (&b)[4], const unsigned char* tile, int k0,
                                        int chunk0, int lane) {
    const unsigned char* p = tile + RawLayout::chunk_offset(k0 + (lane & 7) + 8 * ((lane >> 3) & 1),
                                                            chunk0 + (lane >> 4));
    std::uint32_t r[4];
    ldsm_x4_trans(r[0], r[1], r[2], r[3], p);
#pragma unroll
    for (int c = 0; c < 2; ++c) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // h: tokens +0 / +8
        // bytes (tok 2t: col 2g, 2g+1 | tok 2t+1: col 2g, 2g+1) -> (2t,2t+1 of col 2g | of 2g+1)
        const std::uint32_t w = __byte_perm(r[2 * c + h], 0u, 0x3120);
        e4m3x4_to_f16x2x2(w, b[2 * c].r[h], b[2 * c + 1].r[h]);
      }
    }
  }

  __device__ static void mma(Acc& c, const FragA& a, const FragB& b) {
    if constexpr (DTypeOf<T>::value == DType::bf16) {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
          "{%8,%9}, {%0,%1,%2,%3};\n"
          : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
          : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]), "r"(b.r[1]));
    } else {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
          "{%8,%9}, {%0,%1,%2,%3};\n"
          : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
          : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]), "r"(b.r[1]));
    }
  }
};

#endif  // MLAKIT_PLATFORM_CUDA

}  // namespace mlakit::arch
