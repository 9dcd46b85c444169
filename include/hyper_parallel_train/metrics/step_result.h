// What one training step measured on this rank (Trainer::train_step, Trainer::train):
// its loss, gradient norm and learning rate, the time and collectives of each phase, and
// the bytes of state this rank keeps.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

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
// moments; `masters` is the part of `parameters` that is masters or shards; and the whole
// model's parameter count, for the formulas they are held against.
struct StateBytes {
  int64_t parameters = 0;
  int64_t gradients = 0;
  int64_t optimizer = 0;
  int64_t masters = 0;
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

}  // namespace hyper_parallel::train

HP_PUBLIC_END
