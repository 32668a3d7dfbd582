// mlakit benchmark (Google Benchmark). Measures its own ceilings first (device copy and a
// cuBLAS bf16 matrix product), then sweeps decode shapes. Per shape: one correctness check of
// sampled rows against the double-precision reference, then timed calls rotating over KV sets
// so the cache does not sit in L2; counters give the median time, bytes/s and FLOP/s as
// counted as docs/design.md ("Work and traffic") says, percent of the measured ceilings, the plan
// (CTAs, partials) and the time with split-KV off (planner + combine overhead = time - time with
// splits off), and us_graph: the same calls captured in a CUDA graph, as a serving engine replays
// them (no host launch cost in it), and us_graph_plan_once: the same graph with one plan for
// all its calls (the first plans, the others run PlanStep::decode_only), as the layers of one
// model step share a plan.
// --plans also times split-KV off and fixed splits 2..64 (those whose workspace is at most
// 1 GiB), each in a CUDA graph as us_graph is, and reports the best plan other than the
// automatic one: us_best_other, best_splits (1 = none) and auto_over_best (us_graph / that
// time), and each plan's own time: us_fixed1 (split-KV off), us_fixed2 .. us_fixed64.
// --splits=N,N,... replaces the fixed counts --plans times (2, 4, 8, 16, 32, 64).
// --shape=H,Q,KV,B,L,PS (repeatable; KV fp8, fp8mm or bf16, causal) times only the shapes given;
// fp8mm: an fp8 e4m3fn cache with Compute::fp8_matrix (the opt-in fp8 matrix mode; its check
// against the reference allows 1e-1: this binary's random codes give sharp softmaxes, where one
// e4m3 plane of P errs most, 1.8e-2 to over 2.5e-2; docs/design.md has its error on N(0,1)
// and outlier data).
// --normal fills Q and KV with N(0, 1) values (bf16, or e4m3fn codes of them) and uses the
// softmax scale 576^-0.5, as bench/torch_bench.py does, instead of the default values in
// (-2, 2) of random mantissa with the scale 0.0721 (which give sharp softmaxes).
//   mlakit_bench [--quick] [--plans] [--normal] [--shape=...] [google benchmark flags, e.g.
//   --benchmark_format=json]
#include <benchmark/benchmark.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "gpu_harness.hpp"

using namespace mlakit;
using namespace mlakit::testing;

namespace {

double g_copy_tbps = 0, g_mma_tflops = 0;
std::uint8_t* g_pool = nullptr;  // random KV rows, large enough for the biggest shape
std::size_t g_pool_bytes = 0;
bool g_plans = false;                               // --plans: also time fixed split counts
std::vector<int> g_splits = {2, 4, 8, 16, 32, 64};  // --splits: the fixed counts --plans times

bool g_normal = false;  // --normal: N(0, 1) data (fill_random)

// N(0, 1) by Box-Muller from two hashes (24 bits of each).
__device__ float normal_of(std::uint32_t h1, std::uint32_t h2) {
  const float u1 = ((h1 >> 8) + 1u) * (1.0f / 16777216.0f);  // (0, 1]
  const float u2 = (h2 >> 8) * (1.0f / 16777216.0f);         // [0, 1)
  return sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}

// Two bytes of random data from the hash h: a bf16 value (fp8 = 0) or two e4m3fn codes (fp8 =
// 1), in (-2, 2) of random mantissa, or N(0, 1) with normal = 1.
__device__ std::uint16_t random_pair(std::uint32_t h, int fp8, int normal) {
  if (normal) {
    const std::uint32_t h2 = h * 3266489917u + 668265263u;
    const float a = normal_of(h, h2);
    if (!fp8) return __bfloat16_as_ushort(__float2bfloat16(a));
    const float b = normal_of(h2 ^ (h2 >> 16), h * 374761393u + 1u);
    return std::uint16_t(__nv_fp8_e4m3(a).__x | (__nv_fp8_e4m3(b).__x << 8));
  }
  if (fp8) {
    std::uint8_t a = h & 0xFF, b = (h >> 8) & 0xFF;
    if ((a & 0x7F) == 0x7F) a ^= 0x08;  // no NaN codes
    if ((b & 0x7F) == 0x7F) b ^= 0x08;
    return std::uint16_t(a | (b << 8));
  }
  // bf16 in (-2, 2): exponent 126/127, random mantissa and sign
  return std::uint16_t(((h & 1) << 15) | ((126 + ((h >> 1) & 1)) << 7) | ((h >> 2) & 0x7F));
}

// n bytes of random data (random_pair for each 16-bit unit).
__global__ void fill_random(std::uint8_t* p, std::size_t n, int fp8, std::uint32_t seed,
                            int normal) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n / 2;
       i += std::size_t(gridDim.x) * blockDim.x) {
    std::uint32_t h = std::uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    reinterpret_cast<std::uint16_t*>(p)[i] = random_pair(h, fp8, normal);
  }
}

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.f : v[v.size() / 2];
}

