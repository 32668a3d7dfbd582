#pragma once
// Hopper warpgroup matrix atom (sm_90a): wgmma.mma_async with f32 accumulators, both operands
// in shared memory through matrix descriptors (128-byte swizzle). Descriptor fields and the
// K-major / MN-major layouts follow the PTX ISA wgmma section (the forms used here are the
// forms run on an H200 by this library's GPU tests). Only compiled into sm_90a device code:
// elsewhere the functions are empty and the kernel takes the mma.sync mainloop.
#include <cstdint>

#include "../core/numeric.hpp"
#include "../platform/platform.hpp"

#if defined(MLAKIT_PLATFORM_CUDA) && defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MLAKIT_WGMMA_ENABLED 1
#endif

namespace mlakit::arch {

#if defined(MLAKIT_PLATFORM_CUDA)

// Swizzle mode of a shared-memory matrix descriptor (bits 62-63): 128B (rows of 128 bytes,
// tiles on 1024-byte boundaries) or 64B (rows of 64 bytes, tiles on 512-byte boundaries).
enum class WgmmaSwizzle : std::uint64_t { b128 = 1, b64 = 2 };

// Shared-memory matrix descriptor (base offset 0: the tile starts on its swizzle pattern's
// boundary). enc(x) = (x & 0x3FFFF) >> 4. LBO: the stride between 64-column chunks of an
// MN-major operand; the swizzled K-major forms ignore it.
__device__ __forceinline__ std::uint64_t wgmma_desc(std::uint32_t smem_addr, std::uint32_t lbo,
                                                    std::uint32_t sbo,
                                                    WgmmaSwizzle swizzle = WgmmaSwizzle::b128) {
  std::uint64_t d = 0;
  d |= std::uint64_t((smem_addr & 0x3FFFF) >> 4);
  d |= std::uint64_t((lbo & 0x3FFFF) >> 4) << 16;
  d |= std::uint64_t((sbo & 0x3FFFF) >> 4) << 32;
  d |= static_cast<std::uint64_t>(swizzle) << 62;
  return d;
}

// A descriptor split into its two 32-bit words, for operands addressed at constant offsets
// from one base: at(offset) adds offset >> 4 to the low word only (shared addresses stay below
// 2^18, so the 14-bit address field never carries into LBO), one integer add per wgmma instead
// of building the whole descriptor again.
struct WgmmaDescBase {
  std::uint32_t lo, hi;
  __device__ __forceinline__ static WgmmaDescBase make(std::uint32_t smem_addr, std::uint32_t lbo,
                                                       std::uint32_t sbo,
                                                       WgmmaSwizzle swizzle = WgmmaSwizzle::b128) {
    const std::uint64_t d = wgmma_desc(smem_addr, lbo, sbo, swizzle);
    return {static_cast<std::uint32_t>(d), static_cast<std::uint32_t>(d >> 32)};
  }
  __device__ __forceinline__ std::uint64_t at(std::uint32_t byte_offset) const {
    return (std::uint64_t(hi) << 32) | (lo + (byte_offset >> 4));
  }
};

// stmatrix .x4: lanes 8 i .. 8 i + 7 address the rows of matrix i in shared memory; register i
// of lane (g, t) holds elements (g, 2 t) and (g, 2 t + 1) of matrix i (an mma fragment), which
// land in row g at columns 2 t, 2 t + 1, or with kTrans (.trans) in rows 2 t and 2 t + 1 at
// column g (the transpose of the fragment).
template <bool kTrans = false>
__device__ __forceinline__ void stsm_x4(std::uint32_t addr, std::uint32_t r0, std::uint32_t r1,
                                        std::uint32_t r2, std::uint32_t r3) {
#if defined(MLAKIT_WGMMA_ENABLED)
  if constexpr (kTrans)
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};\n"
                 ::"r"(addr), "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
  else
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(addr),
                 "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
#else
  (void)addr, (void)r0, (void)r1, (void)r2, (void)r3;
#endif
}

