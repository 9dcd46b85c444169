// cross_entropy_parallel_backward.h: the fused cross_entropy's gradient node, and its making.
#include "loss/front/cross_entropy_parallel_backward.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "compat/autograd_compat.h"
#include "dtensor/dtensor_impl.h"
#include "hyper_parallel/dtensor/dtensor.h"
#include "loss/math/cross_entropy_kernels.h"

namespace hyper_parallel {

torch::autograd::variable_list CrossEntropyParallelBackward::apply(torch::autograd::variable_list&& grads) {
  // Throws when the logits were modified in place, or released. (Not saved when the
  // gradient was written over them: their storage is the gradient.)
  if (!ce.gradient_in_forward) saved_logits.unpack();
  // (With it, nothing was saved: say what SavedVariable says once the graph is freed.)
  TORCH_CHECK(ce.lse.defined(),
              "Trying to backward through the graph a second time (or directly access saved "
              "tensors after they have already been freed). Specify retain_graph=True if you need to backward "
              "a second time.");
  if (!grads[0].defined()) return {at::Tensor()};
  // A per-row loss's gradient is laid out as its rows (this rank's piece, no collective); a
  // reduced loss's is its value (Replicate, as PyTorch's gradient of a Partial(sum) is).
  at::Tensor g = ce.definition.reduction == at::Reduction::None ? local_piece(grads[0], sharding.row_layout())
                                                                : full_value(grads[0]);
  if (mean_scale.defined()) g = g * mean_scale;
  const ClassShard& shard = sharding.shard;
  at::Tensor rows =
      ce.gradient_in_forward ? gradient_written_in_forward(g, shard) : fused_cross_entropy_backward(ce, g, shard);
  return {make_dtensor(from_rows(rows, local_shape, sharding.class_dim), sharding.layout)};
}

at::Tensor CrossEntropyParallelBackward::gradient_written_in_forward(const at::Tensor& grad_loss,
                                                                     const ClassShard& shard) {
  const at::Tensor& stored = ce.grad_rows;
  const char* op = "cross_entropy with gradient_in_forward";
  TORCH_CHECK(stored._version() == grad_version, op,
              ": the gradient written over the logits was modified in "
              "place after ",
              grad_applied.defined() ? "the first backward handed it out" : "the forward wrote it",
              "; turn gradient_in_forward off to use the logits' storage otherwise or to backward through this "
              "loss more than once");
  const int64_t rows = stored.size(0);
  const at::Tensor g =
      (ce.definition.reduction == at::Reduction::None ? grad_loss.reshape({-1}) : grad_loss.reshape({}).expand({rows}))
          .to(ce.lse.scalar_type());
  if (!grad_applied.defined()) {
    at::Tensor out = fused_cross_entropy_backward(ce, grad_loss, shard);  // in place
    grad_applied = g.clone();
    grad_version = stored._version();
    return out;
  }
  TORCH_CHECK(grad_applied.ne(0).logical_and(grad_applied.isfinite()).logical_or(g.eq(0)).all().item<bool>(), op,
              ": a second backward through this loss needs the first one's incoming gradient to be finite and "
              "nonzero wherever this one is nonzero (the first scaled the stored gradient in place, and a zero or "
              "non-finite scale cannot be undone); turn gradient_in_forward off to backward more than once");
  const at::Tensor ratio = at::where(g.eq(0), at::zeros_like(g), g / grad_applied);
  return (stored.to(g.scalar_type()) * ratio.unsqueeze(1)).to(stored.scalar_type());
}

void attach_cross_entropy_parallel_backward(const at::Tensor& out, const at::Tensor& logits, FusedCrossEntropy&& ce,
                                            const ClassSharding& sharding, const at::Tensor& mean_scale) {
  compat::NodePtr owner = compat::make_node<CrossEntropyParallelBackward>();
  auto* node = static_cast<CrossEntropyParallelBackward*>(owner.get());
  node->ce = std::move(ce);
  node->sharding = sharding;
  node->mean_scale = mean_scale;
  node->local_shape = local_of(logits).sizes().vec();
  if (node->ce.gradient_in_forward) node->grad_version = node->ce.grad_rows._version();
  if (!node->ce.gradient_in_forward) node->saved_logits = torch::autograd::SavedVariable(logits, /*is_output=*/false);
  at::Tensor input = logits;  // collect_next_edges takes its arguments by non-const reference
  node->set_next_edges(torch::autograd::collect_next_edges(input));
  at::Tensor loss = out;
  torch::autograd::create_gradient_edge(loss, std::move(owner));
}

void CrossEntropyParallelBackward::release_variables() {
  saved_logits.reset_data();
  ce = FusedCrossEntropy{};
  mean_scale = at::Tensor();
  grad_applied = at::Tensor();
}

}  // namespace hyper_parallel
