#pragma once
// The split-KV MLA decode kernel.
//
// Grid (row_tiles, num_ctas): CTA (r, c) processes rows [r*Rows, (r+1)*Rows) of every
// request piece the planner gave CTA c (row = token * heads + head). Per piece (this file's
// mainloop: mma.sync on NVIDIA, MFMA on AMD; on sm_90a the 64-row policy runs the
// warp-specialized mainloop of decode_split_o_sm90.hpp in its own kernel instead):
//   sQ [Rows, 576] resident in shared memory (compute type, swizzled)
//   for each KV tile (32 or 64 tokens), gathered through the page mapping into a pipeline
//   of stages (KV of the compute type and raw e4m3fn bytes by cp.async; other types
//   converted into the compute type on their way in):
//     S = Q K^T over 576           warp (rg, cg): rows rg*16.., keys cg*KeysPerWarp..
//     mask (causal / piece end) only on tiles that reach a row's limit
//     online softmax in base 2     row max shared across the cg warps through sMax
//     P -> sP (compute type)       then O[rows rg, cols cg*VCols..] += P V (V = K[:, :512])
//   O / l * kv_scale -> out (unsplit) or the partial slot in the output type + LSE (split;
//   combine_kernel merges)
// e4m3fn KV on NVIDIA ("e4m3 operand mode"): the tiles stay raw, the matrix atom widens its
// fragments to f16 right before the mma, and Q is stored in f16 with a power-of-two scale
// per row that the softmax scale undoes.
// The mainloop names no instruction: the matrix atom (arch/mma_atom.hpp) and the copy atom
// (arch/copy_atom.hpp) are the only vendor-specific parts.
#include <cstdint>
#include <type_traits>

#include "../arch/convert.hpp"
#include "../arch/copy_atom.hpp"
#include "../arch/mma_atom.hpp"
#include "../arch/tile_policy.hpp"
#include "../arch/wgmma_sm90.hpp"
#include "../core/attention_math.hpp"
#include "../core/plan.hpp"
#include "../platform/intrinsics.hpp"
#include "decode_cdna.hpp"
#include "piece_context.hpp"
#include "planner_kernel.hpp"
#include "problem.hpp"
#include "smem_tile.hpp"
#include "workspace.hpp"

#if defined(MLAKIT_HAS_GPU_BACKEND)

namespace mlakit::detail {

// IdsAheadKernel: the second kernel of a policy whose e4m3fn path looks page ids up a tile
// ahead for small pages only (arch::IdsAhead::small_pages); the launch picks it by page size.
template <class ProblemT, int PolicyIndex, bool IdsAheadKernel = false>
struct DecodeTraits {
  using Problem = ProblemT;
  using Tq = typename Problem::q_type;  // Q and output type
  // e4m3fn KV (NVIDIA): tiles stay raw in shared memory and the matrix atom widens them to
  // f16 in registers right before the mma; the compute type is f16 and Q is stored in f16
  // with a power-of-two scale per row (exact for bf16 Q: 8 significant bits fit in 11).
  static constexpr bool kFp8Operands = arch::kE4m3fnOperands && Problem::kv_is_fixed &&
                                       std::is_same_v<typename Problem::kv_type, fp8_e4m3fn_t>;
  using T = std::conditional_t<kFp8Operands, fp16_t, Tq>;  // compute type of the matrix atom
  // Compute::fp8_matrix: both products on e4m3 operands (the keys-as-M kernel's matrix form,
  // kt/matrix_form.hpp; sm_90a only).
  static constexpr bool kFp8Matrix = Problem::kCompute == Compute::fp8_matrix;
  using Atom = arch::MmaAtom<T>;
  using Copy = arch::DefaultCopyAtom;
  static constexpr arch::TilePolicy kPolicy = arch::kPolicies[PolicyIndex];
  static constexpr int kRows = kPolicy.rows;
  static constexpr int kKvTile = kPolicy.kv_tile;
  static constexpr int kThreads = kPolicy.threads;
  static constexpr int kWarps = kThreads / Atom::kWarpSize;
  static constexpr int kRowGroups = kRows / Atom::kM;
  static constexpr int kColGroups = kWarps / kRowGroups;
  static constexpr int kKeysPerWarp = kKvTile / kColGroups;
  static constexpr int kNTilesS = kKeysPerWarp / Atom::kN;
  static constexpr int kVColsPerWarp = kHeadDimV / kColGroups;
  static constexpr int kNTilesO = kVColsPerWarp / Atom::kN;
  // A cdna policy runs decode_cdna.hpp's mainloop (AMD), whose layout is its own.
  static constexpr bool kCdna = kPolicy.mainloop == arch::Mainloop::cdna;
  static_assert(kCdna || (kRows % Atom::kM == 0 && kWarps % kRowGroups == 0), "warp layout");
  static_assert(kCdna || (kNTilesS >= 1 && kKeysPerWarp % Atom::kN == 0), "keys per warp");
  static_assert(kCdna || kNTilesO % 2 == 0, "V columns are loaded two n-tiles at a time");
  static_assert(kCdna || (kKvTile % 16 == 0 && kThreads % kKvTile == 0), "copy layout");
  static_assert(!kFp8Operands || kNTilesO % 4 == 0, "e4m3 V is loaded four n-tiles at a time");

