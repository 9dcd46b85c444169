#include "train/checkpoint/checkpoint_manager.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ostream>
#include <random>
#include <unistd.h>

#include "hyper_parallel/core/distributed.h"
#include "hyper_parallel/dtensor/dtensor.h"
#include "hyper_parallel_train/spec/train_spec.h"
#include "compat/file_system.h"
#include "hyper_parallel/core/run_then_agree.h"
#include "train/checkpoint/checkpoint_io.h"
#include "train/checkpoint/checkpoint_layout.h"
#include "train/checkpoint/checkpoint_reshard.h"
#include "train/data/data_identity.h"
#include "train/checkpoint/fault_injection.h"
#include "train/parallel/local_piece.h"
#include "hyper_parallel_train/checkpoint/saved_model.h"
#include "hyper_parallel_train/config/parallel_dims.h"
#include "hyper_parallel_train/spec/parallelized_model.h"

namespace hyper_parallel::train {

namespace {

// The identity's model: the family's name and the module's resolved sizes, each under its
// [model] key (load_saved_model rebuilds the module from them).
nlohmann::json model_json(const std::string& name, const DecoderSizes& s) {
  return {{"name", name},
          {"dim", s.dim},
          {"n_layers", s.n_layers},
          {"n_heads", s.n_heads},
          {"n_kv_heads", s.n_kv_heads},
          {"head_dim", s.head_dim},
          {"vocab_size", s.vocab_size},
          {"ffn_hidden_dim", s.ffn_hidden_dim},
          {"norm_eps", s.norm_eps},
          {"rope_theta", s.rope_theta},
          {"max_seq_len", s.max_seq_len},
          {"tie_word_embeddings", s.tie_word_embeddings}};
}

// 64 random bits as hex: unique enough to tell two runs' files apart.
std::string new_run_id() {
  std::random_device device;
  const uint64_t bits = (static_cast<uint64_t>(device()) << 32) ^ device() ^
                        static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
                        (static_cast<uint64_t>(::getpid()) << 16);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(bits));
  return buf;
}

// Step folders ("step-<N>") in a checkpoint folder; with `complete`, only those whose
// save finished (a manifest), i.e. the resume points a fresh run would lose.
std::vector<std::string> step_folders(const std::string& folder, bool complete) {
  std::vector<std::string> out;
  for (const auto& name : compat::list_directory(folder)) {
    const std::string dir = compat::join_path(folder, name);
    if (name.rfind("step-", 0) != 0 || !compat::is_directory(dir)) continue;
    if (!complete || compat::path_exists(compat::join_path(dir, kManifestName))) out.push_back(name);
  }
  return out;
}

// For an error about step `step`: the verified steps before it (a manifest: written only
// after every file verified) and the flag that resumes from one.
std::string other_verified_steps(const std::string& folder, int64_t step) {
  int64_t last = -1;
  for (const auto& name : step_folders(folder, /*complete=*/true)) {
    const int64_t s = std::atoll(name.c_str() + 5);
    if (s < step) last = std::max(last, s);
  }
  if (last < 0) {
    return "no verified step before it is left: start over with --checkpoint.overwrite (deleting the folder's "
           "checkpoints)";
  }
  return "the last verified step before it is " + std::to_string(last) +
         ": resume from it with --checkpoint.resume "
         "--checkpoint.load_step " +
         std::to_string(last);
}

// A checkpoint of a different model is refused before any file is read, naming the
// fields and the tensors whose shapes differ (the latter only where the checkpoint
// records layouts). `targets`: this job's parameters.
void refuse_a_different_model(const StepManifest& manifest, const CheckpointIdentity& job,
                              const std::vector<ReshardTarget>& targets, const std::string& dir) {
  std::vector<std::string> problems = model_mismatches(manifest.identity, job);
  if (manifest.tensors) {
    const auto tensors = layout_mismatches(*manifest.tensors, targets);
    problems.insert(problems.end(), tensors.begin(), tensors.end());
    for (const auto& entry : *manifest.tensors) {
      // (not a structured binding: clang 14 cannot capture one in the lambda)
      const std::string& key = entry.first;
      const TensorLayout& l = entry.second;
      const bool ours =
          std::any_of(targets.begin(), targets.end(), [&](const ReshardTarget& t) { return t.key == key; });
      if (key.rfind("model.", 0) == 0 && !ours) {
        problems.push_back("tensor " + key + ": checkpoint " + shape_string(l.shape) + " " + c10::toString(l.dtype) +
                           ", not in this job");
      }
    }
  }
  if (problems.empty()) return;
  std::string text;
  for (const auto& m : problems) text += "\n  " + m;
  throw std::runtime_error("cannot resume from '" + dir + "': the checkpoint was written by a different job:" + text +
                           "\nresume with the checkpoint's settings, or start over with --checkpoint.overwrite");
}

// AdamW's state of each parameter from `values` (by "optim.<i>.<name>"), where the
// checkpoint has it; the moments take their parameter's device and layout.
void restore_adamw_state(torch::optim::Optimizer& optimizer,
                         const std::vector<std::pair<std::string, at::Tensor>>& named,
                         const std::map<std::string, at::Tensor>& values) {
  auto& state = optimizer.state();
  for (size_t i = 0; i < named.size(); ++i) {
    const std::string key = "optim." + std::to_string(i) + ".";
    if (!values.count(key + "step")) continue;
    const at::Tensor& p = named[i].second;
    auto wrap = [&](const at::Tensor& saved_piece) {
      return shaped_like(saved_piece.to(p.device(), /*non_blocking=*/false, /*copy=*/true), p);
    };
    auto s = std::make_unique<torch::optim::AdamWParamState>();
    s->step(values.at(key + "step").item<int64_t>());
    s->exp_avg(wrap(values.at(key + "exp_avg")));
    s->exp_avg_sq(wrap(values.at(key + "exp_avg_sq")));
    state[p.unsafeGetTensorImpl()] = std::move(s);
  }
}

// "TP 2", or with FSDP "FSDP 2 x TP 2".
std::string layout_name(int64_t shard, int64_t tp) {
  return (shard > 1 ? "FSDP " + std::to_string(shard) + " x " : std::string()) + "TP " + std::to_string(tp);
}

}  // namespace

