// Per-token log-probabilities and entropy at a temperature from the fused cross-entropy's
// statistics (internal; the public functions are vocab_logprobs.h's). Every difference of
// logits is taken before it is divided by T, d = (x - m) / T, never x / T - m / T: x / T is
// rounded at its own scale, which at T = 1e-3 is 1e3 ulps of x, and the softmax's differences
// taken after that rounding carried an error growing as 1 / T (0.6 in a float32 entropy
// gradient at T = 1e-3). Differences taken first are exact near the max at any T.
//   each rank, per row:  m_p = max x, s_p = sum exp(d), h_p = sum exp(d) d, d = (x - m_p) / T,
//                        x_t when it owns the target (ce.temperature, ce.entropy_sum)
//   after the forward's one all-gather, on every rank alike, with g_p = (m_p - M) / T:
//                        M = max m_p, S = sum s_p exp(g_p), L = log S (as the cross-entropy)
//                        log p_t = -((M - x_t) / T + L), the cross-entropy's -loss bit for bit at T = 1
//                        mu = W / S <= 0, W = sum exp(g_p) (h_p + g_p s_p): the mean of d under p
//                        H = L - mu
//   L and -mu are both >= 0, so H never cancels, even for a nearly one-hot row.
// Backward, no collective: with d_j = (x_j - M) / T and p_j = exp(d_j - L), log p_j + H = d_j - mu:
//   d/dx_j = (1/T) (g_lp ([j = t] - p_j) - g_H p_j (d_j - mu)),
// from mu kept by forward, not from H - L (which cancels where H and L are both large).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "hyper_parallel/loss/vocab_logprobs.h"

#include "loss/call/call_agreement.h"
#include "loss/call/class_sharding.h"
#include "loss/math/fused_cross_entropy.h"
#include "loss/call/input_agreement.h"

namespace hyper_parallel {

// The record agree_on_call compares for a log-probabilities call of `op`: `rows` of `dtype`,
// the options (LossCallPlan adds the classes).
LossCallRecord logprobs_call(const std::string& op, int64_t rows, at::ScalarType dtype, const LogprobsOptions& options);

// The options' ranges (temperature finite and > 0, with 1 / T finite in the compute type of
// `dtype`, the logits': the kernels scale by it; block sizes >= 0), naming `op`.
void check_logprobs_options(const LogprobsOptions& options, const std::string& op, at::ScalarType dtype);
// The sampled tokens as the kernels take them ([rows] int64), after PyTorch's checks for
// class indices: Long or Byte, of shape `shape`, in [0, vocab) or ignore_index, no gradient.
// Probability targets are refused (LossParallelUnsupportedError).
at::Tensor logprobs_target(const at::Tensor& target, c10::IntArrayRef shape, int64_t vocab, int64_t ignore_index,
                           const std::string& op);

// Per row ([M], compute type; ignored rows 0): the log-probabilities, and with ce.entropy_sum
// the entropy and mu, the mean of (x - max) / T under p (the header's math; else undefined).
struct LogprobsRows {
  at::Tensor logprobs, entropy, mean_difference;
};

// The rows from this rank's statistics [kStats, M], after the one all-gather (carrying
// `agreement`'s record when given). Sets ce.row_max and ce.log_sum.
LogprobsRows fused_logprobs_combine(FusedCrossEntropy& ce, const at::Tensor& stats, const ClassShard& shard,
                                    const InputAgreement* agreement = nullptr);

// The public results of fused_logprobs_combine's rows, in `dtype` and `shape`, and what
// backward needs into `saved` (when given).
Logprobs logprobs_results(const FusedCrossEntropy& ce, const LogprobsRows& combined, at::ScalarType dtype,
                          c10::IntArrayRef shape, int64_t vocab_size, LogprobsSaved* saved);

// The results as Replicate DTensors on `mesh` (the DTensor entries' outputs).
Logprobs replicated_on(const DeviceMesh& mesh, Logprobs out);

// The kernel's per-row coefficients for incoming gradients of the log-probabilities and of
// the entropy ([M] each, or undefined for none), from forward's row_max, log_sum (in ce) and
// mean_difference (LogprobsRows; undefined when forward computed no entropy); ignored rows
// get none.
FusedCrossEntropyCoefficients fused_logprobs_coefficients(const FusedCrossEntropy& ce,
                                                          const at::Tensor& mean_difference,
                                                          const at::Tensor& grad_logprobs,
                                                          const at::Tensor& grad_entropy);

}  // namespace hyper_parallel
