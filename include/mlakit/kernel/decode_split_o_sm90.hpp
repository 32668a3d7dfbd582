#pragma once
// Hopper warp-specialized split-O mainloop of the 64-row policy: its two consumer warpgroups
// split the output columns (sm_90a device code only; on other targets the host launches the
// mma.sync mainloop of decode_kernel.hpp for the same policy).
//
// 384 threads = three warpgroups:
//   warpgroup 2, producer (40 registers; 56 for e4m3fn and dynamic-dtype KV): fetches KV tiles
//     of 64 tokens into a ring of two stages [64 x 576] in the compute type (128-byte swizzle),
//     one 64-column chunk at a time, each chunk signalled by its own mbarrier. A stage is
//     refilled in two halves, released separately: "lo" = chunks 0-3 (V columns 0..255) and
//     "hi" = chunks 4-8, in the order the consumers release them: A-lo, A-hi, B-hi, B-lo.
//     16-bit KV of the compute type: cp.async straight into the stage. fp8 KV: cp.async of a
//     half's raw bytes into the top of that half, converted in place chunk by chunk
//     (converted chunk c only overwrites raw chunks <= c) while the next half's raw copies are
//     in flight. Other 16-bit KV: loaded, converted, stored. Every copy is a single
//     instruction (constant offsets from per-thread base addresses).
//   warpgroups 0 and 1, consumers (232 registers; 224 with the 56-register producers): the
//     same 64 rows, O split by columns (warpgroup w owns O[:, 256w .. 256w + 256), 128 fp32
//     registers per thread). Tiles come in pairs (A = even tile, stage 0; B = odd, stage 1);
//     warpgroup 0 computes S and the softmax of A, warpgroup 1 those of B, and both accumulate
//     P V of both tiles for their columns. Q's rope columns (chunk 8) are held in registers
//     (16 per thread, the A operand of S's last k-steps), so sQ's chunk 8 holds P of tile B
//     and each tile's P has its own buffer. Per pair (consume_a / consume_b have the details):
//
//        warpgroup 0                               warpgroup 1
//        S_A (waited)                              S_B, chunks 4-8 then 0-3 (waited)
//        softmax A, O *= alpha; P_A -> sP_A
//        publish m_A, sP_A  -->                    O *= alpha (m_A); O += sP_A V_A (SS)
//        O += P_A V_A (RS); release A-lo           softmax B against m_A (both P V of A
//                                                  in flight)
//        <-- m_B, sP_B: O *= beta                  publish m_B, P_B -> sP_B; when the P V
//                                                  of A retires: release A-hi, pa_read
//        O += sP_B V_B (SS)                        O *= beta; O += P_B V_B (RS);
//        S_A' chunks 0-3 queued behind it;          release B-hi; S_B' of the next pair
//        release B-lo when it retires; S_A' 4-8;
//        <-- pa_read (sP_A free)
//
//     Each warpgroup's softmax runs while matrix work is queued (warpgroup 0's while S_B
//     finishes, warpgroup 1's behind both P V of A), and P_A crosses with the running max,
//     relative to it, so that warpgroup 1's P V of A (the last read of A-hi) is issued before
//     its own softmax: both halves of stage A are released in the middle of the pair, which
//     gives their refill (the next S_A's operands) half a pair more than if A-hi waited for
//     the pair's end. Warpgroup 1 rescales O for m_A and for m_B, each only where that max
//     moved (the lazy running max makes both rare). Each stage half has one releasing
//     warpgroup (the other warpgroup's reads of it are ordered before the release through
//     max_a / max_b), and every hand-over is a one-way named barrier (NamedBarrier: max_a
//     carries m_A and sP_A, max_b m_B and sP_B, pa_read says sP_A may be rewritten). The
//     running max is one value per row shared by both warpgroups, so they scale O and l
//     identically.
// A piece with an odd number of tiles gets one extra tile, all masked; the producer copies
// the piece's last token into the token slots past its end (SplitOMainloop::token).
#include <cstdint>
#include <type_traits>

#include "../arch/convert.hpp"
#include "../arch/copy_atom.hpp"
#include "../arch/mma_atom.hpp"
#include "../arch/pipeline_sm90.hpp"
#include "../arch/wgmma_sm90.hpp"
#include "../core/attention_math.hpp"
#include "../core/plan.hpp"
#include "../platform/intrinsics.hpp"
#include "decode_kernel.hpp"
#include "piece_context.hpp"
#include "smem_tile.hpp"
#include "workspace.hpp"

#if defined(MLAKIT_HAS_SM90A_KERNELS)

namespace mlakit::detail {

// Shared memory of the warp-specialized mainloop: the tiles in dynamic shared memory (224 KB,
// 1024-byte aligned for the 128-byte swizzle) and the small state in static shared memory
// (2 KB). Only sm_90a code of the kernel declares the static part, so its size also tells the
// host which code the runtime loaded (warpgroup_usable() in api/decode.hpp).
struct SplitOSharedStorage {
  static constexpr int kTileBytes = 9 * Swizzle128Tile<64>::kChunkBytes;  // [64 x 576] 16-bit
  alignas(1024) unsigned char q[kTileBytes];      // Q [64 rows x 576], compute type
  alignas(1024) unsigned char kv[2][kTileBytes];  // KV stages [64 tokens x 576]
  alignas(1024) unsigned char p[64 * 64 * 2];     // P of one tile [64 rows x 64 keys], K-major
};
struct alignas(1024) SplitOStaticStorage {
  using Pipeline = arch::RingPipeline<2, 9, 2, 128>;
  // Running max after tile A (slot 2 k) / tile B (slot 2 k + 1) of a pair, k = pair parity:
  // a slot is rewritten two pairs after it was read.
  float row_max[4][64];
  float row_sum[2][64];  // epilogue: l of each consumer warpgroup
  float q_scale[64];     // e4m3 operand mode: 2^-e of each Q row
  Pipeline::Storage bars;
};

template <class Tr>
struct SplitOMainloop {
  using T = typename Tr::T;
  using Tq = typename Tr::Tq;
  using W = arch::Wgmma<T>;
  using Copy = typename Tr::Copy;
  using Tile = Swizzle128Tile<64>;
  using Pipeline = SplitOStaticStorage::Pipeline;
  using State = arch::PipelineState<2>;
  static constexpr int kThreads = 384;
  static constexpr int kConsumerThreads = 256;
  static constexpr int kProducerThreads = 128;
  // A producer that converts KV (e4m3fn in hardware, other types in software) gets more
  // registers: its conversion loop is on the path between a stage half's release and its next
  // use, and the dynamic-dtype kernels spill less (ptxas -v). The bf16 / fp16 kernels need 232
  // for their consumers (no spills there). docs/performance.md, "Constants", has the timings.
  static constexpr int kConsumerRegs = Tr::kDirect ? 232 : 224;
  static constexpr int kProducerRegs = Tr::kDirect ? 40 : 56;
  // setmaxnreg.inc waits until the CTA's pool has the registers: the pool is what the launch
  // bounds gave every thread (168 = 65536 / 384 rounded down to 8), so the split must fit it
  // or the consumers wait forever.
  static_assert(kConsumerThreads * kConsumerRegs + kProducerThreads * kProducerRegs <=
                    kThreads * (65536 / kThreads / 8 * 8),
                "the register split exceeds the CTA's allocation");
  static constexpr int kChunkBytes = Tile::kChunkBytes;  // 64 tokens x 64 columns, 8 KB
  static constexpr int kLatentChunks = kHeadDimV / 64;  // chunks 0-7; chunk 8 is the rotary part
  static constexpr int kLo = 0, kHi = 1;                 // release groups: chunks 0-3, 4-8
  // fp8: the raw bytes of chunks [C0, C1) sit at the top of those chunks' converted region.
  template <int C0, int C1>
  static constexpr int kRawBase = C1* kChunkBytes - (C1 - C0) * 4096;
  static_assert(Tr::kRows == 64, "the warp-specialized mainloop serves 64-row tiles");
  static_assert(sizeof(SplitOSharedStorage) + sizeof(SplitOStaticStorage) <= 232448,
                "fits the 227 KB of an sm_90 block");

