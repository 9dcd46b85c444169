// The loss_parallel route's entry points (internal): the dispatch of a routed op, the op-name
// table it claims, and the cross-entropy entries.
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

// Whether the loss_parallel route claims op `name` (loss_parallel_op_names() holds it).
bool is_loss_parallel_op_name(const std::string& name);

// cross_entropy_loss(self, target, weight, reduction, ignore_index, label_smoothing), boxed:
// registered for AutogradPrivateUse1, so that the whole loss reaches loss_parallel before it
// decomposes (cross_entropy_route.cpp).
void routed_cross_entropy_loss(const c10::OperatorHandle& op, torch::jit::Stack* stack);

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
