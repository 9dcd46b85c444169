// checkpoint_layout.h — how each checkpointed tensor lies over the ranks that saved it.
//
// A step's manifest records, for every tensor of the rank files (by its key in them:
// "model.<param>", "optim.<i>.exp_avg", ...), its global shape, dtype and placement on
// the tensor-parallel mesh: Shard(d) (tensor-parallel rank r holds torch.chunk piece r
// of dim d) or Replicate() (every rank holds the whole tensor: plain parameters, norms,
// the optimizer's step counter). Data-parallel replicas hold the same state, so the
// layout says nothing about them. From it a resume at another TP degree knows which
// saved files hold which part of a tensor (checkpoint_reshard.h) before it opens any.
#pragma once

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace hyper_parallel::train {

struct TensorLayout {
  std::vector<int64_t> shape;  // global
  int64_t shard_dim = -1;      // -1: Replicate()
  at::ScalarType dtype = at::kFloat;
  // Sharded data parallelism (fully_shard.h): dim 0 of each TP piece (the whole tensor
  // under Replicate()) is split torch.chunk-wise over this many dp_shard ranks; 1: not.
  int64_t dim0_shards = 1;
  bool operator==(const TensorLayout&) const = default;
};

// By the tensor's key in the rank files.
using LayoutTable = std::map<std::string, TensorLayout>;

// AdamW's step counter: one int64 scalar, the same on every rank.
inline TensorLayout step_counter_layout() { return TensorLayout{{}, -1, at::kLong}; }

// A rectangular part of a global tensor: where it starts and how big it is, per dim.
struct Box {
  std::vector<int64_t> offset;
  std::vector<int64_t> sizes;
  int64_t numel() const;
};

// The part the rank at `piece` of a replica holds: piece = dp_shard rank x tp + TP rank
// (the global rank order within a replica; the TP rank alone without FSDP). Its TP rank's
// torch.chunk piece along shard_dim (the whole tensor for Replicate()), then its dp_shard
// rank's chunk of that along dim 0 when dim0_shards > 1.
Box piece_of(const TensorLayout& layout, int64_t tp, int64_t piece);
// Whether every rank holds the whole tensor (Replicate(), not FSDP-sharded).
inline bool is_whole(const TensorLayout& layout) { return layout.shard_dim < 0 && layout.dim0_shards == 1; }

// The layout of a parameter (or a state of its shape): a DTensor's global shape and
// placement on its 1-D mesh, a plain tensor as Replicate(); FSDP's shards (a DTensor
// Shard(0) on a "dp_shard" mesh dim, after the "tp" dim when there is one) with
// dim0_shards. Throws std::invalid_argument naming `key` for a placement a checkpoint
// cannot hold (Partial, other meshes of several dims).
TensorLayout layout_of(const at::Tensor& t, const std::string& key);

// "Shard(0)", "Replicate()"; [515, 32].
std::string placement_string(const TensorLayout& layout);
std::string shape_string(const std::vector<int64_t>& shape);

nlohmann::json to_json(const LayoutTable& table);
// The manifest's table, checked: it comes from disk, so every shape, placement and dtype
// is validated; std::runtime_error naming `where`, the tensor and what is wrong.
LayoutTable layout_table_from_json(const nlohmann::json& j, const std::string& where);

}  // namespace hyper_parallel::train
