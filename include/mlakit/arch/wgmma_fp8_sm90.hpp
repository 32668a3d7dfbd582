#pragma once
// e4m3 operands for the Hopper warpgroup atom (sm_90a): the pieces an fp8 mainloop needs
// around `WgmmaE4m3` (wgmma_sm90.hpp), where both operands must be K-major (fp8 wgmma has no
// transposed form) and one-byte values carry 4 significant bits.
//
//   - Two-plane operands. A 16-bit operand x (Q, or P scaled by 256) is fed as two e4m3
//     planes hi = e4m3(x), lo = e4m3(x - hi): hi + lo keeps about 8 significant bits (bf16's
//     precision) as long as x is scaled into e4m3's normal range (|x| up to 448, normal from
//     2^-6); each k-step then runs two fp8 wgmma, the time of one 16-bit wgmma.
//   - Key order of P. The accumulator of S holds, per thread, keys 8j + 2t + {0, 1}; an e4m3
//     A fragment holds K-indices 4t + {0..3} (+16). Instead of shuffling P between lanes, the
//     K index kappa of the P V product is a permutation of the keys (key_of_kappa, within
//     each 16-key block): P's fragment is packed from the thread's own accumulators
//     (pack_p_e4m3) and V^T is written in the same order (transpose_v_e4m3).
//   - V^T. O += P V needs V with the keys contiguous (K-major B), while a KV tile arrives
//     token by token: V^T rows are dims, 64 kappa bytes each, with the 64-byte swizzle.
//
// Accuracy limit: fp8 wgmma adds its products into the f32 accumulator through a truncated
// sum (aligned to the largest term; on the H200 its error is that of about 14 significant
// bits kept, test/accuracy/fp8_wgmma_sum.cu), so a long chain of accumulating wgmma (S over
// 576 columns, O over a whole context) loses precision that 16-bit wgmma keeps; a mainloop
// must promote partial sums to f32 registers every few k-steps (docs/design.md). No decode
// kernel uses these pieces yet; test/gpu_wgmma_fp8.cu and test/gpu_wgmma_fp8_kt.cu (the
// keys-as-M orientation, at the end of this file) check them.
//
// Layouts (tiles 1024-byte aligned for the 128-byte swizzle, 512-byte for the 64-byte one):
//   raw KV / Q planes: chunks of 128 columns, [rows][128 B], 16-byte unit u of row r at
//     u ^ (r & 7) (descriptor: swizzle 128B, SBO 1024; k32 step +32 B; chunk stride rows*128)
//   V^T and P planes: [rows][64 B], unit u of row r at u ^ ((r >> 1) & 3) (swizzle 64B,
//     SBO 512; k32 step +32 B)
// Only sm_90a device code emits the instructions; the host-side key order is usable anywhere.
#include <cstdint>

#include "../platform/platform.hpp"
#include "mma_atom.hpp"
#include "pipeline_sm90.hpp"
#include "wgmma_sm90.hpp"

