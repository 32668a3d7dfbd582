// Per-atom GPU tests of the AMD building blocks, so that a first run on an MI300X (gfx942) or
// MI355X (gfx950) names the broken piece instead of a wrong attention output:
//  - the MFMA atom (arch/mma_atom_mfma.hpp): fragments loaded from swizzled LDS tiles
//    (load_a, load_b_nk, load_b_kn), the accumulator's (row, column) map (acc_row, acc_col),
//    and the 16-lane row reductions, against a host matrix product of small integers (exact
//    in bf16, fp16 and f32);
//  - the fp8 conversion (arch/convert.hpp) of all 256 codes of both formats into bf16 and
//    fp16, against core/numeric.hpp (the hardware path on gfx940-942 / gfx950);
//  - the LDS swizzle (kernel/smem_tile.hpp): 16-byte chunks written through chunk_offset and
//    read back element by element through offset.
// AMD only (the CUDA build compiles this file to nothing). Not yet run on AMD hardware.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gpu_harness.hpp"
#include "gpu_require.hpp"
#include "mlakit/arch/convert.hpp"
#include "mlakit/arch/mma_atom.hpp"
#include "mlakit/core/decode_args.hpp"
#include "mlakit/kernel/smem_tile.hpp"

#if defined(MLAKIT_HAS_CDNA_KERNELS)

using namespace mlakit;
using namespace mlakit::testing;

