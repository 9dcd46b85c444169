#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "hyper_parallel/models/gemma2.h"
#include "hyper_parallel/models/llama.h"
#include "hyper_parallel/nn/parameters_on_meta.h"
#include "models/decoder_blocks.h"
#include "models/module_input.h"

namespace hyper_parallel {

Gemma2RMSNormImpl::Gemma2RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  // Real even under ParametersOnMeta (dim elements; TP leaves norms unsharded), like Llama's.
  weight = register_parameter("weight", on_meta_when_everything_is(at::zeros({dim})));
}

at::Tensor Gemma2RMSNormImpl::forward(const at::Tensor& x) {
  // transformers scales by (1 + weight) in float32 and casts after; the float64 reference
  // keeps float64 throughout.
  const bool reduced = at::isReducedFloatingType(x.scalar_type());
  const at::Tensor xf = reduced ? x.to(at::kFloat) : x;
  const at::Tensor w = reduced ? weight.to(at::kFloat) : weight;
  const at::Tensor normed = xf * at::rsqrt(xf.pow(2).mean({-1}, /*keepdim=*/true) + eps_);
  return (normed * (w + 1.0)).to(x.scalar_type());
}

namespace {

// Rotary embedding on [batch, seq, heads, head_dim] in transformers' layout: element i
// pairs with i + head_dim / 2 (x * cos + rotate_half(x) * sin).
at::Tensor rope_rotate_half(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t s = x.size(1);
  auto table = [&](const at::Tensor& t) {
    const at::Tensor rows = t.narrow(0, 0, s);
    return at::cat({rows, rows}, -1).view({1, s, 1, -1}).to(x.scalar_type());
  };
  const at::Tensor halves = x.unflatten(-1, {2, -1});
  const at::Tensor rotated = at::cat({-halves.select(-2, 1), halves.select(-2, 0)}, -1);
  return x * table(cos) + rotated * table(sin);
}

// true where query q may not read key k: the future, and under a window w keys k <= q - w.
at::Tensor hidden_keys(int64_t s, int64_t window, at::Device device) {
  const at::Tensor q = at::arange(s, at::TensorOptions().dtype(at::kLong).device(device)).unsqueeze(1);
  const at::Tensor k = q.view({1, s});
  const at::Tensor future = k > q;
  return window > 0 ? at::logical_or(future, k <= q - window) : future;
}

}  // namespace

Gemma2AttentionImpl::Gemma2AttentionImpl(const Gemma2Args& a, int64_t layer)
    : head_dim_(a.resolved_head_dim()),
      group_(a.n_heads / a.resolved_kv_heads()),
      scaling_(std::pow(static_cast<double>(a.query_pre_attn_scalar), -0.5)),
      softcap_(a.attn_logit_softcapping),
      window_(a.attention_kind(layer) == Gemma2AttentionKind::sliding ? a.sliding_window : 0) {
  auto make = [&](const char* name, int64_t in, int64_t out) { return register_module(name, new_linear(in, out)); };
  wq = make("wq", a.dim, a.n_heads * a.resolved_head_dim());
  wk = make("wk", a.dim, a.resolved_kv_heads() * a.resolved_head_dim());
  wv = make("wv", a.dim, a.resolved_kv_heads() * a.resolved_head_dim());
  wo = make("wo", a.n_heads * a.resolved_head_dim(), a.dim);
}

