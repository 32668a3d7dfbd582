#pragma once
// Public API: workspace_bytes(), supported(), decode(), and the compile-time entry point
// Decode<Problem>::launch(). The run-time path is a table of compile-time instantiations
// (api/dispatch.hpp) plus argument checks.
#include <cstddef>
#include <cstdint>
#include <string>

#include "../arch/tile_policy.hpp"
#include "../core/decode_args.hpp"
#include "../core/plan.hpp"
#include "../core/status.hpp"
#include "../core/validate.hpp"
#include "../kernel/combine_kernel.hpp"
#include "../kernel/decode_kernel.hpp"
#include "../kernel/decode_kt_sm90.hpp"
#include "../kernel/decode_ws_sm90.hpp"
#include "../kernel/planner_kernel.hpp"
#include "../kernel/problem.hpp"
#include "../kernel/workspace.hpp"
#include "../platform/runtime.hpp"

namespace mlakit {

// Most SMs (CUs) a DeviceInfo may describe: the automatic plan aims for up to a few CTAs per
// SM along the grid's second dimension, which holds at most 65535 (today's largest GPUs have
// 304).
inline constexpr int kMaxSmCount = 4096;

// Checks a DeviceInfo where it enters the library (workspace_bytes(), Decode<P>::launch_with()):
// device >= 0, sm_count 1..kMaxSmCount, max_smem_optin >= 0, arch >= 0 (0 or an unknown
// architecture gets the generic tile policies). query_device() fills one that passes.
inline Status validate_device(const DeviceInfo& dev) {
  using detail::check_range;
  constexpr long long kIntMax = 2147483647;
  Status s;
  if (!(s = check_range("DeviceInfo.device", dev.device, 0, kIntMax)) ||
      !(s = check_range("DeviceInfo.sm_count", dev.sm_count, 1, kMaxSmCount)) ||
      !(s = check_range("DeviceInfo.max_smem_optin", dev.max_smem_optin, 0, kIntMax)) ||
      !(s = check_range("DeviceInfo.arch", dev.arch, 0, kIntMax)))
    return s;
  return Status::ok();
}

namespace detail {

// The workspace pointer and size decode() receives: a null workspace only with size 0 (a size
// then names memory that is not there). A workspace too small for the launch is reported by
// the launch itself (workspace_too_small), which knows the size it needs.
inline Status check_workspace_pointer(const void* workspace, std::size_t workspace_size) {
  if (workspace == nullptr && workspace_size > 0)
    return bad_arg("workspace", "null",
                   "a device pointer is required when workspace_size = " +
                       std::to_string(workspace_size) + " > 0");
  return Status::ok();
}

// Row tiling and plan shape of a request mix for tile policy `policy` (arch::kPolicies), for a
// kernel with `ctas_per_sm` CTAs resident per SM.
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

// Requests x row tiles of `a` with policy `policy`: the work measure of the CTA-count and
// kernel choices that switch at arch::kFp8CtasMinRowTiles.
inline std::int64_t request_row_tiles(const DecodeArgs& a, int policy) {
  const int rows = arch::kPolicies[policy].rows;
  return std::int64_t(a.batch) * ((a.rows() + rows - 1) / rows);
}

// CTAs per SM the automatic plan of `a` aims for with policy `policy`, for a kernel that keeps
// `resident` CTAs per SM (DecodeTraits::kCtasPerSm): more than the policy's ctas_per_sm only
// from kFp8CtasMinRowTiles requests x row tiles up, fewer whenever the kernel keeps fewer.
inline int plan_ctas_per_sm(const DecodeArgs& a, int policy, int resident) {
  const arch::TilePolicy& tp = arch::kPolicies[policy];
  return resident > tp.ctas_per_sm && request_row_tiles(a, policy) < arch::kFp8CtasMinRowTiles
             ? tp.ctas_per_sm
             : resident;
}

// CTAs per SM resident in the kernel the dispatch table launches for `a` with policy `policy`:
// its e4m3fn entries read KV raw (DecodeTraits::kFp8Operands) and keep fp8_ctas_per_sm where
// the policy has one (NVIDIA); every other entry keeps ctas_per_sm.
// On sm_90 (device code built for sm_90a), e4m3fn entries of a policy whose fp8 mainloop is
// keys_as_m run decode_kernel_kt, which keeps keys_as_m_ctas_per_sm(rows); so do entries of
// KV of the Q type where arch::direct_keys_as_m() says so.
inline int table_ctas_per_sm(const DecodeArgs& a, int policy, int arch = 0) {
  const arch::TilePolicy& tp = arch::kPolicies[policy];
  if (a.kv_type == a.q_type && arch == 90 &&
      arch::direct_keys_as_m(tp, static_cast<int>(request_row_tiles(a, policy)), a.page_size))
    return arch::keys_as_m_ctas_per_sm(tp.rows, 2);
  if (a.kv_type != DType::fp8_e4m3fn) return tp.ctas_per_sm;
  if (arch == 90 && tp.fp8_mainloop == arch::Mainloop::keys_as_m)
    return arch::keys_as_m_ctas_per_sm(tp.rows);
  return tp.fp8_ctas_per_sm > 0 ? tp.fp8_ctas_per_sm : tp.ctas_per_sm;
}

// The plan shape decode() launches for `a` with policy `policy` through the dispatch table.
inline PlanShape plan_shape(const DecodeArgs& a, int policy, const DeviceInfo& dev) {
  return plan_shape_for(a, policy, dev,
                        plan_ctas_per_sm(a, policy, table_ctas_per_sm(a, policy, dev.arch)));
}

// The policy decode() launches for `a` on `dev`.
inline int policy_index(const DecodeArgs& a, const DeviceInfo& dev) {
  return arch::policy_index_for(a.rows(), a.kv_type == a.q_type, dev.arch, a.batch, a.page_size);
}
inline int policy_rows(const DecodeArgs& a, const DeviceInfo& dev) {
  return arch::kPolicies[policy_index(a, dev)].rows;
}

// Workspace bytes of a launch of policy `policy`: the larger of the plans for either number
// of CTAs per SM the policy can aim for, so that the size does not depend on the KV type.
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

}  // namespace detail

// Writes to *bytes the device workspace decode() needs for `a` on `dev`. Depends on batch,
// heads, q_len, the split mode and the device only, never on kv_len values or pointers:
// allocate it once. Checks exactly those arguments (validate_shape(), then validate_device())
// and reads no other field, so a size serves every dtype, page size and layout: outside the
// domain it returns the Status of the first one out of range and sets *bytes to 0. Batch 0
// needs 0.
inline Status workspace_bytes(const DecodeArgs& a, const DeviceInfo& dev, std::size_t* bytes) {
  if (bytes == nullptr)
    return detail::bad_arg("bytes", "null", "a pointer to the size_t that receives the size");
  *bytes = 0;
  Status s = validate_shape(a);
  if (s) s = validate_device(dev);
  if (!s || a.batch == 0) return s;
  // The largest of the policies these rows can get (KV of the Q type or not, below or from
  // the batch and page-size thresholds of policy_index_for), so that the size depends neither
  // on the dtypes nor on the page size, and a workspace sized for a batch serves every smaller
  // one.
  unsigned candidates = 0;  // bit i: policy i
  for (bool direct : {true, false})
    for (int batch : {1, arch::kWsMinRequests16, arch::kFp8CtasMinRowTiles, a.batch})
      for (int page : {1, arch::kKtDirectMinPage})
        candidates |= 1u << arch::policy_index_for(a.rows(), direct, dev.arch, batch, page);
  std::int64_t size = 0;
  for (int i = 0; i < arch::kNumPolicies; ++i) {
    if (!(candidates >> i & 1u)) continue;
    const std::int64_t b = detail::policy_workspace_bytes(a, i, dev);
    size = b > size ? b : size;
  }
  *bytes = static_cast<std::size_t>(size);
  return Status::ok();
}

// The same size, or 0 when the shape is outside the domain (or batch is 0, which needs no
// workspace); the overload above tells the two apart and names the argument at fault.
inline std::size_t workspace_bytes(const DecodeArgs& a, const DeviceInfo& dev) {
  std::size_t bytes = 0;
  return workspace_bytes(a, dev, &bytes) ? bytes : 0;
}

namespace detail {
// not_supported in a build without a GPU backend.
inline Status backend_status() {
  if (!kHaveGpuBackend)
    return Status(StatusCode::not_supported,
                  "no GPU backend: mlakit was compiled without CUDA or HIP (see README)");
  return Status::ok();
}
}  // namespace detail

// Ok when decode(a) would run: the arguments are in the domain and a GPU backend exists.
inline Status supported(const DecodeArgs& a) {
  Status s = validate(a);
  if (!s) return s;
  return detail::backend_status();
}

#if !defined(MLAKIT_PLATFORM_NONE)

namespace detail {

// Raises the dynamic shared-memory limit of one kernel once per device. `Tag` makes the
// "done" flags distinct per kernel instantiation (all of them share one pointer type).
// `device` must be the current device (the attribute applies to it): launch_with() checks it.
// Threads racing on a first call each set the attribute (the same value) before launching.
template <class Tag, class Kernel>
inline Status prepare_kernel(Kernel kernel, int smem_bytes, int device) {
  constexpr int kMaxDevices = 64;
  static std::atomic<bool> done[kMaxDevices] = {};
  if (device >= 0 && device < kMaxDevices && done[device].load(std::memory_order_acquire))
    return Status::ok();
  Status s = set_dynamic_smem(kernel, smem_bytes);
  if (s && device >= 0 && device < kMaxDevices) done[device].store(true, std::memory_order_release);
  return s;
}

#if defined(MLAKIT_PLATFORM_CUDA)
// Whether `kernel`, a kernel with an sm_90a-only mainloop, runs that mainloop on `dev`: the
// device is sm_90 and the code the runtime loads for it is sm_90a code, the only code that
// declares the mainloop's static shared memory (`static_bytes`; sm_80 or plain sm_90 code of
// the kernel is empty; a kernel that can also plan for itself declares the planner's scan
// storage next to it, so the check is "at least"). Checked, and the dynamic shared-memory
// limit raised, once per device and Tag.
template <class Tag, class Kernel>
inline Status sm90a_kernel_usable(Kernel kernel, int static_bytes, int dynamic_bytes,
                                  const DeviceInfo& dev, bool* usable, bool max_carveout = false) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> state[kMaxDevices] = {};  // 0 unknown, 1 usable, 2 not
  const int d = dev.device;
  if (d >= 0 && d < kMaxDevices) {
    const int v = state[d].load(std::memory_order_acquire);
    if (v != 0) {
      *usable = v == 1;
      return Status::ok();
    }
  }
  bool ok = false;
  if (dev.arch == 90 && static_bytes + dynamic_bytes <= dev.max_smem_optin) {
    // Runtime queries in the relaxed capture mode: a first call inside a capture is allowed.
    Status s = with_relaxed_capture([&] {
      cudaFuncAttributes attr{};
      Status q = rt_check(cudaFuncGetAttributes(&attr, kernel), "cudaFuncGetAttributes");
      if (!q) return q;
      ok = attr.binaryVersion == 90 && static_cast<int>(attr.sharedSizeBytes) >= static_bytes;
      return Status::ok();
    });
    if (!s) return s;
    if (ok && !(s = set_dynamic_smem(kernel, dynamic_bytes, max_carveout))) return s;
  }
  if (d >= 0 && d < kMaxDevices) state[d].store(ok ? 1 : 2, std::memory_order_release);
  *usable = ok;
  return Status::ok();
}
template <class Tr>
struct WsTag {};
template <class Tr, bool SelfPlan>
struct KtTag {};
// decode_kernel_ws<Tr> (64-row warpgroup policies) runs its mainloop on `dev`.
template <class Tr>
inline Status warpgroup_usable(const DeviceInfo& dev, bool* usable) {
  return sm90a_kernel_usable<WsTag<Tr>>(decode_kernel_ws<Tr>, sizeof(WsStaticStorage),
                                        sizeof(WsSharedStorage), dev, usable);
}
// decode_kernel_kt<Tr, SelfPlan> (row tiles of e4m3fn KV) runs its mainloop on `dev`.
template <class Tr, bool SelfPlan>
inline Status keys_as_m_usable(const DeviceInfo& dev, bool* usable) {
  using ML = KtMainloop<Tr>;
  return sm90a_kernel_usable<KtTag<Tr, SelfPlan>>(
      decode_kernel_kt<Tr, SelfPlan>, sizeof(typename ML::StaticStorage),
      SelfPlan ? ML::kSelfPlanSmemBytes : ML::kSmemBytes, dev, usable, true);
}
#endif

// Launches the planner for `shape`: a 128-thread block for batches up to 128, else 1024.
inline Status launch_planner(const DecodeArgs& a, const PlanShape& shape, const WorkspaceView& ws,
                             Stream stream) {
  if (shape.batch <= kSmallPlannerThreads)
    return launch_kernel("plan_kernel", plan_kernel<kSmallPlannerThreads>, dim3(1),
                         dim3(kSmallPlannerThreads), 0, stream, a, shape, ws);
  return launch_kernel("plan_kernel", plan_kernel<kPlannerThreads>, dim3(1), dim3(kPlannerThreads),
                       0, stream, a, shape, ws);
}

// Launches planner, decode kernel and combine for one instantiation.
template <class Problem, int PolicyIndex>
inline Status launch_instance(const DecodeArgs& a, const DeviceInfo& dev, void* workspace,
                              std::size_t workspace_size, Stream stream) {
  using Tr = DecodeTraits<Problem, PolicyIndex>;
  Status s;
#if defined(MLAKIT_PLATFORM_CUDA)
  // Warpgroup policies run decode_kernel_ws, and row tiles of e4m3fn KV (and of KV of the Q
  // type where the policy has a direct keys-as-M form) decode_kernel_kt, where the device runs
  // their sm_90a code.
  bool warpgroup = false, keys_as_m = false, keys_as_m_self_plan = false;
  if constexpr (Tr::kKeysAsM) {
    // e4m3fn: from kFp8CtasMinRowTiles requests x row tiles up, with the planner launch.
    // Below, in automatic mode, where KtConfig says so, the keys-as-M kernel planning for
    // itself; else the mma.sync kernel, which plans for itself (a planner launch costs about
    // 2.6 us at batch 1), or for 64-row tiles the warp-specialized kernel. KV of the Q type:
    // where arch::direct_keys_as_m() says so (policy_index_for picks another policy elsewhere).
    const std::int64_t tiles = request_row_tiles(a, PolicyIndex);
    if (Tr::kFp8Operands
            ? tiles >= arch::kFp8CtasMinRowTiles
            : arch::direct_keys_as_m(Tr::kPolicy, static_cast<int>(tiles), a.page_size)) {
      if (!(s = keys_as_m_usable<Tr, false>(dev, &keys_as_m))) return s;
    } else if constexpr (KtMainloop<Tr>::Cfg::kSelfPlanSmall) {
      if (a.split_mode == SplitMode::automatic) {
        if (!(s = keys_as_m_usable<Tr, true>(dev, &keys_as_m))) return s;
        keys_as_m_self_plan = keys_as_m;
      }
    }
  }
  if constexpr (Tr::kWarpgroupPolicy) {
    if (!keys_as_m && !(s = warpgroup_usable<Tr>(dev, &warpgroup))) return s;
  }
#else
  constexpr bool warpgroup = false, keys_as_m = false, keys_as_m_self_plan = false;
#endif
  // The plan aims for the CTAs this kernel keeps resident (for the table's entries the same
  // as plan_shape(); a kv_any_t entry given e4m3fn KV keeps ctas_per_sm).
  const PlanShape shape = plan_shape_for(
      a, PolicyIndex, dev,
      plan_ctas_per_sm(a, PolicyIndex,
                       keys_as_m ? arch::keys_as_m_ctas_per_sm(Tr::kRows, Tr::kFp8Operands ? 1 : 2)
                                 : Tr::kCtasPerSm));
  const int rows_padded = shape.row_tiles * Tr::kRows;
  const WorkspaceLayout wl = workspace_layout(shape, rows_padded);
  if (!(s = check_workspace_pointer(workspace, workspace_size))) return s;
  if (workspace == nullptr || workspace_size < static_cast<std::size_t>(wl.bytes))
    return Status(StatusCode::workspace_too_small,
                  "workspace_bytes = " + std::to_string(workspace_size) + ": need " +
                      std::to_string(wl.bytes) + " (call workspace_bytes())");
  // The mma.sync kernel plans for itself (no planner launch) in automatic mode for batches
  // up to kSelfPlanMaxBatch, when the plan's shared memory fits next to the mainloop's (the
  // 64-row policy's fallback does not; its warpgroup kernel uses the planner).
  const bool self_plan_fits =
      !Tr::kWarpgroupPolicy &&
      Tr::kSmemBytes + kSelfPlanBytes + kSelfPlanStaticSlack <= dev.max_smem_optin;
  const bool self_plan = keys_as_m_self_plan ||
                         (!warpgroup && !keys_as_m && self_plan_fits &&
                          shape.mode == SplitMode::automatic && shape.batch <= kSelfPlanMaxBatch);
  const int smem_bytes = Tr::kSmemBytes + (self_plan ? kSelfPlanBytes : 0);
  // The mma.sync kernel. A policy whose e4m3fn path loads page ids a tile ahead for small
  // pages only has a second kernel (same shared memory, grid and plan) for them; for every
  // other instantiation TrAhead is Tr itself.
  using TrAhead = DecodeTraits<Problem, PolicyIndex, Tr::kIdsAheadByPage>;
  const bool ids_ahead = Tr::kIdsAheadByPage && a.page_size < Tr::kKvTile;
  void (*mma_kernel)(KernelArgs) = ids_ahead ? decode_kernel<TrAhead> : decode_kernel<Tr>;
  if (!warpgroup && !keys_as_m) {
    if (Tr::kSmemBytes > dev.max_smem_optin)
      return Status(StatusCode::not_supported,
                    "device shared memory per block " + std::to_string(dev.max_smem_optin) + " < " +
                        std::to_string(Tr::kSmemBytes) + " bytes the kernel needs");
    // The attribute allows the larger size whenever the device has room for it.
    const int smem_attr = Tr::kSmemBytes + (self_plan_fits ? kSelfPlanBytes : 0);
    s = ids_ahead ? prepare_kernel<TrAhead>(mma_kernel, smem_attr, dev.device)
                  : prepare_kernel<Tr>(mma_kernel, smem_attr, dev.device);
    if (!s) return s;
  }

  KernelArgs k;
  k.a = a;
  k.a.block_table_stride = block_table_row_stride(a);  // 0 (packed) resolved for the kernel
  k.shape = shape;
  k.ws = workspace_view(workspace, wl, rows_padded);
  k.scale_log2 = a.softmax_scale * a.kv_scale * kLog2e;
  k.out_scale = a.kv_scale;
  k.self_plan = self_plan ? 1 : 0;

  // Everything that can fail without a GPU fault has been checked above: from here on only a
  // launch the runtime rejects returns early (inside a stream capture the caller then ends
  // and discards the capture).
  if (!self_plan && !(s = launch_planner(a, shape, k.ws, stream))) return s;
  const dim3 grid(shape.row_tiles, shape.num_ctas);
#if defined(MLAKIT_PLATFORM_CUDA)
  if constexpr (Tr::kWarpgroupPolicy) {
    if (warpgroup)
      s = launch_kernel("decode_kernel_ws", decode_kernel_ws<Tr>, grid,
                        dim3(WsMainloop<Tr>::kThreads), sizeof(WsSharedStorage), stream, k);
  }
  if constexpr (Tr::kKeysAsM) {
    if (keys_as_m) {
      using ML = KtMainloop<Tr>;
      if constexpr (ML::Cfg::kSelfPlanSmall) {
        if (keys_as_m_self_plan)
          s = launch_kernel("decode_kernel_kt", decode_kernel_kt<Tr, true>, grid,
                            dim3(ML::kThreads), ML::kSelfPlanSmemBytes, stream, k);
      }
      if (!keys_as_m_self_plan)
        s = launch_kernel("decode_kernel_kt", decode_kernel_kt<Tr, false>, grid, dim3(ML::kThreads),
                          ML::kSmemBytes, stream, k);
    }
  }
#endif
  if (!warpgroup && !keys_as_m)
    s = launch_kernel("decode_kernel", mma_kernel, grid, dim3(Tr::kThreads), smem_bytes, stream, k);
  if (!s) return s;
  if (shape.max_partials() > 0) {
    if (!(s = launch_combine<typename Problem::q_type>(
              a, k.ws, combine_layout(shape, a.rows(), dev.sm_count), stream)))
      return s;
  }
  return Status::ok();
}

// Launch with the policy policy_index() picks, among the candidates I (every policy for a
// problem whose row count is dynamic; a repeated candidate is instantiated once).
template <class Problem, int... I>
inline Status launch_by_rows(const DecodeArgs& a, const DeviceInfo& dev, void* ws,
                             std::size_t bytes, Stream stream, std::integer_sequence<int, I...>) {
  const int idx = policy_index(a, dev);
  Status s(StatusCode::not_supported, "no policy");
  (void)((idx == I ? (s = launch_instance<Problem, I>(a, dev, ws, bytes, stream), true) : false) ||
         ...);
  return s;
}

}  // namespace detail

