// Cross-entropy with the loss terms on full (unsharded) logits, with ATen ops: what every
// sharded and fused path computes, for the paths that hold all the classes (the trainer's
// plain path) and as the reference to compare them with.
#pragma once

#include <ATen/core/Tensor.h>

#include "hyper_parallel/core/export.h"
#include "hyper_parallel/loss/cross_entropy_definition.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel {

// logits [N, C] (soft-capped here when definition.logit_softcap > 0), class-index target [N]:
// PyTorch's cross_entropy of the capped logits plus z_loss_weight * lse^2 of every row whose
// target is not ignore_index, reduced by definition.reduction (Mean: both divided by the
// number of counted rows, as PyTorch's cross_entropy divides).
at::Tensor cross_entropy_with_terms(const at::Tensor& logits, const at::Tensor& target,
                                    const CrossEntropyDefinition& definition);

}  // namespace hyper_parallel

HP_PUBLIC_END
