// Python binding of mlakit::decode() and mlakit::merge_states(): fills mlakit::DecodeArgs or
// mlakit::MergeArgs from PyTorch tensors (shapes, dtypes and strides taken from the tensors
// themselves) and launches on the current PyTorch CUDA stream of the tensors' device. Every failure
// comes back to Python as a (code, code name, message) triple, never as a C++ exception or an
// abort; the Python layer (mlakit/_op.py) turns it into an exception with the same message.
#include <torch/extension.h>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

#include <mlakit/core/status.hpp>

#include "bridge.hpp"

namespace {

using mlakit::Status;
using mlakit::StatusCode;
using Result = std::tuple<int, std::string, std::string>;

Result to_result(const Status& s) {
  return Result(static_cast<int>(s.code()), mlakit::status_code_name(s.code()), s.message());
}

Result from_bridge(int code, const char* message) {
  return to_result(Status(static_cast<StatusCode>(code), message));
}

Status bad(const std::string& message) { return Status(StatusCode::invalid_argument, message); }

bool to_dtype(at::ScalarType t, mlakit::DType* out) {
  switch (t) {
    case at::kBFloat16:
      *out = mlakit::DType::bf16;
      return true;
    case at::kHalf:
      *out = mlakit::DType::fp16;
      return true;
    case at::kFloat8_e4m3fn:
      *out = mlakit::DType::fp8_e4m3fn;
      return true;
    case at::kFloat8_e4m3fnuz:
      *out = mlakit::DType::fp8_e4m3fnuz;
      return true;
    default:
      return false;
  }
}

std::string shape_of(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

// The checks a caller of this function could get wrong in a way the library cannot see
// (tensor kinds, ranks, index-tensor extents). The Python layer runs the same checks first;
// these keep a direct call from reading outside a tensor.
Status check_tensor(const char* name, const at::Tensor& t, const at::Device& dev, int64_t rank) {
  if (!t.defined()) return bad(std::string(name) + ": a tensor is required");
  if (!t.is_cuda()) return bad(std::string(name) + ": must be a CUDA tensor");
  if (t.device() != dev)
    return bad(std::string(name) + " is on " + t.device().str() + ", q on " + dev.str());
  if (t.dim() != rank)
    return bad(std::string(name) + " has shape " + shape_of(t) + ": expected " +
               std::to_string(rank) + " dimensions");
  return Status::ok();
}

Status check_index(const char* name, const at::Tensor& t, const at::Device& dev, int64_t rank,
                   int64_t min_rows) {
  Status s = check_tensor(name, t, dev, rank);
  if (!s) return s;
  if (t.scalar_type() != at::kInt) return bad(std::string(name) + ": dtype must be int32");
  if (t.size(0) < min_rows)
    return bad(std::string(name) + " has shape " + shape_of(t) + ": needs at least " +
               std::to_string(min_rows) + " rows");
  if (t.size(rank - 1) > 1 && t.stride(rank - 1) != 1)
    return bad(std::string(name) + ": the last dimension must be contiguous");
  return Status::ok();
}

Status fill_args(mlakit::DecodeArgs& a, const at::Tensor& q, const at::Tensor& kv,
                 const std::optional<at::Tensor>& block_table,
                 const std::optional<at::Tensor>& kv_indptr,
                 const std::optional<at::Tensor>& kv_indices, const at::Tensor& kv_len,
                 const at::Tensor& out, const std::optional<at::Tensor>& lse,
                 const std::optional<at::Tensor>& kv_rope) {
  if (!q.defined() || !q.is_cuda()) return bad("q: must be a CUDA tensor");
  const at::Device dev = q.device();
  Status s = check_tensor("q", q, dev, 4);
  if (!s) return s;
  if (!(s = check_tensor("out", out, dev, 4))) return s;
  if (!kv.defined() || (kv.dim() != 3 && kv.dim() != 4))
    return bad("kv_cache: expected [pages, page_size, 576] or [pages, page_size, 1, 576]");
  if (!(s = check_tensor("kv_cache", kv, dev, kv.dim()))) return s;
  if (kv.dim() == 4 && kv.size(2) != 1)
    return bad("kv_cache has shape " + shape_of(kv) + ": one latent KV head expected");

  if (!to_dtype(q.scalar_type(), &a.q_type) || !(a.q_type == mlakit::DType::bf16 ||
                                                 a.q_type == mlakit::DType::fp16))
    return bad("q: dtype must be bfloat16 or float16");
  if (!to_dtype(kv.scalar_type(), &a.kv_type))
    return bad("kv_cache: dtype must be bfloat16, float16, float8_e4m3fn or float8_e4m3fnuz");
  if (out.scalar_type() != q.scalar_type()) return bad("out: dtype must equal q's");

  a.batch = static_cast<int>(q.size(0));
  a.q_len = static_cast<int>(q.size(1));
  a.num_heads = static_cast<int>(q.size(2));
  // Ranges are the library's to check (mlakit::validate names the argument); here only what
  // would not fit the int fields of DecodeArgs.
  constexpr int64_t kIntMax = 0x7fffffff;
  if (q.size(0) > kIntMax || q.size(1) > kIntMax || q.size(2) > kIntMax)
    return bad("q has shape " + shape_of(q) + ": dimensions beyond the int range");
  if (q.size(3) != mlakit::kHeadDimQK || q.stride(3) != 1)
    return bad("q has shape " + shape_of(q) + ": the last dimension must be 576 and contiguous");
  // A joined cache: 576 values per row. With kv_rope: 512 latent values per kv_cache row and
  // 64 rotary values per kv_rope row, the same pages and page size.
  const bool split_cache = kv_rope.has_value() && kv_rope->defined();
  const int64_t kv_width = split_cache ? mlakit::kHeadDimV : mlakit::kHeadDimQK;
  if (kv.size(kv.dim() - 1) != kv_width || kv.stride(kv.dim() - 1) != 1)
    return bad("kv_cache has shape " + shape_of(kv) + ": the last dimension must be " +
               std::to_string(kv_width) + " and contiguous" +
               (split_cache ? " (the latent values, with kv_rope given)" : ""));
  if (split_cache) {
    const at::Tensor& r = *kv_rope;
    if (!(s = check_tensor("kv_rope", r, dev, r.dim()))) return s;
    bool same = r.dim() == kv.dim() && r.scalar_type() == kv.scalar_type();
    for (int64_t d = 0; same && d + 1 < kv.dim(); ++d) same = r.size(d) == kv.size(d);
    if (!same || r.size(r.dim() - 1) != mlakit::kHeadDimQK - mlakit::kHeadDimV ||
        r.stride(r.dim() - 1) != 1)
      return bad("kv_rope has shape " + shape_of(r) +
                 ": expected kv_cache's pages and page size with 64 contiguous values per row, "
                 "in kv_cache's dtype");
    a.kv_rope = r.data_ptr();
    a.kv_rope_stride_page = r.stride(0);
    a.kv_rope_stride_token = r.stride(1);
  }
  if (out.size(0) != q.size(0) || out.size(1) != q.size(1) || out.size(2) != q.size(2) ||
      out.size(3) != mlakit::kHeadDimV || out.stride(3) != 1)
    return bad("out has shape " + shape_of(out) + ": expected [" + std::to_string(a.batch) +
               ", " + std::to_string(a.q_len) + ", " + std::to_string(a.num_heads) +
               ", 512], last dimension contiguous");

  a.q = q.data_ptr();
  a.q_stride_batch = q.stride(0);
  a.q_stride_token = q.stride(1);
  a.q_stride_head = q.stride(2);

  a.kv = kv.data_ptr();
  a.kv_stride_page = kv.stride(0);
  a.kv_stride_token = kv.stride(1);
  if (kv.size(1) > kIntMax)
    return bad("kv_cache has shape " + shape_of(kv) + ": page size beyond the int range");
  a.page_size = static_cast<int>(kv.size(1));

  const bool has_table = block_table.has_value() && block_table->defined();
  const bool has_csr = (kv_indptr.has_value() && kv_indptr->defined()) ||
                       (kv_indices.has_value() && kv_indices->defined());
  if (has_table == has_csr)
    return bad("page ids: give either block_table or both kv_indptr and kv_indices");
  if (has_table) {
    if (!(s = check_index("block_table", *block_table, dev, 2, a.batch))) return s;
    if (block_table->size(1) > kIntMax)
      return bad("block_table has shape " + shape_of(*block_table) +
                 ": pages per request beyond the int range");
    a.page_ids = mlakit::PageIds::block_table;
    a.block_table = block_table->data_ptr<std::int32_t>();
    a.block_table_stride = block_table->stride(0);
    a.max_pages_per_request = static_cast<int>(block_table->size(1));
  } else {
    if (!kv_indptr.has_value() || !kv_indptr->defined() || !kv_indices.has_value() ||
        !kv_indices->defined())
      return bad("page ids: kv_indptr and kv_indices are given together");
    if (!(s = check_index("kv_indptr", *kv_indptr, dev, 1, int64_t(a.batch) + 1))) return s;
    if (!(s = check_index("kv_indices", *kv_indices, dev, 1, 0))) return s;
    a.page_ids = mlakit::PageIds::csr;
    a.kv_indptr = kv_indptr->data_ptr<std::int32_t>();
    a.kv_indices = kv_indices->data_ptr<std::int32_t>();
  }
  if (!(s = check_index("kv_len", kv_len, dev, 1, a.batch))) return s;
  a.kv_len = kv_len.data_ptr<std::int32_t>();

  a.out = out.data_ptr();
  a.o_stride_batch = out.stride(0);
  a.o_stride_token = out.stride(1);
  a.o_stride_head = out.stride(2);
  if (lse.has_value() && lse->defined()) {
    if (!(s = check_tensor("lse", *lse, dev, 3))) return s;
    if (lse->scalar_type() != at::kFloat) return bad("lse: dtype must be float32");
    if (lse->size(0) != q.size(0) || lse->size(1) != q.size(1) || lse->size(2) != q.size(2))
      return bad("lse has shape " + shape_of(*lse) + ": expected [batch, q_len, heads]");
    a.lse = lse->data_ptr<float>();
    a.lse_stride_batch = lse->stride(0);
    a.lse_stride_token = lse->stride(1);
    a.lse_stride_head = lse->stride(2);
  }
  return Status::ok();
}

Result decode(const at::Tensor& q, const at::Tensor& kv_cache,
              const std::optional<at::Tensor>& block_table,
              const std::optional<at::Tensor>& kv_indptr,
              const std::optional<at::Tensor>& kv_indices, const at::Tensor& kv_len,
              const at::Tensor& out, const std::optional<at::Tensor>& lse,
              const std::optional<at::Tensor>& workspace, double softmax_scale, double kv_scale,
              bool causal, int64_t split_mode, int64_t num_splits, int64_t lse_format,
              const std::optional<at::Tensor>& kv_rope, int64_t plan_step, int64_t compute) {
  mlakit::DecodeArgs a;
  Status s =
      fill_args(a, q, kv_cache, block_table, kv_indptr, kv_indices, kv_len, out, lse, kv_rope);
  if (!s) return to_result(s);
  a.softmax_scale = static_cast<float>(softmax_scale);
  a.kv_scale = static_cast<float>(kv_scale);
  // One query token sees every key either way (bottom-right aligned: j <= kv_len - 1): such a
  // call is passed as causal, so it gets the dispatch table's compiled-in hot shapes (causal
  // only), as FlashInfer-style decode calls with causal=False at q_len 1 would not.
  a.causal = causal || a.q_len == 1;
  if (split_mode < 0 || split_mode > 255) split_mode = 255;  // the library names it invalid
  a.split_mode = static_cast<mlakit::SplitMode>(split_mode);
  a.num_splits = static_cast<int>(num_splits);
  if (lse_format < 0 || lse_format > 255) lse_format = 255;  // the library names it invalid
  a.lse_format = static_cast<mlakit::LseFormat>(lse_format);
  if (plan_step < 0 || plan_step > 255) plan_step = 255;  // the library names it invalid
  a.plan_step = static_cast<mlakit::PlanStep>(plan_step);
  if (compute < 0 || compute > 255) compute = 255;  // the library names it invalid
  a.compute = static_cast<mlakit::Compute>(compute);

  void* ws = nullptr;
  std::size_t ws_bytes = 0;
  if (workspace.has_value() && workspace->defined()) {
    if (!workspace->is_cuda() || workspace->device() != q.device() || !workspace->is_contiguous())
      return to_result(bad("workspace: must be a contiguous CUDA tensor on q's device"));
    ws = workspace->data_ptr();
    ws_bytes = static_cast<std::size_t>(workspace->numel()) * workspace->element_size();
  }
  try {
    const c10::cuda::CUDAGuard guard(q.device());
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(q.device().index()).stream();
    char message[mlakit_torch::kMessageCapacity] = {};
    const int code =
        mlakit_torch::run_decode(a, ws, ws_bytes, stream, message, sizeof(message));
    return from_bridge(code, message);
  } catch (const c10::Error& e) {  // PyTorch could not select the device or its stream
    return to_result(Status(StatusCode::runtime_error, e.what_without_backtrace()));
  }
}

// The capture sequence id of the current CUDA stream of device `device_index` (unique per
// capture in the process), 0 when the stream is not capturing, -1 when the runtime cannot say.
int64_t capture_id(int64_t device_index) {
  try {
    const cudaStream_t stream =
        c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_index)).stream();
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    unsigned long long id = 0;
    if (cudaStreamGetCaptureInfo(stream, &status, &id) != cudaSuccess) {
      (void)cudaGetLastError();
      return -1;
    }
    return status == cudaStreamCaptureStatusActive ? static_cast<int64_t>(id) : 0;
  } catch (const c10::Error&) {
    return -1;
  }
}