__device__ __forceinline__ void wgmma_fence() {
#if defined(MLAKIT_WGMMA_ENABLED)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if defined(MLAKIT_WGMMA_ENABLED)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int Pending>
__device__ __forceinline__ void wgmma_wait() {
#if defined(MLAKIT_WGMMA_ENABLED)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory");
#endif
}
// Pins register values in place around wgmma issue and wait: the compiler sees an opaque
// read-modify-write of each register here, so it cannot move accumulator arithmetic across a
// wait (or an issue). Without it, a rescale of O can be hoisted above the wait that retires
// the wgmma writing O, and ptxas then serialises every wgmma of the kernel.
template <int N>
__device__ __forceinline__ void fence_operand(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_operand(std::uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// Makes this thread's ordinary shared-memory writes visible to the async proxy (wgmma
// operand reads); issued by the writers before the barrier that publishes the data.
__device__ __forceinline__ void fence_proxy_async_smem() {
#if defined(MLAKIT_WGMMA_ENABLED)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Operand lists of the shapes (accumulators "+f", then descriptors and the scale-d flag).
#define MLAKIT_WGMMA_REGS8 "{%0,%1,%2,%3,%4,%5,%6,%7}"
#define MLAKIT_WGMMA_OUT8                                                                         \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#define MLAKIT_WGMMA_REGS16 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}"
#define MLAKIT_WGMMA_OUT16                                                                        \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15])
#define MLAKIT_WGMMA_REGS32                                                                      \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%" \
  "25,%26,%27,%28,%29,%30,%31}"
#define MLAKIT_WGMMA_OUT32                                                                        \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),  \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),  \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define MLAKIT_WGMMA_REGS128                                                                       \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%"   \
  "25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%"   \
  "48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%"   \
  "71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%"   \
  "94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%" \
  "114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}"
#define MLAKIT_WGMMA_OUT128                                                                       \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),  \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),  \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),  \
      "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),  \
      "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),  \
      "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),  \
      "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),  \
      "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]),  \
      "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]),  \
      "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]),  \
      "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]),  \
      "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]),  \
      "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]),          \
      "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]),         \
      "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]),         \
      "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]),         \
      "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
// wgmma.mma_async SS: D (+)= A B with A and B through descriptors; scale-d = accumulate.
// IA, IB, IP: operand numbers of desc_a, desc_b and the flag; TA / TB: 1 = A / B MN-major.
#define MLAKIT_WGMMA_SS_T(SHAPE, TY, REGS, IA, IB, IP, TA, TB, ...)                             \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " IP                                           \
               ", 0;\n"                                                                         \
               "wgmma.mma_async.sync.aligned." SHAPE ".f32." TY "." TY " " REGS ", " IA ", " IB \
               ", p, 1, 1, " TA ", " TB ";\n}\n"                                                \
               : __VA_ARGS__                                                                    \
               : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)))
#define MLAKIT_WGMMA_SS(SHAPE, TY, REGS, IA, IB, IP, TB, ...) \
  MLAKIT_WGMMA_SS_T(SHAPE, TY, REGS, IA, IB, IP, "0", TB, __VA_ARGS__)

// wgmma.mma_async RS: D (+)= A B with A from four registers per thread (the m64k16 A
// fragment) and B through a descriptor. IA0: operand number of the first A register.
#define MLAKIT_WGMMA_RS(SHAPE, TY, REGS, IA0, IB, IP, TB, ...)                                   \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " IP                                            \
               ", 0;\n"                                                                          \
               "wgmma.mma_async.sync.aligned." SHAPE ".f32." TY "." TY " " REGS ", " IA0 ", " IB \
               ", p, 1, 1, " TB ";\n}\n"                                                         \
               : __VA_ARGS__                                                                     \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)))

template <class T>  // bf16_t or fp16_t
struct Wgmma {
  static_assert(DTypeOf<T>::value == DType::bf16 || DTypeOf<T>::value == DType::fp16,
                "wgmma operands are bf16 or f16 here");
  static constexpr bool kBf16 = DTypeOf<T>::value == DType::bf16;

  // D[64 x 32] (+)= A[64 x 16] B[16 x 32], both K-major.
  __device__ static void mma_ss_n32(float (&d)[16], std::uint64_t desc_a, std::uint64_t desc_b,
                                    bool accumulate) {
#if defined(MLAKIT_WGMMA_ENABLED)
    if constexpr (kBf16)
      MLAKIT_WGMMA_SS("m64n32k16", "bf16", MLAKIT_WGMMA_REGS16, "%16", "%17", "%18", "0",
                      MLAKIT_WGMMA_OUT16);
    else
      MLAKIT_WGMMA_SS("m64n32k16", "f16", MLAKIT_WGMMA_REGS16, "%16", "%17", "%18", "0",
                      MLAKIT_WGMMA_OUT16);
#else
    (void)d, (void)desc_a, (void)desc_b, (void)accumulate;
#endif
  }

