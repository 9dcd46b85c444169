#include "harness/scratch_folder.h"

#include <unistd.h>

#include <cstdlib>

#include "compat/file_system.h"

namespace hyper_parallel::testing {

namespace {

const std::string& process_folder() {
  static const std::string folder = [] {
    std::string f = compat::join_path(compat::temp_directory(), "hp_tests_" + std::to_string(::getpid()));
    static std::string removed_at_exit = f;
    const char* keep = std::getenv("HP_KEEP_TEST_FILES");
    if (!keep || std::string(keep) != "1") std::atexit([] { compat::remove_all(removed_at_exit); });
    return f;
  }();
  return folder;
}

}  // namespace

std::string scratch_path(const std::string& name) {
  const std::string path = compat::join_path(process_folder(), name);
  compat::create_directories(compat::parent_path(path));
  compat::remove_all(path);
  return path;
}

}  // namespace hyper_parallel::testing
