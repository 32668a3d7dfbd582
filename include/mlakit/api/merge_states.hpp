#pragma once
// Public API: merge_states(), the merge of partial attention results by their LSEs that
// engines need around decode(): context-parallel decode (each GPU attends to its shard of a
// request's KV, the partials are gathered and merged) and cascade attention (a shared-prefix
// pass and a per-request pass). The same merge decode() runs internally for split requests,
// in a fixed order, so the result is bitwise repeatable.
#include "../core/merge_args.hpp"
#include "../core/status.hpp"
#include "../core/validate_merge.hpp"
#include "../kernel/merge_kernel.hpp"
#include "../platform/runtime.hpp"

namespace mlakit {

// Merges the num_parts partial results of every row of `a` into out (and out_lse when
// given) on `stream`: see MergeArgs. Never aborts: outside the domain (validate_merge()) it
// returns a Status naming the argument, its value and the allowed range. No workspace, no
// host synchronisation, no allocation and no host read of device data, one kernel launch whose
// grid depends on num_tokens and num_heads only: capture-safe, and a captured graph replays
// with new values in the same buffers. num_tokens 0 launches nothing. Runs on the current
// device; `stream` must belong to it (invalid_argument otherwise, as for decode()).
inline Status merge_states(const MergeArgs& a, Stream stream) {
  Status s = validate_merge(a);
  if (s && !kHaveGpuBackend)
    s = Status(StatusCode::not_supported,
               "no GPU backend: mlakit was compiled without CUDA or HIP (see README)");
  if (!s || a.num_tokens == 0) return s;
#if defined(MLAKIT_HAS_GPU_BACKEND)
  int device = 0;
  if (!(s = detail::current_device(&device))) return s;
  s = detail::with_relaxed_capture([&] { return detail::check_stream_device(stream, device); });
  if (!s) return s;
  return detail::launch_merge(a, stream);
#else
  (void)stream;
  return s;
#endif
}

}  // namespace mlakit
