// The head's matmul one logits block (token chunk x vocabulary block) at a time, for the
// fused linear losses (fused_linear_cross_entropy, vocab_parallel_linear_logprobs): the
// [tokens, V / tp] logits never exist (internal). Forward keeps per-token statistics only;
// backward recomputes each block, turns it into d loss / d logits in place and accumulates
// the gradients of hidden and of this rank's weight rows.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <tuple>
#include <utility>

#include <string>

#include "loss/call/class_sharding.h"
#include "loss/math/fused_cross_entropy.h"

namespace hyper_parallel {

// The head of a fused linear loss, as its DTensor entries take it: the weight [V, dim] the
// ColwiseParallel head's Shard(0) DTensor on a 1-D mesh (or a plain tensor: one process), and
// hidden a plain tensor or a Replicate DTensor on the weight's mesh.
struct LinearHead {
  at::Tensor h, w;                                     // local pieces
  ClassShard shard;                                    // this rank's rows of the weight
  c10::optional<Layout> hidden_layout, weight_layout;  // set for DTensor inputs
};
// The head of `hidden` and `weight`; anything else is a LossParallelLayoutError naming `op` (or
// a c10::Error for a weight that is not 2-D). Layouts are global: every rank refuses alike.
LinearHead linear_head(const at::Tensor& hidden, const at::Tensor& weight, const std::string& op);
// "a DTensor [Shard(0)] on <mesh> of shape [..]" or "a plain tensor of shape [..]", for messages.
std::string describe_input(const at::Tensor& t);

// A refusing rank's stand-ins for hidden [T, D], its weight rows [V_l, D] (empty where either is
// not 2-D) and targets all ignore_index: blocks that touch nothing, so that it joins the
// forward's collectives (LossCallPlan's placeholders).
std::tuple<at::Tensor, at::Tensor, at::Tensor> linear_placeholders(const at::Tensor& hidden,
                                                                   const at::Tensor& local_weight,
                                                                   int64_t ignore_index);

struct LinearBlocks {
  int64_t tokens, vocab;  // per block
};

// Logits per block when the caller does not choose: 32 M (128 MiB in fp32), a few percent of
// the unfused logits at LLM sizes while keeping each matmul large.
constexpr int64_t kLinearBlockElements = int64_t{1} << 25;

// chunk_tokens / vocab_block as the options give them (0: automatic, so that one block holds
// about `block_elements` logits; vocabulary blocks of 4096 classes for bf16/fp16, whose weight
// gradient is accumulated per block in fp32).
LinearBlocks linear_block_sizes(int64_t chunk_tokens, int64_t vocab_block, int64_t tokens, int64_t local_classes,
                                at::ScalarType dtype, int64_t block_elements = kLinearBlockElements);

// The statistics [kStats, T] of the logits h [T, D] x w [V_l, D]^T under `ce` (its per-row
// bookkeeping prepared), blocks merged. No collective.
at::Tensor linear_block_stats(const FusedCrossEntropy& ce, const at::Tensor& h, const at::Tensor& w,
                              const ClassShard& shard, const LinearBlocks& blocks);

// {d loss / d h (summed over shard.comm: one all-reduce), d loss / d w} for the per-row
// coefficients `co`; either undefined when not wanted.
std::pair<at::Tensor, at::Tensor> linear_block_gradients(const FusedCrossEntropy& ce,
                                                         const FusedCrossEntropyCoefficients& co, const at::Tensor& h,
                                                         const at::Tensor& w, const ClassShard& shard,
                                                         const LinearBlocks& blocks, bool want_h, bool want_w);

}  // namespace hyper_parallel
