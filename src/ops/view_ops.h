// View and shape ops: reshape/view/flatten (dim groups), permute/transpose/t,
// expand, select/slice and their backwards, split/unbind, cat/stack.
// A shard survives a view when its pieces are still torch.chunk pieces of an output
// dim; otherwise that mesh dim is gathered first. Views are linear: Partial passes.
#pragma once

#include "hyper_parallel/dispatch/distributed_op.h"

namespace hyper_parallel {

// view, _unsafe_view, _reshape_alias, squeeze, unsqueeze, expand (size args rewritten
// to the local output shape).
class ReshapeOp : public DistributedOp {
 public:
  // expanding: expand (a shard survives where the size is kept; sizes are not reshaped).
  explicit ReshapeOp(bool expanding = false) : expanding_(expanding) {}
  std::string class_name() const override { return "ReshapeOp"; }
  std::string rule() const override;
  ShardingDecision infer_layout(const OpCall& call) const override;
  void expand(const OpCall& call, const ShardingDecision& d, torch::jit::Stack& local) const override;
  // squeeze, unsqueeze: no size argument for expand() to rewrite.
  bool leaves_local_call_alone(const OpCall& call, const ShardingDecision&) const override {
    return !call.has_arg("size");
  }

 private:
  bool expanding_;
};

// permute, transpose, t: shards follow their dims.
class PermuteOp : public DistributedOp {
 public:
  // Where the permutation comes from: permute(dims), transpose(dim0, dim1), t().
  enum class Kind { Permute, Transpose, T };
  explicit PermuteOp(Kind kind = Kind::Permute) : kind_(kind) {}
  std::string class_name() const override { return "PermuteOp"; }
  std::string rule() const override { return "Shard(d) -> Shard(position of d in the output)"; }
  ShardingDecision infer_layout(const OpCall& call) const override;
  bool leaves_local_call_alone(const OpCall&, const ShardingDecision&) const override { return true; }

 private:
  Kind kind_;
};

// select, slice, and select_backward / slice_backward (their input_sizes rewritten).
class IndexingViewOp : public DistributedOp {
 public:
  enum class Kind { Select, Slice, SelectBackward, SliceBackward };
  explicit IndexingViewOp(Kind kind = Kind::Select) : kind_(kind) {}
  std::string class_name() const override { return "IndexingViewOp"; }
  std::string rule() const override {
    return "the indexed dim is gathered if sharded; other shards shift with the dims";
  }
  ShardingDecision infer_layout(const OpCall& call) const override;
  void expand(const OpCall& call, const ShardingDecision& d, torch::jit::Stack& local) const override;

 private:
  Kind kind_;
};

// split, split_with_sizes, unbind: every piece keeps the other dims' shards.
class SplitOp : public DistributedOp {
 public:
  // unbind removes the split dim from its pieces; split / split_with_sizes keep it.
  explicit SplitOp(bool removes_dim = false) : removes_dim_(removes_dim) {}
  std::string class_name() const override { return "SplitOp"; }
  std::string rule() const override { return "the split dim is gathered if sharded"; }
  ShardingDecision infer_layout(const OpCall& call) const override;

 private:
  bool removes_dim_;
};

// cat, stack: inputs brought to the first DTensor input's placements, the cat dim
// unsharded.
class ConcatOp : public DistributedOp {
 public:
  // stack adds the new dim; cat joins along an existing one.
  explicit ConcatOp(bool stacking = false) : stacking_(stacking) {}
  std::string class_name() const override { return "ConcatOp"; }
  std::string rule() const override { return "inputs follow the first one; the cat dim is gathered"; }
  ShardingDecision infer_layout(const OpCall& call) const override;

 private:
  bool stacking_;
};

}  // namespace hyper_parallel
