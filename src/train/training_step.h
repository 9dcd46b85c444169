// training_step.h — one optimizer step of a training job, written once for the Trainer and
// the dry run (dry_run.h), so that what hp-dry-run predicts is what hp-train runs: the same
// AdamW, the same global loss normalisation and collective sequence (the token count's
// all-reduce, every micro-batch's loss and backward with the data-parallel exchange, the
// loss sum), the same clipping and update. On a dry run's meta tensors the step issues every
// collective and holds every tensor, and its loss reads as 0 (a meta loss has no value).
#pragma once

#include <torch/optim/adamw.h>

#include <memory>
#include <optional>
#include <vector>

#include "hyper_parallel/core/device_mesh.h"
#include "hyper_parallel_train/data/batch.h"
#include "hyper_parallel_train/config/job_config.h"
#include "hyper_parallel_train/metrics/step_result.h"
#include "hyper_parallel_train/parallel/train_context.h"
#include "hyper_parallel_train/spec/train_spec.h"
#include "train/metrics/step_metrics.h"
#include "hyper_parallel_train/spec/parallelized_model.h"

namespace hyper_parallel::train {

// What a step works on: the job's module as the spec parallelized it, its optimizer and
// loss context, and the data-parallel ranks of this rank's TP group (none without).
struct TrainingStepParts {
  const TrainingConfig& training;
  const TrainSpec& spec;
  torch::nn::Module& model;
  ParallelizedModel& parallelized;
  torch::optim::AdamW& optimizer;
  const TrainContext& context;
  const std::optional<DeviceMesh>& dp_mesh;
};

// The world's device (the process group's), or the CPU without a process group.
at::Device world_device();
// The process group's size, or 1 without one.
int64_t world_size_or_one();

// The targets of `batch` that count (not ignore_index); a dry run's meta batch holds no ids:
// 0 (its count's all-reduce still runs).
double counted_tokens(const Batch& batch);
// A loss's value (a DTensor's whole value); a dry run's meta loss has none: 0.
double value_of(const at::Tensor& loss);
// Each of `values` summed over every data-parallel rank (every dim of dp_mesh, one
// all-reduce each; as they are without one), in float64 on the world's device: the token
// counts and loss sums a step and validation (validator.h) count alike.
std::vector<double> sum_over_replicas(std::vector<double> values, const std::optional<DeviceMesh>& dp_mesh);
// A loss sum per counted token; a batch whose targets are all ignored has loss 0 (not 0 / 0).
double per_counted_token(double loss_sum, double counted);

// AdamW over what `parallelized` trains, with [training]'s options.
std::unique_ptr<torch::optim::AdamW> make_optimizer(const ParallelizedModel& parallelized,
                                                    const TrainingConfig& training);

// Every micro-batch of this replica's `batch` (training.grad_accum_steps of them): the loss
// and its backward in the context. The loss is the sum of every counted token loss of the
// step over all replicas and micro-batches divided by their number (TorchTitan's global
// normalisation); returns it (0 on meta tensors). Phases marked on `clock`.
double forward_backward(const TrainingStepParts& parts, const Batch& batch, PhaseClock& clock);

// Clips the gradients to training.max_norm and, unless the loss or the norm is not finite
// (every rank decides alike: both are reduced over every rank), applies AdamW and copies
// the trained values into the module. Sets r.grad_norm and r.non_finite.
void clip_and_update(const TrainingStepParts& parts, StepResult& r, PhaseClock& clock);

}  // namespace hyper_parallel::train
