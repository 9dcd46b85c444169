// The loss_parallel route's log_softmax kernels (routed_loss_kernels.h): _log_softmax on
// class-sharded logits (K1: the distributed log-softmax, after the call's record) and its
// backward (one all-reduce, no record: autograd may run it outside the context).
#include <ATen/ATen.h>

#include "dtensor/dtensor_impl.h"
#include "hyper_parallel/dtensor/dtensor.h"
#include "loss/call/call_agreement.h"
#include "loss/call/class_sharding.h"
#include "loss/call/loss_call_plan.h"
#include "loss/math/cross_entropy_kernels.h"
#include "loss/front/routed_loss_kernels.h"

namespace hyper_parallel {

// _log_softmax(self, dim, half_to_float): K1.
bool routed_log_softmax_kernel(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 3);
  at::Tensor self = args[0].toTensor();
  const int64_t dim = c10::maybe_wrap_dim(args[1].toInt(), self.dim());
  const bool half_to_float = args[2].toBool();
  if (!is_class_sharded(self, dim)) return false;
  ClassSharding cs = resolve_class_sharding(&self, dim, "log_softmax", current_loss_parallel_options(),
                                            /*differentiable=*/false);
  const at::Tensor& local = local_of(self);
  // The call's record before the all-reduces sized by rows (one all-gather more).
  agree_on_loss_call(routed_call_record("log_softmax", local, dim, cs), placed_layout(cs.shard, local.device()));
  at::Tensor rows = distributed_log_softmax(to_rows(local, dim), cs.shard);
  const at::ScalarType out_type = half_to_float ? at::kFloat : local.scalar_type();
  at::Tensor out = from_rows(rows.to(out_type), local.sizes(), dim);
  torch::jit::drop(*stack, 3);
  stack->push_back(make_dtensor(out, cs.layout));
  return true;
}

// _log_softmax_backward_data(grad_output, output, dim, input_dtype): one all-reduce.
bool routed_log_softmax_backward_kernel(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 4);
  at::Tensor grad = args[0].toTensor();
  at::Tensor output = args[1].toTensor();
  const int64_t dim = c10::maybe_wrap_dim(args[2].toInt(), output.dim());
  const auto input_dtype = args[3].toScalarType();
  if (!is_class_sharded(output, dim)) return false;
  ClassSharding cs = backward_class_sharding(output, dim, "log_softmax backward");
  const at::Tensor& out_local = local_of(output);
  at::Tensor g = local_piece(grad, cs.layout);
  at::Tensor rows = distributed_log_softmax_backward(to_rows(g, dim), to_rows(out_local, dim), cs.shard);
  torch::jit::drop(*stack, 4);
  stack->push_back(make_dtensor(from_rows(rows.to(input_dtype), out_local.sizes(), dim), cs.layout));
  return true;
}

}  // namespace hyper_parallel
