// Loading of YAML op specs and rule plugins into the registry (internal).
#pragma once

#include <string>
#include <vector>

namespace hyper_parallel {

struct OpSpecFile {
  std::string path;  // for messages
  std::string text;
};

// The specs compiled into the library (generated from ops/*.yaml by CMake).
const std::vector<OpSpecFile>& builtin_op_spec_files();

// Parses the files and registers one DistributedOp per entry. Throws, naming the file
// and line, on malformed YAML, an unknown class or parameter, or an op name declared
// twice (naming both files).
void load_op_spec_files(const std::vector<OpSpecFile>& files);

// dlopen()s each plugin and calls its hyper_parallel_register_ops().
void load_op_plugins(const std::string& colon_separated_paths);
// Every *.yaml (sorted) in each directory.
std::vector<OpSpecFile> read_op_spec_dirs(const std::string& colon_separated_dirs);

}  // namespace hyper_parallel
