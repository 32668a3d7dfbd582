// How an e4m3 warpgroup MMA (wgmma m64n64k32 .f32.e4m3.e4m3, sm_90a) adds its 32 products and
// its f32 accumulator: a measurement program for the accumulation model of
// test/accuracy/fp8_matrix_error.cpp (docs/design.md, "The fp8 matrix mode").
//
// One warpgroup runs chains of 1 or 4 k-steps on random operands, with the accumulator starting
// at zero or at a random f32 value, and every output element is compared bit for bit with
// candidate models of the sum:
//   - "f32": the exact sum rounded once to f32;
//   - "trunc": per k-step, the accumulator and the 32 exact products aligned to the largest
//     exponent among them and truncated toward zero `bits` significant bits below it, the kept
//     parts summed exactly and rounded to f32 (to nearest or toward zero); the largest
//     exponent is either the value's (ilogb of the exact product) or the operands' exponent
//     sum plus one (the product's possible leading bit), and the accumulator is either
//     aligned with the products or added afterwards in f32.
// For each operand distribution it prints the share of elements each model reproduces
// exactly (a model at 100% over every distribution would describe the hardware on these
// data), and the error of the GPU's sums and of the aligned-truncation models (12..15 bits,
// ilogb, accumulator aligned, as test/accuracy/fp8_matrix_error.cpp computes a k-step)
// against the exact sum, root mean square and largest, in units of 2^-13 of the chain's
// largest term: the model whose statistics match the GPU's is the one to trust.
//
//   mlakit_fp8_wgmma_sum [trials [--dump FILE]]   (default 8 launches per distribution, chain
//                                                 length and accumulator start)
//   mlakit_fp8_wgmma_sum --replay FILE            (the analysis of a dump, no GPU needed)
//
// sm_90a only: it exits with a message on any other device. Not part of the test suite: it
// measures, it asserts nothing.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "mlakit/arch/wgmma_fp8_sm90.hpp"
#include "mlakit/core/numeric.hpp"
#include "wgmma_test_util.hpp"

namespace {

constexpr int kK = 128;  // bytes per operand row: up to four k-steps of 32

struct alignas(1024) ProbeSmem {
  std::uint8_t a[64 * kK];  // [64 rows][128 B], 128-byte swizzle
  std::uint8_t b[64 * kK];  // [64 columns][128 B] (K-major B)
};

template <int Steps>
__global__ void __launch_bounds__(128) wgmma_sum_kernel(const std::uint8_t* a,
                                                        const std::uint8_t* b, const float* c,
                                                        int use_c, float* d) {
#if defined(MLAKIT_WGMMA_ENABLED)
  using namespace mlakit::arch;
  using namespace mlakit::testing;
  const auto [tid, w, g, t] = warpgroup_thread();
  const DynamicSmem smem;
  ProbeSmem& sm = smem.as<ProbeSmem>();
  store_sw128<64, kK>(smem.addr(sm.a), a, tid);
  store_sw128<64, kK>(smem.addr(sm.b), b, tid);
  publish_smem_to_wgmma();
  float acc[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) acc[i] = use_c ? c[acc_row(w, g, i) * 64 + acc_col(t, i)] : 0.0f;
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < Steps; ++ks)
    WgmmaE4m3::mma_ss_n64(acc, wgmma_desc(smem.addr(sm.a) + 32 * ks, 16, 1024),
                          wgmma_desc(smem.addr(sm.b) + 32 * ks, 16, 1024), use_c != 0 || ks > 0);
  wgmma_commit();
  wgmma_wait<0>();
  fence_operand(acc);
#pragma unroll
  for (int i = 0; i < 32; ++i) d[acc_row(w, g, i) * 64 + acc_col(t, i)] = acc[i];
#else
  (void)a, (void)b, (void)c, (void)use_c, (void)d;
#endif
}

// The exponent an e4m3fn code's value is encoded with (subnormals: -6).
int code_exponent(std::uint8_t code) {
  const int e = (code >> 3) & 0xF;
  return e == 0 ? -6 : e - 7;
}

struct Model {
  int bits = 0;           // 0: the exact sum rounded once per k-step to f32
  bool exp_sum = false;   // alignment exponent from the operands' exponents (+1), not ilogb
  bool c_aligned = true;  // the accumulator is aligned and truncated with the products
  bool final_rz = false;  // the k-step's result rounded toward zero (else to nearest)
};

