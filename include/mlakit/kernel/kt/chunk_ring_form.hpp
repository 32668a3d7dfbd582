#pragma once
// The keys-as-M form for 16-bit KV of the Q type (16 and 32 rows; KtConfig<Rows, 2>): nothing
// is converted, so both products read the tile in shared memory (wgmma SS):
//   S^T  = K Q^T     A = K, K-major; B = sQ, dims in natural order
//   O^T += V^T P^T   A = V^T, MN-major (M row g is dim g); B = P^T in the Q type
// A tile lands as nine 64-dim chunks [64 tokens x 128 B] (128-byte swizzle, the wgmma operand
// layout of Swizzle128Tile<64>). A tile is 72 KB, so the ring holds chunks, not tiles: tile i
// takes ring positions 9 i .. 9 i + 8 (modulo the slot count, all the shared memory beside Q
// and P), so every slot holds KV in flight. S^T waits for the chunks one by one (with the
// async-proxy fence: wgmma reads them) and starts on chunk 0 before the last one lands; the
// rope chunk is released once S^T retired, V chunk mb once the P V of its dims retired.
// 16 rows: the producer acquires a tile's nine slots, then copies each token row whole (two
// consumer warpgroups on alternate tiles); 32 rows: it copies chunk by chunk as slots are
// released (one consumer warpgroup). docs/design.md says why each.
#include <cstdint>

#include "../../arch/convert.hpp"
#include "../../arch/copy_atom.hpp"
#include "../../arch/pipeline_sm90.hpp"
#include "../../arch/wgmma_sm90.hpp"
#include "../../core/decode_args.hpp"
#include "../../core/plan.hpp"
#include "../../platform/intrinsics.hpp"
#include "../../platform/platform.hpp"
#include "softmax.hpp"

#if defined(MLAKIT_HAS_SM90A_KERNELS)

namespace mlakit::detail {

// The 16-bit form: Q, P and KV in the Q type.
template <class Tr>
struct KtChunkRingForm : KtSoftmax<Tr, typename Tr::Tq, 2> {
  using Base = KtSoftmax<Tr, typename Tr::Tq, 2>;
  using Base::kConsumerThreads;
  using Base::kMbOwn;
  using Base::kQ;
  using Base::kRows;
  using Base::kS;
  using Base::kTok;
  using Base::kTokStride;
  using Base::kWg;
  using Base::ctx;
  using Base::tiles;
  using Base::state;
  using typename Base::Cfg;
  using typename Base::Copy;
  using typename Base::Pipeline;
  using typename Base::QTile;
  using typename Base::Range;
  using typename Base::SharedStorage;
  using typename Base::State;
  using typename Base::Tq;
  using typename Base::W;
  static_assert((kRows == 16 || kRows == 32) && Tr::kDirect, "16 or 32 rows of KV of the Q type");

