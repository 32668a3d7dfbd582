#pragma once
// GPU runtime calls behind one small interface: streams, errors, device info, launches.
//
// Errors: every runtime call is checked through its own return value. The library never reads
// or clears the runtime's per-thread "last error" (cudaGetLastError / hipGetLastError), so an
// error that other code left on the calling thread is neither blamed on a mlakit kernel nor
// consumed: kernels are launched by launch_kernel(), which returns the launch's own status.
// (HIP runtimes before 7.0 overwrite the last error with the result of every API call, the
// library's included; from 7.0 on HIP keeps it as CUDA does.)
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "../core/status.hpp"
#include "platform.hpp"

namespace mlakit {

#if defined(MLAKIT_PLATFORM_CUDA)
using Stream = cudaStream_t;
#elif defined(MLAKIT_PLATFORM_HIP)
using Stream = hipStream_t;
#else
using Stream = void*;
#endif

// What the planner and the dispatch need to know about a device.
struct DeviceInfo {
  int device = 0;
  int sm_count = 0;        // SMs (NVIDIA) or CUs (AMD)
  int max_smem_optin = 0;  // bytes of shared memory / LDS one block may use
  int arch = 0;            // NVIDIA: 10*major+minor (90 = Hopper); AMD: gfx number (942)
};

inline constexpr bool kHaveGpuBackend =
#if defined(MLAKIT_PLATFORM_NONE)
    false;
#else
    true;
#endif

namespace detail {

#if defined(MLAKIT_PLATFORM_CUDA)
using RtError = cudaError_t;
inline constexpr RtError kRtSuccess = cudaSuccess;
inline const char* rt_error_string(RtError e) { return cudaGetErrorString(e); }
#elif defined(MLAKIT_PLATFORM_HIP)
using RtError = hipError_t;
inline constexpr RtError kRtSuccess = hipSuccess;
inline const char* rt_error_string(RtError e) { return hipGetErrorString(e); }
#endif

// The gfx number of an AMD architecture name, as the removed hipDeviceProp_t::gcnArch gave it:
// the last two characters of the processor are minor version and stepping (hex digits), the
// rest the major version. "gfx942:sramecc+:xnack-" -> 942, "gfx90a" -> 910, "gfx1100" -> 1100;
// 0 for anything else.
inline int gfx_arch_number(const char* name) {
  if (name == nullptr || name[0] != 'g' || name[1] != 'f' || name[2] != 'x') return 0;
  int digits[8], n = 0;
  for (const char* c = name + 3; *c != '\0' && *c != ':'; ++c) {
    int d = -1;
    if (*c >= '0' && *c <= '9') d = *c - '0';
    if (*c >= 'a' && *c <= 'f') d = *c - 'a' + 10;
    if (d < 0 || n == 8) return 0;
    digits[n++] = d;
  }
  if (n < 3) return 0;
  int major = 0;
  for (int i = 0; i < n - 2; ++i) {
    if (digits[i] > 9) return 0;
    major = major * 10 + digits[i];
  }
  return major * 100 + digits[n - 2] * 10 + digits[n - 1];
}

#if !defined(MLAKIT_PLATFORM_NONE)
inline Status rt_check(RtError e, const char* what) {
  if (e == kRtSuccess) return Status::ok();
  return Status(StatusCode::runtime_error, std::string(what) + " failed: " + rt_error_string(e));
}

template <class T>
struct NoDeduce {
  using type = T;
};

// Enqueues kernel<<<grid, block, smem_bytes, stream>>>(args...) and returns the status of that
// launch alone (a launch configuration the device rejects, a stream of another device, a
// context already broken by an earlier fault). `args` are converted to the kernel's parameter
// types here, as a <<<>>> launch would. `name` names the kernel in the message.
template <class... Params>
inline Status launch_kernel(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block,
                            std::size_t smem_bytes, Stream stream,
                            typename NoDeduce<Params>::type... args) {
#if defined(MLAKIT_PLATFORM_EMULATED)
  // The emulator runs the kernel with typed arguments (it has no argument-array entry point).
  const RtError e = emu::launch(name, kernel, grid, block, smem_bytes, stream, args...);
#elif defined(MLAKIT_PLATFORM_CUDA)
  void* argv[sizeof...(Params) + 1] = {static_cast<void*>(&args)..., nullptr};
#if CUDART_VERSION >= 11080
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  config.attrs = nullptr;
  config.numAttrs = 0;
  const RtError e = cudaLaunchKernelExC(&config, reinterpret_cast<const void*>(kernel), argv);
#else
  const RtError e = cudaLaunchKernel(reinterpret_cast<const void*>(kernel), grid, block, argv,
                                     smem_bytes, stream);
#endif
#else
  void* argv[sizeof...(Params) + 1] = {static_cast<void*>(&args)..., nullptr};
  const RtError e =
      hipLaunchKernel(reinterpret_cast<const void*>(kernel), grid, block, argv, smem_bytes, stream);
#endif
  if (e == kRtSuccess) return Status::ok();
  return Status(StatusCode::runtime_error,
                std::string("launch of ") + name + " failed: " + rt_error_string(e));
}

// Runs `f` (which returns a Status) with the calling thread in the relaxed stream-capture
// mode, then restores the thread's mode. The library's runtime calls other than launches
// (device, stream and pointer queries, kernel attributes) are no stream work, but the
// runtimes do not document all of them as allowed while a capture is in progress; in the
// relaxed mode they cannot invalidate a capture of this thread or (global mode) of another.
template <class F>
inline Status with_relaxed_capture(const F& f) {
#if defined(MLAKIT_PLATFORM_CUDA)
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  Status s =
      rt_check(cudaThreadExchangeStreamCaptureMode(&mode), "cudaThreadExchangeStreamCaptureMode");
#else
  hipStreamCaptureMode mode = hipStreamCaptureModeRelaxed;
  Status s =
      rt_check(hipThreadExchangeStreamCaptureMode(&mode), "hipThreadExchangeStreamCaptureMode");
#endif
  if (!s) return s;
  s = f();
#if defined(MLAKIT_PLATFORM_CUDA)
  const Status restored = rt_check(cudaThreadExchangeStreamCaptureMode(&mode),
                                   "cudaThreadExchangeStreamCaptureMode (restore)");
#else
  const Status restored = rt_check(hipThreadExchangeStreamCaptureMode(&mode),
                                   "hipThreadExchangeStreamCaptureMode (restore)");
#endif
  return s ? restored : s;
}

#if defined(MLAKIT_PLATFORM_CUDA)
// The driver's cuFuncSetAttribute, found once through the runtime (no link to libcuda).
using DriverFuncSetAttribute = CUresult (*)(CUfunction, CUfunction_attribute, int);
inline DriverFuncSetAttribute driver_func_set_attribute() {
  static const DriverFuncSetAttribute fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    const cudaError_t e =
        cudaGetDriverEntryPointByVersion("cuFuncSetAttribute", &p, 12000, cudaEnableDefault, &found);
#else
    const cudaError_t e = cudaGetDriverEntryPoint("cuFuncSetAttribute", &p, cudaEnableDefault, &found);
#endif
    return e == cudaSuccess && found == cudaDriverEntryPointSuccess
               ? reinterpret_cast<DriverFuncSetAttribute>(p)
               : nullptr;
  }();
  return fn;
}
#endif

// Allows `kernel` to use `bytes` of dynamic shared memory (above the 48 KB default on NVIDIA)
// on the current device.
// CUDA: the attribute is set on the kernel's driver function (cudaGetFuncBySymbol +
// cuFuncSetAttribute), which leaves the calling thread's last error alone: the library never
// consumes an error other code left there, and cudaFuncSetAttribute resets it (CUDA 13;
// docs/performance.md, "Constants"). cudaFuncSetAttribute is the fallback where the driver
// entry point is missing.
// max_carveout: also prefer the largest shared-memory carveout (for a kernel whose residency
// of several CTAs per SM needs most of it: the keys-as-M kernel, two CTAs of 95 KB).
template <class Kernel>
inline Status set_dynamic_smem(Kernel kernel, int bytes, bool max_carveout = false) {
  return with_relaxed_capture([&] {
#if defined(MLAKIT_PLATFORM_CUDA)
    if (const DriverFuncSetAttribute set = driver_func_set_attribute()) {
      cudaFunction_t f = nullptr;
      const Status s = rt_check(cudaGetFuncBySymbol(&f, reinterpret_cast<const void*>(kernel)),
                                "cudaGetFuncBySymbol");
      if (!s) return s;
      CUresult r = set(reinterpret_cast<CUfunction>(f),
                       CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes);
      if (r != CUDA_SUCCESS)
        return Status(StatusCode::runtime_error,
                      "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES, " +
                          std::to_string(bytes) +
                          ") failed: CUresult " + std::to_string(static_cast<int>(r)));
      if (max_carveout &&
          (r = set(reinterpret_cast<CUfunction>(f),
                   CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 100)) != CUDA_SUCCESS)
        return Status(StatusCode::runtime_error,
                      "cuFuncSetAttribute(PREFERRED_SHARED_MEMORY_CARVEOUT, 100) failed: CUresult " +
                          std::to_string(static_cast<int>(r)));
      return Status::ok();
    }
    Status s = rt_check(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
        "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
    if (s && max_carveout)
      s = rt_check(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100),
                   "cudaFuncSetAttribute(PreferredSharedMemoryCarveout)");
    return s;
#else
    (void)max_carveout;
    return rt_check(hipFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                        hipFuncAttributeMaxDynamicSharedMemorySize, bytes),
                    "hipFuncSetAttribute(MaxDynamicSharedMemorySize)");
#endif
  });
}