namespace {

constexpr int kK = 32;    // reduction length of the tests
constexpr int kNV = 128;  // V columns tested (n0 = 0, 32, 64, 96: both halves of a 64-group)
using LA = detail::SwizzledRows<64>;          // A [16][64] and B [16 n][64 k] tiles
using LV = detail::SwizzledRows<kHeadDimQK>;  // V [32 k][576], the decode kernel's KV layout

// One wave: S = A B^T (16 x 16, k < 32), O = A V (16 x 128, k < 32), and the row
// reductions of a per-(lane, slot) value. Outputs are written at the (row, column) the atom
// claims for each accumulator element.
template <class T>
__global__ void mfma_atom_kernel(const T* a, const T* bnk, const T* v, float* s_out, float* o_out,
                                 float* max_out, float* sum_out) {
  using Atom = arch::MmaAtomMfma16<T>;
  __shared__ T sA[16 * 64], sB[16 * 64], sV[kK * kHeadDimQK];
  const int lane = static_cast<int>(threadIdx.x);
  for (int i = lane; i < 16 * 64; i += 64) {
    const int r = i / 64, c = i % 64;
    sA[LA::offset(r, c)] = c < kK ? a[r * kK + c] : T{0};
    sB[LA::offset(r, c)] = c < kK ? bnk[r * kK + c] : T{0};
  }
  for (int i = lane; i < kK * kHeadDimQK; i += 64) {
    const int r = i / kHeadDimQK, c = i % kHeadDimQK;
    sV[LV::offset(r, c)] = c < kNV ? v[r * kNV + c] : T{0};
  }
  __syncthreads();

  typename Atom::FragA a0, a1;
  Atom::template load_a<LA>(a0, sA, 0, 0, lane);
  Atom::template load_a<LA>(a1, sA, 0, 16, lane);
  typename Atom::FragB b[2];
  Atom::template load_b_nk<LA>(b, sB, 0, 0, lane);
  typename Atom::Acc s = {0.0f, 0.0f, 0.0f, 0.0f};
  Atom::mma(s, a0, b[0]);
  Atom::mma(s, a1, b[1]);
  for (int i = 0; i < Atom::kAccPerLane; ++i)
    s_out[Atom::acc_row(i, lane) * 16 + Atom::acc_col(i, lane)] = s[i];

  for (int n0 = 0; n0 < kNV; n0 += 32) {
    typename Atom::FragB v0[2], v1[2];
    Atom::template load_b_kn<LV>(v0, sV, 0, n0, lane);
    Atom::template load_b_kn<LV>(v1, sV, 16, n0, lane);
    typename Atom::Acc o[2] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
    for (int t = 0; t < 2; ++t) {
      Atom::mma(o[t], a0, v0[t]);
      Atom::mma(o[t], a1, v1[t]);
      for (int i = 0; i < Atom::kAccPerLane; ++i)
        o_out[Atom::acc_row(i, lane) * kNV + n0 + 16 * t + Atom::acc_col(i, lane)] = o[t][i];
    }
  }

  for (int sl = 0; sl < Atom::kRowsPerLane; ++sl) {
    const float x = float((lane * 7 + sl * 3) % 29) - 10.0f;
    max_out[(lane * Atom::kRowsPerLane + sl)] = Atom::row_max(x);
    sum_out[(lane * Atom::kRowsPerLane + sl)] = Atom::row_sum(x);
  }
}

template <class T>
void check_mfma_atom() {
  using Atom = arch::MmaAtomMfma16<T>;
  auto val = [](int i, int j, int salt) { return float(((i * 5 + j * 3 + salt) % 9) - 4); };
  std::vector<T> a(16 * kK), bnk(16 * kK), v(kK * kNV);
  for (int r = 0; r < 16; ++r)
    for (int k = 0; k < kK; ++k) {
      a[r * kK + k] = from_float<T>(val(r, k, 1));
      bnk[r * kK + k] = from_float<T>(val(r, k, 2));
    }
  for (int k = 0; k < kK; ++k)
    for (int n = 0; n < kNV; ++n) v[k * kNV + n] = from_float<T>(val(k, n, 3));
  DeviceBuffer da(a.size() * 2), db(bnk.size() * 2), dv(v.size() * 2), ds(16 * 16 * 4),
      dout(16 * kNV * 4), dmax(64 * 4 * 4), dsum(64 * 4 * 4);
  REQUIRE(gpu_h2d(da.ptr, a.data(), da.bytes));
  REQUIRE(gpu_h2d(db.ptr, bnk.data(), db.bytes));
  REQUIRE(gpu_h2d(dv.ptr, v.data(), dv.bytes));
  // NaN everywhere first: an element the atom's map never reaches stays NaN and fails.
  std::vector<float> nan_fill(16 * kNV, std::nanf(""));
  REQUIRE(gpu_h2d(ds.ptr, nan_fill.data(), ds.bytes));
  REQUIRE(gpu_h2d(dout.ptr, nan_fill.data(), dout.bytes));
  hipLaunchKernelGGL(mfma_atom_kernel<T>, dim3(1), dim3(64), 0, nullptr, da.as<T>(), db.as<T>(),
                     dv.as<T>(), ds.as<float>(), dout.as<float>(), dmax.as<float>(),
                     dsum.as<float>());
  REQUIRE(MLAKIT_T_CHECK(hipGetLastError()));
  REQUIRE(gpu_sync());
  std::vector<float> s(16 * 16), o(16 * kNV), mx(256), sm(256);
  REQUIRE(gpu_d2h(s.data(), ds.ptr, ds.bytes));
  REQUIRE(gpu_d2h(o.data(), dout.ptr, dout.bytes));
  REQUIRE(gpu_d2h(mx.data(), dmax.ptr, dmax.bytes));
  REQUIRE(gpu_d2h(sm.data(), dsum.ptr, dsum.bytes));

  int bad_s = 0, bad_o = 0, bad_red = 0;
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 16; ++n) {
      float want = 0.0f;
      for (int k = 0; k < kK; ++k) want += val(r, k, 1) * val(n, k, 2);
      if (!(s[r * 16 + n] == want)) {
        if (bad_s++ < 5)
          UNSCOPED_INFO("S[" << r << "][" << n << "] = " << s[r * 16 + n] << ", want " << want);
      }
    }
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < kNV; ++n) {
      float want = 0.0f;
      for (int k = 0; k < kK; ++k) want += val(r, k, 1) * val(k, n, 3);
      if (!(o[r * kNV + n] == want)) {
        if (bad_o++ < 5)
          UNSCOPED_INFO("O[" << r << "][" << n << "] = " << o[r * kNV + n] << ", want " << want);
      }
    }
  // Reductions: over the 16 lanes of a lane group, per row slot.
  for (int lane = 0; lane < 64; ++lane)
    for (int sl = 0; sl < Atom::kRowsPerLane; ++sl) {
      float wmax = -1e30f, wsum = 0.0f;
      for (int l = lane & ~15; l < (lane & ~15) + 16; ++l) {
        const float x = float((l * 7 + sl * 3) % 29) - 10.0f;
        wmax = std::fmax(wmax, x);
        wsum += x;
      }
      if (mx[lane * 4 + sl] != wmax || sm[lane * 4 + sl] != wsum) ++bad_red;
    }
  CHECK(bad_s == 0);    // load_a / load_b_nk / mma / acc_row / acc_col
  CHECK(bad_o == 0);    // load_b_kn (V layout) / mma / acc_row / acc_col
  CHECK(bad_red == 0);  // row_max / row_sum
}

