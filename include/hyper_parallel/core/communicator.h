// Communicator: the collectives one mesh dimension needs, over one c10d process group.
//
// It hides Gloo/NCCL differences (e.g. Gloo has no reduce_scatter for CUDA tensors),
// handles torch.chunk-style uneven pieces, and counts every collective it issues so
// tests and benchmarks can assert communication budgets.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "hyper_parallel/core/placement.h"
#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace c10d {
class ProcessGroup;
}

namespace hyper_parallel {

// Collectives issued by the calling thread since the last reset.
struct CollectiveCounts {
  int64_t all_reduce = 0;
  int64_t all_gather = 0;
  int64_t reduce_scatter = 0;
  int64_t broadcast = 0;
  int64_t all_to_all = 0;
  int64_t barrier = 0;
  int64_t scatter = 0;
  int64_t total() const {
    return all_reduce + all_gather + reduce_scatter + broadcast + all_to_all + barrier + scatter;
  }
};
CollectiveCounts collective_counts();
void reset_collective_counts();

class Communicator {
 public:
  Communicator(c10::intrusive_ptr<c10d::ProcessGroup> pg, std::vector<int64_t> global_ranks);
  ~Communicator();

  int64_t rank() const { return rank_; }
  int64_t size() const { return static_cast<int64_t>(global_ranks_.size()); }
  const std::vector<int64_t>& global_ranks() const { return global_ranks_; }
  const c10::intrusive_ptr<c10d::ProcessGroup>& process_group() const { return pg_; }

  // In place. Avg is Sum followed by a division (Gloo has no native Avg).
  void all_reduce_(at::Tensor& t, ReduceOp op) const;
  // Several tensors in one collective (they are flattened into one buffer).
  void all_reduce_many_(std::vector<at::Tensor>& ts, ReduceOp op) const;
  // Concatenates each member's `local` along `dim`; member i contributes sizes[i] rows
  // (uneven and empty pieces allowed). `sizes` must be identical on every member.
  at::Tensor all_gather(const at::Tensor& local, int64_t dim, const std::vector<int64_t>& sizes) const;
  // Reduces `full` across members and returns this member's torch.chunk piece along dim.
  at::Tensor reduce_scatter(const at::Tensor& full, int64_t dim, ReduceOp op) const;
  void broadcast_(at::Tensor& t, int64_t root) const;
  // Member `root`'s `full`, split along `dim` in torch.chunk pieces: returns this member's
  // piece. The other members' `full` gives only the shape and dtype (the same everywhere).
  at::Tensor scatter(const at::Tensor& full, int64_t dim, int64_t root) const;
  void barrier() const;

 private:
  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  std::vector<int64_t> global_ranks_;
  int64_t rank_;
};

using CommunicatorPtr = std::shared_ptr<const Communicator>;

// torch.chunk arithmetic: the piece of a dim of `size` that chunk `index` of `n` holds.
struct ChunkRange {
  int64_t offset;
  int64_t length;
};
ChunkRange chunk_range(int64_t size, int64_t n, int64_t index);

}  // namespace hyper_parallel

HP_PUBLIC_END
