#pragma once
// Block-wide exclusive prefix sum: CUB on NVIDIA, rocPRIM on AMD, behind one interface.
#include "platform.hpp"

#if defined(MLAKIT_PLATFORM_CUDA)
#include <cub/block/block_scan.cuh>
#elif defined(MLAKIT_PLATFORM_HIP)
#include <rocprim/block/block_scan.hpp>
#endif

namespace mlakit::detail {

#if !defined(MLAKIT_PLATFORM_NONE)

// Exclusive sum over `Threads` ints (one per thread), also returning the block total.
// Use: __shared__ typename BlockExclusiveSum<256>::Storage s; BlockExclusiveSum<256>(s).run(...)
template <int Threads>
class BlockExclusiveSum {
#if defined(MLAKIT_PLATFORM_CUDA)
  using Impl = cub::BlockScan<int, Threads>;
#else
  using Impl = rocprim::block_scan<int, Threads>;
#endif

 public:
#if defined(MLAKIT_PLATFORM_CUDA)
  using Storage = typename Impl::TempStorage;
#else
  using Storage = typename Impl::storage_type;
#endif
  __device__ explicit BlockExclusiveSum(Storage& s) : storage_(s) {}

  __device__ void run(int input, int& output, int& total) {
#if defined(MLAKIT_PLATFORM_CUDA)
    Impl(storage_).ExclusiveSum(input, output, total);
#else
    Impl().exclusive_scan(input, output, 0, total, storage_, rocprim::plus<int>());
#endif
  }

 private:
  Storage& storage_;
};

#endif  // !MLAKIT_PLATFORM_NONE

}  // namespace mlakit::detail
