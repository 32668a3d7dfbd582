#pragma once
// The CDNA mainloop (AMD gfx90a / gfx942 / gfx950): every row of a row tile shares each KV
// tile, read once from memory into LDS and from there by every wave.
//
// Workgroup: RowGroups groups of 16 rows (one 16 x 16 MFMA tile) x ColSplit waves; the waves
// of a row group split the 512 V columns (ColSplit 2 for the 16-, 32- and 64-row forms: an
// O^T of 64 registers next to Q's 72 leaves room for two waves per SIMD, and their shapes,
// bound by memory or near it, afford S^T computed twice). Per piece of a request:
//   Q^T   [576 x 16 rows]   registers: each wave's B operand of S^T (36 k-steps x 2 VGPRs)
//   for each KV tile of 16 tokens (raw bytes of the next tile already in registers):
//     S^T [16 keys x 16 rows]  = K Q^T          A = K from LDS (4 dims of one key per lane)
//     online softmax per row   a row's 16 keys sit in lanes q, q + 16, q + 32, q + 48
//                              (4 each): in-lane, then xor 16 and xor 32
//     O^T [512 / ColSplit x 16] += V^T P^T       B = P^T: the S^T accumulator itself, packed
//                                                to 16 bits (the MFMA's C and B layouts are
//                                                the same); A = V^T from LDS: one 16-byte read
//                                                gives a lane 4 keys of two columns, the A
//                                                operands of an even- and an odd-column tile
//     barrier; the registers' tile converted to the compute type and stored to LDS; barrier
//   O^T / l -> out (unsplit) or the piece's partial slot; LSE
// Register and MFMA layouts are those of arch::MmaAtomMfma16 (lane l: g = l / 16, q = l % 16;
// A[i][k] at lane i + 16 (k / 4), element k % 4; B[k][j] at lane j + 16 (k / 4); C[i][j] at
// lane j + 16 (i / 4), element i % 4).
#include <cstdint>

#include "../arch/convert.hpp"
#include "../arch/mma_atom.hpp"
#include "../arch/tile_policy.hpp"
#include "../core/attention_math.hpp"
#include "../core/decode_args.hpp"
#include "../core/plan.hpp"
#include "../platform/intrinsics.hpp"
#include "planner_kernel.hpp"
#include "problem.hpp"
#include "workspace.hpp"

namespace mlakit::detail {

// A KV tile in LDS in the compute type, 16-bit values in pairs of dims: the 32-bit word of dim
// pair p (dims 2p, 2p + 1; the lower dim in the low half) of key k. A pair's keys are 16-byte
// chunks of 4 keys, the chunk index XOR-swizzled by the pair so that the V^T reads of 16 lanes
// (16 consecutive pairs, one chunk each) spread evenly over the banks:
//   K, S^T's A operand: dims 4g .. 4g + 3 of key q  = words (2g', q), (2g' + 1, q)
//   V^T, O^T's A operands: keys 4g .. 4g + 3 of dims 2p, 2p + 1 = one 16-byte chunk of pair p
template <int Tokens>
struct CdnaKvLayout {
  static_assert(Tokens == 16, "16-token tiles: one MFMA k-step of keys");
  static constexpr int kPairs = kHeadDimQK / 2;
  static constexpr int kWords = kPairs * Tokens;
  static constexpr int kBytes = kWords * 4;
  MLAKIT_HOST_DEVICE static constexpr int word(int pair, int key) {
    return pair * Tokens + ((((key >> 2) ^ (pair >> 1)) & (Tokens / 4 - 1)) << 2) + (key & 3);
  }
};

// Q^T k-steps (of 36) a wave of the CDNA mainloop reads from LDS instead of holding in
// registers: the 128-row form's last 10 (40 KiB next to the 18 KiB KV tile), so that Q (52
// registers), O^T (128) and a tile's working set fit the 256 registers of 2 waves per SIMD.
constexpr int cdna_q_lds_steps(int rows) { return rows == 128 ? 10 : 0; }

// LDS of the CDNA mainloop: the KV tile, then each wave's Q^T k-steps from LDS.
constexpr int cdna_smem_bytes(int rows, int threads, int kv_tile) {
  return kHeadDimQK * kv_tile * 2 + (threads / 64) * cdna_q_lds_steps(rows) * 64 * 8;
}

}  // namespace mlakit::detail

