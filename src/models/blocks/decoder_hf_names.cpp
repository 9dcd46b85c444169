// Our decoder's parameter names against transformers' (HF_INTEROP.md's table), in the order
// the families' checkpoints have always been written.
#include <string>

#include "hyper_parallel/models/decoder_plan.h"

namespace hyper_parallel {

HfAdapter decoder_hf_adapter(const DecoderBlockOptions& block, int64_t n_layers, bool tie_word_embeddings) {
  // Rows in rotate-half order in the file, adjacent pairs in our module: permuted per head.
  const int64_t rope_rows =
      block.attention.rope_layout == RopeLayout::adjacent_pairs ? block.attention.head_dim : int64_t{0};
  HfAdapter m;
  auto map = [&m](const std::string& ours, const std::string& hf, int64_t rope_head_dim = 0) {
    m.push_back(HfTensorMapping{ours, hf, rope_head_dim});
  };
  map("tok_embeddings.weight", "model.embed_tokens.weight");
  for (int64_t i = 0; i < n_layers; ++i) {
    const std::string ours = "layers." + std::to_string(i) + ".", hf = "model.layers." + std::to_string(i) + ".";
    map(ours + "attention.wq.weight", hf + "self_attn.q_proj.weight", rope_rows);
    map(ours + "attention.wk.weight", hf + "self_attn.k_proj.weight", rope_rows);
    map(ours + "attention.wv.weight", hf + "self_attn.v_proj.weight");
    map(ours + "attention.wo.weight", hf + "self_attn.o_proj.weight");
    map(ours + "feed_forward.w1.weight", hf + "mlp.gate_proj.weight");
    map(ours + "feed_forward.w2.weight", hf + "mlp.down_proj.weight");
    map(ours + "feed_forward.w3.weight", hf + "mlp.up_proj.weight");
    map(ours + "attention_norm.weight", hf + "input_layernorm.weight");
    if (block.post_norms) {  // transformers' Gemma 2 names the norm after attention as Llama's before the MLP
      map(ours + "post_attention_norm.weight", hf + "post_attention_layernorm.weight");
      map(ours + "ffn_norm.weight", hf + "pre_feedforward_layernorm.weight");
      map(ours + "post_ffn_norm.weight", hf + "post_feedforward_layernorm.weight");
    } else {
      map(ours + "ffn_norm.weight", hf + "post_attention_layernorm.weight");
    }
  }
  map("norm.weight", "model.norm.weight");
  // Tied: the head is the embeddings' parameter (no output.weight; no lm_head.weight in the file).
  if (!tie_word_embeddings) map("output.weight", "lm_head.weight");
  if (block.attention.qk_norm) {
    // The norm scales each element of a head: permuted within the head like the q/k rows.
    for (int64_t i = 0; i < n_layers; ++i) {
      const std::string ours = "layers." + std::to_string(i) + ".attention.";
      const std::string hf = "model.layers." + std::to_string(i) + ".self_attn.";
      map(ours + "q_norm.weight", hf + "q_norm.weight", rope_rows);
      map(ours + "k_norm.weight", hf + "k_norm.weight", rope_rows);
    }
  }
  return m;
}

}  // namespace hyper_parallel
