#include "minigpt_model.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>
#include <stdexcept>

#include <hyper_parallel/nn/activation_checkpoint.h>
#include <hyper_parallel/nn/parallel_style.h>
#include <hyper_parallel/nn/parameters_on_meta.h>

namespace minigpt {

namespace hp = hyper_parallel;

MiniGptArgs MiniGptArgs::from_sizes(const hp::DecoderSizes& s) {
  const hp::DecoderSizes defaults;
  auto refuse = [](const std::string& key, const std::string& why) {
    throw std::invalid_argument("minigpt: model." + key + " " + why);
  };
  if (s.n_kv_heads != defaults.n_kv_heads && s.n_kv_heads != s.n_heads)
    refuse("n_kv_heads", "must equal n_heads (minigpt has no grouped-query attention)");
  if (s.head_dim != defaults.head_dim && s.head_dim * s.n_heads != s.dim)
    refuse("head_dim", "must be dim / n_heads (minigpt has no head size of its own)");
  if (s.tie_word_embeddings) refuse("tie_word_embeddings", "must be false (minigpt's head is its own)");
  MiniGptArgs a;
  a.dim = s.dim;
  a.n_layers = s.n_layers;
  a.n_heads = s.n_heads;
  a.vocab_size = s.vocab_size;
  a.ffn_hidden_dim = s.ffn_hidden_dim;
  a.max_seq_len = s.max_seq_len;
  a.norm_eps = s.norm_eps;
  if (a.dim % a.n_heads != 0) refuse("dim", "must be divisible by n_heads");
  return a;
}

MiniGptArgs MiniGptArgs::from_config_json(const std::string& text, const std::string& source) {
  const nlohmann::json j = nlohmann::json::parse(text);
  if (j.value("model_type", std::string()) != "minigpt")
    throw std::invalid_argument(source + ": model_type is \"" + j.value("model_type", std::string()) +
                                "\", expected \"minigpt\"");
  MiniGptArgs a;
  a.dim = j.at("hidden_size").get<int64_t>();
  a.n_layers = j.at("num_hidden_layers").get<int64_t>();
  a.n_heads = j.at("num_attention_heads").get<int64_t>();
  a.vocab_size = j.at("vocab_size").get<int64_t>();
  a.ffn_hidden_dim = j.value("intermediate_size", int64_t{0});
  a.max_seq_len = j.value("max_position_embeddings", a.max_seq_len);
  a.norm_eps = j.value("layer_norm_eps", a.norm_eps);
  return a;
}

std::string MiniGptArgs::to_config_json() const {
  nlohmann::json j = {{"model_type", "minigpt"},
                      {"hidden_size", dim},
                      {"num_hidden_layers", n_layers},
                      {"num_attention_heads", n_heads},
                      {"vocab_size", vocab_size},
                      {"intermediate_size", hidden_dim()},
                      {"max_position_embeddings", max_seq_len},
                      {"layer_norm_eps", norm_eps}};
  return j.dump(2);
}

LayerNormImpl::LayerNormImpl(int64_t dim, double eps) : eps_(eps) {
  // On the meta device inside a dry run's ParametersOnMeta(Everything), as the library's norms.
  weight = register_parameter("weight", hp::on_meta_when_everything_is(at::ones({dim})));
}

at::Tensor LayerNormImpl::forward(const at::Tensor& x) {
  // Written out rather than at::layer_norm, whose meta kernel LibTorch's C++ build lacks
  // (a dry run steps the model on meta tensors).
  const at::Tensor centred = x - x.mean({-1}, /*keepdim=*/true);
  return centred * at::rsqrt(centred.square().mean({-1}, /*keepdim=*/true) + eps_) * weight;
}

BlockImpl::BlockImpl(const MiniGptArgs& a) : head_dim_(a.head_dim()) {
  attention_norm = register_module("attention_norm", LayerNorm(a.dim, a.norm_eps));
  // hp::new_linear: bias-free, and weights on the meta device when hp-train builds the model
  // to read a checkpoint into its tensor-parallel pieces (or for a dry run).
  wq = register_module("wq", hp::new_linear(a.dim, a.dim));
  wk = register_module("wk", hp::new_linear(a.dim, a.dim));
  wv = register_module("wv", hp::new_linear(a.dim, a.dim));
  wo = register_module("wo", hp::new_linear(a.dim, a.dim));
  mlp_norm = register_module("mlp_norm", LayerNorm(a.dim, a.norm_eps));
  fc_in = register_module("fc_in", hp::new_linear(a.dim, a.hidden_dim()));
  fc_out = register_module("fc_out", hp::new_linear(a.hidden_dim(), a.dim));
}

at::Tensor BlockImpl::attention(const at::Tensor& x) {
  const int64_t b = x.size(0), s = x.size(1);
  // Under tensor parallelism each rank computes its own heads: -1 of them.
  auto heads = [&](const at::Tensor& t) { return t.view({b, s, -1, head_dim_}).transpose(1, 2); };
  const at::Tensor q = heads(hp::parallel_forward(wq, x));
  const at::Tensor k = heads(hp::parallel_forward(wk, x));
  const at::Tensor v = heads(hp::parallel_forward(wv, x));
  const at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim_));
  const at::Tensor future = at::ones({s, s}, x.options().dtype(at::kBool)).triu(1);
  const at::Tensor p = at::softmax(scores.masked_fill(future, -std::numeric_limits<double>::infinity()), -1);
  const at::Tensor out = at::matmul(p, v).transpose(1, 2).reshape({b, s, -1});
  return hp::parallel_forward(wo, out);
}

