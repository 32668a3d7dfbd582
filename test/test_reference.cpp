// Host tests of reference/decode_reference.hpp against an independent naive formula over dense
// double arrays. The paged cache is built by scattering the dense rows into randomly permuted
// pages; every byte the reference must not read (unused pages, the tail of the last page, row
// and page padding, unused block-table slots) holds a NaN pattern, so a wrong read shows up.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "mlakit/core/attention_math.hpp"
#include "mlakit/core/numeric.hpp"
#include "mlakit/reference/decode_reference.hpp"

using namespace mlakit;
using reference::ReferenceOutput;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct CaseSpec {
  DType q_type = DType::bf16;
  DType kv_type = DType::bf16;
  PageIds ids = PageIds::block_table;
  int heads = 1, q_len = 1, page_size = 16;
  bool causal = true;
  std::vector<int> lens;  // dense keys per request (the effective kv_len)
  bool padded = false;    // non-packed Q / cache strides, Q laid out [batch, heads, q_len]
  bool clamp = false;     // tell kv_len + 5 where a request fills its page capacity exactly
  float kv_scale = 1.0f;
  float softmax_scale = 0.07f;
  std::uint64_t seed = 1;
};

CaseSpec spec(PageIds ids, int page_size, int heads, int q_len, bool causal, std::vector<int> lens,
              std::uint64_t seed) {
  CaseSpec c;
  c.ids = ids;
  c.page_size = page_size;
  c.heads = heads;
  c.q_len = q_len;
  c.causal = causal;
  c.lens = std::move(lens);
  c.seed = seed;
  return c;
}

// A built case: storage for the paged inputs, the DecodeArgs over it, and the dense truth.
struct Built {
  DecodeArgs a;
  std::vector<std::uint16_t> q, kv16;
  std::vector<std::uint8_t> kv8;
  std::vector<std::int32_t> table, indptr, indices, kv_len;
  std::vector<double> qd;               // [batch, q_len, heads, 576]
  std::vector<std::vector<double>> kd;  // [batch][len, 576], already times kv_scale
};

std::uint16_t nan16(DType t) { return t == DType::bf16 ? 0x7FC0 : 0x7E00; }
std::uint8_t nan8(DType t) { return t == DType::fp8_e4m3fn ? 0x7F : 0x80; }

// Random magnitude in [lo, hi], random sign: never zero.
float nonzero(std::mt19937_64& g, float lo, float hi) {
  std::uniform_real_distribution<float> m(lo, hi);
  return (g() & 1) ? m(g) : -m(g);
}

