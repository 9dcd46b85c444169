// Per-token log-probabilities and entropy at a temperature from the fused cross-entropy's
// statistics (internal; the public functions are vocab_logprobs.h's). With y = x / T:
//   each rank, per row:  m_p = max y, s_p = sum exp(y - m_p), h_p = sum exp(y - m_p) (y - m_p),
//                        y_t when it owns the target (ce.temperature, ce.entropy_sum)
//   after the forward's one all-gather, on every rank alike:
//                        M = max m_p, S = sum s_p exp(m_p - M), L = log S (as the cross-entropy)
//                        log p_t = -((M - y_t) + L), the cross-entropy's -loss bit for bit
//                        H = L - W / S, W = sum exp(m_p - M) (h_p + (m_p - M) s_p)
//   L and -W / S are both >= 0, so H never cancels, even for a nearly one-hot row.
// Backward, no collective: with p_j = exp(y_j - M - L),
//   d/dx_j = (1/T) (g_lp ([j = t] - p_j) - g_H p_j (log p_j + H)).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "hyper_parallel/vocab_logprobs.h"

#include "loss/call_agreement.h"
#include "loss/class_sharding.h"
#include "loss/fused_cross_entropy.h"
#include "loss/input_agreement.h"

namespace hyper_parallel {

// The record agree_on_call compares for a log-probabilities call of `op`: `rows` of `dtype`,
// this rank's `local_classes` of `vocab_size`, the options.
LossCallRecord logprobs_call(const std::string& op, int64_t rows, at::ScalarType dtype, int64_t local_classes,
                             int64_t vocab_size, const LogprobsOptions& options);

// The options' ranges (temperature finite and > 0, block sizes >= 0), naming `op`.
void check_logprobs_options(const LogprobsOptions& options, const std::string& op);
// The sampled tokens as the kernels take them ([rows] int64), after PyTorch's checks for
// class indices: Long or Byte, of shape `shape`, in [0, vocab) or ignore_index, no gradient.
// Probability targets are refused (LossParallelUnsupportedError).
at::Tensor logprobs_target(const at::Tensor& target, c10::IntArrayRef shape, int64_t vocab, int64_t ignore_index,
                           const std::string& op);

// {log-probabilities, entropy} ([M], compute type; the entropy undefined without
// ce.entropy_sum; ignored rows 0) from this rank's statistics [kStats, M], after the one
// all-gather (carrying `agreement`'s record when given). Sets ce.row_max and ce.log_sum.
std::pair<at::Tensor, at::Tensor> fused_logprobs_combine(FusedCrossEntropy& ce, const at::Tensor& stats,
                                                         const ClassShard& shard,
                                                         const InputAgreement* agreement = nullptr);

// The public results of fused_logprobs_combine's {log-probabilities, entropy}, in `dtype`
// and `shape`, and what backward needs into `saved` (when given).
Logprobs logprobs_results(const FusedCrossEntropy& ce, const std::pair<at::Tensor, at::Tensor>& combined,
                          at::ScalarType dtype, c10::IntArrayRef shape, int64_t vocab_size, LogprobsSaved* saved);

// The results as Replicate DTensors on `mesh` (the DTensor entries' outputs).
Logprobs replicated_on(const DeviceMesh& mesh, Logprobs out);

// The kernel's per-row coefficients for incoming gradients of the log-probabilities and of
// the entropy ([M] each, or undefined for none), from forward's row_max, log_sum (in ce) and
// entropy; ignored rows get none.
FusedCrossEntropyCoefficients fused_logprobs_coefficients(const FusedCrossEntropy& ce, const at::Tensor& entropy,
                                                          const at::Tensor& grad_logprobs,
                                                          const at::Tensor& grad_entropy);

}  // namespace hyper_parallel
