// fused_linear_cross_entropy (include/hyper_parallel/loss/fused_linear_loss.h): the head matmul
// and the fused cross-entropy (fused_cross_entropy.h) one logits block at a time, with a
// custom autograd node that recomputes the blocks in backward.
#include "hyper_parallel/loss/fused_linear_loss.h"
#include "hyper_parallel/loss/vocab_parallel.h"

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
#include "loss/call/class_sharding.h"
#include "loss/kernel/cross_entropy_cpu_kernel.h"
#include "loss/math/cross_entropy_kernels.h"
#include "loss/math/fused_cross_entropy.h"
#include "loss/math/linear_blocks.h"
#include "loss/call/call_agreement.h"
#include "loss/call/input_agreement.h"
#include "loss/call/loss_call_plan.h"
#include "loss/front/fused_linear_inputs.h"
#include "loss/call/loss_input_checks.h"

namespace hyper_parallel {

namespace {

using torch::autograd::Node;
using torch::autograd::variable_list;

constexpr const char* kOp = "fused_linear_cross_entropy";
// The fused cross-entropy's settings and inputs for `in` (its per-row bookkeeping not done yet).
FusedCrossEntropy cross_entropy_of(const LinearLossInputs& in, const FusedLinearCrossEntropyOptions& options) {
  FusedCrossEntropy ce;
  ce.target = in.target;
  ce.weight = in.class_weight;
  ce.definition = options;
  return ce;
}

// The record agree_on_call compares for this loss: hidden's tokens, size and dtype, the
// target's kind and shape, the options, the class weight (LossCallPlan adds the classes).
LossCallRecord linear_call(const std::string& op, const at::Tensor& hidden, const at::Tensor& target,
                           const FusedLinearCrossEntropyOptions& o, const at::Tensor& class_weight) {
  LossCallRecord call;
  call.op = op;
  // hidden [tokens, dim] (undefined where this rank refused its inputs, which settles first).
  call.rows = hidden.defined() && hidden.dim() >= 1 ? hidden.size(0) : 0;
  call.dtype = static_cast<int64_t>(hidden.defined() ? hidden.scalar_type() : at::kFloat);
  // Ranks whose hidden sizes differ would combine statistics of different products, and
  // all-reduce hidden gradients of different sizes in backward.
  call.hidden_dim = hidden.defined() && hidden.dim() >= 1 ? hidden.size(-1) : -1;
  record_target(call, target, -1);
  call.definition = o;
  call.class_weight = class_weight;
  return call;
}

// Forward: the per-token statistics of this rank's classes, one logits block at a time, then
// the one all-gather (carrying `agreement`'s record when given) and the loss, compute type.
// `call`, when given, is settled between the two: its record travels while the blocks are computed.
at::Tensor linear_forward(FusedCrossEntropy& ce, const LinearLossInputs& in, const LinearBlocks& blocks,
                          const InputAgreement* agreement, PendingCallAgreement* call) {
  const at::ScalarType ct = compute_type(in.h.scalar_type());
  const int64_t T = in.h.size(0);
  fused_cross_entropy_prepare(ce, T, in.shard, in.h.options().dtype(ct));
  const at::Tensor stats = agreement && agreement->refused()
                               ? at::zeros({ce_kernel::kStats, T}, in.h.options().dtype(ct))
                               : linear_block_stats(ce, in.h, in.w, in.shard, blocks);
  if (call) call->settle();
  // The forward's one collective (an all-gather of 5 x tokens values), and the loss.
  return fused_cross_entropy_combine(ce, stats, in.shard, agreement);
}

// The gradients of hidden (summed over the ranks: one all-reduce) and of this rank's weight
// rows, local pieces, for the incoming loss gradient `grad_loss` (a plain tensor).
std::pair<at::Tensor, at::Tensor> linear_backward(const FusedCrossEntropy& ce, const LinearLossInputs& in,
                                                  const LinearBlocks& blocks, const at::Tensor& grad_loss, bool want_h,
                                                  bool want_w) {
  const FusedCrossEntropyCoefficients co = fused_cross_entropy_coefficients(ce, grad_loss, in.shard);
  return linear_block_gradients(ce, co, in.h, in.w, in.shard, blocks, want_h, want_w);
}

// Everything backward needs: the inputs' local pieces, the per-token statistics, and the
// block sizes; no logits.
struct FusedLinearCrossEntropyBackward : Node {
  FusedCrossEntropy ce;
  LinearLossInputs in;
  LinearBlocks blocks{1, 1};
  // Saved so that an in-place change of hidden or weight before backward raises.
  torch::autograd::SavedVariable saved_hidden, saved_weight;

