// The decoder stack's seeded initialisation and tied head.
#include "hyper_parallel/models/decoder_stack.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/module.h>

#include <cmath>

#include "hyper_parallel/dtensor/dtensor.h"
#include "nn/parameter_table.h"

namespace hyper_parallel {

void init_decoder_weights(torch::nn::Module& model, uint64_t seed, int64_t n_layers, double norm_weight,
                          const std::string& family,
                          const std::function<void(const std::string& name, at::Tensor& values)>& adjust) {
  at::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const double depth_std = 0.02 / std::sqrt(2.0 * static_cast<double>(n_layers));
  for (auto& item : model.named_parameters()) {
    at::Tensor& p = item.value();
    const std::string& name = item.key();
    TORCH_CHECK(!(is_dtensor(p) ? to_local(p) : p).is_meta(), family, "::init_weights: ", name,
                " is on the meta device (built under ParametersOnMeta); materialize_parameters first");
    if (name.find("norm") != std::string::npos) {
      p.fill_(norm_weight);
      continue;
    }
    const bool out_proj = name.find("wo.") != std::string::npos || name.find("w2.") != std::string::npos;
    at::Tensor v =
        at::normal(0.0, out_proj ? depth_std : 0.02, p.sizes(), gen, p.options().dtype(at::kFloat)).clamp(-0.06, 0.06);
    if (adjust) adjust(name, v);
    p.copy_(v);
  }
}

void tie_head_to_embeddings(torch::nn::Linear& head, const torch::nn::Embedding& embeddings) {
  if (has_own_parameter(*head, "weight")) unregister_parameter(*head, "weight");
  head->weight = embeddings->weight;
}

}  // namespace hyper_parallel
