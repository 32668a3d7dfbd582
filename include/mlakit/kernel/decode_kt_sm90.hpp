#pragma once
// Hopper keys-as-M mainloop of the 16-row policy for e4m3fn KV (sm_90a device code only; on
// other targets, and for other KV types, the host launches the mma.sync mainloop of
// decode_kernel.hpp for the same policy).
//
// wgmma's M is 64, and a tile of up to 16 rows (16 heads x q_len 1) padded to 64 would waste
// three quarters of the matrix work. Here the keys are M and the rows are N = 16:
//   S^T [64 keys x 16 rows] = K [64 x 576] . Q^T [576 x 16]     (wgmma m64n16k16, 36 k-steps)
//   O^T [512 dims x 16 rows] += V^T [512 x 64] . P^T [64 x 16]   (8 x m64n16k16 per k-step)
// The KV tile is the A operand of both products, read from the raw e4m3fn tile by ldmatrix
// and widened to f16 in registers (cvt.rn.f16x2.e4m3x2), so no converted copy of KV exists in
// shared memory and the ring holds raw bytes only; Q (f16, a power-of-two scale per row) and
// P are the B operands in shared memory. Accumulators: S^T 8 and O^T 64 fp32 registers per
// thread.
//
// 160 threads: warps 0-3 (one warpgroup) consume, warp 4 produces; two CTAs per SM (168
// registers per thread: a scheduler holding three of the ten warps has 16384 registers).
//   producer: copies each 64-token tile raw into a ring of two stages [64 x 576 B] (4 lanes
//     per token, 64 contiguous bytes per copy instruction, page ids loaded a tile ahead);
//     the copy unit arrives on the stage's mbarrier.
//   consumers, per tile:
//     S^T: K fragments (ldmatrix + cvt) -> wgmma RS, in batches of 4 k-steps (one batch in
//       flight while the next one's registers are built).
//     softmax over the keys (M): each warp reduces its 16 keys per row by shuffles, the four
//       warps exchange their maxima through shared memory (NamedBarrier::tile_max), so every
//       thread holds the same running max of each row; the sums stay per thread until the end.
//     P -> sP [16 rows x 64 keys] (NamedBarrier::tile_p), O^T *= alpha.
//     O^T += V^T P^T: V fragments (transposing ldmatrix of byte pairs, byte permute, cvt) ->
//       wgmma RS in batches of 4 (16 keys x 256 dims); the stage is released after the last
//       ldmatrix (no wgmma reads KV from shared memory).
//   Each tile's matrix work retires before the next tile's starts: the two CTAs of an SM
//   overlap each other. (Queuing the next tile's S behind P V was slower: with two stages the
//   next tile has not landed yet. So was an L2 prefetch of the next tile by the producer.)
// Fragment orders (the A operand of m64nNk16, warp wi holds M rows 16 wi + g, + 8):
//   K: one 32-bit ldmatrix register of key g holds dims 4t..4t+3 of a 16-dim block, so the
//     k index 2t + i is dim 4t + i and 2t + 8 + i is dim 4t + 2 + i; Q is stored with the same
//     permutation (the one of the mma.sync e4m3 path).
//   V^T: the transposing ldmatrix gives lane (g, t) byte pairs (token 2t | 2t + 1) x (dim 2g,
//     2g + 1), so M row g of a 16-dim block is dim 2g and M row g + 8 is dim 2g + 1; the
//     epilogue writes each row's two adjacent dims together.
#include <cstdint>

#include "../arch/convert.hpp"
#include "../arch/copy_atom.hpp"
#include "../arch/mma_atom.hpp"
#include "../arch/pipeline_sm90.hpp"
#include "../arch/wgmma_sm90.hpp"
#include "../core/attention_math.hpp"
#include "../core/plan.hpp"
#include "../platform/intrinsics.hpp"
#include "smem_tile.hpp"
#include "workspace.hpp"

#if defined(MLAKIT_PLATFORM_CUDA)

