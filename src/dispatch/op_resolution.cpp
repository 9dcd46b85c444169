#include "dispatch/op_resolution.h"

#include <ATen/core/enum_tag.h>

#include <atomic>
#include <memory>
#include <unordered_map>

#include "dispatch/common_layout_rule.h"
#include "dispatch/op_registry.h"

namespace hyper_parallel {

namespace {

std::atomic<uint64_t> generation{1};

struct ThreadTable {
  uint64_t generation = 0;
  // Keyed by the operator's schema, which lives as long as the operator is registered.
  std::unordered_map<const c10::FunctionSchema*, std::shared_ptr<const OpResolution>> ops;
};

// Which argument a return aliases with write access (in-place / out=), if any.
std::optional<size_t> find_written_argument(const c10::FunctionSchema& schema, size_t ret) {
  const auto* ainfo = schema.returns()[ret].alias_info();
  if (!ainfo || !ainfo->isWrite()) return std::nullopt;
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const auto* a = schema.arguments()[i].alias_info();
    if (a && a->isWrite() && a->beforeSets() == ainfo->beforeSets()) return i;
  }
  return std::nullopt;
}

std::shared_ptr<const OpResolution> resolve_uncached(const c10::OperatorHandle& op) {
  auto r = std::make_shared<OpResolution>();
  r->name = get_op_name(op);
  r->bypass = find_bypass_op(r->name);
  r->routes = context_routes_claiming(r->name);
  const std::string& overload = op.schema().overload_name();
  auto try_rule = [&](const std::string& key) {
    if (r->rule || key.empty()) return;
    r->rule = find_distributed_op(key);
    if (r->rule) r->rule_name = key;
  };
  if (!overload.empty()) try_rule(r->name + "." + overload);
  try_rule(r->name);
  // An in-place foo_ without a rule of its own is the functional foo writing into self;
  // the dispatcher (commit_writes) keeps self's layout, so the rule never sees the write.
  const std::string& n = r->name;
  if (n.size() > 1 && n.back() == '_' && n[n.size() - 2] != '_') try_rule(n.substr(0, n.size() - 1));
  r->inplace_view = op.hasTag(at::Tag::inplace_view);
  const auto& schema = op.schema();
  for (size_t k = 0; k < schema.returns().size(); ++k) {
    r->written_argument.push_back(find_written_argument(schema, k));
    r->writes = r->writes || r->written_argument.back().has_value();
  }
  // One return, written (if at all) into self; no out= argument (its layout is out's own).
  bool has_out = false;
  for (const auto& a : schema.arguments()) has_out = has_out || a.is_out();
  r->common_layout_fast_path = r->rule && keeps_a_common_layout(*r->rule) && !r->bypass && r->routes.empty() &&
                               !r->inplace_view && !has_out && schema.returns().size() == 1 &&
                               (!r->written_argument[0] || *r->written_argument[0] == 0);
  return r;
}

}  // namespace

namespace {
const std::shared_ptr<const OpResolution>& table_entry(const c10::OperatorHandle& op) {
  thread_local ThreadTable table;
  const uint64_t now = generation.load(std::memory_order_acquire);
  if (table.generation != now) {
    table.ops.clear();
    table.generation = now;
  }
  auto& slot = table.ops[&op.schema()];
  if (!slot) slot = resolve_uncached(op);
  return slot;
}
}  // namespace

std::shared_ptr<const OpResolution> resolve_op(const c10::OperatorHandle& op) { return table_entry(op); }

bool takes_common_layout_fast_path(const c10::OperatorHandle& op) { return table_entry(op)->common_layout_fast_path; }

void invalidate_op_resolutions() { generation.fetch_add(1, std::memory_order_acq_rel); }

uint64_t op_resolution_generation() { return generation.load(std::memory_order_acquire); }

}  // namespace hyper_parallel
