#pragma once
// Hopper mainloop of the 64-row policy (sm_90a device code only; other targets run the
// mma.sync mainloop of decode_kernel.hpp with the same arguments, plan and workspace).
//
// 256 threads = two warpgroups. Per KV tile of 64 tokens:
//   warpgroup w: S[:, 32w .. 32w+32) = Q K^T with wgmma m64n32k16 (Q, K in shared memory)
//   row max of its 32 keys -> sRed; barrier; m_new from both halves
//   P = exp2(S - m_new) -> sP (a K-major 64 x 64 tile); O *= alpha; barrier
//   O[:, 256w .. 256w+256) += P V with wgmma m64n256k16 (P from sP, V the transposed view of
//   the KV tile's first 512 columns), issued asynchronously
//   next tile into the other stage; barrier; S of the next tile issued behind P V
// Each warpgroup sums l over its own keys; the epilogue adds the two halves.
//
// Shared memory (128-byte swizzle, every tile 1024-byte aligned): Q [64 x 576] and two KV
// stages [64 x 576], each stored as nine 64-column chunks of [64 rows][128 B] (16-byte unit u
// of row r at u ^ (r & 7)); P [64 x 64]; sRed [2][64]; the Q row scales (e4m3 operand mode).
// KV: 16-bit KV of the Q type is copied with cp.async; e4m3fn (f16 compute) and e4m3fnuz are
// prefetched into registers one tile ahead and converted on their way into the stage; other
// 16-bit KV is loaded and converted after the tile's P V is issued. A stage is rewritten only
// after the barrier that both warpgroups reach past their wgmma wait for the P V reading it.
#include <cstdint>

#include "../arch/convert.hpp"
#include "../arch/copy_atom.hpp"
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

template <class Tr>
struct WgmmaMainloop {
  using T = typename Tr::T;
  using Tq = typename Tr::Tq;
  using W = arch::Wgmma<T>;
  using Copy = typename Tr::Copy;
  using Tile = Swizzle128Tile<64>;
  static constexpr int kChunkBytes = Tile::kChunkBytes;  // 64 rows x 64 columns
  static constexpr int kTileBytes = 9 * kChunkBytes;     // 64 rows x 576 columns
  static constexpr int kThreads = 256;
  static constexpr int kRawChunks = kHeadDimQK / 16;  // 16-byte chunks of an fp8 row
  static constexpr int kUnits = kHeadDimQK / 8;       // 16-byte units of a 16-bit row
  // KV copies: four threads per token (one page lookup per thread and tile), thread `sub`
  // takes the token's chunks sub, sub + 4, ...
  static constexpr int kThreadsPerToken = kThreads / 64;
  static constexpr int kFp8PerThread = kRawChunks / kThreadsPerToken;  // 9
  static constexpr int kUnitsPerThread = kUnits / kThreadsPerToken;    // 18
  static_assert(Tr::kRows == 64 && Tr::kThreads == kThreads, "warpgroup layout");
  static_assert(Tr::kSmemBytes >= 3 * kTileBytes + Tr::kScaleBytes, "shared memory");

  DecodeMainloop<Tr>& m;

  __device__ unsigned char* sQ() const { return m.smem; }
  __device__ unsigned char* sKv(int stage) const { return m.smem + (1 + stage) * kTileBytes; }
  __device__ unsigned char* sP() const { return m.smem + 3 * kTileBytes; }
  __device__ float* sRed() const {
    return reinterpret_cast<float*>(m.smem + 3 * kTileBytes + kChunkBytes);
  }

  // Byte offset of 16-byte unit `unit` (8 values, 0..71) of row `r` in a swizzled tile.
  __device__ static int unit_offset(int r, int unit) { return Tile::unit_offset(r, unit); }

  __device__ void load_q() const {
    if constexpr (Tr::kFp8Operands) {
      unsigned char* q = sQ();
      m.load_q_scaled([&](int r, int blk, const std::uint32_t(&w)[8]) {
        *reinterpret_cast<uint4*>(q + unit_offset(r, 2 * blk)) = uint4{w[0], w[1], w[2], w[3]};
        *reinterpret_cast<uint4*>(q + unit_offset(r, 2 * blk + 1)) = uint4{w[4], w[5], w[6], w[7]};
      });
    } else {
      const DecodeArgs& a = m.p.a;
      for (int c = threadIdx.x; c < 64 * kUnits; c += kThreads) {
        const int r = c / kUnits, u = c % kUnits;
        const int row = m.row0 + r;
        const bool valid = row < m.rows;
        const Tq* src = static_cast<const Tq*>(a.q);
        if (valid) {
          const int t = row / m.heads, h = row - t * m.heads;
          src += m.b * a.q_stride_batch + t * a.q_stride_token + h * a.q_stride_head + u * 8;
        }
        Copy::copy16(sQ() + unit_offset(r, u), src, valid);
      }
      Copy::commit();
    }
  }

