// KeepsACommonLayout: the promise a built-in rule makes to the dispatcher's fast path (internal).
//
// A DistributedOp class that also derives from this one promises: when every tensor
// argument of a call is a DTensor of one and the same layout, contiguous, without Partial
// placements and without two mesh dims sharding one tensor dim, its infer_layout asks for
// no redistribution and gives the one output that same layout, and its expand() and
// finalize() change nothing. Such calls then run on the local pieces without the rule
// being asked (common_layout_fast_path.h). Internal: a promise that is easy to get
// subtly wrong is not offered to plugins; their rules are always asked.
#pragma once

#include <typeinfo>

#include "hyper_parallel/dispatch/distributed_op.h"

namespace hyper_parallel {

class KeepsACommonLayout {
 public:
  virtual ~KeepsACommonLayout() = default;
  // The class that made the promise: `typeid(TheClass)`. A subclass inherits the base,
  // not the promise (RandomOp derives from SameLayoutOp and draws its values in
  // finalize()), so the promise holds only for rules of exactly this class.
  virtual const std::type_info& promised_by() const = 0;
};

// True when `rule`'s own class made the promise.
inline bool keeps_a_common_layout(const DistributedOp& rule) {
  const auto* promise = dynamic_cast<const KeepsACommonLayout*>(&rule);
  return promise && typeid(rule) == promise->promised_by();
}

}  // namespace hyper_parallel
