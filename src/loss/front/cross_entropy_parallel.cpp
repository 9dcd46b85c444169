// cross_entropy_parallel (loss_parallel_dispatch.h): loss_parallel's fused, exact cross_entropy
// on class-sharded DTensor logits, through LossCallPlan (its input checks:
// cross_entropy_parallel_inputs.h; its autograd node: cross_entropy_parallel_backward.h), with
// the global mean over rows that other mesh dims shard.
#include <ATen/ATen.h>
#include <ATen/core/Reduction.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

#include <exception>
#include <string>
#include <vector>

#include "dtensor/dtensor_impl.h"
#include "hyper_parallel/dtensor/dtensor.h"
#include "loss/call/call_agreement.h"
#include "loss/call/class_sharding.h"
#include "loss/call/loss_call_plan.h"
#include "loss/call/loss_input_checks.h"
#include "loss/front/cross_entropy_parallel_backward.h"
#include "loss/front/cross_entropy_parallel_inputs.h"
#include "loss/front/loss_parallel_dispatch.h"
#include "loss/math/cross_entropy_kernels.h"
#include "loss/math/fused_cross_entropy.h"

namespace hyper_parallel {

at::Tensor cross_entropy_parallel(const at::Tensor& logits_in, const at::Tensor& target,
                                  const c10::optional<at::Tensor>& weight, int64_t reduction, int64_t ignore_index,
                                  double label_smoothing) {
  const std::string op = "cross_entropy";
  at::Tensor logits = logits_in;
  const int64_t class_dim = class_dim_of(logits.dim());
  ClassSharding cs = resolve_class_sharding(&logits, class_dim, op, current_loss_parallel_options(),
                                            /*differentiable=*/true);
  check_no_target_or_weight_grad(target, weight, loss_call_site(op));
  const at::Tensor& local_logits = local_of(logits);
  const at::ScalarType ct = compute_type(local_logits.scalar_type());
  FusedCrossEntropy ce;
  ce.x_rows = to_rows(local_logits, class_dim);
  const LossParallelOptions options = current_loss_parallel_options();
  const bool strict = effective_strict(options);
  // 'mean' over rows that other mesh dims shard: the kernel sums, the sum is divided by the
  // global denominator below (one small all-reduce per such mesh dim).
  const bool global_mean = reduction == at::Reduction::Mean && !cs.row_mesh_dims().empty();
  // The call gives three fields of the definition, the guard the terms.
  ce.definition = CrossEntropyDefinition{static_cast<const LossTerms&>(options), ignore_index,
                                         global_mean ? int64_t{at::Reduction::Sum} : reduction, label_smoothing};
  const bool wants_grad = torch::autograd::GradMode::is_enabled() && logits.requires_grad();
  // Writing the gradient over the logits needs their storage as plain rows, and logits
  // that are neither a leaf nor a view of one: a leaf's values are the caller's (PyTorch
  // refuses in-place writes to them when they require grad), and its .grad would alias them.
  const bool leaf_values = logits.is_leaf() || (logits.is_view() && logits._base().is_leaf());
  ce.gradient_in_forward =
      options.gradient_in_forward && wants_grad && !leaf_values && ce.x_rows.is_alias_of(local_logits) &&
      (ce.x_rows.size(1) <= 1 || ce.x_rows.stride(1) == 1) && local_logits.is_non_overlapping_and_dense();
  // The rows' layout: the logits' without the class dim (this rank's shape: loss_shape).
  const Layout row_layout = cs.row_layout();
  const std::vector<int64_t> loss_shape = row_layout.local_shape();
  ce.soft = target.is_floating_point();
  LossCallSteps steps;
  // The call's record before the statistics' all-gather, which is sized by rows: ranks whose
  // rows, dtype, vocabulary or options differ are named.
  steps.describe = [&](LossCallRecord& call, ClassLayout& layout) {
    record_logits(call, local_logits, class_dim);
    record_target(call, target, class_dim);
    record_context(call);
    call.definition = ce.definition;
    call.gradient_in_forward = options.gradient_in_forward;
    if (weight && weight->defined()) call.class_weight = dtensor_impl(*weight) ? local_of(*weight) : *weight;
    layout = placed_layout(cs.shard, local_logits.device());
  };
  steps.replicated = target;
  const CrossEntropyParallelCall resolved{
      cs, local_logits, target, weight, row_layout, reduction, strict, global_mean, options.z_loss_weight};
  steps.checks = [&](const ClassShard& shard) { check_cross_entropy_parallel_inputs(resolved, shard, ce); };
  steps.placeholders = [&] { use_placeholder_inputs(ce); };
  LossCallPlan call(op, steps);
  const ClassShard& shard = cs.shard;
  at::Tensor loss;
  std::exception_ptr refused_here;  // the global mean tells the other row groups before raising it
  try {
    loss = fused_cross_entropy_forward(ce, shard, call.inputs(), call.agreement());
  } catch (...) {
    if (!global_mean) throw;
    refused_here = std::current_exception();
  }
  at::Tensor mean_scale;
  if (global_mean) {
    const at::Tensor total =
        global_mean_denominator(ce.ce_denominator, ce.x_rows.options().dtype(ct), cs, refused_here, op);
    loss = loss / total;
    mean_scale = total.reciprocal();
  }
  loss = loss.to(local_logits.scalar_type());
  // As PyTorch 2.15 lays the loss out: per row as the target; reduced, Partial(sum) over the
  // mesh dims that shard the rows (each rank reduced its own), Replicate elsewhere.
  at::Tensor out = reduction == at::Reduction::None
                       ? make_dtensor(loss.reshape(loss_shape), row_layout)
                       : make_dtensor(loss, Layout(cs.layout.mesh(), cs.sum_placements(), {}));
  if (ce.gradient_in_forward) {
    // The logits now hold the gradient: any other saved user of them must raise.
    torch::autograd::impl::bump_version(local_logits);
    if (!local_logits.is_same(logits)) torch::autograd::impl::bump_version(logits);
  }
  if (wants_grad) attach_cross_entropy_parallel_backward(out, logits, std::move(ce), cs, mean_scale);
  return out;
}

}  // namespace hyper_parallel
