// The Llama family for the registry, and its state-dict adapter to and from the names of
// transformers' LlamaForCausalLM.
#include <torch/nn/module.h>

#include "hyper_parallel/models/llama.h"
#include "hyper_parallel/models/model_registry.h"

namespace hyper_parallel {

HfAdapter llama_hf_adapter(const LlamaArgs& a) {
  HfAdapter m;
  auto map = [&m](const std::string& ours, const std::string& hf, int64_t rope_head_dim = 0) {
    m.push_back(HfTensorMapping{ours, hf, rope_head_dim});
  };
  map("tok_embeddings.weight", "model.embed_tokens.weight");
  for (int64_t i = 0; i < a.n_layers; ++i) {
    const std::string ours = "layers." + std::to_string(i) + ".", hf = "model.layers." + std::to_string(i) + ".";
    map(ours + "attention.wq.weight", hf + "self_attn.q_proj.weight", a.resolved_head_dim());
    map(ours + "attention.wk.weight", hf + "self_attn.k_proj.weight", a.resolved_head_dim());
    map(ours + "attention.wv.weight", hf + "self_attn.v_proj.weight");
    map(ours + "attention.wo.weight", hf + "self_attn.o_proj.weight");
    map(ours + "feed_forward.w1.weight", hf + "mlp.gate_proj.weight");
    map(ours + "feed_forward.w2.weight", hf + "mlp.down_proj.weight");
    map(ours + "feed_forward.w3.weight", hf + "mlp.up_proj.weight");
    map(ours + "attention_norm.weight", hf + "input_layernorm.weight");
    map(ours + "ffn_norm.weight", hf + "post_attention_layernorm.weight");
  }
  map("norm.weight", "model.norm.weight");
  // Tied: the head is the embeddings' parameter (no output.weight; no lm_head.weight in the file).
  if (!a.tie_word_embeddings) map("output.weight", "lm_head.weight");
  return m;
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
            return llama_block_activation_bytes(as_llama(m)->args(), s);
          },
  };
}

}  // namespace hyper_parallel
