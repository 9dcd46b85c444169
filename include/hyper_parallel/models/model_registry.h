// Model families by name (`model.name` of a job): what the rest of the code needs of a
// family without knowing it — build it from a transformers config.json, apply its
// tensor-parallel plan, its state-dict adapter to and from Hugging Face names, and the
// config.json that describes it again.
// A family of the library lives in its own folder (src/models/<family>/) and adds one line
// to the table in src/models/model_registry.cpp; a family from outside the library is
// registered at run time with register_model_family (designated fields:
// ModelFamily{.name = "mine", .from_hf_config = ..., ...}), before the job that names it,
// or from a shared library named in HYPER_PARALLEL_MODEL_PLUGIN_PATH (below).
// hp-train reaches a family through its train spec (hyper_parallel_train/spec/train_spec.h:
// TrainSpec::family), never by name beside it.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hyper_parallel/models/block_activations.h"
#include "hyper_parallel/models/causal_lm.h"
#include "hyper_parallel/core/device_mesh.h"
#include "hyper_parallel/models/hf_checkpoint.h"
#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace torch::nn {
class Module;
}

namespace hyper_parallel {

struct ModelFamily {
  std::string name;
  // The module a transformers config.json describes (config fields the family cannot
  // represent are refused, naming the field and its value).
  std::function<std::shared_ptr<torch::nn::Module>(const std::string& config_json_path)> from_hf_config;
  // The same from a config.json's text (e.g. the one a checkpoint recorded), with no file;
  // `source` names it in errors.
  std::function<std::shared_ptr<torch::nn::Module>(const std::string& config_json, const std::string& source)>
      from_hf_config_json;
  // Applies the family's TP plan. Each rank shards its own copy of the weights, with no
  // scatter (src_data_rank = nullopt): every rank built the same module from one seed, or
  // is about to load its shard from a checkpoint.
  std::function<void(torch::nn::Module& model, const DeviceMesh& tp_mesh, bool loss_parallel, bool sequence_parallel)>
      parallelize;
  std::function<HfAdapter(const torch::nn::Module& model)> hf_adapter;
  // config.json for `model` (what from_hf_config reads back as the same model).
  std::function<std::string(const torch::nn::Module& model)> to_hf_config;
  // The module of these sizes alone (hp-train's [model] keys without a config.json); null
  // when the sizes do not say the family's whole shape (its config.json is needed).
  std::function<std::shared_ptr<torch::nn::Module>(const DecoderSizes& sizes)> from_sizes;
  // The bytes one block of `model` (parallelized, possibly on meta tensors) keeps for
  // backward in eager mode without checkpointing (block_activations.h); null: the family
  // gives no estimate, and hp-dry-run says so rather than guessing.
  std::function<int64_t(const torch::nn::Module& model, const BlockActivationShape& shape)> block_activation_bytes;
  // The family's shape rules, checked when a job is validated, before anything is built:
  // what its [model] sizes must obey, and what a TP degree asks of them; each violation a
  // message naming the keys. Null: the decoder's (decoder_size_rules.h).
  std::function<std::vector<std::string>(const DecoderSizes& sizes)> size_errors;
  std::function<std::vector<std::string>(const DecoderSizes& sizes, int64_t tp)> tp_size_errors;
};

// The family called `name`; an unknown name throws std::invalid_argument listing the known ones.
// The reference stays valid for the life of the process.
const ModelFamily& model_family(const std::string& name);
// The library's families, then the registered ones, in registration order.
std::vector<std::string> model_family_names();

// ':'-separated shared libraries, each exporting
// `extern "C" void hyper_parallel_register_model_families()`, which registers its families
// (register_model_family, and register_train_spec for a spec of its own). Loaded at the
// first lookup of a family (model_family, model_family_names) in any program, as the op
// rules' HYPER_PARALLEL_OPS_PLUGIN_PATH is; a library that cannot be loaded, or lacks the
// entry point, is a std::invalid_argument naming it and the variable, at every lookup.
inline constexpr const char* kModelPluginPathVariable = "HYPER_PARALLEL_MODEL_PLUGIN_PATH";
// The same for a ':'-separated list given here (a program's own option); a library loaded
// already (by path) is not loaded again.
void load_model_family_plugins(const std::string& paths);

// Adds `family` to the registry, from any thread. Refused (std::invalid_argument naming the
// field): an empty or taken name, or a missing from_hf_config, from_hf_config_json,
// parallelize or hf_adapter (to_hf_config, from_sizes and block_activation_bytes may be null:
// no export, no [model]-sizes build, no activation estimate).
void register_model_family(ModelFamily family);

// export_hf_checkpoint (hf_checkpoint.h) with the family's adapter and config.json.
HfExportResult export_hf_checkpoint(const torch::nn::Module& model, const ModelFamily& family,
                                    const std::string& folder, const HfExportOptions& options = {});

}  // namespace hyper_parallel

HP_PUBLIC_END
