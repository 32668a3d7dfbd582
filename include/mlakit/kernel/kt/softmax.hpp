#pragma once
// The softmax layer of the keys-as-M mainloop, shared by both forms: the running row
// statistics over transposed score tiles (S^T: keys are M, rows are N), P into shared memory
// as the B operand of O^T += V^T P^T, and the row totals of the epilogue.
//   16 and 32 rows (softmax()): each consumer warpgroup owns whole tiles; the four warps'
//     row maxima meet in state.tile_max (named barrier tile_max_bar(w)), and P = 2^(s - base)
//     with a running max that moves only when it must (lazy_running_max).
//   64 rows (softmax_pair()): the two warpgroups' tiles of a pair share the row maxima through
//     state.pair_max, so both form the same running max; O^T is rescaled where a row moved it.
// Every per-row value is formed once per row by the lane that owns it after the transposed
// reduction (row_max_transposed) and handed to the lanes that hold the row through shared
// memory.
#include <cstdint>

#include "../../arch/convert.hpp"
#include "../../arch/pipeline_sm90.hpp"
#include "../../core/attention_math.hpp"
#include "../../core/plan.hpp"
#include "../../platform/intrinsics.hpp"
#include "../../platform/platform.hpp"
#include "common.hpp"

#if defined(MLAKIT_HAS_SM90A_KERNELS)

namespace mlakit::detail {

// Template parameters as KtCommon's. Softmax is the running state of a consumer thread's kQ
// rows; the functions take a warp's accumulator fragments (s, o) and the thread's coordinates
// (w: warpgroup, wi: warp in it, g = lane / 4, t = lane % 4).
template <class Tr, class Tc_, int KvBytes>
struct KtSoftmax : KtCommon<Tr, Tc_, KvBytes> {
  using Base = KtCommon<Tr, Tc_, KvBytes>;
  using Base::consumers_sync;
  using Base::kConsumerThreads;
  using Base::kMbOwn;
  using Base::kQ;
  using Base::kRows;
  using Base::kS;
  using Base::kSplitDims;
  using Base::ctx;
  using Base::state;
  using Base::tile_max_bar;
  using typename Base::Tc;

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
    return fmaxf(fmaxf(state.tile_max[par][w][0][n], state.tile_max[par][w][1][n]),
                 fmaxf(state.tile_max[par][w][2][n], state.tile_max[par][w][3][n]));
  }

