#include "train/trainer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <nlohmann/json.hpp>
#include <torch/nn/functional/loss.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <random>
#include <sys/resource.h>
#include <unistd.h>

#include "hyper_parallel/distributed.h"
#include "hyper_parallel/dtensor.h"
#include "hyper_parallel/fatal_error.h"
#include "hyper_parallel/fused_linear_loss.h"
#include "hyper_parallel/hf_checkpoint.h"
#include "hyper_parallel/model_registry.h"
#include "hyper_parallel/parallelism_config.h"
#include "hyper_parallel/cpu_allocator.h"
#include "compat/file_system.h"
#include "core/collective_stats.h"
#include "train/checkpoint_io.h"
#include "train/checkpoint_layout.h"
#include "train/checkpoint_reshard.h"
#include "train/data_identity.h"
#include "train/fault_injection.h"
#include "train/local_piece.h"
#include "train/metrics.h"
#include "train/optim_utils.h"
#include "train/progress.h"
#include "train/storage_checks.h"

namespace hyper_parallel::train {

namespace F = torch::nn::functional;

namespace {

at::ScalarType dtype_of(const std::string& name) {
  if (name == "float64") return at::kDouble;
  if (name == "bfloat16") return at::kBFloat16;
  return at::kFloat;
}

// cross_entropy's default: targets equal to it are not predicted and do not count.
constexpr int64_t kIgnoreIndex = -100;

// The sum of the batch's token losses, inside the context, on the model's device. Summed,
// not averaged: the caller divides by the global number of counted tokens (over replicas
// and micro-batches), so every token weighs the same whichever rank holds it.
// fused: the head's matmul and the loss in one (fused_linear_loss.h), no logits tensor;
// the head's weight is the plan's Shard(0) DTensor under TP, a plain tensor at TP 1.
// after_forward (optional) runs when the model's forward is done: at the final norm when
// fused (the head matmul is part of the loss then), after the head otherwise.
at::Tensor token_loss_sum(Llama& model, const Batch& batch, bool fused,
                          const std::function<void()>& after_forward = {}) {
  const at::Device device = model->output->weight.device();
  const at::Tensor target = batch.target.to(device).flatten();
  if (fused) {
    at::Tensor hidden = model->hidden_states(batch.input.to(device));
    // Sequence parallel: the fused loss takes the whole sequence (one all-gather, as the
    // head's own input conversion does; backward slices the all-reduced gradient).
    if (is_dtensor(hidden)) hidden = redistribute(hidden, Placements{Placement::replicate()});
    if (after_forward) after_forward();
    FusedLinearCrossEntropyOptions options;
    options.ignore_index = kIgnoreIndex;
    options.reduction = at::Reduction::Sum;
    return fused_linear_cross_entropy(hidden.flatten(0, 1), model->output->weight, target, options);
  }
  at::Tensor logits = model->forward(batch.input.to(device));
  if (after_forward) after_forward();
  // Low-precision logits are widened first, as TorchTitan does: a bfloat16 sum of the
  // token losses would be rounded to 8 bits (0.4 %), in the loss reported and in its scale.
  if (logits.scalar_type() == at::kBFloat16 || logits.scalar_type() == at::kHalf) logits = logits.to(at::kFloat);
  return F::cross_entropy(logits.flatten(0, 1), target,
                          F::CrossEntropyFuncOptions().ignore_index(kIgnoreIndex).reduction(torch::kSum));
}

// Targets that count (not ignore_index).
int64_t counted_tokens(const Batch& batch) { return batch.target.ne(kIgnoreIndex).sum().item<int64_t>(); }

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

// A step's line of metrics.jsonl; `skipped`: non-finite steps skipped so far in this run.
nlohmann::json metrics_record(const StepResult& r, double tokens_per_s, int64_t skipped) {
  nlohmann::json rec = {{"step", r.step},       {"loss", r.loss},
                        {"lr", r.lr},           {"grad_norm", r.grad_norm},
                        {"skipped", skipped},   {"tokens_per_s", tokens_per_s},
                        {"peak_memory_mb", peak_memory_mib()}, {"step_s", r.seconds},
                        {"minor_faults", r.minor_faults},       {"system_s", r.system_seconds}};
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
  return rec;
}

// Sums `values` (on `mesh`'s device) over every rank of `mesh` (all its dims).
void sum_over_mesh_(at::Tensor& values, const std::optional<DeviceMesh>& mesh) {
  if (!mesh) return;
  for (int64_t d = 0; d < mesh->ndim(); ++d) mesh->comm(d).all_reduce_(values, ReduceOp::Sum);
}

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
  return "the last verified step before it is " + std::to_string(last) + ": resume from it with --checkpoint.resume "
         "--checkpoint.load_step " + std::to_string(last);
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
      const bool ours = std::any_of(targets.begin(), targets.end(), [&](const ReshardTarget& t) { return t.key == key; });
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

}  // namespace

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

void Validator::set_data_parallel_mesh(const DeviceMesh& dp_mesh) { dp_mesh_ = dp_mesh; }

double Validator::validate(Llama& model) const {
  at::NoGradGuard no_grad;
  // Per batch: the sum of its token losses and their number, over every replica's rows.
  at::Tensor sums = at::zeros({2 * config_.steps}, at::kDouble);
  for (int64_t i = 0; i < config_.steps; ++i) {
    auto guard = context_();
    const Batch batch = batches_->batch_at(i);
    sums[2 * i].fill_(scalar_of(token_loss_sum(model, batch, fused_linear_loss_)));
    sums[2 * i + 1].fill_(static_cast<double>(counted_tokens(batch)));
  }
  if (dp_mesh_) {
    sums = sums.to(dp_mesh_->device());
    dp_mesh_->comm(0).all_reduce_(sums, ReduceOp::Sum);
    sums = sums.cpu();
  }
  double total = 0;
  for (int64_t i = 0; i < config_.steps; ++i) {
    total += sums[2 * i].item<double>() / std::max(1.0, sums[2 * i + 1].item<double>());
  }
  return total / static_cast<double>(std::max<int64_t>(1, config_.steps));
}

Trainer::Trainer(JobConfig config, std::ostream* log)
    : config_(std::move(config)), log_(log), train_context_(false) {
  // Large CPU buffers from a cache of huge-page-backed blocks that outlives each step: no
  // fresh-page faults after the first step (issue 14), whatever the environment says.
  if (config_.training.device == "cpu" && config_.training.caching_allocator) install_caching_cpu_allocator();
  // Before validate(): with model.hf_assets_path the sizes it checks come from config.json.
  model_ = make_job_model(config_.model);
  if (!config_.model.hf_assets_path.empty()) {
    std::ifstream in(compat::join_path(config_.model.hf_assets_path, "config.json"));
    hf_config_ = nlohmann::json::parse(in);  // make_job_model has read it already
  }
  validate(config_);
  TORCH_CHECK(!config_.checkpoint.resume || config_.checkpoint.enable,
              "hp-train: --checkpoint.resume needs checkpoint.enable = true (nothing would be read)");
  const auto& par = config_.parallelism;
  const int64_t world = is_initialized() ? get_world_size() : 1;
  rank_ = is_initialized() ? get_rank() : 0;
  const int64_t tp = par.tensor_parallel_degree, dp = par.data_parallel_degree;
  TORCH_CHECK(world == dp * tp, "hp-train: parallelism.data_parallel_degree x tensor_parallel_degree = ", dp, " x ",
              tp, " = ", dp * tp, " ranks, but the job has ", world, "; launch ", dp * tp,
              " ranks (hp-run --nproc-per-node ", dp * tp, ", or --nnodes N with N x nproc-per-node = ", dp * tp,
              ") or change the degrees");
  tp_enabled_ = tp > 1;
  loss_parallel_enabled_ = tp_enabled_ && !par.disable_loss_parallel;
  parallelism_scope_.emplace(par);
  train_context_ = get_train_context(loss_parallel_enabled_);

  model_->init_weights(static_cast<uint64_t>(config_.training.seed));
  const at::ScalarType dtype = dtype_of(config_.training.dtype);
  const at::Device device = is_initialized() ? current_world().device : at::Device(at::kCPU);
  TORCH_CHECK(device.type() == (config_.training.device == "cuda" ? at::kCUDA : at::kCPU),
              "hp-train: training.device = ", config_.training.device, " but the process group was "
              "initialised for ", device, "; initialise it with InitOptions{.device_type = \"",
              config_.training.device, "\"}");
  model_->to(device, dtype);
  // The world as a dp x tp mesh (TorchTitan's order: the TP ranks of a replica are
  // neighbours). Without data parallelism, the 1-D TP mesh alone.
  if (dp > 1) {
    world_mesh_ = init_device_mesh(config_.training.device, {dp, tp}, {"dp", "tp"});
    dp_mesh_ = (*world_mesh_)["dp"];
    if (tp_enabled_) tp_mesh_ = (*world_mesh_)["tp"];
  } else if (tp_enabled_) {
    tp_mesh_ = init_device_mesh(config_.training.device, {tp}, {"tp"});
    world_mesh_ = tp_mesh_;
  }
  dp_rank_ = dp_mesh_ ? dp_mesh_->local_rank(0) : 0;
  // init_weights(seed) gave every rank the same weights: each shards its own copy, with no
  // scatter from TP rank 0 (src_data_rank = nullopt).
  if (tp_enabled_) {
    model_family(config_.model.name).parallelize(*model_, *tp_mesh_, loss_parallel_enabled_, par.sequence_parallel);
  }
  initial_load();
  const auto& t = config_.training;
  // bfloat16 parameters train through float32 master copies (master_weights.h).
  if (dtype == at::kBFloat16) master_ = std::make_unique<MasterWeights>(model_->named_parameters());
  optimizer_ = std::make_unique<torch::optim::AdamW>(
      trained_parameters(),
      torch::optim::AdamWOptions(t.lr).betas({t.beta1, t.beta2}).eps(t.eps).weight_decay(t.weight_decay));
  non_finite_ = NonFiniteSteps(t.max_skipped_steps);
  // Before anything is read or written in the dump folder: one job per folder, and
  // folders that cannot take the job's files found now, not at the first save.
  lock_dump_folder();
  check_storage();

  // Every TP rank of a replica builds the same rows: the replica's share of the global batch.
  std::string data_description;
  if (t.data.empty()) {
    // Generated per batch: memory and start-up do not depend on training.steps.
    auto train_stream = std::make_shared<SyntheticBatchStream>(config_.model.vocab_size, t.batch_size, t.seq_len,
                                                               static_cast<uint64_t>(t.seed), /*split=*/0, dp_rank_, dp);
    data_description = train_stream->describe();
    batches_ = train_stream;
    if (config_.validation.enable) {
      validator_ = std::make_unique<Validator>(
          config_.validation, t,
          std::make_shared<SyntheticBatchStream>(config_.model.vocab_size, t.batch_size, t.seq_len,
                                                 static_cast<uint64_t>(t.seed), /*split=*/1, dp_rank_, dp),
          train_context_);
    }
  } else if (const std::string format = resolve_data_format(t.data, t.data_format); format != "text") {
    token_corpus_ = std::make_shared<const PretokenizedCorpus>(PretokenizedCorpusOptions{
        t.data, format, config_.model.vocab_size, t.eos_id, t.bos_id, t.seq_len + 1});
    data_description = token_corpus_->describe();
    batches_ = token_corpus_->train_batches(t.batch_size, t.seq_len, static_cast<uint64_t>(t.seed), dp_rank_, dp);
    if (config_.validation.enable) {
      validator_ = std::make_unique<Validator>(
          config_.validation, t,
          token_corpus_->validation_batches(t.batch_size, t.seq_len, static_cast<uint64_t>(t.seed) + 1, dp_rank_, dp),
          train_context_);
    }
  } else {
    TORCH_CHECK(t.eos_id == -1 && t.bos_id == -1, "hp-train: training.data '", t.data,
                "' is text; training.eos_id / bos_id apply to pre-tokenized corpora only");
    corpus_ = make_text_file_corpus(t.data, config_.model.vocab_size, t.seq_len + 1);
    data_description = corpus_->describe();
    batches_ = std::make_shared<ReplicaRows>(
        std::make_shared<BatchSampler>(corpus_->train_tokens(), t.batch_size, t.seq_len, static_cast<uint64_t>(t.seed)),
        dp_rank_, dp);
    if (config_.validation.enable) {
      validator_ = std::make_unique<Validator>(
          config_.validation, t,
          std::make_shared<ReplicaRows>(std::make_shared<BatchSampler>(corpus_->validation_tokens(), t.batch_size,
                                                                       t.seq_len, static_cast<uint64_t>(t.seed) + 1),
                                        dp_rank_, dp),
          train_context_);
    }
  }
  if (validator_ && dp_mesh_) validator_->set_data_parallel_mesh(*dp_mesh_);
  data_identity_ = train::data_identity(t, token_corpus_ ? std::optional<CorpusIdentity>(token_corpus_->identity())
                                                     : std::nullopt);
  if (dp_mesh_) {
    // bfloat16: the sums go straight into the float32 masters' .grad.
    reducer_ = std::make_unique<DataParallelReducer>(model_->named_parameters(), *dp_mesh_,
                                                     par.dp_bucket_mb * (int64_t{1} << 20),
                                                     master_ ? master_->parameters() : std::vector<at::Tensor>{});
  }
  if (rank_ == 0 && log_) {
    *log_ << "hp-train: " << data_description << "\n"
          << "hp-train: " << config_.model.name << " dim " << config_.model.dim << ", " << config_.model.n_layers
          << " layers, " << config_.model.n_heads << " heads";
    const LlamaArgs& a = model_->args();
    if (a.kv_heads() != a.n_heads) *log_ << " (" << a.kv_heads() << " key/value)";
    *log_ << ", vocab " << config_.model.vocab_size << (a.tie_word_embeddings ? " (tied embeddings)" : "");
    if (!config_.model.hf_assets_path.empty()) *log_ << " from " << config_.model.hf_assets_path;
    *log_ << "; DP " << dp << " x TP " << par.tensor_parallel_degree;
    if (reducer_) *log_ << " (" << reducer_->bucket_count() << " gradient buckets)";
    if (t.grad_accum_steps > 1) *log_ << ", " << t.grad_accum_steps << " micro-batches per step";
    if (par.sequence_parallel) *log_ << ", sequence parallel";
    *log_ << ", loss parallel " << (loss_parallel_enabled_ ? "on" : "off")
          << (config_.training.fused_linear_loss ? ", fused linear loss" : "") << std::endl;
  }
  // One id for the run, from rank 0; a resume replaces it with the checkpoint's.
  {
    at::Tensor id = at::zeros({1}, at::TensorOptions().dtype(at::kLong).device(device));
    if (rank_ == 0) {
      run_id_ = new_run_id();
      id.fill_(static_cast<int64_t>(std::stoull(run_id_, nullptr, 16)));
    }
    // Rank 0 is coordinate 0 on every mesh dim: down the first dim, then along the rest.
    if (world_mesh_) {
      for (int64_t d = 0; d < world_mesh_->ndim(); ++d) world_mesh_->comm(d).broadcast_(id, 0);
    }
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

std::vector<at::Tensor> Trainer::trained_parameters() const {
  return master_ ? master_->parameters() : model_->parameters();
}

std::vector<std::pair<std::string, at::Tensor>> Trainer::named_trained_parameters() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  if (master_) {
    for (size_t i = 0; i < master_->parameters().size(); ++i) out.emplace_back(master_->names()[i], master_->parameters()[i]);
  } else {
    for (const auto& p : model_->named_parameters()) out.emplace_back(p.key(), p.value());
  }
  return out;
}

CheckpointIdentity Trainer::identity() const {
  CheckpointIdentity id;
  id.run_id = run_id_;
  id.step = step_;
  id.world_size = is_initialized() ? get_world_size() : 1;
  id.tensor_parallel_degree = config_.parallelism.tensor_parallel_degree;
  id.data_parallel_degree = config_.parallelism.data_parallel_degree;
  id.dtype = config_.training.dtype;
  id.model = model_json(config_.model);
  // A Hugging Face model's whole config (kv heads, head_dim, tying, rope scaling are not
  // [model] keys): a resume on another config is refused, and an export can rebuild it.
  if (!hf_config_.is_null()) id.model["hf_config"] = hf_config_;
  id.data = data_identity_;
  return id;
}

void Trainer::agree_or_throw(const std::string& own_error, const std::string& what) const {
  if (!world_mesh_) {
    if (!own_error.empty()) throw std::runtime_error(own_error);
    return;
  }
  const int64_t world = world_mesh_->size();
  at::Tensor failed = at::zeros({world}, at::TensorOptions().dtype(at::kLong).device(world_mesh_->device()));
  if (!own_error.empty()) failed[rank_].fill_(1);
  sum_over_mesh_(failed, world_mesh_);
  failed = failed.cpu();
  std::string ranks;
  for (int64_t r = 0; r < world; ++r) {
    if (failed[r].item<int64_t>() != 0) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  }
  if (!own_error.empty()) throw std::runtime_error(own_error);
  if (!ranks.empty()) {
    throw PeerFailure(what + " failed on rank(s) " + ranks + " (their error says why); stopping every rank");
  }
}

void Trainer::initial_load() {
  const auto& c = config_.checkpoint;
  if (!c.initial_load_in_hf) return;
  const std::string path = c.initial_load_path.empty() ? config_.model.hf_assets_path : c.initial_load_path;
  if (c.enable && c.resume) {
    // A resume that finds a checkpoint loads it; a damaged `latest` counts as found, so
    // that load_checkpoint reports it rather than this run silently starting over.
    bool found = c.load_step >= 0;
    try {
      found = found || read_latest_marker(checkpoint_folder()).has_value();
    } catch (const std::exception&) {
      found = true;
    }
    if (found) {
      if (rank_ == 0 && log_) {
        *log_ << "hp-train: resuming: " << path << " is not read (a resume takes precedence)" << std::endl;
      }
      return;
    }
  }
  // Every rank checks the same headers alike (load_hf_checkpoint); an error of one rank
  // alone (its file system) still stops every rank.
  std::string error;
  try {
    load_hf_checkpoint(*model_, model_family(config_.model.name).hf_adapter(*model_), path);
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree_or_throw(error, "loading the Hugging Face checkpoint " + path);
  if (rank_ == 0 && log_) *log_ << "hp-train: weights loaded from the Hugging Face checkpoint in " << path << std::endl;
}

void Trainer::lock_dump_folder() {
  std::string error;
  try {
    if (rank_ == 0) dump_folder_lock_ = std::make_unique<DumpFolderLock>(config_.dump_folder);
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree_or_throw(error, "locking the dump folder");
  // Several machines (hp-run --nnodes): each other machine's local rank 0 also locks the
  // folder unless it sees rank 0's lock there (one shared file system).
  const char* local_rank = std::getenv("LOCAL_RANK");
  const char* local_world = std::getenv("LOCAL_WORLD_SIZE");
  const int64_t world = is_initialized() ? get_world_size() : 1;
  if (!local_rank || !local_world || std::atoll(local_world) >= world) return;
  const std::string key = "hp_train/dump_folder_lock";
  auto& store = *current_world().store;
  try {
    if (rank_ == 0) {
      const std::string& record = dump_folder_lock_->record();
      store.set(key, std::vector<uint8_t>(record.begin(), record.end()));
    } else if (std::string(local_rank) == "0") {
      const std::vector<uint8_t> held = store.get(key);
      if (read_dump_folder_lock_record(config_.dump_folder) != std::string(held.begin(), held.end())) {
        dump_folder_lock_ = std::make_unique<DumpFolderLock>(config_.dump_folder);
      }
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree_or_throw(error, "locking the dump folder");
}

void Trainer::check_storage() {
  std::string error;
  const std::string tag = std::to_string(rank_);
  try {
    // Every rank writes its checkpoint file; rank 0 alone the metrics.
    if (rank_ == 0) check_writable_folder(config_.dump_folder, "job.dump_folder", tag);
    if (config_.checkpoint.enable) check_writable_folder(checkpoint_folder(), "checkpoint.folder", tag);
    if (rank_ == 0) check_writable_folder(metrics_folder(), "metrics.folder", tag);
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree_or_throw(error, "checking that the job's folders are writable");
  if (!config_.checkpoint.enable) return;
  // One checkpoint: every rank's weights and AdamW moments (same dtype as the weights they
  // train, float32 masters in bfloat16 training).
  double bytes = 0;
  for (const auto& p : trained_parameters()) {
    const at::Tensor local = local_of(p);
    bytes += 3.0 * static_cast<double>(local.numel()) * static_cast<double>(local.element_size());
  }
  at::Tensor total = at::full({1}, bytes, at::TensorOptions().dtype(at::kDouble).device(model_->output->weight.device()));
  sum_over_mesh_(total, world_mesh_);
  const auto free = free_bytes(checkpoint_folder());
  if (rank_ == 0 && log_ && free) {
    if (auto warning = room_warning(checkpoint_folder(), *free, static_cast<int64_t>(total.cpu().item<double>()))) {
      *log_ << "hp-train: warning: " << *warning << std::endl;
    }
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
  const int64_t micro_batches = config_.training.grad_accum_steps;
  PhaseClock clock(r);
  // The loss is the sum of every token loss of the step, over all replicas and
  // micro-batches, divided by their number (TorchTitan's global normalisation): a per-rank
  // mean would weigh a replica's tokens by how few of them it holds.
  at::Tensor counts = at::full({1}, static_cast<double>(counted_tokens(batch)),
                               at::TensorOptions().dtype(at::kDouble).device(model_->output->weight.device()));
  if (dp_mesh_) dp_mesh_->comm(0).all_reduce_(counts, ReduceOp::Sum);
  const double global_tokens = counts.cpu().item<double>();
  clock.mark(kLoss);
  // A step whose targets are all ignored has loss 0 and zero gradients (not 0 / 0).
  const double scale = 1.0 / std::max(1.0, global_tokens);
  double local_sum = 0;
  for (int64_t m = 0; m < micro_batches; ++m) {
    // The loss and its backward inside the train context (§6.2).
    auto guard = train_context_();
    const Batch part = micro_batch(batch, m, micro_batches);
    at::Tensor loss_sum = token_loss_sum(model_, part, config_.training.fused_linear_loss, [&] { clock.mark(kForward); });
    local_sum += scalar_of(loss_sum);
    at::Tensor loss = loss_sum * scale;
    clock.mark(kLoss);
    // The last backward sends the gradient buckets as they fill (overlapped with it).
    const bool reduced = reducer_ && m + 1 == micro_batches;
    if (reduced) reducer_->arm();
    loss.backward();
    // bfloat16: every micro-batch's gradient is summed in float32 on the masters (the
    // reducer adds the last one, with the other replicas').
    if (master_ && !reduced) master_->accumulate_gradients();
    clock.mark(kBackward);
  }
  if (reducer_) {
    reducer_->finish();
    at::Tensor sum = at::full({1}, local_sum, counts.options());
    dp_mesh_->comm(0).all_reduce_(sum, ReduceOp::Sum);
    local_sum = sum.cpu().item<double>();
    clock.mark(kBackward);
  }
  return local_sum * scale;
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
  r.grad_norm = clip_grad_norm_(trained_parameters(), t.max_norm);
  clock.mark(kClip);
  // Both are reduced over every rank, so every rank decides the same: a NaN or infinite
  // update would poison every weight it touches (and AdamW's moments for good).
  r.non_finite = !std::isfinite(r.loss) || !std::isfinite(r.grad_norm);
  if (!r.non_finite) {
    optimizer_->step();
    if (master_) master_->master_to_model();
  }
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
    // Non-finite: skipped, or the run stops here (the same on every rank, nothing of the
    // step saved; its metrics are still written, so the log shows where it went wrong).
    std::string stop;
    try {
      if (non_finite_.check(r.step, r.loss, r.grad_norm) && rank_ == 0 && log_) {
        if (progress) progress->finish();
        *log_ << "hp-train: step " << r.step << ": " << describe_non_finite(r.loss, r.grad_norm) << ": skipped ("
              << non_finite_.consecutive() << " in a row, at most training.max_skipped_steps = "
              << t.max_skipped_steps << ")" << std::endl;
        if (progress) progress = std::make_unique<ProgressLine>(t.steps, *log_, is_terminal(*log_));
      }
    } catch (const std::runtime_error& e) {
      stop = e.what();
    }
    if (stop.empty() && validator_ && (r.step % config_.validation.freq == 0 || r.step == t.steps)) {
      r.val_loss = validator_->validate(model_);
    }
    if (stop.empty() && config_.checkpoint.enable &&
        (r.step % config_.checkpoint.interval == 0 || r.step == t.steps)) {
      save_checkpoint();
    }
    // The same decision on every rank, so that a failed write on rank 0 stops them all.
    if (r.step % t.log_freq == 0 || r.val_loss || r.step == t.steps || r.non_finite) {
      std::string error;
      if (metrics_) {
        try {
          metrics_->log(metrics_record(r, tokens_per_s, non_finite_.skipped()));
        } catch (const std::exception& e) {
          error = e.what();
        }
      }
      agree_or_throw(error, "writing the metrics of step " + std::to_string(r.step));
    }
    if (!stop.empty()) {
      if (progress) progress->finish();
      throw std::runtime_error(stop);
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
  LayoutTable layouts;  // the same on every rank; rank 0 records it in the manifest
  // The weights the optimizer updates (float32 masters in bfloat16 training).
  for (const auto& [name, v] : named_trained_parameters()) {
    tensors["model." + name] = local_of(v).detach().clone();
    extra["placements"][name] = is_dtensor(v) ? to_string(placements_of(v)) : "plain";
    layouts["model." + name] = layout_of(v, "model." + name);
  }
  // Optimizer state per parameter, by its position in the parameter list.
  const auto params = trained_parameters();
  auto& state = optimizer_->state();
  for (size_t i = 0; i < params.size(); ++i) {
    auto it = state.find(params[i].unsafeGetTensorImpl());
    if (it == state.end()) continue;
    auto& s = static_cast<torch::optim::AdamWParamState&>(*it->second);
    const std::string key = "optim." + std::to_string(i) + ".";
    auto local = [](const at::Tensor& t) { return local_of(t).detach().clone(); };
    tensors[key + "exp_avg"] = local(s.exp_avg());
    tensors[key + "exp_avg_sq"] = local(s.exp_avg_sq());
    tensors[key + "step"] = at::scalar_tensor(s.step(), at::kLong);
    // The moments have their parameter's layout; the step counter is one scalar.
    for (const char* moment : {"exp_avg", "exp_avg_sq"}) {
      TensorLayout l = layout_of(params[i], key + moment);
      l.dtype = tensors[key + moment].scalar_type();
      layouts[key + moment] = l;
    }
    layouts[key + "step"] = step_counter_layout();
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
      StepManifest manifest = verify_step_files(dir, id);
      manifest.tensors = layouts;
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
  std::optional<int64_t> step;
  std::string error;
  try {
    const int64_t chosen = config_.checkpoint.load_step;
    step = chosen >= 0 ? std::optional<int64_t>(chosen) : read_latest_marker(checkpoint_folder());
    if (step) {
      const std::string dir = step_directory(checkpoint_folder(), *step);
      if (!compat::path_exists(compat::join_path(dir, kManifestName))) {
        throw std::runtime_error(
            (chosen >= 0 ? "--checkpoint.load_step " + std::to_string(chosen) + ": "
                         : "'" + compat::join_path(checkpoint_folder(), "latest") + "' names step " +
                               std::to_string(*step) + ", but ") +
            "'" + dir + (compat::is_directory(dir) ? "' has no " + std::string(kManifestName) + " (its save did not complete)"
                                                   : "' does not exist") +
            "; " + other_verified_steps(checkpoint_folder(), *step));
      }
      load_step(*step);
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree_or_throw(error, "loading the checkpoint");
  return step.has_value();
}

void Trainer::load_step(int64_t step) {
  const std::string dir = step_directory(checkpoint_folder(), step);
  CheckpointIdentity job = identity();
  job.step = step;
  const StepManifest manifest = read_manifest(dir);
  const CheckpointIdentity& saved = manifest.identity;
  if (saved.step != step) {
    throw std::runtime_error("checkpoint manifest '" + compat::join_path(dir, kManifestName) + "' is for step " +
                             std::to_string(saved.step) + ", but it is in the folder of step " + std::to_string(step));
  }
  // Global rank = dp_rank * tp + tp_rank (dp outer, TorchTitan's order), saved and now.
  const int64_t tp = job.tensor_parallel_degree, tp_rank = rank_ % tp, dp_rank = dp_rank_;
  const int64_t saved_tp = saved.tensor_parallel_degree, saved_dp = saved.data_parallel_degree;
  if (saved_tp < 1 || saved_dp < 1 || saved.world_size != saved_tp * saved_dp) {
    throw std::runtime_error("checkpoint manifest '" + compat::join_path(dir, kManifestName) + "': world size " +
                             std::to_string(saved.world_size) + " is not its data parallel degree " +
                             std::to_string(saved_dp) + " x tensor parallel degree " + std::to_string(saved_tp));
  }
  // This rank's piece of every parameter at this job's TP degree.
  // (float32 masters in bfloat16 training: what the checkpoint holds)
  const auto named = named_trained_parameters();
  std::vector<ReshardTarget> targets;
  for (const auto& [name, value] : named) {
    const TensorLayout l = layout_of(value, "model." + name);
    targets.push_back({"model." + name, l, piece_of(l, tp, tp_rank)});
  }
  refuse_a_different_model(manifest, job, targets, dir);
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
  }
  // Data-parallel replicas saved the same state: one replica's files are enough.
  const bool resharding = saved_tp != tp;
  auto read = [&](int64_t saved_tp_rank) {
    const int64_t file_rank = saved_file_rank(saved_dp, saved_tp, dp_rank, saved_tp_rank);
    try {
      return read_verified_rank_file(dir, manifest, file_rank);
    } catch (const std::runtime_error& e) {
      if (!resharding) throw;
      throw std::runtime_error(std::string(e.what()) + " (rank " + std::to_string(rank_) +
                               " needs it to reshard the checkpoint from TP " + std::to_string(saved_tp) + " to TP " +
                               std::to_string(tp) + ")");
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
                               "it with --parallelism.tensor_parallel_degree " + std::to_string(saved_tp));
    }
    own = read(tp_rank);
    for (const auto& t : targets) layouts[t.key] = t.layout;
    for (size_t i = 0; i < named.size(); ++i) {
      const std::string key = "optim." + std::to_string(i) + ".";
      if (!own->tensors.count(key + "step")) continue;
      layouts[key + "exp_avg"] = layouts[key + "exp_avg_sq"] = targets[i].layout;
      layouts[key + "step"] = step_counter_layout();
    }
  }
  // AdamW's state, where the checkpoint has it: the moments laid out as their parameter.
  for (size_t i = 0; i < named.size(); ++i) {
    const std::string key = "optim." + std::to_string(i) + ".";
    if (!layouts.count(key + "step")) continue;
    const ReshardTarget param = targets[i];
    targets.push_back({key + "exp_avg", param.layout, param.box});
    targets.push_back({key + "exp_avg_sq", param.layout, param.box});
    targets.push_back({key + "step", step_counter_layout(), Box{}});
  }
  ReshardPlan plan(layouts, saved_tp, targets, tp_rank % saved_tp);
  for (int64_t r : plan.sources()) {
    const std::string path = compat::join_path(dir, rank_file_name(saved_file_rank(saved_dp, saved_tp, dp_rank, r)));
    if (own && r == tp_rank) {
      plan.take(r, own->tensors, path);
    } else {
      plan.take(r, read(r).tensors, path);
    }
  }
  own.reset();
  const std::map<std::string, at::Tensor> values = plan.finish();
  // Weights (or AdamW moments) that are not finite would only train on NaN.
  for (const auto& [key, value] : values) {
    if (!value.is_floating_point() || at::isfinite(value).all().item<bool>()) continue;
    throw std::runtime_error("cannot resume from '" + dir + "': '" + key +
                             "' holds NaN or infinite values (the run had diverged before this save); " +
                             other_verified_steps(checkpoint_folder(), step));
  }
  if (rank_ == 0 && log_ && (resharding || saved.world_size != job.world_size)) {
    *log_ << "hp-train: resharded the checkpoint of step " << step << " from dp " << saved_dp << " x tp " << saved_tp
          << " to dp " << job.world_size / tp << " x tp " << tp << " (rank 0 read " << plan.sources().size() << " of its "
          << saved.world_size << " files)" << std::endl;
  }

  at::NoGradGuard no_grad;
  for (const auto& [name, value] : named) {
    at::Tensor dst = local_of(value);
    dst.copy_(values.at("model." + name));
  }
  if (master_) master_->master_to_model();
  restore_adamw_state(*optimizer_, named, values);
  step_ = step;
  run_id_ = saved.run_id;
}

}  // namespace hyper_parallel::train
