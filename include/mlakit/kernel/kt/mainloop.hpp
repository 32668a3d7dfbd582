#pragma once
// The keys-as-M mainloop, KtMainloopOf<Form>: the consumer schedules, the merge of two
// warpgroups' states and the end of a piece, shared by both KV forms. The layers, each a base
// of the next:
//   KtCommon   (kt/common.hpp)  shapes, shared-memory parts, piece range, barriers, page ids
//   KtSoftmax  (kt/softmax.hpp) running row statistics, P into shared memory, row totals
//   the form   KtRawFp8Form (kt/raw_fp8_form.hpp): e4m3fn KV widened in registers,
//              KtMatrixForm (kt/matrix_form.hpp): e4m3fn KV on e4m3 wgmma (fp8_matrix), or
//              KtChunkRingForm (kt/chunk_ring_form.hpp): 16-bit KV on a ring of 64-dim chunks
//   KtMainloopOf<Form> (here)
// A form supplies the KV ring's producer and the operands of the two products:
//   produce(r, st)        fills the ring with the range's tiles (kChunksPerTile positions each)
//   load_q()              Q into sQ (and the row scales into state.q_scale), fenced for wgmma
//   tile_kv(pipe, st)     the shared address the products of the tile at st read (where the
//                         form waits for whole tiles, after the wait)
//   issue_s(s, kv, ..)    S^T = K Q^T issued and committed; the caller waits
//   release_after_s(..)   what the tile's S^T alone read, released once it retired
//   issue_pv(o, kv, ..)   O^T += V^T P^T issued; releases what it read (16 and 32 rows)
//   pair_pv(o, pipe, ..)  64 rows: O^T += V^T P^T for both tiles of a pair, retired; releases
//                         both stages
//   write_output<Wg>(..)  the row totals, the normalised O^T and the LSE into the output
// The schedules: consume_tiles() (16 and 32 rows: each consumer warpgroup takes whole tiles,
// alternate ones with two, merged by merge() at the end of a piece) and consume_pairs() (64
// rows, e4m3fn only: the two warpgroups split the dims and take pairs of tiles; the form's
// pair_pv() multiplies both tiles' P by the warpgroup's half of V). Every tile
// advances the ring position `st` in every consumer warpgroup, so all follow the producer's
// order. KtMainloop<Tr> picks the form for the traits.
#include <cstdint>
#include <type_traits>

#include "../../arch/pipeline_sm90.hpp"
#include "../../core/attention_math.hpp"
#include "../../core/plan.hpp"
#include "../../platform/intrinsics.hpp"
#include "../../platform/platform.hpp"
#include "chunk_ring_form.hpp"
#include "matrix_form.hpp"
#include "raw_fp8_form.hpp"

#if defined(MLAKIT_HAS_SM90A_KERNELS)

namespace mlakit::detail {

template <class Form>
struct KtMainloopOf : Form {
  using Form::consumers_sync;
  using Form::kConsumerThreads;
  using Form::kMbOwn;
  using Form::kQ;
  using Form::kRows;
  using Form::kS;
  using Form::kSplitDims;
  using Form::kWg;
  using Form::ctx;
  using Form::ordered;
  using Form::owned_row;
  using Form::row_of;
  using Form::tiles;
  using Form::state;
  using Form::tile_p_bar;
  using typename Form::Pipeline;
  using typename Form::Range;
  using typename Form::Softmax;
  using typename Form::State;
  using Cfg = typename Form::Cfg;

  // One piece for consumer warpgroup w: tiles i with i % kWg == w (every tile advances the
  // ring position `st`, so both warpgroups follow the producer's order).
  __device__ void consume(const RequestPlan& rq, const Piece& pc, const Range& r, State& st,
                          int wg) {
    if constexpr (kSplitDims)
      consume_pairs(rq, pc, r, st, wg);
    else
      consume_tiles(rq, pc, r, st, wg);
  }
  // ---- 16 and 32 rows: each consumer warpgroup takes whole tiles ---------------------------