#if defined(MLAKIT_HAS_GPU_BACKEND)

namespace mlakit::detail {

// The decode kernel's body for a cdna policy (defined for AMD targets only).
template <class Tr>
__device__ void run_cdna_kernel(const KernelArgs& p, unsigned char* smem);

}  // namespace mlakit::detail

#endif

#if defined(MLAKIT_HAS_CDNA_KERNELS)

namespace mlakit::detail {

template <class Tr>
struct CdnaMainloop {
  using T = typename Tr::T;    // compute type (the Q type)
  using Tq = typename Tr::Tq;  // Q and output type
  using Atom = arch::MmaAtomMfma16<T>;
  static constexpr int kRows = Tr::kRows;
  static constexpr int kThreads = Tr::kThreads;
  static constexpr int kWaves = kThreads / 64;
  static constexpr int kRowGroups = kRows / 16;
  static constexpr int kColSplit = kWaves / kRowGroups;
  static constexpr int kCols = kHeadDimV / kColSplit;  // V columns per wave
  static constexpr int kOTiles = kCols / 16;
  static constexpr int kTokens = Tr::kKvTile;
  static constexpr int kKSteps = kHeadDimQK / 16;        // S^T k-steps over the 576 dims
  static constexpr int kQLds = cdna_q_lds_steps(kRows);  // the last kQLds of them from LDS
  static constexpr int kQRegs = kKSteps - kQLds;
  using Layout = CdnaKvLayout<kTokens>;
  static_assert(kRows % 16 == 0 && kWaves % kRowGroups == 0 && kColSplit >= 1, "wave layout");
  static_assert(kOTiles * 16 * kColSplit == kHeadDimV, "V columns split evenly");
  static constexpr int kSmemBytes = cdna_smem_bytes(kRows, kThreads, kTokens);
  static_assert(kSmemBytes == Tr::kSmemBytes, "DecodeTraits sizes the same LDS");

  const KernelArgs& p;
  std::uint32_t* kv_tile;  // Layout::kWords words, then the waves' Q^T k-steps [wave][s][lane]
  int b = 0, heads, q_len, rows, row0;
  bool causal;

  __device__ CdnaMainloop(const KernelArgs& args, unsigned char* smem, int row_tile)
      : p(args),
        kv_tile(reinterpret_cast<std::uint32_t*>(smem)),
        heads(Tr::heads(args.a)),
        q_len(Tr::q_len(args.a)),
        rows(0),
        row0(row_tile * kRows),
        causal(Tr::causal(args.a)) {
    rows = heads * q_len;
  }

  // ---- addressing of request b ---------------------------------------------------------------
  __device__ __forceinline__ const std::int32_t* page_table() const {
    const DecodeArgs& a = p.a;
    return a.page_ids == PageIds::block_table ? a.block_table + b * a.block_table_stride
                                              : a.kv_indices + a.kv_indptr[b];
  }
  __device__ __forceinline__ const Tq* q_row(int row) const {
    const DecodeArgs& a = p.a;
    const int t = row / heads, h = row - t * heads;
    return static_cast<const Tq*>(a.q) + b * a.q_stride_batch + t * a.q_stride_token +
           h * a.q_stride_head;
  }
  // Row `row`'s output: the piece's partial slot when it is split, else request b's output.
  __device__ __forceinline__ Tq* o_row(const Piece& pc, int row) const {
    const DecodeArgs& a = p.a;
    if (pc.partial_slot >= 0)
      return reinterpret_cast<Tq*>(p.ws.partial_o) +
             (std::int64_t(pc.partial_slot) * p.ws.rows_padded + row) * kHeadDimV;
    const int t = row / heads, h = row - t * heads;
    return static_cast<Tq*>(a.out) + b * a.o_stride_batch + t * a.o_stride_token +
           h * a.o_stride_head;
  }
  __device__ __forceinline__ void store_lse(const Piece& pc, int row, float lse) const {
    const DecodeArgs& a = p.a;
    if (pc.partial_slot >= 0) {
      p.ws.partial_lse[std::int64_t(pc.partial_slot) * p.ws.rows_padded + row] = lse;
    } else if (a.lse != nullptr) {
      const int t = row / heads, h = row - t * heads;
      a.lse[b * a.lse_stride_batch + t * a.lse_stride_token + h * a.lse_stride_head] =
          lse_in_format(lse, a.lse_format);
    }
  }

