// local_piece.h — a training tensor's local piece, and a local piece laid out as another
// tensor. Parameters, their gradients, masters and optimizer moments are DTensors under
// TP and plain tensors without it; these treat both alike.
#pragma once

#include <ATen/core/Tensor.h>

#include "hyper_parallel/dtensor/dtensor.h"

namespace hyper_parallel::train {

// This rank's piece of a DTensor; a plain tensor as is.
inline at::Tensor local_or_plain(const at::Tensor& t) { return is_dtensor(t) ? to_local(t) : t; }

// `local` laid out like `like` (a DTensor's mesh, placements, global shape and stride), or
// as is when `like` is a plain tensor.
inline at::Tensor shaped_like(const at::Tensor& local, const at::Tensor& like) {
  if (!is_dtensor(like)) return local;
  FromLocalOptions o;
  o.shape = like.sizes().vec();
  o.stride = like.strides().vec();
  return DTensor::from_local(local, mesh_of(like), placements_of(like), o);
}

}  // namespace hyper_parallel::train
