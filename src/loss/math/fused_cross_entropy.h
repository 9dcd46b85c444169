// The fused, class-sharded cross-entropy (internal): one pass over the local logits and
// ONE all-gather of per-row statistics in forward, one pass and no collective in backward.
//
// Each rank computes per row: its local max m_p and sum_p exp(y - m_p), the target's y
// when it owns the target, and the sums label smoothing / probability targets need
// (y = x, or cap * tanh(x / cap) with soft-capping). After the all-gather every rank has
// all ranks' values and combines them the same way: lse = M + log sum_p s_p exp(m_p - M),
// with M and the log kept apart, and the loss formed as (M - y_t) + log, as ATen does.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include "hyper_parallel/loss/cross_entropy_definition.h"
#include "loss/call/call_agreement.h"
#include "loss/math/cross_entropy_kernels.h"
#include "loss/call/input_agreement.h"

namespace hyper_parallel {

// The gradient's per-row coefficients (ce_kernel::BackwardArgs' a, b, c, t_coef and e).
struct FusedCrossEntropyCoefficients {
  at::Tensor a, b, c, t;  // [M] compute type, or undefined (0)
  at::Tensor e;           // the entropy's, or undefined (0)
};

struct FusedCrossEntropy {
  // Inputs, kept for backward.
  at::Tensor x_rows;  // logits rows [M, C_l] (input dtype; a view of the local logits when possible)
  at::Tensor target;  // index targets [M] (int64), or probability rows [M, C_l]
  bool soft = false;
  c10::optional<at::Tensor> weight;   // full [C], compute type
  CrossEntropyDefinition definition;  // what is computed (the front end checked it)
  // The log-probabilities (fused_logprobs.h) use the same statistics: their logits divided by
  // a temperature (index targets, no smoothing), and with entropy_sum the entropy's numerator
  // in place of the smoothing sum. The max stays in the logits' units; the kernels divide each
  // difference from it by T (scaled_difference), never a logit itself.
  double temperature = 1.0;
  bool entropy_sum = false;
  // Write d loss / d x (for a unit incoming gradient) over x_rows during forward; backward
  // then only scales it. The caller checks that x_rows is the logits' own storage.
  bool gradient_in_forward = false;
  // Forward results, kept for backward ([M], compute type unless said).
  at::Tensor row_max, log_sum;               // lse = row_max + log_sum, kept apart (cross_entropy_cpu_kernel.h);
                                             // log_sum = log sum exp((y - row_max) / T)
  at::Tensor lse;                            // their sum, for the z-loss (at T = 1)
  at::Tensor row_weight;                     // index: w[t] (0 where ignored); soft: A = sum_c w_c q'_c
  at::Tensor valid;                          // 1 for counted rows, 0 for ignored ones
  at::Tensor target_col;                     // index: local column of an owned target, else -1 (int64)
  at::Tensor q;                              // soft: the probability rows in compute type, unit class stride
  at::Tensor ce_denominator, z_denominator;  // mean: what the sums are divided by
  at::Tensor grad_rows;                      // gradient_in_forward: the gradient written in forward
  // The CPU's combine (cross_entropy_combine.h) gives the coefficients for a unit incoming
  // gradient with the loss: gradient_in_forward writes the gradient from them.
  FusedCrossEntropyCoefficients unit_coefficients;
};

// Returns the loss (compute type): [M] for none, a scalar otherwise. One all-gather, which
// also carries `agreement`'s record (when given): it is settled before anything is combined,
// and a rank that refused its inputs computes no statistics (its target may be anything).
// `call` (when given) is settled after the local statistics and before their all-gather:
// its record's all-gather travels while they are computed.
at::Tensor fused_cross_entropy_forward(FusedCrossEntropy& ce, const ClassShard& shard,
                                       const InputAgreement* agreement = nullptr, PendingCallAgreement* call = nullptr);

// The same forward in steps, for callers that produce the logits a block at a time and
// never hold them whole (the fused linear + cross-entropy). x_rows stays unset.
// 1. Per-row target bookkeeping for `rows` rows (target_col, valid, row_weight; q).
void fused_cross_entropy_prepare(FusedCrossEntropy& ce, int64_t rows, const ClassShard& shard,
                                 const at::TensorOptions& compute_options);
// 2. Statistics [kStats, n] of logits block x = rows [r0, r0 + n), local classes
//    [c0, c0 + x.size(1)); blocks of the same rows merge with merge_block_stats.
at::Tensor fused_cross_entropy_block_stats(const FusedCrossEntropy& ce, const at::Tensor& x, int64_t r0, int64_t c0,
                                           const ClassShard& shard);
// acc <- the statistics of acc's columns and block's columns together (same rows), of `ce`.
void merge_block_stats(const FusedCrossEntropy& ce, at::Tensor& acc, const at::Tensor& block);
// 3. The one all-gather of the statistics [kStats, M] of this rank's classes, and the loss.
//    A null shard.comm means one rank (no collective).
//    `agreement` as in fused_cross_entropy_forward.
at::Tensor fused_cross_entropy_combine(FusedCrossEntropy& ce, const at::Tensor& stats, const ClassShard& shard,
                                       const InputAgreement* agreement = nullptr);

// Whether the gathered statistics `all` are combined by the raw-array kernels
// (cross_entropy_combine.h, which the framework-free library runs too): on the CPU, unless
// AtenStatisticsForTesting is held. Elsewhere the tensor ops below compute the same math.
bool combines_with_kernel(const at::Tensor& all);

// fused_cross_entropy_combine in parts, for the other losses built on these statistics
// (fused_logprobs.h): the one all-gather of every rank's statistics [P, kStats, M] (the
// agreement's record, when given, settled first), and the log-sum-exp of every row from them
// (sets ce.row_max, ce.log_sum and ce.lse; returns the sum of exps, exp(log_sum) unrounded).
at::Tensor all_gather_stats(const at::Tensor& stats, const ClassShard& shard, const InputAgreement* agreement);
at::Tensor combine_log_sum_exp(FusedCrossEntropy& ce, const at::Tensor& all);
// The entropy sum h (sum exp(d) d, d = (y - m) / T, of max m and sum s) relative to `shift`
// instead of m: exp(g) (h + g s), g = (m - shift) / T; 0 where m is -inf (nothing summed).
at::Tensor rebased_entropy_sum(const at::Tensor& h, const at::Tensor& s, const at::Tensor& m, const at::Tensor& shift,
                               double temperature);
// A difference of logits (y - max) in units of the temperature: divided by T after it is taken,
// so that it keeps its relative accuracy at any T (the difference itself, exactly, at T = 1).
at::Tensor scaled_difference(const at::Tensor& difference, double temperature);

// Backward in blocks: per-row coefficients for an incoming loss gradient (below), then the
// gradient of each logits block (`out` may be x itself). No collective.
FusedCrossEntropyCoefficients fused_cross_entropy_coefficients(const FusedCrossEntropy& ce, const at::Tensor& grad_loss,
                                                               const ClassShard& shard);
void fused_cross_entropy_block_gradient(const FusedCrossEntropy& ce, const FusedCrossEntropyCoefficients& co,
                                        const at::Tensor& x, const at::Tensor& out, int64_t r0, int64_t c0,
                                        const ClassShard& shard);
// Where the kernels run: a device's own kernel (the CPU's; CUDA's without a temperature or an
// entropy), else ATen ops. Tests run the ATen ops on the CPU with this guard held.
struct AtenStatisticsForTesting {
  AtenStatisticsForTesting();
  ~AtenStatisticsForTesting();
};

// The gradient rows for an incoming loss gradient ([M] for none, scalar otherwise). No
// collective. With gradient_in_forward the result is x_rows' storage, scaled in place.
at::Tensor fused_cross_entropy_backward(const FusedCrossEntropy& ce, const at::Tensor& grad_loss,
                                        const ClassShard& shard);

// A rank that refused its inputs (LossCallPlan's placeholders): index targets all ignore_index, no
// class weight, no gradient written, so that it joins the forward's collectives touching nothing.
void use_placeholder_inputs(FusedCrossEntropy& ce);

}  // namespace hyper_parallel
