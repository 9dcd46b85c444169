#include "harness/hf_models.h"

#include <ATen/ops/empty.h>
#include <gtest/gtest.h>

#include <cstring>
#include <mutex>

#include "harness/build_paths.h"
#include "harness/rank_harness.h"
#include "harness/scratch_folder.h"
#include "models/safetensors.h"

namespace hyper_parallel::testing {

const HfModels& hf_models(const std::string& script) {
  static std::mutex mu;
  static std::map<std::string, HfModels> made;
  std::lock_guard<std::mutex> lock(mu);
  auto it = made.find(script);
  if (it != made.end()) return it->second;
  HfModels m;
  const std::string python = python_path();
  if (python.empty()) {
    m.skip_reason = "no Python configured (HP_PYTHON); scripts/common.sh's venv has transformers";
  } else {
    m.dir = scratch_path("hf_models/" + script);  // removed with the process's scratch folder
    const auto r = run_command("'" + python + "' '" + source_dir() + "/tests/hf/" + script + "' '" + m.dir + "'");
    if (r.exit_code == 77) {
      m.skip_reason = r.output;
    } else if (r.exit_code != 0) {
      m.skip_reason = "FAILED";
      ADD_FAILURE() << script << " failed:\n" << r.output;
    }
  }
  return made.emplace(script, m).first->second;
}

std::map<std::string, at::Tensor> read_safetensors_file(const std::string& path) {
  hf::SafetensorsFile f(path);
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, e] : f.header().tensors) {
    out[name] = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
    // An empty tensor has no storage (a null pointer memcpy must not be given).
    if (e.end > e.begin) std::memcpy(out[name].data_ptr(), f.data(e), e.end - e.begin);
  }
  return out;
}

}  // namespace hyper_parallel::testing
