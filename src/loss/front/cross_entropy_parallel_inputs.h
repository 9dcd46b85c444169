// The inputs of loss_parallel's fused cross_entropy, checked (internal): what strictness and
// the options refuse, the target and class weight on the logits' mesh and device, their shapes,
// dtypes and ranges. cross_entropy_parallel runs it inside LossCallPlan's checks, so that a
// refusal on one rank is the same error on every rank.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <cstdint>

#include "hyper_parallel/core/layout.h"
#include "loss/call/class_sharding.h"
#include "loss/math/fused_cross_entropy.h"

namespace hyper_parallel {

// One call of cross_entropy on class-sharded logits, as cross_entropy_parallel resolved it.
struct CrossEntropyParallelCall {
  const ClassSharding& cs;
  const at::Tensor& local_logits;
  const at::Tensor& target;
  const c10::optional<at::Tensor>& weight;
  const Layout& row_layout;  // of the target and a per-row loss
  int64_t reduction;         // as called ('mean' stays 'mean' for the global mean)
  bool strict;
  bool global_mean;  // 'mean' over rows that other mesh dims shard
  double z_loss_weight;
};

// Checks `call`'s inputs for `shard`'s vocabulary and sets ce's target (this rank's rows) and
// class weight (compute type). ce's definition and `soft` are set already.
void check_cross_entropy_parallel_inputs(const CrossEntropyParallelCall& call, const ClassShard& shard,
                                         FusedCrossEntropy& ce);

}  // namespace hyper_parallel
