// The CPU kernels' arguments (loss/kernel/cross_entropy_cpu_kernel.h) over tensors, for the
// tests that call the kernels directly: the fields every call sets, from the tensors' sizes and
// dtypes. A test sets the optional ones (targets, weights, smoothing sums, coefficients b, c,
// t) itself.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "loss/kernel/cross_entropy_cpu_kernel.h"

namespace hyper_parallel::testing {

// Statistics of the rows x [rows, cols] (row stride `ld`, unit class stride) into stats
// [kStats, rows] of the compute type.
inline ce_kernel::ForwardArgs forward_args(const at::Tensor& x, int64_t ld, const at::Tensor& stats) {
  ce_kernel::ForwardArgs f;
  f.dtype = x.scalar_type();
  f.x = x.const_data_ptr();
  f.rows = x.size(0);
  f.cols = x.size(1);
  f.ldx = ld;
  f.stats = stats.data_ptr();
  return f;
}

// The gradient of the rows x into out (both [rows, cols] with row stride `ld`; out may be x)
// from the combine's row_max and log_sum and the coefficient a ([rows] each, compute type).
inline ce_kernel::BackwardArgs backward_args(const at::Tensor& x, const at::Tensor& out, int64_t ld,
                                             const at::Tensor& row_max, const at::Tensor& log_sum,
                                             const at::Tensor& a) {
  ce_kernel::BackwardArgs g;
  g.dtype = x.scalar_type();
  g.x = x.const_data_ptr();
  g.out = out.data_ptr();
  g.rows = x.size(0);
  g.cols = x.size(1);
  g.ldx = g.ldo = ld;
  g.row_max = row_max.const_data_ptr();
  g.log_sum = log_sum.const_data_ptr();
  g.a = a.const_data_ptr();
  return g;
}

}  // namespace hyper_parallel::testing
