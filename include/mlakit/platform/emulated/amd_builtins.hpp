#pragma once
// Lane-exact models of the AMD builtins the library's HIP device code uses, for the emulated
// platform. Written from AMD's documents, not from the library's layout code (arch/), so that
// a wrong lane map in arch/ gives wrong emulated results instead of agreeing with itself:
//  - MFMA operand and result layouts: AMD matrix instruction calculator (CDNA3,
//    v_mfma_f32_16x16x16_bf16 / _f16, "-d" register layouts); the same on CDNA2 and CDNA4;
//  - V_CVT_PK_F32_FP8: CDNA3 ISA reference (FP8 is E4M3 "FNUZ": bias 8, 0x80 the only NaN, no
//    infinity, no negative zero); on CDNA4 the same opcode converts OCP E4M3FN (bias 7,
//    S.1111.111 NaN, no infinity); byte pair 0-1, or 2-3 with op_sel (the builtin's `hi`);
//  - V_CVT_PKRTZ_F16_F32: two f32 to a packed f16 pair, rounded toward zero;
//  - DPP (update_dpp): the GCN/CDNA cross-lane controls on 16-lane rows: quad_perm, row_shl,
//    row_shr, row_ror, row_mirror, row_half_mirror; row and bank masks, bound_ctrl;
//  - __shfl_xor (HIP's amd_warp_functions.h): source lane self ^ mask, the caller's own value
//    when that lane lies outside its width-aligned segment; __shfl: lane src mod width of the
//    caller's segment;
//  - V_EXP_F32 (__builtin_amdgcn_exp2f): 2^x, modelled by the host's exp2f;
//  - sched_barrier: a compiler scheduling constraint, no operation.
// Every wave-level builtin exchanges the operands of the 64 lanes (emu::wave_exchange) and
// then computes the calling lane's result from them. A builtin argument outside what is
// modelled is a fault, and a builtin not defined here does not compile.
// Numerics: an MFMA result is the exact sum of C and the 16 products, rounded once to f32
// (the hardware's internal rounding order is not documented); exp2f is the host's.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "emulator.hpp"

