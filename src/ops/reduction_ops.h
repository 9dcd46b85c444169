// Reductions (sum, mean, amax, amin, max.dim ...): a reduction over a sharded dim
// leaves each rank with a partial result -> Partial(op); other shards shift to the
// output's dims; Partial(sum) inputs pass through linear reductions (sum, mean).
#pragma once

#include <optional>

#include "hyper_parallel/distributed_op.h"

namespace hyper_parallel {

class ReductionOp : public DistributedOp {
 public:
  // partial_op: the Partial a reduction over a sharded dim produces; nullopt when the
  // op cannot combine partial results (mean over uneven pieces, indices of max.dim):
  // such dims are gathered first. linear: Partial(sum) inputs pass through.
  ReductionOp(std::optional<ReduceOp> partial_op, bool linear)
      : partial_op_(partial_op), linear_(linear) {}
  std::string class_name() const override { return "ReductionOp"; }
  std::string rule() const override;
  ShardingDecision infer_layout(const OpCall& call) const override;

 private:
  std::optional<ReduceOp> partial_op_;
  bool linear_;
};

// The dims a reduction call reduces (from `dim`, normalised), all when absent/empty.
std::vector<int64_t> reduced_dims(const OpCall& call, int64_t ndim);
bool keeps_dims(const OpCall& call);

}  // namespace hyper_parallel
