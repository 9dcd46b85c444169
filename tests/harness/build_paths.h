// Where this build and its source tree are, and the configured Python. Defined in one
// file (build_paths.cpp) so that no other test file's compile line names a folder: a
// clone elsewhere then compiles every other test file from the ccache.
#pragma once

#include <string>

namespace hyper_parallel::testing {

std::string binary_dir();   // the build's bin/ (hp-run, hp-train, ...)
std::string source_dir();   // the source tree's root
std::string python_path();  // HP_PYTHON; empty when none was configured

}  // namespace hyper_parallel::testing
