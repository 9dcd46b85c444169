// fatal_error.h — a rank's fatal error, for its launcher.
#pragma once

#include <string>

namespace hyper_parallel {

// hp-run (like torchrun) gives each rank an error file (HP_ERROR_FILE) and, when ranks
// fail, names the one whose error came first: the first to exit is often a peer that died
// of the disconnect while the failing rank was still tearing down. Call it where the
// program gives up (the catch in main), before tearing down. Without HP_ERROR_FILE it does
// nothing; the first call of a process is the one kept.
void record_fatal_error(const std::string& message);

}  // namespace hyper_parallel