  variable_list apply(variable_list&& grads) override {
    saved_hidden.unpack();
    saved_weight.unpack();
    const bool want_h = task_should_compute_output(0), want_w = task_should_compute_output(1);
    if (!grads[0].defined() || (!want_h && !want_w)) return {at::Tensor(), at::Tensor()};
    auto [gh, gw] = linear_backward(ce, in, blocks, full_value(grads[0]), want_h, want_w);
    at::Tensor grad_h, grad_w;
    if (want_h) grad_h = in.hidden_layout ? make_dtensor(gh, *in.hidden_layout) : gh;
    if (want_w) grad_w = in.weight_layout ? make_dtensor(gw, *in.weight_layout) : gw;
    return {grad_h, grad_w};
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
    call = linear_call(kOp, in.h, in.target, options, in.class_weight.value_or(at::Tensor()));
    const c10::Device device = in.h.defined()         ? in.h.device()
                               : !hidden.defined()    ? c10::Device(c10::kCPU)
                               : dtensor_impl(hidden) ? local_of(hidden).device()
                                                      : hidden.device();
    layout = placed_layout(in.shard, device);
  };
  LossCallPlan call(kOp, steps);
  // A refusal is settled at once (the placeholders make no blocks); otherwise the record
  // travels while the blocks are computed.
  if (call.refused()) call.settle();
  const at::ScalarType dt = in.h.scalar_type();
  const LinearBlocks blocks =
      linear_block_sizes(options.chunk_tokens, options.vocab_block, in.h.size(0), in.w.size(0), dt);
  FusedCrossEntropy ce = cross_entropy_of(in, options);
  at::Tensor loss = linear_forward(ce, in, blocks, nullptr, call.agreement()).to(options.loss_dtype.value_or(dt));
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

at::Tensor vocab_parallel_linear_cross_entropy_forward(const at::Tensor& hidden, const at::Tensor& local_weight,
                                                       const at::Tensor& target, const Communicator* comm,
                                                       int64_t vocab_size,
                                                       const FusedLinearCrossEntropyOptions& options,
                                                       VocabCrossEntropySaved* saved) {
  const std::string op = "vocab_parallel_linear_cross_entropy";
  const at::Tensor class_weight =
      options.class_weight && options.class_weight->defined() ? *options.class_weight : at::Tensor();
  const int64_t local_classes = local_weight.dim() == 2 ? local_weight.size(0) : 0;
  LinearLossInputs in;
  LossCallSteps steps;
  steps.describe = [&](LossCallRecord& call, ClassLayout& layout) {
    call = linear_call(op, hidden, target, options, class_weight);
    layout = ClassLayout{comm, local_classes, vocab_size, -1, hidden.device()};
  };
  steps.replicated = target;
  steps.checks = [&](const ClassShard& piece) { in = local_inputs(hidden, local_weight, target, options, piece); };
  steps.placeholders = [&] {
    in = LinearLossInputs{};
    std::tie(in.h, in.w, in.target) = linear_placeholders(hidden, local_weight, options.ignore_index);
  };
  LossCallPlan call(op, steps);
  in.shard = call.shard();
  const at::ScalarType dt = in.h.scalar_type();
  const LinearBlocks blocks =
      linear_block_sizes(options.chunk_tokens, options.vocab_block, in.h.size(0), in.w.size(0), dt);
  FusedCrossEntropy ce = cross_entropy_of(in, options);
  at::Tensor loss;
  {
    at::NoGradGuard no_grad;  // the caller owns the graph
    loss = linear_forward(ce, in, blocks, call.inputs(), call.agreement()).to(dt);
  }
  if (saved) {
    saved->row_max = ce.row_max;
    saved->log_sum = ce.log_sum;
    saved->row_weight = at::Tensor();
    saved->vocab_size = call.shard().total;
  }
  return loss;
}

std::vector<at::Tensor> vocab_parallel_linear_cross_entropy_backward(
    const at::Tensor& grad_loss, const at::Tensor& hidden, const at::Tensor& local_weight, const at::Tensor& target,
    const VocabCrossEntropySaved& saved, const Communicator* comm, int64_t vocab_size,
    const FusedLinearCrossEntropyOptions& options, bool hidden_grad, bool weight_grad) {
  TORCH_CHECK_VALUE(vocab_size >= 0,
                    "vocab_parallel_linear_cross_entropy backward: expected the vocabulary size forward used");
  const int64_t n = comm ? comm->size() : 1, r = comm ? comm->rank() : 0;
  const ChunkRange range = chunk_range(vocab_size, n, r);
  LinearLossInputs in;
  in.h = hidden;
  in.w = local_weight;
  in.target = target.to(at::kLong);
  in.shard = ClassShard{comm, range.offset, range.length, vocab_size};
  const at::ScalarType dt = hidden.scalar_type(), ct = compute_type(dt);
  if (options.class_weight && options.class_weight->defined()) in.class_weight = options.class_weight->to(ct);
  const LinearBlocks blocks =
      linear_block_sizes(options.chunk_tokens, options.vocab_block, hidden.size(0), local_weight.size(0), dt);
  FusedCrossEntropy ce = cross_entropy_of(in, options);
  fused_cross_entropy_prepare(ce, hidden.size(0), in.shard, hidden.options().dtype(ct));
  // What fused_cross_entropy_combine set, from forward's saved values (index targets only).
  ce.row_max = saved.row_max;
  ce.log_sum = saved.log_sum;
  ce.lse = saved.row_max + saved.log_sum;
  ce.ce_denominator = ce.row_weight.sum();
  ce.z_denominator = ce.valid.sum();
  at::NoGradGuard no_grad;
  auto [gh, gw] = linear_backward(ce, in, blocks, grad_loss, hidden_grad, weight_grad);
  return {gh, gw};
}

}  // namespace hyper_parallel