  static constexpr bool kDirect = Problem::kDirectKv;
  // AMD: KV converts on its way through registers (no raw staging in LDS).
  static constexpr bool kRegisterPath = !Copy::kAsync;
  // Stages of KV tiles the mainloop pipelines (raw bytes in the e4m3 operand mode).
  static constexpr int kStages = kFp8Operands                 ? kPolicy.fp8_stages
                                 : (kDirect || kRegisterPath) ? kPolicy.stages
                                                              : 1;
  // CTAs resident per SM (launch bounds); the launch's plan aims for them (plan_ctas_per_sm).
  static constexpr int kCtasPerSm =
      kFp8Operands && kPolicy.fp8_ctas_per_sm > 0 ? kPolicy.fp8_ctas_per_sm : kPolicy.ctas_per_sm;
  static constexpr int kRawBytes =
      (kFp8Operands || kDirect || kRegisterPath) ? 0 : kPolicy.raw_bytes;
  // e4m3fn raw path: page ids loaded a tile ahead (TilePolicy::fp8_ids_ahead). kIdsAheadByPage:
  // the policy has a second kernel (IdsAheadKernel) that the launch runs for page sizes below
  // the KV tile.
  static constexpr bool kIdsAheadByPage =
      kFp8Operands && kStages > 1 && kPolicy.fp8_ids_ahead == arch::IdsAhead::small_pages;
  static constexpr bool kIdsAhead =
      kFp8Operands && kStages > 1 &&
      (kPolicy.fp8_ids_ahead == arch::IdsAhead::always || (kIdsAheadByPage && IdsAheadKernel));

  using QLayout = SwizzledRows<kHeadDimQK>;
  using KvLayout = SwizzledRows<kHeadDimQK>;
  using RawLayout = SwizzledByteRows<kHeadDimQK>;
  using PLayout = SwizzledRows<kKvTile>;

  static constexpr int kTileElems = kKvTile * kHeadDimQK;
  static constexpr int kQBytes = kRows * kHeadDimQK * 2;
  static constexpr int kKvBytes = kStages * kTileElems * (kFp8Operands ? 1 : 2);
  static constexpr int kPBytes = kRows * kKvTile * 2;
  static constexpr int kRedBytes = 2 * kColGroups * kRows * 4;
  static constexpr int kScaleBytes = kFp8Operands ? kRows * 4 : 0;  // Q row scales
  static constexpr int kOffKv = kQBytes;
  static constexpr int kOffRaw = kOffKv + kKvBytes;
  static constexpr int kOffP = kOffRaw + kRawBytes;
  static constexpr int kOffRed = kOffP + kPBytes;
  // cdna: one KV tile in the compute type, 16-bit values in dim pairs (CdnaKvLayout), and the
  // Q^T k-steps read from LDS (cdna_smem_bytes).
  static constexpr int kSmemBytes =
      kCdna ? cdna_smem_bytes(kRows, kThreads, kKvTile) : kOffRed + kRedBytes + kScaleBytes;
  // A `warpgroup_split_o` policy has its own kernel (decode_split_o_sm90.hpp) for sm_90a; this
  // kernel is then only its fallback on other targets.
  static constexpr bool kWarpgroupPolicy = kPolicy.mainloop == arch::Mainloop::warpgroup_split_o;
  // e4m3fn KV of a policy whose fp8 mainloop is keys_as_m, and KV of the Q type of a policy
  // whose direct mainloop is: decode_kernel_kt (decode_kt_sm90.hpp, which checks the policy's
  // row count) on sm_90a, this kernel elsewhere.
  static constexpr bool kKeysAsM =
      arch::kHopperMainloops &&
      ((kFp8Operands && kPolicy.fp8_mainloop == arch::Mainloop::keys_as_m) ||
       (kDirect && kPolicy.direct_mainloop == arch::Mainloop::keys_as_m));

  __device__ static int heads(const DecodeArgs& a) {
    return Problem::kHeads > 0 ? Problem::kHeads : a.num_heads;
  }
  __device__ static int q_len(const DecodeArgs& a) {
    return Problem::kQLen > 0 ? Problem::kQLen : a.q_len;
  }
  __device__ static bool causal(const DecodeArgs& a) {
    return Problem::kCausal == Causal::dynamic ? a.causal : Problem::kCausal == Causal::on;
  }
  __device__ static DType kv_dtype(const DecodeArgs& a) {
    return Problem::kv_is_fixed ? KvDTypeOf<typename Problem::kv_type>::value : a.kv_type;
  }
};

// Converts one 16-byte chunk of raw KV (token `tok`, raw chunk `ch`) into the compute tile.
template <class Tr>
__device__ __forceinline__ void store_converted(DType kv, const uint4& raw, typename Tr::T* tile,
                                                int tok, int ch) {
  using L = typename Tr::KvLayout;
  if (is_fp8(kv)) {
    uint4 o0, o1;
    arch::convert_fp8x16<typename Tr::T>(kv, raw, o0, o1);
    *reinterpret_cast<uint4*>(tile + L::chunk_offset(tok, 2 * ch)) = o0;
    *reinterpret_cast<uint4*>(tile + L::chunk_offset(tok, 2 * ch + 1)) = o1;
  } else {
    *reinterpret_cast<uint4*>(tile + L::chunk_offset(tok, ch)) =
        arch::convert_16x8<typename Tr::T>(kv, raw);
  }
}

template <class Tr>
struct DecodeMainloop : PieceContext<Tr> {
  using Ctx = PieceContext<Tr>;
  using Ctx::b, Ctx::causal, Ctx::heads, Ctx::kv, Ctx::kv_bytes, Ctx::p, Ctx::q_len, Ctx::row0,
      Ctx::row_tile, Ctx::rows;
  using Ctx::copy_q_rows, Ctx::kv_row, Ctx::load_q_scaled, Ctx::o_row, Ctx::page_of,
      Ctx::page_row, Ctx::page_table, Ctx::rope_row, Ctx::store_lse;
  using T = typename Tr::T;
  using Tq = typename Tr::Tq;
  using Atom = typename Tr::Atom;
  using Copy = typename Tr::Copy;
  // KV copies: four threads per token (a 64-byte run of the row per copy instruction and
  // one page lookup per thread and token); tiles of more tokens take several passes.
  static constexpr int kThreadsPerToken =
      Tr::kThreads / Tr::kKvTile < 4 ? Tr::kThreads / Tr::kKvTile : 4;
  static constexpr int kTokensPerPass = Tr::kThreads / kThreadsPerToken;

