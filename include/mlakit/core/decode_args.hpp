#pragma once
#include <cstdint>

#include "config.hpp"
#include "dtype.hpp"

namespace mlakit {

// Fixed MLA widths (absorbed form): each cache row holds 512 latent values followed by 64
// rotary values; keys use all 576, values the first 512.
inline constexpr int kHeadDimQK = 576;
inline constexpr int kHeadDimV = 512;

// The supported domain (docs/design.md, "Domain"). Outside it decode() returns a Status.
inline constexpr int kMaxHeads = 128;
inline constexpr int kMaxQLen = 32;
inline constexpr int kMaxPageSize = 256;
inline constexpr int kMaxSplits = 64;
// Requests per call (and requests x fixed splits): the decode grid's second dimension.
inline constexpr int kMaxBatch = 65535;
// Block-table pages per request: no request holds more than kMaxKvLen = 2^30 tokens.
inline constexpr int kMaxPagesPerRequest = 1 << 30;
// Largest page id a request can name: page ids are int32 values in device memory, which the
// host never reads, so KV strides are bounded for every id up to this one.
inline constexpr std::int64_t kMaxPageId = 2147483647;
// Most bytes any tensor may span (the offset of its last element plus one, times the element
// size; KV for page ids up to kMaxPageId). Every offset the kernels compute, in 64-bit
// elements or bytes, then fits with a factor of 2 to spare (a padded tile past the end).
inline constexpr std::int64_t kMaxSpanBytes = std::int64_t(1) << 62;

enum class SplitMode : std::uint8_t {
  automatic = 0,  // the device planner balances KV tokens over about two waves of CTAs
  none = 1,       // one CTA per (request, row tile): no partials, no combine
  fixed = 2,      // every request is cut into num_splits KV ranges
};

// How decode() writes the caller's LSE (`lse`): the log of a row's softmax denominator,
// scores scaled by softmax_scale. The split partials inside the workspace are natural logs
// whatever the format; only the value written to `lse` is converted.
enum class LseFormat : std::uint8_t {
  natural = 0,               // ln; -inf for a row that sees no key
  natural_empty_is_inf = 1,  // ln; +inf for a row that sees no key (FlashMLA's convention)
  base2 = 2,                 // log2; -inf for a row that sees no key (FlashInfer's default)
};

// Which steps of a call decode() enqueues. The split plan depends on batch, num_heads, q_len,
// causal, the dtypes, page_size, split_mode, num_splits, the device, kv_len and each request's
// page capacity (its block-table row length or CSR segment), and on nothing else: not on the
// data or the page ids themselves, so every layer of a model step can share one plan. The plan
// is kept in the workspace: decode_only reads the plan an earlier plan_only or plan_and_decode
// call left in the same workspace. decode() refuses it (invalid_argument, before any launch)
// unless the last call that planned into that workspace had this call's plan shape (PlanShape),
// kv_len array (address), page size and capacity (block-table width, or kv_indptr's address);
// what the host cannot see, the kv_len values and CSR offsets, the caller keeps unchanged. The
// decode kernels that plan for themselves (docs/design.md, "Planner") do so whatever the step;
// plan_only launches nothing for them.
enum class PlanStep : std::uint8_t {
  plan_and_decode = 0,  // plan into the workspace, then decode (the default)
  plan_only = 1,        // plan into the workspace; no output is written
  decode_only = 2,      // decode with the plan already in the workspace
};

// How the two products of the attention are computed.
enum class Compute : std::uint8_t {
  // 16-bit operands (Q's type, or f16 for an e4m3fn cache, exact), f32 accumulation: the
  // accuracy of a bf16 attention (relative L2 error about 2e-3 against double precision).
  standard = 0,
  // Opt-in, NVIDIA sm_90a with an fp8_e4m3fn cache: both products on e4m3 tensor cores (Q as
  // two e4m3 planes with a power-of-two scale per row, P as one e4m3 plane, the cache read as
  // it is). Its error: relative L2 up to about 1.6e-2 and LSE up to 1.4e-3 on N(0,1) data,
  // LSE up to 5e-2 with outlier channels (docs/design.md, "The fp8 matrix mode"); on an H100
  // it is not yet faster than `standard` (docs/performance.md). Every call runs 64-row tiles,
  // so where `standard` has 16- or 32-row forms (16 heads at q_len 1 and 2) it takes about
  // 1.3x its time; other devices, builds and cache types return not_supported or
  // invalid_argument.
  fp8_matrix = 1,
};

// How KV pages of each request are found.
enum class PageIds : std::uint8_t {
  block_table = 0,  // block_table[b * block_table_stride + i] = page of tokens [i*P, (i+1)*P)
  csr = 1,          // kv_indices[kv_indptr[b] + i] = page of tokens [i*P, (i+1)*P)
};

// Everything one decode() call needs. Strides are in elements of the tensor's own dtype;
// the innermost dimension of Q, KV and O is always contiguous.
struct DecodeArgs {
  // --- element types -------------------------------------------------------------------
  DType q_type = DType::bf16;  // Q and O
  DType kv_type = DType::bf16;

