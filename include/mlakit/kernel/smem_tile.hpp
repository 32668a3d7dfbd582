#pragma once
// Shared-memory tile layouts. Rows of 16-bit values whose 16-byte chunks are XOR-swizzled
// with (row & 7): eight consecutive rows read at one logical column hit eight different
// bank groups, so ldmatrix (plain and .trans) is conflict-free without padding, and the
// Q tile plus two 64 x 576 KV stages still fit in 227 KB.
#include "../core/config.hpp"

namespace mlakit::detail {

template <int Cols>  // elements per row, a multiple of 64
struct SwizzledRows {
  static_assert(Cols % 64 == 0, "swizzle groups are 8 chunks of 8 elements");
  static constexpr int kCols = Cols;
  static constexpr int kChunks = Cols / 8;
  // Element offset of (row, col); 8 columns from a multiple of 8 are contiguous.
  MLAKIT_HOST_DEVICE static constexpr int offset(int row, int col) {
    return row * Cols + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
  }
  // Element offset of 16-byte chunk `chunk` (logical) of `row`.
  MLAKIT_HOST_DEVICE static constexpr int chunk_offset(int row, int chunk) {
    return row * Cols + ((chunk ^ (row & 7)) << 3);
  }
};

}  // namespace mlakit::detail
