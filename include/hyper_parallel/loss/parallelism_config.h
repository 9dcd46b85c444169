// ParallelismConfig: the parallelism section of a job (TorchTitan's [parallelism]).
//
// The loss_parallel fields are read by loss_parallel() and the cross-entropy routing
// through the process-wide config below (the Trainer sets it from the TOML file).
// Precedence (the config is the root; guard options override it, for tests):
//   disable_loss_parallel = true   loss_parallel() guards activate nothing (a warning
//                                  once); the model's output head gathers the logits.
//   loss_parallel_strict_mesh      used when LossParallelOptions::strict is unset.
//   loss_parallel_fallback_on_layout_error
//                                  cross_entropy on class-sharded logits outside the
//                                  context (or with a layout loss_parallel cannot take
//                                  under strict = false) all-gathers them with a warning
//                                  instead of raising LossParallelLayoutError.
#pragma once

#include <cstdint>
#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel {

struct ParallelismConfig {
  int64_t tensor_parallel_degree = 1;
  bool disable_loss_parallel = false;
  bool loss_parallel_strict_mesh = true;
  bool loss_parallel_fallback_on_layout_error = false;
};

// Process-wide (every thread, every rank-thread) configuration.
ParallelismConfig parallelism_config();
void set_parallelism_config(const ParallelismConfig& config);

}  // namespace hyper_parallel

HP_PUBLIC_END
