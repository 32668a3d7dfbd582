#pragma once
// GPU test harness: builds a random paged problem on the host (NaN-poisoned unused pages
// and page tails), runs decode() on the device with NaN-poisoned outputs, and compares with
// the double-precision reference. Shared by the GPU tests, the examples and the benchmark.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <future>
#include <mlakit/mlakit.hpp>
#include <mlakit/reference/decode_reference.hpp>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "uniform.hpp"

namespace mlakit::testing {

#if defined(MLAKIT_HAS_CUDA_RUNTIME_API)
#define MLAKIT_T_CHECK(x) gpu_check((x), #x, __FILE__, __LINE__)
inline bool gpu_check(cudaError_t e, const char* what, const char* file, int line) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "%s:%d: %s: %s\n", file, line, what, cudaGetErrorString(e));
  return false;
}
inline bool gpu_malloc(void** p, std::size_t n) { return MLAKIT_T_CHECK(cudaMalloc(p, n)); }
inline void gpu_free(void* p) { cudaFree(p); }
inline bool gpu_h2d(void* d, const void* h, std::size_t n) {
  return MLAKIT_T_CHECK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
}
inline bool gpu_d2h(void* h, const void* d, std::size_t n) {
  return MLAKIT_T_CHECK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
}
inline bool gpu_sync() { return MLAKIT_T_CHECK(cudaDeviceSynchronize()); }
inline bool gpu_present() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}
inline int gpu_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}
inline bool gpu_set_device(int d) { return MLAKIT_T_CHECK(cudaSetDevice(d)); }
inline int gpu_current_device() {
  int d = -1;
  return MLAKIT_T_CHECK(cudaGetDevice(&d)) ? d : -1;
}
inline bool gpu_stream_create(Stream* s) { return MLAKIT_T_CHECK(cudaStreamCreate(s)); }
inline void gpu_stream_destroy(Stream s) { cudaStreamDestroy(s); }
inline bool gpu_stream_sync(Stream s) { return MLAKIT_T_CHECK(cudaStreamSynchronize(s)); }
// The calling thread's last runtime error, left in place / read and cleared.
inline int gpu_peek_last_error() { return static_cast<int>(cudaPeekAtLastError()); }
inline int gpu_take_last_error() { return static_cast<int>(cudaGetLastError()); }
// Leaves a non-sticky error on the calling thread, as unrelated code might: a call with an
// invalid device ordinal (the device count). Returns the error code now pending.
inline int gpu_plant_error() {
  (void)cudaSetDevice(gpu_count());
  return static_cast<int>(cudaErrorInvalidDevice);
}
// True when the runtime keeps a failed call's error until cudaGetLastError reads it (CUDA).
inline constexpr bool kLastErrorPersists = true;
inline const char* gpu_error_name(int e) { return cudaGetErrorName(static_cast<cudaError_t>(e)); }
#elif defined(MLAKIT_HAS_HIP_RUNTIME_API)
#define MLAKIT_T_CHECK(x) gpu_check((x), #x, __FILE__, __LINE__)
inline bool gpu_check(hipError_t e, const char* what, const char* file, int line) {
  if (e == hipSuccess) return true;
  std::fprintf(stderr, "%s:%d: %s: %s\n", file, line, what, hipGetErrorString(e));
  return false;
}
inline bool gpu_malloc(void** p, std::size_t n) { return MLAKIT_T_CHECK(hipMalloc(p, n)); }
inline void gpu_free(void* p) { (void)hipFree(p); }
inline bool gpu_h2d(void* d, const void* h, std::size_t n) {
  return MLAKIT_T_CHECK(hipMemcpy(d, h, n, hipMemcpyHostToDevice));
}
inline bool gpu_d2h(void* h, const void* d, std::size_t n) {
  return MLAKIT_T_CHECK(hipMemcpy(h, d, n, hipMemcpyDeviceToHost));
}
inline bool gpu_sync() { return MLAKIT_T_CHECK(hipDeviceSynchronize()); }
inline bool gpu_present() {
  int n = 0;
  return hipGetDeviceCount(&n) == hipSuccess && n > 0;
}
inline int gpu_count() {
  int n = 0;
  return hipGetDeviceCount(&n) == hipSuccess ? n : 0;
}
inline bool gpu_set_device(int d) { return MLAKIT_T_CHECK(hipSetDevice(d)); }
inline int gpu_current_device() {
  int d = -1;
  return MLAKIT_T_CHECK(hipGetDevice(&d)) ? d : -1;
}
inline bool gpu_stream_create(Stream* s) { return MLAKIT_T_CHECK(hipStreamCreate(s)); }
inline void gpu_stream_destroy(Stream s) { (void)hipStreamDestroy(s); }
inline bool gpu_stream_sync(Stream s) { return MLAKIT_T_CHECK(hipStreamSynchronize(s)); }
inline int gpu_peek_last_error() { return static_cast<int>(hipPeekAtLastError()); }
inline int gpu_take_last_error() { return static_cast<int>(hipGetLastError()); }
inline int gpu_plant_error() {
  (void)hipSetDevice(gpu_count());
  return static_cast<int>(hipErrorInvalidDevice);
}
// HIP runtimes before 7.0 overwrite the last error with the result of every API call, so a
// planted error does not survive any runtime call there, the library's or not.
inline constexpr bool kLastErrorPersists = HIP_VERSION >= 70000000;
inline const char* gpu_error_name(int e) { return hipGetErrorName(static_cast<hipError_t>(e)); }
#endif

