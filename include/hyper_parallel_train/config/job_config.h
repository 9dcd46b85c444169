// JobConfig: the typed configuration of an hp-train job, TorchTitan-style.
//
// A job is described by a TOML file (configs/debug_model.toml is the default) with one
// table per section ([job], [model], [training], [lr_scheduler], [parallelism],
// [activation_checkpoint], [checkpoint], [validation], [metrics]); any key can then be
// overridden on the command line:
//
//   hp-train --config configs/debug_model.toml --training.steps 10 --checkpoint.resume
//
// Every key is declared once, with its meaning, in a field table in job_config.cpp, which
// drives TOML parsing, command-line overrides, --help, to_toml() and the reference
// docs/config.md (`hp-train --config-reference`); adding a field to a struct below means
// adding one line there. The structs below therefore say nothing of their keys. Errors are std::invalid_argument naming
// the file (or the --flag) and the dotted key. This header does not include LibTorch; reading a job (job_config.cpp)
// checks [model] against the model registry, so it links libhyper_parallel.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hyper_parallel/models/decoder_sizes.h"
#include "hyper_parallel/loss/loss_terms.h"
#include "hyper_parallel/loss/parallelism_config.h"
#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel::train {

using hyper_parallel::ParallelismConfig;

// [parallelism]: the loss-parallel settings of ParallelismConfig (process-wide, read by
// loss_parallel itself) plus how hp-train arranges its ranks, which only the trainer
// reads (so the library's public struct does not grow training knobs).
struct ParallelismJobConfig : ParallelismConfig {
  int64_t data_parallel_degree = 1;
  int64_t data_parallel_shard_degree = 1;
  bool fsdp_reshard_after_forward = true;
  bool sequence_parallel = false;
  int64_t dp_bucket_mb = 25;
};

// [model]: the model family (a name in the model registry) and its decoder sizes (the
// DecoderSizes of causal_lm.h, each a key); with hf_assets_path the sizes come from its
// config.json.
struct ModelConfig : DecoderSizes {
  std::string name = "llama";
  std::string hf_assets_path = "";
  // Set once the sizes above were read from hf_assets_path (TrainSpec::build); until then
  // validate() skips the rules relating them to other keys. Not a TOML key.
  bool hf_sizes_applied = false;
};

// [training]: optimisation and data.
struct TrainingConfig {
  int64_t batch_size = 8;
  int64_t seq_len = 64;
  int64_t steps = 60;
  double lr = 3e-3;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double max_norm = 1.0;
  int64_t seed = 42;
  std::string dtype = "float32";
  std::string device = "cpu";
  std::string data = "";
  std::string data_format = "auto";
  int64_t eos_id = -1;
  int64_t bos_id = -1;
  int64_t log_freq = 1;
  bool fused_linear_loss = false;
  // z_loss_weight, logit_softcap: the loss layer's one struct of the terms (loss_terms.h);
  // their keys stay flat in [training].
  LossTerms loss_terms;
  bool caching_allocator = true;
  int64_t grad_accum_steps = 1;
  int64_t max_skipped_steps = 0;
  std::string mixed_precision_reduce = "float32";
};

// [lr_scheduler]: TorchTitan's warm-up, stable, decay schedule of training.lr
// (train/optim/lr_scheduler.h).
struct LrSchedulerConfig {
  int64_t warmup_steps = 5;
  double decay_ratio = 1.0;
  std::string decay_type = "cosine";
  double min_lr_factor = 0.1;
};

// [checkpoint]: periodic save / resume. folder is relative to job.dump_folder.
struct CheckpointConfig {
  bool enable = false;
  std::string folder = "checkpoints";
  int64_t interval = 10;
  bool resume = false;
  bool overwrite = false;
  int64_t load_step = -1;
  bool allow_data_change = false;
  std::string initial_load_path = "";
  bool initial_load_in_hf = false;
  bool last_save_in_hf = false;
  std::string export_dtype = "float32";
};