Built build(const CaseSpec& c) {
  Built B;
  std::mt19937_64 g(c.seed);
  const int batch = int(c.lens.size()), ps = c.page_size;
  DecodeArgs& a = B.a;
  a.q_type = c.q_type;
  a.kv_type = c.kv_type;
  a.batch = batch;
  a.num_heads = c.heads;
  a.q_len = c.q_len;
  a.causal = c.causal;
  a.page_size = ps;
  a.page_ids = c.ids;
  a.kv_scale = c.kv_scale;
  a.softmax_scale = c.softmax_scale;

  // Page counts: exactly the pages holding the keys, plus one spare (NaN) page per request
  // unless the clamp case needs capacity == len.
  std::vector<int> pages(batch);
  int used = 0, max_pages = 0;
  for (int b = 0; b < batch; ++b) {
    pages[b] = (c.lens[b] + ps - 1) / ps;
    used += pages[b];
    max_pages = std::max(max_pages, pages[b]);
  }
  const int spare = c.clamp ? 0 : 1;
  a.max_pages_per_request = max_pages + spare;
  set_packed_strides(a);
  if (c.padded) {
    a.q_stride_token = kHeadDimQK + 24;
    a.q_stride_head = std::int64_t(c.q_len) * a.q_stride_token + 8;
    a.q_stride_batch = std::int64_t(c.heads) * a.q_stride_head + 40;
    a.kv_stride_token = kHeadDimQK + 32;
    a.kv_stride_page = std::int64_t(ps) * a.kv_stride_token + 64;
    a.block_table_stride = a.max_pages_per_request + 3;
  }
  const int unused = 3 + int(g() % 4);
  const int num_pages = used + unused;
  std::vector<std::int32_t> perm(num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), g);
  auto nan_page = [&]() { return perm[used + int(g() % unused)]; };

  // Q: dense values are what the stored bits decode to.
  B.q.assign(std::size_t(batch) * a.q_stride_batch, nan16(c.q_type));
  B.qd.assign(std::size_t(batch) * c.q_len * c.heads * kHeadDimQK, 0.0);
  for (int b = 0; b < batch; ++b)
    for (int t = 0; t < c.q_len; ++t)
      for (int h = 0; h < c.heads; ++h)
        for (int d = 0; d < kHeadDimQK; ++d) {
          const float x = nonzero(g, 0.25f, 2.0f);
          const std::uint16_t bits = c.q_type == DType::bf16 ? encode_bf16(x) : encode_fp16(x);
          B.q[b * a.q_stride_batch + t * a.q_stride_token + h * a.q_stride_head + d] = bits;
          B.qd[((std::size_t(b) * c.q_len + t) * c.heads + h) * kHeadDimQK + d] =
              c.q_type == DType::bf16 ? decode_bf16(bits) : decode_fp16(bits);
        }

  // Cache: every element NaN, then the keys written through the page mapping.
  const bool fp8 = is_fp8(c.kv_type);
  const std::size_t kv_elems = std::size_t(num_pages) * a.kv_stride_page;
  if (fp8)
    B.kv8.assign(kv_elems, nan8(c.kv_type));
  else
    B.kv16.assign(kv_elems, nan16(c.kv_type));
  B.kd.resize(batch);
  int next = 0;
  std::vector<std::vector<std::int32_t>> req_pages(batch);
  for (int b = 0; b < batch; ++b) {
    for (int i = 0; i < pages[b]; ++i) req_pages[b].push_back(perm[next++]);
    B.kd[b].assign(std::size_t(c.lens[b]) * kHeadDimQK, 0.0);
    for (int j = 0; j < c.lens[b]; ++j) {
      const std::int64_t row =
          req_pages[b][j / ps] * a.kv_stride_page + (j % ps) * a.kv_stride_token;
      for (int d = 0; d < kHeadDimQK; ++d) {
        double v = 0.0;
        do {
          const float x = nonzero(g, fp8 ? 0.05f : 0.25f, fp8 ? 6.0f : 2.0f);
          if (fp8) {
            const std::uint8_t bits =
                c.kv_type == DType::fp8_e4m3fn ? encode_e4m3fn(x) : encode_e4m3fnuz(x);
            B.kv8[row + d] = bits;
            v = decode_fp8(c.kv_type, bits);
          } else {
            const std::uint16_t bits = c.kv_type == DType::bf16 ? encode_bf16(x) : encode_fp16(x);
            B.kv16[row + d] = bits;
            v = c.kv_type == DType::bf16 ? decode_bf16(bits) : decode_fp16(bits);
          }
        } while (v == 0.0);
        B.kd[b][std::size_t(j) * kHeadDimQK + d] = v * double(c.kv_scale);
      }
    }
    for (int s = 0; s < spare; ++s) req_pages[b].push_back(nan_page());
  }
  a.q = B.q.data();
  a.kv = fp8 ? static_cast<const void*>(B.kv8.data()) : static_cast<const void*>(B.kv16.data());

  // Page ids, and kv_len as told to the reference.
  if (c.ids == PageIds::block_table) {
    const std::int64_t row = block_table_row_stride(a);  // 0 in a.block_table_stride: packed
    B.table.assign(std::size_t(batch) * row, 0);
    for (auto& id : B.table) id = nan_page();
    for (int b = 0; b < batch; ++b)
      for (std::size_t i = 0; i < req_pages[b].size(); ++i) B.table[b * row + i] = req_pages[b][i];
    a.block_table = B.table.data();
  } else {
    B.indptr.push_back(0);
    for (int b = 0; b < batch; ++b) {
      B.indices.insert(B.indices.end(), req_pages[b].begin(), req_pages[b].end());
      B.indptr.push_back(std::int32_t(B.indices.size()));
    }
    B.indices.push_back(nan_page());  // never read: after kv_indptr[batch]
    a.kv_indptr = B.indptr.data();
    a.kv_indices = B.indices.data();
  }
  for (int b = 0; b < batch; ++b) {
    const int cap = c.ids == PageIds::block_table ? a.max_pages_per_request * ps
                                                  : (B.indptr[b + 1] - B.indptr[b]) * ps;
    B.kv_len.push_back(c.clamp && c.lens[b] == cap ? c.lens[b] + 5 : c.lens[b]);
  }
  a.kv_len = B.kv_len.data();
  return B;
}