CheckpointManager::CheckpointManager(const JobConfig& config, int64_t rank, std::optional<DeviceMesh> world_mesh,
                                     nlohmann::json hf_config, const DecoderSizes& sizes, std::ostream* log)
    : config_(config),
      folder_(job_folder(config, config.checkpoint.folder)),
      rank_(rank),
      world_mesh_(std::move(world_mesh)),
      hf_config_(std::move(hf_config)),
      sizes_(sizes),
      log_(log) {
  // One id for the run, from rank 0; a resume replaces it with the checkpoint's.
  at::Tensor id = at::zeros(
      {1}, at::TensorOptions().dtype(at::kLong).device(world_mesh_ ? world_mesh_->device() : at::Device(at::kCPU)));
  if (rank_ == 0) id.fill_(static_cast<int64_t>(std::stoull(new_run_id(), nullptr, 16)));
  // Rank 0 is coordinate 0 on every mesh dim: down the first dim, then along the rest.
  if (world_mesh_) {
    for (int64_t d = 0; d < world_mesh_->ndim(); ++d) world_mesh_->comm(d).broadcast_(id, 0);
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(id.cpu().item<int64_t>()));
  run_id_ = buf;
}

CheckpointIdentity CheckpointManager::identity(int64_t step) const {
  CheckpointIdentity id;
  id.run_id = run_id_;
  id.step = step;
  id.world_size = is_initialized() ? get_world_size() : 1;
  id.tensor_parallel_degree = config_.parallelism.tensor_parallel_degree;
  id.data_parallel_degree = config_.parallelism.data_parallel_degree;
  id.data_parallel_shard_degree = config_.parallelism.data_parallel_shard_degree;
  id.dtype = config_.training.dtype;
  id.model = model_json(config_.model.name, sizes_);
  // A Hugging Face model's whole config (kv heads, head_dim, tying, rope scaling are not
  // [model] keys): a resume on another config is refused, and an export can rebuild it.
  if (!hf_config_.is_null()) id.model["hf_config"] = hf_config_;
  id.data = data_identity_;
  return id;
}

bool CheckpointManager::has_resume_point() const {
  if (config_.checkpoint.load_step >= 0) return true;
  try {
    return read_latest_marker(folder_).has_value();
  } catch (const std::exception&) {
    return true;
  }
}

