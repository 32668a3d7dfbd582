#pragma once
// The keys-as-M form for e4m3fn KV (16, 32 and 64 rows; KtConfig<Rows>): the ring holds whole
// raw tiles [64 tokens x 576 B] (row-major, 16-byte units swizzled by (token >> 1) & 3), and the
// KV tile is the A operand of both products, read by ldmatrix and widened to f16 in registers
// (cvt.rn.f16x2.e4m3x2):
//   S^T [64 keys x N rows]  = K [64 x 576] . Q^T [576 x N]      (36 k-steps of m64nNk16)
//   O^T [512 dims x N rows] += V^T [512 x 64] . P^T [64 x N]     (8 dim blocks x 4 k-steps)
// No wgmma reads a stage: a stage is released after its last ldmatrix, and the consumers wait
// for it without the async-proxy fence (consumer_wait_generic). Q (f16, a power-of-two scale
// per row) and P are the B operands in shared memory (128-byte swizzle, K-major). The next
// batch's ldmatrix is issued before the current batch is converted, so its latency overlaps
// the conversion and the wgmma issue.
// Fragment orders (the A operand of m64nNk16, warp wi holds M rows 16 wi + g, + 8):
//   K: one 32-bit ldmatrix register of key g holds dims 4t..4t+3 of a 16-dim block, so the
//     k index 2t + i is dim 4t + i and 2t + 8 + i is dim 4t + 2 + i; Q is stored with the same
//     permutation (the one of the mma.sync e4m3 path).
//   V^T: the transposing ldmatrix gives lane (g, t) byte pairs (token 2t | 2t + 1) x (dim 2g,
//     2g + 1), so M row g of a 16-dim block is dim 2g and M row g + 8 is dim 2g + 1; the
//     epilogue writes each row's two adjacent dims together.
#include <cstdint>

#include "../../arch/convert.hpp"
#include "../../arch/copy_atom.hpp"
#include "../../arch/mma_atom.hpp"
#include "../../arch/pipeline_sm90.hpp"
#include "../../arch/wgmma_sm90.hpp"
#include "../../core/decode_args.hpp"
#include "../../core/numeric.hpp"
#include "../../core/plan.hpp"
#include "../../platform/intrinsics.hpp"
#include "../../platform/platform.hpp"
#include "softmax.hpp"

#if defined(MLAKIT_HAS_SM90A_KERNELS)

namespace mlakit::detail {

// The e4m3fn form: Q and P in f16, one byte per KV element.
template <class Tr>
struct KtRawFp8Form : KtSoftmax<Tr, fp16_t, 1> {
  using Base = KtSoftmax<Tr, fp16_t, 1>;
  using Base::kConsumerThreads;
  using Base::kCopies;
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
  using Atom = typename Tr::Atom;  // arch::MmaAtom<fp16_t>: ldmatrix and the widening
  using typename Base::Copy;
  using typename Base::Pipeline;
  using typename Base::QTile;
  using typename Base::Range;
  using typename Base::State;
  using typename Base::Tq;
  using typename Base::W;
  static_assert((kRows == 16 || kRows == 32 || kRows == 64) && Tr::kFp8Operands,
                "16, 32 or 64 rows of e4m3fn KV");

  __device__ static void mma(float (&d)[kS], const std::uint32_t (&a)[4], std::uint64_t desc_b,
                             bool accumulate) {
    if constexpr (kRows == 16)
      W::mma_rs_n16(d, a, desc_b, accumulate);
    else if constexpr (kRows == 32)
      W::mma_rs_n32(d, a, desc_b, accumulate);
    else
      W::mma_rs_n64(d, a, desc_b, accumulate);
  }

