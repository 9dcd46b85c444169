// The Llama family (token embedding, RMSNorm, RoPE, causal grouped-query attention, SwiGLU
// MLP, output head), its TorchTitan tensor-parallel plan, and its adapter to transformers'
// LlamaForCausalLM checkpoints (hf_checkpoint.h; sources in src/models/llama/).
//
// Parallelized sub-modules are called through hp::parallel_forward, so the same code runs
// on one process and under any TP degree. Attention works on each rank's local heads
// (ColwiseParallel with use_local_output, as TorchTitan does).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <memory>
#include <optional>
#include <string>

#include "hyper_parallel/models/block_activations.h"
#include "hyper_parallel/nn/block_hooks.h"
#include "hyper_parallel/models/causal_lm.h"
#include "hyper_parallel/core/device_mesh.h"
#include "hyper_parallel/models/hf_checkpoint.h"
#include "hyper_parallel/nn/parallel_style.h"
#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel {

// llama3 rope scaling (Llama 3.1): the inverse frequencies rescaled by wavelength, as
// transformers' _compute_llama3_parameters.
struct Llama3RopeScaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

// DecoderSizes (causal_lm.h) and what Llama adds to them. ffn_hidden_dim 0: 2/3 * 4 * dim
// rounded up to multiple_of (hidden_dim()).
struct LlamaArgs : DecoderSizes {
  std::optional<Llama3RopeScaling> rope_scaling;
  // RoPE tables computed in float32 step by step as transformers does (set by
  // from_hf_config, so that long contexts agree with the checkpoint's own model); false:
  // in float64, rounded to float32 once.
  bool rope_tables_like_hf = false;
  // Per-head RMSNorm of queries and keys (weights [head_dim]) before RoPE: an option of the
  // attention block that Qwen3 sets (src/models/qwen3/); Llama has none.
  bool qk_norm = false;
  int64_t hidden_dim() const;

  // From a transformers LlamaConfig (config.json): the fields the model honours are read,
  // the ones it cannot represent (attention_bias, mlp_bias, hidden_act other than silu, a
  // rope type other than default/llama3 ...) are refused naming the field and its value.
  // `model_type`: the one the caller's family reads (families shaped like Llama share
  // this reader and add their own fields).
  static LlamaArgs from_hf_config_file(const std::string& path);
  // A Llama of these sizes (hp-train's [model] keys), every field honoured.
  static LlamaArgs from_sizes(const DecoderSizes& sizes);
  static LlamaArgs from_hf_config_json(const std::string& json_text, const std::string& source = "config.json",
                                       const std::string& model_type = "llama");
  // And back: a transformers LlamaConfig (config.json, as transformers 5 writes it:
  // rope_parameters with rope_theta inside) that from_hf_config_json reads as these args.
  std::string to_hf_config_json() const;
};

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const LlamaArgs& args);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
  torch::nn::Linear wq{nullptr}, wk{nullptr}, wv{nullptr}, wo{nullptr};
  RMSNorm q_norm{nullptr}, k_norm{nullptr};  // per head, with args.qk_norm only

 private:
  int64_t head_dim_;
  int64_t group_;  // query heads per key/value head
};
TORCH_MODULE(Attention);

class FeedForwardImpl : public torch::nn::Module {
 public:
  explicit FeedForwardImpl(const LlamaArgs& args);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Linear w1{nullptr}, w2{nullptr}, w3{nullptr};
};
TORCH_MODULE(FeedForward);

class TransformerBlockImpl : public torch::nn::Module {
 public:
  explicit TransformerBlockImpl(const LlamaArgs& args);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
  RMSNorm attention_norm{nullptr}, ffn_norm{nullptr};
  Attention attention{nullptr};
  FeedForward feed_forward{nullptr};
};
TORCH_MODULE(TransformerBlock);

