// checkpoint_manager.h — everything a training job does with its checkpoints: the run's
// identity (what a checkpoint records of the job: run id, degrees, dtype, model, data),
// the checkpoint folder (temp files of interrupted saves, an earlier run's checkpoints),
// the save protocol (checkpoint_manifest.h), and the verified, resharding load of a
// resume (checkpoint_reshard.h) with its checks: another model, other data, weights that
// are not finite.
//
// Every method that touches files is collective over the job's world mesh: a failure on
// one rank is an error on every rank (hyper_parallel/core/run_then_agree.h).
#pragma once

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hyper_parallel/models/decoder_sizes.h"
#include "hyper_parallel/core/device_mesh.h"
#include "train/checkpoint/checkpoint_manifest.h"
#include "hyper_parallel_train/config/job_config.h"

namespace torch::optim {
class Optimizer;
}

namespace hyper_parallel::train {

class ParallelizedModel;

// What a checkpoint holds of the training, and where a load puts it.
struct TrainedState {
  // The parameters the optimizer updates (float32 masters in bfloat16 training), named,
  // in the model's parameter order (AdamW's state is saved by position in it).
  std::vector<std::pair<std::string, at::Tensor>> parameters;
  torch::optim::Optimizer* optimizer = nullptr;  // AdamW
  // Whose trained parameters they are: its module's weights follow a load (bfloat16
  // training's masters are copied into the model).
  ParallelizedModel* model = nullptr;
};

class CheckpointManager {
 public:
  // `world_mesh`: every rank (none for a one-rank job).
  // `hf_config`: model.hf_assets_path's config.json (null otherwise), recorded in the
  // checkpoints. `sizes`: the module's, as its family resolved them (a [model] key of 0, such
  // as ffn_hidden_dim or n_kv_heads, is the family's value), recorded in the identity.
  // Collective: rank 0 draws the run's id and every rank receives it.
  CheckpointManager(const JobConfig& config, int64_t rank, std::optional<DeviceMesh> world_mesh,
                    nlohmann::json hf_config, const DecoderSizes& sizes, std::ostream* log);

  // checkpoint.folder under job.dump_folder.
  const std::string& folder() const { return folder_; }
  // Chosen by rank 0 at start (or taken from the checkpoint resumed), the same on all ranks.
  const std::string& run_id() const { return run_id_; }
  // data_identity.h: recorded in checkpoints, checked on resume.
  void set_data_identity(nlohmann::json data) { data_identity_ = std::move(data); }

  // A resume that will find a checkpoint to load (one named by checkpoint.load_step, or by
  // `latest`; a damaged `latest` counts, so that the load reports it).
  bool has_resume_point() const;
  // Removes temp files of interrupted saves (their writer is gone: this job holds the dump
  // folder's lock); refuses (or with overwrite, clears) a folder holding an earlier run's
  // checkpoints when this run does not resume.
  void prepare_folder() const;
  // The save protocol of checkpoint_manifest.h for step `step`; a failure on any rank is
  // an error on every rank (naming the file and the OS reason on the rank that failed).
  void save(int64_t step, const TrainedState& state) const;
  // Loads the latest checkpoint (or checkpoint.load_step) into `state` after verifying it
  // (checkpoint_manifest.h) and returns its step; none when there is none. A mismatch on
  // any rank is an error on every rank, as are weights that are not finite and, without
  // checkpoint.allow_data_change, data that differs from the checkpoint's (data_identity.h).
  std::optional<int64_t> load(const TrainedState& state);
  // --checkpoint.resume: load(), refusing a checkpoint past `training_steps`, and says
  // what it resumed on the log.
  std::optional<int64_t> resume(const TrainedState& state, int64_t training_steps);
  // checkpoint.last_save_in_hf: step `step` (saved) as a Hugging Face checkpoint folder in
  // hf_export_folder(). Rank 0 rebuilds the whole model from the saved step (as hp-hf-export
  // does: the masters of a bfloat16 run) and writes it; a failure is an error on every rank.
  void save_in_hf(int64_t step) const;

 private:
  // What this job's checkpoints of step `step` are.
  CheckpointIdentity identity(int64_t step) const;
  // Verifies and loads step `step` of the folder (throws on this rank only).
  void load_step(int64_t step, const TrainedState& state);
  // The checkpoint's data record against this job's: a difference is refused unless
  // checkpoint.allow_data_change; a moved corpus is said.
  void check_data(const CheckpointIdentity& saved, int64_t step, const std::string& dir) const;

  JobConfig config_;
  std::string folder_;
  int64_t rank_ = 0;
  std::optional<DeviceMesh> world_mesh_;
  nlohmann::json hf_config_;
  DecoderSizes sizes_;
  nlohmann::json data_identity_;
  std::ostream* log_;
  std::string run_id_;
};

}  // namespace hyper_parallel::train
