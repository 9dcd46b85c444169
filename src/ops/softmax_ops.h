// Softmax family outside loss_parallel: the softmax dim must be whole on every rank,
// so a shard on it is gathered first (loss_parallel routes the class-sharded case to
// its distributed kernels instead). Partial inputs are reduced; other shards stay.
#pragma once

#include "hyper_parallel/dispatch/distributed_op.h"

namespace hyper_parallel {

class SoftmaxOp : public DistributedOp {
 public:
  std::string class_name() const override { return "SoftmaxOp"; }
  std::string rule() const override {
    return "the softmax dim is gathered if sharded; other shards stay; Partial reduced";
  }
  ShardingDecision infer_layout(const OpCall& call) const override;
};

}  // namespace hyper_parallel
