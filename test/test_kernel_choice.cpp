// Host tests of the kernel choice (api/kernel_choice.hpp): the kernels an instantiation holds,
// which one choose_kernel() launches for a call (the sm_90a probe answered by the test), the
// plan it aims for, and that every choice's plan fits workspace_bytes(). Host builds model the
// NVIDIA policy table (arch/tile_policy.hpp), so the cases below are NVIDIA's.
#include <catch2/catch.hpp>
#include <cstddef>
#include <utility>
#include <vector>

#include "mlakit/api/decode.hpp"
#include "mlakit/api/kernel_choice.hpp"
#include "mlakit/core/decode_args.hpp"
#include "mlakit/core/plan.hpp"
#include "mlakit/kernel/workspace.hpp"

using namespace mlakit;
using arch::Mainloop;
using detail::choose_kernel;
using detail::EntryKernels;
using detail::EntryKv;
using detail::KernelChoice;

namespace {

const DeviceInfo kH100{0, 132, 232448, 90};
const DeviceInfo kA100{0, 108, 166912, 80};

DecodeArgs args(DType kv, int heads, int q_len, int batch, int page = 64,
                SplitMode mode = SplitMode::automatic) {
  DecodeArgs a;
  a.q_type = DType::bf16;
  a.kv_type = kv;
  a.num_heads = heads;
  a.q_len = q_len;
  a.batch = batch;
  a.page_size = page;
  a.split_mode = mode;
  a.num_splits = 4;
  a.max_pages_per_request = 64;
  return a;
}

// A probe that answers `answer` and records what it was asked.
struct Probe {
  bool answer = true;
  StatusCode code = StatusCode::ok;
  mutable std::vector<std::pair<Mainloop, bool>> asked;
  Status operator()(Mainloop m, bool self_plan, bool* usable) const {
    asked.emplace_back(m, self_plan);
    *usable = answer;
    return code == StatusCode::ok ? Status::ok() : Status(code, "probe failed");
  }
};

KernelChoice choose(const DecodeArgs& a, const DeviceInfo& dev, const Probe& probe) {
  const int policy = detail::policy_index(a, dev);
  KernelChoice c;
  REQUIRE(
      choose_kernel(a, dev, detail::entry_kernels(policy, detail::table_entry_kv(a)), probe, &c));
  return c;
}

}  // namespace

TEST_CASE("entry_kernels: the kernels each instantiation of the NVIDIA table holds",
          "[kernel_choice]") {
  REQUIRE(arch::kNumPolicies == 3);
  const EntryKernels fp8_16 = detail::entry_kernels(0, EntryKv::e4m3fn);
  CHECK(fp8_16.e4m3fn_operands);
  CHECK(fp8_16.keys_as_m);
  CHECK(fp8_16.keys_as_m_self_plan);
  CHECK_FALSE(fp8_16.warpgroup);
  CHECK(fp8_16.ids_ahead_by_page);
  CHECK(fp8_16.mma_ctas_per_sm == 3);
  // Q 18 KB, two raw 18 KB stages, P, row exchange, Q row scales.
  CHECK(fp8_16.mma_smem_bytes == 18432 + 36864 + 1024 + 512 + 64);

  const EntryKernels bf16_16 = detail::entry_kernels(0, EntryKv::q_type);
  CHECK(bf16_16.direct);
  CHECK(bf16_16.keys_as_m);
  CHECK_FALSE(bf16_16.keys_as_m_self_plan);
  CHECK_FALSE(bf16_16.ids_ahead_by_page);
  CHECK(bf16_16.mma_ctas_per_sm == 2);
  CHECK(bf16_16.mma_smem_bytes == 18432 + 73728 + 1024 + 512);  // two 36 KB bf16 stages

  const EntryKernels any_16 = detail::entry_kernels(0, EntryKv::converted);
  CHECK_FALSE(any_16.keys_as_m);
  CHECK_FALSE(any_16.e4m3fn_operands);
  CHECK(any_16.mma_smem_bytes == 18432 + 36864 + 36864 + 1024 + 512);  // one stage, raw bytes

  const EntryKernels fp8_32 = detail::entry_kernels(1, EntryKv::e4m3fn);
  CHECK(fp8_32.keys_as_m);
  CHECK_FALSE(fp8_32.keys_as_m_self_plan);
  CHECK_FALSE(fp8_32.ids_ahead_by_page);  // always ahead: one kernel
  CHECK(fp8_32.mma_ctas_per_sm == 1);

  for (EntryKv kv : {EntryKv::q_type, EntryKv::e4m3fn, EntryKv::converted}) {
    const EntryKernels k64 = detail::entry_kernels(2, kv);
    CHECK(k64.warpgroup);
    CHECK(k64.keys_as_m == (kv == EntryKv::e4m3fn));
  }
}

