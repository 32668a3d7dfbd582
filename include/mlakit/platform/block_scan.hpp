#pragma once
// Block-wide exclusive prefix sum: a shuffle scan on NVIDIA, rocPRIM on AMD, behind one
// interface.
// MLAKIT_NO_ROCPRIM selects a plain shared-memory scan on AMD instead: for a ROCm whose
// rocPRIM is missing, or older than its HIP headers (rocPRIM 5.x does not compile against
// HIP 6/7, where warpSize stopped being a compile-time constant).
#include "platform.hpp"

#if defined(MLAKIT_PLATFORM_HIP) && !defined(MLAKIT_NO_ROCPRIM)
#include <rocprim/block/block_scan.hpp>
#endif

namespace mlakit::detail {

#if !defined(MLAKIT_PLATFORM_NONE)

#if defined(MLAKIT_PLATFORM_HIP) && defined(MLAKIT_NO_ROCPRIM)
// Hillis-Steele scan over one int per thread: log2(Threads) steps of one shared read and
// write. The planner runs it twice per call, so its cost next to rocPRIM's does not matter.
template <int Threads>
struct SharedMemoryScan {
  static_assert(Threads > 0 && (Threads & (Threads - 1)) == 0, "Threads: a power of two");
  struct storage_type {
    int v[Threads];
  };
  __device__ static void run(storage_type& s, int input, int& output, int& total) {
    const int t = static_cast<int>(threadIdx.x);
    s.v[t] = input;
    __syncthreads();
    for (int off = 1; off < Threads; off <<= 1) {
      const int x = t >= off ? s.v[t - off] : 0;
      __syncthreads();
      s.v[t] += x;
      __syncthreads();
    }
    output = s.v[t] - input;
    total = s.v[Threads - 1];
    __syncthreads();  // the storage may be reused right after
  }
};
#endif

#if defined(MLAKIT_PLATFORM_CUDA)
// Shuffle scan within each warp, then every thread adds the totals of the warps before its
// own from shared memory: one barrier. Every thread of the block runs every shuffle, so ptxas
// emits plain SHFL.UP (CUB's BlockScan, used before, compiled to the collective form for a
// possibly diverged warp in the planner, where a block of four warps is latency bound).
// As with CUB, the caller synchronises before the storage is reused. Lane and warp come from
// unsigned bit operations: lane_id() / warp_id() (a signed % and /) add 32 instructions to
// the planner kernels (sm_90a, nvdisasm), which sit on the small-batch latency path.
template <int Threads>
struct WarpShuffleScan {
  static_assert(Threads % 32 == 0 && Threads <= 1024, "Threads: whole warps");
  static constexpr int kWarps = Threads / 32;
  struct storage_type {
    int warp_total[kWarps];
  };
  __device__ static void run(storage_type& s, int input, int& output, int& total) {
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const int warp = static_cast<int>(threadIdx.x) >> 5;
    int x = input;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, x, off);
      x += lane >= off ? y : 0;
    }
    if (lane == 31) s.warp_total[warp] = x;
    __syncthreads();
    int before = 0, sum = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const int t = s.warp_total[w];
      before += w < warp ? t : 0;
      sum += t;
    }
    output = before + x - input;
    total = sum;
  }
};
#endif

// Exclusive sum over `Threads` ints (one per thread), also returning the block total.
// Use: __shared__ typename BlockExclusiveSum<256>::Storage s; BlockExclusiveSum<256>(s).run(...)
template <int Threads>
class BlockExclusiveSum {
#if defined(MLAKIT_PLATFORM_CUDA)
  using Impl = WarpShuffleScan<Threads>;
#elif defined(MLAKIT_NO_ROCPRIM)
  using Impl = SharedMemoryScan<Threads>;
#else
  using Impl = rocprim::block_scan<int, Threads>;
#endif

 public:
  using Storage = typename Impl::storage_type;
  __device__ explicit BlockExclusiveSum(Storage& s) : storage_(s) {}

  __device__ void run(int input, int& output, int& total) {
#if defined(MLAKIT_PLATFORM_CUDA) || defined(MLAKIT_NO_ROCPRIM)
    Impl::run(storage_, input, output, total);
#else
    Impl().exclusive_scan(input, output, 0, total, storage_, rocprim::plus<int>());
#endif
  }

 private:
  Storage& storage_;
};

#endif  // !MLAKIT_PLATFORM_NONE

}  // namespace mlakit::detail