// Compile-time entry point: a user's own fixed (or partly fixed) shape.
template <class Problem>
struct Decode {
  // Checks that `a` matches the compile-time values of Problem, then launches.
  static Status check(const DecodeArgs& a) {
    Status s = validate(a);
    if (!s) return s;
    if (a.q_type != Problem::q_dtype())
      return detail::bad_arg(
          "q_type", dtype_name(a.q_type),
          std::string("this instantiation expects ") + dtype_name(Problem::q_dtype()));
    if (Problem::kDirectKv && a.kv_type != Problem::q_dtype())
      return detail::bad_arg(
          "kv_type", dtype_name(a.kv_type),
          std::string("this instantiation expects ") + dtype_name(Problem::q_dtype()));
    if (Problem::kv_is_fixed && a.kv_type != detail::KvDTypeOf<typename Problem::kv_type>::value)
      return detail::bad_arg("kv_type", dtype_name(a.kv_type),
                             std::string("this instantiation expects ") +
                                 dtype_name(detail::KvDTypeOf<typename Problem::kv_type>::value));
    if (!Problem::kv_is_fixed && a.kv_type == Problem::q_dtype())
      return detail::bad_arg("kv_type", dtype_name(a.kv_type),
                             "this kv_any_t instantiation converts KV: use KvType = QType");
    if (Problem::kHeads > 0 && a.num_heads != Problem::kHeads)
      return detail::bad_arg("num_heads", std::to_string(a.num_heads),
                             "this instantiation expects " + std::to_string(Problem::kHeads));
    if (Problem::kQLen > 0 && a.q_len != Problem::kQLen)
      return detail::bad_arg("q_len", std::to_string(a.q_len),
                             "this instantiation expects " + std::to_string(Problem::kQLen));
    if (Problem::kCausal != Causal::dynamic && a.causal != (Problem::kCausal == Causal::on))
      return detail::bad_arg("causal", a.causal ? "true" : "false",
                             "this instantiation expects the other value");
    return Status::ok();
  }

