// TrainContext: what the Trainer wraps the loss and its backward in —
// TorchTitan's get_train_context(enable_loss_parallel). Calling it yields a guard: a
// loss_parallel() guard when enabled, an empty one otherwise. The Validator takes the
// same context so that validation computes the loss the same way. It also carries the
// terms the loss adds to cross-entropy, which the loss_parallel guard applies itself.
#pragma once

#include <optional>

#include "hyper_parallel/loss/loss_parallel.h"
#include "hyper_parallel/loss/loss_terms.h"
#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel::train {

// [training] z_loss_weight, logit_softcap: the loss layer's LossTerms (loss_terms.h), the
// same meaning on every loss path.
using LossTerms = hyper_parallel::LossTerms;

class TrainContext {
 public:
  explicit TrainContext(bool enable_loss_parallel, LossTerms terms = {})
      : loss_parallel_(enable_loss_parallel), terms_(terms) {}
  // auto guard = ctx();  // active until `guard` goes out of scope
  std::optional<LossParallelGuard> operator()() const {
    std::optional<LossParallelGuard> guard;
    if (loss_parallel_) {
      LossParallelOptions options;
      static_cast<LossTerms&>(options) = terms_;
      guard.emplace(options);
    }
    return guard;
  }
  bool loss_parallel_enabled() const { return loss_parallel_; }
  const LossTerms& loss_terms() const { return terms_; }
  // Validation reports cross-entropy alone: the z-loss is a regulariser of training, the
  // soft-capping part of the model's logits.
  TrainContext for_validation() const {
    return TrainContext(loss_parallel_, LossTerms{.z_loss_weight = 0.0, .logit_softcap = terms_.logit_softcap});
  }

 private:
  bool loss_parallel_;
  LossTerms terms_;
};

inline TrainContext get_train_context(bool enable_loss_parallel, LossTerms terms = {}) {
  return TrainContext(enable_loss_parallel, terms);
}

}  // namespace hyper_parallel::train

HP_PUBLIC_END