void CheckpointManager::prepare_folder() const {
  const std::string& folder = folder_;
  // Two agreed phases: every rank reads the folder (and refuses an earlier run's checkpoints
  // with its own message) before rank 0 deletes anything in it. Deleting while another rank
  // read made that rank fail to open the marker rank 0 had just unlinked.
  bool overwrite_earlier_run = false;
  run_then_agree("reading the checkpoint folder", world_mesh_, [&] {
    if (config_.checkpoint.resume) return;
    std::optional<int64_t> latest = read_latest_marker(folder);
    const auto complete = step_folders(folder, /*complete=*/true);
    const auto steps = step_folders(folder, /*complete=*/false);
    if ((latest || !complete.empty()) && !config_.checkpoint.overwrite) {
      throw std::runtime_error(
          "checkpoint folder '" + folder + "' already holds checkpoints of an earlier run (" +
          (latest ? "latest: step " + std::to_string(*latest) : std::to_string(complete.size()) + " saved step(s)") +
          "); starting a fresh run there would lose its resume point. Pass --checkpoint.resume to continue "
          "that run, or --checkpoint.overwrite to delete its checkpoints and start over");
    }
    overwrite_earlier_run = config_.checkpoint.overwrite && (latest || !steps.empty());
  });
  run_then_agree("preparing the checkpoint folder", world_mesh_, [&] {
    if (rank_ != 0) return;
    const auto removed = remove_temp_files(folder);
    if (!removed.empty() && log_) {
      *log_ << "hp-train: removed " << removed.size() << " temporary file(s) of an interrupted save, e.g. "
            << removed.front() << std::endl;
    }
    if (!overwrite_earlier_run) return;
    if (::unlink(compat::join_path(folder, "latest").c_str()) != 0 && errno != ENOENT) {
      throw std::runtime_error("--checkpoint.overwrite: cannot remove '" + compat::join_path(folder, "latest") +
                               "': " + std::strerror(errno));
    }
    for (const auto& step : step_folders(folder, /*complete=*/false))
      compat::remove_all(compat::join_path(folder, step));
    if (log_)
      *log_ << "hp-train: --checkpoint.overwrite: deleted the earlier run's checkpoints in " << folder << std::endl;
  });
}

void CheckpointManager::save(int64_t step, const TrainedState& state) const {
  std::map<std::string, at::Tensor> tensors;
  nlohmann::json extra;
  LayoutTable layouts;  // the same on every rank; rank 0 records it in the manifest
  // The weights the optimizer updates (float32 masters in bfloat16 training).
  for (const auto& [name, v] : state.parameters) {
    tensors["model." + name] = local_or_plain(v).detach().clone();
    extra["placements"][name] = is_dtensor(v) ? to_string(placements_of(v)) : "plain";
    layouts["model." + name] = layout_of(v, "model." + name);
  }
  // Optimizer state per parameter, by its position in the parameter list.
  const auto& params = state.parameters;
  auto& adamw = state.optimizer->state();
  for (size_t i = 0; i < params.size(); ++i) {
    auto it = adamw.find(params[i].second.unsafeGetTensorImpl());
    if (it == adamw.end()) continue;
    auto& s = static_cast<torch::optim::AdamWParamState&>(*it->second);
    const std::string key = "optim." + std::to_string(i) + ".";
    auto local = [](const at::Tensor& t) { return local_or_plain(t).detach().clone(); };
    tensors[key + "exp_avg"] = local(s.exp_avg());
    tensors[key + "exp_avg_sq"] = local(s.exp_avg_sq());
    tensors[key + "step"] = at::scalar_tensor(s.step(), at::kLong);
    // The moments have their parameter's layout; the step counter is one scalar.
    for (const char* moment : {"exp_avg", "exp_avg_sq"}) {
      TensorLayout l = layout_of(params[i].second, key + moment);
      l.dtype = tensors[key + moment].scalar_type();
      layouts[key + moment] = l;
    }
    layouts[key + "step"] = step_counter_layout();
  }
  const CheckpointIdentity id = identity(step);
  const std::string dir = step_directory(folder_, step);
  const std::string what = "saving the checkpoint of step " + std::to_string(step);
  // 1. Every rank writes its file.
  run_then_agree(what, world_mesh_, [&] {
    make_directories(dir);
    write_tensor_file(compat::join_path(dir, rank_file_name(rank_)), tensors, rank_file_metadata(id, rank_, extra),
                      "rank_file", rank_);
    crash_point("rank_file.written", rank_);
  });
  // 2. Rank 0 verifies every file, writes the manifest, then moves `latest`.
  run_then_agree(what, world_mesh_, [&] {
    if (rank_ != 0) return;
    StepManifest manifest = verify_step_files(dir, id);
    manifest.tensors = layouts;
    crash_point("step.verified", rank_);
    write_manifest(dir, manifest, rank_);
    crash_point("manifest.written", rank_);
    write_latest_marker(folder_, step, rank_);
    crash_point("latest.written", rank_);
  });
}

