// The running log-sum-exp state of the fused cross-entropy's CUDA kernel (internal): a
// pair (m, s) = (max of the values seen, sum of exp(y - m) over them), (-inf, 0) when
// empty. Host and device code, so that the CPU tests run the very update and merge the
// kernel's threads run (no GPU is needed to test them).
//
// Non-finite values give what ATen's sum of exp(y - max) gives: a NaN anywhere, or +inf
// twice (exp(inf - inf)), makes the state NaN; -inf adds nothing; an all -inf row stays
// (-inf, 0). The NaN must survive any order of updates and merges: a thread whose first
// value is NaN still has m = -inf, so the update sets m to NaN too.
#pragma once

#include <cmath>
#include <limits>

#if defined(__CUDACC__)
#define HP_HOST_DEVICE __host__ __device__
#else
#define HP_HOST_DEVICE
#endif

namespace hyper_parallel::ce_kernel {

HP_HOST_DEVICE inline float running_exp(float x) { return ::expf(x); }
HP_HOST_DEVICE inline double running_exp(double x) { return ::exp(x); }

// (m, s) <- the state of its values and y.
template <typename acc_t>
HP_HOST_DEVICE inline void running_lse_push(acc_t& m, acc_t& s, acc_t y) {
  if (y > m) {
    // exp(y - y): 1, or NaN for y = +inf, as ATen's exp(y - max) gives.
    s = s * running_exp(m - y) + running_exp(y - y);
    m = y;
  } else if (y != y) {
    m = y;
    s = y;
  } else if (y != -std::numeric_limits<acc_t>::infinity()) {
    s += running_exp(y - m);  // NaN when m is NaN, or y = m = +inf
  }
}

// (m, s) <- the state of its values and y[0], ..., y[N - 1]: exactly what N running_lse_push
// calls leave for non-finite values (a NaN makes the state NaN, -inf adds nothing, +inf
// twice is NaN) and the same sum for finite ones, with one rescale for the N values instead
// of a compare and branch per value (the CUDA kernel's 16-byte packs).
template <typename acc_t, int N>
HP_HOST_DEVICE inline void running_lse_push_pack(acc_t& m, acc_t& s, const acc_t (&y)[N]) {
  const acc_t ninf = -std::numeric_limits<acc_t>::infinity();
  acc_t top = ninf;
  bool nan = false;
  for (int i = 0; i < N; ++i) {
    top = y[i] > top ? y[i] : top;
    nan = nan || y[i] != y[i];
  }
  if (nan) {
    m = s = std::numeric_limits<acc_t>::quiet_NaN();
    return;
  }
  if (top == ninf) return;
  if (top > m) {
    s *= running_exp(m - top);  // 0 from the empty state (-inf, 0)
    m = top;
  }
  for (int i = 0; i < N; ++i) s += running_exp(y[i] - m);  // NaN for y = m = +inf, or m NaN
}

// (m, s) <- the state of both halves' values.
template <typename acc_t>
HP_HOST_DEVICE inline void running_lse_merge(acc_t& m, acc_t& s, acc_t m2, acc_t s2) {
  const acc_t ninf = -std::numeric_limits<acc_t>::infinity();
  if (m2 == ninf && s2 == acc_t(0)) return;  // the other half is empty
  if (m == ninf && s == acc_t(0)) {
    m = m2;
    s = s2;
    return;
  }
  const acc_t top = m > m2 ? m : m2;  // a NaN in either propagates through exp below
  s = s * running_exp(m - top) + s2 * running_exp(m2 - top);
  m = (m != m || m2 != m2) ? m + m2 : top;
}

// Label smoothing and probability targets need V = sum_c u_c y_c over the classes (u_c: the
// class weight, or w_c q'_c), and the loss subtracts it from (sum_c u_c) lse. At large logits
// the two cancel: at 3e4 in float, a sum of y_c is 1e-3 off, about the loss itself. So the
// kernels keep V relative to a reference, sum_c u_c (y_c - ref), with ref = the running max
// (0 while that is not finite), and U = sum_c u_c: the terms are then small, as the
// log-probabilities ATen sums are, and a change of reference moves V by (old - new) U.
template <typename acc_t>
HP_HOST_DEVICE inline acc_t relative_sum_reference(acc_t m) {
  return m - m == acc_t(0) ? m : acc_t(0);  // m - m is NaN for +-inf and NaN
}

// V relative to old_ref -> relative to new_ref (U: the weight summed into V).
template <typename acc_t>
HP_HOST_DEVICE inline void rebase_relative_sum(acc_t& v, acc_t u, acc_t old_ref, acc_t new_ref) {
  if (u != acc_t(0) && old_ref != new_ref) v += (old_ref - new_ref) * u;
}

// (v, u) <- with y of weight `weight` added, the max having gone from m_before to m_after.
template <typename acc_t>
HP_HOST_DEVICE inline void relative_sum_push(acc_t& v, acc_t& u, acc_t m_before, acc_t m_after, acc_t y, acc_t weight) {
  const acc_t ref = relative_sum_reference(m_after);
  rebase_relative_sum(v, u, relative_sum_reference(m_before), ref);
  v += weight * (y - ref);
  u += weight;
}

// (v, u) of max m <- merged with (v2, u2) of max m2, relative to the merged max.
template <typename acc_t>
HP_HOST_DEVICE inline void relative_sum_merge(acc_t& v, acc_t& u, acc_t m, acc_t v2, acc_t u2, acc_t m2,
                                              acc_t m_merged) {
  const acc_t ref = relative_sum_reference(m_merged);
  rebase_relative_sum(v, u, relative_sum_reference(m), ref);
  rebase_relative_sum(v2, u2, relative_sum_reference(m2), ref);
  v += v2;
  u += u2;
}

}  // namespace hyper_parallel::ce_kernel

#undef HP_HOST_DEVICE