namespace mlakit::arch {

// The key (within a tile) at K index kappa of the e4m3 P V product: kappa = 16 c + 4 t + b
// holds key 16 c + 2 t + b (b < 2) or 16 c + 8 + 2 t + (b - 2).
MLAKIT_HOST_DEVICE constexpr int key_of_kappa(int kappa) {
  const int blk = kappa & ~15, t = (kappa & 15) >> 2, b = kappa & 3;
  return blk + (b < 2 ? 2 * t + b : 8 + 2 * t + b - 2);
}

// The same for the keys-as-M orientation (S^T = K Q^T, O^T = V^T P^T: keys are the M of S^T
// and the K of O^T): kappa = 16 c' + 2 c + h holds key 16 c' + c + 8 h. A thread of an S^T
// accumulator holds keys g and g + 8 of its warp's 16, which are then one 16-bit pair of P^T.
MLAKIT_HOST_DEVICE constexpr int key_of_kappa_kt(int kappa) {
  const int blk = kappa & ~15, c = (kappa & 15) >> 1, h = kappa & 1;
  return blk + c + 8 * h;
}

// Byte offset of (row, column byte) in a [rows][128 B] chunk with the 128-byte swizzle and in a
// [rows][64 B] tile with the 64-byte swizzle.
MLAKIT_HOST_DEVICE constexpr std::uint32_t sw128_offset(int row, int col) {
  return std::uint32_t(row * 128 + ((((col >> 4) ^ (row & 7))) << 4) + (col & 15));
}
MLAKIT_HOST_DEVICE constexpr std::uint32_t sw64_offset(int row, int col) {
  return std::uint32_t(row * 64 + ((((col >> 4) ^ ((row >> 1) & 3))) << 4) + (col & 15));
}

#if defined(MLAKIT_PLATFORM_CUDA)

// The descriptor of k-step ks >= 0 (columns 32 ks .. 32 ks + 31) of a K-major e4m3 operand of
// 64 rows stored at shared address base (1024-byte aligned) as 128-column chunks with the
// 128-byte swizzle (sw128_offset, chunk stride 64 x 128 B = 8 KB): chunk ks / 4, plus the
// layout's k32 step of 32 bytes per k-step within it.
__device__ __forceinline__ std::uint64_t sw128_kstep_desc_e4m3(std::uint32_t base, int ks) {
  return wgmma_desc(base + std::uint32_t(ks >> 2) * 8192 + 32 * std::uint32_t(ks & 3), 16, 1024);
}

// Four floats -> four e4m3fn bytes (round to nearest even, saturating to +-448), x0 in the
// lowest byte.
__device__ __forceinline__ std::uint32_t f32x4_to_e4m3x4(float x0, float x1, float x2, float x3) {
#if defined(MLAKIT_WGMMA_ENABLED)
  std::uint16_t lo, hi;
  // cvt packs its first source into the upper byte.
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(lo) : "f"(x1), "f"(x0));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(hi) : "f"(x3), "f"(x2));
  return std::uint32_t(lo) | (std::uint32_t(hi) << 16);
#else
  (void)x0, (void)x1, (void)x2, (void)x3;
  return 0;
#endif
}

// Four e4m3fn bytes -> floats (exact), byte 0 first.
__device__ __forceinline__ void e4m3x4_to_f32x4(std::uint32_t w, float (&x)[4]) {
#if defined(MLAKIT_WGMMA_ENABLED)
  std::uint32_t h01, h23;
  MmaAtom<fp16_t>::e4m3x4_to_f16x2x2(w, h01, h23);
  const std::uint16_t h[4] = {static_cast<std::uint16_t>(h01), static_cast<std::uint16_t>(h01 >> 16),
                              static_cast<std::uint16_t>(h23), static_cast<std::uint16_t>(h23 >> 16)};
#pragma unroll
  for (int k = 0; k < 4; ++k) asm("cvt.f32.f16 %0, %1;\n" : "=f"(x[k]) : "h"(h[k]));
#else
  (void)w;
  x[0] = x[1] = x[2] = x[3] = 0.0f;
#endif
}

// x ~ hi + lo, four values per word (byte k of both words is x[k]).
__device__ __forceinline__ void split_e4m3x4(const float (&x)[4], std::uint32_t& hi,
                                             std::uint32_t& lo) {
  hi = f32x4_to_e4m3x4(x[0], x[1], x[2], x[3]);
  float h[4];
  e4m3x4_to_f32x4(hi, h);
  lo = f32x4_to_e4m3x4(x[0] - h[0], x[1] - h[1], x[2] - h[2], x[3] - h[3]);
}

// P (an S accumulator of wgmma m64n64: s[i] is row g + 8 ((i >> 1) & 1) of the warp's 16,
// key 8 (i >> 2) + 2t + (i & 1)) times `scale` -> the two-plane A fragments of the e4m3 P V
// product in kappa order: hi[4 j + r] / lo[4 j + r] is register r of k-step j (keys 32 j ..
// 32 j + 31). Register r holds row g + 8 (r & 1), kappa 32 j + 16 (r >> 1) + 4t + {0..3} =
// accumulators i0, i0 + 1, i0 + 4, i0 + 5 with i0 = 16 j + 8 (r >> 1) + 2 (r & 1).
__device__ __forceinline__ void pack_p_e4m3(const float (&s)[32], float scale,
                                            std::uint32_t (&hi)[8], std::uint32_t (&lo)[8]) {
#pragma unroll
  for (int j = 0; j < 2; ++j) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int i0 = 16 * j + 8 * (r >> 1) + 2 * (r & 1);
      const float x[4] = {s[i0] * scale, s[i0 + 1] * scale, s[i0 + 4] * scale,
                          s[i0 + 5] * scale};
      split_e4m3x4(x, hi[4 * j + r], lo[4 * j + r]);
    }
  }
}

