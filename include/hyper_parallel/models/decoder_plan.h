// What every decoder built from decoder_blocks.h shares beyond its modules: TorchTitan's
// tensor-parallel plan, the checks that a model's sizes split over a TP degree, the Hugging
// Face tensor names, and what one block keeps for backward (the sizes' own rules, which a
// job checks before anything is built, are decoder_size_rules.h).
// Each is driven by the block's options, so a family passes its DecoderBlockOptions and
// names only what is its own.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hyper_parallel/core/device_mesh.h"
#include "hyper_parallel/core/export.h"
#include "hyper_parallel/models/block_activations.h"
#include "hyper_parallel/models/decoder_blocks.h"
#include "hyper_parallel/models/hf_checkpoint.h"
#include "hyper_parallel/nn/parallel_style.h"

HP_PUBLIC_BEGIN

namespace torch::nn {
class Module;
}

namespace hyper_parallel {

// TorchTitan's TP plan for a model whose sub-modules are tok_embeddings, layers.* (decoder
// blocks), norm and output: embeddings Rowwise (vocabulary-parallel), q/k/v and w1/w3
// Colwise, wo and w2 Rowwise, the head Colwise with Shard(-1) DTensor logits under loss
// parallel or replicated local logits otherwise. sequence_parallel: the residual stream and
// the norms are Shard(1) DTensors (norms SequenceParallel, post-norms too); the embeddings,
// wo and w2 reduce-scatter to Shard(1), attention and feed_forward all-gather from it
// (PrepareModuleInput, once for q/k/v and once for w1/w3), and so does the head. With q/k
// norms: their [head_dim] weights replicated and applied to each rank's own heads, the
// weights' gradients summed over TP ranks.
ParallelizePlan decoder_tp_plan(const DecoderBlockOptions& block, bool loss_parallel, bool sequence_parallel = false);

// Why a decoder of these options does not split over `tp` ranks (whole query and key/value
// heads per rank, dim and the MLP's hidden size divisible); empty when it does. `who` starts
// each message (e.g. "parallelize_llama").
std::vector<std::string> decoder_tp_misfits(const DecoderBlockOptions& block, int64_t tp, const std::string& who);

// Checks decoder_tp_misfits (a c10::Error with the first), applies `plan`, and points every
// RMSNorm's weight member at the parameter SequenceParallel registered in its place. A tied
// head is the family's to re-tie afterwards. src_data_rank as in parallelize_module.
void parallelize_decoder(torch::nn::Module& model, const DeviceMesh& tp_mesh, const ParallelizePlan& plan,
                         const DecoderBlockOptions& block, const std::string& who,
                         std::optional<int64_t> src_data_rank);
// After parallelize_module: each RMSNorm's weight member is its registered parameter again.
void refresh_norm_weights(torch::nn::Module& model);

// Our parameter names against transformers' (model.embed_tokens, model.layers.i.self_attn.
// {q,k,v,o}_proj, mlp.{gate,up,down}_proj, input_layernorm, post_attention_layernorm or with
// post-norms pre_/post_feedforward_layernorm, self_attn.{q,k}_norm, model.norm, lm_head), in
// the order the checkpoint is written: per layer the projections and norms, then the final
// norm and the head (none when tied), then each layer's q/k norms. Where the block keeps
// adjacent-pair RoPE, q/k rows (and q/k norm weights) are permuted from transformers'
// rotate-half order per head.
HfAdapter decoder_hf_adapter(const DecoderBlockOptions& block, int64_t n_layers, bool tie_word_embeddings);

// What one block of these options keeps for backward (ModelFamily::block_activation_bytes).
int64_t decoder_block_activation_bytes(const DecoderBlockOptions& block, const BlockActivationShape& shape);

}  // namespace hyper_parallel

HP_PUBLIC_END
