#include "hyper_parallel/loss/plain_cross_entropy.h"

#include <ATen/ATen.h>

namespace hyper_parallel {

at::Tensor cross_entropy_with_terms(const at::Tensor& logits, const at::Tensor& target,
                                    const CrossEntropyDefinition& definition) {
  const double cap = definition.logit_softcap;
  const at::Tensor y = cap > 0 ? at::tanh(logits / cap) * cap : logits;
  const at::Tensor loss = at::cross_entropy_loss(y, target, /*weight=*/{}, definition.reduction,
                                                 definition.ignore_index, definition.label_smoothing);
  if (definition.z_loss_weight == 0) return loss;
  const at::Tensor counted = target.ne(definition.ignore_index).to(y.scalar_type());
  const at::Tensor z_rows = at::logsumexp(y, {-1}).square() * counted;
  switch (definition.reduction) {
    case at::Reduction::None:
      return loss + definition.z_loss_weight * z_rows;
    case at::Reduction::Sum:
      return loss + definition.z_loss_weight * z_rows.sum();
    default:
      return loss + definition.z_loss_weight * z_rows.sum() / counted.sum();
  }
}

}  // namespace hyper_parallel