// The naive formula on dense arrays: causal window written out, LSE = log(sum exp(S)) with
// no max subtraction (scores here are small), O = sum exp(S - LSE) * V.
ReferenceOutput naive(const Built& B) {
  const DecodeArgs& a = B.a;
  ReferenceOutput r;
  const std::size_t rows = std::size_t(a.batch) * a.q_len * a.num_heads;
  r.out.assign(rows * kHeadDimV, 0.0);
  r.lse.assign(rows, -kInf);
  for (int b = 0; b < a.batch; ++b) {
    const int len = int(B.kd[b].size() / kHeadDimQK);
    for (int t = 0; t < a.q_len; ++t)
      for (int h = 0; h < a.num_heads; ++h) {
        const std::size_t row = (std::size_t(b) * a.q_len + t) * a.num_heads + h;
        const double* q = &B.qd[row * kHeadDimQK];
        std::vector<double> s;
        for (int j = 0; j < len; ++j) {
          if (a.causal && j > len - a.q_len + t) continue;
          double dot = 0.0;
          for (int d = 0; d < kHeadDimQK; ++d)
            dot += q[d] * B.kd[b][std::size_t(j) * kHeadDimQK + d];
          s.push_back(a.softmax_scale * dot);
        }
        if (s.empty()) continue;
        double sum = 0.0;
        for (double v : s) sum += std::exp(v);
        r.lse[row] = std::log(sum);
        for (std::size_t j = 0; j < s.size(); ++j) {
          const double p = std::exp(s[j] - r.lse[row]);
          for (int d = 0; d < kHeadDimV; ++d)
            r.out[row * kHeadDimV + d] += p * B.kd[b][j * kHeadDimQK + d];
        }
      }
  }
  return r;
}

std::string describe(const CaseSpec& c) {
  std::string s = std::string("q ") + dtype_name(c.q_type) + ", kv " + dtype_name(c.kv_type) +
                  (c.ids == PageIds::csr ? ", csr" : ", block table") + ", page " +
                  std::to_string(c.page_size) + ", heads " + std::to_string(c.heads) + ", q_len " +
                  std::to_string(c.q_len) + (c.causal ? ", causal" : ", non-causal") +
                  (c.padded ? ", padded" : "") + (c.clamp ? ", clamp" : "") + ", kv_scale " +
                  std::to_string(c.kv_scale) + ", lens";
  for (int l : c.lens) s += " " + std::to_string(l);
  return s;
}

// Runs the reference on a built case and compares with the naive formula.
void check_against_naive(const CaseSpec& c) {
  INFO(describe(c));
  const Built B = build(c);
  ReferenceOutput r;
  const Status s = reference::decode_reference(B.a, &r);
  INFO(s.message());
  REQUIRE(s.is_ok());
  const ReferenceOutput n = naive(B);
  CHECK(reference::rel_l2_error(n.out, r.out) < 1e-12);
  CHECK(reference::max_lse_error(n.lse, r.lse) < 1e-12);
}

}  // namespace

