// Where this build and its source tree are, and the configured Python. Defined in one
// file (build_paths.cpp) so that no other test file's compile line names a folder: a
// clone elsewhere then compiles every other test file from the ccache.
#pragma once

#include <string>

namespace hyper_parallel::testing {

std::string binary_dir();   // the build's bin/ (hp-run, hp-train, ...)
std::string source_dir();   // the source tree's root
std::string python_path();  // HP_PYTHON; empty when none was configured
// The registry tests' rule plugins (tests/plugin/): one that registers a rule, one that
// lacks the entry point.
std::string rule_plugin_path();
std::string no_entry_point_plugin_path();

}  // namespace hyper_parallel::testing