at::Tensor BlockImpl::forward(const at::Tensor& x) {
  const at::Tensor h = x + attention(attention_norm->forward(x));
  return h + hp::parallel_forward(fc_out, at::gelu(hp::parallel_forward(fc_in, mlp_norm->forward(h))));
}

MiniGptImpl::MiniGptImpl(const MiniGptArgs& a) : args_(a) {
  tok_embeddings = register_module("tok_embeddings", hp::new_embedding(a.vocab_size, a.dim));
  pos_embeddings = register_module("pos_embeddings", hp::new_embedding(a.max_seq_len, a.dim));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < a.n_layers; ++i) layers->push_back(Block(a));
  norm = register_module("norm", LayerNorm(a.dim, a.norm_eps));
  output = register_module("output", hp::new_linear(a.dim, a.vocab_size));
}

at::Tensor MiniGptImpl::hidden_states(const at::Tensor& tokens) {
  if (tokens.dim() != 2 || tokens.size(1) > args_.max_seq_len)
    throw std::invalid_argument("minigpt: expected tokens [batch, seq] with seq <= " +
                                std::to_string(args_.max_seq_len));
  // The hooks let FSDP gather a block's parameters just before it runs (block_hooks.h).
  if (hooks_) hooks_->before_forward();
  const at::Tensor positions = at::arange(tokens.size(1), tokens.options().dtype(at::kLong));
  at::Tensor h = tok_embeddings->forward(tokens) + pos_embeddings->forward(positions);
  for (int64_t i = 0; i < static_cast<int64_t>(layers->size()); ++i) {
    if (hooks_) hooks_->before_block(i);
    BlockImpl* block = layers[i]->as<BlockImpl>();
    // Recomputed in backward when [activation_checkpoint] picks this block.
    h = hp::run_block(
        checkpointing_, i, *block, [block](const at::Tensor& x) { return block->forward(x); }, h);
    if (hooks_) hooks_->after_block(i, h);
  }
  return norm->forward(h);
}

at::Tensor MiniGptImpl::logits(const at::Tensor& tokens) { return hp::parallel_forward(output, hidden_states(tokens)); }

void MiniGptImpl::init_weights(uint64_t seed) {
  // The same values on every rank from the seed alone: norms 1, everything else N(0, 0.02).
  at::NoGradGuard no_grad;
  at::Generator generator = at::detail::createCPUGenerator(seed);
  for (auto& p : named_parameters()) {
    if (p.value().is_meta()) throw std::invalid_argument("minigpt: init_weights on meta parameter " + p.key());
    if (p.key().find("norm") != std::string::npos) {
      p.value().fill_(1.0);
      continue;
    }
    at::Tensor values = at::empty(p.value().sizes(), at::kFloat);
    values.normal_(0.0, 0.02, generator);
    p.value().copy_(values);
  }
}

hp::DecoderSizes MiniGptImpl::sizes() const {
  hp::DecoderSizes s;
  s.dim = args_.dim;
  s.n_layers = args_.n_layers;
  s.n_heads = args_.n_heads;
  s.n_kv_heads = args_.n_heads;
  s.head_dim = args_.head_dim();
  s.vocab_size = args_.vocab_size;
  s.ffn_hidden_dim = args_.hidden_dim();
  s.max_seq_len = args_.max_seq_len;
  s.norm_eps = args_.norm_eps;
  s.tie_word_embeddings = false;
  return s;
}

int64_t MiniGptImpl::flops_per_token(int64_t seq_len) const {
  // TorchTitan's dense count: 6 x the matmul parameters (embeddings are lookups) + the
  // attention scores and weighted values, 12 x layers x heads x head_dim x seq_len.
  const MiniGptArgs& a = args_;
  const int64_t matmul_params = a.n_layers * (4 * a.dim * a.dim + 2 * a.dim * a.hidden_dim()) + a.dim * a.vocab_size;
  return 6 * matmul_params + 12 * a.n_layers * a.n_heads * a.head_dim() * seq_len;
}

}  // namespace minigpt
