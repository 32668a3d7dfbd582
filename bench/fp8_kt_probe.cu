// Speed probe of the fp8 matrix mode's consumer work in the keys-as-M orientation (sm_90a;
// docs/design.md, "The fp8 matrix mode"): how many cycles the matrix side of a 64-row tile
// takes when both products run on e4m3 wgmma, before any mainloop is built around it.
//
// One CTA per SM, two consumer warpgroups, no producer: Q (two e4m3 planes) and two raw
// 64-token tiles stay in shared memory and are reused, so no memory traffic but the
// operands' shared-memory reads is timed. Per pair of tiles, as the 64-row keys-as-M kernel
// splits it: warpgroup w computes S^T of tile w (18 k-steps x 2 planes, SS wgmma m64n64k32,
// promoted to f32 registers every 4 k-steps), turns it into P (one exponential per score; no
// row maximum is reduced, which the real softmax adds) and stores P^T (store_pt_e4m3_kt);
// after a barrier each warpgroup accumulates O^T of its 256 dims for both tiles (V^T
// fragments by load_vt_e4m3_kt, 8 RS wgmma m64n64k32 per tile). A variant drops the
// promotion, to show what it costs. The tensor-pipe bound of a tile is 36 + 2 x 8 wgmma m64n64k32 e4m3 (1664 cycles at
// 8192 e4m3 flops per cycle and SM), against 36 + 2 x 16 wgmma m64n64k16 f16 (2176 cycles)
// for the f16 operand mode.
//
//   mlakit_fp8_kt_probe [pairs]   (default 256 pairs of tiles per CTA)
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "mlakit/arch/wgmma_fp8_sm90.hpp"
#include "mlakit/core/numeric.hpp"
#include "mlakit/platform/intrinsics.hpp"

namespace {

constexpr int kChunks = 5;  // 128-byte column chunks of a 576-byte row (the last one half used)

struct alignas(1024) ProbeSmem {
  std::uint8_t q[2][kChunks][64 * 128];   // Q planes hi, lo: [64 rows][128 B] per chunk
  std::uint8_t kv[2][kChunks][64 * 128];  // raw tiles A, B: [64 tokens][128 B] per chunk
  std::uint8_t pt[2][64 * 64];            // P^T of A, B: [64 rows][64 kappa], 64B swizzle
};

enum Variant : int {
  kFull = 0,       // promotion, exponential + P^T store, V^T fragments per tile
  kNoPromote = 1,  // S^T as one chain of 36 wgmma
};
// No variant drops the softmax: S^T would then be read by nothing, and ptxas removes wgmma whose
// accumulators are never read (a timing build without them times only O^T).

template <int V>
__global__ void __launch_bounds__(256, 1) probe_kernel(const std::uint8_t* src, int pairs,
                                                       float* sink, long long* cycles) {
#if defined(MLAKIT_WGMMA_ENABLED)
  using namespace mlakit::arch;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  ProbeSmem& sm = *reinterpret_cast<ProbeSmem*>(smem_raw);
  const int tid = static_cast<int>(threadIdx.x);
  const int w = tid / 128, wi = (tid / 32) % 4, lane = tid % 32;
  const std::uint32_t base = mlakit::detail::smem_u32(smem_raw);
  const auto addr = [&](const void* ptr) {
    return base + std::uint32_t(static_cast<const unsigned char*>(ptr) - smem_raw);
  };
  for (int i = tid; i < int(sizeof(ProbeSmem)) / 4; i += 256)
    reinterpret_cast<std::uint32_t*>(smem_raw)[i] = reinterpret_cast<const std::uint32_t*>(src)[i];
  fence_proxy_async_smem();
  __syncthreads();

  const std::uint32_t q_hi = addr(sm.q[0][0]), q_lo = addr(sm.q[1][0]);
  const std::uint32_t kv_own = addr(sm.kv[w][0]);
  float o[4][32];
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int i = 0; i < 32; ++i) o[mt][i] = 0.0f;
  std::uint32_t a[2][4][2][4];  // [tile][64-dim block][k-step][register]
  const auto load_a = [&](int x) {
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
      for (int j = 0; j < 2; ++j)
        load_vt_e4m3_kt(addr(sm.kv[x][0]), 256 * w + 64 * mt + 16 * wi, j, lane, a[x][mt][j]);
  };
  const long long t0 = clock64();
  for (int pr = 0; pr < pairs; ++pr) {
    float s[32];
    if (V == kNoPromote) {
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < 18; ++ks)
#pragma unroll
        for (int pl = 0; pl < 2; ++pl)
          WgmmaE4m3::mma_ss_n64(s, sw128_kstep_desc_e4m3(kv_own, ks),
                                sw128_kstep_desc_e4m3(pl ? q_lo : q_hi, ks), ks + pl > 0);
      wgmma_commit();
      wgmma_wait<0>();
      fence_operand(s);
    } else {
#pragma unroll
      for (int c = 0; c < 5; ++c) {  // chains of 4, 4, 4, 4, 2 k-steps
        float tmp[32];
        wgmma_fence();
#pragma unroll
        for (int st = 0; st < (c < 4 ? 4 : 2); ++st)
#pragma unroll
          for (int pl = 0; pl < 2; ++pl)
            WgmmaE4m3::mma_ss_n64(tmp, sw128_kstep_desc_e4m3(kv_own, 4 * c + st),
                                  sw128_kstep_desc_e4m3(pl ? q_lo : q_hi, 4 * c + st), st + pl > 0);
        wgmma_commit();
        wgmma_wait<0>();
        fence_operand(tmp);
#pragma unroll
        for (int i = 0; i < 32; ++i) s[i] = c == 0 ? tmp[i] : s[i] + tmp[i];
      }
    }
#pragma unroll
    for (int i = 0; i < 32; ++i) s[i] = mlakit::detail::fast_exp2(s[i] * 0.0625f - 8.0f);
    store_pt_e4m3_kt(s, 256.0f, addr(sm.pt[w]), wi, lane);
    fence_proxy_async_smem();
    __syncthreads();  // both P^T tiles are stored
    load_a(0);
    load_a(1);
    wgmma_fence();
#pragma unroll
    for (int x = 0; x < 2; ++x)
#pragma unroll
      for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int j = 0; j < 2; ++j)
          WgmmaE4m3::mma_rs_n64(o[mt], a[x][mt][j],
                                wgmma_desc(addr(sm.pt[x]) + 32 * j, 16, 512, WgmmaSwizzle::b64),
                                true);
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) fence_operand(o[mt]);
    __syncthreads();  // the P^T tiles are read before the next pair stores them
  }
  const long long t1 = clock64();
  float acc = 0.0f;
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int i = 0; i < 32; ++i) acc += o[mt][i];
  sink[blockIdx.x * 256 + tid] = acc;
  if (tid == 0) cycles[blockIdx.x] = t1 - t0;
