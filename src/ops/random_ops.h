// Random ops on DTensors (rand_like, randn_like, randint_like, uniform_, normal_,
// bernoulli_, random_, exponential_ ...). The value of a random DTensor does not depend on
// its placements: every rank draws the FULL tensor from a generator seeded by the mesh's
// random sequence (DeviceMesh::next_random_seed, the same on every rank) and keeps its
// piece. So a Replicate result is identical on every rank and a Shard result is the slice
// of what one process would draw with that generator. Exact and simple, at the price of
// drawing the whole tensor on every rank (on the CPU); an offset-based generator that
// draws only the local piece is the known improvement.
#pragma once

#include "ops/tensor_ops.h"

namespace hyper_parallel {

// The layout is SameLayoutOp's for ops that overwrite every value (Partial -> Replicate,
// no in-place write into a Partial); only the values are drawn differently.
class RandomOp : public SameLayoutOp {
 public:
  // How the full tensor is drawn: "inplace" re-runs the (in-place, generator-taking) op
  // itself on the full tensor; "uniform", "normal" and "randint" draw what rand_like,
  // randn_like and randint_like draw.
  explicit RandomOp(std::string draw) : SameLayoutOp(/*overwrites_values=*/true), draw_(std::move(draw)) {}
  std::string class_name() const override { return "RandomOp"; }
  std::string rule() const override;
  ShardingDecision infer_layout(const OpCall& call) const override;
  void finalize(const OpCall& call, const ShardingDecision& decision, const torch::jit::Stack& local_args,
                torch::jit::Stack& local_results) const override;

 private:
  std::string draw_;
};

}  // namespace hyper_parallel
