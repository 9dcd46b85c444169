#include "train/parallel/parallelism_scope.h"

#include <mutex>

namespace hyper_parallel::train {

namespace {

std::mutex mutex;
int live_scopes = 0;
ParallelismConfig saved;  // the process's config before the first live scope

}  // namespace

ParallelismScope::ParallelismScope(const ParallelismConfig& config) {
  std::lock_guard<std::mutex> lock(mutex);
  if (live_scopes++ == 0) saved = parallelism_config();
  set_parallelism_config(config);
}

ParallelismScope::~ParallelismScope() {
  std::lock_guard<std::mutex> lock(mutex);
  if (--live_scopes == 0) set_parallelism_config(saved);
}

}  // namespace hyper_parallel::train
