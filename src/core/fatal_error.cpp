// fatal_error.cpp — record_fatal_error(): the rank's side of hp-run's and torchrun's error files.
#include <atomic>
#include <cstdlib>

#include "hyper_parallel/core/fatal_error.h"
#include "hyper_parallel/core/rank_error_file.h"
#include "core/torchelastic_error_file.h"

namespace hyper_parallel {

void record_fatal_error(const std::string& message, bool caused_by_peer) {
  static std::atomic<bool> recorded{false};
  if (recorded.exchange(true)) return;
  // hp-run's error file, or torchrun's: whichever launcher started this rank gave it one.
  const char* path = std::getenv(launcher::kErrorFileVariable);
  if (path && *path) (void)launcher::write_rank_error_file(path, message, caused_by_peer);
  const char* torchrun_path = std::getenv(kTorchelasticErrorFileVariable);
  if (torchrun_path && *torchrun_path) (void)write_torchelastic_error_file(torchrun_path, message, caused_by_peer);
}

}  // namespace hyper_parallel
