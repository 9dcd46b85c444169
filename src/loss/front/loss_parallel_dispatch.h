// dispatch_loss_parallel and the cross-entropy entry points (internal).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/Optional.h>

#include <string>
#include <vector>

namespace hyper_parallel {

// Routing (docs/design.md, "Routing"): handles a routed op on a class-sharded input. Returns false
// when the call is not class-sharded after all (the ordinary path then takes it).
bool dispatch_loss_parallel(const c10::OperatorHandle& op, const std::string& name, torch::jit::Stack* stack);

// The fused, exact cross_entropy on class-sharded DTensor logits: Replicate loss,
// one custom autograd node whose backward needs no collective and no context.
at::Tensor cross_entropy_parallel(const at::Tensor& logits, const at::Tensor& target,
                                  const c10::optional<at::Tensor>& weight, int64_t reduction, int64_t ignore_index,
                                  double label_smoothing);

// Removes names that register_loss_parallel_op_names added (a test's, so that later tests
// see the built-in table). A built-in name is refused (c10::ValueError).
void unregister_loss_parallel_op_names(const std::vector<std::string>& names);

// Registers the loss_parallel route in OpDispatcher and the cross_entropy_loss kernel
// (once).
void ensure_loss_parallel_registered();

}  // namespace hyper_parallel