namespace mlakit::emu {

using short4_v = short __attribute__((ext_vector_type(4)));
using half4_v = _Float16 __attribute__((ext_vector_type(4)));
using half2_v = _Float16 __attribute__((ext_vector_type(2)));
using float4_v = float __attribute__((ext_vector_type(4)));
using float2_v = float __attribute__((ext_vector_type(2)));

namespace model {

// The value decoders are inlined into their callers, so that in an uninstrumented caller
// (mfma_16x16x16) they are uninstrumented too.
#define MLAKIT_EMU_INLINE __attribute__((always_inline)) inline

MLAKIT_EMU_INLINE float f32_from_bits(std::uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
MLAKIT_EMU_INLINE std::uint32_t bits_from_f32(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// IEEE binary16 value of a bit pattern.
MLAKIT_EMU_INLINE double f16_value(std::uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 0x1F, m = h & 0x3FF;
  double v;
  if (e == 0x1F) return m ? NAN : (s ? -INFINITY : INFINITY);
  if (e == 0)
    v = std::ldexp(double(m), -24);
  else
    v = std::ldexp(double(1024 + m), e - 25);
  return s ? -v : v;
}
// bfloat16: the upper half of a binary32.
MLAKIT_EMU_INLINE double bf16_value(std::uint16_t h) {
  return f32_from_bits(std::uint32_t(h) << 16);
}

// One fp8 E4M3 byte in the target's format (the emulated target fixes it: gfx942 FNUZ,
// gfx950 OCP FN).
inline float fp8_value(std::uint8_t c) {
  const int s = c >> 7, e = (c >> 3) & 0xF, m = c & 7;
#if defined(__gfx942__)
  constexpr int kBias = 8;
  if (c == 0x80) return f32_from_bits(0x7FC00000u);  // the one NaN code
#else
  constexpr int kBias = 7;
  if (e == 0xF && m == 7) return f32_from_bits(s ? 0xFFC00000u : 0x7FC00000u);
#endif
  const double v =
      e == 0 ? std::ldexp(double(m), 1 - kBias - 3) : std::ldexp(double(8 + m), e - kBias - 3);
  return static_cast<float>(s ? -v : v);
}

// binary32 -> binary16, rounded toward zero (finite values never round to infinity).
inline std::uint16_t f16_rtz(float f) {
  const std::uint32_t b = bits_from_f32(f);
  const std::uint16_t sign = std::uint16_t((b >> 16) & 0x8000);
  const int exp = int((b >> 23) & 0xFF);
  const std::uint32_t man = b & 0x7FFFFF;
  if (exp == 0xFF) return sign | (man ? std::uint16_t(0x7E00 | (man >> 13)) : 0x7C00);
  if (exp == 0) return sign;  // binary32 subnormals are below the binary16 range
  const int e = exp - 127 + 15;
  if (e >= 0x1F) return sign | 0x7BFF;
  if (e >= 1) return sign | std::uint16_t((e << 10) | (man >> 13));
  if (e < -10) return sign;
  return sign | std::uint16_t((man | 0x800000) >> (14 - e));
}

#undef MLAKIT_EMU_INLINE

}  // namespace model

// Tags that tell wave operations apart (lanes of one wave must reach the same one).
enum : std::uint64_t {
  kTagMfmaBf16 = 1,
  kTagMfmaF16 = 2,
  kTagDpp = 3,   // | control << 8 | masks << 20
  kTagShfl = 4,     // | mask << 8 | width << 24
  kTagShflIdx = 5,  // | width << 24
};

// v_mfma_f32_16x16x16{bf16_1k,f16}: D = A B + C, 16x16x16, wave64. Register layouts
// (matrix instruction calculator, CDNA3): lane l, element e (g = l / 16, q = l % 16):
//   A[i][k]: lane i + 16 (k / 4), element k % 4
//   B[k][j]: lane j + 16 (k / 4), element k % 4
//   C, D[i][j]: lane j + 16 (i / 4), element i % 4
// Not instrumented: its loads and stores touch the lanes' operands only (never device memory,
// whose bytes the instrumented kernel code counts), and uninstrumented it costs a fraction of
// the time. Each operand is decoded once; the sums are formed in the same order as written
// above, so the result does not depend on how the operands are fetched.
template <bool Bf16>
__attribute__((no_sanitize("thread"))) inline float4_v mfma_16x16x16(const std::uint16_t (&a)[4],
                                                                     const std::uint16_t (&b)[4],
                                                                     float4_v c, int cbsz, int abid,
                                                                     int blgp) {
  if (cbsz != 0 || abid != 0 || blgp != 0)
    fault("MFMA with cbsz/abid/blgp != 0 (broadcast modes are not modelled)");
  struct Ops {
    std::uint16_t a[4], b[4];
  } mine;
  std::memcpy(mine.a, a, 8);
  std::memcpy(mine.b, b, 8);
  const unsigned char* all = wave_exchange(&mine, sizeof mine, Bf16 ? kTagMfmaBf16 : kTagMfmaF16);
  const int l = lane_in_wave();
  const int j = l % 16;
  // bv[k] = B[k][j]; av[e][k] = A[i][k] for this lane's row i = 4 (l / 16) + e. (No lambdas:
  // a lambda not inlined would be an instrumented function of its own.)
  double bv[16], av[4][16];
  for (int g = 0; g < 4; ++g) {
    Ops o;
    std::memcpy(&o, all + (j + 16 * g) * kSlotBytes, sizeof o);
    for (int r = 0; r < 4; ++r)
      bv[4 * g + r] = Bf16 ? model::bf16_value(o.b[r]) : model::f16_value(o.b[r]);
    for (int e = 0; e < 4; ++e) {
      std::memcpy(&o, all + (4 * (l / 16) + e + 16 * g) * kSlotBytes, sizeof o);
      for (int r = 0; r < 4; ++r)
        av[e][4 * g + r] = Bf16 ? model::bf16_value(o.a[r]) : model::f16_value(o.a[r]);
    }
  }
  float4_v d;
  for (int e = 0; e < 4; ++e) {
    double sum = c[e];
    for (int k = 0; k < 16; ++k) sum += av[e][k] * bv[k];
    d[e] = static_cast<float>(sum);
  }
  return d;
}

// DPP source lane for control `ctrl`, or -1 when the control reads outside the row.
inline int dpp_source(int ctrl, int l) {
  const int row_base = l & ~15, r = l & 15;
  if (ctrl >= 0x000 && ctrl <= 0x0FF) return (l & ~3) | ((ctrl >> (2 * (l & 3))) & 3);
  if (ctrl >= 0x101 && ctrl <= 0x10F) {  // row_shl:n, lane r reads r + n
    const int n = ctrl - 0x100;
    return r + n < 16 ? l + n : -1;
  }
  if (ctrl >= 0x111 && ctrl <= 0x11F) {  // row_shr:n, lane r reads r - n
    const int n = ctrl - 0x110;
    return r >= n ? l - n : -1;
  }
  if (ctrl >= 0x121 && ctrl <= 0x12F) {  // row_ror:n
    const int n = ctrl - 0x120;
    return row_base | ((r - n) & 15);
  }
  if (ctrl == 0x140) return row_base | (15 - r);       // row_mirror
  if (ctrl == 0x141) return (l & ~7) | (7 - (l & 7));  // row_half_mirror
  fault("DPP control " + std::to_string(ctrl) + " is not modelled");
}

}  // namespace mlakit::emu

// ---- the builtins, under their clang names ------------------------------------------------------

inline mlakit::emu::float4_v __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(mlakit::emu::short4_v a,
                                                                       mlakit::emu::short4_v b,
                                                                       mlakit::emu::float4_v c,
                                                                       int cbsz, int abid,
                                                                       int blgp) {
  std::uint16_t av[4], bv[4];
  for (int e = 0; e < 4; ++e) {
    av[e] = static_cast<std::uint16_t>(a[e]);
    bv[e] = static_cast<std::uint16_t>(b[e]);
  }
  return mlakit::emu::mfma_16x16x16<true>(av, bv, c, cbsz, abid, blgp);
}

inline mlakit::emu::float4_v __builtin_amdgcn_mfma_f32_16x16x16f16(mlakit::emu::half4_v a,
                                                                   mlakit::emu::half4_v b,
                                                                   mlakit::emu::float4_v c,
                                                                   int cbsz, int abid, int blgp) {
  std::uint16_t av[4], bv[4];
  std::memcpy(av, &a, 8);
  std::memcpy(bv, &b, 8);
  return mlakit::emu::mfma_16x16x16<false>(av, bv, c, cbsz, abid, blgp);
}

// v_mov_b32_dpp with an `old` value: lanes disabled by row_mask / bank_mask keep `old`; a
// lane whose source lies outside its row gets 0 with bound_ctrl, else `old`.
inline int __builtin_amdgcn_update_dpp(int old, int src, int ctrl, int row_mask, int bank_mask,
                                       bool bound_ctrl) {
  namespace emu = mlakit::emu;
  const std::uint64_t tag =
      emu::kTagDpp | (std::uint64_t(ctrl) << 8) | (std::uint64_t(row_mask & 0xF) << 20) |
      (std::uint64_t(bank_mask & 0xF) << 24) | (std::uint64_t(bound_ctrl) << 28);
  const unsigned char* all = emu::wave_exchange(&src, sizeof src, tag);
  const int l = emu::lane_in_wave();
  if (!((row_mask >> (l / 16)) & 1) || !((bank_mask >> ((l & 15) / 4)) & 1)) return old;
  const int s = emu::dpp_source(ctrl, l);
  if (s < 0) return bound_ctrl ? 0 : old;
  int v;
  std::memcpy(&v, all + s * emu::kSlotBytes, sizeof v);
  return v;
}

#if defined(__gfx942__) || defined(__gfx950__)
// v_cvt_pk_f32_fp8: bytes 0-1 (hi = false) or 2-3 (hi = true) of `word` to two f32.
inline mlakit::emu::float2_v __builtin_amdgcn_cvt_pk_f32_fp8(int word, bool hi) {
  const std::uint32_t w = static_cast<std::uint32_t>(word) >> (hi ? 16 : 0);
  mlakit::emu::float2_v r;
  r[0] = mlakit::emu::model::fp8_value(std::uint8_t(w & 0xFF));
  r[1] = mlakit::emu::model::fp8_value(std::uint8_t((w >> 8) & 0xFF));
  return r;
}
#endif

// v_cvt_pkrtz_f16_f32: (lo, hi) -> packed f16 pair, rounded toward zero.
inline mlakit::emu::half2_v __builtin_amdgcn_cvt_pkrtz(float lo, float hi) {
  const std::uint16_t h[2] = {mlakit::emu::model::f16_rtz(lo), mlakit::emu::model::f16_rtz(hi)};
  mlakit::emu::half2_v r;
  std::memcpy(&r, h, 4);
  return r;
}

// HIP's __shfl at wave size 64: lane self reads lane (src_lane mod width) of its own
// width-aligned segment (ds_bpermute).
template <class T>
inline T __shfl(T var, int src_lane, int width = 64) {
  static_assert(sizeof(T) <= mlakit::emu::kSlotBytes, "shuffle operand too large");
  namespace emu = mlakit::emu;
  if (width <= 0 || width > 64 || (width & (width - 1)) != 0)
    emu::fault("__shfl width " + std::to_string(width) + " (allowed: a power of two <= 64)");
  const unsigned char* all =
      emu::wave_exchange(&var, sizeof var, emu::kTagShflIdx | (std::uint64_t(width) << 24));
  const int self = emu::lane_in_wave();
  const int index = (src_lane & (width - 1)) + (self & ~(width - 1));
  T v;
  std::memcpy(&v, all + index * emu::kSlotBytes, sizeof v);
  return v;
}

// sched_barrier: a scheduling constraint for the compiler; no effect on results.
inline void __builtin_amdgcn_sched_barrier(int) {}

// v_exp_f32: 2^x (the hardware's result is within 1 ulp; the host's exp2f stands in).
inline float __builtin_amdgcn_exp2f(float x) { return std::exp2f(x); }

// HIP's __shfl_xor at wave size 64: lane self reads lane self ^ mask, or keeps its own value
// when that lane is outside self's width-aligned segment.
template <class T>
inline T __shfl_xor(T var, int lane_mask, int width = 64) {
  static_assert(sizeof(T) <= mlakit::emu::kSlotBytes, "shuffle operand too large");
  namespace emu = mlakit::emu;
  if (width <= 0 || width > 64 || (width & (width - 1)) != 0)
    emu::fault("__shfl_xor width " + std::to_string(width) + " (allowed: a power of two <= 64)");
  const std::uint64_t tag =
      emu::kTagShfl | (std::uint64_t(lane_mask & 0xFFFF) << 8) | (std::uint64_t(width) << 24);
  const unsigned char* all = emu::wave_exchange(&var, sizeof var, tag);
  const int self = emu::lane_in_wave();
  int index = self ^ lane_mask;
  if (index >= ((self + width) & ~(width - 1))) index = self;
  T v;
  std::memcpy(&v, all + (index & 63) * emu::kSlotBytes, sizeof v);
  return v;
}
