// The output head's matmul and the cross-entropy in one, vocabulary-parallel and chunked,
// so that the [tokens, V / tp] logits never exist (docs/loss_parallel.md, "Fused linear +
// cross-entropy").
//
//   // weight: the ColwiseParallel head's Shard(0) DTensor [V, dim]; hidden [tokens, dim]
//   at::Tensor loss = hp::fused_linear_cross_entropy(hidden, head->weight, targets);
//   loss.backward();  // gradients of hidden (all-reduced over TP) and of the weight shard
//
// Forward computes the logits one block (token chunk x vocabulary block) at a time and
// keeps per-token statistics only (max, sum of exp, target logit, smoothing sum); the
// ranks exchange them in ONE all-gather for the whole forward, after a small fixed-size one
// in which they agree on the call (tokens, dtype, vocabulary, options). Backward recomputes each
// block's logits, turns them into d loss / d logits in place and accumulates the
// gradients of hidden and weight from it; one all-reduce of the hidden's gradient.
#pragma once

#include <ATen/core/Reduction.h>
#include <ATen/core/Tensor.h>

#include <optional>

#include "hyper_parallel/loss/cross_entropy_definition.h"
#include "hyper_parallel/loss/loss_parallel.h"   // LossParallelLayoutError, LossParallelUnsupportedError
#include "hyper_parallel/loss/vocab_parallel.h"  // Communicator, VocabCrossEntropySaved
#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel {

// The cross-entropy's definition (cross_entropy_definition.h), its class weights and how it runs.
struct FusedLinearCrossEntropyOptions : CrossEntropyDefinition {
  std::optional<at::Tensor> class_weight;  // [V], plain or Replicate; no gradient
  // Block sizes; 0 chooses them so that one block holds about 32 M logits (vocabulary blocks
  // of 4096 classes for bf16/fp16, whose weight gradient is accumulated per block in fp32).
  int64_t chunk_tokens = 0;  // tokens per chunk
  int64_t vocab_block = 0;   // of this rank's classes per block (whole shard for fp32/64)
  // The loss's dtype; unset: hidden's. The loss is computed in float32 for bfloat16/float16
  // hidden either way: ask for float32 to keep a sum of many token losses from being
  // rounded to 8 bits (and the backward from being scaled by a rounded 1 / count).
  std::optional<at::ScalarType> loss_dtype;
};

// hidden: [tokens, dim], a plain tensor (the same on every TP rank) or a Replicate DTensor
// on the weight's mesh. weight: [V, dim], a Shard(0) DTensor on a 1-D mesh (the TP head) or
// a plain tensor (one process). target: [tokens] class indices, plain or Replicate.
// Returns the loss ([tokens] for None, a scalar otherwise) in hidden's dtype (or
// options.loss_dtype): a Replicate
// DTensor when weight is a DTensor. hidden's gradient is its type's: plain for plain,
// Replicate for Replicate. Bad input raises LossParallelLayoutError (layouts),
// LossParallelUnsupportedError (probability targets, gradients of target or class weight)
// or c10::Error naming what was expected, the same on every rank.
at::Tensor fused_linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& target,
                                      const FusedLinearCrossEntropyOptions& options = {});

// The same on plain local pieces and a communicator, as forward/backward with explicit saved
// values (vocab_parallel.h's style; the Python package's op calls these): hidden [tokens, dim]
// and target [tokens] the same on every member, local_weight this member's torch.chunk rows
// of the [V, dim] head. vocab_size < 0: learnt from the members' counts in the call's record.
// Forward returns the loss in hidden's dtype; its checks are the same error on every member.
at::Tensor vocab_parallel_linear_cross_entropy_forward(const at::Tensor& hidden, const at::Tensor& local_weight,
                                                       const at::Tensor& target, const Communicator* comm,
                                                       int64_t vocab_size,
                                                       const FusedLinearCrossEntropyOptions& options,
                                                       VocabCrossEntropySaved* saved);
// {d loss / d hidden (summed over the members: one all-reduce), d loss / d local_weight};
// either undefined when not asked for.
std::vector<at::Tensor> vocab_parallel_linear_cross_entropy_backward(
    const at::Tensor& grad_loss, const at::Tensor& hidden, const at::Tensor& local_weight, const at::Tensor& target,
    const VocabCrossEntropySaved& saved, const Communicator* comm, int64_t vocab_size,
    const FusedLinearCrossEntropyOptions& options, bool hidden_grad, bool weight_grad);

}  // namespace hyper_parallel

HP_PUBLIC_END
