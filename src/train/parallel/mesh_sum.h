// mesh_sum.h — a tensor summed over every rank of a mesh, the Trainer's and the dry run's
// token counts and loss sums.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "hyper_parallel/core/communicator.h"
#include "hyper_parallel/core/device_mesh.h"

namespace hyper_parallel::train {

// Sums `values` (on `mesh`'s device) in place over every rank of `mesh` (all its dims); no
// mesh: nothing to sum.
inline void sum_over_mesh(at::Tensor& values, const std::optional<DeviceMesh>& mesh) {
  if (!mesh) return;
  for (int64_t d = 0; d < mesh->ndim(); ++d) mesh->comm(d).all_reduce_(values, ReduceOp::Sum);
}

}  // namespace hyper_parallel::train
