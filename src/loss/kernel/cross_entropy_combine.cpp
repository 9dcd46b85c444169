// cross_entropy_combine.h: the combine step on raw arrays.
#include "loss/kernel/cross_entropy_combine.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "loss/kernel/cross_entropy_cpu_kernel.h"
#include "loss/kernel/running_logsumexp.h"

namespace hyper_parallel::ce_kernel {

namespace {

// One rank's statistic `stat` of row r in all [ranks, kStats, rows].
template <typename acc_t>
struct Gathered {
  const acc_t* all;
  int64_t rows;
  acc_t operator()(int64_t p, Stat stat, int64_t r) const { return all[(p * kStats + stat) * rows + r]; }
};

// A difference of logits in units of the temperature, divided after it is taken (fused_logprobs.h).
template <typename acc_t>
acc_t scaled(acc_t difference, acc_t inv_t, bool is_scaled) {
  return is_scaled ? difference * inv_t : difference;
}

// Row r's M (0 where every rank's max is -inf; NaN when one is NaN, as at::amax) and
// S = sum_p s_p exp((m_p - M) / T) (exp(inf - inf) makes a +inf row NaN, as ATen's).
template <typename acc_t>
void log_sum_exp_row(const Gathered<acc_t>& g, int64_t ranks, int64_t r, acc_t inv_t, bool is_scaled, acc_t& top,
                     acc_t& sum_exp) {
  const acc_t ninf = -std::numeric_limits<acc_t>::infinity();
  top = ninf;
  for (int64_t p = 0; p < ranks; ++p) {
    const acc_t m = g(p, kMax, r);
    top = (std::isnan(m) || m > top) ? m : top;
    if (std::isnan(top)) break;
  }
  if (top == ninf) top = 0;
  sum_exp = 0;
  for (int64_t p = 0; p < ranks; ++p) {
    // The rank holding the max needs no exp: exp(0) is 1 exactly (inf - inf is NaN, not 0).
    const acc_t difference = g(p, kMax, r) - top;
    sum_exp +=
        difference == 0 ? g(p, kSumExp, r) : g(p, kSumExp, r) * std::exp(scaled<acc_t>(difference, inv_t, is_scaled));
  }
}

}  // namespace

template <typename acc_t>
void cross_entropy_combine(const CrossEntropyCombineArgs<acc_t>& args) {
  const Gathered<acc_t> g{args.all, args.rows};
  const int64_t rows = args.rows;
  const acc_t one_minus_eps = static_cast<acc_t>(1 - args.label_smoothing);
  const acc_t eps_over_c = static_cast<acc_t>(args.label_smoothing / static_cast<double>(args.classes));
  const bool smoothing = args.label_smoothing > 0;
  const acc_t z = static_cast<acc_t>(args.z_loss_weight);
  const bool none = args.reduction == 0, mean = args.reduction == 1;
  // Per-row losses first (kept in `a` for a moment when the loss is reduced), their sums in double.
  double ce_sum = 0, z_sum = 0, ce_denominator = 0, z_denominator = 0;
  for (int64_t r = 0; r < rows; ++r) {
    acc_t top, sum_exp;
    log_sum_exp_row(g, args.ranks, r, acc_t(1), false, top, sum_exp);
    const acc_t log_sum = std::log(sum_exp);
    args.row_max[r] = top;
    args.log_sum[r] = log_sum;
    const acc_t ref = relative_sum_reference(top);
    acc_t v1 = 0, u_all = 0, v2 = 0;
    for (int64_t p = 0; p < args.ranks; ++p) {
      const acc_t u = g(p, kU, r);
      v1 += g(p, kV1, r);
      u_all += u;
      v2 += g(p, kV2, r) + (u != 0 ? (relative_sum_reference(g(p, kMax, r)) - ref) * u : acc_t(0));
    }
    const bool counted = args.probabilities || args.valid[r];
    acc_t ce_row;
    if (args.probabilities) {
      args.a[r] = v1;  // A = sum_c w_c q'_c, until the coefficients below
      if (args.target_weight_sum) args.target_weight_sum[r] = v1;
      ce_row = u_all * log_sum - v2;
    } else {
      ce_row = one_minus_eps * args.row_weight[r] * ((top - v1) + log_sum);
      if (smoothing) ce_row = ce_row + eps_over_c * (u_all * log_sum - v2);
      if (!counted) ce_row = 0;
      ce_denominator += static_cast<double>(args.row_weight[r]);
      z_denominator += counted ? 1 : 0;
    }
    const acc_t lse = top + log_sum;
    const acc_t z_row = counted && z != 0 ? z * lse * lse : acc_t(0);
    if (none) {
      args.loss[r] = z != 0 ? ce_row + z_row : ce_row;
    } else {
      ce_sum += static_cast<double>(ce_row);
      z_sum += static_cast<double>(z_row);
    }
  }
  if (args.probabilities) ce_denominator = z_denominator = static_cast<double>(rows);
  if (!none) {
    double loss = mean ? ce_sum / ce_denominator : ce_sum;
    if (z != 0) loss += mean ? z_sum / z_denominator : z_sum;
    args.loss[0] = static_cast<acc_t>(loss);
  }
  // Coefficients for a unit incoming gradient: sc scales the cross-entropy's terms, sz the
  // z-loss's (their denominators differ under mean). Ignored rows get exactly 0, even when a
  // mean divided by a total weight of 0.
  const acc_t sc_all = static_cast<acc_t>(mean ? 1.0 / ce_denominator : 1.0);
  const acc_t sz_all = static_cast<acc_t>(mean ? 1.0 / z_denominator : 1.0);
  const acc_t weight_sum = static_cast<acc_t>(args.weight_sum);
  for (int64_t r = 0; r < rows; ++r) {
    const bool counted = args.probabilities || args.valid[r];
    const acc_t sc = counted ? sc_all : acc_t(0), sz = counted ? sz_all : acc_t(0);
    acc_t a, b = smoothing ? sc * eps_over_c : acc_t(0), c = 0, t = 0;
    if (args.probabilities) {
      a = sc * args.a[r];
      c = sc * one_minus_eps;
    } else {
      a = sc * (one_minus_eps * args.row_weight[r]);
      if (smoothing) a = a + sc * (eps_over_c * weight_sum);
      t = sc * (one_minus_eps * args.row_weight[r]);
    }
    if (z != 0) a = a + sz * (2 * z) * (args.row_max[r] + args.log_sum[r]);
    args.a[r] = a;
    args.b[r] = b;
    args.c[r] = c;
    args.t[r] = t;
  }
}

template <typename acc_t>
void logprobs_combine(const LogprobsCombineArgs<acc_t>& args) {
  const Gathered<acc_t> g{args.all, args.rows};
  const acc_t inv_t = static_cast<acc_t>(1.0 / args.temperature);
  const bool is_scaled = args.temperature != 1.0;
  const acc_t ninf = -std::numeric_limits<acc_t>::infinity();
  for (int64_t r = 0; r < args.rows; ++r) {
    acc_t top, sum_exp;
    log_sum_exp_row(g, args.ranks, r, inv_t, is_scaled, top, sum_exp);
    const acc_t log_sum = std::log(sum_exp);
    args.row_max[r] = top;
    args.log_sum[r] = log_sum;
    const bool counted = args.valid[r] != 0;
    acc_t target_logit = 0;
    for (int64_t p = 0; p < args.ranks; ++p) target_logit += g(p, kV1, r);
    // The cross-entropy's (M - y_t) + log_sum, negated: its -loss bit for bit at T = 1.
    args.logprobs[r] = counted ? -(scaled<acc_t>(top - target_logit, inv_t, is_scaled) + log_sum) : acc_t(0);
    acc_t mu = 0;
    if (args.entropy && counted) {
      // W = sum_p exp(g_p) (h_p + g_p s_p), g_p = (m_p - M) / T clamped as the kernel clamps d
      // (an overflowing g_p times exp(g_p) = 0 would be NaN); a rank with nothing summed adds 0.
      acc_t w = 0;
      for (int64_t p = 0; p < args.ranks; ++p) {
        const acc_t m = g(p, kMax, r);
        if (m == ninf) continue;
        const acc_t shift = scaled<acc_t>(m - top, inv_t, is_scaled);
        w += (g(p, kV2, r) + std::max(shift, static_cast<acc_t>(kZeroProbabilityDifference)) * g(p, kSumExp, r)) *
             std::exp(shift);
      }
      mu = w / sum_exp;
    }
    args.mean_difference[r] = mu;
    if (args.entropy) args.entropy_rows[r] = counted ? log_sum - mu : acc_t(0);
  }
}

template <typename acc_t>
void logprobs_coefficients(int64_t rows, const uint8_t* valid, double temperature, const acc_t* mean_difference,
                           const acc_t* grad_logprobs, const acc_t* grad_entropy, acc_t* a, acc_t* e, acc_t* t) {
  const acc_t inv_t = static_cast<acc_t>(1.0 / temperature);
  for (int64_t r = 0; r < rows; ++r) {
    const bool counted = valid[r] != 0;
    const acc_t g_lp = counted && grad_logprobs ? grad_logprobs[r] : acc_t(0);
    const acc_t g_h = counted && grad_entropy ? grad_entropy[r] : acc_t(0);
    t[r] = -inv_t * g_lp;
    a[r] = grad_entropy ? t[r] + inv_t * g_h * mean_difference[r] : t[r];
    e[r] = -inv_t * g_h;
  }
}

template void cross_entropy_combine<float>(const CrossEntropyCombineArgs<float>&);
template void cross_entropy_combine<double>(const CrossEntropyCombineArgs<double>&);
template void logprobs_combine<float>(const LogprobsCombineArgs<float>&);
template void logprobs_combine<double>(const LogprobsCombineArgs<double>&);
template void logprobs_coefficients<float>(int64_t, const uint8_t*, double, const float*, const float*, const float*,
                                           float*, float*, float*);
template void logprobs_coefficients<double>(int64_t, const uint8_t*, double, const double*, const double*,
                                            const double*, double*, double*, double*);

}  // namespace hyper_parallel::ce_kernel
