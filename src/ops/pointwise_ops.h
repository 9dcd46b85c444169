// Pointwise ops (add, mul, gelu, where ...): per mesh dim, the output is sharded where an
// input's shard lands under broadcasting, Partial where the op is linear in its Partial
// inputs, or replicated, whichever the cost model finds moves the fewest bytes.
#pragma once

#include "dispatch/common_layout_rule.h"
#include "hyper_parallel/dispatch/distributed_op.h"

namespace hyper_parallel {

// Keeps a common layout: equal shapes broadcast to themselves, each Shard lands where it is.
class PointwiseOp : public DistributedOp, public KeepsACommonLayout {
 public:
  // How Partial(sum) inputs may pass through unreduced:
  //   None            never: partial inputs are reduced first (gelu, exp, max ...)
  //   Unary           f(sum x_i) = sum f(x_i) for the one tensor input (neg, clone)
  //   Additive        any Partial(sum) inputs; the other tensor inputs become Partial(sum)
  //                   (kept on one rank), but not with a Scalar addend (add, sub)
  //   Multiplicative  exactly one Partial(sum) input (mul)
  //   Quotient        exactly one Partial(sum) input, the numerator (div)
  enum class Linearity { None, Unary, Additive, Multiplicative, Quotient };
  explicit PointwiseOp(Linearity linearity = Linearity::None) : linearity_(linearity) {}

  std::string class_name() const override { return "PointwiseOp"; }
  std::string rule() const override;
  ShardingDecision infer_layout(const OpCall& call) const override;
  const std::type_info& promised_by() const override { return typeid(PointwiseOp); }

  static Linearity parse_linearity(const std::string& s);

 private:
  Linearity linearity_;
};

}  // namespace hyper_parallel
