// vocab_parallel_logprobs_forward / _backward (vocab_logprobs.h): the fused cross-entropy's
// statistics at a temperature, with the entropy's sum (fused_logprobs.h has the math), on this
// member's local logits and a communicator; forward through LossCallPlan, backward from
// forward's saved statistics with no collective. Its DTensor op: vocab_logprobs.cpp.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <string>

#include "hyper_parallel/loss/vocab_logprobs.h"
#include "loss/call/call_agreement.h"
#include "loss/call/loss_call_plan.h"
#include "loss/call/loss_input_checks.h"
#include "loss/call/vocab_pieces.h"
#include "loss/math/cross_entropy_kernels.h"
#include "loss/math/fused_logprobs.h"
#include "loss/math/logits_device.h"

namespace hyper_parallel {

namespace {

constexpr const char* kLogprobsOp = "vocab_parallel_logprobs";

// The logits' rows with a unit class stride, as the block kernels read them.
at::Tensor contiguous_class_rows(const at::Tensor& rows) {
  return rows.size(1) <= 1 || rows.stride(1) == 1 ? rows : rows.contiguous();
}

}  // namespace

Logprobs vocab_parallel_logprobs_forward(const at::Tensor& local_logits, int64_t class_dim_in, const at::Tensor& target,
                                         const Communicator* comm, int64_t vocab_size, const LogprobsOptions& options,
                                         LogprobsSaved* saved) {
  const std::string op = kLogprobsOp;
  const int64_t class_dim = logits_class_dim(local_logits, class_dim_in, op);
  FusedCrossEntropy ce;
  ce.x_rows = contiguous_class_rows(to_rows(local_logits, class_dim));
  ce.definition.reduction = at::Reduction::None;
  ce.definition.ignore_index = options.ignore_index;
  ce.temperature = options.temperature;
  ce.entropy_sum = options.return_entropy;
  std::vector<int64_t> out_shape = local_logits.sizes().vec();
  out_shape.erase(out_shape.begin() + class_dim);
  LossCallSteps steps;
  steps.describe = [&](LossCallRecord& call, ClassLayout& layout) {
    call = logprobs_call(op, 0, local_logits.scalar_type(), options);
    record_logits(call, local_logits, class_dim);
    record_target(call, target, class_dim);
    layout = ClassLayout{comm, local_logits.size(class_dim), vocab_size, -1, local_logits.device()};
  };
  steps.replicated = target;
  steps.checks = [&](const ClassShard& shard) {
    check_logprobs_options(options, op, local_logits.scalar_type());
    TORCH_CHECK_VALUE(local_logits.is_floating_point(), op, ": expected floating-point logits, got ",
                      local_logits.scalar_type());
    check_on_logits_device(local_logits.device(), target.device(), "target", op);
    ce.target = logprobs_target(target, out_shape, shard.total, options.ignore_index, op);
  };
  steps.placeholders = [&] {
    ce.target = at::full({ce.x_rows.size(0)}, options.ignore_index, ce.x_rows.options().dtype(at::kLong));
    ce.temperature = 1.0;
  };
  LossCallPlan call(op, steps);
  const ClassShard& shard = call.shard();
  const at::ScalarType ct = compute_type(local_logits.scalar_type());
  const int64_t rows = ce.x_rows.size(0);
  fused_cross_entropy_prepare(ce, rows, shard, local_logits.options().dtype(ct));
  const at::Tensor stats = call.statistics(rows, local_logits.options().dtype(ct),
                                           [&] { return fused_cross_entropy_block_stats(ce, ce.x_rows, 0, 0, shard); });
  const auto combined = fused_logprobs_combine(ce, stats, shard, call.inputs());
  return logprobs_results(ce, combined, local_logits.scalar_type(), out_shape, shard.total, saved);
}

at::Tensor vocab_parallel_logprobs_backward(const at::Tensor& grad_logprobs, const at::Tensor& grad_entropy,
                                            const at::Tensor& local_logits, int64_t class_dim_in,
                                            const at::Tensor& target, const LogprobsSaved& saved,
                                            const Communicator* comm, int64_t vocab_size,
                                            const LogprobsOptions& options) {
  const std::string op = std::string(kLogprobsOp) + " backward";
  const int64_t class_dim = logits_class_dim(local_logits, class_dim_in, op);
  // No collective: the piece follows from the size, which forward checked.
  const ClassShard shard = backward_class_shard(comm, vocab_size, op);
  FusedCrossEntropy ce;
  ce.x_rows = contiguous_class_rows(to_rows(local_logits, class_dim));
  ce.definition.ignore_index = options.ignore_index;
  ce.temperature = options.temperature;
  ce.target = target.reshape({-1}).to(at::kLong);
  const int64_t rows = ce.x_rows.size(0);
  fused_cross_entropy_prepare(ce, rows, shard, local_logits.options().dtype(compute_type(local_logits.scalar_type())));
  ce.row_max = saved.row_max;
  ce.log_sum = saved.log_sum;
  const FusedCrossEntropyCoefficients co =
      fused_logprobs_coefficients(ce, saved.mean_difference, grad_logprobs, grad_entropy);
  at::Tensor out = at::empty({rows, shard.local}, ce.x_rows.options());
  fused_cross_entropy_block_gradient(ce, co, ce.x_rows, out, 0, 0, shard);
  return from_rows(out, local_logits.sizes(), class_dim);
}

}  // namespace hyper_parallel
