// Error of candidate arithmetics for an fp8 matrix mode (both products on e4m3 tensor cores),
// next to the 16-bit compute path of the decode kernels, against the double-precision softmax
// attention on the same inputs. A measurement program, not a test: it prints a table
// (docs/design.md, "The fp8 matrix mode (not built): the error of its candidate arithmetic").
//
//   mlakit_fp8_matrix_error            the full table (about 12 minutes on 2 idle cores)
//   mlakit_fp8_matrix_error --check    the 16-bit arithmetic must reproduce the reference to
//                                      within its bf16 roundings, and two e4m3 planes must
//                                      hold every bf16 value of their range; exit status 1
//                                      otherwise
//
// Each row of the attention is modelled step by step as a mainloop computes it:
//   - Q: 16-bit as given, or divided by a per-row scale (a power of two, or the row's largest
//     magnitude over the format's largest value) and quantised to one e4m3 plane, or two
//     (hi = e4m3(x), lo = e4m3(x - hi)).
//   - K and V: the cache's fp8 values, exact in every arithmetic (the reference uses them too).
//   - S = Q K^T in k-steps (32 dims for e4m3 products, 16 for 16-bit ones), summed into an
//     accumulator either with f32 rounding per k-step or with the truncated alignment model of
//     an fp8 tensor core (below), optionally promoted to an f32 register sum every few k-steps.
//   - Online softmax over 64-key tiles in base 2 (running max, f32 exp2 and sums).
//   - P rounded to bf16 (16-bit path), or scaled by a power of two (2^8 for e4m3fn, 2^7 for
//     e4m3fnuz: P <= 1 onto the top binade) and quantised to one or two e4m3 planes.
//   - O += P V in k-steps over the tile's keys with the same accumulation model, rescaled by
//     the running max's alpha, optionally promoted every few tiles.
//   - The row sum l from the unrounded f32 P (as the kernels do now) or from the quantised P.
//   - The output rounded to bf16; LSE from the base-2 state. Split rows: each piece's output
//     normalised and rounded to bf16, merged in f32 with weights exp(lse_i - LSE).
// Truncated accumulation model (an assumption, not a measured hardware specification): each
// fp8 k-step aligns the accumulator and its 32 exact products to the largest exponent among
// them and keeps `bits` significant bits below it (truncation toward zero), then rounds the
// exact sum of the kept parts to f32. docs/design.md says why 13 bits is assumed.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "mlakit/core/numeric.hpp"

