// GPU test of the e4m3 warpgroup operands (arch/wgmma_fp8_sm90.hpp, WgmmaE4m3): one warpgroup
// computes S = Q K^T with Q as two e4m3 planes (through shared memory, SS, and through
// registers, RS) against raw e4m3 K, and O = P V with P as two planes packed from an S-layout
// accumulator (RS) and stored to shared memory (SS), against V^T written in kappa order from
// a raw tile. Everything is compared with a double-precision product on the host. sm_90a
// only (the test skips elsewhere, and on HIP it is not compiled).
#include <catch2/catch.hpp>

#include "gpu_require.hpp"

#if defined(MLAKIT_HAS_SM90A_KERNELS)

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "mlakit/arch/wgmma_fp8_sm90.hpp"
#include "mlakit/core/numeric.hpp"
#include "wgmma_test_util.hpp"

namespace {

using mlakit::arch::sw128_offset;
using mlakit::arch::sw64_offset;
using mlakit::testing::bf16;
using mlakit::testing::random_e4m3;

constexpr int kKd = 128;   // K dimension of the S product in this test (one 128-byte chunk)
constexpr int kDims = 256;  // V columns of the P V product (one m64n256 accumulator)

struct alignas(1024) FpSmem {
  std::uint8_t q_hi[64 * kKd];       // [64 rows][128 B], 128B swizzle
  std::uint8_t q_lo[64 * kKd];
  std::uint8_t k[64 * kKd];          // raw K [64 tokens][128 B]
  std::uint8_t v[kDims / 128][8192];  // raw V [64 tokens][256 B] as two 128-column chunks
  std::uint8_t vt[kDims * 64];       // V^T [256 dims][64 kappa], 64B swizzle
  std::uint8_t p_hi[64 * 64];        // P planes [64 rows][64 kappa], 64B swizzle
  std::uint8_t p_lo[64 * 64];
};

__global__ void __launch_bounds__(128) fp8_operands_kernel(const float* q, const std::uint8_t* k,
                                                           const float* p, const std::uint8_t* v,
                                                           float* s_ss, float* s_rs, float* o_rs,
                                                           float* o_ss) {
#if defined(MLAKIT_WGMMA_ENABLED)
  using namespace mlakit::arch;
  using namespace mlakit::testing;
  const auto [tid, w, g, t] = warpgroup_thread();
  const DynamicSmem smem;
  FpSmem& sm = smem.as<FpSmem>();

  // Q planes and raw K / V into their swizzled layouts (4 bytes per step).
  store_q_planes_sw128<64, kKd>(smem.addr(sm.q_hi), smem.addr(sm.q_lo), q, nullptr, tid);
  store_sw128<64, kKd>(smem.addr(sm.k), k, tid);
  store_sw128<64, kDims>(smem.addr(sm.v[0]), v, tid);
  __syncthreads();
  transpose_v_e4m3(smem.addr(sm.v[0]), smem.addr(sm.vt), kDims, w, 4, tid % 32);
  publish_smem_to_wgmma();

  // S through shared memory: Q_hi K^T + Q_lo K^T, four k32 steps each.
  float s[32];
  wgmma_fence();
#pragma unroll
  for (int pl = 0; pl < 2; ++pl)
#pragma unroll
    for (int ks = 0; ks < kKd / 32; ++ks)
      WgmmaE4m3::mma_ss_n64(s, wgmma_desc(smem.addr(pl ? sm.q_lo : sm.q_hi) + 32 * ks, 16, 1024),
                            wgmma_desc(smem.addr(sm.k) + 32 * ks, 16, 1024), pl + ks > 0);
  wgmma_commit();
  wgmma_wait<0>();
  fence_operand(s);
#pragma unroll
  for (int i = 0; i < 32; ++i) s_ss[acc_row(w, g, i) * 64 + acc_col(t, i)] = s[i];

  // S with Q from registers: register r of step ks = row g + 8 (r & 1), columns
  // 32 ks + 16 (r >> 1) + 4t.
  wgmma_fence();
#pragma unroll
  for (int pl = 0; pl < 2; ++pl)
#pragma unroll
    for (int ks = 0; ks < kKd / 32; ++ks) {
      std::uint32_t a[4];
#pragma unroll
      for (int r = 0; r < 4; ++r)
        a[r] = lds32(smem.addr(pl ? sm.q_lo : sm.q_hi) +
                     sw128_offset(16 * w + g + 8 * (r & 1), 32 * ks + 16 * (r >> 1) + 4 * t));
      WgmmaE4m3::mma_rs_n64(s, a, wgmma_desc(smem.addr(sm.k) + 32 * ks, 16, 1024), pl + ks > 0);
    }
  wgmma_commit();
  wgmma_wait<0>();
  fence_operand(s);
#pragma unroll
  for (int i = 0; i < 32; ++i) s_rs[acc_row(w, g, i) * 64 + acc_col(t, i)] = s[i];

  // P in the accumulator layout -> two planes (x 256), O = P V from registers.
  float pa[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) pa[i] = p[acc_row(w, g, i) * 64 + acc_col(t, i)];
  std::uint32_t p_hi[8], p_lo[8];
  pack_p_e4m3(pa, 256.0f, p_hi, p_lo);
  float o[128];
  wgmma_fence();
#pragma unroll
  for (int pl = 0; pl < 2; ++pl)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const std::uint32_t* src = pl ? p_lo : p_hi;
      const std::uint32_t a[4] = {src[4 * j], src[4 * j + 1], src[4 * j + 2], src[4 * j + 3]};
      WgmmaE4m3::mma_rs_n256(
          o, a, wgmma_desc(smem.addr(sm.vt) + 32 * j, 16, 512, WgmmaSwizzle::b64), pl + j > 0);
    }
  wgmma_commit();
  wgmma_wait<0>();
  fence_operand(o);
#pragma unroll
  for (int i = 0; i < 128; ++i) o_rs[acc_row(w, g, i) * kDims + acc_col(t, i)] = o[i] / 256.0f;

