#pragma once
// The device planner: one block reads kv_len and writes the work list (RequestPlan per
// request, CtaPlan per CTA) with the same functions as plan_on_host(). No host read, no
// dependence of the grid on kv_len: graph capture safe. Page capacities and the kv_len clamp
// are core/plan.hpp's page_capacity() and clamp_kv_len(), which the host reference uses too.
#include "../core/plan.hpp"
#include "../platform/block_scan.hpp"
#include "../platform/platform.hpp"
#include "workspace.hpp"

namespace mlakit::detail {

// Automatic-mode batches up to this many requests are planned by the mma.sync decode kernel
// itself (every block, RequestPlan[batch] in shared memory): no planner launch. The slack
// covers the planner's static shared memory (scan storage) next to the kernel's own.
inline constexpr int kSelfPlanMaxBatch = 128;
inline constexpr int kSelfPlanBytes = kSelfPlanMaxBatch * static_cast<int>(sizeof(RequestPlan));
inline constexpr int kSelfPlanStaticSlack = 1024;

}  // namespace mlakit::detail

#if defined(MLAKIT_HAS_GPU_BACKEND)

namespace mlakit::detail {

inline constexpr int kPlannerThreads = 1024;
// Batches up to this many requests get a planner block of this size: one pass per scan and
// fewer threads to synchronise, which shortens the planner on the small-batch latency path.
inline constexpr int kSmallPlannerThreads = 128;

// The plan's per-request part, computed by one block of `Threads` threads: passes 1-3 below
// write RequestPlan[batch] to `req` (global memory in plan_kernel, shared memory in a decode
// kernel that plans for itself) and return the budget per CTA, the total cost and the number
// of partial slots. Every thread of the block must call it; it ends with a barrier.
struct BlockPlan {
  int per_cta;
  int total;
  int partials;
};

// kFindShift: PlanShape::may_shift; false compiles to a single first pass with shift 0 (the
// code every ordinary batch runs), true finds the longest request before counting.
// scan_storage and max_len: the block's shared memory (plan_requests declares it once for both
// forms).
template <int Threads, bool kFindShift>
__device__ BlockPlan plan_requests_impl(const DecodeArgs& a, const PlanShape& shape,
                                        RequestPlan* req,
                                        typename BlockExclusiveSum<Threads>::Storage& scan_storage,
                                        int& max_len) {
  using Scan = BlockExclusiveSum<Threads>;
  const int tid = static_cast<int>(threadIdx.x);

  // Pass 1: clamped lengths, the longest one and the sum of the costs. The longest sets the
  // tile shift of the line (plan_tile_shift: 0 unless the line would pass kMaxLineUnits); with
  // kFindShift it is found first and the costs are counted after it, else the shift is 0.
  if (tid == 0) max_len = 0;
  __syncthreads();
  int shift = 0;
  if constexpr (kFindShift) {
    for (int b = tid; b < shape.batch; b += Threads) {
      const int len = clamp_kv_len(a.kv_len[b], page_capacity(a, b));
      req[b].kv_len = len;  // read back by this same thread below
      atomicMax(&max_len, len);  // order-free: the result is deterministic
    }
    __syncthreads();
    shift = plan_tile_shift(shape, kv_tiles(max_len));
  }
  int sum = 0;
  for (int base = 0; base < shape.batch; base += Threads) {
    const int b = base + tid;
    int cost = 0;
    if (b < shape.batch) {
      int len;
      if constexpr (kFindShift) {
        len = req[b].kv_len;
      } else {
        len = clamp_kv_len(a.kv_len[b], page_capacity(a, b));
        req[b].kv_len = len;  // read back by this same thread below
        atomicMax(&max_len, len);  // order-free: the result is deterministic
      }
      cost = request_cost(shape, len, shift);
    }
    int excl = 0, total = 0;
    Scan(scan_storage).run(cost, excl, total);
    sum += total;
    __syncthreads();
  }
  // max_len is complete: each loop above ends with __syncthreads (batch > 0 whenever it runs).
  BlockPlan out;
  const PlanBudget budget = plan_budget(shape, sum, request_cost(shape, max_len, shift), shift);
  out.per_cta = budget.per_cta;

  // Pass 2: the exclusive scan of the requests' units on the line.
  int carry = 0;
  for (int base = 0; base < shape.batch; base += Threads) {
    const int b = base + tid;
    int cost = 0;
    if (b < shape.batch) cost = line_cost(shape, budget, req[b].kv_len);
    int excl = 0, total = 0;
    Scan(scan_storage).run(cost, excl, total);
    if (b < shape.batch) {
      req[b].cost_begin = carry + excl;
      req[b].cost = cost;
    }
    carry += total;
    __syncthreads();
  }
  out.total = carry;

  // Pass 3: CTAs touching each request, and partial slots of split requests.
  carry = 0;
  for (int base = 0; base < shape.batch; base += Threads) {
    const int b = base + tid;
    RequestPlan r{};
    int pieces = 0;
    if (b < shape.batch) {
      r = req[b];  // written by this same thread in pass 2
      request_ctas(shape, r, out.per_cta);
      pieces = r.num_pieces > 1 ? r.num_pieces : 0;
    }
    int excl = 0, total = 0;
    Scan(scan_storage).run(pieces, excl, total);
    if (b < shape.batch) {
      r.partial_base = carry + excl;
      req[b] = r;
    }
    carry += total;
    __syncthreads();
  }
  out.partials = carry;
  return out;
}

// The plan's per-request part (plan_requests_impl), for lengths that may (shape.may_shift) or
// cannot shift the line.
template <int Threads>
__device__ BlockPlan plan_requests(const DecodeArgs& a, const PlanShape& shape,
                                   RequestPlan* req) {
  __shared__ typename BlockExclusiveSum<Threads>::Storage scan_storage;
  __shared__ int max_len;
  return shape.may_shift
             ? plan_requests_impl<Threads, true>(a, shape, req, scan_storage, max_len)
             : plan_requests_impl<Threads, false>(a, shape, req, scan_storage, max_len);
}

// The workspace header of a plan: total cost, budget per CTA, partial slots used.
__device__ inline void store_plan_header(const WorkspaceView& ws, const BlockPlan& bp) {
  ws.header[0] = bp.total;
  ws.header[1] = bp.per_cta;
  ws.header[2] = bp.partials;
}

// The work of one decode-kernel CTA: its request range, the budget per CTA and the requests'
// plans it reads.
struct CtaWork {
  CtaPlan cp;
  int per_cta;
  const RequestPlan* requests;
};

// The work the planner kernel wrote to the workspace for CTA `cta`.
__device__ inline CtaWork planned_work(const KernelArgs& p, int cta) {
  return CtaWork{p.ws.ctas[cta], p.ws.header[1], p.ws.requests};
}

// A decode kernel that plans for itself (small automatic-mode batches, no planner launch):
// every block of `Threads` threads runs the planner's passes (same functions, same plan in
// every block) into `req`, RequestPlan[batch] in its shared memory, and works from there. The
// combine reads the plan from the workspace: each request's first CTA of row tile 0 stores it
// there, CTA (0, 0) the header. Every thread of the block must call it.
template <int Threads>
__device__ CtaWork plan_for_block(const KernelArgs& p, RequestPlan* req, int row_tile, int cta) {
  const BlockPlan bp = plan_requests<Threads>(p.a, p.shape, req);
  const CtaWork w{cta_plan_of(req, p.shape.batch, cta, bp.per_cta, bp.total), bp.per_cta, req};
  if (row_tile == 0) {
    for (int b = static_cast<int>(threadIdx.x); b < p.shape.batch; b += Threads)
      if (req[b].first_cta == cta) p.ws.requests[b] = req[b];
    if (cta == 0 && threadIdx.x == 0) store_plan_header(p.ws, bp);
  }
  return w;
}

// The planner kernel. kSharedPlan (batch <= Threads): the passes run on RequestPlan[batch] in
// shared memory and the plan is copied to the workspace at the end, so that the read-backs of
// passes 2 and 3 and the binary searches of pass 4 wait on shared memory, not on L2 (each
// step of the search depends on the one before; at small batch the planner is latency bound).
template <int Threads = kPlannerThreads, bool kSharedPlan = false>
__global__ void __launch_bounds__(Threads)
    plan_kernel(DecodeArgs a, PlanShape shape, WorkspaceView ws) {
  constexpr int kSharedRequests = kSharedPlan ? Threads : 1;
  __shared__ RequestPlan shared_req[kSharedRequests];
  RequestPlan* const req = kSharedPlan ? shared_req : ws.requests;
  const BlockPlan bp = plan_requests<Threads>(a, shape, req);
  const int tid = static_cast<int>(threadIdx.x);
  if (tid == 0) store_plan_header(ws, bp);
  if constexpr (kSharedPlan) {
    // plan_requests ends with a barrier: every RequestPlan is in shared memory.
    for (int b = tid; b < shape.batch; b += Threads) ws.requests[b] = req[b];
  } else {
    __syncthreads();  // every RequestPlan is written before the CTA ranges search them
  }

  // Pass 4: request range of every CTA.
  for (int c = tid; c < shape.num_ctas; c += Threads)
    ws.ctas[c] = cta_plan_of(req, shape.batch, c, bp.per_cta, bp.total);
}

}  // namespace mlakit::detail

#endif  // MLAKIT_HAS_GPU_BACKEND
