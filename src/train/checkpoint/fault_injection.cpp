// fault_injection.cpp — HP_CRASH_AT and HP_PAUSE_AT (see fault_injection.h).
#include "train/checkpoint/fault_injection.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace hyper_parallel::train {
namespace {

// One of the two variables: where it fires, and how often its place was reached so far.
struct FaultSpec {
  explicit FaultSpec(const char* name) : variable(name) {
    const char* v = std::getenv(name);
    place = v ? v : "";
    const size_t hash = place.find('#');
    if (hash == std::string::npos) return;
    const std::string count = place.substr(hash + 1);
    errno = 0;
    char* end = nullptr;
    const long long n = std::strtoll(count.c_str(), &end, 10);
    if (count.empty() || *end != '\0' || errno != 0 || n < 1) {
      throw std::invalid_argument(variable + "='" + place +
                                  "' is not valid: expected <point>[@<rank>][#<n>], n the visit to stop at (1 = "
                                  "the first)");
    }
    occurrence = n;
    place.resize(hash);
  }

  std::string variable;
  std::string place;       // "<point>" or "<point>@<rank>"
  int64_t occurrence = 0;  // fire on this visit (1 = the first); 0: on every visit
  std::atomic<int64_t> visits{0};
};

// Whether `spec` fires at this visit of `point` on `rank` (counting the visits it names).
bool fires(FaultSpec& spec, const std::string& point, int64_t rank) {
  if (spec.place.empty() || (spec.place != point && spec.place != point + "@" + std::to_string(rank))) return false;
  const int64_t visit = ++spec.visits;
  return spec.occurrence == 0 || visit == spec.occurrence;
}

}  // namespace

void crash_point(const char* point, int64_t rank) {
  static FaultSpec crash("HP_CRASH_AT");
  static FaultSpec pause("HP_PAUSE_AT");
  if (fires(pause, point, rank)) {
    std::fprintf(stderr, "hp-train: paused at %s (rank %lld, pid %lld)\n", point, static_cast<long long>(rank),
                 static_cast<long long>(::getpid()));
    std::fflush(stderr);
    ::raise(SIGSTOP);
  }
  if (!fires(crash, point, rank)) return;
  std::fprintf(stderr, "hp-train: injected crash at %s (rank %lld)\n", point, static_cast<long long>(rank));
  std::fflush(stderr);
  ::_exit(kInjectedCrashExitCode);
}

}  // namespace hyper_parallel::train
