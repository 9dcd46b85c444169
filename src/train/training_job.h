// training_job.h — a job set up to train, written once for the Trainer and the dry run
// (dry_run.h), so that what hp-dry-run predicts is what hp-train builds: the spec's module
// (its sizes read from model.hf_assets_path's config.json into `config`), the validated
// [parallelism] as dims and meshes, the loss context, the weights placed, then the spec's
// parallelize and AdamW. The Trainer adds data, checkpoints and metrics around it; the
// step itself is training_step.h.
//
//   TrainingJob job(std::move(config), TrainingJob::Weights::Initialised);
//   ... what needs the meshes before the weights are final (the Trainer's checkpoints) ...
//   job.parallelize(load_weights);
//   forward_backward(job.step_parts(), batch, clock);
#pragma once

#include <torch/optim/adamw.h>

#include <functional>
#include <memory>

#include "hyper_parallel_train/config/job_config.h"
#include "hyper_parallel_train/config/parallel_dims.h"
#include "hyper_parallel_train/spec/parallelized_model.h"
#include "hyper_parallel_train/parallel/train_context.h"
#include "hyper_parallel_train/spec/train_spec.h"
#include "train/parallel/parallelism_scope.h"
#include "train/training_step.h"

namespace hyper_parallel::train {

// Members in the order they must be released: the scope last.
struct TrainingJob {
  // Where the weights come from.
  enum class Weights {
    Initialised,           // init_weights(training.seed) on every rank, on the world's device
    ReadWhenParallelized,  // built on the meta device; parallelize's load_weights materialises
                           // and reads them, each rank its own TP pieces
    ShapesOnly,            // every weight, buffer and AdamW moment on the meta device (a dry run)
  };

  // Builds, validates (every bad key at once: validate(config)) and places the module, the
  // dims (checked against the world) and meshes, and the loss context. A training.device
  // other than the process group's is a c10::Error naming both.
  TrainingJob(JobConfig job_config, Weights weights);
  TrainingJob(const TrainingJob&) = delete;
  TrainingJob& operator=(const TrainingJob&) = delete;

  // The spec's parallelize (TP, activation checkpointing, `load_weights`, then FSDP or DDP
  // and bfloat16's masters), then AdamW over what it trains. Once.
  void parallelize(const std::function<void()>& load_weights);

  // What the shared step works on; after parallelize.
  TrainingStepParts step_parts();

  JobConfig config;  // as given, with the sizes config.json says
  Weights weights;
  const TrainSpec* spec = nullptr;
  ParallelDims dims{1, 1, 1};
  std::unique_ptr<ParallelismScope> scope;  // [parallelism]'s process-wide settings, restored at the end
  bool loss_parallel = false;               // TP with loss parallel not disabled
  TrainContext context{false};
  at::Device device{at::kCPU};  // the world's (meta parameters get it when materialised)
  ParallelDims::Meshes meshes;
  std::shared_ptr<torch::nn::Module> model;
  std::unique_ptr<ParallelizedModel> parallelized;  // model with FSDP or DDP and bfloat16's masters around it
  std::unique_ptr<torch::optim::AdamW> optimizer;
};

}  // namespace hyper_parallel::train
