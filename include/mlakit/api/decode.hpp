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
#include "../kernel/decode_split_o_sm90.hpp"
#include "../kernel/planner_kernel.hpp"
#include "../kernel/problem.hpp"
#include "../kernel/workspace.hpp"
#include "../platform/runtime.hpp"
#include "kernel_choice.hpp"
#include "plan_record.hpp"

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
  const std::int64_t size = detail::choice_workspace_bytes(a, dev);
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
// not_supported for Compute::fp8_matrix in a build without sm_90a kernels (AMD); where they
// exist, the launch checks that the device runs them.
inline Status compute_status(const DecodeArgs& a) {
#if !defined(MLAKIT_HAS_SM90A_KERNELS)
  if (a.compute == Compute::fp8_matrix)
    return Status(StatusCode::not_supported,
                  "compute = fp8_matrix: e4m3 tensor-core kernels exist for NVIDIA sm_90a only, "
                  "and this build has none; Compute::standard serves every device");
#endif
  (void)a;
  return Status::ok();
}
}  // namespace detail

// Ok when decode(a) would run: the arguments are in the domain and a GPU backend exists (and,
// for Compute::fp8_matrix, the build has its kernels; whether the device runs them is known
// at the launch).
inline Status supported(const DecodeArgs& a) {
  Status s = validate(a);
  if (s) s = detail::backend_status();
  if (s) s = detail::compute_status(a);
  return s;
}

#if defined(MLAKIT_HAS_GPU_BACKEND)

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

// The kernels of instantiation (Problem, PolicyIndex) as choose_kernel() sees them
// (api/kernel_choice.hpp): the host's facts, checked here against the traits the kernels are
// compiled with (keys_as_m_self_plan against KtConfig in sm90a_usable()).
template <class Problem, int PolicyIndex>
constexpr EntryKernels instance_kernels() {
  using Tr = DecodeTraits<Problem, PolicyIndex>;
  constexpr EntryKernels k = entry_kernels(PolicyIndex, entry_kv<Problem>());
  static_assert(k.e4m3fn_operands == Tr::kFp8Operands && k.direct == Tr::kDirect &&
                    k.keys_as_m == Tr::kKeysAsM && k.warpgroup == Tr::kWarpgroupPolicy &&
                    k.ids_ahead_by_page == Tr::kIdsAheadByPage &&
                    k.mma_ctas_per_sm == Tr::kCtasPerSm && k.mma_smem_bytes == Tr::kSmemBytes,
                "entry_kernels() describes the instantiation's kernels");
  return k;
}

#if defined(MLAKIT_HAS_SM90A_KERNELS)
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
      KernelImage image;
      const Status q = kernel_image(kernel, &image);
      if (!q) return q;
      ok = image.binary_version == 90 && image.static_smem_bytes >= static_bytes;
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
struct SplitOTag {};
template <class Tr, bool SelfPlan>
struct KtTag {};
// decode_kernel_split_o<Tr> (64-row warpgroup policies) runs its mainloop on `dev`.
template <class Tr>
inline Status warpgroup_usable(const DeviceInfo& dev, bool* usable) {
  return sm90a_kernel_usable<SplitOTag<Tr>>(decode_kernel_split_o<Tr>, sizeof(SplitOStaticStorage),
                                            sizeof(SplitOSharedStorage), dev, usable);
}
// decode_kernel_kt<Tr, SelfPlan> (row tiles of e4m3fn KV) runs its mainloop on `dev`.
template <class Tr, bool SelfPlan>
inline Status keys_as_m_usable(const DeviceInfo& dev, bool* usable) {
  using ML = KtMainloop<Tr>;
  return sm90a_kernel_usable<KtTag<Tr, SelfPlan>>(
      decode_kernel_kt<Tr, SelfPlan>, sizeof(typename ML::StaticStorage),
      SelfPlan ? ML::kSelfPlanSmemBytes : ML::kSmemBytes, dev, usable, true);
}

// choose_kernel()'s probe for instantiation Tr: whether `dev` runs the sm_90a code of the
// kernel of `mainloop` (decode_kernel_kt in its self-planning form where `self_plan`).
template <class Tr>
inline Status sm90a_usable(arch::Mainloop mainloop, bool self_plan, const DeviceInfo& dev,
                           bool* usable) {
  *usable = false;
  if constexpr (Tr::kKeysAsM) {
    using ML = KtMainloop<Tr>;
    static_assert(ML::Cfg::kSelfPlanSmall == (Tr::kFp8Operands && Tr::kPolicy.fp8_self_plan_small),
                  "the policy names the keys-as-M kernels that plan for themselves");
    if (mainloop == arch::Mainloop::keys_as_m && !self_plan)
      return keys_as_m_usable<Tr, false>(dev, usable);
    if constexpr (ML::Cfg::kSelfPlanSmall) {
      if (mainloop == arch::Mainloop::keys_as_m) return keys_as_m_usable<Tr, true>(dev, usable);
    }
  }
  if constexpr (Tr::kWarpgroupPolicy && !Tr::kFp8Matrix) {
    if (mainloop == arch::Mainloop::warpgroup_split_o) return warpgroup_usable<Tr>(dev, usable);
  }
  return Status::ok();
}

