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

std::vector<std::string> decoder_tp_size_errors(const DecoderSizes& m, int64_t tp) {
  std::vector<std::string> errors;
  if (tp >= 1 && m.n_heads > 0) {  // attention shards whole heads across the TP ranks
    if (m.n_heads % tp != 0) {
      errors.push_back("model.n_heads = " + std::to_string(m.n_heads) +
                       " must be divisible by parallelism.tensor_parallel_degree = " + std::to_string(tp));
    }
    if (m.n_kv_heads > 0 && m.n_kv_heads % tp != 0) {
      errors.push_back("model.n_kv_heads = " + std::to_string(m.n_kv_heads) +
                       " must be divisible by parallelism.tensor_parallel_degree = " + std::to_string(tp) +
                       " (each rank holds whole key/value heads)");
    }
  }
  return errors;
}

}  // namespace hyper_parallel
