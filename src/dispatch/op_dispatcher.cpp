#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/core/enum_tag.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <unordered_map>

#include "core/redistribute.h"
#include "dispatch/bypass_ops.h"
#include "dispatch/common_layout_fast_path.h"
#include "dispatch/layout_cache.h"
#include "dispatch/local_call_layout.h"
#include "dispatch/op_registry.h"
#include "dispatch/op_resolution.h"
#include "dispatch/op_spec_loader.h"
#include "dtensor/dtensor_impl.h"
#include "hyper_parallel/dispatch/dispatch.h"
#include "hyper_parallel/dtensor/dtensor.h"

namespace hyper_parallel {

namespace {

struct Registry {
  std::mutex mutex;
  std::unordered_map<std::string, DistributedOpPtr> ops;
  std::map<std::string, std::string> origins;  // op name -> YAML file:line or plugin
  struct Route {
    std::string name;
    OpDispatcher::ContextRoute route;
    OpDispatcher::RouteClaim claims;
  };
  std::vector<Route> routes;
  std::map<std::string, std::vector<std::string>> route_kernels;             // route -> kernels
  std::map<std::string, std::map<std::string, std::string>> route_bindings;  // route -> op -> kernel
  std::set<std::string> warned_implicit;
};

Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

// Per thread, like a context: one rank (thread) opting in does not affect another.
thread_local bool implicit_replication = false;

std::string describe_inputs(const OpCall& call) {
  std::ostringstream os;
  os << "[";
  bool first = true;
  for (const auto& t : call.tensors()) {
    os << (first ? "" : ", ");
    first = false;
    if (t.layout) {
      os << to_string(t.layout->placements()) << " shape " << c10::IntArrayRef(t.shape);
    } else {
      os << "plain tensor shape " << c10::IntArrayRef(t.shape);
    }
  }
  return os.str() + "]";
}

// A plain tensor argument next to DTensors is taken to be replicated.
at::Tensor local_input(const at::Tensor& t, const TensorArg& info, const std::optional<Placements>& target,
                       const DeviceMesh& mesh) {
  if (!target) return info.layout ? local_of(t) : t;
  if (info.layout && *target == info.layout->placements()) return local_of(t);  // no move
  return local_piece(t, info.layout ? info.layout->with_placements(*target) : Layout(mesh, *target, info.shape.vec()));
}

torch::jit::Stack localize_args(const OpCall& call, const ShardingDecision& d) {
  torch::jit::Stack local(call.args().begin(), call.args().end());
  // out= arguments: the op writes into an empty local tensor of out's dtype (ATen resizes
  // it to the result's local shape); commit_writes then brings that into out's layout.
  const auto& schema_args = call.schema().arguments();
  for (size_t i = 0; i < local.size(); ++i) {
    if (!schema_args[i].is_out() || !local[i].isTensor()) continue;
    const at::Tensor& out = local[i].toTensor();
    const at::Tensor& piece = dtensor_impl(out) ? local_of(out) : out;
    local[i] = at::empty({0}, piece.options());
  }
  const auto& tensors = call.tensors();
  for (size_t k = 0; k < tensors.size(); ++k) {
    const TensorArg& info = tensors[k];
    const auto& target = d.input_placements.empty() ? std::nullopt : d.input_placements[k];
    c10::IValue& slot = local[info.arg_index];
    if (!info.list_index) {
      slot = local_input(slot.toTensor(), info, target, call.mesh());
    } else if (slot.isTensorList()) {
      auto list = slot.toTensorList().copy();
      list.set(*info.list_index, local_input(list.get(*info.list_index), info, target, call.mesh()));
      slot = list;
    } else {
      auto list = slot.toList().copy();
      list.set(*info.list_index, local_input(list.get(*info.list_index).toTensor(), info, target, call.mesh()));
      slot = list;
    }
  }
  return local;
}

at::Tensor wrap_one(const OpCall& call, const at::Tensor& local, const Layout& layout) {
  TORCH_CHECK(local.sizes() == c10::IntArrayRef(layout.local_shape()), call.name(), ": the local result has shape ",
              local.sizes(), " but the inferred output ", layout.str(), " gives this rank ",
              c10::IntArrayRef(layout.local_shape()), " (inputs ", describe_inputs(call), ")");
  return make_dtensor(local, layout);
}

// Turns the local results into DTensors, in place. A written argument (in-place, out=)
// is handed back as the caller's DTensor, which commit_writes has updated.
void wrap_outputs(const OpCall& call, const OpResolution& res, const ShardingDecision& d, torch::jit::Stack& results) {
  const auto& schema = call.schema();
  TORCH_CHECK(results.size() == schema.returns().size(), call.name(), ": expected ", schema.returns().size(),
              " results, got ", results.size());
  for (size_t r = 0; r < results.size(); ++r) {
    c10::IValue& v = results[r];
    if (const auto arg = res.written_argument[r]) {
      v = call.args()[*arg];
      continue;
    }
    static const std::vector<Layout> none;
    const auto& layouts = r < d.output_layouts.size() ? d.output_layouts[r] : none;
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) continue;
      TORCH_CHECK(!layouts.empty(), call.name(), ": the rule gave no layout for output ", r);
      v = wrap_one(call, t, layouts[0]);
    } else if (v.isTensorList()) {
      auto list = v.toTensorVector();
      TORCH_CHECK(layouts.size() == list.size(), call.name(), ": the rule gave ", layouts.size(), " layouts for ",
                  list.size(), " outputs");
      std::vector<at::Tensor> wrapped;
      for (size_t j = 0; j < list.size(); ++j) wrapped.push_back(wrap_one(call, list[j], layouts[j]));
      v = wrapped;
    }
  }
}