  // --- shapes ----------------------------------------------------------------------------
  int batch = 0;       // requests
  int num_heads = 0;   // query heads sharing the single latent KV head, 1..128
  int q_len = 0;       // query tokens per request, 1..32 (speculative verify: draft + 1)
  bool causal = true;  // bottom-right aligned: token t sees keys j <= kv_len - q_len + t

  // --- Q: [batch, q_len, num_heads, 576] ---------------------------------------------------
  const void* q = nullptr;
  std::int64_t q_stride_batch = 0;
  std::int64_t q_stride_token = 0;
  std::int64_t q_stride_head = 0;

  // --- paged latent cache: [num_pages, page_size, 576]; V = first 512 of each row ----------
  const void* kv = nullptr;
  std::int64_t kv_stride_page = 0;
  std::int64_t kv_stride_token = 0;
  int page_size = 0;  // tokens per page, 1..256
  // Every cache element is read as decode(element) * kv_scale, whatever kv_type is: the
  // dequantisation scale of an fp8 cache, and for a 16-bit cache 1 (no change) or any other
  // finite value > 0, which then scales K and V alike.
  float kv_scale = 1.0f;

  // --- page ids ----------------------------------------------------------------------------
  PageIds page_ids = PageIds::block_table;
  const std::int32_t* block_table = nullptr;  // [batch, >= max_pages_per_request]
  // Entries between the rows of consecutive requests; 0 (the default, and what
  // set_packed_strides() sets) means rows of exactly max_pages_per_request entries.
  std::int64_t block_table_stride = 0;
  int max_pages_per_request = 0;             // pages of every request's block-table row
  const std::int32_t* kv_indptr = nullptr;   // [batch + 1]
  const std::int32_t* kv_indices = nullptr;  // [kv_indptr[batch]]; may be null when no request
                                             // has a page (every request then has none)

  // kv_len[b] on the device: cached tokens of request b including its q_len new ones.
  // Any value is accepted and nothing is reported: negative values count as 0, and values
  // beyond the request's page capacity (block table: max_pages_per_request x page_size; CSR:
  // (kv_indptr[b + 1] - kv_indptr[b]) x page_size) are clamped to it on the device, so no page
  // outside the request's mapping is ever read; values past kMaxKvLen = 2^30 are cut to it.
  // See page_capacity() and clamp_kv_len() in core/plan.hpp.
  const std::int32_t* kv_len = nullptr;

  // --- outputs -----------------------------------------------------------------------------
  void* out = nullptr;  // [batch, q_len, num_heads, 512], q_type
  std::int64_t o_stride_batch = 0;
  std::int64_t o_stride_token = 0;
  std::int64_t o_stride_head = 0;
  float* lse = nullptr;  // optional [batch, q_len, num_heads], in lse_format
  std::int64_t lse_stride_batch = 0;
  std::int64_t lse_stride_token = 0;
  std::int64_t lse_stride_head = 0;
  LseFormat lse_format = LseFormat::natural;

  // --- math and scheduling -----------------------------------------------------------------
  float softmax_scale = 0.0f;  // multiplies Q.K (model specific: never assumed)
  SplitMode split_mode = SplitMode::automatic;
  int num_splits = 0;          // SplitMode::fixed only: 1..64
  bool deterministic = false;  // results are bitwise reproducible in every mode; see README
  PlanStep plan_step = PlanStep::plan_and_decode;  // see PlanStep
  Compute compute = Compute::standard;              // see Compute

