// routed_loss_kernels.h: the loss_parallel route's kernel table, and what its kernels share (the
// record of a routed call, the sharding a backward input had). The kernels: routed_log_softmax.cpp
// (K1), routed_nll_loss.cpp (K2).
#include "loss/front/routed_loss_kernels.h"

#include <ATen/ATen.h>

#include "dtensor/dtensor_impl.h"
#include "hyper_parallel/dtensor/dtensor.h"
#include "loss/call/call_agreement.h"

namespace hyper_parallel {

const std::map<std::string, LossKernel>& routed_loss_kernels() {
  static const auto* k = new std::map<std::string, LossKernel>{
      {"log_softmax", {routed_log_softmax_kernel, false}},
      {"log_softmax_backward", {routed_log_softmax_backward_kernel, true}},
      {"nll_forward", {routed_nll_forward_kernel, false}},
      {"nll_backward", {routed_nll_backward_kernel, true}},
  };
  return *k;
}

void agree_outside_context(const at::Tensor& logits, int64_t class_dim, const std::string& op) {
  const auto* impl = dtensor_impl(logits);
  const Layout& layout = impl->layout();
  const auto dims = layout.mesh_dims_sharding(class_dim);
  LossCallRecord call;
  call.op = op;
  record_logits(call, impl->local(), class_dim);
  record_context(call);  // outside
  call.vocab_size = layout.shape()[class_dim];
  agree_on_call(call, &layout.mesh().comm(dims.back()), impl->local().device());
}

c10::optional<at::Tensor> optional_tensor(const c10::IValue& v) {
  if (v.isNone()) return c10::nullopt;
  const at::Tensor& t = v.toTensor();
  return t.defined() ? c10::optional<at::Tensor>(t) : c10::nullopt;
}

ClassSharding backward_class_sharding(const at::Tensor& t, int64_t class_dim, const std::string& op) {
  at::Tensor copy = t;
  LossParallelOptions lenient;
  lenient.strict = false;
  return resolve_class_sharding(&copy, class_dim, op, lenient, /*differentiable=*/false);
}

LossCallRecord routed_call_record(const std::string& op, const at::Tensor& local, int64_t class_dim,
                                  const ClassSharding& cs) {
  LossCallRecord call;
  call.op = op;
  record_logits(call, local, class_dim);
  call.vocab_size = cs.shard.total;
  call.local_classes = cs.shard.local;
  record_context(call);
  record_guard_cross_entropy_options(call);
  return call;
}

}  // namespace hyper_parallel
