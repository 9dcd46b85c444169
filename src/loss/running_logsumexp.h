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

}  // namespace hyper_parallel::ce_kernel

#undef HP_HOST_DEVICE
