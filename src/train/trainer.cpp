#include "train/trainer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <nlohmann/json.hpp>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adamw.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <random>
#include <sys/resource.h>
#include <unistd.h>

#include "hyper_parallel/distributed.h"
#include "hyper_parallel/dtensor.h"
#include "hyper_parallel/fused_linear_loss.h"
#include "hyper_parallel/parallelism_config.h"
#include "hyper_parallel/cpu_allocator.h"
#include "compat/file_system.h"
#include "core/collective_stats.h"
#include "train/checkpoint_io.h"
#include "train/fault_injection.h"
#include "train/metrics.h"
#include "train/optim_utils.h"
#include "train/progress.h"

namespace hyper_parallel::train {

namespace F = torch::nn::functional;

namespace {

at::ScalarType dtype_of(const std::string& name) {
  if (name == "float64") return at::kDouble;
  if (name == "bfloat16") return at::kBFloat16;
  return at::kFloat;
}

// The batch's loss, inside the context: cross_entropy over all tokens, on the model's device.
// fused: the head's matmul and the loss in one (fused_linear_loss.h), no logits tensor;
// the head's weight is the plan's Shard(0) DTensor under TP, a plain tensor at TP 1.
// after_forward (optional) runs when the model's forward is done: at the final norm when
// fused (the head matmul is part of the loss then), after the head otherwise.
at::Tensor compute_loss(Llama& model, const Batch& batch, bool fused,
                        const std::function<void()>& after_forward = {}) {
  const at::Device device = model->output->weight.device();
  const at::Tensor target = batch.target.to(device).flatten();
  if (fused) {
    at::Tensor hidden = model->hidden_states(batch.input.to(device));
    // Sequence parallel: the fused loss takes the whole sequence (one all-gather, as the
    // head's own input conversion does; backward slices the all-reduced gradient).
    if (is_dtensor(hidden)) hidden = redistribute(hidden, Placements{Placement::replicate()});
    if (after_forward) after_forward();
    return fused_linear_cross_entropy(hidden.flatten(0, 1), model->output->weight, target);
  }
  at::Tensor logits = model->forward(batch.input.to(device));
  if (after_forward) after_forward();
  return F::cross_entropy(logits.flatten(0, 1), target);
}

// This process's minor page faults and kernel CPU time so far (all threads).
struct KernelUsage {
  int64_t minor_faults = 0;
  double system_seconds = 0;
};

KernelUsage kernel_usage() {
  struct rusage usage {};
  if (::getrusage(RUSAGE_SELF, &usage) != 0) return {};
  return {static_cast<int64_t>(usage.ru_minflt),
          static_cast<double>(usage.ru_stime.tv_sec) + 1e-6 * static_cast<double>(usage.ru_stime.tv_usec)};
}

// Marks the boundaries between the phases of a step: each mark closes the phase that
// began at the previous one.
class PhaseClock {
 public:
  explicit PhaseClock(StepResult& r) : r_(r) { restart(); }
  void mark(size_t phase) {
    const auto now = std::chrono::steady_clock::now();
    const CollectiveTally tally = collective_tally();
    StepPhase& p = r_.phases[phase];
    p.seconds += std::chrono::duration<double>(now - start_).count();
    p.collectives += tally.count - tally_.count;
    p.collective_bytes += tally.bytes - tally_.bytes;
    p.collective_seconds += tally.seconds - tally_.seconds;
    start_ = now;
    tally_ = tally;
  }
  void restart() {
    start_ = std::chrono::steady_clock::now();
    tally_ = collective_tally();
  }

