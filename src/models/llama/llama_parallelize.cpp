// The Llama family's tensor-parallel plan (TorchTitan's) and its checks against the TP degree.
#include <optional>

#include "hyper_parallel/models/llama.h"

namespace hyper_parallel {

namespace {

// The output head: Shard(-1) DTensor logits for loss parallel, replicated local ones otherwise.
StyleOptions head_options(bool loss_parallel, std::optional<Placements> input_layouts) {
  StyleOptions head;
  head.input_layouts = std::move(input_layouts);
  head.output_layouts = Placements{loss_parallel ? Placement::shard(-1) : Placement::replicate()};
  head.use_local_output = !loss_parallel;
  return head;
}

// TorchTitan's sequence-parallel plan. Between the TP regions activations are Shard(1)
// DTensors (the residual stream, the norms, their inputs and outputs: 1 / tp of the
// sequence per rank); a region all-gathers the sequence on entry (PrepareModuleInput:
// Shard(1) -> Replicate, once for q/k/v and once for w1/w3) and its row-parallel exit
// reduce-scatters the Partial sum straight to Shard(1) (instead of an all-reduce).
ParallelizePlan llama_sp_plan(bool loss_parallel) {
  const Placements seq{Placement::shard(1)}, rep{Placement::replicate()};
  StyleOptions to_seq;  // a row-parallel exit: reduce-scatter, keep the DTensor
  to_seq.output_layouts = seq;
  to_seq.use_local_output = false;
  return {
      {"tok_embeddings", RowwiseParallel::make(to_seq)},
      {"layers.*.attention_norm", SequenceParallel::make()},
      {"layers.*.attention", std::make_shared<PrepareModuleInput>(seq, rep)},
      {"layers.*.attention.wq", ColwiseParallel::make()},
      {"layers.*.attention.wk", ColwiseParallel::make()},
      {"layers.*.attention.wv", ColwiseParallel::make()},
      {"layers.*.attention.wo", RowwiseParallel::make(to_seq)},
      {"layers.*.ffn_norm", SequenceParallel::make()},
      {"layers.*.feed_forward", std::make_shared<PrepareModuleInput>(seq, rep)},
      {"layers.*.feed_forward.w1", ColwiseParallel::make()},
      {"layers.*.feed_forward.w3", ColwiseParallel::make()},
      {"layers.*.feed_forward.w2", RowwiseParallel::make(to_seq)},
      {"norm", SequenceParallel::make()},
      {"output", ColwiseParallel::make(head_options(loss_parallel, seq))},
  };
}

}  // namespace

ParallelizePlan llama_tp_plan(bool loss_parallel, bool sequence_parallel) {
  if (sequence_parallel) return llama_sp_plan(loss_parallel);
  ParallelizePlan plan = {
      {"tok_embeddings", RowwiseParallel::make()},           {"layers.*.attention.wq", ColwiseParallel::make()},
      {"layers.*.attention.wk", ColwiseParallel::make()},    {"layers.*.attention.wv", ColwiseParallel::make()},
      {"layers.*.attention.wo", RowwiseParallel::make()},    {"layers.*.feed_forward.w1", ColwiseParallel::make()},
      {"layers.*.feed_forward.w3", ColwiseParallel::make()}, {"layers.*.feed_forward.w2", RowwiseParallel::make()},
  };
  plan.emplace_back("output", ColwiseParallel::make(head_options(loss_parallel, std::nullopt)));
  return plan;
}

void parallelize_llama(Llama& model, const DeviceMesh& tp_mesh, bool loss_parallel, bool sequence_parallel,
                       std::optional<int64_t> src_data_rank) {
  parallelize_llama(model, tp_mesh, llama_tp_plan(loss_parallel, sequence_parallel), src_data_rank);
}

void parallelize_llama(Llama& model, const DeviceMesh& tp_mesh, const ParallelizePlan& plan,
                       std::optional<int64_t> src_data_rank) {
  const LlamaArgs& a = model->args();
  const int64_t tp = tp_mesh.size();
  TORCH_CHECK(a.n_heads % tp == 0, "parallelize_llama: n_heads ", a.n_heads,
              " does not split over tensor_parallel_degree ", tp, " (each rank needs whole heads)");
  // Key/value heads are sharded like the query heads (each rank keeps the kv heads its
  // query heads read); replicating them instead is not implemented.
  TORCH_CHECK(a.resolved_kv_heads() % tp == 0, "parallelize_llama: n_kv_heads ", a.resolved_kv_heads(),
              " does not split over tensor_parallel_degree ", tp,
              " (each rank needs whole key/value heads; choose a TP degree that divides ", a.resolved_kv_heads(), ")");
  TORCH_CHECK(a.hidden_dim() % tp == 0 && a.dim % tp == 0, "parallelize_llama: dim ", a.dim, " and ffn hidden ",
              a.hidden_dim(), " must be divisible by tensor_parallel_degree ", tp);
  parallelize_module(*model, tp_mesh, plan, src_data_rank);
  // Tied: the embeddings' weight is now a Shard(0) DTensor over the vocabulary, exactly the
  // layout ColwiseParallel gives a head's weight (same rows per rank), so the head reads it.
  if (a.tie_word_embeddings) model->tie_head();
  // SequenceParallel replaced the norms' registered weights by Replicate DTensors; the
  // forward reads the member.
  for (const auto& m : model->modules(/*include_self=*/false)) {
    if (auto* n = dynamic_cast<RMSNormImpl*>(m.get())) n->weight = n->named_parameters(/*recurse=*/false)["weight"];
  }
}

}  // namespace hyper_parallel
