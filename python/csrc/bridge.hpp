#pragma once
// The boundary between the two translation units of the extension: kernels.cu (compiled by
// nvcc, includes the whole library, no PyTorch header) and binding.cpp (compiled by the host
// compiler, includes PyTorch, sees only the plain-C++ argument and status types). Keeping
// PyTorch out of the CUDA translation unit keeps its compile time to the dispatch table alone
// and keeps PyTorch's CUDA macros away from the library's device code.
#include <cstddef>
#include <cstdint>

#include <mlakit/core/decode_args.hpp>
#include <mlakit/core/status.hpp>

namespace mlakit_torch {

// mlakit::decode() on the CUDA stream `stream` (a cudaStream_t) of the current device.
mlakit::Status run_decode(const mlakit::DecodeArgs& a, void* workspace, std::size_t bytes,
                          void* stream);

// mlakit::workspace_bytes() for `a` on the current device.
mlakit::Status query_workspace_bytes(const mlakit::DecodeArgs& a, std::int64_t* bytes);

}  // namespace mlakit_torch
