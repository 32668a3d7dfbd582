#pragma once
// The platform switch: the only place (with arch/) where HIP and CUDA are told apart.
// MLAKIT_PLATFORM_CUDA / MLAKIT_PLATFORM_HIP / MLAKIT_PLATFORM_NONE is defined to 1.
#if defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__)
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
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define MLAKIT_DEVICE_PASS 1
#endif
