// Host tests of merge_states()' argument checks (core/validate_merge.hpp, api/merge_states.hpp) on
// a build without a GPU backend: every shape of the domain is accepted; every rejection is
// invalid_argument with a message that names the argument, its value and the allowed range;
// extreme values never overflow the checks; merge_states() answers with a Status (never aborts).
// validate_merge() never dereferences a pointer, so aligned host buffers stand in for device
// memory.
#include <catch2/catch.hpp>
#include <cstdint>
#include <limits>
#include <string>

#include "mlakit/api/merge_states.hpp"
#include "mlakit/core/merge_args.hpp"
#include "mlakit/core/status.hpp"
#include "mlakit/core/validate_merge.hpp"

using namespace mlakit;

namespace {

alignas(64) unsigned char g_bytes[4096];
alignas(64) float g_floats[256];

constexpr std::int64_t kI64Max = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kI64Min = std::numeric_limits<std::int64_t>::min();

// 4 parts of 5 tokens x 3 heads, head_dim 512, packed, bf16 parts into a bf16 output.
MergeArgs valid_args(MergeDType part = MergeDType::bf16, MergeDType out = MergeDType::bf16) {
  MergeArgs a;
  a.part_type = part;
  a.out_type = out;
  a.num_parts = 4;
  a.num_tokens = 5;
  a.num_heads = 3;
  a.head_dim = 512;
  set_packed_strides(a);
  a.part_o = g_bytes;
  a.part_lse = g_floats;
  a.out = g_bytes + 1024;
  a.out_lse = g_floats + 128;
  return a;
}

std::string rejection(const MergeArgs& a) {
  const Status s = validate_merge(a);
  if (s) return "accepted";
  CHECK(s.code() == StatusCode::invalid_argument);
  return s.message();
}

}  // namespace

TEST_CASE("merge_states: packed arguments of the domain are accepted", "[merge]") {
  for (MergeDType p : {MergeDType::bf16, MergeDType::fp16, MergeDType::fp32})
    for (MergeDType o : {MergeDType::bf16, MergeDType::fp16, MergeDType::fp32})
      for (int parts : {1, 2, 8, kMaxMergeParts})
        for (int tokens : {0, 1, 7, kMaxMergeTokens})
          for (int heads : {1, 16, kMaxMergeHeads})
            for (int dim : {8, 64, 512, kMaxMergeHeadDim}) {
              MergeArgs a = valid_args(p, o);
              a.num_parts = parts;
              a.num_tokens = tokens;
              a.num_heads = heads;
              a.head_dim = dim;
              set_packed_strides(a);
              INFO(merge_dtype_name(p)
                   << " -> " << merge_dtype_name(o) << " parts " << parts << " tokens " << tokens
                   << " heads " << heads << " dim " << dim);
              // Packed parts span N x T x H x D elements and the output T x H x D: past 2^62
              // bytes the stride of the outermost dimension that crosses the bound is named.
              const __int128 rows = __int128(tokens) * heads * dim;
              if (rows * parts * merge_dtype_bytes(p) > kMaxMergeSpanBytes)
                CHECK(rejection(a).rfind("part_o_stride_", 0) == 0);
              else if (rows * merge_dtype_bytes(o) > kMaxMergeSpanBytes)
                CHECK(rejection(a).rfind("out_stride_token", 0) == 0);
              else
                CHECK(rejection(a) == "accepted");
            }
}

