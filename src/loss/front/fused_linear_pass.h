// The fused linear cross-entropy's passes over validated inputs (internal): the record its call
// compares, the forward (statistics one logits block at a time, the one all-gather, the loss)
// and the backward (the gradients of hidden and of this rank's weight rows). Its DTensor op
// (fused_linear_cross_entropy.cpp) and its function on local pieces
// (vocab_parallel_linear_cross_entropy.cpp) differ only in how they get their inputs.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>

#include "hyper_parallel/loss/fused_linear_loss.h"
#include "loss/call/call_agreement.h"
#include "loss/call/loss_call_plan.h"
#include "loss/front/fused_linear_inputs.h"
#include "loss/math/fused_cross_entropy.h"
#include "loss/math/linear_blocks.h"

namespace hyper_parallel {

// The fused cross-entropy's settings and inputs for `in` (its per-row bookkeeping not done yet).
FusedCrossEntropy linear_cross_entropy_settings(const LinearLossInputs& in,
                                                const FusedLinearCrossEntropyOptions& options);

// The record agree_on_call compares for this loss: hidden's tokens, size and dtype, the
// target's kind and shape, the options, the class weight (LossCallPlan adds the classes).
LossCallRecord linear_call_record(const std::string& op, const at::Tensor& hidden, const at::Tensor& target,
                                  const FusedLinearCrossEntropyOptions& o, const at::Tensor& class_weight);

// The blocks `options` give for `in`.
LinearBlocks linear_cross_entropy_blocks(const FusedLinearCrossEntropyOptions& options, const LinearLossInputs& in);

// Forward: the per-token statistics of this rank's classes, one logits block at a time, while
// `call`'s record travels, then the one all-gather (carrying call.inputs() where given) and the
// loss, compute type.
at::Tensor linear_cross_entropy_forward(FusedCrossEntropy& ce, const LinearLossInputs& in, const LinearBlocks& blocks,
                                        LossCallPlan& call);

// The gradients of hidden (summed over the ranks: one all-reduce) and of this rank's weight
// rows, local pieces, for the incoming loss gradient `grad_loss` (a plain tensor).
std::pair<at::Tensor, at::Tensor> linear_cross_entropy_backward(const FusedCrossEntropy& ce, const LinearLossInputs& in,
                                                                const LinearBlocks& blocks, const at::Tensor& grad_loss,
                                                                bool want_h, bool want_w);

}  // namespace hyper_parallel
