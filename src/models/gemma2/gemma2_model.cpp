#include <ATen/ATen.h>

#include <cmath>

#include "hyper_parallel/models/gemma2.h"
#include "hyper_parallel/models/decoder_stack.h"
#include "hyper_parallel/nn/parameters_on_meta.h"

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

Gemma2Impl::Gemma2Impl(const Gemma2Args& a) : args_(a) {
  TORCH_CHECK(a.n_heads % a.resolved_kv_heads() == 0, "Gemma2: n_heads ", a.n_heads,
              " must be a multiple of n_kv_heads ", a.resolved_kv_heads());
  TORCH_CHECK(a.resolved_head_dim() % 2 == 0, "Gemma2: head_dim ", a.resolved_head_dim(), " must be even for RoPE");
  TORCH_CHECK(a.layer_types.empty() || static_cast<int64_t>(a.layer_types.size()) == a.n_layers,
              "Gemma2: layer_types has ", a.layer_types.size(), " entries for ", a.n_layers, " layers");
  TORCH_CHECK(!a.pad_token_id || (*a.pad_token_id >= 0 && *a.pad_token_id < a.vocab_size), "Gemma2: pad_token_id ",
              a.pad_token_id.value_or(0), " is not a token of the vocabulary of ", a.vocab_size);
  tok_embeddings = register_module("tok_embeddings", new_embedding(a.vocab_size, a.dim));
  // Set after construction: Embedding's reset() would zero the row (init_weights does that).
  if (a.pad_token_id) tok_embeddings->options.padding_idx(*a.pad_token_id);
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < a.n_layers; ++i) layers->push_back(DecoderBlock(gemma2_block_options(a, i)));
  norm = register_module("norm", RMSNorm(a.dim, a.norm_eps, NormScale::one_plus_weight));
  output = register_module("output", new_linear(a.dim, a.vocab_size));
  if (a.tie_word_embeddings) tie_head();  // one parameter, as Llama's tied head (docs/hf_models.md)
  // transformers' tables: inverse frequencies and angles in float32.
  auto [cos, sin] = rope_tables({.head_dim = a.resolved_head_dim(),
                                 .theta = a.rope_theta,
                                 .max_seq_len = a.max_seq_len,
                                 .like_transformers = true});
  rope_cos_ = register_buffer("rope_cos", on_meta_when_everything_is(cos));
  rope_sin_ = register_buffer("rope_sin", on_meta_when_everything_is(sin));
}

at::Tensor Gemma2Impl::forward(const at::Tensor& tokens) { return parallel_forward(output, hidden_states(tokens)); }

at::Tensor Gemma2Impl::hidden_states(const at::Tensor& tokens) {
  TORCH_CHECK(tokens.dim() == 2 && tokens.size(1) <= args_.max_seq_len,
              "Gemma2: expected tokens [batch, seq] with seq <= ", args_.max_seq_len, ", got ", tokens.sizes());
  if (block_hooks_) block_hooks_->before_forward();
  at::Tensor h = parallel_forward(tok_embeddings, tokens);
  // transformers multiplies by sqrt(dim) as a tensor of the hidden dtype: the factor
  // rounded to that dtype (a bfloat16 model scales by 59.75 where sqrt(3584) = 59.87).
  h = h * at::scalar_tensor(std::sqrt(static_cast<double>(args_.dim)), h.scalar_type()).item<double>();
  h = run_decoder_blocks<DecoderBlockImpl>(layers, block_hooks_.get(), block_checkpointing_, h, rope_cos_, rope_sin_);
  return parallel_forward(norm, h);
}

DecoderSizes Gemma2Impl::sizes() const {
  DecoderSizes s = args_;
  s.n_kv_heads = args_.resolved_kv_heads();
  s.head_dim = args_.resolved_head_dim();
  return s;
}

int64_t Gemma2Impl::flops_per_token(int64_t seq_len) const {
  // Every layer's attention at the full seq_len, sliding ones included, as TorchTitan counts
  // its sliding-window family (gpt-oss): exact while seq_len <= sliding_window (4096 in every
  // Gemma 2), where a sliding layer reads as many keys as a full one; beyond it, an
  // over-count of the sliding layers' scores.
  return dense_decoder_flops_per_token(*this, tok_embeddings->weight, args_.tie_word_embeddings, args_.n_layers,
                                       args_.n_heads, args_.resolved_head_dim(), seq_len);
}

void Gemma2Impl::init_weights(uint64_t seed) {
  // Norms scale by 1 + weight; the padding token's embedding is zero, as transformers'.
  init_decoder_weights(*this, seed, args_.n_layers, /*norm_weight=*/0.0, "Gemma2",
                       [this](const std::string& name, at::Tensor& values) {
                         if (name == "tok_embeddings.weight" && args_.pad_token_id) values[*args_.pad_token_id].zero_();
                       });
}

void Gemma2Impl::tie_head() {
  TORCH_CHECK(args_.tie_word_embeddings, "Gemma2: tie_head on a model whose args do not tie the head");
  tie_head_to_embeddings(output, tok_embeddings);
}

}  // namespace hyper_parallel
