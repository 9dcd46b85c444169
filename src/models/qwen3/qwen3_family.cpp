// The Qwen3 family for the registry, and its adapter to transformers' Qwen3ForCausalLM.
#include <torch/nn/module.h>

#include "hyper_parallel/models/decoder_plan.h"
#include "hyper_parallel/models/decoder_size_rules.h"
#include "hyper_parallel/models/model_registry.h"
#include "hyper_parallel/models/qwen3.h"

namespace hyper_parallel {

HfAdapter qwen3_hf_adapter(const LlamaArgs& a) {
  return decoder_hf_adapter(qwen3_block_options(a), a.n_layers, a.tie_word_embeddings);
}

ModelFamily qwen3_family() {
  return {
      .name = "qwen3",
      .from_hf_config =
          [](const std::string& config) { return qwen3_model(qwen3_args_from_hf_config_file(config)).ptr(); },
      .from_hf_config_json =
          [](const std::string& json, const std::string& source) {
            return qwen3_model(qwen3_args_from_hf_config_json(json, source)).ptr();
          },
      .parallelize =
          [](torch::nn::Module& m, const DeviceMesh& mesh, bool loss_parallel, bool sequence_parallel) {
            Llama model = as_llama(m);
            parallelize_qwen3(model, mesh, loss_parallel, sequence_parallel, /*src_data_rank=*/std::nullopt);
          },
      .hf_adapter = [](const torch::nn::Module& m) { return qwen3_hf_adapter(as_llama(m)->args()); },
      .to_hf_config = [](const torch::nn::Module& m) { return qwen3_hf_config_json(as_llama(m)->args()); },
      .from_sizes = nullptr,  // the q/k norms and head_dim come from config.json only
      .block_activation_bytes =
          [](const torch::nn::Module& m, const BlockActivationShape& s) {
            return decoder_block_activation_bytes(as_llama(m)->block_options(), s);
          },
      .size_errors = decoder_size_errors,
      .tp_size_errors = decoder_tp_size_errors,
  };
}

}  // namespace hyper_parallel
