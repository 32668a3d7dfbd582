// GPU tests of merge_states() (api/merge_states.hpp):
//  - partial (O, LSE) of 2..8 key ranges of each row, from the double-precision reference and
//    rounded to the part type, merge to the reference decode over the whole KV, for every pair
//    of part and output types (bf16, fp16, fp32);
//  - the context-parallel flow: decode() on each shard of a request's pages, merged, equals the
//    reference decode over all of them;
//  - empty parts (LSE -inf or +inf) are never read, a row of empty parts gives O = 0 and
//    LSE = -inf; 1000 parts; head dims that leave a warp's last pass partial;
//  - strided views ([H, T] LSE included) write nothing outside them and give the same bits as
//    packed tensors; repeated calls and graph replays are bitwise equal.
// Outputs are poisoned with NaN before every launch, and the O of empty parts is NaN.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gpu_harness.hpp"
#include "gpu_require.hpp"

using namespace mlakit;
using namespace mlakit::testing;

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr float kInfF = std::numeric_limits<float>::infinity();

// One value of type t as raw bytes (2 or 4) at p.
void put_value(MergeDType t, unsigned char* p, double v) {
  if (t == MergeDType::fp32) {
    const float f = static_cast<float>(v);
    std::memcpy(p, &f, 4);
  } else {
    const std::uint16_t h = t == MergeDType::bf16 ? encode_bf16(static_cast<float>(v))
                                                  : encode_fp16(static_cast<float>(v));
    std::memcpy(p, &h, 2);
  }
}
double get_value(MergeDType t, const unsigned char* p) {
  if (t == MergeDType::fp32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return t == MergeDType::bf16 ? decode_bf16(h) : decode_fp16(h);
}

// Parts and outputs of one merge on the host and the device. Parts are [N, T, H, D] and
// [N, T, H]; outputs [T, H, D] and [T, H], packed unless a test sets other strides (the
// buffers are then sized by out_elems / lse_elems).
struct MergeProblem {
  MergeArgs host;  // shapes, types and strides; pointers set by upload()
  std::vector<unsigned char> part_o;
  std::vector<float> part_lse;
  std::size_t out_elems = 0, lse_elems = 0;
  DeviceBuffer d_part_o, d_part_lse, d_out, d_lse;
  MergeArgs dev;

  void init(MergeDType part, MergeDType out, int parts, int tokens, int heads, int dim) {
    host = MergeArgs{};
    host.part_type = part;
    host.out_type = out;
    host.num_parts = parts;
    host.num_tokens = tokens;
    host.num_heads = heads;
    host.head_dim = dim;
    set_packed_strides(host);
    const std::size_t rows = std::size_t(tokens) * heads;
    part_o.assign(std::size_t(parts) * rows * dim * merge_dtype_bytes(part), 0);
    part_lse.assign(std::size_t(parts) * rows, 0.0f);
    out_elems = rows * dim;
    lse_elems = rows;
  }
  unsigned char* o_at(int p, int t, int h, int d) {
    const MergeArgs& a = host;
    return part_o.data() +
           (p * a.part_o_stride_part + t * a.part_o_stride_token + h * a.part_o_stride_head + d) *
               merge_dtype_bytes(a.part_type);
  }
  float& lse_at(int p, int t, int h) {
    const MergeArgs& a = host;
    return part_lse[p * a.part_lse_stride_part + t * a.part_lse_stride_token +
                    h * a.part_lse_stride_head];
  }
  // An empty part: LSE -inf (or +inf) and an O of NaN, which must not be read.
  void set_empty(int p, int t, int h, bool pos_inf = false) {
    lse_at(p, t, h) = pos_inf ? kInfF : -kInfF;
    for (int d = 0; d < host.head_dim; ++d) put_value(host.part_type, o_at(p, t, h, d), NAN);
  }
  bool upload() {
    const std::size_t ob = merge_dtype_bytes(host.out_type);
    bool ok = d_part_o.reset(part_o.size()) && d_part_lse.reset(part_lse.size() * 4) &&
              d_out.reset(out_elems * ob) && d_lse.reset(lse_elems * 4) &&
              gpu_h2d(d_part_o.ptr, part_o.data(), part_o.size()) &&
              gpu_h2d(d_part_lse.ptr, part_lse.data(), part_lse.size() * 4);
    dev = host;
    dev.part_o = d_part_o.ptr;
    dev.part_lse = d_part_lse.as<float>();
    dev.out = d_out.ptr;
    dev.out_lse = d_lse.as<float>();
    return ok;
  }
  // Poisons both outputs with NaN (0xFF bytes), merges on `stream`, reads them back.
  Status run(std::vector<unsigned char>* out, std::vector<float>* lse, Stream stream = nullptr) {
    const std::size_t out_bytes = out_elems * merge_dtype_bytes(host.out_type);
    std::vector<unsigned char> nan_out(out_bytes, 0xFF);
    std::vector<float> nan_lse(lse_elems, NAN);
    if (!gpu_h2d(d_out.ptr, nan_out.data(), out_bytes) ||
        !gpu_h2d(d_lse.ptr, nan_lse.data(), lse_elems * 4))
      return Status(StatusCode::runtime_error, "poison copy failed");
    Status s = merge_states(dev, stream);
    if (!s) return s;
    if (!gpu_sync()) return Status(StatusCode::runtime_error, "merge kernel failed (see stderr)");
    out->resize(out_bytes);
    lse->resize(lse_elems);
    gpu_d2h(out->data(), d_out.ptr, out_bytes);
    gpu_d2h(lse->data(), d_lse.ptr, lse_elems * 4);
    return Status::ok();
  }
  // The merged rows read back as doubles, in [T, H, D] order through the output strides.
  std::vector<double> out_values(const std::vector<unsigned char>& out) const {
    const MergeArgs& a = host;
    std::vector<double> v(std::size_t(a.num_tokens) * a.num_heads * a.head_dim);
    for (int t = 0; t < a.num_tokens; ++t)
      for (int h = 0; h < a.num_heads; ++h)
        for (int d = 0; d < a.head_dim; ++d)
          v[(std::size_t(t) * a.num_heads + h) * a.head_dim + d] = get_value(
              a.out_type, out.data() + (t * a.out_stride_token + h * a.out_stride_head + d) *
                                           merge_dtype_bytes(a.out_type));
    return v;
  }
  std::vector<double> lse_values(const std::vector<float>& lse) const {
    const MergeArgs& a = host;
    std::vector<double> v(std::size_t(a.num_tokens) * a.num_heads);
    for (int t = 0; t < a.num_tokens; ++t)
      for (int h = 0; h < a.num_heads; ++h)
        v[std::size_t(t) * a.num_heads + h] =
            lse[t * a.out_lse_stride_token + h * a.out_lse_stride_head];
    return v;
  }
  // Double-precision merge of the parts as stored (rounded values), [T, H, D] and [T, H].
  void reference(std::vector<double>* out, std::vector<double>* lse) {
    const MergeArgs& a = host;
    out->assign(std::size_t(a.num_tokens) * a.num_heads * a.head_dim, 0.0);
    lse->assign(std::size_t(a.num_tokens) * a.num_heads, kNegInf);
    for (int t = 0; t < a.num_tokens; ++t)
      for (int h = 0; h < a.num_heads; ++h) {
        double m = kNegInf;
        for (int p = 0; p < a.num_parts; ++p) {
          const double l = lse_at(p, t, h);
          if (std::isfinite(l)) m = std::max(m, l);
        }
        if (m == kNegInf) continue;  // every part empty: O = 0, LSE = -inf
        double sum = 0.0;
        const std::size_t row = std::size_t(t) * a.num_heads + h;
        for (int p = 0; p < a.num_parts; ++p) {
          const double l = lse_at(p, t, h);
          if (!std::isfinite(l)) continue;
          const double w = std::exp(l - m);
          sum += w;
          for (int d = 0; d < a.head_dim; ++d)
            (*out)[row * a.head_dim + d] += w * get_value(a.part_type, o_at(p, t, h, d));
        }
        for (int d = 0; d < a.head_dim; ++d) (*out)[row * a.head_dim + d] /= sum;
        (*lse)[row] = m + std::log(sum);
      }
  }
};

// Random parts: O uniform in [-1, 1], LSE uniform in [-6, 6] (weights over 5 orders of
// magnitude), a fraction `empty` of the parts empty (half of those +inf).
void fill_random(MergeProblem& M, std::uint64_t seed, double empty = 0.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uni(-1.0, 1.0), u01(0.0, 1.0);
  const MergeArgs& a = M.host;
  for (int p = 0; p < a.num_parts; ++p)
    for (int t = 0; t < a.num_tokens; ++t)
      for (int h = 0; h < a.num_heads; ++h) {
        if (u01(rng) < empty) {
          M.set_empty(p, t, h, u01(rng) < 0.5);
          continue;
        }
        M.lse_at(p, t, h) = static_cast<float>(6.0 * uni(rng));
        for (int d = 0; d < a.head_dim; ++d) put_value(a.part_type, M.o_at(p, t, h, d), uni(rng));
      }
}

// Relative L2 bound of the merged O: the output rounding (bf16 2^-9, fp16 2^-11 per value).
double o_tolerance(MergeDType out) {
  return out == MergeDType::bf16 ? 1e-2 : out == MergeDType::fp16 ? 2e-3 : 1e-4;
}

void check_against(MergeProblem& M, const std::vector<double>& ref_out,
                   const std::vector<double>& ref_lse, double o_tol, double lse_tol) {
  std::vector<unsigned char> out;
  std::vector<float> lse;
  const Status s = M.run(&out, &lse);
  INFO(s.message());
  REQUIRE(s.is_ok());
  const std::vector<double> got = M.out_values(out), got_lse = M.lse_values(lse);
  const double rel = reference::rel_l2_error(ref_out, got);
  const double lse_err = reference::max_lse_error(ref_lse, got_lse);
  INFO("rel_l2 " << rel << " lse_err " << lse_err);
  CHECK(rel < o_tol);
  CHECK(lse_err < lse_tol);
  // Rows whose parts are all empty: exactly O = 0 (no NaN read) and LSE = -inf.
  for (std::size_t r = 0; r < ref_lse.size(); ++r)
    if (ref_lse[r] == kNegInf) {
      CHECK(got_lse[r] == kNegInf);
      for (int d = 0; d < M.host.head_dim; ++d) CHECK(got[r * M.host.head_dim + d] == 0.0);
    }
}

const MergeDType kTypes[] = {MergeDType::bf16, MergeDType::fp16, MergeDType::fp32};

}  // namespace

