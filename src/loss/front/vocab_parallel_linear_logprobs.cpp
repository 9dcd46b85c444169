// vocab_parallel_linear_logprobs (vocab_logprobs.h): the log-probabilities and entropy of hidden
// x this member's local head rows, the logits formed one block at a time (linear_blocks.h) and
// never whole; forward through LossCallPlan, backward from forward's saved statistics (one
// all-reduce, of hidden's gradient). Its DTensor op: fused_linear_logprobs.cpp.
#include <ATen/ATen.h>

#include <string>
#include <tuple>
#include <vector>

#include "hyper_parallel/loss/vocab_logprobs.h"
#include "loss/call/call_agreement.h"
#include "loss/call/loss_call_plan.h"
#include "loss/call/loss_input_checks.h"
#include "loss/call/vocab_pieces.h"
#include "loss/math/cross_entropy_kernels.h"
#include "loss/math/fused_logprobs.h"
#include "loss/math/linear_blocks.h"

namespace hyper_parallel {

namespace {

constexpr const char* kLinearLogprobsOp = "vocab_parallel_linear_logprobs";
// Logits per block when the caller does not choose: 8 M (32 MiB in fp32), a quarter of the
// cross-entropy's. RL steps take the log-probabilities of several policies beside the
// rollout's buffers; the smaller tile was as fast (docs/performance.md, "Log-probabilities").
constexpr int64_t kLogprobsBlockElements = int64_t{1} << 23;

LinearBlocks logprobs_blocks(const LogprobsOptions& o, int64_t tokens, int64_t local_classes, at::ScalarType dtype) {
  return linear_block_sizes(o.chunk_tokens, o.vocab_block, tokens, local_classes, dtype, kLogprobsBlockElements);
}

// The fused statistics' settings for sampled tokens `target` ([tokens] int64).
FusedCrossEntropy linear_logprobs_settings(const at::Tensor& target, const LogprobsOptions& options) {
  FusedCrossEntropy ce;
  ce.target = target;
  ce.definition.reduction = at::Reduction::None;
  ce.definition.ignore_index = options.ignore_index;
  ce.temperature = options.temperature;
  ce.entropy_sum = options.return_entropy;
  return ce;
}

}  // namespace

Logprobs vocab_parallel_linear_logprobs_forward(const at::Tensor& hidden, const at::Tensor& local_weight,
                                                const at::Tensor& target, const Communicator* comm, int64_t vocab_size,
                                                const LogprobsOptions& options, LogprobsSaved* saved) {
  const std::string op = kLinearLogprobsOp;
  const int64_t local_classes = local_weight.dim() == 2 ? local_weight.size(0) : 0;
  const int64_t tokens = hidden.dim() >= 1 ? hidden.size(0) : 0;
  at::Tensor h = hidden, w = local_weight, t;
  LogprobsOptions used = options;
  LossCallSteps steps;
  steps.describe = [&](LossCallRecord& call, ClassLayout& layout) {
    call = logprobs_call(op, tokens, hidden.scalar_type(), options);
    // Ranks whose hidden sizes differ would combine statistics of different products, and
    // all-reduce hidden gradients of different sizes in backward.
    call.hidden_dim = hidden.dim() >= 1 ? hidden.size(-1) : -1;
    record_target(call, target, -1);
    layout = ClassLayout{comm, local_classes, vocab_size, -1, hidden.device()};
  };
  steps.replicated = target;
  steps.checks = [&](const ClassShard& shard) {
    check_logprobs_options(options, op, hidden.scalar_type());
    check_linear_pieces(hidden, local_weight, target, op);
    t = logprobs_target(target, {hidden.size(0)}, shard.total, options.ignore_index, op);
  };
  steps.placeholders = [&] {
    // Placeholders that touch nothing; the all-gather settles the refusal everywhere.
    std::tie(h, w, t) = linear_placeholders(hidden, local_weight, options.ignore_index);
    used.temperature = 1.0;
  };
  LossCallPlan call(op, steps);
  const ClassShard& shard = call.shard();
  const at::ScalarType dt = h.scalar_type(), ct = compute_type(dt);
  FusedCrossEntropy ce = linear_logprobs_settings(t, used);
  fused_cross_entropy_prepare(ce, h.size(0), shard, h.options().dtype(ct));
  const at::Tensor stats = call.statistics(h.size(0), h.options().dtype(ct), [&] {
    return linear_block_stats(ce, h, w, shard, logprobs_blocks(used, h.size(0), w.size(0), dt));
  });
  const auto combined = fused_logprobs_combine(ce, stats, shard, call.inputs());
  return logprobs_results(ce, combined, dt, {h.size(0)}, shard.total, saved);
}

std::vector<at::Tensor> vocab_parallel_linear_logprobs_backward(
    const at::Tensor& grad_logprobs, const at::Tensor& grad_entropy, const at::Tensor& hidden,
    const at::Tensor& local_weight, const at::Tensor& target, const LogprobsSaved& saved, const Communicator* comm,
    int64_t vocab_size, const LogprobsOptions& options, bool hidden_grad, bool weight_grad) {
  // No collective but the hidden gradient's all-reduce: the piece follows from the size.
  const ClassShard shard = backward_class_shard(comm, vocab_size, std::string(kLinearLogprobsOp) + " backward");
  const at::ScalarType dt = hidden.scalar_type();
  FusedCrossEntropy ce = linear_logprobs_settings(target.reshape({-1}).to(at::kLong), options);
  fused_cross_entropy_prepare(ce, hidden.size(0), shard, hidden.options().dtype(compute_type(dt)));
  ce.row_max = saved.row_max;
  ce.log_sum = saved.log_sum;
  const FusedCrossEntropyCoefficients co =
      fused_logprobs_coefficients(ce, saved.mean_difference, grad_logprobs, grad_entropy);
  at::NoGradGuard no_grad;
  const LinearBlocks blocks = logprobs_blocks(options, hidden.size(0), local_weight.size(0), dt);
  auto [gh, gw] = linear_block_gradients(ce, co, hidden, local_weight, shard, blocks, hidden_grad, weight_grad);
  return {gh, gw};
}

}  // namespace hyper_parallel