  // 16-bit KV of the compute type: cp.async of tile [kt, kt + 64) into `stage`.
  __device__ void copy_kv(int kt, int kv_end, int stage) const {
    unsigned char* dst = sKv(stage);
    const int tok = threadIdx.x / kThreadsPerToken, sub = threadIdx.x % kThreadsPerToken;
    const int j = kt + tok;
    const bool valid = j < kv_end;
    const unsigned char* src = valid ? m.kv_row(j) : static_cast<const unsigned char*>(m.p.a.kv);
#pragma unroll
    for (int i = 0; i < kUnitsPerThread; ++i) {
      const int u = sub + i * kThreadsPerToken;
      Copy::copy16(dst + unit_offset(tok, u), src + (valid ? u * 16 : 0), valid);
    }
    Copy::commit();
  }

  // fp8 KV: this thread's nine raw chunks of tile [kt, kt + 64) into registers.
  __device__ void fetch_fp8(int kt, int kv_end, uint4 (&raw)[kFp8PerThread]) const {
    const int tok = threadIdx.x / kThreadsPerToken, sub = threadIdx.x % kThreadsPerToken;
    const int j = kt + tok;
    if (j < kv_end) {
      const uint4* src = reinterpret_cast<const uint4*>(m.kv_row(j));
#pragma unroll
      for (int i = 0; i < kFp8PerThread; ++i) raw[i] = __ldg(src + sub + i * kThreadsPerToken);
    } else {
#pragma unroll
      for (int i = 0; i < kFp8PerThread; ++i) raw[i] = uint4{0, 0, 0, 0};
    }
  }