#if defined(MLAKIT_PLATFORM_CUDA)
// The code the runtime loads for `kernel` on the current device: its target (10 x major +
// minor of the architecture it was compiled for: 90 for sm_90 and sm_90a code) and the static
// shared memory it declares (the only trace of code compiled for sm_90a alone, where a kernel
// declares storage that its other targets' code does not).
struct KernelImage {
  int binary_version = 0;
  int static_smem_bytes = 0;
};
template <class Kernel>
inline Status kernel_image(Kernel kernel, KernelImage* image) {
  cudaFuncAttributes attr{};
  const Status s = rt_check(cudaFuncGetAttributes(&attr, kernel), "cudaFuncGetAttributes");
  if (!s) return s;
  image->binary_version = attr.binaryVersion;
  image->static_smem_bytes = static_cast<int>(attr.sharedSizeBytes);
  return Status::ok();
}
#endif

inline std::string pointer_string(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

// Ok when `dev` is the ordinal of a device present.
inline Status check_device_ordinal(int dev) {
  int count = 0;
#if defined(MLAKIT_PLATFORM_CUDA)
  const Status s = rt_check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
#else
  const Status s = rt_check(hipGetDeviceCount(&count), "hipGetDeviceCount");
#endif
  if (!s) return s;
  if (dev < 0 || dev >= count)
    return Status(StatusCode::invalid_argument, "device = " + std::to_string(dev) +
                                                    ": not a device of this machine (allowed 0.." +
                                                    std::to_string(count - 1) + ")");
  return Status::ok();
}

// True when the runtime reports a stream's device (CUDA 12.8+, HIP 6.0+), so that
// check_stream_device() can compare it with the current device. Without it a stream of
// another device makes the first launch fail with the runtime's own error instead.
inline constexpr bool kStreamDeviceChecked =
#if defined(MLAKIT_PLATFORM_CUDA)
    CUDART_VERSION >= 12080;
#else
    HIP_VERSION >= 60000000;
#endif

// Ok when `stream` can carry a launch on device `dev` (the current device): the default
// streams always can; another stream must have been created on `dev`.
inline Status check_stream_device(Stream stream, int dev) {
  int owner = dev;
  Status s;
#if defined(MLAKIT_PLATFORM_CUDA)
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread)
    return Status::ok();
#if CUDART_VERSION >= 12080
  // A capturing stream refuses cudaStreamGetDevice (even in relaxed capture mode): there the
  // check is skipped, and a stream of another device fails at its launch instead.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  s = rt_check(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing(stream)");
  if (s && capture == cudaStreamCaptureStatusNone)
    s = rt_check(cudaStreamGetDevice(stream, &owner), "cudaStreamGetDevice(stream)");
#endif
#else
  if (stream == nullptr || stream == hipStreamPerThread) return Status::ok();
#if HIP_VERSION >= 60000000
  hipStreamCaptureStatus capture = hipStreamCaptureStatusNone;
  s = rt_check(hipStreamIsCapturing(stream, &capture), "hipStreamIsCapturing(stream)");
  if (s && capture == hipStreamCaptureStatusNone)
    s = rt_check(hipStreamGetDevice(stream, &owner), "hipStreamGetDevice(stream)");
#endif
#endif
  if (!s) return s;
  if (owner != dev)
    return Status(StatusCode::invalid_argument,
                  "stream = " + pointer_string(stream) + ": a stream of device " +
                      std::to_string(owner) + ", not of the current device " + std::to_string(dev) +
                      " (allowed: a stream of the current device; make device " +
                      std::to_string(owner) + " current first)");
  return Status::ok();
}

