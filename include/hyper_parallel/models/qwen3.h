// The Qwen3 family (transformers' Qwen3ForCausalLM, dense): the decoder model shell
// (decoder_model.h) whose blocks are Llama's with the attention option that normalises each
// head of the queries and keys before RoPE (AttentionOptions::qk_norm, weights [head_dim]),
// read from a Qwen3 config.json with Llama's reader (Qwen3Config has LlamaConfig's fields),
// with its TP plan and checkpoint adapter (src/models/qwen3/).
#pragma once

#include <optional>
#include <string>

#include "hyper_parallel/models/llama.h"
#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel {

// From a transformers Qwen3Config: the fields Llama's reader takes (with Qwen3Config's
// defaults where they differ: head_dim 128, max_position_embeddings 32768).
// Refused, naming the field and its value: use_sliding_window true, layer_types other
// than full_attention, attention_bias true, a rope type other than default/llama3, and
// what Llama's reader refuses.
LlamaArgs qwen3_args_from_hf_config_json(const std::string& json_text, const std::string& source = "config.json");
LlamaArgs qwen3_args_from_hf_config_file(const std::string& path);
// And back: a transformers Qwen3Config (Llama's fields, model_type qwen3, no sliding
// window) that qwen3_args_from_hf_config_json reads as these args.
std::string qwen3_hf_config_json(const LlamaArgs& args);

// Llama's blocks with the per-head q/k norms (eps: rms_norm_eps).
DecoderBlockOptions qwen3_block_options(const LlamaArgs& args);

// The decoder model with qwen3_block_options; its initialisation is the shell's (norms 1).
class Qwen3Impl : public DecoderModelImpl {
 public:
  explicit Qwen3Impl(const LlamaArgs& args);
  const LlamaArgs& args() const { return args_; }

 private:
  LlamaArgs args_;
};
TORCH_MODULE(Qwen3);

// The Qwen3 these args describe.
Qwen3 qwen3_model(const LlamaArgs& args);

// Llama's TP plan plus the q/k norms: their [head_dim] weights are replicated and applied
// to each rank's own heads; the weights' gradients are summed over TP ranks.
ParallelizePlan qwen3_tp_plan(bool loss_parallel, bool sequence_parallel = false);
void parallelize_qwen3(Qwen3& model, const DeviceMesh& tp_mesh, bool loss_parallel, bool sequence_parallel = false,
                       std::optional<int64_t> src_data_rank = 0);

// Llama's names plus self_attn.q_norm/k_norm, whose weights are permuted within the head
// like the q/k rows (the norm scales each element of a head; ours are in RoPE pair order).
HfAdapter qwen3_hf_adapter(const LlamaArgs& args);

struct ModelFamily;
ModelFamily qwen3_family();
// A registry module as the Qwen3 it is; throws otherwise.
Qwen3 as_qwen3(const torch::nn::Module& module);

}  // namespace hyper_parallel

HP_PUBLIC_END