// In-place ops, out= ops and in-place view ops write into an argument. Whatever the rule
// chose (it may have computed in another layout, into a redistributed temporary), the
// written DTensor must end up holding the result in its own layout; an in-place view op
// instead gives the DTensor the layout of the view. Done here, once, for every op.
void commit_writes(const OpCall& call, const OpResolution& res, const ShardingDecision& d,
                   const torch::jit::Stack& results) {
  if (!res.writes) return;
  const auto& schema = call.schema();
  for (size_t r = 0; r < results.size() && r < schema.returns().size(); ++r) {
    const auto arg = res.written_argument[r];
    if (!arg || !results[r].isTensor()) continue;
    const at::Tensor& target = call.args()[*arg].toTensor();
    auto* impl = dtensor_impl(target);
    const at::Tensor& written = results[r].toTensor();
    const bool has_layout = r < d.output_layouts.size() && !d.output_layouts[r].empty();
    // Where the result goes, and in which layout: a DTensor keeps its own; a plain tensor
    // written with DTensor operands (autograd formulas do this, e.g.
    // zeros(sizes).scatter_(dim, indices, grad)) receives the full result, as one process
    // would compute it.
    at::Tensor dest;
    Layout dest_layout;
    if (!impl) {
      TORCH_CHECK(!res.inplace_view && has_layout, call.name(), ": cannot write into the plain argument '",
                  schema.arguments()[*arg].name(),
                  "' (an in-place view, or a rule that gave no output layout); expected a DTensor");
      dest = target;
      dest_layout =
          Layout(call.mesh(), Placements(call.mesh().ndim(), Placement::replicate()), d.output_layouts[r][0].shape());
    } else {
      dest = impl->local();
      dest_layout = impl->layout();
    }
    const Layout& result_layout = has_layout ? d.output_layouts[r][0] : dest_layout;
    const bool wrote_in_place = impl && written.unsafeGetTensorImpl() == dest.unsafeGetTensorImpl();
    if (res.inplace_view) {
      TORCH_CHECK(wrote_in_place, call.name(),
                  ": an in-place view op must change this rank's piece itself (its rule redistributed self)");
      impl->set_layout_after_inplace_view(result_layout);
      continue;
    }
    TORCH_CHECK(result_layout.shape() == dest_layout.shape(), call.name(), ": the result has shape ",
                c10::IntArrayRef(result_layout.shape()), " but the argument '", schema.arguments()[*arg].name(),
                "' it is written into has shape ", c10::IntArrayRef(dest_layout.shape()));
    if (wrote_in_place && result_layout.placements() == dest_layout.placements()) continue;
    // Computed elsewhere or in another layout: bring it into the destination's layout.
    at::Tensor value = redistribute_local(written, result_layout, dest_layout);
    if (value.is_alias_of(dest)) value = value.clone();
    dest.copy_(value);
  }
}

// Replaces the call's arguments on the stack with its results. Last: until here the
// OpCall reads its arguments from the stack.
void finish(const OpCall& call, const OpResolution& res, const ShardingDecision& d, torch::jit::Stack& results,
            torch::jit::Stack* stack) {
  commit_writes(call, res, d, results);
  wrap_outputs(call, res, d, results);
  torch::jit::drop(*stack, call.schema().arguments().size());
  for (auto& v : results) stack->push_back(std::move(v));
}

