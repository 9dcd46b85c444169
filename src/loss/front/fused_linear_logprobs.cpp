// vocab_logprobs.h's fused linear variant: the log-probabilities and entropy of hidden x the
// head's local rows, the logits formed one block at a time (linear_blocks.h) and never whole.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <algorithm>
#include <string>
#include <tuple>

#include "compat/autograd_compat.h"
#include "dtensor/dtensor_impl.h"
#include "hyper_parallel/dtensor/dtensor.h"
#include "hyper_parallel/loss/vocab_logprobs.h"
#include "hyper_parallel/loss/vocab_parallel.h"
#include "loss/call/class_sharding.h"
#include "loss/call/call_agreement.h"
#include "loss/kernel/cross_entropy_cpu_kernel.h"
#include "loss/math/cross_entropy_kernels.h"
#include "loss/math/fused_logprobs.h"
#include "loss/call/input_agreement.h"
#include "loss/call/loss_input_checks.h"
#include "loss/call/loss_call_plan.h"
#include "loss/math/linear_blocks.h"

namespace hyper_parallel {

namespace {

constexpr const char* kLinearLogprobsOp = "vocab_parallel_linear_logprobs";
// Logits per block when the caller does not choose: 8 M (32 MiB in fp32), a quarter of the
// cross-entropy's. RL steps take the log-probabilities of several policies beside the
// rollout's buffers; the smaller tile was as fast (docs/performance.md, "Log-probabilities").
constexpr int64_t kLogprobsBlockElements = int64_t{1} << 23;

LinearBlocks blocks_of(const LogprobsOptions& o, int64_t tokens, int64_t local_classes, at::ScalarType dtype) {
  return linear_block_sizes(o.chunk_tokens, o.vocab_block, tokens, local_classes, dtype, kLogprobsBlockElements);
}

// The fused statistics' settings for sampled tokens `target` ([tokens] int64).
FusedCrossEntropy logprobs_of(const at::Tensor& target, const LogprobsOptions& options) {
  FusedCrossEntropy ce;
  ce.target = target;
  ce.definition.reduction = at::Reduction::None;
  ce.definition.ignore_index = options.ignore_index;
  ce.temperature = options.temperature;
  ce.entropy_sum = options.return_entropy;
  return ce;
}

// The DTensor variant's gradient node: the local backward on the saved statistics.
struct FusedLinearLogprobsBackward : torch::autograd::Node {
  LogprobsSaved saved;
  LogprobsOptions options;
  at::Tensor target;
  const Communicator* comm = nullptr;
  c10::optional<Layout> hidden_layout, weight_layout;  // set for DTensor inputs
  bool entropy_output = false;
  torch::autograd::SavedVariable saved_hidden, saved_weight;

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    const at::Tensor hidden = saved_hidden.unpack(), weight = saved_weight.unpack();
    const bool want_h = task_should_compute_output(0), want_w = task_should_compute_output(1);
    const at::Tensor g_lp = grads[0].defined() ? full_value(grads[0]) : at::Tensor();
    const at::Tensor g_h = entropy_output && grads[1].defined() ? full_value(grads[1]) : at::Tensor();
    if ((!g_lp.defined() && !g_h.defined()) || (!want_h && !want_w)) return {at::Tensor(), at::Tensor()};
    const at::Tensor h = hidden_layout ? local_of(hidden) : hidden;
    const at::Tensor w = weight_layout ? local_of(weight) : weight;
    auto g = vocab_parallel_linear_logprobs_backward(g_lp, g_h, h, w, target, saved, comm, saved.vocab_size, options,
                                                     want_h, want_w);
    at::Tensor grad_h, grad_w;
    if (want_h) grad_h = hidden_layout ? make_dtensor(g[0], *hidden_layout) : g[0];
    if (want_w) grad_w = weight_layout ? make_dtensor(g[1], *weight_layout) : g[1];
    return {grad_h, grad_w};
  }
  std::string name() const override { return "hyper_parallel::FusedLinearLogprobsBackward"; }
  void release_variables() override {
    saved_hidden.reset_data();
    saved_weight.reset_data();
    saved = LogprobsSaved{};
  }
};

}  // namespace