TEST_CASE("reference matches the naive formula over page formats, sizes, heads, q_len, causal",
          "[reference]") {
  std::uint64_t seed = 100;
  for (PageIds ids : {PageIds::block_table, PageIds::csr})
    for (int ps : {1, 3, 16, 64})
      for (auto hq : {std::pair<int, int>{1, 1}, {12, 3}, {16, 8}})
        for (bool causal : {true, false}) {
          // Lengths: q_len + 17, a random one, and one crossing at least one page boundary.
          CaseSpec c = spec(ids, ps, hq.first, hq.second, causal,
                            {hq.second + 17, 5 + int(seed % 61), ps == 64 ? 70 : 50}, seed);
          c.padded = (seed++ % 2) == 1;
          check_against_naive(c);
        }
}

TEST_CASE("kv_len 0 and kv_len < q_len give O = 0 and LSE = -inf for rows without keys",
          "[reference]") {
  for (PageIds ids : {PageIds::block_table, PageIds::csr})
    for (bool causal : {true, false}) {
      const CaseSpec c = spec(ids, 3, 12, 8, causal, {0, 3, 8, 1, 0}, 7 + int(causal));
      check_against_naive(c);
      const Built B = build(c);
      ReferenceOutput r;
      REQUIRE(reference::decode_reference(B.a, &r).is_ok());
      for (int b = 0; b < B.a.batch; ++b)
        for (int t = 0; t < c.q_len; ++t) {
          const bool empty = visible_keys(c.lens[b], c.q_len, t, causal) == 0;
          INFO("b " << b << " t " << t << " causal " << causal);
          CHECK(empty == (c.lens[b] == 0 || (causal && t < c.q_len - c.lens[b])));
          for (int h = 0; h < c.heads; ++h) {
            const std::size_t row = (std::size_t(b) * c.q_len + t) * c.heads + h;
            if (!empty) {
              CHECK(std::isfinite(r.lse[row]));
              continue;
            }
            CHECK(r.lse[row] == -kInf);
            CHECK(std::all_of(&r.out[row * kHeadDimV], &r.out[(row + 1) * kHeadDimV],
                              [](double v) { return v == 0.0; }));
          }
        }
    }
}

TEST_CASE("fp8 and 16-bit caches with kv_scale != 1, bf16 and fp16 Q", "[reference]") {
  std::uint64_t seed = 300;
  for (DType kv : {DType::fp8_e4m3fn, DType::fp8_e4m3fnuz, DType::bf16, DType::fp16})
    for (DType q : {DType::bf16, DType::fp16})
      for (float scale : {0.37f, 1.75f}) {
        const PageIds ids = (seed % 2) ? PageIds::csr : PageIds::block_table;
        CaseSpec c = spec(ids, 16, 16, 3, true, {40, 3, 17}, seed);
        c.q_type = q;
        c.kv_type = kv;
        c.kv_scale = scale;
        c.softmax_scale = is_fp8(kv) ? 0.02f / scale : 0.07f / scale;  // keeps scores O(1)
        c.padded = (seed++ % 3) == 0;
        check_against_naive(c);
      }
}

TEST_CASE("kv_len beyond the page capacity is clamped to it", "[reference]") {
  for (PageIds ids : {PageIds::block_table, PageIds::csr}) {
    // csr: 48 and 32 fill their pages; block table: 48 fills all 3 pages of every request.
    CaseSpec c = spec(ids, 16, 12, 3, true, {48, 20, 32}, 77);
    c.clamp = true;
    const Built B = build(c);
    CHECK(B.kv_len[0] == 53);  // told more than the capacity
    check_against_naive(c);
  }
}

