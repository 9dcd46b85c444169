// vocab_parallel_log_softmax (vocab_parallel.h): the distributed log-softmax (K1) on this
// member's local logits and a communicator, and its backward (one all-reduce, no record).
#include <ATen/ATen.h>

#include <string>

#include "hyper_parallel/loss/vocab_parallel.h"
#include "loss/call/call_agreement.h"
#include "loss/call/loss_call_plan.h"
#include "loss/call/loss_input_checks.h"
#include "loss/call/vocab_pieces.h"
#include "loss/math/cross_entropy_kernels.h"

namespace hyper_parallel {

at::Tensor vocab_parallel_log_softmax(const at::Tensor& local, int64_t class_dim_in, const Communicator* comm,
                                      int64_t vocab_size, std::optional<at::ScalarType> out_dtype) {
  const std::string op = "vocab_parallel_log_softmax";
  const int64_t class_dim = logits_class_dim(local, class_dim_in, op);
  // The call's record before the all-reduces sized by rows (one all-gather more).
  LossCallRecord call;
  call.op = op;
  record_logits(call, local, class_dim);
  record_guard_cross_entropy_options(call);
  const ClassShard shard =
      agree_on_loss_call(call, ClassLayout{comm, local.size(class_dim), vocab_size, -1, local.device()});
  const at::Tensor rows = distributed_log_softmax(to_rows(local, class_dim), shard);
  return from_rows(rows.to(out_dtype.value_or(local.scalar_type())), local.sizes(), class_dim);
}

at::Tensor vocab_parallel_log_softmax_backward(const at::Tensor& grad, const at::Tensor& output, int64_t class_dim_in,
                                               const Communicator* comm, int64_t vocab_size,
                                               at::ScalarType input_dtype) {
  const int64_t class_dim = logits_class_dim(output, class_dim_in, "vocab_parallel_log_softmax backward");
  // The backward needs this member's classes and the group, not where its classes sit: a
  // vocabulary forward learnt (vocab_size < 0) costs no collective here.
  const ClassShard shard = vocab_size >= 0 ? vocab_shard(comm, output.size(class_dim), vocab_size)
                                           : ClassShard{comm, 0, output.size(class_dim), -1};
  const at::Tensor rows = distributed_log_softmax_backward(to_rows(grad, class_dim), to_rows(output, class_dim), shard);
  return from_rows(rows.to(input_dtype), output.sizes(), class_dim);
}

}  // namespace hyper_parallel
