#pragma once
// Hopper keys-as-M mainloop (sm_90a device code only; on other targets, and for other KV
// types, the host launches the policy's other mainloop): the 16-, 32- and 64-row policies for
// e4m3fn KV (KtConfig<Rows>) and the 16- and 32-row policies for KV of the Q type
// (KtConfig<Rows, 2>). docs/design.md, "Hopper mainloops", has each form's schedule.
//
// wgmma's M is 64, and a tile of up to 16 rows padded to 64 would waste three quarters of the
// matrix work. Here the keys are M and the rows are N (16, 32 or 64):
//   S^T [64 keys x N rows]  = K [64 x 576] . Q^T [576 x N]      (36 k-steps of m64nNk16)
//   O^T [512 dims x N rows] += V^T [512 x 64] . P^T [64 x N]     (8 dim blocks x 4 k-steps)
// e4m3fn KV: the KV tile is the A operand of both products, read from the raw tile by ldmatrix
// and widened to f16 in registers (cvt.rn.f16x2.e4m3x2), so the ring holds raw bytes only and
// no wgmma reads a stage: a stage is released after its last ldmatrix, and the consumers wait
// for it without the async-proxy fence (consumer_wait_generic). Q (f16, a power-of-two scale
// per row) and P are the B operands in shared memory (128-byte swizzle, K-major).
//   16 rows: one consumer warpgroup and one producer warp (160 threads), two raw stages, two
//     CTAs per SM (168 registers: a scheduler holding three of the ten warps has 16384). Each
//     tile's matrix work retires before the next tile's starts; the two CTAs of an SM overlap.
//   32 rows: O^T takes 128 registers per thread, so one CTA per SM of 384 threads: consumer
//     warpgroups 0 and 1 take alternate tiles (each with its own P buffer, row-maxima slots and
//     named barriers; their states are merged through the Q region at the end of a piece,
//     merge()), and a producer warpgroup of four copying warps fills four raw stages.
//   64 rows: the two consumer warpgroups split the dims (O^T of 256 dims, 128 registers each)
//     and take pairs of tiles: warpgroup w computes S^T of tile 2 j + w, the pair's row maxima
//     meet in shared memory (atomicMax, NamedBarrier::tile_max), each stores its P, and after
//     NamedBarrier::tile_p each multiplies both tiles' P by its half of V. Three raw stages; an
//     odd tile count is padded with a masked tile of zeros (consume_pairs()).
//   P is stored with stmatrix.trans, and the next batch's ldmatrix is issued before the current
//   batch is converted.
// Fragment orders (the A operand of m64nNk16, warp wi holds M rows 16 wi + g, + 8):
//   K: one 32-bit ldmatrix register of key g holds dims 4t..4t+3 of a 16-dim block, so the
//     k index 2t + i is dim 4t + i and 2t + 8 + i is dim 4t + 2 + i; Q is stored with the same
//     permutation (the one of the mma.sync e4m3 path).
//   V^T: the transposing ldmatrix gives lane (g, t) byte pairs (token 2t | 2t + 1) x (dim 2g,
//     2g + 1), so M row g of a 16-dim block is dim 2g and M row g + 8 is dim 2g + 1; the
//     epilogue writes each row's two adjacent dims together.
// 16-bit KV of the Q type: nothing is converted, so both products read the tile in shared
//   memory (wgmma SS): it lands as nine 64-dim chunks [64 tokens x 128 B] (128-byte swizzle),
//   read K-major for S^T (B = Q, natural dim order) and MN-major for O^T (transposed A; B = P^T
//   in the Q type; M row g of O^T is dim g). A tile is 72 KB, so one CTA per SM, and the ring
//   holds chunks, not tiles: tile i takes ring positions 9 i .. 9 i + 8 (modulo the slot count:
//   25 for 16 rows, 22 for 32, all the shared memory beside Q and P). S^T waits for the chunks
//   one by one (with the async-proxy fence: wgmma reads them); the rope chunk is released after
//   S^T and V chunk mb after the P V of its dims retired. 16 rows: two consumer warpgroups on
//   alternate tiles and a producer that acquires a tile's nine slots, then copies each token
//   row whole; 32 rows: one consumer warpgroup and a producer copying chunk by chunk as slots
//   are released (docs/design.md says why each).
#include <cstdint>

#include "../arch/convert.hpp"
#include "../arch/copy_atom.hpp"
#include "../arch/mma_atom.hpp"
#include "../arch/pipeline_sm90.hpp"
#include "../arch/tile_policy.hpp"
#include "../arch/wgmma_sm90.hpp"
#include "../core/attention_math.hpp"
#include "../core/plan.hpp"
#include "../platform/intrinsics.hpp"
#include "decode_kernel.hpp"
#include "planner_kernel.hpp"
#include "smem_tile.hpp"
#include "workspace.hpp"

#if defined(MLAKIT_PLATFORM_CUDA)

