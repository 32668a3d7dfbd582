#pragma once
// Problem: the compile-time description of a decode shape (ck_tile style: types and
// constants only, no tile sizes). 0 / Causal::dynamic leave a value to run time.
#include <type_traits>

#include "../core/decode_args.hpp"
#include "../core/numeric.hpp"

namespace mlakit {

// KV type marker: the cache type is read from DecodeArgs::kv_type at run time (any type other
// than the Q type; a matching type is served by the direct-copy instantiation).
struct kv_any_t {};

enum class Causal : int { off = 0, on = 1, dynamic = 2 };

// Where the kernels read each row's 64 rotary values: columns 512.. of the kv row (joined, the
// fast form: one source address per token) or a cache of their own, DecodeArgs::kv_rope
// (split: two per token). decode() sends calls with kv_rope to the split instantiations.
enum class CacheForm : int { joined = 0, split = 1 };

// C: how the products are computed (DecodeArgs::compute); Compute::fp8_matrix needs e4m3fn KV
// and runs the 64-row keys-as-M kernel on sm_90a only.
template <class QType, class KvType = kv_any_t, int Heads = 0, int QLen = 0,
          Causal CausalMode = Causal::dynamic, CacheForm Form = CacheForm::joined,
          Compute C = Compute::standard>
struct Problem {
  static_assert(std::is_same_v<QType, bf16_t> || std::is_same_v<QType, fp16_t>,
                "Q/O type must be bf16_t or fp16_t");
  static_assert(Heads >= 0 && Heads <= kMaxHeads, "Heads must be 0 (dynamic) or 1..128");
  static_assert(QLen >= 0 && QLen <= kMaxQLen, "QLen must be 0 (dynamic) or 1..32");
  using q_type = QType;
  using kv_type = KvType;
  static constexpr int kHeads = Heads;
  static constexpr int kQLen = QLen;
  static constexpr Causal kCausal = CausalMode;
  static constexpr CacheForm kCacheForm = Form;
  static constexpr bool kSplitCache = Form == CacheForm::split;
  static constexpr Compute kCompute = C;
  static_assert(C == Compute::standard || std::is_same_v<KvType, fp8_e4m3fn_t>,
                "Compute::fp8_matrix reads an fp8_e4m3fn cache");
  // KV already in the compute type: copied straight into the tiles the matrix atom reads.
  static constexpr bool kDirectKv = std::is_same_v<QType, KvType>;
  // Rows per request when both are fixed, else 0.
  static constexpr int kRows = (Heads > 0 && QLen > 0) ? Heads * QLen : 0;

  static constexpr DType q_dtype() { return DTypeOf<QType>::value; }
  // The KV dtype this problem accepts; only meaningful when KvType is a concrete type.
  static constexpr bool kv_is_fixed = !std::is_same_v<KvType, kv_any_t>;
};

namespace detail {
// Problem P with its KV type fixed to KvType (the rest unchanged).
template <class P, class KvType>
using WithKv = Problem<typename P::q_type, KvType, P::kHeads, P::kQLen, P::kCausal, P::kCacheForm,
                       P::kCompute>;
// Problem P in cache form F (the rest unchanged).
template <class P, CacheForm F>
using WithCacheForm =
    Problem<typename P::q_type, typename P::kv_type, P::kHeads, P::kQLen, P::kCausal, F,
            P::kCompute>;

template <class T>
struct KvDTypeOf {
  static constexpr DType value = DTypeOf<T>::value;
};
template <>
struct KvDTypeOf<kv_any_t> {
  static constexpr DType value = DType::bf16;  // unused
};
}  // namespace detail

}  // namespace mlakit
