#include "hyper_parallel/core/run_then_agree.h"

#include <ATen/ATen.h>

#include <exception>
#include <stdexcept>

#include "hyper_parallel/core/communicator.h"
#include "hyper_parallel/core/fatal_error.h"

namespace hyper_parallel {

void run_then_agree(const std::string& what, const std::optional<DeviceMesh>& mesh, const std::function<void()>& fn) {
  std::string own_error;
  bool failed_here = false;
  try {
    fn();
  } catch (const std::exception& e) {
    own_error = e.what();
    failed_here = true;
  }
  if (!mesh) {
    if (failed_here) throw std::runtime_error(own_error);
    return;
  }
  // One flag per rank of the mesh (in its row-major order), summed over all its dims.
  const std::vector<int64_t>& ranks = mesh->ranks();
  at::Tensor failed = at::zeros({static_cast<int64_t>(ranks.size())}, at::TensorOptions().dtype(at::kLong));
  if (failed_here) {
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (ranks[i] == mesh->get_rank()) failed[static_cast<int64_t>(i)].fill_(1);
    }
  }
  failed = failed.to(mesh->device());
  for (int64_t d = 0; d < mesh->ndim(); ++d) mesh->comm(d).all_reduce_(failed, ReduceOp::Sum);
  failed = failed.cpu();
  std::string names;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (failed[static_cast<int64_t>(i)].item<int64_t>() != 0)
      names += (names.empty() ? "" : ", ") + std::to_string(ranks[i]);
  }
  if (failed_here) throw std::runtime_error(own_error);
  if (!names.empty()) {
    throw PeerFailure(what + " failed on rank(s) " + names + " (their error says why); stopping every rank");
  }
}

}  // namespace hyper_parallel