// The rule's decision for this call, from the layout cache or inferred and cached.
std::shared_ptr<const ShardingDecision> decide(const OpCall& call, const DistributedOp& rule) {
  const LayoutCacheKey& key = make_layout_cache_key(call);
  auto decision = key.cacheable ? layout_cache_find(key) : nullptr;
  if (!decision) {
    const LayoutCacheKey owned = key;  // a rule may dispatch, and so rebuild the thread's key
    decision = std::make_shared<const ShardingDecision>(rule.infer_layout(call));
    if (owned.cacheable) layout_cache_insert(owned, decision);
  }
  return decision;
}

void run_local(const OpCall& call, const OpResolution& res, const ShardingDecision& d, torch::jit::Stack* stack) {
  const DistributedOp& rule = *res.rule;
  torch::jit::Stack local = localize_args(call, d);
  // finalize() sees the arguments as they were before expand() and the op consumed them.
  // Kept for every rule (a few reference counts): a switch a rule must remember to
  // flip next to finalize() skipped the finalize() of rules that forgot it.
  const torch::jit::Stack local_args = local;
  rule.expand(call, d, local);
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    call.op().callBoxed(&local);
  }
  rule.finalize(call, d, local_args, local);
  finish(call, res, d, local, stack);
}

// No rule, explicit opt-in: replicate every DTensor input, run locally, and call the
// outputs replicated (their local shapes are then the global ones).
void run_replicated(const OpCall& call, const OpResolution& res, torch::jit::Stack* stack) {
  ShardingDecision d;
  const DeviceMesh& mesh = call.mesh();
  const Placements rep(mesh.ndim(), Placement::replicate());
  d.input_placements = replicate_dtensor_inputs(call);
  torch::jit::Stack local = localize_args(call, d);
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    call.op().callBoxed(&local);
  }
  for (const auto& r : local) {
    std::vector<Layout> ls;
    if (r.isTensor() && r.toTensor().defined()) ls.emplace_back(mesh, rep, r.toTensor().sizes().vec());
    if (r.isTensorList()) {
      for (const auto& t : r.toTensorVector()) ls.emplace_back(mesh, rep, t.sizes().vec());
    }
    d.output_layouts.push_back(std::move(ls));
  }
  finish(call, res, d, local, stack);
}

}  // namespace

void register_distributed_op(const std::string& op_name, DistributedOpPtr op) {
  TORCH_CHECK(op, "register_distributed_op(\"", op_name, "\"): null DistributedOp");
  {
    std::lock_guard<std::mutex> lock(registry().mutex);
    registry().ops[op_name] = std::move(op);
  }
  clear_layout_cache();  // cached decisions and resolutions may name the rule just replaced
}

DistributedOpPtr find_distributed_op(const std::string& op_name) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  auto it = registry().ops.find(op_name);
  return it == registry().ops.end() ? nullptr : it->second;
}

std::vector<OpDispatcher::ContextRoute> context_routes_claiming(const std::string& op_name) {
  std::vector<Registry::Route> routes;
  {
    std::lock_guard<std::mutex> lock(registry().mutex);
    routes = registry().routes;
  }
  // Asked without the lock: a claim may read the registry (the specs' route bindings).
  std::vector<OpDispatcher::ContextRoute> out;
  for (const auto& r : routes) {
    if (!r.claims || r.claims(op_name)) out.push_back(r.route);
  }
  return out;
}

std::vector<std::string> registered_op_names() {
  std::lock_guard<std::mutex> lock(registry().mutex);
  std::vector<std::string> names;
  for (const auto& kv : registry().ops) names.push_back(kv.first);
  std::sort(names.begin(), names.end());
  return names;
}

void set_distributed_op_origin(const std::string& op_name, const std::string& origin) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  registry().origins[op_name] = origin;
}

void declare_route_kernels(const std::string& route, const std::vector<std::string>& kernels) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  registry().route_kernels[route] = kernels;
}

std::vector<std::string> route_kernels(const std::string& route) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  auto it = registry().route_kernels.find(route);
  return it == registry().route_kernels.end() ? std::vector<std::string>{} : it->second;
}

void bind_route_kernel(const std::string& route, const std::string& op_name, const std::string& kernel) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  registry().route_bindings[route][op_name] = kernel;
}

std::map<std::string, std::string> route_kernel_bindings(const std::string& route) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  auto it = registry().route_bindings.find(route);
  return it == registry().route_bindings.end() ? std::map<std::string, std::string>{} : it->second;
}

