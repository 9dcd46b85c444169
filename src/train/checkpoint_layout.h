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

// The part tensor-parallel rank `tp_rank` of `tp` holds (torch.chunk arithmetic, as
// DTensor's Shard): the whole tensor for Replicate().
Box piece_of(const TensorLayout& layout, int64_t tp, int64_t tp_rank);

// The layout of a parameter (or a state of its shape): a DTensor's global shape and
// placement on its 1-D mesh, a plain tensor as Replicate(). Throws std::invalid_argument
// naming `key` for a placement a checkpoint cannot hold (Partial, a mesh of several dims).
TensorLayout layout_of(const at::Tensor& t, const std::string& key);

// "Shard(0)", "Replicate()"; [515, 32].
std::string placement_string(const TensorLayout& layout);
std::string shape_string(const std::vector<int64_t>& shape);

nlohmann::json to_json(const LayoutTable& table);
// The manifest's table, checked: it comes from disk, so every shape, placement and dtype
// is validated; std::runtime_error naming `where`, the tensor and what is wrong.
LayoutTable layout_table_from_json(const nlohmann::json& j, const std::string& where);

}  // namespace hyper_parallel::train
