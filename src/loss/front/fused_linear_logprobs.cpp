// fused_linear_logprobs (vocab_logprobs.h): the log-probabilities and entropy of hidden x the
// head's rows on DTensors (or plain tensors on one process), with the gradient node that runs
// the local backward on the saved statistics. The local pieces' forward and backward:
// vocab_parallel_linear_logprobs.cpp.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <string>

#include "compat/autograd_compat.h"
#include "dtensor/dtensor_impl.h"
#include "hyper_parallel/dtensor/dtensor.h"
#include "hyper_parallel/loss/vocab_logprobs.h"
#include "loss/call/class_sharding.h"
#include "loss/front/fused_linear_inputs.h"
#include "loss/math/fused_logprobs.h"
#include "loss/math/linear_blocks.h"

namespace hyper_parallel {

namespace {

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
    return head_gradients(g[0], g[1], want_h, want_w, hidden_layout, weight_layout);
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
  // The layouts are the same on every rank: a refusal here is every rank's.
  const LinearHead head = given_linear_head(hidden, weight, target, op, OptionErrorKind::value_error);
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

}  // namespace hyper_parallel
