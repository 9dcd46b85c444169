#include "hyper_parallel/models/causal_lm.h"

#include <ATen/ops/tanh.h>
#include <torch/nn/module.h>

#include <stdexcept>
#include <string>
#include <unordered_set>

namespace hyper_parallel {

CausalLanguageModel& as_causal_lm(torch::nn::Module& module) {
  auto* lm = dynamic_cast<CausalLanguageModel*>(&module);
  if (!lm) throw std::invalid_argument("expected a causal language model module, got a " + module.name());
  return *lm;
}

const CausalLanguageModel& as_causal_lm(const torch::nn::Module& module) {
  return as_causal_lm(const_cast<torch::nn::Module&>(module));
}

at::Tensor soft_cap(const at::Tensor& x, double cap) { return cap > 0 ? at::tanh(x / cap) * cap : x; }

int64_t dense_decoder_flops_per_token(const torch::nn::Module& model, const at::Tensor& token_embedding,
                                      bool tied_embeddings, int64_t attention_layers, int64_t n_heads, int64_t head_dim,
                                      int64_t seq_len) {
  // numel is the whole parameter's under TP (a DTensor reports its global shape).
  std::unordered_set<const void*> seen;
  int64_t parameters = 0;
  for (const auto& p : model.parameters()) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) parameters += p.numel();
  }
  const int64_t matmul_parameters = tied_embeddings ? parameters : parameters - token_embedding.numel();
  return 6 * matmul_parameters + 12 * attention_layers * n_heads * head_dim * seq_len;
}

}  // namespace hyper_parallel
