// The loss_parallel kernels on local pieces (internal). Inputs are "rows": the local
// logits with the class dim moved last and the rest flattened, [M, C_local]; targets
// and weights are replicated, so only the class-dim reductions need communication.
//
//   K1  distributed_log_softmax         all-reduce MAX + all-reduce SUM
//   K2  distributed_nll_forward         one all-reduce (the picked log-probs)
// plus the log_softmax backward for any consumer (one all-reduce). The fused
// cross-entropy (K3: one all-gather forward, nothing backward) is fused_cross_entropy.h.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <string>

#include "hyper_parallel/core/communicator.h"
#include "loss/call/class_sharding.h"

namespace hyper_parallel {

// float for half/bfloat16, the type itself otherwise: what the kernels compute in.
at::ScalarType compute_type(at::ScalarType t);

// [.., C_l (at class_dim), ..] <-> [M, C_l]. to_rows is a view when it can be.
at::Tensor to_rows(const at::Tensor& x, int64_t class_dim);
at::Tensor from_rows(const at::Tensor& rows, c10::IntArrayRef shape, int64_t class_dim);

// log(sum_c exp(x_c)) over all classes of every row, in compute_type, as two [M] parts:
// lse = max + log_sum. Kept apart so that x - max is formed first, exact near the max, as
// ATen's log_softmax does; the rounded sum would carry its rounding (1e-3 at 3e4 in float)
// into every log-probability.
struct LogSumExp {
  at::Tensor max;      // the row max (0 for rows that are all -inf)
  at::Tensor log_sum;  // log sum_c exp(x_c - max)
};
LogSumExp distributed_logsumexp(const at::Tensor& x_rows, const ClassShard& shard);
// K1: the log-softmax rows, in compute_type.
at::Tensor distributed_log_softmax(const at::Tensor& x_rows, const ClassShard& shard);
// d/dx of log_softmax for an arbitrary incoming gradient: g - exp(out) * sum_c g.
at::Tensor distributed_log_softmax_backward(const at::Tensor& grad_rows, const at::Tensor& out_rows,
                                            const ClassShard& shard);

// K2: nll_loss_forward on log-prob rows. Returns (output, total_weight) as ATen's.
std::pair<at::Tensor, at::Tensor> distributed_nll_forward(const at::Tensor& logp_rows, const at::Tensor& target,
                                                          const c10::optional<at::Tensor>& weight, int64_t reduction,
                                                          int64_t ignore_index, const ClassShard& shard);
// nll_loss_backward: the gradient rows, nonzero only at owned targets. No collective.
at::Tensor nll_backward_rows(const at::Tensor& grad_output, int64_t rows, const at::Tensor& target,
                             const c10::optional<at::Tensor>& weight, int64_t reduction, int64_t ignore_index,
                             const at::Tensor& total_weight, at::ScalarType dtype, const ClassShard& shard);

}  // namespace hyper_parallel
