// The Qwen3 family for the registry: the decoder model's fields (decoder_model.h) and
// Qwen3's readers and config.json writer; its adapter to transformers' Qwen3ForCausalLM is
// the decoder's with Qwen3's blocks.
#include <torch/nn/module.h>

#include "hyper_parallel/models/decoder_plan.h"
#include "hyper_parallel/models/model_registry.h"
#include "hyper_parallel/models/qwen3.h"

namespace hyper_parallel {

HfAdapter qwen3_hf_adapter(const LlamaArgs& a) {
  return decoder_hf_adapter(qwen3_block_options(a), a.n_layers, a.tie_word_embeddings);
}

Qwen3 as_qwen3(const torch::nn::Module& m) { return module_holder_of<Qwen3>(m, "Qwen3"); }

ModelFamily qwen3_family() {
  ModelFamily family = decoder_model_family("qwen3", "parallelize_qwen3");
  family.from_hf_config = [](const std::string& config) { return Qwen3(qwen3_args_from_hf_config_file(config)).ptr(); };
  family.from_hf_config_json = [](const std::string& json, const std::string& source) {
    return Qwen3(qwen3_args_from_hf_config_json(json, source)).ptr();
  };
  family.to_hf_config = [](const torch::nn::Module& m) { return qwen3_hf_config_json(as_qwen3(m)->args()); };
  // from_sizes stays null: the q/k norms and head_dim come from config.json only.
  return family;
}

}  // namespace hyper_parallel