TEST_CASE("merge_states: shapes and types outside the domain are named with their range",
          "[merge]") {
  MergeArgs a = valid_args();
  a.part_type = static_cast<MergeDType>(3);
  CHECK(rejection(a) == "part_type = 3: not in the supported domain (bf16, fp16 or fp32)");
  a = valid_args();
  a.out_type = static_cast<MergeDType>(200);
  CHECK(rejection(a) == "out_type = 200: not in the supported domain (bf16, fp16 or fp32)");
  a = valid_args();
  a.num_parts = 0;
  CHECK(rejection(a) == "num_parts = 0: not in the supported domain (allowed 1..4096)");
  a.num_parts = kMaxMergeParts + 1;
  CHECK(rejection(a) == "num_parts = 4097: not in the supported domain (allowed 1..4096)");
  a = valid_args();
  a.num_tokens = -1;
  CHECK(rejection(a) == "num_tokens = -1: not in the supported domain (allowed 0..2147483647)");
  a = valid_args();
  a.num_heads = 0;
  CHECK(rejection(a) == "num_heads = 0: not in the supported domain (allowed 1..65535)");
  a.num_heads = 65536;
  CHECK(rejection(a) == "num_heads = 65536: not in the supported domain (allowed 1..65535)");
  for (int dim : {0, 4, 12, 516, kMaxMergeHeadDim + 8, -8}) {
    a = valid_args();
    a.head_dim = dim;
    CHECK(rejection(a) == "head_dim = " + std::to_string(dim) +
                              ": not in the supported domain (8..16384, a multiple of 8)");
  }
}

TEST_CASE("merge_states: pointers required when there are rows, aligned always", "[merge]") {
  MergeArgs a = valid_args();
  a.part_o = nullptr;
  CHECK(rejection(a) ==
        "part_o = null: not in the supported domain (a device pointer is required)");
  a = valid_args();
  a.part_lse = nullptr;
  CHECK(rejection(a) ==
        "part_lse = null: not in the supported domain (a device pointer is required)");
  a = valid_args();
  a.out = nullptr;
  CHECK(rejection(a) == "out = null: not in the supported domain (a device pointer is required)");
  a = valid_args();
  a.out_lse = nullptr;  // optional
  CHECK(rejection(a) == "accepted");

  a = valid_args();
  a.part_o = g_bytes + 8;
  CHECK(rejection(a).rfind("part_o = 0x", 0) == 0);
  CHECK(rejection(a).find("(a 16-byte aligned address)") != std::string::npos);
  a = valid_args();
  a.out = g_bytes + 1024 + 2;
  CHECK(rejection(a).find("(a 16-byte aligned address)") != std::string::npos);
  a = valid_args();
  a.out_lse = reinterpret_cast<float*>(g_bytes + 2);
  CHECK(rejection(a).rfind("out_lse = 0x", 0) == 0);

  // No rows: nothing is read or written, so pointers may be null (a given one is still checked).
  a = valid_args();
  a.num_tokens = 0;
  a.part_o = nullptr;
  a.part_lse = nullptr;
  a.out = nullptr;
  a.out_lse = nullptr;
  CHECK(rejection(a) == "accepted");
  a.part_lse = reinterpret_cast<const float*>(g_bytes + 1);
  CHECK(rejection(a).rfind("part_lse = 0x", 0) == 0);
}

TEST_CASE("merge_states: input strides may broadcast, must stay aligned and bounded", "[merge]") {
  MergeArgs a = valid_args();
  a.part_o_stride_part = 0;  // one O for every part
  a.part_lse_stride_token = 0;
  CHECK(rejection(a) == "accepted");
  a = valid_args();
  a.part_o_stride_head = 8;  // rows of different heads overlap: allowed for inputs
  CHECK(rejection(a) == "accepted");
  a = valid_args(MergeDType::fp32);
  a.part_o_stride_head = 516;  // fp32: 4 elements keep 16-byte alignment
  CHECK(rejection(a) == "accepted");

  a = valid_args();
  a.part_o_stride_head = 516;
  const std::string m = rejection(a);
  CHECK(m.rfind("part_o_stride_head = 516: not in the supported domain (0..", 0) == 0);
  CHECK(m.find(", a multiple of 8)") != std::string::npos);
  a = valid_args();
  a.part_o_stride_token = -8;
  CHECK(rejection(a).rfind("part_o_stride_token = -8: not in the supported domain (0..", 0) == 0);
  a = valid_args();
  a.part_lse_stride_part = kI64Max;
  CHECK(rejection(a).rfind("part_lse_stride_part = 9223372036854775807: not in the supported "
                           "domain (0..",
                           0) == 0);
  a = valid_args();
  a.part_o_stride_part = kI64Min;
  CHECK(rejection(a).rfind("part_o_stride_part = -9223372036854775808", 0) == 0);
}