namespace mlakit::detail {

template <class Tr>
struct DecodeMainloop;

// Dynamic shared memory of the keys-as-M mainloop (94 KB: two CTAs per SM).
struct KtSharedStorage {
  static constexpr int kStages = 2;
  static constexpr int kStageBytes = 64 * kHeadDimQK;  // raw e4m3fn [64 tokens x 576 B]
  alignas(1024) unsigned char q[9 * Swizzle128Tile<16>::kChunkBytes];  // Q [16 x 576] f16
  alignas(1024) unsigned char p[Swizzle128Tile<16>::kChunkBytes];      // P [16 x 64 keys] f16
  alignas(128) unsigned char kv[kStages][kStageBytes];
};
// Static shared memory: only sm_90a code of the kernel declares it (keys_as_m_usable() in
// api/decode.hpp tells the loaded code by its size; 1024-aligned, as the dynamic part that
// follows it, so that the size the runtime reports is sizeof).
struct alignas(1024) KtStaticStorage {
  using Pipeline = arch::RingPipeline<KtSharedStorage::kStages, 1, 1, 32>;
  float tile_max[2][4][16];  // [tile parity][warp][row]
  float row_sum[4][16];      // epilogue: l of each warp's keys
  float q_scale[16];         // 2^-e of each Q row
  Pipeline::Storage bars;
};

template <class Tr>
struct KtMainloop {
  using Tq = typename Tr::Tq;
  using W = arch::Wgmma<fp16_t>;
  using Atom = typename Tr::Atom;  // arch::MmaAtom<fp16_t>: ldmatrix and the e4m3x2 widening
  using Copy = typename Tr::Copy;
  using Raw = SwizzledByteRows<kHeadDimQK>;
  using QTile = Swizzle128Tile<16>;
  using Pipeline = KtStaticStorage::Pipeline;
  using State = arch::PipelineState<KtSharedStorage::kStages>;
  static constexpr int kThreads = 160;
  static constexpr int kConsumerThreads = 128;
  static constexpr int kCtasPerSm = arch::kKeysAsMCtasPerSm;
  static_assert(Tr::kRows == 16 && Tr::kFp8Operands, "16-row tiles of e4m3fn KV");
  static_assert(kCtasPerSm * (sizeof(KtSharedStorage) + sizeof(KtStaticStorage) + 1024) <= 233472,
                "two CTAs fit the 228 KB of an sm_90 SM");

  DecodeMainloop<Tr>& m;
  KtSharedStorage& ss;
  KtStaticStorage& sv;

  struct Range {
    int kv_begin, kv_end;  // tokens [kv_begin, kv_end) the piece reads (after causal clip)
    int n_tiles;           // 64-token tiles
  };
  __device__ Range range(const RequestPlan& rq, const Piece& pc) const {
    const int last_row = (m.row0 + 16 < m.rows ? m.row0 + 16 : m.rows) - 1;
    const int vis_last = visible_keys(rq.kv_len, m.q_len, last_row / m.heads, m.causal);
    Range r;
    r.kv_begin = pc.kv_begin;
    r.kv_end = pc.kv_end < vis_last ? pc.kv_end : vis_last;
    r.n_tiles = r.kv_end > r.kv_begin ? (r.kv_end - r.kv_begin + 63) / 64 : 0;
    return r;
  }