Logprobs fused_linear_logprobs(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& target,
                               const LogprobsOptions& options) {
  const std::string op = "fused_linear_logprobs";
  TORCH_CHECK_VALUE(hidden.defined() && weight.defined() && target.defined(), op,
                    ": hidden, weight and target must be defined");
  // The layouts are the same on every rank: a refusal here is every rank's.
  const LinearHead head = linear_head(hidden, weight, op);
  const at::Tensor t = replicated_value(target, "target", op);
  LogprobsSaved saved;
  Logprobs out =
      vocab_parallel_linear_logprobs_forward(head.h, head.w, t, head.shard.comm, head.shard.total, options, &saved);
  if (head.weight_layout) out = replicated_on(head.weight_layout->mesh(), std::move(out));
  if (torch::autograd::GradMode::is_enabled() && (hidden.requires_grad() || weight.requires_grad())) {
    compat::NodePtr owner = compat::make_node<FusedLinearLogprobsBackward>();
    auto* node = static_cast<FusedLinearLogprobsBackward*>(owner.get());
    node->saved = std::move(saved);
    node->options = options;
    node->target = t;
    node->comm = head.shard.comm;
    node->hidden_layout = head.hidden_layout;
    node->weight_layout = head.weight_layout;
    node->entropy_output = out.entropy.defined();
    node->saved_hidden = torch::autograd::SavedVariable(hidden, /*is_output=*/false);
    node->saved_weight = torch::autograd::SavedVariable(weight, /*is_output=*/false);
    node->set_next_edges(torch::autograd::collect_next_edges(hidden, weight));
    torch::autograd::create_gradient_edge(out.logprobs, owner);
    if (out.entropy.defined()) torch::autograd::create_gradient_edge(out.entropy, std::move(owner));
  }
  return out;
}

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
  FusedCrossEntropy ce = logprobs_of(t, used);
  fused_cross_entropy_prepare(ce, h.size(0), shard, h.options().dtype(ct));
  const at::Tensor stats = call.refused()
                               ? at::zeros({ce_kernel::kStats, h.size(0)}, h.options().dtype(ct))
                               : linear_block_stats(ce, h, w, shard, blocks_of(used, h.size(0), w.size(0), dt));
  call.settle();
  const auto combined = fused_logprobs_combine(ce, stats, shard, call.inputs());
  return logprobs_results(ce, combined, dt, {h.size(0)}, shard.total, saved);
}

std::vector<at::Tensor> vocab_parallel_linear_logprobs_backward(
    const at::Tensor& grad_logprobs, const at::Tensor& grad_entropy, const at::Tensor& hidden,
    const at::Tensor& local_weight, const at::Tensor& target, const LogprobsSaved& saved, const Communicator* comm,
    int64_t vocab_size, const LogprobsOptions& options, bool hidden_grad, bool weight_grad) {
  TORCH_CHECK_VALUE(vocab_size >= 0, kLinearLogprobsOp, " backward: expected the vocabulary size forward used");
  // No collective but the hidden gradient's all-reduce: the piece follows from the size.
  const int64_t n = comm ? comm->size() : 1, r = comm ? comm->rank() : 0;
  const ChunkRange range = chunk_range(vocab_size, n, r);
  const ClassShard shard{comm, range.offset, range.length, vocab_size};
  const at::ScalarType dt = hidden.scalar_type();
  FusedCrossEntropy ce = logprobs_of(target.reshape({-1}).to(at::kLong), options);
  fused_cross_entropy_prepare(ce, hidden.size(0), shard, hidden.options().dtype(compute_type(dt)));
  ce.row_max = saved.row_max;
  ce.log_sum = saved.log_sum;
  const FusedCrossEntropyCoefficients co =
      fused_logprobs_coefficients(ce, saved.mean_difference, grad_logprobs, grad_entropy);
  at::NoGradGuard no_grad;
  const LinearBlocks blocks = blocks_of(options, hidden.size(0), local_weight.size(0), dt);
  auto [gh, gw] = linear_block_gradients(ce, co, hidden, local_weight, shard, blocks, hidden_grad, weight_grad);
  return {gh, gw};
}

}  // namespace hyper_parallel