  // ---- KV tile: memory -> registers -> LDS ----------------------------------------------------
  // Wave w copies tokens [w T_w, (w + 1) T_w) of a tile (T_w = 16 / waves), its lanes taking
  // the tokens' 16-byte chunks in order; lane i < T_w looks up token i's page id, which the
  // chunks' lanes read by a shuffle: one page-table read per token, not per chunk.
  static constexpr int kTokensPerWave = kTokens / kWaves;
  static_assert(kTokensPerWave >= 1 && kTokensPerWave * kWaves == kTokens, "tokens per wave");
  // The KV type this instantiation converts, a compile-time constant: its fixed KV type, or
  // for a kv_any_t problem the other 16-bit type, the only one that reaches it (fp8 KV is
  // handed to the fixed fp8 kernels, arch::kAnyKvForwardsFp8; KV of the Q type to the table's
  // entry of that type, Decode::check). So the byte size, a token's chunks and the conversion
  // are constants, and the paths of the types that never arrive are not compiled.
  static_assert(Tr::Problem::kv_is_fixed || arch::kAnyKvForwardsFp8,
                "kv_any_t kernels of the CDNA mainloop convert one 16-bit type");
  static constexpr DType kOther16 = DTypeOf<T>::value == DType::bf16 ? DType::fp16 : DType::bf16;
  static constexpr DType kKv =
      Tr::Problem::kv_is_fixed ? KvDTypeOf<typename Tr::Problem::kv_type>::value : kOther16;
  static constexpr int kKvBytes = static_cast<int>(dtype_bytes(kKv));
  static constexpr int kRowChunks = kHeadDimQK * kKvBytes / 16;  // 16-byte chunks per token
  static constexpr int kLatentChunks = kHeadDimV * kKvBytes / 16;  // the rest are rotary
  static constexpr int kMaxChunks = (kTokensPerWave * kRowChunks + 63) / 64;

