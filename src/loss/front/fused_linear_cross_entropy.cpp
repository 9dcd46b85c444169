// fused_linear_cross_entropy (include/hyper_parallel/loss/fused_linear_loss.h): the head matmul
// and the fused cross-entropy on DTensors (or plain tensors on one process), one logits block at
// a time (fused_linear_pass.h), with a custom autograd node that recomputes the blocks in
// backward. Its function on local pieces: vocab_parallel_linear_cross_entropy.cpp.
#include "hyper_parallel/loss/fused_linear_loss.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <string>

#include "compat/autograd_compat.h"
#include "dtensor/dtensor_impl.h"
#include "hyper_parallel/dtensor/dtensor.h"
#include "loss/call/loss_call_plan.h"
#include "loss/front/fused_linear_inputs.h"
#include "loss/front/fused_linear_pass.h"

namespace hyper_parallel {

namespace {

constexpr const char* kFusedLinearCrossEntropyOp = "fused_linear_cross_entropy";

// Everything backward needs: the inputs' local pieces, the per-token statistics, and the
// block sizes; no logits.
struct FusedLinearCrossEntropyBackward : torch::autograd::Node {
  FusedCrossEntropy ce;
  LinearLossInputs in;
  LinearBlocks blocks{1, 1};
  // Saved so that an in-place change of hidden or weight before backward raises.
  torch::autograd::SavedVariable saved_hidden, saved_weight;

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    saved_hidden.unpack();
    saved_weight.unpack();
    const bool want_h = task_should_compute_output(0), want_w = task_should_compute_output(1);
    if (!grads[0].defined() || (!want_h && !want_w)) return {at::Tensor(), at::Tensor()};
    auto [gh, gw] = linear_cross_entropy_backward(ce, in, blocks, full_value(grads[0]), want_h, want_w);
    return head_gradients(gh, gw, want_h, want_w, in.hidden_layout, in.weight_layout);
  }
  std::string name() const override { return "hyper_parallel::FusedLinearCrossEntropyBackward"; }
  void release_variables() override {
    saved_hidden.reset_data();
    saved_weight.reset_data();
    ce = FusedCrossEntropy{};
    in = LinearLossInputs{};
  }
};

}  // namespace

at::Tensor fused_linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& target,
                                      const FusedLinearCrossEntropyOptions& options) {
  // The checks ride in the call's record, which comes before the statistics' all-gather
  // (sized by tokens; one all-gather more): a refusal on one rank is the same error on every
  // rank, and ranks whose tokens, dtype, vocabulary or options differ are named.
  LinearLossInputs in;
  LossCallSteps steps;
  steps.verdict = CheckVerdict::in_record;
  steps.replicated = target;
  steps.checks = [&](const ClassShard&) { in = validate_inputs(hidden, weight, target, options); };
  steps.placeholders = [&] {
    // What a refusing rank still knows: the weight's group, so that it meets the others.
    const auto* impl = dtensor_impl(weight);
    const bool tp_head = impl && impl->layout().mesh().ndim() == 1;
    in.shard.comm = tp_head ? &impl->layout().mesh().comm(0) : nullptr;
  };
  steps.after_checks = [&](LossCallRecord& call, ClassLayout& layout) {
    call = linear_call_record(kFusedLinearCrossEntropyOp, in.h, in.target, options,
                              in.class_weight.value_or(at::Tensor()));
    const c10::Device device = in.h.defined()         ? in.h.device()
                               : !hidden.defined()    ? c10::Device(c10::kCPU)
                               : dtensor_impl(hidden) ? local_of(hidden).device()
                                                      : hidden.device();
    layout = placed_layout(in.shard, device);
  };
  LossCallPlan call(kFusedLinearCrossEntropyOp, steps);
  // A refusal is settled at once (the placeholders make no blocks); otherwise the record
  // travels while the blocks are computed.
  if (call.refused()) call.settle();
  const at::ScalarType dt = in.h.scalar_type();
  const LinearBlocks blocks = linear_cross_entropy_blocks(options, in);
  FusedCrossEntropy ce = linear_cross_entropy_settings(in, options);
  at::Tensor loss = linear_cross_entropy_forward(ce, in, blocks, call).to(options.loss_dtype.value_or(dt));
  if (in.weight_layout) {
    const DeviceMesh& mesh = in.weight_layout->mesh();
    std::vector<int64_t> shape = loss.sizes().vec();
    loss = make_dtensor(loss, Layout(mesh, Placements(mesh.ndim(), Placement::replicate()), shape));
  }
  const bool wants_grad = torch::autograd::GradMode::is_enabled() && (hidden.requires_grad() || weight.requires_grad());
  if (wants_grad) {
    compat::NodePtr owner = compat::make_node<FusedLinearCrossEntropyBackward>();
    auto* node = static_cast<FusedLinearCrossEntropyBackward*>(owner.get());
    node->ce = std::move(ce);
    node->in = std::move(in);
    node->blocks = blocks;
    node->saved_hidden = torch::autograd::SavedVariable(hidden, /*is_output=*/false);
    node->saved_weight = torch::autograd::SavedVariable(weight, /*is_output=*/false);
    node->set_next_edges(torch::autograd::collect_next_edges(hidden, weight));
    torch::autograd::create_gradient_edge(loss, std::move(owner));
  }
  return loss;
}

}  // namespace hyper_parallel