  unsigned char* smem;  // the mainloop's dynamic shared memory (layout: DecodeTraits)

  // The mainloop state of row tile `row_tile` (request b set per piece by the caller).
  __device__ static DecodeMainloop of_tile(const KernelArgs& p, unsigned char* smem,
                                           int row_tile) {
    return DecodeMainloop{Ctx::of_tile(p, row_tile), smem};
  }

  __device__ T* sQ() const { return reinterpret_cast<T*>(smem); }
  __device__ T* sKv(int stage) const {
    return reinterpret_cast<T*>(smem + Tr::kOffKv) + stage * Tr::kTileElems;
  }
  __device__ unsigned char* sRaw() const { return smem + Tr::kOffRaw; }
  // e4m3 operand mode: raw KV stage `stage`, and the per-row factor undoing Q's scaling.
  __device__ unsigned char* sKvRaw(int stage) const {
    return smem + Tr::kOffKv + stage * Tr::kTileElems;
  }
  // Both mainloops keep the scales at the end of the shared-memory block.
  __device__ float& sQScale(int r) const {
    return reinterpret_cast<float*>(smem + Tr::kSmemBytes - Tr::kScaleBytes)[r];
  }
  __device__ T* sP() const { return reinterpret_cast<T*>(smem + Tr::kOffP); }
  __device__ float* sMax() const { return reinterpret_cast<float*>(smem + Tr::kOffRed); }
  __device__ float* sSum() const { return sMax() + Tr::kColGroups * Tr::kRows; }

  __device__ void load_q() const {
    if constexpr (Tr::kFp8Operands) {
      // Each 16-dim block permuted for MmaAtom::load_b_nk_e4m3: physical chunk 0 holds dims
      // {0,1,4,5,8,9,12,13}, chunk 1 dims {2,3,6,7,10,11,14,15}.
      load_q_scaled([&](int r, int blk, const std::uint32_t(&w)[8]) {
        *reinterpret_cast<uint4*>(sQ() + Tr::QLayout::chunk_offset(r, 2 * blk)) =
            uint4{w[0], w[2], w[4], w[6]};
        *reinterpret_cast<uint4*>(sQ() + Tr::QLayout::chunk_offset(r, 2 * blk + 1)) =
            uint4{w[1], w[3], w[5], w[7]};
      }, &sQScale(0));
    } else {
      static_assert(std::is_same_v<T, Tq>, "Q is copied in its own type");
      copy_q_rows<Tr::kThreads, Tr::kRows>(
          reinterpret_cast<unsigned char*>(sQ()), [](int r, int u) {
            return static_cast<int>(sizeof(T)) * Tr::QLayout::chunk_offset(r, u);
          });
    }
  }

