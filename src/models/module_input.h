// The inputs of a block's parallelized sub-modules, converted once for the modules that
// share them (the families' attention and MLP forwards).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <initializer_list>

#include "hyper_parallel/dtensor/dtensor.h"
#include "hyper_parallel/nn/parallel_style.h"

namespace hyper_parallel {

// The input several parallelized modules consume, converted to their input layout once.
// Under ColwiseParallel each consumer's input gradient is Partial: fed the same DTensor,
// autograd sums their Partial gradients locally (a linear op) and the conversion's
// backward reduces the sum with ONE all-reduce, where converting per module issued one
// all-reduce each (3 for q/k/v, 2 for w1/w3). The sum is the same up to float rounding
// order. Returns `x` unchanged when the modules are not parallelized alike.
inline at::Tensor shared_input(const at::Tensor& x, std::initializer_list<const torch::nn::Module*> consumers) {
  if (is_dtensor(x)) return x;
  const ModuleLayouts* first = nullptr;
  for (const torch::nn::Module* m : consumers) {
    const ModuleLayouts* l = module_layouts(*m);
    if (!l || l->use_local_input) return x;
    if (!first) {
      first = l;
    } else if (!(l->mesh == first->mesh) || l->input_layouts != first->input_layouts ||
               l->desired_input != first->desired_input) {
      return x;
    }
  }
  return first ? prepare_module_input(*first, x) : x;
}

// The input of a module whose forward takes more than the tensor (attention takes the
// rotary tables too), converted by its PrepareModuleInput when it has one: under
// sequence parallel, ONE all-gather of the Shard(1) norm output that q/k/v (or w1/w3)
// then share, and one reduce-scatter of their summed Partial gradients in backward.
inline at::Tensor module_input(const torch::nn::Module& module, const at::Tensor& x) {
  const ModuleLayouts* l = module_layouts(module);
  return l ? prepare_module_input(*l, x) : x;
}

}  // namespace hyper_parallel
