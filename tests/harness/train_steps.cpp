#include "harness/train_steps.h"

#include <gtest/gtest.h>

#include "compat/file_system.h"
#include "harness/rank_harness.h"

namespace hyper_parallel::testing {

train::JobConfig tiny_checkpointed_job(const std::string& dump, int64_t tp, int64_t steps) {
  train::JobConfig c;
  c.dump_folder = dump;
  c.model.dim = 32;
  c.model.n_layers = 1;
  c.model.n_heads = 4;
  c.model.vocab_size = 512;
  c.model.multiple_of = 16;
  c.model.max_seq_len = 32;
  c.training.batch_size = 4;
  c.training.seq_len = 16;
  c.training.steps = steps;
  c.lr_scheduler.warmup_steps = 1;
  c.parallelism.tensor_parallel_degree = tp;
  c.validation.enable = false;
  c.checkpoint.enable = true;
  c.checkpoint.interval = 2;
  c.metrics.enable_plot = false;
  return c;
}

std::string checkpoint_path(const train::JobConfig& job, const std::string& rel) {
  return compat::join_path(compat::join_path(job.dump_folder, job.checkpoint.folder), rel);
}

std::vector<train::StepResult> train_steps(const train::JobConfig& job, int64_t first, int64_t last, bool save,
                                           int64_t report_rank) {
  const int64_t world = train::ParallelDims::of(job.parallelism).world_size();
  std::vector<train::StepResult> out;
  run_ranks(world, [&](int64_t rank) {
    train::Trainer t(job);
    EXPECT_EQ(t.step(), first - 1) << "rank " << rank;
    std::vector<train::StepResult> r;
    for (int64_t s = first; s <= last; ++s) r.push_back(t.train_step(s));
    if (save) t.save_checkpoint();
    if (rank == report_rank) out = std::move(r);
  });
  return out;
}

}  // namespace hyper_parallel::testing