TEST_CASE("merge_states: partials of 2..8 key ranges merge to the decode over the whole KV",
          "[gpu][merge]") {
  MLAKIT_REQUIRE_GPU();
  Case c;
  c.q_type = DType::bf16;
  c.kv_type = DType::bf16;
  c.heads = 12;
  c.q_len = 3;
  c.causal = true;
  c.page_size = 16;
  c.kv_lens = {0, 2, 9, 300, 1000};  // no key, fewer keys than parts, q_len > kv_len
  c.seed = 41;
  TestProblem P;
  build(P, c);
  REQUIRE(P.ok);
  const DecodeArgs& a = P.host;
  const auto whole = run_reference(P);
  const int tokens = a.batch * a.q_len;
  struct Mix {
    MergeDType part, out;
    int parts;
  };
  std::vector<Mix> mixes;
  for (MergeDType p : kTypes)
    for (MergeDType o : kTypes) mixes.push_back({p, o, 3});
  for (int n : {2, 4, 5, 7, 8}) mixes.push_back({MergeDType::bf16, MergeDType::bf16, n});
  for (const Mix& mix : mixes) {
    INFO(merge_dtype_name(mix.part)
         << " parts -> " << merge_dtype_name(mix.out) << ", " << mix.parts << " parts");
    MergeProblem M;
    M.init(mix.part, mix.out, mix.parts, tokens, a.num_heads, kHeadDimV);
    for (int b = 0; b < a.batch; ++b) {
      const int len = c.kv_lens[b];
      for (int t = 0; t < a.q_len; ++t)
        for (int h = 0; h < a.num_heads; ++h)
          for (int p = 0; p < mix.parts; ++p) {
            // Contiguous ranges of unequal size: part p gets keys [len p^2 / n^2, ...).
            const int begin = int(std::int64_t(len) * p * p / (mix.parts * mix.parts));
            const int end = int(std::int64_t(len) * (p + 1) * (p + 1) / (mix.parts * mix.parts));
            double o[kHeadDimV], lse = 0.0;
            REQUIRE(reference::decode_reference_range(a, b, t, h, begin, end, o, &lse).is_ok());
            const int token = b * a.q_len + t;
            if (lse == kNegInf) {
              M.set_empty(p, token, h);
              continue;
            }
            M.lse_at(p, token, h) = static_cast<float>(lse);
            for (int d = 0; d < kHeadDimV; ++d) put_value(mix.part, M.o_at(p, token, h, d), o[d]);
          }
    }
    REQUIRE(M.upload());
    // Part rounding (bf16 parts: 2^-9) plus output rounding.
    const double o_tol = std::max(o_tolerance(mix.out), mix.part == MergeDType::bf16   ? 1e-2
                                                        : mix.part == MergeDType::fp16 ? 2e-3
                                                                                       : 0.0);
    check_against(M, whole.out, whole.lse, o_tol, 1e-4);
  }
}