float to_f32(double x, bool rz) {
  const float f = static_cast<float>(x);  // round to nearest even
  if (!rz || static_cast<double>(f) == x) return f;
  // toward zero: step back one ulp when rounding went away from zero
  if (std::fabs(static_cast<double>(f)) > std::fabs(x))
    return std::nextafter(f, 0.0f);
  return f;
}

// The exact products of one k-step and the two candidate alignment exponents of each.
struct Step {
  double prod[32];
  int e_value[32];  // ilogb of the product
  int e_codes[32];  // the operands' encoded exponents summed, plus one
};

Step make_step(const std::uint8_t* a, const std::uint8_t* b) {
  Step s{};
  for (int i = 0; i < 32; ++i) {
    s.prod[i] = double(mlakit::decode_e4m3fn(a[i])) * double(mlakit::decode_e4m3fn(b[i]));
    s.e_value[i] = s.prod[i] == 0 ? INT_MIN : std::ilogb(s.prod[i]);
    s.e_codes[i] = s.prod[i] == 0 ? INT_MIN : code_exponent(a[i]) + code_exponent(b[i]) + 1;
  }
  return s;
}

// One k-step of the model: acc + the step's products.
float model_step(float acc, const Step& st, const Model& m) {
  if (m.bits == 0) {
    double s = acc;
    for (double p : st.prod) s += p;
    return to_f32(s, m.final_rz);
  }
  int top = INT_MIN;
  for (int i = 0; i < 32; ++i) top = std::max(top, m.exp_sum ? st.e_codes[i] : st.e_value[i]);
  if (m.c_aligned && acc != 0) top = std::max(top, std::ilogb(double(acc)));
  if (top == INT_MIN) return to_f32(double(acc), m.final_rz);
  const double quantum = std::ldexp(1.0, top + 1 - m.bits);
  double s = 0;
  for (double p : st.prod) s += std::trunc(p / quantum) * quantum;
  if (m.c_aligned)
    s += std::trunc(double(acc) / quantum) * quantum;
  else
    s = double(static_cast<float>(s)) + double(acc);
  return to_f32(s, m.final_rz);
}

bool ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  return e == cudaSuccess;
}

}  // namespace