  // ---- producer warp -----------------------------------------------------------------------
  // Lane l copies tokens l / 4 + 8 k (k = 0..7), 16 bytes at 16 (l % 4) + 64 c of each row
  // (c = 0..8). The tokens share (token >> 1) & 3, hence the swizzled column, so every copy
  // is one instruction at constant offsets from a per-lane shared base and a per-token source.
  __device__ void fetch_pages(const std::int32_t* table, int kt, int last, int lane,
                              int (&id)[8]) const {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int j = min(kt + lane / 4 + 8 * k, last);
      id[k] = __ldg(table + j / m.p.a.page_size);
    }
  }
  __device__ void produce(const Range& r, State& st) const {
    if (r.n_tiles == 0) return;
    const Pipeline pipe{sv.bars};
    const int lane = static_cast<int>(threadIdx.x) - kConsumerThreads;
    const int sub = lane & 3, r0 = lane >> 2;
    const std::int32_t* table = m.page_table();
    const int last = r.kv_end - 1;
    const std::uint32_t dst0 = r0 * kHeadDimQK + ((sub ^ ((r0 >> 1) & 3)) << 4);
    int id[8];
    fetch_pages(table, r.kv_begin, last, lane, id);
    for (int i = 0; i < r.n_tiles; ++i) {
      const int kt = r.kv_begin + 64 * i;
      const unsigned char* src[8];
      std::uint32_t bytes[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const int j = kt + r0 + 8 * k;
        const bool valid = j < r.kv_end;
        src[k] = (valid ? m.page_row(id[k], j % m.p.a.page_size)
                        : static_cast<const unsigned char*>(m.p.a.kv)) +
                 16 * sub;
        bytes[k] = valid ? 16u : 0u;
      }
      if (i + 1 < r.n_tiles) fetch_pages(table, kt + 64, last, lane, id);  // in flight
      pipe.producer_acquire(st, 0);
      const std::uint32_t dst = smem_u32(ss.kv[st.stage()]) + dst0;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
#pragma unroll
        for (int c = 0; c < 9; ++c)
          Copy::copy16(dst + k * 8 * kHeadDimQK + 64 * c, src[k] + 64 * c, bytes[k]);
      }
      pipe.producer_commit_cp_async(st, 0);
      st.advance();
    }
  }

  // ---- consumer warpgroup ------------------------------------------------------------------

  // Q [16 x 576] -> sQ in f16 x 2^e per row, each 16-dim block permuted as the K fragments
  // deliver it (dims {0,1,4,5,8,9,12,13} in unit 2 blk, {2,3,6,7,10,11,14,15} in 2 blk + 1).
  __device__ void load_q() const {
    unsigned char* q = ss.q;
    m.template load_q_scaled<kConsumerThreads>(
        [&](int r, int blk, const std::uint32_t(&w)[8]) {
          *reinterpret_cast<uint4*>(q + QTile::unit_offset(r, 2 * blk)) =
              uint4{w[0], w[2], w[4], w[6]};
          *reinterpret_cast<uint4*>(q + QTile::unit_offset(r, 2 * blk + 1)) =
              uint4{w[1], w[3], w[5], w[7]};
        },
        sv.q_scale);
    arch::fence_proxy_async_smem();
  }

  // S^T = K Q^T for the tile at shared address kv: 18 ldmatrix.x4 of two k-steps each, issued
  // in batches of kSPairsPerBatch, one batch in flight while the next one's registers are
  // built (each batch may reuse the registers of the batch two before it).
  static constexpr int kSPairsPerBatch = 2;  // ldmatrix.x4 (two k-steps each) per batch
  __device__ void issue_s(float (&s)[8], std::uint32_t kv, int wi, int lane) const {
    // Per-lane bases of the even / odd chunk pair: key 16 wi + (lane & 7) + 8 ((lane >> 3) & 1),
    // raw chunk 2 cp + (lane >> 4); XOR-swizzle by (key >> 1) & 3 within groups of 4 chunks.
    const int key = 16 * wi + (lane & 7) + 8 * ((lane >> 3) & 1);
    const int x = (key >> 1) & 3, hi = lane >> 4;
    std::uint32_t base_e = kv + key * kHeadDimQK + ((hi ^ x) << 4);
    std::uint32_t base_o = kv + key * kHeadDimQK + (((2 + hi) ^ x) << 4);
    std::uint32_t q_addr = smem_u32(ss.q);
    asm volatile("" : "+r"(base_e), "+r"(base_o), "+r"(q_addr));
#pragma unroll
    for (int b = 0; b < (18 + kSPairsPerBatch - 1) / kSPairsPerBatch; ++b) {
      if (b >= 2) arch::wgmma_wait<1>();  // batch b - 2, whose registers batch b may reuse
      std::uint32_t a[2 * kSPairsPerBatch][4];
#pragma unroll
      for (int i = 0; i < kSPairsPerBatch; ++i) {
        const int cp = b * kSPairsPerBatch + i;
        std::uint32_t r[4];
        Atom::ldsm_x4(r[0], r[1], r[2], r[3], ((cp & 1) ? base_o : base_e) + 64 * (cp >> 1));
        a[2 * i][0] = Atom::e4m3x2_to_f16x2(r[0] & 0xFFFFu);
        a[2 * i][1] = Atom::e4m3x2_to_f16x2(r[1] & 0xFFFFu);
        a[2 * i][2] = Atom::e4m3x2_to_f16x2(r[0] >> 16);
        a[2 * i][3] = Atom::e4m3x2_to_f16x2(r[1] >> 16);
        a[2 * i + 1][0] = Atom::e4m3x2_to_f16x2(r[2] & 0xFFFFu);
        a[2 * i + 1][1] = Atom::e4m3x2_to_f16x2(r[3] & 0xFFFFu);
        a[2 * i + 1][2] = Atom::e4m3x2_to_f16x2(r[2] >> 16);
        a[2 * i + 1][3] = Atom::e4m3x2_to_f16x2(r[3] >> 16);
      }
      arch::wgmma_fence();  // the A registers were just written
#pragma unroll
      for (int i = 0; i < 2 * kSPairsPerBatch; ++i) {
        const int kb = 2 * b * kSPairsPerBatch + i;  // 16-dim block: Q chunk kb / 4, step kb % 4
        W::mma_rs_n16(s, a[i], arch::wgmma_desc(q_addr + (kb >> 2) * QTile::kChunkBytes + 32 * (kb & 3), 16, 1024),
                      kb != 0);
      }
      arch::wgmma_commit();
    }
  }

  // O^T += V^T P^T for the tile at shared address kv, in 8 batches (16 keys x 256 dims, 4
  // wgmma each), one in flight while the next is built; releases the stage after its last
  // ldmatrix (no wgmma reads KV).
  __device__ void issue_pv(float (&o)[8][8], std::uint32_t kv, int wi, int lane,
                           const State& st) const {
    const Pipeline pipe{sv.bars};
    // Lane address of the transposing ldmatrix.x4: tokens 16 j + (lane & 7) + 8 ((lane >> 3)
    // & 1) of raw chunk 4 (mb + (lane >> 4)) + wi (matrices 2, 3: the next dims block),
    // swizzled by (token >> 1) & 3 = (lane & 7) >> 1.
    const int tok = (lane & 7) + 8 * ((lane >> 3) & 1);
    std::uint32_t base =
        kv + tok * kHeadDimQK + 64 * (lane >> 4) + ((wi ^ ((lane & 7) >> 1)) << 4);
    std::uint32_t p_addr = smem_u32(ss.p);
    asm volatile("" : "+r"(base), "+r"(p_addr));
#pragma unroll
    for (int b = 0; b < 8; ++b) {  // batch b: keys 16 (b >> 1) .., dims blocks mb 4 (b & 1) ..
      const int j = b >> 1, mb0 = 4 * (b & 1);
      if (b >= 2) arch::wgmma_wait<1>();  // batch b - 2, whose registers batch b may reuse
      std::uint32_t a[4][4];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        std::uint32_t r[4];
        Atom::ldsm_x4_trans(r[0], r[1], r[2], r[3], base + 16 * j * kHeadDimQK + 64 * (mb0 + 2 * i));
#pragma unroll
        for (int h = 0; h < 4; ++h) {
          // bytes (tok 2t: dim 2g, 2g+1 | tok 2t+1: dim 2g, 2g+1) -> (dim 2g: 2t, 2t+1 | dim 2g+1);
          // r[0], r[1]: tokens +0 / +8 of block mb0 + 2i, r[2], r[3]: of block mb0 + 2i + 1
          const std::uint32_t w = __byte_perm(r[h], 0u, 0x3120);
          a[2 * i + (h >> 1)][2 * (h & 1)] = Atom::e4m3x2_to_f16x2(w & 0xFFFFu);
          a[2 * i + (h >> 1)][2 * (h & 1) + 1] = Atom::e4m3x2_to_f16x2(w >> 16);
        }
      }
      if (b == 7) pipe.consumer_release(st, 0);  // every read of the stage is done
      arch::wgmma_fence();
#pragma unroll
      for (int i = 0; i < 4; ++i)
        W::mma_rs_n16(o[mb0 + i], a[i], arch::wgmma_desc(p_addr + 32 * j, 16, 1024), true);
      arch::wgmma_commit();
    }
  }

  struct Softmax {
    float m_run[4], l_run[4], sc[4];  // rows n(q) = 8 (q >> 1) + 2t + (q & 1)
    int row_limit[4];
  };
  __device__ static int row_of(int q, int t) { return 8 * (q >> 1) + 2 * t + (q & 1); }

  // s[i]: key 16 wi + g + 8 ((i >> 1) & 1), row n(q), q = 2 (i >> 2) + (i & 1).
  __device__ void softmax(float (&s)[8], int kt, bool need_mask, int wi, int g, int t, int par,
                          Softmax& sm, float (&alpha)[4]) const {
    float mt[4] = {neg_inf(), neg_inf(), neg_inf(), neg_inf()};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int q = 2 * (i >> 2) + (i & 1), h = (i >> 1) & 1;
      s[i] *= sm.sc[q];
      if (need_mask && kt + 16 * wi + g + 8 * h >= sm.row_limit[q]) s[i] = neg_inf();
      mt[q] = fmaxf(mt[q], s[i]);
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      mt[q] = fmaxf(mt[q], shfl_xor(mt[q], 4));
      mt[q] = fmaxf(mt[q], shfl_xor(mt[q], 8));
      mt[q] = fmaxf(mt[q], shfl_xor(mt[q], 16));
      if (g == 0) sv.tile_max[par][wi][row_of(q, t)] = mt[q];
    }
    arch::named_sync(arch::NamedBarrier::tile_max, kConsumerThreads);
    float m_use[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int n = row_of(q, t);
      float mx = fmaxf(fmaxf(sv.tile_max[par][0][n], sv.tile_max[par][1][n]),
                       fmaxf(sv.tile_max[par][2][n], sv.tile_max[par][3][n]));
      const float m_new = fmaxf(sm.m_run[q], mx);
      // A row with no visible key so far keeps m = -inf; exponentiate against 0 instead.
      m_use[q] = m_new == neg_inf() ? 0.0f : m_new;
      alpha[q] = fast_exp2(sm.m_run[q] - m_use[q]);
      sm.m_run[q] = m_new;
      sm.l_run[q] *= alpha[q];
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int q = 2 * (i >> 2) + (i & 1);
      s[i] = fast_exp2(s[i] - m_use[q]);
      sm.l_run[q] += s[i];
    }
  }

  // P (f16) -> sP [16 rows x 64 keys], 128-byte swizzle: element (n, key) at n * 128 +
  // (((key >> 3) ^ (n & 7)) << 4) + 2 (key & 7).
  __device__ void store_p(const float (&s)[8], int wi, int g, int t) const {
    const std::uint32_t p = smem_u32(ss.p);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int q = 2 * (i >> 2) + (i & 1), h = (i >> 1) & 1;
      const int n = row_of(q, t), unit = 2 * wi + h;
      const std::uint32_t addr = p + n * 128 + ((unit ^ (n & 7)) << 4) + 2 * g;
      asm volatile("st.shared.b16 [%0], %1;\n" ::"r"(addr),
                   "h"(__half_as_ushort(__float2half_rn(s[i])))
                   : "memory");
    }
  }

  __device__ void consume(const RequestPlan& rq, const Piece& pc, const Range& r, State& st) {
    const int lane = lane_id(), wi = warp_id();
    const int g = lane >> 2, t = lane & 3;
    const int L = rq.kv_len;
    const int vis_first = visible_keys(L, m.q_len, m.row0 / m.heads, m.causal);
    const int mask_from = r.kv_end < vis_first ? r.kv_end : vis_first;
    Softmax sm;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      sm.m_run[q] = neg_inf();
      sm.l_run[q] = 0.0f;
      const int row = m.row0 + row_of(q, t);
      const int v = visible_keys(L, m.q_len, row / m.heads, m.causal);
      sm.row_limit[q] = v < r.kv_end ? v : r.kv_end;
    }
    float o[8][8];