 private:
  StepResult& r_;
  std::chrono::steady_clock::time_point start_;
  CollectiveTally tally_;
};

enum Phase : size_t { kForward = 0, kLoss = 1, kBackward = 2, kClip = 3, kOptimizer = 4 };

double scalar_of(const at::Tensor& loss) {
  return (is_dtensor(loss) ? full_tensor(loss) : loss).detach().to(at::kDouble).item<double>();
}

std::string join(const std::string& a, const std::string& b) { return b.empty() || b[0] == '/' ? b : a + "/" + b; }

nlohmann::json model_json(const ModelConfig& m) {
  return {{"name", m.name},           {"dim", m.dim},
          {"n_layers", m.n_layers},   {"n_heads", m.n_heads},
          {"vocab_size", m.vocab_size}, {"ffn_hidden_dim", resolved_ffn_hidden_dim(m)},
          {"norm_eps", m.norm_eps},   {"rope_theta", m.rope_theta},
          {"max_seq_len", m.max_seq_len}};
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

}  // namespace

LlamaArgs llama_args(const ModelConfig& m) {
  LlamaArgs a;
  a.dim = m.dim;
  a.n_layers = m.n_layers;
  a.n_heads = m.n_heads;
  a.vocab_size = m.vocab_size;
  a.ffn_hidden_dim = m.ffn_hidden_dim;
  a.multiple_of = m.multiple_of;
  a.norm_eps = m.norm_eps;
  a.rope_theta = m.rope_theta;
  a.max_seq_len = m.max_seq_len;
  return a;
}

Validator::Validator(const ValidationConfig& config, const TrainingConfig& training, const at::Tensor& tokens,
                     TrainContext validation_context)
    : Validator(config, training,
                std::make_shared<BatchSampler>(tokens, training.batch_size, training.seq_len,
                                               static_cast<uint64_t>(training.seed) + 1),
                validation_context) {}

Validator::Validator(const ValidationConfig& config, const TrainingConfig& training,
                     std::shared_ptr<const BatchSource> batches, TrainContext validation_context)
    : config_(config),
      batches_(std::move(batches)),
      fused_linear_loss_(training.fused_linear_loss),
      context_(validation_context) {}

double Validator::validate(Llama& model) const {
  at::NoGradGuard no_grad;
  double total = 0;
  for (int64_t i = 0; i < config_.steps; ++i) {
    auto guard = context_();
    total += scalar_of(compute_loss(model, batches_->batch_at(i), fused_linear_loss_));
  }
  return total / static_cast<double>(std::max<int64_t>(1, config_.steps));
}

Trainer::Trainer(JobConfig config, std::ostream* log)
    : config_(std::move(config)), log_(log), train_context_(false) {
  validate(config_);
  TORCH_CHECK(!config_.checkpoint.resume || config_.checkpoint.enable,
              "hp-train: --checkpoint.resume needs checkpoint.enable = true (nothing would be read)");
  const auto& par = config_.parallelism;
  const int64_t world = is_initialized() ? get_world_size() : 1;
  rank_ = is_initialized() ? get_rank() : 0;
  TORCH_CHECK(world == par.tensor_parallel_degree, "hp-train: parallelism.tensor_parallel_degree = ",
              par.tensor_parallel_degree, " but the job has ", world,
              " ranks; launch with hp-run --nproc-per-node ", par.tensor_parallel_degree,
              " (data parallelism is not supported yet)");
  tp_enabled_ = par.tensor_parallel_degree > 1;
  loss_parallel_enabled_ = tp_enabled_ && !par.disable_loss_parallel;
  parallelism_scope_.emplace(par);
  train_context_ = get_train_context(loss_parallel_enabled_);

  // Large CPU buffers from a cache of huge-page-backed blocks that outlives each step: no
  // fresh-page faults after the first step (issue 14), whatever the environment says.
  if (config_.training.device == "cpu" && config_.training.caching_allocator) install_caching_cpu_allocator();
  model_ = Llama(llama_args(config_.model));
  model_->init_weights(static_cast<uint64_t>(config_.training.seed));
  const at::ScalarType dtype = dtype_of(config_.training.dtype);
  const at::Device device = is_initialized() ? current_world().device : at::Device(at::kCPU);
  TORCH_CHECK(device.type() == (config_.training.device == "cuda" ? at::kCUDA : at::kCPU),
              "hp-train: training.device = ", config_.training.device, " but the process group was "
              "initialised for ", device, "; initialise it with InitOptions{.device_type = \"",
              config_.training.device, "\"}");
  model_->to(device, dtype);
  if (tp_enabled_) {
    tp_mesh_ = init_device_mesh(config_.training.device, {par.tensor_parallel_degree}, {"tp"});
    parallelize_llama(model_, *tp_mesh_, loss_parallel_enabled_, par.sequence_parallel);
  }
  const auto& t = config_.training;
  optimizer_ = std::make_unique<torch::optim::AdamW>(
      model_->parameters(),
      torch::optim::AdamWOptions(t.lr).betas({t.beta1, t.beta2}).eps(t.eps).weight_decay(t.weight_decay));

  // Every TP rank builds the same batch (data parallelism, when it comes, shards the rows).
  std::string data_description;
  if (t.data.empty()) {
    // Generated per batch: memory and start-up do not depend on training.steps.
    auto train_stream = std::make_shared<SyntheticBatchStream>(config_.model.vocab_size, t.batch_size, t.seq_len,
                                                               static_cast<uint64_t>(t.seed), /*split=*/0);
    data_description = train_stream->describe();
    batches_ = train_stream;
    if (config_.validation.enable) {
      validator_ = std::make_unique<Validator>(
          config_.validation, t,
          std::make_shared<SyntheticBatchStream>(config_.model.vocab_size, t.batch_size, t.seq_len,
                                                 static_cast<uint64_t>(t.seed), /*split=*/1),
          train_context_);
    }
  } else {
    corpus_ = make_text_file_corpus(t.data, config_.model.vocab_size, t.seq_len + 1);
    data_description = corpus_->describe();
    batches_ = std::make_shared<BatchSampler>(corpus_->train_tokens(), t.batch_size, t.seq_len,
                                              static_cast<uint64_t>(t.seed));
    if (config_.validation.enable) {
      validator_ = std::make_unique<Validator>(config_.validation, t, corpus_->validation_tokens(), train_context_);
    }
  }
  if (rank_ == 0 && log_) {
    *log_ << "hp-train: " << data_description << "\n"
          << "hp-train: llama dim " << config_.model.dim << ", " << config_.model.n_layers << " layers, "
          << config_.model.n_heads << " heads, vocab " << config_.model.vocab_size << "; TP "
          << par.tensor_parallel_degree << ", loss parallel " << (loss_parallel_enabled_ ? "on" : "off")
          << (config_.training.fused_linear_loss ? ", fused linear loss" : "") << std::endl;
  }
  // One id for the run, from rank 0; a resume replaces it with the checkpoint's.
  {
    at::Tensor id = at::zeros({1}, at::TensorOptions().dtype(at::kLong).device(device));
    if (rank_ == 0) {
      run_id_ = new_run_id();
      id.fill_(static_cast<int64_t>(std::stoull(run_id_, nullptr, 16)));
    }
    if (tp_mesh_) tp_mesh_->comm(0).broadcast_(id, 0);
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(id.cpu().item<int64_t>()));
    run_id_ = buf;
  }
  if (config_.checkpoint.enable) prepare_checkpoint_folder();
  if (config_.checkpoint.enable && config_.checkpoint.resume) {
    const bool loaded = load_checkpoint();
    if (loaded && step_ > t.steps) {
      throw std::invalid_argument("the checkpoint in " + checkpoint_folder() + " is at step " + std::to_string(step_) +
                                  ", past training.steps = " + std::to_string(t.steps) +
                                  ": nothing to resume; raise --training.steps above " + std::to_string(step_) +
                                  " to train on");
    }
    if (rank_ == 0 && log_) {
      *log_ << (loaded ? "hp-train: resumed from step " + std::to_string(step_) + " (run " + run_id_ + ")"
                       : std::string("hp-train: --checkpoint.resume: no checkpoint in ") + checkpoint_folder() +
                             ", starting from step 0")
            << std::endl;
      if (loaded && step_ == t.steps) {
        *log_ << "hp-train: the checkpoint is at step " << step_ << " = training.steps: nothing left to train "
              << "(raise --training.steps to train on)" << std::endl;
      }
    }
  }
}

CheckpointIdentity Trainer::identity() const {
  CheckpointIdentity id;
  id.run_id = run_id_;
  id.step = step_;
  id.world_size = is_initialized() ? get_world_size() : 1;
  id.tensor_parallel_degree = config_.parallelism.tensor_parallel_degree;
  id.data_parallel_degree = 1;
  id.dtype = config_.training.dtype;
  id.model = model_json(config_.model);
  return id;
}

void Trainer::agree_or_throw(const std::string& own_error, const std::string& what) const {
  if (!tp_mesh_) {
    if (!own_error.empty()) throw std::runtime_error(own_error);
    return;
  }
  const int64_t world = config_.parallelism.tensor_parallel_degree;
  at::Tensor failed = at::zeros({world}, at::TensorOptions().dtype(at::kLong).device(tp_mesh_->device()));
  if (!own_error.empty()) failed[tp_mesh_->comm(0).rank()].fill_(1);
  tp_mesh_->comm(0).all_reduce_(failed, ReduceOp::Sum);
  failed = failed.cpu();
  std::string ranks;
  for (int64_t r = 0; r < world; ++r) {
    if (failed[r].item<int64_t>() != 0) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  }
  if (!own_error.empty()) throw std::runtime_error(own_error);
  if (!ranks.empty()) {
    throw std::runtime_error(what + " failed on rank(s) " + ranks + " (their error says why); stopping every rank");
  }
}

void Trainer::prepare_checkpoint_folder() {
  const std::string folder = checkpoint_folder();
  std::string error;
  try {
    if (rank_ == 0) {
      const auto removed = remove_temp_files(folder);
      if (!removed.empty() && log_) {
        *log_ << "hp-train: removed " << removed.size() << " temporary file(s) of an interrupted save, e.g. "
              << removed.front() << std::endl;
      }
    }
    if (!config_.checkpoint.resume) {
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
      if (config_.checkpoint.overwrite && (latest || !steps.empty()) && rank_ == 0) {
        if (::unlink(compat::join_path(folder, "latest").c_str()) != 0 && errno != ENOENT) {
          throw std::runtime_error("--checkpoint.overwrite: cannot remove '" + compat::join_path(folder, "latest") +
                                   "': " + std::strerror(errno));
        }
        for (const auto& step : steps) compat::remove_all(compat::join_path(folder, step));
        if (log_) {
          *log_ << "hp-train: --checkpoint.overwrite: deleted the earlier run's checkpoints in " << folder
                << std::endl;
        }
      }
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree_or_throw(error, "preparing the checkpoint folder");
}

Trainer::~Trainer() = default;

std::string Trainer::checkpoint_folder() const { return join(config_.dump_folder, config_.checkpoint.folder); }
std::string Trainer::metrics_folder() const { return join(config_.dump_folder, config_.metrics.folder); }

double Trainer::forward_backward(const Batch& batch, StepResult& r) {
  // The loss and its backward inside the train context (§6.2).
  auto guard = train_context_();
  PhaseClock clock(r);
  at::Tensor loss = compute_loss(model_, batch, config_.training.fused_linear_loss, [&] { clock.mark(kForward); });
  const double value = scalar_of(loss);
  clock.mark(kLoss);
  loss.backward();
  clock.mark(kBackward);
  return value;
}

StepResult Trainer::train_step(int64_t step) {
  const auto& t = config_.training;
  StepResult r;
  r.step = step;
  const auto start = std::chrono::steady_clock::now();
  const KernelUsage usage = kernel_usage();
  r.lr = learning_rate_at(step, t.steps, t.warmup_steps, t.lr, t.min_lr_ratio);
  PhaseClock clock(r);
  for (auto& group : optimizer_->param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(r.lr);
  // Gradients are set to none, not zeroed: backward then hands each parameter its freshly
  // computed gradient (no accumulation pass), in blocks the caching allocator reuses.
  optimizer_->zero_grad();
  clock.mark(kOptimizer);
  const Batch batch = batches_->batch_at(step - 1);
  r.loss = forward_backward(batch, r);
  clock.restart();
  r.grad_norm = clip_grad_norm_(model_->parameters(), t.max_norm);
  clock.mark(kClip);
  optimizer_->step();
  clock.mark(kOptimizer);
  step_ = step;
  const KernelUsage after = kernel_usage();
  r.minor_faults = after.minor_faults - usage.minor_faults;
  r.system_seconds = after.system_seconds - usage.system_seconds;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

std::vector<StepResult> Trainer::train() {
  const auto& t = config_.training;
  std::vector<StepResult> results;
  {
    std::string error;
    try {
      if (rank_ == 0) {
        make_directories(metrics_folder());
        metrics_ = std::make_unique<MetricsLogger>(metrics_folder(), step_);
        if (metrics_->dropped_records() > 0 && log_) {
          *log_ << "hp-train: " << metrics_->path() << ": cut " << metrics_->dropped_records()
                << " line(s) after step " << step_ << " (a torn line, or records of steps this run does again)"
                << std::endl;
        }
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
    agree_or_throw(error, "opening the metrics file");
  }
  std::unique_ptr<ProgressLine> progress;
  if (rank_ == 0 && log_) progress = std::make_unique<ProgressLine>(t.steps, *log_, is_terminal(*log_));
  const double tokens_per_step = static_cast<double>(t.batch_size * t.seq_len);
  while (step_ < t.steps) {
    const auto start = std::chrono::steady_clock::now();
    StepResult r = train_step(step_ + 1);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double tokens_per_s = tokens_per_step / std::max(secs, 1e-9);
    if (validator_ && (r.step % config_.validation.freq == 0 || r.step == t.steps)) {
      r.val_loss = validator_->validate(model_);
    }
    if (config_.checkpoint.enable && (r.step % config_.checkpoint.interval == 0 || r.step == t.steps)) {
      save_checkpoint();
    }
    // The same decision on every rank, so that a failed write on rank 0 stops them all.
    if (r.step % t.log_freq == 0 || r.val_loss || r.step == t.steps) {
      std::string error;
      if (metrics_) {
        nlohmann::json rec = {{"step", r.step}, {"loss", r.loss}, {"lr", r.lr}, {"grad_norm", r.grad_norm},
                              {"tokens_per_s", tokens_per_s}, {"peak_memory_mb", peak_memory_mib()},
                              {"step_s", r.seconds}, {"minor_faults", r.minor_faults},
                              {"system_s", r.system_seconds}};
        int64_t collectives = 0;
        double collective_s = 0;
        for (size_t i = 0; i < kStepPhases; ++i) {
          const StepPhase& p = r.phases[i];
          rec["phases"][kStepPhaseNames[i]] = {{"s", p.seconds},
                                               {"collectives", p.collectives},
                                               {"collective_bytes", p.collective_bytes},
                                               {"collective_s", p.collective_seconds}};
          collectives += p.collectives;
          collective_s += p.collective_seconds;
        }
        rec["collectives"] = collectives;
        rec["collective_s"] = collective_s;
        if (r.val_loss) rec["val_loss"] = *r.val_loss;
        try {
          metrics_->log(rec);
        } catch (const std::exception& e) {
          error = e.what();
        }
      }
      agree_or_throw(error, "writing the metrics of step " + std::to_string(r.step));
    }
    if (progress) {
      progress->update(r.step, r.loss, tokens_per_s, peak_memory_mib());
      if (r.val_loss) {
        progress->finish();
        *log_ << "step " << r.step << ": validation loss " << *r.val_loss << std::endl;
        progress = std::make_unique<ProgressLine>(t.steps, *log_, is_terminal(*log_));
      }
    }
    results.push_back(r);
  }
  if (progress) progress->finish();
  if (metrics_ && config_.metrics.enable_plot) {
    std::string error;
    const std::string png = metrics_folder() + "/loss.png";
    if (plot_loss_curve(metrics_->path(), png, &error)) {
      if (log_) *log_ << "hp-train: loss curve written to " << png << std::endl;
    } else if (log_) {
      *log_ << "hp-train: no loss plot: " << error << std::endl;
    }
  }
  return results;
}

void Trainer::save_checkpoint() const {
  std::map<std::string, at::Tensor> tensors;
  nlohmann::json extra;
  for (const auto& p : model_->named_parameters()) {
    const at::Tensor& v = p.value();
    tensors["model." + p.key()] = (is_dtensor(v) ? to_local(v) : v).detach().clone();
    extra["placements"][p.key()] = is_dtensor(v) ? to_string(placements_of(v)) : "plain";
  }
  // Optimizer state per parameter, by its position in the parameter list.
  const auto params = model_->parameters();
  auto& state = optimizer_->state();
  for (size_t i = 0; i < params.size(); ++i) {
    auto it = state.find(params[i].unsafeGetTensorImpl());
    if (it == state.end()) continue;
    auto& s = static_cast<torch::optim::AdamWParamState&>(*it->second);
    const std::string key = "optim." + std::to_string(i) + ".";
    auto local = [](const at::Tensor& t) { return (is_dtensor(t) ? to_local(t) : t).detach().clone(); };
    tensors[key + "exp_avg"] = local(s.exp_avg());
    tensors[key + "exp_avg_sq"] = local(s.exp_avg_sq());
    tensors[key + "step"] = at::scalar_tensor(s.step(), at::kLong);
  }
  const CheckpointIdentity id = identity();
  const std::string dir = step_directory(checkpoint_folder(), step_);
  const std::string what = "saving the checkpoint of step " + std::to_string(step_);
  // 1. Every rank writes its file.
  std::string error;
  try {
    make_directories(dir);
    write_tensor_file(compat::join_path(dir, rank_file_name(rank_)), tensors, rank_file_metadata(id, rank_, extra),
                      "rank_file", rank_);
  } catch (const std::exception& e) {
    error = e.what();
  }
  crash_point("rank_file.written", rank_);
  agree_or_throw(error, what);
  // 2. Rank 0 verifies every file, writes the manifest, then moves `latest`.
  if (rank_ == 0) {
    try {
      const StepManifest manifest = verify_step_files(dir, id);
      crash_point("step.verified", rank_);
      write_manifest(dir, manifest, rank_);
      crash_point("manifest.written", rank_);
      write_latest_marker(checkpoint_folder(), step_, rank_);
      crash_point("latest.written", rank_);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  agree_or_throw(error, what);
}

bool Trainer::load_checkpoint() {
  std::optional<int64_t> latest;
  std::string error;
  try {
    latest = read_latest_marker(checkpoint_folder());
    if (latest) load_step(*latest);
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree_or_throw(error, "loading the checkpoint");
  return latest.has_value();
}

void Trainer::load_step(int64_t step) {
  const std::string dir = step_directory(checkpoint_folder(), step);
  CheckpointIdentity job = identity();
  job.step = step;
  const TensorFile file = load_verified_rank_file(dir, step, rank_, job);
  const std::string path = compat::join_path(dir, rank_file_name(rank_));
  const auto meta = nlohmann::json::parse(file.metadata_json);
  at::NoGradGuard no_grad;
  for (auto& p : model_->named_parameters()) {
    auto it = file.tensors.find("model." + p.key());
    TORCH_CHECK(it != file.tensors.end(), "checkpoint ", path, " has no parameter ", p.key());
    at::Tensor dst = is_dtensor(p.value()) ? to_local(p.value()) : p.value();
    TORCH_CHECK(dst.sizes() == it->second.sizes() && dst.scalar_type() == it->second.scalar_type(), "checkpoint ",
                path, ": parameter ", p.key(), " is ", it->second.scalar_type(), " ", it->second.sizes(),
                ", expected ", dst.scalar_type(), " ", dst.sizes());
    dst.copy_(it->second);
  }
  const auto params = model_->parameters();
  auto& state = optimizer_->state();
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string key = "optim." + std::to_string(i) + ".";
    if (!file.tensors.count(key + "step")) continue;
    const at::Tensor& p = params[i];
    auto wrap = [&](const at::Tensor& saved) {
      at::Tensor local = saved.to(p.device(), /*non_blocking=*/false, /*copy=*/true);
      if (!is_dtensor(p)) return local;
      FromLocalOptions o;
      o.shape = p.sizes().vec();
      return DTensor::from_local(local, mesh_of(p), placements_of(p), o);
    };
    auto s = std::make_unique<torch::optim::AdamWParamState>();
    s->step(file.tensors.at(key + "step").item<int64_t>());
    s->exp_avg(wrap(file.tensors.at(key + "exp_avg")));
    s->exp_avg_sq(wrap(file.tensors.at(key + "exp_avg_sq")));
    state[p.unsafeGetTensorImpl()] = std::move(s);
  }
  step_ = step;
  run_id_ = meta.at("run_id").get<std::string>();
}

}  // namespace hyper_parallel::train
