#pragma once
// The run-time path: decode() validates, picks an instantiation from a small table and
// launches it. Default table per target: Q type (2) x {KV = Q type, KV converted} over every
// row policy (NVIDIA adds e4m3fn KV read raw by the matrix atom), plus fixed-shape specialisations
// of the speculative-decoding hot shapes (16 heads, q_len 1/2/4/8, causal, bf16 Q with fp8 e4m3fn
// or bf16 KV).
//
// Compiling the table once: every entry is a DispatchEntry<Problem> whose launch() is not
// inline, so a translation unit can leave its instantiation (and that of its kernels, most of
// the compile time of a file that calls decode()) to another one:
//   every file that calls decode():  #define MLAKIT_EXTERN_DISPATCH before including mlakit
//                                    (or -DMLAKIT_EXTERN_DISPATCH for the whole target)
//   exactly one .cu of the program:  #include <mlakit/api/instantiate_dispatch.hpp>
// or the table in N parts (N = 2, 3 or 4), compiled in parallel, one .cu per part k = 0..N-1:
//   #define MLAKIT_DISPATCH_PARTS N
//   #define MLAKIT_DISPATCH_PART k
//   #include <mlakit/api/instantiate_dispatch.hpp>
// A program that defines MLAKIT_EXTERN_DISPATCH and instantiates the table (or one of its parts)
// nowhere fails to link (undefined DispatchEntry<...>::launch), never at run time. Every file of
// the program must see the same MLAKIT_NO_HOT_SHAPES setting, which changes the list of entries.
#define MLAKIT_DETAIL_DISPATCH_INCLUDED 1  // api/instantiate_dispatch.hpp checks the order
#include "decode.hpp"

