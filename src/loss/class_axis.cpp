// class_axis.h: the one decision of the class axis, on neutral placements.
#include "loss/class_axis.h"

#include <algorithm>

namespace hyper_parallel::class_axis {

namespace {

// The contract layout nearest to `ps`: the class dim on the last mesh dim that shards it, other
// Shards of other dims kept, the rest (Partials, other class shards, strided shards) Replicate.
Placements contract_placements(const Placements& ps, int64_t class_dim, int64_t class_mesh_dim) {
  Placements want;
  for (int64_t i = 0; i < static_cast<int64_t>(ps.size()); ++i) {
    if (i == class_mesh_dim) {
      want.push_back(shard(class_dim));
    } else if (ps[i].is_shard() && ps[i].dim != class_dim) {
      want.push_back(ps[i]);
    } else {
      want.push_back(replicate());
    }
  }
  return want;
}

Decision refusal(Outcome outcome, std::string message) {
  Decision d;
  d.outcome = outcome;
  d.message = std::move(message);
  return d;
}

Decision needs_strictness() {
  Decision d;
  d.outcome = Outcome::NeedsStrictness;
  return d;
}

}  // namespace

std::vector<int64_t> mesh_dims_sharding(const Placements& placements, int64_t class_dim) {
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < static_cast<int64_t>(placements.size()); ++i) {
    if (placements[i].is_shard() && placements[i].dim == class_dim) dims.push_back(i);
  }
  return dims;
}

Placements row_placements(const Placements& want, int64_t mesh_dim, int64_t class_dim) {
  Placements rows;
  for (int64_t i = 0; i < static_cast<int64_t>(want.size()); ++i) {
    const Placement& p = want[i];
    rows.push_back(i == mesh_dim || !p.is_shard() ? replicate() : shard(p.dim > class_dim ? p.dim - 1 : p.dim));
  }
  return rows;
}

std::string expected_layout(const Route& route, int64_t class_dim) {
  const std::string c = std::to_string(class_dim);
  return route.tensor + " sharded along its class dim " + c + " on exactly one mesh dim (Shard(" + c + ")), " +
         (route.rows_sharded ? "its other mesh dims Shard or Replicate (a Shard of another dim)"
                             : "its other mesh dims Replicate (or the tensor-parallel mesh alone)");
}

Decision decide(const Question& q) {
  const std::string prefix = q.op + " under loss_parallel";
  const std::string expected = expected_layout(q.route, q.class_dim);
  const std::string c = std::to_string(q.class_dim);
  if (!q.is_dtensor) {
    return refusal(Outcome::LayoutError, prefix + ": expected the input to be " + expected + ", got a plain tensor" +
                                             (q.found.empty() ? "" : " of shape " + q.found));
  }
  const Placements& ps = q.placements;
  const bool partial = std::any_of(ps.begin(), ps.end(), [](const Placement& p) { return p.kind == Kind::Partial; });
  const std::vector<int64_t> sharding = mesh_dims_sharding(ps, q.class_dim);
  // What no strictness changes first: no strictness is asked (nor agreed on) for it.
  if (sharding.empty()) {
    return refusal(Outcome::LayoutError, prefix + ": expected the input to be " + expected + ", got " + q.found +
                                             ": the class dim " + c + " is not sharded" +
                                             (partial ? " (reduce the Partial first, then shard the class dim)" : ""));
  }
  const int64_t mesh_dim = sharding.back();
  if (!q.options_mesh_fits.empty() && !q.options_mesh_fits[mesh_dim]) {
    return refusal(Outcome::LayoutError, q.op + " under loss_parallel(mesh = " + q.options_mesh +
                                             "): expected the input on that mesh, got " + q.found);
  }
  const Placements want = contract_placements(ps, q.class_dim, mesh_dim);
  const bool relayout = want != ps;
  const bool strict = q.strictness == Strictness::Strict;
  const std::string relax = q.route.relax.empty() ? "" : " (" + q.route.relax + ")";
  if (relayout && !q.route.can_relayout) {
    if (partial) {
      return refusal(Outcome::LayoutError, prefix + ": expected the input to be " + expected + ", got " + q.found +
                                               ": reduce the Partial first");
    }
    if (sharding.size() > 1) {
      return refusal(Outcome::UnsupportedError, prefix + ": the class dim is sharded by " +
                                                    std::to_string(sharding.size()) + " mesh dims (" + q.found +
                                                    "); expected exactly one");
    }
    return refusal(Outcome::UnsupportedError, prefix + ": expected the input to be " + expected + ", got " + q.found);
  }
  if (relayout) {
    if (q.strictness == Strictness::Unknown) return needs_strictness();
    if (strict) {
      bool gather = false;  // more than a Partial to undo: another class shard, a strided shard
      for (size_t i = 0; i < ps.size(); ++i) gather = gather || (ps[i] != want[i] && ps[i].kind != Kind::Partial);
      const std::string fix = partial && gather ? "reduce the Partial and gather the other shardings first"
                              : partial         ? "reduce the Partial first"
                                                : "gather the other shardings first";
      return refusal(Outcome::LayoutError, prefix + " (strict): expected the input to be " + expected +
                                               " (PyTorch's loss_parallel contract), got " + q.found + ": " + fix +
                                               ", or use " + q.route.relax);
    }
  }
  if (!q.route.rows_sharded && want.size() > 1) {
    if (q.strictness == Strictness::Unknown) return needs_strictness();
    if (strict) {
      return refusal(Outcome::LayoutError, prefix + " (strict): expected " + expected + ", got " + q.found +
                                               ". Use the 1-D tensor-parallel sub-mesh or " + q.route.relax);
    }
    for (int64_t i = 0; i < static_cast<int64_t>(want.size()); ++i) {
      if (i != mesh_dim && want[i] != replicate()) {
        return refusal(Outcome::LayoutError,
                       prefix + relax + ": expected every mesh axis but the class axis to be Replicate, got " +
                           q.found +
                           "; put the logits on the tensor-parallel sub-mesh (DTensor.from_local(local, "
                           "mesh['tp'], [Shard(" +
                           c + ")]))");
      }
    }
  }
  Decision d;
  d.mesh_dim = mesh_dim;
  d.want = want;
  d.relayout = relayout;
  d.rows = row_placements(want, mesh_dim, q.class_dim);
  return d;
}

Decision decide_mean(const Question& q) {
  const size_t mesh_ndim = q.placements.size();
  if (mesh_ndim <= 1) return Decision{};
  if (q.strictness == Strictness::Unknown) return needs_strictness();
  if (q.strictness == Strictness::Relaxed) return Decision{};
  return refusal(Outcome::UnsupportedError,
                 q.op +
                     " under loss_parallel (strict): reduction 'mean' is only supported on a one-dimensional mesh "
                     "(PyTorch's loss_parallel contract), got a mesh of " +
                     std::to_string(mesh_ndim) + " dims (" + q.found + "). Use reduction 'sum' or 'none', or " +
                     q.route.relax +
                     " for the exact global mean (one small all-reduce of its denominator over each mesh dim that "
                     "shards the rows)");
}

}  // namespace hyper_parallel::class_axis