// Ok unless `workspace` is device memory of a device other than `dev`. Memory the runtime
// cannot attribute to a device (managed, or from an allocator it does not know) passes.
inline Status check_workspace_device(const void* workspace, int dev) {
  if (workspace == nullptr) return Status::ok();  // the size check reports it
  int owner = dev;
#if defined(MLAKIT_PLATFORM_CUDA)
  cudaPointerAttributes attr = {};
  const Status s =
      rt_check(cudaPointerGetAttributes(&attr, workspace), "cudaPointerGetAttributes(workspace)");
  if (!s) return s;
  if (attr.type == cudaMemoryTypeDevice) owner = attr.device;
#else
  // Memory HIP cannot attribute (hipPointerGetAttributes fails) is let through.
  hipPointerAttribute_t attr = {};
  if (hipPointerGetAttributes(&attr, workspace) == hipSuccess && !attr.isManaged)
    owner = attr.device;
#endif
  if (owner != dev)
    return Status(StatusCode::invalid_argument,
                  "workspace = " + pointer_string(workspace) + ": memory of device " +
                      std::to_string(owner) + ", not of the current device " + std::to_string(dev) +
                      " (allowed: device memory of the device decode() runs on, sized by "
                      "workspace_bytes() with that device's DeviceInfo)");
  return Status::ok();
}
#endif