namespace mlakit {

#if defined(MLAKIT_HAS_GPU_BACKEND)
namespace detail {

template <int QLen>
using HotFp8 = Problem<bf16_t, fp8_e4m3fn_t, 16, QLen, Causal::on>;
template <int QLen>
using HotBf16 = Problem<bf16_t, bf16_t, 16, QLen, Causal::on>;

// The generic entries, one per (Q type, KV type) pair the table serves; rows are dynamic, so
// each holds one kernel per row policy.
using TableBf16Bf16 = Problem<bf16_t, bf16_t>;
using TableBf16Any = Problem<bf16_t, kv_any_t>;
using TableFp16Fp16 = Problem<fp16_t, fp16_t>;
using TableFp16Any = Problem<fp16_t, kv_any_t>;
// fp8 caches with a kernel of their own: e4m3fn everywhere, and on AMD e4m3fnuz too (the
// kv_any_t kernels, which convert any type, need more registers than the CDNA mainloop has).
using TableBf16E4m3fn = Problem<bf16_t, fp8_e4m3fn_t>;
using TableFp16E4m3fn = Problem<fp16_t, fp8_e4m3fn_t>;
using TableBf16E4m3fnuz = Problem<bf16_t, fp8_e4m3fnuz_t>;
using TableFp16E4m3fnuz = Problem<fp16_t, fp8_e4m3fnuz_t>;
// A separate rotary cache (DecodeArgs::kv_rope): the table's entries in their split form (no
// hot shapes: the joined cache is the fast form).
using SplitBf16Bf16 = WithCacheForm<TableBf16Bf16, CacheForm::split>;
using SplitBf16Any = WithCacheForm<TableBf16Any, CacheForm::split>;
using SplitFp16Fp16 = WithCacheForm<TableFp16Fp16, CacheForm::split>;
using SplitFp16Any = WithCacheForm<TableFp16Any, CacheForm::split>;
using SplitBf16E4m3fn = WithCacheForm<TableBf16E4m3fn, CacheForm::split>;
using SplitFp16E4m3fn = WithCacheForm<TableFp16E4m3fn, CacheForm::split>;
using SplitBf16E4m3fnuz = WithCacheForm<TableBf16E4m3fnuz, CacheForm::split>;
using SplitFp16E4m3fnuz = WithCacheForm<TableFp16E4m3fnuz, CacheForm::split>;

// Compute::fp8_matrix (sm_90a builds only): one 64-row kernel per Q type and cache form.
template <class QType, CacheForm F>
using Matrix = Problem<QType, fp8_e4m3fn_t, 0, 0, Causal::dynamic, F, Compute::fp8_matrix>;
using MatrixBf16 = Matrix<bf16_t, CacheForm::joined>;
using MatrixFp16 = Matrix<fp16_t, CacheForm::joined>;
using SplitMatrixBf16 = Matrix<bf16_t, CacheForm::split>;
using SplitMatrixFp16 = Matrix<fp16_t, CacheForm::split>;

// One entry of the dispatch table. launch() is defined below the class, so it is not an inline
// function and an `extern template` declaration does suppress its implicit instantiation.
template <class P>
struct DispatchEntry {
  static Status launch(const DecodeArgs& a, const DeviceInfo& dev, void* ws, std::size_t bytes,
                       Stream stream);
};

template <class P>
Status DispatchEntry<P>::launch(const DecodeArgs& a, const DeviceInfo& dev, void* ws,
                                std::size_t bytes, Stream stream) {
  return Decode<P>::launch_with(a, dev, ws, bytes, stream);
}

}  // namespace detail

// The table's entries as X-macros: X(type) for every Problem the run-time path can launch on
// this platform, in four groups of about equal compile time, one per (Q type, cache form) with
// the hot shapes spread over them. Used by the extern declarations below and by
// api/instantiate_dispatch.hpp, which can compile the groups in separate translation units.
#if defined(MLAKIT_NO_HOT_SHAPES)
#define MLAKIT_DETAIL_HOT(X, P)
#else
#define MLAKIT_DETAIL_HOT(X, P) X(P)
#endif
#if defined(MLAKIT_HAS_CDNA_KERNELS)
#define MLAKIT_DETAIL_CDNA(X, P) X(P)
#else
#define MLAKIT_DETAIL_CDNA(X, P)
#endif
#if defined(MLAKIT_HAS_SM90A_KERNELS)
#define MLAKIT_DETAIL_SM90A(X, P) X(P)
#else
#define MLAKIT_DETAIL_SM90A(X, P)
#endif
// One group: the generic entries of cache form F (Table, Split) for Q type Q (Bf16, Fp16), the
// matrix entry M and two hot shapes.
#define MLAKIT_DETAIL_DISPATCH_GROUP(X, F, Q, M, HOT1, HOT2)                                   \
  X(F##Q##Q)                                                                                   \
  X(F##Q##Any) X(F##Q##E4m3fn) MLAKIT_DETAIL_CDNA(X, F##Q##E4m3fnuz) MLAKIT_DETAIL_SM90A(X, M) \
      MLAKIT_DETAIL_HOT(X, HOT1) MLAKIT_DETAIL_HOT(X, HOT2)
#define MLAKIT_DETAIL_DISPATCH_GROUP0(X) \
  MLAKIT_DETAIL_DISPATCH_GROUP(X, Table, Bf16, MatrixBf16, HotFp8<1>, HotBf16<4>)
#define MLAKIT_DETAIL_DISPATCH_GROUP1(X) \
  MLAKIT_DETAIL_DISPATCH_GROUP(X, Split, Bf16, SplitMatrixBf16, HotFp8<2>, HotFp8<4>)
#define MLAKIT_DETAIL_DISPATCH_GROUP2(X) \
  MLAKIT_DETAIL_DISPATCH_GROUP(X, Table, Fp16, MatrixFp16, HotBf16<2>, HotBf16<8>)
#define MLAKIT_DETAIL_DISPATCH_GROUP3(X) \
  MLAKIT_DETAIL_DISPATCH_GROUP(X, Split, Fp16, SplitMatrixFp16, HotFp8<8>, HotBf16<1>)
#define MLAKIT_DETAIL_DISPATCH_ENTRIES(X) \
  MLAKIT_DETAIL_DISPATCH_GROUP0(X)        \
  MLAKIT_DETAIL_DISPATCH_GROUP1(X) MLAKIT_DETAIL_DISPATCH_GROUP2(X) MLAKIT_DETAIL_DISPATCH_GROUP3(X)

#if defined(MLAKIT_EXTERN_DISPATCH)
namespace detail {
#define MLAKIT_DETAIL_EXTERN_ENTRY(P) extern template struct DispatchEntry<P>;
MLAKIT_DETAIL_DISPATCH_ENTRIES(MLAKIT_DETAIL_EXTERN_ENTRY)
#undef MLAKIT_DETAIL_EXTERN_ENTRY
}  // namespace detail
#endif

namespace detail {

template <int QLen>
inline Status launch_hot(const DecodeArgs& a, const DeviceInfo& dev, void* ws, std::size_t bytes,
                         Stream stream) {
  return a.kv_type == DType::fp8_e4m3fn
             ? DispatchEntry<HotFp8<QLen>>::launch(a, dev, ws, bytes, stream)
             : DispatchEntry<HotBf16<QLen>>::launch(a, dev, ws, bytes, stream);
}

// The table entry (P in cache form F) for the call's types.
template <CacheForm F>
inline Status launch_table(const DecodeArgs& a, const DeviceInfo& dev, void* ws, std::size_t bytes,
                           Stream stream) {
  if (a.q_type == DType::bf16) {
    if (a.kv_type == DType::bf16)
      return DispatchEntry<WithCacheForm<TableBf16Bf16, F>>::launch(a, dev, ws, bytes, stream);
    if (a.kv_type == DType::fp8_e4m3fn)
      return DispatchEntry<WithCacheForm<TableBf16E4m3fn, F>>::launch(a, dev, ws, bytes, stream);
#if defined(MLAKIT_HAS_CDNA_KERNELS)
    if (a.kv_type == DType::fp8_e4m3fnuz)
      return DispatchEntry<WithCacheForm<TableBf16E4m3fnuz, F>>::launch(a, dev, ws, bytes, stream);
#endif
    return DispatchEntry<WithCacheForm<TableBf16Any, F>>::launch(a, dev, ws, bytes, stream);
  }
  if (a.kv_type == DType::fp16)
    return DispatchEntry<WithCacheForm<TableFp16Fp16, F>>::launch(a, dev, ws, bytes, stream);
  if (a.kv_type == DType::fp8_e4m3fn)
    return DispatchEntry<WithCacheForm<TableFp16E4m3fn, F>>::launch(a, dev, ws, bytes, stream);
#if defined(MLAKIT_HAS_CDNA_KERNELS)
  if (a.kv_type == DType::fp8_e4m3fnuz)
    return DispatchEntry<WithCacheForm<TableFp16E4m3fnuz, F>>::launch(a, dev, ws, bytes, stream);
#endif
  return DispatchEntry<WithCacheForm<TableFp16Any, F>>::launch(a, dev, ws, bytes, stream);
}

#if defined(MLAKIT_HAS_SM90A_KERNELS)
// Compute::fp8_matrix (validated: e4m3fn KV): the matrix entry of the call's Q type and cache
// form.
inline Status launch_matrix(const DecodeArgs& a, const DeviceInfo& dev, void* ws, std::size_t bytes,
                            Stream stream) {
  const bool bf16 = a.q_type == DType::bf16;
  if (a.kv_rope != nullptr)
    return bf16 ? DispatchEntry<SplitMatrixBf16>::launch(a, dev, ws, bytes, stream)
                : DispatchEntry<SplitMatrixFp16>::launch(a, dev, ws, bytes, stream);
  return bf16 ? DispatchEntry<MatrixBf16>::launch(a, dev, ws, bytes, stream)
              : DispatchEntry<MatrixFp16>::launch(a, dev, ws, bytes, stream);
}
#endif

inline Status dispatch(const DecodeArgs& a, const DeviceInfo& dev, void* ws, std::size_t bytes,
                       Stream stream) {
#if defined(MLAKIT_HAS_SM90A_KERNELS)
  if (a.compute == Compute::fp8_matrix) return launch_matrix(a, dev, ws, bytes, stream);
#endif
  if (a.kv_rope != nullptr) return launch_table<CacheForm::split>(a, dev, ws, bytes, stream);
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
  return launch_table<CacheForm::joined>(a, dev, ws, bytes, stream);
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
  Status s = validate(a);
  if (s) s = detail::check_workspace_pointer(workspace, workspace_size);
  if (s) s = detail::backend_status();  // supported(a), validated once
  if (s) s = detail::compute_status(a);
  if (!s || a.batch == 0) return s;
#if defined(MLAKIT_HAS_GPU_BACKEND)
  DeviceInfo dev;
  if (!(s = cached_device_info(&dev))) return s;
  return detail::dispatch(a, dev, workspace, workspace_size, stream);
#else
  (void)workspace;
  (void)workspace_size;
  (void)stream;
  return Status(StatusCode::not_supported, "no GPU backend");
#endif
}

}  // namespace mlakit
