// The Qwen3 family's tensor-parallel plan: Llama's, plus the per-head q/k norms.
#include "hyper_parallel/models/qwen3.h"

namespace hyper_parallel {

ParallelizePlan qwen3_tp_plan(bool loss_parallel, bool sequence_parallel) {
  ParallelizePlan plan = llama_tp_plan(loss_parallel, sequence_parallel);
  // q/k arrive as each rank's own heads, [batch, seq, local heads, head_dim] (wq/wk are
  // Colwise). The norms' [head_dim] weights are replicated; each rank's gradient covers
  // only its heads, so SequenceParallel over the head axis (dim 2) is exactly what is
  // needed: the input taken as Shard(2), the Partial weight gradient all-reduced
  // (transformers' "replicated_with_grad_allreduce"), the output handed back local.
  for (const char* norm : {"layers.*.attention.q_norm", "layers.*.attention.k_norm"}) {
    plan.emplace_back(norm, SequenceParallel::make(/*sequence_dim=*/2, /*use_local_output=*/true));
  }
  return plan;
}

void parallelize_qwen3(Llama& model, const DeviceMesh& tp_mesh, bool loss_parallel, bool sequence_parallel,
                       std::optional<int64_t> src_data_rank) {
  parallelize_llama(model, tp_mesh, qwen3_tp_plan(loss_parallel, sequence_parallel), src_data_rank);
}

}  // namespace hyper_parallel