#pragma unroll
    for (int mb = 0; mb < 8; ++mb)
#pragma unroll
      for (int i = 0; i < 8; ++i) o[mb][i] = 0.0f;

    if (r.n_tiles > 0) {
      load_q();
      arch::named_sync(arch::NamedBarrier::consumers, kConsumerThreads);  // sQ complete
#pragma unroll
      for (int q = 0; q < 4; ++q) sm.sc[q] = m.p.scale_log2 * sv.q_scale[row_of(q, t)];
      const Pipeline pipe{sv.bars};
      for (int i = 0; i < r.n_tiles; ++i) {
        const int kt = r.kv_begin + 64 * i;
        pipe.consumer_wait(st, 0);
        const std::uint32_t kv = smem_u32(ss.kv[st.stage()]);
        float s[8];
        issue_s(s, kv, wi, lane);
        arch::wgmma_wait<0>();
        arch::fence_operand(s);
        float alpha[4];
        softmax(s, kt, kt + 64 > mask_from, wi, g, t, i & 1, sm, alpha);
        store_p(s, wi, g, t);
        arch::fence_proxy_async_smem();
#pragma unroll
        for (int mb = 0; mb < 8; ++mb)
#pragma unroll
          for (int k = 0; k < 8; ++k) o[mb][k] *= alpha[2 * (k >> 2) + (k & 1)];
        arch::named_sync(arch::NamedBarrier::tile_p, kConsumerThreads);
        issue_pv(o, kv, wi, lane, st);
        arch::wgmma_wait<0>();
#pragma unroll
        for (int mb = 0; mb < 8; ++mb) arch::fence_operand(o[mb]);
        st.advance();
      }
    }
    epilogue(pc, sm, o, wi, g, t);
  }

  __device__ void epilogue(const Piece& pc, const Softmax& sm, const float (&o)[8][8], int wi,
                           int g, int t) const {
    const DecodeArgs& a = m.p.a;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      float l = sm.l_run[q];
      l += shfl_xor(l, 4);
      l += shfl_xor(l, 8);
      l += shfl_xor(l, 16);
      if (g == 0) sv.row_sum[wi][row_of(q, t)] = l;
    }
    arch::named_sync(arch::NamedBarrier::consumers, kConsumerThreads);
    float inv[4], lse[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int n = row_of(q, t);
      const float l = (sv.row_sum[0][n] + sv.row_sum[1][n]) + (sv.row_sum[2][n] + sv.row_sum[3][n]);
      inv[q] = l > 0.0f ? m.p.out_scale / l : 0.0f;
      lse[q] = lse_from_state(sm.m_run[q], l);
    }
    const bool split = pc.partial_slot >= 0;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int row = m.row0 + row_of(q, t);
      if (row >= m.rows) continue;
      const int tk = row / m.heads, hd = row - tk * m.heads;
