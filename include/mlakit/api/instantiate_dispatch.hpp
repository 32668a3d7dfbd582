#pragma once
// Compiles decode()'s whole dispatch table (every DispatchEntry and its kernels) in the
// translation unit that includes this header. Include it in exactly one .cu of a program
// whose other files define MLAKIT_EXTERN_DISPATCH (see api/dispatch.hpp); it may itself be
// compiled with MLAKIT_EXTERN_DISPATCH defined. Host-only builds (no CUDA or HIP) get nothing.
#include "dispatch.hpp"

#if defined(MLAKIT_HAS_GPU_BACKEND)
namespace mlakit::detail {
#define MLAKIT_DETAIL_INSTANTIATE_ENTRY(P) template struct DispatchEntry<P>;
MLAKIT_DETAIL_DISPATCH_ENTRIES(MLAKIT_DETAIL_INSTANTIATE_ENTRY)
#undef MLAKIT_DETAIL_INSTANTIATE_ENTRY
}  // namespace mlakit::detail
#endif
