#pragma once
// The boundary between the two translation units of the extension: kernels.cu (compiled by
// nvcc, includes the whole library, no PyTorch header) and binding.cpp (compiled by the host
// compiler, includes PyTorch). Keeping PyTorch out of the CUDA translation unit keeps its
// compile time to the dispatch table alone and keeps PyTorch's CUDA macros away from the
// library's device code. Only plain data crosses it (DecodeArgs, MergeArgs, integers, a char
// buffer), so the two units may even disagree on the C++ standard library ABI.
#include <cstddef>
#include <cstdint>

#include <mlakit/core/decode_args.hpp>
#include <mlakit/core/merge_args.hpp>

namespace mlakit_torch {

// Status of a call: the library's StatusCode as an int, its message copied (truncated, always
// NUL-terminated) into `message` of `capacity` bytes.
inline constexpr std::size_t kMessageCapacity = 1024;

// mlakit::decode() on the CUDA stream `stream` (a cudaStream_t) of the current device.
int run_decode(const mlakit::DecodeArgs& a, void* workspace, std::size_t bytes, void* stream,
               char* message, std::size_t capacity);

// mlakit::merge_states() on the CUDA stream `stream` of the current device.
int run_merge_states(const mlakit::MergeArgs& a, void* stream, char* message,
                     std::size_t capacity);

// mlakit::workspace_bytes() for `a` on the current device.
int query_workspace_bytes(const mlakit::DecodeArgs& a, std::int64_t* bytes, char* message,
                          std::size_t capacity);

}  // namespace mlakit_torch