// [validation]: periodic evaluation on held-out batches.
struct ValidationConfig {
  bool enable = true;
  int64_t freq = 10;
  int64_t steps = 2;
};

// [activation_checkpoint]: TorchTitan's keys (activation_checkpoint.h). mode "none" is our
// default (TorchTitan's is "selective"): recomputing costs a forward per checkpointed block,
// and on the CPU ranks hp-train mostly runs on memory is not what limits a job.
struct ActivationCheckpointJobConfig {
  std::string mode = "none";
  std::string selective_ac_option = "2";
  bool preserve_rng_state = true;
};

// [metrics]: metric logs (and plots). folder is relative to job.dump_folder.
struct MetricsConfig {
  std::string folder = "metrics";
  bool enable_plot = true;
  double peak_tflops = 0.0;
};

struct JobConfig {
  // [job]
  std::string dump_folder = "outputs/run";  // root of everything the run writes
  std::string description;                  // free text, stored and otherwise ignored

  ModelConfig model;                                    // [model]
  TrainingConfig training;                              // [training]
  LrSchedulerConfig lr_scheduler;                       // [lr_scheduler]
  ParallelismJobConfig parallelism;                     // [parallelism], same field names as the struct
  ActivationCheckpointJobConfig activation_checkpoint;  // [activation_checkpoint]
  CheckpointConfig checkpoint;                          // [checkpoint]
  ValidationConfig validation;                          // [validation]
  MetricsConfig metrics;                                // [metrics]

  std::string config_file;  // path it was loaded from, empty if none (not a TOML key)
};

// Parses the command-line arguments after the program name: `--config FILE` (or
// `--config=FILE`, alias `--job.config_file`; optional: without it, defaults) is loaded
// first wherever it appears, then every `--section.key VALUE` / `--section.key=VALUE` is
// applied in order. A bool key with no value (next argument starts with "--", or none)
// means true. '-' in a key is read as '_'. `--help` / `-h` sets *help = true (when help is
// given) and returns defaults without reading anything else. The result is validate()d.
JobConfig parse_job_config(const std::vector<std::string>& args, bool* help = nullptr);
// The same for main()'s argv (argv[0], the program, is skipped).
JobConfig parse_job_config(int argc, const char* const* argv, bool* help = nullptr);

// Defaults overlaid with the file's keys (keys the file omits keep their defaults); sets
// config_file. Does not validate(), so a file may hold a partial job meant for overrides.
JobConfig load_job_config_file(const std::string& path);

// One override: dotted_key is "section.key" (a leading "--" is accepted), value the text
// after it, parsed per the field's type (ints: whole-string decimal; floats; bools:
// true/false/1/0; strings as is).
void apply_override(JobConfig& cfg, const std::string& dotted_key, const std::string& value);

// --help text: every --section.key with its type, default and meaning.
std::string job_config_usage();
// The same as a Markdown reference, one table per section: docs/config.md.
std::string job_config_reference();

// The full configuration as TOML, every key, in declaration order; load_job_config_file
// of the result gives back an equal JobConfig (config_file aside).
std::string to_toml(const JobConfig& cfg);

// A folder the job writes (checkpoint.folder, metrics.folder): under job.dump_folder, or
// itself when absolute.
std::string job_folder(const JobConfig& cfg, const std::string& folder);
// Where checkpoint.last_save_in_hf writes step `step`: <job.dump_folder>/hf/step-<step>
// (beside the checkpoint folder, not in it: its step-<N> folders are hp-train's own).
std::string hf_export_folder(const JobConfig& cfg, int64_t step);

// Semantic checks (positive sizes, seq_len <= model.max_seq_len, known dtype,
// dim % n_heads == 0, n_heads % tensor_parallel_degree == 0, ...). Throws
// std::invalid_argument listing every violation, each naming its key.
void validate(const JobConfig& cfg);

}  // namespace hyper_parallel::train

HP_PUBLIC_END
