#pragma once
// Shared-memory tile layouts. Rows of 16-bit values whose 16-byte chunks are XOR-swizzled
// with (row & 7): eight consecutive rows read at one logical column hit eight different
// bank groups, so ldmatrix (plain and .trans) is conflict-free without padding, and the
// Q tile plus two 64 x 576 KV stages still fit in 227 KB.
#include "../core/config.hpp"

namespace mlakit::detail {

template <int Cols>  // elements per row: a multiple of 64, or 8 x a power of two below that
struct SwizzledRows {
  static constexpr int kCols = Cols;
  static constexpr int kChunks = Cols / 8;
  // Rows of fewer than 8 chunks (e.g. a 32-wide P tile) swizzle over the chunks they have.
  static constexpr int kMask = kChunks >= 8 ? 7 : kChunks - 1;
  static_assert(Cols % 8 == 0 && (kChunks % 8 == 0 || (kChunks & (kChunks - 1)) == 0),
                "swizzle groups are 8 (or a power of two of) chunks of 8 elements");
  // Element offset of (row, col); 8 columns from a multiple of 8 are contiguous.
  MLAKIT_HOST_DEVICE static constexpr int offset(int row, int col) {
    return row * Cols + ((((col >> 3) ^ (row & kMask))) << 3) + (col & 7);
  }
  // Element offset of 16-byte chunk `chunk` (logical) of `row`.
  MLAKIT_HOST_DEVICE static constexpr int chunk_offset(int row, int chunk) {
    return row * Cols + ((chunk ^ (row & kMask)) << 3);
  }
};

// Rows of raw one-byte KV (576 bytes = 36 chunks of 16 bytes per token). A 576-byte row
// stride puts rows r and r+2 on the same bank group, so chunk c of row r is stored at
// c ^ ((r >> 1) & 3): the eight rows of one ldmatrix (row0 a multiple of 8) then cover all
// eight bank groups, and so do the cp.async stores of two rows x four chunks.
template <int RowBytes>
struct SwizzledByteRows {
  static_assert(RowBytes % 64 == 0, "rows are whole groups of four 16-byte chunks");
  MLAKIT_HOST_DEVICE static constexpr int chunk_offset(int row, int chunk) {
    return row * RowBytes + ((chunk ^ ((row >> 1) & 3)) << 4);
  }
};

// wgmma operand tile with the 128-byte swizzle: Rows rows of 16-bit values, stored as 64-column
// chunks of [Rows][128 B]; 16-byte unit u (8 values) of row r sits at u ^ (r & 7) within its
// 128-byte row. With the tile 1024-byte aligned this is the hardware's 128B pattern (address
// bits 4-6 XOR bits 7-9), which wgmma descriptors with swizzle mode 1 expect.
template <int Rows>
struct Swizzle128Tile {
  static_assert(Rows % 8 == 0, "whole 1024-byte swizzle atoms");
  static constexpr int kChunkBytes = Rows * 128;  // one 64-column chunk
  // Byte offset of 16-byte unit `unit` (columns 8 unit .. 8 unit + 7) of row `r`.
  MLAKIT_HOST_DEVICE static constexpr int unit_offset(int r, int unit) {
    return (unit >> 3) * kChunkBytes + r * 128 + (((unit & 7) ^ (r & 7)) << 4);
  }
};

}  // namespace mlakit::detail