TEST_CASE("split-then-merge over disjoint key ranges equals the unsplit reference", "[reference]") {
  CaseSpec c = spec(PageIds::csr, 16, 12, 8, true, {100, 5, 0}, 555);
  c.kv_type = DType::fp8_e4m3fn;
  c.kv_scale = 0.5f;
  c.softmax_scale = 0.05f;
  const Built B = build(c);
  ReferenceOutput whole;
  REQUIRE(reference::decode_reference(B.a, &whole).is_ok());
  // Cuts include an empty first part, a part past the causal window, and uneven splits.
  const std::vector<std::vector<int>> cuts = {{0, 0, 37, 1000}, {0, 64, 99, 1000}, {0, 3, 1000}};
  std::vector<double> merged_d(whole.out.size(), 0.0), merged_f(whole.out.size(), 0.0);
  std::vector<double> lse_d(whole.lse.size()), lse_f(whole.lse.size());
  for (const auto& cut : cuts) {
    for (int b = 0; b < B.a.batch; ++b)
      for (int t = 0; t < c.q_len; ++t)
        for (int h = 0; h < c.heads; ++h) {
          const std::size_t row = (std::size_t(b) * c.q_len + t) * c.heads + h;
          const std::size_t parts = cut.size() - 1;
          std::vector<double> o(parts * kHeadDimV), l(parts);
          for (std::size_t p = 0; p < parts; ++p)
            REQUIRE(reference::decode_reference_range(B.a, b, t, h, cut[p], cut[p + 1],
                                                      &o[p * kHeadDimV], &l[p])
                        .is_ok());
          // Double-precision merge (the formula LseMerge implements): must match to 1e-12.
          double m = -kInf;
          for (double v : l) m = std::max(m, v);
          double sum = 0.0;
          for (double v : l) sum += v == -kInf ? 0.0 : std::exp(v - m);
          lse_d[row] = sum > 0.0 ? m + std::log(sum) : -kInf;
          // mlakit::LseMerge itself (float, as on the device): float accuracy.
          LseMerge merge;
          for (double v : l) merge.add(float(v));
          lse_f[row] = merge.lse();
          for (int d = 0; d < kHeadDimV; ++d) {
            double od = 0.0, of = 0.0;
            for (std::size_t p = 0; p < parts; ++p) {
              if (l[p] != -kInf) od += std::exp(l[p] - lse_d[row]) * o[p * kHeadDimV + d];
              of += double(merge.weight(float(l[p]))) * o[p * kHeadDimV + d];
            }
            merged_d[row * kHeadDimV + d] = od;
            merged_f[row * kHeadDimV + d] = of;
          }
        }
    INFO("cut " << cut[1] << " ...");
    CHECK(reference::rel_l2_error(whole.out, merged_d) < 1e-12);
    CHECK(reference::max_lse_error(whole.lse, lse_d) < 1e-12);
    CHECK(reference::rel_l2_error(whole.out, merged_f) < 1e-6);
    CHECK(reference::max_lse_error(whole.lse, lse_f) < 1e-5);
  }
}

TEST_CASE("invalid reference inputs return a Status naming the argument", "[reference]") {
  const Built B = build(spec(PageIds::block_table, 16, 1, 1, true, {5}, 9));
  ReferenceOutput r;
  REQUIRE(reference::decode_reference(B.a, &r).is_ok());
  std::vector<std::int32_t> bad_table(B.table);
  bad_table[0] = -1;
  using Edit = void (*)(DecodeArgs&, const std::int32_t*);
  const std::vector<std::pair<const char*, Edit>> cases = {
      {"q is null", [](DecodeArgs& a, const std::int32_t*) { a.q = nullptr; }},
      {"kv is null", [](DecodeArgs& a, const std::int32_t*) { a.kv = nullptr; }},
      {"kv_len is null", [](DecodeArgs& a, const std::int32_t*) { a.kv_len = nullptr; }},
      {"page_size 0", [](DecodeArgs& a, const std::int32_t*) { a.page_size = 0; }},
      {"page_size -3", [](DecodeArgs& a, const std::int32_t*) { a.page_size = -3; }},
      {"num_heads 0", [](DecodeArgs& a, const std::int32_t*) { a.num_heads = 0; }},
      {"q_len 0", [](DecodeArgs& a, const std::int32_t*) { a.q_len = 0; }},
      {"q_type fp8_e4m3fn",
       [](DecodeArgs& a, const std::int32_t*) { a.q_type = DType::fp8_e4m3fn; }},
      {"block_table is null", [](DecodeArgs& a, const std::int32_t*) { a.block_table = nullptr; }},
      {"kv_indptr is null", [](DecodeArgs& a, const std::int32_t*) { a.page_ids = PageIds::csr; }},
      {"page id -1", [](DecodeArgs& a, const std::int32_t* bad) { a.block_table = bad; }},
  };
  for (const auto& [name, edit] : cases) {
    DecodeArgs a = B.a;
    edit(a, bad_table.data());
    const Status s = reference::decode_reference(a, &r);
    INFO(name << ": " << s.message());
    CHECK(s.code() == StatusCode::invalid_argument);
    CHECK(s.message().find(name) != std::string::npos);  // names the argument and its value
  }
  CHECK_FALSE(reference::decode_reference(B.a, nullptr).is_ok());
  double o[kHeadDimV], l;
  CHECK_FALSE(reference::decode_reference_range(B.a, 1, 0, 0, 0, 5, o, &l).is_ok());
}