  // One piece for warpgroup wg: its tiles (alternate ones with two warpgroups), then the merge
  // of the two warpgroups' states and the epilogue. Per tile of keys [kt, kt + 64) at ring
  // position st: S^T, the softmax (row maxima through the warpgroup's tile_max slots of the
  // tile's parity), P into sP[w], O^T rescaled, then O^T += V^T P^T; every product of the tile
  // has retired before the next one's starts. (The loop body stays in this function: moved
  // into a helper, the compiler orders the kernels' code differently.)
  __device__ void consume_tiles(const RequestPlan& rq, const Piece& pc, const Range& r, State& st,
                                int wg) {
    const int w = kWg == 1 ? 0 : wg;
    const int lane = lane_id(), wi = warp_id() & 3;
    const int g = lane >> 2, t = lane & 3;
    const int L = rq.kv_len;
    const int vis_first = visible_keys(L, ctx.q_len, ctx.row0 / ctx.heads, ctx.causal);
    const int mask_from = r.kv_end < vis_first ? r.kv_end : vis_first;
    Softmax sm;
    start_rows(sm, L, r, t);
    float o[8][kS];
#pragma unroll
    for (int mb = 0; mb < 8; ++mb)
#pragma unroll
      for (int i = 0; i < kS; ++i) o[mb][i] = 0.0f;

    if (r.n_tiles > 0) {
      this->load_q();
      arch::named_sync(arch::NamedBarrier::consumers, kConsumerThreads);  // sQ complete
      const Pipeline pipe{state.bars};
      const std::uint32_t p_addr = smem_u32(tiles.p[w]);
      for (int i = 0; i < r.n_tiles; ++i, st.advance(Cfg::kChunksPerTile)) {
        if (kWg > 1 && i % kWg != w) continue;  // the other warpgroup's tile
        const int kt = r.kv_begin + 64 * i;
        const std::uint32_t kv = this->tile_kv(pipe, st);
        float s[kS];
        this->issue_s(s, kv, wi, lane, st);
        arch::wgmma_wait<0>();
        arch::fence_operand(s);
        this->release_after_s(pipe, st);
        float alpha[kQ];
        const bool moved =
            this->softmax(s, kt, kt + 64 > mask_from, w, wi, g, t, (i / kWg) & 1, sm, alpha);
        this->store_p(s, p_addr, wi, lane);
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
        this->issue_pv(o, kv, p_addr, wi, lane, st);
        arch::wgmma_wait<0>();
#pragma unroll
        for (int mb = 0; mb < 8; ++mb) arch::fence_operand(o[mb]);
      }
    }
    finish_tiles(pc, r, sm, o, w, wi, g, t);
  }

  // The running state of the thread's rows before the first tile: no key seen, and the keys
  // each row may see in the range (its causal limit).
  __device__ void start_rows(Softmax& sm, int L, const Range& r, int t) const {
#pragma unroll
    for (int q = 0; q < kQ; ++q) {
      sm.m_run[q] = neg_inf();
      sm.l_run[q] = 0.0f;
      const int row = ctx.row0 + row_of(q, t);
      const int v = visible_keys(L, ctx.q_len, row / ctx.heads, ctx.causal);
      sm.row_limit[q] = v < r.kv_end ? v : r.kv_end;
    }
    sm.m_own = neg_inf();
  }

