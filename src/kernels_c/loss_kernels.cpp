// The C interface (include/hyper_parallel_kernels/loss_kernels.h): each exported function
// checks its arguments (kernel_inputs.h), runs the kernels of src/loss/kernel/ (the very source
// libhyper_parallel compiles) on raw arrays, and turns every exception into a status
// (kernel_error.h).
#include "hyper_parallel_kernels/loss_kernels.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels_c/kernel_error.h"
#include "kernels_c/kernel_inputs.h"
#include "loss/kernel/cross_entropy_combine.h"
#include "loss/kernel/cross_entropy_cpu_kernel.h"
#include "loss/kernel/kernel_runtime.h"

namespace hyper_parallel::kernels_c {

namespace {

namespace k = ce_kernel;

// Calls fn(acc_t{}) for the compute type of logits of `dtype` (checked before).
template <typename Fn>
void with_compute_type(int32_t dtype, Fn&& fn) {
  if (dtype == HPK_FLOAT64)
    fn(double{});
  else
    fn(float{});
}

const void* data_or_null(const auto& v) { return v.empty() ? nullptr : v.data(); }

// The statistics of a piece without classes (more ranks than classes): max -inf, nothing summed.
template <typename acc_t>
void empty_piece_stats(acc_t* stats, int64_t rows) {
  std::fill(stats, stats + k::kStats * rows, acc_t(0));
  std::fill(stats + k::kMax * rows, stats + (k::kMax + 1) * rows, -std::numeric_limits<acc_t>::infinity());
}

k::ForwardArgs forward_args(const hpk_logits& x, void* stats) {
  k::ForwardArgs args;
  args.dtype = scalar_type_of(x.dtype);
  args.x = x.data;
  args.rows = x.rows;
  args.cols = x.local_classes;
  args.ldx = row_stride_of(x.row_stride, x.rows, x.local_classes, "logits.row_stride");
  args.stats = stats;
  return args;
}

k::BackwardArgs backward_args(const hpk_logits& x, void* grad, int64_t grad_row_stride) {
  const int64_t ldx = row_stride_of(x.row_stride, x.rows, x.local_classes, "logits.row_stride");
  const int64_t ldo = row_stride_of(grad_row_stride, x.rows, x.local_classes, "grad_row_stride");
  if (grad == x.data && ldo != ldx)
    fail(HPK_ERROR_SHAPE, "grad_logits is the logits' memory: expected its row stride to be theirs (", ldx, "), got ",
         ldo);
  k::BackwardArgs args;
  args.dtype = scalar_type_of(x.dtype);
  args.x = x.data;
  args.out = grad;
  args.rows = x.rows;
  args.cols = x.local_classes;
  args.ldx = ldx;
  args.ldo = ldo;
  return args;
}

// Incoming gradient times a unit-gradient coefficient; a zero coefficient (an ignored row)
// stays exactly 0 whatever the gradient.
template <typename acc_t>
acc_t scaled_coefficient(acc_t unit, acc_t grad) {
  return unit == acc_t(0) ? acc_t(0) : grad * unit;
}

}  // namespace

}  // namespace hyper_parallel::kernels_c

using namespace hyper_parallel::kernels_c;  // NOLINT: the exported functions below are C
namespace k = hyper_parallel::ce_kernel;

