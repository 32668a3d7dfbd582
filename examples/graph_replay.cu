// graph_replay: one decode() captured in a CUDA graph serves every decode step.
//
// A serving engine captures its decode step once and replays the graph, updating only device
// memory between replays: the new query tokens and kv_len, which grows by q_len each step.
// decode() allows that: it does no host sync, allocation or host read of device data, its grid
// does not depend on kv_len values, and it reads kv_len on the device. It may be captured on
// its first use (no ordinary call is needed before). Every argument, pointers and
// max_pages_per_request included, is frozen into the graph: the block table here is sized
// for the last step's lengths before the capture (README: "Devices, threads and CUDA graphs").
//
// Shape: bf16 Q and cache, 16 heads, q_len 4, causal, page size 16 with a block table, four
// requests. Each replay is checked against the host reference (exit 1 on a mismatch).
// On HIP the capture is not ported here: each step calls decode() directly. Built without a
// GPU backend, or run without a GPU, it runs the reference of every step only.
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

constexpr int kHeads = 16;
constexpr int kQLen = 4;
constexpr int kPageSize = 16;
constexpr int kSteps = 6;

// The engine's state in host memory. The cache is written up to each request's final length
// at the start (an engine's KV-append kernel writes each step's rows just before attention);
// rows past kv_len are invisible until kv_len grows over them.
struct HostState {
  DecodeArgs shape;                       // no pointers yet
  std::vector<std::uint16_t> q;           // [batch, q_len, heads, 576] bf16: new every step
  std::vector<std::uint16_t> kv;          // [pages, 16, 576] bf16
  std::vector<std::int32_t> block_table;  // [batch, max_pages_per_request]
  std::vector<std::int32_t> kv_len;       // [batch]: grows by q_len every step
  std::mt19937 rng{11};

  DecodeArgs host_args() const {
    DecodeArgs a = shape;
    a.q = q.data();
    a.kv = kv.data();
    a.block_table = block_table.data();
    a.kv_len = kv_len.data();
    return a;
  }
  void new_queries() {
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    for (auto& v : q) v = encode_bf16(uni(rng));
  }
};

HostState make_state(const std::vector<int>& first_lens) {
  HostState s;
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  const int batch = static_cast<int>(first_lens.size());
  const int last_step_growth = (kSteps - 1) * kQLen;
  int max_pages = 1, pages = 0;
  for (int len : first_lens) {
    const int n = (len + last_step_growth + kPageSize - 1) / kPageSize;
    max_pages = std::max(max_pages, n);
    pages += n;
  }
  s.kv.resize(std::size_t(pages) * kPageSize * kHeadDimQK);
  for (auto& v : s.kv) v = encode_bf16(uni(s.rng));
  s.block_table.assign(std::size_t(batch) * max_pages, 0);
  for (int b = 0, next = 0; b < batch; ++b)  // pages of a request: consecutive ids here
    for (int i = 0; i < (first_lens[b] + last_step_growth + kPageSize - 1) / kPageSize; ++i)
      s.block_table[std::size_t(b) * max_pages + i] = next++;
  s.kv_len.assign(first_lens.begin(), first_lens.end());
  s.q.resize(std::size_t(batch) * kQLen * kHeads * kHeadDimQK);
  s.new_queries();

  DecodeArgs& a = s.shape;
  a.q_type = DType::bf16;
  a.kv_type = DType::bf16;
  a.batch = batch;
  a.num_heads = kHeads;
  a.q_len = kQLen;
  a.causal = true;
  a.page_size = kPageSize;
  a.page_ids = PageIds::block_table;
  a.max_pages_per_request = max_pages;
  a.softmax_scale = 1.0f / std::sqrt(192.0f);
  set_packed_strides(a);
  return s;
}

#if defined(MLAKIT_HAS_GPU_BACKEND)
void check_status(const Status& s, const char* what) {
  if (s) return;
  std::fprintf(stderr, "%s: %s\n", what, s.message().c_str());
  std::exit(1);
}

#endif  // MLAKIT_HAS_GPU_BACKEND

}  // namespace

