// DeviceMesh: ranks arranged in an N-D grid, one process group per mesh dimension.
//
//   auto mesh = hp::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
//   auto tp = mesh["tp"];              // 1-D sub-mesh along "tp", sharing its group
//   tp.comm(0).all_reduce_(t, ReduceOp::Sum);
//
// A DeviceMesh is a cheap handle (shared, immutable); two meshes compare equal when
// they have the same device type, shape and ranks.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "hyper_parallel/core/communicator.h"
#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel {

struct MeshOptions {
  // Collective timeout of the mesh's groups; defaults to the world's.
  std::optional<std::chrono::milliseconds> timeout;
  // Process-group backend of the mesh's groups ("gloo", "nccl"); defaults to the world's
  // when the device types agree, else the device type's default.
  std::optional<std::string> backend;
};

class DeviceMesh {
 public:
  DeviceMesh() = default;

  bool defined() const { return data_ != nullptr; }
  const std::string& device_type() const;
  // Where this rank's tensors of the mesh live: CPU, or its own GPU for a "cuda" mesh.
  c10::Device device() const;
  int64_t ndim() const;
  const std::vector<int64_t>& shape() const;
  int64_t size(int64_t mesh_dim) const;
  int64_t size() const;  // number of ranks
  const std::vector<std::string>& dim_names() const;
  // Global ranks in row-major mesh order.
  const std::vector<int64_t>& ranks() const;

  // The caller's global rank and its coordinate in the mesh.
  int64_t get_rank() const;
  const std::vector<int64_t>& coordinate() const;
  int64_t local_rank(int64_t mesh_dim) const { return coordinate().at(mesh_dim); }

  // The group along one mesh dimension that contains the caller.
  const Communicator& comm(int64_t mesh_dim) const;
  int64_t mesh_dim_index(const std::string& name) const;

  // Sub-mesh along the named dims (in the given order), e.g. mesh["tp"].
  DeviceMesh operator[](const std::string& name) const;
  DeviceMesh slice(const std::vector<std::string>& names) const;

  // A fresh seed for the next random op on this mesh. Every rank of the mesh gets the same
  // sequence, as long as all run the same random ops (SPMD): at first use the ranks adopt
  // the seed of LibTorch's default generator on mesh coordinate 0 (one broadcast per mesh
  // dim of the root mesh), unless manual_seed() set one. Sub-meshes share their root's.
  uint64_t next_random_seed() const;
  // Restarts the mesh's random sequence from `seed`; call it with the same seed on every rank.
  void manual_seed(uint64_t seed) const;
  // How many random ops the mesh's sequence has drawn, and a return to such a position, so
  // that code run again (activation checkpointing's recompute) draws what it drew the first
  // time. Sub-meshes share their root's position.
  uint64_t random_ops_drawn() const;
  void rewind_random_ops(uint64_t ops_drawn) const;

  // Identifies the groups and the caller's place in them: two handles with the same
  // identity issue collectives on the same process groups.
  size_t identity_hash() const;
  // Never reused within the process (unlike an address): the same id means the same mesh
  // object (same groups, same place in them). Sub-meshes get ids of their own.
  uint64_t uid() const;

  bool operator==(const DeviceMesh& o) const;
  bool operator!=(const DeviceMesh& o) const { return !(*this == o); }
  size_t hash() const;
  std::string str() const;

  struct Data;
  explicit DeviceMesh(std::shared_ptr<const Data> d) : data_(std::move(d)) {}

 private:
  const Data& data() const;
  std::shared_ptr<const Data> data_;
};

// Creates the mesh over all ranks of the world (initialising the world from the
// environment first when needed, as PyTorch does). Every rank must call it, in the
// same order relative to other mesh creations.
DeviceMesh init_device_mesh(const std::string& device_type, const std::vector<int64_t>& shape,
                            const std::vector<std::string>& dim_names = {}, const MeshOptions& options = {});

std::ostream& operator<<(std::ostream& os, const DeviceMesh& m);

}  // namespace hyper_parallel

HP_PUBLIC_END