  PieceContext<Tr>& ctx;       // the piece: request, row tile, addressing
  SplitOSharedStorage& tiles;  // Q, the KV stages and P (dynamic shared memory)
  SplitOStaticStorage& state;  // row maxima, sums, Q scales, barriers (static shared memory)

  // ---- the piece a CTA works on ----------------------------------------------------------
  struct Range {
    int kv_begin, kv_end;  // tokens [kv_begin, kv_end) the piece reads (after causal clip)
    int n_pairs;           // pairs of 64-token tiles (the last tile may be padding)
  };
  __device__ Range range(const RequestPlan& rq, const Piece& pc) const {
    const int last_row = (ctx.row0 + 64 < ctx.rows ? ctx.row0 + 64 : ctx.rows) - 1;
    const int vis_last = visible_keys(rq.kv_len, ctx.q_len, last_row / ctx.heads, ctx.causal);
    Range r;
    r.kv_begin = pc.kv_begin;
    r.kv_end = pc.kv_end < vis_last ? pc.kv_end : vis_last;
    const int tiles = r.kv_end > r.kv_begin ? (r.kv_end - r.kv_begin + 63) / 64 : 0;
    r.n_pairs = (tiles + 1) / 2;
    return r;
  }

  // ---- producer warpgroup ------------------------------------------------------------------
  //
  // Page ids are loaded one tile ahead: the id loads of tile i + 1 are issued before the
  // producer waits for the stage of tile i, and tile i's row addresses come from ids that
  // arrived during the previous tile. (Resolving each token's page right before its copy puts
  // two dependent global loads per token, in sequence, between a stage release and the copies
  // into that stage, and with two stages that chain, not the copies, sets the pace.)

