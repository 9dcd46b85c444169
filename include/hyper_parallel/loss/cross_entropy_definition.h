// What a cross-entropy computes, the same for every loss front end: PyTorch's cross_entropy
// arguments and the two terms training adds (z-loss, logit soft-capping). The front ends'
// option structs (VocabCrossEntropyOptions, FusedLinearCrossEntropyOptions) are this
// definition plus how they run; under loss_parallel the call gives the first three fields and
// the guard (LossParallelOptions) the last two.
#pragma once

#include <ATen/core/Reduction.h>

#include <cstdint>

#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel {

struct CrossEntropyDefinition {
  // Class-index targets equal to it are not counted. Probability targets: PyTorch's rule,
  // a negative value (the default included) has no effect, one >= 0 is refused.
  int64_t ignore_index = -100;
  int64_t reduction = at::Reduction::Mean;  // at::Reduction: None, Mean or Sum
  double label_smoothing = 0.0;             // in [0, 1]
  // z-loss (PaLM, TorchTitan): + z_loss_weight * lse^2 for every counted row, not scaled by
  // class weights; with Mean divided by the number of counted rows. >= 0.
  double z_loss_weight = 0.0;
  // > 0: every logit x becomes cap * tanh(x / cap) before the softmax (Gemma 2); 0: off.
  double logit_softcap = 0.0;
};

}  // namespace hyper_parallel

HP_PUBLIC_END
