// non_finite_steps.h — what the training loop does with a step whose loss or gradient norm
// is not finite (NaN or an infinity).
//
// Both values are already reduced over every rank (the loss over the replicas, the norm
// over every mesh dim), so every rank decides the same at the same step. Such a step is
// never applied (Trainer::train_step leaves the weights and the optimizer state as they
// were); this policy then says whether training goes on: by default it stops at once,
// with an error naming the step and what was not finite, before anything of the step is
// checkpointed. training.max_skipped_steps = N > 0 skips such steps instead (the batch
// is consumed, the learning-rate schedule moves on) until more than N come in a row.
#pragma once

#include <cstdint>
#include <string>

namespace hyper_parallel::train {

class NonFiniteSteps {
 public:
  explicit NonFiniteSteps(int64_t max_consecutive_skips) : max_(max_consecutive_skips) {}

  // Called after every step with its (reduced) loss and gradient norm. Returns true when
  // the step was not finite and is skipped, false when it was finite; throws
  // std::runtime_error (the same on every rank) when training must stop.
  bool check(int64_t step, double loss, double grad_norm);

  // Steps skipped so far in this run, and in a row up to the last step checked.
  int64_t skipped() const { return skipped_; }
  int64_t consecutive() const { return consecutive_; }

 private:
  int64_t max_;
  int64_t skipped_ = 0;
  int64_t consecutive_ = 0;
  bool finite_seen_ = false;  // a step of this run was finite
};

// "the loss is NaN and the gradient norm is inf"; "" when both are finite.
std::string describe_non_finite(double loss, double grad_norm);

}  // namespace hyper_parallel::train
