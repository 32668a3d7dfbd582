// The library's dispatch table, compiled once for the extension. No PyTorch header here.
#include <mlakit/mlakit.hpp>

#include "bridge.hpp"

namespace mlakit_torch {

mlakit::Status run_decode(const mlakit::DecodeArgs& a, void* workspace, std::size_t bytes,
                          void* stream) {
  return mlakit::decode(a, workspace, bytes, static_cast<cudaStream_t>(stream));
}

mlakit::Status query_workspace_bytes(const mlakit::DecodeArgs& a, std::int64_t* bytes) {
  mlakit::DeviceInfo dev;
  mlakit::Status s = mlakit::cached_device_info(&dev);
  if (!s) return s;
  *bytes = static_cast<std::int64_t>(mlakit::workspace_bytes(a, dev));
  return s;
}

}  // namespace mlakit_torch