// The calling thread's current device: the one decode() launches on.
#if defined(MLAKIT_PLATFORM_NONE)
inline Status current_device(int* dev) {
  *dev = 0;
  return Status(StatusCode::not_supported,
                "no GPU backend: mlakit was compiled without CUDA or HIP");
}
#else
inline Status current_device(int* dev) {
#if defined(MLAKIT_PLATFORM_CUDA)
  return rt_check(cudaGetDevice(dev), "cudaGetDevice");
#else
  return rt_check(hipGetDevice(dev), "hipGetDevice");
#endif
}

// Checks that a launch with device info `dev`, `workspace` and `stream` is bound to one
// device: `dev` describes the current device (kernel attributes and launches apply to the
// current device), the stream belongs to it and the workspace is not another device's memory.
inline Status check_launch_device(const DeviceInfo& dev, const void* workspace, Stream stream) {
  int current = 0;
  Status s = current_device(&current);
  if (!s) return s;
  if (dev.device != current)
    return Status(StatusCode::invalid_argument,
                  "DeviceInfo.device = " + std::to_string(dev.device) +
                      ": not the current device (allowed: the current device, " +
                      std::to_string(current) + "; pass the DeviceInfo of device " +
                      std::to_string(current) + " or make device " + std::to_string(dev.device) +
                      " current)");
  return with_relaxed_capture([&] {
    const Status st = check_stream_device(stream, current);
    return st ? check_workspace_device(workspace, current) : st;
  });
}
#endif

}  // namespace detail

