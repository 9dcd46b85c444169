// The Trainer's ParallelismConfig applies while a Trainer lives, not forever after: a
// later loss_parallel() guard in the same process must not inherit, say,
// disable_loss_parallel from a finished job. Ranks may be threads of one process, each
// with its own Trainer: the first scope saves the process's config, the last restores it.
#pragma once

#include "hyper_parallel/loss/parallelism_config.h"

namespace hyper_parallel::train {

class ParallelismScope {
 public:
  explicit ParallelismScope(const ParallelismConfig& config);
  ~ParallelismScope();
  ParallelismScope(const ParallelismScope&) = delete;
  ParallelismScope& operator=(const ParallelismScope&) = delete;
};

}  // namespace hyper_parallel::train
