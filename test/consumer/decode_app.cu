// A user's file that calls mlakit::decode(), compiled as CUDA or HIP against the installed
// package. Built with MLAKIT_EXTERN_DISPATCH (CMakeLists.txt), it only declares the dispatch
// table, which decode_table.cu compiles once. Compiled on its own without that macro (the
// README's plain nvcc line), it compiles the table itself.
#include <cstdio>
#include <mlakit/mlakit.hpp>

namespace {

// The run-time API end to end: validation, workspace size, launch. A request with batch 0 is
// valid and needs no GPU, so the program also runs (and exits 0) on a machine without one.
mlakit::Status verify_step(const mlakit::DecodeArgs& a, void* ws, std::size_t ws_bytes,
                           mlakit::Stream stream) {
  return mlakit::decode(a, ws, ws_bytes, stream);
}

}  // namespace

int main() {
  mlakit::DecodeArgs a;
  a.q_type = mlakit::DType::bf16;
  a.kv_type = mlakit::DType::fp8_e4m3fn;
  a.num_heads = 16;
  a.q_len = 8;
  a.page_size = 64;
  a.softmax_scale = 0.0625f;
  a.kv_scale = 0.02f;
  mlakit::set_packed_strides(a);
  a.max_pages_per_request = 128;

  const mlakit::DeviceInfo dev{0, 132, 232448, 90};  // sizing needs no device query
  std::size_t bytes = 0;
  a.batch = 64;
  mlakit::Status s = mlakit::workspace_bytes(a, dev, &bytes);
  std::printf("workspace for batch 64 on 132 SMs: %zu bytes (%s)\n", bytes,
              mlakit::status_code_name(s.code()));
  a.batch = 0;
  s = verify_step(a, nullptr, 0, nullptr);
  std::printf("decode(batch 0): %s\n", s ? "ok" : s.message().c_str());
  return s ? 0 : 1;
}
