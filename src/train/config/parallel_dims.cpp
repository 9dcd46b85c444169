#include "hyper_parallel_train/config/parallel_dims.h"

#include <c10/util/Exception.h>

#include <sstream>
#include <stdexcept>

#include "hyper_parallel_train/config/job_config.h"

namespace hyper_parallel::train {

ParallelDims::ParallelDims(int64_t dp_replicate, int64_t dp_shard, int64_t tp)
    : dp_replicate_(dp_replicate), dp_shard_(dp_shard), tp_(tp) {
  for (const auto& [name, degree] : {std::pair<const char*, int64_t>{"data_parallel_degree", dp_replicate},
                                     {"data_parallel_shard_degree", dp_shard},
                                     {"tensor_parallel_degree", tp}}) {
    if (degree < 1) {
      throw std::invalid_argument(std::string("parallelism.") + name + " = " + std::to_string(degree) +
                                  " must be >= 1");
    }
  }
}

ParallelDims ParallelDims::of(const ParallelismJobConfig& p) {
  return ParallelDims(p.data_parallel_degree, p.data_parallel_shard_degree, p.tensor_parallel_degree);
}

void ParallelDims::check_world_size(int64_t world_size, Ranks ranks) const {
  const bool fsdp = fsdp_enabled();
  const int64_t want = this->world_size();
  const std::string remedy = ranks == Ranks::Played
                                 ? "play " + std::to_string(want) + " ranks (--world-size " + std::to_string(want) + ")"
                                 : "launch " + std::to_string(want) + " ranks (hp-run --nproc-per-node " +
                                       std::to_string(want) +
                                       ", or --nnodes N with N x nproc-per-node = " + std::to_string(want) + ")";
  TORCH_CHECK(world_size == want, "parallelism.data_parallel_degree x ", fsdp ? "data_parallel_shard_degree x " : "",
              "tensor_parallel_degree = ", dp_replicate_, " x ", fsdp ? std::to_string(dp_shard_) + " x " : "", tp_,
              " = ", want, " ranks, but the job has ", world_size, "; ", remedy, " or change the degrees");
}

std::string ParallelDims::describe() const {
  std::ostringstream os;
  os << "dp " << dp_replicate_ << " x ";
  if (dp_shard_ > 1) os << "fsdp " << dp_shard_ << " x ";
  os << "tp " << tp_;
  return os.str();
}

ParallelDims::Meshes ParallelDims::build_meshes(const std::string& device_type) const {
  Meshes m;
  if (fsdp_enabled()) {
    m.world = init_device_mesh(device_type, {dp_replicate_, dp_shard_, tp_}, {"dp_replicate", "dp_shard", "tp"});
    m.dp = m.world->slice({"dp_replicate", "dp_shard"});
    if (tp_enabled()) m.tp = (*m.world)["tp"];
  } else if (dp_replicate_ > 1) {
    m.world = init_device_mesh(device_type, {dp_replicate_, tp_}, {"dp", "tp"});
    m.dp = (*m.world)["dp"];
    if (tp_enabled()) m.tp = (*m.world)["tp"];
  } else if (tp_enabled()) {
    m.tp = init_device_mesh(device_type, {tp_}, {"tp"});
    m.world = m.tp;
  }
  return m;
}

}  // namespace hyper_parallel::train
