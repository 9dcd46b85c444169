// The dispatcher's fast path for calls on DTensors of one layout (internal).
//
// Most ops of a training step are pointwise on tensors that share a layout: a residual
// add, an activation, an optimizer's update. When the op's rule promises to keep such a
// layout (KeepsACommonLayout, common_layout_rule.h), the call needs no OpCall, no cache key
// and no decision: the local op runs on the pieces and its result gets the operands'
// layout. Every other call takes the general path.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include "dispatch/op_resolution.h"
#include "dtensor/dtensor_impl.h"

namespace hyper_parallel {

// The search for the common layout, one tensor argument at a time.
class CommonLayout {
 public:
  // False when this argument rules the fast path out: a plain tensor (the rule decides
  // how it combines), another layout, or a first layout the promise does not cover.
  bool add(const at::Tensor& t);
  // The first DTensor argument; nullptr before one was added.
  const DTensorImpl* first() const { return first_; }

 private:
  const DTensorImpl* first_ = nullptr;
};

// Runs the call and returns true when its arguments qualify (`res.common_layout_fast_path`
// must be set); returns false, the stack untouched, when they do not.
bool run_on_common_layout(const c10::OperatorHandle& op, const OpResolution& res, torch::jit::Stack* stack);

}  // namespace hyper_parallel