namespace {

constexpr int kDims = 576;     // latent 512 + rotary 64: the key length
constexpr int kVDims = 512;    // V = the latent part
constexpr int kTile = 64;      // keys per tile
constexpr double kScale = 0.07216878364870322;  // 1/sqrt(192), DeepSeek-V3's softmax scale
constexpr double kLog2e = 1.4426950408889634;

using Fp8 = mlakit::DType;  // fp8_e4m3fn or fp8_e4m3fnuz

double fp8_round(double x, Fp8 f) { return mlakit::decode_fp8(f, mlakit::encode_fp8(f, float(x))); }
double bf16_round(double x) { return mlakit::decode_bf16(mlakit::encode_bf16(float(x))); }

struct Arith {
  const char* name;
  int q_planes;     // 0: 16-bit Q as given; 1 or 2: e4m3 planes with a per-row scale
  int p_planes;     // 0: P rounded to bf16; 1 or 2: e4m3 planes of P x 2^8 (fnuz: 2^7)
  int acc_bits;     // 0: f32 rounding per k-step; > 0: the truncated model with this many bits
  int s_promote;    // S: k-steps per accumulator chain before an f32 register add (0: never)
  int o_promote;    // O: tiles per chain (0: never, the chain spans the whole row)
  bool l_quantised; // l from the quantised P instead of the f32 P
  bool q_pow2 = true;  // Q's scale a power of two (else amax / the format's largest value)
  int piece_tiles = 0; // split the row into pieces of this many tiles, merged by their LSEs
                       // as the combine kernel does (0: one piece)
};

// One k-step: acc + sum(t[0..n)), rounded as the accumulation model says.
double kstep(double acc, const double* t, int n, int bits) {
  if (bits == 0) {
    double s = acc;
    for (int i = 0; i < n; ++i) s += t[i];  // products of <= 8+8 significant bits: exact sums
    return float(s);                        // in double for these magnitudes, one f32 rounding
  }
  int e = INT32_MIN;
  if (acc != 0) e = std::ilogb(acc);
  for (int i = 0; i < n; ++i)
    if (t[i] != 0) e = std::max(e, std::ilogb(t[i]));
  if (e == INT32_MIN) return 0.0;
  const double quantum = std::ldexp(1.0, e + 1 - bits);
  double s = std::trunc(acc / quantum) * quantum;
  for (int i = 0; i < n; ++i) s += std::trunc(t[i] / quantum) * quantum;
  return float(s);
}

// Chained dot products: terms[k] for k < len, k-steps of `step` terms, a chain promoted to an
// f32 register sum every `promote` k-steps (0: one chain).
double chained_sum(const double* terms, int len, int step, int bits, int promote) {
  double reg = 0, chain = 0;
  int steps = 0;
  for (int k = 0; k < len; k += step) {
    chain = kstep(chain, terms + k, std::min(step, len - k), bits);
    if (promote > 0 && ++steps % promote == 0) {
      reg = float(reg + chain);
      chain = 0;
    }
  }
  return float(reg + chain);
}

struct RowResult {
  std::vector<double> out;  // 512, rounded to bf16
  double lse;
};

// Keys [j_begin, j_end) of one row, scores t (base 2, scaled): a piece's online softmax and
// P V, its output normalised and rounded to bf16 (as split pieces store it) and its LSE.
RowResult model_piece(const Arith& a, Fp8 fmt, const std::vector<double>& t,
                      const std::vector<double>& kv, int j_begin, int j_end) {
  const double pscale = a.p_planes == 0 ? 1.0 : (fmt == Fp8::fp8_e4m3fn ? 256.0 : 128.0);
  const int ostep = a.p_planes == 0 ? 16 : 32;
  double m = -INFINITY, l = 0;
  std::vector<double> oreg(kVDims, 0.0), ochain(kVDims, 0.0);
  std::vector<double> ph(kTile), pl(kTile), pt(2 * kTile);
  int tiles = 0;
  for (int j0 = j_begin; j0 < j_end; j0 += kTile) {
    const int n = std::min(kTile, j_end - j0);
    double mt = m;
    for (int j = 0; j < n; ++j) mt = std::max(mt, t[j0 + j]);
    const double alpha = m == -INFINITY ? 0.0 : double(float(std::exp2(m - mt)));
    m = mt;
    double lt = 0;
    for (int j = 0; j < n; ++j) {
      const double p = double(float(std::exp2(t[j0 + j] - m)));
      if (a.p_planes == 0) {
        ph[j] = bf16_round(p);
        pl[j] = 0;
      } else {
        ph[j] = fp8_round(p * pscale, fmt);
        pl[j] = a.p_planes == 2 ? fp8_round(p * pscale - ph[j], fmt) : 0.0;
      }
      lt += a.l_quantised ? (ph[j] + pl[j]) / pscale : p;
    }
    l = double(float(l * alpha + double(float(lt))));
    for (int d = 0; d < kVDims; ++d) {
      oreg[d] = double(float(oreg[d] * alpha));
      double chain = double(float(ochain[d] * alpha));
      for (int c = 0; c < n; c += ostep) {
        int e = 0;
        for (int j = c; j < std::min(c + ostep, n); ++j)
          pt[e++] = ph[j] * kv[std::size_t(j0 + j) * kDims + d];
        if (a.p_planes == 2)
          for (int j = c; j < std::min(c + ostep, n); ++j)
            pt[e++] = pl[j] * kv[std::size_t(j0 + j) * kDims + d];
        chain = kstep(chain, pt.data(), e, a.acc_bits);
      }
      ochain[d] = chain;
    }
    ++tiles;
    if (a.o_promote > 0 && tiles % a.o_promote == 0)
      for (int d = 0; d < kVDims; ++d) {
        oreg[d] = double(float(oreg[d] + ochain[d]));
        ochain[d] = 0;
      }
  }
  RowResult r;
  r.out.resize(kVDims);
  for (int d = 0; d < kVDims; ++d)
    r.out[d] = bf16_round(double(float(oreg[d] + ochain[d])) / pscale / l);
  r.lse = (m + std::log2(l)) / kLog2e;
  return r;
}


// One attention row: q (576, 16-bit values), kv (len x 576, fp8 values).
RowResult model_row(const Arith& a, Fp8 fmt, const std::vector<double>& q,
                    const std::vector<double>& kv, int len) {
  // Q planes
  std::vector<double> qh(kDims), ql(kDims, 0.0);
  double qs = 1.0;
  if (a.q_planes == 0) {
    qh = q;
  } else {
    double amax = 0;
    for (double x : q) amax = std::max(amax, std::fabs(x));
    // A power-of-two scale keeps x = q / scale a 16-bit value (bf16: 8 significant bits,
    // which two e4m3 planes hold exactly unless lo falls into e4m3's subnormals); the
    // largest one with amax / scale <= the format's largest value.
    qs = amax > 0 ? double(float(amax / mlakit::fp8_max(fmt))) : 1.0;
    if (a.q_pow2 && amax > 0) {
      qs = std::ldexp(1.0, std::ilogb(qs));
      if (amax / qs > mlakit::fp8_max(fmt)) qs *= 2;
    }
    for (int i = 0; i < kDims; ++i) {
      const double x = double(float(q[i] / qs));
      qh[i] = fp8_round(x, fmt);
      if (a.q_planes == 2) ql[i] = fp8_round(x - qh[i], fmt);
    }
  }
  const double row_factor = double(float(qs * double(float(kScale * kLog2e))));
  const int sstep = a.q_planes == 0 ? 16 : 32;
  std::vector<double> t(static_cast<std::size_t>(len));
  std::vector<double> terms(2 * kDims);
  for (int j = 0; j < len; ++j) {
    const double* k = &kv[std::size_t(j) * kDims];
    // Two planes: the hi and lo k-steps interleave in one accumulator (two wgmma per k-step).
    int n = 0;
    for (int c = 0; c < kDims; c += sstep) {
      for (int i = c; i < c + sstep; ++i) terms[n++] = qh[i] * k[i];
      if (a.q_planes == 2)
        for (int i = c; i < c + sstep; ++i) terms[n++] = ql[i] * k[i];
    }
    const double s = chained_sum(terms.data(), n, sstep, a.acc_bits,
                                 a.s_promote * (a.q_planes == 2 ? 2 : 1));
    t[j] = double(float(s * row_factor));
  }
  if (a.piece_tiles == 0 || len <= a.piece_tiles * kTile) return model_piece(a, fmt, t, kv, 0, len);
  // Pieces merged in f32 by their LSEs: weights exp(lse_i - LSE), the combine's rule.
  std::vector<RowResult> parts;
  for (int j0 = 0; j0 < len; j0 += a.piece_tiles * kTile)
    parts.push_back(model_piece(a, fmt, t, kv, j0, std::min(len, j0 + a.piece_tiles * kTile)));
  double mx = -INFINITY, sum = 0;
  for (const RowResult& p : parts) mx = std::max(mx, p.lse);
  for (const RowResult& p : parts) sum += double(float(std::exp(p.lse - mx)));
  RowResult r;
  r.lse = mx + std::log(sum);
  r.out.assign(kVDims, 0.0);
  for (const RowResult& p : parts) {
    const double w = double(float(std::exp(p.lse - r.lse)));
    for (int d = 0; d < kVDims; ++d) r.out[d] = double(float(r.out[d] + w * p.out[d]));
  }
  for (double& x : r.out) x = bf16_round(x);
  return r;
}

// The double-precision reference: softmax(scale q . k) v on the same values, and its LSE.
RowResult reference_row(const std::vector<double>& q, const std::vector<double>& kv, int len) {
  std::vector<double> s(static_cast<std::size_t>(len));
  double m = -INFINITY;
  for (int j = 0; j < len; ++j) {
    double acc = 0;
    for (int i = 0; i < kDims; ++i) acc += q[i] * kv[std::size_t(j) * kDims + i];
    s[j] = acc * kScale;
    m = std::max(m, s[j]);
  }
  double l = 0;
  RowResult r;
  r.out.assign(kVDims, 0.0);
  for (int j = 0; j < len; ++j) {
    const double p = std::exp(s[j] - m);
    l += p;
    for (int d = 0; d < kVDims; ++d) r.out[d] += p * kv[std::size_t(j) * kDims + d];
  }
  for (double& x : r.out) x /= l;
  r.lse = m + std::log(l);
  return r;
}

enum class Data { normal, outlier_qk, outlier_q };
const char* data_name(Data d) {
  return d == Data::normal ? "N(0,1)" : d == Data::outlier_qk ? "outliers Q+KV x8" : "outliers Q x32";
}

struct Inputs {
  std::vector<std::vector<double>> q;  // rows x 576 (bf16 values)
  std::vector<double> kv;              // len x 576 (fp8 values)
};

// Rows of Q against one request's cache. Outlier channels: 8 of the 576, the same for Q and
// the cache, multiplied by 8 in both (outlier_qk) or by 32 in Q only (outlier_q).
Inputs make_inputs(Data d, Fp8 fmt, int rows, int len, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<double> ch_mul_q(kDims, 1.0), ch_mul_kv(kDims, 1.0);
  if (d != Data::normal) {
    std::vector<int> ch(kDims);
    for (int i = 0; i < kDims; ++i) ch[i] = i;
    std::shuffle(ch.begin(), ch.end(), rng);
    for (int i = 0; i < 8; ++i) {
      ch_mul_q[ch[i]] = d == Data::outlier_qk ? 8.0 : 32.0;
      ch_mul_kv[ch[i]] = d == Data::outlier_qk ? 8.0 : 1.0;
    }
  }
  Inputs in;
  in.q.assign(std::size_t(rows), std::vector<double>(kDims));
  for (auto& row : in.q)
    for (int i = 0; i < kDims; ++i) row[i] = bf16_round(nd(rng) * ch_mul_q[i]);
  in.kv.resize(std::size_t(len) * kDims);
  for (int j = 0; j < len; ++j)
    for (int i = 0; i < kDims; ++i)
      in.kv[std::size_t(j) * kDims + i] = fp8_round(nd(rng) * ch_mul_kv[i], fmt);
  return in;
}

struct Errors {
  double rel_l2;   // ||O - O_ref|| / ||O_ref|| over all rows
  double lse_max;  // max |LSE - LSE_ref|
};

Errors measure(const Arith& a, Fp8 fmt, const Inputs& in, int len,
               const std::vector<RowResult>& ref) {
  const int rows = int(in.q.size());
  std::vector<RowResult> got(static_cast<std::size_t>(rows));
  const unsigned nt = std::max(1u, std::min(4u, std::thread::hardware_concurrency()));
  std::vector<std::thread> th;
  for (unsigned w = 0; w < nt; ++w)
    th.emplace_back([&, w] {
      for (int r = int(w); r < rows; r += int(nt)) got[r] = model_row(a, fmt, in.q[r], in.kv, len);
    });
  for (auto& x : th) x.join();
  double num = 0, den = 0, lse = 0;
  for (int r = 0; r < rows; ++r) {
    for (int d = 0; d < kVDims; ++d) {
      const double e = got[r].out[d] - ref[r].out[d];
      num += e * e;
      den += ref[r].out[d] * ref[r].out[d];
    }
    lse = std::max(lse, std::fabs(got[r].lse - ref[r].lse));
  }
  return {std::sqrt(num / den), lse};
}

std::vector<RowResult> reference_rows(const Inputs& in, int len) {
  std::vector<RowResult> ref;
  for (const auto& q : in.q) ref.push_back(reference_row(q, in.kv, len));
  return ref;
}

}  // namespace

