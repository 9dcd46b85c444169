// Reductions (sum, mean, amax, amin, max.dim ...): a reduction over a sharded dim
// leaves each rank with a partial result -> Partial(op); other shards shift to the
// output's dims; Partial(sum) inputs pass through linear reductions (sum, mean).
#pragma once

#include <optional>

#include "hyper_parallel/dispatch/distributed_op.h"

namespace hyper_parallel {

class ReductionOp : public DistributedOp {
 public:
  // partial_op: the Partial a reduction over a sharded dim produces; nullopt when the
  // op cannot combine partial results (mean over uneven pieces, indices of max.dim):
  // such dims are gathered first. linear: Partial(sum) inputs pass through.
  // is_mean: a mean over a sharded dim becomes Partial(sum) of local means scaled by
  // local/global counts (no gather).
  ReductionOp(std::optional<ReduceOp> partial_op, bool linear, bool is_mean = false)
      : partial_op_(partial_op), linear_(linear), is_mean_(is_mean) {}
  std::string class_name() const override { return "ReductionOp"; }
  std::string rule() const override;
  ShardingDecision infer_layout(const OpCall& call) const override;
  void finalize(const OpCall& call, const ShardingDecision& d, const torch::jit::Stack& local_args,
                torch::jit::Stack& local_results) const override;
  // Everything but a mean over a sharded dim, which finalize() rescales.
  bool leaves_local_call_alone(const OpCall&, const ShardingDecision& d) const override { return d.expand_tag != 1; }

 private:
  std::optional<ReduceOp> partial_op_;
  bool linear_;
  bool is_mean_;
};

// The dims a reduction call reduces (from `dim`, normalised), all when absent/empty.
std::vector<int64_t> reduced_dims(const OpCall& call, int64_t ndim);
bool keeps_dims(const OpCall& call);

}  // namespace hyper_parallel
