// fault_injection.cpp — HP_CRASH_AT (see fault_injection.h).
#include "train/fault_injection.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace hyper_parallel::train {

void crash_point(const char* point, int64_t rank) {
  static const std::string spec = [] {
    const char* v = std::getenv("HP_CRASH_AT");
    return std::string(v ? v : "");
  }();
  if (spec.empty()) return;
  const std::string here = point;
  if (spec != here && spec != here + "@" + std::to_string(rank)) return;
  std::fprintf(stderr, "hp-train: injected crash at %s (rank %lld)\n", point, static_cast<long long>(rank));
  std::fflush(stderr);
  ::_exit(kInjectedCrashExitCode);
}

}  // namespace hyper_parallel::train
