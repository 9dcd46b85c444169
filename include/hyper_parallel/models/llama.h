// The Llama family (token embedding, decoder blocks of RMSNorm, RoPE, causal grouped-query
// attention and SwiGLU MLP, output head), its TorchTitan tensor-parallel plan, and its adapter
// to transformers' LlamaForCausalLM checkpoints (hf_checkpoint.h; sources in
// src/models/llama/). The blocks, plan and names are the family-neutral ones
// (decoder_blocks.h, decoder_plan.h) with Llama's options, in the shared model shell
// (decoder_model.h).
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "hyper_parallel/core/device_mesh.h"
#include "hyper_parallel/core/export.h"
#include "hyper_parallel/models/block_activations.h"
#include "hyper_parallel/models/decoder_blocks.h"
#include "hyper_parallel/models/decoder_model.h"
#include "hyper_parallel/models/hf_checkpoint.h"
#include "hyper_parallel/nn/parallel_style.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel {

// DecoderSizes (causal_lm.h) and what Llama adds to them. ffn_hidden_dim 0: 2/3 * 4 * dim
// rounded up to multiple_of (hidden_dim()).
struct LlamaArgs : DecoderSizes {
  std::optional<Llama3RopeScaling> rope_scaling;
  // RoPE tables computed in float32 step by step as transformers does (set by
  // from_hf_config, so that long contexts agree with the checkpoint's own model); false:
  // in float64, rounded to float32 once.
  bool rope_tables_like_hf = false;
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

// Llama's blocks (decoder_blocks.h): RMSNorm scaling by w, attention with adjacent-pair RoPE
// and no q/k norms, SwiGLU of hidden_dim().
DecoderBlockOptions llama_block_options(const LlamaArgs& args);

// The shell's parts (decoder_model.h) of a model shaped like Llama (Llama, Qwen3): the args'
// checks (errors start with `family`), the resolved sizes, llama_rope_tables, and
// block_options(args) for every layer.
DecoderModelParts llama_model_parts(const std::string& family, const LlamaArgs& args,
                                    DecoderBlockOptions (*block_options)(const LlamaArgs& args));

// The decoder model (decoder_model.h) with Llama's blocks; its seeded initialisation is the
// shell's (TorchTitan's: std 0.02, output projections by depth, norms 1).
class LlamaImpl : public DecoderModelImpl {
 public:
  explicit LlamaImpl(const LlamaArgs& args);
  const LlamaArgs& args() const { return args_; }

 private:
  LlamaArgs args_;
};
TORCH_MODULE(Llama);

// The RoPE tables [max_seq_len, head_dim / 2] (cos, sin) as float32, for `args` (rope.h).
RopeTableOptions llama_rope_options(const LlamaArgs& args);
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
// the plan of its blocks (decoder_tp_plan, llama_tp_plan); src_data_rank as in parallelize_module.
void parallelize_llama(Llama& model, const DeviceMesh& tp_mesh, bool loss_parallel, bool sequence_parallel = false,
                       std::optional<int64_t> src_data_rank = 0);
// The same checks with another plan for this module.
void parallelize_llama(Llama& model, const DeviceMesh& tp_mesh, const ParallelizePlan& plan,
                       std::optional<int64_t> src_data_rank);

// Our parameter names against transformers' LlamaForCausalLM (q/k rows in rotate-half
// order there; a tied model has no output.weight of its own and the file no lm_head.weight).
HfAdapter llama_hf_adapter(const LlamaArgs& args);
// What one of Llama's blocks keeps for backward (decoder_block_activation_bytes).
int64_t llama_block_activation_bytes(const LlamaArgs& args, const BlockActivationShape& shape);

struct ModelFamily;
// The registry's entry (model_registry.h).
ModelFamily llama_family();
// A registry module as the Llama it is (families shaped like Llama build one); throws otherwise.
Llama as_llama(const torch::nn::Module& module);

}  // namespace hyper_parallel

HP_PUBLIC_END
