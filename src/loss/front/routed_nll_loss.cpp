// The loss_parallel route's nll_loss forward kernel (routed_loss_kernels.h): nll_loss_forward
// and nll_loss2d_forward on class-sharded log-probs (K2), its checks' verdict in the call's
// record, and the global mean over rows that other mesh dims shard (its backward:
// routed_nll_loss_backward.cpp).
#include <ATen/ATen.h>
#include <ATen/core/Reduction.h>

#include <exception>
#include <string>

#include "dtensor/dtensor_impl.h"
#include "hyper_parallel/dtensor/dtensor.h"
#include "loss/call/call_agreement.h"
#include "loss/call/class_sharding.h"
#include "loss/call/loss_input_checks.h"
#include "loss/call/loss_call_plan.h"
#include "loss/math/cross_entropy_kernels.h"
#include "loss/front/routed_loss_kernels.h"

namespace hyper_parallel {

namespace {

at::Tensor replicated_dtensor(const at::Tensor& local, const DeviceMesh& mesh) {
  return make_dtensor(local, Layout(mesh, Placements(mesh.ndim(), Placement::replicate()), local.sizes().vec()));
}

// What nll_loss's 'mean' divides this rank's rows by (as ATen's total weight): the class
// weights of the counted targets, or their count without weights; in compute type `ct`.
at::Tensor nll_mean_denominator(const at::Tensor& target, const c10::optional<at::Tensor>& weight, int64_t ignore_index,
                                at::ScalarType ct) {
  const at::Tensor t = target.reshape({-1}).to(at::kLong);
  const at::Tensor counted = t.ne(ignore_index);
  if (!weight) return counted.sum().to(ct);
  const at::Tensor w = weight->to(ct).index_select(0, at::where(counted, t, at::zeros_like(t)));
  return at::where(counted, w, at::zeros_like(w)).sum();
}

}  // namespace

// nll_loss_forward / nll_loss2d_forward(self, target, weight, reduction, ignore_index): K2.
bool routed_nll_forward_kernel(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 5);
  at::Tensor self = args[0].toTensor();
  const int64_t class_dim = class_dim_of(self.dim());
  if (!is_class_sharded(self, class_dim)) return false;
  const std::string op = "nll_loss";
  ClassSharding cs = resolve_class_sharding(&self, class_dim, op, current_loss_parallel_options(),
                                            /*differentiable=*/false);
  const int64_t reduction = args[3].toInt();
  const int64_t ignore_index = args[4].toInt();
  const bool strict = effective_strict(current_loss_parallel_options());
  // 'mean' over rows other mesh dims shard (strict = false): the kernel sums, the sum is
  // divided by the global total weight (one small all-reduce per such mesh dim).
  const bool global_mean = reduction == at::Reduction::Mean && !cs.row_mesh_dims().empty();
  const Layout row_layout = cs.row_layout();
  const at::Tensor& local = local_of(self);
  at::Tensor target;
  c10::optional<at::Tensor> weight = optional_tensor(args[2]);
  // The checks settle in the call's record (one all-gather more): a refusal on one rank is
  // the same error on every rank, and every rank stays in step.
  LossCallSteps steps;
  steps.verdict = CheckVerdict::in_record;
  steps.describe = [&](LossCallRecord& call, ClassLayout& layout) {
    call = routed_call_record(op, local, class_dim, cs);
    record_target(call, args[1].toTensor(), class_dim);
    call.definition.reduction = reduction;
    call.definition.ignore_index = ignore_index;
    layout = placed_layout(cs.shard, local.device());
  };
  steps.replicated = args[1].toTensor();
  steps.checks = [&](const ClassShard& shard) {
    // Among the checks: a rank whose strictness refuses alone is named in the record.
    check_mean_on_mesh(cs, reduction, op, strict);
    target = laid_out_local(args[1].toTensor(), row_layout.placements(), row_layout.shape(), "target", op, cs, strict);
    if (weight) weight = replicated_value(*weight, "class weight", op);
    // This rank's rows: the local log-probs' shape (the global one where no other mesh dim shards them).
    check_nll_inputs(local.sizes(), local.scalar_type(), class_dim, target, weight, shard.total, reduction,
                     ignore_index, op);
  };
  steps.placeholders = [&] { weight = c10::nullopt; };
  steps.after_checks = [&](LossCallRecord& call, ClassLayout&) {
    if (weight) call.class_weight = *weight;
  };
  LossCallPlan call(op, steps);
  std::pair<at::Tensor, at::Tensor> result;
  std::exception_ptr refused_here;  // the global mean tells the other row groups before raising it
  try {
    call.settle();
    result = distributed_nll_forward(to_rows(local, class_dim), target.reshape({-1}), weight,
                                     global_mean ? int64_t{at::Reduction::Sum} : reduction, ignore_index, cs.shard);
  } catch (...) {
    if (!global_mean) throw;
    refused_here = std::current_exception();
  }
  const DeviceMesh& mesh = cs.layout.mesh();
  at::Tensor out, total_weight;
  if (reduction == at::Reduction::None) {
    out = make_dtensor(result.first.reshape(target.sizes()), row_layout);
    total_weight = replicated_dtensor(result.second, mesh);
  } else if (global_mean) {
    // The total weight handed to backward is the global one: its mean gradient divides by it.
    const at::ScalarType ct = compute_type(local.scalar_type());
    const at::Tensor total =
        global_mean_denominator(refused_here ? at::Tensor() : nll_mean_denominator(target, weight, ignore_index, ct),
                                local.options().dtype(ct), cs, refused_here, op);
    out = make_dtensor((result.first.to(ct) / total).to(local.scalar_type()), Layout(mesh, cs.sum_placements(), {}));
    total_weight = replicated_dtensor(total.to(local.scalar_type()), mesh);
  } else {
    // As PyTorch 2.15: each rank reduced its rows, Partial(sum) over the mesh dims sharding them.
    out = make_dtensor(result.first, Layout(mesh, cs.sum_placements(), {}));
    total_weight = make_dtensor(result.second, Layout(mesh, cs.sum_placements(), {}));
  }
  torch::jit::drop(*stack, 5);
  stack->push_back(out);
  stack->push_back(total_weight);
  return true;
}

}  // namespace hyper_parallel
