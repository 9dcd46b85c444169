#include "loss/class_sharding.h"

#include <c10/util/Exception.h>

#include <sstream>

#include "core/redistribute.h"
#include "dtensor/dtensor_impl.h"
#include "hyper_parallel/dtensor.h"
#include "hyper_parallel/parallelism_config.h"

namespace hyper_parallel {

namespace {
std::string expected_layout(int64_t class_dim) {
  return "a DTensor sharded along its class dim: placements [Shard(" + std::to_string(class_dim) +
         ")] on a 1-D tensor-parallel mesh";
}
}  // namespace

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
  if (!impl) {
    throw LossParallelLayoutError(op + " under loss_parallel: expected the input to be " + expected_layout(class_dim) +
                                  ", got a plain tensor of shape " + c10::str(t->sizes()));
  }
  const Layout& layout = impl->layout();
  const DeviceMesh& mesh = layout.mesh();
  const std::string got = to_string(layout.placements()) + " on " + mesh.str();
  const auto sharding = layout.mesh_dims_sharding(class_dim);
  for (const auto& p : layout.placements()) {
    if (p.is_partial()) {
      throw LossParallelLayoutError(op + " under loss_parallel: expected the input to be " +
                                    expected_layout(class_dim) + ", got " + got + " (reduce the Partial first)");
    }
  }
  if (sharding.empty()) {
    throw LossParallelLayoutError(op + " under loss_parallel: expected the input to be " + expected_layout(class_dim) +
                                  ", got " + got + ": the class dim " + std::to_string(class_dim) + " is not sharded");
  }
  if (sharding.size() > 1) {
    throw LossParallelUnsupportedError(op + " under loss_parallel: the class dim is sharded by " +
                                       std::to_string(sharding.size()) + " mesh dims (" + got +
                                       "); expected exactly one");
  }
  const int64_t m = sharding[0];
  if (options.mesh) {
    const bool whole = *options.mesh == mesh;
    const bool that_dim = options.mesh->ndim() == 1 && options.mesh->ranks() == mesh.comm(m).global_ranks();
    if (!whole && !that_dim) {
      throw LossParallelLayoutError(op + " under loss_parallel(mesh = " + options.mesh->str() +
                                    "): expected the input on that mesh, got " + got);
    }
  }
  const bool strict = effective_strict(options);
  if (mesh.ndim() != 1) {
    if (strict) {
      throw LossParallelLayoutError(op + " under loss_parallel (strict): expected " + expected_layout(class_dim) +
                                    ", got " + got + ". Use the 1-D sub-mesh (mesh[\"tp\"]) or strict = false");
    }
    // Non-strict: keep the class shard, gather every other mesh dim.
    Placements want(mesh.ndim(), Placement::replicate());
    want[m] = Placement::shard(class_dim);
    if (want != layout.placements()) {
      TORCH_WARN_ONCE("loss_parallel (strict = false): gathering the logits' non-class mesh dims (", got, " -> ",
                      to_string(want), ")");
      *t = differentiable ? redistribute(*t, want)
                          : make_dtensor(redistribute_local(impl->local(), layout, layout.with_placements(want)),
                                         layout.with_placements(want));
    }
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
