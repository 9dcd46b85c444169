// TrainContext: what the Trainer wraps the loss and its backward in —
// TorchTitan's get_train_context(enable_loss_parallel). Calling it yields a guard: a
// loss_parallel() guard when enabled, an empty one otherwise. The Validator takes the
// same context so that validation computes the loss the same way.
#pragma once

#include <optional>

#include "hyper_parallel/loss_parallel.h"

namespace hyper_parallel::train {

class TrainContext {
 public:
  explicit TrainContext(bool enable_loss_parallel) : loss_parallel_(enable_loss_parallel) {}
  // auto guard = ctx();  // active until `guard` goes out of scope
  std::optional<LossParallelGuard> operator()() const {
    std::optional<LossParallelGuard> guard;
    if (loss_parallel_) guard.emplace();
    return guard;
  }
  bool loss_parallel_enabled() const { return loss_parallel_; }

 private:
  bool loss_parallel_;
};

inline TrainContext get_train_context(bool enable_loss_parallel) { return TrainContext(enable_loss_parallel); }

}  // namespace hyper_parallel::train
