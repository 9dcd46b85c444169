// fatal_error.cpp — record_fatal_error(): the rank's side of hp-run's error files.
#include <atomic>
#include <cstdlib>

#include "hyper_parallel/fatal_error.h"
#include "hyper_parallel/rank_error_file.h"

namespace hyper_parallel {

void record_fatal_error(const std::string& message, bool caused_by_peer) {
  static std::atomic<bool> recorded{false};
  const char* path = std::getenv(launcher::kErrorFileVariable);
  if (!path || !*path || recorded.exchange(true)) return;
  (void)launcher::write_rank_error_file(path, message, caused_by_peer);
}

}  // namespace hyper_parallel
