// The Gemma 2 family for the registry: the decoder model's fields (decoder_model.h) and
// Gemma 2's readers and config.json writer; its state-dict adapter to and from the names of
// transformers' Gemma2ForCausalLM and what a block keeps for backward are the decoder's
// (decoder_plan.h) with Gemma 2's blocks.
#include <torch/nn/module.h>

#include "hyper_parallel/models/decoder_plan.h"
#include "hyper_parallel/models/gemma2.h"
#include "hyper_parallel/models/model_registry.h"

namespace hyper_parallel {

HfAdapter gemma2_hf_adapter(const Gemma2Args& a) {
  // q/k rows are not permuted: our RoPE rotates halves, as transformers'.
  return decoder_hf_adapter(gemma2_block_options(a, 0), a.n_layers, a.tie_word_embeddings);
}

int64_t gemma2_block_activation_bytes(const Gemma2Args& a, const BlockActivationShape& shape) {
  return decoder_block_activation_bytes(gemma2_block_options(a, 0), shape);
}

Gemma2 as_gemma2(const torch::nn::Module& m) { return module_holder_of<Gemma2>(m, "Gemma2"); }

ModelFamily gemma2_family() {
  ModelFamily family = decoder_model_family("gemma2", "parallelize_gemma2");
  family.from_hf_config = [](const std::string& config) {
    return Gemma2(Gemma2Args::from_hf_config_file(config)).ptr();
  };
  family.from_hf_config_json = [](const std::string& json, const std::string& source) {
    return Gemma2(Gemma2Args::from_hf_config_json(json, source)).ptr();
  };
  family.to_hf_config = [](const torch::nn::Module& m) { return as_gemma2(m)->args().to_hf_config_json(); };
  // from_sizes stays null: soft-caps, windows and head_dim come from config.json only.
  return family;
}

}  // namespace hyper_parallel