  // fp8 KV is copied raw by 4 threads per token (2 tokens per thread), 16-bit KV by 8 threads
  // per token (4 tokens per thread).
  __device__ bool raw_fp8() const { return !Tr::kDirect && ctx.kv_bytes == 1; }
  __device__ int tokens_per_thread() const { return raw_fp8() ? 2 : 4; }
  __device__ int token_of(int tid, int k) const {
    return raw_fp8() ? tid / 4 + 32 * k : tid / 8 + 16 * k;
  }
  // The token of this thread's k-th copy of the tile at kt, clamped to the piece's last
  // token `last`: tokens past the piece read that token's row, which the tile holds anyway,
  // instead of zero-filling (their scores are masked, so their P is 0, as for any masked key
  // of the piece; the row is the request's, never an unused page's).
  __device__ int token(int kt, int last, int tid, int k) const {
    return min(kt + token_of(tid, k), last);
  }
  // Issues the loads of the page ids of this thread's tokens of the tile at kt.
  __device__ void fetch_pages(const std::int32_t* table, int kt, int last, int tid,
                              int (&id)[4]) const {
    const int n = tokens_per_thread();
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (k < n) id[k] = __ldg(table + ctx.p.page.div(token(kt, last, tid, k)));
    }
  }
  // Latent and (kSplit: a separate cache's) rotary row addresses of this thread's tokens of
  // the tile at kt.
  template <bool kSplit>
  __device__ void rows_of(int kt, int last, int tid, const int (&id)[4],
                          const unsigned char* (&src)[4], const unsigned char* (&rope)[4]) const {
    const int n = tokens_per_thread();
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int j = token(kt, last, tid, k);
      const int in_page = ctx.p.page.mod(j, ctx.p.page.div(j));
      const unsigned char* unused = static_cast<const unsigned char*>(ctx.p.a.kv);
      src[k] = k < n ? ctx.page_row(id[k], in_page) : unused;
      if constexpr (kSplit) rope[k] = k < n ? ctx.rope_row(id[k], in_page) : unused;
    }
  }

  template <int C0, int C1>
  struct Half {  // chunks [C0, C1) of a stage: lo = Half<0, 4>, hi = Half<4, 9>
    static constexpr int c0 = C0, c1 = C1;
  };

  // Tiles come in pairs (A in stage 0, B in stage 1), and the halves of a pair are refilled
  // in the order the consumers release them: A-lo, A-hi, B-hi, B-lo (consume_a / consume_b).
  // fp8 KV: each half's raw copies are issued as soon as it is released and converted while
  // the next half's copies are in flight. kSplit (a separate rotary cache): chunk 8 comes from
  // the rotary rows.
  __device__ void produce(const Range& r, State& st) const {
    constexpr bool kSplit = Tr::Problem::kSplitCache;
    if (r.n_pairs == 0) return;
    const Pipeline pipe{state.bars};
    const int tid = static_cast<int>(threadIdx.x) - kConsumerThreads;  // 0..127
    const std::int32_t* table = ctx.page_table();
    const int last = r.kv_end - 1;
    int id_a[4] = {0, 0, 0, 0}, id_b[4] = {0, 0, 0, 0};
    fetch_pages(table, r.kv_begin, last, tid, id_a);
    fetch_pages(table, r.kv_begin + 64, last, tid, id_b);
    for (int pair = 0; pair < r.n_pairs; ++pair) {
      const int kt = r.kv_begin + 128 * pair;
      const unsigned char *src[4], *rope[4];
      rows_of<kSplit>(kt, last, tid, id_a, src, rope);
      const Rows<kSplit> da = thread_rows<kSplit>(src, rope, tid);
      rows_of<kSplit>(kt + 64, last, tid, id_b, src, rope);
      const Rows<kSplit> db = thread_rows<kSplit>(src, rope, tid);
      if (pair + 1 < r.n_pairs) {  // in flight while waiting
        fetch_pages(table, kt + 128, last, tid, id_a);
        fetch_pages(table, kt + 192, last, tid, id_b);
      }
      const State sa = st;
      st.advance();
      const State sb = st;
      st.advance();
      unsigned char* stage_a = tiles.kv[0];
      unsigned char* stage_b = tiles.kv[1];
      // Acquires each half of the pair in release order and hands it to fill(stage, rows,
      // state, Half<c0, c1>).
      const auto in_release_order = [&](auto&& fill) {
        pipe.producer_acquire(sa, kLo);
        fill(stage_a, da, sa, Half<0, 4>{});
        pipe.producer_acquire(sa, kHi);
        fill(stage_a, da, sa, Half<4, 9>{});
        pipe.producer_acquire(sb, kHi);
        fill(stage_b, db, sb, Half<4, 9>{});
        pipe.producer_acquire(sb, kLo);
        fill(stage_b, db, sb, Half<0, 4>{});
      };
      if constexpr (Tr::kDirect) {
        in_release_order([&](unsigned char* stage, const auto& d, const State& hs, auto half) {
          load_direct<kSplit, decltype(half)::c0, decltype(half)::c1>(stage, d, pipe, hs, tid);
        });
      } else if (ctx.kv_bytes == 1) {
        pipe.producer_acquire(sa, kLo);
        copy_raw<kSplit, 0, 4>(stage_a, da, tid);
        pipe.producer_acquire(sa, kHi);
        copy_raw<kSplit, 4, 9>(stage_a, da, tid);
        Copy::template wait<1>();
        convert_fp8<0, 4>(stage_a, pipe, sa, tid);
        pipe.producer_acquire(sb, kHi);
        copy_raw<kSplit, 4, 9>(stage_b, db, tid);
        Copy::template wait<1>();
        convert_fp8<4, 9>(stage_a, pipe, sa, tid);
        pipe.producer_acquire(sb, kLo);
        copy_raw<kSplit, 0, 4>(stage_b, db, tid);
        Copy::template wait<1>();
        convert_fp8<4, 9>(stage_b, pipe, sb, tid);
        Copy::template wait<0>();
        convert_fp8<0, 4>(stage_b, pipe, sb, tid);
      } else {
        in_release_order([&](unsigned char* stage, const auto& d, const State& hs, auto half) {
          load_convert16<kSplit, decltype(half)::c0, decltype(half)::c1>(stage, d, pipe, hs, tid);
        });
      }
    }
  }

  // A thread's source addresses for the tile: its 16-byte column of each of its tokens, in
  // the latent row (all nine chunks of a joined cache; chunks 0-7 with a separate rotary
  // cache) and in the rotary row (kSplit: chunk 8). (Only the first tokens_per_thread() are
  // copied.)
  struct ThreadRows {
    const unsigned char* src[4];
  };
  struct SplitRows : ThreadRows {
    const unsigned char* rope[4];
  };
  template <bool kSplit>
  using Rows = std::conditional_t<kSplit, SplitRows, ThreadRows>;
  template <bool kSplit>
  __device__ Rows<kSplit> thread_rows(const unsigned char* const (&src)[4],
                                      const unsigned char* const (&rope)[4], int tid) const {
    const int col = (tid % (raw_fp8() ? 4 : 8)) * 16;
    Rows<kSplit> d;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      d.src[k] = src[k] + col;
      if constexpr (kSplit) d.rope[k] = rope[k] + col;
    }
    return d;
  }
  // This thread's source in chunk c (64 values) of token k: kSplit, the rotary row for
  // chunk 8.
  template <bool kSplit>
  __device__ static const unsigned char* chunk_src(const Rows<kSplit>& d, int k, int c,
                                                   int chunk_bytes) {
    if constexpr (kSplit)
      if (c == kLatentChunks) return d.rope[k];
    return d.src[k] + c * chunk_bytes;
  }

  // KV of the compute type, chunks [C0, C1): 8 threads per token (128 contiguous bytes per
  // copy instruction), 16 tokens per pass. A thread's tokens are r0 + 16 k, which share r0 & 7,
  // so its swizzled column is the same in every chunk and pass: each copy is one instruction
  // with constant offsets from two base addresses (the producer's instruction rate, not the
  // memory system, limited the ring when every copy recomputed its addresses). Each chunk's
  // barrier is arrived on by the copy unit once the chunk (and every earlier copy of this
  // thread) has landed.
  template <bool kSplit, int C0, int C1>
  __device__ void load_direct(unsigned char* stage, const Rows<kSplit>& d, const Pipeline& pipe,
                              const State& st, int tid) const {
    const int sub = tid % 8, r0 = tid / 8;
    const std::uint32_t dst = smem_u32(stage) + r0 * 128 + ((sub ^ (r0 & 7)) << 4);
#pragma unroll
    for (int c = C0; c < C1; ++c) {
#pragma unroll
      for (int k = 0; k < 4; ++k)
        Copy::copy16_evict_first(dst + c * kChunkBytes + k * 2048, chunk_src<kSplit>(d, k, c, 128),
                                 16u);
      pipe.producer_commit_cp_async(st, c);
    }
  }

  // fp8 KV, chunks [C0, C1): the raw bytes go to the top of the half's converted region
  // (4 threads per token, 64 contiguous bytes per copy instruction), laid out as
  // [chunk][token][64 B]; thread tid copies the 16 bytes at tid * 16 + 2048 pass of each raw
  // chunk, and later converts exactly those bytes.
  template <bool kSplit, int C0, int C1>
  __device__ void copy_raw(unsigned char* stage, const Rows<kSplit>& d, int tid) const {
    const std::uint32_t raw = smem_u32(stage) + kRawBase<C0, C1> + tid * 16;
#pragma unroll
    for (int pass = 0; pass < 2; ++pass) {
#pragma unroll
      for (int c = C0; c < C1; ++c)
        Copy::copy16_evict_first(raw + (c - C0) * 4096 + pass * 2048,
                                 chunk_src<kSplit>(d, pass, c, 64), 16u);
    }
    Copy::commit();
  }

  // In-place conversion of raw chunk c (its 16-bit values cover bytes [8 KB c, 8 KB (c + 1))
  // of the stage). Every thread converts the raw bytes it copied, so it may read them as soon
  // as its own copies landed; only writes that overlap raw bytes of other threads need the
  // warpgroup barrier. Raw chunk c sits at kRawBase + 4 KB (c - C0):
  //   lo half (chunks 0-3, raw at [16, 32) KB): 0, 1 overlap no raw; 2 overlaps raw 0, 1;
  //     3 overlaps raw 2, 3.  -> read 0, write 0, read 1, write 1, read 2 and 3, sync, write 2, 3
  //   hi half (chunks 4-8, raw at [52, 72) KB): 4, 5 overlap no raw; 6 overlaps raw 4; 7 raw 5,
  //     6; 8 raw 7, 8.  -> 4, 5 as above, read 6 and 7, sync, write 6, 7, read 8, sync, write 8
  // A write after a barrier may overlap only raw chunks every thread read before it. Neither
  // half's writes overlap the other half's raw bytes, which are in flight meanwhile.
  struct RawChunk {
    uint4 in[2];
  };
  template <int C0, int C1, int C>
  __device__ RawChunk read_raw(std::uint32_t raw) const {
    RawChunk r;
#pragma unroll
    for (int h = 0; h < 2; ++h) r.in[h] = arch::lds128(raw + (C - C0) * 4096 + h * 2048);
    return r;
  }
  template <int C>
  __device__ void write_converted(const RawChunk& r, std::uint32_t out_lo, std::uint32_t out_hi,
                                  const Pipeline& pipe, const State& st) const {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint4 lo, hi;
      if constexpr (Tr::kFp8Operands) {  // e4m3fn -> f16 through the hardware converter
        const std::uint32_t w[4] = {r.in[h].x, r.in[h].y, r.in[h].z, r.in[h].w};
        std::uint32_t o[8];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          arch::MmaAtom<T>::e4m3x4_to_f16x2x2(w[k], o[2 * k], o[2 * k + 1]);
        }
        lo = uint4{o[0], o[1], o[2], o[3]};
        hi = uint4{o[4], o[5], o[6], o[7]};
      } else {
        arch::convert_fp8x16<T>(ctx.kv, r.in[h], lo, hi);
      }
      arch::sts128(out_lo + C * kChunkBytes + h * 4096, lo);
      arch::sts128(out_hi + C * kChunkBytes + h * 4096, hi);
    }
    arch::fence_proxy_async_smem();
    pipe.producer_commit(st, C);
  }
  // The caller waited for this thread's raw copies of the half.
  template <int C0, int C1>
  __device__ void convert_fp8(unsigned char* stage, const Pipeline& pipe, const State& st,
                              int tid) const {
    const std::uint32_t base = smem_u32(stage);
    const std::uint32_t raw = base + kRawBase<C0, C1> + tid * 16;
    // This thread's tokens are tid / 4 + 32 h, its 16 values units 2 q and 2 q + 1 of a chunk.
    const int tok = tid / 4, q = tid % 4;
    const std::uint32_t out_lo = base + tok * 128 + (((2 * q) ^ (tok & 7)) << 4);
    const std::uint32_t out_hi = base + tok * 128 + (((2 * q + 1) ^ (tok & 7)) << 4);
    const auto sync = [] { arch::named_sync(arch::NamedBarrier::producer, kProducerThreads); };
    // The hardware e4m3fn path reads two chunks before a barrier; the others (software
    // decode, more registers) one, with one barrier more per half.
    constexpr bool kTwo = Tr::kFp8Operands;
    if constexpr (C0 == 0 && C1 == 4) {
      write_converted<0>(read_raw<C0, C1, 0>(raw), out_lo, out_hi, pipe, st);
      write_converted<1>(read_raw<C0, C1, 1>(raw), out_lo, out_hi, pipe, st);
      if constexpr (kTwo) {
        const RawChunk r2 = read_raw<C0, C1, 2>(raw), r3 = read_raw<C0, C1, 3>(raw);
        sync();
        write_converted<2>(r2, out_lo, out_hi, pipe, st);
        write_converted<3>(r3, out_lo, out_hi, pipe, st);
      } else {
        const RawChunk r2 = read_raw<C0, C1, 2>(raw);
        sync();
        write_converted<2>(r2, out_lo, out_hi, pipe, st);
        const RawChunk r3 = read_raw<C0, C1, 3>(raw);
        sync();
        write_converted<3>(r3, out_lo, out_hi, pipe, st);
      }
    } else {
      static_assert(C0 == 4 && C1 == 9, "the two halves of a tile");
      write_converted<4>(read_raw<C0, C1, 4>(raw), out_lo, out_hi, pipe, st);
      write_converted<5>(read_raw<C0, C1, 5>(raw), out_lo, out_hi, pipe, st);
      if constexpr (kTwo) {
        const RawChunk r6 = read_raw<C0, C1, 6>(raw), r7 = read_raw<C0, C1, 7>(raw);
        sync();
        write_converted<6>(r6, out_lo, out_hi, pipe, st);
        write_converted<7>(r7, out_lo, out_hi, pipe, st);
      } else {
        const RawChunk r6 = read_raw<C0, C1, 6>(raw);
        sync();
        write_converted<6>(r6, out_lo, out_hi, pipe, st);
        const RawChunk r7 = read_raw<C0, C1, 7>(raw);
        sync();
        write_converted<7>(r7, out_lo, out_hi, pipe, st);
      }
      const RawChunk r8 = read_raw<C0, C1, 8>(raw);
      sync();
      write_converted<8>(r8, out_lo, out_hi, pipe, st);
    }
  }
  static_assert(kRawBase<0, 4> == 16384 && kRawBase<4, 9> == 53248,
                "the conversion order above assumes these raw offsets");

  // 16-bit KV of the other type, chunks [C0, C1): load, convert, store, chunk by chunk.
  template <bool kSplit, int C0, int C1>
  __device__ void load_convert16(unsigned char* stage, const Rows<kSplit>& d, const Pipeline& pipe,
                                 const State& st, int tid) const {
#pragma unroll 1
    for (int c = C0; c < C1; ++c) {
      const int unit = 8 * c + tid % 8;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int tok = tid / 8 + 16 * k;
        // d.src[k] and d.rope[k] already point at this thread's 16-byte column.
        const uint4 raw = __ldg(reinterpret_cast<const uint4*>(chunk_src<kSplit>(d, k, c, 128)));
        *reinterpret_cast<uint4*>(stage + Tile::unit_offset(tok, unit)) =
            arch::convert_16x8<T>(ctx.kv, raw);
      }
      arch::fence_proxy_async_smem();
      pipe.producer_commit(st, c);
    }
  }

  // ---- consumer warpgroups -----------------------------------------------------------------

  // Q [64 x 576] into sQ (both consumer warpgroups).
  __device__ void load_q() const {
    unsigned char* q = tiles.q;
    if constexpr (Tr::kFp8Operands) {
      ctx.template load_q_scaled<kConsumerThreads>(
          [&](int r, int blk, const std::uint32_t(&w)[8]) {
            *reinterpret_cast<uint4*>(q + Tile::unit_offset(r, 2 * blk)) =
                uint4{w[0], w[1], w[2], w[3]};
            *reinterpret_cast<uint4*>(q + Tile::unit_offset(r, 2 * blk + 1)) =
                uint4{w[4], w[5], w[6], w[7]};
          },
          state.q_scale);
    } else {
      ctx.template copy_q_tile<kConsumerThreads, 64>(q);
      Copy::commit();
      Copy::template wait<0>();
    }
    arch::fence_proxy_async_smem();
  }

  // Q's rope columns (chunk 8 of sQ, columns 512..575) as the register A fragments of the
  // four k-steps of S's last chunk: rq[4 j .. 4 j + 3] is k-step j (the layout of pf). With
  // them in registers, chunk 8 of sQ is free to hold P of tile B (sp_b()).
  __device__ void load_q_rope(std::uint32_t (&rq)[16], int wi, int g, int t) const {
    const std::uint32_t q = smem_u32(tiles.q);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = 16 * wi + g + 8 * (i & 1), unit = 64 + 2 * j + (i >> 1);
        rq[4 * j + i] = arch::lds32(q + Tile::unit_offset(r, unit) + 4 * t);
      }
    }
  }
  // P of tile A (K-major [64 x 64], 128-byte swizzle) and of tile B (Q's chunk 8).
  __device__ std::uint32_t sp_a() const { return smem_u32(tiles.p); }
  __device__ std::uint32_t sp_b() const { return smem_u32(tiles.q) + 8 * kChunkBytes; }

  // Direct copies (cp.async, arrived on by the copy unit) are generic-proxy writes that no
  // writer fenced: a consumer fences them for its wgmma reads after the wait (or the named
  // barrier) that orders them before it. A converting producer fences its own stores before it
  // arrives (write_converted, load_convert16), so its consumers need no fence.
  __device__ static void fence_direct_copies() {
    if constexpr (Tr::kDirect) arch::fence_proxy_async_smem();
  }
  // Waits for chunk c of the stage of `st`, ready for wgmma reads.
  __device__ static void wait_chunk(const Pipeline& pipe, const State& st, int c) {
    pipe.consumer_wait_generic(st, c);
    fence_direct_copies();
  }

  // Issues chunks [C0, C1) of S = Q K^T (64 rows x 64 keys) for the tile of `st` as one
  // commit group, waiting for each 64-column chunk of K right before its four k-steps; chunk
  // 8 takes Q from registers. `init`: the first k-step overwrites s. `Stage`: the tile's stage,
  // 0 for A and 1 for B (every pair starts at an even position of the ring), a constant so
  // that the descriptors are formed in uniform registers.
  template <int C0, int C1, int Stage>
  __device__ void issue_s(float (&s)[32], const State& st, const std::uint32_t (&rq)[16],
                          bool init) const {
    const Pipeline pipe{state.bars};
    // Opaque here, so that the 32 loop-invariant descriptors of Q are formed at each use
    // instead of being hoisted out of the consumer loops (64 registers).
    std::uint32_t q_addr = smem_u32(tiles.q), kv_addr = smem_u32(tiles.kv[Stage]);
    asm volatile("" : "+r"(q_addr), "+r"(kv_addr));
    // Each descriptor one add to a base (WgmmaDescBase), not built again per wgmma.
    const arch::WgmmaDescBase dq = arch::WgmmaDescBase::make(q_addr, 16, 1024);
    const arch::WgmmaDescBase dk = arch::WgmmaDescBase::make(kv_addr, 16, 1024);
#pragma unroll
    for (int c = C0; c < C1; ++c) {
      wait_chunk(pipe, st, c);
      // After each chunk's wait (a loop: a branch between two k-steps of the chain): the
      // accumulator's registers are ordered for the next wgmma here, in the source, rather
      // than by a warpgroup.arrive ptxas would inject (C7519).
      arch::wgmma_fence();
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const std::uint32_t off = c * kChunkBytes + k * 32;
        const bool acc = !(init && c == C0 && k == 0);
        if (c == 8) {
          const std::uint32_t a[4] = {rq[4 * k], rq[4 * k + 1], rq[4 * k + 2], rq[4 * k + 3]};
          W::mma_rs_n64(s, a, dk.at(off), acc);
        } else {
          W::mma_ss_n64(s, dq.at(off), dk.at(off), acc);
        }
      }
    }
    arch::wgmma_commit();
  }

  // O[:, 256 wg ..] += P V for the tile of `st`, P from registers (this warpgroup's tile).
  __device__ static void issue_pv_regs(float (&o)[128], const std::uint32_t (&pf)[16],
                                       std::uint32_t kv_addr, int wg) {
    asm volatile("" : "+r"(kv_addr));  // descriptors formed here, not hoisted (registers)
    const arch::WgmmaDescBase dv =
        arch::WgmmaDescBase::make(kv_addr + 4 * wg * kChunkBytes, kChunkBytes, 1024);
    arch::wgmma_fence();
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const std::uint32_t a[4] = {pf[4 * j], pf[4 * j + 1], pf[4 * j + 2], pf[4 * j + 3]};
      W::mma_rs_n256_tb(o, a, dv.at(j * 2048), true);
    }
    arch::wgmma_commit();
  }
  // The same with P from shared memory at p_addr (the other warpgroup's tile).
  __device__ static void issue_pv_smem(float (&o)[128], std::uint32_t p_addr,
                                       std::uint32_t kv_addr, int wg) {
    asm volatile("" : "+r"(p_addr), "+r"(kv_addr));  // as in issue_pv_regs
    const arch::WgmmaDescBase dp = arch::WgmmaDescBase::make(p_addr, 16, 1024);
    const arch::WgmmaDescBase dv =
        arch::WgmmaDescBase::make(kv_addr + 4 * wg * kChunkBytes, kChunkBytes, 1024);
    arch::wgmma_fence();
#pragma unroll
    for (int j = 0; j < 4; ++j) W::mma_ss_n256_tb(o, dp.at(j * 32), dv.at(j * 2048), true);
    arch::wgmma_commit();
  }

  // Online softmax of one tile's scores. s[i]: row slot h = (i >> 1) & 1 (rows g, g + 8 of
  // the warp's 16), key 8 (i >> 2) + 2t + (i & 1). The new running max is
  // lazy_running_max(m_floor, tile max x sc), m_floor (>= m_run) being this warpgroup's running
  // max or the one the other warpgroup just published. Sets alpha = exp2(m_run - new max),
  // which rescales the earlier O and l, and returns whether it is not 1 for some row of the
  // thread (the max moved); masks s in place and writes P (compute type) to pf: pf[k] holds
  // keys of s[2k], s[2k + 1], which is the wgmma A fragment of k-step k / 4.
  // P = 2^(s sc - base) by one fma per score: the max is the rounded product max(s) x sc (sc >
  // 0, so it is the largest rounded product), from which the fma differs by at most half an
  // ulp of base, below 1 while |base| < kWideBase. A warp with a row at or beyond it (bf16 Q
  // rows far outside f16) rounds its products first and exponentiates them with factor 1.
  struct Softmax {
    float m_run[2], l_run[2], sc[2];
    int row_limit[2];
  };
  // op over the 16 values of row slot h (s[4 j + 2 h], s[4 j + 2 h + 1]) as a tree: depth 4,
  // not a chain of 16.
  template <class Op>
  __device__ static float row_tree(const float (&s)[32], int h, Op op) {
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = op(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]);
#pragma unroll
    for (int w = 4; w >= 1; w >>= 1)