// One device buffer, freed on scope exit.
struct DeviceBuffer {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t n) : bytes(n) {
    if (n > 0 && !gpu_malloc(&ptr, n)) ptr = nullptr;
  }
  // A device copy of h (h.size() * sizeof(T) bytes); ptr stays null when the allocation or the
  // copy fails (the error is printed). T is deduced only from a vector, so a size argument
  // always selects the constructor above.
  template <class T>
  explicit DeviceBuffer(const std::vector<T>& h) : DeviceBuffer(h.size() * sizeof(T)) {
    if (ptr && !gpu_h2d(ptr, h.data(), bytes)) {
      gpu_free(ptr);
      ptr = nullptr;
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr) gpu_free(ptr);
  }
  // Frees the old buffer and allocates n bytes.
  bool reset(std::size_t n) {
    if (ptr) gpu_free(ptr);
    ptr = nullptr;
    bytes = n;
    return n == 0 || gpu_malloc(&ptr, n);
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr);
  }
  // The first n elements of the buffer as T, into h (resized to n); false when the copy fails
  // (the error is printed).
  template <class T>
  bool download(std::vector<T>& h, std::size_t n) const {
    h.resize(n);
    return gpu_d2h(h.data(), ptr, n * sizeof(T));
  }
};

struct Case {
  DType q_type = DType::bf16;
  DType kv_type = DType::fp8_e4m3fn;
  int heads = 16;
  int q_len = 8;
  bool causal = true;
  int page_size = 1;
  PageIds ids = PageIds::csr;
  std::vector<int> kv_lens = {300, 1000};
  SplitMode split = SplitMode::automatic;
  int num_splits = 0;
  bool lse = true;
  LseFormat lse_format = LseFormat::natural;
  std::uint64_t seed = 1;
  float q_magnitude = 1.0f;  // larger values make the softmax peaky
  // Token j of a request of kv_len L is scaled by (1 + kv_ramp j / L) / (1 + kv_ramp): the
  // largest score grows along the keys, so an online softmax's running max moves many times.
  float kv_ramp = 0.0f;
  // Row r (token * heads + head, per request) is scaled by 2^(q_row_octaves * (r % 3 - 1)):
  // rows far outside the fp16 range (bf16 Q) next to ordinary ones.
  int q_row_octaves = 0;
  // Measure the LSE error relative to max(1, |lse|) (rows whose scores reach 2^40 carry the
  // f32 rounding of a dot product of that size; an absolute bound would test f32 itself).
  bool lse_relative = false;
  // Scales given by the case (0: drawn from the seed, as for every other case).
  float softmax_scale = 0.0f, kv_scale = 0.0f;
  // The rotary values in a cache of their own (DecodeArgs::kv_rope): kv rows of 528 values
  // (the 512 latent ones, then NaN) and rope rows of 80 (the 64 rotary ones, then NaN), each
  // page one row longer than page_size, so no stride equals the joined cache's.
  bool split_cache = false;
  // A joined cache with rows of 592 values (the 576, then NaN) and pages one row longer than
  // page_size: KV strides other than the packed ones (split_cache, if set, takes precedence).
  bool padded_cache = false;
  Compute compute = Compute::standard;

