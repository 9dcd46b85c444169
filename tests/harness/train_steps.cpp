#include "harness/train_steps.h"

#include <gtest/gtest.h>

#include "harness/rank_harness.h"

namespace hyper_parallel::testing {

std::vector<train::StepResult> train_steps(const train::JobConfig& job, int64_t first, int64_t last, bool save,
                                           int64_t report_rank) {
  const int64_t world = job.parallelism.data_parallel_degree * job.parallelism.tensor_parallel_degree;
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