  // fp8 KV: converts the registers of fetch_fp8 into `stage`.
  __device__ void store_fp8(const uint4 (&raw)[kFp8PerThread], int stage) const {
    unsigned char* dst = sKv(stage);
    const int tok = threadIdx.x / kThreadsPerToken, sub = threadIdx.x % kThreadsPerToken;
#pragma unroll
    for (int i = 0; i < kFp8PerThread; ++i) {
      const int ch = sub + i * kThreadsPerToken;
      uint4 lo, hi;
      if constexpr (Tr::kFp8Operands) {  // e4m3fn -> f16: the hardware converter
        const std::uint32_t w[4] = {raw[i].x, raw[i].y, raw[i].z, raw[i].w};
        std::uint32_t o[8];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          o[2 * k] = arch::MmaAtom<T>::e4m3x2_to_f16x2(w[k] & 0xFFFFu);
          o[2 * k + 1] = arch::MmaAtom<T>::e4m3x2_to_f16x2(w[k] >> 16);
        }
        lo = uint4{o[0], o[1], o[2], o[3]};
        hi = uint4{o[4], o[5], o[6], o[7]};
      } else {
        arch::convert_fp8x16<T>(m.kv, raw[i], lo, hi);
      }
      *reinterpret_cast<uint4*>(dst + unit_offset(tok, 2 * ch)) = lo;
      *reinterpret_cast<uint4*>(dst + unit_offset(tok, 2 * ch + 1)) = hi;
    }
  }

  // 16-bit KV of the other type: load, convert and store tile [kt, kt + 64) into `stage`.
  __device__ void convert_kv16(int kt, int kv_end, int stage) const {
    unsigned char* dst = sKv(stage);
    const int tok = threadIdx.x / kThreadsPerToken, sub = threadIdx.x % kThreadsPerToken;
    const int j = kt + tok;
    const uint4* src = j < kv_end ? reinterpret_cast<const uint4*>(m.kv_row(j)) : nullptr;
    for (int i = 0; i < kUnitsPerThread; ++i) {
      const int u = sub + i * kThreadsPerToken;
      const uint4 raw = src != nullptr ? __ldg(src + u) : uint4{0, 0, 0, 0};
      *reinterpret_cast<uint4*>(dst + unit_offset(tok, u)) = arch::convert_16x8<T>(m.kv, raw);
    }
  }

  // Issues S[:, 32 wg ..] = Q K[32 wg .., :]^T over 576 for the tile at kv_addr.
  __device__ static void issue_s_half(float (&s)[16], std::uint32_t q_addr, std::uint32_t kv_addr,
                                      int wg) {
    arch::wgmma_fence();
#pragma unroll
    for (int k = 0; k < 36; ++k) {
      const std::uint32_t off = (k >> 2) * kChunkBytes + (k & 3) * 32;
      W::mma_ss_n32(s, arch::wgmma_desc(q_addr + off, 16, 1024),
                    arch::wgmma_desc(kv_addr + wg * 32 * 128 + off, 16, 1024), k > 0);
    }
    arch::wgmma_commit();
  }

  __device__ void run(const RequestPlan& rq, const Piece& pc) {
    const int lane = lane_id(), warp = warp_id();
    const int wg = warp / 4, wi = warp % 4;
    const int g = lane >> 2, t = lane & 3;
    const int L = rq.kv_len;
    const int rows = m.rows, row0 = m.row0, heads = m.heads, q_len = m.q_len;
    const bool causal = m.causal;
    const int last_row = (row0 + 64 < rows ? row0 + 64 : rows) - 1;
    const int vis_last = visible_keys(L, q_len, last_row / heads, causal);
    const int kv_begin = pc.kv_begin;
    const int kv_end = pc.kv_end < vis_last ? pc.kv_end : vis_last;
    const int n_tiles = kv_end > kv_begin ? (kv_end - kv_begin + 63) / 64 : 0;
    const int vis_first = visible_keys(L, q_len, row0 / heads, causal);
    const int mask_from = kv_end < vis_first ? kv_end : vis_first;
    const bool fp8 = m.kv_bytes == 1;
    const bool direct = Tr::kDirect;

    // This thread's rows: 16 wi + g (slot 0) and 16 wi + g + 8 (slot 1) of the tile.
    float m_run[2], l_run[2], sc[2] = {m.p.scale_log2, m.p.scale_log2};
    int row_limit[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m_run[h] = neg_inf();
      l_run[h] = 0.0f;
      const int row = row0 + 16 * wi + g + 8 * h;
      const int v = visible_keys(L, q_len, row / heads, causal);
      row_limit[h] = v < kv_end ? v : kv_end;
    }
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;

    if (n_tiles > 0) {
      load_q();
      uint4 raw[kFp8PerThread];
      if (direct) {
        copy_kv(kv_begin, kv_end, 0);
      } else if (fp8) {
        fetch_fp8(kv_begin, kv_end, raw);
        store_fp8(raw, 0);
      } else {
        convert_kv16(kv_begin, kv_end, 0);
      }
      Copy::template wait<0>();  // Q (and the first tile when copied)
      arch::fence_proxy_async_smem();
      block_sync();
      if constexpr (Tr::kFp8Operands) {
#pragma unroll
        for (int h = 0; h < 2; ++h) sc[h] *= m.sQScale(16 * wi + g + 8 * h);
      }
      const std::uint32_t q_addr = smem_u32(sQ());

      // Warpgroup wg computes S for keys [32 wg, 32 wg + 32) of the tile; the row max goes
      // through sRed, P through sP (a K-major 64 x 64 tile), and O[:, 256 wg ..] += P V reads
      // both from shared memory. S(it) is issued before iteration it.
      float s[16];
      const std::uint32_t p_addr = smem_u32(sP());
      issue_s_half(s, q_addr, smem_u32(sKv(0)), wg);
      for (int it = 0; it < n_tiles; ++it) {
        const int stage = it & 1;
        const int kt = kv_begin + it * 64;
        const bool has_next = it + 1 < n_tiles;
        if (has_next && !direct && fp8) fetch_fp8(kt + 64, kv_end, raw);
        arch::wgmma_wait<0>();  // this warpgroup's S(it) and PV(it - 1)

        // s[i]: row slot (i >> 1) & 1, key 32 wg + 8 (i >> 2) + 2t + (i & 1).
        const bool need_mask = kt + 64 > mask_from;
        // Scores go to x[]: s stays defined only by wgmma (no register redefinition while
        // P V is in flight, which would make ptxas serialise the wgmma pipeline).
        float mt[2] = {neg_inf(), neg_inf()}, x[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          const int h = (i >> 1) & 1;
          x[i] = s[i] * sc[h];
          if (need_mask) {
            const int key = kt + 32 * wg + 8 * (i >> 2) + 2 * t + (i & 1);
            if (key >= row_limit[h]) x[i] = neg_inf();
          }
          mt[h] = fmaxf(mt[h], x[i]);
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          mt[h] = fmaxf(mt[h], shfl_xor(mt[h], 1));
          mt[h] = fmaxf(mt[h], shfl_xor(mt[h], 2));
          if (t == 0) sRed()[wg * 64 + 16 * wi + g + 8 * h] = mt[h];
        }
        // Both warpgroups are past their PV(it - 1): stage ^ 1 and sP may be rewritten.
        block_sync();
        if (has_next && direct) copy_kv(kt + 64, kv_end, stage ^ 1);
        float m_use[2], alpha[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float other = sRed()[(wg ^ 1) * 64 + 16 * wi + g + 8 * h];
          const float m_new = fmaxf(m_run[h], fmaxf(mt[h], other));
          m_use[h] = m_new == neg_inf() ? 0.0f : m_new;
          alpha[h] = fast_exp2(m_run[h] - m_use[h]);
          m_run[h] = m_new;
        }
        float lsum[2] = {0.0f, 0.0f};
        unsigned char* sp = sP();
#pragma unroll
        for (int i = 0; i < 16; i += 2) {
          const int h = (i >> 1) & 1;
          const float p0 = fast_exp2(x[i] - m_use[h]), p1 = fast_exp2(x[i + 1] - m_use[h]);
          lsum[h] += p0 + p1;
          const int r = 16 * wi + g + 8 * h, k = 32 * wg + 8 * (i >> 2) + 2 * t;
          *reinterpret_cast<std::uint32_t*>(sp + r * 128 + ((((k >> 3) ^ (r & 7))) << 4) +
                                            (k & 7) * 2) = arch::pack2<T>(p0, p1);
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) l_run[h] = l_run[h] * alpha[h] + lsum[h];
        if (!(alpha[0] == 1.0f && alpha[1] == 1.0f)) {
#pragma unroll
          for (int i = 0; i < 128; ++i) o[i] *= alpha[(i >> 1) & 1];
        }
        arch::fence_proxy_async_smem();
        block_sync();  // sP complete; sRed may be rewritten

        const std::uint32_t kv_addr = smem_u32(sKv(stage));
        arch::wgmma_fence();
#pragma unroll
        for (int j = 0; j < 4; ++j)
          W::mma_ss_n256_tb(
              o, arch::wgmma_desc(p_addr + j * 32, 16, 1024),
              arch::wgmma_desc(kv_addr + 4 * wg * kChunkBytes + j * 2048, kChunkBytes, 1024), true);
        arch::wgmma_commit();

        if (has_next) {
          if (direct)
            Copy::template wait<0>();
          else if (fp8)
            store_fp8(raw, stage ^ 1);
          else
            convert_kv16(kt + 64, kv_end, stage ^ 1);
          arch::fence_proxy_async_smem();
        }
        block_sync();  // tile it + 1 is in stage ^ 1
        if (has_next) issue_s_half(s, q_addr, smem_u32(sKv(stage ^ 1)), wg);
      }
      arch::wgmma_wait<0>();
    }
    epilogue(pc, m_run, l_run, o, wg, wi, g, t);
  }

  __device__ void epilogue(const Piece& pc, const float* m_run, const float* l_run,
                           const float (&o)[128], int wg, int wi, int g, int t) const {
    const DecodeArgs& a = m.p.a;
    float inv[2], lse[2], lw[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      lw[h] = l_run[h];
      lw[h] += shfl_xor(lw[h], 1);
      lw[h] += shfl_xor(lw[h], 2);
      if (t == 0) sRed()[wg * 64 + 16 * wi + g + 8 * h] = lw[h];
    }
    block_sync();  // each warpgroup summed its own keys
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = 16 * wi + g + 8 * h;
      const float l = sRed()[r] + sRed()[64 + r];
      inv[h] = l > 0.0f ? m.p.out_scale / l : 0.0f;
      lse[h] = lse_from_state(m_run[h], l);
    }
    const bool split = pc.partial_slot >= 0;