#pragma unroll
      for (int j = 0; j < w; ++j) v[j] = op(v[j], v[j + w]);
    return v[0];
  }
  __device__ static bool softmax(float (&s)[32], int kt, bool need_mask, int t, Softmax& sm,
                                 const float (&m_floor)[2], float (&alpha)[2],
                                 std::uint32_t (&pf)[16]) {
    // One branch around the whole mask (taken in a piece's last tile or two): a test per
    // score would become selects that run in every tile.
    if (need_mask) {
      const int lim[2] = {sm.row_limit[0] - kt - 2 * t, sm.row_limit[1] - kt - 2 * t};
#pragma unroll
      for (int i = 0; i < 32; ++i)
        if (8 * (i >> 2) + (i & 1) >= lim[(i >> 1) & 1]) s[i] = neg_inf();
    }
    const auto max2 = [](float a, float b) { return fmaxf(a, b); };
    float mt[2] = {row_tree(s, 0, max2), row_tree(s, 1, max2)};
    float base[2];
    bool moved = false, wide = false;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mt[h] = fmaxf(mt[h], shfl_xor(mt[h], 1));
      mt[h] = fmaxf(mt[h], shfl_xor(mt[h], 2));
      const float m_new = lazy_running_max(m_floor[h], mt[h] * sm.sc[h]);
      base[h] = exp_base(m_new);
      alpha[h] = fast_exp2(sm.m_run[h] - base[h]);
      moved = moved || m_new != sm.m_run[h];
      wide = wide || !(fabsf(base[h]) < kWideBase);
      sm.m_run[h] = m_new;
    }
    float sc[2] = {sm.sc[0], sm.sc[1]};
    if (__any_sync(0xffffffffu, wide)) {
#pragma unroll
      for (int i = 0; i < 32; ++i) s[i] = __fmul_rn(s[i], sm.sc[(i >> 1) & 1]);
      sc[0] = sc[1] = 1.0f;
    }
