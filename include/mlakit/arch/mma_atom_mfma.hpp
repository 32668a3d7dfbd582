#pragma once
// AMD wave matrix atom: v_mfma_f32_16x16x16{bf16_1k,f16} (bf16 or fp16 in, fp32 accumulate),
// wave64, operands read from shared memory (LDS) with plain loads. gfx90a and gfx94x
// (the 16x16x16 mai-insts builtins also exist on gfx950). Same interface as MmaAtomSm80, so
// the mainloop compiles against either.
#include <cstdint>
#include <type_traits>

#include "../core/numeric.hpp"
#include "../platform/platform.hpp"

namespace mlakit::arch {

#if defined(MLAKIT_PLATFORM_HIP)

// Register fragments of one wave for the 16x16x16 MFMA (lane l: g = l / 16 is the lane group,
// q = l % 16):
//   A 16x16 [i][k]: 4 x 16-bit per lane, A[q][4g + e] in element e   (2 VGPRs)
//   B 16x16 [k][j]: 4 x 16-bit per lane, B[4g + e][q] in element e   (2 VGPRs)
//   C 16x16 [i][j]: 4 x f32 per lane, element e at row 4g + e, column q.
// 16-bit values pack low half first: element 2w is the low half of r[w], 2w + 1 the high.
// Unlike mma.sync, a lane's 4 C elements lie in 4 different rows of one column.
template <class T>  // bf16_t or fp16_t
struct MmaAtomMfma16 {
  static_assert(DTypeOf<T>::value == DType::bf16 || DTypeOf<T>::value == DType::fp16,
                "MmaAtomMfma16: T must be bf16_t or fp16_t");

  static constexpr int kM = 16, kN = 16, kK = 16;
  static constexpr int kWarpSize = 64;
  static constexpr int kAccPerLane = 4;
  // Number of consecutive C elements of a lane that share one row (2 on mma.sync): here 1,
  // every element is its own row.
  static constexpr int kAccPairStride = 1;
  // Distinct rows a lane holds in one C tile; row_slot maps an element to its slot.
  static constexpr int kRowsPerLane = 4;

  struct FragA {
    std::uint32_t r[2];
  };
  struct FragB {
    std::uint32_t r[2];
  };
  using Acc = float[4];

  __device__ static int acc_row(int i, int lane) { return 4 * (lane >> 4) + i; }
  __device__ static int acc_col(int /*i*/, int lane) { return lane & 15; }
  __device__ static int row_slot(int i) { return i; }
  __device__ static int slot_row(int slot, int lane) { return 4 * (lane >> 4) + slot; }

  // Reduces a per-row value over the lanes that hold the same row slot: the 16 lanes of a
  // lane group, which is exactly one DPP row. Four DPP moves, no LDS traffic (ds_bpermute,
  // what __shfl_xor compiles to, would cost an LDS round trip each):
  //   quad_perm[1,0,3,2] (xor 1), quad_perm[2,3,0,1] (xor 2): each quad holds its total;
  //   row_half_mirror (lane i <- 7 - i within 8): pairs quad 0 with quad 1;
  //   row_mirror (lane i <- 15 - i within 16): pairs half 0 with half 1.
  // Every step combines a lane with a partner holding the mirrored partial, so all 16 lanes
  // end with the bitwise-same result (the sum is commutative at each step).
  __device__ static float row_max(float v) {
    v = fmaxf(v, dpp<0xB1>(v));
    v = fmaxf(v, dpp<0x4E>(v));
    v = fmaxf(v, dpp<0x141>(v));
    return fmaxf(v, dpp<0x140>(v));
  }
  __device__ static float row_sum(float v) {
    v += dpp<0xB1>(v);
    v += dpp<0x4E>(v);
    v += dpp<0x141>(v);
    return v + dpp<0x140>(v);
  }

  // Operands live in shared-memory tiles whose element offsets come from Layout::offset(row,
  // col) (16-byte chunks may be swizzled; 8 consecutive columns starting at a multiple of 8
  // are always contiguous). col0 / k0 are multiples of 16, so a lane's 4 consecutive k values
  // (4g .. 4g+3) sit inside one chunk: one 8-byte ds_read_b64.

  // A: rows [row0, row0+16), cols [col0, col0+16) of a row-major tile (Q, P).
  template <class Layout>
  __device__ static void load_a(FragA& a, const T* tile, int row0, int col0, int lane) {
    load_4k(a.r, tile + Layout::offset(row0 + (lane & 15), col0 + 4 * (lane >> 4)));
  }

  // B of n-tile [n0, n0+16) for k steps k0 and k0+16, from a tile stored [n][k]
  // (the K tile [token][dim] in S = Q K^T): lane (g, q) reads tile(n0 + q, k + 4g .. +3).
  template <class Layout>
  __device__ static void load_b_nk(FragB (&b)[2], const T* tile, int n0, int k0, int lane) {
    const int n = n0 + (lane & 15), k = k0 + 4 * (lane >> 4);
    load_4k(b[0].r, tile + Layout::offset(n, k));
    load_4k(b[1].r, tile + Layout::offset(n, k + kK));
  }

