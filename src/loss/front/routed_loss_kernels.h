// The loss_parallel route's per-op kernels (internal): log_softmax (K1), nll_loss (K2) and
// their backwards on class-sharded DTensors, by the kernel names the op specs bind ops to
// (ops/*.yaml, `loss_parallel: <kernel>`). loss_parallel_routing.cpp routes to them; each
// kernel family has its file (routed_log_softmax.cpp, routed_nll_loss.cpp), the table and what
// they share are in routed_loss_kernels.cpp.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/Optional.h>

#include <functional>
#include <map>
#include <string>

#include "loss/call/call_agreement.h"
#include "loss/call/class_sharding.h"

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

// The kernels (boxed; false: the input is not class-sharded, the ordinary rule takes the call).
// _log_softmax(self, dim, half_to_float) and _log_softmax_backward_data(grad_output, output,
// dim, input_dtype).
bool routed_log_softmax_kernel(const c10::OperatorHandle&, torch::jit::Stack* stack);
bool routed_log_softmax_backward_kernel(const c10::OperatorHandle&, torch::jit::Stack* stack);
// nll_loss_forward / nll_loss2d_forward(self, target, weight, reduction, ignore_index) and
// nll_loss_backward / nll_loss2d_backward(grad_output, self, target, weight, reduction,
// ignore_index, total_weight).
bool routed_nll_forward_kernel(const c10::OperatorHandle&, torch::jit::Stack* stack);
bool routed_nll_backward_kernel(const c10::OperatorHandle&, torch::jit::Stack* stack);

// For a loss on class-sharded `logits` outside loss_parallel(): the call's record, as the ranks
// inside it would make it but for the context, over the group sharding the classes.
void agree_outside_context(const at::Tensor& logits, int64_t class_dim, const std::string& op);

// An optional tensor argument of a boxed call (None or undefined: none).
c10::optional<at::Tensor> optional_tensor(const c10::IValue& v);

// A backward input: the sharding its forward had (no option checks: forward did them).
ClassSharding backward_class_sharding(const at::Tensor& t, int64_t class_dim, const std::string& op);

// The record agree_on_call compares for a routed op on class-sharded `local` (with the
// guard's cross-entropy-only options, so that a guard that differs between ranks is named
// rather than refused on some ranks only).
LossCallRecord routed_call_record(const std::string& op, const at::Tensor& local, int64_t class_dim,
                                  const ClassSharding& cs);

}  // namespace hyper_parallel
