#include "harness/build_paths.h"

#if !defined(HP_BINARY_DIR) || !defined(HP_SOURCE_DIR) || !defined(HP_PYTHON)
#error "tests/CMakeLists.txt defines HP_BINARY_DIR, HP_SOURCE_DIR and HP_PYTHON for this file"
#endif

namespace hyper_parallel::testing {

std::string binary_dir() { return HP_BINARY_DIR; }
std::string source_dir() { return HP_SOURCE_DIR; }
std::string python_path() { return HP_PYTHON; }

}  // namespace hyper_parallel::testing
