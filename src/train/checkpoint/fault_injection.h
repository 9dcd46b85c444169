// fault_injection.h — named fault points, to test that a save survives a crash anywhere
// and what another job sees while one is in the middle of a save.
//
// HP_CRASH_AT=<point> (every rank) or HP_CRASH_AT=<point>@<rank> makes the process
// print "hp-train: injected crash at <point>" to stderr and _exit(86) when it reaches
// that point: no destructors, no cleanup, exactly what a kill -9 or a power cut leaves.
// HP_PAUSE_AT=<point>[@<rank>] instead prints "hp-train: paused at <point> (rank R, pid
// P)" to stderr and stops the process (SIGSTOP) there, holding whatever it holds (its
// locks, its half-written temporary files) until a SIGCONT lets it go on.
// A suffix #<n> (HP_CRASH_AT=<point>[@<rank>]#<n>) fires on the n-th visit of that point in
// this process only, e.g. the third save's, or after the seventh step (`step.finished`).
// A malformed value is an std::invalid_argument at the first fault point.
// Unset (the normal case) a fault point costs two cached getenvs.
#pragma once

#include <cstdint>

namespace hyper_parallel::train {

// Exit code of an injected crash.
constexpr int kInjectedCrashExitCode = 86;

void crash_point(const char* point, int64_t rank);

}  // namespace hyper_parallel::train