  // The keys-as-M mainloop of 16-bit KV (decode_kt_sm90.hpp), both operands through
  // descriptors: D[64 x N] (+)= A[64 x 16] B[16 x N] for N = 16 and 32, B K-major; A K-major
  // (S^T = K Q^T) or, with TransA, MN-major (O^T = V^T P^T, V^T read from the token-major
  // tile).
  template <int N, bool TransA>
  __device__ static void mma_ss_kt(float (&d)[N / 2], std::uint64_t desc_a, std::uint64_t desc_b,
                                   bool accumulate) {
    static_assert(N == 16 || N == 32, "N = 16 or 32");
#if defined(MLAKIT_WGMMA_ENABLED)
#define MLAKIT_WGMMA_SS_KT(SHAPE, REGS, IA, IB, IP, OUT)                                      \
  if constexpr (kBf16 && TransA)                                                              \
    MLAKIT_WGMMA_SS_T(SHAPE, "bf16", REGS, IA, IB, IP, "1", "0", OUT);                        \
  else if constexpr (kBf16)                                                                   \
    MLAKIT_WGMMA_SS_T(SHAPE, "bf16", REGS, IA, IB, IP, "0", "0", OUT);                        \
  else if constexpr (TransA)                                                                  \
    MLAKIT_WGMMA_SS_T(SHAPE, "f16", REGS, IA, IB, IP, "1", "0", OUT);                         \
  else                                                                                        \
    MLAKIT_WGMMA_SS_T(SHAPE, "f16", REGS, IA, IB, IP, "0", "0", OUT);
    if constexpr (N == 16) {
      MLAKIT_WGMMA_SS_KT("m64n16k16", MLAKIT_WGMMA_REGS8, "%8", "%9", "%10", MLAKIT_WGMMA_OUT8)
    } else {
      MLAKIT_WGMMA_SS_KT("m64n32k16", MLAKIT_WGMMA_REGS16, "%16", "%17", "%18",
                         MLAKIT_WGMMA_OUT16)
    }
#undef MLAKIT_WGMMA_SS_KT
#else
    (void)d, (void)desc_a, (void)desc_b, (void)accumulate;
#endif
  }

  // D[64 x 16] (+)= A[64 x 16] B[16 x 16], A from registers (a[0..3]: rows g / g + 8 of the
  // warp's 16, columns 2t.. and 2t + 8..), B K-major through a descriptor. The keys-as-M
  // mainloop's S^T = K Q^T and O^T = V^T P^T (decode_kt_sm90.hpp).
  __device__ static void mma_rs_n16(float (&d)[8], const std::uint32_t (&a)[4],
                                    std::uint64_t desc_b, bool accumulate) {
#if defined(MLAKIT_WGMMA_ENABLED)
    if constexpr (kBf16)
      MLAKIT_WGMMA_RS("m64n16k16", "bf16", MLAKIT_WGMMA_REGS8, "{%8,%9,%10,%11}", "%12", "%13",
                      "0", MLAKIT_WGMMA_OUT8);
    else
      MLAKIT_WGMMA_RS("m64n16k16", "f16", MLAKIT_WGMMA_REGS8, "{%8,%9,%10,%11}", "%12", "%13",
                      "0", MLAKIT_WGMMA_OUT8);
#else
    (void)d, (void)a, (void)desc_b, (void)accumulate;
#endif
  }