  // B of k step [k0, k0+16) for n-tiles n0 and n0+16, from a tile stored [k][n]
  // (the V tile [token][dim] in O += P V). The lane's 4 k values are 4 rows of one column,
  // so it gathers them with 4 scalar 16-bit LDS reads (ds_read_u16). Correct, not fast.
  // Faster paths: gfx950's transposing ds_read_b64_tr_b16; or storing V as [dim][token] in
  // LDS at copy time (then this is one 8-byte read, like load_b_nk); and computing
  // S^T = K Q^T instead (the A/B/C layouts above), whose accumulator already is the B layout,
  // so P^T feeds O^T = V^T P^T from registers with no LDS round trip for P.
  //
  // Addresses: with a row-XOR swizzle of 8-chunk groups (Layout::kMask == 7, rows of a
  // multiple of 64 columns), offset(r, c) = offset(r0, c0) + offset(r - r0, c - c0) whenever
  // r0 is a multiple of 8 and c0 of 64. The lane-dependent part then takes only 16 values
  // (4 rows x 2 column halves x 2 n-tiles) and the rest is a per-call constant that becomes
  // the LDS instruction's immediate offset. Written naively, the compiler kept one address
  // register per read (116 VGPRs for the 128 reads of a 32-token tile on gfx942).
  template <class Layout>
  __device__ static void load_b_kn(FragB (&b)[2], const T* tile, int k0, int n0, int lane) {
    const int g = lane >> 4, q = lane & 15;
    if constexpr (kSplitSwizzle<Layout>) {
      // k0 is a multiple of 16, so 4g + e splits into 8 (g >> 1) + (4 (g & 1) + e); n0 is a
      // multiple of 32 (the caller loads n-tiles in pairs), so it splits into n0 & ~63 and
      // 32 h. The second part of each pair goes to the lane offset, which then takes 16
      // values over e, t and h; the first parts are uniform (and constant after unrolling,
      // up to the warp's column base), so they fold into the LDS immediate offset.
      const T* base = tile + Layout::offset(k0 + 8 * (g >> 1), n0 & ~63);
      const int c = 32 * ((n0 >> 5) & 1) + q;
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        std::uint32_t h[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) h[e] = base[Layout::offset(4 * (g & 1) + e, c + t * kN)].bits;
        b[t].r[0] = h[0] | (h[1] << 16);
        b[t].r[1] = h[2] | (h[3] << 16);
      }
    } else {
      const int k = k0 + 4 * g, n = n0 + q;
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        std::uint32_t h[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) h[e] = tile[Layout::offset(k + e, n + t * kN)].bits;
        b[t].r[0] = h[0] | (h[1] << 16);
        b[t].r[1] = h[2] | (h[3] << 16);
      }
    }
  }

  // C += A B. cbsz / abid / blgp = 0: no broadcast, plain GEMM.
  __device__ static void mma(Acc& c, const FragA& a, const FragB& b) {
    float4_t acc = {c[0], c[1], c[2], c[3]};
    if constexpr (DTypeOf<T>::value == DType::bf16) {
      acc = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(
          __builtin_bit_cast(short4_t, a.r), __builtin_bit_cast(short4_t, b.r), acc, 0, 0, 0);
    } else {
      acc = __builtin_amdgcn_mfma_f32_16x16x16f16(__builtin_bit_cast(half4_t, a.r),
                                                  __builtin_bit_cast(half4_t, b.r), acc, 0, 0, 0);
    }
    c[0] = acc[0];
    c[1] = acc[1];
    c[2] = acc[2];
    c[3] = acc[3];
  }

 private:
  // True for layouts whose offsets split as described above load_b_kn (SwizzledRows with
  // full 8-chunk swizzle groups).
  template <class Layout, class = void>
  static constexpr bool kSplitSwizzleImpl = false;
  template <class Layout>
  static constexpr bool
      kSplitSwizzleImpl<Layout, std::void_t<decltype(Layout::kMask), decltype(Layout::kCols)>> =
          Layout::kMask == 7 && Layout::kCols % 64 == 0;
  template <class Layout>
  static constexpr bool kSplitSwizzle = kSplitSwizzleImpl<Layout>;

  // Builtin operand types (clang BuiltinsAMDGPU.def: V4s, V4h, V4f).
  using short4_t = short __attribute__((ext_vector_type(4)));
  using half4_t = _Float16 __attribute__((ext_vector_type(4)));
  using float4_t = float __attribute__((ext_vector_type(4)));

  // One 8-byte read of 4 consecutive 16-bit values (8-byte aligned: the chunk is 16-byte
  // aligned and the lane's offset inside it is 0 or 8 bytes).
  __device__ static void load_4k(std::uint32_t (&r)[2], const T* p) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    r[0] = v.x;
    r[1] = v.y;
  }

  // v from the lane chosen by DPP control Ctrl within its 16-lane row (all rows and banks
  // enabled; every control used here reads an in-row lane, so bound_ctrl never applies).
  template <int Ctrl>
  __device__ static float dpp(float v) {
    return __builtin_bit_cast(
        float, __builtin_amdgcn_update_dpp(0, __builtin_bit_cast(int, v), Ctrl, 0xF, 0xF, false));
  }
};

#endif  // MLAKIT_PLATFORM_HIP

}  // namespace mlakit::arch