std::string route_kernel_of(const std::string& route, const std::string& op_name) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  auto it = registry().route_bindings.find(route);
  if (it == registry().route_bindings.end()) return {};
  auto op = it->second.find(op_name);
  return op == it->second.end() ? std::string() : op->second;
}

std::map<std::string, std::string> distributed_op_origins() {
  std::lock_guard<std::mutex> lock(registry().mutex);
  return registry().origins;
}

void reload_distributed_ops() {
  {
    std::lock_guard<std::mutex> lock(registry().mutex);
    registry().ops.clear();
    registry().origins.clear();
    registry().route_bindings.clear();
  }
  load_op_spec_files(builtin_op_spec_files());
  if (const char* plugins = std::getenv("HYPER_PARALLEL_OPS_PLUGIN_PATH")) load_op_plugins(plugins);
  if (const char* dirs = std::getenv("HYPER_PARALLEL_OPS_YAML_DIR")) load_op_spec_files(read_op_spec_dirs(dirs));
  clear_layout_cache();
}

void set_implicit_replication(bool enabled) { implicit_replication = enabled; }
bool implicit_replication_enabled() { return implicit_replication; }

void OpDispatcher::add_context_route(std::string route_name, ContextRoute route, RouteClaim claims) {
  {
    std::lock_guard<std::mutex> lock(registry().mutex);
    bool replaced = false;
    for (auto& r : registry().routes) {
      if (r.name == route_name) {
        r.route = std::move(route);
        r.claims = std::move(claims);
        replaced = true;
        break;
      }
    }
    if (!replaced) registry().routes.push_back({std::move(route_name), std::move(route), std::move(claims)});
  }
  invalidate_op_resolutions();
}

std::optional<Layout> local_call_output_layout(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const std::shared_ptr<const OpResolution> res = resolve_op(op);
  if (!res->rule || res->bypass || !res->routes.empty() || res->writes || res->inplace_view) return std::nullopt;
  const size_t nargs = op.schema().arguments().size();
  TORCH_INTERNAL_ASSERT(stack.size() >= nargs);
  const OpCall call(op, res->name, c10::ArrayRef<c10::IValue>(stack.data() + stack.size() - nargs, nargs));
  if (call.tensors().size() != 1 || call.dtensor_indices().size() != 1 || op.schema().returns().size() != 1) {
    return std::nullopt;
  }
  const std::shared_ptr<const ShardingDecision> d = decide(call, *res->rule);
  const Layout& input = *call.tensors()[0].layout;
  const bool moves_input =
      !d->input_placements.empty() && d->input_placements[0] && *d->input_placements[0] != input.placements();
  if (moves_input || d->output_layouts.size() != 1 || d->output_layouts[0].size() != 1) return std::nullopt;
  if (!res->rule->leaves_local_call_alone(call, *d)) return std::nullopt;
  return d->output_layouts[0][0];
}

void OpDispatcher::dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const std::shared_ptr<const OpResolution> res = resolve_op(op);
  // 1. bypass
  if (res->bypass) {
    res->bypass(op, stack);
    return;
  }
  // 2. context routes that claim this op
  for (const auto& route : res->routes) {
    if (route(op, res->name, stack)) return;
  }
  // 3. DTensors of one layout that the rule keeps: no inference needed
  if (res->common_layout_fast_path && run_on_common_layout(op, *res, stack)) return;
  // 4. layout inference
  const size_t nargs = op.schema().arguments().size();
  const OpCall call(op, res->name, c10::ArrayRef<c10::IValue>(stack->data() + stack->size() - nargs, nargs));
  if (res->rule) {
    run_local(call, *res, *decide(call, *res->rule), stack);
    return;
  }
  // 5. no rule
  TORCH_CHECK(implicit_replication, "DTensor: no sharding rule for op '", res->name, "' (", op.schema().operator_name(),
              ") with inputs ", describe_inputs(call),
              ". Register a DistributedOp for it (YAML in HYPER_PARALLEL_OPS_YAML_DIR or a plugin in "
              "HYPER_PARALLEL_OPS_PLUGIN_PATH), or opt in to set_implicit_replication(true)");
  {
    std::lock_guard<std::mutex> lock(registry().mutex);
    if (registry().warned_implicit.insert(res->name).second) {
      TORCH_WARN("DTensor: op '", res->name, "' has no sharding rule; replicating its inputs ", describe_inputs(call),
                 " and running it locally (implicit replication)");
    }
  }
  run_replicated(call, *res, stack);
}

}  // namespace hyper_parallel
