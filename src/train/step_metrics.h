// step_metrics.h — what one training step measured (StepResult), how its phases are timed
// (PhaseClock, StepMeter), and its line of metrics.jsonl (metrics_record).
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>

namespace hyper_parallel::train {

// One phase of a training step on this rank: its wall time and the collectives issued in
// it (number, bytes this rank sent, time from issue to completion, waiting included).
struct StepPhase {
  double seconds = 0;
  int64_t collectives = 0;
  int64_t collective_bytes = 0;
  double collective_seconds = 0;
};

// The phases of train_step, in order: model forward, loss forward, backward (loss and
// model), gradient clipping, optimizer step (zero_grad and the learning-rate update
// included).
inline constexpr const char* kStepPhaseNames[] = {"forward", "loss", "backward", "clip", "optimizer"};
inline constexpr size_t kStepPhases = 5;
enum StepPhaseIndex : size_t { kForward = 0, kLoss = 1, kBackward = 2, kClip = 3, kOptimizer = 4 };

struct StepResult {
  int64_t step = 0;
  double loss = 0;
  double grad_norm = 0;
  double lr = 0;
  // The loss or the gradient norm was NaN or infinite: the step was not applied.
  bool non_finite = false;
  std::optional<double> val_loss;
  std::array<StepPhase, kStepPhases> phases{};
  // Minor page faults of the whole process during the step (first touches of fresh pages).
  int64_t minor_faults = 0;
  // Kernel CPU time of the whole process during the step (page faults, socket I/O).
  double system_seconds = 0;
  // Wall time of train_step.
  double seconds = 0;
};

// Marks the boundaries between the phases of a step: each mark closes the phase that
// began at the previous one (restart: the time since is no phase's).
class PhaseClock {
 public:
  explicit PhaseClock(StepResult& r) : r_(r) { restart(); }
  void mark(StepPhaseIndex phase);
  void restart();

 private:
  StepResult& r_;
  std::chrono::steady_clock::time_point start_;
  // This thread's collective tally at start_ (core/collective_stats.h).
  int64_t collectives_ = 0;
  int64_t collective_bytes_ = 0;
  double collective_seconds_ = 0;
};

// A whole step, from construction to finish(): its wall time and the process's minor page
// faults and kernel CPU time (all threads).
class StepMeter {
 public:
  StepMeter();
  void finish(StepResult& r) const;

 private:
  std::chrono::steady_clock::time_point start_;
  int64_t minor_faults_ = 0;
  double system_seconds_ = 0;
};

// A step's line of metrics.jsonl; `skipped`: non-finite steps skipped so far in this run.
nlohmann::json metrics_record(const StepResult& r, double tokens_per_s, int64_t skipped);

}  // namespace hyper_parallel::train
