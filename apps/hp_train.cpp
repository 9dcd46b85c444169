// hp-train: trains any registered model family (the tiny Llama by default) with tensor
// parallelism and loss_parallel.
//
//   hp-run --nproc-per-node 2 build/bin/hp-train --config configs/debug_model.toml
//   hp-train --config configs/debug_model.toml --parallelism.tensor_parallel_degree 1
//   hp-train --help        (every key of the job config, with its default)
//   hp-train --config-reference   (the same as Markdown: docs/config.md)
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <cstdlib>
#include <iostream>
#include <string>

#include "hyper_parallel/core/distributed.h"
#include "hyper_parallel/core/fatal_error.h"
#include "hyper_parallel_train/config/job_config.h"
#include "hyper_parallel_train/trainer.h"

namespace hp = hyper_parallel;

namespace {
// One "hp-train: " prefix, also for messages that already carry it.
int report(std::string message, bool caused_by_peer = false) {
  const std::string prefix = "hp-train: ";
  while (message.rfind(prefix, 0) == 0) message.erase(0, prefix.size());
  std::cerr << prefix << message << std::endl;
  // hp-run names the rank whose own error came first.
  hp::record_fatal_error(prefix + message, caused_by_peer);
  return 1;
}
}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc == 2 && std::string(argv[1]) == "--config-reference") {
      std::cout << hp::train::job_config_reference();  // docs/config.md
      return 0;
    }
    bool help = false;
    hp::train::JobConfig cfg = hp::train::parse_job_config(argc, argv, &help);
    if (help) {
      std::cout << "usage: hp-run --nproc-per-node N hp-train [--config FILE] [--section.key VALUE ...]\n\n"
                << hp::train::job_config_usage();
      return 0;
    }
    hp::InitOptions init;
    init.device_type = cfg.training.device;
    if (std::getenv("WORLD_SIZE")) {
      hp::init_process_group(init);  // from hp-run's environment
    } else {
      hp::init_process_group(c10::make_intrusive<c10d::HashStore>(), 0, 1, init);  // one process, no launcher
    }
    const bool rank0 = hp::get_rank() == 0;
    hp::train::Trainer trainer(cfg, rank0 ? &std::cout : nullptr);
    auto results = trainer.train();
    if (rank0 && !results.empty()) {
      std::cout << "hp-train: done: loss " << results.front().loss << " (step " << results.front().step << ") -> "
                << results.back().loss << " (step " << results.back().step << ")";
      if (results.back().val_loss) std::cout << ", validation loss " << *results.back().val_loss;
      std::cout << std::endl;
    }
  } catch (const hp::PeerFailure& e) {
    return report(e.what(), /*caused_by_peer=*/true);
  } catch (const c10::Error& e) {
    return report(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return report(e.what());
  }
  return 0;
}