  // Raw 16-byte chunks of tile [kt, kt + 16) that this lane copies (tokens >= kv_end: zero).
  __device__ __forceinline__ void load_raw(uint4 (&raw)[kMaxChunks], const std::int32_t* table,
                                           int kt, int kv_end) const {
    constexpr bool kSplit = Tr::Problem::kSplitCache;  // rotary chunks from kv_rope
    const DecodeArgs& a = p.a;
    // Opaque per tile: the chunks' offsets are recomputed here instead of held in registers
    // across the tile loop.
    const int lane = opaque(lane_id()), tok0 = warp_id() * kTokensPerWave;
    int page = 0;
    if (lane < kTokensPerWave && kt + tok0 + lane < kv_end)
      page = table[(kt + tok0 + lane) / a.page_size];
#pragma unroll
    for (int i = 0; i < kMaxChunks; ++i) {
      const int c = lane + 64 * i;
      const int t = c / kRowChunks, ch = c - t * kRowChunks;
      const int j = kt + tok0 + t;  // the chunk's token
      const int page_t = shfl(page, t < kTokensPerWave ? t : 0);
      raw[i] = uint4{0, 0, 0, 0};
      if (t < kTokensPerWave && j < kv_end) {
        // The token's kv row, or (kSplit) for its rotary chunks its kv_rope row.
        const bool latent = !kSplit || ch < kLatentChunks;
        const unsigned char* src =
            static_cast<const unsigned char*>(latent ? a.kv : a.kv_rope) +
            (std::int64_t(page_t) * (latent ? a.kv_stride_page : a.kv_rope_stride_page) +
             std::int64_t(j % a.page_size) *
                 (latent ? a.kv_stride_token : a.kv_rope_stride_token)) *
                kKvBytes;
        raw[i] = *reinterpret_cast<const uint4*>(src + (latent ? ch : ch - kLatentChunks) * 16);
      }
    }
  }
  // 8 compute values of dims d0 .. d0 + 7 of key `tok` (4 words) into the LDS tile.
  __device__ __forceinline__ void store8(const uint4& v, int tok, int d0) const {
    const int p0 = d0 / 2;
    kv_tile[Layout::word(p0, tok)] = v.x;
    kv_tile[Layout::word(p0 + 1, tok)] = v.y;
    kv_tile[Layout::word(p0 + 2, tok)] = v.z;
    kv_tile[Layout::word(p0 + 3, tok)] = v.w;
  }
  __device__ __forceinline__ void store_tile(const uint4 (&raw)[kMaxChunks]) const {
    const int lane = opaque(lane_id()), tok0 = warp_id() * kTokensPerWave;  // as in load_raw
#pragma unroll
    for (int i = 0; i < kMaxChunks; ++i) {
      const int c = lane + 64 * i;
      const int t = c / kRowChunks, ch = c - t * kRowChunks;
      if (t >= kTokensPerWave) continue;
      const int tok = tok0 + t;
      if constexpr (is_fp8(kKv)) {
        uint4 lo, hi;
        arch::convert_fp8x16<T>(kKv, raw[i], lo, hi);
        store8(lo, tok, 16 * ch);
        store8(hi, tok, 16 * ch + 8);
      } else if constexpr (kKv == DTypeOf<T>::value) {
        store8(raw[i], tok, 8 * ch);
      } else {
        store8(arch::convert_16x8<T>(kKv, raw[i]), tok, 8 * ch);
      }
    }
  }

