// The fused cross_entropy of loss_parallel (its autograd node: cross_entropy_parallel_backward.h).
#include <ATen/ATen.h>
#include <ATen/core/Reduction.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/saved_variable.h>

#include "compat/autograd_compat.h"
#include "dtensor/dtensor_impl.h"
#include "hyper_parallel/dtensor/dtensor.h"
#include "loss/call/call_agreement.h"
#include "loss/call/loss_call_plan.h"
#include "loss/call/class_sharding.h"
#include "loss/math/cross_entropy_kernels.h"
#include "loss/math/fused_cross_entropy.h"
#include "loss/call/input_agreement.h"
#include "loss/math/logits_device.h"
#include "loss/call/loss_input_checks.h"
#include "loss/front/cross_entropy_parallel_backward.h"
#include "loss/front/loss_parallel_dispatch.h"

namespace hyper_parallel {

namespace {

// Probability targets, laid out as the logits (or replicated: cut here): this rank's piece, as rows.
at::Tensor soft_target_rows(const at::Tensor& target, const ClassSharding& cs, const std::string& op, bool strict) {
  return to_rows(
      laid_out_local(target, cs.layout.placements(), cs.layout.shape(), "probability target", op, cs, strict),
      cs.class_dim);
}

// A replicated target or weight must live on the logits' mesh (or be a plain tensor).
void check_on_logits_mesh(const at::Tensor& t, const ClassSharding& cs, const std::string& what,
                          const std::string& op) {
  if (auto* impl = dtensor_impl(t)) {
    TORCH_CHECK(impl->layout().mesh() == cs.layout.mesh(), op, " under loss_parallel: expected the ", what,
                " on the logits' mesh ", cs.layout.mesh().str(), " (or a plain tensor), got one on ",
                impl->layout().mesh().str());
  }
}

// The device of a plain tensor, or of a DTensor's local piece.
c10::Device local_device(const at::Tensor& t) {
  auto* impl = dtensor_impl(t);
  return impl ? impl->local().device() : t.device();
}

}  // namespace

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
  // The rows' shape: the logits' without the class dim, global and this rank's.
  const Layout row_layout = cs.row_layout();
  const std::vector<int64_t>& rows_shape = row_layout.shape();
  std::vector<int64_t> loss_shape = row_layout.local_shape();
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
  steps.checks = [&](const ClassShard& shard) {
    // What strictness and the options refuse, among the checks: a rank that refuses alone
    // (its strictness or z-loss differ) is named in the record, not left raising while the
    // others wait in a collective.
    check_mean_on_mesh(cs, reduction, op, strict);
    if (global_mean && options.z_loss_weight != 0) {
      throw LossParallelUnsupportedError(
          op + " under loss_parallel(z_loss_weight = " + std::to_string(options.z_loss_weight) +
          "): reduction 'mean' on a mesh whose other dims shard the rows (" + to_string(cs.layout.placements()) +
          " on " + cs.layout.mesh().str() +
          ") is not supported: the z-loss divides by another count than the cross-entropy. Use reduction 'sum' or "
          "'none'");
    }
    // PyTorch's cross_entropy raises RuntimeError for a bad option: so does this route.
    check_cross_entropy_definition(ce.definition, op, OptionErrorKind::runtime_error);
    check_on_logits_mesh(target, cs, "target", op);
    check_on_logits_device(local_logits.device(), local_device(target), ce.soft ? "probability target" : "target", op);
    if (weight && weight->defined()) {
      check_on_logits_mesh(*weight, cs, "class weight", op);
      check_on_logits_device(local_logits.device(), local_device(*weight), "class weight", op);
      at::Tensor w = replicated_value(*weight, "class weight", op);
      check_class_weight(w, shard.total, local_logits.scalar_type(), "logits", op, OptionErrorKind::runtime_error);
      ce.weight = w.to(ct);
    }
    if (ce.soft) {
      check_probability_target_ignore_index(ignore_index, op);
      ce.target = soft_target_rows(target, cs, op, strict);
    } else {
      at::Tensor t = laid_out_local(target, cs.row_placements(), rows_shape, "target", op, cs, strict);
      check_index_target_dtype(t, op, OptionErrorKind::runtime_error);
      // This rank's rows (the whole target where no other mesh dim shards them).
      TORCH_CHECK(t.sizes() == c10::IntArrayRef(loss_shape), op, ": expected a target of shape ",
                  c10::IntArrayRef(rows_shape), " for logits of shape ", c10::IntArrayRef(cs.layout.shape()), ", got ",
                  t.sizes());
      check_targets(t, shard.total, ignore_index);
      ce.target = t.reshape({-1}).to(at::kLong);
    }
  };
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
  if (wants_grad) {
    compat::NodePtr owner = compat::make_node<CrossEntropyParallelBackward>();
    auto* node = static_cast<CrossEntropyParallelBackward*>(owner.get());
    node->ce = std::move(ce);
    node->sharding = cs;
    node->mean_scale = mean_scale;
    node->local_shape = local_logits.sizes().vec();
    if (node->ce.gradient_in_forward) node->grad_version = node->ce.grad_rows._version();
    if (!node->ce.gradient_in_forward) node->saved_logits = torch::autograd::SavedVariable(logits, /*is_output=*/false);
    node->set_next_edges(torch::autograd::collect_next_edges(logits));
    torch::autograd::create_gradient_edge(out, std::move(owner));
  }
  return out;
}

}  // namespace hyper_parallel