TEST_CASE("choose_kernel: e4m3fn KV, 16 rows", "[kernel_choice]") {
  // Below kFp8CtasMinRowTiles in automatic mode: the keys-as-M kernel planning for itself.
  Probe yes;
  KernelChoice c = choose(args(DType::fp8_e4m3fn, 16, 1, 8), kH100, yes);
  REQUIRE(yes.asked.size() == 1);
  CHECK(yes.asked[0] == std::pair{Mainloop::keys_as_m, true});
  CHECK(c.mainloop == Mainloop::keys_as_m);
  CHECK(c.self_plan);
  CHECK(c.resident_ctas_per_sm == 2);
  CHECK(c.ctas_per_sm == 2);

  // Where the device does not run the sm_90a code: decode_kernel, planning for itself, and its
  // page-ids-ahead form below the 32-token tile; three CTAs resident, two planned for.
  Probe no;
  no.answer = false;
  for (int page : {1, 16, 32, 64}) {
    c = choose(args(DType::fp8_e4m3fn, 16, 1, 8, page), kH100, no);
    CHECK(c.mainloop == Mainloop::warp_mma);
    CHECK(c.self_plan);
    CHECK(c.ids_ahead == (page < 32));
    CHECK(c.resident_ctas_per_sm == 3);
    CHECK(c.ctas_per_sm == 2);
  }

  // Fixed split mode below the threshold: no probe, decode_kernel with the planner launch.
  Probe asked;
  c = choose(args(DType::fp8_e4m3fn, 16, 1, 8, 64, SplitMode::fixed), kH100, asked);
  CHECK(asked.asked.empty());
  CHECK(c.mainloop == Mainloop::warp_mma);
  CHECK_FALSE(c.self_plan);

  // From kFp8CtasMinRowTiles up: the keys-as-M kernel with the planner launch, whatever the
  // mode; decode_kernel aims for its three CTAs where the device refuses it.
  for (SplitMode mode : {SplitMode::automatic, SplitMode::none, SplitMode::fixed}) {
    Probe p;
    c = choose(args(DType::fp8_e4m3fn, 16, 1, arch::kFp8CtasMinRowTiles, 64, mode), kH100, p);
    REQUIRE(p.asked.size() == 1);
    CHECK(p.asked[0] == std::pair{Mainloop::keys_as_m, false});
    CHECK(c.mainloop == Mainloop::keys_as_m);
    CHECK_FALSE(c.self_plan);
    CHECK(c.ctas_per_sm == 2);
    c = choose(args(DType::fp8_e4m3fn, 16, 1, arch::kFp8CtasMinRowTiles, 64, mode), kA100, no);
    CHECK(c.ctas_per_sm == 3);
  }
}

