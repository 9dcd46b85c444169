// JobConfig: the typed configuration of an hp-train job, TorchTitan-style.
//
// A job is described by a TOML file (configs/debug_model.toml is the default) with one
// table per section ([job], [model], [training], [parallelism], [checkpoint],
// [validation], [metrics]); any key can then be overridden on the command line:
//
//   hp-train --config configs/debug_model.toml --training.steps 10 --checkpoint.resume
//
// Every key is declared once, in a field table in job_config.cpp, which drives TOML
// parsing, command-line overrides, --help and to_toml(); adding a field to a struct
// below means adding one line there. Errors are std::invalid_argument naming the file
// (or the --flag) and the dotted key. LibTorch-free on purpose: the launcher and tools
// can read a job without linking the library.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hyper_parallel/parallelism_config.h"

namespace hyper_parallel::train {

using hyper_parallel::ParallelismConfig;

// [parallelism]: the loss-parallel settings of ParallelismConfig (process-wide, read by
// loss_parallel itself) plus how hp-train arranges its ranks, which only the trainer
// reads (so the library's public struct does not grow training knobs).
struct ParallelismJobConfig : ParallelismConfig {
  // Data-parallel replicas: the world is a dp x tp mesh (global rank = dp_rank * tp +
  // tp_rank, TorchTitan's order); each replica trains on its rows of the global batch.
  int64_t data_parallel_degree = 1;
  // Sharded data parallelism (FSDP2 / ZeRO-3, fully_shard.h): parameters, gradients and
  // AdamW state are split over this many ranks of each replica, whose rows of the batch
  // they also split; world = data_parallel_degree x data_parallel_shard_degree x
  // tensor_parallel_degree (replicas of sharded groups: HSDP).
  int64_t data_parallel_shard_degree = 1;
  // FSDP: a block's gathered parameters are freed after its forward and gathered again
  // for its backward; false keeps them from forward to backward (less communication).
  bool fsdp_reshard_after_forward = true;
  // Norms and residuals on Shard(1) (sequence) activations between the TP regions
  // (llama_tp_plan's sequence_parallel); needs tensor_parallel_degree > 1.
  bool sequence_parallel = false;
  // Gradients are all-reduced over the replicas in buckets of about this many MiB, each
  // sent as soon as backward has produced all of its gradients (overlapped with the rest).
  int64_t dp_bucket_mb = 25;
};

// [model]: the Llama-style decoder.
struct ModelConfig {
  std::string name = "llama";   // model family (the trainer decides which it knows)
  int64_t dim = 256;            // hidden (embedding) size
  int64_t n_layers = 2;         // transformer blocks
  int64_t n_heads = 8;          // attention heads; dim % n_heads == 0 and n_heads % tp == 0
  int64_t vocab_size = 32000;   // token vocabulary (uneven TP sharding is fine)
  int64_t ffn_hidden_dim = 0;   // MLP hidden size; 0: 4*dim*2/3 rounded up to multiple_of
  int64_t multiple_of = 64;     // rounding of the derived ffn_hidden_dim
  double norm_eps = 1e-5;       // RMSNorm epsilon
  double rope_theta = 10000.0;  // RoPE base frequency
  int64_t max_seq_len = 512;    // longest sequence the RoPE tables cover
  // A Hugging Face model folder (config.json, tokenizer files): the model is the family's
  // from_hf_config of its config.json, and the sizes above are set from it (one set to a
  // value other than both its default and the config's is an error naming both).
  std::string hf_assets_path = "";
  // Set once the sizes above were read from hf_assets_path (make_job_model); until then
  // validate() skips the rules relating them to other keys. Not a TOML key.
  bool hf_sizes_applied = false;
};

// The MLP hidden size the model uses: ffn_hidden_dim, or Llama's derivation when it is 0.
int64_t resolved_ffn_hidden_dim(const ModelConfig& model);

// [training]: optimisation and data.
struct TrainingConfig {
  int64_t batch_size = 8;         // sequences per optimiser step, over all data-parallel replicas
                                  // and micro-batches (every TP rank of a replica sees its rows)
  int64_t seq_len = 64;           // tokens per sequence; <= model.max_seq_len
  int64_t steps = 60;             // optimiser steps in the run
  int64_t warmup_steps = 5;       // linear LR warmup steps (then decay to min_lr_ratio*lr)
  double lr = 3e-3;               // peak learning rate (AdamW)
  double min_lr_ratio = 0.1;      // final LR as a fraction of lr, in [0, 1]
  double weight_decay = 0.1;      // AdamW decoupled weight decay
  double beta1 = 0.9;             // AdamW beta1, in [0, 1)
  double beta2 = 0.95;            // AdamW beta2, in [0, 1)
  double eps = 1e-8;              // AdamW epsilon
  double max_norm = 1.0;          // gradient-norm clipping threshold
  int64_t seed = 42;              // RNG seed (same on every rank)
  std::string dtype = "float32";  // parameter/compute dtype: float32 | bfloat16 | float64
  std::string device = "cpu";     // cpu | cuda (each rank on its own GPU, NCCL)
  std::string data = "";          // empty: built-in synthetic corpus; else a corpus file
  // What training.data holds: auto | text | bin_u16 | bin_u32 | megatron (pretokenized_corpus.h;
  // auto: a .idx / .bin beside a .idx is Megatron, a .bin with a sidecar naming its dtype is flat).
  std::string data_format = "auto";
  // Pre-tokenized corpora: ids put between documents where the format records them
  // (Megatron), unless a document already starts / ends with them; -1: the sidecar's.
  int64_t eos_id = -1;
  int64_t bos_id = -1;
  int64_t log_freq = 1;  // log metrics every this many steps
  // The head matmul and the loss fused (fused_linear_cross_entropy): the [tokens, vocab]
  // logits are never materialised. Needs loss parallel when TP > 1 (it is vocabulary-parallel).
  bool fused_linear_loss = false;
  // Terms added to the cross-entropy, on every loss path (LossParallelOptions' meaning):
  // z-loss (PaLM) adds z_loss_weight * logsumexp(logits)^2 per counted token to the training
  // loss (validation reports cross-entropy alone); logit_softcap > 0 replaces the logits by
  // cap * tanh(logits / cap) (Gemma 2) in training and validation.
  double z_loss_weight = 0.0;
  double logit_softcap = 0.0;
  bool caching_allocator = true;  // CPU: install hp's caching huge-page allocator
  // Micro-batches per optimiser step: each replica's rows are split into this many, their
  // gradients accumulate, and the loss is normalised by the global count of target tokens.
  int64_t grad_accum_steps = 1;
  // Steps whose loss or gradient norm is NaN or infinite are never applied; 0 stops the
  // run at the first one, N > 0 skips them (weights and optimizer state untouched) until
  // more than N come in a row (non_finite_steps.h).
  int64_t max_skipped_steps = 0;
  // FSDP with training.dtype = bfloat16: the dtype gradients are reduce-scattered in
  // (TorchTitan's mixed_precision_reduce): float32, or bfloat16 (half the bytes; NCCL only).
  std::string mixed_precision_reduce = "float32";
};

// [checkpoint]: periodic save / resume. folder is relative to job.dump_folder.
struct CheckpointConfig {
  bool enable = false;                 // save checkpoints during the run
  std::string folder = "checkpoints";  // under job.dump_folder
  int64_t interval = 10;               // save every this many steps (and at the end)
  bool resume = false;                 // start from the latest checkpoint in folder
  // Without resume, a folder that already holds checkpoints is an error (it would
  // lose the earlier run's resume point); overwrite deletes them and starts over.
  bool overwrite = false;
  // With resume: the step to resume from; -1 the one `latest` names.
  int64_t load_step = -1;
  // A resume whose data (data_identity.h: corpus, tokenizer, seed, batch size, sequence
  // length) differs from the checkpoint's is an error unless this says it is intended.
  bool allow_data_change = false;
  // Weights read at the start of a run that does not resume (TorchTitan's names; a resume
  // from a checkpoint in `folder` takes precedence). Only Hugging Face checkpoints
  // (initial_load_in_hf) are read; empty path with initial_load_in_hf: model.hf_assets_path.
  std::string initial_load_path = "";
  bool initial_load_in_hf = false;
  // At the end of the run, the last checkpoint is also written as a Hugging Face checkpoint
  // folder (TorchTitan's name) in hf_export_folder(): config.json, safetensors in
  // export_dtype, and model.hf_assets_path's tokenizer files. Needs enable.
  bool last_save_in_hf = false;
  std::string export_dtype = "float32";  // float32 (TorchTitan's default) | bfloat16
};

// [validation]: periodic evaluation on held-out batches.
struct ValidationConfig {
  bool enable = true;  // run validation
  int64_t freq = 10;   // validate every this many steps
  int64_t steps = 2;   // batches per validation
};

// [metrics]: metric logs (and plots). folder is relative to job.dump_folder.
struct MetricsConfig {
  std::string folder = "metrics";  // under job.dump_folder
  bool enable_plot = true;         // also write plots of the logged metrics
};

// Data-parallel ranks: every rank of a replica group holds different rows of the batch.
struct JobConfig;
int64_t data_parallel_ranks(const JobConfig& config);

struct JobConfig {
  // [job]
  std::string dump_folder = "outputs/run";  // root of everything the run writes
  std::string description;                  // free text, stored and otherwise ignored

  ModelConfig model;                 // [model]
  TrainingConfig training;           // [training]
  ParallelismJobConfig parallelism;  // [parallelism], same field names as the struct
  CheckpointConfig checkpoint;       // [checkpoint]
  ValidationConfig validation;       // [validation]
  MetricsConfig metrics;             // [metrics]

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
