#include "train/config/job_model.h"

#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "compat/file_system.h"
#include "hyper_parallel/model_registry.h"

namespace hyper_parallel::train {

namespace {

template <class T>
std::string text(T v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// [model]'s size fields against the config's: returns the config's value, or records why not.
template <class T>
void take(T& field, T from_config, T default_value, const char* key, const char* hf_key, const std::string& config,
          std::vector<std::string>& conflicts) {
  if (field != default_value && field != from_config) {
    conflicts.push_back("model." + std::string(key) + " = " + text(field) + " but " + config + " has " + hf_key +
                        " = " + text(from_config));
  }
  field = from_config;
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

Llama make_job_model(ModelConfig& m) {
  if (m.hf_assets_path.empty()) {
    // Sizes from the TOML build a Llama; another family (qwen3: q/k norms) comes from its
    // config.json, never silently as a Llama.
    if (m.name != "llama") {
      throw std::invalid_argument("model.name = \"" + m.name + "\" needs model.hf_assets_path (its config.json); " +
                                  "sizes from [model] build the llama family only");
    }
    return Llama(llama_args(m));
  }
  const ModelFamily& family = model_family(m.name);
  const std::string config = compat::join_path(m.hf_assets_path, "config.json");
  if (!compat::path_exists(config)) {
    throw std::invalid_argument("model.hf_assets_path = \"" + m.hf_assets_path + "\": no config.json there (" + config +
                                ")");
  }
  auto impl = std::dynamic_pointer_cast<LlamaImpl>(family.from_hf_config(config));
  // The Trainer's loop reads the Llama's head and hidden states (token_loss_sum).
  if (!impl) throw std::invalid_argument("model.name = \"" + m.name + "\": hp-train trains Llama-shaped models only");
  Llama model(impl);
  const LlamaArgs& a = model->args();
  const ModelConfig d;
  std::vector<std::string> conflicts;
  take(m.dim, a.dim, d.dim, "dim", "hidden_size", config, conflicts);
  take(m.n_layers, a.n_layers, d.n_layers, "n_layers", "num_hidden_layers", config, conflicts);
  take(m.n_heads, a.n_heads, d.n_heads, "n_heads", "num_attention_heads", config, conflicts);
  take(m.vocab_size, a.vocab_size, d.vocab_size, "vocab_size", "vocab_size", config, conflicts);
  take(m.ffn_hidden_dim, a.hidden_dim(), d.ffn_hidden_dim, "ffn_hidden_dim", "intermediate_size", config, conflicts);
  take(m.norm_eps, a.norm_eps, d.norm_eps, "norm_eps", "rms_norm_eps", config, conflicts);
  take(m.rope_theta, a.rope_theta, d.rope_theta, "rope_theta", "rope_theta", config, conflicts);
  take(m.max_seq_len, a.max_seq_len, d.max_seq_len, "max_seq_len", "max_position_embeddings", config, conflicts);
  if (!conflicts.empty()) {
    std::string list;
    for (const auto& c : conflicts) list += (list.empty() ? "" : "; ") + c;
    throw std::invalid_argument("model.hf_assets_path: the model's sizes come from its config.json: " + list +
                                "; leave those keys unset (or set them to the config's values)");
  }
  m.hf_sizes_applied = true;
  return model;
}

}  // namespace hyper_parallel::train
