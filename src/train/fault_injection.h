// fault_injection.h — named crash points, to test that a save survives a crash anywhere.
//
// HP_CRASH_AT=<point> (every rank) or HP_CRASH_AT=<point>@<rank> makes the process
// print "hp-train: injected crash at <point>" to stderr and _exit(86) when it reaches
// that point: no destructors, no cleanup, exactly what a kill -9 or a power cut leaves.
// Unset (the normal case) a crash point costs one cached getenv.
#pragma once

#include <cstdint>

namespace hyper_parallel::train {

// Exit code of an injected crash.
constexpr int kInjectedCrashExitCode = 86;

void crash_point(const char* point, int64_t rank);

}  // namespace hyper_parallel::train