void measure_ceilings() {
  const std::size_t n = std::size_t(2) << 30;
  void *a, *b;
  cudaMalloc(&a, n);
  cudaMalloc(&b, n);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> t;
  for (int i = 0; i < 12; ++i) {
    cudaEventRecord(e0);
    cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    if (i >= 2) t.push_back(ms);
  }
  g_copy_tbps = 2.0 * n / (median(t) * 1e-3) / 1e12;
  cudaFree(a);
  cudaFree(b);
  const int N = 8192;
  void *A, *B, *C;
  cudaMalloc(&A, std::size_t(N) * N * 2);
  cudaMalloc(&B, std::size_t(N) * N * 2);
  cudaMalloc(&C, std::size_t(N) * N * 2);
  fill_random<<<1024, 256>>>(static_cast<std::uint8_t*>(A), std::size_t(N) * N * 2, 0, 1, 0);
  fill_random<<<1024, 256>>>(static_cast<std::uint8_t*>(B), std::size_t(N) * N * 2, 0, 2, 0);
  cublasHandle_t h;
  cublasCreate(&h);
  const float one = 1.f, zero = 0.f;
  t.clear();
  for (int i = 0; i < 12; ++i) {
    cudaEventRecord(e0);
    cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, N, N, N, &one, A, CUDA_R_16BF, N, B, CUDA_R_16BF, N,
                 &zero, C, CUDA_R_16BF, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    if (i >= 2) t.push_back(ms);
  }
  g_mma_tflops = 2.0 * N * double(N) * N / (median(t) * 1e-3) / 1e12;
  cublasDestroy(h);
  cudaFree(A);
  cudaFree(B);
  cudaFree(C);
}

struct Shape {
  int heads, q_len;
  DType kv;
  int batch, kv_len, page_size;
  bool causal = true;
  Compute compute = Compute::standard;
};

// Gathers the KV rows of request b into a contiguous buffer (for the reference check).
__global__ void gather_rows(const std::uint8_t* pool, const std::int32_t* indices, int ps,
                            std::size_t row_bytes, int n, std::uint8_t* out) {
  for (int j = blockIdx.x; j < n; j += gridDim.x) {
    const std::uint8_t* src = pool + (std::size_t(indices[j / ps]) * ps + j % ps) * row_bytes;
    for (std::size_t k = threadIdx.x; k < row_bytes; k += blockDim.x)
      out[std::size_t(j) * row_bytes + k] = src[k];
  }
}

