// minigpt_model.h — the example family's module: a small GPT-style decoder written against
// the installed headers only. Token and learned position embeddings, pre-norm blocks
// (LayerNorm without bias, causal multi-head attention, a GELU MLP), a final LayerNorm and
// an untied head. It implements hp::CausalLanguageModel, which is all hp-train needs of a
// module.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <memory>
#include <string>

#include <hyper_parallel/models/causal_lm.h>
#include <hyper_parallel/models/decoder_sizes.h>

namespace minigpt {

struct MiniGptArgs {
  int64_t dim = 64;
  int64_t n_layers = 2;
  int64_t n_heads = 4;
  int64_t vocab_size = 256;
  int64_t ffn_hidden_dim = 0;  // 0: 4 x dim
  int64_t max_seq_len = 128;
  double norm_eps = 1e-5;

  int64_t head_dim() const { return dim / n_heads; }
  int64_t hidden_dim() const { return ffn_hidden_dim > 0 ? ffn_hidden_dim : 4 * dim; }

  // From hp-train's [model] keys; a key this family has no use for, set to something
  // other than its default, is a std::invalid_argument naming it.
  static MiniGptArgs from_sizes(const hyper_parallel::DecoderSizes& sizes);
  // From a config.json's text ({"model_type": "minigpt", "hidden_size", ...}); `source`
  // names it in errors.
  static MiniGptArgs from_config_json(const std::string& json, const std::string& source);
  std::string to_config_json() const;
};

// LayerNorm with a weight and no bias (its parameter's name holds "norm": initialised to 1).
class LayerNormImpl : public torch::nn::Module {
 public:
  LayerNormImpl(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(LayerNorm);

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const MiniGptArgs& args);
  at::Tensor forward(const at::Tensor& x);
  LayerNorm attention_norm{nullptr}, mlp_norm{nullptr};
  torch::nn::Linear wq{nullptr}, wk{nullptr}, wv{nullptr}, wo{nullptr};  // attention
  torch::nn::Linear fc_in{nullptr}, fc_out{nullptr};                     // MLP

 private:
  at::Tensor attention(const at::Tensor& x);
  int64_t head_dim_;
};
TORCH_MODULE(Block);

class MiniGptImpl : public torch::nn::Module, public hyper_parallel::CausalLanguageModel {
 public:
  explicit MiniGptImpl(const MiniGptArgs& args);
  const MiniGptArgs& args() const { return args_; }

  at::Tensor logits(const at::Tensor& tokens) override;
  at::Tensor hidden_states(const at::Tensor& tokens) override;
  at::Tensor head_weight() const override { return output->weight; }
  void init_weights(uint64_t seed) override;
  void set_block_hooks(std::shared_ptr<hyper_parallel::BlockHooks> hooks) override { hooks_ = std::move(hooks); }
  void set_block_checkpointing(const hyper_parallel::BlockCheckpointing& policy) override { checkpointing_ = policy; }
  hyper_parallel::DecoderSizes sizes() const override;
  int64_t flops_per_token(int64_t seq_len) const override;

  torch::nn::Embedding tok_embeddings{nullptr}, pos_embeddings{nullptr};
  torch::nn::ModuleList layers{nullptr};
  LayerNorm norm{nullptr};
  torch::nn::Linear output{nullptr};

 private:
  MiniGptArgs args_;
  std::shared_ptr<hyper_parallel::BlockHooks> hooks_;
  hyper_parallel::BlockCheckpointing checkpointing_;
};
TORCH_MODULE(MiniGpt);

}  // namespace minigpt
