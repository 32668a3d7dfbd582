// spec_decode_verify: MLA decode for a speculative-decoding verify step, end to end.
//
// The shape is the one that aborts a production ROCm stack (see the README): bf16 Q, an fp8
// e4m3fn latent cache with one fp32 kv_scale, 16 query heads, q_len 8 (a 7-token draft plus
// the last accepted token), causal, page size 1 with CSR page ids (kv_indptr / kv_indices),
// as a serving engine passes them.
//
//   1. builds a batch of 8 requests of different lengths on the host, pages in random order;
//   2. runs mlakit::decode() and checks O and LSE against the double-precision host
//      reference (exit 1 if rel L2 >= 1e-2 or the LSE error >= 1e-4);
//   3. times decode() on 64 requests x 4096 tokens: median of 50 runs, KV read bandwidth and
//      FLOP rate.
// Built without a GPU backend, or run without a GPU, it says so and runs the reference only.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mlakit/mlakit.hpp>
#include <mlakit/reference/decode_reference.hpp>
#include <numeric>
#include <random>
#include <vector>

#include "example_gpu.hpp"

namespace {

using namespace mlakit;

constexpr int kHeads = 16;
constexpr int kQLen = 8;  // 7 draft tokens + 1

// A batch in host memory, laid out as a serving engine holds it.
struct HostBatch {
  DecodeArgs shape;                      // dtypes, sizes, strides, scales: no pointers yet
  std::vector<std::uint16_t> q;          // [batch, q_len, heads, 576] bf16 bits
  std::vector<std::uint8_t> kv;          // [pages, page_size 1, 576] fp8 e4m3fn bytes
  std::vector<std::int32_t> kv_indptr;   // [batch + 1]: b's pages are kv_indices[indptr[b]..[b+1])
  std::vector<std::int32_t> kv_indices;  // [sum(kv_len)]: the page of each token
  std::vector<std::int32_t> kv_len;      // [batch]: cached tokens, the q_len new ones included

  // The arguments with host pointers (what the reference reads).
  DecodeArgs host_args() const {
    DecodeArgs a = shape;
    a.q = q.data();
    a.kv = kv.data();
    a.kv_indptr = kv_indptr.data();
    a.kv_indices = kv_indices.data();
    a.kv_len = kv_len.data();
    return a;
  }
};

HostBatch make_batch(const std::vector<int>& lens, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  const int batch = static_cast<int>(lens.size());
  const int tokens = std::accumulate(lens.begin(), lens.end(), 0);
  HostBatch h;

  h.q.resize(std::size_t(batch) * kQLen * kHeads * kHeadDimQK);
  for (auto& v : h.q) v = encode_bf16(uni(rng));
  // fp8 codes spread over most of e4m3fn's range (max 448); kv_scale maps them back to ~[-1, 1].
  h.kv.resize(std::size_t(tokens) * kHeadDimQK);
  for (auto& v : h.kv) v = encode_e4m3fn(400.0f * uni(rng));

  // Page size 1: one page per token, handed out in random order as an allocator would.
  h.kv_indices.resize(tokens);
  std::iota(h.kv_indices.begin(), h.kv_indices.end(), 0);
  std::shuffle(h.kv_indices.begin(), h.kv_indices.end(), rng);
  h.kv_indptr.assign(batch + 1, 0);
  for (int b = 0; b < batch; ++b) h.kv_indptr[b + 1] = h.kv_indptr[b] + lens[b];
  h.kv_len.assign(lens.begin(), lens.end());

  DecodeArgs& a = h.shape;
  a.q_type = DType::bf16;
  a.kv_type = DType::fp8_e4m3fn;
  a.batch = batch;
  a.num_heads = kHeads;
  a.q_len = kQLen;
  a.causal = true;  // draft token t sees the cache and draft tokens 0..t
  a.page_size = 1;
  a.page_ids = PageIds::csr;
  a.kv_scale = 1.0f / 400.0f;
  a.softmax_scale = 1.0f / std::sqrt(192.0f);  // DeepSeek-V3's 1/sqrt(128 + 64), no YaRN factor
  set_packed_strides(a);  // packed Q [batch, q_len, heads, 576], O [.., 512], LSE [.., heads]
  return h;
}

#if defined(MLAKIT_HAS_GPU_BACKEND)
// The batch copied to the device, with outputs and the workspace; freed on scope exit.
struct DeviceBatch {
  DecodeArgs args;  // the host batch's shape, device pointers
  void* workspace = nullptr;
  std::size_t workspace_size = 0;
  std::size_t out_elems = 0, lse_elems = 0;
  example::DeviceMemory mem;  // every buffer below, freed with the batch

