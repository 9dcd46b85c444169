// What a cross-entropy computes, the same for every loss front end: PyTorch's cross_entropy
// arguments and the two terms training adds (LossTerms: z-loss, logit soft-capping). The front
// ends' option structs (VocabCrossEntropyOptions, FusedLinearCrossEntropyOptions) are this
// definition plus how they run; under loss_parallel the call gives the three fields below and
// the guard (LossParallelOptions, also a LossTerms) the terms.
#pragma once

#include <ATen/core/Reduction.h>

#include <cstdint>

#include "hyper_parallel/core/export.h"
#include "hyper_parallel/loss/loss_terms.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel {

struct CrossEntropyDefinition : LossTerms {
  // Class-index targets equal to it are not counted. Probability targets: PyTorch's rule,
  // a negative value (the default included) has no effect, one >= 0 is refused.
  int64_t ignore_index = -100;
  int64_t reduction = at::Reduction::Mean;  // at::Reduction: None, Mean or Sum
  double label_smoothing = 0.0;             // in [0, 1]
};

}  // namespace hyper_parallel

HP_PUBLIC_END