// The same fragments into a K-major [64 rows][64 kappa bytes] tile with the 64-byte swizzle at
// shared address dst (this thread's rows 16 wi + g (+8)), the A operand of the other
// warpgroup's P V.
__device__ __forceinline__ void store_p_e4m3(const std::uint32_t (&a)[8], std::uint32_t dst,
                                             int wi, int g, int t) {
#pragma unroll
  for (int j = 0; j < 2; ++j) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int row = 16 * wi + g + 8 * (r & 1);
      const int kappa = 32 * j + 16 * (r >> 1) + 4 * t;
      sts32(dst + sw64_offset(row, kappa), a[4 * j + r]);
    }
  }
}

// V^T of dims [0, dims) (a multiple of 32) of a raw 64-token tile: src holds the tile's bytes
// as 128-column chunks (sw128_offset, chunk stride 8 KB), dst gets rows = dims, 64 kappa bytes
// each (sw64_offset), kappa order key_of_kappa. Warp `warp` of `nwarps` (lane = lane_id());
// each step is one transposing ldmatrix.x4 of 16 tokens x 32 dims read as 16-bit pairs: a lane
// receives the 2 x 2 byte blocks (tokens 2t, 2t+1 | dims 2c, 2c+1) of tokens 0-7 and 8-15,
// and one byte permute of the two gives dim 2c (or 2c+1) of tokens 2t, 2t+1, 8+2t, 9+2t,
// which is kappa 4t..4t+3: the kappa order is the order ldmatrix delivers. The caller fences
// the async proxy and synchronises before a wgmma reads dst. One transposing load per 16 x 32
// block instead of 4-byte loads, permutes and stores per thread: about half the cycles
// (docs/performance.md, "Constants").
__device__ __forceinline__ void transpose_v_e4m3(std::uint32_t src, std::uint32_t dst, int dims,
                                                 int warp, int nwarps, int lane) {
#if defined(MLAKIT_WGMMA_ENABLED)
  const int mi = lane / 8, r = lane % 8, c = lane / 4, t = lane % 4;
  const int items = 4 * (dims / 32);  // (16-token block, 32-dim block)
#pragma unroll 4
  for (int it = warp; it < items; it += nwarps) {
    const int tb = it % 4, dblk = it / 4;
    // Matrix mi: tokens 16 tb + 8 (mi & 1) .. + 7, dims 32 dblk + 16 (mi >> 1) .. + 15.
    const int tok = 16 * tb + 8 * (mi & 1) + r, d = 32 * dblk + 16 * (mi >> 1);
    std::uint32_t m[4];
    MmaAtom<fp16_t>::ldsm_x4_trans(m[0], m[1], m[2], m[3],
                                   src + (d >> 7) * 8192 + sw128_offset(tok, d & 127));
    const int kappa0 = 16 * tb + 4 * t;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = 32 * dblk + 16 * h + 2 * c;
      sts32(dst + sw64_offset(row, kappa0), __byte_perm(m[2 * h], m[2 * h + 1], 0x6420));
      sts32(dst + sw64_offset(row + 1, kappa0), __byte_perm(m[2 * h], m[2 * h + 1], 0x7531));
    }
  }
#else
  (void)src, (void)dst, (void)dims, (void)warp, (void)nwarps, (void)lane;
#endif
}

// ---- keys-as-M orientation -------------------------------------------------------------------
// S^T [64 keys x N rows] = K Q^T reads both operands from shared memory as they are (A = the
// raw tile's 128-column chunks, B = a Q plane, both K-major with the 128-byte swizzle). O^T
// [dims x N rows] = V^T P^T takes V^T from registers, built from the raw tile by transposing
// loads (load_vt_e4m3_kt), and P^T from shared memory, stored from the S^T accumulator
// (store_pt_e4m3_kt); both in the kappa order of key_of_kappa_kt. Nothing is widened and no
// transposed copy of V is written: each 16 x 32 block of V^T costs one ldmatrix and four byte
// permutes per thread.

