#pragma once
// The host/device qualifier: the one macro that core/ may define. Everything in core/ is
// plain C++17 that also compiles as device code under nvcc and hipcc.
#if defined(__CUDACC__) || defined(__HIPCC__)
#define MLAKIT_HOST_DEVICE __host__ __device__
#else
#define MLAKIT_HOST_DEVICE
#endif