  // Issues the copies of KV tile [kt, kt + KvTile) (tokens >= kv_end are zero-filled and
  // never read). Direct: into compute stage `stage`; raw staging: into raw stage `stage`;
  // register path: converted into compute stage `stage`. kIdGiven: the caller loaded the
  // page id of this thread's token (page_id_of; one token per thread), else it is looked up.
  template <bool kIdGiven = false>
  __device__ void load_kv(int kt, int kv_end, int stage, int page_id = 0) const {
    static_assert(!kIdGiven || kTokensPerPass >= Tr::kKvTile, "one token per thread");
    constexpr bool kSplit = Tr::Problem::kSplitCache;
    const int sub = threadIdx.x % kThreadsPerToken;
    const int row_chunks = kHeadDimQK * kv_bytes / 16;
    // The stage the copies go to (the register path stores converted values itself).
    const auto dst = [&] {
      if constexpr (Tr::kRegisterPath) return typename Copy::StreamBase{};
      else if constexpr (Tr::kFp8Operands) return Copy::stream_base(sKvRaw(stage));
      else if constexpr (Tr::kDirect) return Copy::stream_base(sKv(stage));
      else return Copy::stream_base(sRaw() + stage * (Tr::kKvTile * kHeadDimQK * kv_bytes));
    }();
#pragma unroll
    for (int tok = threadIdx.x / kThreadsPerToken; tok < Tr::kKvTile; tok += kTokensPerPass) {
      const int j = kt + tok;
      const bool valid = j < kv_end;
      const unsigned char* src = !valid     ? static_cast<const unsigned char*>(p.a.kv)
                                 : kIdGiven ? page_row(page_id, j % p.a.page_size)
                                            : kv_row(j);
      const unsigned char* rope = src;
      if constexpr (kSplit) {
        if (valid)
          rope = rope_row(kIdGiven ? std::int64_t(page_id) : page_of(j), j % p.a.page_size);
      }
      // Chunk ch of the token's 576 values: from its kv row, or (kSplit) the rotary chunks
      // from its kv_rope row.
      const auto from = [&](int ch) {
        if constexpr (kSplit) {
          const int latent_chunks = kHeadDimV * kv_bytes / 16;
          if (ch >= latent_chunks) return rope + (ch - latent_chunks) * 16;
        }
        return src + ch * 16;
      };
      if constexpr (Tr::kFp8Operands) {
        for (int ch = sub; ch < row_chunks; ch += kThreadsPerToken)
          Copy::copy16_stream(dst, Tr::RawLayout::chunk_offset(tok, ch), from(ch), valid);
      } else if constexpr (Tr::kDirect) {
        for (int ch = sub; ch < row_chunks; ch += kThreadsPerToken)
          Copy::copy16_stream(dst, int{sizeof(T)} * Tr::KvLayout::chunk_offset(tok, ch), from(ch),
                              valid);
      } else if constexpr (Tr::kRegisterPath) {
        T* cvt = sKv(stage);
        for (int ch = sub; ch < row_chunks; ch += kThreadsPerToken) {
          const uint4 raw = valid ? *reinterpret_cast<const uint4*>(from(ch)) : uint4{0, 0, 0, 0};
          store_converted<Tr>(kv, raw, cvt, tok, ch);
        }
      } else {
        for (int ch = sub; ch < row_chunks; ch += kThreadsPerToken)
          Copy::copy16_stream(dst, tok * kHeadDimQK * kv_bytes + ch * 16, from(ch), valid);
      }
    }
  }

  // The page id of this thread's token of tile [kt, kt + KvTile) (clamped to the piece's last
  // token, which has a page).
  __device__ int page_id_of(const std::int32_t* table, int kt, int kv_end) const {
    const int j = min(kt + static_cast<int>(threadIdx.x) / kThreadsPerToken, kv_end - 1);
    return table[j / p.a.page_size];
  }

  // Raw staging only: raw stage -> compute tile 0.
  __device__ void convert_raw(int raw_stage) const {
    const int row_chunks = kHeadDimQK * kv_bytes / 16;
    const unsigned char* src = sRaw() + raw_stage * (Tr::kKvTile * kHeadDimQK * kv_bytes);
    for (int c = threadIdx.x; c < Tr::kKvTile * row_chunks; c += Tr::kThreads) {
      const int tok = c / row_chunks, ch = c % row_chunks;
      const uint4 raw = *reinterpret_cast<const uint4*>(src + c * 16);
      store_converted<Tr>(kv, raw, sKv(0), tok, ch);
    }
  }

  __device__ void run(const RequestPlan& rq, const Piece& pc) {
    const int lane = lane_id(), warp = warp_id();
    const int rg = warp % Tr::kRowGroups, cg = warp / Tr::kRowGroups;
    const int L = rq.kv_len;
    const int last_row = (row0 + Tr::kRows < rows ? row0 + Tr::kRows : rows) - 1;
    // The tile's KV range ends at its largest visible key.
    const int vis_last = visible_keys(L, q_len, last_row / heads, causal);
    const int kv_begin = pc.kv_begin;
    const int kv_end = pc.kv_end < vis_last ? pc.kv_end : vis_last;
    const int n_tiles = kv_end > kv_begin ? (kv_end - kv_begin + Tr::kKvTile - 1) / Tr::kKvTile : 0;
    // Keys from here on may be masked for some row of the tile.
    const int vis_first = visible_keys(L, q_len, row0 / heads, causal);
    const int mask_from = kv_end < vis_first ? kv_end : vis_first;

    constexpr int kSlots = Atom::kRowsPerLane;
    float m_run[kSlots], l_run[kSlots];
    int row_limit[kSlots];
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      m_run[s] = neg_inf();
      l_run[s] = 0.0f;
      const int row = row0 + rg * Atom::kM + Atom::slot_row(s, lane);
      const int v = visible_keys(L, q_len, row / heads, causal);
      row_limit[s] = v < kv_end ? v : kv_end;
    }
    typename Atom::Acc o[Tr::kNTilesO];
#pragma unroll
    for (int n = 0; n < Tr::kNTilesO; ++n)
#pragma unroll
      for (int i = 0; i < Atom::kAccPerLane; ++i) o[n][i] = 0.0f;

