#pragma once
// GPU runtime calls behind one small interface: streams, errors, device info, launches.
#include <atomic>
#include <cstddef>
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
inline RtError rt_get_last_error() { return cudaGetLastError(); }
#elif defined(MLAKIT_PLATFORM_HIP)
using RtError = hipError_t;
inline constexpr RtError kRtSuccess = hipSuccess;
inline const char* rt_error_string(RtError e) { return hipGetErrorString(e); }
inline RtError rt_get_last_error() { return hipGetLastError(); }
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

// Checks the launch error of the kernel just enqueued.
inline Status check_launch(const char* kernel_name) {
  return rt_check(rt_get_last_error(), kernel_name);
}

// Allows `kernel` to use `bytes` of dynamic shared memory (above the 48 KB default on NVIDIA).
template <class Kernel>
inline Status set_dynamic_smem(Kernel kernel, int bytes) {
#if defined(MLAKIT_PLATFORM_CUDA)
  return rt_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
                  "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
#else
  return rt_check(hipFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                      hipFuncAttributeMaxDynamicSharedMemorySize, bytes),
                  "hipFuncSetAttribute(MaxDynamicSharedMemorySize)");
#endif
}
#endif

}  // namespace detail

// Reads the current device's properties. Costs a few attribute queries, no synchronisation.
inline Status query_device(DeviceInfo* info) {
  if (info == nullptr) return Status(StatusCode::invalid_argument, "info is null");
#if defined(MLAKIT_PLATFORM_CUDA)
  int dev = 0, sms = 0, smem = 0, major = 0, minor = 0;
  Status s = detail::rt_check(cudaGetDevice(&dev), "cudaGetDevice");
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
  int dev = 0;
  Status s = detail::rt_check(hipGetDevice(&dev), "hipGetDevice");
  if (!s) return s;
  hipDeviceProp_t p;
  if (!(s = detail::rt_check(hipGetDeviceProperties(&p, dev), "hipGetDeviceProperties"))) return s;
  // gcnArchName ("gfx942:sramecc+:xnack-"): hipDeviceProp_t::gcnArch was removed in HIP 6.0.
  *info = DeviceInfo{dev, p.multiProcessorCount, static_cast<int>(p.sharedMemPerBlock),
                     detail::gfx_arch_number(p.gcnArchName)};
  return Status::ok();
#else
  return Status(StatusCode::not_supported,
                "no GPU backend: mlakit was compiled without CUDA or HIP");
#endif
}

// Device info of the current device, queried once per device and then cached, so that the
// decode() launch path costs no runtime queries after the first call.
inline Status cached_device_info(DeviceInfo* info) {
#if defined(MLAKIT_PLATFORM_NONE)
  return query_device(info);
#else
  constexpr int kMaxDevices = 64;
  static DeviceInfo cache[kMaxDevices];
  static std::atomic<bool> valid[kMaxDevices] = {};
  int dev = 0;
#if defined(MLAKIT_PLATFORM_CUDA)
  Status s = detail::rt_check(cudaGetDevice(&dev), "cudaGetDevice");
#else
  Status s = detail::rt_check(hipGetDevice(&dev), "hipGetDevice");
#endif
  if (!s) return s;
  if (dev >= 0 && dev < kMaxDevices && valid[dev].load(std::memory_order_acquire)) {
    *info = cache[dev];
    return Status::ok();
  }
  s = query_device(info);
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

}  // namespace mlakit