TEST_CASE("merge_states: decode() of each shard of the pages, merged, is the decode of all",
          "[gpu][merge]") {
  MLAKIT_REQUIRE_GPU();
  for (DType kv : {DType::bf16, DType::fp8_e4m3fn})
    for (int shards : {2, 3, 8})
      for (int q_len : {1, 4}) {
        Case c;
        c.q_type = DType::bf16;
        c.kv_type = kv;
        c.heads = 16;
        c.q_len = q_len;
        c.causal = false;  // every shard sees all of its keys (a causal window is the last
                           // shard's alone, and only for q_len > 1)
        c.page_size = 16;
        c.ids = PageIds::csr;
        c.kv_lens = {1, 40, 333, 2000};
        c.seed = 100 + shards + q_len;
        TestProblem P;
        build(P, c);
        REQUIRE(P.ok);
        INFO(c.name() << ", " << shards << " shards");
        const DecodeArgs& a = P.dev;
        const int tokens = a.batch * a.q_len;
        MergeProblem M;
        M.init(MergeDType::bf16, MergeDType::bf16, shards, tokens, a.num_heads, kHeadDimV);
        REQUIRE(M.upload());
        // Shard s of request b: its pages [n_b s / S, n_b (s + 1) / S), as CSR page ids of its
        // own, and the tokens of those pages as its length.
        DeviceBuffer ws(workspace_for(P.dev));
        for (int s = 0; s < shards; ++s) {
          std::vector<std::int32_t> indptr(1, 0), indices, lens;
          for (int b = 0; b < a.batch; ++b) {
            const int n = P.indptr[b + 1] - P.indptr[b];
            const int first = n * s / shards, last = n * (s + 1) / shards;
            for (int i = first; i < last; ++i) indices.push_back(P.indices[P.indptr[b] + i]);
            indptr.push_back(static_cast<std::int32_t>(indices.size()));
            lens.push_back(
                std::max(0, std::min(c.kv_lens[b], last * c.page_size) - first * c.page_size));
          }
          if (indices.empty()) indices.push_back(0);
          DeviceBuffer d_indptr(indptr.size() * 4), d_indices(indices.size() * 4),
              d_lens(lens.size() * 4);
          REQUIRE(gpu_h2d(d_indptr.ptr, indptr.data(), indptr.size() * 4));
          REQUIRE(gpu_h2d(d_indices.ptr, indices.data(), indices.size() * 4));
          REQUIRE(gpu_h2d(d_lens.ptr, lens.data(), lens.size() * 4));
          DecodeArgs shard = a;
          shard.kv_indptr = d_indptr.as<std::int32_t>();
          shard.kv_indices = d_indices.as<std::int32_t>();
          shard.kv_len = d_lens.as<std::int32_t>();
          // Part s of the merge: [B * q_len, H, 512] and [B * q_len, H], packed as decode()'s.
          shard.out = static_cast<unsigned char*>(M.d_part_o.ptr) +
                      std::size_t(s) * M.host.part_o_stride_part * 2;
          shard.lse = M.d_part_lse.as<float>() + std::size_t(s) * M.host.part_lse_stride_part;
          const Status st = decode(shard, ws.ptr, ws.bytes, nullptr);
          INFO(st.message());
          REQUIRE(st.is_ok());
          REQUIRE(gpu_sync());
        }
        const auto whole = run_reference(P);
        check_against(M, whole.out, whole.lse, 1e-2, 1e-4);
      }
}

