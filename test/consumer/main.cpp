// Builds against an installed mlakit (host only) and prints what it sees.
#include <cstdio>
#include <mlakit/core/dtype.hpp>
#include <mlakit/core/status.hpp>

int main() {
  const mlakit::DType kv = mlakit::DType::fp8_e4m3fn;
  const mlakit::Status s = mlakit::Status::ok();
  std::printf("mlakit consumer: kv dtype %s is %zu byte(s); status %s\n", mlakit::dtype_name(kv),
              mlakit::dtype_bytes(kv), mlakit::status_code_name(s.code()));
  return s ? 0 : 1;
}
