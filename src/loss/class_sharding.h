// Which mesh dim shards the class dim of a tensor, validated against the loss_parallel
// contract (internal). Every loss_parallel kernel starts here, so every layout error
// is raised in one place with one wording.
#pragma once

#include <ATen/core/Tensor.h>

#include "hyper_parallel/layout.h"
#include "hyper_parallel/loss_parallel.h"

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
};

// Tensor dim holding the classes for cross_entropy / nll_loss inputs: 1, or 0 for 1-D.
inline int64_t class_dim_of(int64_t ndim) { return ndim == 1 ? 0 : 1; }

// True when `t` is a DTensor whose `class_dim` is sharded on some mesh dim.
bool is_class_sharded(const at::Tensor& t, int64_t class_dim);

// Validates `t` (named `what` in messages, for op `op`) under the options in force and
// returns its sharding. With strict = false, other sharded mesh dims are gathered (a
// warning) and *t is replaced by the re-laid-out tensor — differentiably when called
// above autograd (`differentiable`), on the raw pieces below it. Throws
// LossParallelLayoutError or LossParallelUnsupportedError.
ClassSharding resolve_class_sharding(at::Tensor* t, int64_t class_dim, const std::string& op,
                                     const LossParallelOptions& options, bool differentiable);

// A target or weight must be a plain tensor or a Replicate DTensor; returns its value.
at::Tensor replicated_value(const at::Tensor& t, const std::string& what, const std::string& op);

// The loss's effective strictness (guard option, else ParallelismConfig).
bool effective_strict(const LossParallelOptions& options);

}  // namespace hyper_parallel
