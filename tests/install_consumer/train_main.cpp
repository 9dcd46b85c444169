// Builds against the installed train headers (HyperParallel::hp_train), as
// docs/training_reference.md shows: parses a job config, then trains it on one process, and reads
// what the train spec's parallelize made (ParallelizedModel, installed with the spec).
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <iostream>

#include "hyper_parallel/core/distributed.h"
#include "hyper_parallel_train/config/job_config.h"
#include "hyper_parallel_train/spec/parallelized_model.h"
#include "hyper_parallel_train/trainer.h"

namespace hp = hyper_parallel;

int main(int argc, char** argv) {
  bool help = false;
  hp::train::JobConfig cfg = hp::train::parse_job_config(argc, argv, &help);
  if (help) {
    std::cout << hp::train::job_config_usage();
    return 0;
  }
  hp::init_process_group(c10::make_intrusive<c10d::HashStore>(), 0, 1);
  hp::train::Trainer trainer(cfg, &std::cout);
  const auto results = trainer.train();
  const hp::train::ParallelizedModel& parallelized = trainer.parallelized_model();
  std::cout << "train consumer OK: " << results.size() << " steps, " << parallelized.describe() << ", "
            << parallelized.trained_parameters().size() << " trained tensors" << std::endl;
  return results.empty() || parallelized.trained_parameters().empty() ? 1 : 0;
}
