// The rule registry's internal side (internal). op_dispatcher.cpp owns the registry; its
// public side (register_distributed_op, find_distributed_op ...) is in hyper_parallel/dispatch/dispatch.h.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "hyper_parallel/dispatch/dispatch.h"

namespace hyper_parallel {

// The context routes whose claim accepts `op_name`, in the order they were added.
std::vector<OpDispatcher::ContextRoute> context_routes_claiming(const std::string& op_name);

// Records which YAML file (or plugin) declared `op_name`, for distributed_op_origins().
void set_distributed_op_origin(const std::string& op_name, const std::string& origin);

// Kernels of a context route that op specs may bind ops to: an entry whose key is the
// route's name (`_log_softmax: {loss_parallel: log_softmax}`) sends that op to the kernel
// named while the route is active. The route declares its kernels before the specs load;
// an unknown kernel name is an error at the spec's line.
void declare_route_kernels(const std::string& route, const std::vector<std::string>& kernels);
// The kernel names `route` declared (empty when it declared none).
std::vector<std::string> route_kernels(const std::string& route);
// Binds `op_name` to `kernel` of `route` (the spec loader does this; `kernel` must be declared).
void bind_route_kernel(const std::string& route, const std::string& op_name, const std::string& kernel);
// op name -> kernel name for every op bound to `route` by the loaded specs.
std::map<std::string, std::string> route_kernel_bindings(const std::string& route);
// The kernel the loaded specs bind `op_name` to in `route`; empty when none. One lookup, for
// the dispatch path (route_kernel_bindings copies the whole map).
std::string route_kernel_of(const std::string& route, const std::string& op_name);

}  // namespace hyper_parallel
