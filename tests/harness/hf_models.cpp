#include "harness/hf_models.h"

#include <ATen/ops/empty.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "compat/file_system.h"
#include "harness/build_paths.h"
#include "harness/rank_harness.h"
#include "models/safetensors.h"

namespace hyper_parallel::testing {

const HfModels& hf_models() {
  static const HfModels models = [] {
    HfModels m;
    const std::string python = python_path();
    if (python.empty()) {
      m.skip_reason = "no Python configured (HP_PYTHON); scripts/common.sh's venv has transformers";
      return m;
    }
    m.dir = compat::join_path(compat::temp_directory(), "hp_hf_llama_" + std::to_string(::getpid()));
    static const std::string made = m.dir;
    std::atexit([] { compat::remove_all(made); });  // the models are the test binary's, not the machine's
    const std::string script = source_dir() + "/tests/hf/make_llama_models.py";
    const auto r = run_command("'" + python + "' '" + script + "' '" + m.dir + "'");
    if (r.exit_code == 77) {
      m.skip_reason = r.output;
    } else if (r.exit_code != 0) {
      m.skip_reason = "FAILED";
      ADD_FAILURE() << "make_llama_models.py failed:\n" << r.output;
    }
    return m;
  }();
  return models;
}

std::map<std::string, at::Tensor> read_safetensors_file(const std::string& path) {
  hf::SafetensorsFile f(path);
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, e] : f.header().tensors) {
    out[name] = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
    std::memcpy(out[name].data_ptr(), f.data(e), e.end - e.begin);
  }
  return out;
}

}  // namespace hyper_parallel::testing
