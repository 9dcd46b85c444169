#include "hyper_parallel/dispatch/sharding_strategy.h"

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <limits>

namespace hyper_parallel {

double redistribute_cost_bytes(const Placement& have, const Placement& want, double bytes, int64_t ranks) {
  if (have == want || ranks <= 1) return 0;
  const double n = static_cast<double>(ranks);
  const double token = 0.01 * bytes / n;
  if (have.is_replicate()) return token;  // chunk locally, or zero
  if (have.is_partial()) {
    if (want.is_replicate()) return 2 * bytes * (n - 1) / n;                               // all-reduce
    if (want.is_shard() && have.reduce_op() == ReduceOp::Sum) return bytes * (n - 1) / n;  // reduce-scatter
    return 3 * bytes * (n - 1) / n;  // all-reduce, then re-partial
  }
  // have is a Shard
  if (want.is_replicate()) return bytes * (n - 1) / n;  // all-gather
  if (want.is_shard()) return bytes / n * (n - 1) / n;  // all-to-all
  return bytes * (n - 1) / n + token;                   // all-gather, then zero
}

size_t cheapest_strategy(const OpCall& call, int64_t mesh_dim, const std::vector<size_t>& arguments,
                         const std::vector<DimStrategy>& candidates, double* cost_bytes) {
  TORCH_CHECK(!candidates.empty(), call.name(), ": a rule offered no strategy");
  const int64_t ranks = call.mesh().size(mesh_dim);
  size_t best = 0;
  double best_cost = std::numeric_limits<double>::infinity();
  for (size_t c = 0; c < candidates.size(); ++c) {
    const DimStrategy& s = candidates[c];
    TORCH_CHECK(s.inputs.size() == arguments.size(), call.name(), ": a strategy lists ", s.inputs.size(),
                " placements for ", arguments.size(), " arguments");
    double cost = 0;
    for (size_t i = 0; i < arguments.size(); ++i) {
      const TensorArg& t = call.tensors().at(arguments[i]);
      double bytes = static_cast<double>(c10::elementSize(t.dtype));
      for (int64_t n : t.shape) bytes *= static_cast<double>(n);
      const Placement have = t.layout ? t.layout->placement(mesh_dim) : Placement::replicate();
      cost += redistribute_cost_bytes(have, s.inputs[i], bytes, ranks);
    }
    if (cost < best_cost) {
      best_cost = cost;
      best = c;
    }
  }
  if (cost_bytes) *cost_bytes = best_cost;
  return best;
}

SelectedStrategy select_strategy(const OpCall& call, const std::vector<size_t>& arguments,
                                 const std::vector<DimStrategy>& candidates) {
  const int64_t nm = call.mesh().ndim();
  SelectedStrategy out;
  out.inputs.assign(arguments.size(), Placements(nm, Placement::replicate()));
  out.output = Placements(nm, Placement::replicate());
  for (int64_t m = 0; m < nm; ++m) {
    double cost = 0;
    const DimStrategy& s = candidates[cheapest_strategy(call, m, arguments, candidates, &cost)];
    for (size_t i = 0; i < arguments.size(); ++i) out.inputs[i][m] = s.inputs[i];
    out.output[m] = s.output;
    out.cost_bytes += cost;
  }
  return out;
}

}  // namespace hyper_parallel
