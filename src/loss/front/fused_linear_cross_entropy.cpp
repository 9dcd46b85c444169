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
#include "loss/call/loss_input_checks.h"

namespace hyper_parallel {

namespace {

using torch::autograd::Node;
using torch::autograd::variable_list;

constexpr const char* kOp = "fused_linear_cross_entropy";
// Where the inputs live and how the vocabulary is split, after validation.
struct Inputs {
  at::Tensor h, w, target;  // local pieces: [T, D], [V_l, D], [T] int64
  c10::optional<at::Tensor> class_weight;
  ClassShard shard;
  c10::optional<Layout> weight_layout, hidden_layout;  // set for DTensor inputs
};

// What validate() and local_inputs() both refuse: probability targets, indices that are not
// int64 or uint8, and gradients the loss does not give (of the target or the class weights).
void check_index_target_without_grads(const at::Tensor& target, const FusedLinearCrossEntropyOptions& o,
                                      const std::string& op) {
  if (target.is_floating_point()) {
    throw LossParallelUnsupportedError(op +
                                       ": probability targets are not supported (they are [tokens, V], "
                                       "what this loss exists to avoid); give class indices [tokens]");
  }
  // As PyTorch's cross_entropy and ours: class indices are int64 (or uint8), not int32.
  TORCH_CHECK(target.scalar_type() == at::kLong || target.scalar_type() == at::kByte, op,
              ": expected target dtype to be Long or Byte, but got ", target.scalar_type());
  check_no_target_or_weight_grad(target, o.class_weight, op);
}

// The options' ranges, for both kinds of input.
void check_options(const FusedLinearCrossEntropyOptions& o, const std::string& op) {
  check_cross_entropy_definition(o, op, OptionErrorKind::value_error);
  TORCH_CHECK_VALUE(o.chunk_tokens >= 0 && o.vocab_block >= 0, op,
                    ": chunk_tokens and vocab_block must be >= 0 (0: automatic), got ", o.chunk_tokens, " and ",
                    o.vocab_block);
}

Inputs validate(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& target,
                const FusedLinearCrossEntropyOptions& o) {
  const std::string op = kOp;
  TORCH_CHECK(hidden.defined() && weight.defined() && target.defined(), op,
              ": hidden, weight and target must be defined");
  const LinearHead head = linear_head(hidden, weight, op);
  Inputs in;
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
    TORCH_CHECK(cw.dim() == 1 && cw.size(0) == in.shard.total, op, ": expected a class weight of shape [",
                in.shard.total, "], got ", describe_input(*o.class_weight));
    check_class_weight_dtype(in.h.scalar_type(), cw, "hidden states", op);
    in.class_weight = cw.to(in.h.device(), compute_type(in.h.scalar_type()));
  }
  return in;
}

// Plain local pieces (vocab_parallel.h's style): hidden [T, D] and target [T] the same on
// every rank, weight [V_l, D] this rank's torch.chunk rows of the [V, D] head. Checks only:
// `in` gets the shard from `piece`.
Inputs local_inputs(const at::Tensor& hidden, const at::Tensor& local_weight, const at::Tensor& target,
                    const FusedLinearCrossEntropyOptions& o, const Communicator* comm, const VocabPiece& piece) {
  const std::string op = "vocab_parallel_linear_cross_entropy";
  Inputs in;
  in.h = hidden;
  in.w = local_weight;
  in.shard = ClassShard{comm, piece.offset, piece.local, piece.total};
  TORCH_CHECK_VALUE(local_weight.dim() == 2 && hidden.dim() == 2 && hidden.size(1) == local_weight.size(1), op,
                    ": expected hidden [tokens, dim] and this rank's weight rows [V_local, dim], got ", hidden.sizes(),
                    " and ", local_weight.sizes());
  TORCH_CHECK_VALUE(at::isFloatingType(hidden.scalar_type()) && hidden.scalar_type() == local_weight.scalar_type(), op,
                    ": expected hidden and weight of one floating dtype, got ", hidden.scalar_type(), " and ",
                    local_weight.scalar_type());
  TORCH_CHECK(hidden.device() == local_weight.device() && target.device() == hidden.device(), op,
              ": expected hidden, weight and target on one device, got ", hidden.device(), ", ", local_weight.device(),
              " and ", target.device());
  check_index_target_without_grads(target, o, op);
  TORCH_CHECK_VALUE(target.dim() == 1 && target.size(0) == hidden.size(0), op, ": expected a target [", hidden.size(0),
                    "] (one class per token of hidden), got ", target.sizes());
  in.target = target.to(at::kLong);
  check_targets(in.target, piece.total, o.ignore_index);
  check_options(o, op);
  if (o.class_weight && o.class_weight->defined()) {
    const at::Tensor& cw = *o.class_weight;
    TORCH_CHECK_VALUE(cw.dim() == 1 && cw.size(0) == piece.total, op, ": expected a class weight of shape [",
                      piece.total, "], got ", cw.sizes());
    check_class_weight_dtype(hidden.scalar_type(), cw, "hidden states", op);
    TORCH_CHECK(cw.device() == hidden.device(), op, ": the class weight is on ", cw.device(), ", hidden on ",
                hidden.device());
    in.class_weight = cw.to(compute_type(hidden.scalar_type()));
  }
  return in;
}

// The fused cross-entropy's settings and inputs for `in` (its per-row bookkeeping not done yet).
FusedCrossEntropy cross_entropy_of(const Inputs& in, const FusedLinearCrossEntropyOptions& options) {
  FusedCrossEntropy ce;
  ce.target = in.target;
  ce.weight = in.class_weight;
  ce.definition = options;
  return ce;
}

// The record agree_on_call compares for this loss: hidden's tokens, size and dtype, the
// target's kind and shape, this rank's `local_classes` of `vocab_size`, the options, the
// class weight.
LossCallRecord linear_call(const std::string& op, const at::Tensor& hidden, const at::Tensor& target,
                           int64_t local_classes, int64_t vocab_size, const FusedLinearCrossEntropyOptions& o,
                           const at::Tensor& class_weight) {
  LossCallRecord call;
  call.op = op;
  // hidden [tokens, dim] (undefined where this rank refused its inputs, which settles first).
  call.rows = hidden.defined() && hidden.dim() >= 1 ? hidden.size(0) : 0;
  call.dtype = static_cast<int64_t>(hidden.defined() ? hidden.scalar_type() : at::kFloat);
  // Ranks whose hidden sizes differ would combine statistics of different products, and
  // all-reduce hidden gradients of different sizes in backward.
  call.hidden_dim = hidden.defined() && hidden.dim() >= 1 ? hidden.size(-1) : -1;
  record_target(call, target, -1);
  call.vocab_size = vocab_size;
  call.local_classes = local_classes;
  call.definition = o;
  call.class_weight = class_weight;
  return call;
}

// Forward: the per-token statistics of this rank's classes, one logits block at a time, then
// the one all-gather (carrying `agreement`'s record when given) and the loss, compute type.
// `call`, when given, is settled between the two: its record travels while the blocks are computed.
at::Tensor linear_forward(FusedCrossEntropy& ce, const Inputs& in, const LinearBlocks& blocks,
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
std::pair<at::Tensor, at::Tensor> linear_backward(const FusedCrossEntropy& ce, const Inputs& in,
                                                  const LinearBlocks& blocks, const at::Tensor& grad_loss, bool want_h,
                                                  bool want_w) {
  const FusedCrossEntropyCoefficients co = fused_cross_entropy_coefficients(ce, grad_loss, in.shard);
  return linear_block_gradients(ce, co, in.h, in.w, in.shard, blocks, want_h, want_w);
}

// Everything backward needs: the inputs' local pieces, the per-token statistics, and the
// block sizes; no logits.
struct FusedLinearCrossEntropyBackward : Node {
  FusedCrossEntropy ce;
  Inputs in;
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
    in = Inputs{};
  }
};

}  // namespace

