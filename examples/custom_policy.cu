// custom_policy: a decode shape fixed at compile time.
//
// mlakit::decode() serves every shape of the domain from a small table of instantiations. A
// program that knows its shape can name it instead, as a Problem (types and constants only,
// kernel/problem.hpp), and call Decode<Problem>::launch(): the kernel is then compiled for
// exactly that shape, into this program. The shape here: fp16 Q/O, an fp8 e4m3fnuz cache (the
// AMD MI300X format), 12 heads (Kimi K3 at TP8), q_len 3 (a 2-token draft + 1), no causal mask
// (every query token sees all kv_len keys), page size 64 with a block table.
//
// It shows that DecodeArgs that do not match the Problem (q_len 4) get a Status back instead
// of a crash, then runs the kernel and checks it against the host reference (exit 1 on a
// mismatch). Built without a GPU backend, or run without a GPU, it runs the reference only.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mlakit/mlakit.hpp>
#include <mlakit/reference/decode_reference.hpp>
#include <random>
#include <vector>

#include "example_gpu.hpp"

using namespace mlakit;

namespace {

constexpr int kHeads = 12;
constexpr int kQLen = 3;
constexpr int kPageSize = 64;

#if defined(MLAKIT_HAS_GPU_BACKEND)
// The user's kernel. Problem<QType, KvType, Heads, QLen, Causal>; 0 or Causal::dynamic would
// leave a value to run time.
using MyDecode = Decode<Problem<fp16_t, fp8_e4m3fnuz_t, kHeads, kQLen, Causal::off>>;
#endif

// A paged problem in host memory: pages in random order, one block-table row per request.
struct HostProblem {
  DecodeArgs shape;                       // no pointers yet
  std::vector<std::uint16_t> q;           // [batch, q_len, heads, 576] fp16 bits
  std::vector<std::uint8_t> kv;           // [pages, 64, 576] fp8 e4m3fnuz bytes
  std::vector<std::int32_t> block_table;  // [batch, max_pages_per_request]
  std::vector<std::int32_t> kv_len;       // [batch]
  std::vector<std::uint16_t> out;         // [batch, q_len, heads, 512]: the result, read back

