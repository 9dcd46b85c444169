// vocab_parallel_nll_loss (vocab_parallel.h): nll_loss (K2) on this member's local
// log-probabilities and a communicator, its checks' verdict in the call's record (it has no
// statistics all-gather to carry it), and its backward (local, no collective).
#include <ATen/ATen.h>

#include <string>

#include "hyper_parallel/loss/vocab_parallel.h"
#include "loss/call/call_agreement.h"
#include "loss/call/loss_call_plan.h"
#include "loss/call/loss_input_checks.h"
#include "loss/call/vocab_pieces.h"
#include "loss/math/cross_entropy_kernels.h"

namespace hyper_parallel {

std::vector<at::Tensor> vocab_parallel_nll_loss_forward(const at::Tensor& local_logp, int64_t class_dim_in,
                                                        const at::Tensor& target,
                                                        const std::optional<at::Tensor>& weight, int64_t reduction,
                                                        int64_t ignore_index, const Communicator* comm,
                                                        int64_t vocab_size) {
  const std::string op = "vocab_parallel_nll_loss";
  const int64_t class_dim = logits_class_dim(local_logp, class_dim_in, op);
  c10::optional<at::Tensor> w;
  if (weight && weight->defined()) w = *weight;
  // The checks settle in the call's record (they need the vocabulary: an unknown one is learnt
  // first, one all-gather more): a refusal on one member is the same error on all.
  LossCallSteps steps;
  steps.verdict = CheckVerdict::in_record;
  steps.describe = [&](LossCallRecord& call, ClassLayout& layout) {
    record_logits(call, local_logp, class_dim);
    record_target(call, target, class_dim);
    call.definition.reduction = reduction;
    call.definition.ignore_index = ignore_index;
    if (w) call.class_weight = *w;
    record_guard_cross_entropy_options(call);
    layout = ClassLayout{comm, local_logp.size(class_dim), vocab_size, -1, local_logp.device()};
  };
  steps.replicated = target;
  steps.checks = [&](const ClassShard& shard) {
    check_no_target_or_weight_grad(target, w, op);
    check_nll_inputs(local_logp.sizes(), local_logp.scalar_type(), class_dim, target, w, shard.total, reduction,
                     ignore_index, op);
  };
  const ClassShard shard = LossCallPlan(op, steps).shard();
  auto result =
      distributed_nll_forward(to_rows(local_logp, class_dim), target.reshape({-1}), w, reduction, ignore_index, shard);
  at::Tensor out = reduction == at::Reduction::None ? result.first.reshape(target.sizes()) : result.first;
  return {out, result.second};
}

at::Tensor vocab_parallel_nll_loss_backward(const at::Tensor& grad_output, const at::Tensor& local_logp,
                                            int64_t class_dim_in, const at::Tensor& target,
                                            const std::optional<at::Tensor>& weight, int64_t reduction,
                                            int64_t ignore_index, const at::Tensor& total_weight,
                                            const Communicator* comm, int64_t vocab_size) {
  const int64_t class_dim = logits_class_dim(local_logp, class_dim_in, "vocab_parallel_nll_loss backward");
  const ClassShard shard = vocab_shard(comm, local_logp.size(class_dim), vocab_size);
  c10::optional<at::Tensor> w;
  if (weight && weight->defined()) w = *weight;
  const int64_t rows = to_rows(local_logp, class_dim).size(0);
  const at::Tensor g = nll_backward_rows(grad_output, rows, target.reshape({-1}), w, reduction, ignore_index,
                                         total_weight, local_logp.scalar_type(), shard);
  return from_rows(g, local_logp.sizes(), class_dim);
}

}  // namespace hyper_parallel
