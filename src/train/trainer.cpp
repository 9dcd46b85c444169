#include "hyper_parallel_train/trainer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iterator>
#include <map>
#include <iostream>
#include <sstream>

#include "hyper_parallel/nn/activation_checkpoint.h"
#include "hyper_parallel/models/causal_lm.h"
#include "hyper_parallel/core/distributed.h"
#include "hyper_parallel/dtensor/dtensor.h"
#include "hyper_parallel/models/hf_checkpoint.h"
#include "hyper_parallel/nn/parameters_on_meta.h"
#include "hyper_parallel/loss/parallelism_config.h"
#include "hyper_parallel/core/cpu_allocator.h"
#include "compat/file_system.h"
#include "hyper_parallel/core/collective_stats.h"
#include "hyper_parallel/core/run_then_agree.h"
#include "hyper_parallel/nn/fully_shard.h"
#include "train/checkpoint/checkpoint_io.h"
#include "train/config/training_dtype.h"
#include "train/checkpoint/fault_injection.h"
#include "train/metrics/state_bytes.h"
#include "train/metrics/step_metrics.h"
#include "train/checkpoint/checkpoint_manager.h"
#include "train/checkpoint/dump_folder_lock.h"
#include "train/data/corpus.h"
#include "train/optim/non_finite_steps.h"
#include "hyper_parallel_train/spec/parallelized_model.h"
#include "train/parallel/parallelism_scope.h"
#include "train/validator.h"
#include "train/data/data_identity.h"
#include "train/parallel/local_piece.h"
#include "train/parallel/mesh_sum.h"
#include "train/metrics/metrics.h"
#include "train/metrics/mfu.h"
#include "train/optim/lr_scheduler.h"
#include "train/optim/optim_utils.h"
#include "train/metrics/progress.h"
#include "train/training_job.h"
#include "train/training_step.h"
#include "train/checkpoint/storage_checks.h"

