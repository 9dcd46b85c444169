// The two terms training adds to cross-entropy (z-loss, logit soft-capping), written once:
// CrossEntropyDefinition and LossParallelOptions derive from it, the trainer carries it, and
// cross_entropy_with_terms (plain_cross_entropy.h) is their arithmetic on full logits.
#pragma once

#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel {

struct LossTerms {
  // z-loss (PaLM, TorchTitan): + z_loss_weight * lse^2 for every counted row, not scaled by
  // class weights; with Mean divided by the number of counted rows. >= 0.
  double z_loss_weight = 0.0;
  // > 0: every logit x becomes cap * tanh(x / cap) before the softmax (Gemma 2); 0: off.
  double logit_softcap = 0.0;
};

}  // namespace hyper_parallel

HP_PUBLIC_END