  std::string name() const {
    std::string s = std::string(dtype_name(q_type)) + "/" + dtype_name(kv_type) + " h" +
                    std::to_string(heads) + " q" + std::to_string(q_len) +
                    (causal ? " causal" : " full") + " ps" + std::to_string(page_size) +
                    (ids == PageIds::csr ? " csr" : " bt") + " split" + std::to_string(int(split)) +
                    "/" + std::to_string(num_splits) +
                    (lse ? " lse" + std::to_string(int(lse_format)) : "") +
                    (split_cache ? " kv_rope" : "") + (padded_cache ? " padded" : "") +
                    (compute == Compute::fp8_matrix ? " fp8_matrix" : "") + " lens";
    for (std::size_t i = 0; i < kv_lens.size() && i < 6; ++i) s += " " + std::to_string(kv_lens[i]);
    if (kv_lens.size() > 6) s += " ...(" + std::to_string(kv_lens.size()) + ")";
    return s;
  }
};

// The shape that aborts a production ROCm stack: bf16 Q, fp8 e4m3fn KV, 16 heads, q_len 8,
// causal, page size 1 with CSR page ids, over requests of `kv_lens` tokens.
inline Case seed_shape(std::vector<int> kv_lens) {
  Case c;
  c.q_type = DType::bf16;
  c.kv_type = DType::fp8_e4m3fn;
  c.heads = 16;
  c.q_len = 8;
  c.causal = true;
  c.page_size = 1;
  c.ids = PageIds::csr;
  c.kv_lens = std::move(kv_lens);
  return c;
}

inline std::uint16_t nan_bits16(DType t) { return t == DType::bf16 ? 0x7FC0 : 0x7E00; }
inline std::uint8_t nan_bits8(DType t) { return t == DType::fp8_e4m3fn ? 0x7F : 0x80; }

inline std::uint16_t encode16(DType t, float v) {
  return t == DType::bf16 ? encode_bf16(v) : encode_fp16(v);
}

// A problem on the host and its device copy.
struct TestProblem {
  Case c;
  DecodeArgs host;  // pointers to the host vectors below
  DecodeArgs dev;   // same strides, device pointers
  std::vector<std::uint16_t> q;
  std::vector<std::uint8_t> kv;       // raw cache bytes (the latent part with split_cache)
  std::vector<std::uint8_t> kv_rope;  // split_cache: the rotary part
  std::vector<std::int32_t> block_table, indptr, indices, kv_len;
  DeviceBuffer d_q, d_kv, d_kv_rope, d_bt, d_indptr, d_indices, d_kv_len, d_out, d_lse;
  std::size_t out_elems = 0, lse_elems = 0;
  bool ok = false;
};