#pragma unroll
    for (int i = 0; i < 32; ++i)
      s[i] = fast_exp2(fmaf(s[i], sc[(i >> 1) & 1], -base[(i >> 1) & 1]));
#pragma unroll
    for (int k = 0; k < 16; ++k) pf[k] = arch::pack2<T>(s[2 * k], s[2 * k + 1]);
    const auto add2 = [](float a, float b) { return a + b; };
#pragma unroll
    for (int h = 0; h < 2; ++h) sm.l_run[h] = fmaf(sm.l_run[h], alpha[h], row_tree(s, h, add2));
    return moved;
  }

  // Rescales to the running max published by the other warpgroup (m_other >= m_run); returns
  // whether it differs from m_run for some row of the thread (f != 1).
  __device__ static bool adopt_max(Softmax& sm, const float (&m_other)[2], float (&f)[2]) {
    bool moved = false;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      f[h] = fast_exp2(sm.m_run[h] - exp_base(m_other[h]));
      sm.l_run[h] *= f[h];
      moved = moved || m_other[h] != sm.m_run[h];
      sm.m_run[h] = m_other[h];
    }
    return moved;
  }

  __device__ static void scale_o(float (&o)[128], const float (&f)[2]) {
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] *= f[(i >> 1) & 1];
  }

  // P (registers) -> a K-major [64 x 64] tile with the 128-byte swizzle at shared address dst
  // (1024-byte aligned). pf[k] is the fragment of the 8 x 8 matrix of rows 16 wi + 8 (k & 1) ..
  // + 7, keys 8 (k >> 1) .. + 7, so stmatrix .x4 j stores pf[4 j .. 4 j + 3]: lane l addresses
  // row l & 7 of matrix l >> 3, i.e. row 16 wi + 8 ((l >> 3) & 1) + (l & 7), 16-byte unit
  // (2 j + (l >> 4)) ^ (l & 7) = 2 j ^ c with c = (l >> 4) ^ (l & 7): address a ^ 32 j.
  __device__ static void store_p(const std::uint32_t (&pf)[16], std::uint32_t dst, int wi) {
    const int l = lane_id(), r = l & 7;
    const std::uint32_t a = dst + (16 * wi + 8 * ((l >> 3) & 1) + r) * 128 + (((l >> 4) ^ r) << 4);
#pragma unroll
    for (int j = 0; j < 4; ++j)
      arch::stsm_x4(a ^ (32u * j), pf[4 * j], pf[4 * j + 1], pf[4 * j + 2], pf[4 * j + 3]);
  }

  __device__ void publish_max(int slot, int wi, int g, int t, const Softmax& sm) const {
    if (t == 0) {
      state.row_max[slot][16 * wi + g] = sm.m_run[0];
      state.row_max[slot][16 * wi + g + 8] = sm.m_run[1];
    }
  }
  __device__ void read_max(int slot, int wi, int g, float (&m)[2]) const {
    m[0] = state.row_max[slot][16 * wi + g];
    m[1] = state.row_max[slot][16 * wi + g + 8];
  }

  // The pair schedule is pictured in the header. One running max per row is shared: A's is
  // published by warpgroup 0 with P_A (max_a), the pair's (after B) by warpgroup 1 with P_B
  // (max_b). At the start of a pair both warpgroups hold their tile's S, and O and l of both
  // are relative to the max after the previous pair.

  // Warpgroup 0: S and softmax of tile A of every pair, P V of both tiles (columns 0..255).
  __device__ void consume_a(const Range& r, State& st, int mask_from, Softmax& sm, float (&o)[128],
                            const std::uint32_t (&rq)[16], int wi, int g, int t) const {
    const Pipeline pipe{state.bars};
    float s[32], f[2];
    std::uint32_t pf[16];
    issue_s<0, 9, 0>(s, st, rq, true);
    arch::wgmma_wait<0>();
    arch::fence_operand(s);
    for (int pair = 0; pair < r.n_pairs; ++pair) {
      const State st_a = st;
      st.advance();
      const State st_b = st;
      st.advance();
      const int kt_a = r.kv_begin + 128 * pair;
      const float m_floor[2] = {sm.m_run[0], sm.m_run[1]};
      const bool moved_a = softmax(s, kt_a, kt_a + 64 > mask_from, t, sm, m_floor, f, pf);
      publish_max(2 * (pair & 1), wi, g, t, sm);
      // Warpgroup 1's P V reading the previous sP_A retired before pa_read.
      store_p(pf, sp_a(), wi);
      arch::fence_proxy_async_smem();
      arch::named_arrive(arch::NamedBarrier::max_a, kConsumerThreads);  // m_A and sP_A
      if (moved_a) scale_o(o, f);
      issue_pv_regs(o, pf, smem_u32(tiles.kv[0]), 0);
      arch::wgmma_wait<0>();
      arch::fence_operand(o);  // (s is dead here: fencing it would keep 32 registers live)
      arch::fence_operand(pf);
      pipe.consumer_release(st_a, kLo);  // S_A and this P V were the only reads of A-lo
      arch::named_sync(arch::NamedBarrier::max_b, kConsumerThreads);
      float mb[2];
      read_max(2 * (pair & 1) + 1, wi, g, mb);
      if (adopt_max(sm, mb, f)) scale_o(o, f);
      // sP_B was written before max_b; B-lo was waited for by warpgroup 1.
      fence_direct_copies();
      issue_pv_smem(o, sp_b(), smem_u32(tiles.kv[1]), 0);
      // The next S_A's first half queues behind this P V; B-lo is released when the P V
      // retires. No register of s, o or pf is touched between the waits.
      const bool more = pair + 1 < r.n_pairs;
      if (more) {
        issue_s<0, 4, 0>(s, st, rq, true);
        arch::wgmma_wait<1>();
      } else {
        arch::wgmma_wait<0>();
      }
      arch::fence_operand(o);
      pipe.consumer_release(st_b, kLo);
      if (more) issue_s<4, 9, 0>(s, st, rq, false);
      arch::wgmma_wait<0>();
      arch::fence_operand(s);
      arch::fence_operand(o);
      // Warpgroup 1's P V reading sP_A retired: the next P_A may be stored.
      arch::named_sync(arch::NamedBarrier::pa_read, kConsumerThreads);
    }
  }

  // Warpgroup 1: S and softmax of tile B of every pair, P V of both tiles (columns 256..511).
  // Its S reads chunks 4-8 first: the producer refills a B stage's hi half before its lo half,
  // in the order the two halves are released.
  __device__ void consume_b(const Range& r, State& st, int mask_from, Softmax& sm, float (&o)[128],
                            const std::uint32_t (&rq)[16], int wi, int g, int t) const {
    const Pipeline pipe{state.bars};
    float s[32], f[2];
    std::uint32_t pf[16];
    for (int pair = 0; pair < r.n_pairs; ++pair) {
      const State st_a = st;
      st.advance();
      const State st_b = st;
      st.advance();
      // Issued right after the previous pair's P V retired (nothing runs in between), from
      // one call site: a second copy of its 36 wgmma cost instruction-cache misses.
      issue_s<4, 9, 1>(s, st_b, rq, true);
      issue_s<0, 4, 1>(s, st_b, rq, false);
      arch::wgmma_wait<0>();
      arch::fence_operand(s);
      const int kt_b = r.kv_begin + 128 * pair + 64;
      arch::named_sync(arch::NamedBarrier::max_a, kConsumerThreads);
      float ma[2];
      read_max(2 * (pair & 1), wi, g, ma);
      // O and l to A's max, to which P_A is relative (f is 1 unless the max moved).
      if (adopt_max(sm, ma, f)) scale_o(o, f);
      // sP_A was written before max_a; A-hi was waited for by warpgroup 0.
      fence_direct_copies();
      issue_pv_smem(o, sp_a(), smem_u32(tiles.kv[0]), 1);
      // B's softmax runs while both warpgroups' P V of A are in flight; it touches no register
      // of o.
      const bool moved = softmax(s, kt_b, kt_b + 64 > mask_from, t, sm, ma, f, pf);
      publish_max(2 * (pair & 1) + 1, wi, g, t, sm);
      // Warpgroup 0's P V reading the previous sP_B retired before it published max_a.
      store_p(pf, sp_b(), wi);
      arch::fence_proxy_async_smem();
      arch::named_arrive(arch::NamedBarrier::max_b, kConsumerThreads);  // m_B and sP_B
      arch::wgmma_wait<0>();
      arch::fence_operand(o);
      pipe.consumer_release(st_a, kHi);  // warpgroup 0's S_A read A-hi before max_a
      arch::named_arrive(arch::NamedBarrier::pa_read, kConsumerThreads);
      if (moved) scale_o(o, f);
      issue_pv_regs(o, pf, smem_u32(tiles.kv[1]), 1);
      arch::wgmma_wait<0>();
      arch::fence_operand(o);
      arch::fence_operand(pf);
      pipe.consumer_release(st_b, kHi);  // S_B and P V of B were the reads of B-hi
    }
  }

  __device__ void consume(const RequestPlan& rq, const Piece& pc, const Range& r, State& st) {
    const int lane = lane_id(), warp = warp_id();
    const int wg = warp / 4, wi = warp % 4;
    const int g = lane >> 2, t = lane & 3;
    const int L = rq.kv_len;
    const int vis_first = visible_keys(L, ctx.q_len, ctx.row0 / ctx.heads, ctx.causal);
    const int mask_from = r.kv_end < vis_first ? r.kv_end : vis_first;

    Softmax sm;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      sm.m_run[h] = neg_inf();
      sm.l_run[h] = 0.0f;
      sm.sc[h] = fmaxf(ctx.p.scale_log2, kMinRowScale);  // > 0: masked scores stay -inf
      const int row = ctx.row0 + 16 * wi + g + 8 * h;
      const int v = visible_keys(L, ctx.q_len, row / ctx.heads, ctx.causal);
      sm.row_limit[h] = v < r.kv_end ? v : r.kv_end;
    }
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;

    if (r.n_pairs > 0) {
      load_q();
      arch::named_sync(arch::NamedBarrier::consumers, kConsumerThreads);  // sQ complete
      if constexpr (Tr::kFp8Operands) {
#pragma unroll
        for (int h = 0; h < 2; ++h)
          sm.sc[h] = fmaxf(sm.sc[h] * state.q_scale[16 * wi + g + 8 * h], kMinRowScale);
      }
      std::uint32_t rq[16];
      load_q_rope(rq, wi, g, t);
      // One loop per warpgroup: ptxas analyses wgmma hazards on the control-flow graph, and
      // a shared loop body would merge warpgroup 0's in-flight P V with warpgroup 1's
      // rescale of O, serialising every wgmma.
      if (wg == 0)
        consume_a(r, st, mask_from, sm, o, rq, wi, g, t);
      else
        consume_b(r, st, mask_from, sm, o, rq, wi, g, t);
    }
    epilogue(pc, sm, o, wg, wi, g, t);
  }

  __device__ void epilogue(const Piece& pc, const Softmax& sm, const float (&o)[128], int wg,
                           int wi, int g, int t) const {
    float inv[2], lse[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = sm.l_run[h];
      l += shfl_xor(l, 1);
      l += shfl_xor(l, 2);
      if (t == 0) state.row_sum[wg][16 * wi + g + 8 * h] = l;
    }
    arch::named_sync(arch::NamedBarrier::consumers, kConsumerThreads);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = 16 * wi + g + 8 * h;
      const float l = state.row_sum[0][r] + state.row_sum[1][r];
      inv[h] = l > 0.0f ? ctx.p.out_scale / l : 0.0f;
      lse[h] = lse_from_state(sm.m_run[h], l);
    }
    const bool split = pc.partial_slot >= 0;
    Tq* dst[2];  // the thread's two rows' destinations (partial slot or output), or null