std::optional<int64_t> CheckpointManager::load(const TrainedState& state) {
  std::optional<int64_t> step;
  run_then_agree("loading the checkpoint", world_mesh_, [&] {
    const int64_t chosen = config_.checkpoint.load_step;
    step = chosen >= 0 ? std::optional<int64_t>(chosen) : read_latest_marker(folder_);
    if (step) {
      const std::string dir = step_directory(folder_, *step);
      if (!compat::path_exists(compat::join_path(dir, kManifestName))) {
        throw std::runtime_error(
            (chosen >= 0
                 ? "--checkpoint.load_step " + std::to_string(chosen) + ": "
                 : "'" + compat::join_path(folder_, "latest") + "' names step " + std::to_string(*step) + ", but ") +
            "'" + dir +
            (compat::is_directory(dir) ? "' has no " + std::string(kManifestName) + " (its save did not complete)"
                                       : "' does not exist") +
            "; " + other_verified_steps(folder_, *step));
      }
      load_step(*step, state);
    }
  });
  return step;
}

std::optional<int64_t> CheckpointManager::resume(const TrainedState& state, int64_t training_steps) {
  const std::optional<int64_t> step = load(state);
  if (step && *step > training_steps) {
    throw std::invalid_argument("the checkpoint in " + folder_ + " is at step " + std::to_string(*step) +
                                ", past training.steps = " + std::to_string(training_steps) +
                                ": nothing to resume; raise --training.steps above " + std::to_string(*step) +
                                " to train on");
  }
  if (rank_ == 0 && log_) {
    *log_ << (step ? "hp-train: resumed from step " + std::to_string(*step) + " (run " + run_id_ + ")"
                   : std::string("hp-train: --checkpoint.resume: no checkpoint in ") + folder_ +
                         ", starting from step 0")
          << std::endl;
    if (step && *step == training_steps) {
      *log_ << "hp-train: the checkpoint is at step " << *step << " = training.steps: nothing left to train "
            << "(raise --training.steps to train on)" << std::endl;
    }
  }
  return step;
}