// Builds a random problem. Pages are assigned in a random order, with unused pages and the
// tail of each request's last page filled with NaN so that any read past kv_len shows up.
inline void build(TestProblem& P, const Case& c) {
  P.c = c;
  std::mt19937_64 rng(c.seed);
  DecodeArgs a;
  a.q_type = c.q_type;
  a.kv_type = c.kv_type;
  a.batch = static_cast<int>(c.kv_lens.size());
  a.num_heads = c.heads;
  a.q_len = c.q_len;
  a.causal = c.causal;
  a.page_size = c.page_size;
  a.page_ids = c.ids;
  a.split_mode = c.split;
  a.num_splits = c.num_splits;
  a.compute = c.compute;
  a.softmax_scale = 1.0f / std::sqrt(192.0f) * (0.8f + 0.4f * (uniform(rng) + 1.0f) / 2.0f);
  // kv_scale applies to every cache type: odd seeds give 16-bit caches a scale in [0.5, 1).
  a.kv_scale = is_fp8(c.kv_type) ? 0.02f + 0.01f * uniform(rng)
               : (c.seed % 2)    ? 0.75f + 0.25f * uniform(rng)
                                 : 1.0f;
  if (c.softmax_scale > 0.0f) a.softmax_scale = c.softmax_scale;
  if (c.kv_scale > 0.0f) a.kv_scale = c.kv_scale;
  std::vector<int> pages_of(a.batch);
  int max_pages = 1, used_pages = 0;
  for (int b = 0; b < a.batch; ++b) {
    pages_of[b] = (c.kv_lens[b] + c.page_size - 1) / c.page_size;
    max_pages = std::max(max_pages, pages_of[b]);
    used_pages += pages_of[b];
  }
  const int spare = 3 + used_pages / 10;  // never referenced: poisoned
  const int num_pages = used_pages + spare;
  a.max_pages_per_request = max_pages;
  set_packed_strides(a);

  // Q
  const std::size_t q_elems = std::size_t(a.batch) * a.q_len * a.num_heads * kHeadDimQK;
  P.q.resize(q_elems);
  for (std::size_t i = 0; i < q_elems; ++i) {
    const int row = int(i / kHeadDimQK % (std::size_t(a.q_len) * a.num_heads));
    const float octave = std::ldexp(1.0f, c.q_row_octaves * (row % 3 - 1));
    P.q[i] = encode16(c.q_type, uniform(rng) * c.q_magnitude * octave);
  }
  // KV cache: random values everywhere, then NaN where nothing may be read.
  const std::size_t eb = dtype_bytes(c.kv_type);
  const std::size_t row_bytes = kHeadDimQK * eb;
  P.kv.assign(std::size_t(num_pages) * c.page_size * row_bytes, 0);
  auto put = [&](std::size_t row, int d, float v) {
    std::uint8_t* p = P.kv.data() + row * row_bytes + d * eb;
    if (eb == 2) {
      const std::uint16_t h = encode16(c.kv_type, v);
      std::memcpy(p, &h, 2);
    } else {
      *p = c.kv_type == DType::fp8_e4m3fn ? encode_e4m3fn(v) : encode_e4m3fnuz(v);
    }
  };
  auto fill_nan = [&](std::uint8_t* p, std::size_t values) {  // `values` NaNs of the KV type
    for (std::size_t d = 0; d < values; ++d) {
      if (eb == 2) {
        const std::uint16_t h = nan_bits16(c.kv_type);
        std::memcpy(p + 2 * d, &h, 2);
      } else {
        p[d] = nan_bits8(c.kv_type);
      }
    }
  };
  auto poison = [&](std::size_t row) { fill_nan(P.kv.data() + row * row_bytes, kHeadDimQK); };
  // The relaid caches below (split_cache, padded_cache): `row` values per token, pages one row
  // longer than page_size, values [from, from + values) of each joined token row at the start
  // of its row, NaN everywhere else.
  const std::size_t rows_per_page = std::size_t(c.page_size) + 1;
  auto relaid = [&](int row, int from, int values) {
    std::vector<std::uint8_t> v(std::size_t(num_pages) * rows_per_page * row * eb);
    fill_nan(v.data(), v.size() / eb);
    for (int page = 0; page < num_pages; ++page)
      for (int r = 0; r < c.page_size; ++r)
        std::memcpy(&v[(std::size_t(page) * rows_per_page + r) * row * eb],
                    P.kv.data() + (std::size_t(page) * c.page_size + r) * row_bytes + from * eb,
                    std::size_t(values) * eb);
    return v;
  };
  const float kv_range = is_fp8(c.kv_type) ? (c.kv_type == DType::fp8_e4m3fn ? 400.f : 200.f) : 1.f;
  std::vector<int> perm(num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (std::size_t r = 0; r < std::size_t(num_pages) * c.page_size; ++r) poison(r);
  // Request b uses pages perm[first_b .. first_b + pages_of[b]).
  P.block_table.assign(std::size_t(a.batch) * max_pages, perm[num_pages - 1]);  // a NaN page
  P.indptr.assign(a.batch + 1, 0);
  P.indices.clear();
  P.kv_len.assign(c.kv_lens.begin(), c.kv_lens.end());
  int next = 0;
  for (int b = 0; b < a.batch; ++b) {
    P.indptr[b + 1] = P.indptr[b] + pages_of[b];
    for (int i = 0; i < pages_of[b]; ++i) {
      const int page = perm[next++];
      P.block_table[std::size_t(b) * max_pages + i] = page;
      P.indices.push_back(page);
      for (int r = 0; r < c.page_size; ++r) {
        const int tok = i * c.page_size + r;
        if (tok >= c.kv_lens[b]) break;  // the page tail stays NaN
        const std::size_t row = std::size_t(page) * c.page_size + r;
        const float ramp =
            (1.0f + c.kv_ramp * float(tok) / float(c.kv_lens[b])) / (1.0f + c.kv_ramp);
        for (int d = 0; d < kHeadDimQK; ++d) put(row, d, uniform(rng) * kv_range * ramp);
      }
    }
  }
  if (P.indices.empty()) P.indices.push_back(0);
  if (c.split_cache) {  // the joined rows' values into two caches with NaN padding
    constexpr int kLatentRow = 528, kRopeRow = 80;
    std::vector<std::uint8_t> latent = relaid(kLatentRow, 0, kHeadDimV);
    P.kv_rope = relaid(kRopeRow, kHeadDimV, kHeadDimQK - kHeadDimV);
    P.kv = std::move(latent);
    a.kv_stride_token = kLatentRow;
    a.kv_stride_page = std::int64_t(rows_per_page) * kLatentRow;
    a.kv_rope_stride_token = kRopeRow;
    a.kv_rope_stride_page = std::int64_t(rows_per_page) * kRopeRow;
  } else if (c.padded_cache) {  // every row and page padded with NaN
    constexpr int kRow = 592;
    P.kv = relaid(kRow, 0, kHeadDimQK);
    a.kv_stride_token = kRow;
    a.kv_stride_page = std::int64_t(rows_per_page) * kRow;
  }

  P.out_elems = std::size_t(a.batch) * a.q_len * a.num_heads * kHeadDimV;
  P.lse_elems = std::size_t(a.batch) * a.q_len * a.num_heads;

  P.host = a;
  P.host.q = P.q.data();
  P.host.kv = P.kv.data();
  if (c.split_cache) P.host.kv_rope = P.kv_rope.data();
  P.host.block_table = P.block_table.data();
  P.host.kv_indptr = P.indptr.data();
  P.host.kv_indices = P.indices.data();
  P.host.kv_len = P.kv_len.data();

  P.d_q.reset(P.q.size() * 2);
  P.d_kv.reset(P.kv.size());
  if (c.split_cache) P.d_kv_rope.reset(P.kv_rope.size());
  P.d_bt.reset(P.block_table.size() * 4);
  P.d_indptr.reset(P.indptr.size() * 4);
  P.d_indices.reset(P.indices.size() * 4);
  P.d_kv_len.reset(P.kv_len.size() * 4);
  P.d_out.reset(P.out_elems * 2);
  P.d_lse.reset(P.lse_elems * 4);
  P.ok = P.d_q.ptr && P.d_kv.ptr && P.d_bt.ptr && P.d_indptr.ptr && P.d_indices.ptr &&
         P.d_kv_len.ptr && P.d_out.ptr && P.d_lse.ptr &&
         gpu_h2d(P.d_q.ptr, P.q.data(), P.q.size() * 2) &&
         gpu_h2d(P.d_kv.ptr, P.kv.data(), P.kv.size()) &&
         (!c.split_cache || (P.d_kv_rope.ptr &&
                             gpu_h2d(P.d_kv_rope.ptr, P.kv_rope.data(), P.kv_rope.size()))) &&
         gpu_h2d(P.d_bt.ptr, P.block_table.data(), P.block_table.size() * 4) &&
         gpu_h2d(P.d_indptr.ptr, P.indptr.data(), P.indptr.size() * 4) &&
         gpu_h2d(P.d_indices.ptr, P.indices.data(), P.indices.size() * 4) &&
         gpu_h2d(P.d_kv_len.ptr, P.kv_len.data(), P.kv_len.size() * 4);
  P.dev = a;
  P.dev.q = P.d_q.ptr;
  P.dev.kv = P.d_kv.ptr;
  if (c.split_cache) P.dev.kv_rope = P.d_kv_rope.ptr;
  P.dev.block_table = P.d_bt.as<std::int32_t>();
  P.dev.kv_indptr = P.d_indptr.as<std::int32_t>();
  P.dev.kv_indices = P.d_indices.as<std::int32_t>();
  P.dev.kv_len = P.d_kv_len.as<std::int32_t>();
  P.dev.out = P.d_out.ptr;
  P.dev.lse = c.lse ? P.d_lse.as<float>() : nullptr;
  P.dev.lse_format = c.lse_format;
}

// Reference computed request by request on all host cores.
inline reference::ReferenceOutput run_reference(const TestProblem& P) {
  const DecodeArgs& a = P.host;
  reference::ReferenceOutput all;
  all.out.assign(P.out_elems, 0.0);
  all.lse.assign(P.lse_elems, 0.0);
  std::vector<std::future<void>> jobs;
  for (int b = 0; b < a.batch; ++b) {
    jobs.push_back(std::async(std::launch::async, [&, b] {
      DecodeArgs one = a;
      one.batch = 1;
      one.q = static_cast<const std::uint16_t*>(a.q) + b * a.q_stride_batch;
      one.kv_len = a.kv_len + b;
      one.block_table = a.block_table + b * block_table_row_stride(a);
      one.kv_indptr = a.kv_indptr + b;
      reference::ReferenceOutput r;
      Status s = reference::decode_reference(one, &r);
      if (!s) std::fprintf(stderr, "reference: %s\n", s.message().c_str());
      std::copy(r.out.begin(), r.out.end(),
                all.out.begin() + std::size_t(b) * a.q_len * a.num_heads * kHeadDimV);
      std::copy(r.lse.begin(), r.lse.end(),
                all.lse.begin() + std::size_t(b) * a.q_len * a.num_heads);
    }));
  }
  for (auto& j : jobs) j.get();
  return all;
}

struct Outcome {
  Status status;
  double rel_l2 = INFINITY, max_abs = INFINITY, lse_err = INFINITY;
  std::vector<std::uint16_t> out;  // raw device output
  std::vector<float> lse;
};

using Launcher = std::function<Status(const DecodeArgs&, void*, std::size_t, Stream)>;

// Poisons the outputs with NaN, runs decode() (or `launch`) and reads the outputs back.
inline Outcome run_device(TestProblem& P, DeviceBuffer& ws, Stream stream = nullptr,
                          const Launcher& launch = nullptr) {
  Outcome o;
  std::vector<std::uint16_t> nan_out(P.out_elems, 0xFFFF);
  std::vector<float> nan_lse(P.lse_elems, NAN);
  if (!gpu_h2d(P.d_out.ptr, nan_out.data(), P.out_elems * 2) ||
      !gpu_h2d(P.d_lse.ptr, nan_lse.data(), P.lse_elems * 4)) {
    o.status = Status(StatusCode::runtime_error, "poison copy failed");
    return o;
  }
  o.status =
      launch ? launch(P.dev, ws.ptr, ws.bytes, stream) : decode(P.dev, ws.ptr, ws.bytes, stream);
  if (!o.status) return o;
  if (!gpu_sync()) {
    o.status = Status(StatusCode::runtime_error, "kernel failed (see stderr)");
    return o;
  }
  o.out.resize(P.out_elems);
  o.lse.resize(P.lse_elems);
  gpu_d2h(o.out.data(), P.d_out.ptr, P.out_elems * 2);
  gpu_d2h(o.lse.data(), P.d_lse.ptr, P.lse_elems * 4);
  return o;
}

// A reference (natural-log, -inf without keys) LSE in the format the call asked for, from the
// definitions of the formats (not from the library's conversion).
inline double lse_as(double natural, LseFormat format) {
  if (format == LseFormat::base2) return natural / std::log(2.0);  // -inf stays -inf
  if (format == LseFormat::natural_empty_is_inf && natural == -INFINITY) return INFINITY;
  return natural;
}

inline void compare(const TestProblem& P, const reference::ReferenceOutput& ref, Outcome& o) {
  std::vector<double> got(P.out_elems);
  for (std::size_t i = 0; i < P.out_elems; ++i)
    got[i] = P.c.q_type == DType::bf16 ? decode_bf16(o.out[i]) : decode_fp16(o.out[i]);
  o.rel_l2 = reference::rel_l2_error(ref.out, got);
  o.max_abs = reference::max_abs_error(ref.out, got);
  if (P.c.lse) {
    std::vector<double> gl(o.lse.begin(), o.lse.end());
    std::vector<double> want(ref.lse);
    for (double& v : want) v = lse_as(v, P.c.lse_format);
    if (P.c.lse_relative) {
      std::vector<double> scaled_ref(want), scaled_got(gl);
      for (std::size_t i = 0; i < gl.size(); ++i) {
        const double d = std::max(1.0, std::fabs(want[i]));
        if (std::isfinite(d)) {
          scaled_ref[i] /= d;
          scaled_got[i] /= d;
        }
      }
      o.lse_err = reference::max_lse_error(scaled_ref, scaled_got);
    } else {
      o.lse_err = reference::max_lse_error(want, gl);
    }
  } else {
    o.lse_err = 0.0;
  }
}

inline std::size_t workspace_for(const DecodeArgs& a) {
  DeviceInfo dev;
  if (!cached_device_info(&dev)) return 0;
  return workspace_bytes(a, dev);
}

}  // namespace mlakit::testing