TEST_CASE("comparison helpers handle zeros, NaN and infinities", "[reference]") {
  using reference::max_abs_error;
  using reference::max_lse_error;
  using reference::rel_l2_error;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  CHECK(rel_l2_error({3.0, 4.0}, std::vector<double>{3.0, 4.0}) == 0.0);
  CHECK(rel_l2_error({3.0, 4.0}, std::vector<double>{3.0, 4.5}) == Approx(0.1));
  CHECK(rel_l2_error({0.0, 0.0}, std::vector<double>{3.0, 4.0}) == Approx(5.0));
  CHECK(rel_l2_error({1.0, 2.0}, std::vector<double>{1.0, nan}) == kInf);
  CHECK(rel_l2_error({1.0, 2.0}, std::vector<float>{1.0f, 2.0f}) == 0.0);
  CHECK(rel_l2_error({1.0, 2.0}, std::vector<double>{1.0, kInf}) == kInf);
  CHECK(rel_l2_error({1.0}, std::vector<double>{1.0, 2.0}) == kInf);
  CHECK(max_abs_error({1.0, 2.0}, std::vector<double>{1.5, 1.0}) == 1.0);
  CHECK(max_abs_error({1.0, 2.0}, std::vector<double>{nan, 2.0}) == kInf);
  CHECK(max_abs_error({nan}, std::vector<double>{1.0}) == kInf);
  CHECK(max_lse_error({-kInf, 1.0},
                      std::vector<float>{-std::numeric_limits<float>::infinity(), 1.25f}) == 0.25);
  CHECK(max_lse_error({-kInf}, std::vector<double>{0.0}) == kInf);
  CHECK(max_lse_error({0.0}, std::vector<double>{-kInf}) == kInf);
  CHECK(max_lse_error({0.0}, std::vector<double>{nan}) == kInf);
}

TEST_CASE("lse_in_format: natural, +inf for rows without keys, base 2", "[reference][lse]") {
  const float kInfF = std::numeric_limits<float>::infinity();
  const float values[] = {-kInfF, -87.5f, -1.0f, 0.0f, 1e-30f, 0.75f, 13.25f, 1e30f};
  for (float v : values) {
    INFO("lse " << v);
    CHECK(lse_in_format(v, LseFormat::natural) == v);
    // FlashMLA's convention differs from the natural log only for a row without keys.
    CHECK(lse_in_format(v, LseFormat::natural_empty_is_inf) == (v == -kInfF ? kInfF : v));
    // log2(x) = ln(x) / ln(2), within one float rounding of the product; -inf stays -inf.
    const float b2 = lse_in_format(v, LseFormat::base2);
    if (v == -kInfF) {
      CHECK(b2 == -kInfF);
    } else {
      const double want = double(v) / std::log(2.0);
      CHECK(std::abs(double(b2) - want) <= std::abs(want) * 1.2e-7);
    }
  }
}
