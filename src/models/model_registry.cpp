#include "hyper_parallel/models/model_registry.h"

#include <cstdlib>
#include <deque>
#include <mutex>
#include <stdexcept>

#include "hyper_parallel/models/gemma2.h"
#include "hyper_parallel/models/llama.h"
#include "hyper_parallel/models/qwen3.h"

namespace hyper_parallel {

namespace {

// The library's families, then the registered ones: a deque, so that the references
// model_family hands out survive later registrations.
struct Registry {
  std::mutex mutex;
  std::deque<ModelFamily> families{llama_family(), qwen3_family(), gemma2_family()};
};

Registry& family_registry() {
  static Registry r;
  return r;
}

// HYPER_PARALLEL_MODEL_PLUGIN_PATH's families, registered before the first lookup answers.
// A plugin's own lookups (default_train_spec of its family) run while it loads: they skip
// this on the loading thread; other threads wait for the load. A failed load is tried again
// at the next lookup, so its error is never silently replaced by "unknown model family".
void load_plugins_named_in_environment() {
  static std::once_flag once;
  thread_local bool loading = false;
  if (loading) return;
  std::call_once(once, [] {
    loading = true;
    struct Done {
      ~Done() { loading = false; }
    } done;
    if (const char* paths = std::getenv(kModelPluginPathVariable)) load_model_family_plugins(paths);
  });
}

}  // namespace

std::vector<std::string> model_family_names() {
  load_plugins_named_in_environment();
  Registry& r = family_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& f : r.families) names.push_back(f.name);
  return names;
}

const ModelFamily& model_family(const std::string& name) {
  load_plugins_named_in_environment();
  Registry& r = family_registry();
  std::unique_lock<std::mutex> lock(r.mutex);
  for (const auto& f : r.families) {
    if (f.name == name) return f;
  }
  lock.unlock();
  std::string known;
  for (const auto& n : model_family_names()) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown model family '" + name + "'; known: " + known);
}

void register_model_family(ModelFamily family) {
  auto missing = [&](const char* field) {
    return std::invalid_argument("register_model_family('" + family.name + "'): ModelFamily::" + field +
                                 " is empty; a family needs it");
  };
  if (family.name.empty()) throw std::invalid_argument("register_model_family: ModelFamily::name is empty");
  if (!family.from_hf_config) throw missing("from_hf_config");
  if (!family.from_hf_config_json) throw missing("from_hf_config_json");
  if (!family.parallelize) throw missing("parallelize");
  if (!family.hf_adapter) throw missing("hf_adapter");
  Registry& r = family_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const auto& f : r.families) {
    if (f.name == family.name)
      throw std::invalid_argument("register_model_family: a family named '" + family.name + "' is registered already");
  }
  r.families.push_back(std::move(family));
}

HfExportResult export_hf_checkpoint(const torch::nn::Module& model, const ModelFamily& family,
                                    const std::string& folder, const HfExportOptions& options) {
  if (!family.to_hf_config)
    throw std::invalid_argument("model family '" + family.name + "' cannot write a config.json yet");
  return export_hf_checkpoint(
      model, family.hf_adapter(model), [&] { return family.to_hf_config(model); }, folder, options);
}

}  // namespace hyper_parallel