  // The end of a piece: 32 rows gather each row's running max from the lane that owns it; two
  // warpgroups merge their states (each keeps half of the dims); then the epilogue.
  __device__ void finish_tiles(const Piece& pc, const Range& r, Softmax& sm, float (&o)[8][kS],
                               int w, int wi, int g, int t) const {
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

  // One piece, 64 rows: pair j is tiles A = 2 j and B = 2 j + 1 (range() pads an odd count
  // with a tile past the range, masked). Warpgroup w: S^T of tile 2 j + w -> row maxima
  // (NamedBarrier::tile_max, both warpgroups) -> P of its tile into sP[w], O^T *= alpha
  // (NamedBarrier::tile_p) -> P V of A and B for its 256 dims. Every warp of both warpgroups
  // releases each stage of the pair. The form takes whole tiles per stage (tile_kv() waits for
  // one) and issues the P V of half the dims (issue_pv()'s mb_base, kChained): e4m3fn only.
  __device__ void consume_pairs(const RequestPlan& rq, const Piece& pc, const Range& r, State& st,
                                int w) {
    const int lane = lane_id(), wi = warp_id() & 3;
    const int g = lane >> 2, t = lane & 3;
    const int L = rq.kv_len;
    const int vis_first = visible_keys(L, ctx.q_len, ctx.row0 / ctx.heads, ctx.causal);
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
      start_pair_rows(L, r);
      this->load_q();
      arch::named_sync(arch::NamedBarrier::consumers, kConsumerThreads);  // sQ, row limits
      const Pipeline pipe{state.bars};
      const std::uint32_t p0 = smem_u32(tiles.p[0]), p1 = smem_u32(tiles.p[1]);
      for (int j = 0; 2 * j < r.n_tiles; ++j) {
        State st_b = st;
        st_b.advance();
        const State st_own = w == 0 ? st : st_b;
        const int kt = r.kv_begin + 64 * (2 * j + w);
        float s[kS];
        this->issue_s(s, this->tile_kv(pipe, st_own), wi, lane, st_own);
        arch::wgmma_wait<0>();
        arch::fence_operand(s);
        this->softmax_pair(s, kt, kt + 64 > mask_from, w, wi, g, t, j & 1, l_run, o);
        this->store_p(s, w == 0 ? p0 : p1, wi, lane);
        arch::fence_proxy_async_smem();
        arch::named_sync(arch::NamedBarrier::tile_p, kConsumerThreads);
        this->pair_pv(o, pipe, st, st_b, p0, p1, w, wi, lane);
        st.advance();
        st.advance();
      }
    }
    // The last pair's running max (written before its NamedBarrier::tile_p).
    Softmax sm;
#pragma unroll
    for (int q = 0; q < kQ; ++q) {
      sm.m_run[q] = r.n_tiles > 0 ? state.m_run[((r.n_tiles >> 1) - 1) & 1][row_of(q, t)] : neg_inf();
      sm.l_run[q] = l_run[q];
    }
    if (w == 0)
      epilogue<0>(pc, sm, o, wi, g, t);
    else
      epilogue<1>(pc, sm, o, wi, g, t);
  }

  // The shared row state before the first pair: each row's causal limit in the range, no
  // running max (read by pair 0) and pair 0's maxima started at -inf.
  __device__ void start_pair_rows(int L, const Range& r) const {
    for (int n = static_cast<int>(threadIdx.x); n < kRows; n += kConsumerThreads) {
      const int v = visible_keys(L, ctx.q_len, (ctx.row0 + n) / ctx.heads, ctx.causal);
      state.row_limit[n] = v < r.kv_end ? v : r.kv_end;
      state.m_run[1][n] = neg_inf();
      state.pair_max[0][n] = ordered(neg_inf());
    }
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
    float4* const buf = reinterpret_cast<float4*>(tiles.q);
    constexpr int kF4 = kS / 4;            // float4 per accumulator and thread
    constexpr int kBuf = kWg * kF4 * 128;  // float4 per buffer
    auto slot = [&](int buffer, int wg, int v) {
      return buf + buffer * kBuf + (wg * kF4 + v) * 128 + ltid;
    };
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
          o[kKeep + k][i] =
              Wg == 0 ? mine * f0[q] + other[e] * f1[q] : other[e] * f0[q] + mine * f1[q];
        }
      }
    }
  }

  // Normalises and stores the dims blocks mb in [8 Wg / kWg, 8 (Wg + 1) / kWg) of O^T (every
  // block with one consumer warpgroup; warpgroup Wg's merged half with two); warpgroup 0
  // writes the LSE.
  template <int Wg>
  __device__ void epilogue(const Piece& pc, const Softmax& sm, const float (&o)[kMbOwn][kS], int wi,
                           int g, int t) const {
    this->template write_output<Wg>(pc, sm, o, wi, g, t);
    // sQ (the exchange buffers) and row_sum are rewritten by the next piece only after every
    // consumer is here.
    consumers_sync();
  }
};

// The mainloop of the traits' KV form: e4m3fn KV widened in registers (or, in the fp8 matrix
// mode, read by e4m3 wgmma as it is), or 16-bit KV of the Q type on a ring of chunks.
template <class Tr>
using KtMainloop = KtMainloopOf<std::conditional_t<
    Tr::kFp8Matrix, KtMatrixForm<Tr>,
    std::conditional_t<Tr::kFp8Operands, KtRawFp8Form<Tr>, KtChunkRingForm<Tr>>>>;

}  // namespace mlakit::detail

#endif  // MLAKIT_HAS_SM90A_KERNELS
