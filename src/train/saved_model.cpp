#include "train/saved_model.h"

#include <ATen/core/grad_mode.h>

#include <stdexcept>

#include "compat/file_system.h"
#include "train/checkpoint_io.h"
#include "train/checkpoint_reshard.h"
#include "train/trainer.h"

namespace hyper_parallel::train {

namespace {

// The recorded [model] keys over the defaults, each through the config's own parser.
ModelConfig recorded_model(const nlohmann::json& model, const std::string& where) {
  JobConfig cfg;
  for (const auto& [key, value] : model.items()) {
    try {
      apply_override(cfg, "model." + key, value.is_string() ? value.get<std::string>() : value.dump());
    } catch (const std::exception& e) {
      throw std::runtime_error(where + ": the recorded model." + key + " = " + value.dump() +
                               " cannot be read by this hp-train: " + e.what());
    }
  }
  if (cfg.model.name != "llama") {
    throw std::runtime_error(where + ": model.name = \"" + cfg.model.name + "\": hp-train checkpoints hold llama models");
  }
  return cfg.model;
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
  out.model = Llama(llama_args(out.config));

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
  ReshardPlan plan(layouts, saved_tp, targets, 0);
  for (int64_t r : plan.sources()) {
    const int64_t file_rank = saved_file_rank(saved_dp, saved_tp, 0, r);
    plan.take(r, read_verified_rank_file(dir, manifest, file_rank).tensors,
              compat::join_path(dir, rank_file_name(file_rank)));
  }
  const auto values = plan.finish();
  at::NoGradGuard no_grad;
  for (const auto& p : out.model->named_parameters()) p.value().copy_(values.at("model." + p.key()));
  return out;
}

}  // namespace hyper_parallel::train
