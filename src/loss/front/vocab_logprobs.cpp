// vocab_logprobs.h on logits: the fused cross-entropy's statistics at a temperature, with the
// entropy's sum (fused_logprobs.h has the math), on local pieces and on class-sharded DTensors.
#include "hyper_parallel/loss/vocab_logprobs.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <cmath>
#include <string>

#include "compat/autograd_compat.h"
#include "dtensor/dtensor_impl.h"
#include "hyper_parallel/dtensor/dtensor.h"
#include "hyper_parallel/loss/vocab_parallel.h"
#include "loss/call/call_agreement.h"
#include "loss/call/class_sharding.h"
#include "loss/kernel/cross_entropy_cpu_kernel.h"
#include "loss/math/cross_entropy_kernels.h"
#include "loss/math/fused_logprobs.h"
#include "loss/call/input_agreement.h"
#include "loss/call/loss_call_plan.h"
#include "loss/math/logits_device.h"

namespace hyper_parallel {

namespace {

using torch::autograd::Node;
using torch::autograd::variable_list;

constexpr const char* kLogprobsOp = "vocab_parallel_logprobs";

at::Tensor contiguous_class_rows(const at::Tensor& rows) {
  return rows.size(1) <= 1 || rows.stride(1) == 1 ? rows : rows.contiguous();
}

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

Logprobs vocab_parallel_logprobs_forward(const at::Tensor& local_logits, int64_t class_dim_in, const at::Tensor& target,
                                         const Communicator* comm, int64_t vocab_size, const LogprobsOptions& options,
                                         LogprobsSaved* saved) {
  const std::string op = kLogprobsOp;
  TORCH_CHECK_VALUE(local_logits.dim() >= 1, op, ": expected logits with a class dim, got a 0-dim tensor");
  const int64_t class_dim = c10::maybe_wrap_dim(class_dim_in, local_logits.dim());
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
  const at::Tensor stats = call.refused() ? at::zeros({ce_kernel::kStats, rows}, local_logits.options().dtype(ct))
                                          : fused_cross_entropy_block_stats(ce, ce.x_rows, 0, 0, shard);
  call.settle();
  const auto combined = fused_logprobs_combine(ce, stats, shard, call.inputs());
  return logprobs_results(ce, combined, local_logits.scalar_type(), out_shape, shard.total, saved);
}

at::Tensor vocab_parallel_logprobs_backward(const at::Tensor& grad_logprobs, const at::Tensor& grad_entropy,
                                            const at::Tensor& local_logits, int64_t class_dim_in,
                                            const at::Tensor& target, const LogprobsSaved& saved,
                                            const Communicator* comm, int64_t vocab_size,
                                            const LogprobsOptions& options) {
  const std::string op = std::string(kLogprobsOp) + " backward";
  TORCH_CHECK_VALUE(local_logits.dim() >= 1, op, ": expected logits with a class dim, got a 0-dim tensor");
  TORCH_CHECK_VALUE(vocab_size >= 0, op, ": expected the vocabulary size forward used");
  const int64_t class_dim = c10::maybe_wrap_dim(class_dim_in, local_logits.dim());
  // No collective: the piece follows from the size, which forward checked.
  const int64_t n = comm ? comm->size() : 1, r = comm ? comm->rank() : 0;
  const ChunkRange range = chunk_range(vocab_size, n, r);
  const ClassShard shard{comm, range.offset, range.length, vocab_size};
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

Logprobs vocab_parallel_logprobs(const at::Tensor& logits_in, const at::Tensor& target,
                                 const LogprobsOptions& options) {
  at::Tensor logits = logits_in;
  TORCH_CHECK_VALUE(logits.dim() >= 1, kLogprobsOp, ": expected logits with a class dim, got a 0-dim tensor");
  const int64_t class_dim = logits.dim() - 1;
  const bool distributed = dtensor_impl(logits) != nullptr;
  c10::optional<ClassSharding> cs;
  if (distributed) {
    cs = resolve_class_sharding(&logits, class_dim, kLogprobsOp, current_loss_parallel_options(),
                                /*differentiable=*/true);
  }
  const Communicator* comm = cs ? cs->shard.comm : nullptr;
  const at::Tensor local = cs ? local_of(logits) : logits;
  // Laid out as the logits' rows (loss_parallel's layout rules): this rank's piece.
  const at::Tensor local_target =
      cs ? laid_out_local(target, cs->row_placements(), cs->row_layout().shape(), "target", kLogprobsOp, *cs,
                          effective_strict(current_loss_parallel_options()))
         : replicated_value(target, "target", kLogprobsOp);
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
