// GPU test of the keys-as-M e4m3 warpgroup operands (arch/wgmma_fp8_sm90.hpp, the end of the
// file): one warpgroup computes S^T = K Q^T with the raw tile as A and Q as two e4m3 planes as
// B, both read from shared memory as they are, and O^T = V^T P^T with V^T fragments loaded
// from the same raw tile by transposing ldmatrix (load_vt_e4m3_kt) and P^T stored from an S^T
// accumulator in kappa order (store_pt_e4m3_kt). Compared with a double-precision product on
// the host; O^T against the e4m3-rounded P, so a wrong key or dim order cannot pass. sm_90a
// only (the test skips elsewhere, and on HIP it is not compiled).
#include <catch2/catch.hpp>

#include "gpu_require.hpp"
#include "wgmma_test_util.hpp"

#if defined(MLAKIT_HAS_SM90A_KERNELS)

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "mlakit/arch/wgmma_fp8_sm90.hpp"
#include "mlakit/core/numeric.hpp"

namespace {

constexpr int kKd = 128;    // K dimension of S^T in this test (one 128-byte chunk)
constexpr int kDims = 256;  // V dims of O^T (four m64 tiles)

struct alignas(1024) KtSmem {
  std::uint8_t q_hi[64 * kKd];         // Q planes [64 rows][128 B], 128B swizzle
  std::uint8_t q_lo[64 * kKd];
  std::uint8_t kv[kDims / 128][8192];  // raw tile [64 tokens][256 B] as 128-column chunks
  std::uint8_t pt[64 * 64];            // P^T plane [64 rows][64 kappa], 64B swizzle
};

__global__ void __launch_bounds__(128) fp8_kt_operands_kernel(const float* q,
                                                              const std::uint8_t* kv,
                                                              const float* p, float* st_out,
                                                              float* ot_out) {
#if defined(MLAKIT_WGMMA_ENABLED)
  using namespace mlakit::arch;
  using namespace mlakit::testing;
  const DynamicSmem smem;
  KtSmem& sm = smem.as<KtSmem>();
  const auto [tid, w, g, t] = warpgroup_thread();
  const int lane = tid % 32;
  const auto addr = [&](const void* ptr) { return smem.addr(ptr); };
  // Accumulator i of wgmma m64nN for this thread: M row acc_row(w, g, i) (keys of S^T, dims
  // of O^T) and N column acc_col(t, i) (rows).

  store_q_planes_sw128<64, kKd>(addr(sm.q_hi), addr(sm.q_lo), q, nullptr, tid);
  store_sw128<64, kDims>(addr(sm.kv[0]), kv, tid);
  publish_smem_to_wgmma();

  // S^T = K Q_hi^T + K Q_lo^T (keys of the first 128 dims), four k32 steps per plane.
  float s[32];
  wgmma_fence();
#pragma unroll
  for (int pl = 0; pl < 2; ++pl)
#pragma unroll
    for (int ks = 0; ks < kKd / 32; ++ks)
      WgmmaE4m3::mma_ss_n64(s, wgmma_desc(addr(sm.kv[0]) + 32 * ks, 16, 1024),
                            wgmma_desc(addr(pl ? sm.q_lo : sm.q_hi) + 32 * ks, 16, 1024),
                            pl + ks > 0);
  wgmma_commit();
  wgmma_wait<0>();
  fence_operand(s);
#pragma unroll
  for (int i = 0; i < 32; ++i) st_out[acc_row(w, g, i) * 64 + acc_col(t, i)] = s[i];

  // P (host values, key x row in the S^T accumulator layout) x 256 -> P^T in shared memory.
  float pa[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) pa[i] = p[acc_col(t, i) * 64 + acc_row(w, g, i)];
  store_pt_e4m3_kt(pa, 256.0f, addr(sm.pt), w, lane);
  publish_smem_to_wgmma();

  // O^T = V^T P^T: four 64-dim M tiles, two k32 steps each; warp w's rows of tile mt are
  // dims 64 mt + 16 w + (0..15).
  // Every A fragment is loaded before the first wgmma (no register written while one is in
  // flight).
  float o[kDims / 64][32];
  std::uint32_t a[kDims / 64][2][4];
#pragma unroll
  for (int mt = 0; mt < kDims / 64; ++mt)
#pragma unroll
    for (int j = 0; j < 2; ++j) load_vt_e4m3_kt(addr(sm.kv[0]), 64 * mt + 16 * w, j, lane, a[mt][j]);
  wgmma_fence();
#pragma unroll
  for (int mt = 0; mt < kDims / 64; ++mt)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      WgmmaE4m3::mma_rs_n64(o[mt], a[mt][j],
                            wgmma_desc(addr(sm.pt) + 32 * j, 16, 512, WgmmaSwizzle::b64), j > 0);
  wgmma_commit();
  wgmma_wait<0>();
#pragma unroll
  for (int mt = 0; mt < kDims / 64; ++mt) {
    fence_operand(o[mt]);
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      // M row 16 w + g (+ 8) is dim 64 mt + 16 w + 2 g (+ 1).
      const int dim = 64 * mt + 16 * w + 2 * g + ((i >> 1) & 1);
      ot_out[acc_col(t, i) * kDims + dim] = o[mt][i] / 256.0f;
    }
  }
#else
  (void)q, (void)kv, (void)p, (void)st_out, (void)ot_out;
#endif
}

}  // namespace