    if (n_tiles > 0) {
      load_q();
      const int raw_stages =
          Tr::kRawBytes > 0 ? Tr::kRawBytes / (Tr::kKvTile * kHeadDimQK * kv_bytes) : 0;
      if constexpr (Tr::kFp8Operands || Tr::kDirect || Tr::kRegisterPath) {
        // One copy group per prefetched tile (empty groups past the end keep the count).
        for (int s = 0; s < Tr::kStages - 1; ++s) {
          if (s < n_tiles) load_kv(kv_begin + s * Tr::kKvTile, kv_end, s);
          Copy::commit();
        }
        if constexpr (Tr::kStages == 1) Copy::commit();
      } else {
        for (int s = 0; s < raw_stages; ++s) {
          if (s < n_tiles) load_kv(kv_begin + s * Tr::kKvTile, kv_end, s);
          Copy::commit();
        }
      }

      // e4m3fn raw path of kernels with Tr::kIdsAhead: the page id of the tile issued at step
      // `it` was loaded at step `it - 1` (a lookup right before the copies puts one or two
      // dependent global loads, CSR: kv_indptr then kv_indices, between every tile's barrier
      // and its copies). Fixed per kernel: the same choice made inside one kernel at run time
      // (page_size < KvTile) is slower than either form (docs/performance.md, "Constants");
      // where it depends on the page size the launch picks one of two kernels instead
      // (DecodeTraits::kIdsAheadByPage).
      constexpr bool kIdsAhead = Tr::kIdsAhead;
      const std::int32_t* table = kIdsAhead ? page_table() : nullptr;
      int next_id = 0;
      if constexpr (kIdsAhead)
        next_id = page_id_of(table, kv_begin + (Tr::kStages - 1) * Tr::kKvTile, kv_end);

      for (int it = 0; it < n_tiles; ++it) {
        const int kt = kv_begin + it * Tr::kKvTile;
        const void* tile;
        if constexpr (Tr::kFp8Operands || Tr::kDirect || Tr::kRegisterPath) {
          if constexpr (Tr::kStages == 1) {
            block_sync();  // everyone is done with the previous tile
            load_kv(kt, kv_end, 0);
            Copy::commit();
            Copy::template wait<0>();
          } else {
            // Groups committed: tiles 0 .. it + Stages - 2; tile `it` must be complete.
            Copy::template wait<Tr::kStages - 2>();
          }
          block_sync();
          if constexpr (Tr::kStages > 1) {
            const int nx = it + Tr::kStages - 1;
            if (nx < n_tiles)
              load_kv<kIdsAhead>(kv_begin + nx * Tr::kKvTile, kv_end, nx % Tr::kStages, next_id);
            Copy::commit();
            if constexpr (kIdsAhead)
              next_id = page_id_of(table, kv_begin + (nx + 1) * Tr::kKvTile, kv_end);
          }
          if constexpr (Tr::kFp8Operands)
            tile = sKvRaw(it % Tr::kStages);
          else
            tile = sKv(it % Tr::kStages);
        } else {
          // Raw stages: 1 (16-bit KV of the other type) to 3 (fp8, small row tiles).
          if (raw_stages >= 3)
            Copy::template wait<2>();
          else if (raw_stages == 2)
            Copy::template wait<1>();
          else
            Copy::template wait<0>();
          block_sync();
          convert_raw(it % raw_stages);
          block_sync();
          const int nx = it + raw_stages;
          if (nx < n_tiles) load_kv(kv_begin + nx * Tr::kKvTile, kv_end, it % raw_stages);
          Copy::commit();
          tile = sKv(0);
        }
        tile_step(tile, kt, kt + Tr::kKvTile > mask_from, row_limit, m_run, l_run, o, rg, cg, lane);
      }
    }
    epilogue(pc, m_run, l_run, o, rg, cg, lane);
  }

