// The Llama family for the registry: its state-dict adapter to and from the names of
// transformers' LlamaForCausalLM and what a block keeps for backward, both the decoder's
// (decoder_plan.h) with Llama's blocks.
#include <torch/nn/module.h>

#include "hyper_parallel/models/decoder_plan.h"
#include "hyper_parallel/models/decoder_size_rules.h"
#include "hyper_parallel/models/llama.h"
#include "hyper_parallel/models/model_registry.h"

namespace hyper_parallel {

HfAdapter llama_hf_adapter(const LlamaArgs& a) {
  return decoder_hf_adapter(llama_block_options(a), a.n_layers, a.tie_word_embeddings);
}

int64_t llama_block_activation_bytes(const LlamaArgs& a, const BlockActivationShape& shape) {
  return decoder_block_activation_bytes(llama_block_options(a), shape);
}

Llama as_llama(const torch::nn::Module& m) {
  auto impl = std::dynamic_pointer_cast<LlamaImpl>(const_cast<torch::nn::Module&>(m).shared_from_this());
  TORCH_CHECK(impl, "expected a Llama module, got a ", m.name());
  return Llama(impl);
}

ModelFamily llama_family() {
  return {
      .name = "llama",
      .from_hf_config = [](const std::string& config) { return Llama(LlamaArgs::from_hf_config_file(config)).ptr(); },
      .from_hf_config_json =
          [](const std::string& json, const std::string& source) {
            return Llama(LlamaArgs::from_hf_config_json(json, source)).ptr();
          },
      .parallelize =
          [](torch::nn::Module& m, const DeviceMesh& mesh, bool loss_parallel, bool sequence_parallel) {
            Llama model = as_llama(m);
            parallelize_llama(model, mesh, loss_parallel, sequence_parallel, /*src_data_rank=*/std::nullopt);
          },
      .hf_adapter = [](const torch::nn::Module& m) { return llama_hf_adapter(as_llama(m)->args()); },
      .to_hf_config = [](const torch::nn::Module& m) { return as_llama(m)->args().to_hf_config_json(); },
      .from_sizes = [](const DecoderSizes& s) { return Llama(LlamaArgs::from_sizes(s)).ptr(); },
      .block_activation_bytes =
          [](const torch::nn::Module& m, const BlockActivationShape& s) {
            return decoder_block_activation_bytes(as_llama(m)->block_options(), s);
          },
      .size_errors = decoder_size_errors,
      .tp_size_errors = decoder_tp_size_errors,
  };
}

}  // namespace hyper_parallel