  // ---- one piece ------------------------------------------------------------------------------
  __device__ __forceinline__ void run(const RequestPlan& rq, const Piece& pc) {
    const int wave = warp_id(), lane = lane_id();
    const int g = lane >> 4, q = lane & 15;
    const int rg = wave / kColSplit, cs = wave - rg * kColSplit;
    const int row = row0 + rg * 16 + q;  // this lane's row (S^T column, O^T column)
    const bool wave_has_rows = row0 + rg * 16 < rows;
    const int L = rq.kv_len;
    const int last_row = (row0 + kRows < rows ? row0 + kRows : rows) - 1;
    const int vis_last = visible_keys(L, q_len, last_row / heads, causal);
    const int kv_begin = pc.kv_begin;
    const int kv_end = pc.kv_end < vis_last ? pc.kv_end : vis_last;
    const int n_tiles = kv_end > kv_begin ? (kv_end - kv_begin + kTokens - 1) / kTokens : 0;
    const int vis_first = visible_keys(L, q_len, row0 / heads, causal);
    const int mask_from = kv_end < vis_first ? kv_end : vis_first;
    const int row_v = row < rows ? visible_keys(L, q_len, row / heads, causal) : 0;
    const int row_limit = row_v < kv_end ? row_v : kv_end;

    float m_run = neg_inf(), l_lane = 0.0f;  // l: this lane's share of the row sum
    typename Atom::Acc o[kOTiles];
#pragma unroll
    for (int n = 0; n < kOTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

    if (n_tiles > 0) {
      // Q^T: lane (g, q) holds dims 16 s + 4 g .. + 3 of row q for every k-step s.
      typename Atom::FragB qf[kQRegs];
      const Tq* qsrc = row < rows ? q_row(row) : nullptr;
#pragma unroll
      for (int s = 0; s < kKSteps; ++s) {
        uint2 v = uint2{0, 0};
        if (qsrc != nullptr) v = *reinterpret_cast<const uint2*>(qsrc + 16 * s + 4 * g);
        if (s < kQRegs) {
          qf[s].r[0] = v.x;
          qf[s].r[1] = v.y;
        } else {
          q_lds()[(s - kQRegs) * 64 + lane] = v;  // read back by this lane only
        }
      }
      const std::int32_t* table = page_table();
      uint4 raw[kMaxChunks];
      load_raw(raw, table, kv_begin, kv_end);
      store_tile(raw);
      block_sync();
      for (int it = 0; it < n_tiles; ++it) {
        const int kt = kv_begin + it * kTokens;
        if (it + 1 < n_tiles) load_raw(raw, table, kt + kTokens, kv_end);  // in flight
        if (wave_has_rows)
          tile_step(qf, kt, kt + kTokens > mask_from, row_limit, m_run, l_lane, o, cs, g, q);
        block_sync();  // every wave is done with the tile
        if (it + 1 < n_tiles) {
          store_tile(raw);
          block_sync();
        }
      }
    }
    epilogue(pc, row, m_run, l_lane, o, cs, g);
  }

  // This wave's Q^T k-steps in LDS: [s - kQRegs][lane] (8 bytes each).
  __device__ __forceinline__ uint2* q_lds() const {
    return reinterpret_cast<uint2*>(kv_tile + Layout::kWords) + warp_id() * (kQLds * 64);
  }

  __device__ __forceinline__ void tile_step(const typename Atom::FragB (&qf)[kQRegs], int kt,
                                            bool need_mask, int row_limit, float& m_run,
                                            float& l_lane, typename Atom::Acc* o, int cs, int g,
                                            int q) const {
    // S^T = K Q^T, one accumulator chain (the waves sharing a SIMD interleave their chains).
    typename Atom::Acc s0 = {0.0f, 0.0f, 0.0f, 0.0f};
    // K of k-step s: pairs 8 s + 2 g and + 1 at key q. Their swizzle term depends on
    // (4 s + g) & 3 = g only (g < 4), so the words are Layout::word(2 g, q) + 128 s (+ 16): one
    // lane base and immediate offsets (written out; the compiler cannot see g < 4).
    const std::uint32_t* k_lane = kv_tile + Layout::word(2 * g, q);
#pragma unroll
    for (int s = 0; s < kKSteps; ++s) {
      typename Atom::FragA a;
      a.r[0] = k_lane[128 * s];
      a.r[1] = k_lane[128 * s + 16];
      if constexpr (kQLds > 0) {
        if (s >= kQRegs) {
          const uint2 v = q_lds()[(s - kQRegs) * 64 + lane_id()];
          typename Atom::FragB b;
          b.r[0] = v.x;
          b.r[1] = v.y;
          Atom::mma(s0, a, b);
          if (s % 4 == 3) schedule_barrier();
          continue;
        }
      }
      Atom::mma(s0, a, qf[s < kQRegs ? s : 0]);
      if (s % 4 == 3) schedule_barrier();  // at most 4 k-steps of K fragments in registers
    }
    // Lane (g, q): keys kt + 4 g + e of row q, in base-2 units, masked.
    float x[4], mt = neg_inf();
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      x[e] = s0[e] * p.scale_log2;
      if (need_mask && kt + 4 * g + e >= row_limit) x[e] = neg_inf();
      mt = fmaxf(mt, x[e]);
    }
    mt = fmaxf(mt, shfl_xor(mt, 16));
    mt = fmaxf(mt, shfl_xor(mt, 32));
    const float m_new = lazy_running_max(m_run, mt);
    const float base = exp_base(m_new);
    const float alpha = fast_exp2(m_run - base);
    const bool moved = m_new != m_run;
    m_run = m_new;
    float pv[4], sum = 0.0f;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      pv[e] = fast_exp2(x[e] - base);
      sum += pv[e];
    }
    l_lane = l_lane * alpha + sum;
    if (moved) {  // else alpha is 1
#pragma unroll
      for (int n = 0; n < kOTiles; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[n][e] *= alpha;
    }
    // P^T as the B operand: keys 4 g .. 4 g + 3 of row q, exactly this lane's S^T elements.
    typename Atom::FragB pb;
    pb.r[0] = arch::pack2<T>(pv[0], pv[1]);
    pb.r[1] = arch::pack2<T>(pv[2], pv[3]);
    // O^T += V^T P^T, two O^T tiles per read: lane (g, q) reads keys 4 g .. 4 g + 3 of dim
    // pair P + q (one chunk), whose low halves are the A operand of the even columns' tile
    // (column c0 + 2 i in M row i) and whose high halves that of the odd columns' tile.
    // Pair (cs kCols + 16 n) / 2 + q: its swizzle term changes with (q >> 1) and the wave's
    // column base only (16 n / 2 = 8 n adds 4 n to pair >> 1), so the chunk of tile pair n is
    // Layout::word(cs kCols / 2 + q, 4 g) + 128 n.
    const std::uint32_t* v_lane = kv_tile + Layout::word(cs * kCols / 2 + q, 4 * g);
#pragma unroll
    for (int n = 0; n < kOTiles; n += 2) {
      const uint4 w = *reinterpret_cast<const uint4*>(v_lane + 128 * n);
      typename Atom::FragA even, odd;
      even.r[0] = (w.x & 0xFFFFu) | (w.y << 16);
      even.r[1] = (w.z & 0xFFFFu) | (w.w << 16);
      odd.r[0] = (w.x >> 16) | (w.y & 0xFFFF0000u);
      odd.r[1] = (w.z >> 16) | (w.w & 0xFFFF0000u);
      Atom::mma(o[n], even, pb);
      Atom::mma(o[n + 1], odd, pb);
      if (n % 4 == 2) schedule_barrier();  // at most 2 V reads in registers
    }
  }