  // One KV tile of this warp: S = Q K^T, scale and mask, the running max over the column
  // groups, P = exp2(S - m) to sP, the running sum and O rescaled, O += P V.
  __device__ void tile_step(const void* tile_ptr, int kt, bool need_mask, const int* row_limit,
                            float* m_run, float* l_run, typename Atom::Acc* o, int rg, int cg,
                            int lane) const {
    constexpr int kSlots = Atom::kRowsPerLane;
    const int key0 = cg * Tr::kKeysPerWarp;
    const int r0 = rg * Atom::kM;
    const T* tile = static_cast<const T*>(tile_ptr);
    const unsigned char* raw = static_cast<const unsigned char*>(tile_ptr);

    // S = Q K^T for this warp's rows and keys: [16 rows from r0, kKeysPerWarp keys from
    // key0] as kNTilesS accumulators, P in place later. With few n-tiles per warp the mma
    // chain on one accumulator is the critical path, so even and odd k32 steps accumulate
    // separately (s2). Written out here, not a step of its own: see the note below.
    constexpr int kChains = Tr::kNTilesS >= 4 ? 1 : 2;
    typename Atom::Acc s[Tr::kNTilesS], s2[kChains > 1 ? Tr::kNTilesS : 1];
#pragma unroll
    for (int n = 0; n < Tr::kNTilesS; ++n)
#pragma unroll
      for (int i = 0; i < Atom::kAccPerLane; ++i) s[n][i] = 0.0f;
#pragma unroll
    for (int n = 0; n < (kChains > 1 ? Tr::kNTilesS : 1); ++n)
#pragma unroll
      for (int i = 0; i < Atom::kAccPerLane; ++i) s2[n][i] = 0.0f;
    if constexpr (Tr::kFp8Operands) {
#pragma unroll 3
      for (int kc = 0; kc < kHeadDimQK; kc += 4 * Atom::kK) {
        typename Atom::FragA a[4];
#pragma unroll
        for (int j = 0; j < 4; ++j)
          Atom::template load_a<typename Tr::QLayout>(a[j], sQ(), r0, kc + j * Atom::kK, lane);
#pragma unroll
        for (int n = 0; n < Tr::kNTilesS; ++n) {
          typename Atom::FragB bk[4];
          Atom::template load_b_nk_e4m3<typename Tr::RawLayout>(bk, raw, key0 + n * Atom::kN,
                                                                kc / 16, lane);
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            if constexpr (kChains > 1)
              Atom::mma((j & 1) ? s2[n] : s[n], a[j], bk[j]);
            else
              Atom::mma(s[n], a[j], bk[j]);
          }
        }
      }
    } else {
#pragma unroll 2
      for (int kc = 0; kc < kHeadDimQK; kc += 2 * Atom::kK) {
        typename Atom::FragA a0, a1;
        Atom::template load_a<typename Tr::QLayout>(a0, sQ(), r0, kc, lane);
        Atom::template load_a<typename Tr::QLayout>(a1, sQ(), r0, kc + Atom::kK, lane);
#pragma unroll
        for (int n = 0; n < Tr::kNTilesS; ++n) {
          typename Atom::FragB bk[2];
          Atom::template load_b_nk<typename Tr::KvLayout>(bk, tile, key0 + n * Atom::kN, kc, lane);
          Atom::mma(s[n], a0, bk[0]);
          if constexpr (kChains > 1)
            Atom::mma(s2[n], a1, bk[1]);
          else
            Atom::mma(s[n], a1, bk[1]);
        }
      }
    }
    if constexpr (kChains > 1) {
#pragma unroll
      for (int n = 0; n < Tr::kNTilesS; ++n)
#pragma unroll
        for (int i = 0; i < Atom::kAccPerLane; ++i) s[n][i] += s2[n][i];
    }

