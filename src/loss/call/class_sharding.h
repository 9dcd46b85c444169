// Which mesh dim shards the class dim of a tensor, validated against the loss_parallel
// contract (internal). Every loss_parallel kernel starts here; the decision and its wording are
// the one every front end shares (loss/class_axis.h), acted on here on the C++ DTensor.
//
// The contract (PyTorch 2.15's loss_parallel): exactly one mesh dim shards the class dim
// (Shard(class_dim), the tensor-parallel dim, anywhere in the mesh); every other mesh dim
// is Replicate or a Shard of another tensor dim (batch, sequence). Tensors over the
// logits' rows (the target, a per-row loss) take the "row placements": the logits' with the
// class shard made Replicate and a Shard of a later dim moved down one.
#pragma once

#include <ATen/core/Tensor.h>

#include <exception>
#include <vector>

#include "hyper_parallel/core/layout.h"
#include "hyper_parallel/loss/loss_parallel.h"

namespace hyper_parallel {

// This rank's slice of the classes: all the kernels need to know of the sharding.
struct ClassShard {
  const Communicator* comm = nullptr;  // the group holding the other slices; null: one process
  int64_t offset = 0;                  // first global class held here
  int64_t local = 0;                   // classes held here (may be 0)
  int64_t total = 0;                   // C
};

// A class-sharded tensor's layout and where in it the classes are.
struct ClassSharding {
  Layout layout;          // of the (possibly re-laid-out) class-sharded tensor
  int64_t class_dim = 1;  // tensor dim holding the classes
  int64_t mesh_dim = 0;   // mesh dim sharding it
  ClassShard shard;       // this rank's slice of that dim

  // The placements of a tensor over the logits' rows (the target, a per-row loss).
  Placements row_placements() const;
  // That tensor's layout: the logits' mesh, row placements, shape without the class dim.
  Layout row_layout() const;
  // The mesh dims other than the class dim's that shard the rows.
  std::vector<int64_t> row_mesh_dims() const;
  // A sum over the local rows: Partial(sum) on row_mesh_dims, Replicate elsewhere.
  Placements sum_placements() const;
};

// Tensor dim holding the classes for cross_entropy / nll_loss inputs: 1, or 0 for 1-D.
inline int64_t class_dim_of(int64_t ndim) { return ndim == 1 ? 0 : 1; }

// True when `t` is a DTensor whose `class_dim` is sharded on some mesh dim.
bool is_class_sharded(const at::Tensor& t, int64_t class_dim);

// Validates `t` (named `what` in messages, for op `op`) under the options in force and
// returns its sharding. A layout outside the contract (a Partial, the class dim sharded by
// two mesh dims) is LossParallelLayoutError under strict; with strict = false *t is
// re-laid out to the nearest contract layout (a warning): the class shard kept on the last
// mesh dim that shards it, Partials reduced, the rest gathered — differentiably when called
// above autograd (`differentiable`), on the raw pieces below it.
ClassSharding resolve_class_sharding(at::Tensor* t, int64_t class_dim, const std::string& op,
                                     const LossParallelOptions& options, bool differentiable);

// This rank's piece of `t` (the `what` of op `op`), which must be laid out as `want` on the
// logits' mesh: the target (want = row placements), probability targets (the logits').
// `global_shape` is what its global shape must be. A plain tensor is taken only where the
// row placements shard nothing (it could be the whole or a piece); a Replicate DTensor is
// cut to the piece locally (no communication); another layout is LossParallelLayoutError
// under strict, redistributed with a warning without. Probability targets given as a plain
// tensor are cut along the class dim too.
at::Tensor laid_out_local(const at::Tensor& t, const Placements& want, c10::IntArrayRef global_shape,
                          const std::string& what, const std::string& op, const ClassSharding& cs, bool strict);

// reduction 'mean' under strict on a mesh of more than one dim: LossParallelUnsupportedError
// (PyTorch's contract: its loss_parallel supports 'mean' on a one-dimensional mesh only), as
// class_axis::decide_mean says for every front end.
void check_mean_on_mesh(const ClassSharding& cs, int64_t reduction, const std::string& op, bool strict);

// The global mean's denominator: this rank's (the weight or count of its counted rows, a
// scalar of `options`) summed over the mesh dims that shard the rows, one small all-reduce
// per such dim. `refused_here`: this rank's group refused the call (its error, rethrown
// after the sums); the sums carry that, so that the other groups raise too
// (LossParallelLayoutError naming `op`) instead of waiting for this one.
at::Tensor global_mean_denominator(const at::Tensor& local_denominator, const at::TensorOptions& options,
                                   const ClassSharding& cs, const std::exception_ptr& refused_here,
                                   const std::string& op);

// A target or weight must be a plain tensor or a Replicate DTensor; returns its value.
at::Tensor replicated_value(const at::Tensor& t, const std::string& what, const std::string& op);

// The loss's effective strictness (guard option, else ParallelismConfig).
bool effective_strict(const LossParallelOptions& options);

}  // namespace hyper_parallel
