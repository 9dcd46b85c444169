// The loss_parallel route's nll_loss backward kernel (routed_loss_kernels.h): nll_loss_backward
// and nll_loss2d_backward on class-sharded log-probs, local and with no collective (autograd may
// run it outside the context: it is picked by its input's layout).
#include <ATen/ATen.h>
#include <ATen/core/Reduction.h>

#include <string>

#include "dtensor/dtensor_impl.h"
#include "hyper_parallel/dtensor/dtensor.h"
#include "loss/call/class_sharding.h"
#include "loss/math/cross_entropy_kernels.h"
#include "loss/front/routed_loss_kernels.h"

namespace hyper_parallel {

// nll_loss_backward / nll_loss2d_backward(grad_output, self, target, weight, reduction,
// ignore_index, total_weight): local, no collective.
bool routed_nll_backward_kernel(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 7);
  at::Tensor self = args[1].toTensor();
  const int64_t class_dim = class_dim_of(self.dim());
  if (!is_class_sharded(self, class_dim)) return false;
  const std::string op = "nll_loss backward";
  ClassSharding cs = backward_class_sharding(self, class_dim, op);
  const int64_t reduction = args[4].toInt();
  const Layout row_layout = cs.row_layout();
  // A per-row loss's gradient is laid out as its rows (this rank's piece); a reduced loss's is
  // its value (Replicate, as PyTorch's gradient of a Partial(sum)).
  at::Tensor grad =
      reduction == at::Reduction::None ? local_piece(args[0].toTensor(), row_layout) : full_value(args[0].toTensor());
  at::Tensor target = laid_out_local(args[2].toTensor(), row_layout.placements(), row_layout.shape(), "target", op, cs,
                                     /*strict=*/false);
  c10::optional<at::Tensor> weight = optional_tensor(args[3]);
  if (weight) weight = replicated_value(*weight, "class weight", op);
  const at::Tensor& local = local_of(self);
  const int64_t rows = to_rows(local, class_dim).size(0);
  // The total weight only 'mean' reads: the forward's, replicated (the global one for the
  // global mean), so this rank's copy, without a collective.
  const at::Tensor& tw = args[6].toTensor();
  at::Tensor g = nll_backward_rows(grad, rows, target.reshape({-1}), weight, reduction, args[5].toInt(),
                                   dtensor_impl(tw) ? local_of(tw) : tw, local.scalar_type(), cs.shard);
  torch::jit::drop(*stack, 7);
  stack->push_back(make_dtensor(from_rows(g, local.sizes(), class_dim), cs.layout));
  return true;
}

}  // namespace hyper_parallel
