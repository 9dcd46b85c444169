// The Gemma 2 family (transformers' Gemma2ForCausalLM): embeddings scaled by sqrt(dim),
// RMSNorms that scale by (1 + weight), a norm before and after both the attention and the
// MLP, GeGLU MLP (tanh-approximated GELU), attention scaled by query_pre_attn_scalar^-1/2
// with tanh soft-capped scores, sliding-window attention on the layers the config marks,
// and a tied head whose logits the loss soft-caps. Read from a Gemma 2 config.json, with
// its TP plan and checkpoint adapter (sources in src/models/gemma2/).
//
// Built from the family-neutral decoder blocks (decoder_blocks.h) with Gemma 2's options, in
// the shared model shell (decoder_model.h).
// RoPE rotates halves (i, i + head_dim / 2) as transformers does, so q/k rows keep the
// checkpoint's order (no permutation at load or export); the sub-module names are Llama's
// where the parts are the same.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "hyper_parallel/core/device_mesh.h"
#include "hyper_parallel/core/export.h"
#include "hyper_parallel/models/block_activations.h"
#include "hyper_parallel/models/decoder_blocks.h"
#include "hyper_parallel/models/decoder_model.h"
#include "hyper_parallel/models/hf_checkpoint.h"
#include "hyper_parallel/nn/parallel_style.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel {

enum class Gemma2AttentionKind { full, sliding };

// DecoderSizes (causal_lm.h) and what Gemma 2 adds to them. The defaults are transformers'
// Gemma2Config's (gemma-2-2b's sizes), the sizes' included.
struct Gemma2Args : DecoderSizes {
  Gemma2Args();
  // Attention scores are scaled by query_pre_attn_scalar^-1/2 (not head_dim^-1/2).
  int64_t query_pre_attn_scalar = 256;
  // Scores become cap * tanh(scores / cap) before the mask; 0: off (null in config.json).
  double attn_logit_softcapping = 50.0;
  // Logits become cap * tanh(logits / cap): applied by the loss (LossParallelOptions::
  // logit_softcap, or soft_cap below), not by forward; 0: off.
  double final_logit_softcapping = 30.0;
  // A sliding layer's query at position q reads keys q - sliding_window < k <= q.
  int64_t sliding_window = 4096;
  // Per layer; empty: transformers' default, layers 0, 2, 4, ... sliding, the others full.
  std::vector<Gemma2AttentionKind> layer_types;
  // The embedding row whose lookups give it no gradient (nn.Embedding's padding_idx, set
  // from pad_token_id as transformers does); nullopt: none.
  std::optional<int64_t> pad_token_id = 0;

  Gemma2AttentionKind attention_kind(int64_t layer) const;

  // From a transformers Gemma2Config (config.json), with Gemma2Config's defaults for absent
  // fields. What the model cannot represent (attention_bias, another hidden_activation, a
  // rope type other than default, bidirectional attention, layer types other than
  // full/sliding ...) is refused naming the field and its value.
  static Gemma2Args from_hf_config_json(const std::string& json_text, const std::string& source = "config.json");
  static Gemma2Args from_hf_config_file(const std::string& path);
  // And back: a Gemma2Config that from_hf_config_json reads as these args, every field written.
  std::string to_hf_config_json() const;
};

// Layer `layer`'s blocks (decoder_blocks.h): RMSNorms scaling by 1 + w, before and after
// both the attention and the MLP; attention with rotate-half RoPE, scores scaled by
// query_pre_attn_scalar^-1/2 and soft-capped, a float32 softmax, the sliding window on the
// layers the config marks; GeGLU with tanh-approximated GELU.
DecoderBlockOptions gemma2_block_options(const Gemma2Args& args, int64_t layer);

// The decoder model (decoder_model.h) with Gemma 2's blocks, its embeddings scaled by
// sqrt(dim) and a final norm scaling by 1 + w. Its logits (forward, logits) come BEFORE the
// final soft-capping (args().final_logit_softcapping; the loss applies it). Its FLOPs are
// TorchTitan's dense count, the sliding-window layers at the full seq_len: exact while
// seq_len <= sliding_window (4096 in every Gemma 2), where a sliding layer reads as many keys
// as a full one; beyond it, an over-count of the sliding layers' scores (as TorchTitan counts
// its sliding-window family, gpt-oss).
class Gemma2Impl : public DecoderModelImpl {
 public:
  explicit Gemma2Impl(const Gemma2Args& args);
  double final_logit_softcap() const override { return args_.final_logit_softcapping; }
  // Deterministic initialisation from a seed (the same on every rank, independent of the
  // global RNG): linear and embedding weights normal with std 0.02 (the output projections
  // wo and w2 by 0.02 / sqrt(2 n_layers)), clamped to +-0.06, as Llama's; norms zero (a
  // scale of 1); the padding row zero, as transformers initialises it.
  void init_weights(uint64_t seed) override;
  const Gemma2Args& args() const { return args_; }

 protected:
  at::Tensor embed(const at::Tensor& h) const override;

 private:
  Gemma2Args args_;
};
TORCH_MODULE(Gemma2);

// The decoder's TP plan (decoder_tp_plan: the sub-modules are Llama's), with, under sequence
// parallel, the post-attention and post-MLP norms as SequenceParallel: embeddings
// vocabulary-parallel, q/k/v and w1/w3 Colwise, wo and w2 Rowwise, the head Colwise with
// Shard(-1) DTensor logits under loss parallel, replicated local ones otherwise.
ParallelizePlan gemma2_tp_plan(bool loss_parallel, bool sequence_parallel = false);
// Checks that heads, key/value heads, dim and the MLP's hidden size split over the TP
// degree (errors name both numbers) and applies the plan; src_data_rank as in parallelize_module.
void parallelize_gemma2(Gemma2& model, const DeviceMesh& tp_mesh, bool loss_parallel, bool sequence_parallel = false,
                        std::optional<int64_t> src_data_rank = 0);

// Our parameter names against transformers' Gemma2ForCausalLM; no row is permuted. A tied
// model has no output.weight and the file no lm_head.weight.
HfAdapter gemma2_hf_adapter(const Gemma2Args& args);
// What one block keeps for backward (ModelFamily::block_activation_bytes).
int64_t gemma2_block_activation_bytes(const Gemma2Args& args, const BlockActivationShape& shape);

struct ModelFamily;
// The registry's entry (model_registry.h), "gemma2".
ModelFamily gemma2_family();
// A registry module as the Gemma2 it is; throws otherwise.
Gemma2 as_gemma2(const torch::nn::Module& module);

}  // namespace hyper_parallel

HP_PUBLIC_END
