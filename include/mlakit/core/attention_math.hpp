#pragma once
// Formulas shared by the host reference, the host tests and the device kernels, so that the
// causal window, the online-softmax update and the LSE merge exist exactly once.
#include <cstdint>

#include "config.hpp"
#include "decode_args.hpp"

namespace mlakit {

// log2(e) and ln(2): softmax runs in base 2 (exp2 is one instruction on both vendors).
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// The least row scale the kernels use (fp32's smallest positive value): a score factor that
// underflows to 0 would turn masked scores (-inf) into NaN where the scale is folded into the
// exponential; at this value every finite score still weighs about 2^0.
inline constexpr float kMinRowScale = 1.40129846e-45f;

// Where a row's score factor sc is folded into the exponential, 2^(s sc - base) by one fma,
// the fma differs from the rounded product s sc (of which the row's max was formed) by up to
// half an ulp of base: below 1 while |base| < kWideBase. Rows at or beyond it (bf16 Q rows far
// outside f16, scores near 2^40) take the rounded products instead.
inline constexpr float kWideBase = 16777216.0f;  // 2^24

// The one factor the kernels apply to the scores (base-2 units): validate() rejects a pair of
// scales for which it is not finite.
inline float scale_log2_of(const DecodeArgs& a) { return a.softmax_scale * a.kv_scale * kLog2e; }

// Number of keys query token t (0-based, of q_len) of a request with kv_len cached tokens may
// see. Causal masking is bottom-right aligned: token t sees keys j <= kv_len - q_len + t.
// kv_len < q_len leaves the first tokens with no key at all (0), never a negative count.
MLAKIT_HOST_DEVICE constexpr int visible_keys(int kv_len, int q_len, int t, bool causal) {
  if (kv_len <= 0) return 0;
  if (!causal) return kv_len;
  const int n = kv_len - q_len + t + 1;
  return n < 0 ? 0 : (n > kv_len ? kv_len : n);
}

// IEEE -inf without <cmath> (usable in device code and constexpr contexts).
MLAKIT_HOST_DEVICE constexpr float neg_inf() { return -__builtin_huge_valf(); }

// How far (base 2) the online softmax's running max may stay below the largest score seen
// before the state is rescaled. Keeping it saves the rescale of the output accumulators
// (the same factor multiplies both the sum l and the output, so the result does not depend
// on which max is used); exponentials then reach at most 2^8 = 256, well inside f16 and bf16.
inline constexpr float kRescaleSlack = 8.0f;

// The running max after a block of scores whose max is m_seen: kept while m_seen exceeds it by
// at most kRescaleSlack, else m_seen (a row that saw no key keeps -inf until it sees one).
MLAKIT_HOST_DEVICE constexpr float lazy_running_max(float m_run, float m_seen) {
  return m_seen > m_run + kRescaleSlack ? m_seen : m_run;
}

// The base the exponentials of a row are taken against: its running max, 0 while the row
// has seen no key (m = -inf).
MLAKIT_HOST_DEVICE constexpr float exp_base(float m) { return m == neg_inf() ? 0.0f : m; }

// Natural-log LSE of a finished row of the online softmax, whose state is kept in base 2:
// m is the running max of S * scale * log2(e), l the running sum of exp2(x - m); -inf when
// the row saw no key.
MLAKIT_HOST_DEVICE inline float lse_from_state(float m, float l) {
  if (!(l > 0.0f)) return neg_inf();
  return (m + __builtin_log2f(l)) * kLn2;
}

// A row's natural-log LSE (-inf for a row without keys) as the caller asked for it. base2
// multiplies by log2(e) (one rounding, -inf stays -inf); natural_empty_is_inf turns -inf into
// +inf. Every kernel that writes the caller's `lse` goes through this function.
MLAKIT_HOST_DEVICE inline float lse_in_format(float lse, LseFormat format) {
  if (format == LseFormat::base2) return lse * kLog2e;
  if (format == LseFormat::natural_empty_is_inf && lse == neg_inf()) return -neg_inf();
  return lse;
}

// Merging partial results of one row computed over disjoint key ranges. Each part i has a
// natural-log LSE (or -inf when it saw no key) and an output already normalised by its own
// sum. The merged output is sum_i w_i * o_i with w_i = exp(lse_i - lse), lse the merged LSE.
struct LseMerge {
  float max_lse = neg_inf();
  float sum = 0.0f;  // sum_i exp(lse_i - max_lse) over the parts seen so far

  MLAKIT_HOST_DEVICE void add(float lse) {
    if (lse == neg_inf()) return;
    if (lse > max_lse) {
      sum = sum * __builtin_exp2f((max_lse - lse) * kLog2e) + 1.0f;
      max_lse = lse;
    } else {
      sum += __builtin_exp2f((lse - max_lse) * kLog2e);
    }
  }
  // Raises max_lse to m (nothing when m is not larger) and returns the factor by which sums
  // kept relative to the old max must be multiplied: 1 when the max did not move, 0 while no
  // part was seen. A merge that adds parts in batches calls it once per batch with the
  // batch's largest LSE, rescales its weighted outputs by the factor, then adds the batch's
  // parts with add_below_max.
  MLAKIT_HOST_DEVICE float raise_max(float m) {
    if (!(m > max_lse)) return 1.0f;
    const float f = max_lse == neg_inf() ? 0.0f : __builtin_exp2f((max_lse - m) * kLog2e);
    sum *= f;
    max_lse = m;
    return f;
  }
  // Adds a part whose LSE is at most max_lse (set first by raise_max or a parallel max): no
  // rescaling, so parts may be summed in any fixed order. Returns the part's weight relative
  // to max_lse, exp(lse - max_lse) (0 for -inf), which multiplies its output in the sum.
  MLAKIT_HOST_DEVICE float add_below_max(float lse) {
    if (lse == neg_inf()) return 0.0f;
    const float w = __builtin_exp2f((lse - max_lse) * kLog2e);
    sum += w;
    return w;
  }
  // Adds the state of other parts (their max and sum) whose max is at most max_lse (raise_max
  // first with the largest of the states' maxima): returns the factor exp(o.max_lse - max_lse)
  // that scales their weighted outputs into this state (0 when o saw no part).
  MLAKIT_HOST_DEVICE float merge_below_max(const LseMerge& o) {
    if (o.max_lse == neg_inf()) return 0.0f;
    const float f = __builtin_exp2f((o.max_lse - max_lse) * kLog2e);
    sum += o.sum * f;
    return f;
  }
  // 1 / sum, the normalisation of the merged output (0 when no part saw a key).
  MLAKIT_HOST_DEVICE float inv_sum() const { return sum > 0.0f ? 1.0f / sum : 0.0f; }
  // Merged natural-log LSE; -inf when no part saw a key.
  MLAKIT_HOST_DEVICE float lse() const {
    return sum > 0.0f ? max_lse + __builtin_log2f(sum) * kLn2 : neg_inf();
  }
  // Weight of a part with the given LSE in the merged output (0 for empty parts).
  MLAKIT_HOST_DEVICE float weight(float part_lse) const {
    if (part_lse == neg_inf() || !(sum > 0.0f)) return 0.0f;
    return __builtin_exp2f((part_lse - max_lse) * kLog2e) / sum;
  }
};

}  // namespace mlakit