// The A fragment of O^T = V^T P^T (wgmma m64nNk32, e4m3) for k-step j (keys 32 j .. 32 j + 31
// of the tile) and this warp's 16 M rows, dims d .. d + 15 (d a multiple of 16) of a raw tile
// at shared address src (128-column chunks, sw128_offset, chunk stride 8 KB). M row g is dim
// d + 2 g and M row g + 8 is dim d + 2 g + 1 (the accumulator's rows g, g + 8 are then two
// adjacent dims). One transposing ldmatrix.x4 reads 16-bit pairs (two dims of one token):
// matrix i holds tokens 32 j + 16 (i >> 1) + (i & 1) + {0, 8, 2, 10, 4, 12, 6, 14}, so lane
// (g, t) receives dims 2g, 2g + 1 of tokens 2t, 2t + 8 (matrix 0) and 2t + 1, 2t + 9 (matrix
// 1); one byte permute per register gives one dim of the four keys of kappa 4t .. 4t + 3.
__device__ __forceinline__ void load_vt_e4m3_kt(std::uint32_t src, int d, int j, int lane,
                                                std::uint32_t (&a)[4]) {
#if defined(MLAKIT_WGMMA_ENABLED)
  const int i = lane >> 3, r = lane & 7;
  const int tok = 32 * j + 16 * (i >> 1) + (i & 1) + (r & 6) + 8 * (r & 1);
  std::uint32_t m[4];
  MmaAtom<fp16_t>::ldsm_x4_trans(m[0], m[1], m[2], m[3],
                                 src + (d >> 7) * 8192 + sw128_offset(tok, d & 127));
  a[0] = __byte_perm(m[0], m[1], 0x6420);  // dim d + 2g, keys 2t, 2t + 8, 2t + 1, 2t + 9
  a[1] = __byte_perm(m[0], m[1], 0x7531);  // dim d + 2g + 1
  a[2] = __byte_perm(m[2], m[3], 0x6420);  // the same for keys + 16
  a[3] = __byte_perm(m[2], m[3], 0x7531);
#else
  (void)src, (void)d, (void)j, (void)lane;
  a[0] = a[1] = a[2] = a[3] = 0;
#endif
}

// P^T, the B operand of O^T = V^T P^T, from an S^T accumulator of wgmma m64n64 (s[i]: key
// 16 wi + g + 8 ((i >> 1) & 1), row 8 (i >> 2) + 2t + (i & 1)) times `scale`, as one e4m3
// plane: a K-major [64 rows][64 kappa bytes] tile with the 64-byte swizzle at shared address
// dst (sw64_offset). Keys g and g + 8 of a row are kappa 16 wi + 2g, + 1: one 16-bit pair, so
// two transposing stmatrix.x4 store the warp's 16 keys of all 64 rows (matrix n: rows 8n ..
// 8n + 7, the 16 bytes of block wi). The caller fences the async proxy and synchronises before
// a wgmma reads dst.
__device__ __forceinline__ void store_pt_e4m3_kt(const float (&s)[32], float scale,
                                                 std::uint32_t dst, int wi, int lane) {
#if defined(MLAKIT_WGMMA_ENABLED)
  std::uint32_t r[8];
#pragma unroll
  for (int n = 0; n < 8; ++n)  // low half: row 8n + 2t, high half: row 8n + 2t + 1
    r[n] = f32x4_to_e4m3x4(s[4 * n] * scale, s[4 * n + 2] * scale, s[4 * n + 1] * scale,
                           s[4 * n + 3] * scale);
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const int row = 8 * (4 * c + (lane >> 3)) + (lane & 7);
    stsm_x4<true>(dst + sw64_offset(row, 16 * wi), r[4 * c], r[4 * c + 1], r[4 * c + 2],
                  r[4 * c + 3]);
  }
#else
  (void)s, (void)scale, (void)dst, (void)wi, (void)lane;
#endif
}

#endif  // MLAKIT_PLATFORM_CUDA

}  // namespace mlakit::arch
