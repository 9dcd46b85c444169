// What a training loop needs of a decoder-only language model, whatever its family: the
// logits or the final hidden states of a token batch, the head's weight (for a fused
// linear + cross-entropy that never makes the logits), a seeded initialisation, hooks around
// its blocks (sharded data parallelism), and its sizes. Every family's module implements
// it (Llama's, Qwen3's and Gemma 2's through the decoder shell, decoder_model.h), so
// hp-train's Trainer holds a module and this interface and names no model. The family also says what a token costs to
// train (its FLOPs, for MFU).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>

#include "hyper_parallel/nn/activation_checkpoint.h"
#include "hyper_parallel/nn/block_hooks.h"
#include "hyper_parallel/models/decoder_sizes.h"
#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace torch::nn {
class Module;
}

namespace hyper_parallel {

class CausalLanguageModel {
 public:
  virtual ~CausalLanguageModel() = default;
  // tokens [batch, seq] -> logits [batch, seq, vocab] (a Shard(-1) DTensor under loss
  // parallel), before any final soft-capping (final_logit_softcap: the loss applies it).
  virtual at::Tensor logits(const at::Tensor& tokens) = 0;
  // What the head reads [batch, seq, dim] (a Shard(1) DTensor under sequence parallel).
  virtual at::Tensor hidden_states(const at::Tensor& tokens) = 0;
  // The head's weight [vocab, dim] (the embeddings' when tied; Shard(0) under TP).
  virtual at::Tensor head_weight() const = 0;
  // The same weights on every rank from a seed, independent of the global RNG.
  virtual void init_weights(uint64_t seed) = 0;
  // Called around each block's forward and backward (block_hooks.h); nullptr: none.
  virtual void set_block_hooks(std::shared_ptr<BlockHooks> hooks) = 0;
  // Which blocks recompute their activations in backward (activation_checkpoint.h); none
  // until set.
  virtual void set_block_checkpointing(const BlockCheckpointing& policy) = 0;
  // The resolved sizes (n_kv_heads, head_dim and ffn_hidden_dim as the model uses them).
  virtual DecoderSizes sizes() const = 0;
  // > 0: the logits become cap * tanh(logits / cap) before the loss (Gemma 2).
  virtual double final_logit_softcap() const { return 0.0; }
  // The FLOPs of training on one token (forward and backward) in sequences of seq_len, as
  // TorchTitan counts them for MFU (its get_nparams_and_flops); recomputation not counted.
  virtual int64_t flops_per_token(int64_t seq_len) const = 0;
};

// TorchTitan's count for a dense decoder (get_dense_model_nparams_and_flops):
// 6 x the parameters a token's matmuls read (2 FLOPs per multiply-add, forward once and
// backward twice) + 12 x attention_layers x n_heads x head_dim x seq_len (the scores q.k and
// the weighted values, each 2 x head_dim x seq_len per head forward, twice that backward;
// the causal mask's skipped half counted, as TorchTitan does). The matmul parameters are
// every parameter of `model` once (a tied one once) but the token embedding's, a lookup,
// unless the head reads it (tied: it counts, as in TorchTitan).
int64_t dense_decoder_flops_per_token(const torch::nn::Module& model, const at::Tensor& token_embedding,
                                      bool tied_embeddings, int64_t attention_layers, int64_t n_heads, int64_t head_dim,
                                      int64_t seq_len);

// cap * tanh(x / cap) in transformers' order of operations; cap 0 returns x. A family's
// final_logit_softcap, applied where the loss does not apply it (a plain tensor's logits).
at::Tensor soft_cap(const at::Tensor& x, double cap);

// `module` as the language model it is; std::invalid_argument naming the module otherwise.
CausalLanguageModel& as_causal_lm(torch::nn::Module& module);
const CausalLanguageModel& as_causal_lm(const torch::nn::Module& module);

}  // namespace hyper_parallel

HP_PUBLIC_END
