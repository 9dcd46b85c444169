// The Gemma 2 family for the registry: its state-dict adapter to and from the names of
// transformers' Gemma2ForCausalLM and what a block keeps for backward, both the decoder's
// (decoder_plan.h) with Gemma 2's blocks.
#include <torch/nn/module.h>

#include "hyper_parallel/models/decoder_plan.h"
#include "hyper_parallel/models/decoder_size_rules.h"
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

Gemma2 as_gemma2(const torch::nn::Module& m) {
  auto impl = std::dynamic_pointer_cast<Gemma2Impl>(const_cast<torch::nn::Module&>(m).shared_from_this());
  TORCH_CHECK(impl, "expected a Gemma2 module, got a ", m.name());
  return Gemma2(impl);
}

ModelFamily gemma2_family() {
  return {
      .name = "gemma2",
      .from_hf_config = [](const std::string& config) { return Gemma2(Gemma2Args::from_hf_config_file(config)).ptr(); },
      .from_hf_config_json =
          [](const std::string& json, const std::string& source) {
            return Gemma2(Gemma2Args::from_hf_config_json(json, source)).ptr();
          },
      .parallelize =
          [](torch::nn::Module& m, const DeviceMesh& mesh, bool loss_parallel, bool sequence_parallel) {
            Gemma2 model = as_gemma2(m);
            parallelize_gemma2(model, mesh, loss_parallel, sequence_parallel, /*src_data_rank=*/std::nullopt);
          },
      .hf_adapter = [](const torch::nn::Module& m) { return gemma2_hf_adapter(as_gemma2(m)->args()); },
      .to_hf_config = [](const torch::nn::Module& m) { return as_gemma2(m)->args().to_hf_config_json(); },
      .from_sizes = nullptr,  // soft-caps, windows and head_dim come from config.json only
      .block_activation_bytes =
          [](const torch::nn::Module& m, const BlockActivationShape& s) {
            return gemma2_block_activation_bytes(as_gemma2(m)->args(), s);
          },
      .size_errors = decoder_size_errors,
      .tp_size_errors = decoder_tp_size_errors,
  };
}

}  // namespace hyper_parallel