namespace mlakit::detail {

// The shape of the kernel per tile size. 16 rows: one consumer warpgroup and one producer warp
// (160 threads), two raw stages, two CTAs per SM (168 registers: a scheduler that holds three
// of the ten warps has 16384). 32 rows: O^T alone takes 128 accumulator registers per thread,
// so one CTA per SM holds two consumer warpgroups that take alternate tiles (their states are
// merged at the end of a piece) and a producer warpgroup (384 threads, setmaxnreg hands the
// consumers 232 registers), four raw stages.
template <int Rows, int KvBytes = 1>
struct KtConfig;
template <>
struct KtConfig<16> {
  static constexpr int kWarpgroups = 1, kProducerWarps = 1, kStages = 2;
  static constexpr int kConsumerRegs = 0, kProducerRegs = 0;  // no hand-over
  static constexpr bool kSplitDims = false;
  static constexpr int kChunksPerTile = 1;  // a stage holds a whole tile
  // Below kFp8CtasMinRowTiles requests x row tiles, in automatic mode: this kernel, planning
  // for itself, rather than the self-planned mma.sync kernel: it gains on long requests more
  // than it loses on short ones (docs/performance.md, "Constants").
  static constexpr bool kSelfPlanSmall = true;
};
template <>
struct KtConfig<32> {
  static constexpr int kWarpgroups = 2, kProducerWarps = 4, kStages = 4;
  static constexpr int kConsumerRegs = 232, kProducerRegs = 40;
  static constexpr bool kSplitDims = false;
  static constexpr int kChunksPerTile = 1;  // a stage holds a whole tile
  // Not below kFp8CtasMinRowTiles: there it loses on short requests more than it gains on long
  // ones, which the host cannot tell apart; the mma.sync kernel keeps them (docs/performance.md).
  static constexpr bool kSelfPlanSmall = false;
};
// 64 rows: O^T of all 512 dims would take 256 registers per thread, so the two consumer
// warpgroups split the dims (warpgroup w accumulates dims [256 w, 256 w + 256)) and work on
// pairs of tiles: warpgroup w computes S^T of tile 2 j + w, both agree on the pair's row
// maxima, and each multiplies both tiles' P by its half of V. Q (72 KB) leaves room for three
// raw stages.
template <>
struct KtConfig<64> {
  static constexpr int kWarpgroups = 2, kProducerWarps = 4, kStages = 3;
  static constexpr int kConsumerRegs = 240, kProducerRegs = 24;
  static constexpr bool kSplitDims = true;
  static constexpr int kChunksPerTile = 1;  // a stage holds a whole tile
  // Not below kFp8CtasMinRowTiles: slower than the warp-specialized kernel there except on
  // long requests (docs/performance.md).
  static constexpr bool kSelfPlanSmall = false;
};

// 16-bit KV of the Q type (16 and 32 rows): a 64-token tile is 72 KB, so one CTA per SM, one
// consumer warpgroup (O^T of 32 rows is 128 registers per thread, within the 255 of a 256-thread
// CTA) and a producer warpgroup (18 copies of 16 bytes per lane and token). The ring is one of
// 64-dim chunks [64 tokens x 128 B], not of tiles: tile i takes chunk slots 9 i .. 9 i + 8
// (mod kStages), so every slot left beside Q and P holds KV in flight (16 rows 25 slots, 2.8
// tiles; 32 rows 22, 2.4 tiles; a ring of whole tiles has two). S^T starts on chunk 0 before
// the last one lands; the rope chunk is refilled once S^T retired and V chunk mb once the P V
// of its dims retired.
template <int Rows>
struct KtConfig<Rows, 2> {
  static_assert(Rows == 16 || Rows == 32, "16 or 32 rows of 16-bit KV");
  static constexpr int kWarpgroups = Rows == 16 ? 2 : 1, kProducerWarps = 4;
  static constexpr int kStages = Rows == 16 ? 25 : 22;  // chunk slots
  static constexpr int kConsumerRegs = Rows == 16 ? 232 : 0, kProducerRegs = Rows == 16 ? 40 : 0;
  static constexpr bool kRowCopies = Rows == 16;
  static constexpr bool kSplitDims = false;
  static constexpr int kChunksPerTile = 9;  // ring positions a tile takes
  static constexpr bool kSelfPlanSmall = false;
};

// Dynamic shared memory of the keys-as-M mainloop (e4m3fn KV: 16 rows 94 KB, two CTAs per SM;
// 32 rows 188 KB; 64 rows 196 KB. 16-bit KV: 16 rows 222 KB, 32 rows 216 KB).
template <int Rows, int KvBytes = 1>
struct KtSharedStorage {
  static constexpr int kStages = KtConfig<Rows, KvBytes>::kStages;
  // e4m3fn: a tile, raw [64 tokens x 576 B], row-major; 16-bit: one 64-dim chunk [64 tokens x
  // 128 B] with the 128-byte swizzle (the wgmma operand layout of Swizzle128Tile<64>)
  static constexpr int kStageBytes =
      64 * kHeadDimQK * KvBytes / KtConfig<Rows, KvBytes>::kChunksPerTile;
  // Q [Rows x 576] f16; after a piece's last tile, the exchange buffer of the two warpgroups'
  // states (32 rows).
  alignas(1024) unsigned char q[9 * Swizzle128Tile<Rows>::kChunkBytes];
  // P [Rows x 64 keys] f16 of each consumer warpgroup.
  alignas(1024) unsigned char p[KtConfig<Rows, KvBytes>::kWarpgroups]
                               [Swizzle128Tile<Rows>::kChunkBytes];
  alignas(KvBytes == 2 ? 1024 : 128) unsigned char kv[kStages][kStageBytes];
};
// Static shared memory: only sm_90a code of the kernel declares it (keys_as_m_usable() in
// api/decode.hpp tells the loaded code by its size; 1024-aligned, as the dynamic part that
// follows it, so that the size the runtime reports is sizeof).
template <int Rows, int KvBytes = 1>
struct alignas(1024) KtStaticStorage {
  using C = KtConfig<Rows, KvBytes>;
  // Every stage (a tile, or a chunk of one) lands and is released whole.
  using Pipeline = arch::RingPipeline<C::kStages, 1, 1, 32 * C::kProducerWarps>;
  float tile_max[2][C::kWarpgroups][4][Rows];  // [tile parity][warpgroup][warp][row] (64 rows:
                                               // unused, pair_max instead)
  float row_sum[C::kWarpgroups][4][Rows];      // epilogue: l of each warp's keys
  float q_scale[Rows];                         // scale_log2 x 2^-e of each Q row
  int row_limit[C::kSplitDims ? Rows : 1];     // 64 rows: keys visible to each row (piece)
  // 64 rows (read as row pairs): running max [pair parity][row]; max of a pair (ordered int)
  // [parity][row]
  alignas(8) float m_run[2][C::kSplitDims ? Rows : 1];
  alignas(8) int pair_max[2][C::kSplitDims ? Rows : 1];
  // 64 rows: per consumer warp and lane, the exponent bases and alphas of the lane's two rows
  // n = 8 g + 2 t and n + 1, as (base n, base n + 1, alpha n, alpha n + 1)
  float4 row_exp[C::kSplitDims ? 8 : 1][C::kSplitDims ? 32 : 1];
  // 32 rows: per consumer warp and lane, the exponent base and alpha of its owned row
  float2 row_exp32[Rows == 32 ? 2 : 1][Rows == 32 ? 4 : 1][Rows == 32 ? 32 : 1];
  typename Pipeline::Storage bars;
};

template <class Tr>
struct KtMainloop {
  using Tq = typename Tr::Tq;
  // e4m3fn KV: A fragments widened to f16 in registers; 16-bit KV (of the Q type): both
  // operands from shared memory, in the Q type.
  static constexpr bool kKv16 = !Tr::kFp8Operands;
  static constexpr int kKvBytes = kKv16 ? 2 : 1;
  using Tc = std::conditional_t<kKv16, Tq, fp16_t>;  // wgmma operand type (Q, P)
  using W = arch::Wgmma<Tc>;
  using Atom = typename Tr::Atom;  // e4m3fn: arch::MmaAtom<fp16_t>, ldmatrix and the widening
  using Copy = typename Tr::Copy;
  static constexpr int kRows = Tr::kRows;
  using Cfg = KtConfig<kRows, kKvBytes>;
  using SharedStorage = KtSharedStorage<kRows, kKvBytes>;
  using StaticStorage = KtStaticStorage<kRows, kKvBytes>;
  using QTile = Swizzle128Tile<kRows>;
  using Pipeline = typename StaticStorage::Pipeline;
  using State = arch::PipelineState<SharedStorage::kStages>;
  static constexpr int kWg = Cfg::kWarpgroups;
  static constexpr int kConsumerThreads = 128 * kWg;
  static constexpr int kProducerThreads = 32 * Cfg::kProducerWarps;
  static constexpr int kThreads = kConsumerThreads + kProducerThreads;
  static constexpr int kCtasPerSm = arch::keys_as_m_ctas_per_sm(kRows, kKvBytes);
  static constexpr int kTok = 8 / Cfg::kProducerWarps;  // tokens per producer lane and tile
  static constexpr int kQ = kRows / 4;  // rows per thread in an m64 x kRows accumulator
  static constexpr int kS = kRows / 2;  // registers per thread of an m64 x kRows accumulator
  static constexpr bool kSplitDims = Cfg::kSplitDims;
  static constexpr int kMbOwn = kSplitDims ? 4 : 8;  // 64-dim blocks of O^T a warpgroup holds
  static_assert(((kRows == 16 || kRows == 32 || kRows == 64) && Tr::kFp8Operands) ||
                    ((kRows == 16 || kRows == 32) && Tr::kDirect),
                "16, 32 or 64 rows of e4m3fn KV, or 16 or 32 rows of KV of the Q type");
  // Dynamic shared memory of the kernel that uses the planner's plan, and of the one that
  // plans for itself (the plan follows the mainloop's bytes).
  static constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage));
  static constexpr int kSelfPlanSmemBytes = kSmemBytes + kSelfPlanBytes;
  static constexpr int kCtaBytes =  // per CTA: both parts, the planner's if any, the 1 KB reserve
      kSmemBytes + (Cfg::kSelfPlanSmall ? kSelfPlanBytes + kSelfPlanStaticSlack : 0) +
      static_cast<int>(sizeof(StaticStorage)) + 1024;
  static_assert(kCtasPerSm * kCtaBytes <= 233472, "the CTAs fit the 228 KB of an sm_90 SM");
  static_assert(kCtaBytes - 1024 <= 232448, "a CTA's shared memory fits the 227 KB of a block");
  static_assert(Cfg::kConsumerRegs == 0 ||
                    kConsumerThreads * Cfg::kConsumerRegs + kProducerThreads * Cfg::kProducerRegs <=
                        kThreads * (65536 / kThreads / 8 * 8),
                "the register split exceeds the CTA's allocation");
  // The merge of two warpgroups' states: two buffers of one m64 x kRows accumulator per thread
  // and warpgroup fit the Q region.
  static_assert(kWg == 1 || kSplitDims || 2 * kWg * kS * 128 * 4 <= int(sizeof(SharedStorage::q)),
                "the exchange buffers fit the Q region");

  DecodeMainloop<Tr>& m;
  SharedStorage& ss;
  StaticStorage& sv;

  struct Range {
    int kv_begin, kv_end;  // tokens [kv_begin, kv_end) the piece reads (after causal clip)
    int n_tiles;           // 64-token tiles (64 rows: an even count, the last one may be
                           // past kv_end, copied as zeros and masked)
  };
  __device__ Range range(const RequestPlan& rq, const Piece& pc) const {
    const int last_row = (m.row0 + kRows < m.rows ? m.row0 + kRows : m.rows) - 1;
    const int vis_last = visible_keys(rq.kv_len, m.q_len, last_row / m.heads, m.causal);
    Range r;
    r.kv_begin = pc.kv_begin;
    r.kv_end = pc.kv_end < vis_last ? pc.kv_end : vis_last;
    r.n_tiles = r.kv_end > r.kv_begin ? (r.kv_end - r.kv_begin + 63) / 64 : 0;
    if (kSplitDims) r.n_tiles += r.n_tiles & 1;  // whole pairs: no wgmma under a branch
    return r;
  }

  __device__ static void mma(float (&d)[kS], const std::uint32_t (&a)[4], std::uint64_t desc_b,
                             bool accumulate) {
    if constexpr (kRows == 16)
      W::mma_rs_n16(d, a, desc_b, accumulate);
    else if constexpr (kRows == 32)
      W::mma_rs_n32(d, a, desc_b, accumulate);
    else
      W::mma_rs_n64(d, a, desc_b, accumulate);
  }
  // The consumers' barrier at the end of a piece. With two warpgroups, each runs its own copy
  // of merge<Wg>() and epilogue<Wg>(), so they reach it at different instructions.
  __device__ static void consumers_sync() {
    if constexpr (kWg == 1)
      arch::named_sync(arch::NamedBarrier::consumers, kConsumerThreads);
    else
      arch::named_sync_unaligned(arch::NamedBarrier::consumers, kConsumerThreads);
  }
  __device__ static arch::NamedBarrier tile_max_bar(int w) {
    return w == 0 ? arch::NamedBarrier::tile_max : arch::NamedBarrier::tile_max_1;
  }
  __device__ static arch::NamedBarrier tile_p_bar(int w) {
    return w == 0 ? arch::NamedBarrier::tile_p : arch::NamedBarrier::tile_p_1;
  }

  // ---- producer warps ----------------------------------------------------------------------
  // Producer thread l (of 32 x kProducerWarps) copies tokens l / 4 + 8 kProducerWarps k
  // (k < kTok), 16 bytes at 16 (l % 4) + 64 c of each row (c < kCopies). The tokens share
  // (token >> 1) & 3 and token & 7, hence the swizzled column, so every copy is one
  // instruction at constant offsets from a per-thread shared base (16-bit KV: two, for the
  // even and odd c) and a per-token source.
  static constexpr int kCopies = kHeadDimQK * kKvBytes / 64;
  static constexpr int kTokStride = 8 * Cfg::kProducerWarps;
  __device__ void fetch_pages(const std::int32_t* table, int kt, int last, int pl,
                              int (&id)[kTok]) const {
#pragma unroll
    for (int k = 0; k < kTok; ++k) {
      const int j = min(kt + pl / 4 + kTokStride * k, last);
      id[k] = __ldg(table + j / m.p.a.page_size);
    }
  }
  __device__ void produce(const Range& r, State& st) const {
    if (r.n_tiles == 0) return;
    const Pipeline pipe{sv.bars};
    const int pl = static_cast<int>(threadIdx.x) - kConsumerThreads;
    const int sub = pl & 3, r0 = pl >> 2;
    const std::int32_t* table = m.page_table();
    const int last = r.kv_end - 1;
    // e4m3fn: row r0 of 576 B, unit swizzle (r0 >> 1) & 3. 16-bit: unit u = sub + 4 c of the
    // 72 lies in chunk c >> 1 at position (sub + 4 (c & 1)) ^ (r0 & 7).
    const std::uint32_t dst0 = kKv16 ? r0 * 128 + ((sub ^ (r0 & 7)) << 4)
                                     : r0 * kHeadDimQK + ((sub ^ ((r0 >> 1) & 3)) << 4);
    const std::uint32_t dst1 = r0 * 128 + (((sub | 4) ^ (r0 & 7)) << 4);  // 16-bit, odd c
    int id[kTok];
    fetch_pages(table, r.kv_begin, last, pl, id);
    for (int i = 0; i < r.n_tiles; ++i) {
      const int kt = r.kv_begin + 64 * i;
      const unsigned char* src[kTok];
      std::uint32_t bytes[kTok];
#pragma unroll
      for (int k = 0; k < kTok; ++k) {
        const int j = kt + r0 + kTokStride * k;
        const bool valid = j < r.kv_end;
        src[k] = (valid ? m.page_row(id[k], j % m.p.a.page_size)
                        : static_cast<const unsigned char*>(m.p.a.kv)) +
                 16 * sub;
        bytes[k] = valid ? 16u : 0u;
      }
      if (i + 1 < r.n_tiles) fetch_pages(table, kt + 64, last, pl, id);  // in flight
      if constexpr (kKv16) {
        // 16-bit KV: chunk c (copies 2 c and 2 c + 1 of each token) goes to ring position c
        // after st, as soon as that slot is released.
        const std::uint32_t ring = smem_u32(ss.kv[0]);
        const auto acquire = [&](int c) {  // the slot of chunk c, once released; its address
          const State sc = st.at(c);
          pipe.producer_acquire(sc, 0);
          return ring + sc.stage() * SharedStorage::kStageBytes;
        };
        const auto copy_chunk = [&](std::uint32_t slot, int c, int k) {  // chunk c of token k
#pragma unroll
          for (int e = 0; e < 2; ++e)
            Copy::copy16(slot + (e ? dst1 : dst0) + k * kTokStride * 128,
                         src[k] + 64 * (2 * c + e), bytes[k]);
        };
        if constexpr (Cfg::kRowCopies) {
          // All nine slots first, then each token row whole (18 copies in address order).
          std::uint32_t slot[9];
#pragma unroll
          for (int c = 0; c < 9; ++c) slot[c] = acquire(c);
#pragma unroll
          for (int k = 0; k < kTok; ++k)
#pragma unroll
            for (int c = 0; c < 9; ++c) copy_chunk(slot[c], c, k);
#pragma unroll
          for (int c = 0; c < 9; ++c) pipe.producer_commit_cp_async(st.at(c), 0);
        } else {
          // Chunk by chunk, each as soon as its slot is released.
#pragma unroll
          for (int c = 0; c < 9; ++c) {
            const std::uint32_t slot = acquire(c);
#pragma unroll
            for (int k = 0; k < kTok; ++k) copy_chunk(slot, c, k);
            pipe.producer_commit_cp_async(st.at(c), 0);
          }
        }
        st.advance(Cfg::kChunksPerTile);
        continue;
      }
      pipe.producer_acquire(st, 0);
      const std::uint32_t dst = smem_u32(ss.kv[st.stage()]) + dst0;
#pragma unroll
      for (int k = 0; k < kTok; ++k) {
#pragma unroll
        for (int c = 0; c < kCopies; ++c)
          Copy::copy16(dst + k * kTokStride * kHeadDimQK + 64 * c, src[k] + 64 * c, bytes[k]);
      }
      pipe.producer_commit_cp_async(st, 0);
      st.advance();
    }
  }

  // ---- consumer warpgroups -----------------------------------------------------------------

  // Q [kRows x 576] -> sQ in f16 x 2^e per row, each 16-dim block permuted as the K fragments
  // deliver it (dims {0,1,4,5,8,9,12,13} in unit 2 blk, {2,3,6,7,10,11,14,15} in 2 blk + 1).
  // 16-bit KV: Q in the Q type, dims in natural order, every row scaled by scale_log2 in the
  // softmax.
  __device__ void load_q() const {
    unsigned char* q = ss.q;
    if constexpr (kKv16) {
      m.template copy_q_tile<kConsumerThreads, kRows>(q);
      for (int n = static_cast<int>(threadIdx.x); n < kRows; n += kConsumerThreads)
        sv.q_scale[n] = m.p.scale_log2;
      Copy::commit();
      Copy::template wait<0>();
      arch::fence_proxy_async_smem();
      return;
    }
    m.template load_q_scaled<kConsumerThreads>(
        [&](int r, int blk, const std::uint32_t(&w)[8]) {
          *reinterpret_cast<uint4*>(q + QTile::unit_offset(r, 2 * blk)) =
              uint4{w[0], w[2], w[4], w[6]};
          *reinterpret_cast<uint4*>(q + QTile::unit_offset(r, 2 * blk + 1)) =
              uint4{w[1], w[3], w[5], w[7]};
        },
        sv.q_scale, m.p.scale_log2);
    arch::fence_proxy_async_smem();
  }

  // S^T = K Q^T for the tile at shared address kv: 18 ldmatrix.x4 of two k-steps each, issued
  // in batches of kSPairsPerBatch, one batch in flight while the next one's registers are
  // built (each batch may reuse the registers of the batch two before it).
  // ldmatrix.x4 (two k-steps each) per batch; 64 rows: one (O^T and S^T take 160 registers;
  // two spill). Two batches in flight hide the ldmatrix -> cvt latency; a third does not pay
  // (docs/performance.md).
  static constexpr int kSPairsPerBatch = kRows == 64 ? 1 : 2;
  static constexpr int kSDepth = 2;  // batches in flight
  __device__ void issue_s(float (&s)[kS], std::uint32_t kv, int wi, int lane,
                          const State& st) const {
    if constexpr (kKv16) {
      // A = K: chunk kb / 4 of the tile (ring position kb / 4 after st, in the ring at shared
      // address kv), k-step kb % 4 (32 bytes); B = Q: the same of sQ. Each chunk is waited for
      // right before its four k-steps.
      std::uint32_t q_addr = smem_u32(ss.q);
      asm volatile("" : "+r"(kv), "+r"(q_addr));
      const arch::WgmmaDescBase dk = arch::WgmmaDescBase::make(kv, 16, 1024);
      const arch::WgmmaDescBase dq = arch::WgmmaDescBase::make(q_addr, 16, 1024);
      const Pipeline pipe{sv.bars};
      std::uint32_t chunk = 0;  // byte offset of the chunk in the ring
#pragma unroll
      for (int kb = 0; kb < kHeadDimQK / 16; ++kb) {
        if (kb % 4 == 0) {  // chunk kb / 4 landed (fenced: wgmma reads it)
          const State sc = st.at(kb / 4);
          pipe.consumer_wait(sc, 0);
          arch::wgmma_fence();
          chunk = sc.stage() * SharedStorage::kStageBytes;
        }
        const std::uint64_t da = dk.at(chunk + 32 * (kb & 3));
        const std::uint64_t db = dq.at((kb >> 2) * QTile::kChunkBytes + 32 * (kb & 3));
        W::template mma_ss_kt<kRows, false>(s, da, db, kb != 0);  // A = K, K-major
      }
      arch::wgmma_commit();
      return;
    }
    // Per-lane bases of the even / odd chunk pair: key 16 wi + (lane & 7) + 8 ((lane >> 3) & 1),
    // raw chunk 2 cp + (lane >> 4); XOR-swizzle by (key >> 1) & 3 within groups of 4 chunks.
    const int key = 16 * wi + (lane & 7) + 8 * ((lane >> 3) & 1);
    const int x = (key >> 1) & 3, hi = lane >> 4;
    std::uint32_t base_e = kv + key * kHeadDimQK + ((hi ^ x) << 4);
    std::uint32_t base_o = kv + key * kHeadDimQK + (((2 + hi) ^ x) << 4);
    std::uint32_t q_addr = smem_u32(ss.q);
    asm volatile("" : "+r"(base_e), "+r"(base_o), "+r"(q_addr));
    const arch::WgmmaDescBase dq = arch::WgmmaDescBase::make(q_addr, 16, 1024);
    constexpr int kBatches = (18 + kSPairsPerBatch - 1) / kSPairsPerBatch;
    // The raw registers of the next batch are loaded before this batch is converted, so the
    // ldmatrix latency overlaps the conversion and the wgmma issue.
    std::uint32_t next[kSPairsPerBatch][4];
    auto load = [&](int cp, std::uint32_t(&r)[4]) {
      Atom::ldsm_x4(r[0], r[1], r[2], r[3], ((cp & 1) ? base_o : base_e) + 64 * (cp >> 1));
    };
#pragma unroll
    for (int i = 0; i < kSPairsPerBatch; ++i) load(i, next[i]);
#pragma unroll
    for (int b = 0; b < kBatches; ++b) {
      if (b >= kSDepth) arch::wgmma_wait<kSDepth - 1>();  // batch b - kSDepth: b reuses its registers
      std::uint32_t a[2 * kSPairsPerBatch][4];
      std::uint32_t raw[kSPairsPerBatch][4];
#pragma unroll
      for (int i = 0; i < kSPairsPerBatch; ++i)
#pragma unroll
        for (int k = 0; k < 4; ++k) raw[i][k] = next[i][k];
      if (b + 1 < kBatches) {
#pragma unroll
        for (int i = 0; i < kSPairsPerBatch; ++i) load((b + 1) * kSPairsPerBatch + i, next[i]);
      }
#pragma unroll
      for (int i = 0; i < kSPairsPerBatch; ++i) {
        const std::uint32_t(&r)[4] = raw[i];
        Atom::e4m3x4_to_f16x2x2(r[0], a[2 * i][0], a[2 * i][2]);
        Atom::e4m3x4_to_f16x2x2(r[1], a[2 * i][1], a[2 * i][3]);
        Atom::e4m3x4_to_f16x2x2(r[2], a[2 * i + 1][0], a[2 * i + 1][2]);
        Atom::e4m3x4_to_f16x2x2(r[3], a[2 * i + 1][1], a[2 * i + 1][3]);
      }
      arch::wgmma_fence();  // the A registers were just written
#pragma unroll
      for (int i = 0; i < 2 * kSPairsPerBatch; ++i) {
        const int kb = 2 * b * kSPairsPerBatch + i;  // 16-dim block: Q chunk kb / 4, step kb % 4
        mma(s, a[i], dq.at((kb >> 2) * QTile::kChunkBytes + 32 * (kb & 3)), kb != 0);
      }
      arch::wgmma_commit();
    }
  }

  // O^T += V^T P^T for the tile at shared address kv, in batches of 16 keys x 256 dims (4
  // wgmma each; 8 batches for all 512 dims, 4 for the 256 dims from 64 mb_base on), one in
  // flight while the next is built; releases the stage after its last ldmatrix (no wgmma
  // reads KV). kChained: the previous tile's batches are still in flight (64 rows: B after A),
  // so every batch first retires the one two before it.
  template <bool kChained = false>
  __device__ void issue_pv(float (&o)[kMbOwn][kS], std::uint32_t kv, std::uint32_t p_addr,
                           int wi, int lane, const State& st, int mb_base = 0) const {
    if constexpr (kKv16) {
      // A = V^T of dims block mb: chunk mb of the tile (ring position mb after st) read
      // MN-major (the dims are its contiguous 128 bytes), 16 keys (2048 bytes) per k-step; B =
      // P^T from sP. Each chunk is released once its P V retired (wgmma reads it).
      asm volatile("" : "+r"(kv), "+r"(p_addr));
      const arch::WgmmaDescBase dv = arch::WgmmaDescBase::make(kv, 64 * 128, 1024);
      const arch::WgmmaDescBase dp = arch::WgmmaDescBase::make(p_addr, 16, 1024);
      // One commit group per dims block, so chunk mb is released as soon as its P V retired.
      const Pipeline pipe{sv.bars};
      arch::wgmma_fence();
#pragma unroll
      for (int mb = 0; mb < 8; ++mb) {
        const std::uint32_t chunk = st.at(mb).stage() * SharedStorage::kStageBytes;
#pragma unroll
        for (int j = 0; j < 4; ++j)
          W::template mma_ss_kt<kRows, true>(o[mb], dv.at(chunk + 2048 * j), dp.at(32 * j), true);
        arch::wgmma_commit();
      }
      release_in_order<7>(pipe, st);
      (void)wi, (void)lane, (void)mb_base;
      return;
    }
    constexpr int kHalves = kMbOwn / 4;  // batches per 16 keys
    const Pipeline pipe{sv.bars};
    // Lane address of the transposing ldmatrix.x4: tokens 16 j + (lane & 7) + 8 ((lane >> 3)
    // & 1) of raw chunk 4 (mb + (lane >> 4)) + wi (matrices 2, 3: the next dims block),
    // swizzled by (token >> 1) & 3 = (lane & 7) >> 1.
    const int tok = (lane & 7) + 8 * ((lane >> 3) & 1);
    std::uint32_t base = kv + tok * kHeadDimQK + 64 * (mb_base + (lane >> 4)) +
                         ((wi ^ ((lane & 7) >> 1)) << 4);
    asm volatile("" : "+r"(base), "+r"(p_addr));
    const arch::WgmmaDescBase dp = arch::WgmmaDescBase::make(p_addr, 16, 1024);
    // The raw registers of the next batch are loaded before this batch is converted.
    auto load = [&](int b, int i, std::uint32_t(&r)[4]) {
      const int j = b / kHalves, mb0 = 4 * (b % kHalves);
      Atom::ldsm_x4_trans(r[0], r[1], r[2], r[3], base + 16 * j * kHeadDimQK + 64 * (mb0 + 2 * i));
    };
    std::uint32_t next[2][4];
    load(0, 0, next[0]);
    load(0, 1, next[1]);
#pragma unroll
    for (int b = 0; b < 4 * kHalves; ++b) {  // batch b: keys 16 j .., dims blocks mb0 ..
      const int j = b / kHalves, mb0 = 4 * (b % kHalves);
      if (kChained || b >= 2) arch::wgmma_wait<1>();  // batch b - 2: batch b reuses its registers
      std::uint32_t a[4][4];
      std::uint32_t raw[2][4];
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int k = 0; k < 4; ++k) raw[i][k] = next[i][k];
      if (b + 1 < 4 * kHalves) {
        load(b + 1, 0, next[0]);
        load(b + 1, 1, next[1]);
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const std::uint32_t(&r)[4] = raw[i];
#pragma unroll
        for (int h = 0; h < 4; ++h) {
          // bytes (tok 2t: dim 2g, 2g+1 | tok 2t+1: dim 2g, 2g+1) -> (dim 2g: 2t, 2t+1 | dim 2g+1);
          // r[0], r[1]: tokens +0 / +8 of block mb0 + 2i, r[2], r[3]: of block mb0 + 2i + 1
          const std::uint32_t w = __byte_perm(r[h], 0u, 0x3120);
          Atom::e4m3x4_to_f16x2x2(w, a[2 * i + (h >> 1)][2 * (h & 1)],
                                  a[2 * i + (h >> 1)][2 * (h & 1) + 1]);
        }
      }
      if (b == 4 * kHalves - 1) {  // every read of the stage is done
        __syncwarp();  // orders every lane's ldmatrix reads before lane 0's release
        pipe.consumer_release(st, 0);
      }
      arch::wgmma_fence();
#pragma unroll
      for (int i = 0; i < 4; ++i)
        mma(o[mb0 + i], a[i], dp.at(32 * j), true);
      arch::wgmma_commit();
    }
  }

  // 16-bit KV: waits for the commit groups of P V one by one (N groups still pending) and
  // releases chunk 7 - N of the tile after each.
  template <int N>
  __device__ static void release_in_order(const Pipeline& pipe, const State& st) {
    arch::wgmma_wait<N>();
    pipe.consumer_release(st.at(7 - N), 0);
    if constexpr (N > 0) release_in_order<N - 1>(pipe, st);
  }

  struct Softmax {
    float m_run[kQ], l_run[kQ];  // rows n(q) = 8 (q >> 1) + 2t + (q & 1)
    float m_own;  // 32 rows, in the tile loop: running max of the row owned_row(0, g, t) (the
                  // m_run of the thread's rows are gathered from these after the loop)
    int row_limit[kQ];
  };
  __device__ static int row_of(int q, int t) { return 8 * (q >> 1) + 2 * t + (q & 1); }
  // A row's maximum over the warp's 16 keys: the eight lanes g of the row hold its keys
  // (16 rows).
  __device__ static float warp_row_max(float v) {
    v = fmaxf(v, shfl_xor(v, 4));
    v = fmaxf(v, shfl_xor(v, 8));
    return fmaxf(v, shfl_xor(v, 16));
  }
  // 32 and 64 rows: the eight lanes g of a row group t hold the same kQ rows (different keys).
  // Instead of reducing every row in every lane (3 shuffles per row), each step sends half of
  // a lane's rows to the lane whose bit 4, 3, then 2 differs and keeps the maximum of the other
  // half: kQ / 2 + kQ / 4 + kQ / 8 shuffles in all, after which lane (g, t) holds whole rows:
  // v[i] is row owned_row(i, g, t) for i < kQ / 8. Exact (a maximum in another order).
  // (16 rows, kQ = 4, keep warp_row_max: there 4 shuffles instead of 12 do not outweigh the
  // selects and a third step; docs/performance.md.)
  template <int H>
  __device__ static void halve_max(float (&v)[kQ], int lane, int bit) {
    const bool hi = (lane >> bit) & 1;
#pragma unroll
    for (int i = 0; i < H; ++i) {
      const float keep = hi ? v[i + H] : v[i];
      const float send = hi ? v[i] : v[i + H];
      v[i] = fmaxf(keep, shfl_xor(send, 1 << bit));
    }
  }
  __device__ static int owned_row(int i, int g, int t) { return row_of(i + (kQ / 8) * g, t); }
  __device__ static void row_max_transposed(float (&v)[kQ], int lane) {
    static_assert(kQ >= 8, "32 and 64 rows");
    halve_max<kQ / 2>(v, lane, 4);
    halve_max<kQ / 4>(v, lane, 3);
    halve_max<kQ / 8>(v, lane, 2);
  }

  // Row n's maximum over the tile: the four warps' maxima of warpgroup w (16 and 32 rows).
  __device__ float warps_row_max(int par, int w, int n) const {
    return fmaxf(fmaxf(sv.tile_max[par][w][0][n], sv.tile_max[par][w][1][n]),
                 fmaxf(sv.tile_max[par][w][2][n], sv.tile_max[par][w][3][n]));
  }

  // s[i]: key 16 wi + g + 8 ((i >> 1) & 1), row n(q), q = 2 (i >> 2) + (i & 1). Returns
  // whether any of the thread's rows moved its running max (alpha != 1; lazy_running_max
  // keeps it otherwise).
  __device__ bool softmax(float (&s)[kS], int kt, bool need_mask, int w, int wi, int g, int t,
                          int par, Softmax& sm, float (&alpha)[kQ]) const {
    float mt[kQ];
#pragma unroll
    for (int q = 0; q < kQ; ++q) mt[q] = neg_inf();
#pragma unroll
    for (int i = 0; i < kS; ++i) {
      const int q = 2 * (i >> 2) + (i & 1), h = (i >> 1) & 1;
      s[i] *= sv.q_scale[row_of(q, t)];
      if (need_mask && kt + 16 * wi + g + 8 * h >= sm.row_limit[q]) s[i] = neg_inf();
      mt[q] = fmaxf(mt[q], s[i]);
    }
    if constexpr (kQ >= 8) {
      row_max_transposed(mt, lane_id());
#pragma unroll
      for (int i = 0; i < kQ / 8; ++i) sv.tile_max[par][w][wi][owned_row(i, g, t)] = mt[i];
    } else {
#pragma unroll
      for (int q = 0; q < kQ; ++q) {
        mt[q] = warp_row_max(mt[q]);
        if (g == 0) sv.tile_max[par][w][wi][row_of(q, t)] = mt[q];
      }
    }
    arch::named_sync(tile_max_bar(w), 128);
    if constexpr (kRows == 32) {
      // Each lane forms the running max of the row it owns (kept in sm.m_own), its exponent
      // base and alpha, and hands base and alpha to the lanes of its warp that hold the row
      // (row_of(q, t) is owned by lane 4 q + t) through sv.row_exp32: formed once per row, not
      // by every thread for each of its rows. 32 rows rescale every tile.
      const int n = owned_row(0, g, t);
      const float m_new = lazy_running_max(sm.m_own, warps_row_max(par, w, n));
      const float base = exp_base(m_new);
      sv.row_exp32[w][wi][lane_id()] = make_float2(base, fast_exp2(sm.m_own - base));
      sm.m_own = m_new;
      __syncwarp();  // orders the row_exp32 stores before the warp's loads
#pragma unroll
      for (int q = 0; q < kQ; ++q) {
        const float2 x = sv.row_exp32[w][wi][4 * q + t];
        alpha[q] = x.y;
        sm.l_run[q] *= x.y;
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // s[i] of row q: i = 4 (q >> 1) + (q & 1) + 2 h
          const int i = 4 * (q >> 1) + (q & 1) + 2 * h;
          s[i] = fast_exp2(s[i] - x.x);
          sm.l_run[q] += s[i];
        }
      }
      return true;
    }
    bool moved = false;
