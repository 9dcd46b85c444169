// step_metrics.h — how a training step's phases are timed (PhaseClock, StepMeter), how
// fast it trained (StepRates), and its line of metrics.jsonl (metrics_record) from what it
// measured (step_result.h).
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "hyper_parallel_train/metrics/step_result.h"

namespace hyper_parallel::train {

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
  // This thread's collective tally at start_ (hyper_parallel/core/collective_stats.h).
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
