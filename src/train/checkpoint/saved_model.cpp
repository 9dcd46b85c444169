#include "hyper_parallel_train/checkpoint/saved_model.h"

#include <ATen/core/grad_mode.h>
#include <torch/nn/module.h>

#include <stdexcept>

#include "compat/file_system.h"
#include "hyper_parallel_train/config/parallel_dims.h"
#include "train/checkpoint/checkpoint_io.h"
#include "train/checkpoint/checkpoint_manifest.h"
#include "train/checkpoint/checkpoint_reshard.h"
#include "hyper_parallel_train/spec/train_spec.h"

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
  return cfg.model;
}

// The module the job trained: from its recorded config.json through its family's train
// spec (GQA, head_dim, rope scaling, the tie and a family's own fields live only there),
// else from the [model] sizes.
std::shared_ptr<torch::nn::Module> recorded_module(const nlohmann::json& model, const ModelConfig& config,
                                                   const std::string& where) {
  try {
    return train_spec(config.name).rebuild(config, model.contains("hf_config") ? model.at("hf_config").dump() : "");
  } catch (const std::exception& e) {
    throw std::runtime_error(where + ": the recorded model (model.name = \"" + config.name + "\"): " + e.what());
  }
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

  const ParallelDims saved(manifest.identity.data_parallel_degree, manifest.identity.data_parallel_shard_degree,
                           manifest.identity.tensor_parallel_degree);
  const int64_t saved_tp = saved.tp();
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
  ReshardPlan plan(layouts, saved_tp, targets, 0, saved.dp_shard());
  for (int64_t r : plan.sources()) {
    const int64_t file_rank = saved.rank_of(/*replica=*/0, r);
    plan.take(r, read_verified_rank_file(dir, manifest, file_rank).tensors,
              compat::join_path(dir, rank_file_name(file_rank)));
  }
  const auto values = plan.finish();
  at::NoGradGuard no_grad;
  for (const auto& p : out.model->named_parameters()) p.value().copy_(values.at("model." + p.key()));
  return out;
}

}  // namespace hyper_parallel::train
