// Files a test writes: under one folder per test process, removed when the process exits
// (HP_KEEP_TEST_FILES=1 keeps it, for looking at what a failing test wrote).
#pragma once

#include <string>

namespace hyper_parallel::testing {

// <temp>/hp_tests_<pid>/<name>, its parent folders made; whatever was at that path before
// is removed.
std::string scratch_path(const std::string& name);

}  // namespace hyper_parallel::testing
