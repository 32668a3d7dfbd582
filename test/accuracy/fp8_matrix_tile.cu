// The error of the fp8 matrix mode's arithmetic on the tensor cores themselves (sm_90a): one
// warpgroup runs 64 attention rows of MLA (576-dim keys, 512-dim values, DeepSeek-V3's
// softmax scale) against one request's e4m3fn cache with both products on e4m3 wgmma, as a
// matrix-mode mainloop would (docs/design.md, "The fp8 matrix mode"):
//   - Q (bf16 values) divided by a per-row power of two and split into one or two e4m3 planes;
//   - S = Q K^T over 18 k-steps of 32 dims, each k-step one wgmma per plane, the chain added
//     into f32 registers every `promote` k-steps (0: one chain for the whole row);
//   - online softmax over 64-key tiles in f32; P x 256 as one or two e4m3 planes, the row sum
//     l from the f32 P;
//   - O += P V with V^T formed from the raw tile (kappa order), O rescaled in registers.
// No pipeline, one tile at a time: it measures numerics, not speed. The host compares O (as
// bf16) and the LSE with a double-precision softmax on the same values and prints the
// relative L2 error of O over the rows and the largest LSE error, per arithmetic, data and
// length; the same quantities as mlakit_fp8_matrix_error prints for its model. Beside them,
// the library's decode() on the same inputs, with Compute::standard (16-bit compute) and with
// Compute::fp8_matrix (the mode's own kernel): the 64 rows as one request of 16 heads x 4 query
// tokens, not causal, pages of 64 tokens, also at 32768 keys (the one-warpgroup kernels here
// stop at 4096).
//
//   mlakit_fp8_matrix_tile
//
// sm_90a only (it exits with a message elsewhere). A measurement program: it asserts nothing.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "gpu_harness.hpp"
#include "mlakit/arch/wgmma_fp8_sm90.hpp"
#include "mlakit/core/numeric.hpp"
#include "mlakit/mlakit.hpp"
#include "wgmma_test_util.hpp"