// Launches the sm_90a kernel `c` chose for instantiation Tr.
template <class Tr>
inline Status launch_sm90a(const KernelChoice& c, dim3 grid, const KernelArgs& k, Stream stream) {
  if constexpr (Tr::kWarpgroupPolicy && !Tr::kFp8Matrix) {
    if (c.mainloop == arch::Mainloop::warpgroup_split_o)
      return launch_kernel("decode_kernel_split_o", decode_kernel_split_o<Tr>, grid,
                           dim3(SplitOMainloop<Tr>::kThreads), sizeof(SplitOSharedStorage), stream,
                           k);
  }
  if constexpr (Tr::kKeysAsM) {
    using ML = KtMainloop<Tr>;
    if constexpr (ML::Cfg::kSelfPlanSmall) {
      if (c.self_plan)
        return launch_kernel("decode_kernel_kt", decode_kernel_kt<Tr, true>, grid,
                             dim3(ML::kThreads), ML::kSelfPlanSmemBytes, stream, k);
    }
    return launch_kernel("decode_kernel_kt", decode_kernel_kt<Tr, false>, grid, dim3(ML::kThreads),
                         ML::kSmemBytes, stream, k);
  }
  return Status(StatusCode::not_supported, "no sm_90a kernel for this instantiation");
}
#else
// No sm_90a kernels in this build: choose_kernel() runs decode_kernel.
template <class Tr>
inline Status sm90a_usable(arch::Mainloop, bool, const DeviceInfo&, bool* usable) {
  *usable = false;
  return Status::ok();
}
template <class Tr>
inline Status launch_sm90a(const KernelChoice&, dim3, const KernelArgs&, Stream) {
  return Status(StatusCode::not_supported, "no sm_90a kernels in this build");
}
#endif

// Launches the planner for `shape`: a 128-thread block that plans in shared memory for batches
// up to 128, else 1024 threads on the workspace.
inline Status launch_planner(const DecodeArgs& a, const PlanShape& shape, const WorkspaceView& ws,
                             Stream stream) {
  if (shape.batch <= kSmallPlannerThreads)
    return launch_kernel("plan_kernel", plan_kernel<kSmallPlannerThreads, true>, dim3(1),
                         dim3(kSmallPlannerThreads), 0, stream, a, shape, ws);
  return launch_kernel("plan_kernel", plan_kernel<kPlannerThreads>, dim3(1), dim3(kPlannerThreads),
                       0, stream, a, shape, ws);
}

