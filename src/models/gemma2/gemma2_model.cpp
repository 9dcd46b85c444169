#include <ATen/ATen.h>

#include <cmath>

#include "hyper_parallel/models/gemma2.h"
#include "hyper_parallel/models/decoder_stack.h"
#include "hyper_parallel/models/rope.h"

namespace hyper_parallel {

DecoderBlockOptions gemma2_block_options(const Gemma2Args& a, int64_t layer) {
  DecoderBlockOptions o;
  o.attention = {.dim = a.dim,
                 .n_heads = a.n_heads,
                 .n_kv_heads = a.resolved_kv_heads(),
                 .head_dim = a.resolved_head_dim(),
                 .rope_layout = RopeLayout::rotate_half,
                 .score_scale = std::pow(static_cast<double>(a.query_pre_attn_scalar), -0.5),
                 .score_softcap = a.attn_logit_softcapping,
                 .sliding_window = a.attention_kind(layer) == Gemma2AttentionKind::sliding ? a.sliding_window : 0,
                 .softmax_in_float32 = true};
  o.mlp = {.dim = a.dim, .hidden_dim = a.ffn_hidden_dim, .activation = MlpActivation::gelu_tanh};
  o.norm_eps = a.norm_eps;
  o.norm_scale = NormScale::one_plus_weight;
  o.post_norms = true;
  return o;
}

namespace {

DecoderModelParts gemma2_model_parts(const Gemma2Args& a) {
  TORCH_CHECK(a.n_heads % a.resolved_kv_heads() == 0, "Gemma2: n_heads ", a.n_heads,
              " must be a multiple of n_kv_heads ", a.resolved_kv_heads());
  TORCH_CHECK(a.resolved_head_dim() % 2 == 0, "Gemma2: head_dim ", a.resolved_head_dim(), " must be even for RoPE");
  TORCH_CHECK(a.layer_types.empty() || static_cast<int64_t>(a.layer_types.size()) == a.n_layers,
              "Gemma2: layer_types has ", a.layer_types.size(), " entries for ", a.n_layers, " layers");
  TORCH_CHECK(!a.pad_token_id || (*a.pad_token_id >= 0 && *a.pad_token_id < a.vocab_size), "Gemma2: pad_token_id ",
              a.pad_token_id.value_or(0), " is not a token of the vocabulary of ", a.vocab_size);
  DecoderSizes sizes = a;
  sizes.n_kv_heads = a.resolved_kv_heads();
  sizes.head_dim = a.resolved_head_dim();
  return {.family = "Gemma2",
          .sizes = sizes,
          .blocks = [a](int64_t layer) { return gemma2_block_options(a, layer); },
          .norm_scale = NormScale::one_plus_weight,
          // transformers' tables: inverse frequencies and angles in float32.
          .rope_tables = rope_tables({.head_dim = a.resolved_head_dim(),
                                      .theta = a.rope_theta,
                                      .max_seq_len = a.max_seq_len,
                                      .like_transformers = true})};
}

}  // namespace

Gemma2Impl::Gemma2Impl(const Gemma2Args& a) : DecoderModelImpl(gemma2_model_parts(a)), args_(a) {
  // Set after construction: Embedding's reset() would zero the row (init_weights does that).
  if (a.pad_token_id) tok_embeddings->options.padding_idx(*a.pad_token_id);
}

at::Tensor Gemma2Impl::embed(const at::Tensor& h) const {
  // transformers multiplies by sqrt(dim) as a tensor of the hidden dtype: the factor
  // rounded to that dtype (a bfloat16 model scales by 59.75 where sqrt(3584) = 59.87).
  return h * at::scalar_tensor(std::sqrt(static_cast<double>(args_.dim)), h.scalar_type()).item<double>();
}

void Gemma2Impl::init_weights(uint64_t seed) {
  // Norms scale by 1 + weight; the padding token's embedding is zero, as transformers'.
  init_decoder_weights(*this, seed, args_.n_layers, /*norm_weight=*/0.0, "Gemma2",
                       [this](const std::string& name, at::Tensor& values) {
                         if (name == "tok_embeddings.weight" && args_.pad_token_id) values[*args_.pad_token_id].zero_();
                       });
}

}  // namespace hyper_parallel
