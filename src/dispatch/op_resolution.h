// OpResolution: what OpDispatcher does with one ATen operator (one exact overload),
// worked out once per operator and thread, not once per call (internal).
//
// For every OperatorHandle the dispatcher needs: the bypass handler, the context routes
// that claim the op, the layout rule, and which arguments the op writes into. Finding
// them means string building and locked registry lookups; here they are done on the
// first call and kept in a thread-local table keyed by the operator, so the hot path
// takes no lock. Registry changes (rules, routes, loss_parallel op names) bump a
// generation counter; a thread drops its table when it sees a new generation.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dispatch/bypass_ops.h"
#include "hyper_parallel/dispatch/dispatch.h"
#include "hyper_parallel/dispatch/distributed_op.h"

namespace hyper_parallel {

struct OpResolution {
  std::string name;                                // get_op_name(op): no namespace, no overload
  BypassHandler bypass = nullptr;                  // set: the bypass handler takes every call
  std::vector<OpDispatcher::ContextRoute> routes;  // the context routes that claim this op
  // The rule: the one registered for "name.overload" if any, else for "name", else (for an
  // in-place op foo_) the functional op's "foo". Nullptr: no rule.
  DistributedOpPtr rule;
  std::string rule_name;      // the registry name the rule was found under
  bool inplace_view = false;  // transpose_, squeeze_ ...: changes self's layout
  // Per schema return: the argument it writes into (in-place self, out=), if any.
  std::vector<std::optional<size_t>> written_argument;
  bool writes = false;  // any return writes into an argument
  // The rule keeps a common layout (KeepsACommonLayout) and nothing
  // else claims the op: calls on DTensors of one layout may take the fast path.
  bool common_layout_fast_path = false;
};

// Resolves on first use. Shared, because a nested dispatch may see a registry change
// and drop the table while an outer call still uses its entry.
std::shared_ptr<const OpResolution> resolve_op(const c10::OperatorHandle& op);
// resolve_op(op)->common_layout_fast_path without copying the entry (unboxed kernels).
bool takes_common_layout_fast_path(const c10::OperatorHandle& op);

// Every thread re-resolves its operators on next use (call after any registry change).
void invalidate_op_resolutions();
// Bumped by invalidate_op_resolutions(): what a memo of a resolution is checked against.
uint64_t op_resolution_generation();

}  // namespace hyper_parallel
