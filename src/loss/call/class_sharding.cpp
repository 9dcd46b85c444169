#include "loss/call/class_sharding.h"

#include <ATen/ATen.h>
#include <ATen/core/Reduction.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "core/redistribute.h"
#include "dtensor/dtensor_impl.h"
#include "hyper_parallel/dtensor/dtensor.h"
#include "hyper_parallel/loss/parallelism_config.h"
#include "loss/call/call_agreement.h"
#include "loss/class_axis.h"

namespace hyper_parallel {

namespace {

std::string describe(const Layout& layout) { return to_string(layout.placements()) + " on " + layout.mesh().str(); }

class_axis::Placements neutral_placements(const Placements& ps) {
  class_axis::Placements out;
  for (const Placement& p : ps) {
    out.push_back(p.is_shard()       ? class_axis::shard(p.dim())
                  : p.is_replicate() ? class_axis::replicate()
                                     : class_axis::Placement{class_axis::Kind::Partial, -1});
  }
  return out;
}

// Neutral placements back (Shard and Replicate only: what a contract layout holds).
Placements placements_from_neutral(const class_axis::Placements& ps) {
  Placements out;
  for (const class_axis::Placement& p : ps)
    out.push_back(p.is_shard() ? Placement::shard(p.dim) : Placement::replicate());
  return out;
}

// The C++ DTensor route: it re-lays out, and lays out per-row results sharded.
const class_axis::Route kCppDTensorRoute{true, true, "a DTensor", "strict = false"};

[[noreturn]] void raise_refusal(const class_axis::Decision& d) {
  if (d.outcome == class_axis::Outcome::UnsupportedError) throw LossParallelUnsupportedError(d.message);
  throw LossParallelLayoutError(d.message);
}

}  // namespace

Placements ClassSharding::row_placements() const {
  return placements_from_neutral(
      class_axis::row_placements(neutral_placements(layout.placements()), mesh_dim, class_dim));
}

Layout ClassSharding::row_layout() const {
  std::vector<int64_t> shape = layout.shape();
  shape.erase(shape.begin() + class_dim);
  return Layout(layout.mesh(), row_placements(), shape);
}

std::vector<int64_t> ClassSharding::row_mesh_dims() const {
  std::vector<int64_t> dims;
  const Placements& ps = layout.placements();
  for (int64_t i = 0; i < static_cast<int64_t>(ps.size()); ++i) {
    if (i != mesh_dim && ps[i].is_shard()) dims.push_back(i);
  }
  return dims;
}

Placements ClassSharding::sum_placements() const {
  Placements out(layout.mesh().ndim(), Placement::replicate());
  for (int64_t d : row_mesh_dims()) out[d] = Placement::partial(ReduceOp::Sum);
  return out;
}

bool effective_strict(const LossParallelOptions& options) {
  return options.strict.value_or(parallelism_config().loss_parallel_strict_mesh);
}

bool is_class_sharded(const at::Tensor& t, int64_t class_dim) {
  auto* impl = dtensor_impl(t);
  if (!impl || class_dim >= t.dim()) return false;
  return !impl->layout().mesh_dims_sharding(class_dim).empty();
}

ClassSharding resolve_class_sharding(at::Tensor* t, int64_t class_dim, const std::string& op,
                                     const LossParallelOptions& options, bool differentiable) {
  auto* impl = dtensor_impl(*t);
  class_axis::Question q;
  q.route = kCppDTensorRoute;
  q.class_dim = class_dim;
  q.op = op;
  if (!impl) {
    q.is_dtensor = false;
    q.found = c10::str(t->sizes());
    raise_refusal(class_axis::decide(q));
  }
  const Layout& layout = impl->layout();
  const DeviceMesh& mesh = layout.mesh();
  q.placements = neutral_placements(layout.placements());
  q.found = describe(layout);
  if (options.mesh) {
    q.options_mesh = options.mesh->str();
    for (int64_t d = 0; d < mesh.ndim(); ++d) {  // the whole mesh, or that dim's ranks as a 1-D mesh
      q.options_mesh_fits.push_back(
          *options.mesh == mesh || (options.mesh->ndim() == 1 && options.mesh->ranks() == mesh.comm(d).global_ranks()));
    }
  }
  class_axis::Decision decision = class_axis::decide(q);
  if (decision.outcome == class_axis::Outcome::NeedsStrictness) {
    // Strictness decides here, on each rank alone, between a refusal and a re-layout (the
    // redistribution's collectives): the ranks of the whole mesh agree on it first (one small
    // all-gather per mesh dim, on this refusal or re-layout path only).
    LossCallRecord call;
    call.op = op;
    record_context(call);
    call.strict = effective_strict(options);
    std::vector<const Communicator*> comms;
    for (int64_t d = 0; d < mesh.ndim(); ++d) comms.push_back(&mesh.comm(d));
    agree_on_context(call, comms, impl->local().device());
    q.strictness = effective_strict(options) ? class_axis::Strictness::Strict : class_axis::Strictness::Relaxed;
    decision = class_axis::decide(q);
  }
  if (decision.outcome != class_axis::Outcome::Resolved) raise_refusal(decision);
  const int64_t m = decision.mesh_dim;
  if (decision.relayout) {
    const Placements want = placements_from_neutral(decision.want);
    TORCH_WARN_ONCE("loss_parallel (strict = false): re-laying out the logits (", q.found, " -> ", to_string(want),
                    ")");
    *t = differentiable ? redistribute(*t, want)
                        : make_dtensor(redistribute_local(impl->local(), layout, layout.with_placements(want)),
                                       layout.with_placements(want));
  }
  const Layout& final_layout = layout_of(*t);
  ClassSharding cs;
  cs.layout = final_layout;
  cs.class_dim = class_dim;
  cs.mesh_dim = m;
  cs.shard.comm = &final_layout.mesh().comm(m);
  cs.shard.offset = final_layout.local_offset()[class_dim];
  cs.shard.local = final_layout.local_shape()[class_dim];
  cs.shard.total = final_layout.shape()[class_dim];
  return cs;
}

at::Tensor laid_out_local(const at::Tensor& t, const Placements& want, c10::IntArrayRef global_shape,
                          const std::string& what, const std::string& op, const ClassSharding& cs, bool strict) {
  const DeviceMesh& mesh = cs.layout.mesh();
  const bool all_replicate = std::all_of(want.begin(), want.end(), [](const Placement& p) { return p.is_replicate(); });
  auto* impl = dtensor_impl(t);
  if (!impl) {
    for (int64_t i = 0; i < static_cast<int64_t>(want.size()); ++i) {
      if (i != cs.mesh_dim && want[i].is_shard()) {
        throw LossParallelLayoutError(
            op + " under loss_parallel: expected the " + what + " as a DTensor laid out " + to_string(want) + " on " +
            mesh.str() +
            " (loss_parallel requires a DTensor, not a plain tensor, when the logits' other mesh dims shard their "
            "rows: a plain tensor could be the whole or this rank's piece), got a plain tensor of shape " +
            c10::str(t.sizes()) + ". Wrap it with make_dtensor or distribute_tensor");
      }
    }
    if (all_replicate) return t;  // the whole value: the caller checks its shape, in ATen's words
    TORCH_CHECK_VALUE(t.sizes() == global_shape, op, ": expected a ", what, " of shape ", global_shape,
                      " for logits of shape ", c10::IntArrayRef(cs.layout.shape()), ", got ", t.sizes());
    return local_piece(t, Layout(mesh, want, global_shape.vec()));  // a local cut along the class dim
  }
  const Layout& l = impl->layout();
  if (l.mesh() != mesh) {
    throw LossParallelLayoutError(op + " under loss_parallel: expected the " + what + " on the logits' mesh " +
                                  mesh.str() + " (or a plain tensor), got one on " + l.mesh().str());
  }
  if (all_replicate && l.is_replicated()) return impl->local();  // as a plain tensor
  TORCH_CHECK_VALUE(c10::IntArrayRef(l.shape()) == global_shape, op, ": expected a ", what, " of shape ", global_shape,
                    " for logits of shape ", c10::IntArrayRef(cs.layout.shape()), ", got ",
                    c10::IntArrayRef(l.shape()));
  if (l.placements() == want) return impl->local();
  const Layout want_layout(mesh, want, global_shape.vec());
  if (l.is_replicated()) return redistribute_local(impl->local(), l, want_layout);  // a local cut
  if (strict) {
    const std::string expected = all_replicate
                                     ? " to be replicated (a plain tensor or a DTensor with Replicate() "
                                       "on every mesh dim)"
                                     : " laid out " + to_string(want) + " on " + mesh.str() +
                                           " (the rows of the logits " + describe(cs.layout) + "), or replicated";
    throw LossParallelLayoutError(op + " under loss_parallel (strict): expected the " + what + expected + ", got " +
                                  describe(l));
  }
  TORCH_WARN_ONCE("loss_parallel (strict = false): re-laying out the ", what, " (", to_string(l.placements()), " -> ",
                  to_string(want), ")");
  return redistribute_local(impl->local(), l, want_layout);
}

void check_mean_on_mesh(const ClassSharding& cs, int64_t reduction, const std::string& op, bool strict) {
  if (reduction != at::Reduction::Mean) return;
  class_axis::Question q;
  q.placements = neutral_placements(cs.layout.placements());
  q.route = kCppDTensorRoute;
  q.strictness = strict ? class_axis::Strictness::Strict : class_axis::Strictness::Relaxed;
  q.op = op;
  q.found = describe(cs.layout);
  const class_axis::Decision decision = class_axis::decide_mean(q);
  if (decision.outcome != class_axis::Outcome::Resolved) raise_refusal(decision);
}

at::Tensor global_mean_denominator(const at::Tensor& local_denominator, const at::TensorOptions& options,
                                   const ClassSharding& cs, const std::exception_ptr& refused_here,
                                   const std::string& op) {
  // [denominator, groups that refused]: one all-reduce per mesh dim, refusal or not.
  at::Tensor sums = at::zeros({2}, options);
  if (refused_here) {
    sums.select(0, 1).fill_(1);
  } else {
    sums.select(0, 0).copy_(local_denominator);
  }
  for (int64_t d : cs.row_mesh_dims()) cs.layout.mesh().comm(d).all_reduce_(sums, ReduceOp::Sum);
  if (refused_here) std::rethrow_exception(refused_here);
  if (sums[1].item<double>() > 0) {
    throw LossParallelLayoutError(op + " under loss_parallel: the inputs were refused on other ranks of the mesh (" +
                                  describe(cs.layout) +
                                  ": a group of the mesh dims that shard the rows, where the error names the input); "
                                  "reduction 'mean' sums its denominator over those dims, so no rank returns a loss");
  }
  return sums[0];
}

at::Tensor replicated_value(const at::Tensor& t, const std::string& what, const std::string& op) {
  auto* impl = dtensor_impl(t);
  if (!impl) return t;
  if (!impl->layout().is_replicated()) {
    throw LossParallelLayoutError(op + " under loss_parallel: expected the " + what +
                                  " to be replicated (a plain tensor or a DTensor with [Replicate()]), got " +
                                  to_string(impl->layout().placements()));
  }
  return impl->local();
}

}  // namespace hyper_parallel
