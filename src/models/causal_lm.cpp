#include "hyper_parallel/causal_lm.h"

#include <torch/nn/module.h>

#include <stdexcept>
#include <string>

namespace hyper_parallel {

CausalLanguageModel& as_causal_lm(torch::nn::Module& module) {
  auto* lm = dynamic_cast<CausalLanguageModel*>(&module);
  if (!lm) throw std::invalid_argument("expected a causal language model module, got a " + module.name());
  return *lm;
}

const CausalLanguageModel& as_causal_lm(const torch::nn::Module& module) {
  return as_causal_lm(const_cast<torch::nn::Module&>(module));
}

}  // namespace hyper_parallel
