// Runs Trainer steps on rank threads, the pattern of the training tests: every rank builds
// its Trainer from `job` (world = data x tensor parallel degree), runs steps first..last,
// optionally saves a checkpoint, and one rank's results come back.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hyper_parallel_train/config/job_config.h"
#include "hyper_parallel_train/trainer.h"

namespace hyper_parallel::testing {

// The checkpoint tests' job: a one-layer Llama (dim 32, even vocabulary 512, so both ranks'
// shards have one shape and a swapped file loads unless something checks whose it is),
// 4 x 16 tokens per step, no validation or plot, a checkpoint every 2 steps.
train::JobConfig tiny_checkpointed_job(const std::string& dump, int64_t tp, int64_t steps);

// <job.dump_folder>/<checkpoint.folder>/<rel>.
std::string checkpoint_path(const train::JobConfig& job, const std::string& rel);

// Steps first..last (1-based) of `job`. The Trainer must start at step first - 1: 0 for a
// fresh run, the checkpoint's step when the job resumes. With `save`, a checkpoint is
// written after the last step. Returns the StepResults of global rank `report_rank`.
std::vector<train::StepResult> train_steps(const train::JobConfig& job, int64_t first, int64_t last, bool save = false,
                                           int64_t report_rank = 0);

}  // namespace hyper_parallel::testing
