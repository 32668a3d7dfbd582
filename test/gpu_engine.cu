// GPU tests of decode() the way serving engines call it: a runtime error left on the thread
// by other code, CUDA graph capture as the very first use of a kernel (replays follow kv_len
// and CSR kv_indptr on the device), host threads whose first calls race, two streams with
// interleaved calls, and (two GPUs) alternating devices with device-mismatch checks.
//
// Kernels instantiated only in this file (the Cold* shapes) are cold whatever ran before;
// the run-time table's kernels and the device-info cache are cold only when a test runs in
// a process of its own, e.g.  mlakit_gpu_tests "[capture-cold]"  and  "[threads]".
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gpu_harness.hpp"
#include "gpu_require.hpp"

using namespace mlakit;
using namespace mlakit::testing;

namespace {

// 30 rows each (32-row policy: well above 48 KB of shared memory, so a launch needs the
// kernel attribute set on its device first).
using ColdCapture = Decode<Problem<fp16_t, fp16_t, 10, 3, Causal::on>>;
using ColdRace = Decode<Problem<bf16_t, bf16_t, 6, 5, Causal::on>>;
// The run-time table's hot shape (no extra instantiation).
using HotFp8 = Decode<Problem<bf16_t, fp8_e4m3fn_t, 16, 8, Causal::on>>;

Case make_case(DType q, DType kv, int heads, int q_len, PageIds ids, int page_size,
               std::vector<int> lens, std::uint64_t seed) {
  Case c;
  c.q_type = q;
  c.kv_type = kv;
  c.heads = heads;
  c.q_len = q_len;
  c.causal = true;
  c.ids = ids;
  c.page_size = page_size;
  c.kv_lens = std::move(lens);
  c.seed = seed;
  return c;
}

Case hot_fp8_case(std::vector<int> lens, std::uint64_t seed) {
  return make_case(DType::bf16, DType::fp8_e4m3fn, 16, 8, PageIds::csr, 1, std::move(lens), seed);
}
Case cold_race_case(std::vector<int> lens, std::uint64_t seed) {
  return make_case(DType::bf16, DType::bf16, 6, 5, PageIds::block_table, 16, std::move(lens), seed);
}

// Fills the outputs with NaN (synchronous copies: ordered after earlier work on blocking
// streams of the current device).
bool poison_outputs(TestProblem& P) {
  std::vector<std::uint16_t> nan_out(P.out_elems, 0xFFFF);
  std::vector<float> nan_lse(P.lse_elems, NAN);
  return gpu_h2d(P.d_out.ptr, nan_out.data(), P.out_elems * 2) &&
         gpu_h2d(P.d_lse.ptr, nan_lse.data(), P.lse_elems * 4);
}

Outcome read_outputs(const TestProblem& P) {
  Outcome o;
  o.out.resize(P.out_elems);
  o.lse.resize(P.lse_elems);
  if (!gpu_d2h(o.out.data(), P.d_out.ptr, P.out_elems * 2) ||
      !gpu_d2h(o.lse.data(), P.d_lse.ptr, P.lse_elems * 4))
    o.status = Status(StatusCode::runtime_error, "read-back failed (see stderr)");
  return o;
}

// True when every output element still holds the NaN poison (nothing was written).
bool outputs_untouched(const TestProblem& P) {
  const Outcome o = read_outputs(P);
  if (!o.status) return false;
  for (std::uint16_t v : o.out)
    if (v != 0xFFFF) return false;
  return true;
}

// Compares the outputs now in device memory with the reference of P's host arguments
// (kv_len and page ids as they are now). Same-type or fp8 KV only (LSE within 1e-4).
void check_outputs(const TestProblem& P, const std::string& what) {
  INFO(what << ": " << P.c.name());
  Outcome o = read_outputs(P);
  REQUIRE(o.status.is_ok());
  const auto ref = run_reference(P);
  compare(P, ref, o);
  INFO("rel_l2 " << o.rel_l2 << " max_abs " << o.max_abs << " lse_err " << o.lse_err);
  CHECK(o.rel_l2 < 1e-2);
  CHECK(o.lse_err < 1e-4);
}

bool upload_lengths(TestProblem& P, const std::vector<int>& lens) {
  P.kv_len.assign(lens.begin(), lens.end());
  return gpu_h2d(P.d_kv_len.ptr, P.kv_len.data(), P.kv_len.size() * 4);
}

std::size_t max_workspace(const std::vector<const TestProblem*>& ps) {
  std::size_t n = 0;
  for (const TestProblem* p : ps) n = std::max(n, workspace_for(p->dev));
  return n;
}

// A stream created (and destroyed) on the device current at construction.
struct OwnedStream {
  Stream s = nullptr;
  bool ok = false;
  OwnedStream() : ok(gpu_stream_create(&s)) {}
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  ~OwnedStream() {
    if (ok) gpu_stream_destroy(s);
  }
};

#if defined(MLAKIT_HAS_CUDA_RUNTIME_API)
struct Graph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
  }
};