TEST_CASE("choose_kernel: e4m3fn KV, 32 and 64 rows", "[kernel_choice]") {
  REQUIRE(arch::kFp8KeysAsMMinRowTiles < arch::kFp8CtasMinRowTiles);
  // 16 heads x q_len 2 (one 32-row tile per request) and x q_len 8 (two 64-row tiles): the
  // keys-as-M kernel with the planner launch from kFp8KeysAsMMinRowTiles requests x row tiles
  // up in every split mode; below, the policy's own kernel, and no probe of a self-planning
  // keys-as-M form (these policies have none).
  struct Shape {
    int q_len, tiles_per_request, policy;
    Mainloop below;
  };
  for (const Shape sh : {Shape{2, 1, 1, Mainloop::warp_mma},
                         Shape{8, 2, 2, Mainloop::warpgroup_split_o}}) {
    const int from = arch::kFp8KeysAsMMinRowTiles / sh.tiles_per_request;
    REQUIRE(from * sh.tiles_per_request == arch::kFp8KeysAsMMinRowTiles);
    for (SplitMode mode : {SplitMode::automatic, SplitMode::none, SplitMode::fixed}) {
      INFO("q_len " << sh.q_len << " mode " << int(mode));
      Probe below;
      KernelChoice c = choose(args(DType::fp8_e4m3fn, 16, sh.q_len, from - 1, 64, mode), kH100,
                              below);
      CHECK(c.policy == sh.policy);
      CHECK(c.mainloop == sh.below);
      for (const auto& q : below.asked) CHECK(q.first != Mainloop::keys_as_m);
      for (int batch : {from, arch::kFp8CtasMinRowTiles, 128}) {
        Probe p;
        c = choose(args(DType::fp8_e4m3fn, 16, sh.q_len, batch, 64, mode), kH100, p);
        REQUIRE_FALSE(p.asked.empty());
        CHECK(p.asked[0] == std::pair{Mainloop::keys_as_m, false});
        CHECK(c.mainloop == Mainloop::keys_as_m);
        CHECK_FALSE(c.self_plan);
      }
      // Where the device does not run the sm_90a code, the policy's mma.sync kernel.
      Probe no;
      no.answer = false;
      c = choose(args(DType::fp8_e4m3fn, 16, sh.q_len, from, 64, mode), kH100, no);
      CHECK(c.mainloop == Mainloop::warp_mma);
    }
  }
  // 16 rows keep the higher threshold: below kFp8CtasMinRowTiles the self-planning form
  // (automatic mode) or the mma.sync kernel (other modes).
  Probe fixed;
  const KernelChoice c = choose(
      args(DType::fp8_e4m3fn, 16, 1, arch::kFp8KeysAsMMinRowTiles, 64, SplitMode::fixed), kH100,
      fixed);
  CHECK(c.mainloop == Mainloop::warp_mma);
  CHECK(fixed.asked.empty());
}

TEST_CASE("choose_kernel: KV of the Q type", "[kernel_choice]") {
  Probe yes;
  // 32 rows from kFp8CtasMinRowTiles requests at large pages: the 16-bit keys-as-M form.
  KernelChoice c = choose(args(DType::bf16, 16, 2, 128, 64), kH100, yes);
  CHECK(c.policy == 1);
  CHECK(c.mainloop == Mainloop::keys_as_m);
  CHECK(c.resident_ctas_per_sm == 1);
  CHECK_FALSE(c.self_plan);
  // Small pages or fewer requests: the warp-specialized 64-row tile (no self plan), or its
  // decode_kernel fallback, which uses the planner launch too.
  for (int batch : {3, 128}) {
    Probe p;
    c = choose(args(DType::bf16, 16, 2, batch, batch == 3 ? 64 : 1), kH100, p);
    CHECK(c.policy == 2);
    REQUIRE(p.asked.size() == 1);
    CHECK(p.asked[0] == std::pair{Mainloop::warpgroup_split_o, false});
    CHECK(c.mainloop == Mainloop::warpgroup_split_o);
    CHECK_FALSE(c.self_plan);
    Probe no;
    no.answer = false;
    c = choose(args(DType::bf16, 16, 2, batch, batch == 3 ? 64 : 1), kH100, no);
    CHECK(c.mainloop == Mainloop::warp_mma);
    CHECK_FALSE(c.self_plan);
  }
  // 16 rows below kSplitOMinRequests16: decode_kernel, planning for itself up to kSelfPlanMaxBatch
  // requests in automatic mode.
  c = choose(args(DType::bf16, 16, 1, 31), kH100, yes);
  CHECK(c.policy == 0);
  CHECK(c.mainloop == Mainloop::warp_mma);
  CHECK(c.self_plan);
  CHECK(c.smem_bytes == c.smem_attr);
  CHECK(c.smem_bytes ==
        detail::entry_kernels(0, EntryKv::q_type).mma_smem_bytes + detail::kSelfPlanBytes);
  // sm_80: the 32-row policy's own kernel; the policy choice never promotes there.
  c = choose(args(DType::bf16, 16, 2, 3), kA100, yes);
  CHECK(c.policy == 1);
  CHECK(c.mainloop == Mainloop::warp_mma);
}

