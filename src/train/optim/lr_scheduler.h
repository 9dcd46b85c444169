// lr_scheduler.h — hp-train's learning-rate schedule: TorchTitan's warm-up-stable-decay
// (torchtitan/components/optimizer/lr_scheduler.py), from the same [lr_scheduler] keys and
// with the same step convention, so that a TorchTitan job's schedule is hp-train's.
//
// Over T = training.steps: W = warmup_steps (cut to T), D = round(T x decay_ratio) (half to
// even, as Python's round; cut to T - W) decay steps and S = T + 1 - W - D stable ones. The
// + 1 is TorchTitan's virtual last step: the last step does not run at the final lr.
// TorchTitan's LambdaLR evaluates its factor at i = step - 1 (the scheduler starts at 0 and
// steps after each optimizer step):
//   i < W          (i + 1) / W                             warm-up: lr reached at step W
//   i < W + S      1                                       stable
//   otherwise      m + (1 - m) x curve(p), p = (i + 1 - W - S) / D, m = min_lr_factor
// curve: linear 1 - p, sqrt 1 - sqrt(p), cosine (1 + cos(pi p)) / 2. decay_ratio 1 is
// TorchTitan's None (decay right after warm-up: D = T - W, S = 1).
#pragma once

#include <cstdint>
#include <string>

#include "hyper_parallel_train/config/job_config.h"

namespace hyper_parallel::train {

enum class LrDecayType { linear, sqrt, cosine };

class WarmupStableDecay {
 public:
  // An unknown decay_type, or a decay_ratio or min_lr_factor outside [0, 1], is a
  // std::invalid_argument naming the key (validate() reports them first).
  WarmupStableDecay(const LrSchedulerConfig& config, int64_t total_steps);

  // The multiple of training.lr that step `step` (from 1) runs at.
  double factor(int64_t step) const;

  int64_t warmup_steps() const { return warmup_; }
  int64_t stable_steps() const { return stable_; }
  int64_t decay_steps() const { return decay_; }
  // lr_scheduler.warmup_steps exceeded the total and was cut to it (TorchTitan warns).
  bool warmup_cut() const { return warmup_ != requested_warmup_; }

  // For the start-up log, e.g. "warm-up to 0.003 over steps 1-5, held through step 6,
  // cosine decay over steps 7-60 towards 0.1 x lr".
  std::string describe(double lr) const;

 private:
  int64_t total_;
  int64_t requested_warmup_;
  int64_t warmup_;
  int64_t stable_;
  int64_t decay_;
  LrDecayType type_;
  std::string type_name_;
  double min_factor_;
};

}  // namespace hyper_parallel::train
