#include "hyper_parallel/models/llama.h"

#include <ATen/ATen.h>

#include "hyper_parallel/models/decoder_stack.h"
#include "hyper_parallel/nn/parameters_on_meta.h"

namespace hyper_parallel {

DecoderBlockOptions llama_block_options(const LlamaArgs& a) {
  DecoderBlockOptions o;
  o.attention = {.dim = a.dim,
                 .n_heads = a.n_heads,
                 .n_kv_heads = a.resolved_kv_heads(),
                 .head_dim = a.resolved_head_dim(),
                 .rope_layout = RopeLayout::adjacent_pairs,
                 .qk_norm_eps = a.norm_eps};
  o.mlp = {.dim = a.dim, .hidden_dim = a.hidden_dim(), .activation = MlpActivation::silu};
  o.norm_eps = a.norm_eps;
  o.norm_scale = NormScale::weight;
  return o;
}

LlamaImpl::LlamaImpl(const LlamaArgs& a) : LlamaImpl(a, llama_block_options(a)) {}

LlamaImpl::LlamaImpl(const LlamaArgs& a, const DecoderBlockOptions& blocks) : args_(a), blocks_(blocks) {
  TORCH_CHECK(a.head_dim > 0 || a.dim % a.n_heads == 0, "Llama: dim ", a.dim, " must be divisible by n_heads ",
              a.n_heads, " (or head_dim given)");
  TORCH_CHECK(a.n_heads % a.resolved_kv_heads() == 0, "Llama: n_heads ", a.n_heads,
              " must be a multiple of n_kv_heads ", a.resolved_kv_heads());
  TORCH_CHECK(a.resolved_head_dim() % 2 == 0, "Llama: head_dim ", a.resolved_head_dim(), " must be even for RoPE");
  tok_embeddings = register_module("tok_embeddings", new_embedding(a.vocab_size, a.dim));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < a.n_layers; ++i) layers->push_back(DecoderBlock(blocks));
  norm = register_module("norm", RMSNorm(a.dim, a.norm_eps));
  output = register_module("output", new_linear(a.dim, a.vocab_size));
  // Tied: the head reads the embeddings' parameter and registers none of its own, so the
  // optimizer, clipping, master weights, checkpoints and the HF mapping see one tensor and
  // autograd sums the gradients of both uses into it. Module::to converts the parameter in
  // place (set_data), so the tie survives dtype and device moves; parallelize_llama points
  // the head at the sharded parameter.
  if (a.tie_word_embeddings) tie_head();
  auto [cos, sin] = llama_rope_tables(a);
  rope_cos_ = register_buffer("rope_cos", on_meta_when_everything_is(cos));
  rope_sin_ = register_buffer("rope_sin", on_meta_when_everything_is(sin));
}

at::Tensor LlamaImpl::forward(const at::Tensor& tokens) { return parallel_forward(output, hidden_states(tokens)); }

at::Tensor LlamaImpl::hidden_states(const at::Tensor& tokens) {
  TORCH_CHECK(tokens.dim() == 2 && tokens.size(1) <= args_.max_seq_len,
              "Llama: expected tokens [batch, seq] with seq <= ", args_.max_seq_len, ", got ", tokens.sizes());
  if (block_hooks_) block_hooks_->before_forward();
  at::Tensor h = parallel_forward(tok_embeddings, tokens);
  h = run_decoder_blocks<DecoderBlockImpl>(layers, block_hooks_.get(), block_checkpointing_, h, rope_cos_, rope_sin_);
  return parallel_forward(norm, h);
}

DecoderSizes LlamaImpl::sizes() const {
  DecoderSizes s = args_;
  s.n_kv_heads = args_.resolved_kv_heads();
  s.head_dim = args_.resolved_head_dim();
  s.ffn_hidden_dim = args_.hidden_dim();
  return s;
}

void LlamaImpl::init_weights(uint64_t seed) {
  init_decoder_weights(*this, seed, args_.n_layers, /*norm_weight=*/1.0, "Llama");
}

int64_t LlamaImpl::flops_per_token(int64_t seq_len) const {
  return dense_decoder_flops_per_token(*this, tok_embeddings->weight, args_.tie_word_embeddings, args_.n_layers,
                                       args_.n_heads, args_.resolved_head_dim(), seq_len);
}

void LlamaImpl::tie_head() {
  TORCH_CHECK(args_.tie_word_embeddings, "Llama: tie_head on a model whose args do not tie the head");
  tie_head_to_embeddings(output, tok_embeddings);
}

}  // namespace hyper_parallel
