// The Llama family for the registry: the decoder model's fields (decoder_model.h) and
// Llama's readers and config.json writer; its state-dict adapter to and from the names of
// transformers' LlamaForCausalLM and what a block keeps for backward are the decoder's
// (decoder_plan.h) with Llama's blocks.
#include <torch/nn/module.h>

#include "hyper_parallel/models/decoder_plan.h"
#include "hyper_parallel/models/llama.h"
#include "hyper_parallel/models/model_registry.h"

namespace hyper_parallel {

HfAdapter llama_hf_adapter(const LlamaArgs& a) {
  return decoder_hf_adapter(llama_block_options(a), a.n_layers, a.tie_word_embeddings);
}

int64_t llama_block_activation_bytes(const LlamaArgs& a, const BlockActivationShape& shape) {
  return decoder_block_activation_bytes(llama_block_options(a), shape);
}

Llama as_llama(const torch::nn::Module& m) { return module_holder_of<Llama>(m, "Llama"); }

ModelFamily llama_family() {
  ModelFamily family = decoder_model_family("llama", "parallelize_llama");
  family.from_hf_config = [](const std::string& config) { return Llama(LlamaArgs::from_hf_config_file(config)).ptr(); };
  family.from_hf_config_json = [](const std::string& json, const std::string& source) {
    return Llama(LlamaArgs::from_hf_config_json(json, source)).ptr();
  };
  family.to_hf_config = [](const torch::nn::Module& m) { return as_llama(m)->args().to_hf_config_json(); };
  family.from_sizes = [](const DecoderSizes& s) { return Llama(LlamaArgs::from_sizes(s)).ptr(); };
  return family;
}

}  // namespace hyper_parallel
