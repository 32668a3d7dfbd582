#pragma once
// The host's record of the split plan each workspace holds (DecodeArgs::plan_step). A
// PlanStep::decode_only call reads the plan an earlier call enqueued into its workspace, and
// no kernel can tell a plan of another call from its own; so decode() refuses a decode_only
// call, with a Status and before any launch, unless the last call that enqueued a planner into
// the same workspace address had the plan inputs this one has as far as the host sees them.
#include <cstddef>
#include <mutex>
#include <unordered_map>

#include "../core/decode_args.hpp"
#include "../core/plan.hpp"

namespace mlakit::detail {

// What a plan depends on that the host sees: the plan shape (batch, row tiles, CTAs, split
// mode, piece rules; the plan kernel reads nothing else of the kernel choice, and the plan's
// place in the workspace follows from it), the kv_len array by address and each request's
// page capacity: a block table's width and the page size, or the CSR offsets (kv_indptr) by
// address. The block table's address and entries and kv_indices do not enter a plan. The
// kv_len values and CSR offsets live on the device: the caller keeps them unchanged from the
// planning call to its decode_only calls (README, "plan step").
struct PlanRecord {
  PlanShape shape;
  const void* kv_len = nullptr;
  PageIds page_ids = PageIds::block_table;
  const void* kv_indptr = nullptr;  // CSR only
  int max_pages_per_request = 0;    // block tables only
  int page_size = 0;
};

inline PlanRecord plan_record_of(const DecodeArgs& a, const PlanShape& shape) {
  PlanRecord r;
  r.shape = shape;
  r.kv_len = a.kv_len;
  r.page_ids = a.page_ids;
  const bool table = a.page_ids == PageIds::block_table;
  r.kv_indptr = table ? nullptr : a.kv_indptr;
  r.max_pages_per_request = table ? a.max_pages_per_request : 0;
  r.page_size = a.page_size;
  return r;
}

inline bool same_plan(const PlanRecord& x, const PlanRecord& y) {
  return x.shape == y.shape && x.kv_len == y.kv_len && x.page_ids == y.page_ids &&
         x.kv_indptr == y.kv_indptr && x.max_pages_per_request == y.max_pages_per_request &&
         x.page_size == y.page_size;
}

// Workspace address -> the plan last enqueued into it, for every thread of the process. A
// workspace freed and its address reused keeps the entry: a decode_only call there is taken
// as reading that plan. Beyond kMaxEntries workspaces the record starts afresh (their
// decode_only calls are refused until they plan again).
class PlanRegistry {
 public:
  static constexpr std::size_t kMaxEntries = 4096;

  static PlanRegistry& instance() {
    static PlanRegistry r;
    return r;
  }
  void note(const void* workspace, const PlanRecord& r) {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (plans_.size() >= kMaxEntries && plans_.find(workspace) == plans_.end()) plans_.clear();
    plans_[workspace] = r;
  }
  void forget(const void* workspace) {
    const std::lock_guard<std::mutex> lock(mutex_);
    plans_.erase(workspace);
  }
  bool holds(const void* workspace, const PlanRecord& r) const {
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto it = plans_.find(workspace);
    return it != plans_.end() && same_plan(it->second, r);
  }

 private:
  mutable std::mutex mutex_;
  std::unordered_map<const void*, PlanRecord> plans_;
};

}  // namespace mlakit::detail
