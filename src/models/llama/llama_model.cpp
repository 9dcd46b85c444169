#include "hyper_parallel/models/llama.h"

#include <ATen/ATen.h>
#include <torch/nn/functional/activation.h>

#include <cmath>
#include <initializer_list>
#include <optional>

#include "hyper_parallel/nn/parameters_on_meta.h"
#include "models/decoder_blocks.h"
#include "models/module_input.h"

namespace hyper_parallel {

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  // Real under ParametersOnMeta (unless MetaScope::Everything): dim elements, and TP leaves norms as plain tensors,
  // which materialize_parameters cannot turn from meta in place.
  weight = register_parameter("weight", on_meta_when_everything_is(at::ones({dim})));
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  // Reduced precision is normalised in fp32; fp64 stays fp64 (a float64 reference
  // would otherwise lose its precision here).
  at::Tensor xf = at::isReducedFloatingType(x.scalar_type()) ? x.to(at::kFloat) : x;
  at::Tensor normed = xf * at::rsqrt(xf.pow(2).mean({-1}, /*keepdim=*/true) + eps_);
  return normed.to(x.scalar_type()) * weight;
}

namespace {

// Rotary embedding on [batch, seq, heads, head_dim] with pairs (2i, 2i+1).
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t s = x.size(1);
  at::Tensor c = cos.narrow(0, 0, s).view({1, s, 1, -1}).to(x.scalar_type());
  at::Tensor n = sin.narrow(0, 0, s).view({1, s, 1, -1}).to(x.scalar_type());
  at::Tensor pairs = x.unflatten(-1, {-1, 2});
  at::Tensor even = pairs.select(-1, 0), odd = pairs.select(-1, 1);
  return at::stack({even * c - odd * n, even * n + odd * c}, -1).flatten(-2);
}

}  // namespace

AttentionImpl::AttentionImpl(const LlamaArgs& a)
    : head_dim_(a.resolved_head_dim()), group_(a.n_heads / a.resolved_kv_heads()) {
  auto make = [&](const char* name, int64_t in, int64_t out) { return register_module(name, new_linear(in, out)); };
  wq = make("wq", a.dim, a.n_heads * a.resolved_head_dim());
  wk = make("wk", a.dim, a.resolved_kv_heads() * a.resolved_head_dim());
  wv = make("wv", a.dim, a.resolved_kv_heads() * a.resolved_head_dim());
  wo = make("wo", a.n_heads * a.resolved_head_dim(), a.dim);
  if (a.qk_norm) {
    q_norm = register_module("q_norm", RMSNorm(a.resolved_head_dim(), a.norm_eps));
    k_norm = register_module("k_norm", RMSNorm(a.resolved_head_dim(), a.norm_eps));
  }
}

at::Tensor AttentionImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t b = x.size(0), s = x.size(1);
  // Under TP each rank sees only its own heads: -1 heads.
  auto heads = [&](const at::Tensor& t) { return t.view({b, s, -1, head_dim_}); };
  const at::Tensor in = shared_input(x, {wq.get(), wk.get(), wv.get()});
  at::Tensor q = heads(parallel_forward(wq, in)), k = heads(parallel_forward(wk, in));
  if (q_norm) {  // each head normalised over head_dim, before RoPE (Qwen3)
    q = parallel_forward(q_norm, q);
    k = parallel_forward(k_norm, k);
  }
  q = apply_rope(q, cos, sin).transpose(1, 2);
  k = apply_rope(k, cos, sin).transpose(1, 2);
  at::Tensor v = heads(parallel_forward(wv, in)).transpose(1, 2);
  if (group_ > 1) {
    // Grouped-query attention: query head h reads key/value head h / group_, as
    // transformers' repeat_kv (under TP the local query heads read the local kv heads).
    k = k.repeat_interleave(group_, 1);
    v = v.repeat_interleave(group_, 1);
  }
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim_));
  at::Tensor causal = at::ones({s, s}, at::TensorOptions().dtype(at::kBool).device(x.device())).triu(1);
  at::Tensor p = at::softmax(scores.masked_fill(causal, -std::numeric_limits<double>::infinity()), -1);
  at::Tensor out = at::matmul(p, v).transpose(1, 2).reshape({b, s, -1});
  return parallel_forward(wo, out);
}

FeedForwardImpl::FeedForwardImpl(const LlamaArgs& a) {
  const int64_t h = a.hidden_dim();
  w1 = register_module("w1", new_linear(a.dim, h));
  w2 = register_module("w2", new_linear(h, a.dim));
  w3 = register_module("w3", new_linear(a.dim, h));
}

at::Tensor FeedForwardImpl::forward(const at::Tensor& x) {
  const at::Tensor in = shared_input(x, {w1.get(), w3.get()});
  return parallel_forward(w2, at::silu(parallel_forward(w1, in)) * parallel_forward(w3, in));
}

TransformerBlockImpl::TransformerBlockImpl(const LlamaArgs& a) {
  attention_norm = register_module("attention_norm", RMSNorm(a.dim, a.norm_eps));
  attention = register_module("attention", Attention(a));
  ffn_norm = register_module("ffn_norm", RMSNorm(a.dim, a.norm_eps));
  feed_forward = register_module("feed_forward", FeedForward(a));
}

at::Tensor TransformerBlockImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  // Norms through parallel_forward: under sequence parallel they are SequenceParallel and
  // x, h are Shard(1) DTensors (the residual adds stay local to each sequence piece).
  at::Tensor h = x + attention->forward(module_input(*attention, parallel_forward(attention_norm, x)), cos, sin);
  return h + feed_forward->forward(module_input(*feed_forward, parallel_forward(ffn_norm, h)));
}

LlamaImpl::LlamaImpl(const LlamaArgs& a) : args_(a) {
  TORCH_CHECK(a.head_dim > 0 || a.dim % a.n_heads == 0, "Llama: dim ", a.dim, " must be divisible by n_heads ",
              a.n_heads, " (or head_dim given)");
  TORCH_CHECK(a.n_heads % a.resolved_kv_heads() == 0, "Llama: n_heads ", a.n_heads,
              " must be a multiple of n_kv_heads ", a.resolved_kv_heads());
  TORCH_CHECK(a.resolved_head_dim() % 2 == 0, "Llama: head_dim ", a.resolved_head_dim(), " must be even for RoPE");
  tok_embeddings = register_module("tok_embeddings", new_embedding(a.vocab_size, a.dim));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < a.n_layers; ++i) layers->push_back(TransformerBlock(a));
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
  h = run_decoder_blocks<TransformerBlockImpl>(layers, block_hooks_.get(), block_checkpointing_, h, rope_cos_,
                                               rope_sin_);
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