int main() {
  HostState st = make_state({1000, 37, 2500, 600});
  std::printf(
      "graph_replay: bf16 Q and KV, %d heads, q_len %d, causal, page size %d, %d "
      "requests, %d steps\n",
      kHeads, kQLen, kPageSize, st.shape.batch, kSteps);
  const bool gpu = example::gpu_present();
  if (!gpu)
    std::puts(kHaveGpuBackend
                  ? "no GPU: none was found at run time; running the host reference only"
                  : "no GPU: built without a GPU backend (MLAKIT_BACKEND=NONE); "
                    "running the host reference only");

#if defined(MLAKIT_HAS_GPU_BACKEND)
  // Device buffers, allocated once for every step, as the captured graph needs.
  example::DeviceMemory mem;
  DecodeArgs a = st.shape;
  std::uint16_t* d_q = nullptr;      // rewritten every step
  std::int32_t* d_kv_len = nullptr;  // rewritten every step
  GPU(Stream_t) stream = nullptr;
  void* ws = nullptr;
  std::size_t ws_bytes = 0;
  const std::size_t out_elems = std::size_t(a.batch) * kQLen * kHeads * kHeadDimV;
  const std::size_t lse_elems = out_elems / kHeadDimV;
  if (gpu) {
    a.q = d_q = mem.upload(st.q);
    a.kv = mem.upload(st.kv);
    a.block_table = mem.upload(st.block_table);
    a.kv_len = d_kv_len = mem.upload(st.kv_len);
    a.out = mem.alloc(out_elems * 2);
    a.lse = static_cast<float*>(mem.alloc(lse_elems * 4));
    DeviceInfo dev;
    check_status(query_device(&dev), "query_device");
    ws_bytes = workspace_bytes(a, dev);  // independent of kv_len: sized once
    ws = mem.alloc(ws_bytes);
    GPU_CHECK(GPU(StreamCreate)(&stream));
  }
#if defined(MLAKIT_HAS_CUDA_RUNTIME_API)
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t replay = nullptr;
  if (gpu) {
    GPU_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    const Status s = decode(a, ws, ws_bytes, stream);  // its first use: recorded, not run
    GPU_CHECK(cudaStreamEndCapture(stream, &graph));
    check_status(s, "decode (captured)");
    GPU_CHECK(cudaGraphInstantiate(&replay, graph, 0));
    std::puts("captured decode() once into a CUDA graph");
  }
#else
  if (gpu) std::puts("graph capture: not ported to HIP in this example; each step calls decode()");
#endif
#endif  // MLAKIT_HAS_GPU_BACKEND

  bool all_pass = true;
  for (int step = 0; step < kSteps; ++step) {
    if (step > 0) {  // the engine's bookkeeping between steps: new tokens, longer requests
      st.new_queries();
      for (auto& len : st.kv_len) len += kQLen;
    }
    std::printf("step %d: kv_len", step);
    for (int len : st.kv_len) std::printf(" %d", len);

    reference::ReferenceOutput ref;
    const Status rs = reference::decode_reference(st.host_args(), &ref);
    if (!rs) {
      std::fprintf(stderr, "\nreference: %s\n", rs.message().c_str());
      return 1;
    }
    if (!gpu) {
      std::printf(": reference computed (%zu rows)\n", ref.lse.size());
      continue;
    }

#if defined(MLAKIT_HAS_GPU_BACKEND)
    // Only device memory changes between replays; the graph's arguments stay the same.
    GPU_CHECK(GPU(MemcpyAsync)(d_q, st.q.data(), st.q.size() * 2, GPU(MemcpyHostToDevice), stream));
    GPU_CHECK(GPU(MemcpyAsync)(d_kv_len, st.kv_len.data(), st.kv_len.size() * 4,
                               GPU(MemcpyHostToDevice), stream));
    GPU_CHECK(GPU(MemsetAsync)(a.out, 0xFF, out_elems * 2, stream));  // NaN until written
#if defined(MLAKIT_HAS_CUDA_RUNTIME_API)
    GPU_CHECK(cudaGraphLaunch(replay, stream));
#else
    check_status(decode(a, ws, ws_bytes, stream), "decode");
#endif
    std::vector<std::uint16_t> out_bits(out_elems);
    std::vector<float> lse(lse_elems);
    GPU_CHECK(
        GPU(MemcpyAsync)(out_bits.data(), a.out, out_elems * 2, GPU(MemcpyDeviceToHost), stream));
    GPU_CHECK(GPU(MemcpyAsync)(lse.data(), a.lse, lse_elems * 4, GPU(MemcpyDeviceToHost), stream));
    GPU_CHECK(GPU(StreamSynchronize)(stream));

    std::vector<double> out(out_elems);
    for (std::size_t i = 0; i < out_elems; ++i) out[i] = decode_bf16(out_bits[i]);
    const double rel_l2 = reference::rel_l2_error(ref.out, out);
    const double lse_err = reference::max_lse_error(ref.lse, lse);
    const bool pass = rel_l2 < 1e-2 && lse_err < 1e-4;
    all_pass = all_pass && pass;
    std::printf(": O rel L2 %.2e, LSE max abs %.2e: %s\n", rel_l2, lse_err,
                pass ? "PASS" : "FAIL (limits: rel L2 < 1e-2, LSE < 1e-4)");
#endif
  }

#if defined(MLAKIT_HAS_CUDA_RUNTIME_API)
  if (replay) GPU_CHECK(cudaGraphExecDestroy(replay));
  if (graph) GPU_CHECK(cudaGraphDestroy(graph));
#endif
#if defined(MLAKIT_HAS_GPU_BACKEND)
  if (stream) GPU_CHECK(GPU(StreamDestroy)(stream));
#endif
  return all_pass ? 0 : 1;
}
