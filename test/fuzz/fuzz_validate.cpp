// libFuzzer target for the host API: set_packed_strides(), validate(), validate_shape(),
// supported(), workspace_bytes() and decode() (in a build without a GPU backend) on calls
// built from the input, checked by check_host_api() (domain_model.hpp) against an independent
// statement of the README's domain table. Built with ASan and UBSan, so an overflow or an
// out-of-bounds access is a finding too. tools/fuzz.sh builds and runs it (CI: stage a2);
// test/CMakeLists.txt also builds it with replay_main.cpp to replay the corpus under CTest.
//
// Input: a valid call (16 heads, q_len 4, 3 requests, 64-token pages, packed strides) changed
// by a list of edits, each [field][how][value bytes]: `how` < 0x80 picks an edge value (the
// domain's limits, +-1 around them, the int and int64 extremes, powers of two near the span
// bound), 0x80..0xbf adds a small signed delta to the current value, and from 0xc0 up the
// next 8 bytes are the raw value. Pointers stay inside one aligned buffer (validate() never
// reads through them), offset or null.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "domain_model.hpp"

namespace {

using mlakit::DecodeArgs;
using mlakit::DeviceInfo;

alignas(64) unsigned char g_memory[4096];

struct Input {
  const std::uint8_t* p;
  std::size_t n;
  bool empty() const { return n == 0; }
  std::uint8_t byte() {
    if (n == 0) return 0;
    --n;
    return *p++;
  }
  std::uint64_t raw64() {
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= std::uint64_t(byte()) << (8 * i);
    return v;
  }
};

const float kFloatEdges[] = {0.0f,
                             -0.0f,
                             1.0f,
                             -1.0f,
                             0.0721f,
                             1e-8f,
                             std::numeric_limits<float>::denorm_min(),
                             std::numeric_limits<float>::max(),
                             std::numeric_limits<float>::infinity(),
                             -std::numeric_limits<float>::infinity(),
                             std::numeric_limits<float>::quiet_NaN()};
constexpr int kNumFloatEdges = sizeof(kFloatEdges) / sizeof(kFloatEdges[0]);

// The next value of an integer field whose current value is `cur`, as an int64 (callers narrow
// it, as a C++ conversion does: modulo 2^bits).
std::int64_t next_int(Input& in, std::int64_t cur) {
  const std::uint8_t how = in.byte();
  const std::vector<std::int64_t>& edges = mlakit_test::int_edges();
  if (how < 0x80) return edges[how % edges.size()];
  if (how < 0xc0)  // wrapping add of -32..31, in unsigned arithmetic
    return static_cast<std::int64_t>(static_cast<std::uint64_t>(cur) +
                                     static_cast<std::uint64_t>(std::int64_t(how & 0x3f) - 32));
  return static_cast<std::int64_t>(in.raw64());
}

float next_float(Input& in) {
  const std::uint8_t how = in.byte();
  if (how < 0xc0) return kFloatEdges[how % kNumFloatEdges];
  const std::uint32_t bits = static_cast<std::uint32_t>(in.raw64());
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Null, or g_memory + an offset below 256 (aligned to 16, or 1, 2, 4, 8 bytes off).
const void* next_ptr(Input& in) {
  const std::uint8_t how = in.byte();
  if (how < 0x20) return nullptr;
  return g_memory + 256 + (how < 0xc0 ? (how & 0x0f) : static_cast<int>(in.raw64() % 256));
}

int to_int(std::int64_t v) { return static_cast<int>(static_cast<std::uint32_t>(v)); }

// The valid call every input starts from.
DecodeArgs base_args() {
  DecodeArgs a;
  a.q_type = mlakit::DType::bf16;
  a.kv_type = mlakit::DType::fp8_e4m3fn;
  a.batch = 3;
  a.num_heads = 16;
  a.q_len = 4;
  a.page_size = 64;
  a.softmax_scale = 0.0721f;
  a.kv_scale = 0.02f;
  a.max_pages_per_request = 40;
  mlakit::set_packed_strides(a);
  a.q = g_memory;
  a.kv = g_memory + 1024;
  a.out = g_memory + 2048;
  a.lse = reinterpret_cast<float*>(g_memory + 3072);
  a.kv_len = reinterpret_cast<const std::int32_t*>(g_memory + 3584);
  a.block_table = reinterpret_cast<const std::int32_t*>(g_memory + 3712);
  a.kv_indptr = reinterpret_cast<const std::int32_t*>(g_memory + 3840);
  a.kv_indices = reinterpret_cast<const std::int32_t*>(g_memory + 3968);
  return a;
}

enum Field : std::uint8_t {
  kQType,
  kKvType,
  kBatch,
  kHeads,
  kQLen,
  kCausal,
  kQ,
  kQStrideBatch,
  kQStrideToken,
  kQStrideHead,
  kKv,
  kKvStridePage,
  kKvStrideToken,
  kPageSize,
  kKvScale,
  kPageIds,
  kBlockTable,
  kBlockTableStride,
  kMaxPages,
  kKvIndptr,
  kKvIndices,
  kKvLen,
  kOut,
  kOStrideBatch,
  kOStrideToken,
  kOStrideHead,
  kLse,
  kLseStrideBatch,
  kLseStrideToken,
  kLseStrideHead,
  kSoftmaxScale,
  kSplitMode,
  kNumSplits,
  kDeterministic,
  kDevDevice,
  kDevSms,
  kDevSmem,
  kDevArch,
  kWorkspace,
  kWorkspaceSize,
  kSetPackedStrides,
  kLseFormat,
  kPlanStep,
  kNumFields
};

template <class E>
E enum_of(std::int64_t v) {
  return static_cast<E>(static_cast<std::uint8_t>(v));
}

void apply_edit(Input& in, DecodeArgs& a, DeviceInfo& dev, void*& ws, std::size_t& ws_size) {
  const auto f = static_cast<Field>(in.byte() % kNumFields);
  auto stride = [&](std::int64_t& s) { s = next_int(in, s); };
  auto integer = [&](int& x) { x = to_int(next_int(in, x)); };
  switch (f) {
    case kQType:
      a.q_type = enum_of<mlakit::DType>(next_int(in, int(a.q_type)));
      break;
    case kKvType:
      a.kv_type = enum_of<mlakit::DType>(next_int(in, int(a.kv_type)));
      break;
    case kBatch:
      integer(a.batch);
      break;
    case kHeads:
      integer(a.num_heads);
      break;
    case kQLen:
      integer(a.q_len);
      break;
    case kCausal:
      a.causal = in.byte() & 1;
      break;
    case kQ:
      a.q = next_ptr(in);
      break;
    case kQStrideBatch:
      stride(a.q_stride_batch);
      break;
    case kQStrideToken:
      stride(a.q_stride_token);
      break;
    case kQStrideHead:
      stride(a.q_stride_head);
      break;
    case kKv:
      a.kv = next_ptr(in);
      break;
    case kKvStridePage:
      stride(a.kv_stride_page);
      break;
    case kKvStrideToken:
      stride(a.kv_stride_token);
      break;
    case kPageSize:
      integer(a.page_size);
      break;
    case kKvScale:
      a.kv_scale = next_float(in);
      break;
    case kPageIds:
      a.page_ids = enum_of<mlakit::PageIds>(next_int(in, int(a.page_ids)));
      break;
    case kBlockTable:
      a.block_table = static_cast<const std::int32_t*>(next_ptr(in));
      break;
    case kBlockTableStride:
      stride(a.block_table_stride);
      break;
    case kMaxPages:
      integer(a.max_pages_per_request);
      break;
    case kKvIndptr:
      a.kv_indptr = static_cast<const std::int32_t*>(next_ptr(in));
      break;
    case kKvIndices:
      a.kv_indices = static_cast<const std::int32_t*>(next_ptr(in));
      break;
    case kKvLen:
      a.kv_len = static_cast<const std::int32_t*>(next_ptr(in));
      break;
    case kOut:
      a.out = const_cast<void*>(next_ptr(in));
      break;
    case kOStrideBatch:
      stride(a.o_stride_batch);
      break;
    case kOStrideToken:
      stride(a.o_stride_token);
      break;
    case kOStrideHead:
      stride(a.o_stride_head);
      break;
    case kLse:
      a.lse = static_cast<float*>(const_cast<void*>(next_ptr(in)));
      break;
    case kLseStrideBatch:
      stride(a.lse_stride_batch);
      break;
    case kLseStrideToken:
      stride(a.lse_stride_token);
      break;
    case kLseStrideHead:
      stride(a.lse_stride_head);
      break;
    case kSoftmaxScale:
      a.softmax_scale = next_float(in);
      break;
    case kSplitMode:
      a.split_mode = enum_of<mlakit::SplitMode>(next_int(in, int(a.split_mode)));
      break;
    case kNumSplits:
      integer(a.num_splits);
      break;
    case kDeterministic:
      a.deterministic = in.byte() & 1;
      break;
    case kDevDevice:
      integer(dev.device);
      break;
    case kDevSms:
      integer(dev.sm_count);
      break;
    case kDevSmem:
      integer(dev.max_smem_optin);
      break;
    case kDevArch:
      integer(dev.arch);
      break;
    case kWorkspace:
      ws = const_cast<void*>(next_ptr(in));
      break;
    case kWorkspaceSize:
      ws_size = static_cast<std::size_t>(next_int(in, std::int64_t(ws_size)));
      break;
    case kSetPackedStrides:
      mlakit::set_packed_strides(a);
      break;
    case kLseFormat:
      a.lse_format = enum_of<mlakit::LseFormat>(next_int(in, int(a.lse_format)));
      break;
    case kPlanStep:
      a.plan_step = enum_of<mlakit::PlanStep>(next_int(in, int(a.plan_step)));
      break;
    case kNumFields:
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Input in{data, size};
  DecodeArgs a = base_args();
  DeviceInfo dev{0, 132, 232448, 90};
  void* ws = g_memory;
  std::size_t ws_size = 1 << 20;
  while (!in.empty()) apply_edit(in, a, dev, ws, ws_size);
  // The planner's inputs straight from the edited fields, valid or not: no overflow (UBSan).
  volatile int sink = mlakit::plan_num_ctas(a.split_mode, a.num_splits, a.batch, a.num_heads,
                                            dev.sm_count, dev.arch);
  sink = a.rows();
  if (a.page_ids == mlakit::PageIds::block_table)
    sink = static_cast<int>(mlakit::page_capacity(a, 0) & 1);
  (void)sink;
  const std::string error = mlakit_test::check_host_api(a, dev, ws, ws_size);
  if (!error.empty()) {
    std::fprintf(stderr, "fuzz_validate: %s\n", error.c_str());
    std::abort();
  }
  return 0;
}