    // The steps' arrays are declared here, not inside the steps, and S = Q K^T above is no
    // step of its own: a float array local to an inlined step (mt, sc), or S's loop in a
    // function (s and s2 passed in, or returned in a struct), gives ptxas the same
    // instructions in another virtual-register order, and some kernels another allocation.
    float mt[kSlots], sc[kSlots];
    scale_mask_row_max(s, mt, sc, kt, need_mask, row_limit, r0, key0, cg, lane);
    block_sync();  // every column group's row max is in sMax
    float m_use[kSlots], alpha[kSlots], lsum[kSlots];
    const bool moved = update_running_max(m_run, m_use, alpha, r0, lane);
    store_probabilities(s, m_use, lsum, r0, key0, lane);
    rescale_running_state(l_run, o, alpha, lsum, moved);
    block_sync();  // sP holds the whole tile's P
    accumulate_pv(o, tile_ptr, r0, cg, lane);
  }

  // S scaled into base-2 units (and by Q's per-row factor in the e4m3 operand mode), keys at
  // or past a row's limit set to -inf, and the row max of this warp's keys written to
  // sMax[cg][row].
  // mt, sc: [kSlots] scratch (the row max, the scale of each row slot).
  __device__ __forceinline__ void scale_mask_row_max(typename Atom::Acc* s, float* mt, float* sc,
                                                     int kt, bool need_mask, const int* row_limit,
                                                     int r0, int key0, int cg, int lane) const {
    constexpr int kSlots = Atom::kRowsPerLane;
#pragma unroll
    for (int sl = 0; sl < kSlots; ++sl) {
      mt[sl] = neg_inf();
      sc[sl] = p.scale_log2;
      if constexpr (Tr::kFp8Operands) sc[sl] *= sQScale(r0 + Atom::slot_row(sl, lane));
    }
#pragma unroll
    for (int n = 0; n < Tr::kNTilesS; ++n)
#pragma unroll
      for (int i = 0; i < Atom::kAccPerLane; ++i) {
        float x = s[n][i] * sc[Atom::row_slot(i)];
        if (need_mask) {
          const int key = kt + key0 + n * Atom::kN + Atom::acc_col(i, lane);
          if (key >= row_limit[Atom::row_slot(i)]) x = neg_inf();
        }
        s[n][i] = x;
        mt[Atom::row_slot(i)] = fmaxf(mt[Atom::row_slot(i)], x);
      }
#pragma unroll
    for (int sl = 0; sl < kSlots; ++sl) {
      mt[sl] = Atom::row_max(mt[sl]);
      sMax()[cg * Tr::kRows + r0 + Atom::slot_row(sl, lane)] = mt[sl];
    }
  }

  // The online-softmax update of the running max from the column groups' row maxima:
  // m_use[slot] is the exponent base P is taken against, alpha[slot] the factor that rescales
  // the running sum and O. Returns whether any slot's running max changed (else alpha is 1).
  __device__ __forceinline__ bool update_running_max(float* m_run, float* m_use, float* alpha,
                                                     int r0, int lane) const {
    constexpr int kSlots = Atom::kRowsPerLane;
    bool moved = false;
#pragma unroll
    for (int sl = 0; sl < kSlots; ++sl) {
      float mx = neg_inf();
      for (int c = 0; c < Tr::kColGroups; ++c)
        mx = fmaxf(mx, sMax()[c * Tr::kRows + r0 + Atom::slot_row(sl, lane)]);
      const float m_new = lazy_running_max(m_run[sl], mx);
      m_use[sl] = exp_base(m_new);
      alpha[sl] = fast_exp2(m_run[sl] - m_use[sl]);
      moved = moved || m_new != m_run[sl];
      m_run[sl] = m_new;
    }
    return moved;
  }

  // P = exp2(S - m_use), left in s and written to sP in the compute type; lsum[slot] the row
  // sums of this warp's P.
  __device__ __forceinline__ void store_probabilities(typename Atom::Acc* s, const float* m_use,
                                                      float* lsum, int r0, int key0,
                                                      int lane) const {
    constexpr int kSlots = Atom::kRowsPerLane;
#pragma unroll
    for (int sl = 0; sl < kSlots; ++sl) lsum[sl] = 0.0f;
    T* sp = sP();
#pragma unroll
    for (int n = 0; n < Tr::kNTilesS; ++n) {
#pragma unroll
      for (int i = 0; i < Atom::kAccPerLane; ++i) {
        const float pv = fast_exp2(s[n][i] - m_use[Atom::row_slot(i)]);
        s[n][i] = pv;
        lsum[Atom::row_slot(i)] += pv;
      }
      const int col0 = key0 + n * Atom::kN;
      if constexpr (Atom::kAccPairStride == 2) {
#pragma unroll
        for (int i = 0; i < Atom::kAccPerLane; i += 2) {
          const int r = r0 + Atom::acc_row(i, lane), c = col0 + Atom::acc_col(i, lane);
          *reinterpret_cast<std::uint32_t*>(sp + Tr::PLayout::offset(r, c)) =
              arch::pack2<T>(s[n][i], s[n][i + 1]);
        }
      } else {
#pragma unroll
        for (int i = 0; i < Atom::kAccPerLane; ++i) {
          const int r = r0 + Atom::acc_row(i, lane), c = col0 + Atom::acc_col(i, lane);
          sp[Tr::PLayout::offset(r, c)] = from_float<T>(s[n][i]);
        }
      }
    }
  }

  // The running sum and O rescaled by alpha, then this tile's row sums added.
  __device__ __forceinline__ void rescale_running_state(float* l_run, typename Atom::Acc* o,
                                                        const float* alpha, const float* lsum,
                                                        bool moved) const {
    constexpr int kSlots = Atom::kRowsPerLane;
#pragma unroll
    for (int sl = 0; sl < kSlots; ++sl) l_run[sl] = l_run[sl] * alpha[sl] + lsum[sl];
    if (moved) {  // else every alpha is 1
#pragma unroll
      for (int n = 0; n < Tr::kNTilesO; ++n)
#pragma unroll
        for (int i = 0; i < Atom::kAccPerLane; ++i) o[n][i] *= alpha[Atom::row_slot(i)];
    }
  }

  // O += P V over this warp's V columns (V = the first 512 columns of the KV tile), P from sP.
  __device__ __forceinline__ void accumulate_pv(typename Atom::Acc* o, const void* tile_ptr, int r0,
                                                int cg, int lane) const {
    const T* tile = static_cast<const T*>(tile_ptr);
    const unsigned char* raw = static_cast<const unsigned char*>(tile_ptr);
    const T* sp = sP();
    const int vcol0 = cg * Tr::kVColsPerWarp;
    if constexpr (Tr::kFp8Operands) {
      // o[2c + e] is the n-tile of columns vcol0 + 16c + 2n + e (see load_b_kn_e4m3).
#pragma unroll
      for (int kk = 0; kk < Tr::kKvTile; kk += Atom::kK) {
        typename Atom::FragA pa;
        Atom::template load_a<typename Tr::PLayout>(pa, sp, r0, kk, lane);
#pragma unroll
        for (int n = 0; n < Tr::kNTilesO; n += 4) {
          typename Atom::FragB vb[4];
          Atom::template load_b_kn_e4m3<typename Tr::RawLayout>(vb, raw, kk, (vcol0 + 8 * n) / 16,
                                                                lane);
#pragma unroll
          for (int q = 0; q < 4; ++q) Atom::mma(o[n + q], pa, vb[q]);
        }
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < Tr::kKvTile; kk += Atom::kK) {
        typename Atom::FragA pa;
        Atom::template load_a<typename Tr::PLayout>(pa, sp, r0, kk, lane);
#pragma unroll
        for (int n = 0; n < Tr::kNTilesO; n += 2) {
          typename Atom::FragB vb[2];
          Atom::template load_b_kn<typename Tr::KvLayout>(vb, tile, kk, vcol0 + n * Atom::kN, lane);
          Atom::mma(o[n], pa, vb[0]);
          Atom::mma(o[n + 1], pa, vb[1]);
        }
      }
    }
  }

  __device__ void epilogue(const Piece& pc, const float* m_run, const float* l_run,
                           typename Atom::Acc* o, int rg, int cg, int lane) const {
    constexpr int kSlots = Atom::kRowsPerLane;
    const int r0 = rg * Atom::kM;
    // Row sums: lanes of a row, then the column-group warps.
#pragma unroll
    for (int sl = 0; sl < kSlots; ++sl) {
      const float l = Atom::row_sum(l_run[sl]);
      sSum()[cg * Tr::kRows + r0 + Atom::slot_row(sl, lane)] = l;
    }
    block_sync();
    float inv[kSlots], lse[kSlots];
#pragma unroll
    for (int sl = 0; sl < kSlots; ++sl) {
      float l = 0.0f;
      for (int c = 0; c < Tr::kColGroups; ++c)
        l += sSum()[c * Tr::kRows + r0 + Atom::slot_row(sl, lane)];
      inv[sl] = l > 0.0f ? p.out_scale / l : 0.0f;
      lse[sl] = lse_from_state(m_run[sl], l);
    }
    const bool split = pc.partial_slot >= 0;
    const int vcol0 = cg * Tr::kVColsPerWarp;
    if constexpr (Tr::kFp8Operands) {
      // Lane (g, t) holds columns 16c + 4t .. +3 of rows g and g + 8 in n-tiles 2c, 2c + 1.
      Tq* dst_h[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) dst_h[h] = o_row(pc, row0 + r0 + (lane >> 2) + 8 * h);
#pragma unroll
      for (int c = 0; c < Tr::kNTilesO / 2; ++c) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (dst_h[h] == nullptr) continue;
          const int col = vcol0 + 16 * c + 4 * (lane & 3);
          const float f = inv[h];
          const float v0 = o[2 * c][2 * h] * f, v1 = o[2 * c + 1][2 * h] * f;
          const float v2 = o[2 * c][2 * h + 1] * f, v3 = o[2 * c + 1][2 * h + 1] * f;
          *reinterpret_cast<uint2*>(dst_h[h] + col) =
              make_uint2(arch::pack2<Tq>(v0, v1), arch::pack2<Tq>(v2, v3));
        }
      }
    } else {
      Tq* dst_sl[kSlots];  // element i of a C tile is in row slot_row(row_slot(i))
#pragma unroll
      for (int sl = 0; sl < kSlots; ++sl) dst_sl[sl] = o_row(pc, row0 + r0 + Atom::slot_row(sl, lane));
#pragma unroll
      for (int n = 0; n < Tr::kNTilesO; ++n) {
#pragma unroll
        for (int i = 0; i < Atom::kAccPerLane; i += Atom::kAccPairStride) {
          if (dst_sl[Atom::row_slot(i)] == nullptr) continue;
          const int col = vcol0 + n * Atom::kN + Atom::acc_col(i, lane);
          const float v0 = o[n][i] * inv[Atom::row_slot(i)];
          Tq* dst = dst_sl[Atom::row_slot(i)] + col;
          if constexpr (Atom::kAccPairStride == 2)
            *reinterpret_cast<std::uint32_t*>(dst) =
                arch::pack2<Tq>(v0, o[n][i + 1] * inv[Atom::row_slot(i)]);
          else
            *dst = from_float<Tq>(v0);
        }
      }
    }
    // LSE: one writer per row (column group 0, the lane holding column 0 of the row).
    if (cg == 0) {
#pragma unroll
      for (int sl = 0; sl < kSlots; ++sl) {
        const int row = row0 + r0 + Atom::slot_row(sl, lane);
        int first = 0;  // first accumulator element of this row slot
        for (int i = Atom::kAccPerLane - 1; i >= 0; --i)
          if (Atom::row_slot(i) == sl) first = i;
        if (row >= rows || Atom::acc_col(first, lane) != 0) continue;
        store_lse(pc, split, row, lse[sl]);
      }
    }
  }
};