namespace {

// AdamW's state, where the checkpoint has it: the moments laid out as their parameter (the
// first `parameters` targets, in order).
void add_adamw_targets(std::vector<ReshardTarget>& targets, const LayoutTable& layouts, size_t parameters) {
  for (size_t i = 0; i < parameters; ++i) {
    const std::string key = "optim." + std::to_string(i) + ".";
    if (!layouts.count(key + "step")) continue;
    const ReshardTarget param = targets[i];
    targets.push_back({key + "exp_avg", param.layout, param.box});
    targets.push_back({key + "exp_avg_sq", param.layout, param.box});
    targets.push_back({key + "step", step_counter_layout(), Box{}});
  }
}

// Weights (or AdamW moments) that are not finite would only train on NaN.
void refuse_non_finite(const std::map<std::string, at::Tensor>& values, const std::string& dir,
                       const std::string& folder, int64_t step) {
  for (const auto& [key, value] : values) {
    if (!value.is_floating_point() || at::isfinite(value).all().item<bool>()) continue;
    throw std::runtime_error("cannot resume from '" + dir + "': '" + key +
                             "' holds NaN or infinite values (the run had diverged before this save); " +
                             other_verified_steps(folder, step));
  }
}

// This rank's piece (`piece` of a replica at TP `tp`) of every parameter, named "model.<name>".
std::vector<ReshardTarget> parameter_targets(const std::vector<std::pair<std::string, at::Tensor>>& named, int64_t tp,
                                             int64_t piece) {
  std::vector<ReshardTarget> targets;
  for (const auto& [name, value] : named) {
    const TensorLayout l = layout_of(value, "model." + name);
    targets.push_back({"model." + name, l, piece_of(l, tp, piece)});
  }
  return targets;
}

// A manifest's layout is one this hp-train can read: world = dp x shard x tp, each >= 1.
void check_saved_layout(const CheckpointIdentity& saved, const std::string& dir) {
  const int64_t tp = saved.tensor_parallel_degree, dp = saved.data_parallel_degree;
  const int64_t shard = saved.data_parallel_shard_degree;
  if (tp < 1 || dp < 1 || shard < 1 || saved.world_size != tp * dp * shard) {
    throw std::runtime_error("checkpoint manifest '" + compat::join_path(dir, kManifestName) + "': world size " +
                             std::to_string(saved.world_size) + " is not its data parallel degree " +
                             std::to_string(dp) + " x shard degree " + std::to_string(shard) +
                             " x tensor parallel degree " + std::to_string(tp));
  }
}

// The layouts of a checkpoint written before manifests recorded them: the job's own (only
// the same layout can read it), for the parameters and the AdamW state the file holds.
LayoutTable own_file_layouts(const TensorFile& own, const std::vector<ReshardTarget>& targets, size_t parameters) {
  LayoutTable layouts;
  for (const auto& t : targets) layouts[t.key] = t.layout;
  for (size_t i = 0; i < parameters; ++i) {
    const std::string key = "optim." + std::to_string(i) + ".";
    if (!own.tensors.count(key + "step")) continue;
    layouts[key + "exp_avg"] = layouts[key + "exp_avg_sq"] = targets[i].layout;
    layouts[key + "step"] = step_counter_layout();
  }
  return layouts;
}

}  // namespace

void CheckpointManager::check_data(const CheckpointIdentity& saved, int64_t step, const std::string& dir) const {
  if (saved.data.is_null()) {
    if (rank_ == 0 && log_) {
      *log_ << "hp-train: the checkpoint of step " << step << " records no data identity (an older hp-train): "
            << "that the data is the same is not checked" << std::endl;
    }
  } else if (const auto changed = data_mismatches(saved.data, data_identity_); !changed.empty()) {
    std::string list;
    for (const auto& c : changed) list += (list.empty() ? "" : "; ") + c;
    if (!config_.checkpoint.allow_data_change) {
      throw std::runtime_error(
          "cannot resume from '" + dir + "' on other data than it was trained on: " + list +
          ". Its weights belong to its data (a text corpus's word ids come from the file, the synthetic "
          "language and every batch from the seed); pass --checkpoint.allow_data_change to train them on this "
          "data on purpose (fine-tuning)");
    }
    if (rank_ == 0 && log_) {
      *log_ << "hp-train: --checkpoint.allow_data_change: training the checkpoint of step " << step
            << " on other data: " << list << std::endl;
    }
  } else if (const auto moved = data_moved(saved.data, data_identity_); moved && rank_ == 0 && log_) {
    *log_ << "hp-train: " << *moved << std::endl;
  }
}

