// Matrix products (mm, bmm, addmm): per mesh dim, the cheapest strategy among
// rows / columns / contraction (-> Partial) / partial passthrough / replicate, given
// where the operands already are. See ops/matrix.yaml.
#pragma once

#include "hyper_parallel/distributed_op.h"

namespace hyper_parallel {

class MatmulOp : public DistributedOp {
 public:
  std::string class_name() const override { return "MatmulOp"; }
  std::string rule() const override;
  ShardingDecision infer_layout(const OpCall& call) const override;
};

}  // namespace hyper_parallel
