// The fused linear cross-entropy's inputs, validated (internal): on DTensors (the head's rows
// class-sharded) and as plain local pieces. Both front ends run these inside LossCallPlan's checks.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include "hyper_parallel/core/layout.h"
#include "hyper_parallel/loss/fused_linear_loss.h"
#include "loss/call/class_sharding.h"

namespace hyper_parallel {

// Where the inputs live and how the vocabulary is split, after validation.
struct LinearLossInputs {
  at::Tensor h, w, target;  // local pieces: [T, D], [V_l, D], [T] int64
  c10::optional<at::Tensor> class_weight;
  ClassShard shard;
  c10::optional<Layout> weight_layout, hidden_layout;  // set for DTensor inputs
};

// hidden [T, D] and the head's weight [V, D] (DTensors, or plain tensors on one process), a
// target [T] of class indices, the options: their local pieces and the head's class shard.
LinearLossInputs validate_inputs(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& target,
                                 const FusedLinearCrossEntropyOptions& o);

// Plain local pieces (vocab_parallel.h's style): hidden [T, D] and target [T] the same on
// every rank, weight [V_l, D] this rank's torch.chunk rows of the [V, D] head. Checks only:
// `in` gets the shard `piece`.
LinearLossInputs local_inputs(const at::Tensor& hidden, const at::Tensor& local_weight, const at::Tensor& target,
                              const FusedLinearCrossEntropyOptions& o, const ClassShard& piece);

}  // namespace hyper_parallel
