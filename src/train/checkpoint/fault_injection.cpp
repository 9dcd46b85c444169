// fault_injection.cpp — HP_CRASH_AT and HP_PAUSE_AT (see fault_injection.h).
#include "train/checkpoint/fault_injection.h"

#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace hyper_parallel::train {
namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

bool matches(const std::string& spec, const std::string& point, int64_t rank) {
  return !spec.empty() && (spec == point || spec == point + "@" + std::to_string(rank));
}

}  // namespace

void crash_point(const char* point, int64_t rank) {
  static const std::string crash = env("HP_CRASH_AT");
  static const std::string pause = env("HP_PAUSE_AT");
  if (matches(pause, point, rank)) {
    std::fprintf(stderr, "hp-train: paused at %s (rank %lld, pid %lld)\n", point, static_cast<long long>(rank),
                 static_cast<long long>(::getpid()));
    std::fflush(stderr);
    ::raise(SIGSTOP);
  }
  if (!matches(crash, point, rank)) return;
  std::fprintf(stderr, "hp-train: injected crash at %s (rank %lld)\n", point, static_cast<long long>(rank));
  std::fflush(stderr);
  ::_exit(kInjectedCrashExitCode);
}

}  // namespace hyper_parallel::train
