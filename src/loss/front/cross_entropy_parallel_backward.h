// The custom autograd node of loss_parallel's fused cross_entropy (K3, internal): the
// gradient with respect to the class-sharded logits, with no collective and no context.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <cstdint>
#include <string>
#include <vector>

#include "loss/call/class_sharding.h"
#include "loss/math/fused_cross_entropy.h"

namespace hyper_parallel {

// The gradient of the cross entropy with respect to the class-sharded logits. Holds the
// logits' rows, the per-row log-sum-exp and weights: everything backward needs, so it
// runs without a collective and without the loss_parallel context. With
// gradient_in_forward it holds the gradient already written over the logits instead.
struct CrossEntropyParallelBackward : torch::autograd::Node {
  FusedCrossEntropy ce;
  ClassSharding sharding;
  std::vector<int64_t> local_shape;  // of the local logits
  // The global mean on a mesh whose other dims shard the rows (strict = false): the kernel
  // summed, the loss was divided by the global denominator; its inverse scales the gradient.
  at::Tensor mean_scale;
  // The logits whose rows `ce` keeps, saved so that an in-place change between forward and
  // backward raises LibTorch's usual error instead of giving the gradient of other logits.
  torch::autograd::SavedVariable saved_logits;

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override;

  // gradient_in_forward: the first backward scales the stored gradient in place and hands
  // out its storage; a later one (through a retained graph) gets a new tensor, the stored
  // gradient times the ratio of its incoming gradient to the first one, so that backwards
  // accumulate as ATen's do. Where that ratio does not exist, or someone wrote the storage
  // since, it raises instead of giving a wrong gradient.
  at::Tensor gradient_written_in_forward(const at::Tensor& grad_loss, const ClassShard& shard);

  // gradient_in_forward: the incoming gradient the first backward scaled the stored gradient
  // by ([M], compute type; undefined before it), and the storage's version after our last
  // write: a later write by anyone else makes the stored gradient unusable.
  at::Tensor grad_applied;
  int64_t grad_version = 0;
  std::string name() const override { return "hyper_parallel::CrossEntropyParallelBackward"; }
  void release_variables() override;
};

// Makes loss `out` differentiable in `logits` (the DTensor cross_entropy_parallel was given)
// through a CrossEntropyParallelBackward holding `ce` (its rows and per-row values, or the
// gradient written over the logits), the sharding and the global mean's scale (or undefined).
void attach_cross_entropy_parallel_backward(const at::Tensor& out, const at::Tensor& logits, FusedCrossEntropy&& ce,
                                            const ClassSharding& sharding, const at::Tensor& mean_scale);

}  // namespace hyper_parallel