TEST_CASE("merge_states: empty parts are not read; rows of empty parts give O = 0, LSE = -inf",
          "[gpu][merge]") {
  MLAKIT_REQUIRE_GPU();
  for (MergeDType p : kTypes)
    for (MergeDType o : kTypes) {
      INFO(merge_dtype_name(p) << " -> " << merge_dtype_name(o));
      MergeProblem M;
      M.init(p, o, 6, 9, 4, 512);
      fill_random(M, 7 + int(p) * 3 + int(o), 0.4);
      for (int q = 0; q < 6; ++q) M.set_empty(q, 2, 1, q % 2 == 1);  // all empty, -inf and +inf
      for (int q = 0; q < 6; ++q) M.set_empty(q, 5, 3);              // all -inf
      for (int q = 1; q < 6; ++q) M.set_empty(q, 0, 0);              // only part 0
      REQUIRE(M.upload());
      std::vector<double> ref_out, ref_lse;
      M.reference(&ref_out, &ref_lse);
      check_against(M, ref_out, ref_lse, o_tolerance(o), 1e-5);
    }
}

TEST_CASE("merge_states: many parts, head dims that leave a pass partial, one token",
          "[gpu][merge]") {
  MLAKIT_REQUIRE_GPU();
  struct Shape {
    int parts, tokens, heads, dim;
  };
  for (const Shape& s :
       {Shape{1000, 2, 3, 512}, Shape{33, 5, 2, 8}, Shape{2, 3, 5, 1032}, Shape{5, 1, 128, 512},
        Shape{4096, 1, 1, 64}, Shape{1, 4, 4, 512}, Shape{3, 700, 16, 128}}) {
    INFO("parts " << s.parts << " tokens " << s.tokens << " heads " << s.heads << " dim " << s.dim);
    MergeProblem M;
    M.init(MergeDType::fp32, MergeDType::fp32, s.parts, s.tokens, s.heads, s.dim);
    fill_random(M, 1000 + s.parts + s.dim, 0.1);
    REQUIRE(M.upload());
    std::vector<double> ref_out, ref_lse;
    M.reference(&ref_out, &ref_lse);
    check_against(M, ref_out, ref_lse, 1e-4, 1e-5);
  }
}