// Reads the properties of device `dev` (an ordinal, as cudaSetDevice / hipSetDevice take).
// Costs a few attribute queries, no synchronisation.
inline Status query_device(int dev, DeviceInfo* info) {
  if (info == nullptr) return Status(StatusCode::invalid_argument, "info is null");
#if defined(MLAKIT_PLATFORM_CUDA)
  int sms = 0, smem = 0, major = 0, minor = 0;
  Status s = detail::check_device_ordinal(dev);
  if (!s) return s;
  if (!(s = detail::rt_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev),
                             "cudaDeviceGetAttribute(MultiProcessorCount)")))
    return s;
  if (!(s = detail::rt_check(
            cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
            "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)")))
    return s;
  if (!(s = detail::rt_check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev),
                             "cudaDeviceGetAttribute(ComputeCapabilityMajor)")))
    return s;
  if (!(s = detail::rt_check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev),
                             "cudaDeviceGetAttribute(ComputeCapabilityMinor)")))
    return s;
  *info = DeviceInfo{dev, sms, smem, major * 10 + minor};
  return Status::ok();
#elif defined(MLAKIT_PLATFORM_HIP)
  Status s = detail::check_device_ordinal(dev);
  if (!s) return s;
  hipDeviceProp_t p;
  if (!(s = detail::rt_check(hipGetDeviceProperties(&p, dev), "hipGetDeviceProperties"))) return s;
  // gcnArchName ("gfx942:sramecc+:xnack-"): hipDeviceProp_t::gcnArch was removed in HIP 6.0.
  *info = DeviceInfo{dev, p.multiProcessorCount, static_cast<int>(p.sharedMemPerBlock),
                     detail::gfx_arch_number(p.gcnArchName)};
  return Status::ok();
#else
  (void)dev;
  return Status(StatusCode::not_supported,
                "no GPU backend: mlakit was compiled without CUDA or HIP");
#endif
}

// Reads the properties of the current device (the calling thread's cudaSetDevice /
// hipSetDevice), the device decode() runs on.
inline Status query_device(DeviceInfo* info) {
  if (info == nullptr) return Status(StatusCode::invalid_argument, "info is null");
  int dev = 0;
  const Status s = detail::current_device(&dev);
  if (!s) return s;
  return query_device(dev, info);
}

// Device info of device `dev`, queried once per device and then cached (thread safe), so
// that the decode() launch path costs no attribute queries after the first call.
inline Status cached_device_info(int dev, DeviceInfo* info) {
#if defined(MLAKIT_PLATFORM_NONE)
  return query_device(dev, info);
#else
  if (info == nullptr) return Status(StatusCode::invalid_argument, "info is null");
  constexpr int kMaxDevices = 64;
  static DeviceInfo cache[kMaxDevices];
  static std::atomic<bool> valid[kMaxDevices] = {};
  if (dev >= 0 && dev < kMaxDevices && valid[dev].load(std::memory_order_acquire)) {
    *info = cache[dev];
    return Status::ok();
  }
  Status s = detail::with_relaxed_capture([&] { return query_device(dev, info); });
  if (s && dev >= 0 && dev < kMaxDevices) {
    // Threads racing here query the same values; the first one publishes them.
    static std::atomic<bool> writing[kMaxDevices] = {};
    if (!writing[dev].exchange(true, std::memory_order_acq_rel)) {
      cache[dev] = *info;
      valid[dev].store(true, std::memory_order_release);
    }
  }
  return s;
#endif
}

// Cached device info of the current device.
inline Status cached_device_info(DeviceInfo* info) {
  if (info == nullptr) return Status(StatusCode::invalid_argument, "info is null");
  int dev = 0;
  const Status s = detail::current_device(&dev);
  if (!s) return s;
  return cached_device_info(dev, info);
}

}  // namespace mlakit