int main(int argc, char** argv) {
  // --dump FILE: every launch's operands and results, raw (int32 distribution, steps, use_c;
  // A and B bytes [64][128]; C and D floats [64][64]), in the order of the launches.
  // --replay FILE: the analysis of such a file, on any machine (no GPU used).
  constexpr long kRecordBytes = 12 + 2 * 64 * kK + 2 * 64 * 64 * 4;
  std::FILE* replay = nullptr;
  int trials = 8;
  if (argc > 2 && std::string(argv[1]) == "--replay") {
    replay = std::fopen(argv[2], "rb");
    if (!replay || std::fseek(replay, 0, SEEK_END) != 0) {
      std::fprintf(stderr, "cannot read %s\n", argv[2]);
      return 1;
    }
    trials = int(std::ftell(replay) / kRecordBytes / 12);
    std::rewind(replay);
    if (trials < 1) {
      std::fprintf(stderr, "%s holds no whole set of launches\n", argv[2]);
      return 1;
    }
  } else if (argc > 1) {
    trials = std::max(1, std::atoi(argv[1]));
  }
  std::FILE* dump = nullptr;
  if (!replay && argc > 3 && std::string(argv[2]) == "--dump") dump = std::fopen(argv[3], "wb");
  const int smem = static_cast<int>(sizeof(ProbeSmem));
  if (!replay) {
    cudaFuncAttributes attr{};
    if (!ok(cudaFuncGetAttributes(&attr, wgmma_sum_kernel<1>), "cudaFuncGetAttributes")) return 1;
    if (attr.binaryVersion != 90) {
      std::printf("no sm_90a code for this device: nothing measured\n");
      return 1;
    }
    ok(cudaFuncSetAttribute(wgmma_sum_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            smem), "attr");
    ok(cudaFuncSetAttribute(wgmma_sum_kernel<4>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            smem), "attr");
  }

  std::vector<Model> models;
  models.push_back(Model{0, false, true, false});
  for (int bits = 10; bits <= 26; ++bits)
    for (int es = 0; es < 2; ++es)
      for (int ca = 0; ca < 2; ++ca)
        for (int rz = 0; rz < 2; ++rz) models.push_back(Model{bits, es != 0, ca != 0, rz != 0});
  const auto name = [](const Model& m) {
    if (m.bits == 0) return std::string("f32");
    char buf[96];
    std::snprintf(buf, sizeof buf, "trunc bits=%d %s %s %s", m.bits,
                  m.exp_sum ? "exp=ea+eb+1" : "exp=ilogb", m.c_aligned ? "C-aligned" : "C-after",
                  m.final_rz ? "RZ" : "RN");
    return std::string(buf);
  };

  std::uint8_t *da = nullptr, *db = nullptr;
  float *dc = nullptr, *dd = nullptr;
  if (!replay) {
    ok(cudaMalloc(&da, 64 * kK), "malloc");
    ok(cudaMalloc(&db, 64 * kK), "malloc");
    ok(cudaMalloc(&dc, 64 * 64 * sizeof(float)), "malloc");
    ok(cudaMalloc(&dd, 64 * 64 * sizeof(float)), "malloc");
  }

  std::mt19937 rng(20261205);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const char* dists[] = {"uniform codes", "N(0,1) rounded", "N(0,1), one column x64"};
  std::vector<long long> total_hits(models.size(), 0);
  long long total = 0;
  for (int dist = 0; dist < 3; ++dist)
    for (int steps : {1, 4})
      for (int use_c = 0; use_c < 2; ++use_c) {
        std::vector<long long> hits(models.size(), 0);
        long long n = 0;
        // Error statistics in units of 2^-13 of the largest term of the chain (accumulator
        // start or product): the GPU, and the models the accuracy tool uses.
        struct ErrStat {
          double sq = 0, max = 0;
          void add(double e) { sq += e * e, max = std::max(max, std::fabs(e)); }
        };
        ErrStat err_gpu;
        std::vector<ErrStat> err_model(models.size());
        for (int trial = 0; trial < trials; ++trial) {
          std::vector<std::uint8_t> a(64 * kK), b(64 * kK);
          std::vector<float> c(64 * 64), d(64 * 64, NAN);
          if (replay) {
            std::int32_t head[3] = {-1, -1, -1};
            const bool read = std::fread(head, sizeof head, 1, replay) == 1 &&
                              std::fread(a.data(), 1, a.size(), replay) == a.size() &&
                              std::fread(b.data(), 1, b.size(), replay) == b.size() &&
                              std::fread(c.data(), sizeof(float), c.size(), replay) == c.size() &&
                              std::fread(d.data(), sizeof(float), d.size(), replay) == d.size();
            if (!read || head[0] != dist || head[1] != steps || head[2] != use_c) {
              std::fprintf(stderr, "replay: launch %d of (%d, %d, %d) not found in order\n",
                           trial, dist, steps, use_c);
              return 1;
            }
          } else {
          for (int i = 0; i < 64 * kK; ++i) {
            if (dist == 0) {
              a[i] = mlakit::testing::random_e4m3(rng);
              b[i] = mlakit::testing::random_e4m3(rng);
            } else {  // the nearest e4m3fn values, ties to even
              const float big = (dist == 2 && i % kK == 5) ? 64.0f : 1.0f;
              a[i] = mlakit::encode_e4m3fn(normal(rng) * big);
              b[i] = mlakit::encode_e4m3fn(normal(rng));
            }
          }
          for (auto& x : c) {
            const double mag = dist == 0 ? std::ldexp(1.0 + unit(rng), int(unit(rng) * 40) - 16)
                                         : 16.0 * std::fabs(normal(rng));
            x = static_cast<float>(unit(rng) < 0.5 ? -mag : mag);
          }
          ok(cudaMemcpy(da, a.data(), a.size(), cudaMemcpyHostToDevice), "copy");
          ok(cudaMemcpy(db, b.data(), b.size(), cudaMemcpyHostToDevice), "copy");
          ok(cudaMemcpy(dc, c.data(), c.size() * sizeof(float), cudaMemcpyHostToDevice), "copy");
          if (steps == 1)
            wgmma_sum_kernel<1><<<1, 128, smem>>>(da, db, dc, use_c, dd);
          else
            wgmma_sum_kernel<4><<<1, 128, smem>>>(da, db, dc, use_c, dd);
          if (!ok(cudaGetLastError(), "launch") || !ok(cudaDeviceSynchronize(), "sync")) return 1;
          ok(cudaMemcpy(d.data(), dd, d.size() * sizeof(float), cudaMemcpyDeviceToHost), "copy");
          if (dump) {
            const std::int32_t head[3] = {dist, steps, use_c};
            std::fwrite(head, sizeof head, 1, dump);
            std::fwrite(a.data(), 1, a.size(), dump);
            std::fwrite(b.data(), 1, b.size(), dump);
            std::fwrite(c.data(), sizeof(float), c.size(), dump);
            std::fwrite(d.data(), sizeof(float), d.size(), dump);
          }
          }
          for (int r = 0; r < 64; ++r)
            for (int col = 0; col < 64; ++col) {
              const float got = d[r * 64 + col];
              ++n;
              Step st[4];
              double exact = use_c ? double(c[r * 64 + col]) : 0.0, top = std::fabs(exact);
              for (int ks = 0; ks < steps; ++ks) {
                st[ks] = make_step(&a[r * kK + 32 * ks], &b[col * kK + 32 * ks]);
                for (double p : st[ks].prod) exact += p, top = std::max(top, std::fabs(p));
              }
              const double unit = top > 0 ? std::ldexp(1.0, std::ilogb(top) - 13) : 1.0;
              err_gpu.add((double(got) - exact) / unit);
              for (std::size_t mi = 0; mi < models.size(); ++mi) {
                float acc = use_c ? c[r * 64 + col] : 0.0f;
                for (int ks = 0; ks < steps; ++ks) acc = model_step(acc, st[ks], models[mi]);
                if (acc == got || (acc == 0 && got == 0)) ++hits[mi];
                err_model[mi].add((double(acc) - exact) / unit);
              }
            }
        }
        std::printf("== %s, %d k-step(s), accumulator %s: %lld elements\n", dists[dist], steps,
                    use_c ? "random f32" : "zero", n);
        std::vector<std::size_t> order(models.size());
        for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
        std::stable_sort(order.begin(), order.end(),
                         [&](std::size_t x, std::size_t y) { return hits[x] > hits[y]; });
        for (std::size_t i = 0; i < std::min<std::size_t>(6, order.size()); ++i)
          std::printf("  %8.4f%%  %s\n", 100.0 * double(hits[order[i]]) / double(n),
                      name(models[order[i]]).c_str());
        std::printf("  %8.4f%%  %s\n", 100.0 * double(hits[0]) / double(n), name(models[0]).c_str());
        std::printf("  error, units of 2^-13 of the largest term: GPU rms %.3f max %.2f\n",
                    std::sqrt(err_gpu.sq / double(n)), err_gpu.max);
        for (std::size_t mi = 0; mi < models.size(); ++mi) {
          const Model& m = models[mi];
          if (m.bits != 0 && (m.bits < 12 || m.bits > 15 || m.exp_sum || !m.c_aligned || m.final_rz))
            continue;
          std::printf("  error, units of 2^-13 of the largest term: %-44s rms %.3f max %.2f\n",
                      name(m).c_str(), std::sqrt(err_model[mi].sq / double(n)), err_model[mi].max);
        }
        for (std::size_t mi = 0; mi < models.size(); ++mi) total_hits[mi] += hits[mi];
        total += n;
      }
  std::printf("== all distributions and chains: %lld elements\n", total);
  std::vector<std::size_t> order(models.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
    return total_hits[x] > total_hits[y];
  });
  for (std::size_t i = 0; i < std::min<std::size_t>(10, order.size()); ++i)
    std::printf("  %8.4f%%  %s\n", 100.0 * double(total_hits[order[i]]) / double(total),
                name(models[order[i]]).c_str());
  if (!replay) cudaFree(da), cudaFree(db), cudaFree(dc), cudaFree(dd);
  if (dump) std::fclose(dump);
  if (replay) std::fclose(replay);
  return 0;
}