  // D[64 x 32] (+)= A[64 x 16] B[16 x 32], A from registers as in mma_rs_n16: the keys-as-M
  // mainloop of 32-row tiles.
  __device__ static void mma_rs_n32(float (&d)[16], const std::uint32_t (&a)[4],
                                    std::uint64_t desc_b, bool accumulate) {
#if defined(MLAKIT_WGMMA_ENABLED)
    if constexpr (kBf16)
      MLAKIT_WGMMA_RS("m64n32k16", "bf16", MLAKIT_WGMMA_REGS16, "{%16,%17,%18,%19}", "%20", "%21",
                      "0", MLAKIT_WGMMA_OUT16);
    else
      MLAKIT_WGMMA_RS("m64n32k16", "f16", MLAKIT_WGMMA_REGS16, "{%16,%17,%18,%19}", "%20", "%21",
                      "0", MLAKIT_WGMMA_OUT16);
#else
    (void)d, (void)a, (void)desc_b, (void)accumulate;
#endif
  }

  // D[64 x 256] (+)= A[64 x 16] B[16 x 256], A K-major, B MN-major (transposed).
  __device__ static void mma_ss_n256_tb(float (&d)[128], std::uint64_t desc_a, std::uint64_t desc_b,
                                        bool accumulate) {
#if defined(MLAKIT_WGMMA_ENABLED)
    if constexpr (kBf16)
      MLAKIT_WGMMA_SS("m64n256k16", "bf16", MLAKIT_WGMMA_REGS128, "%128", "%129", "%130", "1",
                      MLAKIT_WGMMA_OUT128);
    else
      MLAKIT_WGMMA_SS("m64n256k16", "f16", MLAKIT_WGMMA_REGS128, "%128", "%129", "%130", "1",
                      MLAKIT_WGMMA_OUT128);
#else
    (void)d, (void)desc_a, (void)desc_b, (void)accumulate;
#endif
  }

  // D[64 x 64] (+)= A[64 x 16] B[16 x 64], both K-major.
  __device__ static void mma_ss_n64(float (&d)[32], std::uint64_t desc_a, std::uint64_t desc_b,
                                    bool accumulate) {
#if defined(MLAKIT_WGMMA_ENABLED)
    if constexpr (kBf16)
      MLAKIT_WGMMA_SS("m64n64k16", "bf16", MLAKIT_WGMMA_REGS32, "%32", "%33", "%34", "0",
                      MLAKIT_WGMMA_OUT32);
    else
      MLAKIT_WGMMA_SS("m64n64k16", "f16", MLAKIT_WGMMA_REGS32, "%32", "%33", "%34", "0",
                      MLAKIT_WGMMA_OUT32);
#else
    (void)d, (void)desc_a, (void)desc_b, (void)accumulate;
#endif
  }

  // D[64 x 64] (+)= A[64 x 16] B[16 x 64], A from registers (the fragment of mma_rs_n256_tb),
  // B K-major through a descriptor.
  __device__ static void mma_rs_n64(float (&d)[32], const std::uint32_t (&a)[4],
                                    std::uint64_t desc_b, bool accumulate) {
#if defined(MLAKIT_WGMMA_ENABLED)
    if constexpr (kBf16)
      MLAKIT_WGMMA_RS("m64n64k16", "bf16", MLAKIT_WGMMA_REGS32, "{%32,%33,%34,%35}", "%36", "%37",
                      "0", MLAKIT_WGMMA_OUT32);
    else
      MLAKIT_WGMMA_RS("m64n64k16", "f16", MLAKIT_WGMMA_REGS32, "{%32,%33,%34,%35}", "%36", "%37",
                      "0", MLAKIT_WGMMA_OUT32);
#else
    (void)d, (void)a, (void)desc_b, (void)accumulate;
#endif
  }

  // D[64 x 256] (+)= A[64 x 16] B[16 x 256], A from registers (a[0..3]: rows g / g + 8 of
  // the warp's 16, columns 2t.. and 2t + 8..), B MN-major (transposed) through a descriptor.
  __device__ static void mma_rs_n256_tb(float (&d)[128], const std::uint32_t (&a)[4],
                                        std::uint64_t desc_b, bool accumulate) {
#if defined(MLAKIT_WGMMA_ENABLED)
    if constexpr (kBf16)
      MLAKIT_WGMMA_RS("m64n256k16", "bf16", MLAKIT_WGMMA_REGS128, "{%128,%129,%130,%131}", "%132",
                      "%133", "1", MLAKIT_WGMMA_OUT128);
    else
      MLAKIT_WGMMA_RS("m64n256k16", "f16", MLAKIT_WGMMA_REGS128, "{%128,%129,%130,%131}", "%132",
                      "%133", "1", MLAKIT_WGMMA_OUT128);
#else
    (void)d, (void)a, (void)desc_b, (void)accumulate;
#endif
  }
};