  explicit DeviceBatch(const HostBatch& h) : args(h.shape) {
    args.q = mem.upload(h.q);
    args.kv = mem.upload(h.kv);
    args.kv_indptr = mem.upload(h.kv_indptr);
    args.kv_indices = mem.upload(h.kv_indices);
    args.kv_len = mem.upload(h.kv_len);
    lse_elems = std::size_t(args.batch) * kQLen * kHeads;
    out_elems = lse_elems * kHeadDimV;
    args.out = mem.alloc(out_elems * sizeof(std::uint16_t));
    args.lse = static_cast<float*>(mem.alloc(lse_elems * sizeof(float)));
    // Two-phase workspace: ask the size for this batch and device, allocate once. It does
    // not depend on kv_len values, so a serving engine sizes it for its largest batch.
    DeviceInfo dev;
    const Status s = query_device(&dev);
    if (!s) {
      std::fprintf(stderr, "query_device: %s\n", s.message().c_str());
      std::exit(1);
    }
    workspace_size = workspace_bytes(args, dev);
    workspace = mem.alloc(workspace_size);
  }

  // decode() returns a Status instead of aborting; the example stops on a failure.
  void decode_or_exit(GPU(Stream_t) stream) const {
    const Status s = decode(args, workspace, workspace_size, stream);
    if (!s) {
      std::fprintf(stderr, "decode: %s: %s\n", status_code_name(s.code()), s.message().c_str());
      std::exit(1);
    }
  }
};

// Runs decode() once on the check batch and compares with the reference. True on a pass.
bool check_against_reference(const HostBatch& h, const reference::ReferenceOutput& ref) {
  DeviceBatch d(h);
  // NaN in every output element first, so an element the kernels fail to write shows up.
  GPU_CHECK(GPU(Memset)(d.args.out, 0xFF, d.out_elems * sizeof(std::uint16_t)));
  GPU_CHECK(GPU(Memset)(d.args.lse, 0xFF, d.lse_elems * sizeof(float)));
  d.decode_or_exit(nullptr);
  GPU_CHECK(GPU(DeviceSynchronize)());

  std::vector<std::uint16_t> out_bits(d.out_elems);
  std::vector<float> lse(d.lse_elems);
  GPU_CHECK(GPU(Memcpy)(out_bits.data(), d.args.out, out_bits.size() * 2, GPU(MemcpyDeviceToHost)));
  GPU_CHECK(GPU(Memcpy)(lse.data(), d.args.lse, lse.size() * 4, GPU(MemcpyDeviceToHost)));
  std::vector<double> out(out_bits.size());
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = decode_bf16(out_bits[i]);

  const double rel_l2 = reference::rel_l2_error(ref.out, out);
  const double max_abs = reference::max_abs_error(ref.out, out);
  const double lse_err = reference::max_lse_error(ref.lse, lse);
  const bool pass = rel_l2 < 1e-2 && lse_err < 1e-4;
  std::printf("check vs reference: O rel L2 %.2e, O max abs %.2e, LSE max abs %.2e: %s\n", rel_l2,
              max_abs, lse_err, pass ? "PASS" : "FAIL (limits: rel L2 < 1e-2, LSE < 1e-4)");
  return pass;
}

// Median GPU time of decode() (planner + decode + combine, as events see them) on a batch
// whose fp8 cache (151 MB) is well beyond the H200's L2 (50 MB), so every run reads from memory.
void time_decode() {
  const std::vector<int> lens(64, 4096);
  const HostBatch h = make_batch(lens, 2);
  DeviceBatch d(h);
  GPU(Stream_t) stream;
  GPU_CHECK(GPU(StreamCreate)(&stream));
  GPU(Event_t) start, stop;
  GPU_CHECK(GPU(EventCreate)(&start));
  GPU_CHECK(GPU(EventCreate)(&stop));

  for (int i = 0; i < 5; ++i) d.decode_or_exit(stream);  // warm-up
  std::vector<float> ms(50);
  for (float& t : ms) {
    GPU_CHECK(GPU(EventRecord)(start, stream));
    d.decode_or_exit(stream);
    GPU_CHECK(GPU(EventRecord)(stop, stream));
    GPU_CHECK(GPU(EventSynchronize)(stop));
    GPU_CHECK(GPU(EventElapsedTime)(&t, start, stop));
  }
  std::sort(ms.begin(), ms.end());
  const double seconds = 1e-3 * ms[ms.size() / 2];

  const double tokens = std::accumulate(lens.begin(), lens.end(), 0.0);
  const double kv_bytes = double(kHeadDimQK) * tokens;  // one byte per fp8 value
  const double flops = 2.0 * kQLen * kHeads * (kHeadDimQK + kHeadDimV) * tokens;
  std::printf(
      "timing: %d requests x %d tokens, median of %zu runs: %.1f us, "
      "KV read %.2f TB/s, %.1f TFLOP/s\n",
      int(lens.size()), lens[0], ms.size(), seconds * 1e6, kv_bytes / seconds / 1e12,
      flops / seconds / 1e12);

  GPU_CHECK(GPU(EventDestroy)(start));
  GPU_CHECK(GPU(EventDestroy)(stop));
  GPU_CHECK(GPU(StreamDestroy)(stream));
}
#endif  // MLAKIT_HAS_GPU_BACKEND

}  // namespace