  // Launches on the current device; `stream` must belong to it (README: "Devices, threads
  // and CUDA graphs").
  static Status launch(const DecodeArgs& a, void* workspace, std::size_t workspace_size,
                       Stream stream) {
    Status s = check(a);
    if (s) s = detail::check_workspace_pointer(workspace, workspace_size);
    if (!s || a.batch == 0) return s;
    DeviceInfo dev;
    if (!(s = cached_device_info(&dev))) return s;
    return launch_with(a, dev, workspace, workspace_size, stream);
  }

  // Launch without the argument checks of check() (the dispatch table has already run them).
  // `dev` must pass validate_device() and describe the current device, `stream` must belong to it
  // and `workspace` must not be another device's memory: otherwise an invalid_argument Status,
  // before anything is launched or any kernel attribute is set.
  static Status launch_with(const DecodeArgs& a, const DeviceInfo& dev, void* workspace,
                            std::size_t workspace_size, Stream stream) {
    if constexpr (!Problem::kv_is_fixed && arch::kAnyKvForwardsFp8) {
      // Same rows, policies and workspace: only the KV conversion is fixed. That launch_with
      // makes the device checks below.
      if (a.kv_type == DType::fp8_e4m3fn)
        return Decode<detail::WithKv<Problem, fp8_e4m3fn_t>>::launch_with(a, dev, workspace,
                                                                          workspace_size, stream);
      if (a.kv_type == DType::fp8_e4m3fnuz)
        return Decode<detail::WithKv<Problem, fp8_e4m3fnuz_t>>::launch_with(a, dev, workspace,
                                                                            workspace_size, stream);
    }
    Status s = validate_device(dev);
    if (s) s = detail::check_launch_device(dev, workspace, stream);
    if (!s) return s;
    if constexpr (Problem::kRows > 0) {
      // Only the policies these rows can get (policy_index_for: it depends on the device, and
      // on sm_90 on the batch and the page size, through thresholds only, so batch 1 and the
      // largest batch at page 1 and at kKtDirectMinPage get every other one).
      constexpr int any_device = arch::policy_index_for_rows(Problem::kRows);
      constexpr auto sm90 = [](int batch, int page) {
        return arch::policy_index_for(Problem::kRows, Problem::kDirectKv, 90, batch, page);
      };
      return detail::launch_by_rows<Problem>(
          a, dev, workspace, workspace_size, stream,
          std::integer_sequence<int, any_device, sm90(kMaxBatch, arch::kKtDirectMinPage),
                                sm90(kMaxBatch, 1), sm90(1, 1), sm90(1, arch::kKtDirectMinPage)>{});
    } else {
      return detail::launch_by_rows<Problem>(a, dev, workspace, workspace_size, stream,
                                             std::make_integer_sequence<int, arch::kNumPolicies>{});
    }
  }
};

#endif  // !MLAKIT_PLATFORM_NONE

}  // namespace mlakit