// Captures `call` on `stream` (global mode: the strictest about runtime calls made during
// the capture) and instantiates the graph. Returns the call's Status through *status.
template <class Call>
void capture(Stream stream, Graph& g, Status* status, const Call& call) {
  REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
  *status = call();
  const cudaError_t end = cudaStreamEndCapture(stream, &g.graph);
  INFO("captured call: " << status->message()
                         << "; cudaStreamEndCapture: " << cudaGetErrorString(end));
  REQUIRE(status->is_ok());
  REQUIRE(end == cudaSuccess);
  REQUIRE(g.graph != nullptr);
  std::size_t nodes = 0;
  REQUIRE(cudaGraphGetNodes(g.graph, nullptr, &nodes) == cudaSuccess);
  CHECK(nodes >= 2);  // planner and decode kernel (plus combine when requests are split)
  REQUIRE(cudaGraphInstantiate(&g.exec, g.graph, 0) == cudaSuccess);
}

void replay_and_check(TestProblem& P, const Graph& g, Stream stream, const std::string& what) {
  REQUIRE(poison_outputs(P));
  REQUIRE(cudaGraphLaunch(g.exec, stream) == cudaSuccess);
  REQUIRE(gpu_stream_sync(stream));
  check_outputs(P, what);
}
#endif

}  // namespace

TEST_CASE(
    "engine: a runtime error left on the thread by other code is neither blamed nor "
    "consumed",
    "[gpu][engine][stale-error]") {
  MLAKIT_REQUIRE_GPU();
  TestProblem P;
  build(P, hot_fp8_case({0, 5, 700, 2048}, 31));  // automatic split: planner, decode, combine
  REQUIRE(P.ok);
  DeviceBuffer ws(workspace_for(P.dev));
  REQUIRE(ws.ptr != nullptr);
  if (!kLastErrorPersists)
    WARN(
        "this HIP runtime overwrites the last error on every call: only the results of "
        "decode() are checked");

  for (int variant = 0; variant < 2; ++variant) {
    const char* name = variant == 0 ? "decode()" : "Decode<Problem>::launch()";
    INFO(name);
    REQUIRE(poison_outputs(P));
    (void)gpu_take_last_error();  // nothing pending before the plant
    const int planted = gpu_plant_error();
    if (kLastErrorPersists) REQUIRE(gpu_peek_last_error() == planted);
    const Status s = variant == 0 ? decode(P.dev, ws.ptr, ws.bytes, nullptr)
                                  : HotFp8::launch(P.dev, ws.ptr, ws.bytes, nullptr);
    const int after = gpu_peek_last_error();
    INFO("status: " << s.message() << "; last error after the call: " << gpu_error_name(after));
    CHECK(s.is_ok());
    if (kLastErrorPersists) CHECK(after == planted);  // left in place, not consumed
    REQUIRE(gpu_sync());
    if (kLastErrorPersists) CHECK(gpu_take_last_error() == planted);
    CHECK(gpu_take_last_error() == 0);
    check_outputs(P, std::string(name) + " after a planted error");
  }

#if defined(MLAKIT_HAS_CUDA_RUNTIME_API)
  SECTION("inside a graph capture: the captured graph is complete and correct") {
    OwnedStream stream;
    REQUIRE(stream.ok);
    (void)gpu_take_last_error();
    const int planted = gpu_plant_error();
    REQUIRE(gpu_peek_last_error() == planted);
    Graph g;
    Status s;
    capture(stream.s, g, &s, [&] { return decode(P.dev, ws.ptr, ws.bytes, stream.s); });
    CHECK(gpu_peek_last_error() == planted);
    CHECK(gpu_take_last_error() == planted);
    replay_and_check(P, g, stream.s, "graph captured after a planted error");
  }
#endif
}

