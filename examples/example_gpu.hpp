#pragma once
// Runtime plumbing shared by the examples (not part of the library): one spelling for CUDA
// and HIP calls, a check that stops the example on a failed call, and device buffers freed
// on scope exit.
#include <cstdio>
#include <cstdlib>
#include <mlakit/platform/platform.hpp>
#include <vector>

namespace example {

// True when a GPU of the compiled backend is present at run time.
inline bool gpu_present() {
#if !defined(MLAKIT_HAS_GPU_BACKEND)
  return false;
#elif defined(MLAKIT_HAS_CUDA_RUNTIME_API)
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
#else
  int n = 0;
  return hipGetDeviceCount(&n) == hipSuccess && n > 0;
#endif
}

}  // namespace example

#if defined(MLAKIT_HAS_GPU_BACKEND)
// One spelling for both runtimes: GPU(Malloc) is cudaMalloc or hipMalloc.
#if defined(MLAKIT_HAS_CUDA_RUNTIME_API)
#define GPU(name) cuda##name
#else
#define GPU(name) hip##name
#endif
// The example (never the library) stops on a failed runtime call.
#define GPU_CHECK(call)                                                  \
  do {                                                                   \
    const auto err_ = (call);                                            \
    if (err_ != GPU(Success)) {                                          \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, \
                   GPU(GetErrorString)(err_));                           \
      std::exit(1);                                                      \
    }                                                                    \
  } while (0)

namespace example {

// Device buffers, freed on scope exit.
struct DeviceMemory {
  std::vector<void*> owned;
  DeviceMemory() = default;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  void* alloc(std::size_t bytes) {
    void* d = nullptr;
    GPU_CHECK(GPU(Malloc)(&d, bytes));
    owned.push_back(d);
    return d;
  }
  template <class T>
  T* upload(const std::vector<T>& v) {
    void* d = alloc(v.size() * sizeof(T));
    GPU_CHECK(GPU(Memcpy)(d, v.data(), v.size() * sizeof(T), GPU(MemcpyHostToDevice)));
    return static_cast<T*>(d);
  }
  ~DeviceMemory() {
    for (void* d : owned) (void)GPU(Free)(d);
  }
};

}  // namespace example
#endif  // MLAKIT_HAS_GPU_BACKEND
