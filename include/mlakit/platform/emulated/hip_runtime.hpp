#pragma once
// The emulated AMD platform's HIP: the subset of the HIP runtime and device language that
// mlakit and its tests use, compiled as host C++ (clang, for its vector extensions) and run by
// the emulator (emulator.hpp). platform/platform.hpp includes it in place of
// <hip/hip_runtime.h> when MLAKIT_EMULATED_AMD is defined; the library's HIP code then compiles
// unchanged, with the arch/ choices of the target named by __gfx942__ or __gfx950__.
//
// Device language: __global__ / __device__ functions are plain functions; `__shared__`
// variables are thread_local (a block's threads run on one host thread, and a host thread runs
// one block at a time); threadIdx, blockIdx, blockDim, gridDim read the running fiber's ids.
// Launches run to completion before they return (every stream is in order and synchronous;
// graphs are not emulated: a capture reports that no capture is active).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "amd_builtins.hpp"
#include "emulator.hpp"

#if !defined(__clang__)
#error "the emulated AMD platform needs clang (ext_vector_type, _Float16)"
#endif

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __shared__ thread_local
#define __align__(n) alignas(n)

#define HIP_VERSION 70100000  // the runtime semantics modelled: a failed call's error persists
#define HIP_VERSION_MAJOR 7
#define HIP_VERSION_MINOR 1

