// The rule registry's internal side (internal). op_dispatcher.cpp owns the registry; its
// public side (register_distributed_op, find_distributed_op ...) is in hyper_parallel/dispatch.h.
#pragma once

#include <string>
#include <vector>

#include "hyper_parallel/dispatch.h"

namespace hyper_parallel {

// The context routes whose claim accepts `op_name`, in the order they were added.
std::vector<OpDispatcher::ContextRoute> context_routes_claiming(const std::string& op_name);

// Records which YAML file (or plugin) declared `op_name`, for distributed_op_origins().
void set_distributed_op_origin(const std::string& op_name, const std::string& origin);

}  // namespace hyper_parallel