  // ---- producer ------------------------------------------------------------------------------
  // Tile i of the range into ring stage st (a stage per tile): each lane's tokens are copied
  // whole (kCopies units of 16 bytes); rows past the range's end repeat its last token
  // (token_sources).
  __device__ void produce(const Range& r, State& st) const {
    constexpr bool kSplit = Tr::Problem::kSplitCache;  // rotary chunks from kv_rope
    if (r.n_tiles == 0) return;
    const Pipeline pipe{state.bars};
    const int pl = static_cast<int>(threadIdx.x) - kConsumerThreads;
    const int sub = pl & 3, r0 = pl >> 2;
    const std::int32_t* table = ctx.page_table();
    const int last = r.kv_end - 1;
    // row r0 of 576 B, unit swizzle (r0 >> 1) & 3
    const std::uint32_t dst0 = r0 * kHeadDimQK + ((sub ^ ((r0 >> 1) & 3)) << 4);
    int id[kTok];
    this->fetch_pages(table, r.kv_begin, last, pl, id);
    for (int i = 0; i < r.n_tiles; ++i) {
      const int kt = r.kv_begin + 64 * i;
      const unsigned char *src[kTok], *rope[kTok] = {};
      this->template token_sources<kSplit>(r, kt, r0, sub, id, src, rope);
      if (i + 1 < r.n_tiles) this->fetch_pages(table, kt + 64, last, pl, id);  // in flight
      pipe.producer_acquire(st, 0);
      const std::uint32_t dst = Copy::per_thread(smem_u32(tiles.kv[st.stage()])) + dst0;
#pragma unroll
      for (int k = 0; k < kTok; ++k) {
#pragma unroll
        for (int c = 0; c < kCopies; ++c)
          Copy::copy16_evict_first(dst + k * kTokStride * kHeadDimQK + 64 * c,
                                   this->template copy_src<kSplit>(src[k], rope[k], c), 16u);
      }
      pipe.producer_commit_cp_async(st, 0);
      st.advance();
    }
  }

  // ---- consumer operands -------------------------------------------------------------------

  // Q [kRows x 576] -> sQ in f16 x 2^e per row, each 16-dim block permuted as the K fragments
  // deliver it (dims {0,1,4,5,8,9,12,13} in unit 2 blk, {2,3,6,7,10,11,14,15} in 2 blk + 1).
  __device__ void load_q() const {
    unsigned char* q = tiles.q;
    ctx.template load_q_scaled<kConsumerThreads>(
        [&](int r, int blk, const std::uint32_t(&w)[8]) {
          *reinterpret_cast<uint4*>(q + QTile::unit_offset(r, 2 * blk)) =
              uint4{w[0], w[2], w[4], w[6]};
          *reinterpret_cast<uint4*>(q + QTile::unit_offset(r, 2 * blk + 1)) =
              uint4{w[1], w[3], w[5], w[7]};
        },
        state.q_scale, ctx.p.scale_log2);
    arch::fence_proxy_async_smem();
  }

  // The shared address of the tile at ring position st, once it landed (no fence: only
  // ldmatrix reads it).
  __device__ std::uint32_t tile_kv(const Pipeline& pipe, const State& st) const {
    pipe.consumer_wait_generic(st, 0);
    return smem_u32(tiles.kv[st.stage()]);
  }
  // Nothing to release after S^T: the whole stage is released after the P V's last ldmatrix.
  __device__ void release_after_s(const Pipeline& pipe, const State& st) const {
    (void)pipe, (void)st;
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
    (void)st;
    // Per-lane bases of the even / odd chunk pair: key 16 wi + (lane & 7) + 8 ((lane >> 3) & 1),
    // raw chunk 2 cp + (lane >> 4); XOR-swizzle by (key >> 1) & 3 within groups of 4 chunks.
    const int key = 16 * wi + (lane & 7) + 8 * ((lane >> 3) & 1);
    const int x = (key >> 1) & 3, hi = lane >> 4;
    std::uint32_t base_e = kv + key * kHeadDimQK + ((hi ^ x) << 4);
    std::uint32_t base_o = kv + key * kHeadDimQK + (((2 + hi) ^ x) << 4);
    std::uint32_t q_addr = smem_u32(tiles.q);
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
      if (b >= kSDepth)
        arch::wgmma_wait<kSDepth - 1>();  // batch b - kSDepth: b reuses its registers
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
      for (int i = 0; i < kSPairsPerBatch; ++i) widen_k(raw[i], a[2 * i], a[2 * i + 1]);
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
  __device__ void issue_pv(float (&o)[kMbOwn][kS], std::uint32_t kv, std::uint32_t p_addr, int wi,
                           int lane, const State& st, int mb_base = 0) const {
    constexpr int kHalves = kMbOwn / 4;  // batches per 16 keys
    const Pipeline pipe{state.bars};
    // Lane address of the transposing ldmatrix.x4: tokens 16 j + (lane & 7) + 8 ((lane >> 3)
    // & 1) of raw chunk 4 (mb + (lane >> 4)) + wi (matrices 2, 3: the next dims block),
    // swizzled by (token >> 1) & 3 = (lane & 7) >> 1.
    const int tok = (lane & 7) + 8 * ((lane >> 3) & 1);
    std::uint32_t base =
        kv + tok * kHeadDimQK + 64 * (mb_base + (lane >> 4)) + ((wi ^ ((lane & 7) >> 1)) << 4);
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
      for (int i = 0; i < 2; ++i) widen_v(raw[i], a[2 * i], a[2 * i + 1]);
      if (b == 4 * kHalves - 1) {  // every read of the stage is done
        __syncwarp();              // orders every lane's ldmatrix reads before lane 0's release
        pipe.consumer_release(st, 0);
      }
      arch::wgmma_fence();
#pragma unroll
      for (int i = 0; i < 4; ++i) mma(o[mb0 + i], a[i], dp.at(32 * j), true);
      arch::wgmma_commit();
    }
  }

