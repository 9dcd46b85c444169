// Redistribution of a local piece from one Layout to another (internal).
//
// Works on every Shard/Replicate/Partial transition on every mesh dim, nested shards
// included, in three phases so that torch.chunk nesting stays exact:
//   1. un-shard (all-gather), last mesh dim first, every shard that must change;
//   2. reduce partials (all-reduce, or reduce-scatter straight into a target shard);
//   3. apply target shards (local chunk) and partials, first mesh dim first.
// Each collective runs on the group of the mesh dim it concerns.
#pragma once

#include <ATen/core/Tensor.h>

#include "hyper_parallel/core/layout.h"

namespace hyper_parallel {

at::Tensor redistribute_local(const at::Tensor& local, const Layout& from, const Layout& to);

// Partial -> Replicate everywhere: the placements a gradient flowing back into a
// tensor of `placements` must have (PyTorch's backward rule).
Placements partial_to_replicate(const Placements& placements);

}  // namespace hyper_parallel
