// The Gemma 2 family for the registry, and its state-dict adapter to and from the names
// of transformers' Gemma2ForCausalLM.
#include <torch/nn/module.h>

#include "hyper_parallel/models/gemma2.h"
#include "hyper_parallel/models/model_registry.h"

namespace hyper_parallel {

HfAdapter gemma2_hf_adapter(const Gemma2Args& a) {
  HfAdapter m;
  // q/k rows are not permuted (rope_head_dim 0): our RoPE rotates halves, as transformers'.
  auto map = [&m](const std::string& ours, const std::string& hf) { m.push_back(HfTensorMapping{ours, hf, 0}); };
  map("tok_embeddings.weight", "model.embed_tokens.weight");
  for (int64_t i = 0; i < a.n_layers; ++i) {
    const std::string ours = "layers." + std::to_string(i) + ".", hf = "model.layers." + std::to_string(i) + ".";
    map(ours + "attention.wq.weight", hf + "self_attn.q_proj.weight");
    map(ours + "attention.wk.weight", hf + "self_attn.k_proj.weight");
    map(ours + "attention.wv.weight", hf + "self_attn.v_proj.weight");
    map(ours + "attention.wo.weight", hf + "self_attn.o_proj.weight");
    map(ours + "feed_forward.w1.weight", hf + "mlp.gate_proj.weight");
    map(ours + "feed_forward.w2.weight", hf + "mlp.down_proj.weight");
    map(ours + "feed_forward.w3.weight", hf + "mlp.up_proj.weight");
    map(ours + "attention_norm.weight", hf + "input_layernorm.weight");
    map(ours + "post_attention_norm.weight", hf + "post_attention_layernorm.weight");
    map(ours + "ffn_norm.weight", hf + "pre_feedforward_layernorm.weight");
    map(ours + "post_ffn_norm.weight", hf + "post_feedforward_layernorm.weight");
  }
  map("norm.weight", "model.norm.weight");
  if (!a.tie_word_embeddings) map("output.weight", "lm_head.weight");
  return m;
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
  };
}

}  // namespace hyper_parallel