extern "C" {

HPK_API const char* hpk_version(void) { return HPK_VERSION_STRING; }

HPK_API const char* hpk_capability(void) {
  try {
    return k::capability_name();
  } catch (...) {
    return "DEFAULT";
  }
}

HPK_API int32_t hpk_compute_dtype(int32_t dtype) {
  switch (dtype) {
    case HPK_FLOAT32:
    case HPK_FLOAT16:
    case HPK_BFLOAT16:
      return HPK_FLOAT32;
    case HPK_FLOAT64:
      return HPK_FLOAT64;
    default:
      return -1;
  }
}

HPK_API int64_t hpk_dtype_size(int32_t dtype) {
  switch (dtype) {
    case HPK_FLOAT16:
    case HPK_BFLOAT16:
      return 2;
    case HPK_FLOAT32:
    case HPK_INT32:
      return 4;
    case HPK_FLOAT64:
    case HPK_INT64:
      return 8;
    default:
      return 0;
  }
}

HPK_API int32_t hpk_set_num_threads(int32_t threads, hpk_error* error) {
  return run_guarded("hpk_set_num_threads", error, [&] {
    if (threads < 0) fail(HPK_ERROR_OPTION, "expected threads >= 1 (or 0: OpenMP's own), got ", threads);
    k::runtime::requested_threads().store(threads);
  });
}

HPK_API void hpk_cross_entropy_init(hpk_cross_entropy* ce) {
  if (!ce) return;
  std::memset(ce, 0, sizeof *ce);
  ce->logits.dtype = HPK_FLOAT32;
  ce->logits.total_classes = 0;
  ce->target_kind = HPK_TARGET_INDEX;
  ce->target_dtype = HPK_INT64;
  ce->weight_dtype = HPK_FLOAT32;
  ce->ignore_index = -100;
  ce->reduction = HPK_REDUCTION_MEAN;
}

HPK_API int32_t hpk_cross_entropy_stats(const hpk_cross_entropy* ce, void* stats, hpk_error* error) {
  return run_guarded("hpk_cross_entropy_stats", error, [&] {
    require(ce, "ce");
    check_cross_entropy(*ce, true);
    const hpk_logits& x = ce->logits;
    if (x.rows > 0) require(stats, "stats");
    with_compute_type(x.dtype, [&](auto acc) {
      using acc_t = decltype(acc);
      const auto in = prepare_cross_entropy<acc_t>(*ce, true);
      if (x.rows == 0) return;
      if (x.local_classes == 0) return empty_piece_stats(static_cast<acc_t*>(stats), x.rows);
      k::ForwardArgs args = forward_args(x, stats);
      args.logit_softcap = ce->logit_softcap;
      args.weight = data_or_null(in.local_weight);
      const double eps = ce->label_smoothing;
      if (ce->target_kind == HPK_TARGET_PROBABILITIES) {
        args.q = in.q;
        args.ldq = in.ldq;
        args.q_scale = 1 - eps;
        args.q_shift = eps / static_cast<double>(x.total_classes);
      } else {
        args.target_col = in.target_col.data();
        args.smoothing_sum = eps > 0;
      }
      k::forward_stats(args);
    });
  });
}

HPK_API int32_t hpk_cross_entropy_combine(const hpk_cross_entropy* ce, const void* all_stats, int64_t ranks, void* loss,
                                          void* saved, hpk_error* error) {
  return run_guarded("hpk_cross_entropy_combine", error, [&] {
    require(ce, "ce");
    check_cross_entropy(*ce, false);
    const int64_t rows = ce->logits.rows;
    if (ranks < 1) fail(HPK_ERROR_SHAPE, "expected ranks >= 1 (the first dimension of all_stats), got ", ranks);
    if (rows > 0) {
      require(all_stats, "all_stats");
      require(saved, "saved");
    }
    if (rows > 0 || ce->reduction != HPK_REDUCTION_NONE) require(loss, "loss");
    with_compute_type(ce->logits.dtype, [&](auto acc) {
      using acc_t = decltype(acc);
      const auto in = prepare_cross_entropy<acc_t>(*ce, false);
      auto* s = static_cast<acc_t*>(saved);
      k::CrossEntropyCombineArgs<acc_t> args;
      args.all = static_cast<const acc_t*>(all_stats);
      args.ranks = ranks;
      args.rows = rows;
      args.probabilities = ce->target_kind == HPK_TARGET_PROBABILITIES;
      args.row_weight = in.row_weight.data();
      args.valid = in.valid.data();
      args.classes = ce->logits.total_classes;
      args.weight_sum = in.weight_sum;
      args.label_smoothing = ce->label_smoothing;
      args.z_loss_weight = ce->z_loss_weight;
      args.reduction = ce->reduction;
      args.loss = static_cast<acc_t*>(loss);
      args.row_max = s;
      args.log_sum = s + rows;
      args.a = s + 2 * rows;
      args.b = s + 3 * rows;
      args.c = s + 4 * rows;
      args.t = s + 5 * rows;
      k::cross_entropy_combine(args);
    });
  });
}

HPK_API int32_t hpk_cross_entropy_backward(const hpk_cross_entropy* ce, const void* saved, const void* grad_loss,
                                           void* grad_logits, int64_t grad_row_stride, hpk_error* error) {
  return run_guarded("hpk_cross_entropy_backward", error, [&] {
    require(ce, "ce");
    check_cross_entropy(*ce, true);
    const hpk_logits& x = ce->logits;
    const int64_t rows = x.rows;
    if (rows > 0) {
      require(saved, "saved");
      require(grad_loss, "grad_loss");
    }
    if (rows > 0 && x.local_classes > 0) require(grad_logits, "grad_logits");
    with_compute_type(x.dtype, [&](auto acc) {
      using acc_t = decltype(acc);
      const auto in = prepare_cross_entropy<acc_t>(*ce, true);
      k::BackwardArgs args = backward_args(x, grad_logits, grad_row_stride);
      if (rows == 0 || x.local_classes == 0) return;
      const auto* s = static_cast<const acc_t*>(saved);
      const auto* g = static_cast<const acc_t*>(grad_loss);
      const bool per_row = ce->reduction == HPK_REDUCTION_NONE;
      // The saved unit-gradient coefficients times the incoming gradient.
      std::vector<acc_t> co(static_cast<size_t>(4 * rows));
      for (int64_t i = 0; i < 4; ++i)
        for (int64_t r = 0; r < rows; ++r)
          co[static_cast<size_t>(i * rows + r)] = scaled_coefficient(s[(2 + i) * rows + r], per_row ? g[r] : g[0]);
      args.logit_softcap = ce->logit_softcap;
      args.row_max = s;
      args.log_sum = s + rows;
      args.a = co.data();
      args.b = co.data() + rows;
      args.weight = data_or_null(in.local_weight);
      if (ce->target_kind == HPK_TARGET_PROBABILITIES) {
        args.c = co.data() + 2 * rows;
        args.q = in.q;
        args.ldq = in.ldq;
      } else {
        args.t_coef = co.data() + 3 * rows;
        args.target_col = in.target_col.data();
      }
      k::backward(args);
    });
  });
}

HPK_API void hpk_logprobs_init(hpk_logprobs* lp) {
  if (!lp) return;
  std::memset(lp, 0, sizeof *lp);
  lp->logits.dtype = HPK_FLOAT32;
  lp->target_dtype = HPK_INT64;
  lp->ignore_index = -100;
  lp->temperature = 1.0;
}

HPK_API int32_t hpk_logprobs_stats(const hpk_logprobs* lp, void* stats, hpk_error* error) {
  return run_guarded("hpk_logprobs_stats", error, [&] {
    require(lp, "lp");
    check_logprobs(*lp, true);
    const hpk_logits& x = lp->logits;
    if (x.rows > 0) require(stats, "stats");
    const LogprobsInputs in = prepare_logprobs(*lp);
    if (x.rows == 0) return;
    with_compute_type(x.dtype, [&](auto acc) {
      using acc_t = decltype(acc);
      if (x.local_classes == 0) return empty_piece_stats(static_cast<acc_t*>(stats), x.rows);
      k::ForwardArgs args = forward_args(x, stats);
      args.inv_temperature = 1.0 / lp->temperature;
      args.entropy_sum = lp->entropy != 0;
      args.target_col = in.target_col.data();
      k::forward_stats(args);
    });
  });
}

HPK_API int32_t hpk_logprobs_combine(const hpk_logprobs* lp, const void* all_stats, int64_t ranks, void* logprobs,
                                     void* entropy, void* saved, hpk_error* error) {
  return run_guarded("hpk_logprobs_combine", error, [&] {
    require(lp, "lp");
    check_logprobs(*lp, false);
    const int64_t rows = lp->logits.rows;
    if (ranks < 1) fail(HPK_ERROR_SHAPE, "expected ranks >= 1 (the first dimension of all_stats), got ", ranks);
    if (rows > 0) {
      require(all_stats, "all_stats");
      require(logprobs, "logprobs");
      require(saved, "saved");
      if (lp->entropy) require(entropy, "entropy (lp->entropy is set)");
    }
    const LogprobsInputs in = prepare_logprobs(*lp);
    with_compute_type(lp->logits.dtype, [&](auto acc) {
      using acc_t = decltype(acc);
      auto* s = static_cast<acc_t*>(saved);
      k::LogprobsCombineArgs<acc_t> args;
      args.all = static_cast<const acc_t*>(all_stats);
      args.ranks = ranks;
      args.rows = rows;
      args.valid = in.valid.data();
      args.temperature = lp->temperature;
      args.entropy = lp->entropy != 0;
      args.logprobs = static_cast<acc_t*>(logprobs);
      args.entropy_rows = static_cast<acc_t*>(entropy);
      args.row_max = s;
      args.log_sum = s + rows;
      args.mean_difference = s + 2 * rows;
      k::logprobs_combine(args);
    });
  });
}

HPK_API int32_t hpk_logprobs_backward(const hpk_logprobs* lp, const void* saved, const void* grad_logprobs,
                                      const void* grad_entropy, void* grad_logits, int64_t grad_row_stride,
                                      hpk_error* error) {
  return run_guarded("hpk_logprobs_backward", error, [&] {
    require(lp, "lp");
    check_logprobs(*lp, true);
    const hpk_logits& x = lp->logits;
    const int64_t rows = x.rows;
    if (grad_entropy && !lp->entropy)
      fail(HPK_ERROR_OPTION, "an entropy gradient needs the entropy: expected lp->entropy set (as in forward), got 0");
    if (rows > 0) require(saved, "saved");
    if (rows > 0 && x.local_classes > 0) require(grad_logits, "grad_logits");
    const LogprobsInputs in = prepare_logprobs(*lp);
    with_compute_type(x.dtype, [&](auto acc) {
      using acc_t = decltype(acc);
      k::BackwardArgs args = backward_args(x, grad_logits, grad_row_stride);
      if (rows == 0 || x.local_classes == 0) return;
      const auto* s = static_cast<const acc_t*>(saved);
      std::vector<acc_t> co(static_cast<size_t>(3 * rows));
      k::logprobs_coefficients<acc_t>(rows, in.valid.data(), lp->temperature, s + 2 * rows,
                                      static_cast<const acc_t*>(grad_logprobs), static_cast<const acc_t*>(grad_entropy),
                                      co.data(), co.data() + rows, co.data() + 2 * rows);
      args.inv_temperature = 1.0 / lp->temperature;
      args.row_max = s;
      args.log_sum = s + rows;
      args.a = co.data();
      if (grad_entropy) args.e = co.data() + rows;
      args.t_coef = co.data() + 2 * rows;
      args.target_col = in.target_col.data();
      k::backward(args);
    });
  });
}

}  // extern "C"
