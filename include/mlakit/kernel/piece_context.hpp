#pragma once
// The per-piece context every decode mainloop starts from: the request and row tile a CTA
// works on, the problem's run-time shape (heads, q_len, causal, KV type), and the addressing
// all mainloops share: the request's page mapping and KV rows, Q rows into shared memory, and
// where a row's output and LSE go. A mainloop holds one by reference and knows no other
// mainloop.
#include <cstdint>
#include <type_traits>

#include "../arch/convert.hpp"
#include "../core/attention_math.hpp"
#include "../core/decode_args.hpp"
#include "../core/numeric.hpp"
#include "../core/plan.hpp"
#include "../platform/intrinsics.hpp"
#include "../platform/platform.hpp"
#include "smem_tile.hpp"
#include "workspace.hpp"

#if defined(MLAKIT_HAS_GPU_BACKEND)

namespace mlakit::detail {

template <class Tr>
struct PieceContext {
  using Tq = typename Tr::Tq;
  using Copy = typename Tr::Copy;

  const KernelArgs& p;
  int b, row_tile, heads, q_len, rows, row0;
  bool causal;
  DType kv;
  int kv_bytes;

  // The context of row tile `row_tile` (request b is set per piece by the caller).
  __device__ static PieceContext of_tile(const KernelArgs& p, int row_tile) {
    PieceContext c{p, 0, row_tile,        Tr::heads(p.a),    Tr::q_len(p.a),
                   0, 0, Tr::causal(p.a), Tr::kv_dtype(p.a), 0};
    c.rows = c.heads * c.q_len;
    c.row0 = row_tile * Tr::kRows;
    c.kv_bytes = static_cast<int>(dtype_bytes(c.kv));
    return c;
  }

  // The page mapping of request b: page_table()[i] is the page of tokens [i P, (i + 1) P)
  // (its block-table row or its CSR segment).
  __device__ const std::int32_t* page_table() const {
    const DecodeArgs& a = p.a;
    return a.page_ids == PageIds::block_table ? a.block_table + b * a.block_table_stride
                                              : a.kv_indices + a.kv_indptr[b];
  }
  // Epilogue addresses, used by every mainloop: row `row` (< rows) of the split piece's
  // partial output or of request b's output (both in the Q type; o_row picks), and the row's
  // LSE (the piece's partial slot, or the caller's array when it gave one).
  __device__ __forceinline__ Tq* partial_o_row(const Piece& pc, int row) const {
    return reinterpret_cast<Tq*>(p.ws.partial_o) +
           (std::int64_t(pc.partial_slot) * p.ws.rows_padded + row) * kHeadDimV;
  }
  __device__ __forceinline__ Tq* out_row(int row) const {
    const DecodeArgs& a = p.a;
    const int t = row / heads, h = row - t * heads;
    return static_cast<Tq*>(a.out) + b * a.o_stride_batch + t * a.o_stride_token +
           h * a.o_stride_head;
  }
  // Where row `row` of the piece's output goes: its partial slot when the piece is split, else
  // request b's output; null for rows past the request's. Epilogues call it once per row.
  __device__ __forceinline__ Tq* o_row(const Piece& pc, int row) const {
    if (row >= rows) return nullptr;
    return pc.partial_slot >= 0 ? partial_o_row(pc, row) : out_row(row);
  }
  __device__ __forceinline__ void store_lse(const Piece& pc, bool split, int row, float lse) const {
    const DecodeArgs& a = p.a;
    if (split) {
      p.ws.partial_lse[std::int64_t(pc.partial_slot) * p.ws.rows_padded + row] = lse;
    } else if (a.lse != nullptr) {
      const int t = row / heads, h = row - t * heads;
      a.lse[b * a.lse_stride_batch + t * a.lse_stride_token + h * a.lse_stride_head] =
          lse_in_format(lse, a.lse_format);
    }
  }

  // Byte address of row `in_page` of page `page`: its 512 latent values.
  __device__ const unsigned char* page_row(std::int64_t page, int in_page) const {
    const DecodeArgs& a = p.a;
    return static_cast<const unsigned char*>(a.kv) +
           (page * a.kv_stride_page + std::int64_t(in_page) * a.kv_stride_token) * kv_bytes;
  }
  // Byte address of the rotary values of row `in_page` of page `page` (the kernel arguments
  // went through resolve_rope_part(): for a joined cache, page_row + 512 values).
  __device__ const unsigned char* rope_row(std::int64_t page, int in_page) const {
    const DecodeArgs& a = p.a;
    return static_cast<const unsigned char*>(a.kv_rope) +
           (page * a.kv_rope_stride_page + std::int64_t(in_page) * a.kv_rope_stride_token) *
               kv_bytes;
  }
  // The page of KV token j of request b (j < the request's clamped length).
  __device__ std::int64_t page_of(int j) const {
    const DecodeArgs& a = p.a;
    const int page_idx = j / a.page_size;
    return a.page_ids == PageIds::block_table ? a.block_table[b * a.block_table_stride + page_idx]
                                              : a.kv_indices[a.kv_indptr[b] + page_idx];
  }
  // Byte address of KV token j of request b (j < the request's clamped length).
  __device__ const unsigned char* kv_row(int j) const {
    const DecodeArgs& a = p.a;
    const int page_idx = j / a.page_size;
    const std::int64_t page = a.page_ids == PageIds::block_table
                                  ? a.block_table[b * a.block_table_stride + page_idx]
                                  : a.kv_indices[a.kv_indptr[b] + page_idx];
    return page_row(page, j - page_idx * a.page_size);
  }

