// vocab_parallel.h: loss_parallel's kernels on plain local pieces and a communicator.
#include "hyper_parallel/loss/vocab_parallel.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <string>

#include "loss/call/call_agreement.h"
#include "loss/call/loss_call_plan.h"
#include "loss/call/class_sharding.h"
#include "loss/math/cross_entropy_kernels.h"
#include "loss/math/fused_cross_entropy.h"
#include "loss/call/input_agreement.h"
#include "loss/math/logits_device.h"
#include "loss/call/loss_input_checks.h"

namespace hyper_parallel {

namespace {

ClassShard class_shard(const Communicator* comm, const VocabPiece& p) {
  ClassShard s;
  s.comm = comm;
  s.offset = p.offset;
  s.local = p.local;
  s.total = p.total;
  return s;
}

int64_t wrap_class_dim(const at::Tensor& t, int64_t class_dim, const char* op) {
  TORCH_CHECK_VALUE(t.dim() >= 1, op, ": expected logits with a class dim, got a 0-dim tensor");
  return c10::maybe_wrap_dim(class_dim, t.dim());
}

// The fused cross-entropy over local_logits' rows with `options` (its inputs not set yet).
FusedCrossEntropy settings_of(const at::Tensor& local_logits, int64_t class_dim, const at::Tensor& target,
                              const VocabCrossEntropyOptions& options) {
  FusedCrossEntropy ce;
  ce.x_rows = to_rows(local_logits, class_dim);
  ce.definition = options;
  ce.soft = target.is_floating_point();
  return ce;
}

}  // namespace

int64_t learn_vocab_size(const std::string& op, int64_t local_classes, const Communicator* comm,
                         const c10::Device& device) {
  return learn_vocabulary(op, local_classes, comm, device);
}

void agree_on_loss_strictness(const std::string& op, bool strict, const std::vector<const Communicator*>& groups,
                              const c10::Device& device) {
  LossCallRecord call;
  call.op = op;
  call.strict = strict;
  if (groups.size() == 1) {
    agree_on_call(call, groups[0], device);
  } else {
    agree_on_context(call, groups, device);
  }
}

void agree_outside_loss_parallel(const std::string& op, const Communicator* group, const c10::Device& device) {
  LossCallRecord call;
  call.op = op;
  call.context = LossContext::outside;
  agree_on_call(call, group, device);
}

at::Tensor vocab_parallel_cross_entropy_forward(const at::Tensor& local_logits, int64_t class_dim_in,
                                                const at::Tensor& target, const std::optional<at::Tensor>& weight,
                                                const Communicator* comm, int64_t vocab_size,
                                                const VocabCrossEntropyOptions& options,
                                                VocabCrossEntropySaved* saved) {
  const std::string op = "vocab_parallel_cross_entropy";
  const int64_t class_dim = wrap_class_dim(local_logits, class_dim_in, op.c_str());
  const at::ScalarType ct = compute_type(local_logits.scalar_type());
  FusedCrossEntropy ce = settings_of(local_logits, class_dim, target, options);
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

at::Tensor vocab_parallel_cross_entropy_backward(const at::Tensor& grad_loss, const at::Tensor& local_logits,
                                                 int64_t class_dim_in, const at::Tensor& target,
                                                 const std::optional<at::Tensor>& weight,
                                                 const VocabCrossEntropySaved& saved, const Communicator* comm,
                                                 int64_t vocab_size, const VocabCrossEntropyOptions& options) {
  const int64_t class_dim = wrap_class_dim(local_logits, class_dim_in, "vocab_parallel_cross_entropy backward");
  TORCH_CHECK_VALUE(vocab_size >= 0,
                    "vocab_parallel_cross_entropy backward: expected the vocabulary size forward used");
  // No collective: the piece follows from the size, which forward checked.
  const int64_t n = comm ? comm->size() : 1, r = comm ? comm->rank() : 0;
  const ChunkRange range = chunk_range(vocab_size, n, r);
  const ClassShard shard = class_shard(comm, {range.offset, range.length, vocab_size});
  const at::ScalarType ct = compute_type(local_logits.scalar_type());
  if (saved.grad_rows.defined()) {
    // Forward wrote the gradient for a unit incoming gradient: scale it where it is.
    FusedCrossEntropy written;
    written.x_rows = saved.grad_rows;
    written.grad_rows = saved.grad_rows;
    written.definition.reduction = options.reduction;
    return from_rows(fused_cross_entropy_backward(written, grad_loss, shard), local_logits.sizes(), class_dim);
  }
  FusedCrossEntropy ce = settings_of(local_logits, class_dim, target, options);
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

namespace {
ClassShard shard_for(const Communicator* comm, const at::Tensor& local, int64_t class_dim, int64_t vocab_size) {
  return class_shard(comm, vocab_piece(comm, local.size(class_dim), vocab_size));
}
}  // namespace

at::Tensor vocab_parallel_log_softmax(const at::Tensor& local, int64_t class_dim_in, const Communicator* comm,
                                      int64_t vocab_size, std::optional<at::ScalarType> out_dtype) {
  const std::string op = "vocab_parallel_log_softmax";
  const int64_t class_dim = wrap_class_dim(local, class_dim_in, op.c_str());
  // The call's record before the all-reduces sized by rows (one all-gather more).
  LossCallRecord call;
  call.op = op;
  record_logits(call, local, class_dim);
  record_guard_cross_entropy_options(call);
  const ClassShard shard =
      agree_on_loss_call(call, ClassLayout{comm, local.size(class_dim), vocab_size, -1, local.device()});
  const at::Tensor rows = distributed_log_softmax(to_rows(local, class_dim), shard);
  return from_rows(rows.to(out_dtype.value_or(local.scalar_type())), local.sizes(), class_dim);
}

at::Tensor vocab_parallel_log_softmax_backward(const at::Tensor& grad, const at::Tensor& output, int64_t class_dim_in,
                                               const Communicator* comm, int64_t vocab_size,
                                               at::ScalarType input_dtype) {
  const int64_t class_dim = wrap_class_dim(output, class_dim_in, "vocab_parallel_log_softmax backward");
  // The backward needs this member's classes and the group, not where its classes sit: a
  // vocabulary forward learnt (vocab_size < 0) costs no collective here.
  const ClassShard shard = vocab_size >= 0 ? shard_for(comm, output, class_dim, vocab_size)
                                           : ClassShard{comm, 0, output.size(class_dim), -1};
  const at::Tensor rows = distributed_log_softmax_backward(to_rows(grad, class_dim), to_rows(output, class_dim), shard);
  return from_rows(rows.to(input_dtype), output.sizes(), class_dim);
}

std::vector<at::Tensor> vocab_parallel_nll_loss_forward(const at::Tensor& local_logp, int64_t class_dim_in,
                                                        const at::Tensor& target,
                                                        const std::optional<at::Tensor>& weight, int64_t reduction,
                                                        int64_t ignore_index, const Communicator* comm,
                                                        int64_t vocab_size) {
  const std::string op = "vocab_parallel_nll_loss";
  const int64_t class_dim = wrap_class_dim(local_logp, class_dim_in, op.c_str());
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
  const int64_t class_dim = wrap_class_dim(local_logp, class_dim_in, "vocab_parallel_nll_loss backward");
  const ClassShard shard = shard_for(comm, local_logp, class_dim, vocab_size);
  c10::optional<at::Tensor> w;
  if (weight && weight->defined()) w = *weight;
  const int64_t rows = to_rows(local_logp, class_dim).size(0);
  const at::Tensor g = nll_backward_rows(grad_output, rows, target.reshape({-1}), w, reduction, ignore_index,
                                         total_weight, local_logp.scalar_type(), shard);
  return from_rows(g, local_logp.sizes(), class_dim);
}

}  // namespace hyper_parallel
