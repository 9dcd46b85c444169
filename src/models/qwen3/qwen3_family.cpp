// The Qwen3 family for the registry, and its adapter to transformers' Qwen3ForCausalLM.
#include <torch/nn/module.h>

#include "hyper_parallel/models/model_registry.h"
#include "hyper_parallel/models/qwen3.h"

namespace hyper_parallel {

HfAdapter qwen3_hf_adapter(const LlamaArgs& a) {
  HfAdapter m = llama_hf_adapter(a);  // transformers names Qwen3's other tensors as Llama's
  for (int64_t i = 0; i < a.n_layers; ++i) {
    const std::string ours = "layers." + std::to_string(i) + ".attention.";
    const std::string hf = "model.layers." + std::to_string(i) + ".self_attn.";
    m.push_back({ours + "q_norm.weight", hf + "q_norm.weight", a.resolved_head_dim()});
    m.push_back({ours + "k_norm.weight", hf + "k_norm.weight", a.resolved_head_dim()});
  }
  return m;
}

ModelFamily qwen3_family() {
  return {
      .name = "qwen3",
      .from_hf_config = [](const std::string& config) { return Llama(qwen3_args_from_hf_config_file(config)).ptr(); },
      .from_hf_config_json =
          [](const std::string& json, const std::string& source) {
            return Llama(qwen3_args_from_hf_config_json(json, source)).ptr();
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
            return llama_block_activation_bytes(as_llama(m)->args(), s);
          },
  };
}

}  // namespace hyper_parallel
