#include "harness/build_paths.h"

#if !defined(HP_BINARY_DIR) || !defined(HP_SOURCE_DIR) || !defined(HP_PYTHON) || !defined(HP_TEST_RULE_PLUGIN) || \
    !defined(HP_TEST_NO_ENTRY_POINT_PLUGIN)
#error "tests/CMakeLists.txt defines the folders and plugin paths for this file"
#endif

namespace hyper_parallel::testing {

std::string binary_dir() { return HP_BINARY_DIR; }
std::string source_dir() { return HP_SOURCE_DIR; }
std::string python_path() { return HP_PYTHON; }
std::string rule_plugin_path() { return HP_TEST_RULE_PLUGIN; }
std::string no_entry_point_plugin_path() { return HP_TEST_NO_ENTRY_POINT_PLUGIN; }

}  // namespace hyper_parallel::testing
