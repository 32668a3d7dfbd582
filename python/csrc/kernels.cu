// The extension's calls into the library. No PyTorch header here. The dispatch table is
// compiled in four parts (dispatch_part0.cu to dispatch_part3.cu, in parallel with MAX_JOBS),
// so this file only declares its entries.
#define MLAKIT_EXTERN_DISPATCH 1
#include <mlakit/mlakit.hpp>

#include <cstring>

#include "bridge.hpp"

namespace mlakit_torch {

namespace {
int report(const mlakit::Status& s, char* message, std::size_t capacity) {
  if (capacity > 0) {
    const std::size_t n = s.message().size() < capacity - 1 ? s.message().size() : capacity - 1;
    std::memcpy(message, s.message().data(), n);
    message[n] = '\0';
  }
  return static_cast<int>(s.code());
}
}  // namespace

int run_decode(const mlakit::DecodeArgs& a, void* workspace, std::size_t bytes, void* stream,
               char* message, std::size_t capacity) {
  return report(mlakit::decode(a, workspace, bytes, static_cast<cudaStream_t>(stream)), message,
                capacity);
}

int run_merge_states(const mlakit::MergeArgs& a, void* stream, char* message,
                     std::size_t capacity) {
  return report(mlakit::merge_states(a, static_cast<cudaStream_t>(stream)), message, capacity);
}

int query_workspace_bytes(const mlakit::DecodeArgs& a, std::int64_t* bytes, char* message,
                          std::size_t capacity) {
  mlakit::DeviceInfo dev;
  mlakit::Status s = mlakit::cached_device_info(&dev);
  std::size_t n = 0;
  if (s) s = mlakit::workspace_bytes(a, dev, &n);  // a Status, not a silent 0, off the domain
  if (s) *bytes = static_cast<std::int64_t>(n);
  return report(s, message, capacity);
}

}  // namespace mlakit_torch
