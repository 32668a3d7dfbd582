#pragma once
// Workspace views and the arguments every kernel receives. The workspace holds the plan
// (header, RequestPlan[batch], CtaPlan[num_ctas]) followed by the partial outputs and LSEs of
// split requests: [max_partials][rows_padded][512] values in the output type (16 bits) and
// [max_partials][rows_padded] fp32 LSEs.
#include <cstdint>

#include "../core/decode_args.hpp"
#include "../core/index_divider.hpp"
#include "../core/plan.hpp"

namespace mlakit::detail {

struct WorkspaceView {
  int* header;            // [0] total cost, [1] units per CTA, [2] partial slots used
  RequestPlan* requests;  // [batch]
  CtaPlan* ctas;          // [num_ctas]
  std::uint16_t* partial_o;  // [max_partials][rows_padded][512], bits of the output type
  float* partial_lse;     // [max_partials][rows_padded]
  int rows_padded;        // row_tiles * rows per CTA
};

// Bytes per value of a split piece's partial output: it is stored in the output type (bf16 or
// fp16, already divided by the piece's own softmax sum), which halves the traffic of split
// calls against fp32; the combine merges in fp32 and rounds once more to the output type.
inline constexpr int kPartialOBytes = 2;

struct WorkspaceLayout {
  PlanLayout plan;
  std::int64_t partial_o_offset;
  std::int64_t partial_lse_offset;
  std::int64_t bytes;
};

inline WorkspaceLayout workspace_layout(const PlanShape& shape, int rows_padded) {
  WorkspaceLayout w;
  w.plan = plan_layout(shape);
  const std::int64_t parts = shape.max_partials();
  w.partial_o_offset = w.plan.bytes;
  w.partial_lse_offset =
      align_up(w.partial_o_offset + parts * rows_padded * kHeadDimV * kPartialOBytes, 256);
  w.bytes = align_up(w.partial_lse_offset + parts * rows_padded * 4, 256);
  return w;
}

// Pointers into the workspace at `base` for the layout workspace_layout() computed.
inline WorkspaceView workspace_view(void* base, const WorkspaceLayout& w, int rows_padded) {
  char* p = static_cast<char*>(base);
  WorkspaceView v;
  v.header = reinterpret_cast<int*>(p + w.plan.header_offset);
  v.requests = reinterpret_cast<RequestPlan*>(p + w.plan.requests_offset);
  v.ctas = reinterpret_cast<CtaPlan*>(p + w.plan.ctas_offset);
  v.partial_o = reinterpret_cast<std::uint16_t*>(p + w.partial_o_offset);
  v.partial_lse = reinterpret_cast<float*>(p + w.partial_lse_offset);
  v.rows_padded = rows_padded;
  return v;
}

// Everything a decode kernel launch receives (by value, as kernel parameters).
struct KernelArgs {
  DecodeArgs a;
  PlanShape shape;
  WorkspaceView ws;
  float scale_log2;  // softmax_scale * kv_scale * log2(e): S in base-2 units
  float out_scale;   // kv_scale, applied to P V once at the end
  int self_plan = 0;  // 1: the decode kernel computes the plan itself (no planner launch)
  IndexDivider page;  // division by a.page_size (the Hopper producers' page of a token)
};

}  // namespace mlakit::detail
