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

// Capabilities, for the layers above arch/ to test instead of the vendor (they never name
// MLAKIT_PLATFORM_*):
//   MLAKIT_HAS_GPU_BACKEND   CUDA, HIP or the emulated AMD device: kernels, launches and
//                            runtime calls exist (not defined in a host-only build, which keeps
//                            the host API: validation, workspace sizes, plans, the reference).
//   MLAKIT_HAS_SM90A_KERNELS the Hopper wgmma kernels (kernel/decode_split_o_sm90.hpp,
//                            kernel/decode_kt_sm90.hpp) are compiled: NVIDIA. Whether a device
//                            runs their sm_90a code is a run-time probe (platform/runtime.hpp).
//   MLAKIT_HAS_CDNA_KERNELS  the CDNA mainloop (kernel/decode_cdna.hpp) is compiled: AMD.
//   MLAKIT_HAS_CUDA_RUNTIME_API  the GPU runtime answers cuda* calls (CUDA graphs, events):
//                            for tests and examples that exercise one runtime's own API.
//   MLAKIT_HAS_HIP_RUNTIME_API   the GPU runtime answers hip* calls (the emulated AMD device
//                            provides them too).
#if !defined(MLAKIT_PLATFORM_NONE)
#define MLAKIT_HAS_GPU_BACKEND 1
#endif
#if defined(MLAKIT_PLATFORM_CUDA)
#define MLAKIT_HAS_SM90A_KERNELS 1
#define MLAKIT_HAS_CUDA_RUNTIME_API 1
#endif
#if defined(MLAKIT_PLATFORM_HIP)
#define MLAKIT_HAS_CDNA_KERNELS 1
#define MLAKIT_HAS_HIP_RUNTIME_API 1
#endif