#pragma unroll
      for (int mb = 0; mb < 8; ++mb) {
        // o[mb][4 j + 2 h + e]: dim 16 (4 mb + wi) + 2 g + h, row 8 j + 2 t + e (q = 2 j + e)
        const int i0 = 4 * (q >> 1) + (q & 1);
        const int col = 16 * (4 * mb + wi) + 2 * g;
        const float v0 = o[mb][i0] * inv[q], v1 = o[mb][i0 + 2] * inv[q];
        if (split) {
          float* dst = m.p.ws.partial_o +
                       (std::int64_t(pc.partial_slot) * m.p.ws.rows_padded + row) * kHeadDimV + col;
          *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
        } else {
          Tq* dst = static_cast<Tq*>(a.out) + m.b * a.o_stride_batch + tk * a.o_stride_token +
                    hd * a.o_stride_head + col;
          *reinterpret_cast<std::uint32_t*>(dst) = arch::pack2<Tq>(v0, v1);
        }
      }
      if (wi == 0 && g == 0) {
        if (split) {
          m.p.ws.partial_lse[std::int64_t(pc.partial_slot) * m.p.ws.rows_padded + row] = lse[q];
        } else if (a.lse != nullptr) {
          a.lse[m.b * a.lse_stride_batch + tk * a.lse_stride_token + hd * a.lse_stride_head] =
              lse[q];
        }
      }
    }
    // sQ and row_sum are rewritten by the next piece only after every consumer is here.
    arch::named_sync(arch::NamedBarrier::consumers, kConsumerThreads);
  }
};