#if defined(MLAKIT_HAS_CUDA_RUNTIME_API)
TEST_CASE(
    "engine: graph capture is the very first use of a kernel; replays follow kv_len and "
    "kv_indptr",
    "[gpu][engine][capture-cold]") {
  MLAKIT_REQUIRE_GPU();
  OwnedStream stream;
  REQUIRE(stream.ok);

  // 1. decode() captured before any ordinary call (in a process of its own this is the first
  //    use of the device-info cache, the planner, the decode kernel and combine). CSR page
  //    ids: each replay sees the pages kv_indptr / kv_indices hold on the device then, so
  //    the page count of a request grows between replays.
  {
    const std::vector<int> full = {2000, 900, 1300};  // the kv_indices buffer holds these
    TestProblem P;
    build(P, make_case(DType::bf16, DType::fp8_e4m3fn, 16, 8, PageIds::csr, 16, full, 41));
    REQUIRE(P.ok);
    DeviceInfo dev;  // query_device(), not the cache decode() fills
    REQUIRE(query_device(&dev).is_ok());
    DeviceBuffer ws(workspace_bytes(P.dev, dev));
    REQUIRE(ws.ptr != nullptr);
    Graph g;
    Status s;
    capture(stream.s, g, &s, [&] { return decode(P.dev, ws.ptr, ws.bytes, stream.s); });

    const std::vector<std::int32_t> full_indptr = P.indptr, full_indices = P.indices;
    // Request b keeps the first ceil(len / page) of its pages, packed from index 0.
    auto set_csr = [&](const std::vector<int>& lens) {
      std::int32_t next = 0;
      for (std::size_t b = 0; b < lens.size(); ++b) {
        const int own = full_indptr[b + 1] - full_indptr[b];
        const int n = std::min(own, (lens[b] + P.c.page_size - 1) / P.c.page_size);
        P.indptr[b] = next;
        for (int i = 0; i < n; ++i) P.indices[next++] = full_indices[full_indptr[b] + i];
      }
      P.indptr[lens.size()] = next;
      return gpu_h2d(P.d_indptr.ptr, P.indptr.data(), P.indptr.size() * 4) &&
             gpu_h2d(P.d_indices.ptr, P.indices.data(), P.indices.size() * 4) &&
             upload_lengths(P, lens);
    };
    const std::vector<std::vector<int>> steps = {{500, 3, 1000}, {1001, 400, 1100}, full};
    for (const auto& lens : steps) {
      REQUIRE(set_csr(lens));
      replay_and_check(P, g, stream.s,
                       "CSR replay, lens " + std::to_string(lens[0]) + " " +
                           std::to_string(lens[1]) + " " + std::to_string(lens[2]));
    }
  }

  // 2. A kernel instantiated only here, first used inside the capture, whatever ran before.
  //    Block-table page ids: max_pages_per_request is frozen into the graph, so the graph is
  //    captured with the largest capacity (128 pages of 16) and kv_len grows below it; a
  //    kv_len past it is clamped to it on the device.
  {
    TestProblem P;
    build(P, make_case(DType::fp16, DType::fp16, 10, 3, PageIds::block_table, 16,
                       {2048, 2048, 2048}, 42));
    REQUIRE(P.ok);
    REQUIRE(P.dev.max_pages_per_request == 128);
    DeviceBuffer ws(workspace_for(P.dev));
    REQUIRE(ws.ptr != nullptr);
    Graph g;
    Status s;
    capture(stream.s, g, &s,
            [&] { return ColdCapture::launch(P.dev, ws.ptr, ws.bytes, stream.s); });
    std::vector<int> lens = {100, 7, 1000};
    for (int step = 0; step < 4; ++step) {
      REQUIRE(upload_lengths(P, lens));
      replay_and_check(P, g, stream.s, "block-table replay, step " + std::to_string(step));
      for (int& len : lens) len += 3 * 97;  // q_len 3 tokens a step, several steps at once
    }
    REQUIRE(upload_lengths(P, {2048, 3000, 2047}));  // 3000 is clamped to the 2048 capacity
    replay_and_check(P, g, stream.s, "block-table replay past the capacity");
  }
}
#endif