#pragma unroll
    for (int q = 0; q < kQ; ++q) {
      const float m_new = lazy_running_max(sm.m_run[q], warps_row_max(par, w, row_of(q, t)));
      moved = moved || m_new != sm.m_run[q];
      alpha[q] = fast_exp2(sm.m_run[q] - exp_base(m_new));
      sm.m_run[q] = m_new;
      sm.l_run[q] *= alpha[q];
    }
#pragma unroll
    for (int i = 0; i < kS; ++i) {
      const int q = 2 * (i >> 2) + (i & 1);
      s[i] = fast_exp2(s[i] - exp_base(sm.m_run[q]));
      sm.l_run[q] += s[i];
    }
    return moved;
  }

  // P (f16) -> sP [kRows rows x 64 keys], 128-byte swizzle: element (n, key) at n * 128 +
  // (((key >> 3) ^ (n & 7)) << 4) + 2 (key & 7). The accumulator block (j, h) of a warp (keys
  // 16 wi + 8 h + g, rows 8 j + 2 t + e: s[4 j + 2 h + e]) is an m8n8 fragment whose transpose
  // is 8 rows of P x 8 keys, so stmatrix.trans stores four such blocks per instruction: lane L
  // addresses row L & 7 of block (2 k + (L >> 4), (L >> 3) & 1).
  __device__ void store_p(const float (&s)[kS], std::uint32_t p, int wi, int lane) const {
    const int r = lane & 7, mi = lane >> 3;
    const std::uint32_t base = p + (8 * (mi >> 1) + r) * 128 + (((2 * wi + (mi & 1)) ^ r) << 4);
#pragma unroll
    for (int k = 0; k < kRows / 16; ++k) {
      std::uint32_t v[4];
#pragma unroll
      for (int m4 = 0; m4 < 4; ++m4) {
        const int i = 4 * (2 * k + (m4 >> 1)) + 2 * (m4 & 1);
        v[m4] = arch::pack2<Tc>(s[i], s[i + 1]);
      }
      arch::stsm_x4_trans(base + 16 * 128 * k, v[0], v[1], v[2], v[3]);
    }
  }

  // One piece for consumer warpgroup w: tiles i with i % kWg == w (every tile advances the
  // ring position `st`, so both warpgroups follow the producer's order).
  __device__ void consume(const RequestPlan& rq, const Piece& pc, const Range& r, State& st,
                          int wg) {
    if constexpr (kSplitDims)
      consume_pairs(rq, pc, r, st, wg);
    else
      consume_tiles(rq, pc, r, st, wg);
  }
  __device__ void consume_tiles(const RequestPlan& rq, const Piece& pc, const Range& r, State& st,
                                int wg) {
    const int w = kWg == 1 ? 0 : wg;
    const int lane = lane_id(), wi = warp_id() & 3;
    const int g = lane >> 2, t = lane & 3;
    const int L = rq.kv_len;
    const int vis_first = visible_keys(L, m.q_len, m.row0 / m.heads, m.causal);
    const int mask_from = r.kv_end < vis_first ? r.kv_end : vis_first;
    Softmax sm;
#pragma unroll
    for (int q = 0; q < kQ; ++q) {
      sm.m_run[q] = neg_inf();
      sm.l_run[q] = 0.0f;
      const int row = m.row0 + row_of(q, t);
      const int v = visible_keys(L, m.q_len, row / m.heads, m.causal);
      sm.row_limit[q] = v < r.kv_end ? v : r.kv_end;
    }
    sm.m_own = neg_inf();
    float o[8][kS];
#pragma unroll
    for (int mb = 0; mb < 8; ++mb)
#pragma unroll
      for (int i = 0; i < kS; ++i) o[mb][i] = 0.0f;

    if (r.n_tiles > 0) {
      load_q();
      arch::named_sync(arch::NamedBarrier::consumers, kConsumerThreads);  // sQ complete
      const Pipeline pipe{sv.bars};
      const std::uint32_t p_addr = smem_u32(ss.p[w]);
      for (int i = 0; i < r.n_tiles; ++i, st.advance(Cfg::kChunksPerTile)) {
        if (kWg > 1 && i % kWg != w) continue;  // the other warpgroup's tile
        const int kt = r.kv_begin + 64 * i;
        // 16-bit KV: issue_s waits for each chunk (with the async-proxy fence: wgmma reads it)
        // and the products address the chunks from the ring's start
        if constexpr (!kKv16) pipe.consumer_wait_generic(st, 0);
        const std::uint32_t kv = smem_u32(ss.kv[kKv16 ? 0 : st.stage()]);
        float s[kS];
        issue_s(s, kv, wi, lane, st);
        arch::wgmma_wait<0>();
        arch::fence_operand(s);
        if constexpr (kKv16) pipe.consumer_release(st.at(8), 0);  // the rope chunk: S^T only
        float alpha[kQ];
        const bool moved =
            softmax(s, kt, kt + 64 > mask_from, w, wi, g, t, (i / kWg) & 1, sm, alpha);
        store_p(s, p_addr, wi, lane);
        arch::fence_proxy_async_smem();
        // alpha is 1 unless the max moved. 32 rows rescale every tile: with the branch around
        // the 128 accumulators ptxas spilled inside the tile loop (16 local loads per tile).
        if (kRows == 32 || moved) {
#pragma unroll
          for (int mb = 0; mb < 8; ++mb)
#pragma unroll
            for (int k = 0; k < kS; ++k) o[mb][k] *= alpha[2 * (k >> 2) + (k & 1)];
        }
        arch::named_sync(tile_p_bar(w), 128);
        issue_pv(o, kv, p_addr, wi, lane, st);
        arch::wgmma_wait<0>();
#pragma unroll
        for (int mb = 0; mb < 8; ++mb) arch::fence_operand(o[mb]);
      }
    }
    if constexpr (kRows == 32) {
#pragma unroll
      for (int q = 0; q < kQ; ++q) sm.m_run[q] = __shfl_sync(0xffffffffu, sm.m_own, 4 * q + t);
    }
    if constexpr (kWg == 1) {
      epilogue<0>(pc, sm, o, wi, g, t);
    } else {
      if (w == 0) {
        if (r.n_tiles > 0) merge<0>(sm, o);
        epilogue<0>(pc, sm, o, wi, g, t);
      } else {
        if (r.n_tiles > 0) merge<1>(sm, o);
        epilogue<1>(pc, sm, o, wi, g, t);
      }
    }
  }

  // ---- 64 rows: the two warpgroups split the dims and work on pairs of tiles -------------

  // Floats as ints of the same order (negative values: the magnitude bits flipped), so that
  // integer atomicMax in shared memory takes the maximum of floats.
  __device__ static int ordered(float f) {
    const int b = __float_as_int(f);
    return b >= 0 ? b : b ^ 0x7FFFFFFF;
  }
  __device__ static float from_ordered(int b) { return __int_as_float(b >= 0 ? b : b ^ 0x7FFFFFFF); }

  // The softmax of warpgroup w's tile of a pair. The row maxima of the pair's two tiles and the
  // previous running max meet in sv.pair_max[par] (shared atomicMax of ordered ints, started
  // at the previous max), so both warpgroups read the same maximum and take the same running
  // max from it (lazy_running_max); l stays per thread (own keys).
  __device__ void softmax_pair(float (&s)[kS], int kt, bool need_mask, int w, int wi, int g,
                               int t, int par, float (&l_run)[kQ],
                               float (&o)[kMbOwn][kS]) const {
    // The scores stay unscaled until the exponent: the row scale sc (scale_log2 x 2^-e of Q's
    // row) is positive, so the maximum of the scaled scores is sc times the maximum of the raw
    // ones (rounding is monotonic), and P = 2^(s sc - m) is one fma per score. The mask only on
    // the tiles that reach a row's limit, under a branch (uniform per tile).
    if (need_mask) {
#pragma unroll
      for (int q2 = 0; q2 < kQ / 2; ++q2) {  // rows 8 q2 + 2 t and + 1: q = 2 q2, 2 q2 + 1
        const int2 l2 = *reinterpret_cast<const int2*>(&sv.row_limit[8 * q2 + 2 * t]);
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            if (kt + 16 * wi + g + 8 * h >= (e == 0 ? l2.x : l2.y))
              s[4 * q2 + 2 * h + e] = neg_inf();
      }
    }
    float mt[kQ];
#pragma unroll
    for (int q = 0; q < kQ; ++q) mt[q] = neg_inf();
#pragma unroll
    for (int i = 0; i < kS; ++i) {
      const int q = 2 * (i >> 2) + (i & 1);
      mt[q] = fmaxf(mt[q], s[i]);
    }
    row_max_transposed(mt, lane_id());
    {
      // The two rows this lane owns now are adjacent: owned_row(0, g, t) = 8 g + 2 t.
      const int n = owned_row(0, g, t);
      const float2 sc = *reinterpret_cast<const float2*>(&sv.q_scale[n]);
      atomicMax(&sv.pair_max[par][n], ordered(mt[0] * sc.x));
      atomicMax(&sv.pair_max[par][n + 1], ordered(mt[1] * sc.y));
    }
    arch::named_sync(arch::NamedBarrier::tile_max, kConsumerThreads);
    // The previous max is sv.m_run[par ^ 1]; this pair's is lazy_running_max of it and the
    // pair's max. Each lane forms it for the two rows it owned in the reduction (n = 8 g + 2 t,
    // n + 1) with their exponent base and alpha = 2^(m_old - base) (exactly 1 where the max
    // stayed), and hands them to the lanes of its warp that hold those rows through
    // sv.row_exp[warp][lane] (formed once per row, not by every thread for each of its 16
    // rows). Warp 0 of warpgroup 0 writes the max to sv.m_run[par] and starts the next
    // pair's sv.pair_max[par ^ 1] at it (both were last read before the previous pair's
    // NamedBarrier::tile_p). O^T is rescaled when a row of the warp moved its max.
    bool lane_moved;
    {
      const int n = owned_row(0, g, t);
      const float2 m_old = *reinterpret_cast<const float2*>(&sv.m_run[par ^ 1][n]);
      const int2 pm = *reinterpret_cast<const int2*>(&sv.pair_max[par][n]);
      const float2 m_new = make_float2(lazy_running_max(m_old.x, from_ordered(pm.x)),
                                       lazy_running_max(m_old.y, from_ordered(pm.y)));
      const float2 base = make_float2(exp_base(m_new.x), exp_base(m_new.y));
      sv.row_exp[4 * w + wi][lane_id()] = make_float4(
          base.x, base.y, fast_exp2(m_old.x - base.x), fast_exp2(m_old.y - base.y));
      lane_moved = m_new.x != m_old.x || m_new.y != m_old.y;
      if (w == 0 && wi == 0) {
        *reinterpret_cast<float2*>(&sv.m_run[par][n]) = m_new;
        *reinterpret_cast<int2*>(&sv.pair_max[par ^ 1][n]) =
            make_int2(ordered(m_new.x), ordered(m_new.y));
      }
    }
    const bool moved = __any_sync(0xffffffffu, lane_moved);
    __syncwarp();  // orders the row_exp stores before the warp's loads
    // Row pair (8 q2 + 2 t, + 1) was formed by lane 4 q2 + t. P = 2^(s sc - base), l = l alpha
    // + P (alpha = 1 unless the row's max moved).
    const float4* const rx = sv.row_exp[4 * w + wi];
#pragma unroll
    for (int q2 = 0; q2 < kQ / 2; ++q2) {
      const float4 x = rx[4 * q2 + t];
      const float2 sc2 = *reinterpret_cast<const float2*>(&sv.q_scale[8 * q2 + 2 * t]);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float base = e == 0 ? x.x : x.y, alpha = e == 0 ? x.z : x.w;
        const float sc = e == 0 ? sc2.x : sc2.y;
        // s[i] and o[mb][i] of row q = 2 q2 + e: i = 4 q2 + e + 2 h
        const int i0 = 4 * q2 + e;
        const float p0 = fast_exp2(fmaf(s[i0], sc, -base));
        const float p1 = fast_exp2(fmaf(s[i0 + 2], sc, -base));
        s[i0] = p0, s[i0 + 2] = p1;
        l_run[2 * q2 + e] = fmaf(l_run[2 * q2 + e], alpha, p0 + p1);
      }
    }
    if (moved) {
#pragma unroll
      for (int q2 = 0; q2 < kQ / 2; ++q2) {
        const float4 x = rx[4 * q2 + t];
#pragma unroll
        for (int mb = 0; mb < kMbOwn; ++mb) {
          o[mb][4 * q2] *= x.z;
          o[mb][4 * q2 + 2] *= x.z;
          o[mb][4 * q2 + 1] *= x.w;
          o[mb][4 * q2 + 3] *= x.w;
        }
      }
    }
  }

  // One piece, 64 rows: pair j is tiles A = 2 j and B = 2 j + 1 (range() pads an odd count
  // with a tile of zeros, masked). Warpgroup w: S^T of tile 2 j + w -> row maxima (NamedBarrier::tile_max, both
  // warpgroups) -> P of its tile into sP[w], O^T *= alpha (NamedBarrier::tile_p) -> P V of A and
  // B for its 256 dims. Every warp of both warpgroups releases each stage of the pair.
  __device__ void consume_pairs(const RequestPlan& rq, const Piece& pc, const Range& r, State& st,
                                int w) {
    const int lane = lane_id(), wi = warp_id() & 3;
    const int g = lane >> 2, t = lane & 3;
    const int L = rq.kv_len;
    const int vis_first = visible_keys(L, m.q_len, m.row0 / m.heads, m.causal);
    const int mask_from = r.kv_end < vis_first ? r.kv_end : vis_first;
    float l_run[kQ];
#pragma unroll
    for (int q = 0; q < kQ; ++q) l_run[q] = 0.0f;
    float o[kMbOwn][kS];
#pragma unroll
    for (int mb = 0; mb < kMbOwn; ++mb)
#pragma unroll
      for (int i = 0; i < kS; ++i) o[mb][i] = 0.0f;

    if (r.n_tiles > 0) {
      for (int n = static_cast<int>(threadIdx.x); n < kRows; n += kConsumerThreads) {
        const int v = visible_keys(L, m.q_len, (m.row0 + n) / m.heads, m.causal);
        sv.row_limit[n] = v < r.kv_end ? v : r.kv_end;
        sv.m_run[1][n] = neg_inf();  // read by pair 0
        sv.pair_max[0][n] = ordered(neg_inf());
      }
      load_q();
      arch::named_sync(arch::NamedBarrier::consumers, kConsumerThreads);  // sQ, row limits
      const Pipeline pipe{sv.bars};
      const std::uint32_t p0 = smem_u32(ss.p[0]), p1 = smem_u32(ss.p[1]);
      for (int j = 0; 2 * j < r.n_tiles; ++j) {
        State st_b = st;
        st_b.advance();
        const State st_own = w == 0 ? st : st_b;
        const int kt = r.kv_begin + 64 * (2 * j + w);
        float s[kS];
        pipe.consumer_wait_generic(st_own, 0);
        issue_s(s, smem_u32(ss.kv[st_own.stage()]), wi, lane, st_own);
        arch::wgmma_wait<0>();
        arch::fence_operand(s);
        softmax_pair(s, kt, kt + 64 > mask_from, w, wi, g, t, j & 1, l_run, o);
        store_p(s, w == 0 ? p0 : p1, wi, lane);
        arch::fence_proxy_async_smem();
        arch::named_sync(arch::NamedBarrier::tile_p, kConsumerThreads);
        pipe.consumer_wait_generic(st, 0);
        issue_pv(o, smem_u32(ss.kv[st.stage()]), p0, wi, lane, st, 4 * w);
        pipe.consumer_wait_generic(st_b, 0);
        issue_pv<true>(o, smem_u32(ss.kv[st_b.stage()]), p1, wi, lane, st_b, 4 * w);
        arch::wgmma_wait<0>();
#pragma unroll
        for (int mb = 0; mb < kMbOwn; ++mb) arch::fence_operand(o[mb]);
        st.advance();
        st.advance();
      }
    }
    // The last pair's running max (written before its NamedBarrier::tile_p).
    Softmax sm;
#pragma unroll
    for (int q = 0; q < kQ; ++q) {
      sm.m_run[q] = r.n_tiles > 0 ? sv.m_run[((r.n_tiles >> 1) - 1) & 1][row_of(q, t)] : neg_inf();
      sm.l_run[q] = l_run[q];
    }
    if (w == 0)
      epilogue<0>(pc, sm, o, wi, g, t);
    else
      epilogue<1>(pc, sm, o, wi, g, t);
  }

  // Two warpgroups: merges warpgroup W's state with the other's through two buffers in the Q
  // region (float4 [warpgroup][kS / 4][128 threads] each). Thread (W, wi, lane) and its twin in
  // the other warpgroup hold the same rows and dims; afterwards warpgroup W holds the merged
  // O^T of dims blocks mb in [4 W, 4 W + 4) and both hold the merged m and l of their rows.
  // Every sum is formed as (warpgroup 0's term) + (warpgroup 1's term) in both warpgroups.
  template <int Wg>
  __device__ void merge(Softmax& sm, float (&o)[8][kS]) const {
    static_assert(2 * kQ <= kS, "m and l fit one accumulator's slot");
    const int ltid = static_cast<int>(threadIdx.x) & 127;
    float4* const buf = reinterpret_cast<float4*>(ss.q);
    constexpr int kF4 = kS / 4;                // float4 per accumulator and thread
    constexpr int kBuf = kWg * kF4 * 128;      // float4 per buffer
    auto slot = [&](int buffer, int wg, int v) { return buf + buffer * kBuf + (wg * kF4 + v) * 128 + ltid; };
    // Every consumer has retired its last tile's wgmma (nothing reads sQ any more).
    consumers_sync();
    {
      float v[kS];
#pragma unroll
      for (int q = 0; q < kQ; ++q) {
        v[q] = sm.m_run[q];
        v[kQ + q] = sm.l_run[q];
      }
#pragma unroll
      for (int k = 0; k < kF4; ++k)
        *slot(0, Wg, k) = make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
    }
    consumers_sync();
    float f0[kQ], f1[kQ];  // factors of warpgroup 0's and 1's terms
    {
      float v[kS];
#pragma unroll
      for (int k = 0; k < kF4; ++k) {
        const float4 x = *slot(0, 1 - Wg, k);
        v[4 * k] = x.x, v[4 * k + 1] = x.y, v[4 * k + 2] = x.z, v[4 * k + 3] = x.w;
      }
#pragma unroll
      for (int q = 0; q < kQ; ++q) {
        const float m0 = Wg == 0 ? sm.m_run[q] : v[q], m1 = Wg == 0 ? v[q] : sm.m_run[q];
        const float l0 = Wg == 0 ? sm.l_run[q] : v[kQ + q], l1 = Wg == 0 ? v[kQ + q] : sm.l_run[q];
        const float m_new = fmaxf(m0, m1);
        const float m_use = exp_base(m_new);
        f0[q] = fast_exp2(m0 - m_use);
        f1[q] = fast_exp2(m1 - m_use);
        sm.m_run[q] = m_new;
        sm.l_run[q] = l0 * f0[q] + l1 * f1[q];
      }
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int buffer = (k + 1) & 1;
      constexpr int kSend = Wg == 0 ? 4 : 0, kKeep = Wg == 0 ? 0 : 4;
#pragma unroll
      for (int v = 0; v < kF4; ++v)
        *slot(buffer, Wg, v) = make_float4(o[kSend + k][4 * v], o[kSend + k][4 * v + 1],
                                           o[kSend + k][4 * v + 2], o[kSend + k][4 * v + 3]);
      consumers_sync();
#pragma unroll
      for (int v = 0; v < kF4; ++v) {
        const float4 x = *slot(buffer, 1 - Wg, v);
        const float other[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = 4 * v + e, q = 2 * (i >> 2) + (i & 1);
          const float mine = o[kKeep + k][i];
          o[kKeep + k][i] = Wg == 0 ? mine * f0[q] + other[e] * f1[q]
                                    : other[e] * f0[q] + mine * f1[q];
        }
      }
    }
  }

  // Normalises and stores the dims blocks mb in [8 Wg / kWg, 8 (Wg + 1) / kWg) of O^T (every
  // block with one consumer warpgroup; warpgroup Wg's merged half with two); warpgroup 0
  // writes the LSE.
  template <int Wg>
  __device__ void epilogue(const Piece& pc, const Softmax& sm, const float (&o)[kMbOwn][kS],
                           int wi, int g, int t) const {
#pragma unroll
    for (int q = 0; q < kQ; ++q) {
      float l = sm.l_run[q];
      l += shfl_xor(l, 4);
      l += shfl_xor(l, 8);
      l += shfl_xor(l, 16);
      if (g == 0) sv.row_sum[Wg][wi][row_of(q, t)] = l;
    }
    consumers_sync();
    float inv[kQ], lse[kQ];
#pragma unroll
    for (int q = 0; q < kQ; ++q) {
      const int n = row_of(q, t);
      // Split dims: each warpgroup summed the keys of its own tiles; both form the same total.
      const float l = kSplitDims ? ((sv.row_sum[0][0][n] + sv.row_sum[0][1][n]) +
                                    (sv.row_sum[0][2][n] + sv.row_sum[0][3][n])) +
                                       ((sv.row_sum[1][0][n] + sv.row_sum[1][1][n]) +
                                        (sv.row_sum[1][2][n] + sv.row_sum[1][3][n]))
                                 : (sv.row_sum[Wg][0][n] + sv.row_sum[Wg][1][n]) +
                                       (sv.row_sum[Wg][2][n] + sv.row_sum[Wg][3][n]);
      inv[q] = l > 0.0f ? m.p.out_scale / l : 0.0f;
      lse[q] = lse_from_state(sm.m_run[q], l);
    }
    const bool split = pc.partial_slot >= 0;
    constexpr int kMb0 = 8 * Wg / kWg, kMb1 = 8 * (Wg + 1) / kWg;
    constexpr int kOff = kSplitDims ? kMb0 : 0;  // o[] holds blocks from kOff on
    if constexpr (kKv16) {
      // o[mb][4 j + 2 h + e]: dim 64 mb + 16 wi + g + 8 h, row 8 j + 2 t + e. Lanes g and g ^ 1
      // (lane ^ 4) hold adjacent dims of the same rows: even g stores dims (g, g + 1) of h = 0,
      // odd g dims (g + 7, g + 8) of h = 1, each with one value received from the other.
      const bool odd = g & 1;
#pragma unroll
      for (int q = 0; q < kQ; ++q) {
        const int row = m.row0 + row_of(q, t);
        const bool valid = row < m.rows;
        Tq* const dst = valid ? m.o_row(pc, row) : nullptr;
        const int i0 = 4 * (q >> 1) + (q & 1);
#pragma unroll
        for (int mb = kMb0; mb < kMb1; ++mb) {
          const float v0 = o[mb][i0] * inv[q], v1 = o[mb][i0 + 2] * inv[q];
          const float x = shfl_xor(odd ? v0 : v1, 4);
          const int col = 64 * mb + 16 * wi + (g & ~1) + (odd ? 8 : 0);
          if (valid)
            *reinterpret_cast<std::uint32_t*>(dst + col) =
                odd ? arch::pack2<Tq>(x, v1) : arch::pack2<Tq>(v0, x);
        }
        if (valid && Wg == 0 && wi == 0 && g == 0) m.store_lse(pc, split, row, lse[q]);
      }
    } else {
#pragma unroll
      for (int q = 0; q < kQ; ++q) {
        const int row = m.row0 + row_of(q, t);
        if (row >= m.rows) continue;
        Tq* const dst = m.o_row(pc, row);  // once per row: partial slot or output
#pragma unroll
        for (int mb = kMb0; mb < kMb1; ++mb) {
          // o[mb][4 j + 2 h + e]: dim 16 (4 mb + wi) + 2 g + h, row 8 j + 2 t + e (q = 2 j + e)
          const int i0 = 4 * (q >> 1) + (q & 1);
          const int col = 16 * (4 * mb + wi) + 2 * g;
          const float v0 = o[mb - kOff][i0] * inv[q], v1 = o[mb - kOff][i0 + 2] * inv[q];
          *reinterpret_cast<std::uint32_t*>(dst + col) = arch::pack2<Tq>(v0, v1);
        }
        if (Wg == 0 && wi == 0 && g == 0) m.store_lse(pc, split, row, lse[q]);
      }
    }
    // sQ (the exchange buffers) and row_sum are rewritten by the next piece only after every
    // consumer is here.
    consumers_sync();
  }
};

