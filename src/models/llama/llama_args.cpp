// LlamaArgs: derived sizes, the RoPE tables' options, and reading a transformers LlamaConfig.
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <stdexcept>

#include "hyper_parallel/models/llama.h"
#include "models/hf_config_file.h"

namespace hyper_parallel {

int64_t LlamaArgs::hidden_dim() const {
  if (ffn_hidden_dim > 0) return ffn_hidden_dim;
  const int64_t h = 2 * (4 * dim) / 3;
  return multiple_of * ((h + multiple_of - 1) / multiple_of);
}

RopeTableOptions llama_rope_options(const LlamaArgs& a) {
  return {.head_dim = a.resolved_head_dim(),
          .theta = a.rope_theta,
          .max_seq_len = a.max_seq_len,
          .llama3_scaling = a.rope_scaling,
          .like_transformers = a.rope_tables_like_hf};
}

std::pair<at::Tensor, at::Tensor> llama_rope_tables(const LlamaArgs& a) { return rope_tables(llama_rope_options(a)); }

using nlohmann::json;

LlamaArgs LlamaArgs::from_sizes(const DecoderSizes& s) {
  LlamaArgs a;
  static_cast<DecoderSizes&>(a) = s;
  return a;
}

LlamaArgs LlamaArgs::from_hf_config_json(const std::string& text, const std::string& source,
                                         const std::string& family_model_type) {
  const json j = parse_hf_config_json(text, source);
  HfConfigReader r(j, source);
  const std::string model_type = r.get<std::string>("model_type", family_model_type);
  if (model_type != family_model_type) {
    r.refuse("model_type", model_type,
             "the " + family_model_type + " family reads model_type \"" + family_model_type + "\"");
  }

  LlamaArgs a;
  a.dim = r.get<int64_t>("hidden_size");
  a.n_layers = r.get<int64_t>("num_hidden_layers");
  a.n_heads = r.get<int64_t>("num_attention_heads");
  a.n_kv_heads = r.get<int64_t>("num_key_value_heads", a.n_heads);
  a.head_dim = r.get<int64_t>("head_dim", int64_t{0});
  a.vocab_size = r.get<int64_t>("vocab_size");
  a.ffn_hidden_dim = r.get<int64_t>("intermediate_size");
  a.norm_eps = r.get<double>("rms_norm_eps", 1e-6);  // transformers' LlamaConfig default
  a.max_seq_len = r.get<int64_t>("max_position_embeddings", int64_t{2048});
  a.tie_word_embeddings = r.get<bool>("tie_word_embeddings", false);
  a.rope_tables_like_hf = true;
  for (const char* key : {"hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                          "vocab_size", "intermediate_size", "max_position_embeddings"}) {
    if (r.has(j, key) && j.at(key).get<int64_t>() <= 0) r.refuse(key, j.at(key), "must be > 0");
  }
  if (a.n_heads % a.resolved_kv_heads() != 0) {
    r.refuse("num_key_value_heads", j.at("num_key_value_heads"),
             "must divide num_attention_heads = " + std::to_string(a.n_heads));
  }
  if (a.head_dim == 0 && a.dim % a.n_heads != 0) {
    r.fail("hidden_size", "= " + std::to_string(a.dim) + " is not divisible by num_attention_heads = " +
                              std::to_string(a.n_heads) + " and head_dim is not given");
  }
  if (a.resolved_head_dim() % 2 != 0)
    r.fail("head_dim", "= " + std::to_string(a.resolved_head_dim()) + " must be even for RoPE");

  // What the model cannot represent is refused, never ignored.
  const std::string act = r.get<std::string>("hidden_act", std::string("silu"));
  if (act != "silu") r.refuse("hidden_act", act, "the model's MLP is SwiGLU (silu)");
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    if (r.get<bool>(key, false)) r.refuse(key, true, "the model's projections have no bias");
  }
  if (r.has(j, "attention_dropout") && r.get<double>("attention_dropout") != 0.0) {
    r.refuse("attention_dropout", j.at("attention_dropout"), "the model has no attention dropout");
  }
  if (r.has(j, "pretraining_tp") && r.get<int64_t>("pretraining_tp") != 1) {
    r.refuse("pretraining_tp", j.at("pretraining_tp"), "only 1 (the plain projections) is supported");
  }

  const HfRope rope = read_hf_rope(r, j, 10000.0);
  a.rope_theta = rope.theta;
  if (rope.type == "llama3") {
    const json& q = *rope.parameters;
    const std::string& p = rope.prefix;
    Llama3RopeScaling s;
    s.factor = r.get<double>(q, p, "factor");
    s.low_freq_factor = r.get<double>(q, p, "low_freq_factor");
    s.high_freq_factor = r.get<double>(q, p, "high_freq_factor");
    s.original_max_position_embeddings = r.get<int64_t>(q, p, "original_max_position_embeddings");
    if (!(s.factor > 0) || !(s.low_freq_factor > 0) || !(s.high_freq_factor > s.low_freq_factor)) {
      r.refuse(rope.key, q, "llama3 scaling needs factor > 0 and high_freq_factor > low_freq_factor > 0");
    }
    a.rope_scaling = s;
  } else if (rope.type != "default") {
    r.refuse(rope.type_field, rope.type, "supported rope types: default, llama3");
  }
  if (!(a.norm_eps > 0)) r.refuse("rms_norm_eps", a.norm_eps, "must be > 0");
  return a;
}

LlamaArgs LlamaArgs::from_hf_config_file(const std::string& path) {
  return from_hf_config_json(read_hf_config_file(path), path);
}

std::string LlamaArgs::to_hf_config_json() const {
  json rope = {{"rope_type", rope_scaling ? "llama3" : "default"}, {"rope_theta", rope_theta}};
  if (rope_scaling) {
    rope["factor"] = rope_scaling->factor;
    rope["low_freq_factor"] = rope_scaling->low_freq_factor;
    rope["high_freq_factor"] = rope_scaling->high_freq_factor;
    rope["original_max_position_embeddings"] = rope_scaling->original_max_position_embeddings;
  }
  // Every field the model depends on is written, none left to LlamaConfig's defaults.
  const json j = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"hidden_size", dim},
      {"intermediate_size", hidden_dim()},
      {"num_hidden_layers", n_layers},
      {"num_attention_heads", n_heads},
      {"num_key_value_heads", resolved_kv_heads()},
      {"head_dim", resolved_head_dim()},
      {"rms_norm_eps", norm_eps},
      {"vocab_size", vocab_size},
      {"max_position_embeddings", max_seq_len},
      {"rope_parameters", rope},
      {"tie_word_embeddings", tie_word_embeddings},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"mlp_bias", false},
      {"attention_dropout", 0.0},
      {"pretraining_tp", 1},
      {"use_cache", true},
  };
  return j.dump(2);
}

}  // namespace hyper_parallel