  __device__ __forceinline__ void epilogue(const Piece& pc, int row, float m_run, float l_lane,
                                           const typename Atom::Acc* o, int cs, int g) const {
    // Opaque per piece: the row's output and LSE addresses are computed here, after the tiles,
    // instead of hoisted out of the loop over requests and held (at 128 rows: spilled) across
    // every tile loop.
    row = opaque(row);
    float l = l_lane + shfl_xor(l_lane, 16);
    l += shfl_xor(l, 32);
    if (row >= rows) return;
    const float inv = l > 0.0f ? p.out_scale / l : 0.0f;
    Tq* dst = o_row(pc, row);
    // Lane (g, q) holds, of the O^T tile pair (n, n + 1), columns c0 + 8 g + 2 e (tile n) and
    // c0 + 8 g + 2 e + 1 (tile n + 1) of its row: 8 consecutive columns, one 16-byte store.
#pragma unroll
    for (int n = 0; n < kOTiles; n += 2) {
      const int c = cs * kCols + 16 * n + 8 * g;
      *reinterpret_cast<uint4*>(dst + c) = uint4{arch::pack2<Tq>(o[n][0] * inv, o[n + 1][0] * inv),
                                                 arch::pack2<Tq>(o[n][1] * inv, o[n + 1][1] * inv),
                                                 arch::pack2<Tq>(o[n][2] * inv, o[n + 1][2] * inv),
                                                 arch::pack2<Tq>(o[n][3] * inv, o[n + 1][3] * inv)};
    }
    if (g == 0 && cs == 0) store_lse(pc, row, lse_from_state(m_run, l));
  }
};

// The decode kernel's body for a CDNA policy: the same grid, plan and pieces as the other
// mainloops (blockIdx.x: row tile, blockIdx.y: CTA of the plan).
template <class Tr>
__device__ void run_cdna_kernel(const KernelArgs& p, unsigned char* smem) {
  const int row_tile = static_cast<int>(blockIdx.x);
  const int cta = static_cast<int>(blockIdx.y);
  using ML = CdnaMainloop<Tr>;
  const CtaWork work =
      p.self_plan ? plan_for_block<Tr::kThreads>(
                        p, reinterpret_cast<RequestPlan*>(smem + Tr::kSmemBytes), row_tile, cta)
                  : planned_work(p, cta);
  ML ml(p, smem, row_tile);
  if (ml.row0 >= ml.rows) return;
  for (int b = work.cp.req_begin; b <= work.cp.req_end; ++b) {
    ml.b = b;
    const RequestPlan rq = work.requests[b];
    ml.run(rq, piece_of(p.shape, rq, cta, work.per_cta));
    block_sync();  // the LDS tile is reused by the next piece
  }
}

}  // namespace mlakit::detail

#endif  // MLAKIT_HAS_CDNA_KERNELS
