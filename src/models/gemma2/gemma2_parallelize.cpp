// The Gemma 2 family's tensor-parallel plan: Llama's, whose sub-module names Gemma 2's
// module shares, plus the norms Llama does not have.
#include "hyper_parallel/models/gemma2.h"
#include "hyper_parallel/models/llama.h"

namespace hyper_parallel {

ParallelizePlan gemma2_tp_plan(bool loss_parallel, bool sequence_parallel) {
  ParallelizePlan plan = llama_tp_plan(loss_parallel, sequence_parallel);
  if (sequence_parallel) {
    // Between wo (w2) reduce-scattering to Shard(1) and the residual add: per token, like
    // the norms before them.
    plan.emplace_back("layers.*.post_attention_norm", SequenceParallel::make());
    plan.emplace_back("layers.*.post_ffn_norm", SequenceParallel::make());
  }
  return plan;
}

void parallelize_gemma2(Gemma2& model, const DeviceMesh& tp_mesh, bool loss_parallel, bool sequence_parallel,
                        std::optional<int64_t> src_data_rank) {
  const Gemma2Args& a = model->args();
  const int64_t tp = tp_mesh.size();
  TORCH_CHECK(a.n_heads % tp == 0, "parallelize_gemma2: n_heads ", a.n_heads,
              " does not split over tensor_parallel_degree ", tp, " (each rank needs whole heads)");
  // Key/value heads are sharded like the query heads; replicating them is not implemented.
  TORCH_CHECK(a.resolved_kv_heads() % tp == 0, "parallelize_gemma2: n_kv_heads ", a.resolved_kv_heads(),
              " does not split over tensor_parallel_degree ", tp,
              " (each rank needs whole key/value heads; choose a TP degree that divides ", a.resolved_kv_heads(), ")");
  TORCH_CHECK(a.ffn_hidden_dim % tp == 0 && a.dim % tp == 0, "parallelize_gemma2: dim ", a.dim, " and ffn hidden ",
              a.ffn_hidden_dim, " must be divisible by tensor_parallel_degree ", tp);
  parallelize_module(*model, tp_mesh, gemma2_tp_plan(loss_parallel, sequence_parallel), src_data_rank);
  // Tied: the embeddings' weight is now the Shard(0) DTensor a Colwise head's weight would be.
  if (a.tie_word_embeddings) model->tie_head();
  // SequenceParallel replaced the norms' registered weights by Replicate DTensors; the
  // forward reads the member.
  for (const auto& m : model->modules(/*include_self=*/false)) {
    if (auto* n = dynamic_cast<Gemma2RMSNormImpl*>(m.get()))
      n->weight = n->named_parameters(/*recurse=*/false)["weight"];
  }
}

}  // namespace hyper_parallel
