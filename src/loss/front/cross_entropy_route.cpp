// The cross_entropy_loss entry of loss_parallel (registered for AutogradPrivateUse1 by
// loss_parallel_routing.cpp): the whole loss reaches it before it decomposes, and goes to the
// fused cross_entropy_parallel under the context; outside it, class-sharded logits are refused
// (or gathered, where the configuration allows) after the record the ranks inside would send.
#include <ATen/ATen.h>
#include <ATen/core/Reduction.h>
#include <ATen/ops/cross_entropy_loss_compositeimplicitautograd_dispatch.h>
#include <c10/util/Exception.h>

#include <string>

#include "dtensor/dtensor_impl.h"
#include "hyper_parallel/dtensor/dtensor.h"
#include "hyper_parallel/loss/parallelism_config.h"
#include "loss/call/class_sharding.h"
#include "loss/front/loss_parallel_dispatch.h"
#include "loss/front/routed_loss_kernels.h"

namespace hyper_parallel {

// cross_entropy_loss(self, target, weight, reduction, ignore_index, label_smoothing),
// registered for AutogradPrivateUse1: the whole loss reaches us before it decomposes.
void routed_cross_entropy_loss(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 6);
  at::Tensor self = args[0].toTensor();
  at::Tensor target = args[1].toTensor();
  c10::optional<at::Tensor> weight = optional_tensor(args[2]);
  const int64_t reduction = args[3].toInt();
  const int64_t ignore_index = args[4].toInt();
  const double label_smoothing = args[5].toDouble();
  const int64_t class_dim = class_dim_of(self.dim());
  at::Tensor result;
  const bool sharded = is_class_sharded(self, class_dim);
  if (is_loss_parallel_active() && (sharded || effective_strict(current_loss_parallel_options()))) {
    result = cross_entropy_parallel(self, target, weight, reduction, ignore_index, label_smoothing);
  } else {
    if (sharded) {
      // First the record the ranks inside loss_parallel() send first: a context entered on
      // some ranks only is then the same named error on every rank (one small all-gather,
      // on this error or fallback path only).
      agree_outside_context(self, class_dim, "cross_entropy");
      if (!parallelism_config().loss_parallel_fallback_on_layout_error) {
        throw LossParallelLayoutError(
            "cross_entropy on logits sharded along the class dim (" + to_string(placements_of(self)) + " on " +
            mesh_of(self).str() +
            ") outside loss_parallel(): enter hyper_parallel::loss_parallel() "
            "(or the Trainer's train_context) around the loss and its backward, or set "
            "ParallelismConfig::loss_parallel_fallback_on_layout_error to all-gather the logits (slow)");
      }
      TORCH_WARN("cross_entropy outside loss_parallel(): all-gathering logits of shape ", self.sizes(), " sharded as ",
                 to_string(placements_of(self)), " (loss_parallel_fallback_on_layout_error is set)");
      self = redistribute(self, Placements(mesh_of(self).ndim(), Placement::replicate()));
    } else if (is_loss_parallel_active()) {
      TORCH_WARN_ONCE("loss_parallel (strict = false): logits are not sharded along the class dim (",
                      is_dtensor(self) ? to_string(placements_of(self)) : std::string("plain tensor"),
                      "); computing cross_entropy the ordinary way");
    }
    result = at::compositeimplicitautograd::cross_entropy_loss(self, target, weight, reduction, ignore_index,
                                                               label_smoothing);
  }
  torch::jit::drop(*stack, 6);
  stack->push_back(std::move(result));
}

}  // namespace hyper_parallel
