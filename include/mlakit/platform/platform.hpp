#pragma once
// The platform switch: the only place (with arch/) where HIP and CUDA are told apart.
// MLAKIT_PLATFORM_CUDA / MLAKIT_PLATFORM_HIP / MLAKIT_PLATFORM_NONE is defined to 1.
// MLAKIT_EMULATED_AMD (with __gfx942__ or __gfx950__ naming the target): the HIP path compiled
// as host C++ and run on the CPU by the emulated AMD device (platform/emulated/); it defines
// MLAKIT_PLATFORM_HIP and MLAKIT_PLATFORM_EMULATED, and the block scan without rocPRIM.
#if defined(MLAKIT_EMULATED_AMD)
#define MLAKIT_PLATFORM_HIP 1
#define MLAKIT_PLATFORM_EMULATED 1
#if !defined(MLAKIT_NO_ROCPRIM)
#define MLAKIT_NO_ROCPRIM 1
#endif
#include "emulated/hip_runtime.hpp"
#elif defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__)
#define MLAKIT_PLATFORM_HIP 1
#include <hip/hip_runtime.h>
#elif defined(__CUDACC__)
#define MLAKIT_PLATFORM_CUDA 1
#include <cuda.h>  // driver types for the driver entry points (no link to libcuda)
#include <cuda_runtime.h>
#else
#define MLAKIT_PLATFORM_NONE 1
#endif

// Device-code compilation pass (any vendor): kernels and intrinsics are only emitted here.
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__) || defined(MLAKIT_PLATFORM_EMULATED)
#define MLAKIT_DEVICE_PASS 1
#endif
