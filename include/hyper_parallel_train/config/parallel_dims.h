// parallel_dims.h — a job's ranks as dp_replicate x dp_shard x tp, and everything that
// follows from those three numbers: the device meshes and their dim names, and which
// replica, shard, tensor-parallel rank and batch rows a global rank has (TorchTitan's
// ParallelDims). The Trainer, the checkpoint manager (for the layout a checkpoint was saved
// at as much as for this job's) and the config checks all ask it, so the arithmetic exists
// once.
//
// Global rank = (replica x dp_shard + shard) x tp + tp_rank (TorchTitan's order: the TP
// ranks of a shard are neighbours, data parallelism outermost). A rank's "piece" is its
// position within its replica, shard x tp + tp_rank: which part of every parameter it holds.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "hyper_parallel/core/device_mesh.h"
#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel::train {

struct ParallelismJobConfig;

class ParallelDims {
 public:
  // Every degree >= 1; std::invalid_argument naming the one that is not.
  ParallelDims(int64_t dp_replicate, int64_t dp_shard, int64_t tp);
  // parallelism.data_parallel_degree, data_parallel_shard_degree, tensor_parallel_degree.
  static ParallelDims of(const ParallelismJobConfig& parallelism);

  int64_t dp_replicate() const { return dp_replicate_; }
  int64_t dp_shard() const { return dp_shard_; }
  int64_t tp() const { return tp_; }
  int64_t world_size() const { return dp_replicate_ * dp_shard_ * tp_; }
  // Ranks with different rows of the batch: replicas x shards.
  int64_t dp_ranks() const { return dp_replicate_ * dp_shard_; }
  // Ranks that hold different pieces of the parameters: one replica.
  int64_t pieces() const { return dp_shard_ * tp_; }
  bool tp_enabled() const { return tp_ > 1; }
  bool fsdp_enabled() const { return dp_shard_ > 1; }
  bool dp_enabled() const { return dp_ranks() > 1; }

  int64_t replica_of(int64_t rank) const { return rank / pieces(); }
  int64_t piece_of(int64_t rank) const { return rank % pieces(); }
  int64_t shard_of(int64_t rank) const { return piece_of(rank) / tp_; }
  int64_t tp_rank_of(int64_t rank) const { return rank % tp_; }
  // Which rows of every step's batch the rank trains on, among dp_ranks().
  int64_t dp_rank_of(int64_t rank) const { return rank / tp_; }
  // The rank holding `piece` in `replica`.
  int64_t rank_of(int64_t replica, int64_t piece) const { return replica * pieces() + piece; }

  // How the ranks of a job come to be, for the remedy a wrong world size names.
  enum class Ranks { Launched, Played };  // by a launcher (hp-run, torchrun); by hp-dry-run
  // Refuses (c10::Error) a world of another size, naming the config keys and what to launch
  // (or, for a dry run, which --world-size to play).
  void check_world_size(int64_t world_size, Ranks ranks = Ranks::Launched) const;
  // "dp 2 x fsdp 2 x tp 2"; the shard degree only when FSDP is on ("dp 1 x tp 4").
  std::string describe() const;

  // The job's meshes, built on every rank (a collective when dims are sliced): with FSDP the
  // world is (dp_replicate, dp_shard, tp) and the data-parallel mesh its first two dims;
  // with replicas only (dp, tp) and "dp"; with TP alone the 1-D "tp" mesh. Without any
  // parallelism, no mesh.
  struct Meshes {
    std::optional<DeviceMesh> world;
    std::optional<DeviceMesh> dp;  // the ranks with other rows of the batch
    std::optional<DeviceMesh> tp;
  };
  Meshes build_meshes(const std::string& device_type) const;

  bool operator==(const ParallelDims& other) const = default;

 private:
  int64_t dp_replicate_, dp_shard_, tp_;
};

}  // namespace hyper_parallel::train

HP_PUBLIC_END