TEST_CASE("choose_kernel: self plan only where it fits and is allowed", "[kernel_choice]") {
  Probe no;
  no.answer = false;
  const DecodeArgs a = args(DType::fp16, 16, 1, 8);
  const int mma = detail::entry_kernels(0, EntryKv::converted).mma_smem_bytes;
  DeviceInfo small = kH100;
  small.max_smem_optin = mma + detail::kSelfPlanBytes + detail::kSelfPlanStaticSlack - 1;
  KernelChoice c = choose(a, small, no);
  CHECK_FALSE(c.self_plan);
  CHECK(c.smem_bytes == mma);
  CHECK(c.smem_attr == mma);
  small.max_smem_optin += 1;
  c = choose(a, small, no);
  CHECK(c.self_plan);
  CHECK(c.smem_bytes == mma + detail::kSelfPlanBytes);
  // More requests than the kernel plans for, or a mode other than automatic: the planner.
  CHECK_FALSE(choose(args(DType::fp16, 16, 1, detail::kSelfPlanMaxBatch + 1), kH100, no).self_plan);
  CHECK(choose(args(DType::fp16, 16, 1, detail::kSelfPlanMaxBatch), kH100, no).self_plan);
  CHECK_FALSE(choose(args(DType::fp16, 16, 1, 8, 64, SplitMode::none), kH100, no).self_plan);
  CHECK(choose(args(DType::fp16, 16, 1, 8, 64, SplitMode::none), kH100, no).smem_attr ==
        mma + detail::kSelfPlanBytes);
}

TEST_CASE("choose_kernel: the probe's error is returned as is", "[kernel_choice]") {
  Probe failing;
  failing.code = StatusCode::runtime_error;
  const DecodeArgs a = args(DType::fp8_e4m3fn, 16, 1, 128);
  KernelChoice c;
  const Status s = choose_kernel(
      a, kH100, detail::entry_kernels(detail::policy_index(a, kH100), EntryKv::e4m3fn), failing,
      &c);
  CHECK(s.code() == StatusCode::runtime_error);
}

TEST_CASE("choose_kernel: every outcome's plan fits workspace_bytes()", "[kernel_choice]") {
  for (const DeviceInfo& dev : {kH100, kA100})
    for (DType kv : {DType::bf16, DType::fp16, DType::fp8_e4m3fn, DType::fp8_e4m3fnuz})
      for (auto [heads, q_len] : {std::pair{16, 1}, {16, 2}, {12, 3}, {16, 4}, {128, 1}, {16, 8}})
        for (int batch : {1, 8, 31, 32, 128, 300})
          for (int page : {1, 64})
            for (SplitMode mode : {SplitMode::automatic, SplitMode::none, SplitMode::fixed})
              for (bool usable : {true, false}) {
                const DecodeArgs a = args(kv, heads, q_len, batch, page, mode);
                INFO("arch " << dev.arch << " kv " << int(kv) << " rows " << a.rows() << " batch "
                             << batch << " page " << page << " mode " << int(mode) << " usable "
                             << usable);
                Probe p;
                p.answer = usable;
                const KernelChoice c = choose(a, dev, p);
                CHECK(c.ctas_per_sm >= 1);
                CHECK(c.ctas_per_sm <= c.resident_ctas_per_sm);
                const PlanShape s = detail::plan_shape_of(a, dev, c);
                const int rows = arch::kPolicies[c.policy].rows;
                CHECK(std::size_t(detail::workspace_layout(s, s.row_tiles * rows).bytes) <=
                      workspace_bytes(a, dev));
                // The table's choice (sm_90a code where arch is 90) is one of these.
                const KernelChoice t = choose_kernel(a, dev);
                if (usable == (dev.arch == 90)) {
                  CHECK(t.mainloop == c.mainloop);
                  CHECK(t.ctas_per_sm == c.ctas_per_sm);
                  CHECK(t.self_plan == c.self_plan);
                }
              }
}

