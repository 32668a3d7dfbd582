#pragma once
// Per-target tile policies as data (CUB style): the kernel reads these numbers and never
// branches on the vendor. A policy is chosen by the number of rows (heads x q_len) a request
// has; rows beyond one tile are spread over more CTAs along the row dimension.
#include "../core/plan.hpp"
#include "../platform/platform.hpp"

namespace mlakit::arch {

// The mainloop a policy runs. warp_mma: the mma.sync / MFMA mainloop of decode_kernel.hpp
// (every target). warpgroup_split_o: the warp-specialized wgmma mainloop of decode_split_o_sm90.hpp
// (its own kernel, 384 threads) where the device runs its sm_90a code; elsewhere the policy
// falls back to warp_mma with `threads` threads.
// keys_as_m: the keys-as-M wgmma mainloop of decode_kt_sm90.hpp (its own kernel; e4m3fn KV:
// 16 rows 160 threads and two CTAs per SM, 32 and 64 rows 384 threads and one; 16-bit KV of
// the Q type: 16 rows 384 threads, 32 rows 256, one CTA per SM) where the device runs its
// sm_90a code
// (TilePolicy::fp8_mainloop, TilePolicy::direct_mainloop).
// cdna: the CDNA mainloop of decode_cdna.hpp (AMD): every row of the row tile shares each KV
// tile from LDS; 16-row MFMA tiles, one per wave (two waves splitting the V columns in the
// 16-row form).
enum class Mainloop : int { warp_mma = 0, warpgroup_split_o = 2, keys_as_m = 3, cdna = 4 };

// CTAs per SM of the keys-as-M kernel of `rows`-row tiles and KV of `kv_bytes` bytes per value
// (e4m3fn, 16 rows: Q 18 KB, P 2 KB, two raw 36 KB stages; 32 rows: Q 36 KB, two P of 4 KB,
// four raw stages; 64 rows: Q 72 KB, two P of 8 KB, three raw stages; 16-bit KV: a ring of
// 25 / 22 chunks of 8 KB); its plan aims for them.
constexpr int keys_as_m_ctas_per_sm(int rows, int kv_bytes = 1) {
  return rows <= 16 && kv_bytes == 1 ? 2 : 1;
}

// When the e4m3fn raw path of the mma.sync mainloop loads each token's page id one tile ahead
// of the token's copies instead of right before them. small_pages: for page sizes below the
// KV tile only, through a second kernel of the policy that the launch picks by page size.
enum class IdsAhead : int { never = 0, always = 1, small_pages = 2 };

struct TilePolicy {
  int rows = 0;         // rows (token, head) per CTA: 16, 32 or 64 (128 on AMD)
  int kv_tile = 0;      // KV tokens per pipeline step
  int threads = 0;      // threads per CTA
  int stages = 0;       // KV tiles in shared memory when KV needs no conversion
  int raw_bytes = 0;    // shared bytes for raw KV staging when KV is converted (fp8 / other 16-bit)
  int ctas_per_sm = 0;  // CTAs resident per SM (launch bounds); the automatic split plan aims
                        // for one wave of them (plan_num_ctas)
  int fp8_stages = 0;   // raw KV stages when the matrix atom reads e4m3fn KV raw (NVIDIA)
  Mainloop mainloop = Mainloop::warp_mma;
  // e4m3fn raw path: each thread loads its token's page id one tile ahead of the copies (one
  // token per thread). That takes the dependent page-table loads of small pages off the path
  // between a tile's barrier and its copies, but changes the code of the whole loop, so each
  // policy takes the variant that is faster for it (docs/performance.md, "Constants").
  IdsAhead fp8_ids_ahead = IdsAhead::never;
  // e4m3fn raw path (NVIDIA): CTAs resident per SM when that path's smaller shared memory
  // allows more than ctas_per_sm (0: ctas_per_sm). Launch bounds of that kernel
  // (DecodeTraits::kCtasPerSm); the automatic plan aims for them from kFp8CtasMinRowTiles row
  // tiles of work up (api/kernel_choice.hpp, plan_ctas_per_sm).
  int fp8_ctas_per_sm = 0;
  // e4m3fn KV on sm_90a: the mainloop that runs instead of `mainloop` (keys_as_m for the
  // 16- and 32-row tiles; warp_mma: the same as for other KV).
  Mainloop fp8_mainloop = Mainloop::warp_mma;
  // e4m3fn KV on sm_90a below kFp8CtasMinRowTiles requests x row tiles, in automatic split
  // mode: the keys-as-M kernel still runs, planning for itself (no planner launch), instead of
  // the policy's own kernel (KtConfig::kSelfPlanSmall, which the launch checks against it;
  // docs/performance.md, "Constants").
  bool fp8_self_plan_small = false;
  // Automatic split plan: least KV tiles (64 tokens) of a piece of a request of at most
  // kShortRequestTiles tiles (core/plan.hpp, PlanShape::min_piece_tiles). 1 for the NVIDIA
  // 16-row tile, whose pieces cost little beyond their KV (18 KB of Q each), so short
  // requests gain from more of them; longer requests keep two tiles per piece, where more
  // pieces cost more than they gain (docs/performance.md, "Constants").
  int min_piece_tiles = kMinPieceTiles;
  // KV of the Q type (bf16 / fp16) on sm_90a from kFp8CtasMinRowTiles requests x row tiles
  // up and pages of at least kKtDirectMinPage tokens: the mainloop that runs instead of
  // `mainloop` (keys_as_m: the 16- and 32-row tiles; see direct_keys_as_m()).
  Mainloop direct_mainloop = Mainloop::warp_mma;
};

// Requests x row tiles from which the automatic plan aims for fp8_ctas_per_sm CTAs per SM and
// e4m3fn KV runs the keys-as-M mainloop: with fewer, more CTAs only cut each request into more
// pieces, and the keys-as-M forms lose on the short requests the host cannot tell from long
// ones (docs/performance.md, "Constants").
inline constexpr int kFp8CtasMinRowTiles = 32;

// Requests x row tiles from which e4m3fn KV runs the keys-as-M mainloop on sm_90a in the
// policies that have no self-planning form of it below kFp8CtasMinRowTiles (32 and 64 rows);
// below, the policy's own kernel (mma.sync for 32 rows, the warp-specialized tile with its
// converting producer for 64). With the keys-as-M producers' L2 evict-first hint, 8 to 31 row
// tiles run 4-28% faster on keys-as-M (docs/performance.md, "Constants").
inline constexpr int kFp8KeysAsMMinRowTiles = 8;

// Whether e4m3fn KV runs policy `tp`'s keys-as-M mainloop with the planner launch on sm_90a
// for `row_tiles` requests x row tiles (the 16-row policy below kFp8CtasMinRowTiles runs the
// self-planning form instead, in automatic split mode).
constexpr bool fp8_keys_as_m(const TilePolicy& tp, std::int64_t row_tiles) {
  return row_tiles >= (tp.fp8_self_plan_small ? kFp8CtasMinRowTiles : kFp8KeysAsMMinRowTiles);
}

#if defined(MLAKIT_PLATFORM_HIP)
// CDNA (gfx90a / gfx942 / gfx950): the cdna mainloop with one 16-token KV tile of 18 KB in LDS
// (the compute type, converted once by the workgroup) shared by all rows of the row tile; the
// next tile waits in registers. Row tiles of 16, 32 and 64 rows: two waves per 16 rows,
// splitting the V columns (an O accumulator of 64 registers per lane; S^T computed by both);
// 128 rows: one wave per 16 rows (O^T 128 registers, 10 of Q's 36 k-steps in LDS). Workgroups
// per CU (launch bounds, plan): 3 of 2 waves (LDS: 3 x 18 KB plus the self-plan bytes fit in
// 64 KiB), 2 of 4 and 1 of 8: at least 1.5 waves per SIMD, 2 for the 32-, 64- and 128-row
// tiles, each within 256 registers (amd-resources table).
// A kv_any_t problem hands fp8 KV to the kernels of the fixed fp8 type (Decode::launch_with),
// so its own kernels convert 16-bit KV only: one conversion path, in the registers it leaves.
inline constexpr bool kAnyKvForwardsFp8 = true;
// The matrix atom widens no raw e4m3fn operand: every fp8 cache is converted on its way in.
inline constexpr bool kE4m3fnOperands = false;
// No sm_90a wgmma mainloop (warpgroup_split_o, keys_as_m) exists for this target.
inline constexpr bool kHopperMainloops = false;

// Every CDNA tile: one 16-token KV tile in LDS, no raw staging.
constexpr TilePolicy cdna_tile() {
  TilePolicy p;
  p.mainloop = Mainloop::cdna;
  p.kv_tile = 16;
  p.stages = 1;
  p.raw_bytes = 0;
  p.fp8_stages = 1;
  return p;
}
constexpr TilePolicy cdna_rows16() {
  TilePolicy p = cdna_tile();
  p.rows = 16;
  p.threads = 128;
  p.ctas_per_sm = 3;
  return p;
}
constexpr TilePolicy cdna_rows32() {
  TilePolicy p = cdna_tile();
  p.rows = 32;
  p.threads = 256;
  p.ctas_per_sm = 2;
  return p;
}
constexpr TilePolicy cdna_rows64() {
  TilePolicy p = cdna_tile();
  p.rows = 64;
  p.threads = 512;
  p.ctas_per_sm = 1;
  return p;
}
constexpr TilePolicy cdna_rows128() {
  TilePolicy p = cdna_tile();
  p.rows = 128;
  p.threads = 512;
  p.ctas_per_sm = 1;
  return p;
}
inline constexpr TilePolicy kPolicies[] = {cdna_rows16(), cdna_rows32(), cdna_rows64(),
                                           cdna_rows128()};
#else

inline constexpr bool kAnyKvForwardsFp8 = false;
// The matrix atom reads e4m3fn KV raw and widens it to f16 in registers (DecodeTraits::
// kFp8Operands). Host-only builds model this table (workspace sizes, plans).
inline constexpr bool kE4m3fnOperands = true;
// The policies name sm_90a wgmma mainloops (warpgroup_split_o, keys_as_m); whether a device runs
// them is the launch's run-time probe of the kernel's code.
inline constexpr bool kHopperMainloops = true;

// NVIDIA sm_80/sm_90, up to 227 KB of shared memory per block. The measurement behind each
// choice: docs/performance.md, "Design decisions" and "Constants".
// 16 rows (bandwidth-bound shapes): 4 warps, 32-token tiles (64-token tiles cost scattered
// small pages more than they save on large ones), ~92 KB, two CTAs per SM so one CTA's
// barriers and conversion overlap the other's loads and matrix work. e4m3fn KV: two raw 18 KB
// stages (~56 KB), three CTAs per SM: the kernel is bound by the latency of its own
// instructions with two warps per scheduler, so a third CTA is worth more than two more
// stages. e4m3fn KV on sm_90a: the keys-as-M mainloop from kFp8CtasMinRowTiles up, and below
// in automatic mode, planning for itself (fp8_self_plan_small).
constexpr TilePolicy nvidia_rows16() {
  TilePolicy p;
  p.rows = 16;
  p.kv_tile = 32;
  p.threads = 128;
  p.stages = 2;
  p.raw_bytes = 36864;
  p.ctas_per_sm = 2;
  p.fp8_stages = 2;
  p.mainloop = Mainloop::warp_mma;
  p.fp8_ids_ahead = IdsAhead::small_pages;
  p.fp8_ctas_per_sm = 3;
  p.fp8_mainloop = Mainloop::keys_as_m;
  p.fp8_self_plan_small = true;
  p.min_piece_tiles = 1;
  p.direct_mainloop = Mainloop::keys_as_m;
  return p;
}
// 32 rows: 8 warps, 64-token tiles, fp8 KV with three raw stages (108 KB), ~221 KB; e4m3fn KV:
// four raw 36 KB stages; e4m3fn KV on sm_90a from kFp8KeysAsMMinRowTiles up: the keys-as-M
// mainloop (two consumer warpgroups, 384 threads, one CTA per SM), which widens the raw tile
// in registers and pads no rows.
constexpr TilePolicy nvidia_rows32() {
  TilePolicy p;
  p.rows = 32;
  p.kv_tile = 64;
  p.threads = 256;
  p.stages = 2;
  p.raw_bytes = 110592;
  p.ctas_per_sm = 1;
  p.fp8_stages = 4;
  p.mainloop = Mainloop::warp_mma;
  p.fp8_ids_ahead = IdsAhead::always;
  p.fp8_mainloop = Mainloop::keys_as_m;
  p.direct_mainloop = Mainloop::keys_as_m;
  return p;
}
// 64 rows: sm_90a runs the warp-specialized mainloop (decode_split_o_sm90.hpp: 384 threads, Q 72 KB
// + two 72 KB KV stages + P, 226 KB); e4m3fn KV from kFp8KeysAsMMinRowTiles up: the keys-as-M
// mainloop (dims split over two consumer warpgroups, three raw stages), whose raw stages are
// refilled without waiting for a conversion; the fallback elsewhere (sm_80) is mma.sync with
// 8 warps and the numbers below.
constexpr TilePolicy nvidia_rows64() {
  TilePolicy p;
  p.rows = 64;
  p.kv_tile = 64;
  p.threads = 256;
  p.stages = 2;
  p.raw_bytes = 73728;
  p.ctas_per_sm = 1;
  p.fp8_stages = 3;
  p.mainloop = Mainloop::warpgroup_split_o;
  p.fp8_mainloop = Mainloop::keys_as_m;
  return p;
}
inline constexpr TilePolicy kPolicies[] = {nvidia_rows16(), nvidia_rows32(), nvidia_rows64()};
#endif

inline constexpr int kNumPolicies = sizeof(kPolicies) / sizeof(kPolicies[0]);

// The policy of every call with Compute::fp8_matrix: the 64-row tile (its keys-as-M kernel in
// the matrix form on sm_90a; no other target has one).
constexpr int matrix_policy_index() {
  for (int i = 0; i < kNumPolicies; ++i)
    if (kPolicies[i].rows == 64) return i;
  return kNumPolicies - 1;
}
inline constexpr int kMatrixPolicy = matrix_policy_index();

// Index of the policy for a request with `rows` rows: the smallest tile that holds them,
// else the largest (several row tiles).
constexpr int policy_index_for_rows(int rows) {
  for (int i = 0; i < kNumPolicies; ++i)
    if (rows <= kPolicies[i].rows) return i;
  return kNumPolicies - 1;
}

// Requests (of one row tile each) from which 1..16 rows with KV of the Q type run the
// warp-specialized 64-row tile on sm_90 (policy_index_for). Below, the 16-row mma.sync tile
// plans for itself (one launch fewer) and wins on short requests, which the host cannot tell
// from long ones; from here the 64-row tile's faster streaming wins (docs/performance.md,
// "Constants").
inline constexpr int kSplitOMinRequests16 = 32;

// Least page size at which KV of the Q type runs a policy's direct_mainloop: the keys-as-M
// 16-bit forms stream scattered token rows more slowly than the padded 64-row tile
// (docs/performance.md, "Constants").
inline constexpr int kKtDirectMinPage = 64;

// Whether KV of the Q type runs policy `tp`'s keys-as-M form on sm_90a for `batch` requests
// (of one row tile each) of pages of `page_size` tokens.
constexpr bool direct_keys_as_m(const TilePolicy& tp, int batch, int page_size) {
  return tp.direct_mainloop == Mainloop::keys_as_m && batch >= kFp8CtasMinRowTiles &&
         page_size >= kKtDirectMinPage;
}

// The policy decode() runs for `rows` rows per request, `batch` requests and pages of
// `page_size` tokens on a device of architecture `arch` (DeviceInfo::arch) when KV is
// (direct_kv) or is not of the Q type. On sm_90, KV that needs no conversion in rows that fit
// the 16- or 32-row tile runs its direct_mainloop (keys-as-M, no padding) where
// direct_keys_as_m() says so; else 17..32 rows take the warp-specialized 64-row tile (padding
// half or more of its rows: it streams such KV faster than the mma.sync tiles), and so do
// 1..16 rows from kSplitOMinRequests16 requests up. fp8 and other converted KV keep the small
// tiles, which are faster for them (docs/performance.md, "Which kernel runs a shape"). The
// launch uses this function; workspace_bytes() sizes for the largest plan of the candidates
// whatever the dtypes, batch and page size. A program built without sm_90a code runs the
// chosen policy's mma.sync kernel there: correct, but slower.
constexpr int policy_index_for(int rows, bool direct_kv, int arch, int batch, int page_size) {
  const int i = policy_index_for_rows(rows);
  const bool promoted =
      !direct_keys_as_m(kPolicies[i], batch, page_size) &&
      (kPolicies[i].rows == 32 || (kPolicies[i].rows == 16 && batch >= kSplitOMinRequests16));
  if (direct_kv && arch == 90 && promoted &&
      kPolicies[kNumPolicies - 1].mainloop == Mainloop::warpgroup_split_o)
    return kNumPolicies - 1;
  return i;
}

}  // namespace mlakit::arch
