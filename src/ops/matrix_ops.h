// Matrix products (mm, bmm, addmm): per mesh dim, the cheapest strategy among
// rows / columns / contraction (-> Partial) / partial passthrough / replicate, given
// where the operands already are. See ops/matrix.yaml.
#pragma once

#include "hyper_parallel/dispatch/distributed_op.h"

namespace hyper_parallel {

class MatmulOp : public DistributedOp {
 public:
  // The operand order of the schema: mm(a, b), bmm(a, b) batched, addmm(bias, a, b).
  enum class Form { Mm, Bmm, Addmm };
  explicit MatmulOp(Form form = Form::Mm) : form_(form) {}

  std::string class_name() const override { return "MatmulOp"; }
  std::string rule() const override;
  ShardingDecision infer_layout(const OpCall& call) const override;

 private:
  Form form_;
};

}  // namespace hyper_parallel
