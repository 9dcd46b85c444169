// routed_loss_kernels.h: the loss_parallel route's per-op kernels (K1, K2 and their backwards).
#include "loss/front/routed_loss_kernels.h"

#include <ATen/ATen.h>
#include <ATen/core/Reduction.h>
#include <c10/util/Exception.h>

#include "dtensor/dtensor_impl.h"
#include "hyper_parallel/dtensor/dtensor.h"
#include "loss/call/call_agreement.h"
#include "loss/call/class_sharding.h"
#include "loss/call/loss_call_plan.h"
#include "loss/call/loss_input_checks.h"
#include "loss/math/cross_entropy_kernels.h"

namespace hyper_parallel {

// For a loss on class-sharded `logits` outside loss_parallel(): the call's record, as the ranks
// inside it would make it but for the context, over the group sharding the classes.
void agree_outside_context(const at::Tensor& logits, int64_t class_dim, const std::string& op) {
  const auto* impl = dtensor_impl(logits);
  const Layout& layout = impl->layout();
  const auto dims = layout.mesh_dims_sharding(class_dim);
  LossCallRecord call;
  call.op = op;
  record_logits(call, impl->local(), class_dim);
  record_context(call);  // outside
  call.vocab_size = layout.shape()[class_dim];
  agree_on_call(call, &layout.mesh().comm(dims.back()), impl->local().device());
}

c10::optional<at::Tensor> optional_tensor(const c10::IValue& v) {
  if (v.isNone()) return c10::nullopt;
  const at::Tensor& t = v.toTensor();
  return t.defined() ? c10::optional<at::Tensor>(t) : c10::nullopt;
}

namespace {

// A backward input: the sharding its forward had (no option checks: forward did them).
ClassSharding sharding_for_backward(const at::Tensor& t, int64_t class_dim, const std::string& op) {
  at::Tensor copy = t;
  LossParallelOptions lenient;
  lenient.strict = false;
  return resolve_class_sharding(&copy, class_dim, op, lenient, /*differentiable=*/false);
}

at::Tensor replicated_dtensor(const at::Tensor& local, const DeviceMesh& mesh) {
  return make_dtensor(local, Layout(mesh, Placements(mesh.ndim(), Placement::replicate()), local.sizes().vec()));
}

// The record agree_on_call compares for a routed op on class-sharded `local` (with the
// guard's cross-entropy-only options, so that a guard that differs between ranks is named
// rather than refused on some ranks only).
LossCallRecord routed_call(const std::string& op, const at::Tensor& local, int64_t class_dim, const ClassSharding& cs) {
  LossCallRecord call;
  call.op = op;
  record_logits(call, local, class_dim);
  call.vocab_size = cs.shard.total;
  call.local_classes = cs.shard.local;
  record_context(call);
  record_guard_cross_entropy_options(call);
  return call;
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

// _log_softmax(self, dim, half_to_float): K1.
bool log_softmax_kernel(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 3);
  at::Tensor self = args[0].toTensor();
  const int64_t dim = c10::maybe_wrap_dim(args[1].toInt(), self.dim());
  const bool half_to_float = args[2].toBool();
  if (!is_class_sharded(self, dim)) return false;
  ClassSharding cs = resolve_class_sharding(&self, dim, "log_softmax", current_loss_parallel_options(),
                                            /*differentiable=*/false);
  const at::Tensor& local = local_of(self);
  // The call's record before the all-reduces sized by rows (one all-gather more).
  agree_on_loss_call(routed_call("log_softmax", local, dim, cs), placed_layout(cs.shard, local.device()));
  at::Tensor rows = distributed_log_softmax(to_rows(local, dim), cs.shard);
  const at::ScalarType out_type = half_to_float ? at::kFloat : local.scalar_type();
  at::Tensor out = from_rows(rows.to(out_type), local.sizes(), dim);
  torch::jit::drop(*stack, 3);
  stack->push_back(make_dtensor(out, cs.layout));
  return true;
}

// _log_softmax_backward_data(grad_output, output, dim, input_dtype): one all-reduce.
bool log_softmax_backward_kernel(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 4);
  at::Tensor grad = args[0].toTensor();
  at::Tensor output = args[1].toTensor();
  const int64_t dim = c10::maybe_wrap_dim(args[2].toInt(), output.dim());
  const auto input_dtype = args[3].toScalarType();
  if (!is_class_sharded(output, dim)) return false;
  ClassSharding cs = sharding_for_backward(output, dim, "log_softmax backward");
  const at::Tensor& out_local = local_of(output);
  at::Tensor g = local_piece(grad, cs.layout);
  at::Tensor rows = distributed_log_softmax_backward(to_rows(g, dim), to_rows(out_local, dim), cs.shard);
  torch::jit::drop(*stack, 4);
  stack->push_back(make_dtensor(from_rows(rows.to(input_dtype), out_local.sizes(), dim), cs.layout));
  return true;
}

// nll_loss_forward / nll_loss2d_forward(self, target, weight, reduction, ignore_index): K2.
bool nll_forward_kernel(const c10::OperatorHandle&, torch::jit::Stack* stack) {
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
    call = routed_call(op, local, class_dim, cs);
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

// nll_loss_backward / nll_loss2d_backward(grad_output, self, target, weight, reduction,
// ignore_index, total_weight): local, no collective.
bool nll_backward_kernel(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 7);
  at::Tensor self = args[1].toTensor();
  const int64_t class_dim = class_dim_of(self.dim());
  if (!is_class_sharded(self, class_dim)) return false;
  const std::string op = "nll_loss backward";
  ClassSharding cs = sharding_for_backward(self, class_dim, op);
  const int64_t reduction = args[4].toInt();
  const Layout row_layout = cs.row_layout();
  // A per-row loss's gradient is laid out as its rows (this rank's piece); a reduced loss's is
  // its value (Replicate, as PyTorch's gradient of a Partial(sum)).
  at::Tensor grad =
      reduction == at::Reduction::None ? local_piece(args[0].toTensor(), row_layout) : full_value(args[0].toTensor());
  at::Tensor target = laid_out_local(args[2].toTensor(), row_layout.placements(), row_layout.shape(), "target", op, cs,
                                     /*strict=*/false);
  c10::optional<at::Tensor> weight = optional_tensor(args[3]);
  if (weight) weight = replicated_value(*weight, "class weight", op);
  const at::Tensor& local = local_of(self);
  const int64_t rows = to_rows(local, class_dim).size(0);
  // The total weight only 'mean' reads: the forward's, replicated (the global one for the
  // global mean), so this rank's copy, without a collective.
  const at::Tensor& tw = args[6].toTensor();
  at::Tensor g = nll_backward_rows(grad, rows, target.reshape({-1}), weight, reduction, args[5].toInt(),
                                   dtensor_impl(tw) ? local_of(tw) : tw, local.scalar_type(), cs.shard);
  torch::jit::drop(*stack, 7);
  stack->push_back(make_dtensor(from_rows(g, local.sizes(), class_dim), cs.layout));
  return true;
}

}  // namespace

const std::map<std::string, LossKernel>& routed_loss_kernels() {
  static const auto* k = new std::map<std::string, LossKernel>{
      {"log_softmax", {log_softmax_kernel, false}},
      {"log_softmax_backward", {log_softmax_backward_kernel, true}},
      {"nll_forward", {nll_forward_kernel, false}},
      {"nll_backward", {nll_backward_kernel, true}},
  };
  return *k;
}

}  // namespace hyper_parallel
