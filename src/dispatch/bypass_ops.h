// Bypass ops: the first link of OpDispatcher's chain (internal). Ops that need no
// layout rule — they keep the layout (detach, alias), read a value (item, equal) or
// move data between layouts (copy_) — handled directly.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <string>

namespace hyper_parallel {

using BypassHandler = void (*)(const c10::OperatorHandle&, torch::jit::Stack*);
// nullptr when `name` is not a bypass op. Looked up once per operator (op_resolution).
BypassHandler find_bypass_op(const std::string& name);

}  // namespace hyper_parallel