namespace {

using mlakit::testing::bf16;
using mlakit::testing::DeviceBuffer;
using mlakit::testing::gpu_d2h;
using mlakit::testing::gpu_h2d;

constexpr int kDims = 576;    // key length: latent 512 + rotary 64
constexpr int kHalf = 256;    // value dims per launch (one m64n256 accumulator)
constexpr int kChunks = 5;    // 128-byte column chunks of a 576-byte row (the last half used)
constexpr int kRows = 64;
constexpr double kScale = 0.07216878364870322;  // 1/sqrt(192)

struct alignas(1024) TileSmem {
  std::uint8_t q[2][kChunks][kRows * 128];  // Q planes, 128-byte swizzle per chunk
  std::uint8_t k[kChunks][64 * 128];        // the raw tile, 64 tokens
  std::uint8_t vt[kHalf * 64];              // V^T of this launch's dims, 64-byte swizzle
  float qscale[kRows];
};

template <int QPlanes, int Promote, int PPlanes>
__global__ void __launch_bounds__(128) matrix_tile_kernel(const float* q, const std::uint8_t* kv,
                                                          int len, int half, float* out,
                                                          float* lse) {
#if defined(MLAKIT_WGMMA_ENABLED)
  using namespace mlakit::arch;
  using namespace mlakit::testing;
  const auto [tid, w, g, t] = warpgroup_thread();
  const DynamicSmem smem;
  TileSmem& sm = smem.as<TileSmem>();
  // The largest power of two s with amax / s <= 448 (q / s is then a bf16 value in e4m3's range).
  if (tid < kRows) {
    float amax = 0.0f;
    for (int i = 0; i < kDims; ++i) amax = fmaxf(amax, fabsf(q[tid * kDims + i]));
    float s = 1.0f;
    if (amax > 0.0f) {
      s = exp2f(float(ilogbf(amax / 448.0f)));
      if (amax / s > 448.0f) s *= 2.0f;
    }
    sm.qscale[tid] = s;
  }
  __syncthreads();
  store_q_planes_sw128<kRows, kDims>(smem.addr(sm.q[0][0]), smem.addr(sm.q[1][0]), q, sm.qscale,
                                     tid);
  const float log2_scale = float(kScale * 1.4426950408889634);
  float rf[2], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
  for (int h = 0; h < 2; ++h) rf[h] = sm.qscale[16 * w + g + 8 * h] * log2_scale;
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;

  for (int j0 = 0; j0 < len; j0 += 64) {
    __syncthreads();  // the previous tile's wgmma (waited for) no longer read k and vt
    store_sw128<64, kDims>(smem.addr(sm.k[0]), kv + std::size_t(j0) * kDims, tid);
    __syncthreads();
    transpose_v_e4m3(smem.addr(sm.k[2 * half]), smem.addr(sm.vt), kHalf, w, 4, tid % 32);
    publish_smem_to_wgmma();

    float s[32], chain[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) s[i] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < kDims / 32; ++ks) {
      constexpr int kGroup = Promote == 0 ? kDims / 32 : Promote;  // k-steps per chain
      const bool opens = ks % kGroup == 0;
      const bool closes = ks == kDims / 32 - 1 || ks % kGroup == kGroup - 1;
      if (opens) wgmma_fence();
#pragma unroll
      for (int pl = 0; pl < QPlanes; ++pl)
        WgmmaE4m3::mma_ss_n64(chain, sw128_kstep_desc_e4m3(smem.addr(sm.q[pl][0]), ks),
                              sw128_kstep_desc_e4m3(smem.addr(sm.k[0]), ks), !(opens && pl == 0));
      if (closes) {
        wgmma_commit();
        wgmma_wait<0>();
        fence_operand(chain);
#pragma unroll
        for (int i = 0; i < 32; ++i) s[i] += chain[i];
      }
    }
    // Online softmax (base 2); a row's 64 scores are spread over the 4 threads of a quad.
    float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int h = (i >> 1) & 1;
      s[i] *= rf[h];
      tmax[h] = fmaxf(tmax[h], s[i]);
    }
    float alpha[2], lt[2] = {0.0f, 0.0f};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      tmax[h] = fmaxf(tmax[h], __shfl_xor_sync(0xffffffffu, tmax[h], 1));
      tmax[h] = fmaxf(tmax[h], __shfl_xor_sync(0xffffffffu, tmax[h], 2));
      const float mn = fmaxf(m[h], tmax[h]);
      alpha[h] = m[h] == -INFINITY ? 0.0f : exp2f(m[h] - mn);
      m[h] = mn;
    }
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int h = (i >> 1) & 1;
      s[i] = exp2f(s[i] - m[h]);
      lt[h] += s[i];
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      lt[h] += __shfl_xor_sync(0xffffffffu, lt[h], 1);
      lt[h] += __shfl_xor_sync(0xffffffffu, lt[h], 2);
      l[h] = l[h] * alpha[h] + lt[h];
    }
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] *= alpha[(i >> 1) & 1];
    std::uint32_t p_hi[8], p_lo[8];
    pack_p_e4m3(s, 256.0f, p_hi, p_lo);
    wgmma_fence();
#pragma unroll
    for (int pl = 0; pl < PPlanes; ++pl)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const std::uint32_t* src = pl ? p_lo : p_hi;
        const std::uint32_t a[4] = {src[4 * j], src[4 * j + 1], src[4 * j + 2], src[4 * j + 3]};
        WgmmaE4m3::mma_rs_n256(
            o, a, wgmma_desc(smem.addr(sm.vt) + 32 * j, 16, 512, WgmmaSwizzle::b64), true);
      }
    wgmma_commit();
    wgmma_wait<0>();
    fence_operand(o);
  }
#pragma unroll
  for (int i = 0; i < 128; ++i)
    out[acc_row(w, g, i) * kHalf + acc_col(t, i)] = o[i] / 256.0f / l[(i >> 1) & 1];
  if (t == 0)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      lse[16 * w + g + 8 * h] = (m[h] + log2f(l[h])) * 0.6931471805599453f;
#else
  (void)q, (void)kv, (void)len, (void)half, (void)out, (void)lse;
#endif
}

using KernelFn = void (*)(const float*, const std::uint8_t*, int, int, float*, float*);

struct Arith {
  const char* name;
  KernelFn fn;
};

bool ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  return e == cudaSuccess;
}

}  // namespace

