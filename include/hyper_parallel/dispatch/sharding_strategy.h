// Choosing among a rule's candidate strategies by what they cost (OneFlow's SBP
// inference, PyTorch's sharding propagation): a rule lists, per mesh dim, the placements
// its tensor arguments may take and the output each choice gives; select_strategy picks,
// per mesh dim, the candidate that moves the fewest bytes to get the arguments there.
#pragma once

#include <cstdint>
#include <vector>

#include "hyper_parallel/dispatch/distributed_op.h"
#include "hyper_parallel/core/placement.h"
#include "hyper_parallel/core/export.h"

HP_PUBLIC_BEGIN

namespace hyper_parallel {

// One candidate on one mesh dim: the placement of each considered argument, the output's.
struct DimStrategy {
  std::vector<Placement> inputs;
  Placement output;
};

// Bytes one rank receives to bring a tensor of `bytes` (global) from `have` to `want` on a
// mesh dim of `ranks` ranks: all-gather and reduce-scatter (n-1)/n of it, all-reduce
// twice that, all-to-all (n-1)/n of its piece; a local chunk or zeroing moves nothing
// (charged a token 1 % so that, all else equal, fewer changes win).
double redistribute_cost_bytes(const Placement& have, const Placement& want, double bytes, int64_t ranks);

struct SelectedStrategy {
  std::vector<Placements> inputs;  // per considered argument, over all mesh dims
  Placements output;
  double cost_bytes = 0;
};

// The index of the cheapest candidate on one mesh dim (ties: the earlier one). For rules
// whose candidates on a mesh dim depend on what earlier mesh dims chose.
size_t cheapest_strategy(const OpCall& call, int64_t mesh_dim, const std::vector<size_t>& arguments,
                         const std::vector<DimStrategy>& candidates, double* cost_bytes = nullptr);

// `arguments` index call.tensors(); every candidate lists one placement per argument.
// Ties go to the earlier candidate, so rules list their preferred strategy first.
SelectedStrategy select_strategy(const OpCall& call, const std::vector<size_t>& arguments,
                                 const std::vector<DimStrategy>& candidates);

}  // namespace hyper_parallel

HP_PUBLIC_END