  // ---- producer ------------------------------------------------------------------------------
  // Tile i of the range into ring positions st .. st + 8: chunk c (copies 2 c and 2 c + 1 of
  // each token) goes to ring position c after st, as soon as that slot is released.
  __device__ void produce(const Range& r, State& st) const {
    constexpr bool kSplit = Tr::Problem::kSplitCache;  // rotary chunks from kv_rope
    if (r.n_tiles == 0) return;
    const Pipeline pipe{state.bars};
    const int pl = static_cast<int>(threadIdx.x) - kConsumerThreads;
    const int sub = pl & 3, r0 = pl >> 2;
    const std::int32_t* table = ctx.page_table();
    const int last = r.kv_end - 1;
    // Unit u = sub + 4 c of the 72 of a token lies in chunk c >> 1 at position
    // (sub + 4 (c & 1)) ^ (r0 & 7): dst0 for even c, dst1 for odd c.
    const std::uint32_t dst0 = r0 * 128 + ((sub ^ (r0 & 7)) << 4);
    const std::uint32_t dst1 = r0 * 128 + (((sub | 4) ^ (r0 & 7)) << 4);
    int id[kTok];
    this->fetch_pages(table, r.kv_begin, last, pl, id);
    for (int i = 0; i < r.n_tiles; ++i) {
      const int kt = r.kv_begin + 64 * i;
      const unsigned char *src[kTok], *rope[kTok] = {};
      this->template token_sources<kSplit>(r, kt, r0, sub, id, src, rope);
      if (i + 1 < r.n_tiles) this->fetch_pages(table, kt + 64, last, pl, id);  // in flight
      const std::uint32_t ring = smem_u32(tiles.kv[0]);
      const auto acquire = [&](int c) {  // the slot of chunk c, once released; its address
        const State sc = st.at(c);
        pipe.producer_acquire(sc, 0);
        return ring + sc.stage() * SharedStorage::kStageBytes;
      };
      const auto copy_chunk = [&](std::uint32_t slot, int c, int k) {  // chunk c of token k
#pragma unroll
        for (int e = 0; e < 2; ++e)
          Copy::copy16_evict_first(slot + (e ? dst1 : dst0) + k * kTokStride * 128,
                                   this->template copy_src<kSplit>(src[k], rope[k], 2 * c + e),
                                   16u);
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
    }
  }

  // ---- consumer operands -------------------------------------------------------------------

  // Q [kRows x 576] -> sQ in the Q type, dims in natural order; every row is scaled by
  // scale_log2 in the softmax (at least kMinRowScale, see load_q_scaled).
  __device__ void load_q() const {
    unsigned char* q = tiles.q;
    ctx.template copy_q_tile<kConsumerThreads, kRows>(q);
    for (int n = static_cast<int>(threadIdx.x); n < kRows; n += kConsumerThreads)
      state.q_scale[n] = fmaxf(ctx.p.scale_log2, kMinRowScale);
    Copy::commit();
    Copy::template wait<0>();
    arch::fence_proxy_async_smem();
  }

  // The products address the tile's chunks from the ring's start; issue_s waits for each.
  __device__ std::uint32_t tile_kv(const Pipeline& pipe, const State& st) const {
    (void)pipe, (void)st;
    return smem_u32(tiles.kv[0]);
  }
  // The rope chunk (ring position 8 after st) is read by S^T only.
  __device__ void release_after_s(const Pipeline& pipe, const State& st) const {
    pipe.consumer_release(st.at(8), 0);
  }

  // S^T = K Q^T. A = K: chunk kb / 4 of the tile (ring position kb / 4 after st, in the ring at
  // shared address kv), k-step kb % 4 (32 bytes); B = Q: the same of sQ. Each chunk is waited
  // for right before its four k-steps.
  __device__ void issue_s(float (&s)[kS], std::uint32_t kv, int wi, int lane,
                          const State& st) const {
    (void)wi, (void)lane;
    std::uint32_t q_addr = smem_u32(tiles.q);
    asm volatile("" : "+r"(kv), "+r"(q_addr));
    const arch::WgmmaDescBase dk = arch::WgmmaDescBase::make(kv, 16, 1024);
    const arch::WgmmaDescBase dq = arch::WgmmaDescBase::make(q_addr, 16, 1024);
    const Pipeline pipe{state.bars};
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
  }

  // O^T += V^T P^T. A = V^T of dims block mb: chunk mb of the tile (ring position mb after st)
  // read MN-major (the dims are its contiguous 128 bytes), 16 keys (2048 bytes) per k-step;
  // B = P^T from sP. One commit group per dims block, so chunk mb is released as soon as its
  // P V retired (wgmma reads it).
  __device__ void issue_pv(float (&o)[kMbOwn][kS], std::uint32_t kv, std::uint32_t p_addr, int wi,
                           int lane, const State& st) const {
    asm volatile("" : "+r"(kv), "+r"(p_addr));
    const arch::WgmmaDescBase dv = arch::WgmmaDescBase::make(kv, 64 * 128, 1024);
    const arch::WgmmaDescBase dp = arch::WgmmaDescBase::make(p_addr, 16, 1024);
    const Pipeline pipe{state.bars};
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
    (void)wi, (void)lane;
  }
  // Waits for the commit groups of P V one by one (N groups still pending) and releases chunk
  // 7 - N of the tile after each.
  template <int N>
  __device__ static void release_in_order(const Pipeline& pipe, const State& st) {
    arch::wgmma_wait<N>();
    pipe.consumer_release(st.at(7 - N), 0);
    if constexpr (N > 0) release_in_order<N - 1>(pipe, st);
  }

  // ---- output --------------------------------------------------------------------------------
  // Normalises the dims blocks mb in [8 Wg / kWg, 8 (Wg + 1) / kWg) of O^T and stores them;
  // lane 0 of warpgroup 0's warp 0 writes the LSE. o[mb][4 j + 2 h + e]: dim 64 mb + 16 wi + g
  // + 8 h, row 8 j + 2 t + e. Lanes g and g ^ 1 (lane ^ 4) hold adjacent dims of the same rows:
  // even g stores dims (g, g + 1) of h = 0, odd g dims (g + 7, g + 8) of h = 1, each with one
  // value received from the other.
  template <int Wg>
  __device__ void write_output(const Piece& pc, const typename Base::Softmax& sm,
                               const float (&o)[kMbOwn][kS], int wi, int g, int t) const {
    this->template publish_row_sums<Wg>(sm, wi, g, t);
    // inv: the output scale / l (0 for a row with no visible key). Formed here, beside the
    // stores, not in a KtSoftmax step: there the division's slow path changes how ptxas
    // orders the 64-row kernel.
    float inv[kQ], lse[kQ];
#pragma unroll
    for (int q = 0; q < kQ; ++q) {
      const float l = this->template row_total<Wg>(Base::row_of(q, t));
      inv[q] = l > 0.0f ? ctx.p.out_scale / l : 0.0f;
      lse[q] = lse_from_state(sm.m_run[q], l);
    }
    const bool split = pc.partial_slot >= 0;
    constexpr int kMb0 = 8 * Wg / kWg, kMb1 = 8 * (Wg + 1) / kWg;
    const bool odd = g & 1;
#pragma unroll
    for (int q = 0; q < kQ; ++q) {
      const int row = ctx.row0 + Base::row_of(q, t);
      const bool valid = row < ctx.rows;
      Tq* const dst = valid ? ctx.o_row(pc, row) : nullptr;
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
      if (valid && Wg == 0 && wi == 0 && g == 0) ctx.store_lse(pc, split, row, lse[q]);
    }
  }
};

}  // namespace mlakit::detail

#endif  // MLAKIT_HAS_SM90A_KERNELS