namespace hyper_parallel::train {

namespace {

// The config.json the model came from, recorded in checkpoints; null without one. (The
// spec's build has read and checked it already.)
nlohmann::json recorded_hf_config(const ModelConfig& model) {
  if (model.hf_assets_path.empty()) return nullptr;
  std::ifstream in(compat::join_path(model.hf_assets_path, "config.json"));
  return nlohmann::json::parse(in);
}

// 27.3 MFLOPs, 48.2 GFLOPs: three significant digits.
std::string format_flops(double flops) {
  const char* units[] = {"FLOPs", "kFLOPs", "MFLOPs", "GFLOPs", "TFLOPs"};
  size_t unit = 0;
  for (; unit + 1 < std::size(units) && flops >= 1000; ++unit) flops /= 1000;
  std::ostringstream os;
  os << std::setprecision(3) << flops << " " << units[unit];
  return os.str();
}

}  // namespace

namespace {

// The caching CPU allocator, then the job's set-up. Starting from a Hugging Face checkpoint
// every weight is read (or resumed), never initialised: the model is built on the meta
// device, and each rank only ever allocates its own shards (materialize_parameters after
// parallelize). At TP 1 every rank holds the whole model anyway.
std::unique_ptr<TrainingJob> start_job(JobConfig config) {
  // Large CPU buffers from a cache of huge-page-backed blocks that outlives each step: no
  // fresh-page faults after the first step, whatever the environment says.
  if (config.training.device == "cpu" && config.training.caching_allocator) install_caching_cpu_allocator();
  const bool read_when_parallelized =
      config.checkpoint.initial_load_in_hf && config.parallelism.tensor_parallel_degree > 1;
  return std::make_unique<TrainingJob>(std::move(config), read_when_parallelized
                                                              ? TrainingJob::Weights::ReadWhenParallelized
                                                              : TrainingJob::Weights::Initialised);
}

}  // namespace

Trainer::Trainer(JobConfig config, std::ostream* log) : job_(start_job(std::move(config))), log_(log) {
  const JobConfig& c = job_->config;
  TORCH_CHECK(!c.checkpoint.resume || c.checkpoint.enable,
              "hp-train: --checkpoint.resume needs checkpoint.enable = true (nothing would be read)");
  rank_ = is_initialized() ? get_rank() : 0;
  lr_schedule_ = std::make_unique<WarmupStableDecay>(c.lr_scheduler, c.training.steps);
  if (rank_ == 0) {
    // Counted on the whole model, before any sharding; the peak measured (or given) once.
    mfu_ = std::make_unique<ModelFlopsUtilization>(
        job_->spec->flops_per_token(*job_->model, c.training.seq_len), world_size_or_one(),
        peak_flops(c.metrics.peak_tflops, training_dtype(c.training.dtype), job_->device));
  }
  dp_rank_ = job_->dims.dp_rank_of(rank_);
  checkpoints_ = std::make_unique<CheckpointManager>(c, rank_, job_->meshes.world, recorded_hf_config(c.model),
                                                     as_causal_lm(*job_->model).sizes(), log_);
  // TP (init_weights(seed) gave every rank the same weights: each shards its own copy, with
  // no scatter from TP rank 0), the weights read into the TP pieces, then FSDP or DDP and
  // bfloat16's masters around the module.
  job_->parallelize([&] {
    if (job_->weights == TrainingJob::Weights::ReadWhenParallelized) materialize_parameters(*job_->model, job_->device);
    initial_load();
  });
  non_finite_ = std::make_unique<NonFiniteSteps>(c.training.max_skipped_steps);
  // Before anything is read or written in the dump folder: one job per folder, and
  // folders that cannot take the job's files found now, not at the first save.
  lock_job_folders();
  check_storage();
  open_data();
  if (rank_ == 0 && log_) log_start();
  checkpoints_->set_data_identity(data_identity(job_->config.training, corpus_->identity()));
  if (job_->config.checkpoint.enable) checkpoints_->prepare_folder();
  if (job_->config.checkpoint.enable && job_->config.checkpoint.resume) {
    if (const auto step = checkpoints_->resume(trained_state(), job_->config.training.steps)) step_ = *step;
  }
}

void Trainer::open_data() {
  // Every TP rank of a replica builds the same rows: the replica's share of the global batch.
  corpus_ = open_training_corpus(job_->config.training, job_->config.model.vocab_size);
  batches_ = corpus_->train_batches(dp_rank_, job_->dims.dp_ranks());
  if (!job_->config.validation.enable) return;
  validator_ = std::make_unique<Validator>(*job_->spec, job_->config.validation, job_->config.training,
                                           corpus_->validation_batches(dp_rank_, job_->dims.dp_ranks()),
                                           job_->context.for_validation());
  if (job_->meshes.dp) validator_->set_data_parallel_mesh(*job_->meshes.dp);
}

void Trainer::log_start() {
  const auto& t = job_->config.training;
  *log_ << "hp-train: " << corpus_->describe() << "\n"
        << "hp-train: " << job_->spec->describe(*job_->model);
  if (!job_->config.model.hf_assets_path.empty()) {
    // The sizes come from the folder's config.json; the weights only with initial_load_in_hf.
    *log_ << (job_->config.checkpoint.initial_load_in_hf ? " from " : " shaped as ")
          << job_->config.model.hf_assets_path;
    if (!job_->config.checkpoint.initial_load_in_hf) {
      *log_ << " (its config.json; its weights are read only with --checkpoint.initial_load_in_hf)";
    }
  }
  *log_ << "; " << job_->parallelized->describe();
  if (t.grad_accum_steps > 1) *log_ << ", " << t.grad_accum_steps << " micro-batches per step";
  if (job_->config.parallelism.sequence_parallel) *log_ << ", sequence parallel";
  const auto& ac = job_->config.activation_checkpoint;
  if (ac.mode != "none")
    *log_ << ", activation checkpointing "
          << block_checkpointing(ac.mode, ac.selective_ac_option).str(job_->config.model.n_layers);
  *log_ << ", loss parallel " << (job_->loss_parallel ? "on" : "off")
        << (t.fused_linear_loss ? ", fused linear loss" : "");
  if (t.loss_terms.z_loss_weight > 0) *log_ << ", z-loss " << t.loss_terms.z_loss_weight;
  if (job_->context.loss_terms().logit_softcap > 0) {
    *log_ << ", logit soft-cap " << job_->context.loss_terms().logit_softcap;
  }
  // Ranks sharing a node each running one thread per core is the commonest slow-down
  // (hp-run and torchrun set OMP_NUM_THREADS=1 for them): say what each rank runs.
  const int threads = at::get_num_threads();
  *log_ << "; " << threads << (threads == 1 ? " intra-op thread" : " intra-op threads") << " per rank";
  *log_ << std::endl;
  *log_ << "hp-train: " << lr_schedule_->describe(t.lr) << std::endl;
  if (mfu_) {
    std::ostringstream peak;  // in TFLOPs, as the progress line and metrics.jsonl say them
    peak << std::setprecision(3) << mfu_->peak().tflops;
    *log_ << "hp-train: " << format_flops(static_cast<double>(mfu_->flops_per_token())) << " per token (seq_len "
          << t.seq_len << ", TorchTitan's count); peak " << peak.str() << " TFLOPs per rank " << mfu_->peak().source
          << std::endl;
  }
}

void Trainer::initial_load() {
  const auto& c = job_->config.checkpoint;
  if (!c.initial_load_in_hf) return;
  const std::string path = c.initial_load_path.empty() ? job_->config.model.hf_assets_path : c.initial_load_path;
  if (c.enable && c.resume) {
    // A resume that finds a checkpoint loads it; a damaged `latest` counts as found, so
    // that load_checkpoint reports it rather than this run silently starting over.
    if (checkpoints_->has_resume_point()) {
      if (rank_ == 0 && log_) {
        *log_ << "hp-train: resuming: " << path << " is not read (a resume takes precedence)" << std::endl;
      }
      return;
    }
  }
  // Every rank checks the same headers alike (load_hf_checkpoint); an error of one rank
  // alone (its file system) still stops every rank.
  run_then_agree("loading the Hugging Face checkpoint " + path, job_->meshes.world,
                 [&] { load_hf_checkpoint(*job_->model, *job_->spec, path); });
  if (rank_ == 0 && log_) *log_ << "hp-train: weights loaded from the Hugging Face checkpoint in " << path << std::endl;
}

void Trainer::export_missing_last_save() {
  if (!job_->config.checkpoint.enable || !job_->config.checkpoint.last_save_in_hf ||
      step_ != job_->config.training.steps)
    return;
  // Rank 0's view decides for every rank (save_in_hf is collective).
  at::Tensor missing = at::zeros({1}, at::kLong);
  if (rank_ == 0) {
    const std::string config = compat::join_path(hf_export_folder(job_->config, step_), "config.json");
    missing.fill_(compat::path_exists(config) ? 0 : 1);
  }
  if (job_->meshes.world) {
    missing = missing.to(job_->meshes.world->device());
    for (int64_t d = 0; d < job_->meshes.world->ndim(); ++d) job_->meshes.world->comm(d).broadcast_(missing, 0);
    missing = missing.cpu();
  }
  if (missing.item<int64_t>() == 0) return;
  say("hp-train: step " + std::to_string(step_) + " has no Hugging Face export yet (checkpoint.last_save_in_hf; " +
      "the run that saved it stopped before the export was whole): writing it now");
  checkpoints_->save_in_hf(step_);
}

void Trainer::lock_job_folders() {
  // Every folder the job writes (the HF export goes under the dump folder); rank 0 writes
  // metrics, every rank its checkpoint file.
  std::vector<std::pair<std::string, std::string>> folders{{"job.dump_folder", job_->config.dump_folder}};
  if (job_->config.checkpoint.enable) folders.emplace_back("checkpoint.folder", checkpoints_->folder());
  folders.emplace_back("metrics.folder", metrics_folder());
  run_then_agree("locking the job's folders", job_->meshes.world, [&] {
    if (rank_ == 0) folder_locks_ = lock_folders(folders);
  });
  // Several machines (hp-run --nnodes): each other machine's local rank 0 also locks the
  // folders it does not see rank 0's lock in (node-local folders).
  const char* local_rank = std::getenv("LOCAL_RANK");
  const char* local_world = std::getenv("LOCAL_WORLD_SIZE");
  const int64_t world = world_size_or_one();
  if (!local_rank || !local_world || std::atoll(local_world) >= world) return;
  const std::string key = "hp_train/folder_lock_records";
  auto& store = *current_world().store;
  run_then_agree("locking the job's folders", job_->meshes.world, [&] {
    if (rank_ == 0) {
      std::string records;  // one record per line; lock records hold no newline
      for (const auto& lock : folder_locks_) records += lock->record() + "\n";
      store.set(key, std::vector<uint8_t>(records.begin(), records.end()));
    } else if (std::string(local_rank) == "0") {
      const std::vector<uint8_t> held = store.get(key);
      const std::string records(held.begin(), held.end());
      std::vector<std::pair<std::string, std::string>> unseen;
      for (const auto& folder : folders) {
        const std::string record = read_dump_folder_lock_record(folder.second);
        if (record.empty() || records.find(record + "\n") == std::string::npos) unseen.push_back(folder);
      }
      folder_locks_ = lock_folders(unseen);
    }
  });
}

void Trainer::check_storage() {
  const std::string tag = std::to_string(rank_);
  run_then_agree("checking that the job's folders are writable", job_->meshes.world, [&] {
    // Every rank writes its checkpoint file; rank 0 alone the metrics.
    if (rank_ == 0) check_writable_folder(job_->config.dump_folder, "job.dump_folder", tag);
    if (job_->config.checkpoint.enable) check_writable_folder(checkpoints_->folder(), "checkpoint.folder", tag);
    if (rank_ == 0) check_writable_folder(metrics_folder(), "metrics.folder", tag);
  });
  if (!job_->config.checkpoint.enable) return;
  // One checkpoint: every rank's weights and AdamW moments (same dtype as the weights they
  // train, float32 masters in bfloat16 training).
  double bytes = 0;
  for (const auto& p : job_->parallelized->trained_parameters()) {
    const at::Tensor local = local_or_plain(p);
    bytes += 3.0 * static_cast<double>(local.numel()) * static_cast<double>(local.element_size());
  }
  at::Tensor total = at::full({1}, bytes, at::TensorOptions().dtype(at::kDouble).device(job_->device));
  sum_over_mesh(total, job_->meshes.world);
  const auto free = free_bytes(checkpoints_->folder());
  if (rank_ == 0 && log_ && free) {
    if (auto warning = room_warning(checkpoints_->folder(), *free, static_cast<int64_t>(total.cpu().item<double>()))) {
      *log_ << "hp-train: warning: " << *warning << std::endl;
    }
  }
}

Trainer::~Trainer() = default;

std::string Trainer::metrics_folder() const { return job_folder(job_->config, job_->config.metrics.folder); }

TrainingStepParts Trainer::step_parts() { return job_->step_parts(); }

bool Trainer::loss_parallel_enabled() const { return job_->loss_parallel; }
const TrainContext& Trainer::train_context() const { return job_->context; }
torch::nn::Module& Trainer::model() { return *job_->model; }
const TrainSpec& Trainer::spec() const { return *job_->spec; }
const ParallelDims& Trainer::parallel_dims() const { return job_->dims; }
const ParallelizedModel& Trainer::parallelized_model() const { return *job_->parallelized; }
const JobConfig& Trainer::config() const { return job_->config; }

StepResult Trainer::train_step(int64_t step) {
  const auto& t = job_->config.training;
  StepResult r;
  const std::optional<FullyShardStats> sharding_before = job_->parallelized->sharding_stats();
  r.step = step;
  const StepMeter meter;
  r.lr = t.lr * lr_schedule_->factor(step);
  PhaseClock clock(r);
  for (auto& group : job_->optimizer->param_groups())
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(r.lr);
  // Gradients are set to none, not zeroed: backward then hands each parameter its freshly
  // computed gradient (no accumulation pass), in blocks the caching allocator reuses.
  job_->optimizer->zero_grad();
  clock.mark(kOptimizer);
  const Batch batch = batches_->batch_at(step - 1);
  r.loss = forward_backward(step_parts(), batch, clock);
  if (sharding_before) {
    const FullyShardStats now = *job_->parallelized->sharding_stats();
    ShardingStep& f = r.sharding.emplace();
    f.all_gathers = now.all_gathers - sharding_before->all_gathers;
    f.reduce_scatters = now.reduce_scatters - sharding_before->reduce_scatters;
    f.bytes_sent = now.bytes_sent - sharding_before->bytes_sent;
    f.collective_seconds = now.collective_seconds - sharding_before->collective_seconds;
    f.blocked_seconds = now.blocked_seconds - sharding_before->blocked_seconds;
    f.reduce_dtype = t.dtype == "bfloat16" ? t.mixed_precision_reduce : t.dtype;
  }
  clip_and_update(step_parts(), r, clock);
  step_ = step;
  r.state = state_bytes();
  meter.finish(r);
  return r;
}

std::vector<StepResult> Trainer::train() {
  const auto& t = job_->config.training;
  open_metrics();
  if (rank_ == 0 && log_) progress_ = std::make_unique<ProgressLine>(t.steps, *log_, is_terminal(*log_));
  std::vector<StepResult> results;
  while (step_ < t.steps) {
    const auto start = std::chrono::steady_clock::now();
    StepResult r = train_step(step_ + 1);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    StepRates rates;
    rates.tokens_per_s = static_cast<double>(t.batch_size * t.seq_len) / std::max(secs, 1e-9);
    if (mfu_) {
      rates.tflops = mfu_->tflops_per_rank(rates.tokens_per_s);
      rates.mfu_pct = mfu_->mfu_pct(rates.tokens_per_s);
    }
    const bool last = r.step == t.steps;
    // Non-finite: skipped, or the run stops here (the same on every rank, nothing of the
    // step saved; its metrics are still written, so the log shows where it went wrong).
    std::string stop;
    try {
      if (non_finite_->check(r.step, r.loss, r.grad_norm)) {
        say("hp-train: step " + std::to_string(r.step) + ": " + describe_non_finite(r.loss, r.grad_norm) +
            ": skipped (" + std::to_string(non_finite_->consecutive()) +
            " in a row, at most training.max_skipped_steps = " + std::to_string(t.max_skipped_steps) + ")");
      }
    } catch (const std::runtime_error& e) {
      stop = e.what();
    }
    if (stop.empty() && validator_ && (r.step % job_->config.validation.freq == 0 || last)) {
      r.val_loss = validator_->validate(*job_->model);
      job_->parallelized->after_forward_without_backward();
    }
    if (stop.empty() && job_->config.checkpoint.enable && (r.step % job_->config.checkpoint.interval == 0 || last)) {
      save_checkpoint();
      if (last && job_->config.checkpoint.last_save_in_hf) checkpoints_->save_in_hf(r.step);
    }
    // The same decision on every rank, so that a failed write on rank 0 stops them all.
    if (r.step % t.log_freq == 0 || r.val_loss || last || r.non_finite) {
      run_then_agree("writing the metrics of step " + std::to_string(r.step), job_->meshes.world, [&] {
        if (metrics_) metrics_->log(metrics_record(r, rates, non_finite_->skipped()));
      });
    }
    if (!stop.empty()) {
      if (progress_) progress_->finish();
      throw std::runtime_error(stop);
    }
    if (progress_) progress_->update(r.step, r.loss, rates, peak_memory_mib());
    if (r.val_loss) {
      std::ostringstream line;
      line << "step " << r.step << ": validation loss " << *r.val_loss;
      say(line.str());
    }
    results.push_back(r);
    crash_point("step.finished", rank_);  // between steps: its metrics and checkpoint are written
  }
  if (progress_) progress_->finish();
  if (results.empty()) export_missing_last_save();
  plot_metrics();
  return results;
}

void Trainer::open_metrics() {
  run_then_agree("opening the metrics file", job_->meshes.world, [&] {
    if (rank_ != 0) return;
    make_directories(metrics_folder());
    metrics_ = std::make_unique<MetricsLogger>(metrics_folder(), step_);
    if (metrics_->dropped_records() > 0 && log_) {
      *log_ << "hp-train: " << metrics_->path() << ": cut " << metrics_->dropped_records() << " line(s) after step "
            << step_ << " (a torn line, or records of steps this run does again)" << std::endl;
    }
  });
}

void Trainer::say(const std::string& line) {
  if (!progress_) return;
  progress_->finish();
  *log_ << line << std::endl;
  progress_ = std::make_unique<ProgressLine>(job_->config.training.steps, *log_, is_terminal(*log_));
}

void Trainer::plot_metrics() const {
  if (!metrics_ || !job_->config.metrics.enable_plot) return;
  std::string error;
  const std::string png = metrics_folder() + "/loss.png";
  if (plot_loss_curve(metrics_->path(), png, &error)) {
    if (log_) *log_ << "hp-train: loss curve written to " << png << std::endl;
  } else if (log_) {
    *log_ << "hp-train: no loss plot: " << error << std::endl;
  }
}

const std::string& Trainer::run_id() const { return checkpoints_->run_id(); }

FullyShardedParameters* Trainer::fully_sharded() const { return job_->parallelized->fully_sharded(); }

void Trainer::save_checkpoint() const { checkpoints_->save(step_, trained_state()); }

bool Trainer::load_checkpoint() {
  const std::optional<int64_t> step = checkpoints_->load(trained_state());
  if (step) step_ = *step;
  return step.has_value();
}

StateBytes Trainer::state_bytes() const { return measure_state_bytes(*job_->parallelized, *job_->optimizer); }

TrainedState Trainer::trained_state() const {
  return {job_->parallelized->named_trained_parameters(), job_->optimizer.get(), job_->parallelized.get()};
}

}  // namespace hyper_parallel::train
