// Trainer: TorchTitan's training loop, in C++, for any registered model family (its
// TrainSpec: train_spec.h).
//
//   hp::train::Trainer trainer(parse_job_config(args));  // world already initialised
//   trainer.train();
//
// loss_parallel_enabled = tp_enabled && !disable_loss_parallel (as TorchTitan's
// train spec decides it); the loss and
// its backward run inside train_context() (a loss_parallel guard when enabled), and the
// Validator computes its loss inside the same context. The spec's parallelize applies TP,
// FSDP or DDP and bfloat16's master weights (a ParallelizedModel the Trainer asks what to
// train and backward through); AdamW, TorchTitan's warm-up-stable-decay LR and TP-correct
// gradient clipping; metrics as JSON lines (with TFLOPs and MFU), a loss plot, sharded
// checkpoints written atomically and an exact --checkpoint.resume.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hyper_parallel/core/device_mesh.h"
#include "hyper_parallel/core/export.h"
#include "hyper_parallel_train/data/batch.h"
#include "hyper_parallel_train/config/job_config.h"
#include "hyper_parallel_train/config/parallel_dims.h"
#include "hyper_parallel_train/metrics/step_result.h"
#include "hyper_parallel_train/parallel/train_context.h"
#include "hyper_parallel_train/spec/train_spec.h"

namespace torch::nn {
class Module;
}

namespace hyper_parallel {
class FullyShardedParameters;
}

namespace hyper_parallel::train {

// The Trainer's parts (src/train/, not exported): declared here only to be held.
class CheckpointManager;
class DumpFolderLock;
class MetricsLogger;
class ModelFlopsUtilization;
class NonFiniteSteps;
class ProgressLine;
class TrainingCorpus;
class Validator;
class WarmupStableDecay;
struct TrainedState;
struct TrainingJob;
struct TrainingStepParts;

}  // namespace hyper_parallel::train

HP_PUBLIC_BEGIN

namespace hyper_parallel::train {

class Trainer {
 public:
  // `log` receives the progress line and summaries (rank 0 only); nullptr: quiet.
  explicit Trainer(JobConfig config, std::ostream* log = nullptr);
  ~Trainer();

  // Runs from the current step (0, or the checkpoint's with --checkpoint.resume) to
  // training.steps. Returns one result per step run. A step whose loss or gradient norm is
  // not finite stops it (an error naming the step), or is skipped within
  // training.max_skipped_steps (non_finite_steps.h).
  std::vector<StepResult> train();
  // One optimiser step on the sampler's batch for `step` (1-based). When the loss or the
  // gradient norm is not finite, the optimizer does not step (weights and its state stay
  // as they were) and the result says non_finite.
  StepResult train_step(int64_t step);
  // Replaces the training batches: `rows` gives this rank's rows of each step (its
  // replica's share of the global batch), e.g. batches with ignored targets in tests.
  void use_training_batches(std::shared_ptr<const BatchSource> rows) { batches_ = std::move(rows); }

  bool loss_parallel_enabled() const;
  const TrainContext& train_context() const;
  int64_t step() const { return step_; }
  // The module model.name's family built (as_causal_lm(model()) for its interface, or the
  // family's own type, e.g. as_llama). Under FSDP its parameters hold values only while
  // gathered (fully_sharded()->gather_all()).
  torch::nn::Module& model();
  const TrainSpec& spec() const;
  const ParallelDims& parallel_dims() const;
  // The module as the spec's parallelize left it: what the optimizer updates, and the
  // data-parallel wrapping and master weights around the module.
  const ParallelizedModel& parallelized_model() const;
  // parallelism.data_parallel_shard_degree > 1: the sharded parameters; null otherwise.
  FullyShardedParameters* fully_sharded() const;
  const JobConfig& config() const;

  // The current step's checkpoint, and the latest one (or checkpoint.load_step) read back:
  // CheckpointManager::save and load (false when there is none).
  void save_checkpoint() const;
  bool load_checkpoint();
  // Chosen by rank 0 at start (or taken from the checkpoint resumed), the same on all ranks.
  const std::string& run_id() const;

 private:
  // The corpus, this replica's batches and the Validator.
  void open_data();
  // Rank 0: the start-up lines (data, model, layout, loss).
  void log_start();
  // This rank's weights, gradients and AdamW state now (step_metrics.h).
  StateBytes state_bytes() const;
  // What the checkpoint manager saves and loads.
  TrainedState trained_state() const;
  // Locks every folder the job writes (dump_folder_lock.h) or stops every rank naming the
  // folder and its holder.
  void lock_job_folders();
  // A resume that finds the last step trained but its checkpoint.last_save_in_hf export
  // missing (the earlier run failed while writing it) writes the export.
  void export_missing_last_save();
  // The folders the job writes are writable, and the checkpoint folder has room for a
  // checkpoint (a warning otherwise); storage_checks.h.
  void check_storage();
  // checkpoint.initial_load_path (or model.hf_assets_path) into the model, unless a
  // resume will load a checkpoint instead (TorchTitan's precedence).
  void initial_load();
  // What the shared step (training_step.h) works on.
  TrainingStepParts step_parts();
  // Rank 0: the metrics file (a failure stops every rank); its loss plot at the end.
  void open_metrics();
  void plot_metrics() const;
  // Rank 0, with a log: `line` between progress lines.
  void say(const std::string& line);
  std::string metrics_folder() const;

  // Before every member that writes: released last, after everything the job writes is closed.
  std::vector<std::unique_ptr<DumpFolderLock>> folder_locks_;  // rank 0 (and node leaders); empty elsewhere
  // The set-up the dry run shares (training_job.h): the config with config.json's sizes, the
  // spec, dims, meshes and [parallelism] scope, the module, its parallelized form and AdamW.
  // Released after every member below, which hold its module or meshes.
  std::unique_ptr<TrainingJob> job_;
  std::ostream* log_;
  int64_t rank_ = 0;
  int64_t dp_rank_ = 0;  // among the dims' dp_ranks(): which rows of the batch
  std::unique_ptr<CheckpointManager> checkpoints_;
  std::unique_ptr<WarmupStableDecay> lr_schedule_;  // [lr_scheduler] over training.steps
  std::unique_ptr<const TrainingCorpus> corpus_;    // training.data, or the synthetic language
  std::shared_ptr<const BatchSource> batches_;
  std::unique_ptr<Validator> validator_;
  std::unique_ptr<MetricsLogger> metrics_;
  std::unique_ptr<ModelFlopsUtilization> mfu_;  // rank 0, which logs
  std::unique_ptr<ProgressLine> progress_;      // rank 0 with a log, during train()
  std::unique_ptr<NonFiniteSteps> non_finite_;
  int64_t step_ = 0;
};

}  // namespace hyper_parallel::train

HP_PUBLIC_END
