// The fused linear losses' inputs, validated (internal): on DTensors (the head's rows
// class-sharded) and as plain local pieces; and their gradients laid out as the inputs were.
// The cross-entropy's front ends run these inside LossCallPlan's checks.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <string>
#include <vector>

#include "hyper_parallel/core/layout.h"
#include "hyper_parallel/loss/fused_linear_loss.h"
#include "loss/call/class_sharding.h"
#include "loss/call/loss_input_checks.h"
#include "loss/math/linear_blocks.h"

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

// A fused linear loss's DTensor entry's head (linear_head), once hidden, weight and target are
// all given (else c10::Error, or c10::ValueError for OptionErrorKind::value_error, naming `op`).
LinearHead given_linear_head(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& target,
                             const std::string& op, OptionErrorKind kind);

// The gradients gh of hidden and gw of the weight rows (local pieces) as autograd hands them
// back: laid out as their inputs were (DTensors where a layout is given), undefined where the
// input wants none.
std::vector<at::Tensor> head_gradients(const at::Tensor& gh, const at::Tensor& gw, bool want_h, bool want_w,
                                       const c10::optional<Layout>& hidden_layout,
                                       const c10::optional<Layout>& weight_layout);

}  // namespace hyper_parallel