int main() {
  // 8 requests of a few thousand tokens each, all different (kv_len counts the 8 new tokens).
  const std::vector<int> lens = {2891, 4096, 1337, 3500, 512, 2048, 3999, 1024};
  const HostBatch h = make_batch(lens, 1);
  std::printf(
      "spec_decode_verify: bf16 Q, fp8 e4m3fn KV, %d heads, q_len %d, causal, "
      "page size 1 (CSR), %d requests, %d KV tokens\n",
      kHeads, kQLen, h.shape.batch, h.kv_indptr.back());

  const bool gpu = example::gpu_present();
  if (!gpu)
    std::puts(kHaveGpuBackend
                  ? "no GPU: none was found at run time; running the host reference only"
                  : "no GPU: built without a GPU backend (MLAKIT_BACKEND=NONE); "
                    "running the host reference only");

  // The double-precision host reference (a few seconds on one core).
  reference::ReferenceOutput ref;
  const Status rs = reference::decode_reference(h.host_args(), &ref);
  if (!rs) {
    std::fprintf(stderr, "reference: %s\n", rs.message().c_str());
    return 1;
  }
  if (!gpu) {
    const auto [lo, hi] = std::minmax_element(ref.lse.begin(), ref.lse.end());
    std::printf("reference: %zu rows x %d outputs, LSE in [%.3f, %.3f]\n", ref.lse.size(),
                kHeadDimV, *lo, *hi);
    return 0;
  }
#if defined(MLAKIT_HAS_GPU_BACKEND)
  if (!check_against_reference(h, ref)) return 1;
  time_decode();
#endif
  return 0;
}
