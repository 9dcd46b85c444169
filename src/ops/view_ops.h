// View and shape ops: reshape/view/flatten (dim groups), permute/transpose/t,
// expand, select/slice and their backwards, split/unbind, cat/stack.
// A shard survives a view when its pieces are still torch.chunk pieces of an output
// dim; otherwise that mesh dim is gathered first. Views are linear: Partial passes.
#pragma once

#include "hyper_parallel/distributed_op.h"

namespace hyper_parallel {

// view, _unsafe_view, _reshape_alias, squeeze, unsqueeze, expand (size args rewritten
// to the local output shape).
class ReshapeOp : public DistributedOp {
 public:
  std::string class_name() const override { return "ReshapeOp"; }
  std::string rule() const override;
  ShardingDecision infer_layout(const OpCall& call) const override;
  void expand(const OpCall& call, const ShardingDecision& d, torch::jit::Stack& local) const override;
};

// permute, transpose, t: shards follow their dims.
class PermuteOp : public DistributedOp {
 public:
  std::string class_name() const override { return "PermuteOp"; }
  std::string rule() const override { return "Shard(d) -> Shard(position of d in the output)"; }
  ShardingDecision infer_layout(const OpCall& call) const override;
};

// select, slice, and select_backward / slice_backward (their input_sizes rewritten).
class IndexingViewOp : public DistributedOp {
 public:
  std::string class_name() const override { return "IndexingViewOp"; }
  std::string rule() const override {
    return "the indexed dim is gathered if sharded; other shards shift with the dims";
  }
  ShardingDecision infer_layout(const OpCall& call) const override;
  void expand(const OpCall& call, const ShardingDecision& d, torch::jit::Stack& local) const override;
};

// split, split_with_sizes, unbind: every piece keeps the other dims' shards.
class SplitOp : public DistributedOp {
 public:
  std::string class_name() const override { return "SplitOp"; }
  std::string rule() const override { return "the split dim is gathered if sharded"; }
  ShardingDecision infer_layout(const OpCall& call) const override;
};

// cat, stack: inputs brought to the first DTensor input's placements, the cat dim
// unsharded.
class ConcatOp : public DistributedOp {
 public:
  std::string class_name() const override { return "ConcatOp"; }
  std::string rule() const override { return "inputs follow the first one; the cat dim is gathered"; }
  ShardingDecision infer_layout(const OpCall& call) const override;
};

}  // namespace hyper_parallel
