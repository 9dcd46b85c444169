#include <ATen/core/LegacyTypeDispatch.h>
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
#include "dispatch/layout_cache.h"
#include "dispatch/op_spec_loader.h"
#include "dtensor/dtensor_impl.h"
#include "hyper_parallel/dispatch.h"
#include "hyper_parallel/dtensor.h"

namespace hyper_parallel {

namespace {

struct Registry {
  std::mutex mutex;
  std::unordered_map<std::string, DistributedOpPtr> ops;
  std::map<std::string, std::string> origins;  // op name -> YAML file:line or plugin
  std::vector<std::pair<std::string, OpDispatcher::ContextRoute>> routes;
  // What dispatch reads on every op: an immutable copy of the routes, replaced whole when
  // one is added, so the hot path neither locks nor copies functions.
  std::atomic<std::shared_ptr<const std::vector<OpDispatcher::ContextRoute>>> route_snapshot{
      std::make_shared<const std::vector<OpDispatcher::ContextRoute>>()};
  std::set<std::string> warned_implicit;

  void publish_routes() {  // under mutex
    auto v = std::make_shared<std::vector<OpDispatcher::ContextRoute>>();
    for (const auto& r : routes) v->push_back(r.second);
    route_snapshot.store(std::move(v));
  }
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
at::Tensor local_input(const at::Tensor& t, const TensorArg& info,
                       const std::optional<Placements>& target, const DeviceMesh& mesh) {
  if (!target) return info.layout ? local_of(t) : t;
  return local_piece(t, info.layout ? info.layout->with_placements(*target) : Layout(mesh, *target, info.shape));
}

torch::jit::Stack localize_args(const OpCall& call, const ShardingDecision& d) {
  torch::jit::Stack local = call.args();
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
      list.set(*info.list_index,
               local_input(list.get(*info.list_index).toTensor(), info, target, call.mesh()));
      slot = list;
    }
  }
  return local;
}

// Which argument a return aliases with write access (in-place / out=), if any.
std::optional<size_t> written_argument(const c10::FunctionSchema& schema, size_t ret) {
  const auto* ainfo = schema.returns()[ret].alias_info();
  if (!ainfo || !ainfo->isWrite()) return std::nullopt;
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const auto* a = schema.arguments()[i].alias_info();
    if (a && a->isWrite() && a->beforeSets() == ainfo->beforeSets()) return i;
  }
  return std::nullopt;
}

at::Tensor wrap_one(const OpCall& call, const at::Tensor& local, const Layout& layout) {
  TORCH_CHECK(local.sizes() == c10::IntArrayRef(layout.local_shape()), call.name(),
              ": the local result has shape ", local.sizes(), " but the inferred output ",
              layout.str(), " gives this rank ", c10::IntArrayRef(layout.local_shape()),
              " (inputs ", describe_inputs(call), ")");
  return make_dtensor(local, layout);
}

void wrap_outputs(const OpCall& call, const ShardingDecision& d, torch::jit::Stack& results,
                  torch::jit::Stack* stack) {
  const auto& schema = call.schema();
  TORCH_CHECK(results.size() == schema.returns().size(), call.name(), ": expected ",
              schema.returns().size(), " results, got ", results.size());
  for (size_t r = 0; r < results.size(); ++r) {
    c10::IValue& v = results[r];
    if (auto arg = written_argument(schema, r)) {
      // In-place / out=: the local piece was written; hand back the caller's DTensor.
      v = call.args()[*arg];
      continue;
    }
    const auto& layouts = r < d.output_layouts.size() ? d.output_layouts[r]
                                                      : std::vector<Layout>{};
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) continue;
      TORCH_CHECK(!layouts.empty(), call.name(), ": the rule gave no layout for output ", r);
      v = wrap_one(call, t, layouts[0]);
    } else if (v.isTensorList()) {
      auto list = v.toTensorVector();
      TORCH_CHECK(layouts.size() == list.size(), call.name(), ": the rule gave ", layouts.size(),
                  " layouts for ", list.size(), " outputs");
      std::vector<at::Tensor> wrapped;
      for (size_t j = 0; j < list.size(); ++j) wrapped.push_back(wrap_one(call, list[j], layouts[j]));
      v = wrapped;
    }
  }
  for (auto& v : results) stack->push_back(std::move(v));
}

// In-place ops, out= ops and in-place view ops write into an argument. Whatever the rule
// chose (it may have computed in another layout, into a redistributed temporary), the
// written DTensor must end up holding the result in its own layout; an in-place view op
// instead gives the DTensor the layout of the view. Done here, once, for every op.
void commit_writes(const OpCall& call, const ShardingDecision& d, const torch::jit::Stack& results) {
  const auto& schema = call.schema();
  const bool inplace_view = call.op().hasTag(at::Tag::inplace_view);
  for (size_t r = 0; r < results.size() && r < schema.returns().size(); ++r) {
    const auto arg = written_argument(schema, r);
    if (!arg || !results[r].isTensor()) continue;
    const at::Tensor& target = call.args()[*arg].toTensor();
    auto* impl = dtensor_impl(target);
    TORCH_CHECK(impl, call.name(), ": the written argument '", schema.arguments()[*arg].name(),
                "' is a plain tensor while other arguments are DTensors; expected a DTensor to write into");
    const at::Tensor& written = results[r].toTensor();
    const Layout& have = impl->layout();
    const bool has_layout = r < d.output_layouts.size() && !d.output_layouts[r].empty();
    const Layout& result_layout = has_layout ? d.output_layouts[r][0] : have;
    const bool wrote_in_place = written.unsafeGetTensorImpl() == impl->local().unsafeGetTensorImpl();
    if (inplace_view) {
      TORCH_CHECK(wrote_in_place, call.name(),
                  ": an in-place view op must change this rank's piece itself (its rule redistributed self)");
      impl->set_layout_after_inplace_view(result_layout);
      continue;
    }
    TORCH_CHECK(result_layout.shape() == have.shape(), call.name(), ": the result has shape ",
                c10::IntArrayRef(result_layout.shape()), " but the argument '", schema.arguments()[*arg].name(),
                "' it is written into has shape ", c10::IntArrayRef(have.shape()));
    if (wrote_in_place && result_layout.placements() == have.placements()) continue;
    // Computed elsewhere or in another layout: bring it into the argument's layout.
    at::Tensor value = redistribute_local(written, result_layout, have);
    if (value.is_alias_of(impl->local())) value = value.clone();
    impl->local().copy_(value);
  }
}