TEST_CASE("wgmma e4m3 keys-as-M operands: S^T from the raw tile, V^T by ldmatrix, P^T by stmatrix",
          "[gpu][wgmma]") {
  MLAKIT_REQUIRE_GPU();
  if (mlakit::testing::loaded_binary_version(fp8_kt_operands_kernel) != 90) {
    WARN("no sm_90a code for this device: wgmma e4m3 keys-as-M test skipped");
    return;
  }
  // The keys-as-M kappa order is a permutation of each 16-key block.
  REQUIRE(mlakit::testing::permutes_16_key_blocks(mlakit::arch::key_of_kappa_kt));

  std::mt19937 rng(777);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f), unit(0.0f, 1.0f);
  using mlakit::testing::bf16;
  // Q rows with their largest |q| in [128, 256) (the mainloop's per-row 2^e) and P in
  // [2^-10, 1], as after a softmax; every code of the raw tile finite and random.
  std::vector<float> q(64 * kKd), p(64 * 64);
  for (auto& x : q) x = bf16(bf16(uni(rng)) * 255.0f);
  for (auto& x : p) x = bf16(std::exp2(-10.0f * unit(rng)));
  // The raw tile: N(0, 8) values rounded to e4m3fn, so that no single term dominates a sum
  // and a key or dim in the wrong place shows.
  std::normal_distribution<float> normal(0.0f, 8.0f);
  std::vector<std::uint8_t> kv(64 * kDims);
  for (auto& b : kv) b = mlakit::encode_e4m3fn(normal(rng));

  using mlakit::testing::DeviceBuffer;
  const DeviceBuffer dq(q), dp(p), dkv(kv);
  std::vector<float> nan_s(64 * 64, std::nanf("")), nan_o(64 * kDims, std::nanf(""));
  const DeviceBuffer st(nan_s), ot(nan_o);
  for (const DeviceBuffer* b : {&dq, &dp, &dkv, &st, &ot}) REQUIRE(b->ptr != nullptr);
  const int smem = static_cast<int>(sizeof(KtSmem));
  REQUIRE(cudaFuncSetAttribute(fp8_kt_operands_kernel,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, smem) == cudaSuccess);
  fp8_kt_operands_kernel<<<1, 128, smem>>>(dq.as<float>(), dkv.as<std::uint8_t>(), dp.as<float>(),
                                           st.as<float>(), ot.as<float>());
  REQUIRE(cudaGetLastError() == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);

  // S^T[key][row]: the two-plane Q holds each |q| to 2^-8 relative; the sum's own error
  // (truncation about 2^-13 of the largest term per k-step) is far below that bound.
  std::vector<float> hs;
  REQUIRE(st.download(hs, 64 * 64));
  double worst_s = 0.0;
  for (int key = 0; key < 64; ++key)
    for (int r = 0; r < 64; ++r) {
      double ref = 0.0, mag = 0.0;
      for (int c = 0; c < kKd; ++c) {
        const double k = mlakit::decode_e4m3fn(kv[key * kDims + c]);
        ref += double(q[r * kKd + c]) * k;
        mag += std::fabs(double(q[r * kKd + c])) / 256.0 * std::fabs(k);
      }
      const double err = std::fabs(double(hs[key * 64 + r]) - ref);
      INFO("S^T key " << key << " row " << r << " ref " << ref << " got " << hs[key * 64 + r]);
      REQUIRE(err <= mag);
      worst_s = std::max(worst_s, err / (mag > 0 ? mag : 1.0));
    }
  // O^T against the e4m3 P the kernel stores (256 p rounded once): only the sum's truncation
  // remains, bounded here by 2^-7 of the largest term (64 units of 2^-13 for a chain of two
  // k-steps; the H200's largest measured for four k-steps is 44). A key or dim in the wrong
  // place moves the sum by the difference of two terms.
  std::vector<float> ho;
  REQUIRE(ot.download(ho, 64 * kDims));
  double worst_o = 0.0;
  for (int r = 0; r < 64; ++r)
    for (int d = 0; d < kDims; ++d) {
      double ref = 0.0, big = 0.0;
      for (int key = 0; key < 64; ++key) {
        const double pe = mlakit::decode_e4m3fn(mlakit::encode_e4m3fn(256.0f * p[r * 64 + key]));
        const double v = mlakit::decode_e4m3fn(kv[key * kDims + d]);
        ref += pe * v / 256.0;
        big = std::max(big, std::fabs(pe * v) / 256.0);
      }
      const double bound = big * 0x1p-7;
      const double err = std::fabs(double(ho[r * kDims + d]) - ref);
      INFO("O^T row " << r << " dim " << d << " ref " << ref << " got " << ho[r * kDims + d]);
      REQUIRE(err <= bound);
      worst_o = std::max(worst_o, err / (bound > 0 ? bound : 1.0));
    }
  INFO("worst error / bound: S^T " << worst_s << ", O^T " << worst_o);
  CHECK(worst_s < 1.0);
  CHECK(worst_o < 1.0);
}

#endif  // MLAKIT_HAS_SM90A_KERNELS