template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, launch_bounds_residency(Tr::kThreads, Tr::kCtasPerSm))
    decode_kernel(const KernelArgs p) {
#if defined(MLAKIT_WGMMA_ENABLED)
  // sm_90a code: the host launches decode_kernel_split_o for warpgroup policies, never this one.
  constexpr bool kSkip = Tr::kWarpgroupPolicy;
#else
  constexpr bool kSkip = false;
#endif
  if constexpr (kSkip) {
    (void)p;
  } else if constexpr (Tr::kCdna) {
    run_cdna_kernel<Tr>(p, dynamic_smem());
  } else {
    unsigned char* const smem = dynamic_smem();
    const int row_tile = static_cast<int>(blockIdx.x);
    const int cta = static_cast<int>(blockIdx.y);
    // Small automatic-mode batches: the plan is computed here, into shared memory past the
    // mainloop's bytes, instead of by a planner launch.
    const CtaWork work =
        p.self_plan ? plan_for_block<Tr::kThreads>(
                          p, reinterpret_cast<RequestPlan*>(smem + Tr::kSmemBytes), row_tile, cta)
                    : planned_work(p, cta);
    DecodeMainloop<Tr> ml = DecodeMainloop<Tr>::of_tile(p, smem, row_tile);
    if (ml.row0 >= ml.rows) return;
    for (int b = work.cp.req_begin; b <= work.cp.req_end; ++b) {
      ml.b = b;
      const RequestPlan rq = work.requests[b];
      ml.run(rq, piece_of(p.shape, rq, cta, work.per_cta));
      block_sync();  // shared memory is reused by the next piece
    }
  }
}

}  // namespace mlakit::detail

#endif  // MLAKIT_HAS_GPU_BACKEND