int main() {
  cudaFuncAttributes attr{};
  if (!ok(cudaFuncGetAttributes(&attr, matrix_tile_kernel<2, 4, 1>), "attributes")) return 1;
  if (attr.binaryVersion != 90) {
    std::printf("no sm_90a code for this device: nothing measured\n");
    return 1;
  }
  const Arith ariths[] = {
      {"two Q planes, S promoted every 4 k-steps, one P plane (the candidate)",
       matrix_tile_kernel<2, 4, 1>},
      {"two Q planes, S promoted every 2 k-steps, one P plane", matrix_tile_kernel<2, 2, 1>},
      {"two Q planes, S not promoted, one P plane", matrix_tile_kernel<2, 0, 1>},
      {"one Q plane, S promoted every 4 k-steps, one P plane", matrix_tile_kernel<1, 4, 1>},
      {"two Q planes, S promoted every 4 k-steps, two P planes", matrix_tile_kernel<2, 4, 2>},
  };
  const int smem = static_cast<int>(sizeof(TileSmem));
  for (const Arith& a : ariths)
    if (!ok(cudaFuncSetAttribute(a.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "smem"))
      return 1;
  const char* data_names[] = {"N(0,1)", "8 channels x8 in Q and cache", "8 channels x32 in Q"};
  std::printf("%-72s %-30s %6s %4s %10s %10s\n", "arithmetic", "data", "kv_len", "seed",
              "rel L2 O", "max |dLSE|");
  for (int data = 0; data < 3; ++data)
    for (int len : {64, 1024, 4096, 32768})
      for (int seed = 0; seed < 2; ++seed) {
        std::mt19937_64 rng(std::uint64_t(1000 * data + 10 * seed + len));
        std::normal_distribution<double> nd(0.0, 1.0);
        std::vector<double> mq(kDims, 1.0), mkv(kDims, 1.0);
        if (data != 0) {
          std::vector<int> ch(kDims);
          for (int i = 0; i < kDims; ++i) ch[i] = i;
          std::shuffle(ch.begin(), ch.end(), rng);
          for (int i = 0; i < 8; ++i) {
            mq[ch[i]] = data == 1 ? 8.0 : 32.0;
            mkv[ch[i]] = data == 1 ? 8.0 : 1.0;
          }
        }
        std::vector<float> q(kRows * kDims);
        for (int r = 0; r < kRows; ++r)
          for (int i = 0; i < kDims; ++i) q[r * kDims + i] = bf16(float(nd(rng) * mq[i]));
        std::vector<std::uint8_t> kv(std::size_t(len) * kDims);
        for (int j = 0; j < len; ++j)
          for (int i = 0; i < kDims; ++i)
            kv[std::size_t(j) * kDims + i] = mlakit::encode_e4m3fn(float(nd(rng) * mkv[i]));
        // The double-precision reference.
        std::vector<double> ref(kRows * 512), ref_lse(kRows);
        std::vector<double> sc(static_cast<std::size_t>(len));
        for (int r = 0; r < kRows; ++r) {
          double mx = -INFINITY;
          for (int j = 0; j < len; ++j) {
            double acc = 0;
            for (int i = 0; i < kDims; ++i)
              acc += double(q[r * kDims + i]) * mlakit::decode_e4m3fn(kv[std::size_t(j) * kDims + i]);
            sc[j] = acc * kScale;
            mx = std::max(mx, sc[j]);
          }
          double lsum = 0;
          for (int d = 0; d < 512; ++d) ref[r * 512 + d] = 0;
          for (int j = 0; j < len; ++j) {
            const double p = std::exp(sc[j] - mx);
            lsum += p;
            for (int d = 0; d < 512; ++d)
              ref[r * 512 + d] += p * mlakit::decode_e4m3fn(kv[std::size_t(j) * kDims + d]);
          }
          for (int d = 0; d < 512; ++d) ref[r * 512 + d] /= lsum;
          ref_lse[r] = mx + std::log(lsum);
        }
        const DeviceBuffer dq(q), dkv(kv), dout(kRows * kHalf * sizeof(float)),
            dlse(kRows * sizeof(float));
        // decode(): bf16 Q and output, the same e4m3fn cache bytes, with each arithmetic the
        // library has (the mode's own kernel: Compute::fp8_matrix).
        for (mlakit::Compute compute : {mlakit::Compute::standard, mlakit::Compute::fp8_matrix}) {
          std::vector<std::uint16_t> qb(q.size());
          for (std::size_t i = 0; i < q.size(); ++i) qb[i] = mlakit::encode_bf16(q[i]);
          const int pages = len / 64;
          std::vector<std::int32_t> table(static_cast<std::size_t>(pages));
          for (int i = 0; i < pages; ++i) table[i] = i;
          const std::int32_t kv_len = len;
          const DeviceBuffer dqb(qb), dob(kRows * 512 * 2), dtab(table), dlen(4),
              dl(kRows * sizeof(float));
          gpu_h2d(dlen.ptr, &kv_len, 4);
          mlakit::DecodeArgs args;
          args.q_type = mlakit::DType::bf16;
          args.kv_type = mlakit::DType::fp8_e4m3fn;
          args.batch = 1;
          args.num_heads = 16;
          args.q_len = 4;
          args.causal = false;
          args.page_size = 64;
          args.max_pages_per_request = pages;
          mlakit::set_packed_strides(args);
          args.q = dqb.ptr;
          args.kv = dkv.ptr;
          args.block_table = dtab.as<std::int32_t>();
          args.kv_len = dlen.as<std::int32_t>();
          args.out = dob.ptr;
          args.lse = dl.as<float>();
          args.softmax_scale = float(kScale);
          args.compute = compute;
          mlakit::DeviceInfo dev;
          if (!mlakit::query_device(&dev)) return 1;
          const std::size_t ws = mlakit::workspace_bytes(args, dev);
          const DeviceBuffer dws(ws + 1);
          const mlakit::Status st = mlakit::decode(args, dws.ptr, ws, nullptr);
          if (!st) {
            std::fprintf(stderr, "decode: %s\n", st.message().c_str());
            return 1;
          }
          if (!ok(cudaDeviceSynchronize(), "sync")) return 1;
          std::vector<std::uint16_t> ob(kRows * 512);
          std::vector<float> lb(kRows);
          gpu_d2h(ob.data(), dob.ptr, ob.size() * 2);
          gpu_d2h(lb.data(), dl.ptr, lb.size() * 4);
          double num = 0, den = 0, dlse = 0;
          for (int r = 0; r < kRows; ++r) {
            for (int d = 0; d < 512; ++d) {
              const double x = mlakit::decode_bf16(ob[r * 512 + d]), y = ref[r * 512 + d];
              num += (x - y) * (x - y);
              den += y * y;
            }
            dlse = std::max(dlse, std::fabs(double(lb[r]) - ref_lse[r]));
          }
          std::printf("%-72s %-30s %6d %4d %10.3e %10.3e\n",
                      compute == mlakit::Compute::standard
                          ? "decode(): 16-bit compute (the library)"
                          : "decode(): Compute::fp8_matrix (the library's matrix mode)",
                      data_names[data], len, seed, std::sqrt(num / den), dlse);
        }
        if (len > 4096) continue;  // the one-warpgroup kernels below: up to 4096 keys
        for (const Arith& a : ariths) {
          double num = 0, den = 0, dl = 0;
          for (int half = 0; half < 2; ++half) {
            std::vector<float> o(kRows * kHalf, NAN), l(kRows, NAN);
            gpu_h2d(dout.ptr, o.data(), o.size() * sizeof(float));
            a.fn<<<1, 128, smem>>>(dq.as<float>(), dkv.as<std::uint8_t>(), len, half,
                                   dout.as<float>(), dlse.as<float>());
            if (!ok(cudaGetLastError(), "launch") || !ok(cudaDeviceSynchronize(), "sync")) return 1;
            gpu_d2h(o.data(), dout.ptr, o.size() * sizeof(float));
            gpu_d2h(l.data(), dlse.ptr, l.size() * sizeof(float));
            for (int r = 0; r < kRows; ++r) {
              for (int d = 0; d < kHalf; ++d) {
                const double x = bf16(o[r * kHalf + d]), y = ref[r * 512 + half * kHalf + d];
                num += (x - y) * (x - y);  // a NaN left in the output makes the figure NaN
                den += y * y;
              }
              dl = std::max(dl, std::isnan(l[r]) ? INFINITY : std::fabs(l[r] - ref_lse[r]));
            }
          }
          std::printf("%-72s %-30s %6d %4d %10.3e %10.3e\n", a.name, data_names[data], len, seed,
                      std::sqrt(num / den), dl);
        }
      }
  return 0;
}