TEST_CASE("merge_states: strided views write nothing outside them, same bits as packed",
          "[gpu][merge]") {
  MLAKIT_REQUIRE_GPU();
  const int N = 3, T = 6, H = 5, D = 512;
  MergeProblem packed;
  packed.init(MergeDType::bf16, MergeDType::bf16, N, T, H, D);
  fill_random(packed, 77, 0.2);
  REQUIRE(packed.upload());
  std::vector<unsigned char> packed_out;
  std::vector<float> packed_lse;
  REQUIRE(packed.run(&packed_out, &packed_lse).is_ok());

  // The same parts in [T, N, H, D + 8] and [H, N, T] layouts, merged into O [H, T, D + 16]
  // (token stride D + 16, head stride T (D + 16)) and LSE [H, T + 3] (vLLM's [heads, tokens]).
  MergeProblem M;
  M.init(MergeDType::bf16, MergeDType::bf16, N, T, H, D);
  MergeArgs& a = M.host;
  a.part_o_stride_head = D + 8;
  a.part_o_stride_part = H * a.part_o_stride_head;
  a.part_o_stride_token = N * a.part_o_stride_part;
  a.part_lse_stride_token = 1;
  a.part_lse_stride_part = T;
  a.part_lse_stride_head = N * T;
  a.out_stride_token = D + 16;
  a.out_stride_head = T * a.out_stride_token;
  a.out_lse_stride_token = 1;
  a.out_lse_stride_head = T + 3;
  M.part_o.assign(std::size_t(T) * a.part_o_stride_token * 2, 0);
  M.part_lse.assign(std::size_t(H) * a.part_lse_stride_head, 0.0f);
  for (int p = 0; p < N; ++p)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h) {
        M.lse_at(p, t, h) = packed.lse_at(p, t, h);
        std::memcpy(M.o_at(p, t, h, 0), packed.o_at(p, t, h, 0), D * 2);
      }
  M.out_elems = std::size_t(H) * a.out_stride_head;
  M.lse_elems = std::size_t(H) * a.out_lse_stride_head;
  REQUIRE(M.upload());
  std::vector<unsigned char> out;
  std::vector<float> lse;
  const Status s = M.run(&out, &lse);
  INFO(s.message());
  REQUIRE(s.is_ok());
  CHECK(M.out_values(out) == packed.out_values(packed_out));
  const auto l1 = M.lse_values(lse), l0 = packed.lse_values(packed_lse);
  CHECK(std::memcmp(l1.data(), l0.data(), l1.size() * sizeof(double)) == 0);
  // Padding of O (columns D..D+15 of each row) and of the LSE rows (T..T+2) stays NaN.
  std::size_t touched = 0;
  for (int h = 0; h < H; ++h)
    for (int t = 0; t < T; ++t)
      for (int d = D; d < D + 16; ++d) {
        std::uint16_t v;
        std::memcpy(&v, out.data() + (h * a.out_stride_head + t * a.out_stride_token + d) * 2, 2);
        touched += v != 0xFFFF;
      }
  for (int h = 0; h < H; ++h)
    for (int t = T; t < T + 3; ++t) touched += !std::isnan(lse[h * a.out_lse_stride_head + t]);
  CHECK(touched == 0);
}

