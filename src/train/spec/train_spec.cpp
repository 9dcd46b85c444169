// Every family's TrainSpec, made from its registry entry (model_registry.h) and its module's
// CausalLanguageModel interface.
#include "hyper_parallel_train/spec/train_spec.h"

#include <ATen/ATen.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>

#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>

#include "compat/file_system.h"
#include "hyper_parallel/models/causal_lm.h"
#include "hyper_parallel/dtensor/dtensor.h"
#include "hyper_parallel/loss/fused_linear_loss.h"
#include "hyper_parallel/loss/plain_cross_entropy.h"
#include "hyper_parallel/models/model_registry.h"
#include "hyper_parallel_train/spec/parallelized_model.h"

namespace hyper_parallel::train {
namespace {

namespace F = torch::nn::functional;

template <class T>
std::string text(T v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// [model]'s size field against the config's: takes the config's value, or records why not.
template <class T>
void take(T& field, T from_config, T default_value, const char* key, const char* hf_key, const std::string& config,
          std::vector<std::string>& conflicts) {
  if (field != default_value && field != from_config) {
    conflicts.push_back("model." + std::string(key) + " = " + text(field) + " but " + config + " has " + hf_key +
                        " = " + text(from_config));
  }
  field = from_config;
}

std::shared_ptr<torch::nn::Module> from_sizes(const ModelFamily& family, const ModelConfig& m) {
  // Sizes from the TOML build only a family whose whole shape they say (Llama); another
  // (qwen3: q/k norms) comes from its config.json, never silently as something else.
  if (!family.from_sizes) {
    throw std::invalid_argument("model.name = \"" + m.name + "\" needs model.hf_assets_path (its config.json); " +
                                "the sizes in [model] do not describe this family");
  }
  return family.from_sizes(m);
}

std::shared_ptr<torch::nn::Module> build(const ModelFamily& family, ModelConfig& m) {
  if (m.hf_assets_path.empty()) return from_sizes(family, m);
  const std::string config = compat::join_path(m.hf_assets_path, "config.json");
  if (!compat::path_exists(config)) {
    // Every relative path of a job config is read from the working directory (TorchTitan's
    // rule, and what to_toml round-trips): say which one, for a run started elsewhere.
    const bool relative = m.hf_assets_path.rfind('/', 0) != 0;
    throw std::invalid_argument("model.hf_assets_path = \"" + m.hf_assets_path + "\": no config.json there (" + config +
                                (relative ? ", relative to the working directory " + compat::current_directory() : "") +
                                ")");
  }
  std::shared_ptr<torch::nn::Module> module = family.from_hf_config(config);
  const DecoderSizes s = as_causal_lm(*module).sizes();
  const ModelConfig d;
  std::vector<std::string> conflicts;
  take(m.dim, s.dim, d.dim, "dim", "hidden_size", config, conflicts);
  take(m.n_layers, s.n_layers, d.n_layers, "n_layers", "num_hidden_layers", config, conflicts);
  take(m.n_heads, s.n_heads, d.n_heads, "n_heads", "num_attention_heads", config, conflicts);
  take(m.n_kv_heads, s.n_kv_heads, d.n_kv_heads, "n_kv_heads", "num_key_value_heads", config, conflicts);
  take(m.head_dim, s.head_dim, d.head_dim, "head_dim", "head_dim", config, conflicts);
  take(m.vocab_size, s.vocab_size, d.vocab_size, "vocab_size", "vocab_size", config, conflicts);
  take(m.ffn_hidden_dim, s.ffn_hidden_dim, d.ffn_hidden_dim, "ffn_hidden_dim", "intermediate_size", config, conflicts);
  take(m.norm_eps, s.norm_eps, d.norm_eps, "norm_eps", "rms_norm_eps", config, conflicts);
  take(m.rope_theta, s.rope_theta, d.rope_theta, "rope_theta", "rope_theta", config, conflicts);
  take(m.max_seq_len, s.max_seq_len, d.max_seq_len, "max_seq_len", "max_position_embeddings", config, conflicts);
  take(m.tie_word_embeddings, s.tie_word_embeddings, d.tie_word_embeddings, "tie_word_embeddings",
       "tie_word_embeddings", config, conflicts);
  if (!conflicts.empty()) {
    std::string list;
    for (const auto& c : conflicts) list += (list.empty() ? "" : "; ") + c;
    throw std::invalid_argument("model.hf_assets_path: the model's sizes come from its config.json: " + list +
                                "; leave those keys unset (or set them to the config's values)");
  }
  m.hf_sizes_applied = true;
  return module;
}

std::shared_ptr<torch::nn::Module> rebuild(const ModelFamily& family, const ModelConfig& m,
                                           const std::string& hf_config_json) {
  if (hf_config_json.empty()) return from_sizes(family, m);
  return family.from_hf_config_json(hf_config_json, "the recorded config.json");
}

// FSDP's groups: parameters named "layers.<i>.…" form block i's group, every other one the root's.
std::vector<NamedParameters> block_groups(const torch::nn::Module& model) {
  const int64_t blocks = as_causal_lm(model).sizes().n_layers;
  std::vector<NamedParameters> groups(static_cast<size_t>(1 + blocks));
  for (const auto& p : model.named_parameters()) {
    const std::string& name = p.key();
    size_t group = 0;
    if (name.rfind("layers.", 0) == 0) group = 1 + std::stoul(name.substr(7, name.find('.', 7) - 7));
    groups.at(group).emplace_back(name, p.value());
  }
  return groups;
}

// TorchTitan's order: TP, activation checkpointing, then data parallelism around the
// TP-sharded module.
std::unique_ptr<ParallelizedModel> parallelize(const ModelFamily& family, std::shared_ptr<torch::nn::Module> model,
                                               const ParallelDims& dims, const ParallelDims::Meshes& meshes,
                                               const JobConfig& job, const std::function<void()>& load_weights) {
  const auto& p = job.parallelism;
  if (dims.tp_enabled()) family.parallelize(*model, *meshes.tp, !p.disable_loss_parallel, p.sequence_parallel);
  apply_activation_checkpointing(*model, job.activation_checkpoint);
  if (load_weights) load_weights();
  return std::make_unique<ParallelizedModel>(std::move(model), dims, meshes, job, block_groups);
}

// The sum of the batch's token losses. Summed, not averaged: the caller divides by the global
// number of counted tokens (over replicas and micro-batches), so every token weighs the same
// whichever rank holds it. The terms of `context` (z-loss, soft-capping) are applied by its
// loss_parallel guard, by the fused loss, or here on replicated logits.
at::Tensor token_loss_sum(torch::nn::Module& module, const Batch& batch, const TrainContext& context,
                          const LossCall& call) {
  CausalLanguageModel& model = as_causal_lm(module);
  const at::Tensor head = model.head_weight();
  const at::Device device = head.device();
  const at::Tensor target = batch.target.to(device).flatten();
  const LossTerms& terms = context.loss_terms();
  if (call.fused_linear) {
    at::Tensor hidden = model.hidden_states(batch.input.to(device));
    // Sequence parallel: the fused loss takes the whole sequence (one all-gather, as the
    // head's own input conversion does; backward slices the all-reduced gradient).
    if (is_dtensor(hidden)) hidden = redistribute(hidden, Placements{Placement::replicate()});
    if (call.after_forward) call.after_forward();
    FusedLinearCrossEntropyOptions options;
    options.ignore_index = kIgnoreIndex;
    options.reduction = at::Reduction::Sum;
    static_cast<LossTerms&>(options) = terms;
    // The sum in float32, as the unfused path below widens its logits: a bfloat16 sum of the
    // token losses would be rounded to 8 bits (0.4 %), in the loss reported and in its scale.
    options.loss_dtype = at::promoteTypes(hidden.scalar_type(), at::kFloat);
    return fused_linear_cross_entropy(hidden.flatten(0, 1), head, target, options);
  }
  at::Tensor logits = model.logits(batch.input.to(device));
  if (call.after_forward) call.after_forward();
  // Low-precision logits are widened first, as TorchTitan does: a bfloat16 sum of the
  // token losses would be rounded to 8 bits (0.4 %), in the loss reported and in its scale.
  if (logits.scalar_type() == at::kBFloat16 || logits.scalar_type() == at::kHalf) logits = logits.to(at::kFloat);
  logits = logits.flatten(0, 1);
  const auto sum_options = F::CrossEntropyFuncOptions().ignore_index(kIgnoreIndex).reduction(torch::kSum);
  if (context.loss_parallel_enabled())
    return F::cross_entropy(logits, target, sum_options);  // the guard adds the terms
  // All the classes here: the loss layer's one definition of the terms on full logits.
  CrossEntropyDefinition definition{terms, kIgnoreIndex, at::Reduction::Sum};
  return cross_entropy_with_terms(logits, target, definition);
}

LossTerms loss_terms(const torch::nn::Module& model, const TrainingConfig& t) {
  const double model_cap = as_causal_lm(model).final_logit_softcap();
  const double job_cap = t.loss_terms.logit_softcap;
  if (model_cap > 0 && job_cap > 0 && job_cap != model_cap) {
    throw std::invalid_argument("training.logit_softcap = " + text(job_cap) +
                                " but the model soft-caps its logits at " + text(model_cap) +
                                " (final_logit_softcapping); leave training.logit_softcap at 0");
  }
  return {t.loss_terms.z_loss_weight, model_cap > 0 ? model_cap : job_cap};
}

std::string describe(const std::string& name, const torch::nn::Module& model) {
  const DecoderSizes s = as_causal_lm(model).sizes();
  std::ostringstream os;
  os << name << " dim " << s.dim << ", " << s.n_layers << " layers, " << s.n_heads << " heads";
  if (s.n_kv_heads > 0 && s.n_kv_heads != s.n_heads) os << " (" << s.n_kv_heads << " key/value)";
  os << ", vocab " << s.vocab_size << (s.tie_word_embeddings ? " (tied embeddings)" : "");
  return os.str();
}

TrainSpec spec_of(const ModelFamily& family) {
  TrainSpec spec;
  spec.name = family.name;
  spec.family = &family;
  spec.build = [&family](ModelConfig& m) { return build(family, m); };
  spec.rebuild = [&family](const ModelConfig& m, const std::string& json) { return rebuild(family, m, json); };
  spec.parallelize = [&family](std::shared_ptr<torch::nn::Module> model, const ParallelDims& dims,
                               const ParallelDims::Meshes& meshes, const JobConfig& job,
                               const std::function<void()>& load_weights) {
    return parallelize(family, std::move(model), dims, meshes, job, load_weights);
  };
  spec.shard_groups = block_groups;
  spec.loss = token_loss_sum;
  spec.loss_terms = loss_terms;
  spec.flops_per_token = [](const torch::nn::Module& model, int64_t seq_len) {
    return as_causal_lm(model).flops_per_token(seq_len);
  };
  spec.describe = [name = family.name](const torch::nn::Module& model) { return describe(name, model); };
  return spec;
}

}  // namespace

void apply_activation_checkpointing(torch::nn::Module& model, const ActivationCheckpointJobConfig& config) {
  as_causal_lm(model).set_block_checkpointing(
      block_checkpointing(config.mode, config.selective_ac_option, config.preserve_rng_state));
}

namespace {

// The specs in use, by name: registered, or made by default_train_spec at the first lookup.
// A map: the references train_spec hands out survive later insertions.
struct SpecTable {
  std::mutex mutex;
  std::map<std::string, TrainSpec> specs;
};

SpecTable& spec_table() {
  static SpecTable t;
  return t;
}

}  // namespace

const TrainSpec& train_spec(const std::string& name) {
  const ModelFamily& family = model_family(name);  // refuses an unknown name, listing the known ones
  SpecTable& t = spec_table();
  std::lock_guard<std::mutex> lock(t.mutex);
  auto it = t.specs.find(name);
  if (it == t.specs.end()) it = t.specs.emplace(name, spec_of(family)).first;
  return it->second;
}

TrainSpec default_train_spec(const std::string& name) { return spec_of(model_family(name)); }

void load_hf_checkpoint(torch::nn::Module& model, const TrainSpec& spec, const std::string& folder) {
  hyper_parallel::load_hf_checkpoint(model, spec.family->hf_adapter(model), folder);
}

HfExportResult export_hf_checkpoint(const torch::nn::Module& model, const TrainSpec& spec, const std::string& folder,
                                    const HfExportOptions& options) {
  return hyper_parallel::export_hf_checkpoint(model, *spec.family, folder, options);
}

void register_train_spec(TrainSpec spec) {
  const ModelFamily& family = model_family(spec.name);  // a registered family's name, or the error listing them
  if (spec.family && spec.family != &family) {
    throw std::invalid_argument("register_train_spec('" + spec.name +
                                "'): TrainSpec::family is the registry entry of '" + spec.family->name + "', not of '" +
                                spec.name + "'");
  }
  spec.family = &family;
  const std::vector<std::pair<const char*, bool>> fields = {{"build", bool(spec.build)},
                                                            {"rebuild", bool(spec.rebuild)},
                                                            {"parallelize", bool(spec.parallelize)},
                                                            {"shard_groups", bool(spec.shard_groups)},
                                                            {"loss", bool(spec.loss)},
                                                            {"loss_terms", bool(spec.loss_terms)},
                                                            {"flops_per_token", bool(spec.flops_per_token)},
                                                            {"describe", bool(spec.describe)}};
  for (const auto& [field, set] : fields) {
    if (!set)
      throw std::invalid_argument("register_train_spec('" + spec.name + "'): TrainSpec::" + field +
                                  " is empty (default_train_spec gives every field)");
  }
  SpecTable& t = spec_table();
  std::lock_guard<std::mutex> lock(t.mutex);
  if (t.specs.count(spec.name)) {
    throw std::invalid_argument("register_train_spec: the spec of '" + spec.name +
                                "' is set already (registered, or taken by a job: register before the first job "
                                "that names it)");
  }
  const std::string name = spec.name;
  t.specs.emplace(name, std::move(spec));
}

}  // namespace hyper_parallel::train
