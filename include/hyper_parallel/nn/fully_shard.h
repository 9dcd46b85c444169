// Sharded data parallelism (FSDP2, ZeRO-3) over the "dp_shard" dim of a mesh, composed
// with tensor parallelism on its "tp" dim and with replicas on its "dp_replicate" dim
// (HSDP). What each rank keeps is its shard: dim 0 of every parameter's local piece (its
// TP piece, or the whole tensor) split torch.chunk-wise over dp_shard, as a DTensor the
// optimizer updates: [tp placement, Shard(0)] on the mesh's ("tp", "dp_shard") dims, or
// [Shard(0)] on "dp_shard" for a parameter TP leaves whole. Shards are float32 (float64
// when the model's parameters are): they are the master weights of a bfloat16 model.
//
//   auto fsdp = std::make_shared<FullyShardedParameters>(groups, world_mesh);
//   model->set_block_hooks(fsdp);         // the model calls before_forward / before_block ...
//   AdamW opt(fsdp->shards(), ...);
//   for each micro-batch: loss.backward(); fsdp->finish_backward();
//   clip_grad_norm_(fsdp->shards(), ...); opt.step();
//
// The model's own parameters become compute buffers in the model's dtype: their storage
// is filled by one all-gather per group just before the group is read, and released
// after (reshard_after_forward), or once the group's gradients are taken in backward.
// groups[0] is the root (embeddings, final norm, head): gathered at the forward's start,
// freed after backward. groups[1 + i] is transformer block i. In forward, block i + 1's
// all-gather is issued before block i computes; in backward, block i - 1's when block i's
// gradient arrives. When every parameter of a group has its gradient, the group's
// gradients (widened to the reduce dtype, rows padded to equal chunks) go out in one
// reduce-scatter while backward goes on; its result is added to the shards' .grad.
// Uneven dims are padded inside the collectives: any shard degree works with any size.
//
// Every micro-batch's gradients are reduce-scattered (FSDP2's default): keeping them
// unsharded until the last micro-batch would cost the full gradient per rank.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hyper_parallel/nn/block_hooks.h"
#include "hyper_parallel/core/device_mesh.h"
#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel {

struct FullyShardOptions {
  // Free a block's gathered parameters after its forward (gathered again for its
  // backward); false keeps them from forward to backward (more memory, fewer gathers).
  bool reshard_after_forward = true;
  // The dtype gradients are reduce-scattered in; nullopt: the shards' (float32, or float64).
  std::optional<at::ScalarType> reduce_dtype;
};

// Since construction, on this rank.
struct FullyShardStats {
  int64_t all_gathers = 0;
  int64_t reduce_scatters = 0;
  int64_t bytes_sent = 0;
  double collective_seconds = 0;  // issue to completion, summed over the collectives
  double blocked_seconds = 0;     // of it, the time this rank waited (not overlapped)
};

class FullyShardedParameters final : public BlockHooks {
 public:
  using NamedParameters = std::vector<std::pair<std::string, at::Tensor>>;
  // `groups`: the model's parameters (registered, requires_grad), root first, then one
  // group per block. `mesh` has a "dp_shard" dim, and may have "dp_replicate" and "tp"
  // (the one the parameters' DTensors live on). The parameters' current values become the
  // shards. Throws std::invalid_argument naming the parameter for one that cannot be
  // sharded (two parameters sharing storage, a DTensor on another mesh, a Partial one).
  FullyShardedParameters(const std::vector<NamedParameters>& groups, const DeviceMesh& mesh,
                         FullyShardOptions options = {});
  ~FullyShardedParameters() override;
  FullyShardedParameters(const FullyShardedParameters&) = delete;
  FullyShardedParameters& operator=(const FullyShardedParameters&) = delete;

  // The leaves the optimizer updates and checkpoints hold, named as the model's
  // parameters, root group first.
  const std::vector<at::Tensor>& shards() const;
  const std::vector<std::string>& names() const;

  void before_forward() override;
  void before_block(int64_t index) override;
  void after_block(int64_t index, const at::Tensor& output) override;

  // After each backward: waits for the reduce-scatters still running, adds them to the
  // shards' .grad, frees what is still gathered. A parameter that got no gradient in the
  // backward is an error naming it.
  void finish_backward();
  // Frees every gathered parameter (after a forward without backward, e.g. validation).
  void reshard();
  // The full values of the model's parameters, gathered into them (e.g. to export the
  // model) until the next reshard().
  void gather_all();

  FullyShardStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hyper_parallel

HP_PUBLIC_END