// The kernel of the keys-as-M mainloop: same grid, plan and workspace as decode_kernel<Tr>
// (planned for KtMainloop<Tr>::kCtasPerSm CTAs per SM). SelfPlan: the kernel that plans for
// itself (KtConfig::kSelfPlanSmall), a kernel of its own so that the planner's code and
// shared memory stay out of the one large batches run (behind a run-time flag in one kernel
// they slowed the large batches; docs/performance.md).
template <class Tr, bool SelfPlan = false>
__global__ void __launch_bounds__(KtMainloop<Tr>::kThreads, KtMainloop<Tr>::kCtasPerSm)
    decode_kernel_kt(const KernelArgs p) {
#if defined(MLAKIT_WGMMA_ENABLED)
  using ML = KtMainloop<Tr>;
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ typename ML::StaticStorage sv;
  typename ML::SharedStorage& ss = *reinterpret_cast<typename ML::SharedStorage*>(smem);
  const int row_tile = static_cast<int>(blockIdx.x);
  const int cta = static_cast<int>(blockIdx.y);
  // Small automatic-mode batches (SelfPlan): the plan is computed here, into shared memory
  // past the mainloop's bytes, instead of by a planner launch.
  CtaWork work;
  if constexpr (SelfPlan)
    work = plan_for_block<ML::kThreads>(p, reinterpret_cast<RequestPlan*>(smem + ML::kSmemBytes),
                                        row_tile, cta);
  else
    work = planned_work(p, cta);
  DecodeMainloop<Tr> dm = DecodeMainloop<Tr>::of_tile(p, smem, row_tile);
  if (dm.row0 >= dm.rows) return;
  if (threadIdx.x == 0) {
    // Each use of a stage is released by the four warps of the warpgroup that consumed it
    // (64 rows: by all eight consumer warps, which all read its V).
    int releasers[ML::SharedStorage::kStages][1];
    for (int s = 0; s < ML::SharedStorage::kStages; ++s) releasers[s][0] = ML::kSplitDims ? 8 : 4;
    ML::Pipeline::init(sv.bars, releasers);
    arch::mbar_init_fence();
  }
  __syncthreads();
  ML ml{dm, ss, sv};
  typename ML::State st;
  if (threadIdx.x >= ML::kConsumerThreads) {
    if constexpr (ML::Cfg::kProducerRegs > 0) arch::setmaxnreg_dec<ML::Cfg::kProducerRegs>();
    for (int b = work.cp.req_begin; b <= work.cp.req_end; ++b) {
      dm.b = b;
      const RequestPlan rq = work.requests[b];
      ml.produce(ml.range(rq, piece_of(p.shape, rq, cta, work.per_cta)), st);
    }
  } else {
    if constexpr (ML::Cfg::kConsumerRegs > 0) arch::setmaxnreg_inc<ML::Cfg::kConsumerRegs>();
    const int w = static_cast<int>(threadIdx.x) / 128;
    for (int b = work.cp.req_begin; b <= work.cp.req_end; ++b) {
      dm.b = b;
      const RequestPlan rq = work.requests[b];
      const Piece pc = piece_of(p.shape, rq, cta, work.per_cta);
      ml.consume(rq, pc, ml.range(rq, pc), st, w);
    }
  }
#else
  (void)p;
#endif
}

}  // namespace mlakit::detail

#endif  // MLAKIT_PLATFORM_CUDA
