// Ops whose output has the input's layout: clone, _to_copy, *_like, fill_, zero_.
// Ops that overwrite every value (ones_like, fill_) cannot keep a Partial: their
// output is Replicate on that mesh dim, as in PyTorch.
#pragma once

#include "hyper_parallel/distributed_op.h"

namespace hyper_parallel {

class SameLayoutOp : public DistributedOp {
 public:
  explicit SameLayoutOp(bool overwrites_values) : overwrites_values_(overwrites_values) {}
  std::string class_name() const override { return "SameLayoutOp"; }
  std::string rule() const override;
  ShardingDecision infer_layout(const OpCall& call) const override;

 private:
  bool overwrites_values_;
};

}  // namespace hyper_parallel