void run_local(const OpCall& call, const ShardingDecision& d, const DistributedOp* rule,
               torch::jit::Stack* stack) {
  torch::jit::Stack local = localize_args(call, d);
  const torch::jit::Stack local_args = local;  // for finalize: before expand, not consumed
  if (rule) rule->expand(call, d, local);
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    call.op().callBoxed(&local);
  }
  if (rule) rule->finalize(call, d, local_args, local);
  commit_writes(call, d, local);
  torch::jit::drop(*stack, call.schema().arguments().size());
  wrap_outputs(call, d, local, stack);
}

// No rule, explicit opt-in: replicate every DTensor input, run locally, and call the
// outputs replicated (their local shapes are then the global ones).
void run_replicated(const OpCall& call, torch::jit::Stack* stack) {
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
  commit_writes(call, d, local);
  torch::jit::drop(*stack, call.schema().arguments().size());
  wrap_outputs(call, d, local, stack);
}

}  // namespace

void register_distributed_op(const std::string& op_name, DistributedOpPtr op) {
  TORCH_CHECK(op, "register_distributed_op(\"", op_name, "\"): null DistributedOp");
  {
    std::lock_guard<std::mutex> lock(registry().mutex);
    registry().ops[op_name] = std::move(op);
  }
  clear_layout_cache();  // cached decisions may have come from the rule just replaced
}

DistributedOpPtr find_distributed_op(const std::string& op_name) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  auto it = registry().ops.find(op_name);
  if (it != registry().ops.end()) return it->second;
  // An in-place variant (add_) shares its functional op's rule unless it has its own;
  // the rule sees OpCall::is_inplace() and keeps self's layout.
  if (op_name.size() > 1 && op_name.back() == '_' && op_name[op_name.size() - 2] != '_') {
    it = registry().ops.find(op_name.substr(0, op_name.size() - 1));
    if (it != registry().ops.end()) return it->second;
  }
  return nullptr;
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

std::map<std::string, std::string> distributed_op_origins() {
  std::lock_guard<std::mutex> lock(registry().mutex);
  return registry().origins;
}

void reload_distributed_ops() {
  {
    std::lock_guard<std::mutex> lock(registry().mutex);
    registry().ops.clear();
    registry().origins.clear();
  }
  load_op_spec_files(builtin_op_spec_files());
  if (const char* plugins = std::getenv("HYPER_PARALLEL_OPS_PLUGIN_PATH")) load_op_plugins(plugins);
  if (const char* dirs = std::getenv("HYPER_PARALLEL_OPS_YAML_DIR")) load_op_spec_files(read_op_spec_dirs(dirs));
  clear_layout_cache();
}

void set_implicit_replication(bool enabled) { implicit_replication = enabled; }
bool implicit_replication_enabled() { return implicit_replication; }

void OpDispatcher::add_context_route(std::string route_name, ContextRoute route) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  bool replaced = false;
  for (auto& r : registry().routes) {
    if (r.first == route_name) {
      r.second = std::move(route);
      replaced = true;
      break;
    }
  }
  if (!replaced) registry().routes.emplace_back(std::move(route_name), std::move(route));
  registry().publish_routes();
}

void OpDispatcher::dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const std::string name = get_op_name(op);
  const size_t nargs = op.schema().arguments().size();
  // 1. bypass
  if (run_bypass_op(op, name, stack)) return;
  // 2. context routes
  const auto routes = registry().route_snapshot.load();
  for (const auto& route : *routes) {
    if (route(op, name, stack)) return;
  }
  // 3. layout inference
  torch::jit::Stack args(stack->end() - nargs, stack->end());
  OpCall call(op, name, args);
  DistributedOpPtr rule = find_distributed_op(name);
  if (rule) {
    LayoutCacheKey key = make_layout_cache_key(call);
    auto decision = key.cacheable ? layout_cache_find(key) : nullptr;
    if (!decision) {
      decision = std::make_shared<const ShardingDecision>(rule->infer_layout(call));
      if (key.cacheable) layout_cache_insert(key, decision);
    }
    run_local(call, *decision, rule.get(), stack);
    return;
  }
  // 4. no rule
  TORCH_CHECK(implicit_replication, "DTensor: no sharding rule for op '", name, "' (",
              op.schema().operator_name(), ") with inputs ", describe_inputs(call),
              ". Register a DistributedOp for it (YAML in HYPER_PARALLEL_OPS_YAML_DIR or a plugin in "
              "HYPER_PARALLEL_OPS_PLUGIN_PATH), or opt in to set_implicit_replication(true)");
  {
    std::lock_guard<std::mutex> lock(registry().mutex);
    if (registry().warned_implicit.insert(name).second) {
      TORCH_WARN("DTensor: op '", name, "' has no sharding rule; replicating its inputs ",
                 describe_inputs(call), " and running it locally (implicit replication)");
    }
  }
  run_replicated(call, stack);
}

}  // namespace hyper_parallel
