// OpDispatcher: where every ATen op on a DTensor goes (docs/design.md, "The dispatcher").
//
// dispatch(op, stack) is a short chain of handlers, tried in order:
//   1. bypass ops that need no layout rule (detach, item, copy_ ...)
//   2. context routes (loss_parallel plugs in here while its guard is active)
//   3. DTensors of one layout under a rule that keeps it: the op runs on the pieces
//   4. layout inference through the DistributedOp for get_op_name(op), in the LayoutCache
//   5. otherwise an error naming the op and its input placements (or, with
//      set_implicit_replication(true), replicate the inputs and run locally)
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "hyper_parallel/dispatch/distributed_op.h"
#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel {

// HyperParallel's op name: the schema name without namespace and overload
// (aten::_log_softmax -> "_log_softmax", aten::sum.dim_IntList -> "sum").
std::string get_op_name(const c10::OperatorHandle& op);

class OpDispatcher {
 public:
  static void dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack);

  // A context route sees the ops it claims before layout inference; it returns true when
  // it handled the call. `claims(op_name)` is asked once per operator (empty: every op);
  // call clear_layout_cache() when the answer changes.
  using ContextRoute = std::function<bool(const c10::OperatorHandle&, const std::string& name, torch::jit::Stack*)>;
  using RouteClaim = std::function<bool(const std::string& op_name)>;
  static void add_context_route(std::string route_name, ContextRoute route, RouteClaim claims = {});
};

// --- rule registry -----------------------------------------------------------------
// `op_name` is get_op_name(op) ("add": every overload of add and, unless they have rules
// of their own, its in-place variant add_ and out= overloads) or "name.overload"
// ("add.Tensor": that overload only; it wins over "add").
void register_distributed_op(const std::string& op_name, DistributedOpPtr op);
// The rule registered under exactly this name; nullptr when none.
DistributedOpPtr find_distributed_op(const std::string& op_name);
std::vector<std::string> registered_op_names();

// Rebuilds the registry from scratch: the built-in YAML specs (ops/*.yaml, compiled
// in), then every plugin in HYPER_PARALLEL_OPS_PLUGIN_PATH (':'-separated shared
// libraries exporting `extern "C" void hyper_parallel_register_ops()`), then every
// *.yaml in the ':'-separated directories of HYPER_PARALLEL_OPS_YAML_DIR. Runs once on
// first DTensor use; call it again after changing those variables. Clears the cache.
void reload_distributed_ops();
// Which YAML file (or plugin) declared each op name.
std::map<std::string, std::string> distributed_op_origins();

// --- layout cache ------------------------------------------------------------------
struct LayoutCacheStats {
  int64_t hits = 0;
  int64_t misses = 0;
  int64_t size = 0;
};
// Summed over threads. Each thread (rank) has a cache of its own: lookups take no lock.
LayoutCacheStats layout_cache_stats();
// Drops every thread's cached decisions and per-operator resolutions (each thread on its
// next op) and zeroes the counters.
void clear_layout_cache();
// Each thread's cache keeps at most this many decisions, dropping the least recently used
// (default 4096). Decisions hold layouts and meshes, never process groups: the world owns
// those, and keys name meshes by DeviceMesh::uid(), which is never reused.
void set_layout_cache_capacity(int64_t entries);
int64_t layout_cache_capacity();

// Features whose routing changes what inference means (loss_parallel) set a token
// that becomes part of every cache key on this thread.
uint64_t layout_cache_context_token();
class ScopedLayoutCacheToken {
 public:
  explicit ScopedLayoutCacheToken(uint64_t token);
  ~ScopedLayoutCacheToken();
  ScopedLayoutCacheToken(const ScopedLayoutCacheToken&) = delete;
  ScopedLayoutCacheToken& operator=(const ScopedLayoutCacheToken&) = delete;

 private:
  uint64_t previous_;
};

// Opt-in, for the calling thread: ops without a rule replicate their DTensor inputs and run locally
// (one warning per op). Off by default: an op without a rule is an error.
void set_implicit_replication(bool enabled);
bool implicit_replication_enabled();

}  // namespace hyper_parallel

HP_PUBLIC_END