TEST_CASE("merge_states: output rows never overlap, in either order of strides", "[merge]") {
  MergeArgs a = valid_args();
  // [H, T] layouts (vLLM keeps LSEs as [heads, tokens]).
  a.out_lse_stride_token = 1;
  a.out_lse_stride_head = a.num_tokens;
  a.out_stride_token = 512;
  a.out_stride_head = 512 * a.num_tokens;
  CHECK(rejection(a) == "accepted");

  a = valid_args();
  a.out_stride_head = 256;
  CHECK(rejection(a) ==
        "out_stride_head = 256: not in the supported domain (at least 512 "
        "elements, a multiple of 8, at most 1152921504606846720)");
  a = valid_args();
  a.out_stride_token = 512;  // heads of token t + 1 would overwrite token t
  CHECK(rejection(a).rfind(
            "out_stride_token = 512: not in the supported domain (at least 1536 elements", 0) == 0);
  a = valid_args();
  a.out_lse_stride_token = 1;  // the same slot as head 1 of token 0
  CHECK(rejection(a).rfind(
            "out_lse_stride_token = 1: not in the supported domain (at least 3 elements", 0) == 0);
  a = valid_args();
  a.out_lse_stride_head = a.out_lse_stride_token = 3;  // equal strides overlap
  CHECK(rejection(a).rfind("out_lse_stride_token = 3: not in the supported domain", 0) == 0);
  a = valid_args();
  a.out_stride_token = kI64Max;
  CHECK(rejection(a).rfind("out_stride_token = 9223372036854775807", 0) == 0);
  a = valid_args(MergeDType::bf16, MergeDType::fp32);
  a.out_stride_head = 516;  // fp32 rows: a multiple of 4 elements
  a.out_stride_token = 516 * 3;
  CHECK(rejection(a) == "accepted");

  // Dimensions of extent 1 are never stepped over: their strides are not checked.
  a = valid_args();
  a.num_tokens = 1;
  a.num_parts = 1;
  a.out_stride_token = -5;
  a.out_lse_stride_token = kI64Min;
  a.part_o_stride_token = a.part_o_stride_part = 3;
  a.part_lse_stride_part = -1;
  CHECK(rejection(a) == "accepted");
  a.num_heads = 1;
  a.out_stride_head = a.part_o_stride_head = a.out_lse_stride_head = 7;
  CHECK(rejection(a) == "accepted");
}

TEST_CASE("merge_states: set_packed_strides never overflows", "[merge]") {
  MergeArgs a;
  a.num_tokens = kMaxMergeTokens;
  a.num_heads = kMaxMergeHeads;
  a.head_dim = kMaxMergeHeadDim;
  set_packed_strides(a);
  CHECK(a.part_o_stride_part == std::int64_t(kMaxMergeTokens) * kMaxMergeHeads * kMaxMergeHeadDim);
  a.num_tokens = a.num_heads = a.head_dim = std::numeric_limits<int>::max();
  set_packed_strides(a);
  CHECK(a.part_o_stride_part == kI64Max);  // saturated; validate_merge() names the shape
  a.num_parts = 2;
  a.part_type = a.out_type = MergeDType::bf16;
  CHECK(rejection(a).rfind("num_heads = 2147483647", 0) == 0);
  a.num_tokens = -3;
  a.num_heads = -4;
  set_packed_strides(a);
  CHECK(a.part_o_stride_part == 0);
}

TEST_CASE("merge_states: a Status on a build without a GPU backend", "[merge]") {
  if (kHaveGpuBackend) return;  // the GPU tests run it (these pointers are host memory)
  MergeArgs a = valid_args();
  Status s = merge_states(a, nullptr);
  CHECK(s.code() == StatusCode::not_supported);
  a.num_parts = 0;
  s = merge_states(a, nullptr);
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK(s.message() == "num_parts = 0: not in the supported domain (allowed 1..4096)");
}

TEST_CASE("merge_states: +inf marks an empty part like -inf", "[merge]") {
  constexpr float inf = std::numeric_limits<float>::infinity();
  CHECK(merge_part_lse(inf) == -inf);
  CHECK(merge_part_lse(-inf) == -inf);
  CHECK(merge_part_lse(2.5f) == 2.5f);
  CHECK(merge_part_lse(-1e30f) == -1e30f);
}