bool to_merge_dtype(at::ScalarType t, mlakit::MergeDType* out) {
  switch (t) {
    case at::kBFloat16:
      *out = mlakit::MergeDType::bf16;
      return true;
    case at::kHalf:
      *out = mlakit::MergeDType::fp16;
      return true;
    case at::kFloat:
      *out = mlakit::MergeDType::fp32;
      return true;
    default:
      return false;
  }
}

// mlakit::merge_states(): part_o [N, T, H, D], part_lse [N, T, H] float32, out [T, H, D],
// out_lse [T, H] float32 or None; strides from the tensors (the library checks them).
Result merge_states(const at::Tensor& part_o, const at::Tensor& part_lse, const at::Tensor& out,
                    const std::optional<at::Tensor>& out_lse) {
  if (!part_o.defined() || !part_o.is_cuda())
    return to_result(bad("part_o: must be a CUDA tensor"));
  const at::Device dev = part_o.device();
  Status s = check_tensor("part_o", part_o, dev, 4);
  if (s) s = check_tensor("part_lse", part_lse, dev, 3);
  if (s) s = check_tensor("out", out, dev, 3);
  if (!s) return to_result(s);
  mlakit::MergeArgs a;
  if (!to_merge_dtype(part_o.scalar_type(), &a.part_type))
    return to_result(bad("part_o: dtype must be bfloat16, float16 or float32"));
  if (!to_merge_dtype(out.scalar_type(), &a.out_type))
    return to_result(bad("out: dtype must be bfloat16, float16 or float32"));
  if (part_lse.scalar_type() != at::kFloat)
    return to_result(bad("part_lse: dtype must be float32"));
  constexpr int64_t kIntMax = 0x7fffffff;
  for (int64_t i = 0; i < 4; ++i)
    if (part_o.size(i) > kIntMax)
      return to_result(
          bad("part_o has shape " + shape_of(part_o) + ": dimensions beyond the int range"));
  if (part_lse.size(0) != part_o.size(0) || part_lse.size(1) != part_o.size(1) ||
      part_lse.size(2) != part_o.size(2))
    return to_result(bad("part_lse has shape " + shape_of(part_lse) +
                         ": expected part_o's first three dimensions"));
  if (out.size(0) != part_o.size(1) || out.size(1) != part_o.size(2) ||
      out.size(2) != part_o.size(3))
    return to_result(
        bad("out has shape " + shape_of(out) + ": expected [tokens, heads, head_dim] of part_o"));
  if ((part_o.size(3) > 1 && part_o.stride(3) != 1) || (out.size(2) > 1 && out.stride(2) != 1))
    return to_result(bad("part_o and out: the last dimension must be contiguous"));
  a.num_parts = static_cast<int>(part_o.size(0));
  a.num_tokens = static_cast<int>(part_o.size(1));
  a.num_heads = static_cast<int>(part_o.size(2));
  a.head_dim = static_cast<int>(part_o.size(3));
  a.part_o = part_o.data_ptr();
  a.part_o_stride_part = part_o.stride(0);
  a.part_o_stride_token = part_o.stride(1);
  a.part_o_stride_head = part_o.stride(2);
  a.part_lse = part_lse.data_ptr<float>();
  a.part_lse_stride_part = part_lse.stride(0);
  a.part_lse_stride_token = part_lse.stride(1);
  a.part_lse_stride_head = part_lse.stride(2);
  a.out = out.data_ptr();
  a.out_stride_token = out.stride(0);
  a.out_stride_head = out.stride(1);
  if (out_lse.has_value() && out_lse->defined()) {
    if (!(s = check_tensor("out_lse", *out_lse, dev, 2))) return to_result(s);
    if (out_lse->scalar_type() != at::kFloat)
      return to_result(bad("out_lse: dtype must be float32"));
    if (out_lse->size(0) != out.size(0) || out_lse->size(1) != out.size(1))
      return to_result(
          bad("out_lse has shape " + shape_of(*out_lse) + ": expected [tokens, heads]"));
    a.out_lse = out_lse->data_ptr<float>();
    a.out_lse_stride_token = out_lse->stride(0);
    a.out_lse_stride_head = out_lse->stride(1);
  }
  try {
    const c10::cuda::CUDAGuard guard(dev);
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(dev.index()).stream();
    char message[mlakit_torch::kMessageCapacity] = {};
    const int code = mlakit_torch::run_merge_states(a, stream, message, sizeof(message));
    return from_bridge(code, message);
  } catch (const c10::Error& e) {
    return to_result(Status(StatusCode::runtime_error, e.what_without_backtrace()));
  }
}