int main(int argc, char** argv) {
  const bool check = argc > 1 && std::strcmp(argv[1], "--check") == 0;
  if (check) {
    // The 16-bit arithmetic against the reference: its only errors are the bf16 rounding of P
    // and of O (relative 2^-9 each), so a wrong step of the model (online softmax, alpha,
    // k-step chaining, scales) shows as an error far above the bound.
    const Arith exact{"f32, 16-bit", 0, 0, 0, 0, 0, false};
    bool ok = true;
    for (Fp8 fmt : {Fp8::fp8_e4m3fn, Fp8::fp8_e4m3fnuz}) {
      const int len = 200;
      const Inputs in = make_inputs(Data::normal, fmt, 8, len, 7);
      const auto ref = reference_rows(in, len);
      const Errors e = measure(exact, fmt, in, len, ref);
      std::printf("check %s: rel L2 %.3e, LSE %.3e\n", mlakit::dtype_name(fmt),
                  e.rel_l2, e.lse_max);
      ok = ok && e.rel_l2 < 4e-3 && e.lse_max < 1e-5;
      // The two-plane claim behind the Q arithmetic: every bf16 value x with
      // 2^-2 (e4m3fn; e4m3fnuz 2^-3) <= |x| <= the format's largest value is hi + lo exactly
      // (lo's last bit, 2^-7 of x's binade, is then no finer than the subnormal step).
      const double lowest = fmt == Fp8::fp8_e4m3fn ? 0.25 : 0.125;
      int inexact = 0, covered = 0;
      for (std::uint32_t bits = 0; bits < 0x10000u; ++bits) {
        const double x = mlakit::decode_bf16(std::uint16_t(bits));
        if (!(std::fabs(x) >= lowest && std::fabs(x) <= mlakit::fp8_max(fmt))) continue;
        ++covered;
        const double hi = fp8_round(x, fmt);
        if (hi + fp8_round(x - hi, fmt) != x) ++inexact;
      }
      std::printf("check %s: %d of %d bf16 values in range not exact in two planes\n",
                  mlakit::dtype_name(fmt), inexact, covered);
      ok = ok && inexact == 0 && covered > 0;
    }
    return ok ? 0 : 1;
  }
  const Arith ariths[] = {
      {"16-bit compute (kernels now)", 0, 0, 0, 0, 0, false},
      {"Q1 P1, f32 sums", 1, 1, 0, 0, 0, false, false},
      {"Q1 P1, 13-bit, S /4", 1, 1, 13, 4, 0, false, false},
      {"Q2 P1, f32 sums", 2, 1, 0, 0, 0, false},
      {"Q2 P1, 13-bit, no promotion", 2, 1, 13, 0, 0, false},
      {"Q2 P1, 13-bit, S /4", 2, 1, 13, 4, 0, false},
      {"Q2 P1, 13-bit, S /4, Q scale amax/max", 2, 1, 13, 4, 0, false, false},
      {"Q2 P1, 14-bit, S /4", 2, 1, 14, 4, 0, false},
      {"Q2 P1, 13-bit, S /4, O /1 tile", 2, 1, 13, 4, 1, false},
      {"Q2 P1, 13-bit, S /4, O /64 tiles", 2, 1, 13, 4, 64, false},
      {"Q2 P1, 13-bit, S /4, pieces of 64 tiles", 2, 1, 13, 4, 0, false, true, 64},
      {"Q2 P1, 13-bit, S /4, l from P8", 2, 1, 13, 4, 0, true},
      {"Q2 P2, 13-bit, no promotion", 2, 2, 13, 0, 0, false},
      {"Q2 P2, 13-bit, S /4, O /64 tiles", 2, 2, 13, 4, 64, false},
  };
  const int rows = 16;
  std::printf("# relative L2 of O (bf16 output) / max |LSE error| against the double reference,"
              " %d rows x 3 seeds per cell, softmax scale 1/sqrt(192)\n", rows);
  for (Data d : {Data::normal, Data::outlier_qk, Data::outlier_q})
    for (Fp8 fmt : {Fp8::fp8_e4m3fn, Fp8::fp8_e4m3fnuz})
      for (int len : {64, 1024, 8192, 32768}) {
        std::vector<Inputs> ins;
        std::vector<std::vector<RowResult>> refs;
        for (std::uint64_t seed : {1, 2, 3}) {
          ins.push_back(make_inputs(d, fmt, rows, len, seed * 1000 + std::uint64_t(len)));
          refs.push_back(reference_rows(ins.back(), len));
        }
        for (const Arith& a : ariths) {
          double worst = 0, sum = 0, lse = 0;
          for (std::size_t s = 0; s < ins.size(); ++s) {
            const Errors e = measure(a, fmt, ins[s], len, refs[s]);
            worst = std::max(worst, e.rel_l2);
            sum += e.rel_l2;
            lse = std::max(lse, e.lse_max);
          }
          std::printf("%-17s %-8s kv %5d  %-40s rel L2 mean %.2e max %.2e  LSE max %.1e\n",
                      data_name(d), mlakit::dtype_name(fmt), len, a.name,
                      sum / double(ins.size()), worst, lse);
          std::fflush(stdout);
        }
      }
  return 0;
}
