// The combine step of the fused cross-entropy and log-probabilities on raw arrays (internal):
// from every rank's per-row statistics [P, kStats, rows] (cross_entropy_cpu_kernel.h), gathered
// by the caller, the loss or log-probabilities and what backward needs. Plain C++ on arrays, no
// framework: the framework-free library (src/kernels_c) runs it on the statistics its caller's
// framework gathered, and the LibTorch route on the CPU on those it gathered (so that both
// give the same loss). fused_cross_entropy.cpp's and fused_logprobs.cpp's tensor combine
// (combine_log_sum_exp, fused_cross_entropy_combine, coefficients) is the same math for the
// devices without it:
//   M = max_p m_p (0 when -inf),  S = sum_p s_p exp((m_p - M) / T),  log_sum = log S
//   index targets: (1 - eps) w_t ((M - y_t) + log_sum) + eps / C (W log_sum - sum_c w_c (y_c - M))
//   probability targets: U log_sum - sum_c w_c q'_c (y_c - M)
// with the sums of y_c kept relative to each rank's max and moved to M (running_logsumexp.h).
// acc_t is the compute type: float or double.
#pragma once

#include <cstdint>

namespace hyper_parallel::ce_kernel {

template <typename acc_t>
struct CrossEntropyCombineArgs {
  const acc_t* all = nullptr;  // [ranks, kStats, rows]
  int64_t ranks = 0, rows = 0;
  bool probabilities = false;         // probability targets (else index targets)
  const acc_t* row_weight = nullptr;  // index: w[t] (1 without weights), 0 for ignored rows
  const uint8_t* valid = nullptr;     // index: 1 for counted rows, 0 for ignored ones
  int64_t classes = 0;                // C, over all ranks
  double weight_sum = 0;              // sum_c w_c (C without weights): label smoothing's W
  double label_smoothing = 0, z_loss_weight = 0;
  int64_t reduction = 1;  // at::Reduction's values: 0 none, 1 mean, 2 sum
  // Outputs.
  acc_t* loss = nullptr;                         // [rows] for none, else [1]
  acc_t *row_max = nullptr, *log_sum = nullptr;  // [rows]
  // The gradient's per-row coefficients for a unit incoming gradient (BackwardArgs' a, b, c and
  // t_coef; reduction's denominators included), [rows] each: backward multiplies them by the
  // incoming gradient. c is 0 for index targets, t for probability targets.
  acc_t *a = nullptr, *b = nullptr, *c = nullptr, *t = nullptr;
  // Probability targets, optional: A = sum_c w_c q'_c per row [rows], which a later backward's
  // coefficients take (index targets: unused).
  acc_t* target_weight_sum = nullptr;
};

template <typename acc_t>
void cross_entropy_combine(const CrossEntropyCombineArgs<acc_t>& args);

template <typename acc_t>
struct LogprobsCombineArgs {
  const acc_t* all = nullptr;  // [ranks, kStats, rows], statistics at `temperature` (entropy_sum when entropy)
  int64_t ranks = 0, rows = 0;
  const uint8_t* valid = nullptr;  // 1 for counted rows, 0 for ignored ones (they give 0)
  double temperature = 1;
  bool entropy = false;
  // Outputs, [rows] each: log p_t; with entropy the entropy (else unused) and mu, the mean of
  // (y - M) / T under p (0 without entropy), which backward needs.
  acc_t *logprobs = nullptr, *entropy_rows = nullptr, *mean_difference = nullptr;
  acc_t *row_max = nullptr, *log_sum = nullptr;
};

template <typename acc_t>
void logprobs_combine(const LogprobsCombineArgs<acc_t>& args);

// Backward's per-row coefficients of the log-probabilities (BackwardArgs' a, e and t_coef) for
// incoming gradients g_lp and g_h ([rows] each or null; counted rows only), the saved mu:
//   t = -g_lp / T, a = t + g_h mu / T, e = -g_h / T (fused_logprobs.h's math).
template <typename acc_t>
void logprobs_coefficients(int64_t rows, const uint8_t* valid, double temperature, const acc_t* mean_difference,
                           const acc_t* grad_logprobs, const acc_t* grad_entropy, acc_t* a, acc_t* e, acc_t* t);

}  // namespace hyper_parallel::ce_kernel