  // --- optional separate rotary cache: [num_pages, page_size, 64] ---------------------------
  // Row (page, slot) holds, in kv_type, the 64 rotary values of the token whose latent values
  // are kv's row (page, slot); kv rows then need hold only the 512 latent values (FlashInfer
  // keeps its ckv and kpe caches this way). Null (the default): kv rows hold all 576 values.
  // The joined form is the faster one (docs/performance.md, "A separate rotary cache").
  const void* kv_rope = nullptr;
  std::int64_t kv_rope_stride_page = 0;
  std::int64_t kv_rope_stride_token = 0;

  // Rows per request, row = t * heads + h: at most 4096 in the domain. Computed in 64 bits and
  // clamped to the int range, so it does not overflow for values outside the domain either.
  int rows() const {
    const std::int64_t r = std::int64_t(num_heads) * q_len;
    constexpr std::int64_t kIntMax = 2147483647;
    return static_cast<int>(r > kIntMax ? kIntMax : r < -kIntMax - 1 ? -kIntMax - 1 : r);
  }
};

namespace detail {

// x * y for y > 0, saturated at the int64 range instead of overflowing.
constexpr std::int64_t mul_sat(std::int64_t x, std::int64_t y) {
  constexpr std::int64_t kMax = 0x7fffffffffffffff, kMin = -kMax - 1;
  if (x > kMax / y) return kMax;
  if (x < kMin / y) return kMin;  // kMin / y rounds up: the least x whose product fits
  return x * y;
}

}  // namespace detail

// Sets every stride of `a` for densely packed tensors of the shapes in `a`
// (Q/O [batch, q_len, heads, D], KV [pages, page_size, 576], a rotary cache kv_rope
// [pages, page_size, 64] where one is given, LSE [batch, q_len, heads],
// block table [batch, max_pages_per_request]). Reads num_heads, q_len and page_size only: the
// block-table stride is set to 0 (packed rows), which follows max_pages_per_request whenever
// that is set. Any int values are accepted without overflow: heads x q_len is exact in 64 bits,
// and its products with the row widths saturate at the int64 range for shapes far outside the
// domain (validate() rejects those by num_heads or q_len).
inline void set_packed_strides(DecodeArgs& a) {
  const std::int64_t rows = std::int64_t(a.num_heads) * a.q_len;  // |rows| <= 2^62
  a.q_stride_head = kHeadDimQK;
  a.q_stride_token = std::int64_t(a.num_heads) * kHeadDimQK;
  a.q_stride_batch = detail::mul_sat(rows, kHeadDimQK);
  a.kv_stride_token = kHeadDimQK;
  a.kv_stride_page = std::int64_t(a.page_size) * kHeadDimQK;
  a.kv_rope_stride_token = kHeadDimQK - kHeadDimV;  // read only when kv_rope is given
  a.kv_rope_stride_page = std::int64_t(a.page_size) * (kHeadDimQK - kHeadDimV);
  a.o_stride_head = kHeadDimV;
  a.o_stride_token = std::int64_t(a.num_heads) * kHeadDimV;
  a.o_stride_batch = detail::mul_sat(rows, kHeadDimV);
  a.lse_stride_head = 1;
  a.lse_stride_token = a.num_heads;
  a.lse_stride_batch = rows;
  a.block_table_stride = 0;
}

// The rotary part as the split instantiations (CacheForm::split) read it: kv_rope with its
// strides, or for a joined cache (kv_rope null) columns 512.. of kv's rows, i.e. kv_rope =
// kv + 512 elements with kv's strides. The joined instantiations never read kv_rope.
MLAKIT_HOST_DEVICE inline void resolve_rope_part(DecodeArgs& a) {
  if (a.kv_rope != nullptr) return;
  a.kv_rope_stride_page = a.kv_stride_page;
  a.kv_rope_stride_token = a.kv_stride_token;
  // A null kv is never read (validate()): its rotary part stays null.
  if (a.kv != nullptr)
    a.kv_rope = static_cast<const unsigned char*>(a.kv) +
                std::int64_t(kHeadDimV) * std::int64_t(dtype_bytes(a.kv_type));
}

// Entries between the block-table rows of consecutive requests: block_table_stride, or
// max_pages_per_request when it is 0 (packed rows).
MLAKIT_HOST_DEVICE inline std::int64_t block_table_row_stride(const DecodeArgs& a) {
  return a.block_table_stride != 0 ? a.block_table_stride : a.max_pages_per_request;
}

}  // namespace mlakit
