#pragma once
// Hopper keys-as-M kernel, decode_kernel_kt (sm_90a device code only; on other targets, and for
// other KV types, the host launches the policy's other mainloop): the 16-, 32- and 64-row
// policies for e4m3fn KV (KtConfig<Rows>) and the 16- and 32-row policies for KV of the Q type
// (KtConfig<Rows, 2>). docs/design.md, "Hopper mainloops", has each form's schedule.
//
// wgmma's M is 64, and a tile of up to 16 rows padded to 64 would waste three quarters of the
// matrix work. Here the keys are M and the rows are N (16, 32 or 64):
//   S^T [64 keys x N rows]  = K [64 x 576] . Q^T [576 x N]      (36 k-steps of m64nNk16)
//   O^T [512 dims x N rows] += V^T [512 x 64] . P^T [64 x N]     (8 dim blocks x 4 k-steps)
// The mainloop, KtMainloop<Tr> (kt/mainloop.hpp), is one of two forms under shared schedules:
//   e4m3fn KV (kt/raw_fp8_form.hpp): the ring holds raw tiles; both products take the KV tile
//     as the A operand from registers (ldmatrix, widened to f16).
//     16 rows: one consumer warpgroup and one producer warp (160 threads), two raw stages, two
//       CTAs per SM (168 registers: a scheduler holding three of the ten warps has 16384). Each
//       tile's matrix work retires before the next tile's starts; the two CTAs of an SM overlap.
//     32 rows: O^T takes 128 registers per thread, so one CTA per SM of 384 threads: consumer
//       warpgroups 0 and 1 take alternate tiles (each with its own P buffer, row-maxima slots
//       and named barriers; their states are merged through the Q region at the end of a
//       piece, merge()), and a producer warpgroup of four copying warps fills four raw stages.
//     64 rows: the two consumer warpgroups split the dims (O^T of 256 dims, 128 registers each)
//       and take pairs of tiles: warpgroup w computes S^T of tile 2 j + w, the pair's row
//       maxima meet in shared memory (atomicMax, NamedBarrier::tile_max), each stores its P,
//       and after NamedBarrier::tile_p each multiplies both tiles' P by its half of V. Three
//       raw stages; an odd tile count is padded with a masked tile (consume_pairs()).
//   16-bit KV of the Q type (kt/chunk_ring_form.hpp): both products read the tile in shared
//     memory (wgmma SS), on a ring of 64-dim chunks (a tile takes nine positions). 16 rows:
//     two consumer warpgroups on alternate tiles; 32 rows: one consumer warpgroup.
//   P is stored with stmatrix.trans (kt/softmax.hpp).
// The kernel: a producer part (threads from kConsumerThreads on) filling the ring and the
// consumer warpgroups, each over the requests of the CTA's plan.
#include <cstdint>

#include "../arch/pipeline_sm90.hpp"
#include "../arch/wgmma_sm90.hpp"
#include "../core/plan.hpp"
#include "../platform/platform.hpp"
#include "decode_kernel.hpp"
#include "kt/mainloop.hpp"
#include "planner_kernel.hpp"
#include "workspace.hpp"

#if defined(MLAKIT_HAS_SM90A_KERNELS)

namespace mlakit::detail {

// The kernel of the keys-as-M mainloop: same grid, plan and workspace as decode_kernel<Tr>
// (planned for KtMainloop<Tr>::kCtasPerSm CTAs per SM). SelfPlan: the kernel that plans for
// itself (KtConfig::kSelfPlanSmall), a kernel of its own so that the planner's code and
// shared memory stay out of the one large batches run (behind a run-time flag in one kernel
// they slowed the large batches; docs/performance.md).
template <class Tr, bool SelfPlan = false>
__global__ void __launch_bounds__(KtMainloop<Tr>::kThreads, KtMainloop<Tr>::kCtasPerSm)
    decode_kernel_kt(const KernelArgs p) {
#if defined(MLAKIT_WGMMA_ENABLED)
  using ML = KtMainloop<Tr>;
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ typename ML::StaticStorage state;
  typename ML::SharedStorage& tiles = *reinterpret_cast<typename ML::SharedStorage*>(smem);
  const int row_tile = static_cast<int>(blockIdx.x);
  const int cta = static_cast<int>(blockIdx.y);
  // Small automatic-mode batches (SelfPlan): the plan is computed here, into shared memory
  // past the mainloop's bytes, instead of by a planner launch.
  CtaWork work;
  if constexpr (SelfPlan)
    work = plan_for_block<ML::kThreads>(p, reinterpret_cast<RequestPlan*>(smem + ML::kSmemBytes),
                                        row_tile, cta);
  else
    work = planned_work(p, cta);
  PieceContext<Tr> ctx = PieceContext<Tr>::of_tile(p, row_tile);
  if (ctx.row0 >= ctx.rows) return;
  if (threadIdx.x == 0) {
    // Each use of a stage is released by the four warps of the warpgroup that consumed it
    // (64 rows: by all eight consumer warps, which all read its V).
    int releasers[ML::SharedStorage::kStages][1];
    for (int s = 0; s < ML::SharedStorage::kStages; ++s) releasers[s][0] = ML::kSplitDims ? 8 : 4;
    ML::Pipeline::init(state.bars, releasers);
    arch::mbar_init_fence();
  }
  __syncthreads();
  ML mainloop{ctx, tiles, state};
  typename ML::State st;
  if (threadIdx.x >= ML::kConsumerThreads) {
    if constexpr (ML::Cfg::kProducerRegs > 0) arch::setmaxnreg_dec<ML::Cfg::kProducerRegs>();
    for (int b = work.cp.req_begin; b <= work.cp.req_end; ++b) {
      ctx.b = b;
      const RequestPlan rq = work.requests[b];
      mainloop.produce(mainloop.range(rq, piece_of(p.shape, rq, cta, work.per_cta)), st);
    }
  } else {
    if constexpr (ML::Cfg::kConsumerRegs > 0) arch::setmaxnreg_inc<ML::Cfg::kConsumerRegs>();
    const int w = static_cast<int>(threadIdx.x) / 128;
    for (int b = work.cp.req_begin; b <= work.cp.req_end; ++b) {
      ctx.b = b;
      const RequestPlan rq = work.requests[b];
      const Piece pc = piece_of(p.shape, rq, cta, work.per_cta);
      mainloop.consume(rq, pc, mainloop.range(rq, pc), st, w);
    }
  }
#else
  (void)p;
#endif
}

}  // namespace mlakit::detail

#endif  // MLAKIT_HAS_SM90A_KERNELS
