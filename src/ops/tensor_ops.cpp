#include "ops/tensor_ops.h"

#include <c10/util/Exception.h>

#include "core/redistribute.h"

namespace hyper_parallel {

std::string SameLayoutOp::rule() const {
  return overwrites_values_ ? "output has self's layout, Partial -> Replicate"
                            : "output has self's layout (Partial kept)";
}

ShardingDecision SameLayoutOp::infer_layout(const OpCall& call) const {
  const TensorArg& self = call.tensors().at(0);
  TORCH_CHECK(self.layout, call.name(), ": expected self to be a DTensor");
  Placements out = self.layout->placements();
  if (overwrites_values_) {
    TORCH_CHECK(!call.is_inplace() || !self.layout->has_partial(), call.name(),
                ": cannot overwrite a Partial DTensor in place; redistribute it first");
    out = partial_to_replicate(out);
  }
  ShardingDecision d;
  d.input_placements.assign(call.tensors().size(), std::nullopt);
  // Any other tensor argument (fill_.Tensor's value) must be replicated.
  for (size_t k = 1; k < call.tensors().size(); ++k) {
    if (call.tensors()[k].layout) {
      d.input_placements[k] = Placements(call.mesh().ndim(), Placement::replicate());
    }
  }
  d.output_layouts.push_back({Layout(call.mesh(), out, self.shape.vec(), self.layout->stride())});
  return d;
}

ShardingDecision NewTensorOp::infer_layout(const OpCall& call) const {
  ShardingDecision d;
  d.input_placements.assign(call.tensors().size(), std::nullopt);
  const Placements rep(call.mesh().ndim(), Placement::replicate());
  d.output_layouts.push_back({Layout(call.mesh(), rep, call.arg("size").toIntVector())});
  return d;
}

HP_REGISTER_OP_CLASS(SameLayoutOp, [](const OpParams& p) {
  return std::make_shared<SameLayoutOp>(p.get_bool("overwrites_values", false));
});
HP_REGISTER_OP_CLASS(NewTensorOp, [](const OpParams&) { return std::make_shared<NewTensorOp>(); });

}  // namespace hyper_parallel
