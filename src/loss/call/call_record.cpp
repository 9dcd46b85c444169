// call_agreement.h's records of a call: what a front end writes into its LossCallRecord from
// its tensors and the loss_parallel context in force (the record the ranks then compare).
#include <ATen/ATen.h>

#include "hyper_parallel/loss/loss_parallel.h"
#include "loss/call/call_agreement.h"
#include "loss/call/class_sharding.h"

namespace hyper_parallel {

void record_guard_cross_entropy_options(LossCallRecord& call) {
  if (!is_loss_parallel_active()) return;
  const LossParallelOptions o = current_loss_parallel_options();
  call.definition.z_loss_weight = o.z_loss_weight;
  call.definition.logit_softcap = o.logit_softcap;
}

int64_t rows_over_class_dim(const at::Tensor& t, int64_t class_dim) {
  int64_t rows = 1;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (d != class_dim) rows *= t.size(d);
  }
  return rows;
}

void record_logits(LossCallRecord& call, const at::Tensor& local_logits, int64_t class_dim) {
  call.rows = rows_over_class_dim(local_logits, class_dim);
  call.dtype = static_cast<int64_t>(local_logits.scalar_type());
  call.class_dim = class_dim;
  call.logits_shape = local_logits.sizes().vec();
  if (class_dim >= 0 && class_dim < local_logits.dim()) {
    call.local_classes = local_logits.size(class_dim);
    call.logits_shape[class_dim] = -1;
  }
}

void record_target(LossCallRecord& call, const at::Tensor& target, int64_t class_dim) {
  if (!target.defined()) return;
  call.target_kind = target.is_floating_point() ? LossTargetKind::probability : LossTargetKind::index;
  call.target_shape = target.sizes().vec();
  if (call.target_kind == LossTargetKind::probability && class_dim >= 0 && class_dim < target.dim())
    call.target_shape[class_dim] = -1;
}

void record_context(LossCallRecord& call) {
  const bool active = is_loss_parallel_active();
  call.context = active ? LossContext::inside : LossContext::outside;
  call.strict = active && effective_strict(current_loss_parallel_options());
}

}  // namespace hyper_parallel