// The kernel of the keys-as-M mainloop: same grid, plan and workspace as decode_kernel<Tr>
// (planned for two CTAs per SM); 160 threads.
template <class Tr>
__global__ void __launch_bounds__(160, arch::kKeysAsMCtasPerSm)
    decode_kernel_kt(const KernelArgs p) {
#if defined(MLAKIT_WGMMA_ENABLED)
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ KtStaticStorage sv;
  KtSharedStorage& ss = *reinterpret_cast<KtSharedStorage*>(smem);
  using ML = KtMainloop<Tr>;
  const int row_tile = static_cast<int>(blockIdx.x);
  const int cta = static_cast<int>(blockIdx.y);
  const CtaPlan cp = p.ws.ctas[cta];
  const int per_cta = p.ws.header[1];
  DecodeMainloop<Tr> dm = DecodeMainloop<Tr>::of_tile(p, smem, row_tile);
  if (dm.row0 >= dm.rows) return;
  if (threadIdx.x == 0) {
    constexpr int kReleasers[KtSharedStorage::kStages][1] = {{4}, {4}};
    ML::Pipeline::init(sv.bars, kReleasers);
    arch::mbar_init_fence();
  }
  __syncthreads();
  ML ml{dm, ss, sv};
  typename ML::State st;
  if (threadIdx.x >= ML::kConsumerThreads) {
    for (int b = cp.req_begin; b <= cp.req_end; ++b) {
      dm.b = b;
      const RequestPlan rq = p.ws.requests[b];
      ml.produce(ml.range(rq, piece_of(p.shape, rq, cta, per_cta)), st);
    }
  } else {
    for (int b = cp.req_begin; b <= cp.req_end; ++b) {
      dm.b = b;
      const RequestPlan rq = p.ws.requests[b];
      const Piece pc = piece_of(p.shape, rq, cta, per_cta);
      ml.consume(rq, pc, ml.range(rq, pc), st);
    }
  }
#else
  (void)p;
#endif
}

}  // namespace mlakit::detail

#endif  // MLAKIT_PLATFORM_CUDA