#pragma unroll
    for (int i = 0; i < 128; i += 2) {
      const int h = (i >> 1) & 1;
      const int row = m.row0 + 16 * wi + g + 8 * h;
      if (row >= m.rows) continue;
      const int col = 256 * wg + 8 * (i >> 2) + 2 * t;
      const float v0 = o[i] * inv[h], v1 = o[i + 1] * inv[h];
      if (split) {
        float* dst = m.p.ws.partial_o +
                     (std::int64_t(pc.partial_slot) * m.p.ws.rows_padded + row) * kHeadDimV + col;
        *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
      } else {
        const int tk = row / m.heads, hd = row - tk * m.heads;
        Tq* dst = static_cast<Tq*>(a.out) + m.b * a.o_stride_batch + tk * a.o_stride_token +
                  hd * a.o_stride_head + col;
        *reinterpret_cast<std::uint32_t*>(dst) = arch::pack2<Tq>(v0, v1);
      }
    }
    if (wg == 0 && t == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m.row0 + 16 * wi + g + 8 * h;
        if (row >= m.rows) continue;
        if (split) {
          m.p.ws.partial_lse[std::int64_t(pc.partial_slot) * m.p.ws.rows_padded + row] = lse[h];
        } else if (a.lse != nullptr) {
          const int tk = row / m.heads, hd = row - tk * m.heads;
          a.lse[m.b * a.lse_stride_batch + tk * a.lse_stride_token + hd * a.lse_stride_head] =
              lse[h];
        }
      }
    }
  }
};

}  // namespace mlakit::detail

#endif  // MLAKIT_PLATFORM_CUDA