#else
  (void)src, (void)pairs, (void)sink, (void)cycles;
#endif
}

template <int V>
void run(const char* name, const std::uint8_t* src, int pairs, int sms, float* sink,
         long long* cycles) {
  const int smem = static_cast<int>(sizeof(ProbeSmem));
  cudaFuncSetAttribute(probe_kernel<V>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  probe_kernel<V><<<sms, 256, smem>>>(src, pairs, sink, cycles);  // warm-up
  float best = 1e30f;
  for (int rep = 0; rep < 5; ++rep) {
    cudaEventRecord(e0);
    probe_kernel<V><<<sms, 256, smem>>>(src, pairs, sink, cycles);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, e0, e1);
    best = ms < best ? ms : best;
  }
  std::vector<long long> cyc(sms);
  cudaMemcpy(cyc.data(), cycles, sms * sizeof(long long), cudaMemcpyDeviceToHost);
  long long mx = 0;
  for (long long c : cyc) mx = c > mx ? c : mx;
  const cudaError_t err = cudaGetLastError();
  const double tiles = 2.0 * pairs;
  std::printf("%-44s %8.1f cycles/tile (slowest CTA) %7.3f us/tile %6.1f%% of the e4m3 bound  %s\n",
              name, double(mx) / tiles, 1e3 * best / tiles, 100.0 * 1664.0 * tiles / double(mx),
              err == cudaSuccess ? "" : cudaGetErrorString(err));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

}  // namespace

int main(int argc, char** argv) {
  const int pairs = argc > 1 ? std::atoi(argv[1]) : 256;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess || prop.major != 9) {
    std::printf("mlakit_fp8_kt_probe: needs an sm_90 GPU\n");
    return 0;
  }
  // Q planes and tiles: e4m3fn codes of N(0,1) values; P^T: codes of values near 1/4.
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::uint8_t> h(sizeof(ProbeSmem));
  for (auto& b : h) b = mlakit::encode_e4m3fn(normal(rng));
  std::uint8_t* src = nullptr;
  float* sink = nullptr;
  long long* cycles = nullptr;
  cudaMalloc(&src, h.size());
  cudaMalloc(&sink, sizeof(float) * 256 * prop.multiProcessorCount);
  cudaMalloc(&cycles, sizeof(long long) * prop.multiProcessorCount);
  cudaMemcpy(src, h.data(), h.size(), cudaMemcpyHostToDevice);
  std::printf("%s, %d SMs, %d pairs of 64-key tiles per CTA, one CTA per SM\n", prop.name,
              prop.multiProcessorCount, pairs);
  const int sms = prop.multiProcessorCount;
  run<kFull>("full (promote /4, exp + P^T, V^T loads)", src, pairs, sms, sink, cycles);
  run<kNoPromote>("S^T not promoted", src, pairs, sms, sink, cycles);
  cudaFree(src);
  cudaFree(sink);
  cudaFree(cycles);
  return 0;
}