  // The A fragments of two k-steps of S^T (a0, a1, f16) from one ldmatrix.x4 of raw K (r):
  // r[0], r[1] hold k-step 0's keys g and g + 8, r[2], r[3] k-step 1's.
  __device__ static void widen_k(const std::uint32_t (&r)[4], std::uint32_t (&a0)[4],
                                 std::uint32_t (&a1)[4]) {
    Atom::e4m3x4_to_f16x2x2(r[0], a0[0], a0[2]);
    Atom::e4m3x4_to_f16x2x2(r[1], a0[1], a0[3]);
    Atom::e4m3x4_to_f16x2x2(r[2], a1[0], a1[2]);
    Atom::e4m3x4_to_f16x2x2(r[3], a1[1], a1[3]);
  }
  // The A fragments of two dims blocks of V^T (a0, a1, f16) from one transposing ldmatrix.x4
  // of raw V (r): r[0], r[1] are tokens +0 / +8 of the first block, r[2], r[3] of the second.
  // Each register's bytes (token 2t: dims 2g, 2g + 1 | token 2t + 1: dims 2g, 2g + 1) are
  // regrouped by dim (dim 2g: tokens 2t, 2t + 1 | dim 2g + 1) before the widening.
  __device__ static void widen_v(const std::uint32_t (&r)[4], std::uint32_t (&a0)[4],
                                 std::uint32_t (&a1)[4]) {
#pragma unroll
    for (int h = 0; h < 4; ++h) {
      const std::uint32_t w = __byte_perm(r[h], 0u, 0x3120);
      std::uint32_t(&a)[4] = h < 2 ? a0 : a1;
      Atom::e4m3x4_to_f16x2x2(w, a[2 * (h & 1)], a[2 * (h & 1) + 1]);
    }
  }

  // 64 rows: O^T += V^T P^T for both tiles of the pair (A at ring position st_a, B at st_b;
  // their P at p_a, p_b), dims blocks [4 w, 4 w + 4); B's batches follow A's in flight.
  // Returns with every wgmma retired.
  __device__ void pair_pv(float (&o)[kMbOwn][kS], const Pipeline& pipe, const State& st_a,
                          const State& st_b, std::uint32_t p_a, std::uint32_t p_b, int w, int wi,
                          int lane) const {
    issue_pv(o, tile_kv(pipe, st_a), p_a, wi, lane, st_a, 4 * w);
    issue_pv<true>(o, tile_kv(pipe, st_b), p_b, wi, lane, st_b, 4 * w);
    arch::wgmma_wait<0>();
#pragma unroll
    for (int mb = 0; mb < kMbOwn; ++mb) arch::fence_operand(o[mb]);
  }

  // ---- output --------------------------------------------------------------------------------
  // Normalises the dims blocks mb in [8 Wg / kWg, 8 (Wg + 1) / kWg) of O^T and stores them, each
  // lane two adjacent dims of a row per store; lane 0 of warpgroup 0's warp 0 writes the LSE.
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
    constexpr int kOff = Base::kSplitDims ? kMb0 : 0;  // o[] holds blocks from kOff on
#pragma unroll
    for (int q = 0; q < kQ; ++q) {
      const int row = ctx.row0 + Base::row_of(q, t);
      if (row >= ctx.rows) continue;
      Tq* const dst = ctx.o_row(pc, row);  // once per row: partial slot or output
#pragma unroll
      for (int mb = kMb0; mb < kMb1; ++mb) {
        // o[mb][4 j + 2 h + e]: dim 16 (4 mb + wi) + 2 g + h, row 8 j + 2 t + e (q = 2 j + e)
        const int i0 = 4 * (q >> 1) + (q & 1);
        const int col = 16 * (4 * mb + wi) + 2 * g;
        const float v0 = o[mb - kOff][i0] * inv[q], v1 = o[mb - kOff][i0 + 2] * inv[q];
        *reinterpret_cast<std::uint32_t*>(dst + col) = arch::pack2<Tq>(v0, v1);
      }
      if (Wg == 0 && wi == 0 && g == 0) ctx.store_lse(pc, split, row, lse[q]);
    }
  }
};

}  // namespace mlakit::detail

#endif  // MLAKIT_HAS_SM90A_KERNELS