TEST_CASE("plan_shape_of: pair steps and piece weights for the 64-row Hopper kernels only",
          "[kernel_choice]") {
  const Probe yes;
  Probe no;
  no.answer = false;
  // 16 heads x q_len 8 (two 64-row tiles), batch 1: the split-O kernel, with bf16 KV (the Q
  // type: pieces of every row tile counted) and with e4m3fn KV below kFp8CtasMinRowTiles (its
  // producer converts: one row tile counted).
  for (DType kv : {DType::bf16, DType::fp8_e4m3fn}) {
    const DecodeArgs a = args(kv, 16, 8, 1);
    const KernelChoice c = choose(a, kH100, yes);
    INFO("kv " << int(kv));
    REQUIRE(c.mainloop == Mainloop::warpgroup_split_o);
    const PlanShape s = detail::plan_shape_of(a, kH100, c);
    CHECK(s.tile_step == detail::kPairTileStep);
    CHECK(s.partials_per_tile == detail::kPairPartialsPerTile);
    CHECK(s.count_row_tiles == (kv == DType::bf16));
    // The same call without the sm_90a kernels (mma.sync): no weight.
    const KernelChoice m = choose(a, kH100, no);
    REQUIRE(m.mainloop == Mainloop::warp_mma);
    const PlanShape sm = detail::plan_shape_of(a, kH100, m);
    CHECK(sm.tile_step == 1);
    CHECK(sm.partials_per_tile == 0);
  }
  // e4m3fn KV from kFp8CtasMinRowTiles requests x row tiles up: the 64-row keys-as-M kernel.
  const DecodeArgs big = args(DType::fp8_e4m3fn, 16, 8, 32);
  const KernelChoice kt = choose(big, kH100, yes);
  REQUIRE(kt.mainloop == Mainloop::keys_as_m);
  const PlanShape skt = detail::plan_shape_of(big, kH100, kt);
  CHECK(skt.tile_step == detail::kPairTileStep);
  CHECK(skt.partials_per_tile == detail::kPairPartialsPerTile);
  CHECK_FALSE(skt.count_row_tiles);
  // 16-row tiles (16 heads x q_len 1): neither.
  const DecodeArgs q1 = args(DType::fp8_e4m3fn, 16, 1, 1);
  const PlanShape s16 = detail::plan_shape_of(q1, kH100, choose(q1, kH100, yes));
  CHECK(s16.tile_step == 1);
  CHECK(s16.partials_per_tile == 0);
}

TEST_CASE("choose_kernel: Compute::fp8_matrix runs the 64-row keys-as-M kernel or nothing",
          "[kernel_choice]") {
  for (auto [heads, q_len] : {std::pair{16, 1}, {16, 2}, {12, 3}, {16, 4}, {16, 8}, {128, 1}})
    for (int batch : {1, 8, 31, 32, 128, 300})
      for (int page : {1, 64})
        for (SplitMode mode : {SplitMode::automatic, SplitMode::none, SplitMode::fixed}) {
          DecodeArgs a = args(DType::fp8_e4m3fn, heads, q_len, batch, page, mode);
          a.compute = Compute::fp8_matrix;
          INFO("rows " << a.rows() << " batch " << batch << " page " << page << " mode "
                       << int(mode));
          CHECK(detail::policy_index(a, kH100) == arch::kMatrixPolicy);
          CHECK(arch::kPolicies[arch::kMatrixPolicy].rows == 64);
          Probe yes;
          const KernelChoice c = choose(a, kH100, yes);
          REQUIRE(yes.asked.size() == 1);
          CHECK(yes.asked[0] == std::pair{Mainloop::keys_as_m, false});
          CHECK(c.mainloop == Mainloop::keys_as_m);
          CHECK_FALSE(c.self_plan);
          CHECK(c.ctas_per_sm == 1);
          // Its plan fits the workspace sized for the shape (which reads no dtype or mode).
          const PlanShape s = detail::plan_shape_of(a, kH100, c);
          CHECK(s.tile_step == 2);
          CHECK(std::size_t(detail::workspace_layout(s, s.row_tiles * 64).bytes) <=
                workspace_bytes(a, kH100));
          // A device without the sm_90a code: not_supported, naming the mode and the device.
          Probe no;
          no.answer = false;
          KernelChoice d;
          const Status st = choose_kernel(
              a, kA100, detail::entry_kernels(arch::kMatrixPolicy, EntryKv::e4m3fn), no, &d);
          CHECK(st.code() == StatusCode::not_supported);
          CHECK(st.message().rfind("compute = fp8_matrix", 0) == 0);
          CHECK(st.message().find("80") != std::string::npos);
        }
}