// e4m3 x e4m3 -> f32, k = 32 per instruction; both operands K-major (no transpose operands
// exist for fp8). A from registers: four 32-bit registers per thread, register r holding row
// g + 8 (r & 1) of the warp's 16, columns 16 (r >> 1) + 4t + {0..3} (byte order).
#define MLAKIT_WGMMA8_SS(SHAPE, REGS, IA, IB, IP, ...)                                      \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " IP                                      \
               ", 0;\n"                                                                    \
               "wgmma.mma_async.sync.aligned." SHAPE ".f32.e4m3.e4m3 " REGS ", " IA ", " IB \
               ", p, 1, 1;\n}\n"                                                           \
               : __VA_ARGS__                                                               \
               : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)))
#define MLAKIT_WGMMA8_RS(SHAPE, REGS, IA0, IB, IP, ...)                                      \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " IP                                       \
               ", 0;\n"                                                                     \
               "wgmma.mma_async.sync.aligned." SHAPE ".f32.e4m3.e4m3 " REGS ", " IA0 ", " IB \
               ", p, 1, 1;\n}\n"                                                            \
               : __VA_ARGS__                                                                \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)))

struct WgmmaE4m3 {
  // D[64 x 64] (+)= A[64 x 32] B[32 x 64].
  __device__ static void mma_ss_n64(float (&d)[32], std::uint64_t desc_a, std::uint64_t desc_b,
                                    bool accumulate) {
#if defined(MLAKIT_WGMMA_ENABLED)
    MLAKIT_WGMMA8_SS("m64n64k32", MLAKIT_WGMMA_REGS32, "%32", "%33", "%34", MLAKIT_WGMMA_OUT32);
#else
    (void)d, (void)desc_a, (void)desc_b, (void)accumulate;
#endif
  }
  __device__ static void mma_rs_n64(float (&d)[32], const std::uint32_t (&a)[4],
                                    std::uint64_t desc_b, bool accumulate) {
#if defined(MLAKIT_WGMMA_ENABLED)
    MLAKIT_WGMMA8_RS("m64n64k32", MLAKIT_WGMMA_REGS32, "{%32,%33,%34,%35}", "%36", "%37",
                     MLAKIT_WGMMA_OUT32);
#else
    (void)d, (void)a, (void)desc_b, (void)accumulate;
#endif
  }
  // D[64 x 256] (+)= A[64 x 32] B[32 x 256].
  __device__ static void mma_ss_n256(float (&d)[128], std::uint64_t desc_a, std::uint64_t desc_b,
                                     bool accumulate) {
#if defined(MLAKIT_WGMMA_ENABLED)
    MLAKIT_WGMMA8_SS("m64n256k32", MLAKIT_WGMMA_REGS128, "%128", "%129", "%130",
                     MLAKIT_WGMMA_OUT128);
#else
    (void)d, (void)desc_a, (void)desc_b, (void)accumulate;
#endif
  }
  __device__ static void mma_rs_n256(float (&d)[128], const std::uint32_t (&a)[4],
                                     std::uint64_t desc_b, bool accumulate) {
#if defined(MLAKIT_WGMMA_ENABLED)
    MLAKIT_WGMMA8_RS("m64n256k32", MLAKIT_WGMMA_REGS128, "{%128,%129,%130,%131}", "%132", "%133",
                     MLAKIT_WGMMA_OUT128);
#else
    (void)d, (void)a, (void)desc_b, (void)accumulate;
#endif
  }
};

#undef MLAKIT_WGMMA8_SS
#undef MLAKIT_WGMMA8_RS
#undef MLAKIT_WGMMA_RS
#undef MLAKIT_WGMMA_OUT32
#undef MLAKIT_WGMMA_REGS32
#undef MLAKIT_WGMMA_SS
#undef MLAKIT_WGMMA_OUT128
#undef MLAKIT_WGMMA_REGS128
#undef MLAKIT_WGMMA_OUT16
#undef MLAKIT_WGMMA_REGS16

#endif  // MLAKIT_PLATFORM_CUDA

}  // namespace mlakit::arch