class LlamaImpl : public torch::nn::Module, public CausalLanguageModel {
 public:
  explicit LlamaImpl(const LlamaArgs& args);
  // tokens [batch, seq] -> logits [batch, seq, vocab] (a Shard(-1) DTensor under loss
  // parallel, a plain tensor otherwise).
  at::Tensor forward(const at::Tensor& tokens);
  at::Tensor logits(const at::Tensor& tokens) override { return forward(tokens); }
  // The final norm's output [batch, seq, dim]: what the head reads. A fused linear loss
  // (fused_linear_loss.h) takes it with output->weight, so the logits are never made.
  // Under sequence parallel it is a Shard(1) DTensor (redistribute it to Replicate first).
  at::Tensor hidden_states(const at::Tensor& tokens) override;
  at::Tensor head_weight() const override { return output->weight; }
  // Deterministic initialisation from a seed (the same on every rank, independent of
  // the global RNG), scaled like TorchTitan's (std 0.02, output projections by depth).
  void init_weights(uint64_t seed) override;
  DecoderSizes sizes() const override;
  int64_t flops_per_token(int64_t seq_len) const override;
  const LlamaArgs& args() const { return args_; }
  // Tied models: points output->weight at tok_embeddings->weight (the head registers no
  // weight). The constructor and parallelize_llama call it; call it again after replacing
  // the embeddings' parameter yourself.
  void tie_head();
  // Called around the forward's blocks (block_hooks.h), e.g. by sharded data
  // parallelism; nullptr: none.
  void set_block_hooks(std::shared_ptr<BlockHooks> hooks) override { block_hooks_ = std::move(hooks); }
  void set_block_checkpointing(const BlockCheckpointing& policy) override { block_checkpointing_ = policy; }

  torch::nn::Embedding tok_embeddings{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};
  torch::nn::Linear output{nullptr};

 private:
  LlamaArgs args_;
  at::Tensor rope_cos_, rope_sin_;  // [max_seq_len, head_dim / 2]
  std::shared_ptr<BlockHooks> block_hooks_;
  BlockCheckpointing block_checkpointing_;
};
TORCH_MODULE(Llama);

// The RoPE tables [max_seq_len, head_dim / 2] (cos, sin) as float32, for `args`.
std::pair<at::Tensor, at::Tensor> llama_rope_tables(const LlamaArgs& args);

// TorchTitan's TP plan for this model: embeddings Rowwise (vocabulary-parallel), q/k/v and
// w1/w3 Colwise, wo and w2 Rowwise, the output head Colwise with Shard(-1) DTensor logits
// when loss parallel is enabled, or replicated local logits when it is not
// (parallelism.disable_loss_parallel).
// sequence_parallel: the residual stream and the norms are Shard(1) DTensors (norms
// SequenceParallel); the embeddings, wo and w2 reduce-scatter to Shard(1), attention,
// feed_forward and the head all-gather from it. Uneven sequence pieces (seq % tp != 0)
// are supported: the DTensors carry the global length.
ParallelizePlan llama_tp_plan(bool loss_parallel, bool sequence_parallel = false);
// Checks the model fits the TP degree (query and key/value heads, hidden dims) and applies
// the plan; src_data_rank as in parallelize_module.
void parallelize_llama(Llama& model, const DeviceMesh& tp_mesh, bool loss_parallel, bool sequence_parallel = false,
                       std::optional<int64_t> src_data_rank = 0);
// The same checks with another family's plan for this module (Qwen3's adds its q/k norms).
void parallelize_llama(Llama& model, const DeviceMesh& tp_mesh, const ParallelizePlan& plan,
                       std::optional<int64_t> src_data_rank);

// Our parameter names against transformers' LlamaForCausalLM (q/k rows in rotate-half
// order there; a tied model has no output.weight of its own and the file no lm_head.weight).
HfAdapter llama_hf_adapter(const LlamaArgs& args);
// What one block keeps for backward (ModelFamily::block_activation_bytes; qk_norm included).
int64_t llama_block_activation_bytes(const LlamaArgs& args, const BlockActivationShape& shape);

struct ModelFamily;
// The registry's entry (model_registry.h).
ModelFamily llama_family();
// A registry module as the Llama it is (families shaped like Llama build one); throws otherwise.
Llama as_llama(const torch::nn::Module& module);

}  // namespace hyper_parallel

HP_PUBLIC_END
