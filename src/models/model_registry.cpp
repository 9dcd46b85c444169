#include "hyper_parallel/model_registry.h"

#include <stdexcept>

#include "hyper_parallel/gemma2.h"
#include "hyper_parallel/llama.h"
#include "hyper_parallel/qwen3.h"

namespace hyper_parallel {

namespace {

const std::vector<ModelFamily>& families() {
  static const std::vector<ModelFamily> table = {
      llama_family(),
      qwen3_family(),
      gemma2_family(),
  };
  return table;
}

}  // namespace

std::vector<std::string> model_family_names() {
  std::vector<std::string> names;
  for (const auto& f : families()) names.push_back(f.name);
  return names;
}

const ModelFamily& model_family(const std::string& name) {
  for (const auto& f : families()) {
    if (f.name == name) return f;
  }
  std::string known;
  for (const auto& n : model_family_names()) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown model family '" + name + "'; known: " + known);
}

HfExportResult export_hf_checkpoint(const torch::nn::Module& model, const ModelFamily& family,
                                    const std::string& folder, const HfExportOptions& options) {
  if (!family.to_hf_config)
    throw std::invalid_argument("model family '" + family.name + "' cannot write a config.json yet");
  return export_hf_checkpoint(
      model, family.hf_adapter(model), [&] { return family.to_hf_config(model); }, folder, options);
}

}  // namespace hyper_parallel
