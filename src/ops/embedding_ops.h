// Embedding lookup and its dense backward.
//
// Vocabulary-parallel (weight Shard(0), ids replicated): each rank looks up the ids
// in its own rows, zeros the rows of ids it does not own, and the output is
// Partial(sum). Column-parallel (weight Shard(1)): output sharded on its last dim.
// A replicated weight follows the ids' shards. The backward scatters the gradient;
// with replicated ids and gradient its result is replicated (as PyTorch's), and
// parallelize_module's gradient hooks bring it back to the weight's layout.
#pragma once

#include "hyper_parallel/dispatch/distributed_op.h"

namespace hyper_parallel {

class EmbeddingOp : public DistributedOp {
 public:
  // forward: embedding(weight, ids); backward: embedding_dense_backward(grad, ids, num_weights ...).
  explicit EmbeddingOp(bool backward = false) : backward_(backward) {}
  std::string class_name() const override { return "EmbeddingOp"; }
  std::string rule() const override;
  ShardingDecision infer_layout(const OpCall& call) const override;
  void expand(const OpCall& call, const ShardingDecision& d, torch::jit::Stack& local) const override;
  void finalize(const OpCall& call, const ShardingDecision& d, const torch::jit::Stack& local_args,
                torch::jit::Stack& local_results) const override;

 private:
  bool backward_;
};

}  // namespace hyper_parallel