// All 256 codes of one fp8 format through convert_fp8x16 into T.
template <class T>
__global__ void fp8_convert_kernel(DType kv, const uint4* in, uint4* out) {
  const int i = static_cast<int>(threadIdx.x);  // 16 chunks of 16 codes
  uint4 o0, o1;
  arch::convert_fp8x16<T>(kv, in[i], o0, o1);
  out[2 * i] = o0;
  out[2 * i + 1] = o1;
}

template <class T>
void check_fp8_convert(DType kv) {
  std::vector<std::uint8_t> codes(256);
  for (int c = 0; c < 256; ++c) codes[c] = std::uint8_t(c);
  DeviceBuffer din(256), dout(512);
  REQUIRE(gpu_h2d(din.ptr, codes.data(), 256));
  hipLaunchKernelGGL(fp8_convert_kernel<T>, dim3(1), dim3(16), 0, nullptr, kv, din.as<uint4>(),
                     dout.as<uint4>());
  REQUIRE(MLAKIT_T_CHECK(hipGetLastError()));
  REQUIRE(gpu_sync());
  std::vector<std::uint16_t> got(256);
  REQUIRE(gpu_d2h(got.data(), dout.ptr, 512));
  int bad = 0;
  for (int c = 0; c < 256; ++c) {
    const float ref = decode_fp8(kv, std::uint8_t(c));
    const std::uint16_t want = from_float<T>(ref).bits;
    const bool ok = std::isnan(ref) ? std::isnan(to_float(T{got[c]})) : got[c] == want;
    if (!ok && bad++ < 5)
      UNSCOPED_INFO(dtype_name(kv)
                    << " code " << c << ": got 0x" << std::hex << got[c] << ", want 0x" << want);
  }
  CHECK(bad == 0);
}

// Chunks written through chunk_offset, elements read back through offset.
__global__ void lds_swizzle_kernel(std::uint32_t* bad) {
  __shared__ std::uint16_t tile[kK * kHeadDimQK];
  constexpr int kChunks = kHeadDimQK / 8;
  for (int c = static_cast<int>(threadIdx.x); c < kK * kChunks; c += blockDim.x) {
    const int r = c / kChunks, ch = c % kChunks;
    std::uint16_t* dst = tile + LV::chunk_offset(r, ch);
    for (int e = 0; e < 8; ++e) dst[e] = std::uint16_t(r * 1024 + ch * 8 + e);
  }
  __syncthreads();
  std::uint32_t n = 0;
  for (int i = static_cast<int>(threadIdx.x); i < kK * kHeadDimQK; i += blockDim.x) {
    const int r = i / kHeadDimQK, c = i % kHeadDimQK;
    if (tile[LV::offset(r, c)] != std::uint16_t(r * 1024 + c)) ++n;
  }
  atomicAdd(bad, n);
}

}  // namespace

TEST_CASE("amd atoms: MFMA fragments, accumulator map and row reductions", "[gpu][amd]") {
  MLAKIT_REQUIRE_GPU();
  SECTION("bf16") { check_mfma_atom<bf16_t>(); }
  SECTION("fp16") { check_mfma_atom<fp16_t>(); }
}

TEST_CASE("amd atoms: fp8 conversion of all codes", "[gpu][amd]") {
  MLAKIT_REQUIRE_GPU();
  for (DType kv : {DType::fp8_e4m3fnuz, DType::fp8_e4m3fn}) {
    INFO("format " << dtype_name(kv));
    check_fp8_convert<bf16_t>(kv);
    check_fp8_convert<fp16_t>(kv);
  }
}

TEST_CASE("amd atoms: LDS swizzle round trip", "[gpu][amd]") {
  MLAKIT_REQUIRE_GPU();
  DeviceBuffer d(4);
  const std::uint32_t zero = 0;
  REQUIRE(gpu_h2d(d.ptr, &zero, 4));
  hipLaunchKernelGGL(lds_swizzle_kernel, dim3(1), dim3(256), 0, nullptr, d.as<std::uint32_t>());
  REQUIRE(MLAKIT_T_CHECK(hipGetLastError()));
  REQUIRE(gpu_sync());
  std::uint32_t bad = 1;
  REQUIRE(gpu_d2h(&bad, d.ptr, 4));
  CHECK(bad == 0);
}

#endif  // MLAKIT_HAS_CDNA_KERNELS
