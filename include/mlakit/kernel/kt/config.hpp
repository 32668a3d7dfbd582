#pragma once
// The shape of the keys-as-M mainloop per form and row count (KtConfig) and its shared memory:
// the dynamic part (KtSharedStorage: Q, P, the KV ring) and the static part (KtStaticStorage:
// row statistics of the softmax and the ring's barriers). Rows = 16, 32, 64 with KvBytes = 1:
// e4m3fn KV, whose ring holds whole raw tiles (kt/raw_fp8_form.hpp); Rows = 16, 32 with
// KvBytes = 2: KV of the Q type, whose ring holds 64-dim chunks (kt/chunk_ring_form.hpp).
#include "../../arch/pipeline_sm90.hpp"
#include "../../core/decode_args.hpp"
#include "../../platform/platform.hpp"
#include "../smem_tile.hpp"

#if defined(MLAKIT_HAS_SM90A_KERNELS)

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
  // No self-planning form: below kFp8KeysAsMMinRowTiles it loses on short requests more than
  // it gains on long ones, which the host cannot tell apart; the mma.sync kernel keeps them
  // (docs/performance.md).
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
  // No self-planning form: below kFp8KeysAsMMinRowTiles slower than the warp-specialized
  // kernel except on long requests (docs/performance.md).
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
// Dynamic shared memory of the fp8 matrix form (64 rows, kt/matrix_form.hpp; 208 KB): Q as two
// e4m3 planes and the raw tiles, both as five 128-column chunks [64 rows][128 B] with the
// 128-byte swizzle (the K-major layout of e4m3 wgmma operands; the fifth chunk holds the 64
// rotary columns and is half used), and the P^T plane of each tile of a pair.
struct KtMatrixSharedStorage {
  static constexpr int kStages = KtConfig<64>::kStages;
  static constexpr int kChunkBytes = 64 * 128;
  static constexpr int kChunks = 5;
  static constexpr int kStageBytes = kChunks * kChunkBytes;
  alignas(1024) unsigned char q[2][kChunks * kChunkBytes];  // planes hi, lo
  // P^T of tiles A and B of a pair: [64 rows][64 kappa bytes], 64-byte swizzle (e4m3)
  alignas(1024) unsigned char p[2][64 * 64];
  alignas(1024) unsigned char kv[kStages][kStageBytes];
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

}  // namespace mlakit::detail

#endif  // MLAKIT_HAS_SM90A_KERNELS
