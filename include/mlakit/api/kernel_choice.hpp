#pragma once
// The kernel choice in one place: for one decode() call, the tile policy, the mainloop, whether
// the decode kernel plans for itself, how it looks page ids up and the CTAs per SM its plan
// aims for, as functions of the arguments, the device and the kernels an instantiation holds.
// Host code only (test/test_kernel_choice.cpp runs it without a GPU); launch_instance()
// (api/decode.hpp) checks, plans with choose_kernel() and launches, and workspace_bytes()
// sizes for every choice a shape can get.
#include <cstdint>
#include <string>
#include <type_traits>

#include "../arch/tile_policy.hpp"
#include "../core/decode_args.hpp"
#include "../core/plan.hpp"
#include "../core/status.hpp"
#include "../kernel/decode_cdna.hpp"
#include "../kernel/planner_kernel.hpp"
#include "../kernel/problem.hpp"
#include "../kernel/workspace.hpp"
#include "../platform/runtime.hpp"

namespace mlakit::detail {

// ---- the policy ---------------------------------------------------------------------------------

// The policy decode() launches for `a` on `dev` (arch::policy_index_for).
inline int policy_index(const DecodeArgs& a, const DeviceInfo& dev) {
  if (a.compute == Compute::fp8_matrix) return arch::kMatrixPolicy;
  return arch::policy_index_for(a.rows(), a.kv_type == a.q_type, dev.arch, a.batch, a.page_size);
}
inline int policy_rows(const DecodeArgs& a, const DeviceInfo& dev) {
  return arch::kPolicies[policy_index(a, dev)].rows;
}

// Requests x row tiles of `a` with policy `policy`: the work measure of the CTA-count and
// kernel choices that switch at arch::kFp8CtasMinRowTiles and arch::kFp8KeysAsMMinRowTiles.
inline std::int64_t request_row_tiles(const DecodeArgs& a, int policy) {
  const int rows = arch::kPolicies[policy].rows;
  return std::int64_t(a.batch) * ((a.rows() + rows - 1) / rows);
}

// ---- the kernels of one instantiation -----------------------------------------------------------

// The KV an instantiation's kernels take: of the Q type (copied as is), e4m3fn (a fixed
// e4m3fn problem: read raw by the matrix atom where arch::kE4m3fnOperands) or any other type
// (converted on its way in).
enum class EntryKv : int { q_type = 0, e4m3fn = 1, converted = 2 };

// Dynamic shared memory of decode_kernel (the mma.sync / MFMA mainloop, or the CDNA one) for
// policy `tp`: DecodeTraits' layout (Q, KV stages, raw staging, P, row max / sum exchange, Q
// row scales) for 32-lane warps and asynchronous KV copies (NVIDIA; every AMD policy is cdna).
// launch_instance() checks it against DecodeTraits::kSmemBytes at compile time.
constexpr int mma_smem_bytes(const arch::TilePolicy& tp, bool e4m3fn_operands, bool direct) {
  if (tp.mainloop == arch::Mainloop::cdna) return cdna_smem_bytes(tp.rows, tp.threads, tp.kv_tile);
  const int col_groups = (tp.threads / 32) / (tp.rows / 16);
  const int stages = e4m3fn_operands ? tp.fp8_stages : direct ? tp.stages : 1;
  const int q = tp.rows * kHeadDimQK * 2;
  const int kv = stages * tp.kv_tile * kHeadDimQK * (e4m3fn_operands ? 1 : 2);
  const int raw = e4m3fn_operands || direct ? 0 : tp.raw_bytes;
  const int p = tp.rows * tp.kv_tile * 2;
  const int red = 2 * col_groups * tp.rows * 4;
  const int scale = e4m3fn_operands ? tp.rows * 4 : 0;
  return q + kv + raw + p + red + scale;
}

// What one instantiation (a Problem's KV form and a policy) holds: compile-time facts of its
// kernels, named after the DecodeTraits members they equal (launch_instance() checks them).
struct EntryKernels {
  int policy = 0;                    // index into arch::kPolicies
  bool e4m3fn_operands = false;      // kFp8Operands: e4m3fn tiles stay raw
  bool direct = false;               // kDirect: KV of the Q type
  bool keys_as_m = false;            // kKeysAsM: decode_kernel_kt (sm_90a)
  bool keys_as_m_self_plan = false;  // decode_kernel_kt also planning for itself
  bool warpgroup = false;            // kWarpgroupPolicy: decode_kernel_split_o (sm_90a)
  bool ids_ahead_by_page = false;    // kIdsAheadByPage: a second decode_kernel for small pages
  int mma_ctas_per_sm = 0;           // kCtasPerSm: decode_kernel's launch bounds
  int mma_smem_bytes = 0;            // kSmemBytes: decode_kernel's shared memory, no plan
};

constexpr EntryKernels entry_kernels(int policy, EntryKv kv) {
  const arch::TilePolicy& tp = arch::kPolicies[policy];
  EntryKernels k;
  k.policy = policy;
  k.e4m3fn_operands = arch::kE4m3fnOperands && kv == EntryKv::e4m3fn;
  k.direct = kv == EntryKv::q_type;
  k.keys_as_m = arch::kHopperMainloops &&
                ((k.e4m3fn_operands && tp.fp8_mainloop == arch::Mainloop::keys_as_m) ||
                 (k.direct && tp.direct_mainloop == arch::Mainloop::keys_as_m));
  k.keys_as_m_self_plan = k.keys_as_m && k.e4m3fn_operands && tp.fp8_self_plan_small;
  k.warpgroup = tp.mainloop == arch::Mainloop::warpgroup_split_o;
  k.ids_ahead_by_page =
      k.e4m3fn_operands && tp.fp8_stages > 1 && tp.fp8_ids_ahead == arch::IdsAhead::small_pages;
  k.mma_ctas_per_sm =
      k.e4m3fn_operands && tp.fp8_ctas_per_sm > 0 ? tp.fp8_ctas_per_sm : tp.ctas_per_sm;
  k.mma_smem_bytes = mma_smem_bytes(tp, k.e4m3fn_operands, k.direct);
  return k;
}

// The KV form of Problem's kernels.
template <class Problem>
constexpr EntryKv entry_kv() {
  if (Problem::kDirectKv) return EntryKv::q_type;
  if (Problem::kv_is_fixed && std::is_same_v<typename Problem::kv_type, fp8_e4m3fn_t>)
    return EntryKv::e4m3fn;
  return EntryKv::converted;
}

// The instantiation of the dispatch table (api/dispatch.hpp) that decode() sends `a` to.
inline EntryKv table_entry_kv(const DecodeArgs& a) {
  if (a.kv_type == a.q_type) return EntryKv::q_type;
  return a.kv_type == DType::fp8_e4m3fn ? EntryKv::e4m3fn : EntryKv::converted;
}

// ---- the plan -----------------------------------------------------------------------------------

// Row tiling and plan shape of a request mix for tile policy `policy` (arch::kPolicies), for a
// kernel with `ctas_per_sm` CTAs resident per SM (the aligned plans' tile step and piece weight
// are those of no particular kernel: plan_shape_of sets them).
inline PlanShape plan_shape_for(const DecodeArgs& a, int policy, const DeviceInfo& dev,
                                int ctas_per_sm) {
  const arch::TilePolicy& tp = arch::kPolicies[policy];
  PlanShape s;
  s.batch = a.batch;
  s.row_tiles = (a.rows() + tp.rows - 1) / tp.rows;
  s.mode = a.split_mode;
  s.fixed_splits = a.split_mode == SplitMode::fixed ? a.num_splits : 1;
  s.min_piece_tiles = tp.min_piece_tiles;
  // The longest clamped length the mapping allows: a block table's capacity is the same for
  // every request (page_capacity reads no memory for it); CSR capacities live on the device.
  s.may_shift = line_may_shift(s, a.page_ids == PageIds::block_table
                                      ? clamp_kv_len(kMaxKvLen, page_capacity(a, 0))
                                      : kMaxKvLen);
  s.num_ctas =
      plan_num_ctas(s.mode, s.fixed_splits, s.batch, s.row_tiles, dev.sm_count, ctas_per_sm);
  return s;
}

// CTAs per SM the automatic plan of `a` aims for with policy `policy`, for a kernel that keeps
// `resident` CTAs per SM: more than the policy's ctas_per_sm only from kFp8CtasMinRowTiles
// requests x row tiles up, fewer whenever the kernel keeps fewer.
inline int plan_ctas_per_sm(const DecodeArgs& a, int policy, int resident) {
  const arch::TilePolicy& tp = arch::kPolicies[policy];
  return resident > tp.ctas_per_sm && request_row_tiles(a, policy) < arch::kFp8CtasMinRowTiles
             ? tp.ctas_per_sm
             : resident;
}

// ---- the choice ---------------------------------------------------------------------------------

// What launch_instance() launches for one call.
struct KernelChoice {
  int policy = 0;
  // The decode kernel: warp_mma or cdna (decode_kernel: the policy's own mainloop),
  // warpgroup_split_o (decode_kernel_split_o) or keys_as_m (decode_kernel_kt).
  arch::Mainloop mainloop = arch::Mainloop::warp_mma;
  bool self_plan = false;  // the decode kernel plans for itself: no planner launch
  // decode_kernel's second form, which loads each token's page id a tile ahead (policies
  // with arch::IdsAhead::small_pages, pages smaller than the KV tile).
  bool ids_ahead = false;
  int resident_ctas_per_sm = 0;  // the decode kernel's launch bounds
  int ctas_per_sm = 0;           // what the plan aims for (plan_ctas_per_sm)
  // decode_kernel only: its dynamic shared memory at this launch, and the limit set on it
  // (room for the self-planned form whenever the device has it).
  int smem_bytes = 0;
  int smem_attr = 0;
};

// Chooses the kernel of instantiation `k` for `a` on `dev`. `usable(mainloop, self_plan, &ok)`
// (returning a Status) says whether the device runs that sm_90a kernel's code; it is asked
// only about kernels `k` holds, in order of preference, and its error is returned as is.
//   keys_as_m: e4m3fn where arch::fp8_keys_as_m() says so (from kFp8KeysAsMMinRowTiles
//     requests x row tiles up, or from kFp8CtasMinRowTiles where the policy has a
//     self-planning form, which runs below in automatic mode); KV of the Q type where
//     arch::direct_keys_as_m() says so.
//   warpgroup_split_o: otherwise, for a warpgroup policy.
//   decode_kernel: otherwise, and wherever the device does not run the sm_90a code. It plans
//     for itself in automatic mode up to kSelfPlanMaxBatch requests when the plan's shared
//     memory fits next to the mainloop's (not for a warpgroup policy, whose fallback this is:
//     its sm_90a kernel uses the planner launch).
template <class Usable>
inline Status choose_kernel(const DecodeArgs& a, const DeviceInfo& dev, const EntryKernels& k,
                            const Usable& usable, KernelChoice* choice) {
  const arch::TilePolicy& tp = arch::kPolicies[k.policy];
  Status s;
  bool keys_as_m = false, keys_as_m_self_plan = false, warpgroup = false;
  if (a.compute == Compute::fp8_matrix) {
    // The matrix form of the 64-row keys-as-M kernel, whatever the batch, or nothing.
    if (k.keys_as_m && k.e4m3fn_operands && tp.rows == 64 &&
        !(s = usable(arch::Mainloop::keys_as_m, false, &keys_as_m)))
      return s;
    if (!keys_as_m)
      return Status(StatusCode::not_supported,
                    "compute = fp8_matrix runs on NVIDIA sm_90a code only (device arch " +
                        std::to_string(dev.arch) +
                        "); Compute::standard serves every device");
  } else if (k.keys_as_m) {
    const std::int64_t tiles = request_row_tiles(a, k.policy);
    if (k.e4m3fn_operands ? arch::fp8_keys_as_m(tp, tiles)
                          : arch::direct_keys_as_m(tp, static_cast<int>(tiles), a.page_size)) {
      if (!(s = usable(arch::Mainloop::keys_as_m, false, &keys_as_m))) return s;
    } else if (k.keys_as_m_self_plan && a.split_mode == SplitMode::automatic) {
      if (!(s = usable(arch::Mainloop::keys_as_m, true, &keys_as_m))) return s;
      keys_as_m_self_plan = keys_as_m;
    }
  }
  if (k.warpgroup && !keys_as_m &&
      !(s = usable(arch::Mainloop::warpgroup_split_o, false, &warpgroup)))
    return s;

  KernelChoice c;
  c.policy = k.policy;
  c.mainloop = keys_as_m                             ? arch::Mainloop::keys_as_m
               : warpgroup                           ? arch::Mainloop::warpgroup_split_o
               : tp.mainloop == arch::Mainloop::cdna ? arch::Mainloop::cdna
                                                     : arch::Mainloop::warp_mma;
  c.resident_ctas_per_sm = keys_as_m
                               ? arch::keys_as_m_ctas_per_sm(tp.rows, k.e4m3fn_operands ? 1 : 2)
                               : k.mma_ctas_per_sm;
  c.ctas_per_sm = plan_ctas_per_sm(a, k.policy, c.resident_ctas_per_sm);
  const bool own_kernel = !keys_as_m && !warpgroup;
  const bool self_plan_fits =
      !k.warpgroup &&
      k.mma_smem_bytes + kSelfPlanBytes + kSelfPlanStaticSlack <= dev.max_smem_optin;
  c.self_plan =
      keys_as_m_self_plan || (own_kernel && self_plan_fits &&
                              a.split_mode == SplitMode::automatic && a.batch <= kSelfPlanMaxBatch);
  c.ids_ahead = k.ids_ahead_by_page && a.page_size < tp.kv_tile;
  c.smem_bytes = k.mma_smem_bytes + (c.self_plan ? kSelfPlanBytes : 0);
  c.smem_attr = k.mma_smem_bytes + (self_plan_fits ? kSelfPlanBytes : 0);
  *choice = c;
  return Status::ok();
}

// The choice for the dispatch table's instantiation of `a` and policy `policy` on `dev`, the
// device's sm_90a code taken to run where dev.arch is 90 (the launch probes the kernel).
inline KernelChoice choose_kernel(const DecodeArgs& a, const DeviceInfo& dev, int policy) {
  KernelChoice c;
  (void)choose_kernel(
      a, dev, entry_kernels(policy, table_entry_kv(a)),
      [&](arch::Mainloop, bool, bool* usable) {
        *usable = dev.arch == 90;
        return Status::ok();
      },
      &c);
  return c;
}
// The same with the policy decode() picks.
inline KernelChoice choose_kernel(const DecodeArgs& a, const DeviceInfo& dev) {
  return choose_kernel(a, dev, policy_index(a, dev));
}

// The 64-row Hopper kernels (split-O, and keys-as-M with split dims) consume KV tiles in
// pairs, and their pieces cost more than the plan's overhead units say: at batch 1 a line of
// 128 pieces is slower than one of 64 twice as long. Fitted to the fixed-split sweeps of
// docs/performance.md ("Constants"): 24 pieces cost one tile in every piece, counted in every
// row tile where the split-O kernel reads KV of the Q type, in one row tile where its producer
// converts the cache (a tile costs more there, so longer pieces gain less) and for the
// keys-as-M kernel.
inline constexpr int kPairTileStep = 2;
inline constexpr int kPairPartialsPerTile = 24;

// The plan shape of choice `c` for `a`.
inline PlanShape plan_shape_of(const DecodeArgs& a, const DeviceInfo& dev, const KernelChoice& c) {
  PlanShape s = plan_shape_for(a, c.policy, dev, c.ctas_per_sm);
  const bool split_o = c.mainloop == arch::Mainloop::warpgroup_split_o;
  if (arch::kPolicies[c.policy].rows == 64 &&
      (split_o || c.mainloop == arch::Mainloop::keys_as_m)) {
    s.tile_step = kPairTileStep;
    s.partials_per_tile = kPairPartialsPerTile;
    s.count_row_tiles = split_o && table_entry_kv(a) == EntryKv::q_type;
  }
  return s;
}

// The plan shape decode() launches for `a` with policy `policy` through the dispatch table.
inline PlanShape plan_shape(const DecodeArgs& a, int policy, const DeviceInfo& dev) {
  return plan_shape_of(a, dev, choose_kernel(a, dev, policy));
}

// ---- the workspace of every choice --------------------------------------------------------------

// Bit i set: policy i is one that `rows` rows per request can get on `dev` at up to `batch`
// requests, whatever the dtypes (KV of the Q type or not) and page size: policy_index_for()
// depends on the batch and the page size through thresholds only.
inline unsigned policy_candidates(int rows, const DeviceInfo& dev, int batch) {
  unsigned candidates = 0;
  for (bool direct : {true, false})
    for (int b : {1, arch::kSplitOMinRequests16, arch::kFp8CtasMinRowTiles, batch})
      for (int page : {1, arch::kKtDirectMinPage})
        candidates |= 1u << arch::policy_index_for(rows, direct, dev.arch, b, page);
  return candidates;
}

// Workspace bytes of a launch of policy `policy`: the larger of the plans for either number
// of CTAs per SM the policy can aim for (every kernel of the policy keeps one of them), so
// that the size does not depend on the KV type.
inline std::int64_t policy_workspace_bytes(const DecodeArgs& a, int policy, const DeviceInfo& dev) {
  const arch::TilePolicy& tp = arch::kPolicies[policy];
  std::int64_t bytes = 0;
  for (int ctas : {tp.ctas_per_sm, tp.fp8_ctas_per_sm}) {
    if (ctas <= 0) continue;
    const PlanShape shape = plan_shape_for(a, policy, dev, ctas);
    const std::int64_t b = workspace_layout(shape, shape.row_tiles * tp.rows).bytes;
    bytes = b > bytes ? b : bytes;
  }
  return bytes;
}

// The largest workspace of any choice for `a`'s rows on `dev` at up to a.batch requests, so
// that the size depends neither on the dtypes nor on the page size, and a workspace sized for
// a batch serves every smaller one.
inline std::int64_t choice_workspace_bytes(const DecodeArgs& a, const DeviceInfo& dev) {
  const unsigned candidates = policy_candidates(a.rows(), dev, a.batch);
  std::int64_t size = 0;
  for (int i = 0; i < arch::kNumPolicies; ++i) {
    if (!(candidates >> i & 1u)) continue;
    const std::int64_t b = policy_workspace_bytes(a, i, dev);
    size = b > size ? b : size;
  }
  return size;
}

}  // namespace mlakit::detail
