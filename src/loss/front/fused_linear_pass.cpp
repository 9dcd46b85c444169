// fused_linear_pass.h: the fused linear cross-entropy's record, forward and backward, once for
// both of its front ends.
#include "loss/front/fused_linear_pass.h"

#include <ATen/ATen.h>

#include "loss/math/cross_entropy_kernels.h"

namespace hyper_parallel {

FusedCrossEntropy linear_cross_entropy_settings(const LinearLossInputs& in,
                                                const FusedLinearCrossEntropyOptions& options) {
  FusedCrossEntropy ce;
  ce.target = in.target;
  ce.weight = in.class_weight;
  ce.definition = options;
  return ce;
}

LossCallRecord linear_call_record(const std::string& op, const at::Tensor& hidden, const at::Tensor& target,
                                  const FusedLinearCrossEntropyOptions& o, const at::Tensor& class_weight) {
  LossCallRecord call;
  call.op = op;
  // hidden [tokens, dim] (undefined where this rank refused its inputs, which settles first).
  call.rows = hidden.defined() && hidden.dim() >= 1 ? hidden.size(0) : 0;
  call.dtype = static_cast<int64_t>(hidden.defined() ? hidden.scalar_type() : at::kFloat);
  // Ranks whose hidden sizes differ would combine statistics of different products, and
  // all-reduce hidden gradients of different sizes in backward.
  call.hidden_dim = hidden.defined() && hidden.dim() >= 1 ? hidden.size(-1) : -1;
  record_target(call, target, -1);
  call.definition = o;
  call.class_weight = class_weight;
  return call;
}

LinearBlocks linear_cross_entropy_blocks(const FusedLinearCrossEntropyOptions& options, const LinearLossInputs& in) {
  return linear_block_sizes(options.chunk_tokens, options.vocab_block, in.h.size(0), in.w.size(0), in.h.scalar_type());
}

at::Tensor linear_cross_entropy_forward(FusedCrossEntropy& ce, const LinearLossInputs& in, const LinearBlocks& blocks,
                                        LossCallPlan& call) {
  const at::ScalarType ct = compute_type(in.h.scalar_type());
  const int64_t T = in.h.size(0);
  fused_cross_entropy_prepare(ce, T, in.shard, in.h.options().dtype(ct));
  const at::Tensor stats = call.statistics(T, in.h.options().dtype(ct),
                                           [&] { return linear_block_stats(ce, in.h, in.w, in.shard, blocks); });
  // The forward's one collective (an all-gather of 5 x tokens values), and the loss.
  return fused_cross_entropy_combine(ce, stats, in.shard, call.inputs());
}

std::pair<at::Tensor, at::Tensor> linear_cross_entropy_backward(const FusedCrossEntropy& ce, const LinearLossInputs& in,
                                                                const LinearBlocks& blocks, const at::Tensor& grad_loss,
                                                                bool want_h, bool want_w) {
  const FusedCrossEntropyCoefficients co = fused_cross_entropy_coefficients(ce, grad_loss, in.shard);
  return linear_block_gradients(ce, co, in.h, in.w, in.shard, blocks, want_h, want_w);
}

}  // namespace hyper_parallel