// ---- vector types ----------------------------------------------------------------------------
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(8) uint2 {
  unsigned x, y;
};
struct alignas(16) int4 {
  int x, y, z, w;
};
struct alignas(8) int2 {
  int x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(8) float2 {
  float x, y;
};
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline int2 make_int2(int x, int y) { return {x, y}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

// ---- built-in variables ------------------------------------------------------------------------
#define threadIdx (::mlakit::emu::tls_ids->thread_idx)
#define blockIdx (::mlakit::emu::tls_ids->block_idx)
#define blockDim (::mlakit::emu::tls_ids->block_dim)
#define gridDim (::mlakit::emu::tls_ids->grid_dim)

// ---- device functions
// -----------------------------------------------------------------------------
inline void __syncthreads() { ::mlakit::emu::block_barrier(); }

// HIP's integer min / max device functions.
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a < b ? b : a; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a < b ? b : a; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a < b ? b : a; }

inline int __float_as_int(float f) { return __builtin_bit_cast(int, f); }
inline float __int_as_float(int i) { return __builtin_bit_cast(float, i); }

// Atomics on global memory (several host threads run blocks) and LDS.
template <class T>
inline T atomicAdd(T* p, T v) {
  ::mlakit::emu::count_access(p, sizeof(T), false);
  ::mlakit::emu::count_access(p, sizeof(T), true);
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
template <class T>
inline T atomicMax(T* p, T v) {
  ::mlakit::emu::count_access(p, sizeof(T), false);
  ::mlakit::emu::count_access(p, sizeof(T), true);
  T old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (old < v &&
         !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}

// ---- runtime
// ----------------------------------------------------------------------------------------
enum hipError_t {
  hipSuccess = 0,
  hipErrorInvalidValue = 1,
  hipErrorOutOfMemory = 2,
  hipErrorInvalidDevice = 101,
  hipErrorInvalidConfiguration = 9,
  hipErrorLaunchFailure = 719,
  hipErrorNotSupported = 801,
};
enum hipMemcpyKind {
  hipMemcpyHostToHost = 0,
  hipMemcpyHostToDevice = 1,
  hipMemcpyDeviceToHost = 2,
  hipMemcpyDeviceToDevice = 3,
  hipMemcpyDefault = 4,
};
enum hipFuncAttribute { hipFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum hipStreamCaptureMode {
  hipStreamCaptureModeGlobal = 0,
  hipStreamCaptureModeThreadLocal = 1,
  hipStreamCaptureModeRelaxed = 2,
};
enum hipStreamCaptureStatus { hipStreamCaptureStatusNone = 0, hipStreamCaptureStatusActive = 1 };
enum hipMemoryType { hipMemoryTypeHost = 0, hipMemoryTypeDevice = 1 };

struct ihipStream_t {
  int device = 0;
};
using hipStream_t = ihipStream_t*;
#define hipStreamPerThread (reinterpret_cast<hipStream_t>(2))

struct hipDeviceProp_t {
  char name[256];
  char gcnArchName[256];
  int multiProcessorCount;
  std::size_t sharedMemPerBlock;
  int warpSize;
  int major, minor;
};
struct hipPointerAttribute_t {
  hipMemoryType type;
  int device;
  void* devicePointer;
  void* hostPointer;
  int isManaged;
  unsigned allocationFlags;
};

namespace mlakit::emu {
inline thread_local hipError_t tls_last_error = hipSuccess;
inline thread_local int tls_device = 0;
inline hipError_t rt_result(hipError_t e) {
  if (e != hipSuccess) tls_last_error = e;
  return e;
}
// A launch's fault is reported by the next synchronising call.
inline hipError_t rt_sync() {
  return rt_result(take_pending_fault().empty() ? hipSuccess : hipErrorLaunchFailure);
}

template <class F>
struct BodyOf {
  static void call(void* self) { (*static_cast<F*>(self))(); }
};

// Runs kernel<<<grid, block, lds>>>(args...) on the emulator. `args` convert to the kernel's
// parameter types once; every thread receives its own copy, as kernel arguments are.
template <class... Params, class... Args>
inline hipError_t launch(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block,
                         std::size_t lds, hipStream_t, Args&&... args) {
  std::tuple<std::decay_t<Params>...> params(static_cast<Params>(std::forward<Args>(args))...);
  auto run = [&] { std::apply(kernel, params); };
  const KernelBody body{&BodyOf<decltype(run)>::call, &run};
  const int r =
      run_grid(name, body, Dim3{grid.x, grid.y, grid.z}, Dim3{block.x, block.y, block.z}, lds);
  return r == 1 ? rt_result(hipErrorInvalidConfiguration) : hipSuccess;
}
}  // namespace mlakit::emu

#define hipLaunchKernelGGL(kernel, grid, block, lds, stream, ...) \
  ::mlakit::emu::launch(#kernel, kernel, dim3(grid), dim3(block), lds, stream, ##__VA_ARGS__)

inline const char* hipGetErrorName(hipError_t e) {
  switch (e) {
    case hipSuccess:
      return "hipSuccess";
    case hipErrorInvalidValue:
      return "hipErrorInvalidValue";
    case hipErrorOutOfMemory:
      return "hipErrorOutOfMemory";
    case hipErrorInvalidDevice:
      return "hipErrorInvalidDevice";
    case hipErrorInvalidConfiguration:
      return "hipErrorInvalidConfiguration";
    case hipErrorLaunchFailure:
      return "hipErrorLaunchFailure";
    case hipErrorNotSupported:
      return "hipErrorNotSupported";
  }
  return "hipErrorUnknown";
}
inline const char* hipGetErrorString(hipError_t e) {
  switch (e) {
    case hipSuccess:
      return "no error";
    case hipErrorInvalidValue:
      return "invalid argument";
    case hipErrorOutOfMemory:
      return "out of memory";
    case hipErrorInvalidDevice:
      return "invalid device ordinal";
    case hipErrorInvalidConfiguration:
      return "invalid configuration argument";
    case hipErrorLaunchFailure:
      return "unspecified launch failure (emulator fault, see stderr)";
    case hipErrorNotSupported:
      return "operation not supported";
  }
  return "unknown error";
}
inline hipError_t hipGetLastError() {
  const hipError_t e = mlakit::emu::tls_last_error;
  mlakit::emu::tls_last_error = hipSuccess;
  return e;
}
inline hipError_t hipPeekAtLastError() { return mlakit::emu::tls_last_error; }

inline hipError_t hipGetDeviceCount(int* n) {
  if (n == nullptr) return mlakit::emu::rt_result(hipErrorInvalidValue);
  *n = 1;
  return hipSuccess;
}
inline hipError_t hipSetDevice(int d) {
  if (d != 0) return mlakit::emu::rt_result(hipErrorInvalidDevice);
  mlakit::emu::tls_device = d;
  return hipSuccess;
}
inline hipError_t hipGetDevice(int* d) {
  if (d == nullptr) return mlakit::emu::rt_result(hipErrorInvalidValue);
  *d = mlakit::emu::tls_device;
  return hipSuccess;
}
inline hipError_t hipGetDeviceProperties(hipDeviceProp_t* p, int d) {
  if (p == nullptr) return mlakit::emu::rt_result(hipErrorInvalidValue);
  if (d != 0) return mlakit::emu::rt_result(hipErrorInvalidDevice);
  const mlakit::emu::TargetInfo& t = mlakit::emu::target();
  std::memset(p, 0, sizeof *p);
  std::snprintf(p->name, sizeof p->name, "mlakit emulated AMD gfx%d", t.gfx);
  std::snprintf(p->gcnArchName, sizeof p->gcnArchName, "%s", t.arch_name);
  p->multiProcessorCount = t.compute_units;
  p->sharedMemPerBlock = static_cast<std::size_t>(t.lds_bytes);
  p->warpSize = 64;
  p->major = 9;
  p->minor = 4;
  return hipSuccess;
}
inline hipError_t hipMalloc(void** p, std::size_t n) {
  if (p == nullptr) return mlakit::emu::rt_result(hipErrorInvalidValue);
  *p = mlakit::emu::device_alloc(n);
  return (*p == nullptr && n != 0) ? mlakit::emu::rt_result(hipErrorOutOfMemory) : hipSuccess;
}
inline hipError_t hipFree(void* p) {
  return mlakit::emu::device_free(p) ? hipSuccess : mlakit::emu::rt_result(hipErrorInvalidValue);
}
inline hipError_t hipMemcpy(void* d, const void* s, std::size_t n, hipMemcpyKind) {
  const hipError_t e = mlakit::emu::rt_sync();
  if (e != hipSuccess) return e;
  if (n != 0) std::memmove(d, s, n);
  return hipSuccess;
}
inline hipError_t hipMemcpyAsync(void* d, const void* s, std::size_t n, hipMemcpyKind k,
                                 hipStream_t = nullptr) {
  return hipMemcpy(d, s, n, k);
}
inline hipError_t hipMemset(void* d, int v, std::size_t n) {
  if (n != 0) std::memset(d, v, n);
  return hipSuccess;
}
inline hipError_t hipMemsetAsync(void* d, int v, std::size_t n, hipStream_t = nullptr) {
  return hipMemset(d, v, n);
}
inline hipError_t hipDeviceSynchronize() { return mlakit::emu::rt_sync(); }
inline hipError_t hipStreamSynchronize(hipStream_t) { return mlakit::emu::rt_sync(); }
inline hipError_t hipStreamCreate(hipStream_t* s) {
  if (s == nullptr) return mlakit::emu::rt_result(hipErrorInvalidValue);
  *s = new ihipStream_t{mlakit::emu::tls_device};
  return hipSuccess;
}
inline hipError_t hipStreamDestroy(hipStream_t s) {
  if (s != nullptr && s != hipStreamPerThread) delete s;
  return hipSuccess;
}
inline hipError_t hipStreamGetDevice(hipStream_t s, int* d) {
  if (d == nullptr) return mlakit::emu::rt_result(hipErrorInvalidValue);
  *d = (s == nullptr || s == hipStreamPerThread) ? mlakit::emu::tls_device : s->device;
  return hipSuccess;
}
inline hipError_t hipStreamIsCapturing(hipStream_t, hipStreamCaptureStatus* st) {
  if (st == nullptr) return mlakit::emu::rt_result(hipErrorInvalidValue);
  *st = hipStreamCaptureStatusNone;
  return hipSuccess;
}
inline hipError_t hipThreadExchangeStreamCaptureMode(hipStreamCaptureMode* m) {
  return m == nullptr ? mlakit::emu::rt_result(hipErrorInvalidValue) : hipSuccess;
}
inline hipError_t hipPointerGetAttributes(hipPointerAttribute_t* a, const void* p) {
  if (a == nullptr || !mlakit::emu::is_device_pointer(p))
    return mlakit::emu::rt_result(hipErrorInvalidValue);
  std::memset(a, 0, sizeof *a);
  a->type = hipMemoryTypeDevice;
  a->device = 0;
  a->devicePointer = const_cast<void*>(p);
  return hipSuccess;
}
inline hipError_t hipFuncSetAttribute(const void*, hipFuncAttribute, int value) {
  return (value < 0 || value > mlakit::emu::target().lds_bytes)
             ? mlakit::emu::rt_result(hipErrorInvalidValue)
             : hipSuccess;
}
