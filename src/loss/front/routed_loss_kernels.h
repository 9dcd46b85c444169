// The loss_parallel route's per-op kernels (internal): log_softmax (K1), nll_loss (K2) and
// their backwards on class-sharded DTensors, by the kernel names the op specs bind ops to
// (ops/*.yaml, `loss_parallel: <kernel>`). loss_parallel_routing.cpp routes to them.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/Optional.h>

#include <functional>
#include <map>
#include <string>

namespace hyper_parallel {

struct LossKernel {
  std::function<bool(const c10::OperatorHandle&, torch::jit::Stack*)> run;
  // Backward kernels are picked by the layout of their inputs, not by the context: only a
  // forward under loss_parallel produces class-sharded log-probs for them, and autograd
  // may run them on another thread or after the guard is gone.
  bool backward;
};

// By kernel name.
const std::map<std::string, LossKernel>& routed_loss_kernels();

// For a loss on class-sharded `logits` outside loss_parallel(): the call's record, as the ranks
// inside it would make it but for the context, over the group sharding the classes.
void agree_outside_context(const at::Tensor& logits, int64_t class_dim, const std::string& op);

// An optional tensor argument of a boxed call (None or undefined: none).
c10::optional<at::Tensor> optional_tensor(const c10::IValue& v);

}  // namespace hyper_parallel
