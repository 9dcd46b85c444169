#include "loss/call/loss_input_checks.h"

#include <ATen/ATen.h>
#include <ATen/core/Reduction.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <cmath>
#include <string>
#include <vector>

#include "hyper_parallel/loss/loss_parallel.h"

namespace hyper_parallel {

namespace {

// The first problem with `d`, or empty.
std::string definition_problem(const CrossEntropyDefinition& d) {
  if (d.reduction < at::Reduction::None || d.reduction > at::Reduction::Sum)
    return c10::str("reduction must be at::Reduction None, Mean or Sum, got ", d.reduction);
  if (!(d.label_smoothing >= 0.0 && d.label_smoothing <= 1.0))
    return c10::str("label_smoothing must be in [0, 1], got ", d.label_smoothing);
  if (!(std::isfinite(d.z_loss_weight) && d.z_loss_weight >= 0.0))
    return c10::str("z_loss_weight must be >= 0 and finite (0: off), got ", d.z_loss_weight);
  if (!(std::isfinite(d.logit_softcap) && d.logit_softcap >= 0.0))
    return c10::str("logit_softcap must be >= 0 and finite (0: off), got ", d.logit_softcap);
  return {};
}

// `op`: `problem`, as the error `kind` says.
[[noreturn]] void raise(OptionErrorKind kind, const std::string& op, const std::string& problem) {
  if (kind == OptionErrorKind::value_error) TORCH_CHECK_VALUE(false, op, ": ", problem);
  TORCH_CHECK(false, op, ": ", problem);
}

}  // namespace

void check_cross_entropy_definition(const CrossEntropyDefinition& definition, const std::string& op,
                                    OptionErrorKind kind) {
  const std::string problem = definition_problem(definition);
  if (!problem.empty()) raise(kind, op, problem);
}

void check_no_target_or_weight_grad(const at::Tensor& target, const c10::optional<at::Tensor>& weight,
                                    const std::string& op) {
  if (target.requires_grad() || (weight && weight->defined() && weight->requires_grad())) {
    throw LossParallelUnsupportedError(op +
                                       ": gradients with respect to the target or the class weights are not "
                                       "supported");
  }
}

void check_class_weight_dtype(at::ScalarType input, const at::Tensor& weight, const std::string& input_name,
                              const std::string& op) {
  TORCH_CHECK(weight.scalar_type() == input, op, ": expected scalar type ", input, " but found ", weight.scalar_type(),
              " (the class weight must have the ", input_name, "' dtype)");
}

void check_index_target_dtype(const at::Tensor& target, const std::string& op, OptionErrorKind kind) {
  if (target.scalar_type() == at::kLong || target.scalar_type() == at::kByte) return;
  raise(kind, op, c10::str("expected target dtype to be Long or Byte, but got ", target.scalar_type()));
}

void check_class_weight(const at::Tensor& weight, int64_t num_classes, at::ScalarType input,
                        const std::string& input_name, const std::string& op, OptionErrorKind kind,
                        const std::string& described) {
  if (weight.dim() != 1 || weight.size(0) != num_classes) {
    raise(kind, op,
          c10::str("expected a class weight of shape [", num_classes, "], got ",
                   described.empty() ? c10::str(weight.sizes()) : described));
  }
  check_class_weight_dtype(input, weight, input_name, op);
}

void check_linear_pieces(const at::Tensor& hidden, const at::Tensor& local_weight, const at::Tensor& target,
                         const std::string& op) {
  TORCH_CHECK_VALUE(local_weight.dim() == 2 && hidden.dim() == 2 && hidden.size(1) == local_weight.size(1), op,
                    ": expected hidden [tokens, dim] and this rank's weight rows [V_local, dim], got ", hidden.sizes(),
                    " and ", local_weight.sizes());
  TORCH_CHECK_VALUE(at::isFloatingType(hidden.scalar_type()) && hidden.scalar_type() == local_weight.scalar_type(), op,
                    ": expected hidden and weight of one floating dtype, got ", hidden.scalar_type(), " and ",
                    local_weight.scalar_type());
  TORCH_CHECK(hidden.device() == local_weight.device() && target.device() == hidden.device(), op,
              ": expected hidden, weight and target on one device, got ", hidden.device(), ", ", local_weight.device(),
              " and ", target.device());
}

void check_block_sizes(int64_t chunk_tokens, int64_t vocab_block, const std::string& op) {
  TORCH_CHECK_VALUE(chunk_tokens >= 0 && vocab_block >= 0, op,
                    ": chunk_tokens and vocab_block must be >= 0 (0: automatic), got ", chunk_tokens, " and ",
                    vocab_block);
}

int64_t logits_class_dim(const at::Tensor& logits, int64_t class_dim, const std::string& op) {
  TORCH_CHECK_VALUE(logits.dim() >= 1, op, ": expected logits with a class dim, got a 0-dim tensor");
  return c10::maybe_wrap_dim(class_dim, logits.dim());
}

void check_targets(const at::Tensor& target, int64_t num_classes, int64_t ignore_index) {
  if (target.is_meta()) return;  // a dry run's targets: shapes, no ids to check
  at::Tensor bad = target.ne(ignore_index).logical_and(target.lt(0).logical_or(target.ge(num_classes)));
  if (bad.any().item<bool>()) {
    const int64_t value = target.masked_select(bad).view({-1})[0].item<int64_t>();
    TORCH_CHECK_INDEX(false, "Target ", value, " is out of bounds: expected a class in [0, ", num_classes,
                      ") or ignore_index (", ignore_index, ")");
  }
}

void check_probability_target_ignore_index(int64_t ignore_index, const std::string& op) {
  if (ignore_index >= 0) {
    throw LossParallelUnsupportedError(op + ": ignore_index is not supported for floating point target (got " +
                                       std::to_string(ignore_index) +
                                       "; as PyTorch's cross_entropy, only class-index targets can ignore a class)");
  }
}

void check_nll_inputs(c10::IntArrayRef logp_shape, at::ScalarType logp_dtype, int64_t class_dim,
                      const at::Tensor& target, const c10::optional<at::Tensor>& weight, int64_t num_classes,
                      int64_t reduction, int64_t ignore_index, const std::string& op) {
  check_cross_entropy_definition(CrossEntropyDefinition{LossTerms{}, ignore_index, reduction}, op,
                                 OptionErrorKind::value_error);
  // The error types and words are ATen's nll_loss's (RuntimeError, ValueError for the batch).
  check_index_target_dtype(target, op, OptionErrorKind::runtime_error);
  std::vector<int64_t> expect = logp_shape.vec();
  expect.erase(expect.begin() + class_dim);
  // ATen's own words when only the batch differs.
  TORCH_CHECK_VALUE(logp_shape.size() < 2 || target.dim() == 0 || target.size(0) == logp_shape[0],
                    "Expected input batch_size (", logp_shape[0], ") to match target batch_size (", target.size(0),
                    ").");
  TORCH_CHECK_VALUE(target.sizes() == c10::IntArrayRef(expect), op, ": expected a target of shape ",
                    c10::IntArrayRef(expect), " for log-probabilities of shape ", logp_shape, " (class dim ", class_dim,
                    "), got ", target.sizes());
  if (weight && weight->defined()) {
    TORCH_CHECK(weight->dim() == 1 && weight->numel() == num_classes, op,
                ": weight tensor should be defined either for all ", num_classes,
                " classes or no classes but got weight tensor of shape: ", weight->sizes());
    check_class_weight_dtype(logp_dtype, *weight, "log-probabilities", op);
  }
  check_targets(target, num_classes, ignore_index);
}

}  // namespace hyper_parallel