  // The softmax of warpgroup w's tile (16 and 32 rows). s[i]: key 16 wi + g + 8 ((i >> 1) & 1),
  // row n(q), q = 2 (i >> 2) + (i & 1). Returns whether any of the thread's rows moved its
  // running max (alpha != 1; lazy_running_max keeps it otherwise).
  __device__ bool softmax(float (&s)[kS], int kt, bool need_mask, int w, int wi, int g, int t,
                          int par, Softmax& sm, float (&alpha)[kQ]) const {
    publish_tile_max(s, kt, need_mask, w, wi, g, t, par, sm);
    arch::named_sync(tile_max_bar(w), 128);
    if constexpr (kRows == 32) {
      exponentiate_owned_rows(s, w, wi, g, t, par, sm, alpha);
      return true;  // 32 rows rescale every tile
    } else {
      return exponentiate_rows(s, w, t, par, sm, alpha);
    }
  }
  // Scales the scores by their row's scale, masks keys at or past a row's limit, and writes
  // the warp's row maxima to state.tile_max[par][w][wi].
  __device__ void publish_tile_max(float (&s)[kS], int kt, bool need_mask, int w, int wi, int g,
                                   int t, int par, const Softmax& sm) const {
    float mt[kQ];
#pragma unroll
    for (int q = 0; q < kQ; ++q) mt[q] = neg_inf();
#pragma unroll
    for (int i = 0; i < kS; ++i) {
      const int q = 2 * (i >> 2) + (i & 1), h = (i >> 1) & 1;
      s[i] *= state.q_scale[row_of(q, t)];
      if (need_mask && kt + 16 * wi + g + 8 * h >= sm.row_limit[q]) s[i] = neg_inf();
      mt[q] = fmaxf(mt[q], s[i]);
    }
    if constexpr (kQ >= 8) {
      row_max_transposed(mt, lane_id());
#pragma unroll
      for (int i = 0; i < kQ / 8; ++i) state.tile_max[par][w][wi][owned_row(i, g, t)] = mt[i];
    } else {
#pragma unroll
      for (int q = 0; q < kQ; ++q) {
        mt[q] = warp_row_max(mt[q]);
        if (g == 0) state.tile_max[par][w][wi][row_of(q, t)] = mt[q];
      }
    }
  }
  // 32 rows: each lane forms the running max of the row it owns (kept in sm.m_own), its
  // exponent base and alpha, and hands base and alpha to the lanes of its warp that hold the
  // row (row_of(q, t) is owned by lane 4 q + t) through state.row_exp32: formed once per row, not
  // by every thread for each of its rows. Then P = 2^(s - base) and l = l alpha + P.
  __device__ void exponentiate_owned_rows(float (&s)[kS], int w, int wi, int g, int t, int par,
                                          Softmax& sm, float (&alpha)[kQ]) const {
    const int n = owned_row(0, g, t);
    const float m_new = lazy_running_max(sm.m_own, warps_row_max(par, w, n));
    const float base = exp_base(m_new);
    state.row_exp32[w][wi][lane_id()] = make_float2(base, fast_exp2(sm.m_own - base));
    sm.m_own = m_new;
    __syncwarp();  // orders the row_exp32 stores before the warp's loads
#pragma unroll
    for (int q = 0; q < kQ; ++q) {
      const float2 x = state.row_exp32[w][wi][4 * q + t];
      alpha[q] = x.y;
      sm.l_run[q] *= x.y;
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // s[i] of row q: i = 4 (q >> 1) + (q & 1) + 2 h
        const int i = 4 * (q >> 1) + (q & 1) + 2 * h;
        s[i] = fast_exp2(s[i] - x.x);
        sm.l_run[q] += s[i];
      }
    }
  }
  // 16 rows: every thread forms the running max, alpha and P of each of its rows. Returns
  // whether any of them moved its running max.
  __device__ bool exponentiate_rows(float (&s)[kS], int w, int t, int par, Softmax& sm,
                                    float (&alpha)[kQ]) const {
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
      arch::stsm_x4<true>(base + 16 * 128 * k, v[0], v[1], v[2], v[3]);
    }
  }

  // ---- 64 rows: the two warpgroups split the dims and work on pairs of tiles -------------

  // Floats as ints of the same order (negative values: the magnitude bits flipped), so that
  // integer atomicMax in shared memory takes the maximum of floats.
  __device__ static int ordered(float f) {
    const int b = __float_as_int(f);
    return b >= 0 ? b : b ^ 0x7FFFFFFF;
  }
  __device__ static float from_ordered(int b) {
    return __int_as_float(b >= 0 ? b : b ^ 0x7FFFFFFF);
  }

  // The softmax of warpgroup w's tile of a pair. The row maxima of the pair's two tiles and the
  // previous running max meet in state.pair_max[par] (shared atomicMax of ordered ints, started
  // at the previous max), so both warpgroups read the same maximum and take the same running
  // max from it (lazy_running_max); l stays per thread (own keys).
  // The scores stay unscaled until the exponent: the row scale sc (scale_log2 x 2^-e of Q's
  // row) is positive, so the maximum of the scaled scores is sc times the maximum of the raw
  // ones (rounding is monotonic), and P = 2^(s sc - m) is one fma per score. The mask only on
  // the tiles that reach a row's limit, under a branch (uniform per tile).
  __device__ void softmax_pair(float (&s)[kS], int kt, bool need_mask, int w, int wi, int g, int t,
                               int par, float (&l_run)[kQ], float (&o)[kMbOwn][kS]) const {
    if (need_mask) mask_pair_tile(s, kt, wi, g, t);
    publish_pair_max(s, g, t, par);
    arch::named_sync(arch::NamedBarrier::tile_max, kConsumerThreads);
    bool wide;
    const bool moved = hand_over_row_exp(w, wi, g, t, par, wide);
    // Row pair (8 q2 + 2 t, + 1) was formed by lane 4 q2 + t.
    const float4* const rx = state.row_exp[4 * w + wi];
    if (wide) round_products(s, t);
    exponentiate_pair(s, rx, t, wide, l_run);
    if (moved) rescale_pair(o, rx, t);
  }
  // Keys at or past a row's limit (state.row_limit) to -inf.
  __device__ void mask_pair_tile(float (&s)[kS], int kt, int wi, int g, int t) const {
#pragma unroll
    for (int q2 = 0; q2 < kQ / 2; ++q2) {  // rows 8 q2 + 2 t and + 1: q = 2 q2, 2 q2 + 1
      const int2 l2 = *reinterpret_cast<const int2*>(&state.row_limit[8 * q2 + 2 * t]);
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (kt + 16 * wi + g + 8 * h >= (e == 0 ? l2.x : l2.y)) s[4 * q2 + 2 * h + e] = neg_inf();
    }
  }
  // The tile's scaled row maxima into state.pair_max[par]: each lane's two owned rows after the
  // transposed reduction.
  __device__ void publish_pair_max(const float (&s)[kS], int g, int t, int par) const {
    float mt[kQ];
#pragma unroll
    for (int q = 0; q < kQ; ++q) mt[q] = neg_inf();
#pragma unroll
    for (int i = 0; i < kS; ++i) {
      const int q = 2 * (i >> 2) + (i & 1);
      mt[q] = fmaxf(mt[q], s[i]);
    }
    row_max_transposed(mt, lane_id());
    // The two rows this lane owns now are adjacent: owned_row(0, g, t) = 8 g + 2 t.
    const int n = owned_row(0, g, t);
    const float2 sc = *reinterpret_cast<const float2*>(&state.q_scale[n]);
    atomicMax(&state.pair_max[par][n], ordered(mt[0] * sc.x));
    atomicMax(&state.pair_max[par][n + 1], ordered(mt[1] * sc.y));
  }
  // The previous max is state.m_run[par ^ 1]; this pair's is lazy_running_max of it and the
  // pair's max. Each lane forms it for the two rows it owned in the reduction (n = 8 g + 2 t,
  // n + 1) with their exponent base and alpha = 2^(m_old - base) (exactly 1 where the max
  // stayed), and hands them to the lanes of its warp that hold those rows through
  // state.row_exp[warp][lane] (formed once per row, not by every thread for each of its 16
  // rows). Warp 0 of warpgroup 0 writes the max to state.m_run[par] and starts the next
  // pair's state.pair_max[par ^ 1] at it (both were last read before the previous pair's
  // NamedBarrier::tile_p). Returns whether a row of the warp moved its max.
  // `wide`: whether a row of the warp has |base| >= kWideBase (see exponentiate_pair).
  __device__ bool hand_over_row_exp(int w, int wi, int g, int t, int par, bool& wide) const {
    bool lane_moved, lane_wide;
    {
      const int n = owned_row(0, g, t);
      const float2 m_old = *reinterpret_cast<const float2*>(&state.m_run[par ^ 1][n]);
      const int2 pm = *reinterpret_cast<const int2*>(&state.pair_max[par][n]);
      const float2 m_new = make_float2(lazy_running_max(m_old.x, from_ordered(pm.x)),
                                       lazy_running_max(m_old.y, from_ordered(pm.y)));
      const float2 base = make_float2(exp_base(m_new.x), exp_base(m_new.y));
      state.row_exp[4 * w + wi][lane_id()] =
          make_float4(base.x, base.y, fast_exp2(m_old.x - base.x), fast_exp2(m_old.y - base.y));
      lane_moved = m_new.x != m_old.x || m_new.y != m_old.y;
      lane_wide = !(fabsf(base.x) < kWideBase && fabsf(base.y) < kWideBase);
      if (w == 0 && wi == 0) {
        *reinterpret_cast<float2*>(&state.m_run[par][n]) = m_new;
        *reinterpret_cast<int2*>(&state.pair_max[par ^ 1][n]) =
            make_int2(ordered(m_new.x), ordered(m_new.y));
      }
    }
    const bool moved = __any_sync(0xffffffffu, lane_moved);
    wide = __any_sync(0xffffffffu, lane_wide);
    __syncwarp();  // orders the row_exp stores before the warp's loads
    return moved;
  }
  // s = s sc rounded (a warp with a wide row; exponentiate_pair then takes sc = 1).
  __device__ void round_products(float (&s)[kS], int t) const {
#pragma unroll
    for (int q2 = 0; q2 < kQ / 2; ++q2) {
      const float2 sc2 = *reinterpret_cast<const float2*>(&state.q_scale[8 * q2 + 2 * t]);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int i0 = 4 * q2 + e;
        s[i0] = __fmul_rn(s[i0], e == 0 ? sc2.x : sc2.y);
        s[i0 + 2] = __fmul_rn(s[i0 + 2], e == 0 ? sc2.x : sc2.y);
      }
    }
  }
  // P = 2^(s sc - base), l = l alpha + P (alpha = 1 unless the row's max moved), with the
  // warp's row_exp rx. The max (publish_pair_max) is the rounded product max(s) x sc; the fma
  // s sc - base differs from it by up to half an ulp of base, which stays below 1 while
  // |base| < kWideBase (P at most 2^(kRescaleSlack + 1)). Rows of Q far outside the f16 range
  // (scaled scores near 2^40, base 2) would take P = 2^(+-2^16) from it, so a warp with such
  // a row rounds its products first (round_products) and exponentiates them with sc = 1
  // (`rounded`), as the max was formed: one exponential loop for both cases, so the loop's
  // code and registers stay those of the fma form.
  __device__ void exponentiate_pair(float (&s)[kS], const float4* rx, int t, bool rounded,
                                    float (&l_run)[kQ]) const {
#pragma unroll
    for (int q2 = 0; q2 < kQ / 2; ++q2) {
      const float4 x = rx[4 * q2 + t];
      const float2 sc2 = *reinterpret_cast<const float2*>(&state.q_scale[8 * q2 + 2 * t]);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float base = e == 0 ? x.x : x.y, alpha = e == 0 ? x.z : x.w;
        const float sc = rounded ? 1.0f : (e == 0 ? sc2.x : sc2.y);
        // s[i] and o[mb][i] of row q = 2 q2 + e: i = 4 q2 + e + 2 h
        const int i0 = 4 * q2 + e;
        const float p0 = fast_exp2(fmaf(s[i0], sc, -base));
        const float p1 = fast_exp2(fmaf(s[i0 + 2], sc, -base));
        s[i0] = p0, s[i0 + 2] = p1;
        l_run[2 * q2 + e] = fmaf(l_run[2 * q2 + e], alpha, p0 + p1);
      }
    }
  }
  // O^T *= alpha of each row (the warp's row_exp rx).
  __device__ static void rescale_pair(float (&o)[kMbOwn][kS], const float4* rx, int t) {
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

  // ---- the epilogue's row totals ------------------------------------------------------------
  // Each warp's l of the thread's rows into state.row_sum, then the consumers' barrier.
  template <int Wg>
  __device__ void publish_row_sums(const Softmax& sm, int wi, int g, int t) const {
#pragma unroll
    for (int q = 0; q < kQ; ++q) {
      float l = sm.l_run[q];
      l += shfl_xor(l, 4);
      l += shfl_xor(l, 8);
      l += shfl_xor(l, 16);
      if (g == 0) state.row_sum[Wg][wi][row_of(q, t)] = l;
    }
    consumers_sync();
  }
  // Row n's l over the four warps of warpgroup Wg (after publish_row_sums). Split dims: each
  // warpgroup summed the keys of its own tiles, so both form the same total of all eight.
  template <int Wg>
  __device__ float row_total(int n) const {
    return kSplitDims ? ((state.row_sum[0][0][n] + state.row_sum[0][1][n]) +
                         (state.row_sum[0][2][n] + state.row_sum[0][3][n])) +
                            ((state.row_sum[1][0][n] + state.row_sum[1][1][n]) +
                             (state.row_sum[1][2][n] + state.row_sum[1][3][n]))
                      : (state.row_sum[Wg][0][n] + state.row_sum[Wg][1][n]) +
                            (state.row_sum[Wg][2][n] + state.row_sum[Wg][3][n]);
  }
};

}  // namespace mlakit::detail

#endif  // MLAKIT_HAS_SM90A_KERNELS
