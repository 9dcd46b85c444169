// Trainer and Validator: TorchTitan's training loop for the tiny Llama, in C++.
//
//   hp::train::Trainer trainer(parse_job_config(args));  // world already initialised
//   trainer.train();
//
// loss_parallel_enabled = tp_enabled && !disable_loss_parallel (§11.3); the loss and
// its backward run inside train_context() (a loss_parallel guard when enabled), and the
// Validator computes its loss inside the same context. Parameters are sharded with
// TorchTitan's plan; AdamW, warm-up + cosine LR and TP-correct gradient clipping;
// metrics as JSON lines, a loss plot, sharded checkpoints written atomically and an
// exact --checkpoint.resume.
#pragma once

#include <array>
#include <iosfwd>
#include <memory>
#include <optional>
#include <vector>

#include "hyper_parallel/llama.h"
#include "train/checkpoint_manifest.h"
#include "train/corpus_identity.h"
#include "train/data.h"
#include "train/data_parallel_reducer.h"
#include "train/dump_folder_lock.h"
#include "train/pretokenized_corpus.h"
#include "train/master_weights.h"
#include "train/job_config.h"
#include "train/job_model.h"
#include "train/non_finite_steps.h"
#include "train/train_context.h"
#include "train/parallelism_scope.h"

namespace torch::optim {
class AdamW;
}

namespace hyper_parallel::train {

class MetricsLogger;

class Validator {
 public:
  // Batches from `tokens` (a held-out token stream, sampled with seed training.seed + 1).
  Validator(const ValidationConfig& config, const TrainingConfig& training, const at::Tensor& tokens,
            TrainContext validation_context);
  // Batches 0 .. config.steps - 1 of `batches` (e.g. the synthetic stream's validation split).
  Validator(const ValidationConfig& config, const TrainingConfig& training,
            std::shared_ptr<const BatchSource> batches, TrainContext validation_context);
  // The mean over config.steps fixed batches of each batch's loss (its token losses over
  // every replica's rows, divided by their count), without gradients.
  double validate(Llama& model) const;
  // Each replica holds its rows of the validation batches: the loss sums go over dp_mesh.
  void set_data_parallel_mesh(const DeviceMesh& dp_mesh);

 private:
  ValidationConfig config_;
  std::shared_ptr<const BatchSource> batches_;
  bool fused_linear_loss_;  // training.fused_linear_loss: the same loss path as training
  TrainContext context_;
  std::optional<DeviceMesh> dp_mesh_;
};

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

  bool loss_parallel_enabled() const { return loss_parallel_enabled_; }
  const TrainContext& train_context() const { return train_context_; }
  int64_t step() const { return step_; }
  Llama& model() { return model_; }
  const JobConfig& config() const { return config_; }

  // The save protocol of checkpoint_manifest.h; a failure on any rank is an error
  // on every rank (naming the file and the OS reason on the rank that failed).
  void save_checkpoint() const;
  // Loads the latest checkpoint (or checkpoint.load_step) after verifying it
  // (checkpoint_manifest.h); false when there is none. A mismatch on any rank is an error
  // on every rank, as are weights that are not finite and, without
  // checkpoint.allow_data_change, data that differs from the checkpoint's (data_identity.h).
  bool load_checkpoint();
  // Chosen by rank 0 at start (or taken from the checkpoint resumed), the same on all ranks.
  const std::string& run_id() const { return run_id_; }

 private:
  // What the optimizer updates and checkpoints hold: the model's parameters, or their
  // float32 masters in bfloat16 training; in the model's parameter order.
  std::vector<at::Tensor> trained_parameters() const;
  std::vector<std::pair<std::string, at::Tensor>> named_trained_parameters() const;
  // What this job's checkpoints are (step: the current one).
  CheckpointIdentity identity() const;
  // Takes the dump folder's lock (dump_folder_lock.h) or stops every rank naming its holder.
  void lock_dump_folder();
  // The folders the job writes are writable, and the checkpoint folder has room for a
  // checkpoint (a warning otherwise); storage_checks.h.
  void check_storage();
  // Temp files of interrupted saves (their writer is gone: this job holds the folder's
  // lock); refuses (or with overwrite, clears) a folder holding an earlier run's
  // checkpoints when this run does not resume.
  void prepare_checkpoint_folder();
  // Collective: every rank throws when any rank's `own_error` is non-empty, with its own
  // error or, on the others, which ranks failed at `what`.
  void agree_or_throw(const std::string& own_error, const std::string& what) const;
  // Verifies and loads step `step` of the checkpoint folder (throws on this rank only).
  void load_step(int64_t step);
  // checkpoint.initial_load_path (or model.hf_assets_path) into the model, unless a
  // resume will load a checkpoint instead (TorchTitan's precedence).
  void initial_load();
  double forward_backward(const Batch& batch, StepResult& r);
  std::string checkpoint_folder() const;
  std::string metrics_folder() const;

  JobConfig config_;
  // Declared first: released last, after everything the job writes is closed.
  std::unique_ptr<DumpFolderLock> dump_folder_lock_;  // rank 0 (and node leaders); null elsewhere
  std::optional<ParallelismScope> parallelism_scope_;  // set in the constructor, restored at the end
  std::ostream* log_;
  int64_t rank_ = 0;
  bool tp_enabled_ = false;
  bool loss_parallel_enabled_ = false;
  std::optional<DeviceMesh> world_mesh_;  // every rank: dp x tp, or the TP mesh alone; none for one rank
  std::optional<DeviceMesh> tp_mesh_;
  std::optional<DeviceMesh> dp_mesh_;     // the replicas of this rank's shards (dp > 1)
  int64_t dp_rank_ = 0;
  std::unique_ptr<DataParallelReducer> reducer_;  // dp > 1
  Llama model_{nullptr};
  std::unique_ptr<MasterWeights> master_;  // bfloat16 training: the float32 weights AdamW updates
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  std::unique_ptr<TokenCorpus> corpus_;  // a text file's tokens; null for the synthetic stream
  std::shared_ptr<const PretokenizedCorpus> token_corpus_;  // a pre-tokenized training.data
  std::shared_ptr<const BatchSource> batches_;
  TrainContext train_context_;
  std::unique_ptr<Validator> validator_;
  std::unique_ptr<MetricsLogger> metrics_;
  nlohmann::json hf_config_;     // model.hf_assets_path's config.json, recorded in checkpoints
  nlohmann::json data_identity_;  // data_identity.h: recorded in checkpoints, checked on resume
  NonFiniteSteps non_finite_{0};
  int64_t step_ = 0;
  std::string run_id_;
};


}  // namespace hyper_parallel::train
