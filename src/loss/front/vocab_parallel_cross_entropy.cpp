// vocab_parallel_cross_entropy's forward (vocab_parallel.h): the fused cross-entropy on this
// member's local logits and a communicator, through LossCallPlan (its backward:
// vocab_parallel_cross_entropy_backward.cpp).
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <string>

#include "hyper_parallel/loss/vocab_parallel.h"
#include "loss/call/call_agreement.h"
#include "loss/call/loss_call_plan.h"
#include "loss/call/loss_input_checks.h"
#include "loss/math/cross_entropy_kernels.h"
#include "loss/math/fused_cross_entropy.h"
#include "loss/math/logits_device.h"

namespace hyper_parallel {

at::Tensor vocab_parallel_cross_entropy_forward(const at::Tensor& local_logits, int64_t class_dim_in,
                                                const at::Tensor& target, const std::optional<at::Tensor>& weight,
                                                const Communicator* comm, int64_t vocab_size,
                                                const VocabCrossEntropyOptions& options,
                                                VocabCrossEntropySaved* saved) {
  const std::string op = "vocab_parallel_cross_entropy";
  const int64_t class_dim = logits_class_dim(local_logits, class_dim_in, op);
  const at::ScalarType ct = compute_type(local_logits.scalar_type());
  FusedCrossEntropy ce;
  ce.x_rows = to_rows(local_logits, class_dim);
  ce.definition = options;
  ce.soft = target.is_floating_point();
  ce.gradient_in_forward = options.gradient_in_forward && ce.x_rows.is_alias_of(local_logits) &&
                           (ce.x_rows.size(1) <= 1 || ce.x_rows.stride(1) == 1) &&
                           local_logits.is_non_overlapping_and_dense();
  std::vector<int64_t> loss_shape = local_logits.sizes().vec();
  loss_shape.erase(loss_shape.begin() + class_dim);
  LossCallSteps steps;
  steps.describe = [&](LossCallRecord& call, ClassLayout& layout) {
    record_logits(call, local_logits, class_dim);
    record_target(call, target, class_dim);
    call.definition = options;
    call.gradient_in_forward = options.gradient_in_forward;
    if (weight && weight->defined()) call.class_weight = *weight;
    layout = ClassLayout{comm, local_logits.size(class_dim), vocab_size, -1, local_logits.device()};
  };
  // Probability targets are this member's piece, which differs between members.
  steps.replicated = ce.soft ? at::Tensor() : target;
  steps.checks = [&](const ClassShard& shard) {
    check_cross_entropy_definition(options, op, OptionErrorKind::value_error);
    TORCH_CHECK_VALUE(local_logits.is_floating_point(), op, ": expected floating-point logits, got ",
                      local_logits.scalar_type());
    check_no_target_or_weight_grad(target, weight, op);
    check_on_logits_device(local_logits.device(), target.device(), ce.soft ? "probability target" : "target", op);
    if (weight && weight->defined()) {
      check_on_logits_device(local_logits.device(), weight->device(), "class weight", op);
      check_class_weight(*weight, shard.total, local_logits.scalar_type(), "logits", op, OptionErrorKind::value_error);
      ce.weight = weight->to(ct);
    }
    if (ce.soft) {
      TORCH_CHECK_VALUE(target.sizes() == local_logits.sizes(), op,
                        ": probability targets must have the local logits' shape ", local_logits.sizes(),
                        " (this member's classes), got ", target.sizes());
      check_probability_target_ignore_index(options.ignore_index, op);
      ce.target = to_rows(target, class_dim);
    } else {
      check_index_target_dtype(target, op, OptionErrorKind::value_error);
      TORCH_CHECK_VALUE(target.sizes() == c10::IntArrayRef(loss_shape), op, ": expected a target of shape ",
                        c10::IntArrayRef(loss_shape), " for local logits of shape ", local_logits.sizes(),
                        " (class dim ", class_dim, "), got ", target.sizes());
      check_targets(target, shard.total, options.ignore_index);
      ce.target = target.reshape({-1}).to(at::kLong);
    }
  };
  steps.placeholders = [&] { use_placeholder_inputs(ce); };
  LossCallPlan call(op, steps);
  at::Tensor loss = fused_cross_entropy_forward(ce, call.shard(), call.inputs(), call.agreement());
  loss = loss.to(local_logits.scalar_type());
  if (options.reduction == at::Reduction::None) loss = loss.reshape(loss_shape);
  if (saved) {
    saved->row_max = ce.row_max;
    saved->log_sum = ce.log_sum;
    saved->row_weight = ce.soft ? ce.row_weight : at::Tensor();
    saved->grad_rows = ce.grad_rows;
    saved->vocab_size = call.shard().total;
    saved->mean_denominator = ce.ce_denominator;
  }
  return loss;
}

}  // namespace hyper_parallel
