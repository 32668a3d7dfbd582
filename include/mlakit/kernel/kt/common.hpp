#pragma once
// The base layer of the keys-as-M mainloop (KtMainloopOf, kt/mainloop.hpp), shared by its two
// forms: the types and constants that follow from the traits, the form's KV width and the
// wgmma operand type (config, shared-memory parts, ring pipeline, thread counts, accumulator
// shapes), the references to the piece's context and to both shared-memory parts, the named
// barriers of the consumers, the KV range of a piece and the producer lanes' page lookups.
//
// The accumulators are transposed (keys or dims are wgmma's M, the kRows rows are N): an
// m64 x kRows accumulator gives each thread kS = kRows / 2 registers over kQ = kRows / 4 rows,
// s[i] of row row_of(q, t) (kt/softmax.hpp), q = 2 (i >> 2) + (i & 1).
#include <cstdint>
#include <type_traits>

#include "../../arch/pipeline_sm90.hpp"
#include "../../arch/tile_policy.hpp"
#include "../../arch/wgmma_sm90.hpp"
#include "../../core/attention_math.hpp"
#include "../../core/decode_args.hpp"
#include "../../core/plan.hpp"
#include "../../platform/intrinsics.hpp"
#include "../../platform/platform.hpp"
#include "../decode_kernel.hpp"
#include "../piece_context.hpp"
#include "../planner_kernel.hpp"
#include "../smem_tile.hpp"
#include "config.hpp"

#if defined(MLAKIT_HAS_SM90A_KERNELS)

namespace mlakit::detail {

// Tr: the decode traits; Tc: the wgmma operand type of Q and P (f16 for e4m3fn KV, widened in
// registers; the Q type for 16-bit KV); KvBytes: bytes per KV element (1 or 2).
template <class Tr, class Tc_, int KvBytes>
struct KtCommon {
  using Tq = typename Tr::Tq;
  using Tc = Tc_;
  using W = arch::Wgmma<Tc>;
  using Copy = typename Tr::Copy;
  static constexpr int kKvBytes = KvBytes;
  static constexpr int kRows = Tr::kRows;
  using Cfg = KtConfig<kRows, kKvBytes>;
  using SharedStorage = std::conditional_t<Tr::kFp8Matrix, KtMatrixSharedStorage,
                                           KtSharedStorage<kRows, kKvBytes>>;
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

  PieceContext<Tr>& ctx;  // the piece: request, row tile, addressing
  SharedStorage& tiles;   // Q, P and the KV ring (dynamic shared memory)
  StaticStorage& state;   // row maxima and sums, Q scales, barriers (static shared memory)

  struct Range {
    int kv_begin, kv_end;  // tokens [kv_begin, kv_end) the piece reads (after causal clip)
    int n_tiles;           // 64-token tiles (64 rows: an even count, the last one may be
                           // past kv_end, every token masked)
  };
  __device__ Range range(const RequestPlan& rq, const Piece& pc) const {
    const int last_row = (ctx.row0 + kRows < ctx.rows ? ctx.row0 + kRows : ctx.rows) - 1;
    const int vis_last = visible_keys(rq.kv_len, ctx.q_len, last_row / ctx.heads, ctx.causal);
    Range r;
    r.kv_begin = pc.kv_begin;
    r.kv_end = pc.kv_end < vis_last ? pc.kv_end : vis_last;
    r.n_tiles = r.kv_end > r.kv_begin ? (r.kv_end - r.kv_begin + 63) / 64 : 0;
    if (kSplitDims) r.n_tiles += r.n_tiles & 1;  // whole pairs: no wgmma under a branch
    return r;
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

  // ---- producer lanes ------------------------------------------------------------------------
  // Producer thread l (of 32 x kProducerWarps) copies tokens l / 4 + 8 kProducerWarps k
  // (k < kTok), 16 bytes at 16 (l % 4) + 64 c of each row (c < kCopies). The tokens share
  // (token >> 1) & 3 and token & 7, hence the swizzled column, so every copy is one
  // instruction at constant offsets from a per-thread shared base (the form's) and a
  // per-token source.
  static constexpr int kCopies = kHeadDimQK * kKvBytes / 64;
  static constexpr int kTokStride = 8 * Cfg::kProducerWarps;
  // The page ids of the lane's tokens of the tile at kt (clamped to the last token `last`).
  __device__ void fetch_pages(const std::int32_t* table, int kt, int last, int pl,
                              int (&id)[kTok]) const {
#pragma unroll
    for (int k = 0; k < kTok; ++k) {
      const int j = min(kt + pl / 4 + kTokStride * k, last);
      id[k] = __ldg(table + ctx.p.page.div(j));
    }
  }
  // The sources of the lane's first copy of each of its tokens (lane row r0, unit sub) of the
  // tile at kt, in the latent row (src) and (kSplit: a separate cache's) rotary row (rope).
  // Tokens past the range's end read the range's last token instead of zero-filling (their
  // scores are masked, so their P is 0, as for any masked key of the range; the row is the
  // request's, never an unused page's), so every copy is a full 16 bytes.
  template <bool kSplit>
  __device__ void token_sources(const Range& r, int kt, int r0, int sub, const int (&id)[kTok],
                                const unsigned char* (&src)[kTok],
                                const unsigned char* (&rope)[kTok]) const {
#pragma unroll
    for (int k = 0; k < kTok; ++k) {
      const int j = min(kt + r0 + kTokStride * k, r.kv_end - 1);
      const int in_page = ctx.p.page.mod(j, ctx.p.page.div(j));
      src[k] = ctx.page_row(id[k], in_page) + 16 * sub;
      if constexpr (kSplit) rope[k] = ctx.rope_row(id[k], in_page) + 16 * sub;
    }
  }
  // The source of copy u (bytes [64 u, 64 u + 64) of the token's 576 values) from the lane's
  // latent and (kSplit) rotary sources. A joined cache keeps one source per token: the
  // producer lanes' registers allow no more.
  static constexpr int kLatentBytes = kHeadDimV * kKvBytes;
  template <bool kSplit>
  __device__ static const unsigned char* copy_src(const unsigned char* src,
                                                  const unsigned char* rope, int u) {
    if constexpr (kSplit)
      if (64 * u >= kLatentBytes) return rope + (64 * u - kLatentBytes);
    return src + 64 * u;
  }
};

}  // namespace mlakit::detail

#endif  // MLAKIT_HAS_SM90A_KERNELS