at::Tensor Gemma2AttentionImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t b = x.size(0), s = x.size(1);
  // Under TP each rank sees only its own heads: -1 heads.
  auto heads = [&](const at::Tensor& t) { return t.view({b, s, -1, head_dim_}); };
  const at::Tensor in = shared_input(x, {wq.get(), wk.get(), wv.get()});
  at::Tensor q = rope_rotate_half(heads(parallel_forward(wq, in)), cos, sin).transpose(1, 2);
  at::Tensor k = rope_rotate_half(heads(parallel_forward(wk, in)), cos, sin).transpose(1, 2);
  at::Tensor v = heads(parallel_forward(wv, in)).transpose(1, 2);
  if (group_ > 1) {  // query head h reads key/value head h / group_ (transformers' repeat_kv)
    k = k.repeat_interleave(group_, 1);
    v = v.repeat_interleave(group_, 1);
  }
  // Scaled, then soft-capped, then masked, as transformers' eager attention.
  const at::Tensor scores = soft_cap(at::matmul(q, k.transpose(-2, -1)) * scaling_, softcap_);
  const at::Tensor masked =
      scores.masked_fill(hidden_keys(s, window_, x.device()), -std::numeric_limits<double>::infinity());
  // Reduced precision: the softmax in float32, as transformers.
  const bool reduced = at::isReducedFloatingType(x.scalar_type());
  const at::Tensor p = reduced ? at::softmax(masked, -1, at::kFloat).to(x.scalar_type()) : at::softmax(masked, -1);
  return parallel_forward(wo, at::matmul(p, v).transpose(1, 2).reshape({b, s, -1}));
}

Gemma2FeedForwardImpl::Gemma2FeedForwardImpl(const Gemma2Args& a) {
  w1 = register_module("w1", new_linear(a.dim, a.ffn_hidden_dim));
  w2 = register_module("w2", new_linear(a.ffn_hidden_dim, a.dim));
  w3 = register_module("w3", new_linear(a.dim, a.ffn_hidden_dim));
}

at::Tensor Gemma2FeedForwardImpl::forward(const at::Tensor& x) {
  const at::Tensor in = shared_input(x, {w1.get(), w3.get()});
  return parallel_forward(w2, at::gelu(parallel_forward(w1, in), "tanh") * parallel_forward(w3, in));
}

Gemma2BlockImpl::Gemma2BlockImpl(const Gemma2Args& a, int64_t layer) {
  attention_norm = register_module("attention_norm", Gemma2RMSNorm(a.dim, a.norm_eps));
  attention = register_module("attention", Gemma2Attention(a, layer));
  post_attention_norm = register_module("post_attention_norm", Gemma2RMSNorm(a.dim, a.norm_eps));
  ffn_norm = register_module("ffn_norm", Gemma2RMSNorm(a.dim, a.norm_eps));
  feed_forward = register_module("feed_forward", Gemma2FeedForward(a));
  post_ffn_norm = register_module("post_ffn_norm", Gemma2RMSNorm(a.dim, a.norm_eps));
}

at::Tensor Gemma2BlockImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  // Norms through parallel_forward: under sequence parallel they are SequenceParallel and
  // the residual stream is a Shard(1) DTensor.
  const at::Tensor attended =
      attention->forward(module_input(*attention, parallel_forward(attention_norm, x)), cos, sin);
  const at::Tensor h = x + parallel_forward(post_attention_norm, attended);
  const at::Tensor mlp = feed_forward->forward(module_input(*feed_forward, parallel_forward(ffn_norm, h)));
  return h + parallel_forward(post_ffn_norm, mlp);
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
  for (int64_t i = 0; i < a.n_layers; ++i) layers->push_back(Gemma2Block(a, i));
  norm = register_module("norm", Gemma2RMSNorm(a.dim, a.norm_eps));
  output = register_module("output", new_linear(a.dim, a.vocab_size));
  if (a.tie_word_embeddings) tie_head();  // one parameter, as Llama's tied head (docs/hf_models.md)
  // transformers' tables: inverse frequencies and angles in float32 (Llama's helper with
  // the same head_dim, theta and length).
  LlamaArgs rope;
  rope.head_dim = a.resolved_head_dim();
  rope.rope_theta = a.rope_theta;
  rope.max_seq_len = a.max_seq_len;
  rope.rope_tables_like_hf = true;
  auto [cos, sin] = llama_rope_tables(rope);
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
  h = run_decoder_blocks<Gemma2BlockImpl>(layers, block_hooks_.get(), block_checkpointing_, h, rope_cos_, rope_sin_);
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
