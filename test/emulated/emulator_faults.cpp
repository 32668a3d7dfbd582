// The emulated AMD device's own scheduling and fault detection (include/mlakit/platform/
// emulated/): a block whose waves shuffle, wait at barriers and exit early computes what the
// host computes, and the two ways a kernel can hang on hardware (a barrier or a wave operation
// that part of the threads never reach, and lanes of one wave at different wave operations)
// are faults that the next synchronising call reports.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "gpu_harness.hpp"

using namespace mlakit::testing;

namespace {

constexpr int kThreads = 256;

// Per thread: the sum of its wave's thread indices by a butterfly of shuffles, then the block's
// sum through shared memory after a barrier that the odd threads of the last wave, already
// exited, do not reach.
__global__ void block_sum_kernel(int* wave_sums, int* block_sum) {
  __shared__ int partial[kThreads / 64];
  const int tid = static_cast<int>(threadIdx.x);
  int v = tid;
  for (int mask = 32; mask >= 1; mask /= 2) v += __shfl_xor(v, mask);
  wave_sums[tid] = v;
  if (tid % 64 == 0) partial[tid / 64] = v;
  if (tid >= kThreads - 64 && tid % 2 == 1) return;
  __syncthreads();
  if (tid == 0) {
    int s = 0;
    for (int w = 0; w < kThreads / 64; ++w) s += partial[w];
    *block_sum = s;
  }
}

// Lanes 0-31 of wave 0 shuffle while lanes 32-63 wait at a barrier: neither can complete.
__global__ void split_wave_kernel(int* out) {
  const int tid = static_cast<int>(threadIdx.x);
  int v = tid;
  if (tid % 64 < 32)
    v = __shfl_xor(v, 1);
  else
    __syncthreads();
  out[tid] = v;
}

// Lanes of one wave at two different shuffles.
__global__ void divergent_shuffle_kernel(int* out) {
  const int tid = static_cast<int>(threadIdx.x);
  out[tid] = tid % 64 < 32 ? __shfl_xor(tid, 1) : __shfl_xor(tid, 2);
}

std::string launch_fault(void (*kernel)(int*)) {
  DeviceBuffer d(kThreads * sizeof(int));
  REQUIRE(d.ptr);
  hipLaunchKernelGGL(kernel, dim3(2), dim3(kThreads), 0, nullptr, d.as<int>());
  const hipError_t launch = hipGetLastError();
  const hipError_t sync = hipDeviceSynchronize();
  const hipError_t last = hipGetLastError();  // clears the error for the next case
  return std::string(hipGetErrorName(launch)) + " / " + hipGetErrorName(sync) + " / " +
         hipGetErrorName(last);
}

}  // namespace

TEST_CASE("emulator: shuffles, barriers and early exits give the host's sums", "[amd][emulator]") {
  DeviceBuffer d_wave(kThreads * sizeof(int)), d_block(sizeof(int));
  REQUIRE((d_wave.ptr && d_block.ptr));
  hipLaunchKernelGGL(block_sum_kernel, dim3(3), dim3(kThreads), 0, nullptr, d_wave.as<int>(),
                     d_block.as<int>());
  REQUIRE(hipGetLastError() == hipSuccess);
  REQUIRE(hipDeviceSynchronize() == hipSuccess);
  std::vector<int> wave(kThreads);
  int block = 0;
  REQUIRE(gpu_d2h(wave.data(), d_wave.ptr, kThreads * sizeof(int)));
  REQUIRE(gpu_d2h(&block, d_block.ptr, sizeof(int)));
  int wrong = 0;
  for (int t = 0; t < kThreads; ++t) {
    const int w = t / 64;
    wrong += wave[t] != 64 * 64 * w + 63 * 64 / 2;  // the sum of 64 w .. 64 w + 63
  }
  CHECK(wrong == 0);
  CHECK(block == (kThreads - 1) * kThreads / 2);
}

TEST_CASE("emulator: a barrier and a wave operation that never complete are a fault",
          "[amd][emulator]") {
  CHECK(launch_fault(split_wave_kernel) ==
        "hipSuccess / hipErrorLaunchFailure / hipErrorLaunchFailure");
}

TEST_CASE("emulator: lanes of one wave at different wave operations are a fault",
          "[amd][emulator]") {
  CHECK(launch_fault(divergent_shuffle_kernel) ==
        "hipSuccess / hipErrorLaunchFailure / hipErrorLaunchFailure");
}
