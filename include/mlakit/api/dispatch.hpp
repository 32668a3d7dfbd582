#pragma once
// The run-time path: decode() validates, picks an instantiation from a small table and
// launches it. Default table per target: Q type (2) x {KV = Q type, KV converted} over every
// row policy (NVIDIA adds e4m3fn KV read raw by the matrix atom), plus fixed-shape specialisations
// of the speculative-decoding hot shapes (16 heads, q_len 1/2/4/8, causal, bf16 Q with fp8 e4m3fn
// or bf16 KV).
#include "decode.hpp"

namespace mlakit {

#if !defined(MLAKIT_PLATFORM_NONE)
namespace detail {

template <int QLen>
using HotFp8 = Problem<bf16_t, fp8_e4m3fn_t, 16, QLen, Causal::on>;
template <int QLen>
using HotBf16 = Problem<bf16_t, bf16_t, 16, QLen, Causal::on>;

template <int QLen>
inline Status launch_hot(const DecodeArgs& a, const DeviceInfo& dev, void* ws, std::size_t bytes,
                         Stream stream) {
  return a.kv_type == DType::fp8_e4m3fn
             ? Decode<HotFp8<QLen>>::launch_with(a, dev, ws, bytes, stream)
             : Decode<HotBf16<QLen>>::launch_with(a, dev, ws, bytes, stream);
}

inline Status dispatch(const DecodeArgs& a, const DeviceInfo& dev, void* ws, std::size_t bytes,
                       Stream stream) {
#if !defined(MLAKIT_NO_HOT_SHAPES)
  if (a.q_type == DType::bf16 && a.num_heads == 16 && a.causal &&
      (a.kv_type == DType::fp8_e4m3fn || a.kv_type == DType::bf16)) {
    switch (a.q_len) {
      case 1:
        return launch_hot<1>(a, dev, ws, bytes, stream);
      case 2:
        return launch_hot<2>(a, dev, ws, bytes, stream);
      case 4:
        return launch_hot<4>(a, dev, ws, bytes, stream);
      case 8:
        return launch_hot<8>(a, dev, ws, bytes, stream);
      default:
        break;
    }
  }
#endif
  if (a.q_type == DType::bf16) {
    if (a.kv_type == DType::bf16)
      return Decode<Problem<bf16_t, bf16_t>>::launch_with(a, dev, ws, bytes, stream);
#if defined(MLAKIT_PLATFORM_CUDA)
    if (a.kv_type == DType::fp8_e4m3fn)
      return Decode<Problem<bf16_t, fp8_e4m3fn_t>>::launch_with(a, dev, ws, bytes, stream);
#endif
    return Decode<Problem<bf16_t, kv_any_t>>::launch_with(a, dev, ws, bytes, stream);
  }
  if (a.kv_type == DType::fp16)
    return Decode<Problem<fp16_t, fp16_t>>::launch_with(a, dev, ws, bytes, stream);
#if defined(MLAKIT_PLATFORM_CUDA)
  if (a.kv_type == DType::fp8_e4m3fn)
    return Decode<Problem<fp16_t, fp8_e4m3fn_t>>::launch_with(a, dev, ws, bytes, stream);
#endif
  return Decode<Problem<fp16_t, kv_any_t>>::launch_with(a, dev, ws, bytes, stream);
}

}  // namespace detail
#endif

// Computes MLA decode attention for every request of `a` on `stream`.
// Never aborts: outside the domain it returns a Status naming the argument, its value and
// the allowed range. No host synchronisation, no allocation, no host read of device data;
// the grid does not depend on kv_len values, so one captured graph serves every step.
// Runs on the current device: `stream` must belong to it and `workspace` must not be another
// device's memory (invalid_argument otherwise). Thread safe, and capture-safe from the first
// call. See README "Devices, threads and CUDA graphs".
inline Status decode(const DecodeArgs& a, void* workspace, std::size_t workspace_size,
                     Stream stream) {
  Status s = supported(a);
  if (!s || a.batch == 0) return s;
#if defined(MLAKIT_PLATFORM_NONE)
  (void)workspace;
  (void)workspace_size;
  (void)stream;
  return Status(StatusCode::not_supported, "no GPU backend");
#else
  DeviceInfo dev;
  if (!(s = cached_device_info(&dev))) return s;
  return detail::dispatch(a, dev, workspace, workspace_size, stream);
#endif
}

}  // namespace mlakit
