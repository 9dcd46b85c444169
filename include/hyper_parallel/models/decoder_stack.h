// The decoder stack around the blocks, alike in every family: the block loop (hooks around
// each block for sharded data parallelism, each block run through the activation-checkpointing
// policy), TorchTitan's seeded weight initialisation and the tied head. A family's module
// (Llama's, Gemma 2's, one from outside the library) keeps what differs: its blocks
// (decoder_blocks.h), its embedding scale, its norms.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <functional>
#include <string>

#include "hyper_parallel/core/export.h"
#include "hyper_parallel/nn/activation_checkpoint.h"
#include "hyper_parallel/nn/block_hooks.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel {

// h through every block of `layers` (each a Block whose forward takes (x, cos, sin)):
// hooks->before_block(i) / after_block(i, h) around each one (hooks may be null), each
// block recomputed in backward when `policy` says so.
template <class Block>
at::Tensor run_decoder_blocks(torch::nn::ModuleList& layers, BlockHooks* hooks, const BlockCheckpointing& policy,
                              at::Tensor h, const at::Tensor& cos, const at::Tensor& sin) {
  for (int64_t i = 0; i < static_cast<int64_t>(layers->size()); ++i) {
    if (hooks) hooks->before_block(i);
    Block* block = layers[i]->as<Block>();
    h = run_block(
        policy, i, *block, [block, cos, sin](const at::Tensor& x) { return block->forward(x, cos, sin); }, h);
    if (hooks) hooks->after_block(i, h);
  }
  return h;
}

// TorchTitan's initialisation of a dense decoder, the same on every rank from `seed`
// (independent of the global RNG): every parameter whose name has "norm" set to
// `norm_weight` (1 where the norm scales by w, 0 where by 1 + w); every other one drawn in
// float32 from N(0, 0.02), the output projections (wo, w2) from N(0, 0.02 / sqrt(2
// n_layers)), clamped to +-0.06, in named_parameters() order. `adjust(name, values)` may
// change the drawn values before they are copied (null: none). A meta parameter is a
// c10::Error naming `family` and the parameter.
void init_decoder_weights(torch::nn::Module& model, uint64_t seed, int64_t n_layers, double norm_weight,
                          const std::string& family,
                          const std::function<void(const std::string& name, at::Tensor& values)>& adjust = nullptr);

// The head reads the embeddings' parameter and registers none of its own, so the
// optimizer, clipping, master weights, checkpoints and the HF mapping see one tensor and
// autograd sums the gradients of both uses into it. Module::to converts the parameter in
// place (set_data), so the tie survives dtype and device moves.
void tie_head_to_embeddings(torch::nn::Linear& head, const torch::nn::Embedding& embeddings);

}  // namespace hyper_parallel

HP_PUBLIC_END