  // The same P through shared memory.
  store_p_e4m3(p_hi, smem.addr(sm.p_hi), w, g, t);
  store_p_e4m3(p_lo, smem.addr(sm.p_lo), w, g, t);
  publish_smem_to_wgmma();
  wgmma_fence();
#pragma unroll
  for (int pl = 0; pl < 2; ++pl)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      WgmmaE4m3::mma_ss_n256(
          o, wgmma_desc(smem.addr(pl ? sm.p_lo : sm.p_hi) + 32 * j, 16, 512, WgmmaSwizzle::b64),
          wgmma_desc(smem.addr(sm.vt) + 32 * j, 16, 512, WgmmaSwizzle::b64), pl + j > 0);
  wgmma_commit();
  wgmma_wait<0>();
  fence_operand(o);
#pragma unroll
  for (int i = 0; i < 128; ++i) o_ss[acc_row(w, g, i) * kDims + acc_col(t, i)] = o[i] / 256.0f;
#else
  (void)q, (void)k, (void)p, (void)v, (void)s_ss, (void)s_rs, (void)o_rs, (void)o_ss;
#endif
}

}  // namespace

TEST_CASE("wgmma e4m3 operands: two-plane Q and P, kappa-ordered V^T, SS and RS",
          "[gpu][wgmma]") {
  MLAKIT_REQUIRE_GPU();
  if (mlakit::testing::loaded_binary_version(fp8_operands_kernel) != 90) {
    WARN("no sm_90a code for this device: wgmma e4m3 test skipped");
    return;
  }
  // kappa order is a permutation of each 16-key block.
  REQUIRE(mlakit::testing::permutes_16_key_blocks(mlakit::arch::key_of_kappa));

  std::mt19937 rng(4242);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f), unit(0.0f, 1.0f);
  // Q: bf16-representable, rows scaled so that their largest |q| lies in [128, 256) (the
  // mainloop's per-row 2^e), with a few tiny entries (below e4m3's normal range after the
  // split) to exercise the lo plane's limits.
  std::vector<float> q(64 * kKd), p(64 * 64);
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < kKd; ++c) {
      float x = bf16(uni(rng)) * 255.0f;
      if (c % 17 == 3) x *= 1.0f / 4096.0f;
      q[r * kKd + c] = bf16(x);
    }
  // P in [0, 1] with rows that mix large and small values, as after a softmax.
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < 64; ++c) {
      const float e = -10.0f * unit(rng);
      p[r * 64 + c] = bf16(std::exp2(e));
    }
  std::vector<std::uint8_t> k(64 * kKd), v(64 * kDims);
  for (auto& b : k) b = random_e4m3(rng);
  for (auto& b : v) b = random_e4m3(rng);

  using mlakit::testing::DeviceBuffer;
  const DeviceBuffer dq(q), dp(p), dk(k), dv(v);
  std::vector<float> nan_s(64 * 64, std::nanf("")), nan_o(64 * kDims, std::nanf(""));
  const DeviceBuffer s_ss(nan_s), s_rs(nan_s), o_rs(nan_o), o_ss(nan_o);
  for (const DeviceBuffer* b : {&dq, &dp, &dk, &dv, &s_ss, &s_rs, &o_rs, &o_ss})
    REQUIRE(b->ptr != nullptr);
  const int smem = static_cast<int>(sizeof(FpSmem));
  REQUIRE(cudaFuncSetAttribute(fp8_operands_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               smem) == cudaSuccess);
  fp8_operands_kernel<<<1, 128, smem>>>(dq.as<float>(), dk.as<std::uint8_t>(), dp.as<float>(),
                                        dv.as<std::uint8_t>(), s_ss.as<float>(), s_rs.as<float>(),
                                        o_rs.as<float>(), o_ss.as<float>());
  REQUIRE(cudaGetLastError() == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);

  // S: error bound from the two-plane representation of Q (relative 2^-8 of each |q|, plus
  // 2^-10 absolute for the entries below the lo plane's normal range) times |k|.
  std::vector<float> hs_ss, hs_rs;
  REQUIRE(s_ss.download(hs_ss, 64 * 64));
  REQUIRE(s_rs.download(hs_rs, 64 * 64));
  double worst_s = 0.0;
  for (int r = 0; r < 64; ++r)
    for (int n = 0; n < 64; ++n) {
      double ref = 0.0, mag = 0.0;
      for (int c = 0; c < kKd; ++c) {
        const double kv = mlakit::decode_e4m3fn(k[n * kKd + c]);
        ref += double(q[r * kKd + c]) * kv;
        mag += (std::fabs(double(q[r * kKd + c])) / 256.0 + 1.0 / 1024.0) * std::fabs(kv);
      }
      for (const auto* got : {&hs_ss, &hs_rs}) {
        const double err = std::fabs(double((*got)[r * 64 + n]) - ref);
        INFO("S row " << r << " key " << n << " ref " << ref << " got " << (*got)[r * 64 + n]);
        REQUIRE(err <= mag);
        worst_s = std::max(worst_s, err / (mag > 0 ? mag : 1.0));
      }
    }
  // O: P's planes hold p x 256 to 2^-8 relative (every p here is >= 2^-10, in the normal
  // range of both planes), V is exact.
  std::vector<float> ho_rs, ho_ss;
  REQUIRE(o_rs.download(ho_rs, 64 * kDims));
  REQUIRE(o_ss.download(ho_ss, 64 * kDims));
  double worst_o = 0.0;
  for (int r = 0; r < 64; ++r)
    for (int d = 0; d < kDims; ++d) {
      double ref = 0.0, mag = 0.0;
      for (int key = 0; key < 64; ++key) {
        const double vv = mlakit::decode_e4m3fn(v[key * kDims + d]);
        ref += double(p[r * 64 + key]) * vv;
        mag += double(p[r * 64 + key]) * std::fabs(vv) / 256.0;
      }
      for (const auto* got : {&ho_rs, &ho_ss}) {
        const double err = std::fabs(double((*got)[r * kDims + d]) - ref);
        INFO("O row " << r << " dim " << d << " ref " << ref << " got " << (*got)[r * kDims + d]);
        REQUIRE(err <= mag + 1e-6);
        worst_o = std::max(worst_o, err / (mag > 0 ? mag : 1.0));
      }
    }
  INFO("worst error / bound: S " << worst_s << ", O " << worst_o);
  CHECK(worst_s < 1.0);
  CHECK(worst_o < 1.0);
}

#endif  // MLAKIT_HAS_SM90A_KERNELS