// Launches planner, decode kernel and combine for one instantiation: chooses the kernel
// (choose_kernel), plans, checks the workspace and the shared memory, launches (the steps
// a.plan_step names).
template <class Problem, int PolicyIndex>
inline Status launch_instance(const DecodeArgs& a, const DeviceInfo& dev, void* workspace,
                              std::size_t workspace_size, Stream stream) {
  using Tr = DecodeTraits<Problem, PolicyIndex>;
  KernelChoice c;
  Status s = choose_kernel(
      a, dev, instance_kernels<Problem, PolicyIndex>(),
      [&](arch::Mainloop m, bool self_plan, bool* usable) {
        return sm90a_usable<Tr>(m, self_plan, dev, usable);
      },
      &c);
  if (!s) return s;
  // (The fp8 matrix mode has no such kernel: choose_kernel() picks its keys-as-M kernel or
  // fails.)
  const bool own_kernel = !Tr::kFp8Matrix && c.mainloop != arch::Mainloop::warpgroup_split_o &&
                          c.mainloop != arch::Mainloop::keys_as_m;

  const PlanShape shape = plan_shape_of(a, dev, c);
  const int rows_padded = shape.row_tiles * Tr::kRows;
  const WorkspaceLayout wl = workspace_layout(shape, rows_padded);
  if (!(s = check_workspace_pointer(workspace, workspace_size))) return s;
  if (workspace == nullptr || workspace_size < static_cast<std::size_t>(wl.bytes))
    return Status(StatusCode::workspace_too_small,
                  "workspace_bytes = " + std::to_string(workspace_size) + ": need " +
                      std::to_string(wl.bytes) + " (call workspace_bytes())");
  // decode_kernel, or for a policy whose e4m3fn path loads page ids a tile ahead for small
  // pages only, its second form (same shared memory, grid and plan; for every other
  // instantiation TrAhead is Tr itself).
  using TrAhead = DecodeTraits<Problem, PolicyIndex, Tr::kIdsAheadByPage>;
  void (*mma_kernel)(KernelArgs) = nullptr;  // not instantiated for the fp8 matrix mode
  if constexpr (!Tr::kFp8Matrix)
    mma_kernel = c.ids_ahead ? decode_kernel<TrAhead> : decode_kernel<Tr>;
  if (own_kernel) {
    if (Tr::kSmemBytes > dev.max_smem_optin)
      return Status(StatusCode::not_supported,
                    "device shared memory per block " + std::to_string(dev.max_smem_optin) + " < " +
                        std::to_string(Tr::kSmemBytes) + " bytes the kernel needs");
    s = c.ids_ahead ? prepare_kernel<TrAhead>(mma_kernel, c.smem_attr, dev.device)
                    : prepare_kernel<Tr>(mma_kernel, c.smem_attr, dev.device);
    if (!s) return s;
  }

  KernelArgs k;
  k.a = a;
  k.a.block_table_stride = block_table_row_stride(a);  // 0 (packed) resolved for the kernel
  // Only split instantiations read kv_rope: a joined cache's rotary part is resolved for them
  // (a user's own split Problem called without kv_rope reads columns 512.. of kv).
  if constexpr (Problem::kSplitCache) resolve_rope_part(k.a);
  k.shape = shape;
  k.ws = workspace_view(workspace, wl, rows_padded);
  k.scale_log2 = scale_log2_of(a);
  k.out_scale = a.kv_scale;
  k.self_plan = c.self_plan ? 1 : 0;
  k.page = IndexDivider::make(a.page_size);  // validated: 1..kMaxPageSize

  // Everything that can fail without a GPU fault has been checked above, but for the plan a
  // decode_only call reads: the last planner enqueued into the workspace must have had this
  // call's plan inputs (a kernel that plans for itself does so whatever the step, over whatever
  // the workspace held). From here on only a launch the runtime rejects returns early (inside
  // a stream capture the caller then ends and discards the capture).
  PlanRegistry& plans = PlanRegistry::instance();
  if (c.self_plan) {
    if (a.plan_step != PlanStep::plan_only) plans.forget(workspace);
  } else if (a.plan_step == PlanStep::decode_only) {
    if (!plans.holds(workspace, plan_record_of(a, shape)))
      return bad_arg("plan_step", "decode_only",
                     "after a plan_and_decode or plan_only call into the same workspace with "
                     "the same batch, heads, q_len, page size and capacity, split mode and "
                     "kv_len array, and no planning call of another shape there since");
  } else {
    if (!(s = launch_planner(a, shape, k.ws, stream))) {
      plans.forget(workspace);
      return s;
    }
    plans.note(workspace, plan_record_of(a, shape));
  }
  if (a.plan_step == PlanStep::plan_only) return Status::ok();
  const dim3 grid(shape.row_tiles, shape.num_ctas);
  s = own_kernel ? launch_kernel("decode_kernel", mma_kernel, grid, dim3(Tr::kThreads),
                                 c.smem_bytes, stream, k)
                 : launch_sm90a<Tr>(c, grid, k, stream);
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
    if (!Problem::kSplitCache && a.kv_rope != nullptr)
      return detail::bad_arg("kv_rope", "non-null",
                             "this instantiation reads 576-value kv rows: a separate rotary "
                             "cache needs Problem<..., CacheForm::split>");
    if (a.compute != Problem::kCompute)
      return detail::bad_arg(
          "compute", a.compute == Compute::fp8_matrix ? "fp8_matrix" : "standard",
          Problem::kCompute == Compute::fp8_matrix
              ? "this instantiation computes with Compute::fp8_matrix"
              : "this instantiation computes with Compute::standard (fp8_matrix needs "
                "Problem<..., Compute::fp8_matrix>)");
    return detail::compute_status(a);
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
    if constexpr (!Problem::kSplitCache) {
      // The joined kernels would read the rotary values from kv's rows.
      if (a.kv_rope != nullptr)
        return detail::bad_arg("kv_rope", "non-null",
                               "this instantiation reads 576-value kv rows: a separate rotary "
                               "cache needs Problem<..., CacheForm::split>");
    }
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
    if constexpr (Problem::kCompute == Compute::fp8_matrix) {
      if (a.compute != Compute::fp8_matrix)
        return detail::bad_arg("compute", "standard",
                               "this instantiation computes with Compute::fp8_matrix");
      return detail::launch_instance<Problem, arch::kMatrixPolicy>(a, dev, workspace,
                                                                    workspace_size, stream);
    } else if constexpr (Problem::kRows > 0) {
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

#endif  // MLAKIT_HAS_GPU_BACKEND

}  // namespace mlakit