TEST_CASE("engine: four host threads whose first calls race", "[gpu][engine][threads]") {
  MLAKIT_REQUIRE_GPU();
  constexpr int kThreads = 4;
  const int device = gpu_current_device();
  REQUIRE(device >= 0);
  // Per thread: one problem for a kernel instantiated only in this test (ColdRace) and one
  // for decode()'s table, its own workspace and stream. Built before the threads start.
  std::vector<TestProblem> cold(kThreads), hot(kThreads);
  std::vector<std::unique_ptr<DeviceBuffer>> ws;
  std::vector<std::unique_ptr<OwnedStream>> streams;
  for (int t = 0; t < kThreads; ++t) {
    build(cold[t], cold_race_case({300 + 111 * t, 5 + t, 1500 - 200 * t}, 50 + t));
    build(hot[t], hot_fp8_case({64 * (t + 1), 0, 999 + t}, 60 + t));
    REQUIRE(cold[t].ok);
    REQUIRE(hot[t].ok);
    REQUIRE(poison_outputs(cold[t]));
    REQUIRE(poison_outputs(hot[t]));
    ws.push_back(std::make_unique<DeviceBuffer>(max_workspace({&cold[t], &hot[t]})));
    REQUIRE(ws.back()->ptr != nullptr);
    streams.push_back(std::make_unique<OwnedStream>());
    REQUIRE(streams.back()->ok);
  }

  // The threads record results; Catch2 assertions run on this thread afterwards.
  std::atomic<int> arrived{0};
  std::vector<Status> cold_status(kThreads), hot_status(kThreads);
  std::vector<int> synced(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      if (!gpu_set_device(device)) return;
      arrived.fetch_add(1);
      while (arrived.load() < kThreads) std::this_thread::yield();
      DeviceBuffer& w = *ws[t];
      const Stream s = streams[t]->s;
      // Even threads start with the cold kernel, odd ones with decode(): both first calls
      // race with another thread's first call of the same kernel.
      for (int k = 0; k < 2; ++k) {
        if ((k == 0) == (t % 2 == 0))
          cold_status[t] = ColdRace::launch(cold[t].dev, w.ptr, w.bytes, s);
        else
          hot_status[t] = decode(hot[t].dev, w.ptr, w.bytes, s);
        // The two calls share the workspace: stream order keeps them apart.
      }
      synced[t] = gpu_stream_sync(s) ? 1 : 0;
    });
  }
  for (auto& th : threads) th.join();

  for (int t = 0; t < kThreads; ++t) {
    INFO("thread " << t << ": ColdRace::launch: " << cold_status[t].message()
                   << "; decode: " << hot_status[t].message());
    CHECK(cold_status[t].is_ok());
    CHECK(hot_status[t].is_ok());
    CHECK(synced[t] == 1);
  }
  for (int t = 0; t < kThreads; ++t) {
    check_outputs(cold[t], "thread " + std::to_string(t) + " ColdRace::launch");
    check_outputs(hot[t], "thread " + std::to_string(t) + " decode()");
  }
}

TEST_CASE("engine: two streams with interleaved calls", "[gpu][engine][streams]") {
  MLAKIT_REQUIRE_GPU();
  // Six calls alternating between two streams with nothing synchronised in between; the
  // calls on one stream share its workspace.
  std::vector<Case> cases = {
      hot_fp8_case({1200, 3, 0, 4000}, 70),
      make_case(DType::bf16, DType::bf16, 16, 4, PageIds::block_table, 16, {900, 2100}, 71),
      make_case(DType::fp16, DType::fp16, 12, 1, PageIds::csr, 64, {5000, 1, 77}, 72),
      hot_fp8_case({17, 2500}, 73),
      make_case(DType::bf16, DType::fp8_e4m3fn, 8, 3, PageIds::block_table, 32, {640, 641}, 74),
      make_case(DType::bf16, DType::bf16, 16, 4, PageIds::csr, 1, {333, 1800, 9}, 75),
  };
  cases[2].split = SplitMode::fixed;
  cases[2].num_splits = 7;
  cases[3].split = SplitMode::none;
  std::vector<TestProblem> P(cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    build(P[i], cases[i]);
    REQUIRE(P[i].ok);
    REQUIRE(poison_outputs(P[i]));
  }
  OwnedStream s0, s1;
  REQUIRE(s0.ok);
  REQUIRE(s1.ok);
  DeviceBuffer ws0(max_workspace({&P[0], &P[2], &P[4]}));
  DeviceBuffer ws1(max_workspace({&P[1], &P[3], &P[5]}));
  REQUIRE(ws0.ptr != nullptr);
  REQUIRE(ws1.ptr != nullptr);
  for (std::size_t i = 0; i < P.size(); ++i) {
    DeviceBuffer& w = i % 2 == 0 ? ws0 : ws1;
    const Status s = decode(P[i].dev, w.ptr, w.bytes, i % 2 == 0 ? s0.s : s1.s);
    INFO("call " << i << ": " << s.message());
    REQUIRE(s.is_ok());
  }
  REQUIRE(gpu_stream_sync(s0.s));
  REQUIRE(gpu_stream_sync(s1.s));
  for (std::size_t i = 0; i < P.size(); ++i)
    check_outputs(P[i], "call " + std::to_string(i) + " on stream " + std::to_string(i % 2));
}