#pragma unroll
    for (int h = 0; h < 2; ++h) dst[h] = ctx.o_row(pc, ctx.row0 + 16 * wi + g + 8 * h);
#pragma unroll
    for (int i = 0; i < 128; i += 2) {
      const int h = (i >> 1) & 1;
      if (dst[h] == nullptr) continue;
      const int col = 256 * wg + 8 * (i >> 2) + 2 * t;
      const float v0 = o[i] * inv[h], v1 = o[i + 1] * inv[h];
      *reinterpret_cast<std::uint32_t*>(dst[h] + col) = arch::pack2<Tq>(v0, v1);
    }
    if (wg == 0 && t == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = ctx.row0 + 16 * wi + g + 8 * h;
        if (row >= ctx.rows) continue;
        ctx.store_lse(pc, split, row, lse[h]);
      }
    }
    // sQ, sP and row_sum are rewritten by the next piece only after every consumer is here.
    arch::named_sync(arch::NamedBarrier::consumers, kConsumerThreads);
  }
};

// The split-O kernel: the 64-row warp-specialized mainloop, whose two consumer warpgroups
// each compute half of O's 512 columns (warpgroup w: 256w .. 256w + 255). Same grid, plan
// and workspace as decode_kernel<Tr>; 384 threads, one CTA per SM.
template <class Tr>
__global__ void __launch_bounds__(384, 1) decode_kernel_split_o(const KernelArgs p) {
#if defined(MLAKIT_WGMMA_ENABLED)
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ SplitOStaticStorage state;
  SplitOSharedStorage& tiles = *reinterpret_cast<SplitOSharedStorage*>(smem);
  using ML = SplitOMainloop<Tr>;
  const int row_tile = static_cast<int>(blockIdx.x);
  const int cta = cta_slot(static_cast<int>(blockIdx.y), static_cast<int>(gridDim.y));
  const CtaPlan cp = p.ws.ctas[cta];
  const int per_cta = p.ws.header[1];
  // The context spelled out, not PieceContext::of_tile(p, row_tile): through of_tile the
  // sm_90a code of 4 of the dispatch table's 12 instances of this kernel differs (kv_any_t KV,
  // bf16 and fp16 Q: 8 instructions more; e4m3fn KV with the shape read at run time, bf16
  // and fp16 Q: as many instructions, another order and allocation). The other 8 (KV of the
  // Q type; e4m3fn KV at 16 heads x q_len 4 and 8) are identical either way.
  PieceContext<Tr> ctx{p, 0, row_tile, Tr::heads(p.a), Tr::q_len(p.a), 0, 0, Tr::causal(p.a),
                       Tr::kv_dtype(p.a), 0};
  ctx.rows = ctx.heads * ctx.q_len;
  ctx.row0 = row_tile * Tr::kRows;
  ctx.kv_bytes = static_cast<int>(dtype_bytes(ctx.kv));
  if (ctx.row0 >= ctx.rows) return;
  if (threadIdx.x == 0) {
    // Arrivals that release each stage half (see the header comment): stage 0 holds tile A,
    // stage 1 tile B.
    constexpr int kW = ML::kConsumerThreads / 2 / 32;  // the warps of one warpgroup
    constexpr int kReleasers[2][2] = {{kW, kW}, {kW, kW}};
    ML::Pipeline::init(state.bars, kReleasers);
    arch::mbar_init_fence();
  }
  __syncthreads();
  ML mainloop{ctx, tiles, state};
  typename ML::State st;
  if (threadIdx.x >= ML::kConsumerThreads) {
    arch::setmaxnreg_dec<ML::kProducerRegs>();
    for (int b = cp.req_begin; b <= cp.req_end; ++b) {
      ctx.b = b;
      const RequestPlan rq = p.ws.requests[b];
      mainloop.produce(mainloop.range(rq, piece_of(p.shape, rq, cta, per_cta)), st);
    }
  } else {
    arch::setmaxnreg_inc<ML::kConsumerRegs>();
    for (int b = cp.req_begin; b <= cp.req_end; ++b) {
      ctx.b = b;
      const RequestPlan rq = p.ws.requests[b];
      const Piece pc = piece_of(p.shape, rq, cta, per_cta);
      mainloop.consume(rq, pc, mainloop.range(rq, pc), st);
    }
  }
#else
  (void)p;
#endif
}

}  // namespace mlakit::detail

#endif  // MLAKIT_HAS_SM90A_KERNELS
