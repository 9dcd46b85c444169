// What the unboxed kernels of single-DTensor reductions and views memoise (internal).
//
// A call of one DTensor and static arguments (sum(dim), transpose, unsqueeze ...) whose
// decision moves no input and whose rule leaves the local call alone
// (DistributedOp::leaves_local_call_alone) is just the local op on the piece, its result
// wrapped in the output layout. That layout depends only on the op, the input's layout,
// the static arguments and the context token, so the kernels keep it per input layout
// (layout_memo_slot) and skip the stack, OpCall and key of the general path.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <optional>

#include "hyper_parallel/core/layout.h"

namespace hyper_parallel {

// The call's decision as the general path makes it (from the layout cache, or inferred
// and cached); the output layout when the call is such a local call, nullopt when it must
// take the general path. `stack` holds the call's arguments, unchanged on return.
std::optional<Layout> local_call_output_layout(const c10::OperatorHandle& op, const torch::jit::Stack& stack);

}  // namespace hyper_parallel