TEST_CASE("engine: device arguments are checked", "[gpu][engine][device]") {
  MLAKIT_REQUIRE_GPU();
  const int count = gpu_count();
  const int device = gpu_current_device();
  REQUIRE(device >= 0);
  DeviceInfo info;
  Status s = query_device(-1, &info);
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK(s.message().find("device = -1") != std::string::npos);
  s = query_device(count, &info);
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK(s.message().find("device = " + std::to_string(count)) != std::string::npos);
  REQUIRE(query_device(device, &info).is_ok());
  CHECK(info.device == device);
  DeviceInfo cached;
  REQUIRE(cached_device_info(device, &cached).is_ok());
  CHECK(cached.device == device);
  CHECK(cached.sm_count == info.sm_count);
  CHECK(cached.max_smem_optin == info.max_smem_optin);
  CHECK(cached.arch == info.arch);

  // launch_with() with a DeviceInfo of another device: rejected before any launch or kernel
  // attribute, naming the field.
  TestProblem P;
  build(P, hot_fp8_case({100, 2000}, 80));
  REQUIRE(P.ok);
  DeviceBuffer ws(workspace_for(P.dev));
  REQUIRE(ws.ptr != nullptr);
  REQUIRE(poison_outputs(P));
  DeviceInfo other = info;
  other.device = device + 1;  // another device, or none when there is one GPU
  s = HotFp8::launch_with(P.dev, other, ws.ptr, ws.bytes, nullptr);
  INFO(s.message());
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK(s.message().find("DeviceInfo.device = " + std::to_string(device + 1)) != std::string::npos);
  REQUIRE(gpu_sync());
  CHECK(outputs_untouched(P));
  // The same call with the right DeviceInfo runs.
  s = HotFp8::launch_with(P.dev, info, ws.ptr, ws.bytes, nullptr);
  CHECK(s.is_ok());
  REQUIRE(gpu_sync());
  check_outputs(P, "launch_with() after a rejected DeviceInfo");
}

