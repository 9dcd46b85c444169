// Gemma2Args: the layer pattern, and reading and writing a transformers Gemma2Config.
#include <nlohmann/json.hpp>

#include <stdexcept>

#include "hyper_parallel/models/gemma2.h"
#include "models/hf_config_file.h"

namespace hyper_parallel {

Gemma2Args::Gemma2Args() {
  dim = 2304;  // hidden_size
  n_layers = 26;
  n_heads = 8;
  n_kv_heads = 4;
  head_dim = 256;
  vocab_size = 256000;
  ffn_hidden_dim = 9216;  // intermediate_size
  max_seq_len = 8192;     // max_position_embeddings: the RoPE tables' length
  norm_eps = 1e-6;
  rope_theta = 10000.0;
  tie_word_embeddings = true;
}

Gemma2AttentionKind Gemma2Args::attention_kind(int64_t layer) const {
  if (layer_types.empty()) return layer % 2 == 0 ? Gemma2AttentionKind::sliding : Gemma2AttentionKind::full;
  return layer_types.at(layer);
}

Gemma2Args Gemma2Args::from_hf_config_json(const std::string& text, const std::string& source) {
  using json = nlohmann::json;
  const json j = parse_hf_config_json(text, source);
  HfConfigReader r(j, source);
  const std::string model_type = r.get<std::string>("model_type", std::string("gemma2"));
  if (model_type != "gemma2") r.refuse("model_type", model_type, "the gemma2 family reads model_type \"gemma2\"");

  Gemma2Args a;  // Gemma2Config's defaults where a field is absent
  a.dim = r.get<int64_t>("hidden_size", a.dim);
  a.n_layers = r.get<int64_t>("num_hidden_layers", a.n_layers);
  a.n_heads = r.get<int64_t>("num_attention_heads", a.n_heads);
  a.n_kv_heads = r.get<int64_t>("num_key_value_heads", a.n_kv_heads);
  a.head_dim = r.get<int64_t>("head_dim", a.head_dim);
  a.vocab_size = r.get<int64_t>("vocab_size", a.vocab_size);
  a.ffn_hidden_dim = r.get<int64_t>("intermediate_size", a.ffn_hidden_dim);
  a.max_seq_len = r.get<int64_t>("max_position_embeddings", a.max_seq_len);
  a.norm_eps = r.get<double>("rms_norm_eps", a.norm_eps);
  a.tie_word_embeddings = r.get<bool>("tie_word_embeddings", a.tie_word_embeddings);
  for (const char* key : {"hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                          "vocab_size", "intermediate_size", "max_position_embeddings"}) {
    if (r.has(j, key) && j.at(key).get<int64_t>() <= 0) r.refuse(key, j.at(key), "must be > 0");
  }
  if (a.n_heads % a.n_kv_heads != 0) {
    r.refuse("num_key_value_heads", a.n_kv_heads, "must divide num_attention_heads = " + std::to_string(a.n_heads));
  }
  // transformers refuses this too (Gemma2Config.validate_architecture), head_dim notwithstanding.
  if (a.dim % a.n_heads != 0) {
    r.refuse("hidden_size", a.dim, "must be a multiple of num_attention_heads = " + std::to_string(a.n_heads));
  }
  if (a.head_dim % 2 != 0) r.refuse("head_dim", a.head_dim, "must be even for RoPE");
  if (!(a.norm_eps > 0)) r.refuse("rms_norm_eps", a.norm_eps, "must be > 0");

  // Integers, as transformers' strict Gemma2Config has them.
  a.query_pre_attn_scalar = r.get<int64_t>("query_pre_attn_scalar", a.query_pre_attn_scalar);
  if (a.query_pre_attn_scalar <= 0) r.refuse("query_pre_attn_scalar", a.query_pre_attn_scalar, "must be > 0");
  if (j.contains("sliding_window") && j.at("sliding_window").is_null()) {
    r.refuse("sliding_window", nullptr,
             "transformers' Gemma 2 builds the sliding-window mask whatever the layers are, and fails without one");
  }
  a.sliding_window = r.get<int64_t>("sliding_window", a.sliding_window);
  if (a.sliding_window <= 0) r.refuse("sliding_window", a.sliding_window, "must be > 0");
  // null: no soft-capping; 0 would divide by zero in transformers.
  for (auto [key, cap] : {std::pair{"attn_logit_softcapping", &a.attn_logit_softcapping},
                          std::pair{"final_logit_softcapping", &a.final_logit_softcapping}}) {
    if (j.contains(key) && j.at(key).is_null()) {
      *cap = 0.0;
    } else {
      *cap = r.get<double>(key, *cap);
      if (!(*cap > 0)) r.refuse(key, j.at(key), "must be > 0 (or null: no soft-capping)");
    }
  }
  if (r.has(j, "layer_types")) {
    const json& types = j.at("layer_types");
    if (!types.is_array()) r.refuse("layer_types", types, "expected a list");
    if (static_cast<int64_t>(types.size()) != a.n_layers) {
      r.refuse("layer_types", types, "expected num_hidden_layers = " + std::to_string(a.n_layers) + " entries");
    }
    for (size_t i = 0; i < types.size(); ++i) {
      if (types[i] == "full_attention") {
        a.layer_types.push_back(Gemma2AttentionKind::full);
      } else if (types[i] == "sliding_attention") {
        a.layer_types.push_back(Gemma2AttentionKind::sliding);
      } else {
        r.refuse("layer_types[" + std::to_string(i) + "]", types[i],
                 "supported: \"full_attention\", \"sliding_attention\"");
      }
    }
  } else {
    const Gemma2Args pattern;  // no layer_types: transformers' default pattern
    for (int64_t i = 0; i < a.n_layers; ++i) a.layer_types.push_back(pattern.attention_kind(i));
  }
  if (j.contains("pad_token_id") && j.at("pad_token_id").is_null()) {
    a.pad_token_id.reset();
  } else {
    a.pad_token_id = r.get<int64_t>("pad_token_id", a.pad_token_id);
    if (*a.pad_token_id < 0 || *a.pad_token_id >= a.vocab_size) {
      r.refuse("pad_token_id", *a.pad_token_id, "must be in [0, vocab_size = " + std::to_string(a.vocab_size) + ")");
    }
  }

  // What the model cannot represent is refused, never ignored. (hidden_act is not read:
  // transformers' Gemma 2 reads hidden_activation only.)
  const std::string act = r.get<std::string>("hidden_activation", std::string("gelu_pytorch_tanh"));
  if (act != "gelu_pytorch_tanh") {
    r.refuse("hidden_activation", act, "the model's MLP is GeGLU with gelu_pytorch_tanh");
  }
  if (r.get<bool>("attention_bias", false)) r.refuse("attention_bias", true, "the model's projections have no bias");
  if (r.has(j, "attention_dropout") && r.get<double>("attention_dropout") != 0.0) {
    r.refuse("attention_dropout", j.at("attention_dropout"), "the model has no attention dropout");
  }
  if (r.get<bool>("use_bidirectional_attention", false)) {
    r.refuse("use_bidirectional_attention", true, "the model's attention is causal");
  }

  const HfRope rope = read_hf_rope(r, j, a.rope_theta);
  a.rope_theta = rope.theta;
  if (rope.type != "default") r.refuse(rope.type_field, rope.type, "the only supported rope type is default");
  return a;
}

Gemma2Args Gemma2Args::from_hf_config_file(const std::string& path) {
  return from_hf_config_json(read_hf_config_file(path), path);
}

std::string Gemma2Args::to_hf_config_json() const {
  using json = nlohmann::json;
  auto cap = [](double c) { return c > 0 ? json(c) : json(nullptr); };
  json types = json::array();
  for (int64_t i = 0; i < n_layers; ++i) {
    types.push_back(attention_kind(i) == Gemma2AttentionKind::sliding ? "sliding_attention" : "full_attention");
  }
  // Every field the model depends on is written, none left to Gemma2Config's defaults.
  const json j = {
      {"architectures", {"Gemma2ForCausalLM"}},
      {"model_type", "gemma2"},
      {"hidden_size", dim},
      {"intermediate_size", ffn_hidden_dim},
      {"num_hidden_layers", n_layers},
      {"num_attention_heads", n_heads},
      {"num_key_value_heads", n_kv_heads},
      {"head_dim", head_dim},
      {"rms_norm_eps", norm_eps},
      {"vocab_size", vocab_size},
      {"max_position_embeddings", max_seq_len},
      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", rope_theta}}},
      {"query_pre_attn_scalar", query_pre_attn_scalar},
      {"attn_logit_softcapping", cap(attn_logit_softcapping)},
      {"final_logit_softcapping", cap(final_logit_softcapping)},
      {"sliding_window", sliding_window},
      {"layer_types", types},
      {"pad_token_id", pad_token_id ? json(*pad_token_id) : json(nullptr)},
      {"tie_word_embeddings", tie_word_embeddings},
      {"hidden_activation", "gelu_pytorch_tanh"},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"use_bidirectional_attention", false},
      {"use_cache", true},
  };
  return j.dump(2);
}

}  // namespace hyper_parallel