void run_shape(benchmark::State& st, Shape s) {
  const std::size_t eb = dtype_bytes(s.kv), row_bytes = 576 * eb;
  const std::size_t pages_per_req = (s.kv_len + s.page_size - 1) / s.page_size;
  const std::size_t set_pages = pages_per_req * s.batch;
  const std::size_t set_bytes = set_pages * s.page_size * row_bytes;
  const std::size_t pool_pages = g_pool_bytes / (s.page_size * row_bytes);
  if (set_pages > pool_pages) {
    st.SkipWithError("does not fit in the pool");
    return;
  }
  // Rotate over sets until ~1 GB is touched (L2 is 60 MB), within the pool.
  const int sets = int(std::max<std::size_t>(
      1, std::min<std::size_t>(pool_pages / set_pages,
                               (std::size_t(1) << 30) / std::max<std::size_t>(set_bytes, 1) + 1)));
  std::mt19937 rng(s.heads * 131 + s.q_len * 7 + s.batch + s.kv_len);
  // Page ids: a random permutation of the pool's pages (CSR, one shuffled list per set).
  std::vector<std::int32_t> perm(pool_pages);
  for (std::size_t i = 0; i < pool_pages; ++i) perm[i] = std::int32_t(i);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<std::int32_t> indptr(s.batch + 1), lens(s.batch, s.kv_len);
  for (int b = 0; b <= s.batch; ++b) indptr[b] = std::int32_t(b * pages_per_req);
  DeviceBuffer d_idx(std::size_t(sets) * set_pages * 4), d_indptr(indptr.size() * 4),
      d_len(lens.size() * 4);
  gpu_h2d(d_idx.ptr, perm.data(), std::size_t(sets) * set_pages * 4);
  gpu_h2d(d_indptr.ptr, indptr.data(), indptr.size() * 4);
  gpu_h2d(d_len.ptr, lens.data(), lens.size() * 4);
  const std::size_t q_elems = std::size_t(s.batch) * s.q_len * s.heads * 576;
  const std::size_t o_elems = std::size_t(s.batch) * s.q_len * s.heads * 512;
  DeviceBuffer d_q(q_elems * 2), d_o(o_elems * 2), d_lse(o_elems / 512 * 4);
  fill_random<<<1024, 256>>>(d_q.as<std::uint8_t>(), q_elems * 2, 0, 7, g_normal);
  DecodeArgs a;
  a.q_type = DType::bf16;
  a.kv_type = s.kv;
  a.batch = s.batch;
  a.num_heads = s.heads;
  a.q_len = s.q_len;
  a.causal = s.causal;
  a.page_size = s.page_size;
  a.page_ids = PageIds::csr;
  set_packed_strides(a);
  a.q = d_q.ptr;
  a.kv = g_pool;
  a.out = d_o.ptr;
  a.lse = nullptr;
  a.kv_indptr = d_indptr.as<std::int32_t>();
  a.kv_indices = d_idx.as<std::int32_t>();
  a.kv_len = d_len.as<std::int32_t>();
  a.softmax_scale = g_normal ? 1.0f / 24.0f : 0.0721f;
  a.kv_scale = is_fp8(s.kv) && !g_normal ? 0.01f : 1.0f;
  a.compute = s.compute;
  DeviceInfo dev;
  cached_device_info(&dev);
  DeviceBuffer ws(workspace_bytes(a, dev));

  // Correctness: 8 sampled rows of request 0 and request batch-1 against the reference.
  {
    Status stc = decode(a, ws.ptr, ws.bytes, nullptr);
    if (!stc || !gpu_sync()) {
      st.SkipWithError(stc.message().c_str());
      return;
    }
    std::vector<std::uint16_t> out(o_elems), q(q_elems);
    gpu_d2h(out.data(), d_o.ptr, o_elems * 2);
    gpu_d2h(q.data(), d_q.ptr, q_elems * 2);
    double worst = 0;
    for (int b : {0, s.batch - 1}) {
      DeviceBuffer rows(std::size_t(s.kv_len) * row_bytes);
      gather_rows<<<1024, 128>>>(g_pool, d_idx.as<std::int32_t>() + b * pages_per_req, s.page_size,
                                 row_bytes, s.kv_len, rows.as<std::uint8_t>());
      std::vector<std::uint8_t> kv(std::size_t(s.kv_len) * row_bytes);
      gpu_d2h(kv.data(), rows.ptr, kv.size());
      DecodeArgs h = a;
      std::int32_t zero = 0, len = s.kv_len, ip[2] = {0, 1};
      h.batch = 1;
      h.q = q.data() + std::size_t(b) * a.q_stride_batch;
      h.kv = kv.data();
      h.page_size = std::max(1, s.kv_len);
      h.kv_stride_page = std::int64_t(h.page_size) * 576;
      h.kv_indptr = ip;
      h.kv_indices = &zero;
      h.kv_len = &len;
      for (int k = 0; k < 4; ++k) {
        const int t = rng() % s.q_len, hd = rng() % s.heads;
        double o[512], lse;
        reference::decode_reference_range(h, 0, t, hd, 0, s.kv_len, o, &lse);
        std::vector<double> ref(o, o + 512), got(512);
        for (int d = 0; d < 512; ++d)
          got[d] = decode_bf16(out[((std::size_t(b) * s.q_len + t) * s.heads + hd) * 512 + d]);
        worst = std::max(worst, reference::rel_l2_error(ref, got));
      }
    }
    st.counters["check_rel_l2"] = worst;
    if (!(worst < (s.compute == Compute::fp8_matrix ? 1e-1 : 1e-2))) {
      st.SkipWithError("reference check failed");
      return;
    }
  }

  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  auto time_call = [&](const DecodeArgs& args, int set, void* wsp = nullptr,
                       std::size_t ws_bytes = 0) {
    DecodeArgs x = args;
    x.kv_indices = d_idx.as<std::int32_t>() + std::size_t(set) * set_pages;
    if (wsp == nullptr) {
      wsp = ws.ptr;
      ws_bytes = ws.bytes;
    }
    cudaEventRecord(e0);
    decode(x, wsp, ws_bytes, nullptr);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    return ms;
  };
  for (int i = 0; i < 3; ++i) time_call(a, i % sets);
  std::vector<float> times;
  int it = 0;
  for (auto _ : st) {
    const float ms = time_call(a, it++ % sets);
    times.push_back(ms);
    st.SetIterationTime(ms * 1e-3);
  }
  int header[3] = {0, 0, 0};  // plan of the automatic-split runs: [2] = partial slots used
  gpu_d2h(header, ws.ptr, sizeof(header));
  DecodeArgs none = a;
  none.split_mode = SplitMode::none;
  std::vector<float> t_none;
  for (int i = 0; i < 10; ++i) t_none.push_back(time_call(none, i % sets));
  // The whole call as a serving engine replays it: K calls (rotating KV sets) captured in one
  // CUDA graph, median of 10 replays / K (ms per call; 0 when capture or replay failed). No
  // host launch cost in it, unlike `us`. With `plan_once` only the first call plans and the
  // others decode with its plan (PlanStep::decode_only), as the layers of one model step can.
  auto graph_time = [&](const DecodeArgs& args, void* wsp, std::size_t ws_bytes,
                        bool plan_once = false) {
    float per_call = 0;
    const int K = std::min(sets, 64);
    cudaStream_t gs;
    cudaStreamCreateWithFlags(&gs, cudaStreamNonBlocking);
    cudaGraph_t g = nullptr;
    cudaGraphExec_t ge = nullptr;
    bool ok = cudaStreamBeginCapture(gs, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
    for (int k = 0; ok && k < K; ++k) {
      DecodeArgs x = args;
      x.kv_indices = d_idx.as<std::int32_t>() + std::size_t(k) * set_pages;
      if (plan_once && k > 0) x.plan_step = PlanStep::decode_only;
      ok = bool(decode(x, wsp, ws_bytes, gs));
    }
    ok = (cudaStreamEndCapture(gs, &g) == cudaSuccess) && ok;
    ok = ok && cudaGraphInstantiate(&ge, g, 0) == cudaSuccess;
    if (ok) {
      cudaGraphLaunch(ge, gs);
      cudaGraphLaunch(ge, gs);
      std::vector<float> tg;
      for (int i = 0; i < 10; ++i) {
        cudaEventRecord(e0, gs);
        cudaGraphLaunch(ge, gs);
        cudaEventRecord(e1, gs);
        cudaEventSynchronize(e1);
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        tg.push_back(ms / K);
      }
      per_call = median(tg);
    }
    if (ge) cudaGraphExecDestroy(ge);
    if (g) cudaGraphDestroy(g);
    cudaStreamDestroy(gs);
    return per_call;
  };
  const float graph_ms = graph_time(a, ws.ptr, ws.bytes);
  st.counters["us_graph"] = graph_ms * 1e3;
  st.counters["us_graph_plan_once"] = graph_time(a, ws.ptr, ws.bytes, true) * 1e3;
  const double sec = median(times) * 1e-3;
  const double tokens = double(s.batch) * s.kv_len;
  const double bytes = tokens * row_bytes + q_elems * 2.0 + o_elems * 2.0;
  const double flops = 2.0 * s.q_len * s.heads * (576 + 512) * tokens;
  st.counters["us"] = sec * 1e6;
  st.counters["us_split_off"] = median(t_none) * 1e3;
  st.counters["TBps"] = bytes / sec / 1e12;
  st.counters["TFLOPs"] = flops / sec / 1e12;
  st.counters["pct_bw"] = 100.0 * bytes / sec / 1e12 / g_copy_tbps;
  st.counters["pct_mma"] = 100.0 * flops / sec / 1e12 / g_mma_tflops;
  const PlanShape plan = detail::plan_shape(a, detail::policy_index(a, dev), dev);
  if (g_plans && graph_ms > 0) {
    // Every plan timed the way us_graph is (in a CUDA graph), so that the ratio compares GPU
    // time only: event-timed calls of a few tens of microseconds move with the host's launch
    // cost.
    DecodeArgs off = a;
    off.split_mode = SplitMode::none;
    double best = graph_time(off, ws.ptr, ws.bytes);  // ms
    int best_n = 1;
    st.counters["us_fixed1"] = best * 1e3;
    for (int n : g_splits) {
      DecodeArgs f = a;
      f.split_mode = SplitMode::fixed;
      f.num_splits = n;
      std::size_t bytes = 0;
      if (!workspace_bytes(f, dev, &bytes) || bytes > (std::size_t(1) << 30)) continue;
      DeviceBuffer wf(bytes);
      DecodeArgs x = f;
      x.kv_indices = d_idx.as<std::int32_t>();
      if (!decode(x, wf.ptr, wf.bytes, nullptr) || !gpu_sync()) continue;
      const float t = graph_time(f, wf.ptr, wf.bytes);
      if (t > 0) st.counters["us_fixed" + std::to_string(n)] = t * 1e3;
      if (t > 0 && (best <= 0 || t < best)) {
        best = t;
        best_n = n;
      }
    }
    st.counters["us_best_other"] = best * 1e3;
    st.counters["best_splits"] = best_n;
    st.counters["auto_over_best"] = best > 0 ? graph_ms / best : 0;
  }
  st.counters["ctas"] = double(plan.row_tiles) * plan.num_ctas;
  st.counters["partials"] = header[2];
  st.counters["copy_TBps"] = g_copy_tbps;
  st.counters["mma_TFLOPs"] = g_mma_tflops;
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

// Times `enqueue()` (host CPU time per call) on `stream`, draining the stream every 256 calls
// outside the timing so that the launch queue never fills.
template <class F>
void time_enqueue(benchmark::State& st, cudaStream_t stream, const F& enqueue) {
  int n = 0;
  for (auto _ : st) {
    enqueue(n);
    if (++n % 256 == 0) {
      st.PauseTiming();
      cudaStreamSynchronize(stream);
      st.ResumeTiming();
    }
  }
  cudaStreamSynchronize(stream);
}

// Host cost of decode(): validation + dispatch + launch enqueue, per call.
void BM_host_api(benchmark::State& st) {
  Shape s{16, 8, DType::fp8_e4m3fn, 128, 8192, 1};
  DecodeArgs a;
  a.q_type = DType::bf16;
  a.kv_type = s.kv;
  a.batch = s.batch;
  a.num_heads = 16;
  a.q_len = 8;
  a.page_size = 1;
  a.page_ids = PageIds::csr;
  set_packed_strides(a);
  DeviceBuffer q(std::size_t(128) * 8 * 16 * 576 * 2), o(std::size_t(128) * 8 * 16 * 512 * 2),
      ip(4 * 129), idx(4), len(4 * 128);
  std::vector<std::int32_t> zeros(129, 0);
  gpu_h2d(ip.ptr, zeros.data(), 129 * 4);
  gpu_h2d(len.ptr, zeros.data(), 128 * 4);
  a.q = q.ptr;
  a.kv = g_pool;
  a.out = o.ptr;
  a.kv_indptr = ip.as<std::int32_t>();
  a.kv_indices = idx.as<std::int32_t>();
  a.kv_len = len.as<std::int32_t>();
  a.softmax_scale = 0.07f;
  DeviceInfo dev;
  cached_device_info(&dev);
  DeviceBuffer ws(workspace_bytes(a, dev));
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  decode(a, ws.ptr, ws.bytes, stream);  // kv_len 0: kernels do almost nothing
  cudaStreamSynchronize(stream);
  time_enqueue(st, stream,
               [&](int) { benchmark::DoNotOptimize(decode(a, ws.ptr, ws.bytes, stream)); });
  cudaStreamDestroy(stream);
}

__global__ void empty_kernel(int) {}

// Host cost of one kernel launch as decode() makes it (cudaLaunchKernelExC, 132 x 128
// threads, an empty kernel): the floor under host_api/decode_enqueue, which makes two or
// three of them.
void BM_empty_launch(benchmark::State& st) {
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  time_enqueue(st, stream, [&](int n) {
    void* argv[] = {&n};
    cudaLaunchConfig_t c = {};
    c.gridDim = dim3(132);
    c.blockDim = dim3(128);
    c.stream = stream;
    benchmark::DoNotOptimize(
        cudaLaunchKernelExC(&c, reinterpret_cast<const void*>(empty_kernel), argv));
  });
  cudaStreamDestroy(stream);
}

std::string shape_name(const Shape& s) {
  return std::string("decode/h") + std::to_string(s.heads) + "/q" + std::to_string(s.q_len) + "/" +
         (s.kv == DType::bf16 ? "bf16" : s.compute == Compute::fp8_matrix ? "fp8mm" : "fp8") +
         "/b" + std::to_string(s.batch) + "/kv" +
         std::to_string(s.kv_len) + "/ps" + std::to_string(s.page_size);
}

// The shapes timed without --shape: the quick set, and with quick false the full sweep.
std::vector<Shape> default_shapes(bool quick) {
  std::vector<Shape> shapes;
  // The issue's reference points: 16 heads, batch 128, kv_len 8192.
  for (DType kv : {DType::fp8_e4m3fn, DType::bf16})
    for (int q : {1, 2, 4, 8, 16})
      for (int ps : {1, 64}) shapes.push_back({16, q, kv, 128, 8192, ps});
  // Small-batch latency points (whole call dominated by launches and the split merge).
  for (DType kv : {DType::fp8_e4m3fn, DType::bf16})
    for (int q : {1, 8}) shapes.push_back({16, q, kv, 1, 8192, 64});
  shapes.push_back({16, 1, DType::fp8_e4m3fn, 1, 131072, 64});
  shapes.push_back({16, 8, DType::fp8_e4m3fn, 1, 32768, 64});
  // Batch 32 at q_len 8 (a verify step of a mid-size serving batch).
  for (DType kv : {DType::fp8_e4m3fn, DType::bf16}) shapes.push_back({16, 8, kv, 32, 8192, 64});
  // Speculative verify (q_len 8) at the batches a serving engine captures in graphs, at 16
  // heads and at 12 (a 96-head model at tensor parallelism 8), and 12 heads at batch 128.
  for (int h : {12, 16})
    for (int b : {1, 8, 16, 32, 128})
      for (DType kv : {DType::fp8_e4m3fn, DType::bf16})
        if (h == 12 || b == 8 || b == 16) shapes.push_back({h, 8, kv, b, 8192, 64});
  // 128 heads at q_len 1 (a DeepSeek-V3 layer without tensor parallelism), batch 128.
  for (DType kv : {DType::fp8_e4m3fn, DType::bf16}) shapes.push_back({128, 1, kv, 128, 8192, 64});
  // The opt-in fp8 matrix mode (fp8mm) at the 64-row shapes it is for.
  const int mm[][4] = {{16, 4, 128, 64}, {16, 8, 128, 64}, {16, 8, 128, 1}, {16, 8, 32, 64},
                       {12, 8, 32, 64},  {16, 8, 8, 64},   {16, 8, 1, 64},  {128, 1, 128, 64}};
  for (const auto& m : mm) {
    Shape s{m[0], m[1], DType::fp8_e4m3fn, m[2], 8192, m[3]};
    s.compute = Compute::fp8_matrix;
    shapes.push_back(s);
  }
  if (!quick) {
    for (int h : {12, 32, 64, 128})
      for (int q : {1, 2, 4, 8, 16})
        for (DType kv : {DType::fp8_e4m3fn, DType::bf16})
          if (!(h == 12 && q == 8)) shapes.push_back({h, q, kv, 32, 8192, 64});  // above
    for (int q : {1, 8})
      for (int b : {1, 8, 32, 128})
        for (int L : {1024, 8192, 32768, 131072})
          for (DType kv : {DType::fp8_e4m3fn, DType::bf16})
            if (!(b == 128 && L == 8192)) shapes.push_back({16, q, kv, b, L, 1});
    // Small batches of 32 and 64 rows with an fp8 cache (an MTP step of one draft token, a
    // short speculative verify), page 64.
    for (int q : {2, 4})
      for (int b : {1, 8})
        for (int L : {8192, 32768}) shapes.push_back({16, q, DType::fp8_e4m3fn, b, L, 64});
  }
  return shapes;
}

}  // namespace

int main(int argc, char** argv) {
  if (!gpu_present()) {
    std::printf("no GPU present: nothing to benchmark\n");
    return 0;
  }
  bool quick = false;
  std::vector<char*> args;
  std::vector<Shape> given;
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") {
      quick = true;
    } else if (arg == "--plans") {
      g_plans = true;
    } else if (arg == "--normal") {
      g_normal = true;
    } else if (arg.rfind("--splits=", 0) == 0) {
      g_splits.clear();
      for (const char* c = arg.c_str() + 9; *c != 0;) {
        char* end = nullptr;
        const long n = std::strtol(c, &end, 10);
        if (end == c || n < 2 || n > 4096) {
          std::printf("%s: expected --splits=N,N,... (2..4096)\n", arg.c_str());
          return 1;
        }
        g_splits.push_back(static_cast<int>(n));
        c = *end == ',' ? end + 1 : end;
      }
    } else if (arg.rfind("--shape=", 0) == 0) {
      Shape s{};
      char kv[8] = {};
      if (std::sscanf(arg.c_str() + 8, "%d,%d,%7[a-z0-9],%d,%d,%d", &s.heads, &s.q_len, kv,
                      &s.batch, &s.kv_len, &s.page_size) != 6 ||
          (std::string(kv) != "fp8" && std::string(kv) != "fp8mm" && std::string(kv) != "bf16")) {
        std::printf("%s: expected --shape=H,Q,fp8|fp8mm|bf16,B,L,PS\n", arg.c_str());
        return 1;
      }
      s.kv = std::string(kv) == "bf16" ? DType::bf16 : DType::fp8_e4m3fn;
      if (std::string(kv) == "fp8mm") s.compute = Compute::fp8_matrix;
      given.push_back(s);
    } else {
      args.push_back(argv[i]);
    }
  }
  measure_ceilings();
  std::printf("ceilings: device copy %.2f TB/s (read + write), cuBLAS bf16 8192^3 %.0f TFLOP/s\n",
              g_copy_tbps, g_mma_tflops);
  g_pool_bytes = std::size_t(24) << 30;
  if (cudaMalloc(&g_pool, g_pool_bytes) != cudaSuccess) {
    std::printf("pool alloc failed\n");
    return 1;
  }
  // fp8 codes; bf16 shapes refill the pool with bf16 values below.
  fill_random<<<4096, 256>>>(g_pool, g_pool_bytes, 1, 3, g_normal);
  cudaDeviceSynchronize();
  const std::vector<Shape> shapes = given.empty() ? default_shapes(quick) : given;
  for (const Shape& s : shapes) {
    benchmark::RegisterBenchmark(shape_name(s).c_str(),
                                 [s](benchmark::State& st) {
                                   // bf16 shapes: refill the pool region with bf16 values once per
                                   // dtype switch
                                   static DType filled = DType::fp8_e4m3fn;
                                   if (s.kv != filled) {
                                     fill_random<<<4096, 256>>>(g_pool, g_pool_bytes,
                                                                is_fp8(s.kv) ? 1 : 0, 3, g_normal);
                                     cudaDeviceSynchronize();
                                     filled = s.kv;
                                   }
                                   run_shape(st, s);
                                 })
        ->UseManualTime()
        ->Iterations(20)
        ->Unit(benchmark::kMicrosecond);
  }
  benchmark::RegisterBenchmark("host_api/decode_enqueue", BM_host_api)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("host_api/empty_launch", BM_empty_launch)
      ->Unit(benchmark::kMicrosecond);
  int n = int(args.size());
  benchmark::Initialize(&n, args.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  cudaFree(g_pool);
  return 0;
}