at::Tensor fused_linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& target,
                                      const FusedLinearCrossEntropyOptions& options) {
  // The checks ride in the call's record, which comes before the statistics' all-gather
  // (sized by tokens; one all-gather more): a refusal on one rank is the same error on every
  // rank, and ranks whose tokens, dtype, vocabulary or options differ are named.
  Inputs in;
  const InputAgreement agreement(kOp, target, [&] { in = validate(hidden, weight, target, options); });
  if (agreement.refused()) {
    // What a refusing rank still knows: the weight's group, so that it meets the others.
    const auto* impl = dtensor_impl(weight);
    const bool tp_head = impl && impl->layout().mesh().ndim() == 1;
    in.shard.comm = tp_head ? &impl->layout().mesh().comm(0) : nullptr;
  }
  const c10::Device device = !agreement.refused()   ? in.h.device()
                             : !hidden.defined()    ? c10::Device(c10::kCPU)
                             : dtensor_impl(hidden) ? local_of(hidden).device()
                                                    : hidden.device();
  // A refusal here is settled at once (the placeholders make no blocks); otherwise the record
  // travels while the blocks are computed.
  PendingCallAgreement call_agreement(linear_call(kOp, in.h, in.target, in.shard.local, in.shard.total, options,
                                                  in.class_weight.value_or(at::Tensor())),
                                      in.shard.comm, device, &agreement);
  if (agreement.refused()) call_agreement.settle();
  const at::ScalarType dt = in.h.scalar_type();
  const LinearBlocks blocks =
      linear_block_sizes(options.chunk_tokens, options.vocab_block, in.h.size(0), in.w.size(0), dt);
  FusedCrossEntropy ce = cross_entropy_of(in, options);
  at::Tensor loss = linear_forward(ce, in, blocks, nullptr, &call_agreement).to(options.loss_dtype.value_or(dt));
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
  // The call's record first; its all-gather also gives the members' class counts, so an
  // unknown vocabulary costs no collective of its own.
  const at::Tensor class_weight =
      options.class_weight && options.class_weight->defined() ? *options.class_weight : at::Tensor();
  const int64_t local_classes = local_weight.dim() == 2 ? local_weight.size(0) : 0;
  // A given vocabulary places this member's classes without them: the record then travels
  // while the blocks are computed.
  PendingCallAgreement call_agreement(linear_call(op, hidden, target, local_classes, vocab_size, options, class_weight),
                                      comm, hidden.device());
  VocabPiece piece;
  if (vocab_size < 0) piece = call_agreement.settle_learnt_vocabulary();
  Inputs in;
  // Every check inside the agreement: one rank's refusal is the same error on every rank.
  const InputAgreement agreement(op, target, [&] {
    if (vocab_size >= 0) piece = vocab_piece(comm, local_weight.size(0), vocab_size);
    in = local_inputs(hidden, local_weight, target, options, comm, piece);
  });
  if (agreement.refused()) {
    // Placeholders that touch nothing; the all-gather settles the refusal everywhere.
    in = Inputs{};
    in.h = hidden.dim() == 2 ? hidden : at::zeros({0, 0}, hidden.options());
    in.w = local_weight.dim() == 2 ? local_weight : at::zeros({0, in.h.size(1)}, hidden.options());
    in.target = at::full({in.h.size(0)}, options.ignore_index, hidden.options().dtype(at::kLong));
    in.shard = ClassShard{comm, 0, in.w.size(0), std::max<int64_t>(piece.total, in.w.size(0))};
  }
  const at::ScalarType dt = in.h.scalar_type();
  const LinearBlocks blocks =
      linear_block_sizes(options.chunk_tokens, options.vocab_block, in.h.size(0), in.w.size(0), dt);
  FusedCrossEntropy ce = cross_entropy_of(in, options);
  at::Tensor loss;
  {
    at::NoGradGuard no_grad;  // the caller owns the graph
    loss = linear_forward(ce, in, blocks, &agreement, &call_agreement).to(dt);
  }
  if (saved) {
    saved->row_max = ce.row_max;
    saved->log_sum = ce.log_sum;
    saved->row_weight = at::Tensor();
    saved->vocab_size = piece.total;
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
  Inputs in;
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
