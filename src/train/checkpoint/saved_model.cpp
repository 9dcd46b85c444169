#include "train/checkpoint/saved_model.h"

#include <ATen/core/grad_mode.h>

#include <unistd.h>

#include <fstream>
#include <stdexcept>

#include "compat/file_system.h"
#include "hyper_parallel/model_registry.h"
#include "train/checkpoint/checkpoint_io.h"
#include "train/checkpoint/checkpoint_reshard.h"
#include "train/config/job_model.h"

namespace hyper_parallel::train {

namespace {

// The recorded [model] keys over the defaults, each through the config's own parser
// (hf_config is the Hugging Face config.json a fine-tuning job started from, not a key).
ModelConfig recorded_model(const nlohmann::json& model, const std::string& where) {
  JobConfig cfg;
  for (const auto& [key, value] : model.items()) {
    if (key == "hf_config") continue;
    try {
      apply_override(cfg, "model." + key, value.is_string() ? value.get<std::string>() : value.dump());
    } catch (const std::exception& e) {
      throw std::runtime_error(where + ": the recorded model." + key + " = " + value.dump() +
                               " cannot be read by this hp-train: " + e.what());
    }
  }
  if (cfg.model.name != "llama" && !model.contains("hf_config")) {
    throw std::runtime_error(where + ": model.name = \"" + cfg.model.name +
                             "\" without a recorded config.json: hp-train builds only llama from [model] sizes");
  }
  return cfg.model;
}

// The module the job trained: from its recorded config.json through its family (GQA,
// head_dim, rope scaling, the tie and a family's own fields live only there), else a Llama
// from the [model] sizes.
Llama recorded_module(const nlohmann::json& model, const ModelConfig& config, const std::string& where) {
  if (!model.contains("hf_config")) return Llama(llama_args(config));
  // Families read a config.json file: the recorded one, written to a scratch folder.
  const std::string folder =
      compat::join_path(compat::temp_directory(), "hp_saved_model_" + std::to_string(::getpid()));
  compat::create_directories(folder);
  const std::string path = compat::join_path(folder, "config.json");
  { std::ofstream(path) << model.at("hf_config").dump(); }
  std::shared_ptr<torch::nn::Module> module;
  try {
    module = model_family(config.name).from_hf_config(path);
  } catch (const std::exception& e) {
    compat::remove_all(folder);
    throw std::runtime_error(where + ": the recorded model.hf_config: " + e.what());
  }
  compat::remove_all(folder);
  return as_llama(*module);
}

}  // namespace

SavedModel load_saved_model(const std::string& checkpoint_folder, std::optional<int64_t> step) {
  SavedModel out;
  if (!step) step = read_latest_marker(checkpoint_folder);
  if (!step) throw std::runtime_error("no checkpoint in '" + checkpoint_folder + "' (no 'latest' marker)");
  const std::string dir = step_directory(checkpoint_folder, *step);
  const std::string manifest_path = compat::join_path(dir, kManifestName);
  if (!compat::path_exists(manifest_path)) {
    throw std::runtime_error("'" + manifest_path + "' does not exist: step " + std::to_string(*step) +
                             " was not (completely) saved");
  }
  const StepManifest manifest = read_manifest(dir);
  out.step = *step;
  out.identity = manifest.identity;
  out.config = recorded_model(manifest.identity.model, manifest_path);
  out.model = recorded_module(manifest.identity.model, out.config, manifest_path);

  const int64_t saved_tp = manifest.identity.tensor_parallel_degree, saved_dp = manifest.identity.data_parallel_degree;
  LayoutTable layouts;
  if (manifest.tensors) {
    layouts = *manifest.tensors;
  } else if (saved_tp != 1) {
    throw std::runtime_error("'" + manifest_path + "' was written at TP " + std::to_string(saved_tp) +
                             " by an hp-train that recorded no tensor layouts; resume it at TP " +
                             std::to_string(saved_tp) + " and save again to export it");
  }
  const std::string dtype_key = "model." + out.model->named_parameters().begin()->key();
  if (layouts.count(dtype_key)) out.model->to(layouts.at(dtype_key).dtype);
  std::vector<ReshardTarget> targets;
  for (const auto& p : out.model->named_parameters()) {
    const TensorLayout l = layout_of(p.value(), "model." + p.key());
    targets.push_back({"model." + p.key(), l, piece_of(l, 1, 0)});
    if (!manifest.tensors) layouts[targets.back().key] = l;  // TP 1 without layouts: the files hold whole tensors
  }
  const int64_t saved_shard = manifest.identity.data_parallel_shard_degree;
  ReshardPlan plan(layouts, saved_tp, targets, 0, saved_shard);
  for (int64_t r : plan.sources()) {
    const int64_t file_rank = saved_file_rank(saved_dp, saved_tp, 0, r, saved_shard);
    plan.take(r, read_verified_rank_file(dir, manifest, file_rank).tensors,
              compat::join_path(dir, rank_file_name(file_rank)));
  }
  const auto values = plan.finish();
  at::NoGradGuard no_grad;
  for (const auto& p : out.model->named_parameters()) p.value().copy_(values.at("model." + p.key()));
  return out;
}

}  // namespace hyper_parallel::train
