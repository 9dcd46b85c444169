#include "train/memory_formula.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "hyper_parallel/core/communicator.h"
#include "hyper_parallel/dtensor/dtensor.h"
#include "train/config/training_dtype.h"

namespace hyper_parallel::train {

namespace {

int64_t bytes_per_element(const std::string& dtype) {
  return static_cast<int64_t>(c10::elementSize(training_dtype(dtype)));
}

int64_t element_count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

std::vector<ParameterShape> parameter_shapes_of(const torch::nn::Module& model) {
  std::vector<ParameterShape> out;
  for (const auto& p : model.parameters()) {
    if (!is_dtensor(p)) {
      out.push_back({p.sizes().vec(), -1});
      continue;
    }
    const Layout& layout = layout_of(p);
    const std::vector<std::string>& names = layout.mesh().dim_names();
    ParameterShape shape{layout.shape(), -1};
    for (int64_t d = 0; d < static_cast<int64_t>(layout.placements().size()); ++d) {
      const Placement& placement = layout.placement(d);
      const bool tp = layout.placements().size() == 1 || (d < static_cast<int64_t>(names.size()) && names[d] == "tp");
      if (placement.is_shard() && tp) {
        shape.tp_dim = placement.dim();
      } else if (!placement.is_replicate()) {
        throw std::invalid_argument("the state formula: a parameter laid out as " + layout.str() +
                                    " (only a TP shard or whole is known)");
      }
    }
    out.push_back(std::move(shape));
  }
  return out;
}

StateBytes state_bytes_formula(const std::vector<ParameterShape>& parameters, const JobConfig& job,
                               const ParallelDims& dims, int64_t rank) {
  const int64_t e = bytes_per_element(job.training.dtype);
  const bool reduced = e < 4;  // bfloat16: float32 masters (or float32 FSDP shards)
  const int64_t tp_rank = dims.tp_rank_of(rank), shard = dims.shard_of(rank);
  StateBytes s;
  int64_t local = 0, sharded = 0;  // elements: TP piece; its FSDP chunk
  for (const ParameterShape& p : parameters) {
    std::vector<int64_t> piece = p.shape;
    if (p.tp_dim >= 0) piece[p.tp_dim] = chunk_range(piece[p.tp_dim], dims.tp(), tp_rank).length;
    const int64_t n = element_count(piece);
    local += n;
    s.model_parameters += element_count(p.shape);
    sharded += chunk_range(piece[0], dims.dp_shard(), shard).length * (n / piece[0]);
  }
  if (dims.fsdp_enabled()) {
    // The model's parameters hold no storage between steps; the shards are the masters.
    const int64_t se = reduced ? 4 : e;
    s.masters = sharded * se;
    s.gradients = sharded * se;
    s.optimizer = 2 * sharded * se;
  } else {
    s.masters = reduced ? local * 4 : 0;
    s.gradients = local * (reduced ? 4 : e);  // bfloat16: the masters' float32 gradients only
    s.optimizer = 2 * local * (reduced ? 4 : e);
    s.parameters = local * e;
  }
  s.parameters += s.masters;
  return s;
}

BlockActivationShape block_activation_shape(const JobConfig& job, const ParallelDims& dims) {
  const auto& t = job.training;
  BlockActivationShape s;
  s.rows = t.batch_size / dims.dp_ranks() / t.grad_accum_steps;
  s.seq = t.seq_len;
  s.tp = dims.tp();
  const bool sp = job.parallelism.sequence_parallel && s.tp > 1;
  s.residual_tokens = sp ? chunk_range(s.seq, s.tp, 0).length * s.rows : s.tokens();
  s.element_bytes = bytes_per_element(t.dtype);
  s.widened_bytes = std::max<int64_t>(s.element_bytes, 4);
  return s;
}

ActivationBytes activation_bytes_formula(int64_t per_block, const DecoderSizes& s, const LossTerms& terms,
                                         const JobConfig& job, const ParallelDims& dims, const BlockCheckpointing& ac) {
  const BlockActivationShape shape = block_activation_shape(job, dims);
  const int64_t e = shape.element_bytes, f = shape.widened_bytes, tokens = shape.tokens();
  ActivationBytes a;
  a.per_block = per_block;
  a.checkpointed_block = shape.residual_tokens * s.dim * e;
  for (int64_t block = 0; block < s.n_layers; ++block) a.checkpointed_blocks += ac.checkpoints(block) ? 1 : 0;
  // Outside the blocks: the token ids the embedding keeps (int64), the final norm (its input
  // widened to float32 and its output), the head's input, and the logits the loss keeps
  // (float32; its vocabulary piece under loss parallel; none with the fused linear loss),
  // twice where the loss soft-caps them with plain ops (tanh keeps its output).
  const bool loss_parallel = shape.tp > 1 && !job.parallelism.disable_loss_parallel;
  const int64_t vocab = loss_parallel ? chunk_range(s.vocab_size, shape.tp, 0).length : s.vocab_size;
  const bool fused = job.training.fused_linear_loss;
  const int64_t logits = fused ? 0 : tokens * vocab * f;
  const int64_t capped_logits = !fused && !loss_parallel && terms.logit_softcap > 0 ? logits : 0;
  const int64_t final_norm = shape.residual_tokens * s.dim * (f + e);
  a.outside_blocks = tokens * 8 + final_norm + tokens * s.dim * e + logits + capped_logits;
  a.held_after_forward = (s.n_layers - a.checkpointed_blocks) * a.per_block +
                         a.checkpointed_blocks * a.checkpointed_block + a.outside_blocks;
  return a;
}

}  // namespace hyper_parallel::train
