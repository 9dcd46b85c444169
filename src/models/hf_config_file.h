// The text of a transformers config.json, for the families' readers (from_hf_config).
#pragma once

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace hyper_parallel {

inline std::string read_hf_config_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read the model config " + path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace hyper_parallel
