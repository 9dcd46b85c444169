// Layout: how one global tensor is spread over a mesh — mesh + placements + global
// shape/stride — and what that means for the calling rank (local shape and offset).
//
// Sharding follows torch.chunk: a dim of size S split n ways gives pieces of
// ceil(S/n), the last ones shorter or empty (uneven vocabularies, V % tp != 0).
// Several mesh dims may shard the same tensor dim; they nest in mesh-dim order.
// A Layout is immutable and cheap to copy; its hash is computed once.
#pragma once

#include <c10/util/ArrayRef.h>

#include <memory>
#include <string>
#include <vector>

#include "hyper_parallel/core/device_mesh.h"
#include "hyper_parallel/core/placement.h"
#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel {

class Layout {
 public:
  Layout() = default;
  // Empty `stride` means contiguous. Shard dims are normalised; throws when the
  // placements do not fit the mesh or the shape.
  Layout(DeviceMesh mesh, Placements placements, std::vector<int64_t> shape, std::vector<int64_t> stride = {});

  bool defined() const { return data_ != nullptr; }
  const DeviceMesh& mesh() const { return data_->mesh; }
  const Placements& placements() const { return data_->placements; }
  const Placement& placement(int64_t mesh_dim) const { return data_->placements.at(mesh_dim); }
  const std::vector<int64_t>& shape() const { return data_->shape; }
  const std::vector<int64_t>& stride() const { return data_->stride; }
  int64_t ndim() const { return static_cast<int64_t>(data_->shape.size()); }

  // The calling rank's piece.
  const std::vector<int64_t>& local_shape() const { return data_->local_shape; }
  const std::vector<int64_t>& local_offset() const { return data_->local_offset; }
  // Piece of a rank at an arbitrary mesh coordinate.
  void local_piece_at(const std::vector<int64_t>& coordinate, std::vector<int64_t>* shape,
                      std::vector<int64_t>* offset) const;

  bool is_replicated() const;  // every placement Replicate
  bool has_partial() const;
  // Mesh dims that shard tensor dim `dim`, in mesh order.
  std::vector<int64_t> mesh_dims_sharding(int64_t dim) const;
  // True when at least two mesh dims shard the same tensor dim.
  bool has_nested_shards() const;

  // Same mesh and shape with other placements.
  Layout with_placements(Placements placements) const;

  bool operator==(const Layout& o) const;
  bool operator!=(const Layout& o) const { return !(*this == o); }
  size_t hash() const { return data_ ? data_->hash : 0; }
  std::string str() const;

 private:
  struct Data {
    DeviceMesh mesh;
    Placements placements;
    std::vector<int64_t> shape, stride, local_shape, local_offset;
    size_t hash = 0;
  };
  std::shared_ptr<const Data> data_;
};

std::vector<int64_t> contiguous_strides(c10::IntArrayRef shape);

}  // namespace hyper_parallel

HP_PUBLIC_END
