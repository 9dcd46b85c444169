// saved_model.h — the model of one step of hp-train's checkpoints, rebuilt whole in one
// process (TP 1), whatever data x tensor parallel layout saved it: for tools that take a
// trained model elsewhere (hp-hf-export).
//
// The step's manifest records the job's [model] keys (CheckpointIdentity::model) and every
// tensor's global layout, so nothing else is needed: the model is built from the recorded
// keys, and the reshard plan (checkpoint_reshard.h) reads the pieces of one data-parallel
// replica's files, each checked against the manifest (sizes, CRC-32C) before it is parsed.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "hyper_parallel_train/checkpoint/checkpoint_identity.h"
#include "hyper_parallel_train/config/job_config.h"
#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace torch::nn {
class Module;
}

namespace hyper_parallel::train {

struct SavedModel {
  int64_t step = 0;
  CheckpointIdentity identity;  // the manifest's: layout, dtype, run id
  ModelConfig config;           // the job's [model], as recorded
  // The weights the optimizer updated (float32 masters in bfloat16 training, else the
  // training dtype), unsharded: the module config.name's family builds (its train spec).
  std::shared_ptr<torch::nn::Module> model;
};

// `checkpoint_folder` is <job.dump_folder>/<checkpoint.folder> (it holds `latest` and the
// step-<N> folders); `step` unset: the one `latest` names. Throws std::runtime_error naming
// the file and what is wrong: no checkpoint, a step without manifest, a [model] key this
// hp-train does not know, a model family it cannot build, a damaged file.
SavedModel load_saved_model(const std::string& checkpoint_folder, std::optional<int64_t> step = std::nullopt);

}  // namespace hyper_parallel::train

HP_PUBLIC_END