TEST_CASE("engine: two GPUs, alternating devices", "[gpu][engine][multi-gpu]") {
  MLAKIT_REQUIRE_GPU();
  const int count = gpu_count();
  if (count < 2) {
    WARN("one GPU present (" << count << "): the two-GPU test is skipped");
    return;
  }
  const int original = gpu_current_device();
  REQUIRE(original >= 0);
  struct Restore {
    int d;
    ~Restore() { gpu_set_device(d); }
  } restore{original};

  // Per device: a problem, workspace and stream on that device, plus a ColdRace problem
  // whose kernel must get its shared-memory attribute on each device separately.
  constexpr int kDevices = 2;
  std::vector<TestProblem> P(kDevices), C(kDevices);
  std::vector<std::unique_ptr<DeviceBuffer>> ws;
  std::vector<std::unique_ptr<OwnedStream>> streams;
  std::vector<DeviceInfo> info(kDevices);
  for (int d = 0; d < kDevices; ++d) {
    REQUIRE(gpu_set_device(d));
    build(P[d], hot_fp8_case({1000 + 300 * d, 7, 2000}, 90 + d));
    build(C[d], cold_race_case({700, 1400 - 100 * d}, 92 + d));
    REQUIRE(P[d].ok);
    REQUIRE(C[d].ok);
    ws.push_back(std::make_unique<DeviceBuffer>(max_workspace({&P[d], &C[d]})));
    REQUIRE(ws.back()->ptr != nullptr);
    streams.push_back(std::make_unique<OwnedStream>());
    REQUIRE(streams.back()->ok);
    REQUIRE(query_device(&info[d]).is_ok());
    REQUIRE(info[d].device == d);
  }

#if defined(MLAKIT_HAS_CUDA_RUNTIME_API)
  SECTION("graph capture on the second device is its first decode() there") {
    REQUIRE(gpu_set_device(1));
    Graph g;
    Status s;
    capture(streams[1]->s, g, &s,
            [&] { return decode(P[1].dev, ws[1]->ptr, ws[1]->bytes, streams[1]->s); });
    for (int step = 0; step < 2; ++step) {
      std::vector<int> lens(P[1].c.kv_lens);
      for (int& len : lens) len = std::max(0, len - 400 * step);
      REQUIRE(upload_lengths(P[1], lens));
      replay_and_check(P[1], g, streams[1]->s, "device 1 replay " + std::to_string(step));
    }
  }
#endif

  SECTION("calls alternate between the devices, each on its own stream and workspace") {
    for (int round = 0; round < 3; ++round) {
      for (int d = 0; d < kDevices; ++d) {
        REQUIRE(gpu_set_device(d));
        std::vector<int> lens(P[d].c.kv_lens);
        for (int& len : lens) len = std::max(0, len - 250 * round);
        REQUIRE(upload_lengths(P[d], lens));
        REQUIRE(poison_outputs(P[d]));
        REQUIRE(poison_outputs(C[d]));
        const Status a = decode(P[d].dev, ws[d]->ptr, ws[d]->bytes, streams[d]->s);
        const Status b = ColdRace::launch(C[d].dev, ws[d]->ptr, ws[d]->bytes, streams[d]->s);
        INFO("round " << round << " device " << d << ": " << a.message() << " / " << b.message());
        CHECK(a.is_ok());
        CHECK(b.is_ok());
      }
      for (int d = 0; d < kDevices; ++d) {
        REQUIRE(gpu_set_device(d));
        REQUIRE(gpu_stream_sync(streams[d]->s));
        const std::string what = "round " + std::to_string(round) + " device " + std::to_string(d);
        check_outputs(P[d], what + " decode()");
        check_outputs(C[d], what + " ColdRace::launch");
      }
    }
  }

  SECTION("a stream, workspace or DeviceInfo of the other device is rejected before a launch") {
    // Current device 0, stream of device 1.
    REQUIRE(gpu_set_device(1));
    REQUIRE(poison_outputs(P[1]));
    REQUIRE(gpu_set_device(0));
    Status s = decode(P[1].dev, ws[1]->ptr, ws[1]->bytes, streams[1]->s);
    INFO(s.message());
    CHECK(!s.is_ok());
    if (detail::kStreamDeviceChecked) {
      CHECK(s.code() == StatusCode::invalid_argument);
      CHECK(s.message().find("stream = ") != std::string::npos);
      CHECK(s.message().find("device 1") != std::string::npos);
    }
    (void)gpu_take_last_error();  // a runtime that cannot tell fails the launch instead
    // Current device 1, its stream, the workspace of device 0.
    REQUIRE(gpu_set_device(1));
    s = decode(P[1].dev, ws[0]->ptr, ws[0]->bytes, streams[1]->s);
    INFO(s.message());
    CHECK(s.code() == StatusCode::invalid_argument);
    CHECK(s.message().find("workspace = ") != std::string::npos);
    CHECK(s.message().find("memory of device 0") != std::string::npos);
    REQUIRE(gpu_stream_sync(streams[1]->s));
    CHECK(outputs_untouched(P[1]));
    // Current device 0 with the DeviceInfo of device 1.
    REQUIRE(gpu_set_device(0));
    s = HotFp8::launch_with(P[0].dev, info[1], ws[0]->ptr, ws[0]->bytes, streams[0]->s);
    INFO(s.message());
    CHECK(s.code() == StatusCode::invalid_argument);
    CHECK(s.message().find("DeviceInfo.device = 1") != std::string::npos);
    // ... and the call with matching device, stream and workspace runs.
    REQUIRE(gpu_set_device(1));
    s = decode(P[1].dev, ws[1]->ptr, ws[1]->bytes, streams[1]->s);
    CHECK(s.is_ok());
    REQUIRE(gpu_stream_sync(streams[1]->s));
    check_outputs(P[1], "device 1 after the rejected calls");
  }
}
