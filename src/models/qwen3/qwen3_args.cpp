// Reading a transformers Qwen3Config: Qwen3's own fields, then Llama's reader.
#include <nlohmann/json.hpp>

#include <stdexcept>

#include "hyper_parallel/models/qwen3.h"
#include "models/hf_config_file.h"

namespace hyper_parallel {

LlamaArgs qwen3_args_from_hf_config_json(const std::string& text, const std::string& source) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return LlamaArgs::from_hf_config_json(text, source, "qwen3");  // its error
  auto refuse = [&](const std::string& field, const nlohmann::json& value, const std::string& why) {
    throw std::runtime_error(source + ": " + field + " = " + value.dump() + ": " + why);
  };
  auto given = [&](const char* key) { return j.contains(key) && !j.at(key).is_null(); };
  if (given("use_sliding_window") && j.at("use_sliding_window") != false) {
    refuse("use_sliding_window", j.at("use_sliding_window"), "sliding-window attention is not implemented");
  }
  if (given("layer_types")) {
    const nlohmann::json& types = j.at("layer_types");
    if (!types.is_array()) refuse("layer_types", types, "expected a list");
    for (size_t i = 0; i < types.size(); ++i) {
      if (types[i] != "full_attention") {
        refuse("layer_types[" + std::to_string(i) + "]", types[i], "only full_attention is implemented");
      }
    }
  }
  // Qwen3Config's defaults where they differ from LlamaConfig's.
  if (!given("head_dim")) j["head_dim"] = 128;
  if (!given("max_position_embeddings")) j["max_position_embeddings"] = 32768;
  return LlamaArgs::from_hf_config_json(j.dump(), source, "qwen3");
}

std::string qwen3_hf_config_json(const LlamaArgs& a) {
  nlohmann::json j = nlohmann::json::parse(a.to_hf_config_json());
  j["architectures"] = {"Qwen3ForCausalLM"};
  j["model_type"] = "qwen3";
  j["use_sliding_window"] = false;
  j.erase("mlp_bias");  // LlamaConfig's fields that Qwen3Config does not have
  j.erase("pretraining_tp");
  return j.dump(2);
}

LlamaArgs qwen3_args_from_hf_config_file(const std::string& path) {
  return qwen3_args_from_hf_config_json(read_hf_config_file(path), path);
}

}  // namespace hyper_parallel
