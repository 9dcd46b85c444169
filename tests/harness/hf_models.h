// Tiny random transformers models, made offline by a tests/hf/ script once per test
// process (the venv's Python takes a while to import transformers) and removed at exit,
// and reading a safetensors file whole.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>

namespace hyper_parallel::testing {

struct HfModels {
  std::string dir;          // <dir>/<case>/ (make_llama_models.py: gqa, tied, llama3, sharded, bf16)
  std::string skip_reason;  // non-empty: the models could not be made (say it with GTEST_SKIP)
};
const HfModels& hf_models(const std::string& script = "make_llama_models.py");

// Every tensor of one safetensors file, by name.
std::map<std::string, at::Tensor> read_safetensors_file(const std::string& path);

}  // namespace hyper_parallel::testing
