// vocab_parallel_linear_cross_entropy (vocab_parallel.h): the fused linear cross-entropy on
// plain local pieces and a communicator (hidden and target the same on every member, this
// member's torch.chunk rows of the head), forward through LossCallPlan and backward from
// forward's saved statistics (one all-reduce, of hidden's gradient). The passes:
// fused_linear_pass.h.
#include <ATen/ATen.h>

#include <string>
#include <tuple>
#include <vector>

#include "hyper_parallel/loss/vocab_parallel.h"
#include "loss/call/loss_call_plan.h"
#include "loss/call/vocab_pieces.h"
#include "loss/front/fused_linear_inputs.h"
#include "loss/front/fused_linear_pass.h"
#include "loss/math/cross_entropy_kernels.h"

namespace hyper_parallel {

at::Tensor vocab_parallel_linear_cross_entropy_forward(const at::Tensor& hidden, const at::Tensor& local_weight,
                                                       const at::Tensor& target, const Communicator* comm,
                                                       int64_t vocab_size,
                                                       const FusedLinearCrossEntropyOptions& options,
                                                       VocabCrossEntropySaved* saved) {
  const std::string op = "vocab_parallel_linear_cross_entropy";
  const at::Tensor class_weight =
      options.class_weight && options.class_weight->defined() ? *options.class_weight : at::Tensor();
  const int64_t local_classes = local_weight.dim() == 2 ? local_weight.size(0) : 0;
  LinearLossInputs in;
  LossCallSteps steps;
  steps.describe = [&](LossCallRecord& call, ClassLayout& layout) {
    call = linear_call_record(op, hidden, target, options, class_weight);
    layout = ClassLayout{comm, local_classes, vocab_size, -1, hidden.device()};
  };
  steps.replicated = target;
  steps.checks = [&](const ClassShard& piece) { in = local_inputs(hidden, local_weight, target, options, piece); };
  steps.placeholders = [&] {
    in = LinearLossInputs{};
    std::tie(in.h, in.w, in.target) = linear_placeholders(hidden, local_weight, options.ignore_index);
  };
  LossCallPlan call(op, steps);
  in.shard = call.shard();
  const at::ScalarType dt = in.h.scalar_type();
  FusedCrossEntropy ce = linear_cross_entropy_settings(in, options);
  at::Tensor loss;
  {
    at::NoGradGuard no_grad;  // the caller owns the graph
    loss = linear_cross_entropy_forward(ce, in, linear_cross_entropy_blocks(options, in), call).to(dt);
  }
  if (saved) {
    saved->row_max = ce.row_max;
    saved->log_sum = ce.log_sum;
    saved->row_weight = at::Tensor();
    saved->vocab_size = call.shard().total;
  }
  return loss;
}

std::vector<at::Tensor> vocab_parallel_linear_cross_entropy_backward(
    const at::Tensor& grad_loss, const at::Tensor& hidden, const at::Tensor& local_weight, const at::Tensor& target,
    const VocabCrossEntropySaved& saved, const Communicator* comm, int64_t vocab_size,
    const FusedLinearCrossEntropyOptions& options, bool hidden_grad, bool weight_grad) {
  LinearLossInputs in;
  in.shard = backward_class_shard(comm, vocab_size, "vocab_parallel_linear_cross_entropy backward");
  in.h = hidden;
  in.w = local_weight;
  in.target = target.to(at::kLong);
  const at::ScalarType ct = compute_type(hidden.scalar_type());
  if (options.class_weight && options.class_weight->defined()) in.class_weight = options.class_weight->to(ct);
  FusedCrossEntropy ce = linear_cross_entropy_settings(in, options);
  fused_cross_entropy_prepare(ce, hidden.size(0), in.shard, hidden.options().dtype(ct));
  // What fused_cross_entropy_combine set, from forward's saved values (index targets only).
  ce.row_max = saved.row_max;
  ce.log_sum = saved.log_sum;
  ce.lse = saved.row_max + saved.log_sum;
  ce.ce_denominator = ce.row_weight.sum();
  ce.z_denominator = ce.valid.sum();
  at::NoGradGuard no_grad;
  auto [gh, gw] = linear_cross_entropy_backward(ce, in, linear_cross_entropy_blocks(options, in), grad_loss,
                                                hidden_grad, weight_grad);
  return {gh, gw};
}

}  // namespace hyper_parallel
