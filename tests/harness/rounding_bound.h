// Tolerances for bf16/fp16 results from measurement, not a fixed figure: a result is within
// kRoundingMultiple times the error that rounding alone gives, measured as ATen's own
// computation in that dtype on the same input against the same float64 reference. A
// regression that loses precision (a per-row lse kept in bf16, fp32 accumulators turned
// bf16) then fails, where a fixed 2e-2 let both through.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <string>

namespace hyper_parallel::testing {

inline constexpr double kRoundingMultiple = 1.5;

// ||got - want|| / ||want|| in float64.
inline double relative_error(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.detach().cpu().to(at::kDouble), w = want.detach().cpu().to(at::kDouble);
  return (g - w).norm().item<double>() / std::max(w.norm().item<double>(), 1e-30);
}

// What the errors were: ATen's (rounding alone) and ours as a multiple of it, over a test.
class RoundingRecord {
 public:
  // `multiple`: of ATen's error (kRoundingMultiple; more for data that are fresh each run).
  explicit RoundingRecord(double multiple = kRoundingMultiple) : multiple_(multiple) {}
  // The relative-error bound for our result in `dtype` (error `ours` against `want`): float64
  // to rounding, float32 to its epsilon times the condition of a softmax over tens of classes;
  // bf16/fp16 from ATen's result in that dtype, `aten` (see bound).
  double tolerance(at::ScalarType dtype, const at::Tensor& aten, const at::Tensor& want, double ours) {
    if (dtype == at::kDouble) return 1e-12;
    if (dtype == at::kFloat) return 2e-5;
    return bound(aten, want, dtype, ours);
  }
  // kRoundingMultiple times ATen's error; a single value is allowed one ulp of `dtype` (its
  // rounding may land near exact by chance).
  double bound(const at::Tensor& aten, const at::Tensor& want, at::ScalarType dtype, double ours) {
    const double rounding = relative_error(aten, want);
    const double ulp = dtype == at::kHalf ? std::ldexp(1.0, -10) : std::ldexp(1.0, -7);
    const double b = std::max(multiple_ * rounding, want.numel() == 1 ? ulp : 0.0);
    std::lock_guard<std::mutex> lock(mutex_);
    if (want.numel() > 1) {
      min_rounding_ = std::min(min_rounding_, rounding);
      max_rounding_ = std::max(max_rounding_, rounding);
      if (rounding > 0) max_ratio_ = std::max(max_ratio_, ours / rounding);
    }
    return b;
  }
  // "rounding alone 1.2e-03..5.3e-03, ours at most 1.1x it" (values of more than one element).
  std::string summary() const {
    std::lock_guard<std::mutex> lock(mutex_);
    char buf[160];
    std::snprintf(buf, sizeof buf, "rounding alone %.2e..%.2e, ours at most %.2fx it (bound %.1fx)", min_rounding_,
                  max_rounding_, max_ratio_, multiple_);
    return buf;
  }

 private:
  double multiple_;
  mutable std::mutex mutex_;
  double min_rounding_ = std::numeric_limits<double>::infinity(), max_rounding_ = 0, max_ratio_ = 0;
};

}  // namespace hyper_parallel::testing
