// step_metrics.h — what one training step measured (StepResult, StepRates), how its phases
// are timed (PhaseClock, StepMeter), and its line of metrics.jsonl (metrics_record).
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

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

// FSDP's collectives in a step's forward and backward (fully_shard.h): their time from
// issue to completion, and what of it this rank spent waiting for them (the rest
// overlapped computation); the dtype gradients were reduce-scattered in.
struct ShardingStep {
  int64_t all_gathers = 0;
  int64_t reduce_scatters = 0;
  int64_t bytes_sent = 0;
  double collective_seconds = 0;
  double blocked_seconds = 0;
  std::string reduce_dtype;
};

// What this rank keeps from step to step, in bytes of its live tensors: the weights (the
// model's, plus the float32 masters or FSDP's shards), their gradients and AdamW's
// moments; and the whole model's parameter count, for the formulas they are held against.
struct StateBytes {
  int64_t parameters = 0;
  int64_t gradients = 0;
  int64_t optimizer = 0;
  int64_t model_parameters = 0;
};

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
  std::optional<ShardingStep> sharding;  // FSDP only
  StateBytes state;                      // after the step
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

// How fast a step trained: the job's tokens per second (batch_size x seq_len over the step's
// wall time), and one rank's achieved TFLOPs and MFU in % (mfu.h).
struct StepRates {
  double tokens_per_s = 0;
  double tflops = 0;
  double mfu_pct = 0;
};

// A step's line of metrics.jsonl; `skipped`: non-finite steps skipped so far in this run.
nlohmann::json metrics_record(const StepResult& r, const StepRates& rates, int64_t skipped);

}  // namespace hyper_parallel::train
