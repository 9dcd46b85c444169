// fused_linear_inputs.h: the fused linear losses' inputs, validated, and their gradients' layout.
#include "loss/front/fused_linear_inputs.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <string>
#include <vector>

#include "dtensor/dtensor_impl.h"
#include "hyper_parallel/dtensor/dtensor.h"
#include "loss/call/loss_input_checks.h"
#include "loss/math/cross_entropy_kernels.h"
#include "loss/math/linear_blocks.h"

namespace hyper_parallel {

namespace {

// What validate() and local_inputs() both refuse: probability targets, indices that are not
// int64 or uint8, and gradients the loss does not give (of the target or the class weights).
void check_index_target_without_grads(const at::Tensor& target, const FusedLinearCrossEntropyOptions& o,
                                      const std::string& op) {
  if (target.is_floating_point()) {
    throw LossParallelUnsupportedError(op +
                                       ": probability targets are not supported (they are [tokens, V], "
                                       "what this loss exists to avoid); give class indices [tokens]");
  }
  check_index_target_dtype(target, op, OptionErrorKind::runtime_error);
  check_no_target_or_weight_grad(target, o.class_weight, op);
}

// The options' ranges, for both kinds of input.
void check_options(const FusedLinearCrossEntropyOptions& o, const std::string& op) {
  check_cross_entropy_definition(o, op, OptionErrorKind::value_error);
  check_block_sizes(o.chunk_tokens, o.vocab_block, op);
}

}  // namespace

LinearHead given_linear_head(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& target,
                             const std::string& op, OptionErrorKind kind) {
  const bool given = hidden.defined() && weight.defined() && target.defined();
  if (kind == OptionErrorKind::value_error) {
    TORCH_CHECK_VALUE(given, op, ": hidden, weight and target must be defined");
  } else {
    TORCH_CHECK(given, op, ": hidden, weight and target must be defined");
  }
  return linear_head(hidden, weight, op);
}

std::vector<at::Tensor> head_gradients(const at::Tensor& gh, const at::Tensor& gw, bool want_h, bool want_w,
                                       const c10::optional<Layout>& hidden_layout,
                                       const c10::optional<Layout>& weight_layout) {
  at::Tensor grad_h, grad_w;
  if (want_h) grad_h = hidden_layout ? make_dtensor(gh, *hidden_layout) : gh;
  if (want_w) grad_w = weight_layout ? make_dtensor(gw, *weight_layout) : gw;
  return {grad_h, grad_w};
}

LinearLossInputs validate_inputs(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& target,
                                 const FusedLinearCrossEntropyOptions& o) {
  const std::string op = "fused_linear_cross_entropy";
  const LinearHead head = given_linear_head(hidden, weight, target, op, OptionErrorKind::runtime_error);
  LinearLossInputs in;
  in.h = head.h;
  in.w = head.w;
  in.shard = head.shard;
  in.hidden_layout = head.hidden_layout;
  in.weight_layout = head.weight_layout;
  TORCH_CHECK(hidden.dim() == 2 && hidden.size(1) == weight.size(1), op, ": expected hidden [tokens, ", weight.size(1),
              "] for a weight of shape ", weight.sizes(), ", got ", describe_input(hidden));
  TORCH_CHECK(at::isFloatingType(hidden.scalar_type()) && hidden.scalar_type() == weight.scalar_type(), op,
              ": expected hidden and weight of one floating dtype, got ", hidden.scalar_type(), " and ",
              weight.scalar_type());
  TORCH_CHECK(in.h.device() == in.w.device(), op, ": hidden is on ", in.h.device(), ", the weight on ", in.w.device());
  check_index_target_without_grads(target, o, op);
  in.target = replicated_value(target, "target", op);
  TORCH_CHECK(in.target.dim() == 1 && in.target.size(0) == hidden.size(0), op, ": expected a target [", hidden.size(0),
              "] (one class per token of hidden), got ", describe_input(target));
  in.target = in.target.to(in.h.device(), at::kLong);
  check_targets(in.target, in.shard.total, o.ignore_index);
  check_options(o, op);
  if (o.class_weight && o.class_weight->defined()) {
    at::Tensor cw = replicated_value(*o.class_weight, "class weight", op);
    check_class_weight(cw, in.shard.total, in.h.scalar_type(), "hidden states", op, OptionErrorKind::runtime_error,
                       describe_input(*o.class_weight));
    in.class_weight = cw.to(in.h.device(), compute_type(in.h.scalar_type()));
  }
  return in;
}

LinearLossInputs local_inputs(const at::Tensor& hidden, const at::Tensor& local_weight, const at::Tensor& target,
                              const FusedLinearCrossEntropyOptions& o, const ClassShard& piece) {
  const std::string op = "vocab_parallel_linear_cross_entropy";
  LinearLossInputs in;
  in.h = hidden;
  in.w = local_weight;
  in.shard = piece;
  check_linear_pieces(hidden, local_weight, target, op);
  check_index_target_without_grads(target, o, op);
  TORCH_CHECK_VALUE(target.dim() == 1 && target.size(0) == hidden.size(0), op, ": expected a target [", hidden.size(0),
                    "] (one class per token of hidden), got ", target.sizes());
  in.target = target.to(at::kLong);
  check_targets(in.target, piece.total, o.ignore_index);
  check_options(o, op);
  if (o.class_weight && o.class_weight->defined()) {
    const at::Tensor& cw = *o.class_weight;
    check_class_weight(cw, piece.total, hidden.scalar_type(), "hidden states", op, OptionErrorKind::value_error);
    TORCH_CHECK(cw.device() == hidden.device(), op, ": the class weight is on ", cw.device(), ", hidden on ",
                hidden.device());
    in.class_weight = cw.to(compute_type(hidden.scalar_type()));
  }
  return in;
}

}  // namespace hyper_parallel