  DecodeArgs host_args() {
    DecodeArgs a = shape;
    a.q = q.data();
    a.kv = kv.data();
    a.block_table = block_table.data();
    a.kv_len = kv_len.data();
    a.out = out.data();
    return a;
  }
};

HostProblem make_problem(const std::vector<int>& lens, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  const int batch = static_cast<int>(lens.size());
  int max_pages = 1, pages = 0;
  for (int len : lens) {
    max_pages = std::max(max_pages, (len + kPageSize - 1) / kPageSize);
    pages += (len + kPageSize - 1) / kPageSize;
  }
  HostProblem p;
  p.q.resize(std::size_t(batch) * kQLen * kHeads * kHeadDimQK);
  for (auto& v : p.q) v = encode_fp16(uni(rng));
  // e4m3fnuz holds at most 240; kv_scale maps the codes back to about [-1, 1].
  p.kv.resize(std::size_t(pages) * kPageSize * kHeadDimQK);
  for (auto& v : p.kv) v = encode_e4m3fnuz(200.0f * uni(rng));
  std::vector<int> order(pages);
  for (int i = 0; i < pages; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  // Unused block-table entries still hold a valid page id (0); they are never read.
  p.block_table.assign(std::size_t(batch) * max_pages, 0);
  for (int b = 0, next = 0; b < batch; ++b)
    for (int i = 0; i < (lens[b] + kPageSize - 1) / kPageSize; ++i)
      p.block_table[std::size_t(b) * max_pages + i] = order[next++];
  p.kv_len.assign(lens.begin(), lens.end());
  p.out.assign(std::size_t(batch) * kQLen * kHeads * kHeadDimV, 0);

  DecodeArgs& a = p.shape;
  a.q_type = DType::fp16;
  a.kv_type = DType::fp8_e4m3fnuz;
  a.batch = batch;
  a.num_heads = kHeads;
  a.q_len = kQLen;
  a.causal = false;
  a.page_size = kPageSize;
  a.page_ids = PageIds::block_table;
  a.max_pages_per_request = max_pages;
  a.kv_scale = 1.0f / 200.0f;
  a.softmax_scale = 1.0f / std::sqrt(192.0f);
  set_packed_strides(a);
  return p;
}

#if defined(MLAKIT_HAS_GPU_BACKEND)

// Runs MyDecode on the device and reads O and LSE back into p.out and `lse`.
void run_on_gpu(HostProblem& p, std::vector<float>& lse) {
  example::DeviceMemory mem;
  DecodeArgs a = p.shape;
  a.q = mem.upload(p.q);
  a.kv = mem.upload(p.kv);
  a.block_table = mem.upload(p.block_table);
  a.kv_len = mem.upload(p.kv_len);
  a.out = mem.upload(std::vector<std::uint16_t>(p.out.size(), 0xFFFF));  // NaN until written
  a.lse = mem.upload(std::vector<float>(lse.size(), NAN));
  DeviceInfo dev;
  Status s = query_device(&dev);
  const std::size_t ws_bytes = s ? workspace_bytes(a, dev) : 0;
  void* ws = mem.alloc(ws_bytes);

  if (s) s = MyDecode::launch(a, ws, ws_bytes, /*stream=*/nullptr);
  if (!s) {
    std::fprintf(stderr, "MyDecode::launch: %s\n", s.message().c_str());
    std::exit(1);
  }
  GPU_CHECK(GPU(DeviceSynchronize)());
  GPU_CHECK(GPU(Memcpy)(p.out.data(), a.out, p.out.size() * 2, GPU(MemcpyDeviceToHost)));
  GPU_CHECK(GPU(Memcpy)(lse.data(), a.lse, lse.size() * 4, GPU(MemcpyDeviceToHost)));
}
#endif  // MLAKIT_HAS_GPU_BACKEND

}  // namespace

int main() {
  // An empty slot (0), a request shorter than q_len (2), and two ordinary ones.
  HostProblem p = make_problem({0, 2, 700, 3000}, 7);
  std::printf(
      "custom_policy: Problem<fp16_t, fp8_e4m3fnuz_t, %d heads, q_len %d, Causal::off>, "
      "page size %d (block table), kv_len 0 / 2 / 700 / 3000\n",
      kHeads, kQLen, kPageSize);

#if defined(MLAKIT_HAS_GPU_BACKEND)
  // Arguments that do not match the Problem are rejected before any device work (so this
  // part needs no GPU): a Status names the argument, its value and what was expected.
  DecodeArgs wrong = p.host_args();
  wrong.q_len = 4;
  set_packed_strides(wrong);
  const Status rejected = MyDecode::launch(wrong, nullptr, 0, nullptr);
  std::printf("MyDecode::launch with q_len 4 -> %s: %s\n", status_code_name(rejected.code()),
              rejected.message().c_str());
  if (rejected) return 1;
#endif

  const bool gpu = example::gpu_present();
  if (!gpu)
    std::puts(kHaveGpuBackend
                  ? "no GPU: none was found at run time; running the host reference only"
                  : "no GPU: built without a GPU backend (MLAKIT_BACKEND=NONE), so no "
                    "Decode<Problem>; running the host reference only");

  reference::ReferenceOutput ref;
  const Status rs = reference::decode_reference(p.host_args(), &ref);
  if (!rs) {
    std::fprintf(stderr, "reference: %s\n", rs.message().c_str());
    return 1;
  }
  if (!gpu) {
    std::printf("reference: %zu rows; request 0 (kv_len 0) has LSE %f and O = 0\n", ref.lse.size(),
                ref.lse[0]);
    return 0;
  }

#if defined(MLAKIT_HAS_GPU_BACKEND)
  std::vector<float> lse(ref.lse.size());
  run_on_gpu(p, lse);
  std::vector<double> out(p.out.size());
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = decode_fp16(p.out[i]);
  const double rel_l2 = reference::rel_l2_error(ref.out, out);
  const double max_abs = reference::max_abs_error(ref.out, out);
  const double lse_err = reference::max_lse_error(ref.lse, lse);
  const bool pass = rel_l2 < 1e-2 && lse_err < 1e-4;
  std::printf("check vs reference: O rel L2 %.2e, O max abs %.2e, LSE max abs %.2e: %s\n", rel_l2,
              max_abs, lse_err, pass ? "PASS" : "FAIL (limits: rel L2 < 1e-2, LSE < 1e-4)");
  return pass ? 0 : 1;
#endif
}