  // Q rows [row0, row0 + R) in the Q type (rows past `rows` zero-filled) by cp.async: 16-byte
  // unit u (dims 8 u ..) of row r to q + unit_offset(r, u) bytes; `Threads` threads take part,
  // the caller commits and waits. Q of every mainloop whose operands are in the Q type.
  template <int Threads, int R, class UnitOffset>
  __device__ void copy_q_rows(unsigned char* q, UnitOffset unit_offset) const {
    constexpr int kUnits = kHeadDimQK / 8;
    const DecodeArgs& a = p.a;
    for (int c = static_cast<int>(threadIdx.x); c < R * kUnits; c += Threads) {
      const int r = c / kUnits, u = c % kUnits;
      const int row = row0 + r;
      const bool valid = row < rows;
      const Tq* src = static_cast<const Tq*>(a.q);
      if (valid) {
        const int t = row / heads, h = row - t * heads;
        src += b * a.q_stride_batch + t * a.q_stride_token + h * a.q_stride_head + u * 8;
      }
      Copy::copy16(q + unit_offset(r, u), src, valid);
    }
  }
  // The same into a wgmma operand tile Swizzle128Tile<R> (the Hopper mainloops).
  template <int Threads, int R>
  __device__ void copy_q_tile(unsigned char* q) const {
    copy_q_rows<Threads, R>(q, [](int r, int u) { return Swizzle128Tile<R>::unit_offset(r, u); });
  }

  // Q rows scaled by a power of two per row: store(row, block, v) receives each 16-dim block
  // of the tile's row `row` as 16 floats in dim order, each times 2^e, where e puts the row's
  // largest |q| in [2^(Top - 1), 2^Top) (bf16 Q, and every Q type where AllTypes; else e = 0;
  // e = 0 for a row of zeros or with a non-finite maximum). The row's factor times 2^-e goes to
  // scale_out. `Threads` threads take part.
  template <int Threads, int Top, bool AllTypes, class Store>
  __device__ void load_q_pow2(Store store, float* scale_out, float factor) const {
    const DecodeArgs& a = p.a;
    constexpr int kTpr = Threads / Tr::kRows;  // threads per row (4 or 8, one warp)
    static_assert(kTpr >= 1 && 32 % kTpr == 0, "Q rows are split over lanes of one warp");
    constexpr int kBlocks = kHeadDimQK / 16;
    const int r = threadIdx.x / kTpr, sub = threadIdx.x % kTpr;
    const int row = row0 + r;
    const bool valid = row < rows;
    const Tq* src = static_cast<const Tq*>(a.q);
    if (valid) {
      const int t = row / heads, h = row - t * heads;
      src += b * a.q_stride_batch + t * a.q_stride_token + h * a.q_stride_head;
    }
    auto load16 = [&](int blk, float(&v)[16]) {
      uint4 w[2] = {uint4{0, 0, 0, 0}, uint4{0, 0, 0, 0}};
      if (valid) {
        w[0] = *reinterpret_cast<const uint4*>(src + blk * 16);
        w[1] = *reinterpret_cast<const uint4*>(src + blk * 16 + 8);
      }
      const std::uint32_t u[8] = {w[0].x, w[0].y, w[0].z, w[0].w, w[1].x, w[1].y, w[1].z, w[1].w};
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        v[2 * i] = to_float(Tq{std::uint16_t(u[i] & 0xFFFFu)});
        v[2 * i + 1] = to_float(Tq{std::uint16_t(u[i] >> 16)});
      }
    };
    float scale = 1.0f;
    if constexpr (AllTypes || std::is_same_v<Tq, bf16_t>) {
      float mx = 0.0f;
      for (int blk = sub; blk < kBlocks; blk += kTpr) {
        float v[16];
        load16(blk, v);
#pragma unroll
        for (int i = 0; i < 16; ++i) mx = fmaxf(mx, fabsf(v[i]));
      }
#pragma unroll
      for (int o = 1; o < kTpr; o <<= 1) mx = fmaxf(mx, shfl_xor(mx, o));
      if (mx > 0.0f && mx <= 3.0e38f) {
        int ex;
        frexpf(mx, &ex);  // mx in [2^(ex-1), 2^ex)
        int e = Top - ex;
        e = e < -120 ? -120 : (e > 120 ? 120 : e);
        scale = bits_to_float(std::uint32_t(127 + e) << 23);
      }
    }
    // Never 0 (a factor or row below fp32's range): the keys-as-M forms take P as
    // 2^(s x scale - base) from masked scores s = -inf, and -inf x 0 would be NaN.
    if (sub == 0) scale_out[r] = fmaxf(factor / scale, kMinRowScale);
    for (int blk = sub; blk < kBlocks; blk += kTpr) {
      float v[16];
      load16(blk, v);
#pragma unroll
      for (int i = 0; i < 16; ++i) v[i] *= scale;
      store(r, blk, v);
    }
  }

  // e4m3 operand mode: Q rows -> f16 times 2^e (bf16 Q: e per row puts the row's largest |q|
  // in [2^14, 2^15); fp16 Q as it is); store(row, block, w) receives each 16-dim block as 8
  // f16 pairs in dim order, and the row's 2^-e, multiplied by `factor`, goes to scale_out.
  // `Threads` threads take part.
  template <int Threads = Tr::kThreads, class Store>
  __device__ void load_q_scaled(Store store, float* scale_out, float factor = 1.0f) const {
    load_q_pow2<Threads, 15, false>(
        [&](int r, int blk, const float(&v)[16]) {
          std::uint32_t w[8];
#pragma unroll
          for (int i = 0; i < 8; ++i) w[i] = arch::pack2<fp16_t>(v[2 * i], v[2 * i + 1]);
          store(r, blk, w);
        },
        scale_out, factor);
  }
};

}  // namespace mlakit::detail

#endif  // MLAKIT_HAS_GPU_BACKEND
