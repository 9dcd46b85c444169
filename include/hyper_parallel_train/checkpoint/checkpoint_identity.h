// What a checkpoint says of the job that saved it: its run, step, layout, dtype, model
// and data. Written into every step's manifest and each rank file's metadata; compared
// with the job resuming it (resume_mismatches) and read by load_saved_model.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel::train {

struct CheckpointIdentity {
  std::string run_id;  // chosen by rank 0 when a run starts, shared by all ranks
  int64_t step = 0;
  int64_t world_size = 1;
  int64_t tensor_parallel_degree = 1;
  int64_t data_parallel_degree = 1;
  int64_t data_parallel_shard_degree = 1;  // FSDP; absent (1) in checkpoints before it
  std::string dtype;                       // training.dtype
  nlohmann::json model;                    // every [model] key, by name
  // What defines the training data (data_identity.h); null in checkpoints of an hp-train
  // before it was recorded, whose data cannot be checked.
  nlohmann::json data;
  // FNV-1a 64 of model and dtype (hex): one value to compare in logs and tools.
  std::string config_hash() const;
};

}  // namespace hyper_parallel::train

HP_PUBLIC_END
