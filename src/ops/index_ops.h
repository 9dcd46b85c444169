// Index ops. gather along a sharded dim with replicated indices is a masked local
// gather whose rows of ids owned elsewhere are zero -> Partial(sum) (the log-prob
// gather of DPO-style losses on class-sharded log-probs). scatter / scatter_add /
// index_select work on replicated inputs.
#pragma once

#include "hyper_parallel/dispatch/distributed_op.h"

namespace hyper_parallel {

class GatherOp : public DistributedOp {
 public:
  std::string class_name() const override { return "GatherOp"; }
  std::string rule() const override {
    return "self Shard(dim) + index Replicate -> Partial(sum) (masked local gather); otherwise "
           "shards off dim kept when index matches, else replicated";
  }
  ShardingDecision infer_layout(const OpCall& call) const override;
  void expand(const OpCall& call, const ShardingDecision& d, torch::jit::Stack& local) const override;
  void finalize(const OpCall& call, const ShardingDecision& d, const torch::jit::Stack& local_args,
                torch::jit::Stack& local_results) const override;
};

// Every DTensor input replicated, outputs replicated (shapes from a meta run).
class ReplicatedOp : public DistributedOp {
 public:
  std::string class_name() const override { return "ReplicatedOp"; }
  std::string rule() const override { return "inputs replicated; outputs Replicate"; }
  ShardingDecision infer_layout(const OpCall& call) const override;
};

}  // namespace hyper_parallel
