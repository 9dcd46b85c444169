// vocab_parallel_cross_entropy's backward (vocab_parallel.h): the gradient with respect to
// this member's local logits, from forward's saved per-row values and no collective (or the
// gradient forward already wrote over the logits, scaled where it is).
#include <ATen/ATen.h>

#include <string>

#include "hyper_parallel/loss/vocab_parallel.h"
#include "loss/call/loss_input_checks.h"
#include "loss/call/vocab_pieces.h"
#include "loss/math/cross_entropy_kernels.h"
#include "loss/math/fused_cross_entropy.h"

namespace hyper_parallel {

at::Tensor vocab_parallel_cross_entropy_backward(const at::Tensor& grad_loss, const at::Tensor& local_logits,
                                                 int64_t class_dim_in, const at::Tensor& target,
                                                 const std::optional<at::Tensor>& weight,
                                                 const VocabCrossEntropySaved& saved, const Communicator* comm,
                                                 int64_t vocab_size, const VocabCrossEntropyOptions& options) {
  const std::string op = "vocab_parallel_cross_entropy backward";
  const int64_t class_dim = logits_class_dim(local_logits, class_dim_in, op);
  const ClassShard shard = backward_class_shard(comm, vocab_size, op);
  const at::ScalarType ct = compute_type(local_logits.scalar_type());
  if (saved.grad_rows.defined()) {
    // Forward wrote the gradient for a unit incoming gradient: scale it where it is.
    FusedCrossEntropy written;
    written.x_rows = saved.grad_rows;
    written.grad_rows = saved.grad_rows;
    written.definition.reduction = options.reduction;
    return from_rows(fused_cross_entropy_backward(written, grad_loss, shard), local_logits.sizes(), class_dim);
  }
  FusedCrossEntropy ce;
  ce.x_rows = to_rows(local_logits, class_dim);
  ce.definition = options;
  ce.soft = target.is_floating_point();
  ce.target = ce.soft ? to_rows(target, class_dim) : target.reshape({-1}).to(at::kLong);
  if (weight && weight->defined()) ce.weight = weight->to(ct);
  const int64_t rows = ce.x_rows.size(0);
  const auto opts = local_logits.options().dtype(ct);
  fused_cross_entropy_prepare(ce, rows, shard, opts);
  // What fused_cross_entropy_combine set, rebuilt from forward's saved values.
  ce.row_max = saved.row_max;
  ce.log_sum = saved.log_sum;
  ce.lse = saved.row_max + saved.log_sum;
  if (ce.soft) {
    ce.row_weight = saved.row_weight;
    ce.ce_denominator = at::scalar_tensor(static_cast<double>(rows), opts);
    ce.z_denominator = ce.ce_denominator;
  } else {
    ce.ce_denominator = ce.row_weight.sum();
    ce.z_denominator = ce.valid.sum();
  }
  const at::Tensor grad_rows = fused_cross_entropy_backward(ce, grad_loss, shard);
  return from_rows(grad_rows, local_logits.sizes(), class_dim);
}

}  // namespace hyper_parallel
