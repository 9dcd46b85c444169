#include "train/memory_formula.h"

#include <c10/util/Exception.h>

#include <stdexcept>
#include <vector>

#include "hyper_parallel/communicator.h"
#include "hyper_parallel/dtensor.h"
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

ActivationBytes activation_bytes_formula(const std::string& family, const DecoderSizes& s, const JobConfig& job,
                                         const ParallelDims& dims, const BlockCheckpointing& ac) {
  if (family != "llama") {
    throw std::invalid_argument("the activation formula knows the llama family's blocks, not model.name = \"" + family +
                                "\" (hp-dry-run --measure measures them)");
  }
  const auto& t = job.training;
  const int64_t e = bytes_per_element(t.dtype);
  const int64_t f = std::max<int64_t>(e, 4);  // norms and logits are widened to float32
  const int64_t tp = dims.tp();
  const int64_t rows = t.batch_size / dims.dp_ranks() / t.grad_accum_steps;
  const int64_t seq = t.seq_len, tokens = rows * seq;
  const bool sp = job.parallelism.sequence_parallel && tp > 1;
  const int64_t residual_tokens = sp ? chunk_range(seq, tp, 0).length * rows : tokens;
  const int64_t heads = s.n_heads / tp, ffn = s.ffn_hidden_dim / tp;
  // RMSNorm keeps its input widened to float32 (f) and its normalised output (e); the
  // linears after it keep their input (the norm's output times its weight, whole sequence).
  const int64_t norm = residual_tokens * s.dim * (f + e);
  const int64_t linear_input = tokens * s.dim * e;
  // Attention: the contiguous q, k, v the matmuls keep (k and v repeated to every query
  // head), the softmax output [rows, heads, seq, seq], the causal mask (bool), wo's input.
  // RoPE keeps nothing: its cos and sin need no gradient, so autograd saves neither factor.
  const int64_t head_elems = tokens * s.head_dim;
  const int64_t attention = head_elems * e * (3 * heads + heads) + rows * heads * seq * seq * e + seq * seq;
  // SwiGLU: silu's input, its output, w3's output, w2's input (their product).
  const int64_t mlp = 4 * tokens * ffn * e;
  ActivationBytes a;
  a.per_block = 2 * norm + 2 * linear_input + attention + mlp;
  a.checkpointed_block = residual_tokens * s.dim * e;
  for (int64_t block = 0; block < s.n_layers; ++block) a.checkpointed_blocks += ac.checkpoints(block) ? 1 : 0;
  // Outside the blocks: the token ids the embedding keeps (int64), the final norm, the
  // head's input, and the logits the loss keeps (float32; its vocabulary piece under loss
  // parallel; none with the fused linear loss).
  const bool loss_parallel = tp > 1 && !job.parallelism.disable_loss_parallel;
  const int64_t vocab = loss_parallel ? chunk_range(s.vocab_size, tp, 0).length : s.vocab_size;
  const int64_t logits = t.fused_linear_loss ? 0 : tokens * vocab * f;
  a.outside_blocks = tokens * 8 + norm + linear_input + logits;
  a.held_after_forward = (s.n_layers - a.checkpointed_blocks) * a.per_block +
                         a.checkpointed_blocks * a.checkpointed_block + a.outside_blocks;
  return a;
}

}  // namespace hyper_parallel::train