TEST_CASE("merge_states: bitwise repeatable; a captured graph replays with new values",
          "[gpu][merge]") {
  MLAKIT_REQUIRE_GPU();
  MergeProblem M;
  M.init(MergeDType::bf16, MergeDType::fp16, 5, 64, 16, 512);
  fill_random(M, 5, 0.1);
  REQUIRE(M.upload());
  std::vector<unsigned char> o1, o2;
  std::vector<float> l1, l2;
  REQUIRE(M.run(&o1, &l1).is_ok());
  REQUIRE(M.run(&o2, &l2).is_ok());
  CHECK(o1 == o2);
  CHECK(std::memcmp(l1.data(), l2.data(), l1.size() * 4) == 0);

#if defined(MLAKIT_HAS_CUDA_RUNTIME_API)
  cudaStream_t stream;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  cudaGraph_t graph;
  REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
  const Status s = merge_states(M.dev, stream);
  REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
  INFO(s.message());
  REQUIRE(s.is_ok());
  cudaGraphExec_t exec;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  for (std::uint64_t step = 0; step < 3; ++step) {
    fill_random(M, 50 + step, 0.3);  // new values in the same buffers
    REQUIRE(gpu_h2d(M.d_part_o.ptr, M.part_o.data(), M.part_o.size()));
    REQUIRE(gpu_h2d(M.d_part_lse.ptr, M.part_lse.data(), M.part_lse.size() * 4));
    std::vector<unsigned char> nan_out(M.out_elems * 2, 0xFF);
    REQUIRE(gpu_h2d(M.d_out.ptr, nan_out.data(), nan_out.size()));
    REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    std::vector<unsigned char> replayed(M.out_elems * 2);
    std::vector<float> replayed_lse(M.lse_elems);
    REQUIRE(gpu_d2h(replayed.data(), M.d_out.ptr, replayed.size()));
    REQUIRE(gpu_d2h(replayed_lse.data(), M.d_lse.ptr, replayed_lse.size() * 4));
    std::vector<unsigned char> direct;
    std::vector<float> direct_lse;
    REQUIRE(M.run(&direct, &direct_lse).is_ok());
    CHECK(replayed == direct);
    CHECK(std::memcmp(replayed_lse.data(), direct_lse.data(), direct_lse.size() * 4) == 0);
    std::vector<double> ref_out, ref_lse;
    M.reference(&ref_out, &ref_lse);
    CHECK(reference::rel_l2_error(ref_out, M.out_values(replayed)) < o_tolerance(MergeDType::fp16));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
#endif
}

TEST_CASE("merge_states: a Status before any launch; no rows launch nothing", "[gpu][merge]") {
  MLAKIT_REQUIRE_GPU();
  MergeProblem M;
  M.init(MergeDType::bf16, MergeDType::bf16, 2, 3, 4, 512);
  fill_random(M, 3);
  REQUIRE(M.upload());
  MergeArgs a = M.dev;
  a.head_dim = 500;
  Status s = merge_states(a, nullptr);
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK(s.message() == "head_dim = 500: not in the supported domain (8..16384, a multiple of 8)");
  a = M.dev;
  a.out_stride_head = 8;
  CHECK(merge_states(a, nullptr).code() == StatusCode::invalid_argument);
  a = M.dev;
  a.num_tokens = 0;
  a.part_o = nullptr;
  a.out = nullptr;
  a.part_lse = nullptr;
  CHECK(merge_states(a, nullptr).is_ok());
  REQUIRE(gpu_sync());
}
