// vocab_parallel_logprobs (vocab_logprobs.h): the log-probabilities (and entropy) of
// class-sharded DTensor logits (or plain logits on one process), the target laid out as the
// logits' rows, with the gradient node that runs the local backward on the saved statistics.
// The local pieces' forward and backward: vocab_parallel_logprobs.cpp.
#include "hyper_parallel/loss/vocab_logprobs.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <string>

#include "compat/autograd_compat.h"
#include "dtensor/dtensor_impl.h"
#include "hyper_parallel/dtensor/dtensor.h"
#include "loss/call/class_sharding.h"
#include "loss/call/loss_input_checks.h"

namespace hyper_parallel {

namespace {

using torch::autograd::Node;
using torch::autograd::variable_list;

constexpr const char* kLogprobsDTensorOp = "vocab_parallel_logprobs";

// The gradient of the log-probabilities (and entropy) with respect to class-sharded logits:
// the local backward on the saved statistics, no collective.
struct LogprobsParallelBackward : Node {
  LogprobsSaved saved;
  LogprobsOptions options;
  at::Tensor target;
  const Communicator* comm = nullptr;
  c10::optional<Layout> layout;      // of the logits, when a DTensor
  c10::optional<Layout> row_layout;  // of the outputs, when a DTensor (the logits' rows)
  int64_t class_dim = -1;
  bool entropy_output = false;
  torch::autograd::SavedVariable saved_logits;

  variable_list apply(variable_list&& grads) override {
    const at::Tensor logits = saved_logits.unpack();
    // The outputs are laid out as the logits' rows: their gradients' pieces, no collective.
    auto piece = [&](const at::Tensor& g) { return row_layout ? local_piece(g, *row_layout) : full_value(g); };
    const at::Tensor g_lp = grads[0].defined() ? piece(grads[0]) : at::Tensor();
    const at::Tensor g_h = entropy_output && grads[1].defined() ? piece(grads[1]) : at::Tensor();
    if (!g_lp.defined() && !g_h.defined()) return {at::Tensor()};
    const at::Tensor local = layout ? local_of(logits) : logits;
    const at::Tensor grad =
        vocab_parallel_logprobs_backward(g_lp, g_h, local, class_dim, target, saved, comm, saved.vocab_size, options);
    return {layout ? make_dtensor(grad, *layout) : grad};
  }
  std::string name() const override { return "hyper_parallel::LogprobsParallelBackward"; }
  void release_variables() override {
    saved_logits.reset_data();
    saved = LogprobsSaved{};
  }
};

}  // namespace

Logprobs vocab_parallel_logprobs(const at::Tensor& logits_in, const at::Tensor& target,
                                 const LogprobsOptions& options) {
  at::Tensor logits = logits_in;
  const int64_t class_dim = logits_class_dim(logits, -1, kLogprobsDTensorOp);
  const bool distributed = dtensor_impl(logits) != nullptr;
  c10::optional<ClassSharding> cs;
  if (distributed) {
    cs = resolve_class_sharding(&logits, class_dim, kLogprobsDTensorOp, current_loss_parallel_options(),
                                /*differentiable=*/true);
  }
  const Communicator* comm = cs ? cs->shard.comm : nullptr;
  const at::Tensor local = cs ? local_of(logits) : logits;
  // Laid out as the logits' rows (loss_parallel's layout rules): this rank's piece.
  const at::Tensor local_target =
      cs ? laid_out_local(target, cs->row_placements(), cs->row_layout().shape(), "target", kLogprobsDTensorOp, *cs,
                          effective_strict(current_loss_parallel_options()))
         : replicated_value(target, "target", kLogprobsDTensorOp);
  LogprobsSaved saved;
  Logprobs out = vocab_parallel_logprobs_forward(local, class_dim, local_target, comm,
                                                 cs ? cs->shard.total : local.size(class_dim), options, &saved);
  if (cs) {
    const Layout rows = cs->row_layout();
    out.logprobs = make_dtensor(out.logprobs, rows);
    if (out.entropy.defined()) out.entropy = make_dtensor(out.entropy, rows);
  }
  if (torch::autograd::GradMode::is_enabled() && logits.requires_grad()) {
    compat::NodePtr owner = compat::make_node<LogprobsParallelBackward>();
    auto* node = static_cast<LogprobsParallelBackward*>(owner.get());
    node->saved = std::move(saved);
    node->options = options;
    node->target = local_target;
    node->comm = comm;
    if (cs) node->layout = cs->layout;
    if (cs) node->row_layout = cs->row_layout();
    node->class_dim = class_dim;
    node->entropy_output = out.entropy.defined();
    node->saved_logits = torch::autograd::SavedVariable(logits, /*is_output=*/false);
    node->set_next_edges(torch::autograd::collect_next_edges(logits));
    torch::autograd::create_gradient_edge(out.logprobs, owner);
    if (out.entropy.defined()) torch::autograd::create_gradient_edge(out.entropy, std::move(owner));
  }
  return out;
}

}  // namespace hyper_parallel