void CheckpointManager::load_step(int64_t step, const TrainedState& state) {
  const std::string dir = step_directory(folder_, step);
  const CheckpointIdentity job = identity(step);
  const StepManifest manifest = read_step_manifest(dir, step);
  const CheckpointIdentity& saved = manifest.identity;
  // The layouts saved and now (parallel_dims.h): a replica's ranks hold its pieces.
  const ParallelDims now(job.data_parallel_degree, job.data_parallel_shard_degree, job.tensor_parallel_degree);
  const int64_t tp = now.tp(), shard = now.dp_shard();
  const int64_t piece = now.piece_of(rank_), replica = now.replica_of(rank_);
  check_saved_layout(saved, dir);
  const ParallelDims before(saved.data_parallel_degree, saved.data_parallel_shard_degree, saved.tensor_parallel_degree);
  const int64_t saved_tp = before.tp(), saved_shard = before.dp_shard();
  // This rank's piece of every parameter at this job's TP (and FSDP) degree.
  // (float32 masters in bfloat16 training, FSDP's shards: what the checkpoint holds)
  const auto& named = state.parameters;
  std::vector<ReshardTarget> targets = parameter_targets(named, tp, piece);
  refuse_a_different_model(manifest, job, targets, dir);
  check_data(saved, step, dir);
  // Replicas saved the same state, so one replica's files are enough: replica r reads saved
  // replica r mod saved_dp, its own files when the layout is unchanged, and the reads spread
  // over the saved replicas otherwise.
  const int64_t saved_replica = replica % before.dp_replicate();
  const bool resharding = saved_tp != tp || saved_shard != shard;
  auto read = [&](int64_t saved_piece) {
    const int64_t file_rank = before.rank_of(saved_replica, saved_piece);
    try {
      return read_verified_rank_file(dir, manifest, file_rank);
    } catch (const std::runtime_error& e) {
      if (!resharding) throw;
      throw std::runtime_error(std::string(e.what()) + " (rank " + std::to_string(rank_) +
                               " needs it to reshard the checkpoint from " + layout_name(saved_shard, saved_tp) +
                               " to " + layout_name(shard, tp) + ")");
    }
  };
  LayoutTable layouts;
  std::optional<TensorFile> own;  // read early only for a checkpoint without layouts
  if (manifest.tensors) {
    layouts = *manifest.tensors;
  } else {
    // Written before checkpoints recorded layouts: only this layout can read it, and then
    // the job's own layouts are the saved ones.
    if (resharding) {
      throw std::runtime_error("cannot resume from '" + dir + "' at TP " + std::to_string(tp) +
                               ": the checkpoint was saved at TP " + std::to_string(saved_tp) +
                               " by an hp-train that recorded no tensor layouts, so it cannot be resharded; resume "
                               "it with --parallelism.tensor_parallel_degree " +
                               std::to_string(saved_tp));
    }
    own = read(piece);
    layouts = own_file_layouts(*own, targets, named.size());
  }
  add_adamw_targets(targets, layouts, named.size());
  ReshardPlan plan(layouts, saved_tp, targets, piece % before.pieces(), saved_shard);
  for (int64_t r : plan.sources()) {
    const std::string path = compat::join_path(dir, rank_file_name(before.rank_of(saved_replica, r)));
    if (own && r == piece) {
      plan.take(r, own->tensors, path);
    } else {
      plan.take(r, read(r).tensors, path);
    }
  }
  own.reset();
  const std::map<std::string, at::Tensor> values = plan.finish();
  refuse_non_finite(values, dir, folder_, step);
  if (rank_ == 0 && log_ && (resharding || saved.world_size != job.world_size)) {
    *log_ << "hp-train: resharded the checkpoint of step " << step << " from " << before.describe() << " to "
          << now.describe() << " (rank 0 read " << plan.sources().size() << " of its " << saved.world_size << " files)"
          << std::endl;
  }
  at::NoGradGuard no_grad;
  for (const auto& [name, value] : named) {
    at::Tensor dst = local_or_plain(value);
    dst.copy_(values.at("model." + name));
  }
  if (state.model) state.model->copy_trained_to_model();
  restore_adamw_state(*state.optimizer, named, values);
  run_id_ = saved.run_id;
}

void CheckpointManager::save_in_hf(int64_t step) const {
  const std::string out = hf_export_folder(config_, step);
  run_then_agree(
      "writing step " + std::to_string(step) + " as a Hugging Face checkpoint in '" + out + "'", world_mesh_, [&] {
        if (rank_ != 0) return;
        const SavedModel saved = load_saved_model(folder_, step);
        HfExportOptions options;
        options.dtype = config_.checkpoint.export_dtype == "bfloat16" ? at::kBFloat16 : at::kFloat;
        options.source_folder = config_.model.hf_assets_path;
        const HfExportResult r = export_hf_checkpoint(*saved.model, train_spec(saved.config.name), out, options);
        if (log_) {
          *log_ << "hp-train: step " << step << " written as a Hugging Face checkpoint in " << out << " ("
                << r.files.size() << " files, " << r.total_bytes << " bytes of " << config_.checkpoint.export_dtype
                << " tensors)" << std::endl;
        }
      });
}

}  // namespace hyper_parallel::train