// Workspace bytes for `batch` requests of `rows` rows (heads x q_len) each: the size depends
// on these, the split mode and the device only.
std::tuple<int64_t, int, std::string, std::string> workspace_bytes(int64_t batch, int64_t rows,
                                                                   int64_t split_mode,
                                                                   int64_t num_splits,
                                                                   int64_t device_index) {
  mlakit::DecodeArgs a;
  a.batch = static_cast<int>(batch);
  // The size depends on rows = heads x q_len only; express them as a shape of the domain
  // (heads <= 128, q_len <= 32: rows always come from such a shape, so a divisor exists).
  a.num_heads = static_cast<int>(rows);
  a.q_len = 1;
  for (int q = 1; q <= mlakit::kMaxQLen; ++q)
    if (rows % q == 0 && rows / q <= mlakit::kMaxHeads) {
      a.num_heads = static_cast<int>(rows / q);
      a.q_len = q;
      break;
    }
  a.split_mode = static_cast<mlakit::SplitMode>(split_mode);
  a.num_splits = static_cast<int>(num_splits);
  int64_t bytes = 0;
  Status s;
  if (batch < 0 || batch > mlakit::kMaxBatch || rows < 1 ||
      rows > int64_t(mlakit::kMaxHeads) * mlakit::kMaxQLen)
    s = bad("workspace: batch " + std::to_string(batch) + ", rows " + std::to_string(rows) +
            " outside 0..65535 requests of 1..4096 rows");
  else if (split_mode < 0 || split_mode > 2)
    s = bad("workspace: split mode " + std::to_string(split_mode) + " is not 0, 1 or 2");
  else {
    try {
      const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
      char message[mlakit_torch::kMessageCapacity] = {};
      const int code = mlakit_torch::query_workspace_bytes(a, &bytes, message, sizeof(message));
      s = Status(static_cast<StatusCode>(code), message);
    } catch (const c10::Error& e) {  // no such device, or no usable driver
      s = Status(StatusCode::runtime_error, e.what_without_backtrace());
    }
  }
  return {bytes, static_cast<int>(s.code()), mlakit::status_code_name(s.code()), s.message()};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "mlakit CUDA kernels (use the mlakit package, not this module)";
  m.def("decode", &decode, "mlakit::decode() on the current CUDA stream; returns (code, name, message)",
        py::arg("q"), py::arg("kv_cache"), py::arg("block_table"), py::arg("kv_indptr"),
        py::arg("kv_indices"), py::arg("kv_len"), py::arg("out"), py::arg("lse"),
        py::arg("workspace"), py::arg("softmax_scale"), py::arg("kv_scale"), py::arg("causal"),
        py::arg("split_mode"), py::arg("num_splits"), py::arg("lse_format"),
        py::arg("kv_rope") = py::none(), py::arg("plan_step") = 0, py::arg("compute") = 0);
  m.def("merge_states", &merge_states,
        "mlakit::merge_states() on the current CUDA stream; returns (code, name, message)",
        py::arg("part_o"), py::arg("part_lse"), py::arg("out"), py::arg("out_lse"));
  m.def("capture_id", &capture_id,
        "the current CUDA stream's capture sequence id (0: not capturing, -1: unknown)",
        py::arg("device_index"));
  m.def("workspace_bytes", &workspace_bytes,
        "mlakit::workspace_bytes(); returns (bytes, code, name, message)", py::arg("batch"),
        py::arg("rows"), py::arg("split_mode"), py::arg("num_splits"), py::arg("device_index"));
}
