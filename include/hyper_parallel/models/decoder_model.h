// The module a decoder family's model is: token embedding, the decoder blocks
// (decoder_blocks.h), a final RMSNorm and the output head (its own weight, or the
// embeddings' when tied), the RoPE tables as buffers, and what CausalLanguageModel asks that
// follows from them. A family's module (Llama's, Qwen3's, Gemma 2's, one from outside the
// library) derives from it and says only what is its own: its blocks' options, its final
// norm's scale, its RoPE tables, its arguments, and any scaling of the embeddings (embed).
// The registry's fields that follow from the shell alone are decoder_model_family's.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "hyper_parallel/core/device_mesh.h"
#include "hyper_parallel/core/export.h"
#include "hyper_parallel/models/causal_lm.h"
#include "hyper_parallel/models/decoder_blocks.h"
#include "hyper_parallel/models/model_registry.h"
#include "hyper_parallel/nn/activation_checkpoint.h"
#include "hyper_parallel/nn/block_hooks.h"
#include "hyper_parallel/nn/parallel_style.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel {

// What a family hands the shell.
struct DecoderModelParts {
  std::string family;  // starts the module's errors ("Llama", "Gemma2")
  DecoderSizes sizes;  // resolved, as sizes() reports them (n_kv_heads, head_dim, ffn_hidden_dim)
  std::function<DecoderBlockOptions(int64_t layer)> blocks;  // layer i's block options
  NormScale norm_scale = NormScale::weight;                  // the final norm's
  std::pair<at::Tensor, at::Tensor> rope_tables;             // (cos, sin) [max_seq_len, head_dim / 2]
};

class DecoderModelImpl : public torch::nn::Module, public CausalLanguageModel {
 public:
  // tokens [batch, seq] -> logits [batch, seq, vocab] (a Shard(-1) DTensor under loss
  // parallel, a plain tensor otherwise).
  at::Tensor forward(const at::Tensor& tokens);
  at::Tensor logits(const at::Tensor& tokens) override { return forward(tokens); }
  // The final norm's output [batch, seq, dim]: what the head reads. A fused linear loss
  // (fused_linear_loss.h) takes it with output->weight, so the logits are never made.
  // Under sequence parallel it is a Shard(1) DTensor (redistribute it to Replicate first).
  at::Tensor hidden_states(const at::Tensor& tokens) override;
  at::Tensor head_weight() const override { return output->weight; }
  DecoderSizes sizes() const override { return sizes_; }
  // TorchTitan's seeded initialisation (init_decoder_weights, decoder_stack.h): the norms
  // at a scale of 1 (weight 1 where they scale by w, 0 where by 1 + w).
  void init_weights(uint64_t seed) override;
  // TorchTitan's dense count (dense_decoder_flops_per_token), every layer's attention at seq_len.
  int64_t flops_per_token(int64_t seq_len) const override;
  // Called around the forward's blocks (block_hooks.h), e.g. by sharded data
  // parallelism; nullptr: none.
  void set_block_hooks(std::shared_ptr<BlockHooks> hooks) override { block_hooks_ = std::move(hooks); }
  void set_block_checkpointing(const BlockCheckpointing& policy) override { block_checkpointing_ = policy; }
  // Layer `layer`'s block options (the model's TP plan, HF names and activation estimate
  // read layer 0's: a family's layers differ at most in what none of those reads).
  DecoderBlockOptions block_options(int64_t layer = 0) const { return blocks_(layer); }
  // Tied models: points output->weight at tok_embeddings->weight (the head registers no
  // weight). The constructor and parallelize_decoder_model call it; call it again after
  // replacing the embeddings' parameter yourself.
  void tie_head();

  torch::nn::Embedding tok_embeddings{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};
  torch::nn::Linear output{nullptr};

 protected:
  // Registers tok_embeddings, layers, norm, output (tied when sizes say so) and the RoPE
  // tables (buffers rope_cos, rope_sin), in that order: the order named_parameters, and so
  // the seeded initialisation, follow.
  explicit DecoderModelImpl(DecoderModelParts parts);
  // The embeddings' output before the first block; as it is by default (Gemma 2 scales it).
  virtual at::Tensor embed(const at::Tensor& h) const { return h; }
  const std::string& family() const { return family_; }

 private:
  std::string family_;
  DecoderSizes sizes_;
  std::function<DecoderBlockOptions(int64_t layer)> blocks_;
  NormScale norm_scale_;
  at::Tensor rope_cos_, rope_sin_;
  std::shared_ptr<BlockHooks> block_hooks_;
  BlockCheckpointing block_checkpointing_;
};

// `module` as the decoder model it is; a c10::Error naming the module otherwise.
DecoderModelImpl& as_decoder_model(const torch::nn::Module& module);

// `module` as the TORCH_MODULE holder of its own class (Llama, Gemma2, ...); a c10::Error
// "expected a <what> module" otherwise.
template <class Holder>
Holder module_holder_of(const torch::nn::Module& module, const char* what) {
  auto impl = std::dynamic_pointer_cast<typename Holder::ContainedType>(
      const_cast<torch::nn::Module&>(module).shared_from_this());
  TORCH_CHECK(impl, "expected a ", what, " module, got a ", module.name());
  return Holder(impl);
}

// Checks that the model's blocks split over the TP degree (decoder_tp_misfits, each message
// starting with `who`), applies `plan` and re-ties a tied head to the sharded embeddings.
void parallelize_decoder_model(DecoderModelImpl& model, const DeviceMesh& tp_mesh, const ParallelizePlan& plan,
                               const std::string& who, std::optional<int64_t> src_data_rank);

// The registry fields a family of decoder models has from the shell alone: parallelize (the
// decoder's TP plan for the module's blocks, errors starting with `parallelize_name`),
// hf_adapter (decoder_hf_adapter of its blocks) and block_activation_bytes. The family adds
// its readers (from_hf_config, from_hf_config_json), to_hf_config and from_sizes; the shape
// rules stay the decoder's (null).
ModelFamily decoder_model_family(std::string name, std::string parallelize_name);

}  // namespace hyper_parallel

HP_PUBLIC_END
