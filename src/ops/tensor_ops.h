// Ops whose output has the input's layout: clone, _to_copy, *_like, fill_, zero_.
// Ops that overwrite every value (ones_like, fill_) cannot keep a Partial: their
// output is Replicate on that mesh dim, as in PyTorch.
#pragma once

#include "dispatch/common_layout_rule.h"
#include "hyper_parallel/dispatch/distributed_op.h"

namespace hyper_parallel {

// Keeps a common layout: without Partial, self's placements are kept either way, and a
// second tensor argument (fill_'s value) of self's layout is 0-d, so already replicated.
class SameLayoutOp : public DistributedOp, public KeepsACommonLayout {
 public:
  explicit SameLayoutOp(bool overwrites_values) : overwrites_values_(overwrites_values) {}
  std::string class_name() const override { return "SameLayoutOp"; }
  std::string rule() const override;
  ShardingDecision infer_layout(const OpCall& call) const override;
  const std::type_info& promised_by() const override { return typeid(SameLayoutOp); }

 private:
  bool overwrites_values_;
};

// new_empty / new_zeros / new_ones / new_full: a replicated tensor of the requested
// size (self only lends its dtype and device).
class NewTensorOp : public DistributedOp {
 public:
  std::string class_name() const override { return "NewTensorOp"; }
  std::string rule() const override { return "output Replicate of the requested size"; }
  ShardingDecision infer_layout(const OpCall& call) const override;
};

}  // namespace hyper_parallel
