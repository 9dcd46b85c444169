// TorchTitan's tensor-parallel plan for a decoder built from decoder_blocks.h, the checks
// that its sizes split over the TP degree, and applying both.
#include <torch/nn/module.h>

#include <optional>

#include "hyper_parallel/models/decoder_plan.h"
#include "hyper_parallel/models/decoder_size_rules.h"

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
ParallelizePlan sequence_parallel_plan(bool loss_parallel) {
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

ParallelizePlan tensor_parallel_plan(bool loss_parallel) {
  return {
      {"tok_embeddings", RowwiseParallel::make()},
      {"layers.*.attention.wq", ColwiseParallel::make()},
      {"layers.*.attention.wk", ColwiseParallel::make()},
      {"layers.*.attention.wv", ColwiseParallel::make()},
      {"layers.*.attention.wo", RowwiseParallel::make()},
      {"layers.*.feed_forward.w1", ColwiseParallel::make()},
      {"layers.*.feed_forward.w3", ColwiseParallel::make()},
      {"layers.*.feed_forward.w2", RowwiseParallel::make()},
      {"output", ColwiseParallel::make(head_options(loss_parallel, std::nullopt))},
  };
}

}  // namespace

ParallelizePlan decoder_tp_plan(const DecoderBlockOptions& block, bool loss_parallel, bool sequence_parallel) {
  ParallelizePlan plan =
      sequence_parallel ? sequence_parallel_plan(loss_parallel) : tensor_parallel_plan(loss_parallel);
  if (sequence_parallel && block.post_norms) {
    // Between wo (w2) reduce-scattering to Shard(1) and the residual add: per token, like
    // the norms before them.
    plan.emplace_back("layers.*.post_attention_norm", SequenceParallel::make());
    plan.emplace_back("layers.*.post_ffn_norm", SequenceParallel::make());
  }
  if (block.attention.qk_norm) {
    // q/k arrive as each rank's own heads, [batch, seq, local heads, head_dim] (wq/wk are
    // Colwise). The norms' [head_dim] weights are replicated; each rank's gradient covers
    // only its heads, so SequenceParallel over the head axis (dim 2) is exactly what is
    // needed: the input taken as Shard(2), the Partial weight gradient all-reduced
    // (transformers' "replicated_with_grad_allreduce"), the output handed back local.
    for (const char* norm : {"layers.*.attention.q_norm", "layers.*.attention.k_norm"}) {
      plan.emplace_back(norm, SequenceParallel::make(/*sequence_dim=*/2, /*use_local_output=*/true));
    }
  }
  return plan;
}

std::vector<std::string> decoder_tp_misfits(const DecoderBlockOptions& block, int64_t tp, const std::string& who) {
  const AttentionOptions& a = block.attention;
  const int64_t hidden = block.mlp.hidden_dim;
  const std::string degree = std::to_string(tp);
  std::vector<std::string> misfits;
  const DecoderTpShape shape{.n_heads = a.n_heads, .n_kv_heads = a.n_kv_heads, .dim = a.dim, .ffn_hidden_dim = hidden};
  for (DecoderTpMisfit misfit : decoder_tp_split_misfits(shape, tp)) {
    switch (misfit) {
      case DecoderTpMisfit::n_heads:
        misfits.push_back(who + ": n_heads " + std::to_string(a.n_heads) +
                          " does not split over tensor_parallel_degree " + degree + " (each rank needs whole heads)");
        break;
      case DecoderTpMisfit::n_kv_heads:
        misfits.push_back(who + ": n_kv_heads " + std::to_string(a.n_kv_heads) +
                          " does not split over tensor_parallel_degree " + degree +
                          " (each rank needs whole key/value heads; choose a TP degree that divides " +
                          std::to_string(a.n_kv_heads) + ")");
        break;
      case DecoderTpMisfit::widths:
        misfits.push_back(who + ": dim " + std::to_string(a.dim) + " and ffn hidden " + std::to_string(hidden) +
                          " must be divisible by tensor_parallel_degree " + degree);
        break;
    }
  }
  return misfits;
}

void refresh_norm_weights(torch::nn::Module& model) {
  for (const auto& m : model.modules(/*include_self=*/false)) {
    if (auto* n = dynamic_cast<RMSNormImpl*>(m.get())) n->weight = n->named_parameters(/*recurse=*/false)["weight"];
  }
}

void parallelize_decoder(torch::nn::Module& model, const DeviceMesh& tp_mesh, const ParallelizePlan& plan,
                         const DecoderBlockOptions& block, const std::string& who,
                         std::optional<int64_t> src_data_rank) {
  const std::vector<std::string> misfits = decoder_tp_misfits(block, tp_mesh.size(), who);
  TORCH_CHECK(misfits.empty(), misfits.empty() ? std::string() : misfits.front());
  parallelize_module(model, tp_mesh, plan, src_data_rank);
  // SequenceParallel replaced the norms' registered weights by Replicate DTensors; the
  // forward reads the member.
  refresh_norm_weights(model);
}

}  // namespace hyper_parallel
