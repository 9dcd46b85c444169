// The rules a decoder's [model] sizes obey, in the words of a job's keys.
#include <string>

#include "hyper_parallel/models/decoder_size_rules.h"

namespace hyper_parallel {

std::vector<std::string> decoder_size_errors(const DecoderSizes& m) {
  std::vector<std::string> errors;
  if (m.n_heads > 0 && m.dim > 0) {  // the positivity checks are the job's
    if (m.n_kv_heads > 0 && m.n_heads % m.n_kv_heads != 0) {
      errors.push_back("model.n_kv_heads = " + std::to_string(m.n_kv_heads) +
                       " must divide model.n_heads = " + std::to_string(m.n_heads));
    }
    if (m.head_dim == 0 && m.dim % m.n_heads != 0) {
      errors.push_back("model.dim = " + std::to_string(m.dim) + " must be divisible by model.n_heads = " +
                       std::to_string(m.n_heads) + " (or set model.head_dim)");
    } else if (m.head_dim >= 0 && m.resolved_head_dim() % 2 != 0) {  // RoPE rotates pairs of channels
      errors.push_back(std::string(m.head_dim > 0 ? "model.head_dim = " : "model.dim / model.n_heads = ") +
                       std::to_string(m.resolved_head_dim()) + " (the head size) must be even for RoPE");
    }
  }
  return errors;
}

std::vector<DecoderTpMisfit> decoder_tp_split_misfits(const DecoderTpShape& s, int64_t tp) {
  std::vector<DecoderTpMisfit> misfits;
  if (tp < 1) return misfits;
  if (s.n_heads > 0) {  // attention shards whole heads across the TP ranks
    if (s.n_heads % tp != 0) misfits.push_back(DecoderTpMisfit::n_heads);
    // Key/value heads are sharded like the query heads (each rank keeps the kv heads its
    // query heads read); replicating them instead is not implemented.
    if (s.n_kv_heads > 0 && s.n_kv_heads % tp != 0) misfits.push_back(DecoderTpMisfit::n_kv_heads);
  }
  if (s.ffn_hidden_dim % tp != 0 || s.dim % tp != 0) misfits.push_back(DecoderTpMisfit::widths);
  return misfits;
}

std::vector<std::string> decoder_tp_size_errors(const DecoderSizes& m, int64_t tp) {
  // The MLP's hidden size is the family's to derive, and dim is checked with it at parallelize.
  const DecoderTpShape shape{.n_heads = m.n_heads, .n_kv_heads = m.n_kv_heads};
  const std::string degree = " must be divisible by parallelism.tensor_parallel_degree = " + std::to_string(tp);
  std::vector<std::string> errors;
  for (DecoderTpMisfit misfit : decoder_tp_split_misfits(shape, tp)) {
    if (misfit == DecoderTpMisfit::n_heads) errors.push_back("model.n_heads = " + std::to_string(m.n_heads) + degree);
    if (misfit == DecoderTpMisfit::n_kv_heads) {
      errors.push_back("model.n_kv_heads = " + std::to_string(m.n_kv_heads) + degree +
                       " (each rank holds whole key/value heads)");
    }
  }
  return errors;
}

}  // namespace hyper_parallel
