// checkpoint_layout.cpp — tensor layouts of a checkpoint, and their JSON in the manifest.
#include "train/checkpoint/checkpoint_layout.h"

#include <c10/core/ScalarType.h>

#include <stdexcept>

#include "hyper_parallel/core/communicator.h"
#include "hyper_parallel/dtensor/dtensor.h"

namespace hyper_parallel::train {
namespace {

// The dtypes a checkpoint holds (parameters, optimizer state, step counters), by
// c10's name for them.
constexpr at::ScalarType kDtypes[] = {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf, at::kLong, at::kInt};

// A tensor's dims and elements stay far below what would overflow int64 arithmetic.
constexpr int64_t kMaxElements = int64_t{1} << 48;

}  // namespace

int64_t Box::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

Box piece_of(const TensorLayout& layout, int64_t tp, int64_t piece) {
  Box box{std::vector<int64_t>(layout.shape.size(), 0), layout.shape};
  if (layout.shard_dim >= 0) {
    const auto d = static_cast<size_t>(layout.shard_dim);
    const ChunkRange r = chunk_range(layout.shape[d], tp, piece % tp);
    box.offset[d] = r.offset;
    box.sizes[d] = r.length;
  }
  if (layout.dim0_shards > 1 && !box.sizes.empty()) {
    const ChunkRange r = chunk_range(box.sizes[0], layout.dim0_shards, piece / tp);
    box.offset[0] += r.offset;
    box.sizes[0] = r.length;
  }
  return box;
}

TensorLayout layout_of(const at::Tensor& t, const std::string& key) {
  TensorLayout l;
  l.shape = t.sizes().vec();
  l.dtype = t.scalar_type();
  if (!is_dtensor(t)) return l;
  const Placements& ps = placements_of(t);
  const std::vector<std::string>& names = mesh_of(t).dim_names();
  // FSDP: [Shard(0)] on ("dp_shard"), or [TP placement, Shard(0)] on ("tp", "dp_shard").
  const bool fsdp = !names.empty() && names.back() == "dp_shard" && ps.back().is_shard() &&
                    ps.back().normalized(t.dim()).dim() == 0 &&
                    (ps.size() == 1 || (ps.size() == 2 && names[0] == "tp"));
  if (fsdp) l.dim0_shards = mesh_of(t).size(static_cast<int64_t>(ps.size()) - 1);
  const size_t tp_placements = fsdp ? ps.size() - 1 : ps.size();
  if ((!fsdp && ps.size() != 1) || (tp_placements == 1 && ps[0].is_partial())) {
    throw std::invalid_argument("checkpoint: tensor " + key + " is a DTensor with placements " + to_string(ps) +
                                "; a checkpoint holds Shard(d) or Replicate() on a 1-D tensor-parallel mesh, and "
                                "FSDP's Shard(0) on a \"dp_shard\" dim after it");
  }
  if (tp_placements == 1 && ps[0].is_shard()) l.shard_dim = ps[0].normalized(t.dim()).dim();
  return l;
}

std::string placement_string(const TensorLayout& layout) {
  return layout.shard_dim < 0 ? "Replicate()" : "Shard(" + std::to_string(layout.shard_dim) + ")";
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

nlohmann::json to_json(const LayoutTable& table) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [key, l] : table) {
    j[key] = {{"shape", l.shape}, {"placement", placement_string(l)}, {"dtype", c10::toString(l.dtype)}};
    if (l.dim0_shards > 1) j[key]["dim0_shards"] = l.dim0_shards;
  }
  return j;
}

LayoutTable layout_table_from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) throw std::runtime_error(where + ": 'tensors' is not an object");
  LayoutTable table;
  for (const auto& [key, entry] : j.items()) {
    const std::string at = where + ": tensor " + key;
    if (!entry.is_object()) throw std::runtime_error(at + " is not an object");
    TensorLayout l;
    const auto shape = entry.find("shape");
    if (shape == entry.end() || !shape->is_array() || shape->size() > 16) {
      throw std::runtime_error(at + ": expected 'shape', an array of at most 16 sizes");
    }
    int64_t numel = 1;
    for (const auto& s : *shape) {
      if (!s.is_number_integer() || s.get<int64_t>() < 0 || s.get<int64_t>() > kMaxElements) {
        throw std::runtime_error(at + ": 'shape' " + shape->dump() +
                                 " holds a size that is not an integer in [0, 2^48]");
      }
      l.shape.push_back(s.get<int64_t>());
      numel = l.shape.back() == 0 ? 0 : numel * l.shape.back();
      if (numel > kMaxElements) throw std::runtime_error(at + ": 'shape' " + shape->dump() + " has over 2^48 elements");
    }
    const auto placement = entry.find("placement");
    const std::string p = placement != entry.end() && placement->is_string() ? placement->get<std::string>() : "";
    bool known = p == "Replicate()";
    for (int64_t d = 0; !known && d < static_cast<int64_t>(l.shape.size()); ++d) {
      if (p == "Shard(" + std::to_string(d) + ")") {
        l.shard_dim = d;
        known = true;
      }
    }
    if (!known) {
      throw std::runtime_error(at + ": placement " + (placement == entry.end() ? "(missing)" : placement->dump()) +
                               " is neither Replicate() nor Shard(d) for a dim d of its shape " +
                               shape_string(l.shape));
    }
    const auto dtype = entry.find("dtype");
    known = false;
    for (at::ScalarType t : kDtypes) {
      if (dtype != entry.end() && dtype->is_string() && dtype->get<std::string>() == c10::toString(t)) {
        l.dtype = t;
        known = true;
      }
    }
    if (!known) {
      throw std::runtime_error(at + ": dtype " + (dtype == entry.end() ? "(missing)" : dtype->dump()) +
                               " is not one a checkpoint holds (Float, Double, BFloat16, Half, Long, Int)");
    }
    if (const auto shards = entry.find("dim0_shards"); shards != entry.end()) {
      if (!shards->is_number_integer() || shards->get<int64_t>() < 1 || shards->get<int64_t>() > (1 << 20)) {
        throw std::runtime_error(at + ": 'dim0_shards' " + shards->dump() + " is not an integer in [1, 2^20]");
      }
      if (l.shape.empty()) throw std::runtime_error(at + ": 'dim0_shards' on a tensor without dims");
      l.dim0_shards = shards->get<int64_t>();
    }
    table.emplace(key, l);
  }
  return table;
}

}  // namespace hyper_parallel::train
